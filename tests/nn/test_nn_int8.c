/* Int8 weights (lm_model_load_opts, LM_WEIGHTS_INT8) against the float path of the same
 * checkpoint: the logits of one prompt at every position, on the reference checkpoints
 * of several architectures (llama GQA, llama3 scaling, mistral, qwen2 with biases and
 * shards, qwen3 with q/k norms and an explicit head_dim) and the default model.
 * Gates (measured: NMSE 1.0e-4..1.6e-4, max |a-b| 1.1%..1.7% of max |b|, top-1 22..24 of
 * 24 random-token positions): NMSE sum((a-b)^2)/sum(b^2) <= 2e-3, max |a-b| <= 0.06 *
 * max |b|, top-1 agreement >= 75% (random prompts have near-ties; on real text it is
 * 99%, docs/QUANTIZATION.md). Broken int8 paths (scales applied to
 * the wrong rows, see tests/tools/test_cli_quantize.c) give NMSE ~1 and fail.
 * Also: the decode path (KV cache, one token at a time) of an int8 model equals its
 * prefill logits; bf16 weights convert f32 checkpoints; the format shows in the config;
 * bf16 of an int8 directory, bad options and training are refused.
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

static lm_model *load(const char *dir, lm_weights w) { return load_as(dir, w, LM_PRECISION_EXACT); }

static void compare(const char *name, const char *dir) {
    lm_model *f = load(dir, LM_WEIGHTS_AUTO), *q = load(dir, LM_WEIGHTS_INT8);
    if (!f || !q) {
        lm_model_destroy(f), lm_model_destroy(q);
        return;
    }
    const lm_model_config *c = lm_model_get_config(q);
    LT_CHECK(lm_model_weights(q) == LM_WEIGHTS_INT8 && lm_model_weights(f) == LM_WEIGHTS_BF16);
    LT_CHECK(c->quant_format == LM_QUANT_INT8 && c->quant_modules == lm_quant_modules_default(c));
    LT_CHECK(lm_model_weight_bytes(q) < lm_model_weight_bytes(f));
    logits_diff df = compare_logits(q, f);
    double nmse = df.nmse, md = df.max_abs, mb = df.max_ref, rel = md / (mb > 0 ? mb : 1);
    int agree = df.agree;
    printf("  %-20s int8 vs %-4s: nmse %.2e  max|d| %.3g (%.4f of max|logit| %.3g)  top-1 %d/%d\n", name,
           lm_dtype_name(c->dtype), nmse, md, rel, mb, agree, T);
    LT_CHECK_MSG(nmse <= 2e-3, "%s: nmse %.3g", name, nmse);
    LT_CHECK_MSG(rel <= 0.06, "%s: max |d| %.3g of %.3g", name, md, mb);
    LT_CHECK_MSG(agree * 4 >= T * 3, "%s: top-1 agreement %d/%d", name, agree, T);
    lm_model_destroy(f), lm_model_destroy(q);
}

static void test_int8_logits_close_to_float_on_reference_models(void) {
    static const char *const names[] = {"llama_gqa2_f32",     "llama3_scaled_bf16", "mistral_mha_f16",
                                        "qwen2_bias_sharded", "qwen3_headdim",      "qwen2_mqa_yarn"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, MODELS "%s", names[i]);
        compare(names[i], dir);
    }
}

static void test_int8_logits_close_to_bf16_on_default_model(void) {
    compare("models/default", LOOM_SOURCE_DIR "/models/default");
}

/* Decode one token at a time equals the prefill's logits (same int8 weights, the
 * GEMV-shaped linear against the GEMM-shaped one). */
static void test_int8_decode_matches_prefill(void) {
    lm_model *q = load(MODELS "qwen2_bias_sharded", LM_WEIGHTS_INT8);
    if (!q) return;
    check_decode_matches_prefill("int8", q);
    lm_model_destroy(q);
}

/* A tied head (models/default) is quantized as a copy of the embedding table by default
 * on the CPU: fewer bytes per token than with the float table as the head (quant_modules
 * without LM_QUANT_LM_HEAD), different logits, both close to the float model's. */
static void test_tied_head_quantized_copy(void) {
    const char *dir = LOOM_SOURCE_DIR "/models/default";
    lm_model_load_options o;
    lm_model_load_options_default(&o);
    o.weights = LM_WEIGHTS_INT8;
    lm_model *q = NULL, *qf = NULL, *f = load(dir, LM_WEIGHTS_AUTO);
    LT_CHECK_OK(lm_model_load_opts(dir, lm_device_cpu(), &o, &q));
    o.quant_modules = lm_quant_modules_default(NULL) & ~LM_QUANT_LM_HEAD;
    LT_CHECK_OK(lm_model_load_opts(dir, lm_device_cpu(), &o, &qf));
    if (!q || !qf || !f) {
        lm_model_destroy(q), lm_model_destroy(qf), lm_model_destroy(f);
        return;
    }
    const lm_model_config *c = lm_model_get_config(q);
    LT_CHECK(c->tie_word_embeddings && (c->quant_modules & LM_QUANT_LM_HEAD));
    LT_CHECK(!(lm_model_get_config(qf)->quant_modules & LM_QUANT_LM_HEAD));
    int64_t head_f = c->vocab_size * c->hidden_size * 2, head_q = c->vocab_size * (c->hidden_size + 4);
    LT_CHECK_MSG(lm_model_weight_bytes(qf) - lm_model_weight_bytes(q) == head_f - head_q,
                 "bytes per token %lld (quantized head) vs %lld (float table as the head)",
                 (long long)lm_model_weight_bytes(q), (long long)lm_model_weight_bytes(qf));
    logits_diff dq = compare_logits(q, f), dqf = compare_logits(qf, f), dd = compare_logits(q, qf);
    printf("  models/default int8, head quantized: nmse %.2e top-1 %d/%d; head float: nmse %.2e top-1 %d/%d\n",
           dq.nmse, dq.agree, T, dqf.nmse, dqf.agree, T);
    LT_CHECK(dd.max_abs > 0); /* the head's quantization shows */
    LT_CHECK_MSG(dq.nmse <= 2e-3 && dq.agree * 4 >= T * 3, "nmse %.3g, top-1 %d/%d", dq.nmse, dq.agree, T);
    lm_model_destroy(q), lm_model_destroy(qf), lm_model_destroy(f);
}

static void test_bf16_weights_convert_f32_checkpoint(void) {
    lm_model *b = load(MODELS "llama_gqa2_f32", LM_WEIGHTS_BF16), *f = load(MODELS "llama_gqa2_f32", LM_WEIGHTS_AUTO);
    if (!b || !f) {
        lm_model_destroy(b), lm_model_destroy(f);
        return;
    }
    LT_CHECK(lm_model_weights(b) == LM_WEIGHTS_BF16);
    LT_CHECK(lm_model_weight_bytes(b) < lm_model_weight_bytes(f)); /* matrices at 2 bytes instead of 4 */
    lm_model_destroy(b), lm_model_destroy(f);
}

static void test_refusals(void) {
    lm_model *m = NULL;
    lm_model_load_options o;
    lm_model_load_options_default(&o);
    o.weights = LM_WEIGHTS_INT8;
    /* (int8 on CUDA loads now: tests/cuda/test_cuda_linear_quant.c compares its logits) */
    o.quant_modules = 1 << 12;
    LT_CHECK_STATUS(lm_model_load_opts(MODELS "llama_gqa2_f32", lm_device_cpu(), &o, &m), LM_INVALID_ARGUMENT);
    o.quant_modules = 0;
    o.weights = (lm_weights)9;
    LT_CHECK_STATUS(lm_model_load_opts(MODELS "llama_gqa2_f32", lm_device_cpu(), &o, &m), LM_INVALID_ARGUMENT);
    LT_CHECK(m == NULL);
    lm_weights w;
    LT_CHECK_OK(lm_weights_parse("int8", &w));
    LT_CHECK(w == LM_WEIGHTS_INT8);
    LT_CHECK_OK(lm_weights_parse("int4", &w));
    LT_CHECK(w == LM_WEIGHTS_INT4);
    LT_CHECK_OK(lm_weights_parse("fp8", &w));
    LT_CHECK(w == LM_WEIGHTS_FP8);
    LT_CHECK(strcmp(lm_weights_name(LM_WEIGHTS_FP8), "fp8") == 0);
    LT_CHECK_STATUS(lm_weights_parse("int3", &w), LM_INVALID_ARGUMENT);
}

/* A config with a quantization_config: the parser's strictness, and training refused. */
static void test_quantization_config_parse(void) {
    const char *base = "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":32,\"hidden_size\":8,"
                       "\"intermediate_size\":16,\"num_hidden_layers\":1,\"num_attention_heads\":2%s}";
    static const quant_config_case cases[] = {
        {",\"quantization_config\":{\"quant_method\":\"loom\",\"format\":\"int8\",\"scheme\":\"per-output-channel "
         "symmetric\",\"modules\":[\"q_proj\",\"down_proj\",\"lm_head\"]}", LM_OK, NULL},
        {",\"quantization_config\":null", LM_OK, NULL},
        {",\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4}", LM_UNSUPPORTED, "gptq"},
        {",\"quantization_config\":{\"quant_method\":\"loom\",\"format\":\"int4\",\"scheme\":\"per-output-channel "
         "symmetric\",\"modules\":[\"q_proj\"]}", LM_UNSUPPORTED, "int4"},
        {",\"quantization_config\":{\"quant_method\":\"loom\",\"format\":\"int8\",\"scheme\":\"per-tensor\","
         "\"modules\":[\"q_proj\"]}", LM_UNSUPPORTED, "per-tensor"},
        {",\"quantization_config\":{\"quant_method\":\"loom\",\"format\":\"int8\",\"scheme\":\"per-output-channel "
         "symmetric\",\"modules\":[\"q_proj\"],\"group_size\":32}", LM_PARSE_ERROR, "group_size"},
        {",\"quantization_config\":{\"quant_method\":\"loom\",\"format\":\"int8\",\"scheme\":\"per-output-channel "
         "symmetric\",\"modules\":[\"embed_tokens\"]}", LM_PARSE_ERROR, "embed_tokens"},
        {",\"quantization_config\":{\"quant_method\":\"loom\",\"format\":\"int8\",\"scheme\":\"per-output-channel "
         "symmetric\",\"modules\":[\"q_proj\",\"q_proj\"]}", LM_PARSE_ERROR, "twice"},
        {",\"quantization_config\":{\"quant_method\":\"loom\",\"format\":\"int8\",\"scheme\":\"per-output-channel "
         "symmetric\"}", LM_PARSE_ERROR, "modules"},
        {",\"tie_word_embeddings\":true,\"quantization_config\":{\"quant_method\":\"loom\",\"format\":\"int8\","
         "\"scheme\":\"per-output-channel symmetric\",\"modules\":[\"lm_head\"]}", LM_PARSE_ERROR, "tied"},
        {",\"quantization_config\":[1]", LM_PARSE_ERROR, "not an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lm_model_config c;
        lm_status st = parse_quant_config_case(base, i, &cases[i], &c);
        if (i == 0 && st == LM_OK) {
            LT_CHECK(c.quant_format == LM_QUANT_INT8);
            LT_CHECK(c.quant_modules == (LM_QUANT_Q_PROJ | LM_QUANT_DOWN_PROJ | LM_QUANT_LM_HEAD));
            LT_CHECK(lm_model_config_tensor_quantized(&c, "model.layers.0.self_attn.q_proj.weight"));
            LT_CHECK(lm_model_config_tensor_quantized(&c, "model.layers.17.mlp.down_proj.weight"));
            LT_CHECK(lm_model_config_tensor_quantized(&c, "lm_head.weight"));
            LT_CHECK(!lm_model_config_tensor_quantized(&c, "model.layers.0.self_attn.k_proj.weight"));
            LT_CHECK(!lm_model_config_tensor_quantized(&c, "model.layers.0.self_attn.q_proj.bias"));
            LT_CHECK(!lm_model_config_tensor_quantized(&c, "model.embed_tokens.weight"));
            LT_CHECK(!lm_model_config_tensor_quantized(&c, "model.layers.x.mlp.down_proj.weight"));
        }
    }
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 2, &g_ctx));
    LT_RUN(test_int8_logits_close_to_float_on_reference_models);
    LT_RUN(test_int8_logits_close_to_bf16_on_default_model);
    LT_RUN(test_int8_decode_matches_prefill);
    LT_RUN(test_tied_head_quantized_copy);
    LT_RUN(test_bf16_weights_convert_f32_checkpoint);
    LT_RUN(test_refusals);
    LT_RUN(test_quantization_config_parse);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
