/* ops/cuda/gemv.cu — the Linear of a few rows: matrix-vector products for decode (M <= 8 rows), with the
 * preceding elementwise step fused into the input read and the residual add into
 * the output write.
 *
 * Decode reads every weight byte once per step, so this kernel is about keeping
 * enough 16-byte weight loads in flight to stream W at full bandwidth. One kernel for
 * every weight format (bf16; int8, fp8 e4m3 with row scales; int4 with group scales),
 * the format a template argument: a 16-byte vector holds 8, 16 or 32 weights, decoded to
 * f32 in registers (int8/int4: shifts; fp8: cvt e4m3x2 -> f16x2, exact) and multiplied
 * with f32 inputs; row scales are applied once per output after the sum, group scales
 * once per vector (a vector's 32 k lie in one group).
 *  - a warp owns RPW output rows and a slice of K; each lane issues UNROLL 16-byte
 *    loads per row, 8 independent loads, before using any of them (bf16: 2 rows x 4;
 *    at 2 rows int8/fp8 4 x 2, at 1-2 int4 8 x 1: gemv_cfg; int8/fp8 at one row 8 x 1
 *    or 2 x 4 by the product's rows: launch_1);
 *  - when N is small (o and down projections, N ~ H) a row's K is split over KSPLIT =
 *    8 warps of one block, combined through shared memory, so there are enough warps
 *    to cover the GPU; when N is large (q|k|v, gate|up, lm_head) KSPLIT = 1 and each
 *    warp owns whole rows;
 *  - the grid is at most 4 blocks per SM (fewer where registers or shared memory
 *    leave fewer resident: no second wave) and walks the row groups in a stride loop,
 *    so per-block work (the RMSNorm prologue) is paid a few hundred times, not once
 *    per pair of rows (the lm_head has 150k rows).
 *  - launched with programmatic dependent launch: each warp issues its first batch of
 *    weight loads before waiting for the previous kernel (pdl_wait), so the weight
 *    stream of this projection overlaps the tail of the kernel before it; bf16 with one
 *    input row and more row groups than the grid has warps (PF2): the first batch of its
 *    second group too, so a projection whose groups take two rounds per warp has both in
 *    flight before its input arrives (where the extra registers keep the blocks per SM).
 *  - in(x) is computed once per block into shared memory (RMSNORM x * norm_w, the
 *    1 / rms applied to the finished sums; SWIGLU silu(gate) * up from x = [gate | up];
 *    PLAIN x), swizzled so that the lanes' strided chunk reads are free of bank
 *    conflicts, when the M rows fit the block's opt-in shared memory (227 KiB on an
 *    H200: M = 8 up to K ~ 7,000); else each warp computes it per use from L1/L2.
 *  - pair epilogues (decode): the front (q|k|v): the rows of each q and k head are
 *    walked in RoPE-pair order (i, i + hd / 2 side by side), so a warp finishes both
 *    halves of a pair and rotates and stores it itself (q, or bf16 k / v into the
 *    cache): the attention front needs no kernel of its own; SwiGLU (gate|up): gate row
 *    i and up row i side by side, the warp stores silu(gate) * up, so the down GEMV
 *    stages I plain inputs instead of computing them from 2I.
 * Work O(M * N * K); bytes ~ N * K * bytes per weight.
 */
#include "ops/cuda/gemv_body.cuh"

template <int F, int IN, int M, int KSPLIT, int SMX, int PF2 = 0, int EPI = LM__CUDA_GEMV_EPI_OUT>
__global__ void __launch_bounds__(THREADS) gemv_kernel(lm__cuda_gemv_params p) {
    extern __shared__ float4 xs[];
    gemv_body<F, IN, M, KSPLIT, SMX, PF2, EPI>(p, 0, INT64_MAX, blockIdx.x, gridDim.x, pdl_wait_fn(), xs);
}

/* Whether the staged one-row bf16 kernel issues the first batch of each warp's second
 * row group before its wait too (PF2): LOOM_CUDA_GEMV_PF2=0 never, =1 always, else when
 * the grid leaves warps more than one group and the PF2 kernel keeps as many blocks per SM. */
static int pf2_mode(void) {
    const char *e = getenv("LOOM_CUDA_GEMV_PF2");
    return e && strcmp(e, "0") == 0 ? 0 : e && strcmp(e, "1") == 0 ? 1 : -1;
}

/* LOOM_CUDA_GEMV_KSPLIT (measurements): "old" the two-way rule (lm__gemv_ksplit) for
 * every call, 1 / 2 / 4 / 8 that split for staged calls of 1-2 rows; else (unset) the
 * rounds rule (lm__gemv_ksplit_rounds) for those and the two-way rule for the rest. */
static int ksplit_mode(void) { /* -1: the default, 0: "old", else the forced split */
    const char *e = getenv("LOOM_CUDA_GEMV_KSPLIT");
    int v = e ? atoi(e) : 0;
    return e && strcmp(e, "old") == 0 ? 0 : (v == 1 || v == 2 || v == 4 || v == 8) ? v : -1;
}

/* The rows the kernel is built for (1, 2, 4 or 8) that a call of M rows runs. */
static int64_t built_rows(int64_t M) { return M <= 1 ? 1 : M == 2 ? 2 : M <= 4 ? 4 : 8; }

int lm__cuda_gemv_stages(int64_t rows, int64_t K) {
    return (size_t)built_rows(rows) * (size_t)smx_row_chunks(K) * 16 + GEMV_STATIC_SMEM <=
           (size_t)lm__cuda_smem_optin();
}

template <int F, int IN, int M, int EPI = LM__CUDA_GEMV_EPI_OUT, int MU = M < 4 ? 4 : M>
static lm_status launch(const lm__cuda_gemv_params *p, cudaStream_t s) {
    const int64_t sms = lm__cuda_sm_count();
    const size_t smx = (size_t)M * (size_t)smx_row_chunks(p->K) * 16;
    const int staged = lm__cuda_gemv_stages(M, p->K);
    /* the pair epilogues are built for staged inputs only (decode's K is a few thousand) */
    if (EPI != LM__CUDA_GEMV_EPI_OUT && !staged)
        return lm__error(LM_UNSUPPORTED, "linear_gemv: a pair epilogue over K = %lld inputs (more than shared memory "
                         "stages)", (long long)p->K);
    /* the unstaged input (rows past ~57k floats at M = 1) runs the build for MU >= 4
     * rows: no separate M = 1 / 2 instantiations for a shape no model has */
    const int rpw = staged ? gemv_cfg<F, M>::RPW : gemv_cfg<F, MU>::RPW;
    const int unroll = staged ? gemv_cfg<F, M>::UNROLL : gemv_cfg<F, MU>::UNROLL;
    const int64_t nvec = p->K / gemv_cfg<F, M>::WPV;
    /* splits of 2 and 4 warps are built for staged calls of 1-2 rows (decode of one or
     * two sequences): the rounds rule there, the two-way rule elsewhere */
    const int mode = ksplit_mode(), narrow = staged && M <= 2;
    const int ksplit = narrow && mode > 0    ? mode
                       : narrow && mode < 0 ? lm__gemv_ksplit_rounds(p->N, rpw, nvec, 32 * unroll, sms)
                                            : lm__gemv_ksplit(p->N, rpw, nvec, 32 * unroll, sms);
    const int which = !staged ? 2 + (ksplit != 1) : ksplit == 1 ? 0 : ksplit == WARPS ? 1 : ksplit == 2 ? 4 : 5;
    /* (with a pair epilogue the unstaged entries repeat the staged ones: never chosen;
     * for M > 2 the entries of 2 and 4 repeat that of 8: never chosen either) */
    constexpr int E = EPI != LM__CUDA_GEMV_EPI_OUT, MUE = E ? M : MU, SMXU = E ? 1 : 0;
    constexpr int K2 = M <= 2 ? 2 : WARPS, K4 = M <= 2 ? 4 : WARPS;
    void (*const kernels[6])(lm__cuda_gemv_params) = {
        gemv_kernel<F, IN, M, 1, 1, 0, EPI>,      gemv_kernel<F, IN, M, WARPS, 1, 0, EPI>,
        gemv_kernel<F, IN, MUE, 1, SMXU, 0, EPI>, gemv_kernel<F, IN, MUE, WARPS, SMXU, 0, EPI>,
        gemv_kernel<F, IN, M, K2, 1, 0, EPI>,     gemv_kernel<F, IN, M, K4, 1, 0, EPI>};
    static lm__cuda_kernel_facts facts[8]; /* of kernels[i] and pf2[i] (6, 7), per device */
    int per_sm = 0;
    cudaError_t e = lm__cuda_blocks_per_sm(&facts[which], (const void *)kernels[which], THREADS, staged ? smx : 0,
                                           &per_sm);
    if (e != cudaSuccess) return lm__cuda_check((int)e, "linear_gemv occupancy");
    int64_t blocks = lm__gemv_blocks(p->N, rpw, ksplit, sms, per_sm);
    void (*kernel)(lm__cuda_gemv_params) = kernels[which];
    /* bf16, one input row, staged: the first batches of a warp's first two row groups in
     * flight before the wait (+15-40 registers a thread: only where that leaves the blocks
     * per SM). Not built for int8/fp8/int4: measured no faster there (bench/NOTES.md). */
    constexpr int PF = M == 1 && (F & 15) == LM__CUDA_GEMV_BF16;
    void (*const pf2[2])(lm__cuda_gemv_params) = {gemv_kernel<F, IN, M, 1, 1, PF, EPI>,
                                                  gemv_kernel<F, IN, M, WARPS, 1, PF, EPI>};
    const int pmode = PF && staged && which < 2 ? pf2_mode() : 0; /* built for splits of 1 and 8 */
    const int64_t groups = (p->N + rpw - 1) / rpw, warps = blocks * (WARPS / ksplit);
    if (pmode == 1 || (pmode == -1 && groups > warps)) {
        int per_sm2 = 0;
        e = lm__cuda_blocks_per_sm(&facts[6 + which], (const void *)pf2[which], THREADS, smx, &per_sm2);
        if (e != cudaSuccess) return lm__cuda_check((int)e, "linear_gemv occupancy");
        if (pmode == 1 || per_sm2 >= LM_MIN(per_sm, 4))
            kernel = pf2[which], blocks = lm__gemv_blocks(p->N, rpw, ksplit, sms, per_sm2);
    }
    e = lm__cuda_launch_pdl(kernel, dim3((unsigned)blocks), dim3(THREADS), staged ? smx : 0, s, *p);
    if (e != cudaSuccess) return lm__cuda_check((int)e, "linear_gemv launch");
    return lm__cuda_launched("linear_gemv");
}

/* LOOM_CUDA_GEMV_VARIANT=V (measurements): one-row bf16, int8 and fp8 products run shape
 * V of gemv_cfg (0: the format's base shape, 1: 4 rows a warp x 2 loads, 2: 2 x 4, 3: 8 x
 * 1); -1 (unset): the default below. */
static int gemv_variant(void) {
    static int v = -2;
    if (v == -2) {
        const char *e = getenv("LOOM_CUDA_GEMV_VARIANT");
        v = e && *e >= '0' && *e <= '3' && !e[1] ? *e - '0' : -1;
    }
    return v;
}

/* One input row. int8 and fp8: 8 rows a warp x 1 load where the product has at least 16
 * rows an SM (N / 8 row groups >= 2 per SM: every lane keeps 8 loads with fewer, longer
 * warps, which leaves room on each SM for the next kernel's first loads), else 2 x 4
 * (twice the base shape's groups for short products); measured against the base 4 x 2 on
 * the Llama-3.2-3B and Qwen2.5-0.5B shapes (bench/NOTES.md, quantized weights on CUDA,
 * v9). bf16 keeps its base shape unless a variant is forced. */
template <int F, int IN, int EPI>
static lm_status launch_1(const lm__cuda_gemv_params *p, cudaStream_t s) {
    const int v = gemv_variant();
    if constexpr (F == LM__CUDA_GEMV_BF16) {
        if (v == 1) return launch<F + 16, IN, 1, EPI>(p, s);
        if (v == 3) return launch<F + 48, IN, 1, EPI>(p, s);
    }
    if constexpr (F == LM__CUDA_GEMV_F8 || F == LM__CUDA_GEMV_I8) {
        const int wide = p->N >= 16 * lm__cuda_sm_count();
        if (v == 3 || (v < 0 && wide)) return launch<F + 48, IN, 1, EPI>(p, s);
        if (v == 2 || (v < 0 && !wide)) return launch<F + 32, IN, 1, EPI>(p, s);
    }
    return launch<F, IN, 1, EPI>(p, s);
}

/* M rows run the kernel built for 1, 2, 4 or 8 (the extra rows repeat the last one). */
template <int F, int IN, int EPI = LM__CUDA_GEMV_EPI_OUT>
static lm_status launch_m(const lm__cuda_gemv_params *p, cudaStream_t s) {
    if (p->M == 1) return launch_1<F, IN, EPI>(p, s);
    if (p->M == 2) return launch<F, IN, 2, EPI>(p, s);
    if (p->M <= 4) return launch<F, IN, 4, EPI>(p, s);
    return launch<F, IN, 8, EPI>(p, s);
}

/* The pair epilogues are built for the RMSNorm input form only (decode's q|k|v and
 * gate|up projections read the normalized residual stream). */
template <int F>
static lm_status launch_in(const lm__cuda_gemv_params *p, cudaStream_t s) {
    switch (p->in) {
    case LM__CUDA_GEMV_PLAIN: return launch_m<F, LM__CUDA_GEMV_PLAIN>(p, s);
    case LM__CUDA_GEMV_RMSNORM:
        if (p->epi == LM__CUDA_GEMV_EPI_FRONT) return launch_m<F, LM__CUDA_GEMV_RMSNORM, LM__CUDA_GEMV_EPI_FRONT>(p, s);
        if (p->epi == LM__CUDA_GEMV_EPI_SWIGLU) return launch_m<F, LM__CUDA_GEMV_RMSNORM, LM__CUDA_GEMV_EPI_SWIGLU>(p, s);
        return launch_m<F, LM__CUDA_GEMV_RMSNORM>(p, s);
    default: return launch_m<F, LM__CUDA_GEMV_SWIGLU>(p, s);
    }
}

lm_status lm__cuda_linear_gemv_check(const lm__cuda_gemv_params *p) {
    int wpv = p->wf == LM__CUDA_GEMV_I4 ? 32 : p->wf == LM__CUDA_GEMV_BF16 ? 8 : 16;
    if (p->M < 1 || p->M > LM__CUDA_GEMV_MAX_ROWS || p->K % wpv != 0 || p->ldx % 4 != 0 || p->ldw % 16 != 0 ||
        !lm__cuda_aligned16(p->w) || !lm__cuda_aligned16(p->x) || (p->wf == LM__CUDA_GEMV_I4 && p->group % 32 != 0))
        return lm__error(LM_UNSUPPORTED,
                         "linear_gemv: M = %d (1..%d), K = %lld (a multiple of %d), int4 group %d or alignment "
                         "not supported",
                         p->M, LM__CUDA_GEMV_MAX_ROWS, (long long)p->K, wpv, p->group);
    if (p->epi == LM__CUDA_GEMV_EPI_FRONT) {
        const int64_t hd = p->kv.head_dim, heads = p->q_front.q_heads + 2 * (int64_t)p->kv.kv_heads;
        if (p->accumulate || hd < 2 || hd % 2 || p->N != heads * hd || p->q_front.ntok != p->M ||
            p->q_front.q_norm || p->q_front.k_norm)
            return lm__error(LM_UNSUPPORTED, "linear_gemv: the attention front needs N = (Hq + 2 Hkv) hd rows of an "
                                             "even hd, one token per input row, no accumulate and no q/k norm");
    }
    if (p->epi != LM__CUDA_GEMV_EPI_OUT && p->in != LM__CUDA_GEMV_RMSNORM)
        return lm__error(LM_UNSUPPORTED, "linear_gemv: the pair epilogues take the RMSNorm input form only");
    if (p->epi == LM__CUDA_GEMV_EPI_SWIGLU && (p->accumulate || p->N % 2))
        return lm__error(LM_UNSUPPORTED, "linear_gemv: the SwiGLU epilogue needs an even N (gate | up), no accumulate");
    return LM_OK;
}

lm_status lm__cuda_linear_gemv(const lm__cuda_gemv_params *p, cudaStream_t s) {
    LM_TRY(lm__cuda_linear_gemv_check(p));
    if (p->N == 0) return LM_OK;
    switch (p->wf) {
    case LM__CUDA_GEMV_BF16: return launch_in<LM__CUDA_GEMV_BF16>(p, s);
    case LM__CUDA_GEMV_I8: return launch_in<LM__CUDA_GEMV_I8>(p, s);
    case LM__CUDA_GEMV_F8: return launch_in<LM__CUDA_GEMV_F8>(p, s);
    default: return launch_in<LM__CUDA_GEMV_I4>(p, s);
    }
}
