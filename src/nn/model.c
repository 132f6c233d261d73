/* nn/model.c — loading a Hugging Face model directory into an lm_model: the config
 * and a table of named weights.
 *
 * The checkpoint is validated against config.json first (names, dtypes, shapes), so
 * every lookup below succeeds for a valid directory. In host memory, matrices are
 * zero-copy views of the mapped safetensors data in their stored dtype (the matmul
 * widens them on the fly); 1-d tensors (norms, biases) become f32 copies because the
 * normalization and bias operators take one dtype per call. A model for another
 * device is loaded the same way and then uploaded (nn/upload.c), after which the
 * mapped host tensors are released.
 */
#include "nn/internal.h"

#include <string.h>

#include <stdio.h>

int lm__model_on_host(const lm_model *m) { return m->on_host; }

static int64_t find(const lm_model *m, const char *name, int *found) {
    int64_t lo = 0, hi = m->nw;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        int c = strcmp(m->w[mid].name, name);
        if (c == 0) {
            *found = 1;
            return mid;
        }
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    *found = 0;
    return lo;
}

const lm_tensor *lm__model_weight(const lm_model *m, const char *name) {
    int found;
    int64_t i = find(m, name, &found);
    return found ? m->w[i].t : NULL;
}

lm_status lm__model_add_weight(lm_model *m, const char *name, lm_tensor *t) {
    int found;
    int64_t i = find(m, name, &found);
    if (found) {
        lm_tensor_destroy(t);
        return lm__error(LM_INTERNAL, "model: weight '%s' added twice", name);
    }
    if (strlen(name) >= sizeof m->w[0].name) {
        lm_tensor_destroy(t);
        return lm__error(LM_UNSUPPORTED, "model: weight name '%.40s...' is too long", name);
    }
    if (lm__reserve((void **)&m->w, &m->cap_w, m->nw + 1, sizeof *m->w) != LM_OK) {
        lm_tensor_destroy(t);
        return LM_OUT_OF_MEMORY;
    }
    memmove(&m->w[i + 1], &m->w[i], sizeof *m->w * (size_t)(m->nw - i));
    snprintf(m->w[i].name, sizeof m->w[i].name, "%s", name);
    m->w[i].t = t;
    m->nw++;
    return LM_OK;
}

/* Every expected tensor: matrices as mapped views, vectors cast to f32. */
static lm_status load_tensors(lm_model *m, lm_checkpoint *ck, lm_ctx *ctx) {
    int64_t n = lm_model_config_tensor_count(&m->cfg);
    for (int64_t i = 0; i < n; i++) {
        lm_tensor_spec spec;
        LM_TRY(lm_model_config_tensor(&m->cfg, i, &spec));
        lm_tensor *raw = NULL, *t = NULL;
        LM_TRY(lm_checkpoint_tensor(ck, spec.name, &raw));
        lm_status st = LM_OK;
        if (spec.ndim == 1) {
            st = lm_cast(ctx, lm_tensor_as_view(raw), LM_F32, &t);
            lm_tensor_destroy(raw);
        } else {
            t = raw;
        }
        if (st == LM_OK) st = lm__model_add_weight(m, spec.name, t);
        LM_TRY(st);
    }
    return LM_OK;
}

/* "rope.inv_freq": transformers keeps the table in f32, computed here in double. */
static lm_status load_rope(lm_model *m) {
    int64_t half = m->cfg.head_dim / 2;
    double *freq = lm__calloc((size_t)half, sizeof *freq), scaling = 1;
    if (!freq) return LM_OUT_OF_MEMORY;
    lm_tensor *t = NULL;
    lm_status st = lm_model_config_rope(&m->cfg, freq, &scaling);
    if (st == LM_OK) st = lm_tensor_create(lm_device_cpu(), LM_F32, 1, &half, &t);
    if (st == LM_OK) {
        float *f = lm_tensor_data(t);
        for (int64_t i = 0; i < half; i++) f[i] = (float)freq[i];
        st = lm__model_add_weight(m, "rope.inv_freq", t);
    }
    lm__free(freq);
    return st;
}

static int64_t nbytes(const lm_tensor *t) { return t ? lm_tensor_numel(t) * (int64_t)lm_dtype_size(lm_tensor_dtype(t)) : 0; }

/* Per token: every layer tensor, the final norm, the output matrix, and one row of
 * the embedding table (the tied table counts once, whole, as the output matrix). */
static int64_t host_bytes_per_token(const lm_model *m) {
    const lm_model_config *c = &m->cfg;
    int64_t total = 0;
    for (int64_t i = 0; i < m->nw; i++) total += nbytes(m->w[i].t);
    const lm_tensor *emb = lm__model_weight(m, "model.embed_tokens.weight");
    int64_t row = nbytes(emb) / (c->vocab_size ? c->vocab_size : 1);
    total += c->tie_word_embeddings ? row : row - nbytes(emb);
    return total - nbytes(lm__model_weight(m, "rope.inv_freq"));
}

static lm_status load_all(lm_model *m, const char *dir) {
    lm_checkpoint *ck = NULL;
    lm_ctx *ctx = NULL;
    lm_status st = lm_ctx_create(lm_device_cpu(), 1, &ctx);
    if (st == LM_OK) st = lm_checkpoint_open(dir, &ck);
    if (st == LM_OK) st = lm_model_config_check_checkpoint(&m->cfg, ck);
    if (st == LM_OK) st = load_tensors(m, ck, ctx);
    if (st == LM_OK) st = load_rope(m);
    lm_checkpoint_close(ck); /* tensors keep their own references to the mapped files */
    lm_ctx_destroy(ctx);
    if (st == LM_OK) m->weight_bytes = host_bytes_per_token(m);
    return st;
}

lm_status lm_model_load(const char *dir, lm_device device, lm_model **out) {
    if (!dir || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_model_load: NULL argument");
    *out = NULL;
    lm_device_caps caps;
    lm_status cs = lm_device_caps_get(device, &caps); /* names a device this build or machine lacks */
    if (cs != LM_OK) return lm__error_context(cs, "lm_model_load");
    lm_model *m = lm__calloc(1, sizeof *m);
    if (!m) return LM_OUT_OF_MEMORY;
    m->device = device;
    m->on_host = caps.host_addressable;
    lm_status st = lm_model_config_load(dir, &m->cfg);
    if (st == LM_OK) st = load_all(m, dir);
    if (st == LM_OK && !lm__model_on_host(m)) st = lm__model_upload(m);
    if (st != LM_OK) {
        lm_model_destroy(m);
        return st;
    }
    *out = m;
    return LM_OK;
}

void lm_model_destroy(lm_model *m) {
    if (!m) return;
    for (int64_t i = 0; i < m->nw; i++) lm_tensor_destroy(m->w[i].t);
    lm__free(m->w);
    lm__free(m);
}

const lm_model_config *lm_model_get_config(const lm_model *m) { return &m->cfg; }
lm_device lm_model_device(const lm_model *m) { return m->device; }
int64_t lm_model_weight_bytes(const lm_model *m) { return m->weight_bytes; }
