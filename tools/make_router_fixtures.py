#!/usr/bin/env python3
"""Writes tests/fixtures/router_group/cases.safetensors: DeepSeek-V3's sigmoid router
with a correction bias and group-limited top-k, as transformers computes it
(DeepseekV3TopkRouter; GLM-4.5's Glm4MoeTopkRouter is the same code), forward and
backward, for kernels/cpu/router_group.c.

Run it in the fixtures venv (tools/requirements-fixtures.txt; CPU only):

    /tmp/fixvenv/bin/python tools/make_router_fixtures.py                # rewrite
    /tmp/fixvenv/bin/python tools/make_router_fixtures.py --check        # compare only

Each case <c> (inputs from numpy's PCG64, the same on every CPU):
    <c>.logits    F32 [T, E]  the router logits
    <c>.bias      F32 [E]     e_score_correction_bias
    <c>.G         F32 [T, E]  the upstream gradient, per expert: the loss is
                              sum_t sum_j topk_w[t, j] * G[t, topk_idx[t, j]], so
                              it does not depend on the order topk returns
    <c>.chosen    I32 [T, E]  1 where transformers' router chose the expert
    <c>.weight    F32 [T, E]  its topk_w there, 0 elsewhere (order free: topk
                              with sorted=False has no defined order)
    <c>.dlogits   F32 [T, E]  d loss / d logits by torch autograd
and the metadata's "<c>" entry the config: E, K, n_group, topk_group, norm_topk,
scaling. The router runs as transformers' module: hidden_size = E and weight the
identity, so F.linear(logits, I) gives the logits exactly (each output is one x * 1
plus zeros) and the gradient w.r.t. the hidden states is dlogits.
"""
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mfx  # noqa: E402  (sets MKL_CBWR etc. before torch loads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter  # noqa: E402

need = mfx.need
DEFAULT_OUT = os.path.join(HERE, "..", "tests", "fixtures", "router_group")
FILE = "cases.safetensors"
SEED = 31000

# name: (T, E, K, n_group, topk_group, norm_topk, scaling, bias scale, bias shift)
CASES = {
    # DeepSeek-V3's proportions, small: 4 groups of 4, 2 kept, top-4, normalised, x2.5
    "v3": (37, 16, 4, 4, 2, True, 2.5, 0.05, 0.0),
    # no group limit (n_group 1), no normalisation (Moonlight-like), scaling 1
    "flat": (29, 8, 2, 1, 1, False, 1.0, 0.05, 0.0),
    # one group of 2 kept out of 8, top-2, normalised
    "one_group": (31, 16, 2, 8, 1, True, 1.5, 0.1, 0.0),
    # biases pushing every choice score below 0: the two experts of the one
    # group left out (masked to 0.0, not -inf) are chosen over those kept
    "negative": (23, 8, 3, 4, 3, True, 1.0, 0.05, -1.5),
}


def run_case(rng, T, E, K, G, TG, norm, scaling, bscale, bshift):
    cfg = DeepseekV3Config(n_routed_experts=E, num_experts_per_tok=K, n_group=G, topk_group=TG,
                           norm_topk_prob=norm, routed_scaling_factor=scaling, hidden_size=E)
    r = DeepseekV3TopkRouter(cfg)
    with torch.no_grad():
        r.weight.copy_(torch.eye(E))
        bias = (rng.standard_normal(E) * bscale + bshift).astype(np.float32)
        r.e_score_correction_bias.copy_(torch.from_numpy(bias))
    logits = (rng.standard_normal((T, E)) * 2.0).astype(np.float32)
    Gup = rng.standard_normal((T, E)).astype(np.float32)
    h = torch.from_numpy(logits.copy()).requires_grad_(True)
    idx, w = r(h)
    need(torch.equal(torch.nn.functional.linear(h.detach(), r.weight), h.detach()), "identity router weight")
    loss = (w * torch.from_numpy(Gup).gather(1, idx)).sum()
    loss.backward()
    chosen = np.zeros((T, E), np.int32)
    weight = np.zeros((T, E), np.float32)
    ii, ww = idx.numpy(), w.detach().numpy()
    for t in range(T):
        need(len(set(ii[t].tolist())) == K, f"row {t}: distinct experts")
        chosen[t, ii[t]] = 1
        weight[t, ii[t]] = ww[t]
    return {"logits": logits, "bias": bias, "G": Gup, "chosen": chosen, "weight": weight,
            "dlogits": h.grad.numpy().astype(np.float32)}


def generate(outdir):
    os.makedirs(outdir, exist_ok=True)
    rng = np.random.Generator(np.random.PCG64(SEED))
    tensors, meta = {}, {}
    for name, (T, E, K, G, TG, norm, scaling, bscale, bshift) in CASES.items():
        out = run_case(rng, T, E, K, G, TG, norm, scaling, bscale, bshift)
        for k, v in out.items():
            tensors[f"{name}.{k}"] = v
        meta[name] = json.dumps({"E": E, "K": K, "n_group": G, "topk_group": TG, "norm_topk": int(norm),
                                 "scaling": scaling}, sort_keys=True)
    # the left-out group by its score (the sum of its two largest choice scores): both its experts chosen
    T, E, K, G, TG = CASES["negative"][:5]
    c = 1 / (1 + np.exp(-tensors["negative.logits"].astype(np.float64))) + tensors["negative.bias"]
    top2 = np.sort(c.reshape(T, G, E // G), axis=-1)[..., -2:].sum(-1)
    out = np.argmin(top2, axis=-1)
    for t in range(T):
        need(all(tensors["negative.chosen"][t, out[t] * (E // G) + k] for k in range(E // G)),
             f"negative row {t}: the left-out group's experts (masked to 0.0) not chosen")
    mfx.write_st(os.path.join(outdir, FILE), tensors, meta)
    return [(n, CASES[n]) for n in CASES]


def main():
    args = mfx.start(__doc__, DEFAULT_OUT, "tests/fixtures/router_group")
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            generate(tmp)
            a, b = os.path.join(args.out, FILE), os.path.join(tmp, FILE)
            ok = os.path.exists(a) and open(a, "rb").read() == open(b, "rb").read()
        print("check: OK" if ok else "check: FAILED (the file differs from a fresh run)")
        sys.exit(0 if ok else 1)
    for n, c in generate(args.out):
        print(f"{n}: T, E, K, n_group, topk_group, norm, scaling, bias scale, shift = {c}")


if __name__ == "__main__":
    main()
