/* nn/model.c — loading a Hugging Face model directory into an lm_model.
 *
 * The checkpoint is validated against config.json first (names, dtypes, shapes), so
 * every lookup below succeeds for a valid directory. Matrices are zero-copy views of
 * the mapped safetensors data; 1-d tensors (norms, biases) are cast to f32 copies
 * because the normalization and bias ops take one dtype per call. A model for a CUDA
 * device is loaded the same way and then uploaded (nn/model_cuda.c); the mapped host
 * tensors stay for the CPU-side bookkeeping.
 */
#include "nn/internal.h"

#include <stdio.h>

typedef struct loader {
    lm_checkpoint *ck;
    lm_ctx *ctx;
} loader;

static lm_status load_matrix(loader *L, const char *name, lm_tensor **out) {
    return lm_checkpoint_tensor(L->ck, name, out);
}

static lm_status load_f32(loader *L, const char *name, lm_tensor **out) {
    lm_tensor *raw = NULL;
    LM_TRY(lm_checkpoint_tensor(L->ck, name, &raw));
    lm_status st = lm_cast(L->ctx, lm_tensor_as_view(raw), LM_F32, out);
    lm_tensor_destroy(raw);
    return st;
}

/* name = prefix + suffix, e.g. "model.layers.3." + "mlp.up_proj.weight" */
static lm_status layer_tensor(loader *L, int64_t layer, const char *suffix, int f32, lm_tensor **out) {
    char name[160];
    snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)layer, suffix);
    return f32 ? load_f32(L, name, out) : load_matrix(L, name, out);
}

static lm_status load_layer(loader *L, const lm_model_config *c, int64_t i, lm__layer *ly) {
    LM_TRY(layer_tensor(L, i, "input_layernorm.weight", 1, &ly->attn_norm));
    LM_TRY(layer_tensor(L, i, "self_attn.q_proj.weight", 0, &ly->wq));
    LM_TRY(layer_tensor(L, i, "self_attn.k_proj.weight", 0, &ly->wk));
    LM_TRY(layer_tensor(L, i, "self_attn.v_proj.weight", 0, &ly->wv));
    LM_TRY(layer_tensor(L, i, "self_attn.o_proj.weight", 0, &ly->wo));
    if (c->qkv_bias) {
        LM_TRY(layer_tensor(L, i, "self_attn.q_proj.bias", 1, &ly->bq));
        LM_TRY(layer_tensor(L, i, "self_attn.k_proj.bias", 1, &ly->bk));
        LM_TRY(layer_tensor(L, i, "self_attn.v_proj.bias", 1, &ly->bv));
    }
    if (c->o_bias) LM_TRY(layer_tensor(L, i, "self_attn.o_proj.bias", 1, &ly->bo));
    if (c->qk_norm) {
        LM_TRY(layer_tensor(L, i, "self_attn.q_norm.weight", 1, &ly->q_norm));
        LM_TRY(layer_tensor(L, i, "self_attn.k_norm.weight", 1, &ly->k_norm));
    }
    LM_TRY(layer_tensor(L, i, "post_attention_layernorm.weight", 1, &ly->mlp_norm));
    LM_TRY(layer_tensor(L, i, "mlp.gate_proj.weight", 0, &ly->wg));
    LM_TRY(layer_tensor(L, i, "mlp.up_proj.weight", 0, &ly->wu));
    LM_TRY(layer_tensor(L, i, "mlp.down_proj.weight", 0, &ly->wd));
    if (c->mlp_bias) {
        LM_TRY(layer_tensor(L, i, "mlp.gate_proj.bias", 1, &ly->bg));
        LM_TRY(layer_tensor(L, i, "mlp.up_proj.bias", 1, &ly->bu));
        LM_TRY(layer_tensor(L, i, "mlp.down_proj.bias", 1, &ly->bd));
    }
    return LM_OK;
}

static lm_status load_rope(lm_model *m) {
    int64_t half = m->cfg.head_dim / 2;
    double *freq = lm__calloc((size_t)half, sizeof *freq), scaling = 1;
    if (!freq) return LM_OUT_OF_MEMORY;
    lm_status st = lm_model_config_rope(&m->cfg, freq, &scaling);
    if (st == LM_OK) st = lm_tensor_create(lm_device_cpu(), LM_F32, 1, &half, &m->inv_freq);
    if (st == LM_OK) {
        float *f = lm_tensor_data(m->inv_freq);
        for (int64_t i = 0; i < half; i++) f[i] = (float)freq[i]; /* transformers keeps inv_freq in f32 */
        m->rope_attn_factor = (float)scaling;
    }
    lm__free(freq);
    return st;
}

static lm_status load_all(lm_model *m, const char *dir) {
    loader L = {NULL, NULL};
    lm_status st = lm_ctx_create(lm_device_cpu(), 1, &L.ctx);
    if (st == LM_OK) st = lm_checkpoint_open(dir, &L.ck);
    if (st == LM_OK) st = lm_model_config_check_checkpoint(&m->cfg, L.ck);
    if (st == LM_OK) st = load_matrix(&L, "model.embed_tokens.weight", &m->embed);
    if (st == LM_OK) st = load_f32(&L, "model.norm.weight", &m->final_norm);
    if (st == LM_OK && !m->cfg.tie_word_embeddings) st = load_matrix(&L, "lm_head.weight", &m->lm_head);
    if (st == LM_OK && !(m->layers = lm__calloc((size_t)m->cfg.num_hidden_layers, sizeof *m->layers)))
        st = LM_OUT_OF_MEMORY;
    for (int64_t i = 0; st == LM_OK && i < m->cfg.num_hidden_layers; i++) st = load_layer(&L, &m->cfg, i, &m->layers[i]);
    if (st == LM_OK) st = load_rope(m);
    lm_checkpoint_close(L.ck); /* tensors keep their own references to the mapped files */
    lm_ctx_destroy(L.ctx);
    return st;
}

lm_status lm_model_load(const char *dir, lm_device device, lm_model **out) {
    if (!dir || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_model_load: NULL argument");
    *out = NULL;
    if (device.type != LM_DEVICE_CPU) {
        if (device.type != LM_DEVICE_CUDA || !lm_cuda_compiled())
            return lm__error(LM_UNSUPPORTED, "lm_model_load: this build runs the forward pass on the CPU only");
        if (device.index < 0 || device.index >= lm_cuda_device_count())
            return lm__error(LM_DEVICE_ERROR, "lm_model_load: cuda:%d requested but %d CUDA device(s) are available",
                             device.index, lm_cuda_device_count());
    }
    lm_model *m = lm__calloc(1, sizeof *m);
    if (!m) return LM_OUT_OF_MEMORY;
    m->device = device;
    lm_status st = lm_model_config_load(dir, &m->cfg);
    if (st == LM_OK) st = load_all(m, dir);
#ifdef LOOM_HAVE_CUDA
    if (st == LM_OK && device.type == LM_DEVICE_CUDA) st = lm__cuda_model_upload(m);
#endif
    if (st != LM_OK) {
        lm_model_destroy(m);
        return st;
    }
    *out = m;
    return LM_OK;
}

static void destroy_layer(lm__layer *ly) {
    lm_tensor *all[] = {ly->attn_norm, ly->wq, ly->wk, ly->wv, ly->wo, ly->bq, ly->bk, ly->bv, ly->bo, ly->q_norm,
                        ly->k_norm, ly->mlp_norm, ly->wg, ly->wu, ly->wd, ly->bg, ly->bu, ly->bd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lm_tensor_destroy(all[i]);
}

void lm_model_destroy(lm_model *m) {
    if (!m) return;
#ifdef LOOM_HAVE_CUDA
    lm__cuda_model_free(m->gpu);
#endif
    if (m->layers)
        for (int64_t i = 0; i < m->cfg.num_hidden_layers; i++) destroy_layer(&m->layers[i]);
    lm__free(m->layers);
    lm_tensor_destroy(m->embed);
    lm_tensor_destroy(m->lm_head);
    lm_tensor_destroy(m->final_norm);
    lm_tensor_destroy(m->inv_freq);
    lm__free(m);
}

const lm_model_config *lm_model_get_config(const lm_model *m) { return &m->cfg; }
lm_device lm_model_device(const lm_model *m) { return m->device; }

static int64_t nbytes(const lm_tensor *t) { return t ? lm_tensor_numel(t) * (int64_t)lm_dtype_size(lm_tensor_dtype(t)) : 0; }

int64_t lm_model_weight_bytes(const lm_model *m) {
#ifdef LOOM_HAVE_CUDA
    if (m->gpu) return lm__cuda_model_weight_bytes(m->gpu); /* what the device reads: bf16 */
#endif
    /* per token: every layer matrix, the norms, the lm_head, one embedding row */
    int64_t total = nbytes(m->lm_head ? m->lm_head : m->embed) + nbytes(m->final_norm);
    total += nbytes(m->embed) / (m->cfg.vocab_size ? m->cfg.vocab_size : 1);
    for (int64_t i = 0; i < m->cfg.num_hidden_layers; i++) {
        const lm__layer *ly = &m->layers[i];
        const lm_tensor *all[] = {ly->attn_norm, ly->wq, ly->wk, ly->wv, ly->wo, ly->bq, ly->bk, ly->bv, ly->bo,
                                  ly->q_norm, ly->k_norm, ly->mlp_norm, ly->wg, ly->wu, ly->wd, ly->bg, ly->bu, ly->bd};
        for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) total += nbytes(all[j]);
    }
    return total;
}
