#!/usr/bin/env python3
"""Writes a Hugging Face Llama/Qwen2 checkpoint directory (bf16 safetensors, one file)
as a bf16 GGUF file, so llama.cpp can run the very weights loom runs in a side-by-side
benchmark (bench/NOTES.md, "llama.cpp on this CPU").

Uses the gguf Python package that ships in llama.cpp's source tree (gguf-py), passed
with --gguf-py; NumPy (Debian python3-numpy) reads the safetensors. The tokenizer
(vocabulary and merges) comes from a Hugging Face tokenizer.json (--tokenizer); ids the
tokenizer does not define, up to the model's vocab_size, become unused placeholder
tokens. Qwen2 keeps the checkpoint's rotate-half RoPE layout (llama.cpp's NEOX rope),
so no weight is permuted; Llama checkpoints are written as the llama architecture with
q/k rows permuted to the interleaved RoPE layout llama.cpp's llama graph expects.

Usage: /usr/bin/python3 scripts/gguf_from_hf.py --model DIR --tokenizer tokenizer.json
           --gguf-py LLAMA_CPP/gguf-py -o model-bf16.gguf
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    """name -> (dtype string, shape, uint8 buffer view) of a single safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[a:b])
    return out


def bf16_array(entry):
    dtype, shape, buf = entry
    if dtype != "BF16":
        sys.exit(f"gguf_from_hf: tensor dtype {dtype}; only BF16 checkpoints are written")
    return np.frombuffer(buf, dtype=np.uint16).reshape(shape)


def f32_from_bf16(a):
    return (a.astype(np.uint32) << 16).view(np.float32)


def permute_rows(w, heads):
    """Rotate-half row order of each head -> interleaved pairs (llama.cpp's llama rope)."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py directory")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    sys.path.insert(0, a.gguf_py)
    import gguf  # noqa: E402 (from the llama.cpp tree given above)

    cfg = json.load(open(os.path.join(a.model, "config.json")))
    kind = cfg["model_type"]
    if kind not in ("qwen2", "llama"):
        sys.exit(f"gguf_from_hf: model_type {kind}; qwen2 and llama are supported")
    st = read_safetensors(os.path.join(a.model, "model.safetensors"))
    V, H, L = cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]
    Hq, Hkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])

    w = gguf.GGUFWriter(a.out, kind)
    w.add_name(os.path.basename(os.path.normpath(a.model)))
    w.add_block_count(L)
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(H)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(Hq)
    w.add_head_count_kv(Hkv)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)

    tok = json.load(open(a.tokenizer, encoding="utf-8"))
    names = ["[PAD%d]" % i for i in range(V)]
    types = [gguf.TokenType.UNUSED] * V
    for t, i in tok["model"]["vocab"].items():
        if i < V:
            names[i], types[i] = t, gguf.TokenType.NORMAL
    for t in tok.get("added_tokens", []):
        if t["id"] < V:
            names[t["id"]] = t["content"]
            types[t["id"]] = gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if kind == "qwen2" else "llama-bpe")
    w.add_token_list(names)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = cfg.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    w.add_eos_token_id(int(eos if eos is not None else 0))
    if cfg.get("bos_token_id") is not None:
        w.add_bos_token_id(int(cfg["bos_token_id"]))

    BF16 = gguf.GGMLQuantizationType.BF16

    def put(name, hf, permute_heads=0, as_f32=False):
        x = bf16_array(st[hf])
        if permute_heads:
            x = permute_rows(x, permute_heads)
        if as_f32:
            w.add_tensor(name, np.ascontiguousarray(f32_from_bf16(x)))
        else:
            w.add_tensor(name, np.ascontiguousarray(x), raw_dtype=BF16)

    put("token_embd.weight", "model.embed_tokens.weight")
    put("output_norm.weight", "model.norm.weight", as_f32=True)
    if "lm_head.weight" in st and not cfg.get("tie_word_embeddings", False):
        put("output.weight", "lm_head.weight")
    perm = kind == "llama"
    for i in range(L):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        put(b + "attn_norm.weight", p + "input_layernorm.weight", as_f32=True)
        put(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", as_f32=True)
        put(b + "attn_q.weight", p + "self_attn.q_proj.weight", Hq if perm else 0)
        put(b + "attn_k.weight", p + "self_attn.k_proj.weight", Hkv if perm else 0)
        put(b + "attn_v.weight", p + "self_attn.v_proj.weight")
        put(b + "attn_output.weight", p + "self_attn.o_proj.weight")
        for proj in ("q", "k", "v"):
            if p + f"self_attn.{proj}_proj.bias" in st:
                put(b + f"attn_{proj}.bias", p + f"self_attn.{proj}_proj.bias", as_f32=True)
        put(b + "ffn_gate.weight", p + "mlp.gate_proj.weight")
        put(b + "ffn_up.weight", p + "mlp.up_proj.weight")
        put(b + "ffn_down.weight", p + "mlp.down_proj.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{a.out}: {kind}, {L} layers, vocab {V}, {len(merges)} merges", file=sys.stderr)


if __name__ == "__main__":
    main()
