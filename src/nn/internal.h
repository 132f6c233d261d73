/* nn/internal.h — the model and KV-cache records shared by the nn sources (never installed). */
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
};

struct lm_kv_cache {
    int layers, slots;
    int64_t kv_heads, max_tokens, head_dim;
    lm_tensor *k, *v; /* f32 [layers, slots, kv_heads, max_tokens, head_dim] */
    int64_t *length;  /* [slots] tokens stored per slot */
};

#endif
