/* ops/cuda/gemm_wg.cu — the gate|up product with its SwiGLU in the epilogue, on Hopper
 * warpgroup products (wgmma) fed by tensor-memory copies (TMA), for prefill.
 *
 * act [M, I] (bf16) = silu(bf16(x W_gate^T)) * bf16(x W_up^T) for bf16 x [M, K] and
 * the packed bf16 weights w [2 I, K] (rows 0..I-1 gate, I..2I-1 up): the roundings of
 * the unfused path (the product stored as bf16, then swiglu_packed_to_bf16); the
 * product's summation order differs, and silu takes the fast exponential and division
 * (__expf, __fdividef: a few ulp of f32, which can move an output by one bf16 ulp),
 * as the epilogue's arithmetic runs on the MMA warps between tiles.
 *
 * A block computes a tile of 128 rows x W activations (W = 128 or 152): its B tile is
 * W gate rows and the W up rows of the same activations, so gate and up of one output
 * sit in the same thread's accumulators (wgmma.cuh's layout) and the SwiGLU is formed
 * in registers. The grid is persistent (a block an SM, each walking tiles t, t + grid,
 * ..., row blocks fastest so the blocks in flight share weight tiles), and the stage
 * ring runs on across a block's tiles, so the next tile's first copies overlap this
 * tile's epilogue. Three warpgroups: the first issues the copies (one thread: x's 128 x
 * 64 box and the two weight boxes of W x 64 per stage, 128-byte swizzle, four stages
 * ringed by full / empty mbarriers), the other two each multiply 64 of the 128 rows
 * (four k16 steps per 64 inputs: at W = 128 one m64n256k16 over the adjacent gate and up
 * boxes, at 152 two m64n152k16) and keep one stage's products in flight.
 * Copies past the edges of x or w read zeros (the tensor maps' bounds), so any M, I
 * and K (a multiple of 8, the maps' 16-byte strides) run; stores are masked.
 * W is picked per call: the width whose tiles fill the SMs in the fewest rounds, times
 * W (Qwen2.5-0.5B's I = 4,864 is 32 tiles of 152, one round of 128 blocks at 512
 * rows); LOOM_CUDA_SWIGLU_GEMM_W=128|152 forces one (tests, measurements).
 * Built for sm_90a only; lm__cuda_swiglu_gemm_wg_ok says whether this device and build
 * can run it (and the driver gave cuTensorMapEncodeTiled).
 */
#include "ops/cuda/common.cuh"
#include "ops/cuda/wgmma.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

namespace {

constexpr int BM = 128, BK = 64, STAGES = 4, THREADS = 384;

template <int W> struct swg {
    static constexpr int A_BYTES = BM * BK * 2;    /* x's box: 128 rows x 128 bytes */
    static constexpr int B_BYTES = 2 * W * BK * 2; /* gate's and up's boxes */
    static constexpr int STAGE = A_BYTES + B_BYTES;
    static constexpr int SMEM = STAGES * STAGE + 1024 /* alignment */ + 2 * STAGES * 8;
    static_assert(STAGE % 1024 == 0, "stages on swizzle atoms");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) /* the helpers of the sm_90a kernel body */
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity) {
    asm volatile("{\n.reg .pred done;\n"
                 "wait_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_%=;\n}\n" ::"r"(smem_u32(b)),
                 "r"(parity)
                 : "memory");
}
/* A 2-D box of the tensor map at (c0 = inner coordinate, c1 = row) into shared memory,
 * completing on mbarrier b. */
__device__ __forceinline__ void tma_2d(void *dst, const CUtensorMap *map, int c0, int c1, uint64_t *b) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                 "%3}], [%4];\n" ::"r"(smem_u32(dst)),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(smem_u32(b))
                 : "memory");
}

/* silu(x) with the fast exponential and division (a few instructions: the epilogue's
 * cost per output is paid by the MMA warps); where 1 + e^-x passes 2^126 (x below about
 * -87) __fdividef gives 0, silu's limit there. */
__device__ __forceinline__ float silu_fast(float x) { return __fdividef(x, 1.f + __expf(-x)); }
#endif

template <int W>
__global__ void __launch_bounds__(THREADS, 1)
    swiglu_gemm_wg_kernel(const __grid_constant__ CUtensorMap tx, const __grid_constant__ CUtensorMap tw, bf16 *out,
                          int64_t ldo, int M, int I, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef swg<W> S;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint64_t *full = (uint64_t *)(smem + STAGES * S::STAGE), *empty = full + STAGES;
    const int wg = threadIdx.x / 128, lane = threadIdx.x & 31;
    const int mt = (M + BM - 1) / BM, tiles = mt * ((I + W - 1) / W), kt_n = (K + BK - 1) / BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 8); /* 8 consumer warps */
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();
    pdl_wait(); /* x is the previous kernel's output */
    /* tiles t = blockIdx.x, + gridDim.x, ...: row block t % mt, column block t / mt (the
     * blocks in flight share weight tiles); one ring of stages across them, so the next
     * tile's first copies overlap this tile's epilogue */
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            int it = 0;
            for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
                const int m0 = (t % mt) * BM, n0 = (t / mt) * W;
                for (int kt = 0; kt < kt_n; kt++, it++) {
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
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int half = wg - 1; /* rows 64 half .. of the tile */
    /* registers 4 j + r: column 8 j + 2 c + (r & 1) of row 16 w + q + 8 (r >> 1) */
    const int w4 = (threadIdx.x / 32) & 3, q = lane >> 2, c = lane & 3;
    float d[W]; /* gate's W / 2 registers, then up's: one n(2W) product's layout */
    float *g = d, *u = d + W / 2;
#pragma unroll
    for (int i = 0; i < W; i++) d[i] = 0.f;
    int it = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int m0 = (t % mt) * BM, n0 = (t / mt) * W;
        for (int kt = 0; kt < kt_n; kt++, it++) {
            const int s = it % STAGES;
            mbar_wait(&full[s], (unsigned)((it / STAGES) & 1));
            const uint8_t *st = smem + s * S::STAGE;
            const uint64_t da = wg_desc(st + half * 64 * 128, 16, 1024), dg = wg_desc(st + S::A_BYTES, 16, 1024),
                           du = wg_desc(st + S::A_BYTES + W * 128, 16, 1024);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) { /* 16 inputs = 32 bytes along the swizzled rows */
                const int acc = kt > 0 || kk > 0;
                if (W == 152) { /* 304 columns: two products */
                    wg_ss_n152(g, da + 2 * kk, dg + 2 * kk, acc);
                    wg_ss_n152(u, da + 2 * kk, du + 2 * kk, acc);
                } else { /* gate's and up's boxes are adjacent: one n256 product */
                    wg_ss_n256(d, da + 2 * kk, dg + 2 * kk, acc);
                }
            }
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
    (void)tx, (void)tw, (void)out, (void)ldo, (void)M, (void)I, (void)K;
#endif
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn(void) {
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

/* A bf16 [rows, cols] matrix with rows ld elements apart, read in boxes of box_rows x
 * 64 with the 128-byte swizzle; zeros past its edges. */
lm_status bf16_map(CUtensorMap *m, const void *base, int64_t rows, int64_t cols, int64_t ld, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn();
    if (!fn) return lm__error(LM_UNSUPPORTED, "swiglu GEMM (cuda): the driver has no cuTensorMapEncodeTiled");
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld * 2};
    cuuint32_t box[2] = {BK, (cuuint32_t)box_rows}, es[2] = {1, 1};
    CUresult r = fn(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dims, strides, box, es,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return lm__error(LM_INTERNAL, "swiglu GEMM (cuda): cuTensorMapEncodeTiled failed (%d) for a [%lld, %lld] matrix",
                         (int)r, (long long)rows, (long long)cols);
    return LM_OK;
}

lm__cuda_kernel_facts facts[2];

template <int W>
lm_status launch(const void *x, int64_t ldx, const void *w, int64_t ldw, int64_t M, int64_t I, int64_t K, void *out,
                 int64_t ldo, cudaStream_t s) {
    CUtensorMap tx, tw;
    LM_TRY(bf16_map(&tx, x, M, K, ldx, BM));
    LM_TRY(bf16_map(&tw, w, 2 * I, K, ldw, W));
    const void *k = (const void *)swiglu_gemm_wg_kernel<W>;
    int per_sm = 0;
    LM_TRY(lm__cuda_check(lm__cuda_blocks_per_sm(&facts[W == 152], k, THREADS, swg<W>::SMEM, &per_sm),
                          "swiglu GEMM (wgmma): kernel attributes"));
    if (per_sm < 1) return lm__error(LM_UNSUPPORTED, "swiglu GEMM (wgmma): no block fits on an SM");
    /* persistent: one block an SM at most, each walking its tiles (LOOM_CUDA_SWIGLU_GEMM_BLOCKS
     * caps the grid: tests run the tile loop with few blocks) */
    int64_t tiles = (M + BM - 1) / BM * ((I + W - 1) / W), blocks = LM_MIN(tiles, (int64_t)lm__cuda_sm_count() * per_sm);
    const char *cap = getenv("LOOM_CUDA_SWIGLU_GEMM_BLOCKS");
    if (cap && atoi(cap) > 0) blocks = LM_MIN(blocks, (int64_t)atoi(cap));
    dim3 grid((unsigned)blocks);
    cudaError_t e = lm__cuda_launch_pdl(swiglu_gemm_wg_kernel<W>, grid, dim3(THREADS), (size_t)swg<W>::SMEM, s, tx, tw,
                                        (bf16 *)out, ldo, (int)M, (int)I, (int)K);
    if (e != cudaSuccess) return lm__cuda_check((int)e, "swiglu GEMM (wgmma)");
    return lm__cuda_launched("swiglu GEMM (wgmma)");
}

/* Rounds of blocks over the SMs, times the width: the smaller wins (128 on a tie). */
int pick_width(int64_t M, int64_t I) {
    const char *e = getenv("LOOM_CUDA_SWIGLU_GEMM_W");
    if (e && strcmp(e, "128") == 0) return 128;
    if (e && strcmp(e, "152") == 0) return 152;
    const int64_t sms = lm__cuda_sm_count(), mt = (M + BM - 1) / BM;
    const int64_t r128 = (mt * ((I + 127) / 128) + sms - 1) / sms, r152 = (mt * ((I + 151) / 152) + sms - 1) / sms;
    return r152 * 152 < r128 * 128 ? 152 : 128;
}

} // namespace

int lm__cuda_swiglu_gemm_wg_ok(void) { return lm__cuda_sm90a() && encode_fn() != NULL; }

lm_status lm__cuda_swiglu_gemm_wg(const void *x, int64_t ldx, const void *w, int64_t ldw, int64_t M, int64_t I,
                                  int64_t K, void *out, int64_t ldo, cudaStream_t s) {
    if (M < 1 || I < 1 || K < 1) return LM_OK;
    if (!lm__cuda_sm90a())
        return lm__error(LM_UNSUPPORTED, "swiglu GEMM (cuda): needs an sm_90 device and a build with sm_90a code");
    if (K % 8 || ldx % 8 || ldw % 8 || ldo % 2 || !lm__cuda_aligned16(x) || !lm__cuda_aligned16(w) ||
        ((uintptr_t)out & 3) || M > INT32_MAX / 2 || 2 * I > INT32_MAX || K > INT32_MAX ||
        ((M + BM - 1) / BM) * ((I + 127) / 128) > INT32_MAX)
        return lm__error(LM_UNSUPPORTED, "swiglu GEMM (cuda): needs K and the row strides of x and w multiples of 8, "
                                         "16-byte aligned x and w, and an even out stride");
    return pick_width(M, I) == 152 ? launch<152>(x, ldx, w, ldw, M, I, K, out, ldo, s)
                                   : launch<128>(x, ldx, w, ldw, M, I, K, out, ldo, s);
}
