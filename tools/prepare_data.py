#!/usr/bin/env python3
"""Tokenize chat JSONL or plain text with a Hugging Face tokenizer into .tokens files.

The .tokens format is described in src/io/tokens.h and docs/data.md; this script
is a second writer of it (same header, same CRC-32 checksums), read by moefit's C
reader. Chat conversations are rendered with the tokenizer's own chat template and
only the assistant turns count in the loss (mask bit 1); prompts, system text and
the role headers are context (mask bit 0). Templates that rewrite earlier turns
(Qwen3's drops the reasoning of assistant turns a later user turn follows) work:
each turn is found in the render of the whole conversation (Tokenizer._assistant_spans).

How it was checked (no download from the hub; a tiny tokenizer is trained locally):
  python3 -m venv /tmp/tokvenv
  /tmp/tokvenv/bin/pip install transformers tokenizers jinja2 numpy
  /tmp/tokvenv/bin/python tests/tokens/data/make_fixture.py /tmp/tokfix
      # trains a byte-level BPE, saves it with a ChatML template, writes a tiny JSONL,
      # runs this script on it, and writes tests/tokens/data/chat_tiny.{tokens,expected}
      # (ids and assistant mask computed independently of this script)
  bazel test //tests/tokens:tokens_test      # the C reader validates and compares it
  bazel test //tests/tools:prepare_data_test --test_env=MF_HF_PYTHON=/tmp/tokvenv/bin/python
      # the mask bit by bit, ChatML and a Qwen3-like template, single- and multi-turn
  moefit inspect tests/tokens/data/chat_tiny.tokens
  python3 tools/prepare_data.py --help       # works without transformers
"""

import argparse
import json
import math
import os
import re
import struct
import sys
import tempfile
import zlib

PROG = "prepare_data.py"

MAGIC = b"MFTOKENS"
VERSION = 1
HEADER_SIZE = 128
FLAG_MASK = 1
# magic, version, header_size, vocab, width, count, doc_count, flags,
# tokens off/size, mask off/size, docs off/size, file_size, payload_crc32,
# reserved u32, reserved u64, reserved u32 (header_crc32 follows at byte 124).
HEADER = struct.Struct("<8sIIIIQQQQQQQQQQIIQI")
assert HEADER.size == 124


class DataError(Exception):
    """A problem with the input or the output: printed as one line, exit status 1."""


def fail(msg):
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------- the writer


class TokensWriter:
    """Streams a .tokens file like mf_tokens_writer: tokens to a temporary file beside
    the output, the packed mask bits to a spool file, then mask, document starts and
    the header at finish(), which fsyncs and renames over the output."""

    def __init__(self, np, path, vocab, width, with_mask):
        if vocab < 1:
            raise DataError(f"{path}: vocab size {vocab} (must be >= 1)")
        if width not in (2, 4) or (width == 2 and vocab > 65536):
            raise DataError(f"{path}: token width {width} cannot hold vocab {vocab}")
        self.np = np
        self.path = path
        self.vocab = vocab
        self.width = width
        self.dtype = np.dtype("<u2" if width == 2 else "<u4")
        self.with_mask = with_mask
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        self.tmp = f"{path}.tmp.{os.getpid()}"
        self.f = open(self.tmp, "wb")
        self.f.write(b"\0" * HEADER_SIZE)
        self.pos = HEADER_SIZE
        self.crc = 0
        self.count = 0
        self.doc_start = 0
        self.docs = []
        self.spool = tempfile.TemporaryFile(dir=directory) if with_mask else None
        self.mask_bytes = 0
        self.pending = np.zeros(0, dtype=np.uint8)  # mask bits not yet a whole byte
        self.loss_tokens = 0

    def _emit(self, data):
        self.crc = zlib.crc32(data, self.crc)
        self.f.write(data)
        self.pos += len(data)

    def _pad8(self):
        if self.pos % 8:
            self._emit(b"\0" * (8 - self.pos % 8))

    def append(self, ids, mask=None):
        np = self.np
        a = np.asarray(ids, dtype=np.int64)
        if a.size == 0:
            return
        bad = np.nonzero((a < 0) | (a >= self.vocab))[0]
        if bad.size:
            i = int(bad[0])
            raise DataError(f"{self.path}: token {self.count + i}: id {int(a[i])} outside vocab {self.vocab}")
        self._emit(a.astype(self.dtype).tobytes())
        if self.with_mask:
            m = np.ones(a.size, dtype=np.uint8) if mask is None else (np.asarray(mask) != 0).astype(np.uint8)
            if m.size != a.size:
                raise DataError(f"{self.path}: {m.size} mask bits for {a.size} tokens")
            self.loss_tokens += int(m.sum())
            bits = np.concatenate([self.pending, m])
            whole = bits.size // 8 * 8
            packed = np.packbits(bits[:whole], bitorder="little").tobytes()
            self.spool.write(packed)
            self.mask_bytes += len(packed)
            self.pending = bits[whole:]
        else:
            self.loss_tokens += int(a.size)
        self.count += int(a.size)

    def end_document(self):
        if self.count > self.doc_start:  # documents are never empty
            self.docs.append(self.doc_start)
            self.doc_start = self.count

    def finish(self):
        np = self.np
        self.end_document()
        tokens_offset, tokens_size = HEADER_SIZE, self.count * self.width
        self._pad8()
        mask_offset = mask_size = 0
        if self.with_mask:
            if self.pending.size:
                packed = np.packbits(self.pending, bitorder="little").tobytes()
                self.spool.write(packed)
                self.mask_bytes += len(packed)
            mask_offset, mask_size = self.pos, self.mask_bytes
            self.spool.seek(0)
            while True:
                chunk = self.spool.read(1 << 20)
                if not chunk:
                    break
                self._emit(chunk)
            self._pad8()
        docs_offset = self.pos
        docs = np.asarray(self.docs, dtype="<u8").tobytes()
        self._emit(docs)
        head = HEADER.pack(MAGIC, VERSION, HEADER_SIZE, self.vocab, self.width, self.count, len(self.docs),
                           FLAG_MASK if self.with_mask else 0, tokens_offset, tokens_size, mask_offset, mask_size,
                           docs_offset, len(docs), self.pos, self.crc, 0, 0, 0)
        head += struct.pack("<I", zlib.crc32(head))
        self.f.seek(0)
        self.f.write(head)
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.tmp, self.path)
        if self.spool:
            self.spool.close()
        try:
            fd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        except OSError:
            pass

    def abort(self):
        try:
            self.f.close()
            os.unlink(self.tmp)
        except OSError:
            pass
        if self.spool:
            self.spool.close()


# ---------------------------------------------------------------- documents


def is_valid_doc(i, fraction):
    """Document i goes to the validation file when floor((i+1)F) > floor(iF):
    exactly a fraction F, spread evenly; the same rule as `moefit data`."""
    return fraction > 0 and math.floor((i + 1) * fraction) > math.floor(i * fraction)


def text_records(path, split_on, split_blank):
    """Yields (where, text) for a plain-text file: the whole file, or its records."""
    try:
        with open(path, encoding="utf-8") as f:
            if split_on is None and not split_blank:
                yield path, f.read()
                return
            lines, start = [], 1
            for n, line in enumerate(f, 1):
                body = line.rstrip("\r\n")
                if (split_blank and body.strip() == "") or (split_on is not None and body == split_on):
                    if lines:
                        yield f"{path}:{start}", "".join(lines)
                    lines, start = [], n + 1
                else:
                    lines.append(line)
            if lines:
                yield f"{path}:{start}", "".join(lines)
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}): {e.reason}")
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}")


def jsonl_records(path):
    """Yields (where, record) for each non-blank line of a JSONL file."""
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{n}"
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{where}: not JSON (column {e.colno}): {e.msg}")
                if not isinstance(rec, dict) or not ("messages" in rec or "text" in rec):
                    raise DataError(f'{where}: expected an object with "messages" (chat) or "text"')
                yield where, rec
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 (byte {e.start}): {e.reason}")
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}")


def check_messages(where, messages):
    if not isinstance(messages, list) or not messages:
        raise DataError(f'{where}: "messages" must be a non-empty list')
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(f'{where}: message {i} needs a string "role" and a string "content"')
        if "reasoning_content" in m and not isinstance(m["reasoning_content"], str):
            raise DataError(f'{where}: message {i}: "reasoning_content" must be a string')
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{where}: no assistant message: nothing would count in the loss")


# ---------------------------------------------------------------- tokenizing

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def import_packages():
    """numpy and transformers' AutoTokenizer, or a clean exit naming what is missing."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    missing, np, auto = [], None, None
    try:
        import numpy as np
    except ImportError:
        missing.append("numpy")
    try:
        from transformers import AutoTokenizer as auto
    except ImportError:
        missing.append("transformers")
    if missing:
        fail(f"needs the Python package{'s' if len(missing) > 1 else ''} {' and '.join(missing)}: "
             "pip install transformers tokenizers jinja2 numpy")
    return np, auto


class Tokenizer:
    def __init__(self, AutoTokenizer, directory, add_eos):
        self.directory = directory
        self.layout = None
        if not os.path.isdir(directory):
            raise DataError(f"{directory}: not a directory (expected a local model or tokenizer dir)")
        try:
            self.tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except Exception as e:  # transformers raises many kinds here
            raise DataError(f"{directory}: cannot load a tokenizer: {e}")
        self.vocab = len(self.tok)
        self.eos = self.tok.eos_token_id if add_eos else None
        template = getattr(self.tok, "chat_template", None)
        self.template = template if isinstance(template, str) else None
        self.generation_tags = bool(self.template and _GENERATION_TAG.search(self.template))

    def _render(self, messages, gen_prompt):
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen_prompt)

    def text(self, text):
        ids = list(self.tok(text, add_special_tokens=True)["input_ids"])
        if self.eos is not None and (not ids or ids[-1] != self.eos):
            ids.append(self.eos)
        return ids, None

    def _layout(self):
        """(header, eot): what the template puts before and after an assistant turn,
        learned once from one-turn renders. header is the generation prompt (the
        assistant role header, e.g. "<|im_start|>assistant\\n"), None when rendering
        with it does not just append to rendering without it; eot is what follows the
        assistant's content when it ends the conversation (e.g. "<|im_end|>\\n")."""
        if self.layout is None:
            user = [{"role": "user", "content": "Hello."}]
            try:
                bare, prompted = self._render(user, False), self._render(user, True)
                reply = self._render(user + [{"role": "assistant", "content": _PROBE}], False)
            except Exception as e:  # a template may raise on anything
                raise DataError(f"{self.directory}: the chat template fails on a one-turn conversation "
                                f"(user, assistant): {e}")
            header = prompted[len(bare):] if prompted.startswith(bare) and len(prompted) > len(bare) else None
            at = reply.rfind(_PROBE)
            if at < 0:
                raise DataError(f"{self.directory}: the chat template does not render an assistant reply as "
                                "given, so assistant turns cannot be located; use a template with "
                                "{% generation %} tags")
            self.layout = (header, reply[at + len(_PROBE):])
        return self.layout

    def chat(self, where, messages):
        if self.template is None:
            raise DataError(f"{where}: the tokenizer has no chat template (chat_template in tokenizer_config.json)")
        if self.generation_tags:
            out = self.tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                               return_assistant_tokens_mask=True)
            return list(out["input_ids"]), list(out["assistant_masks"])
        if not getattr(self.tok, "is_fast", False):
            raise DataError(f"{where}: a fast tokenizer (tokenizer.json) is needed to place the loss mask")
        try:
            full = self._render(messages, False)
        except Exception as e:
            raise DataError(f"{where}: the chat template fails on this conversation: {e}")
        spans = self._assistant_spans(where, messages, full)
        enc = self.tok(full, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        mask = []
        for s, e in enc["offset_mapping"]:
            inside = any((s < b and e > a) or (s == e and a <= s < b) for a, b in spans)
            mask.append(1 if inside else 0)
        return ids, mask

    def _assistant_spans(self, where, messages, full):
        """The character spans of the assistant turns in the rendered conversation.

        The conversation is rendered once, as it is trained on; each assistant turn is
        then found in that text, in order: after the end of the previous turn, the
        template's assistant header, then the message's content followed by the
        end-of-turn text (both learned by _layout). The turn counts from the end of its
        header (so what the template renders there, such as Qwen3's <think> block,
        counts too) through the end-of-turn text. Rendering prefix by prefix instead
        would break on templates that rewrite earlier turns (Qwen3's drops the
        reasoning of assistant turns a later user turn follows).

        The content may appear as given, stripped of surrounding whitespace, or as the
        part after its </think> (templates that move inline reasoning out, or drop it
        from earlier turns). Where the header is not in the render (a generation prompt
        longer than the turn's header) the turn counts from its content. Each user and
        tool message must lie between the turns around it, so that a reply is never
        found inside a prompt; anything else is refused, naming the message."""
        header, eot = self._layout()
        spans, pos, between = [], 0, []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                if m["role"] != "system" and m["content"].strip():
                    between.append((i, m["content"].strip()))
                continue
            head = full.find(header, pos) if header else -1
            start = head + len(header) if head >= 0 else pos
            found = None
            for text in _content_forms(m["content"]):
                at = full.find(text + eot, start)
                if at < 0:
                    continue
                gap = full[start:at]
                if head >= 0 and (header in gap or (eot and eot in gap)):
                    continue  # that is a later turn's
                found = (head + len(header) if head >= 0 else at, at + len(text) + len(eot))
                break
            if found is None:
                raise DataError(f"{where}: message {i}: the assistant content, followed by the end-of-turn text "
                                f"{eot!r}, is not in the rendered conversation (the chat template changes it), "
                                "so the turn cannot be located; use a template with {% generation %} tags")
            self._check_between(where, i, between, full, pos, head if head >= 0 else found[0])
            between = []
            spans.append(found)
            pos = found[1]
        self._check_between(where, None, between, full, pos, len(full))
        return spans

    @staticmethod
    def _check_between(where, i, between, full, lo, hi):
        """Each (k, text) of between is found in order in full[lo:hi]: the text rendered
        between the previous assistant turn and assistant message i (None: the end)."""
        for k, text in between:
            at = full.find(text, lo, hi)
            if at < 0:
                place = f"before assistant message {i}" if i is not None else "after the last assistant turn"
                raise DataError(f"{where}: message {k} is not rendered {place} as given, so the assistant turns "
                                "cannot be located safely; use a template with {% generation %} tags")
            lo = at + len(text)


def _content_forms(content):
    """The forms an assistant content may take in a render, most literal first."""
    forms = [content, content.lstrip("\n"), content.strip()]
    if "</think>" in content:
        after = content.split("</think>")[-1]
        forms += [after.lstrip("\n"), after.strip()]
    return list(dict.fromkeys(forms))


_PROBE = "MOEFIT_PROBE_REPLY_7f3a"


# ---------------------------------------------------------------- main

USAGE_EPILOG = """\
inputs:
  *.jsonl     one JSON object per line: {"messages": [{"role": "system"|"user"|"assistant",
              "content": "..."}]} is a conversation (rendered with the tokenizer's chat
              template; only assistant turns count in the loss: what the template renders
              after the assistant header, through its end-of-turn tokens), {"text": "..."}
              a plain document (every token counts). Each line is one document. An
              assistant message may have "reasoning_content" for templates that render it
              (Qwen3's <think> block).
  other files plain UTF-8 text: the whole file is one document, or one per record with
              --split-on/--split-on-blank. Every token counts.
  Text documents get the tokenizer's BOS (if it adds one) and EOS (unless --no-eos).

The output has a loss-mask section when any conversation is present (unless --no-mask).
Token width is 2 bytes when the vocab (len(tokenizer), added tokens included) is at
most 65536, else 4. Outputs are written atomically; missing directories are created.

example:
  python3 tools/prepare_data.py --tokenizer ~/models/Qwen1.5-MoE-A2.7B-Chat chat.jsonl \\
      --out data/chat.train.tokens --valid-fraction 0.02 --valid-out data/chat.valid.tokens
  moefit inspect data/chat.train.tokens
"""


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Tokenize chat JSONL or plain text with a local Hugging Face tokenizer into moefit "
        ".tokens files (format: src/io/tokens.h).",
        epilog=USAGE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="JSONL (.jsonl) or text files")
    p.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="local model or tokenizer directory (AutoTokenizer.from_pretrained; nothing is downloaded)")
    p.add_argument("--out", required=True, metavar="OUT.tokens", help="the training file to write")
    p.add_argument("--valid-fraction", type=float, default=0.0, metavar="F",
                   help="put a fraction 0 < F < 1 of the documents in --valid-out: document i goes there when "
                   "floor((i+1)F) > floor(iF) (deterministic, as in `moefit data`)")
    p.add_argument("--valid-out", metavar="VALID.tokens", help="the validation file (with --valid-fraction)")
    p.add_argument("--format", choices=["auto", "jsonl", "text"], default="auto",
                   help="how to read the inputs (auto: .jsonl/.json files are JSONL, others text)")
    split = p.add_mutually_exclusive_group()
    split.add_argument("--split-on", metavar="LINE", help="text inputs: a line that is exactly LINE ends a document")
    split.add_argument("--split-on-blank", action="store_true", help="text inputs: blank lines end a document")
    p.add_argument("--no-eos", action="store_true", help="do not append EOS to text documents")
    p.add_argument("--no-mask", action="store_true", help="write no loss mask: every token counts")
    a = p.parse_args(argv)
    if (a.valid_fraction != 0.0) != (a.valid_out is not None):
        p.error("--valid-fraction and --valid-out go together")
    if a.valid_out is not None and not 0.0 < a.valid_fraction < 1.0:
        p.error(f"--valid-fraction {a.valid_fraction} must be between 0 and 1")
    if a.valid_out is not None and os.path.abspath(a.valid_out) == os.path.abspath(a.out):
        p.error("--valid-out and --out name the same file")
    return a


def documents(args):
    """Yields (where, kind, payload): kind "chat" with messages, or "text" with a string."""
    for path in args.inputs:
        if not os.path.exists(path):
            raise DataError(f"{path}: no such file")
        if os.path.isdir(path):
            raise DataError(f"{path}: is a directory (pass its files)")
        fmt = args.format
        if fmt == "auto":
            fmt = "jsonl" if path.endswith((".jsonl", ".json")) else "text"
        if fmt == "jsonl":
            for where, rec in jsonl_records(path):
                if "messages" in rec:
                    check_messages(where, rec["messages"])
                    yield where, "chat", rec["messages"]
                elif isinstance(rec["text"], str):
                    yield where, "text", rec["text"]
                else:
                    raise DataError(f'{where}: "text" must be a string')
        else:
            for where, text in text_records(path, args.split_on, args.split_on_blank):
                yield where, "text", text


def has_chat(args):
    for path in args.inputs:
        fmt = args.format
        if fmt == "auto":
            fmt = "jsonl" if path.endswith((".jsonl", ".json")) else "text"
        if fmt == "jsonl" and os.path.isfile(path):
            for _, rec in jsonl_records(path):
                if "messages" in rec:
                    return True
    return False


def main(argv):
    args = parse_args(argv)
    np, auto_tokenizer = import_packages()
    writers = []
    try:
        for path in args.inputs:  # fail before tokenizing anything
            if not os.path.isfile(path) or not os.access(path, os.R_OK):
                raise DataError(f"{path}: no such readable file")
        tok = Tokenizer(auto_tokenizer, args.tokenizer, add_eos=not args.no_eos)
        width = 2 if tok.vocab <= 65536 else 4
        with_mask = not args.no_mask and has_chat(args)
        train = TokensWriter(np, args.out, tok.vocab, width, with_mask)
        writers.append(train)
        valid = None
        if args.valid_out:
            valid = TokensWriter(np, args.valid_out, tok.vocab, width, with_mask)
            writers.append(valid)
        n = 0
        for where, kind, payload in documents(args):
            ids, mask = tok.chat(where, payload) if kind == "chat" else tok.text(payload)
            if not ids:
                continue
            w = valid if valid is not None and is_valid_doc(n, args.valid_fraction) else train
            w.append(ids, mask if with_mask else None)
            w.end_document()
            n += 1
        for w in writers:
            w.finish()
        for w in writers:
            frac = w.loss_tokens / w.count if w.count else 1.0
            print(f"{PROG}: wrote {w.path}: {len(w.docs)} documents, {w.count} tokens "
                  f"(vocab {tok.vocab}, u{8 * width}), {100 * frac:.1f}% count in the loss")
    except DataError as e:
        for w in writers:
            w.abort()
        fail(str(e))
    except BaseException:
        for w in writers:
            w.abort()
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
