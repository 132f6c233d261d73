/* train/dist.c — the data-parallel communicator (lm_dist): N processes ("ranks")
 * launched together by MPI (`mpirun -np N loom train ...`), each holding the whole
 * model; the trainer sums gradients, losses and flags over them.
 *
 * Built with MPI (LOOM_HAVE_MPI), lm_dist_create calls MPI_Init_thread (funneled: only
 * the thread that created the lm_dist calls MPI) when the environment says a launcher
 * started the process, and lm_dist_destroy calls MPI_Finalize. Otherwise, and in any
 * build when no launcher is seen, it is a world of one rank in which every collective
 * is the identity, so the single-process trainer runs the same code. A build without
 * MPI that sees a launcher with more than one rank refuses, rather than training N
 * independent copies that each believe they are alone.
 *
 * Under ZeRO-1 the trainer also reduce-scatters the gradients, all-gathers the weights
 * and gathers the optimizer moments at rank 0 over the ranks' slices of the flat
 * buffers (lm__dist_reduce_scatter_f32 and its siblings).
 *
 * Collectives use MPI's default error handler (errors are fatal to the whole job), so
 * a failed or lost rank ends every rank instead of leaving them waiting.
 */
#include "train/internal.h"
#include "runtime/internal.h"

#include <stdlib.h>
#include <string.h>

#ifdef LOOM_HAVE_MPI
#include <mpi.h>
#endif

struct lm_dist {
    int rank, size;             /* in the world communicator */
    int local_rank, local_size; /* among the ranks of this host */
    int mpi;                    /* 1: this object initialised MPI (finalize on destroy) */
};

/* The world size a launcher announces in the environment (Open MPI, MPICH/Hydra and
 * Slurm's PMI, MVAPICH), or 0 when none does. */
static int launcher_size(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v) > 0 ? atoi(v) : 0;
    }
    return 0;
}

int lm_dist_available(void) {
#ifdef LOOM_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

#ifdef LOOM_HAVE_MPI
static lm_status mpi_fail(int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    return lm__error(LM_IO_ERROR, "MPI: %s failed: %s", what, msg);
}
#define MPI_TRY(call, what)                                                                                        \
    do {                                                                                                           \
        int mpi_rc_ = (call);                                                                                      \
        if (mpi_rc_ != MPI_SUCCESS) return mpi_fail(mpi_rc_, what);                                                \
    } while (0)

static lm_status mpi_start(lm_dist *d) {
    int inited = 0, provided = 0;
    MPI_TRY(MPI_Initialized(&inited), "MPI_Initialized");
    if (!inited) {
        MPI_TRY(MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
        d->mpi = 1;
    }
    MPI_TRY(MPI_Comm_rank(MPI_COMM_WORLD, &d->rank), "MPI_Comm_rank");
    MPI_TRY(MPI_Comm_size(MPI_COMM_WORLD, &d->size), "MPI_Comm_size");
    MPI_Comm local;
    MPI_TRY(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type");
    MPI_TRY(MPI_Comm_rank(local, &d->local_rank), "MPI_Comm_rank");
    MPI_TRY(MPI_Comm_size(local, &d->local_size), "MPI_Comm_size");
    MPI_Comm_free(&local);
    return LM_OK;
}
#endif

lm_status lm_dist_create(lm_dist **out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_dist_create: NULL argument");
    *out = NULL;
    lm_dist *d = lm__calloc(1, sizeof *d);
    if (!d) return LM_OUT_OF_MEMORY;
    *d = (lm_dist){0, 1, 0, 1, 0};
    int launched = launcher_size();
#ifdef LOOM_HAVE_MPI
    if (launched > 0) {
        lm_status st = mpi_start(d);
        if (st != LM_OK) {
            lm_dist_destroy(d);
            return st;
        }
    }
#else
    if (launched > 1) {
        lm__free(d);
        return lm__error(LM_UNSUPPORTED, "loom was built without MPI, but an MPI launcher started it as one of %d "
                                         "processes (install libopenmpi-dev and rebuild, or run one process)",
                         launched);
    }
#endif
    *out = d;
    return LM_OK;
}

void lm_dist_destroy(lm_dist *d) {
    if (!d) return;
#ifdef LOOM_HAVE_MPI
    if (d->mpi) MPI_Finalize();
#endif
    lm__free(d);
}

int lm_dist_rank(const lm_dist *d) { return d ? d->rank : 0; }
int lm_dist_size(const lm_dist *d) { return d ? d->size : 1; }
int lm_dist_local_rank(const lm_dist *d) { return d ? d->local_rank : 0; }
int lm_dist_local_size(const lm_dist *d) { return d ? d->local_size : 1; }

/* MPI counts are int: large buffers go in pieces of 2^30 elements. */
#define CHUNK ((int64_t)1 << 30)

lm_status lm_dist_allreduce_sum_f32(lm_dist *d, float *buf, int64_t n) {
    if (n < 0 || (n > 0 && !buf)) return lm__error(LM_INVALID_ARGUMENT, "lm_dist_allreduce_sum_f32: bad buffer");
    if (!d || d->size == 1) return LM_OK;
#ifdef LOOM_HAVE_MPI
    for (int64_t i = 0; i < n; i += CHUNK)
        MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, buf + i, (int)LM_MIN(CHUNK, n - i), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
                "MPI_Allreduce");
#endif
    return LM_OK;
}

lm_status lm_dist_allreduce_sum_f64(lm_dist *d, double *buf, int64_t n) {
    if (n < 0 || (n > 0 && !buf)) return lm__error(LM_INVALID_ARGUMENT, "lm_dist_allreduce_sum_f64: bad buffer");
    if (!d || d->size == 1) return LM_OK;
#ifdef LOOM_HAVE_MPI
    for (int64_t i = 0; i < n; i += CHUNK)
        MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, buf + i, (int)LM_MIN(CHUNK, n - i), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD),
                "MPI_Allreduce");
#endif
    return LM_OK;
}

lm_status lm_dist_broadcast(lm_dist *d, void *buf, size_t nbytes, int root) {
    if (nbytes > 0 && !buf) return lm__error(LM_INVALID_ARGUMENT, "lm_dist_broadcast: NULL buffer");
    if (root < 0 || root >= lm_dist_size(d))
        return lm__error(LM_INVALID_ARGUMENT, "lm_dist_broadcast: root %d outside the %d ranks", root, lm_dist_size(d));
    if (!d || d->size == 1) return LM_OK;
#ifdef LOOM_HAVE_MPI
    for (size_t i = 0; i < nbytes; i += (size_t)CHUNK)
        MPI_TRY(MPI_Bcast((char *)buf + i, (int)LM_MIN((size_t)CHUNK, nbytes - i), MPI_BYTE, root, MPI_COMM_WORLD),
                "MPI_Bcast");
#endif
    return LM_OK;
}

lm_status lm_dist_barrier(lm_dist *d) {
    if (!d || d->size == 1) return LM_OK;
#ifdef LOOM_HAVE_MPI
    MPI_TRY(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
#endif
    return LM_OK;
}

void lm_dist_abort(lm_dist *d, int code) {
    if (!d || d->size == 1) return;
#ifdef LOOM_HAVE_MPI
    MPI_Abort(MPI_COMM_WORLD, code);
#endif
}

/* ---- helpers of the trainer ------------------------------------------------------------------------ */

lm_status lm__dist_allreduce_tensor(lm_dist *d, lm_tensor *t, float **stage) {
    if (lm_dist_size(d) == 1) return LM_OK;
    int64_t n = lm_tensor_numel(t);
    lm_device dev = lm_tensor_device(t);
    if (lm__device_host_addressable(dev)) return lm_dist_allreduce_sum_f32(d, lm_tensor_data(t), n);
    /* a device buffer goes through page-locked host memory (allocated once, kept in
     * *stage by the caller): device -> host, MPI, host -> device */
    size_t bytes = (size_t)n * sizeof(float);
    if (!*stage) LM_TRY(lm_host_alloc(dev, bytes, (void **)stage));
    LM_TRY(lm_device_copy(lm_device_cpu(), *stage, dev, lm_tensor_data(t), bytes));
    LM_TRY(lm_dist_allreduce_sum_f32(d, *stage, n));
    return lm_device_copy(dev, lm_tensor_data(t), lm_device_cpu(), *stage, bytes);
}

static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* FNV-1a 64 of a flat f32 buffer's bytes (a host copy for a device buffer). */
static lm_status hash_tensor(lm_ctx *ctx, const lm_tensor *t, uint64_t *h) {
    lm_tensor *tmp = NULL;
    const lm_tensor *src = t;
    if (!lm__device_host_addressable(lm_tensor_device(t))) {
        LM_TRY(lm_tensor_to_device(ctx, t, lm_device_cpu(), &tmp));
        src = tmp;
    }
    *h = fnv1a(*h, lm_tensor_data(src), (size_t)lm_tensor_numel(src) * sizeof(float));
    lm_tensor_destroy(tmp);
    return LM_OK;
}

lm_status lm__dist_check_replicas(lm_dist *d, lm_ctx *ctx, const lm_tensor *const *bufs, int nbufs) {
    if (lm_dist_size(d) == 1) return LM_OK;
    uint64_t mine = 0xcbf29ce484222325ull, root;
    for (int i = 0; i < nbufs; i++) LM_TRY(hash_tensor(ctx, bufs[i], &mine));
    root = mine;
    LM_TRY(lm_dist_broadcast(d, &root, sizeof root, 0));
    double differ = root != mine; /* summed, so every rank learns whether any differs */
    LM_TRY(lm_dist_allreduce_sum_f64(d, &differ, 1));
    if (differ > 0)
        return lm__error(LM_INTERNAL, "the replicas diverged: the weights and optimizer moments of %s (FNV-1a "
                                      "%016llx, rank 0: %016llx)",
                         root != mine ? "this rank differ from rank 0's" : "some rank differ from rank 0's",
                         (unsigned long long)mine, (unsigned long long)root);
    return LM_OK;
}

/* ---- ZeRO-1 collectives (slices of a flat buffer; see train/internal.h) ------------------------------ */

#ifdef LOOM_HAVE_MPI
/* Whether every slice fits one MPI count (then one collective does it). */
static int slices_fit(const lm_dist *d, const int64_t *bounds) {
    for (int r = 0; r < d->size; r++)
        if (bounds[r + 1] - bounds[r] > CHUNK) return 0;
    return 1;
}

/* The int counts and (displs not NULL) displacements of the slices (only when
 * slices_fit and bounds[size] fits an int). */
static lm_status slice_counts(const lm_dist *d, const int64_t *bounds, int **counts, int **displs) {
    *counts = lm__calloc((size_t)d->size, sizeof **counts);
    if (displs) *displs = lm__calloc((size_t)d->size, sizeof **displs);
    if (!*counts || (displs && !*displs)) {
        lm__free(*counts);
        if (displs) lm__free(*displs);
        return LM_OUT_OF_MEMORY;
    }
    for (int r = 0; r < d->size; r++) {
        (*counts)[r] = (int)(bounds[r + 1] - bounds[r]);
        /* displacements are int too: past 2^31 elements the root-by-root path is taken */
        if (displs) (*displs)[r] = (int)bounds[r];
    }
    return LM_OK;
}
#endif

lm_status lm__dist_reduce_scatter_f32(lm_dist *d, float *buf, const int64_t *bounds) {
    if (!d || d->size == 1) return LM_OK;
#ifdef LOOM_HAVE_MPI
    int64_t lo = bounds[d->rank], n = bounds[d->rank + 1] - lo;
    if (slices_fit(d, bounds)) {
        int *counts = NULL;
        LM_TRY(slice_counts(d, bounds, &counts, NULL));
        /* in place: buf holds every rank's input in slice order; the sum of this
         * rank's slice arrives at buf[0, n) and is moved to where the slice lives */
        int rc = MPI_Reduce_scatter(MPI_IN_PLACE, buf, counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        lm__free(counts);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Reduce_scatter");
        if (lo > 0 && n > 0) memmove(buf + lo, buf, (size_t)n * sizeof *buf);
        return LM_OK;
    }
    for (int root = 0; root < d->size; root++) /* each slice summed at its owner */
        for (int64_t i = bounds[root]; i < bounds[root + 1]; i += CHUNK) {
            int c = (int)LM_MIN(CHUNK, bounds[root + 1] - i);
            MPI_TRY(MPI_Reduce(root == d->rank ? MPI_IN_PLACE : buf + i, buf + i, c, MPI_FLOAT, MPI_SUM, root,
                               MPI_COMM_WORLD),
                    "MPI_Reduce");
        }
#else
    (void)buf, (void)bounds;
#endif
    return LM_OK;
}

lm_status lm__dist_allgather_f32(lm_dist *d, float *buf, const int64_t *bounds) {
    if (!d || d->size == 1) return LM_OK;
#ifdef LOOM_HAVE_MPI
    if (slices_fit(d, bounds) && bounds[d->size] <= INT32_MAX) {
        int *counts = NULL, *displs = NULL;
        LM_TRY(slice_counts(d, bounds, &counts, &displs));
        int rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, MPI_FLOAT, MPI_COMM_WORLD);
        lm__free(counts), lm__free(displs);
        return rc == MPI_SUCCESS ? LM_OK : mpi_fail(rc, "MPI_Allgatherv");
    }
    for (int root = 0; root < d->size; root++)
        LM_TRY(lm_dist_broadcast(d, buf + bounds[root], (size_t)(bounds[root + 1] - bounds[root]) * sizeof *buf, root));
#else
    (void)buf, (void)bounds;
#endif
    return LM_OK;
}

lm_status lm__dist_gather_f32(lm_dist *d, const float *mine, float *full, const int64_t *bounds) {
    int rank = lm_dist_rank(d), size = lm_dist_size(d);
    int64_t n = bounds[rank + 1] - bounds[rank];
    if (rank == 0 && n > 0 && full + bounds[0] != mine) memcpy(full + bounds[0], mine, (size_t)n * sizeof *mine);
    if (size == 1) return LM_OK;
#ifdef LOOM_HAVE_MPI
    if (slices_fit(d, bounds) && bounds[size] <= INT32_MAX) {
        int *counts = NULL, *displs = NULL;
        LM_TRY(slice_counts(d, bounds, &counts, &displs));
        /* rank 0 contributes in place (its slice is copied above) */
        int rc = rank == 0 ? MPI_Gatherv(MPI_IN_PLACE, 0, MPI_FLOAT, full, counts, displs, MPI_FLOAT, 0, MPI_COMM_WORLD)
                           : MPI_Gatherv(mine, (int)n, MPI_FLOAT, NULL, NULL, NULL, MPI_FLOAT, 0, MPI_COMM_WORLD);
        lm__free(counts), lm__free(displs);
        return rc == MPI_SUCCESS ? LM_OK : mpi_fail(rc, "MPI_Gatherv");
    }
    for (int src = 1; src < size; src++) /* point to point, in pieces of 2^30 */
        for (int64_t i = 0; i < bounds[src + 1] - bounds[src]; i += CHUNK) {
            int c = (int)LM_MIN(CHUNK, bounds[src + 1] - bounds[src] - i);
            if (rank == 0)
                MPI_TRY(MPI_Recv(full + bounds[src] + i, c, MPI_FLOAT, src, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                        "MPI_Recv");
            else if (rank == src)
                MPI_TRY(MPI_Send(mine + i, c, MPI_FLOAT, 0, 0, MPI_COMM_WORLD), "MPI_Send");
        }
#else
    (void)full;
#endif
    return LM_OK;
}

/* ---- the GPU communicator's bootstrap ------------------------------------------------------------- */

lm_status lm__dist_nccl_create(lm_dist *d, lm_device dev, lm__nccl **out) {
    *out = NULL;
    int size = lm_dist_size(d), rank = lm_dist_rank(d);
    /* every rank loads NCCL and they agree before anyone enters the collective init:
     * the lowest failing rank's number is summed over the ranks as a flag per rank */
    lm_status mine = lm__nccl_load();
    char why[256] = "";
    if (mine != LM_OK) snprintf(why, sizeof why, "%s", lm_last_error());
    double *failed = lm__calloc((size_t)size, sizeof *failed);
    if (!failed) return LM_OUT_OF_MEMORY;
    failed[rank] = mine != LM_OK;
    lm_status st = lm_dist_allreduce_sum_f64(d, failed, size);
    int first = -1;
    for (int r = 0; st == LM_OK && r < size && first < 0; r++)
        if (failed[r] > 0) first = r;
    lm__free(failed);
    LM_TRY(st);
    if (first >= 0)
        return mine != LM_OK ? lm__error(LM_UNSUPPORTED, "%s", why)
                             : lm__error(LM_UNSUPPORTED, "rank %d cannot use NCCL (its error says why)", first);
    unsigned char id[LM__NCCL_ID_BYTES + 4] = {0}; /* the id, then rank 0's status */
    if (rank == 0) {
        int32_t code = (int32_t)lm__nccl_unique_id(id);
        memcpy(id + LM__NCCL_ID_BYTES, &code, 4);
    }
    LM_TRY(lm_dist_broadcast(d, id, sizeof id, 0));
    int32_t code;
    memcpy(&code, id + LM__NCCL_ID_BYTES, 4);
    if (code != LM_OK)
        return rank == 0 ? (lm_status)code : lm__error((lm_status)code, "rank 0 could not make the NCCL id");
    return lm__nccl_create(size, rank, id, dev, out);
}
