#!/usr/bin/env python3
"""Writes tests/fixtures/rope/cases.safetensors: DeepSeek-V3's rotary embedding as
transformers computes it (DeepseekV3RotaryEmbedding, apply_rotary_pos_emb,
apply_rotary_pos_emb_interleave, _compute_yarn_parameters) on the rotated slices of
q heads and of the k row, for kernels/cpu/rope.c and its cuda twin.

Run it in the fixtures venv (tools/requirements-fixtures.txt; CPU only):

    /tmp/fixvenv/bin/python tools/make_rope_fixtures.py                # rewrite
    /tmp/fixvenv/bin/python tools/make_rope_fixtures.py --check        # compare only

Each case <c> (inputs from numpy's PCG64, the same on every CPU), laid out as moefit
holds the tensors (token-major):
    <c>.q        F32 [T, nh, Dq]  q heads: qk_nope_head_dim dims, then the rotated
                                  qk_rope_head_dim (off = qk_nope_head_dim)
    <c>.k        F32 [T, 1, Dk]   the kv_a row: kv_lora_rank dims, then k_rot
                                  (one head, off = kv_lora_rank)
    <c>.pos      I32 [T]          position ids
    <c>.q_out    F32 [T, nh, Dq]  q with its slice as transformers returns q_rot
                                  (interleaved: in its permuted order [x0, x2, ..,
                                  x1, x3, ..]); the first dims as they were
    <c>.k_out    F32 [T, 1, Dk]   the same for the k row
    <c>.inv_freq F32 [rot/2]      DeepseekV3RotaryEmbedding.inv_freq (the rope init
                                  function's, default or YaRN)
    <c>.cos, <c>.sin  F32 [T, rot]  its forward's cos and sin (times attention_scaling)
    <c>.scores   F32 [nh, T, T]   q_rot . k_rot of transformers' rotated slices (the
                                  rope part of the attention scores, before scaling),
                                  a float32 matmul
and the metadata's "<c>" entry: the shapes (T, nh, Dq, q_off, Dk, k_off, rot), theta,
interleaved, the rope_scaling values given (factor, original_max, beta_fast,
beta_slow, mscale, mscale_all_dim, truncate: null when absent) or factor 0 without
YaRN, and what transformers derives from them: attention_factor
(_compute_yarn_parameters'), softmax_mscale (yarn_get_mscale(factor,
mscale_all_dim), 1 without mscale_all_dim) and scaling (DeepseekV3Attention's
softmax scale, qk_head_dim).
"""
import json
import math
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mfx  # noqa: E402  (sets MKL_CBWR etc. before torch loads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import DeepseekV3Config  # noqa: E402
from transformers.modeling_rope_utils import _compute_yarn_parameters  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mdv3  # noqa: E402

need = mfx.need
DEFAULT_OUT = os.path.join(HERE, "..", "tests", "fixtures", "rope")
FILE = "cases.safetensors"
SEED = 32000

# name: shapes (T, nh, nope, rot, lora), theta, interleave, rope_scaling (None: default rope),
# the largest position
CASES = {
    # rotate_half on the tail of each head (off > 0), default frequencies
    "offset": ((9, 3, 8, 16, 12), 1e4, False, None, 4095),
    # DeepSeek-V3's rope_interleave, default frequencies
    "interleaved": ((9, 2, 16, 16, 24), 1e4, True, None, 4095),
    # DeepSeek-V3's own values: YaRN factor 40 over 4096, betas 32 / 1, mscale 1 / 1
    # (attention_factor 1), theta 1e4, qk_rope_head_dim 64, interleaved
    "yarn_v3": ((11, 2, 16, 64, 32), 1e4, True,
                dict(rope_type="yarn", factor=40.0, original_max_position_embeddings=4096, beta_fast=32.0,
                     beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0), 40 * 4096 - 1),
    # attention_factor != 1 (mscale without mscale_all_dim: 0.1 ln 32 + 1), no truncation of the
    # correction range, rotate_half, theta 5e4
    "yarn_scaled": ((9, 2, 8, 32, 16), 5e4, False,
                    dict(rope_type="yarn", factor=32.0, original_max_position_embeddings=4096, beta_fast=32.0,
                         beta_slow=1.0, mscale=1.0, truncate=False), 32 * 4096 - 1),
}


def run_case(rng, shapes, theta, interleave, scaling, max_pos):
    T, nh, nope, rot, lora = shapes
    max_pe = int(scaling["factor"] * scaling["original_max_position_embeddings"]) if scaling else 4096
    cfg = DeepseekV3Config(hidden_size=32, num_attention_heads=nh, num_key_value_heads=nh, q_lora_rank=None,
                           qk_nope_head_dim=nope, qk_rope_head_dim=rot, kv_lora_rank=lora, v_head_dim=8,
                           rope_theta=theta, rope_interleave=interleave, max_position_embeddings=max_pe,
                           rope_scaling=dict(scaling) if scaling else None)
    Dq, Dk = nope + rot, lora + rot
    q = rng.standard_normal((T, nh, Dq)).astype(np.float32)
    k = rng.standard_normal((T, 1, Dk)).astype(np.float32)
    pos = np.sort(rng.integers(2, max_pos, T)).astype(np.int32)
    pos[0], pos[1], pos[-1] = 0, 1, max_pos  # the identity, one step, the last position
    rotary = mdv3.DeepseekV3RotaryEmbedding(cfg)
    with torch.no_grad():
        x = torch.from_numpy(q).transpose(0, 1)[None]  # [1, nh, T, Dq], as the attention holds it
        cos, sin = rotary(x, torch.from_numpy(pos.astype(np.int64))[None])
        q_pass, q_rot = torch.split(x, [nope, rot], dim=-1)
        kv = torch.from_numpy(k[:, 0])[None]  # [1, T, Dk]: compressed_kv
        k_pass, k_rot = torch.split(kv, [lora, rot], dim=-1)
        k_rot = k_rot.view(1, 1, T, rot)
        apply = mdv3.apply_rotary_pos_emb_interleave if interleave else mdv3.apply_rotary_pos_emb
        q_rot, k_rot = apply(q_rot, k_rot, cos, sin)
        scores = torch.matmul(q_rot, k_rot.transpose(2, 3))[0]  # [nh, T, T]
        q_out = torch.cat((q_pass, q_rot), dim=-1)[0].transpose(0, 1).numpy()
        k_out = torch.cat((k_pass[:, None], k_rot), dim=-1)[0].transpose(0, 1).numpy()
        attn = mdv3.DeepseekV3Attention(cfg, layer_idx=0)
    need(np.array_equal(q_out[..., :nope], q[..., :nope]) and np.array_equal(k_out[..., :lora], k[..., :lora]),
         "the unrotated dims pass through")
    meta = {"T": T, "nh": nh, "Dq": Dq, "q_off": nope, "Dk": Dk, "k_off": lora, "rot": rot, "theta": theta,
            "interleaved": int(interleave), "qk_head_dim": cfg.qk_head_dim, "scaling": attn.scaling}
    if scaling:
        inv, af = _compute_yarn_parameters(cfg, "cpu")
        need(torch.equal(inv, rotary.inv_freq), "the rotary embedding's inv_freq is _compute_yarn_parameters'")
        need(af == rotary.attention_scaling, "attention_scaling")
        msa = scaling.get("mscale_all_dim", 0)
        meta.update(factor=scaling["factor"], original_max=scaling["original_max_position_embeddings"],
                    beta_fast=scaling["beta_fast"], beta_slow=scaling["beta_slow"],
                    mscale=scaling.get("mscale", 0), mscale_all_dim=msa, truncate=scaling.get("truncate"),
                    attention_factor=af,
                    softmax_mscale=mdv3.yarn_get_mscale(scaling["factor"], msa) if msa else 1.0)
    else:
        need(rotary.attention_scaling == 1.0, "default rope: attention_scaling 1")
        meta.update(factor=0.0, attention_factor=1.0, softmax_mscale=1.0)
    tensors = {"q": q, "k": k, "pos": pos, "q_out": np.ascontiguousarray(q_out),
               "k_out": np.ascontiguousarray(k_out), "inv_freq": rotary.inv_freq.numpy().astype(np.float32),
               "cos": cos[0].numpy(), "sin": sin[0].numpy(), "scores": scores.numpy()}
    return tensors, meta


def generate(outdir):
    os.makedirs(outdir, exist_ok=True)
    rng = np.random.Generator(np.random.PCG64(SEED))
    tensors, meta = {}, {}
    for name, (shapes, theta, interleave, scaling, max_pos) in CASES.items():
        t, m = run_case(rng, shapes, theta, interleave, scaling, max_pos)
        for k, v in t.items():
            tensors[f"{name}.{k}"] = v
        meta[name] = json.dumps(m, sort_keys=True)
    need(json.loads(meta["yarn_v3"])["attention_factor"] == 1.0, "DeepSeek-V3's values: attention_factor 1")
    need(abs(json.loads(meta["yarn_scaled"])["attention_factor"] - (0.1 * math.log(32) + 1)) < 1e-15,
         "yarn_scaled: attention_factor 0.1 ln 32 + 1")
    mfx.write_st(os.path.join(outdir, FILE), tensors, meta)
    return [(n, json.loads(meta[n])) for n in CASES]


def main():
    args = mfx.start(__doc__, DEFAULT_OUT, "tests/fixtures/rope")
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            generate(tmp)
            a, b = os.path.join(args.out, FILE), os.path.join(tmp, FILE)
            ok = os.path.exists(a) and open(a, "rb").read() == open(b, "rb").read()
        print("check: OK" if ok else "check: FAILED (the file differs from a fresh run)")
        sys.exit(0 if ok else 1)
    for n, m in generate(args.out):
        print(f"{n}: {json.dumps(m, sort_keys=True)}")


if __name__ == "__main__":
    main()
