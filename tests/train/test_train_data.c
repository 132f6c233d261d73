/* Tests for the training io: token shards (round trip as u16 and i32, the header
 * fields, and a clear error for every kind of damage), lm_data_prepare with the
 * committed tokenizer, the data loader (windows and shifted targets, a full
 * permutation per epoch, seeds, state save/restore mid-epoch and across epochs,
 * rewind, foreign states), atomic file replacement, and the safetensors writer read
 * back by the existing reader (dtypes, strided input, alignment, metadata, errors).
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "loom/data.h"
#include "loom/io_write.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static lm_ctx *g_ctx;

static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/train_data_%s", LOOM_BINARY_DIR, name);
    return buf[k];
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

static void test_shard_round_trip_and_header(void) {
    int32_t ids[7] = {0, 5, 65535, 12, 7, 7, 1};
    const char *p16 = tmp_path("u16.bin"), *p32 = tmp_path("i32.bin");
    LT_CHECK_OK(lm_token_shard_write(p16, ids, 7, 65536));
    int32_t big[3] = {70000, 3, 0};
    LT_CHECK_OK(lm_token_shard_write(p32, big, 3, 100000));
    lm_token_shard *a = NULL, *b = NULL;
    LT_CHECK_OK(lm_token_shard_open(p16, &a));
    LT_CHECK_OK(lm_token_shard_open(p32, &b));
    if (a && b) {
        LT_CHECK(lm_token_shard_count(a) == 7 && lm_token_shard_vocab(a) == 65536 && lm_token_shard_dtype(a) == LM_TOKENS_U16);
        LT_CHECK(lm_token_shard_count(b) == 3 && lm_token_shard_dtype(b) == LM_TOKENS_I32);
        int32_t out[7];
        LT_CHECK_OK(lm_token_shard_read(a, 0, 7, out));
        LT_CHECK(memcmp(out, ids, sizeof ids) == 0);
        LT_CHECK_OK(lm_token_shard_read(b, 0, 3, out));
        LT_CHECK(out[0] == 70000 && out[2] == 0);
        LT_CHECK_STATUS(lm_token_shard_read(a, 5, 3, out), LM_OUT_OF_RANGE);
    }
    lm_token_shard_close(a);
    lm_token_shard_close(b);
    LT_CHECK_STATUS(lm_token_shard_write(p16, ids, 7, 100), LM_OUT_OF_RANGE); /* 65535 >= 100 */
}

static void test_damaged_shards_fail_clearly(void) {
    int32_t ids[4] = {1, 2, 3, 4};
    const char *good = tmp_path("good.bin"), *bad = tmp_path("bad.bin");
    LT_CHECK_OK(lm_token_shard_write(good, ids, 4, 10));
    char *data = NULL;
    size_t n = 0;
    LT_CHECK_OK(lm_file_read_all(good, &data, &n));
    LT_CHECK(n == LM_TOKEN_SHARD_HEADER + 8);
    struct {
        int offset, value;
        size_t len;
        const char *want;
    } cases[] = {{0, 'X', 40, "magic"},     {8, 9, 40, "version"}, {12, 7, 40, "dtype"},
                 {16, 9, 40, "9 tokens"},  {-1, 0, 39, "bytes"},   {32, 11, 40, "outside"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char copy[64];
        memcpy(copy, data, n);
        if (cases[i].offset >= 0) copy[cases[i].offset] = (char)cases[i].value;
        write_bytes(bad, copy, cases[i].len);
        lm_token_shard *s = NULL;
        LT_CHECK_STATUS(lm_token_shard_open(bad, &s), LM_PARSE_ERROR);
        LT_CHECK_MSG(strstr(lm_last_error(), cases[i].want) && strstr(lm_last_error(), "bad.bin"), "case %zu: %s", i,
                     lm_last_error());
        LT_CHECK(s == NULL);
    }
    lm_token_shard *s = NULL;
    LT_CHECK_STATUS(lm_token_shard_open(tmp_path("missing.bin"), &s), LM_IO_ERROR);
    lm_free(data);
}

static void test_prepare_tokenizes_files_with_a_separator(void) {
    lm_tokenizer *tok = NULL;
    LT_CHECK_OK(lm_tokenizer_load(LOOM_SOURCE_DIR "/tests/data/train/tokenizer.json", &tok));
    if (!tok) return;
    const char *files[2] = {LOOM_SOURCE_DIR "/tests/data/train/corpus.txt", LOOM_SOURCE_DIR "/tests/data/train/heldout.txt"};
    int64_t count = 0;
    const char *out = tmp_path("prepared.bin");
    LT_CHECK_OK(lm_data_prepare(tok, 2, files, 384, out, &count));
    char *text = NULL;
    size_t len = 0, n1 = 0;
    int32_t *ids = NULL;
    LT_CHECK_OK(lm_file_read_all(files[0], &text, &len));
    LT_CHECK_OK(lm_tokenizer_encode(tok, text, len, &ids, &n1));
    lm_token_shard *s = NULL;
    LT_CHECK_OK(lm_token_shard_open(out, &s));
    if (s && ids) {
        int32_t *got = malloc(sizeof(int32_t) * (size_t)count);
        LT_CHECK_OK(lm_token_shard_read(s, 0, count, got));
        LT_CHECK(memcmp(got, ids, n1 * sizeof(int32_t)) == 0 && got[n1] == 384 && got[count - 1] == 384);
        LT_CHECK(lm_token_shard_vocab(s) == 385 && lm_token_shard_dtype(s) == LM_TOKENS_U16);
        free(got);
    }
    LT_CHECK_STATUS(lm_data_prepare(tok, 1, files, 385, out, NULL), LM_OUT_OF_RANGE);
    const char *missing[1] = {tmp_path("no_such.txt")};
    LT_CHECK_STATUS(lm_data_prepare(tok, 1, missing, -1, out, NULL), LM_IO_ERROR);
    lm_token_shard_close(s);
    lm_free(ids);
    lm_free(text);
    lm_tokenizer_destroy(tok);
}

/* A shard holding first, first + 1, ... (n tokens): a window is known by its first token. */
static const char *counting_shard(const char *name, int first, int n) {
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) ids[i] = first + i;
    const char *p = tmp_path(name);
    LT_CHECK_OK(lm_token_shard_write(p, ids, n, 1000));
    free(ids);
    return p;
}

static void test_loader_windows_epochs_and_resume(void) {
    const char *paths[2] = {counting_shard("a.bin", 0, 41), counting_shard("b.bin", 100, 17)};
    lm_data_loader *dl = NULL, *dl2 = NULL, *other = NULL;
    LT_CHECK_OK(lm_data_loader_create(2, paths, 4, 7, 1, &dl));
    LT_CHECK_OK(lm_data_loader_create(2, paths, 4, 8, 1, &other));
    if (!dl || !other) return;
    LT_CHECK(lm_data_loader_windows(dl) == 10 + 4 && lm_data_loader_vocab(dl) == 1000);
    int32_t in[3 * 4], tg[3 * 4], in2[3 * 4], tg2[3 * 4];
    int seen[128] = {0}, differs = 0;
    for (int b = 0; b < 14; b++) { /* one epoch, one window at a time */
        LT_CHECK_OK(lm_data_loader_next(dl, 1, in, tg));
        LT_CHECK_OK(lm_data_loader_next(other, 1, in2, tg2));
        differs |= in[0] != in2[0];
        for (int t = 0; t < 4; t++) LT_CHECK(tg[t] == in[t] + 1); /* shifted by one, same shard */
        LT_CHECK(in[0] % 4 == 0);
        seen[in[0]]++;
    }
    int each_once = 1;
    for (int w = 0; w < 40; w += 4) each_once &= seen[w] == 1;       /* shard a: starts 0..36 */
    for (int w = 100; w < 116; w += 4) each_once &= seen[w] == 1;    /* shard b: starts 100..112 */
    LT_CHECK(each_once && differs);
    lm_data_loader_state mid = lm_data_loader_get_state(dl);
    LT_CHECK(mid.epoch == 0 && mid.cursor == 14);
    int32_t ref_in[8 * 3 * 4];
    for (int k = 0; k < 8; k++) LT_CHECK_OK(lm_data_loader_next(dl, 3, ref_in + k * 12, tg)); /* crosses epochs */
    LT_CHECK(lm_data_loader_get_state(dl).epoch >= 1);
    LT_CHECK_OK(lm_data_loader_create(2, paths, 4, 7, 1, &dl2));
    LT_CHECK_OK(lm_data_loader_set_state(dl2, &mid));
    int same = 1;
    for (int k = 0; k < 8; k++) {
        LT_CHECK_OK(lm_data_loader_next(dl2, 3, in, tg));
        same &= memcmp(in, ref_in + k * 12, sizeof in) == 0;
    }
    LT_CHECK(same);
    lm_data_loader_rewind(dl2);
    LT_CHECK(lm_data_loader_get_state(dl2).cursor == 0 && lm_data_loader_get_state(dl2).epoch == 0);
    lm_data_loader_state bad = mid;
    bad.cursor = 99;
    LT_CHECK_STATUS(lm_data_loader_set_state(dl2, &bad), LM_OUT_OF_RANGE);
    lm_data_loader *tiny = NULL;
    LT_CHECK_STATUS(lm_data_loader_create(1, paths + 1, 17, 1, 1, &tiny), LM_INVALID_ARGUMENT);
    lm_data_loader_destroy(dl);
    lm_data_loader_destroy(dl2);
    lm_data_loader_destroy(other);
}

static void test_unshuffled_loader_reads_in_order(void) {
    const char *paths[1] = {counting_shard("c.bin", 0, 25)};
    lm_data_loader *dl = NULL;
    LT_CHECK_OK(lm_data_loader_create(1, paths, 8, 1, 0, &dl));
    if (!dl) return;
    int32_t in[3 * 8], tg[3 * 8];
    LT_CHECK_OK(lm_data_loader_next(dl, 3, in, tg));
    LT_CHECK(in[0] == 0 && in[8] == 8 && in[16] == 16 && tg[23] == 24);
    lm_data_loader_destroy(dl);
}

static void test_atomic_write_replaces_whole_files(void) {
    const char *p = tmp_path("atomic.txt");
    LT_CHECK_OK(lm_file_write_atomic(p, "first version", 13));
    LT_CHECK_OK(lm_file_write_atomic(p, "second", 6));
    char *data = NULL;
    size_t n = 0;
    LT_CHECK_OK(lm_file_read_all(p, &data, &n));
    LT_CHECK(n == 6 && memcmp(data, "second", 6) == 0);
    lm_free(data);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", p, (long)getpid());
    LT_CHECK(access(tmp, F_OK) != 0); /* no temporary left behind */
    lm_atomic_file *f = NULL;
    LT_CHECK_OK(lm_atomic_file_open(p, &f));
    LT_CHECK_OK(lm_atomic_file_write(f, "abandoned", 9));
    lm_atomic_file_abort(f); /* the old file stays */
    LT_CHECK_OK(lm_file_read_all(p, &data, &n));
    LT_CHECK(n == 6 && access(tmp, F_OK) != 0);
    lm_free(data);
    LT_CHECK_STATUS(lm_file_write_atomic(LOOM_BINARY_DIR "/no/such/dir/x", "x", 1), LM_IO_ERROR);
}

static void test_safetensors_writer_round_trips(void) {
    lt_rng r = lt_rng_seed(3);
    int64_t s1[2] = {3, 5}, s2[1] = {7}, s3[3] = {2, 2, 3};
    lm_tensor *a = lt_random_tensor(&r, LM_F32, 2, s1, 1), *b = lt_random_tensor(&r, LM_BF16, 1, s2, 1);
    lm_tensor *c = lt_random_tensor(&r, LM_I64, 3, s3, 1), *e = NULL;
    int64_t zero = 0;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F16, 1, &zero, &e));
    lm_tensor_view at;
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(a), 0, 1, &at)); /* strided input */
    const char *names[4] = {"z.weight", "b.bias", "c.ids", "empty"};
    lm_tensor_view views[4] = {at, *lm_tensor_as_view(b), *lm_tensor_as_view(c), *lm_tensor_as_view(e)};
    const char *meta[] = {"format", "pt", "source", "loom", NULL};
    const char *p = tmp_path("w.safetensors");
    LT_CHECK_OK(lm_safetensors_write(g_ctx, p, 4, names, views, meta));
    lm_safetensors *st = NULL;
    LT_CHECK_OK(lm_safetensors_open(p, &st));
    if (st) {
        LT_CHECK(lm_safetensors_count(st) == 4);
        LT_CHECK(lm_safetensors_metadata(st, "source") && strcmp(lm_safetensors_metadata(st, "source"), "loom") == 0);
        for (int i = 0; i < 3; i++) {
            lm_safetensors_entry en;
            LT_CHECK_OK(lm_safetensors_find(st, names[i], &en));
            LT_CHECK(en.dtype == views[i].dtype && en.ndim == views[i].ndim);
            LT_CHECK(((uintptr_t)en.data % lm_dtype_size(en.dtype)) == 0); /* aligned in the file */
            double *want = lt_view_to_f64(&views[i]);
            lm_tensor_view got;
            LT_CHECK_OK(lm_tensor_view_init(&got, (void *)en.data, en.dtype, lm_device_cpu(), en.ndim, en.shape, NULL));
            double *gv = lt_view_to_f64(&got);
            LT_CHECK(memcmp(gv, want, sizeof(double) * (size_t)lm_tensor_view_numel(&got)) == 0);
            free(want), free(gv);
        }
    }
    lm_safetensors_close(st);
    const char *dup[2] = {"x", "x"};
    LT_CHECK_STATUS(lm_safetensors_write(g_ctx, p, 2, dup, views, NULL), LM_INVALID_ARGUMENT);
    lm_tensor_destroy(a), lm_tensor_destroy(b), lm_tensor_destroy(c), lm_tensor_destroy(e);
}

int main(void) {
    if (lm_ctx_create(lm_device_cpu(), 1, &g_ctx) != LM_OK) return 1;
    LT_RUN(test_shard_round_trip_and_header);
    LT_RUN(test_damaged_shards_fail_clearly);
    LT_RUN(test_prepare_tokenizes_files_with_a_separator);
    LT_RUN(test_loader_windows_epochs_and_resume);
    LT_RUN(test_unshuffled_loader_reads_in_order);
    LT_RUN(test_atomic_write_replaces_whole_files);
    LT_RUN(test_safetensors_writer_round_trips);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
