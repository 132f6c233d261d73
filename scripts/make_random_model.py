#!/usr/bin/python3
"""Write a small randomly initialised Hugging Face causal-LM directory (llama, mistral, qwen2, qwen3).

The directory is what transformers' AutoModelForCausalLM.from_pretrained reads: config.json in the
classic Hub format (rope_theta + rope_scaling, torch_dtype), generation_config.json and
model.safetensors (or --shards N files plus model.safetensors.index.json). Tensor names and shapes
are exactly Hugging Face's. Only python3 + numpy are needed; the safetensors writer is our own:
8-byte little-endian header length, a JSON header padded with spaces to a multiple of 8 bytes,
then every tensor's bytes back to back (all tensors of a file share one dtype, so each stays
aligned to its element size). BF16 is f32 rounded to nearest even through uint32 bit arithmetic.
The weights are scaled so a random model's logits are well spread (std of a few units): greedy
decisions on it are clear, not near-ties. The same arguments and seed give the same bytes.
"""
import argparse
import json
import math
import os
import shutil
import sys

import numpy as np

ARCHS = {
    "llama": {"class": "LlamaForCausalLM", "theta": 10000.0, "eps": 1e-5},
    "mistral": {"class": "MistralForCausalLM", "theta": 1000000.0, "eps": 1e-5},
    "qwen2": {"class": "Qwen2ForCausalLM", "theta": 1000000.0, "eps": 1e-6},
    "qwen3": {"class": "Qwen3ForCausalLM", "theta": 1000000.0, "eps": 1e-6},
}
DTYPES = {"f32": ("F32", "float32"), "bf16": ("BF16", "bfloat16"), "f16": ("F16", "float16")}
ROPE_KEYS = {
    "linear": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings"},
}
DEFAULT_MAX_POS = 2048
VOCAB_MULTIPLE = 64


def f32_to_bf16_bits(a):
    """float32 array -> uint16 bfloat16 bit patterns, rounded to nearest, ties to even.

    Adds 0x7FFF plus the lowest kept bit before truncating the low 16 bits; NaNs are kept quiet
    (a payload that would round to infinity is forced to a quiet NaN instead)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    out = rounded.astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        out[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out


def bf16_bits_to_f32(b):
    """uint16 bfloat16 bit patterns -> float32 (exact)."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def encode(a, st_dtype):
    """float array -> its little-endian bytes in safetensors dtype `st_dtype`."""
    if st_dtype == "F32":
        return np.ascontiguousarray(a, dtype="<f4").tobytes()
    if st_dtype == "F16":
        return np.ascontiguousarray(a, dtype="<f2").tobytes()
    if st_dtype == "BF16":
        return f32_to_bf16_bits(np.asarray(a, dtype=np.float32)).astype("<u2").tobytes()
    raise ValueError(f"unknown safetensors dtype {st_dtype}")


def decode(raw, st_dtype, shape):
    """Bytes of one tensor -> float32 array of `shape`."""
    if st_dtype == "F32":
        flat = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    elif st_dtype == "F16":
        flat = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    elif st_dtype == "BF16":
        flat = bf16_bits_to_f32(np.frombuffer(raw, dtype="<u2"))
    else:
        raise ValueError(f"unsupported safetensors dtype {st_dtype}")
    return flat.reshape(shape)


def write_safetensors(path, tensors, st_dtype):
    """tensors: list of (name, float array). Data follow in list order; header keys are sorted."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors:
        raw = encode(a, st_dtype)
        header[name] = {"dtype": st_dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for raw in blobs:
            f.write(raw)
    return offset


def read_safetensors(path):
    """-> (dict name -> (dtype, shape, float32 array), metadata). Checks the layout strictly."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = data[8 + n:]
    meta = header.pop("__metadata__", {})
    spans, out = [], {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        count = int(np.prod(info["shape"], dtype=np.int64))
        size = {"F32": 4, "F16": 2, "BF16": 2}[info["dtype"]]
        if end - begin != count * size:
            raise ValueError(f"{path}: tensor {name!r} spans {end - begin} bytes, shape needs {count * size}")
        spans.append((begin, end, name))
        out[name] = (info["dtype"], tuple(info["shape"]), decode(body[begin:end], info["dtype"], info["shape"]))
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            raise ValueError(f"{path}: tensor {name!r} starts at {begin}, expected {pos} (holes or overlap)")
        pos = end
    if pos != len(body):
        raise ValueError(f"{path}: data is {len(body)} bytes, tensors cover {pos}")
    return out, meta


def read_checkpoint(model_dir):
    """All tensors of a model directory, single-file or sharded -> dict name -> (dtype, shape, array)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(model_dir, "model.safetensors"))[0]
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    out = {}
    for shard in sorted(set(weight_map.values())):
        tensors, _ = read_safetensors(os.path.join(model_dir, shard))
        for name, value in tensors.items():
            if weight_map.get(name) != shard:
                raise ValueError(f"{shard}: tensor {name!r} is not mapped to this shard by the index")
            out[name] = value
    if set(out) != set(weight_map):
        raise ValueError(f"{index}: tensors {sorted(set(weight_map) - set(out))} are missing from the shards")
    return out


def tokenizer_ids(path):
    """Reads a tokenizer.json (and tokenizer_config.json beside it) -> (max id, {content: id})."""
    with open(path, encoding="utf-8") as f:
        tok = json.load(f)
    specials = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    vocab = tok.get("model", {}).get("vocab", {})
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
    ids += list(specials.values())
    side = os.path.join(os.path.dirname(path), "tokenizer_config.json")
    if os.path.exists(side):
        with open(side, encoding="utf-8") as f:
            for key, entry in json.load(f).get("added_tokens_decoder", {}).items():
                specials.setdefault(entry["content"], int(key))
                ids.append(int(key))
    if not ids:
        raise ValueError(f"{path}: no token ids found")
    return max(ids), specials


def special_ids(specials):
    """Recognised families -> (bos, config.json eos, generation_config.json eos); None if unknown.
    Each eos is an int or, where the family's real checkpoints list several, a list."""
    def have(*names):
        return all(n in specials for n in names)
    if have("<|begin_of_text|>", "<|end_of_text|>"):
        ends = [specials[n] for n in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>") if n in specials]
        return specials["<|begin_of_text|>"], ends if len(ends) > 1 else ends[0], ends
    if have("<|endoftext|>"):
        ends = [specials[n] for n in ("<|im_end|>", "<|endoftext|>") if n in specials]
        return specials["<|endoftext|>"], ends[0], ends if len(ends) > 1 else ends[0]
    bos, eos = "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"
    if have(bos, eos):
        return specials[bos], specials[eos], specials[eos]
    return None


def parse_rope_scaling(text):
    """--rope-scaling JSON -> dict with rope_type and the keys that type requires (or None)."""
    if text is None or text.strip() in ("", "null", "none"):
        return None
    rs = json.loads(text)
    kind = rs.get("rope_type", rs.get("type"))
    if kind not in ROPE_KEYS:
        raise SystemExit(f"--rope-scaling: rope_type must be one of {sorted(ROPE_KEYS)}, got {kind!r}")
    missing = ROPE_KEYS[kind] - set(rs)
    if missing:
        raise SystemExit(f"--rope-scaling: rope_type {kind} needs {sorted(missing)}")
    rs.pop("type", None)
    rs["rope_type"] = kind
    for key in ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "attention_factor"):
        if key in rs:
            rs[key] = float(rs[key])
    if "original_max_position_embeddings" in rs:
        rs["original_max_position_embeddings"] = int(rs["original_max_position_embeddings"])
    return dict(sorted(rs.items()))


def build_config(a):
    """Arguments -> config.json dict, in the field layout of the architecture's Hub checkpoints."""
    arch = ARCHS[a.arch]
    head_dim = a.head_dim or a.hidden // a.heads
    rope = parse_rope_scaling(a.rope_scaling)
    max_pos = a.max_pos
    if rope and rope["rope_type"] == "yarn":
        implied = int(round(rope["factor"] * rope["original_max_position_embeddings"]))
        if max_pos is not None and max_pos != implied:
            raise SystemExit(f"--max-pos {max_pos}: yarn needs factor * original_max_position_embeddings = "
                             f"{implied} (transformers derives the factor from that ratio)")
        max_pos = implied
    if max_pos is None:
        max_pos = DEFAULT_MAX_POS
        if rope and "original_max_position_embeddings" in rope:
            max_pos = max(max_pos, int(rope["factor"] * rope["original_max_position_embeddings"]))
    cfg = {
        "architectures": [arch["class"]],
        "model_type": a.arch,
        "vocab_size": a.vocab,
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_pos,
        "initializer_range": 0.02,
        "rms_norm_eps": a.rms_eps if a.rms_eps is not None else arch["eps"],
        "rope_theta": a.rope_theta if a.rope_theta is not None else arch["theta"],
        "rope_scaling": rope,
        "tie_word_embeddings": bool(a.tied),
        "torch_dtype": DTYPES[a.dtype][1],
        "use_cache": True,
        "attention_dropout": 0.0,
        "bos_token_id": a.bos,
        "eos_token_id": a.eos,
    }
    if a.arch != "qwen2":
        cfg["head_dim"] = head_dim
    if a.arch == "llama":
        cfg.update(attention_bias=bool(a.attention_bias), mlp_bias=False, pretraining_tp=1)
    window = a.sliding_window
    if a.arch == "mistral":
        cfg["sliding_window"] = window  # every layer when set
    if a.arch == "qwen2":
        cfg.update(use_sliding_window=bool(window), sliding_window=window or max_pos,
                   max_window_layers=a.layers if window is None else a.window_layers)
    if a.arch == "qwen3":
        cfg.update(attention_bias=False, use_sliding_window=bool(window), sliding_window=window,
                   max_window_layers=a.layers if window is None else a.window_layers)
    return dict(sorted(cfg.items()))


def tensor_specs(cfg):
    """-> list of (name, shape, kind) in Hugging Face order; kind picks the initialisation."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    qkv_bias = cfg["model_type"] == "qwen2" or cfg.get("attention_bias", False)
    o_bias = cfg["model_type"] == "llama" and cfg.get("attention_bias", False)
    specs = [("model.embed_tokens.weight", (v, h), "embed")]
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        specs.append((p + "input_layernorm.weight", (h,), "norm"))
        for proj, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            specs.append((p + f"self_attn.{proj}.weight", (rows, h), "proj"))
            if qkv_bias:
                specs.append((p + f"self_attn.{proj}.bias", (rows,), "bias"))
        specs.append((p + "self_attn.o_proj.weight", (h, q), "proj"))
        if o_bias:
            specs.append((p + "self_attn.o_proj.bias", (h,), "bias"))
        if cfg["model_type"] == "qwen3":
            specs.append((p + "self_attn.q_norm.weight", (hd,), "norm"))
            specs.append((p + "self_attn.k_norm.weight", (hd,), "norm"))
        specs.append((p + "post_attention_layernorm.weight", (h,), "norm"))
        specs.append((p + "mlp.gate_proj.weight", (i, h), "proj"))
        specs.append((p + "mlp.up_proj.weight", (i, h), "proj"))
        specs.append((p + "mlp.down_proj.weight", (h, i), "proj"))
    specs.append(("model.norm.weight", (h,), "final_norm"))
    if not cfg["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (v, h), "head"))
    return specs


def init_weights(specs, rng, std):
    """Random float32 tensors. Embeddings N(0, std^2); a projection with fan-in F N(0, std^2/F), so
    activations stay O(1) through the residual stream; untied lm_head N(0, (4 std)^2/H), so logits
    have a std of about 4; biases N(0, (0.3 std)^2); norm weights 1 + N(0, 0.1^2), except the final
    norm's, N(0, 1): with a mean of 1 a tied head scores the current token's own embedding at about
    H against sqrt(H) for the others, and greedy decoding would only ever repeat its last token."""
    out = []
    for name, shape, kind in specs:
        z = rng.standard_normal(shape)
        if kind == "embed":
            w = z * std
        elif kind == "proj":
            w = z * std / math.sqrt(shape[1])
        elif kind == "head":
            w = z * 4.0 * std / math.sqrt(shape[1])
        elif kind == "bias":
            w = z * 0.3 * std
        elif kind == "final_norm":
            w = z
        else:
            w = 1.0 + 0.1 * z
        out.append((name, w.astype(np.float32)))
    return out


def split_shards(tensors, n, itemsize):
    """Contiguous split into n non-empty groups of roughly equal bytes, in tensor order."""
    if n > len(tensors):
        raise SystemExit(f"--shards {n}: only {len(tensors)} tensors to split")
    sizes = [t.size * itemsize for _, t in tensors]
    total, groups, acc = sum(sizes), [[]], 0
    for idx, item in enumerate(tensors):
        left, to_open = len(tensors) - idx, n - len(groups)
        # Start the next group once this one reaches its share, or when every remaining
        # tensor is needed to keep the remaining groups non-empty.
        if groups[-1] and to_open and (left <= to_open or acc + sizes[idx] / 2 > total * len(groups) / n):
            groups.append([])
        groups[-1].append(item)
        acc += sizes[idx]
    return groups


def write_weights(out, tensors, st_dtype, shards):
    """Writes model.safetensors or the shards + index; -> (file names, data bytes)."""
    for old in os.listdir(out):
        if old.startswith("model") and (old.endswith(".safetensors") or old.endswith(".safetensors.index.json")):
            os.remove(os.path.join(out, old))
    itemsize = 4 if st_dtype == "F32" else 2
    if shards <= 1:
        total = write_safetensors(os.path.join(out, "model.safetensors"), tensors, st_dtype)
        return ["model.safetensors"], total
    names, weight_map, total = [], {}, 0
    for k, group in enumerate(split_shards(tensors, shards, itemsize), 1):
        fname = f"model-{k:05d}-of-{shards:05d}.safetensors"
        total += write_safetensors(os.path.join(out, fname), group, st_dtype)
        names.append(fname)
        weight_map.update({name: fname for name, _ in group})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    write_json(os.path.join(out, "model.safetensors.index.json"), index)
    return names + ["model.safetensors.index.json"], total


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def apply_tokenizer(a):
    """--tokenizer: sizes the vocabulary to the tokenizer's ids and takes bos/eos from it."""
    gen_eos = None
    if a.tokenizer:
        max_id, specials = tokenizer_ids(a.tokenizer)
        need = -(-(max_id + 1) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
        if a.vocab is not None and a.vocab < max_id + 1:
            raise SystemExit(f"--vocab {a.vocab} is smaller than the tokenizer's largest id + 1 ({max_id + 1})")
        a.vocab = a.vocab or need
        ids = special_ids(specials)
        if ids:
            a.bos, a.eos, gen_eos = ids
    a.vocab = a.vocab or 256
    if a.bos is None:
        a.bos, a.eos = 1, 2
    return gen_eos if gen_eos is not None else a.eos


def check_args(a):
    if a.heads % a.kv_heads:
        raise SystemExit(f"--heads {a.heads} is not a multiple of --kv-heads {a.kv_heads}")
    if a.head_dim is None and a.hidden % a.heads:
        raise SystemExit(f"--hidden {a.hidden} is not a multiple of --heads {a.heads}; give --head-dim")
    hd = a.head_dim or a.hidden // a.heads
    if hd % 2:
        raise SystemExit(f"head_dim {hd} must be even for rotary embeddings")
    if a.arch == "qwen2" and hd != a.hidden // a.heads:
        raise SystemExit("qwen2 checkpoints have no head_dim field: --head-dim must equal hidden/heads")
    if a.attention_bias and a.arch != "llama":
        raise SystemExit("--attention-bias is a llama option (qwen2 always has q/k/v biases)")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", choices=sorted(ARCHS), default="llama")
    p.add_argument("--vocab", type=int, help="vocabulary size (default 256, or the tokenizer's)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--intermediate", type=int, help="MLP width (default 2*hidden)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, help="key/value heads (default: --heads)")
    p.add_argument("--head-dim", type=int, help="per-head width (default hidden/heads)")
    p.add_argument("--tied", action="store_true", help="tie lm_head to the embedding (no lm_head.weight)")
    p.add_argument("--attention-bias", action="store_true", help="llama: q/k/v/o projection biases")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="f32", help="storage dtype")
    p.add_argument("--rope-theta", type=float, help="rotary base (default per architecture)")
    p.add_argument("--rope-scaling", help='JSON, e.g. {"rope_type":"linear","factor":2}')
    p.add_argument("--max-pos", type=int, help="max_position_embeddings (yarn: factor*original)")
    p.add_argument("--rms-eps", type=float, help="rms_norm_eps (default per architecture)")
    p.add_argument("--sliding-window", type=int, help="attention window in tokens (mistral: every layer; "
                   "qwen2/qwen3: layers from --window-layers on)")
    p.add_argument("--window-layers", type=int, default=0,
                   help="qwen2/qwen3 max_window_layers: the first layer index that uses the window (default 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init-std", type=float, default=1.0, help="weight scale, see init_weights")
    p.add_argument("--shards", type=int, default=1, help="number of safetensors files")
    p.add_argument("--tokenizer", help="tokenizer.json to copy in (sets vocab, bos, eos)")
    p.add_argument("--out", required=True, help="model directory to write")
    a = p.parse_args(argv)
    a.intermediate = a.intermediate or 2 * a.hidden
    a.kv_heads = a.kv_heads or a.heads
    a.bos = a.eos = None
    for name in ("hidden", "intermediate", "layers", "heads", "kv_heads", "shards"):
        if getattr(a, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be positive")
    if a.sliding_window is not None and (a.sliding_window < 1 or a.arch == "llama"):
        raise SystemExit("--sliding-window: a positive window, for mistral, qwen2 or qwen3")
    if not 0 <= a.window_layers <= a.layers:
        raise SystemExit("--window-layers must lie in [0, --layers]")
    check_args(a)
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    gen_eos = apply_tokenizer(a)
    cfg = build_config(a)
    tensors = init_weights(tensor_specs(cfg), np.random.default_rng(a.seed), a.init_std)
    os.makedirs(a.out, exist_ok=True)
    write_json(os.path.join(a.out, "config.json"), cfg)
    write_json(os.path.join(a.out, "generation_config.json"),
               {"bos_token_id": cfg["bos_token_id"], "do_sample": False, "eos_token_id": gen_eos})
    files, nbytes = write_weights(a.out, tensors, DTYPES[a.dtype][0], a.shards)
    files = ["config.json", "generation_config.json"] + files
    if a.tokenizer:
        src = os.path.dirname(os.path.abspath(a.tokenizer))
        for extra in ("tokenizer.json", "tokenizer_config.json"):
            path = a.tokenizer if extra == "tokenizer.json" else os.path.join(src, extra)
            if os.path.exists(path):
                shutil.copyfile(path, os.path.join(a.out, extra))
                files.append(extra)
    params = sum(t.size for _, t in tensors)
    hd = cfg.get("head_dim") or a.hidden // a.heads
    rope = cfg["rope_scaling"]["rope_type"] if cfg["rope_scaling"] else "default"
    print(f"{a.out}: {a.arch} V={a.vocab} H={a.hidden} I={a.intermediate} L={a.layers} "
          f"heads={a.heads}/{a.kv_heads} hd={hd} {a.dtype} {'tied' if a.tied else 'untied'} rope={rope} "
          f"params={params} bytes={nbytes} files={','.join(files)}")


if __name__ == "__main__":
    main()
