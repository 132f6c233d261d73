/* ops/cuda/common.cuh — helpers shared by the CUDA kernels (never installed).
 *
 * lm__cuda_nd carries a view's shape and strides (elements) by value into a kernel;
 * nd_offset maps a row-major linear index to an element offset in O(ndim). Loads
 * widen f32/bf16/f16 to float and stores round to nearest even, so every readable
 * kernel is one template over the three float dtypes with f32 arithmetic.
 * Reductions: warp shuffles, then one shared slot per warp (blocks <= 1024 threads).
 */
#ifndef LOOM_OPS_CUDA_COMMON_CUH
#define LOOM_OPS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cuda/cuda_ops.h"

typedef __nv_bfloat16 bf16;

struct lm__cuda_nd {
    int ndim;
    int64_t shape[LM_MAX_DIMS];
    int64_t stride[LM_MAX_DIMS]; /* elements */
    int contig_ndim;             /* ndim when the view is row-major contiguous, else -1 */
};

/* 1 when p is 16-byte aligned (what the vector paths' 16-byte loads and stores need). */
static inline int lm__cuda_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static inline lm__cuda_nd lm__cuda_nd_of(const lm_tensor_view *v) {
    lm__cuda_nd d;
    memset(&d, 0, sizeof d);
    d.ndim = v->ndim;
    for (int i = 0; i < v->ndim; i++) {
        d.shape[i] = v->shape[i];
        d.stride[i] = v->stride[i];
    }
    d.contig_ndim = lm_tensor_view_is_contiguous(v) ? v->ndim : -1;
    return d;
}

/* Element offset of row-major linear index i (0 <= i < numel). A contiguous view
 * whose descriptor was not narrowed afterwards (ndim still contig_ndim) maps i to
 * itself without the per-dim divisions. */
__device__ __forceinline__ int64_t nd_offset(const lm__cuda_nd &v, int64_t i) {
    if (v.ndim == v.contig_ndim) return i;
    int64_t off = 0;
    for (int d = v.ndim - 1; d >= 0; d--) {
        int64_t n = v.shape[d];
        off += (i % n) * v.stride[d];
        i /= n;
    }
    return off;
}

__device__ __forceinline__ float ld(const float *p) { return *p; }
__device__ __forceinline__ float ld(const bf16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float ld(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ void st(float *p, float v) { *p = v; }
__device__ __forceinline__ void st(bf16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void st(__half *p, float v) { *p = __float2half_rn(v); }
/* v rounded to T and widened back: what a store followed by a load would give. */
template <typename T> __device__ __forceinline__ float round_to(float v) {
    T t;
    st(&t, v);
    return ld(&t);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum (or max) over the block; every thread gets the result. scratch: >= 32 floats.
 * Must be reached by all threads of the block. */
__device__ __forceinline__ float block_sum(float v, float *scratch) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[w] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float *scratch) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[w] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : -INFINITY;
    return warp_max(v);
}

/* Programmatic dependent launch (sm_90): a kernel launched with the
 * programmatic-serialization attribute may start while the previous kernel on the
 * stream still runs; it must call pdl_wait() before touching anything that kernel
 * writes (pdl_wait returns once it has completed and its writes are visible). A
 * kernel calls pdl_trigger() to let such a successor start early. Both are no-ops for
 * kernels launched (or followed) without the attribute.
 * Two exceptions. First, a model's weights may be read before pdl_wait() (the GEMV's
 * first batches, the gate|up GEMM's weight boxes, the bf16 RMSNorm's weight), because
 * no kernel of a step writes a weight: loads and optimizer steps finish before a step
 * that reads them begins (a captured step is a graph launched after them). The same
 * invariant lets a kernel trigger before its own wait (the bf16 RMSNorm): its successor
 * may then run beside kernels further back, and reads nothing before its own wait but
 * what these two exceptions allow. Second, no kernel of a step writes its positions or block table (inputs copied
 * before the step), so the GEMV's front epilogue reads its tokens' positions and table
 * entries before its wait (gemv_body.cuh), and the tensor-core decode attention
 * (attention_rows.cu) those and, at one token a row, the cache's older keys: the
 * attention triggers only after its own wait, so when one starts the previous attention
 * on the stream has passed its wait, every kernel before it has finished, and with them
 * every store into this layer's cache but the newest key's, which this layer's own
 * front writes and which is read after the wait. */
__device__ __forceinline__ void pdl_wait(void) { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger(void) { asm volatile("griddepcontrol.launch_dependents;" :::); }
/* SMs of the current device (cached per device; 132, an H200's, if the query fails). */
static inline int lm__cuda_sm_count(void) {
    static int cached[LM__CUDA_MAX_DEVICES];
    int dev = 0;
    cudaGetDevice(&dev);
    if (dev < 0 || dev >= LM__CUDA_MAX_DEVICES) return 132;
    if (!cached[dev]) {
        int n = 0;
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
        cached[dev] = n > 0 ? n : 132;
    }
    return cached[dev];
}

/* 1 when kernels written for sm_90a (wgmma) may be launched: the build carries sm_90a
 * machine code (LOOM_CUDA_SM90A, set by CMake from the architectures) and the current
 * device is compute capability 9.0, where that code is the one that runs (cached per
 * device). */
static inline int lm__cuda_sm90a(void) {
#ifdef LOOM_CUDA_SM90A
    static int cached[LM__CUDA_MAX_DEVICES]; /* 0 unknown, 1 yes, 2 no */
    int dev = 0;
    cudaGetDevice(&dev);
    if (dev < 0 || dev >= LM__CUDA_MAX_DEVICES) return 0;
    if (!cached[dev]) {
        int major = 0, minor = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
        cached[dev] = major == 9 && minor == 0 ? 1 : 2;
    }
    return cached[dev] == 1;
#else
    return 0;
#endif
}

/* Shared memory one block may opt in to on the current device (cached per device;
 * 48 KiB, the default limit, if the query fails). */
static inline int lm__cuda_smem_optin(void) {
    static int cached[LM__CUDA_MAX_DEVICES];
    int dev = 0;
    cudaGetDevice(&dev);
    if (dev < 0 || dev >= LM__CUDA_MAX_DEVICES) return 48 * 1024;
    if (!cached[dev]) {
        int n = 0;
        cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        cached[dev] = n > 0 ? n : 48 * 1024;
    }
    return cached[dev];
}

/* Launch facts of one kernel, cached per device so the decode step's launches do not
 * repeat host queries of several microseconds each: the dynamic shared memory limit it
 * was raised to, and its resident blocks per SM for a few (threads, shared memory)
 * pairs (direct-mapped). Concurrent first launches only repeat a query. */
struct lm__cuda_kernel_facts {
    size_t raised[LM__CUDA_MAX_DEVICES];
    unsigned long long occ[LM__CUDA_MAX_DEVICES][4]; /* (smem << 12 | threads) << 8 | blocks; 0: empty */
};

/* Blocks of kernel resident per SM with threads threads and smem bytes of dynamic
 * shared memory, after raising the kernel's limit when smem is past the default 48 KiB. */
static inline cudaError_t lm__cuda_blocks_per_sm(lm__cuda_kernel_facts *f, const void *kernel, int threads,
                                                 size_t smem, int *per_sm) {
    int dev = 0;
    cudaGetDevice(&dev);
    const int cached = dev >= 0 && dev < LM__CUDA_MAX_DEVICES && smem < ((size_t)1 << 30) && threads < 4096;
    cudaError_t e = cudaSuccess;
    if (smem > 48 * 1024 && !(cached && __atomic_load_n(&f->raised[dev], __ATOMIC_RELAXED) >= smem)) {
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        if (cached) __atomic_store_n(&f->raised[dev], smem, __ATOMIC_RELAXED);
    }
    const unsigned long long key = (unsigned long long)smem << 12 | (unsigned)threads;
    unsigned long long *slot = cached ? &f->occ[dev][(smem >> 4 ^ (size_t)threads) & 3] : NULL;
    unsigned long long hit = slot ? __atomic_load_n(slot, __ATOMIC_RELAXED) : 0;
    if (hit && hit >> 8 == key) {
        *per_sm = (int)(hit & 0xff);
        return cudaSuccess;
    }
    int n = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem);
    if (e != cudaSuccess) return e;
    *per_sm = n;
    if (slot && n > 0 && n < 256) __atomic_store_n(slot, key << 8 | (unsigned)n, __ATOMIC_RELAXED);
    return cudaSuccess;
}

/* pdl_wait as the wait() argument of a kernel body written as a function
 * (gemv_body.cuh, attention_rows_body.cuh). */
struct pdl_wait_fn {
    __device__ __forceinline__ void operator()() const { pdl_wait(); }
};
/* ... and nothing, for a caller that has waited already. */
struct no_wait_fn {
    __device__ __forceinline__ void operator()() const {}
};

/* Launches kernel with programmatic dependent launch allowed: it may start while the
 * kernel before it on the stream finishes, so it calls pdl_wait() before it reads or
 * writes anything that kernel (or one before it) touches. cluster > 1 groups that many
 * consecutive blocks of grid.x into a thread-block cluster (grid.x a multiple of it). */
template <typename... KArgs, typename... Args>
static inline cudaError_t lm__cuda_launch_pdl_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                                      cudaStream_t s, unsigned cluster, Args... args) {
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = cluster, attr[1].val.clusterDim.y = 1, attr[1].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {grid, block, smem, s, attr, cluster > 1 ? 2u : 1u};
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}
template <typename... KArgs, typename... Args>
static inline cudaError_t lm__cuda_launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                              cudaStream_t s, Args... args) {
    return lm__cuda_launch_pdl_cluster(kernel, grid, block, smem, s, 1u, args...);
}

/* Grid for a grid-stride loop over n items with `threads` per block. */
static inline unsigned lm__cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535 * 8) b = 65535 * 8;
    return (unsigned)b;
}

/* After a launch: the launch error (bad configuration, missing kernel image) as a status. */
static inline lm_status lm__cuda_launched(const char *kernel) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return LM_OK;
    return lm__cuda_check((int)e, kernel);
}

/* The sum of v over the block in double, in a fixed order (warp shuffles, then the
 * warps' partials): scratch holds 32 doubles; every thread gets the sum. */
__device__ __forceinline__ double block_sum_d(double v, double *scratch) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) scratch[w] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* LM_OK for a float dtype, else LM_UNSUPPORTED naming it: launchers check with
 * LM_TRY(lm__cuda_float_only(dt)) before LM__CUDA_FLOAT_SWITCH. */
static inline lm_status lm__cuda_float_only(lm_dtype dt) {
    if (dt == LM_F32 || dt == LM_BF16 || dt == LM_F16) return LM_OK;
    return lm__error(LM_UNSUPPORTED, "cuda: dtype %s is not a float dtype", lm_dtype_name(dt));
}

/* Runs the statements with T the C type of float dtype dt (checked before with
 * lm__cuda_float_only; any other dtype runs nothing). */
#define LM__CUDA_FLOAT_SWITCH(dt, T, ...)                   \
    switch (dt) {                                          \
    case LM_F32: { typedef float T; __VA_ARGS__; } break;  \
    case LM_BF16: { typedef bf16 T; __VA_ARGS__; } break;  \
    case LM_F16: { typedef __half T; __VA_ARGS__; } break; \
    default: break;                                        \
    }

#endif
