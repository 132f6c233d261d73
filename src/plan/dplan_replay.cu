/* plan/dplan_replay.cu — a decode schedule's skeleton on the GPU (plan/dplan_replay.h):
 * what the schedule's synchronization and streams cost on the device, with no
 * arithmetic and no real data, beside the cost model's prediction.
 *
 * One block per SM list (cooperative launch: every block resident, so a wait can only
 * be for an item some running block will finish), its items as a table in list order.
 * Per item: its threads wait for the dependencies together (thread t polls entries t,
 * t + 256, ... with ld.acquire.gpu: an item's flag until it holds this launch's epoch,
 * or an op's counter until it holds epoch x the op's items), a barrier; thread 0 starts
 * the next item's prefetch (its first prefetch bytes, TMA bulk copies into the other of
 * two shared-memory buffers, completing on that buffer's mbarrier); the block streams
 * the rest of this item's region (16-byte streaming loads, 8 in flight per thread,
 * xor-folded so they are not dropped) and waits for its prefetch; a barrier; thread 0
 * releases the item's flag (st.release.gpu) and/or adds one to its op's counter
 * (red.release.gpu.add), whichever some wait reads. The barrier before the release
 * orders the block's work before it; the acquire before the barrier orders the
 * dependencies' work before the block's. The next table entry and each thread's first
 * wait of the next item are loaded while the current item runs, so no dependent chain
 * of table reads sits between two items. Flags and counters keep their values between
 * launches; each launch waits for its own epoch, so nothing is reset. A wait of more
 * than 2^32 clock cycles (~2 s) marks the failure and every block leaves (after its
 * outstanding copy lands).
 *
 * Everything the kernel reads is set up on its own stream: a memset on the legacy
 * stream is not ordered before a kernel on a non-blocking one, and a counter zeroed
 * after the first items released it would hang their dependents.
 */
#include "ops/cuda/common.cuh"
#include "plan/dplan_sync.cuh"
#include "plan/dplan_replay.h"

#define RP_THREADS 256
#define RP_UNROLL 8
#define RP_BULK 16384u /* bytes per bulk copy instruction */

/* One position of an SM list, in list order: no indirection on the way to the next item. */
struct rp_entry {
    long long off, vecs; /* the item's region of buf, in 16-byte vectors */
    long long dep0;      /* its waits: ldeps[dep0 .. dep0 + ndep) */
    int item, ndep;
    int op;              /* the counter it adds to (rel & 2) */
    unsigned rel;        /* 1: releases its flag (someone waits on it); 2: adds to its op's counter */
};

struct rp_args {
    const int64_t *sm_begin;
    const rp_entry *ent;  /* [nitems] positions of the SM lists */
    const int32_t *ldeps; /* waits in list order: w >= 0 item w's flag, w < 0 op counter -w - 1 */
    const uint4 *buf;
    unsigned *flags;
    unsigned *counters;
    const int32_t *op_count;
    unsigned epoch;
    int64_t prefetch_vecs;
    unsigned *err; /* 1 + the item whose wait timed out */
    unsigned *sink;
};


/* Vectors [v0, v1) of buf by the block's threads, xor-folded. */
__device__ __forceinline__ unsigned rp_stream(const uint4 *buf, int64_t v0, int64_t v1) {
    unsigned h = 0;
    const int64_t step = (int64_t)blockDim.x * RP_UNROLL;
    for (int64_t v = v0 + threadIdx.x; v < v1; v += step) {
        uint4 r[RP_UNROLL];
#pragma unroll
        for (int u = 0; u < RP_UNROLL; u++) {
            int64_t j = v + (int64_t)u * blockDim.x;
            r[u] = j < v1 ? __ldcs(buf + j) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < RP_UNROLL; u++) h ^= r[u].x ^ r[u].y ^ r[u].z ^ r[u].w;
    }
    return h;
}

/* The weight prefetch: TMA bulk copies (cp.async.bulk) of an item's first bytes into one
 * of two shared-memory buffers, completing on that buffer's mbarrier. */
__device__ __forceinline__ unsigned rp_smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void rp_bar_init(uint64_t *bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(rp_smem_addr(bar)) : "memory");
}

/* thread 0: vectors [v0, v0 + nv) of buf into dst, bar's phase completing when they land */
__device__ __forceinline__ void rp_prefetch(uint64_t *bar, unsigned char *dst, const uint4 *buf, int64_t v0, int64_t nv) {
    const unsigned b = rp_smem_addr(bar), bytes = (unsigned)(nv * 16);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
    for (unsigned o = 0; o < bytes; o += RP_BULK) {
        const unsigned c = bytes - o < RP_BULK ? bytes - o : RP_BULK;
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         rp_smem_addr(dst + o)),
                     "l"((const unsigned char *)(buf + v0) + o), "r"(c), "r"(b)
                     : "memory");
    }
}

__device__ __forceinline__ void rp_bar_wait(uint64_t *bar, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(rp_smem_addr(bar)), "r"(parity)
                     : "memory");
}

__global__ void __launch_bounds__(RP_THREADS) rp_kernel(rp_args a) {
    extern __shared__ __align__(128) unsigned char rp_buf[]; /* 2 x prefetch bytes */
    __shared__ __align__(8) uint64_t bar[2];
    __shared__ int bail[2];
    unsigned h = 0;
    const int s = blockIdx.x, t = threadIdx.x;
    const int64_t k0 = a.sm_begin[s], k1 = a.sm_begin[s + 1];
    const size_t pbytes = (size_t)a.prefetch_vecs * 16;
    if (k0 >= k1) return;
    rp_entry cur = a.ent[k0];
    int w_cur = t < cur.ndep ? a.ldeps[cur.dep0 + t] : 0;
    if (t == 0) {
        rp_bar_init(&bar[0]), rp_bar_init(&bar[1]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        rp_prefetch(&bar[0], rp_buf, a.buf, cur.off, cur.vecs < a.prefetch_vecs ? cur.vecs : a.prefetch_vecs);
        bail[0] = bail[1] = 0;
    }
    __syncthreads();
    for (int64_t k = k0; k < k1; k++) {
        const int j = (int)(k - k0), slot = j & 1;
        const bool more = k + 1 < k1;
        const rp_entry nxt = a.ent[more ? k + 1 : k]; /* lands while this item waits */
        /* the dependencies polled by the block's threads together (one round trip when
         * they are all done); thread t's first one was loaded during the item before */
        const long long t0 = clock64();
        for (int d = t; d < cur.ndep; d += RP_THREADS) {
            const int32_t w = d == t ? w_cur : a.ldeps[cur.dep0 + d];
            const unsigned *f = w >= 0 ? a.flags + w : a.counters + (-w - 1);
            const unsigned want = w >= 0 ? a.epoch : a.epoch * (unsigned)a.op_count[-w - 1];
            /* counters only grow; a flag holds the last epoch that released it */
            while (w >= 0 ? lm__dp_ld_acquire(f) != want : (int)(lm__dp_ld_acquire(f) - want) < 0) {
                if (*(volatile unsigned *)a.err) {
                    bail[slot] = 1;
                    break;
                }
                if (clock64() - t0 > (1LL << 32)) {
                    atomicExch(a.err, (unsigned)cur.item + 1u);
                    bail[slot] = 1;
                    break;
                }
            }
        }
        __syncthreads();
        if (bail[slot]) { /* no copy may still be landing in this block's memory when it leaves */
            rp_bar_wait(&bar[slot], (unsigned)(j >> 1) & 1u);
            return;
        }
        /* the next item's weights start landing while this one streams and it waits (its
         * buffer's last reader, item j - 1, is done: its phase completed); bail[slot ^ 1]
         * was last read before the barrier above */
        if (t == 0) {
            bail[slot ^ 1] = 0;
            if (more)
                rp_prefetch(&bar[slot ^ 1], rp_buf + (size_t)(slot ^ 1) * pbytes, a.buf, nxt.off,
                            nxt.vecs < a.prefetch_vecs ? nxt.vecs : a.prefetch_vecs);
        }
        const int w_nxt = more && t < nxt.ndep ? a.ldeps[nxt.dep0 + t] : 0;
        const int64_t pre = cur.vecs < a.prefetch_vecs ? cur.vecs : a.prefetch_vecs;
        h ^= rp_stream(a.buf, cur.off + pre, cur.off + cur.vecs);
        rp_bar_wait(&bar[slot], (unsigned)(j >> 1) & 1u); /* this item's prefetched bytes */
        __syncthreads();
        if (t == 0) {
            if (cur.rel & 1u) lm__dp_st_release(a.flags + cur.item, a.epoch);
            if (cur.rel & 2u) lm__dp_add_release(a.counters + cur.op, 1u);
        }
        cur = nxt, w_cur = w_nxt;
    }
    if (h == 0x9e3779b9u) a.sink[0] = h; /* keeps the loads; practically never stores */
}

#define RP_TRY(call, what)                                                                                     \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess) {                                                                               \
            st = lm__cuda_check((int)e_, what);                                                                \
            goto done;                                                                                         \
        }                                                                                                      \
    } while (0)

template <typename T>
static cudaError_t rp_upload(T **dst, const T *src, int64_t n) {
    cudaError_t e = cudaMalloc((void **)dst, (size_t)(n > 0 ? n : 1) * sizeof(T));
    if (e == cudaSuccess && n > 0) e = cudaMemcpy(*dst, src, (size_t)n * sizeof(T), cudaMemcpyHostToDevice);
    return e;
}

extern "C" lm_status lm__dp_replay_cuda(const lm__dp_replay *r, double *mean_us, double *min_us) {
    lm_status st = LM_OK;
    int prev = 0, sm_count = 0, coop = 0, per_sm = 0;
    const int64_t n = r->nitems, ndeps = r->dep_begin[n];
    int64_t total = 0;
    rp_entry *ent = (rp_entry *)calloc((size_t)(n > 0 ? n : 1), sizeof(rp_entry));
    int32_t *ldeps = (int32_t *)malloc(sizeof(int32_t) * (size_t)(ndeps > 0 ? ndeps : 1));
    unsigned *rel = (unsigned *)calloc((size_t)(n > 0 ? n : 1), sizeof(unsigned));
    int64_t *d_sm = NULL;
    rp_entry *d_ent = NULL;
    int32_t *d_ldeps = NULL, *d_op_count = NULL;
    uint4 *d_buf = NULL;
    unsigned *d_flags = NULL, *d_counters = NULL, *d_err = NULL, *d_sink = NULL, err = 0;
    cudaStream_t stream = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double sum = 0, best = 0;
    const size_t smem = 2 * (size_t)(r->prefetch_bytes / 16 * 16);
    cudaGetDevice(&prev);
    if (!ent || !ldeps || !rel) {
        st = lm__error(LM_OUT_OF_MEMORY, "decode plan replay: tables of %lld items", (long long)n);
        goto done;
    }
    /* what each item must release: its flag where a wait names it, its op's counter where
     * a wait names the op */
    {
        unsigned char *op_ref = (unsigned char *)calloc((size_t)(r->nops > 0 ? r->nops : 1), 1);
        if (!op_ref) {
            st = lm__error(LM_OUT_OF_MEMORY, "decode plan replay: tables of %d ops", r->nops);
            goto done;
        }
        for (int64_t d = 0; d < ndeps; d++)
            if (r->deps[d] >= 0) rel[r->deps[d]] |= 1u;
            else op_ref[-r->deps[d] - 1] = 1;
        for (int64_t i = 0; i < n; i++)
            if (op_ref[r->item_op[i]]) rel[i] |= 2u;
        free(op_ref);
    }
    {
        int64_t *off = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1)), nd = 0;
        if (!off) {
            st = lm__error(LM_OUT_OF_MEMORY, "decode plan replay: tables of %lld items", (long long)n);
            goto done;
        }
        for (int64_t i = 0; i < n; i++) off[i] = total, total += r->bytes[i] / 16;
        for (int64_t k = 0; k < n; k++) { /* positions in list order */
            const int i = r->order[k];
            rp_entry e = {off[i], r->bytes[i] / 16, nd, i, (int)(r->dep_begin[i + 1] - r->dep_begin[i]), r->item_op[i],
                          rel[i]};
            ent[k] = e;
            for (int64_t d = r->dep_begin[i]; d < r->dep_begin[i + 1]; d++) ldeps[nd++] = r->deps[d];
        }
        free(off);
    }
    RP_TRY(cudaSetDevice(r->device), "decode plan replay: cudaSetDevice");
    RP_TRY(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, r->device), "decode plan replay: SMs");
    RP_TRY(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, r->device), "decode plan replay: attributes");
    if (smem > LM__DP_REPLAY_MAX_PREFETCH * 2) {
        st = lm__error(LM_INVALID_ARGUMENT, "decode plan replay: prefetch of %lld bytes an item; the replay prefetches at "
                       "most %d (two buffers in shared memory)", (long long)r->prefetch_bytes, LM__DP_REPLAY_MAX_PREFETCH);
        goto done;
    }
    RP_TRY(cudaFuncSetAttribute(rp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
           "decode plan replay: shared memory");
    RP_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rp_kernel, RP_THREADS, smem),
           "decode plan replay: occupancy");
    if (r->sms > sm_count || !coop || per_sm < 1) {
        st = lm__error(LM_INVALID_ARGUMENT, "decode plan replay: %d SM lists on a device of %d SMs (cooperative "
                       "launch %s, %d blocks a SM)", r->sms, sm_count, coop ? "yes" : "no", per_sm);
        goto done;
    }
    RP_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "decode plan replay: stream");
    RP_TRY(cudaEventCreate(&e0), "decode plan replay: events");
    RP_TRY(cudaEventCreate(&e1), "decode plan replay: events");
    RP_TRY(rp_upload(&d_sm, r->sm_begin, (int64_t)r->sms + 1), "decode plan replay: upload");
    RP_TRY(rp_upload(&d_ent, (const rp_entry *)ent, n), "decode plan replay: upload");
    RP_TRY(rp_upload(&d_ldeps, (const int32_t *)ldeps, ndeps), "decode plan replay: upload");
    RP_TRY(rp_upload(&d_op_count, r->op_count, (int64_t)r->nops), "decode plan replay: upload");
    RP_TRY(cudaMalloc((void **)&d_buf, (size_t)(total > 0 ? total : 1) * 16), "decode plan replay: stream buffer");
    RP_TRY(cudaMalloc((void **)&d_flags, sizeof(unsigned) * (size_t)(n + r->nops + 2)), "decode plan replay: counters");
    d_counters = d_flags + n, d_err = d_counters + r->nops, d_sink = d_err + 1;
    RP_TRY(cudaMemsetAsync(d_buf, 0x5a, (size_t)(total > 0 ? total : 1) * 16, stream), "decode plan replay: buffer");
    RP_TRY(cudaMemsetAsync(d_flags, 0, sizeof(unsigned) * (size_t)(n + r->nops + 2), stream),
           "decode plan replay: counters");
    /* the uploads went through the legacy stream, the memsets through this one */
    RP_TRY(cudaDeviceSynchronize(), "decode plan replay: setup");
    for (int step = 0; step <= r->steps; step++) { /* launch 0 is untimed */
        rp_args a = {d_sm,       d_ent,      d_ldeps, d_buf, d_flags, d_counters, d_op_count, (unsigned)step + 1u,
                     r->prefetch_bytes / 16, d_err, d_sink};
        void *args[] = {&a};
        float ms = 0;
        RP_TRY(cudaEventRecord(e0, stream), "decode plan replay: event");
        RP_TRY(cudaLaunchCooperativeKernel((const void *)rp_kernel, dim3((unsigned)r->sms), dim3(RP_THREADS), args, smem,
                                           stream),
               "decode plan replay: launch");
        RP_TRY(cudaEventRecord(e1, stream), "decode plan replay: event");
        RP_TRY(cudaEventSynchronize(e1), "decode plan replay: kernel");
        RP_TRY(cudaEventElapsedTime(&ms, e0, e1), "decode plan replay: timing");
        RP_TRY(cudaMemcpyAsync(&err, d_err, sizeof err, cudaMemcpyDeviceToHost, stream), "decode plan replay: flags");
        RP_TRY(cudaStreamSynchronize(stream), "decode plan replay: flags");
        if (err) {
            st = lm__error(LM_INTERNAL, "decode plan replay: item %u waited more than 2^32 cycles for a dependency "
                           "(launch %d)", err - 1u, step);
            goto done;
        }
        if (step == 0) continue;
        sum += ms * 1e3;
        if (step == 1 || ms * 1e3 < best) best = ms * 1e3;
    }
    *mean_us = r->steps > 0 ? sum / r->steps : 0;
    *min_us = best;
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (stream) cudaStreamDestroy(stream);
    cudaFree(d_sm), cudaFree(d_ent), cudaFree(d_ldeps), cudaFree(d_op_count), cudaFree(d_buf), cudaFree(d_flags);
    free(ent), free(ldeps), free(rel);
    cudaSetDevice(prev);
    return st;
}
