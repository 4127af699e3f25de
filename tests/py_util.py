"""What the Python tests share: the test.xml they write for Bazel, so that their
cases count one by one (skipped ones as skipped) in tools/test's closing line,
and the python with transformers that tools/prepare_data.py needs."""
import os
import subprocess
import sys
from xml.sax.saxutils import quoteattr


def hf_python():
    """A python that imports transformers, jinja2 and numpy: $MF_HF_PYTHON (tools/test
    passes it) or this one; None without."""
    for py in (os.environ.get("MF_HF_PYTHON"), sys.executable):
        if py and subprocess.run([py, "-c", "import transformers, jinja2, numpy"],
                                 capture_output=True).returncode == 0:
            return py
    return None


def tools_required():
    """True under MF_TEST_REQUIRE=1 (CI; tools/test passes it): a check whose
    outside tool (a python with transformers, torch, peft) is missing fails
    instead of being skipped."""
    return os.environ.get("MF_TEST_REQUIRE") == "1"


def write_xml(suite, cases):
    """cases: (name, result, message) with result "passed", "failed" or "skipped";
    written to $XML_OUTPUT_FILE (nothing outside Bazel)."""
    path = os.environ.get("XML_OUTPUT_FILE")
    if not path:
        return
    fails = sum(r == "failed" for _, r, _ in cases)
    skips = sum(r == "skipped" for _, r, _ in cases)
    lines = ['<?xml version="1.0" encoding="UTF-8"?>',
             f'<testsuites tests="{len(cases)}" failures="{fails}" skipped="{skips}">',
             f'<testsuite name="{suite}" tests="{len(cases)}" failures="{fails}" skipped="{skips}">']
    for name, result, msg in cases:
        body = {"failed": f"<failure message={quoteattr(msg)}/>",
                "skipped": f"<skipped message={quoteattr(msg)}/>"}.get(result, "")
        status, res = ("notrun", "skipped") if result == "skipped" else ("run", "completed")
        lines.append(f'<testcase name={quoteattr(name)} classname="{suite}" status="{status}" '
                     f'result="{res}">{body}</testcase>')
    lines += ["</testsuite>", "</testsuites>"]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
