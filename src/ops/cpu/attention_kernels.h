/* ops/cpu/attention_kernels.h — the per-instruction-set kernels behind lm__cpu_attention.
 *
 * One task holds `rows` query rows (the query heads of one kv group times a block of
 * query positions) and streams one kv head's keys in blocks of nk <= bk through an
 * online softmax (running max m and sum l per row). Scores are in log2 units (q is
 * prescaled by scale * log2(e)) so p = 2^(s - m). Two layouts of the score block:
 *  - row lanes (_rl, many rows: prefill): rows along vector lanes. qt [D][rp] holds
 *    the queries transposed (rp = rows rounded up to `lanes`, padding rows 0), st
 *    [nk][rp] the scores; q.k is broadcast-K FMAs and the softmax has no horizontal
 *    reductions.
 *  - key lanes (_kl, a few rows: decode): keys along lanes. q [rows][ldq] row-major,
 *    s [rows][lds]; q.k is a dot product per key reduced 16 (or 8) keys at a time,
 *    so lanes are not wasted on padding rows.
 * Every kernel accumulates in f32; sizes and strides are in elements.
 */
#ifndef LOOM_OPS_CPU_ATTENTION_KERNELS_H
#define LOOM_OPS_CPU_ATTENTION_KERNELS_H

#include "ops/cpu/isa.h"

#include <stdint.h>

typedef struct lm__attn_kernels {
    int lanes;       /* row lanes: rows per vector; rp is a multiple of it */
    int rows_max;    /* preferred rows per task: what the row-lane score tile covers */
    int kl_rows_max; /* tasks of at most this many rows use key lanes (measured crossover) */
    int bk;          /* keys per block */
    /* Row lanes: st[j * rp + r] = sum_{d < D} qt[d * rp + r] * k[j * ldk + d], j < nk, r < rp. */
    void (*scores_rl)(const float *qt, int64_t rp, int64_t D, const float *k, int64_t ldk, int64_t nk, float *st);
    /* Row lanes, online-softmax step for every row r < rp: row r sees keys j <= last[r]
     * (last == NULL: all nk). m' = max(m, max visible s); alpha[r] = 2^(m - m');
     * st[j * rp + r] becomes p = 2^(s - m') (0 when masked); l = l * alpha + sum p;
     * m = m'. A row with no visible key so far keeps m = -inf, l = 0, alpha = 0. */
    void (*softmax_rl)(float *st, int64_t rp, int64_t nk, const int32_t *last, float *m, float *l, float *alpha);
    /* Key lanes: s[r * lds + j] = sum_{d < D} q[r * ldq + d] * k[j * ldk + d], r < rows, j < nk. */
    void (*scores_kl)(const float *q, int64_t ldq, int64_t rows, int64_t D, const float *k, int64_t ldk, int64_t nk,
                      float *s, int64_t lds);
    /* Key lanes: the softmax_rl step for rows r < rows of s[r * lds + j]. */
    void (*softmax_kl)(float *s, int64_t lds, int64_t rows, int64_t nk, const int32_t *last, float *m, float *l,
                       float *alpha);
    /* acc[r * lda + e] = alpha[r] * acc[r * lda + e] + sum_{j < nk} p[r * prs + j * pjs] * v[j * ldv + e]
     * for r < rows, e < Dv (either layout: prs, pjs = 1, rp or lds, 1). */
    void (*pv)(const float *p, int64_t prs, int64_t pjs, int64_t rows, int64_t nk, const float *v, int64_t ldv,
               int64_t Dv, const float *alpha, float *acc, int64_t lda);
} lm__attn_kernels;

/* Fast precision (docs/QUANTIZATION.md "Fast precision"): the row-lane products on bf16
 * operands, VDPBF16PS with f32 sums. A pair is a uint32: bf16 of element 2i in the low
 * half, of 2i + 1 in the high half (0 past the end). The queries come as qt2 [D2][rp]
 * pairs along d (D2 = ceil(D / 2)); the softmax between scores and pv is the f32 one. */
typedef struct lm__attn_fast_kernels {
    /* qt2[i * rp] = pair(qscale q[2i], qscale q[2i + 1]), i < D2: one query row (a column). */
    void (*pack_q)(const float *q, int64_t D, float qscale, uint32_t *qt2, int64_t rp);
    /* k2[j * D2 + i] = pair(k[j * ldk + 2i], k[j * ldk + 2i + 1]), j < nk. */
    void (*pack_k)(const float *k, int64_t ldk, int64_t nk, int64_t D, uint32_t *k2);
    /* st[j * rp + r] = sum_{i < D2} qt2[i * rp + r] . k2[j * D2 + i], j < nk, r < rp. */
    void (*scores)(const uint32_t *qt2, int64_t rp, int64_t D2, const uint32_t *k2, int64_t nk, float *st);
    /* v2[i * Dv + e] = pair(v[2i][e], v[2i + 1][e]), i < ceil(nk / 2) (key nk as 0). */
    void (*pack_v)(const float *v, int64_t ldv, int64_t nk, int64_t Dv, uint32_t *v2);
    /* p2[i * rp + r] = pair(st[2i * rp + r], st[(2i + 1) * rp + r]), i < ceil(nk / 2). */
    void (*pack_p)(const float *st, int64_t rp, int64_t nk, uint32_t *p2);
    /* acc[r * lda + e] = alpha[r] * acc[r * lda + e] + sum_{i < n2} p2[i * rp + r] . v2[i * Dv + e]. */
    void (*pv)(const uint32_t *p2, int64_t rp, int64_t rows, int64_t n2, const uint32_t *v2, int64_t Dv,
               const float *alpha, float *acc, int64_t lda);
} lm__attn_fast_kernels;

extern const lm__attn_kernels lm__attn_kernels_scalar;
#ifdef LM__HAVE_X86_KERNELS
extern const lm__attn_kernels lm__attn_kernels_avx2;
extern const lm__attn_kernels lm__attn_kernels_avx512;
extern const lm__attn_fast_kernels lm__attn_fast_kernels_avx512bf16; /* AVX512_BF16 */
#endif

/* 2^f for f in [-0.5, 0.5]: degree-6 fit of the relative error (max 2e-9, below f32
 * rounding), shared by the vector paths so they agree to the last bit or two. */
#define LM__EXP2_C1 6.931472028e-01f
#define LM__EXP2_C2 2.402264791e-01f
#define LM__EXP2_C3 5.550332518e-02f
#define LM__EXP2_C4 9.618437359e-03f
#define LM__EXP2_C5 1.339885527e-03f
#define LM__EXP2_C6 1.535331510e-04f

#endif
