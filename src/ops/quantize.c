/* ops/quantize.c — lm_quantize_int8_rows: symmetric per-row int8 quantization of a
 * float weight matrix w [N, K] (the storage lm_linear_out takes with w_scales), and
 * lm_quantize_int4_groups: the same per group of 32/64/128 k of a row, to 4 bits.
 *
 * Row n: amax = max_k |w[n, k]| (exact in f32), scale = amax / 127 as one correctly
 * rounded f32 division (1 for an all-zero row; the smallest positive f32 when amax
 * is so small that the division underflows to 0), q[n, k] = round-half-even(w / scale)
 * clamped to [-127, 127]. The quotient is formed in double: two f32 operands give a
 * quotient whose double rounding can neither create nor hide a tie at k + 1/2 (its
 * distance from one is >= 2^-25 relative, far above double's 2^-53), so rint() of it
 * is the exact round-half-even. The clamp only acts when the scale is subnormal.
 * Any strides; host memory; w is checked for NaN/Inf (naming the first such row) before
 * anything is written. O(N * K), rows split over the context's threads (each row's bytes
 * are the same for any thread count).
 * int4: the same rule per group with 7 for 127 (a group's quotient is the f32 scale
 * amax / 7 dividing an f32, so the tie argument holds unchanged), clamped to [-7, 7];
 * two values per byte along K, low nibble first, two's complement. bf16 int4 scales:
 * the f32 scale rounded to bf16 (nearest, ties to even; a scale that rounds to 0 takes
 * bf16's smallest positive value), and the group quantized with that rounded scale, so
 * q * scale is what the stored bytes mean (the quotient still divides two f32 values).
 * fp8 (lm_quantize_fp8_rows): the int8 rule with 448 (e4m3's largest finite value) for
 * 127 and e4m3 values for the integers: the double quotient w / scale rounded once to
 * e4m3 (nearest, ties to even, by the argument above; saturating at 448, which only
 * acts when the scale is subnormal) — lm_f32_to_f8e4m3's rule applied to the double.
 */
#include "ops/alias.h"
#include "ops/internal.h"
#include "runtime/internal.h"

#include <float.h>
#include <string.h>

/* group 0: int8 or fp8 (q i8 / f8_e4m3 [N, K], scales [N], qdt says which); else int4
 * (q u8 [N, K/2], scales [N, K/group]). */
static lm_status check(lm_ctx *ctx, const char *op, const lm_tensor_view *w, const lm_tensor_view *q,
                       const lm_tensor_view *scales, int group, lm_dtype qdt) {
    if (!ctx) return lm__error(LM_INVALID_ARGUMENT, "%s: ctx is NULL", op);
    const lm_tensor_view *vs[] = {w, q, scales};
    static const char *const names[] = {"w", "q", "w_scales"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    if (!lm__device_host_addressable(lm_ctx_device(ctx)))
        return lm__error(LM_UNSUPPORTED, "%s: runs on host memory only (quantize on the CPU, then copy q and w_scales)",
                         op);
    LM_TRY(lm__op_check_float(op, "w", w));
    LM_TRY(lm__op_check_dtype(op, "q", q, group ? LM_U8 : qdt));
    if (!group) LM_TRY(lm__op_check_dtype(op, "w_scales", scales, LM_F32));
    else if (scales && scales->dtype != LM_F32 && scales->dtype != LM_BF16)
        return lm__error(LM_DTYPE_MISMATCH, "%s: w_scales has dtype %s; expected f32 or bf16 (int4 group scales)", op,
                         lm_dtype_name(scales->dtype));
    int64_t any2[2] = {-1, -1};
    LM_TRY(lm__op_check_shape(op, "w [N, K]", w, 2, any2));
    int64_t N = w->shape[0], K = w->shape[1], ns[1] = {N};
    if (group) {
        if (group != 32 && group != 64 && group != 128)
            return lm__error(LM_INVALID_ARGUMENT, "%s: group %d; expected 32, 64 or 128", op, group);
        if (K % group)
            return lm__error(LM_INVALID_ARGUMENT, "%s: K = %lld is not a multiple of the group %d (int4 needs whole "
                             "groups of an even size)", op, (long long)K, group);
        int64_t qs[2] = {N, K / 2}, ss[2] = {N, K / group};
        LM_TRY(lm__op_check_shape(op, "q [N, K/2]", q, 2, qs));
        LM_TRY(lm__op_check_shape(op, "w_scales [N, K/group]", scales, 2, ss));
    } else {
        LM_TRY(lm__op_check_same_shape(op, "q", q, w));
        LM_TRY(lm__op_check_shape(op, "w_scales [N]", scales, 1, ns));
    }
    LM_TRY(lm__op_check_out(op, "q", q));
    LM_TRY(lm__op_check_out(op, "w_scales", scales));
    LM_TRY(lm__op_check_alias(op, "q", q, "w", w, 0));
    LM_TRY(lm__op_check_alias(op, "w_scales", scales, "w", w, 0));
    return lm__op_check_alias(op, "w_scales", scales, "q", q, 0);
}

/* Row n of w as f32 into row[K]: exact (f32, bf16 and f16 values are all f32 values),
 * typed loops for f32 and bf16, the generic load for f16. */
static void load_row(const lm_tensor_view *w, int64_t n, float *row) {
    const int64_t K = w->shape[1], s = w->stride[1], off = n * w->stride[0];
    if (w->dtype == LM_F32) {
        const float *p = (const float *)w->data + off;
        for (int64_t k = 0; k < K; k++) row[k] = p[k * s];
    } else if (w->dtype == LM_BF16) {
        const uint16_t *p = (const uint16_t *)w->data + off;
        for (int64_t k = 0; k < K; k++) {
            uint32_t b = (uint32_t)p[k * s] << 16;
            memcpy(row + k, &b, sizeof b);
        }
    } else {
        for (int64_t k = 0; k < K; k++) row[k] = (float)lm__ld(w->dtype, w->data, off + k * s);
    }
}

/* amax / qmax as one f32 division (1 for amax 0; the smallest f32 on underflow). */
static float scale_of(float amax, float qmax) {
    float scale = amax == 0.0f ? 1.0f : amax / qmax;
    return scale == 0.0f ? FLT_TRUE_MIN : scale;
}

/* max |row[k]| over k0 <= k < k1 (exact; the values are finite, so a compare is fmaxf). */
static float row_amax(const float *row, int64_t k0, int64_t k1) {
    float amax = 0.0f;
    for (int64_t k = k0; k < k1; k++) {
        float a = fabsf(row[k]);
        amax = a > amax ? a : amax;
    }
    return amax;
}

/* round-half-even(v / scale) clamped to [-qmax, qmax]. */
static int quantize1(double v, float scale, double qmax) {
    double r = rint(v / (double)scale); /* the default mode: to nearest, ties to even */
    return (int)(r > qmax ? qmax : r < -qmax ? -qmax : r);
}

/* |a| < 2^-6: subnormal steps of 2^-9; else 3 mantissa bits; >= 464 saturates to 448
 * (core/dtype.c lm_f32_to_f8e4m3, on a double). a is finite. */
static uint8_t f8_round(double v) {
    uint8_t sign = signbit(v) ? 0x80u : 0u;
    double a = fabs(v);
    if (a >= 464.0) return sign | 0x7eu;
    if (a < 0.015625) return sign | (uint8_t)rint(a * 512.0);
    int e2;
    double r = rint((frexp(a, &e2) * 2.0 - 1.0) * 8.0);
    int E = e2 - 1;
    if (r == 8.0) r = 0.0, E++;
    return sign | (uint8_t)((E + 7) << 3 | (int)r);
}

enum { Q_INT8, Q_INT4, Q_FP8 };

/* One quantization, split by rows over the context's threads: phase 0 reads every row
 * and notes the first non-finite value of each task (nothing is written), phase 1
 * quantizes; each row is converted to f32 once per phase into its worker's scratch. */
typedef struct qjob {
    const lm_tensor_view *w, *q, *scales;
    int kind, group, phase;
    int64_t N, K, per_task;
    float *rows;  /* [workers][K] */
    int64_t *bad; /* [tasks] flat index n * K + k of the task's first non-finite value, or -1 */
} qjob;

static void quantize_row(const qjob *j, int64_t n, const float *row) {
    const lm_tensor_view *q = j->q, *sc = j->scales;
    const int64_t K = j->K;
    if (j->kind == Q_INT4) {
        uint8_t *qd = q->data;
        for (int64_t g = 0; g < K / j->group; g++) {
            int64_t k0 = g * j->group, s = n * sc->stride[0] + g * sc->stride[1];
            float scale = scale_of(row_amax(row, k0, k0 + j->group), 7.0f);
            if (sc->dtype == LM_BF16) {
                uint16_t h = lm_f32_to_bf16(scale);
                if (h == 0) h = 1; /* below bf16's smallest subnormal */
                ((uint16_t *)sc->data)[s] = h;
                scale = lm_bf16_to_f32(h);
            } else
                ((float *)sc->data)[s] = scale;
            for (int64_t k = k0; k < k0 + j->group; k += 2) {
                unsigned lo = (unsigned)quantize1(row[k], scale, 7.0) & 15u;
                unsigned hi = (unsigned)quantize1(row[k + 1], scale, 7.0) & 15u;
                qd[n * q->stride[0] + k / 2 * q->stride[1]] = (uint8_t)(lo | hi << 4);
            }
        }
        return;
    }
    float scale = scale_of(row_amax(row, 0, K), j->kind == Q_FP8 ? 448.0f : 127.0f);
    if (j->kind == Q_FP8) {
        uint8_t *qr = (uint8_t *)q->data + n * q->stride[0];
        for (int64_t k = 0; k < K; k++) qr[k * q->stride[1]] = f8_round((double)row[k] / (double)scale);
    } else {
        int8_t *qr = (int8_t *)q->data + n * q->stride[0];
        for (int64_t k = 0; k < K; k++) qr[k * q->stride[1]] = (int8_t)quantize1(row[k], scale, 127.0);
    }
    ((float *)sc->data)[n * sc->stride[0]] = scale;
}

static void quantize_task(void *arg, int64_t t, int worker) {
    qjob *j = arg;
    float *row = j->rows + (int64_t)worker * j->K;
    int64_t n1 = LM_MIN(j->N, (t + 1) * j->per_task);
    for (int64_t n = t * j->per_task; n < n1; n++) {
        load_row(j->w, n, row);
        if (j->phase == 1) {
            quantize_row(j, n, row);
            continue;
        }
        for (int64_t k = 0; k < j->K; k++)
            if (!isfinite(row[k])) {
                j->bad[t] = n * j->K + k;
                return;
            }
    }
}

static lm_status run_quantize(lm_ctx *ctx, const char *op, const lm_tensor_view *w, const lm_tensor_view *q,
                              const lm_tensor_view *scales, int kind, int group) {
    lm_threadpool *pool = lm_ctx_threadpool(ctx);
    int workers = lm_threadpool_size(pool);
    qjob j = {w, q, scales, kind, group, 0, w->shape[0], w->shape[1], 1, NULL, NULL};
    if (j.N == 0 || j.K == 0) return LM_OK;
    j.per_task = LM_MAX(1, 65536 / j.K); /* ~256 KiB of f32 a task */
    int64_t tasks = (j.N + j.per_task - 1) / j.per_task;
    j.rows = lm__calloc((size_t)workers * (size_t)j.K, sizeof(float));
    j.bad = lm__calloc((size_t)tasks, sizeof(int64_t));
    if (!j.rows || !j.bad) {
        lm__free(j.rows), lm__free(j.bad);
        return lm__error(LM_OUT_OF_MEMORY, "%s: scratch for %d rows of %lld floats", op, workers, (long long)j.K);
    }
    for (int64_t t = 0; t < tasks; t++) j.bad[t] = -1;
    lm_threadpool_run(pool, tasks, quantize_task, &j);
    int64_t first = -1;
    for (int64_t t = 0; t < tasks && first < 0; t++) first = j.bad[t]; /* tasks are in row order */
    lm_status st = LM_OK;
    if (first >= 0) {
        int64_t n = first / j.K, k = first % j.K;
        load_row(w, n, j.rows);
        st = lm__error(LM_INVALID_ARGUMENT, "%s: w row %lld holds %g at column %lld; only finite weights can be "
                       "quantized", op, (long long)n, (double)j.rows[k], (long long)k);
    } else {
        j.phase = 1;
        lm_threadpool_run(pool, tasks, quantize_task, &j);
    }
    lm__free(j.rows), lm__free(j.bad);
    return st;
}

lm_status lm_quantize_int8_rows(lm_ctx *ctx, const lm_tensor_view *w, const lm_tensor_view *q,
                                const lm_tensor_view *w_scales) {
    const char *op = "quantize_int8_rows";
    LM_TRY(check(ctx, op, w, q, w_scales, 0, LM_I8));
    return run_quantize(ctx, op, w, q, w_scales, Q_INT8, 0);
}

lm_status lm_quantize_int4_groups(lm_ctx *ctx, const lm_tensor_view *w, const lm_tensor_view *q,
                                  const lm_tensor_view *w_scales, int group) {
    const char *op = "quantize_int4_groups";
    if (group <= 0) return lm__error(LM_INVALID_ARGUMENT, "%s: group %d; expected 32, 64 or 128", op, group);
    LM_TRY(check(ctx, op, w, q, w_scales, group, LM_U8));
    return run_quantize(ctx, op, w, q, w_scales, Q_INT4, group);
}

lm_status lm_quantize_fp8_rows(lm_ctx *ctx, const lm_tensor_view *w, const lm_tensor_view *q,
                               const lm_tensor_view *w_scales) {
    const char *op = "quantize_fp8_rows";
    LM_TRY(check(ctx, op, w, q, w_scales, 0, LM_F8_E4M3));
    return run_quantize(ctx, op, w, q, w_scales, Q_FP8, 0);
}
