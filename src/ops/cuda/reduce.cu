/* ops/cuda/reduce.cu — sum and max over one dim, and concat, on CUDA.
 *
 * Reductions: one thread per output element scans its slice of x in order, summing
 * in double (rounded once, as the reference) or taking the max with NaN sticking once
 * seen (like torch.amax). O(numel(x)) work, no workspace. A long sum over few outputs
 * (a bias gradient: 8192 rows into 896 columns would keep 4 SMs busy) is split:
 * pass 1 sums chunks of SUM_CHUNK elements per output in double into a workspace
 * [chunks, count], pass 2 adds each output's chunks (32 segments of chunks in order,
 * then the segments in order) and rounds once. A row-major [n, count] matrix summed
 * over its rows (bias gradients) has pass 1 read 16-byte vectors of columns in blocks
 * of (column vectors x row lanes) that add their lanes in order (col_blocks_kernel),
 * ~1024 blocks whatever the width. Both are run-independent.
 * concat: one launch per input copying it into its slice of out as raw elements of
 * the dtype's size, so it is exact for every dtype. O(numel(out)).
 */
#include "ops/cuda/rows_vec.cuh"

/* x without dim: offsets of the starts of the reduced slices, indexed like out. */
static lm__cuda_nd drop_dim(const lm_tensor_view *x, int dim) {
    lm__cuda_nd r = lm__cuda_nd_of(x);
    for (int i = dim; i + 1 < x->ndim; i++) {
        r.shape[i] = x->shape[i + 1];
        r.stride[i] = x->stride[i + 1];
    }
    r.ndim = x->ndim - 1;
    return r;
}

template <typename T>
__global__ void reduce_kernel(int is_max, const T *x, lm__cuda_nd rest, int64_t n, int64_t step, T *out, lm__cuda_nd no,
                              int64_t count) {
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < count; o += (int64_t)gridDim.x * blockDim.x) {
        const T *base = x + nd_offset(rest, o);
        double acc = is_max ? (double)ld(base) : 0.0;
        for (int64_t i = is_max ? 1 : 0; i < n; i++) {
            double v = ld(base + i * step);
            if (!is_max) acc += v;
            else if (!isnan(acc) && (isnan(v) || v > acc)) acc = v;
        }
        st(out + nd_offset(no, o), (float)acc);
    }
}

#define SUM_CHUNK 128

template <typename T>
__global__ void sum_chunks_kernel(const T *x, lm__cuda_nd rest, int64_t n, int64_t step, int64_t count, int64_t chunks,
                                  double *part) {
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < count * chunks;
         t += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = t % count, c = t / count; /* neighbouring threads: neighbouring outputs */
        const T *base = x + nd_offset(rest, o);
        double acc = 0.0;
        for (int64_t i = c * SUM_CHUNK; i < n && i < (c + 1) * SUM_CHUNK; i++) acc += ld(base + i * step);
        part[c * count + o] = acc;
    }
}

/* out[o] = sum over c < chunks of part[c, o] (seg_col_sum's order), rounded once. */
template <typename T>
__global__ void __launch_bounds__(SEG_COLS *SEG_SEGS)
    sum_finish_kernel(const double *part, int64_t count, int64_t chunks, T *out, lm__cuda_nd no) {
    __shared__ double seg[SEG_SEGS][SEG_COLS];
    const int64_t o = (int64_t)blockIdx.x * SEG_COLS + threadIdx.x % SEG_COLS;
    double acc;
    if (seg_col_sum(part, chunks, count, o, seg, &acc)) st(out + nd_offset(no, o), (float)acc);
}

/* Column sums of a row-major [n, count] view (count a multiple of the 16-byte vector,
 * rows 16-byte aligned). Block (column group gx, row block gy) of COL_THREADS threads:
 * cv = min(32, vectors) column vectors x lanes = COL_THREADS / cv row lanes; lane l sums
 * rows gy * rb + l, + lanes, ... (< (gy + 1) * rb) of its vector in order, in double;
 * the lanes' sums are then added in lane order, giving part[gy, columns]. */
#define COL_THREADS 256
template <typename T>
__global__ void __launch_bounds__(COL_THREADS)
    col_blocks_kernel(const T *x, int64_t n, int64_t count, int cv, int64_t rb, double *part) {
    constexpr int VEC = 16 / sizeof(T);
    __shared__ double sh[COL_THREADS][VEC + 1]; /* + 1: lanes of one vector hit distinct banks */
    const int64_t nvec = count / VEC;
    const int lanes = COL_THREADS / cv, c = threadIdx.x % cv, l = threadIdx.x / cv;
    const int64_t v = (int64_t)blockIdx.x * cv + c, r0 = (int64_t)blockIdx.y * rb;
    const int64_t r1 = r0 + rb < n ? r0 + rb : n;
    double acc[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) acc[e] = 0.0;
    if (l < lanes && v < nvec)
        for (int64_t r = r0 + l; r < r1; r += lanes) {
            float f[VEC];
            unpack16(*(const uint4 *)(x + r * count + v * VEC), f, x);
#pragma unroll
            for (int e = 0; e < VEC; e++) acc[e] += f[e];
        }
#pragma unroll
    for (int e = 0; e < VEC; e++) sh[threadIdx.x][e] = acc[e];
    __syncthreads();
    if (l == 0 && v < nvec) {
        for (int k = 1; k < lanes; k++)
#pragma unroll
            for (int e = 0; e < VEC; e++) acc[e] += sh[k * cv + c][e];
        double *q = part + (int64_t)blockIdx.y * count + v * VEC;
#pragma unroll
        for (int e = 0; e < VEC; e++) q[e] = acc[e];
    }
}

/* x reduced over dim is a row-major [n, count] matrix summed over its rows, with rows on
 * 16-byte boundaries and count a multiple of the vector: col_blocks_kernel applies. */
static int col_sum_ok(const lm_tensor_view *x, int dim, int64_t count) {
    if (!lm_tensor_view_is_contiguous(x) || ((uintptr_t)x->data % 16) != 0) return 0;
    for (int i = 0; i < dim; i++)
        if (x->shape[i] != 1) return 0;
    int64_t vec = 16 / (int64_t)lm_dtype_size(x->dtype);
    return count % vec == 0;
}

static lm_status reduce(int is_max, const lm_tensor_view *x, int dim, const lm_tensor_view *out, cudaStream_t s) {
    int64_t count = lm_tensor_view_numel(out), n = x->shape[dim];
    if (count == 0) return LM_OK;
    if (!is_max && n >= 4 * SUM_CHUNK && count < 65536) {
        int cols = col_sum_ok(x, dim, count);
        int64_t chunks = (n + SUM_CHUNK - 1) / SUM_CHUNK, rb = 0;
        int cv = 0;
        unsigned groups = 0;
        if (cols) { /* ~1024 blocks: row blocks of a multiple of the lanes, at most 65535 */
            int64_t nvec = count / (16 / (int64_t)lm_dtype_size(x->dtype));
            cv = (int)LM_MIN(nvec, (int64_t)32);
            groups = (unsigned)((nvec + cv - 1) / cv);
            int64_t lanes = COL_THREADS / cv, want = LM_MAX((int64_t)1, 1024 / (int64_t)groups);
            rb = (n + want - 1) / want;
            rb = LM_MAX(lanes, (rb + lanes - 1) / lanes * lanes);
            chunks = (n + rb - 1) / rb;
            if (chunks > 65535) rb = (n + 65534) / 65535, chunks = (n + rb - 1) / rb;
        }
        double *part = NULL;
        LM_TRY(lm__cuda_check(cudaMallocAsync((void **)&part, sizeof(double) * (size_t)(chunks * count), s),
                              "cudaMallocAsync (sum)"));
        lm_status st = LM_OK;
        LM_TRY(lm__cuda_float_only(x->dtype));
        LM__CUDA_FLOAT_SWITCH(x->dtype, T, {
            if (cols) {
                col_blocks_kernel<T><<<dim3(groups, (unsigned)chunks), COL_THREADS, 0, s>>>((const T *)x->data, n, count,
                                                                                      cv, rb, part);
                st = lm__cuda_launched("sum kernel (column blocks)");
            } else {
                sum_chunks_kernel<T><<<lm__cuda_blocks(count * chunks, 256), 256, 0, s>>>(
                    (const T *)x->data, drop_dim(x, dim), n, x->stride[dim], count, chunks, part);
                st = lm__cuda_launched("sum kernel (chunks)");
            }
            if (st == LM_OK) {
                sum_finish_kernel<T><<<(unsigned)((count + SEG_COLS - 1) / SEG_COLS), SEG_COLS * SEG_SEGS, 0, s>>>(
                    part, count, chunks, (T *)out->data, lm__cuda_nd_of(out));
                st = lm__cuda_launched("sum kernel (finish)");
            }
        });
        cudaFreeAsync(part, s);
        return st;
    }
    LM_TRY(lm__cuda_float_only(x->dtype));
    LM__CUDA_FLOAT_SWITCH(x->dtype, T,
                         reduce_kernel<T><<<lm__cuda_blocks(count, 256), 256, 0, s>>>(
                             is_max, (const T *)x->data, drop_dim(x, dim), x->shape[dim], x->stride[dim],
                             (T *)out->data, lm__cuda_nd_of(out), count));
    return lm__cuda_launched(is_max ? "max kernel" : "sum kernel");
}

lm_status lm__cuda_sum(const lm_tensor_view *x, int dim, const lm_tensor_view *out, cudaStream_t s) {
    return reduce(0, x, dim, out, s);
}
lm_status lm__cuda_max(const lm_tensor_view *x, int dim, const lm_tensor_view *out, cudaStream_t s) {
    return reduce(1, x, dim, out, s);
}

/* Raw element of E bytes. */
template <int E> struct raw { unsigned char b[E]; };

template <typename R>
__global__ void copy_kernel(const R *src, lm__cuda_nd ns, R *dst, lm__cuda_nd nd, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[nd_offset(nd, i)] = src[nd_offset(ns, i)];
}

template <typename R>
static lm_status copy_into(const lm_tensor_view *src, const lm_tensor_view *dst, cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(src);
    if (n == 0) return LM_OK;
    copy_kernel<R><<<lm__cuda_blocks(n, 256), 256, 0, s>>>((const R *)src->data, lm__cuda_nd_of(src), (R *)dst->data,
                                                          lm__cuda_nd_of(dst), n);
    return lm__cuda_launched("concat copy kernel");
}

lm_status lm__cuda_concat(int n, const lm_tensor_view *const *inputs, int dim, const lm_tensor_view *out,
                         cudaStream_t s) {
    size_t es = lm_dtype_size(out->dtype);
    int64_t start = 0; /* first index along dim of the current input's slice of out */
    for (int k = 0; k < n; k++) {
        lm_tensor_view slice = *out;
        slice.shape[dim] = inputs[k]->shape[dim];
        slice.data = (char *)out->data + start * out->stride[dim] * (int64_t)es;
        start += inputs[k]->shape[dim];
        switch (es) {
        case 1: LM_TRY(copy_into<raw<1>>(inputs[k], &slice, s)); break;
        case 2: LM_TRY(copy_into<uint16_t>(inputs[k], &slice, s)); break;
        case 4: LM_TRY(copy_into<uint32_t>(inputs[k], &slice, s)); break;
        default: LM_TRY(copy_into<uint64_t>(inputs[k], &slice, s)); break;
        }
    }
    return LM_OK;
}
