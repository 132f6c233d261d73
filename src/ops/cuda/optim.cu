/* ops/cuda/optim.cu — the AdamW step and the sum of squares on CUDA.
 *
 * AdamW: one grid-stride kernel per tensor of the list (all queued on the stream, no
 * host waits), one thread per element, every operand read before any is written. The
 * arithmetic is the reference's, in double, rounding m and v to f32 before they feed
 * the update (what the next step will read): p *= 1 - lr wd; m = b1 m + (1 - b1) g;
 * v = b2 v + (1 - b2) g^2; p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
 * Sum of squares: each tensor is reduced by a fixed grid of SS_BLOCKS blocks into
 * per-block double partials (grid-stride order, fixed tree), then one block adds all
 * partials in a fixed order: the same bits on every run. O(total elements).
 */
#include "ops/cuda/backward.cuh"

#define SS_BLOCKS 256
#define SS_THREADS 256

struct adamw_args {
    double decay;     /* 1 - lr * weight_decay */
    double beta1, beta2;
    double step_size; /* lr / (1 - beta1^step) */
    double bc2_sqrt;  /* sqrt(1 - beta2^step) */
    double eps, grad_scale;
};

template <typename G>
__global__ void adamw_kernel(float *p, lm__cuda_nd np, const G *g, lm__cuda_nd ng, float *m, lm__cuda_nd nm, float *v,
                             lm__cuda_nd nv, int64_t n, adamw_args a) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t op = nd_offset(np, i), om = nd_offset(nm, i), ov = nd_offset(nv, i);
        double grad = (double)ld(g + nd_offset(ng, i)) * a.grad_scale;
        double pv = (double)p[op] * a.decay;
        float mf = (float)(a.beta1 * (double)m[om] + (1.0 - a.beta1) * grad);
        float vf = (float)(a.beta2 * (double)v[ov] + (1.0 - a.beta2) * grad * grad);
        m[om] = mf;
        v[ov] = vf;
        p[op] = (float)(pv - a.step_size * (double)mf / (sqrt((double)vf) / a.bc2_sqrt + a.eps));
    }
}

lm_status lm__cuda_adamw_update(int n, const lm_tensor_view *params, const lm_tensor_view *grads,
                               const lm_tensor_view *m, const lm_tensor_view *v, const float *weight_decay,
                               const lm_adamw_hparams *hp, cudaStream_t s) {
    adamw_args a;
    a.beta1 = hp->beta1;
    a.beta2 = hp->beta2;
    a.step_size = hp->lr / (1.0 - pow(hp->beta1, (double)hp->step));
    a.bc2_sqrt = sqrt(1.0 - pow(hp->beta2, (double)hp->step));
    a.eps = hp->eps;
    a.grad_scale = hp->grad_scale;
    for (int i = 0; i < n; i++) {
        int64_t count = lm_tensor_view_numel(&params[i]);
        if (count == 0) continue;
        a.decay = 1.0 - hp->lr * (double)weight_decay[i];
        unsigned blocks = lm__cuda_blocks(count, 256);
        lm__cuda_nd np = flat_nd(&params[i]), ng = flat_nd(&grads[i]), nm = flat_nd(&m[i]), nv = flat_nd(&v[i]);
        LM_TRY(lm__cuda_float_only(grads[i].dtype));
        LM__CUDA_FLOAT_SWITCH(grads[i].dtype, G,
                             adamw_kernel<G><<<blocks, 256, 0, s>>>((float *)params[i].data, np,
                                                                    (const G *)grads[i].data, ng, (float *)m[i].data,
                                                                    nm, (float *)v[i].data, nv, count, a));
        LM_TRY(lm__cuda_launched("adamw kernel"));
    }
    return LM_OK;
}

template <typename T>
__global__ void sum_squares_kernel(const T *x, lm__cuda_nd nx, int64_t n, double *partial) {
    __shared__ double red[32];
    double acc = 0.0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        double a = ld(x + nd_offset(nx, i));
        acc += a * a;
    }
    acc = block_sum_d(acc, red);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

/* One block of SS_BLOCKS threads: thread t adds slot t of every tensor in list order,
 * then the fixed block tree adds the threads. */
static __global__ void sum_partials_kernel(const double *partial, int n, float *out) {
    __shared__ double red[32];
    double acc = 0.0;
    for (int i = 0; i < n; i++) acc += partial[(int64_t)i * SS_BLOCKS + threadIdx.x];
    acc = block_sum_d(acc, red);
    if (threadIdx.x == 0) *out = (float)acc;
}

lm_status lm__cuda_sum_squares(int n, const lm_tensor_view *xs, const lm_tensor_view *out, cudaStream_t s) {
    double *partial = NULL; /* [n, SS_BLOCKS], zero for empty tensors */
    size_t bytes = sizeof(double) * (size_t)SS_BLOCKS * (size_t)(n > 0 ? n : 1);
    LM_TRY(lm__cuda_check(cudaMallocAsync((void **)&partial, bytes, s), "cudaMallocAsync (sum_squares)"));
    lm_status st = lm__cuda_check(cudaMemsetAsync(partial, 0, bytes, s), "cudaMemsetAsync (sum_squares)");
    for (int i = 0; st == LM_OK && i < n; i++) {
        int64_t count = lm_tensor_view_numel(&xs[i]);
        if (count == 0) continue;
        lm__cuda_nd nx = flat_nd(&xs[i]);
        double *slot = partial + (size_t)i * SS_BLOCKS;
        switch (xs[i].dtype) {
        case LM_F32: sum_squares_kernel<float><<<SS_BLOCKS, SS_THREADS, 0, s>>>((const float *)xs[i].data, nx, count, slot); break;
        case LM_BF16: sum_squares_kernel<bf16><<<SS_BLOCKS, SS_THREADS, 0, s>>>((const bf16 *)xs[i].data, nx, count, slot); break;
        default: sum_squares_kernel<__half><<<SS_BLOCKS, SS_THREADS, 0, s>>>((const __half *)xs[i].data, nx, count, slot); break;
        }
        st = lm__cuda_launched("sum_squares kernel");
    }
    if (st == LM_OK) {
        sum_partials_kernel<<<1, SS_BLOCKS, 0, s>>>(partial, n > 0 ? n : 1, (float *)out->data);
        st = lm__cuda_launched("sum_squares total kernel");
    }
    cudaFreeAsync(partial, s);
    return st;
}
