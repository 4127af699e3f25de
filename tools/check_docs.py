#!/usr/bin/env python3
"""Runs every command example of README.md and of moefit's --help texts.

usage: check_docs.py --moefit BIN --readme README.md --repo DIR [--list] [--keep]

The examples are what a newcomer copies:
  - README.md: each ```sh block, run as one shell script (a line ending in '\\'
    continues), and in other fenced blocks each line that starts with '$ moefit'
    or 'moefit ' (a command whose output the block shows);
  - README.md's ```yaml blocks: one with a `model:` section is a whole config
    (`moefit config` loads it); another is a snippet, put in place of its sections
    in configs/demo.yaml and planned (`moefit plan`: its patterns must match);
  - `moefit --help` and `moefit COMMAND --help`: the indented lines under a line
    that starts with "example", run as one shell script.
They run in order, in one scratch directory holding a copy of the repository's
configs/ (so a later example sees the files an earlier one made, as a reader's
would), with `moefit` on PATH meaning BIN, after what the README's first command
(./tools/demo) does once moefit is built: the demo's data from the `fortunes`
package and `moefit train configs/demo.yaml`. Each must exit 0.

A command is left out only for a reason this file names (SKIP): it installs or
builds (CI runs those itself), it needs a GPU, a second rank or a model that is not
here. A README example that matches nothing runnable and no skip is a failure too,
so the examples cannot drift from what moefit does.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

# (regex on the command, reason): commands left out, and why.
SKIP = [
    (r"^\./tools/demo\b", "installs and builds; what it then runs (the demo's data, training) is this check's setup"),
    (r"^\./tools/test\b", "installs and builds; it is what runs this check"),
    (r"^\./tools/setup\b", "installs Debian packages (tools/test runs it)"),
    (r"^bazel\b", "the build itself (CI builds)"),
    (r"^apt-get\b", "installs a Debian package (tools/setup installs fortunes)"),
    (r"^pip install\b", "installs PyPI packages"),
    (r"^mpirun\b", "a multi-rank run: needs mpirun's environment (//tests/cli:ranks_test runs it with 2 and 3 ranks)"),
    (r"^python3 tools/prepare_data\.py --tokenizer ~/", "needs a model's tokenizer directory"),
    (r"^\./tools/kill_test\.sh\b", "trains the demo several times over, killing and resuming it (//tests/cli:kill_test does the same)"),
    (r"^moefit bench optim\b", "a benchmark: minutes on a loaded machine (//tests/optim:bench_optim, tagged bench, runs it small)"),
]

TIMEOUT_S = 600


def logical_lines(lines):
    """Joins continuation lines ('\\' at the end) into one command each."""
    out, cur = [], ""
    for line in lines:
        if cur:
            cur += " " + line.strip()
        else:
            cur = line.strip()
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


def yaml_check(body, place):
    """A script that checks a README yaml block: a whole config with `moefit
    config`, a snippet merged into configs/demo.yaml with `moefit plan`."""
    text = "\n".join(body) + "\n"
    name = "readme-" + re.sub(r"\W", "-", place) + ".yaml"
    sections = re.findall(r"^([a-z_]+):", text, re.M)
    if "model" in sections:
        return [f"cat > {name} <<'EOF_YAML'\n{text}EOF_YAML", f"moefit config {name} > /dev/null"]
    drop = "|".join(sections)
    # configs/demo.yaml without the snippet's top-level sections, then the snippet
    awk = ("awk -v drop='^(" + drop + "):' '/^[a-z_]+:/ {skip = ($0 ~ drop)} !skip' configs/demo.yaml")
    return [f"{awk} > {name}", f"cat >> {name} <<'EOF_YAML'\n{text}EOF_YAML", f"moefit plan {name} > /dev/null"]


def readme_examples(path):
    """[(place, script)] from README.md, in order."""
    examples = []
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(2), i + 1
        j = start
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        body = lines[start:j]
        place = f"README.md:{start}"
        if lang == "sh":
            cmds = [c for c in logical_lines(body) if not c.startswith("#")]
            examples.append((place, cmds))
        elif lang == "yaml":
            examples.append((place, yaml_check(body, place)))
        elif lang == "":
            k = 0
            while k < len(body):
                line = body[k].strip()
                if line.startswith("$ moefit ") or re.match(r"^moefit [a-z]+ ", line):
                    chunk = [line[2:] if line.startswith("$ ") else line]
                    while chunk[-1].endswith("\\") and k + 1 < len(body):
                        k += 1
                        chunk.append(body[k])
                    examples.append((f"README.md:{start + k + 2 - len(chunk)}", logical_lines(chunk)))
                k += 1
        i = j + 1
    return examples


def help_examples(moefit, cwd, env):
    """[(place, script)] from the --help texts."""
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
            examples.append((name, logical_lines(block)))
    return examples


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


def run_script(place, cmds, cwd, env, verbose):
    kept = []
    for c in cmds:
        why = skip_reason(c)
        if why:
            print(f"  skip  {place}: {c[:90]}  ({why})")
            CASES.append((f"{place}: {c[:120]}", 0.0, f"skipped: {why}"))
        else:
            kept.append(c)
    if not [c for c in kept if not re.match(r"^[A-Z_]+=\S*$", c)]:
        return True
    script = "set -e\n" + "\n".join(kept) + "\n"
    t = time.time()
    r = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    dt = time.time() - t
    shown = " ; ".join(c.split("\n")[0] for c in kept)
    if r.returncode != 0:
        tail = (r.stdout + r.stderr).rstrip().split("\n")[-25:]
        print(f"  FAIL  {place}: {shown}\n        exit status {r.returncode} after {dt:.1f} s; output:")
        for line in tail:
            print(f"        | {line}")
        CASES.append((f"{place}: {shown[:120]}", dt, f"failed: exit status {r.returncode}\n" + "\n".join(tail)))
        return False
    print(f"  ok    {place}: {shown[:110]}  ({dt:.1f} s)")
    CASES.append((f"{place}: {shown[:120]}", dt, None))
    if verbose:
        print(r.stdout + r.stderr)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moefit", required=True)
    ap.add_argument("--readme", required=True)
    ap.add_argument("--repo", required=True, help="the repository root (its configs/ are copied)")
    ap.add_argument("--list", action="store_true", help="list the examples, run nothing")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()

    moefit = os.path.abspath(a.moefit)
    scratch = tempfile.mkdtemp(prefix="moefit-docs-")
    bindir = os.path.join(scratch, ".bin")
    os.makedirs(bindir)
    os.symlink(moefit, os.path.join(bindir, "moefit"))
    shutil.copytree(os.path.join(a.repo, "configs"), os.path.join(scratch, "configs"),
                    ignore=shutil.ignore_patterns("BUILD"))
    env = dict(os.environ)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.setdefault("MF_THREADS", "2")

    examples = readme_examples(a.readme) + help_examples(moefit, scratch, env)
    if not a.list:
        fortunes = "/usr/share/games/fortunes"
        setup = [f"moefit data bytes {fortunes}/computers {fortunes}/science {fortunes}/wisdom {fortunes}/fortunes "
                 "runs/demo/data/train.tokens --split-on % --valid-fraction 0.05 --valid-out runs/demo/data/valid.tokens",
                 "moefit train configs/demo.yaml"]
        if not run_script("setup (./tools/demo after its build)", setup, scratch, env, a.verbose):
            if os.environ.get("XML_OUTPUT_FILE"):
                write_xml(os.environ["XML_OUTPUT_FILE"])
            return 1
    if a.list:
        for place, cmds in examples:
            print(place)
            for c in cmds:
                why = skip_reason(c)
                print(f"    {c}" + (f"    [skip: {why}]" if why else ""))
        return 0
    ok = True
    for place, cmds in examples:
        ok = run_script(place, cmds, scratch, env, a.verbose) and ok
    if a.keep:
        print(f"scratch directory: {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    n = len(examples)
    print(f"check_docs: {n} examples, {'all passed' if ok else 'FAILURES above'}")
    if os.environ.get("XML_OUTPUT_FILE"):
        write_xml(os.environ["XML_OUTPUT_FILE"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
