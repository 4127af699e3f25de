#!/usr/bin/env python3
"""Writes the FP8 checkpoint fixtures of tests/fixtures/fp8ckpt/ with transformers' FP8 quantizer + PEFT.

Run it in the venv of tools/requirements-fixtures.txt (everything runs on the CPU):

    /tmp/fixvenv/bin/python tools/make_fp8_fixtures.py            # rewrite tests/fixtures/fp8ckpt
    /tmp/fixvenv/bin/python tools/make_fp8_fixtures.py --check    # compare only

These are checkpoints SHIPPED FP8 e4m3 with 128x128 block scales, as the DeepSeek-V3 and
Qwen3-*-FP8 releases ship them: config.json carries
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "modules_to_not_convert":
                            [...], "quant_method": "fp8", "weight_block_size": [128, 128]}
and every quantized Linear <m> is stored as <m>.weight F8_E4M3 [rows, cols] and
<m>.weight_scale_inv F32 [rows/128, cols/128]. For qwen3_moe and mixtral (SPECS) a tiny float32
model is built by make_fixtures' build() (its seeded numpy init and batch rule) with the dims of
SPECS instead of make_fixtures' COMMON (every quantized weight's rows and cols multiples of 128:
transformers' quantizer refuses others). Every nn.Linear of the decoder layers is quantized but
the routers (mlp.gate / block_sparse_moe.gate), which with lm_head make modules_to_not_convert
(full module names: transformers matches them as substrings); each weight by transformers' own
    FineGrainedFP8HfQuantizer(FineGrainedFP8Config(weight_block_size=[128, 128],
        modules_to_not_convert=[...]), pre_quantized=False).create_quantized_param(...)
on the CPU (make_quant_fixtures' _Holder, as its fp8_cases). It writes
tests/fixtures/fp8ckpt/<name>/
  config.json                the fp32 model's config.json (save_pretrained) plus the
                             quantization_config block: FineGrainedFP8Config(...).to_dict() (what
                             save_pretrained of an FP8-loaded model writes) and "fmt": "e4m3"
                             (to_dict has no fmt; the real releases carry it)
  model.safetensors          the FP8 weights and their scales, every other tensor F32 (embeddings,
                             norms, routers, lm_head: the fp32 model's); names sorted, data in that
                             order, metadata {"format": "pt"} (make_quant_fixtures' write_st)
  adapter_config.json,       PeftModel.save_pretrained of make_lora_fixtures' LoRA for the family
  adapter_model.safetensors  (byte for byte ../lora/<family>/adapter_config.json; adapters
                             N(0, 0.1^2) from an adapter seed, lora_B nonzero) over the
                             dequantized model (below); the model card deleted, mode 0644
  expected.safetensors       make_fixtures' write_st: input_ids [B,T] I32, logits [B,T,V] F32 of
                             the dequantized model (eval, no adapters), peft_logits [B,T,V] F32
                             with the adapter, deq.<name> F32 [rows, cols] of two FP8 weights
and tests/fixtures/fp8ckpt/NOTES.md.

The reference: transformers' FP8 forward (FP8Linear, a triton kernel) needs a GPU, and 4.57's
FineGrainedFP8Config has no dequantize option; the reference is the dequantized model:
deq = weight.to(float32) * scale_inv repeat_interleave'd over its 128x128 blocks (one fp32
product per element), loaded into the float transformers model (fp32, attn_implementation="eager").

The batch is make_fixtures' build() batch where the dequantized model routes it (every top-k
choice) MIN_ROUTING_MARGIN from a tie, else the first seeded one from seed + make_bnb_fixtures'
BATCH_SEED_OFFSET that it does (make_bnb_fixtures' pick_batch); the adapter seed counts up from
seed + make_lora_fixtures' ADAPTER_SEED_OFFSET until the PeftModel keeps that margin too.

Checked: the FP8 bits equal the quantizer maths written out (NOTES.md); transformers' own FP8 model
(AutoHfQuantizer.from_config(config.json's block, pre_quantized=True) and its
_process_model_before_weight_loading, as from_pretrained does) has exactly the FP8Linear modules
quantized here and exactly model.safetensors' names, dtypes and shapes, and load_state_dict
(strict) takes the file; the weights decoded from the file alone in numpy equal deq bit for bit
and, with the file's other tensors in a fresh fp32 model, give logits and (with
PeftModel.from_pretrained) peft_logits bit for bit.

Determinism and --check: those of make_bnb_fixtures (PYTHONHASHSEED=0 by re-executing,
make_fixtures' torch settings). Two runs give byte-identical files. --check regenerates into a
temporary directory: every file but expected.safetensors (and NOTES.md) byte for byte;
expected.safetensors with the same names, dtypes, shapes and metadata, input_ids and deq.* exact,
logits within make_fixtures' CHECK_RTOL / CHECK_ATOL (make_bnb_fixtures' compare_expected).
"""

import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:])
os.environ["HF_HUB_OFFLINE"] = "1"  # PEFT's save looks for a base config by name_or_path ("")
os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU build of everything

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mfx  # noqa: E402  (sets MKL_CBWR etc. before torch loads)
import make_lora_fixtures as mlf  # noqa: E402
import make_bnb_fixtures as mbf  # noqa: E402
import make_quant_fixtures as mqz  # noqa: E402

import copy  # noqa: E402
import filecmp  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import struct  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import peft  # noqa: E402
import safetensors  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from peft import PeftModel  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import AutoModelForCausalLM, FineGrainedFP8Config, MixtralConfig, Qwen3MoeConfig  # noqa: E402
from transformers.integrations.finegrained_fp8 import FP8Linear  # noqa: E402
from transformers.quantizers.auto import AutoHfQuantizer  # noqa: E402
from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer  # noqa: E402

need = mfx.need
DEFAULT_OUT = os.path.join(mlf.FIXTURES_DIR, "fp8ckpt")
BLOCK = [128, 128]
FMT = "e4m3"  # config.json's "fmt", as DeepSeek-V3 / Qwen3-FP8 carry it (FineGrainedFP8Config drops it)
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# fixture -> family, seed, router module (last two name parts), the dims that replace make_fixtures' COMMON
SPECS = {
    "qwen3_moe": dict(family="qwen3_moe", config=Qwen3MoeConfig, seed=6000, router="mlp.gate", dims=dict(
        vocab_size=64, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, intermediate_size=128, moe_intermediate_size=128, num_experts=4, num_experts_per_tok=2,
        mlp_only_layers=[], decoder_sparse_step=2, norm_topk_prob=True, rope_theta=1e6)),
    "mixtral": dict(family="mixtral", config=MixtralConfig, seed=7000, router="block_sparse_moe.gate", dims=dict(
        vocab_size=64, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=128, num_local_experts=4, num_experts_per_tok=2, rope_theta=1e4,
        router_jitter_noise=0.0)),
}
NAMES = list(SPECS)
OUT_FILES = mbf.OUT_FILES
QUANT_CALL = ("FineGrainedFP8HfQuantizer(FineGrainedFP8Config(weight_block_size=[128, 128], "
              "modules_to_not_convert=<routers + lm_head>), pre_quantized=False).create_quantized_param(holder, w, "
              "\"lin.weight\", \"cpu\")")
DEQ_DEF = ("deq = weight.to(torch.float32) * scale_inv.repeat_interleave(128, 0).repeat_interleave(128, 1) "
           "(one fp32 product per element)")


# ----------------------------------------------------------------------------- sources
def source_facts():
    """(citation, object, snippet that must occur in its source): how transformers quantizes, which
    modules it converts, what it stores and what it writes to config.json."""
    from transformers import configuration_utils as cu
    from transformers.integrations import finegrained_fp8 as ff
    Q = FineGrainedFP8HfQuantizer
    facts = mfx.facts
    return [
        *facts("transformers/quantizers/quantizer_finegrained_fp8.py FineGrainedFP8HfQuantizer.create_quantized_param",
               Q.create_quantized_param,
               "fp8_max = torch.finfo(torch.float8_e4m3fn).max",
               "if rows % block_size_m != 0 or cols % block_size_n != 0:",
               "max_abs = torch.amax(torch.abs(param_value), dim=(-1, -2))",
               "scale = fp8_max / max_abs",
               "quantized_param = torch.clamp(param_value * scale, min=fp8_min, max=fp8_max).to(torch.float8_e4m3fn)",
               "scale = scale.reshape(scale_orig_shape).squeeze().reciprocal()",
               '_load_parameter_into_model(model, param_name.rsplit(".", 1)[0] + ".weight_scale_inv", scale)'),
        ("transformers/quantizers/quantizer_finegrained_fp8.py FineGrainedFP8HfQuantizer.validate_environment",
         Q.validate_environment,
         'raise RuntimeError("No GPU or XPU found. A GPU or XPU is needed for FP8 quantization.")'),
        *facts("transformers/quantizers/quantizer_finegrained_fp8.py "
               "FineGrainedFP8HfQuantizer._process_model_before_weight_loading",
               Q._process_model_before_weight_loading, "model = replace_with_fp8_linear(",
               "model.config.quantization_config = self.quantization_config"),
        *facts("transformers/integrations/finegrained_fp8.py _replace_with_fp8_linear", ff._replace_with_fp8_linear,
               "if isinstance(module, nn.Linear) and name not in (modules_to_not_convert or []):",
               "if not any(key in current_key_name_str for key in (modules_to_not_convert or [])):"),
        *facts("transformers/integrations/finegrained_fp8.py FP8Linear.__init__", FP8Linear.__init__,
               "scale_out_features = (out_features + block_size[0] - 1) // block_size[0]",
               "scale_in_features = (in_features + block_size[1] - 1) // block_size[1]",
               "torch.empty(scale_out_features, scale_in_features, dtype=torch.float32, device=device)"),
        ("torch/_tensor.py Tensor.__rdiv__ (= __rtruediv__: float / tensor)", torch.Tensor.__rdiv__,
         "return self.reciprocal() * other"),
        ("transformers/configuration_utils.py PretrainedConfig.to_diff_dict", cu.PretrainedConfig.to_diff_dict,
         "self.quantization_config.to_dict()"),
        *facts("transformers/utils/quantization_config.py FineGrainedFP8Config.__init__",
               FineGrainedFP8Config.__init__, "self.quant_method = QuantizationMethod.FP8",
               "self.modules_to_not_convert = modules_to_not_convert",
               "self.activation_scheme = activation_scheme", "self.weight_block_size = weight_block_size"),
    ]


def check_sources():
    mlf.check_sources()  # make_fixtures' and make_lora_fixtures' facts
    mfx.check_facts(source_facts(), "transformers FP8 source fact")
    need(FP8Linear.dtype == torch.float8_e4m3fn, f"FP8Linear.dtype {FP8Linear.dtype}")
    need(torch.finfo(torch.float8_e4m3fn).max == FP8_MAX, "e4m3fn max")
    need(torch.Tensor.__rtruediv__ is torch.Tensor.__rdiv__, "Tensor.__rtruediv__ is not __rdiv__")
    need(not hasattr(FineGrainedFP8Config(dequantize=True), "dequantize"),
         "FineGrainedFP8Config has a dequantize option now: NOTES.md says it has none")


# ----------------------------------------------------------------------------- model
def fx_of(name):
    """make_fixtures' FIXTURES entry for build(): SPECS' dims replace COMMON's."""
    s = SPECS[name]
    return dict(name=name, config=lambda **kw: s["config"](**dict(kw, **s["dims"])), kw={}, seed=s["seed"],
                need_idle_expert=False)


def linears(model):
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def routers(name, model):
    rs = [n for n in linears(model) if n.endswith("." + SPECS[name]["router"])]
    moe = [i for i, l in enumerate(model.model.layers) if mfx.moe_block(l) is not None]
    need(rs == [f"model.layers.{i}.{SPECS[name]['router']}" for i in moe] and rs, f"{name}: routers {rs}")
    return rs


def quantize(qz, w):
    """transformers' create_quantized_param on one [rows, cols] fp32 weight (make_quant_fixtures' _Holder:
    a module holding one FP8Linear). Returns the F8_E4M3 weight and the F32 [rows/128, cols/128] scale_inv."""
    rows, cols = w.shape
    holder = mqz._Holder(rows, cols)
    qz.create_quantized_param(holder, w.detach().clone(), "lin.weight", "cpu")
    q, s = holder.lin.weight.data, holder.lin.weight_scale_inv.data.reshape(rows // BLOCK[0], cols // BLOCK[1])
    need(q.dtype == torch.float8_e4m3fn and tuple(q.shape) == (rows, cols) and s.dtype == torch.float32,
         f"quantized {q.dtype} {tuple(q.shape)} {s.dtype}")
    # the same maths written out (NOTES.md): per 128x128 block, scale = fl(fl(1 / max|w|) * 448) (a Python
    # float over a tensor is Tensor.__rdiv__: reciprocal, then product), q = fp8(clamp(w * scale, -448, 448))
    # (round to nearest even), scale_inv = fl(1 / scale)
    blocks = w.detach().reshape(rows // BLOCK[0], BLOCK[0], cols // BLOCK[1], BLOCK[1])
    scale = blocks.abs().amax(dim=(1, 3)).reciprocal() * FP8_MAX
    q_ref = torch.clamp(blocks * scale[:, None, :, None], -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    need(torch.equal(q.view(torch.uint8), q_ref.reshape(rows, cols).view(torch.uint8))
         and torch.equal(s, scale.reciprocal()), "create_quantized_param differs from the maths NOTES.md states")
    return q.contiguous(), s.contiguous()


def dequantize(q, s):
    return q.to(torch.float32) * s.repeat_interleave(BLOCK[0], 0).repeat_interleave(BLOCK[1], 1)


def deq_from_file(t, w):
    """Weight w F32 [rows, cols] from the file alone, in numpy: the e4m3fn byte's value (table of all 256,
    torch's cast) times its block's scale_inv, one fp32 product."""
    table = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    codes, s = t[w].view(torch.uint8).numpy(), t[w + "_scale_inv"].numpy()
    vals = table[codes.astype(np.int64)] * np.repeat(np.repeat(s, BLOCK[0], 0), BLOCK[1], 1)
    need(vals.dtype == np.float32, "product dtype")
    return vals


def deq_names(name, model):
    """The two weights whose dequantization expected.safetensors holds."""
    names = ["model.layers.0.self_attn.q_proj.weight",
             mfx.expert_prefix(model, 1, 0) + mbf.DOWN.get(SPECS[name]["family"], "down_proj") + ".weight"]
    need(names[1] == {"qwen3_moe": "model.layers.1.mlp.experts.0.down_proj.weight",
                      "mixtral": "model.layers.1.block_sparse_moe.experts.0.w2.weight"}[name], f"{name}: {names}")
    return names


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), n


# ----------------------------------------------------------------------------- checks
def check_config(name, d, float_cfg, qc):
    """config.json = the fp32 model's plus quantization_config = qc.to_dict() (JSON) + fmt; that
    block without fmt is what save_pretrained writes for a config holding qc itself."""
    with open(os.path.join(d, "config.json")) as f:
        text = f.read()
    cfg = json.loads(text)
    block = cfg.pop("quantization_config")
    need(cfg == float_cfg, f"{name}: config.json differs from the fp32 model's beyond quantization_config")
    want = json.loads(json.dumps(qc.to_dict()))
    need("fmt" not in want, f"{name}: FineGrainedFP8Config.to_dict() has a fmt now")
    need(block == dict(want, fmt=FMT), f"{name}: quantization_config {block}")
    m = re.search(r'\n  "quantization_config": \{\n.*?\n  \},?\n', text, re.S)
    need(m, f"{name}: quantization_config block")
    return block, m.group(0).strip("\n").rstrip(",")


def check_checkpoint(name, d, quantized, qblock):
    """model.safetensors against transformers' own FP8 model: the quantizer config.json's block
    selects (AutoHfQuantizer.from_config, pre_quantized=True), _process_model_before_weight_loading on
    a fresh model of config.json: its FP8Linear modules are exactly `quantized`, its state_dict's
    names, dtypes and shapes exactly the file's, and load_state_dict(strict=True) takes the file."""
    path = os.path.join(d, "model.safetensors")
    header, hlen = read_header(path)
    meta = header.pop("__metadata__", None)
    need(meta == {"format": "pt"}, f"{name}: model.safetensors metadata {meta}")
    need(list(header) == sorted(header), f"{name}: model.safetensors names not in sorted order")
    offs = [header[k]["data_offsets"] for k in header]
    need(offs[0][0] == 0 and all(a[1] == b[0] for a, b in zip(offs, offs[1:])), f"{name}: data not in name order")
    with safe_open(path, framework="pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    config = transformers.AutoConfig.from_pretrained(d)
    hq = AutoHfQuantizer.from_config(qblock, pre_quantized=True)
    need(type(hq) is FineGrainedFP8HfQuantizer, f"{name}: quantizer {type(hq).__name__}")
    fm = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    hq._process_model_before_weight_loading(fm, keep_in_fp32_modules=fm._keep_in_fp32_modules)
    fp8 = [n for n, m in fm.named_modules() if isinstance(m, FP8Linear)]
    need(fp8 == quantized, f"{name}: transformers converts {fp8}")
    st_dtype = {torch.float8_e4m3fn: "F8_E4M3", torch.float32: "F32"}
    want = {k: (st_dtype[v.dtype], list(v.shape)) for k, v in fm.state_dict().items()}
    have = {k: (h["dtype"], h["shape"]) for k, h in header.items()}
    need(want == have, f"{name}: the file's tensors differ from transformers' FP8 model's: "
                       f"{sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))}")
    fm.load_state_dict(t, strict=True, assign=True)
    fp8_names = sorted(k for k, h in header.items() if h["dtype"] == "F8_E4M3")
    need(fp8_names == sorted(m + ".weight" for m in quantized), f"{name}: F8_E4M3 tensors {fp8_names}")
    return header, hlen, t, fp8_names


# ----------------------------------------------------------------------------- one fixture
def make_fixture(name, outdir):
    spec = SPECS[name]
    family, seed, fx = spec["family"], spec["seed"], fx_of(name)
    base, ids = mfx.build(fx, seed)  # the fp32 model and build()'s batch
    base.eval()
    cfg = base.config
    rs = routers(name, base)
    not_convert = rs + ["lm_head"]
    quantized = [n for n in linears(base) if n not in not_convert]
    need(quantized and all(base.get_submodule(n).bias is None for n in quantized), f"{name}: biases")
    for n in quantized:
        r, c = base.get_submodule(n).weight.shape
        need(r % BLOCK[0] == 0 and c % BLOCK[1] == 0, f"{name}: {n} [{r}, {c}] not in 128x128 blocks")
    qc = FineGrainedFP8Config(weight_block_size=list(BLOCK), modules_to_not_convert=list(not_convert))
    qz = FineGrainedFP8HfQuantizer(qc, pre_quantized=False)

    # the checkpoint: FP8 weights + scales, everything else the fp32 model's
    sd = base.state_dict()
    need(sorted(sd) == sorted(n for n, _ in base.named_parameters()), f"{name}: state_dict is not the parameters")
    ckpt, deq = {}, {}
    for m in quantized:
        q, s = quantize(qz, sd[m + ".weight"])
        ckpt[m + ".weight"], ckpt[m + ".weight_scale_inv"] = q, s
        deq[m + ".weight"] = dequantize(q, s)
        w = sd[m + ".weight"]
        amax = s.repeat_interleave(BLOCK[0], 0).repeat_interleave(BLOCK[1], 1) * FP8_MAX
        need(((deq[m + ".weight"] - w).abs() <= amax / 16).all(), f"{name}: {m} dequantizes too far off")
    for k, v in sd.items():
        if k not in deq:
            need(v.dtype == torch.float32, f"{name}: {k} {v.dtype}")
            ckpt[k] = v.detach().contiguous()
    d = mfx.fixture_dir(outdir, name)
    mqz.write_st(os.path.join(d, "model.safetensors"), ckpt, {"format": "pt"})

    # config.json: the fp32 model's (save_pretrained) with the quantization_config block
    with tempfile.TemporaryDirectory() as tmp:
        base.save_pretrained(tmp)
        with open(os.path.join(tmp, "config.json")) as f:
            float_cfg = json.load(f)
        qcfg = copy.deepcopy(base.config)
        qcfg.quantization_config = qc  # what save_pretrained of an FP8-loaded model writes
        qcfg.save_pretrained(tmp)
        with open(os.path.join(tmp, "config.json")) as f:
            plain = json.load(f).pop("quantization_config")
    need(plain == json.loads(json.dumps(qc.to_dict())), f"{name}: save_pretrained's block {plain}")
    qcfg.quantization_config = dict(qc.to_dict(), fmt=FMT)
    qcfg.save_pretrained(d)
    mbf.chmod_files(d)
    qblock, qc_text = check_config(name, d, float_cfg, qc)
    header, hlen, t, fp8_names = check_checkpoint(name, d, quantized, qblock)

    # the reference: the fp32 model with the dequantized weights
    dm, _ = mfx.build(fx, seed)
    with torch.no_grad():
        for w, x in deq.items():
            dm.get_submodule(w.removesuffix(".weight")).weight.copy_(x)
    ids, batch_seed, base_margin = mbf.pick_batch(name, dm, seed, ids)
    logits = mbf.logits_of(dm, ids)
    float_logits = mbf.logits_of(base, ids)
    quant_shift = float((logits - float_logits).abs().max())
    need(quant_shift > 0, f"{name}: quantization changes no logit")
    float_margin = mbf.margin_of(base, ids)
    dn = deq_names(name, dm)

    # make_lora_fixtures' LoRA over the dequantized model
    dm.name_or_path = ""  # adapter_config.json's base_model_name_or_path
    tm = mlf.target_modules(family)
    pm = mlf.lora_model(name, dm, tm, seed + mlf.ADAPTER_SEED_OFFSET, check_init=True)
    adapter_seed, peft_margin = mbf.pick_adapter(name, pm, seed, ids)
    lora_mods = sorted(n.removeprefix("base_model.model.") for n in mlf.lora_modules(pm))
    need(lora_mods == sorted(quantized), f"{name}: LoRA modules are not exactly the FP8 ones")
    peft_logits = mbf.logits_of(pm, ids)
    peft_shift = float((logits - peft_logits).abs().max())
    need(peft_shift > 1e-3, f"{name}: the adapter moves the logits by {peft_shift} only")
    with tempfile.TemporaryDirectory() as tmp:
        _, _, _, file_keys = mlf.save_adapter(name, pm, tmp)
        need(sorted(os.listdir(tmp)) == ["adapter_config.json", "adapter_model.safetensors"],
             f"{name}: PEFT wrote {sorted(os.listdir(tmp))}")
        for f in os.listdir(tmp):
            shutil.copyfile(os.path.join(tmp, f), os.path.join(d, f))
    mbf.chmod_files(d)
    need(filecmp.cmp(os.path.join(d, "adapter_config.json"),
                     os.path.join(mlf.FIXTURES_DIR, "lora", family, "adapter_config.json"), shallow=False),
         f"{name}: adapter_config.json differs from ../lora/{family}'s")

    # The files alone: weights decoded in numpy, the file's other tensors, a fresh fp32 model
    # (config.json without its block), the adapter by PeftModel.from_pretrained.
    ref_sd = {}
    for k, v in t.items():
        if k.endswith(".weight_scale_inv"):
            continue
        if k in deq:
            x = deq_from_file(t, k)
            need(np.array_equal(x, deq[k].numpy()), f"{name}: {k} decoded from the file != deq")
            ref_sd[k] = torch.from_numpy(x)
        else:
            ref_sd[k] = v
    ref = AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**float_cfg),
                                           attn_implementation="eager")
    need(type(ref) is type(base), f"{name}: {type(ref).__name__}")
    ref.load_state_dict(ref_sd, strict=True)
    ref_logits = mbf.logits_of(ref, ids)
    need(torch.equal(ref_logits, logits), f"{name}: the files alone give other logits "
                                          f"({(ref_logits - logits).abs().max().item()})")
    ref_pm = PeftModel.from_pretrained(ref, d)
    need(torch.equal(mbf.logits_of(ref_pm, ids), peft_logits), f"{name}: the files alone give other peft_logits")

    tensors = {"input_ids": ids.numpy().astype("<i4"), "logits": logits.numpy().astype("<f4"),
               "peft_logits": peft_logits.numpy().astype("<f4")}
    for w in dn:
        tensors[f"deq.{w}"] = deq[w].numpy().astype("<f4")
    meta = {
        "format": "fp8ckpt",
        "fixture": name,
        "model_type": cfg.model_type,
        "seed": str(seed),
        "init": ("make_fixtures' build(): every parameter N(0, 0.2^2), norms 1 + N(0, 0.1^2), numpy PCG64; "
                 "its dims replaced by tools/make_fp8_fixtures.py SPECS"),
        "adapter_seed": str(adapter_seed),
        "adapter_init": (f"make_lora_fixtures' init_adapters(adapter_seed): every lora_A and lora_B "
                         f"N(0, {mlf.ADAPTER_STD_A}^2 / {mlf.ADAPTER_STD_B}^2), numpy PCG64"),
        "quantization": QUANT_CALL,
        "quantization_config": json.dumps(qblock, sort_keys=True),
        "fp8_weights": json.dumps(fp8_names),
        "input_ids": ("make_fixtures' build() batch (numpy PCG64 after the parameters)" if batch_seed is None else
                      f"seeded: allowed[numpy.random.default_rng({batch_seed}).integers(0, len(allowed), (B, T))], "
                      "allowed = the ids 0..V-1 but pad_token_id, in order (make_bnb_fixtures' seeded_batch)"),
        "batch_seed": "" if batch_seed is None else str(batch_seed),
        "logits": ("model(input_ids).logits, eval mode, use_cache=False, of the fp32 model (eager) whose FP8 "
                   "weights are replaced by deq"),
        "peft_logits": "PeftModel (adapter_config.json + adapter_model.safetensors over that model), eval mode",
        "deq": "deq.<checkpoint weight name> [rows, cols] F32: " + DEQ_DEF,
        "peft": peft.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "safetensors": safetensors.__version__,
    }
    mfx.write_fixture(name, os.path.join(d, "expected.safetensors"), tensors, meta)
    need(sorted(os.listdir(d)) == sorted(OUT_FILES), f"{name}: files {sorted(os.listdir(d))}")
    sizes = {f: os.path.getsize(os.path.join(d, f)) for f in OUT_FILES}
    need(sum(sizes.values()) < 900_000, f"{name}: {sum(sizes.values())} bytes")
    return dict(name=name, family=family, seed=seed, adapter_seed=adapter_seed, batch_seed=batch_seed,
                dims=spec["dims"], routers=rs, not_convert=not_convert, fp8_names=fp8_names, qc_text=qc_text,
                header=header, hlen=hlen, n_lora=len(lora_mods), others=sorted(k for k, h in header.items()
                                                                               if h["dtype"] == "F32"
                                                                               and not k.endswith("_scale_inv")),
                sizes=sizes, peft_shift=peft_shift, quant_shift=quant_shift, base_margin=base_margin,
                peft_margin=peft_margin, float_margin=float_margin, ids=ids.tolist(), deq=dn,
                n_file_keys=len(file_keys))


# ----------------------------------------------------------------------------- NOTES.md
NOTES = """\
# FP8 checkpoints: e4m3 with 128x128 block scales, as DeepSeek-V3 / Qwen3-FP8 ship them

Written by `tools/make_fp8_fixtures.py` (do not edit; rerun it). transformers {tf}, peft {peft},
torch {torch}, safetensors {st}, float32 on the CPU.

## How they are made
A tiny random fp32 model of the family (`tools/make_fixtures.py` `build()`: its seeded numpy
init and batch rule, with the dims below instead of its `COMMON`; `attn_implementation="eager"`).
Every `nn.Linear` of the decoder layers is quantized except the routers; each weight by
transformers' own `{call}` on the CPU. `modules_to_not_convert` = the routers' full names +
`lm_head`: transformers matches its entries as **substrings** of module names
(`transformers/integrations/finegrained_fp8.py` `_replace_with_fp8_linear`: `if not any(key in
current_key_name_str for key in (modules_to_not_convert or [])):`), so a short `mlp.gate` would
also keep `mlp.gate_proj` (qwen3_moe's dense layer 0) unquantized. Read which tensors are FP8
from the file's dtypes, not from that list.

qwen3_moe has `decoder_sparse_step` 2 as `../qwen3_moe/`: layer 0 has a dense MLP (FP8 too, no
router), layer 1 the MoE; mixtral's two layers are both MoE. qwen3_moe's `q_proj` [256, 128] and
`o_proj` [128, 256] have two blocks each (`weight_scale_inv` [2, 1] and [1, 2]); every other FP8
weight, and all of mixtral's, is one 128x128 block (the smallest dims FP8 allows, to keep each
directory under 1 MB).

@@TABLE@@

## Files (`<name>/`)
- `config.json`: the fp32 model's `save_pretrained` config plus `quantization_config` =
  `FineGrainedFP8Config(weight_block_size=[128, 128], modules_to_not_convert=[...]).to_dict()`
  (exactly what `save_pretrained` writes for an FP8-loaded model:
  `PretrainedConfig.to_diff_dict` → `self.quantization_config.to_dict()`) **plus `"fmt": "e4m3"`,
  added by the script**: `to_dict()` has no `fmt`, the DeepSeek-V3 / Qwen3-FP8 releases carry it,
  and transformers ignores it (`FineGrainedFP8Config(**kwargs)` drops unknown keys). *(checked)*
  Exactly (below).
- `model.safetensors` (names sorted, data in that order, metadata `{{"format": "pt"}}`): for every
  quantized Linear `<m>`: `<m>.weight` **F8_E4M3** [rows, cols] and `<m>.weight_scale_inv` **F32**
  [rows/128, cols/128]; every other tensor F32, the fp32 model's (embeddings, norms incl. qwen3
  `q_norm`/`k_norm`, routers, `lm_head`). These names, dtypes and shapes are exactly the
  `state_dict` of transformers' own FP8 model (`AutoHfQuantizer.from_config(<the block>,
  pre_quantized=True)` → `FineGrainedFP8HfQuantizer._process_model_before_weight_loading` on a
  model of `config.json`), whose `FP8Linear` modules are exactly the quantized ones, and
  `load_state_dict(strict=True)` takes the file. *(checked)* Loading it with `from_pretrained` needs
  a GPU (`validate_environment`: `No GPU or XPU found`).
- `adapter_config.json`, `adapter_model.safetensors`: `PeftModel.save_pretrained` of
  make_lora_fixtures' LoRA (r {r}, alpha {alpha}, dropout 0, target modules = attention q/k/v/o and
  the MLP / expert projections; byte for byte `../lora/<family>/adapter_config.json`,
  `base_model_name_or_path` `""`) over the dequantized model; its LoRA modules are exactly the FP8
  Linears *(checked)*; every `lora_A`/`lora_B` N(0, {std_a}²)/N(0, {std_b}²) from the adapter seed
  (make_lora_fixtures' `init_adapters`): lora_B nonzero.
- `expected.safetensors`: `input_ids` [{B}, {T}] I32; `logits` [{B}, {T}, V] F32 (dequantized model,
  eval, no adapter); `peft_logits` [{B}, {T}, V] F32 (with the adapter); `deq.<weight>` [rows, cols]
  F32 for `model.layers.0.self_attn.q_proj.weight` and expert 0's down projection of layer 1
  (qwen3_moe `...mlp.experts.0.down_proj.weight`, mixtral `...block_sparse_moe.experts.0.w2.weight`).
  `__metadata__`: seeds, versions, `fp8_weights` (JSON), the quantization call and config.

The `quantization_config` blocks of `config.json`, exactly:
{qc_blocks}

## Quantization (transformers' `FineGrainedFP8HfQuantizer.create_quantized_param`)
Per 128x128 block B of the fp32 weight: `scale = fp8_max / max_abs` with `fp8_max` the Python
float 448.0 (`torch.finfo(torch.float8_e4m3fn).max`), which torch computes as `fl(fl(1 / max|B|) *
448)` (`torch/_tensor.py` `Tensor.__rdiv__`: `return self.reciprocal() * other`; not always the
correctly rounded 448 / max|B|), `weight = fp8_e4m3fn(clamp(B * scale, -448, 448))` (torch's cast:
round to nearest even), `weight_scale_inv = fl(1 / scale)` (`.reciprocal()`; not exactly
max|B|/448). *(checked: bit for bit on every weight)*

## The reference (what the C code must match)
transformers' FP8 forward (`FP8Linear`) needs a GPU, and 4.57's `FineGrainedFP8Config` has no
`dequantize` option (an unknown keyword is dropped) *(checked)*, so the reference is the
dequantized model: for each FP8 weight
`{deq_def}`, i.e. `W[r][c] = fp32(e4m3(weight[r][c])) * weight_scale_inv[r / 128][c / 128]`,
loaded into the fp32 transformers model (eager); `y = x·Wᵀ`. The weights decoded in numpy from
the file alone (a table of all 256 e4m3fn values) equal `deq` bit for bit, and a fresh fp32 model
of `config.json` with them and the file's other tensors gives `logits`, with
`PeftModel.from_pretrained` `peft_logits`, bit for bit. *(checked)*

The batch: make_fixtures' `build()` batch if the dequantized model routes it (every top-k choice)
at least {margin} from a tie, else the first seeded one from seed + {batch_offset}
(make_bnb_fixtures' `pick_batch`); the adapter seed: the first from seed + {offset} whose PeftModel
keeps that margin too.

## The tensors of `model.safetensors`
FP8 (expert index folded to `{{e}}`), each with its `<weight>_scale_inv`:
{fp8_lists}

F32:
{f32_lists}
"""

TABLE = """\
| name | dims | FP8 weights | routers (F32) | seed | batch | adapter seed | model.safetensors | adapter_model.safetensors | expected.safetensors | total bytes | max \\|logits − peft_logits\\| | max \\|logits − fp32 logits\\| |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
{rows}
"""


def fold_fp8(r):
    """'name F8_E4M3 shape, scale_inv shape' per FP8 weight, the expert index folded (the folded
    names have one shape each: asserted)."""
    h, out = r["header"], {}
    for w in r["fp8_names"]:
        p = re.sub(r"\.experts\.\d+\.", ".experts.{e}.", w)
        line = f"{p:<56s} F8_E4M3 {str(h[w]['shape']):<10s} + _scale_inv F32 {h[w + '_scale_inv']['shape']}"
        need(out.setdefault(p, line) == line, f"{r['name']}: {p} has several shapes")
    return list(out.values())


def write_notes(outdir, rows):
    def dims(r):
        return ", ".join(f"{k} {v}" for k, v in r["dims"].items())

    table = "\n".join(
        f"| {r['name']} | {dims(r)} | {len(r['fp8_names'])} | {', '.join(f'`{x}`' for x in r['routers'])} | "
        f"{r['seed']} | {'build()' if r['batch_seed'] is None else 'seed ' + str(r['batch_seed'])} | "
        f"{r['adapter_seed']} | {r['sizes']['model.safetensors']} | {r['sizes']['adapter_model.safetensors']} | "
        f"{r['sizes']['expected.safetensors']} | {sum(r['sizes'].values())} | {r['peft_shift']:.3f} | "
        f"{r['quant_shift']:.4f} |" for r in rows)
    qc_blocks = "\n".join(f"\n{r['name']}:\n```\n{r['qc_text']}\n```" for r in rows)
    fp8_lists = "\n".join(f"\n{r['name']} ({len(r['fp8_names'])}):\n```\n" + "\n".join(fold_fp8(r)) + "\n```"
                          for r in rows)
    f32_lists = "\n".join(f"\n{r['name']} ({len(r['others'])}):\n```\n" + "\n".join(
        f"{k:<56s} F32 {r['header'][k]['shape']}" for k in r["others"] if not k.endswith("_scale_inv")) + "\n```"
        for r in rows)
    text = mlf.reflow(NOTES.format(
        tf=transformers.__version__, peft=peft.__version__, torch=torch.__version__.split("+")[0],
        st=safetensors.__version__, call=QUANT_CALL, r=mlf.R, alpha=mlf.ALPHA, std_a=mlf.ADAPTER_STD_A,
        std_b=mlf.ADAPTER_STD_B, B=mfx.B, T=mfx.S, deq_def=DEQ_DEF, margin=f"{mfx.MIN_ROUTING_MARGIN:g}",
        batch_offset=mbf.BATCH_SEED_OFFSET, offset=mlf.ADAPTER_SEED_OFFSET, qc_blocks=qc_blocks, f32_lists=f32_lists,
        fp8_lists=fp8_lists))
    need(text.count("\n@@TABLE@@\n") == 1, "NOTES table placeholder")
    text = text.replace("@@TABLE@@\n", TABLE.format(rows=table))
    with open(os.path.join(outdir, "NOTES.md"), "w") as f:
        f.write(text.rstrip("\n") + "\n")


# ----------------------------------------------------------------------------- driver
def generate(outdir):
    os.makedirs(outdir, exist_ok=True)
    rows = [make_fixture(n, outdir) for n in NAMES]
    write_notes(outdir, rows)
    return rows


def compare(ref_dir, new_dir):
    """make_bnb_fixtures' compare over these fixtures: every file byte for byte but
    expected.safetensors (its compare_expected); no other file or directory."""
    return mbf.compare(ref_dir, new_dir, NAMES, OUT_FILES)


def summary(r):
    """A fixture's line on the console."""
    return (f"{r['name']:10s} seed {r['seed']} batch seed {r['batch_seed']} adapter seed {r['adapter_seed']} "
            f"FP8 weights {len(r['fp8_names'])} routers {r['routers']} LoRA modules {r['n_lora']} "
            f"max|logits-peft_logits| {r['peft_shift']:.4f} max|logits-fp32| {r['quant_shift']:.4f} "
            f"margin deq {r['base_margin']:.2e} peft {r['peft_margin']:.2e} fp32 {r['float_margin']:.2e} "
            f"input_ids {r['ids']} sizes {r['sizes']} total {sum(r['sizes'].values())}")


def main():
    args = mfx.start(__doc__, DEFAULT_OUT, "tests/fixtures/fp8ckpt", peft=(mlf.pinned("peft"), peft.__version__))
    warnings.filterwarnings("ignore", message="Could not find a config file in")
    check_sources()
    mfx.write_or_check(args, generate, compare, summary)


if __name__ == "__main__":
    main()
