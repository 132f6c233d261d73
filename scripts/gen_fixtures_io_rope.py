#!/usr/bin/python3
"""Writes the RoPE fixtures read by tests/io/test_io_config.c:

  tests/data/io/rope/<case>.json  a config.json for each case (the single source of the
                                  case's parameters: the C test parses these files);
  tests/data/io/rope_ref.lmfx     per case "<case>.inv_freq" [head_dim/2] and
                                  "<case>.attn" (the cos/sin attention scaling), float64.

The frequencies are re-derived here with numpy in float64 following the formulas of
transformers' modeling_rope_utils (no transformers import):
  default  inv_freq[i] = 1 / theta^(2i/d)                (_compute_default_rope_parameters)
  linear   default / factor                              (_compute_linear_scaling_rope_parameters)
  llama3   wavelen = 2 pi / inv_freq; keep where wavelen < orig/high_freq_factor, divide by
           factor where wavelen > orig/low_freq_factor, else blend with
           smooth = (orig/wavelen - low)/(high - low)    (_compute_llama3_parameters)
  yarn     ramp between the correction dims of beta_fast and beta_slow over
           original_max_position_embeddings (or max_position_embeddings); the explicit
           factor is kept; attention = attention_factor, or
           get_mscale(factor, mscale)/get_mscale(factor, mscale_all_dim) when both are set,
           or get_mscale(factor)                         (_compute_yarn_parameters)
Run from the repository root: /usr/bin/python3 scripts/gen_fixtures_io_rope.py
"""
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lmfx  # noqa: E402


def base_config(arch, hidden, heads, **extra):
    cfg = {
        "architectures": [arch + "ForCausalLM"],
        "vocab_size": 64,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
    }
    cfg.update(extra)
    return cfg


CASES = {
    "llama_default": base_config("Llama", 64, 4, rope_theta=10000.0),
    "qwen3_theta1e6": base_config("Qwen3", 256, 4, head_dim=128, rope_theta=1000000.0),
    "llama_linear": base_config("Llama", 128, 4, rope_theta=10000.0,
                                rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "llama31": base_config("Llama", 4096, 32, rope_theta=500000.0, max_position_embeddings=131072,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192}),
    "llama3_wide_band": base_config("Llama", 256, 4, rope_theta=10000.0, max_position_embeddings=4096,
                                    rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 32.0,
                                                  "original_max_position_embeddings": 256}),
    "qwen2_yarn": base_config("Qwen2", 3584, 28, rope_theta=1000000.0, max_position_embeddings=32768,
                              rope_scaling={"type": "yarn", "factor": 4.0,
                                            "original_max_position_embeddings": 32768}),
    "mistral_yarn_mscale": base_config("Mistral", 256, 4, rope_theta=10000.0, max_position_embeddings=163840,
                                       rope_scaling={"rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
                                                     "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1,
                                                     "original_max_position_embeddings": 4096}),
    "llama_yarn_explicit": base_config("Llama", 128, 4, rope_theta=20000.0, max_position_embeddings=8192,
                                       rope_scaling={"rope_type": "yarn", "factor": 3.0, "attention_factor": 0.8,
                                                     "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False}),
    "qwen3_rope_parameters": base_config("Qwen3", 96, 2, head_dim=48, max_position_embeddings=4096,
                                         rope_parameters={"rope_type": "yarn", "factor": 2.0,
                                                          "rope_theta": 50000.0,
                                                          "original_max_position_embeddings": 2048}),
}


def head_dim(cfg):
    if "head_dim" in cfg:
        return cfg["head_dim"]
    return cfg["hidden_size"] // cfg["num_attention_heads"]


def default_inv_freq(theta, d):
    return 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)


def llama3(inv, rs):
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    orig = rs["original_max_position_embeddings"]
    low_wavelen, high_wavelen = orig / low, orig / high
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled)


def yarn(cfg, theta, d, rs):
    factor = rs["factor"]
    orig = rs.get("original_max_position_embeddings") or cfg.get("max_position_embeddings")

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = rs.get("attention_factor")
    if attn is None:
        if rs.get("mscale") and rs.get("mscale_all_dim"):
            attn = get_mscale(factor, rs["mscale"]) / get_mscale(factor, rs["mscale_all_dim"])
        else:
            attn = get_mscale(factor)
    beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def correction_dim(rotations):
        return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    pos = theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    inv = 1 / (factor * pos) * (1 - extrapolation) + 1 / pos * extrapolation
    return inv, attn


def reference(cfg):
    params = cfg.get("rope_parameters")
    rs = params if params is not None else cfg.get("rope_scaling")
    theta = (params or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    d = head_dim(cfg)
    kind = "default" if rs is None else rs.get("rope_type", rs.get("type"))
    inv = default_inv_freq(theta, d)
    if kind == "linear":
        return inv / rs["factor"], 1.0
    if kind == "llama3":
        return llama3(inv, rs), 1.0
    if kind == "yarn":
        return yarn(cfg, theta, d, rs)
    return inv, 1.0


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "io")
    os.makedirs(os.path.join(root, "rope"), exist_ok=True)
    tensors = {}
    for name, cfg in CASES.items():
        with open(os.path.join(root, "rope", name + ".json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")
        inv, attn = reference(cfg)
        tensors[name + ".inv_freq"] = inv
        tensors[name + ".attn"] = np.float64(attn)
    lmfx.write(os.path.join(root, "rope_ref.lmfx"), tensors)


if __name__ == "__main__":
    main()
