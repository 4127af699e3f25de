#!/usr/bin/env python3
"""Counts GoogleTest cases from Bazel's test.xml files and prints the closing line.

usage: test_summary.py TESTLOGS_DIR TARGET...   (targets as //pkg:name)

A target without a readable test.xml (it crashed before writing one, or was not
run) counts as one failed case. Skipped GoogleTest cases (GTEST_SKIP, e.g. GPU
tests without a GPU) count as skipped.
"""
import os
import sys
import xml.etree.ElementTree as ET


def count(xml_path):
    root = ET.parse(xml_path).getroot()
    passed = failed = skipped = 0
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.get("result") == "skipped" or case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    logs = sys.argv[1]
    totals = [0, 0, 0]
    broken = []
    for target in sys.argv[2:]:
        pkg, _, name = target.lstrip("/").partition(":")
        xml = os.path.join(logs, pkg, name, "test.xml")
        try:
            p, f, s = count(xml)
            if p + f + s == 0:
                raise ValueError("no test cases")
        except (OSError, ET.ParseError, ValueError) as e:
            broken.append(f"{target}: {e}")
            p, f, s = 0, 1, 0
        totals[0] += p
        totals[1] += f
        totals[2] += s
    for b in broken:
        print(f"no test results: {b}", file=sys.stderr)
    print(f"tests: {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 1 if totals[1] else 0


if __name__ == "__main__":
    sys.exit(main())
