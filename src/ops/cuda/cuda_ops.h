/* ops/cuda/cuda_ops.h — host launchers of the CUDA kernels (built only with CUDA).
 *
 * Two kinds:
 *  - readable kernels, one per public operator, taking the views exactly as the public
 *    operator passes them after validation (shapes, dtypes, devices and aliasing are
 *    already checked; broadcast inputs already expanded). Any strides, every float
 *    dtype, f32 accumulation. They are the CUDA level the public ops dispatch to.
 *  - tuned kernels of the model step, named by what they do (linear_gemv,
 *    attention_rows, qkv_rope_store, ...), on raw contiguous buffers: fused,
 *    vectorized, tensor-core or vendor paths. The public operators reach them through
 *    step_cuda.c, which picks one when the views allow.
 * Every launcher queues work on `stream`, checks the launch, and returns without
 * waiting, except where a comment says it synchronizes (operators whose contract
 * is to reject bad index values before writing anything).
 */
#ifndef LOOM_OPS_CUDA_OPS_H
#define LOOM_OPS_CUDA_OPS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/internal.h"
#include "loom/ops.h"
#include "runtime/cuda.h"

/* ---- readable kernels (views as validated by src/ops/<family>.c) ---------------- */
/* elementwise.cu: a, b expanded to out's shape; one float dtype */
lm_status lm__cuda_add(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out, cudaStream_t s);
lm_status lm__cuda_mul(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out, cudaStream_t s);
lm_status lm__cuda_scale(const lm_tensor_view *x, float scale, const lm_tensor_view *out, cudaStream_t s);
/* out = x * *s, s an f32 on the device (lm_scale_by_out) */
lm_status lm__cuda_scale_by(const lm_tensor_view *x, const float *s, const lm_tensor_view *out, cudaStream_t s_);
lm_status lm__cuda_silu(const lm_tensor_view *x, const lm_tensor_view *out, cudaStream_t s);
lm_status lm__cuda_swiglu(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *out,
                         cudaStream_t s);
/* float <-> float, int -> float, int -> int. Integer narrowing is range checked
 * first (synchronizes): LM_OUT_OF_RANGE naming the first value that does not fit. */
lm_status lm__cuda_cast(const lm_tensor_view *x, const lm_tensor_view *out, cudaStream_t s);
/* acc (f32) += x (any float dtype, acc's shape) widened, in place */
lm_status lm__cuda_accumulate(const lm_tensor_view *acc, const lm_tensor_view *x, cudaStream_t s);

/* norm.cu: one block per row; out (or sum_out) may be the very view of an input */
lm_status lm__cuda_rmsnorm(const lm_tensor_view *x, const lm_tensor_view *weight, float eps,
                          const lm_tensor_view *out, cudaStream_t s);
lm_status lm__cuda_add_rmsnorm(const lm_tensor_view *x, const lm_tensor_view *residual, const lm_tensor_view *weight,
                              float eps, const lm_tensor_view *sum_out, const lm_tensor_view *out, cudaStream_t s);

/* rope.cu: p's views are on the device; out may be x's very view */
lm_status lm__cuda_rope(const lm_tensor_view *x, const lm_rope_params *p, const lm_tensor_view *out, cudaStream_t s);
lm_status lm__cuda_rope_inv_freq(double theta, int64_t head_dim, const lm_tensor_view *out, cudaStream_t s);

/* embedding.cu: ids are checked first (synchronizes, except while the stream is
 * capturing): LM_OUT_OF_RANGE names the first bad position and value, and nothing is
 * written. out has table's dtype, or f32 under a contiguous bf16 table and i32 ids. */
lm_status lm__cuda_embedding(const lm_tensor_view *table, const lm_tensor_view *ids, const lm_tensor_view *out,
                            cudaStream_t s);

/* softmax.cu, attention.cu */
lm_status lm__cuda_softmax(const lm_tensor_view *x, float scale, int causal, const lm_tensor_view *out,
                          cudaStream_t s);
/* Any Tk (keys are taken in chunks with an online softmax); Dv <= 1024. Views that
 * lm__cuda_flash_attention_supports accepts go to the tensor-core flash kernel. */
lm_status lm__cuda_attention(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v, float scale,
                             int causal, int64_t window, const lm_tensor_view *out, cudaStream_t s);

/* attention_flash.cu: flash attention on tensor cores for bf16 q, k, v with D = Dv
 * in {64, 128}, unit last stride, 16-byte aligned rows (other strides multiples of 8),
 * Tk >= Tq when causal; out (or a gradient) bf16 or f32; window as lm_attention_window_out. */
int lm__cuda_flash_attention_supports(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                      int causal, const lm_tensor_view *out);
/* 1 when the flash kernels take their wgmma form now (an sm_90 device, a build with
 * sm_90a code, LOOM_FLASH_WGMMA not 0): what the tests check they exercised. */
int lm__cuda_flash_attention_wgmma(void);
lm_status lm__cuda_flash_attention(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                   float scale, int causal, int64_t window, const lm_tensor_view *out, cudaStream_t s);
/* attention_flash.cu, cache mode: a step of B rows x T tokens attending over their
 * cached positions in bf16 caches [S, Hkv, P, D] (lm_attention_cache_out's contract;
 * positions [B, T] i32 contiguous, slots the contiguous i32 block tables [B] or [B, NB]):
 * bf16 q [B, T, Hq, D] with D 64 or 128, out bf16 or f32, rows 16-byte aligned (see
 * _supports). A row with positions past NB * P, or a block out of range among those
 * holding the keys its queries see, writes NaN. */
int lm__cuda_attention_cache_flash_supports(const lm_tensor_view *q, const lm_tensor_view *k_cache,
                                            const lm_tensor_view *v_cache, const lm_tensor_view *out);
lm_status lm__cuda_attention_cache_flash(const lm_tensor_view *q, const lm_tensor_view *k_cache,
                                         const lm_tensor_view *v_cache, const lm_tensor_view *slots,
                                         const lm_tensor_view *positions, float scale, int64_t window,
                                         const lm_tensor_view *out, cudaStream_t s);

/* matmul.cu: a, b expanded to out's batch dims; b may be bf16/f16 with a f32 */
lm_status lm__cuda_matmul(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out, cudaStream_t s);
/* matmul_lt_cuda.c: the same contract through cuBLASLt (f32 compute, no TF32).
 * LM_UNSUPPORTED (nothing queued) unless a, b, out share one dtype, out is row-major
 * in its last two dims, each operand has a unit stride in one of its last two dims,
 * there is at most one batch dim, and pointers/leading dims are element-aligned. */
lm_status lm__cuda_matmul_lt(const lm__cuda_blas *blas, const lm_tensor_view *a, const lm_tensor_view *b,
                            const lm_tensor_view *out, cudaStream_t s);
/* As lm__cuda_matmul_lt, and also: out may be f32 under bf16/f16 a and b (f32
 * accumulation, one rounding less), and accumulate != 0 adds the product into out
 * (beta = 1; such calls skip the one-time algorithm timing, which would overwrite out). */
lm_status lm__cuda_matmul_lt_ex(const lm__cuda_blas *blas, const lm_tensor_view *a, const lm_tensor_view *b,
                               const lm_tensor_view *out, int accumulate, cudaStream_t s);

/* loss.cu: targets are checked first (synchronizes), as in the reference */
lm_status lm__cuda_cross_entropy(const lm_tensor_view *logits, const lm_tensor_view *targets, int64_t ignore_index,
                                const lm_tensor_view *out, cudaStream_t s);

/* select.cu: NaN ranks largest, ties go to the lower index. top-k costs O(k * N) per row. */
lm_status lm__cuda_argmax(const lm_tensor_view *x, const lm_tensor_view *out, cudaStream_t s);
lm_status lm__cuda_topk(const lm_tensor_view *x, int64_t k, const lm_tensor_view *values,
                       const lm_tensor_view *indices, cudaStream_t s);

/* reduce.cu: dim already normalized to [0, ndim) */
lm_status lm__cuda_sum(const lm_tensor_view *x, int dim, const lm_tensor_view *out, cudaStream_t s);
lm_status lm__cuda_max(const lm_tensor_view *x, int dim, const lm_tensor_view *out, cudaStream_t s);
lm_status lm__cuda_concat(int n, const lm_tensor_view *const *inputs, int dim, const lm_tensor_view *out,
                         cudaStream_t s);

/* ---- tuned kernels of the model step (raw contiguous device buffers) ----------------
 * Reached through the public operators (ops/cuda/step_cuda.c picks them when the
 * views allow), never called from elsewhere. */
/* embedding.cu: x f32 [n, H] = table bf16 [V, H] rows ids[n]; an id outside [0, V)
 * gives a NaN row (nothing is read out of bounds). */
lm_status lm__cuda_embedding_widen(const void *table, const int32_t *ids, int64_t n, int64_t V, int64_t H, float *x,
                                   cudaStream_t s);
/* norm.cu: out bf16 [rows, D] (contiguous) = x / rms(x) * w, x f32 rows of D with row
 * stride ldx (e.g. each sequence's last position), w f32 [D] */
lm_status lm__cuda_rmsnorm_to_bf16(const float *x, int64_t ldx, const float *w, float eps, int64_t rows, int64_t D,
                                   void *out, cudaStream_t s);
/* norm.cu: x += delta (the f32 residual stream, in place), then out bf16 = rmsnorm(x) * w */
lm_status lm__cuda_add_rmsnorm_to_bf16(float *x, const float *delta, const float *w, float eps, int64_t rows,
                                       int64_t D, void *out, cudaStream_t s);
/* elementwise.cu: act bf16 [rows, I] = silu(gu[:, :I]) * gu[:, I:], gu [rows, 2I] f32 or
 * (gu_bf16) bf16 */
lm_status lm__cuda_swiglu_packed_to_bf16(const void *gu, int gu_bf16, int64_t rows, int64_t I, void *act,
                                         cudaStream_t s);

/* One layer's bf16 KV cache, a pool of `blocks` blocks of `block_tokens` positions
 * (lm_attention_cache_out's S and P), addressed through per-row block tables of `nb`
 * entries: position p of row b lives in block table[b * nb + p / block_tokens] at
 * offset p % block_tokens, so a row holds up to nb * block_tokens positions. nb = 1 is
 * the slot-per-row cache ([B] slots), whose kernels keep the direct slot arithmetic. */
typedef struct lm__cuda_kv {
    void *k, *v; /* [blocks, kv_heads, block_tokens, head_dim] bf16 each, contiguous */
    int64_t blocks, block_tokens;
    int64_t nb; /* table entries per row */
    int kv_heads, head_dim;
} lm__cuda_kv;

/* rope.cu: bias + (qwen3) per-head RMSNorm + RoPE of fused q/k/v projections; q goes
 * to its buffer, k and v straight into the cache at each token's block and offset
 * (a token whose position is past the row's nb * block_tokens, or whose block is
 * outside the pool, stores nothing and its q is NaN). Angles are pos * inv_freq in
 * double, like the CPU. */
typedef struct lm__cuda_qkv_params {
    const float *qkv;             /* [ntok, (Hq + 2 Hkv) * hd]: q heads, then k, then v */
    const float *bias;            /* [(Hq + 2 Hkv) * hd] or NULL */
    const float *q_norm, *k_norm; /* [hd] or NULL */
    float eps;
    const float *inv_freq; /* [hd / 2] */
    float attn_factor;
    const int32_t *tok_pos;   /* [ntok] position of each token */
    const int32_t *row_table; /* [ntok / T, nb] block table of each row of T tokens */
    int64_t ntok, T;
    int q_heads;
    int q_bf16; /* q element type: 1 bf16, 0 f32 */
    void *q;    /* [ntok, Hq, hd] */
    int late_at; /* the GEMV's front epilogue: 1 reads positions and table after its wait (measurements) */
} lm__cuda_qkv_params;
lm_status lm__cuda_qkv_rope_store(const lm__cuda_qkv_params *p, const lm__cuda_kv *kv, cudaStream_t s);

/* attention_rows.cu: attention of each token's q heads over its row's cached keys
 * [max(0, pos + 1 - window), pos] (all of [0, pos] for window 0); a token whose
 * position is past nb * block_tokens, or one of whose keys sits in a block outside the
 * pool, writes NaN (only the table entries of those keys are read). */
typedef struct lm__cuda_attn_params {
    const void *q; /* [ntok, Hq, hd] */
    int q_bf16;
    const int32_t *tok_pos;   /* [ntok] */
    const int32_t *row_table; /* [ntok / T, nb] */
    int64_t ntok, T;
    int q_heads;
    float scale;
    int64_t window;
    void *out; /* [ntok, Hq * hd] */
    int out_bf16;
    float *partial; /* lm__cuda_attention_rows_workspace() floats */
    int *counters;  /* [ntok * q_heads] zero ints, left zero again */
    int nsplit;     /* key splits per token (lm__cuda_attention_rows_splits); 1 needs no workspace */
    int early_keys; /* set by the launcher (tensor-core kernel): older keys read before the wait */
} lm__cuda_attn_params;
/* Splits of the keys among blocks for rows of up to `capacity` positions (nb *
 * block_tokens): the grid depends on it, never on the current lengths. */
int lm__cuda_attention_rows_splits(int64_t capacity);
size_t lm__cuda_attention_rows_workspace(int64_t ntok, int q_heads, int head_dim, int nsplit);
/* Split-K over the cache: for hd 64 and 128 with up to 16 query heads per kv head one
 * block per (split, kv head, token) on tensor cores serving the group's query heads;
 * otherwise one per (split, query head, token), or for many rows over long caches one
 * per (split, kv head, token) serving the kv head's 2..8 query heads; the last block of
 * a (token, head) combines the splits. Any even hd <= 512. */
lm_status lm__cuda_attention_rows(const lm__cuda_attn_params *p, const lm__cuda_kv *kv, cudaStream_t s);

/* gemv.cu: out f32 [M, N] (row stride ldo) = in [M, K] @ w^T (+ bias), for M <=
 * LM__CUDA_GEMV_MAX_ROWS (decode). w: N rows of ldw bytes (a multiple of 16, 16-byte
 * aligned) holding K weights of format wf: BF16; I8 or F8 (e4m3) with f32 row scales
 * scales[n * lds]; I4 (two nibbles a byte, low = even k) with f32 group scales
 * scales[n * lds + k / group], group a multiple of 32. The input is produced on the fly:
 * PLAIN reads x f32; RMSNORM normalizes x f32 rows with norm_w; SWIGLU reads x f32
 * [M, 2K] (gate | up) and uses silu(gate) * up. accumulate: out += result.
 * Pair epilogues (no accumulate): rows that belong together are computed as
 * neighbouring rows of one warp, which finishes both and stores what they make:
 *  - FRONT: the rows are a step's fused q|k|v projection of M tokens, N = (Hq + 2 Hkv)
 *    hd (no q/k norm); each q and k head's RoPE pair (i, i + hd / 2) is rotated and
 *    stored as lm__cuda_qkv_rope_store does (q to q_front.q, k and v into kv); out is
 *    not written;
 *  - SWIGLU: the rows are gate | up (N = 2I); out [M, I] gets silu(gate) * up, as the
 *    SWIGLU input form would compute it from the two halves. */
#define LM__CUDA_GEMV_MAX_ROWS 8 /* = LM__LINEAR_GEMV_MAX_ROWS (ops/internal.h) */
typedef enum lm__cuda_gemv_in { LM__CUDA_GEMV_PLAIN = 0, LM__CUDA_GEMV_RMSNORM = 1, LM__CUDA_GEMV_SWIGLU = 2 } lm__cuda_gemv_in;
typedef enum lm__cuda_gemv_w { LM__CUDA_GEMV_BF16 = 0, LM__CUDA_GEMV_I8, LM__CUDA_GEMV_F8, LM__CUDA_GEMV_I4 } lm__cuda_gemv_w;
typedef enum lm__cuda_gemv_epi {
    LM__CUDA_GEMV_EPI_OUT = 0,
    LM__CUDA_GEMV_EPI_FRONT = 1,
    LM__CUDA_GEMV_EPI_SWIGLU = 2
} lm__cuda_gemv_epi;
typedef struct lm__cuda_gemv_params {
    lm__cuda_gemv_in in;
    lm__cuda_gemv_w wf;
    const float *x; /* [M, K] or [M, 2K] (SWIGLU), row stride ldx; 16-byte aligned rows */
    int64_t ldx;
    const float *norm_w; /* RMSNORM: [K], 16-byte aligned */
    float eps;
    const void *w; /* [N] rows of ldw bytes */
    int64_t ldw;
    const void *scales; /* quantized formats: f32 [N] (int8, fp8), or [N, K / group] (int4) f32 or bf16 (scale16) */
    int64_t lds;        /* scales' row stride, in elements */
    int group;
    int scale16; /* int4: 1 when the group scales are bf16 */
    const float *bias; /* [N] or NULL */
    float *out;        /* [M, N], row stride ldo */
    int64_t ldo;
    int accumulate;
    int M;
    int64_t N, K;
    lm__cuda_gemv_epi epi;        /* the output: OUT, or a pair epilogue (above) */
    lm__cuda_qkv_params q_front;  /* front: positions, table, inv_freq, q (qkv, bias, norms unused) */
    lm__cuda_kv kv;               /* front: the layer's caches */
} lm__cuda_gemv_params;
lm_status lm__cuda_linear_gemv(const lm__cuda_gemv_params *p, cudaStream_t s);
/* 1 when the decode GEMV stages in(x) of `rows` input rows of K values in shared memory
 * on the current device (the kernel built for 1, 2, 4 or 8 rows that `rows` runs: M rows
 * x K floats within the device's opt-in limit); else each warp reads its inputs from
 * L2 per use (lm__quant_ws_rows in ops/cuda_table.h says what that costs). */
int lm__cuda_gemv_stages(int64_t rows, int64_t K);
/* What lm__cuda_linear_gemv refuses before launching (LM_UNSUPPORTED naming it), alone:
 * a kernel that runs the GEMV's body for its own items checks its parameters with it. */
lm_status lm__cuda_linear_gemv_check(const lm__cuda_gemv_params *p);
/* step_cuda.c: the GEMV's parameters for x [M, K] @ w^T (+ bias) with w in any format
 * lin describes, when the views suit it: up to LM__CUDA_GEMV_MAX_ROWS rows of f32 x with
 * 16-byte aligned rows, unit last strides, 16-byte aligned weight rows, K a whole number
 * of 16-byte weight vectors. 0 otherwise. The one place every GEMV caller (the fused
 * Linear, the quantized Linear, the pair epilogues) fills them; each sets its output
 * (out, ldo, accumulate, epi). */
int lm__cuda_gemv_of(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                     const lm_linear_params *lin, lm__cuda_gemv_params *gp);
/* The GEMV parameters of the step's fused operators as their CUDA level launches them
 * (the views as the public operators validated them), checked: the Linear of up to
 * LM__LINEAR_GEMV_MAX_ROWS rows, the q|k|v front, the gate|up SwiGLU; LM_UNSUPPORTED
 * naming what the GEMV needs. A kernel running several operators (plan/dplan_exec.cu)
 * builds its records with them. */
lm_status lm__cuda_linear_gemv_args(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                                    const lm_linear_params *p, const lm_tensor_view *out, lm__cuda_gemv_params *gp);
lm_status lm__cuda_linear_qkv_rope_args(const lm_tensor_view *x, const lm_tensor_view *w, const lm_linear_params *lin,
                                        const lm_qkv_rope_params *p, const lm_tensor_view *slots,
                                        const lm_tensor_view *positions, const lm_tensor_view *k_cache,
                                        const lm_tensor_view *v_cache, const lm_tensor_view *q,
                                        lm__cuda_gemv_params *gp);
lm_status lm__cuda_linear_swiglu_args(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                                      const lm_linear_params *lin, const lm_tensor_view *out, lm__cuda_gemv_params *gp);
/* The cache attention's parameters for the per-head decode kernels (not the flash
 * prefill): nsplit and its workspace from p->workspace as lm__cuda_attention_cache sets them. */
lm_status lm__cuda_attention_cache_args(const lm_tensor_view *q, const lm_tensor_view *k_cache,
                                        const lm_tensor_view *v_cache, const lm_tensor_view *slots,
                                        const lm_tensor_view *positions, const lm_kv_attention_params *p,
                                        const lm_tensor_view *out, lm__cuda_attn_params *ap, lm__cuda_kv *kv);

/* gemv_quant.cu: lm_linear_out with quantized weights (int8 i8, fp8 f8_e4m3 with f32
 * [N] scales; int4 u8 with w_bits 4 and f32 [N, K/G] scales), views as lm_linear_out
 * validated them (f32 x): the decode GEMV for up to LM__CUDA_GEMV_MAX_ROWS rows; for more
 * (unit last strides, 16-byte aligned weight rows, f32 out), with p->workspace the input
 * and the weights rounded to bf16 there and one cuBLASLt GEMM (blas) (at fast precision
 * with fp8 weights and K a multiple of 16: in(x) quantized to e4m3 per row there and
 * one fp8 GEMM), without it a bf16 tensor-core product of tiles dequantized in shared
 * memory; a readable kernel otherwise. Allocates nothing. */
lm_status lm__cuda_linear_quant(const lm__cuda_blas *blas, const lm_tensor_view *x, const lm_tensor_view *w,
                                const lm_tensor_view *bias, const lm_linear_params *p, lm_precision precision,
                                const lm_tensor_view *out, cudaStream_t s);

/* matmul_lt_cuda.c: out f32 [M, N] (row stride ldo) = x bf16 [M, K] (row stride ldx)
 * @ w bf16 [N, K]^T (+ bias f32 [N], cuBLASLt epilogue); accumulate: out += that.
 * out_bf16: out is bf16 instead (the f32 sums rounded once on store; no bias, no
 * accumulate). Algorithms are chosen once per shape and cached. */
lm_status lm__cuda_linear_lt(const lm__cuda_blas *blas, const void *x, int64_t ldx, const void *w, const float *bias,
                            void *out, int out_bf16, int64_t ldo, int64_t M, int64_t N, int64_t K, int accumulate,
                            cudaStream_t s);
/* matmul_lt_cuda.c: out f32 [M, N] (row stride ldo) = x_scales[m] * w_scales[n] *
 * (xq e4m3 [M, K] (row stride ldx) @ wq e4m3 [N, K]^T (row stride ldw)) (+ out when
 * accumulate): cuBLASLt's fp8 tensor-core GEMM with outer-vector scales, f32 sums (no
 * bias: with f32 out cuBLASLt refuses an f32 bias for fp8 operands). K, ldx and ldw
 * multiples of 16 and 16-byte aligned operands (LM_UNSUPPORTED otherwise); x_scales [M]
 * and w_scales [N] dense f32. Plans cached as above. */
lm_status lm__cuda_linear_lt_fp8(const lm__cuda_blas *blas, const void *xq, int64_t ldx, const float *x_scales,
                                const void *wq, int64_t ldw, const float *w_scales, float *out, int64_t ldo, int64_t M,
                                int64_t N, int64_t K, int accumulate, cudaStream_t s);

/* sample.cu: next token of each row of logits f32 [rows, V] (row stride ld) without
 * leaving the device. params lives in device memory (so a captured graph can be
 * replayed with new values): greedy or temperature 0 takes the argmax; otherwise
 * temperature, top-k, top-p, min-p (lm_sampler's rules and order, ties broken by
 * lower id) and a draw u = hash(seed, draw, row) in [0, 1). per_row: params holds one
 * record per row (else one for all). */
typedef struct lm__cuda_sample_params {
    int greedy;
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    unsigned flags; /* LM_SAMPLE_OWN_STREAM: the row index is left out of the hash */
    uint64_t seed;
    uint64_t draw;
} lm__cuda_sample_params;
/* work: lm__cuda_sample_workspace(rows) bytes of device scratch (no initial contents). */
size_t lm__cuda_sample_workspace(int64_t rows);
lm_status lm__cuda_sample(const float *logits, int64_t rows, int64_t V, int64_t ld, const lm__cuda_sample_params *params,
                          int per_row, int32_t *out_ids, void *work, cudaStream_t s);

/* step_cuda.c: the model-step operators' CUDA level (views as validated by the public
 * operators; the tuned kernels above where the views allow, LM_UNSUPPORTED naming the
 * reason otherwise). slots is a block table [B] or [B, NB] (ops.h); kv_store (kv.cu)
 * takes any strides, the others contiguous index tensors. The workspace is sized by
 * the row capacity cache_tokens = NB * P (P alone for [B] slots). */
lm_status lm__cuda_kv_store(const lm_tensor_view *cache, const lm_tensor_view *x, const lm_tensor_view *slots,
                            const lm_tensor_view *positions, cudaStream_t s);
lm_status lm__cuda_attention_cache(const lm_tensor_view *q, const lm_tensor_view *k_cache,
                                   const lm_tensor_view *v_cache, const lm_tensor_view *slots,
                                   const lm_tensor_view *positions, const lm_kv_attention_params *p,
                                   const lm_tensor_view *out, cudaStream_t s);
size_t lm__cuda_attention_cache_workspace(int64_t tokens, int64_t q_heads, int64_t head_dim, int64_t cache_tokens);
lm_status lm__cuda_qkv_rope_store_views(const lm_tensor_view *qkv, const lm_qkv_rope_params *p,
                                        const lm_tensor_view *slots, const lm_tensor_view *positions,
                                        const lm_tensor_view *k_cache, const lm_tensor_view *v_cache,
                                        const lm_tensor_view *q, cudaStream_t s);
/* lm_linear_qkv_rope_store_out as one decode GEMV with the front epilogue; LM_UNSUPPORTED
 * (nothing queued) when the views do not suit it. */
lm_status lm__cuda_linear_qkv_rope_views(const lm_tensor_view *x, const lm_tensor_view *w, const lm_linear_params *lin,
                                         const lm_qkv_rope_params *p, const lm_tensor_view *slots,
                                         const lm_tensor_view *positions, const lm_tensor_view *k_cache,
                                         const lm_tensor_view *v_cache, const lm_tensor_view *q, cudaStream_t s);
/* act [M, I] bf16 = silu(x Wg^T) * (x Wu^T) for bf16 x [M, K] and the packed bf16 w
 * [2 I, K] (ops/cuda/gemm_wg.cu: wgmma products with the SwiGLU in the epilogue, each
 * product rounded to bf16 first as the unfused path stores it); LM_UNSUPPORTED (nothing
 * queued) off an sm_90a build and device or for strides it cannot read.
 * lm__cuda_swiglu_gemm_wg_ok: 1 when this build, device and driver run it. */
lm_status lm__cuda_swiglu_gemm_wg(const void *x, int64_t ldx, const void *w, int64_t ldw, int64_t M, int64_t I,
                                  int64_t K, void *out, int64_t ldo, cudaStream_t s);
int lm__cuda_swiglu_gemm_wg_ok(void);
/* out [M, N] (f32) = x W^T (+ bias) for bf16 x [M, K] of at most LM__CUDA_ROWS_WG_MAX_ROWS
 * rows, bf16 w [N, K] and an optional f32 bias [N] (ops/cuda/gemm_rows.cu: batched
 * decode's layer products on wgmma, K split over a cluster, under programmatic launch);
 * LM_UNSUPPORTED (nothing queued) off an sm_90a build and device, or where
 * lm__cuda_linear_rows_wg_fits is 0. lm__cuda_linear_rows_wg_ok: 1 when this build,
 * device and driver run it. */
#define LM__CUDA_ROWS_WG_MAX_ROWS 64
lm_status lm__cuda_linear_rows_wg(const void *x, int64_t ldx, const void *w, int64_t ldw, const float *bias, int64_t M,
                                  int64_t N, int64_t K, float *out, int64_t ldo, cudaStream_t s);
int lm__cuda_linear_rows_wg_ok(void);
/* How many times this process has launched that kernel (for tests: which path a product
 * took, where its bits cannot tell). */
long long lm__cuda_linear_rows_wg_launches(void);
/* 1 when the kernel reads these operands: 1..LM__CUDA_ROWS_WG_MAX_ROWS rows, K and the row
 * strides multiples of 8 (the tensor maps' 16-byte strides), 16-byte aligned x and w. */
static inline int lm__cuda_linear_rows_wg_fits(const void *x, int64_t ldx, const void *w, int64_t ldw, int64_t M,
                                               int64_t N, int64_t K) {
    return M >= 1 && M <= LM__CUDA_ROWS_WG_MAX_ROWS && N >= 1 && N <= INT32_MAX && K >= 8 && K <= INT32_MAX &&
           K % 8 == 0 && ldx % 8 == 0 && ldw % 8 == 0 && ldx >= K && ldw >= K && ((uintptr_t)x & 15) == 0 &&
           ((uintptr_t)w & 15) == 0;
}
/* lm_linear_swiglu_out as one decode GEMV with the SwiGLU epilogue (f32 x, up to the
 * GEMV's rows, f32 out), or for bf16 x, weights and out as lm__cuda_swiglu_gemm_wg;
 * LM_UNSUPPORTED (nothing queued) when the views do not suit either. */
lm_status lm__cuda_linear_swiglu_views(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                                       const lm_linear_params *lin, const lm_tensor_view *out, cudaStream_t s);
lm_status lm__cuda_linear(const lm__cuda_blas *blas, const lm_tensor_view *x, const lm_tensor_view *w,
                          const lm_tensor_view *bias, const lm_linear_params *p, const lm_tensor_view *out,
                          cudaStream_t s);
lm_status lm__cuda_sample_views(const lm_tensor_view *logits, const lm_tensor_view *params,
                                const lm_tensor_view *workspace, const lm_tensor_view *ids, cudaStream_t s);
/* The fast paths of the basic operators' mixed-dtype forms (0 = not these views). */
int lm__cuda_rmsnorm_fast(const lm_tensor_view *x, const lm_tensor_view *w, float eps, const lm_tensor_view *out,
                          cudaStream_t s, lm_status *st);
int lm__cuda_add_rmsnorm_fast(const lm_tensor_view *x, const lm_tensor_view *residual, const lm_tensor_view *w,
                              float eps, const lm_tensor_view *sum_out, const lm_tensor_view *out, cudaStream_t s,
                              lm_status *st);
int lm__cuda_swiglu_fast(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *out,
                         cudaStream_t s, lm_status *st);

#ifdef __cplusplus
}
#endif
#endif
