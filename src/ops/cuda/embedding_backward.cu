/* ops/cuda/embedding_backward.cu — embedding backward on CUDA with duplicate ids,
 * deterministic (no float atomics):
 *  1. every id is checked (smallest bad position recorded with an integer atomicMin,
 *     read back after a stream synchronization): a bad id fails with the reference's
 *     message before anything is written; while the stream is captured (a training
 *     step as one graph) nothing waits: bad ids then add to no row;
 *  2. (id, position) pairs are sorted by id with CUB's stable radix sort, so each id's
 *     positions end up contiguous and in increasing position order;
 *  3. a pass over the sorted ids marks where each id's run starts and ends;
 *  4. one block per table row sums its run of dout rows in position order (f32, one
 *     thread per column, or per 16-byte vector of columns where rows are contiguous
 *     and aligned) and writes the row once; rows without a position get 0. When
 *     accumulating, the blocks go over the sorted positions instead and the one at the
 *     start of each run does its row: old value plus the run's sum (added after the
 *     sum, in f32, rounded once); rows of absent ids are not visited (a block per
 *     table row cost ~100 us for a 152k-row vocabulary with 8k positions).
 * O(n log V + n D + V D) work for n positions; 4 n + 2 V ints plus CUB's scratch.
 */
#include "ops/cuda/rows_vec.cuh"

#include <cub/device/device_radix_sort.cuh>

static __global__ void check_ids_bw_kernel(const void *ids, int is64, lm__cuda_nd nid, int64_t n, int64_t vocab,
                                    unsigned long long *first) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t id = ld_index_at(ids, is64, nd_offset(nid, i));
        if (id < 0 || id >= vocab) atomicMin(first, (unsigned long long)i);
    }
}

/* (id, position) pairs; an id outside [0, V) (unchecked in a capture) becomes V, which
 * sorts last, has its own run slot and no table row. */
static __global__ void pairs_kernel(const void *ids, int is64, lm__cuda_nd nid, int64_t n, int64_t V, int32_t *keys,
                                    int32_t *vals) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t id = ld_index_at(ids, is64, nd_offset(nid, i));
        keys[i] = (int32_t)(id >= 0 && id < V ? id : V);
        vals[i] = (int32_t)i;
    }
}

/* start[id] / end[id]: the run of id in the sorted keys (both 0 for absent ids; [V + 1],
 * the last for the bad ids). */
static __global__ void runs_kernel(const int32_t *keys, int64_t n, int32_t *start, int32_t *end) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int32_t k = keys[i];
        if (i == 0 || keys[i - 1] != k) start[k] = (int32_t)i;
        if (i == n - 1 || keys[i + 1] != k) end[k] = (int32_t)(i + 1);
    }
}

/* Accumulating, the kernels below go over sorted positions: 1 (with *v = the id) when
 * position i starts its id's run. */
static __device__ __forceinline__ bool run_start(const int32_t *keys, int64_t i, int64_t *v) {
    *v = keys[i];
    return i == 0 || keys[i - 1] != keys[i];
}

/* Row v of dtable = sum of dout rows at positions pos[start[v] .. end[v]) (keys: over
 * the sorted positions, rows added into; see run_start). dout's
 * leading dims are ids' shape (nrow), sd its last stride. */
template <typename T>
__global__ void rows_kernel(const T *dout, lm__cuda_nd nrow, int64_t sd, const int32_t *pos, const int32_t *start,
                            const int32_t *end, int64_t V, int64_t D, void *dt, int dt_dt, int64_t ts0, int64_t ts1,
                            const int32_t *keys, int64_t rows) {
    for (int64_t it = blockIdx.x; it < V; it += gridDim.x) {
        int64_t v = it;
        if (keys && (!run_start(keys, it, &v) || v >= rows)) continue; /* v = rows: the bad ids' run */
        int32_t s0 = start[v], s1 = end[v];
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
            float acc = 0.f;
            for (int32_t k = s0; k < s1; k++) acc += ld(dout + nd_offset(nrow, pos[k]) + d * sd);
            if (keys) acc = ld_dt(dt, dt_dt, v * ts0 + d * ts1) + acc;
            st_dt(dt, dt_dt, v * ts0 + d * ts1, acc);
        }
    }
}

/* The same sums over 16-byte vectors of columns (rows of dout and dtable contiguous and
 * 16-byte aligned, D a multiple of the vector): a thread owns a vector of columns of
 * its block's row and adds the run's dout rows in position order, as rows_kernel does
 * per column, so the results are the same bits. rd: dout's row descriptor (rows_flat). */
template <typename T, typename O>
__global__ void rows_vec_sum_kernel(const T *dout, lm__cuda_nd rd, const int32_t *pos, const int32_t *start,
                                    const int32_t *end, int64_t V, int nvec, O *dt, int64_t ts0, const int32_t *keys,
                                    int64_t rows) {
    constexpr int VEC = 16 / sizeof(T);
    for (int64_t it = blockIdx.x; it < V; it += gridDim.x) {
        int64_t v = it;
        if (keys && (!run_start(keys, it, &v) || v >= rows)) continue; /* v = rows: the bad ids' run */
        int32_t s0 = start[v], s1 = end[v];
        for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
            float acc[VEC];
#pragma unroll
            for (int e = 0; e < VEC; e++) acc[e] = 0.f;
            for (int32_t k = s0; k < s1; k++) {
                float f[VEC];
                unpack16(*(const uint4 *)(dout + row_off(rd, pos[k]) + (int64_t)c * VEC), f, dout);
#pragma unroll
                for (int e = 0; e < VEC; e++) acc[e] += f[e];
            }
            O *row = dt + v * ts0 + (int64_t)c * VEC;
            if (keys) {
                float old[VEC];
                for (int e = 0; e < VEC; e += 16 / (int)sizeof(O)) unpack16(*(const uint4 *)(row + e), old + e, row);
#pragma unroll
                for (int e = 0; e < VEC; e++) acc[e] = old[e] + acc[e];
            }
            pack_store<O>(row, acc, VEC);
        }
    }
}

/* The arguments of one rows_vec_sum_kernel launch but the data pointers. */
struct vec_launch {
    unsigned grid;
    int threads;
    lm__cuda_nd rd;
    const int32_t *pos, *start, *end;
    int64_t items;
    int nvec;
    int64_t ts0;
    const int32_t *keys;
    int64_t rows; /* the table's */
};

/* rows_vec_sum_kernel over dout elements T into a table of T, or of f32 (to_f32). */
template <typename T>
static void launch_vec(const vec_launch &l, const void *dout, void *table, bool to_f32, cudaStream_t s) {
    if (to_f32)
        rows_vec_sum_kernel<<<l.grid, l.threads, 0, s>>>((const T *)dout, l.rd, l.pos, l.start, l.end, l.items, l.nvec,
                                                          (float *)table, l.ts0, l.keys, l.rows);
    else
        rows_vec_sum_kernel<<<l.grid, l.threads, 0, s>>>((const T *)dout, l.rd, l.pos, l.start, l.end, l.items, l.nvec,
                                                          (T *)table, l.ts0, l.keys, l.rows);
}

/* LM_OUT_OF_RANGE naming the first bad id (synchronizes s), LM_OK when all are good. */
static lm_status check_ids(const lm_tensor_view *ids, int64_t V, cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(ids);
    int is64 = ids->dtype == LM_I64;
    lm__cuda_nd nid = lm__cuda_nd_of(ids);
    unsigned long long *dev = NULL, bad = ~0ull;
    LM_TRY(lm__cuda_check(cudaMallocAsync((void **)&dev, sizeof bad, s), "cudaMallocAsync (embedding_backward check)"));
    lm_status st = lm__cuda_check(cudaMemcpyAsync(dev, &bad, sizeof bad, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    if (st == LM_OK) {
        check_ids_bw_kernel<<<lm__cuda_blocks(n, 256), 256, 0, s>>>(ids->data, is64, nid, n, V, dev);
        st = lm__cuda_launched("embedding_backward id check");
    }
    if (st == LM_OK) st = lm__cuda_check(cudaMemcpyAsync(&bad, dev, sizeof bad, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
    if (st == LM_OK) st = lm__cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize (embedding_backward check)");
    cudaFreeAsync(dev, s);
    LM_TRY(st);
    if (bad == ~0ull) return LM_OK;
    int64_t off = 0, i = (int64_t)bad, v64 = 0;
    int32_t v32 = 0;
    for (int d = nid.ndim - 1; d >= 0; d--) {
        off += (i % nid.shape[d]) * nid.stride[d];
        i /= nid.shape[d];
    }
    const char *base = (const char *)ids->data + off * (int64_t)lm_dtype_size(ids->dtype);
    LM_TRY(lm__cuda_check(cudaMemcpy(is64 ? (void *)&v64 : (void *)&v32, base, lm_dtype_size(ids->dtype),
                                     cudaMemcpyDeviceToHost), "cudaMemcpy"));
    if (!is64) v64 = v32;
    return lm__error(LM_OUT_OF_RANGE, "embedding_backward: id %lld at position %lld is outside [0, %lld)",
                     (long long)v64, (long long)bad, (long long)V);
}

lm_status lm__cuda_embedding_backward(const lm_tensor_view *ids, const lm_tensor_view *dout,
                                     const lm_tensor_view *dtable, int accumulate, cudaStream_t s) {
    int64_t V = dtable->shape[0], D = dtable->shape[1], n = lm_tensor_view_numel(ids);
    if (V >= INT32_MAX || n >= INT32_MAX)
        return lm__error(LM_UNSUPPORTED, "embedding_backward: the CUDA kernel needs fewer than 2^31 ids and rows");
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    LM_TRY(lm__cuda_check(cudaStreamIsCapturing(s, &cap), "cudaStreamIsCapturing"));
    if (n > 0 && cap == cudaStreamCaptureStatusNone) LM_TRY(check_ids(ids, V, s)); /* a capture cannot wait */
    if (V == 0 || D == 0) return LM_OK;
    int end_bit = 1;
    while (end_bit < 31 && (1ll << end_bit) < V + 1) end_bit++; /* keys 0..V (V: a bad id) */
    size_t sort_bytes = 0;
    if (n > 0)
        LM_TRY(lm__cuda_check(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const int32_t *)NULL, (int32_t *)NULL,
                                                              (const int32_t *)NULL, (int32_t *)NULL, (int)n, 0, end_bit, s),
                              "cub::DeviceRadixSort (embedding_backward size)"));
    size_t head = ((size_t)(4 * n + 2 * (V + 1)) * sizeof(int32_t) + 255) / 256 * 256, bytes = head + sort_bytes;
    char *work = NULL; /* keys_in, vals_in, keys, pos [n]; start, end [V + 1]; CUB scratch */
    LM_TRY(lm__cuda_check(cudaMallocAsync((void **)&work, bytes, s), "cudaMallocAsync (embedding_backward)"));
    int32_t *keys_in = (int32_t *)work, *vals_in = keys_in + n, *keys = vals_in + n, *pos = keys + n;
    int32_t *start = pos + n, *end = start + V + 1;
    void *scratch = work + head; /* 256-byte aligned, as CUB expects */
    /* start/end of absent ids stay 0 (empty runs); accumulating never reads them */
    lm_status st = accumulate ? LM_OK
                              : lm__cuda_check(cudaMemsetAsync(start, 0, sizeof(int32_t) * 2 * (size_t)(V + 1), s),
                                               "cudaMemsetAsync");
    if (st == LM_OK && n > 0) {
        pairs_kernel<<<lm__cuda_blocks(n, 256), 256, 0, s>>>(ids->data, ids->dtype == LM_I64, lm__cuda_nd_of(ids), n, V,
                                                            keys_in, vals_in);
        st = lm__cuda_launched("embedding_backward pairs kernel");
        if (st == LM_OK)
            st = lm__cuda_check(cub::DeviceRadixSort::SortPairs(scratch, sort_bytes, keys_in, keys, vals_in, pos, (int)n,
                                                                0, end_bit, s),
                                "cub::DeviceRadixSort (embedding_backward)");
        if (st == LM_OK) {
            runs_kernel<<<lm__cuda_blocks(n, 256), 256, 0, s>>>(keys, n, start, end);
            st = lm__cuda_launched("embedding_backward runs kernel");
        }
    }
    /* the blocks' items: table rows, or (accumulating) sorted positions */
    int64_t items = accumulate ? n : V;
    const int32_t *kp = accumulate ? keys : NULL;
    if (items == 0) {
        cudaFreeAsync(work, s);
        return st;
    }
    int vec = 16 / (int)lm_dtype_size(dout->dtype);
    if (st == LM_OK && D % vec == 0 && rows_vec_ok(dout) && rows_vec_ok(dtable) &&
        (dtable->dtype == dout->dtype || dtable->dtype == LM_F32)) {
        unsigned g = (unsigned)LM_MIN(items, 65535 * 8);
        int nvec = (int)(D / vec), threads = nvec >= 256 ? 256 : (nvec + 31) / 32 * 32;
        const vec_launch l = {g, threads, rows_flat(dout), pos, start, end, items, nvec, dtable->stride[0], kp, V};
        const bool to_f32 = dtable->dtype == LM_F32;
        switch (dout->dtype) {
        case LM_F32: launch_vec<float>(l, dout->data, dtable->data, to_f32, s); break;
        case LM_BF16: launch_vec<bf16>(l, dout->data, dtable->data, to_f32, s); break;
        default: launch_vec<__half>(l, dout->data, dtable->data, to_f32, s); break;
        }
        st = lm__cuda_launched("embedding_backward rows kernel (vec)");
    } else if (st == LM_OK) {
        unsigned g = (unsigned)LM_MIN(items, 65535 * 8);
        int threads = D >= 256 ? 256 : 64;
        lm__cuda_nd nrow = lm__cuda_nd_of(dout);
        nrow.ndim = dout->ndim - 1;
        st = lm__cuda_float_only(dout->dtype);
        if (st == LM_OK)
            LM__CUDA_FLOAT_SWITCH(dout->dtype, T,
                             rows_kernel<T><<<g, threads, 0, s>>>((const T *)dout->data, nrow,
                                                                  dout->stride[dout->ndim - 1], pos, start, end, items, D,
                                                                  dtable->data, dtable->dtype, dtable->stride[0],
                                                                  dtable->stride[1], kp, V));
        if (st == LM_OK) st = lm__cuda_launched("embedding_backward rows kernel");
    }
    cudaFreeAsync(work, s);
    return st;
}
