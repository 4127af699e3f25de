#!/usr/bin/env python3
"""Writes the LoRA parity fixtures of tests/fixtures/lora/ with PEFT on transformers.

Run it in the venv of tools/requirements-fixtures.txt (which pins peft too):

    python3 -m venv ~/fixvenv
    ~/fixvenv/bin/pip install -r tools/requirements-fixtures.txt
    ~/fixvenv/bin/python tools/make_lora_fixtures.py            # rewrite tests/fixtures/lora
    ~/fixvenv/bin/python tools/make_lora_fixtures.py --check    # compare only

For mixtral, qwen2_moe, qwen3_moe, olmoe, glm4_moe, deepseek_v3 and gpt_oss it builds the base model
exactly as tools/make_fixtures.py does (its build() and seed, so the base is byte for byte
tests/fixtures/<name>/model.safetensors: asserted, and not copied), wraps it with
peft.get_peft_model (LoRA r=4, alpha=8, dropout 0, bias "none" on the attention
projections and every MLP projection: routed experts, dense MLPs, shared experts; never
the routers, GLM-4.5's and DeepSeek-V3's included: their mlp.gate is no nn.Linear, PEFT cannot
wrap it; DeepSeek-V3's attention projections are its MLA ones, ATTN_MLA; gpt-oss's attention only:
its experts are fused Parameters and its router a plain module, UNTARGETABLE),
overwrites every lora_A / lora_B with N(0, ADAPTER_STD^2) from numpy PCG64 (PEFT's own
init has lora_B = 0, which makes every lora_A gradient zero), and writes
tests/fixtures/lora/<name>/
  config.json                the base config (byte-identical to ../../<name>/config.json)
  adapter_config.json        PeftModel.save_pretrained output, untouched
  adapter_model.safetensors  PeftModel.save_pretrained output: the initial adapters
  fixture.safetensors        input_ids, labels, loss_mask [B,S] I32; logits [B,S,V];
                             loss, ce_loss, aux_loss (0-d) F32; router_logits.<layer>;
                             grad.<n> (grad not None) and after.<n> (one AdamW step over the adapter
                             tensors only) for every tensor n of adapter_model.safetensors,
                             named as there; __metadata__ as make_fixtures, plus the LoRA
                             settings and "no_grad" (adapters whose grad stayed None).
and tests/fixtures/lora/NOTES.md: the PEFT facts the C code must match, each read from
the installed peft sources (source_facts) and, where it can be, checked numerically.

HOT adds fixtures in the same format over a family's base (qwen2_moe_hot: config.json,
base, seed and batch those of tests/fixtures/qwen2_moe) whose routed experts get adapters
in part only ("hot experts"): the attention by short name as above, the MLP projections
by full module name (the dense MLPs', the shared expert's and, in each MoE layer, those
of the hot experts only; PEFT adapts a module whose name equals an entry or ends with
"." + entry, so a short gate_proj would adapt every expert). The hot set of a MoE layer
(hot_set) is read from the base model's routing of the batch; the adapter seed must then
leave a cold expert busy in every MoE layer and a hot expert idle in one.
fixture.safetensors adds lora_hot [layers, experts] I32 (1: adapted) and hot_* metadata.

The adapter seed counts up from base seed + ADAPTER_SEED_OFFSET until the model WITH the
adapters keeps every top-k choice MIN_ROUTING_MARGIN apart and, where make_fixtures
asks for it (need_idle_expert), leaves exactly one routed expert idle; the base seed
stays the one of tests/fixtures/<name>.

Determinism: make_fixtures' settings (imported first: they are set before torch
loads), plus PYTHONHASHSEED=0 (the script re-executes itself with it): PEFT keeps
target_modules as a set and writes list(set) to adapter_config.json, so without a
fixed hash seed the order of that list changes from run to run. Two runs give
byte-identical files; --check regenerates into a temporary directory and compares
(config.json, adapter_*, NOTES.md byte for byte; fixture.safetensors within
make_fixtures' CHECK_RTOL / CHECK_ATOL).
"""

import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:])
os.environ["HF_HUB_OFFLINE"] = "1"  # PEFT's save looks for a base config by name_or_path ("" here)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mfx  # noqa: E402  (sets MKL_CBWR etc. before torch loads)

import warnings  # noqa: E402
import filecmp  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import textwrap  # noqa: E402

import numpy as np  # noqa: E402
import peft  # noqa: E402
import safetensors  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

need = mfx.need
FIXTURES_DIR = os.path.join(HERE, "..", "tests", "fixtures")
DEFAULT_OUT = os.path.join(FIXTURES_DIR, "lora")
FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]  # (make_qlora_fixtures quantizes these)
MORE_FAMILIES = ["glm4_moe", "deepseek_v3", "gpt_oss"]  # whole-model LoRA fixtures with no quantized twin
HOT = {"qwen2_moe_hot": "qwen2_moe"}  # fixture -> the family whose base it adapts, routed experts in part
NAMES = FAMILIES + MORE_FAMILIES + list(HOT)

R, ALPHA = 4, 8
SCALING = ALPHA / R
ADAPTER_STD_A, ADAPTER_STD_B = 0.1, 0.1
ADAPTER_SEED_OFFSET = 100000
ADAPTER_SEED_TRIES = 200
ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
# DeepSeek-V3's multi-head latent attention (DeepseekV3Attention): q_proj, or with q_lora_rank q_a_proj and
# q_b_proj; kv_a_proj_with_mqa (H -> kv latent + rope key), kv_b_proj (latent -> per-head k_nope, v); o_proj.
# q_a_layernorm / kv_a_layernorm are RMSNorms, no nn.Linear: never adapted.
ATTN_MLA = {True: ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"],
            False: ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]}
# gpt-oss's MLP (GptOssMLP) holds no nn.Linear: GptOssExperts' gate_up_proj / down_proj (and biases) are fused
# [E, ...] Parameters, GptOssTopKRouter a weight and bias it applies with F.linear: no MLP adapters.
MLP = {"mixtral": ["w1", "w2", "w3"], "gpt_oss": []}
MLP_DEFAULT = ["gate_proj", "up_proj", "down_proj"]
# The MoE modules PEFT refuses as targets (no nn.Linear), per model_type: target -> the class it names (checked).
UNTARGETABLE = {"glm4_moe": {"gate": "Glm4MoeTopkRouter"}, "deepseek_v3": {"gate": "DeepseekV3TopkRouter"},
                "gpt_oss": {"router": "GptOssTopKRouter", "experts": "GptOssExperts"}}
HOT_FRACTION = 0.25  # moefit's train.lora.hot_fraction default (NOTES compare its rule)
MIN_CONDENSED = 20  # PEFT condenses a target_modules list this long (BaseTuner.inject_adapter)
OUT_FILES = ["config.json", "adapter_config.json", "adapter_model.safetensors", "fixture.safetensors"]


def attn_targets(family):
    """The attention projections of family (a make_fixtures fixture name) that get adapters: ATTN, or for
    DeepSeek-V3 ATTN_MLA of its q path (q_lora_rank set or not)."""
    fx = next((f for f in mfx.FIXTURES if f["name"] == family), None)
    if fx is not None and fx["config"] is mfx.DeepseekV3Config:
        return ATTN_MLA[fx["kw"]["q_lora_rank"] is not None]
    return ATTN


def target_modules(family, hot=None, model=None):
    """PEFT's target_modules. With a hot set ({MoE layer: [experts]}) the MLP projections go by
    full name, each adapted one of the HF model (dense MLPs, shared expert, hot experts)."""
    mlp = MLP.get(family, MLP_DEFAULT)
    if hot is None:
        return attn_targets(family) + mlp
    return attn_targets(family) + [n for n, m in model.named_modules()
                                   if isinstance(m, torch.nn.Linear) and n.split(".")[-1] in mlp
                                   and adapted(family, hot, n)]


def adapted(family, hot, module):
    """Whether the fixture means module (a HF module name, with or without PEFT's prefix) to get
    an adapter: attention and MLP projections, of the routed experts the hot ones only."""
    last = module.split(".")[-1]
    if last in attn_targets(family):
        return True
    if last not in MLP.get(family, MLP_DEFAULT):
        return False
    m = re.search(r"layers\.(\d+)\.(?:.*\.)?experts\.(\d+)\.", module)
    return hot is None or m is None or int(m.group(2)) in hot[int(m.group(1))]


def hot_count(E):
    return 2 if E <= 8 else math.ceil(E / 4)


def by_count(counts):
    """A MoE layer's experts, the most routed first, ties to the lower index."""
    return sorted(range(len(counts)), key=lambda e: (-counts[e], e))


def hot_set(counts):
    """A MoE layer's hot experts from its routed counts: the hot_count(E) - 1 most routed and the
    least routed (ties to the lower index); the least routed is the one to go idle with adapters."""
    least = min(range(len(counts)), key=lambda e: (counts[e], e))
    return sorted([e for e in by_count(counts) if e != least][:hot_count(len(counts)) - 1] + [least])


def routed_counts(router_logits, k, E):
    """Per MoE layer, the tokens each expert is routed (top-k) in the batch."""
    return [torch.bincount(lg.detach().topk(k, dim=-1).indices.reshape(-1), minlength=E).tolist()
            for lg in router_logits]


def forward_counts(model, ids):
    cfg = model.config
    with torch.no_grad():
        out = model(input_ids=ids, output_router_logits=True, use_cache=False)
    return routed_counts(out.router_logits, cfg.num_experts_per_tok, mfx.num_experts(cfg))


def hot_routing(hot, moe_layers, counts):
    """Whether, with these routed counts, (a cold expert is busy in every MoE layer, a hot one idle in some)."""
    cold_busy = all(any(c[e] for e in range(len(c)) if e not in hot[li]) for li, c in zip(moe_layers, counts))
    hot_idle = any(not c[e] for li, c in zip(moe_layers, counts) for e in hot[li])
    return cold_busy, hot_idle


def pinned(pkg):
    """The version of pkg that tools/requirements-fixtures.txt pins."""
    with open(os.path.join(HERE, "requirements-fixtures.txt")) as f:
        m = re.search(rf"^{re.escape(pkg)}==(\S+)$", f.read(), re.M)
    need(m, f"tools/requirements-fixtures.txt pins no {pkg}")
    return m.group(1)


# ----------------------------------------------------------------------------- sources
FORWARD_LINE = "result = result + lora_B(lora_A(dropout(x))) * scaling"


def source_facts():
    """(citation, object, snippet that must occur in its source). Checked at start-up."""
    from peft import config as pconfig
    from peft import peft_model
    from peft.tuners import tuners_utils
    from peft.tuners.lora import config as lconfig
    from peft.tuners.lora import layer as llayer
    from peft.utils import save_and_load
    return [
        ("peft/tuners/lora/layer.py LoraLayer.update_layer", llayer.LoraLayer.update_layer,
         "self.lora_A[adapter_name] = nn.Linear(self.in_features, r, bias=False)"),
        ("peft/tuners/lora/layer.py LoraLayer.update_layer", llayer.LoraLayer.update_layer,
         "self.lora_B[adapter_name] = nn.Linear(r, self.out_features, bias=lora_bias)"),
        ("peft/tuners/lora/layer.py LoraLayer.update_layer", llayer.LoraLayer.update_layer,
         "self.scaling[adapter_name] = lora_alpha / r"),
        ("peft/tuners/lora/layer.py LoraLayer.update_layer", llayer.LoraLayer.update_layer,
         "self.scaling[adapter_name] = lora_alpha / math.sqrt(r)"),
        ("peft/tuners/lora/layer.py LoraLayer.update_layer", llayer.LoraLayer.update_layer,
         "lora_dropout_layer = nn.Identity()"),
        ("peft/tuners/lora/layer.py LoraLayer.reset_lora_parameters", llayer.LoraLayer.reset_lora_parameters,
         "nn.init.kaiming_uniform_(self.lora_A[adapter_name].weight, a=math.sqrt(5))"),
        ("peft/tuners/lora/layer.py LoraLayer.reset_lora_parameters", llayer.LoraLayer.reset_lora_parameters,
         "nn.init.zeros_(self.lora_B[adapter_name].weight)"),
        ("peft/tuners/lora/layer.py Linear.forward", llayer.Linear.forward,
         "result = self.base_layer(x, *args, **kwargs)"),
        ("peft/tuners/lora/layer.py Linear.forward", llayer.Linear.forward, FORWARD_LINE),
        ("peft/tuners/tuners_utils.py check_target_module_exists", tuners_utils.check_target_module_exists,
         "elif key in config.target_modules:"),
        ("peft/tuners/tuners_utils.py check_target_module_exists", tuners_utils.check_target_module_exists,
         'target_module_found = any(key.endswith(f".{target_key}") for target_key in config.target_modules)'),
        ("peft/tuners/tuners_utils.py BaseTuner.inject_adapter", tuners_utils.BaseTuner.inject_adapter,
         "key_list = [key for key, _ in named_modules]"),
        ("peft/tuners/tuners_utils.py BaseTuner.inject_adapter", tuners_utils.BaseTuner.inject_adapter,
         "and (len(peft_config.target_modules) >= MIN_TARGET_MODULES_FOR_OPTIMIZATION)"),
        ("peft/tuners/tuners_utils.py BaseTuner.inject_adapter", tuners_utils.BaseTuner.inject_adapter,
         "new_target_modules = _find_minimal_target_modules(peft_config.target_modules, names_no_target)"),
        ("peft/tuners/tuners_utils.py BaseTuner.inject_adapter", tuners_utils.BaseTuner.inject_adapter,
         "peft_config.target_modules = new_target_modules"),
        ("peft/utils/save_and_load.py get_peft_model_state_dict", save_and_load.get_peft_model_state_dict,
         'to_return = {k: state_dict[k] for k in state_dict if "lora_" in k}'),
        ("peft/utils/save_and_load.py get_peft_model_state_dict", save_and_load.get_peft_model_state_dict,
         'pattern = re.compile(re.escape(f".{adapter_name}") + r"$")'),
        ("peft/peft_model.py PeftModel.__init__", peft_model.PeftModel.__init__,
         "self.base_model = cls(model, {adapter_name: peft_config}, adapter_name)"),
        ("peft/tuners/tuners_utils.py BaseTuner.__init__", tuners_utils.BaseTuner.__init__, "self.model = model"),
        ("peft/peft_model.py PeftModel.save_pretrained", peft_model.PeftModel.save_pretrained,
         'metadata={"format": "pt"},'),
        ("peft/peft_model.py PeftModel.save_pretrained", peft_model.PeftModel.save_pretrained,
         "peft_config.inference_mode = True"),
        ("peft/config.py PeftConfigMixin.save_pretrained", pconfig.PeftConfigMixin.save_pretrained,
         "output_dict[key] = list(value)"),
        ("peft/config.py PeftConfigMixin.save_pretrained", pconfig.PeftConfigMixin.save_pretrained,
         "writer.write(json.dumps(output_dict, indent=2, sort_keys=True))"),
        ("peft/tuners/lora/config.py LoraConfig.__post_init__", lconfig.LoraConfig.__post_init__,
         "set(self.target_modules) if isinstance(self.target_modules, list) else self.target_modules"),
    ]


def check_sources():
    mfx.check_sources()
    mfx.check_facts(source_facts(), "peft source fact")
    from peft.utils import constants
    need(constants.SAFETENSORS_WEIGHTS_NAME == "adapter_model.safetensors", "peft weights file name")
    need(constants.CONFIG_NAME == "adapter_config.json", "peft config file name")
    need(constants.MIN_TARGET_MODULES_FOR_OPTIMIZATION == MIN_CONDENSED, "peft target_modules condensing threshold")


# ----------------------------------------------------------------------------- model
def saved_name(param_name):
    """PeftModel parameter name -> its key in adapter_model.safetensors (adapter name dropped)."""
    return re.sub(r"\.(lora_[AB])\.default\.weight$", r".\1.weight", param_name)


def lora_modules(pm):
    from peft.tuners.lora import layer as llayer
    return {n: m for n, m in pm.named_modules() if isinstance(m, llayer.LoraLayer)}


def check_targets(lf, pm, hf):
    """Every routed expert is its own module with nn.Linear projections (a ModuleList of
    MLPs), so PEFT wraps each (of a hot set, each hot one and no other); the adapters sit
    exactly on the named projections and never on a router (mlp.gate /
    block_sparse_moe.gate / mlp.router) or on shared_expert_gate. gpt-oss (no MLP targets): its
    MoE block holds no nn.Linear at all (fused experts, a plain router), so none is wrapped."""
    from peft.tuners.lora import layer as llayer
    name, family, hot = lf["name"], lf["family"], lf["hot"]
    for i, layer in enumerate(hf.model.layers):
        blk = mfx.moe_block(layer)
        if blk is None:
            continue
        if not MLP.get(family, MLP_DEFAULT):
            need(not isinstance(blk.experts, torch.nn.ModuleList) and
                 not any(isinstance(m, (torch.nn.Linear, llayer.LoraLayer)) for m in blk.modules()),
                 f"{name}: layer {i} MoE block holds a linear module")
            continue
        need(isinstance(blk.experts, torch.nn.ModuleList), f"{name}: layer {i} experts are not a ModuleList")
        for e, ex in enumerate(blk.experts):
            for p in MLP.get(family, MLP_DEFAULT):
                wrapped = hot is None or e in hot[i]
                need(isinstance(getattr(ex, p), llayer.Linear) == wrapped,
                     f"{name}: layer {i} expert {e} {p} {'not ' if wrapped else ''}wrapped")
                need(isinstance(getattr(ex, p).get_base_layer() if wrapped else getattr(ex, p), torch.nn.Linear),
                     f"{name}: {p} not nn.Linear")
    mods = lora_modules(pm)
    for n, m in mods.items():
        need(adapted(family, hot, n), f"{name}: unexpected LoRA module {n}")
        need(isinstance(m, llayer.Linear), f"{name}: {n} is {type(m).__name__}")
        need(m.scaling["default"] == SCALING, f"{name}: {n} scaling {m.scaling['default']}")
        need(isinstance(m.lora_dropout["default"], torch.nn.Identity), f"{name}: {n} dropout")
        need(m.lora_B["default"].bias is None, f"{name}: {n} has a lora_B bias")
    want = sorted(f"base_model.model.{n}" for n, m in hf.named_modules()
                  if isinstance(m, llayer.Linear) or (isinstance(m, torch.nn.Linear) and adapted(family, hot, n)))
    need(sorted(mods) == want, f"{name}: LoRA modules differ from the target projections")
    routers = [n for n in mods if n.endswith((".gate", ".router")) or "shared_expert_gate" in n]
    need(not routers, f"{name}: router got an adapter: {routers}")
    return mods


def check_router_untargetable(lf, seed):
    """GLM-4.5's / DeepSeek-V3's router (mlp.gate, a Glm4MoeTopkRouter / DeepseekV3TopkRouter: a weight
    Parameter and F.linear, no nn.Linear), and gpt-oss's router (mlp.router, GptOssTopKRouter: weight and
    bias Parameters, F.linear) and experts (mlp.experts, GptOssExperts: fused Parameters) cannot get an
    adapter: PEFT refuses each as a target (UNTARGETABLE)."""
    for target, cls in UNTARGETABLE[lf["fx"]["config"].model_type].items():
        model, _ = mfx.build(lf["fx"], seed)
        try:
            get_peft_model(model, LoraConfig(r=R, lora_alpha=ALPHA, target_modules=[target]))
        except ValueError as e:
            need(f"Target module {cls}() is not supported" in str(e), f"{lf['name']}: PEFT says {e}")
            continue
        mfx.fail(f"{lf['name']}: PEFT put an adapter on {target}")


def check_peft_init(name, pm):
    """PEFT's default init (before ours): lora_B == 0, lora_A ~ kaiming_uniform(a=sqrt(5))
    = U(-1/sqrt(in), 1/sqrt(in))."""
    for n, m in lora_modules(pm).items():
        a, b = m.lora_A["default"].weight, m.lora_B["default"].weight
        need(not b.any(), f"{name}: PEFT init of {n}.lora_B is not zero")
        bound = 1 / math.sqrt(a.shape[1])
        need(a.abs().max().item() <= bound and a.abs().max().item() > 0.5 * bound,
             f"{name}: PEFT init of {n}.lora_A not within U(+-{bound})")


def init_adapters(pm, seed):
    rng = np.random.default_rng(seed)
    params = dict(pm.named_parameters())
    names = sorted(n for n, p in params.items() if p.requires_grad)
    need(all(".lora_A.default." in n or ".lora_B.default." in n for n in names), "a trainable non-LoRA param")
    with torch.no_grad():
        for n in names:
            std = ADAPTER_STD_A if ".lora_A." in n else ADAPTER_STD_B
            z = rng.standard_normal(tuple(params[n].shape))
            params[n].copy_(torch.from_numpy((std * z).astype(np.float32)))
    return names


def lora_model(name, model, tm, adapter_seed, check_init=False):
    """model wrapped by get_peft_model with these fixtures' LoraConfig on target_modules tm, PEFT's
    init checked (check_init), the adapters overwritten from adapter_seed, in train mode."""
    pm = get_peft_model(model, LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, bias="none", target_modules=tm,
                                          task_type="CAUSAL_LM"))
    if check_init:
        check_peft_init(name, pm)
    init_adapters(pm, adapter_seed)
    pm.train()
    return pm


def build_lora(lf, seed, adapter_seed, check_init=False):
    """The PeftModel, the batch, and the target_modules it was given."""
    model, ids = mfx.build(lf["fx"], seed)
    tm = target_modules(lf["family"], lf["hot"], model)
    return lora_model(lf["name"], model, tm, adapter_seed, check_init), ids, tm


def pick_adapter_seed(lf, seed, moe_layers):
    """The first adapter seed whose routing is usable (and, with a hot set, keeps a cold expert
    busy in every MoE layer and a hot one idle in some)."""
    first = seed + ADAPTER_SEED_OFFSET
    for a in range(first, first + ADAPTER_SEED_TRIES):
        pm, ids, _ = build_lora(lf, seed, a)
        if mfx.usable_routing(lf["fx"], pm, pm.get_base_model().config, ids) and (
                lf["hot"] is None or all(hot_routing(lf["hot"], moe_layers, forward_counts(pm, ids)))):
            return a
    mfx.fail(f"{lf['name']}: no usable adapter seed in [{first}, {first + ADAPTER_SEED_TRIES})")


def capture_lora(mods):
    """Forward hooks on the LoRA modules: captured[module name] = (module, input, output, (A, B) at
    the forward). Returns captured and the hooks."""
    captured, hooks = {}, []
    for n, m in mods.items():
        hooks.append(m.register_forward_hook(
            lambda m_, inp, out, n=n: captured.__setitem__(n, (m_, inp[0].detach().clone(), out.detach().clone(), (
                m_.lora_A["default"].weight.detach().clone(), m_.lora_B["default"].weight.detach().clone())))))
    return captured, hooks


def check_lora_forward(name, captured, deq=None):
    """Each LoRA Linear gives x W^T (+ b) + scaling * (x A^T) B^T (fp64 reference), W the base
    layer's weight or, with deq ({weight name: dequantized weight}), its dequantized weight."""
    worst = 0.0
    for n, (m, x, y, (a, b)) in captured.items():  # (the adapters at the forward, before the step)
        d = lambda t: t.detach().double()  # noqa: E731
        base = m.get_base_layer()
        ref = d(x) @ d(base.weight if deq is None else deq[n.removeprefix("base_model.model.") + ".weight"]).T
        if base.bias is not None:
            ref = ref + d(base.bias)
        ref = ref + SCALING * (d(x) @ d(a).T) @ d(b).T
        if y.numel():  # (OLMoE runs its idle experts on zero tokens)
            worst = max(worst, (ref - d(y)).abs().max().item())
    w = "W" if deq is None else "deq(W)"
    need(worst < 1e-5, f"{name}: a LoRA layer differs from x {w}^T + s (x A^T) B^T by {worst}")
    return worst


def run_step(pm, ids, labels, trainable):
    """Forward with labels and router logits (GLM-4.5, DeepSeek-V3 record none: mfx.forward_kw; read them
    with mfx.gate_hooks), backward, one AdamW step over the trainable tensors."""
    params = dict(pm.named_parameters())
    out = pm(input_ids=ids, labels=labels, use_cache=False, **mfx.forward_kw(pm.config))
    out.loss.backward()
    grads = {n: params[n].grad.detach().clone() for n in trainable if params[n].grad is not None}
    before = {n: params[n].detach().clone() for n in trainable}
    opt = torch.optim.AdamW([params[n] for n in trainable], lr=mfx.LR, betas=(mfx.BETA1, mfx.BETA2), eps=mfx.EPS,
                            weight_decay=mfx.WD, foreach=False)
    opt.step()
    after = {n: params[n].detach().clone() for n in trainable}
    return out, grads, before, after, opt


def condensed(tm, model):
    """What BaseTuner.inject_adapter condenses target_modules tm to when it is MIN_CONDENSED long or more."""
    from peft.tuners.tuners_utils import _find_minimal_target_modules
    suffixes = tuple("." + t for t in tm)
    others = [n for n, _ in model.named_modules() if n not in tm and not n.endswith(suffixes)]
    return sorted(_find_minimal_target_modules(tm, others))


def st_bytes_equal(a, b):
    return os.path.exists(a) and os.path.exists(b) and filecmp.cmp(a, b, shallow=False)


# ----------------------------------------------------------------------------- one fixture
# (make_qlora_fixtures' make_fixture calls these too)
def build_base(lf):
    """The base of fixture lf as make_fixtures builds tests/fixtures/<family> (its seed: asserted),
    its batch and its MoE layers. Returns seed, model, ids, moe_layers."""
    name, family, fx = lf["name"], lf["family"], lf["fx"]
    seed = mfx.pick_seed(fx)
    _, base_meta = mfx.read_st(os.path.join(FIXTURES_DIR, family, "fixture.safetensors"))
    need(base_meta["seed"] == str(seed), f"{name}: seed {seed}, tests/fixtures/{family} has {base_meta['seed']}")
    base, ids = mfx.build(fx, seed)
    moe_layers = [i for i, l in enumerate(base.model.layers) if mfx.moe_block(l) is not None]
    return seed, base, ids, moe_layers


def save_base(lf, base, tmp, d):
    """The base saved to tmp as make_fixtures writes it, byte for byte (asserted against
    tests/fixtures/<family>), and its config.json copied to the fixture directory d."""
    name, family = lf["name"], lf["family"]
    base.save_pretrained(tmp, safe_serialization=True)
    for f in ("config.json", "model.safetensors"):
        need(st_bytes_equal(os.path.join(tmp, f), os.path.join(FIXTURES_DIR, family, f)),
             f"{name}: base {f} differs from tests/fixtures/{family}/{f}")
    shutil.copyfile(os.path.join(tmp, "config.json"), os.path.join(d, "config.json"))


def save_adapter(name, pm, d):
    """PEFT's own files in d, the initial adapters: PeftModel.save_pretrained, the model card
    deleted, mode 0644; adapter_model.safetensors holds the trainable tensors, two per LoRA module.
    Returns the parameters, the trainable names (sorted), {trainable name: saved name}, the file's keys."""
    pm.save_pretrained(d)
    for f in os.listdir(d):
        if f not in OUT_FILES:
            os.remove(os.path.join(d, f))  # README.md (model card)
        else:
            os.chmod(os.path.join(d, f), 0o644)
    params = dict(pm.named_parameters())
    trainable = sorted(n for n, p in params.items() if p.requires_grad)
    names = {n: saved_name(n) for n in trainable}
    with safe_open(os.path.join(d, "adapter_model.safetensors"), framework="pt") as f:
        file_keys, file_meta = sorted(f.keys()), f.metadata()
        need(file_meta == {"format": "pt"}, f"{name}: adapter file metadata {file_meta}")
        for n in trainable:
            need(torch.equal(f.get_tensor(names[n]), params[n].detach()), f"{name}: saved {names[n]} differs")
    n_mods = len(lora_modules(pm))
    need(len(file_keys) == 2 * n_mods, f"{name}: {len(file_keys)} tensors for {n_mods} LoRA modules")
    return params, trainable, names, file_keys


def adapters_off(pm, ids, family):
    """The logits of pm with its adapters disabled, and those of tests/fixtures/<family>."""
    with torch.no_grad(), pm.disable_adapter():
        logits = pm(input_ids=ids, use_cache=False).logits
    base_ref, _ = mfx.read_st(os.path.join(FIXTURES_DIR, family, "fixture.safetensors"))
    return logits, base_ref["logits"]


def check_outputs(name, cfg, out, labels, moe_layers, base_logits, gates=None):
    """The forward's outputs: finite, logits moved from base_logits (the adapters' base) but not far,
    loss = ce + coef * aux, make_fixtures' aux loss, the routing margin (GLM-4.5, DeepSeek-V3: from gates,
    the capture of mfx.gate_hooks; no aux loss, aux = 0; gpt-oss: the routers' scores checked and the
    margin read from gates, the aux loss that of the recorded scores). Returns logits, their largest move,
    ce, aux, loss, the margin and the idle experts (layer, e)."""
    k, E, V = cfg.num_experts_per_tok, mfx.num_experts(cfg), cfg.vocab_size
    group = mfx.is_group_router(cfg)
    need(len(gates if mfx.has_hooked_router(cfg) else out.router_logits) == len(moe_layers),
         f"{name}: router logits for MoE layers {moe_layers}")
    logits = out.logits.detach()
    shift = (logits - base_logits).abs().max().item()
    need(0.1 < shift < 10 and logits.abs().max().item() < 20, f"{name}: logits moved by {shift} from the base")
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, V).float(), labels[:, 1:].reshape(-1), ignore_index=-100)
    aux = torch.zeros((), dtype=torch.float32) if group else out.aux_loss.detach()
    loss = out.loss.detach()
    need(torch.isfinite(loss) and torch.isfinite(aux) and torch.isfinite(logits).all(), f"{name}: non-finite")
    need(abs(loss.item() - (ce.item() + mfx.aux_coef(cfg) * aux.item())) <= 1e-6 * abs(loss.item()),
         f"{name}: loss {loss.item()} != ce + coef*aux")
    if group:
        need(getattr(out, "aux_loss", None) is None and getattr(out, "router_logits", None) is None,
             f"{name}: {mfx.GROUP_ROUTER[cfg.model_type][0]} returned an aux loss or router logits")
        mfx.check_group_router(name, cfg, gates, mfx.group_router_logits(gates))
        margin, idle, _, same, sensitive = mfx.group_routing_stats(cfg, gates)
        need(same and sensitive, f"{name}: float64 routing is transformers' {same}, bias / group matter {sensitive}")
    elif mfx.is_gpt_oss(cfg):  # out.router_logits are the routers' scores (softmax over the top-k in zeros)
        need(len(out.router_logits) == len(moe_layers), f"{name}: recorded router scores for {moe_layers}")
        mfx.check_gpt_oss_router(name, cfg, gates, mfx.gpt_oss_router_logits(gates), out.router_logits)
        mfx.check_aux(name, out.router_logits, k, E, aux.item())
        margin, idle, _, same, sensitive = mfx.group_routing_stats(cfg, gates)
        need(same and sensitive, f"{name}: float64 routing is transformers' {same}, the bias matters {sensitive}")
    else:
        mfx.check_aux(name, out.router_logits, k, E, aux.item())
        margin, idle = mfx.routing_stats(out.router_logits, k, E)
    need(margin >= mfx.MIN_ROUTING_MARGIN, f"{name}: routing margin {margin}")
    return logits, shift, ce, aux, loss, margin, [(moe_layers[li], e) for li, e in idle]


def check_grads(lf, hf, params, trainable, grads, idle, opt, dead=None):
    """Only the adapters get grads, finite; grad None exactly for the idle experts' adapters (OLMoE:
    all-zero grads instead), all-zero grads elsewhere only on last-layer experts (with dead, the
    (layer, e) of mfx.dead_experts: exactly on those experts' adapters); AdamW kept no state for a
    None grad. Returns the trainable names whose grad is None, and those whose grad is all zero."""
    name, cfg = lf["name"], hf.config
    for n, p in params.items():
        need(p.requires_grad == (n in trainable), f"{name}: {n} requires_grad {p.requires_grad}")
        need(p.requires_grad or p.grad is None, f"{name}: frozen {n} got a grad")
    no_grad = sorted(n for n in trainable if n not in grads)
    for n, g in grads.items():
        need(torch.isfinite(g).all(), f"{name}: grad of {n} not finite")
    pref = "base_model.model."
    idle_params = sorted(n for (li, e) in idle for n in trainable
                         if n.startswith(pref + mfx.expert_prefix(hf, li, e)))
    zero = sorted(n for n, g in grads.items() if not g.any())
    if cfg.model_type == "olmoe":  # loops over every expert: idle experts' adapters get all-zero grads
        need(not no_grad, f"{name}: unexpected no_grad {no_grad}")
        need(set(idle_params) <= set(zero), f"{name}: an idle expert's adapter has a non-zero grad")
    else:  # loops over the experts hit only: an idle expert's adapters are not in the graph
        need(no_grad == idle_params, f"{name}: no_grad {no_grad} != idle experts' adapters {idle_params}")
    last = pref + f"model.layers.{cfg.num_hidden_layers - 1}."
    stray = [n for n in zero if n not in idle_params and not (n.startswith(last) and ".experts." in n)]
    if dead is not None:
        dead_params = {n for (li, e) in dead for n in trainable if n.startswith(pref + mfx.expert_prefix(hf, li, e))}
        stray = sorted(set(zero) ^ (dead_params | (set(idle_params) if cfg.model_type == "olmoe" else set())))
    need(not stray, f"{name}: all-zero grads other than the idle / dead experts' adapters: {stray}")
    # (gpt-oss: no expert has adapters, so an idle expert shows in the routing only)
    need(not lf["fx"]["need_idle_expert"] or (idle_params if MLP.get(lf["family"], MLP_DEFAULT) else idle),
         f"{name}: no idle expert")
    need(all(params[n] not in opt.state for n in no_grad), f"{name}: AdamW kept state for a no-grad param")
    return no_grad, zero


def add_adapter_tensors(tensors, names, grads, after):
    """grad.<n> and after.<n> of each adapter tensor, named as in adapter_model.safetensors."""
    for n, g in grads.items():
        tensors[f"grad.{names[n]}"] = g.numpy().astype("<f4")
    for n, p in after.items():
        tensors[f"after.{names[n]}"] = p.numpy().astype("<f4")


def fixture_meta(lf, cfg, seed, adapter_seed, tm, loss_mask, moe_layers, idle, no_grad, zero, margin):
    """fixture.safetensors' __metadata__ (no_grad, zero: saved names)."""
    family = lf["family"]
    with open(os.path.join(FIXTURES_DIR, family, "model.safetensors"), "rb") as f:
        base_sha = hashlib.sha256(f.read()).hexdigest()
    return {
        "format": "pt",
        "fixture": lf["name"],
        "model_type": cfg.model_type,
        "seed": str(seed),
        "adapter_seed": str(adapter_seed),
        "base": f"../../{family}/model.safetensors (config.json here is byte-identical to ../../{family}/config.json)",
        "base_sha256": base_sha,
        "r": str(R),
        "lora_alpha": str(ALPHA),
        "scaling": repr(SCALING),
        "lora_dropout": "0.0",
        "target_modules": json.dumps(sorted(tm)),
        "adapter_init": (f"after get_peft_model: numpy default_rng(adapter_seed) (PCG64); for each trainable "
                         f"parameter in sorted PeftModel name order (…lora_A.default.weight, …lora_B.default.weight),"
                         f" z = standard_normal(shape) float64; lora_A {ADAPTER_STD_A}*z, lora_B {ADAPTER_STD_B}*z; "
                         f"cast to float32. = adapter_model.safetensors"),
        "batch": f"B={mfx.B} S={mfx.S}; labels = input_ids with -100 at (b,s) {mfx.MASKED_LABELS}",
        "loss_mask": "labels coordinates: 1 iff labels[b,s] != -100 and s >= 1 (target of logits[b,s-1])",
        "n_targets": str(int(loss_mask.sum())),
        "loss": (f"loss = ce_loss ({mfx.GROUP_ROUTER[cfg.model_type][0]} has no aux loss: aux_loss is written as 0); "
                 "ce_loss = mean over the n_targets targets" if mfx.is_group_router(cfg) else
                 "loss = ce_loss + router_aux_loss_coef * aux_loss; ce_loss = mean over the n_targets targets"),
        "router_aux_loss_coef": repr(mfx.aux_coef(cfg)),
        "optimizer": ("torch.optim.AdamW(foreach=False), one step, one param group holding the trainable "
                      "adapter tensors only (sorted by name); base parameters frozen"),
        "lr": repr(mfx.LR),
        "beta1": repr(mfx.BETA1),
        "beta2": repr(mfx.BETA2),
        "eps": repr(mfx.EPS),
        "weight_decay": repr(mfx.WD),
        "moe_layers": json.dumps(moe_layers),
        "idle_experts": json.dumps([list(x) for x in idle]),
        "no_grad": json.dumps(no_grad),
        "zero_grad": json.dumps(zero),
        "min_routing_margin": f"{margin:.3e}",
        "peft_version": peft.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "transformers_version": transformers.__version__,
        "safetensors_version": safetensors.__version__,
        "numpy_version": np.__version__,
    } | ({
        "router_logits": ("raw router logits x W^T + b [B*S,E] of each MoE layer (GptOssTopKRouter's F.linear of its "
                          "input, mlp.router.weight and mlp.router.bias), as in ../../gpt_oss"),
        "aux_loss_rule": ("load_balancing_loss_func of the router scores the model records (the softmax over the "
                          "top-k logits scattered into zeros), not of the raw logits, as in ../../gpt_oss"),
    } if mfx.is_gpt_oss(cfg) else {})


def check_reload(name, base, d, ids, logits, what="base"):
    """The checked-in files alone reproduce the logits: base (loaded from tests/fixtures/<family>)
    with the adapter of d through PeftModel.from_pretrained, train mode."""
    again = PeftModel.from_pretrained(base, d)
    again.train()
    with torch.no_grad():
        rl = again(input_ids=ids, use_cache=False).logits
    need(torch.equal(rl, logits), f"{name}: {what} + {d} reloaded gives other logits")


def make_fixture(lf, outdir):
    name, family = lf["name"], lf["family"]
    base_dir = os.path.join(FIXTURES_DIR, family)
    seed, base, base_ids, moe_layers = build_base(lf)
    base_counts = forward_counts(base, base_ids) if name in HOT else None
    if name in HOT:
        lf = dict(lf, hot={li: hot_set(c) for li, c in zip(moe_layers, base_counts)})
    hot = lf["hot"]
    adapter_seed = pick_adapter_seed(lf, seed, moe_layers)

    d = mfx.fixture_dir(outdir, name)
    pm, ids, tm = build_lora(lf, seed, adapter_seed, check_init=True)
    hf = pm.get_base_model()
    cfg = hf.config
    k, E = cfg.num_experts_per_tok, mfx.num_experts(cfg)
    need(torch.equal(ids, base_ids), f"{name}: another batch")
    mods = check_targets(lf, pm, hf)

    # The base as make_fixtures writes it, byte for byte (from its own build: saving the
    # wrapped model would write base_layer names and the adapters).
    with tempfile.TemporaryDirectory() as tmp:
        save_base(lf, base, tmp, d)

    # PEFT's own files, the initial adapters.
    params, trainable, names, file_keys = save_adapter(name, pm, d)
    with open(os.path.join(d, "adapter_config.json")) as f:
        acfg = json.load(f)
    need(acfg["r"] == R and acfg["lora_alpha"] == ALPHA and acfg["use_rslora"] is False and
         acfg["use_dora"] is False and acfg["bias"] == "none" and acfg["lora_dropout"] == 0.0 and
         acfg["peft_type"] == "LORA" and acfg["task_type"] == "CAUSAL_LM" and acfg["fan_in_fan_out"] is False,
         f"{name}: adapter_config.json {acfg}")
    need(sorted(acfg["target_modules"]) == sorted(tm) and len(tm) < MIN_CONDENSED,
         f"{name}: target_modules in the file (PEFT condenses a list of {MIN_CONDENSED} or more)")
    need(file_keys == sorted(names.values()), f"{name}: adapter file keys != trainable params less '.default'")
    need(all(k_.startswith("base_model.model.") and ".default" not in k_ for k_ in file_keys), f"{name}: key form")

    labels, loss_mask = mfx.make_labels(ids)
    base_logits, ref_logits = adapters_off(pm, ids, family)
    need(np.allclose(base_logits.numpy(), ref_logits, rtol=mfx.CHECK_RTOL, atol=mfx.CHECK_ATOL),
         f"{name}: adapters disabled does not give tests/fixtures/{family} logits")

    captured, hooks = capture_lora(mods)
    gates, gate_hks = mfx.gate_hooks(pm)
    out, grads, before, after, opt = run_step(pm, ids, labels, trainable)
    for h in hooks + gate_hks:
        h.remove()
    lora_err = check_lora_forward(name, captured)

    logits, shift, ce, aux, loss, margin, idle = check_outputs(name, cfg, out, labels, moe_layers, base_logits,
                                                               gates)
    if mfx.has_hooked_router(cfg):  # (gpt-oss: the raw logits x W^T + b, as tests/fixtures/gpt_oss has them)
        router_logits = (mfx.gpt_oss_router_logits if mfx.is_gpt_oss(cfg) else mfx.group_router_logits)(gates)
        sels = mfx.group_routing_stats(cfg, gates)[2]
        check_router_untargetable(lf, seed)
    else:
        router_logits = out.router_logits
        sels = [lg.detach().topk(k, dim=-1).indices for lg in router_logits]
    counts = [torch.bincount(sel.reshape(-1), minlength=E).tolist() for sel in sels]
    need(hot is None or all(hot_routing(hot, moe_layers, counts)), f"{name}: hot set {hot}, routed {counts}")
    dead = mfx.dead_experts(sels, moe_layers, loss_mask, cfg.num_hidden_layers, E, mfx.aux_coef(cfg) > 0)
    no_grad, zero = check_grads(lf, hf, params, trainable, grads, idle, opt, dead)
    adam_err = mfx.check_adamw(name, before, after, grads)

    tensors = mfx.batch_tensors(ids, labels, loss_mask, logits, loss, ce, aux, moe_layers, router_logits)
    add_adapter_tensors(tensors, names, grads, after)
    if hot is not None:
        tensors["lora_hot"] = np.array([[int(e in hot.get(i, ())) for e in range(E)]
                                        for i in range(cfg.num_hidden_layers)], dtype="<i4")
    meta = fixture_meta(lf, cfg, seed, adapter_seed, tm, loss_mask, moe_layers, idle,
                        [names[n] for n in no_grad], [names[n] for n in zero], margin)
    if hot is not None:
        meta.update({
            "base_fixture": family,
            "lora_hot": (f"[layers, experts] I32: 1 where the routed expert's "
                         f"{'/'.join(MLP.get(family, MLP_DEFAULT))} have adapters (target_modules names them "
                         f"in full); dense layers all 0"),
            "hot_experts": json.dumps({str(li): hot[li] for li in moe_layers}),
            "hot_rule": f"{hot_count(E)} of {E} experts in each MoE layer: {hot_rule(E, k)}",
            "hot_base_counts": json.dumps({str(li): c for li, c in zip(moe_layers, base_counts)}),
            "hot_counts": json.dumps({str(li): c for li, c in zip(moe_layers, counts)}),
        })

    # The checked-in files alone reproduce the logits: base from tests/fixtures/<family>,
    # adapter through PeftModel.from_pretrained.
    check_reload(name, AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager"), d, ids, logits)
    mfx.write_fixture(name, os.path.join(d, "fixture.safetensors"), tensors, meta)

    shapes, experts = {}, {}  # module path with "{}" for the expert -> shapes; -> its experts
    for n, m in mods.items():
        n = n.removeprefix("base_model.model.")
        path = re.sub(r"\.experts\.\d+\.", ".experts.{}.", n)
        a, b = tuple(m.lora_A["default"].weight.shape), tuple(m.lora_B["default"].weight.shape)
        need(shapes.setdefault(path, (a, b)) == (a, b), f"{name}: experts' adapter shapes differ")
        if path != n:
            experts.setdefault(path, []).append(int(re.search(r"\.experts\.(\d+)\.", n).group(1)))
    span = lambda es: f"{es[0]}..{es[-1]}" if es == list(range(E)) else ",".join(map(str, es))  # noqa: E731
    shapes = [f"{p.replace('{}', '{' + span(experts[p]) + '}') if p in experts else p:<52s} A {list(a)}  B {list(b)}"
              for p, (a, b) in shapes.items()]
    return dict(name=name, family=cfg.model_type, base=family, seed=seed, adapter_seed=adapter_seed,
                moe_layers=moe_layers, n_modules=len(mods), n_tensors=len(names),
                n_params=sum(params[n].numel() for n in trainable), no_grad=[names[n] for n in no_grad],
                zero=[names[n] for n in zero], idle=idle, loss=loss.item(), ce=ce.item(), aux=aux.item(), shift=shift,
                margin=margin, lora_err=lora_err, adam_err=adam_err, acfg=acfg, modules=shapes, hot=hot, tm=tm,
                base_counts=base_counts, counts=counts, E=E, k=k, layers=cfg.num_hidden_layers,
                condensed=condensed(tm, base) if hot is not None else None, need_idle=lf["fx"]["need_idle_expert"])


# ----------------------------------------------------------------------------- NOTES.md
NOTES = """\
# LoRA parity fixtures: what PEFT writes and computes

Written by `tools/make_lora_fixtures.py` (do not edit; rerun it). peft {peft},
transformers {tf}, torch {torch}, float32 on the CPU. Every PEFT fact below is read
from the installed sources (file and function named) and asserted by the script
(`source_facts`), and where marked *(checked)*, numerically on every fixture. The
model maths (loss, aux loss, MoE block, AdamW) is that of `../NOTES.md`.

## Files (`<name>/`)
- base model: `../<base>/config.json` + `../<base>/model.safetensors`, not copied; `<base>`
  is `<name>`, for a hot-expert fixture the family it adapts (the metadata's
  `base_fixture`; below). The script builds the base exactly as `tools/make_fixtures.py`
  does (its `build()`, the same seed) and asserts that `save_pretrained` writes both files
  byte for byte as they are there; `<name>/config.json` is a copy (byte-identical),
  `base_sha256` in the metadata is the hash of `../<base>/model.safetensors`.
- `adapter_config.json`, `adapter_model.safetensors`: written by PEFT's own
  `PeftModel.save_pretrained(dir)` with the **initial** adapters (those of `logits`,
  `grad.*`), untouched except that the file mode is set to 0644 (PEFT writes the
  safetensors file 0600) and the model card `README.md` PEFT also writes is deleted.
  This is what moefit's exporter must reproduce (names, shapes, config keys) and what
  its loader must read.
- `fixture.safetensors` (make_fixtures' `write_st`): `input_ids`, `labels`, `loss_mask`
  [B,S] I32 as in `../`; `logits` [B,S,V], `loss`, `ce_loss`, `aux_loss` (0-d) F32 of the
  model with the initial adapters (train mode, eager attention, `output_router_logits`,
  loss = CE + 0.01·aux; GLM-4.5 and DeepSeek-V3 as in `../NOTES.md`: no aux loss, loss =
  CE, `aux_loss` 0, `router_aux_loss_coef` "0.0", router logits from the routers' inputs;
  gpt-oss as there: router logits x Wᵀ + b from the routers' inputs, the aux loss that of
  the router scores the model records);
  `router_logits.<layer>` [B·S,E]; `grad.<n>` for every adapter
  tensor `<n>` (named as in `adapter_model.safetensors`) whose grad is not None;
  `after.<n>` for every adapter tensor after one `torch.optim.AdamW` step over the
  adapter tensors only (lr 1e-2, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1,
  `foreach=False`; base frozen). `__metadata__`: `seed` (base), `adapter_seed`, `r`,
  `lora_alpha`, `scaling`, `target_modules`, `no_grad` (JSON: adapter tensors whose grad
  stayed None; AdamW skips them, `after` = initial), `zero_grad` (JSON: grads that are
  all zero, which AdamW still decays), versions.
- Check an adapter directory against these logits (from the repository root):
  `tools/check_peft_adapter.py --base tests/fixtures/<base> --adapter DIR
  --fixture tests/fixtures/lora/<name>/fixture.safetensors` (base through
  `AutoModelForCausalLM.from_pretrained`, adapter through `PeftModel.from_pretrained`).
  *(checked: the checked-in files reproduce `logits` exactly)*

| name | family | base seed | adapter seed | LoRA modules | adapter tensors | adapter params | idle experts (layer, e) | grad None (tensors) | all-zero grads (tensors) | loss | ce | aux | max \\|Δlogit\\| vs base |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
{rows}

LoRA: r = {r}, lora_alpha = {alpha} (scaling {scaling:g}), lora_dropout 0, bias "none",
task_type "CAUSAL_LM", target_modules = q_proj, k_proj, v_proj, o_proj + gate_proj,
up_proj, down_proj (Mixtral: w1, w2, w3; DeepSeek-V3: its MLA projections, below, for
the attention; gpt-oss: q_proj, k_proj, v_proj, o_proj only, below; the hot-expert
fixture: below), PEFT's default
init, then **every lora_A and lora_B overwritten** (PEFT's lora_B = 0 would make every
lora_A gradient zero): numpy PCG64 `default_rng(adapter_seed)`, in sorted PeftModel
parameter-name order,
`{std_a}·N(0,1)` for lora_A and `{std_b}·N(0,1)` for lora_B, float32. The adapter seed counts
up from base seed + {offset} until the model **with** the adapters keeps top-k choices at
least {margin} apart (GLM-4.5, DeepSeek-V3: by their rule of `../NOTES.md`, the router bias
and group limit mattering included) and ({idle_families}) leaves exactly one routed expert idle (a
hot-expert fixture: a cold expert busy in every MoE layer and a hot one idle in some).

## PEFT facts the C code must match
- **Which modules get an adapter** (`peft/tuners/tuners_utils.py`
  `check_target_module_exists`): a module whose full name equals a list entry (`elif key
  in config.target_modules:`) or ends with `.` + entry (`key.endswith(f".{{target_key}}")`):
  whole trailing name components, no regex. The name is the module's in the wrapped HF
  model (`BaseTuner.inject_adapter`: `key_list = [key for key, _ in named_modules]`), e.g.
  `model.layers.1.mlp.experts.2.gate_proj`: such an entry adapts that one module.
  transformers {tf}'s experts are an `nn.ModuleList` of per-expert MLPs, each with its
  own `nn.Linear` projections, so `gate_proj` (`w1`) puts one adapter pair on every
  routed expert, on the dense MLPs (Qwen2/3 layer 0) and on the Qwen2-MoE shared expert;
  the routers (`mlp.gate`, `block_sparse_moe.gate`) and `shared_expert_gate` get
  **none** (their last component is not a target). *(checked: the LoRA modules are
  exactly the target projections; no router)* GLM-4.5 (`glm4_moe`): the short names
  adapt every routed expert, the dense MLP of layer 0 and `mlp.shared_experts` of each
  MoE layer. Its router `mlp.gate` is a `Glm4MoeTopkRouter`, a module holding a weight
  Parameter that it applies with `F.linear`, no `nn.Linear`: PEFT **cannot** adapt it
  (`target_modules=["gate"]` raises `ValueError: Target module Glm4MoeTopkRouter() is not
  supported`) *(checked)*; its `e_score_correction_bias` buffer stays in the base
  (`../glm4_moe/model.safetensors`), never trained. DeepSeek-V3 (`deepseek_v3`): the same
  for its MLP and router (`DeepseekV3TopkRouter`: `ValueError: Target module
  DeepseekV3TopkRouter() is not supported` *(checked)*); its attention has no
  k_proj/v_proj: the targets are its MLA projections, `q_a_proj` (H → q_lora_rank),
  `q_b_proj` (q_lora_rank → heads·qk_head_dim; `q_proj` H → heads·qk_head_dim instead when
  q_lora_rank is null), `kv_a_proj_with_mqa` (H → kv_lora_rank + qk_rope_head_dim),
  `kv_b_proj` (kv_lora_rank → heads·(qk_nope_head_dim + v_head_dim)), `o_proj`
  (heads·v_head_dim → H); `q_a_layernorm` / `kv_a_layernorm` are RMSNorms (no adapter).
  An adapter on `kv_a_proj_with_mqa` changes the latent and the shared rope key alike
  (its output is split after the adapter's sum). gpt-oss (`gpt_oss`): only the attention
  projections `q_proj`, `k_proj`, `v_proj`, `o_proj` (each with a bias, kept in the base
  term) are `nn.Linear`; its MLP has none: `mlp.experts` is a `GptOssExperts` holding the
  fused Parameters `gate_up_proj` [E, H, 2I], `gate_up_proj_bias`, `down_proj` [E, I, H],
  `down_proj_bias`, and `mlp.router` a `GptOssTopKRouter` (weight and bias Parameters,
  `F.linear`). PEFT **cannot** adapt either by `target_modules` (`ValueError: Target
  module GptOssExperts() is not supported`, `... GptOssTopKRouter() is not supported`
  *(checked)*; `gate_up_proj` names no module; PEFT's `target_parameters`, which could wrap
  such Parameters, stays null here), so the fixture adapts the attention only
  and no expert has an adapter: no grad is None, and an idle expert shows in the routing
  only.
- **Long target_modules lists are condensed** (`BaseTuner.inject_adapter`): at
  `len(peft_config.target_modules) >= MIN_TARGET_MODULES_FOR_OPTIMIZATION` ({condensed_min}
  in peft {peft}), `new_target_modules =
  _find_minimal_target_modules(peft_config.target_modules, names_no_target)` (the shortest
  trailing name parts that match no module left out) replaces the list where it is
  shorter, and `save_pretrained` writes that. These fixtures' lists are shorter
  *(checked: the file holds the list given)*; a real model's hot-expert list is not, so
  a PEFT-written `adapter_config.json` can hold entries such as `1.gate_proj` (expert 1
  of every layer) or `mlp.gate_proj` (the dense MLPs): read it by the suffix rule above,
  over every module name.
- **Shapes** (`peft/tuners/lora/layer.py` `LoraLayer.update_layer`):
  `lora_A = nn.Linear(in_features, r, bias=False)` → weight **[r, in]**;
  `lora_B = nn.Linear(r, out_features, bias=lora_bias)` → weight **[out, r]**, no bias
  (lora_bias false). F32 like the base.
- **Scaling** (`LoraLayer.update_layer`): `self.scaling[adapter_name] = lora_alpha / r`
  ({alpha}/{r} = {scaling:g}); `lora_alpha / math.sqrt(r)` only with `use_rslora` (false).
  *(checked on every LoRA layer)*
- **Forward** (`peft/tuners/lora/layer.py` `Linear.forward`, unmerged): `result =
  self.base_layer(x, *args, **kwargs)`, then
  `{fwd}`
  i.e. `y = x·Wᵀ (+ b) + scaling · (x·Aᵀ)·Bᵀ`; `dropout` is `nn.Identity` at
  lora_dropout 0. The base bias (Qwen2-MoE q/k/v, gpt-oss q/k/v/o) stays in the base term.
  *(checked: every LoRA layer against an fp64 reference, max error {lora_err})*
- **PEFT's default init** (`LoraLayer.reset_lora_parameters`, `init_lora_weights=True`):
  `nn.init.kaiming_uniform_(self.lora_A[adapter_name].weight, a=math.sqrt(5))` =
  U(−1/√in, 1/√in), and `nn.init.zeros_(self.lora_B[adapter_name].weight)`: a fresh
  adapter is a no-op and lora_A's first gradient is zero. *(checked: B = 0 and
  |A| ≤ 1/√in before the overwrite)*
- **Tensor names in `adapter_model.safetensors`** (`peft/utils/save_and_load.py`
  `get_peft_model_state_dict`): the PeftModel's state-dict keys that contain `lora_`
  (bias "none"), with the adapter name removed (`.lora_A.default.weight` →
  `.lora_A.weight`; `pattern = re.compile(re.escape(f".{{adapter_name}}") + r"$")`). The key is
  the module path in the PeftModel: `base_model` (the `LoraModel`, `PeftModel.__init__`)
  `.model` (the wrapped HF model, `BaseTuner.__init__`) `.` + the HF parameter path of the
  linear less `.weight` + `.lora_A.weight` / `.lora_B.weight`, e.g.
  `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`. Only the adapter
  tensors (no base weights), header metadata `{{"format": "pt"}}` only.
  *(checked: file keys = trainable parameters less `.default`, values equal)*
- **`adapter_config.json`** (`peft/config.py` `PeftConfigMixin.save_pretrained`):
  `json.dumps(self.to_dict(), indent=2, sort_keys=True)` with sets turned into lists;
  `LoraConfig.__post_init__` keeps `target_modules` as a **set**, so its order in the
  file is arbitrary (it follows Python's string hash seed; the script runs with
  PYTHONHASHSEED=0 to write the same bytes every time): read it as a set, and write it in
  any order. `PeftModel.save_pretrained` writes `inference_mode: true` whatever the
  model's mode; `base_model_name_or_path` is the base's `name_or_path` (`""` here: the
  base was built from a config). The keys peft {peft} writes (sorted, as in the
  file), with the values of these fixtures:
```
{values}
```
  The ones that change the maths: `r`, `lora_alpha`, `use_rslora`, `target_modules`,
  `rank_pattern`/`alpha_pattern` (per-module overrides, empty), `lora_dropout`,
  `bias`, `lora_bias`, `use_dora`, `fan_in_fan_out` (false: weights as [out, in]),
  `layers_to_transform`/`layers_pattern`/`exclude_modules` (null: every layer).

## Gradients and the step
- Base parameters are frozen by PEFT (`requires_grad` false): only lora_A / lora_B get
  gradients. *(checked: every base grad stays None)*
- The MoE paths of `../NOTES.md` carry over to the adapters of the experts: Mixtral,
  Qwen2-MoE, Qwen3-MoE, GLM-4.5 and DeepSeek-V3 skip experts that get no token, so an idle
  expert's adapter tensors have grad **None** (listed in `no_grad`; AdamW skips them: `after` = initial;
  with hot experts an idle hot expert's: a cold one has no adapters);
  OLMoE runs every expert, so its idle expert's adapters get **all-zero** grads that AdamW
  still decays (`p·(1 − lr·wd)`). A last-layer expert whose tokens predict no counted
  target also gets all-zero grads, and so, with no aux loss (GLM-4.5, DeepSeek-V3), does an
  earlier layer's expert whose tokens reach no counted target (`../NOTES.md`). gpt-oss has
  no expert adapters: every adapter tensor (attention) has a grad, none all zero. *(checked: the
  all-zero grads are exactly those and the OLMoE idle experts')*
- AdamW as in `../NOTES.md`, over the adapter tensors only. *(checked against `after.*`
  in fp64: max error {adam})*
{hot}
## The adapted modules and their tensor shapes
Key in `adapter_model.safetensors` = `base_model.model.` + module + `.lora_A.weight`
(shape A = [r, in]) / `.lora_B.weight` (B = [out, r]); `{{0..7}}`: one module per expert,
`{{1,2}}`: those experts' only.
{modules}
"""

HOT_NOTES = """
## Hot experts: `{name}`
Adapters on some routed experts only, as moefit's `train.lora.experts: hot` places them.
The base, its seed ({seed}) and the batch are those of `{base}` (`../{base}/`; the
metadata's `base_fixture`), and so are the files, the tensors (plus `lora_hot`) and the
checks above; the adapter seed ({adapter_seed}) is searched for as there.
- **Adapted**: q_proj, k_proj, v_proj, o_proj of every layer (short names), and {mlp}
  of every dense MLP (layer{s_dense} {dense}), of every shared expert and of the hot routed
  experts, these by **full module name** (a short `{mlp0}` would adapt every routed
  expert and the shared expert alike: the suffix rule above). target_modules as given to
  `LoraConfig` ({n_tm} entries, in `named_modules` order):
```
{tm}
```
  and as PEFT writes it to `adapter_config.json` (its set's order at PYTHONHASHSEED=0;
  read it as a set):
```
{tm_file}
```
  At {condensed_min} entries or more PEFT would have condensed the list; for this model
  `_find_minimal_target_modules` gives (sorted; {condensed_n}):
  `{condensed}`
- **Hot set**: {n_hot} of the {E} routed experts in each MoE layer (MoE layers
  {moe_layers}{one_layer}); {rule} (metadata `hot_rule`). Routed tokens per expert
  (top-{k} choices of the {tokens} tokens):
{hot_lines}
  - moefit's own rule, the top ceil({fraction:g}·E) = {n_hot} experts by routed count, ties to
  the lower index, would take {moefit} of either routing: the experts most routed in a
  batch all get tokens in it, so that rule cannot leave a hot expert idle on the batch
  it was read from; this fixture's rule takes the least routed expert instead, to have
  one.
- **`lora_hot`** [layers, experts] I32 in `fixture.safetensors`: 1 where the routed
  expert's {mlp} have adapters, else 0 (dense layers all 0); metadata `hot_experts`
  (`{{"layer": [experts]}}`), `hot_base_counts` and `hot_counts` (the counts above,
  without and with the adapters), `hot_rule`. *(checked: the LoRA modules are exactly the
  adapted ones; a cold expert's projections stay plain `nn.Linear`)*
- A cold expert's tokens go through its base weights only (no adapter, no gradient); an
  idle hot expert's adapters have grad None ({n_no_grad} tensors in `no_grad`) and `after` =
  initial. *(checked: a cold expert busy in every MoE layer, a hot expert idle in one)*
"""


def hot_rule(E, k):
    """hot_set's rule in words (the metadata's hot_rule, NOTES)."""
    n = hot_count(E) - 1
    most = "the most routed expert" if n == 1 else f"the {n} most routed experts"
    return (f"of the base model's (adapters off) top-{k} routing of the batch, {most} and the least routed "
            f"one, ties to the lower index")


def hot_notes(r):
    """The HOT_NOTES section of a hot-expert fixture's row."""
    E, k, hot, mlp = r["E"], r["k"], r["hot"], MLP.get(r["base"], MLP_DEFAULT)
    top = lambda c: sorted(by_count(c)[:hot_count(E)])  # noqa: E731
    moefit = {str(top(b)) if top(b) == top(c) else f"{top(b)} / {top(c)}"
              for b, c in zip(r["base_counts"], r["counts"])}
    hot_lines = "\n".join(
        f"  - layer {li}: base {b}, with the adapters {c}: hot **{hot[li]}**; cold experts "
        f"with tokens {[e for e in range(E) if c[e] and e not in hot[li]]}, hot experts without "
        f"{[e for e in hot[li] if not c[e]]}" for li, b, c in zip(r["moe_layers"], r["base_counts"], r["counts"]))
    dense = [i for i in range(r["layers"]) if i not in r["moe_layers"]]
    return reflow(HOT_NOTES.format(
        name=r["name"], base=r["base"], seed=r["seed"], adapter_seed=r["adapter_seed"], mlp=", ".join(mlp),
        mlp0=mlp[0], s_dense="s" if len(dense) != 1 else "", dense=", ".join(map(str, dense)) or "-",
        n_tm=len(r["tm"]), tm="\n".join(r["tm"]), tm_file="\n".join(r["acfg"]["target_modules"]),
        condensed_min=MIN_CONDENSED, condensed=json.dumps(r["condensed"]), n_hot=hot_count(E), E=E,
        condensed_n=("fewer entries: PEFT would write these" if len(r["condensed"]) < len(r["tm"])
                     else "as many entries, so the list would stay"),
        moe_layers=r["moe_layers"], one_layer=": one hot set" if len(r["moe_layers"]) == 1 else "",
        rule=hot_rule(E, k), k=k, tokens=mfx.B * mfx.S, hot_lines=hot_lines, fraction=HOT_FRACTION,
        moefit=", ".join(sorted(moefit)), n_no_grad=len(r["no_grad"])))


def reflow(text, width=88):
    """Markdown with each paragraph and list item refilled to width; ``` blocks and headings as they are."""
    out, para, code = [], [], False

    def flush():
        if para:
            m = re.match(r"(\s*)(- )?", para[0])
            words = " ".join(line.strip() for line in para)[len(m.group(2) or ""):]
            out.append(textwrap.fill(words, width, initial_indent=m.group(0), break_long_words=False,
                                     subsequent_indent=m.group(1) + ("  " if m.group(2) else ""),
                                     break_on_hyphens=False))
            para.clear()

    for line in text.split("\n"):
        if line.startswith("```"):
            code = not code
        if code or line.startswith(("```", "#")) or not line.strip():
            flush()
            out.append(line)
            continue
        if re.match(r"\s*- ", line):
            flush()
        para.append(line)
    flush()
    return "\n".join(out)


def write_notes(outdir, rows):
    table = "\n".join(
        f"| {r['name']} | {r['family']} | {r['seed']} | {r['adapter_seed']} | {r['n_modules']} | {r['n_tensors']} | "
        f"{r['n_params']} | {', '.join(f'({l},{e})' for l, e in r['idle']) or '-'} | {len(r['no_grad'])} | "
        f"{len(r['zero'])} | {r['loss']:.5f} | {r['ce']:.5f} | {r['aux']:.5f} | {r['shift']:.3f} |" for r in rows)
    acfgs = [r["acfg"] for r in rows]
    keys = sorted(acfgs[0])
    need(all(sorted(a) == keys for a in acfgs), "adapter_config.json keys differ between fixtures")
    vals = []
    for k in keys:
        vs = {r["name"]: sorted(r["acfg"][k]) if k == "target_modules" else r["acfg"][k] for r in rows}
        if all(v == vs[rows[0]["name"]] for v in vs.values()):
            vals.append(f"{k}: {json.dumps(vs[rows[0]['name']])}")
        else:
            vals.append(f"{k}: " + "; ".join(f"{n} {json.dumps(v)}" for n, v in vs.items())
                        + (" (sorted here; any order in the file)" if k == "target_modules" else ""))
    modules_txt = "\n".join(f"\n{r['name']}:\n```\n" + "\n".join(r["modules"]) + "\n```" for r in rows)
    text = NOTES.format(
        peft=peft.__version__, tf=transformers.__version__, torch=torch.__version__.split("+")[0], rows=table,
        r=R, alpha=ALPHA, scaling=SCALING, std_a=ADAPTER_STD_A, std_b=ADAPTER_STD_B, offset=ADAPTER_SEED_OFFSET,
        margin=f"{mfx.MIN_ROUTING_MARGIN:g}", fwd=FORWARD_LINE, lora_err="< 1e-5", adam="< 1e-6",
        values="\n".join(vals), modules=modules_txt, condensed_min=MIN_CONDENSED,
        idle_families=", ".join(r["name"] for r in rows if r["hot"] is None and r["need_idle"]),
        hot="".join(hot_notes(r) for r in rows if r["hot"] is not None))
    with open(os.path.join(outdir, "NOTES.md"), "w") as f:
        f.write(text)


# ----------------------------------------------------------------------------- driver
def fixtures():
    """Each fixture: its name, the family of its base, make_fixtures' entry for that base, and
    its hot set (None: every routed expert; make_fixture reads the HOT fixtures' own)."""
    by_name = {fx["name"]: fx for fx in mfx.FIXTURES}
    return [dict(name=n, family=HOT.get(n, n), fx=by_name[HOT.get(n, n)], hot=None) for n in NAMES]


def generate(outdir):
    os.makedirs(outdir, exist_ok=True)
    rows = [make_fixture(lf, outdir) for lf in fixtures()]
    write_notes(outdir, rows)
    return rows


def compare(ref_dir, new_dir, names=NAMES):
    """make_fixtures.compare() with these fixtures (names) and files, and no directory besides them."""
    ok = mfx.compare(ref_dir, new_dir, names, OUT_FILES)
    extra = sorted(set(os.listdir(ref_dir)) - set(names) - {"NOTES.md"}) if os.path.isdir(ref_dir) else []
    if extra:
        print(f"EXTRA    {extra}")
        ok = False
    return ok


def summary(r):
    """A fixture's line on the console."""
    return (f"{r['name']:13s} seed {r['seed']} adapter seed {r['adapter_seed']} LoRA modules {r['n_modules']} "
            f"tensors {r['n_tensors']} params {r['n_params']} loss {r['loss']:.6f} ce {r['ce']:.6f} "
            f"aux {r['aux']:.6f} idle {r['idle']} no_grad {len(r['no_grad'])} zero {len(r['zero'])} "
            f"|dlogit| {r['shift']:.3f} margin {r['margin']:.2e} lora err {r['lora_err']:.1e} "
            f"adam err {r['adam_err']:.1e}")


def main():
    args = mfx.start(__doc__, DEFAULT_OUT, "tests/fixtures/lora", peft=(pinned("peft"), peft.__version__))
    # PeftModel.save_pretrained looks for the base's config under name_or_path ("" here)
    warnings.filterwarnings("ignore", message="Could not find a config file in")
    check_sources()
    mfx.write_or_check(args, generate, compare, summary)


if __name__ == "__main__":
    main()
