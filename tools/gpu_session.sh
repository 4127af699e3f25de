#!/usr/bin/env bash
# One lent-GPU call, most important first, inside a deadline: the checks of
# tools/gpu_check.sh --prebuilt reordered so that a call cut short still
# brings back the figures that matter most, and every log comes back in one
# archive (a device call returns at most 8 files).
#
# usage (on the device machine, after `tar xzf .gpu_bin.tgz`):
#   tools/gpu_session.sh DIR [SECONDS [STEPS]]
#     DIR from tools/gpu_check.sh --pack; SECONDS the deadline (default 540);
#     STEPS a comma list of tests,bf16,peer,bench,demo,ranks,fp32,inv,ga8,profile,ncu
#     (default all but ncu). GPU_TESTS="NAME ..." runs only those test binaries (their
#     names in DIR less the tests_cuda_ prefix). The 644M runs log the host's
#     submitting time by kernel kind (MF_LOG=debug for exec) into their logs.
# Logs: $OUT/gpu_session.tgz (or /tmp/mf_gpu_session.tgz) and the table in
# $OUT/summary.txt. Steps, in order:
#   1. every gpu test binary (in parallel: they check correctness, not speed),
#      with the cpu backend's 60-step demo beside them
#   2. the 644M shape (configs/bench-644m.yaml) in bf16, everything resident:
#      tokens/s and predicted/executed
#   3. transformers on the same shape (tools/peer_bench.py): the ratio
#   4. moefit bench kernels on the 644M shape
#   5. the demo on cuda in bf16 beside the cpu's fp32 loss (within 2%); (ranks)
#      two ranks sharing the GPU (mpirun -np 2, where the machine has mpirun)
#      against one rank with grad_accum 2: the final weights byte-identical
#   6. the 644M shape in fp32 (bf16/fp32 ratio)
#   7. plan invariance on cuda: resident vs the planner at 25% of its arena
#   8. the 644M shape at 25% of its resident arena, 8 micro-batches a step
#   9. moefit profile --backend cuda --quick, then step 2 again with it
#  10. (ncu) Nsight Compute on the tensor-core kernels of `bench kernels`
#      (expert GEMM, attention): their hardware counters into ncu.txt
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
dir=$(cd "${1:?usage: tools/gpu_session.sh DIR [SECONDS [STEPS]]}" && pwd) || exit 1
deadline=$(($(date +%s) + ${2:-540}))
steps=",${3:-tests,bf16,peer,bench,demo,ranks,fp32,inv,ga8,profile},"
want() { [[ "$steps" == *",$1,"* ]]; }
out=${OUT:-/tmp}
logs=/tmp/mf_gpu_session
rm -rf "$logs" && mkdir -p "$logs"
export LD_LIBRARY_PATH="$dir:${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MF_REQUIRE_GPU=1
moefit=$dir/moefit
t0=$(date +%s)
rows=()
row() { rows+=("$(printf '%-40s %-62s %5s' "$1" "$2" "$3")"); printf '%-40s %-62s %5s\n' "$1" "$2" "$3"; }
left() { echo $((deadline - $(date +%s))); }
# cap SECONDS: SECONDS, or what is left before the deadline less a margin
cap() { local l=$(($(left) - 15)); ((l < $1)) && echo $((l > 1 ? l : 1)) || echo "$1"; }
finish() {
  {
    echo "================ moefit gpu session ================"
    printf '%s\n' "${rows[@]}"
    echo "total $(($(date +%s) - t0)) s"
  } | tee "$out/summary.txt"
  tar czf "$out/gpu_session.tgz" -C /tmp mf_gpu_session 2>/dev/null
}
trap finish EXIT

# tokens/s: the median of the progress windows after step 1's
tok_s() { python3 -c "import json,sys,statistics; l=[json.loads(x) for x in open(sys.argv[1]) if 'tokens_per_s' in x]; l=[x['tokens_per_s'] for x in l if x['step'] > 1] or [l[-1]['tokens_per_s']]; print('%.0f' % statistics.median(l))" "$1" 2>/dev/null; }
pred_exec() { grep -o 'predicted [0-9.e+-]* s/step, executed [0-9.e+-]* s/step ([0-9.]*' "$1" | tail -1; }
# A quarter of a plan's arena plus what the backend keeps beside it.
quarter_budget() { python3 -c "import json,sys; p=json.load(open(sys.argv[1])); print(p['arena_bytes'] // 4 + p['device_backend_bytes'])" "$1" 2>/dev/null || echo 0; }
final_loss() { grep -o 'loss [0-9.]* -> [0-9.]*' "$1" | tail -1 | awk '{print $4}'; }

# The 644M shape: NAME SECONDS OVERRIDES...; its output dir is removed after
# (a run's final weights and checkpoint are ~10 GB) but for config.json.
run644() {
  local name=$1 secs=$2 t=$(date +%s)
  shift 2
  local o=$logs/$name
  MF_LOG=debug MF_LOG_SUBSYS=exec timeout "$(cap "$secs")" "$moefit" train configs/bench-644m.yaml "output.dir=/tmp/mf_run_$name" "$@" >"$o.log" 2>&1
  local rc=$?
  cp -f "/tmp/mf_run_$name/metrics.jsonl" "$o.metrics.jsonl" 2>/dev/null
  cp -f "/tmp/mf_run_$name/plan.json" "$o.plan.json" 2>/dev/null
  mkdir -p "/tmp/mf_cfg_$name" && cp -f "/tmp/mf_run_$name/final/config.json" "/tmp/mf_cfg_$name/" 2>/dev/null
  rm -rf "/tmp/mf_run_$name"
  if [[ $rc -ne 0 ]]; then
    row "644M $name" "FAILED rc=$rc: $(tail -n 1 "$o.log" | cut -c1-50)" $(($(date +%s) - t))
    return 1
  fi
  row "644M $name" "$(tok_s "$o.metrics.jsonl") tok/s; $(pred_exec "$o.log" | sed 's/predicted/pred/; s/executed/exec/')" $(($(date +%s) - t))
  row "  host submit" "$(grep 'step submitted' "$o.log" | tail -1 | sed 's/.*step submitted in //' | cut -c1-62)" ""
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader >"$logs/nvidia-smi.txt" 2>&1
row "gpu" "$(head -1 "$logs/nvidia-smi.txt" | cut -c1-62)" 0

# 1. gpu tests, all at once; the cpu demo beside them.
cpu_pid=""
if want demo; then
  ( timeout 120 "$moefit" train configs/demo.yaml train.steps=60 train.eval_every=0 backend=cpu output.dir=/tmp/mf_demo_cpu >"$logs/demo_cpu.log" 2>&1 ) &
  cpu_pid=$!
fi
if want tests; then
  t=$(date +%s)
  pids=()
  for b in "$dir"/*; do
    n=$(basename "$b")
    [[ -x "$b" && -f "$b" && "$n" != moefit && "$n" != *.so* ]] || continue
    if [[ -n "${GPU_TESTS:-}" && " $GPU_TESTS " != *" ${n#tests_cuda_} "* ]]; then continue; fi
    ( timeout "$(cap 150)" "$b" --gtest_output="xml:$logs/$n.xml" >"$logs/$n.log" 2>&1; echo $? >"$logs/$n.rc" ) &
    pids+=($!)
  done
  wait "${pids[@]}"
  list=""
  for rcf in "$logs"/*.rc; do
    n=$(basename "$rcf" .rc)
    x="$logs/$n.xml"; [[ -f "$x" ]] || x=-
    list+="$n $(cat "$rcf") $x 0"$'\n'
  done
  counted=$(printf '%s' "$list" | python3 tools/test_summary.py --rows --runs 2>&1)
  while IFS='|' read -r a b c d; do
    if [[ "$a" == TOTAL ]]; then
      row "gpu test cases" "$b passed, $c failed, $d skipped" $(($(date +%s) - t))
    elif [[ "$a" != failed:* ]]; then
      row "  ${a#tests_}" "$b" ""
    fi
  done <<<"$counted"
  echo "$counted" >"$logs/tests_counted.txt"
fi

# 2-4. the 644M shape in bf16 beside transformers, then its kernels.
want bf16 && run644 bf16 150 train.precision=bf16
if want peer && [[ -f /tmp/mf_cfg_bf16/config.json ]]; then
  t=$(date +%s)
  PYTHONUNBUFFERED=1 timeout "$(cap 150)" python3 tools/peer_bench.py /tmp/mf_cfg_bf16 --seq-len 1024 --micro-batch 4 \
    --json "$logs/peer.json" >"$logs/peer.log" 2>&1
  peer=$(python3 -c "import json,sys; print('%.0f' % json.load(open(sys.argv[1]))['tokens_per_s'])" "$logs/peer.json" 2>/dev/null)
  mf=$(tok_s "$logs/bf16.metrics.jsonl")
  row "644M transformers bf16 (peer)" "${peer:-FAILED} tok/s; moefit/peer $(python3 -c "import sys; print('%.3f' % (float(sys.argv[1]) / float(sys.argv[2])))" "${mf:-0}" "${peer:-0}" 2>/dev/null)" $(($(date +%s) - t))
fi
if want bench; then
  t=$(date +%s)
  timeout "$(cap 120)" "$moefit" bench kernels configs/bench-644m.yaml --reps 3 >"$logs/bench.log" 2>&1
  row "bench kernels 644M" "rc=$? $(grep '^kernels:' "$logs/bench.log" | tail -1 | cut -c1-50)" $(($(date +%s) - t))
fi

# 5. the demo on cuda in bf16 beside the cpu's fp32.
if want demo; then
  wait "$cpu_pid"
  l_cpu=$(final_loss "$logs/demo_cpu.log")
  t=$(date +%s)
  timeout "$(cap 90)" "$moefit" train configs/demo.yaml train.steps=60 train.eval_every=0 backend=cuda train.precision=bf16 \
    memory.device_budget=575MiB hardware.profile=configs/hw/h100-pcie.yaml output.dir=/tmp/mf_demo_bf16 >"$logs/demo_bf16.log" 2>&1
  l_bf=$(final_loss "$logs/demo_bf16.log")
  ok=$(python3 -c "import sys; a,b=map(float,sys.argv[1:]); print('within 2%' if abs(a-b) <= 0.02*a else 'OFF BY MORE THAN 2%')" "$l_cpu" "$l_bf" 2>/dev/null)
  row "demo cuda bf16 vs cpu fp32 (60 steps)" "${l_bf:-FAILED} vs ${l_cpu:-?}: ${ok:-?}" $(($(date +%s) - t))
fi

# 5b. Two ranks on the one GPU: their gradients meet in host memory in rank
# order, so the weights are those of one rank with two micro-batches.
if want ranks; then
  t=$(date +%s)
  if command -v mpirun >/dev/null; then
    common=(configs/demo.yaml train.steps=20 train.warmup=2 train.eval_every=0 data.valid=null backend=cuda
      train.precision=bf16 train.micro_batch=4 memory.device_budget=575MiB hardware.profile=configs/hw/h100-pcie.yaml)
    timeout "$(cap 60)" "$moefit" train "${common[@]}" train.grad_accum=2 output.dir=/tmp/mf_rank1 >"$logs/ranks1.log" 2>&1
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout "$(cap 90)" mpirun -np 2 --oversubscribe \
      -x LD_LIBRARY_PATH -x MF_REQUIRE_GPU "$moefit" train "${common[@]}" train.grad_accum=1 output.dir=/tmp/mf_rank2 \
      >"$logs/ranks2.log" 2>&1
    same=$(cmp -s /tmp/mf_rank1/final/model.safetensors /tmp/mf_rank2/final/model.safetensors && echo identical || echo DIFFER)
    row "2 ranks on 1 GPU vs 1 rank, grad_accum 2" "final weights $same ($(tok_s /tmp/mf_rank2/metrics.jsonl) vs $(tok_s /tmp/mf_rank1/metrics.jsonl) tok/s)" $(($(date +%s) - t))
  else
    row "2 ranks on 1 GPU" "skipped: no mpirun on this machine" 0
  fi
fi

# 6. fp32 on the 644M shape.
if want fp32; then
  run644 fp32 120 train.precision=fp32
  row "644M bf16/fp32" "$(python3 -c "import sys; print('%.2f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$(tok_s "$logs/bf16.metrics.jsonl")" "$(tok_s "$logs/fp32.metrics.jsonl")" 2>/dev/null)" ""
fi

# 7. plan invariance on cuda (bf16): resident vs the planner at 25% of its arena.
if want inv; then
  t=$(date +%s)
  common=(train.steps=60 train.eval_every=0 backend=cuda hardware.profile=configs/hw/h100-pcie.yaml)
  timeout "$(cap 60)" "$moefit" train configs/demo.yaml "${common[@]}" memory.plan=resident memory.device_budget=600MiB \
    output.dir=/tmp/mf_inv_res >"$logs/inv_res.log" 2>&1
  # 25% of the resident arena plus what the backend keeps beside it (the
  # plan's device_backend_bytes: 48 MiB on an H100, not the 560 MiB first
  # assumed, with which this "25%" plan was the resident one again).
  budget=$(quarter_budget /tmp/mf_inv_res/plan.json)
  timeout "$(cap 60)" "$moefit" train configs/demo.yaml "${common[@]}" memory.plan=auto "memory.device_budget=$budget" \
    output.dir=/tmp/mf_inv_q >"$logs/inv_q.log" 2>&1
  timeout "$(cap 60)" "$moefit" train configs/demo.yaml "${common[@]}" memory.plan=megatrain memory.device_budget=600MiB \
    output.dir=/tmp/mf_inv_mt >"$logs/inv_mt.log" 2>&1
  q_arena=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['arena_bytes'])" /tmp/mf_inv_q/plan.json 2>/dev/null || echo 0)
  losses() { grep -o '^step *[0-9]*/[0-9]* *loss [0-9.]*' "$1"; }
  for other in q mt; do
    if cmp -s /tmp/mf_inv_res/final/model.safetensors /tmp/mf_inv_$other/final/model.safetensors &&
        cmp -s <(losses "$logs/inv_res.log") <(losses "$logs/inv_$other.log"); then
      row "plan invariance cuda bf16 ($other)" "== resident: weights (bits) and losses; arena $q_arena" $(($(date +%s) - t))
    else
      row "plan invariance cuda bf16 ($other)" "DIFFER or FAILED (arena $q_arena)" $(($(date +%s) - t))
    fi
  done
fi

# 8. 25% of the resident arena, 8 micro-batches a step (against resident with
#    the same 8 micro-batches).
if want ga8; then
  run644 ga8_resident 100 train.precision=bf16 train.grad_accum=8 train.steps=6 train.log_every=2
  run644 ga8_quarter 120 train.precision=bf16 train.grad_accum=8 train.steps=6 train.log_every=2 memory.plan=auto \
    "memory.device_budget=$(quarter_budget "$logs/ga8_resident.plan.json")"
  row "644M 25%/resident (ga 8)" "$(python3 -c "import sys; print('%.2f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$(tok_s "$logs/ga8_quarter.metrics.jsonl")" "$(tok_s "$logs/ga8_resident.metrics.jsonl")" 2>/dev/null)" ""
fi

# 9. this GPU's profile, then the bf16 step predicted with it.
if want profile; then
  t=$(date +%s)
  if timeout "$(cap 120)" "$moefit" profile --backend cuda --quick --config configs/bench-644m.yaml --out "$logs/hw-cuda.yaml" >"$logs/profile.log" 2>&1; then
    row "profile --backend cuda --quick" "written" $(($(date +%s) - t))
    run644 bf16_measured 100 train.precision=bf16 "hardware.profile=$logs/hw-cuda.yaml"
  else
    row "profile --backend cuda --quick" "FAILED rc=$?" $(($(date +%s) - t))
  fi
fi

# 10. Nsight Compute on the tensor-core kernels (where the next speed is): the
#     first launches of each under `bench kernels`, their details as text.
if want ncu; then
  t=$(date +%s)
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [[ -n "$ncu_bin" ]]; then
    timeout "$(cap 200)" "$ncu_bin" --kernel-name 'regex:expert_(rows|wgt)_mma|attn_(fwd|dkdv|dq)_mma' --launch-count 8 \
      --set detailed --clock-control none -o "$logs/ncu" "$moefit" bench kernels configs/bench-644m.yaml --reps 1 \
      >"$logs/ncu_run.log" 2>&1
    "$ncu_bin" --import "$logs/ncu.ncu-rep" --page details >"$logs/ncu.txt" 2>&1
    row "ncu (tensor-core kernels)" "$(grep -c 'Duration' "$logs/ncu.txt") kernels profiled; ncu.txt" $(($(date +%s) - t))
  else
    row "ncu (tensor-core kernels)" "no ncu on this machine" 0
  fi
fi
