#!/usr/bin/python3
"""Writes tests/data/ops/norm_rope.lmfx: PyTorch float64 references for loom's
RMSNorm, fused add + RMSNorm, rotary position embedding (split-half and interleaved)
and embedding lookup, read by tests/ops/test_ops_{norm,rope,embedding}.c.

The math is re-implemented here with plain torch ops (no transformers import):
  - rmsnorm as Hugging Face LlamaRMSNorm: x * rsqrt(mean(x^2, -1) + eps) * weight;
  - rope split-half exactly as transformers' rotary embedding + apply_rotary_pos_emb:
    freqs = inv_freq x positions, emb = cat(freqs, freqs), cos/sin = emb.cos/sin()
    * attention_scaling, out = x * cos + rotate_half(x) * sin, in the [B, T, H, D]
    layout (unsqueeze_dim = 2);
  - rope interleaved as Meta's original: view (2i, 2i + 1) as a complex number and
    multiply by attn_factor * exp(i * pos * inv_freq[i]);
  - qkv bias is added to x before rotating.
inv_freq tensors are stored already rounded to float32, because loom takes inv_freq
as an f32 view; everything else is float64. Deterministic: torch.manual_seed(1234).
Run from the repository root: /usr/bin/python3 scripts/gen_fixtures_norm_rope.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lmfx  # noqa: E402

F64 = torch.float64


def rmsnorm(x, weight, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(variance + eps) * weight


def inv_freq_f64(theta, head_dim):
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=F64) / head_dim))


def inv_freq_as_f32(theta, head_dim):
    return inv_freq_f64(theta, head_dim).to(torch.float32).to(F64)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_split_half(x, inv_freq, positions, attn_factor):
    """x [B, T, H, D]; positions [B, T] (float64)."""
    b = x.shape[0]
    inv_freq_expanded = inv_freq[None, :, None].expand(b, -1, 1)
    position_ids_expanded = positions[:, None, :]
    freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)  # [B, T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = (emb.cos() * attn_factor).unsqueeze(2)
    sin = (emb.sin() * attn_factor).unsqueeze(2)
    return (x * cos) + (rotate_half(x) * sin)


def rope_interleaved(x, inv_freq, positions, attn_factor):
    freqs = positions[:, :, None] * inv_freq[None, None, :]  # [B, T, D/2]
    rot = torch.polar(torch.full_like(freqs, attn_factor), freqs)[:, :, None, :]
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(xc * rot).flatten(3)


def rope_case(fx, name, style, shape, theta, positions, pos_offset, bias, attn_factor):
    """positions: None (pos_offset + t), a [T] or a [B, T] integer tensor."""
    b, t, h, d = shape
    x = torch.randn(shape, dtype=F64)
    inv_freq = inv_freq_as_f32(theta, d)
    if positions is None:
        pos_bt = (pos_offset + torch.arange(t, dtype=F64)).expand(b, t)
    else:
        pos_bt = positions.to(F64).expand(b, t)
        fx[f"{name}.positions"] = positions
    xb = x
    if bias:
        bias_t = torch.randn(h, d, dtype=F64) * 0.5
        fx[f"{name}.bias"] = bias_t
        xb = x + bias_t
    fn = rope_split_half if style == "split" else rope_interleaved
    fx[f"{name}.x"] = x
    fx[f"{name}.inv_freq"] = inv_freq
    fx[f"{name}.pos_offset"] = torch.tensor(pos_offset, dtype=torch.int64)
    fx[f"{name}.attn_factor"] = torch.tensor(attn_factor, dtype=F64)
    fx[f"{name}.out"] = fn(xb, inv_freq, pos_bt, attn_factor)


def main():
    torch.manual_seed(1234)
    fx = {}

    # rmsnorm: a Llama-like row and a Qwen3-like per-head norm over D = 8.
    for name, shape, eps in (("rmsnorm_a", (3, 5, 32), 1e-6), ("rmsnorm_b", (2, 4, 3, 8), 1e-5)):
        x = torch.randn(shape, dtype=F64) * 3.0
        w = 1.0 + 0.2 * torch.randn(shape[-1], dtype=F64)
        fx[f"{name}.x"], fx[f"{name}.weight"] = x, w
        fx[f"{name}.eps"] = torch.tensor(eps, dtype=F64)
        fx[f"{name}.out"] = rmsnorm(x, w, eps)

    # add_rmsnorm: the decoder-layer residual update then the next layer's norm.
    x = torch.randn(2, 6, 24, dtype=F64)
    residual = torch.randn(2, 6, 24, dtype=F64) * 4.0
    w = 1.0 + 0.2 * torch.randn(24, dtype=F64)
    eps = 1e-6
    s = residual + x
    fx.update({"add_rmsnorm.x": x, "add_rmsnorm.residual": residual, "add_rmsnorm.weight": w,
               "add_rmsnorm.eps": torch.tensor(eps, dtype=F64), "add_rmsnorm.sum": s,
               "add_rmsnorm.out": rmsnorm(s, w, eps)})

    # inv_freq tables (float64 truth; loom writes f32).
    for theta, d in ((10000.0, 8), (1000000.0, 128), (500000.0, 64)):
        fx[f"inv_freq.{int(theta)}.{d}"] = inv_freq_f64(theta, d)

    # rope: both styles, implicit positions with offsets, [T] and [B, T] position
    # arrays (large and repeated positions included), bias and attn_factor.
    rope_case(fx, "rope_split_offset", "split", (2, 5, 3, 8), 10000.0, None, 3, False, 1.0)
    pos_bt = torch.tensor([[0, 1, 2, 3, 4, 5], [100, 101, 4095, 4096, 7, 7]], dtype=torch.int64)
    rope_case(fx, "rope_split_bt", "split", (2, 6, 2, 16), 1000000.0, pos_bt, 0, True, 1.2)
    pos_t = torch.tensor([5, 9, 13, 2], dtype=torch.int64)
    rope_case(fx, "rope_inter_t", "interleaved", (3, 4, 2, 12), 10000.0, pos_t, 0, True, 0.9)
    rope_case(fx, "rope_inter_offset", "interleaved", (1, 7, 4, 6), 500000.0, None, 250, False, 1.0)

    # embedding: a small table and a [2, 5] batch of ids (repeats, first and last row).
    table = torch.randn(13, 6, dtype=F64)
    ids = torch.tensor([[0, 12, 3, 3, 7], [12, 1, 0, 5, 9]], dtype=torch.int64)
    fx.update({"embedding.table": table, "embedding.ids": ids,
               "embedding.out": torch.nn.functional.embedding(ids, table)})

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "tests", "data", "ops", "norm_rope.lmfx")
    lmfx.write(path, {k: v.numpy() for k, v in fx.items()})
    print(f"wrote {path} ({os.path.getsize(path)} bytes, {len(fx)} tensors)")


if __name__ == "__main__":
    main()
