/* Int4 weights (lm_model_load_opts, LM_WEIGHTS_INT4, groups of 32/64/128 inputs) against
 * the float path of the same checkpoint: the logits of one prompt at every position, on
 * the reference checkpoints of several architectures (llama GQA, llama3 scaling, qwen2
 * with biases and shards, qwen3 with q/k norms and an explicit head_dim) and the
 * default model at every group size its shapes allow.
 * Gates (a 4-bit step is 127/7 = 18x int8's, so the logit error is ~300x int8's in
 * NMSE; measured on these random-token prompts: NMSE 2.3e-2..4.8e-2, max |a-b|
 * 19%..29% of max |b|, top-1 12..19 of 24): NMSE sum((a-b)^2)/sum(b^2) <= 8e-2, max
 * |a-b| <= 0.4 * max |b|, top-1 agreement >= 10 of 24 (flat, near-tied distributions;
 * on real text see docs/QUANTIZATION.md). Broken int4 paths give NMSE ~0.5..2 and fail:
 * swapped nibbles (tests/ops/test_linear_int4.c) and scales on the wrong rows
 * (tests/tools/test_cli_quantize.c).
 * Also: decode (KV cache, one token at a time) equals prefill; a larger group is no
 * closer than a smaller one on the default model; the format shows in the config;
 * groups that do not divide a matrix, bad group sizes, bf16/int8 of an
 * int4 directory and training are refused; quantization_config for int4 is strict.
 * LM_TEST_LABELS: unit model
 */
#include "harness.h"
#include "loom/model.h"
#include "loom/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MODELS LOOM_SOURCE_DIR "/tests/data/models/"
#define T 24

static lm_ctx *g_ctx;

#include "quant_model_util.h"

static lm_model *load_group(const char *dir, lm_weights w, int group, lm_status *st_out) {
    lm_model_load_options o;
    lm_model_load_options_default(&o);
    o.weights = w;
    o.quant_group = group;
    lm_model *m = NULL;
    lm_status st = lm_model_load_opts(dir, lm_device_cpu(), &o, &m);
    if (st_out) *st_out = st;
    else LT_CHECK_MSG(st == LM_OK, "loading %s: %s", dir, lm_last_error());
    return m;
}

/* The int4 model of dir at group G against its float model; returns the NMSE (-1 on failure). */
static double compare(const char *name, const char *dir, int G) {
    lm_model *f = load_group(dir, LM_WEIGHTS_AUTO, 0, NULL), *q = load_group(dir, LM_WEIGHTS_INT4, G, NULL);
    if (!f || !q) {
        lm_model_destroy(f), lm_model_destroy(q);
        return -1;
    }
    const lm_model_config *c = lm_model_get_config(q);
    LT_CHECK(lm_model_weights(q) == LM_WEIGHTS_INT4 && lm_model_weights(f) == LM_WEIGHTS_BF16);
    LT_CHECK(c->quant_format == LM_QUANT_INT4 && c->quant_group == G && c->quant_modules == lm_quant_modules_default(c));
    LT_CHECK(lm_model_weight_bytes(q) < lm_model_weight_bytes(f));
    logits_diff df = compare_logits(q, f);
    double nmse = df.nmse, md = df.max_abs, mb = df.max_ref, rel = md / (mb > 0 ? mb : 1);
    int agree = df.agree;
    printf("  %-20s int4 g%-3d vs %-4s: nmse %.2e  max|d| %.3g (%.4f of max|logit| %.3g)  top-1 %d/%d\n", name, G,
           lm_dtype_name(c->dtype), nmse, md, rel, mb, agree, T);
    LT_CHECK_MSG(nmse <= 8e-2, "%s g%d: nmse %.3g", name, G, nmse);
    LT_CHECK_MSG(rel <= 0.4, "%s g%d: max |d| %.3g of %.3g", name, G, md, mb);
    LT_CHECK_MSG(agree * 12 >= T * 5, "%s g%d: top-1 agreement %d/%d", name, G, agree, T);
    lm_model_destroy(f), lm_model_destroy(q);
    return nmse;
}

static void test_int4_logits_close_to_float_on_reference_models(void) {
    static const char *const names[] = {"llama_gqa2_f32", "llama3_scaled_bf16", "qwen2_bias_sharded", "qwen3_headdim",
                                        "qwen2_mqa_yarn"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, MODELS "%s", names[i]);
        compare(names[i], dir, 32);
    }
    compare("llama_gqa2_f32", MODELS "llama_gqa2_f32", 64);
}

/* Every group size on the default model; the coarser groups are not closer. */
static void test_int4_logits_close_to_bf16_on_default_model(void) {
    double e32 = compare("models/default", LOOM_SOURCE_DIR "/models/default", 32);
    double e64 = compare("models/default", LOOM_SOURCE_DIR "/models/default", 64);
    double e128 = compare("models/default", LOOM_SOURCE_DIR "/models/default", 128);
    LT_CHECK_MSG(e32 >= 0 && e32 <= e64 * 1.1 && e64 <= e128 * 1.1, "NMSE by group: %.3g %.3g %.3g", e32, e64, e128);
}

static void test_int4_decode_matches_prefill(void) {
    lm_model *q = load_group(MODELS "qwen2_bias_sharded", LM_WEIGHTS_INT4, 32, NULL);
    if (!q) return;
    check_decode_matches_prefill("int4", q);
    lm_model_destroy(q);
}

static void test_refusals(void) {
    lm_status st;
    lm_model *m = NULL;
    /* (int4 on CUDA loads now: tests/cuda/test_cuda_linear_quant.c compares its logits) */
    /* hidden_size 80 is not a multiple of 32; 64 is not of 128; 48 is no group size */
    m = load_group(MODELS "mistral_mha_f16", LM_WEIGHTS_INT4, 32, &st);
    LT_CHECK_MSG(st == LM_INVALID_ARGUMENT && strstr(lm_last_error(), "does not divide"), "%s", lm_last_error());
    LT_CHECK(m == NULL);
    m = load_group(MODELS "llama_gqa2_f32", LM_WEIGHTS_INT4, 128, &st);
    LT_CHECK(st == LM_INVALID_ARGUMENT && m == NULL);
    m = load_group(MODELS "llama_gqa2_f32", LM_WEIGHTS_INT4, 48, &st);
    LT_CHECK_MSG(st == LM_INVALID_ARGUMENT && strstr(lm_last_error(), "32, 64 or 128"), "%s", lm_last_error());
    LT_CHECK(m == NULL);
    lm_weights w;
    LT_CHECK_OK(lm_weights_parse("int4", &w));
    LT_CHECK(w == LM_WEIGHTS_INT4 && strcmp(lm_weights_name(w), "int4") == 0);
    LT_CHECK_STATUS(lm_weights_parse("int3", &w), LM_INVALID_ARGUMENT);
}

/* quantization_config for int4: strict like int8's, plus group_size. */
static void test_int4_quantization_config_parse(void) {
    const char *base = "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":32,\"hidden_size\":64,"
                       "\"intermediate_size\":128,\"num_hidden_layers\":1,\"num_attention_heads\":2%s}";
#define Q4 ",\"quantization_config\":{\"quant_method\":\"loom\",\"format\":\"int4\",\"scheme\":\"group-wise symmetric\""
    static const quant_config_case cases[] = {
        {Q4 ",\"group_size\":32,\"modules\":[\"q_proj\",\"down_proj\"]}", LM_OK, NULL},
        {Q4 ",\"group_size\":64,\"modules\":[\"up_proj\"]}", LM_OK, NULL},
        {Q4 ",\"modules\":[\"q_proj\"]}", LM_PARSE_ERROR, "group_size"},
        {Q4 ",\"group_size\":48,\"modules\":[\"q_proj\"]}", LM_PARSE_ERROR, "48"},
        {Q4 ",\"group_size\":\"32\",\"modules\":[\"q_proj\"]}", LM_PARSE_ERROR, "group_size"},
        {Q4 ",\"group_size\":128,\"modules\":[\"q_proj\"]}", LM_PARSE_ERROR, "does not divide"},
        {Q4 ",\"group_size\":32,\"bits\":4,\"modules\":[\"q_proj\"]}", LM_PARSE_ERROR, "quantization_config.bits"},
        {",\"quantization_config\":{\"quant_method\":\"loom\",\"format\":\"int4\",\"scheme\":\"per-output-channel "
         "symmetric\",\"group_size\":32,\"modules\":[\"q_proj\"]}", LM_UNSUPPORTED, "int4"},
        {",\"quantization_config\":{\"quant_method\":\"loom\",\"format\":\"int2\",\"scheme\":\"group-wise "
         "symmetric\",\"group_size\":32,\"modules\":[\"q_proj\"]}", LM_UNSUPPORTED, "int2"},
    };
#undef Q4
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lm_model_config c;
        lm_status st = parse_quant_config_case(base, i, &cases[i], &c);
        if (i == 0 && st == LM_OK) {
            LT_CHECK(c.quant_format == LM_QUANT_INT4 && c.quant_group == 32);
            LT_CHECK(strcmp(lm_quant_format_name(LM_QUANT_INT4), "int4") == 0);
            LT_CHECK(lm_model_config_tensor_quantized(&c, "model.layers.0.mlp.down_proj.weight"));
            LT_CHECK(!lm_model_config_tensor_quantized(&c, "model.layers.0.mlp.up_proj.weight"));
        }
        if (i == 1 && st == LM_OK) LT_CHECK(c.quant_group == 64);
    }
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 2, &g_ctx));
    LT_RUN(test_int4_logits_close_to_float_on_reference_models);
    LT_RUN(test_int4_logits_close_to_bf16_on_default_model);
    LT_RUN(test_int4_decode_matches_prefill);
    LT_RUN(test_refusals);
    LT_RUN(test_int4_quantization_config_parse);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
