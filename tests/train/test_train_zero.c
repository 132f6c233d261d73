/* ZeRO-1 (sharded optimizer state, `loom train --zero 1`) on the CPU: the real loom
 * binary under `mpirun -np N` (Open MPI, as in test_train_dist) on the tiny
 * tests/data/train llama (98,688 parameters), batch 2 x 16 tokens, 6 steps with a
 * checkpoint at step 3, one thread per rank, clipping active (|g| ~2 > 1).
 *   - 2 ranks with --zero 1 (the slice boundary cuts model.layers.0.mlp.up_proj.weight)
 *     take exactly the steps of 2 ranks with --zero 0: every
 *     logged loss and gradient norm equal as printed, and the final weights and
 *     train_state.bin byte-identical (tolerance 0: with two ranks the reduce-scatter's
 *     sums are the all-reduce's a + b, AdamW is a per-element map, and the clip norm is
 *     rounded to f32 from a double sum as the unsharded one is). The same for 1 rank
 *     with and without --zero 1.
 *   - 3 ranks with --zero 1 (uneven count: three slices) follow 1 rank with
 *     --grad-accum 3: losses within 1e-5 relative, weights NMSE 1e-10 / max-abs 1e-5.
 *     Open MPI's default reduce-scatter for three ranks adds the three partial sums in
 *     another order than its all-reduce (with coll_tuned_reduce_scatter_algorithm 2 the
 *     runs are bit-identical), and AdamW's m / sqrt(v) turns the last-bit differences
 *     of near-zero gradients into steps of up to ~lr: measured NMSE 3e-13, max-abs
 *     1.7e-6 on the embeddings, losses equal as logged;
 *   - the start-up line names MPI as the way 2 ranks sum their gradients (none for 1);
 *   - the optimizer state reported at the start: 8 x numel bytes per rank without
 *     ZeRO, within [8 x numel / N, 8 x numel / N + 8 x 16] with it (slice boundaries
 *     are rounded to 16 floats);
 *   - checkpoints keep one format: a --zero 1 checkpoint of 2 ranks resumed on 1 rank
 *     without ZeRO, and a 1-rank checkpoint without ZeRO resumed on 2 ranks with
 *     --zero 1, each follow the uninterrupted run (losses 1e-5 relative, weights NMSE
 *     1e-10 / max-abs 1e-6); a --zero 1 checkpoint resumed with --zero 1 ends
 *     byte-identical to the uninterrupted run;
 *   - --zero values other than 0 and 1 are refused naming the option and the value;
 *     ranks given different --zero are refused; lm_trainer_set_zero refuses other
 *     stages and a change after the first step.
 * Skipped (77) without MPI in the build or without mpirun on the PATH (the checks of
 * one process run first). No wall-clock assertions.
 * LM_TEST_LABELS: unit model
 */
#include "harness.h"
#include "loom/train.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOOM LOOM_BINARY_DIR "/loom"
#define CONFIG LOOM_SOURCE_DIR "/tests/data/train/tiny_llama.json"
#define TOKENIZER LOOM_SOURCE_DIR "/tests/data/train/tokenizer.json"
#define SHARD LOOM_BINARY_DIR "/train_zero.bin"
#define WORK LOOM_BINARY_DIR "/train_zero"
#define COMMON                                                                                                        \
    "train --data " SHARD " --steps 6 --batch 2 --seq 16 --threads 1 --lr 3e-3 --warmup 1 --save-every 3 --tokenizer " \
    TOKENIZER
#define STEPS 6

#include "dist_test_util.h"
#define DEADLINE 60 /* seconds a refused run may take to end: far above what it needs, far below a hang */

/* Runs a shell command built from fmt; the caller frees the result. */
static lt_cmd_result run(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return lt_run_cmd(cmd);
}

/* Whether two files hold the same bytes. */
static int same_file(const char *a, const char *b) {
    lt_cmd_result r = run("cmp -s '%s' '%s'", a, b);
    int same = r.status == 0;
    lt_cmd_free(&r);
    return same;
}

/* dir/final of two runs: model.safetensors and train_state.bin byte for byte. */
static void check_identical(const char *what, const char *got_dir, const char *want_dir) {
    static const char *const files[] = {"model.safetensors", "train_state.bin"};
    for (int i = 0; i < 2; i++) {
        char a[1024], b[1024];
        snprintf(a, sizeof a, "%s/final/%s", got_dir, files[i]);
        snprintf(b, sizeof b, "%s/final/%s", want_dir, files[i]);
        LT_CHECK_MSG(same_file(a, b), "%s: %s differs from %s", what, a, b);
    }
}

/* The bytes in rank 0's "optimizer state:" line: "(N bytes," without ZeRO, "N bytes on
 * the largest slice" with it; -1 when absent. */
static double state_bytes(const char *err) {
    const char *line = strstr(err, "optimizer state: ");
    if (!line) return -1;
    const char *p = strstr(line, "; "), *q = strchr(line, '(');
    double v = -1;
    if (strstr(line, "ZeRO-1") && p && sscanf(p + 2, "%lf bytes", &v) == 1) return v;
    if (q && sscanf(q + 1, "%lf bytes", &v) == 1) return v;
    return -1;
}

/* ---- one process --------------------------------------------------------------------------------- */

static void test_bad_zero_values_are_refused(void) {
    static const char *const bad[] = {"2", "-1", "3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lt_cmd_result r = run("%s %s --config %s --zero %s --out %s/bad", LOOM, COMMON, CONFIG, bad[i], WORK);
        char want[128];
        snprintf(want, sizeof want, "--zero must be 0 (optimizer state on every rank) or 1 (sharded over the ranks), "
                                    "not %s",
                 bad[i]);
        LT_CHECK_MSG(r.status == 2 && r.err && strstr(r.err, want), "--zero %s: exit %d: %s", bad[i], r.status,
                     r.err ? r.err : "");
        lt_cmd_free(&r);
    }
    lt_cmd_result r = run("%s %s --config %s --zero one --out %s/bad", LOOM, COMMON, CONFIG, WORK);
    LT_CHECK_MSG(r.status != 0 && r.err && strstr(r.err, "--zero") && strstr(r.err, "one"), "--zero one: exit %d: %s",
                 r.status, r.err ? r.err : "");
    lt_cmd_free(&r);
}

/* lm_trainer_set_zero in a world of one: the stages, the bytes, a change after a step. */
static void test_set_zero_api(void) {
    lm_ctx *ctx = NULL;
    lm_train_model *m = NULL;
    lm_data_loader *data = NULL;
    lm_trainer *t = NULL;
    const char *paths[1] = {SHARD};
    lm_train_options o;
    lm_train_options_default(&o);
    o.steps = 2, o.batch = 2, o.seq = 16;
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &ctx));
    LT_CHECK_OK(lm_train_model_init(CONFIG, 1, lm_device_cpu(), &m));
    LT_CHECK_OK(lm_data_loader_create(1, paths, 16, 1, 1, &data));
    LT_CHECK_OK(lm_trainer_create(m, data, &o, &t));
    if (!t) goto done;
    int64_t whole = 8 * lm_train_model_numel(m);
    LT_CHECK(lm_trainer_zero_stage(t) == 0 && lm_trainer_optimizer_state_bytes(t) == whole);
    LT_CHECK_STATUS(lm_trainer_set_zero(t, 2), LM_INVALID_ARGUMENT);
    LT_CHECK_MSG(strstr(lm_last_error(), "ZeRO stage 2 is not supported") != NULL, "%s", lm_last_error());
    LT_CHECK_STATUS(lm_trainer_set_zero(t, -1), LM_INVALID_ARGUMENT);
    LT_CHECK_OK(lm_trainer_set_zero(t, 1));
    LT_CHECK(lm_trainer_zero_stage(t) == 1 && lm_trainer_optimizer_state_bytes(t) == whole); /* one rank: all of it */
    LT_CHECK_OK(lm_trainer_set_dist(t, NULL));
    LT_CHECK(lm_trainer_zero_stage(t) == 1);
    /* the slices of 2 and 3 ranks (r x numel / N rounded down to 16) start inside
     * tensors or on their edges: the 2-rank boundary cuts one (a piece with decay) */
    int cuts = 0;
    for (int k = 2; k <= 3; k++)
        for (int r = 1; r < k; r++) {
            int64_t n = lm_train_model_numel(m), at = (r * n / k) & ~(int64_t)15;
            for (int i = 0; i < lm_train_model_param_count(m); i++) {
                lm_train_param p, p0;
                LT_CHECK_OK(lm_train_model_param(m, i, &p));
                LT_CHECK_OK(lm_train_model_param(m, 0, &p0));
                int64_t first = (const float *)p.value.data - (const float *)p0.value.data;
                if (at > first && at < first + lm_tensor_view_numel(&p.value)) {
                    printf("%d ranks: slice %d starts at %lld, inside %s\n", k, r, (long long)at, p.name);
                    cuts++;
                }
            }
        }
    LT_CHECK(cuts >= 1);
    lm_train_step_info info;
    LT_CHECK_OK(lm_trainer_step(t, ctx, &info));
    LT_CHECK(isfinite(info.loss) && info.grad_norm > 0);
    LT_CHECK_STATUS(lm_trainer_set_zero(t, 0), LM_INVALID_ARGUMENT);
    LT_CHECK(lm_trainer_zero_stage(t) == 1 && lm_trainer_step_count(t) == 1);
done:
    lm_trainer_destroy(t);
    lm_data_loader_destroy(data);
    lm_train_model_destroy(m);
    lm_ctx_destroy(ctx);
}

/* ---- MPI runs ------------------------------------------------------------------------------------ */

/* The reference runs (WORK/NAME), all from the same seeded init:
 *   one     1 rank x grad-accum 2            one_z1   the same with --zero 1
 *   z0      2 ranks                          z1       2 ranks with --zero 1
 *   one3    1 rank x grad-accum 3            z3       3 ranks with --zero 1 */
static int g_ready;
static char g_err_z0[16384], g_err_z1[16384], g_err_z3[16384], g_err_one_z1[16384];

static void prepare(void) {
    g_ready = dist_run_ok(NULL, 0, "%s %s --config %s --grad-accum 2 --out %s/one", LOOM, COMMON, CONFIG, WORK) &&
              dist_run_ok(g_err_one_z1, sizeof g_err_one_z1,
                          "%s %s --config %s --grad-accum 2 --zero 1 --out %s/one_z1", LOOM, COMMON, CONFIG, WORK) &&
              dist_run_ok(g_err_z0, sizeof g_err_z0, MPIRUN " -np 2 %s %s --config %s --out %s/z0", LOOM, COMMON,
                          CONFIG, WORK) &&
              dist_run_ok(g_err_z1, sizeof g_err_z1, MPIRUN " -np 2 %s %s --config %s --zero 1 --out %s/z1", LOOM,
                          COMMON, CONFIG, WORK) &&
              dist_run_ok(NULL, 0, "%s %s --config %s --grad-accum 3 --out %s/one3", LOOM, COMMON, CONFIG, WORK) &&
              dist_run_ok(g_err_z3, sizeof g_err_z3, MPIRUN " -np 3 %s %s --config %s --zero 1 --out %s/z3", LOOM,
                          COMMON, CONFIG, WORK);
}

static void test_zero1_takes_the_replicated_steps(void) {
    if (!g_ready) return;
    check_losses("2 ranks --zero 1 vs --zero 0", WORK "/z1", WORK "/z0", 0, 1);
    check_identical("2 ranks --zero 1 vs --zero 0", WORK "/z1", WORK "/z0");
    check_losses("1 rank --zero 1 vs --zero 0", WORK "/one_z1", WORK "/one", 0, 1);
    check_identical("1 rank --zero 1 vs --zero 0", WORK "/one_z1", WORK "/one");
    check_losses("3 ranks --zero 1 vs 1 rank x grad-accum 3", WORK "/z3", WORK "/one3", 1e-5, 1);
    check_weights("3 ranks --zero 1 vs 1 rank x grad-accum 3", WORK "/z3", WORK "/one3", 1e-5);
}

/* The start-up line that names how the ranks' gradients are summed (lm_trainer_collectives):
 * MPI on the CPU; none for one rank. */
static void test_the_run_names_its_collectives(void) {
    if (!g_ready) return;
    LT_CHECK_MSG(strstr(g_err_z0, "loom train: gradients summed over the ranks by MPI in host memory"), "2 ranks: %s",
                 g_err_z0);
    LT_CHECK_MSG(!strstr(g_err_one_z1, "gradients summed"), "1 rank names a sum over ranks: %s", g_err_one_z1);
}

static void test_optimizer_state_per_rank(void) {
    if (!g_ready) return;
    lm_train_model *m = NULL;
    LT_CHECK_OK(lm_train_model_load(WORK "/z0/final", lm_device_cpu(), &m));
    double whole = m ? 8.0 * (double)lm_train_model_numel(m) : 0;
    lm_train_model_destroy(m);
    double b0 = state_bytes(g_err_z0), b1 = state_bytes(g_err_z1), b3 = state_bytes(g_err_z3),
           b1r = state_bytes(g_err_one_z1);
    printf("optimizer state per rank: %.0f bytes replicated (2 ranks), %.0f with ZeRO-1 over 2 ranks (%.3f of it), "
           "%.0f over 3 ranks (%.3f), %.0f over 1 rank\n",
           b0, b1, b1 / whole, b3, b3 / whole, b1r);
    LT_CHECK_MSG(b0 == whole, "replicated: %.0f bytes per rank, expected 8 x numel = %.0f: %s", b0, whole, g_err_z0);
    LT_CHECK_MSG(b1 >= whole / 2 && b1 <= whole / 2 + 8 * 16, "ZeRO-1 over 2: %.0f bytes, expected ~%.0f: %s", b1,
                 whole / 2, g_err_z1);
    LT_CHECK_MSG(b3 >= whole / 3 && b3 <= whole / 3 + 8 * 16, "ZeRO-1 over 3: %.0f bytes, expected ~%.0f: %s", b3,
                 whole / 3, g_err_z3);
    LT_CHECK_MSG(b1r == whole, "ZeRO-1 over 1 rank: %.0f bytes, expected %.0f: %s", b1r, whole, g_err_one_z1);
    LT_CHECK(strstr(g_err_z1, "(ZeRO-1 over 2 ranks;") != NULL && strstr(g_err_z0, "replicated on each of 2 ranks"));
}

static void test_resume_across_zero_settings(void) {
    if (!g_ready) return;
    /* a 2-rank --zero 1 checkpoint -> 1 rank x grad-accum 2 without ZeRO */
    dist_run_ok(NULL, 0,
                "rm -rf %s/ra && cp -r %s/z1 %s/ra && %s %s --resume %s/ra/checkpoint-000003 --grad-accum 2 --out "
                "%s/ra",
                WORK, WORK, WORK, LOOM, COMMON, WORK, WORK);
    check_losses("--zero 1 x 2 ranks resumed with --zero 0 on 1 rank", WORK "/ra", WORK "/one", 1e-5, 1);
    check_weights("--zero 1 x 2 ranks resumed with --zero 0 on 1 rank", WORK "/ra", WORK "/one", 1e-6);
    /* a 1-rank checkpoint without ZeRO -> 2 ranks with --zero 1 */
    dist_run_ok(NULL, 0,
                "rm -rf %s/rb && cp -r %s/one %s/rb && " MPIRUN " -np 2 %s %s --resume %s/rb/checkpoint-000003 "
                "--zero 1 --out %s/rb",
                WORK, WORK, WORK, LOOM, COMMON, WORK, WORK);
    check_losses("--zero 0 x 1 rank resumed with --zero 1 on 2 ranks", WORK "/rb", WORK "/z1", 1e-5, 1);
    check_weights("--zero 0 x 1 rank resumed with --zero 1 on 2 ranks", WORK "/rb", WORK "/z1", 1e-6);
    /* --zero 1 -> --zero 1: each rank reads its slice back; bit-exact like any resume */
    dist_run_ok(NULL, 0, "rm -rf %s/rc && cp -r %s/z1 %s/rc && " MPIRUN " -np 2 %s %s --resume %s/rc/checkpoint-000003 "
                    "--zero 1 --out %s/rc",
           WORK, WORK, WORK, LOOM, COMMON, WORK, WORK);
    check_losses("--zero 1 resumed with --zero 1", WORK "/rc", WORK "/z1", 0, 1);
    check_identical("--zero 1 resumed with --zero 1", WORK "/rc", WORK "/z1");
    /* the checkpoints of a ZeRO-1 run are complete ones of the one format */
    int64_t step = 0;
    LT_CHECK_OK(lm_train_checkpoint_check(WORK "/z1/checkpoint-000003", &step));
    LT_CHECK(step == 3);
}

static void test_ranks_with_different_zero_are_refused(void) {
    if (!g_ready) return;
    lt_cmd_result r = run("timeout %d " MPIRUN " -np 1 %s %s --config %s --out %s/mix : -np 1 %s %s --config %s "
                          "--zero 1 --out %s/mix",
                          DEADLINE, LOOM, COMMON, CONFIG, WORK, LOOM, COMMON, CONFIG, WORK);
    LT_CHECK_MSG(r.status != 0 && r.status != 124 && r.err && strstr(r.err, "rank 1: loom train: the training options"),
                 "ranks with different --zero: exit %d: %s", r.status, r.err ? r.err : "");
    lt_cmd_free(&r);
}

int main(void) {
    /* the test itself is never one of the ranks */
    unsetenv("OMPI_COMM_WORLD_SIZE"), unsetenv("PMI_SIZE"), unsetenv("PMIX_SIZE"), unsetenv("MV2_COMM_WORLD_SIZE");
    LT_CHECK(dist_run_ok(NULL, 0, "rm -rf '%s' && mkdir -p '%s'", WORK, WORK));
    LT_CHECK(dist_run_ok(NULL, 0, "%s data prepare --tokenizer %s %s/tests/data/train/corpus.txt -o %s >/dev/null",
                         LOOM, TOKENIZER, LOOM_SOURCE_DIR, SHARD));
    LT_RUN(test_bad_zero_values_are_refused);
    LT_RUN(test_set_zero_api);
    const char *why = NULL;
    lt_cmd_result r = lt_run_cmd("command -v mpirun");
    if (!lm_dist_available()) why = "loom was built without MPI";
    else if (r.status != 0) why = "mpirun is not installed (Debian: openmpi-bin)";
    lt_cmd_free(&r);
    if (why) {
        if (lt_finish() != 0) return 1;
        lt_skip(why);
    }
    dist_test_sanitizer_env();
    prepare();
    LT_RUN(test_zero1_takes_the_replicated_steps);
    LT_RUN(test_the_run_names_its_collectives);
    LT_RUN(test_optimizer_state_per_rank);
    LT_RUN(test_resume_across_zero_settings);
    LT_RUN(test_ranks_with_different_zero_are_refused);
    return lt_finish();
}
