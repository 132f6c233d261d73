/* io/config.c — config.json and generation_config.json into lm_model_config.
 *
 * The architecture is resolved first (architectures[0], checked against model_type)
 * because transformers' defaults differ per config class; see the table in
 * loom/config.h. "Absent" and null differ where they differ in transformers (an
 * absent num_key_value_heads takes the class default, null means "= heads").
 * Every error names the field (with its rope_scaling. prefix when nested) and the
 * source file. Parsing writes into a local struct and copies it out only on success.
 */
#include "io/internal.h"
#include "loom/config.h"

#include <math.h>
#include <string.h>

#define DIM_MAX ((int64_t)INT32_MAX) /* dimensions stay far from int64 overflow in products */

typedef struct jctx {
    const char *src;    /* file name for messages */
    const char *prefix; /* "" or "rope_scaling." */
} jctx;

static const struct arch_info {
    const char *cls, *type;
    int64_t kv_heads; /* default when the key is absent; 0 = num_attention_heads */
    int64_t head_dim; /* default when absent; 0 = hidden_size / num_attention_heads */
    int64_t max_pos, bos, eos; /* -1 = none */
} k_archs[] = {
    [LM_ARCH_LLAMA] = {"LlamaForCausalLM", "llama", 0, 0, 2048, 1, 2},
    [LM_ARCH_MISTRAL] = {"MistralForCausalLM", "mistral", 8, 0, 131072, 1, 2},
    [LM_ARCH_QWEN2] = {"Qwen2ForCausalLM", "qwen2", 32, 0, 32768, -1, -1},
    [LM_ARCH_QWEN3] = {"Qwen3ForCausalLM", "qwen3", 32, 128, 32768, -1, -1},
};
#define N_ARCHS ((int)(sizeof k_archs / sizeof k_archs[0]))

const char *lm_arch_name(lm_arch a) { return (unsigned)a < (unsigned)N_ARCHS ? k_archs[a].type : "invalid"; }

const char *lm_rope_type_name(lm_rope_type t) {
    static const char *const names[] = {"default", "linear", "llama3", "yarn"};
    return (unsigned)t < 4u ? names[t] : "invalid";
}

/* The value of key, or NULL when absent or JSON null. */
static const json_t *field(const json_t *obj, const char *key) {
    const json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

static lm_status missing(const jctx *c, const char *key) {
    return lm__error(LM_PARSE_ERROR, "config '%s': missing required field \"%s%s\"", c->src, c->prefix, key);
}

static lm_status bad_type(const jctx *c, const char *key, const char *want) {
    return lm__error(LM_PARSE_ERROR, "config '%s': field \"%s%s\" is not %s", c->src, c->prefix, key, want);
}

/* Integer in [lo, hi]; absent/null gives dflt, or a missing-field error if required. */
static lm_status get_int(const jctx *c, const json_t *obj, const char *key, int required, int64_t dflt, int64_t lo,
                         int64_t hi, int64_t *out) {
    const json_t *v = field(obj, key);
    if (!v) {
        if (required) return missing(c, key);
        *out = dflt;
        return LM_OK;
    }
    if (!json_is_integer(v)) return bad_type(c, key, "an integer");
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return lm__error(LM_PARSE_ERROR, "config '%s': field \"%s%s\" is %lld, outside [%lld, %lld]", c->src,
                         c->prefix, key, (long long)x, (long long)lo, (long long)hi);
    *out = (int64_t)x;
    return LM_OK;
}

/* Number (integer or real) that must be > 0 when positive is set, >= 0 otherwise. */
static lm_status get_real(const jctx *c, const json_t *obj, const char *key, int required, double dflt, int positive,
                          double *out) {
    const json_t *v = field(obj, key);
    if (!v) {
        if (required) return missing(c, key);
        *out = dflt;
        return LM_OK;
    }
    if (!json_is_number(v)) return bad_type(c, key, "a number");
    double x = json_number_value(v);
    if (!isfinite(x) || x < 0 || (positive && x == 0))
        return lm__error(LM_PARSE_ERROR, "config '%s': field \"%s%s\" is %g, expected a %s number", c->src, c->prefix,
                         key, x, positive ? "positive" : "non-negative");
    *out = x;
    return LM_OK;
}

static lm_status get_bool(const jctx *c, const json_t *obj, const char *key, int dflt, int *out) {
    const json_t *v = field(obj, key);
    if (!v) {
        *out = dflt;
        return LM_OK;
    }
    if (!json_is_boolean(v)) return bad_type(c, key, "true or false");
    *out = json_is_true(v);
    return LM_OK;
}

static lm_status resolve_arch(const jctx *c, const json_t *root, lm_arch *out) {
    const json_t *archs = field(root, "architectures"), *type = field(root, "model_type");
    int from_cls = -1, from_type = -1;
    if (archs && (!json_is_array(archs) || (json_array_size(archs) && !json_is_string(json_array_get(archs, 0)))))
        return bad_type(c, "architectures", "a list of class names");
    if (type && !json_is_string(type)) return bad_type(c, "model_type", "a string");
    if (archs && json_array_size(archs)) {
        const char *cls = json_string_value(json_array_get(archs, 0));
        for (int i = 0; i < N_ARCHS; i++)
            if (strcmp(cls, k_archs[i].cls) == 0) from_cls = i;
        if (from_cls < 0)
            return lm__error(LM_UNSUPPORTED,
                             "config '%s': architecture '%s' is not supported (LlamaForCausalLM, MistralForCausalLM, "
                             "Qwen2ForCausalLM, Qwen3ForCausalLM)",
                             c->src, cls);
    }
    if (type) {
        for (int i = 0; i < N_ARCHS; i++)
            if (strcmp(json_string_value(type), k_archs[i].type) == 0) from_type = i;
        if (from_type < 0)
            return lm__error(LM_UNSUPPORTED,
                             "config '%s': model_type '%s' is not supported (llama, mistral, qwen2, qwen3)", c->src,
                             json_string_value(type));
    }
    if (from_cls < 0 && from_type < 0) return missing(c, "architectures");
    if (from_cls >= 0 && from_type >= 0 && from_cls != from_type)
        return lm__error(LM_PARSE_ERROR, "config '%s': architecture '%s' contradicts model_type '%s'", c->src,
                         k_archs[from_cls].cls, k_archs[from_type].type);
    *out = (lm_arch)(from_cls >= 0 ? from_cls : from_type);
    return LM_OK;
}

static lm_status parse_rope_type(const jctx *c, const json_t *rs, lm_rope_type *out) {
    const json_t *t = field(rs, "rope_type");
    if (!t) t = field(rs, "type");
    if (!t) return missing(c, "rope_type");
    if (!json_is_string(t)) return bad_type(c, "rope_type", "a string");
    static const char *const names[] = {"default", "linear", "llama3", "yarn"};
    for (int i = 0; i < 4; i++)
        if (strcmp(json_string_value(t), names[i]) == 0) {
            *out = (lm_rope_type)i;
            return LM_OK;
        }
    return lm__error(LM_UNSUPPORTED, "config '%s': rope type '%s' is not supported (default, linear, llama3, yarn)",
                     c->src, json_string_value(t));
}

static lm_status parse_yarn(const jctx *c, const json_t *rs, lm_rope_scaling *r) {
    LM_TRY(get_int(c, rs, "original_max_position_embeddings", 0, 0, 1, DIM_MAX, &r->original_max_position_embeddings));
    /* transformers reads beta_* with `or`, so 0 also selects the default */
    LM_TRY(get_real(c, rs, "beta_fast", 0, 32, 0, &r->beta_fast));
    LM_TRY(get_real(c, rs, "beta_slow", 0, 1, 0, &r->beta_slow));
    if (r->beta_fast == 0) r->beta_fast = 32;
    if (r->beta_slow == 0) r->beta_slow = 1;
    LM_TRY(get_real(c, rs, "attention_factor", 0, 0, 1, &r->attention_factor));
    LM_TRY(get_real(c, rs, "mscale", 0, 0, 0, &r->mscale));
    LM_TRY(get_real(c, rs, "mscale_all_dim", 0, 0, 0, &r->mscale_all_dim));
    return get_bool(c, rs, "truncate", 1, &r->truncate);
}

/* rs: the rope_scaling (or rope_parameters) object, or NULL for none. */
static lm_status parse_rope_scaling(const jctx *c, const json_t *rs, lm_rope_scaling *r) {
    *r = (lm_rope_scaling){.type = LM_ROPE_DEFAULT, .factor = 1, .beta_fast = 32, .beta_slow = 1, .truncate = 1};
    if (!rs) return LM_OK;
    if (!json_is_object(rs)) return lm__error(LM_PARSE_ERROR, "config '%s': \"%.*s\" is not an object or null",
                                              c->src, (int)strlen(c->prefix) - 1, c->prefix);
    LM_TRY(parse_rope_type(c, rs, &r->type));
    if (r->type == LM_ROPE_DEFAULT) return LM_OK;
    LM_TRY(get_real(c, rs, "factor", 1, 1, 1, &r->factor));
    if (r->type == LM_ROPE_YARN) return parse_yarn(c, rs, r);
    if (r->type != LM_ROPE_LLAMA3) return LM_OK;
    LM_TRY(get_real(c, rs, "low_freq_factor", 1, 0, 1, &r->low_freq_factor));
    LM_TRY(get_real(c, rs, "high_freq_factor", 1, 0, 1, &r->high_freq_factor));
    LM_TRY(get_int(c, rs, "original_max_position_embeddings", 1, 0, 1, DIM_MAX, &r->original_max_position_embeddings));
    if (r->high_freq_factor <= r->low_freq_factor)
        return lm__error(LM_PARSE_ERROR, "config '%s': %shigh_freq_factor %g must exceed low_freq_factor %g", c->src,
                         c->prefix, r->high_freq_factor, r->low_freq_factor);
    return LM_OK;
}

/* rope_theta and scaling from transformers-5 "rope_parameters" when present, else
 * from the legacy top-level "rope_theta" and "rope_scaling". */
static lm_status parse_rope(const jctx *c, const json_t *root, lm_model_config *cfg) {
    const json_t *params = field(root, "rope_parameters");
    jctx rc = {c->src, params ? "rope_parameters." : "rope_scaling."};
    LM_TRY(get_real(c, root, "rope_theta", 0, 10000, 1, &cfg->rope_theta));
    if (json_is_object(params)) LM_TRY(get_real(&rc, params, "rope_theta", 0, cfg->rope_theta, 1, &cfg->rope_theta));
    if (!(cfg->rope_theta > 1))
        return lm__error(LM_PARSE_ERROR, "config '%s': rope_theta %g must exceed 1", c->src, cfg->rope_theta);
    return parse_rope_scaling(&rc, params ? params : field(root, "rope_scaling"), &cfg->rope_scaling);
}

/* Adds the id(s) of an int-or-list field to the eos list, skipping duplicates. */
static lm_status add_eos(const jctx *c, const json_t *v, lm_model_config *cfg) {
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return bad_type(c, "eos_token_id", "a non-negative integer or a list of them");
        int64_t id = (int64_t)json_integer_value(e);
        int dup = 0;
        for (int k = 0; k < cfg->n_eos; k++) dup |= cfg->eos_token_ids[k] == id;
        if (dup) continue;
        if (cfg->n_eos == LM_MAX_EOS_TOKENS)
            return lm__error(LM_PARSE_ERROR, "config '%s': more than %d distinct eos_token_id values", c->src,
                             LM_MAX_EOS_TOKENS);
        cfg->eos_token_ids[cfg->n_eos++] = id;
    }
    return LM_OK;
}

/* bos/pad ids: negative values (old configs write -1) mean none. */
static lm_status get_token(const jctx *c, const json_t *root, const char *key, int64_t dflt, int64_t *out) {
    LM_TRY(get_int(c, root, key, 0, json_object_get(root, key) ? -1 : dflt, INT64_MIN, INT64_MAX, out));
    if (*out < 0) *out = -1;
    return LM_OK;
}

static lm_status parse_tokens(const jctx *c, const json_t *root, lm_model_config *cfg) {
    const struct arch_info *a = &k_archs[cfg->arch];
    LM_TRY(get_token(c, root, "bos_token_id", a->bos, &cfg->bos_token_id));
    LM_TRY(get_token(c, root, "pad_token_id", -1, &cfg->pad_token_id));
    const json_t *eos = field(root, "eos_token_id");
    if (eos) return add_eos(c, eos, cfg);
    if (!json_object_get(root, "eos_token_id") && a->eos >= 0) cfg->eos_token_ids[cfg->n_eos++] = a->eos;
    return LM_OK;
}

static lm_status parse_dtype(const jctx *c, const json_t *root, lm_model_config *cfg) {
    const char *key = field(root, "dtype") ? "dtype" : "torch_dtype";
    const json_t *v = field(root, key);
    cfg->dtype = LM_F32;
    if (!v) return LM_OK;
    if (!json_is_string(v)) return bad_type(c, key, "a string");
    static const struct {
        const char *name;
        lm_dtype dt;
    } names[] = {{"float32", LM_F32}, {"bfloat16", LM_BF16}, {"float16", LM_F16}};
    for (int i = 0; i < 3; i++)
        if (strcmp(json_string_value(v), names[i].name) == 0) {
            cfg->dtype = names[i].dt;
            cfg->dtype_given = 1;
            return LM_OK;
        }
    return lm__error(LM_UNSUPPORTED, "config '%s': %s '%s' is not supported (float32, bfloat16, float16)", c->src, key,
                     json_string_value(v));
}

/* ---- quantization_config (loom's own key; strict) ------------------------------------------- */
static const char *const k_quant_modules[LM_QUANT_MODULE_COUNT] = {"q_proj",  "k_proj",    "v_proj",
                                                                   "o_proj",  "gate_proj", "up_proj",
                                                                   "down_proj", "lm_head"};
#define QUANT_SCHEME "per-output-channel symmetric"
#define QUANT_SCHEME_INT4 "group-wise symmetric"

const char *lm_quant_format_name(lm_quant_format f) {
    return f == LM_QUANT_NONE   ? "none"
           : f == LM_QUANT_INT8 ? "int8"
           : f == LM_QUANT_INT4 ? "int4"
           : f == LM_QUANT_FP8  ? "fp8"
                                : "invalid";
}

const char *lm_quant_module_name(int i) { return i >= 0 && i < LM_QUANT_MODULE_COUNT ? k_quant_modules[i] : NULL; }

int32_t lm_quant_modules_default(const lm_model_config *cfg) {
    (void)cfg;
    return (LM_QUANT_LM_HEAD - 1) | LM_QUANT_LM_HEAD; /* every layer projection and the output matrix */
}

int lm_model_config_tensor_quantized(const lm_model_config *cfg, const char *name) {
    if (!cfg || !name || cfg->quant_format == LM_QUANT_NONE) return 0;
    if (strcmp(name, "lm_head.weight") == 0) return (cfg->quant_modules & LM_QUANT_LM_HEAD) != 0;
    if (strncmp(name, "model.layers.", 13) != 0) return 0;
    const char *p = name + 13;
    while (*p >= '0' && *p <= '9') p++;
    if (p == name + 13 || *p != '.') return 0;
    p++;
    if (strncmp(p, "self_attn.", 10) == 0) p += 10;
    else if (strncmp(p, "mlp.", 4) == 0) p += 4;
    else return 0;
    size_t n = strlen(p);
    if (n < 8 || strcmp(p + n - 7, ".weight") != 0) return 0;
    for (int i = 0; i < LM_QUANT_MODULE_COUNT - 1; i++) /* lm_head is not a layer module */
        if (strlen(k_quant_modules[i]) == n - 7 && strncmp(p, k_quant_modules[i], n - 7) == 0)
            return (cfg->quant_modules >> i) & 1;
    return 0;
}

static lm_status quant_string(const jctx *c, const json_t *q, const char *key, const char *want, lm_status bad) {
    const json_t *v = json_object_get(q, key);
    if (!v) return missing(c, key);
    if (!json_is_string(v)) return bad_type(c, key, "a string");
    if (strcmp(json_string_value(v), want) == 0) return LM_OK;
    return lm__error(bad, "config '%s': %s%s '%s' is not supported (loom runs \"%s\")", c->src, c->prefix, key,
                     json_string_value(v), want);
}

/* q: the quantization_config value (absent or null: no quantization). */
static lm_status parse_quantization(const jctx *root_c, const json_t *q, lm_model_config *cfg) {
    cfg->quant_format = LM_QUANT_NONE;
    cfg->quant_modules = 0;
    cfg->quant_group = 0;
    if (!q) return LM_OK;
    jctx qc = {root_c->src, "quantization_config."}, *c = &qc;
    if (!json_is_object(q))
        return lm__error(LM_PARSE_ERROR, "config '%s': \"quantization_config\" is not an object", c->src);
    const json_t *method = json_object_get(q, "quant_method");
    if (!method) return missing(c, "quant_method");
    if (!json_is_string(method)) return bad_type(c, "quant_method", "a string");
    if (strcmp(json_string_value(method), "loom") != 0)
        return lm__error(LM_UNSUPPORTED, "config '%s': quantization_config.quant_method '%s' is not supported (only "
                         "loom's own int8/int4/fp8 formats, written by `loom quantize`)", c->src, json_string_value(method));
    const json_t *fmt = json_object_get(q, "format");
    int int4 = fmt && json_is_string(fmt) && strcmp(json_string_value(fmt), "int4") == 0;
    int fp8 = fmt && json_is_string(fmt) && strcmp(json_string_value(fmt), "fp8") == 0; /* int8's scheme and keys */
    if (!int4 && !fp8) LM_TRY(quant_string(c, q, "format", "int8", LM_UNSUPPORTED));
    const json_t *scheme = json_object_get(q, "scheme");
    if (int4 && scheme && json_is_string(scheme) && strcmp(json_string_value(scheme), QUANT_SCHEME_INT4) != 0)
        return lm__error(LM_UNSUPPORTED, "config '%s': quantization_config.scheme '%s' is not supported for int4 (loom "
                         "runs \"%s\")", c->src, json_string_value(scheme), QUANT_SCHEME_INT4);
    LM_TRY(quant_string(c, q, "scheme", int4 ? QUANT_SCHEME_INT4 : QUANT_SCHEME, LM_UNSUPPORTED));
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)q, key, v) {
        if (strcmp(key, "quant_method") && strcmp(key, "format") && strcmp(key, "scheme") && strcmp(key, "modules") &&
            (!int4 || strcmp(key, "group_size")))
            return lm__error(LM_PARSE_ERROR, "config '%s': unknown key \"quantization_config.%s\" (quant_method, "
                             "format, scheme, %smodules)", c->src, key, int4 ? "group_size, " : "");
    }
    int32_t group = 0;
    if (int4) {
        const json_t *g = json_object_get(q, "group_size");
        if (!g) return missing(c, "group_size");
        if (!json_is_integer(g)) return bad_type(c, "group_size", "an integer (32, 64 or 128)");
        json_int_t gv = json_integer_value(g);
        if (gv != 32 && gv != 64 && gv != 128)
            return lm__error(LM_PARSE_ERROR, "config '%s': quantization_config.group_size %lld is not 32, 64 or 128",
                             c->src, (long long)gv);
        group = (int32_t)gv;
        /* every quantizable matrix has hidden_size, heads * head_dim (o_proj) or
         * intermediate_size (down_proj) inputs */
        int64_t attn = cfg->num_attention_heads * cfg->head_dim;
        if (cfg->hidden_size % group || cfg->intermediate_size % group || attn % group)
            return lm__error(LM_PARSE_ERROR, "config '%s': quantization_config.group_size %d does not divide "
                             "hidden_size %lld, intermediate_size %lld and heads x head_dim %lld", c->src, (int)group,
                             (long long)cfg->hidden_size, (long long)cfg->intermediate_size, (long long)attn);
    }
    const json_t *mods = json_object_get(q, "modules");
    if (!mods) return missing(c, "modules");
    if (!json_is_array(mods) || !json_array_size(mods)) return bad_type(c, "modules", "a non-empty list of module names");
    int32_t bits = 0;
    for (size_t i = 0; i < json_array_size(mods); i++) {
        const json_t *e = json_array_get(mods, i);
        const char *name = json_is_string(e) ? json_string_value(e) : NULL;
        int k = -1;
        for (int j = 0; name && j < LM_QUANT_MODULE_COUNT; j++)
            if (strcmp(name, k_quant_modules[j]) == 0) k = j;
        if (k < 0)
            return lm__error(LM_PARSE_ERROR, "config '%s': quantization_config.modules[%zu] %s%s%s is not a module "
                             "loom quantizes (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head)",
                             c->src, i, name ? "'" : "", name ? name : "(not a string)", name ? "'" : "");
        if (bits & (1 << k))
            return lm__error(LM_PARSE_ERROR, "config '%s': quantization_config.modules lists '%s' twice", c->src, name);
        bits |= 1 << k;
    }
    if ((bits & LM_QUANT_LM_HEAD) && cfg->tie_word_embeddings)
        return lm__error(LM_PARSE_ERROR, "config '%s': quantization_config.modules lists 'lm_head', but the "
                         "embeddings are tied (the tied head is the embedding table, which stays float)", c->src);
    cfg->quant_format = int4 ? LM_QUANT_INT4 : fp8 ? LM_QUANT_FP8 : LM_QUANT_INT8;
    cfg->quant_modules = bits;
    cfg->quant_group = group;
    return LM_OK;
}

/* Heads: absent keys take the class default, null means "derive". */
static lm_status parse_heads(const jctx *c, const json_t *root, lm_model_config *cfg) {
    const struct arch_info *a = &k_archs[cfg->arch];
    int64_t kv_dflt = json_object_get(root, "num_key_value_heads") || !a->kv_heads ? cfg->num_attention_heads
                                                                                    : a->kv_heads;
    LM_TRY(get_int(c, root, "num_key_value_heads", 0, kv_dflt, 1, DIM_MAX, &cfg->num_key_value_heads));
    if (cfg->num_attention_heads % cfg->num_key_value_heads != 0)
        return lm__error(LM_PARSE_ERROR, "config '%s': num_attention_heads %lld is not a multiple of "
                         "num_key_value_heads %lld", c->src, (long long)cfg->num_attention_heads,
                         (long long)cfg->num_key_value_heads);
    int64_t hd_dflt = json_object_get(root, "head_dim") || !a->head_dim
                          ? cfg->hidden_size / cfg->num_attention_heads
                          : a->head_dim;
    LM_TRY(get_int(c, root, "head_dim", 0, hd_dflt, 0, DIM_MAX, &cfg->head_dim));
    if (cfg->head_dim < 2 || cfg->head_dim % 2)
        return lm__error(LM_PARSE_ERROR, "config '%s': head_dim %lld must be even and >= 2 (RoPE rotates pairs)",
                         c->src, (long long)cfg->head_dim);
    return LM_OK;
}

/* "layer_types" (transformers 5 writes it; it overrides use_sliding_window and
 * max_window_layers when present): "full_attention" then "sliding_attention" layers.
 * Other orders cannot be described by one first sliding layer and are refused. */
static lm_status parse_layer_types(const jctx *c, const json_t *root, const lm_model_config *cfg, int *use_sw,
                                   int64_t *first) {
    const json_t *lt = field(root, "layer_types");
    if (!lt) return LM_OK;
    if (!json_is_array(lt) || (int64_t)json_array_size(lt) != cfg->num_hidden_layers)
        return lm__error(LM_PARSE_ERROR, "config '%s': field \"layer_types\" must list %lld layer types", c->src,
                         (long long)cfg->num_hidden_layers);
    int64_t n = cfg->num_hidden_layers, first_sliding = n;
    for (int64_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(lt, (size_t)i);
        const char *name = json_is_string(t) ? json_string_value(t) : "";
        int sliding = strcmp(name, "sliding_attention") == 0;
        if (!sliding && strcmp(name, "full_attention") != 0)
            return lm__error(LM_UNSUPPORTED, "config '%s': layer_types[%lld] is '%s' (full_attention or "
                             "sliding_attention)", c->src, (long long)i, name);
        if (sliding && first_sliding == n) first_sliding = i;
        if (!sliding && first_sliding < n)
            return lm__error(LM_UNSUPPORTED, "config '%s': layer_types has full attention at layer %lld after sliding "
                             "layers (only full layers followed by sliding layers are supported)", c->src, (long long)i);
    }
    *use_sw = first_sliding < n;
    *first = first_sliding;
    return LM_OK;
}

static lm_status parse_attention_options(const jctx *c, const json_t *root, lm_model_config *cfg) {
    int attn_bias = 0, mlp_bias = 0, use_sw = 1;
    int64_t window = 0, first = 0;
    LM_TRY(get_bool(c, root, "attention_bias", 0, &attn_bias));
    LM_TRY(get_bool(c, root, "mlp_bias", 0, &mlp_bias));
    switch (cfg->arch) {
    case LM_ARCH_LLAMA:
        cfg->qkv_bias = cfg->o_bias = attn_bias;
        cfg->mlp_bias = mlp_bias;
        break;
    case LM_ARCH_MISTRAL:
        LM_TRY(get_int(c, root, "sliding_window", 0, json_object_get(root, "sliding_window") ? 0 : 4096, 1, DIM_MAX,
                       &window));
        break;
    case LM_ARCH_QWEN2:
    case LM_ARCH_QWEN3:
        cfg->qkv_bias = cfg->arch == LM_ARCH_QWEN2 || attn_bias;
        cfg->o_bias = cfg->arch == LM_ARCH_QWEN3 && attn_bias;
        cfg->qk_norm = cfg->arch == LM_ARCH_QWEN3;
        LM_TRY(get_bool(c, root, "use_sliding_window", 0, &use_sw));
        LM_TRY(get_int(c, root, "sliding_window", 0, json_object_get(root, "sliding_window") ? 0 : 4096, 1, DIM_MAX,
                       &window));
        LM_TRY(get_int(c, root, "max_window_layers", 0, 28, 0, DIM_MAX, &first));
        break;
    }
    LM_TRY(parse_layer_types(c, root, cfg, &use_sw, &first));
    if (use_sw && window > 0 && window < cfg->max_position_embeddings) {
        cfg->sliding_window = window;
        cfg->sliding_window_first_layer = first;
    }
    return LM_OK;
}

static lm_status parse_root(const jctx *c, const json_t *root, lm_model_config *cfg) {
    if (!json_is_object(root)) return lm__error(LM_PARSE_ERROR, "config '%s' is not a JSON object", c->src);
    LM_TRY(resolve_arch(c, root, &cfg->arch));
    const json_t *act = field(root, "hidden_act");
    if (act && !json_is_string(act)) return bad_type(c, "hidden_act", "a string");
    if (act && strcmp(json_string_value(act), "silu") != 0)
        return lm__error(LM_UNSUPPORTED, "config '%s': hidden_act '%s' is not supported (only silu)", c->src,
                         json_string_value(act));
    LM_TRY(get_int(c, root, "vocab_size", 1, 0, 1, DIM_MAX, &cfg->vocab_size));
    LM_TRY(get_int(c, root, "hidden_size", 1, 0, 1, DIM_MAX, &cfg->hidden_size));
    LM_TRY(get_int(c, root, "intermediate_size", 1, 0, 1, DIM_MAX, &cfg->intermediate_size));
    LM_TRY(get_int(c, root, "num_hidden_layers", 1, 0, 1, DIM_MAX, &cfg->num_hidden_layers));
    LM_TRY(get_int(c, root, "num_attention_heads", 1, 0, 1, DIM_MAX, &cfg->num_attention_heads));
    LM_TRY(parse_heads(c, root, cfg));
    LM_TRY(get_int(c, root, "max_position_embeddings", 0, k_archs[cfg->arch].max_pos, 1, DIM_MAX,
                   &cfg->max_position_embeddings));
    LM_TRY(get_real(c, root, "rms_norm_eps", 0, 1e-6, 1, &cfg->rms_norm_eps));
    LM_TRY(parse_rope(c, root, cfg));
    LM_TRY(get_bool(c, root, "tie_word_embeddings", 0, &cfg->tie_word_embeddings));
    LM_TRY(parse_attention_options(c, root, cfg));
    LM_TRY(parse_dtype(c, root, cfg));
    LM_TRY(parse_tokens(c, root, cfg));
    LM_TRY(parse_quantization(c, field(root, "quantization_config"), cfg));
    cfg->generation = (lm_generation_defaults){.temperature = 1.0, .top_k = 50, .top_p = 1.0};
    return LM_OK;
}

lm_status lm_model_config_parse(const char *json, size_t len, const char *source, lm_model_config *out) {
    if (!json || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_model_config_parse: NULL argument");
    jctx c = {source ? source : "config.json", ""};
    memset(out, 0, sizeof *out);
    json_t *root;
    LM_TRY(lm__io_json_parse(json, len, "config", c.src, &root));
    lm_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    lm_status s = parse_root(&c, root, &cfg);
    json_decref(root);
    if (s == LM_OK) *out = cfg;
    return s;
}

static lm_status merge_root(const jctx *c, const json_t *root, lm_model_config *cfg) {
    if (!json_is_object(root)) return lm__error(LM_PARSE_ERROR, "config '%s' is not a JSON object", c->src);
    const json_t *eos = field(root, "eos_token_id");
    if (eos) LM_TRY(add_eos(c, eos, cfg));
    if (cfg->bos_token_id < 0) LM_TRY(get_token(c, root, "bos_token_id", -1, &cfg->bos_token_id));
    if (cfg->pad_token_id < 0) LM_TRY(get_token(c, root, "pad_token_id", -1, &cfg->pad_token_id));
    lm_generation_defaults *g = &cfg->generation;
    g->present = 1;
    LM_TRY(get_bool(c, root, "do_sample", 0, &g->do_sample));
    LM_TRY(get_real(c, root, "temperature", 0, 1.0, 0, &g->temperature));
    LM_TRY(get_int(c, root, "top_k", 0, 50, 0, INT64_MAX, &g->top_k));
    LM_TRY(get_real(c, root, "top_p", 0, 1.0, 0, &g->top_p));
    if (g->top_p > 1)
        return lm__error(LM_PARSE_ERROR, "config '%s': field \"top_p\" is %g, outside [0, 1]", c->src, g->top_p);
    return LM_OK;
}

lm_status lm_model_config_merge_generation(lm_model_config *cfg, const char *json, size_t len, const char *source) {
    if (!cfg || !json) return lm__error(LM_INVALID_ARGUMENT, "lm_model_config_merge_generation: NULL argument");
    jctx c = {source ? source : "generation_config.json", ""};
    json_t *root;
    LM_TRY(lm__io_json_parse(json, len, "config", c.src, &root));
    lm_model_config tmp = *cfg;
    lm_status s = merge_root(&c, root, &tmp);
    json_decref(root);
    if (s == LM_OK) *cfg = tmp;
    return s;
}

static lm_status parse_file(const char *dir, const char *name, lm_model_config *cfg, int merge) {
    char *path = lm__io_path_join(dir, name), *text = NULL;
    if (!path) return LM_OUT_OF_MEMORY;
    size_t len = 0;
    lm_status s = lm_file_read_all(path, &text, &len);
    if (s == LM_OK)
        s = merge ? lm_model_config_merge_generation(cfg, text, len, path)
                  : lm_model_config_parse(text, len, path, cfg);
    lm__free(text);
    lm__free(path);
    return s;
}

lm_status lm_model_config_load(const char *dir, lm_model_config *out) {
    if (!dir || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_model_config_load: NULL argument");
    memset(out, 0, sizeof *out);
    lm_model_config cfg;
    LM_TRY(parse_file(dir, "config.json", &cfg, 0));
    char *gen = lm__io_path_join(dir, "generation_config.json");
    if (!gen) return LM_OUT_OF_MEMORY;
    int has_gen = lm__io_exists(gen); /* absent is fine; a directory or FIFO is an error */
    lm__free(gen);
    if (has_gen) LM_TRY(parse_file(dir, "generation_config.json", &cfg, 1));
    *out = cfg;
    return LM_OK;
}

int64_t lm_model_config_layer_window(const lm_model_config *cfg, int64_t layer) {
    if (!cfg || cfg->sliding_window <= 0 || layer < cfg->sliding_window_first_layer) return 0;
    return cfg->sliding_window;
}
