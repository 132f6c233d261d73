"""loom.model — tokenizers, models, KV caches and streaming generation.

Model.generate runs lm_generate on a worker thread (ctypes releases the GIL during the
call) and hands each piece of text to the iterating thread through a queue, so the
caller reads tokens as they are produced; closing the iterator (break, .close(), or
garbage collection) makes the next token callback return nonzero, which stops
lm_generate at once. The worker owns its lm_ctx. Logits come back as NumPy arrays
over a loom tensor's memory (no copy).
"""
import ctypes
import os
import queue
import threading

from . import _lib
from ._lib import LIB, check
from .tensor import Context, context, device as _device, device_name, empty

SKIP_SPECIAL, LOSSY = 1, 2
STOP_REASONS = ("length", "eos", "stop string", "callback")


class Tokenizer:
    """A Hugging Face tokenizer.json byte-level BPE tokenizer."""

    def __init__(self, path):
        h = ctypes.c_void_p()
        check("lm_tokenizer_load", os.fsencode(path), ctypes.byref(h))
        self._h = h

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h and LIB is not None:
            LIB.lm_tokenizer_destroy(h)

    @property
    def vocab_size(self):
        return LIB.lm_tokenizer_vocab_size(self._h)

    def encode(self, text):
        """Token ids (a list of ints) of text; special tokens are not added."""
        raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        ids, n = _lib.c_int32_p(), ctypes.c_size_t()
        check("lm_tokenizer_encode", self._h, raw, len(raw), ctypes.byref(ids), ctypes.byref(n))
        try:
            return ids[:n.value] if n.value else []
        finally:
            LIB.lm_free(ids)

    def decode_bytes(self, ids, skip_special=False):
        """The exact bytes of ids (may cut a UTF-8 character)."""
        arr = (ctypes.c_int32 * max(len(ids), 1))(*ids)
        text, n = ctypes.c_void_p(), ctypes.c_size_t()
        check("lm_tokenizer_decode", self._h, arr, len(ids), SKIP_SPECIAL if skip_special else 0, ctypes.byref(text),
              ctypes.byref(n))
        try:
            return ctypes.string_at(text, n.value) if n.value else b""
        finally:
            LIB.lm_free(text)

    def decode(self, ids, skip_special=False):
        """Text of ids (invalid UTF-8 becomes U+FFFD, as Hugging Face decode does)."""
        return self.decode_bytes(list(ids), skip_special).decode("utf-8", "replace")

    def token_to_id(self, token):
        raw = token.encode("utf-8")
        out = ctypes.c_int32()
        check("lm_tokenizer_token_to_id", self._h, raw, len(raw), ctypes.byref(out))
        return out.value


class Model:
    """A decoder-only transformer loaded from a Hugging Face directory (config.json,
    *.safetensors, tokenizer.json). Immutable after load; share it between threads, but
    give each thread its own KVCache."""

    def __init__(self, path, device="cpu", tokenizer=True):
        self.path = os.fspath(path)
        h = ctypes.c_void_p()
        check("lm_model_load", os.fsencode(self.path), _device(device), ctypes.byref(h))
        self._h = h
        self.device = device_name(_device(device))
        tok = os.path.join(self.path, "tokenizer.json")
        self.tokenizer = Tokenizer(tok) if tokenizer and os.path.exists(tok) else None

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h and LIB is not None:
            LIB.lm_model_destroy(h)

    @property
    def config(self):
        """The parsed config.json (an lm_model_config ctypes struct, read-only)."""
        return LIB.lm_model_get_config(self._h).contents

    @property
    def vocab_size(self):
        return self.config.vocab_size

    def kv_cache(self, slots=1, max_tokens=None):
        return KVCache(self, slots, max_tokens)

    def logits(self, ids):
        """Logits f32 [vocab] after the token ids (a fresh cache): a NumPy array over loom memory."""
        cache = self.kv_cache(1, len(ids))
        return cache.forward(ids)[0]

    def _prompt_ids(self, prompt, bos):
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer.json: pass token ids")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = [int(i) for i in prompt]
        if bos:
            if self.config.bos_token_id < 0:
                raise ValueError("bos=True but the model's config has no bos_token_id")
            ids = [int(self.config.bos_token_id)] + ids
        return ids

    def generate(self, prompt, max_new_tokens=64, temperature=None, top_k=None, top_p=None, min_p=0.0,
                 repetition_penalty=1.0, seed=0, greedy=None, stop=(), ignore_eos=False, bos=False, threads=0):
        """A streaming iterator of text pieces (str) continuing prompt (text or token ids).
        Sampling defaults come from generation_config.json, as `loom generate` takes them;
        temperature=0 or greedy=True takes the most likely token. After (or during) the
        iteration: .token_ids, .text, .reason ("length", "eos", "stop string"), .result."""
        return Generation(self, self._prompt_ids(prompt, bos), max_new_tokens, temperature, top_k, top_p, min_p,
                          repetition_penalty, seed, greedy, stop, ignore_eos, threads)

    def generate_text(self, prompt, **kw):
        """The whole continuation as one string."""
        return "".join(self.generate(prompt, **kw))


class KVCache:
    """Slots of independent sequences on the model's device; forward appends tokens."""

    def __init__(self, model, slots=1, max_tokens=None):
        self.model = model  # keeps the model alive
        cfg = model.config
        max_tokens = int(max_tokens or cfg.max_position_embeddings)
        h = ctypes.c_void_p()
        check("lm_kv_cache_create", model._h, int(slots), max_tokens, ctypes.byref(h))
        self._h = h
        self.slots = int(slots)
        self.max_tokens = max_tokens

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h and LIB is not None:
            LIB.lm_kv_cache_destroy(h)

    def length(self, slot=0):
        return LIB.lm_kv_cache_length(self._h, slot)

    def reset(self, slot=0):
        check("lm_kv_cache_reset", self._h, slot)

    def forward(self, ids, slots=None, all_positions=False, ctx=None, as_numpy=True):
        """Appends T tokens to each of B slots. ids: a list of T ids (one slot) or B lists
        of T. Returns the logits, f32 [B, vocab] for each row's last position or
        [B, T, vocab] with all_positions, as a NumPy array over loom memory (no copy; its
        .base is the loom.Tensor), or that loom.Tensor itself with as_numpy=False."""
        rows = [list(r) for r in ids] if len(ids) and hasattr(ids[0], "__len__") else [list(ids)]
        B, T = len(rows), len(rows[0])
        if any(len(r) != T for r in rows):
            raise ValueError("every row needs the same number of tokens")
        slots = list(range(B)) if slots is None else list(slots)
        flat = (ctypes.c_int32 * max(B * T, 1))(*[int(i) for r in rows for i in r])
        c_slots = (ctypes.c_int * B)(*slots)
        V = self.model.vocab_size
        logits = empty((B, T, V) if all_positions else (B, V), "f32", "cpu")
        c = ctx or context(self.model.device)
        check("lm_model_forward", self.model._h, c._h, self._h, c_slots, B, flat, T,
              ctypes.c_void_p(logits.data_ptr), int(bool(all_positions)))
        return logits.numpy() if as_numpy else logits


class _Stream:
    """What the worker thread shares with the iterator: it does not reference the
    Generation, so dropping the iterator stops the worker (cancel) at the next token."""

    def __init__(self):
        self.queue = queue.Queue()
        self.cancel = False
        self.error = None
        self.result = None

    def on_token(self, user, token_id, text, length):
        piece = ctypes.string_at(text, length).decode("utf-8", "replace") if length else ""
        self.queue.put((token_id, piece))
        return 1 if self.cancel else 0


_DONE = object()


def _generate_worker(stream, model, prompt_ids, params, callback, threads):
    ctx = None
    try:
        n = len(prompt_ids)
        ids = (ctypes.c_int32 * max(n, 1))(*prompt_ids)
        res = _lib.GenerateResult()
        ctx = Context(model.device, threads)  # this thread's own context
        tok = model.tokenizer._h if model.tokenizer else None
        st = LIB.lm_generate(model._h, ctx._h, tok, ids, n, ctypes.byref(params), callback, None, ctypes.byref(res))
        if st != 0:
            stream.error = _lib.make_error(LIB, st, "lm_generate")  # lm_last_error() is per thread: read it here
        else:
            stream.result = res
    except BaseException as e:  # re-raised in the iterating thread
        stream.error = e
    finally:
        del ctx
        stream.queue.put(_DONE)


class Generation:
    """The iterator Model.generate returns (see there). Use it in a for loop, or as a
    context manager to stop generation when the block is left early."""

    def __init__(self, model, ids, max_new_tokens, temperature, top_k, top_p, min_p, repetition_penalty, seed,
                 greedy, stop, ignore_eos, threads):
        self.model, self.prompt_ids = model, list(ids)
        self.token_ids, self.pieces = [], []
        p = _lib.GenerateParams()
        p.max_new_tokens = int(max_new_tokens)
        s = LIB.lm_sampler_params_default()
        g = model.config.generation
        # the same defaults as `loom generate`: generation_config.json, else sampling at 1
        s.greedy = 1 if greedy or temperature == 0 or (
            greedy is None and g.present and not g.do_sample and temperature is None and top_p is None
            and top_k is None) else 0
        s.temperature = float(temperature) if temperature is not None else g.temperature
        s.top_k = int(top_k) if top_k is not None else (int(g.top_k) if g.present else 0)
        s.top_p = float(top_p) if top_p is not None else g.top_p
        s.min_p = float(min_p)
        s.repetition_penalty = float(repetition_penalty)
        s.seed = int(seed)
        p.sampler = s
        stop = [stop] if isinstance(stop, str) else list(stop)
        self._stop = (ctypes.c_char_p * max(len(stop), 1))(*[x.encode("utf-8") for x in stop])
        p.stop = ctypes.cast(self._stop, ctypes.POINTER(ctypes.c_char_p)) if stop else None
        p.n_stop = len(stop)
        p.ignore_eos = int(bool(ignore_eos))
        p.decode_flags = SKIP_SPECIAL
        self._params = p
        self._stream = _Stream()
        self._callback = _lib.TOKEN_FN(self._stream.on_token)  # must outlive the worker: joined before dropped
        self._thread = threading.Thread(target=_generate_worker, name="loom-generate", daemon=True,
                                        args=(self._stream, model, self.prompt_ids, p, self._callback, threads))
        self._thread.start()

    @property
    def result(self):
        """The lm_generate_result (prompt_tokens, new_tokens, reason, timings) once done."""
        return self._stream.result

    @property
    def reason(self):
        r = self._stream.result
        if r is None:
            return None
        return STOP_REASONS[r.reason] if 0 <= r.reason < len(STOP_REASONS) else str(r.reason)

    @property
    def text(self):
        return "".join(self.pieces)

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            item = self._stream.queue.get()
            if item is _DONE:
                self._stream.queue.put(item)  # later calls end too
                self._thread.join()
                err, self._stream.error = self._stream.error, None
                if err is not None:
                    raise err
                raise StopIteration
            token_id, piece = item
            if token_id >= 0:
                self.token_ids.append(token_id)
            if piece:
                self.pieces.append(piece)
                return piece

    def close(self):
        """Stops generation at the next token and waits for the worker."""
        self._stream.cancel = True
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


__all__ = ["Tokenizer", "Model", "KVCache", "Generation"]
