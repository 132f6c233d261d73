#!/usr/bin/python3
"""Writes tests/data/ops/matmul_attention.lmfx: PyTorch float64 references for loom's
matmul, softmax, attention, cross-entropy, argmax and top-k operators.

Run from anywhere: /usr/bin/python3 scripts/gen_fixtures_matmul_attention.py
Deterministic (torch.manual_seed(1234)); needs torch (Debian python3-torch 1.13) and
numpy. Every input is rounded through float32 first so the C tests can load it as
f32 exactly. Layout conventions (the tests rely on them):
  - attention q/k/v are stored as [B, T, H, D] (the tests permute them to
    [B, H, T, D] views); outputs are [B, Hq, Tq, Dv]. The reference expands kv heads
    with repeat_interleave (loom itself never copies K/V).
  - causal masks align queries with the last Tq of Tk keys: row i sees j <= i + Tk - Tq.
  - scalars (scales, ignore_index) are stored as 0-d tensors.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lmfx  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "ops",
                   "matmul_attention.lmfx")


def randn(*shape, scale=1.0):
    return (torch.randn(*shape, dtype=torch.float64) * scale).float().double()


def causal_mask(tq, tk):
    i = torch.arange(tq).unsqueeze(1)
    j = torch.arange(tk).unsqueeze(0)
    return j <= i + (tk - tq)


def softmax_ref(x, scale, causal):
    s = x * scale
    if causal:
        s = s.masked_fill(~causal_mask(s.shape[-2], s.shape[-1]), float("-inf"))
    return torch.softmax(s, dim=-1)


def attention_ref(q_bthd, k_bthd, v_bthd, scale, causal):
    q, k, v = (t.permute(0, 2, 1, 3) for t in (q_bthd, k_bthd, v_bthd))
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    return softmax_ref(q @ k.transpose(-1, -2), scale, causal) @ v


def main():
    torch.manual_seed(1234)
    fx = {}

    # matmul with batch broadcast: [2, 1, 3, 4] @ [3, 4, 5] -> [2, 3, 3, 5]
    a, b = randn(2, 1, 3, 4), randn(3, 4, 5)
    fx.update(mm_bcast_a=a, mm_bcast_b=b, mm_bcast_out=a @ b)
    # Linear layer: x [2, 3, 6] @ w^T with w [5, 6] stored as the weight
    x, w = randn(2, 3, 6), randn(5, 6)
    fx.update(mm_linear_x=x, mm_linear_w=w, mm_linear_out=F.linear(x, w))

    # softmax: causal with Tq < Tk, and plain
    x = randn(2, 3, 7, scale=2.0)
    fx.update(sm_x=x, sm_scale=torch.tensor(0.7, dtype=torch.float64),
              sm_causal_out=softmax_ref(x, 0.7, True), sm_plain_out=softmax_ref(x, 0.7, False))

    # attention: (name, B, Hq, Hkv, Tq, Tk, D, Dv, causal)
    cases = [
        ("att_mha_causal", 2, 3, 3, 4, 4, 8, 8, True),
        ("att_gqa2_causal", 1, 4, 2, 3, 6, 8, 5, True),
        ("att_gqa4_plain", 2, 8, 2, 5, 4, 4, 4, False),
        ("att_mqa_causal", 1, 4, 1, 2, 5, 6, 6, True),
        ("att_mqa_plain", 2, 3, 1, 3, 7, 4, 3, False),
    ]
    for name, B, hq, hkv, tq, tk, d, dv, causal in cases:
        q, k, v = randn(B, tq, hq, d), randn(B, tk, hkv, d), randn(B, tk, hkv, dv)
        scale = 1.0 / d ** 0.5
        fx[name + "_q"], fx[name + "_k"], fx[name + "_v"] = q, k, v
        fx[name + "_scale"] = torch.tensor(scale, dtype=torch.float64)
        fx[name + "_causal"] = torch.tensor(int(causal))
        fx[name + "_out"] = attention_ref(q, k, v, scale, causal)

    # cross-entropy with ignore_index = -100 (rows 2 and 5 ignored), and all ignored
    logits = randn(7, 11, scale=3.0)
    targets = torch.tensor([3, 0, -100, 10, 7, -100, 1])
    fx.update(ce_logits=logits, ce_targets=targets, ce_ignore=torch.tensor(-100),
              ce_out=F.cross_entropy(logits, targets, ignore_index=-100))
    all_ignored = torch.full((7,), -100)
    fx.update(ce_all_ignored_targets=all_ignored,
              ce_all_ignored_out=F.cross_entropy(logits, all_ignored, ignore_index=-100))

    # argmax over a coarse grid (ties; torch returns the first maximal index)
    x = torch.randint(0, 4, (5, 9)).double()
    fx.update(argmax_x=x, argmax_out=torch.argmax(x, dim=-1))
    # top-k over distinct values (multiples of 0.25, exact in bf16), k = 4
    x = torch.stack([torch.randperm(12) for _ in range(5)]).double() * 0.25 - 1.5
    values, indices = torch.topk(x, 4, dim=-1, largest=True, sorted=True)
    fx.update(topk_x=x, topk_values=values, topk_indices=indices)

    lmfx.write(OUT, {k: v.numpy() for k, v in fx.items()})
    print(f"wrote {os.path.normpath(OUT)} ({os.path.getsize(OUT)} bytes, {len(fx)} tensors)")


if __name__ == "__main__":
    main()
