/* ops/cpu/matmul_i8dot_avx512.c — the fast-precision int8 / int4 gemv and GEMM
 * (lm__i8dot_kernels, see matmul_kernels.h; docs/QUANTIZATION.md "Fast precision"; the
 * GEMM is described where it starts, below).
 *
 * The exact int8 gemv (matmul_avx512.c) widens every weight to f32 and runs one f32
 * FMA per weight: on cores whose AVX-512 units are 256 bits wide that is more
 * instructions per byte than the memory stream allows, so decode stays below the
 * read bandwidth. Here x is quantized instead, once per call: each block of QB = 64 k
 * of an x row gets the scale d = max |x| / 127 and the values round(x / d) in
 * [-127, 127] (nearest even); then VPDPBUSD adds 64 exact int8 x int8 products into 16
 * int32 lanes per instruction. VPDPBUSD multiplies unsigned by signed bytes, so the
 * weights enter biased, w + 128 (one xor per 64 weights, shared by the x rows), and
 * each lane's int32 sum starts from -128 times the sum of the 4 xq it multiplies (a
 * per-block vector made with x), which removes the bias exactly lane by lane: every
 * lane holds the exact integer sum of its 4 products xq * w (|.| <= 4 * 127 * 128, so
 * its conversion to f32 is exact too, and no lane carries a large offset that the f32
 * sums would have to cancel).
 * The block's sum times d goes into one of 4 f32 accumulators; the row's total times
 * the row scale, bias and accumulate are the exact gemv's epilogue. The only new error
 * is the rounding of x to 8 bits per block (relative to the block's largest |x|).
 * A block with a non-finite x gets d = NaN, so NaN and Inf still reach the output.
 * Per 64 weights and x row: one VPDPBUSD, one conversion, one FMA.
 * Compiled with generic flags: each function carries the AVX512_VNNI target and runs
 * only after lm__cpu_i8dot_supported() (the driver, matmul.c, checks it).
 */
#include "ops/cpu/matmul_kernels.h"

#ifdef LM__HAVE_X86_KERNELS
#include "ops/cpu/transpose_avx512.h"

#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline)) TARGET

enum { QB = 64, GEMV_MR = 4, KU = 4 };


/* The prepared x of one row, K inputs: xq [nb * QB] int8 (zero past K), corr [nb][16]
 * int32 (lane i = -128 * the sum of the block's xq 4i .. 4i + 3), d [nb] f32, each part
 * 64-byte aligned. */
static int64_t nblocks(int64_t K) { return (K + QB - 1) / QB; }
static size_t row_bytes(int64_t K) {
    int64_t nb = nblocks(K);
    return (size_t)(nb * QB + nb * 64 + (nb * 4 + 63) / 64 * 64);
}

static size_t x_bytes_i8dot(int64_t M, int64_t K) { return (size_t)M * row_bytes(K); }

INLINE __mmask16 mask16(int64_t n) { return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1u); }

/* Quantizes one block of n <= QB values of src (zeros past n) into xq [QB]: returns its
 * scale d (max |x| / 127; 0 for an all-zero block, whose xq are 0; NaN when the block
 * holds NaN or Inf, whose xq are 0 too). */
INLINE float quant_block(const float *src, int64_t n, int8_t *xq) {
    __m512 v[4], amax = _mm512_setzero_ps();
    int finite = 1;
    for (int i = 0; i < 4; i++) {
        v[i] = _mm512_maskz_loadu_ps(mask16(n - 16 * i), src + 16 * i); /* past n: 0 */
        __m512 a = _mm512_abs_ps(v[i]);
        /* |x| <= FLT_MAX is false for Inf and (ordered compare) for NaN */
        finite &= _mm512_cmp_ps_mask(a, _mm512_set1_ps(3.4028235e38f), _CMP_LE_OQ) == (__mmask16)0xffff;
        amax = _mm512_max_ps(amax, a);
    }
    float am = _mm512_reduce_max_ps(amax);
    if (!finite || am == 0.0f) {
        memset(xq, 0, QB);
        return finite ? 0.0f : NAN;
    }
    __m512 inv = _mm512_set1_ps(127.0f / am);
    for (int i = 0; i < 4; i++) {
        __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v[i], inv)); /* nearest even; |q| <= 127 */
        q = _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
        _mm_storeu_si128((__m128i *)(xq + 16 * i), _mm512_cvtsepi32_epi8(q));
    }
    return am / 127.0f;
}

/* split: store each block's xq as its 32 even-k values, then its 32 odd-k values (the
 * order int4 bytes unpack to: low nibbles, then high ones); bias: the weights' offset
 * (128 for int8, 8 for int4 nibbles), which sets the lanes' starting values. */
INLINE void prep_x(const float *x, int64_t ldx, int64_t M, int64_t K, void *dst, int split, int bias) {
    const int64_t nb = nblocks(K);
    for (int64_t m = 0; m < M; m++) {
        uint8_t *base = (uint8_t *)dst + (size_t)m * row_bytes(K);
        int8_t *xq = (int8_t *)base;
        int32_t *corr = (int32_t *)(base + nb * QB);
        float *d = (float *)(base + nb * QB + nb * 64);
        const float *xr = x + m * ldx;
        for (int64_t b = 0; b < nb; b++) {
            int64_t k0 = b * QB, n = LM_MIN(QB, K - k0);
            float tmp[QB];
            const float *src = xr + k0;
            if (split) { /* even k at 0 .. 31, odd k at 32 .. 63 (zeros past K) */
                lm__i8dot_split_block(src, n, tmp);
                src = tmp, n = QB;
            }
            d[b] = quant_block(src, n, xq + k0);
            /* per lane: the sum of its 4 xq (ones as the unsigned operand), times -bias */
            __m512i s4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1),
                                             _mm512_load_si512((const void *)(xq + k0)));
            _mm512_store_si512((void *)(corr + b * 16), _mm512_mullo_epi32(s4, _mm512_set1_epi32(-bias)));
        }
    }
}

TARGET static void prep_x_i8dot(const float *x, int64_t ldx, int64_t M, int64_t K, void *dst) {
    prep_x(x, ldx, M, K, dst, 0, 128);
}

TARGET static void prep_x_i4dot(const float *x, int64_t ldx, int64_t M, int64_t K, void *dst) {
    prep_x(x, ldx, M, K, dst, 1, 8);
}

/* Block b of every x row against the biased weight bytes w: acc[m][u] += the lanes'
 * exact int32 sums times d[m][b] (times the per-lane group scales ws when grouped). */
INLINE void block_dot(const uint8_t *xp, size_t rb, int64_t nb, const int MRX, int64_t b, const int u, __m512i w,
                      __m512 ws, const int grouped, __m512 acc[GEMV_MR][KU]) {
#pragma GCC unroll 4
    for (int m = 0; m < MRX; m++) {
        const uint8_t *base = xp + (size_t)m * rb;
        __m512i c = _mm512_load_si512((const void *)(base + nb * QB + b * 64));
        __m512i s = _mm512_dpbusd_epi32(c, w, _mm512_load_si512((const void *)(base + b * QB)));
        __m512 dm = _mm512_set1_ps(((const float *)(base + nb * QB + nb * 64))[b]);
        acc[m][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), grouped ? _mm512_mul_ps(ws, dm) : dm, acc[m][u]);
    }
}

INLINE void acc_zero(const int MRX, __m512 acc[GEMV_MR][KU]) {
#pragma GCC unroll 4
    for (int m = 0; m < MRX; m++)
#pragma GCC unroll 4
        for (int u = 0; u < KU; u++) acc[m][u] = _mm512_setzero_ps();
}

INLINE float acc_total(const __m512 a[KU]) {
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
}

/* Row wr's block b as biased unsigned bytes (w + 128; a masked 0 past K becomes 128: its xq is 0). */
INLINE __m512i i8_block(const int8_t *wr, int64_t K, int64_t b, int64_t full) {
    const int64_t k0 = b * QB;
    __m512i w;
    if (b < full) {
        lm__prefetch_bytes(wr, k0);
        w = _mm512_loadu_si512((const void *)(wr + k0));
    } else {
        int64_t n = K - k0;
        w = _mm512_maskz_loadu_epi8(n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1), wr + k0);
    }
    return _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80));
}

/* y[m * ldy] = epilogue(sum over blocks of d[m][b] * (xq[m] . w)) for m < MRX. Blocks go
 * to the KU accumulators in turn, KU at a time, so every accumulator index is a constant
 * (the accumulators stay in registers). */
INLINE void gemv_i8dot_row(const uint8_t *xp, size_t rb, int64_t nb, const int MRX, const int8_t *wr, int64_t K,
                           const lm__i8_epilogue *ep, int64_t r, float *y, int64_t ldy) {
    __m512 acc[GEMV_MR][KU];
    acc_zero(MRX, acc);
    const int64_t full = K / QB;
    int64_t b = 0;
    for (; b + KU <= nb; b += KU)
#pragma GCC unroll 4
        for (int u = 0; u < KU; u++)
            block_dot(xp, rb, nb, MRX, b + u, u, i8_block(wr, K, b + u, full), _mm512_setzero_ps(), 0, acc);
#pragma GCC unroll 4
    for (int u = 0; u < KU - 1; u++) /* the last nb % KU blocks */
        if (b + u < nb) block_dot(xp, rb, nb, MRX, b + u, u, i8_block(wr, K, b + u, full), _mm512_setzero_ps(), 0, acc);
#pragma GCC unroll 4
    for (int m = 0; m < MRX; m++) y[m * ldy] = lm__i8_finish(ep, r, acc_total(acc[m]), y + m * ldy);
}

/* int4: 32 bytes (64 k) of a row unpack to their low nibbles (even k) then high ones (odd
 * k), each xor 8 (n + 8 as an unsigned byte, the prepared x's lanes start at -8 sum xq);
 * the group scale is per lane: one per block for groups of 64 and 128, and for groups of
 * 32 lanes 0-3 and 8-11 hold the block's first 32 k, lanes 4-7 and 12-15 its last 32. */
/* The group scales of block b (k0 = b * QB) as lanes: f32 scales, or (SB) bf16 ones, which
 * are the top halves of f32s: groups of 32 read the block's two scales as one 32-bit word
 * broadcast to every lane, shifted left by 16 in lanes a (leaving a) and masked in lanes b
 * (leaving b); larger groups broadcast the one 16-bit scale and shift it into place. */
INLINE __m512 block_scales(const void *sc, const int SB, int group, int64_t k0, int last32) {
    if (SB) {
        const uint16_t *s = sc;
        if (group == 32) {
            int32_t word;
            if (last32) word = s[k0 >> 5];
            else memcpy(&word, s + (k0 >> 5), 4);
            __m512i v = _mm512_sllv_epi32(_mm512_set1_epi32(word),
                                          _mm512_set_epi32(0, 0, 0, 0, 16, 16, 16, 16, 0, 0, 0, 0, 16, 16, 16, 16));
            return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u)));
        }
        __m512i h = _mm512_set1_epi16((short)s[k0 >> (group == 64 ? 6 : 7)]);
        return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
    }
    const float *f = sc;
    if (group == 32) { /* the block's two scales a, b as lanes a a a a b b b b a a a a b b b b */
        float bb = last32 ? 0.0f : f[(k0 >> 5) + 1];
        return _mm512_mask_blend_ps((__mmask16)0xF0F0, _mm512_set1_ps(f[k0 >> 5]), _mm512_set1_ps(bb));
    }
    return _mm512_set1_ps(f[k0 >> (group == 64 ? 6 : 7)]);
}

/* Block b of an int4 row as unsigned bytes (low nibbles, then high ones, each n + 8) and
 * its per-lane group scales *ws. The 32 bytes go to both halves of one register, the
 * upper half shifted right by 4, then one ternary logic op keeps the nibble and adds 8
 * ((v & 15) ^ 8). u: the block's place in its group of KU (one prefetch per 64 bytes). */
INLINE __m512i i4_block(const uint8_t *qr, const void *sc, const int SB, int group, int64_t b, int64_t full,
                        const int u, __m512 *ws) {
    const int64_t k0 = b * QB;
    __m512i v;
    if (b < full) { /* one broadcast load: the 32 bytes in both halves */
        if (u >= 0 && !(u & 1)) lm__prefetch_bytes(qr, k0 / 2);
        v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qr + k0 / 2)));
    } else { /* K is a multiple of 32: a last block of 32 k, 16 bytes (the rest meets xq = 0) */
        v = _mm512_broadcast_i64x4(_mm256_maskz_loadu_epi8((__mmask32)0xFFFF, qr + k0 / 2));
    }
    *ws = block_scales(sc, SB, group, k0, b >= full);
    __m512i w = _mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0));
    return _mm512_ternarylogic_epi32(w, _mm512_set1_epi8(0x0F), _mm512_set1_epi8(8), 0x6A); /* (w & 15) ^ 8 */
}

INLINE void gemv_i4dot_row(const uint8_t *xp, size_t rb, int64_t nb, const int MRX, const lm__i4_weights *W,
                           const int G, const int SB, int64_t r, int64_t K, float *y, int64_t ldy) {
    const uint8_t *qr = W->q + r * W->ldq;
    const void *sc = lm__i4_srow(W, r);
    __m512 acc[GEMV_MR][KU];
    acc_zero(MRX, acc);
    const int64_t full = K / QB;
    int64_t b = 0;
    __m512 ws;
    for (; b + KU <= nb; b += KU)
#pragma GCC unroll 4
        for (int u = 0; u < KU; u++) {
            __m512i w = i4_block(qr, sc, SB, G, b + u, full, u, &ws);
            block_dot(xp, rb, nb, MRX, b + u, u, w, ws, 1, acc);
        }
#pragma GCC unroll 4
    for (int u = 0; u < KU - 1; u++) /* the last nb % KU blocks */
        if (b + u < nb) {
            __m512i w = i4_block(qr, sc, SB, G, b + u, full, u, &ws);
            block_dot(xp, rb, nb, MRX, b + u, u, w, ws, 1, acc);
        }
#pragma GCC unroll 4
    for (int m = 0; m < MRX; m++) {
        float v = acc_total(acc[m]) + (W->bias ? W->bias[r] : 0.0f);
        y[m * ldy] = W->accumulate ? y[m * ldy] + v : v;
    }
}

/* The sums of the 16 lanes of a[0], a[1], a[2], a[3], as lanes 0, 4, 8 and 12 of the result. */
INLINE __m512 sum4(const __m512 a[4]) {
    __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(a[0], a[1], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(a[0], a[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(a[2], a[3], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(a[2], a[3], _MM_SHUFFLE(3, 2, 3, 2)));
    /* 128-bit lane i: 4 partial sums of a[i] */
    __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(3, 1, 3, 1)));
    t = _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E));
    return _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));
}

/* int4, one x row (M = 1: decode) against 4 W rows at once (from r): the x block (its
 * lanes' starting values, xq and d) is loaded once for the 4 rows, each row has one
 * accumulator, and the 4 rows' lanes are summed together at the end: 1.3-1.5x the
 * one-row loop's speed, which is bound by its instructions, not by the bytes (int4 rows
 * are half as many bytes as int8's). int8 keeps the one-row loop: it streams at the read
 * bandwidth, and 4 interleaved row streams read more slowly than one. */
INLINE void gemv1_rows4_i4(const uint8_t *xp, int64_t nb, int64_t K, const lm__i4_weights *W4, const int G,
                           const int SB, int64_t r, float *y) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    const int64_t full = K / QB;
    const int32_t *corr = (const int32_t *)(xp + nb * QB);
    const float *d = (const float *)(xp + nb * QB + nb * 64);
    /* The 4 rows' bytes (and scales) are one contiguous run when the rows are dense; the
     * passes after this one read the runs after it, so each row prefetches its own position
     * in the pass at least LM__GEMV_PREFETCH bytes ahead. */
    const int64_t passes = (LM__GEMV_PREFETCH + 4 * W4->ldq - 1) / (4 * W4->ldq);
    const int64_t ss = SB ? 2 : 4; /* bytes a scale */
    const int64_t ahead_q = passes * 4 * W4->ldq, ahead_s = passes * 4 * W4->lds * ss;
    for (int64_t b = 0; b < nb; b++) {
        __m512i c = _mm512_load_si512((const void *)(corr + b * 16));
        __m512i xq = _mm512_load_si512((const void *)(xp + b * QB));
        __m512 dm = _mm512_set1_ps(d[b]);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const uint8_t *qr = W4->q + (r + i) * W4->ldq;
            const char *sc = SB ? (const char *)(W4->scales16 + (r + i) * W4->lds)
                                : (const char *)(W4->scales + (r + i) * W4->lds);
            if (!(b & 1)) lm__prefetch_addr((uintptr_t)qr + (uintptr_t)(b * QB / 2 + ahead_q));
            if (!(b & 7)) lm__prefetch_addr((uintptr_t)sc + (uintptr_t)(b * QB / G * ss + ahead_s));
            __m512 ws;
            __m512i w = i4_block(qr, sc, SB, G, b, full, -1, &ws);
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c, w, xq)), _mm512_mul_ps(ws, dm), acc[i]);
        }
    }
    float tot[16];
    _mm512_storeu_ps(tot, sum4(acc));
    for (int i = 0; i < 4; i++) {
        float v = tot[4 * i] + (W4->bias ? W4->bias[r + i] : 0.0f);
        y[r + i] = W4->accumulate ? y[r + i] + v : v;
    }
}

/* Every W row of the call against every x row, GEMV_MR x rows at a time (the W row stays
 * in L1 between the groups): int8 rows (q8) or int4 rows (W4). */
INLINE void gemv_rows_g(const void *xprep, int64_t M, int64_t K, const int8_t *q8, int64_t ldq,
                        const lm__i8_epilogue *ep, const lm__i4_weights *W4, const int G, const int SB, int64_t nrows,
                        float *y, int64_t ldy) {
    const int64_t nb = nblocks(K);
    const size_t rb = row_bytes(K);
    int64_t r = 0;
    if (M == 1 && W4) /* int4 decode: 4 W rows per pass */
        for (; r + 4 <= nrows; r += 4) gemv1_rows4_i4((const uint8_t *)xprep, nb, K, W4, G, SB, r, y);
    for (; r < nrows; r++)
        for (int64_t m = 0; m < M; m += GEMV_MR) {
            const uint8_t *xm = (const uint8_t *)xprep + (size_t)m * rb;
            float *ym = y + m * ldy + r;
            const int rows = (int)LM_MIN(GEMV_MR, M - m);
#define ROW(MRX)                                                                                                   \
    (W4 ? gemv_i4dot_row(xm, rb, nb, MRX, W4, G, SB, r, K, ym, ldy)                                              \
        : gemv_i8dot_row(xm, rb, nb, MRX, q8 + r * ldq, K, ep, r, ym, ldy))
            switch (rows) {
            case 1: ROW(1); break;
            case 2: ROW(2); break;
            case 3: ROW(3); break;
            default: ROW(4); break;
            }
#undef ROW
        }
}

/* Every W row of the call against every x row: int8 rows (q8) or int4 rows (W4), the
 * int4 group size and the scales' dtype (f32, or bf16 when W4->scales16) constants in
 * each copy. */
TARGET static void gemv_rows(const void *xprep, int64_t M, int64_t K, const int8_t *q8, int64_t ldq,
                             const lm__i8_epilogue *ep, const lm__i4_weights *W4, int64_t nrows, float *y,
                             int64_t ldy) {
#define I4(G, SB) gemv_rows_g(xprep, M, K, NULL, 0, NULL, W4, G, SB, nrows, y, ldy)
    if (!W4) gemv_rows_g(xprep, M, K, q8, ldq, ep, NULL, 0, 0, nrows, y, ldy);
    else if (W4->scales16) {
        if (W4->group == 32) I4(32, 1);
        else if (W4->group == 64) I4(64, 1);
        else I4(128, 1);
    } else if (W4->group == 32) I4(32, 0);
    else if (W4->group == 64) I4(64, 0);
    else I4(128, 0);
#undef I4
}

TARGET static void gemv_i8dot(const void *xprep, int64_t M, int64_t K, const int8_t *q, int64_t ldq,
                              const lm__i8_epilogue *ep, int64_t nrows, float *y, int64_t ldy) {
    gemv_rows(xprep, M, K, q, ldq, ep, NULL, nrows, y, ldy);
}

TARGET static void gemv_i4dot(const void *xprep, int64_t M, int64_t K, const lm__i4_weights *W, int64_t nrows,
                              float *y, int64_t ldy) {
    gemv_rows(xprep, M, K, NULL, 0, NULL, W, nrows, y, ldy);
}

/* ---- the GEMM: more x rows than the gemv takes (prefill) ----------------------------
 * The same quantized x (blocks of 64 k, nearest even), stored once per call in strips of
 * GMR rows (gemm_prep_x), and the weights packed per K block into panels of NR = 32 columns whose
 * 128-byte rows hold, for 4 consecutive k, each column's 4 weight bytes biased to
 * unsigned (int8 w + 128, int4 n + 8): one row is two VPDPBUSD operands of 16 columns,
 * against the 4 xq of an x row broadcast to every lane. Every lane of a unit of U k
 * (U = 64; 32 for int4 groups of 32, so that a unit has one group scale) starts from
 * -bias times the sum of the row's xq over the unit, which leaves it the exact integer
 * dot product of the unit; then one conversion and one FMA by d (int4: d times the
 * column's group scale) per unit, the row scale (int8) as the tile is stored. */
enum { NR = 32, GMR = 6 };

/* The GEMM's x, once per call, in strips of GMR rows (a tile's rows: tasks split M in
 * multiples of GMR): xq [nb * 16][GMR][4] (4 k of each row in turn, so a tile's
 * broadcasts are fixed offsets from one pointer), d [nb][GMR], cw [nu][GMR] (-bias times
 * the sum of each unit's xq: a lane's starting value); rows past M are zero. */
static int64_t pad64(int64_t bytes) { return (bytes + 63) / 64 * 64; }
static size_t strip_bytes(int64_t K, int U) {
    int64_t nb = nblocks(K), nu = nb * (QB / U);
    return (size_t)(nb * QB * GMR + pad64(nb * GMR * 4) + pad64(nu * GMR * 4));
}

static size_t gemm_x_bytes(int64_t M, int64_t K, int unit) {
    return (size_t)((M + GMR - 1) / GMR) * strip_bytes(K, unit);
}

/* The starting values of block b's units for one x row (q4: the block's 64 xq): -bias
 * times the sum of each unit's xq, into cw [unit * rows] (rows: the strip's row count). */
INLINE void unit_starts(__m512i q4, int unit, int bias, int64_t b, int rows, int32_t *cw) {
    __m512i s4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), q4); /* lane t: k 4t .. 4t + 3 */
    int32_t lo = _mm512_mask_reduce_add_epi32((__mmask16)0x00FF, s4); /* k 0 .. 31 */
    int32_t hi = _mm512_mask_reduce_add_epi32((__mmask16)0xFF00, s4); /* k 32 .. 63 */
    if (unit == 32) cw[2 * b * rows] = -bias * lo, cw[(2 * b + 1) * rows] = -bias * hi;
    else cw[b * rows] = -bias * (lo + hi);
}

/* Strips [s0, s1) of the GEMM's x (rows past M zero; the padding after d and cw is never
 * read and left as it is). */
TARGET static void gemm_prep_x(const float *x, int64_t ldx, int64_t M, int64_t K, int unit, int bias, void *dst,
                               int64_t s0, int64_t s1) {
    const int64_t nb = nblocks(K);
    const size_t sb = strip_bytes(K, unit);
    if (s1 * GMR > M) /* the last strip: its rows past M read as zero (every other byte read is written below) */
        memset((uint8_t *)dst + (size_t)(s1 - 1) * sb, 0, sb);
    for (int64_t m = s0 * GMR; m < LM_MIN(M, s1 * GMR); m++) {
        uint8_t *base = (uint8_t *)dst + (size_t)(m / GMR) * sb;
        const int r = (int)(m % GMR);
        float *d = (float *)(base + nb * QB * GMR);
        int32_t *cw = (int32_t *)(base + nb * QB * GMR + pad64(nb * GMR * 4));
        int32_t *xs = (int32_t *)base + r;
        for (int64_t b = 0; b < nb; b++) {
            int8_t xq[QB] __attribute__((aligned(64)));
            d[b * GMR + r] = quant_block(x + m * ldx + b * QB, LM_MIN(QB, K - b * QB), xq);
            __m512i q4 = _mm512_load_si512((const void *)xq); /* lane t: the 4 xq of k 4t .. 4t + 3 */
            _mm512_i32scatter_epi32(xs + b * QB / 4 * GMR, _mm512_mullo_epi32(_mm512_set1_epi32(GMR),
                                    _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)), q4, 4);
            unit_starts(q4, unit, bias, b, GMR, cw + r);
        }
    }
}

/* Columns 16 g .. 16 g + 15 of a panel from 16 rows of 64 weight bytes each (r[i]: row i's
 * 16 dwords of 4 k), transposed so that panel row t gets dword t of every row. */
INLINE void store_chunk(__m512 r[16], int g, int64_t k4, uint8_t *dst) {
    lm__transpose16_avx512(r);
    for (int t = 0; t < 16; t++) _mm512_store_si512((void *)(dst + (k4 + t) * 128 + 64 * g), _mm512_castps_si512(r[t]));
}

/* int8 panel: kl k of ncols (<= NR) rows of q (at column 0, k 0 of the block), as w + 128;
 * round_up(kl, 64) / 4 panel rows (what lies past kl or ncols meets zero x or is never stored). */
TARGET static void pack_i8dot(const int8_t *q, int64_t ldq, int ncols, int64_t kl, uint8_t *dst) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int g = 0; g < 2; g++)
        for (int64_t k = 0; k < kl; k += QB) {
            int64_t n = kl - k;
            __mmask64 mk = n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1);
            __m512 r[16];
            for (int i = 0; i < 16; i++) {
                int j = 16 * g + i;
                __m512i v = j < ncols ? _mm512_maskz_loadu_epi8(mk, q + j * ldq + k) : _mm512_setzero_si512();
                r[i] = _mm512_castsi512_ps(_mm512_xor_si512(v, bias));
            }
            store_chunk(r, g, k / 4, dst);
        }
}

/* int4 panel: K block [k0, k0 + kl) (multiples of 32) of ncols rows, each byte n + 8 in k
 * order; gs [nu][NR]: each unit's group scale per column (0 past ncols). */
TARGET static void pack_i4dot(const lm__i4_weights *W, int ncols, int64_t k0, int64_t kl, int unit, uint8_t *dst,
                              float *gs) {
    const __m512i lo4 = _mm512_set1_epi16(0x000F), hi4 = _mm512_set1_epi16(0x0F00), eight = _mm512_set1_epi8(8);
    for (int g = 0; g < 2; g++)
        for (int64_t k = 0; k < kl; k += QB) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) {
                int j = 16 * g + i;
                __m256i v = _mm256_setzero_si256();
                if (j < ncols) {
                    const uint8_t *src = W->q + j * W->ldq + (k0 + k) / 2;
                    v = kl - k >= QB ? _mm256_loadu_si256((const __m256i *)src)
                                     : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)src)); /* 32 k */
                }
                /* byte i -> word i = low nibble (k = 2i) | high nibble << 8 (k = 2i + 1) */
                __m512i w = _mm512_cvtepu8_epi16(v);
                w = _mm512_or_si512(_mm512_and_si512(w, lo4), _mm512_and_si512(_mm512_slli_epi16(w, 4), hi4));
                r[i] = _mm512_castsi512_ps(_mm512_xor_si512(w, eight));
            }
            store_chunk(r, g, k / 4, dst);
        }
    lm__i4_unit_scales(W, ncols, NR, k0, kl, unit, gs);
}

/* One tile: MRX x rows (a strip from m0) against one panel over the K block's units. */
INLINE void micro_tile(const lm__i8dot_tile *t, const int MRX, const int U) {
    const int64_t nb = nblocks(t->K);
    const uint8_t *st = (const uint8_t *)t->xprep + (size_t)(t->m0 / GMR) * strip_bytes(t->K, U);
    const float *d = (const float *)(st + nb * QB * GMR);
    const int32_t *cw = (const int32_t *)(st + nb * QB * GMR + pad64(nb * GMR * 4));
    const int64_t u0 = t->k0 / U;
    __m512 acc[GMR][2];
#pragma GCC unroll 6
    for (int m = 0; m < MRX; m++) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
    for (int64_t u = 0; u < t->nu; u++) {
        __m512i s[GMR][2];
#pragma GCC unroll 6
        for (int m = 0; m < MRX; m++) s[m][0] = s[m][1] = _mm512_set1_epi32(cw[(u0 + u) * GMR + m]);
        const uint8_t *pu = t->bp + (size_t)u * (U / 4) * 128, *xu = st + (t->k0 + u * U) * GMR;
#pragma GCC unroll 16
        for (int i = 0; i < U / 4; i++) {
            __m512i w0 = _mm512_load_si512((const void *)(pu + i * 128));
            __m512i w1 = _mm512_load_si512((const void *)(pu + i * 128 + 64));
#pragma GCC unroll 6
            for (int m = 0; m < MRX; m++) {
                int32_t xv;
                memcpy(&xv, xu + (i * GMR + m) * 4, 4);
                __m512i xb = _mm512_set1_epi32(xv);
                s[m][0] = _mm512_dpbusd_epi32(s[m][0], w0, xb);
                s[m][1] = _mm512_dpbusd_epi32(s[m][1], w1, xb);
            }
        }
        const int64_t b = (t->k0 + u * U) / QB;
        __m512 g0 = _mm512_set1_ps(1.0f), g1 = g0;
        if (t->gs) g0 = _mm512_loadu_ps(t->gs + u * NR), g1 = _mm512_loadu_ps(t->gs + u * NR + 16);
#pragma GCC unroll 6
        for (int m = 0; m < MRX; m++) {
            __m512 dm = _mm512_set1_ps(d[b * GMR + m]);
            acc[m][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[m][0]), t->gs ? _mm512_mul_ps(g0, dm) : dm, acc[m][0]);
            acc[m][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[m][1]), t->gs ? _mm512_mul_ps(g1, dm) : dm, acc[m][1]);
        }
    }
    for (int v = 0; v < 2; v++) {
        int64_t left = t->ncols - 16 * v;
        if (left <= 0) break;
        __mmask16 mk = mask16(left);
        __m512 cs = t->cs ? _mm512_maskz_loadu_ps(mk, t->cs + 16 * v) : _mm512_set1_ps(1.0f);
#pragma GCC unroll 6
        for (int m = 0; m < MRX; m++) {
            float *cp = t->c + m * t->ldc + 16 * v;
            __m512 y = t->cs ? _mm512_mul_ps(acc[m][v], cs) : acc[m][v];
            if (t->accumulate) y = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, cp), y);
            _mm512_mask_storeu_ps(cp, mk, y);
        }
    }
}

TARGET static void micro_i8dot(const lm__i8dot_tile *t) {
#define TILE(U)                                                                                                    \
    switch (t->mrows) {                                                                                            \
    case 1: micro_tile(t, 1, U); break;                                                                            \
    case 2: micro_tile(t, 2, U); break;                                                                            \
    case 3: micro_tile(t, 3, U); break;                                                                            \
    case 4: micro_tile(t, 4, U); break;                                                                            \
    case 5: micro_tile(t, 5, U); break;                                                                            \
    default: micro_tile(t, 6, U); break;                                                                           \
    }
    if (t->unit == 32) {
        TILE(32)
    } else {
        TILE(64)
    }
#undef TILE
}

const lm__i8dot_kernels lm__i8dot_kernels_avx512 = {
    .x_bytes = x_bytes_i8dot, .prep_x = prep_x_i8dot, .gemv = gemv_i8dot,
    .prep_x_i4 = prep_x_i4dot, .gemv_i4 = gemv_i4dot,
    /* kc 1024 x nc 256: 256 KiB of panels, in L2 with room to spare; a tile's x rows
     * (6 x 1 KiB) stay in L1 */
    .gemm_mr = GMR, .gemm_nr = NR, .gemm_kc = 1024, .gemm_nc = 256,
    .gemm_x_bytes = gemm_x_bytes, .gemm_prep_x = gemm_prep_x, .pack_i8 = pack_i8dot, .pack_i4 = pack_i4dot,
    .micro = micro_i8dot,
};

/* ---- the GEMM on AMX tiles (lm__i8dot_kernels_amx) ------------------------------------
 * CPUs with AMX-INT8 whose OS granted the tile state (lm__cpu_amx_int8_active). The same
 * quantized x, the same panels (pack_i8dot / pack_i4dot: w + 128, n + 8) and the same
 * float steps per unit as the VPDPBUSD GEMM above: only the exact int32 unit sums come
 * from the tile unit, so the results are bit-identical to that GEMM's. x is kept per strip
 * of AMR = 32 rows in plain k order: an A tile is 16 rows x one unit of k, the rows kp
 * bytes apart. A panel's 128-byte rows are B tiles as they stand: columns 0-15 are the
 * first 64 bytes of the unit's U / 4 rows, 128 bytes apart, columns 16-31 the next 64.
 * Per unit and 16 x 16 block of the tile: TDPBSUD (signed x by unsigned biased weights)
 * into a zeroed C tile, stored to a 1 KB buffer; then per row the 16 sums plus the unit's
 * starting value (-bias times its xq sum), converted and multiplied by d (int4: times the
 * group scales) into one of 16 f32 accumulators. Units alternate between two sets of tiles
 * (C 0 / 1, A 2 / 3, B 4 / 5), so a unit's products need not wait for the previous unit's
 * sums to be read back. Every tile is 16 x 64 bytes: units of 64 k only
 * (gemm_unit64_only). A unit of 32 k (int4 groups of 32) would pay the same row work for
 * half the products; on an AMX Xeon it measured slower than the VPDPBUSD GEMM (0.63-1.10x,
 * where 64-k units ran 1.18-1.38x), so those GEMMs take the avx512 set (bench/NOTES.md).
 * lm__i8dot_kernels_amx_sim runs the same code with each tile instruction carried out in
 * C over a per-thread tile file, as the ISA reference defines it for palette 1 (a shape
 * the hardware would fault on aborts), so the layout and blocking are tested on CPUs
 * without AMX too; only the instruction encodings are left to the AMX machine. */
#define TARGET_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INLINE_AMX static inline __attribute__((always_inline)) TARGET_AMX

enum { AMR = 32 };

static const lm__amx_config amx_cfg_u64 __attribute__((aligned(64))) = {
    .palette = 1, .colsb = {64, 64, 64, 64, 64, 64}, .rows = {16, 16, 16, 16, 16, 16}};

/* x strip of AMR rows: xq [AMR][kp] int8 (kp = nb * QB; zero past K and in rows past M),
 * d [nb][AMR], cw [nu][AMR] (the units' starting values). */
static size_t amx_strip_bytes(int64_t K, int U) {
    int64_t nb = nblocks(K), nu = nb * (QB / U);
    return (size_t)(nb * QB * AMR + pad64(nb * AMR * 4) + pad64(nu * AMR * 4));
}

static size_t amx_x_bytes(int64_t M, int64_t K, int unit) {
    return (size_t)((M + AMR - 1) / AMR) * amx_strip_bytes(K, unit);
}

TARGET static void amx_prep_x(const float *x, int64_t ldx, int64_t M, int64_t K, int unit, int bias, void *dst,
                              int64_t s0, int64_t s1) {
    const int64_t nb = nblocks(K), kp = nb * QB;
    const size_t sb = amx_strip_bytes(K, unit);
    if (s1 * AMR > M) /* the last strip: its rows past M read as zero */
        memset((uint8_t *)dst + (size_t)(s1 - 1) * sb, 0, sb);
    for (int64_t m = s0 * AMR; m < LM_MIN(M, s1 * AMR); m++) {
        uint8_t *base = (uint8_t *)dst + (size_t)(m / AMR) * sb;
        const int r = (int)(m % AMR);
        int8_t *xq = (int8_t *)base + r * kp;
        float *d = (float *)(base + kp * AMR);
        int32_t *cw = (int32_t *)(base + kp * AMR + pad64(nb * AMR * 4));
        for (int64_t b = 0; b < nb; b++) {
            d[b * AMR + r] = quant_block(x + m * ldx + b * QB, LM_MIN(QB, K - b * QB), xq + b * QB);
            unit_starts(_mm512_load_si512((const void *)(xq + b * QB)), unit, bias, b, AMR, cw + r);
        }
    }
}

/* -- the tile file in C (the _sim set) -- */
static _Thread_local struct {
    const lm__amx_config *cfg;
    uint8_t t[8][16][64];
} g_sim;

static void sim_fail(const char *what, int t) {
    fprintf(stderr, "loom: AMX tile simulation: %s (tile %d); the hardware would fault\n", what, t);
    abort();
}

static void sim_config(const lm__amx_config *c) {
    if (g_sim.cfg == c) return;
    if (c->palette != 1) sim_fail("palette is not 1", -1);
    for (int t = 0; t < 8; t++)
        if (c->rows[t] > 16 || c->colsb[t] > 64) sim_fail("shape past 16 rows x 64 bytes", t);
    memset(g_sim.t, 0, sizeof g_sim.t); /* LDTILECFG zeroes the tiles */
    g_sim.cfg = c;
}

static void sim_check(int t) {
    if (!g_sim.cfg || !g_sim.cfg->rows[t] || !g_sim.cfg->colsb[t]) sim_fail("tile not configured", t);
}

static void sim_load(int t, const void *base, long stride) {
    sim_check(t);
    memset(g_sim.t[t], 0, sizeof g_sim.t[t]);
    for (int r = 0; r < g_sim.cfg->rows[t]; r++)
        memcpy(g_sim.t[t][r], (const uint8_t *)base + r * stride, g_sim.cfg->colsb[t]);
}

static void sim_store(int t, void *base, long stride) {
    sim_check(t);
    for (int r = 0; r < g_sim.cfg->rows[t]; r++)
        memcpy((uint8_t *)base + r * stride, g_sim.t[t][r], g_sim.cfg->colsb[t]);
}

static void sim_zero(int t) {
    sim_check(t);
    memset(g_sim.t[t], 0, sizeof g_sim.t[t]);
}

/* TDPBSUD c, a, b: c.dword[m][n] += sum over k < colsb(a) / 4 and i < 4 of
 * signed a.byte[m][4k + i] times unsigned b.byte[k][4n + i]. */
static void sim_dpbsud(int c, int a, int b) {
    sim_check(c), sim_check(a), sim_check(b);
    const lm__amx_config *g = g_sim.cfg;
    if (g->colsb[a] % 4 || g->colsb[a] / 4 != g->rows[b] || g->rows[c] != g->rows[a] || g->colsb[c] != g->colsb[b] ||
        g->colsb[c] % 4)
        sim_fail("TDPBSUD operand shapes disagree", c);
    for (int m = 0; m < g->rows[c]; m++)
        for (int n = 0; n < g->colsb[c] / 4; n++) {
            int32_t acc;
            memcpy(&acc, &g_sim.t[c][m][4 * n], 4);
            for (int k = 0; k < g->colsb[a] / 4; k++)
                for (int i = 0; i < 4; i++)
                    acc += (int32_t)(int8_t)g_sim.t[a][m][4 * k + i] * (int32_t)g_sim.t[b][k][4 * n + i];
            memcpy(&g_sim.t[c][m][4 * n], &acc, 4);
        }
}

/* The tile instructions, on the unit or in C (sim, a constant in each copy). Tile numbers
 * are literals: the instructions encode them. */
#define T_LOAD(t, p, s)                                                                                            \
    do {                                                                                                           \
        if (sim) sim_load(t, p, s);                                                                                \
        else _tile_loadd(t, p, s);                                                                                 \
    } while (0)
#define T_STORE(t, p, s)                                                                                           \
    do {                                                                                                           \
        if (sim) sim_store(t, p, s);                                                                               \
        else _tile_stored(t, p, s);                                                                                \
    } while (0)
#define T_ZERO(t)                                                                                                  \
    do {                                                                                                           \
        if (sim) sim_zero(t);                                                                                      \
        else _tile_zero(t);                                                                                        \
    } while (0)
#define T_DP(c, a, b)                                                                                              \
    do {                                                                                                           \
        if (sim) sim_dpbsud(c, a, b);                                                                              \
        else _tile_dpbsud(c, a, b);                                                                                \
    } while (0)
/* Unit u of the block into buf: A (x rows a, kp apart) and B (panel columns b, 128 apart)
 * of one tile set, products into its zeroed C, C stored (16 rows of 16 int32). */
#define AMX_UNIT(C, A, B, u, buf)                                                                                  \
    do {                                                                                                           \
        T_LOAD(A, a + (u) * U, (long)kp);                                                                          \
        T_LOAD(B, b + (u) * (U / 4) * 128, 128L);                                                                  \
        T_ZERO(C);                                                                                                 \
        T_DP(C, A, B);                                                                                             \
        T_STORE(C, buf, 64L);                                                                                      \
    } while (0)

INLINE_AMX void amx_configure(const lm__amx_config *cfg, const int sim) {
    if (sim) {
        sim_config(cfg);
    } else if (lm__amx_config_loaded != cfg) {
        _tile_loadconfig(cfg);
        lm__amx_config_loaded = cfg;
    }
}

/* acc[r] += (buf row r + cw[r]) * d[r] (times gs[0 .. 15] when gs). */
INLINE_AMX void amx_unit_sums(const int32_t *buf, const int32_t *cw, const float *d, const float *gs, __m512 acc[16]) {
    const __m512 g = gs ? _mm512_loadu_ps(gs) : _mm512_set1_ps(1.0f);
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) {
        __m512i s = _mm512_add_epi32(_mm512_load_si512((const void *)(buf + 16 * r)), _mm512_set1_epi32(cw[r]));
        __m512 dm = _mm512_set1_ps(d[r]);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), gs ? _mm512_mul_ps(g, dm) : dm, acc[r]);
    }
}

INLINE_AMX void micro_amx_t(const lm__i8dot_tile *t, const int sim) {
    enum { U = 64 };
    LM_ASSERT(t->unit == U); /* gemm_unit64_only: matmul.c routes 32-k units elsewhere */
    amx_configure(&amx_cfg_u64, sim);
    const int64_t nb = nblocks(t->K), kp = nb * QB, u0 = t->k0 / U;
    const uint8_t *st = (const uint8_t *)t->xprep + (size_t)(t->m0 / AMR) * amx_strip_bytes(t->K, U);
    const float *d = (const float *)(st + kp * AMR);
    const int32_t *cw = (const int32_t *)(st + kp * AMR + pad64(nb * AMR * 4));
    int32_t buf[2][256] __attribute__((aligned(64)));
    for (int rh = 0; rh < 2 && 16 * rh < t->mrows; rh++)
        for (int ch = 0; ch < 2 && 16 * ch < t->ncols; ch++) {
            const int8_t *a = (const int8_t *)st + 16 * rh * kp + t->k0;
            const uint8_t *b = t->bp + 64 * ch;
            __m512 acc[16];
            for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
            for (int64_t u = 0; u < t->nu; u += 2) {
                AMX_UNIT(0, 2, 4, u, buf[0]);
                if (u + 1 < t->nu) AMX_UNIT(1, 3, 5, u + 1, buf[1]);
                for (int h = 0; h < 2 && u + h < t->nu; h++) {
                    const int64_t uh = u + h, blk = (t->k0 + uh * U) / QB;
                    amx_unit_sums(buf[h], cw + (u0 + uh) * AMR + 16 * rh, d + blk * AMR + 16 * rh,
                                  t->gs ? t->gs + uh * NR + 16 * ch : NULL, acc);
                }
            }
            const __mmask16 mk = mask16(t->ncols - 16 * ch);
            const __m512 cs = t->cs ? _mm512_maskz_loadu_ps(mk, t->cs + 16 * ch) : _mm512_set1_ps(1.0f);
            for (int r = 0; r < 16 && 16 * rh + r < t->mrows; r++) {
                float *cp = t->c + (16 * rh + r) * t->ldc + 16 * ch;
                __m512 y = t->cs ? _mm512_mul_ps(acc[r], cs) : acc[r];
                if (t->accumulate) y = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, cp), y);
                _mm512_mask_storeu_ps(cp, mk, y);
            }
        }
}
#undef AMX_UNIT
#undef T_LOAD
#undef T_STORE
#undef T_ZERO
#undef T_DP

TARGET_AMX static void micro_amx(const lm__i8dot_tile *t) { micro_amx_t(t, 0); }

/* Carries the AMX target only to inline micro_amx_t: with sim constant 1 no tile
 * instruction is executed, so it runs on any AVX512_VNNI CPU. */
TARGET_AMX static void micro_amx_sim(const lm__i8dot_tile *t) { micro_amx_t(t, 1); }

/* kc 1024 x nc 256 as the VPDPBUSD GEMM (256 KiB of panels in L2); x strips of 32 rows
 * (32 KiB a K block). */
#define AMX_SET(MICRO)                                                                                             \
    {                                                                                                              \
        .x_bytes = x_bytes_i8dot, .prep_x = prep_x_i8dot, .gemv = gemv_i8dot, .prep_x_i4 = prep_x_i4dot,           \
        .gemv_i4 = gemv_i4dot, .gemm_mr = AMR, .gemm_nr = NR, .gemm_kc = 1024, .gemm_nc = 256,                     \
        .gemm_x_bytes = amx_x_bytes, .gemm_prep_x = amx_prep_x, .pack_i8 = pack_i8dot, .pack_i4 = pack_i4dot,      \
        .micro = MICRO, .gemm_unit64_only = 1,                                                                     \
    }
const lm__i8dot_kernels lm__i8dot_kernels_amx = AMX_SET(micro_amx);
const lm__i8dot_kernels lm__i8dot_kernels_amx_sim = AMX_SET(micro_amx_sim);
#undef AMX_SET

#endif
