/* ops/cuda/embedding.cu — embedding lookup on CUDA.
 *
 * Readable: every id is checked first by a kernel that records the smallest bad
 * linear position (atomicMin), read back after a stream synchronization, so a bad id
 * fails with the reference's message before anything is written (while a context
 * captures work it cannot synchronize: the copy kernel then writes NaN rows for bad
 * ids and reads nothing out of bounds). Then one thread per output element copies
 * table[id, d] (same dtype: an exact copy). O(numel(out)).
 * embedding_widen (the model step): rows of a bf16 table widened to the f32 residual
 * stream; a bad id gives a NaN row.
 */
#include "ops/cuda/common.cuh"

__device__ __forceinline__ int64_t id_at(const void *ids, int is64, int64_t off) {
    return is64 ? ((const int64_t *)ids)[off] : (int64_t)((const int32_t *)ids)[off];
}

static __global__ void check_ids_kernel(const void *ids, int is64, lm__cuda_nd nid, int64_t n, int64_t vocab,
                                 unsigned long long *first) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t id = id_at(ids, is64, nd_offset(nid, i));
        if (id < 0 || id >= vocab) atomicMin(first, (unsigned long long)i);
    }
}

template <typename T>
__global__ void embedding_kernel(const T *table, int64_t ts0, int64_t ts1, int64_t vocab, const void *ids, int is64,
                                 lm__cuda_nd nid, T *out, lm__cuda_nd no, int64_t n, int64_t D) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = i / D, d = i - row * D;
        int64_t id = id_at(ids, is64, nd_offset(nid, row));
        if (id >= 0 && id < vocab) out[nd_offset(no, i)] = table[id * ts0 + d * ts1];
        else st(out + nd_offset(no, i), NAN); /* only unchecked (captured) calls reach this */
    }
}

/* Smallest linear position of an id outside [0, vocab), or -1. Synchronizes s. */
static lm_status first_bad_id(const lm_tensor_view *ids, int64_t vocab, cudaStream_t s, int64_t *pos, int64_t *value) {
    int64_t n = lm_tensor_view_numel(ids);
    int is64 = ids->dtype == LM_I64;
    lm__cuda_nd nid = lm__cuda_nd_of(ids);
    unsigned long long *dev = NULL, bad = ~0ull;
    *pos = -1;
    LM_TRY(lm__cuda_check(cudaMallocAsync((void **)&dev, sizeof bad, s), "cudaMallocAsync (embedding check)"));
    lm_status st = lm__cuda_check(cudaMemcpyAsync(dev, &bad, sizeof bad, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    if (st == LM_OK) {
        check_ids_kernel<<<lm__cuda_blocks(n, 256), 256, 0, s>>>(ids->data, is64, nid, n, vocab, dev);
        st = lm__cuda_launched("embedding id check");
    }
    if (st == LM_OK) st = lm__cuda_check(cudaMemcpyAsync(&bad, dev, sizeof bad, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
    if (st == LM_OK) st = lm__cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize (embedding check)");
    cudaFreeAsync(dev, s);
    LM_TRY(st);
    if (bad == ~0ull) return LM_OK;
    *pos = (int64_t)bad;
    int64_t off = 0, i = (int64_t)bad;
    for (int d = nid.ndim - 1; d >= 0; d--) {
        off += (i % nid.shape[d]) * nid.stride[d];
        i /= nid.shape[d];
    }
    int64_t v64 = 0;
    int32_t v32 = 0;
    const char *base = (const char *)ids->data + off * (int64_t)lm_dtype_size(ids->dtype);
    LM_TRY(lm__cuda_check(cudaMemcpy(is64 ? (void *)&v64 : (void *)&v32, base, lm_dtype_size(ids->dtype),
                                     cudaMemcpyDeviceToHost), "cudaMemcpy"));
    *value = is64 ? v64 : v32;
    return LM_OK;
}

lm_status lm__cuda_embedding(const lm_tensor_view *table, const lm_tensor_view *ids, const lm_tensor_view *out,
                            cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(out), vocab = table->shape[0], D = table->shape[1];
    if (lm_tensor_view_numel(ids) == 0 || n == 0) return LM_OK;
    int64_t pos = -1, value = 0;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    LM_TRY(lm__cuda_check(cudaStreamIsCapturing(s, &cap), "cudaStreamIsCapturing"));
    if (cap == cudaStreamCaptureStatusNone) LM_TRY(first_bad_id(ids, vocab, s, &pos, &value)); /* a capture cannot wait */
    if (pos >= 0) {
        char where[160];
        size_t k = (size_t)snprintf(where, sizeof where, "[");
        for (int d = 0; d < ids->ndim && k < sizeof where; d++) { /* row-major index of pos */
            int64_t inner = 1;
            for (int e = d + 1; e < ids->ndim; e++) inner *= ids->shape[e];
            k += (size_t)snprintf(where + k, sizeof where - k, d ? ", %lld" : "%lld",
                                  (long long)((pos / inner) % ids->shape[d]));
        }
        if (k < sizeof where) snprintf(where + k, sizeof where - k, "]");
        return lm__error(LM_OUT_OF_RANGE, "embedding: ids%s = %lld is outside [0, %lld) (vocab size %lld)", where,
                         (long long)value, (long long)vocab, (long long)vocab);
    }
    if (out->dtype != table->dtype) { /* widening: the model step's bf16 table into the f32 residual stream */
        if (table->dtype != LM_BF16 || out->dtype != LM_F32 || ids->dtype != LM_I32 ||
            !lm_tensor_view_is_contiguous(table) || !lm_tensor_view_is_contiguous(ids) ||
            !lm_tensor_view_is_contiguous(out))
            return lm__error(LM_UNSUPPORTED, "embedding (cuda): a %s table into %s rows needs a contiguous bf16 table, "
                             "i32 ids and f32 rows", lm_dtype_name(table->dtype), lm_dtype_name(out->dtype));
        return lm__cuda_embedding_widen(table->data, (const int32_t *)ids->data, lm_tensor_view_numel(ids), vocab, D,
                                        (float *)out->data, s);
    }
    lm__cuda_nd nid = lm__cuda_nd_of(ids), no = lm__cuda_nd_of(out);
    int is64 = ids->dtype == LM_I64;
    LM_TRY(lm__cuda_float_only(table->dtype));
    LM__CUDA_FLOAT_SWITCH(table->dtype, T,
                         embedding_kernel<T><<<lm__cuda_blocks(n, 256), 256, 0, s>>>(
                             (const T *)table->data, table->stride[0], table->stride[1], vocab, ids->data, is64,
                             nid, (T *)out->data, no, n, D));
    return lm__cuda_launched("embedding kernel");
}

/* ---- the model step: bf16 table rows -> f32 residual stream ----------------------------------------- */
static __global__ void embedding_widen_kernel(const bf16 *table, const int32_t *ids, int64_t n, int64_t V, int64_t H,
                                       float *x) {
    pdl_trigger(); /* the first projection's GEMV may start streaming its weights */
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * H; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / H, d = i - r * H, id = ids[r];
        x[i] = id >= 0 && id < V ? __bfloat162float(table[id * H + d]) : NAN; /* a bad id reads nothing */
    }
}

lm_status lm__cuda_embedding_widen(const void *table, const int32_t *ids, int64_t n, int64_t V, int64_t H, float *x,
                                   cudaStream_t s) {
    if (n * H == 0) return LM_OK;
    embedding_widen_kernel<<<lm__cuda_blocks(n * H, 256), 256, 0, s>>>((const bf16 *)table, ids, n, V, H, x);
    return lm__cuda_launched("embedding_widen");
}
