#!/usr/bin/env bash
# GPU check: runs every gpu-tagged test on a machine with an NVIDIA GPU, with
# MF_REQUIRE_GPU=1 so that a test which cannot see the GPU fails instead of
# skipping; then the demo on cuda in bf16 (train.precision auto) and in fp32
# beside the cpu backend's fp32 run (60 steps, losses within 2%), plan
# invariance on cuda in bf16 (resident vs MegaTrain-like, and vs the planner
# at 25% of the resident arena: the same final weights, bit for bit), staged
# vs straight copies (the same bits), `moefit bench kernels` on the 644M shape,
# and moefit in bf16 and fp32 beside transformers on the 644M shape of
# configs/bench-644m.yaml (tools/peer_bench.py; tokens/s and the ratios);
# prints one summary table at the end. Under 10 minutes.
#
# usage:
#   tools/gpu_check.sh [BAZEL_FLAGS...]   build (bazel build //...) and run the gpu
#                                         tests through bazel (needs bazel + toolkit)
#   tools/gpu_check.sh --pack DIR         build the gpu test binaries here and copy
#                                         them to DIR (no GPU needed; needs bazel +
#                                         toolkit): for a GPU machine without bazel
#   tools/gpu_check.sh --prebuilt DIR     run the binaries packed in DIR (needs the
#                                         driver and the toolkit's cuBLAS libraries,
#                                         CUDA_HOME or /usr/local/cuda; the CUDA
#                                         runtime is static)
#
# The lent device machines (H100/H200) have nvcc and the
# driver but no bazel and no network, so the usual route there is: `--pack
# .gpu_bin` here (.gpu_bin and .gpu_bin.tgz ignored by git), carry
# .gpu_bin.tgz and runs/demo/data, and run `tar xzf .gpu_bin.tgz &&
# tools/gpu_check.sh --prebuilt .gpu_bin` on the machine.
#
# Exit status: 0 only when a GPU was found, bazel test exited 0 (or, with
# --prebuilt, every binary exited 0), every gpu test case passed (none failed,
# none skipped) and the cuda runs below agree.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# BAZEL may name another bazel command line, e.g. BAZEL="bazel --output_base=/tmp/ob".
read -ra BZ <<<"${BAZEL:-bazel}"

t_start=$(date +%s)
declare -a rows=()  # "step|result|seconds" for the table

now() { date +%s; }
row() { rows+=("$1|$2|$3"); }

print_table() {
  echo
  echo "================ moefit gpu check ================"
  printf '%-44s %-46s %6s\n' "step" "result" "sec"
  for r in "${rows[@]}"; do
    IFS='|' read -r a b c <<<"$r"
    printf '%-44s %-46s %6s\n' "$a" "$b" "$c"
  done
  printf '%-44s %-46s %6s\n' "total" "$1" "$(($(now) - t_start))"
}

# Per-binary rows and the verdict: tools/test_summary.py, which fails a binary
# (or a bazel target) whose exit status (bazel status) is not a pass even where
# its test.xml shows every case passed (a crash at teardown).
#   count_cases --runs          stdin: "NAME EXIT_STATUS XML SECONDS" lines
#   count_cases --bep FILE TARGET...
# prints "NAME|counts|SECONDS" rows, then "TOTAL|P|F|S".
count_cases() {
  python3 tools/test_summary.py --rows "$@"
}

# The gpu-tagged tests, and cudnn_load_test (it runs in CI too; on a GPU it
# also makes cuDNN's handle).
gpu_targets() {
  "${BZ[@]}" query --noshow_progress \
    "(attr(tags, 'gpu', tests(//...)) except attr(tags, 'manual', tests(//...))) + //tests/cuda:cudnn_load_test" 2>/dev/null
}

# ------------------------------------------------------------------ --pack
if [[ "${1:-}" == "--pack" ]]; then
  dir=${2:?usage: tools/gpu_check.sh --pack DIR}
  shift 2
  # what the build needs, CUTLASS's headers included (the cutlass expert GEMM)
  ./tools/setup || exit 1
  targets=$(gpu_targets) || { echo "gpu_check: bazel query failed" >&2; exit 1; }
  # shellcheck disable=SC2086
  "${BZ[@]}" build "$@" $targets || exit 1
  bin=$("${BZ[@]}" info "$@" bazel-bin 2>/dev/null)
  mkdir -p "$dir"
  for t in $targets; do
    pkg=${t#//}; pkg=${pkg%%:*}; name=${t##*:}
    cp -f "$bin/$pkg/$name" "$dir/${pkg//\//_}_$name"
  done
  "${BZ[@]}" build "$@" //:moefit //:moefit_test || exit 1
  cp -f "$bin/moefit" "$dir/moefit"
  cp -f "$bin/moefit_test" "$dir/moefit_test" # the test build: the kill test's MF_TEST_CKPT_PAUSE_MS
  # The device machines lack libyaml and libjansson, and maybe Open MPI's
  # libraries (moefit links libmpi for mpirun; a single process never starts
  # MPI): they travel beside the binaries (--prebuilt puts DIR on
  # LD_LIBRARY_PATH).
  for lib in $(ldd "$dir/moefit" | awk '/libyaml|libjansson|libmpi|libopen-rte|libopen-pal|libhwloc|libevent|libudev/ {print $3}'); do
    cp -fL "$lib" "$dir/"
  done
  ls -l "$dir"
  # The binaries are about 63 MiB (each test holds the kernels' fatbins), over
  # what a device call carries beside the demo data (64 MiB): DIR.tgz is about
  # a third of that. There: tar xzf DIR.tgz, then --prebuilt DIR.
  tar czf "$dir.tgz" -C "$(dirname "$dir")" "$(basename "$dir")" || exit 1
  ls -l "$dir.tgz"
  exit 0
fi

# -------------------------------------------------------------- the GPU
t=$(now)
if ! command -v nvidia-smi >/dev/null || ! gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1); then
  row "nvidia-smi" "NO GPU" "$(($(now) - t))"
  print_table "FAIL (no GPU)"
  exit 1
fi
row "nvidia-smi" "$(echo "$gpu" | head -1 | cut -c1-34)" "$(($(now) - t))"

export MF_REQUIRE_GPU=1
passed=0
failed=0
skipped=0
bazel_rc=0

# ---------------------------------------------------------- --prebuilt
if [[ "${1:-}" == "--prebuilt" ]]; then
  dir=${2:?usage: tools/gpu_check.sh --prebuilt DIR}
  # The binaries find cuBLAS through bazel's solib links, which are not packed:
  # the machine's toolkit has the same sonames.
  export LD_LIBRARY_PATH="$(cd "$dir" && pwd):${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  logs=$(mktemp -d /tmp/mf_gpu_check.XXXXXX)
  list=""
  for b in "$dir"/*; do
    [[ -x "$b" && -f "$b" ]] || continue
    n=$(basename "$b")
    [[ "$n" == moefit ]] && continue # the CLI, run below
    [[ "$n" == *.so* ]] && continue  # the libraries carried beside them
    t=$(now)
    timeout 300 "$b" --gtest_output="xml:$logs/$n.xml" >"$logs/$n.log" 2>&1
    rc=$?
    [[ $rc -ne 0 ]] && tail -n 40 "$logs/$n.log"
    xml="$logs/$n.xml"
    [[ -f "$xml" ]] || xml=-
    list+="$n $rc $xml $(($(now) - t))"$'\n'
  done
  [[ -n "$list" ]] || { row "prebuilt binaries" "none in $dir" 0; print_table "FAIL"; exit 1; }
  counted=$(printf '%s' "$list" | count_cases --runs)
else
  # ------------------------------------------------------- build, test
  t=$(now)
  if ! "${BZ[@]}" build "$@" //... >/tmp/mf_gpu_check_build.log 2>&1; then
    tail -n 40 /tmp/mf_gpu_check_build.log
    row "bazel build //..." "FAILED" "$(($(now) - t))"
    print_table "FAIL (build)"
    exit 1
  fi
  row "bazel build //..." "ok" "$(($(now) - t))"
  targets=$(gpu_targets) || { echo "gpu_check: bazel query failed" >&2; exit 1; }
  t=$(now)
  # Tests run outside the sandbox (strategy local) so /dev/nvidia* is visible;
  # no caching, so a pass is always a run on this machine. The build events
  # give each target's status and the test.xml of this run.
  bep=$(mktemp /tmp/mf_gpu_check_bep.XXXXXX)
  # shellcheck disable=SC2086
  "${BZ[@]}" test "$@" --strategy=TestRunner=local --nocache_test_results --test_env=MF_REQUIRE_GPU=1 \
    --test_env=CUDA_VISIBLE_DEVICES --test_env=NVIDIA_VISIBLE_DEVICES --test_output=errors \
    --build_event_json_file="$bep" $targets
  bazel_rc=$?
  row "bazel test (gpu-tagged)" "exit $bazel_rc" "$(($(now) - t))"
  # shellcheck disable=SC2086
  counted=$(count_cases --bep "$bep" --bazel-exit "$bazel_rc" $targets)
  rm -f "$bep"
fi

while IFS= read -r line; do
  if [[ "$line" == TOTAL\|* ]]; then
    IFS='|' read -r _ p f s <<<"$line"
    passed=$p
    failed=$f
    skipped=$s
    row "gpu test cases" "$p passed, $f failed, $s skipped" ""
  else
    IFS='|' read -r a b c <<<"$line"
    row "  $a" "$b" "$c"
  fi
done <<<"$counted"

# ------------------------------------------------- the demo and plans on cuda
# The moefit binary: bazel-bin's, or the one --pack put in DIR.
moefit=""
if [[ "${1:-}" == "--prebuilt" ]]; then
  [[ -x "$dir/moefit" ]] && moefit="$dir/moefit"
else
  moefit="$("${BZ[@]}" info "$@" bazel-bin 2>/dev/null)/moefit"
fi
cuda_ok=1
# One training run: NAME, then config overrides; its final loss on stdout.
train_run() {
  local name=$1
  shift
  local out=/tmp/mf_gpu_check_runs/$name
  rm -rf "$out"
  if ! timeout 600 "$moefit" train configs/demo.yaml train.steps=60 train.eval_every=0 "output.dir=$out" "$@" \
      >"$out.log" 2>&1; then
    tail -n 20 "$out.log" >&2
    return 1
  fi
  grep -o 'loss [0-9.]* -> [0-9.]*' "$out.log" | tail -1 | awk '{print $4}'
}
mkdir -p /tmp/mf_gpu_check_runs
if [[ ! -f runs/demo/data/train.tokens || ! -f runs/demo/data/valid.tokens ]]; then
  # tools/demo writes them (from the fortune package's files); on a machine
  # without them, bring runs/demo/data along.
  row "demo on cuda" "no runs/demo/data (run tools/demo once)" ""
  cuda_ok=0
elif [[ -x "$moefit" ]]; then
  # The demo on cuda beside the cpu backend: 60 steps each; the losses agree
  # within 2% (different GEMM reduction orders, so not bit for bit).
  # The device budget covers what the cuda backend keeps beside the arena
  # (cuBLASLt workspace, scratch, the CUDA context as budgeted,
  # kernels/registry.h: at most 560 MiB; 48 MiB measured on an H100), so
  # 575 MiB leaves at least the demo's 15 MiB arena.
  t=$(now)
  l_cpu=$(train_run demo_cpu backend=cpu) || l_cpu=""
  for prec in bf16 fp32; do
    l_cuda=$(train_run "demo_cuda_$prec" backend=cuda "train.precision=$prec" memory.device_budget=575MiB hardware.profile=configs/hw/h100-pcie.yaml) || l_cuda=""
    if [[ -n "$l_cpu" && -n "$l_cuda" ]] &&
        python3 -c "import sys; a,b=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b) <= 0.02*a else 1)" "$l_cpu" "$l_cuda"; then
      row "demo on cuda $prec (60 steps)" "loss $l_cuda (cpu fp32 $l_cpu)" "$(($(now) - t))"
    else
      row "demo on cuda $prec (60 steps)" "FAILED (cuda '$l_cuda', cpu '$l_cpu')" "$(($(now) - t))"
      cuda_ok=0
    fi
    t=$(now)
  done
  # Plan invariance on cuda: everything resident (the optimizer on the
  # device) and MegaTrain-like (streamed weights, recompute, host optimizer)
  # give the same final weights, bit for bit.
  t=$(now)
  if train_run inv_resident backend=cuda memory.plan=resident memory.device_budget=600MiB hardware.profile=configs/hw/h100-pcie.yaml >/dev/null &&
      train_run inv_megatrain backend=cuda memory.plan=megatrain memory.device_budget=600MiB hardware.profile=configs/hw/h100-pcie.yaml >/dev/null &&
      cmp -s /tmp/mf_gpu_check_runs/inv_resident/final/model.safetensors \
        /tmp/mf_gpu_check_runs/inv_megatrain/final/model.safetensors; then
    row "plan invariance on cuda (bf16)" "resident == megatrain (bits)" "$(($(now) - t))"
  else
    row "plan invariance on cuda (bf16)" "FAILED" "$(($(now) - t))"
    cuda_ok=0
  fi
  # The planner's own plan at 25% of the resident plan's arena (its device
  # budget: that quarter plus what the backend keeps beside the arena, the
  # plan's device_backend_bytes: 48 MiB on an H100 in 2026-11, where the 560
  # MiB first assumed here left the resident plan fitting).
  t=$(now)
  arena=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['arena_bytes'])" \
          /tmp/mf_gpu_check_runs/inv_resident/plan.json 2>/dev/null || echo 0)
  budget=$(python3 -c "import json,sys; p=json.load(open(sys.argv[1])); print(p['arena_bytes'] // 4 + p['device_backend_bytes'])" \
          /tmp/mf_gpu_check_runs/inv_resident/plan.json 2>/dev/null || echo 0)
  if [[ "$arena" -gt 0 ]] &&
      train_run inv_quarter backend=cuda memory.plan=auto "memory.device_budget=$budget" hardware.profile=configs/hw/h100-pcie.yaml >/dev/null &&
      cmp -s /tmp/mf_gpu_check_runs/inv_resident/final/model.safetensors \
        /tmp/mf_gpu_check_runs/inv_quarter/final/model.safetensors &&
      cmp -s <(python3 -c "import json,sys; [print(json.loads(l).get('loss')) for l in open(sys.argv[1])]" /tmp/mf_gpu_check_runs/inv_resident/metrics.jsonl) \
        <(python3 -c "import json,sys; [print(json.loads(l).get('loss')) for l in open(sys.argv[1])]" /tmp/mf_gpu_check_runs/inv_quarter/metrics.jsonl); then
    row "plan invariance on cuda (bf16)" "resident == planner at 25% arena (bits)" "$(($(now) - t))"
  else
    row "plan invariance on cuda (bf16)" "FAILED at 25% of arena $arena" "$(($(now) - t))"
    cuda_ok=0
  fi
  # The copies through the pinned staging arena (memory.staging: auto is on
  # for cuda) against straight copies from pageable memory: the same bits, and
  # the staged run's host seconds per step in its metrics.
  t=$(now)
  if train_run stg_off backend=cuda memory.plan=megatrain memory.staging=false memory.device_budget=600MiB hardware.profile=configs/hw/h100-pcie.yaml >/dev/null &&
      cmp -s /tmp/mf_gpu_check_runs/inv_megatrain/final/model.safetensors \
        /tmp/mf_gpu_check_runs/stg_off/final/model.safetensors; then
    st=$(python3 -c "import json,sys; l=[json.loads(x) for x in open(sys.argv[1])][-1]; print('in %.2gs out %.2gs per step' % (l['staging_fill_s'], l['staging_drain_s']))" \
         /tmp/mf_gpu_check_runs/inv_megatrain/metrics.jsonl 2>/dev/null || echo "?")
    row "staged == straight copies on cuda" "bits equal; staging $st" "$(($(now) - t))"
  else
    row "staged == straight copies on cuda" "FAILED" "$(($(now) - t))"
    cuda_ok=0
  fi
else
  row "demo on cuda" "no moefit binary" ""
  cuda_ok=0
fi
# moefit beside its peer on one shape (configs/bench-644m.yaml, 644M
# parameters, 4 x 1024 tokens a step): moefit everything resident on cuda, then
# transformers (tools/peer_bench.py: bf16, sdpa, fused AdamW, random weights)
# on the config.json that run wrote; each one's tokens/s and moefit/peer. A
# measurement: moefit failing to train fails the check, the ratio does not; no
# torch here only leaves the peer's figure out.
peer_step() {
  local out=/tmp/mf_gpu_check_runs/bench644 t mf peer
  t=$(now)
  rm -rf "$out"
  if [[ ! -x "$moefit" || ! -f runs/demo/data/train.tokens ]]; then
    row "644M shape: moefit vs transformers" "no moefit binary or no runs/demo/data" ""
    return 1
  fi
  # This GPU's profile with the 644M step's kernel calls (bf16), so the
  # runs below compare the planner's prediction with a measured profile.
  local prof=/tmp/mf_gpu_check_runs/hw-cuda.yaml pov="hardware.profile=configs/hw/h100-pcie.yaml"
  t=$(now)
  if timeout 300 "$moefit" profile --backend cuda --quick --config configs/bench-644m.yaml --out "$prof" \
      >"$out.profile.log" 2>&1; then
    pov="hardware.profile=$prof"
    row "profile on cuda (--quick, 644M calls)" "written; $(grep -c . "$prof") lines" "$(($(now) - t))"
    tail -n 30 "$out.profile.log"
  else
    tail -n 10 "$out.profile.log" >&2
    row "profile on cuda (--quick, 644M calls)" "FAILED (see $out.profile.log)" "$(($(now) - t))"
  fi
  # fp32 first (the figure bf16 is measured against), then bf16 (auto on cuda).
  local prec mf32=""
  for prec in fp32 bf16; do
    t=$(now)
    rm -rf "$out"
    if ! timeout 600 "$moefit" train configs/bench-644m.yaml "output.dir=$out" "train.precision=$prec" "$pov" >"$out.log" 2>&1; then
      tail -n 20 "$out.log" >&2
      row "644M shape: moefit $prec resident" "FAILED (see $out.log)" "$(($(now) - t))"
      return 1
    fi
    mf=$(python3 -c "import json,sys; l=[json.loads(x) for x in open(sys.argv[1])]; print('%.0f' % l[-1]['tokens_per_s'])"        "$out/metrics.jsonl" 2>/dev/null || echo "")
    pe=$(grep -o 'predicted [0-9.e+-]* s/step, executed [0-9.e+-]* s/step ([0-9.]*' "$out.log" | tail -1 | sed 's/.*(//')
    if [[ "$prec" == fp32 ]]; then
      mf32=$mf
      row "644M shape: moefit fp32 resident" "${mf:-?} tokens/s; predicted/executed ${pe:-?}" "$(($(now) - t))"
    else
      row "644M shape: moefit bf16 resident" "${mf:-?} tokens/s; bf16/fp32 $(python3 -c "import sys; print('%.2f' % (float(sys.argv[1]) / float(sys.argv[2])))" "${mf:-0}" "${mf32:-1}"); pred/exec ${pe:-?}" "$(($(now) - t))"
    fi
  done
  # Each kernel of that step beside a dense bf16 GEMM and a device copy.
  t=$(now)
  if timeout 300 "$moefit" bench kernels configs/bench-644m.yaml --reps 3 >"$out.bench.log" 2>&1; then
    row "bench kernels (644M, bf16)" "$(grep '^kernels:' "$out.bench.log" | tail -1 | cut -c1-46)" "$(($(now) - t))"
    cat "$out.bench.log"
  else
    tail -n 5 "$out.bench.log" >&2
    row "bench kernels (644M, bf16)" "FAILED (see $out.bench.log)" "$(($(now) - t))"
  fi
  t=$(now)
  if ! timeout 600 python3 tools/peer_bench.py "$out/final" --seq-len 1024 --micro-batch 4 --json "$out.peer.json"       >"$out.peer.log" 2>&1; then
    tail -n 5 "$out.peer.log" >&2
    row "644M shape: transformers bf16 (peer)" "not run (see $out.peer.log)" "$(($(now) - t))"
    return 0
  fi
  peer=$(python3 -c "import json,sys; print('%.0f' % json.load(open(sys.argv[1]))['tokens_per_s'])" "$out.peer.json")
  row "644M shape: transformers bf16 (peer)" "$peer tokens/s; moefit/peer $(python3 -c "import sys; print('%.3f' % (float(sys.argv[1]) / float(sys.argv[2])))" "${mf:-0}" "$peer")" "$(($(now) - t))"
  return 0
}
peer_step || cuda_ok=0

if [[ "$bazel_rc" -ne 0 || "$passed" -eq 0 || "$failed" -ne 0 || "$skipped" -ne 0 || "$cuda_ok" -ne 1 ]]; then
  print_table "FAIL"
  exit 1
fi
print_table "PASS"
exit 0
