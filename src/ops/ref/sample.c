/* ops/ref/sample.c — readable reference of next-token selection (lm_sample_out).
 *
 * Per row: the argmax for greedy (NaN ranks highest, ties to the lower id);
 * otherwise v = logit / temperature, tokens sorted by rank (value, then lower id),
 * top-k and top-p cut rank prefixes of the unnormalized weights e = exp(v - v_max),
 * min-p keeps e >= min_p (always the top token), and u * (kept mass) is located by
 * summing the kept weights in id order. Weights are in double here; the GPU kernel
 * sums floats in another order, so a draw landing within rounding of a boundary may
 * pick the neighbour there. O(V log V) per row.
 */
#include "ops/ref/sample.h"

#include <stdlib.h>

double lm__sample_uniform(uint64_t seed, uint64_t draw, uint64_t row) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (draw + 1) + 0xD1B54A32D192ED03ull * (row + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

typedef struct ranked {
    double v;
    int64_t id;
} ranked;

/* Descending value, NaN first, then ascending id. */
static int cmp_rank(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    int xn = isnan(x->v), yn = isnan(y->v);
    if (xn != yn) return xn ? -1 : 1;
    if (!xn && x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int64_t pick_row(const float *x, int64_t V, const lm_sample_params *p, uint64_t row, ranked *r,
                        unsigned char *kept) {
    if (V < 1) return 0; /* lm_sample_out admits V >= 1 only */
    for (int64_t j = 0; j < V; j++) r[j].v = (double)x[j], r[j].id = j;
    qsort(r, (size_t)V, sizeof *r, cmp_rank);
    int64_t top = r[0].id;
    double vmax = (double)x[top] / p->temperature;
    if (p->greedy || p->temperature == 0.0f || V == 1 || isnan(vmax) || isinf(vmax)) return top;
    int64_t n = p->top_k > 0 && p->top_k < V ? p->top_k : V; /* rank prefix kept so far */
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) total += exp(r[i].v / p->temperature - vmax);
    if (p->top_p < 1.0f) {
        double target = p->top_p * total, cum = 0.0;
        int64_t i = 0;
        while (i < n && cum < target) cum += exp(r[i++].v / p->temperature - vmax);
        n = LM_MAX(i, 1);
    }
    memset(kept, 0, (size_t)V);
    for (int64_t i = 0; i < n; i++) {
        double e = exp(r[i].v / p->temperature - vmax);
        if (p->min_p <= 0.0f || e >= p->min_p || i == 0) kept[r[i].id] = 1;
    }
    double mass = 0.0;
    for (int64_t j = 0; j < V; j++)
        if (kept[j]) mass += exp((double)x[j] / p->temperature - vmax);
    double u = lm__sample_uniform(p->seed, p->draw, row) * mass, acc = 0.0;
    for (int64_t j = 0; j < V; j++) {
        if (!kept[j]) continue;
        acc += exp((double)x[j] / p->temperature - vmax);
        if (u < acc) return j;
    }
    return top; /* u rounded to the very end of the mass */
}

lm_status lm__ref_sample(const lm_tensor_view *logits, const lm_sample_params *p, int64_t records, const lm_tensor_view *ids) {
    int64_t R = logits->shape[0], V = logits->shape[1];
    ranked *r = lm__alloc(sizeof *r * (size_t)V, 64);
    unsigned char *kept = lm__alloc((size_t)V, 64);
    if (!r || !kept) {
        lm__free(r);
        lm__free(kept);
        return lm__error_context(LM_OUT_OF_MEMORY, "sample: rank workspace for %lld tokens", (long long)V);
    }
    for (int64_t row = 0; row < R; row++) {
        const float *x = (const float *)logits->data + row * logits->stride[0];
        const lm_sample_params *q = &p[records > 1 ? row : 0];
        int64_t id = pick_row(x, V, q, (q->flags & LM_SAMPLE_OWN_STREAM) ? 0 : (uint64_t)row, r, kept);
        lm__st_index(ids->dtype, ids->data, row * ids->stride[0], id);
    }
    lm__free(r);
    lm__free(kept);
    return LM_OK;
}
