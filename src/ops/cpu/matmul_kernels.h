/* ops/cpu/matmul_kernels.h — the per-instruction-set kernels behind lm__cpu_linear.
 *
 * y[m, n] = sum_k x[m, k] * W[n, k] with x, y f32 and W f32/bf16/f16 rows of K
 * contiguous elements (Hugging Face Linear layout), or int8 rows q[n, :] with one f32
 * scale per row (W[n, k] = q[n, k] * scale[n]). Two shapes of work:
 *  - gemv: a few x rows against W rows streamed one at a time straight from memory
 *    (decode, M small: W is read once and never copied);
 *  - GEMM: W blocks are widened to f32 and packed as panels of nr columns,
 *    dst[k * nr + j] = W[n0 + j, k0 + k], then a register-blocked microkernel
 *    computes mr x nr tiles of y, broadcasting x values against panel rows.
 * Every kernel accumulates in f32; x is never rounded (except by the opt-in fast
 * precision: lm__bf16dot_kernels round it to bf16, lm__i8dot_kernels quantize it to
 * int8 blocks; both below). Sizes are in elements. int8
 * weights: the gemv sums x * q exactly widened and applies the row scale once per
 * output (then bias and accumulate); the GEMM packs q * scale (one f32 rounding per
 * weight) and reuses the f32 microkernel. int4 weights (two per byte, one f32 scale
 * per group of 32/64/128 k): gemv and pack both dequantize q * scale (one f32 rounding
 * per weight); the gemv adds the bias and accumulate as it stores.
 */
#ifndef LOOM_OPS_CPU_MATMUL_KERNELS_H
#define LOOM_OPS_CPU_MATMUL_KERNELS_H

#include "ops/cpu/isa.h"
#include "loom/tensor.h"

#include <string.h>

/* Per-row epilogue of the int8 gemv, pointers at W row 0 of the call:
 * y = (accumulate ? y : 0) + (sum * scales[r] + (bias ? bias[r] : 0)). */
typedef struct lm__i8_epilogue {
    const float *scales; /* [nrows] */
    const float *bias;   /* [nrows] or NULL */
    int accumulate;
} lm__i8_epilogue;

/* The int4 weights of a call, pointers at W row 0 of the call: q u8 rows of K/2 bytes
 * (ldq apart; element k is nibble k & 1 of byte k / 2, low first, two's complement),
 * W[r, k] = q[r, k] * scales[r * lds + k / group]; y = (accumulate ? y : 0) +
 * (sum + (bias ? bias[r] : 0)). K is a multiple of group (32, 64 or 128), so every
 * 16-aligned run of 16 k lies in one group and needs no tail handling. */
typedef struct lm__i4_weights {
    const uint8_t *q;
    int64_t ldq;
    const float *scales; /* [nrows, K / group], rows lds apart */
    int64_t lds;
    int group;
    const float *bias; /* [nrows] or NULL */
    int accumulate;
    /* bf16 scales in place of scales (NULL then), same layout: the gemvs read them with the
     * dtype a constant in each copy (lm__i4_srow, lm__i4_sc), the packs through lm__i4_scale */
    const uint16_t *scales16;
} lm__i4_weights;

typedef struct lm__linear_kernels {
    int mr, nr;      /* microkernel tile: mr rows of x/y by nr columns of y (nr = panel width) */
    int64_t kc;      /* largest K block per packed panel, a multiple of 16 */
    int64_t nc;      /* largest N block one task packs; kc * nc * 4 bytes fits in half an L2 */
    /* M up to these (f32 / bf16 and f16 weights) uses gemv, larger M the packed GEMM:
     * the measured crossover where packing W costs less than re-reading it per 4 x rows. */
    int gemv_max_m_f32, gemv_max_m_16;
    /* y[m * ldy + r] = dot(x[m * ldx + 0 .. K), W row r) for m < M, r < nrows; w points
     * at W row 0 (dtype wdt, rows ldw elements apart). Each W row is read once. */
    void (*gemv)(const float *x, int64_t ldx, int64_t M, const void *w, lm_dtype wdt, int64_t ldw, int64_t nrows,
                 int64_t K, float *y, int64_t ldy);
    /* Packs one panel: dst[k * nr + j] = f32(W row j, element k) for k < kc and
     * j < ncols (<= nr), 0 for ncols <= j < nr. w points at (row 0, element 0). */
    void (*pack)(const void *w, lm_dtype wdt, int64_t ldw, int ncols, int64_t kc, float *dst);
    /* c[r * ldc + j] = (accumulate ? c[r * ldc + j] : 0) + sum_{k < kc} a[r * lda + k] * bp[k * nr + j]
     * for r < mrows (<= mr) and j < ncols (<= nr); nothing else in c is touched. */
    void (*micro)(int64_t kc, const float *a, int64_t lda, int mrows, const float *bp, float *c, int64_t ldc,
                  int ncols, int accumulate);
    /* int8 gemv: y[m * ldy + r] = epilogue(dot(x row m, q row r)) for m < M, r < nrows
     * (gemv_max_m_16 is its M limit too); q points at row 0, rows ldq bytes apart. */
    void (*gemv_i8)(const float *x, int64_t ldx, int64_t M, const int8_t *q, int64_t ldq, const lm__i8_epilogue *ep,
                    int64_t nrows, int64_t K, float *y, int64_t ldy);
    /* int8 pack: dst[k * nr + j] = f32(q row j, element k) * scales[j], 0 past ncols. */
    void (*pack_i8)(const int8_t *q, int64_t ldq, const float *scales, int ncols, int64_t kc, float *dst);
    /* int4 gemv: y[m * ldy + r] = W's epilogue(sum_k x[m, k] * W[r, k]) for m < M (<=
     * gemv_max_m_16), r < nrows; the weights are dequantized (q * scale, one f32
     * rounding each) and summed as f32 in a fixed order. With i4_split = L > 0 the
     * kernel reads x split by the driver (split_x in matmul.c): each block of 2L k as its L
     * even-k values, then its L odd-k values, the order in which the low and high
     * nibbles of L bytes unpack into two vectors. */
    void (*gemv_i4)(const float *x, int64_t ldx, int64_t M, const lm__i4_weights *W, int64_t nrows, int64_t K,
                    float *y, int64_t ldy);
    /* int4 pack: dst[k * nr + j] = W[j, k0 + k] for k < kc (k0, kc multiples of 16), 0 past ncols. */
    void (*pack_i4)(const lm__i4_weights *W, int ncols, int64_t k0, int64_t kc, float *dst);
    int i4_split; /* the gemv_i4 x layout (see gemv_i4): vector lanes L, or 0 for x as it is */
} lm__linear_kernels;

/* The fast-precision GEMM for bf16 weights (docs/QUANTIZATION.md, "Fast precision"):
 * the same blocking as the f32 GEMM above, but panels hold bf16 pairs and x is
 * rounded to bf16 (round to nearest even) once per mr-row strip of a K block, then
 * VDPBF16PS adds two bf16 products per f32 lane: acc += x[2p] * W[2p] + x[2p+1] * W[2p+1]
 * (each product exact in f32, accumulation f32). Sizes in elements; pairs p = ceil(kc / 2). */
typedef struct lm__bf16dot_kernels {
    int mr, nr;  /* tile, as lm__linear_kernels */
    int64_t kc;  /* largest K block, a multiple of 16 (a block may end on an odd k: its last pair is padded) */
    int64_t nc;  /* largest N block: kc * nc * 2 bytes of packed panels */
    /* dst[p * nr + j] = W[j, 2p] | W[j, 2p + 1] << 16 (bf16 bits) for p < ceil(kc / 2), j < ncols;
     * 0 for ncols <= j < nr and for the odd k = kc of the last pair. w: bf16 row 0, element 0. */
    void (*pack)(const uint16_t *w, int64_t ldw, int ncols, int64_t kc, uint32_t *dst);
    /* dst[r * ldd + p] = bf16(x[r, 2p]) | bf16(x[r, 2p + 1]) << 16 for r < rows, p < ceil(kc / 2)
     * (k >= kc reads as 0), rounded to nearest even; ldd is a multiple of 16 >= ceil(kc / 2). */
    void (*round_x)(const float *x, int64_t ldx, int rows, int64_t kc, uint32_t *dst, int64_t ldd);
    /* c[r * ldc + j] = (accumulate ? c[r * ldc + j] : 0) + sum_{p < kp} dot2(a[r * lda + p], bp[p * nr + j])
     * for r < mrows (<= mr), j < ncols (<= nr); nothing else in c is touched. */
    void (*micro)(int64_t kp, const uint32_t *a, int64_t lda, int mrows, const uint32_t *bp, float *c, int64_t ldc,
                  int ncols, int accumulate);
    /* y[m * ldy + r] = sum_{p < ceil(K / 2)} dot2(xp[m * ldxp + p], W row r's pair p) for m < M, r < nrows:
     * the decode product of rounded x (round_x over all K, ldxp >= ceil(K / 2)) with bf16 rows w, ldw apart;
     * an odd K's last pair reads its second weight as 0. */
    void (*gemv)(const uint32_t *xp, int64_t ldxp, int64_t M, const uint16_t *w, int64_t ldw, int64_t nrows, int64_t K,
                 float *y, int64_t ldy);
} lm__bf16dot_kernels;

/* The fast-precision int8 gemv (matmul_i8dot_avx512.c, AVX512_VNNI; matmul_i8dot_avx2.c,
 * AVX-VNNI or AVX2, with w's sign taken into x instead of a bias): x quantized to int8
 * per block of 64 k (scale max |x| / 127, nearest even) once per call into prep_x's
 * buffer of x_bytes(M, K) bytes (64-byte aligned), then exact int8 products summed per
 * block in int32 and per row in f32. gemv: y[m * ldy + r] = epilogue(sum_b d[m][b] *
 * (xq[m] . q row r)[b]) for m < M, r < nrows, with the int8 gemv's epilogue. */
struct lm__i8dot_tile;
typedef struct lm__i8dot_kernels {
    size_t (*x_bytes)(int64_t M, int64_t K);
    void (*prep_x)(const float *x, int64_t ldx, int64_t M, int64_t K, void *dst);
    void (*gemv)(const void *xprep, int64_t M, int64_t K, const int8_t *q, int64_t ldq, const lm__i8_epilogue *ep,
                 int64_t nrows, float *y, int64_t ldy);
    /* int4 weights: x quantized the same way but stored per block as its even k then its
     * odd k (the order a block's bytes unpack to); gemv_i4: y = (accumulate ? y : 0) +
     * sum_b d[m][b] * sum over the block's groups of scale * (xq . q) + bias. */
    void (*prep_x_i4)(const float *x, int64_t ldx, int64_t M, int64_t K, void *dst);
    void (*gemv_i4)(const void *xprep, int64_t M, int64_t K, const lm__i4_weights *W, int64_t nrows, float *y,
                    int64_t ldy);
    /* The GEMM (more x rows than the gemv takes): x quantized the same way once per call
     * (gemm_prep_x: k order, plus each unit's starting value; unit = 64 k, or 32 for int4
     * groups of 32, so that a unit has one group scale), the weights packed per K block
     * (kc, a multiple of 64) into panels of gemm_nr columns, each panel row 4 k of every
     * column as unsigned bytes (int8 w + 128 by pack_i8; int4 n + 8 by pack_i4, which also
     * writes each unit's group scales, gs [units][gemm_nr]); round_up(kl, 64) / 4 rows. */
    int gemm_mr, gemm_nr;
    int64_t gemm_kc, gemm_nc;
    size_t (*gemm_x_bytes)(int64_t M, int64_t K, int unit);
    /* gemm_prep_x writes strips [s0, s1) of gemm_mr rows (tasks may split them). */
    void (*gemm_prep_x)(const float *x, int64_t ldx, int64_t M, int64_t K, int unit, int bias, void *dst, int64_t s0,
                        int64_t s1);
    void (*pack_i8)(const int8_t *q, int64_t ldq, int ncols, int64_t kl, uint8_t *dst);
    void (*pack_i4)(const lm__i4_weights *W, int ncols, int64_t k0, int64_t kl, int unit, uint8_t *dst, float *gs);
    /* c[r * ldc + j] = (accumulate ? c : 0) + cs[j] * sum over the tile's units of d * (xq . w)
     * (int4: d * gs * (xq . w); cs NULL: 1) for r < mrows, j < ncols. */
    void (*micro)(const struct lm__i8dot_tile *t);
    /* The GEMM takes units of 64 k only; a GEMM of int4 groups of 32 then runs on the
     * avx512 set (the AMX sets: a 32-k unit pays the same per-unit row work for half the
     * tile products, and measured slower than VPDPBUSD; bench/NOTES.md). */
    int gemm_unit64_only;
} lm__i8dot_kernels;

/* One tile of the fast int8 / int4 GEMM: rows m0 .. m0 + mrows of the prepared x (of K
 * inputs, units of unit k) against one packed panel over the K block's nu units from k0. */
typedef struct lm__i8dot_tile {
    const void *xprep;
    int64_t K;
    int unit;
    int64_t m0, k0, nu;
    int mrows, ncols;
    const uint8_t *bp;
    const float *gs; /* int4: the panel's group scales [nu][gemm_nr]; int8: NULL */
    const float *cs; /* int8: the panel's row scales [ncols]; int4: NULL */
    float *c;
    int64_t ldc;
    int accumulate;
} lm__i8dot_tile;

extern const lm__linear_kernels lm__linear_kernels_scalar;
#ifdef LM__HAVE_X86_KERNELS
extern const lm__linear_kernels lm__linear_kernels_avx2;
extern const lm__linear_kernels lm__linear_kernels_avx512;
extern const lm__bf16dot_kernels lm__bf16dot_kernels_avx512;
extern const lm__bf16dot_kernels lm__bf16dot_kernels_amx; /* AMX-BF16 microkernel, the rest as avx512 */
extern const lm__i8dot_kernels lm__i8dot_kernels_avx512;
extern const lm__i8dot_kernels lm__i8dot_kernels_avxvnni; /* AVX2 path, VEX VPDPBUSD */
extern const lm__i8dot_kernels lm__i8dot_kernels_avx2;    /* AVX2 path, VPMADDUBSW */
extern const lm__i8dot_kernels lm__i8dot_kernels_amx;     /* AMX-INT8 GEMM products, the rest as avx512 */
/* The AMX set with each tile instruction carried out in C (the ISA's semantics and shape
 * rules, over a per-thread tile file): runs on any AVX512_VNNI CPU, so the tests check the
 * AMX kernel's layout, tile shapes and blocking where no AMX unit is (matmul_i8dot_avx512.c). */
extern const lm__i8dot_kernels lm__i8dot_kernels_amx_sim;
#endif

/* The LDTILECFG operand, palette 1 (64 bytes): tile t is rows[t] rows of colsb[t] bytes. */
typedef struct lm__amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} lm__amx_config;
/* The configuration this thread's tiles hold (the last one its AMX kernels loaded; NULL:
 * none): a kernel loads its own only when another is in place (matmul_bf16dot_avx512.c). */
extern _Thread_local const lm__amx_config *lm__amx_config_loaded;

/* Tests: the fast int8 / int4 kernel set this thread's linears run on the avx512 path
 * (an AVX-512 set; NULL: the CPU's choice, matmul.c i8fast_kernels); other paths keep
 * theirs. Returns the previous one. */
const lm__i8dot_kernels *lm__cpu_i8fast_force(const lm__i8dot_kernels *k);

/* Shared by the fast int8 / int4 kernel sets (matmul_i8dot_avx512.c, matmul_i8dot_avx2.c). */
/* A block of n <= 64 x values (zeros past n) in int4 order: its 32 even-k values, then its
 * 32 odd-k values (the order a block's 32 weight bytes unpack to: low nibbles, then high). */
static inline void lm__i8dot_split_block(const float *src, int64_t n, float dst[64]) {
    for (int i = 0; i < 64; i++) {
        int64_t k = i < 32 ? 2 * i : 2 * (i - 32) + 1;
        dst[i] = k < n ? src[k] : 0.0f;
    }
}
/* Bytes per weight element: f32 4, bf16/f16 2, i8 1 (u8, the bytes of int4 rows, 1). */
static inline size_t lm__w_size(lm_dtype dt) { return dt == LM_F32 ? 4u : dt == LM_I8 || dt == LM_U8 ? 1u : 2u; }

/* One weight element widened to f32 (exact for every dtype; i8 without its scale).
 * bf16 is the top half of an f32, so widening is a 16-bit shift. */
static inline float lm__widen1(const void *w, lm_dtype dt, int64_t k) {
    if (dt == LM_F32) return ((const float *)w)[k];
    if (dt == LM_I8) return (float)((const int8_t *)w)[k];
    uint16_t h = ((const uint16_t *)w)[k];
    if (dt == LM_F16) return lm_f16_to_f32(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Address of element k of W row n. */
static inline const void *lm__w_at(const void *w, lm_dtype dt, int64_t ldw, int64_t n, int64_t k) {
    return (const char *)w + (size_t)(n * ldw + k) * lm__w_size(dt);
}

/* The int8 epilogue for row r (see lm__i8_epilogue); y is the output element. */
static inline float lm__i8_finish(const lm__i8_epilogue *ep, int64_t r, float sum, const float *y) {
    float v = sum * ep->scales[r];
    if (ep->bias) v += ep->bias[r];
    return ep->accumulate ? *y + v : v;
}

/* Element k of an int4 row (a signed nibble, see lm__i4_weights). */
static inline int lm__i4_get(const uint8_t *row, int64_t k) {
    int v = (row[k >> 1] >> ((k & 1) * 4)) & 15;
    return v >= 8 ? v - 16 : v;
}

/* Row r's group scales: f32 (W->scales) or bf16 (W->scales16). */
static inline const void *lm__i4_srow(const lm__i4_weights *W, int64_t r) {
    return W->scales16 ? (const void *)(W->scales16 + r * W->lds) : (const void *)(W->scales + r * W->lds);
}

/* Scale g of a row of group scales, f32 or (sb, a constant in each caller's copy) bf16,
 * widened exactly. */
static inline float lm__i4_sc(const void *row, const int sb, int64_t g) { return lm__widen1(row, sb ? LM_BF16 : LM_F32, g); }

/* Group g's scale of W row r, whichever the dtype (the packs: one read per 16+ weights). */
static inline float lm__i4_scale(const lm__i4_weights *W, int64_t r, int64_t g) {
    return lm__i4_sc(lm__i4_srow(W, r), W->scales16 != NULL, g);
}

/* The int4 epilogue for row r: (accumulate ? *y : 0) + (sum + bias[r]). */
static inline float lm__i4_finish(const lm__i4_weights *W, int64_t r, float sum, const float *y) {
    float v = W->bias ? sum + W->bias[r] : sum;
    return W->accumulate ? *y + v : v;
}

/* An int4 panel's group scales: gs [units][nr], unit u of K block [k0, k0 + kl) per column
 * (0 past ncols). */
static inline void lm__i4_unit_scales(const lm__i4_weights *W, int ncols, int nr, int64_t k0, int64_t kl, int unit,
                                      float *gs) {
    const int64_t nu = (kl + unit - 1) / unit;
    for (int64_t u = 0; u < nu; u++)
        for (int j = 0; j < nr; j++)
            gs[u * nr + j] = j < ncols ? lm__i4_scale(W, j, (k0 + u * unit) / W->group) : 0.0f;
}

/* The portable int4 pack of nr-wide panels (every ISA's pack_i4 for now: it runs once
 * per K block of the GEMM and is amortized over its > gemv_max_m_16 x rows). */
static inline void lm__pack_i4_generic(const lm__i4_weights *W, int nr, int ncols, int64_t k0, int64_t kc, float *dst) {
    for (int j = 0; j < nr; j++) {
        if (j >= ncols) {
            for (int64_t k = 0; k < kc; k++) dst[k * nr + j] = 0.0f;
            continue;
        }
        const uint8_t *row = W->q + j * W->ldq;
        for (int64_t k = 0; k < kc; k += 16) { /* 16-aligned runs of k lie in one group */
            float s = lm__i4_scale(W, j, (k0 + k) / W->group);
            for (int64_t i = k; i < k + 16 && i < kc; i++) dst[i * nr + j] = (float)lm__i4_get(row, k0 + i) * s;
        }
    }
}

/* Prefetches the cache line LM__GEMV_PREFETCH bytes past byte offset off of a streamed
 * W row, or LM__PACK_PREFETCH elements past element k of a row being packed. Addresses
 * are formed as integers: they may lie past the row, and prefetches never fault.
 * 4 KB ahead is about bandwidth x latency for one core (~35 GB/s x ~100 ns); it
 * measured ~5% more decode bandwidth for bf16/f16 weights than hardware prefetch alone. */
#define LM__GEMV_PREFETCH 4096
#define LM__PACK_PREFETCH 64
static inline void lm__prefetch_addr(uintptr_t p) {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch((const void *)p, 0, 3);
#else
    (void)p;
#endif
}
static inline void lm__prefetch_bytes(const void *row, int64_t off) {
    lm__prefetch_addr((uintptr_t)row + (uintptr_t)off + LM__GEMV_PREFETCH);
}
static inline void lm__prefetch_ahead(const void *row, lm_dtype dt, int64_t k) {
    lm__prefetch_addr((uintptr_t)row + (uintptr_t)(k + LM__PACK_PREFETCH) * lm__w_size(dt));
}

#endif
