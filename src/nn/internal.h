/* nn/internal.h — the model and KV-cache records shared by the nn sources (never
 * installed). A model on a CUDA device also carries its device weights (gpu), and a
 * KV cache for it a runner with the device activations and captured decode graphs;
 * both are defined in nn/model_cuda.c and nn/forward_cuda.c (CUDA builds only). */
#ifndef LOOM_NN_INTERNAL_H
#define LOOM_NN_INTERNAL_H

#include "base/internal.h"
#include "loom/model.h"

/* One decoder layer's weights. Matrices are [out_features, in_features] tensors in
 * the checkpoint's dtype over the mapped file; norms and biases are f32 copies. */
typedef struct lm__layer {
    lm_tensor *attn_norm;          /* [H] f32 (input_layernorm) */
    lm_tensor *wq, *wk, *wv, *wo;  /* [Hq*hd, H], [Hkv*hd, H], [Hkv*hd, H], [H, Hq*hd] */
    lm_tensor *bq, *bk, *bv, *bo;  /* biases (f32) or NULL */
    lm_tensor *q_norm, *k_norm;    /* [hd] f32 (qwen3) or NULL */
    lm_tensor *mlp_norm;           /* [H] f32 (post_attention_layernorm) */
    lm_tensor *wg, *wu, *wd;       /* [I, H], [I, H], [H, I] */
    lm_tensor *bg, *bu, *bd;       /* mlp biases (f32) or NULL */
} lm__layer;

struct lm_model {
    lm_model_config cfg;
    lm_device device;
    lm_tensor *embed;      /* [V, H] stored dtype */
    lm_tensor *lm_head;    /* [V, H]; the same object as embed when tied */
    lm_tensor *final_norm; /* [H] f32 */
    lm_tensor *inv_freq;   /* [hd/2] f32 RoPE inverse frequencies */
    float rope_attn_factor;
    lm__layer *layers;     /* [num_hidden_layers] */
    struct lm__cuda_model *gpu; /* device copy of the weights when device is CUDA, else NULL */
};

struct lm_kv_cache {
    int layers, slots;
    int64_t kv_heads, max_tokens, head_dim;
    lm_tensor *k, *v; /* [layers, slots, kv_heads, max_tokens, head_dim]: f32 on the CPU, bf16 on CUDA */
    int64_t *length;  /* [slots] tokens stored per slot */
    struct lm__cuda_runner *gpu; /* CUDA caches: activations and decode graphs, made on first use */
};

#ifdef LOOM_HAVE_CUDA
/* nn/model_cuda.c: uploads m's weights (bf16 matrices, f32 vectors) to m->device. */
lm_status lm__cuda_model_upload(lm_model *m);
void lm__cuda_model_free(struct lm__cuda_model *g); /* accepts NULL */
int64_t lm__cuda_model_weight_bytes(const struct lm__cuda_model *g);

/* nn/forward_cuda.c: one forward step of a CUDA model, arguments already checked by
 * lm_model_forward. Writes host logits (as lm_model_forward) when logits != NULL,
 * and/or, when sp != NULL, picks next_ids[B] on the device with draw counter `draw`.
 * Does not advance the cache lengths (the caller does on success). */
lm_status lm__cuda_forward(const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, const int *slots, int B,
                           const int32_t *ids, int64_t T, float *logits, int all_positions, const lm_sampler_params *sp,
                           uint64_t draw, int32_t *next_ids);
void lm__cuda_runner_destroy(struct lm__cuda_runner *r); /* accepts NULL */
#endif

#endif
