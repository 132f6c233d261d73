/* ops/internal.h — shared validation, element access and dispatch helpers for the
 * operator implementations (never installed).
 *
 * Public operators live in src/ops/<family>.c: they validate every argument (device,
 * dtype, shape, output overlap) with the lm__op_* checks, then route to one level:
 * ops/ref (readable CPU truth source), ops/cpu (tuned), or an entry of the CUDA
 * table (ops/cuda_table.h). The ref
 * level reads and writes elements through lm__ld/lm__st (double precision), so it
 * handles every float dtype and any strides with one code path.
 */
#ifndef LOOM_OPS_INTERNAL_H
#define LOOM_OPS_INTERNAL_H

#include "base/internal.h"
#include "loom/ops.h"
#include "ops/cuda_table.h"

#include <math.h>
#include <string.h>

/* ---- element access (offsets in elements) ---------------------------------------- */
static inline double lm__ld(lm_dtype dt, const void *base, int64_t off) {
    switch (dt) {
    case LM_F32: return ((const float *)base)[off];
    case LM_BF16: return lm_bf16_to_f32(((const uint16_t *)base)[off]);
    case LM_F16: return lm_f16_to_f32(((const uint16_t *)base)[off]);
    case LM_I32: return ((const int32_t *)base)[off];
    case LM_I64: return (double)((const int64_t *)base)[off];
    case LM_U8: return ((const uint8_t *)base)[off];
    case LM_I8: return ((const int8_t *)base)[off];
    case LM_F8_E4M3: return lm_f8e4m3_to_f32(((const uint8_t *)base)[off]);
    }
    return NAN;
}

/* Stores v rounded to dt (float dtypes round to nearest even via f32). */
static inline void lm__st(lm_dtype dt, void *base, int64_t off, double v) {
    switch (dt) {
    case LM_F32: ((float *)base)[off] = (float)v; break;
    case LM_BF16: ((uint16_t *)base)[off] = lm_f32_to_bf16((float)v); break;
    case LM_F16: ((uint16_t *)base)[off] = lm_f32_to_f16((float)v); break;
    case LM_I32: ((int32_t *)base)[off] = (int32_t)v; break;
    case LM_I64: ((int64_t *)base)[off] = (int64_t)v; break;
    case LM_U8: ((uint8_t *)base)[off] = (uint8_t)v; break;
    case LM_I8: ((int8_t *)base)[off] = (int8_t)v; break;
    case LM_F8_E4M3: ((uint8_t *)base)[off] = lm_f32_to_f8e4m3((float)v); break;
    }
}

/* Reads an integer index element exactly (i32/i64/u8). */
static inline int64_t lm__ld_index(lm_dtype dt, const void *base, int64_t off) {
    switch (dt) {
    case LM_I32: return ((const int32_t *)base)[off];
    case LM_I64: return ((const int64_t *)base)[off];
    case LM_U8: return ((const uint8_t *)base)[off];
    default: return 0;
    }
}

/* Element r of a 1-d index view (targets, ids). */
static inline int64_t lm__index_at(const lm_tensor_view *v, int64_t r) {
    return lm__ld_index(v->dtype, v->data, r * v->stride[0]);
}

/* The cache block that holds position p of row b: slots i32 [B] (one block per row)
 * or [B, NB] (a paged cache, blocks of P positions: slots[b, p / P]). */
static inline int64_t lm__kv_block(const lm_tensor_view *slots, int64_t b, int64_t p, int64_t P) {
    if (slots->ndim == 1) return lm__index_at(slots, b);
    return lm__ld_index(slots->dtype, slots->data, b * slots->stride[0] + (p / P) * slots->stride[1]);
}
/* ops/kv.c: the checks of a step's block table (slots [B] or [B, NB]) and positions
 * [B, T] over caches of S blocks of P positions (include/loom/ops.h); the values only
 * where the tensors are host memory. */
lm_status lm__kv_check_indices(const char *op, int64_t B, int64_t T, int64_t S, int64_t P, const lm_tensor_view *slots,
                               const lm_tensor_view *positions);
/* Blocks per row of a block table (1 for the [B] form). */
static inline int64_t lm__kv_blocks_per_row(const lm_tensor_view *slots) { return slots->ndim == 2 ? slots->shape[1] : 1; }

/* log(sum_j exp(x_j)) over the n elements of dtype dt at base[x0 + j * step], in
 * double with the max subtracted (no overflow); an infinite max is returned as is
 * (all -inf gives -inf, any +inf gives +inf). */
double lm__row_logsumexp(lm_dtype dt, const void *base, int64_t x0, int64_t step, int64_t n);

static inline void lm__st_index(lm_dtype dt, void *base, int64_t off, int64_t v) {
    if (dt == LM_I32) ((int32_t *)base)[off] = (int32_t)v;
    else ((int64_t *)base)[off] = v;
}

/* ---- N-d iteration -------------------------------------------------------------------
 * lm__nd_next advances a row-major index over shape; returns 0 after the last one.
 * lm__offset maps an index (of the view's own rank) to an element offset. */
static inline int lm__nd_next(int ndim, const int64_t *shape, int64_t *idx) {
    for (int d = ndim - 1; d >= 0; d--) {
        if (++idx[d] < shape[d]) return 1;
        idx[d] = 0;
    }
    return 0;
}

static inline int64_t lm__offset(const lm_tensor_view *v, const int64_t *idx) {
    int64_t off = 0;
    for (int d = 0; d < v->ndim; d++) off += idx[d] * v->stride[d];
    return off;
}

/* ---- validation (each names the operator and the operand in its message) --------------- */
/* All views non-NULL and on the context's device. */
lm_status lm__op_check_devices(lm_ctx *ctx, const char *op, int n, const lm_tensor_view *const *views,
                               const char *const *names);
lm_status lm__op_check_float(const char *op, const char *name, const lm_tensor_view *v);
lm_status lm__op_check_index(const char *op, const char *name, const lm_tensor_view *v); /* i32 or i64 */
lm_status lm__op_check_dtype(const char *op, const char *name, const lm_tensor_view *v, lm_dtype want);
/* v->ndim == ndim and every shape entry equals (or shape[i] < 0 = any). */
lm_status lm__op_check_shape(const char *op, const char *name, const lm_tensor_view *v, int ndim,
                             const int64_t *shape);
lm_status lm__op_check_same_shape(const char *op, const char *name, const lm_tensor_view *v,
                                  const lm_tensor_view *like);
/* Outputs may not overlap themselves. */
lm_status lm__op_check_out(const char *op, const char *name, const lm_tensor_view *out);
/* Broadcast shape of a and b (numpy rules) into shape/ndim. */
lm_status lm__op_broadcast_shape(const char *op, const lm_tensor_view *a, const lm_tensor_view *b, int *ndim,
                                 int64_t *shape);
/* The output shape of a[..., M, K] @ b[..., K, N] with numpy batch broadcasting
 * (LM_SHAPE_MISMATCH naming both shapes otherwise); shared by matmul and its backward. */
lm_status lm__matmul_shape(const char *op, const lm_tensor_view *a, const lm_tensor_view *b, int *ndim, int64_t *shape);
/* Writes "[2, 3, 4]" into buf. */
const char *lm__shape_str(const lm_tensor_view *v, char *buf, size_t size);

/* ---- dispatch ------------------------------------------------------------------------------
 * The CUDA level is the table of ops/cuda_table.h (NULL in a build without CUDA). */
typedef enum lm__level { LM__LEVEL_REF = 0, LM__LEVEL_CPU = 1, LM__LEVEL_CUDA = 2 } lm__level;
/* ops/linear.c: the shapes and dtypes the GPU's fused Linear kernels take (the
 * GEMV for up to LM__LINEAR_GEMV_MAX_ROWS rows of f32 over bf16 weights, any input
 * form; the cuBLASLt GEMM for plain bf16 x bf16 without accumulate; K a multiple of
 * 8; quantized weights (i8, u8 int4, f8_e4m3) with f32 x at any rows, every form and
 * accumulate: ops/cuda/gemv_quant.cu): what the kernels can run, the rule of the CUDA
 * dispatch (ops/cuda/step_cuda.c). */
#define LM__LINEAR_GEMV_MAX_ROWS 8
int lm__linear_fused_rule(lm_linear_input input, int accumulate, int64_t rows, int64_t K, lm_dtype x, lm_dtype w);
/* ops/linear.c: what a graph should use on CUDA, the rule behind lm_linear_supported
 * and the pair epilogues' rule: lm__linear_fused_rule, except that f32 x over bf16
 * weights takes the GEMV for at most LM__LINEAR_GEMV_BF16_ROWS rows (LOOM_CUDA_GEMV_ROWS
 * overrides it, 0..8): from 3 rows on, the rows normalized into bf16 and the cuBLASLt
 * GEMM measured faster on an H200 (bench/NOTES.md, "Decode at the memory limit" v8: 3
 * rows 1.08x, 4 1.10x, 8 1.82x; 2 rows 0.82x), though lm_linear_out still runs them in
 * the GEMV when called so. */
#define LM__LINEAR_GEMV_BF16_ROWS 2
int lm__linear_graph_rule(lm_linear_input input, int accumulate, int64_t rows, int64_t K, lm_dtype x, lm_dtype w);
/* ops/linear.c: the rows up to which every graph's products run the row-independent
 * GEMV, whatever the weights (LM__LINEAR_GEMV_BF16_ROWS, or LOOM_CUDA_GEMV_ROWS). */
int64_t lm__linear_graph_gemv_rows(void);
/* ops/linear.c: the calls graphs give the CUDA decode GEMV with a pair epilogue, the
 * attention front or the SwiGLU (lm_linear_qkv_rope_fused, lm_linear_swiglu_fused on a
 * GPU): f32 x in the RMSNorm input form, bf16 weights at the rows lm__linear_graph_rule
 * gives the GEMV (1-2), quantized weights at 3 to 8 rows; K counts inputs. */
int lm__linear_pair_rule(lm_linear_input input, int64_t rows, int64_t K, lm_dtype x, lm_dtype w, int qk_norm);
/* The gate|up product with its SwiGLU as one wgmma GEMM (ops/cuda/gemm_wg.cu): the plain
 * input form of bf16 x over bf16 weights (graphs give bf16 x past the GEMV's rows: prefill
 * and batched decode), K a multiple of 8, at least lm__linear_swiglu_gemm_rows() rows
 * (LM__LINEAR_SWIGLU_GEMM_ROWS, or LOOM_CUDA_SWIGLU_GEMM_ROWS=R for side-by-side runs):
 * from 8 rows it measured as fast as cuBLASLt's product and the SwiGLU kernel (0.99-1.04x
 * tok/s at 8-100 rows), at 4 rows ~2% slower (bench/NOTES.md, "Decode at the memory
 * limit" v18). lm_linear_swiglu_fused also needs the device to run it (sm_90a). */
#define LM__LINEAR_SWIGLU_GEMM_ROWS 8
int64_t lm__linear_swiglu_gemm_rows(void);
int lm__linear_swiglu_gemm_rule(lm_linear_input input, int64_t rows, int64_t K, lm_dtype x, lm_dtype w);
/* ops/linear.c: 1 when a graph may store a product of this shape as bf16 on device d:
 * a CUDA device, bf16 x and weights past the GEMV's rows (the cuBLASLt GEMM, which rounds
 * its f32 accumulators to bf16 once on store), plain input, no bias, no accumulate.
 * Graphs use it for products read only by a SwiGLU whose output is bf16 too
 * (graph/fuse.c, lm__pass_gemm_inputs). LOOM_CUDA_BF16_PRODUCTS=0 says 0 (side-by-side
 * measurements). lm__linear_low_out_rule is the same without the device and the switch. */
int lm__linear_low_out(lm_device d, int64_t rows, int64_t K, lm_dtype x, lm_dtype w);
int lm__linear_low_out_rule(int64_t rows, int64_t K, lm_dtype x, lm_dtype w);
/* ops/optim.c, CUDA contexts only: lm_adamw_update with the step's values read on the
 * device when the update runs, so a captured training step replays with each step's:
 * dyn [4] doubles (an i64 tensor: no f64 dtype) = {lr, lr / (1 - beta1^step) rounded to
 * f32, sqrt(1 - beta2^step) rounded to f32, grad_scale} (hp's lr, step and grad_scale must still be valid; unused); and
 * dyn[3] = the clipping coefficient of the f32 sum of squares sumsq (min(1, clip /
 * (sqrt(sumsq) + 1e-6)); 1 for clip <= 0 or a norm not finite), as the host computes it. */
lm_status lm__adamw_update_dyn(lm_ctx *ctx, int n, const lm_tensor_view *params, const lm_tensor_view *grads,
                               const lm_tensor_view *m, const lm_tensor_view *v, const float *weight_decay,
                               const lm_adamw_hparams *hp, const lm_tensor_view *dyn);
lm_status lm__clip_scale_out(lm_ctx *ctx, const lm_tensor_view *sumsq, double clip, const lm_tensor_view *dyn);
/* ops/linear.c: LM_OK, or (while ctx captures) LM_UNSUPPORTED naming op and the rule that
 * said no kernel: a fused operator's composition allocates temporaries. */
lm_status lm__op_composition_allowed(lm_ctx *ctx, const char *op, const char *rule);
/* ops/linear.c: lm_linear_out's checks of everything but out (the input form, w and its
 * scales, x [M, K] or [M, 2K], the bias [N] and the norm weight), errors named by op. */
lm_status lm__linear_check_inputs(const char *op, const lm_tensor_view *x, const lm_tensor_view *w,
                                  const lm_tensor_view *bias, const lm_linear_params *p);

/* Picks the implementation level for an operator on ctx's device given which levels
 * exist (has_cpu: a tuned CPU version, has_cuda: a CUDA version). Fails with
 * LM_UNSUPPORTED naming the operator when the request cannot be met. */
lm_status lm__op_level(lm_ctx *ctx, const char *op, int has_cpu, int has_cuda, lm__level *out);

/* elementwise.c: acc += x, both any float dtype, x of acc's shape, converted to acc's
 * dtype (the autograd's accumulation of a gradient into its buffer). An f32 acc takes x
 * widened exactly, in one pass on CUDA; otherwise x of another dtype is cast into a
 * temporary (rounded to acc's dtype) and added by lm_add_out. */
lm_status lm__accumulate_out(lm_ctx *ctx, const lm_tensor_view *acc, const lm_tensor_view *x);

/* rope.c: the rope parameters against x [B, T, H, D] (NULL checks, style, inv_freq
 * [D / 2] f32, positions [T] or [B, T], and with with_bias the bias [H, D] in x's
 * dtype), shared by the forward and the backward. */
lm_status lm__rope_check_params(lm_ctx *ctx, const char *op, const lm_tensor_view *x, const lm_rope_params *p,
                                int with_bias);

/* Allocating-form helper: a new tensor on ctx's device. */
lm_status lm__op_alloc(lm_ctx *ctx, lm_dtype dt, int ndim, const int64_t *shape, lm_tensor **out);
/* Destroys *t and clears it when st != LM_OK; returns st. */
lm_status lm__op_finish(lm_status st, lm_tensor **t);

#endif
