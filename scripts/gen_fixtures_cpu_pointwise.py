#!/usr/bin/python3
"""Writes tests/data/ops/cpu_pointwise.lmfx: PyTorch *float32* results of the O(n)
operators a forward pass runs every layer, read by tests/ops/test_ops_cpu_pointwise.c to
show that loom's tuned f32 CPU paths agree with what a float32 PyTorch model computes
(the float64 truth for the same operators is in norm_rope.lmfx and the tests' own
re-derivations).

  - rmsnorm as Hugging Face LlamaRMSNorm run in float32:
      variance = x.pow(2).mean(-1, keepdim=True); weight * (x * rsqrt(variance + eps)),
    on a [6, 896] activation (Qwen2-0.5B's hidden size) scaled like a residual stream;
  - swiglu as the Llama MLP's act_fn(gate) * up with F.silu, on [3, 400];
  - softmax(x * scale) with F.softmax over the last dim, on [5, 200].
Inputs are drawn in float64, rounded to float32 and stored as those exact values; the
outputs are float32 results stored as float64. Deterministic: torch.manual_seed(2024).
Run from anywhere: /usr/bin/python3 scripts/gen_fixtures_cpu_pointwise.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lmfx  # noqa: E402

F32, F64 = torch.float32, torch.float64


def rand32(shape, scale=1.0):
    return (torch.randn(shape, dtype=F64) * scale).to(F32)


def main():
    torch.manual_seed(2024)
    fx = {}

    x = rand32((6, 896), 3.0)
    w = (1.0 + 0.2 * torch.randn(896, dtype=F64)).to(F32)
    eps = 1e-6
    variance = x.pow(2).mean(-1, keepdim=True)
    out = w * (x * torch.rsqrt(variance + eps))
    fx.update({"rmsnorm.x": x, "rmsnorm.weight": w, "rmsnorm.eps": torch.tensor(eps, dtype=F64),
               "rmsnorm.out": out})

    g, u = rand32((3, 400), 3.0), rand32((3, 400))
    fx.update({"swiglu.gate": g, "swiglu.up": u, "swiglu.out": torch.nn.functional.silu(g) * u})

    s, scale = rand32((5, 200), 4.0), 0.125
    fx.update({"softmax.x": s, "softmax.scale": torch.tensor(scale, dtype=F64),
               "softmax.out": torch.softmax(s * scale, dim=-1)})

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "tests", "data", "ops", "cpu_pointwise.lmfx")
    lmfx.write(path, {k: v.to(F64).numpy() for k, v in fx.items()})
    print(f"wrote {path} ({os.path.getsize(path)} bytes, {len(fx)} tensors)")


if __name__ == "__main__":
    main()
