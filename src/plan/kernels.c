/* plan/kernels.c — the simulator's per-tile kernels with f32/f16 storage semantics,
 * and each call's cycle cost from the machine model.
 *
 * Storage is f16 or f32 (i32 for RoPE positions); every kernel computes in f32 and
 * rounds once when it stores (f16: round to nearest even via lm_f32_to_f16). Matmul
 * accumulates in f32 like the matrix unit; operands are converted to dense f32
 * scratch first (O(mk + kn) before O(mnk) work). Operands are strided boxes of up to 4 dims; row kernels treat all
 * leading dims as rows of the last dim.
 */
#include "plan/low.h"

#include <math.h>

float lm__plan_load(const uint8_t *p, lm_dtype dt) {
    if (dt == LM_F16) {
        uint16_t h;
        memcpy(&h, p, 2);
        return lm_f16_to_f32(h);
    }
    if (dt == LM_I32) {
        int32_t i;
        memcpy(&i, p, 4);
        return (float)i;
    }
    float f;
    memcpy(&f, p, 4);
    return f;
}

void lm__plan_store(uint8_t *p, lm_dtype dt, float v) {
    if (dt == LM_F16) {
        uint16_t h = lm_f32_to_f16(v);
        memcpy(p, &h, 2);
    } else if (dt == LM_I32) {
        int32_t i = (int32_t)lrintf(v);
        memcpy(p, &i, 4);
    } else {
        memcpy(p, &v, 4);
    }
}

uint8_t *lm__plan_opnd_base(const lm__plan_low *low, const lm__plan_opnd *o, uint8_t *mem, int64_t iter) {
    const lm__plan_buf *b = &low->bufs[o->buf];
    int64_t off = b->offset + (b->copies > 1 ? (iter % b->copies) * b->bytes : 0);
    return mem + off + o->off * (int64_t)lm_dtype_size(o->dtype);
}

/* Iterates the elements of a box in row-major order calling fn(index, byte offset). */
typedef struct walker {
    int nd;
    int32_t dims[LM__PLAN_MAX_DIMS];
    int64_t bstride[LM__PLAN_MAX_DIMS]; /* bytes */
} walker;

static walker walker_of(const lm__plan_opnd *o) {
    walker w = {0};
    if (o->buf < 0) return w; /* absent operand: nothing to walk */
    w.nd = o->ndim;
    int64_t es = (int64_t)lm_dtype_size(o->dtype);
    for (int d = 0; d < o->ndim; d++) {
        w.dims[d] = o->dims[d];
        w.bstride[d] = o->strides[d] * es;
    }
    return w;
}

/* Byte offset of the i-th element (row-major over dims). */
static int64_t offset_of(const walker *w, int64_t i) {
    int64_t off = 0;
    for (int d = w->nd - 1; d >= 0; d--) {
        off += (i % w->dims[d]) * w->bstride[d];
        i /= w->dims[d];
    }
    return off;
}

static float gelu(float x) {
    float u = 0.7978845608f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

/* The fused epilogue (LM__PLAN_EPI_*) on output column col: + bias, then the activation. */
static float epilogue(const lm__plan_call *c, const uint8_t *bias, int64_t col, float v) {
    int64_t e = c->i[2];
    if (e & LM__PLAN_EPI_BIAS)
        v += lm__plan_load(bias + col * c->op[3].strides[0] * (int64_t)lm_dtype_size(c->op[3].dtype), c->op[3].dtype);
    if (e & LM__PLAN_EPI_GELU) v = gelu(v);
    if (e & LM__PLAN_EPI_SILU) v = v / (1.0f + expf(-v));
    return v;
}

static void matmul(const lm__plan_call *c, uint8_t *const *base, float *scratch) {
    const lm__plan_opnd *A = &c->op[0], *B = &c->op[1], *C = &c->op[2];
    int64_t nb = C->dims[0], M = C->dims[1], N = C->dims[2], K = A->dims[2];
    int64_t ea = (int64_t)lm_dtype_size(A->dtype), eb = (int64_t)lm_dtype_size(B->dtype),
            ec = (int64_t)lm_dtype_size(C->dtype);
    float *a = scratch, *b = a + M * K, *acc = b + K * N;
    for (int64_t bi = 0; bi < nb; bi++) {
        const uint8_t *pa = base[0] + bi * A->strides[0] * ea, *pb = base[1] + bi * B->strides[0] * eb;
        uint8_t *pc = base[2] + bi * C->strides[0] * ec;
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++)
                a[m * K + k] = lm__plan_load(pa + (m * A->strides[1] + k * A->strides[2]) * ea, A->dtype);
        for (int64_t k = 0; k < K; k++)
            for (int64_t n = 0; n < N; n++)
                b[k * N + n] = lm__plan_load(pb + (k * B->strides[1] + n * B->strides[2]) * eb, B->dtype);
        for (int64_t m = 0; m < M; m++) {
            float *row = acc + m * N;
            for (int64_t n = 0; n < N; n++)
                row[n] = c->i[0] ? lm__plan_load(pc + (m * C->strides[1] + n * C->strides[2]) * ec, C->dtype) : 0.0f;
            for (int64_t k = 0; k < K; k++) {
                float av = a[m * K + k];
                const float *brow = b + k * N;
                for (int64_t n = 0; n < N; n++) row[n] += av * brow[n];
            }
            for (int64_t n = 0; n < N; n++)
                lm__plan_store(pc + (m * C->strides[1] + n * C->strides[2]) * ec, C->dtype,
                               c->i[2] ? epilogue(c, base[3], n, row[n]) : row[n]);
        }
    }
}

static void rows_kernel(const lm__plan_call *c, uint8_t *const *base) {
    const lm__plan_opnd *x = &c->op[0], *o = &c->op[1];
    int nd = x->ndim;
    int64_t n = x->dims[nd - 1], rows = lm__plan_opnd_elems(x) / n;
    int64_t ex = (int64_t)lm_dtype_size(x->dtype), eo = (int64_t)lm_dtype_size(o->dtype);
    walker wx = walker_of(x), wo = walker_of(o);
    wx.nd = wo.nd = nd - 1; /* row origins */
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *px = base[0] + (nd > 1 ? offset_of(&wx, r) : 0);
        uint8_t *po = base[1] + (nd > 1 ? offset_of(&wo, r) : 0);
        int64_t sx = x->strides[nd - 1] * ex, so = o->strides[nd - 1] * eo;
        if (c->kernel == LM__PLAN_K_SOFTMAX) {
            float mx = -INFINITY, sum = 0, scale = c->f[0];
            for (int64_t j = 0; j < n; j++) mx = fmaxf(mx, scale * lm__plan_load(px + j * sx, x->dtype));
            for (int64_t j = 0; j < n; j++) sum += expf(scale * lm__plan_load(px + j * sx, x->dtype) - mx);
            for (int64_t j = 0; j < n; j++)
                lm__plan_store(po + j * so, o->dtype, expf(scale * lm__plan_load(px + j * sx, x->dtype) - mx) / sum);
            continue;
        }
        double mean = 0, var = 0;
        for (int64_t j = 0; j < n; j++) mean += lm__plan_load(px + j * sx, x->dtype);
        mean /= (double)n;
        for (int64_t j = 0; j < n; j++) {
            double d = lm__plan_load(px + j * sx, x->dtype) - (c->kernel == LM__PLAN_K_LAYERNORM ? mean : 0.0);
            var += d * d;
        }
        float inv = (float)(1.0 / sqrt(var / (double)n + c->f[0]));
        float shift = c->kernel == LM__PLAN_K_LAYERNORM ? (float)mean : 0.0f;
        const lm__plan_opnd *gm = &c->op[2], *bt = &c->op[3];
        int64_t eg = (int64_t)lm_dtype_size(gm->dtype);
        for (int64_t j = 0; j < n; j++) {
            float v = (lm__plan_load(px + j * sx, x->dtype) - shift) * inv *
                      lm__plan_load(base[2] + j * gm->strides[0] * eg, gm->dtype);
            if (bt->buf >= 0)
                v += lm__plan_load(base[3] + j * bt->strides[0] * (int64_t)lm_dtype_size(bt->dtype), bt->dtype);
            lm__plan_store(po + j * so, o->dtype, v);
        }
    }
}

/* Each (b, t): angles pos * inv_freq[i] once per frequency, then every head's pair
 * (i, i + d/2) rotates (Hugging Face rotate_half); both members are read before
 * either is written, so op1 may alias op0. */
static void rope(const lm__plan_call *c, uint8_t *const *base) {
    const lm__plan_opnd *x = &c->op[0], *o = &c->op[1], *ps = &c->op[2], *fq = &c->op[3];
    int64_t half = x->dims[3] / 2, ex = (int64_t)lm_dtype_size(x->dtype), eo = (int64_t)lm_dtype_size(o->dtype);
    for (int64_t b = 0; b < x->dims[0]; b++)
        for (int64_t t = 0; t < x->dims[1]; t++) {
            float pos = lm__plan_load(base[2] + (b * ps->strides[0] + t * ps->strides[1]) * 4, LM_I32);
            for (int64_t i = 0; i < half; i++) {
                float ang = pos * lm__plan_load(base[3] + i * fq->strides[0] * 4, LM_F32);
                float cs = cosf(ang) * c->f[0], sn = sinf(ang) * c->f[0];
                for (int64_t h = 0; h < x->dims[2]; h++) {
                    const uint8_t *px = base[0] + (b * x->strides[0] + t * x->strides[1] + h * x->strides[2]) * ex;
                    uint8_t *po = base[1] + (b * o->strides[0] + t * o->strides[1] + h * o->strides[2]) * eo;
                    float va = lm__plan_load(px + i * x->strides[3] * ex, x->dtype);
                    float vb = lm__plan_load(px + (i + half) * x->strides[3] * ex, x->dtype);
                    lm__plan_store(po + i * o->strides[3] * eo, o->dtype, va * cs - vb * sn);
                    lm__plan_store(po + (i + half) * o->strides[3] * eo, o->dtype, vb * cs + va * sn);
                }
            }
        }
}

static void flash_update(const lm__plan_call *c, uint8_t *const *base) {
    const lm__plan_opnd *S = &c->op[0], *Pm = &c->op[1], *st = &c->op[2];
    int64_t H = S->dims[0], Q = S->dims[1], n = S->dims[2], dv = st->dims[2] - 2;
    int64_t ep = (int64_t)lm_dtype_size(Pm->dtype);
    float scale = c->f[0];
    for (int64_t h = 0; h < H; h++)
        for (int64_t q = 0; q < Q; q++) {
            const uint8_t *ps = base[0] + (h * S->strides[0] + q * S->strides[1]) * 4;
            uint8_t *pp = base[1] + (h * Pm->strides[0] + q * Pm->strides[1]) * ep;
            float *row = (float *)(void *)(base[2] + (h * st->strides[0] + q * st->strides[1]) * 4);
            /* visible keys [lo, hi) of this row; a masked key gets p = 0 */
            int64_t hi = c->i[0] ? LM_MIN(n, LM_MAX(0, q + c->i[1] + 1)) : n;
            int64_t lo = c->i[0] && c->i[2] > 0 ? LM_MIN(hi, LM_MAX(0, q + c->i[1] - c->i[2] + 1)) : 0;
            float m_old = row[dv], mx = -INFINITY, sum = 0;
            for (int64_t j = lo; j < hi; j++) mx = fmaxf(mx, scale * lm__plan_load(ps + j * S->strides[2] * 4, LM_F32));
            float m_new = fmaxf(m_old, mx);
            float corr = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
            for (int64_t j = 0; j < n; j++) {
                float p = j >= lo && j < hi ? expf(scale * lm__plan_load(ps + j * S->strides[2] * 4, LM_F32) - m_new)
                                            : 0.0f;
                lm__plan_store(pp + j * Pm->strides[2] * ep, Pm->dtype, p);
                sum += p;
            }
            if (m_new == -INFINITY) continue; /* nothing seen yet: the state stays empty */
            for (int64_t d = 0; d < dv; d++) row[d * st->strides[2]] *= corr;
            row[dv] = m_new;
            row[dv + 1] = row[dv + 1] * corr + sum;
        }
}

static void flash_combine(const lm__plan_call *c, uint8_t *const *base) {
    const lm__plan_opnd *st = &c->op[0], *rv = &c->op[1];
    int64_t H = st->dims[0], Q = st->dims[1], dv = st->dims[2] - 2;
    for (int64_t k = 0; k < c->i[0]; k++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t q = 0; q < Q; q++) {
                float *a = (float *)(void *)(base[0] + (h * st->strides[0] + q * st->strides[1]) * 4);
                const float *b =
                    (const float *)(const void *)(base[1] +
                                                  (k * c->i[1] + h * rv->strides[0] + q * rv->strides[1]) * 4);
                float m = fmaxf(a[dv], b[dv]);
                if (m == -INFINITY) continue;
                float ca = a[dv] == -INFINITY ? 0.0f : expf(a[dv] - m),
                      cb = b[dv] == -INFINITY ? 0.0f : expf(b[dv] - m);
                for (int64_t d = 0; d < dv; d++) a[d] = a[d] * ca + b[d] * cb;
                a[dv] = m;
                a[dv + 1] = a[dv + 1] * ca + b[dv + 1] * cb;
            }
}

void lm__plan_kernel_run(const lm__plan_call *c, uint8_t *mem, const lm__plan_low *low, int64_t iter, float *scratch) {
    uint8_t *base[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4; i++)
        if (c->op[i].buf >= 0) base[i] = lm__plan_opnd_base(low, &c->op[i], mem, iter);
    switch ((lm__plan_kk)c->kernel) {
    case LM__PLAN_K_MATMUL: matmul(c, base, scratch); return;
    case LM__PLAN_K_SOFTMAX:
    case LM__PLAN_K_LAYERNORM:
    case LM__PLAN_K_RMSNORM: rows_kernel(c, base); return;
    case LM__PLAN_K_FLASH_UPDATE: flash_update(c, base); return;
    case LM__PLAN_K_FLASH_COMBINE: flash_combine(c, base); return;
    case LM__PLAN_K_ROPE: rope(c, base); return;
    default: break;
    }
    /* elementwise kernels over the output box */
    const lm__plan_opnd *out = c->kernel == LM__PLAN_K_REDUCE || c->kernel == LM__PLAN_K_FLASH_INIT ? &c->op[0]
                               : (c->kernel == LM__PLAN_K_BIAS || c->kernel == LM__PLAN_K_BINARY)   ? &c->op[2]
                                                                                                    : &c->op[1];
    uint8_t *po = c->kernel == LM__PLAN_K_REDUCE || c->kernel == LM__PLAN_K_FLASH_INIT ? base[0]
                  : (c->kernel == LM__PLAN_K_BIAS || c->kernel == LM__PLAN_K_BINARY)   ? base[2]
                                                                                       : base[1];
    walker wo = walker_of(out), w0 = walker_of(&c->op[0]), w1 = walker_of(&c->op[1]), w2 = walker_of(&c->op[2]);
    int64_t n = lm__plan_opnd_elems(out), last = out->dims[out->ndim - 1];
    for (int64_t i = 0; i < n; i++) {
        float v;
        switch ((lm__plan_kk)c->kernel) {
        case LM__PLAN_K_BIAS:
            v = lm__plan_load(base[0] + offset_of(&w0, i), c->op[0].dtype) +
                lm__plan_load(base[1] + (i % last) * w1.bstride[0], c->op[1].dtype);
            break;
        case LM__PLAN_K_UNARY: {
            float x = lm__plan_load(base[0] + offset_of(&w0, i), c->op[0].dtype);
            v = c->i[0] ? x / (1.0f + expf(-x)) : gelu(x);
            break;
        }
        case LM__PLAN_K_BINARY: {
            float a = lm__plan_load(base[0] + offset_of(&w0, i), c->op[0].dtype);
            float b = lm__plan_load(base[1] + offset_of(&w1, i), c->op[1].dtype);
            v = c->i[0] == 2 ? a / (1.0f + expf(-a)) * b : c->i[0] ? a * b : a + b;
            break;
        }
        case LM__PLAN_K_COPY: v = lm__plan_load(base[0] + offset_of(&w0, i), c->op[0].dtype); break;
        case LM__PLAN_K_REDUCE: {
            v = c->op[1].buf >= 0 ? lm__plan_load(base[1] + offset_of(&w1, i), c->op[1].dtype) : 0.0f;
            int64_t es = (int64_t)lm_dtype_size(c->op[2].dtype);
            for (int64_t k = 0; k < c->i[0]; k++)
                v += lm__plan_load(base[2] + k * c->i[1] * es + offset_of(&w2, i), c->op[2].dtype);
            if (c->i[2]) v = epilogue(c, base[3], i % last, v);
            break;
        }
        case LM__PLAN_K_FLASH_INIT: {
            int64_t col = i % last;
            v = col == last - 2 ? -INFINITY : 0.0f;
            break;
        }
        case LM__PLAN_K_FLASH_FINAL: {
            /* op0 state [h, q, dv+2] -> out [h, q, dv] */
            int64_t dv = last, row = i / dv, col = i % dv;
            int64_t q = row % out->dims[1], h = row / out->dims[1];
            const float *s =
                (const float *)(const void *)(base[0] + (h * c->op[0].strides[0] + q * c->op[0].strides[1]) * 4);
            v = s[col * c->op[0].strides[2]] / s[(dv + 1) * c->op[0].strides[2]];
            break;
        }
        default: v = 0; break;
        }
        lm__plan_store(po + offset_of(&wo, i), out->dtype, v);
    }
}

int64_t lm__plan_kernel_scratch(const lm__plan_low *low) {
    int64_t need = 1;
    for (int64_t i = 0; i < low->ncalls; i++) {
        const lm__plan_call *c = &low->calls[i];
        if (c->kernel != LM__PLAN_K_MATMUL) continue;
        int64_t M = c->op[2].dims[1], N = c->op[2].dims[2], K = c->op[0].dims[2];
        need = LM_MAX(need, M * K + K * N + M * N);
    }
    return need;
}

double lm__plan_call_cycles(const lm_plan_machine *m, const lm__plan_call *c) {
    const lm__plan_opnd *o0 = &c->op[0];
    int64_t e0 = lm__plan_opnd_elems(o0);
    switch ((lm__plan_kk)c->kernel) {
    case LM__PLAN_K_MATMUL:
        return lm__plan_cost_matmul(m, o0->dtype, c->op[2].dims[0], c->op[2].dims[1], c->op[2].dims[2], o0->dims[2]) +
               lm__plan_cost_epilogue(m, c->op[2].dtype, lm__plan_opnd_elems(&c->op[2]), c->i[2]);
    case LM__PLAN_K_BIAS: return lm__plan_cost_elementwise(m, LM__GOP_BIAS_ADD, o0->dtype, e0);
    case LM__PLAN_K_UNARY:
        return lm__plan_cost_elementwise(m, c->i[0] ? LM__GOP_SILU : LM__GOP_GELU, o0->dtype, e0);
    case LM__PLAN_K_BINARY:
        return lm__plan_cost_elementwise(m, c->i[0] == 2 ? LM__GOP_SWIGLU : LM__GOP_ADD, o0->dtype, e0);
    case LM__PLAN_K_SOFTMAX:
    case LM__PLAN_K_LAYERNORM:
    case LM__PLAN_K_RMSNORM: {
        int64_t n = o0->dims[o0->ndim - 1];
        lm__gopk k = c->kernel == LM__PLAN_K_SOFTMAX     ? LM__GOP_SOFTMAX
                         : c->kernel == LM__PLAN_K_LAYERNORM ? LM__GOP_LAYERNORM
                                                             : LM__GOP_RMSNORM;
        return lm__plan_cost_rows(m, k, o0->dtype, e0 / n, n);
    }
    case LM__PLAN_K_COPY:
        return lm__plan_cost_copy(m, lm__plan_opnd_elems(&c->op[1]) * (int64_t)lm_dtype_size(c->op[1].dtype));
    case LM__PLAN_K_REDUCE: {
        int64_t adds = (c->i[0] + (c->op[1].buf >= 0) - 1) * e0;
        lm_dtype in = c->op[2].buf >= 0 ? c->op[2].dtype : c->op[1].dtype;
        return lm__plan_cost_reduce(m, in, o0->dtype, e0, adds) + lm__plan_cost_epilogue(m, o0->dtype, e0, c->i[2]);
    }
    case LM__PLAN_K_FLASH_INIT: return lm__plan_cost_vector(m, LM_F32, (double)(e0 * 4), 0, 0);
    case LM__PLAN_K_FLASH_UPDATE: {
        double rows = (double)(o0->dims[0] * o0->dims[1]), e = (double)e0, dv = (double)(c->op[2].dims[2] - 2);
        return lm__plan_cost_vector(m, LM_F32, e * 6 + rows * dv * 8, e * 5 + rows * dv + (c->i[0] ? e : 0), e + rows);
    }
    case LM__PLAN_K_FLASH_COMBINE: {
        double st = (double)e0;
        return lm__plan_cost_vector(m, LM_F32, (double)(c->i[0] + 1) * st * 4, (double)c->i[0] * st * 2,
                                    (double)(c->i[0] * 2 * o0->dims[0] * o0->dims[1]));
    }
    case LM__PLAN_K_ROPE:
        return lm__plan_cost_rope(m, o0->dtype, o0->dims[0] * o0->dims[1], o0->dims[2], o0->dims[3]);
    case LM__PLAN_K_FLASH_FINAL: {
        double e = (double)lm__plan_opnd_elems(&c->op[1]);
        return lm__plan_cost_vector(m, LM_F32, e * (4.0 + (double)lm_dtype_size(c->op[1].dtype)), e,
                                    (double)(c->op[1].dims[0] * c->op[1].dims[1]));
    }
    default: return 0;
    }
}
