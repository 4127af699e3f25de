#!/usr/bin/env python3
"""The peer moefit is measured against: transformers training the same model.

usage: peer_bench.py MODEL_DIR [--seq-len S] [--micro-batch B] [--grad-accum G]
                     [--steps N] [--warmup W] [--dtype bf16|fp32] [--attn sdpa|eager]
                     [--device cuda|cpu] [--lr LR] [--seed N] [--json FILE]
                     [--lora-rank R [--lora-alpha A] [--lora-targets q_proj,k_proj,...]
                      [--offload auto|none|cpu] [--grad-ckpt on|off]]

MODEL_DIR holds the model's config.json, e.g. the `final/` a `moefit train` run
wrote (moefit's writer is checked against transformers, so this is the same
architecture, shapes and routing as the moefit run). The model is built from the
config with random weights (no weights are read), in --dtype, with
attn_implementation --attn, and trained with torch's fused AdamW (foreach on the
cpu) on random token ids, the router's load-balancing loss included as in
transformers' training (output_router_logits). W steps warm up (kernel
selection, allocator); the next N steps are timed between CUDA synchronisations.

Without --lora-*: full fine-tuning, every weight trained (built on the cpu with
transformers' own initialisation, then moved to --device).

With --lora-rank R: LoRA over a frozen base, as PEFT trains it:
LoraConfig(r=R, lora_alpha=A (default R), target_modules=--lora-targets (default
the attention projections and gate/up/down_proj), lora_dropout=0, bias="none"),
get_peft_model; AdamW over the adapters only (PEFT keeps them in fp32 over a bf16
base). Where the experts are fused 3-D parameters (transformers 5: experts.gate_up_proj,
experts.down_proj) gate/up/down_proj reach them through PEFT's target_parameters;
the JSON's lora.expert_adapters counts what was adapted. The base is built
without transformers' initialisation (a 30B model's normal_ on the cpu takes
many minutes) straight in --dtype (2 bytes a parameter in bf16: no fp32 copy is
ever made) and filled with N(0, initializer_range) (norms 1, biases 0), on the GPU
where it goes there. --offload decides where it lives:
  none  on the GPU (built there directly);
  cpu   in host memory, each large frozen module (the adapted layers' base
        weights, embeddings, LM head) given accelerate's cpu_offload hook (its
        weights copied to the GPU for each forward, recomputation included;
        adapters, norms, routers on the GPU); gradient checkpointing on, so the
        weights are not held on the GPU for the backward;
  auto  (default) none where the estimate fits in torch.cuda.mem_get_info's free
        bytes, else cpu; and none that runs out of memory in its first step
        goes on as cpu. The estimate (in the JSON): the base's bytes + 16 bytes
        per adapter parameter (fp32 weight, gradient, two AdamW moments) + the
        activations (T = micro-batch x seq-len tokens: the logits T x vocab in
        --dtype, fp32 and their gradient; with --grad-ckpt each layer's input plus
        one layer's live tensors, else every layer's) + 2 GiB.
--grad-ckpt on: transformers' gradient checkpointing per decoder layer
(use_reentrant=False), as moefit recomputes activations. On the cpu --offload
cpu runs the same hooks with the cpu as the execution device (a test of the
mechanics, not a measurement). Test knobs: PEER_BENCH_OFFLOAD_MIN_BYTES (the
smallest module offloaded, default 8 MiB), PEER_BENCH_TEST_OOM=1 (the first step
runs out of memory, as a GPU placement that did not fit would).

Prints one JSON object (also written to --json FILE): tokens/s, seconds per
step, peak device memory, the losses, and what ran (torch, transformers, the
GPU's name; with LoRA: peft, the placement and why, the trainable parameters,
peak host memory). Needs torch and transformers (and peft with --lora-rank,
accelerate for --offload cpu); nothing is downloaded.
"""
import argparse
import json
import os
import resource
import sys
import time

DEFAULT_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
GiB = 1 << 30


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
    lo = ap.add_argument_group("LoRA over a frozen base (PEFT)")
    lo.add_argument("--lora-rank", type=int, default=0, help="adapter rank r; 0 (default): full fine-tuning")
    lo.add_argument("--lora-alpha", type=float, help="PEFT's lora_alpha (default: the rank, a scale of 1)")
    lo.add_argument("--lora-targets", help=f"PEFT's target_modules, comma-separated (default {DEFAULT_TARGETS})")
    lo.add_argument("--offload", choices=["auto", "none", "cpu"], default="auto",
                    help="where the frozen base lives (LoRA only): see above")
    lo.add_argument("--grad-ckpt", choices=["on", "off"], default="off",
                    help="gradient checkpointing per decoder layer (LoRA only; --offload cpu turns it on)")
    a = ap.parse_args(argv)
    if a.lora_rank < 0:
        ap.error("--lora-rank must be >= 0")
    if not a.lora_rank:
        given = [f for f, v in (("--lora-alpha", a.lora_alpha), ("--lora-targets", a.lora_targets)) if v is not None]
        given += [f for f, v, d in (("--offload", a.offload, "auto"), ("--grad-ckpt", a.grad_ckpt, "off")) if v != d]
        if given:
            ap.error(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} --lora-rank "
                     "(without it: full fine-tuning, every weight on --device)")
    else:
        if a.lora_alpha is not None and a.lora_alpha <= 0:
            ap.error("--lora-alpha must be > 0")
        a.targets = [t.strip() for t in (a.lora_targets or DEFAULT_TARGETS).split(",") if t.strip()]
        if not a.targets:
            ap.error("--lora-targets names no module")
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
    if a.lora_rank:
        return lora_main(a, torch, transformers, AutoConfig, AutoModelForCausalLM)
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
        return train_step(model, opt, cfg.vocab_size, a, gen, dev)

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    for _ in range(a.warmup):
        step()
    sync()
    losses, secs = time_steps(step, sync, a.steps, a.device == "cuda")

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
    return emit(result, a.json)


def train_step(model, opt, vocab, a, gen, dev, before_forward=None):
    """One optimizer step over a.grad_accum micro-batches of random token ids (labels = ids); the mean loss."""
    import torch
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for _ in range(a.grad_accum):
        ids = torch.randint(0, vocab, (a.micro_batch, a.seq_len), generator=gen).to(dev)
        if before_forward:
            before_forward()
        out = model(input_ids=ids, labels=ids)
        (out.loss / a.grad_accum).backward()
        total += out.loss.detach().float().item() / a.grad_accum
    opt.step()
    return total


def time_steps(step, sync, steps, cuda):
    """The peak-memory counters reset, then `steps` steps timed between synchronisations: (losses, seconds)."""
    import torch
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    losses = []
    t0 = time.perf_counter()
    for _ in range(steps):
        losses.append(step())
    sync()
    return losses, time.perf_counter() - t0


def emit(result, path):
    """Prints the result as JSON, and writes it to path when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


# ----------------------------------------------------------------- LoRA (PEFT)

class NoInit:
    """Skips torch's and transformers' weight initialisation while a model is
    built (its tensors are allocated, not filled): normal_ on the cpu draws
    about 35M bf16 values a second, so a 30B model would take a quarter of an
    hour. fill_random_ fills the weights afterwards."""

    INIT = ("uniform_", "normal_", "trunc_normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
            "kaiming_normal_", "orthogonal_", "uniform", "normal", "xavier_uniform", "xavier_normal",
            "kaiming_uniform", "kaiming_normal")
    TENSOR = ("normal_", "uniform_")  # what _init_weights calls on .data (transformers 4.x)

    def __init__(self, torch):
        self.torch = torch
        self.saved = []

    def __enter__(self):
        init, T = self.torch.nn.init, self.torch.Tensor
        for n in self.INIT:
            if hasattr(init, n):
                self.saved.append((init, n, getattr(init, n), True))
                setattr(init, n, lambda t, *a, **k: t)
        for n in self.TENSOR:
            self.saved.append((T, n, T.__dict__.get(n), n in T.__dict__))
            setattr(T, n, lambda self, *a, **k: self)
        return self

    def __exit__(self, *exc):
        for obj, n, old, had in reversed(self.saved):
            if had:
                setattr(obj, n, old)
            else:
                delattr(obj, n)
        self.saved.clear()
        return False


def build_model(torch, AutoModelForCausalLM, cfg, dtype, attn, device):
    """The model of cfg in dtype, its tensors allocated on device (meta, cpu or
    the GPU) and not initialised."""
    with NoInit(torch), torch.device(device):
        try:  # transformers >= 4.56 names it dtype; older ones torch_dtype
            return AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn)
        except TypeError:
            return AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype, attn_implementation=attn)


def fill_random_(torch, model, std, gen_device):
    """transformers' initialisation, quickly: norms 1, other 1-D parameters 0,
    the rest N(0, std), drawn on gen_device (the GPU where there is one) in
    chunks and copied to where each parameter lives."""
    chunk = 1 << 27
    with torch.no_grad():
        for mod in model.modules():
            norm = "norm" in type(mod).__name__.lower()
            for _, p in mod.named_parameters(recurse=False):
                if norm:
                    p.fill_(1.0)
                elif p.ndim < 2:
                    p.zero_()
                else:
                    flat = p.view(-1)
                    gen_dtype = torch.float32 if gen_device.type == "cpu" else p.dtype  # bf16 normal_ is slow on the cpu
                    for s in range(0, flat.numel(), chunk):
                        e = min(flat.numel(), s + chunk)
                        flat[s:e].copy_(torch.randn(e - s, device=gen_device, dtype=gen_dtype).mul_(std))


def lora_targets_of(torch, model, targets, rank):
    """What PEFT will adapt: the nn.Linear modules whose name ends in a target
    (target_modules) and, where the experts are fused 3-D parameters
    (transformers 5), experts.gate_up_proj / experts.down_proj
    (target_parameters, as suffixes after layers.N.); and the adapters'
    parameter count, r x (in + out) each (x experts for a fused one)."""
    want = set(targets)
    modules, fused, n = set(), set(), 0
    for name, mod in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        if isinstance(mod, torch.nn.Linear) and last in want:
            modules.add(last)
            n += rank * (mod.in_features + mod.out_features)
    covers = {"gate_up_proj": {"gate_proj", "up_proj"}, "gate_proj": {"gate_proj"}, "up_proj": {"up_proj"},
              "down_proj": {"down_proj"}}
    for name, p in model.named_parameters():
        last = name.rsplit(".", 1)[-1]
        if p.ndim == 3 and ".experts." in "." + name and covers.get(last, set()) & want:
            suffix = name.split(".layers.", 1)[1].split(".", 1)[1] if ".layers." in name else name
            fused.add(suffix)
            n += rank * p.shape[0] * (p.shape[1] + p.shape[2])
    return sorted(modules), sorted(fused), n


def activation_bytes(cfg, tokens, elt, ckpt):
    """A rough bound on the activations transformers keeps for one micro-batch
    of `tokens` tokens (see the usage: logits, layer inputs, a layer's live
    tensors; the adapters' inputs are cast to fp32 by PEFT)."""
    H, L, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    k = getattr(cfg, "num_experts_per_tok", 0) or 1
    I = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    layer = tokens * H * (10 * elt + 12) + tokens * k * (H * (elt + 8) + I * (4 * elt + 4))
    logits = tokens * V * (elt + 8)
    return logits + (L * tokens * H * elt + layer if ckpt else L * layer)


def place_offload(torch, model, dev, min_bytes=8 << 20):
    """accelerate's cpu_offload on every frozen module of at least min_bytes
    whose parameters are its own (no trained parameter below it): its weights
    stay in host memory and are copied to dev for each forward; every other
    parameter and buffer goes to dev. Returns (modules, bytes) offloaded."""
    from accelerate import cpu_offload
    n, nbytes = 0, 0
    for mod in list(model.modules()):
        params = list(mod.named_parameters(recurse=False))
        own = sum(p.numel() * p.element_size() for _, p in params)
        below = any(True for c in mod.children() for _ in c.parameters())
        if params and not below and own >= min_bytes and not any(p.requires_grad for _, p in params):
            for _, p in params:
                if p.device.type != "cpu":
                    p.data = p.data.to("cpu")
            cpu_offload(mod, execution_device=dev)
            n, nbytes = n + 1, nbytes + own
        else:
            for _, p in params:
                if p.device != dev:
                    p.data = p.data.to(dev)
            for bn, b in list(mod.named_buffers(recurse=False)):
                if b is not None and b.device != dev:
                    mod._buffers[bn] = b.to(dev)
    return n, nbytes


def lora_main(a, torch, transformers, AutoConfig, AutoModelForCausalLM):
    import gc
    try:
        import peft
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        print(f"peer_bench: --lora-rank needs peft ({e}); pip install peft", file=sys.stderr)
        return 1
    torch.manual_seed(a.seed)
    cuda = a.device == "cuda"
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    elt = 2 if a.dtype == "bf16" else 4
    alpha = a.lora_alpha if a.lora_alpha is not None else float(a.lora_rank)
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError

    cfg = AutoConfig.from_pretrained(a.model_dir)
    cfg.output_router_logits = True  # the load-balancing loss, as moefit trains
    cfg.use_cache = False
    if getattr(cfg, "max_position_embeddings", a.seq_len) < a.seq_len:
        print(f"peer_bench: --seq-len {a.seq_len} exceeds the model's max_position_embeddings "
              f"{cfg.max_position_embeddings}", file=sys.stderr)
        return 1
    tokens = a.micro_batch * a.seq_len
    timing = {}

    # Where the base goes: on the GPU where the estimate fits (a model built on
    # the meta device is counted, nothing allocated), else in host memory.
    estimate, reason = None, None
    if not cuda:
        placement = "cpu_offload" if a.offload == "cpu" else "cpu"
        reason = "--device cpu" + (" with --offload cpu: the hooks' mechanics, not a measurement" if a.offload == "cpu" else "")
    elif a.offload == "none":
        placement, reason = "gpu", "--offload none"
    elif a.offload == "cpu":
        placement, reason = "cpu_offload", "--offload cpu"
    else:
        t = time.perf_counter()
        meta = build_model(torch, AutoModelForCausalLM, cfg, dtype, a.attn, "meta")
        base = sum(p.numel() for p in meta.parameters())
        _, _, n_lora = lora_targets_of(torch, meta, a.targets, a.lora_rank)
        del meta
        free, total = torch.cuda.mem_get_info()
        estimate = {
            "base_bytes": base * elt,
            "adapter_state_bytes": 16 * n_lora,
            "activation_bytes": activation_bytes(cfg, tokens, elt, a.grad_ckpt == "on"),
            "margin_bytes": 2 * GiB,
            "free_bytes": free,
            "total_bytes": total,
        }
        need = sum(v for k, v in estimate.items() if k not in ("free_bytes", "total_bytes"))
        estimate["need_bytes"] = need
        fits = need <= free
        placement = "gpu" if fits else "cpu_offload"
        reason = (f"--offload auto: {need / GiB:.1f} GiB estimated {'<=' if fits else '>'} {free / GiB:.1f} GiB free "
                  f"(base {base * elt / GiB:.1f}, adapters+AdamW {16 * n_lora / GiB:.1f}, "
                  f"activations {estimate['activation_bytes'] / GiB:.1f}, margin 2)")
        timing["estimate_s"] = time.perf_counter() - t

    t = time.perf_counter()
    build_dev = dev if placement == "gpu" else torch.device("cpu")
    model = build_model(torch, AutoModelForCausalLM, cfg, dtype, a.attn, build_dev)
    fill_random_(torch, model, getattr(cfg, "initializer_range", 0.02), dev)
    if next(model.parameters()).dtype != dtype:
        print(f"peer_bench: the model was built in {next(model.parameters()).dtype}, not {dtype}", file=sys.stderr)
        return 1
    if any(p.device.type == "meta" for p in model.parameters()):
        print("peer_bench: the model was built with parameters on the meta device", file=sys.stderr)
        return 1
    n_base = sum(p.numel() for p in model.parameters())
    timing["build_s"] = time.perf_counter() - t

    t = time.perf_counter()
    mods, fused, n_lora_est = lora_targets_of(torch, model, a.targets, a.lora_rank)
    if not mods and not fused:
        print(f"peer_bench: no module or parameter of this {cfg.model_type} model matches --lora-targets "
              f"{','.join(a.targets)}", file=sys.stderr)
        return 1
    kw = {"target_parameters": fused} if fused else {}
    lcfg = LoraConfig(r=a.lora_rank, lora_alpha=alpha, target_modules=mods, lora_dropout=0.0, bias="none", **kw)
    with torch.device(build_dev):  # the adapters made where their base is
        model = get_peft_model(model, lcfg)
    timing["peft_s"] = time.perf_counter() - t
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_train = sum(p.numel() for p in trainable)
    adapted = [n for n, m in model.named_modules()
               if isinstance(getattr(m, "lora_A", None), torch.nn.ModuleDict) and len(m.lora_A)]
    expert_adapted = sum(1 for n in adapted if ".experts" in n)

    ckpt = a.grad_ckpt == "on"
    off_n, off_bytes = 0, 0

    def to_offload():
        nonlocal ckpt, off_n, off_bytes
        t = time.perf_counter()
        off_n, off_bytes = place_offload(torch, model, dev, int(os.environ.get("PEER_BENCH_OFFLOAD_MIN_BYTES", 8 << 20)))
        ckpt = True  # else every layer's base weights stay on the GPU for the backward
        timing["offload_s"] = timing.get("offload_s", 0.0) + time.perf_counter() - t

    if placement == "cpu_offload":
        to_offload()
    else:
        model.to(dev)
    base_model = model.get_base_model()

    def set_ckpt():
        if ckpt and not base_model.is_gradient_checkpointing:
            base_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    set_ckpt()
    model.train()

    def make_opt():
        return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=a.lr,
                                 fused=cuda, foreach=not cuda)

    opt = make_opt()
    gen = torch.Generator(device="cpu").manual_seed(a.seed)
    tokens_per_step = tokens * a.grad_accum
    fake_oom = os.environ.get("PEER_BENCH_TEST_OOM") == "1"  # test only: the first step runs out of memory

    def before_forward():
        nonlocal fake_oom
        if fake_oom:
            fake_oom = False
            raise oom("PEER_BENCH_TEST_OOM")

    def step():
        return train_step(model, opt, cfg.vocab_size, a, gen, dev, before_forward)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    # The first step on the GPU may run out of memory (the estimate is rough):
    # then the base goes to host memory and the run goes on offloaded.
    guard = placement == "gpu" and a.offload == "auto" or fake_oom
    warmup = max(a.warmup, 1) if guard else a.warmup
    t = time.perf_counter()
    for i in range(warmup):
        if i == 0 and guard:
            try:
                step()
                continue
            except oom:
                pass
            opt.zero_grad(set_to_none=True)
            opt = None
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
            placement = "cpu_offload"
            reason = (reason or "") + "; ran out of GPU memory in the first step, so offloaded"
            to_offload()
            set_ckpt()
            opt = make_opt()
        step()
    sync()
    timing["warmup_s"] = time.perf_counter() - t
    losses, secs = time_steps(step, sync, a.steps, cuda)
    try:
        import accelerate
        acc_version = accelerate.__version__
    except ImportError:
        acc_version = None

    result = {
        "peer": "transformers + peft (LoRA)",
        "model_type": cfg.model_type,
        "parameters": n_base + n_train,
        "base_parameters": n_base,
        "trainable_parameters": n_train,
        "adapter_dtype": str(trainable[0].dtype).replace("torch.", ""),
        "lora": {
            "rank": a.lora_rank,
            "alpha": alpha,
            "targets": a.targets,
            "target_modules": mods,
            "target_parameters": fused,
            "adapted_layers": len(adapted),
            "expert_adapters": expert_adapted,
            "trainable_estimated": n_lora_est,
        },
        "placement": placement,
        "placement_reason": reason,
        "estimate": estimate,
        "offloaded_modules": off_n,
        "offloaded_bytes": off_bytes,
        "gradient_checkpointing": bool(ckpt),
        "dtype": a.dtype,
        "attn_implementation": a.attn,
        "optimizer": "torch AdamW " + ("fused" if cuda else "foreach") + " (adapters only)",
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "accelerate": acc_version,
        "seq_len": a.seq_len,
        "micro_batch": a.micro_batch,
        "grad_accum": a.grad_accum,
        "tokens_per_step": tokens_per_step,
        "warmup_steps": warmup,
        "timed_steps": a.steps,
        "seconds": {k: round(v, 3) for k, v in timing.items()},
        "seconds_per_step": secs / a.steps,
        "tokens_per_s": tokens_per_step * a.steps / secs,
        "peak_device_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "peak_host_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }
    return emit(result, a.json)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
