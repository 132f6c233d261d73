/* ops/cuda/gemm_wg.cu — the gate|up product with its SwiGLU in the epilogue, on Hopper
 * warpgroup products (wgmma) fed by tensor-memory copies (TMA): prefill, and the bf16
 * decode of more rows than the GEMV takes (batches of sequences).
 *
 * act [M, I] (bf16) = silu(bf16(x W_gate^T)) * bf16(x W_up^T) for bf16 x [M, K] and
 * the packed bf16 weights w [2 I, K] (rows 0..I-1 gate, I..2I-1 up): the roundings of
 * the unfused path (the product stored as bf16, then swiglu_packed_to_bf16); the
 * product's summation order differs, and silu takes the fast exponential and division
 * (__expf, __fdividef: a few ulp of f32, which can move an output by one bf16 ulp),
 * as the epilogue's arithmetic runs on the MMA warps between tiles.
 *
 * A block computes a tile of BMR rows (64 or 128) x W activations: its B tile is W gate
 * rows and the W up rows of the same activations, so gate and up of one output sit in
 * the same thread's accumulators (wgmma.cuh's layout) and the SwiGLU is formed in
 * registers. The grid is persistent (a block an SM, each walking tiles t, t + grid,
 * ..., row blocks fastest so the blocks in flight share weight tiles), and the stage
 * ring runs on across a block's tiles, so the next tile's first copies overlap this
 * tile's epilogue. Warpgroups: the first issues the copies (one thread: x's BMR x 64 box
 * and the two weight boxes of W x 64 per stage, 128-byte swizzle, ringed by full / empty
 * mbarriers: as many stages as shared memory holds, up to 12, for 128-row tiles; as many
 * as half of it holds for 64-row tiles, built for two blocks an SM), the others each
 * multiply 64 rows (four k16 steps per 64 inputs: one m64n(2W)k16 over the adjacent
 * gate and up boxes, at W = 152 two m64n152k16) and keep one stage's products in flight.
 * The weights do not depend on the kernel before (programmatic launch): the first
 * tile's first stages of them are asked for before waiting for it, x's boxes after; at
 * decode, where a block has one tile and the ring most of its K, the weight stream
 * overlaps the previous kernel's tail.
 * Copies past the edges of x or w read zeros (the tensor maps' bounds), so any M, I
 * and K (a multiple of 8, the maps' 16-byte strides) run; stores are masked.
 * The tile is picked per call (pick_config): past 128 rows, 128 x 128 or 128 x 152, the
 * width whose tiles fill the SMs in the fewest rounds times W (Qwen2.5-0.5B's I = 4,864
 * is 32 tiles of 152, one round of 128 blocks at 512 rows); up to 128 rows one row block
 * of 64 (M <= 64) or 128 rows and the width of 40, 64 or 72 (or 128, 152 at 128 rows) by
 * the same measure, so that the weights stream through ~all SMs (4,864 = 122 tiles of
 * 40). LOOM_CUDA_SWIGLU_GEMM_W forces a width (tests, measurements).
 * Built for sm_90a only; lm__cuda_swiglu_gemm_wg_ok says whether this device and build
 * can run it (and the driver gave cuTensorMapEncodeTiled).
 */
#include "ops/cuda/common.cuh"
#include "ops/cuda/tma.cuh"
#include "ops/cuda/wgmma.cuh"

#include <cudaTypedefs.h>

namespace {

constexpr int BK = LM__TMA_BK;
/* Shared memory a block may take: the opt-in limit of compute 9.0 devices (227 KiB); the
 * launcher checks that a block fits (lm__cuda_blocks_per_sm). */
constexpr int SMEM_BUDGET = 227 * 1024, MAX_STAGES = 12;

/* A tile of BMR rows (64: one multiplying warpgroup, 128: two) x W activations. The
 * 128-row tiles take an SM alone (232 registers for the two multiplying warpgroups, up to
 * 12 stages); the 64-row ones (decode) are built for two blocks an SM (<= 128 registers a
 * thread, a ring in half the shared memory), so that a block can start beside the
 * previous kernel's blocks and stream its weights during their tail (measured as fast as
 * one block an SM with 12 stages, not faster: bench/NOTES.md v18). */
template <int BMR, int W> struct swg {
    static constexpr int CONSUMERS = BMR / 64, THREADS = 128 * (1 + CONSUMERS), MINB = BMR == 64 ? 2 : 1;
    static constexpr int A_BYTES = BMR * BK * 2;   /* x's box: BMR rows x 128 bytes */
    static constexpr int B_BYTES = 2 * W * BK * 2; /* gate's and up's boxes */
    static constexpr int STAGE = A_BYTES + B_BYTES;
    static constexpr int FIT = (SMEM_BUDGET - 1024 - 2 * MAX_STAGES * 8) / STAGE;
    static constexpr int STAGES = FIT < MAX_STAGES ? FIT : MAX_STAGES; /* the most a launch may ask */
    static constexpr int FIT2 = (SMEM_BUDGET / 2 - 1024 - 2 * MAX_STAGES * 8) / STAGE;
    static constexpr int DEFAULT_STAGES = MINB == 2 ? (FIT2 < STAGES ? FIT2 : STAGES) : STAGES;
    static constexpr size_t smem(int stages) { return (size_t)stages * STAGE + 1024 /* alignment */ + 2 * stages * 8; }
    static_assert(STAGE % 1024 == 0 && (W * 128) % 1024 == 0, "stages and boxes on swizzle atoms");
    static_assert(DEFAULT_STAGES >= 2, "a ring of at least two stages");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* silu(x) with the fast exponential and division (a few instructions: the epilogue's
 * cost per output is paid by the MMA warps); where 1 + e^-x passes 2^126 (x below about
 * -87) __fdividef gives 0, silu's limit there. */
__device__ __forceinline__ float silu_fast(float x) { return __fdividef(x, 1.f + __expf(-x)); }
#endif

/* The block's products of one k16 step: D (64 x 2W) (+)= A (64 x 16) [gate | up] (16 x 2W),
 * the boxes adjacent (one n(2W) product), or at W = 152 two n152 products (n <= 256). */
template <int W>
__device__ __forceinline__ void products(float *d, uint64_t da, uint64_t dg, uint64_t du, int acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (W == 152) {
        wg_ss_n152(d, da, dg, acc);
        wg_ss_n152(d + W / 2, da, du, acc);
    } else {
        static_assert(W == 40 || W == 64 || W == 72 || W == 128, "a width with its product");
        (void)du;
        if constexpr (W == 40) wg_ss_n80(d, da, dg, acc);
        else if constexpr (W == 64) wg_ss_n128(d, da, dg, acc);
        else if constexpr (W == 72) wg_ss_n144(d, da, dg, acc);
        else wg_ss_n256(d, da, dg, acc);
    }
#else
    (void)d, (void)da, (void)dg, (void)du, (void)acc;
#endif
}

template <int BMR, int W>
__global__ void __launch_bounds__(swg<BMR, W>::THREADS, swg<BMR, W>::MINB)
    swiglu_gemm_wg_kernel(const __grid_constant__ CUtensorMap tx, const __grid_constant__ CUtensorMap tw, bf16 *out,
                          int64_t ldo, int M, int I, int K, int STAGES) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef swg<BMR, W> S;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint64_t *full = (uint64_t *)(smem + STAGES * S::STAGE), *empty = full + STAGES;
    const int wg = threadIdx.x / 128, lane = threadIdx.x & 31;
    const int mt = (M + BMR - 1) / BMR, tiles = mt * ((I + W - 1) / W), kt_n = (K + BK - 1) / BK;
    if (threadIdx.x == 0) {
        asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&tw) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&tx) : "memory");
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 4 * S::CONSUMERS);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();
    /* tiles t = blockIdx.x, + gridDim.x, ...: row block t % mt, column block t / mt (the
     * blocks in flight share weight tiles); one ring of stages across them, so the next
     * tile's first copies overlap this tile's epilogue */
    if (wg == 0) {
        if constexpr (S::MINB == 1) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            /* the weights do not depend on the previous kernel: the first tile's first
             * stages of them are asked for before waiting for it (at decode, where a
             * block has one tile, that is most of its bytes), x's boxes after */
            const int pre = (int)blockIdx.x < tiles ? (kt_n < STAGES ? kt_n : STAGES) : 0;
            const int n00 = ((int)blockIdx.x / mt) * W, m00 = ((int)blockIdx.x % mt) * BMR;
            for (int kt = 0; kt < pre; kt++) {
                uint8_t *st = smem + kt * S::STAGE;
                mbar_expect_tx(&full[kt], S::STAGE);
                tma_2d(st + S::A_BYTES, &tw, kt * BK, n00, &full[kt]);
                tma_2d(st + S::A_BYTES + W * 128, &tw, kt * BK, I + n00, &full[kt]);
            }
            pdl_wait(); /* x is the previous kernel's output */
            for (int kt = 0; kt < pre; kt++) tma_2d(smem + kt * S::STAGE, &tx, kt * BK, m00, &full[kt]);
            int it = 0;
            for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
                const int m0 = (t % mt) * BMR, n0 = (t / mt) * W;
                for (int kt = 0; kt < kt_n; kt++, it++) {
                    if (it < pre) continue; /* asked for above */
                    const int s = it % STAGES;
                    if (it >= STAGES) mbar_wait(&empty[s], (unsigned)((it / STAGES - 1) & 1));
                    uint8_t *st = smem + s * S::STAGE;
                    mbar_expect_tx(&full[s], S::STAGE);
                    tma_2d(st, &tx, kt * BK, m0, &full[s]);
                    tma_2d(st + S::A_BYTES, &tw, kt * BK, n0, &full[s]);
                    tma_2d(st + S::A_BYTES + W * 128, &tw, kt * BK, I + n0, &full[s]);
                }
            }
        }
        return;
    }
    if constexpr (S::MINB == 1) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    pdl_wait(); /* before any store: out may still be read by the kernels before */
    const int half = wg - 1; /* rows 64 half .. of the tile */
    /* registers 4 j + r: column 8 j + 2 c + (r & 1) of row 16 w + q + 8 (r >> 1) */
    const int w4 = (threadIdx.x / 32) & 3, q = lane >> 2, c = lane & 3;
    float d[W]; /* gate's W / 2 registers, then up's: one n(2W) product's layout */
    float *g = d, *u = d + W / 2;
#pragma unroll
    for (int i = 0; i < W; i++) d[i] = 0.f;
    int it = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int m0 = (t % mt) * BMR, n0 = (t / mt) * W;
        for (int kt = 0; kt < kt_n; kt++, it++) {
            const int s = it % STAGES;
            mbar_wait(&full[s], (unsigned)((it / STAGES) & 1));
            const uint8_t *st = smem + s * S::STAGE;
            const uint64_t da = wg_desc(st + half * 64 * 128, 16, 1024), dg = wg_desc(st + S::A_BYTES, 16, 1024),
                           du = wg_desc(st + S::A_BYTES + W * 128, 16, 1024);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) /* 16 inputs = 32 bytes along the swizzled rows */
                products<W>(d, da + 2 * kk, dg + 2 * kk, du + 2 * kk, kt > 0 || kk > 0);
            wg_commit();
            wg_wait<1>(); /* the previous stage's products are done: give its buffers back */
            if (kt > 0 && lane == 0) mbar_arrive(&empty[(it - 1) % STAGES]);
        }
        wg_wait<0>();
        wg_hold<W>(d);
        if (lane == 0) mbar_arrive(&empty[(it - 1) % STAGES]); /* the tile's last stage */
        if (t + (int)gridDim.x >= tiles) pdl_trigger();
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int row = m0 + half * 64 + 16 * w4 + q + 8 * hr;
            if (row >= M) continue;
            bf16 *orow = out + (int64_t)row * ldo;
#pragma unroll
            for (int j = 0; j < W / 8; j++) {
                const int col = n0 + 8 * j + 2 * c;
                const int r = 4 * j + 2 * hr;
                const float2 gg = __bfloat1622float2(__floats2bfloat162_rn(g[r], g[r + 1]));
                const float2 uu = __bfloat1622float2(__floats2bfloat162_rn(u[r], u[r + 1]));
                const float a0 = silu_fast(gg.x) * uu.x, a1 = silu_fast(gg.y) * uu.y;
                if (col + 1 < I)
                    *(__nv_bfloat162 *)(orow + col) = __floats2bfloat162_rn(a0, a1);
                else if (col < I)
                    orow[col] = __float2bfloat16_rn(a0);
            }
        }
    }
#else
    (void)tx, (void)tw, (void)out, (void)ldo, (void)M, (void)I, (void)K, (void)STAGES;
#endif
}

/* The built tiles (rows x width). One row block (M <= 128: decode of many sequences, short
 * prefills) takes any width, the rows in one or two warpgroups; more rows take the wide
 * tiles, which reuse each weight tile over more rows per product. */
struct config {
    int bmr, w;
};
constexpr config k_configs[] = {{64, 40}, {64, 64}, {64, 72}, {128, 40}, {128, 64}, {128, 72}, {128, 128}, {128, 152}};
constexpr int k_nconfigs = (int)(sizeof k_configs / sizeof k_configs[0]);
lm__cuda_kernel_facts facts[k_nconfigs];

template <int BMR, int W>
lm_status launch(int ci, const void *x, int64_t ldx, const void *w, int64_t ldw, int64_t M, int64_t I, int64_t K,
                 void *out, int64_t ldo, cudaStream_t s) {
    typedef swg<BMR, W> S;
    CUtensorMap tx, tw;
    LM_TRY(lm__cuda_bf16_map(&tx, x, M, K, ldx, BMR, "swiglu GEMM (cuda)"));
    LM_TRY(lm__cuda_bf16_map(&tw, w, 2 * I, K, ldw, W, "swiglu GEMM (cuda)"));
    const void *k = (const void *)swiglu_gemm_wg_kernel<BMR, W>;
    /* LOOM_CUDA_SWIGLU_GEMM_STAGES=N (measurements): N stages, up to the shared memory's fit */
    const char *se = getenv("LOOM_CUDA_SWIGLU_GEMM_STAGES");
    const int stages = se && atoi(se) >= 2 ? LM_MIN(atoi(se), S::STAGES) : S::DEFAULT_STAGES;
    int per_sm = 0;
    LM_TRY(lm__cuda_check(lm__cuda_blocks_per_sm(&facts[ci], k, S::THREADS, S::smem(stages), &per_sm),
                          "swiglu GEMM (wgmma): kernel attributes"));
    if (per_sm < 1) return lm__error(LM_UNSUPPORTED, "swiglu GEMM (wgmma): no block fits on an SM");
    /* persistent: as many blocks as fit the SMs at once (one an SM for 128-row tiles, two for
     * 64-row ones), each walking its tiles (LOOM_CUDA_SWIGLU_GEMM_BLOCKS caps the grid: tests
     * run the tile loop with few blocks) */
    int64_t tiles = (M + BMR - 1) / BMR * ((I + W - 1) / W),
            blocks = LM_MIN(tiles, (int64_t)lm__cuda_sm_count() * per_sm);
    const char *cap = getenv("LOOM_CUDA_SWIGLU_GEMM_BLOCKS");
    if (cap && atoi(cap) > 0) blocks = LM_MIN(blocks, (int64_t)atoi(cap));
    dim3 grid((unsigned)blocks);
    cudaError_t e = lm__cuda_launch_pdl(swiglu_gemm_wg_kernel<BMR, W>, grid, dim3(S::THREADS), S::smem(stages), s, tx,
                                        tw, (bf16 *)out, ldo, (int)M, (int)I, (int)K, stages);
    if (e != cudaSuccess) return lm__cuda_check((int)e, "swiglu GEMM (wgmma)");
    return lm__cuda_launched("swiglu GEMM (wgmma)");
}

/* The tile for M rows of I activations: 64 rows where M fits them (one multiplying
 * warpgroup), else 128; of the widths that tile is built with (the wide ones, 128 and
 * 152, only past one row block), the one whose tiles fill the SMs in the fewest rounds
 * times the width, the wider on a tie. LOOM_CUDA_SWIGLU_GEMM_W=40|64|72|128|152 forces a
 * width (tests, measurements; 128 and 152 with 128 rows). */
int pick_config(int64_t M, int64_t I) {
    const char *e = getenv("LOOM_CUDA_SWIGLU_GEMM_W");
    const int forced = e ? atoi(e) : 0, bmr = M <= 64 && forced < 128 ? 64 : 128;
    const int64_t sms = lm__cuda_sm_count();
    int best = -1;
    int64_t best_cost = 0;
    for (int i = 0; i < k_nconfigs; i++) {
        const config c = k_configs[i];
        if (c.bmr != bmr) continue;
        if (forced) {
            if (c.w == forced) return i;
            continue;
        }
        const int64_t mt = (M + c.bmr - 1) / c.bmr;
        if (mt > 1 && c.w < 128) continue;
        const int64_t cost = (mt * ((I + c.w - 1) / c.w) + sms - 1) / sms * c.w;
        if (best < 0 || cost <= best_cost) best = i, best_cost = cost; /* widths ascend: ties go wider */
    }
    return best; /* -1: a forced width not built */
}

} // namespace

/* ---- tensor maps (tma.cuh) ---- */
static PFN_cuTensorMapEncodeTiled_v12000 encode_fn(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn;
    static int tried;
    if (!__atomic_load_n(&tried, __ATOMIC_ACQUIRE)) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            p = NULL;
        fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
        __atomic_store_n(&tried, 1, __ATOMIC_RELEASE);
    }
    return fn;
}

lm_status lm__cuda_bf16_map(CUtensorMap *m, const void *base, int64_t rows, int64_t cols, int64_t ld, int box_rows,
                            const char *who) {
    PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn();
    if (!fn) return lm__error(LM_UNSUPPORTED, "%s: the driver has no cuTensorMapEncodeTiled", who);
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld * 2};
    cuuint32_t box[2] = {LM__TMA_BK, (cuuint32_t)box_rows}, es[2] = {1, 1};
    CUresult r = fn(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dims, strides, box, es,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return lm__error(LM_INTERNAL, "%s: cuTensorMapEncodeTiled failed (%d) for a [%lld, %lld] matrix", who, (int)r,
                         (long long)rows, (long long)cols);
    return LM_OK;
}

int lm__cuda_tma_ok(void) { return encode_fn() != NULL; }

int lm__cuda_swiglu_gemm_wg_ok(void) { return lm__cuda_sm90a() && lm__cuda_tma_ok(); }

lm_status lm__cuda_swiglu_gemm_wg(const void *x, int64_t ldx, const void *w, int64_t ldw, int64_t M, int64_t I,
                                  int64_t K, void *out, int64_t ldo, cudaStream_t s) {
    if (M < 1 || I < 1 || K < 1) return LM_OK;
    if (!lm__cuda_sm90a())
        return lm__error(LM_UNSUPPORTED, "swiglu GEMM (cuda): needs an sm_90 device and a build with sm_90a code");
    if (K % 8 || ldx % 8 || ldw % 8 || ldo % 2 || !lm__cuda_aligned16(x) || !lm__cuda_aligned16(w) ||
        ((uintptr_t)out & 3) || M > INT32_MAX / 2 || 2 * I > INT32_MAX || K > INT32_MAX ||
        ((M + 63) / 64) * ((I + 39) / 40) > INT32_MAX)
        return lm__error(LM_UNSUPPORTED, "swiglu GEMM (cuda): needs K and the row strides of x and w multiples of 8, "
                                         "16-byte aligned x and w, and an even out stride");
    int ci = pick_config(M, I);
    if (ci < 0) {
        const char *e = getenv("LOOM_CUDA_SWIGLU_GEMM_W");
        return lm__error(LM_INVALID_ARGUMENT, "swiglu GEMM (cuda): LOOM_CUDA_SWIGLU_GEMM_W=%s is not a built width "
                         "(40, 64, 72; 128 and 152 for tiles of 128 rows)", e ? e : "");
    }
    switch (ci) {
    case 0: return launch<64, 40>(ci, x, ldx, w, ldw, M, I, K, out, ldo, s);
    case 1: return launch<64, 64>(ci, x, ldx, w, ldw, M, I, K, out, ldo, s);
    case 2: return launch<64, 72>(ci, x, ldx, w, ldw, M, I, K, out, ldo, s);
    case 3: return launch<128, 40>(ci, x, ldx, w, ldw, M, I, K, out, ldo, s);
    case 4: return launch<128, 64>(ci, x, ldx, w, ldw, M, I, K, out, ldo, s);
    case 5: return launch<128, 72>(ci, x, ldx, w, ldw, M, I, K, out, ldo, s);
    case 6: return launch<128, 128>(ci, x, ldx, w, ldw, M, I, K, out, ldo, s);
    default: return launch<128, 152>(ci, x, ldx, w, ldw, M, I, K, out, ldo, s);
    }
}
