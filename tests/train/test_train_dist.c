/* Data-parallel training over MPI on the CPU: the real loom binary under
 * `mpirun -np 2` (Open MPI; --oversubscribe so two ranks fit any machine) on the tiny
 * tests/data/train llama, batch 2 x 16 tokens, 4 steps, one thread per rank.
 *   - 2 ranks x --grad-accum 1 take the steps of 1 rank x --grad-accum 2 (the same
 *     global batch): every logged loss within 1e-5 relative, final weights within
 *     NMSE 1e-10 and max-abs 1e-6 (the sums differ only in order; with two ranks they
 *     come out bit-identical here, which is not required);
 *   - a 2-rank checkpoint resumes on 1 rank with --grad-accum 2 and a 1-rank one on 2
 *     ranks, each ending as the uninterrupted run, same tolerances;
 *   - a resume whose ranks x grad-accum differs from the checkpoint's is refused naming
 *     both; ranks given different options are refused before the first step;
 *   - a rank that fails on its own input (its shard missing), or is killed with
 *     SIGKILL in the middle of a save while the other waits for it, ends the whole run
 *     with a non-zero exit well within a deadline (no rank is left waiting);
 *   - lm_dist without a launcher is a world of one whose collectives are the identity;
 *     in a build without MPI a launcher announcing 2 processes is refused ("loom was
 *     built without MPI").
 * Skipped (77) without MPI in the build or without mpirun on the PATH. Under ASan,
 * Open MPI's own leaks are suppressed (tests/train/lsan_openmpi.supp).
 * LM_TEST_LABELS: unit model
 */
#include "harness.h"
#include "loom/train.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOOM LOOM_BINARY_DIR "/loom"
#define CONFIG LOOM_SOURCE_DIR "/tests/data/train/tiny_llama.json"
#define TOKENIZER LOOM_SOURCE_DIR "/tests/data/train/tokenizer.json"
#define SHARD LOOM_BINARY_DIR "/train_dist.bin"
#define WORK LOOM_BINARY_DIR "/train_dist"
#define COMMON                                                                                                        \
    "train --data " SHARD " --steps 4 --batch 2 --seq 16 --threads 1 --lr 3e-3 --warmup 1 --save-every 2 --tokenizer " \
    TOKENIZER
/* Seconds a failing run may take to end: far above the ~1 s it needs, far below a hang. */
#define DEADLINE 60
#define STEPS 4

#include "dist_test_util.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Runs a shell command built from fmt; *seconds (may be NULL) receives its wall time. */
static lt_cmd_result run(double *seconds, const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    double t0 = now();
    lt_cmd_result r = lt_run_cmd(cmd);
    if (seconds) *seconds = now() - t0;
    return r;
}

/* The reference runs every test compares with: 1 rank x grad-accum 2 (WORK/one) and
 * 2 ranks x grad-accum 1 (WORK/two), both from the same seeded init. */
static int g_ready;

static void prepare(void) {
    LT_CHECK(dist_run_ok(NULL, 0, "rm -rf '%s' && mkdir -p '%s'", WORK, WORK));
    LT_CHECK(dist_run_ok(NULL, 0, "%s data prepare --tokenizer %s %s/tests/data/train/corpus.txt -o %s >/dev/null",
                         LOOM, TOKENIZER, LOOM_SOURCE_DIR, SHARD));
    g_ready =
        dist_run_ok(NULL, 0, "%s %s --config %s --grad-accum 2 --out %s/one", LOOM, COMMON, CONFIG, WORK) &&
        dist_run_ok(NULL, 0, MPIRUN " -np 2 %s %s --config %s --grad-accum 1 --out %s/two", LOOM, COMMON, CONFIG, WORK);
}

static void test_two_ranks_match_one_rank_with_accumulation(void) {
    if (!g_ready) return;
    check_losses("2 ranks vs 1 rank x accum 2", WORK "/two", WORK "/one", 1e-5, 0);
    check_weights("2 ranks vs 1 rank x accum 2", WORK "/two", WORK "/one", 1e-6);
}

static void test_resume_with_another_rank_count(void) {
    if (!g_ready) return;
    /* 2 ranks -> 1 rank x grad-accum 2 */
    dist_run_ok(
        NULL, 0,
        "rm -rf %s/r1 && cp -r %s/two %s/r1 && %s %s --resume %s/r1/checkpoint-000002 --grad-accum 2 --out %s/r1", WORK,
        WORK, WORK, LOOM, COMMON, WORK, WORK);
    check_losses("2-rank checkpoint resumed on 1 rank", WORK "/r1", WORK "/one", 1e-5, 0);
    check_weights("2-rank checkpoint resumed on 1 rank", WORK "/r1", WORK "/one", 1e-6);
    /* 1 rank x grad-accum 2 -> 2 ranks */
    dist_run_ok(NULL, 0,
                "rm -rf %s/r2 && cp -r %s/one %s/r2 && " MPIRUN
                " -np 2 %s %s --resume %s/r2/checkpoint-000002 --out %s/r2",
                WORK, WORK, WORK, LOOM, COMMON, WORK, WORK);
    check_losses("1-rank checkpoint resumed on 2 ranks", WORK "/r2", WORK "/one", 1e-5, 0);
    check_weights("1-rank checkpoint resumed on 2 ranks", WORK "/r2", WORK "/one", 1e-6);
}

static void test_mismatched_runs_are_refused(void) {
    if (!g_ready) return;
    /* saved with 2 micro-batches per step; 2 ranks x 2 = 4 */
    lt_cmd_result r = run(NULL, MPIRUN " -np 2 %s %s --resume %s/two/checkpoint-000002 --grad-accum 2 --out %s/mis",
                          LOOM, COMMON, WORK, WORK);
    /* every rank refuses; which one's line reaches stderr before mpirun ends the others
     * depends on scheduling (under load rank 1 may be the only one heard) */
    LT_CHECK_MSG(r.status != 0 && r.err && strstr(r.err, ": loom train: cannot resume") &&
                     strstr(r.err, "2 micro-batches per step") && strstr(r.err, "2 x 2 = 4"),
                 "mismatched resume: exit %d: %s", r.status, r.err ? r.err : "");
    lt_cmd_free(&r);
    /* 1 rank x 1: refused the same way */
    r = run(NULL, "%s %s --resume %s/two/checkpoint-000002 --out %s/mis", LOOM, COMMON, WORK, WORK);
    LT_CHECK_MSG(r.status != 0 && r.err && strstr(r.err, "1 x 1 = 1"), "mismatched resume: exit %d: %s", r.status,
                 r.err ? r.err : "");
    lt_cmd_free(&r);
    /* ranks given different options (MPMD: rank 1 another learning rate) */
    double s = 0;
    r = run(&s, "timeout %d " MPIRUN " -np 1 %s %s --config %s --out %s/opt : -np 1 %s %s --config %s --lr 1e-3 --out "
                "%s/opt",
            DEADLINE, LOOM, COMMON, CONFIG, WORK, LOOM, COMMON, CONFIG, WORK);
    LT_CHECK_MSG(r.status != 0 && r.status != 124 && r.err && strstr(r.err, "rank 1: loom train: the training options"),
                 "different options: exit %d after %.1f s: %s", r.status, s, r.err ? r.err : "");
    lt_cmd_free(&r);
}

static void test_a_failing_rank_ends_the_run(void) {
    if (!g_ready) return;
    /* rank 1 alone cannot read its shard: rank 0 would wait for it in the first collective */
    double s = 0;
    lt_cmd_result r = run(&s,
                          "timeout %d " MPIRUN " -np 1 %s %s --config %s --out %s/f1 : -np 1 %s %s --config %s --data "
                          "%s/missing.bin --out %s/f1",
                          DEADLINE, LOOM, COMMON, CONFIG, WORK, LOOM, COMMON, CONFIG, WORK, WORK);
    LT_CHECK_MSG(r.status != 0 && r.status != 124 && r.err && /* 124: timeout's, a hang */
                     strstr(r.err, "rank 1: loom train: cannot open --data"),
                 "a rank with a missing shard: exit %d after %.1f s: %s", r.status, s, r.err ? r.err : "");
    printf("a rank with a missing shard ended the run in %.2f s (exit %d)\n", s, r.status);
    lt_cmd_free(&r);
    /* rank 0 killed (SIGKILL) while it writes the first checkpoint and rank 1 waits for its outcome */
    r = run(&s, "timeout %d " MPIRUN " -np 2 -x LOOM_TEST_KILL_AT=after-weights:1 %s %s --config %s --out %s/f2",
            DEADLINE, LOOM, COMMON, CONFIG, WORK);
    LT_CHECK_MSG(r.status != 0 && r.status != 124, "rank 0 killed: exit %d after %.1f s: %s", r.status,
                 s, r.err ? r.err : "");
    printf("rank 0 killed mid-save ended the run in %.2f s (exit %d)\n", s, r.status);
    lt_cmd_free(&r);
    LT_CHECK_STATUS(lm_train_checkpoint_check(WORK "/f2/checkpoint-000002", NULL), LM_IO_ERROR);
}

static void test_dist_without_a_launcher_is_one_rank(void) {
    lm_dist *d = NULL;
    LT_CHECK_OK(lm_dist_create(&d));
    LT_CHECK(lm_dist_rank(d) == 0 && lm_dist_size(d) == 1 && lm_dist_local_size(d) == 1);
    float f[3] = {1, 2, 3};
    double g = 4;
    int b = 7;
    LT_CHECK_OK(lm_dist_allreduce_sum_f32(d, f, 3));
    LT_CHECK_OK(lm_dist_allreduce_sum_f64(d, &g, 1));
    LT_CHECK_OK(lm_dist_broadcast(d, &b, sizeof b, 0));
    LT_CHECK_OK(lm_dist_barrier(d));
    LT_CHECK(f[0] == 1 && f[1] == 2 && f[2] == 3 && g == 4 && b == 7);
    LT_CHECK_STATUS(lm_dist_broadcast(d, &b, sizeof b, 1), LM_INVALID_ARGUMENT);
    lm_dist_abort(d, 3); /* returns in a world of one */
    lm_dist_destroy(d);
    lm_dist_destroy(NULL);
}

int main(void) {
    /* the test itself is never one of the ranks */
    unsetenv("OMPI_COMM_WORLD_SIZE"), unsetenv("PMI_SIZE"), unsetenv("PMIX_SIZE"), unsetenv("MV2_COMM_WORLD_SIZE");
    LT_RUN(test_dist_without_a_launcher_is_one_rank);
    if (!lm_dist_available()) {
        setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
        lm_dist *d = NULL;
        LT_CHECK_STATUS(lm_dist_create(&d), LM_UNSUPPORTED);
        LT_CHECK(strstr(lm_last_error(), "loom was built without MPI") != NULL);
        unsetenv("OMPI_COMM_WORLD_SIZE");
        if (lt_finish() != 0) return 1;
        lt_skip("loom was built without MPI");
    }
    lt_cmd_result r = lt_run_cmd("command -v mpirun");
    int have = r.status == 0;
    lt_cmd_free(&r);
    if (!have) {
        if (lt_finish() != 0) return 1;
        lt_skip("mpirun is not installed (Debian: openmpi-bin)");
    }
    dist_test_sanitizer_env();
    prepare();
    LT_RUN(test_two_ranks_match_one_rank_with_accumulation);
    LT_RUN(test_resume_with_another_rank_count);
    LT_RUN(test_mismatched_runs_are_refused);
    LT_RUN(test_a_failing_rank_ends_the_run);
    return lt_finish();
}
