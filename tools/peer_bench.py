#!/usr/bin/env python3
"""The peer moefit is measured against: transformers training the same model.

usage: peer_bench.py MODEL_DIR [--seq-len S] [--micro-batch B] [--grad-accum G]
                     [--steps N] [--warmup W] [--dtype bf16|fp32] [--attn sdpa|eager]
                     [--device cuda|cpu] [--lr LR] [--seed N] [--json FILE]

MODEL_DIR holds the model's config.json, e.g. the `final/` a `moefit train` run
wrote (moefit's writer is checked against transformers, so this is the same
architecture, shapes and routing as the moefit run). The model is built from the
config with random weights (no weights are read), in --dtype, with
attn_implementation --attn, and trained with torch's fused AdamW (foreach on the
cpu) on random token ids, the router's load-balancing loss included as in
transformers' training (output_router_logits). W steps warm up (kernel
selection, allocator); the next N steps are timed between CUDA synchronisations.

Prints one JSON object (also written to --json FILE): tokens/s, seconds per
step, peak device memory, the losses, and what ran (torch, transformers, the
GPU's name). Needs torch and transformers; nothing is downloaded.
"""
import argparse
import json
import os
import sys
import time


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", help="a directory with the model's config.json")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10, help="timed optimizer steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps first")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="also write the result here")
    a = ap.parse_args(argv)
    for name in ("seq_len", "micro_batch", "grad_accum", "steps"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.warmup < 0:
        ap.error("--warmup must be >= 0")
    if not os.path.isfile(os.path.join(a.model_dir, "config.json")):
        ap.error(f"{a.model_dir}: no config.json there (give a model directory, e.g. a moefit run's final/)")
    return a


def main(argv):
    a = parse_args(argv)
    try:
        import torch
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError as e:
        print(f"peer_bench: needs torch and transformers ({e}); pip install torch transformers", file=sys.stderr)
        return 1
    if a.device == "cuda" and not torch.cuda.is_available():
        print("peer_bench: --device cuda but torch sees no GPU", file=sys.stderr)
        return 1
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32

    cfg = AutoConfig.from_pretrained(a.model_dir)
    cfg.output_router_logits = True  # the load-balancing loss, as moefit trains
    if getattr(cfg, "max_position_embeddings", a.seq_len) < a.seq_len:
        print(f"peer_bench: --seq-len {a.seq_len} exceeds the model's max_position_embeddings "
              f"{cfg.max_position_embeddings}", file=sys.stderr)
        return 1
    try:  # transformers >= 4.56 names it dtype; older ones torch_dtype
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=a.attn)
    except TypeError:
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype, attn_implementation=a.attn)
    model = model.to(dev)
    if next(model.parameters()).dtype != dtype:
        print(f"peer_bench: the model was built in {next(model.parameters()).dtype}, not {dtype}", file=sys.stderr)
        return 1
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, fused=a.device == "cuda", foreach=a.device != "cuda")

    gen = torch.Generator(device="cpu").manual_seed(a.seed)
    tokens_per_step = a.micro_batch * a.seq_len * a.grad_accum

    def step():
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(a.grad_accum):
            ids = torch.randint(0, cfg.vocab_size, (a.micro_batch, a.seq_len), generator=gen).to(dev)
            out = model(input_ids=ids, labels=ids)
            (out.loss / a.grad_accum).backward()
            total += out.loss.detach().float().item() / a.grad_accum
        opt.step()
        return total

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    for _ in range(a.warmup):
        step()
    sync()
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses = []
    t0 = time.perf_counter()
    for _ in range(a.steps):
        losses.append(step())
    sync()
    secs = time.perf_counter() - t0

    result = {
        "peer": "transformers",
        "model_type": cfg.model_type,
        "parameters": n_params,
        "dtype": a.dtype,
        "attn_implementation": a.attn,
        "optimizer": "torch AdamW " + ("fused" if a.device == "cuda" else "foreach"),
        "device": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "seq_len": a.seq_len,
        "micro_batch": a.micro_batch,
        "grad_accum": a.grad_accum,
        "tokens_per_step": tokens_per_step,
        "warmup_steps": a.warmup,
        "timed_steps": a.steps,
        "seconds_per_step": secs / a.steps,
        "tokens_per_s": tokens_per_step * a.steps / secs,
        "peak_device_bytes": torch.cuda.max_memory_allocated() if a.device == "cuda" else None,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }
    text = json.dumps(result, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
