/* ops/cuda/attention_backward.cu — readable attention backward on CUDA, without atomics
 * and without anything of size Tq x Tk. With s_j = scale q . k_j, p = softmax(s) over the
 * visible keys, dp_j = dO . v_j and rowdot = sum_j p_j dp_j:
 *   ds_j = p_j (dp_j - rowdot);  dq = scale sum_j ds_j k_j
 *   dk_j = scale sum over (h, i) reading it of ds_j q_i;  dv_j = sum of p_j dO_i
 * A window hides keys more than window - 1 before the query's position, as in the
 * forward. Kernel 1, one block per query row (b, h, i): max, sum of exp and rowdot over the
 * keys (threads stride over keys, fixed block trees), then dq from chunks of
 * blockDim keys whose ds are staged in shared memory; the row's (max, sum, rowdot)
 * go to a [B, Hq, Tq, 3] workspace. Kernel 2, one block per key row (b, g, j): the
 * query rows of every head of the group that see key j are taken in chunks of
 * blockDim, their p and ds recomputed from the stored row statistics and staged,
 * then each thread adds them into its own columns of dk and dv in a fixed order.
 * O(B Hq Tq Tk (D + Dv)) per kernel; shared memory (D + Dv + 2 blockDim) floats.
 * bf16 views with head dim 64 or 128 take the tensor-core flash kernels instead
 * (attention_flash.cu).
 */
#include "ops/cuda/backward.cuh"

#define ATT_THREADS 128

struct att_bw_args {
    lm__cuda_nd q, k, v, o; /* q, k, v, dout */
    int64_t B, Hq, Hkv, Tq, Tk, D, Dv, group;
    float scale;
    int causal;
    int64_t window; /* 0: none */
};

/* The keys query row i sees: [*first, *stop). */
__device__ __forceinline__ void key_range(const att_bw_args &a, int64_t i, int64_t *first, int64_t *stop) {
    *stop = a.causal ? i + (a.Tk - a.Tq) + 1 : a.Tk;
    *first = a.window > 0 ? LM_MAX((int64_t)0, *stop - a.window) : 0;
}

__device__ __forceinline__ int64_t off4(const lm__cuda_nd &t, int64_t b, int64_t h, int64_t i) {
    return b * t.stride[0] + h * t.stride[1] + i * t.stride[2];
}

template <typename T>
__device__ __forceinline__ float dot_row(const T *x, int64_t base, int64_t step, const float *y, int64_t n) {
    float acc = 0.f;
    for (int64_t d = 0; d < n; d++) acc += ld(x + base + d * step) * y[d];
    return acc;
}

template <typename T>
__global__ void dq_kernel(const T *q, const T *k, const T *v, const T *dout, att_bw_args a, void *dq, int dq_dt,
                          lm__cuda_nd ndq, float *stats) {
    extern __shared__ float sh[]; /* qs [D], os [Dv], ds [blockDim], acc [D] */
    __shared__ float red[32];
    float *qs = sh, *os = qs + a.D, *dsh = os + a.Dv, *acc = dsh + blockDim.x;
    int64_t rows = a.B * a.Hq * a.Tq;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        int64_t i = row % a.Tq, h = (row / a.Tq) % a.Hq, b = row / (a.Tq * a.Hq), g = h / a.group;
        int64_t j_first, nkeys;
        key_range(a, i, &j_first, &nkeys);
        int64_t q0 = off4(a.q, b, h, i), o0 = off4(a.o, b, h, i);
        for (int64_t d = threadIdx.x; d < a.D; d += blockDim.x) qs[d] = ld(q + q0 + d * a.q.stride[3]), acc[d] = 0.f;
        for (int64_t e = threadIdx.x; e < a.Dv; e += blockDim.x) os[e] = ld(dout + o0 + e * a.o.stride[3]);
        __syncthreads();
        float mx = -INFINITY;
        for (int64_t j = j_first + threadIdx.x; j < nkeys; j += blockDim.x)
            mx = fmaxf(mx, a.scale * dot_row(k, off4(a.k, b, g, j), a.k.stride[3], qs, a.D));
        mx = block_max(mx, red);
        float l = 0.f, pd = 0.f;
        for (int64_t j = j_first + threadIdx.x; j < nkeys; j += blockDim.x) {
            float e = expf(a.scale * dot_row(k, off4(a.k, b, g, j), a.k.stride[3], qs, a.D) - mx);
            l += e;
            pd += e * dot_row(v, off4(a.v, b, g, j), a.v.stride[3], os, a.Dv);
        }
        l = block_sum(l, red);
        pd = block_sum(pd, red);
        if (nkeys <= j_first) l = 1.f;
        float rowdot = pd / l;
        for (int64_t j0 = j_first; j0 < nkeys; j0 += blockDim.x) {
            int64_t j = j0 + threadIdx.x;
            float ds = 0.f;
            if (j < nkeys) {
                float p = expf(a.scale * dot_row(k, off4(a.k, b, g, j), a.k.stride[3], qs, a.D) - mx) / l;
                ds = p * (dot_row(v, off4(a.v, b, g, j), a.v.stride[3], os, a.Dv) - rowdot) * a.scale;
            }
            dsh[threadIdx.x] = ds;
            __syncthreads();
            int64_t n = LM_MIN((int64_t)blockDim.x, nkeys - j0);
            for (int64_t d = threadIdx.x; d < a.D; d += blockDim.x)
                for (int64_t t = 0; t < n; t++) acc[d] += dsh[t] * ld(k + off4(a.k, b, g, j0 + t) + d * a.k.stride[3]);
            __syncthreads();
        }
        if (dq)
            for (int64_t d = threadIdx.x; d < a.D; d += blockDim.x)
                st_dt(dq, dq_dt, off4(ndq, b, h, i) + d * ndq.stride[3], acc[d]);
        if (threadIdx.x == 0) stats[3 * row] = mx, stats[3 * row + 1] = l, stats[3 * row + 2] = rowdot;
        __syncthreads(); /* shared rows are reloaded for the next row */
    }
}

template <typename T>
__global__ void dkv_kernel(const T *q, const T *k, const T *v, const T *dout, att_bw_args a, const float *stats,
                           void *dk, int dk_dt, lm__cuda_nd ndk, void *dv, int dv_dt, lm__cuda_nd ndv) {
    extern __shared__ float sh[]; /* ks [D], vs [Dv], p [blockDim], ds [blockDim] */
    float *ks = sh, *vs = ks + a.D, *psh = vs + a.Dv, *dsh = psh + blockDim.x;
    int64_t rows = a.B * a.Hkv * a.Tk, nq = a.group * a.Tq;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        int64_t j = row % a.Tk, g = (row / a.Tk) % a.Hkv, b = row / (a.Tk * a.Hkv);
        for (int64_t d = threadIdx.x; d < a.D; d += blockDim.x) ks[d] = ld(k + off4(a.k, b, g, j) + d * a.k.stride[3]);
        for (int64_t e = threadIdx.x; e < a.Dv; e += blockDim.x) vs[e] = ld(v + off4(a.v, b, g, j) + e * a.v.stride[3]);
        __syncthreads();
        /* thread-owned columns: dk columns d = tid + c * blockDim, then dv columns */
        float dk_acc[8], dv_acc[8];
        for (int c = 0; c < 8; c++) dk_acc[c] = dv_acc[c] = 0.f;
        for (int64_t u0 = 0; u0 < nq; u0 += blockDim.x) {
            int64_t u = u0 + threadIdx.x;
            float p = 0.f, ds = 0.f;
            if (u < nq) {
                int64_t h = g * a.group + u / a.Tq, i = u % a.Tq;
                int64_t jf, js;
                key_range(a, i, &jf, &js);
                if (j >= jf && j < js) {
                    const float *st = stats + 3 * ((b * a.Hq + h) * a.Tq + i);
                    p = expf(a.scale * dot_row(q, off4(a.q, b, h, i), a.q.stride[3], ks, a.D) - st[0]) / st[1];
                    ds = p * (dot_row(dout, off4(a.o, b, h, i), a.o.stride[3], vs, a.Dv) - st[2]) * a.scale;
                }
            }
            psh[threadIdx.x] = p;
            dsh[threadIdx.x] = ds;
            __syncthreads();
            int64_t n = LM_MIN((int64_t)blockDim.x, nq - u0);
            for (int c = 0; c < 8; c++) {
                int64_t d = threadIdx.x + (int64_t)c * blockDim.x;
                for (int64_t t = 0; t < n; t++) {
                    int64_t h = g * a.group + (u0 + t) / a.Tq, i = (u0 + t) % a.Tq;
                    if (d < a.D && dsh[t] != 0.f) dk_acc[c] += dsh[t] * ld(q + off4(a.q, b, h, i) + d * a.q.stride[3]);
                    if (d < a.Dv && psh[t] != 0.f) dv_acc[c] += psh[t] * ld(dout + off4(a.o, b, h, i) + d * a.o.stride[3]);
                }
            }
            __syncthreads();
        }
        for (int c = 0; c < 8; c++) {
            int64_t d = threadIdx.x + (int64_t)c * blockDim.x;
            if (dk && d < a.D) st_dt(dk, dk_dt, off4(ndk, b, g, j) + d * ndk.stride[3], dk_acc[c]);
            if (dv && d < a.Dv) st_dt(dv, dv_dt, off4(ndv, b, g, j) + d * ndv.stride[3], dv_acc[c]);
        }
        __syncthreads(); /* ks and vs are reloaded for the next row */
    }
}

lm_status lm__cuda_attention_backward(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                      const lm_tensor_view *dout, float scale, int causal, int64_t window,
                                      const lm_tensor_view *dq, const lm_tensor_view *dk, const lm_tensor_view *dv,
                                      cudaStream_t s) {
    if (lm__cuda_flash_attention_supports(q, k, v, causal, dout) && lm__cuda_flash_attention_supports(q, k, v, causal, dq) &&
        lm__cuda_flash_attention_supports(q, k, v, causal, dk) && lm__cuda_flash_attention_supports(q, k, v, causal, dv) &&
        (!dout || dout->dtype == LM_BF16))
        return lm__cuda_flash_attention_backward(q, k, v, dout, scale, causal, window, dq, dk, dv, s);
    att_bw_args a;
    memset(&a, 0, sizeof a);
    a.q = lm__cuda_nd_of(q), a.k = lm__cuda_nd_of(k), a.v = lm__cuda_nd_of(v), a.o = lm__cuda_nd_of(dout);
    a.B = q->shape[0], a.Hq = q->shape[1], a.Tq = q->shape[2], a.D = q->shape[3];
    a.Hkv = k->shape[1], a.Tk = k->shape[2], a.Dv = v->shape[3];
    a.group = a.Hkv ? a.Hq / a.Hkv : 1;
    a.scale = scale, a.causal = causal, a.window = window; /* 0 unless causal (ops/attention_backward.c) */
    if (a.D > 8 * ATT_THREADS || a.Dv > 8 * ATT_THREADS)
        return lm__error(LM_UNSUPPORTED, "attention_backward: the CUDA kernel takes head dims up to %d", 8 * ATT_THREADS);
    int64_t qrows = a.B * a.Hq * a.Tq, krows = a.B * a.Hkv * a.Tk;
    if (qrows == 0 && krows == 0) return LM_OK;
    float *stats = NULL; /* [B, Hq, Tq, 3]: max, sum of exp, rowdot */
    LM_TRY(lm__cuda_check(cudaMallocAsync((void **)&stats, sizeof(float) * (size_t)(3 * qrows + 1), s),
                          "cudaMallocAsync (attention_backward)"));
    lm__cuda_nd none = {0, {0}, {0}, -1};
    size_t sh1 = sizeof(float) * (size_t)(2 * a.D + a.Dv + ATT_THREADS), sh2 = sizeof(float) * (size_t)(a.D + a.Dv + 2 * ATT_THREADS);
    lm_status st = LM_OK;
    LM_TRY(lm__cuda_float_only(q->dtype));
    LM__CUDA_FLOAT_SWITCH(q->dtype, T, {
        if (qrows > 0) {
            dq_kernel<T><<<(unsigned)LM_MIN(qrows, 65535 * 8), ATT_THREADS, sh1, s>>>(
                (const T *)q->data, (const T *)k->data, (const T *)v->data, (const T *)dout->data, a,
                dq ? dq->data : NULL, dq ? dq->dtype : LM_F32, dq ? lm__cuda_nd_of(dq) : none, stats);
            st = lm__cuda_launched("attention_backward dq kernel");
        }
        if (st == LM_OK && (dk || dv) && krows > 0) {
            dkv_kernel<T><<<(unsigned)LM_MIN(krows, 65535 * 8), ATT_THREADS, sh2, s>>>(
                (const T *)q->data, (const T *)k->data, (const T *)v->data, (const T *)dout->data, a, stats,
                dk ? dk->data : NULL, dk ? dk->dtype : LM_F32, dk ? lm__cuda_nd_of(dk) : none, dv ? dv->data : NULL,
                dv ? dv->dtype : LM_F32, dv ? lm__cuda_nd_of(dv) : none);
            st = lm__cuda_launched("attention_backward dk/dv kernel");
        }
    });
    cudaFreeAsync(stats, s);
    return st;
}
