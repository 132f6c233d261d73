/* core/dtype.c — dtype table and bf16/f16 conversions.
 *
 * f32 -> bf16/f16 rounds to nearest, ties to even; NaN maps to a quiet NaN with the
 * sign kept; values beyond the target range become +-inf; f16 subnormals are exact
 * where representable and rounded otherwise. Conversions to f32 are exact.
 */
#include "base/internal.h"
#include "loom/tensor.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
    int is_float;
} k_dtypes[LM_DTYPE_COUNT] = {
    [LM_F32] = {"f32", 4, 1}, [LM_BF16] = {"bf16", 2, 1}, [LM_F16] = {"f16", 2, 1},
    [LM_I32] = {"i32", 4, 0}, [LM_I64] = {"i64", 8, 0},   [LM_U8] = {"u8", 1, 0},
    [LM_I8] = {"i8", 1, 0},
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
    return lm__error(LM_INVALID_ARGUMENT, "unknown dtype '%s' (expected f32, bf16, f16, i32, i64, u8 or i8)",
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
