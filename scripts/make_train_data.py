#!/usr/bin/python3
"""Writes the small byte-level BPE tokenizer that loom's CPU training test uses:
tests/data/train/tokenizer.json, learned from tests/data/train/corpus.txt (prose written
for the project, public domain) with a tiny BPE trainer:

  * pieces: the GPT-2 pre-tokenizer split (approximated here with Python's re; the
    tokenizer file itself asks for ByteLevel(use_regex=true), the exact GPT-2 regex),
    each piece mapped to the GPT-2 byte-to-unicode alphabet;
  * MERGES times: merge the most frequent adjacent pair (ties: the smallest pair in
    string order), counting pairs weighted by piece frequency.

Vocabulary: the 256 byte symbols as ids 0..255 in byte order, one id per merge from 256
on, and <|endoftext|> (special) as the last id: 256 + MERGES + 1 = 385 ids. The same
input gives the same file. Run from the repository root:
/usr/bin/python3 scripts/make_train_data.py
"""
import collections
import json
import os
import re

MERGES = 128
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PIECE = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+")


def byte_alphabet():
    """GPT-2's reversible byte -> printable unicode map."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def train(text, alphabet):
    words = collections.Counter(tuple(alphabet[b] for b in p.encode("utf-8")) for p in PIECE.findall(text))
    merges = []
    for _ in range(MERGES):
        pairs = collections.Counter()
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = {}
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        words = merged
    return merges


def main():
    with open(os.path.join(ROOT, "tests", "data", "train", "corpus.txt"), encoding="utf-8") as f:
        text = f.read()
    alphabet = byte_alphabet()
    merges = train(text, alphabet)
    vocab = {alphabet[b]: b for b in range(256)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    eot = len(vocab)
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": eot, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }
    path = os.path.join(ROOT, "tests", "data", "train", "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{os.path.relpath(path, ROOT)}: {len(merges)} merges, {eot + 1} ids (<|endoftext|> = {eot})")


if __name__ == "__main__":
    main()
