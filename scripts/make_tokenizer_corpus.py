#!/usr/bin/python3
"""Writes tests/data/tokenizer/corpus.jsonl: the hard cases loom's tokenizer must
encode exactly like Hugging Face `tokenizers` (one JSON string per line).

Hand-written cases cover whitespace runs, digits, contractions in any case, CJK,
emoji ZWJ sequences, combining marks (NFC), special tokens inside text and the empty
string; a seeded generator adds mixed-script strings. Deterministic: rerunning gives
the same file.
"""
import json
import os
import random

CASES = [
    "",
    " ",
    "   ",
    "\t",
    "\n",
    "\r\n",
    "\n\n\n",
    "  \n\n  ",
    "Hello, world!",
    "Hello world",
    " Hello world ",
    "hello   world",
    "trailing spaces   ",
    "   leading spaces",
    "tabs\tand\t\ttabs",
    "line one\nline two\r\nline three\rline four",
    "mixed \t \n whitespace \u00a0 nbsp \u2003 em-space",
    "0",
    "12",
    "123",
    "1234",
    "1234567890",
    "3.14159265358979",
    "x = 1,000,000.50 and y=-42e-7",
    "In 2024 there were 365 days; 1/3 = 0.333...",
    "phone: +1 (555) 010-9999",
    "I'm you're he's she'd we'll they've don't",
    "I'M YOU'RE HE'S SHE'D WE'LL THEY'VE DON'T",
    "i'M yOu'Re He'S sHe'D wE'lL tHeY'vE dOn'T",
    "'s 't 're 've 'm 'll 'd",
    "rock 'n' roll, 'quoted', ''double''",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "你好，世界！今天天气很好。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트입니다.",
    "中文English混合text测试123",
    "Привет, мир! Ёжик в тумане.",
    "Γειά σου Κόσμε",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "emoji: 😀😃😄 👍🏽 🇺🇸🇯🇵",
    "family: 👨\u200d👩\u200d👧\u200d👦 and 🏳\ufe0f\u200d🌈 and 👩🏾\u200d💻",
    "❤️ ✨ ☕ ⭐",
    "cafe\u0301 vs café",
    "e\u0301\u0302\u0303 stacked marks",
    "A\u030a ångström Å",
    "\u1e9b\u0323 long s with dots",
    "ﬁ ligature and ＦＵＬＬＷＩＤＴＨ",
    "zero\u200bwidth\u200cnon\u200djoiner",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
    "https://example.com/path?query=1&b=2#frag",
    "user@example.org",
    "!!!???...,,,;;;:::",
    "-- --- ---- ===== ~~~~",
    "((([[[{{{}}}]]])))",
    "$100 €50 £30 ¥1000 ₹500",
    "∑ ∫ √ ∞ ≠ ≤ ≥ ± × ÷ π",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "<|endoftext|><|endoftext|>",
    "<|im_start|",
    "<|begin_of_text|>Hello<|eot_id|>",
    "<|start_header_id|>system<|end_header_id|>\n\nYou are helpful.",
    "<｜begin▁of▁sentence｜>Hi<｜end▁of▁sentence｜>",
    "<think>reasoning</think> answer",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "ab" * 50,
    " " * 40 + "x",
    "\n" * 10 + "y",
    "A\u0000B",
    "\x7f\x01\x1b[31mred\x1b[0m",
]

POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    " \t\n\r  ",
    "'\".,;:!?-_()[]{}<>/\\|@#$%^&*+=~`",
    "的一是不了人我在有他这为之大来以个中上们",
    "あいうえおかきくけこアイウエオ",
    "😀👍🏽🇺🇸\u200d❤️🎉",
    "\u0301\u0308\u0327\u030a",
    "éüñçøåßœæ",
    "абвгдеёжзийк",
]


def generated(count, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = rng.randint(1, 60)
        s = "".join(rng.choice(rng.choice(POOLS)) for _ in range(n))
        out.append(s)
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "tests", "data", "tokenizer", "corpus.jsonl")
    lines = CASES + generated(120, 20261130)
    with open(path, "w", encoding="utf-8") as f:
        for s in lines:
            f.write(json.dumps(s, ensure_ascii=True) + "\n")
    print(f"wrote {len(lines)} strings to {path}")


if __name__ == "__main__":
    main()
