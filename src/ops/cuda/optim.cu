/* ops/cuda/optim.cu — the AdamW step and the sum of squares on CUDA.
 *
 * AdamW, in f32, per element in the reference's order (the grad scaled first):
 *   p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
 *   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * with the m and v just computed (what the next step reads); every operand of an
 * element is read before any is written. Per-step constants are formed in double on
 * the host and rounded once to f32; sqrt and division are IEEE (no fast math), so an
 * element differs from the double reference by a few f32 roundings (test_cuda_optim
 * derives its gate from that). One multi-tensor launch covers up to MT_MAX contiguous
 * tensors: a table passed as a __grid_constant__ kernel parameter (< 32 KB, sm_70+ with
 * CUDA >= 12.1) numbers the chunks of MT_CHUNK elements of its tensors in order; a
 * persistent grid (2 blocks per SM) strides over the chunks, each block advancing a
 * cursor to the chunk's tensor. No device allocation or host wait, so it can be
 * captured in a graph. A tensor whose four views are 16-byte aligned (8 for 16-bit
 * grads) moves 4 elements per load; others take the scalar loop of the same kernel.
 * Non-contiguous views (any strides, as before) get one grid-stride launch each with
 * the same f32 element function. The tensors of one list must not overlap each other
 * (one launch updates them concurrently). O(total elements), ~26 bytes per element
 * with bf16 grads.
 * Sum of squares: each tensor is reduced by a fixed grid of SS_BLOCKS blocks into
 * per-block double partials (grid-stride order, fixed tree), then one block adds all
 * partials in a fixed order: the same bits on every run. A contiguous 16-byte aligned
 * tensor is read 16 bytes a load, four loads in flight per thread. O(total elements).
 */
#include "ops/cuda/rows_vec.cuh"

#define SS_BLOCKS 256
#define SS_THREADS 256

#define MT_THREADS 256
#define MT_UNROLL 4                                 /* float4 vectors per thread per chunk */
#define MT_CHUNK (MT_THREADS * MT_UNROLL * 4)       /* 4096 elements per block */
#define MT_MAX 512                                  /* tensors per launch */

/* Per-step constants, rounded once from the host's double values. */
struct adamw_f32 {
    float beta1, one_minus_beta1, beta2, one_minus_beta2;
    float step_size; /* lr / (1 - beta1^step) */
    float bc2_sqrt;  /* sqrt(1 - beta2^step) */
    float eps, grad_scale;
};

/* One element; p, m, v updated in place from their values on entry. */
__device__ __forceinline__ void adamw_elem(float &p, float g, float &m, float &v, float decay, const adamw_f32 &a) {
    g *= a.grad_scale;
    float pd = p * decay;
    m = a.beta1 * m + a.one_minus_beta1 * g;
    v = a.beta2 * v + a.one_minus_beta2 * (g * g);
    p = pd - a.step_size * m / (sqrtf(v) / a.bc2_sqrt + a.eps);
}

struct mt_entry {
    float *p, *m, *v; /* [n] each, contiguous */
    const void *g;    /* [n], dtype gdt */
    int64_t n;
    float decay;      /* 1 - lr * weight_decay */
    int gdt_vec;      /* grad dtype | MT_VEC when all four are aligned for 4-element loads */
};
#define MT_VEC 0x100

struct mt_table {
    int count;
    int first_block[MT_MAX + 1]; /* block of tensor i's chunk 0; [count] = grid size; increasing */
    mt_entry e[MT_MAX];
};
static_assert(sizeof(mt_table) + sizeof(adamw_f32) <= 32000, "AdamW table exceeds the kernel-parameter limit");

__device__ __forceinline__ float4 ld4(const float *g) { return *(const float4 *)g; }
__device__ __forceinline__ float4 ld4(const bf16 *g) {
    uint2 u = *(const uint2 *)g;
    float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 ld4(const __half *g) {
    uint2 u = *(const uint2 *)g;
    float2 a = __half22float2(*(const __half2 *)&u.x), b = __half22float2(*(const __half2 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}

/* Elements [base, base + len) of tensor e: all loads of a thread issued before its
 * arithmetic (MT_UNROLL independent vectors in flight), coalesced across the block. */
template <typename G>
__device__ __forceinline__ void adamw_chunk(const mt_entry &e, int64_t base, int len, float decay, const adamw_f32 &a) {
    float *p = e.p + base, *m = e.m + base, *v = e.v + base;
    const G *g = (const G *)e.g + base;
    if (e.gdt_vec & MT_VEC) {
        int nv = len >> 2;
        float4 pv[MT_UNROLL], gv[MT_UNROLL], mv[MT_UNROLL], vv[MT_UNROLL];
#pragma unroll
        for (int k = 0; k < MT_UNROLL; k++) {
            int j = threadIdx.x + k * MT_THREADS;
            if (j < nv) {
                pv[k] = ((const float4 *)p)[j];
                mv[k] = ((const float4 *)m)[j];
                vv[k] = ((const float4 *)v)[j];
                gv[k] = ld4(g + 4 * (int64_t)j);
            }
        }
#pragma unroll
        for (int k = 0; k < MT_UNROLL; k++) {
            int j = threadIdx.x + k * MT_THREADS;
            if (j < nv) {
                adamw_elem(pv[k].x, gv[k].x, mv[k].x, vv[k].x, decay, a);
                adamw_elem(pv[k].y, gv[k].y, mv[k].y, vv[k].y, decay, a);
                adamw_elem(pv[k].z, gv[k].z, mv[k].z, vv[k].z, decay, a);
                adamw_elem(pv[k].w, gv[k].w, mv[k].w, vv[k].w, decay, a);
                ((float4 *)p)[j] = pv[k];
                ((float4 *)m)[j] = mv[k];
                ((float4 *)v)[j] = vv[k];
            }
        }
        int j = (nv << 2) + threadIdx.x; /* the tensor's last 0-3 elements */
        if (j < len) {
            float pp = p[j], mm = m[j], vq = v[j];
            adamw_elem(pp, ld(g + j), mm, vq, decay, a);
            p[j] = pp, m[j] = mm, v[j] = vq;
        }
        return;
    }
    for (int j0 = 0; j0 < len; j0 += MT_THREADS * MT_UNROLL) {
        float pv[MT_UNROLL], gv[MT_UNROLL], mv[MT_UNROLL], vv[MT_UNROLL];
#pragma unroll
        for (int k = 0; k < MT_UNROLL; k++) {
            int j = j0 + threadIdx.x + k * MT_THREADS;
            if (j < len) pv[k] = p[j], mv[k] = m[j], vv[k] = v[j], gv[k] = ld(g + j);
        }
#pragma unroll
        for (int k = 0; k < MT_UNROLL; k++) {
            int j = j0 + threadIdx.x + k * MT_THREADS;
            if (j < len) {
                adamw_elem(pv[k], gv[k], mv[k], vv[k], decay, a);
                p[j] = pv[k], m[j] = mv[k], v[j] = vv[k];
            }
        }
    }
}

/* A persistent grid: block b takes chunks b, b + gridDim.x, ... of the table's chunk
 * space in increasing order, so the tensor of the next chunk is found by moving a
 * cursor forward (amortized O(1) per chunk, no search per block). */
/* The step's values read on the device (dyn: {lr, step_size, bc2_sqrt, grad_scale}, the
 * host's roundings of them), so a captured update replays with each step's values. */
__device__ __forceinline__ void adamw_dyn(adamw_f32 &a, const double *dyn) {
    a.step_size = (float)dyn[1];
    a.bc2_sqrt = (float)dyn[2];
    a.grad_scale = (float)dyn[3];
}

/* 1 - lr * wd in double, rounded once, as the host computes it (no contraction). */
__device__ __forceinline__ float adamw_decay(const double *dyn, float wd) {
    return (float)__dsub_rn(1.0, __dmul_rn(dyn[0], (double)wd));
}

static __global__ void __launch_bounds__(MT_THREADS) adamw_multi_kernel(const __grid_constant__ mt_table t,
                                                                        const adamw_f32 a0, const double *dyn) {
    adamw_f32 a = a0;
    if (dyn) adamw_dyn(a, dyn);
    const int total = t.first_block[t.count];
    int ti = 0;
    for (int c = (int)blockIdx.x; c < total; c += (int)gridDim.x) {
        while (t.first_block[ti + 1] <= c) ti++;
        const mt_entry &e = t.e[ti];
        int64_t base = (int64_t)(c - t.first_block[ti]) * MT_CHUNK;
        int len = (int)(e.n - base < MT_CHUNK ? e.n - base : MT_CHUNK);
        const float decay = dyn ? adamw_decay(dyn, e.decay) : e.decay; /* dyn: e.decay holds wd */
        switch (e.gdt_vec & 0xff) {
        case LM_F32: adamw_chunk<float>(e, base, len, decay, a); break;
        case LM_BF16: adamw_chunk<bf16>(e, base, len, decay, a); break;
        default: adamw_chunk<__half>(e, base, len, decay, a); break;
        }
    }
}

/* Blocks of the persistent grid: MT_BLOCKS_PER_SM per SM (92 registers x 256 threads
 * leave room for 2), cached per device. */
#define MT_BLOCKS_PER_SM 2
static int mt_grid(void) {
    static int cached[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132 * MT_BLOCKS_PER_SM;
    if (cached[dev] == 0) {
        int n = 0;
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
        cached[dev] = n * MT_BLOCKS_PER_SM;
    }
    return cached[dev];
}

/* Any strides: one thread per element, grid-stride. */
template <typename G>
__global__ void adamw_strided_kernel(float *p, lm__cuda_nd np, const G *g, lm__cuda_nd ng, float *m, lm__cuda_nd nm,
                                     float *v, lm__cuda_nd nv, int64_t n, float decay, adamw_f32 a, const double *dyn) {
    if (dyn) adamw_dyn(a, dyn), decay = adamw_decay(dyn, decay); /* dyn: decay holds wd */
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t op = nd_offset(np, i), om = nd_offset(nm, i), ov = nd_offset(nv, i);
        float pp = p[op], mm = m[om], vq = v[ov];
        adamw_elem(pp, ld(g + nd_offset(ng, i)), mm, vq, decay, a);
        p[op] = pp, m[om] = mm, v[ov] = vq;
    }
}

static int aligned(const void *x, uintptr_t bytes) { return ((uintptr_t)x & (bytes - 1)) == 0; }

static lm_status adamw_flush(mt_table *t, const adamw_f32 &a, const double *dyn, cudaStream_t s) {
    if (t->count == 0) return LM_OK;
    int chunks = t->first_block[t->count], grid = mt_grid();
    adamw_multi_kernel<<<(unsigned)(chunks < grid ? chunks : grid), MT_THREADS, 0, s>>>(*t, a, dyn);
    t->count = 0;
    t->first_block[0] = 0;
    return lm__cuda_launched("adamw multi-tensor kernel");
}

lm_status lm__cuda_adamw_update(int n, const lm_tensor_view *params, const lm_tensor_view *grads,
                               const lm_tensor_view *m, const lm_tensor_view *v, const float *weight_decay,
                               const lm_adamw_hparams *hp, const double *dyn, cudaStream_t s) {
    adamw_f32 a;
    a.beta1 = (float)hp->beta1;
    a.one_minus_beta1 = (float)(1.0 - hp->beta1);
    a.beta2 = (float)hp->beta2;
    a.one_minus_beta2 = (float)(1.0 - hp->beta2);
    a.step_size = (float)(hp->lr / (1.0 - pow(hp->beta1, (double)hp->step)));
    a.bc2_sqrt = (float)sqrt(1.0 - pow(hp->beta2, (double)hp->step));
    a.eps = (float)hp->eps;
    a.grad_scale = (float)hp->grad_scale;
    for (int i = 0; i < n; i++) { /* nothing is queued unless every tensor can be */
        LM_TRY(lm__cuda_float_only(grads[i].dtype));
        if ((lm_tensor_view_numel(&params[i]) + MT_CHUNK - 1) / MT_CHUNK > INT32_MAX)
            return lm__error(LM_UNSUPPORTED, "adamw_update: tensor %d has %lld elements, too many for one launch", i,
                             (long long)lm_tensor_view_numel(&params[i]));
    }
    static thread_local mt_table t; /* ~26 KB: kept off the stack; copied into the launch */
    t.count = 0;
    t.first_block[0] = 0;
    for (int i = 0; i < n; i++) {
        int64_t count = lm_tensor_view_numel(&params[i]);
        if (count == 0) continue;
        float decay = dyn ? weight_decay[i] : (float)(1.0 - hp->lr * (double)weight_decay[i]);
        if (!lm_tensor_view_is_contiguous(&params[i]) || !lm_tensor_view_is_contiguous(&grads[i]) ||
            !lm_tensor_view_is_contiguous(&m[i]) || !lm_tensor_view_is_contiguous(&v[i])) {
            lm__cuda_nd np = flat_nd(&params[i]), ng = flat_nd(&grads[i]), nm = flat_nd(&m[i]), nv = flat_nd(&v[i]);
            LM__CUDA_FLOAT_SWITCH(grads[i].dtype, G,
                                 adamw_strided_kernel<G><<<lm__cuda_blocks(count, 256), 256, 0, s>>>(
                                     (float *)params[i].data, np, (const G *)grads[i].data, ng, (float *)m[i].data,
                                     nm, (float *)v[i].data, nv, count, decay, a, dyn));
            LM_TRY(lm__cuda_launched("adamw strided kernel"));
            continue;
        }
        int64_t blocks = (count + MT_CHUNK - 1) / MT_CHUNK;
        if (t.count == MT_MAX || (int64_t)t.first_block[t.count] + blocks > INT32_MAX) LM_TRY(adamw_flush(&t, a, dyn, s));
        mt_entry &e = t.e[t.count];
        e.p = (float *)params[i].data, e.m = (float *)m[i].data, e.v = (float *)v[i].data;
        e.g = grads[i].data;
        e.n = count;
        e.decay = decay;
        int gvec = grads[i].dtype == LM_F32 ? 16 : 8;
        int vec = aligned(e.p, 16) && aligned(e.m, 16) && aligned(e.v, 16) && aligned(e.g, (uintptr_t)gvec);
        e.gdt_vec = (int)grads[i].dtype | (vec ? MT_VEC : 0);
        t.first_block[t.count + 1] = t.first_block[t.count] + (int)blocks;
        t.count++;
    }
    return adamw_flush(&t, a, dyn, s);
}

/* The clipping coefficient of a step from its gradients' sum of squares, as the host
 * computes it (torch.nn.utils.clip_grad_norm_: min(1, clip / (norm + 1e-6)), 1 when the
 * norm is not finite or clip <= 0), correctly rounded double operations. */
static __global__ void clip_scale_kernel(const float *sumsq, double clip, double *out) {
    double norm = __dsqrt_rn((double)*sumsq);
    *out = clip > 0 && isfinite(norm) ? fmin(1.0, __ddiv_rn(clip, __dadd_rn(norm, 1e-6))) : 1.0;
}

lm_status lm__cuda_clip_scale(const float *sumsq, double clip, double *out, cudaStream_t s) {
    clip_scale_kernel<<<1, 1, 0, s>>>(sumsq, clip, out);
    return lm__cuda_launched("clip scale kernel");
}

template <typename T>
__global__ void sum_squares_kernel(const T *x, lm__cuda_nd nx, int64_t n, double *partial) {
    __shared__ double red[32];
    double acc = 0.0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        double a = ld(x + nd_offset(nx, i));
        acc += a * a;
    }
    acc = block_sum_d(acc, red);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

/* A contiguous 16-byte aligned tensor: four 16-byte vectors in flight per thread step,
 * then the n % VEC tail elements; the same per-block partial as sum_squares_kernel. */
template <typename T>
__global__ void sum_squares_vec_kernel(const T *x, int64_t n, double *partial) {
    constexpr int VEC = 16 / sizeof(T);
    __shared__ double red[32];
    const uint4 *xv = (const uint4 *)x;
    const int64_t nv = n / VEC, stride = (int64_t)gridDim.x * blockDim.x;
    double acc = 0.0;
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < nv; i += 4 * stride) {
        uint4 u[4];
#pragma unroll
        for (int k = 0; k < 4; k++) u[k] = xv[i + k * stride];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float f[VEC];
            unpack16(u[k], f, x);
#pragma unroll
            for (int e = 0; e < VEC; e++) acc += (double)f[e] * (double)f[e];
        }
    }
    for (; i < nv; i += stride) {
        float f[VEC];
        unpack16(xv[i], f, x);
#pragma unroll
        for (int e = 0; e < VEC; e++) acc += (double)f[e] * (double)f[e];
    }
    for (int64_t j = nv * VEC + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n; j += stride) {
        double a = ld(x + j);
        acc += a * a;
    }
    acc = block_sum_d(acc, red);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

/* One block of SS_BLOCKS threads: thread t adds slot t of every tensor in list order,
 * then the fixed block tree adds the threads. */
static __global__ void sum_partials_kernel(const double *partial, int n, float *out) {
    __shared__ double red[32];
    double acc = 0.0;
    for (int i = 0; i < n; i++) acc += partial[(int64_t)i * SS_BLOCKS + threadIdx.x];
    acc = block_sum_d(acc, red);
    if (threadIdx.x == 0) *out = (float)acc;
}

lm_status lm__cuda_sum_squares(int n, const lm_tensor_view *xs, const lm_tensor_view *out, cudaStream_t s) {
    double *partial = NULL; /* [n, SS_BLOCKS], zero for empty tensors */
    size_t bytes = sizeof(double) * (size_t)SS_BLOCKS * (size_t)(n > 0 ? n : 1);
    LM_TRY(lm__cuda_check(cudaMallocAsync((void **)&partial, bytes, s), "cudaMallocAsync (sum_squares)"));
    lm_status st = lm__cuda_check(cudaMemsetAsync(partial, 0, bytes, s), "cudaMemsetAsync (sum_squares)");
    for (int i = 0; st == LM_OK && i < n; i++) {
        int64_t count = lm_tensor_view_numel(&xs[i]);
        if (count == 0) continue;
        lm__cuda_nd nx = flat_nd(&xs[i]);
        double *slot = partial + (size_t)i * SS_BLOCKS;
        if (lm_tensor_view_is_contiguous(&xs[i]) && aligned(xs[i].data, 16)) {
            switch (xs[i].dtype) {
            case LM_F32: sum_squares_vec_kernel<float><<<SS_BLOCKS, SS_THREADS, 0, s>>>((const float *)xs[i].data, count, slot); break;
            case LM_BF16: sum_squares_vec_kernel<bf16><<<SS_BLOCKS, SS_THREADS, 0, s>>>((const bf16 *)xs[i].data, count, slot); break;
            default: sum_squares_vec_kernel<__half><<<SS_BLOCKS, SS_THREADS, 0, s>>>((const __half *)xs[i].data, count, slot); break;
            }
            st = lm__cuda_launched("sum_squares kernel (vec)");
            continue;
        }
        switch (xs[i].dtype) {
        case LM_F32: sum_squares_kernel<float><<<SS_BLOCKS, SS_THREADS, 0, s>>>((const float *)xs[i].data, nx, count, slot); break;
        case LM_BF16: sum_squares_kernel<bf16><<<SS_BLOCKS, SS_THREADS, 0, s>>>((const bf16 *)xs[i].data, nx, count, slot); break;
        default: sum_squares_kernel<__half><<<SS_BLOCKS, SS_THREADS, 0, s>>>((const __half *)xs[i].data, nx, count, slot); break;
        }
        st = lm__cuda_launched("sum_squares kernel");
    }
    if (st == LM_OK) {
        sum_partials_kernel<<<1, SS_BLOCKS, 0, s>>>(partial, n > 0 ? n : 1, (float *)out->data);
        st = lm__cuda_launched("sum_squares total kernel");
    }
    cudaFreeAsync(partial, s);
    return st;
}
