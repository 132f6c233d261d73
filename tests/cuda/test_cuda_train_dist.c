/* Data-parallel training on GPUs: the real loom binary under `mpirun -np 2` with
 * --device cuda, the gradients summed by NCCL (train/dist_cuda.c), on the tiny
 * tests/data/train llama (98,688 parameters), f32 compute, batch 2 x 16 tokens, 4
 * steps, a checkpoint at step 2. With two or more GPUs each rank takes its own; with
 * one, both share it and NCCL tells them apart as two hosts (NCCL_HOSTID per rank,
 * its socket transport on the loopback interface). Every run takes cuBLASLt's
 * heuristic GEMM kernels (LOOM_GEMM_AUTOTUNE=0): timed picks may differ between
 * processes and round differently, which would hide or fake a difference here.
 *   - the start-up line names NCCL as the way the gradients are summed;
 *   - 2 ranks x --grad-accum 1 take the steps of 1 rank x --grad-accum 2: losses within
 *     1e-5 relative, final weights NMSE 1e-10 / max-abs 1e-5 (on the GPU the one-rank
 *     run adds the second micro-batch's gradients inside the GEMMs, the two-rank run
 *     adds two finished buffers: the same sums rounded in another order, which AdamW's
 *     m / sqrt(v) amplifies on near-zero gradients);
 *   - with buckets of 0.05 MiB (LOOM_NCCL_BUCKET_MB; 3 to 8 of them) and 2 ranks x
 *     --grad-accum 2 (the buckets all-reduced during the second backward only, as each
 *     completes): bit-identical to the same run with one bucket, and the steps of 1
 *     rank x --grad-accum 4 within NMSE 1e-8 / max-abs 2e-4 (another association of
 *     the four micro-batches' sums; see the test);
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
#define COMMON                                                                                                         \
    "train --device cuda --dtype f32 --data " SHARD " --steps 4 --batch 2 --seq 16 --threads 1 --lr 3e-3 --warmup 1 "  \
    "--save-every 2 --tokenizer " TOKENIZER
#define STEPS 4

#include "../train/dist_test_util.h"

static char g_mpirun[512];      /* mpirun -np 2 and its options */
static const char *g_wrap = ""; /* what each rank runs loom under (one GPU: per-rank NCCL host ids) */

static int g_ready;
static char g_two_err[8192], g_two4_err[8192]; /* the 2-rank runs' stderr */

/* The runs every check compares: 1 rank x grad-accum 2 (WORK/one), 2 ranks (WORK/two)
 * and 2 ranks with --zero 1 (WORK/zero), all from the same seeded init. */
static void prepare(void) {
    g_ready = dist_run_ok(NULL, 0, "rm -rf '%s' && mkdir -p '%s'", WORK, WORK) &&
              dist_run_ok(NULL, 0, "%s data prepare --tokenizer %s %s/tests/data/train/corpus.txt -o %s >/dev/null",
                          LOOM, TOKENIZER, LOOM_SOURCE_DIR, SHARD) &&
              dist_run_ok(NULL, 0, "%s %s --config %s --grad-accum 2 --out %s/one", LOOM, COMMON, CONFIG, WORK) &&
              dist_run_ok(g_two_err, sizeof g_two_err, "%s %s %s %s --config %s --out %s/two", g_mpirun, g_wrap, LOOM,
                          COMMON, CONFIG, WORK) &&
              dist_run_ok(NULL, 0, "%s %s %s %s --config %s --zero 1 --out %s/zero", g_mpirun, g_wrap, LOOM, COMMON,
                          CONFIG, WORK) &&
              dist_run_ok(NULL, 0, "%s %s --config %s --grad-accum 4 --out %s/one4", LOOM, COMMON, CONFIG, WORK) &&
              dist_run_ok(NULL, 0, "%s %s %s %s --config %s --grad-accum 2 --out %s/two4big", g_mpirun, g_wrap, LOOM,
                          COMMON, CONFIG, WORK) &&
              dist_run_ok(g_two4_err, sizeof g_two4_err,
                          "%s -x LOOM_NCCL_BUCKET_MB=0.05 %s %s %s --config %s --grad-accum 2 --out %s/two4", g_mpirun,
                          g_wrap, LOOM, COMMON, CONFIG, WORK);
}

static void test_the_run_names_nccl(void) {
    if (!g_ready) return;
    LT_CHECK_MSG(strstr(g_two_err, "gradients summed over the ranks by NCCL"), "the 2-rank run does not name NCCL: %s",
                 g_two_err);
}

static void test_two_ranks_match_one_rank_with_accumulation(void) {
    if (!g_ready) return;
    check_losses("2 ranks (NCCL) vs 1 rank x accum 2", WORK "/two", WORK "/one", 1e-5, 0);
    check_weights("2 ranks (NCCL) vs 1 rank x accum 2", WORK "/two", WORK "/one", 1e-5);
}

/* Buckets of 0.05 MiB and 2 micro-batches per rank: only the second backward
 * all-reduces, bucket by bucket, after the first has added into the buffer. The same
 * run with one bucket does the same arithmetic, so the two must agree to the bit (a
 * bucket reduced before its last gradient landed would not). Against 1 rank x accum 4
 * the sums associate differently ((g0 + g1) + (g2 + g3) against ((g0 + g1) + g2) + g3),
 * and AdamW's m / (sqrt(v) + eps) magnifies that where a gradient nearly cancels to
 * the size of eps: measured NMSE 1e-9 and max-abs 6e-5 (a fiftieth of one step of lr
 * 3e-3) on the first MLP's weights; gates NMSE 1e-8, max-abs 2e-4. */
static void test_buckets_with_accumulation(void) {
    if (!g_ready) return;
    /* 98,688 parameters in buckets of >= 13,107 floats, each under 13,107 + the largest
     * tensor (the 24,640-float embedding): at least 3 buckets, at most 8 */
    const char *at = strstr(g_two4_err, "on the GPUs (");
    int n = at ? atoi(at + strlen("on the GPUs (")) : 0;
    LT_CHECK_MSG(n >= 3 && n <= 8, "the bucketed run reports %d buckets: %s", n, g_two4_err);
    check_losses("2 ranks x accum 2, small buckets vs one bucket", WORK "/two4", WORK "/two4big", 0, 1);
    check_weights_within("2 ranks x accum 2, small buckets vs one bucket", WORK "/two4", WORK "/two4big", 0, 0);
    check_losses("2 ranks x accum 2 vs 1 rank x accum 4", WORK "/two4", WORK "/one4", 1e-5, 0);
    check_weights_within("2 ranks x accum 2 vs 1 rank x accum 4", WORK "/two4", WORK "/one4", 1e-8, 2e-4);
}

static void test_zero1_matches_zero0(void) {
    if (!g_ready) return;
    check_losses("2 ranks --zero 1 vs --zero 0", WORK "/zero", WORK "/two", 1e-5, 1);
    check_weights("2 ranks --zero 1 vs --zero 0", WORK "/zero", WORK "/two", 1e-5);
}

static void test_zero1_checkpoint_resumes_on_one_rank(void) {
    if (!g_ready) return;
    if (!dist_run_ok(NULL, 0,
                     "rm -rf %s/r1 && cp -r %s/zero %s/r1 && %s %s --resume %s/r1/checkpoint-000002 --grad-accum 2 "
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
    /* every run picks the same GEMM kernels (cuBLASLt's heuristic, not the fastest of a
     * timing, which may differ between processes), so equal arithmetic gives equal bits */
    setenv("LOOM_GEMM_AUTOTUNE", "0", 1);
    snprintf(g_mpirun, sizeof g_mpirun, MPIRUN " -np 2 -x LOOM_GEMM_AUTOTUNE%s",
             gpus >= 2 ? "" : " -x NCCL_SOCKET_IFNAME=lo -x NCCL_IB_DISABLE=1");
    if (gpus < 2) /* one GPU for both ranks: two hosts to NCCL (the variable is set inside each rank) */
        g_wrap = "sh -c 'NCCL_HOSTID=loom-rank-$OMPI_COMM_WORLD_RANK exec \"$0\" \"$@\"'";
    printf("%d GPU(s): %s %s\n", gpus, g_mpirun, g_wrap);
    LT_RUN(prepare);
    LT_RUN(test_the_run_names_nccl);
    LT_RUN(test_two_ranks_match_one_rank_with_accumulation);
    LT_RUN(test_buckets_with_accumulation);
    LT_RUN(test_zero1_matches_zero0);
    LT_RUN(test_zero1_checkpoint_resumes_on_one_rank);
    return lt_finish();
}
#endif
