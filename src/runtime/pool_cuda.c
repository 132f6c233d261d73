/* runtime/pool_cuda.c — the caching CUDA allocator behind lm_device_alloc/free.
 *
 * Per device: a list of cached (free) blocks and a hash table of live blocks
 * (pointer -> rounded size), both under one mutex. Requests are rounded up (512 B
 * below 1 MiB, 2 MiB above) and served by the smallest cached block of at most 1.25x
 * the rounded size; otherwise cudaMalloc, and if that fails every cached block is
 * released and cudaMalloc is tried once more. When a freed block joins the cache,
 * queued work may still read or write it. With exactly one context stream alive on
 * the device (the usual case: one training or inference context) that is harmless:
 * every later user of the block is queued on that stream, after that work, and host
 * copies wait for the device first; so nothing waits, and a training step's
 * thousands of temporaries cost no synchronization. With no or several streams the
 * allocator cannot tell which stream last used a block, and freeing waits for the
 * device to finish its queued work (as cudaFree itself does). Creating a second
 * stream first waits for the device (runtime/device_cuda.c), which covers the blocks
 * freed without waiting before.
 * Statistics count rounded bytes. Blocks are only returned to the driver by
 * lm_device_empty_cache (or a failed cudaMalloc).
 * A captured step (train/trainer.c) holds a reservation: the blocks its capture
 * allocated stay its own until it is released (lm__cuda_pool_reserve), so the graph's
 * replays never share memory with anything allocated between them.
 */
#include "runtime/cuda.h"
#include "loom/trace.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>

#define LM__EMPTY ((uintptr_t)0)
#define LM__TOMB ((uintptr_t)1)

typedef struct blk {
    uintptr_t ptr; /* device address; LM__EMPTY/LM__TOMB mark free hash slots */
    size_t size;   /* rounded bytes */
    int owned;     /* a live block of the reservation (see below) */
} blk;

typedef struct pool {
    pthread_mutex_t mu;
    blk *cached;        /* [ncached] free blocks, unordered */
    size_t ncached;
    int64_t cached_cap; /* int64_t: lm__reserve's capacity type */
    blk *live;          /* [live_cap] open-addressing hash of blocks in use (power-of-two size) */
    size_t live_cap, live_used; /* live_used counts occupied + tombstone slots */
    lm_device_memory_stats st;
    /* the reservation of a captured step (lm__cuda_pool_reserve): while capturing,
     * allocations come from its free blocks (rfree) first, else from the cache or the
     * driver, and each becomes its; its blocks, when freed, go back to rfree rather than
     * the cache until the reservation is released, so no later allocation shares an
     * address the captured graph's replays write */
    int capturing, reserving;
    blk *rfree;
    size_t nrfree;
    int64_t rfree_cap;
    int64_t foreign; /* blocks from outside the reservation freed while capturing */
} pool;

static pool g_pools[LM__CUDA_MAX_DEVICES];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_all(void) {
    for (int i = 0; i < LM__CUDA_MAX_DEVICES; i++) pthread_mutex_init(&g_pools[i].mu, NULL);
}

static pool *get_pool(int index) {
    if (index < 0 || index >= LM__CUDA_MAX_DEVICES) return NULL;
    pthread_once(&g_once, init_all);
    return &g_pools[index];
}

static size_t round_size(size_t n) {
    const size_t small = 512, large = (size_t)2 << 20;
    return n < ((size_t)1 << 20) ? (n + small - 1) / small * small : (n + large - 1) / large * large;
}

static size_t hash_slot(uintptr_t p, size_t cap) {
    uint64_t h = (uint64_t)(p >> 9) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

static void live_put(blk *table, size_t cap, blk b) {
    size_t i = hash_slot(b.ptr, cap);
    while (table[i].ptr != LM__EMPTY && table[i].ptr != LM__TOMB) i = (i + 1) & (cap - 1);
    table[i] = b;
}

/* Makes room for one more live block: rehash into a table twice as large (or the
 * same size when tombstones fill it) once the load passes one half. */
static lm_status live_reserve(pool *p) {
    if (p->live_cap && (p->live_used + 1) * 2 <= p->live_cap) return LM_OK;
    size_t live = 0;
    for (size_t i = 0; i < p->live_cap; i++) live += p->live[i].ptr > LM__TOMB;
    size_t cap = p->live_cap ? p->live_cap : 256;
    while ((live + 1) * 2 > cap / 2) cap *= 2;
    blk *t = lm__calloc(cap, sizeof *t);
    if (!t) return LM_OUT_OF_MEMORY;
    for (size_t i = 0; i < p->live_cap; i++)
        if (p->live[i].ptr > LM__TOMB) live_put(t, cap, p->live[i]);
    lm__free(p->live);
    p->live = t;
    p->live_cap = cap;
    p->live_used = live;
    return LM_OK;
}

/* Removes ptr from the live table; returns its rounded size (0 if it is not there) and
 * whether it belongs to the reservation. */
static size_t live_take(pool *p, uintptr_t ptr, int *owned) {
    *owned = 0;
    if (!p->live_cap) return 0;
    for (size_t i = hash_slot(ptr, p->live_cap);; i = (i + 1) & (p->live_cap - 1)) {
        if (p->live[i].ptr == LM__EMPTY) return 0;
        if (p->live[i].ptr == ptr) {
            size_t n = p->live[i].size;
            *owned = p->live[i].owned;
            p->live[i].ptr = LM__TOMB;
            return n;
        }
    }
}

static lm_status cached_push(pool *p, blk b) { return LM__PUSH(p->cached, p->ncached, p->cached_cap, b); }

/* Index of the smallest block of list[0..n) fitting size within 1.25x, or -1. */
static int64_t best_fit(const blk *list, size_t n, size_t size) {
    int64_t best = -1;
    for (size_t i = 0; i < n; i++) {
        size_t s = list[i].size;
        if (s >= size && s <= size + size / 4 && (best < 0 || s < list[best].size)) best = (int64_t)i;
    }
    return best;
}

static int64_t cached_find(const pool *p, size_t size) { return best_fit(p->cached, p->ncached, size); }

static void release_cached(pool *p) {
    for (size_t i = 0; i < p->ncached; i++) {
        cudaFree((void *)p->cached[i].ptr);
        p->st.backend_frees++;
        p->st.reserved_bytes -= (int64_t)p->cached[i].size;
    }
    p->ncached = 0;
}

static void note_use(pool *p, size_t size) {
    p->st.current_bytes += (int64_t)size;
    int rose = p->st.current_bytes > p->st.peak_bytes;
    if (rose) p->st.peak_bytes = p->st.current_bytes;
    if (p->st.reserved_bytes > p->st.peak_reserved_bytes) p->st.peak_reserved_bytes = p->st.reserved_bytes;
    if (rose && lm_trace_enabled()) { /* the high-water mark as a trace counter (loom/trace.h) */
        char name[64];
        snprintf(name, sizeof name, "cuda:%d allocator peak (bytes)", (int)(p - g_pools));
        lm_trace_counter(name, (double)p->st.peak_bytes);
    }
}

/* cudaMalloc, allowed while this thread captures a stream (the block then belongs to
 * the reservation, which outlives the capture). */
static cudaError_t device_malloc(void **ptr, size_t size) {
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t e = cudaMalloc(ptr, size);
    cudaThreadExchangeStreamCaptureMode(&mode);
    return e;
}

/* Called with p->mu held. */
static lm_status pool_alloc(pool *p, size_t nbytes, void **out) {
    size_t size = round_size(nbytes);
    LM_TRY(live_reserve(p));
    int64_t rhit = p->capturing ? best_fit(p->rfree, p->nrfree, size) : -1;
    int64_t hit = rhit < 0 ? cached_find(p, size) : -1;
    blk b;
    if (rhit >= 0) {
        b = p->rfree[rhit];
        p->rfree[rhit] = p->rfree[--p->nrfree];
        p->st.cache_hits++;
    } else if (hit >= 0) {
        b = p->cached[hit];
        p->cached[hit] = p->cached[--p->ncached];
        p->st.cache_hits++;
    } else {
        void *ptr = NULL;
        cudaError_t e = device_malloc(&ptr, size);
        if (e == cudaErrorMemoryAllocation && !p->capturing) { /* a capture cannot free (cudaFree waits) */
            cudaGetLastError();
            release_cached(p);
            e = cudaMalloc(&ptr, size);
        }
        if (e != cudaSuccess) {
            cudaGetLastError();
            return lm__cuda_check(e, "cudaMalloc");
        }
        b = (blk){(uintptr_t)ptr, size, 0};
        p->st.backend_allocs++;
        p->st.reserved_bytes += (int64_t)size;
    }
    b.owned = p->capturing;
    live_put(p->live, p->live_cap, b);
    p->live_used++;
    note_use(p, b.size);
    *out = (void *)b.ptr;
    return LM_OK;
}

lm_status lm__cuda_alloc(int index, size_t nbytes, void **out) {
    *out = NULL;
    if (nbytes == 0) return LM_OK;
    LM_TRY(lm__cuda_check(cudaSetDevice(index), "cudaSetDevice"));
    pool *p = get_pool(index);
    if (!p) return lm__cuda_check(cudaMalloc(out, nbytes), "cudaMalloc");
    pthread_mutex_lock(&p->mu);
    lm_status st = pool_alloc(p, nbytes, out);
    pthread_mutex_unlock(&p->mu);
    return st;
}

void lm__cuda_free(int index, void *ptr) {
    if (!ptr || cudaSetDevice(index) != cudaSuccess) return;
    pool *p = get_pool(index);
    if (!p) {
        cudaFree(ptr);
        return;
    }
    if (lm__cuda_stream_count(index) != 1) cudaDeviceSynchronize(); /* queued work may still use the block */
    pthread_mutex_lock(&p->mu);
    int owned = 0;
    size_t size = live_take(p, (uintptr_t)ptr, &owned);
    if (size == 0) { /* not ours: hand it straight back to the driver */
        pthread_mutex_unlock(&p->mu);
        cudaFree(ptr);
        return;
    }
    p->st.current_bytes -= (int64_t)size;
    if (owned && p->reserving && LM__PUSH(p->rfree, p->nrfree, p->rfree_cap, ((blk){(uintptr_t)ptr, size, 0})) == LM_OK) {
        pthread_mutex_unlock(&p->mu);
        return;
    }
    if (p->capturing && !owned) p->foreign++;
    if (cached_push(p, (blk){(uintptr_t)ptr, size, 0}) != LM_OK) { /* no room to remember it: release it */
        cudaFree(ptr);
        p->st.backend_frees++;
        p->st.reserved_bytes -= (int64_t)size;
    }
    pthread_mutex_unlock(&p->mu);
}

lm_status lm__cuda_memory_stats(int index, lm_device_memory_stats *out) {
    pool *p = get_pool(index);
    if (!p) return lm__error(LM_OUT_OF_RANGE, "cuda:%d is beyond the allocator's %d devices", index, LM__CUDA_MAX_DEVICES);
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    pthread_mutex_unlock(&p->mu);
    return LM_OK;
}

lm_status lm__cuda_memory_reset_peak(int index) {
    pool *p = get_pool(index);
    if (!p) return lm__error(LM_OUT_OF_RANGE, "cuda:%d is beyond the allocator's %d devices", index, LM__CUDA_MAX_DEVICES);
    pthread_mutex_lock(&p->mu);
    p->st.peak_bytes = p->st.current_bytes;
    p->st.peak_reserved_bytes = p->st.reserved_bytes;
    pthread_mutex_unlock(&p->mu);
    return LM_OK;
}

lm_status lm__cuda_empty_cache(int index) {
    pool *p = get_pool(index);
    if (!p) return lm__error(LM_OUT_OF_RANGE, "cuda:%d is beyond the allocator's %d devices", index, LM__CUDA_MAX_DEVICES);
    LM_TRY(lm__cuda_check(cudaSetDevice(index), "cudaSetDevice"));
    pthread_mutex_lock(&p->mu);
    release_cached(p);
    pthread_mutex_unlock(&p->mu);
    return LM_OK;
}

lm_status lm__cuda_pool_reserve(int index, lm__reserve_phase phase, int64_t *foreign) {
    pool *p = get_pool(index);
    if (!p) return lm__error(LM_OUT_OF_RANGE, "cuda:%d is beyond the allocator's %d devices", index, LM__CUDA_MAX_DEVICES);
    lm_status st = LM_OK;
    pthread_mutex_lock(&p->mu);
    if (phase == LM__RESERVE_BEGIN) { /* a capture's allocations join the reservation */
        if (p->reserving)
            st = lm__error(LM_INVALID_ARGUMENT, "cuda:%d already holds a captured step's reservation", index);
        else
            p->capturing = p->reserving = 1, p->foreign = 0;
    } else if (phase == LM__RESERVE_CAPTURED) { /* end of the capture: the reservation stays */
        p->capturing = 0;
        if (foreign) *foreign = p->foreign;
    } else { /* LM__RESERVE_RELEASE: its free blocks to the cache, its live ones to their owners */
        for (size_t i = 0; i < p->nrfree; i++)
            if (cached_push(p, p->rfree[i]) != LM_OK) {
                cudaFree((void *)p->rfree[i].ptr);
                p->st.backend_frees++;
                p->st.reserved_bytes -= (int64_t)p->rfree[i].size;
            }
        p->nrfree = 0;
        for (size_t i = 0; i < p->live_cap; i++)
            if (p->live[i].ptr > LM__TOMB) p->live[i].owned = 0;
        p->capturing = p->reserving = 0;
    }
    pthread_mutex_unlock(&p->mu);
    return st;
}
