/* ops/cuda/gemm_rows.cu — the plain product of few rows (batched decode: 3-64 sequences)
 * on Hopper warpgroup products (wgmma), K split over a cluster of blocks whose partial
 * sums meet in distributed shared memory, under programmatic launch.
 *
 * out [M, N] (f32) = x W^T (+ bias) for bf16 x [M, K] (M <= 64), bf16 W [N, K] and an
 * optional f32 bias [N]: the layer products of a step (q|k|v, o, down) that cuBLASLt ran
 * as its own kernels (down with a split-K reduction kernel after it), without
 * programmatic launch, so no product's weight stream overlapped the kernel before it.
 *
 * Operands swapped: a block multiplies 64 weight rows (the wgmma's M, read as the A
 * operand) by the NB rows of x (its N: 16, 32 or 64, the smallest that holds M; rows past
 * M read zeros), so a tile of 64 outputs of every row streams its weights once. The
 * grid is ceil(N / 64) output tiles x S splits of K; the S blocks of a tile form one
 * cluster (S <= 8, the portable size), each multiplies its share of K's 64-wide steps,
 * leaves its 64 x NB partial sums in its shared memory, and after the cluster's barrier
 * sums a slice of the tile's outputs over the S partials in rank order (the same bits on
 * every run), adds the bias and stores. S is the most blocks the tiles can have resident
 * at once, up to 8 and up to K's steps (`LOOM_CUDA_ROWS_GEMM_SPLITS` forces one;
 * `LOOM_CUDA_ROWS_GEMM_MIN_STEPS=n` keeps n steps a block, measurements).
 * A block is one multiplying warpgroup and one copy warp: one thread issues the
 * tensor-memory copies (a stage is the weights' 64 x 64 box and x's NB x 64 box, ringed
 * by full / empty mbarriers, up to 8 stages: most blocks hold their whole share;
 * `LOOM_CUDA_ROWS_GEMM_STAGES` caps them, for measurements). The
 * weights do not depend on the kernel before: the first stages' weight boxes are asked
 * for before the programmatic wait, x's after it, so a step's product streams its
 * weights while the kernel before it finishes (the norm before q|k|v, the attention
 * before o, the gate|up product before down).
 * Graphs take it for products of up to 16 rows and K <= 1,024 (step_cuda.c's rows_wg_rule;
 * the LOOM_CUDA_ROWS_GEMM_MAX_ROWS, _MIN_K and _MAX_K switches move the bounds). On an
 * H100, taking every product, it measured faster than cuBLASLt at 4-16 rows of the
 * Qwen2.5-0.5B shape (K = 896, down 4,864) and slower at 32-64, where the products of
 * K = 896 have under two steps a block and pay the cluster's barriers and reduction; and
 * slower at every row count of the Llama-3.2-1B shape (K = 2,048, down 8,192); the
 * products of K <= 1,024 alone gained 1.00-1.11x at 4-16 rows (bench/NOTES.md "Decode at
 * the memory limit" v22-v24).
 * Built for sm_90a only; lm__cuda_linear_rows_wg_ok says whether this device and build run
 * it. Summation order: each split's k16 products in order, then the splits in rank order
 * (differs from cuBLASLt's; the tests compare both with the CPU's f32 product).
 */
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/tma.cuh"
#include "ops/cuda/wgmma.cuh"

namespace {

constexpr int BK = LM__TMA_BK, MAX_STAGES = 8, MAX_SPLITS = 8, THREADS = 160; /* 4 multiplying warps + a copy warp */

template <int NB> struct rwg {
    static constexpr int A_BYTES = 64 * BK * 2; /* 64 weight rows x 128 bytes */
    static constexpr int B_BYTES = NB * BK * 2; /* NB rows of x */
    static constexpr int STAGE = A_BYTES + B_BYTES;
    static constexpr int LDR = NB + 4; /* partial sums' row stride (f32): conflict-free stores */
    static constexpr int RED = 64 * LDR * 4;
    static constexpr size_t smem(int stages) { return (size_t)stages * STAGE + RED + 2 * stages * 8 + 1024; }
    static_assert(STAGE % 1024 == 0 && RED % 8 == 0, "stages on swizzle atoms, barriers 8-byte aligned");
};

/* D (64 x NB) (+)= A (64 x 16) B (16 x NB). */
template <int NB> __device__ __forceinline__ void products(float *d, uint64_t da, uint64_t db, int acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (NB == 16) wg_ss_n16(d, da, db, acc);
    else if constexpr (NB == 32) wg_ss_n32(d, da, db, acc);
    else wg_ss_n64(d, da, db, acc);
#else
    (void)d, (void)da, (void)db, (void)acc;
#endif
}

template <int NB>
__global__ void __launch_bounds__(THREADS) linear_rows_wg_kernel(const __grid_constant__ CUtensorMap tx,
                                                                 const __grid_constant__ CUtensorMap tw,
                                                                 const float *bias, float *out, int64_t ldo, int M,
                                                                 int N, int K, int splits, int stages) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef rwg<NB> S;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    float *red = (float *)(smem + stages * S::STAGE);
    uint64_t *full = (uint64_t *)(smem + stages * S::STAGE + S::RED), *empty = full + stages;
    const int split = (int)blockIdx.x % splits, n0 = ((int)blockIdx.x / splits) * 64;
    const int kt_n = (K + BK - 1) / BK, k0 = split * kt_n / splits, steps = (split + 1) * kt_n / splits - k0;
    if (threadIdx.x == 128) {
        asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&tw) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&tx) : "memory");
        for (int s = 0; s < stages; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 4);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x >= 128) { /* the copy warp */
        if (threadIdx.x == 128) {
            const int pre = steps < stages ? steps : stages;
            for (int i = 0; i < pre; i++) { /* weights first: no kernel of a step writes them */
                mbar_expect_tx(&full[i], S::STAGE);
                tma_2d(smem + i * S::STAGE, &tw, (k0 + i) * BK, n0, &full[i]);
            }
            pdl_wait(); /* x is the previous kernel's output */
            for (int i = 0; i < pre; i++) tma_2d(smem + i * S::STAGE + S::A_BYTES, &tx, (k0 + i) * BK, 0, &full[i]);
            for (int i = pre; i < steps; i++) {
                const int s = i % stages;
                mbar_wait(&empty[s], (unsigned)((i / stages - 1) & 1));
                uint8_t *st = smem + s * S::STAGE;
                mbar_expect_tx(&full[s], S::STAGE);
                tma_2d(st, &tw, (k0 + i) * BK, n0, &full[s]);
                tma_2d(st + S::A_BYTES, &tx, (k0 + i) * BK, 0, &full[s]);
            }
        }
        __syncwarp();
    } else { /* the multiplying warpgroup: outputs n0 + 16 w + q (+ 8) of rows 8 j + 2 c (+ 1) */
        const int lane = threadIdx.x & 31, w4 = threadIdx.x / 32, q = lane >> 2, c = lane & 3;
        float d[NB / 2];
#pragma unroll
        for (int i = 0; i < NB / 2; i++) d[i] = 0.f;
        for (int i = 0; i < steps; i++) {
            const int s = i % stages;
            mbar_wait(&full[s], (unsigned)((i / stages) & 1));
            const uint8_t *st = smem + s * S::STAGE;
            const uint64_t da = wg_desc(st, 16, 1024), db = wg_desc(st + S::A_BYTES, 16, 1024);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) products<NB>(d, da + 2 * kk, db + 2 * kk, i > 0 || kk > 0);
            wg_commit();
            wg_wait<1>(); /* the previous stage's products are done: give its buffers back */
            if (i > 0 && lane == 0) mbar_arrive(&empty[(i - 1) % stages]);
        }
        wg_wait<0>();
        wg_hold<NB / 2>(d);
#pragma unroll
        for (int j = 0; j < NB / 8; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) red[(16 * w4 + q + 8 * (r >> 1)) * S::LDR + 8 * j + 2 * c + (r & 1)] = d[4 * j + r];
    }
    pdl_trigger();
    if (splits > 1) cluster_sync();
    else __syncthreads();
    pdl_wait(); /* before any store: out may still be read by the kernels before */
    /* this block's slice of the tile's 64 outputs, summed over the splits in rank order */
    const int f_lo = split * 64 / splits, nf = (split + 1) * 64 / splits - f_lo;
    for (int e = threadIdx.x; e < nf * M; e += THREADS) {
        const int t = e / nf, f = f_lo + e % nf, col = n0 + f;
        if (col >= N) continue;
        const float *p = red + f * S::LDR + t;
        float sum = 0.f;
        if (splits > 1)
            for (int r = 0; r < splits; r++) sum += ld_cluster_f32(p, r);
        else
            sum = *p;
        if (bias) sum += bias[col];
        out[(int64_t)t * ldo + col] = sum;
    }
    if (splits > 1) cluster_sync(); /* no block leaves while the others read its partials */
#else
    (void)tx, (void)tw, (void)bias, (void)out, (void)ldo, (void)M, (void)N, (void)K, (void)splits, (void)stages;
#endif
}

lm__cuda_kernel_facts facts[3];

long long g_launches; /* the kernel's launches so far (lm__cuda_linear_rows_wg_launches) */

template <int NB>
lm_status launch(int fi, const void *x, int64_t ldx, const void *w, int64_t ldw, const float *bias, int64_t M,
                 int64_t N, int64_t K, float *out, int64_t ldo, cudaStream_t s) {
    typedef rwg<NB> S;
    const char *who = "linear (wgmma, few rows)";
    CUtensorMap tx, tw;
    LM_TRY(lm__cuda_bf16_map(&tx, x, M, K, ldx, NB, who));
    LM_TRY(lm__cuda_bf16_map(&tw, w, N, K, ldw, 64, who));
    const void *k = (const void *)linear_rows_wg_kernel<NB>;
    const int64_t tiles = (N + 63) / 64, kt_n = (K + BK - 1) / BK;
    /* LOOM_CUDA_ROWS_GEMM_STAGES=N (2-8; measurements): a ring of at most N stages */
    const char *se = getenv("LOOM_CUDA_ROWS_GEMM_STAGES");
    const int cap = se && atoi(se) >= 2 && atoi(se) <= MAX_STAGES ? atoi(se) : MAX_STAGES;
    int per_sm = 0;
    LM_TRY(lm__cuda_check(lm__cuda_blocks_per_sm(&facts[fi], k, THREADS, S::smem(cap), &per_sm), who));
    if (per_sm < 1) return lm__error(LM_UNSUPPORTED, "%s: no block fits on an SM", who);
    /* splits: as many as the tiles can have resident at once, up to 8 and up to K's steps */
    const char *ms = getenv("LOOM_CUDA_ROWS_GEMM_MIN_STEPS");
    const int64_t min_steps = ms && atoi(ms) > 0 ? atoi(ms) : 1;
    int64_t splits = LM_MIN((int64_t)lm__cuda_sm_count() * per_sm / tiles, kt_n / min_steps);
    const char *e = getenv("LOOM_CUDA_ROWS_GEMM_SPLITS");
    if (e && atoi(e) > 0) splits = atoi(e);
    splits = LM_MAX(1, LM_MIN(splits, LM_MIN((int64_t)MAX_SPLITS, kt_n)));
    const int stages = (int)LM_MIN((int64_t)cap, (kt_n + splits - 1) / splits);
    cudaError_t err = lm__cuda_launch_pdl_cluster(linear_rows_wg_kernel<NB>, dim3((unsigned)(tiles * splits)),
                                                  dim3(THREADS), S::smem(stages), s, (unsigned)splits, tx, tw, bias,
                                                  out, ldo, (int)M, (int)N, (int)K, (int)splits, stages);
    if (err != cudaSuccess) return lm__cuda_check((int)err, who);
    LM_TRY(lm__cuda_launched(who));
    __atomic_fetch_add(&g_launches, 1, __ATOMIC_RELAXED);
    return LM_OK;
}

} // namespace

long long lm__cuda_linear_rows_wg_launches(void) { return __atomic_load_n(&g_launches, __ATOMIC_RELAXED); }

int lm__cuda_linear_rows_wg_ok(void) { return lm__cuda_sm90a() && lm__cuda_tma_ok(); }

lm_status lm__cuda_linear_rows_wg(const void *x, int64_t ldx, const void *w, int64_t ldw, const float *bias, int64_t M,
                                  int64_t N, int64_t K, float *out, int64_t ldo, cudaStream_t s) {
    if (M < 1 || N < 1) return LM_OK;
    if (!lm__cuda_linear_rows_wg_ok())
        return lm__error(LM_UNSUPPORTED, "linear (wgmma, few rows): needs an sm_90 device, a build with sm_90a code "
                                         "and the driver's cuTensorMapEncodeTiled");
    if (!lm__cuda_linear_rows_wg_fits(x, ldx, w, ldw, M, N, K))
        return lm__error(LM_UNSUPPORTED, "linear (wgmma, few rows): needs 1-%d rows, K and the row strides of x and w "
                         "multiples of 8 and 16-byte aligned x and w (M %lld, N %lld, K %lld)",
                         LM__CUDA_ROWS_WG_MAX_ROWS, (long long)M, (long long)N, (long long)K);
    if (M <= 16) return launch<16>(0, x, ldx, w, ldw, bias, M, N, K, out, ldo, s);
    if (M <= 32) return launch<32>(1, x, ldx, w, ldw, bias, M, N, K, out, ldo, s);
    return launch<64>(2, x, ldx, w, ldw, bias, M, N, K, out, ldo, s);
}
