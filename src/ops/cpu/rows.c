/* ops/cpu/rows.c — merging view dims into rows and the row-parallel loop (rows.h).
 * Both are O(ndim * nops) per call; the per-row offset walk is O(ndim). */
#include "ops/cpu/rows.h"

/* 1 when dim `outer` can be folded onto a block of `inner_len` elements at steps
 * step[k] in every operand: row-major order is kept and each operand's stride along
 * `outer` is exactly the block's extent. */
static int nests(int nops, const lm_tensor_view *const *v, int outer, const int64_t *step, int64_t inner_len) {
    for (int k = 0; k < nops; k++)
        if (v[k]->stride[outer] != step[k] * inner_len) return 0;
    return 1;
}

void lm__rows_init(lm__rows *r, int nops, const lm_tensor_view *const *v, int keep_last, unsigned zero_ok) {
    memset(r, 0, sizeof *r);
    r->nops = nops;
    r->n = 1;
    r->count = 1;
    for (int k = 0; k < nops; k++) r->inner[k] = 1;
    int nd = v[0]->ndim;
    const int64_t *shape = v[0]->shape;
    for (int d = 0; d < nd; d++)
        if (shape[d] == 0) {
            r->count = 0;
            r->n = 0;
            return;
        }
    int d = nd - 1;
    if (keep_last && nd > 0) {
        r->n = shape[d];
        if (r->n > 1)
            for (int k = 0; k < nops; k++) r->inner[k] = v[k]->stride[d];
        d--;
    } else if (!keep_last) {
        /* The innermost non-trivial dim starts the row when every operand may step
         * along it, and outer dims fold onto it; otherwise rows are single elements. */
        while (d >= 0 && shape[d] == 1) d--;
        int unit = d >= 0;
        for (int k = 0; unit && k < nops; k++)
            unit = v[k]->stride[d] == 1 || (v[k]->stride[d] == 0 && (zero_ok >> k & 1u));
        if (unit) {
            r->n = shape[d];
            for (int k = 0; k < nops; k++) r->inner[k] = v[k]->stride[d];
            for (d--; d >= 0; d--) {
                if (shape[d] == 1) continue;
                if (!nests(nops, v, d, r->inner, r->n)) break;
                r->n *= shape[d];
            }
        }
    }
    /* Outer dims, innermost first into a scratch list, merging nested neighbours. */
    int64_t os[LM_MAX_DIMS], ost[LM__ROWS_MAX_OPS][LM_MAX_DIMS];
    int m = 0;
    for (; d >= 0; d--) {
        if (shape[d] == 1) continue;
        int merge = m > 0;
        for (int k = 0; merge && k < nops; k++) merge = v[k]->stride[d] == ost[k][m - 1] * os[m - 1];
        if (merge) {
            os[m - 1] *= shape[d];
            continue;
        }
        os[m] = shape[d];
        for (int k = 0; k < nops; k++) ost[k][m] = v[k]->stride[d];
        m++;
    }
    r->ndim = m;
    for (int i = 0; i < m; i++) {
        r->shape[i] = os[m - 1 - i];
        for (int k = 0; k < nops; k++) r->stride[k][i] = ost[k][m - 1 - i];
        r->count *= r->shape[i];
    }
}

void lm__rows_offsets(const lm__rows *r, int64_t row, int64_t *off) {
    for (int k = 0; k < r->nops; k++) off[k] = 0;
    for (int i = r->ndim - 1; i >= 0; i--) {
        int64_t q = row / r->shape[i], idx = row - q * r->shape[i];
        for (int k = 0; k < r->nops; k++) off[k] += idx * r->stride[k][i];
        row = q;
    }
}

typedef struct range_job {
    lm__range_fn fn;
    void *arg;
    int64_t units, chunk; /* units per task */
} range_job;

static void range_task(void *arg, int64_t task, int worker) {
    (void)worker;
    const range_job *j = arg;
    int64_t b = task * j->chunk, e = LM_MIN(j->units, b + j->chunk);
    j->fn(j->arg, b, e);
}

void lm__cpu_parallel(lm_threadpool *pool, int64_t units, int64_t unit_elems, lm__range_fn fn, void *arg) {
    if (units <= 0) return;
    int64_t threads = lm_threadpool_size(pool);
    int64_t total = units * LM_MAX(unit_elems, 1);
    if (threads <= 1 || units < 2 || total < LM__PAR_MIN_ELEMS) {
        fn(arg, 0, units);
        return;
    }
    /* ~4 ranges per thread absorb uneven progress; no range below ~16K elements. */
    int64_t tasks = LM_MIN(LM_MIN(units, 4 * threads), LM_MAX(2, total / (LM__PAR_MIN_ELEMS / 4)));
    range_job j = {fn, arg, units, (units + tasks - 1) / tasks};
    lm_threadpool_run(pool, (units + j.chunk - 1) / j.chunk, range_task, &j);
}
