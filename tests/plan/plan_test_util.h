/* tests/plan/plan_test_util.h — the small-workload set-up the plan tests share. */
#ifndef LOOM_PLAN_TEST_UTIL_H
#define LOOM_PLAN_TEST_UTIL_H

#include "loom/plan.h"

/* The default workload of kind k resized: M/tokens a, N/width b, K/hidden c, heads,
 * three repeats, dtype dt. */
static inline void plan_test_workload(lm_plan_workload *w, lm_plan_workload_kind k, int64_t a, int64_t b, int64_t c,
                                      int64_t heads, lm_dtype dt) {
    lm_plan_workload_default(k, w);
    w->m = w->tokens = a;
    w->n = w->width = b;
    w->k = w->hidden = c;
    w->heads = heads;
    w->repeat = 3;
    w->dtype = dt;
}

#endif
