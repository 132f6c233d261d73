#!/usr/bin/python3
"""Writes tests/data/ops/cpu_linear.lmfx: PyTorch references for the tuned CPU linear
layer (y = x @ W^T, Hugging Face Linear layout W [N, K]) with f32 activations and
f32, bf16 or f16 weights.

Run from anywhere: /usr/bin/python3 scripts/gen_fixtures_cpu_linear.py
Deterministic (torch.manual_seed(4321)); needs torch (Debian python3-torch 1.13) and
numpy. For each case <c> in {f32, bf16, f16, decode_bf16}:
  <c>_x    [M, K]  activations, rounded to float32
  <c>_w    [N, K]  weights, rounded to the case's dtype (stored exactly as f64)
  <c>_y32  [M, N]  the float32 PyTorch forward: F.linear(x.float(), w.to(dtype).float())
  <c>_y64  [M, N]  the same product in float64
The C test loads w in the case's dtype and compares against both outputs.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lmfx  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "ops",
                   "cpu_linear.lmfx")

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def case(fx, name, dtype, m, n, k):
    x = torch.randn(m, k, dtype=torch.float64).float()
    w = (torch.randn(n, k, dtype=torch.float64) * k ** -0.5).to(DTYPES[dtype])
    y32 = F.linear(x, w.float())
    y64 = F.linear(x.double(), w.double())
    fx.update({f"{name}_x": x.double(), f"{name}_w": w.double(), f"{name}_y32": y32.double(),
               f"{name}_y64": y64})


def main():
    torch.manual_seed(4321)
    fx = {}
    # Shapes chosen to hit vector tails (K, N not multiples of 16) and the GEMM path.
    case(fx, "f32", "f32", 9, 37, 100)
    case(fx, "bf16", "bf16", 9, 37, 100)
    case(fx, "f16", "f16", 9, 37, 100)
    case(fx, "decode_bf16", "bf16", 1, 33, 130)
    lmfx.write(OUT, fx)
    print(f"wrote {os.path.normpath(OUT)} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
