/* The forward pass against Hugging Face transformers: for every reference checkpoint
 * in tests/data/models (scripts/make_reference_models.sh) the logits of three prompts
 * at every position, the greedy continuations and the KV-cache decode logits must
 * match refs.lmfx (scripts/gen_model_refs.py, transformers in float32).
 * Gate: max |dlogit| <= 1e-4 * max |logit| (f32 compute on both sides; the
 * differences come from summation order and RoPE angles computed in double here and
 * float32 there, both ~1e-6 relative). Greedy tokens must be identical.
 * Also: batched prefill and batched decode at different positions equal single-row
 * runs, bad requests fail without touching the cache, and every matrix of a host model
 * starts on a 64-byte boundary with the checkpoint's bytes (mapped matrices that were
 * not aligned in the file are copied).
 * LM_TEST_LABELS: unit model
 */
#include "harness.h"
#include "loom/model.h"
#include "loom/safetensors.h"
#include "nn/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *k_models[] = {"llama_gqa2_f32",  "llama3_scaled_bf16", "llama_linear_f16", "mistral_mha_f16",
                                 "qwen2_bias_sharded", "qwen2_mqa_yarn",  "qwen3_headdim",
                                 "mistral_window_f32", "qwen2_window_bf16"};
#define NMODELS (int)(sizeof k_models / sizeof k_models[0])

static lm_ctx *g_ctx;

static lm_model *load(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/models/%s", LOOM_SOURCE_DIR, name);
    lm_model *m = NULL;
    LT_CHECK_OK(lm_model_load(dir, lm_device_cpu(), &m));
    return m;
}

/* max |got - want| over n, relative to max |want| */
static double rel_maxdiff(const float *got, const double *want, int64_t n) {
    double md = 0, mw = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= md)) md = d; /* NaN propagates */
        if (fabs(want[i]) > mw) mw = fabs(want[i]);
    }
    return md / (mw > 0 ? mw : 1);
}

static int32_t argmax(const float *row, int64_t V) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (row[i] > row[best]) best = i;
    return (int32_t)best;
}

static void check_model(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "tests/data/models/%s/refs.lmfx", name);
    lt_fixture fx;
    if (!lt_fixture_load(path, &fx)) return;
    lm_model *m = load(name);
    if (!m) {
        lt_fixture_free(&fx);
        return;
    }
    int64_t V = lm_model_get_config(m)->vocab_size;
    for (int p = 0; p < 3; p++) {
        char key[64];
        snprintf(key, sizeof key, "prompt%d_ids", p);
        const lt_fixture_tensor *ids = lt_fixture_get(&fx, key);
        snprintf(key, sizeof key, "prompt%d_logits", p);
        const lt_fixture_tensor *want = lt_fixture_get(&fx, key);
        snprintf(key, sizeof key, "prompt%d_greedy", p);
        const lt_fixture_tensor *greedy = lt_fixture_get(&fx, key);
        if (!ids || !want || !greedy) break;
        int64_t T = ids->numel, S = greedy->numel;
        int32_t *seq = malloc(sizeof(int32_t) * (size_t)(T + S));
        for (int64_t i = 0; i < T; i++) seq[i] = (int32_t)ids->i64[i];
        lm_kv_cache *cache = NULL;
        LT_CHECK_OK(lm_kv_cache_create(m, 1, T + S, &cache));
        float *logits = malloc(sizeof(float) * (size_t)(T * V));
        for (int64_t i = 0; i < T * V; i++) logits[i] = NAN;
        int slot = 0;
        LT_CHECK_OK(lm_model_forward(m, g_ctx, cache, &slot, 1, seq, T, logits, 1));
        double d = rel_maxdiff(logits, want->f64, T * V);
        LT_CHECK_MSG(d <= 1e-4, "%s prompt %d: logits max rel diff %.3g", name, p, d);
        /* greedy decode through the cache, one token at a time */
        const lt_fixture_tensor *step_logits = NULL;
        if (p == 0) step_logits = lt_fixture_get(&fx, "prompt0_greedy_logits");
        int32_t next = argmax(logits + (T - 1) * V, V);
        for (int64_t s = 0; s < S; s++) {
            seq[T + s] = next;
            LT_CHECK_MSG(next == greedy->i64[s], "%s prompt %d: greedy token %lld is %d, transformers %lld", name, p,
                         (long long)s, next, (long long)greedy->i64[s]);
            if (next != greedy->i64[s]) break;
            if (s + 1 == S) break;
            LT_CHECK_OK(lm_model_forward(m, g_ctx, cache, &slot, 1, &seq[T + s], 1, logits, 0));
            if (step_logits) {
                double ds = rel_maxdiff(logits, step_logits->f64 + (s + 1) * V, V);
                LT_CHECK_MSG(ds <= 1e-4, "%s decode step %lld: logits max rel diff %.3g", name, (long long)s + 1, ds);
            }
            next = argmax(logits, V);
        }
        free(logits);
        free(seq);
        lm_kv_cache_destroy(cache);
    }
    lm_model_destroy(m);
    lt_fixture_free(&fx);
}

static void test_logits_and_greedy_match_transformers(void) {
    for (int i = 0; i < NMODELS; i++) check_model(k_models[i]);
}

/* Two rows prefilled together, then decoded together at different lengths, must give
 * the same logits as each row alone. */
static void test_batched_rows_equal_single_rows(void) {
    lm_model *m = load("qwen3_headdim");
    if (!m) return;
    int64_t V = lm_model_get_config(m)->vocab_size;
    int32_t a[6] = {5, 17, 33, 2, 9, 41}, b[6] = {7, 7, 100, 3, 60, 1};
    lm_kv_cache *batch = NULL, *solo = NULL;
    LT_CHECK_OK(lm_kv_cache_create(m, 3, 16, &batch));
    LT_CHECK_OK(lm_kv_cache_create(m, 1, 16, &solo));
    float *lb = malloc(sizeof(float) * 2 * (size_t)V), *ls = malloc(sizeof(float) * (size_t)V);
    int slots[2] = {2, 0}, s0 = 0;
    int32_t ids[8] = {a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]};
    LT_CHECK_OK(lm_model_forward(m, g_ctx, batch, slots, 2, ids, 4, lb, 0));
    /* row b gets one extra token alone, so the decode below runs at positions 4 and 5 */
    LT_CHECK_OK(lm_model_forward(m, g_ctx, batch, &slots[1], 1, &b[4], 1, NULL, 0));
    int32_t step[2] = {a[4], b[5]};
    LT_CHECK_OK(lm_model_forward(m, g_ctx, batch, slots, 2, step, 1, lb, 0));
    LT_CHECK(lm_kv_cache_length(batch, 2) == 5 && lm_kv_cache_length(batch, 0) == 6);
    for (int row = 0; row < 2; row++) {
        const int32_t *seq = row ? b : a;
        int64_t n = row ? 6 : 5;
        LT_CHECK_OK(lm_kv_cache_reset(solo, 0));
        LT_CHECK_OK(lm_model_forward(m, g_ctx, solo, &s0, 1, seq, n, ls, 0));
        double md = 0;
        for (int64_t i = 0; i < V; i++) md = fmax(md, fabs(lb[row * V + i] - ls[i]));
        LT_CHECK_MSG(md < 1e-4, "row %d: batched vs single max diff %g", row, md);
    }
    free(lb), free(ls);
    lm_kv_cache_destroy(batch);
    lm_kv_cache_destroy(solo);
    lm_model_destroy(m);
}

/* A paged cache (blocks of 4 positions) gives the contiguous cache's logits: two
 * prompts prefilled together at random blocks, a third sequence that shares the
 * first prompt's first block (a common 4-token prefix) and prefills only its tail,
 * then decode steps of all three at different positions crossing block boundaries;
 * each row equals the same sequence run alone in a slot. Refusals: a block outside
 * the pool, two rows writing one block, a row past its table, the slot API on a paged
 * cache; nothing is stored by a refused step. */
static void test_paged_cache_equals_slots(void) {
    lm_model *m = load("qwen3_headdim");
    if (!m) return;
    int64_t V = lm_model_get_config(m)->vocab_size;
    enum { NB = 4, BS = 4 };
    lm_kv_cache *paged = NULL, *solo = NULL;
    LT_CHECK_OK(lm_kv_cache_create_paged(m, 20, BS, NB, &paged));
    LT_CHECK_OK(lm_kv_cache_create(m, 1, NB * BS, &solo));
    LT_CHECK(lm_kv_cache_blocks_per_row(paged) == NB && lm_kv_cache_blocks_per_row(solo) == 0);
    int32_t seq[3][12] = {{5, 17, 33, 2, 9, 41, 8, 90, 12, 3, 77, 6},
                          {7, 7, 100, 3, 60, 1, 4, 4, 200, 31, 2, 9},
                          {5, 17, 33, 2, 50, 51, 52, 53, 54, 55, 56, 57}}; /* seq 2 shares seq 0's first block */
    int32_t tab[3][NB] = {{11, 3, 17, 0}, {6, 19, 2, 14}, {11, 8, 5, 9}};
    float *lp = malloc(sizeof(float) * 3 * (size_t)V), *ls = malloc(sizeof(float) * (size_t)V);
    int64_t len[3] = {0, 0, 0};
    /* prefill rows 0 and 1 (6 tokens each), then row 2's tail after the shared block */
    int32_t ids01[12], t01[2 * NB];
    memcpy(ids01, seq[0], 6 * sizeof(int32_t)), memcpy(ids01 + 6, seq[1], 6 * sizeof(int32_t));
    memcpy(t01, tab[0], sizeof tab[0]), memcpy(t01 + NB, tab[1], sizeof tab[1]);
    LT_CHECK_OK(lm_model_forward_paged(m, g_ctx, paged, t01, len, 2, ids01, 6, lp, 0));
    len[0] = len[1] = 6, len[2] = 4;
    LT_CHECK_OK(lm_model_forward_paged(m, g_ctx, paged, tab[2], &len[2], 1, seq[2] + 4, 2, lp + 2 * V, 0));
    len[2] = 6;
    /* decode: all three rows, 5 steps (positions 6..10 cross the block at 8) */
    for (int step = 0; step < 5; step++) {
        int32_t ids[3] = {seq[0][len[0]], seq[1][len[1]], seq[2][len[2]]};
        LT_CHECK_OK(lm_model_forward_paged(m, g_ctx, paged, &tab[0][0], len, 3, ids, 1, lp, 0));
        for (int r = 0; r < 3; r++) len[r]++;
    }
    for (int r = 0; r < 3; r++) { /* each sequence alone in a slot: the same last logits */
        int s0 = 0;
        LT_CHECK_OK(lm_kv_cache_reset(solo, 0));
        LT_CHECK_OK(lm_model_forward(m, g_ctx, solo, &s0, 1, seq[r], 11, ls, 0));
        double md = 0;
        for (int64_t i = 0; i < V; i++) md = fmax(md, fabs(lp[r * V + i] - ls[i]));
        LT_CHECK_MSG(md < 1e-4, "row %d: paged vs slot max diff %g", r, md);
    }
    /* refusals: nothing stored (the next valid step still equals the slot run) */
    int32_t bad[NB] = {11, 3, 20, 0}, twice[2 * NB] = {11, 3, 17, 0, 6, 19, 17, 14};
    int64_t at8[1] = {8}, at15[1] = {15}, at10[2] = {10, 10};
    int32_t one = 5, two[2] = {5, 6};
    LT_CHECK_STATUS(lm_model_forward_paged(m, g_ctx, paged, bad, at8, 1, &one, 1, NULL, 0), LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "block 20") != NULL);
    LT_CHECK_STATUS(lm_model_forward_paged(m, g_ctx, paged, twice, at10, 2, two, 1, NULL, 0), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_model_forward_paged(m, g_ctx, paged, tab[0], at15, 1, two, 2, NULL, 0), LM_OUT_OF_RANGE);
    int s0 = 0;
    LT_CHECK_STATUS(lm_model_forward(m, g_ctx, paged, &s0, 1, &one, 1, NULL, 0), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_model_forward_paged(m, g_ctx, solo, tab[0], at8, 1, &one, 1, NULL, 0), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_kv_cache_reset(paged, 0), LM_INVALID_ARGUMENT);
    free(lp), free(ls);
    lm_kv_cache_destroy(paged);
    lm_kv_cache_destroy(solo);
    lm_model_destroy(m);
}

static void test_bad_requests_leave_the_cache_untouched(void) {
    lm_model *m = load("llama_gqa2_f32");
    if (!m) return;
    lm_kv_cache *c = NULL;
    LT_CHECK_OK(lm_kv_cache_create(m, 2, 4, &c));
    int slot = 0, bad_slot = 5, dup[2] = {1, 1};
    int32_t ids[5] = {1, 2, 3, 4, 5}, bad_id = 1 << 20;
    LT_CHECK_STATUS(lm_model_forward(m, g_ctx, c, &slot, 1, ids, 5, NULL, 0), LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "capacity") != NULL);
    LT_CHECK_STATUS(lm_model_forward(m, g_ctx, c, &slot, 1, &bad_id, 1, NULL, 0), LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "vocabulary") != NULL);
    LT_CHECK_STATUS(lm_model_forward(m, g_ctx, c, &bad_slot, 1, ids, 1, NULL, 0), LM_OUT_OF_RANGE);
    LT_CHECK_STATUS(lm_model_forward(m, g_ctx, c, dup, 2, ids, 1, NULL, 0), LM_INVALID_ARGUMENT);
    LT_CHECK(lm_kv_cache_length(c, 0) == 0 && lm_kv_cache_length(c, 1) == 0);
    lm_kv_cache *too_big = NULL;
    LT_CHECK_STATUS(lm_kv_cache_create(m, 1, 1 << 30, &too_big), LM_INVALID_ARGUMENT);
    LT_CHECK(too_big == NULL);
    lm_kv_cache_destroy(c);
    lm_model_destroy(m);
}

static void test_host_matrices_are_aligned(void) {
    int misaligned_in_files = 0, matrices = 0;
    for (int i = 0; i < NMODELS; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/tests/data/models/%s", LOOM_SOURCE_DIR, k_models[i]);
        lm_model *m = load(k_models[i]);
        lm_checkpoint *ck = NULL;
        LT_CHECK_OK(lm_checkpoint_open(dir, &ck));
        if (!m || !ck) {
            lm_model_destroy(m);
            lm_checkpoint_close(ck);
            continue;
        }
        const lm_model_config *cfg = lm_model_get_config(m);
        for (int64_t k = 0; k < lm_model_config_tensor_count(cfg); k++) {
            lm_tensor_spec sp;
            LT_CHECK_OK(lm_model_config_tensor(cfg, k, &sp));
            if (sp.ndim != 2) continue;
            const lm_tensor *w = lm__model_weight(m, sp.name);
            lm_tensor *f = NULL;
            LT_CHECK_OK(lm_checkpoint_tensor(ck, sp.name, &f));
            if (w && f) {
                matrices++;
                misaligned_in_files += ((uintptr_t)lm_tensor_data(f) & 63) != 0;
                size_t n = (size_t)lm_tensor_numel(f) * lm_dtype_size(lm_tensor_dtype(f));
                LT_CHECK_MSG(((uintptr_t)lm_tensor_data(w) & 63) == 0, "%s %s: not 64-byte aligned", k_models[i],
                             sp.name);
                LT_CHECK_MSG(lm_tensor_numel(w) * (int64_t)lm_dtype_size(lm_tensor_dtype(w)) == (int64_t)n &&
                                 !memcmp(lm_tensor_data(w), lm_tensor_data(f), n),
                             "%s %s: not the checkpoint's bytes", k_models[i], sp.name);
            }
            lm_tensor_destroy(f);
        }
        lm_checkpoint_close(ck);
        lm_model_destroy(m);
    }
    printf("  %d matrices, %d of them not 64-byte aligned in their files\n", matrices, misaligned_in_files);
    LT_CHECK(matrices > 0 && misaligned_in_files > 0); /* the copy was exercised */
}

static void test_load_errors_name_the_problem(void) {
    lm_model *m = NULL;
    LT_CHECK_STATUS(lm_model_load("/nonexistent/model", lm_device_cpu(), &m), LM_IO_ERROR);
    LT_CHECK(strstr(lm_last_error(), "/nonexistent/model") != NULL);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/models/llama_gqa2_f32", LOOM_SOURCE_DIR);
    /* a GPU that does not exist: no CUDA in the build, or no such ordinal */
    LT_CHECK_STATUS(lm_model_load(dir, lm_device_cuda(lm_cuda_device_count()), &m),
                    lm_cuda_compiled() ? LM_DEVICE_ERROR : LM_UNSUPPORTED);
    LT_CHECK(m == NULL);
    for (int k = 1; k < 400; k += 7) { /* allocation failure anywhere in loading leaks nothing */
        lt_alloc_track(k);
        lm_status st = lm_model_load(dir, lm_device_cpu(), &m);
        if (st == LM_OK) lm_model_destroy(m);
        else LT_CHECK_STATUS(st, LM_OUT_OF_MEMORY);
        m = NULL;
        LT_CHECK_MSG(lt_alloc_live() == 0, "fail_at %d: %lld allocations leaked", k, (long long)lt_alloc_live());
        lt_alloc_untrack();
    }
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 2, &g_ctx));
    LT_RUN(test_logits_and_greedy_match_transformers);
    LT_RUN(test_batched_rows_equal_single_rows);
    LT_RUN(test_paged_cache_equals_slots);
    LT_RUN(test_bad_requests_leave_the_cache_untouched);
    LT_RUN(test_host_matrices_are_aligned);
    LT_RUN(test_load_errors_name_the_problem);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
