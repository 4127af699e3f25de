#!/usr/bin/env python3
"""README.md's "Fine-tune your own model" walkthrough, run as written (issue 27).

The walkthrough is the text between <!-- walkthrough:begin --> and
<!-- walkthrough:end --> in README.md.
Every command of its ```sh blocks runs in order, in a scratch dir that holds a
copy of configs/ and tools/prepare_data.py, with exactly these substitutions:

  - the model: `huggingface-cli download REPO [FILE...] --local-dir DIR` (or
    `hf download`) is not run; instead DIR gets those files (all of them when
    none is named) of a tiny model made by
    `moefit init --family qwen3_moe --preset tiny` (config.json, fp32
    model.safetensors and its byte-level tokenizer), so the plan step sees
    config.json alone, as a user who downloaded only that;
  - the data: chat.jsonl is written by the test (short made-up fortunes as chat turns);
  - the size: `moefit plan|train|eval CONFIG` get OVERRIDES after CONFIG (the
    rest of the command as written): the cpu backend and its profile, 64-token
    sequences, 4 a micro-batch, 30 steps at a learning rate the tiny random model
    moves at;
  - `moefit` and `python3` on PATH: the binary under test, and MF_HF_PYTHON (a
    python with transformers, jinja2 and numpy: tools/test passes the venv
    .ci/run makes); without such a python the whole test is skipped, saying so;
  - ```python blocks run with that python only where it imports torch and peft,
    else they count as skipped, with the reason.

Then it checks: every command exited 0; `moefit plan` ran with no weights in
the model dir and printed a chosen plan that fits and host memory that fits;
training finished and left a PEFT adapter dir; `moefit eval` of an exported
model dir gives the loss of `moefit eval` of the adapter dir within 1e-5
relative (the cpu backend computes x (W + s B A)^T for the one and
x W^T + s (x A^T) B^T for the other in fp32: the same maths, other roundings,
so not the same bits), over the same tokens; and, run by the test beside the
walkthrough, the base alone evaluates more than 1e-3 away, so that equality
says the adapters were merged.

usage: walkthrough_test.py --moefit PATH   (bazel test //tests/docs:walkthrough_test)
"""

import argparse
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import time

from tests import py_util

BEGIN, END = "<!-- walkthrough:begin -->", "<!-- walkthrough:end -->"
FENCE = re.compile(r"^```([A-Za-z0-9_-]*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
OVERRIDES = [
    "backend=cpu",
    "hardware.profile=configs/hw/cpu-2core.yaml",
    "data.seq_len=64",
    "train.micro_batch=4",
    "train.steps=30",
    "train.warmup=3",
    "train.lr=3e-3",
]
REL_TOL = 1e-5
EVAL_LINE = re.compile(r"^loss (\S+)\s+perplexity (\S+)\s+\((\d+) tokens in (\d+) sequences\)", re.M)
TIMEOUT_S = 240


def repo_root():
    srcdir, ws = os.environ.get("TEST_SRCDIR"), os.environ.get("TEST_WORKSPACE")
    if srcdir and ws:
        return os.path.join(srcdir, ws)
    return os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def sh_blocks(text):
    return [(lang, body) for lang, body in FENCE.findall(text) if lang in ("sh", "python")]


def walkthrough(root):
    """(where, blocks): README.md's section between the walkthrough markers."""
    readme = read(os.path.join(root, "README.md"))
    if BEGIN not in readme or END not in readme:
        raise SystemExit("walkthrough_test: README.md has no walkthrough markers: nothing to run")
    blocks = sh_blocks(readme.split(BEGIN, 1)[1].split(END, 1)[0])
    if not any(lang == "sh" for lang, _ in blocks):
        raise SystemExit("walkthrough_test: README.md's walkthrough markers hold no ```sh block")
    return "README.md (between the walkthrough markers)", blocks


def commands(body):
    """The commands of a sh block: backslash-continued lines joined, comments and blanks dropped."""
    out, cur = [], None
    for line in body.splitlines():
        if cur is None:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            cur = line
        else:
            cur += "\n" + line
        if not line.rstrip().endswith("\\"):
            out.append(cur)
            cur = None
    if cur is not None:
        out.append(cur)
    return out


def words(cmd):
    return shlex.split(cmd.replace("\\\n", " "), comments=True)


def chat_jsonl(path):
    """Made-up fortunes as chat turns: some with a system turn, some two rounds."""
    asks = ["Tell me a fortune.", "What does the future hold?", "Any advice for today?",
            "Give me a proverb.", "What should I know before Monday?"]
    fortunes = [
        "You will be hungry again in one hour.",
        "A journey of a thousand miles begins with a single step.",
        "Never trust a computer you cannot lift.",
        "The early bird gets the worm; the second mouse gets the cheese.",
        "Today is a good day to finish what you started yesterday.",
        "A closed mouth gathers no feet.",
        "You will find a bug where you least expect it.",
        "Patience is a virtue, unless the build is broken.",
        "Your code will compile on the first try, once.",
        "Good news will come to you by mail.",
        "He who laughs last thinks slowest.",
        "A clean desk is a sign of a full drawer.",
    ]
    r = random.Random(27)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(400):
            msgs = [{"role": "system", "content": "You are a fortune cookie."}] if i % 5 == 0 else []
            for _ in range(1 + (i % 7 == 0)):
                msgs += [{"role": "user", "content": r.choice(asks)},
                         {"role": "assistant", "content": r.choice(fortunes)}]
            f.write(json.dumps({"messages": msgs}) + "\n")


class Run:
    def __init__(self):
        self.cases = []  # (name, "passed" | "failed" | "skipped", message)

    def case(self, name, result, msg=""):
        self.cases.append((name, result, msg))
        print(f"[{result.upper():7}] {name}{': ' + msg if msg else ''}", flush=True)

    def check(self, name, ok, msg=""):
        self.case(name, "passed" if ok else "failed", "" if ok else msg)
        return ok

    def write_xml(self):
        py_util.write_xml("Walkthrough", self.cases)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moefit", required=True)
    args = ap.parse_args()
    root = repo_root()
    moefit = os.path.abspath(args.moefit)
    run = Run()

    where, blocks = walkthrough(root)
    print(f"walkthrough: {where}: {sum(l == 'sh' for l, _ in blocks)} sh blocks, "
          f"{sum(l == 'python' for l, _ in blocks)} python blocks")
    py = py_util.hf_python()
    if py is None:
        msg = ("skipped: no python with transformers, jinja2 and numpy for tools/prepare_data.py "
               "(set MF_HF_PYTHON: tools/test passes ~/.cache/moefit/hfvenv/bin/python, which .ci/run makes)")
        if py_util.tools_required():
            run.case("the walkthrough", "failed", msg[len("skipped: "):] + " (MF_TEST_REQUIRE=1: it must run here)")
            run.write_xml()
            return 1
        run.case("the walkthrough", "skipped", msg)
        run.write_xml()
        return 0
    print(f"python3: {py}\nmoefit: {moefit}\noverrides after CONFIG: {' '.join(OVERRIDES)}")

    scratch = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "walkthrough")
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(os.path.join(scratch, "bin"))
    shutil.copytree(os.path.join(root, "configs"), os.path.join(scratch, "configs"))
    os.makedirs(os.path.join(scratch, "tools"))
    shutil.copy(os.path.join(root, "tools", "prepare_data.py"), os.path.join(scratch, "tools"))
    os.symlink(moefit, os.path.join(scratch, "bin", "moefit"))
    with open(os.path.join(scratch, "bin", "python3"), "w") as f:
        f.write(f"#!/bin/sh\nexec {shlex.quote(py)} \"$@\"\n")
    os.chmod(os.path.join(scratch, "bin", "python3"), 0o755)
    chat_jsonl(os.path.join(scratch, "chat.jsonl"))
    env = dict(os.environ, PATH=os.path.join(scratch, "bin") + os.pathsep + os.environ.get("PATH", ""),
               HF_HUB_OFFLINE="1", HF_HOME=os.path.join(scratch, ".hf"), TRANSFORMERS_VERBOSITY="error")

    init_dir = os.path.join(scratch, ".init-model")
    p = subprocess.run([moefit, "init", "--family", "qwen3_moe", "--preset", "tiny", "--out", init_dir],
                       capture_output=True, text=True)
    if not run.check("moefit init --family qwen3_moe --preset tiny (the stand-in model)", p.returncode == 0,
                     p.stdout + p.stderr):
        run.write_xml()
        return 1
    print(p.stdout.strip())

    def sh(cmd):
        t0 = time.time()
        try:
            p = subprocess.run(["bash", "-c", cmd], cwd=scratch, env=env, capture_output=True, text=True,
                               timeout=TIMEOUT_S)
            out, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out, rc = f"timed out after {TIMEOUT_S} s\n{e.stdout or ''}{e.stderr or ''}", 124
        return rc, out, time.time() - t0

    model_dirs, outputs, failed = [], [], False
    peft_ok = subprocess.run([py, "-c", "import torch, peft, transformers"], capture_output=True).returncode == 0
    for n, (lang, body) in enumerate(blocks, 1):
        if lang == "python":
            name = f"block {n} (python)"
            if not peft_ok:
                required = py_util.tools_required()
                run.case(name, "failed" if required else "skipped", f"{py} has no torch and peft" +
                         (" (MF_TEST_REQUIRE=1: it must run here)" if required else ""))
                failed = failed or required
                continue
            snippet = os.path.join(scratch, f"block{n}.py")
            with open(snippet, "w") as f:
                f.write(body)
            rc, out, secs = sh(f"python3 {shlex.quote(snippet)}")
            print(out.rstrip())
            failed |= not run.check(f"{name} exits 0 ({secs:.1f} s)", rc == 0, out[-2000:])
            continue
        for cmd in commands(body):
            w = words(cmd)
            name = f"block {n}: {' '.join(w)}"
            if len(w) >= 2 and w[0] in ("huggingface-cli", "hf") and w[1] == "download":
                files, dest, i = [], None, 3
                while i < len(w):
                    if w[i] == "--local-dir":
                        dest, i = w[i + 1], i + 2
                    elif w[i].startswith("--local-dir="):
                        dest, i = w[i].split("=", 1)[1], i + 1
                    elif w[i].startswith("-"):
                        i += 2
                    else:
                        files, i = files + [w[i]], i + 1
                if dest is None:
                    failed |= not run.check(name, False, "a download without --local-dir: the test cannot stand in for it")
                    continue
                dest = os.path.join(scratch, dest)
                os.makedirs(dest, exist_ok=True)
                names = files or sorted(os.listdir(init_dir))
                missing = [f for f in names if not os.path.exists(os.path.join(init_dir, f))]
                for f in names:
                    if f not in missing:
                        shutil.copy(os.path.join(init_dir, f), dest)
                if dest not in model_dirs:
                    model_dirs.append(dest)
                why = f"not run: {', '.join(names)} of the moefit init model copied into {os.path.relpath(dest, scratch)}"
                failed |= not run.check(name + " (" + why + ")", not missing,
                                        f"moefit init writes no {', '.join(missing)}")
                continue
            run_cmd = cmd
            if len(w) >= 3 and w[0] == "moefit" and w[1] in ("plan", "train", "eval"):
                run_cmd = shlex.join(w[:3] + OVERRIDES + w[3:])
            weights = [f for d in model_dirs for f in os.listdir(d) if f.endswith(".safetensors")]
            rc, out, secs = sh(run_cmd)
            print(f"$ {run_cmd}\n{out.rstrip()}\n", flush=True)
            outputs.append((w, out, weights))
            failed |= not run.check(f"{name} exits 0 ({secs:.1f} s)", rc == 0, f"exit {rc}\n{out[-3000:]}")
            if rc != 0:
                break
        if failed:
            break

    # What the walkthrough must have shown.
    plans = [(out, weights) for w, out, weights in outputs if w[:2] == ["moefit", "plan"]]
    if run.check("the walkthrough plans", bool(plans), "no `moefit plan` command"):
        out, weights = plans[0]
        run.check("`moefit plan` ran with config.json alone (no weights downloaded yet)", not weights,
                  f"the model dir held {weights}")
        run.check("`moefit plan` chose a plan that fits", re.search(r"^\s+chosen\s.*\sfits$", out, re.M) is not None,
                  out[-3000:])
        run.check("`moefit plan`: host memory fits", re.search(r"^host memory: .*: fits$", out, re.M) is not None,
                  out[-3000:])
    trains = [(w, out) for w, out, _ in outputs if w[:2] == ["moefit", "train"]]
    config = trains[0][0][2] if trains else None
    if run.check("the walkthrough trains", bool(trains), "no `moefit train` command"):
        out = trains[0][1]
        run.check("training ran its steps", re.search(r"^done: \d+ steps", out, re.M) is not None, out[-3000:])
        final = os.path.join(scratch, "runs", "qwen3-30b-a3b-lora", "final", "adapter_config.json")
        m = re.search(r"^adapters: (\S+) \(a PEFT adapter dir", out, re.M)
        if m:
            final = os.path.join(scratch, m.group(1), "adapter_config.json")
        run.check("training left a PEFT adapter dir", os.path.isfile(final), f"no {final}")

    adapter_evals, model_evals = [], []
    for w, out, _ in outputs:
        if w[:2] != ["moefit", "eval"] or "--model" not in w:
            continue
        d = os.path.join(scratch, w[w.index("--model") + 1])
        m = EVAL_LINE.search(out)
        if not m:
            continue
        loss = (float(m.group(1)), int(m.group(3)), int(m.group(4)))
        if os.path.isfile(os.path.join(d, "adapter_config.json")):
            adapter_evals.append((d, loss))
        elif os.path.isfile(os.path.join(d, "config.json")):
            model_evals.append((d, loss))
    have = run.check("the walkthrough evaluates the adapter dir and an exported model dir",
                     bool(adapter_evals) and bool(model_evals),
                     f"adapter evals {adapter_evals}, model evals {model_evals}")
    if have:
        ad, (a_loss, a_tok, a_seq) = adapter_evals[0]
        for d, (loss, tok, seq) in model_evals:
            rel = abs(loss - a_loss) / abs(a_loss)
            run.check(f"eval of {os.path.relpath(d, scratch)} = eval of {os.path.relpath(ad, scratch)} "
                      f"({loss:.6f} vs {a_loss:.6f}: relative difference {rel:.1e}, tolerance {REL_TOL:g})",
                      rel <= REL_TOL and (tok, seq) == (a_tok, a_seq),
                      f"loss {loss} over {tok} tokens / {seq} sequences, adapter {a_loss} over {a_tok} / {a_seq}")
        # Beside the walkthrough: the base alone, to show the equality above is the merge's.
        base = next((d for d in model_dirs if any(f.endswith(".safetensors") for f in os.listdir(d))), None)
        if config and base:
            cmd = shlex.join(["moefit", "eval", config] + OVERRIDES + ["--model", os.path.relpath(base, scratch)])
            rc, out, _ = sh(cmd)
            print(f"$ {cmd}   (the test's own, not the walkthrough's)\n{out.rstrip()}\n")
            m = EVAL_LINE.search(out)
            ok = rc == 0 and m is not None and abs(float(m.group(1)) - a_loss) / abs(a_loss) > 1e-3
            run.check(f"the base alone evaluates away from the adapters ({m.group(1) if m else '?'} vs {a_loss:.6f})",
                      ok, out[-2000:])
    run.write_xml()
    bad = [n for n, r, _ in run.cases if r == "failed"]
    print(f"walkthrough ({where}): {len(run.cases) - len(bad)} of {len(run.cases)} steps and checks "
          f"passed or skipped" + (f"; failed: {bad}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
