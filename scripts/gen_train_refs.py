#!/usr/bin/python3
"""Training references for loom's tests, computed with PyTorch on the CPU in float64.

1. Whole-model gradients. For every checkpoint in tests/data/models (scripts/
   make_reference_models.sh) the causal-LM loss of a fixed batch and the gradient of
   every parameter, from a plain-torch re-implementation of the Hugging Face forward
   (llama / mistral / qwen2 / qwen3: RMSNorm, q/k/v/o projections with optional
   biases, qwen3 per-head q/k norms, rotate-half RoPE, grouped-query causal attention
   with per-layer sliding windows,
   SwiGLU MLP, tied or untied head, mean cross-entropy with ignore_index -100). No
   transformers import: weights are read with make_random_model.read_checkpoint and
   RoPE frequencies with gen_fixtures_io_rope.reference (transformers'
   modeling_rope_utils formulas), rounded to float32 as transformers stores inv_freq.
   Everything else is float64, so the fixture is exact to ~1e-15 and loom's float32
   gradients are compared against it with the f32 error budget.
   Written per model to tests/data/train/grad_refs/<model>.lmfx:
     ids, targets [B, T] (i64; targets hold -100 where ignored), loss (scalar),
     and per parameter N: "s.N" the gradient's sum of squares, "i.N" up to 48 element
     indices (first, last, and seeded random ones), "v.N" the gradient at them.
2. AdamW. torch.optim.AdamW (betas 0.9/0.95, eps 1e-8, per-group weight decay 0.1 or
   0) for 4 steps with a per-step learning rate and torch.nn.utils.clip_grad_norm_
   (max_norm 1.0) on float32-rounded random parameters and gradients, written to
   tests/data/train/adamw_ref.lmfx: "p0.K" initial parameters, "g<step>.K" gradients,
   "lr" [4], "wd" [3], "norm" [4] (pre-clip global norms), "p<step>.K" parameters
   after each step.
Run from the repository root: /usr/bin/python3 scripts/gen_train_refs.py [--only MODEL ...]
(Debian's python3-torch 1.13 and numpy are enough; --only writes just those models'
gradient references, not the AdamW one.) Sliding windows follow transformers 5's
per-layer rule (layer_window below).
"""
import json
import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_fixtures_io_rope  # noqa: E402
import lmfx  # noqa: E402
import make_random_model  # noqa: E402

ROOT = os.path.join(HERE, "..")
MODELS = ["llama_gqa2_f32", "llama3_scaled_bf16", "llama_linear_f16", "mistral_mha_f16",
          "qwen2_bias_sharded", "qwen2_mqa_yarn", "qwen3_headdim", "mistral_window_f32", "qwen2_window_bf16"]
B, T, SAMPLES = 2, 8, 48
torch.set_default_dtype(torch.float64)


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def rms(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, inv_freq, attn):
    """x [B, T, H, D]; rotate_half pairs (i, i + D/2), angles t * inv_freq, cos/sin scaled by attn."""
    t = torch.arange(x.shape[1], dtype=torch.float64)
    ang = torch.outer(t, inv_freq)                     # [T, D/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :] * attn
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :] * attn
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def linear(x, p, name):
    y = x @ p[name + ".weight"].T
    return y + p[name + ".bias"] if name + ".bias" in p else y


def layer_window(cfg, n):
    """The sliding window of layer n as transformers 5 derives it (0: full attention):
    layer_types when given; else qwen2's use_sliding_window from layer max_window_layers
    on; else mistral's sliding_window on every layer."""
    w = cfg.get("sliding_window") or 0
    if "layer_types" in cfg:
        return w if cfg["layer_types"][n] == "sliding_attention" else 0
    if cfg.get("model_type") in ("qwen2", "qwen3"):
        return w if cfg.get("use_sliding_window") and n >= cfg.get("max_window_layers", 0) else 0
    return w


def forward_loss(cfg, p, ids, targets, inv_freq, attn):
    eps, hd = cfg["rms_norm_eps"], head_dim(cfg)
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    x = p["model.embed_tokens.weight"][ids]            # [B, T, H]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    for n in range(cfg["num_hidden_layers"]):
        w = layer_window(cfg, n)                       # query i sees keys i - w < j <= i
        mask = (j <= i) & ((i - j < w) if w else torch.ones(T, T, dtype=torch.bool))
        pre = f"model.layers.{n}."
        h = rms(x, p[pre + "input_layernorm.weight"], eps)
        q = linear(h, p, pre + "self_attn.q_proj").view(B, T, hq, hd)
        k = linear(h, p, pre + "self_attn.k_proj").view(B, T, hkv, hd)
        v = linear(h, p, pre + "self_attn.v_proj").view(B, T, hkv, hd)
        if pre + "self_attn.q_norm.weight" in p:
            q = rms(q, p[pre + "self_attn.q_norm.weight"], eps)
            k = rms(k, p[pre + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, inv_freq, attn), rope(k, inv_freq, attn)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        s = s.masked_fill(~mask, float("-inf"))
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, hq * hd)
        x = x + linear(a, p, pre + "self_attn.o_proj")
        h = rms(x, p[pre + "post_attention_layernorm.weight"], eps)
        g = torch.nn.functional.silu(linear(h, p, pre + "mlp.gate_proj")) * linear(h, p, pre + "mlp.up_proj")
        x = x + linear(g, p, pre + "mlp.down_proj")
    h = rms(x, p["model.norm.weight"], eps)
    head = p["lm_head.weight"] if "lm_head.weight" in p else p["model.embed_tokens.weight"]
    logits = h @ head.T
    return torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), ignore_index=-100)


def model_refs(name):
    model_dir = os.path.join(ROOT, "tests", "data", "models", name)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    weights = make_random_model.read_checkpoint(model_dir)
    p = {k: torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True) for k, (_, _, a) in weights.items()}
    if cfg.get("tie_word_embeddings"):
        p.pop("lm_head.weight", None)
    inv, attn = gen_fixtures_io_rope.reference(cfg)
    inv_freq = torch.tensor(np.asarray(inv, dtype=np.float32).astype(np.float64))
    rng = np.random.default_rng(sum(map(ord, name)))
    ids = rng.integers(0, cfg["vocab_size"], size=(B, T))
    targets = np.concatenate([ids[:, 1:], rng.integers(0, cfg["vocab_size"], size=(B, 1))], axis=1)
    targets[0, 3] = targets[1, 7] = -100
    loss = forward_loss(cfg, p, torch.tensor(ids), torch.tensor(targets), inv_freq, float(attn))
    loss.backward()
    out = {"ids": ids, "targets": targets, "loss": np.float64(loss.item())}
    for k, t in p.items():
        g = t.grad.numpy().reshape(-1)
        n = g.size
        idx = np.unique(np.concatenate([[0, n - 1], rng.integers(0, n, size=SAMPLES)]))[:SAMPLES] if n > SAMPLES \
            else np.arange(n)
        out["s." + k] = np.float64((g * g).sum())
        out["i." + k] = idx.astype(np.int64)
        out["v." + k] = g[idx]
    path = os.path.join(ROOT, "tests", "data", "train", "grad_refs", name + ".lmfx")
    lmfx.write(path, out)
    print(f"{name}: loss {loss.item():.6f}, {len(p)} tensors -> {os.path.relpath(path, ROOT)}")


def adamw_refs():
    rng = np.random.default_rng(20240501)
    shapes, wds, lrs = [(5,), (3, 4), (7,)], [0.1, 0.1, 0.0], [0.01, 0.02, 0.015, 0.005]
    out = {"lr": np.array(lrs), "wd": np.array(wds)}
    params = []
    for k, s in enumerate(shapes):
        a = rng.standard_normal(s).astype(np.float32).astype(np.float64)
        out[f"p0.{k}"] = a
        params.append(torch.tensor(a, requires_grad=True))
    opt = torch.optim.AdamW([{"params": [t], "weight_decay": w} for t, w in zip(params, wds)],
                            lr=lrs[0], betas=(0.9, 0.95), eps=1e-8)
    norms = []
    for step, lr in enumerate(lrs, 1):
        for k, t in enumerate(params):
            g = (rng.standard_normal(t.shape) * 0.8).astype(np.float32).astype(np.float64)
            out[f"g{step}.{k}"] = g
            t.grad = torch.tensor(g)
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)))
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        for k, t in enumerate(params):
            out[f"p{step}.{k}"] = t.detach().numpy().copy()
    out["norm"] = np.array(norms)
    path = os.path.join(ROOT, "tests", "data", "train", "adamw_ref.lmfx")
    lmfx.write(path, out)
    print(f"adamw: 4 steps, pre-clip norms {np.round(norms, 4).tolist()} -> {os.path.relpath(path, ROOT)}")


def main():
    only = sys.argv[sys.argv.index("--only") + 1:] if "--only" in sys.argv else None
    os.makedirs(os.path.join(ROOT, "tests", "data", "train", "grad_refs"), exist_ok=True)
    print(f"torch {torch.__version__}, numpy {np.__version__}, float64 on the CPU")
    for name in only or MODELS:
        model_refs(name)
    if not only:
        adamw_refs()


if __name__ == "__main__":
    main()
