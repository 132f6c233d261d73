/* train/model.c — the training model: its parameter table over one flat f32 buffer
 * (plus the gradient mirror), loading from a Hugging Face directory (any float
 * storage dtype widened to f32), seeded initialisation from a config.json, and the
 * RoPE table. Weights are assembled in host memory and copied to the device once.
 */
#include "train/internal.h"
#include "runtime/internal.h"

#include "loom/safetensors.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

int lm__train_find(const lm_train_model *m, const char *name) {
    for (int i = 0; i < m->nparams; i++)
        if (strcmp(m->params[i].name, name) == 0) return i;
    return -1;
}

static lm_status index_special(lm_train_model *m) {
    m->embed = lm__train_find(m, "model.embed_tokens.weight");
    m->head = m->cfg.tie_word_embeddings ? m->embed : lm__train_find(m, "lm_head.weight");
    return LM_OK;
}

/* The parameter table from the config, offsets into flat buffers of numel floats. */
static lm_status build_table(lm_train_model *m) {
    int64_t n = lm_model_config_tensor_count(&m->cfg);
    if (!(m->params = lm__calloc((size_t)n, sizeof *m->params))) return LM_OUT_OF_MEMORY;
    m->nparams = (int)n;
    for (int i = 0; i < m->nparams; i++) {
        lm_tensor_spec spec;
        LM_TRY(lm_model_config_tensor(&m->cfg, i, &spec));
        lm__tparam *p = &m->params[i];
        snprintf(p->name, sizeof p->name, "%s", spec.name);
        p->ndim = spec.ndim;
        p->shape[0] = spec.shape[0];
        p->shape[1] = spec.ndim > 1 ? spec.shape[1] : 1;
        p->offset = m->numel;
        p->decay = spec.ndim == 2;
        m->numel += spec.ndim > 1 ? spec.shape[0] * spec.shape[1] : spec.shape[0];
    }
    return index_special(m);
}

/* flat and flat_grad on the device, from the host values (numel floats), and views.
 * Memory the host addresses takes the host tensor itself (no copy). */
static lm_status place(lm_train_model *m, const lm_tensor *host) {
    if (lm__device_host_addressable(m->device)) {
        LM_TRY(lm_tensor_from_view(host, lm_tensor_as_view(host), &m->flat));
    } else {
        LM_TRY(lm_tensor_create(m->device, LM_F32, 1, &m->numel, &m->flat));
        LM_TRY(lm_device_copy(m->device, lm_tensor_data(m->flat), lm_device_cpu(), lm_tensor_data(host),
                              (size_t)m->numel * sizeof(float)));
    }
    LM_TRY(lm_tensor_zeros(m->device, LM_F32, 1, &m->numel, &m->flat_grad));
    for (int i = 0; i < m->nparams; i++) {
        lm__tparam *p = &m->params[i];
        LM_TRY(lm_tensor_from_storage(lm_tensor_storage(m->flat), LM_F32, p->ndim, p->shape, NULL, p->offset, &p->value));
        LM_TRY(lm_tensor_from_storage(lm_tensor_storage(m->flat_grad), LM_F32, p->ndim, p->shape, NULL, p->offset, &p->grad));
    }
    return LM_OK;
}

static lm_status load_rope(lm_train_model *m) {
    int64_t half = m->cfg.head_dim / 2;
    double *freq = lm__calloc((size_t)half, sizeof *freq), scaling = 1;
    float *f32 = lm__calloc((size_t)half, sizeof *f32);
    lm_status st = freq && f32 ? lm_model_config_rope(&m->cfg, freq, &scaling) : LM_OUT_OF_MEMORY;
    for (int64_t i = 0; st == LM_OK && i < half; i++) f32[i] = (float)freq[i]; /* f32 as transformers keeps it */
    if (st == LM_OK) st = lm_tensor_from_host(m->device, LM_F32, 1, &half, f32, &m->inv_freq);
    lm__free(freq);
    lm__free(f32);
    return st;
}

static lm_status new_model(lm_device device, lm_train_model **out) {
    *out = lm__calloc(1, sizeof **out);
    if (!*out) return LM_OUT_OF_MEMORY;
    (*out)->device = device;
    return LM_OK;
}

static lm_status finish(lm_train_model *m, lm_status st, lm_train_model **out) {
    if (st != LM_OK) {
        lm_train_model_destroy(m);
        return st;
    }
    *out = m;
    return LM_OK;
}

/* Casts every checkpoint tensor into its slice of the host buffer. */
static lm_status read_weights(lm_train_model *m, const char *dir, lm_tensor *host) {
    lm_checkpoint *ck = NULL;
    lm_ctx *ctx = NULL;
    lm_status st = lm_ctx_create(lm_device_cpu(), 1, &ctx);
    if (st == LM_OK) st = lm_checkpoint_open(dir, &ck);
    if (st == LM_OK) st = lm_model_config_check_checkpoint(&m->cfg, ck);
    for (int i = 0; st == LM_OK && i < m->nparams; i++) {
        lm__tparam *p = &m->params[i];
        lm_tensor *src = NULL, *dst = NULL;
        st = lm_checkpoint_tensor(ck, p->name, &src);
        if (st == LM_OK) st = lm_tensor_from_storage(lm_tensor_storage(host), LM_F32, p->ndim, p->shape, NULL, p->offset, &dst);
        if (st == LM_OK) st = lm_cast_out(ctx, lm_tensor_as_view(src), lm_tensor_as_view(dst));
        lm_tensor_destroy(src);
        lm_tensor_destroy(dst);
    }
    lm_checkpoint_close(ck);
    lm_ctx_destroy(ctx);
    return st;
}

static lm_status read_config_text(lm_train_model *m, const char *path) {
    return lm_file_read_all(path, &m->config_json, &m->config_len);
}

lm_status lm_train_model_load(const char *dir, lm_device device, lm_train_model **out) {
    if (!dir || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_train_model_load: NULL argument");
    *out = NULL;
    lm_train_model *m = NULL;
    LM_TRY(new_model(device, &m));
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    lm_tensor *host = NULL;
    lm_status st = lm_model_config_load(dir, &m->cfg);
    if (st == LM_OK && m->cfg.quant_format != LM_QUANT_NONE) /* the f32 master weights cannot come from int8 */
        st = lm__error(LM_UNSUPPORTED, "model '%s' holds %s weights (config.json quantization_config): training and "
                       "evaluating the training model need the float weights; use the directory it was quantized from",
                       dir, lm_quant_format_name((lm_quant_format)m->cfg.quant_format));
    if (st == LM_OK) st = read_config_text(m, path);
    if (st == LM_OK && !(m->source_dir = lm__strdup(dir))) st = LM_OUT_OF_MEMORY;
    if (st == LM_OK) st = build_table(m);
    if (st == LM_OK) st = lm_tensor_create(lm_device_cpu(), LM_F32, 1, &m->numel, &host);
    if (st == LM_OK) st = read_weights(m, dir, host);
    if (st == LM_OK) st = place(m, host);
    if (st == LM_OK) st = load_rope(m);
    lm_tensor_destroy(host);
    return finish(m, st, out);
}

/* initializer_range from the config text (transformers' default 0.02). */
static double init_range(const lm_train_model *m) {
    json_t *root = json_loadb(m->config_json, m->config_len, 0, NULL);
    json_t *v = root ? json_object_get(root, "initializer_range") : NULL;
    double r = v && json_is_number(v) && json_number_value(v) > 0 ? json_number_value(v) : 0.02;
    json_decref(root);
    return r;
}

/* Norm weights 1, biases 0, everything else N(0, range^2), in table order. */
static void random_weights(const lm_train_model *m, uint64_t seed, float *w) {
    lm_rng rng;
    lm_rng_seed(&rng, seed);
    double range = init_range(m);
    for (int i = 0; i < m->nparams; i++) {
        const lm__tparam *p = &m->params[i];
        size_t len = strlen(p->name);
        int norm = len >= 11 && strcmp(p->name + len - 11, "norm.weight") == 0;
        int bias = len >= 5 && strcmp(p->name + len - 5, ".bias") == 0;
        int64_t n = p->ndim > 1 ? p->shape[0] * p->shape[1] : p->shape[0];
        for (int64_t k = 0; k < n; k++) w[p->offset + k] = norm ? 1.0f : bias ? 0.0f : (float)(range * lm_rng_normal(&rng));
    }
}

lm_status lm_train_model_init(const char *config_path, uint64_t seed, lm_device device, lm_train_model **out) {
    if (!config_path || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_train_model_init: NULL argument");
    *out = NULL;
    lm_train_model *m = NULL;
    LM_TRY(new_model(device, &m));
    lm_tensor *host = NULL;
    lm_status st = read_config_text(m, config_path);
    if (st == LM_OK) st = lm_model_config_parse(m->config_json, m->config_len, config_path, &m->cfg);
    if (st == LM_OK && m->cfg.quant_format != LM_QUANT_NONE) /* its checkpoints would claim int8 weights */
        st = lm__error(LM_UNSUPPORTED, "config '%s' has a quantization_config: a model trained from scratch has "
                       "float weights; remove the key", config_path);
    if (st == LM_OK) st = build_table(m);
    if (st == LM_OK) st = lm_tensor_create(lm_device_cpu(), LM_F32, 1, &m->numel, &host);
    if (st == LM_OK) random_weights(m, seed, lm_tensor_data(host));
    if (st == LM_OK) st = place(m, host);
    if (st == LM_OK) st = load_rope(m);
    lm_tensor_destroy(host);
    return finish(m, st, out);
}

void lm_train_model_destroy(lm_train_model *m) {
    if (!m) return;
    for (int i = 0; m->params && i < m->nparams; i++) {
        lm_tensor_destroy(m->params[i].value);
        lm_tensor_destroy(m->params[i].grad);
        lm_tensor_destroy(m->params[i].low);
    }
    lm__free(m->params);
    lm_tensor_destroy(m->flat);
    lm_tensor_destroy(m->flat_grad);
    lm_tensor_destroy(m->flat_low);
    lm_tensor_destroy(m->inv_freq);
    for (int i = 0; i < 2; i++) lm_graph_destroy(m->graphs[i].g);
    lm_tensor_destroy(m->positions);
    lm_free(m->config_json);
    lm__free(m->source_dir);
    lm__free(m);
}

const lm_model_config *lm_train_model_config(const lm_train_model *m) { return &m->cfg; }
lm_device lm_train_model_device(const lm_train_model *m) { return m->device; }
int64_t lm_train_model_numel(const lm_train_model *m) { return m->numel; }
lm_dtype lm_train_model_compute_dtype(const lm_train_model *m) {
    return m->flat_low ? lm_tensor_dtype(m->flat_low) : LM_F32;
}

/* Drops the low-precision weight copies. */
static void drop_low(lm_train_model *m) {
    for (int i = 0; i < m->nparams; i++) {
        lm_tensor_destroy(m->params[i].low);
        m->params[i].low = NULL;
    }
    lm_tensor_destroy(m->flat_low);
    m->flat_low = NULL;
    m->layout_gen++;
}

lm_status lm_train_model_set_compute_dtype(lm_train_model *m, lm_dtype dt) {
    if (!m) return lm__error(LM_INVALID_ARGUMENT, "lm_train_model_set_compute_dtype: NULL model");
    if (dt == LM_F32) {
        drop_low(m);
        return LM_OK;
    }
    if (dt != LM_BF16)
        return lm__error(LM_UNSUPPORTED, "training compute dtype %s: f32 or bf16 only", lm_dtype_name(dt));
    lm_device_caps caps;
    LM_TRY(lm_device_caps_get(m->device, &caps));
    if (!caps.fast_16bit)
        return lm__error(LM_UNSUPPORTED, "training compute dtype bf16 needs a device with 16-bit matrix units (a GPU); "
                                         "%s training computes in f32", caps.name);
    if (m->flat_low) return LM_OK; /* already bf16 */
    m->layout_gen++;
    lm_status st = lm_tensor_create(m->device, dt, 1, &m->numel, &m->flat_low);
    for (int i = 0; st == LM_OK && i < m->nparams; i++) {
        lm__tparam *p = &m->params[i];
        st = lm_tensor_from_storage(lm_tensor_storage(m->flat_low), dt, p->ndim, p->shape, NULL, p->offset, &p->low);
    }
    if (st != LM_OK) drop_low(m);
    return st;
}

double lm_train_model_flops_per_token(const lm_train_model *m, int64_t T) {
    double matmul = 0;
    for (int i = 0; i < m->nparams; i++) {
        const lm__tparam *p = &m->params[i];
        if (p->ndim == 2 && i != m->embed) matmul += (double)p->shape[0] * (double)p->shape[1];
    }
    if (m->head == m->embed) matmul += (double)m->cfg.vocab_size * (double)m->cfg.hidden_size; /* tied head */
    const lm_model_config *c = &m->cfg;
    return 6.0 * matmul + 12.0 * (double)c->num_hidden_layers * (double)c->num_attention_heads * (double)c->head_dim *
                              (double)T;
}

int lm_train_model_param_count(const lm_train_model *m) { return m->nparams; }

lm_status lm_train_model_param(const lm_train_model *m, int i, lm_train_param *out) {
    if (!m || !out || i < 0 || i >= m->nparams)
        return lm__error(LM_OUT_OF_RANGE, "lm_train_model_param: index %d outside [0, %d)", i, m ? m->nparams : 0);
    const lm__tparam *p = &m->params[i];
    *out = (lm_train_param){p->name, *lm_tensor_as_view(p->value), *lm_tensor_as_view(p->grad), p->decay};
    return LM_OK;
}

lm_status lm_train_model_find(const lm_train_model *m, const char *name, lm_train_param *out) {
    int i = name ? lm__train_find(m, name) : -1;
    if (i < 0) return lm__error(LM_NOT_FOUND, "training model: no parameter '%s'", name ? name : "(null)");
    return lm_train_model_param(m, i, out);
}

lm_status lm_train_model_zero_grad(lm_train_model *m, lm_ctx *ctx) {
    if (!m || !ctx) return lm__error(LM_INVALID_ARGUMENT, "lm_train_model_zero_grad: NULL argument");
    if (!lm_device_equal(lm_ctx_device(ctx), m->device)) {
        char a[32], b[32];
        return lm__error(LM_INVALID_ARGUMENT, "lm_train_model_zero_grad: the context is on %s but the model on %s",
                         lm_device_format(lm_ctx_device(ctx), a, sizeof a), lm_device_format(m->device, b, sizeof b));
    }
    return lm__ctx_memset(ctx, lm_tensor_data(m->flat_grad), 0, (size_t)m->numel * sizeof(float)); /* in stream order */
}

lm_status lm_train_model_grad_norm(lm_train_model *m, lm_ctx *ctx, double *norm) {
    lm_tensor *out = NULL;
    LM_TRY(lm_tensor_create(m->device, LM_F32, 0, NULL, &out));
    float host = 0;
    lm_status st = lm_sum_squares_out(ctx, 1, lm_tensor_as_view(m->flat_grad), lm_tensor_as_view(out));
    if (st == LM_OK) st = lm_tensor_view_read(ctx, lm_tensor_as_view(out), &host);
    lm_tensor_destroy(out);
    if (st == LM_OK) *norm = sqrt((double)host);
    return st;
}
