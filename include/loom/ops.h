/* loom/ops.h — the one public operator API.
 *
 * Every operator has a caller-owned `_out` form taking views, and (where the output
 * shape follows from the inputs) an allocating form returning a new lm_tensor the
 * caller owns. Inputs may be any strided views (stride 0 = broadcast); outputs must
 * not overlap themselves and are written completely. Floating operands of one call
 * share one dtype (f32, bf16 or f16) unless stated; index tensors are i32 or i64.
 * All operands must be on the context's device. The context's lm_impl picks the
 * implementation level (ref = readable CPU truth source, tuned CPU, CUDA).
 * Unsupported dtype/device/layout combinations fail with LM_UNSUPPORTED; nothing is
 * converted behind the caller's back.
 */
#ifndef LOOM_OPS_H
#define LOOM_OPS_H

#include "loom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise (numpy broadcasting of a and b to out's shape) ------------------ */
LM_API lm_status lm_add_out(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out);
LM_API lm_status lm_add(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b, lm_tensor **out);
LM_API lm_status lm_mul_out(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out);
LM_API lm_status lm_mul(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b, lm_tensor **out);
/* out = x * s */
LM_API lm_status lm_scale_out(lm_ctx *ctx, const lm_tensor_view *x, float s, const lm_tensor_view *out);
LM_API lm_status lm_scale(lm_ctx *ctx, const lm_tensor_view *x, float s, lm_tensor **out);
/* out = x * s[0], where s is an f32 scalar view on x's device, read there (no host
 * synchronization on CUDA): the product is taken in f32 and rounded once to out's
 * dtype. x and out are one float dtype and one shape; out may be x. */
LM_API lm_status lm_scale_by_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *s, const lm_tensor_view *out);
/* Converts to out's dtype: float<->float (round to nearest even), int->int and
 * int->float; float->int is LM_UNSUPPORTED. Integer narrowing that does not fit is
 * LM_OUT_OF_RANGE. */
LM_API lm_status lm_cast_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *out);
LM_API lm_status lm_cast(lm_ctx *ctx, const lm_tensor_view *x, lm_dtype dtype, lm_tensor **out);

/* ---- activations ------------------------------------------------------------------ */
/* silu(x) = x * sigmoid(x) */
LM_API lm_status lm_silu_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *out);
LM_API lm_status lm_silu(lm_ctx *ctx, const lm_tensor_view *x, lm_tensor **out);
/* out = silu(gate) * up (same shapes); out may have another float dtype than gate and
 * up (rounded on store; on CUDA: the packed f32 halves of one [M, 2I] block into
 * contiguous bf16, the MLP's GEMM input). */
LM_API lm_status lm_swiglu_out(lm_ctx *ctx, const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *out);
LM_API lm_status lm_swiglu(lm_ctx *ctx, const lm_tensor_view *gate, const lm_tensor_view *up, lm_tensor **out);

/* ---- normalization ------------------------------------------------------------------ */
/* out = x / sqrt(mean(x^2 over last dim) + eps) * weight; x [..., D], weight [D].
 * out may have another float dtype than x and weight (rounded on store; on CUDA:
 * f32 rows, at any row stride, into contiguous bf16); in place only in x's dtype. */
LM_API lm_status lm_rmsnorm_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *weight, float eps,
                                const lm_tensor_view *out);
LM_API lm_status lm_rmsnorm(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *weight, float eps, lm_tensor **out);
/* sum = x + residual; out = rmsnorm(sum) * weight. sum_out may be the same view as
 * residual (in-place residual stream update) but must not partially overlap inputs.
 * x, residual, weight and sum_out share a dtype; out may have another, as for
 * lm_rmsnorm_out (on CUDA: f32 with sum_out residual's very view, into bf16). */
LM_API lm_status lm_add_rmsnorm_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *residual,
                                    const lm_tensor_view *weight, float eps, const lm_tensor_view *sum_out,
                                    const lm_tensor_view *out);

/* ---- rotary position embedding -------------------------------------------------------- */
typedef enum lm_rope_style {
    LM_ROPE_SPLIT_HALF = 0, /* pairs (i, i + D/2): Llama/Qwen in Hugging Face layout */
    LM_ROPE_INTERLEAVED = 1 /* pairs (2i, 2i + 1): GPT-J / original Meta layout */
} lm_rope_style;

typedef struct lm_rope_params {
    lm_rope_style style;
    const lm_tensor_view *inv_freq;  /* [D/2] f32: angle(pos, i) = pos * inv_freq[i] */
    float attn_factor;               /* cos and sin are multiplied by this (yarn); 1 = none */
    const lm_tensor_view *positions; /* NULL, or i32/i64 [T] or [B, T]: position of each token */
    int64_t pos_offset;              /* position = pos_offset + t when positions is NULL */
    const lm_tensor_view *bias;      /* NULL, or [H, D] added to x before rotating (qkv bias) */
} lm_rope_params;

/* x, out: [B, T, H, D] (D even). out may be the same view as x (in place). */
LM_API lm_status lm_rope_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_rope_params *p, const lm_tensor_view *out);
/* inv_freq[i] = theta^(-2i/D) for i < D/2, written to a [D/2] f32 view. */
LM_API lm_status lm_rope_inv_freq_out(lm_ctx *ctx, double theta, int64_t head_dim, const lm_tensor_view *out);

/* ---- embedding ---------------------------------------------------------------------- */
/* out[..., :] = table[ids[...], :]; table [V, D], ids i32/i64 [...], out [..., D] in
 * any float dtype (rows converted: e.g. bf16 embeddings widened into f32).
 * An id outside [0, V) is LM_OUT_OF_RANGE naming the position and value. */
LM_API lm_status lm_embedding_out(lm_ctx *ctx, const lm_tensor_view *table, const lm_tensor_view *ids,
                                  const lm_tensor_view *out);
LM_API lm_status lm_embedding(lm_ctx *ctx, const lm_tensor_view *table, const lm_tensor_view *ids, lm_tensor **out);

/* ---- softmax and attention --------------------------------------------------------------- */
/* Softmax over the last dim of x*scale. causal: x is [..., Tq, Tk] and row i may see
 * columns j <= i + (Tk - Tq) (queries are the last Tq positions); needs Tk >= Tq. */
LM_API lm_status lm_softmax_out(lm_ctx *ctx, const lm_tensor_view *x, float scale, int causal, const lm_tensor_view *out);
LM_API lm_status lm_softmax(lm_ctx *ctx, const lm_tensor_view *x, float scale, int causal, lm_tensor **out);
/* out = softmax(q k^T * scale [causal]) v per head, with grouped KV heads:
 * q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], out [B, Hq, Tq, Dv];
 * Hq % Hkv == 0 and query head h reads kv head h / (Hq / Hkv) (no K/V copies).
 * Causal uses the same alignment as lm_softmax_out. Any strides (e.g. a permuted
 * [B, T, H, D] buffer) are accepted. */
LM_API lm_status lm_attention_out(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                  float scale, int causal, const lm_tensor_view *out);
/* The same with a sliding window (window > 0, causal only): query i also drops keys
 * j <= i + (Tk - Tq) - window, keeping its last `window` positions (Hugging Face
 * sliding-window attention). window 0 is lm_attention_out. */
LM_API lm_status lm_attention_window_out(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *k,
                                         const lm_tensor_view *v, float scale, int causal, int64_t window,
                                         const lm_tensor_view *out);

/* ---- one model step over a KV cache ------------------------------------------------------
 * A cache is a pool of S blocks of P positions, keys (or values) [S, Hkv, P, D]. A
 * step appends T new tokens to each of B rows; positions [B, T] i32 gives each token's
 * position, consecutive within a row (positions[b, t] = positions[b, 0] + t). Each
 * row's block table is slots:
 *   - i32 [B]: one block per row (its slot; the row holds up to P positions), the
 *     rows' slots distinct;
 *   - i32 [B, NB]: a paged cache: position p of row b lives in block slots[b, p / P]
 *     at offset p % P, so a row holds up to NB * P positions. Rows may share blocks
 *     they only read (a common prompt prefix); a block this step writes (one holding
 *     a position in positions) belongs to one row. Entries past a row's last position
 *     are not read.
 * The [B] form is the [B, 1] form. Where the index tensors are host memory their
 * values are checked (LM_OUT_OF_RANGE / LM_INVALID_ARGUMENT name the row); device
 * kernels cannot report them, so on a GPU a row with a position or a block out of
 * range is skipped (kv_store writes nothing for it, attention writes NaN) and nothing
 * outside the caches is ever read or written. */

/* cache[block, :, p % P, :] = x[b, t, :, :] for x [B, T, Hkv, D], p = positions[b, t]
 * and block = slots[b, p / P] (slots[b] in the [B] form); the cache may have another
 * float dtype than x (values are rounded to it). */
LM_API lm_status lm_kv_store_out(lm_ctx *ctx, const lm_tensor_view *cache, const lm_tensor_view *x,
                                 const lm_tensor_view *slots, const lm_tensor_view *positions);

typedef struct lm_kv_attention_params {
    float scale;   /* applied to q . k, > 0 */
    int64_t window; /* 0: every key up to the query's position; else only the last `window` of them */
    /* Optional device scratch of lm_attention_cache_workspace_bytes() bytes, zero-filled
     * before its first use and left zero by every call: lets long caches split their
     * keys over several GPU blocks. NULL is always valid. */
    const lm_tensor_view *workspace;
} lm_kv_attention_params;

/* Attention of each new token over its row's cached positions: out[b, t, h, :] = sum
 * over positions j of row b with p - window < j <= p (p = positions[b, t]; all j <= p
 * when window is 0) of softmax_j(q[b, t, h, :] . K_b(g, j) * scale) V_b(g, j), with kv
 * head g = h / (Hq / Hkv) and K_b(g, j) = k_cache[block, g, j % P, :], block =
 * slots[b, j / P] (slots[b] in the [B] form). q, out [B, T, Hq, D] and the caches [S, Hkv,
 * P, D] may each have their own float dtype (out rounds once on store). On CUDA the
 * caches must be contiguous bf16 and q, out contiguous f32 or bf16. The keys up to p
 * must already be stored (lm_kv_store_out before this call in the same step). */
LM_API lm_status lm_attention_cache_out(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *k_cache,
                                        const lm_tensor_view *v_cache, const lm_tensor_view *slots,
                                        const lm_tensor_view *positions, const lm_kv_attention_params *p,
                                        const lm_tensor_view *out);
/* Bytes of the optional workspace for `tokens` new tokens of q_heads heads of
 * head_dim over rows of up to cache_tokens positions (P, or NB * P when paged) on
 * device d (0: none is used). */
LM_API size_t lm_attention_cache_workspace_bytes(lm_device d, int64_t tokens, int64_t q_heads, int64_t head_dim,
                                                 int64_t cache_tokens);

/* The fused front of a step's attention: from the fused projection qkv [B, T,
 * (Hq + 2 Hkv) D] (q heads, then k heads, then v heads of each token), each head
 * gets the bias, then q and k heads their per-head RMSNorm (qwen3) and RoPE at the
 * token's position (split-half pairs); k and v are stored into the caches as
 * lm_kv_store_out does and q is written to q [B, T, Hq, D]. Equals the composition
 * slice -> add bias -> rmsnorm -> rope -> kv_store (f32 arithmetic in between). q
 * may be f32 or bf16; the caches' dtype rounds k and v. */
typedef struct lm_qkv_rope_params {
    int64_t q_heads;                       /* Hq (the caches give Hkv and D) */
    const lm_tensor_view *bias;            /* [(Hq + 2 Hkv) D] f32, or NULL */
    const lm_tensor_view *q_norm, *k_norm; /* [D] f32 each, or both NULL */
    float eps;
    const lm_tensor_view *inv_freq; /* [D / 2] f32 */
    float attn_factor;              /* scales cos and sin (yarn); 1 = none */
} lm_qkv_rope_params;

LM_API lm_status lm_qkv_rope_store_out(lm_ctx *ctx, const lm_tensor_view *qkv, const lm_qkv_rope_params *p,
                                       const lm_tensor_view *slots, const lm_tensor_view *positions,
                                       const lm_tensor_view *k_cache, const lm_tensor_view *v_cache,
                                       const lm_tensor_view *q);

/* ---- picking the next token where the logits are ----------------------------------------
 * One record for every row, or one per row, held in a u8 tensor on the context's
 * device so a captured step replays with new values. Rules and order are lm_sampler's (infer):
 * logits / temperature; top-k keeps the k highest-ranked tokens (rank: value, then
 * lower id); top-p then keeps the shortest rank prefix of those whose probability,
 * renormalized over the top-k survivors, reaches top_p; min-p keeps tokens with p >=
 * min_p * p_max (always the top one). The draw is u = splitmix64(seed, draw, row)
 * in [0, 1) times the kept mass, and the token is found by summing the kept masses in
 * id order: reproducible for (seed, draw, row), but not lm_sampler's random stream.
 * With LM_SAMPLE_OWN_STREAM in flags the row index is left out of the hash (row 0's
 * stream), so a row's draws do not depend on where it sits in the batch. */
typedef struct lm_sample_params {
    int32_t greedy;    /* 1: the argmax (lowest id on ties), as is temperature 0 */
    float temperature; /* >= 0 */
    int32_t top_k;     /* 0: off */
    float top_p;       /* (0, 1]; 1: off */
    float min_p;       /* [0, 1); 0: off */
    uint32_t flags;    /* 0 or LM_SAMPLE_OWN_STREAM */
    uint64_t seed;
    uint64_t draw; /* e.g. the step number */
} lm_sample_params;
#define LM_SAMPLE_PARAMS_BYTES 40
#define LM_SAMPLE_OWN_STREAM 1u

/* ids i32 [R] = the next token of each row of logits f32 [R, V] (unit last stride).
 * params: u8 [LM_SAMPLE_PARAMS_BYTES] holding one lm_sample_params for every row, or
 * u8 [R * LM_SAMPLE_PARAMS_BYTES] holding one per row (checked where host-readable). workspace: lm_sample_workspace_bytes() bytes of scratch on the
 * context's device (no contents needed), or NULL when that is 0. */
LM_API lm_status lm_sample_out(lm_ctx *ctx, const lm_tensor_view *logits, const lm_tensor_view *params,
                               const lm_tensor_view *workspace, const lm_tensor_view *ids);
LM_API size_t lm_sample_workspace_bytes(lm_device d, int64_t rows);
/* LM_INVALID_ARGUMENT naming the field when a record breaks the ranges above; check
 * a record before writing it to device memory (where lm_sample_out cannot read it). */
LM_API lm_status lm_sample_params_check(const lm_sample_params *p);

/* ---- matmul ------------------------------------------------------------------------------ */
/* out[..., M, N] = a[..., M, K] @ b[..., K, N]; batch dims broadcast. A transposed
 * operand is passed as a transposed view (e.g. a Linear weight [N, K] viewed [K, N]).
 * a and out share one float dtype; b has a's dtype, or is bf16/f16 when a is f32
 * (low-precision weights widened on the fly). Accumulation is at least f32. */
LM_API lm_status lm_matmul_out(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out);
LM_API lm_status lm_matmul(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b, lm_tensor **out);

/* Arithmetic of the CPU's products with bf16, int8 and int4 weights (docs/QUANTIZATION.md,
 * "Fast precision"). LM_PRECISION_EXACT: weights widen exactly to f32 and x stays f32
 * (every operator above). LM_PRECISION_FAST: with bf16 weights the packed GEMM (prefill)
 * and the decode GEMV round x to bf16 (nearest even) and multiply with AVX512_BF16 dot
 * products (VDPBF16PS) into f32 sums; with int8 and int4 weights the GEMV and the GEMM
 * quantize x to int8 per block of 64 inputs (scale max |x| / 127) and sum exact byte
 * products (AVX512_VNNI, AMX-INT8 tiles in the GEMM where present, AVX-VNNI or AVX2);
 * attention's prefill rows (more than 7 query rows per KV head task) round q, k, v and
 * the probabilities to bf16 for VDPBF16PS (AVX512_BF16). f32 / f16 weights and every
 * other operator stay exact. On CUDA fast is for fp8 weights: products of more than 8
 * rows (prefill, batched decode) quantize in(x) to e4m3 per row (scale max |x| / 448)
 * and run cuBLASLt's fp8 tensor-core GEMM on the stored weights, both scales applied to
 * the f32 sums; the decode GEMV (up to 8 rows) stays exact. Selected per model
 * (lm_model_load_options.precision).
 * Public enum: grows at the end. */
typedef enum lm_precision { LM_PRECISION_EXACT = 0, LM_PRECISION_FAST = 1 } lm_precision;
LM_API const char *lm_precision_name(lm_precision p); /* "exact", "fast"; "invalid" */
/* "exact" or "fast" -> *out; LM_INVALID_ARGUMENT naming the text otherwise. */
LM_API lm_status lm_precision_parse(const char *text, lm_precision *out);
/* LM_OK when device d can run precision p. Fast: LM_UNSUPPORTED on a CPU (or build) with
 * neither AVX2 nor AVX512_BF16, the message naming the features; LM_INVALID_ARGUMENT for
 * an unknown p. A CPU with AVX2 but not AVX512_BF16 passes: lm_model_load_opts then
 * refuses a fast model whose linears read bf16 matrices, naming one. CUDA passes: there
 * fast applies to fp8 weights only (their products of more than 8 rows quantize x to
 * e4m3 per row, scale max |x| / 448, for the fp8 tensor-core GEMM), and
 * lm_model_load_opts refuses fast for a CUDA model with other weights (CUDA already
 * runs bf16 products on tensor cores). */
LM_API lm_status lm_precision_check(lm_device d, lm_precision p);

/* ---- a Linear layer with its neighbours fused ------------------------------------------
 * out [M, N] = in(x) @ w^T (+ bias), w [N, K] (a Hugging Face Linear weight), bias [N]
 * or NULL, where in(x) is
 *   LM_LINEAR_IN          x [M, K] as it is;
 *   LM_LINEAR_IN_RMSNORM  rmsnorm(x) * norm_weight, x [M, K] (the norm before a projection);
 *   LM_LINEAR_IN_SWIGLU   silu(x[:, :K]) * x[:, K:], x [M, 2K] (the MLP's gate|up);
 * and accumulate = 1 adds the product into out (a residual add, in place) instead of
 * writing it. Equals the composition of lm_rmsnorm_out / lm_swiglu_out, lm_matmul_out
 * (with w transposed), lm_add_out; the prologue and the products are in f32 (double
 * in the reference), rounded once on store. Dtypes: w any float; x and out f32, or x
 * w's dtype; norm_weight and bias f32. int8 weights: w i8 with p->w_scales f32 [N]
 * (LM_INVALID_ARGUMENT without them, or with them for a float w), f32 x, any float
 * out; the product is that of the dequantized weights w[n, k] * w_scales[n] (exact in
 * the reference; the tuned CPU level rounds only as f32 arithmetic does, x is never
 * quantized). fp8 weights: w f8_e4m3 with w_scales f32 [N], as int8 (the CPU runs the
 * reference). Quantized weights run on CUDA too (docs/QUANTIZATION.md: a GEMV for up to
 * 8 rows that streams the quantized bytes; for more, given a workspace, the weights
 * dequantized to bf16 and one cuBLASLt GEMM, else a bf16 tensor-core product of the
 * weights dequantized in shared memory; f32 x in every case). Rows of x and out may have
 * any stride (unit last stride). lm_linear_supported says which calls a device runs
 * as one kernel without scratch memory (others go through the composition, which
 * allocates); on the CPU it says which calls take the tuned int8 path (which may use
 * host scratch for the RMSNorm/SwiGLU input; float weights run the reference). */
typedef enum lm_linear_input { LM_LINEAR_IN = 0, LM_LINEAR_IN_RMSNORM = 1, LM_LINEAR_IN_SWIGLU = 2 } lm_linear_input;

typedef struct lm_linear_params {
    lm_linear_input input;
    const lm_tensor_view *norm_weight; /* LM_LINEAR_IN_RMSNORM: [K] */
    float eps;                         /* LM_LINEAR_IN_RMSNORM */
    int accumulate;                    /* 1: out += product */
    /* w of dtype i8 (int8-quantized weights) or f8_e4m3 (fp8): its f32 scales [N], one
     * per output row; the product is x · (w[n, :] * w_scales[n])ᵀ. NULL for float weights. */
    const lm_tensor_view *w_scales;
    /* int4 weights (docs/QUANTIZATION.md): w_bits = 4 says w is u8 [N, K/2] holding two
     * signed 4-bit values per byte along K (low nibble = even k, two's complement, so
     * each in [-8, 7]) and w_scales is f32 or bf16 [N, K / w_group] (bf16 on the CPU
     * only; CUDA refuses it), one scale per group of
     * w_group consecutive k of a row (w_group 32, 64 or 128; K a multiple of it): the
     * product is x · (q[n, k] * w_scales[n, k / w_group])ᵀ. f32 x, any float out. 0
     * (both) for float, int8 and fp8 weights; a u8 w with
     * w_bits != 4, or w_bits = 4 with another dtype, is LM_INVALID_ARGUMENT. */
    int w_bits;
    int w_group;
    /* Optional device scratch of lm_linear_workspace_bytes() bytes for quantized
     * weights on CUDA: with it, products of more than 8 rows (prefill, batched decode),
     * and of 3-8 rows whose K inputs are too many for the decode GEMV to stage in the
     * device's shared memory (e.g. 5-8 rows of K = 8,192 on an H200), run as the input
     * and the weights rounded to bf16 into the workspace, then one cuBLASLt GEMM with
     * the bias and accumulate in its epilogue (at fast precision with fp8 weights and K
     * a multiple of 16, past 8 rows: the input quantized to e4m3 per row there, then
     * one fp8 GEMM on the stored weights); without it, the decode GEMV up to 8 rows and
     * past them a slower tensor-core kernel that needs no scratch. Ignored elsewhere;
     * NULL is always valid. */
    const lm_tensor_view *workspace;
} lm_linear_params;

/* Symmetric int8 quantization of float weights w [N, K] by row: w_scales[n] =
 * max_k |w[n, k]| / 127 (1 for an all-zero row), q[n, k] = round-half-even(w[n, k] /
 * w_scales[n]) in [-127, 127]; q i8 [N, K], w_scales f32 [N] (host tensors). */
LM_API lm_status lm_quantize_int8_rows(lm_ctx *ctx, const lm_tensor_view *w, const lm_tensor_view *q,
                                       const lm_tensor_view *w_scales);
/* Symmetric int4 quantization of float weights w [N, K] by groups of `group` (32, 64
 * or 128) consecutive k of a row; K even and a multiple of group (LM_INVALID_ARGUMENT
 * otherwise, naming both). Group g of row n: w_scales[n, g] = max |w| over the group
 * / 7 (1 for an all-zero group), q = round-half-even(w / scale) clamped to [-7, 7]
 * (the symmetric range: -8 is never written, though lm_linear_out reads it);
 * q u8 [N, K/2] packs k = 2j in the low nibble of byte j and k = 2j + 1 in the high
 * one (two's complement); w_scales f32 or bf16 [N, K/group] (host tensors). bf16
 * scales: each group's scale rounded to bf16 (nearest even; bf16's smallest positive
 * value where that gives 0) before its group is quantized with it. */
LM_API lm_status lm_quantize_int4_groups(lm_ctx *ctx, const lm_tensor_view *w, const lm_tensor_view *q,
                                         const lm_tensor_view *w_scales, int group);
/* fp8 e4m3 quantization of float weights w [N, K] by row: w_scales[n] = max_k |w[n, k]|
 * / 448 (1 for an all-zero row), q[n, k] = lm_f32_to_f8e4m3(w[n, k] / w_scales[n])
 * (nearest, ties to even, saturating at +-448); q f8_e4m3 [N, K], w_scales f32 [N]
 * (host tensors). NaN or Inf in w is LM_INVALID_ARGUMENT naming the row, before
 * anything is written. lm_linear_out takes q with w_scales as for int8. */
LM_API lm_status lm_quantize_fp8_rows(lm_ctx *ctx, const lm_tensor_view *w, const lm_tensor_view *q,
                                      const lm_tensor_view *w_scales);

/* p NULL: plain (LM_LINEAR_IN, no accumulate). */
LM_API lm_status lm_linear_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                               const lm_linear_params *p, const lm_tensor_view *out);
/* 1 when device d runs lm_linear_out of `rows` rows, K inputs and weights of dtype
 * w_dtype, with input form `input`, accumulate (0/1) and x of dtype x_dtype, in one
 * fused kernel that needs no scratch memory (so a captured step may contain it), and
 * that is how a graph should run it: on CUDA, f32 x over bf16 weights is 1 for up to 2
 * rows only (the GEMV), since from 3 rows on the rows normalized into bf16 and the GEMM
 * are faster, though lm_linear_out runs f32 x in the GEMV up to 8 rows. */
LM_API int lm_linear_supported(lm_device d, lm_linear_input input, int accumulate, int64_t rows, int64_t K,
                               lm_dtype x_dtype, lm_dtype w_dtype);
/* Bytes of lm_linear_params.workspace that device d uses for `rows` rows of K inputs
 * over N outputs with weights of dtype w_dtype (i8, f8_e4m3 or u8 for int4; K counts
 * inputs, not bytes): rows * K bf16 values plus up to 32 MiB of dequantized weight rows
 * (all N rows when they fit; at least 64) on CUDA for quantized weights at more than 8
 * rows, or 3-8 rows of more inputs than the decode GEMV stages (see
 * lm_linear_params.workspace; never less than fast precision's rows * K e4m3 values and
 * rows f32 scales), 0 (none used) otherwise. */
LM_API size_t lm_linear_workspace_bytes(lm_device d, int64_t rows, int64_t N, int64_t K, lm_dtype w_dtype);

/* The MLP's gate|up projection with its SwiGLU: y = lm_linear_out(x, w [2I, K], bias, lin)
 * (lin->accumulate must be 0; its workspace is not used), then out [M, I] =
 * silu(y[:, :I]) * y[:, I:] (lm_swiglu_out; out any float dtype). On CUDA up to 8 rows
 * of f32 x in the RMSNorm input form into an f32 out (decode) run as one kernel, the
 * decode GEMV that pairs each gate row with its up row and stores the product; on an
 * sm_90a device, bf16 x over bf16 weights into a bf16 out in the plain input form
 * without a bias (prefill, batched decode; any rows) runs as one tensor-core GEMM with
 * the SwiGLU in its epilogue,
 * y's halves rounded to bf16 before the SwiGLU (as a bf16 y would be); elsewhere the
 * two operators run in turn through a temporary y of M * 2I floats. */
LM_API lm_status lm_linear_swiglu_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                      const lm_tensor_view *bias, const lm_linear_params *lin,
                                      const lm_tensor_view *out);
/* 1 when a graph on device d should run lm_linear_swiglu_out as its one kernel (no
 * scratch memory) for `rows` rows of K inputs of dtype x_dtype with input form `input`
 * over weights of dtype w_dtype, into an f32 out: on CUDA bf16 weights at 1-2 rows and
 * quantized ones at 3-8, where the kernel measured faster than the separate operators
 * (or, for bf16 from 3 rows, than the GEMM path); lm_linear_swiglu_out itself runs the
 * kernel for any of 1-8 rows. Also 1, into a bf16 out, for bf16 x and weights of at
 * least 8 rows in the plain input form on an sm_90a device (the tensor-core GEMM, for
 * prefill and batched decode; LOOM_CUDA_SWIGLU_GEMM=0 turns it off). */
LM_API int lm_linear_swiglu_fused(lm_device d, lm_linear_input input, int64_t rows, int64_t K, lm_dtype x_dtype,
                                  lm_dtype w_dtype);
/* The attention front (lm_qkv_rope_store_out) with its projection: qkv = lm_linear_out(x [B*T, K], w, no bias, lin)
 * (lin->accumulate must be 0; its workspace is not used), then lm_qkv_rope_store_out on
 * qkv viewed as [B, T, (Hq + 2 Hkv) D] with p (p->bias is the projection's bias). On CUDA
 * up to 8 rows of f32 x in the RMSNorm input form (decode) run as one kernel, the
 * decode GEMV that rotates and stores its own results; elsewhere the two
 * operators run in turn through a temporary qkv of B*T*(Hq + 2 Hkv)*D floats. */
LM_API lm_status lm_linear_qkv_rope_store_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                             const lm_linear_params *lin, const lm_qkv_rope_params *p,
                                             const lm_tensor_view *slots, const lm_tensor_view *positions,
                                             const lm_tensor_view *k_cache, const lm_tensor_view *v_cache,
                                             const lm_tensor_view *q);
/* 1 when a graph on device d should run lm_linear_qkv_rope_store_out as its one kernel
 * (no scratch memory) for `rows` rows of K inputs of dtype x_dtype with input form
 * `input` over weights of dtype w_dtype, with (1) or without (0) per-head q/k norms (the
 * kernel takes none): the rows lm_linear_swiglu_fused admits. */
LM_API int lm_linear_qkv_rope_fused(lm_device d, lm_linear_input input, int64_t rows, int64_t K, lm_dtype x_dtype,
                                    lm_dtype w_dtype, int qk_norm);

/* ---- losses and selections ----------------------------------------------------------------- */
/* Mean cross-entropy of logits [N, V] against targets [N] (i32/i64), skipping
 * targets equal to ignore_index; out is an f32 scalar. If every target is ignored
 * the mean is NaN (0/0), as in PyTorch. */
LM_API lm_status lm_cross_entropy_out(lm_ctx *ctx, const lm_tensor_view *logits, const lm_tensor_view *targets,
                                      int64_t ignore_index, const lm_tensor_view *out);
/* Index of the largest element over the last dim (first on ties; NaN counts as
 * largest); x [..., N] with N > 0, out i64/i32 [...]. */
LM_API lm_status lm_argmax_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *out);
/* The k largest values over the last dim, sorted descending (ties: lower index first);
 * values [..., k] in x's dtype, indices i64/i32 [..., k]; 0 <= k <= N. */
LM_API lm_status lm_topk_out(lm_ctx *ctx, const lm_tensor_view *x, int64_t k, const lm_tensor_view *values,
                             const lm_tensor_view *indices);
/* Reductions over one dim; out has x's shape without that dim. */
LM_API lm_status lm_sum_out(lm_ctx *ctx, const lm_tensor_view *x, int dim, const lm_tensor_view *out);
LM_API lm_status lm_max_out(lm_ctx *ctx, const lm_tensor_view *x, int dim, const lm_tensor_view *out);
/* Joins n inputs along dim; all other dims equal. */
LM_API lm_status lm_concat_out(lm_ctx *ctx, int n, const lm_tensor_view *const *inputs, int dim, const lm_tensor_view *out);

#ifdef __cplusplus
}
#endif
#endif
