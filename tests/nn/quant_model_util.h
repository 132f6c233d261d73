/* tests/nn/quant_model_util.h — what the int8 and int4 model tests share
 * (test_nn_int8.c, test_nn_int4.c): prefill logits through a fresh cache, the
 * difference of a quantized model's logits from its float model's on a random prompt,
 * and decode one token at a time against the prefill (also test_nn_precision.c's
 * prefill logits, argmax and model loading). The including test defines T (the prompt length) and
 * g_ctx (a CPU context) before including it.
 */
#ifndef LOOM_TESTS_QUANT_MODEL_UTIL_H
#define LOOM_TESTS_QUANT_MODEL_UTIL_H

#include "harness.h"
#include "loom/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* logits [T, V] of ids through a fresh cache */
static inline float *prefill_logits(const lm_model *m, const int32_t *ids) {
    int64_t V = lm_model_get_config(m)->vocab_size;
    float *out = malloc(sizeof(float) * (size_t)(T * V));
    lm_kv_cache *c = NULL;
    int slot = 0;
    LT_CHECK_OK(lm_kv_cache_create(m, 1, T, &c));
    LT_CHECK_OK(lm_model_forward(m, g_ctx, c, &slot, 1, ids, T, out, 1));
    lm_kv_cache_destroy(c);
    return out;
}

/* dir on the CPU with weights w at precision p (NULL, with a failed check, if it fails) */
static inline lm_model *load_as(const char *dir, lm_weights w, lm_precision p) {
    lm_model_load_options o;
    lm_model_load_options_default(&o);
    o.weights = w, o.precision = p;
    lm_model *m = NULL;
    LT_CHECK_OK(lm_model_load_opts(dir, lm_device_cpu(), &o, &m));
    return m;
}

static inline int64_t argmax(const float *row, int64_t V) {
    int64_t b = 0;
    for (int64_t v = 1; v < V; v++)
        if (row[v] > row[b]) b = v;
    return b;
}

typedef struct logits_diff {
    double nmse, max_abs, max_ref; /* max |q - f| and max |f| over every position */
    int agree;                     /* positions whose top-1 token is the same */
} logits_diff;

/* q's logits against f's on T random tokens (seed 7), every position. */
static inline logits_diff compare_logits(const lm_model *q, const lm_model *f) {
    int64_t V = lm_model_get_config(q)->vocab_size;
    int32_t ids[T];
    lt_rng r = lt_rng_seed(7);
    for (int t = 0; t < T; t++) ids[t] = (int32_t)lt_rng_int(&r, 0, V - 1);
    float *a = prefill_logits(q, ids), *b = prefill_logits(f, ids);
    double sq = 0, sb = 0;
    logits_diff d = {0, 0, 0, 0};
    for (int64_t i = 0; i < T * V; i++) {
        double e = (double)a[i] - b[i];
        sq += e * e, sb += (double)b[i] * b[i];
        if (!(fabs(e) <= d.max_abs)) d.max_abs = fabs(e);
        if (fabs(b[i]) > d.max_ref) d.max_ref = fabs(b[i]);
    }
    for (int t = 0; t < T; t++) d.agree += argmax(a + t * V, V) == argmax(b + t * V, V);
    d.nmse = sq / (sb > 0 ? sb : 1);
    free(a), free(b);
    return d;
}

/* One token at a time against the prefill of the same T tokens, every position (the
 * GEMV-shaped linear against the GEMM-shaped one): NMSE, max |d|, max |prefill logit|
 * and the positions whose top-1 token is the same. */
static inline logits_diff decode_vs_prefill(const lm_model *q) {
    int64_t V = lm_model_get_config(q)->vocab_size;
    int32_t ids[T];
    for (int t = 0; t < T; t++) ids[t] = (int32_t)((t * 37 + 11) % V);
    float *a = prefill_logits(q, ids), *row = malloc(sizeof(float) * (size_t)V);
    lm_kv_cache *c = NULL;
    int slot = 0;
    double sq = 0, sb = 0;
    logits_diff d = {0, 0, 0, 0};
    LT_CHECK_OK(lm_kv_cache_create(q, 1, T, &c));
    for (int t = 0; t < T; t++) {
        LT_CHECK_OK(lm_model_forward(q, g_ctx, c, &slot, 1, ids + t, 1, row, 0));
        for (int64_t v = 0; v < V; v++) {
            double e = (double)row[v] - a[t * V + v];
            sq += e * e, sb += (double)a[t * V + v] * a[t * V + v];
            if (!(fabs(e) <= d.max_abs)) d.max_abs = fabs(e);
            if (fabs(a[t * V + v]) > d.max_ref) d.max_ref = fabs(a[t * V + v]);
        }
        d.agree += argmax(row, V) == argmax(a + t * V, V);
    }
    d.nmse = sq / (sb > 0 ? sb : 1);
    lm_kv_cache_destroy(c);
    free(a), free(row);
    return d;
}

/* Decoding one token at a time equals the prefill's logits (same quantized weights, the
 * exact products: only f32 summation order differs). */
static inline void check_decode_matches_prefill(const char *tag, const lm_model *q) {
    logits_diff d = decode_vs_prefill(q);
    printf("  %s decode vs prefill: max|d| %.3g of max|logit| %.3g\n", tag, d.max_abs, d.max_ref);
    LT_CHECK_MSG(d.max_abs <= 1e-4 * d.max_ref, "%s: decode differs from prefill by %.3g", tag, d.max_abs);
}

/* One case of a quantization_config parse table: base (a config.json with one %s where
 * the case's text goes) parsed into *c; the status must be want and an error message
 * must name msg. Returns the status. */
typedef struct quant_config_case {
    const char *q;
    lm_status want;
    const char *msg;
} quant_config_case;

static inline lm_status parse_quant_config_case(const char *base, size_t i, const quant_config_case *k,
                                                lm_model_config *c) {
    char json[1024];
    snprintf(json, sizeof json, base, k->q);
    lm_status st = lm_model_config_parse(json, strlen(json), "config.json", c);
    LT_CHECK_MSG(st == k->want, "case %zu: %s (%s)", i, lm_status_name(st), lm_last_error());
    if (k->msg && st != LM_OK)
        LT_CHECK_MSG(strstr(lm_last_error(), k->msg) != NULL, "case %zu: '%s' lacks '%s'", i, lm_last_error(), k->msg);
    return st;
}

#endif
