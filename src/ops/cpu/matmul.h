/* ops/cpu/matmul.h — the tuned CPU linear layer: y = x @ W^T with f32 activations and
 * f32, bf16 or f16 weights in Hugging Face Linear layout (W [N, K] row-major), or
 * int8 weights with one f32 scale per row (with the bias and accumulate of
 * lm_linear_out folded into the store).
 *
 * Accumulation is f32, x is never rounded, weights are widened exactly (at the
 * default exact precision; lm__cpu_linear_prec below has the opt-in fast one). The vector
 * path is chosen per call from ops/cpu/isa.h (AVX-512, AVX2+FMA+F16C, or portable
 * scalar). M <= a few rows streams W once split over threads by N (decode); larger
 * M packs W blocks into per-thread panels and runs a register-blocked microkernel.
 * y must not overlap x or W. Results do not depend on the thread count.
 */
#ifndef LOOM_OPS_CPU_MATMUL_H
#define LOOM_OPS_CPU_MATMUL_H

#include "ops/internal.h"

/* y[m * ldy + n] = sum_k x[m * ldx + k] * W[n * ldw + k] for m < M, n < N, k < K.
 * wdtype: LM_F32, LM_BF16 or LM_F16 (LM_I8 is LM_INVALID_ARGUMENT: lm__cpu_linear_i8 takes
 * it with its scales; other dtypes LM_UNSUPPORTED). K == 0 writes zeros.
 * Needs M, N, K >= 0, ldx, ldw >= 0, ldy >= N when M > 1 (rows of y never overlap),
 * and non-NULL pointers for whatever is read or written (LM_INVALID_ARGUMENT).
 * pool == NULL runs on the calling thread. Scratch comes from lm__alloc
 * (LM_OUT_OF_MEMORY; nothing leaks). Runs at the calling thread's precision
 * (ops/cpu/precision.h; exact unless a fast model's forward pass set it). */
lm_status lm__cpu_linear(lm_threadpool *pool, const float *x, int64_t ldx, const void *w, lm_dtype wdtype,
                         int64_t ldw, float *y, int64_t ldy, int64_t M, int64_t N, int64_t K);

/* lm__cpu_linear at precision prec (loom/ops.h lm_precision): LM_PRECISION_EXACT as
 * above; LM_PRECISION_FAST runs the GEMM of bf16 weights (M above the kernels'
 * gemv_max_m_16) with x rounded to bf16 and VDPBF16PS products (matmul_kernels.h,
 * lm__bf16dot_kernels), LM_UNSUPPORTED when the CPU lacks AVX512_BF16 or the ISA
 * override is below avx512; the gemv and f32/f16 weights stay exact. lm__cpu_linear
 * is this with the calling thread's precision (ops/cpu/precision.h). */
lm_status lm__cpu_linear_prec(lm_threadpool *pool, lm_precision prec, const float *x, int64_t ldx, const void *w,
                              lm_dtype wdtype, int64_t ldw, float *y, int64_t ldy, int64_t M, int64_t N, int64_t K);

/* The int8 form: y[m * ldy + n] = (accumulate ? y[m * ldy + n] : 0) + scales[n] *
 * sum_k x[m * ldx + k] * q[n * ldq + k] + (bias ? bias[n] : 0). scales and bias are
 * dense [N]. Same sizes, strides, errors, threading and determinism as lm__cpu_linear;
 * the gemv (M <= the kernels' gemv_max_m_16) applies the scale to each finished dot
 * product, the GEMM packs q * scale into its f32 panels. */
lm_status lm__cpu_linear_i8(lm_threadpool *pool, const float *x, int64_t ldx, const int8_t *q, int64_t ldq,
                            const float *scales, const float *bias, int accumulate, float *y, int64_t ldy, int64_t M,
                            int64_t N, int64_t K);
/* lm__cpu_linear_i8 at precision prec (lm__cpu_linear_i8 is this at the calling thread's).
 * LM_PRECISION_FAST: the gemv (decode rows) quantizes each x row to int8 per block of 64
 * k (scale max |x| / 127) and sums exact int8 products (AVX512_VNNI; LM_UNSUPPORTED
 * without it); the GEMM is exact either way. */
lm_status lm__cpu_linear_i8_prec(lm_threadpool *pool, lm_precision prec, const float *x, int64_t ldx, const int8_t *q,
                                 int64_t ldq, const float *scales, const float *bias, int accumulate, float *y,
                                 int64_t ldy, int64_t M, int64_t N, int64_t K);

/* The int4 form: y[m * ldy + n] = (accumulate ? y : 0) + sum_k x[m * ldx + k] * q(n, k)
 * * scales[n * lds + k / group] + (bias ? bias[n] : 0), q(n, k) the signed nibble k & 1
 * (low first) of byte q[n * ldq + k / 2]. group 32, 64 or 128 dividing K
 * (LM_INVALID_ARGUMENT otherwise); bias dense [N]. The scales are f32 or bf16 (sdt;
 * every kernel reads either, widening bf16 exactly where it reads a scale). Same sizes,
 * strides, threading and determinism as lm__cpu_linear; gemv and GEMM both use the
 * dequantized q * scale. */
lm_status lm__cpu_linear_i4(lm_threadpool *pool, const float *x, int64_t ldx, const uint8_t *q, int64_t ldq,
                            const void *scales, lm_dtype sdt, int64_t lds, int group, const float *bias,
                            int accumulate, float *y, int64_t ldy, int64_t M, int64_t N, int64_t K);
/* lm__cpu_linear_i4 at precision prec (lm__cpu_linear_i4: the calling thread's); fast:
 * the gemv with x quantized as lm__cpu_linear_i8_prec's, the GEMM exact. */
lm_status lm__cpu_linear_i4_prec(lm_threadpool *pool, lm_precision prec, const float *x, int64_t ldx, const uint8_t *q,
                                 int64_t ldq, const void *scales, lm_dtype sdt, int64_t lds, int group,
                                 const float *bias, int accumulate, float *y, int64_t ldy, int64_t M, int64_t N,
                                 int64_t K);

/* 1 if lm_matmul_out(a, b, out) maps onto lm__cpu_linear: a f32 [..., M, K], out f32
 * [..., M, N] with the same batch dims, both with unit inner stride and batch + M dims
 * that merge into one row dimension (any row stride); b bf16/f16/f32 [K, N] with
 * stride 1 along K (the transposed view of a row-major [N, K] weight), or
 * [..., K, N] whose batch dims are size 1 or stride 0 (one shared weight). All on
 * the CPU. Views may be the batch-expanded ones lm_matmul_out builds. */
int lm__cpu_linear_supported(const lm_tensor_view *a, const lm_tensor_view *b_transposed_weight,
                             const lm_tensor_view *out);

/* Runs lm__cpu_linear on views accepted by lm__cpu_linear_supported (LM_UNSUPPORTED
 * otherwise). Shapes must already be validated by the caller. */
lm_status lm__cpu_linear_views(lm_threadpool *pool, const lm_tensor_view *a, const lm_tensor_view *b_transposed_weight,
                               const lm_tensor_view *out);

#endif
