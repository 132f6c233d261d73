/* ops/cuda/rope_backward.cu — RoPE backward on CUDA. The forward rotates each pair
 * (a, b) to (a c - b s, b c + a s) with c = f cos(angle), s = f sin(angle); the
 * transpose gives
 *   da = dy_a c + dy_b s,   db = -dy_a s + dy_b c.
 * dx: rope_rows_kernel (rope_rows.cuh) with sgn = -1, angles in double as the forward.
 * dbias [H, D] = sum over (b, t) of dx: one thread per (h, pair) walks (b, t) in
 * order, recomputing the rotation and summing in double (no atomics, run-independent).
 * O(B T H D) for each output.
 */
#include "ops/cuda/rope_rows.cuh"

template <typename T>
__global__ void rope_dbias_kernel(const T *dy, lm__cuda_nd nd, void *db, int db_dt, int64_t ds0, int64_t ds1,
                                  lm__cuda_rope_args a) {
    int64_t n = a.H * a.half;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = idx % a.half, h = idx / a.half, ia = 0, ib = 0;
        double ga = 0.0, gb = 0.0;
        for (int64_t b = 0; b < a.B; b++)
            for (int64_t t = 0; t < a.T; t++) {
                float c, s;
                rope_cos_sin(a, rope_position(a, b, t), i, &c, &s);
                rope_pair(a, i, &ia, &ib);
                int64_t yb = b * nd.stride[0] + t * nd.stride[1] + h * nd.stride[2];
                float ya = ld(dy + yb + ia * nd.stride[3]), yv = ld(dy + yb + ib * nd.stride[3]);
                ga += ya * c + yv * s;
                gb += -ya * s + yv * c;
            }
        rope_pair(a, i, &ia, &ib);
        st_dt(db, db_dt, h * ds0 + ia * ds1, (float)ga);
        st_dt(db, db_dt, h * ds0 + ib * ds1, (float)gb);
    }
}

lm_status lm__cuda_rope_backward(const lm_tensor_view *dout, const lm_rope_params *p, const lm_tensor_view *dx,
                                const lm_tensor_view *dbias, cudaStream_t s) {
    lm__cuda_rope_args a = lm__cuda_rope_args_of(p, dout);
    int64_t pairs = a.B * a.T * a.H * a.half, hp = a.H * a.half;
    if (dx && pairs > 0) LM_TRY(lm__cuda_rope_rows(dout, NULL, 0, 0, dx, a, -1.f, "rope_backward dx kernel", s));
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
