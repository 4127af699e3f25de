#!/usr/bin/env python3
"""Runs every example of README.md, docs/*.md and moefit's --help texts, and
compares the outputs they show with the real ones.

usage: check_docs.py --moefit BIN --repo DIR [--readme FILE] [--docs DIR]
                     [--only FILE] [--list] [--keep] [--no-demo] [-v]

What a newcomer copies is what this checks. Every fenced block of README.md and
of docs/*.md (in that order, the pages by name) is one of:

  run        ```sh (or bash, shell): the block is one shell script (a line ending
             in '\\' continues; '#' lines are comments). ```console, ```text or a
             plain ``` block: each line starting with '$ ' is a command (it may
             continue with '\\'), run on its own.
             ```yaml: a block with a `model:` section is a whole config (`moefit
             config` loads it); another is a snippet, put in place of its sections
             in configs/demo.yaml and planned (`moefit plan`: its patterns must
             match).
             A command must exit 0, or with N when it ends in `# exit status N`.
  compared   the lines after a '$ ' command, up to the next '$ ' line: what the
             command prints; or a ```text / plain ``` block with no '$ ' line
             that follows a run block with nothing but blank lines between: what
             that block prints (stdout and stderr together, as a terminal shows
             them). The shown lines must equal the first lines of the real output,
             after this normalisation:
               - a line `...` stands for any number of lines (none included);
               - a line ending in `...` matches a line that starts with the rest;
               - runs of spaces count as one; leading and trailing spaces are
                 dropped;
               - numbers that vary from run to run are masked: a number followed
                 by a time or rate unit (`s`, `ms`, `us`, `%`, `tok/s`, `GB/s`,
                 `MiB/s`, `s/step`, `M updates/s`, anything `/s`), a date
                 (2026-11-27), the Pss of `host memory: ... (Pss)` and the
                 predicted/executed ratio of `executed X s/step (R; ...`, and a
                 duration as an eta prints it (`35s`, `2m01s`, `1h02m`: one mask);
               - an evaluation's progress lines (`eval FILE: N/M windows (P%)
                 ...`), which only an evaluation over 2 s prints, are left out of
                 the real output;
               - with a marker `<!-- check_docs: numbers vary REASON -->` before
                 the block, every number in it is masked (benchmarks).
             Losses, sizes, counts and predictions are compared as they are: the
             cpu backend gives the same bits for any thread count.
  skipped    a block with a marker `<!-- check_docs: skip REASON -->` before it
             (blank lines may come between), or a command that SKIP below names,
             with its reason; an output block after a skipped command is skipped
             with it. README.md's walkthrough (between `<!-- walkthrough:begin -->`
             and `<!-- walkthrough:end -->`) is //tests/docs:walkthrough_test's:
             skipped here.

Any other block (another language, a plain block that is not a command's
output, a ```console block without a '$ ' line, a marker without a reason) is a
failure naming the file and line, so an example cannot be left unchecked
silently. The `--help` texts: the indented lines under a line that starts with
"example" are one script each (run, not compared).

The examples run in order in one scratch directory holding a copy of the
repository's configs/ (a later example sees the files an earlier one made, as a
reader's would), with `moefit` on PATH meaning BIN and MF_THREADS=2, after what
the README's first command (./tools/demo) does once moefit is built: the demo's
data (the `fortunes` package) and `moefit train configs/demo.yaml`. A `./tools/demo`
example is compared with that output. mpirun runs with the environment CI needs:
OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM) when run as root, oversubscription, the shared
memory transport without cross-memory attach (containers) and a scratch TMPDIR of
its own (concurrent tests); LSAN_OPTIONS' suppressions file is made absolute.

--no-demo leaves the demo out (the checker's own test); --only FILE checks one
page (after the demo); --list prints the examples and runs nothing.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

# (regex on a command, reason): commands left out, and why.
SKIP = [
    (r"^\./tools/test\b", "installs, builds and runs every test, this check among them"),
    (r"^\./tools/setup\b", "installs Debian packages (tools/test and tools/demo run it)"),
    (r"^bazel\b", "the build itself (tools/test builds and tests with Bazel)"),
    (r"^apt-get\b", "installs a Debian package (tools/setup installs fortunes)"),
    (r"^pip3? install\b", "installs PyPI packages"),
    (r"^python3 tools/prepare_data\.py --tokenizer ~/", "needs a model's tokenizer directory, which the repository does not hold"),
    (r"^\./tools/kill_test\.sh\b", "trains the demo several times over, killing and resuming it (//tests/cli:kill_test does the same)"),
    (r"^moefit bench optim$", "4.5 GiB of memory and about a minute at its default sizes (//tests/optim:bench_optim, tagged bench, runs it small)"),
    (r"^(\./)?tools/(gpu_check|gpu_session)\.sh\b", "needs a GPU"),
    (r"^python3 tools/peer_bench\.py\b", "needs torch and transformers"),
    (r"^python3 tools/check_docs\.py\b", "runs this check itself"),
    (r"^(huggingface-cli|hf) download\b", "downloads a model from the Hugging Face hub"),
]

# README.md's walkthrough (between these markers) is run by
# //tests/docs:walkthrough_test, with a tiny model in place of the download.
WALKTHROUGH = ("<!-- walkthrough:begin -->", "<!-- walkthrough:end -->")
WALKTHROUGH_REASON = "the walkthrough: //tests/docs:walkthrough_test runs it, a tiny model standing in for the download"

# Commands replaced by what they do here: ./tools/demo is the setup below.
DEMO = r"^\./tools/demo$"

TIMEOUT_S = 600
SH_LANGS = {"sh", "bash", "shell"}
CONSOLE_LANGS = {"console", "text", ""}
NUM = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
# A number followed by a time or rate unit (the number is group 1).
VARY_UNIT = re.compile(r"(?<![\w.])(" + NUM + r"[KMG]?)(?=\s?(?:s/step|s/update|M updates/s|[A-Za-z]*/s\b|ms\b|us\b|µs\b|ns\b|s\b|%))")
VARY_FIELDS = [
    re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),                   # a date
    re.compile(r"(?<=host memory: )" + NUM + r"(?= \S+ \(Pss\))"),
    re.compile(r"(?<=s/step \()" + NUM + r"(?=;)"),           # predicted/executed
]
ANY_NUM = re.compile(r"(?<![A-Za-z_])" + NUM)
# An evaluation's progress line, printed only when it takes over 2 s (a slower or
# busier machine prints more of them): left out of the output compared.
PROGRESS_TICK = re.compile(r"^eval \S+: \d+/\d+ windows \(\d+%\)")
# A duration as moefit prints an eta or an elapsed time ("35s", "2m01s", "1h02m"): one
# mask, so that a slower machine's longer form still matches.
DURATION = re.compile(r"(?<![\w.])(?:\d+h\d{2}m|\d+m\d{2}s|\d+h|\d+m|\d+s)(?![\w./])")


class Block:
    def __init__(self, path, line, lang, body, marker, adjacent):
        self.path, self.line, self.lang, self.body = path, line, lang, body
        self.marker = marker        # ("skip"|"vary", reason) or None
        self.adjacent = adjacent    # only blank lines since the previous block


class Example:
    """Commands run as one script; what they must print; where it is shown."""

    def __init__(self, place, cmds, expect=None, expect_place=None, vary=False, status=0):
        self.place, self.cmds, self.expect = place, cmds, expect
        self.expect_place, self.vary, self.status = expect_place, vary, status


def logical_lines(lines):
    """Joins continuation lines ('\\' at the end) into one command each."""
    out, cur = [], ""
    for line in lines:
        cur = (cur + " " + line.strip()) if cur else line.strip()
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip()
            continue
        if cur:
            out.append(cur)
        cur = ""
    if cur:
        out.append(cur)
    return out


def skip_reason(cmd):
    for pat, why in SKIP:
        if re.search(pat, cmd):
            return why
    return None


def parse_blocks(path, label, problems):
    """The fenced blocks of a markdown file, each with the marker before it."""
    lines = open(path, encoding="utf-8").read().split("\n")
    marker_re = re.compile(r"^\s*<!--\s*check_docs:\s*(skip|numbers vary)\b\s*(.*?)\s*-->\s*$")
    blocks, marker, adjacent, i = [], None, False, 0
    walkthrough = False
    while i < len(lines):
        line = lines[i]
        if line.strip() in WALKTHROUGH[:2]:
            walkthrough = line.strip() == WALKTHROUGH[0]
        mk = marker_re.match(line)
        m = re.match(r"^(\s*)(```+)\s*([\w+-]*)\s*$", line)
        if mk:
            marker = ("skip" if mk.group(1) == "skip" else "vary", mk.group(2), i + 1)
            adjacent = False
        elif m:
            indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
            j = i + 1
            while j < len(lines) and not re.match(r"^\s*" + fence + r"\s*$", lines[j]):
                j += 1
            body = [l[len(indent):] if l.startswith(indent) else l.lstrip() for l in lines[i + 1:j]]
            blocks.append(Block(label, i + 1, lang, body, ("skip", WALKTHROUGH_REASON, i + 1) if walkthrough
                                else marker, adjacent))
            marker, adjacent, i = None, True, j
        elif line.strip():
            adjacent = False
            if marker and not line.strip().startswith("<!--"):
                problems.append(f"{label}:{marker[2]}: a check_docs marker with text, not a fenced block, after it")
                marker = None
        i += 1
    if marker:
        problems.append(f"{label}:{marker[2]}: a check_docs marker with no fenced block after it")
    return blocks


def yaml_check(body, place):
    """A script that checks a yaml block: a whole config with `moefit config`, a
    snippet merged into configs/demo.yaml with `moefit plan`."""
    text = "\n".join(body) + "\n"
    name = "doc-" + re.sub(r"\W", "-", place) + ".yaml"
    sections = re.findall(r"^([a-z_]+):", text, re.M)
    if "model" in sections:
        return [f"cat > {name} <<'EOF_YAML'\n{text}EOF_YAML", f"moefit config {name} > /dev/null"]
    drop = "|".join(sections)
    awk = ("awk -v drop='^(" + drop + "):' '/^[a-z_]+:/ {skip = ($0 ~ drop)} !skip' configs/demo.yaml")
    return [f"{awk} > {name}", f"cat >> {name} <<'EOF_YAML'\n{text}EOF_YAML", f"moefit plan {name} > /dev/null"]


def expected_status(cmd):
    m = re.search(r"#\s*exit status (\d+)\s*$", cmd)
    return int(m.group(1)) if m else 0


def examples_of(blocks, problems, skipped):
    """[Example] from one file's blocks; what is neither run nor skipped goes
    to problems, what is skipped to skipped."""
    out, used = [], set()
    for n, b in enumerate(blocks):
        place = f"{b.path}:{b.line}"
        if n in used:
            continue
        follower = None
        if n + 1 < len(blocks):
            f = blocks[n + 1]
            if (f.adjacent and f.lang in ("", "text", "output") and not any(l.startswith("$ ") for l in f.body)):
                follower = f
        vary = False
        if b.marker:
            kind, reason = b.marker[0], b.marker[1]
            if not reason and kind == "skip":
                problems.append(f"{place}: `check_docs: skip` needs a reason")
                continue
            if kind == "skip":
                skipped.append((place, f"block ({reason})"))
                if follower and b.lang in SH_LANGS:
                    used.add(n + 1)
                    skipped.append((f"{follower.path}:{follower.line}", "output of a skipped block"))
                continue
            vary = True
        if b.lang in SH_LANGS:
            cmds = [c for c in logical_lines(b.body) if not c.startswith("#")]
            ex = Example(place, cmds, vary=vary)
            if follower:
                used.add(n + 1)
                ex.expect = follower.body
                ex.expect_place = f"{follower.path}:{follower.line}"
            if not cmds:
                problems.append(f"{place}: a ```{b.lang} block with no command")
                continue
            out.append(ex)
        elif b.lang == "yaml":
            out.append(Example(place, yaml_check(b.body, place)))
        elif b.lang in CONSOLE_LANGS and any(l.startswith("$ ") for l in b.body):
            k = 0
            while k < len(b.body) and not b.body[k].startswith("$ "):
                if b.body[k].strip():
                    problems.append(f"{b.path}:{b.line + 1 + k}: output before the block's first '$ ' command")
                    break
                k += 1
            while k < len(b.body):
                start = k
                chunk = [b.body[k][2:]]
                while chunk[-1].rstrip().endswith("\\") and k + 1 < len(b.body):
                    k += 1
                    chunk.append(b.body[k])
                k += 1
                expect = []
                while k < len(b.body) and not b.body[k].startswith("$ "):
                    expect.append(b.body[k])
                    k += 1
                while expect and not expect[-1].strip():
                    expect.pop()
                cmd_place = f"{b.path}:{b.line + 1 + start}"
                cmds = logical_lines(chunk)
                out.append(Example(cmd_place, cmds, expect or None, f"{b.path}:{b.line + 1 + start + len(chunk)}",
                                   vary, expected_status(cmds[-1])))
        else:
            what = f"```{b.lang}" if b.lang else "a plain ``` block"
            problems.append(f"{place}: {what} that is neither run, nor the output of the block before it, nor "
                            "skipped (<!-- check_docs: skip REASON --> before it)")
    return out


def help_examples(moefit, cwd, env):
    """[Example] from the --help texts."""
    out = subprocess.run([moefit, "--help"], capture_output=True, text=True, cwd=cwd, env=env)
    texts = [("moefit --help", out.stdout + out.stderr)]
    commands = re.findall(r"^  ([a-z]+)\s{2,}", out.stdout, re.M)
    if not commands:
        raise SystemExit("check_docs: `moefit --help` lists no commands")
    for c in commands:
        r = subprocess.run([moefit, c, "--help"], capture_output=True, text=True, cwd=cwd, env=env)
        if r.returncode != 0:
            raise SystemExit(f"check_docs: `moefit {c} --help` exited {r.returncode}")
        texts.append((f"moefit {c} --help", r.stdout + r.stderr))
    examples = []
    for name, text in texts:
        lines = text.split("\n")
        k = 0
        while k < len(lines):
            if not re.match(r"^examples?\b.*:\s*$", lines[k], re.I):
                k += 1
                continue
            k += 1
            block = []
            while k < len(lines) and lines[k].startswith("  "):
                block.append(lines[k])
                k += 1
            if not block:
                raise SystemExit(f"check_docs: `{name}`: an example heading with no indented example under it")
            examples.append(Example(name, logical_lines(block)))
    return examples


def normalise(line, vary_all):
    line = DURATION.sub("#", line)
    line = VARY_UNIT.sub("#", line)
    for r in VARY_FIELDS:
        line = r.sub("#", line)
    if vary_all:
        line = ANY_NUM.sub("#", line)
    return " ".join(line.split())


def compare(expect, actual, vary_all):
    """None when the shown lines are the real output's first lines (see the
    module's help), else what differs."""
    exp = [normalise(l, vary_all) for l in expect]
    act = [normalise(l, vary_all) for l in actual if not PROGRESS_TICK.match(l)]

    def line_ok(e, a):
        if e.endswith("...") and e != "...":
            return a.startswith(e[:-3].rstrip())
        return e == a

    def match(ei, ai):
        """Does exp[ei:] match act[ai:] (the rest of act being free)?"""
        if ei == len(exp):
            return True
        if exp[ei] == "...":
            return any(match(ei + 1, k) for k in range(ai, len(act) + 1))
        return ai < len(act) and line_ok(exp[ei], act[ai]) and match(ei + 1, ai + 1)

    if match(0, 0):
        return None
    # Where it goes wrong: the longest prefix of the shown lines that matches.
    best = 0
    for n in range(len(exp), 0, -1):
        saved = exp[n:]
        del exp[n:]
        ok = match(0, 0)
        exp.extend(saved)
        if ok:
            best = n
            break
    want = exp[best][:-3].rstrip() if exp[best].endswith("...") else exp[best]
    common = [(len(os.path.commonprefix([want, x])), k) for k, x in enumerate(act)]
    near = [k for n, k in sorted(common, key=lambda c: (-c[0], c[1]))[:2] if n >= min(12, len(want))]
    also = "".join(f"; output line {k + 1} is {actual[k].strip()!r}" for k in sorted(near))
    return f"shown line {best + 1} ({expect[best].strip()!r}) is not in the output where the lines before it put it{also}"


CASES = []  # (name, seconds, None | "skipped: why" | "failed: output") for the XML report


def write_xml(path):
    """The cases as a JUnit XML file (Bazel's test.xml when XML_OUTPUT_FILE is set)."""
    from xml.sax.saxutils import escape, quoteattr
    fails = sum(1 for c in CASES if c[2] and c[2].startswith("failed"))
    skips = sum(1 for c in CASES if c[2] and c[2].startswith("skipped"))
    out = [f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuites tests="{len(CASES)}" failures="{fails}">',
           f'<testsuite name="docs" tests="{len(CASES)}" failures="{fails}" skipped="{skips}">']
    for name, secs, res in CASES:
        attrs = f'name={quoteattr(name)} classname="docs" time="{secs:.2f}"'
        if res is None:
            out.append(f"<testcase {attrs}/>")
        elif res.startswith("skipped"):
            out.append(f'<testcase {attrs} result="skipped"><skipped message={quoteattr(res[9:])}/></testcase>')
        else:
            out.append(f"<testcase {attrs}><failure>{escape(res[8:])}</failure></testcase>")
    out.append("</testsuite>\n</testsuites>\n")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out))


def fail(name, dt, msg, lines):
    print(f"  FAIL  {name}\n        {msg}")
    for line in lines:
        print(f"        | {line}")
    CASES.append((name, dt, "failed: " + msg + "\n" + "\n".join(lines)))


def run_example(ex, cwd, env, verbose, demo_output):
    """Runs one example and compares its output; False on a failure."""
    kept = []
    for c in ex.cmds:
        why = skip_reason(c)
        if why:
            print(f"  skip  {ex.place}: {c[:90]}  ({why})")
            CASES.append((f"{ex.place}: {c[:120]}", 0.0, f"skipped: {why}"))
        else:
            kept.append(c)
    runnable = [c for c in kept if not re.match(r"^[A-Z_]+=\S*$", c)]
    if not runnable:
        if ex.expect:
            print(f"  skip  {ex.expect_place}: the output of a skipped command")
            CASES.append((f"{ex.expect_place}: output", 0.0, "skipped: the output of a skipped command"))
        return True
    shown = " ; ".join(c.split("\n")[0] for c in kept)
    name = f"{ex.place}: {shown[:120]}"
    t = time.time()
    if len(kept) == 1 and re.match(DEMO, kept[0]):
        if demo_output is None:
            fail(name, 0.0, "./tools/demo with --no-demo", [])
            return False
        rc, output = 0, demo_output
    else:
        script = ("set -e\n" if ex.status == 0 else "") + "\n".join(kept) + "\n"
        r = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S)
        rc, output = r.returncode, r.stdout
    dt = time.time() - t
    lines = output.rstrip("\n").split("\n") if output.strip() else []
    if rc != ex.status:
        fail(name, dt, f"exit status {rc} (expected {ex.status}) after {dt:.1f} s; output:", lines[-25:])
        return False
    if ex.expect is not None:
        why = compare(ex.expect, lines, ex.vary)
        if why:
            fail(name, dt, f"{ex.expect_place}: the output shown is not what it prints: {why}; "
                 f"its first {len(ex.expect) + 8} lines:", lines[:len(ex.expect) + 8])
            return False
    what = "ok, output as shown" if ex.expect is not None else "ok"
    print(f"  {what:<4}  {name[:110]}  ({dt:.1f} s)")
    CASES.append((name, dt, None))
    if verbose:
        print(output)
    return True


def command_env(scratch):
    env = dict(os.environ)
    bindir = os.path.join(scratch, ".bin")
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.setdefault("MF_THREADS", "2")
    # mpirun as CI runs it: as root it wants both variables; more ranks than
    # cores; shared memory without cross-memory attach (containers); a short
    # TMPDIR and backing directory of its own (concurrent tests collide in /tmp).
    if os.geteuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    mpitmp = tempfile.mkdtemp(prefix="mfdoc.", dir="/tmp")
    env.update({"TMPDIR": mpitmp, "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_pml": "ob1",
                "OMPI_MCA_btl": "self,vader", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
                "OMPI_MCA_btl_vader_backing_directory": mpitmp,
                "OMPI_MCA_mca_base_component_disable_dlclose": "1"})
    lsan = env.get("LSAN_OPTIONS")
    if lsan:
        def absolute(m):
            p = m.group(1)
            return "suppressions=" + (os.path.abspath(p) if os.path.exists(p) else p)
        env["LSAN_OPTIONS"] = re.sub(r"suppressions=([^:]+)", absolute, lsan) + ":fast_unwind_on_malloc=0"
    return env, mpitmp


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moefit", required=True)
    ap.add_argument("--repo", required=True, help="the repository root (its configs/ are copied)")
    ap.add_argument("--readme", help="default REPO/README.md")
    ap.add_argument("--docs", help="a folder of *.md pages; default REPO/docs")
    ap.add_argument("--only", help="check this one page (after the demo)")
    ap.add_argument("--list", action="store_true", help="list the examples, run nothing")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--no-demo", action="store_true", help="leave out the demo's data and training")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()

    readme = a.readme or os.path.join(a.repo, "README.md")
    docs = a.docs or os.path.join(a.repo, "docs")
    pages = [(readme, "README.md")]
    if os.path.isdir(docs):
        pages += [(os.path.join(docs, f), "docs/" + f) for f in sorted(os.listdir(docs)) if f.endswith(".md")]
    if a.only:
        pages = [p for p in pages if p[1] == a.only or os.path.abspath(p[0]) == os.path.abspath(a.only)]
        if not pages:
            raise SystemExit(f"check_docs: --only {a.only}: no such page")

    moefit = os.path.abspath(a.moefit)
    scratch = tempfile.mkdtemp(prefix="moefit-docs-")
    os.makedirs(os.path.join(scratch, ".bin"))
    os.symlink(moefit, os.path.join(scratch, ".bin", "moefit"))
    if os.path.isdir(os.path.join(a.repo, "configs")):
        shutil.copytree(os.path.join(a.repo, "configs"), os.path.join(scratch, "configs"),
                        ignore=shutil.ignore_patterns("BUILD"))
    env, mpitmp = command_env(scratch)

    problems, skipped, examples = [], [], []
    for path, label in pages:
        examples += examples_of(parse_blocks(path, label, problems), problems, skipped)
    if not a.only:
        examples += help_examples(moefit, scratch, env)

    if a.list:
        for ex in examples:
            print(ex.place + ("" if ex.expect is None else f"   (output shown at {ex.expect_place})"))
            for c in ex.cmds:
                why = skip_reason(c)
                print(f"    {c}" + (f"    [skip: {why}]" if why else ""))
        for place, why in skipped:
            print(f"{place}\n    [skip: {why}]")
        for p in problems:
            print(f"{p}    [FAIL]")
        return 1 if problems else 0

    ok = True
    for p in problems:
        print(f"  FAIL  {p}")
        CASES.append((p, 0.0, "failed: " + p))
        ok = False
    for place, why in skipped:
        print(f"  skip  {place}: {why}")
        CASES.append((place, 0.0, f"skipped: {why}"))

    demo_output = None
    if not a.no_demo:
        fortunes = "/usr/share/games/fortunes"
        setup = (f"moefit data bytes {fortunes}/computers {fortunes}/science {fortunes}/wisdom {fortunes}/fortunes "
                 "runs/demo/data/train.tokens --split-on % --valid-fraction 0.05 --valid-out runs/demo/data/valid.tokens\n"
                 "moefit train configs/demo.yaml\n")
        t = time.time()
        r = subprocess.run(["bash", "-c", "set -e\n" + setup], cwd=scratch, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S)
        name = "setup: what ./tools/demo runs after its build"
        if r.returncode != 0:
            fail(name, time.time() - t, f"exit status {r.returncode}", r.stdout.rstrip().split("\n")[-25:])
            ok = False
        else:
            print(f"  ok    {name}  ({time.time() - t:.1f} s)")
            CASES.append((name, time.time() - t, None))
            demo_output = r.stdout
            if a.verbose:
                print(r.stdout)

    if demo_output is not None or a.no_demo:
        for ex in examples:
            ok = run_example(ex, scratch, env, a.verbose, demo_output) and ok
    if a.keep:
        print(f"scratch directory: {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(mpitmp, ignore_errors=True)
    fails = sum(1 for c in CASES if c[2] and c[2].startswith("failed"))
    skips = sum(1 for c in CASES if c[2] and c[2].startswith("skipped"))
    print(f"check_docs: {len(CASES) - fails - skips} passed, {fails} failed, {skips} skipped "
          f"({len(examples)} examples in {len(pages)} pages{'' if a.only else ' and the --help texts'})")
    if os.environ.get("XML_OUTPUT_FILE"):
        write_xml(os.environ["XML_OUTPUT_FILE"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
