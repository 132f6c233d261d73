/* ops/cpu/matmul_bf16dot_avx512.c — the fast-precision GEMM for bf16 weights
 * (lm__bf16dot_kernels, see matmul_kernels.h; docs/QUANTIZATION.md "Fast precision").
 *
 * The exact GEMM (matmul_avx512.c) widens every bf16 weight to f32 in its panels and
 * runs 16 f32 FMAs per instruction. Here the panels keep the weights as bf16 pairs
 * (half the bytes) and x is rounded to bf16 pairs once per strip of mr rows and one
 * K block (VCVTNE2PS2BF16: round to nearest even; like every AVX512_BF16 instruction
 * it treats denormal inputs as zero). VDPBF16PS then adds 32 exact bf16 products into
 * 16 f32 lanes per instruction: twice the multiply-adds of an FMA. The only new error
 * is the rounding of x (relative 2^-9 per element); W is bf16 already, products are
 * exact and sums stay f32. Same tile as the f32 GEMM: 6 x 64 = 24 zmm accumulators;
 * per k pair: 4 panel loads, 6 broadcasts of an x pair, 24 VDPBF16PS.
 * Compiled with generic flags: each function carries LM__TARGET_AVX512BF16 and runs
 * only after lm__cpu_bf16dot_supported() (the driver, matmul.c, checks it).
 *
 * AMX (lm__bf16dot_kernels_amx, CPUs with AMX-BF16 whose OS granted the tile state:
 * lm__cpu_amx_bf16_supported): the same panels, x strips and gemv; only the
 * microkernel differs. The panels' rows of 64 pairs are what TDPBF16PS reads as its B
 * tile (16 pair rows x 16 columns, 64 bytes a row) at column offsets 0, 16, 32, 48 and a
 * 256-byte stride, and an x strip's rows of pairs are its A tile (16 rows x 16 pairs).
 * The 32 x 64 tile is computed as two 32 x 32 halves, each in four C tiles (2 A tiles x 2
 * B tiles, 4 TDPBF16PS per 32 k); the K tail (pairs past the last 16) goes through
 * zero-padded copies. Same rounding of x, products of bf16 pairs summed in f32 (in the
 * tile unit's order: results differ from the AVX-512 kernel's in the last bits, within
 * the same f32 summation bound).
 */
#include "ops/cpu/matmul_kernels.h"

#ifdef LM__HAVE_X86_KERNELS
#include <immintrin.h>

#include "ops/cpu/transpose_avx512.h"

#define INLINE static inline __attribute__((always_inline)) LM__TARGET_AVX512BF16

enum { MR = 6, NR = 64 };

/* Lanes 0 .. n-1 of 16 (none for n <= 0). */
INLINE __mmask16 mask16(int64_t n) { return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1u); }

/* 32 bf16 of a row = 16 pairs; elements k >= n read as 0 (masked, never touched). */
INLINE __m512 load_pairs(const uint16_t *p, int64_t n) {
    __mmask32 m = n >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << n) - 1u);
    return _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, p));
}

/* One 16-row x 32-k block of W (rows >= ncols read as 0) as 16 panel rows of pairs:
 * row j's 32-bit word i is the pair (k + 2i, k + 2i + 1), so the 16 x 16 transpose of
 * 32-bit words puts pair i of the 16 rows in register i. Rows are prefetched ahead as
 * the f32 packer does (matmul_avx512.c: slow row streams defeat hardware prefetch). */
INLINE void pack_block(const uint16_t *w, int64_t ldw, int ncols, int64_t k, int64_t kn, uint32_t *dst) {
    __m512 r[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) {
        if (j < ncols) {
            const uint16_t *row = w + j * ldw;
            lm__prefetch_ahead(row, LM_BF16, k);
            r[j] = load_pairs(row + k, kn);
        } else r[j] = _mm512_setzero_ps();
    }
    lm__transpose16_avx512(r);
    int64_t pairs = (kn + 1) / 2;
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        if (i < pairs) _mm512_storeu_ps((float *)dst + (k / 2 + i) * NR, r[i]);
}

LM__TARGET_AVX512BF16 static void pack_bf16dot(const uint16_t *w, int64_t ldw, int ncols, int64_t kc, uint32_t *dst) {
    for (int j = 0; j < NR; j += 16) { /* row j exists only when j < ncols */
        const uint16_t *wj = j < ncols ? w + j * ldw : w;
        for (int64_t k = 0; k < kc; k += 32)
            pack_block(wj, ldw, ncols - j, k, kc - k < 32 ? kc - k : 32, dst + j);
    }
}

/* x rows to bf16 pairs, 32 values per VCVTNE2PS2BF16 (its second operand fills the low
 * 16 bf16 lanes, so lane p holds the pair (k + 2p, k + 2p + 1) in memory order). */
LM__TARGET_AVX512BF16 static void round_x_bf16dot(const float *x, int64_t ldx, int rows, int64_t kc, uint32_t *dst,
                                                  int64_t ldd) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + r * ldx;
        for (int64_t k = 0; k < kc; k += 32) {
            __m512 lo = _mm512_maskz_loadu_ps(mask16(kc - k), xr + k);
            __m512 hi = _mm512_maskz_loadu_ps(mask16(kc - k - 16), xr + k + 16);
            _mm512_storeu_si512((void *)(dst + r * ldd + k / 2), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}

LM__TARGET_AVX512BF16 static void micro_bf16dot(int64_t kp, const uint32_t *a, int64_t lda, int mrows,
                                                const uint32_t *bp, float *c, int64_t ldc, int ncols, int accumulate) {
    const uint32_t *ar[MR];
    __m512 acc[MR][NR / 16];
    /* Rows past mrows repeat the last row: in-bounds reads, results never stored. */
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        ar[r] = a + (r < mrows ? r : mrows - 1) * lda;
#pragma GCC unroll 4
        for (int j = 0; j < NR / 16; j++) acc[r][j] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < kp; p++) {
        __m512bh b[NR / 16];
#pragma GCC unroll 4
        for (int j = 0; j < NR / 16; j++) b[j] = (__m512bh)_mm512_loadu_si512((const void *)(bp + p * NR + 16 * j));
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)ar[r][p]);
#pragma GCC unroll 4
            for (int j = 0; j < NR / 16; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], av, b[j]);
        }
    }
    __mmask16 mask[NR / 16];
#pragma GCC unroll 4
    for (int j = 0; j < NR / 16; j++) mask[j] = mask16(ncols - 16 * j);
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        if (r >= mrows) break;
#pragma GCC unroll 4
        for (int j = 0; j < NR / 16; j++) {
            if (!mask[j]) continue; /* columns 16j.. are past ncols: not even addressed */
            float *cp = c + r * ldc + 16 * j;
            __m512 v = acc[r][j];
            if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask[j], cp));
            _mm512_mask_storeu_ps(cp, mask[j], v);
        }
    }
}

/* The fast gemv: y[m, r] = sum over pairs p of dot2(xp[m, p], W row r's pair p) for
 * m < M (<= GEMV_MR) and r < nrows, one W row at a time streamed front to back (as the
 * exact gemv: one sequential stream per thread, lines prefetched 4 KB ahead), 32 bf16
 * weights a load and 4 independent accumulators per x row. A K that is odd reads its
 * last pair's second weight as 0 (masked: never past the row). Decode is bound by the
 * bytes of W: the exact gemv's widening and f32 FMAs (4-5 instructions per 16 weights)
 * are what keep it below the read bandwidth on cores with 256-bit AVX-512 units. */
enum { GEMV_MR = 4, KU = 4 };

INLINE void gemv_fast_row(const uint32_t *xp, int64_t ldxp, const int MRX, const uint16_t *wr, int64_t K, float *y,
                          int64_t ldy) {
    __m512 acc[GEMV_MR][KU];
#pragma GCC unroll 4
    for (int m = 0; m < MRX; m++)
#pragma GCC unroll 4
        for (int u = 0; u < KU; u++) acc[m][u] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 * KU <= K; k += 32 * KU) {
#pragma GCC unroll 4
        for (int u = 0; u < KU; u++) {
            lm__prefetch_bytes(wr, (k + 32 * u) * 2); /* one 64-byte line a load */
            __m512bh wv = (__m512bh)_mm512_loadu_si512((const void *)(wr + k + 32 * u));
#pragma GCC unroll 4
            for (int m = 0; m < MRX; m++)
                acc[m][u] = _mm512_dpbf16_ps(acc[m][u], (__m512bh)_mm512_loadu_si512((const void *)(xp + m * ldxp + (k + 32 * u) / 2)), wv);
        }
    }
    for (; k < K; k += 32) {
        __m512bh wv = (__m512bh)_mm512_castps_si512(load_pairs(wr + k, K - k));
#pragma GCC unroll 4
        for (int m = 0; m < MRX; m++)
            acc[m][0] = _mm512_dpbf16_ps(acc[m][0], (__m512bh)_mm512_loadu_si512((const void *)(xp + m * ldxp + k / 2)), wv);
    }
#pragma GCC unroll 4
    for (int m = 0; m < MRX; m++) {
        __m512 s = _mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), _mm512_add_ps(acc[m][2], acc[m][3]));
        y[m * ldy] = _mm512_reduce_add_ps(s);
    }
}

LM__TARGET_AVX512BF16 static void gemv_bf16dot(const uint32_t *xp, int64_t ldxp, int64_t M, const uint16_t *w,
                                               int64_t ldw, int64_t nrows, int64_t K, float *y, int64_t ldy) {
    for (int64_t r = 0; r < nrows; r++) {
        const uint16_t *wr = w + r * ldw;
        for (int64_t m = 0; m < M; m += GEMV_MR) { /* the W row stays in L1/L2 between groups */
            const uint32_t *xm = xp + m * ldxp;
            float *ym = y + m * ldy + r;
            switch (M - m) {
            case 1: gemv_fast_row(xm, ldxp, 1, wr, K, ym, ldy); break;
            case 2: gemv_fast_row(xm, ldxp, 2, wr, K, ym, ldy); break;
            case 3: gemv_fast_row(xm, ldxp, 3, wr, K, ym, ldy); break;
            default: gemv_fast_row(xm, ldxp, 4, wr, K, ym, ldy); break;
            }
        }
    }
}

/* ---- AMX microkernel ------------------------------------------------------------------- */
#define LM__TARGET_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))

enum { AMR = 32 };

/* Tiles 0-3: C (16 rows x 16 f32), 4-5: A (16 rows x 16 pairs), 6-7: B (16 pair rows x
 * 16 columns): every tile 16 rows of 64 bytes. The configuration is per thread and stays
 * loaded until another AMX kernel (the int8 one) loads its own. A static constant: the
 * LDTILECFG asm names only the operand's first bytes, so no stores to it may be left to
 * the compiler to keep or drop. */
_Thread_local const lm__amx_config *lm__amx_config_loaded;

static const lm__amx_config amx_cfg_bf16 __attribute__((aligned(64))) = {
    .palette = 1, .colsb = {64, 64, 64, 64, 64, 64, 64, 64}, .rows = {16, 16, 16, 16, 16, 16, 16, 16}};

LM__TARGET_AMX static void amx_configure(void) {
    if (lm__amx_config_loaded == &amx_cfg_bf16) return;
    _tile_loadconfig(&amx_cfg_bf16);
    lm__amx_config_loaded = &amx_cfg_bf16;
}

LM__TARGET_AMX static void micro_amx(int64_t kp, const uint32_t *a, int64_t lda, int mrows, const uint32_t *bp,
                                     float *c, int64_t ldc, int ncols, int accumulate) {
    amx_configure();
    const int64_t kfull = kp / 16 * 16, tail = kp - kfull;
    uint32_t at[AMR * 16] __attribute__((aligned(64))); /* the K tail of the strip's 32 rows, zero-padded */
    uint32_t bt[16 * 32] __attribute__((aligned(64)));  /* the K tail of one half's 32 columns */
    float tmp[AMR * 32] __attribute__((aligned(64)));   /* a partial half: rows < mrows, columns < ncols kept */
    if (tail) {
        for (int r = 0; r < AMR; r++) { /* rows past mrows repeat the last row (results never stored) */
            const uint32_t *ar = a + (int64_t)(r < mrows ? r : mrows - 1) * lda + kfull;
            for (int p = 0; p < 16; p++) at[r * 16 + p] = p < tail ? ar[p] : 0u;
        }
    }
    const long sa = (long)(lda * 4), sb = NR * 4, sc = (long)(ldc * 4);
    for (int c0 = 0; c0 < NR && c0 < ncols; c0 += 32) {
        const int full = mrows == AMR && ncols >= c0 + 32; /* all four C tiles land in c as they are */
        float *cc = c + c0;
        if (full && accumulate) {
            _tile_loadd(0, cc, sc);
            _tile_loadd(1, cc + 16, sc);
            _tile_loadd(2, cc + 16 * ldc, sc);
            _tile_loadd(3, cc + 16 * ldc + 16, sc);
        } else {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
        }
        for (int64_t p = 0; p < kfull; p += 16) {
            _tile_loadd(4, a + p, sa);
            _tile_loadd(5, a + 16 * lda + p, sa); /* rows 16..31 of the strip (allocated; past mrows unused) */
            _tile_loadd(6, bp + p * NR + c0, sb);
            _tile_loadd(7, bp + p * NR + c0 + 16, sb);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        if (tail) {
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 32; j++) bt[i * 32 + j] = i < tail ? bp[(kfull + i) * NR + c0 + j] : 0u;
            __asm__ volatile("" ::: "memory"); /* at and bt written before the tiles read them */
            _tile_loadd(4, at, 64);
            _tile_loadd(5, at + 16 * 16, 64);
            _tile_loadd(6, bt, 128);
            _tile_loadd(7, bt + 16, 128);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        if (full) {
            _tile_stored(0, cc, sc);
            _tile_stored(1, cc + 16, sc);
            _tile_stored(2, cc + 16 * ldc, sc);
            _tile_stored(3, cc + 16 * ldc + 16, sc);
            continue;
        }
        _tile_stored(0, tmp, 128);
        _tile_stored(1, tmp + 16, 128);
        _tile_stored(2, tmp + 16 * 32, 128);
        _tile_stored(3, tmp + 16 * 32 + 16, 128);
        __mmask16 mask[2] = {mask16(ncols - c0), mask16(ncols - c0 - 16)};
        for (int r = 0; r < mrows; r++)
            for (int h = 0; h < 2; h++) {
                if (!mask[h]) continue; /* columns past ncols: not even addressed */
                float *cp = cc + r * ldc + 16 * h;
                __m512 v = _mm512_load_ps(tmp + r * 32 + 16 * h);
                if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask[h], cp));
                _mm512_mask_storeu_ps(cp, mask[h], v);
            }
    }
}

/* kc 256 and nc 512 as the f32 GEMM: the same blocks in half the panel bytes (the
 * blocking is shared, matmul.c plan_gemm). */
const lm__bf16dot_kernels lm__bf16dot_kernels_avx512 = {
    .mr = MR, .nr = NR, .kc = 256, .nc = 512,
    .pack = pack_bf16dot, .round_x = round_x_bf16dot, .micro = micro_bf16dot, .gemv = gemv_bf16dot,
};

/* AMX: 32-row strips; K blocks of up to 1,024 (a C round trip per block: fewer, longer
 * tile runs) and N blocks of 256 (4 panels of 128 KB, within a 2 MB L2). */
const lm__bf16dot_kernels lm__bf16dot_kernels_amx = {
    .mr = AMR, .nr = NR, .kc = 1024, .nc = 256,
    .pack = pack_bf16dot, .round_x = round_x_bf16dot, .micro = micro_amx, .gemv = gemv_bf16dot,
};

#endif
