/* train/dist_cuda.c — data-parallel collectives on CUDA device buffers through NCCL
 * (built only with CUDA and nccl.h; train/dist_nocuda.c stands in otherwise).
 *
 * NCCL is loaded at run time (dlopen of libnccl.so.2, or the file LOOM_NCCL_LIBRARY
 * names), not linked: a CUDA build of loom runs on machines without NCCL, and only a
 * multi-GPU training run needs it (it then says clearly that it is missing). The build
 * takes NCCL's types from nccl.h; CMake compiles this file only when it finds that
 * header (train/dist_nocuda.c answers LM_UNSUPPORTED otherwise).
 *
 * Every collective is queued on the context's stream, in the stream order of the
 * backward that wrote the gradients and the optimizer that reads them: no host
 * synchronization. The ZeRO-1 slices may differ in size (bounds rounded to 16 floats),
 * so the reduce-scatter is one ncclReduce per slice to its owner and the all-gather
 * one ncclBroadcast per slice from its owner, each set in one NCCL group (one launch).
 * With two ranks a reduce's sum is the all-reduce's (a + b), as on the CPU.
 */
#include "train/internal.h"
#include "runtime/cuda.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

_Static_assert(sizeof(ncclUniqueId) == LM__NCCL_ID_BYTES, "ncclUniqueId is 128 bytes");

/* The NCCL entry points loom calls, resolved once. */
static struct {
    pthread_once_t once;
    void *lib;
    char error[512]; /* why it could not be loaded ("" when it was) */
    int version;
    ncclResult_t (*get_version)(int *);
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    const char *(*error_string)(ncclResult_t);
    const char *(*last_error)(ncclComm_t);
} nccl = {.once = PTHREAD_ONCE_INIT};

static void load_once(void) {
    const char *path = getenv("LOOM_NCCL_LIBRARY");
    if (!path || !*path) path = "libnccl.so.2";
    nccl.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!nccl.lib) {
        const char *why = dlerror();
        snprintf(nccl.error, sizeof nccl.error,
                 "NCCL could not be loaded (%s); install NCCL or name its library in "
                 "LOOM_NCCL_LIBRARY",
                 why ? why : path);
        return;
    }
    struct {
        void **fn;
        const char *name;
        int optional;
    } syms[] = {
        {(void **)&nccl.get_version, "ncclGetVersion", 0},
        {(void **)&nccl.get_unique_id, "ncclGetUniqueId", 0},
        {(void **)&nccl.comm_init_rank, "ncclCommInitRank", 0},
        {(void **)&nccl.comm_destroy, "ncclCommDestroy", 0},
        {(void **)&nccl.all_reduce, "ncclAllReduce", 0},
        {(void **)&nccl.reduce, "ncclReduce", 0},
        {(void **)&nccl.broadcast, "ncclBroadcast", 0},
        {(void **)&nccl.group_start, "ncclGroupStart", 0},
        {(void **)&nccl.group_end, "ncclGroupEnd", 0},
        {(void **)&nccl.error_string, "ncclGetErrorString", 0},
        {(void **)&nccl.last_error, "ncclGetLastError", 1},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].fn = dlsym(nccl.lib, syms[i].name);
        if (!*syms[i].fn && !syms[i].optional) {
            snprintf(nccl.error, sizeof nccl.error, "NCCL library '%s' lacks %s (NCCL 2.12 or newer is needed)", path,
                     syms[i].name);
            dlclose(nccl.lib);
            nccl.lib = NULL;
            return;
        }
    }
    if (nccl.get_version(&nccl.version) != ncclSuccess) nccl.version = 0;
}

lm_status lm__nccl_load(void) {
    pthread_once(&nccl.once, load_once);
    return nccl.lib ? LM_OK : lm__error(LM_UNSUPPORTED, "%s", nccl.error);
}

static lm_status nccl_fail(ncclResult_t rc, ncclComm_t comm, const char *what) {
    const char *detail = comm && nccl.last_error ? nccl.last_error(comm) : NULL;
    return lm__error(rc == ncclSystemError || rc == ncclRemoteError ? LM_IO_ERROR : LM_DEVICE_ERROR,
                     "NCCL: %s failed: %s%s%s", what, nccl.error_string(rc), detail && *detail ? ": " : "",
                     detail && *detail ? detail : "");
}
#define NCCL_TRY(call, comm, what)                                                                                     \
    do {                                                                                                               \
        ncclResult_t nccl_rc_ = (call);                                                                                \
        if (nccl_rc_ != ncclSuccess) return nccl_fail(nccl_rc_, comm, what);                                           \
    } while (0)

struct lm__nccl {
    ncclComm_t comm;
    int size, device;
    cudaStream_t side; /* the overlapped all-reduces' stream (made at the first) */
};

/* Work queued on `to` after this call waits for what is queued on `from` so far. */
static lm_status order_after(cudaStream_t to, cudaStream_t from) {
    cudaEvent_t e;
    LM_TRY(lm__cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags"));
    lm_status st = lm__cuda_check(cudaEventRecord(e, from), "cudaEventRecord");
    if (st == LM_OK) st = lm__cuda_check(cudaStreamWaitEvent(to, e, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(e); /* released once the wait has passed it */
    return st;
}

lm_status lm__nccl_unique_id(unsigned char id[LM__NCCL_ID_BYTES]) {
    LM_TRY(lm__nccl_load());
    ncclUniqueId u;
    NCCL_TRY(nccl.get_unique_id(&u), NULL, "ncclGetUniqueId");
    memcpy(id, u.internal, LM__NCCL_ID_BYTES);
    return LM_OK;
}

lm_status lm__nccl_create(int nranks, int rank, const unsigned char id[LM__NCCL_ID_BYTES], lm_device dev,
                          lm__nccl **out) {
    *out = NULL;
    if (dev.type != LM_DEVICE_CUDA) return lm__error(LM_INVALID_ARGUMENT, "NCCL collectives need a CUDA device");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return lm__error(LM_INVALID_ARGUMENT, "NCCL: rank %d of %d ranks", rank, nranks);
    LM_TRY(lm__nccl_load());
    LM_TRY(lm__cuda_check(cudaSetDevice(dev.index), "cudaSetDevice"));
    lm__nccl *c = lm__calloc(1, sizeof *c);
    if (!c) return LM_OUT_OF_MEMORY;
    ncclUniqueId u;
    memcpy(u.internal, id, LM__NCCL_ID_BYTES);
    ncclResult_t rc = nccl.comm_init_rank(&c->comm, nranks, u, rank);
    if (rc != ncclSuccess) {
        lm__free(c);
        return nccl_fail(rc, NULL, "ncclCommInitRank");
    }
    c->size = nranks, c->device = dev.index;
    *out = c;
    return LM_OK;
}

void lm__nccl_destroy(lm__nccl *c) {
    if (!c) return;
    if (c->comm) nccl.comm_destroy(c->comm);
    if (c->side) {
        cudaStreamSynchronize(c->side);
        cudaStreamDestroy(c->side);
    }
    lm__free(c);
}

int lm__nccl_version(void) {
    pthread_once(&nccl.once, load_once);
    return nccl.version;
}

/* The stream of ctx, after checking that ctx computes on the communicator's GPU. */
static lm_status stream_of(const lm__nccl *c, lm_ctx *ctx, cudaStream_t *s) {
    lm_device d = lm_ctx_device(ctx);
    if (d.type != LM_DEVICE_CUDA || d.index != c->device)
        return lm__error(LM_INVALID_ARGUMENT, "NCCL: the context is not on cuda:%d, the communicator's GPU", c->device);
    *s = (cudaStream_t)lm_ctx_stream(ctx);
    return lm__cuda_check(cudaSetDevice(c->device), "cudaSetDevice");
}

lm_status lm__nccl_allreduce_f32_overlapped(lm__nccl *c, lm_ctx *ctx, float *buf, int64_t n) {
    cudaStream_t s = NULL;
    LM_TRY(stream_of(c, ctx, &s));
    if (n <= 0) return LM_OK;
    if (!c->side)
        LM_TRY(lm__cuda_check(cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
    LM_TRY(order_after(c->side, s));
    NCCL_TRY(nccl.all_reduce(buf, buf, (size_t)n, ncclFloat32, ncclSum, c->comm, c->side), c->comm, "ncclAllReduce");
    return LM_OK;
}

lm_status lm__nccl_join(lm__nccl *c, lm_ctx *ctx) {
    cudaStream_t s = NULL;
    LM_TRY(stream_of(c, ctx, &s));
    return c->side ? order_after(s, c->side) : LM_OK;
}

/* One reduce (to its owner) or broadcast (from its owner) per slice, in one group. */
static lm_status per_slice(lm__nccl *c, lm_ctx *ctx, float *buf, const int64_t *bounds, int broadcast) {
    cudaStream_t s = NULL;
    LM_TRY(stream_of(c, ctx, &s));
    NCCL_TRY(nccl.group_start(), c->comm, "ncclGroupStart");
    ncclResult_t rc = ncclSuccess;
    for (int r = 0; r < c->size && rc == ncclSuccess; r++) {
        float *slice = buf + bounds[r];
        size_t count = (size_t)(bounds[r + 1] - bounds[r]);
        if (count && broadcast)
            rc = nccl.broadcast(slice, slice, count, ncclFloat32, r, c->comm, s);
        else if (count)
            rc = nccl.reduce(slice, slice, count, ncclFloat32, ncclSum, r, c->comm, s);
    }
    ncclResult_t end = nccl.group_end();
    if (rc != ncclSuccess) return nccl_fail(rc, c->comm, broadcast ? "ncclBroadcast" : "ncclReduce");
    if (end != ncclSuccess) return nccl_fail(end, c->comm, "ncclGroupEnd");
    return LM_OK;
}

lm_status lm__nccl_reduce_scatter_f32(lm__nccl *c, lm_ctx *ctx, float *buf, const int64_t *bounds) {
    return per_slice(c, ctx, buf, bounds, 0);
}

lm_status lm__nccl_allgather_f32(lm__nccl *c, lm_ctx *ctx, float *buf, const int64_t *bounds) {
    return per_slice(c, ctx, buf, bounds, 1);
}
