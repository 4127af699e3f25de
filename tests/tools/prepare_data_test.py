#!/usr/bin/env python3
"""tools/prepare_data.py's loss mask on chat conversations, checked bit by bit.

The tokenizer is the byte-level one `moefit init --family qwen3_moe --preset tiny`
writes (byte b is token b; <|endoftext|> 256, <|im_start|> 257, <|im_end|> 258), so
the expected ids and mask are written here by hand, as the rendered text of each
conversation cut into context and assistant segments, independently of the script
and of transformers. Two chat templates:

  - chatml: the one `moefit init` writes (renders every turn as given);
  - qwen3:  a template written for this test with the behaviour of Qwen3's own: an
    assistant turn after the last user turn gets a <think> block (its
    reasoning_content, or the reasoning inline in its content, or an empty block
    when it is the last message); earlier assistant turns are rendered without
    their reasoning. Rendering such a conversation prefix by prefix does not give
    the whole conversation's text, which the script used to refuse.

An assistant turn counts (mask bit 1) from the end of its "<|im_start|>assistant\\n"
header through its "<|im_end|>\\n": the <think> block the template renders in the
turn, the content and the end-of-turn tokens. Everything else is context.

Also: a template that rewrites earlier replies is refused naming the line and the
message, and no output is written.

Needs a python with transformers and jinja2 to run the script: MF_HF_PYTHON (tools/test
passes ~/.cache/moefit/hfvenv/bin/python); without one every case is skipped, saying so.
usage: prepare_data_test.py --moefit PATH   (bazel test //tests/tools:prepare_data_test)
"""

import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import unittest
import zlib

from tests import py_util

ARGS = None

# The behaviour of Qwen3's chat template for conversations of system, user and
# assistant messages (no tools), written afresh for this test.
QWEN3_LIKE = r"""
{%- if messages[0]['role'] == 'system' -%}
{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' -}}
{%- endif -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}
{%- if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif -%}
{%- endfor -%}
{%- for m in messages -%}
{%- if m['role'] == 'user' or (m['role'] == 'system' and not loop.first) -%}
{{- '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' -}}
{%- elif m['role'] == 'assistant' -%}
{%- set reply = m['content'] -%}
{%- set thought = '' -%}
{%- if m['reasoning_content'] is string -%}
{%- set thought = m['reasoning_content'] -%}
{%- elif '</think>' in reply -%}
{%- set thought = reply.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
{%- set reply = reply.split('</think>')[-1].lstrip('\n') -%}
{%- endif -%}
{{- '<|im_start|>assistant\n' -}}
{%- if loop.index0 > ns.last_user and (loop.last or thought) -%}
{{- '<think>\n' + thought.strip('\n') + '\n</think>\n\n' + reply.lstrip('\n') -}}
{%- else -%}
{{- reply -}}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif -%}
{%- endif -%}
""".strip()

# A template that replaces every assistant reply a user turn follows: no way to
# find those turns' content, so the script must refuse.
REDACTING = (
    "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
    "{{ '<|im_start|>assistant\\n[earlier reply]<|im_end|>\\n' }}{% else %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

SPECIAL = {"<|endoftext|>": 256, "<|im_start|>": 257, "<|im_end|>": 258}


def sys_(text):
    return ("<|im_start|>system\n" + text + "<|im_end|>\n", 0)


def user(text):
    return ("<|im_start|>user\n" + text + "<|im_end|>\n", 0)


HEAD = ("<|im_start|>assistant\n", 0)


def turn(text):
    """An assistant turn after its header: all of it counts."""
    return (text + "<|im_end|>\n", 1)


def think(thought, reply):
    return turn("<think>\n" + thought + "\n</think>\n\n" + reply)


def M(role, content, **kw):
    return dict(role=role, content=content, **kw)


# name: (messages, chatml segments, qwen3-like segments)
CASES = {
    "single_turn": (
        [M("user", "What is 2+2?"), M("assistant", "4.")],
        [user("What is 2+2?"), HEAD, turn("4.")],
        [user("What is 2+2?"), HEAD, think("", "4.")],
    ),
    "single_turn_reasoning": (
        [M("user", "What is 2+2?"), M("assistant", "4.", reasoning_content="Two and two.")],
        [user("What is 2+2?"), HEAD, turn("4.")],
        [user("What is 2+2?"), HEAD, think("Two and two.", "4.")],
    ),
    "multi_turn": (
        [M("system", "You are terse."), M("user", "Name a colour."), M("assistant", "Blue."),
         M("user", "Another one?"), M("assistant", "Green, like grass.")],
        [sys_("You are terse."), user("Name a colour."), HEAD, turn("Blue."), user("Another one?"), HEAD,
         turn("Green, like grass.")],
        [sys_("You are terse."), user("Name a colour."), HEAD, turn("Blue."), user("Another one?"), HEAD,
         think("", "Green, like grass.")],
    ),
    "multi_turn_reasoning": (
        [M("user", "Name a colour."), M("assistant", "Blue.", reasoning_content="A primary one."),
         M("user", "Another one?"), M("assistant", "Green, like grass.", reasoning_content="Not blue again.")],
        [user("Name a colour."), HEAD, turn("Blue."), user("Another one?"), HEAD, turn("Green, like grass.")],
        [user("Name a colour."), HEAD, turn("Blue."), user("Another one?"), HEAD,
         think("Not blue again.", "Green, like grass.")],
    ),
    "multi_turn_inline_think": (
        [M("user", "Is it on?"), M("assistant", "<think>\nCheck the light.\n</think>\n\nYes."),
         M("user", "Sure?"), M("assistant", "<think>\nLook again.\n</think>\n\nQuite sure.")],
        [user("Is it on?"), HEAD, turn("<think>\nCheck the light.\n</think>\n\nYes."), user("Sure?"), HEAD,
         turn("<think>\nLook again.\n</think>\n\nQuite sure.")],
        [user("Is it on?"), HEAD, turn("Yes."), user("Sure?"), HEAD, think("Look again.", "Quite sure.")],
    ),
    # The replies also appear in the prompts: each must be found in its own turn.
    "reply_inside_prompt": (
        [M("user", "Reply with ok."), M("assistant", "ok"), M("user", "ok"), M("assistant", "ok", reasoning_content="ok")],
        [user("Reply with ok."), HEAD, turn("ok"), user("ok"), HEAD, turn("ok")],
        [user("Reply with ok."), HEAD, turn("ok"), user("ok"), HEAD, think("ok", "ok")],
    ),
    # Two replies after the last user turn: Qwen3 keeps the reasoning of both.
    "two_replies_after_last_user": (
        [M("user", "Count to two."), M("assistant", "One.", reasoning_content="Start at one."),
         M("assistant", "Two.")],
        [user("Count to two."), HEAD, turn("One."), HEAD, turn("Two.")],
        [user("Count to two."), HEAD, think("Start at one.", "One."), HEAD, think("", "Two.")],
    ),
    "empty_reply": (
        [M("user", "Say nothing."), M("assistant", ""), M("user", "Good."), M("assistant", "Thanks.")],
        [user("Say nothing."), HEAD, turn(""), user("Good."), HEAD, turn("Thanks.")],
        [user("Say nothing."), HEAD, turn(""), user("Good."), HEAD, think("", "Thanks.")],
    ),
}

TEMPLATES = {"chatml": None, "qwen3": QWEN3_LIKE}  # None: the one moefit init writes


def encode(segments):
    """(ids, mask) of rendered segments with the byte-level tokenizer: the special
    tokens by their ids, every other byte as itself."""
    ids, mask = [], []
    pattern = "(" + "|".join(re.escape(s) for s in SPECIAL) + ")"
    for text, bit in segments:
        for piece in re.split(pattern, text):
            new = [SPECIAL[piece]] if piece in SPECIAL else list(piece.encode("utf-8"))
            ids += new
            mask += [bit] * len(new)
    return ids, mask


HEADER = struct.Struct("<8sIIIIQQQQQQQQQQIIQI")


def read_tokens(path):
    """(vocab, ids, mask or None, doc starts) of a .tokens file (docs/data.md's format)."""
    with open(path, "rb") as f:
        data = f.read()
    (magic, version, header_size, vocab, width, count, doc_count, flags, tok_off, tok_size, mask_off, mask_size,
     docs_off, docs_size, file_size, payload_crc, _, _, _) = HEADER.unpack_from(data, 0)
    (header_crc,) = struct.unpack_from("<I", data, 124)
    assert magic == b"MFTOKENS" and version == 1, (magic, version)
    assert header_crc == zlib.crc32(data[:124]), "header checksum"
    assert file_size == len(data) and payload_crc == zlib.crc32(data[header_size:]), "payload checksum"
    assert tok_size == count * width and docs_size == doc_count * 8
    fmt = "<%d%s" % (count, "H" if width == 2 else "I")
    ids = list(struct.unpack_from(fmt, data, tok_off))
    mask = None
    if flags & 1:
        assert mask_size == (count + 7) // 8
        bits = data[mask_off:mask_off + mask_size]
        mask = [(bits[i // 8] >> (i % 8)) & 1 for i in range(count)]
    starts = list(struct.unpack_from("<%dQ" % doc_count, data, docs_off))
    return vocab, ids, mask, starts


def repo_root():
    srcdir, ws = os.environ.get("TEST_SRCDIR"), os.environ.get("TEST_WORKSPACE")
    if srcdir and ws:
        return os.path.join(srcdir, ws)
    return os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


class Env:
    """The python, the scratch dir and one tokenizer dir per template, made once."""

    made = None

    def __init__(self):
        self.py = py_util.hf_python()
        self.script = os.path.join(repo_root(), "tools", "prepare_data.py")
        self.scratch = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "prepare_data_test")
        self.tokenizers = {}
        self.outputs = {}
        if self.py is None:
            return
        shutil.rmtree(self.scratch, ignore_errors=True)
        os.makedirs(self.scratch)
        init = os.path.join(self.scratch, "init")
        p = subprocess.run([ARGS.moefit, "init", "--family", "qwen3_moe", "--preset", "tiny", "--out", init],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError("moefit init failed:\n" + p.stdout + p.stderr)
        for name, template in list(TEMPLATES.items()) + [("redacting", REDACTING)]:
            d = os.path.join(self.scratch, "tok-" + name)
            os.makedirs(d)
            for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
                shutil.copy(os.path.join(init, f), d)
            if template is not None:
                path = os.path.join(d, "tokenizer_config.json")
                with open(path) as f:
                    cfg = json.load(f)
                cfg["chat_template"] = template
                with open(path, "w") as f:
                    json.dump(cfg, f, indent=2)
            self.tokenizers[name] = d

    @classmethod
    def get(cls):
        if cls.made is None:
            cls.made = Env()
        return cls.made

    def run(self, tok, records, out):
        jsonl = out[: -len(".tokens")] + ".jsonl"
        with open(jsonl, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=os.path.join(self.scratch, ".hf"))
        p = subprocess.run([self.py, self.script, "--tokenizer", self.tokenizers[tok], jsonl, "--out", out],
                           capture_output=True, text=True, env=env)
        return jsonl, p

    def output(self, tok):
        """The .tokens file of all CASES (one document each, in order) with template tok."""
        if tok not in self.outputs:
            out = os.path.join(self.scratch, f"cases-{tok}.tokens")
            _, p = self.run(tok, [{"messages": c[0]} for c in CASES.values()], out)
            self.outputs[tok] = (p, read_tokens(out) if p.returncode == 0 else None)
        return self.outputs[tok]


class PrepareData(unittest.TestCase):
    def setUp(self):
        self.env = Env.get()
        if self.env.py is None and py_util.tools_required():
            self.fail("no python with transformers, jinja2 and numpy to run tools/prepare_data.py "
                      "(MF_TEST_REQUIRE=1: it must run here)")
        if self.env.py is None:
            self.skipTest("no python with transformers, jinja2 and numpy to run tools/prepare_data.py (set "
                          "MF_HF_PYTHON: tools/test passes ~/.cache/moefit/hfvenv/bin/python, which .ci/run makes)")

    def check_case(self, tok, name):
        p, got = self.env.output(tok)
        self.assertEqual(p.returncode, 0, f"prepare_data.py failed:\n{p.stdout}{p.stderr}")
        vocab, ids, mask, starts = got
        self.assertEqual(vocab, 259)
        self.assertIsNotNone(mask, "no mask section")
        k = list(CASES).index(name)
        lo, hi = starts[k], starts[k + 1] if k + 1 < len(starts) else len(ids)
        segments = CASES[name][1 if tok == "chatml" else 2]
        want_ids, want_mask = encode(segments)
        self.assertEqual(ids[lo:hi], want_ids, "the rendered conversation's ids")
        show = "".join(chr(i) if i < 256 else "#" for i in want_ids)
        got_m, want_m = "".join(map(str, mask[lo:hi])), "".join(map(str, want_mask))
        self.assertEqual(got_m, want_m, f"the mask over {show!r}\n got  {got_m}\n want {want_m}")

    def test_documents(self):
        for tok in TEMPLATES:
            p, got = self.env.output(tok)
            self.assertEqual(p.returncode, 0, f"{tok}: prepare_data.py failed:\n{p.stdout}{p.stderr}")
            self.assertEqual(len(got[3]), len(CASES), f"{tok}: one document per conversation")

    def test_refuses_template_that_rewrites_replies(self):
        out = os.path.join(self.env.scratch, "redacted.tokens")
        records = [{"messages": CASES["single_turn"][0]}, {"messages": CASES["multi_turn"][0]}]
        jsonl, p = self.env.run("redacting", records, out)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn(f"{jsonl}:2: message 2: the assistant content", p.stderr)
        self.assertIn("{% generation %}", p.stderr)
        self.assertEqual(p.stderr.count("\n"), 1, "one line: " + p.stderr)
        self.assertFalse(os.path.exists(out), "a refused input leaves no output")

    def test_reasoning_content_must_be_a_string(self):
        out = os.path.join(self.env.scratch, "badreason.tokens")
        records = [{"messages": [M("user", "Hi."), M("assistant", "Hello.", reasoning_content=["no"])]}]
        jsonl, p = self.env.run("qwen3", records, out)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn(f'{jsonl}:1: message 1: "reasoning_content" must be a string', p.stderr)


for _tok in TEMPLATES:
    for _name in CASES:
        setattr(PrepareData, f"test_{_tok}_{_name}", lambda self, t=_tok, n=_name: self.check_case(t, n))


class XmlResult(unittest.TextTestResult):
    """Records each case's outcome for Bazel's test.xml, so skipped cases count as skipped."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.outcomes = []

    def addSuccess(self, test):
        super().addSuccess(test)
        self.outcomes.append((test, "passed", ""))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcomes.append((test, "failed", self._exc_info_to_string(err, test)))

    def addError(self, test, err):
        super().addError(test, err)
        self.outcomes.append((test, "failed", self._exc_info_to_string(err, test)))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.outcomes.append((test, "skipped", reason))


def write_xml(outcomes):
    py_util.write_xml("PrepareData", [(t.id().split(".")[-1], r, m) for t, r, m in outcomes])


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--moefit", required=True)
    ARGS, rest = ap.parse_known_args()
    ARGS.moefit = os.path.abspath(ARGS.moefit)
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(PrepareData)
    result = unittest.TextTestRunner(resultclass=XmlResult, verbosity=2).run(suite)
    write_xml(result.outcomes)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
