#!/usr/bin/env python3
"""Reference token ids from Hugging Face `tokenizers` for loom's tokenizer tests.

Usage: gen_tokenizer_refs.py OUTDIR
Reads tests/data/tokenizer/corpus.jsonl and third_party/tokenizers/<name>/tokenizer.json
(scripts/fetch_tokenizers.sh) and writes OUTDIR/<name>.refs.jsonl with one object per
corpus line: {"ids": [...], "decoded": "..."} where ids = encode(text,
add_special_tokens=False) and decoded = decode(ids, skip_special_tokens=False). Also
writes OUTDIR/versions.json and OUTDIR/hf_encode_speed.json (single-thread batch-free
encode throughput over the corpus repeated, for the tokenizer benchmark's comparison).
Runs where `tokenizers` is installed (the GPU machine); commit the outputs under
tests/data/tokenizer/.
"""
import json
import os
import sys
import time

import tokenizers
from tokenizers import Tokenizer

NAMES = ["qwen3", "llama3", "deepseek_v3"]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "tests/data/tokenizer/corpus.jsonl"), encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f]
    speed = {}
    for name in NAMES:
        tok = Tokenizer.from_file(os.path.join(root, "third_party/tokenizers", name, "tokenizer.json"))
        with open(os.path.join(out, f"{name}.refs.jsonl"), "w", encoding="utf-8") as f:
            for text in corpus:
                ids = tok.encode(text, add_special_tokens=False).ids
                dec = tok.decode(ids, skip_special_tokens=False)
                f.write(json.dumps({"ids": ids, "decoded": dec}, ensure_ascii=True) + "\n")
        big = "\n".join(corpus) * 200
        t0 = time.perf_counter()
        n = len(tok.encode(big, add_special_tokens=False).ids)
        dt = time.perf_counter() - t0
        mb = len(big.encode("utf-8")) / 1e6
        speed[name] = {"mb": mb, "seconds": dt, "mb_per_s": mb / dt, "tokens": n}
    with open(os.path.join(out, "hf_encode_speed.json"), "w") as f:
        json.dump(speed, f, indent=1)
    with open(os.path.join(out, "versions.json"), "w") as f:
        json.dump({"tokenizers": tokenizers.__version__}, f)
    print(json.dumps(speed))


if __name__ == "__main__":
    main()
