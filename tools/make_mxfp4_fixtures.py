#!/usr/bin/env python3
"""Writes tests/fixtures/mxfp4/: a tiny gpt-oss checkpoint whose experts are stored
in MXFP4 as OpenAI ships gpt-oss-20b / -120b, and transformers' reading of it.

Run it in the venv of tools/requirements-fixtures.txt (everything runs on the CPU):

    /tmp/fixvenv/bin/python tools/make_mxfp4_fixtures.py            # rewrite tests/fixtures/mxfp4
    /tmp/fixvenv/bin/python tools/make_mxfp4_fixtures.py --check    # compare only

The published checkpoints store each MoE layer's experts as (transformers'
integrations/mxfp4.py, Mxfp4GptOssExperts):
    mlp.experts.gate_up_proj_blocks  U8 [E, 2I, H/32, 16]   two E2M1 codes a byte, low nibble first
    mlp.experts.gate_up_proj_scales  U8 [E, 2I, H/32]       e8m0: the block's power of two + 127
    mlp.experts.down_proj_blocks     U8 [E, H, I/32, 16]
    mlp.experts.down_proj_scales     U8 [E, H, I/32]
(nn.Linear's [out, in] layout; the biases stay float) and config.json carries
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [...]}.
transformers reads them with convert_moe_packed_tensors (the codes through FP4_VALUES, times
2^(scale - 127), then transposed to the [E, in, out] of GptOssExperts); that function is the
reference here, called on these files' own tensors.

A tiny GptOssConfig (vocab 272: the byte-level demo data fits; H 64, I 32 so that both projections have whole blocks of 32, 4 experts top 2,
2 layers: one sliding, one full) gets make_fixtures' seeded init; its expert weights are encoded
to MXFP4 here (each block's exponent the smallest that fits its absmax under 6, each element the
nearest E2M1 value, ties to the smaller); the codes and scales are drawn so that every code
(both signs, +-0 included) and scales from 2^-8 to 2^2 appear. It writes tests/fixtures/mxfp4/gpt_oss/
  config.json         the model's config.json plus the quantization_config block
  model.safetensors   the MXFP4 experts (blocks, scales), every other tensor F32
  expected.safetensors
      deq.<layer>.gate_up_proj, deq.<layer>.down_proj  F32: convert_moe_packed_tensors of the file's
                          blocks and scales ([E, H, 2I], [E, I, H], what transformers computes with)
      input_ids I32 [B, S], logits F32 [B, S, V]: transformers' eager fp32 forward with the
                          dequantized experts loaded into GptOssForCausalLM

Determinism: make_fixtures' torch settings and numpy PCG64 seeds; --check regenerates into a
temporary directory and compares every file byte for byte.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mfx  # noqa: E402  (sets the torch determinism settings before torch loads)
import make_quant_fixtures as mqz  # noqa: E402

import argparse  # noqa: E402
import filecmp  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import GptOssConfig, GptOssForCausalLM  # noqa: E402
from transformers.integrations.mxfp4 import FP4_VALUES, convert_moe_packed_tensors  # noqa: E402

SEED = 20261203
mqz.ST_DTYPE.setdefault(torch.int32, "I32")
OUT = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "mxfp4")
E2M1 = np.array(FP4_VALUES[:8], dtype=np.float64)  # 0, 0.5, 1, 1.5, 2, 3, 4, 6


def need(cond, what):
    if not cond:
        raise SystemExit("make_mxfp4_fixtures: " + what)


def encode(w):
    """w [rows, cols] float64 (cols a multiple of 32) -> (codes U8 [rows, cols/32, 16], scales U8 [rows, cols/32])."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // 32, 32)
    amax = np.abs(g).max(axis=2)
    # the smallest e with amax / 2^e <= 6 (all-zero blocks: 2^-127's code 0)
    e = np.where(amax > 0, np.ceil(np.log2(np.maximum(amax, 1e-300) / 6.0)), -127).astype(np.int64)
    e = np.clip(e, -127, 127)
    x = g / np.power(2.0, e)[..., None]
    # the nearest E2M1 magnitude (ties: the smaller one), the sign in bit 3
    best = np.abs(np.abs(x)[..., None] - E2M1).argmin(axis=-1)
    code = best.astype(np.uint8) | (np.signbit(x).astype(np.uint8) << 3)
    lo, hi = code[..., 0::2], code[..., 1::2]
    blocks = (lo | (hi << 4)).astype(np.uint8)
    return blocks, (e + 127).astype(np.uint8)


def tiny_config():
    return GptOssConfig(
        vocab_size=272, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=3,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=512,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                      "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
        rope_theta=10000.0, router_aux_loss_coef=0.9, tie_word_embeddings=False)


def build(out_dir):
    torch.manual_seed(SEED)
    cfg = tiny_config()
    model = GptOssForCausalLM(cfg).float().eval()
    rng = np.random.default_rng(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = rng.standard_normal(tuple(p.shape))
            scale = 1.0 if "experts.gate_up_proj" in name else 0.2
            if "layernorm" in name or name == "model.norm.weight":
                p.copy_(torch.from_numpy(1.0 + 0.1 * z))
            else:
                p.copy_(torch.from_numpy(scale * z))
    sd = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    tensors, expected = {}, {}
    scale_range = [2.0 ** -8, 4.0]  # block magnitudes from tiny to large, so scales span 2^-8 .. 2^2
    for l in range(cfg.num_hidden_layers):
        pre = f"model.layers.{l}.mlp.experts."
        for proj in ("gate_up_proj", "down_proj"):
            w = sd.pop(pre + proj).double().numpy()  # [E, in, out] (x @ W)
            wt = np.ascontiguousarray(np.swapaxes(w, 1, 2))  # [E, out, in]
            E, o, i = wt.shape
            mags = np.exp(rng.uniform(np.log(scale_range[0]), np.log(scale_range[1]), size=(E, o, i // 32, 1)))
            wt = (wt.reshape(E, o, i // 32, 32) * mags).reshape(E, o, i)
            blocks, scales = encode(wt.reshape(E * o, i))
            blocks = blocks.reshape(E, o, i // 32, 16)
            scales = scales.reshape(E, o, i // 32)
            tensors[pre + proj + "_blocks"] = torch.from_numpy(blocks)
            tensors[pre + proj + "_scales"] = torch.from_numpy(scales)
            deq = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
            need(tuple(deq.shape) == tuple(w.shape), f"{proj}: dequantized {tuple(deq.shape)} vs {w.shape}")
            expected[f"deq.{l}.{proj}"] = deq.contiguous()
            model.get_submodule(f"model.layers.{l}.mlp.experts").get_parameter(proj).data.copy_(deq)
        codes = np.concatenate([tensors[pre + p + "_blocks"].numpy().reshape(-1) for p in ("gate_up_proj", "down_proj")])
        seen = set((codes & 15).tolist()) | set((codes >> 4).tolist())
        need(len(seen) == 16, f"layer {l}: only {len(seen)} of the 16 codes appear")
    for k, v in sd.items():
        tensors[k] = v
    ids_rng = np.random.default_rng(SEED + 1)
    ids = torch.from_numpy(ids_rng.integers(0, cfg.vocab_size, size=(2, 9)).astype(np.int64))
    with torch.no_grad():
        model.config._attn_implementation = "eager"
        logits = model(input_ids=ids).logits.float()
    expected["input_ids"] = ids.to(torch.int32)
    expected["logits"] = logits.contiguous()
    d = os.path.join(out_dir, "gpt_oss")
    os.makedirs(d, exist_ok=True)
    conf = cfg.to_dict()
    conf["architectures"] = ["GptOssForCausalLM"]
    conf["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                                   "lm_head"]}
    for k in ("transformers_version", "torch_dtype", "dtype"):
        conf.pop(k, None)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True)
        f.write("\n")
    mqz.write_st(os.path.join(d, "model.safetensors"), tensors, {"format": "pt"})
    mqz.write_st(os.path.join(d, "expected.safetensors"),
                 {k: (v.to(torch.float32) if v.dtype != torch.int32 else v) for k, v in expected.items()},
                 {"format": "pt", "seed": str(SEED), "torch_version": torch.__version__})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="regenerate into a temporary dir and compare")
    a = ap.parse_args()
    if not a.check:
        if os.path.isdir(OUT):
            shutil.rmtree(OUT)
        build(OUT)
        print("wrote", OUT)
        return
    with tempfile.TemporaryDirectory() as tmp:
        build(tmp)
        for name in ("config.json", "model.safetensors", "expected.safetensors"):
            need(filecmp.cmp(os.path.join(tmp, "gpt_oss", name), os.path.join(OUT, "gpt_oss", name), shallow=False),
                 f"gpt_oss/{name} differs from a fresh run")
    print("check: OK")


if __name__ == "__main__":
    main()
