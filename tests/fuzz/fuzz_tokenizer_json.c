/* tests/fuzz/fuzz_tokenizer_json.c — libFuzzer target for the tokenizer.json loader
 * (src/io/tokenizer*.c): the input is a tokenizer.json text. When it loads, a fixed
 * text with special-token look-alikes is encoded and decoded back, and every id's
 * token and bytes are looked up. Errors are expected and must say why. Build: the
 * `fuzz` CMake preset. */
#include "loom/loom.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lm_tokenizer *tok = NULL;
    if (lm_tokenizer_load_json((const char *)data, size, &tok) != LM_OK) {
        if (!lm_last_error()[0]) __builtin_trap();
        return 0;
    }
    static const char text[] = "Hello, world! <|endoftext|> 123 4567 it's  \n\n\t caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 <s></s>";
    int32_t *ids = NULL;
    size_t n = 0;
    if (lm_tokenizer_encode(tok, text, sizeof text - 1, &ids, &n) == LM_OK) {
        char *back = NULL;
        size_t len = 0;
        if (lm_tokenizer_decode(tok, ids, n, LM_TOKENIZER_LOSSY, &back, &len) == LM_OK) lm_free(back);
        lm_free(ids);
    }
    int32_t v = lm_tokenizer_vocab_size(tok);
    for (int32_t id = 0; id < v && id < 4096; id++) {
        const char *s;
        size_t len;
        if (lm_tokenizer_id_to_token(tok, id, &s, &len) == LM_OK) {
            int32_t again;
            (void)lm_tokenizer_token_to_id(tok, s, len, &again);
        }
        (void)lm_tokenizer_id_to_bytes(tok, id, &s, &len);
        (void)lm_tokenizer_is_special(tok, id);
    }
    lm_tokenizer_destroy(tok);
    return 0;
}
