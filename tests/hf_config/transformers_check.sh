#!/usr/bin/env bash
# The HF config writer's golden files (data/<family>_written.json, which
# hf_config_test holds mf_hf_config_write's bytes to) and every fixture in
# data/, checked against transformers itself: tools/make_hf_configs.py --check.
#
# Needs a python with transformers 4.57, named by MF_HF_PYTHON (tools/test
# passes it: by default ~/.cache/moefit/hfvenv/bin/python, made by .ci/run).
# Without one the case is skipped, and says so in test.xml and the log; under
# MF_TEST_REQUIRE=1 (CI) it fails.
set -uo pipefail
if [[ -n "${TEST_SRCDIR:-}" ]]; then
  root="$TEST_SRCDIR/$TEST_WORKSPACE"
else
  root="$(dirname "$0")/../.."
fi
xml=${XML_OUTPUT_FILE:-/dev/null}

report() { # result message
  local body=""
  case $1 in
    skipped) body="<skipped message=\"$2\"/>" ;;
    failed) body="<failure message=\"$2\"/>" ;;
  esac
  cat >"$xml" <<XML
<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="1"><testsuite name="HfConfig" tests="1">
<testcase name="TransformersReadsTheGoldenFiles" classname="HfConfig" status="run" result="$1">$body</testcase>
</testsuite></testsuites>
XML
}

py=${MF_HF_PYTHON:-}
if [[ -z "$py" ]]; then
  msg="no python with transformers (MF_HF_PYTHON unset; see tools/make_hf_configs.py)"
  if [[ "${MF_TEST_REQUIRE:-}" == 1 ]]; then # CI: the check must run
    echo "failed: $msg (MF_TEST_REQUIRE=1: this check must run on this machine)"
    report failed "$msg"
    exit 1
  fi
  echo "skipped: $msg"
  report skipped "skipped: $msg"
  exit 0
fi
if "$py" "$root/tools/make_hf_configs.py" --check --data "$root/tests/hf_config/data"; then
  report completed ""
  exit 0
fi
report failed "tools/make_hf_configs.py --check failed with $py (see the log)"
exit 1
