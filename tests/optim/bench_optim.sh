#!/usr/bin/env bash
# A short `moefit bench optim` (small sizes, few repeats): checks that it runs
# and ends with the one summary line. The figures are printed, not judged.
# Full run: bazel run //:moefit -- bench optim
set -euo pipefail
bin="$1"
shift
out="$("$bin" bench optim "$@")"
printf '%s\n' "$out"
last="$(printf '%s\n' "$out" | tail -n 1)"
if ! [[ "$last" =~ ^optim:\ [0-9.]+\ GB/s,\ triad\ [0-9.]+\ GB/s,\ ratio\ [0-9.]+$ ]]; then
  echo "bench_optim: unexpected last line: $last" >&2
  exit 1
fi
