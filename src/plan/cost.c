/* plan/cost.c — the cost model: cycles of kernels and exchange phases on one tile
 * from the machine description.
 *
 * Matmul: a call costs mm_call_cycles plus, per k_grain x n_grain weight pass,
 * mm_pass_cycles and rows x mm_row_cycles: shapes are padded to the matrix unit's
 * grain. Either operand may be loaded as the weights (C^T = B^T A^T streams the other
 * one as rows); the cheaper orientation is taken. The three constants are fitted to
 * measured kernel timings (docs/PLAN.md, "Calibration").
 * Vector kernels: vec_call_cycles + bytes streamed / data path + FLOPs / vector
 * rate + transcendentals. On-tile copies (layout conversions, the local pieces of a
 * redistribution): vec_call_cycles + bytes / copy rate, whatever their shape (a
 * measured transposing rearrangement pays per contiguous run, which this form
 * does not see: docs/PLAN.md "Calibration"). Exchange: sync + the busiest
 * tile's max(send, receive) bytes / exchange rate + messages x msg_cycles. All costs
 * are per phase on the busiest tile (bulk-synchronous: the slowest tile decides).
 */
#include "plan/planner.h"

/* passes x (pass + rows x row cost) with the [k, n] operand as weights, excluding the call */
static double mm_passes(const lm_plan_machine *m, lm_dtype dt, int64_t rows, int64_t n, int64_t k) {
    int f16 = dt == LM_F16;
    int64_t kg = f16 ? m->mm_k_grain_f16 : m->mm_k_grain_f32, ng = f16 ? m->mm_n_grain_f16 : m->mm_n_grain_f32;
    double row_cycles = f16 ? m->mm_row_cycles_f16 : m->mm_row_cycles_f32;
    return (double)lm__plan_ceil_div(k, kg) * (double)lm__plan_ceil_div(n, ng) *
           ((double)m->mm_pass_cycles + (double)rows * row_cycles);
}

double lm__plan_cost_matmul_fixed(const lm_plan_machine *m, lm_dtype dt, int64_t batch, int64_t rows, int64_t n,
                                  int64_t k) {
    if (batch <= 0 || rows <= 0 || n <= 0 || k <= 0) return 0;
    return (double)m->mm_call_cycles + (double)batch * mm_passes(m, dt, rows, n, k);
}

double lm__plan_cost_matmul(const lm_plan_machine *m, lm_dtype dt, int64_t batch, int64_t rows, int64_t n, int64_t k) {
    if (batch <= 0 || rows <= 0 || n <= 0 || k <= 0) return 0;
    /* either operand can hold the weights: stream the longer side as rows */
    double normal = mm_passes(m, dt, rows, n, k), swapped = mm_passes(m, dt, n, rows, k);
    return (double)m->mm_call_cycles + (double)batch * (normal < swapped ? normal : swapped);
}

void lm__plan_cost_matmul_parts(const lm_plan_machine *m, lm_dtype dt, int64_t batch, int64_t rows, int64_t n,
                                int64_t k, double parts[LM__PLAN_MM_PARTS]) {
    for (int i = 0; i < LM__PLAN_MM_PARTS; i++) parts[i] = 0;
    if (batch <= 0 || rows <= 0 || n <= 0 || k <= 0) return;
    double normal = mm_passes(m, dt, rows, n, k), swapped = mm_passes(m, dt, n, rows, k);
    if (swapped < normal) { /* the orientation lm__plan_cost_matmul takes */
        int64_t t = rows;
        rows = n, n = t;
    }
    int f16 = dt == LM_F16;
    double kg = (double)(f16 ? m->mm_k_grain_f16 : m->mm_k_grain_f32),
           ng = (double)(f16 ? m->mm_n_grain_f16 : m->mm_n_grain_f32);
    double exact = (double)batch * ((double)k / kg) * ((double)n / ng); /* passes without grain rounding */
    parts[LM__PLAN_MM_CALL] = (double)m->mm_call_cycles;
    parts[LM__PLAN_MM_PASS] = exact * (double)m->mm_pass_cycles;
    parts[LM__PLAN_MM_ROWS] = exact * (double)rows * (f16 ? m->mm_row_cycles_f16 : m->mm_row_cycles_f32);
    parts[LM__PLAN_MM_PAD] = (double)batch * LM_MIN(normal, swapped) - parts[LM__PLAN_MM_PASS] - parts[LM__PLAN_MM_ROWS];
}

int lm__plan_epi_valid(int64_t epi) {
    return epi >= 0 && epi <= 7 && (epi & (LM__PLAN_EPI_GELU | LM__PLAN_EPI_SILU)) != (LM__PLAN_EPI_GELU | LM__PLAN_EPI_SILU);
}

double lm__plan_cost_epilogue(const lm_plan_machine *m, lm_dtype dt, int64_t elems, int64_t epi) {
    if (!epi || elems <= 0) return 0;
    double e = (double)elems, rate = dt == LM_F16 ? m->vec_flops_f16 : m->vec_flops_f32, c = 0;
    if (epi & LM__PLAN_EPI_BIAS) c += e * (double)lm_dtype_size(dt) / m->vec_bytes_per_cycle + e / rate;
    if (epi & LM__PLAN_EPI_GELU) c += 8 * e / rate + e * m->transc_cycles_per_elem;
    if (epi & LM__PLAN_EPI_SILU) c += 3 * e / rate + e * m->transc_cycles_per_elem;
    return c;
}

double lm__plan_cost_vector(const lm_plan_machine *m, lm_dtype dt, double bytes, double flops, double transc) {
    double rate = dt == LM_F16 ? m->vec_flops_f16 : m->vec_flops_f32;
    return (double)m->vec_call_cycles + bytes / m->vec_bytes_per_cycle + flops / rate +
           transc * m->transc_cycles_per_elem;
}

double lm__plan_cost_elementwise(const lm_plan_machine *m, lm__gopk k, lm_dtype dt, int64_t elems) {
    double e = (double)elems, s = (double)lm_dtype_size(dt);
    switch (k) {
    case LM__GOP_BIAS_ADD: return lm__plan_cost_vector(m, dt, 2 * e * s, e, 0);
    case LM__GOP_GELU: return lm__plan_cost_vector(m, dt, 2 * e * s, 8 * e, e); /* tanh form: 8 FLOPs + tanh */
    case LM__GOP_SILU: return lm__plan_cost_vector(m, dt, 2 * e * s, 3 * e, e); /* x / (1 + exp(-x)) */
    case LM__GOP_ADD:
    case LM__GOP_MUL: return lm__plan_cost_vector(m, dt, 3 * e * s, e, 0);
    case LM__GOP_SWIGLU: return lm__plan_cost_vector(m, dt, 3 * e * s, 4 * e, e); /* silu as above, then * up */
    default: return 0;
    }
}

double lm__plan_cost_rows(const lm_plan_machine *m, lm__gopk k, lm_dtype dt, int64_t rows, int64_t n) {
    double e = (double)rows * (double)n, s = (double)lm_dtype_size(dt);
    switch (k) {
    case LM__GOP_SOFTMAX: return lm__plan_cost_vector(m, dt, 3 * e * s, 4 * e, e); /* max, exp+sum, scale */
    case LM__GOP_LAYERNORM: return lm__plan_cost_vector(m, dt, 3 * e * s, 7 * e, (double)rows);
    case LM__GOP_RMSNORM: return lm__plan_cost_vector(m, dt, 3 * e * s, 4 * e, (double)rows);
    default: return 0;
    }
}

double lm__plan_cost_rope(const lm_plan_machine *m, lm_dtype dt, int64_t tokens, int64_t heads, int64_t d) {
    double e = (double)(tokens * heads * d), pairs = (double)(tokens * d / 2), s = (double)lm_dtype_size(dt);
    /* x in, out, one i32 position per token, the f32 inv_freq table; per pair: the
     * angle and the two scaled factors, per element 2 multiplies + 1 add; sin and cos
     * once per token and frequency */
    return lm__plan_cost_vector(m, dt, 2 * e * s + 4.0 * (double)tokens + 2.0 * (double)d, 3 * e + 3 * pairs,
                                2 * pairs);
}

double lm__plan_cost_follow(const lm_plan_machine *m, lm__gopk k, const lm__plan_layout *lx) {
    int64_t elems = lm__plan_layout_shard_elems(lx), n = lx->block[lx->ndim - 1];
    if (k == LM__GOP_ROPE) return lm__plan_cost_rope(m, lx->dtype, lx->block[0] * lx->block[1], lx->block[2], n);
    if (lm__plan_is_rows(k)) return lm__plan_cost_rows(m, k, lx->dtype, elems / n, n);
    return lm__plan_cost_elementwise(m, k, lx->dtype, elems);
}

double lm__plan_cost_copy(const lm_plan_machine *m, int64_t bytes) {
    if (bytes <= 0) return 0;
    return (double)m->vec_call_cycles + (double)bytes / m->copy_bytes_per_cycle;
}

double lm__plan_cost_reduce(const lm_plan_machine *m, lm_dtype in_dt, lm_dtype out_dt, int64_t out_elems,
                            int64_t add_elems) {
    if (out_elems <= 0) return 0;
    double bytes = (double)(add_elems + out_elems) * (double)lm_dtype_size(in_dt) +
                   (double)out_elems * (double)lm_dtype_size(out_dt);
    return lm__plan_cost_vector(m, LM_F32, bytes, (double)add_elems, 0);
}

double lm__plan_cost_exchange(const lm_plan_machine *m, const lm__plan_xcost *x) {
    if (!x->max_recv && !x->max_send) return 0;
    return (double)m->sync_cycles + (double)LM_MAX(x->max_recv, x->max_send) / m->exch_bytes_per_cycle +
           (double)x->max_msgs * (double)m->msg_cycles;
}

double lm__plan_cost_redist(const lm_plan_machine *m, const lm__plan_layout *s, const lm__plan_layout *d,
                            lm__plan_ws *w, lm__plan_xcost *x_out) {
    lm__plan_xcost x;
    lm__plan_redist_stats(s, d, w, &x);
    if (x_out) *x_out = x;
    double c = lm__plan_cost_exchange(m, &x);
    if (s->partial) {
        int64_t elems = lm__plan_layout_shard_elems(d);
        c += lm__plan_cost_reduce(m, s->dtype, d->dtype, elems, x.max_add);
    } else if (x.max_local) {
        c += lm__plan_cost_copy(m, x.max_local);
    }
    return c;
}
