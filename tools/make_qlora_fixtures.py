#!/usr/bin/env python3
"""Writes the QLoRA parity fixtures of tests/fixtures/qlora/ with bitsandbytes + PEFT on transformers.

Run it in the venv of tools/requirements-fixtures.txt (which pins bitsandbytes and peft too;
everything runs on the CPU):

    ~/fixvenv/bin/python tools/make_qlora_fixtures.py            # rewrite tests/fixtures/qlora
    ~/fixvenv/bin/python tools/make_qlora_fixtures.py --check    # compare only

For mixtral, qwen2_moe, qwen3_moe and olmoe it writes what tools/make_lora_fixtures.py
writes to tests/fixtures/lora/<family>/ (the same files, LoraConfig, target modules, adapter
init, batch and AdamW step; its functions, imported), except that the frozen base is loaded
QUANTIZED, as transformers + PEFT do QLoRA: the base is built by make_fixtures' build() with
its seed (saved, it is byte for byte tests/fixtures/<family>/; asserted), saved to a
temporary directory and reloaded with
    AutoModelForCausalLM.from_pretrained(dir, quantization_config=BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32,
        bnb_4bit_use_double_quant=False, bnb_4bit_quant_storage=torch.uint8),
        device_map="cpu", dtype=torch.float32, attn_implementation="eager")
which makes every nn.Linear but lm_head a bitsandbytes Linear4bit (NF4, blocks of 64,
fp32 absmax; asserted): attention, routers, experts, shared experts and their gate, dense
MLPs. PEFT's LoRA then wraps the target projections (peft.tuners.lora.bnb.Linear4bit).
tests/fixtures/qlora/<family>/
  config.json, adapter_config.json, adapter_model.safetensors   as in ../lora/<family>/
                             (config.json = ../../<family>/config.json byte for byte, no
                             quantization_config: the quantization is the loader's)
  fixture.safetensors        the lora fixture's tensors and metadata for the quantized model,
                             plus deq.<weight> [out, in] F32 for every quantized weight:
                             bitsandbytes.functional.dequantize_4bit(w.data, w.quant_state),
                             and metadata base_dtype, base_blocksize, base_double_quant,
                             bitsandbytes, quantized_modules (JSON), base_quantization.
and tests/fixtures/qlora/NOTES.md: the bitsandbytes / transformers facts the C code must
match, each read from the installed sources (source_facts) and checked numerically.

The adapter seed is searched for as make_lora_fixtures' pick_adapter_seed does (from base
seed + ADAPTER_SEED_OFFSET, mfx.usable_routing), on the quantized model with the adapters.

Determinism and --check: those of make_lora_fixtures (PYTHONHASHSEED=0 by re-executing,
make_fixtures' torch settings, make_fixtures' write_st and compare). CUDA_VISIBLE_DEVICES is
set empty before torch loads, so bitsandbytes takes its CPU library on any machine.
"""

import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:])
os.environ["HF_HUB_OFFLINE"] = "1"  # PEFT's save looks for a base config by name_or_path ("")
os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU build of everything, bitsandbytes' CPU library

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mfx  # noqa: E402  (sets MKL_CBWR etc. before torch loads)
import make_lora_fixtures as mlf  # noqa: E402

import filecmp  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402

import bitsandbytes  # noqa: E402
import bitsandbytes.functional as BF  # noqa: E402
import numpy as np  # noqa: E402
import peft  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from peft.tuners.tuners_utils import BaseTunerLayer  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

need = mfx.need
FIXTURES_DIR = mlf.FIXTURES_DIR
DEFAULT_OUT = os.path.join(FIXTURES_DIR, "qlora")
FAMILIES = mlf.FAMILIES
OUT_FILES = mlf.OUT_FILES
QUANT_FAMILIES = os.path.join(FIXTURES_DIR, "quant", "families.safetensors")  # make_quant_fixtures' NF4 bits

BLOCKSIZE = 64  # bitsandbytes' Params4bit default (transformers passes none)
QUANT = dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32,
             bnb_4bit_use_double_quant=False, bnb_4bit_quant_storage=torch.uint8)
QUANT_CALL = ('AutoModelForCausalLM.from_pretrained(dir, quantization_config=BitsAndBytesConfig(load_in_4bit=True, '
              'bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32, bnb_4bit_use_double_quant=False, '
              'bnb_4bit_quant_storage=torch.uint8), device_map="cpu", dtype=torch.float32, '
              'attn_implementation="eager")')
# Metadata of the lora fixture that must be the same here (same LoRA, batch, optimizer).
SAME_META = ["r", "lora_alpha", "scaling", "lora_dropout", "target_modules", "adapter_init", "batch", "loss_mask",
             "n_targets", "loss", "router_aux_loss_coef", "optimizer", "lr", "beta1", "beta2", "eps",
             "weight_decay", "moe_layers", "seed", "base", "base_sha256", "model_type", "fixture", "format"]


# ----------------------------------------------------------------------------- sources
def source_facts():
    """(citation, object, snippet that must occur in its source). Checked at start-up."""
    from bitsandbytes.autograd import _functions as bfun
    from bitsandbytes.backends.cpu import ops as cpu_ops
    from bitsandbytes.backends.default import ops as def_ops
    from bitsandbytes.nn import modules as bmod
    from peft.tuners.lora import bnb as pbnb
    from transformers.integrations import bitsandbytes as tbnb
    from transformers.quantizers import base as qbase
    from transformers.quantizers import quantizer_bnb_4bit as q4
    facts = mfx.facts
    return [
        # which modules transformers quantizes
        ("transformers/quantizers/base.py HfQuantizer.get_modules_to_not_convert",
         qbase.HfQuantizer.get_modules_to_not_convert, "modules_to_not_convert = get_keys_to_not_convert(model)"),
        ("transformers/integrations/bitsandbytes.py get_keys_to_not_convert", tbnb.get_keys_to_not_convert,
         "output_emb = model.get_output_embeddings()"),
        *facts("transformers/integrations/bitsandbytes.py _replace_with_bnb_linear", tbnb._replace_with_bnb_linear,
               "if (isinstance(module, (nn.Linear, Conv1D))) and name not in modules_to_not_convert:",
               "model._modules[name] = bnb.nn.Linear4bit("),
        # how: at load, Params4bit -> quantize_4bit, blocks of 64
        ("transformers/quantizers/quantizer_bnb_4bit.py Bnb4BitHfQuantizer.create_quantized_param",
         q4.Bnb4BitHfQuantizer.create_quantized_param,
         "new_value = bnb.nn.Params4bit(new_value, requires_grad=False, **kwargs).to(target_device)"),
        ("bitsandbytes/nn/modules.py Params4bit.__new__", bmod.Params4bit.__new__, "blocksize = 64"),
        ("bitsandbytes/nn/modules.py Params4bit._quantize", bmod.Params4bit._quantize,
         "w_4bit, quant_state = bnb.functional.quantize_4bit("),
        ("bitsandbytes/functional.py quantize_4bit", BF.quantize_4bit,
         "_out, _absmax = torch.ops.bitsandbytes.quantize_4bit.default("),
        *facts("bitsandbytes/backends/default/ops.py quantize_4bit (default kernel)", def_ops,
               "scaled = torch.clamp(A_com * (1.0 / absmax.clamp(min=1e-38).view(-1, 1)), -1, 1).reshape(-1)",
               "scaled = torch.cat([scaled, torch.clamp(A_flat[full:] / am, -1, 1)])",
               "q = torch.bucketize(scaled, bounds, out_int32=True)",
               "packed = ((q8[::2] << 4) | q8[1::2]).unsqueeze(1)"),
        # dequantization
        ("bitsandbytes/functional.py dequantize_4bit", BF.dequantize_4bit,
         "out = torch.ops.bitsandbytes.dequantize_4bit.default("),
        *facts("bitsandbytes/backends/cpu/ops.py dequantize_4bit (cpu kernel)", cpu_ops,
               "lib.cdequantize_blockwise_cpu_nf4_fp32(", "shape_fallback = shape[-1] % 2 != 0"),
        ("bitsandbytes/backends/default/ops.py _dequantize_4bit_compute", def_ops,
         "out = (out_dq.view(-1, blocksize) * absmax.view(-1, 1)).reshape(n)"),
        # forward
        *facts("bitsandbytes/nn/modules.py Linear4bit.forward", bmod.Linear4bit.forward,
               "x = x.to(self.compute_dtype)", "and not self.training",
               "self.weight.data, quant_state = _convert_weight_packed_for_cpu(self.weight.data, quant_state)",
               "return bnb.matmul_4bit(x, self.weight, bias=bias, quant_state=quant_state).to(inp_dtype)"),
        *facts("bitsandbytes/autograd/_functions.py matmul_4bit", bfun.matmul_4bit,
               "needs_grad = torch.is_grad_enabled() and (A.requires_grad or (bias is not None and bias.requires_grad))",
               "result = torch.ops.bitsandbytes.gemm_4bit.default(",
               "return MatMul4Bit.apply(A, B, out, bias, quant_state)"),
        ("bitsandbytes/autograd/_functions.py MatMul4Bit.forward", bfun.MatMul4Bit.forward,
         "output = torch.ops.bitsandbytes.gemm_4bit.default("),
        *facts("bitsandbytes/backends/default/ops.py _gemm_4bit_default_impl", def_ops._gemm_4bit_default_impl,
               "B_dq = torch.ops.bitsandbytes.dequantize_4bit.default(B, absmax, blocksize, quant_type, shapeB, A.dtype)",
               "return torch.nn.functional.linear(A, B_dq, bias)"),
        # backward
        *facts("bitsandbytes/autograd/_functions.py MatMul4Bit.backward", bfun.MatMul4Bit.backward,
               "grad_A = torch.matmul(grad_output, F.dequantize_4bit(B, ctx.state).to(grad_output.dtype))",
               "grad_A, grad_B, grad_bias = None, None, None"),
        # PEFT on a Linear4bit
        ("peft/tuners/lora/bnb.py dispatch_bnb_4bit", pbnb.dispatch_bnb_4bit,
         "new_module = Linear4bit(target, adapter_name, **fourbit_kwargs)"),
        *facts("peft/tuners/lora/bnb.py Linear4bit.forward", pbnb.Linear4bit.forward,
               "result = self.base_layer(x, *args, **kwargs)", "result = result.clone()",
               "x = self._cast_input_dtype(x, lora_A.weight.dtype)", "output = lora_B(lora_A(dropout(x))) * scaling",
               "result = result + output"),
    ]


# (citation, object, snippet that must NOT occur in its source)
def source_absent():
    from bitsandbytes.backends.cpu import ops as cpu_ops
    return [("bitsandbytes/backends/cpu/ops.py: no cpu gemm_4bit kernel", cpu_ops,
             'register_kernel("bitsandbytes::gemm_4bit", "cpu")'),
            ("bitsandbytes/backends/cpu/ops.py: no cpu quantize_4bit kernel", cpu_ops,
             'register_kernel("bitsandbytes::quantize_4bit", "cpu")')]


def check_sources():
    mlf.check_sources()
    mfx.check_facts(source_facts(), "bitsandbytes source fact")
    for cite, obj, snippet in source_absent():
        need(snippet not in mfx._src(obj), f"bitsandbytes source fact no longer holds: {cite}")
    from bitsandbytes.cextension import ErrorHandlerMockBNBNativeLibrary, lib
    need(not isinstance(lib, ErrorHandlerMockBNBNativeLibrary), "bitsandbytes' native CPU library did not load")
    has = lambda op, key: torch._C._dispatch_has_kernel_for_dispatch_key(f"bitsandbytes::{op}", key)  # noqa: E731
    need(not has("gemm_4bit", "CPU") and has("gemm_4bit", "CompositeExplicitAutograd"),
         "bitsandbytes::gemm_4bit is not the default kernel on the CPU")
    need(not has("quantize_4bit", "CPU") and has("quantize_4bit", "CompositeExplicitAutograd"),
         "bitsandbytes::quantize_4bit is not the default kernel on the CPU")
    need(has("dequantize_4bit", "CPU"), "bitsandbytes::dequantize_4bit has no CPU kernel")


# ----------------------------------------------------------------------------- model
def load_quantized(base_dir):
    """The base of base_dir as transformers loads it for QLoRA, and its quantized module names."""
    model = AutoModelForCausalLM.from_pretrained(
        base_dir, quantization_config=BitsAndBytesConfig(**QUANT), device_map="cpu", dtype=torch.float32,
        attn_implementation="eager")
    # adapter_config.json's base_model_name_or_path: "" as make_lora_fixtures' base (built from a
    # config) has, not the temporary directory (PEFT reads model.name_or_path)
    model.name_or_path = ""
    return model


def quantized_modules(model):
    return [n for n, m in model.named_modules() if isinstance(m, bitsandbytes.nn.Linear4bit)]


def layer(hf, n):
    """The module n of the HF model; under a LoRA wrapper, the wrapped (base) layer."""
    m = hf.get_submodule(n)
    return m.get_base_layer() if isinstance(m, BaseTunerLayer) else m


def build_qlora(lf, base_dir, adapter_seed, check_init=False):
    """The quantized base of base_dir with make_lora_fixtures' LoRA (same LoraConfig, init,
    adapter seed), in train mode; its target_modules; the names of its quantized modules."""
    model = load_quantized(base_dir)
    quantized = quantized_modules(model)
    tm = mlf.target_modules(lf["family"])
    return mlf.lora_model(lf["name"], model, tm, adapter_seed, check_init), tm, quantized


def pick_adapter_seed(lf, seed, base_dir, ids):
    """make_lora_fixtures' pick_adapter_seed on the quantized model: the first adapter seed from
    seed + ADAPTER_SEED_OFFSET whose routing of the batch is usable (mfx.usable_routing)."""
    first = seed + mlf.ADAPTER_SEED_OFFSET
    for a in range(first, first + mlf.ADAPTER_SEED_TRIES):
        pm, _, _ = build_qlora(lf, base_dir, a)
        if mfx.usable_routing(lf["fx"], pm, pm.get_base_model().config, ids):
            return a
    mfx.fail(f"{lf['name']}: no usable adapter seed in [{first}, {first + mlf.ADAPTER_SEED_TRIES})")


def nf4_reference(w, code):
    """bitsandbytes' NF4 dequantization in numpy: code[nibble] * absmax[block] in fp32, the first
    element of a byte in its high nibble, blocks of BLOCKSIZE over the row-major weight."""
    packed = w.data.view(torch.uint8).reshape(-1).numpy()
    q = np.empty(2 * packed.size, dtype=np.int64)
    q[0::2], q[1::2] = packed >> 4, packed & 0xF
    n = int(np.prod(w.quant_state.shape))
    absmax = w.quant_state.absmax.numpy()
    vals = code[q[:n]] * absmax[np.arange(n) // BLOCKSIZE]
    return vals.astype(np.float32).reshape(tuple(w.quant_state.shape))


def check_quantization(name, hf, base, quantized):
    """Every nn.Linear but lm_head is a Linear4bit: NF4, blocks of 64, fp32 absmax, no double
    quantization, uint8 storage, fp32 compute; its bits are quantize_4bit of the fp32 weight (and
    make_quant_fixtures' families.safetensors); dequantize_4bit is code[q] * absmax. Returns
    {weight name: dequantized weight}, max |deq - W|."""
    linears = [n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear)]
    need(quantized == [n for n in linears if n != "lm_head"], f"{name}: quantized modules {quantized}")
    need(type(hf.lm_head) is torch.nn.Linear and hf.lm_head.weight.dtype == torch.float32, f"{name}: lm_head")
    code = BF.get_4bit_type("nf4", device="cpu").numpy()
    fam = {}  # make_quant_fixtures' bits of this family's weights, where the file is there
    if os.path.exists(QUANT_FAMILIES):
        with safe_open(QUANT_FAMILIES, framework="pt") as f:
            fam = {k: f.get_tensor(k) for k in f.keys() if k.startswith(name + "/")}
        need(fam, f"{name}: no weights in {QUANT_FAMILIES}")
    deq, worst = {}, 0.0
    for n in quantized:
        m, w0 = layer(hf, n), base.get_submodule(n).weight.detach()
        w, qs = m.weight, m.weight.quant_state
        need(isinstance(w, bitsandbytes.nn.Params4bit) and w.dtype == torch.uint8 and not w.requires_grad,
             f"{name}: {n} weight {type(w).__name__} {w.dtype}")
        need(qs.quant_type == "nf4" and qs.blocksize == BLOCKSIZE and not qs.nested and qs.dtype == torch.float32
             and qs.absmax.dtype == torch.float32 and tuple(qs.shape) == tuple(w0.shape)
             and m.compute_dtype == torch.float32 and m.quant_storage == torch.uint8,
             f"{name}: {n} quant state {qs.quant_type} {qs.blocksize} {qs.nested} {qs.dtype} {qs.shape}")
        need(m.bias is None or torch.equal(m.bias, base.get_submodule(n).bias), f"{name}: {n} bias")
        q2, st2 = BF.quantize_4bit(w0, blocksize=BLOCKSIZE, compress_statistics=False, quant_type="nf4",
                                   quant_storage=torch.uint8)
        need(torch.equal(q2.reshape(-1), w.data.reshape(-1)) and torch.equal(st2.absmax, qs.absmax),
             f"{name}: {n} loaded bits != quantize_4bit of the fp32 weight")
        if fam:
            k = f"{name}/{n}.weight"
            need(torch.equal(fam[k + ".nf4"], w.data.reshape(-1)) and torch.equal(fam[k + ".absmax"], qs.absmax),
                 f"{name}: {n} bits differ from {QUANT_FAMILIES}")
        d = BF.dequantize_4bit(w.data, qs)
        need(d.dtype == torch.float32 and tuple(d.shape) == tuple(w0.shape), f"{name}: {n} deq shape")
        need(np.array_equal(d.numpy(), nf4_reference(w, code)), f"{name}: {n} dequantize_4bit != code[q] * absmax")
        deq[n + ".weight"] = d
        worst = max(worst, (d - w0).abs().max().item())
    return deq, worst


def check_targets(name, family, pm, hf, quantized):
    """The adapters sit on the Linear4bit target projections (every routed expert's), each a
    peft.tuners.lora.bnb.Linear4bit over the quantized layer; never on a router."""
    from peft.tuners.lora import bnb as pbnb
    mods = mlf.lora_modules(pm)
    for n, m in mods.items():
        need(isinstance(m, pbnb.Linear4bit) and isinstance(m.get_base_layer(), bitsandbytes.nn.Linear4bit),
             f"{name}: {n} is {type(m).__name__}")
        need(m.scaling["default"] == mlf.SCALING, f"{name}: {n} scaling {m.scaling['default']}")
        need(isinstance(m.lora_dropout["default"], torch.nn.Identity), f"{name}: {n} dropout")
        need(m.lora_B["default"].bias is None, f"{name}: {n} has a lora_B bias")
        need(m.lora_A["default"].weight.dtype == torch.float32, f"{name}: {n} adapter dtype")
    want = sorted("base_model.model." + n for n in quantized if mlf.adapted(family, None, n))
    need(sorted(mods) == want, f"{name}: LoRA modules differ from the target projections")
    for i, lay in enumerate(hf.model.layers):
        blk = mfx.moe_block(lay)
        if blk is not None:
            need(isinstance(blk.experts, torch.nn.ModuleList), f"{name}: layer {i} experts are not a ModuleList")
    routers = [n for n in mods if n.endswith(".gate") or "shared_expert_gate" in n]
    need(not routers, f"{name}: router got an adapter: {routers}")
    return mods


def check_linear4bit(name, hf, quantized, deq, seed):
    """Each Linear4bit alone (train mode, fp32): with an input that needs a grad it runs
    MatMul4Bit, y = F.linear(x, deq(W), b) and dX = dY @ deq(W) bit for bit (and within 1e-5 of
    fp64); without, the same y. Returns the worst fp64 error."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    for n in quantized:
        m = layer(hf, n)
        need(m.training, f"{name}: {n} not in train mode")
        w = deq[n + ".weight"]
        x = torch.from_numpy(rng.standard_normal((mfx.B, mfx.S, w.shape[1])).astype(np.float32))
        dy = torch.from_numpy(rng.standard_normal((mfx.B, mfx.S, w.shape[0])).astype(np.float32))
        with torch.no_grad():
            y0 = m(x)
        xg = x.clone().requires_grad_(True)
        y = m(xg)
        need(type(y.grad_fn).__name__ == "MatMul4BitBackward", f"{name}: {n} grad_fn {type(y.grad_fn).__name__}")
        y.backward(dy)
        bias = m.bias.detach() if m.bias is not None else None
        need(torch.equal(y0, F.linear(x, w, bias)) and torch.equal(y.detach(), F.linear(x, w, bias)),
             f"{name}: {n} forward != F.linear(x, deq(W), b)")
        need(torch.equal(xg.grad, torch.matmul(dy, w)), f"{name}: {n} dX != dY @ deq(W)")
        ref_y = x.double() @ w.double().T + (bias.double() if bias is not None else 0)
        worst = max(worst, (ref_y - y.detach().double()).abs().max().item(),
                    (dy.double() @ w.double() - xg.grad.double()).abs().max().item())
        need(not getattr(m.weight.quant_state, "packing_format_for_cpu", False), f"{name}: {n} repacked for the CPU")
    need(worst < 1e-5, f"{name}: Linear4bit differs from the fp64 reference by {worst}")
    return worst


def check_dequantized_lora(lf, seed, adapter_seed, ids, labels, deq, out, grads, after):
    """The QLoRA model and make_lora_fixtures' fp32 LoRA model whose quantized weights are
    replaced by deq: the same logits, losses, router logits, adapter grads and AdamW result.
    Returns the largest difference (0: bit for bit)."""
    model, ids2 = mfx.build(lf["fx"], seed)
    need(torch.equal(ids, ids2), "another batch")
    with torch.no_grad():
        for k, w in deq.items():
            model.get_submodule(k.removesuffix(".weight")).weight.copy_(w)
    pm = mlf.lora_model(lf["name"], model, mlf.target_modules(lf["family"]), adapter_seed)
    trainable = sorted(n for n, p in pm.named_parameters() if p.requires_grad)
    need(trainable == sorted(after), f"{lf['name']}: other adapter tensors in the fp32 LoRA model")
    o2, g2, _, a2, _ = mlf.run_step(pm, ids, labels, trainable)
    need(sorted(g2) == sorted(grads), f"{lf['name']}: other adapters get grads in the fp32 LoRA model")
    pairs = [(out.logits, o2.logits), (out.loss, o2.loss), (out.aux_loss, o2.aux_loss)]
    pairs += list(zip(out.router_logits, o2.router_logits))
    pairs += [(grads[n], g2[n]) for n in grads] + [(after[n], a2[n]) for n in after]
    worst = max((a.detach().double() - b.detach().double()).abs().max().item() for a, b in pairs if a.numel())
    need(worst < 1e-5, f"{lf['name']}: QLoRA differs from LoRA over deq(W) by {worst}")
    return worst


# ----------------------------------------------------------------------------- one fixture
def make_fixture(lf, outdir):
    name, family = lf["name"], lf["family"]
    base_dir = os.path.join(FIXTURES_DIR, family)
    lora_dir = os.path.join(FIXTURES_DIR, "lora", name)
    seed, base, ids, moe_layers = mlf.build_base(lf)
    d = mfx.fixture_dir(outdir, name)

    with tempfile.TemporaryDirectory() as tmp:
        # The base as make_fixtures writes it, byte for byte, then loaded quantized from there.
        mlf.save_base(lf, base, tmp, d)
        adapter_seed = pick_adapter_seed(lf, seed, tmp, ids)
        pm, tm, quantized = build_qlora(lf, tmp, adapter_seed, check_init=True)
    hf = pm.get_base_model()
    cfg = hf.config
    need(quantized == [n.removesuffix(".base_layer") for n in quantized_modules(hf)], f"{name}: PEFT moved a layer")
    deq, deq_err = check_quantization(name, hf, base, quantized)
    mods = check_targets(name, family, pm, hf, quantized)

    # PEFT's own files, the initial adapters (as make_lora_fixtures).
    params, trainable, names, file_keys = mlf.save_adapter(name, pm, d)
    need(filecmp.cmp(os.path.join(d, "adapter_config.json"), os.path.join(lora_dir, "adapter_config.json"),
                     shallow=False), f"{name}: adapter_config.json differs from tests/fixtures/lora/{name}'s")
    need(filecmp.cmp(os.path.join(d, "config.json"), os.path.join(lora_dir, "config.json"), shallow=False),
         f"{name}: config.json differs from tests/fixtures/lora/{name}'s")
    with safe_open(os.path.join(lora_dir, "adapter_model.safetensors"), framework="pt") as f:
        need(sorted(f.keys()) == file_keys, f"{name}: adapter tensor names differ from tests/fixtures/lora/{name}'s")

    labels, loss_mask = mfx.make_labels(ids)
    qbase_logits, ref_logits = mlf.adapters_off(pm, ids, family)
    quant_shift = float(np.abs(qbase_logits.numpy().astype(np.float64) - ref_logits).max())
    need(0 < quant_shift < 10, f"{name}: the quantized base's logits moved by {quant_shift} from the fp32 base's")

    captured, hooks = mlf.capture_lora(mods)
    no_grad_input = []
    for n in quantized:
        hooks.append(layer(hf, n).register_forward_pre_hook(
            lambda m_, inp, n=n: None if inp[0].requires_grad else no_grad_input.append(n)))
    out, grads, before, after, opt = mlf.run_step(pm, ids, labels, trainable)
    for h in hooks:
        h.remove()
    need(no_grad_input == [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"],
         f"{name}: quantized layers run without an input grad: {no_grad_input}")
    lora_err = mlf.check_lora_forward(name, captured, deq)

    logits, shift, ce, aux, loss, margin, idle = mlf.check_outputs(name, cfg, out, labels, moe_layers, qbase_logits)
    no_grad, zero = mlf.check_grads(lf, hf, params, trainable, grads, idle, opt)
    adam_err = mfx.check_adamw(name, before, after, grads)

    linear_err = check_linear4bit(name, hf, quantized, deq, adapter_seed)
    deq_lora_err = check_dequantized_lora(lf, seed, adapter_seed, ids, labels, deq, out, grads, after)

    tensors = mfx.batch_tensors(ids, labels, loss_mask, logits, loss, ce, aux, moe_layers, out.router_logits)
    mlf.add_adapter_tensors(tensors, names, grads, after)
    for n, w in deq.items():
        tensors[f"deq.{n}"] = w.numpy().astype("<f4")
    meta = mlf.fixture_meta(lf, cfg, seed, adapter_seed, tm, loss_mask, moe_layers, idle,
                            [names[n] for n in no_grad], [names[n] for n in zero], margin)
    meta.update({
        "base_quantization": (f"the base loaded by {QUANT_CALL}: every nn.Linear but lm_head is a bitsandbytes "
                              f"Linear4bit (quantized_modules), its weight quantize_4bit(w, blocksize=64, "
                              f"quant_type='nf4', compress_statistics=False): fp32 absmax per 64 elements of the "
                              f"row-major [out, in] weight; fp32 compute; embeddings, norms, lm_head, biases fp32"),
        "base_dtype": "nf4",
        "base_blocksize": str(BLOCKSIZE),
        "base_double_quant": "false",
        "base_quant_storage": "uint8",
        "base_compute_dtype": "float32",
        "bitsandbytes": bitsandbytes.__version__,
        "quantized_modules": json.dumps(quantized),
        "deq": ("deq.<module>.weight [out, in] F32 for each of quantized_modules: "
                "bitsandbytes.functional.dequantize_4bit(w.data, w.quant_state) = code[q] * absmax[i // 64]"),
    })
    # The lora fixture's tensors and metadata, plus deq.* and the quantization's.
    lora_t, lora_meta = mfx.read_st(os.path.join(lora_dir, "fixture.safetensors"))
    need(set(lora_meta) <= set(meta), f"{name}: metadata lacks {sorted(set(lora_meta) - set(meta))}")
    need(all(meta[x] == lora_meta[x] for x in SAME_META), f"{name}: metadata differs from the lora fixture's: "
         f"{[x for x in SAME_META if meta[x] != lora_meta[x]]}")
    strip = lambda ts: {x for x in ts if not x.startswith(("grad.", "after.", "deq."))}  # noqa: E731
    need(strip(tensors) == strip(lora_t) and {x for x in tensors if x.startswith("after.")} ==
         {x for x in lora_t if x.startswith("after.")}, f"{name}: tensor names differ from the lora fixture's")
    for x in ("input_ids", "labels", "loss_mask"):
        need(np.array_equal(tensors[x], lora_t[x]), f"{name}: {x} differs from the lora fixture's")

    # The checked-in files alone reproduce the logits: base from tests/fixtures/<family> loaded
    # quantized, adapter through PeftModel.from_pretrained.
    mlf.check_reload(name, load_quantized(base_dir), d, ids, logits, "quantized base")
    path = os.path.join(d, "fixture.safetensors")
    mfx.write_fixture(name, path, tensors, meta)

    return dict(name=name, seed=seed, adapter_seed=adapter_seed, lora_adapter_seed=int(lora_meta["adapter_seed"]),
                n_modules=len(mods), n_tensors=len(names), n_quantized=len(quantized),
                n_deq=sum(w.numel() for w in deq.values()), quantized=quantized,
                no_grad=[names[n] for n in no_grad], zero=[names[n] for n in zero], idle=idle, loss=loss.item(),
                ce=ce.item(), aux=aux.item(), shift=shift, quant_shift=quant_shift, deq_err=deq_err, margin=margin,
                lora_err=lora_err, adam_err=adam_err, linear_err=linear_err, deq_lora_err=deq_lora_err,
                size=os.path.getsize(path))


# ----------------------------------------------------------------------------- NOTES.md
TABLE = """\
| name | base seed | adapter seed | (../lora's) | LoRA modules | adapter tensors | quantized modules | deq elements | idle experts (layer, e) | grad None | all-zero grads | loss | ce | aux | max \\|Δlogit\\| vs quantized base | max \\|Δlogit\\| quantized vs fp32 base | max \\|deq − W\\| |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
{rows}
"""

NOTES = """\
# QLoRA parity fixtures: LoRA over a base loaded 4-bit (NF4) by bitsandbytes

Written by `tools/make_qlora_fixtures.py` (do not edit; rerun it). bitsandbytes {bnb},
peft {peft}, transformers {tf}, torch {torch}, float32 on the CPU. The files, the LoRA
(config, target modules, adapter init, batch, AdamW step) and every PEFT fact are those of
`../lora/` (`../lora/NOTES.md`); the model maths that of `../NOTES.md`; the NF4 format (how
bits are made from a weight and read back) that of `../quant/` (`src/io/quant.h`). What differs:
the frozen base is loaded **quantized**, as transformers + PEFT do QLoRA. Every
bitsandbytes / transformers fact below is read from the installed sources (file and function
named) and asserted by the script (`source_facts`), and where marked *(checked)*,
numerically on every fixture.

## Files (`<family>/`)
- The base is built as `tools/make_fixtures.py` builds `../<family>/` (its `build()`, the same
  seed; `save_pretrained` writes `../<family>/config.json` and `model.safetensors` byte for
  byte: asserted), saved to a temporary directory and loaded with
  `{call}`.
  `config.json` is `../<family>/config.json` (byte-identical, no `quantization_config`:
  the quantization is the loader's); `adapter_config.json` is byte-identical to
  `../lora/<family>/adapter_config.json` (the same `LoraConfig`; `base_model_name_or_path`
  `""` as there) and `adapter_model.safetensors` has the same tensor names (other values where
  the adapter seed differs). *(checked)*
- `fixture.safetensors`: the tensors and metadata of `../lora/<family>/fixture.safetensors`
  (`input_ids`, `labels`, `loss_mask`, `logits`, `loss`, `ce_loss`, `aux_loss`,
  `router_logits.<layer>`, `grad.<n>`, `after.<n>`; the same batch) of the quantized model
  with the initial adapters, plus `deq.<module>.weight` [out, in] F32 for every quantized
  module (`bitsandbytes.functional.dequantize_4bit(w.data, w.quant_state)`: the weight the
  base computes with; the C code quantizes `../<family>/model.safetensors` and must get these
  bits before comparing losses), and metadata `base_dtype` ("nf4"), `base_blocksize` ("64"),
  `base_double_quant` ("false"), `base_quant_storage` ("uint8"), `base_compute_dtype`
  ("float32"), `bitsandbytes` (version), `quantized_modules` (JSON, `named_modules` order),
  `base_quantization`, `deq`. *(checked: names and metadata are the lora fixture's plus these)*
- The checked-in files alone reproduce `logits`: `../<family>/` loaded as above and
  `PeftModel.from_pretrained(model, "<family>")`, train mode. *(checked: bit for bit)*

@@TABLE@@

The adapter seed is picked as `../lora/` picks it (from base seed + {offset}, top-k choices at
least {margin} apart, Mixtral and OLMoE exactly one idle routed expert), on the **quantized**
model with the adapters: its routing differs from the fp32 model's.

## What is quantized
- **Every `nn.Linear` but `lm_head`**
  (`transformers/integrations/bitsandbytes.py` `_replace_with_bnb_linear`: `if
  (isinstance(module, (nn.Linear, Conv1D))) and name not in modules_to_not_convert:` →
  `model._modules[name] = bnb.nn.Linear4bit(`; the list not to convert is
  `get_keys_to_not_convert(model)` (`transformers/quantizers/base.py`
  `HfQuantizer.get_modules_to_not_convert`, `llm_int8_skip_modules` unset), which for an
  untied model is the output embedding (`output_emb = model.get_output_embeddings()`):
  `lm_head`. So the attention q/k/v/o, the **routers** (`mlp.gate`,
  `block_sparse_moe.gate`: the router logits come from NF4 weights), every routed expert's
  projections, the Qwen2-MoE shared expert **and its `shared_expert_gate`**, the dense MLPs.
  Embeddings, norms, `lm_head` and the biases (Qwen2-MoE q/k/v) stay fp32.
  *(checked: the `Linear4bit` modules are exactly the base's `nn.Linear`s less `lm_head`)*
- **How** (`transformers/quantizers/quantizer_bnb_4bit.py`
  `Bnb4BitHfQuantizer.create_quantized_param`: `bnb.nn.Params4bit(new_value,
  requires_grad=False, **kwargs).to(target_device)` → `bitsandbytes/nn/modules.py`
  `Params4bit._quantize` → `bnb.functional.quantize_4bit(...)`): NF4, blocksize **64**
  (`Params4bit.__new__`: `blocksize = 64` when none is given; transformers gives none),
  `compress_statistics=False` (no double quantization: one fp32 absmax per block), uint8
  storage, 2 codes a byte, the first in the high nibble, blocks over the row-major [out, in]
  weight (a block can span rows; a weight of fewer than 64 elements, `shared_expert_gate`
  [1, 32], is one short block). On the CPU `quantize_4bit` is bitsandbytes' `default` kernel
  (`bitsandbytes/backends/default/ops.py`; there is no `cpu` one): full blocks
  `A_com * (1.0 / absmax...)`, a short last block `A_flat[full:] / am`, then
  `torch.bucketize` against the midpoints of the NF4 table (`../quant/NOTES.md`).
  *(checked: the loaded bits and absmax equal `quantize_4bit(w, 64, "nf4")` of the fp32
  weight and `../quant/families.safetensors`' `<family>/<weight>.nf4` / `.absmax`)*
- **Dequantization** (`bitsandbytes/functional.py` `dequantize_4bit` →
  `torch.ops.bitsandbytes.dequantize_4bit`; on the CPU the native kernel of
  `bitsandbytes/backends/cpu/ops.py`, `lib.cdequantize_blockwise_cpu_nf4_fp32(`, or, for an odd
  last dimension, `_dequantize_4bit_compute` of `backends/default/ops.py`): one fp32 product
  `code[q] * absmax[i // 64]`. *(checked: `deq.*` equals that, computed in numpy, bit for bit)*
- The settings in the metadata: `base_dtype` nf4, `base_blocksize` 64, `base_double_quant`
  false, `base_quant_storage` uint8, `base_compute_dtype` float32.

## The forward and backward of a quantized layer (fp32 compute, CPU, train mode)
- **`Linear4bit.forward`** (`bitsandbytes/nn/modules.py`): `x = x.to(self.compute_dtype)`
  (fp32: no-op), the bias cast to it, then `return bnb.matmul_4bit(x, self.weight, bias=bias,
  quant_state=quant_state).to(inp_dtype)`. Only when `not self.training` and the input needs
  no grad on a CPU with AVX512-BF16 does it first repack the weight
  (`_convert_weight_packed_for_cpu`) and compute in bf16 (`gemv_4bit`): these fixtures run in
  train mode, never that path. *(checked: no layer repacked)*
- **`matmul_4bit`** (`bitsandbytes/autograd/_functions.py`): when the input needs a grad
  (`needs_grad = torch.is_grad_enabled() and (A.requires_grad or ...)`) `MatMul4Bit.apply`,
  else `torch.ops.bitsandbytes.gemm_4bit` directly: the same op either way. Without
  `prepare_model_for_kbit_training` the no-grad path is taken by layer 0's q/k/v only (their
  input comes from the frozen embedding). *(checked: exactly those)*
- **`gemm_4bit` on the CPU is a plain fp32 `F.linear` with the dequantized weight**
  (`bitsandbytes/backends/default/ops.py` `_gemm_4bit_default_impl`, the only kernel of the op
  on the CPU: `B_dq = torch.ops.bitsandbytes.dequantize_4bit.default(B, absmax, blocksize,
  quant_type, shapeB, A.dtype)`, `return torch.nn.functional.linear(A, B_dq, bias)`):
  **y = x·deq(W)ᵀ + b**, deq(W) in fp32 (`deq.*`). *(checked: every quantized layer's output
  equals `F.linear(x, deq(W), b)` bit for bit, with and without grad; max error vs fp64
  {lin})*
- **Backward** (`MatMul4Bit.backward`): `grad_A = torch.matmul(grad_output,
  F.dequantize_4bit(B, ctx.state).to(grad_output.dtype))`: **dX = dY·deq(W)** (the same fp32
  deq(W), dequantized again); no weight gradient (`grad_B` stays None: frozen) and no bias
  gradient (frozen). *(checked: dX equals `torch.matmul(dY, deq(W))` bit for bit)*
- **PEFT over it** (`peft/tuners/lora/bnb.py`: `dispatch_bnb_4bit` wraps a `Linear4bit`
  target in `lora.bnb.Linear4bit`; its `forward`: `result = self.base_layer(x, *args,
  **kwargs)`, `result = result.clone()`, `x = self._cast_input_dtype(x, lora_A.weight.dtype)`
  (fp32: no-op), `output = lora_B(lora_A(dropout(x))) * scaling`, `result = result + output`):
  **y = x·deq(W)ᵀ + b + scaling·(x·Aᵀ)·Bᵀ**, the LoRA forward of `../lora/NOTES.md` with
  deq(W) for W. *(checked: every LoRA layer against an fp64 reference, max error {lora_err})*
- **So QLoRA here is LoRA over the dequantized base**: make_lora_fixtures' fp32 LoRA model
  with each quantized weight replaced by its `deq.*` (same adapters) gives the same logits,
  loss, aux loss, router logits, adapter grads and AdamW result. *(checked: max difference
  {deq_lora})* The AdamW step is `../lora/`'s (max error vs the fp64 formula {adam}); the
  idle-expert paths (grad None; OLMoE all-zero) too.
- Not used here: PEFT's `prepare_model_for_kbit_training` (it makes the embedding output
  require a grad and turns gradient checkpointing on; not checked), double quantization,
  bf16 compute.

## The quantized modules
`{{0..7}}`: one module per expert, the same for each.
{modules}
"""


def module_lines(quantized):
    """quantized_modules with the experts of a layer folded into {0..E-1}."""
    groups = {}
    for n in quantized:
        p = re.sub(r"\.experts\.\d+\.", ".experts.{}.", n)
        groups.setdefault(p, []).append(int(m.group(1)) if (m := re.search(r"\.experts\.(\d+)\.", n)) else None)
    out = []
    for p, es in groups.items():
        if es[0] is not None:
            need(es == list(range(len(es))), f"experts {es}")
            p = p.replace("{}", f"{{0..{len(es) - 1}}}")
        out.append(p)
    return out


def write_notes(outdir, rows):
    table = "\n".join(
        f"| {r['name']} | {r['seed']} | {r['adapter_seed']} | {r['lora_adapter_seed']} | {r['n_modules']} | "
        f"{r['n_tensors']} | {r['n_quantized']} | {r['n_deq']} | "
        f"{', '.join(f'({l},{e})' for l, e in r['idle']) or '-'} | {len(r['no_grad'])} | {len(r['zero'])} | "
        f"{r['loss']:.5f} | {r['ce']:.5f} | {r['aux']:.5f} | {r['shift']:.3f} | {r['quant_shift']:.3f} | "
        f"{r['deq_err']:.4f} |" for r in rows)
    modules = "\n".join(f"\n{r['name']} ({r['n_quantized']}):\n```\n" + "\n".join(module_lines(r["quantized"]))
                        + "\n```" for r in rows)
    exact = lambda key: "0 (bit for bit)" if all(r[key] == 0 for r in rows) else "< 1e-5"  # noqa: E731
    text = mlf.reflow(NOTES.format(
        bnb=bitsandbytes.__version__, peft=peft.__version__, tf=transformers.__version__,
        torch=torch.__version__.split("+")[0], call=QUANT_CALL.replace("dir", "tmp"), rows=table,
        offset=mlf.ADAPTER_SEED_OFFSET, margin=f"{mfx.MIN_ROUTING_MARGIN:g}", lin="< 1e-5", lora_err="< 1e-5",
        deq_lora=exact("deq_lora_err"), adam="< 1e-6", modules=modules))
    need(text.count("\n@@TABLE@@\n") == 1, "NOTES table placeholder")
    text = text.replace("@@TABLE@@\n", TABLE.format(rows=table))
    with open(os.path.join(outdir, "NOTES.md"), "w") as f:
        f.write(text)


# ----------------------------------------------------------------------------- driver
def generate(outdir):
    """make_lora_fixtures' fixtures of FAMILIES (the whole-model ones), quantized."""
    os.makedirs(outdir, exist_ok=True)
    rows = [make_fixture(lf, outdir) for lf in mlf.fixtures() if lf["name"] in FAMILIES]
    write_notes(outdir, rows)
    return rows


def compare(ref_dir, new_dir):
    """make_fixtures.compare() with these fixtures and files, and no directory besides them."""
    return mlf.compare(ref_dir, new_dir, FAMILIES)


def summary(r):
    """A fixture's line on the console."""
    return (f"{r['name']:10s} seed {r['seed']} adapter seed {r['adapter_seed']} (lora {r['lora_adapter_seed']}) "
            f"LoRA modules {r['n_modules']} tensors {r['n_tensors']} quantized {r['n_quantized']} "
            f"deq elements {r['n_deq']} loss {r['loss']:.6f} ce {r['ce']:.6f} aux {r['aux']:.6f} "
            f"idle {r['idle']} no_grad {len(r['no_grad'])} zero {len(r['zero'])} |dlogit| {r['shift']:.3f} "
            f"quant |dlogit| {r['quant_shift']:.3f} |deq-W| {r['deq_err']:.4f} margin {r['margin']:.2e} "
            f"lora err {r['lora_err']:.1e} linear4bit err {r['linear_err']:.1e} "
            f"vs LoRA over deq {r['deq_lora_err']:.1e} adam err {r['adam_err']:.1e} fixture {r['size']} B")


def main():
    args = mfx.start(__doc__, DEFAULT_OUT, "tests/fixtures/qlora",
                     peft=(mlf.pinned("peft"), peft.__version__),
                     bitsandbytes=(mlf.pinned("bitsandbytes"), bitsandbytes.__version__))
    warnings.filterwarnings("ignore", message="Could not find a config file in")
    check_sources()
    mfx.write_or_check(args, generate, compare, summary)


if __name__ == "__main__":
    main()
