"""The model side of the Python package on models/default: tokenizer round trips;
greedy generation through the streaming iterator gives the same ids and text as
`loom generate --temperature 0` (the C API's lm_generate) and as a greedy loop over
KVCache.forward; logits come back as NumPy arrays over loom memory (no copy) and
equal in a prefill and in token-by-token decode; the iterator streams (pieces arrive
before generation ends), stops when closed early, honours stop strings, and raises
loom.Error for bad parameters. The text is real English.
"""
import gc
import os
import subprocess
import unittest

import numpy as np

import loom

SRC = os.environ.get("LOOM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(SRC, "models", "default")
PROMPT = "The capital of France is"


class TestModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.m = loom.Model(MODEL)

    def test_tokenizer_round_trip(self):
        tok = self.m.tokenizer
        for text in ("Hello, world!", "The quick brown fox jumps over the lazy dog.", "naïve café — ok", ""):
            ids = tok.encode(text)
            self.assertTrue(all(0 <= i < tok.vocab_size for i in ids))
            self.assertEqual(tok.decode(ids), text)
        self.assertEqual(tok.decode(tok.encode(PROMPT)), PROMPT)

    def test_greedy_stream_equals_the_cli(self):
        n = 24
        g = self.m.generate(PROMPT, max_new_tokens=n, temperature=0, ignore_eos=True)
        pieces = list(g)
        self.assertEqual(len(g.token_ids), n)
        self.assertEqual(g.reason, "length")
        self.assertEqual(g.result.prompt_tokens, len(self.m.tokenizer.encode(PROMPT)))
        text = "".join(pieces)
        self.assertEqual(text, g.text)
        self.assertEqual(text, self.m.tokenizer.decode(g.token_ids, skip_special=True))
        words = [w for w in text.split() if w.isalpha()]
        self.assertGreaterEqual(len(words), 5, "not English words: %r" % text)
        cli = os.environ.get("LOOM_CLI")
        if not cli or not os.path.exists(cli):
            self.skipTest("no loom CLI given (LOOM_CLI)")
        base = [cli, "generate", "--model", MODEL, "--prompt", PROMPT, "--max-new", str(n), "--temperature", "0",
                "--ignore-eos"]
        ids = subprocess.run(base + ["--print-ids"], check=True, capture_output=True, text=True).stdout
        self.assertEqual([int(x) for x in ids.strip().strip("[]").split(",")], g.token_ids)
        out = subprocess.run(base, check=True, capture_output=True).stdout.decode("utf-8")
        self.assertEqual(out.rstrip("\n"), text)

    def test_greedy_loop_over_forward_equals_generate(self):
        ids = self.m.tokenizer.encode(PROMPT)
        n = 8
        g = self.m.generate(ids, max_new_tokens=n, greedy=True, ignore_eos=True)
        list(g)
        cache = self.m.kv_cache(1, len(ids) + n)
        logits = cache.forward(ids)
        got = []
        for _ in range(n):
            self.assertEqual(logits.shape, (1, self.m.vocab_size))
            self.assertEqual(logits.dtype, np.float32)
            nxt = int(np.argmax(logits[0]))
            got.append(nxt)
            logits = cache.forward([nxt])
        self.assertEqual(got, g.token_ids)
        self.assertEqual(cache.length(0), len(ids) + n)

    def test_logits_are_numpy_views_of_loom_memory(self):
        ids = self.m.tokenizer.encode("Hello there")
        cache = self.m.kv_cache(1, 16)
        all_pos = cache.forward(ids, all_positions=True)
        self.assertEqual(all_pos.shape, (1, len(ids), self.m.vocab_size))
        owner = all_pos.base
        self.assertIsInstance(owner, loom.Tensor)
        self.assertEqual(all_pos.__array_interface__["data"][0], owner.data_ptr)  # no copy
        self.assertTrue(np.isfinite(all_pos).all())
        # token-by-token decode gives the prefill's rows
        cache2 = self.m.kv_cache(1, 16)
        for t, i in enumerate(ids):
            row = cache2.forward([i])[0]
            np.testing.assert_allclose(row, all_pos[0, t], rtol=1e-4, atol=1e-4)
        last = self.m.logits(ids)
        np.testing.assert_allclose(last, all_pos[0, -1], rtol=1e-4, atol=1e-4)

    def test_stream_is_lazy_closable_and_stops_on_strings(self):
        g = self.m.generate(PROMPT, max_new_tokens=200, temperature=0, ignore_eos=True)
        first = next(g)
        self.assertTrue(first)
        g.close()  # stops at the next token
        self.assertLess(len(g.token_ids) + g._stream.queue.qsize(), 200)
        with self.m.generate(PROMPT, max_new_tokens=200, temperature=0, ignore_eos=True) as g2:
            for i, _ in enumerate(g2):
                if i == 2:
                    break
        full = self.m.generate_text(PROMPT, max_new_tokens=24, temperature=0, ignore_eos=True)
        word = full.split()[2]
        g3 = self.m.generate(PROMPT, max_new_tokens=24, temperature=0, ignore_eos=True, stop=[word])
        text = "".join(g3)
        self.assertEqual(g3.reason, "stop string")
        self.assertNotIn(word, text)
        self.assertTrue(full.startswith(text))
        sampled = self.m.generate_text(PROMPT, max_new_tokens=8, temperature=0.8, seed=3)
        self.assertEqual(sampled, self.m.generate_text(PROMPT, max_new_tokens=8, temperature=0.8, seed=3))
        del g, g2, g3
        gc.collect()

    def test_bad_parameters_raise_loom_errors(self):
        with self.assertRaises(loom.Error) as cm:
            list(self.m.generate(PROMPT, max_new_tokens=0))
        self.assertIn("max_new_tokens", str(cm.exception))
        with self.assertRaises(loom.OutOfRangeError):
            self.m.kv_cache(1, 4).forward([self.m.vocab_size + 5])
        with self.assertRaises(loom.Error):
            list(self.m.generate(PROMPT, max_new_tokens=4, top_p=2.0))


if __name__ == "__main__":
    unittest.main()
