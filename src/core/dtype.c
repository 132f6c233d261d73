/* core/dtype.c — dtype table and bf16/f16 conversions.
 *
 * f32 -> bf16/f16 rounds to nearest, ties to even; NaN maps to a quiet NaN with the
 * sign kept; values beyond the target range become +-inf; f16 subnormals are exact
 * where representable and rounded otherwise. Conversions to f32 are exact.
 * fp8 e4m3 (no infinities) saturates at +-448 instead (the quantizers' convention).
 */
#include "base/internal.h"
#include "loom/tensor.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
    int is_float;
} k_dtypes[LM_DTYPE_COUNT] = {
    [LM_F32] = {"f32", 4, 1}, [LM_BF16] = {"bf16", 2, 1}, [LM_F16] = {"f16", 2, 1},
    [LM_I32] = {"i32", 4, 0}, [LM_I64] = {"i64", 8, 0},   [LM_U8] = {"u8", 1, 0},
    [LM_I8] = {"i8", 1, 0},   [LM_F8_E4M3] = {"f8_e4m3", 1, 0},
};

int lm_dtype_valid(lm_dtype dt) { return (unsigned)dt < LM_DTYPE_COUNT; }
size_t lm_dtype_size(lm_dtype dt) { return lm_dtype_valid(dt) ? k_dtypes[dt].size : 0; }
const char *lm_dtype_name(lm_dtype dt) { return lm_dtype_valid(dt) ? k_dtypes[dt].name : "invalid"; }
int lm_dtype_is_float(lm_dtype dt) { return lm_dtype_valid(dt) && k_dtypes[dt].is_float; }

lm_status lm_dtype_parse(const char *name, lm_dtype *out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_dtype_parse: out is NULL");
    for (int i = 0; i < LM_DTYPE_COUNT; i++)
        if (name && strcmp(name, k_dtypes[i].name) == 0) {
            *out = (lm_dtype)i;
            return LM_OK;
        }
    return lm__error(LM_INVALID_ARGUMENT, "unknown dtype '%s' (expected f32, bf16, f16, i32, i64, u8, i8 or f8_e4m3)",
                     name ? name : "(null)");
}

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

uint16_t lm_f32_to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb; /* round to nearest even; overflow carries into inf */
    return (uint16_t)(u >> 16);
}

float lm_bf16_to_f32(uint16_t x) { return bits_f32((uint32_t)x << 16); }

uint16_t lm_f32_to_f16(float x) {
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u; /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                       /* below 2^-14: f16 subnormal or zero */
        if (a < 0x33000000u) return sign;        /* below 2^-25 rounds to zero */
        int e = (int)(a >> 23);                  /* biased f32 exponent, 102..112 */
        uint32_t mant = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - e; /* value = mant * 2^(e-150); f16 unit 2^-24 -> mant >> (126-e) */
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return sign | (uint16_t)q;
    }
    /* normal: rebias exponent 127 -> 15, keep 10 mantissa bits, round to even */
    uint32_t r = a - 0x38000000u; /* (127 - 15) << 23 */
    uint32_t lsb = (r >> 13) & 1u;
    r += 0xfffu + lsb;
    return sign | (uint16_t)(r >> 13);
}

float lm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13)); /* inf / NaN */
    if (e == 0) {
        if (m == 0) return bits_f32(sign);
        float v = (float)m * (1.0f / 16777216.0f); /* m * 2^-24, exact */
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* Every fp8 e4m3 value: byte b = s eeee mmm is (-1)^s (1 + m/8) 2^(e-7) for e > 0,
 * (-1)^s m/8 2^-6 for e = 0; 0x7f and 0xff are NaN. */
static const float k_f8e4m3[256] = {
    0.0f, 0.001953125f, 0.00390625f, 0.005859375f, 0.0078125f, 0.009765625f, 0.01171875f, 0.013671875f,
    0.015625f, 0.017578125f, 0.01953125f, 0.021484375f, 0.0234375f, 0.025390625f, 0.02734375f, 0.029296875f,
    0.03125f, 0.03515625f, 0.0390625f, 0.04296875f, 0.046875f, 0.05078125f, 0.0546875f, 0.05859375f,
    0.0625f, 0.0703125f, 0.078125f, 0.0859375f, 0.09375f, 0.1015625f, 0.109375f, 0.1171875f,
    0.125f, 0.140625f, 0.15625f, 0.171875f, 0.1875f, 0.203125f, 0.21875f, 0.234375f,
    0.25f, 0.28125f, 0.3125f, 0.34375f, 0.375f, 0.40625f, 0.4375f, 0.46875f,
    0.5f, 0.5625f, 0.625f, 0.6875f, 0.75f, 0.8125f, 0.875f, 0.9375f,
    1.0f, 1.125f, 1.25f, 1.375f, 1.5f, 1.625f, 1.75f, 1.875f,
    2.0f, 2.25f, 2.5f, 2.75f, 3.0f, 3.25f, 3.5f, 3.75f,
    4.0f, 4.5f, 5.0f, 5.5f, 6.0f, 6.5f, 7.0f, 7.5f,
    8.0f, 9.0f, 10.0f, 11.0f, 12.0f, 13.0f, 14.0f, 15.0f,
    16.0f, 18.0f, 20.0f, 22.0f, 24.0f, 26.0f, 28.0f, 30.0f,
    32.0f, 36.0f, 40.0f, 44.0f, 48.0f, 52.0f, 56.0f, 60.0f,
    64.0f, 72.0f, 80.0f, 88.0f, 96.0f, 104.0f, 112.0f, 120.0f,
    128.0f, 144.0f, 160.0f, 176.0f, 192.0f, 208.0f, 224.0f, 240.0f,
    256.0f, 288.0f, 320.0f, 352.0f, 384.0f, 416.0f, 448.0f, NAN,
    -0.0f, -0.001953125f, -0.00390625f, -0.005859375f, -0.0078125f, -0.009765625f, -0.01171875f, -0.013671875f,
    -0.015625f, -0.017578125f, -0.01953125f, -0.021484375f, -0.0234375f, -0.025390625f, -0.02734375f, -0.029296875f,
    -0.03125f, -0.03515625f, -0.0390625f, -0.04296875f, -0.046875f, -0.05078125f, -0.0546875f, -0.05859375f,
    -0.0625f, -0.0703125f, -0.078125f, -0.0859375f, -0.09375f, -0.1015625f, -0.109375f, -0.1171875f,
    -0.125f, -0.140625f, -0.15625f, -0.171875f, -0.1875f, -0.203125f, -0.21875f, -0.234375f,
    -0.25f, -0.28125f, -0.3125f, -0.34375f, -0.375f, -0.40625f, -0.4375f, -0.46875f,
    -0.5f, -0.5625f, -0.625f, -0.6875f, -0.75f, -0.8125f, -0.875f, -0.9375f,
    -1.0f, -1.125f, -1.25f, -1.375f, -1.5f, -1.625f, -1.75f, -1.875f,
    -2.0f, -2.25f, -2.5f, -2.75f, -3.0f, -3.25f, -3.5f, -3.75f,
    -4.0f, -4.5f, -5.0f, -5.5f, -6.0f, -6.5f, -7.0f, -7.5f,
    -8.0f, -9.0f, -10.0f, -11.0f, -12.0f, -13.0f, -14.0f, -15.0f,
    -16.0f, -18.0f, -20.0f, -22.0f, -24.0f, -26.0f, -28.0f, -30.0f,
    -32.0f, -36.0f, -40.0f, -44.0f, -48.0f, -52.0f, -56.0f, -60.0f,
    -64.0f, -72.0f, -80.0f, -88.0f, -96.0f, -104.0f, -112.0f, -120.0f,
    -128.0f, -144.0f, -160.0f, -176.0f, -192.0f, -208.0f, -224.0f, -240.0f,
    -256.0f, -288.0f, -320.0f, -352.0f, -384.0f, -416.0f, -448.0f, -NAN,
};

float lm_f8e4m3_to_f32(uint8_t x) { return k_f8e4m3[x]; }

uint8_t lm_f32_to_f8e4m3(float x) {
    uint8_t sign = signbit(x) ? 0x80u : 0u;
    if (isnan(x)) return sign | 0x7fu;
    double a = fabs((double)x);
    if (a >= 464.0) return sign | 0x7eu; /* 448 + half a step (32 / 2) and up: saturate */
    if (a < 0.015625) {                  /* below 2^-6: subnormal steps of 2^-9 */
        double q = rint(a * 512.0);      /* exact scaling; rint: nearest, ties to even */
        return sign | (uint8_t)q;        /* q = 8 is 0x08, the smallest normal: right */
    }
    int e2;
    double f = frexp(a, &e2); /* a = f 2^e2, f in [0.5, 1) */
    int E = e2 - 1;           /* a in [2^E, 2^(E+1)), E in [-6, 8] */
    double r = rint((f * 2.0 - 1.0) * 8.0);
    if (r == 8.0) r = 0.0, E++;
    if (E > 8 || (E == 8 && r == 7.0)) return sign | 0x7eu; /* 464 ties to even at 448 (above) */
    return sign | (uint8_t)((E + 7) << 3 | (int)r);
}
