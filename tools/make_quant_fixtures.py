#!/usr/bin/env python3
"""Writes tests/fixtures/quant/formats.safetensors: quantized weight formats as the
implementations people load them with produce and read them.

Run it in the fixtures venv (tools/requirements-fixtures.txt, which pins
bitsandbytes too; everything runs on the CPU):

    /tmp/fixvenv/bin/python tools/make_quant_fixtures.py --out tests/fixtures/quant   # rewrite
    /tmp/fixvenv/bin/python tools/make_quant_fixtures.py --check                      # compare only

What it writes (every case's inputs come from numpy's PCG64, so the file is the
same on every CPU):

  NF4, bitsandbytes (bitsandbytes.functional, QLoRA's own code):
    nf4.code                        F32[16]  get_4bit_type("nf4")
    dynamic.code                    F32[256] create_dynamic_map() (the map of
                                             the double-quantized absmax)
    nf4.<case>.input                F32 or BF16, the tensor quantized
    nf4.<case>.packed/.absmax       quantize_4bit(x, blocksize, "nf4"):
                                    U8[(n+1)/2] (first element in the high
                                    nibble), F32[blocks]
    nf4.<case>.f32/.bf16            dequantize_4bit of it to F32 and BF16
    nf4dq.<case>.packed/.absmax_q/.absmax2/.code2/.offset
                                    quantize_4bit(..., compress_statistics=True):
                                    the absmax quantized to 8 bits in blocks of
                                    256 (U8[blocks], F32[blocks2], its map
                                    F32[256], the mean subtracted first F32[1])
    nf4dq.<case>.f32/.bf16          dequantize_4bit of that state
  FP8 e4m3 in 128x128 blocks (DeepSeek-V3 and Qwen3-FP8 checkpoints; transformers'
  FineGrainedFP8HfQuantizer quantizes a float weight the same way at load):
    fp8.codes/.codes_f32            every e4m3fn byte and torch's float of it
    fp8.<case>.input                F32 [rows, cols] (rows, cols multiples of 128:
                                    transformers' quantizer refuses others)
    fp8.<case>.weight/.scale_inv    F8_E4M3 [rows, cols], F32 [rows/128, cols/128]:
                                    create_quantized_param's output
    fp8.<case>.bf16                 weight.float() * scale_inv per block, then
                                    to bf16 (torch's casts; the fp32 product is
                                    codes_f32[weight] * scale_inv)
  The four families' weights (tests/fixtures/<family>/model.safetensors, the
  parity fixtures' models), every 2-D weight but the embedding, in
  families.safetensors:
    <family>/<name>.nf4/.absmax     quantize_4bit(w, 64, "nf4") as above
    <family>/<name>.nf4_bf16        dequantize_4bit of it to BF16
    <family>/<name>.fp8/.scale_inv  transformers' FP8 quantizer; its rows and
                                    columns zero-padded to multiples of 128 (it
                                    refuses others; zeros change no block's
                                    max), the result cut back: the partial
                                    blocks' scales are those of the padded ones
  MXFP4 (gpt-oss experts; transformers.integrations.mxfp4):
    mxfp4.<case>.blocks/.scales     U8 [E, R, G, 16], U8 [E, R, G]
    mxfp4.<case>.bf16               convert_moe_packed_tensors(blocks, scales):
                                    BF16 [E, G*32, R] (it transposes the last two)
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
import torch  # noqa: E402

torch.set_num_threads(1)

import bitsandbytes  # noqa: E402
import bitsandbytes.functional as BF  # noqa: E402
import transformers  # noqa: E402
from transformers import FineGrainedFP8Config  # noqa: E402
from transformers.integrations.finegrained_fp8 import FP8Linear  # noqa: E402
from transformers.integrations.mxfp4 import convert_moe_packed_tensors  # noqa: E402
from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer  # noqa: E402

ST_DTYPE = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.uint8: "U8",
    torch.float8_e4m3fn: "F8_E4M3",
}

# (name, shape, blocksize, input dtype, scale). Odd sizes give a short last
# block; the scales cover small and large absmax values.
NF4_CASES = [
    ("b64", (48, 40), 64, torch.float32, 1.0),
    ("b64_tail", (37, 29), 64, torch.float32, 0.02),
    ("b32", (16, 24), 32, torch.float32, 3.0),
    ("b128_bf16", (24, 80), 128, torch.bfloat16, 0.5),
    ("b64_zeros", (4, 64), 64, torch.float32, 1.0),  # its second block is all zeros
]
NF4DQ_CASES = [
    ("b64", (130, 130), 64, torch.float32, 1.0),  # 265 absmax: two blocks of 256
    ("b64_bf16", (64, 96), 64, torch.bfloat16, 0.05),
]
FP8_CASES = [
    ("r128c256", (128, 256), 0.3),
    ("r256c128", (256, 128), 40.0),
]
MXFP4_CASES = [
    ("e2r3g2", (2, 3, 2)),
    ("e1r8g1", (1, 8, 1)),
]


def rng(seed):
    return np.random.Generator(np.random.PCG64(seed))


def normal(r, shape, scale, dtype):
    x = torch.from_numpy(r.standard_normal(shape).astype(np.float32) * np.float32(scale))
    return x.to(dtype)


def nf4_cases(out):
    out["nf4.code"] = BF.get_4bit_type("nf4", device="cpu").float().contiguous()
    out["dynamic.code"] = BF.create_dynamic_map().float().contiguous()
    for i, (name, shape, bs, dt, scale) in enumerate(NF4_CASES):
        x = normal(rng(100 + i), shape, scale, dt)
        if name == "b64_zeros":
            x.view(-1)[64:128] = 0
        q, st = BF.quantize_4bit(x, blocksize=bs, quant_type="nf4", compress_statistics=False)
        k = "nf4." + name
        out[k + ".input"] = x
        out[k + ".packed"] = q.reshape(-1).contiguous()
        out[k + ".absmax"] = st.absmax.float().contiguous()
        out[k + ".f32"] = deq_as(q, st, torch.float32)
        out[k + ".bf16"] = deq_as(q, st, torch.bfloat16)
    for i, (name, shape, bs, dt, scale) in enumerate(NF4DQ_CASES):
        x = normal(rng(200 + i), shape, scale, dt)
        q, st = BF.quantize_4bit(x, blocksize=bs, quant_type="nf4", compress_statistics=True)
        k = "nf4dq." + name
        out[k + ".input"] = x
        out[k + ".packed"] = q.reshape(-1).contiguous()
        out[k + ".absmax_q"] = st.absmax.reshape(-1).contiguous()
        out[k + ".absmax2"] = st.state2.absmax.float().contiguous()
        out[k + ".code2"] = st.state2.code.float().contiguous()
        out[k + ".offset"] = st.offset.float().reshape(1).contiguous()
        assert st.state2.blocksize == 256, st.state2.blocksize
        out[k + ".f32"] = deq_as(q, st, torch.float32)
        out[k + ".bf16"] = deq_as(q, st, torch.bfloat16)


def deq_as(q, st, dtype):
    """dequantize_4bit(q, st) written as `dtype` (the state's dtype is the input's)."""
    saved = st.dtype
    st.dtype = dtype
    try:
        return BF.dequantize_4bit(q, st).reshape(-1).contiguous()
    finally:
        st.dtype = saved


class _Holder(torch.nn.Module):
    def __init__(self, rows, cols):
        super().__init__()
        self.lin = FP8Linear(cols, rows, bias=False, block_size=(128, 128))
        # create_quantized_param squeezes the scales ([1, 2] -> [2]) before it
        # loads them: give the holder that shape, and restore it after.
        self.lin.weight_scale_inv = torch.nn.Parameter(self.lin.weight_scale_inv.data.squeeze(), requires_grad=False)


def fp8_cases(out):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    out["fp8.codes"] = codes.contiguous()
    out["fp8.codes_f32"] = codes.float().contiguous()
    qz = FineGrainedFP8HfQuantizer(FineGrainedFP8Config(weight_block_size=[128, 128]), pre_quantized=False)
    for i, (name, (rows, cols), scale) in enumerate(FP8_CASES):
        x = normal(rng(300 + i), (rows, cols), scale, torch.float32)
        holder = _Holder(rows, cols)
        qz.create_quantized_param(holder, x.clone(), "lin.weight", "cpu")
        w, s = holder.lin.weight.data, holder.lin.weight_scale_inv.data.reshape(rows // 128, cols // 128)
        assert w.dtype == torch.float8_e4m3fn and tuple(s.shape) == (rows // 128, cols // 128), (w.dtype, s.shape)
        deq = w.float() * s.float().repeat_interleave(128, 0).repeat_interleave(128, 1)
        k = "fp8." + name
        out[k + ".input"] = x
        out[k + ".weight"] = w.contiguous()
        out[k + ".scale_inv"] = s.float().contiguous()
        out[k + ".bf16"] = deq.to(torch.bfloat16).contiguous()


def mxfp4_cases(out):
    for i, (name, (e, r, g)) in enumerate(MXFP4_CASES):
        gen = rng(400 + i)
        blocks = torch.from_numpy(gen.integers(0, 256, size=(e, r, g, 16), dtype=np.uint8))
        # e8m0 exponents around 127 (2^0), as trained weights have, and the ends.
        scales = torch.from_numpy(gen.integers(110, 135, size=(e, r, g), dtype=np.uint8))
        scales.view(-1)[0] = 0
        scales.view(-1)[-1] = 254
        k = "mxfp4." + name
        out[k + ".blocks"] = blocks.contiguous()
        out[k + ".scales"] = scales.contiguous()
        out[k + ".bf16"] = convert_moe_packed_tensors(blocks.clone(), scales.clone()).contiguous()


FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]


def family_cases(out, fixtures_dir):
    from safetensors.torch import load_file

    qz = FineGrainedFP8HfQuantizer(FineGrainedFP8Config(weight_block_size=[128, 128]), pre_quantized=False)
    for fam in FAMILIES:
        weights = load_file(os.path.join(fixtures_dir, fam, "model.safetensors"))
        for name in sorted(weights):
            w = weights[name]
            if w.ndim != 2 or "embed_tokens" in name:
                continue
            k = fam + "/" + name
            q, st = BF.quantize_4bit(w.float(), blocksize=64, quant_type="nf4", compress_statistics=False)
            out[k + ".nf4"] = q.reshape(-1).contiguous()
            out[k + ".absmax"] = st.absmax.float().contiguous()
            out[k + ".nf4_bf16"] = deq_as(q, st, torch.bfloat16)
            rows, cols = w.shape
            pr, pc = -(-rows // 128) * 128, -(-cols // 128) * 128
            padded = torch.zeros(pr, pc, dtype=torch.float32)
            padded[:rows, :cols] = w.float()
            holder = _Holder(pr, pc)
            qz.create_quantized_param(holder, padded, "lin.weight", "cpu")
            out[k + ".fp8"] = holder.lin.weight.data[:rows, :cols].contiguous()
            out[k + ".scale_inv"] = holder.lin.weight_scale_inv.data.reshape(pr // 128, pc // 128).float().contiguous()


def raw_bytes(t):
    if t.dtype == torch.bfloat16 or t.dtype == torch.float8_e4m3fn:
        t = t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t.view(torch.int16)
    return t.numpy().tobytes()


def write_st(path, tensors, meta):
    """safetensors by hand: names sorted, data in that order (the bytes do not
    depend on the safetensors release)."""
    header, blobs, off = {"__metadata__": meta}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        b = raw_bytes(t)
        header[name] = {"dtype": ST_DTYPE[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def build(fixtures_dir):
    out, fam = {}, {}
    nf4_cases(out)
    fp8_cases(out)
    mxfp4_cases(out)
    family_cases(fam, fixtures_dir)
    meta = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "bitsandbytes": bitsandbytes.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    return {"formats.safetensors": out, "families.safetensors": fam}, meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/quant", help="folder to write formats.safetensors into")
    ap.add_argument("--check", action="store_true", help="compare with the file in --out instead of writing")
    a = ap.parse_args()
    files, meta = build(os.path.join(os.path.dirname(os.path.abspath(a.out)), "."))
    bad = 0
    for fname, tensors in files.items():
        path = os.path.join(a.out, fname)
        if a.check:
            tmp = path + ".check"
            write_st(tmp, tensors, meta)
            same = open(tmp, "rb").read() == open(path, "rb").read()
            os.unlink(tmp)
            print("same" if same else "DIFFERENT: " + path)
            bad += not same
            continue
        os.makedirs(a.out, exist_ok=True)
        write_st(path, tensors, meta)
        print("wrote", path, os.path.getsize(path), "bytes,", len(tensors), "tensors")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
