/* Data-parallel training on GPUs: the real loom binary under `mpirun -np 2` with
 * --device cuda, the gradients summed by NCCL (train/dist_cuda.c), on the tiny
 * tests/data/train llama (98,688 parameters), f32 compute, batch 2 x 16 tokens, 4
 * steps, a checkpoint at step 2. With two or more GPUs each rank takes its own; with
 * one, both share it and NCCL tells them apart as two hosts (NCCL_HOSTID per rank,
 * its socket transport on the loopback interface).
 *   - the start-up line names NCCL as the way the gradients are summed;
 *   - 2 ranks x --grad-accum 1 take the steps of 1 rank x --grad-accum 2: losses within
 *     1e-5 relative, final weights NMSE 1e-10 / max-abs 1e-5 (on the GPU the one-rank
 *     run adds the second micro-batch's gradients inside the GEMMs, the two-rank run
 *     adds two finished buffers: the same sums rounded in another order, which AdamW's
 *     m / sqrt(v) amplifies on near-zero gradients);
 *   - 2 ranks with --zero 1 (reduce-scatter and all-gather over NCCL, moments sharded
 *     on the GPUs) take the steps of 2 ranks with --zero 0: same gates (the clip norm
 *     is summed per slice, in another order);
 *   - the --zero 1 checkpoint of step 2 (moments gathered from the GPUs to rank 0's
 *     host memory) resumes on 1 rank with --grad-accum 2 and ends as the
 *     uninterrupted run, same gates.
 * Skipped (77) without CUDA or MPI in the build, without mpirun on the PATH, without
 * a GPU, or when NCCL cannot be loaded.
 * LM_TEST_LABELS: cuda model
 */
#include "harness.h"
#include "loom/train.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else
#include "train/internal.h"

#define LOOM LOOM_BINARY_DIR "/loom"
#define CONFIG LOOM_SOURCE_DIR "/tests/data/train/tiny_llama.json"
#define TOKENIZER LOOM_SOURCE_DIR "/tests/data/train/tokenizer.json"
#define SHARD LOOM_BINARY_DIR "/train_cuda_dist.bin"
#define WORK LOOM_BINARY_DIR "/train_cuda_dist"
#define COMMON                                                                                                        \
    "train --device cuda --dtype f32 --data " SHARD " --steps 4 --batch 2 --seq 16 --threads 1 --lr 3e-3 --warmup 1 " \
    "--save-every 2 --tokenizer " TOKENIZER
#define STEPS 4

#include "../train/dist_test_util.h"

static char g_launch[1024]; /* mpirun -np 2 [per-rank NCCL host ids] */

/* Runs a shell command that must succeed; *err (may be NULL) receives its stderr. */
static int run_ok(char **err, const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    lt_cmd_result r = lt_run_cmd(cmd);
    LT_CHECK_MSG(r.status == 0, "`%s` exited %d: %s", cmd, r.status, r.err ? r.err : "");
    int ok = r.status == 0;
    if (err) *err = r.err ? strdup(r.err) : NULL;
    lt_cmd_free(&r);
    return ok;
}

static int g_ready;
static char *g_two_err; /* the 2-rank run's stderr */

/* The runs every check compares: 1 rank x grad-accum 2 (WORK/one), 2 ranks (WORK/two)
 * and 2 ranks with --zero 1 (WORK/zero), all from the same seeded init. */
static void prepare(void) {
    g_ready = run_ok(NULL, "rm -rf '%s' && mkdir -p '%s'", WORK, WORK) &&
              run_ok(NULL, "%s data prepare --tokenizer %s %s/tests/data/train/corpus.txt -o %s >/dev/null", LOOM,
                     TOKENIZER, LOOM_SOURCE_DIR, SHARD) &&
              run_ok(NULL, "%s %s --config %s --grad-accum 2 --out %s/one", LOOM, COMMON, CONFIG, WORK) &&
              run_ok(&g_two_err, "%s %s %s --config %s --out %s/two", g_launch, LOOM, COMMON, CONFIG, WORK) &&
              run_ok(NULL, "%s %s %s --config %s --zero 1 --out %s/zero", g_launch, LOOM, COMMON, CONFIG, WORK);
}

static void test_the_run_names_nccl(void) {
    if (!g_ready) return;
    LT_CHECK_MSG(g_two_err && strstr(g_two_err, "gradients summed over the ranks by NCCL"),
                 "the 2-rank run does not name NCCL: %s", g_two_err ? g_two_err : "(no output)");
}

static void test_two_ranks_match_one_rank_with_accumulation(void) {
    if (!g_ready) return;
    check_losses("2 ranks (NCCL) vs 1 rank x accum 2", WORK "/two", WORK "/one", 1e-5, 0);
    check_weights("2 ranks (NCCL) vs 1 rank x accum 2", WORK "/two", WORK "/one", 1e-5);
}

static void test_zero1_matches_zero0(void) {
    if (!g_ready) return;
    check_losses("2 ranks --zero 1 vs --zero 0", WORK "/zero", WORK "/two", 1e-5, 1);
    check_weights("2 ranks --zero 1 vs --zero 0", WORK "/zero", WORK "/two", 1e-5);
}

static void test_zero1_checkpoint_resumes_on_one_rank(void) {
    if (!g_ready) return;
    if (!run_ok(NULL, "rm -rf %s/r1 && cp -r %s/zero %s/r1 && %s %s --resume %s/r1/checkpoint-000002 --grad-accum 2 "
                      "--out %s/r1",
                WORK, WORK, WORK, LOOM, COMMON, WORK, WORK))
        return;
    check_losses("--zero 1 checkpoint resumed on 1 rank", WORK "/r1", WORK "/zero", 1e-5, 0);
    check_weights("--zero 1 checkpoint resumed on 1 rank", WORK "/r1", WORK "/zero", 1e-5);
}

int main(void) {
    if (!lm_dist_available()) lt_skip("loom was built without MPI");
    if (system("command -v mpirun >/dev/null 2>&1") != 0) lt_skip("no mpirun on the PATH");
    int gpus = lm_cuda_device_count();
    if (gpus < 1) lt_skip("no GPU");
    if (lm__nccl_load() != LM_OK) {
        fprintf(stderr, "%s\n", lm_last_error());
        lt_skip("NCCL cannot be loaded");
    }
    dist_test_sanitizer_env();
    if (gpus >= 2)
        snprintf(g_launch, sizeof g_launch, MPIRUN " -np 2");
    else /* one GPU for both ranks: two hosts to NCCL (the variable is set inside each rank) */
        snprintf(g_launch, sizeof g_launch,
                 MPIRUN " -np 2 -x NCCL_SOCKET_IFNAME=lo -x NCCL_IB_DISABLE=1 sh -c "
                        "'NCCL_HOSTID=loom-rank-$OMPI_COMM_WORLD_RANK exec \"$0\" \"$@\"'");
    printf("%d GPU(s): %s\n", gpus, g_launch);
    LT_RUN(prepare);
    LT_RUN(test_the_run_names_nccl);
    LT_RUN(test_two_ranks_match_one_rank_with_accumulation);
    LT_RUN(test_zero1_matches_zero0);
    LT_RUN(test_zero1_checkpoint_resumes_on_one_rank);
    free(g_two_err);
    return lt_finish();
}
#endif
