/* ops/cuda/gemv.cu — the Linear of a few rows: matrix-vector products for decode (M <= 8 rows), with the
 * preceding elementwise step fused into the input read and the residual add into
 * the output write.
 *
 * Decode reads every weight byte once per step, so this kernel is about keeping
 * enough 16-byte weight loads in flight to stream W (bf16 [N, K]) at full bandwidth:
 *  - a warp owns RPW = 2 output rows and a slice of K; each lane issues UNROLL = 4
 *    16-byte loads per row (8 independent loads) before using any of them;
 *  - when N is small (o and down projections, N ~ H) a row's K is split over KSPLIT =
 *    8 warps of one block, combined through shared memory, so there are enough warps
 *    to cover the GPU; when N is large (q|k|v, gate|up, lm_head) KSPLIT = 1 and each
 *    warp owns whole rows;
 *  - the grid is at most 4 blocks per SM and walks the row groups in a stride loop,
 *    so per-block work (the RMSNorm prologue) is paid a few hundred times, not once
 *    per pair of rows (the lm_head has 150k rows).
 *  - launched with programmatic dependent launch: each warp issues its first batch of
 *    weight loads before waiting for the previous kernel (pdl_wait), so the weight
 *    stream of this projection overlaps the tail of the kernel before it.
 * Inputs: PLAIN x; RMSNORM x / rms(x) * norm_w (1/rms of each row computed by every
 * warp from L1/L2: no block barrier on the critical path); SWIGLU silu(gate) * up from
 * x = [gate | up]. The M input rows are tiny and
 * served from L1/L2. Work O(M * N * K); bytes ~ 2 * N * K.
 */
#include "ops/cuda/gemv_body.cuh"

template <int IN, int M, int KSPLIT>
__global__ void __launch_bounds__(THREADS) gemv_kernel(lm__cuda_gemv_params p) {
    gemv_body<IN, M, KSPLIT>(p, blockIdx.x, gridDim.x, pdl_wait_fn());
}

template <int IN, int M>
static lm_status launch(const lm__cuda_gemv_params *p, cudaStream_t s) {
    int64_t sms = lm__cuda_sm_count();
    int ksplit = lm__gemv_ksplit(p->N, sms);
    int64_t blocks = lm__gemv_blocks(p->N, sms);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {dim3((unsigned)blocks), dim3(THREADS), 0, s, &attr, 1};
    cudaError_t e = ksplit == 1 ? cudaLaunchKernelEx(&cfg, gemv_kernel<IN, M, 1>, *p)
                                : cudaLaunchKernelEx(&cfg, gemv_kernel<IN, M, WARPS>, *p);
    if (e != cudaSuccess) return lm__cuda_check((int)e, "linear_gemv launch");
    return lm__cuda_launched("linear_gemv");
}

template <int IN>
static lm_status launch_m(const lm__cuda_gemv_params *p, cudaStream_t s) {
    switch (p->M) {
    case 1: return launch<IN, 1>(p, s);
    case 2: return launch<IN, 2>(p, s);
    case 3: return launch<IN, 3>(p, s);
    case 4: return launch<IN, 4>(p, s);
    case 5: return launch<IN, 5>(p, s);
    case 6: return launch<IN, 6>(p, s);
    case 7: return launch<IN, 7>(p, s);
    default: return launch<IN, 8>(p, s);
    }
}

lm_status lm__cuda_linear_gemv(const lm__cuda_gemv_params *p, cudaStream_t s) {
    if (p->M < 1 || p->M > LM__CUDA_GEMV_MAX_ROWS || p->K % 8 != 0 || p->ldx % 4 != 0 || ((uintptr_t)p->w & 15) ||
        ((uintptr_t)p->x & 15))
        return lm__error(LM_UNSUPPORTED, "linear_gemv: M = %d (1..%d), K = %lld (multiple of 8) or alignment not supported",
                         p->M, LM__CUDA_GEMV_MAX_ROWS, (long long)p->K);
    if (p->N == 0) return LM_OK;
    switch (p->in) {
    case LM__CUDA_GEMV_PLAIN: return launch_m<LM__CUDA_GEMV_PLAIN>(p, s);
    case LM__CUDA_GEMV_RMSNORM: return launch_m<LM__CUDA_GEMV_RMSNORM>(p, s);
    default: return launch_m<LM__CUDA_GEMV_SWIGLU>(p, s);
    }
}
