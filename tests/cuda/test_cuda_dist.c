/* The GPU collectives of data-parallel training (train/dist_cuda.c, NCCL) with two
 * real ranks: the test forks two processes before either touches CUDA, the first
 * makes the NCCL id and hands it to the second through a pipe, and each joins the
 * communicator on its GPU (GPU r with two or more GPUs; with one GPU both ranks share
 * it, told apart as two hosts through NCCL_HOSTID, so NCCL carries the traffic over
 * its socket transport on the loopback interface). Each rank then checks, on
 * buffers filled with rank-dependent integers (exact in f32, so every sum is exact):
 *  - all-reduce in place (on the communicator's stream, joined back to the
 *    context's) over sizes 1, 1000 and 3 x 2^20 + 7: every element is the sum over
 *    the ranks;
 *  - the ZeRO-1 pair over uneven slices (one empty): after the reduce-scatter this
 *    rank's slice holds the sum and the other slices are untouched; after the
 *    all-gather every slice holds its owner's values;
 *  - a context on another device type is refused by name.
 * A rank that fails or hangs fails the test (the parent waits at most 180 s and
 * kills both). Skipped (77) without CUDA, without a GPU, or when NCCL cannot be
 * loaded (the reason is printed).
 * LM_TEST_LABELS: cuda
 */
#include "harness.h"

#include "train/internal.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

#define RANKS 2
#define SKIP 77

/* The value rank r puts at element i: small integers, so f32 sums are exact. */
static float value(int r, int64_t i) { return (float)((i * 7 + 3) % 1009) + 1000.0f * (float)(r + 1); }

static lm_device g_dev;

static lm_tensor *filled(int r, int64_t n) {
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof *h);
    for (int64_t i = 0; i < n; i++) h[i] = value(r, i);
    lm_tensor *t = NULL;
    LT_CHECK_OK(lm_tensor_from_host(g_dev, LM_F32, 1, &n, h, &t));
    free(h);
    return t;
}

static float *read_back(lm_ctx *ctx, const lm_tensor *t) {
    int64_t n = lm_tensor_numel(t);
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof *h);
    LT_CHECK_OK(lm_tensor_view_read(ctx, lm_tensor_as_view(t), h));
    return h;
}

static void check_allreduce(lm__nccl *c, lm_ctx *ctx, int rank, int64_t n) {
    lm_tensor *t = filled(rank, n);
    LT_CHECK_OK(lm__nccl_allreduce_f32_overlapped(c, ctx, lm_tensor_data(t), n));
    LT_CHECK_OK(lm__nccl_join(c, ctx));
    float *h = read_back(ctx, t);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += h[i] != value(0, i) + value(1, i);
    LT_CHECK_MSG(bad == 0, "rank %d: all-reduce of %lld: %lld wrong elements", rank, (long long)n, (long long)bad);
    free(h);
    lm_tensor_destroy(t);
}

static void check_zero_pair(lm__nccl *c, lm_ctx *ctx, int rank, const int64_t *bounds) {
    int64_t n = bounds[RANKS];
    lm_tensor *t = filled(rank, n);
    LT_CHECK_OK(lm__nccl_reduce_scatter_f32(c, ctx, lm_tensor_data(t), bounds));
    float *h = read_back(ctx, t);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int own = i >= bounds[rank] && i < bounds[rank + 1];
        bad += h[i] != (own ? value(0, i) + value(1, i) : value(rank, i));
    }
    LT_CHECK_MSG(bad == 0, "rank %d: reduce-scatter over [%lld, %lld, %lld]: %lld wrong elements", rank,
                 (long long)bounds[0], (long long)bounds[1], (long long)bounds[2], (long long)bad);
    free(h);
    /* every slice now holds its owner's values (the owner's slice of its own fill) */
    lm_tensor_destroy(t);
    t = filled(rank, n);
    LT_CHECK_OK(lm__nccl_allgather_f32(c, ctx, lm_tensor_data(t), bounds));
    h = read_back(ctx, t);
    bad = 0;
    for (int r = 0; r < RANKS; r++)
        for (int64_t i = bounds[r]; i < bounds[r + 1]; i++) bad += h[i] != value(r, i);
    LT_CHECK_MSG(bad == 0, "rank %d: all-gather: %lld wrong elements", rank, (long long)bad);
    free(h);
    lm_tensor_destroy(t);
}

static lm__nccl *g_comm;
static lm_ctx *g_ctx;
static int g_rank;

static void test_collectives(void) {
    printf("rank %d on cuda:%d, NCCL %d\n", g_rank, g_dev.index, lm__nccl_version());
    int64_t sizes[] = {1, 1000, 3 * ((int64_t)1 << 20) + 7};
    for (int k = 0; k < 3; k++) check_allreduce(g_comm, g_ctx, g_rank, sizes[k]);
    int64_t uneven[RANKS + 1] = {0, 4096 + 16, 10007}, empty[RANKS + 1] = {0, 0, 333};
    check_zero_pair(g_comm, g_ctx, g_rank, uneven);
    check_zero_pair(g_comm, g_ctx, g_rank, empty);
}

static void test_context_on_another_device_is_refused(void) {
    lm_ctx *cpu = NULL;
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &cpu));
    float x = 0;
    LT_CHECK_STATUS(lm__nccl_allreduce_f32_overlapped(g_comm, cpu, &x, 1), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "cuda:") != NULL);
    lm_ctx_destroy(cpu);
}

/* One rank's whole run; its exit status is the test result (SKIP when it cannot run). */
static int rank_main(int rank, int fd_read, int fd_write) {
    unsigned char id[LM__NCCL_ID_BYTES];
    close(rank == 0 ? fd_read : fd_write); /* so rank 1 sees the end of the pipe if rank 0 stops early */
    if (lm__nccl_load() != LM_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, lm_last_error());
        return SKIP;
    }
    int gpus = lm_cuda_device_count();
    if (gpus < 1) return SKIP;
    if (gpus < RANKS) { /* both ranks on GPU 0: two "hosts" to NCCL, over loopback sockets */
        char host[32];
        snprintf(host, sizeof host, "loom-test-rank-%d", rank);
        setenv("NCCL_HOSTID", host, 1);
        setenv("NCCL_SOCKET_IFNAME", "lo", 1);
        setenv("NCCL_IB_DISABLE", "1", 1);
    }
    if (rank == 0) {
        LT_CHECK_OK(lm__nccl_unique_id(id));
        if (write(fd_write, id, sizeof id) != (ssize_t)sizeof id) return 1;
    } else if (read(fd_read, id, sizeof id) != (ssize_t)sizeof id) {
        return 1;
    }
    lm_device dev = g_dev = lm_device_cuda(gpus < RANKS ? 0 : rank);
    g_rank = rank;
    LT_CHECK_OK(lm_ctx_create(dev, 1, &g_ctx));
    LT_CHECK_OK(lm__nccl_create(RANKS, rank, id, dev, &g_comm));
    if (g_comm && g_ctx) {
        LT_RUN(test_collectives);
        LT_RUN(test_context_on_another_device_is_refused);
    }
    lm__nccl_destroy(g_comm);
    lm_ctx_destroy(g_ctx);
    printf("rank %d: ", rank);
    return lt_finish();
}

static int g_status[RANKS]; /* the ranks' exit statuses */

static void test_both_ranks_passed(void) {
    for (int r = 0; r < RANKS; r++) LT_CHECK_MSG(g_status[r] == 0, "rank %d ended with status %d", r, g_status[r]);
}

int main(void) {
    int p[2];
    if (pipe(p) != 0) {
        perror("pipe");
        return 1;
    }
    fflush(stdout), fflush(stderr);
    pid_t pid[RANKS];
    for (int r = 0; r < RANKS; r++) {
        pid[r] = fork();
        if (pid[r] < 0) {
            perror("fork");
            return 1;
        }
        if (pid[r] == 0) { /* _exit: no atexit handlers of the parent's libraries; flush by hand */
            int rc = rank_main(r, p[0], p[1]);
            fflush(stdout), fflush(stderr);
            _exit(rc);
        }
    }
    close(p[0]), close(p[1]);
    int done = 0;
    time_t deadline = time(NULL) + 180;
    while (done < RANKS && time(NULL) < deadline) {
        for (int r = 0; r < RANKS; r++) {
            int s;
            if (pid[r] > 0 && waitpid(pid[r], &s, WNOHANG) == pid[r]) {
                g_status[r] = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + (WIFSIGNALED(s) ? WTERMSIG(s) : 0);
                pid[r] = 0, done++;
            }
        }
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    for (int r = 0; r < RANKS; r++)
        if (pid[r] > 0) { /* still running: a hang */
            kill(pid[r], SIGKILL);
            waitpid(pid[r], NULL, 0);
            fprintf(stderr, "rank %d did not finish within 180 s\n", r);
            g_status[r] = 1;
        }
    if (g_status[0] == SKIP && g_status[1] == SKIP) lt_skip("no GPU or no NCCL (the ranks say which)");
    LT_RUN(test_both_ranks_passed);
    return lt_finish();
}
#endif
