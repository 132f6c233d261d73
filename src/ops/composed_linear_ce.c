/* ops/composed_linear_ce.c — the composed level of the fused output projection +
 * cross-entropy (see ops_backward.h and composed.h).
 * Rows are processed in chunks of C = max(1, 2^20 / V) so the f32 logits scratch is
 * [C, V] (4 MiB), never [N, V]. Per chunk:
 *   forward   z = linear(x_c, w); loss += logsumexp(z_r) - z_r[t_r] per counted row
 *   backward  z recomputed, dz = dloss / counted * (softmax(z) - onehot) in place
 *             (and, when asked, the loss from the same row statistics),
 *             dx_c = linear(dz, W = w^T)     (w^T materialized once, [H, V])
 *             dw  += linear(dz^T, W = x_c^T) (both chunk transposes materialized)
 * Row statistics are accumulated in double. Extra memory: the chunk scratch, w^T and,
 * when dw is not a contiguous f32 view, one [V, H] f32 accumulator.
 */
#include "ops/composed.h"

#define V(t) lm_tensor_as_view(t)

int lm__composed_linear_ce_accepts(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *dx,
                                   const lm_tensor_view *dw) {
    if (x->device.type != LM_DEVICE_CPU || x->dtype != LM_F32 || w->dtype != LM_F32) return 0;
    if (lm_tensor_view_numel(x) == 0 || lm_tensor_view_numel(w) == 0) return 0;
    return (!dx || dx->dtype == LM_F32) && (!dw || dw->dtype == LM_F32);
}

static int64_t chunk_rows(int64_t N, int64_t V) {
    int64_t c = ((int64_t)1 << 20) / V;
    return c < 1 ? 1 : c > N ? N : c;
}


/* z = linear(x rows [r0, r0 + c), w) into the first c rows of the scratch. */
static lm_status chunk_logits(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w, int64_t r0, int64_t c,
                              const lm_tensor *scratch, lm_tensor_view *z) {
    lm_tensor_view xs;
    LM_TRY(lm_tensor_view_slice(x, 0, r0, r0 + c, 1, &xs));
    LM_TRY(lm_tensor_view_slice(V(scratch), 0, 0, c, 1, z));
    return lm__composed_linear(ctx, &xs, w, z);
}

lm_status lm__composed_linear_ce(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                 const lm_tensor_view *targets, int64_t ignore_index, int64_t counted,
                                 const lm_tensor_view *loss) {
    int64_t N = x->shape[0], Vn = w->shape[0], C = chunk_rows(N, Vn);
    int64_t shape[2] = {C, Vn};
    lm_tensor *scratch = NULL;
    LM_TRY(lm_tensor_create(lm_ctx_device(ctx), LM_F32, 2, shape, &scratch));
    double total = 0.0;
    lm_status st = LM_OK;
    for (int64_t r0 = 0; st == LM_OK && r0 < N; r0 += C) {
        int64_t c = LM_MIN(C, N - r0);
        lm_tensor_view z;
        st = chunk_logits(ctx, x, w, r0, c, scratch, &z);
        for (int64_t i = 0; st == LM_OK && i < c; i++) {
            int64_t t = lm__index_at(targets, r0 + i);
            if (t == ignore_index) continue;
            const float *row = (const float *)z.data + i * Vn;
            total += lm__row_logsumexp(LM_F32, row, 0, 1, Vn) - row[t];
        }
    }
    if (st == LM_OK) *(float *)loss->data = counted ? (float)(total / (double)counted) : NAN;
    lm_tensor_destroy(scratch);
    return st;
}

/* Turns the c rows of logits z into dz = scale * (softmax - onehot), 0 on ignored rows;
 * adds each counted row's loss to *total, as the forward does. */
static void chunk_dlogits(float *z, int64_t c, int64_t Vn, const lm_tensor_view *targets, int64_t r0,
                          int64_t ignore_index, double scale, double *total) {
    for (int64_t i = 0; i < c; i++) {
        float *row = z + i * Vn;
        int64_t t = lm__index_at(targets, r0 + i);
        double lse = t == ignore_index ? 0.0 : lm__row_logsumexp(LM_F32, row, 0, 1, Vn);
        if (t != ignore_index) *total += lse - row[t];
        for (int64_t j = 0; j < Vn; j++)
            row[j] = t == ignore_index ? 0.0f : (float)(scale * (exp((double)row[j] - lse) - (j == t ? 1.0 : 0.0)));
    }
}

/* dw (+)= dz^T @ x_c for chunk rows [r0, r0 + c); first: write instead of add. */
static lm_status chunk_dw(lm_ctx *ctx, const lm_tensor_view *z, const lm_tensor_view *x, int64_t r0, int64_t c,
                          const lm_tensor_view *acc, int first) {
    lm_tensor *zT = NULL, *xT = NULL, *part = NULL;
    lm_tensor_view t, xs;
    lm_status st = lm_tensor_view_transpose(z, 0, 1, &t);
    if (st == LM_OK) st = lm__composed_copy(ctx, &t, &zT);
    if (st == LM_OK) st = lm_tensor_view_slice(x, 0, r0, r0 + c, 1, &xs);
    if (st == LM_OK) st = lm_tensor_view_transpose(&xs, 0, 1, &t);
    if (st == LM_OK) st = lm__composed_copy(ctx, &t, &xT);
    if (st == LM_OK && first) st = lm__composed_linear(ctx, V(zT), V(xT), acc);
    else if (st == LM_OK && (st = lm_tensor_create(lm_ctx_device(ctx), LM_F32, 2, acc->shape, &part)) == LM_OK) {
        st = lm__composed_linear(ctx, V(zT), V(xT), V(part));
        if (st == LM_OK) st = lm_add_out(ctx, acc, V(part), acc);
    }
    lm_tensor_destroy(zT);
    lm_tensor_destroy(xT);
    lm_tensor_destroy(part);
    return st;
}

typedef struct bwd {
    lm_tensor *scratch; /* [C, V] f32 logits, then dlogits */
    lm_tensor *wT;      /* [H, V] contiguous copy of w^T, when dx is asked for */
    lm_tensor *acc;     /* [V, H] f32 accumulator when dw cannot take it directly */
} bwd;

lm_status lm__composed_linear_ce_backward(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                          const lm_tensor_view *targets, int64_t ignore_index, int64_t counted,
                                          double dloss, const lm_tensor_view *dx, const lm_tensor_view *dw,
                                          const lm_tensor_view *loss) {
    int64_t N = x->shape[0], Vn = w->shape[0], C = chunk_rows(N, Vn);
    int64_t shape[2] = {C, Vn};
    double scale = counted ? dloss / (double)counted : 0.0, total = 0.0;
    bwd b = {NULL, NULL, NULL};
    lm_tensor_view t, accv = dw ? *dw : *w;
    lm_status st = lm_tensor_create(lm_ctx_device(ctx), LM_F32, 2, shape, &b.scratch);
    if (st == LM_OK && dx && (st = lm_tensor_view_transpose(w, 0, 1, &t)) == LM_OK) st = lm__composed_copy(ctx, &t, &b.wT);
    if (st == LM_OK && dw && !lm_tensor_view_is_contiguous(dw)) {
        st = lm_tensor_create(lm_ctx_device(ctx), LM_F32, 2, dw->shape, &b.acc);
        if (st == LM_OK) accv = *V(b.acc);
    }
    for (int64_t r0 = 0; st == LM_OK && r0 < N; r0 += C) {
        int64_t c = LM_MIN(C, N - r0);
        lm_tensor_view z, dxs;
        st = chunk_logits(ctx, x, w, r0, c, b.scratch, &z);
        if (st == LM_OK) chunk_dlogits(z.data, c, Vn, targets, r0, ignore_index, scale, &total);
        if (st == LM_OK && dx && (st = lm_tensor_view_slice(dx, 0, r0, r0 + c, 1, &dxs)) == LM_OK)
            st = lm__composed_linear(ctx, &z, V(b.wT), &dxs);
        if (st == LM_OK && dw) st = chunk_dw(ctx, &z, x, r0, c, &accv, r0 == 0);
    }
    if (st == LM_OK && b.acc) st = lm_tensor_view_copy(ctx, dw, V(b.acc));
    if (st == LM_OK && loss) *(float *)loss->data = counted ? (float)(total / (double)counted) : NAN;
    lm_tensor_destroy(b.scratch);
    lm_tensor_destroy(b.wT);
    lm_tensor_destroy(b.acc);
    return st;
}
