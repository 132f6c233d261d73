/* ops/cpu/rows.h — row geometry and row-parallel loops for the tuned pointwise kernels.
 *
 * The kernels work on rows: runs of n elements that every operand holds at a fixed
 * step (1 for a dense row, 0 for a broadcast scalar). lm__rows turns views of one
 * shape into such rows, merging dims whose strides nest in every operand, so a dense
 * tensor is one long row and a [rows, N] view with any row stride is `rows` rows.
 * Rows are numbered in the row-major order of the original dims, whatever merged.
 * lm__cpu_parallel splits a range of work units over the context's thread pool only
 * when the call is large enough to pay for waking it.
 */
#ifndef LOOM_OPS_CPU_ROWS_H
#define LOOM_OPS_CPU_ROWS_H

#include "ops/internal.h"

#define LM__ROWS_MAX_OPS 5

typedef struct lm__rows {
    int nops;
    int ndim;                                      /* outer dims left after merging */
    int64_t shape[LM_MAX_DIMS];                    /* [ndim] outer extents, outermost first */
    int64_t stride[LM__ROWS_MAX_OPS][LM_MAX_DIMS]; /* [nops][ndim] outer strides, in elements */
    int64_t inner[LM__ROWS_MAX_OPS];               /* [nops] step along a row (1 when n <= 1) */
    int64_t count;                                 /* number of rows; 0 when any dim is 0 */
    int64_t n;                                     /* elements per row */
} lm__rows;

/* Describes nops views of one shape (v[0]'s) as rows. keep_last: the last dim is the
 * row (reductions over it). Otherwise the innermost dim of size > 1 is the row if
 * every operand steps 1 along it (or 0, for operands whose bit is set in zero_ok),
 * and outer dims merge into it while their strides nest in every operand; if not,
 * rows are single elements. Size-1 dims are dropped. */
void lm__rows_init(lm__rows *r, int nops, const lm_tensor_view *const *v, int keep_last, unsigned zero_ok);
/* off[k] = element offset of row `row` in operand k. O(ndim). */
void lm__rows_offsets(const lm__rows *r, int64_t row, int64_t *off);

/* Work below this many elements runs on the calling thread: waking the pool costs
 * about as much as streaming 64K floats. */
#define LM__PAR_MIN_ELEMS ((int64_t)1 << 16)

/* fn(arg, begin, end) over consecutive unit ranges covering [0, units). */
typedef void (*lm__range_fn)(void *arg, int64_t begin, int64_t end);
/* Runs fn over [0, units), where each unit costs about unit_elems elements of work:
 * inline when the total is below LM__PAR_MIN_ELEMS or pool has one thread, else as
 * about four ranges per thread. Every unit is done by exactly one call, so results
 * never depend on the thread count. */
void lm__cpu_parallel(lm_threadpool *pool, int64_t units, int64_t unit_elems, lm__range_fn fn, void *arg);

#endif
