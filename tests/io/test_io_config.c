/* Tests for config.json / generation_config.json parsing, RoPE tables and the
 * config-vs-checkpoint check: each architecture with its transformers class
 * defaults, GQA, explicit and null head_dim, biases and q/k norms, tied and untied
 * embeddings, every rope type against numpy references (tests/data/io, written by
 * scripts/gen_fixtures_io_rope.py) and a closed form, eos lists merged with the
 * generation config, sliding-window rules, every error with its exact status and a
 * detail naming field and file, checkpoints with missing/misshaped/mistyped tensors,
 * and no leaks when allocations fail.
 * LM_TEST_LABELS: unit
 */
#include "io_files.h"
#include "loom/config.h"

#include <math.h>

static char *g_dir;

static int has(const char *needle) {
    if (strstr(lm_last_error(), needle)) return 1;
    fprintf(stderr, "  detail '%s' lacks '%s'\n", lm_last_error(), needle);
    return 0;
}

/* Parses JSON written with single quotes (turned into double quotes) as "t/config.json". */
static lm_status parseq(const char *q, lm_model_config *c) {
    char *s = strdup(q);
    for (char *p = s; *p; p++)
        if (*p == '\'') *p = '"';
    lm_status st = lm_model_config_parse(s, strlen(s), "t/config.json", c);
    free(s);
    return st;
}

static lm_status mergeq(lm_model_config *c, const char *q) {
    char *s = strdup(q);
    for (char *p = s; *p; p++)
        if (*p == '\'') *p = '"';
    lm_status st = lm_model_config_merge_generation(c, s, strlen(s), "t/generation_config.json");
    free(s);
    return st;
}

#define CORE "'vocab_size': 100, 'hidden_size': 64, 'intermediate_size': 96, 'num_hidden_layers': 2"
#define LLAMA "{'architectures': ['LlamaForCausalLM'], " CORE ", 'num_attention_heads': 4"

static void test_each_architecture_takes_its_class_defaults(void) {
    lm_model_config c;
    LT_CHECK_OK(parseq(LLAMA "}", &c));
    LT_CHECK(c.arch == LM_ARCH_LLAMA && !strcmp(lm_arch_name(c.arch), "llama"));
    LT_CHECK(c.vocab_size == 100 && c.hidden_size == 64 && c.intermediate_size == 96 && c.num_hidden_layers == 2);
    LT_CHECK(c.num_attention_heads == 4 && c.num_key_value_heads == 4 && c.head_dim == 16);
    LT_CHECK(c.max_position_embeddings == 2048 && c.rms_norm_eps == 1e-6 && c.rope_theta == 10000);
    LT_CHECK(c.rope_scaling.type == LM_ROPE_DEFAULT && !c.tie_word_embeddings);
    LT_CHECK(!c.qkv_bias && !c.o_bias && !c.mlp_bias && !c.qk_norm && c.sliding_window == 0);
    LT_CHECK(c.dtype == LM_F32 && !c.dtype_given && c.bos_token_id == 1 && c.pad_token_id == -1);
    LT_CHECK(c.n_eos == 1 && c.eos_token_ids[0] == 2);
    LT_CHECK(!c.generation.present && c.generation.temperature == 1.0 && c.generation.top_k == 50 &&
             c.generation.top_p == 1.0 && !c.generation.do_sample);

    LT_CHECK_OK(parseq("{'architectures': ['MistralForCausalLM'], " CORE ", 'num_attention_heads': 8}", &c));
    LT_CHECK(c.arch == LM_ARCH_MISTRAL && c.num_key_value_heads == 8 && c.head_dim == 8);
    LT_CHECK(c.max_position_embeddings == 131072 && c.sliding_window == 4096 && c.sliding_window_first_layer == 0);
    LT_CHECK(c.bos_token_id == 1 && c.n_eos == 1 && !c.qkv_bias);

    LT_CHECK_OK(parseq("{'architectures': ['Qwen2ForCausalLM'], " CORE ", 'num_attention_heads': 32}", &c));
    LT_CHECK(c.arch == LM_ARCH_QWEN2 && c.num_key_value_heads == 32 && c.head_dim == 2);
    LT_CHECK(c.qkv_bias && !c.o_bias && !c.qk_norm && c.max_position_embeddings == 32768);
    LT_CHECK(c.bos_token_id == -1 && c.n_eos == 0 && c.sliding_window == 0);

    LT_CHECK_OK(parseq("{'model_type': 'qwen3', " CORE ", 'num_attention_heads': 32}", &c));
    LT_CHECK(c.arch == LM_ARCH_QWEN3 && c.head_dim == 128 && c.num_key_value_heads == 32);
    LT_CHECK(c.qk_norm && !c.qkv_bias && !c.o_bias && !strcmp(lm_arch_name(c.arch), "qwen3"));
    LT_CHECK(!strcmp(lm_arch_name((lm_arch)9), "invalid") && !strcmp(lm_rope_type_name(LM_ROPE_YARN), "yarn"));
}

static void test_gqa_head_dim_biases_and_null_semantics(void) {
    lm_model_config c;
    LT_CHECK_OK(parseq("{'architectures': ['LlamaForCausalLM'], " CORE ", 'num_attention_heads': 8, "
                       "'num_key_value_heads': 2, 'head_dim': 32, 'attention_bias': true, 'mlp_bias': true}",
                       &c));
    LT_CHECK(c.num_key_value_heads == 2 && c.head_dim == 32 && c.qkv_bias && c.o_bias && c.mlp_bias);
    LT_CHECK_OK(parseq("{'architectures': ['MistralForCausalLM'], " CORE ", 'num_attention_heads': 4, "
                       "'num_key_value_heads': null, 'attention_bias': true}",
                       &c));
    LT_CHECK(c.num_key_value_heads == 4 && !c.qkv_bias && !c.o_bias); /* null -> heads; mistral has no bias */
    LT_CHECK_OK(parseq("{'architectures': ['Qwen3ForCausalLM'], " CORE ", 'num_attention_heads': 4, "
                       "'num_key_value_heads': 1, 'head_dim': null, 'attention_bias': true}",
                       &c));
    LT_CHECK(c.head_dim == 16 && c.num_key_value_heads == 1 && c.qkv_bias && c.o_bias && c.qk_norm);
    LT_CHECK_OK(parseq("{'architectures': ['Qwen2ForCausalLM'], " CORE ", 'num_attention_heads': 4, "
                       "'num_key_value_heads': 4, 'head_dim': 24, 'attention_bias': false}",
                       &c));
    LT_CHECK(c.head_dim == 24 && c.qkv_bias && !c.o_bias); /* qwen2 always has q/k/v bias */
}

static void check_spec(const lm_model_config *c, int64_t i, const char *name, int ndim, int64_t d0, int64_t d1) {
    lm_tensor_spec s;
    LT_CHECK_OK(lm_model_config_tensor(c, i, &s));
    int ok = !strcmp(s.name, name) && s.ndim == ndim && s.shape[0] == d0 && (ndim == 1 || s.shape[1] == d1);
    LT_CHECK_MSG(ok, "spec %lld: got '%s' ndim %d [%lld,%lld], expected '%s' [%lld,%lld]", (long long)i, s.name,
                 s.ndim, (long long)s.shape[0], (long long)s.shape[1], name, (long long)d0, (long long)d1);
}

static void test_expected_tensor_lists_follow_hf_names(void) {
    lm_model_config c;
    LT_CHECK_OK(parseq("{'architectures': ['Qwen3ForCausalLM'], 'vocab_size': 50, 'hidden_size': 32, "
                       "'intermediate_size': 48, 'num_hidden_layers': 1, 'num_attention_heads': 4, "
                       "'num_key_value_heads': 2, 'head_dim': 16, 'attention_bias': true, "
                       "'tie_word_embeddings': false}",
                       &c));
    static const struct {
        const char *name;
        int ndim;
        int64_t d0, d1;
    } want[] = {
        {"model.embed_tokens.weight", 2, 50, 32},
        {"model.layers.0.input_layernorm.weight", 1, 32, 0},
        {"model.layers.0.self_attn.q_proj.weight", 2, 64, 32},
        {"model.layers.0.self_attn.q_proj.bias", 1, 64, 0},
        {"model.layers.0.self_attn.k_proj.weight", 2, 32, 32},
        {"model.layers.0.self_attn.k_proj.bias", 1, 32, 0},
        {"model.layers.0.self_attn.v_proj.weight", 2, 32, 32},
        {"model.layers.0.self_attn.v_proj.bias", 1, 32, 0},
        {"model.layers.0.self_attn.o_proj.weight", 2, 32, 64},
        {"model.layers.0.self_attn.o_proj.bias", 1, 32, 0},
        {"model.layers.0.self_attn.q_norm.weight", 1, 16, 0},
        {"model.layers.0.self_attn.k_norm.weight", 1, 16, 0},
        {"model.layers.0.post_attention_layernorm.weight", 1, 32, 0},
        {"model.layers.0.mlp.gate_proj.weight", 2, 48, 32},
        {"model.layers.0.mlp.up_proj.weight", 2, 48, 32},
        {"model.layers.0.mlp.down_proj.weight", 2, 32, 48},
        {"model.norm.weight", 1, 32, 0},
        {"lm_head.weight", 2, 50, 32},
    };
    int n = (int)(sizeof want / sizeof want[0]);
    LT_CHECK(lm_model_config_tensor_count(&c) == n);
    for (int i = 0; i < n; i++) check_spec(&c, i, want[i].name, want[i].ndim, want[i].d0, want[i].d1);
    lm_tensor_spec s;
    LT_CHECK_STATUS(lm_model_config_tensor(&c, n, &s), LM_OUT_OF_RANGE);
    LT_CHECK_STATUS(lm_model_config_tensor(&c, -1, &s), LM_OUT_OF_RANGE);
}

static void test_tied_and_untied_embeddings(void) {
    lm_model_config c;
    LT_CHECK_OK(parseq("{'architectures': ['LlamaForCausalLM'], 'vocab_size': 100, 'hidden_size': 64, "
                       "'intermediate_size': 96, 'num_hidden_layers': 3, 'num_attention_heads': 4, "
                       "'tie_word_embeddings': true}",
                       &c));
    LT_CHECK(c.tie_word_embeddings && lm_model_config_tensor_count(&c) == 2 + 3 * 9);
    check_spec(&c, 2 + 3 * 9 - 1, "model.norm.weight", 1, 64, 0);
    check_spec(&c, 1 + 2 * 9 + 8, "model.layers.2.mlp.down_proj.weight", 2, 64, 96);
    LT_CHECK_OK(parseq("{'architectures': ['LlamaForCausalLM'], 'vocab_size': 100, 'hidden_size': 64, "
                       "'intermediate_size': 96, 'num_hidden_layers': 3, 'num_attention_heads': 4, "
                       "'tie_word_embeddings': false}",
                       &c));
    LT_CHECK(!c.tie_word_embeddings && lm_model_config_tensor_count(&c) == 3 + 3 * 9);
    check_spec(&c, 3 + 3 * 9 - 1, "lm_head.weight", 2, 100, 64);
}

static const char *k_rope_cases[] = {"llama_default",    "qwen3_theta1e6", "llama_linear",
                                     "llama31",          "llama3_wide_band", "qwen2_yarn",
                                     "mistral_yarn_mscale", "llama_yarn_explicit", "qwen3_rope_parameters"};

static lm_status load_case(const char *name, lm_model_config *c) {
    char path[1024], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/tests/data/io/rope/%s.json", LOOM_SOURCE_DIR, name);
    lm_status s = lm_file_read_all(path, &text, &len);
    if (s == LM_OK) s = lm_model_config_parse(text, len, path, c);
    lm_free(text);
    return s;
}

static void test_rope_matches_transformers_formulas(void) {
    lt_fixture fx;
    if (!lt_fixture_load("tests/data/io/rope_ref.lmfx", &fx)) return;
    for (size_t k = 0; k < sizeof k_rope_cases / sizeof k_rope_cases[0]; k++) {
        lm_model_config c;
        LT_CHECK_OK(load_case(k_rope_cases[k], &c));
        char name[64];
        snprintf(name, sizeof name, "%s.inv_freq", k_rope_cases[k]);
        const lt_fixture_tensor *inv = lt_fixture_get(&fx, name);
        snprintf(name, sizeof name, "%s.attn", k_rope_cases[k]);
        const lt_fixture_tensor *attn = lt_fixture_get(&fx, name);
        if (!inv || !attn) continue;
        LT_CHECK_MSG(inv->numel == c.head_dim / 2, "%s: head_dim %lld vs %lld frequencies", k_rope_cases[k],
                     (long long)c.head_dim, (long long)inv->numel);
        if (inv->numel != c.head_dim / 2) continue;
        double *got = malloc(sizeof(double) * (size_t)inv->numel), scale = -1;
        LT_CHECK_OK(lm_model_config_rope(&c, got, &scale));
        /* both sides are float64 evaluations of the same formula: agreement to rounding */
        lt_check_close(k_rope_cases[k], got, inv->f64, inv->numel, 1e-26, 1e-15);
        LT_CHECK_MSG(fabs(scale - attn->f64[0]) < 1e-14, "%s: attention scaling %.17g != %.17g", k_rope_cases[k],
                     scale, attn->f64[0]);
        free(got);
    }
    lt_fixture_free(&fx);

    /* the parsed parameters behind a few of the cases */
    lm_model_config c;
    LT_CHECK_OK(load_case("qwen2_yarn", &c));
    LT_CHECK(c.rope_scaling.type == LM_ROPE_YARN && c.rope_scaling.factor == 4 && c.rope_scaling.beta_fast == 32 &&
             c.rope_scaling.beta_slow == 1 && c.rope_scaling.truncate && c.rope_scaling.attention_factor == 0);
    LT_CHECK_OK(load_case("qwen3_rope_parameters", &c));
    LT_CHECK(c.rope_theta == 50000 && c.rope_scaling.type == LM_ROPE_YARN &&
             c.rope_scaling.original_max_position_embeddings == 2048);
    LT_CHECK_OK(load_case("llama31", &c));
    LT_CHECK(c.rope_scaling.type == LM_ROPE_LLAMA3 && c.rope_scaling.low_freq_factor == 1 &&
             c.rope_scaling.high_freq_factor == 4 && c.rope_scaling.original_max_position_embeddings == 8192);
}

static void test_rope_default_and_linear_match_closed_form(void) {
    lt_rng r = lt_rng_seed(7);
    for (int trial = 0; trial < 20; trial++) {
        lm_model_config c;
        memset(&c, 0, sizeof c);
        c.head_dim = 2 * lt_rng_int(&r, 1, 80);
        c.rope_theta = trial % 2 ? 10000.0 : 1e6 * lt_rng_uniform(&r) + 2;
        c.rope_scaling.type = trial % 3 == 0 ? LM_ROPE_LINEAR : LM_ROPE_DEFAULT;
        c.rope_scaling.factor = 1 + 7 * lt_rng_uniform(&r);
        int64_t half = c.head_dim / 2;
        double *got = malloc(sizeof(double) * (size_t)half), *want = malloc(sizeof(double) * (size_t)half), s = 0;
        LT_CHECK_OK(lm_model_config_rope(&c, got, &s));
        for (int64_t i = 0; i < half; i++) {
            want[i] = exp(-(double)(2 * i) / (double)c.head_dim * log(c.rope_theta));
            if (c.rope_scaling.type == LM_ROPE_LINEAR) want[i] /= c.rope_scaling.factor;
        }
        lt_check_close("rope closed form", got, want, half, 1e-26, 1e-14);
        LT_CHECK(s == 1.0);
        free(got);
        free(want);
    }
    lm_model_config c;
    memset(&c, 0, sizeof c);
    double inv[4], s;
    c.head_dim = 7;
    c.rope_theta = 10000;
    LT_CHECK_STATUS(lm_model_config_rope(&c, inv, &s), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_model_config_rope(NULL, inv, &s), LM_INVALID_ARGUMENT);
}

static void test_eos_lists_and_generation_config_merge(void) {
    lm_model_config c;
    LT_CHECK_OK(parseq(LLAMA ", 'bos_token_id': 128000, 'eos_token_id': [128001, 128008, 128009], "
                             "'pad_token_id': null}",
                       &c));
    LT_CHECK(c.bos_token_id == 128000 && c.pad_token_id == -1 && c.n_eos == 3 && c.eos_token_ids[2] == 128009);
    LT_CHECK_OK(mergeq(&c, "{'bos_token_id': 5, 'eos_token_id': [128009, 7], 'pad_token_id': 0, "
                           "'do_sample': true, 'temperature': 0.6, 'top_p': 0.9, 'top_k': 20}"));
    LT_CHECK(c.n_eos == 4 && c.eos_token_ids[3] == 7 && c.bos_token_id == 128000 && c.pad_token_id == 0);
    LT_CHECK(c.generation.present && c.generation.do_sample && c.generation.temperature == 0.6 &&
             c.generation.top_p == 0.9 && c.generation.top_k == 20);
    LT_CHECK_OK(parseq("{'architectures': ['Qwen2ForCausalLM'], " CORE ", 'num_attention_heads': 4, "
                       "'num_key_value_heads': 4, 'eos_token_id': 151643, 'bos_token_id': null}",
                       &c));
    LT_CHECK(c.n_eos == 1 && c.eos_token_ids[0] == 151643 && c.bos_token_id == -1);
    LT_CHECK_OK(mergeq(&c, "{'bos_token_id': 151643, 'eos_token_id': 151645}"));
    LT_CHECK(c.bos_token_id == 151643 && c.n_eos == 2 && c.eos_token_ids[1] == 151645);
    LT_CHECK(c.generation.top_k == 50 && !c.generation.do_sample);
    lm_model_config before = c;
    LT_CHECK_STATUS(mergeq(&c, "{'eos_token_id': 9, 'top_p': 1.5}"), LM_PARSE_ERROR);
    LT_CHECK(has("top_p") && has("t/generation_config.json"));
    LT_CHECK(!memcmp(&before, &c, sizeof c)); /* unchanged on failure */
    LT_CHECK_STATUS(mergeq(&c, "{'eos_token_id': 'x'}"), LM_PARSE_ERROR);
    LT_CHECK(has("eos_token_id"));
    LT_CHECK_OK(parseq(LLAMA ", 'eos_token_id': null}", &c));
    LT_CHECK(c.n_eos == 0);
    LT_CHECK_STATUS(parseq(LLAMA ", 'eos_token_id': [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", &c),
                    LM_PARSE_ERROR);
    LT_CHECK(has("eos_token_id"));
}

static void test_sliding_window_is_kept_only_when_active(void) {
    lm_model_config c;
    LT_CHECK_OK(parseq("{'architectures': ['MistralForCausalLM'], " CORE ", 'num_attention_heads': 4, "
                       "'num_key_value_heads': 4, 'sliding_window': null}",
                       &c));
    LT_CHECK(c.sliding_window == 0);
    LT_CHECK_OK(parseq("{'architectures': ['MistralForCausalLM'], " CORE ", 'num_attention_heads': 4, "
                       "'num_key_value_heads': 4, 'sliding_window': 4096, 'max_position_embeddings': 4096}",
                       &c));
    LT_CHECK(c.sliding_window == 0); /* a window as long as the context changes nothing */
    LT_CHECK_OK(parseq("{'architectures': ['Qwen2ForCausalLM'], " CORE ", 'num_attention_heads': 4, "
                       "'num_key_value_heads': 4, 'sliding_window': 1024, 'use_sliding_window': false}",
                       &c));
    LT_CHECK(c.sliding_window == 0);
    LT_CHECK_OK(parseq("{'architectures': ['Qwen2ForCausalLM'], " CORE ", 'num_attention_heads': 4, "
                       "'num_key_value_heads': 4, 'sliding_window': 1024, 'use_sliding_window': true, "
                       "'max_window_layers': 1}",
                       &c));
    LT_CHECK(c.sliding_window == 1024 && c.sliding_window_first_layer == 1);
    LT_CHECK_OK(parseq("{'architectures': ['Qwen3ForCausalLM'], " CORE ", 'num_attention_heads': 4, "
                       "'num_key_value_heads': 4, 'use_sliding_window': true}",
                       &c));
    LT_CHECK(c.sliding_window == 4096 && c.sliding_window_first_layer == 28);
}

static void test_dtype_and_version_spellings(void) {
    lm_model_config c;
    LT_CHECK_OK(parseq(LLAMA ", 'torch_dtype': 'bfloat16'}", &c));
    LT_CHECK(c.dtype == LM_BF16 && c.dtype_given);
    LT_CHECK_OK(parseq(LLAMA ", 'dtype': 'float16', 'torch_dtype': 'float32'}", &c));
    LT_CHECK(c.dtype == LM_F16); /* transformers 5 spelling wins */
    LT_CHECK_STATUS(parseq(LLAMA ", 'torch_dtype': 'float64'}", &c), LM_UNSUPPORTED);
    LT_CHECK(has("'float64'") && has("t/config.json"));
    LT_CHECK_OK(parseq(LLAMA ", 'rope_scaling': {'rope_type': 'default'}, 'rope_theta': 500000}", &c));
    LT_CHECK(c.rope_scaling.type == LM_ROPE_DEFAULT && c.rope_theta == 500000);
    LT_CHECK_OK(parseq(LLAMA ", 'rope_scaling': {'type': 'linear', 'factor': 2}}", &c));
    LT_CHECK(c.rope_scaling.type == LM_ROPE_LINEAR && c.rope_scaling.factor == 2);
}

typedef struct err_case {
    const char *json;
    lm_status want;
    const char *needle1, *needle2;
} err_case;

static void test_errors_name_field_and_file(void) {
    static const err_case cases[] = {
        {"{'architectures': ['GPT2LMHeadModel'], " CORE ", 'num_attention_heads': 4}", LM_UNSUPPORTED,
         "'GPT2LMHeadModel'", NULL},
        {"{'model_type': 'gemma', " CORE ", 'num_attention_heads': 4}", LM_UNSUPPORTED, "'gemma'", NULL},
        {"{'architectures': ['LlamaForCausalLM'], 'model_type': 'qwen2', " CORE ", 'num_attention_heads': 4}",
         LM_PARSE_ERROR, "LlamaForCausalLM", "'qwen2'"},
        {"{" CORE ", 'num_attention_heads': 4}", LM_PARSE_ERROR, "\"architectures\"", NULL},
        {LLAMA ", 'rope_scaling': {'rope_type': 'dynamic', 'factor': 2}}", LM_UNSUPPORTED, "'dynamic'", NULL},
        {LLAMA ", 'rope_scaling': {'type': 'longrope', 'factor': 2}}", LM_UNSUPPORTED, "'longrope'", NULL},
        {LLAMA ", 'rope_scaling': {'factor': 2}}", LM_PARSE_ERROR, "rope_scaling.rope_type", NULL},
        {LLAMA ", 'rope_scaling': {'rope_type': 'llama3', 'factor': 8, 'high_freq_factor': 4, "
               "'original_max_position_embeddings': 8192}}",
         LM_PARSE_ERROR, "\"rope_scaling.low_freq_factor\"", NULL},
        {LLAMA ", 'rope_scaling': {'rope_type': 'llama3', 'factor': 8, 'low_freq_factor': 4, "
               "'high_freq_factor': 4, 'original_max_position_embeddings': 8192}}",
         LM_PARSE_ERROR, "high_freq_factor", NULL},
        {LLAMA ", 'rope_scaling': {'rope_type': 'linear'}}", LM_PARSE_ERROR, "\"rope_scaling.factor\"", NULL},
        {LLAMA ", 'rope_scaling': {'rope_type': 'yarn', 'factor': -4}}", LM_PARSE_ERROR, "rope_scaling.factor", NULL},
        {LLAMA ", 'rope_scaling': {'rope_type': 'yarn', 'factor': 4, 'attention_factor': 0}}", LM_PARSE_ERROR,
         "rope_scaling.attention_factor", NULL},
        {LLAMA ", 'rope_scaling': [1]}", LM_PARSE_ERROR, "rope_scaling", NULL},
        {LLAMA ", 'rope_parameters': {'rope_type': 'yarn'}}", LM_PARSE_ERROR, "rope_parameters.factor", NULL},
        {LLAMA ", 'rope_theta': 1}", LM_PARSE_ERROR, "rope_theta", NULL},
        {"{'architectures': ['LlamaForCausalLM'], 'vocab_size': 100, 'intermediate_size': 96, "
         "'num_hidden_layers': 2, 'num_attention_heads': 4}",
         LM_PARSE_ERROR, "missing required field \"hidden_size\"", NULL},
        {"{'architectures': ['LlamaForCausalLM'], 'vocab_size': 100, 'hidden_size': 64, 'intermediate_size': 96, "
         "'num_hidden_layers': 2}",
         LM_PARSE_ERROR, "\"num_attention_heads\"", NULL},
        {"{'architectures': ['LlamaForCausalLM'], 'vocab_size': '100', 'hidden_size': 64, 'intermediate_size': 96, "
         "'num_hidden_layers': 2, 'num_attention_heads': 4}",
         LM_PARSE_ERROR, "\"vocab_size\"", "integer"},
        {"{'architectures': ['LlamaForCausalLM'], 'vocab_size': 100, 'hidden_size': 64.0, 'intermediate_size': 96, "
         "'num_hidden_layers': 2, 'num_attention_heads': 4}",
         LM_PARSE_ERROR, "\"hidden_size\"", NULL},
        {"{'architectures': ['LlamaForCausalLM'], 'vocab_size': 100, 'hidden_size': 64, 'intermediate_size': 0, "
         "'num_hidden_layers': 2, 'num_attention_heads': 4}",
         LM_PARSE_ERROR, "\"intermediate_size\" is 0", NULL},
        {LLAMA ", 'hidden_act': 'gelu'}", LM_UNSUPPORTED, "'gelu'", NULL},
        {LLAMA ", 'num_key_value_heads': 3}", LM_PARSE_ERROR, "num_key_value_heads 3", NULL},
        {LLAMA ", 'head_dim': 15}", LM_PARSE_ERROR, "head_dim 15", NULL},
        {LLAMA ", 'rms_norm_eps': 0}", LM_PARSE_ERROR, "rms_norm_eps", NULL},
        {LLAMA ", 'tie_word_embeddings': 1}", LM_PARSE_ERROR, "tie_word_embeddings", NULL},
        {LLAMA ", 'architectures': ['LlamaForCausalLM']}", LM_PARSE_ERROR, "duplicate", "line 1"},
        {"{'architectures': ['LlamaForCausalLM'], 'vocab_size': 100,", LM_PARSE_ERROR, "not valid JSON", "column"},
        {"[1, 2]", LM_PARSE_ERROR, "not a JSON object", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lm_model_config c;
        memset(&c, 0x5a, sizeof c);
        lm_status s = parseq(cases[i].json, &c);
        LT_CHECK_MSG(s == cases[i].want, "case %zu: got %s (%s)", i, lm_status_name(s), lm_last_error());
        LT_CHECK_MSG(has("t/config.json") && has(cases[i].needle1) && (!cases[i].needle2 || has(cases[i].needle2)),
                     "case %zu: %s", i, cases[i].json);
        lm_model_config zero;
        memset(&zero, 0, sizeof zero);
        LT_CHECK_MSG(!memcmp(&c, &zero, sizeof c), "case %zu: output not zeroed on failure", i);
    }
}

static void test_load_reads_config_and_generation_files(void) {
    char dir[512], p[600];
    snprintf(dir, sizeof dir, "%s/model", g_dir);
    mkdir(dir, 0700);
    tw_path(p, sizeof p, dir, "config.json");
    tw_write_text(p, "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 100, \"hidden_size\": 64,\n"
                     " \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,\n"
                     " \"eos_token_id\": 2}\n");
    lm_model_config c;
    LT_CHECK_OK(lm_model_config_load(dir, &c));
    LT_CHECK(c.arch == LM_ARCH_LLAMA && !c.generation.present && c.n_eos == 1);
    tw_path(p, sizeof p, dir, "generation_config.json");
    tw_write_text(p, "{\"eos_token_id\": [2, 3], \"temperature\": 0.7, \"do_sample\": true}");
    LT_CHECK_OK(lm_model_config_load(dir, &c));
    LT_CHECK(c.generation.present && c.n_eos == 2 && c.eos_token_ids[1] == 3 && c.generation.temperature == 0.7);
    tw_write_text(p, "{\"eos_token_id\": [2, 3],\n \"temperature\": }");
    LT_CHECK_STATUS(lm_model_config_load(dir, &c), LM_PARSE_ERROR);
    LT_CHECK(has("generation_config.json") && has("line 2"));
    unlink(p);
    tw_path(p, sizeof p, dir, "config.json");
    tw_write_text(p, "{\"architectures\": [\"LlamaForCausalLM\"],\n \"vocab_size\": 100}");
    LT_CHECK_STATUS(lm_model_config_load(dir, &c), LM_PARSE_ERROR);
    LT_CHECK(has(p) && has("hidden_size"));
    unlink(p);
    LT_CHECK_STATUS(lm_model_config_load(dir, &c), LM_IO_ERROR);
    LT_CHECK(has("config.json"));
    LT_CHECK_STATUS(lm_model_config_load(NULL, &c), LM_INVALID_ARGUMENT);
    tw_rmtree(dir);
}

/* ---- config vs checkpoint ---------------------------------------------------------- */

static uint8_t g_zeros[64 * 64 * 4];

typedef struct ck_list {
    tw_tensor t[64];
    char names[64][96];
    int n;
} ck_list;

static void add(ck_list *l, const char *name, const char *dtype, int ndim, int64_t d0, int64_t d1) {
    tw_tensor *t = &l->t[l->n];
    snprintf(l->names[l->n], sizeof l->names[0], "%s", name);
    *t = (tw_tensor){l->names[l->n], dtype, ndim, {d0, d1}, g_zeros, 0};
    t->nbytes = (size_t)(d0 * (ndim == 2 ? d1 : 1)) * (strcmp(dtype, "F32") && strcmp(dtype, "I32") ? 2 : 4);
    l->n++;
}

/* A hand-written llama checkpoint: vocab 50, hidden 32, intermediate 64, 4 heads of
 * 8, 2 kv heads, 2 layers; weights f16, norms f32. */
static void llama_list(ck_list *l, int with_head) {
    l->n = 0;
    add(l, "model.embed_tokens.weight", "F16", 2, 50, 32);
    for (int i = 0; i < 2; i++) {
        char b[96];
#define LAYER(suffix, dt, nd, a, c)                                    \
    snprintf(b, sizeof b, "model.layers.%d." suffix, i);              \
    add(l, b, dt, nd, a, c)
        LAYER("input_layernorm.weight", "F32", 1, 32, 0);
        LAYER("self_attn.q_proj.weight", "F16", 2, 32, 32);
        LAYER("self_attn.k_proj.weight", "F16", 2, 16, 32);
        LAYER("self_attn.v_proj.weight", "F16", 2, 16, 32);
        LAYER("self_attn.o_proj.weight", "F16", 2, 32, 32);
        LAYER("post_attention_layernorm.weight", "F32", 1, 32, 0);
        LAYER("mlp.gate_proj.weight", "F16", 2, 64, 32);
        LAYER("mlp.up_proj.weight", "F16", 2, 64, 32);
        LAYER("mlp.down_proj.weight", "F16", 2, 32, 64);
#undef LAYER
    }
    add(l, "model.norm.weight", "F32", 1, 32, 0);
    if (with_head) add(l, "lm_head.weight", "F16", 2, 50, 32);
}

static int find(ck_list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->names[i], name)) return i;
    return -1;
}

static lm_status check_against(const char *cfg_json, ck_list *l) {
    char file[600];
    tw_path(file, sizeof file, g_dir, "model.safetensors");
    tw_write_safetensors(file, l->t, l->n, 0);
    lm_model_config c;
    lm_status s = parseq(cfg_json, &c);
    LT_CHECK_OK(s);
    lm_checkpoint *ck = NULL;
    if (s == LM_OK) s = lm_checkpoint_open(file, &ck);
    LT_CHECK_OK(s);
    if (s == LM_OK) s = lm_model_config_check_checkpoint(&c, ck);
    lm_checkpoint_close(ck);
    unlink(file);
    return s;
}

#define SMALL(arch, extra)                                                                                       \
    "{'architectures': ['" arch "'], 'vocab_size': 50, 'hidden_size': 32, 'intermediate_size': 64, "            \
    "'num_hidden_layers': 2, 'num_attention_heads': 4, 'num_key_value_heads': 2" extra "}"

static void test_checkpoint_check_names_the_offending_tensor(void) {
    ck_list l;
    llama_list(&l, 1);
    LT_CHECK_OK(check_against(SMALL("LlamaForCausalLM", ""), &l));
    LT_CHECK_OK(check_against(SMALL("MistralForCausalLM", ""), &l));
    LT_CHECK_OK(check_against(SMALL("LlamaForCausalLM", ", 'tie_word_embeddings': true"), &l)); /* head kept */

    l.t[find(&l, "model.layers.1.mlp.up_proj.weight")].shape[0] = 32;
    l.t[find(&l, "model.layers.1.mlp.up_proj.weight")].nbytes = 32 * 32 * 2;
    LT_CHECK_STATUS(check_against(SMALL("LlamaForCausalLM", ""), &l), LM_SHAPE_MISMATCH);
    LT_CHECK_MSG(!strcmp(lm_last_error(), "tensor 'model.layers.1.mlp.up_proj.weight': shape [32,32] != expected "
                                          "[64,32]"),
                 "detail: %s", lm_last_error());

    llama_list(&l, 1);
    int k = find(&l, "model.layers.0.self_attn.k_proj.weight");
    l.t[k] = l.t[--l.n];
    strcpy(l.names[k], l.names[l.n]);
    l.t[k].name = l.names[k];
    LT_CHECK_STATUS(check_against(SMALL("LlamaForCausalLM", ""), &l), LM_NOT_FOUND);
    LT_CHECK(has("'model.layers.0.self_attn.k_proj.weight'"));

    llama_list(&l, 0);
    LT_CHECK_STATUS(check_against(SMALL("LlamaForCausalLM", ""), &l), LM_NOT_FOUND);
    LT_CHECK(has("'lm_head.weight'"));
    LT_CHECK_OK(check_against(SMALL("LlamaForCausalLM", ", 'tie_word_embeddings': true"), &l));

    llama_list(&l, 1);
    l.t[find(&l, "lm_head.weight")].shape[0] = 25;
    l.t[find(&l, "lm_head.weight")].nbytes = 25 * 32 * 2;
    LT_CHECK_STATUS(check_against(SMALL("LlamaForCausalLM", ", 'tie_word_embeddings': true"), &l), LM_SHAPE_MISMATCH);
    LT_CHECK(has("'lm_head.weight': shape [25,32] != expected [50,32]"));

    llama_list(&l, 1);
    l.t[find(&l, "model.norm.weight")].dtype = "I32";
    LT_CHECK_STATUS(check_against(SMALL("LlamaForCausalLM", ""), &l), LM_DTYPE_MISMATCH);
    LT_CHECK(has("'model.norm.weight'") && has("i32"));
    l.t[find(&l, "model.norm.weight")].dtype = "F64";
    l.t[find(&l, "model.norm.weight")].nbytes = 32 * 8;
    LT_CHECK_STATUS(check_against(SMALL("LlamaForCausalLM", ""), &l), LM_UNSUPPORTED);
    LT_CHECK(has("'model.norm.weight'") && has("'F64'"));

    /* qwen2 needs q/k/v biases, qwen3 q/k norms, llama attention_bias an o_proj bias too */
    llama_list(&l, 1);
    LT_CHECK_STATUS(check_against(SMALL("Qwen2ForCausalLM", ", 'head_dim': 8"), &l), LM_NOT_FOUND);
    LT_CHECK(has("'model.layers.0.self_attn.q_proj.bias'"));
    LT_CHECK_STATUS(check_against(SMALL("Qwen3ForCausalLM", ", 'head_dim': 8"), &l), LM_NOT_FOUND);
    LT_CHECK(has("'model.layers.0.self_attn.q_norm.weight'"));
    for (int i = 0; i < 2; i++) {
        char b[96];
        snprintf(b, sizeof b, "model.layers.%d.self_attn.q_norm.weight", i);
        add(&l, b, "F32", 1, 8, 0);
        snprintf(b, sizeof b, "model.layers.%d.self_attn.k_norm.weight", i);
        add(&l, b, "F32", 1, 8, 0);
    }
    LT_CHECK_OK(check_against(SMALL("Qwen3ForCausalLM", ", 'head_dim': 8"), &l));
    for (int i = 0; i < 2; i++) {
        char b[96];
        snprintf(b, sizeof b, "model.layers.%d.self_attn.q_proj.bias", i);
        add(&l, b, "F32", 1, 32, 0);
        snprintf(b, sizeof b, "model.layers.%d.self_attn.k_proj.bias", i);
        add(&l, b, "F32", 1, 16, 0);
        snprintf(b, sizeof b, "model.layers.%d.self_attn.v_proj.bias", i);
        add(&l, b, "F32", 1, 8, 0); /* wrong: 2 kv heads x 8 = 16 */
    }
    LT_CHECK_STATUS(check_against(SMALL("Qwen2ForCausalLM", ", 'head_dim': 8"), &l), LM_SHAPE_MISMATCH);
    LT_CHECK(has("'model.layers.0.self_attn.v_proj.bias': shape [8] != expected [16]"));
    LT_CHECK_STATUS(check_against(SMALL("LlamaForCausalLM", ", 'attention_bias': true"), &l), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_model_config_check_checkpoint(NULL, NULL), LM_INVALID_ARGUMENT);
}

/* The small random checkpoints of tests/data/models (written by scripts/make_random_model.py
 * for the model tests) must parse and match their configs. */
static void test_reference_model_directories_match_their_configs(void) {
    char root[1024];
    snprintf(root, sizeof root, "%s/tests/data/models", LOOM_SOURCE_DIR);
    DIR *d = opendir(root);
    if (!d) {
        printf("  (no %s: nothing to check)\n", root);
        return;
    }
    struct dirent *e;
    int seen = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char dir[2048];
        snprintf(dir, sizeof dir, "%s/%s", root, e->d_name);
        lm_model_config c;
        lm_checkpoint *ck = NULL;
        lm_status s = lm_model_config_load(dir, &c);
        if (s == LM_OK) s = lm_checkpoint_open(dir, &ck);
        if (s == LM_OK) s = lm_model_config_check_checkpoint(&c, ck);
        LT_CHECK_MSG(s == LM_OK, "%s: %s (%s)", e->d_name, lm_status_name(s), lm_last_error());
        if (s == LM_OK) {
            double inv[512], scale;
            LT_CHECK_OK(c.head_dim <= 1024 ? lm_model_config_rope(&c, inv, &scale) : LM_OK);
        }
        lm_checkpoint_close(ck);
        seen++;
    }
    closedir(d);
    printf("  %d reference model directories checked\n", seen);
}

static void test_load_leaks_nothing_when_allocation_fails(void) {
    char dir[512], p[600];
    snprintf(dir, sizeof dir, "%s/oom", g_dir);
    mkdir(dir, 0700);
    tw_path(p, sizeof p, dir, "config.json");
    tw_write_text(p, "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 100, \"hidden_size\": 64, "
                     "\"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4}");
    tw_path(p, sizeof p, dir, "generation_config.json");
    tw_write_text(p, "{\"eos_token_id\": [2, 3]}");
    for (int k = 1; k <= 50; k++) {
        lt_alloc_track(k);
        lm_model_config c;
        lm_status s = lm_model_config_load(dir, &c);
        int64_t attempts = lt_alloc_count();
        if (k <= attempts) LT_CHECK_MSG(s == LM_OUT_OF_MEMORY, "fail_at %d: %s", k, lm_status_name(s));
        else LT_CHECK_OK(s);
        LT_CHECK_MSG(lt_alloc_live() == 0, "fail_at %d: %lld allocations leaked", k, (long long)lt_alloc_live());
        lt_alloc_untrack();
        if (k > attempts) break;
    }
    tw_rmtree(dir);
}

int main(void) {
    g_dir = tw_tmpdir();
    if (!g_dir) return lt_finish();
    LT_RUN(test_each_architecture_takes_its_class_defaults);
    LT_RUN(test_gqa_head_dim_biases_and_null_semantics);
    LT_RUN(test_expected_tensor_lists_follow_hf_names);
    LT_RUN(test_tied_and_untied_embeddings);
    LT_RUN(test_rope_matches_transformers_formulas);
    LT_RUN(test_rope_default_and_linear_match_closed_form);
    LT_RUN(test_eos_lists_and_generation_config_merge);
    LT_RUN(test_sliding_window_is_kept_only_when_active);
    LT_RUN(test_dtype_and_version_spellings);
    LT_RUN(test_errors_name_field_and_file);
    LT_RUN(test_load_reads_config_and_generation_files);
    LT_RUN(test_checkpoint_check_names_the_offending_tensor);
    LT_RUN(test_reference_model_directories_match_their_configs);
    LT_RUN(test_load_leaks_nothing_when_allocation_fails);
    tw_rmtree(g_dir);
    free(g_dir);
    return lt_finish();
}
