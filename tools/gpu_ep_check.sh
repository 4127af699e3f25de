#!/usr/bin/env bash
# Expert parallelism on GPUs (issue 32): the checks a machine with GPUs runs,
# as many as it has (nvidia-smi -L), with the binaries tools/gpu_check.sh
# --pack put in DIR (moefit and the test build moefit_test). Nothing here runs
# on the development machines (they have no GPU); the cpu backend's exactness
# is //tests/cli:expert_parallel_test.
#
# usage: tools/gpu_ep_check.sh DIR [STEPS]
#   (on the GPU machine, after `tar xzf .gpu_bin.tgz`; needs runs/demo/data,
#   carried, or the fortunes package for tools/demo's token files)
#
#   1 GPU   the expert-parallel code on one rank (MF_TEST_EP_SELF: the MoE
#           layers' rows go out and come back through an NCCL communicator of
#           one) against the same run without it: the final weights and every
#           loss must be identical (the same kernels over the same rows).
#   2, 4    mpirun -np N ... parallel.expert=N (each GPU N-th of the experts,
#           the rows over NCCL) against one rank with train.grad_accum=N on one
#           GPU: every step's loss and its largest difference, the final
#           weights' largest difference (the cuda twins sum an expert's rows in
#           one pass, not by source rank, so the bits may differ); and two
#           runs of the same mpirun: identical (deterministic run to run).
#           With 4, also 4 ranks as 2 x 2 (parallel.expert=2) against one.
#           With 2, a rank stopped (SIGSTOP) after step 3: the other gives up
#           on its NCCL wait at the deadline (MF_COMM_TIMEOUT_S=10), saying
#           so, and the job ends.
# STEPS: a comma list of 1, 2, 4 (default: every one the machine's GPUs allow).
# Writes a table to $OUT/ep_summary.txt (or /tmp) and the logs to $OUT/ep_logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
dir=$(cd "${1:?usage: tools/gpu_ep_check.sh DIR [STEPS]}" && pwd) || exit 1
out=${OUT:-/tmp}
logs=/tmp/mf_ep_check
rm -rf "$logs" && mkdir -p "$logs"
export LD_LIBRARY_PATH="$dir:${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MF_REQUIRE_GPU=1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
steps=",${2:-1,2,4},"
rows=()
row() { rows+=("$(printf '%-44s %s' "$1" "$2")"); printf '%-44s %s\n' "$1" "$2"; }
finish() {
  printf '%s\n' "${rows[@]}" | tee "$out/ep_summary.txt"
  tar czf "$out/ep_logs.tgz" -C /tmp mf_ep_check 2>/dev/null
}
trap finish EXIT
row "gpus" "$gpus ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
[[ -f runs/demo/data/train.tokens ]] || "$dir/moefit" data bytes /usr/share/games/fortunes/{computers,science,wisdom,fortunes} \
  runs/demo/data/train.tokens --split-on % >"$logs/data.log" 2>&1

# The demo on cuda in bf16, 20 steps, every one logged.
common=(configs/demo.yaml train.steps=20 train.warmup=2 train.log_every=1 train.eval_every=0 data.valid=null backend=cuda
  train.precision=bf16 train.micro_batch=4 hardware.profile=configs/hw/h100-pcie.yaml)
mpi=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -x LD_LIBRARY_PATH -x MF_REQUIRE_GPU)

# Every step's loss of two runs: "identical" or the largest difference.
losses() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
def steps(d):
    return {j["step"]: j["loss"] for j in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in j and "step" in j}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
if not a or a.keys() != b.keys():
    print("MISSING STEPS (%d vs %d)" % (len(a), len(b)))
else:
    d = max(abs(a[s] - b[s]) for s in a)
    print("identical" if d == 0 else "largest difference %.3g (step 1 %.6f vs %.6f)" % (d, a[min(a)], b[min(b)]))
EOF
}
# The final weights of two runs: "identical" or the largest difference (safetensors read by hand: bf16/f32).
weights() {
  python3 - "$1/final/model.safetensors" "$2/final/model.safetensors" <<'EOF'
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        raw = b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
        if v["dtype"] == "F32":
            out[k] = struct.unpack("<%df" % (len(raw) // 4), raw)
        elif v["dtype"] == "BF16":
            out[k] = [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
    return out, b
a, ra = load(sys.argv[1])
c, rc = load(sys.argv[2])
if ra == rc:
    print("identical")
else:
    d = max((abs(x - y) for k in a for x, y in zip(a[k], c.get(k, []))), default=float("nan"))
    print("largest difference %.3g" % d)
EOF
}

if [[ "$steps" == *",1,"* ]] && ((gpus >= 1)); then
  timeout 300 "$dir/moefit" train "${common[@]}" output.dir=/tmp/mf_ep_plain >"$logs/plain.log" 2>&1
  MF_TEST_EP_SELF=1 timeout 300 "$dir/moefit_test" train "${common[@]}" output.dir=/tmp/mf_ep_self \
    >"$logs/self.log" 2>&1
  grep -q "exchanging its experts' rows with itself by NCCL" "$logs/self.log" && how="over NCCL" || how="NOT OVER NCCL"
  row "1 GPU: ep code, one rank ($how)" "losses $(losses /tmp/mf_ep_plain /tmp/mf_ep_self); weights $(weights /tmp/mf_ep_plain /tmp/mf_ep_self)"
fi
for n in 2 4; do
  [[ "$steps" == *",$n,"* ]] || continue
  if ((gpus < n)); then
    row "$n GPUs: parallel.expert=$n" "skipped: $gpus GPU(s) here"
    continue
  fi
  command -v mpirun >/dev/null || { row "$n GPUs" "skipped: no mpirun"; continue; }
  timeout 300 "$dir/moefit" train "${common[@]}" train.grad_accum=$n output.dir=/tmp/mf_ep_one$n >"$logs/one$n.log" 2>&1
  for k in a b; do
    timeout 300 "${mpi[@]}" -np $n "$dir/moefit" train "${common[@]}" train.grad_accum=1 parallel.expert=$n \
      output.dir=/tmp/mf_ep_$n$k >"$logs/ep$n$k.log" 2>&1
  done
  row "$n GPUs vs 1 GPU, grad_accum $n" "losses $(losses /tmp/mf_ep_one$n /tmp/mf_ep_${n}a); weights $(weights /tmp/mf_ep_one$n /tmp/mf_ep_${n}a)"
  row "$n GPUs, two runs" "losses $(losses /tmp/mf_ep_${n}a /tmp/mf_ep_${n}b); weights $(weights /tmp/mf_ep_${n}a /tmp/mf_ep_${n}b)"
  row "  tokens/s" "$(grep -o '([0-9.]*K* tokens/s)' "$logs/ep${n}a.log" | tail -1) vs one GPU $(grep -o '([0-9.]*K* tokens/s)' "$logs/one$n.log" | tail -1)"
  if ((n == 2)); then # a stopped rank: the other's NCCL wait gives up at the deadline (MF_COMM_TIMEOUT_S=10)
    t0=$(date +%s)
    timeout 300 "${mpi[@]}" -x MF_COMM_TIMEOUT_S=10 -np 2 "$dir/moefit" train "${common[@]}" train.steps=100000 \
      train.grad_accum=1 parallel.expert=2 output.dir=/tmp/mf_ep_stop >"$logs/stop.log" 2>&1 &
    job=$!
    for _ in $(seq 120); do grep -q 'step \+3/' "$logs/stop.log" && break; sleep 1; done
    kill -STOP "$(pgrep -n -f 'output.dir=/tmp/mf_ep_stop')" 2>/dev/null
    wait $job
    rc=$?
    pkill -CONT -f 'output.dir=/tmp/mf_ep_stop'; pkill -KILL -f 'output.dir=/tmp/mf_ep_stop'
    said=$(grep -c 'an NCCL exchange of rows: another rank stopped or hangs' "$logs/stop.log")
    row "2 GPUs: a stopped rank" "exit $rc after $(($(date +%s) - t0)) s; the deadline's message: $said"
  fi
  if ((n == 4)); then # 2 x 2: two groups of two, data parallel between them
    timeout 300 "${mpi[@]}" -np 4 "$dir/moefit" train "${common[@]}" train.grad_accum=1 parallel.expert=2 \
      output.dir=/tmp/mf_ep_2x2 >"$logs/ep2x2.log" 2>&1
    row "4 GPUs as 2 x 2 vs 1 GPU, grad_accum 4" "losses $(losses /tmp/mf_ep_one4 /tmp/mf_ep_2x2); weights $(weights /tmp/mf_ep_one4 /tmp/mf_ep_2x2)"
  fi
done
