/* plan/dplan_replay.h — a decode schedule's skeleton on a CUDA device (dplan_replay.cu;
 * dplan_replay_nocuda.c without CUDA): plain arrays, so the launcher needs nothing of
 * the planner's records. */
#ifndef LOOM_PLAN_DPLAN_REPLAY_H
#define LOOM_PLAN_DPLAN_REPLAY_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/internal.h"

#define LM__DP_REPLAY_MAX_PREFETCH (112 * 1024) /* bytes: two buffers fit an H100/H200 SM's shared memory */

typedef struct lm__dp_replay {
    int sms;
    int64_t nitems;
    const int64_t *sm_begin;  /* [sms + 1]: SM s runs order[sm_begin[s] .. sm_begin[s + 1]) */
    const int32_t *order;     /* [nitems] */
    const int64_t *dep_begin; /* [nitems + 1]: item i waits for deps[dep_begin[i] .. dep_begin[i + 1]) */
    const int32_t *deps;      /* an entry w >= 0: item w's flag; w < 0: op counter -w - 1 holds op_count[-w - 1] */
    const int32_t *item_op;   /* [nitems] the op counter item i adds one to when done */
    const int32_t *op_count;  /* [nops] items of each op */
    int32_t nops;
    const int64_t *bytes;     /* [nitems] bytes item i streams, multiples of 16 */
    int64_t prefetch_bytes;   /* an item's first bytes, copied into shared memory (TMA bulk copies) once the
                                 item before it on its SM has its dependencies met: they land while that
                                 item streams and this one waits */
    int device;
    int steps;                /* timed launches (after one untimed) */
} lm__dp_replay;

/* Runs r->steps launches of the skeleton kernel on r->device: one block per SM list
 * (a cooperative launch, so all are resident), each item streaming its bytes from its
 * own region of one buffer, then releasing its own flag and adding one to its op's
 * counter; its dependents acquire either (deps' encoding above). Mean and
 * fastest launch (host events around each) in microseconds. LM_INVALID_ARGUMENT when
 * the lists outnumber the device's SMs; LM_INTERNAL when a wait outlasts ~2 s (a
 * dependency never released); LM_UNSUPPORTED without CUDA. */
lm_status lm__dp_replay_cuda(const lm__dp_replay *r, double *mean_us, double *min_us);

#ifdef __cplusplus
}
#endif
#endif
