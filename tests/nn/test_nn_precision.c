/* Fast precision at model level (lm_model_load_options.precision = LM_PRECISION_FAST,
 * docs/QUANTIZATION.md "Fast precision"): the default model's prefill logits (every
 * position of random-token prompts, through the bf16 GEMMs at T rows) in fast against
 * exact mode; decode (one row: the exact GEMV) unchanged bit for bit; the setting is
 * per model and restored after each forward pass; refusals (CUDA for bf16 weights, where
 * fast is fp8's mode; bad values; a CPU without AVX512_BF16 names the feature for bf16
 * weights).
 * Gates (measured on models/default, 4 random prompts of 64 tokens, AMD EPYC Zen 4:
 * worst NMSE 8.8e-6, max |a-b| 0.074 with max |b| 19.8 (0.37%), top-1 253/256; printed
 * each run): NMSE <= 1e-4, max |a-b| <= 0.02 * max |b|, top-1 >= 95% of positions
 * (random tokens give near-ties; on the validation text it is 99.73%, docs/QUANTIZATION.md).
 * The prefill error is the rounding of every linear's input to bf16 (relative 2^-9
 * on average, at most 2^-8) propagated through 8 layers; int8 weights (whose
 * gate is 2e-3 / 6%, tests/nn/test_nn_int8.c) perturb more.
 * int8 and int4 models at fast precision quantize every linear's input to int8 blocks,
 * in decode (gemv) and in prefill (GEMM) alike: fast prefill against exact within NMSE
 * 1e-3, 5% of max |logit|, top-1 >= 90% (measured: 1.8e-4 / 1.9e-4, 1.5-1.6%, 61 and 64 of
 * 64); fast decode against fast prefill within NMSE 1e-4, 2%, top-1 >= 90% (measured
 * 5.3e-5 / 4.1e-5, 0.9-1.1%, 64 and 61 of 64: the same quantization, apart from roundings of
 * x flipped by f32 summation order; with the GEMM left exact, as before, the NMSE is
 * 2.0e-4 and the check fails — NMSE is the discriminating gate, top-1 on these
 * near-tied random tokens only a coarse one).
 * The AVX2 path (an ISA override here) runs the int8 and int4 cases again on its own
 * kernels (AVX-VNNI where the CPU has it; measured on a Zen 5: decode 4.2e-4 against
 * exact, prefill 1.7e-4 / 1.9e-4, decode vs prefill 4.5e-5 / 2.3e-5), and refuses the bf16
 * default model at load in fast mode, naming a matrix and AVX512_BF16.
 * LM_TEST_LABELS: unit model
 */
#include "harness.h"
#include "loom/model.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/precision.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_MODEL LOOM_SOURCE_DIR "/models/default"
#define T 64
#define PROMPTS 4

static lm_ctx *g_ctx;

#include "quant_model_util.h"

static lm_model *load(const char *dir, lm_precision p) { return load_as(dir, LM_WEIGHTS_AUTO, p); }

static void test_fast_prefill_logits_close_to_exact_on_default_model(void) {
    lm_model *e = load(DEFAULT_MODEL, LM_PRECISION_EXACT), *f = load(DEFAULT_MODEL, LM_PRECISION_FAST);
    if (!e || !f) return;
    LT_CHECK(lm_model_precision(e) == LM_PRECISION_EXACT && lm_model_precision(f) == LM_PRECISION_FAST);
    int64_t V = lm_model_get_config(e)->vocab_size;
    lt_rng r = lt_rng_seed(41);
    double worst_nmse = 0, worst_abs = 0, max_ref = 0;
    int agree = 0;
    for (int p = 0; p < PROMPTS; p++) {
        int32_t ids[T];
        for (int t = 0; t < T; t++) ids[t] = (int32_t)lt_rng_int(&r, 0, V - 1);
        float *a = prefill_logits(f, ids), *b = prefill_logits(e, ids);
        double sq = 0, sb = 0;
        int same = 1;
        for (int64_t i = 0; i < T * V; i++) {
            double d = (double)a[i] - b[i];
            LT_CHECK_MSG(isfinite(a[i]), "prompt %d: fast logit %lld is %g", p, (long long)i, a[i]);
            if (!isfinite(a[i])) break;
            same &= d == 0;
            sq += d * d, sb += (double)b[i] * b[i];
            if (fabs(d) > worst_abs) worst_abs = fabs(d);
            if (fabs(b[i]) > max_ref) max_ref = fabs(b[i]);
        }
        for (int t = 0; t < T; t++) agree += argmax(a + t * V, V) == argmax(b + t * V, V);
        if (sq / sb > worst_nmse) worst_nmse = sq / sb;
        LT_CHECK_MSG(!same, "prompt %d: fast logits equal exact bit for bit (the fast GEMM did not run)", p);
        free(a), free(b);
    }
    printf("  default model, %d prompts x %d tokens: NMSE up to %.3g, max |fast - exact| %.4g (max |exact| %.3g), "
           "top-1 %d/%d\n", PROMPTS, T, worst_nmse, worst_abs, max_ref, agree, PROMPTS * T);
    LT_CHECK_MSG(worst_nmse <= 1e-4, "NMSE %.3g > 1e-4", worst_nmse);
    LT_CHECK_MSG(worst_abs <= 0.02 * max_ref, "max |diff| %.4g > 2%% of %.4g", worst_abs, max_ref);
    LT_CHECK_MSG(agree >= (int)(0.95 * PROMPTS * T), "top-1 agreement %d of %d", agree, PROMPTS * T);
    lm_model_destroy(e);
    lm_model_destroy(f);
}

/* One token at a time every linear is a one-row gemv, which fast runs with x rounded
 * to bf16 (bf16 weights: the prefill's gates) or quantized to int8 blocks (int8 and int4
 * weights, the VNNI gemv: x rounded to 8 bits costs more, gated at NMSE 1e-3 and 5% of
 * the largest logit); the logits do move. */
static void decode_case(lm_weights w, double nmse_gate, double abs_gate) {
    lm_model *e = load_as(DEFAULT_MODEL, w, LM_PRECISION_EXACT), *f = load_as(DEFAULT_MODEL, w, LM_PRECISION_FAST);
    if (!e || !f) return;
    int64_t V = lm_model_get_config(e)->vocab_size;
    lm_kv_cache *ce = NULL, *cf = NULL;
    LT_CHECK_OK(lm_kv_cache_create(e, 1, 8, &ce));
    LT_CHECK_OK(lm_kv_cache_create(f, 1, 8, &cf));
    float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
    int slot = 0, agree = 0, moved = 0;
    double worst_nmse = 0, worst_abs = 0, max_ref = 0;
    for (int32_t t = 0; t < 8; t++) {
        int32_t id = 100 + 37 * t;
        LT_CHECK_OK(lm_model_forward(f, g_ctx, cf, &slot, 1, &id, 1, a, 0));
        LT_CHECK_OK(lm_model_forward(e, g_ctx, ce, &slot, 1, &id, 1, b, 0));
        double sq = 0, sb = 0;
        for (int64_t v = 0; v < V; v++) {
            double d = (double)a[v] - b[v];
            sq += d * d, sb += (double)b[v] * b[v];
            worst_abs = fmax(worst_abs, fabs(d)), max_ref = fmax(max_ref, fabs(b[v]));
        }
        worst_nmse = fmax(worst_nmse, sq / (sb > 0 ? sb : 1));
        agree += argmax(a, V) == argmax(b, V);
        moved += memcmp(a, b, sizeof(float) * (size_t)V) != 0;
    }
    printf("  default model %s, 8 decode steps: NMSE up to %.3g, max |fast - exact| %.4g (max |exact| %.3g), "
           "top-1 %d/8\n", lm_weights_name(w), worst_nmse, worst_abs, max_ref, agree);
    LT_CHECK_MSG(moved > 0, "%s: decode logits equal exact bit for bit (the fast gemv did not run)",
                 lm_weights_name(w));
    LT_CHECK_MSG(worst_nmse <= nmse_gate && worst_abs <= abs_gate * max_ref && agree >= 7,
                 "%s decode: NMSE %.3g, max |diff| %.4g of %.4g, top-1 %d/8", lm_weights_name(w), worst_nmse, worst_abs,
                 max_ref, agree);
    free(a), free(b);
    lm_kv_cache_destroy(ce);
    lm_kv_cache_destroy(cf);
    lm_model_destroy(e);
    lm_model_destroy(f);
}

static void test_fast_decode_close_to_exact(void) {
    decode_case(LM_WEIGHTS_BF16, 1e-4, 0.02);
    if (!lm__cpu_i8dot_supported()) {
        printf("  (no AVX512_VNNI: the int8/int4 fast gemv is not run here)\n");
        return;
    }
    decode_case(LM_WEIGHTS_INT8, 1e-3, 0.05);
    decode_case(LM_WEIGHTS_INT4, 1e-3, 0.05);
}

/* Prefill of int8 and int4 models: T rows make every linear a GEMM, which fast runs on
 * the same quantized x as the gemv (int8 blocks of 64, VNNI products against byte
 * panels): against exact prefill (same weights) within the decode gates, and decoding
 * one token at a time (the fast gemv) against the fast prefill: the same quantization of
 * each linear's input, so they differ by f32 summation order and by the roundings of x
 * that order flips (gates 1e-4 NMSE, 2% of max |logit|). Where AVX512_BF16 runs, fast
 * prefill's attention also rounds q, k, v and the probabilities to bf16 and decode's (a
 * few key-lane rows) does not: then they differ by one operator's arithmetic, as fast
 * and exact do, and take the fast-vs-exact gates (1e-3, 5%; measured 2.8e-4 / 2.9e-4
 * and 2.0-2.2% on a Zen 5, against 4-5e-5 with that attention turned off). */
static void quant_prefill_case(lm_weights w) {
    lm_model *e = load_as(DEFAULT_MODEL, w, LM_PRECISION_EXACT), *f = load_as(DEFAULT_MODEL, w, LM_PRECISION_FAST);
    if (!e || !f) return;
    const char *name = lm_weights_name(w);
    logits_diff fe = compare_logits(f, e); /* one random prompt of T tokens, every position */
    printf("  default model %s, %d tokens: fast prefill NMSE %.3g, max |fast - exact| %.4g (max |exact| %.3g), "
           "top-1 %d/%d\n", name, T, fe.nmse, fe.max_abs, fe.max_ref, fe.agree, T);
    LT_CHECK_MSG(fe.nmse > 0, "%s: fast prefill equals exact bit for bit (the fast GEMM did not run)", name);
    LT_CHECK_MSG(fe.nmse <= 1e-3 && fe.max_abs <= 0.05 * fe.max_ref && fe.agree >= (int)(0.9 * T),
                 "%s prefill: NMSE %.3g, max |diff| %.4g of %.4g, top-1 %d/%d", name, fe.nmse, fe.max_abs, fe.max_ref,
                 fe.agree, T);
    logits_diff dp = decode_vs_prefill(f); /* fast decode against fast prefill */
    printf("  %s fast decode vs fast prefill: NMSE %.3g, max |d| %.3g of max |logit| %.3g, top-1 %d/%d\n", name,
           dp.nmse, dp.max_abs, dp.max_ref, dp.agree, T);
    const int bf16_attention = lm__cpu_bf16dot_runs();
    const double dp_nmse = bf16_attention ? 1e-3 : 1e-4, dp_abs = bf16_attention ? 0.05 : 0.02;
    LT_CHECK_MSG(dp.nmse <= dp_nmse && dp.max_abs <= dp_abs * dp.max_ref && dp.agree >= (int)(0.9 * T),
                 "%s: fast decode differs from fast prefill: NMSE %.3g, max %.3g (top-1 %d/%d)", name, dp.nmse,
                 dp.max_abs, dp.agree, T);
    lm_model_destroy(e);
    lm_model_destroy(f);
}

static void test_fast_quantized_prefill(void) {
    if (!lm__cpu_i8dot_supported()) {
        printf("  (no AVX512_VNNI: the int8/int4 fast GEMM is not run here)\n");
        return;
    }
    quant_prefill_case(LM_WEIGHTS_INT8);
    quant_prefill_case(LM_WEIGHTS_INT4);
}

/* The precision is the model's, not the thread's: an exact model run after a fast one
 * (same thread, same context) gives the exact logits again. */
static void test_precision_is_per_model(void) {
    lm_model *e = load(DEFAULT_MODEL, LM_PRECISION_EXACT), *f = load(DEFAULT_MODEL, LM_PRECISION_FAST);
    if (!e || !f) return;
    int64_t V = lm_model_get_config(e)->vocab_size;
    int32_t ids[T];
    for (int t = 0; t < T; t++) ids[t] = (int32_t)((t * 7919) % V);
    float *b1 = prefill_logits(e, ids), *a = prefill_logits(f, ids), *b2 = prefill_logits(e, ids);
    LT_CHECK_MSG(memcmp(b1, b2, sizeof(float) * (size_t)(T * V)) == 0, "exact logits changed after a fast run");
    LT_CHECK_MSG(memcmp(a, b1, sizeof(float) * (size_t)(T * V)) != 0, "fast equals exact");
    free(a), free(b1), free(b2);
    lm_model_destroy(e);
    lm_model_destroy(f);
}

static void test_refusals(void) {
    lm_model_load_options o;
    lm_model_load_options_default(&o);
    LT_CHECK(o.precision == LM_PRECISION_EXACT);
    lm_model *m = NULL;
    o.precision = LM_PRECISION_FAST;
    /* CUDA: fast is fp8 weights' mode, so the bf16 default model is refused naming fp8
     * (without a GPU or a CUDA build, the device itself is refused) */
    lm_device_caps caps;
    int have_gpu = lm_device_caps_get(lm_device_cuda(0), &caps) == LM_OK;
    lm_status cst = lm_model_load_opts(DEFAULT_MODEL, lm_device_cuda(0), &o, &m);
    LT_CHECK(cst != LM_OK && m == NULL);
    if (have_gpu)
        LT_CHECK_MSG(cst == LM_UNSUPPORTED && strstr(lm_last_error(), "CUDA") && strstr(lm_last_error(), "fp8") &&
                         strstr(lm_last_error(), "bf16"),
                     "message: %s", lm_last_error());
    o.precision = (lm_precision)3;
    LT_CHECK_STATUS(lm_model_load_opts(DEFAULT_MODEL, lm_device_cpu(), &o, &m), LM_INVALID_ARGUMENT);
    LT_CHECK(m == NULL);
    /* A CPU without AVX512_BF16: refused, naming the feature (on one with it: loads). */
    o.precision = LM_PRECISION_FAST;
    lm_status st = lm_model_load_opts(DEFAULT_MODEL, lm_device_cpu(), &o, &m);
    if (lm_cpu_get_features()->avx512_bf16 && lm_cpu_get_features()->avx512bw && lm_cpu_get_features()->avx512vl) {
        LT_CHECK_OK(st);
    } else {
        LT_CHECK_STATUS(st, LM_UNSUPPORTED);
        LT_CHECK_MSG(strstr(lm_last_error(), "AVX512_BF16") != NULL, "message: %s", lm_last_error());
        printf("  this CPU lacks AVX512_BF16: fast is refused (checked); the logit tests are skipped\n");
    }
    lm_model_destroy(m);
}

/* The AVX2 path (an ISA override here; the path of CPUs without AVX-512): fast int8 and
 * int4 models decode and prefill on its kernels (AVX-VNNI where the CPU has it) within
 * the gates above, and a model with bf16 matrices is refused at load in fast mode,
 * naming the matrix and the feature (its products have no AVX2 fast kernel). */
static void test_avx2_path_int_fast(void) {
    LT_CHECK_OK(lm__cpu_set_isa_override(LM__CPU_ISA_AVX2));
    printf("  avx2 path (%s):\n", lm__cpu_avx_vnni_active() ? "AVX-VNNI" : "AVX2 byte products");
    decode_case(LM_WEIGHTS_INT8, 1e-3, 0.05);
    decode_case(LM_WEIGHTS_INT4, 1e-3, 0.05);
    quant_prefill_case(LM_WEIGHTS_INT8);
    quant_prefill_case(LM_WEIGHTS_INT4);
    lm_model_load_options o;
    lm_model_load_options_default(&o);
    o.precision = LM_PRECISION_FAST;
    lm_model *m = NULL;
    LT_CHECK_STATUS(lm_model_load_opts(DEFAULT_MODEL, lm_device_cpu(), &o, &m), LM_UNSUPPORTED);
    LT_CHECK_MSG(strstr(lm_last_error(), "AVX512_BF16") && strstr(lm_last_error(), ".weight") &&
                     strstr(lm_last_error(), "int8"),
                 "message: %s", lm_last_error());
    LT_CHECK(m == NULL);
    LT_CHECK_OK(lm__cpu_set_isa_override(LM__CPU_ISA_AUTO));
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 2, &g_ctx));
    LT_RUN(test_refusals);
    if (lm__cpu_bf16dot_supported()) {
        LT_RUN(test_fast_prefill_logits_close_to_exact_on_default_model);
        LT_RUN(test_fast_decode_close_to_exact);
        LT_RUN(test_fast_quantized_prefill);
        LT_RUN(test_precision_is_per_model);
    }
    if (lm__cpu_i8fast_supported()) LT_RUN(test_avx2_path_int_fast);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
