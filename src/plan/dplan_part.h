/* plan/dplan_part.h — where a decode schedule's attention partials live: shared by the
 * planner, its CPU run (plan/dplan.h) and its GPU kernel (plan/dplan_exec.cu). */
#ifndef LOOM_PLAN_DPLAN_PART_H
#define LOOM_PLAN_DPLAN_PART_H

#include <stdint.h>

#ifdef __CUDACC__
#define LM__DP_HOST_DEVICE __host__ __device__
#else
#define LM__DP_HOST_DEVICE
#endif

/* Partials of one attention op in part[]: record (row b, token t, query head hq, chunk c)
 * of D + 2 floats (max score, sum of exponentials, D weighted values) at
 * poff + (((b * T + t) * Hq + hq) * nc + c) * (D + 2). */
static inline LM__DP_HOST_DEVICE int64_t lm__dp_part_at(int64_t poff, int64_t T, int64_t Hq, int64_t nc, int64_t D,
                                                        int64_t b, int64_t t, int64_t hq, int64_t c) {
    return poff + (((b * T + t) * Hq + hq) * nc + c) * (D + 2);
}

#endif
