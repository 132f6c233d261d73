/* ops/linear.c — lm_linear_out: a Linear layer with its input normalization or
 * SwiGLU and its residual add fused (the decode step's GEMVs). Validation and
 * dispatch; the composition it equals is the reference (ops/ref/linear.c).
 *
 * x [M, K] (or [M, 2K] for SwiGLU), w [N, K], bias [N] f32 or NULL, norm_weight [K]
 * f32, out [M, N]. out may not overlap x, w or the bias; with accumulate it is read
 * before it is written (element by element, the residual stream in place).
 * On CUDA the fused kernels (ops/cuda/step_cuda.c: the GEMV with its prologue, the
 * cuBLASLt GEMM with its bias) run what lm_linear_supported admits; any other valid
 * call runs the composition in f32 through the public operators, which allocates
 * and waits for its temporaries (refused inside a capture).
 * int8 weights (w i8 with p->w_scales f32 [N]) run on the CPU only: the reference,
 * or the tuned level (ops/cpu/matmul.c: the int8 gemv / GEMM with the bias and
 * accumulate in its store) after the prologue is formed by lm_rmsnorm_out /
 * lm_swiglu_out into an [M, K] f32 scratch; lm_linear_supported says which calls.
 * int4 weights (w u8 [N, K/2], two nibbles per byte, p->w_bits = 4, p->w_scales f32
 * or bf16 [N, K / p->w_group]) take the same two levels through lm__cpu_linear_i4;
 * CUDA reads either dtype too (ops/cuda/gemv_quant.cu).
 * fp8 weights (w f8_e4m3 [N, K] with p->w_scales f32 [N]) run the reference on the CPU.
 * On CUDA all three quantized forms go to the table's linear_quant (ops/cuda/
 * gemv_quant.cu: a GEMV for up to 8 rows; for more, given p->workspace, the input and
 * the weights rounded to bf16 in it and one cuBLASLt GEMM, else a tensor-core product
 * of the weights dequantized in shared memory; a readable kernel for other layouts).
 * None allocates, so a captured step may hold them, and each takes every input form
 * and accumulate: lm_linear_supported is 1 for them on CUDA (f32 x), so the GPU's
 * passes fuse and stack quantized linears as they do bf16 ones.
 */
#include "ops/alias.h"
#include "ops/cpu/matmul.h"
#include "ops/cpu/precision.h"
#include "ops/ref/linear.h"
#include "runtime/internal.h"

static const lm_linear_params k_plain = {.input = LM_LINEAR_IN};

/* int4 weights: u8 w with p->w_bits = 4 (K = 2 * w's columns). */
static int is_i4(const lm_tensor_view *w, const lm_linear_params *p) { return w->dtype == LM_U8 && p->w_bits == 4; }

/* Quantized weights of any format (int8, int4, fp8). */
static int is_quant(const lm_tensor_view *w, const lm_linear_params *p) {
    return w->dtype == LM_I8 || w->dtype == LM_F8_E4M3 || is_i4(w, p);
}

static const char *quant_name(const lm_tensor_view *w, const lm_linear_params *p) {
    return is_i4(w, p) ? "int4" : w->dtype == LM_F8_E4M3 ? "fp8" : "int8";
}

/* int4 weights: w u8 [N, K/2] with w_bits 4, a group of 32/64/128 dividing K and f32
 * or bf16 scales [N, K/group]. */
static lm_status check_int4(const char *op, const lm_tensor_view *w, const lm_linear_params *p) {
    const lm_tensor_view *sc = p->w_scales;
    if (w->dtype != LM_U8)
        return lm__error(LM_INVALID_ARGUMENT, "%s: w_bits = 4 (int4 weights) needs w of dtype u8 (two 4-bit values "
                         "per byte), but w is %s", op, lm_dtype_name(w->dtype));
    int g = p->w_group;
    if (g != 32 && g != 64 && g != 128)
        return lm__error(LM_INVALID_ARGUMENT, "%s: int4 w_group %d; expected 32, 64 or 128", op, g);
    int64_t K = 2 * w->shape[1];
    if (K % g)
        return lm__error(LM_INVALID_ARGUMENT, "%s: int4 K = %lld (2 x w's %lld columns) is not a multiple of w_group "
                         "%d", op, (long long)K, (long long)w->shape[1], g);
    if (!sc)
        return lm__error(LM_INVALID_ARGUMENT, "%s: int4 weights need w_scales (lm_linear_params.w_scales, f32 "
                         "or bf16 [N, K/w_group], one scale per group)", op);
    if (sc->dtype != LM_F32 && sc->dtype != LM_BF16)
        return lm__error(LM_DTYPE_MISMATCH, "%s: int4 w_scales has dtype %s; expected f32 or bf16", op,
                         lm_dtype_name(sc->dtype));
    int64_t ss[2] = {w->shape[0], K / g};
    return lm__op_check_shape(op, "w_scales [N, K/w_group]", sc, 2, ss);
}

/* w's dtype and its scales: float w without scales, i8 or f8_e4m3 w with f32 [N] scales,
 * or int4. */
static lm_status check_weights(const char *op, const lm_tensor_view *w, const lm_linear_params *p) {
    const lm_tensor_view *sc = p->w_scales;
    if (p->w_bits == 4) return check_int4(op, w, p);
    if (p->w_bits != 0 && !(p->w_bits == 8 && (w->dtype == LM_I8 || w->dtype == LM_F8_E4M3)))
        return lm__error(LM_INVALID_ARGUMENT, "%s: w_bits %d with w of dtype %s (0 for float, i8 and f8_e4m3 "
                         "weights, 4 for int4)", op, p->w_bits, lm_dtype_name(w->dtype));
    if (p->w_group)
        return lm__error(LM_INVALID_ARGUMENT, "%s: w_group %d is only for int4 weights (w_bits = 4)", op, p->w_group);
    if (w->dtype == LM_U8)
        return lm__error(LM_INVALID_ARGUMENT, "%s: w is u8; int4 weights say so with w_bits = 4 and w_group", op);
    if (w->dtype != LM_I8 && w->dtype != LM_F8_E4M3) {
        if (!lm_dtype_is_float(w->dtype))
            return lm__error(LM_UNSUPPORTED, "%s: w has dtype %s; expected f32, bf16, f16, i8, f8_e4m3 or int4 (u8)",
                             op, lm_dtype_name(w->dtype));
        if (sc)
            return lm__error(LM_INVALID_ARGUMENT, "%s: w_scales are only for int8, fp8 and int4 weights, but w is %s",
                             op, lm_dtype_name(w->dtype));
        return LM_OK;
    }
    if (!sc)
        return lm__error(LM_INVALID_ARGUMENT, "%s: %s weights need w_scales (lm_linear_params.w_scales, f32 [N], "
                         "one scale per output row)", op, w->dtype == LM_I8 ? "int8" : "fp8");
    LM_TRY(lm__op_check_dtype(op, "w_scales", sc, LM_F32));
    int64_t ns[1] = {w->shape[0]};
    return lm__op_check_shape(op, "w_scales [N]", sc, 1, ns);
}

lm_status lm__linear_check_inputs(const char *op, const lm_tensor_view *x, const lm_tensor_view *w,
                                  const lm_tensor_view *bias, const lm_linear_params *p) {
    if ((unsigned)p->input > LM_LINEAR_IN_SWIGLU) return lm__error(LM_INVALID_ARGUMENT, "%s: unknown input form %d", op, (int)p->input);
    int64_t any2[2] = {-1, -1};
    LM_TRY(lm__op_check_shape(op, "w [N, K]", w, 2, any2));
    LM_TRY(check_weights(op, w, p));
    LM_TRY(lm__op_check_float(op, "x", x));
    if (x->dtype != LM_F32 && is_quant(w, p))
        return lm__error(LM_DTYPE_MISMATCH, "%s: x is %s; %s weights take f32 x", op, lm_dtype_name(x->dtype),
                         quant_name(w, p));
    if (x->dtype != LM_F32 && x->dtype != w->dtype)
        return lm__error(LM_DTYPE_MISMATCH, "%s: x is %s; expected f32 or w's %s", op, lm_dtype_name(x->dtype),
                         lm_dtype_name(w->dtype));
    int64_t M = x->ndim == 2 ? x->shape[0] : -1, N = w->shape[0], K = is_i4(w, p) ? 2 * w->shape[1] : w->shape[1];
    int64_t xs[2] = {M, p->input == LM_LINEAR_IN_SWIGLU ? 2 * K : K}, bs[1] = {N}, ks[1] = {K};
    LM_TRY(lm__op_check_shape(op, p->input == LM_LINEAR_IN_SWIGLU ? "x [M, 2K]" : "x [M, K]", x, 2, xs));
    if (bias) {
        LM_TRY(lm__op_check_dtype(op, "bias", bias, LM_F32));
        LM_TRY(lm__op_check_shape(op, "bias [N]", bias, 1, bs));
    }
    if (p->input == LM_LINEAR_IN_RMSNORM) {
        if (!p->norm_weight) return lm__error(LM_INVALID_ARGUMENT, "%s: RMSNORM input without a norm weight", op);
        LM_TRY(lm__op_check_dtype(op, "norm_weight", p->norm_weight, LM_F32));
        LM_TRY(lm__op_check_shape(op, "norm_weight [K]", p->norm_weight, 1, ks));
        if (!isfinite(p->eps) || p->eps < 0) return lm__error(LM_INVALID_ARGUMENT, "%s: eps %g", op, p->eps);
    }
    return LM_OK;
}

static lm_status check(const char *op, const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                       const lm_linear_params *p, const lm_tensor_view *out) {
    LM_TRY(lm__linear_check_inputs(op, x, w, bias, p));
    LM_TRY(lm__op_check_float(op, "out", out));
    int64_t os[2] = {x->shape[0], w->shape[0]};
    LM_TRY(lm__op_check_shape(op, "out [M, N]", out, 2, os));
    LM_TRY(lm__op_check_out(op, "out", out));
    LM_TRY(lm__op_check_alias(op, "out", out, "x", x, 0));
    LM_TRY(lm__op_check_alias(op, "out", out, "w", w, 0));
    if (p->w_scales) LM_TRY(lm__op_check_alias(op, "out", out, "w_scales", p->w_scales, 0));
    return bias ? lm__op_check_alias(op, "out", out, "bias", bias, 0) : LM_OK;
}

int lm__linear_fused_rule(lm_linear_input input, int accumulate, int64_t rows, int64_t K, lm_dtype x, lm_dtype w) {
    if ((unsigned)input > LM_LINEAR_IN_SWIGLU || rows < 1 || K < 1) return 0;
    if (w == LM_I8 || w == LM_U8 || w == LM_F8_E4M3) return x == LM_F32; /* gemv_quant.cu: every form, any rows */
    if (K % 8 || w != LM_BF16) return 0;
    if (rows <= LM__LINEAR_GEMV_MAX_ROWS && x == LM_F32) return 1;  /* the GEMV: every form */
    return input == LM_LINEAR_IN && !accumulate && x == LM_BF16; /* the GEMM with its bias epilogue */
}

/* The CPU's tuned int8 / int4 (u8) path: f32 x, any input form, bias and accumulate
 * (the layout rule of cpu_i8_layout below is about strides, which any graph value meets). */
static int cpu_i8_rule(lm_linear_input input, int64_t rows, int64_t K, lm_dtype x, lm_dtype w) {
    return (unsigned)input <= LM_LINEAR_IN_SWIGLU && rows >= 1 && K >= 1 && x == LM_F32 && (w == LM_I8 || w == LM_U8);
}

/* The row count a measurement switch `name` sets (lo..hi), else dflt; read once into *r. */
static int64_t switch_rows(int64_t *r, const char *name, int64_t lo, int64_t hi, int64_t dflt) {
    if (*r < 0) {
        const char *e = getenv(name);
        long long v = e ? atoll(e) : -1;
        *r = e && v >= lo && v <= hi ? (int64_t)v : dflt;
    }
    return *r;
}

/* LOOM_CUDA_GEMV_ROWS=R (0..8): graphs give bf16 weights the GEMV up to R rows instead
 * of LM__LINEAR_GEMV_BF16_ROWS (side-by-side measurements). */
int64_t lm__linear_graph_gemv_rows(void) {
    static int64_t r = -1;
    return switch_rows(&r, "LOOM_CUDA_GEMV_ROWS", 0, LM__LINEAR_GEMV_MAX_ROWS, LM__LINEAR_GEMV_BF16_ROWS);
}

int lm__linear_graph_rule(lm_linear_input input, int accumulate, int64_t rows, int64_t K, lm_dtype x, lm_dtype w) {
    if (w == LM_BF16 && x == LM_F32 && rows > lm__linear_graph_gemv_rows()) return 0; /* bf16 x through the GEMM instead */
    return lm__linear_fused_rule(input, accumulate, rows, K, x, w);
}

int lm_linear_supported(lm_device d, lm_linear_input input, int accumulate, int64_t rows, int64_t K, lm_dtype x_dtype,
                        lm_dtype w_dtype) {
    /* float weights on the CPU: lm_linear_out runs the reference, so graphs keep the
     * composition (lm_matmul_out's tuned GEMM); int8 weights have the tuned path */
    if (lm__device_host_addressable(d)) return cpu_i8_rule(input, rows, K, x_dtype, w_dtype);
    if (!lm__cuda_ops_get()) return 0;
    return lm__linear_graph_rule(input, accumulate, rows, K, x_dtype, w_dtype);
}

int lm__linear_low_out_rule(int64_t rows, int64_t K, lm_dtype x, lm_dtype w) {
    return x == LM_BF16 && w == LM_BF16 && rows > lm__linear_graph_gemv_rows() &&
           lm__linear_fused_rule(LM_LINEAR_IN, 0, rows, K, x, w);
}

/* 1 when the measurement switch `name` is set to "0" (the graphs' CUDA fusions below
 * each have one, for side-by-side runs in one binary). */
static int switched_off(const char *name) {
    const char *e = getenv(name);
    return e && strcmp(e, "0") == 0;
}

/* LOOM_CUDA_BF16_PRODUCTS=0 keeps every product f32. */
int lm__linear_low_out(lm_device d, int64_t rows, int64_t K, lm_dtype x, lm_dtype w) {
    if (lm__device_host_addressable(d) || !lm__cuda_ops_get() || switched_off("LOOM_CUDA_BF16_PRODUCTS")) return 0;
    return lm__linear_low_out_rule(rows, K, x, w);
}

lm_status lm__op_composition_allowed(lm_ctx *ctx, const char *op, const char *rule) {
    if (!lm_ctx_capturing(ctx)) return LM_OK;
    return lm__error(LM_UNSUPPORTED, "%s: no fused kernel for these views (%s is 0), and the composition allocates, "
                     "which a capture cannot", op, rule);
}

/* Whether the CUDA decode GEMV stages `rows` input rows of K values in shared memory
 * (1 without CUDA: the rules below are then only read as shape rules). */
static int gemv_stages(int64_t rows, int64_t K) {
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    return !cu || cu->gemv_stages(rows, K);
}

int lm__linear_pair_rule(lm_linear_input input, int64_t rows, int64_t K, lm_dtype x, lm_dtype w, int qk_norm) {
    if (qk_norm || input != LM_LINEAR_IN_RMSNORM || x != LM_F32 || rows < 1 || rows > LM__LINEAR_GEMV_MAX_ROWS) return 0;
    /* the decode GEMV's 16-byte weight vectors: 8 bf16, 16 int8 / fp8 or 32 int4 inputs */
    int quant = w == LM_U8 || w == LM_I8 || w == LM_F8_E4M3;
    int64_t per_vector = w == LM_U8 ? 32 : quant ? 16 : 8;
    /* quantized weights at 2 rows and int4 at one run the GEMV's 4- and 8-row warps, whose
     * pair epilogues measured slower than the separate kernels (bench/NOTES.md, v6);
     * int8 and fp8 at one row run shapes of their own, with which they measured faster
     * (quantized weights on CUDA, v9) */
    if (quant && rows <= 2 && !((w == LM_F8_E4M3 || w == LM_I8) && rows == 1)) return 0;
    /* the epilogues are built for staged inputs only */
    return K % per_vector == 0 && gemv_stages(rows, K) && lm__linear_graph_rule(input, 0, rows, K, x, w);
}

/* LOOM_CUDA_PAIR_EPILOGUES=0: the decode GEMV's pair epilogues are not used (graphs keep
 * the front and the SwiGLU as their own kernels). */
static int pair_epilogues_on(void) { return !switched_off("LOOM_CUDA_PAIR_EPILOGUES"); }

int lm_linear_qkv_rope_fused(lm_device d, lm_linear_input input, int64_t rows, int64_t K, lm_dtype x_dtype,
                             lm_dtype w_dtype, int qk_norm) {
    if (lm__device_host_addressable(d) || !lm__cuda_ops_get() || !pair_epilogues_on()) return 0;
    return lm__linear_pair_rule(input, rows, K, x_dtype, w_dtype, qk_norm);
}

int64_t lm__linear_swiglu_gemm_rows(void) {
    static int64_t r = -1;
    return switch_rows(&r, "LOOM_CUDA_SWIGLU_GEMM_ROWS", 1, INT64_MAX, LM__LINEAR_SWIGLU_GEMM_ROWS);
}

int lm__linear_swiglu_gemm_rule(lm_linear_input input, int64_t rows, int64_t K, lm_dtype x, lm_dtype w) {
    return input == LM_LINEAR_IN && x == LM_BF16 && w == LM_BF16 && rows >= lm__linear_swiglu_gemm_rows() && K % 8 == 0;
}

int lm_linear_swiglu_fused(lm_device d, lm_linear_input input, int64_t rows, int64_t K, lm_dtype x_dtype,
                           lm_dtype w_dtype) {
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    if (lm__device_host_addressable(d) || !cu) return 0;
    /* LOOM_CUDA_SWIGLU_GEMM=0: the gate|up GEMM and the SwiGLU stay two kernels */
    if (lm__linear_swiglu_gemm_rule(input, rows, K, x_dtype, w_dtype))
        return !switched_off("LOOM_CUDA_SWIGLU_GEMM") && cu->swiglu_gemm();
    if (!pair_epilogues_on()) return 0;
    return lm__linear_pair_rule(input, rows, K, x_dtype, w_dtype, 0); /* the same GEMV, another epilogue */
}

lm_status lm_linear_swiglu_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                               const lm_linear_params *p, const lm_tensor_view *out) {
    const char *op = "linear_swiglu";
    if (!p) return lm__error(LM_INVALID_ARGUMENT, "%s: NULL linear parameters", op);
    const lm_tensor_view *vs[] = {x, w, out, bias ? bias : x, p->norm_weight ? p->norm_weight : x,
                                  p->w_scales ? p->w_scales : x};
    static const char *const names[] = {"x", "w", "out", "bias", "norm_weight", "w_scales"};
    LM_TRY(lm__op_check_devices(ctx, op, 6, vs, names));
    if (p->accumulate) return lm__error(LM_INVALID_ARGUMENT, "%s: the projection cannot accumulate", op);
    LM_TRY(lm__linear_check_inputs(op, x, w, bias, p));
    LM_TRY(lm__op_check_float(op, "out", out));
    int64_t M = x->shape[0], N = w->shape[0], os[2] = {M, N / 2};
    if (N % 2) return lm__error(LM_SHAPE_MISMATCH, "%s: w has %lld rows; gate | up needs an even number", op, (long long)N);
    LM_TRY(lm__op_check_shape(op, "out [M, N/2]", out, 2, os));
    LM_TRY(lm__op_check_out(op, "out", out));
    for (int i = 0; i < 6; i++)
        if (i != 2) LM_TRY(lm__op_check_alias(op, "out", out, names[i], vs[i], 0));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) {
        lm_status st = cu->linear_swiglu(ctx, x, w, bias, p, out);
        if (st != LM_UNSUPPORTED) return st; /* queued, or a real failure */
        lm_clear_error();                    /* a layout the kernel refuses: the composition runs it */
    }
    LM_TRY(lm__op_composition_allowed(ctx, op, "lm_linear_swiglu_fused"));
    lm_tensor *y = NULL;
    int64_t ys[2] = {M, N};
    lm_linear_params lp = *p;
    lp.workspace = NULL;
    lm_status st = lm_tensor_create(lm_ctx_device(ctx), LM_F32, 2, ys, &y);
    if (st == LM_OK) st = lm_linear_out(ctx, x, w, bias, &lp, lm_tensor_as_view(y));
    lm_tensor_view gate, up;
    if (st == LM_OK) st = lm_tensor_view_slice(lm_tensor_as_view(y), 1, 0, N / 2, 1, &gate);
    if (st == LM_OK) st = lm_tensor_view_slice(lm_tensor_as_view(y), 1, N / 2, N, 1, &up);
    if (st == LM_OK) st = lm_swiglu_out(ctx, &gate, &up, out);
    lm_tensor_destroy(y); /* the device allocator keeps queued work's blocks safe (runtime/pool_cuda.c) */
    return st;
}

size_t lm_linear_workspace_bytes(lm_device d, int64_t rows, int64_t N, int64_t K, lm_dtype w_dtype) {
    int quant = w_dtype == LM_I8 || w_dtype == LM_U8 || w_dtype == LM_F8_E4M3;
    if (!quant || rows < 1 || N < 1 || K < 1 || lm__device_host_addressable(d) || !lm__cuda_ops_get()) return 0;
    if (!lm__quant_ws_rows(rows, gemv_stages(rows, K))) return 0; /* the decode GEMV's rows */
    /* in(x) as bf16, then as many rows of w as bf16 as fit in 32 MiB (at least 64): a
     * large output matrix (an untied head) is dequantized and multiplied in chunks */
    size_t xb = lm__quant_ws_input_bytes(rows, K, 2), cap = (size_t)32 << 20;
    int64_t chunk = (int64_t)(cap / ((size_t)K * 2)) / 64 * 64;
    chunk = LM_MIN(N, LM_MAX(chunk, 64));
    /* fast precision's fp8 path needs in(x) as e4m3 (to 256 bytes) and a scale per row:
     * less than the above except for tiny shapes */
    size_t fp8 = lm__quant_ws_input_bytes(rows, K, 1) + (size_t)rows * sizeof(float);
    return LM_MAX(xb + (size_t)chunk * (size_t)K * 2, fp8);
}

/* ---- the tuned CPU level for int8 weights ------------------------------------------------- */
static int unit_last(const lm_tensor_view *v) { return v->shape[v->ndim - 1] <= 1 || v->stride[v->ndim - 1] == 1; }

/* Layouts the int8 kernels take: f32 x and out with unit last stride (any row stride),
 * w with unit stride along K, dense f32 scales and bias. */
static int cpu_i8_layout(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                         const lm_linear_params *p, const lm_tensor_view *out) {
    return x->dtype == LM_F32 && out->dtype == LM_F32 && unit_last(x) && unit_last(w) && unit_last(out) &&
           unit_last(p->w_scales) && (!bias || unit_last(bias));
}

/* in(x) into scratch [M, K] f32 when the input form is not plain, then the int8
 * product with its bias and accumulate straight into out. */
static lm_status cpu_linear_i8(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                               const lm_tensor_view *bias, const lm_linear_params *p, const lm_tensor_view *out) {
    int64_t M = out->shape[0], N = out->shape[1], K = is_i4(w, p) ? 2 * w->shape[1] : w->shape[1];
    const float *xin = x->data;
    int64_t ldx = x->stride[0];
    float *scratch = NULL;
    lm_status st = LM_OK;
    if (p->input != LM_LINEAR_IN && M > 0 && K > 0) {
        size_t bytes = (size_t)(M * K) * sizeof(float);
        if (!(scratch = lm__alloc(bytes, 64)))
            return lm__error(LM_OUT_OF_MEMORY, "linear: the [%lld, %lld] f32 input of the int8 product (%zu bytes)",
                             (long long)M, (long long)K, bytes);
        int64_t as[2] = {M, K};
        lm_tensor_view av;
        st = lm_tensor_view_init(&av, scratch, LM_F32, lm_device_cpu(), 2, as, NULL);
        if (st == LM_OK && p->input == LM_LINEAR_IN_RMSNORM) st = lm_rmsnorm_out(ctx, x, p->norm_weight, p->eps, &av);
        if (st == LM_OK && p->input == LM_LINEAR_IN_SWIGLU) {
            lm_tensor_view gate, up;
            st = lm_tensor_view_slice(x, 1, 0, K, 1, &gate);
            if (st == LM_OK) st = lm_tensor_view_slice(x, 1, K, 2 * K, 1, &up);
            if (st == LM_OK) st = lm_swiglu_out(ctx, &gate, &up, &av);
        }
        xin = scratch, ldx = K;
    }
    if (st == LM_OK && is_i4(w, p))
        st = lm__cpu_linear_i4(lm_ctx_threadpool(ctx), xin, ldx, w->data, w->stride[0], p->w_scales->data,
                               p->w_scales->dtype, p->w_scales->stride[0], p->w_group, bias ? bias->data : NULL,
                               p->accumulate, out->data, out->stride[0], M, N, K);
    else if (st == LM_OK)
        st = lm__cpu_linear_i8(lm_ctx_threadpool(ctx), xin, ldx, w->data, w->stride[0], p->w_scales->data,
                               bias ? bias->data : NULL, p->accumulate, out->data, out->stride[0], M, N, K);
    lm__free(scratch);
    return st;
}

/* The composition lm_linear_out equals, through the public operators in f32 on the
 * context's device: in(x) -> matmul with w^T -> + bias -> (+ out) -> out's dtype.
 * Allocates its temporaries, so it may not run inside a capture. */
static lm_status composed(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                          const lm_linear_params *p, const lm_tensor_view *out) {
    LM_TRY(lm__op_composition_allowed(ctx, "linear", "lm_linear_supported"));
    lm_device d = lm_ctx_device(ctx);
    int64_t M = out->shape[0], N = out->shape[1], K = w->shape[1];
    int64_t xs[2] = {M, x->shape[1]}, as[2] = {M, K}, ys[2] = {M, N};
    lm_tensor *xf = NULL, *a = NULL, *y = NULL, *acc = NULL;
    lm_status st = LM_OK;
    const lm_tensor_view *xv = x, *av = x;
    if (x->dtype != LM_F32) { /* widen once; every later step is f32 */
        st = lm_tensor_create(d, LM_F32, 2, xs, &xf);
        if (st == LM_OK) st = lm_cast_out(ctx, x, xv = lm_tensor_as_view(xf));
    }
    if (st == LM_OK && p->input != LM_LINEAR_IN) {
        st = lm_tensor_create(d, LM_F32, 2, as, &a);
        if (st == LM_OK) av = lm_tensor_as_view(a);
        if (st == LM_OK && p->input == LM_LINEAR_IN_RMSNORM) st = lm_rmsnorm_out(ctx, xv, p->norm_weight, p->eps, av);
        if (st == LM_OK && p->input == LM_LINEAR_IN_SWIGLU) {
            lm_tensor_view gate, up;
            lm_tensor_view_slice(xv, 1, 0, K, 1, &gate);
            lm_tensor_view_slice(xv, 1, K, 2 * K, 1, &up);
            st = lm_swiglu_out(ctx, &gate, &up, av);
        }
    } else {
        av = xv;
    }
    lm_tensor_view wt;
    if (st == LM_OK) st = lm_tensor_view_transpose(w, 0, 1, &wt);
    if (st == LM_OK) st = lm_tensor_create(d, LM_F32, 2, ys, &y);
    if (st == LM_OK) st = lm_matmul_out(ctx, av, &wt, lm_tensor_as_view(y));
    if (st == LM_OK && bias) st = lm_add_out(ctx, lm_tensor_as_view(y), bias, lm_tensor_as_view(y)); /* broadcast */
    if (st == LM_OK && p->accumulate) {
        const lm_tensor_view *ov = out;
        if (out->dtype != LM_F32) {
            st = lm_tensor_create(d, LM_F32, 2, ys, &acc);
            if (st == LM_OK) st = lm_cast_out(ctx, out, ov = lm_tensor_as_view(acc));
        }
        if (st == LM_OK) st = lm_add_out(ctx, lm_tensor_as_view(y), ov, lm_tensor_as_view(y));
    }
    if (st == LM_OK) st = lm_cast_out(ctx, lm_tensor_as_view(y), out);
    if (st == LM_OK && !lm__device_host_addressable(d)) st = lm_ctx_synchronize(ctx); /* before the frees */
    lm_tensor_destroy(acc);
    lm_tensor_destroy(y);
    lm_tensor_destroy(a);
    lm_tensor_destroy(xf);
    return st;
}

lm_status lm_linear_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                        const lm_linear_params *p, const lm_tensor_view *out) {
    const char *op = "linear";
    const lm_tensor_view *vs[] = {x, w, out};
    static const char *const names[] = {"x", "w", "out"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    if (!p) p = &k_plain;
    if (bias) {
        const lm_tensor_view *bv[] = {bias};
        static const char *const bn[] = {"bias"};
        LM_TRY(lm__op_check_devices(ctx, op, 1, bv, bn));
    }
    if (p->input == LM_LINEAR_IN_RMSNORM && p->norm_weight) {
        const lm_tensor_view *nv[] = {p->norm_weight};
        static const char *const nn[] = {"norm_weight"};
        LM_TRY(lm__op_check_devices(ctx, op, 1, nv, nn));
    }
    if (p->w_scales) {
        const lm_tensor_view *sv[] = {p->w_scales};
        static const char *const sn[] = {"w_scales"};
        LM_TRY(lm__op_check_devices(ctx, op, 1, sv, sn));
    }
    LM_TRY(check(op, x, w, bias, p, out));
    int quant = is_quant(w, p), i8 = quant && w->dtype != LM_F8_E4M3; /* fp8: no tuned CPU level */
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, i8, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA && quant) {
        if (p->workspace) {
            const lm_tensor_view *wv[] = {p->workspace};
            static const char *const wn[] = {"workspace"};
            LM_TRY(lm__op_check_devices(ctx, op, 1, wv, wn));
            size_t need = lm_linear_workspace_bytes(lm_ctx_device(ctx), out->shape[0], w->shape[0],
                                                    is_i4(w, p) ? 2 * w->shape[1] : w->shape[1], w->dtype);
            if (!lm_tensor_view_is_contiguous(p->workspace) ||
                (size_t)lm_tensor_view_numel(p->workspace) * lm_dtype_size(p->workspace->dtype) < need)
                return lm__error(LM_INVALID_ARGUMENT, "%s: the workspace must be contiguous and hold %zu bytes "
                                 "(lm_linear_workspace_bytes)", op, need);
            LM_TRY(lm__op_check_alias(op, "out", out, "workspace", p->workspace, 0));
        }
        return cu->linear_quant(ctx, x, w, bias, p, lm__cpu_precision(), out);
    }
    if (level == LM__LEVEL_CPU) {
        if (cpu_i8_layout(x, w, bias, p, out)) return cpu_linear_i8(ctx, x, w, bias, p, out);
        if (lm_ctx_impl(ctx) == LM_IMPL_TUNED)
            return lm__error(LM_UNSUPPORTED, "%s: the tuned int8/int4 path needs f32 x and out with unit last stride, "
                             "w with unit stride along K and w_scales and bias with unit last stride", op);
    }
    if (level == LM__LEVEL_CUDA) {
        if (lm__linear_fused_rule(p->input, p->accumulate, x->shape[0], w->shape[1], x->dtype, w->dtype)) {
            lm_status st = cu->linear(ctx, x, w, bias, p, out);
            if (st != LM_UNSUPPORTED) return st; /* queued, or a real failure */
            lm_clear_error();                    /* a layout the kernels refuse: the composition runs it */
        }
        return composed(ctx, x, w, bias, p, out);
    }
    return lm__ref_linear(x, w, bias, p, out);
}
