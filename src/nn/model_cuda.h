/* nn/model_cuda.h — the device copy of a model's weights (CUDA builds only; never
 * installed). Every pointer below is a device address inside one arena allocation;
 * matrices are bf16 row-major [out_features, in_features], vectors f32. */
#ifndef LOOM_NN_MODEL_CUDA_H
#define LOOM_NN_MODEL_CUDA_H

#include "nn/internal.h"

typedef struct lm__cuda_layer {
    void *wqkv;                  /* bf16 [(Hq + 2 Hkv) * hd, H]: q_proj, k_proj, v_proj rows */
    void *wo;                    /* bf16 [H, Hq * hd] */
    void *wgu;                   /* bf16 [2I, H]: gate_proj rows, then up_proj rows */
    void *wd;                    /* bf16 [H, I] */
    float *attn_norm, *mlp_norm; /* [H] */
    float *bqkv;                 /* [(Hq + 2 Hkv) * hd] or NULL */
    float *bo;                   /* [H] or NULL */
    float *bgu;                  /* [2I] or NULL */
    float *bd;                   /* [H] or NULL */
    float *q_norm, *k_norm;      /* [hd] or NULL (qwen3) */
} lm__cuda_layer;

typedef struct lm__cuda_model {
    lm_device device;
    void *arena;            /* [arena_bytes] every weight below */
    size_t arena_bytes;
    void *embed;            /* bf16 [V, H] */
    void *lm_head;          /* bf16 [V, H]; == embed when tied */
    float *final_norm;      /* [H] */
    float *inv_freq;        /* [hd / 2] */
    lm__cuda_layer *layers; /* host array [num_hidden_layers] of device pointers */
    int64_t weight_bytes;   /* bytes one decode step reads */
    int gemv_ok;            /* H, Hq * hd and I are multiples of 8 (the GEMV kernel's vectors) */
} lm__cuda_model;

#endif
