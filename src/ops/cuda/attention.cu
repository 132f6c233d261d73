/* ops/cuda/attention.cu — readable grouped-query attention on CUDA.
 *
 * One block per query row (b, h, i). Keys are visited in chunks of CHUNK with an
 * online softmax: the chunk's scores scale * q.k_j go to shared memory, the running
 * max m and sum l are updated (earlier contributions rescaled by exp(m_old - m_new)),
 * and the Dv accumulators in shared memory gather p_j * v_j. Query head h reads kv
 * head h / (Hq / Hkv); K and V are indexed in place through their strides. Causal rows
 * see keys j <= i + (Tk - Tq), and with a window only the last `window` of those; a
 * row with no key is 0, as in the reference.
 * O(B * Hq * Tq * Tk * (D + Dv)) work, (CHUNK + Dv) floats of shared memory.
 * bf16 views with head dim 64 or 128 take the tensor-core flash kernel instead
 * (attention_flash.cu).
 */
#include "ops/cuda/common.cuh"

#define CHUNK 1024
#define MAX_DV 1024

template <typename T>
__global__ void attention_kernel(const T *q, lm__cuda_nd nq, const T *k, lm__cuda_nd nk, const T *v, lm__cuda_nd nv,
                                 T *out, lm__cuda_nd no, int64_t B, int causal, int64_t window, float scale) {
    extern __shared__ float sm[];
    float *p = sm, *acc = sm + CHUNK; /* p [CHUNK] chunk weights, acc [Dv] */
    __shared__ float red[32];
    int64_t Hq = nq.shape[1], Tq = nq.shape[2], D = nq.shape[3];
    int64_t Hkv = nk.shape[1], Tk = nk.shape[2], Dv = nv.shape[3], group = Hq / Hkv;
    for (int64_t row = blockIdx.x; row < B * Hq * Tq; row += gridDim.x) {
        int64_t i = row % Tq, h = (row / Tq) % Hq, b = row / (Tq * Hq), kvh = h / group;
        int64_t nkeys = causal ? i + (Tk - Tq) + 1 : Tk, first = window > 0 ? LM_MAX((int64_t)0, nkeys - window) : 0;
        const T *qr = q + b * nq.stride[0] + h * nq.stride[1] + i * nq.stride[2];
        const T *kb = k + b * nk.stride[0] + kvh * nk.stride[1];
        const T *vb = v + b * nv.stride[0] + kvh * nv.stride[1];
        for (int64_t e = threadIdx.x; e < Dv; e += blockDim.x) acc[e] = 0.f;
        float m = -INFINITY, l = 0.f; /* identical in every thread */
        for (int64_t c0 = first; c0 < nkeys; c0 += CHUNK) {
            int64_t cn = LM_MIN((int64_t)CHUNK, nkeys - c0);
            float cmax = -INFINITY;
            for (int64_t j = threadIdx.x; j < cn; j += blockDim.x) {
                const T *kr = kb + (c0 + j) * nk.stride[2];
                float dot = 0.f;
                for (int64_t d = 0; d < D; d++) dot += ld(qr + d * nq.stride[3]) * ld(kr + d * nk.stride[3]);
                p[j] = scale * dot;
                cmax = fmaxf(cmax, p[j]);
            }
            float m_new = fmaxf(m, block_max(cmax, red)); /* the barrier also publishes p */
            float alpha = expf(m - m_new), psum = 0.f;
            for (int64_t j = threadIdx.x; j < cn; j += blockDim.x) {
                p[j] = expf(p[j] - m_new);
                psum += p[j];
            }
            l = l * alpha + block_sum(psum, red);
            for (int64_t e = threadIdx.x; e < Dv; e += blockDim.x) {
                float a = acc[e] * alpha;
                for (int64_t j = 0; j < cn; j++) a += p[j] * ld(vb + (c0 + j) * nv.stride[2] + e * nv.stride[3]);
                acc[e] = a;
            }
            m = m_new;
            __syncthreads(); /* p is rewritten by the next chunk */
        }
        T *orow = out + b * no.stride[0] + h * no.stride[1] + i * no.stride[2];
        for (int64_t e = threadIdx.x; e < Dv; e += blockDim.x) st(orow + e * no.stride[3], nkeys > first ? acc[e] / l : 0.f);
        __syncthreads();
    }
}

lm_status lm__cuda_attention(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v, float scale,
                             int causal, int64_t window, const lm_tensor_view *out, cudaStream_t s) {
    if (lm_tensor_view_numel(out) == 0) return LM_OK;
    if (lm__cuda_flash_attention_supports(q, k, v, causal, out))
        return lm__cuda_flash_attention(q, k, v, scale, causal, window, out, s);
    int64_t Dv = v->shape[3], rows = q->shape[0] * q->shape[1] * q->shape[2];
    if (Dv > MAX_DV)
        return lm__error(LM_UNSUPPORTED, "attention (cuda): value head dim %lld exceeds %d", (long long)Dv, MAX_DV);
    size_t smem = sizeof(float) * (size_t)(CHUNK + Dv);
    unsigned g = (unsigned)LM_MIN(rows, 65535 * 8);
    LM_TRY(lm__cuda_float_only(q->dtype));
    LM__CUDA_FLOAT_SWITCH(q->dtype, T,
                         attention_kernel<T><<<g, 256, smem, s>>>(
                             (const T *)q->data, lm__cuda_nd_of(q), (const T *)k->data, lm__cuda_nd_of(k),
                             (const T *)v->data, lm__cuda_nd_of(v), (T *)out->data, lm__cuda_nd_of(out), q->shape[0],
                             causal, window, scale)); /* window is 0 unless causal (ops/attention.c) */
    return lm__cuda_launched("attention kernel");
}
