/* ops/cuda/linear_ce.cu — the fused output projection + cross-entropy on CUDA, forward
 * and backward, in row chunks so the [N, V] logits never exist.
 *
 * x [N, H] and w [V, H] contiguous, one float dtype. Rows are taken in chunks of
 * C = max(1, 2^29 / V) (the chunk's logits are <= 2 GiB: few chunks, so the f32
 * dw accumulation is read and written few times). Per chunk:
 *   z [c, V] = x_c @ w^T in x's dtype            (cuBLASLt, f32 accumulation; bf16
 *             logits under bf16 compute, as autocast training rounds them)
 *   forward:  one block per row: an online max/sum pass gives lse (f32 math), and
 *             loss_r = lse - z[t_r] (double) goes to a per-row buffer
 *   backward: the same pass, then dz = dloss / counted * (softmax(z) - onehot(t_r))
 *             in place over z, 0 on ignored rows (and the row's loss, when the
 *             caller asks for the loss too: lm_linear_cross_entropy_grads_out);
 *             dx_c = dz @ w  and  dw (+)= dz^T @ x_c   (cuBLASLt; dw accumulates in
 *             an f32 buffer, or in dw itself when it is f32 and contiguous)
 * The forward ends with one block summing the row losses in a fixed order / counted
 * (NaN when every row is ignored). Targets are validated and counted first, the count
 * kept on the device for the kernels; outside a capture the stream is synchronized to
 * read the check, so a bad target fails before anything is written, with the
 * reference's message; inside one (a captured training step) nothing waits and a bad
 * target's row gets NaN. dloss is read on the device.
 * Row passes read bf16 logits 8 at a time and take exponentials as exp2f in log2
 * units. Cost per call: O(N V H) GEMM work (the backward recomputes the forward GEMM
 * unless it runs as the grads form) and two reads and one write of each chunk's logits.
 */
#include "ops/cuda/cuda_backward.h"
#include "ops/cuda/common.cuh"

#define LCE_THREADS 512

__device__ __forceinline__ int64_t lce_target(const void *t, int is64, int64_t off) {
    return is64 ? ((const int64_t *)t)[off] : (int64_t)((const int32_t *)t)[off];
}

static __global__ void lce_check_kernel(const void *t, int is64, int64_t ts, int64_t N, int64_t V, int64_t ignore,
                                 unsigned long long *first, unsigned long long *count) {
    unsigned long long mine = 0;
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < N; r += (int64_t)gridDim.x * blockDim.x) {
        int64_t v = lce_target(t, is64, r * ts);
        if (v == ignore) continue;
        if (v < 0 || v >= V) atomicMin(first, (unsigned long long)r);
        else mine++;
    }
    if (mine) atomicAdd(count, mine); /* integers: order does not matter */
}

/* Row statistics in log2 units: m = the largest z * log2(e) of the row, s = the sum of
 * 2^(z log2(e) - m) (exp2f, the hardware's exponential with its few-ulp error). An
 * element equal to the running maximum counts exactly 1, so a row whose maximum is
 * +inf keeps lse = +inf as in the reference. */
#define LCE_LOG2E 1.4426950408889634f

__device__ __forceinline__ float lce_term(float y, float m) { return y == m ? 1.f : exp2f(y - m); }

/* 1 when a row of z is read as 16-byte vectors of 8 bf16 (every row start aligned). */
template <typename T> __device__ __forceinline__ int lce_vec8(const T *z, int64_t V) { return 0; }
template <> __device__ __forceinline__ int lce_vec8<bf16>(const bf16 *z, int64_t V) {
    return V % 8 == 0 && ((uintptr_t)z % 16) == 0;
}

/* (m, s) of one row, combined over the block; every thread gets them. A thread takes
 * 8 elements at a time when the row allows (one rescale of its sum per 8). */
template <typename T>
__device__ void row_stats(const T *z, int64_t V, float *red, float *out_m, float *out_s) {
    float m = -INFINITY, sum = 0.f;
    if (lce_vec8(z, V)) {
        const uint4 *zv = (const uint4 *)z;
        for (int64_t j = threadIdx.x; j < V / 8; j += blockDim.x) {
            uint4 u = zv[j];
            const bf16 *e = (const bf16 *)&u;
            float y[8], lm = m;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                y[k] = __bfloat162float(e[k]) * LCE_LOG2E;
                lm = fmaxf(lm, y[k]);
            }
            if (lm > m) {
                sum = m == -INFINITY ? 0.f : sum * exp2f(m - lm);
                m = lm;
            }
#pragma unroll
            for (int k = 0; k < 8; k++) sum += lce_term(y[k], m);
        }
    } else {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
            float y = ld(z + j) * LCE_LOG2E;
            if (y > m) {
                sum = (m == -INFINITY ? 0.f : sum * exp2f(m - y)) + 1.f;
                m = y;
            } else {
                sum += lce_term(y, m);
            }
        }
    }
    float bm = block_max(m, red);
    float part = m == -INFINITY ? 0.f : sum * lce_term(m, bm);
    *out_s = block_sum(part, red);
    *out_m = bm;
}

/* lse (natural log) - z[target] in double from the row's log2 statistics. */
template <typename T>
__device__ __forceinline__ double row_loss_of(const T *row, int64_t target, float m, float s) {
    double lse = isinf(m) ? (double)m : ((double)m + log2((double)s)) * 0.69314718055994530942;
    return lse - (double)ld(row + target);
}

template <typename T>
__global__ void lce_loss_rows(const T *z, int64_t V, const void *t, int is64, int64_t ts, int64_t ignore,
                              double *row_loss) {
    __shared__ float red[32];
    int64_t r = blockIdx.x;
    int64_t target = lce_target(t, is64, r * ts);
    if (target == ignore || target < 0 || target >= V) { /* a bad target (unchecked in a capture): NaN */
        if (threadIdx.x == 0) row_loss[r] = target == ignore ? 0.0 : NAN;
        return;
    }
    const T *row = z + r * V;
    float m, s;
    row_stats(row, V, red, &m, &s);
    if (threadIdx.x == 0) row_loss[r] = row_loss_of(row, target, m, s);
}

/* 1 / the rows counted (0 when none), from the count on the device. */
__device__ __forceinline__ double lce_inv(const unsigned long long *count) {
    return *count ? 1.0 / (double)*count : 0.0;
}

/* dz = dloss / counted * (softmax(z) - onehot(target)) in place over the row, 0 on an
 * ignored row (NaN on a bad target, unchecked in a capture); dloss NULL means 1.
 * row_loss (when not NULL) gets the row's loss, as lce_loss_rows writes it. */
template <typename T>
__global__ void lce_grad_rows(T *z, int64_t V, const void *t, int is64, int64_t ts, int64_t ignore,
                              const float *dloss, const unsigned long long *count, double *row_loss) {
    __shared__ float red[32];
    int64_t r = blockIdx.x;
    int64_t target = lce_target(t, is64, r * ts);
    T *row = z + r * V, *drow = row; /* in place: each thread rewrites only the elements it read */
    if (target == ignore || target < 0 || target >= V) {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) st(drow + j, target == ignore ? 0.f : NAN);
        if (row_loss && threadIdx.x == 0) row_loss[r] = target == ignore ? 0.0 : NAN;
        return;
    }
    float m, s;
    row_stats(row, V, red, &m, &s);
    float scale = (float)((dloss ? (double)*dloss : 1.0) * lce_inv(count)), ps = scale / s;
    if (row_loss && threadIdx.x == 0) row_loss[r] = row_loss_of(row, target, m, s);
    __syncthreads(); /* every thread has read the row (and z[target]) before dz overwrites it */
    if (lce_vec8(row, V)) {
        uint4 *zv = (uint4 *)row;
        for (int64_t j = threadIdx.x; j < V / 8; j += blockDim.x) {
            uint4 u = zv[j];
            bf16 *e = (bf16 *)&u;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float d = ps * lce_term(__bfloat162float(e[k]) * LCE_LOG2E, m);
                e[k] = __float2bfloat16_rn(8 * j + k == target ? d - scale : d);
            }
            zv[j] = u;
        }
    } else {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
            float d = ps * lce_term(ld(row + j) * LCE_LOG2E, m);
            st(drow + j, j == target ? d - scale : d);
        }
    }
}

/* The mean of the row losses in a fixed order (each thread a strided run of rows, then
 * the block's tree): one block of LCE_MEAN_THREADS, the same result on every run. */
#define LCE_MEAN_THREADS 1024
static __global__ void lce_mean_kernel(const double *row_loss, int64_t N, const unsigned long long *count, float *out) {
    __shared__ double red[32];
    double part = 0.0;
    for (int64_t r = threadIdx.x; r < N; r += blockDim.x) part += row_loss[r];
    double total = block_sum_d(part, red);
    const double inv_counted = lce_inv(count);
    if (threadIdx.x == 0) *out = inv_counted > 0 ? (float)(total * inv_counted) : NAN;
}

/* Counts the rows not ignored into dev[1] (dev[0]: the first bad row, ~0 when none), on
 * the stream; dev is the caller's, freed by it after the kernels that read the count.
 * Outside a capture the result is read back (synchronizes) and a bad target fails here,
 * before anything is written; inside one nothing waits, and the kernels give a bad
 * target's row NaN. */
static lm_status check_and_count(const lm_tensor_view *targets, int64_t V, int64_t ignore, unsigned long long *dev,
                                 cudaStream_t s) {
    int64_t N = targets->shape[0], ts = targets->stride[0];
    int is64 = targets->dtype == LM_I64;
    unsigned long long host[2] = {~0ull, 0ull};
    lm_status st = lm__cuda_check(cudaMemsetAsync(dev, 0xff, sizeof *dev, s), "cudaMemsetAsync");
    if (st == LM_OK) st = lm__cuda_check(cudaMemsetAsync(dev + 1, 0, sizeof *dev, s), "cudaMemsetAsync");
    if (st == LM_OK && N > 0) {
        lce_check_kernel<<<lm__cuda_blocks(N, 256), 256, 0, s>>>(targets->data, is64, ts, N, V, ignore, dev, dev + 1);
        st = lm__cuda_launched("linear_cross_entropy target check");
    }
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (st == LM_OK) st = lm__cuda_check(cudaStreamIsCapturing(s, &cs), "cudaStreamIsCapturing");
    if (st != LM_OK || cs != cudaStreamCaptureStatusNone) return st;
    st = lm__cuda_check(cudaMemcpyAsync(host, dev, sizeof host, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
    if (st == LM_OK) st = lm__cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize (linear_cross_entropy)");
    if (st == LM_OK && host[0] != ~0ull) {
        int64_t r = (int64_t)host[0], v = 0;
        int32_t v32 = 0;
        const char *p = (const char *)targets->data + r * ts * (int64_t)lm_dtype_size(targets->dtype);
        st = lm__cuda_check(cudaMemcpy(is64 ? (void *)&v : (void *)&v32, p, lm_dtype_size(targets->dtype),
                                       cudaMemcpyDeviceToHost), "cudaMemcpy");
        if (!is64) v = v32;
        if (st == LM_OK)
            st = lm__error(LM_OUT_OF_RANGE,
                           "linear_cross_entropy: targets[%lld] = %lld is outside [0, %lld) and is not ignore_index %lld",
                           (long long)r, (long long)v, (long long)V, (long long)ignore);
    }
    return st;
}

/* The [2] counters of check_and_count (the kernels read [1], the count), stream-ordered
 * (a capture records the allocation). */
static lm_status count_alloc(unsigned long long **dev, cudaStream_t s) {
    return lm__cuda_check(cudaMallocAsync((void **)dev, 2 * sizeof **dev, s), "cudaMallocAsync (linear_cross_entropy)");
}

static lm_status device_tensor(lm_dtype dt, int64_t rows, int64_t cols, const lm_tensor_view *like,
                               lm_tensor **out) {
    int64_t shape[2] = {rows, cols};
    return lm_tensor_create(like->device, dt, 2, shape, out);
}

/* z [c, V] (x's dtype) = x rows [r0, r0 + c) @ w^T. */
static lm_status chunk_logits(const lm__cuda_blas *blas, const lm_tensor_view *x, const lm_tensor_view *w,
                              int64_t r0, int64_t c, const lm_tensor *zt, lm_tensor_view *z, cudaStream_t s) {
    lm_tensor_view xs, wt;
    LM_TRY(lm_tensor_view_slice(x, 0, r0, r0 + c, 1, &xs));
    LM_TRY(lm_tensor_view_slice(lm_tensor_as_view(zt), 0, 0, c, 1, z));
    LM_TRY(lm_tensor_view_transpose(w, 0, 1, &wt));
    return lm__cuda_matmul_lt_ex(blas, &xs, &wt, z, 0, s);
}

static int64_t g_chunk_elems = (int64_t)1 << 29;

extern "C" void lm__cuda_linear_ce_set_chunk_elems(int64_t elems) { g_chunk_elems = elems > 0 ? elems : (int64_t)1 << 29; }

static int64_t chunk_rows(int64_t N, int64_t V) {
    int64_t c = g_chunk_elems / V;
    return c < 1 ? 1 : c > N ? N : c;
}

lm_status lm__cuda_linear_cross_entropy(const lm__cuda_blas *blas, const lm_tensor_view *x, const lm_tensor_view *w,
                                       const lm_tensor_view *targets, int64_t ignore_index,
                                       const lm_tensor_view *loss, cudaStream_t s) {
    int64_t N = x->shape[0], V = w->shape[0];
    unsigned long long *count = NULL;
    LM_TRY(count_alloc(&count, s));
    lm_status st = check_and_count(targets, V, ignore_index, count, s);
    int64_t C = chunk_rows(N, V);
    lm_tensor *zt = NULL, *lt = NULL;
    if (st == LM_OK) st = device_tensor(x->dtype, C, V, x, &zt);
    int64_t n1 = N > 0 ? N : 1;
    if (st == LM_OK) st = lm_tensor_create(x->device, LM_I64, 1, &n1, &lt); /* 8-byte rows of double */
    double *row_loss = lt ? (double *)lm_tensor_data(lt) : NULL;
    int is64 = targets->dtype == LM_I64;
    for (int64_t r0 = 0; st == LM_OK && r0 < N; r0 += C) {
        int64_t c = LM_MIN(C, N - r0);
        lm_tensor_view z;
        st = chunk_logits(blas, x, w, r0, c, zt, &z, s);
        if (st == LM_OK) {
            const char *tp = (const char *)targets->data + r0 * targets->stride[0] * (int64_t)lm_dtype_size(targets->dtype);
            LM_TRY(lm__cuda_float_only(z.dtype));
            LM__CUDA_FLOAT_SWITCH(z.dtype, T,
                                 lce_loss_rows<T><<<(unsigned)c, LCE_THREADS, 0, s>>>(
                                     (const T *)z.data, V, tp, is64, targets->stride[0], ignore_index, row_loss + r0));
            st = lm__cuda_launched("linear_cross_entropy loss rows");
        }
    }
    if (st == LM_OK) {
        lce_mean_kernel<<<1, LCE_MEAN_THREADS, 0, s>>>(row_loss, N, count + 1, (float *)loss->data);
        st = lm__cuda_launched("linear_cross_entropy mean");
    }
    cudaFreeAsync(count, s);
    lm_tensor_destroy(zt);
    lm_tensor_destroy(lt);
    return st;
}

lm_status lm__cuda_linear_cross_entropy_backward(const lm__cuda_blas *blas, const lm_tensor_view *x,
                                                const lm_tensor_view *w, const lm_tensor_view *targets,
                                                int64_t ignore_index, const lm_tensor_view *dloss,
                                                const lm_tensor_view *dx, const lm_tensor_view *dw,
                                                const lm_tensor_view *loss, cudaStream_t s) {
    int64_t N = x->shape[0], V = w->shape[0];
    unsigned long long *count = NULL;
    LM_TRY(count_alloc(&count, s));
    lm_status st = check_and_count(targets, V, ignore_index, count, s);
    int64_t C = chunk_rows(N, V), n1 = N > 0 ? N : 1;
    lm_tensor *zt = NULL, *acc = NULL, *lt = NULL;
    if (st == LM_OK) st = device_tensor(x->dtype, C, V, x, &zt);
    if (st == LM_OK && loss) st = lm_tensor_create(x->device, LM_I64, 1, &n1, &lt); /* 8-byte rows of double */
    double *row_loss = lt ? (double *)lm_tensor_data(lt) : NULL;
    int direct = dw && dw->dtype == LM_F32 && lm_tensor_view_is_contiguous(dw);
    if (st == LM_OK && dw && !direct) st = device_tensor(LM_F32, V, x->shape[1], x, &acc);
    lm_tensor_view accv = direct ? *dw : acc ? *lm_tensor_as_view(acc) : *w;
    int is64 = targets->dtype == LM_I64;
    for (int64_t r0 = 0; st == LM_OK && r0 < N; r0 += C) {
        int64_t c = LM_MIN(C, N - r0);
        lm_tensor_view z, dzT, xs, dxs;
        st = chunk_logits(blas, x, w, r0, c, zt, &z, s);
        const lm_tensor_view dz = z;
        if (st == LM_OK) {
            const char *tp = (const char *)targets->data + r0 * targets->stride[0] * (int64_t)lm_dtype_size(targets->dtype);
            LM_TRY(lm__cuda_float_only(dz.dtype));
            LM__CUDA_FLOAT_SWITCH(dz.dtype, T,
                                 lce_grad_rows<T><<<(unsigned)c, LCE_THREADS, 0, s>>>(
                                     (T *)z.data, V, tp, is64, targets->stride[0], ignore_index,
                                     dloss ? (const float *)dloss->data : NULL, count + 1, row_loss ? row_loss + r0 : NULL));
            st = lm__cuda_launched("linear_cross_entropy gradient rows");
        }
        if (st == LM_OK && dx && (st = lm_tensor_view_slice(dx, 0, r0, r0 + c, 1, &dxs)) == LM_OK)
            st = lm__cuda_matmul_lt_ex(blas, &dz, w, &dxs, 0, s);
        if (st == LM_OK && dw && (st = lm_tensor_view_transpose(&dz, 0, 1, &dzT)) == LM_OK &&
            (st = lm_tensor_view_slice(x, 0, r0, r0 + c, 1, &xs)) == LM_OK)
            st = lm__cuda_matmul_lt_ex(blas, &dzT, &xs, &accv, r0 > 0, s);
    }
    if (st == LM_OK && dw && N == 0) st = lm__cuda_check(cudaMemsetAsync(accv.data, 0, (size_t)lm_tensor_view_numel(&accv) * 4, s), "cudaMemsetAsync");
    if (st == LM_OK && acc) st = lm__cuda_cast(lm_tensor_as_view(acc), dw, s);
    if (st == LM_OK && loss) {
        lce_mean_kernel<<<1, LCE_MEAN_THREADS, 0, s>>>(row_loss, N, count + 1, (float *)loss->data);
        st = lm__cuda_launched("linear_cross_entropy mean");
    }
    cudaFreeAsync(count, s);
    lm_tensor_destroy(zt);
    lm_tensor_destroy(acc);
    lm_tensor_destroy(lt);
    return st;
}
