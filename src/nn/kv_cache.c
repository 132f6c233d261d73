/* nn/kv_cache.c — per-slot K/V storage for incremental decoding.
 *
 * Layout [layers, slots, kv_heads, max_tokens, head_dim]: one slot's keys for one
 * head are contiguous over positions, so attention reads a [kv_heads, t, head_dim]
 * view without gathering. f32 on the CPU, bf16 (zero-filled) on a CUDA device. Memory:
 * 2 * layers * slots * kv_heads * max_tokens * head_dim * (4 or 2) bytes, allocated
 * once. A CUDA cache also owns the forward pass's device state (made on first use).
 */
#include "nn/internal.h"

lm_status lm_kv_cache_create(const lm_model *m, int slots, int64_t max_tokens, lm_kv_cache **out) {
    if (!m || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_kv_cache_create: NULL argument");
    *out = NULL;
    const lm_model_config *c = &m->cfg;
    if (slots < 1 || max_tokens < 1)
        return lm__error(LM_INVALID_ARGUMENT, "kv cache: %d slots x %lld tokens (both must be >= 1)", slots,
                         (long long)max_tokens);
    if (max_tokens > c->max_position_embeddings)
        return lm__error(LM_INVALID_ARGUMENT, "kv cache: %lld tokens exceed max_position_embeddings %lld",
                         (long long)max_tokens, (long long)c->max_position_embeddings);
    lm_kv_cache *kv = lm__calloc(1, sizeof *kv);
    if (!kv) return LM_OUT_OF_MEMORY;
    kv->layers = (int)c->num_hidden_layers;
    kv->slots = slots;
    kv->kv_heads = c->num_key_value_heads;
    kv->max_tokens = max_tokens;
    kv->head_dim = c->head_dim;
    int64_t shape[5] = {kv->layers, slots, kv->kv_heads, max_tokens, kv->head_dim};
    lm_status st;
    if (m->device.type == LM_DEVICE_CUDA) {
        st = lm_tensor_zeros(m->device, LM_BF16, 5, shape, &kv->k);
        if (st == LM_OK) st = lm_tensor_zeros(m->device, LM_BF16, 5, shape, &kv->v);
    } else {
        st = lm_tensor_create(m->device, LM_F32, 5, shape, &kv->k);
        if (st == LM_OK) st = lm_tensor_create(m->device, LM_F32, 5, shape, &kv->v);
    }
    if (st == LM_OK && !(kv->length = lm__calloc((size_t)slots, sizeof *kv->length))) st = LM_OUT_OF_MEMORY;
    if (st != LM_OK) {
        lm_kv_cache_destroy(kv);
        return st;
    }
    *out = kv;
    return LM_OK;
}

void lm_kv_cache_destroy(lm_kv_cache *c) {
    if (!c) return;
#ifdef LOOM_HAVE_CUDA
    lm__cuda_runner_destroy(c->gpu);
#endif
    lm_tensor_destroy(c->k);
    lm_tensor_destroy(c->v);
    lm__free(c->length);
    lm__free(c);
}

int lm_kv_cache_slots(const lm_kv_cache *c) { return c->slots; }
int64_t lm_kv_cache_capacity(const lm_kv_cache *c) { return c->max_tokens; }

int64_t lm_kv_cache_length(const lm_kv_cache *c, int slot) {
    return (slot >= 0 && slot < c->slots) ? c->length[slot] : -1;
}

lm_status lm_kv_cache_reset(lm_kv_cache *c, int slot) {
    if (!c || slot < 0 || slot >= c->slots)
        return lm__error(LM_OUT_OF_RANGE, "kv cache: slot %d outside [0, %d)", slot, c ? c->slots : 0);
    c->length[slot] = 0;
    return LM_OK;
}
