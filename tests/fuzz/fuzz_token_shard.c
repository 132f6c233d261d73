/* tests/fuzz/fuzz_token_shard.c — libFuzzer target for token shards and the data
 * loader (src/io/token_shard.c, src/io/data_loader.c): the input is a whole shard file.
 * When it opens, its ids are read in windows (also past the end, which must fail
 * cleanly), and a loader over it serves batches from a position taken from the file's
 * last bytes (a restored state of another data set must be refused, not trusted).
 * Errors are expected and must say why. Build: the `fuzz` CMake preset. */
#include "fuzz_util.h"
#include "loom/loom.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_scratch_file("shard", ".bin", data, size);
    lm_token_shard *sh = NULL;
    if (lm_token_shard_open(path, &sh) != LM_OK) {
        if (!lm_last_error()[0]) __builtin_trap();
        return 0;
    }
    int64_t n = lm_token_shard_count(sh);
    int32_t buf[64];
    for (int64_t i = 0; i < n && i < 4096; i += 64) (void)lm_token_shard_read(sh, i, n - i < 64 ? n - i : 64, buf);
    if (lm_token_shard_read(sh, n, 1, buf) == LM_OK && n >= 0) __builtin_trap(); /* past the end */
    (void)lm_token_shard_read(sh, INT64_MAX - 1, 2, buf);
    (void)lm_token_shard_read(sh, -1, 1, buf);
    lm_token_shard_close(sh);

    lm_data_loader *dl = NULL;
    const int64_t seq = 1 + (size % 7);
    if (lm_data_loader_create(1, &path, seq, size, (int)(size & 1), &dl) != LM_OK) return 0;
    int32_t in[4 * 8], tg[4 * 8];
    lm_data_loader_state st = lm_data_loader_get_state(dl);
    if (size >= 16) {
        memcpy(&st.cursor, data + size - 8, 8);
        memcpy(&st.epoch, data + size - 16, 8);
    }
    if (lm_data_loader_set_state(dl, &st) != LM_OK) lm_data_loader_rewind(dl);
    for (int b = 0; b < 3; b++)
        if (lm_data_loader_next(dl, 4, in, tg) != LM_OK) break;
    lm_data_loader_destroy(dl);
    return 0;
}
