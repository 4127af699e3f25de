#!/usr/bin/env python3
"""Writes the pre-quantized checkpoint fixtures of tests/fixtures/bnb4/ with bitsandbytes + PEFT on transformers.

Run it in the venv of tools/requirements-fixtures.txt (which pins bitsandbytes and peft too;
everything runs on the CPU):

    /tmp/fixvenv/bin/python tools/make_bnb_fixtures.py            # rewrite tests/fixtures/bnb4
    /tmp/fixvenv/bin/python tools/make_bnb_fixtures.py --check    # compare only

These are checkpoints SHIPPED quantized, byte for byte as transformers + bitsandbytes write
them, for the C code to read as shipped. For mixtral, qwen2_moe, qwen3_moe and olmoe, and once
more for mixtral without double quantization (mixtral_plain), the base is built by
make_fixtures' build() with its seed (saved, it is byte for byte tests/fixtures/<family>/:
asserted, via make_lora_fixtures' save_base), saved to a temporary directory, reloaded with
    AutoModelForCausalLM.from_pretrained(dir, quantization_config=BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.float32), device_map="cpu", dtype=torch.float32,
        attn_implementation="eager")
(mixtral_plain: bnb_4bit_use_double_quant=False) and saved with save_pretrained; then
make_lora_fixtures' LoRA (its LoraConfig and target modules for the family, adapters
N(0, 0.1^2) from an adapter seed) wraps that in-memory 4-bit model. It writes
tests/fixtures/bnb4/<name>/
  config.json, model.safetensors   model.save_pretrained(dir) of the 4-bit model, untouched
                                   (generation_config.json, which it writes too, deleted;
                                   mode 0644): packed NF4 weights and their quant state,
                                   config.json with its quantization_config block
  adapter_config.json,             PeftModel.save_pretrained(dir), untouched (the model card
  adapter_model.safetensors        deleted, mode 0644); adapter_config.json is byte for byte
                                   ../lora/<family>/adapter_config.json
  expected.safetensors             make_fixtures' write_st: input_ids [B,T] I32 (the batch,
                                   below), logits [B,T,V] F32 of the 4-bit model (eval mode, no
                                   adapters), peft_logits [B,T,V] F32 of the PeftModel (eval
                                   mode), deq.<checkpoint name> F32 [out, in] =
                                   bitsandbytes.functional.dequantize_4bit(w.data, w.quant_state)
                                   for one attention and one expert projection; metadata:
                                   versions, quantized_modules (JSON), settings.
and tests/fixtures/bnb4/NOTES.md: the file format and the maths the C code must match, stated
from the files and from the installed bitsandbytes / transformers sources (each quoted fact
asserted: source_facts), and checked numerically (every quantized weight of every file,
decoded in numpy from the file alone, equals dequantize_4bit bit for bit; an fp32 model with
those weights gives logits and peft_logits; the files alone reload to the same logits).

Linear4bit.forward takes a bf16 path (weights repacked, gemv_4bit) in eval mode on a CPU with
AVX512-BF16; the script turns that off (support_avx512bf16_for_cpu = False on every layer) so
that the logits are the fp32 ones on every machine.

The batch is ../lora/<family>'s where the 4-bit model routes it (every top-k choice)
MIN_ROUTING_MARGIN from a tie, else the first one drawn as build() draws its own from seed
base seed + BATCH_SEED_OFFSET on that it does (mixtral, mixtral_plain). The adapter seed counts
up from base seed + make_lora_fixtures' ADAPTER_SEED_OFFSET until the PeftModel keeps the
routing of that batch MIN_ROUTING_MARGIN apart too.

Determinism and --check: those of make_qlora_fixtures (PYTHONHASHSEED=0 by re-executing,
make_fixtures' torch settings, CUDA_VISIBLE_DEVICES empty so bitsandbytes takes its CPU
library). Two runs give byte-identical files. --check regenerates into a temporary directory:
every file but expected.safetensors (and NOTES.md) byte for byte; expected.safetensors with the
same names, dtypes, shapes and metadata, input_ids and deq.* exact, logits within make_fixtures'
CHECK_RTOL / CHECK_ATOL.
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
import make_qlora_fixtures as mqf  # noqa: E402

import filecmp  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import struct  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402

import bitsandbytes  # noqa: E402
import bitsandbytes.functional as BF  # noqa: E402
import numpy as np  # noqa: E402
import peft  # noqa: E402
import safetensors  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from peft import PeftModel  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

need = mfx.need
FIXTURES_DIR = mlf.FIXTURES_DIR
DEFAULT_OUT = os.path.join(FIXTURES_DIR, "bnb4")
# fixture -> (family, bnb_4bit_use_double_quant)
SPECS = {"mixtral": ("mixtral", True), "qwen2_moe": ("qwen2_moe", True), "qwen3_moe": ("qwen3_moe", True),
         "olmoe": ("olmoe", True), "mixtral_plain": ("mixtral", False)}
NAMES = list(SPECS)
OUT_FILES = ["config.json", "model.safetensors", "adapter_config.json", "adapter_model.safetensors",
             "expected.safetensors"]

BLOCKSIZE = 64  # Params4bit's default (transformers passes none)
NESTED_BLOCKSIZE = 256  # quantize_4bit's compress_statistics: quantize_blockwise(..., blocksize=256)
QS_KEY = "quant_state.bitsandbytes__nf4"
BATCH_SEED_OFFSET, BATCH_SEED_TRIES = 200000, 200  # where ../lora's batch is routed too close to a tie
QUANT_CALL = ('AutoModelForCausalLM.from_pretrained(dir, quantization_config=BitsAndBytesConfig(load_in_4bit=True, '
              'bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant={dq}, bnb_4bit_compute_dtype=torch.float32), '
              'device_map="cpu", dtype=torch.float32, attn_implementation="eager")')
EXAMPLE = ("mixtral", "model.layers.1.block_sparse_moe.experts.0.w2.weight")  # the weight NOTES.md shows in full
DOWN = {"mixtral": "w2"}


def quant_call(dq):
    return QUANT_CALL.format(dq=dq)


# ----------------------------------------------------------------------------- sources
def source_facts():
    """(citation, object, snippet that must occur in its source), besides make_qlora_fixtures':
    double quantization, its dequantization and forward, and how the checkpoint is serialized."""
    from bitsandbytes import utils as butils
    from bitsandbytes.autograd import _functions as bfun
    from bitsandbytes.backends.cpu import ops as cpu_ops
    from bitsandbytes.backends.default import ops as def_ops
    from bitsandbytes.nn import modules as bmod
    from transformers import PreTrainedModel
    from transformers import configuration_utils as cu
    from transformers.models.auto import auto_factory
    from transformers.quantizers import quantizer_bnb_4bit as q4
    from transformers.utils import quantization_config as qc
    facts = mfx.facts
    QS = BF.QuantState
    return [
        # double quantization at load
        *facts("bitsandbytes/functional.py quantize_4bit", BF.quantize_4bit,
               "if compress_statistics:", "offset = _absmax.mean()",
               "qabsmax, state2 = quantize_blockwise(_absmax - offset, blocksize=256)",
               "code = get_4bit_type(quant_type, device=A.device)"),
        *facts("bitsandbytes/functional.py quantize_blockwise", BF.quantize_blockwise,
               'name2qmap["dynamic"] = create_dynamic_map().to(A.device)',
               "_out, _absmax = torch.ops.bitsandbytes.quantize_blockwise.default("),
        ("bitsandbytes/backends/cpu/ops.py quantize_blockwise (cpu kernel)", cpu_ops,
         "lib.cquantize_blockwise_cpu_fp32("),
        # dequantization with double quantization
        *facts("bitsandbytes/functional.py dequantize_4bit", BF.dequantize_4bit,
               "absmax = dequantize_blockwise(quant_state.absmax, quant_state.state2)",
               "absmax += quant_state.offset"),
        ("bitsandbytes/functional.py dequantize_blockwise", BF.dequantize_blockwise,
         "return torch.ops.bitsandbytes.dequantize_blockwise.default("),
        ("bitsandbytes/backends/cpu/ops.py dequantize_blockwise (cpu kernel)", cpu_ops,
         "lib.cdequantize_blockwise_cpu_fp32("),
        # the forward of a double-quantized layer without grad (eval)
        *facts("bitsandbytes/autograd/_functions.py matmul_4bit", bfun.matmul_4bit,
               "elif quant_state.state2.blocksize == 256:", "absmax_8bit=quant_state.absmax,",
               "absmax_code=quant_state.state2.code,", "absmax_offset=quant_state.offset,"),
        *facts("bitsandbytes/backends/default/ops.py _gemm_4bit_default_impl", def_ops._gemm_4bit_default_impl,
               "torch.ops.bitsandbytes.dequantize_blockwise.default(absmax_8bit, absmax, absmax_code, 256, "
               "torch.float32)", "+ absmax_offset"),
        *facts("bitsandbytes/nn/modules.py Linear4bit.forward", bmod.Linear4bit.forward,
               "and self.support_avx512bf16_for_cpu", "and x.requires_grad == False"),
        ("bitsandbytes/nn/modules.py Linear4bit.__init__", bmod.Linear4bit.__init__,
         "self.support_avx512bf16_for_cpu = has_avx512bf16()"),
        # serialization: Linear4bit._save_to_state_dict -> QuantState.as_dict(packed=True)
        *facts("bitsandbytes/nn/modules.py Linear4bit._save_to_state_dict", bmod.Linear4bit._save_to_state_dict,
               "for k, v in self.weight.quant_state.as_dict(packed=True).items():",
               'destination[prefix + "weight." + k] = v if keep_vars else v.detach()'),
        *facts("bitsandbytes/functional.py QuantState.as_dict", QS.as_dict,
               '"quant_type": self.quant_type,', '"absmax": self.absmax,', '"blocksize": self.blocksize,',
               '"quant_map": self.code,', '"dtype": str(self.dtype).strip("torch."),',
               '"shape": tuple(self.shape) if self.shape is not None else None,',
               '"nested_absmax": self.state2.absmax,', '"nested_blocksize": self.state2.blocksize,',
               '"nested_quant_map": self.state2.code.clone(),',
               '"nested_dtype": str(self.state2.dtype).strip("torch."),',
               '"nested_offset": self.offset.item(),',
               "qs_packed_dict = {k: v for k, v in qs_dict.items() if isinstance(v, torch.Tensor)}",
               'key = "quant_state.bitsandbytes__"', "qs_packed_dict[key] = pack_dict_to_tensor(non_tensor_dict)"),
        *facts("bitsandbytes/utils.py pack_dict_to_tensor", butils.pack_dict_to_tensor,
               "json_str = json.dumps(source_dict)", 'json_bytes = json_str.encode("utf-8")',
               "tensor_data = torch.tensor(list(json_bytes), dtype=torch.uint8)"),
        # reading it back
        *facts("bitsandbytes/functional.py QuantState.from_dict", QS.from_dict,
               "qs_dict.update(unpack_tensor_to_dict(qs_dict.pop(first_qs_key)))",
               'offset = torch.tensor(float(qs_dict["nested_offset"])).to(device)',
               'blocksize=qs_dict["nested_blocksize"],', 'code=qs_dict["nested_quant_map"].to(device),',
               'code=qs_dict["quant_map"].to(device),', 'shape=torch.Size(qs_dict["shape"])'),
        ("bitsandbytes/utils.py unpack_tensor_to_dict", butils.unpack_tensor_to_dict,
         'json_str = json_bytes.decode("utf-8")'),
        ("bitsandbytes/nn/modules.py Params4bit.from_prequantized", bmod.Params4bit.from_prequantized,
         "self.quant_state = QuantState.from_dict(qs_dict=quantized_stats, device=device)"),
        *facts("transformers/quantizers/quantizer_bnb_4bit.py Bnb4BitHfQuantizer.__init__",
               q4.Bnb4BitHfQuantizer.__init__,
               'f"quant_state.bitsandbytes__{self.quantization_config.bnb_4bit_quant_type}",',
               'self.bnb_keys.extend(["nested_absmax", "nested_quant_map"])'),
        ("transformers/quantizers/quantizer_bnb_4bit.py Bnb4BitHfQuantizer.create_quantized_param",
         q4.Bnb4BitHfQuantizer.create_quantized_param, "new_value = bnb.nn.Params4bit.from_prequantized("),
        ("transformers/quantizers/quantizer_bnb_4bit.py Bnb4BitHfQuantizer._process_model_before_weight_loading",
         q4.Bnb4BitHfQuantizer._process_model_before_weight_loading,
         "model.config.quantization_config = self.quantization_config"),
        # a directory holding adapter_config.json is loaded as an adapter over its base
        ("transformers/modeling_utils.py PreTrainedModel.from_pretrained", PreTrainedModel.from_pretrained,
         'pretrained_model_name_or_path = json.load(f)["base_model_name_or_path"]'),
        ("transformers/models/auto/auto_factory.py _BaseAutoModelClass.from_pretrained",
         auto_factory._BaseAutoModelClass.from_pretrained,
         'pretrained_model_name_or_path = adapter_config["base_model_name_or_path"]'),
        # config.json's block
        ("transformers/configuration_utils.py PretrainedConfig.to_diff_dict", cu.PretrainedConfig.to_diff_dict,
         "self.quantization_config.to_dict()"),
        *facts("transformers/utils/quantization_config.py BitsAndBytesConfig.to_dict", qc.BitsAndBytesConfig.to_dict,
               "output = copy.deepcopy(self.__dict__)",
               'output["bnb_4bit_compute_dtype"] = str(output["bnb_4bit_compute_dtype"]).split(".")[1]',
               'output["load_in_4bit"] = self.load_in_4bit'),
    ]


def check_sources():
    mqf.check_sources()  # make_fixtures', make_lora_fixtures' and make_qlora_fixtures' facts
    mfx.check_facts(source_facts(), "bitsandbytes source fact")
    from bitsandbytes.cextension import lib
    for sym in ("cquantize_blockwise_cpu_fp32", "cdequantize_blockwise_cpu_fp32",
                "cdequantize_blockwise_cpu_nf4_fp32"):
        need(hasattr(lib, sym), f"bitsandbytes' native CPU library has no {sym}")
    need(torch._C._dispatch_has_kernel_for_dispatch_key("bitsandbytes::dequantize_blockwise", "CPU"),
         "bitsandbytes::dequantize_blockwise has no CPU kernel")
    need(torch.equal(BF.create_dynamic_map(), BF.create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)),
         "create_dynamic_map defaults")


# ----------------------------------------------------------------------------- the checkpoint file
def read_checkpoint(path):
    """(header {name: {dtype, shape, data_offsets}}, header byte length, {name: numpy array}) of a
    safetensors file, U8 and F32 tensors."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    with safe_open(path, framework="np") as f:
        need(sorted(f.keys()) == sorted(header), f"{path}: header names")
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    for k, h in header.items():
        need(h["dtype"] in ("U8", "F32") and list(tensors[k].shape) == h["shape"], f"{path}: {k} {h}")
    return header, n, tensors


def quant_state_json(t, w):
    """The JSON text packed into <w>.quant_state.bitsandbytes__nf4 (UTF-8 bytes, one per U8 element)."""
    return bytes(t[f"{w}.{QS_KEY}"].tobytes()).decode("utf-8")


def nested(qs):
    return "nested_offset" in qs


def absmax_from_file(t, w, qs):
    """The fp32 absmax of every 64-block of weight w, from the file alone: the stored F32 absmax, or
    with double quantization fl32(fl32(nested_quant_map[absmax[j]] * nested_absmax[j // 256]) + offset),
    offset = float32(nested_offset)."""
    if not nested(qs):
        return t[f"{w}.absmax"]
    qa = t[f"{w}.absmax"].astype(np.int64)
    a = t[f"{w}.nested_quant_map"][qa] * t[f"{w}.nested_absmax"][np.arange(qa.size) // qs["nested_blocksize"]]
    need(a.dtype == np.float32, "absmax product dtype")
    return a + np.float32(qs["nested_offset"])


def deq_from_file(t, w):
    """Weight w [out, in] F32 decoded from the file alone, as NOTES.md says the C code must: codes two
    a byte, the first in the high nibble, row-major; fl32(quant_map[code] * absmax[i // 64])."""
    qs = json.loads(quant_state_json(t, w))
    packed = t[w].reshape(-1)
    n = int(np.prod(qs["shape"]))
    q = np.empty(2 * packed.size, dtype=np.int64)
    q[0::2], q[1::2] = packed >> 4, packed & 0xF
    absmax = absmax_from_file(t, w, qs)
    vals = t[f"{w}.quant_map"][q[:n]] * absmax[np.arange(n) // qs["blocksize"]]
    need(vals.dtype == np.float32, "product dtype")
    return vals.reshape(qs["shape"])


def check_checkpoint(name, d, model, base, quantized, dq):
    """model.safetensors as save_pretrained wrote it: per quantized module exactly the tensors
    <m>.weight (U8 [(n+1)//2, 1]), .absmax, .quant_map, .quant_state.bitsandbytes__nf4 (and
    .nested_absmax, .nested_quant_map), with the quant state the JSON of QuantState.as_dict; every
    other tensor F32 and the fp32 base's; the bits those of quantize_4bit of the fp32 weight (and of
    make_quant_fixtures' families.safetensors); the weight decoded from the file alone (deq_from_file)
    equal to dequantize_4bit bit for bit. Returns a description of the file for NOTES.md."""
    header, hlen, t = read_checkpoint(os.path.join(d, "model.safetensors"))
    with safe_open(os.path.join(d, "model.safetensors"), framework="np") as f:
        need(f.metadata() == {"format": "pt"}, f"{name}: model.safetensors metadata {f.metadata()}")
    suffixes = ["", ".absmax", ".quant_map", "." + QS_KEY] + ([".nested_absmax", ".nested_quant_map"] if dq else [])
    qnames = {f"{m}.weight{s}" for m in quantized for s in suffixes}
    need(qnames <= set(header), f"{name}: missing {sorted(qnames - set(header))}")
    others = sorted(set(header) - qnames)
    base_sd = base.state_dict()
    need(others == sorted(k for k in base_sd if k.removesuffix(".weight") not in quantized),
         f"{name}: unquantized tensors {others}")
    for k in others:
        need(header[k]["dtype"] == "F32" and np.array_equal(t[k], base_sd[k].numpy()),
             f"{name}: {k} is not the fp32 base's")
    nf4 = BF.get_4bit_type("nf4", device="cpu").numpy()
    dyn = BF.create_dynamic_map().numpy()
    fam = {}
    if os.path.exists(mqf.QUANT_FAMILIES):
        with safe_open(mqf.QUANT_FAMILIES, framework="pt") as f:
            fam = {k: f.get_tensor(k) for k in f.keys() if k.startswith(SPECS[name][0] + "/") and
                   k.endswith((".nf4", ".absmax"))}
    one_block = []
    qs_keys = ["quant_type", "blocksize", "dtype", "shape"] + (
        ["nested_blocksize", "nested_dtype", "nested_offset"] if dq else [])
    for m in quantized:
        w = m + ".weight"
        lay = mqf.layer(model, m)
        w0 = base.get_submodule(m).weight.detach()
        n = w0.numel()
        nblocks = -(-n // BLOCKSIZE)
        js = quant_state_json(t, w)
        qs = json.loads(js)
        need(list(qs) == qs_keys, f"{name}: {w} quant state keys {list(qs)}")
        need(js == json.dumps(qs), f"{name}: {w} quant state is not json.dumps' text")
        need(qs["quant_type"] == "nf4" and qs["blocksize"] == BLOCKSIZE and qs["dtype"] == "float32"
             and qs["shape"] == list(w0.shape), f"{name}: {w} quant state {qs}")
        need(header[w]["dtype"] == "U8" and header[w]["shape"] == [(n + 1) // 2, 1], f"{name}: {w} {header[w]}")
        need(header[w + ".quant_map"] == dict(header[w + ".quant_map"], dtype="F32", shape=[16])
             and np.array_equal(t[w + ".quant_map"], nf4), f"{name}: {w}.quant_map is not the NF4 table")
        need(header[f"{w}.{QS_KEY}"]["dtype"] == "U8" and header[f"{w}.{QS_KEY}"]["shape"] == [len(js.encode())],
             f"{name}: {w} quant state tensor")
        # the bits: quantize_4bit of the fp32 weight, double quantization of its fp32 absmax
        q1, st1 = BF.quantize_4bit(w0, blocksize=BLOCKSIZE, compress_statistics=False, quant_type="nf4")
        need(np.array_equal(t[w].reshape(-1), q1.numpy().reshape(-1)), f"{name}: {w} codes != quantize_4bit's")
        if fam:
            need(np.array_equal(t[w].reshape(-1), fam[f"{SPECS[name][0]}/{w}.nf4"].numpy())
                 and torch.equal(st1.absmax, fam[f"{SPECS[name][0]}/{w}.absmax"]),
                 f"{name}: {w} differs from {mqf.QUANT_FAMILIES}")
        if dq and nblocks == 1:  # offset = the one absmax: absmax - offset = 0
            need(t[w + ".nested_absmax"][0] == 0 and absmax_from_file(t, w, qs)[0] == np.float32(qs["nested_offset"])
                 == st1.absmax[0].item(), f"{name}: {w}: one block, but the absmax does not read back as the offset")
            one_block.append(w)
        if dq:
            nb2 = -(-nblocks // NESTED_BLOCKSIZE)
            need(qs["nested_blocksize"] == NESTED_BLOCKSIZE and qs["nested_dtype"] == "float32",
                 f"{name}: {w} nested {qs}")
            need(header[w + ".absmax"]["dtype"] == "U8" and header[w + ".absmax"]["shape"] == [nblocks]
                 and header[w + ".nested_absmax"]["dtype"] == "F32" and header[w + ".nested_absmax"]["shape"] == [nb2]
                 and header[w + ".nested_quant_map"]["dtype"] == "F32"
                 and header[w + ".nested_quant_map"]["shape"] == [256], f"{name}: {w} nested tensors")
            need(np.array_equal(t[w + ".nested_quant_map"], dyn),
                 f"{name}: {w}.nested_quant_map != create_dynamic_map()")
            off = st1.absmax.mean()
            qa, st2 = BF.quantize_blockwise(st1.absmax - off, blocksize=NESTED_BLOCKSIZE)
            need(np.float32(qs["nested_offset"]) == off.numpy() and float(np.float32(qs["nested_offset"]))
                 == qs["nested_offset"], f"{name}: {w} nested_offset {qs['nested_offset']} != mean(absmax) {off}")
            need(np.array_equal(t[w + ".absmax"], qa.numpy()) and np.array_equal(t[w + ".nested_absmax"],
                 st2.absmax.numpy()), f"{name}: {w} absmax != quantize_blockwise(absmax - mean, 256)")
            need(lay.weight.quant_state.nested and lay.weight.quant_state.state2.blocksize == NESTED_BLOCKSIZE,
                 f"{name}: {w} in memory not nested")
        else:
            need(header[w + ".absmax"]["dtype"] == "F32" and header[w + ".absmax"]["shape"] == [nblocks]
                 and np.array_equal(t[w + ".absmax"], st1.absmax.numpy()), f"{name}: {w}.absmax")
            need(not lay.weight.quant_state.nested, f"{name}: {w} in memory nested")
        # in memory = in the file
        need(np.array_equal(lay.weight.data.numpy().reshape(-1), t[w].reshape(-1)), f"{name}: {w} saved bits")
        d_bnb = BF.dequantize_4bit(lay.weight.data, lay.weight.quant_state)
        d_file = deq_from_file(t, w)
        need(d_bnb.dtype == torch.float32 and np.array_equal(d_bnb.numpy(), d_file),
             f"{name}: {w} decoded from the file != dequantize_4bit")
    return dict(header=header, hlen=hlen, tensors=t, others=others, one_block=one_block)


def check_config(name, d, dq):
    """config.json = the base's (../<family>/config.json) plus a quantization_config block."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(FIXTURES_DIR, SPECS[name][0], "config.json")) as f:
        base_cfg = json.load(f)
    qc = cfg.pop("quantization_config", None)
    need(cfg == base_cfg, f"{name}: config.json differs from the base's beyond quantization_config")
    want = {"_load_in_4bit": True, "_load_in_8bit": False, "bnb_4bit_compute_dtype": "float32",
            "bnb_4bit_quant_storage": "uint8", "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": dq,
            "llm_int8_enable_fp32_cpu_offload": False, "llm_int8_has_fp16_weight": False,
            "llm_int8_skip_modules": None, "llm_int8_threshold": 6.0, "load_in_4bit": True, "load_in_8bit": False,
            "quant_method": "bitsandbytes"}
    need(qc == want, f"{name}: quantization_config {qc}")
    with open(os.path.join(d, "config.json")) as f:
        text = f.read()
    m = re.search(r'\n  "quantization_config": \{\n.*?\n  \},?\n', text, re.S)
    need(m, f"{name}: quantization_config block")
    return m.group(0).strip("\n").rstrip(",")


# ----------------------------------------------------------------------------- model
def load_4bit(base_dir, dq):
    return AutoModelForCausalLM.from_pretrained(
        base_dir, quantization_config=BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=dq,
            bnb_4bit_compute_dtype=torch.float32),
        device_map="cpu", dtype=torch.float32, attn_implementation="eager")


def fp32_forward_only(model):
    """Every Linear4bit computes in fp32 in eval mode too (no AVX512-BF16 repacking)."""
    for m in model.modules():
        if isinstance(m, bitsandbytes.nn.Linear4bit):
            m.support_avx512bf16_for_cpu = False


def logits_of(model, ids):
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def margin_of(model, ids):
    """The smallest gap between the k-th and (k+1)-th router probability (mfx.routing_stats), eval mode."""
    cfg = (model.get_base_model() if isinstance(model, PeftModel) else model).config
    model.eval()
    with torch.no_grad():
        out = model(input_ids=ids, output_router_logits=True, use_cache=False)
    return mfx.routing_stats(out.router_logits, cfg.num_experts_per_tok, mfx.num_experts(cfg))[0]


def pick_adapter(name, pm, seed, ids):
    """The first adapter seed from seed + ADAPTER_SEED_OFFSET whose PeftModel keeps the routing
    MIN_ROUTING_MARGIN apart; pm's adapters set from it (make_lora_fixtures' init_adapters)."""
    first = seed + mlf.ADAPTER_SEED_OFFSET
    for a in range(first, first + mlf.ADAPTER_SEED_TRIES):
        mlf.init_adapters(pm, a)
        margin = margin_of(pm, ids)
        if margin >= mfx.MIN_ROUTING_MARGIN:
            return a, margin
    mfx.fail(f"{name}: no usable adapter seed in [{first}, {first + mlf.ADAPTER_SEED_TRIES})")


def seeded_batch(cfg, batch_seed):
    """A [B, S] batch drawn as make_fixtures' build() draws its own (numpy PCG64, any id but the pad
    id), from batch_seed alone."""
    rng = np.random.default_rng(batch_seed)
    allowed = np.array([t for t in range(cfg.vocab_size) if t != cfg.pad_token_id], dtype=np.int64)
    return torch.from_numpy(allowed[rng.integers(0, len(allowed), size=(mfx.B, mfx.S))])


def pick_batch(name, model, seed, ids):
    """The batch of ../lora/<family> (ids) if the 4-bit model routes it MIN_ROUTING_MARGIN from a tie,
    else the first seeded_batch from seed + BATCH_SEED_OFFSET that it does. Returns the batch, its
    seed (None: ../lora's) and the margin."""
    margin = margin_of(model, ids)
    if margin >= mfx.MIN_ROUTING_MARGIN:
        return ids, None, margin
    for b in range(seed + BATCH_SEED_OFFSET, seed + BATCH_SEED_OFFSET + BATCH_SEED_TRIES):
        ids = seeded_batch(model.config, b)
        margin = margin_of(model, ids)
        if margin >= mfx.MIN_ROUTING_MARGIN:
            return ids, b, margin
    mfx.fail(f"{name}: no batch the 4-bit model routes {mfx.MIN_ROUTING_MARGIN} from a tie")


def deq_names(family, model):
    """The two weights whose dequantization expected.safetensors holds: layer 0's k_proj (not
    square), expert 0's down projection of the last MoE layer."""
    moe = [i for i, l in enumerate(model.model.layers) if mfx.moe_block(l) is not None]
    return ["model.layers.0.self_attn.k_proj.weight",
            mfx.expert_prefix(model, moe[-1], 0) + DOWN.get(family, "down_proj") + ".weight"]


def reload_dir(d):
    """from_pretrained of the fixture directory itself: the model, or None where transformers
    (modeling_utils.py PreTrainedModel.from_pretrained: find_adapter_config_file, then
    pretrained_model_name_or_path = json.load(f)["base_model_name_or_path"]) takes the directory
    for an adapter and cannot load its base ("")."""
    try:
        return AutoModelForCausalLM.from_pretrained(d, device_map="cpu", dtype=torch.float32,
                                                    attn_implementation="eager")
    except OSError as e:
        need("Can't load the configuration of ''" in str(e), f"from_pretrained({d}): {e}")
        return None


def chmod_files(d):
    for f in os.listdir(d):
        os.chmod(os.path.join(d, f), 0o644)


# ----------------------------------------------------------------------------- one fixture
def make_fixture(name, outdir):
    family, dq = SPECS[name]
    lf = next(x for x in mlf.fixtures() if x["name"] == family)
    seed, base, ids, moe_layers = mlf.build_base(lf)
    lora_t, _ = mfx.read_st(os.path.join(FIXTURES_DIR, "lora", family, "fixture.safetensors"))
    need(np.array_equal(lora_t["input_ids"], ids.numpy()), f"{name}: batch != ../lora/{family}'s input_ids")
    d = mfx.fixture_dir(outdir, name)

    # The 4-bit model as transformers loads a float checkpoint with this config, saved as it saves it.
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = os.path.join(tmp, "base")
        mlf.save_base(lf, base, base_dir, tmp)  # byte for byte ../<family>/ (asserted)
        model = load_4bit(base_dir, dq)
    fp32_forward_only(model)
    quantized = mqf.quantized_modules(model)
    linears = [n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear)]
    need(quantized == [n for n in linears if n != "lm_head"], f"{name}: quantized modules {quantized}")
    need(type(model.lm_head) is torch.nn.Linear and model.lm_head.weight.dtype == torch.float32, f"{name}: lm_head")
    model.save_pretrained(d)
    need(sorted(os.listdir(d)) == ["config.json", "generation_config.json", "model.safetensors"],
         f"{name}: save_pretrained wrote {sorted(os.listdir(d))}")
    os.remove(os.path.join(d, "generation_config.json"))  # bos/eos ids only; not needed
    chmod_files(d)
    qc_block = check_config(name, d, dq)
    ck = check_checkpoint(name, d, model, base, quantized, dq)

    # logits of the 4-bit model, eval mode, no adapters
    ids, batch_seed, base_margin = pick_batch(name, model, seed, ids)
    logits = logits_of(model, ids)
    base_ref, _ = mfx.read_st(os.path.join(FIXTURES_DIR, family, "fixture.safetensors"))
    if batch_seed is None:
        quant_shift = float(np.abs(logits.numpy().astype(np.float64) - base_ref["logits"]).max())
    else:
        quant_shift = float(np.abs(logits.numpy().astype(np.float64) - logits_of(mfx.build(lf["fx"], seed)[0], ids)
                                   .numpy()).max())
    need(0 < quant_shift < 10, f"{name}: the 4-bit logits moved by {quant_shift} from the fp32 base's")
    deq = {w: BF.dequantize_4bit(mqf.layer(model, w.removesuffix(".weight")).weight.data,
                                 mqf.layer(model, w.removesuffix(".weight")).weight.quant_state)
           for w in deq_names(family, model)}

    # The LoRA of ../lora/<family> over the in-memory 4-bit model.
    model.name_or_path = ""  # adapter_config.json's base_model_name_or_path, as make_lora_fixtures'
    tm = mlf.target_modules(family)
    pm = mlf.lora_model(name, model, tm, seed + mlf.ADAPTER_SEED_OFFSET, check_init=True)
    adapter_seed, peft_margin = pick_adapter(name, pm, seed, ids)
    mqf.check_targets(name, family, pm, model, quantized)
    peft_logits = logits_of(pm, ids)
    with tempfile.TemporaryDirectory() as tmp:
        _, _, _, file_keys = mlf.save_adapter(name, pm, tmp)
        need(sorted(os.listdir(tmp)) == ["adapter_config.json", "adapter_model.safetensors"],
             f"{name}: PEFT wrote {sorted(os.listdir(tmp))}")
        for f in os.listdir(tmp):
            shutil.copyfile(os.path.join(tmp, f), os.path.join(d, f))
    chmod_files(d)
    need(filecmp.cmp(os.path.join(d, "adapter_config.json"),
                     os.path.join(FIXTURES_DIR, "lora", family, "adapter_config.json"), shallow=False),
         f"{name}: adapter_config.json differs from ../lora/{family}'s")
    with safe_open(os.path.join(FIXTURES_DIR, "lora", family, "adapter_model.safetensors"), framework="pt") as f:
        need(sorted(f.keys()) == file_keys, f"{name}: adapter tensor names differ from ../lora/{family}'s")
    peft_shift = float(np.abs(logits.numpy().astype(np.float64) - peft_logits.numpy()).max())
    need(peft_shift > 0.1, f"{name}: the adapters move the logits by {peft_shift} only")

    # An fp32 model whose quantized weights are those decoded from the file alone (deq_from_file):
    # the same logits and, with the same adapters (PEFT's fp32 LoRA), the same peft_logits.
    ref, _ = mfx.build(lf["fx"], seed)
    with torch.no_grad():
        for m in quantized:
            ref.get_submodule(m).weight.copy_(torch.from_numpy(deq_from_file(ck["tensors"], m + ".weight")))
    ref_err = (logits_of(ref, ids) - logits).abs().max().item()
    ref_pm = mlf.lora_model(name, ref, tm, adapter_seed)
    ref_peft_err = (logits_of(ref_pm, ids) - peft_logits).abs().max().item()
    need(ref_err < 1e-5 and ref_peft_err < 1e-5,
         f"{name}: fp32 model over the decoded weights differs by {ref_err} / {ref_peft_err}")

    # The shipped files alone: from_pretrained (pre-quantized: Params4bit.from_prequantized) of
    # config.json + model.safetensors and PeftModel.from_pretrained(model, d) give logits and
    # peft_logits bit for bit. (Not from_pretrained(d) itself: with adapter_config.json in d,
    # transformers loads d as an adapter over its base_model_name_or_path, "": reload_dir.)
    with tempfile.TemporaryDirectory() as tmp:
        for f in ("config.json", "model.safetensors"):
            shutil.copyfile(os.path.join(d, f), os.path.join(tmp, f))
        again = AutoModelForCausalLM.from_pretrained(tmp, device_map="cpu", dtype=torch.float32,
                                                     attn_implementation="eager")
    need(not reload_dir(d), f"{name}: from_pretrained(d) loaded although d holds an adapter over \"\"")
    fp32_forward_only(again)
    need(mqf.quantized_modules(again) == quantized, f"{name}: reloaded quantized modules")
    need(torch.equal(logits_of(again, ids), logits), f"{name}: the reloaded checkpoint gives other logits")
    for w, x in deq.items():
        lw = mqf.layer(again, w.removesuffix(".weight")).weight
        need(torch.equal(BF.dequantize_4bit(lw.data, lw.quant_state), x), f"{name}: reloaded {w} dequantizes otherwise")
    again_pm = PeftModel.from_pretrained(again, d)
    need(torch.equal(logits_of(again_pm, ids), peft_logits), f"{name}: the reloaded adapter gives other peft_logits")

    tensors = {"input_ids": ids.numpy().astype("<i4"), "logits": logits.numpy().astype("<f4"),
               "peft_logits": peft_logits.numpy().astype("<f4")}
    for w, x in deq.items():
        tensors[f"deq.{w}"] = x.numpy().astype("<f4")
    meta = {
        "format": "bnb4",
        "fixture": name,
        "model_type": model.config.model_type,
        "base": family,
        "seed": str(seed),
        "adapter_seed": str(adapter_seed),
        "adapter_init": (f"make_lora_fixtures' init_adapters(adapter_seed): every lora_A and lora_B "
                         f"N(0, {mlf.ADAPTER_STD_A}^2 / {mlf.ADAPTER_STD_B}^2), numpy PCG64"),
        "quantization": quant_call("True" if dq else "False"),
        "double_quant": "true" if dq else "false",
        "blocksize": str(BLOCKSIZE),
        "nested_blocksize": str(NESTED_BLOCKSIZE) if dq else "",
        "quantized_modules": json.dumps(quantized),
        "unquantized_tensors": json.dumps(ck["others"]),
        "input_ids": (f"tests/fixtures/lora/{family}/fixture.safetensors input_ids (make_fixtures' build() batch)"
                      if batch_seed is None else
                      f"seeded: allowed[numpy.random.default_rng({batch_seed}).integers(0, len(allowed), "
                      f"(B, T))], allowed "
                      f"= the ids 0..V-1 but pad_token_id, in order (make_fixtures' build() rule); "
                      f"(../lora/{family}'s batch is routed by the 4-bit model less than "
                      f"{mfx.MIN_ROUTING_MARGIN:g} from a tie)"),
        "batch_seed": "" if batch_seed is None else str(batch_seed),
        "logits": "model(input_ids).logits of the 4-bit model, eval mode, use_cache=False, no adapters",
        "peft_logits": "PeftModel (adapter_config.json + adapter_model.safetensors over it), eval mode",
        "deq": ("deq.<checkpoint weight name> [out, in] F32: bitsandbytes.functional.dequantize_4bit(w.data, "
                "w.quant_state)"),
        "bitsandbytes": bitsandbytes.__version__,
        "peft": peft.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "safetensors": safetensors.__version__,
    }
    mfx.write_fixture(name, os.path.join(d, "expected.safetensors"), tensors, meta)
    need(sorted(os.listdir(d)) == sorted(OUT_FILES), f"{name}: files {sorted(os.listdir(d))}")

    h = ck["header"]
    return dict(name=name, family=family, dq=dq, seed=seed, adapter_seed=adapter_seed, quantized=quantized,
                batch_seed=batch_seed, one_block=ck["one_block"],
                n_tensors=len(h), n_u8=sum(v["dtype"] == "U8" for v in h.values()),
                n_f32=sum(v["dtype"] == "F32" for v in h.values()), hlen=ck["hlen"], others=ck["others"],
                sizes={f: os.path.getsize(os.path.join(d, f)) for f in OUT_FILES}, peft_shift=peft_shift,
                quant_shift=quant_shift, base_margin=base_margin, peft_margin=peft_margin, ref_err=ref_err,
                ref_peft_err=ref_peft_err, deq=list(deq), qc_block=qc_block, header=h, tensors=ck["tensors"],
                n_lora=len(mlf.lora_modules(pm)), nested_blocks=[
                    h[f"{m}.weight.nested_absmax"]["shape"][0] for m in quantized] if dq else [])


# ----------------------------------------------------------------------------- NOTES.md
TABLE = """\
| name | double quant | base seed | batch | adapter seed | quantized modules | LoRA modules | tensors in model.safetensors (U8 / F32) | header bytes | model.safetensors bytes | adapter_model.safetensors bytes | expected.safetensors bytes | max \\|logits − peft_logits\\| | max \\|logits − fp32 base logits\\| |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
{rows}
"""

NOTES = """\
# Pre-quantized checkpoints: NF4 as transformers + bitsandbytes ship it

Written by `tools/make_bnb_fixtures.py` (do not edit; rerun it). bitsandbytes {bnb},
peft {peft}, transformers {tf}, torch {torch}, safetensors {st}, float32 on the CPU. Each
directory is a checkpoint saved **already quantized**, byte for byte as
`model.save_pretrained(dir)` writes a model loaded 4-bit, with a PEFT LoRA adapter over it
and the logits of both. Every fact below is stated from the files and from the installed
sources (file and function named; each quoted line asserted by the script:
`source_facts`, and make_qlora_fixtures' for how the codes are made), and where marked
*(checked)*, numerically on every file.

## Files (`<name>/`; `<name>` is a family, or `mixtral_plain`)
- How they are made: the base is built as `tools/make_fixtures.py` builds `../<family>/`
  (its `build()`, the same seed; saved, byte for byte `../<family>/config.json` and
  `model.safetensors`: asserted), saved to a temporary directory and loaded with
  `{call}` (`mixtral_plain`: `bnb_4bit_use_double_quant=False`, everything else the same,
  family mixtral); that in-memory model is saved with `model.save_pretrained(<name>)`.
- `config.json`, `model.safetensors`: what `save_pretrained` wrote, untouched (file mode set
  to 0644; the `generation_config.json` it also writes, bos/eos ids only, deleted).
  `config.json` is `../<family>/config.json` plus a `quantization_config` block
  (below). *(checked: equal as JSON but for that block)*
- `adapter_config.json`, `adapter_model.safetensors`: `PeftModel.save_pretrained(<name>)` of
  `get_peft_model(<the 4-bit model>, LoraConfig(...))` with `../lora/`'s `LoraConfig` and
  target modules for the family (`adapter_config.json` is byte for byte
  `../lora/<family>/adapter_config.json`, `base_model_name_or_path` `""`; the tensor names are
  those of `../lora/<family>/adapter_model.safetensors`) *(checked)*; every `lora_A` and
  `lora_B` N(0, {std_a}²) / N(0, {std_b}²) from the adapter seed (make_lora_fixtures'
  `init_adapters`, numpy PCG64: `lora_B` nonzero), the first seed from base seed + {offset}
  whose routing of the batch keeps every top-k choice at least {margin} apart. PEFT wraps
  each target `Linear4bit` in `peft.tuners.lora.bnb.Linear4bit` (`../qlora/NOTES.md`):
  y = base(x) + scaling·(x·Aᵀ)·Bᵀ, scaling {scaling}.
- `expected.safetensors` (make_fixtures' `write_st`): `input_ids` [B, T] = [{B}, {T}] I32: the
  batch of `../lora/<family>/fixture.safetensors` (make_fixtures' `build()` batch: asserted)
  where the 4-bit model routes it at least {margin} from a tie (top-k choices), else (batch seed
  in the table; the metadata's `batch_seed` and `input_ids` say how) the first batch drawn as
  `build()` draws its own (numpy PCG64 `default_rng(batch seed)`, any id but the pad id) from
  base seed + {batch_offset} on that the 4-bit model routes so;
  `logits` [B, T, V] F32 of the 4-bit model (`model(input_ids=ids, use_cache=False).logits`,
  eval mode, no adapters); `peft_logits` [B, T, V] F32 of the PeftModel (eval mode); and
  `deq.<checkpoint weight name>` [out, in] F32 =
  `bitsandbytes.functional.dequantize_4bit(w.data, w.quant_state)` for two weights,
  `model.layers.0.self_attn.k_proj.weight` ([16, 32]: not square) and expert 0's down
  projection of the last MoE layer (`...experts.0.w2.weight` / `...experts.0.down_proj.weight`,
  [32, 16]). `__metadata__`: `quantized_modules` (JSON list, `named_modules` order),
  `unquantized_tensors` (JSON list of the F32 tensors of `model.safetensors`),
  `quantization` (the call), `double_quant`, `blocksize`, `nested_blocksize`, `seed`,
  `adapter_seed`, `adapter_init`, the versions, and what each tensor is.
- The shipped files alone reproduce the outputs: `<name>/config.json` and
  `model.safetensors` copied to a directory of their own and loaded with
  `AutoModelForCausalLM.from_pretrained(that, device_map="cpu", dtype=torch.float32,
  attn_implementation="eager")` (the `quantization_config` in `config.json` makes transformers
  load it pre-quantized: `transformers/quantizers/quantizer_bnb_4bit.py`
  `Bnb4BitHfQuantizer.create_quantized_param` → `bnb.nn.Params4bit.from_prequantized(` →
  `bitsandbytes/functional.py` `QuantState.from_dict`) give `logits` and the same `deq.*`,
  and `PeftModel.from_pretrained(model, <name>)` gives `peft_logits`. *(checked: bit for bit)*
- **`from_pretrained(<name>)` itself fails**: with `adapter_config.json` beside the model,
  transformers takes the directory for an adapter and loads its base instead
  (`transformers/modeling_utils.py` `PreTrainedModel.from_pretrained`:
  `pretrained_model_name_or_path = json.load(f)["base_model_name_or_path"]`; the Auto class
  likewise, `transformers/models/auto/auto_factory.py`), here `""`: "Can't load the
  configuration of ''". *(checked)* Python users load the model from a directory without the
  adapter files; the C code reads the files directly.
- `logits` are the fp32 ones on every CPU: `Linear4bit.forward`
  (`bitsandbytes/nn/modules.py`) repacks the weight and computes in bf16 when `and
  self.support_avx512bf16_for_cpu` and `not self.training` and `and x.requires_grad ==
  False` (`Linear4bit.__init__`: `self.support_avx512bf16_for_cpu = has_avx512bf16()`); the
  script sets that attribute False on every layer. (On a CPU with AVX512-BF16, plain
  transformers inference would take that bf16 path and give other logits.)

@@TABLE@@

max |logits − fp32 base logits|: against the fp32 base's logits on the same batch (for the
`../lora` batch those of `../<family>/fixture.safetensors`, train mode: no dropout, the same
function): what 4-bit quantization does to these tiny models.
An fp32 model (make_fixtures' `build()`) whose quantized weights are replaced by the weights
decoded from `model.safetensors` alone as below gives `logits`, and with the same adapters
(PEFT's fp32 LoRA) `peft_logits`: max difference {ref_err}. *(checked)*

## `model.safetensors`: the tensors of one quantized weight
Every quantized module `<m>` (`<w>` = `<m>.weight`) has these tensors and no others
(`bitsandbytes/nn/modules.py` `Linear4bit._save_to_state_dict`: `for k, v in
self.weight.quant_state.as_dict(packed=True).items():` → `destination[prefix + "weight." + k]
= v if keep_vars else v.detach()`; the keys are `QuantState.as_dict` of
`bitsandbytes/functional.py`: `qs_packed_dict = {{k: v for k, v in qs_dict.items() if
isinstance(v, torch.Tensor)}}`, and the non-tensor items packed into one tensor,
`qs_packed_dict[key] = pack_dict_to_tensor(non_tensor_dict)` with `key =
"quant_state.bitsandbytes__"` + quant_type). n = out·in elements, nb = ⌈n/64⌉ blocks,
nb2 = ⌈nb/256⌉. *(checked: every quantized weight of every file)*
- `<w>` **U8 [(n+1)/2, 1]**: the packed codes (the `Params4bit` data as
  `quantize_4bit`'s default kernel makes it: `packed = ((q8[::2] << 4) | q8[1::2]).unsqueeze(1)`,
  `bitsandbytes/backends/default/ops.py`). Not [out, in/2]: a column of bytes. Element i of the
  row-major [out, in] weight (i = row·in + col) is in byte i/2, **the even element in the high
  nibble** (`byte >> 4`), the odd one in the low nibble (`byte & 15`). No transposition: the
  shape in the quant state is the nn.Linear's [out, in].
- `<w>.absmax`: with double quantization **U8 [nb]** (the 8-bit codes of the block absmaxes,
  not floats); without (`mixtral_plain`) **F32 [nb]**, the absmax of each block of 64.
- `<w>.quant_map` **F32 [16]**: the NF4 table (`get_4bit_type("nf4")`, the same in every
  weight): `{nf4}`.
- `<w>.nested_absmax` **F32 [nb2]** (double quantization only): the absmax of each block of
  256 of the (absmax − offset) vector.
- `<w>.nested_quant_map` **F32 [256]** (double quantization only): bitsandbytes' signed
  8-bit dynamic map, `create_dynamic_map()` (`quantize_blockwise`: `name2qmap["dynamic"] =
  create_dynamic_map().to(A.device)`), the same in every weight: sorted ascending,
  `[0]` = {dyn0}, `[127]` = {dyn127}, `[128]` = {dyn128}, `[255]` = {dyn255} (read it from
  the file; do not rebuild it).
- `<w>.quant_state.bitsandbytes__nf4` **U8 [len]**: JSON text, one UTF-8 byte per element, no
  terminator (`bitsandbytes/utils.py` `pack_dict_to_tensor`: `json_str =
  json.dumps(source_dict)`, `json_bytes = json_str.encode("utf-8")`, `tensor_data =
  torch.tensor(list(json_bytes), dtype=torch.uint8)`): Python's default separators (`", "`,
  `": "`), keys in `as_dict`'s order: `quant_type` (`"nf4"`), `blocksize` (64), `dtype`
  (`"float32"`: the weight's dtype before quantization and the dtype of the dequantized weight;
  `str(self.dtype).strip("torch.")`), `shape` ([out, in]; `tuple(self.shape)`), and with
  double quantization `nested_blocksize` (256), `nested_dtype` (`"float32"`), `nested_offset`
  (`self.offset.item()`: the fp32 offset as a Python float, printed by `repr`, so the shortest
  decimal that reads back as that double; the double is an fp32 value, so parsing it as a
  double (`strtod`) and converting to float is exact *(checked)*). Read back by `QuantState.from_dict` through
  `unpack_tensor_to_dict` (`json_str = json_bytes.decode("utf-8")`; `offset =
  torch.tensor(float(qs_dict["nested_offset"])).to(device)`: fp32). Its length varies with the
  text ({qs_lens} bytes here).
- The `Linear4bit` biases (Qwen2-MoE's q/k/v) are plain F32 `<m>.bias`.

The example `{ex_weight}` of `{ex_name}/model.safetensors` (and of
`mixtral_plain/model.safetensors`):
```
{ex_tensors}
```
Its quant state, as stored:
```
{ex_json}
{ex_json_plain}
```

The quant state (`quant_map`, `absmax`, ...) is stored per weight even where it is the same
in every weight. The safetensors metadata is `{{"format": "pt"}}`; locate every tensor by the
header's `data_offsets` (the data is not in module order).

## `config.json`: the `quantization_config` block
Exactly (`{ex_name}`; `mixtral_plain` the same with `"bnb_4bit_use_double_quant": false`;
`transformers/configuration_utils.py` `PretrainedConfig.to_diff_dict` writes
`self.quantization_config.to_dict()`; `transformers/utils/quantization_config.py`
`BitsAndBytesConfig.to_dict`: `output = copy.deepcopy(self.__dict__)`, dtypes as
`str(...).split(".")[1]`; keys sorted like the rest of the file):
```
{qc_block}
```
Everything else in `config.json` is `../<family>/config.json`'s.

## Which modules are quantized
- **Every `nn.Linear` but `lm_head`** (`../qlora/NOTES.md`: transformers'
  `_replace_with_bnb_linear` and `get_keys_to_not_convert`, `llm_int8_skip_modules` null):
  attention q/k/v/o, **the routers** (`block_sparse_moe.gate` / `mlp.gate`, [8, 32]), every
  routed expert's projections, the Qwen2-MoE shared expert **and `shared_expert_gate`** ([1,
  32]: 32 elements, one short block), the dense MLPs. *(checked: the `Linear4bit` modules are
  exactly the fp32 base's `nn.Linear`s less `lm_head`, and `model.safetensors` holds the
  quantized tensors of exactly those)*
- **Not quantized, F32 in the file, the fp32 base's values unchanged**: `model.embed_tokens`,
  `lm_head`, every norm (`input_layernorm`, `post_attention_layernorm`, `model.norm`, Qwen3-MoE
  / OLMoE `q_norm` / `k_norm`), the Qwen2-MoE q/k/v biases. *(checked: every other tensor of the
  file is F32 and equal to the base's)* Per fixture (layer index folded to `{{i}}`):
{others}

The quantized modules (`{{0..7}}`: one module per expert, the same for each):
{modules}

## How the codes and absmaxes were made (at load, on the CPU)
- The 4-bit codes: `quantize_4bit(w, blocksize=64, quant_type="nf4")` of the fp32 [out, in]
  weight, as in `../qlora/NOTES.md` and `../quant/NOTES.md` (blocks of 64 over the row-major
  weight, crossing rows; the code of the nearest NF4 value of w/absmax). The codes are made
  against the **exact** fp32 absmax, before it is compressed: they are the same with and
  without double quantization (`mixtral/` and `mixtral_plain/` hold the same packed bytes).
  *(checked: equal to `quantize_4bit` of the fp32 weight and to `../quant/families.safetensors`)*
- Double quantization (`bitsandbytes/functional.py` `quantize_4bit`, `if
  compress_statistics:`): `offset = _absmax.mean()` (torch's fp32 mean of the nb fp32
  absmaxes), `qabsmax, state2 = quantize_blockwise(_absmax - offset, blocksize=256)`: the
  centred absmaxes quantized 8-bit with the dynamic map in blocks of 256, on the CPU by the
  native `lib.cquantize_blockwise_cpu_fp32(` (`bitsandbytes/backends/cpu/ops.py`). `absmax` in the
  file is `qabsmax`, `nested_absmax` is `state2.absmax` (one fp32 absmax per 256),
  `nested_offset` is `offset`. *(checked: bit for bit against those calls)*

## Dequantization, as the C code must reproduce it bit for bit
For weight `<w>` with quant state `qs`, all arithmetic in IEEE fp32, round to nearest even,
each operation rounded (no fused multiply-add):
```
offset   = (float) qs.nested_offset                           # double quantization only
absmax[j] = nested_quant_map[absmax_u8[j]] * nested_absmax[j / 256]   # fp32 product, rounded
absmax[j] = absmax[j] + offset                                 # fp32 sum, rounded
            (without double quantization: absmax[j] = absmax_f32[j] from the file)
code_i   = i even ? packed[i/2] >> 4 : packed[i/2] & 15        # i = row*in + col
W[row][col] = quant_map[code_i] * absmax[i / 64]               # fp32 product, rounded
```
(j / 256 uses qs.nested_blocksize, i / 64 qs.blocksize.) Sources:
`bitsandbytes/functional.py` `dequantize_4bit`: `absmax = dequantize_blockwise(quant_state.absmax,
quant_state.state2)` then `absmax += quant_state.offset` (a separate fp32 tensor add), then
`torch.ops.bitsandbytes.dequantize_4bit` (`lib.cdequantize_blockwise_cpu_nf4_fp32(`, one fp32
product `code[q] * absmax[i // 64]`: `../qlora/NOTES.md`); `dequantize_blockwise` calls
`torch.ops.bitsandbytes.dequantize_blockwise`, on the CPU the native
`lib.cdequantize_blockwise_cpu_fp32(` (`bitsandbytes/backends/cpu/ops.py`; its C++ source is
not installed: the formula is checked numerically). The forward without grad takes the same
route (`bitsandbytes/autograd/_functions.py` `matmul_4bit`: `elif quant_state.state2.blocksize
== 256:` → `gemm_4bit` with `absmax_8bit=quant_state.absmax,`, `absmax_code=quant_state.state2.code,`,
`absmax_offset=quant_state.offset,`; `bitsandbytes/backends/default/ops.py`
`_gemm_4bit_default_impl`: `torch.ops.bitsandbytes.dequantize_blockwise.default(absmax_8bit,
absmax, absmax_code, 256, torch.float32)` `+ absmax_offset`, then `F.linear(A, B_dq, bias)`):
**y = x·deq(W)ᵀ + b** in fp32. *(checked: every quantized weight of every file decoded in
numpy from the file alone with the lines above equals `dequantize_4bit` bit for bit; `deq.*`
are two of them)*
- Edge: a weight of one block of 64 has offset = its absmax, so absmax − offset = 0 and
  `nested_absmax` = [0.0]; its absmax reads back as nested_quant_map[q]·0 + offset = offset,
  exact. Never divide by `nested_absmax`. Here: {one_block}. *(checked)*
- Here every weight has at most {max_nb} blocks of 64, so `nested_absmax` has one element
  (nb2 = 1) in every file; a real model's weights have many blocks of 256 (j / 256 matters).
"""


def fold_layers(names):
    out = []
    for n in names:
        p = re.sub(r"\.layers\.\d+\.", ".layers.{i}.", n)
        if p not in out:
            out.append(p)
    return out


def tensor_lines(r, w):
    """'name dtype shape' of weight w's tensors in r's model.safetensors, in as_dict's order."""
    h = r["header"]
    keys = [w] + [f"{w}.{s}" for s in ("absmax", "quant_map", "nested_absmax", "nested_quant_map", QS_KEY)]
    return [f"{k:<74s} {h[k]['dtype']:<3s} {h[k]['shape']}" for k in keys if k in h]


def write_notes(outdir, rows):
    by = {r["name"]: r for r in rows}
    ex, plain = by[EXAMPLE[0]], by["mixtral_plain"]
    w = EXAMPLE[1]
    need(plain["qc_block"] == ex["qc_block"].replace('"bnb_4bit_use_double_quant": true',
                                                     '"bnb_4bit_use_double_quant": false'),
         "mixtral_plain's quantization_config block is not mixtral's with double quant off")
    need(np.array_equal(ex["tensors"][w], plain["tensors"][w]), "mixtral and mixtral_plain pack other codes")
    table = "\n".join(
        f"| {r['name']} | {'yes' if r['dq'] else 'no'} | {r['seed']} | "
        f"{'../lora' if r['batch_seed'] is None else 'seed ' + str(r['batch_seed'])} | {r['adapter_seed']} | "
        f"{len(r['quantized'])} | "
        f"{r['n_lora']} | {r['n_tensors']} ({r['n_u8']} / {r['n_f32']}) | {r['hlen']} | "
        f"{r['sizes']['model.safetensors']} | {r['sizes']['adapter_model.safetensors']} | "
        f"{r['sizes']['expected.safetensors']} | {r['peft_shift']:.3f} | {r['quant_shift']:.3f} |" for r in rows)
    others = "\n".join(f"\n{r['name']}:\n```\n" + "\n".join(fold_layers(r["others"])) + "\n```"
                       for r in rows if r["name"] != "mixtral_plain")
    modules = "\n".join(f"\n{r['name']} ({len(r['quantized'])}):\n```\n" + "\n".join(mqf.module_lines(r["quantized"]))
                        + "\n```" for r in rows if r["name"] != "mixtral_plain")
    dyn = ex["tensors"][f"{w}.nested_quant_map"]
    qs_lens = sorted({r["header"][f"{m}.weight.{QS_KEY}"]["shape"][0] for r in rows for m in r["quantized"]})
    max_nb = max(-(-int(np.prod(json.loads(quant_state_json(r["tensors"], m + ".weight"))["shape"])) // BLOCKSIZE)
                 for r in rows for m in r["quantized"])
    need(max_nb <= NESTED_BLOCKSIZE and all(n == 1 for r in rows for n in r["nested_blocks"]), "nested blocks")
    exact = all(r["ref_err"] == 0 and r["ref_peft_err"] == 0 for r in rows)
    text = mlf.reflow(NOTES.format(
        bnb=bitsandbytes.__version__, peft=peft.__version__, tf=transformers.__version__,
        torch=torch.__version__.split("+")[0], st=safetensors.__version__,
        call=quant_call("True").replace("dir", "tmp"), std_a=mlf.ADAPTER_STD_A, std_b=mlf.ADAPTER_STD_B,
        offset=mlf.ADAPTER_SEED_OFFSET, batch_offset=BATCH_SEED_OFFSET, margin=f"{mfx.MIN_ROUTING_MARGIN:g}",
        scaling=mlf.SCALING, B=mfx.B,
        T=mfx.S, ref_err="0 (bit for bit)" if exact else "< 1e-5",
        nf4="[" + ", ".join(repr(float(x)) for x in ex["tensors"][f"{w}.quant_map"]) + "]",
        dyn0=repr(float(dyn[0])), dyn127=repr(float(dyn[127])), dyn128=repr(float(dyn[128])),
        dyn255=repr(float(dyn[255])), qs_lens=", ".join(map(str, qs_lens)), ex_weight=w, ex_name=EXAMPLE[0],
        ex_tensors="\n".join([f"{EXAMPLE[0]}/:"] + tensor_lines(ex, w) + ["mixtral_plain/:"] + tensor_lines(plain, w)),
        ex_json=quant_state_json(ex["tensors"], w), ex_json_plain=quant_state_json(plain["tensors"], w),
        qc_block=ex["qc_block"], others=others, modules=modules, max_nb=max_nb,
        one_block="; ".join(f"`{r['name']}/` `{w_}`" for r in rows for w_ in r["one_block"]) or "none"))
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


def compare_expected(a, b, n):
    """expected.safetensors: names, dtypes, shapes, metadata; input_ids and deq.* exact, logits within
    make_fixtures' CHECK_RTOL / CHECK_ATOL."""
    if filecmp.cmp(a, b, shallow=False):
        print(f"identical {n}/expected.safetensors")
        return True
    (ta, ma), (tb, mb) = mfx.read_st(a), mfx.read_st(b)
    if set(ta) != set(tb) or ma != mb:
        print(f"DIFFERS  {n}/expected.safetensors: names or metadata")
        return False
    ok, worst = True, 0.0
    for k in sorted(ta):
        x, y = ta[k], tb[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            print(f"DIFFERS  {n}/expected.safetensors: {k} dtype/shape")
            ok = False
        elif k == "input_ids" or k.startswith("deq."):
            if not np.array_equal(x, y):
                print(f"DIFFERS  {n}/expected.safetensors: {k} (must be bit for bit)")
                ok = False
        elif not np.allclose(x, y, rtol=mfx.CHECK_RTOL, atol=mfx.CHECK_ATOL):
            print(f"DIFFERS  {n}/expected.safetensors: {k} max |diff| {np.abs(x - y).max():.3g}")
            ok = False
        else:
            worst = max(worst, float(np.abs(x.astype(np.float64) - y).max()))
    if ok:
        print(f"close    {n}/expected.safetensors (not byte-identical; largest |diff| {worst:.3g})")
    return ok


def compare(ref_dir, new_dir, names=NAMES, out_files=OUT_FILES):
    """Every file of every fixture (names) byte for byte (mfx.compare, NOTES.md too), but
    expected.safetensors (compare_expected); no file or directory besides out_files and names.
    make_fp8_fixtures' compare too."""
    ok = mfx.compare(ref_dir, new_dir, names, [f for f in out_files if f != "expected.safetensors"])
    for n in names:
        a = os.path.join(ref_dir, n, "expected.safetensors")
        if not os.path.exists(a):
            print(f"MISSING {n}/expected.safetensors")
            ok = False
        else:
            ok = compare_expected(a, os.path.join(new_dir, n, "expected.safetensors"), n) and ok
        extra = sorted(set(os.listdir(os.path.join(ref_dir, n))) - set(out_files)) \
            if os.path.isdir(os.path.join(ref_dir, n)) else []
        if extra:
            print(f"EXTRA    {n}/{extra}")
            ok = False
    extra = sorted(set(os.listdir(ref_dir)) - set(names) - {"NOTES.md"}) if os.path.isdir(ref_dir) else []
    if extra:
        print(f"EXTRA    {extra}")
        ok = False
    return ok


def summary(r):
    """A fixture's line on the console."""
    return (f"{r['name']:13s} double quant {str(r['dq']):5s} seed {r['seed']} adapter seed {r['adapter_seed']} "
            f"quantized {len(r['quantized'])} LoRA modules {r['n_lora']} tensors {r['n_tensors']} "
            f"(U8 {r['n_u8']} F32 {r['n_f32']}) max|logits-peft_logits| {r['peft_shift']:.4f} "
            f"max|logits-fp32 base| {r['quant_shift']:.4f} margin base {r['base_margin']:.2e} "
            f"peft {r['peft_margin']:.2e} fp32-over-deq err {r['ref_err']:.1e}/{r['ref_peft_err']:.1e} "
            f"sizes {r['sizes']}")


def main():
    args = mfx.start(__doc__, DEFAULT_OUT, "tests/fixtures/bnb4",
                     peft=(mlf.pinned("peft"), peft.__version__),
                     bitsandbytes=(mlf.pinned("bitsandbytes"), bitsandbytes.__version__))
    warnings.filterwarnings("ignore", message="Could not find a config file in")
    check_sources()
    mfx.write_or_check(args, generate, compare, summary)


if __name__ == "__main__":
    main()
