/* tests/fuzz/fuzz_tokenizer_encode.c — libFuzzer target for encoding and decoding with
 * a real tokenizer (the default model's byte-level BPE, Llama 3 pre-tokenizer, one
 * special token). The first input byte picks a mode:
 *  - even: the rest is text. Encoding must succeed exactly when it is valid UTF-8, every
 *    id must be in the vocabulary, and decoding the ids must give the text back byte for
 *    byte (byte-level BPE loses nothing; the special token decodes to its content).
 *  - odd: the rest is little-endian int32 ids (spread over the vocabulary and a little
 *    beyond). Decoding must succeed exactly when every id is valid, in every flag mode.
 * Build: the `fuzz` CMake preset. */
#include "loom/loom.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static lm_tokenizer *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    if (lm_tokenizer_load(LOOM_SOURCE_DIR "/models/default/tokenizer.json", &g_tok) != LM_OK) abort();
    return 0;
}

static int valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t c = s[i], need = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : 9;
        if (need == 9 || i + need >= n + (need ? 0 : 1)) return 0;
        uint32_t cp = need == 0 ? c : need == 1 ? c & 31 : need == 2 ? c & 15 : c & 7;
        for (uint32_t k = 1; k <= need; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (s[i + k] & 63);
        }
        if ((need == 1 && cp < 0x80) || (need == 2 && cp < 0x800) || (need == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += need + 1;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const int32_t V = lm_tokenizer_vocab_size(g_tok);
    if (data[0] % 2 == 0) {
        const char *text = (const char *)data + 1;
        size_t len = size - 1;
        int32_t *ids = NULL;
        size_t n = 0;
        lm_status st = lm_tokenizer_encode(g_tok, text, len, &ids, &n);
        if ((st == LM_OK) != valid_utf8(data + 1, len)) __builtin_trap();
        if (st != LM_OK) return 0;
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= V) __builtin_trap();
        char *back = NULL;
        size_t blen = 0;
        if (lm_tokenizer_decode(g_tok, ids, n, 0, &back, &blen) != LM_OK) __builtin_trap();
        if (blen != len || memcmp(back, text, len) != 0) __builtin_trap(); /* exact round trip */
        lm_free(back);
        lm_free(ids);
        return 0;
    }
    size_t n = (size - 1) / 4;
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    if (!ids) return 0;
    int all_valid = 1;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, data + 1 + 4 * i, 4);
        ids[i] = (u & 0x80000000u) ? (int32_t)u : (int32_t)(u % (uint32_t)(V + 8)); /* mostly in range */
        all_valid &= ids[i] >= 0 && ids[i] < V;
    }
    for (unsigned flags = 0; flags < 4; flags++) {
        char *text = NULL;
        size_t len = 0;
        lm_status st = lm_tokenizer_decode(g_tok, ids, n, flags, &text, &len);
        if ((st == LM_OK) != all_valid) __builtin_trap();
        if (st == LM_OK && (text[len] != '\0' || ((flags & LM_TOKENIZER_LOSSY) && !valid_utf8((uint8_t *)text, len))))
            __builtin_trap();
        lm_free(text);
    }
    free(ids);
    return 0;
}
