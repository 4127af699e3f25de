"""The test.xml a Python test writes for Bazel, so that its cases count one by one
(skipped ones as skipped) in tools/test's closing line."""
import os
from xml.sax.saxutils import quoteattr


def write(suite, cases):
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
