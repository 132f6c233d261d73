/* ops/cuda/norm_backward.cu — RMSNorm and fused add + RMSNorm backward on CUDA.
 *
 * With r = 1 / sqrt(mean(x^2) + eps) per row and g = weight * dout:
 *   dx = r g - x r^3 (g . x) / D  (+ dsum for the fused add)
 *   dweight = sum over rows of dout * x * r
 * Pass 1: one block per row reduces sum(x^2) and g . x (f32, fixed block tree), writes
 * dx and keeps r in a [rows] workspace. Pass 2 (dweight): blocks of a 2-d grid own
 * (column tile, chunk of CHUNK rows) and write f32 partials [chunks, D]; pass 3 adds
 * the chunks of each column in order (double) and rounds once. No atomics, so the
 * result is the same on every run. O(rows * D) work, rows + chunks * D floats.
 */
#include "ops/cuda/backward.cuh"

#define CHUNK 64

static int64_t last_stride(const lm_tensor_view *v) { return v->stride[v->ndim - 1]; }

template <typename T>
__global__ void norm_rows_kernel(const T *x, lm__cuda_nd rx, int64_t sx, const T *w, int64_t sw, const T *dy,
                                 lm__cuda_nd rd, int64_t sd, const T *dsum, lm__cuda_nd rs, int64_t ss_, void *dx,
                                 int dx_dt, lm__cuda_nd ro, int64_t so, int64_t rows, int64_t D, float eps,
                                 float *rstd) {
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + nd_offset(rx, r), *dr = dy + nd_offset(rd, r);
        float ss = 0.f, dot = 0.f;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            float a = ld(xr + i * sx);
            ss += a * a;
            dot += ld(w + i * sw) * ld(dr + i * sd) * a;
        }
        ss = block_sum(ss, red);
        dot = block_sum(dot, red);
        float inv = 1.f / sqrtf(ss / (float)D + eps), c = inv * inv * inv * dot / (float)D;
        if (rstd && threadIdx.x == 0) rstd[r] = inv;
        if (dx) {
            int64_t ob = nd_offset(ro, r);
            const T *sr = dsum ? dsum + nd_offset(rs, r) : NULL;
            for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
                float v = inv * ld(w + i * sw) * ld(dr + i * sd) - ld(xr + i * sx) * c;
                if (sr) v += ld(sr + i * ss_);
                st_dt(dx, dx_dt, ob + i * so, v);
            }
        }
        __syncthreads(); /* red is reused by the next row */
    }
}

/* partial[chunk, i] = sum over the chunk's rows of dout * x * r, one thread per column. */
template <typename T>
__global__ void dweight_partial_kernel(const T *x, lm__cuda_nd rx, int64_t sx, const T *dy, lm__cuda_nd rd, int64_t sd,
                                       const float *rstd, int64_t rows, int64_t D, float *partial) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, r0 = (int64_t)blockIdx.y * CHUNK;
    if (i >= D) return;
    float acc = 0.f;
    for (int64_t r = r0; r < rows && r < r0 + CHUNK; r++)
        acc += ld(dy + nd_offset(rd, r) + i * sd) * ld(x + nd_offset(rx, r) + i * sx) * rstd[r];
    partial[(int64_t)blockIdx.y * D + i] = acc;
}

static __global__ void dweight_sum_kernel(const float *partial, int64_t chunks, int64_t D, void *dw, int dw_dt, int64_t sw) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < D; i += (int64_t)gridDim.x * blockDim.x) {
        double acc = 0.0;
        for (int64_t c = 0; c < chunks; c++) acc += partial[c * D + i];
        st_dt(dw, dw_dt, i * sw, (float)acc);
    }
}

static lm_status dweight_zero(const lm_tensor_view *dweight, int64_t D, cudaStream_t s) {
    dweight_sum_kernel<<<lm__cuda_blocks(D, 256), 256, 0, s>>>(NULL, 0, D, dweight->data, dweight->dtype,
                                                               dweight->stride[0]);
    return lm__cuda_launched("rmsnorm_backward dweight kernel");
}

lm_status lm__cuda_rmsnorm_backward(const lm_tensor_view *x, const lm_tensor_view *weight, float eps,
                                   const lm_tensor_view *dout, const lm_tensor_view *dsum, const lm_tensor_view *dx,
                                   const lm_tensor_view *dweight, cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(x), D = x->shape[x->ndim - 1];
    if (D == 0 || (!dx && !dweight)) return LM_OK;
    int64_t rows = n / D, chunks = (rows + CHUNK - 1) / CHUNK;
    if (rows == 0) return dweight ? dweight_zero(dweight, D, s) : LM_OK;
    if (chunks > 65535) return lm__error(LM_UNSUPPORTED, "rmsnorm_backward: %lld rows exceed the CUDA kernel's limit", (long long)rows);
    float *work = NULL; /* rstd [rows], then partial [chunks, D] */
    if (dweight)
        LM_TRY(lm__cuda_check(cudaMallocAsync((void **)&work, sizeof(float) * (size_t)(rows + chunks * D), s),
                              "cudaMallocAsync (rmsnorm_backward)"));
    unsigned g = (unsigned)LM_MIN(rows, 65535 * 8);
    lm__cuda_nd none = {0, {0}, {0}, -1};
    lm_status st = LM_OK;
    LM_TRY(lm__cuda_float_only(x->dtype));
    LM__CUDA_FLOAT_SWITCH(x->dtype, T, {
        norm_rows_kernel<T><<<g, 256, 0, s>>>(
            (const T *)x->data, rows_nd(x), last_stride(x), (const T *)weight->data, weight->stride[0],
            (const T *)dout->data, rows_nd(dout), last_stride(dout), dsum ? (const T *)dsum->data : NULL,
            dsum ? rows_nd(dsum) : none, dsum ? last_stride(dsum) : 0, dx ? dx->data : NULL, dx ? dx->dtype : LM_F32,
            dx ? rows_nd(dx) : none, dx ? last_stride(dx) : 0, rows, D, eps, work);
        st = lm__cuda_launched("rmsnorm_backward row kernel");
        if (st == LM_OK && dweight) {
            dim3 grid((unsigned)((D + 255) / 256), (unsigned)chunks);
            dweight_partial_kernel<T><<<grid, 256, 0, s>>>((const T *)x->data, rows_nd(x), last_stride(x),
                                                           (const T *)dout->data, rows_nd(dout), last_stride(dout),
                                                           work, rows, D, work + rows);
            st = lm__cuda_launched("rmsnorm_backward dweight partial kernel");
        }
    });
    if (st == LM_OK && dweight) {
        dweight_sum_kernel<<<lm__cuda_blocks(D, 256), 256, 0, s>>>(work + rows, chunks, D, dweight->data,
                                                                   dweight->dtype, dweight->stride[0]);
        st = lm__cuda_launched("rmsnorm_backward dweight kernel");
    }
    if (work) cudaFreeAsync(work, s);
    return st;
}
