/* Tests for safetensors files and checkpoint directories, on files written by the
 * test itself: every dtype read back exactly, zero-copy tensors that outlive close,
 * unaligned data copied to aligned memory, sharded and single checkpoints, every
 * header corruption with its exact status and a detail naming file and tensor,
 * truncations and random header mutations that must never crash, and no leaks when
 * allocations fail.
 * LM_TEST_LABELS: unit
 */
#include "io_files.h"
#include "loom/safetensors.h"

#include <stdint.h>

static char *g_dir;

static int has(const char *needle) {
    if (strstr(lm_last_error(), needle)) return 1;
    fprintf(stderr, "  detail '%s' lacks '%s'\n", lm_last_error(), needle);
    return 0;
}

/* The fixture tensors: one of each dtype, a scalar, and an empty tensor. */
static float g_f32[6] = {1.5f, -2.25f, 3.0f, 0.0f, -0.125f, 1e-3f};
static uint16_t g_bf16[4], g_f16[6];
static int32_t g_i32[2] = {-7, 123456};
static int64_t g_i64[1] = {-((int64_t)1 << 40)};
static uint8_t g_u8[5] = {0, 1, 2, 254, 255};
static float g_scalar = 42.0f;

static int fixture(tw_tensor *t) {
    const float bf[4] = {1.0f, -0.5f, 3.140625f, 256.0f}, hf[6] = {0.5f, -1.0f, 2.0f, 65504.0f, -0.0f, 0.25f};
    for (int i = 0; i < 4; i++) g_bf16[i] = lm_f32_to_bf16(bf[i]);
    for (int i = 0; i < 6; i++) g_f16[i] = lm_f32_to_f16(hf[i]);
    int n = 0; /* laid out in this order: every offset is a multiple of its element size */
    t[n++] = (tw_tensor){"idx.i64", "I64", 2, {1, 1}, g_i64, sizeof g_i64};
    t[n++] = (tw_tensor){"w.f32", "F32", 2, {2, 3}, g_f32, sizeof g_f32};
    t[n++] = (tw_tensor){"idx.i32", "I32", 1, {2}, g_i32, sizeof g_i32};
    t[n++] = (tw_tensor){"scalar", "F32", 0, {0}, &g_scalar, 4};
    t[n++] = (tw_tensor){"w.bf16", "BF16", 1, {4}, g_bf16, sizeof g_bf16};
    t[n++] = (tw_tensor){"w.f16", "F16", 2, {3, 2}, g_f16, sizeof g_f16};
    t[n++] = (tw_tensor){"bytes.u8", "U8", 1, {5}, g_u8, sizeof g_u8};
    t[n++] = (tw_tensor){"empty", "F16", 2, {0, 7}, NULL, 0};
    return n;
}

static void check_entry_matches(const lm_safetensors_entry *e, const tw_tensor *t) {
    static const struct {
        const char *s;
        lm_dtype d;
    } map[] = {{"F32", LM_F32}, {"BF16", LM_BF16}, {"F16", LM_F16}, {"I32", LM_I32}, {"I64", LM_I64}, {"U8", LM_U8}};
    for (int i = 0; i < 6; i++)
        if (!strcmp(map[i].s, t->dtype)) LT_CHECK_MSG(e->dtype == map[i].d, "%s: dtype %d", t->name, (int)e->dtype);
    LT_CHECK(!strcmp(e->dtype_name, t->dtype));
    LT_CHECK_MSG(e->ndim == t->ndim, "%s: ndim %d", t->name, e->ndim);
    for (int d = 0; d < t->ndim; d++) LT_CHECK(e->shape[d] == t->shape[d]);
    LT_CHECK(e->nbytes == t->nbytes);
    if (t->nbytes) LT_CHECK_MSG(!memcmp(e->data, t->data, t->nbytes), "%s: bytes differ", t->name);
}

static void test_single_file_reads_every_dtype_in_name_order(void) {
    tw_tensor t[16];
    int n = fixture(t);
    char path[512];
    tw_path(path, sizeof path, g_dir, "all.safetensors");
    tw_write_safetensors(path, t, n, 0);
    lm_safetensors *st = NULL;
    LT_CHECK_OK(lm_safetensors_open(path, &st));
    if (!st) return;
    LT_CHECK(lm_safetensors_count(st) == n);
    LT_CHECK(!strcmp(lm_safetensors_path(st), path));
    LT_CHECK(lm_safetensors_metadata(st, "format") && !strcmp(lm_safetensors_metadata(st, "format"), "pt"));
    LT_CHECK(lm_safetensors_metadata(st, "missing") == NULL);
    const char *prev = "";
    for (int64_t i = 0; i < n; i++) {
        lm_safetensors_entry e;
        LT_CHECK_OK(lm_safetensors_info(st, i, &e));
        LT_CHECK_MSG(strcmp(prev, e.name) < 0, "entries not in name order: '%s' then '%s'", prev, e.name);
        prev = e.name;
        LT_CHECK(!strcmp(e.file, path));
        for (int k = 0; k < n; k++)
            if (!strcmp(t[k].name, e.name)) check_entry_matches(&e, &t[k]);
        if (e.nbytes) LT_CHECK_MSG((uintptr_t)e.data % lm_dtype_size(e.dtype) == 0, "%s misaligned", e.name);
    }
    lm_safetensors_entry e;
    LT_CHECK_OK(lm_safetensors_find(st, "w.f16", &e));
    LT_CHECK(lm_f16_to_f32(((const uint16_t *)e.data)[3]) == 65504.0f);
    LT_CHECK_STATUS(lm_safetensors_find(st, "nope", &e), LM_NOT_FOUND);
    LT_CHECK(has("'nope'") && has(path));
    LT_CHECK_STATUS(lm_safetensors_info(st, n, &e), LM_OUT_OF_RANGE);
    LT_CHECK_STATUS(lm_safetensors_info(st, -1, &e), LM_OUT_OF_RANGE);
    lm_safetensors_close(st);
    lm_safetensors_close(NULL);
}

static void test_zero_copy_tensors_survive_close(void) {
    tw_tensor t[16];
    int n = fixture(t);
    char path[512];
    tw_path(path, sizeof path, g_dir, "zc.safetensors");
    tw_write_safetensors(path, t, n, 0);
    lm_safetensors *st = NULL;
    LT_CHECK_OK(lm_safetensors_open(path, &st));
    if (!st) return;
    lm_tensor *f32 = NULL, *bf = NULL, *sc = NULL, *em = NULL;
    lm_safetensors_entry e;
    LT_CHECK_OK(lm_safetensors_find(st, "w.f32", &e));
    LT_CHECK_OK(lm_safetensors_tensor(st, "w.f32", &f32));
    LT_CHECK_OK(lm_safetensors_tensor(st, "w.bf16", &bf));
    LT_CHECK_OK(lm_safetensors_tensor(st, "scalar", &sc));
    LT_CHECK_OK(lm_safetensors_tensor(st, "empty", &em));
    lm_tensor *none = (lm_tensor *)1;
    LT_CHECK_STATUS(lm_safetensors_tensor(st, "missing", &none), LM_NOT_FOUND);
    LT_CHECK(none == NULL && has("'missing'") && has(path));
    LT_CHECK_MSG(lm_tensor_data(f32) == e.data, "tensor is not zero-copy over the mapping");
    lm_safetensors_close(st); /* tensors keep the mapping alive */
    LT_CHECK(lm_tensor_dtype(f32) == LM_F32 && lm_tensor_ndim(f32) == 2 && lm_tensor_dim(f32, 1) == 3);
    LT_CHECK(!memcmp(lm_tensor_data(f32), g_f32, sizeof g_f32));
    LT_CHECK(lm_tensor_dtype(bf) == LM_BF16 && lm_bf16_to_f32(((uint16_t *)lm_tensor_data(bf))[2]) == 3.140625f);
    LT_CHECK(lm_tensor_ndim(sc) == 0 && *(float *)lm_tensor_data(sc) == 42.0f);
    LT_CHECK(lm_tensor_numel(em) == 0 && lm_tensor_dim(em, 1) == 7);
    lm_tensor_destroy(f32);
    lm_tensor_destroy(em);
    LT_CHECK(*(float *)lm_tensor_data(sc) == 42.0f); /* the last references still work */
    lm_tensor_destroy(sc);
    LT_CHECK(lm_bf16_to_f32(((uint16_t *)lm_tensor_data(bf))[3]) == 256.0f);
    lm_tensor_destroy(bf);

    /* the same through a checkpoint directory */
    char dir[512], file[600];
    snprintf(dir, sizeof dir, "%s/zc_ck", g_dir);
    mkdir(dir, 0700);
    tw_path(file, sizeof file, dir, "model.safetensors");
    tw_write_safetensors(file, t, n, 0);
    lm_checkpoint *ck = NULL;
    LT_CHECK_OK(lm_checkpoint_open(dir, &ck));
    lm_tensor *w = NULL;
    LT_CHECK_OK(lm_checkpoint_tensor(ck, "w.f16", &w));
    lm_checkpoint_close(ck);
    LT_CHECK(w && lm_f16_to_f32(((uint16_t *)lm_tensor_data(w))[0]) == 0.5f);
    lm_tensor_destroy(w);
    tw_rmtree(dir);
}

static void test_unaligned_data_is_copied_to_aligned_memory(void) {
    tw_tensor t[16];
    int n = fixture(t);
    char path[512];
    tw_path(path, sizeof path, g_dir, "unaligned.safetensors");
    tw_write_safetensors(path, t, n, 1);
    lm_safetensors *st = NULL;
    LT_CHECK_OK(lm_safetensors_open(path, &st));
    if (!st) return;
    lm_safetensors_entry e;
    LT_CHECK_OK(lm_safetensors_find(st, "w.f32", &e));
    LT_CHECK_MSG((uintptr_t)e.data % 4 != 0, "fixture should place w.f32 at an unaligned address");
    float first;
    memcpy(&first, e.data, 4); /* the documented way to read unaligned entries */
    LT_CHECK(first == 1.5f);
    lm_tensor *a = NULL, *b = NULL;
    LT_CHECK_OK(lm_safetensors_tensor(st, "w.f32", &a));
    LT_CHECK_OK(lm_safetensors_tensor(st, "bytes.u8", &b));
    lm_safetensors_close(st);
    LT_CHECK(lm_tensor_data(a) != e.data && (uintptr_t)lm_tensor_data(a) % 4 == 0);
    LT_CHECK(((float *)lm_tensor_data(a))[5] == 1e-3f);
    LT_CHECK(!memcmp(lm_tensor_data(b), g_u8, 5)); /* bytes are always aligned: zero-copy */
    lm_tensor_destroy(a);
    lm_tensor_destroy(b);
}

static void write_shards(const char *dir, const char *index) {
    static float a[4] = {1, 2, 3, 4}, b[2] = {5, 6}, c[3] = {7, 8, 9}, d[1] = {10};
    tw_tensor s1[2] = {{"model.a", "F32", 2, {2, 2}, a, 16}, {"model.b", "F32", 1, {2}, b, 8}};
    tw_tensor s2[3] = {{"model.c", "F32", 1, {3}, c, 12}, {"lm_head.weight", "F32", 1, {1}, d, 4},
                       {"unlisted", "F32", 1, {1}, d, 4}};
    char p[600];
    tw_path(p, sizeof p, dir, "model-00001-of-00002.safetensors");
    tw_write_safetensors(p, s1, 2, 0);
    tw_path(p, sizeof p, dir, "model-00002-of-00002.safetensors");
    tw_write_safetensors(p, s2, 3, 0);
    tw_path(p, sizeof p, dir, "model.safetensors.index.json");
    tw_write_text(p, index);
}

static const char *k_index =
    "{\"metadata\": {\"total_size\": 40}, \"weight_map\": {"
    "\"model.b\": \"model-00001-of-00002.safetensors\", \"model.a\": \"model-00001-of-00002.safetensors\","
    "\"lm_head.weight\": \"model-00002-of-00002.safetensors\", \"model.c\": \"model-00002-of-00002.safetensors\"}}";

static void test_sharded_checkpoint_resolves_each_tensor_in_its_shard(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/sharded", g_dir);
    mkdir(dir, 0700);
    write_shards(dir, k_index);
    lm_checkpoint *ck = NULL;
    LT_CHECK_OK(lm_checkpoint_open(dir, &ck));
    if (!ck) return;
    LT_CHECK(lm_checkpoint_count(ck) == 4 && lm_checkpoint_file_count(ck) == 2);
    const char *want[4] = {"lm_head.weight", "model.a", "model.b", "model.c"};
    for (int i = 0; i < 4; i++) LT_CHECK(!strcmp(lm_checkpoint_name(ck, i), want[i]));
    LT_CHECK(lm_checkpoint_name(ck, 4) == NULL && lm_checkpoint_name(ck, -1) == NULL);
    lm_safetensors_entry e;
    LT_CHECK_OK(lm_checkpoint_find(ck, "model.c", &e));
    LT_CHECK(strstr(e.file, "model-00002-of-00002.safetensors") && ((const float *)e.data)[2] == 9.0f);
    LT_CHECK_OK(lm_checkpoint_find(ck, "model.a", &e));
    LT_CHECK(strstr(e.file, "model-00001-of-00002.safetensors") && e.shape[0] == 2 && e.shape[1] == 2);
    LT_CHECK_STATUS(lm_checkpoint_find(ck, "unlisted", &e), LM_NOT_FOUND); /* not in the weight map */
    LT_CHECK(has("'unlisted'") && has(dir));
    LT_CHECK_STATUS(lm_checkpoint_find(ck, "model.layers.3.mlp.up_proj.weight", &e), LM_NOT_FOUND);
    LT_CHECK(has("model.layers.3.mlp.up_proj.weight") && has(dir));
    lm_tensor *t = NULL;
    LT_CHECK_OK(lm_checkpoint_tensor(ck, "model.b", &t));
    lm_checkpoint_close(ck);
    LT_CHECK(t && ((float *)lm_tensor_data(t))[1] == 6.0f);
    lm_tensor_destroy(t);
    lm_checkpoint_close(NULL);
    tw_rmtree(dir);
}

static void test_checkpoint_accepts_single_file_dir_and_file_path(void) {
    char dir[512], file[600];
    snprintf(dir, sizeof dir, "%s/single", g_dir);
    mkdir(dir, 0700);
    tw_tensor t[16];
    int n = fixture(t);
    tw_path(file, sizeof file, dir, "model.safetensors");
    tw_write_safetensors(file, t, n, 0);
    const char *paths[2] = {dir, file};
    for (int k = 0; k < 2; k++) {
        lm_checkpoint *ck = NULL;
        LT_CHECK_OK(lm_checkpoint_open(paths[k], &ck));
        if (!ck) continue;
        LT_CHECK(lm_checkpoint_count(ck) == n && lm_checkpoint_file_count(ck) == 1);
        LT_CHECK(!strcmp(lm_checkpoint_path(ck), paths[k]));
        lm_safetensors_entry e;
        LT_CHECK_OK(lm_checkpoint_find(ck, "idx.i64", &e));
        LT_CHECK(e.dtype == LM_I64 && *(const int64_t *)e.data == g_i64[0]);
        lm_checkpoint_close(ck);
    }
    /* model.safetensors wins over an index, as in transformers (this index is broken) */
    char p[600];
    tw_path(p, sizeof p, dir, "model.safetensors.index.json");
    tw_write_text(p, "{\"weight_map\": {\"x\": \"missing.safetensors\"}}");
    lm_checkpoint *ck = NULL;
    LT_CHECK_OK(lm_checkpoint_open(dir, &ck));
    LT_CHECK(ck && lm_checkpoint_count(ck) == n);
    lm_checkpoint_close(ck);
    tw_rmtree(dir);
}

/* Writes one index variant into a fresh directory and expects open to fail. */
static void expect_index_failure(const char *index, lm_status want, const char *n1, const char *n2) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/badindex", g_dir);
    mkdir(dir, 0700);
    write_shards(dir, index);
    lm_checkpoint *ck = (lm_checkpoint *)1;
    LT_CHECK_STATUS(lm_checkpoint_open(dir, &ck), want);
    LT_CHECK(ck == NULL);
    if (n1) LT_CHECK(has(n1));
    if (n2) LT_CHECK(has(n2));
    tw_rmtree(dir);
}

static void test_checkpoint_errors_name_the_problem(void) {
    char empty[512], missing[512];
    snprintf(empty, sizeof empty, "%s/empty", g_dir);
    snprintf(missing, sizeof missing, "%s/does-not-exist", g_dir);
    mkdir(empty, 0700);
    lm_checkpoint *ck = NULL;
    LT_CHECK_STATUS(lm_checkpoint_open(empty, &ck), LM_NOT_FOUND);
    LT_CHECK(has(empty) && has("model.safetensors"));
    rmdir(empty);
    LT_CHECK_STATUS(lm_checkpoint_open(missing, &ck), LM_NOT_FOUND);
    LT_CHECK(has(missing));
    LT_CHECK_STATUS(lm_checkpoint_open(NULL, &ck), LM_INVALID_ARGUMENT);

    expect_index_failure("{\"weight_map\": {\"model.a\": ", LM_PARSE_ERROR, "model.safetensors.index.json", "line 1");
    expect_index_failure("{\"metadata\": {}}", LM_PARSE_ERROR, "weight_map", "model.safetensors.index.json");
    expect_index_failure("{\"weight_map\": [\"model.a\"]}", LM_PARSE_ERROR, "weight_map", NULL);
    expect_index_failure("{\"weight_map\": {\"model.a\": \"model-00009-of-00009.safetensors\"}}", LM_NOT_FOUND,
                         "model-00009-of-00009.safetensors", "'model.a'");
    expect_index_failure("{\"weight_map\": {\"model.zz\": \"model-00001-of-00002.safetensors\"}}", LM_NOT_FOUND,
                         "'model.zz'", "model-00001-of-00002.safetensors");
    expect_index_failure("{\"weight_map\": {\"model.a\": 3}}", LM_PARSE_ERROR, "'model.a'", NULL);
    expect_index_failure("{\"weight_map\": {\"model.a\": \"../model-00001-of-00002.safetensors\"}}", LM_PARSE_ERROR,
                         "outside the directory", "'model.a'");
    expect_index_failure("{\"weight_map\": {\"model.a\": \"/etc/passwd\"}}", LM_PARSE_ERROR, "outside", NULL);
    expect_index_failure("{\"weight_map\": {\"model.a\": \"x\", \"model.a\": \"y\"}}", LM_PARSE_ERROR, "duplicate",
                         NULL);

    /* a corrupt shard reports the shard's own error */
    char dir[512], p[600];
    snprintf(dir, sizeof dir, "%s/badshard", g_dir);
    mkdir(dir, 0700);
    write_shards(dir, k_index);
    tw_path(p, sizeof p, dir, "model-00002-of-00002.safetensors");
    tw_write_bytes(p, "\x03\0\0\0", 4);
    LT_CHECK_STATUS(lm_checkpoint_open(dir, &ck), LM_PARSE_ERROR);
    LT_CHECK(has("model-00002-of-00002.safetensors") && has("shorter than"));
    tw_rmtree(dir);
}

typedef struct corrupt_case {
    const char *header;   /* JSON text */
    int64_t declared;     /* header length field; -1 = the real length */
    size_t data_len;      /* zero bytes after the header */
    lm_status want;
    const char *needle1, *needle2; /* substrings the detail must contain (besides the path) */
} corrupt_case;

static void test_header_corruptions_fail_with_named_details(void) {
    static const corrupt_case cases[] = {
        {"{}", (int64_t)LM_SAFETENSORS_MAX_HEADER + 1, 0, LM_PARSE_ERROR, "header length", "limit"},
        {"{}", 64, 0, LM_PARSE_ERROR, "header length 64", "exceeds"},
        {"{\"a\": ", -1, 0, LM_PARSE_ERROR, "not valid JSON", "line 1"},
        {"[1, 2]", -1, 0, LM_PARSE_ERROR, "not a JSON object", NULL},
        {"{\"t\": 5}", -1, 0, LM_PARSE_ERROR, "'t'", "not an object"},
        {"{\"t\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", -1, 4, LM_PARSE_ERROR, "'t'", "\"dtype\""},
        {"{\"t\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", -1, 4, LM_PARSE_ERROR, "'t'", "\"shape\""},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1]}}", -1, 4, LM_PARSE_ERROR, "'t'", "\"data_offsets\""},
        {"{\"t\": {\"dtype\": 7, \"shape\": [1], \"data_offsets\": [0, 4]}}", -1, 4, LM_PARSE_ERROR, "'t'", "dtype"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": 4, \"data_offsets\": [0, 16]}}", -1, 16, LM_PARSE_ERROR, "'t'",
         "not an array"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [2, -2], \"data_offsets\": [0, 16]}}", -1, 16, LM_PARSE_ERROR, "'t'",
         "shape[1]"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 8]}}", -1, 8, LM_PARSE_ERROR, "'t'",
         "shape[0]"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", -1, 8, LM_PARSE_ERROR, "'t'",
         "begin > end"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4]}}", -1, 8, LM_PARSE_ERROR, "'t'",
         "[begin, end]"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", -1, 8, LM_PARSE_ERROR, "'t'",
         "[begin, end]"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", -1, 12, LM_PARSE_ERROR, "'t'",
         "beyond"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 12]}}", -1, 16, LM_PARSE_ERROR, "'t'",
         "[2,2]"},
        {"{\"t\": {\"dtype\": \"BF16\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 8]}}", -1, 8,
         LM_PARSE_ERROR, "'t'", "overflows"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
         " \"b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}}",
         -1, 24, LM_PARSE_ERROR, "'a'", "overlap"},
        {"{\"__metadata__\": [1]}", -1, 0, LM_PARSE_ERROR, "__metadata__", NULL},
        {"{\"__metadata__\": {\"k\": 1}}", -1, 0, LM_PARSE_ERROR, "__metadata__", "'k'"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
         " \"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
         -1, 8, LM_PARSE_ERROR, "duplicate", NULL},
    };
    char path[512];
    tw_path(path, sizeof path, g_dir, "corrupt.safetensors");
    uint8_t zeros[64] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const corrupt_case *c = &cases[i];
        tw_write_raw(path, c->declared < 0 ? strlen(c->header) : (uint64_t)c->declared, c->header, zeros, c->data_len);
        lm_safetensors *st = (lm_safetensors *)1;
        lm_status s = lm_safetensors_open(path, &st);
        LT_CHECK_MSG(s == c->want, "case %zu (%s): got %s (%s)", i, c->header, lm_status_name(s), lm_last_error());
        LT_CHECK(st == NULL);
        LT_CHECK_MSG(has(path) && has(c->needle1) && (!c->needle2 || has(c->needle2)), "case %zu", i);
    }
    /* shorter than the length field */
    tw_write_bytes(path, "\x02\0\0\0\0", 5);
    lm_safetensors *st = NULL;
    LT_CHECK_STATUS(lm_safetensors_open(path, &st), LM_PARSE_ERROR);
    LT_CHECK(has(path) && has("5 bytes"));
    tw_write_bytes(path, "", 0);
    LT_CHECK_STATUS(lm_safetensors_open(path, &st), LM_PARSE_ERROR);
    LT_CHECK(has("0 bytes"));
    unlink(path);
    LT_CHECK_STATUS(lm_safetensors_open(path, &st), LM_IO_ERROR);
    LT_CHECK(has(path));
}

static void test_unsupported_dtypes_and_ranks_are_listed_but_refused(void) {
    const char *h = "{\"d\": {\"dtype\": \"F64\", \"shape\": [2], \"data_offsets\": [0, 16]},"
                    " \"q\": {\"dtype\": \"Q4_K\", \"shape\": [3], \"data_offsets\": [16, 21]},"
                    " \"r\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [21, 22]},"
                    " \"z\": {\"dtype\": \"F4\", \"shape\": [3], \"data_offsets\": [22, 24]}}";
    char path[512];
    tw_path(path, sizeof path, g_dir, "unsupported.safetensors");
    uint8_t data[24] = {0};
    tw_write_raw(path, strlen(h), h, data, sizeof data);
    lm_safetensors *st = NULL;
    LT_CHECK_STATUS(lm_safetensors_open(path, &st), LM_PARSE_ERROR); /* F4 x 3 = 12 bits: not 2 bytes */
    LT_CHECK(has("'z'"));
    const char *h2 = "{\"d\": {\"dtype\": \"F64\", \"shape\": [2], \"data_offsets\": [0, 16]},"
                     " \"q\": {\"dtype\": \"Q4_K\", \"shape\": [3], \"data_offsets\": [16, 21]},"
                     " \"r\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [21, 22]},"
                     " \"z\": {\"dtype\": \"F4\", \"shape\": [4], \"data_offsets\": [22, 24]}}";
    tw_write_raw(path, strlen(h2), h2, data, sizeof data);
    LT_CHECK_OK(lm_safetensors_open(path, &st));
    if (!st) return;
    LT_CHECK(lm_safetensors_count(st) == 4);
    lm_safetensors_entry e;
    lm_tensor *t = NULL;
    LT_CHECK_STATUS(lm_safetensors_find(st, "d", &e), LM_UNSUPPORTED);
    LT_CHECK(has("'d'") && has("'F64'") && has(path));
    LT_CHECK(!strcmp(e.name, "d") && !strcmp(e.dtype_name, "F64") && !lm_dtype_valid(e.dtype) && e.nbytes == 16);
    LT_CHECK_STATUS(lm_safetensors_find(st, "q", &e), LM_UNSUPPORTED);
    LT_CHECK(has("'Q4_K'"));
    LT_CHECK_STATUS(lm_safetensors_find(st, "r", &e), LM_UNSUPPORTED);
    LT_CHECK(has("'r'") && has("9 dimensions"));
    LT_CHECK_STATUS(lm_safetensors_tensor(st, "d", &t), LM_UNSUPPORTED);
    LT_CHECK(t == NULL);
    lm_safetensors_close(st);
}

/* Opens path; when it succeeds every entry must lie inside the file (read each byte)
 * and every supported tensor must be constructible. Returns the status. */
static lm_status open_and_touch(const char *path, size_t file_size) {
    lm_safetensors *st = NULL;
    lm_status s = lm_safetensors_open(path, &st);
    if (s != LM_OK) return s;
    for (int64_t i = 0; i < lm_safetensors_count(st); i++) {
        lm_safetensors_entry e;
        lm_status si = lm_safetensors_info(st, i, &e);
        LT_CHECK(si == LM_OK || si == LM_UNSUPPORTED);
        LT_CHECK(e.nbytes <= file_size);
        unsigned sum = 0;
        for (size_t b = 0; b < e.nbytes; b++) sum += ((const uint8_t *)e.data)[b];
        (void)sum;
        lm_tensor *t = NULL;
        if (si == LM_OK) LT_CHECK_OK(lm_safetensors_tensor(st, e.name, &t));
        lm_tensor_destroy(t);
    }
    lm_safetensors_close(st);
    return LM_OK;
}

static void test_truncated_and_mutated_headers_never_crash(void) {
    tw_tensor t[16];
    int n = fixture(t);
    size_t size;
    uint8_t *good = tw_build(t, n, 0, &size);
    uint8_t *buf = malloc(size);
    char path[512];
    tw_path(path, sizeof path, g_dir, "fuzz.safetensors");
    int opened = 0;
    for (size_t len = 0; len < size; len++) { /* every truncation */
        tw_write_bytes(path, good, len);
        lm_status s = open_and_touch(path, len);
        LT_CHECK_MSG(s == LM_PARSE_ERROR, "truncated to %zu: %s", len, lm_status_name(s));
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | good[i];
    lt_rng r = lt_rng_seed(99);
    for (int trial = 0; trial < 400; trial++) {
        memcpy(buf, good, size);
        int flips = (int)lt_rng_int(&r, 1, 4);
        for (int f = 0; f < flips; f++) {
            /* every tenth mutant hits the length field, the rest the JSON header */
            size_t at = trial % 10 == 0 ? (size_t)lt_rng_int(&r, 0, 7)
                                        : (size_t)lt_rng_int(&r, 8, 8 + (int64_t)hlen - 1);
            static const uint8_t pick[] = {'"', '{', '}', '[', ']', ',', ':', '-', '0', '9', ' ', 0, 0xff};
            buf[at] = lt_rng_int(&r, 0, 1) ? pick[lt_rng_int(&r, 0, sizeof pick - 1)]
                                           : (uint8_t)(buf[at] ^ (1u << lt_rng_int(&r, 0, 7)));
        }
        tw_write_bytes(path, buf, size);
        lm_status s = open_and_touch(path, size);
        LT_CHECK_MSG(s == LM_OK || s == LM_PARSE_ERROR, "mutant %d: %s (%s)", trial, lm_status_name(s),
                     lm_last_error());
        opened += s == LM_OK;
    }
    printf("  400 mutants: %d opened, %d rejected\n", opened, 400 - opened);
    free(buf);
    free(good);
    unlink(path);
}

static void test_open_leaks_nothing_when_allocation_fails(void) {
    tw_tensor t[16];
    int n = fixture(t);
    char path[512], dir[512];
    tw_path(path, sizeof path, g_dir, "oom.safetensors");
    tw_write_safetensors(path, t, n, 0);
    snprintf(dir, sizeof dir, "%s/oom_sharded", g_dir);
    mkdir(dir, 0700);
    write_shards(dir, k_index);
    for (int which = 0; which < 2; which++) {
        for (int k = 1; k <= 200; k++) {
            lt_alloc_track(k);
            lm_safetensors *st = NULL;
            lm_checkpoint *ck = NULL;
            lm_tensor *tt = NULL;
            lm_status s = which ? lm_checkpoint_open(dir, &ck) : lm_safetensors_open(path, &st);
            if (s == LM_OK)
                s = which ? lm_checkpoint_tensor(ck, "model.c", &tt) : lm_safetensors_tensor(st, "w.f32", &tt);
            int64_t attempts = lt_alloc_count();
            if (k <= attempts) LT_CHECK_MSG(s == LM_OUT_OF_MEMORY, "fail_at %d: %s", k, lm_status_name(s));
            else LT_CHECK_OK(s);
            lm_tensor_destroy(tt);
            lm_safetensors_close(st);
            lm_checkpoint_close(ck);
            LT_CHECK_MSG(lt_alloc_live() == 0, "which %d fail_at %d: %lld allocations leaked", which, k,
                         (long long)lt_alloc_live());
            lt_alloc_untrack();
            if (k > attempts) break;
        }
    }
    tw_rmtree(dir);
}

int main(void) {
    g_dir = tw_tmpdir();
    if (!g_dir) return lt_finish();
    LT_RUN(test_single_file_reads_every_dtype_in_name_order);
    LT_RUN(test_zero_copy_tensors_survive_close);
    LT_RUN(test_unaligned_data_is_copied_to_aligned_memory);
    LT_RUN(test_sharded_checkpoint_resolves_each_tensor_in_its_shard);
    LT_RUN(test_checkpoint_accepts_single_file_dir_and_file_path);
    LT_RUN(test_checkpoint_errors_name_the_problem);
    LT_RUN(test_header_corruptions_fail_with_named_details);
    LT_RUN(test_unsupported_dtypes_and_ranks_are_listed_but_refused);
    LT_RUN(test_truncated_and_mutated_headers_never_crash);
    LT_RUN(test_open_leaks_nothing_when_allocation_fails);
    tw_rmtree(g_dir);
    free(g_dir);
    return lt_finish();
}
