#!/usr/bin/env bash
# One lent-GPU call, most important first, inside a deadline: the checks of
# tools/gpu_check.sh --prebuilt reordered so that a call cut short still
# brings back the figures that matter most, and every log comes back in one
# archive (a device call returns at most 8 files).
#
# usage (on the device machine, after `tar xzf .gpu_bin.tgz`):
#   tools/gpu_session.sh DIR [SECONDS [STEPS]]
#     DIR from tools/gpu_check.sh --pack; SECONDS the deadline (default 540);
#     STEPS a comma list of tests,bf16,peer,bench,cutlass,cudnn,demo,ranks,kill,fp32,inv,ga8,profile,ncu,
#     lora,loramf,lorapeer,lorahot,loranf4 (default all but ncu and the lora ones). GPU_TESTS="NAME ..."
#     runs only those test binaries (their names in DIR less the tests_cuda_ prefix).
#     The 644M runs log the host's submitting time by kernel kind (MF_LOG=debug for
#     exec) into their logs.
# Logs: $OUT/gpu_session.tgz (or /tmp/mf_gpu_session.tgz) and the table in
# $OUT/summary.txt. Steps, in order:
#   1. every gpu test binary (in parallel: they check correctness, not speed),
#      with the cpu backend's 60-step demo beside them
#   2. the 644M shape (configs/bench-644m.yaml) in bf16, everything resident:
#      tokens/s and predicted/executed
#   3. transformers on the same shape (tools/peer_bench.py): the ratio
#   4. moefit bench kernels on the 644M shape (the expert GEMMs on mma.sync and,
#      beside them, on CUTLASS's sm90 grouped GEMM)
#   4b. (cutlass) the 644M shape in bf16 with kernels.expert_gemm=cutlass: tokens/s
#      beside step 2's and the peer's; plan invariance on cuda with it
#   4c. (cudnn) the same with kernels.attention=cudnn (attention on cuDNN's fused
#      kernels), then with both (cutlass and cudnn): tokens/s beside step 2's and
#      the peer's (and with train.adam_moments=bf16, as the peer's AdamW keeps
#      its moments); plan invariance on cuda with both. cuDNN is loaded at run
#      time: where the machine's loader does not find libcudnn.so.9, the lib
#      folder of python3's nvidia-cudnn wheel (torch's) goes on LD_LIBRARY_PATH.
#   5. the demo on cuda in bf16 beside the cpu's fp32 loss (within 2%); (ranks)
#      two ranks sharing the GPU (mpirun -np 2, where the machine has mpirun)
#      against one rank with grad_accum 2: the final weights byte-identical;
#      (kill) SIGKILL twice and resume on cuda (tools/kill_test.sh, moefit_test):
#      the final weights and losses of a run never killed
#   6. the 644M shape in fp32 (bf16/fp32 ratio)
#   7. plan invariance on cuda: resident vs the planner at 25% of its arena
#   8. the 644M shape at 25% of its resident arena, 8 micro-batches a step; then
#      layer-major at 25% with the pinned home (memory.pinned_home, issue 29 item 2)
#      and without it (every copy staged): tokens/s, exposed optimizer, final loss
#   9. moefit profile --backend cuda --quick, then step 2 again with it
#  10. (ncu) Nsight Compute on the tensor-core kernels of `bench kernels` (with the
#      cutlass expert GEMM it times beside mma.sync)
#      (expert GEMM, attention): their hardware counters into ncu.txt
#   0. (lora; run first when asked for) issue 18's acceptance: LoRA rank 16 on
#      attention and every expert over a frozen random Qwen3-30B-A3B-shaped bf16
#      base within memory.device_budget 24GiB (configs/bench-qwen3-30b-a3b-lora.yaml):
#      moefit's tokens/s, the share of the step the GPU computes, the host memory;
#      then transformers + PEFT on the same shape and tokens per step
#      (tools/peer_bench.py --lora-rank ... --offload auto --grad-ckpt on: the base
#      on the GPU if it fits, else accelerate's cpu offload) and moefit/peer (the
#      goal: >= 2). loramf / lorapeer run one half; a lorapeer call takes moefit's
#      figure from this call or an earlier one on the same machine
#      (/tmp/mf_lora_moefit.txt); lorahot runs moefit again with train.lora.experts=hot on
#      the routing the plain run measured (/tmp/mf_lora_routing.json: after loramf). Needs ~80 GiB of free host memory, a GPU of
#      >= 25 GiB, runs/demo/data carried; the peer needs peft (and accelerate) for
#      python3: where the machine lacks them, carry them in DIR/pylib
#      (pip install --no-deps --target DIR/pylib peft==0.18.1 accelerate==1.15.0),
#      which goes on PYTHONPATH. Takes minutes: run it alone
#      (tools/gpu_session.sh DIR 590 lora). moefit's random init of the base is
#      one thread (src/model/params.c, 2026-11: 16 ns a parameter on the 2-core
#      VM, ~8 min for 30.5B): while it is, moefit alone needs most of a call
#      (loramf), and the peer (~4 min: build, PEFT, 3 steps) another (lorapeer).
#      loranf4 (issue 30): moefit again with the base stored NF4 (QLoRA,
#      train.lora.base_dtype=nf4): tokens/s and host memory beside loramf's.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
dir=$(cd "${1:?usage: tools/gpu_session.sh DIR [SECONDS [STEPS]]}" && pwd) || exit 1
deadline=$(($(date +%s) + ${2:-540}))
steps=",${3:-tests,bf16,peer,bench,cutlass,cudnn,demo,ranks,kill,fp32,inv,ga8,profile},"
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

# cuDNN for kernels.attention=cudnn (dlopen'd by moefit): the loader's, else python3's wheel's (torch's).
cudnn_lib=""
if ! python3 -c "import ctypes; ctypes.CDLL('libcudnn.so.9')" 2>/dev/null; then
  cudnn_lib=$(python3 -c "import nvidia.cudnn as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null)
  [[ -n "$cudnn_lib" && -e "$cudnn_lib/libcudnn.so.9" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$cudnn_lib" || cudnn_lib=""
fi
cudnn_ver=$(python3 -c "import ctypes; print(ctypes.CDLL('libcudnn.so.9').cudnnGetVersion())" 2>/dev/null)
row "cudnn" "${cudnn_ver:-none loadable} ${cudnn_lib:+(from $cudnn_lib)}" 0

# 0. LoRA over a frozen 30B-A3B-shaped base (issue 18) beside transformers + PEFT.
lora_cfg=configs/bench-qwen3-30b-a3b-lora.yaml
# `moefit config CONFIG` (the resolved YAML, every key) flattened to "a.b.c<TAB>value" lines.
flat_config() {
  "$moefit" config "$1" | python3 -c '
import sys
stack = []
for line in sys.stdin:
    if not line.strip() or line.lstrip().startswith("#") or ":" not in line:
        continue
    ind = len(line) - len(line.lstrip(" "))
    k, _, v = line.strip().partition(":")
    while stack and stack[-1][0] >= ind:
        stack.pop()
    if v.strip():
        print(".".join([s[1] for s in stack] + [k]) + "\t" + v.strip())
    else:
        stack.append((ind, k))'
}
cfg_val() { awk -F'\t' -v k="$2" '$1 == k {print $2}' "$1"; }
# The config.json moefit writes for a qwen3_moe model.init (src/model/hf_config_write.c's keys), from
# flat_config's lines, without the 61 GB of weights `moefit init` would write: peer_bench reads only it.
hf_config_json() {
  python3 - "$1" "$2" <<'PY'
import json, os, sys
out = dict(l.rstrip("\n").split("\t", 1) for l in open(sys.argv[1]) if "\t" in l)
i = lambda k: out["model.init." + k]
n = lambda k: int(i(k))
f = lambda k: float(i(k))
b = lambda k: i(k) == "true"
if i("family") != "qwen3_moe":
    sys.exit(f"hf_config_json: family {i('family')}; only qwen3_moe is written here")
cfg = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": n("hidden"),
    "num_hidden_layers": n("layers"), "num_attention_heads": n("heads"), "num_key_value_heads": n("kv_heads"),
    "head_dim": n("head_dim"), "vocab_size": n("vocab"), "max_position_embeddings": n("max_seq"),
    "num_experts": n("experts"), "num_experts_per_tok": n("top_k"), "moe_intermediate_size": n("expert_ffn"),
    "intermediate_size": n("dense_ffn"), "rope_theta": f("rope_theta"), "rope_scaling": None,
    "rms_norm_eps": f("norm_eps"), "router_aux_loss_coef": f("router_aux_loss_coef"),
    "tie_word_embeddings": b("tie_embeddings"), "norm_topk_prob": b("norm_topk_prob"),
    "decoder_sparse_step": n("decoder_sparse_step"), "mlp_only_layers": json.loads(i("mlp_only_layers")),
    "hidden_act": "silu", "attention_dropout": 0.0, "attention_bias": False, "use_sliding_window": False,
    "torch_dtype": "bfloat16",
}
os.makedirs(sys.argv[2], exist_ok=True)
with open(os.path.join(sys.argv[2], "config.json"), "w") as fh:
    fh.write(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
PY
}
# The median share of the step the compute stream was busy (steps after the first).
busy_c() { python3 -c "import json,sys,statistics; l=[json.loads(x) for x in open(sys.argv[1]) if 'compute_busy_s' in x]; l=[x for x in l if x.get('compute_busy_s') is not None and x.get('step_s')]; r=[x for x in l if x['step'] > 1] or l; print('%.0f%%' % (100 * statistics.median(x['compute_busy_s'] / x['step_s'] for x in r)))" "$1" 2>/dev/null; }
# lora_mf SECONDS [NAME OVERRIDES...]: NAME "hot" runs train.lora.experts=hot on the routing
# the plain run measured (its routing.json, kept in /tmp/mf_lora_routing.json).
lora_mf() {
  local t o=$logs/lora_moefit secs=$1 avail gpu_mib name=${2:-} what="30B-A3B LoRA moefit 24GiB"
  shift $(($# < 2 ? $# : 2))
  [[ -n "$name" ]] && o=$logs/lora_${name}_moefit && what="30B-A3B LoRA $name moefit 24GiB"
  t=$(date +%s)
  avail=$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo)
  gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -dc 0-9)
  if [[ ! -f runs/demo/data/train.tokens ]]; then
    row "$what" "skipped: no runs/demo/data/train.tokens (carry runs/demo/data)" 0; return 1
  elif ((${avail:-0} < 80)); then
    row "$what" "skipped: ${avail:-?} GiB of host memory available, the plan needs ~75" 0; return 1
  elif ((${gpu_mib:-0} < 25 * 1024)); then
    row "$what" "skipped: the GPU has ${gpu_mib:-?} MiB, the budget is 24 GiB" 0; return 1
  fi
  rm -rf /tmp/mf_run_lora
  # (-k: a run stopped by SIGTERM writes a checkpoint first, 9.4 GiB here)
  if [[ "$name" == hot && ! -f /tmp/mf_lora_routing.json ]]; then
    row "$what" "skipped: no routing measured by the plain LoRA run (loramf first)" 0; return 1
  fi
  # --verbose: the progress lines with the stream figures ("last progress line" below)
  timeout -k 20 "$(cap "$secs")" "$moefit" train "$lora_cfg" output.dir=/tmp/mf_run_lora --verbose "$@" >"$o.log" 2>&1
  local rc=$?
  [[ -z "$name" ]] && cp -f /tmp/mf_run_lora/routing.json /tmp/mf_lora_routing.json 2>/dev/null
  cp -f /tmp/mf_run_lora/metrics.jsonl "$o.metrics.jsonl" 2>/dev/null
  cp -f /tmp/mf_run_lora/plan.json "$o.plan.json" 2>/dev/null
  rm -rf /tmp/mf_run_lora # the adapters (3.1 GiB) and a checkpoint with their AdamW state (9.4 GiB)
  local n tok busy
  n=$(grep -c tokens_per_s "$o.metrics.jsonl" 2>/dev/null)
  tok=$(tok_s "$o.metrics.jsonl")
  busy=$(busy_c "$o.metrics.jsonl")
  if [[ $rc -ne 0 && -z "$tok" ]]; then
    row "$what" "FAILED rc=$rc: $(tail -n 1 "$o.log" | cut -c1-50)" $(($(date +%s) - t))
    return 1
  fi
  [[ -n "$tok" && -z "$name" ]] && echo "$tok" >/tmp/mf_lora_moefit.txt
  row "$what" "$tok tok/s; GPU computes $busy of the step; ${n:-0} steps$([[ $rc -ne 0 ]] && echo " (rc=$rc)")" $(($(date +%s) - t))
  row "  pred/exec" "$(pred_exec "$o.log" | sed 's/predicted/pred/; s/executed/exec/')" ""
  row "  done" "$(grep -o 'done: [0-9]* steps in [0-9.]* s of training ([^)]*)' "$o.log" | tail -1 | sed 's/done: //' | cut -c1-62)" ""
  # What the run spent outside its steps: the base's random init and the plan before step 1,
  # the final adapters and checkpoint after.
  row "  wall vs training" "$(python3 -c "import json,sys; l=[json.loads(x) for x in open(sys.argv[1]) if 'elapsed_s' in x]; w=int(sys.argv[2]); print('%d s wall, %.0f s from step 1 on: %.0f s init, plan, final writes' % (w, l[-1]['elapsed_s'], w - l[-1]['elapsed_s']))" "$o.metrics.jsonl" $(($(date +%s) - t)) 2>/dev/null)" ""
  row "  host memory" "$(grep -o 'host memory: .*' "$o.log" | tail -1 | sed 's/host memory: //' | cut -c1-62)" ""
  row "  last progress line" "$(grep -o 'busy c .*' "$o.log" | tail -1 | cut -c1-62)" ""
}
lora_peer() {
  local t secs=$1 pp=${PYTHONPATH:-} miss
  t=$(date +%s)
  [[ -d "$dir/pylib" ]] && pp="$dir/pylib${pp:+:$pp}"
  if ! miss=$(PYTHONPATH=$pp python3 -c "import torch, transformers, peft, accelerate" 2>&1); then
    row "30B-A3B LoRA transformers+PEFT (peer)" "skipped: python3: $(echo "$miss" | tail -1 | sed 's/^[A-Za-z]*Error: //' | cut -c1-40) (DIR/pylib)" 0
    echo "$miss" >"$logs/lora_peer.log"
    return 1
  fi
  flat_config "$lora_cfg" >"$logs/lora_config.tsv" 2>"$logs/lora_peer.log"
  rm -rf /tmp/mf_cfg_lora
  if ! hf_config_json "$logs/lora_config.tsv" /tmp/mf_cfg_lora >>"$logs/lora_peer.log" 2>&1; then
    row "30B-A3B LoRA transformers+PEFT (peer)" "FAILED writing config.json: $(tail -n 1 "$logs/lora_peer.log" | cut -c1-30)" 0
    return 1
  fi
  cp -f /tmp/mf_cfg_lora/config.json "$logs/lora_peer.config.json"
  local c=$logs/lora_config.tsv targets
  targets=$(cfg_val "$c" train.lora.targets | tr -d '[] ')
  PYTHONPATH=$pp PYTHONUNBUFFERED=1 timeout "$(cap "$secs")" python3 tools/peer_bench.py /tmp/mf_cfg_lora \
    --seq-len "$(cfg_val "$c" data.seq_len)" --micro-batch "$(cfg_val "$c" train.micro_batch)" \
    --grad-accum "$(cfg_val "$c" train.grad_accum)" --lora-rank "$(cfg_val "$c" train.lora.rank)" \
    --lora-alpha "$(cfg_val "$c" train.lora.alpha)" --lora-targets "$targets" --offload auto --grad-ckpt on \
    --warmup 1 --steps 2 --json "$logs/lora_peer.json" >>"$logs/lora_peer.log" 2>&1
  local rc=$? peer where mf
  peer=$(python3 -c "import json,sys; print('%.0f' % json.load(open(sys.argv[1]))['tokens_per_s'])" "$logs/lora_peer.json" 2>/dev/null)
  where=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('%s, %.0fM trained, %d expert adapters' % (r['placement'], r['trainable_parameters'] / 1e6, r['lora']['expert_adapters']))" "$logs/lora_peer.json" 2>/dev/null)
  mf=$(cat /tmp/mf_lora_moefit.txt 2>/dev/null)
  if [[ -z "$peer" ]]; then
    row "30B-A3B LoRA transformers+PEFT (peer)" "FAILED rc=$rc: $(grep -v '^ ' "$logs/lora_peer.log" | tail -n 1 | cut -c1-45)" $(($(date +%s) - t))
    return 1
  fi
  row "30B-A3B LoRA transformers+PEFT (peer)" "$peer tok/s ($where)" $(($(date +%s) - t))
  row "  moefit/peer (goal >= 2)" "${mf:-?} / $peer = $(python3 -c "import sys; print('%.2f' % (float(sys.argv[1]) / float(sys.argv[2])))" "${mf:-0}" "$peer" 2>/dev/null)" ""
  row "  peer placement" "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['placement_reason'][:62])" "$logs/lora_peer.json" 2>/dev/null)" ""
}
if want lora || want loramf; then
  rm -f /tmp/mf_lora_moefit.txt
  # moefit first (most of the step's minutes: the base's random init, the plan, 8 steps, the final
  # checkpoint), leaving the peer ~240 s when both run.
  if want lora; then lora_mf $(($(left) - 255)); else lora_mf 600; fi
fi
if want lora || want lorapeer; then
  lora_peer 300
fi
# the same with adapters on each layer's most-routed quarter of experts (issue 18's "experts: hot" figure)
want lorahot && lora_mf 600 hot train.lora.experts=hot memory.routing=/tmp/mf_lora_routing.json
# the base stored NF4 (issue 30's QLoRA figure)
want loranf4 && lora_mf 600 nf4 train.lora.base_dtype=nf4

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
    [[ -x "$b" && -f "$b" && "$n" != moefit && "$n" != moefit_test && "$n" != *.so* ]] || continue
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
  # the expert GEMMs on the other kernel: each row's speed-up and rate
  while read -r line; do
    row "  $(awk '{print $1, $2, $3, $4}' <<<"$line")" "$(awk '{print $(NF-5), $(NF-4), $(NF-3), "x" $NF}' <<<"$line")" ""
  done < <(sed -n '/^expert GEMMs: the rows above/,/^$/p' "$logs/bench.log" | grep '^  expert_')
  grep -q '^expert GEMMs ran on' "$logs/bench.log" && row "  expert GEMMs" "$(grep '^expert GEMMs ran on' "$logs/bench.log" | cut -c1-62)" ""
  # attention on the other kernel (cuDNN beside mma.sync)
  while read -r line; do
    row "  $(awk '{print $1, $2, $3, $4, $5, $6}' <<<"$line")" "$(awk '{print $(NF-5), $(NF-4), $(NF-3), "x" $NF}' <<<"$line")" ""
  done < <(sed -n '/^attention: the rows above/,/^$/p' "$logs/bench.log" | grep '^  attn_')
  grep -q '^attention ran on' "$logs/bench.log" && row "  attention" "$(grep '^attention ran on' "$logs/bench.log" | cut -c1-62)" ""
fi

# 4b. the expert GEMMs on CUTLASS's sm90 grouped GEMM for a whole training run.
if want cutlass; then
  run644 bf16_cutlass 150 train.precision=bf16 kernels.expert_gemm=cutlass
  row "  expert GEMM kernel" "$(grep -o 'kernels: expert GEMMs on [^,]*' "$logs/bf16_cutlass.log" | head -1 | cut -c1-62)" ""
  row "644M cutlass/mma (bf16)" "$(python3 -c "import sys; print('%.3f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$(tok_s "$logs/bf16_cutlass.metrics.jsonl")" "$(tok_s "$logs/bf16.metrics.jsonl")" 2>/dev/null); losses $(final_loss "$logs/bf16_cutlass.log") vs $(final_loss "$logs/bf16.log")" ""
  peer=$(python3 -c "import json,sys; print('%.0f' % json.load(open(sys.argv[1]))['tokens_per_s'])" "$logs/peer.json" 2>/dev/null)
  [[ -n "$peer" ]] && row "  cutlass moefit/peer" "$(python3 -c "import sys; print('%.3f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$(tok_s "$logs/bf16_cutlass.metrics.jsonl")" "$peer" 2>/dev/null)" ""
fi

# 4c. attention on cuDNN for a whole training run, then with the cutlass expert GEMMs too.
ratio() { python3 -c "import sys; print('%.3f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$1" "$2" 2>/dev/null; }
if want cudnn; then
  run644 bf16_cudnn 150 train.precision=bf16 kernels.attention=cudnn
  row "  attention kernel" "$(grep -o 'attention on [^)]*)' "$logs/bf16_cudnn.log" | head -1 | cut -c1-62)" ""
  row "644M cudnn/mma (bf16)" "$(ratio "$(tok_s "$logs/bf16_cudnn.metrics.jsonl")" "$(tok_s "$logs/bf16.metrics.jsonl")"); losses $(final_loss "$logs/bf16_cudnn.log") vs $(final_loss "$logs/bf16.log")" ""
  run644 bf16_fast 150 train.precision=bf16 kernels.attention=cudnn kernels.expert_gemm=cutlass
  peer=$(python3 -c "import json,sys; print('%.0f' % json.load(open(sys.argv[1]))['tokens_per_s'])" "$logs/peer.json" 2>/dev/null)
  row "644M cutlass+cudnn moefit/peer" "$(ratio "$(tok_s "$logs/bf16_fast.metrics.jsonl")" "${peer:-0}") (goal >= 1.3); /mma $(ratio "$(tok_s "$logs/bf16_fast.metrics.jsonl")" "$(tok_s "$logs/bf16.metrics.jsonl")")" ""
  # the peer keeps AdamW's moments in bf16 (its parameters' dtype): the same with train.adam_moments=bf16
  run644 bf16_fast_m16 150 train.precision=bf16 train.adam_moments=bf16 kernels.attention=cudnn kernels.expert_gemm=cutlass
  row "644M + bf16 moments moefit/peer" "$(ratio "$(tok_s "$logs/bf16_fast_m16.metrics.jsonl")" "${peer:-0}"); losses $(final_loss "$logs/bf16_fast_m16.log") vs $(final_loss "$logs/bf16.log")" ""
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

# 5c. SIGKILL and resume on cuda (tools/kill_test.sh with the test build
# moefit_test, whose MF_TEST_CKPT_PAUSE_MS holds a checkpoint write open for
# the second kill): the final weights and every step's loss as a run never
# killed.
if want kill; then
  t=$(date +%s)
  if [[ -x "$dir/moefit_test" ]]; then
    MOEFIT=$dir/moefit_test KILLS=2 STEPS=60 WORK=/tmp/mf_kill \
      EXTRA="backend=cuda train.precision=bf16 memory.device_budget=575MiB hardware.profile=configs/hw/h100-pcie.yaml" \
      timeout "$(cap 120)" tools/kill_test.sh >"$logs/kill.log" 2>&1
    row "SIGKILL + resume on cuda (bf16)" "$(tail -n 1 "$logs/kill.log" | cut -c1-62)" $(($(date +%s) - t))
  else
    row "SIGKILL + resume on cuda" "skipped: no moefit_test in $dir (gpu_check.sh --pack)" 0
  fi
fi

# 6. fp32 on the 644M shape.
if want fp32; then
  run644 fp32 120 train.precision=fp32
  row "644M bf16/fp32" "$(python3 -c "import sys; print('%.2f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$(tok_s "$logs/bf16.metrics.jsonl")" "$(tok_s "$logs/fp32.metrics.jsonl")" 2>/dev/null)" ""
fi

# 7. plan invariance on cuda (bf16): resident vs the planner at 25% of its arena
#    (and, with the cutlass step, again with the expert GEMMs on CUTLASS).
inv_check() {
  local label=$1 t sfx
  t=$(date +%s)
  sfx=${label// /_}
  common=(train.steps=60 train.eval_every=0 backend=cuda hardware.profile=configs/hw/h100-pcie.yaml)
  timeout "$(cap 60)" "$moefit" train configs/demo.yaml "${common[@]}" memory.plan=resident memory.device_budget=600MiB \
    output.dir=/tmp/mf_inv_res >"$logs/inv_res_$sfx.log" 2>&1
  # 25% of the resident arena plus what the backend keeps beside it (the
  # plan's device_backend_bytes: 48 MiB on an H100, not the 560 MiB first
  # assumed, with which this "25%" plan was the resident one again).
  budget=$(quarter_budget /tmp/mf_inv_res/plan.json)
  timeout "$(cap 60)" "$moefit" train configs/demo.yaml "${common[@]}" memory.plan=auto "memory.device_budget=$budget" \
    output.dir=/tmp/mf_inv_q >"$logs/inv_q_$sfx.log" 2>&1
  timeout "$(cap 60)" "$moefit" train configs/demo.yaml "${common[@]}" memory.plan=megatrain memory.device_budget=600MiB \
    output.dir=/tmp/mf_inv_mt >"$logs/inv_mt_$sfx.log" 2>&1
  q_arena=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['arena_bytes'])" /tmp/mf_inv_q/plan.json 2>/dev/null || echo 0)
  losses() { grep -o '^step *[0-9]*/[0-9]* *loss [0-9.]*' "$1"; }
  for other in q mt; do
    if cmp -s /tmp/mf_inv_res/final/model.safetensors /tmp/mf_inv_$other/final/model.safetensors &&
        cmp -s <(losses "$logs/inv_res_$sfx.log") <(losses "$logs/inv_${other}_$sfx.log"); then
      row "plan invariance cuda $label ($other)" "== resident: weights (bits) and losses; arena $q_arena" $(($(date +%s) - t))
    else
      row "plan invariance cuda $label ($other)" "DIFFER or FAILED (arena $q_arena)" $(($(date +%s) - t))
    fi
  done
  rm -rf /tmp/mf_inv_res /tmp/mf_inv_q /tmp/mf_inv_mt
}
want inv && inv_check bf16
want inv && want cutlass && MF_EXPERT_GEMM=cutlass inv_check "bf16 cutlass"
want inv && want cudnn && MF_ATTENTION=cudnn MF_EXPERT_GEMM=cutlass inv_check "bf16 cutlass+cudnn"

# 8. 25% of the resident arena, 8 micro-batches a step (against resident with
#    the same 8 micro-batches).
if want ga8; then
  run644 ga8_resident 100 train.precision=bf16 train.grad_accum=8 train.steps=6 train.log_every=2
  run644 ga8_quarter 120 train.precision=bf16 train.grad_accum=8 train.steps=6 train.log_every=2 memory.plan=auto \
    "memory.device_budget=$(quarter_budget "$logs/ga8_resident.plan.json")"
  row "644M 25%/resident (ga 8)" "$(python3 -c "import sys; print('%.2f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$(tok_s "$logs/ga8_quarter.metrics.jsonl")" "$(tok_s "$logs/ga8_resident.metrics.jsonl")" 2>/dev/null)" ""
  q=$(quarter_budget "$logs/ga8_resident.plan.json")
  for home in true false; do
    run644 "ga8_layer_home_$home" 120 train.precision=bf16 train.grad_accum=8 train.steps=6 train.log_every=2 \
      train.micro_batch_order=layer memory.plan=auto "memory.device_budget=$q" "memory.pinned_home=$home"
  done
  row "644M 25% layer-major home/staged" "$(ratio "$(tok_s "$logs/ga8_layer_home_true.metrics.jsonl")" "$(tok_s "$logs/ga8_layer_home_false.metrics.jsonl")"); /resident $(ratio "$(tok_s "$logs/ga8_layer_home_true.metrics.jsonl")" "$(tok_s "$logs/ga8_resident.metrics.jsonl")") (goal >= 0.85); losses $(final_loss "$logs/ga8_layer_home_true.log") vs $(final_loss "$logs/ga8_layer_home_false.log")" ""
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
    timeout "$(cap 200)" "$ncu_bin" --kernel-name 'regex:expert_(rows|wgt)_mma|attn_(fwd|dkdv|dq)_mma|GemmUniversal|sm90_flash|cudnn' --launch-count 18 \
      --set detailed --clock-control none -o "$logs/ncu" "$moefit" bench kernels configs/bench-644m.yaml --reps 1 \
      >"$logs/ncu_run.log" 2>&1
    "$ncu_bin" --import "$logs/ncu.ncu-rep" --page details >"$logs/ncu.txt" 2>&1
    row "ncu (tensor-core kernels)" "$(grep -c 'Duration' "$logs/ncu.txt") kernels profiled; ncu.txt" $(($(date +%s) - t))
  else
    row "ncu (tensor-core kernels)" "no ncu on this machine" 0
  fi
fi
