/* ops/cpu/matmul_i8dot_avx2.c — the fast-precision int8 / int4 products for CPUs that
 * run the AVX2 path (no AVX-512, or an ISA override): two lm__i8dot_kernels sets, one
 * with AVX-VNNI's VEX-encoded VPDPBUSD on ymm (Intel Alder Lake and later, AMD Zen 5),
 * one with AVX2 alone (VPMADDUBSW + VPMADDWD), from one body
 * (matmul_i8dot_avx2_body.h, included once per set). docs/QUANTIZATION.md "Fast
 * precision" describes the mode.
 *
 * x is quantized as the AVX-512 kernels quantize it (blocks of QB = 64 k, d = max |x| /
 * 127, round(x / d) in [-127, 127], nearest even, the same float steps), so every set
 * computes the same integer block sums; only the order of the f32 additions differs.
 * The unsigned-by-signed byte products take |w| as the unsigned operand and x with w's
 * sign as the signed one (VPABSB, VPSIGNB): the products are w * x exactly, with no
 * bias to remove (the AVX-512 kernels bias w by 128 instead) and, for VPMADDUBSW, no
 * saturation: a pair sums to at most 2 * 128 * 127 = 32,512 < 2^15.
 * Per 64 weights and x row: 2 VPABSB (shared by the x rows), 2 VPSIGNB, 2 VPDPBUSD (or
 * 2 VPMADDUBSW + 2 VPMADDWD + 2 adds), one conversion, one FMA.
 *
 * The GEMM (prefill) has the AVX-512 set's structure at half the width: x quantized once
 * per call into strips of rows, the weights packed per K block into panels of NR = 16
 * columns, a tile's int32 sums per unit of U k (64; 32 for int4 groups of 32) converted
 * and scaled by d (and the group scales) once per unit into f32 sums. The AVX-VNNI set
 * biases the panels' weights to unsigned, as the AVX-512 GEMM does, so that a product
 * is one VPDPBUSD and its 6 x 16 tile fits the 16 ymm registers; the AVX2 set keeps the
 * sign form (VPMADDUBSW would saturate on biased weights: 2 x 255 x 127 > 2^15) in
 * 4 x 16 tiles.
 * Compiled with generic flags: each function carries its target and runs only where
 * the driver (matmul.c, i8fast_kernels) found the features.
 */
#include "ops/cpu/matmul_kernels.h"

#ifdef LM__HAVE_X86_KERNELS
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE_AVX2 static inline __attribute__((always_inline)) TARGET_AVX2

enum { QB = 64, GEMV_MR = 4, MC = 32 };

/* The prepared x of one row, K inputs: xq [nb * QB] int8 (zero past K), then d [nb] f32,
 * each part 64-byte aligned. */
static int64_t nblocks(int64_t K) { return (K + QB - 1) / QB; }
static size_t row_bytes(int64_t K) {
    int64_t nb = nblocks(K);
    return (size_t)(nb * QB + (nb * 4 + 63) / 64 * 64);
}
static size_t x_bytes_avx2(int64_t M, int64_t K) { return (size_t)M * row_bytes(K); }

/* Quantizes one block of n <= QB values of src (zeros past n) into xq [QB]: returns its
 * scale d (max |x| / 127; 0 for an all-zero block, whose xq are 0; NaN when the block
 * holds NaN or Inf, whose xq are 0 too). */
INLINE_AVX2 float quant_block(const float *src, int64_t n, int8_t *xq) {
    float tmp[QB];
    if (n < QB) {
        memcpy(tmp, src, sizeof(float) * (size_t)n);
        memset(tmp + n, 0, sizeof(float) * (size_t)(QB - n));
        src = tmp;
    }
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(3.4028235e38f);
    __m256 v[8], amax = _mm256_setzero_ps();
    int finite = 1;
    for (int i = 0; i < 8; i++) {
        v[i] = _mm256_loadu_ps(src + 8 * i);
        __m256 a = _mm256_andnot_ps(sign, v[i]);
        /* |x| <= FLT_MAX is false for Inf and (ordered compare) for NaN */
        finite &= _mm256_movemask_ps(_mm256_cmp_ps(a, big, _CMP_LE_OQ)) == 0xff;
        amax = _mm256_max_ps(amax, a);
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    const float am = _mm_cvtss_f32(m);
    if (!finite || am == 0.0f) {
        memset(xq, 0, QB);
        return finite ? 0.0f : NAN;
    }
    const __m256 inv = _mm256_set1_ps(127.0f / am);
    const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int i = 0; i < 8; i += 4) {
        __m256i q[4];
        for (int j = 0; j < 4; j++) /* nearest even; |q| <= 127 */
            q[j] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[i + j], inv)), hi), lo);
        /* the packs work per 128-bit lane: dwords come out as q0 lo, q1 lo, q2 lo, q3 lo |
         * q0 hi, ...; the permutation puts them back in k order */
        __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(xq + 8 * i), _mm256_permutevar8x32_epi32(b, order));
    }
    return am / 127.0f;
}

/* split: store each block's xq as its 32 even-k values, then its 32 odd-k values (the
 * order int4 bytes unpack to: low nibbles, then high ones). */
INLINE_AVX2 void prep_x(const float *x, int64_t ldx, int64_t M, int64_t K, void *dst, int split) {
    const int64_t nb = nblocks(K);
    for (int64_t m = 0; m < M; m++) {
        uint8_t *base = (uint8_t *)dst + (size_t)m * row_bytes(K);
        int8_t *xq = (int8_t *)base;
        float *d = (float *)(base + nb * QB);
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
        }
    }
}

TARGET_AVX2 static void prep_x_i8(const float *x, int64_t ldx, int64_t M, int64_t K, void *dst) {
    prep_x(x, ldx, M, K, dst, 0);
}

TARGET_AVX2 static void prep_x_i4(const float *x, int64_t ldx, int64_t M, int64_t K, void *dst) {
    prep_x(x, ldx, M, K, dst, 1);
}

/* The sum of the 8 lanes of a + b. */
INLINE_AVX2 float hsum2(__m256 a, __m256 b) {
    __m256 s = _mm256_add_ps(a, b);
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
    return _mm_cvtss_f32(t);
}

/* Row wr's block b as two vectors of 32 signed bytes (a last block past K: its bytes
 * copied, zeros after them; their xq are 0). */
INLINE_AVX2 void i8_block(const int8_t *wr, int64_t K, int64_t b, int64_t full, __m256i *w0, __m256i *w1) {
    const int64_t k0 = b * QB;
    if (b < full) {
        lm__prefetch_bytes(wr, k0);
        *w0 = _mm256_loadu_si256((const __m256i *)(wr + k0));
        *w1 = _mm256_loadu_si256((const __m256i *)(wr + k0 + 32));
    } else {
        int8_t tmp[QB] = {0};
        memcpy(tmp, wr + k0, (size_t)(K - k0));
        *w0 = _mm256_loadu_si256((const __m256i *)tmp);
        *w1 = _mm256_loadu_si256((const __m256i *)(tmp + 32));
    }
}

/* 32 int4 bytes as signed bytes ((n ^ 8) - 8): the low nibbles (even k) in *lo, the high
 * ones (odd k) in *hi, byte i of each from byte i of v. */
INLINE_AVX2 void nibbles(__m256i v, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), e8 = _mm256_set1_epi8(8);
    *lo = _mm256_sub_epi8(_mm256_xor_si256(_mm256_and_si256(v, m4), e8), e8);
    *hi = _mm256_sub_epi8(_mm256_xor_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), e8), e8);
}

/* int4 block b of a row (32 bytes, 64 k; a last block of 32 k: 16 bytes) as signed bytes:
 * the low nibbles (even k) in *w0, the high ones (odd k) in *w1, each (n ^ 8) - 8; and
 * the per-lane group scales: for groups of 32, int32 lanes 0-3 of either vector hold the
 * block's first 32 k and lanes 4-7 its last 32; else one scale. */
INLINE_AVX2 void i4_block(const uint8_t *qr, const void *sc, const int SB, int group, int64_t b, int64_t full,
                          __m256i *w0, __m256i *w1, __m256 *ws) {
    const int64_t k0 = b * QB;
    __m256i v;
    if (b < full) {
        if (!(b & 1)) lm__prefetch_bytes(qr, k0 / 2);
        v = _mm256_loadu_si256((const __m256i *)(qr + k0 / 2));
    } else {
        v = _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(qr + k0 / 2)));
    }
    nibbles(v, w0, w1);
    if (group == 32)
        *ws = _mm256_set_m128(_mm_set1_ps(b < full ? lm__i4_sc(sc, SB, (k0 >> 5) + 1) : 0.0f),
                              _mm_set1_ps(lm__i4_sc(sc, SB, k0 >> 5)));
    else
        *ws = _mm256_set1_ps(lm__i4_sc(sc, SB, k0 >> (group == 64 ? 6 : 7)));
}

/* ---- the GEMM's x and panels (prefill) -----------------------------------------------
 * The same quantized x, stored once per call in strips of g rows (4 for the AVX2 set, 6
 * for AVX-VNNI's): xq [nb * 16][g][4] (4 k of each row in turn: a tile's broadcasts are
 * fixed offsets from one pointer), d [nb][g], then with a bias cw [nu][g] (-bias times
 * the sum of each unit's xq: a lane's starting value); rows past M are zero. The weights
 * are packed per K block into panels of NR = 16 columns whose 64-byte rows hold, for 4
 * consecutive k, each column's 4 weight bytes (int4 nibbles unpacked in k order): two ymm
 * operands of 8 columns against the 4 xq of an x row broadcast to every lane. The AVX2
 * set keeps them signed and takes w's sign into x per product (as its gemv does); the
 * AVX-VNNI set biases them to unsigned (int8 w + 128, int4 n + 8) as the AVX-512 GEMM
 * does, so each product is one VPDPBUSD and each lane starts from its cw. */
enum { NR = 16 };

static int64_t pad64(int64_t bytes) { return (bytes + 63) / 64 * 64; }
static size_t strip_bytes(int64_t K, int U, int g, int cw) {
    const int64_t nb = nblocks(K), nu = nb * (QB / U);
    return (size_t)(nb * QB * g + pad64(nb * g * 4) + (cw ? pad64(nu * g * 4) : 0));
}

/* Strips [s0, s1) of g rows (with cw: the starting values for weights biased by bias). */
INLINE_AVX2 void prep_strips(const float *x, int64_t ldx, int64_t M, int64_t K, int unit, int bias, void *dst,
                             int64_t s0, int64_t s1, const int g, const int cw) {
    const int64_t nb = nblocks(K);
    const size_t sb = strip_bytes(K, unit, g, cw);
    if (s1 * g > M) /* the last strip: its rows past M read as zero */
        memset((uint8_t *)dst + (size_t)(s1 - 1) * sb, 0, sb);
    for (int64_t m = s0 * g; m < LM_MIN(M, s1 * g); m++) {
        uint8_t *base = (uint8_t *)dst + (size_t)(m / g) * sb;
        const int r = (int)(m % g);
        float *d = (float *)(base + nb * QB * g);
        int32_t *c = (int32_t *)(base + nb * QB * g + pad64(nb * g * 4));
        int32_t *xs = (int32_t *)base + r;
        for (int64_t b = 0; b < nb; b++) {
            int32_t xq[QB / 4];
            d[b * g + r] = quant_block(x + m * ldx + b * QB, LM_MIN(QB, K - b * QB), (int8_t *)xq);
            for (int t = 0; t < QB / 4; t++) xs[(b * (QB / 4) + t) * g] = xq[t];
            if (cw) {
                int32_t lo = 0, hi = 0;
                for (int i = 0; i < QB / 2; i++) lo += ((const int8_t *)xq)[i], hi += ((const int8_t *)xq)[QB / 2 + i];
                if (unit == 32) c[2 * b * g + r] = -bias * lo, c[(2 * b + 1) * g + r] = -bias * hi;
                else c[b * g + r] = -bias * (lo + hi);
            }
        }
    }
}

/* Transposes the 8 x 8 dwords of r in place (row i's dword j to row j's dword i). */
INLINE_AVX2 void transpose8_epi32(__m256i r[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++)
        for (int h = 0; h < 2; h++) {
            u[4 * i + 2 * h] = _mm256_unpacklo_epi64(t[4 * i + h], t[4 * i + 2 + h]);
            u[4 * i + 2 * h + 1] = _mm256_unpackhi_epi64(t[4 * i + h], t[4 * i + 2 + h]);
        }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x20);
        r[4 + i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x31);
    }
}

/* Panel rows [k / 4, k / 4 + 16) from col [NR][QB]: column j's 64 bytes of k .. k + 63 in
 * k order, each plus bias (wrapping: 128 turns int8 into w + 128 as unsigned); panel
 * row t gets dword t of every column. */
INLINE_AVX2 void store_panel_chunk(const int8_t (*col)[QB], int64_t k, int bias, uint8_t *dst) {
    const __m256i bv = _mm256_set1_epi8((char)bias);
    for (int g = 0; g < NR / 8; g++)     /* columns 8 g .. 8 g + 7 */
        for (int h = 0; h < QB / 32; h++) { /* k4 8 h .. 8 h + 7 */
            __m256i r[8];
            for (int i = 0; i < 8; i++)
                r[i] = _mm256_add_epi8(_mm256_loadu_si256((const __m256i *)(col[8 * g + i] + 32 * h)), bv);
            transpose8_epi32(r);
            for (int t = 0; t < 8; t++)
                _mm256_storeu_si256((__m256i *)(dst + (k / 4 + 8 * h + t) * (NR * 4) + 32 * g), r[t]);
        }
}

/* int8 panel: kl k of ncols (<= NR) rows of q (at column 0, k 0 of the block);
 * round_up(kl, 64) / 4 panel rows (what lies past kl or ncols meets zero x or is never
 * stored). */
INLINE_AVX2 void pack_i8_g(const int8_t *q, int64_t ldq, int ncols, int64_t kl, uint8_t *dst, int bias) {
    for (int64_t k = 0; k < kl; k += QB) {
        int8_t col[NR][QB];
        const int64_t n = LM_MIN(QB, kl - k);
        for (int j = 0; j < NR; j++) {
            if (j < ncols) memcpy(col[j], q + j * ldq + k, (size_t)n);
            memset(col[j] + (j < ncols ? n : 0), 0, (size_t)(QB - (j < ncols ? n : 0)));
        }
        store_panel_chunk((const int8_t(*)[QB])col, k, bias, dst);
    }
}

/* int4 panel: K block [k0, k0 + kl) (multiples of 32) of ncols rows, each nibble a signed
 * byte in k order (plus bias); gs [nu][NR]: each unit's group scale per column (0 past
 * ncols). */
INLINE_AVX2 void pack_i4_g(const lm__i4_weights *W, int ncols, int64_t k0, int64_t kl, int unit, uint8_t *dst,
                           float *gs, int bias) {
    for (int64_t k = 0; k < kl; k += QB) {
        int8_t col[NR][QB];
        for (int j = 0; j < NR; j++) {
            __m256i v = _mm256_setzero_si256();
            if (j < ncols) {
                const uint8_t *src = W->q + j * W->ldq + (k0 + k) / 2;
                v = kl - k >= QB ? _mm256_loadu_si256((const __m256i *)src)
                                 : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)src)); /* 32 k */
            }
            __m256i lo, hi;
            nibbles(v, &lo, &hi);
            /* byte i of v holds k 2i (low) and 2i + 1 (high): interleave, then put the lanes in k order */
            const __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi);
            _mm256_storeu_si256((__m256i *)col[j], _mm256_permute2x128_si256(a, b, 0x20));
            _mm256_storeu_si256((__m256i *)(col[j] + 32), _mm256_permute2x128_si256(a, b, 0x31));
        }
        store_panel_chunk((const int8_t(*)[QB])col, k, bias, dst);
    }
    lm__i4_unit_scales(W, ncols, NR, k0, kl, unit, gs);
}

#define SFX avx2
#define TARGET_SET TARGET_AVX2
#define GMR 4 /* a 4 x 16 tile: 8 int32 sums, 2 weight vectors and their |w|, the broadcast x and its signed copy */
#include "ops/cpu/matmul_i8dot_avx2_body.h"
#undef SFX
#undef TARGET_SET
#undef GMR

#define SFX avxvnni
#define TARGET_SET __attribute__((target("avx2,fma,f16c,avxvnni")))
#define LM__I8DOT_VNNI 1
#define GMR 6 /* a 6 x 16 tile: 12 int32 sums, 2 weight vectors, the broadcast x */
#include "ops/cpu/matmul_i8dot_avx2_body.h"
#undef SFX
#undef TARGET_SET
#undef LM__I8DOT_VNNI
#undef GMR

#endif
