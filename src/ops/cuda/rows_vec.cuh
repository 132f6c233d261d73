/* ops/cuda/rows_vec.cuh — helpers of the kernels that keep rows of [..., D] views in
 * registers as 16-byte vectors (never installed): unpack16 widens one vector to f32
 * (4 f32 or 8 bf16/f16 values), pack_store rounds them back and stores one vector,
 * rows_flat merges a view's leading dims where they are contiguous with each other
 * (a row-major view becomes one row index with one stride), rows_vec_ok says whether
 * each row of a view starts on a 16-byte boundary with its D elements contiguous.
 * Used by the RMSNorm forward (norm.cu) and backward (norm_backward.cu).
 */
#ifndef LOOM_OPS_CUDA_ROWS_VEC_CUH
#define LOOM_OPS_CUDA_ROWS_VEC_CUH

#include "ops/cuda/backward.cuh"

/* 16 bytes at p (16-byte aligned) widened to f32: 4 (f32) or 8 (bf16/f16) values. */
__device__ __forceinline__ void unpack16(const uint4 &u, float *f, const float *) {
    f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y), f[2] = __uint_as_float(u.z), f[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ float2 pair_to_f2(__nv_bfloat162 h) { return __bfloat1622float2(h); }
__device__ __forceinline__ float2 pair_to_f2(__half2 h) { return __half22float2(h); }
__device__ __forceinline__ void f2_to_pair(float a, float b, __nv_bfloat162 *h) { *h = __floats2bfloat162_rn(a, b); }
__device__ __forceinline__ void f2_to_pair(float a, float b, __half2 *h) { *h = __floats2half2_rn(a, b); }
/* 8 values of a 16-bit float type, as 4 pairs H2. */
template <typename H2> __device__ __forceinline__ void unpack_pairs(const uint4 &u, float *f) {
    const H2 *h = (const H2 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = pair_to_f2(h[i]);
        f[2 * i] = t.x, f[2 * i + 1] = t.y;
    }
}
template <typename H2> __device__ __forceinline__ uint4 pack_pairs(const float *f) {
    uint4 u;
    H2 *h = (H2 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) f2_to_pair(f[2 * i], f[2 * i + 1], &h[i]);
    return u;
}
__device__ __forceinline__ void unpack16(const uint4 &u, float *f, const bf16 *) { unpack_pairs<__nv_bfloat162>(u, f); }
__device__ __forceinline__ void unpack16(const uint4 &u, float *f, const __half *) { unpack_pairs<__half2>(u, f); }
/* 16 / sizeof(O) values rounded to O and packed into one 16-byte vector. */
template <typename O> __device__ __forceinline__ uint4 pack16(const float *f);
template <> __device__ __forceinline__ uint4 pack16<float>(const float *f) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
}
template <> __device__ __forceinline__ uint4 pack16<bf16>(const float *f) { return pack_pairs<__nv_bfloat162>(f); }
template <> __device__ __forceinline__ uint4 pack16<__half>(const float *f) { return pack_pairs<__half2>(f); }
/* n values to p (16-byte aligned), rounded to O: n / (16 / sizeof(O)) vector stores. */
template <typename O> __device__ __forceinline__ void pack_store(O *p, const float *f, int n) {
    constexpr int V = 16 / sizeof(O);
    for (int i = 0; i < n; i += V) *(uint4 *)(p + i) = pack16<O>(f + i);
}

/* Element offset of row r for a row descriptor (see rows_flat). */
__device__ __forceinline__ int64_t row_off(const lm__cuda_nd &d, int64_t r) {
    return d.ndim == 1 ? r * d.stride[0] : nd_offset(d, r);
}

/* The row-index descriptor of v with leading dims merged where they are contiguous
 * with each other: a row-major [..., D] view becomes 1-d (rows, stride). */
static inline lm__cuda_nd rows_flat(const lm_tensor_view *v) {
    lm__cuda_nd d = rows_nd(v);
    d.contig_ndim = -1;
    int n = 0;
    for (int i = 0; i < d.ndim; i++) {
        if (d.shape[i] == 1) continue; /* size-1 dims do not move the offset */
        if (n > 0 && d.stride[n - 1] == d.stride[i] * d.shape[i]) {
            d.shape[n - 1] *= d.shape[i], d.stride[n - 1] = d.stride[i];
        } else {
            d.shape[n] = d.shape[i], d.stride[n] = d.stride[i], n++;
        }
    }
    if (n == 0) d.shape[0] = 1, d.stride[0] = 0, n = 1;
    d.ndim = n;
    return d;
}

/* v's rows start on 16-byte boundaries and each row's D elements are contiguous. */
static inline int rows_vec_ok(const lm_tensor_view *v) {
    size_t es = lm_dtype_size(v->dtype);
    if (!lm__cuda_aligned16(v->data)) return 0;
    if (v->shape[v->ndim - 1] > 1 && v->stride[v->ndim - 1] != 1) return 0;
    for (int i = 0; i < v->ndim - 1; i++)
        if (v->shape[i] > 1 && ((size_t)v->stride[i] * es) % 16 != 0) return 0;
    return 1;
}

/* The team shape for rows of nvec 16-byte vectors: team_warps (a power of two <= 8)
 * warps own a row and each lane holds nv (1, 2 or 4) vectors, the fewest warps with
 * nv <= max_nv. The caller has checked nvec <= 8 * 32 * max_nv. */
static inline void rows_team(int64_t nvec, int max_nv, int *team_warps, int *nv) {
    int tw = 1;
    while ((nvec + 32 * tw - 1) / (32 * tw) > max_nv) tw *= 2;
    int n = (int)((nvec + 32 * tw - 1) / (32 * tw));
    *team_warps = tw;
    *nv = n == 3 ? 4 : n;
}

/* The deterministic column sums of a [rows, count] partial matrix (f32 or f64) that end
 * the two-pass reductions (reduce.cu's sums, norm_backward.cu's weight gradient): a
 * block of SEG_COLS x SEG_SEGS threads (threadIdx.x = segment * SEG_COLS + column)
 * takes SEG_COLS columns; segment g adds rows g, g + SEG_SEGS, ... in order (eight
 * loads in flight), then thread (0, column) adds the segments' sums in order, all in
 * double. Returns 1 in the thread that holds column o's sum in *sum (o < count). */
#define SEG_COLS 32
#define SEG_SEGS 32
template <typename P>
__device__ __forceinline__ int seg_col_sum(const P *part, int64_t rows, int64_t count, int64_t o,
                                           double (*seg)[SEG_COLS], double *sum) {
    const int cx = threadIdx.x % SEG_COLS, g = threadIdx.x / SEG_COLS;
    double acc = 0.0;
    if (o < count) {
        int64_t r = g;
        for (; r + 7 * SEG_SEGS < rows; r += 8 * SEG_SEGS) {
            P q[8];
#pragma unroll
            for (int u = 0; u < 8; u++) q[u] = part[(r + u * SEG_SEGS) * count + o];
#pragma unroll
            for (int u = 0; u < 8; u++) acc += q[u];
        }
        for (; r < rows; r += SEG_SEGS) acc += part[r * count + o];
    }
    seg[g][cx] = acc;
    __syncthreads();
    if (g != 0 || o >= count) return 0;
    for (int k = 1; k < SEG_SEGS; k++) acc += seg[k][cx];
    *sum = acc;
    return 1;
}

#endif
