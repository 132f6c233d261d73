/* infer/sampler.c — repetition penalty, temperature, top-k, top-p, min-p and a seeded
 * draw over one logits row.
 *
 * Work per call: O(V) to copy and penalize, O(V log k) with top-k (partial selection
 * by a min-heap of size k), O(V log V) when top-p/min-p need the full sorted order.
 * Scratch buffers are allocated once per sampler, so sampling never allocates.
 * Probabilities are computed in double from the max-shifted logits; draws come from
 * the library's seeded lm_rng stream.
 */
#include "base/internal.h"
#include "loom/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand {
    float logit;
    int32_t id;
} cand;

struct lm_sampler {
    lm_sampler_params p;
    int64_t vocab;
    lm_rng rng;
    float *logits;    /* [vocab] penalized copy */
    cand *cands;      /* [vocab] candidate list */
    uint8_t *seen;    /* [vocab] history marks for the repetition penalty */
};

lm_sampler_params lm_sampler_params_default(void) {
    return (lm_sampler_params){0, 1.0f, 0, 1.0f, 0.0f, 1.0f, 0};
}

void lm_sampler_reseed(lm_sampler *s, uint64_t seed) { lm_rng_seed(&s->rng, seed); }

lm_status lm_sampler_create(const lm_sampler_params *p, int64_t vocab, lm_sampler **out) {
    if (!p || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_sampler_create: NULL argument");
    *out = NULL;
    if (vocab <= 0 || vocab > INT32_MAX) return lm__error(LM_INVALID_ARGUMENT, "sampler: vocabulary size %lld", (long long)vocab);
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return lm__error(LM_INVALID_ARGUMENT, "sampler: temperature %g must be finite and >= 0", p->temperature);
    if (p->top_k < 0) return lm__error(LM_INVALID_ARGUMENT, "sampler: top_k %d must be >= 0", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1)) return lm__error(LM_INVALID_ARGUMENT, "sampler: top_p %g must be in (0, 1]", p->top_p);
    if (!(p->min_p >= 0 && p->min_p < 1)) return lm__error(LM_INVALID_ARGUMENT, "sampler: min_p %g must be in [0, 1)", p->min_p);
    if (!(p->repetition_penalty > 0) || !isfinite(p->repetition_penalty))
        return lm__error(LM_INVALID_ARGUMENT, "sampler: repetition_penalty %g must be finite and > 0", p->repetition_penalty);
    lm_sampler *s = lm__calloc(1, sizeof *s);
    if (!s) return LM_OUT_OF_MEMORY;
    s->p = *p;
    s->vocab = vocab;
    s->logits = lm__calloc((size_t)vocab, sizeof *s->logits);
    s->cands = lm__calloc((size_t)vocab, sizeof *s->cands);
    s->seen = lm__calloc((size_t)vocab, 1);
    if (!s->logits || !s->cands || !s->seen) {
        lm_sampler_destroy(s);
        return LM_OUT_OF_MEMORY;
    }
    lm_sampler_reseed(s, p->seed);
    *out = s;
    return LM_OK;
}

void lm_sampler_destroy(lm_sampler *s) {
    if (!s) return;
    lm__free(s->logits);
    lm__free(s->cands);
    lm__free(s->seen);
    lm__free(s);
}

/* Sort by logit descending, then id ascending, so ties resolve deterministically. */
static int cand_cmp(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    if (a->logit != b->logit) return a->logit > b->logit ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static int cand_less(cand a, cand b) { return cand_cmp(&a, &b) > 0; } /* a ranks below b */

static void heap_sift_down(cand *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && cand_less(h[l], h[m])) m = l;
        if (r < n && cand_less(h[r], h[m])) m = r;
        if (m == i) return;
        cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Keeps the k best of the first n candidates in cands[0..k), sorted. O(n log k). */
static int64_t select_top_k(cand *c, int64_t n, int64_t k) {
    if (k >= n) {
        qsort(c, (size_t)n, sizeof *c, cand_cmp);
        return n;
    }
    for (int64_t i = k / 2; i-- > 0;) heap_sift_down(c, k, i); /* min-heap of the first k */
    for (int64_t i = k; i < n; i++)
        if (cand_less(c[0], c[i])) {
            c[0] = c[i];
            heap_sift_down(c, k, 0);
        }
    qsort(c, (size_t)k, sizeof *c, cand_cmp);
    return k;
}

lm_status lm_sampler_sample(lm_sampler *s, const float *logits, const int32_t *history, size_t n_history,
                            int32_t *out_id) {
    if (!s || !logits || !out_id || (n_history && !history))
        return lm__error(LM_INVALID_ARGUMENT, "lm_sampler_sample: NULL argument");
    int64_t V = s->vocab;
    const lm_sampler_params *p = &s->p;
    memcpy(s->logits, logits, (size_t)V * sizeof *logits);
    for (int64_t i = 0; i < V; i++)
        if (isnan(s->logits[i])) return lm__error(LM_INVALID_ARGUMENT, "sampler: logit %lld is NaN", (long long)i);
    if (p->repetition_penalty != 1.0f && n_history) {
        for (size_t i = 0; i < n_history; i++) {
            if (history[i] < 0 || history[i] >= V)
                return lm__error(LM_INVALID_ARGUMENT, "sampler: history id %d outside vocabulary of %lld", history[i],
                                 (long long)V);
        }
        for (size_t i = 0; i < n_history; i++) {
            int32_t id = history[i];
            if (s->seen[id]) continue;
            s->seen[id] = 1; /* each distinct id is penalized once */
            float l = s->logits[id];
            s->logits[id] = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
        }
        for (size_t i = 0; i < n_history; i++) s->seen[history[i]] = 0;
    }
    if (p->greedy || p->temperature == 0) {
        int64_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (s->logits[i] > s->logits[best]) best = i;
        *out_id = (int32_t)best;
        return LM_OK;
    }
    for (int64_t i = 0; i < V; i++) s->cands[i] = (cand){s->logits[i] / p->temperature, (int32_t)i};
    int64_t n = V;
    if (p->top_k > 0 || p->top_p < 1 || p->min_p > 0) n = select_top_k(s->cands, V, p->top_k > 0 ? p->top_k : V);
    else {
        int64_t best = 0; /* unsorted: only the max is needed for a stable softmax */
        for (int64_t i = 1; i < n; i++)
            if (s->cands[i].logit > s->cands[best].logit) best = i;
        cand t = s->cands[0];
        s->cands[0] = s->cands[best];
        s->cands[best] = t;
    }
    double maxl = s->cands[0].logit, total = 0;
    if (isinf(maxl) && maxl < 0) return lm__error(LM_INVALID_ARGUMENT, "sampler: every logit is -inf");
    for (int64_t i = 0; i < n; i++) total += exp((double)s->cands[i].logit - maxl);
    if (p->top_p < 1) { /* smallest prefix whose probability reaches top_p (at least one) */
        double cum = 0;
        int64_t keep = n;
        for (int64_t i = 0; i < n; i++) {
            cum += exp((double)s->cands[i].logit - maxl) / total;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p->min_p > 0) { /* drop tokens below min_p times the top probability */
        int64_t keep = 1;
        while (keep < n && exp((double)s->cands[keep].logit - maxl) >= p->min_p) keep++;
        n = keep;
    }
    total = 0;
    for (int64_t i = 0; i < n; i++) total += exp((double)s->cands[i].logit - maxl);
    double u = lm_rng_uniform(&s->rng) * total, acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += exp((double)s->cands[i].logit - maxl);
        if (u < acc) {
            *out_id = s->cands[i].id;
            return LM_OK;
        }
    }
    *out_id = s->cands[n - 1].id; /* u landed on the rounding edge of the total */
    return LM_OK;
}
