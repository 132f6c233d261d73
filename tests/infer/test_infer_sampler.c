/* Tests for the sampler: greedy and repetition penalty exactly, each filter's kept set,
 * empirical frequencies against the filtered softmax, seed reproducibility and errors.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "loom/sampler.h"

#include <math.h>
#include <string.h>

static lm_sampler *make(lm_sampler_params p, int64_t V) {
    lm_sampler *s = NULL;
    LT_CHECK_OK(lm_sampler_create(&p, V, &s));
    return s;
}

static void test_greedy_takes_argmax_after_repetition_penalty(void) {
    float logits[5] = {1.0f, 3.0f, 2.9f, -1.0f, 0.5f};
    lm_sampler_params p = lm_sampler_params_default();
    p.greedy = 1;
    lm_sampler *s = make(p, 5);
    int32_t id = -1;
    LT_CHECK_OK(lm_sampler_sample(s, logits, NULL, 0, &id));
    LT_CHECK(id == 1);
    lm_sampler_destroy(s);
    p.repetition_penalty = 1.5f; /* 3.0 -> 2.0 once, even if 1 appears twice; 2.9 wins */
    s = make(p, 5);
    int32_t hist[3] = {1, 1, 3};
    LT_CHECK_OK(lm_sampler_sample(s, logits, hist, 3, &id));
    LT_CHECK(id == 2);
    float neg[3] = {-1.0f, -1.2f, -5.0f}; /* negative logits are multiplied: -1 -> -1.5 */
    lm_sampler_destroy(s);
    s = make(p, 3);
    int32_t h0[1] = {0};
    LT_CHECK_OK(lm_sampler_sample(s, neg, h0, 1, &id));
    LT_CHECK(id == 1);
    lm_sampler_destroy(s);
}

/* Draws n samples and returns counts per id. */
static void histogram(lm_sampler *s, const float *logits, int64_t V, int n, int *counts) {
    memset(counts, 0, sizeof(int) * (size_t)V);
    for (int i = 0; i < n; i++) {
        int32_t id = -1;
        LT_CHECK_OK(lm_sampler_sample(s, logits, NULL, 0, &id));
        if (id >= 0 && id < V) counts[id]++;
    }
}

static void test_filters_keep_exactly_the_expected_sets(void) {
    /* probabilities at T=1: proportional to exp(logit) */
    float logits[6] = {2.0f, 1.0f, 0.0f, -1.0f, 0.5f, -3.0f};
    int counts[6];
    lm_sampler_params p = lm_sampler_params_default();
    p.seed = 7;
    p.top_k = 2; /* only ids 0 and 1 */
    lm_sampler *s = make(p, 6);
    histogram(s, logits, 6, 4000, counts);
    LT_CHECK(counts[0] + counts[1] == 4000);
    double want0 = exp(2.0) / (exp(2.0) + exp(1.0));
    LT_CHECK_MSG(fabs(counts[0] / 4000.0 - want0) < 0.03, "top-k frequency %g vs %g", counts[0] / 4000.0, want0);
    lm_sampler_destroy(s);
    /* top-p 0.8: sorted probs 0.561 (id 0) 0.206 (id 1) 0.125 (id 4) 0.076 (id 2) ...
     * -> cumulative 0.561, 0.767, 0.892: keep ids 0, 1, 4 */
    p = lm_sampler_params_default();
    p.top_p = 0.8f;
    s = make(p, 6);
    histogram(s, logits, 6, 4000, counts);
    LT_CHECK(counts[2] == 0 && counts[3] == 0 && counts[5] == 0 && counts[0] && counts[1] && counts[4]);
    lm_sampler_destroy(s);
    /* min-p 0.3: keep p >= 0.3 * p_max, i.e. logit >= 2 + ln 0.3 = 0.796 -> ids 0, 1 */
    p = lm_sampler_params_default();
    p.min_p = 0.3f;
    s = make(p, 6);
    histogram(s, logits, 6, 2000, counts);
    LT_CHECK(counts[0] + counts[1] == 2000 && counts[1] > 0);
    lm_sampler_destroy(s);
    /* temperature sharpens: T=0.25 makes id 0 dominate (p = 1/(1+e^-4+...)) */
    p = lm_sampler_params_default();
    p.temperature = 0.25f;
    s = make(p, 6);
    histogram(s, logits, 6, 4000, counts);
    double z = 0;
    for (int i = 0; i < 6; i++) z += exp(logits[i] / 0.25);
    LT_CHECK_MSG(fabs(counts[0] / 4000.0 - exp(8.0) / z) < 0.02, "temperature frequency %g", counts[0] / 4000.0);
    lm_sampler_destroy(s);
}

static void test_unfiltered_frequencies_follow_softmax(void) {
    float logits[4] = {0.0f, 1.0f, 2.0f, 0.5f};
    int counts[4];
    lm_sampler_params p = lm_sampler_params_default();
    p.seed = 123;
    lm_sampler *s = make(p, 4);
    histogram(s, logits, 4, 20000, counts);
    double z = exp(0.0) + exp(1.0) + exp(2.0) + exp(0.5);
    for (int i = 0; i < 4; i++) {
        double want = exp(logits[i]) / z, got = counts[i] / 20000.0;
        LT_CHECK_MSG(fabs(got - want) < 0.015, "id %d: frequency %g vs %g", i, got, want);
    }
    lm_sampler_destroy(s);
}

static void test_same_seed_gives_same_tokens(void) {
    lt_rng r = lt_rng_seed(9);
    float logits[300];
    for (int i = 0; i < 300; i++) logits[i] = (float)lt_rng_normal(&r) * 2;
    lm_sampler_params p = lm_sampler_params_default();
    p.seed = 42;
    p.top_k = 40;
    p.top_p = 0.9f;
    lm_sampler *a = make(p, 300), *b = make(p, 300);
    int32_t seq_a[50], seq_b[50];
    for (int i = 0; i < 50; i++) {
        LT_CHECK_OK(lm_sampler_sample(a, logits, NULL, 0, &seq_a[i]));
        LT_CHECK_OK(lm_sampler_sample(b, logits, NULL, 0, &seq_b[i]));
    }
    LT_CHECK(memcmp(seq_a, seq_b, sizeof seq_a) == 0);
    lm_sampler_reseed(a, 42);
    int32_t again;
    LT_CHECK_OK(lm_sampler_sample(a, logits, NULL, 0, &again));
    LT_CHECK(again == seq_a[0]);
    int distinct = 0;
    for (int i = 1; i < 50; i++) distinct += seq_a[i] != seq_a[0];
    LT_CHECK(distinct > 0);
    lm_sampler_destroy(a);
    lm_sampler_destroy(b);
}

static void test_invalid_parameters_and_inputs_are_rejected(void) {
    lm_sampler_params p = lm_sampler_params_default();
    lm_sampler *s = NULL;
    p.temperature = -1;
    LT_CHECK_STATUS(lm_sampler_create(&p, 10, &s), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "temperature") != NULL);
    p = lm_sampler_params_default();
    p.top_p = 0;
    LT_CHECK_STATUS(lm_sampler_create(&p, 10, &s), LM_INVALID_ARGUMENT);
    p = lm_sampler_params_default();
    p.min_p = 1;
    LT_CHECK_STATUS(lm_sampler_create(&p, 10, &s), LM_INVALID_ARGUMENT);
    p = lm_sampler_params_default();
    p.repetition_penalty = 0;
    LT_CHECK_STATUS(lm_sampler_create(&p, 10, &s), LM_INVALID_ARGUMENT);
    p = lm_sampler_params_default();
    LT_CHECK_STATUS(lm_sampler_create(&p, 0, &s), LM_INVALID_ARGUMENT);
    LT_CHECK(s == NULL);
    p.repetition_penalty = 1.2f;
    s = make(p, 3);
    float logits[3] = {0, NAN, 1};
    int32_t id;
    LT_CHECK_STATUS(lm_sampler_sample(s, logits, NULL, 0, &id), LM_INVALID_ARGUMENT);
    float ok[3] = {0, 1, 2};
    int32_t bad_hist[1] = {3};
    LT_CHECK_STATUS(lm_sampler_sample(s, ok, bad_hist, 1, &id), LM_INVALID_ARGUMENT);
    lm_sampler_destroy(s);
    lm_sampler_destroy(NULL);
    for (int k = 1; k <= 4; k++) {
        lt_alloc_track(k);
        lm_status st = lm_sampler_create(&p, 100, &s);
        if (st == LM_OK) lm_sampler_destroy(s);
        else LT_CHECK_STATUS(st, LM_OUT_OF_MEMORY);
        LT_CHECK(lt_alloc_live() == 0);
        lt_alloc_untrack();
    }
}

int main(void) {
    LT_RUN(test_greedy_takes_argmax_after_repetition_penalty);
    LT_RUN(test_filters_keep_exactly_the_expected_sets);
    LT_RUN(test_unfiltered_frequencies_follow_softmax);
    LT_RUN(test_same_seed_gives_same_tokens);
    LT_RUN(test_invalid_parameters_and_inputs_are_rejected);
    return lt_finish();
}
