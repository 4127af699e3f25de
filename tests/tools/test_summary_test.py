"""tools/test_summary.py on small fake runs: the build event protocol's JSON
(what `bazel test --build_event_json_file` writes) and test.xml files.

Each case checks the closing line (its exact format: CI parses it) and the exit
status: a target bazel failed is failed whatever its test.xml says; DISABLED_
cases are skipped; a test.xml this run did not write is not counted.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest


def script():
    srcdir, ws = os.environ.get("TEST_SRCDIR"), os.environ.get("TEST_WORKSPACE")
    if srcdir and ws:
        return os.path.join(srcdir, ws, "tools", "test_summary.py")
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "test_summary.py")


def case(name, kind="pass"):
    body = {"pass": "", "fail": '<failure message="x"/>', "skip": "<skipped/>"}.get(kind, "")
    status = "notrun" if kind == "notrun" else "run"
    result = {"notrun": "suppressed", "skip": "skipped"}.get(kind, "completed")
    return '<testcase name="%s" status="%s" result="%s" classname="T">%s</testcase>' % (name, status, result, body)


class Run:
    """A fake invocation: a BEP file and test.xml files under a testlogs dir."""

    def __init__(self, tmp, start=None):
        self.tmp = tmp
        self.logs = os.path.join(tmp, "testlogs")
        self.events = [{"id": {"started": {}},
                        "started": {"startTimeMillis": str(int((start or time.time()) * 1000))}}]

    def xml(self, label, cases, mtime=None, shard=None):
        pkg, name = label[2:].split(":")
        d = os.path.join(self.logs, pkg, name, *([shard] if shard else []))
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "test.xml")
        with open(path, "w") as f:
            f.write('<?xml version="1.0"?>\n<testsuites><testsuite name="T">%s</testsuite></testsuites>\n'
                    % "".join(cases))
        if mtime is not None:
            os.utime(path, (mtime, mtime))
        return path

    def result(self, label, status, xml_path=None, overall=None, shard=1, attempt=1, cached=False):
        outs = [{"name": "test.log", "uri": "file://" + os.path.join(self.logs, "x.log")}]
        if xml_path:
            outs.append({"name": "test.xml", "uri": "file://" + xml_path})
        tr = {"testActionOutput": outs, "status": status, "testAttemptDurationMillis": "1500"}
        if cached:
            tr["cachedLocally"] = True
        self.events.append({"id": {"testResult": {"label": label, "run": 1, "shard": shard, "attempt": attempt}},
                            "testResult": tr})
        if overall is not False:
            ts = {"totalRunCount": 1}
            if (overall or status) != "NO_STATUS":  # proto3 JSON leaves the default out
                ts["overallStatus"] = overall or status
            self.events.append({"id": {"testSummary": {"label": label}}, "testSummary": ts})

    def summarize(self, targets, *extra):
        bep = os.path.join(self.tmp, "bep.json")
        with open(bep, "w") as f:
            for e in self.events:
                f.write(json.dumps(e) + "\n")
        p = subprocess.run([sys.executable, script(), "--bep", bep] + list(extra) + targets,
                           capture_output=True, text=True)
        return p.returncode, p.stdout, p.stderr


CLOSING = re.compile(r"^tests: (\d+) passed, (\d+) failed, (\d+) skipped$")


def closing(out):
    lines = out.strip().splitlines()
    m = CLOSING.match(lines[-1])
    assert m, "no closing line in %r" % out
    return tuple(int(x) for x in m.groups())


class SummaryTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_all_passed(self):
        r = Run(self.tmp)
        r.result("//a:t1", "PASSED", r.xml("//a:t1", [case("A"), case("B"), case("C", "skip")]))
        r.result("//b/c:t2", "PASSED", r.xml("//b/c:t2", [case("D")]))
        rc, out, err = r.summarize(["//a:t1", "//b/c:t2"])
        self.assertEqual(closing(out), (3, 0, 1), err)
        self.assertEqual(rc, 0)
        self.assertEqual(err, "")

    def test_failed_case(self):
        r = Run(self.tmp)
        r.result("//a:t1", "FAILED", r.xml("//a:t1", [case("A"), case("B", "fail")]))
        rc, out, err = r.summarize(["//a:t1"])
        self.assertEqual(closing(out), (1, 1, 0))
        self.assertEqual(rc, 1)

    def test_target_failed_with_passing_xml_is_failed(self):
        # LeakSanitizer at exit, rank 1 of an MPI test: every case in the XML passed.
        r = Run(self.tmp)
        r.result("//a:leaky", "FAILED", r.xml("//a:leaky", [case("A"), case("B")]))
        r.result("//a:ok", "PASSED", r.xml("//a:ok", [case("C")]))
        rc, out, err = r.summarize(["//a:leaky", "//a:ok"])
        self.assertEqual(closing(out), (3, 1, 0))
        self.assertEqual(rc, 1)
        self.assertIn("//a:leaky: FAILED", err)

    def test_timeout_and_flaky_are_failed(self):
        r = Run(self.tmp)
        r.result("//a:slow", "TIMEOUT", r.xml("//a:slow", [case("A")]))
        # Failed once, passed on the retry: bazel says FLAKY; the last attempt's XML is read.
        r.result("//a:flaky", "FAILED", r.xml("//a:flaky", [case("B", "fail")], shard="attempt_1"),
                 overall=False)
        r.result("//a:flaky", "PASSED", r.xml("//a:flaky", [case("B")]), attempt=2, overall="FLAKY")
        rc, out, err = r.summarize(["//a:slow", "//a:flaky"])
        self.assertEqual(closing(out), (2, 2, 0))
        self.assertEqual(rc, 1)

    def test_notrun_is_skipped(self):
        r = Run(self.tmp)
        r.result("//a:t", "PASSED", r.xml("//a:t", [case("A"), case("DISABLED_Throughput", "notrun")]))
        rc, out, err = r.summarize(["//a:t"])
        self.assertEqual(closing(out), (1, 0, 1))
        self.assertEqual(rc, 0)

    def test_target_without_result_is_failed_and_old_xml_not_read(self):
        # //a:gone did not build in this run; an earlier run (or the other
        # --config, sharing bazel-testlogs) left a passing test.xml for it.
        r = Run(self.tmp)
        r.xml("//a:gone", [case("A"), case("B"), case("C")])
        r.result("//a:ok", "PASSED", r.xml("//a:ok", [case("D")]))
        rc, out, err = r.summarize(["//a:gone", "//a:ok"])
        self.assertEqual(closing(out), (1, 1, 0))
        self.assertEqual(rc, 1)
        self.assertIn("//a:gone: no result in this run", err)

    def test_xml_older_than_the_run_is_not_counted(self):
        now = time.time()
        r = Run(self.tmp, start=now)
        stale = r.xml("//a:stale", [case("A"), case("B")], mtime=now - 3600)
        r.result("//a:stale", "PASSED", stale)
        rc, out, err = r.summarize(["//a:stale"])
        self.assertEqual(closing(out), (0, 1, 0))
        self.assertIn("older than this run", err)
        # The same file as a cached result of this run (bazel did not rerun
        # the test, its outputs are the cached ones): counted.
        r = Run(self.tmp, start=now)
        r.result("//a:stale", "PASSED", stale, cached=True)
        rc, out, err = r.summarize(["//a:stale"])
        self.assertEqual(closing(out), (2, 0, 0), err)
        self.assertEqual(rc, 0)

    def test_passing_target_without_xml_is_failed(self):
        r = Run(self.tmp)
        r.result("//a:noxml", "PASSED", None)
        r.result("//a:empty", "PASSED", r.xml("//a:empty", []))
        rc, out, err = r.summarize(["//a:noxml", "//a:empty"])
        self.assertEqual(closing(out), (0, 2, 0))

    def test_shards_are_summed(self):
        r = Run(self.tmp)
        r.result("//a:sh", "PASSED", r.xml("//a:sh", [case("A")], shard="shard_1_of_2"), shard=1,
                 overall=False)
        r.result("//a:sh", "PASSED", r.xml("//a:sh", [case("B"), case("C")], shard="shard_2_of_2"), shard=2)
        rc, out, err = r.summarize(["//a:sh"])
        self.assertEqual(closing(out), (3, 0, 0), err)

    def test_bazel_exit_without_a_failed_target_is_failed(self):
        r = Run(self.tmp)
        r.result("//a:t", "PASSED", r.xml("//a:t", [case("A")]))
        rc, out, err = r.summarize(["//a:t"], "--bazel-exit", "1")
        self.assertEqual(closing(out), (1, 1, 0))
        self.assertEqual(rc, 1)

    def test_runs_by_hand(self):
        # tools/gpu_check.sh --prebuilt: the binary's exit status decides.
        r = Run(self.tmp)
        ok = r.xml("//g:ok", [case("A"), case("B")])
        crash = r.xml("//g:crash", [case("C")])
        lines = "ok 0 %s 3\ncrash 134 %s 4\nnoxml 0 - 1\n" % (ok, crash)
        p = subprocess.run([sys.executable, script(), "--runs", "--rows"], input=lines,
                           capture_output=True, text=True)
        rows = p.stdout.strip().splitlines()
        self.assertEqual(rows[0], "ok|2 passed, 0 failed, 0 skipped|3")
        self.assertEqual(rows[1], "crash|1 passed, 1 failed, 0 skipped; exit 134|4")
        self.assertEqual(rows[-1], "TOTAL|3|2|0")
        self.assertEqual(p.returncode, 1)


if __name__ == "__main__":
    unittest.main()
