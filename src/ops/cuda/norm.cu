/* ops/cuda/norm.cu — RMSNorm and fused residual add + RMSNorm on CUDA.
 *
 * One block per row (the index space of the leading dims): pass 1 accumulates the
 * row's sum of squares per thread and reduces it over the block, pass 2 scales. Each
 * thread touches the same elements in both passes, so an output that is the very
 * view of an input is safe (the block reduction's barriers separate all reads of pass
 * 1 from the writes of pass 2). add_rmsnorm stores the sum rounded to the dtype and
 * normalizes the stored value, as the reference does.
 * Tuned path (norm_vec_kernel; rows on 16-byte boundaries with contiguous elements, D a
 * multiple of the 16-byte vector and at most 8 warps x 32 lanes x 4 vectors, the
 * weight contiguous): a team of 1-8 warps owns a row, each lane loads its 16-byte
 * vectors of x (and the residual) once, keeps the rounded sum in registers while the
 * team reduces sum(x^2) by warp shuffles (and shared memory across its warps), then
 * writes the sum and the normalized row once. Same arithmetic as the readable kernel
 * (the sum rounded to the dtype, then (v * inv) * w); only the order of the f32 sum of
 * squares differs. Measured on an H200: bench/NOTES.md (training, add + RMSNorm forward).
 * The _to_bf16 forms (the model step): the residual stream is f32 and stays f32, the normalized output
 * is bf16 for the next GEMM; aligned rows of D a multiple of 4 take the same team scheme
 * (norm_bf16_vec_kernel, float4 loads, 4 bf16 stored at once), others a block per row.
 * O(rows * D).
 */
#include "ops/cuda/rows_vec.cuh"


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

/* ---- tuned path ---- */
#define NF_THREADS 256 /* 8 warps */
#define NF_MAX_NV 4    /* 16-byte vectors per lane */

struct nf_args {
    lm__cuda_nd rx, rr, rs, ro; /* row descriptors (rows_flat) of x, residual, sum, out */
    int64_t rows;
    int D, team_warps;
    float eps;
};

/* The sum of v over a team of tw warps (warps team * tw .. of the block), every lane
 * getting it; red holds one float per warp. Uniform over the block when tw > 1: every
 * thread must call it (the barrier). */
__device__ __forceinline__ float team_sum(float v, float *red, int warp, int lane, int tw, int team) {
    v = warp_sum(v);
    if (tw > 1) {
        if (lane == 0) red[warp] = v;
        __syncthreads();
        v = 0.f;
        for (int i = 0; i < tw; i++) v += red[team * tw + i];
    }
    return v;
}

/* x, res, sum, out [rows, D] (res and sum NULL for the plain RMSNorm), weight [D]; one
 * row per team, the grid covers every row. */
template <typename T, int NV>
__global__ void __launch_bounds__(NF_THREADS) norm_vec_kernel(const T *x, const T *res, const T *w, T *sum, T *out,
                                                               nf_args a) {
    constexpr int VEC = 16 / sizeof(T);
    __shared__ float red[NF_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tw = a.team_warps;
    const int team = warp / tw, tt = (warp % tw) * 32 + lane, tthreads = tw * 32, teams = (NF_THREADS / 32) / tw;
    const int nvec = a.D / VEC;
    const int64_t r = (int64_t)blockIdx.x * teams + team;
    const bool valid = r < a.rows;
    uint4 v[NV];
    float ss = 0.f;
    if (valid) {
        const T *xr = x + row_off(a.rx, r), *rr = res ? res + row_off(a.rr, r) : NULL;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            int j = tt + k * tthreads;
            if (j < nvec) {
                v[k] = *(const uint4 *)(xr + (int64_t)j * VEC);
                if (rr) {
                    uint4 u = *(const uint4 *)(rr + (int64_t)j * VEC);
                    float f[VEC], g[VEC];
                    unpack16(v[k], f, x), unpack16(u, g, x);
#pragma unroll
                    for (int e = 0; e < VEC; e++) f[e] += g[e];
                    v[k] = pack16<T>(f); /* the sum rounded to T, as stored */
                }
            }
        }
        T *sr = sum ? sum + row_off(a.rs, r) : NULL;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            int j = tt + k * tthreads;
            if (j < nvec) {
                float f[VEC];
                unpack16(v[k], f, x);
#pragma unroll
                for (int e = 0; e < VEC; e++) ss += f[e] * f[e];
                if (sr) *(uint4 *)(sr + (int64_t)j * VEC) = v[k];
            }
        }
    }
    ss = team_sum(ss, red, warp, lane, tw, team);
    if (!valid) return;
    const float inv = rsqrtf(ss / (float)a.D + a.eps);
    T *orow = out + row_off(a.ro, r);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int j = tt + k * tthreads;
        if (j < nvec) {
            float f[VEC], wf[VEC];
            unpack16(v[k], f, x);
            unpack16(*(const uint4 *)(w + (int64_t)j * VEC), wf, x);
#pragma unroll
            for (int e = 0; e < VEC; e++) f[e] = f[e] * inv * wf[e];
            *(uint4 *)(orow + (int64_t)j * VEC) = pack16<T>(f);
        }
    }
}

template <typename T, int NV>
static void launch_norm_vec(const lm_tensor_view *x, const lm_tensor_view *res, const lm_tensor_view *w,
                            const lm_tensor_view *sum, const lm_tensor_view *out, unsigned blocks, const nf_args &a,
                            cudaStream_t s) {
    norm_vec_kernel<T, NV><<<blocks, NF_THREADS, 0, s>>>((const T *)x->data, res ? (const T *)res->data : NULL,
                                                        (const T *)w->data, sum ? (T *)sum->data : NULL,
                                                        (T *)out->data, a);
}

template <typename T>
static void launch_norm_nv(int nv, const lm_tensor_view *x, const lm_tensor_view *res, const lm_tensor_view *w,
                           const lm_tensor_view *sum, const lm_tensor_view *out, unsigned blocks, const nf_args &a,
                           cudaStream_t s) {
    if (nv == 1) launch_norm_vec<T, 1>(x, res, w, sum, out, blocks, a, s);
    else if (nv == 2) launch_norm_vec<T, 2>(x, res, w, sum, out, blocks, a, s);
    else launch_norm_vec<T, 4>(x, res, w, sum, out, blocks, a, s);
}

/* The tuned path, or LM_UNSUPPORTED (nothing queued) when the views do not fit it.
 * residual and sum_out are both NULL (RMSNorm) or both given (add + RMSNorm). */
static lm_status norm_vec(const lm_tensor_view *x, const lm_tensor_view *residual, const lm_tensor_view *weight,
                          float eps, const lm_tensor_view *sum_out, const lm_tensor_view *out, int64_t rows, int64_t D,
                          cudaStream_t s) {
    int vec = 16 / (int)lm_dtype_size(x->dtype);
    if (D % vec != 0 || D > (int64_t)(NF_THREADS / 32) * 32 * NF_MAX_NV * vec) return LM_UNSUPPORTED;
    if (!rows_vec_ok(x) || !rows_vec_ok(out) || (residual && (!rows_vec_ok(residual) || !rows_vec_ok(sum_out))))
        return LM_UNSUPPORTED;
    if (!lm__cuda_aligned16(weight->data) || (D > 1 && weight->stride[0] != 1)) return LM_UNSUPPORTED;
    int tw, nv;
    rows_team(D / vec, NF_MAX_NV, &tw, &nv);
    int64_t teams = (NF_THREADS / 32) / tw, blocks = (rows + teams - 1) / teams;
    if (blocks > INT32_MAX) return LM_UNSUPPORTED;
    nf_args a;
    a.rx = rows_flat(x), a.ro = rows_flat(out);
    a.rr = residual ? rows_flat(residual) : a.rx;
    a.rs = sum_out ? rows_flat(sum_out) : a.rx;
    a.rows = rows, a.D = (int)D, a.team_warps = tw, a.eps = eps;
    switch (x->dtype) {
    case LM_F32: launch_norm_nv<float>(nv, x, residual, weight, sum_out, out, (unsigned)blocks, a, s); break;
    case LM_BF16: launch_norm_nv<bf16>(nv, x, residual, weight, sum_out, out, (unsigned)blocks, a, s); break;
    default: launch_norm_nv<__half>(nv, x, residual, weight, sum_out, out, (unsigned)blocks, a, s); break;
    }
    return lm__cuda_launched(residual ? "add_rmsnorm kernel (rows)" : "rmsnorm kernel (rows)");
}

lm_status lm__cuda_rmsnorm(const lm_tensor_view *x, const lm_tensor_view *weight, float eps,
                          const lm_tensor_view *out, cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(out), D = x->shape[x->ndim - 1];
    if (n == 0) return LM_OK;
    int64_t rows = n / D;
    unsigned g = (unsigned)LM_MIN(rows, 65535 * 8);
    LM_TRY(lm__cuda_float_only(x->dtype));
    if (lm_status vs = norm_vec(x, NULL, weight, eps, NULL, out, rows, D, s); vs != LM_UNSUPPORTED) return vs;
    LM__CUDA_FLOAT_SWITCH(x->dtype, T,
                         rmsnorm_kernel<T><<<g, 256, 0, s>>>((const T *)x->data, rows_nd(x), last_stride(x),
                                                             (const T *)weight->data, weight->stride[0], (T *)out->data,
                                                             rows_nd(out), last_stride(out), rows, D, eps));
    return lm__cuda_launched("rmsnorm kernel");
}

lm_status lm__cuda_add_rmsnorm(const lm_tensor_view *x, const lm_tensor_view *residual, const lm_tensor_view *weight,
                              float eps, const lm_tensor_view *sum_out, const lm_tensor_view *out, cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(out), D = x->shape[x->ndim - 1];
    if (n == 0) return LM_OK;
    int64_t rows = n / D;
    unsigned g = (unsigned)LM_MIN(rows, 65535 * 8);
    LM_TRY(lm__cuda_float_only(x->dtype));
    if (lm_status vs = norm_vec(x, residual, weight, eps, sum_out, out, rows, D, s); vs != LM_UNSUPPORTED) return vs;
    LM__CUDA_FLOAT_SWITCH(x->dtype, T,
                         add_rmsnorm_kernel<T><<<g, 256, 0, s>>>(
                             (const T *)x->data, rows_nd(x), last_stride(x), (const T *)residual->data,
                             rows_nd(residual), last_stride(residual), (const T *)weight->data, weight->stride[0],
                             (T *)sum_out->data, rows_nd(sum_out), last_stride(sum_out), (T *)out->data, rows_nd(out),
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

/* Tuned form of the two _to_bf16 kernels (rows 16-byte aligned, D a multiple of 4 and at
 * most 8 warps x 32 lanes x 4 vectors, w and out aligned): a team of 1-8 warps owns a
 * row as in norm_vec_kernel, each lane holds up to NV float4 of x (x + delta, stored
 * back, for the add form) in registers, the team reduces sum(x^2), and the lane writes
 * its 4-value groups as bf16 once. Same arithmetic as rmsnorm_to_bf16_kernel (x * inv
 * * w rounded once); only the order of the f32 sum of squares differs.
 * Latency, since a step's rows are few (8 blocks at 32 rows): every load a lane makes is
 * issued before anything waits on one (the weight's first, then x's and delta's, all
 * before the first store, which the compiler could not move loads past), so a call is
 * one round trip to memory, the team's sum and the stores. Launched with programmatic
 * launch: the weight is read before the wait, x and delta after; the kernel lets its
 * successor launch at once, so a product after it (the gate|up GEMM asks for its weights
 * before its own wait) streams during this kernel. Both rest on the invariant stated at
 * pdl_wait (common.cuh): no kernel of a step writes a weight. */
template <int NV>
__global__ void __launch_bounds__(NF_THREADS) norm_bf16_vec_kernel(float *x, int64_t ldx, const float *delta,
                                                                    const float *w, float eps, int D, int tw,
                                                                    int64_t rows, bf16 *out) {
    __shared__ float red[NF_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int team = warp / tw, tt = (warp % tw) * 32 + lane, tthreads = tw * 32, teams = (NF_THREADS / 32) / tw;
    const int nvec = D / 4;
    const int64_t r = (int64_t)blockIdx.x * teams + team;
    const bool valid = r < rows;
    float4 v[NV], d[NV], wf[NV];
    pdl_trigger(); /* before its own wait the successor reads only what pdl_wait allows (common.cuh) */
#pragma unroll
    for (int k = 0; k < NV; k++)
        if (valid && tt + k * tthreads < nvec) wf[k] = ((const float4 *)w)[tt + k * tthreads];
    pdl_wait(); /* x and delta are the previous kernels' outputs */
    float ss = 0.f;
    if (valid) {
        float4 *xr = (float4 *)(x + r * ldx);
        const float4 *dr = delta ? (const float4 *)(delta + r * (int64_t)D) : NULL;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int j = tt + k * tthreads;
            if (j < nvec) {
                v[k] = xr[j];
                if (dr) d[k] = dr[j];
            }
        }
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int j = tt + k * tthreads;
            if (j < nvec) {
                if (dr) {
                    v[k].x += d[k].x, v[k].y += d[k].y, v[k].z += d[k].z, v[k].w += d[k].w;
                    xr[j] = v[k];
                }
                ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
            }
        }
    }
    ss = team_sum(ss, red, warp, lane, tw, team);
    if (!valid) return;
    const float inv = rsqrtf(ss / (float)D + eps);
    uint2 *orow = (uint2 *)(out + r * (int64_t)D);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int j = tt + k * tthreads;
        if (j < nvec) {
            __nv_bfloat162 lo = __floats2bfloat162_rn(v[k].x * inv * wf[k].x, v[k].y * inv * wf[k].y);
            __nv_bfloat162 hi = __floats2bfloat162_rn(v[k].z * inv * wf[k].z, v[k].w * inv * wf[k].w);
            orow[j] = make_uint2(*(uint32_t *)&lo, *(uint32_t *)&hi);
        }
    }
}

/* The tuned _to_bf16 form, or LM_UNSUPPORTED (nothing queued) when the layout does not fit. */
static lm_status norm_bf16_vec(float *x, int64_t ldx, const float *delta, const float *w, float eps, int64_t rows,
                               int64_t D, void *out, cudaStream_t s) {
    if (D % 4 != 0 || D > (int64_t)(NF_THREADS / 32) * 32 * NF_MAX_NV * 4 || ldx % 4 != 0 || !lm__cuda_aligned16(x) ||
        !lm__cuda_aligned16(w) || !lm__cuda_aligned16(out) || (delta && !lm__cuda_aligned16(delta)))
        return LM_UNSUPPORTED;
    int tw, nv;
    rows_team(D / 4, NF_MAX_NV, &tw, &nv);
    int64_t teams = (NF_THREADS / 32) / tw, blocks = (rows + teams - 1) / teams;
    if (blocks > INT32_MAX) return LM_UNSUPPORTED;
    bf16 *o = (bf16 *)out;
    void (*k)(float *, int64_t, const float *, const float *, float, int, int, int64_t, bf16 *) =
        nv == 1 ? norm_bf16_vec_kernel<1> : nv == 2 ? norm_bf16_vec_kernel<2> : norm_bf16_vec_kernel<4>;
    /* LOOM_CUDA_NORM_PDL=0 (measurements): an ordinary launch, which waits for the kernel
     * before to finish and lets the next start only when this one has */
    const char *pe = getenv("LOOM_CUDA_NORM_PDL");
    cudaError_t e;
    if (pe && strcmp(pe, "0") == 0) {
        k<<<(unsigned)blocks, NF_THREADS, 0, s>>>(x, ldx, delta, w, eps, (int)D, tw, rows, o);
        e = cudaSuccess;
    } else {
        e = lm__cuda_launch_pdl(k, dim3((unsigned)blocks), dim3(NF_THREADS), 0, s, x, ldx, delta, w, eps, (int)D, tw,
                                rows, o);
    }
    const char *what = delta ? "add_rmsnorm_to_bf16 (rows)" : "rmsnorm_to_bf16 (rows)";
    if (e != cudaSuccess) return lm__cuda_check((int)e, what);
    return lm__cuda_launched(what);
}

lm_status lm__cuda_rmsnorm_to_bf16(const float *x, int64_t ldx, const float *w, float eps, int64_t rows, int64_t D,
                                   void *out, cudaStream_t s) {
    if (rows == 0) return LM_OK;
    if (lm_status vs = norm_bf16_vec((float *)x, ldx, NULL, w, eps, rows, D, out, s); vs != LM_UNSUPPORTED) return vs;
    rmsnorm_to_bf16_kernel<<<(unsigned)rows, 256, 0, s>>>((float *)x, ldx, NULL, w, eps, D, (bf16 *)out);
    return lm__cuda_launched("rmsnorm_to_bf16");
}

lm_status lm__cuda_add_rmsnorm_to_bf16(float *x, const float *delta, const float *w, float eps, int64_t rows, int64_t D,
                                 void *out, cudaStream_t s) {
    if (rows == 0) return LM_OK;
    if (lm_status vs = norm_bf16_vec(x, D, delta, w, eps, rows, D, out, s); vs != LM_UNSUPPORTED) return vs;
    rmsnorm_to_bf16_kernel<<<(unsigned)rows, 256, 0, s>>>(x, D, delta, w, eps, D, (bf16 *)out);
    return lm__cuda_launched("add_rmsnorm_to_bf16");
}
