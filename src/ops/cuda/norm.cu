/* ops/cuda/norm.cu — RMSNorm and fused residual add + RMSNorm on CUDA.
 *
 * One block per row (the index space of the leading dims): pass 1 accumulates the
 * row's sum of squares per thread and reduces it over the block, pass 2 scales. Each
 * thread touches the same elements in both passes, so an output that is the very
 * view of an input is safe (the block reduction's barriers separate all reads of pass
 * 1 from the writes of pass 2). add_rmsnorm stores the sum rounded to the dtype and
 * normalizes the stored value, as the reference does.
 * The _to_bf16 forms (the model step): the residual stream is f32 and stays f32, the normalized output
 * is bf16 for the next GEMM. O(rows * D).
 */
#include "ops/cuda/common.cuh"

/* The leading dims of v (all but the last) as a descriptor of the row index space. */
static lm__cuda_nd rows_of(const lm_tensor_view *v) {
    lm__cuda_nd d = lm__cuda_nd_of(v);
    d.ndim = v->ndim - 1;
    return d;
}

template <typename T>
__global__ void rmsnorm_kernel(const T *x, lm__cuda_nd rx, int64_t sx, const T *w, int64_t sw, T *out, lm__cuda_nd ro,
                               int64_t so, int64_t rows, int64_t D, float eps) {
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + nd_offset(rx, r);
        T *orow = out + nd_offset(ro, r);
        float ss = 0.f;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            float a = ld(xr + i * sx);
            ss += a * a;
        }
        float inv = rsqrtf(block_sum(ss, red) / (float)D + eps);
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) st(orow + i * so, ld(xr + i * sx) * inv * ld(w + i * sw));
        __syncthreads(); /* red is reused by the next row */
    }
}

template <typename T>
__global__ void add_rmsnorm_kernel(const T *x, lm__cuda_nd rx, int64_t sx, const T *res, lm__cuda_nd rr, int64_t sr,
                                   const T *w, int64_t sw, T *sum, lm__cuda_nd rs, int64_t ss_, T *out, lm__cuda_nd ro,
                                   int64_t so, int64_t rows, int64_t D, float eps) {
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + nd_offset(rx, r), *rrow = res + nd_offset(rr, r);
        T *srow = sum + nd_offset(rs, r), *orow = out + nd_offset(ro, r);
        float ss = 0.f;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            float v = round_to<T>(ld(xr + i * sx) + ld(rrow + i * sr));
            st(srow + i * ss_, v);
            ss += v * v;
        }
        float inv = rsqrtf(block_sum(ss, red) / (float)D + eps);
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
            st(orow + i * so, ld(srow + i * ss_) * inv * ld(w + i * sw));
        __syncthreads();
    }
}

static int64_t last_stride(const lm_tensor_view *v) { return v->stride[v->ndim - 1]; }

lm_status lm__cuda_rmsnorm(const lm_tensor_view *x, const lm_tensor_view *weight, float eps,
                          const lm_tensor_view *out, cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(out), D = x->shape[x->ndim - 1];
    if (n == 0) return LM_OK;
    int64_t rows = n / D;
    unsigned g = (unsigned)LM_MIN(rows, 65535 * 8);
    LM_TRY(lm__cuda_float_only(x->dtype));
    LM__CUDA_FLOAT_SWITCH(x->dtype, T,
                         rmsnorm_kernel<T><<<g, 256, 0, s>>>((const T *)x->data, rows_of(x), last_stride(x),
                                                             (const T *)weight->data, weight->stride[0], (T *)out->data,
                                                             rows_of(out), last_stride(out), rows, D, eps));
    return lm__cuda_launched("rmsnorm kernel");
}

lm_status lm__cuda_add_rmsnorm(const lm_tensor_view *x, const lm_tensor_view *residual, const lm_tensor_view *weight,
                              float eps, const lm_tensor_view *sum_out, const lm_tensor_view *out, cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(out), D = x->shape[x->ndim - 1];
    if (n == 0) return LM_OK;
    int64_t rows = n / D;
    unsigned g = (unsigned)LM_MIN(rows, 65535 * 8);
    LM_TRY(lm__cuda_float_only(x->dtype));
    LM__CUDA_FLOAT_SWITCH(x->dtype, T,
                         add_rmsnorm_kernel<T><<<g, 256, 0, s>>>(
                             (const T *)x->data, rows_of(x), last_stride(x), (const T *)residual->data,
                             rows_of(residual), last_stride(residual), (const T *)weight->data, weight->stride[0],
                             (T *)sum_out->data, rows_of(sum_out), last_stride(sum_out), (T *)out->data, rows_of(out),
                             last_stride(out), rows, D, eps));
    return lm__cuda_launched("add_rmsnorm kernel");
}

/* ---- the model step: f32 residual stream in, bf16 normalized rows out ------------------------------ */
static __global__ void rmsnorm_to_bf16_kernel(float *x, int64_t ldx, const float *delta, const float *w, float eps, int64_t D,
                                       bf16 *out) {
    __shared__ float red[32];
    float *xr = x + blockIdx.x * ldx;
    bf16 *orow = out + blockIdx.x * D;
    float ss = 0.f;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
        float v = xr[i];
        if (delta) {
            v += delta[blockIdx.x * D + i];
            xr[i] = v;
        }
        ss += v * v;
    }
    float inv = rsqrtf(block_sum(ss, red) / (float)D + eps);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) orow[i] = __float2bfloat16_rn(xr[i] * inv * w[i]);
}

lm_status lm__cuda_rmsnorm_to_bf16(const float *x, int64_t ldx, const float *w, float eps, int64_t rows, int64_t D,
                                   void *out, cudaStream_t s) {
    if (rows == 0) return LM_OK;
    rmsnorm_to_bf16_kernel<<<(unsigned)rows, 256, 0, s>>>((float *)x, ldx, NULL, w, eps, D, (bf16 *)out);
    return lm__cuda_launched("rmsnorm_to_bf16");
}

lm_status lm__cuda_add_rmsnorm_to_bf16(float *x, const float *delta, const float *w, float eps, int64_t rows, int64_t D,
                                 void *out, cudaStream_t s) {
    if (rows == 0) return LM_OK;
    rmsnorm_to_bf16_kernel<<<(unsigned)rows, 256, 0, s>>>(x, D, delta, w, eps, D, (bf16 *)out);
    return lm__cuda_launched("add_rmsnorm_to_bf16");
}
