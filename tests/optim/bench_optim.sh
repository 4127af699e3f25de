#!/usr/bin/env bash
# A short `moefit bench optim` (small sizes, few repeats): checks that it runs,
# prints the bf16-moments summary and ends with the one summary line. The
# figures are printed, not judged.
# Full run: bazel run //:moefit -- bench optim
set -euo pipefail
bin="$1"
shift
out="$("$bin" bench optim "$@")"
printf '%s\n' "$out"
last="$(printf '%s\n' "$out" | tail -n 1)"
if ! printf '%s\n' "$out" | grep -Eq '^optim bf16 moments: [0-9.]+ GB/s, triad [0-9.]+ GB/s, ratio [0-9.]+$'; then
  echo "bench_optim: no bf16-moments summary line" >&2
  exit 1
fi
if ! [[ "$last" =~ ^optim:\ [0-9.]+\ GB/s,\ triad\ [0-9.]+\ GB/s,\ ratio\ [0-9.]+$ ]]; then
  echo "bench_optim: unexpected last line: $last" >&2
  exit 1
fi
