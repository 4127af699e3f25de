#!/usr/bin/env python3
"""tools/check_docs.py on small pages: the good ones pass, and each kind of
broken example (a stale output, an unchecked block, a failing command, a skip
without a reason, a broken docs/ page) fails naming its file and line.

usage: check_docs_test.py CHECK_DOCS_PY

A stand-in `moefit` (a shell script) prints fixed text, so this takes seconds:
what is tested is the checker, not moefit (//tests/docs:docs_test runs the real
pages with the real binary).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

CHECK = None

FAKE_MOEFIT = r"""#!/bin/sh
case "$1" in
  --help) printf 'usage: moefit <command>\n\ncommands:\n  hello     says hello\n  count     counts\n' ;;
  hello)
    if [ "$2" = --help ]; then echo "usage: moefit hello [NAME]"; exit 0; fi
    echo "hello ${2:-world}"
    echo "took 0.$$ s, $$ tok/s on 2026-12-01" >&2
    echo "bye" ;;
  count)
    if [ "$2" = --help ]; then printf 'usage: moefit count\n\nexample:\n  moefit count\n'; exit 0; fi
    echo "3 items"
    echo "loss 2.2958" ;;
  fail) echo "moefit fail: error: it failed" >&2; exit 1 ;;
  *) echo "moefit: unknown command '$1'" >&2; exit 2 ;;
esac
"""

GOOD_README = """\
    # a page

    ```sh
    moefit hello
    ```
    ```
    hello world
    took 0.25 s, 9000 tok/s on 2026-11-27
    ```

    ```console
    $ moefit count
    3 items
    $ moefit hello you
    hello you
    ...
    bye
    $ moefit fail          # exit status 1
    moefit fail: error: ...
    ```

    <!-- check_docs: skip needs a GPU -->
    ```sh
    moefit cuda-only
    ```

    ```sh
    bazel build //:moefit
    ```

    <!-- check_docs: numbers vary timings of this machine -->
    ```sh
    moefit count
    ```
    ```
    9 items
    ```
"""


def dedent(text):
    return textwrap.dedent(text)


class CheckDocs(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="check-docs-test-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.moefit = os.path.join(self.dir, "moefit")
        with open(self.moefit, "w") as f:
            f.write(FAKE_MOEFIT)
        os.chmod(self.moefit, 0o755)
        self.repo = os.path.join(self.dir, "repo")
        os.makedirs(os.path.join(self.repo, "docs"))

    def write(self, name, text):
        with open(os.path.join(self.repo, name), "w") as f:
            f.write(dedent(text))

    def check(self):
        r = subprocess.run([sys.executable, CHECK, "--moefit", self.moefit, "--repo", self.repo, "--no-demo"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        return r.returncode, r.stdout

    def expect_fail(self, readme, where, why, page=None):
        self.write("README.md", readme)
        if page:
            self.write("docs/page.md", page)
        code, out = self.check()
        self.assertEqual(code, 1, out)
        self.assertIn("FAIL  " + where, out)
        self.assertIn(why, out)

    def test_good_pages_pass(self):
        self.write("README.md", GOOD_README)
        self.write("docs/page.md", "# more\n\n```console\n$ moefit hello\nhello world\n```\n")
        code, out = self.check()
        self.assertEqual(code, 0, out)
        self.assertIn("ok, output as shown  README.md:3: moefit hello", out)
        self.assertIn("ok, output as shown  docs/page.md:4: moefit hello", out)
        self.assertIn("skip  README.md:23: block (needs a GPU)", out)
        self.assertIn("bazel build //:moefit  (the build itself", out)
        self.assertIn("ok    moefit count --help: moefit count", out)  # the --help example
        self.assertIn("0 failed", out)

    def test_a_stale_output_fails(self):
        self.expect_fail(GOOD_README.replace("    hello world\n", "    hello there\n", 1), "README.md:3:",
                         "README.md:6: the output shown is not what it prints: shown line 1 ('hello there')")

    def test_a_changed_number_fails(self):
        # A count is compared as it is; only varying fields are masked.
        self.expect_fail(GOOD_README.replace("$ moefit count\n    3 items", "$ moefit count\n    4 items"),
                         "README.md:12: moefit count", "shown line 1 ('4 items')")

    def test_a_missing_line_after_an_ellipsis_fails(self):
        self.expect_fail(GOOD_README.replace("    bye\n", "    goodbye\n"), "README.md:14: moefit hello you",
                         "shown line 3 ('goodbye')")

    def test_a_block_neither_run_nor_skipped_fails(self):
        self.expect_fail(GOOD_README + "\nSome words.\n\n```\nan orphan block\n```\n", "README.md:41:",
                         "neither run, nor the output of the block before it, nor skipped")

    def test_another_language_fails(self):
        self.expect_fail(GOOD_README + "\n```python\nprint(1)\n```\n", "README.md:39: ```python", "neither run")

    def test_a_console_block_without_commands_fails(self):
        self.expect_fail(GOOD_README + "\n```console\nhello world\n```\n", "README.md:39: ```console", "neither run")

    def test_a_failing_bash_block_fails(self):
        self.expect_fail(GOOD_README + "\n```bash\nmoefit fail\n```\n", "README.md:39: moefit fail",
                         "exit status 1 (expected 0)")

    def test_a_wrong_exit_status_fails(self):
        self.expect_fail(GOOD_README.replace("moefit fail          # exit status 1",
                                             "moefit fail          # exit status 3"),
                         "README.md:18: moefit fail", "exit status 1 (expected 3)")

    def test_a_skip_without_a_reason_fails(self):
        self.expect_fail(GOOD_README.replace("skip needs a GPU", "skip"), "README.md:23:",
                         "`check_docs: skip` needs a reason")

    def test_a_dangling_marker_fails(self):
        self.expect_fail(GOOD_README + "\n<!-- check_docs: skip a reason -->\nwords\n", "README.md:39:",
                         "a check_docs marker with text")

    def test_a_broken_docs_page_fails(self):
        self.expect_fail(GOOD_README, "docs/page.md:3: moefit frobnicate", "exit status 2 (expected 0)",
                         page="# a page\n\n```sh\nmoefit frobnicate\n```\n")


if __name__ == "__main__":
    CHECK = os.path.abspath(sys.argv.pop(1))
    # Bazel's XML_OUTPUT_FILE: unittest's own report is enough (the exit status).
    unittest.main(verbosity=2)
