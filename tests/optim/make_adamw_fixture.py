#!/usr/bin/env python3
"""Writes tests/optim/adamw_torch.bin: torch.optim.AdamW (CPU, foreach=False)
over a few steps, for optim_test's parity check.

  python3 tests/optim/make_adamw_fixture.py [OUT]   (needs torch and numpy)

Format, little-endian:
  "MFADAMW1", u32 n_cases, then per case:
    f64 lr_peak, beta1, beta2, eps, weight_decay; u32 n, u32 steps;
    f32 p0[n] (m and v start at zero, as torch's state does);
    per step: f64 lr; f32 g[n]; f32 p[n], m[n], v[n] after the step;
              f32 p_cr[n]: p after the step of a second run, same gradients,
              in which Tensor.sqrt is correctly rounded.
The lr of step s (1-based) is lr_peak * s / steps (a warmup), so each step has
its own bias corrections and lr.

Why the second run: on x86 torch computes Tensor.sqrt with MKL VML, within
1 ulp but not correctly rounded; moefit uses the correctly rounded sqrtf. With
that one op swapped, torch's AdamW must match moefit bit for bit.
"""
import struct
import sys

import numpy as np
import torch

CASES = [
    # lr_peak, beta1, beta2, eps, weight_decay
    (1e-3, 0.9, 0.999, 1e-8, 0.01),  # torch's AdamW defaults
    (3e-4, 0.9, 0.95, 1e-8, 0.0),  # no weight decay
    (1e-2, 0.3, 0.95, 1e-6, 0.1),  # 1 - beta1 >= 0.5: lerp's other branch
]
N = 515  # not a multiple of a vector width: torch's tail path too
STEPS = 5


def grads(gen, n):
    """Gradients over many magnitudes, with exact zeros and a subnormal."""
    g = torch.randn(n, generator=gen) * torch.pow(10.0, torch.empty(n).uniform_(-6, 2, generator=gen))
    g[::37] = 0.0
    g[5] = 1e-40
    return g.float()


def correctly_rounded_sqrt(t):
    return torch.from_numpy(np.sqrt(t.detach().numpy().astype(np.float64)).astype(np.float32))


def run(p0, gs, lrs, b1, b2, eps, wd):
    """torch AdamW over the steps; (p, m, v) after each."""
    p = torch.nn.Parameter(p0.clone())
    opt = torch.optim.AdamW([p], lr=lrs[0], betas=(b1, b2), eps=eps, weight_decay=wd, foreach=False)
    out = []
    for lr, g in zip(lrs, gs):
        for group in opt.param_groups:
            group["lr"] = lr
        p.grad = g.clone()
        opt.step()
        st = opt.state[p]
        out.append((p.detach().clone(), st["exp_avg"].clone(), st["exp_avg_sq"].clone()))
    return out


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/optim/adamw_torch.bin"
    gen = torch.Generator().manual_seed(1234)
    blob = bytearray(b"MFADAMW1")
    blob += struct.pack("<I", len(CASES))
    for lr_peak, b1, b2, eps, wd in CASES:
        p0 = torch.randn(N, generator=gen)
        lrs = [lr_peak * s / STEPS for s in range(1, STEPS + 1)]
        gs = [grads(gen, N) for _ in lrs]
        plain = run(p0, gs, lrs, b1, b2, eps, wd)
        mkl_sqrt = torch.Tensor.sqrt
        torch.Tensor.sqrt = correctly_rounded_sqrt
        try:
            exact = run(p0, gs, lrs, b1, b2, eps, wd)
        finally:
            torch.Tensor.sqrt = mkl_sqrt
        blob += struct.pack("<5d2I", lr_peak, b1, b2, eps, wd, N, STEPS)
        blob += p0.numpy().astype("<f4").tobytes()
        for lr, g, (p, m, v), (p_cr, m_cr, v_cr) in zip(lrs, gs, plain, exact):
            assert torch.equal(m, m_cr) and torch.equal(v, v_cr)
            blob += struct.pack("<d", lr)
            for t in (g, p, m, v, p_cr):
                blob += t.numpy().astype("<f4").tobytes()
    with open(out, "wb") as f:
        f.write(blob)
    print(f"{out}: {len(blob)} bytes, torch {torch.__version__}, cpu {torch.backends.cpu.get_cpu_capability()}")


if __name__ == "__main__":
    main()
