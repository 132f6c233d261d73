/* plan/dplan_exec.h — a decode schedule run on a CUDA device as one persistent launch
 * (dplan_exec.cu; the records are built from the plan in dplan_exec_cuda.c): plain
 * records shared by the C builder and the kernel.
 *
 * One block per SM list walks its items in list order. An item names its op's record
 * (the parameters the step's own kernels are launched with: the decode GEMV's, or the
 * cache attention's) and a range of the op's units; it waits for its dependencies
 * through the plan's waits (an item's flag, or an op's counter), runs its piece through
 * the same device code the standalone kernels run (ops/cuda/gemv_body.cuh) or the
 * kernel's own attention (a warp per query head), and releases its flag and its op's
 * counter. */
#ifndef LOOM_PLAN_DPLAN_EXEC_H
#define LOOM_PLAN_DPLAN_EXEC_H

#include <stdint.h>

#include "ops/cuda/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lm__dx_kind {
    LM__DX_GEMV = 0,    /* row groups [lo, hi) of the op's GEMV */
    LM__DX_ATTN = 1,    /* (row, kv head) units [lo, hi), all their query heads */
    LM__DX_PART = 2,    /* kv head lo, keys [k0, k1): chunk c of nc, softmax partials into part + poff */
    LM__DX_COMBINE = 3, /* kv head lo: the nc chunks' partials merged into the output */
} lm__dx_kind;

/* The GEMV's body an op runs: its input form and epilogue, and whether a row's K is
 * split over the block's 8 warps. */
typedef enum lm__dx_gemv {
    LM__DX_NORM_FRONT = 0, /* RMSNORM in, the q|k|v front */
    LM__DX_NORM_SWIGLU,    /* RMSNORM in, the gate|up SwiGLU */
    LM__DX_NORM_OUT,       /* RMSNORM in, out (the head) */
    LM__DX_PLAIN_OUT,      /* PLAIN in, out (accumulating: o, down) */
    LM__DX_SWIGLU_OUT,     /* SWIGLU in, out */
    LM__DX_GEMV_FORMS
} lm__dx_gemv;

typedef struct lm__dx_op {
    int32_t kind;   /* LM__DX_GEMV: the form in `form`; otherwise attention */
    int32_t form;   /* lm__dx_gemv */
    int32_t ksplit; /* 1 or 8 */
    int32_t pad;
    union {
        lm__cuda_gemv_params g;
        struct {
            lm__cuda_attn_params a;
            lm__cuda_kv kv;
        } at;
    } u;
} lm__dx_op;

/* One position of an SM list, in list order. */
typedef struct lm__dx_entry {
    int64_t lo, hi;  /* GEMV: row groups; ATTN: units; PART / COMBINE: the kv head in lo */
    int64_t k0, k1;  /* PART: key positions */
    int64_t poff;    /* PART / COMBINE: the op's partials in part[] (floats) */
    int64_t wait0;   /* its waits: waits[wait0 .. wait0 + nwait) */
    int32_t item, nwait, op, kind;
    int32_t c, nc;   /* PART / COMBINE */
    uint32_t rel;    /* 1: releases its flag; 2: adds one to its op's counter */
    int32_t counter; /* the counter it adds to */
} lm__dx_entry;

typedef struct lm__dx_tables {
    int sms;
    int wf;               /* the weight format of every GEMV (lm__cuda_gemv_w) */
    int rows;             /* input rows of the step (M of every GEMV: 1 or 2) */
    int64_t nent;
    const int64_t *sm_begin;    /* [sms + 1] */
    const lm__dx_entry *ent;    /* [nent] */
    int64_t nwaits;
    const int32_t *waits;       /* w >= 0: item w's flag; w < 0: counter -w - 1 holds epoch x counts[-w - 1] */
    int64_t nitems;             /* flags */
    int32_t ncounters;
    const int32_t *counts;      /* [ncounters] items adding to each counter */
    int64_t nops;
    const lm__dx_op *ops;       /* [nops] */
    size_t smem;                /* dynamic shared memory a block needs (staged GEMV inputs, attention) */
    float *part;                /* the plan's partials (device), or NULL */
    int device;
} lm__dx_tables;

typedef struct lm__dx lm__dx;

/* Uploads the tables to t->device (the kernel for t->wf and t->rows); LM_UNSUPPORTED
 * when the device cannot run it (cooperative launch, shared memory, SMs). */
lm_status lm__dx_create(const lm__dx_tables *t, lm__dx **out);
void lm__dx_destroy(lm__dx *x);
/* One launch on stream s (a new epoch: nothing is reset between launches). */
lm_status lm__dx_launch(lm__dx *x, cudaStream_t s);
/* After the stream is synchronized: LM_INTERNAL naming the item when a wait timed out
 * (~2 s) in some launch since the last call. */
lm_status lm__dx_status(lm__dx *x);

/* Profiling: on, every later launch records per list position clock64() at the item's
 * start, after its wait and at its end (before its release); stamps copies the last
 * launch's [nent x 3] (after the stream is synchronized) and the SM clock's rate (kHz). */
lm_status lm__dx_profile(lm__dx *x, int on);
lm_status lm__dx_stamps(lm__dx *x, long long *out, double *khz);

#ifdef __cplusplus
}
#endif
#endif
