/* ops/cuda/rope_backward.cu — RoPE backward on CUDA. The forward rotates each pair
 * (a, b) to (a c - b s, b c + a s) with c = f cos(angle), s = f sin(angle); the
 * transpose gives
 *   da = dy_a c + dy_b s,   db = -dy_a s + dy_b c.
 * dx: one thread per (b, t, h, pair), angles pos * inv_freq in double as the forward.
 * dbias [H, D] = sum over (b, t) of dx: one thread per (h, pair) walks (b, t) in
 * order, recomputing the rotation and summing in double (no atomics, run-independent).
 * O(B T H D) for each output.
 */
#include "ops/cuda/backward.cuh"

struct rope_bw_args {
    int style;
    const float *inv_freq;
    int64_t inv_stride;
    float attn_factor;
    const void *pos; /* NULL: pos_offset + t */
    int pos_is64, pos_ndim;
    int64_t pos_stride[2];
    int64_t pos_offset;
    int64_t B, T, H, half;
};

/* c and s of pair i at (b, t); ia, ib: the pair's element indices within the head. */
__device__ __forceinline__ void rotation(const rope_bw_args &a, int64_t b, int64_t t, int64_t i, float *c, float *s,
                                         int64_t *ia, int64_t *ib) {
    int64_t pos = a.pos_offset + t;
    if (a.pos)
        pos = a.pos_ndim == 1 ? ld_index_at(a.pos, a.pos_is64, t * a.pos_stride[0])
                              : ld_index_at(a.pos, a.pos_is64, b * a.pos_stride[0] + t * a.pos_stride[1]);
    double sn, cs;
    sincos((double)pos * (double)a.inv_freq[i * a.inv_stride], &sn, &cs);
    *c = (float)(cs * a.attn_factor);
    *s = (float)(sn * a.attn_factor);
    *ia = a.style == LM_ROPE_INTERLEAVED ? 2 * i : i;
    *ib = a.style == LM_ROPE_INTERLEAVED ? 2 * i + 1 : i + a.half;
}

template <typename T>
__global__ void rope_dx_kernel(const T *dy, lm__cuda_nd nd, void *dx, int dx_dt, lm__cuda_nd nx, rope_bw_args a) {
    int64_t n = a.B * a.T * a.H * a.half;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = idx % a.half, h = (idx / a.half) % a.H, t = (idx / (a.half * a.H)) % a.T;
        int64_t b = idx / (a.half * a.H * a.T), ia, ib;
        float c, s;
        rotation(a, b, t, i, &c, &s, &ia, &ib);
        int64_t yb = b * nd.stride[0] + t * nd.stride[1] + h * nd.stride[2];
        int64_t xb = b * nx.stride[0] + t * nx.stride[1] + h * nx.stride[2];
        float ya = ld(dy + yb + ia * nd.stride[3]), yv = ld(dy + yb + ib * nd.stride[3]);
        st_dt(dx, dx_dt, xb + ia * nx.stride[3], ya * c + yv * s);
        st_dt(dx, dx_dt, xb + ib * nx.stride[3], -ya * s + yv * c);
    }
}

template <typename T>
__global__ void rope_dbias_kernel(const T *dy, lm__cuda_nd nd, void *db, int db_dt, int64_t ds0, int64_t ds1,
                                  rope_bw_args a) {
    int64_t n = a.H * a.half;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = idx % a.half, h = idx / a.half, ia = 0, ib = 0;
        double ga = 0.0, gb = 0.0;
        for (int64_t b = 0; b < a.B; b++)
            for (int64_t t = 0; t < a.T; t++) {
                float c, s;
                rotation(a, b, t, i, &c, &s, &ia, &ib);
                int64_t yb = b * nd.stride[0] + t * nd.stride[1] + h * nd.stride[2];
                float ya = ld(dy + yb + ia * nd.stride[3]), yv = ld(dy + yb + ib * nd.stride[3]);
                ga += ya * c + yv * s;
                gb += -ya * s + yv * c;
            }
        ia = a.style == LM_ROPE_INTERLEAVED ? 2 * i : i;
        ib = a.style == LM_ROPE_INTERLEAVED ? 2 * i + 1 : i + a.half;
        st_dt(db, db_dt, h * ds0 + ia * ds1, (float)ga);
        st_dt(db, db_dt, h * ds0 + ib * ds1, (float)gb);
    }
}

lm_status lm__cuda_rope_backward(const lm_tensor_view *dout, const lm_rope_params *p, const lm_tensor_view *dx,
                                const lm_tensor_view *dbias, cudaStream_t s) {
    rope_bw_args a;
    memset(&a, 0, sizeof a);
    a.style = (int)p->style;
    a.inv_freq = (const float *)p->inv_freq->data;
    a.inv_stride = p->inv_freq->stride[0];
    a.attn_factor = p->attn_factor;
    a.pos_offset = p->pos_offset;
    if (p->positions) {
        a.pos = p->positions->data;
        a.pos_is64 = p->positions->dtype == LM_I64;
        a.pos_ndim = p->positions->ndim;
        for (int i = 0; i < a.pos_ndim; i++) a.pos_stride[i] = p->positions->stride[i];
    }
    a.B = dout->shape[0], a.T = dout->shape[1], a.H = dout->shape[2], a.half = dout->shape[3] / 2;
    int64_t pairs = a.B * a.T * a.H * a.half, hp = a.H * a.half;
    if (dx && pairs > 0) {
        LM_TRY(lm__cuda_float_only(dout->dtype));
        LM__CUDA_FLOAT_SWITCH(dout->dtype, T,
                             rope_dx_kernel<T><<<lm__cuda_blocks(pairs, 256), 256, 0, s>>>(
                                 (const T *)dout->data, lm__cuda_nd_of(dout), dx->data, dx->dtype, lm__cuda_nd_of(dx), a));
        LM_TRY(lm__cuda_launched("rope_backward dx kernel"));
    }
    if (dbias && hp > 0) {
        LM_TRY(lm__cuda_float_only(dout->dtype));
        LM__CUDA_FLOAT_SWITCH(dout->dtype, T,
                             rope_dbias_kernel<T><<<lm__cuda_blocks(hp, 64), 64, 0, s>>>(
                                 (const T *)dout->data, lm__cuda_nd_of(dout), dbias->data, dbias->dtype,
                                 dbias->stride[0], dbias->stride[1], a));
        LM_TRY(lm__cuda_launched("rope_backward dbias kernel"));
    }
    return LM_OK;
}
