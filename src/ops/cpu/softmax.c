/* ops/cpu/softmax.c — tuned softmax(x * scale) over the last dim, optionally causal
 * ([..., Tq, Tk]: row i sees columns j <= i + Tk - Tq, the rest are written 0).
 * Per row, three passes in f32: the max of x * scale, exp(x * scale - max) written
 * to out while summing (the argument rounded once through an FMA), and a multiply by
 * 1 / sum. Each x element is read before the same out element is written, so out may
 * be x's own view. NaN in a visible entry makes the row NaN, as in the reference.
 * O(3 * numel); rows spread over the pool for large calls.
 */
#include "ops/cpu/pointwise.h"

#include "ops/cpu/pointwise_kernels.h"
#include "ops/cpu/rows.h"

/* exp makes an element cost about four adds */
#define EXP_COST 4

typedef struct softmax_job {
    const lm__pw_kernels *k;
    lm__rows rows;  /* operands: x, out */
    const float *x; /* rows at rows offsets, unit step */
    float *out;
    float scale;
    int64_t tq;     /* causal: queries per [Tq, Tk] block; 0 when not causal */
} softmax_job;

static void softmax_range(void *arg, int64_t begin, int64_t end) {
    const softmax_job *j = arg;
    int64_t n = j->rows.n, off[2];
    for (int64_t row = begin; row < end; row++) {
        lm__rows_offsets(&j->rows, row, off);
        const float *x = j->x + off[0];
        float *o = j->out + off[1];
        /* rows keep the row-major order of the leading dims, so row % Tq is the query */
        int64_t visible = j->tq ? row % j->tq + (n - j->tq) + 1 : n;
        float mx = j->k->max_scaled(x, j->scale, visible);
        float sum = j->k->exp_sum(x, j->scale, mx, o, visible);
        j->k->scale(o, (float)(1.0 / sum), o, visible);
        for (int64_t c = visible; c < n; c++) o[c] = 0.0f;
    }
}

int lm__cpu_softmax_supported(const lm_tensor_view *x, const lm_tensor_view *out) {
    if (x->dtype != LM_F32 || out->dtype != LM_F32) return 0;
    const lm_tensor_view *v[] = {x, out};
    lm__rows r;
    lm__rows_init(&r, 2, v, 1, 0);
    return r.inner[0] == 1 && r.inner[1] == 1;
}

void lm__cpu_softmax(lm_threadpool *pool, const lm_tensor_view *x, float scale, int causal, const lm_tensor_view *out) {
    const lm_tensor_view *v[] = {x, out};
    softmax_job j = {.k = lm__pw_kernels_active(), .x = x->data, .out = out->data, .scale = scale,
                     .tq = causal ? x->shape[x->ndim - 2] : 0};
    lm__rows_init(&j.rows, 2, v, 1, 0);
    if (j.rows.count == 0) return;
    lm__cpu_parallel(pool, j.rows.count, j.rows.n * EXP_COST, softmax_range, &j);
}
