/* nn/forward_cuda.c — the decoder forward pass on a CUDA device (built only with CUDA).
 *
 * Precision: bf16 weights and KV cache, f32 residual stream x [ntok, H], f32
 * accumulation everywhere. Two paths per step, chosen by the number of tokens:
 *  - small (ntok <= 8, decode): each projection is one GEMV kernel (gemv_v2) that
 *    streams the bf16 weights once; RMSNorm is fused into the input of the q|k|v and
 *    gate|up GEMVs, SwiGLU into the input of the down GEMV, the residual adds into the
 *    outputs of o and down. Per layer: q|k|v GEMV, qkv_rope, attention, o, gate|up and
 *    down GEMVs (6 kernels; the GEMVs prefetch their weights under programmatic launch).
 *  - big (prefill, large batches): cuBLASLt GEMMs on bf16 activations with f32 output
 *    (bias epilogue for o/gate|up/down biases), fused add + RMSNorm, fused SwiGLU.
 * Both: qkv_rope_v2 applies q/k/v bias, qwen3's q/k norms and RoPE and writes k, v
 * straight into the cache; attention is the tensor-core flash kernel for prefill
 * (head dims 64/128) and the split-K rows kernel otherwise.
 * A one-token decode step of B rows runs eagerly the first time, is captured as a
 * CUDA graph the second time and replayed from then on: every kernel reads token ids,
 * positions and slots from a device buffer refreshed by one host-to-device copy per
 * step, so the graph never changes. Decode buffers (rows = slots) are fixed for the
 * cache's lifetime so the graphs stay valid; prefill buffers grow on demand.
 */
#include "nn/internal.h"
#include "nn/model_cuda.h"
#include "ops/cuda/cuda_ops.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <string.h>

/* Activations for up to `rows` tokens and `logit_rows` logits rows, carved from one
 * device allocation, plus pinned host staging for the per-step inputs and outputs. */
typedef struct bufs {
    int64_t rows, logit_rows;
    void *mem;           /* device allocation holding every array below */
    float *x;            /* [rows, H] residual stream */
    void *xn;            /* bf16 [rows, H] normalized rows (GEMM input) */
    float *qkv;          /* [rows, (Hq + 2 Hkv) * hd] */
    void *q;             /* [rows, Hq, hd], f32 or bf16 */
    void *attn;          /* [rows, Hq * hd], f32 or bf16 */
    float *tmp;          /* [rows, H] */
    float *gu;           /* [rows, 2I] gate | up */
    void *act;           /* bf16 [rows, I] */
    float *logits;       /* [logit_rows, V] */
    float *partial;      /* attention split workspace */
    int *counters;       /* [rows, Hq], zero between kernels */
    int32_t *in;         /* [3, rows]: token ids, positions, slots */
    int32_t *next;       /* [rows] sampled ids */
    lm__cuda_sample_params *sp; /* [1] sampling parameters */
    void *swork;         /* sampler scratch, lm__cuda_sample_workspace(rows) bytes */
    int32_t *host_in;    /* pinned [3 * rows] */
    int32_t *host_next;  /* pinned [rows] */
    lm__cuda_sample_params *host_sp; /* pinned [1] */
} bufs;

struct lm__cuda_runner {
    lm_device device;
    int nsplit;          /* attention key splits for this cache's capacity */
    bufs dec, pre;       /* decode (rows = slots, fixed) and prefill (grown) */
    int ngraphs;         /* (slots + 1) * 2 */
    lm_device_graph **graphs;   /* [ngraphs]: decode of B rows at 2B (logits) and 2B + 1 (sampling) */
    unsigned char *warm; /* [ngraphs]: that shape already ran once eagerly */
    const lm_ctx *graph_ctx; /* the graphs replay this context's cuBLASLt workspace */
    const void *graph_ws;
};

static lm_status cu(cudaError_t e, const char *what) { return lm__cuda_check((int)e, what); }

static void bufs_free(lm_device dev, bufs *b) {
    lm_device_free(dev, b->mem);
    if (b->host_in) cudaFreeHost(b->host_in);
    if (b->host_next) cudaFreeHost(b->host_next);
    if (b->host_sp) cudaFreeHost(b->host_sp);
    memset(b, 0, sizeof *b);
}

/* Next 256-byte aligned offset for `bytes` more bytes. */
static size_t take(size_t *cursor, size_t bytes) {
    size_t off = (*cursor + 255) / 256 * 256;
    *cursor = off + bytes;
    return off;
}

static lm_status bufs_alloc(const lm_model *m, int nsplit, int64_t rows, int64_t logit_rows, bufs *b) {
    const lm_model_config *c = &m->cfg;
    int64_t H = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    int64_t Hq = c->num_attention_heads, Hkv = c->num_key_value_heads, qkv = (Hq + 2 * Hkv) * hd;
    size_t cur = 0, o[15];
    o[0] = take(&cur, (size_t)(rows * H) * 4);
    o[1] = take(&cur, (size_t)(rows * H) * 2);
    o[2] = take(&cur, (size_t)(rows * qkv) * 4);
    o[3] = take(&cur, (size_t)(rows * Hq * hd) * 4);
    o[4] = take(&cur, (size_t)(rows * Hq * hd) * 4);
    o[5] = take(&cur, (size_t)(rows * H) * 4);
    o[6] = take(&cur, (size_t)(rows * 2 * I) * 4);
    o[7] = take(&cur, (size_t)(rows * I) * 2);
    o[8] = take(&cur, (size_t)(logit_rows * c->vocab_size) * 4);
    o[9] = take(&cur, lm__cuda_attention_rows_workspace(rows, (int)Hq, (int)hd, nsplit) * 4);
    o[10] = take(&cur, (size_t)(rows * Hq) * sizeof(int));
    o[11] = take(&cur, (size_t)(3 * rows) * 4);
    o[12] = take(&cur, (size_t)rows * 4);
    o[13] = take(&cur, sizeof(lm__cuda_sample_params));
    o[14] = take(&cur, lm__cuda_sample_workspace(rows));
    memset(b, 0, sizeof *b);
    LM_TRY(lm_device_alloc(m->device, cur, &b->mem));
    char *base = b->mem;
    b->rows = rows, b->logit_rows = logit_rows;
    b->x = (float *)(base + o[0]), b->xn = base + o[1], b->qkv = (float *)(base + o[2]), b->q = base + o[3];
    b->attn = base + o[4], b->tmp = (float *)(base + o[5]), b->gu = (float *)(base + o[6]), b->act = base + o[7];
    b->logits = (float *)(base + o[8]), b->partial = (float *)(base + o[9]), b->counters = (int *)(base + o[10]);
    b->in = (int32_t *)(base + o[11]), b->next = (int32_t *)(base + o[12]), b->sp = (lm__cuda_sample_params *)(base + o[13]);
    b->swork = base + o[14];
    LM_TRY(cu(cudaMemset(b->counters, 0, (size_t)(rows * Hq) * sizeof(int)), "cudaMemset (attention counters)"));
    LM_TRY(cu(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
    LM_TRY(cu(cudaHostAlloc((void **)&b->host_in, (size_t)(3 * rows) * 4, cudaHostAllocDefault), "cudaHostAlloc"));
    LM_TRY(cu(cudaHostAlloc((void **)&b->host_next, (size_t)rows * 4, cudaHostAllocDefault), "cudaHostAlloc"));
    return cu(cudaHostAlloc((void **)&b->host_sp, sizeof *b->host_sp, cudaHostAllocDefault), "cudaHostAlloc");
}

void lm__cuda_runner_destroy(struct lm__cuda_runner *r) {
    if (!r) return;
    for (int i = 0; i < r->ngraphs; i++) lm_device_graph_destroy(r->graphs[i]);
    lm__free(r->graphs);
    lm__free(r->warm);
    bufs_free(r->device, &r->dec);
    bufs_free(r->device, &r->pre);
    lm__free(r);
}

static void drop_graphs(struct lm__cuda_runner *r) {
    for (int i = 0; i < r->ngraphs; i++) {
        lm_device_graph_destroy(r->graphs[i]);
        r->graphs[i] = NULL;
        r->warm[i] = 0;
    }
}

static lm_status runner_get(const lm_model *m, lm_kv_cache *cache, struct lm__cuda_runner **out) {
    if (cache->gpu) {
        *out = cache->gpu;
        return LM_OK;
    }
    struct lm__cuda_runner *r = lm__calloc(1, sizeof *r);
    if (!r) return LM_OUT_OF_MEMORY;
    r->device = m->device;
    r->nsplit = lm__cuda_attention_rows_splits(cache->max_tokens);
    r->ngraphs = (cache->slots + 1) * 2;
    lm_status st = LM_OK;
    if (!(r->graphs = lm__calloc((size_t)r->ngraphs, sizeof *r->graphs)) ||
        !(r->warm = lm__calloc((size_t)r->ngraphs, 1)))
        st = LM_OUT_OF_MEMORY;
    if (st == LM_OK) st = bufs_alloc(m, r->nsplit, cache->slots, cache->slots, &r->dec);
    if (st != LM_OK) {
        lm__cuda_runner_destroy(r);
        return st;
    }
    cache->gpu = *out = r;
    return LM_OK;
}

/* One forward step's geometry and choices. */
typedef struct step {
    const lm_model *m;
    const lm__cuda_model *g;
    lm_kv_cache *cache;
    const lm__cuda_blas *blas;
    cudaStream_t s;
    bufs *b;
    int B;
    int64_t T, ntok;
    int small;      /* GEMV path (ntok <= LM__CUDA_GEMV_MAX_ROWS) */
    int flash;      /* prefill attention on tensor cores */
    int all_rows;   /* logits for every token, not just each row's last */
    int sample;     /* pick next tokens on the device */
    int nsplit;
} step;

static lm__cuda_kv layer_kv(const step *st, int layer) {
    const lm_kv_cache *c = st->cache;
    size_t per_layer = (size_t)c->slots * (size_t)(c->kv_heads * c->max_tokens * c->head_dim) * 2; /* bf16 bytes */
    lm__cuda_kv kv;
    kv.k = (char *)lm_tensor_data(c->k) + (size_t)layer * per_layer;
    kv.v = (char *)lm_tensor_data(c->v) + (size_t)layer * per_layer;
    kv.max_tokens = c->max_tokens;
    kv.kv_heads = (int)c->kv_heads;
    kv.head_dim = (int)c->head_dim;
    return kv;
}

static lm_status gemv(const step *st, lm__cuda_gemv_in in, const float *x, int64_t ldx, const float *norm_w,
                      const void *w, const float *bias, float *out, int64_t ldo, int accumulate, int M, int64_t N,
                      int64_t K) {
    lm__cuda_gemv_params p = {in, x, ldx, norm_w, (float)st->m->cfg.rms_norm_eps, w, bias, out, ldo, accumulate, M, N, K};
    return lm__cuda_gemv_v2(&p, st->s);
}

static lm_status attention(const step *st, int layer) {
    const lm_model_config *c = &st->m->cfg;
    const lm__cuda_layer *ly = &st->g->layers[layer];
    bufs *b = st->b;
    lm__cuda_kv kv = layer_kv(st, layer);
    const int32_t *pos = b->in + b->rows, *slot = b->in + 2 * b->rows;
    lm__cuda_qkv_params qp = {b->qkv, ly->bqkv, ly->q_norm, ly->k_norm, (float)c->rms_norm_eps, st->g->inv_freq,
                             st->m->rope_attn_factor, pos, slot, st->ntok, (int)c->num_attention_heads, st->flash,
                             b->q};
    LM_TRY(lm__cuda_qkv_rope_v2(&qp, &kv, st->s));
    lm__cuda_attn_params ap = {b->q, st->flash, pos, slot, st->ntok, (int)c->num_attention_heads,
                              (float)(1.0 / sqrt((double)c->head_dim)), b->attn, !st->small, b->partial,
                              b->counters, st->nsplit};
    if (st->flash) return lm__cuda_attention_prefill_v3(&ap, st->B, st->T, &kv, st->s);
    return lm__cuda_attention_rows_v2(&ap, &kv, st->s);
}

/* One layer, GEMV path: x is updated in place. */
static lm_status layer_small(const step *st, int l) {
    const lm_model_config *c = &st->m->cfg;
    const lm__cuda_layer *ly = &st->g->layers[l];
    bufs *b = st->b;
    int M = (int)st->ntok;
    int64_t H = c->hidden_size, I = c->intermediate_size, qd = c->num_attention_heads * c->head_dim;
    int64_t nqkv = qd + 2 * c->num_key_value_heads * c->head_dim;
    LM_TRY(gemv(st, LM__CUDA_GEMV_RMSNORM, b->x, H, ly->attn_norm, ly->wqkv, NULL, b->qkv, nqkv, 0, M, nqkv, H));
    LM_TRY(attention(st, l));
    LM_TRY(gemv(st, LM__CUDA_GEMV_PLAIN, b->attn, qd, NULL, ly->wo, ly->bo, b->x, H, 1, M, H, qd));
    LM_TRY(gemv(st, LM__CUDA_GEMV_RMSNORM, b->x, H, ly->mlp_norm, ly->wgu, ly->bgu, b->gu, 2 * I, 0, M, 2 * I, H));
    return gemv(st, LM__CUDA_GEMV_SWIGLU, b->gu, 2 * I, NULL, ly->wd, ly->bd, b->x, H, 1, M, H, I);
}

/* One layer, GEMM path: on entry xn = rmsnorm(x) with this layer's attn_norm; on exit
 * x has both residual adds and xn = rmsnorm(x) with the next norm. */
static lm_status layer_big(const step *st, int l) {
    const lm_model_config *c = &st->m->cfg;
    const lm__cuda_layer *ly = &st->g->layers[l];
    bufs *b = st->b;
    int64_t M = st->ntok, H = c->hidden_size, I = c->intermediate_size, qd = c->num_attention_heads * c->head_dim;
    int64_t nqkv = qd + 2 * c->num_key_value_heads * c->head_dim;
    float eps = (float)c->rms_norm_eps;
    const float *next_norm = l + 1 < c->num_hidden_layers ? st->g->layers[l + 1].attn_norm : st->g->final_norm;
    LM_TRY(lm__cuda_linear_lt(st->blas, b->xn, H, ly->wqkv, NULL, b->qkv, nqkv, M, nqkv, H, st->s));
    LM_TRY(attention(st, l));
    LM_TRY(lm__cuda_linear_lt(st->blas, b->attn, qd, ly->wo, ly->bo, b->tmp, H, M, H, qd, st->s));
    LM_TRY(lm__cuda_add_rmsnorm_v2(b->x, b->tmp, ly->mlp_norm, eps, M, H, b->xn, st->s));
    LM_TRY(lm__cuda_linear_lt(st->blas, b->xn, H, ly->wgu, ly->bgu, b->gu, 2 * I, M, 2 * I, H, st->s));
    LM_TRY(lm__cuda_swiglu_v2(b->gu, M, I, b->act, st->s));
    LM_TRY(lm__cuda_linear_lt(st->blas, b->act, I, ly->wd, ly->bd, b->tmp, H, M, H, I, st->s));
    return lm__cuda_add_rmsnorm_v2(b->x, b->tmp, next_norm, eps, M, H, b->xn, st->s);
}

/* Logits of the requested rows (each row's last token, or all tokens), then the
 * device-side pick when sampling. */
static lm_status output(const step *st) {
    const lm_model_config *c = &st->m->cfg;
    bufs *b = st->b;
    int64_t H = c->hidden_size, V = c->vocab_size, rows = st->all_rows ? st->ntok : st->B;
    int64_t first = st->all_rows ? 0 : st->T - 1, ld = st->all_rows ? H : st->T * H; /* row r is token r*T + T-1 */
    if (st->small)
        LM_TRY(gemv(st, LM__CUDA_GEMV_RMSNORM, b->x + first * H, ld, st->g->final_norm, st->g->lm_head, NULL, b->logits, V,
                    0, (int)rows, V, H));
    else
        LM_TRY(lm__cuda_linear_lt(st->blas, (const uint16_t *)b->xn + first * H, ld, st->g->lm_head, NULL, b->logits, V,
                                 rows, V, H, st->s));
    return st->sample ? lm__cuda_sample_v2(b->logits, st->B, V, V, b->sp, b->next, b->swork, st->s) : LM_OK;
}

/* Every kernel of one step, queued on st->s (this is what a decode graph captures). */
static lm_status run_kernels(const step *st) {
    const lm_model_config *c = &st->m->cfg;
    bufs *b = st->b;
    int64_t H = c->hidden_size;
    LM_TRY(lm__cuda_embed_rows_v2(st->g->embed, b->in, st->ntok, H, b->x, st->s));
    if (!st->small)
        LM_TRY(lm__cuda_rmsnorm_v2(b->x, st->g->layers[0].attn_norm, (float)c->rms_norm_eps, st->ntok, H, b->xn, st->s));
    for (int l = 0; l < (int)c->num_hidden_layers; l++) LM_TRY(st->small ? layer_small(st, l) : layer_big(st, l));
    return output(st);
}

/* Decode: graph replay when captured, else an eager run (first time) or a capture. */
static lm_status run_decode(struct lm__cuda_runner *r, lm_ctx *ctx, const step *st) {
    if (r->graph_ctx && (r->graph_ctx != ctx || r->graph_ws != st->blas->workspace)) drop_graphs(r);
    int key = st->B * 2 + st->sample;
    if (r->graphs[key]) return lm_device_graph_launch(r->graphs[key], ctx);
    if (!r->warm[key]) {
        LM_TRY(run_kernels(st));
        r->warm[key] = 1;
        return LM_OK;
    }
    LM_TRY(lm_ctx_capture_begin(ctx));
    lm_status st_run = run_kernels(st);
    lm_device_graph *graph = NULL;
    lm_status st_end = lm_ctx_capture_end(ctx, &graph); /* always ends the capture */
    if (st_run != LM_OK) {
        lm_device_graph_destroy(graph);
        return lm__error_context(st_run, "capturing the decode step of %d rows", st->B);
    }
    if (st_end != LM_OK) return lm__error_context(st_end, "capturing the decode step of %d rows", st->B);
    r->graphs[key] = graph;
    r->graph_ctx = ctx;
    r->graph_ws = st->blas->workspace;
    return lm_device_graph_launch(graph, ctx);
}

/* Prefill buffers for ntok tokens and logit_rows logits rows, grown when needed. */
static lm_status ensure_prefill(const lm_model *m, struct lm__cuda_runner *r, int64_t ntok, int64_t logit_rows) {
    if (r->pre.mem && r->pre.rows >= ntok && r->pre.logit_rows >= logit_rows) return LM_OK;
    int64_t rows = LM_MAX(ntok, r->pre.rows), lrows = LM_MAX(logit_rows, r->pre.logit_rows);
    bufs_free(r->device, &r->pre);
    lm_status st = bufs_alloc(m, r->nsplit, rows, lrows, &r->pre);
    if (st != LM_OK) bufs_free(r->device, &r->pre);
    return st;
}

/* Token ids, positions and slots of the step into pinned memory, then to the device. */
static lm_status stage_inputs(const step *st, const int *slots, const int32_t *ids, const lm_sampler_params *sp,
                              uint64_t draw) {
    bufs *b = st->b;
    int32_t *hid = b->host_in, *hpos = hid + b->rows, *hslot = hid + 2 * b->rows;
    for (int bb = 0; bb < st->B; bb++)
        for (int64_t t = 0; t < st->T; t++) {
            int64_t i = bb * st->T + t;
            hid[i] = ids[i];
            hpos[i] = (int32_t)(st->cache->length[slots[bb]] + t);
            hslot[i] = slots[bb];
        }
    LM_TRY(cu(cudaMemcpyAsync(b->in, b->host_in, (size_t)(3 * b->rows) * 4, cudaMemcpyHostToDevice, st->s),
              "cudaMemcpyAsync (step inputs)"));
    if (!sp) return LM_OK;
    lm__cuda_sample_params *p = b->host_sp;
    p->greedy = sp->greedy, p->temperature = sp->temperature, p->top_k = sp->top_k;
    p->top_p = sp->top_p, p->min_p = sp->min_p, p->seed = sp->seed, p->draw = draw;
    return cu(cudaMemcpyAsync(b->sp, p, sizeof *p, cudaMemcpyHostToDevice, st->s), "cudaMemcpyAsync (sampling parameters)");
}

lm_status lm__cuda_forward(const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, const int *slots, int B,
                           const int32_t *ids, int64_t T, float *logits, int all_positions, const lm_sampler_params *sp,
                           uint64_t draw, int32_t *next_ids) {
    struct lm__cuda_runner *r = NULL;
    LM_TRY(runner_get(m, cache, &r));
    step st;
    memset(&st, 0, sizeof st);
    st.m = m, st.g = m->gpu, st.cache = cache, st.s = (cudaStream_t)lm_ctx_stream(ctx);
    st.B = B, st.T = T, st.ntok = (int64_t)B * T, st.nsplit = r->nsplit;
    st.all_rows = logits && all_positions && !sp;
    st.sample = sp != NULL;
    st.small = st.ntok <= LM__CUDA_GEMV_MAX_ROWS && st.g->gemv_ok;
    st.flash = T > 1 && lm__cuda_attention_prefill_v3_supports((int)m->cfg.head_dim);
    LM_TRY(lm__ctx_cuda_blas(ctx, &st.blas));
    int decode = T == 1;
    if (!decode) LM_TRY(ensure_prefill(m, r, st.ntok, st.all_rows ? st.ntok : B));
    st.b = decode ? &r->dec : &r->pre;
    LM_TRY(stage_inputs(&st, slots, ids, sp, draw));
    LM_TRY(decode ? run_decode(r, ctx, &st) : run_kernels(&st));
    int64_t rows = st.all_rows ? st.ntok : B, V = m->cfg.vocab_size;
    if (logits)
        LM_TRY(cu(cudaMemcpyAsync(logits, st.b->logits, (size_t)(rows * V) * 4, cudaMemcpyDeviceToHost, st.s),
                  "cudaMemcpyAsync (logits)"));
    if (sp)
        LM_TRY(cu(cudaMemcpyAsync(st.b->host_next, st.b->next, (size_t)B * 4, cudaMemcpyDeviceToHost, st.s),
                  "cudaMemcpyAsync (next ids)"));
    LM_TRY(cu(cudaStreamSynchronize(st.s), "cudaStreamSynchronize (forward)"));
    if (sp) memcpy(next_ids, st.b->host_next, (size_t)B * sizeof *next_ids);
    return LM_OK;
}
