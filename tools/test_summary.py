#!/usr/bin/env python3
"""Counts the test cases of one test run and prints the closing line
  tests: N passed, N failed, N skipped

usage:
  test_summary.py --bep BEP_JSON [--bazel-exit RC] [--rows] TARGET...
      BEP_JSON: the file `bazel test --build_event_json_file=BEP_JSON` wrote;
      TARGET: every label that run asked for (//pkg:name).
  test_summary.py --runs [--rows] < LINES
      LINES: "NAME EXIT_STATUS XML SECONDS" per binary run by hand
      (tools/gpu_check.sh --prebuilt); XML may be "-" (none written).

What counts (the verdict is the exit status; test.xml only details it):
- Only what this run reports: each target's bazel status and the test.xml its
  build event names. A target the run has no result for (not built, not run)
  counts as one failed case; a test.xml older than the run (left in
  bazel-testlogs by another run or another --config, which share it) is not
  read, unless bazel says the result came from its cache.
- A target whose status is not PASSED (or a binary whose exit status is not 0)
  is failed even where its test.xml shows no failed case: one failed case is
  added for it (LeakSanitizer reports at exit; rank 1 of an MPI test writes no
  XML; a crash at teardown).
- GoogleTest cases that were skipped (GTEST_SKIP, e.g. GPU tests without a GPU)
  or not run (status="notrun": DISABLED_ tests) count as skipped.
- A passing target without a readable test.xml, or with no case in it, counts
  as one failed case.
- A non-zero --bazel-exit with no failure counted adds one failed case.

--rows prints "NAME|P passed, F failed, S skipped[; why]|SECONDS" per target
and "TOTAL|P|F|S" instead of the closing line (tools/gpu_check.sh's table).
Exit status: 1 when anything failed, else 0.
"""
import json
import os
import sys
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET


def count_xml(path):
    """(passed, failed, skipped) over the <testcase> elements of one test.xml."""
    root = ET.parse(path).getroot()
    passed = failed = skipped = 0
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif (case.get("status") == "notrun" or case.get("result") in ("skipped", "suppressed")
              or case.find("skipped") is not None):
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


class Result:
    """One target (or binary): its verdict and the XML files of its runs."""

    def __init__(self, name, ok, status, xmls, seconds, log=None):
        self.name = name
        self.ok = ok            # bazel said PASSED / the exit status was 0
        self.status = status    # "PASSED", "FAILED", "exit 1", "no result in this run"...
        self.xmls = xmls        # [(path or None, why not read or None)]
        self.seconds = seconds
        self.log = log

    def count(self):
        """(passed, failed, skipped, why): why is None where nothing is amiss."""
        p = f = s = 0
        why = []
        for path, bad in self.xmls:
            if bad is None:
                try:
                    cp, cf, cs = count_xml(path)
                    if cp + cf + cs == 0:
                        raise ValueError("no test cases")
                    p, f, s = p + cp, f + cf, s + cs
                    continue
                except (OSError, ET.ParseError, ValueError) as e:
                    bad = "%s: %s" % (path, e)
            why.append(bad)
        if not self.xmls:
            why.append("no test.xml")
        if not self.ok:
            why.insert(0, self.status)
        elif not why:
            return p, f, s, ("%d failed case(s) in test.xml" % f) if f else None
        if f == 0:
            # Failed outside its cases (at exit, on another rank, before any
            # XML), or passed by its status with nothing to show for it.
            if not self.ok and p + s > 0:
                why.append("no case failed in its test.xml: it failed outside them (at exit? another rank?)")
            f = 1
        return p, f, s, "; ".join(why)


def uri_path(uri):
    if uri.startswith("file://"):
        return urllib.request.url2pathname(urllib.parse.urlparse(uri).path)
    return uri


def from_bep(bep_path, targets):
    """A Result per target from the build event protocol's JSON file."""
    start = None
    summary = {}  # label -> overall status
    attempts = {}  # label -> {(run, shard): (attempt, status, xml uri, cached, seconds, log)}
    with open(bep_path) as f:
        for line in f:
            if not line.strip():
                continue
            ev = json.loads(line)
            eid = ev.get("id", {})
            if "started" in eid:
                start = int(ev.get("started", {}).get("startTimeMillis", 0)) / 1000.0
            elif "testSummary" in eid:
                summary[eid["testSummary"]["label"]] = ev.get("testSummary", {}).get("overallStatus", "NO_STATUS")
            elif "testResult" in eid:
                tid, tr = eid["testResult"], ev.get("testResult", {})
                outs = {o.get("name"): o.get("uri", "") for o in tr.get("testActionOutput", [])}
                key = (tid.get("run", 1), tid.get("shard", 1))
                att = tid.get("attempt", 1)
                cur = attempts.setdefault(tid["label"], {})
                if key not in cur or cur[key][0] < att:
                    cached = bool(tr.get("cachedLocally")) or tr.get("executionInfo", {}).get("cachedRemotely", False)
                    cur[key] = (att, tr.get("status", "NO_STATUS"), outs.get("test.xml"), cached,
                                int(tr.get("testAttemptDurationMillis", 0)) / 1000.0, outs.get("test.log"))
    results = []
    for label in targets:
        status = summary.get(label)
        runs = attempts.get(label, {})
        if status is None and not runs:
            results.append(Result(label, False, "no result in this run (not built or not run)", [], 0))
            continue
        status = status or "NO_STATUS"
        ok = status == "PASSED" and all(r[1] == "PASSED" for r in runs.values())
        xmls = []
        log = None
        for key in sorted(runs):
            _, st, uri, cached, _, log_uri = runs[key]
            log = uri_path(log_uri) if log_uri else log
            if not uri:
                xmls.append((None, "no test.xml (status %s)" % st))
                continue
            path = uri_path(uri)
            try:
                if not cached and start is not None and os.path.getmtime(path) < start - 1.0:
                    xmls.append((None, "%s is older than this run: not counted" % path))
                    continue
            except OSError:
                pass  # count() reports the missing file
            xmls.append((path, None))
        seconds = sum(r[4] for r in runs.values())
        results.append(Result(label, ok, status, xmls, seconds, log))
    return results


def from_runs(lines):
    """A Result per "NAME EXIT XML SECONDS" line (binaries run by hand)."""
    results = []
    for line in lines:
        if not line.strip():
            continue
        name, rc, xml, sec = line.split()
        ok = rc == "0"
        status = "exit %s" % rc if rc.lstrip("-").isdigit() else rc
        xmls = [] if xml == "-" else [(xml, None)]
        results.append(Result(name, ok, status, xmls, sec))
    return results


def main(argv):
    rows = "--rows" in argv
    argv = [a for a in argv if a != "--rows"]
    bazel_exit = 0
    if "--bazel-exit" in argv:
        i = argv.index("--bazel-exit")
        bazel_exit = int(argv[i + 1])
        del argv[i:i + 2]
    if argv[:1] == ["--runs"] and len(argv) == 1:
        results = from_runs(sys.stdin)
    elif argv[:1] == ["--bep"] and len(argv) >= 2:
        results = from_bep(argv[1], argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    tot = [0, 0, 0]
    for r in results:
        p, f, s, why = r.count()
        tot[0], tot[1], tot[2] = tot[0] + p, tot[1] + f, tot[2] + s
        if why:
            print("failed: %s: %s%s" % (r.name, why, " (log: %s)" % r.log if r.log else ""), file=sys.stderr)
        if rows:
            sec = r.seconds if isinstance(r.seconds, str) else "%d" % r.seconds
            print("%s|%d passed, %d failed, %d skipped%s|%s" % (
                r.name, p, f, s, "" if r.ok else "; " + r.status, sec))
    if bazel_exit != 0 and tot[1] == 0:
        print("failed: bazel test exited with %d although no target failed" % bazel_exit, file=sys.stderr)
        tot[1] += 1
    if rows:
        print("TOTAL|%d|%d|%d" % tuple(tot))
    else:
        print("tests: %d passed, %d failed, %d skipped" % tuple(tot))
    return 1 if tot[1] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
