#!/usr/bin/env python3
"""Checks that `moefit init` output loads in transformers and that `moefit eval`
agrees with transformers' loss and logits.

For each family (mixtral, qwen2_moe, qwen3_moe, olmoe), preset tiny:
  1. moefit init --family F --preset tiny --out DIR --seed N
  2. AutoModelForCausalLM.from_pretrained(DIR, torch_dtype=float32, attn_implementation="eager",
     output_loading_info=True): no missing / unexpected / mismatched keys, no load warning
     about unused or newly initialised weights, every config.json key read back unchanged
     (plus the dims the modules were actually built with: head_dim, experts, which layers
     are MoE, shared expert, q/k-norm shapes), every loaded tensor bit-equal to the file,
     the init statistics moefit init documents (N(0, 0.02), norms 1).
  3. a byte-level token file: deterministic pseudo-text (--text FILE to use another)
     -> moefit data bytes IN OUT.tokens
  4. moefit eval CONFIG --tokens OUT.tokens --dump-logits FILE with a YAML config
     {model.path: DIR, data: {train, seq_len S}, train: {micro_batch B, steps 1}, backend: cpu}
  5. the same eval in PyTorch: windows of S+1 tokens at multiples of S
     ((n-1)//S of them, file order, batches of B), CE of every target computed in
     float64 from the model's float32 logits, summed over all windows / number of
     targets. |moefit - transformers| / transformers <= 1e-5 for the loss, and
     ||moefit - transformers|| / ||transformers|| <= 1e-5 for the logits of the first
     window (--dump-logits). The window/token counts moefit prints must match too.
Exit status 0 when every check passes, 1 otherwise.

moefit init's weights are N(0, 0.02), so the model is nearly uniform (loss ~ ln 272 =
5.606) and the loss agreement alone says little: --scale K (default 10) adds a second
row per family, "F x10", with every non-norm tensor of the same init multiplied by K
and the biases (all 0 after init, as in transformers; qwen2_moe's q/k/v) drawn from
N(0, (0.02 K)^2) (written with safetensors into DIR_xK, config.json copied), so routing,
attention and the biases matter (loss far from ln V). The logits check is the sharp one
in both rows.

Run (venv of tools/requirements-fixtures.txt), from the repository root:
    bazel --output_base=/tmp/bazel_initcheck build --symlink_prefix=/ //:moefit
    /tmp/fixvenv/bin/python tools/check_init_eval.py \
        --moefit $(bazel --output_base=/tmp/bazel_initcheck info bazel-bin)/moefit

Record (2026-11-21, this exact run; the RESULTS block is its output table, from a rerun on
2026-12-01 when the tiny preset's vocab became 272 for init's byte-level tokenizer: the same
venv, --moefit bazel-bin/moefit of the working tree then):
  bazel --output_base=/tmp/bazel_initcheck build --symlink_prefix=/ //:moefit
  /tmp/fixvenv/bin/python tools/check_init_eval.py      # finds the binary via bazel info; exit 0
  transformers 4.57.6, torch 2.9.1+cu128 run on the CPU (1 thread, MKL_CBWR=COMPATIBLE,
  ATEN_CPU_CAPABILITY=default, deterministic algorithms); moefit built from the working
  tree at that time (it held uncommitted kernels/, src/optim, src/model/spec.*
  edits); defaults: seed 1, S=32, B=4, 6000 bytes of pseudo-text -> 187 windows (the last
  batch has 3), 5984 targets; moefit and the reference agree on those counts.
  Also passed: --seed 2 --seq-len 17 --micro-batch 5.
  Every family: no missing/unexpected/mismatched keys, no load warning except
  "`torch_dtype` is deprecated! Use `dtype` instead!" (from passing torch_dtype=), every
  config.json key read back unchanged, tensors bit-equal, init N(0, 0.02) / norms 1 /
  biases 0. moefit prints the loss with 6 decimals (quantisation ~1e-7 relative).
  Sensitivity (by hand): olmoe x10 with layer 1 k_norm x1.001 in moefit's copy only
  gave loss rel diff 1.1e-7 (not caught) but logits rel err 3.1e-4 (caught): the logits
  check is the one that bites; the loss check covers windowing, batching and averaging.
RESULTS
| family | moefit loss | transformers loss | rel diff | logits rel err |
|---|---|---|---|---|
| mixtral | 5.619362 | 5.61936221 | 3.77e-08 | 2.20e-07 |
| mixtral x10 | 7.057893 | 7.05789290 | 1.42e-08 | 1.03e-06 |
| qwen2_moe | 5.578783 | 5.57878274 | 4.72e-08 | 2.37e-07 |
| qwen2_moe x10 | 6.788184 | 6.78818375 | 3.74e-08 | 7.14e-07 |
| qwen3_moe | 5.640241 | 5.64024065 | 6.21e-08 | 2.74e-07 |
| qwen3_moe x10 | 6.817518 | 6.81751828 | 4.07e-08 | 7.81e-07 |
| olmoe | 5.639511 | 5.63951124 | 4.33e-08 | 2.52e-07 |
| olmoe x10 | 6.804761 | 6.80476054 | 6.72e-08 | 9.07e-07 |
RESULTS-END
"""

import argparse
import json
import logging
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import warnings

# Same deterministic CPU settings as tools/make_fixtures.py, before torch loads.
os.environ["MKL_CBWR"] = "COMPATIBLE"
os.environ["ATEN_CPU_CAPABILITY"] = "default"
os.environ["OMP_NUM_THREADS"] = "1"

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

PINNED = {"torch": "2.9.1", "transformers": "4.57.6"}
FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]
LOSS_RTOL = 1e-5
LOGITS_RTOL = 1e-5
# What `moefit init --help` says the tiny preset is.
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            experts=8, num_experts_per_tok=2, expert_ffn=128, vocab_size=272)
# Load warnings that mean the checkpoint and the model class disagree.
BAD_LOAD_WARNING = re.compile(r"not used|unused|newly initiali[sz]ed|not initiali[sz]ed|missing|unexpected|"
                              r"mismatch|ignored", re.I)
EVAL_LINE = re.compile(r"^loss\s+(\S+)\s+perplexity\s+(\S+)\s+\((\d+) tokens in (\d+) sequences\)", re.M)


class Failures:
    def __init__(self):
        self.items = []

    def check(self, ok, what):
        if not ok:
            self.items.append(what)
            print(f"  FAIL {what}")
        return ok


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}{p.stderr}")
    return p.stdout


def find_moefit():
    try:
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        bb = subprocess.run(["bazel", "--output_base=/tmp/bazel_initcheck", "info", "bazel-bin"], cwd=here,
                            capture_output=True, text=True, check=True).stdout.strip()
        return os.path.join(bb, "moefit")
    except (OSError, subprocess.CalledProcessError):
        return None


def pseudo_text(n_bytes, seed):
    """Deterministic English-like text (Python's Mersenne Twister, stable across versions
    for random.Random(int).random/choice on the same list)."""
    words = ("the of and to in is that for it as with was on be by this are from at or an "
             "which have not one all were when we there can more if will out so about what "
             "expert router token layer model loss weight gradient memory device batch step "
             "mixture attention norm softmax kernel tensor shard offload pinned stream").split()
    rng = random.Random(seed)
    out, line = [], []
    while sum(len(s) for s in out) < n_bytes:
        line.append(words[int(rng.random() * len(words))])
        if rng.random() < 0.08:
            line[-1] += rng.choice([",", ".", ";", "?", "!"])
        if len(" ".join(line)) > 60:
            s = " ".join(line)
            out.append(s[0].upper() + s[1:] + "\n")
            line = []
    return "".join(out).encode()[:n_bytes]


def read_tokens(path):
    """The .tokens format of src/io/tokens.h (header fields at fixed offsets)."""
    b = open(path, "rb").read()
    assert b[:8] == b"MFTOKENS", "bad magic"
    version, header_size, vocab, width = struct.unpack_from("<4I", b, 8)
    count, doc_count, flags, tok_off, tok_size = struct.unpack_from("<5Q", b, 24)
    assert version == 1 and width in (2, 4) and tok_size == count * width, (version, width, tok_size)
    assert flags & 1 == 0, "token file has a loss mask; this check assumes every token counts"
    ids = np.frombuffer(b, dtype="<u2" if width == 2 else "<u4", count=count, offset=tok_off).astype(np.int64)
    return ids, vocab


def load_checked(d, fam, label, fails):
    """fam: the family; label: the row name in messages."""
    # from_pretrained with the load checks; returns the model in eval mode.
    cfg_json = json.load(open(os.path.join(d, "config.json")))
    records = []

    class Grab(logging.Handler):
        def emit(self, r):
            records.append(f"{r.levelname} {r.name}: {r.getMessage()}")

    h = Grab(level=logging.WARNING)
    tlog = transformers.utils.logging.get_logger("transformers")
    tlog.addHandler(h)
    try:
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            model, info = AutoModelForCausalLM.from_pretrained(
                d, torch_dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    finally:
        tlog.removeHandler(h)
    records += [f"{w.category.__name__}: {w.message}" for w in ws]
    model.eval()

    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        fails.check(len(info.get(k, [])) == 0, f"{label}: {k} {sorted(info.get(k, []))[:8]}")
    bad = [r for r in records if BAD_LOAD_WARNING.search(r)]
    fails.check(not bad, f"{label}: load warnings about weights: {bad}")
    other = [r for r in records if r not in bad]
    for r in other:
        print(f"  note: load message: {r[:200]}")

    # Config round trip: every key of config.json reads back unchanged.
    c = model.config
    cd = c.to_dict()
    fails.check(type(model).__name__ == cfg_json["architectures"][0],
                f"{label}: class {type(model).__name__} != architectures {cfg_json['architectures']}")
    for k, v in cfg_json.items():
        if k in ("transformers_version", "architectures"):
            continue
        if k == "torch_dtype":
            got = str(getattr(c, "torch_dtype", None) or cd.get("dtype") or cd.get("torch_dtype")).replace("torch.", "")
        else:
            got = cd.get(k, getattr(c, k, "<absent>"))
        fails.check(got == v or (isinstance(v, float) and isinstance(got, float) and math.isclose(got, v)),
                    f"{label}: config {k}: config.json {v!r}, transformers {got!r}")

    # The dims the modules were actually built with, against the documented preset.
    n_exp = c.num_local_experts if fam == "mixtral" else c.num_experts
    want = dict(TINY)
    got = dict(hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
               num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
               experts=n_exp, num_experts_per_tok=c.num_experts_per_tok,
               expert_ffn=c.intermediate_size if fam in ("mixtral", "olmoe") else c.moe_intermediate_size,
               vocab_size=c.vocab_size)
    fails.check(got == want, f"{label}: dims {got} != tiny preset {want}")
    layers = model.model.layers
    attn = layers[0].self_attn
    fails.check(attn.head_dim == 16, f"{label}: attention head_dim {attn.head_dim} != 16")
    fails.check(tuple(attn.q_proj.weight.shape) == (64, 64) and tuple(attn.k_proj.weight.shape) == (32, 64),
                f"{label}: q/k proj shapes {tuple(attn.q_proj.weight.shape)} {tuple(attn.k_proj.weight.shape)}")
    moe = []
    for i, L in enumerate(layers):
        m = L.block_sparse_moe if fam == "mixtral" else L.mlp
        if hasattr(m, "experts"):
            moe.append(i)
            fails.check(len(m.experts) == 8, f"{label}: layer {i} has {len(m.experts)} experts")
    want_moe = [1] if fam == "qwen2_moe" else [0, 1]
    fails.check(moe == want_moe, f"{label}: MoE layers {moe} != {want_moe}")
    if fam == "qwen2_moe":
        m0, m1 = layers[0].mlp, layers[1].mlp
        fails.check(m0.gate_proj.weight.shape[0] == 256, f"{label}: dense layer 0 ffn {m0.gate_proj.weight.shape[0]}")
        fails.check(m1.shared_expert.gate_proj.weight.shape[0] == 256 and
                    tuple(m1.shared_expert_gate.weight.shape) == (1, 64), f"{label}: shared expert shapes")
        fails.check(attn.q_proj.bias is not None and attn.o_proj.bias is None, f"{label}: q/k/v bias, o no bias")
    if fam == "qwen3_moe":
        fails.check(tuple(attn.q_norm.weight.shape) == (16,), f"{label}: q_norm {tuple(attn.q_norm.weight.shape)}")
    if fam == "olmoe":
        fails.check(tuple(attn.q_norm.weight.shape) == (64,) and tuple(attn.k_norm.weight.shape) == (32,),
                    f"{label}: q/k norm {tuple(attn.q_norm.weight.shape)} {tuple(attn.k_norm.weight.shape)}")

    # Loaded tensors == file tensors, bit for bit; no parameter the file lacks.
    sd = model.state_dict()
    files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    names = set()
    for f in files:
        with safe_open(os.path.join(d, f), "pt") as st:
            for n in st.keys():
                names.add(n)
                t = st.get_tensor(n)
                fails.check(n in sd and t.dtype == torch.float32 and torch.equal(sd[n], t),
                            f"{label}: tensor {n} differs after loading")
    fails.check(names == set(sd.keys()), f"{label}: state_dict keys != file keys: "
                f"{sorted(set(sd) ^ names)[:8]}")
    return model, names


def init_stats(d, fam, fails):
    """moefit init --help: weights ~ N(0, 0.02), norms 1. Returns a short summary."""
    ws, norms_ok, bias_ok, nb, n = [], True, True, 0, 0
    with safe_open(os.path.join(d, "model.safetensors"), "np") as st:
        for k in st.keys():
            t = st.get_tensor(k)
            n += t.size
            if "norm" in k:
                norms_ok &= bool(np.all(t == 1.0))
            elif k.endswith(".bias"):  # transformers' _init_weights zeroes Linear biases
                bias_ok &= bool(np.all(t == 0.0))
                nb += 1
            else:
                ws.append(t.ravel())
    w = np.concatenate(ws).astype(np.float64)
    fails.check(norms_ok, f"{fam}: a norm weight is not all 1")
    fails.check(bias_ok, f"{fam}: a bias is not all 0")
    fails.check(abs(w.std() - 0.02) < 0.001 and abs(w.mean()) < 0.001,
                f"{fam}: weights mean {w.mean():.4g} std {w.std():.4g}, want N(0, 0.02)")
    return (f"{n} params, weights mean {w.mean():+.1e} std {w.std():.5f}, norms 1: {norms_ok}, "
            f"{nb} biases 0: {bias_ok}")


def scaled_copy(d, out, k, seed):
    """DIR with every non-norm tensor multiplied by k (norms stay 1) and the (all-zero)
    biases set to N(0, (0.02 k)^2) from numpy's PCG64, so the bias path counts too."""
    os.makedirs(out, exist_ok=True)
    shutil.copy(os.path.join(d, "config.json"), out)
    ts, rng = {}, np.random.Generator(np.random.PCG64(seed))
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as st:
        for n in sorted(st.keys()):
            t = st.get_tensor(n)
            if "norm" in n:
                ts[n] = t
            elif n.endswith(".bias"):
                ts[n] = torch.from_numpy(rng.normal(0.0, 0.02 * k, tuple(t.shape)).astype(np.float32))
            else:
                ts[n] = (t * k).contiguous()
    save_file(ts, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


def reference_eval(model, ids, S, B):
    """moefit eval in PyTorch: windows [i*S, i*S+S], file order, batches of B."""
    nwin = (len(ids) - 1) // S
    total, count, first = 0.0, 0, None
    with torch.no_grad():
        for b0 in range(0, nwin, B):
            w = np.stack([ids[i * S: i * S + S + 1] for i in range(b0, min(b0 + B, nwin))])
            x = torch.from_numpy(w[:, :S].copy())
            y = torch.from_numpy(w[:, 1:].copy())
            logits = model(input_ids=x).logits  # float32 [b, S, V]
            assert logits.dtype == torch.float32
            if first is None:
                first = logits[0].clone()
            lp = torch.log_softmax(logits.double(), dim=-1)
            total += -lp.gather(-1, y.unsqueeze(-1)).sum().item()
            count += y.numel()
    return total / count, count, nwin, first


def moefit_eval(moefit, cfg, tokens, dump):
    out = run([moefit, "eval", cfg, "--tokens", tokens, "--dump-logits", dump])
    m = EVAL_LINE.search(out)
    if not m:
        sys.exit(f"cannot parse moefit eval output:\n{out}")
    return float(m.group(1)), float(m.group(2)), int(m.group(3)), int(m.group(4)), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--moefit", help="the moefit binary (default: bazel-bin of --output_base=/tmp/bazel_initcheck)")
    ap.add_argument("--work", help="scratch directory (default: a temporary directory, removed after)")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--seed", type=int, default=1, help="moefit init --seed and the pseudo-text seed")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--text", help="input text file for `moefit data bytes` (default: 6000 bytes of pseudo-text)")
    ap.add_argument("--text-bytes", type=int, default=6000)
    ap.add_argument("--scale", type=float, default=10.0, help="extra row with non-norm weights x K; 0: none")
    ap.add_argument("--any-version", action="store_true")
    args = ap.parse_args()

    have = {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__}
    if have != PINNED and not args.any_version:
        sys.exit(f"versions {have}, pinned {PINNED}; --any-version to go on")
    torch.set_num_threads(1)
    assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_warning()

    moefit = os.path.abspath(args.moefit) if args.moefit else find_moefit()
    if not moefit or not os.access(moefit, os.X_OK):
        sys.exit(f"no moefit binary ({moefit}); build it or pass --moefit")
    tmp = None
    if args.work:
        work = os.path.abspath(args.work)
        os.makedirs(work, exist_ok=True)
    else:
        tmp = tempfile.mkdtemp(prefix="check_init_eval.")
        work = tmp
    S, B = args.seq_len, args.micro_batch
    print(f"moefit {moefit}\nwork {work}\ntorch {torch.__version__} transformers {transformers.__version__}")

    # 3. token file
    txt = os.path.join(work, "text.txt")
    if args.text:
        shutil.copy(args.text, txt)
    else:
        open(txt, "wb").write(pseudo_text(args.text_bytes, args.seed))
    tokens = os.path.join(work, "text.tokens")
    run([moefit, "data", "bytes", txt, tokens])
    ids, vocab = read_tokens(tokens)
    print(f"tokens: {len(ids)} (vocab {vocab}), {(len(ids) - 1) // S} windows of {S}+1, batches of {B}")

    fails = Failures()
    rows = []
    for fam in args.families.split(","):
        print(f"== {fam}")
        d = os.path.join(work, fam)
        shutil.rmtree(d, ignore_errors=True)
        print("  " + run([moefit, "init", "--family", fam, "--preset", "tiny", "--out", d,
                          "--seed", str(args.seed)]).strip())
        print("  init: " + init_stats(d, fam, fails))
        variants = [(fam, d)]
        if args.scale:
            ds = f"{d}_x{args.scale:g}"
            scaled_copy(d, ds, args.scale, args.seed)
            variants.append((f"{fam} x{args.scale:g}", ds))
        for label, md in variants:
            model, _ = load_checked(md, fam, label, fails)
            cfg = os.path.join(work, f"{os.path.basename(md)}.yaml")
            with open(cfg, "w") as f:
                f.write(f"model: {{path: {json.dumps(md)}}}\n"
                        f"data: {{train: {json.dumps(tokens)}, seq_len: {S}}}\n"
                        f"train: {{micro_batch: {B}, steps: 1}}\n"
                        f"backend: cpu\n")
            dump = os.path.join(work, f"{os.path.basename(md)}.logits.f32")
            m_loss, m_ppl, m_n, m_seqs, _ = moefit_eval(moefit, cfg, tokens, dump)
            t_loss, t_n, t_seqs, first = reference_eval(model, ids, S, B)
            V = model.config.vocab_size
            ml = torch.from_numpy(np.fromfile(dump, dtype="<f4"))
            fails.check(ml.numel() == S * V, f"{label}: dump has {ml.numel()} floats, want {S}x{V}")
            ml = ml.reshape(S, V) if ml.numel() == S * V else torch.zeros(S, V)
            rel_loss = abs(m_loss - t_loss) / abs(t_loss)
            lerr = ((ml.double() - first.double()).norm() / first.double().norm()).item()
            fails.check((m_n, m_seqs) == (t_n, t_seqs), f"{label}: moefit counted {m_n} tokens in {m_seqs} "
                        f"sequences, reference {t_n} in {t_seqs}")
            fails.check(rel_loss <= LOSS_RTOL, f"{label}: loss rel diff {rel_loss:.2e} > {LOSS_RTOL}")
            fails.check(lerr <= LOGITS_RTOL, f"{label}: logits rel err {lerr:.2e} > {LOGITS_RTOL}")
            fails.check(abs(m_ppl - math.exp(m_loss)) <= 1e-4 * m_ppl, f"{label}: perplexity {m_ppl} != exp(loss)")
            print(f"  {label}: moefit {m_loss:.6f} transformers {t_loss:.8f} rel diff {rel_loss:.2e} "
                  f"logits rel err {lerr:.2e} (ln V - loss {math.log(V) - t_loss:.4f})")
            rows.append((label, m_loss, t_loss, rel_loss, lerr))

    print("\n| family | moefit loss | transformers loss | rel diff | logits rel err |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.6f} | {r[2]:.8f} | {r[3]:.2e} | {r[4]:.2e} |")
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    if fails.items:
        print(f"\nFAILED ({len(fails.items)}):")
        for f in fails.items:
            print(f"  {f}")
        sys.exit(1)
    print("\nall checks passed")


if __name__ == "__main__":
    main()
