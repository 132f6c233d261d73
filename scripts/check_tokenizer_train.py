#!/usr/bin/env python3
"""Checks a tokenizer.json written by `loom tokenizer train` against Hugging Face
`tokenizers` (run where it is installed, e.g. the GPU machine; no network needed).

    check_tokenizer_train.py --tokenizer tok.json --text FILE [--loom PATH]
    check_tokenizer_train.py --train CORPUS --vocab N [--special TOKEN]... [--pretokenizer P]
                             [--text FILE] [--hf-train] [--loom PATH]

1. Loads the file with `tokenizers.Tokenizer.from_file` (any load warning, e.g. an
   added token whose id HF would change, is a failure).
2. Encodes, with add_special_tokens=False, every line of --text (with its newline),
   every blank-line separated paragraph, the whole text in 64 KiB pieces, and a list of
   hard cases (whitespace runs, CR/LF, digits, contractions, CJK, emoji, combining
   marks, the special tokens inside text), and compares the ids with those of
   `loom tokenize --tokenizer FILE` (JSON strings in, JSON id arrays out, one per line).
   Also checks that HF decodes its ids back to the exact text.
3. With --train, first trains the file with `loom tokenizer train` on CORPUS (into a
   temporary directory; --text defaults to CORPUS). With --hf-train, also trains HF's
   BpeTrainer on the same corpus (the whole text as one sequence, the same
   pre-tokenizer, ByteLevel initial alphabet, same specials and min_frequency) and
   compares vocab and merges: loom follows HF's rule (highest count, then smallest
   (left id, right id)), so they are identical (seen with tokenizers 0.23.2 for the
   llama3, qwen2 and gpt2 presets) unless the corpus contains the special tokens (loom
   cuts them out before counting, HF's trainer does not).

Prints mismatches (first --show of them in full) and a one-line JSON summary; exits 1
on any mismatch.
"""
import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile

HARD_CASES = [
    "", " ", "   ", "\t", "\n", "\r\n", "\n\n\n", "  \n\n  ", " \r\n\r\n x",
    "Hello, world!", " Hello world ", "hello   world", "trailing spaces   ", "   leading",
    "tabs\tand\t\ttabs", "line one\nline two\r\nline three\rline four",
    "mixed \t \n whitespace \u00a0 nbsp \u2003 em-space \u180e mongolian \u3000 ideographic",
    "0", "12", "123", "1234", "1234567890", "3.14159265358979",
    "x = 1,000,000.50 and y=-42e-7",
    "I'm you're he's she'd we'll they've don't",
    "I'M YOU'RE HE'S SHE'D WE'LL THEY'VE DON'T",
    "i'M yOu'Re He'S sHe'D wE'lL", "'s 't 're 've 'm 'll 'd", "rock 'n' roll, ''double''",
    "你好，世界！今天天气很好。", "日本語のテキストとカタカナ、ひらがな。", "한국어 텍스트입니다.",
    "Привет, мир! Ελληνικά. العربية ١٢٣", "emoji 😀👩‍💻🇫🇷 👍🏽 ok", "e\u0301 combining  n\u0303o",
    "café naïve coöperate", "\u200b zero width \u200d joiner", "a" * 300, " " * 100 + "x",
    "def f(x):\n    return x**2  # square\n\n\nclass A:\n\tpass\n",
]


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8")


def cases_from(text, specials):
    out = []
    lines = text.splitlines(keepends=True)
    out += lines
    out += [p for p in text.split("\n\n") if p]
    step = 64 << 10
    out += [text[i:i + step] for i in range(0, len(text), step)]
    out += HARD_CASES
    for s in specials:
        out += [s, f"text{s}more", f"{s}\n{s} {s}x", f"a {s} b"]
    return out


def loom_encode(loom, tok_path, texts):
    inp = "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts)
    r = subprocess.run([loom, "tokenize", "--tokenizer", tok_path], input=inp.encode("utf-8"),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    if r.returncode != 0:
        sys.exit(f"loom tokenize failed ({r.returncode}): {r.stderr.decode(errors='replace')}")
    out = [json.loads(line) for line in r.stdout.decode("utf-8").splitlines()]
    if len(out) != len(texts):
        sys.exit(f"loom tokenize returned {len(out)} lines for {len(texts)} inputs")
    return out


def loom_train(loom, corpus, vocab, specials, pretok, min_freq, out):
    cmd = [loom, "tokenizer", "train", "--vocab", str(vocab), "--pretokenizer", pretok, "--quiet", corpus, "-o", out]
    for s in specials:
        cmd += ["--special", s]
    if min_freq:
        cmd += ["--min-frequency", str(min_freq)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    if r.returncode != 0:
        sys.exit(f"loom tokenizer train failed: {r.stderr.decode(errors='replace')}")
    return json.loads(r.stdout.decode())


def hf_train_compare(tok_path, corpus_text, vocab, specials, min_freq):
    """Trains HF's BpeTrainer with our file's pre-tokenizer; returns a list of differences."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer.from_file(tok_path)
    tok.model = models.BPE()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(specials), min_frequency=min_freq,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([corpus_text], trainer=trainer)
    hf = json.loads(tok.to_str())["model"]
    ours = json.load(open(tok_path, encoding="utf-8"))["model"]
    norm = lambda ms: [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in ms]
    diffs = []
    hm, om = norm(hf["merges"]), norm(ours["merges"])
    if hm != om:
        first = next((i for i, (a, b) in enumerate(zip(hm, om)) if a != b), min(len(hm), len(om)))
        diffs.append(f"merges differ: HF {len(hm)}, loom {len(om)}; first difference at {first}: "
                     f"HF {hm[first] if first < len(hm) else None} loom {om[first] if first < len(om) else None}")
    if hf["vocab"] != ours["vocab"]:
        only = [k for k in set(hf["vocab"]) ^ set(ours["vocab"])][:5]
        moved = [k for k in hf["vocab"] if k in ours["vocab"] and hf["vocab"][k] != ours["vocab"][k]][:5]
        diffs.append(f"vocab differs: HF {len(hf['vocab'])}, loom {len(ours['vocab'])}; in one only {only}; "
                     f"other ids {moved}")
    return diffs


class WarningCounter(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", help="tokenizer.json to check (written by loom tokenizer train)")
    ap.add_argument("--text", help="UTF-8 text to encode line by line")
    ap.add_argument("--loom", default=os.environ.get("LOOM", "build/release/loom"), help="the loom binary")
    ap.add_argument("--train", metavar="CORPUS", help="train with loom on CORPUS first")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--special", action="append", default=[])
    ap.add_argument("--pretokenizer", default="llama3")
    ap.add_argument("--min-frequency", type=int, default=0)
    ap.add_argument("--hf-train", action="store_true", help="also compare with HF's BpeTrainer on CORPUS")
    ap.add_argument("--max-cases", type=int, default=200000)
    ap.add_argument("--show", type=int, default=10, help="mismatches printed in full")
    a = ap.parse_args()

    import tokenizers
    from tokenizers import Tokenizer

    tmp = None
    train_info = None
    if a.train:
        tmp = tempfile.TemporaryDirectory()
        a.tokenizer = os.path.join(tmp.name, "tokenizer.json")
        train_info = loom_train(a.loom, a.train, a.vocab, a.special, a.pretokenizer, a.min_frequency, a.tokenizer)
        a.text = a.text or a.train
    if not a.tokenizer or not a.text:
        ap.error("--tokenizer and --text (or --train CORPUS) are required")

    warnings = WarningCounter()
    logging.getLogger().addHandler(warnings)
    hf = Tokenizer.from_file(a.tokenizer)
    tj = json.load(open(a.tokenizer, encoding="utf-8"))
    specials = [t["content"] for t in tj.get("added_tokens", [])]
    failures = [f"load warning: {m}" for m in warnings.messages]
    for t in tj.get("added_tokens", []):
        if hf.token_to_id(t["content"]) != t["id"]:
            failures.append(f"HF gives added token {t['content']!r} id {hf.token_to_id(t['content'])}, file {t['id']}")
    if hf.get_vocab_size(with_added_tokens=True) != len(tj["model"]["vocab"]):
        failures.append(f"HF vocab size {hf.get_vocab_size(with_added_tokens=True)} != {len(tj['model']['vocab'])}")

    text = read_text(a.text)
    cases = cases_from(text, specials)[:a.max_cases]
    ours = loom_encode(a.loom, a.tokenizer, cases)
    mismatches = roundtrip = 0
    n_ids = 0
    for i, (t, mine) in enumerate(zip(cases, ours)):
        theirs = hf.encode(t, add_special_tokens=False).ids
        n_ids += len(theirs)
        if hf.decode(theirs, skip_special_tokens=False) != t:
            roundtrip += 1
            if roundtrip <= a.show:
                print(f"case {i}: HF decode does not give the text back: {t[:120]!r}")
        if theirs != mine:
            mismatches += 1
            if mismatches <= a.show:
                k = next((j for j, (x, y) in enumerate(zip(theirs, mine)) if x != y), min(len(theirs), len(mine)))
                ctx = lambda ids: [hf.id_to_token(x) for x in ids[max(0, k - 3):k + 4]]
                print(f"case {i}: ids differ at {k} (HF {len(theirs)} ids, loom {len(mine)}): {t[:120]!r}\n"
                      f"  HF   {theirs[max(0, k - 3):k + 4]} {ctx(theirs)}\n"
                      f"  loom {mine[max(0, k - 3):k + 4]} {ctx(mine)}")
    hf_train = None
    if a.hf_train:
        if not a.train:
            ap.error("--hf-train needs --train CORPUS")
        diffs = hf_train_compare(a.tokenizer, read_text(a.train), a.vocab, a.special, a.min_frequency)
        hf_train = "identical" if not diffs else diffs
        for d in diffs:
            print("hf-train: " + d)
        failures += diffs
    for f in failures:
        print(f)
    summary = {"tokenizer": a.tokenizer, "text": a.text, "tokenizers": tokenizers.__version__, "cases": len(cases),
               "ids": n_ids, "mismatches": mismatches, "roundtrip_failures": roundtrip, "other_failures": len(failures),
               "train": train_info, "hf_train": hf_train}
    print(json.dumps(summary))
    return 1 if mismatches or roundtrip or failures else 0


if __name__ == "__main__":
    sys.exit(main())
