/* nn/model_cuda.c — a loaded model's weights on a CUDA device (built only with CUDA).
 *
 * All weights live in one device allocation (the arena), carved into 256-byte
 * aligned pieces: per layer the fused projection matrices (q|k|v stacked into one
 * [(Hq + 2 Hkv) hd, H] matrix, gate|up into one [2I, H] matrix, then o and down) in
 * bf16, and the norm weights, biases and RoPE frequencies in f32. Fusing the stacked
 * matrices turns three (two) GEMMs into one. Matrices stored as bf16 are copied
 * straight from the mapped file; f32/f16 ones are rounded to bf16 on the host in
 * chunks of CHUNK elements first. The pieces are listed once (plan), sized, then
 * uploaded in the same order, so sizing and copying cannot disagree.
 */
#include "nn/internal.h"
#include "nn/model_cuda.h"

#include <string.h>

#define CHUNK ((int64_t)1 << 20) /* elements converted per host staging round */
#define ALIGN 256

/* One arena piece: up to three source tensors stacked row-wise, stored as bf16
 * (matrices) or f32 (vectors), and where its device address goes. */
typedef struct piece {
    const lm_tensor *src[3];
    int nsrc;
    int f32;
    void **dst;
    size_t offset, bytes;
} piece;

typedef struct plan {
    piece *p; /* [n] */
    int n, cap;
} plan;

static lm_status add(plan *pl, void **dst, int f32, const lm_tensor *a, const lm_tensor *b, const lm_tensor *c) {
    if (!a) return LM_OK; /* optional piece (bias, q/k norm) absent */
    if (pl->n == pl->cap) {
        int cap = pl->cap ? pl->cap * 2 : 64;
        piece *np = lm__calloc((size_t)cap, sizeof *np);
        if (!np) return LM_OUT_OF_MEMORY;
        if (pl->n) memcpy(np, pl->p, sizeof *np * (size_t)pl->n);
        lm__free(pl->p);
        pl->p = np;
        pl->cap = cap;
    }
    piece *q = &pl->p[pl->n++];
    memset(q, 0, sizeof *q);
    q->src[0] = a, q->src[1] = b, q->src[2] = c;
    q->nsrc = c ? 3 : b ? 2 : 1;
    q->f32 = f32;
    q->dst = dst;
    for (int i = 0; i < q->nsrc; i++) q->bytes += (size_t)lm_tensor_numel(q->src[i]) * (f32 ? 4 : 2);
    return LM_OK;
}

static lm_status plan_model(const lm_model *m, lm__cuda_model *g, plan *pl) {
    LM_TRY(add(pl, &g->embed, 0, m->embed, NULL, NULL));
    if (m->lm_head) LM_TRY(add(pl, &g->lm_head, 0, m->lm_head, NULL, NULL));
    LM_TRY(add(pl, (void **)&g->final_norm, 1, m->final_norm, NULL, NULL));
    LM_TRY(add(pl, (void **)&g->inv_freq, 1, m->inv_freq, NULL, NULL));
    for (int64_t i = 0; i < m->cfg.num_hidden_layers; i++) {
        const lm__layer *ly = &m->layers[i];
        lm__cuda_layer *d = &g->layers[i];
        LM_TRY(add(pl, &d->wqkv, 0, ly->wq, ly->wk, ly->wv));
        LM_TRY(add(pl, &d->wo, 0, ly->wo, NULL, NULL));
        LM_TRY(add(pl, &d->wgu, 0, ly->wg, ly->wu, NULL));
        LM_TRY(add(pl, &d->wd, 0, ly->wd, NULL, NULL));
        LM_TRY(add(pl, (void **)&d->attn_norm, 1, ly->attn_norm, NULL, NULL));
        LM_TRY(add(pl, (void **)&d->mlp_norm, 1, ly->mlp_norm, NULL, NULL));
        LM_TRY(add(pl, (void **)&d->bqkv, 1, ly->bq, ly->bk, ly->bv)); /* all three or none */
        LM_TRY(add(pl, (void **)&d->bo, 1, ly->bo, NULL, NULL));
        LM_TRY(add(pl, (void **)&d->bgu, 1, ly->bg, ly->bu, NULL));
        LM_TRY(add(pl, (void **)&d->bd, 1, ly->bd, NULL, NULL));
        LM_TRY(add(pl, (void **)&d->q_norm, 1, ly->q_norm, NULL, NULL));
        LM_TRY(add(pl, (void **)&d->k_norm, 1, ly->k_norm, NULL, NULL));
    }
    return LM_OK;
}

/* Copies n elements of t starting at element `from` to dst as bf16 or f32, through
 * the host buffer stage [CHUNK * 4 bytes] when a conversion is needed. */
static lm_status upload_tensor(lm_device dev, uint8_t *dst, const lm_tensor *t, int f32, uint8_t *stage) {
    lm_dtype dt = lm_tensor_dtype(t);
    int64_t n = lm_tensor_numel(t);
    const uint8_t *src = lm_tensor_data(t);
    if ((f32 && dt == LM_F32) || (!f32 && dt == LM_BF16))
        return lm_device_copy(dev, dst, lm_device_cpu(), src, (size_t)n * lm_dtype_size(dt));
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        int64_t k = LM_MIN(CHUNK, n - i0);
        for (int64_t i = 0; i < k; i++) {
            float v;
            if (dt == LM_F32) v = ((const float *)src)[i0 + i];
            else if (dt == LM_BF16) v = lm_bf16_to_f32(((const uint16_t *)src)[i0 + i]);
            else v = lm_f16_to_f32(((const uint16_t *)src)[i0 + i]);
            if (f32) ((float *)stage)[i] = v;
            else ((uint16_t *)stage)[i] = lm_f32_to_bf16(v);
        }
        size_t es = f32 ? 4 : 2;
        LM_TRY(lm_device_copy(dev, dst + (size_t)i0 * es, lm_device_cpu(), stage, (size_t)k * es));
    }
    return LM_OK;
}

static lm_status upload(lm_device dev, uint8_t *arena, const plan *pl) {
    uint8_t *stage = lm__alloc((size_t)CHUNK * 4, 64);
    if (!stage) return LM_OUT_OF_MEMORY;
    lm_status st = LM_OK;
    for (int i = 0; i < pl->n && st == LM_OK; i++) {
        const piece *q = &pl->p[i];
        uint8_t *dst = arena + q->offset;
        *q->dst = dst;
        for (int s = 0; s < q->nsrc && st == LM_OK; s++) {
            st = upload_tensor(dev, dst, q->src[s], q->f32, stage);
            dst += (size_t)lm_tensor_numel(q->src[s]) * (q->f32 ? 4 : 2);
        }
    }
    lm__free(stage);
    return st;
}

/* Bytes one decode step reads: every piece once, except that of the embedding table
 * only one row is read, while the lm_head (the same table when tied) is read whole. */
static int64_t bytes_per_token(const lm_model *m, const plan *pl) {
    int64_t total = 0, H = m->cfg.hidden_size;
    for (int i = 0; i < pl->n; i++) total += (int64_t)pl->p[i].bytes;
    return total + H * 2 - (m->lm_head ? m->cfg.vocab_size * H * 2 : 0);
}

lm_status lm__cuda_model_upload(lm_model *m) {
    lm__cuda_model *g = lm__calloc(1, sizeof *g);
    if (!g) return LM_OUT_OF_MEMORY;
    m->gpu = g;
    g->device = m->device;
    g->layers = lm__calloc((size_t)m->cfg.num_hidden_layers, sizeof *g->layers);
    if (!g->layers) return LM_OUT_OF_MEMORY;
    plan pl = {NULL, 0, 0};
    lm_status st = plan_model(m, g, &pl);
    size_t total = 0;
    for (int i = 0; i < pl.n; i++) {
        total = (total + ALIGN - 1) / ALIGN * ALIGN;
        pl.p[i].offset = total;
        total += pl.p[i].bytes;
    }
    if (st == LM_OK) st = lm_device_alloc(m->device, total, &g->arena);
    if (st == LM_OK) st = upload(m->device, g->arena, &pl);
    if (st == LM_OK) {
        if (!m->lm_head) g->lm_head = g->embed; /* tied */
        g->arena_bytes = total;
        g->weight_bytes = bytes_per_token(m, &pl);
        const lm_model_config *c = &m->cfg;
        g->gemv_ok = c->hidden_size % 8 == 0 && (c->num_attention_heads * c->head_dim) % 8 == 0 &&
                     c->intermediate_size % 8 == 0;
    }
    lm__free(pl.p);
    if (st != LM_OK) lm__error_context(st, "uploading the weights to the device");
    return st;
}

void lm__cuda_model_free(lm__cuda_model *g) {
    if (!g) return;
    lm_device_free(g->device, g->arena);
    lm__free(g->layers);
    lm__free(g);
}

int64_t lm__cuda_model_weight_bytes(const lm__cuda_model *g) { return g->weight_bytes; }
