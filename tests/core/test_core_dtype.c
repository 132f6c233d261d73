/* Tests for dtypes and the bf16/f16 conversions.
 *  - Exhaustive: all 65536 bf16 and f16 bit patterns convert to f32 exactly and back
 *    to the same bits (NaNs stay NaN with their sign).
 *  - f32 -> f16 agrees bit for bit with the compiler's _Float16 conversion (round to
 *    nearest even) on ~10 million random patterns plus every tie, tie +- 1 ulp,
 *    subnormal and overflow edge.
 *  - f32 -> bf16 agrees with an independent float64 round-to-nearest-even derivation
 *    on random patterns and on ties at every exponent.
 *  - lm_dtype_parse/name/size/is_float/valid on every dtype and on bad input.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <float.h>
#include <math.h>
#include <string.h>

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static int half_is_nan(uint16_t h, int exp_bits) {
    uint16_t exp_mask = exp_bits == 5 ? 0x7c00u : 0x7f80u;
    return (h & exp_mask) == exp_mask && (h & (uint16_t)~(exp_mask | 0x8000u)) != 0;
}

/* ---- exhaustive round trips ------------------------------------------------------- */
static void test_bf16_roundtrip_exhaustive(void) {
    int bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        float f = lm_bf16_to_f32((uint16_t)b);
        if (f32_bits(f) != b << 16) bad++; /* bf16 is the top half of an f32 */
        uint16_t back = lm_f32_to_bf16(f);
        if (half_is_nan((uint16_t)b, 8)) {
            if (!half_is_nan(back, 8) || (back & 0x8000u) != (b & 0x8000u)) bad++;
        } else if (back != b) {
            if (bad++ < 5) lt_fail(__FILE__, __LINE__, "bf16 %04x -> %08x -> %04x", b, f32_bits(f), back);
        }
    }
    LT_CHECK_MSG(bad == 0, "%d bf16 patterns did not round-trip", bad);
}

/* The f16 value of bits h computed from its fields in double arithmetic. */
static double f16_value(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (h & 0x8000u) ? -v : v;
}

static void test_f16_roundtrip_exhaustive(void) {
    int bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        float f = lm_f16_to_f32((uint16_t)b);
        uint16_t back = lm_f32_to_f16(f);
        if (half_is_nan((uint16_t)b, 5)) {
            if (!isnan(f) || !half_is_nan(back, 5) || (back & 0x8000u) != (b & 0x8000u)) bad++;
            continue;
        }
        double want = f16_value((uint16_t)b);
        if ((double)f != want || !signbit(f) != !signbit(want) || back != b) {
            if (bad++ < 5) lt_fail(__FILE__, __LINE__, "f16 %04x -> %.9g (want %.9g) -> %04x", b, f, want, back);
        }
    }
    LT_CHECK_MSG(bad == 0, "%d f16 patterns did not round-trip", bad);
}

/* ---- f32 -> f16 against the compiler ---------------------------------------------------- */
#if defined(__FLT16_MAX__)
static uint16_t compiler_f16(float x) {
    volatile _Float16 h = (_Float16)x; /* volatile: no constant folding, a real conversion */
    _Float16 v = h;
    uint16_t u;
    memcpy(&u, &v, 2);
    return u;
}

static int f16_mismatch(float x, int *reported) {
    uint16_t got = lm_f32_to_f16(x), want = compiler_f16(x);
    int same = got == want || (half_is_nan(got, 5) && half_is_nan(want, 5) && (got & 0x8000u) == (want & 0x8000u));
    if (!same && (*reported)++ < 8)
        lt_fail(__FILE__, __LINE__, "f32 %08x (%.9g): loom %04x, compiler %04x", f32_bits(x), x, got, want);
    return !same;
}

static void test_f32_to_f16_matches_compiler_on_edges(void) {
    int bad = 0, reported = 0;
    /* every midpoint between neighbouring f16 values (exact in f32: 12 significant
     * bits), one f32 ulp either side, and each f16 value itself, both signs */
    for (uint32_t h = 0; h < 0x7c00u; h++) {
        double lo = f16_value((uint16_t)h), hi = h + 1 < 0x7c00u ? f16_value((uint16_t)(h + 1)) : 65536.0;
        float mid = (float)((lo + hi) / 2);
        float probes[4] = {(float)lo, mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int i = 0; i < 4; i++) {
            bad += f16_mismatch(probes[i], &reported);
            bad += f16_mismatch(-probes[i], &reported);
        }
    }
    const float named[] = {0.0f,     -0.0f,     65504.0f,  65519.99f, 65520.0f,     65536.0f,    1e30f,
                           INFINITY, -INFINITY, NAN,       -NAN,      FLT_MIN,      FLT_TRUE_MIN, FLT_MAX,
                           0x1p-24f, 0x1p-25f,  0x1.8p-24f, 0x1p-26f, 0x1.fffffep-15f, 0x1p-14f, 0x1.ffep-15f};
    for (int i = 0; i < (int)(sizeof named / sizeof named[0]); i++) {
        bad += f16_mismatch(named[i], &reported);
        bad += f16_mismatch(-named[i], &reported);
    }
    /* ties and near-ties at every f32 exponent: low 13 bits are the rounded-off part */
    lt_rng r = lt_rng_seed(16);
    const uint32_t lows[] = {0x0000, 0x1000, 0x0fff, 0x1001, 0x1fff, 0x0001};
    for (uint32_t e = 0; e < 256; e++)
        for (int k = 0; k < 512; k++) {
            uint32_t top = (uint32_t)lt_rng_u64(&r) & 0x7fe000u;
            uint32_t u = (e << 23) | top | lows[k % 6] | ((uint32_t)(k & 1) << 31);
            bad += f16_mismatch(bits_f32(u), &reported);
        }
    LT_CHECK_MSG(bad == 0, "%d edge patterns differ from _Float16", bad);
}

static void test_f32_to_f16_matches_compiler_on_random_bits(void) {
    lt_rng r = lt_rng_seed(17);
    int bad = 0, reported = 0;
    for (int i = 0; i < 5000000; i++) {
        uint64_t u = lt_rng_u64(&r);
        bad += f16_mismatch(bits_f32((uint32_t)u), &reported);
        /* the other half biased to the f16 range (|x| in [2^-27, 2^17)) */
        uint32_t v = (uint32_t)(u >> 32);
        uint32_t e = 100 + (v >> 23) % 44;
        bad += f16_mismatch(bits_f32((v & 0x807fffffu) | (e << 23)), &reported);
    }
    LT_CHECK_MSG(bad == 0, "%d random patterns differ from _Float16", bad);
}
#endif

/* ---- f32 -> bf16 against a float64 re-derivation ------------------------------------------- */
/* Round x (finite) to 8 significant bits, ties to even, with bf16's exponent range
 * (smallest subnormal 2^-133); returns bf16 bits. Overflow beyond the largest finite
 * bf16 gives inf. */
static uint16_t bf16_reference(float x) {
    double d = fabs((double)x);
    uint16_t sign = signbit(x) ? 0x8000u : 0;
    if (d == 0) return sign;
    int e;
    frexp(d, &e); /* d in [2^(e-1), 2^e) */
    double ulp = ldexp(1.0, e - 8 > -133 ? e - 8 : -133);
    double q = d / ulp, fl = floor(q), frac = q - fl; /* exact: power-of-two scaling */
    if (frac > 0.5 || (frac == 0.5 && fmod(fl, 2.0) == 1.0)) fl += 1;
    double rounded = fl * ulp;
    double max_bf16 = ldexp(255.0, 120); /* (2 - 2^-7) * 2^127 */
    if (rounded > max_bf16) return sign | 0x7f80u;
    uint32_t u = f32_bits((float)rounded);
    return sign | (uint16_t)(u >> 16);
}

static int bf16_mismatch(float x, int *reported) {
    uint16_t got = lm_f32_to_bf16(x);
    int same;
    if (isnan(x)) same = half_is_nan(got, 8) && (got & 0x40u) && (got & 0x8000u) == ((f32_bits(x) >> 16) & 0x8000u);
    else if (isinf(x)) same = got == ((f32_bits(x) >> 16) & 0xff80u);
    else same = got == bf16_reference(x);
    if (!same && (*reported)++ < 8)
        lt_fail(__FILE__, __LINE__, "f32 %08x (%.9g): loom bf16 %04x, reference %04x", f32_bits(x), x, got,
                isnan(x) || isinf(x) ? 0 : bf16_reference(x));
    return !same;
}

static void test_f32_to_bf16_matches_f64_reference(void) {
    lt_rng r = lt_rng_seed(18);
    int bad = 0, reported = 0;
    for (int i = 0; i < 3000000; i++) bad += bf16_mismatch(bits_f32((uint32_t)lt_rng_u64(&r)), &reported);
    /* ties (low half 0x8000) and their neighbours at every exponent, both signs */
    const uint32_t lows[] = {0x8000, 0x7fff, 0x8001, 0x0000, 0xffff, 0x0001};
    for (uint32_t e = 0; e < 256; e++)
        for (int k = 0; k < 600; k++) {
            uint32_t top = (uint32_t)lt_rng_u64(&r) & 0x7f0000u;
            if (k < 12) top = k < 6 ? 0x7f0000u : 0x010000u * (uint32_t)(k - 6); /* largest and smallest mantissas */
            uint32_t u = (e << 23) | top | lows[k % 6] | ((uint32_t)(k & 1) << 31);
            bad += bf16_mismatch(bits_f32(u), &reported);
        }
    /* named edges: rounding into inf, the largest finite value, subnormals */
    const uint32_t named[] = {0x7f7f8000u, 0x7f7f7fffu, 0x7f7fffffu, 0x7f7f0000u, 0x00008000u,
                              0x00018000u, 0x0000ffffu, 0x00000001u, 0x7f800000u, 0x7fc00001u,
                              0x7f800001u, 0xff800001u, 0x80000000u, 0x3f808000u, 0x3f818000u};
    for (int i = 0; i < (int)(sizeof named / sizeof named[0]); i++) bad += bf16_mismatch(bits_f32(named[i]), &reported);
    LT_CHECK_MSG(bad == 0, "%d patterns differ from the f64 reference", bad);
    /* spot values worked by hand */
    LT_CHECK(lm_f32_to_bf16(1.0f) == 0x3f80u);
    LT_CHECK(lm_f32_to_bf16(bits_f32(0x3f808000u)) == 0x3f80u); /* tie, even stays */
    LT_CHECK(lm_f32_to_bf16(bits_f32(0x3f818000u)) == 0x3f82u); /* tie, odd rounds up */
    LT_CHECK(lm_f32_to_bf16(bits_f32(0x7f7f8000u)) == 0x7f80u); /* max tie -> inf */
    LT_CHECK(lm_f32_to_f16(65504.0f) == 0x7bffu && lm_f32_to_f16(65520.0f) == 0x7c00u);
    LT_CHECK(lm_f32_to_f16(0x1p-25f) == 0x0000u && lm_f32_to_f16(0x1.8p-24f) == 0x0002u);
}

/* ---- the dtype table ------------------------------------------------------------------------------ */
static void test_dtype_table(void) {
    const struct {
        lm_dtype dt;
        const char *name;
        size_t size;
        int is_float;
    } rows[LM_DTYPE_COUNT] = {{LM_F32, "f32", 4, 1}, {LM_BF16, "bf16", 2, 1}, {LM_F16, "f16", 2, 1},
                              {LM_I32, "i32", 4, 0}, {LM_I64, "i64", 8, 0},   {LM_U8, "u8", 1, 0},
                              {LM_I8, "i8", 1, 0},   {LM_F8_E4M3, "f8_e4m3", 1, 0}};
    for (int i = 0; i < LM_DTYPE_COUNT; i++) {
        LT_CHECK(lm_dtype_valid(rows[i].dt));
        LT_CHECK(strcmp(lm_dtype_name(rows[i].dt), rows[i].name) == 0);
        LT_CHECK(lm_dtype_size(rows[i].dt) == rows[i].size);
        LT_CHECK(lm_dtype_is_float(rows[i].dt) == rows[i].is_float);
        lm_dtype parsed = (lm_dtype)-1;
        LT_CHECK_OK(lm_dtype_parse(rows[i].name, &parsed));
        LT_CHECK(parsed == rows[i].dt);
    }
    const lm_dtype invalid[] = {(lm_dtype)LM_DTYPE_COUNT, (lm_dtype)-1, (lm_dtype)1000};
    for (int i = 0; i < 3; i++) {
        LT_CHECK(!lm_dtype_valid(invalid[i]) && lm_dtype_size(invalid[i]) == 0 && !lm_dtype_is_float(invalid[i]));
        LT_CHECK(strcmp(lm_dtype_name(invalid[i]), "invalid") == 0);
    }
    const char *bad[] = {"F32", "float32", "", "f3", "f322", "invalid", "bfloat16"};
    for (int i = 0; i < 7; i++) {
        lm_dtype out = LM_U8;
        LT_CHECK_STATUS(lm_dtype_parse(bad[i], &out), LM_INVALID_ARGUMENT);
        LT_CHECK(out == LM_U8);
        LT_CHECK(strstr(lm_last_error(), bad[i]) != NULL);
    }
    lm_dtype out;
    LT_CHECK_STATUS(lm_dtype_parse(NULL, &out), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_dtype_parse("f32", NULL), LM_INVALID_ARGUMENT);
}

int main(void) {
    LT_RUN(test_bf16_roundtrip_exhaustive);
    LT_RUN(test_f16_roundtrip_exhaustive);
#if defined(__FLT16_MAX__)
    LT_RUN(test_f32_to_f16_matches_compiler_on_edges);
    LT_RUN(test_f32_to_f16_matches_compiler_on_random_bits);
#else
    printf("  (this compiler has no _Float16: f32 -> f16 compiler comparison not run)\n");
#endif
    LT_RUN(test_f32_to_bf16_matches_f64_reference);
    LT_RUN(test_dtype_table);
    return lt_finish();
}
