/* ops/cuda/norm_backward.cu — RMSNorm and fused add + RMSNorm backward on CUDA.
 *
 * With r = 1 / sqrt(mean(x^2) + eps) per row and g = weight * dout:
 *   dx = r g - x r^3 (g . x) / D  (+ dsum for the fused add)
 *   dweight = sum over rows of dout * x * r
 * Tuned path (rows_vec_kernel; row-contiguous views on 16-byte boundaries, D a multiple
 * of the 16-byte vector and at most 8 warps x 32 lanes x 4 vectors): a team of 1-8
 * warps owns a row, each lane holds up to 4 16-byte vectors of x, dout and dsum in
 * registers, so each operand is read from memory once and dx written once; sum(x^2)
 * and g . x reduce by warp shuffles (and shared memory across the team's warps). A
 * fixed grid of at most NB_GRID blocks (2 resident per SM) strides over the rows; each
 * lane accumulates its columns of dweight in its team's row of a shared [teams, D]
 * array (a lane owns its columns: no races), the teams' rows are added in team order
 * into one f32 partial row per block [blocks, D]; a second kernel (programmatic
 * dependent launch, so its launch overlaps the first) adds the blocks' partials per
 * column in a fixed order (double) and rounds once. The grid and team shape depend
 * only on (rows, D, dtype): the same bits on every run. ~(3 + 1) * rows * D elements
 * moved for the fused add; partials 2 * blocks * D floats. Measured on an H200
 * (bench/cuda_train_ops.c, 8192 x 896 bf16, fused add): 29 us with dweight, 23 us dx
 * only (the readable path: 162 us). Tried and dropped: 3 blocks per SM (register
 * spills, 33 us), an L2 bulk prefetch of each team's next row (26 us dx only), the next
 * row's loads into a second register set (teams of two warps: 31 us).
 * Staged form (rows_staged_kernel; teams of one warp, i.e. D up to 128 vectors): the
 * same arithmetic in the same per-lane and per-warp orders, but a lane's vectors arrive by
 * cp.async into the warp's two shared-memory stages, the next row's copies in flight
 * while the current row is reduced and stored, and dweight sums kept in registers
 * (warps added in warp order). `LOOM_CUDA_NORM_BWD_STAGED=0` keeps the register form.
 * Readable path (any strides): pass 1, one block per row, reduces sum(x^2) and g . x
 * (f32, fixed block tree), writes dx and keeps r in a [rows] workspace; pass 2
 * (dweight): blocks of a 2-d grid own (column tile, chunk of CHUNK rows) and write f32
 * partials [chunks, D]; pass 3 adds the chunks of each column in order (double). No
 * atomics anywhere. O(rows * D) work.
 */
#include "ops/cuda/rows_vec.cuh"

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

/* ---- tuned path ---- */
#define NB_THREADS 256 /* 8 warps */
#define NB_GRID 264    /* at most 2 resident blocks per SM of a 132-SM H100/H200: one wave */
#define NB_MAX_NV 4    /* 16-byte vectors per lane */

struct nb_args {
    lm__cuda_nd rx, rd, rs, ro; /* row descriptors of x, dout, dsum, dx */
    int64_t rows;
    int D, team_warps, iters; /* iters: rows per team, rounded up (uniform over the grid) */
    float eps;
};

/* x, dout, dsum [rows, D] (dsum may be NULL), weight [D], dx [rows, D] (may be NULL),
 * partial [gridDim.x, D] (NULL without dweight). */
template <typename T, typename O, int NV>
__global__ void __launch_bounds__(NB_THREADS, 2) rows_vec_kernel(const T *x, const T *w, const T *dy, const T *dsum,
                                                              O *dx, float *partial, nb_args a) {
    constexpr int VEC = 16 / sizeof(T);
    extern __shared__ float4 sacc4[]; /* [teams, D] floats: each team's dweight sums */
    __shared__ float red[2][NB_THREADS / 32];
    pdl_trigger(); /* the partial-sum kernel may launch now; it waits for this grid to finish */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tw = a.team_warps;
    const int team = warp / tw, tt = (warp % tw) * 32 + lane, tthreads = tw * 32, teams = (NB_THREADS / 32) / tw;
    const int nvec = a.D / VEC;
    const int64_t first = (int64_t)blockIdx.x * teams + team, nteams = (int64_t)gridDim.x * teams;
    float *tacc = (float *)sacc4 + (int64_t)team * a.D; /* a lane owns its vectors' columns */
    if (partial)
#pragma unroll
        for (int k = 0; k < NV; k++) {
            int j = tt + k * tthreads;
            if (j < nvec)
#pragma unroll
                for (int e = 0; e < VEC; e += 4) *(float4 *)(tacc + j * VEC + e) = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    for (int it = 0; it < a.iters; it++) {
        const int64_t r = first + (int64_t)it * nteams;
        const bool valid = r < a.rows;
        uint4 xv[NV], dv[NV], sv[NV];
        float ss = 0.f, dot = 0.f;
        const T *xr = x, *dr = dy;
        if (valid) {
            xr = x + row_off(a.rx, r), dr = dy + row_off(a.rd, r);
            const T *sr = dsum ? dsum + row_off(a.rs, r) : NULL;
#pragma unroll
            for (int k = 0; k < NV; k++) {
                int j = tt + k * tthreads;
                if (j < nvec) {
                    xv[k] = *(const uint4 *)(xr + (int64_t)j * VEC);
                    dv[k] = *(const uint4 *)(dr + (int64_t)j * VEC);
                    if (sr) sv[k] = *(const uint4 *)(sr + (int64_t)j * VEC);
                }
            }
#pragma unroll
            for (int k = 0; k < NV; k++) {
                int j = tt + k * tthreads;
                if (j < nvec) {
                    float xf[VEC], df[VEC], wf[VEC];
                    unpack16(xv[k], xf, x), unpack16(dv[k], df, x);
                    unpack16(*(const uint4 *)(w + (int64_t)j * VEC), wf, x);
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        ss += xf[e] * xf[e];
                        dot += wf[e] * df[e] * xf[e];
                    }
                }
            }
        }
        ss = warp_sum(ss);
        dot = warp_sum(dot);
        if (tw > 1) { /* uniform over the block: every thread reaches both barriers */
            if (lane == 0) red[0][warp] = ss, red[1][warp] = dot;
            __syncthreads();
            ss = 0.f, dot = 0.f;
            for (int i = 0; i < tw; i++) ss += red[0][team * tw + i], dot += red[1][team * tw + i];
            __syncthreads(); /* red is reused by the next row */
        }
        if (!valid) continue;
        const float inv = 1.f / sqrtf(ss / (float)a.D + a.eps), c = inv * inv * inv * dot / (float)a.D;
        O *orow = dx ? dx + row_off(a.ro, r) : NULL;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            int j = tt + k * tthreads;
            if (j < nvec) {
                float xf[VEC], df[VEC];
                unpack16(xv[k], xf, x), unpack16(dv[k], df, x);
                if (partial)
#pragma unroll
                    for (int e = 0; e < VEC; e += 4) {
                        float4 *q = (float4 *)(tacc + j * VEC + e), t = *q;
                        t.x += df[e] * xf[e] * inv, t.y += df[e + 1] * xf[e + 1] * inv;
                        t.z += df[e + 2] * xf[e + 2] * inv, t.w += df[e + 3] * xf[e + 3] * inv;
                        *q = t;
                    }
                if (orow) {
                    float wf[VEC], o[VEC];
                    unpack16(*(const uint4 *)(w + (int64_t)j * VEC), wf, x);
                    if (dsum) unpack16(sv[k], o, x);
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        float v = inv * wf[e] * df[e] - xf[e] * c;
                        o[e] = dsum ? v + o[e] : v;
                    }
                    pack_store<O>(orow + (int64_t)j * VEC, o, VEC);
                }
            }
        }
    }
    if (!partial) return;
    __syncthreads();
    for (int i = threadIdx.x; i < a.D; i += NB_THREADS) { /* the teams' sums added in team order */
        float t = 0.f;
        for (int tm = 0; tm < teams; tm++) t += ((const float *)sacc4)[(int64_t)tm * a.D + i];
        partial[(int64_t)blockIdx.x * a.D + i] = t;
    }
}

/* ---- staged path: one warp a row, the next row copied into shared memory meanwhile ---- */
#define NS_WARPS 8

__device__ __forceinline__ void ns_copy16(void *dst, const void *src) {
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void ns_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void ns_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* The same results as rows_vec_kernel with teams of one warp, but a lane's vectors of
 * x, dout and dsum arrive by cp.async into the warp's two stages of shared memory: the
 * next row's copies are in flight while the current row is reduced and stored, so the
 * memory system never waits for the arithmetic. A lane reads back only the vectors it
 * copied itself (no barrier). dweight: each lane sums its columns over its rows in
 * registers; the block's warps are added in warp order into partial[blockIdx.x]. */
template <typename T, typename O, int NV>
__global__ void __launch_bounds__(NS_WARPS * 32, 2) rows_staged_kernel(const T *x, const T *w, const T *dy,
                                                                     const T *dsum, O *dx, float *partial, nb_args a) {
    constexpr int VEC = 16 / sizeof(T);
    extern __shared__ uint4 ns_sh[]; /* [warps][2 stages][3 operands][NV][32 lanes]; then reused for dweight */
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nvec = a.D / VEC;
    uint4 *mine = ns_sh + (size_t)warp * (2 * 3 * NV * 32);
    const int64_t first = (int64_t)blockIdx.x * NS_WARPS + warp, nwarps = (int64_t)gridDim.x * NS_WARPS;
    auto issue = [&](int64_t r, int st) {
        const T *xr = x + row_off(a.rx, r), *dr = dy + row_off(a.rd, r);
        const T *sr = dsum ? dsum + row_off(a.rs, r) : NULL;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            int j = lane + 32 * k;
            if (j < nvec) {
                ns_copy16(mine + ((st * 3 + 0) * NV + k) * 32 + lane, xr + (int64_t)j * VEC);
                ns_copy16(mine + ((st * 3 + 1) * NV + k) * 32 + lane, dr + (int64_t)j * VEC);
                if (sr) ns_copy16(mine + ((st * 3 + 2) * NV + k) * 32 + lane, sr + (int64_t)j * VEC);
            }
        }
    };
    float acc[NV][VEC];
    uint4 wv[NV];
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int j = lane + 32 * k;
        wv[k] = j < nvec ? *(const uint4 *)(w + (int64_t)j * VEC) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int e = 0; e < VEC; e++) acc[k][e] = 0.f;
    }
    if (first < a.rows) issue(first, 0);
    ns_commit();
    for (int64_t r = first, it = 0; r < a.rows; r += nwarps, it++) {
        const int st = (int)(it & 1);
        if (r + nwarps < a.rows) issue(r + nwarps, st ^ 1);
        ns_commit();
        ns_wait<1>(); /* this row's copies (every group but the newest) are done */
        float ss = 0.f, dot = 0.f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            if (lane + 32 * k >= nvec) continue;
            float xf[VEC], df[VEC], wf[VEC];
            unpack16(mine[((st * 3 + 0) * NV + k) * 32 + lane], xf, x);
            unpack16(mine[((st * 3 + 1) * NV + k) * 32 + lane], df, x);
            unpack16(wv[k], wf, x);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                ss += xf[e] * xf[e];
                dot += wf[e] * df[e] * xf[e];
            }
        }
        ss = warp_sum(ss);
        dot = warp_sum(dot);
        const float inv = 1.f / sqrtf(ss / (float)a.D + a.eps), c = inv * inv * inv * dot / (float)a.D;
        O *orow = dx ? dx + row_off(a.ro, r) : NULL;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            int j = lane + 32 * k;
            if (j >= nvec) continue;
            float xf[VEC], df[VEC];
            unpack16(mine[((st * 3 + 0) * NV + k) * 32 + lane], xf, x);
            unpack16(mine[((st * 3 + 1) * NV + k) * 32 + lane], df, x);
            if (partial)
#pragma unroll
                for (int e = 0; e < VEC; e++) acc[k][e] += df[e] * xf[e] * inv;
            if (orow) {
                float wf[VEC], o[VEC];
                unpack16(wv[k], wf, x);
                if (dsum) unpack16(mine[((st * 3 + 2) * NV + k) * 32 + lane], o, x);
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    float v = inv * wf[e] * df[e] - xf[e] * c;
                    o[e] = dsum ? v + o[e] : v;
                }
                pack_store<O>(orow + (int64_t)j * VEC, o, VEC);
            }
        }
    }
    ns_wait<0>();
    if (!partial) return;
    __syncthreads(); /* the stages become [warps, D] floats of per-warp sums */
    float *red = (float *)ns_sh;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int j = lane + 32 * k;
        if (j < nvec)
#pragma unroll
            for (int e = 0; e < VEC; e++) red[(int64_t)warp * a.D + j * VEC + e] = acc[k][e];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < a.D; i += NS_WARPS * 32) {
        float t = 0.f;
        for (int wp = 0; wp < NS_WARPS; wp++) t += red[(int64_t)wp * a.D + i];
        partial[(int64_t)blockIdx.x * a.D + i] = t;
    }
}

/* dweight[i] = sum over b < blocks of partial[b, i] (seg_col_sum's order). */
static __global__ void __launch_bounds__(SEG_COLS *SEG_SEGS)
    dweight_blocks_sum_kernel(const float *partial, int blocks, int D, void *dw, int dw_dt, int64_t sw) {
    __shared__ double seg[SEG_SEGS][SEG_COLS];
    pdl_wait(); /* partial is written by the previous kernel */
    const int64_t i = (int64_t)blockIdx.x * SEG_COLS + threadIdx.x % SEG_COLS;
    double acc;
    if (seg_col_sum(partial, blocks, D, i, seg, &acc)) st_dt(dw, dw_dt, i * sw, (float)acc);
}

template <typename T, typename O, int NV>
static lm_status launch_rows_vec(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *dout,
                                 const lm_tensor_view *dsum, const lm_tensor_view *dx, float *partial, int blocks,
                                 const nb_args &a, cudaStream_t s) {
    size_t smem = partial ? sizeof(float) * (size_t)a.D * (size_t)((NB_THREADS / 32) / a.team_warps) : 0;
    rows_vec_kernel<T, O, NV><<<(unsigned)blocks, NB_THREADS, smem, s>>>(
        (const T *)x->data, (const T *)w->data, (const T *)dout->data, dsum ? (const T *)dsum->data : NULL,
        dx ? (O *)dx->data : NULL, partial, a);
    return lm__cuda_launched("rmsnorm_backward rows kernel");
}

template <typename T, typename O, int NV>
static lm_status launch_staged(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *dout,
                               const lm_tensor_view *dsum, const lm_tensor_view *dx, float *partial, int blocks,
                               const nb_args &a, cudaStream_t s) {
    static lm__cuda_kernel_facts facts;
    size_t stages = sizeof(uint4) * NS_WARPS * 2 * 3 * 32 * NV, red = sizeof(float) * NS_WARPS * (size_t)a.D;
    size_t smem = stages > red ? stages : red;
    int per_sm = 0;
    cudaError_t e = lm__cuda_blocks_per_sm(&facts, (const void *)rows_staged_kernel<T, O, NV>, NS_WARPS * 32, smem,
                                           &per_sm);
    if (e != cudaSuccess) return lm__cuda_check((int)e, "rmsnorm_backward staged kernel setup");
    if (per_sm < 1) return LM_UNSUPPORTED; /* no room: the register form runs instead */
    rows_staged_kernel<T, O, NV><<<(unsigned)blocks, NS_WARPS * 32, smem, s>>>(
        (const T *)x->data, (const T *)w->data, (const T *)dout->data, dsum ? (const T *)dsum->data : NULL,
        dx ? (O *)dx->data : NULL, partial, a);
    return lm__cuda_launched("rmsnorm_backward staged kernel");
}

/* The rows kernel with NV vectors a lane: the staged form when asked (teams of one
 * warp) and its shared memory fits, else the register form. */
template <typename T, typename O, int NV>
static lm_status launch_tuned_nv(int staged, const lm_tensor_view *x, const lm_tensor_view *w,
                                 const lm_tensor_view *dout, const lm_tensor_view *dsum, const lm_tensor_view *dx,
                                 float *partial, int blocks, const nb_args &a, cudaStream_t s) {
    if (staged) {
        lm_status st = launch_staged<T, O, NV>(x, w, dout, dsum, dx, partial, blocks, a, s);
        if (st != LM_UNSUPPORTED) return st;
    }
    return launch_rows_vec<T, O, NV>(x, w, dout, dsum, dx, partial, blocks, a, s);
}

template <typename T, typename O>
static lm_status launch_tuned(int staged, int nv, const lm_tensor_view *x, const lm_tensor_view *w,
                              const lm_tensor_view *dout, const lm_tensor_view *dsum, const lm_tensor_view *dx,
                              float *partial, int blocks, const nb_args &a, cudaStream_t s) {
    if (nv == 1) return launch_tuned_nv<T, O, 1>(staged, x, w, dout, dsum, dx, partial, blocks, a, s);
    if (nv == 2) return launch_tuned_nv<T, O, 2>(staged, x, w, dout, dsum, dx, partial, blocks, a, s);
    return launch_tuned_nv<T, O, 4>(staged, x, w, dout, dsum, dx, partial, blocks, a, s);
}

/* The tuned path, or LM_UNSUPPORTED (nothing queued, no error recorded) when the views
 * do not fit it. rows >= 1, D >= 1. */
static lm_status rmsnorm_backward_vec(const lm_tensor_view *x, const lm_tensor_view *weight, float eps,
                                      const lm_tensor_view *dout, const lm_tensor_view *dsum, const lm_tensor_view *dx,
                                      const lm_tensor_view *dweight, int64_t rows, int64_t D, cudaStream_t s) {
    int vec = 16 / (int)lm_dtype_size(x->dtype);
    if (D % vec != 0 || D > (int64_t)(NB_THREADS / 32) * 32 * NB_MAX_NV * vec) return LM_UNSUPPORTED;
    if (!rows_vec_ok(x) || !rows_vec_ok(dout) || (dsum && !rows_vec_ok(dsum))) return LM_UNSUPPORTED;
    if (dx && (!rows_vec_ok(dx) || (dx->dtype != x->dtype && dx->dtype != LM_F32))) return LM_UNSUPPORTED;
    if (!lm__cuda_aligned16(weight->data) || (D > 1 && weight->stride[0] != 1)) return LM_UNSUPPORTED;
    int64_t nvec = D / vec;
    int tw, nv;
    rows_team(nvec, NB_MAX_NV, &tw, &nv);
    int teams = (NB_THREADS / 32) / tw;
    int64_t blocks = LM_MIN((rows + teams - 1) / teams, (int64_t)NB_GRID);
    nb_args a;
    a.rx = rows_flat(x), a.rd = rows_flat(dout);
    a.rs = dsum ? rows_flat(dsum) : a.rx;
    a.ro = dx ? rows_flat(dx) : a.rx;
    a.rows = rows, a.D = (int)D, a.team_warps = tw;
    a.iters = (int)((rows + blocks * teams - 1) / (blocks * teams));
    a.eps = eps;
    float *partial = NULL; /* [blocks, D] */
    if (dweight)
        LM_TRY(lm__cuda_check(cudaMallocAsync((void **)&partial, sizeof(float) * (size_t)(blocks * D), s),
                              "cudaMallocAsync (rmsnorm_backward)"));
    int to_f32 = dx && dx->dtype == LM_F32 && x->dtype != LM_F32;
    const char *se = getenv("LOOM_CUDA_NORM_BWD_STAGED"); /* 0: the register form, for measurements */
    int staged = tw == 1 && !(se && strcmp(se, "0") == 0); /* one warp a row: the staged form */
    lm_status st = LM_OK;
    switch (x->dtype) {
    case LM_F32: st = launch_tuned<float, float>(staged, nv, x, weight, dout, dsum, dx, partial, (int)blocks, a, s); break;
    case LM_BF16:
        st = to_f32 ? launch_tuned<bf16, float>(staged, nv, x, weight, dout, dsum, dx, partial, (int)blocks, a, s)
                    : launch_tuned<bf16, bf16>(staged, nv, x, weight, dout, dsum, dx, partial, (int)blocks, a, s);
        break;
    default:
        st = to_f32 ? launch_tuned<__half, float>(staged, nv, x, weight, dout, dsum, dx, partial, (int)blocks, a, s)
                    : launch_tuned<__half, __half>(staged, nv, x, weight, dout, dsum, dx, partial, (int)blocks, a, s);
        break;
    }
    if (st == LM_OK && dweight) {
        cudaError_t e = lm__cuda_launch_pdl(dweight_blocks_sum_kernel, dim3((unsigned)((D + SEG_COLS - 1) / SEG_COLS)),
                                            dim3(SEG_COLS * SEG_SEGS), 0, s, (const float *)partial, (int)blocks,
                                            (int)D, dweight->data, (int)dweight->dtype, (int64_t)dweight->stride[0]);
        st = e != cudaSuccess ? lm__cuda_check((int)e, "rmsnorm_backward dweight sum launch")
                              : lm__cuda_launched("rmsnorm_backward dweight sum kernel");
    }
    if (partial) cudaFreeAsync(partial, s);
    return st;
}

lm_status lm__cuda_rmsnorm_backward(const lm_tensor_view *x, const lm_tensor_view *weight, float eps,
                                   const lm_tensor_view *dout, const lm_tensor_view *dsum, const lm_tensor_view *dx,
                                   const lm_tensor_view *dweight, cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(x), D = x->shape[x->ndim - 1];
    if (D == 0 || (!dx && !dweight)) return LM_OK;
    int64_t rows = n / D, chunks = (rows + CHUNK - 1) / CHUNK;
    if (rows == 0) return dweight ? dweight_zero(dweight, D, s) : LM_OK;
    if (lm_status vs = rmsnorm_backward_vec(x, weight, eps, dout, dsum, dx, dweight, rows, D, s); vs != LM_UNSUPPORTED)
        return vs;
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
