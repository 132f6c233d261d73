/* `--precision exact|fast` on the commands that run a model (generate, chat, logits,
 * eval, bench, serve; docs/QUANTIZATION.md "Fast precision"), run as a user would run
 * them: a bad value ends each command at once (exit 2) with a message naming the
 * option and the value; fast on CUDA for the bf16 model is refused (exit 1) saying
 * why (it is fp8 weights' mode there; a build without CUDA refuses the device); on a CPU without AVX512_BF16 fast is refused naming the feature,
 * on one with it `loom logits` runs; `loom bench prefill` prints the precision in its
 * JSON; `loom eval --precision fast --reference bf16` runs the inference path and
 * reports the reference as exact; on the AVX2 path (LOOM_CPU_ISA=avx2) an int8 model runs
 * fast and the bf16 one is refused naming a matrix; a bad LOOM_CPU_ISA exits 2.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include "loom/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LOOM LOOM_BINARY_DIR "/loom"
#define MODEL LOOM_SOURCE_DIR "/models/default"
#define CORPUS LOOM_SOURCE_DIR "/tests/data/train/corpus.txt"

static int g_fast_ok; /* this CPU runs fast */

static lt_cmd_result run(const char *fmt, const char *arg) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, arg);
    return lt_run_cmd(cmd);
}

static void test_bad_value_is_refused_by_every_command(void) {
    static const char *const cmds[] = {
        "generate --model " MODEL " --prompt hi --max-new 1",
        "chat --model " MODEL,
        "logits --model " MODEL " --ids 1,2",
        "eval --model " MODEL " --data /nonexistent.bin",
        "bench prefill --model " MODEL " --prompt 4 --repeat 1",
        "serve --model " MODEL " --port 0",
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        lt_cmd_result r = run(LOOM " %s --precision turbo", cmds[i]);
        LT_CHECK_MSG(r.status == 2 && r.err && strstr(r.err, "--precision 'turbo'") && strstr(r.err, "exact or fast"),
                     "%s: exit %d, stderr: %s", cmds[i], r.status, r.err ? r.err : "");
        lt_cmd_free(&r);
        r = run(LOOM " %s --help", cmds[i]);
        LT_CHECK_MSG(r.out && r.err && (strstr(r.out, "--precision") || strstr(r.err, "--precision")),
                     "%s --help does not list --precision", cmds[i]);
        lt_cmd_free(&r);
    }
}

static void test_fast_on_cuda_is_refused(void) {
    lt_cmd_result r = run(LOOM " logits --model %s --ids 1,2 --device cuda --precision fast", MODEL);
    /* a bf16 model: fast on CUDA is for fp8 weights (or, in a build without CUDA, the
     * device is refused); either way exit 1 naming CUDA */
    LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, "CUDA") &&
                     (strstr(r.err, "fp8") || strstr(r.err, "without CUDA") || strstr(r.err, "device")),
                 "exit %d: %s", r.status, r.err ? r.err : "");
    lt_cmd_free(&r);
}

static void test_fast_runs_or_names_the_missing_feature(void) {
    lt_cmd_result r = run(LOOM " logits --model %s --ids 1,2,3,4,5,6,7,8,9,10,11,12 --precision fast", MODEL);
    if (g_fast_ok) {
        LT_CHECK_MSG(r.status == 0 && r.out && strlen(r.out) > 0, "exit %d: %s", r.status, r.err ? r.err : "");
    } else {
        LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, "AVX512_BF16"), "exit %d: %s", r.status,
                     r.err ? r.err : "");
        printf("  this CPU lacks AVX512_BF16: --precision fast is refused (checked)\n");
    }
    lt_cmd_free(&r);
}

static void test_bench_json_names_the_precision(void) {
    lt_cmd_result r = run(LOOM " bench prefill --model %s --prompt 16 --repeat 1 --threads 1", MODEL);
    LT_CHECK_MSG(r.status == 0 && r.out && strstr(r.out, "\"precision\":\"exact\""), "exit %d: %s %s", r.status,
                 r.out ? r.out : "", r.err ? r.err : "");
    lt_cmd_free(&r);
    if (!g_fast_ok) return;
    r = run(LOOM " bench prefill --model %s --prompt 16 --repeat 1 --threads 1 --precision fast", MODEL);
    LT_CHECK_MSG(r.status == 0 && r.out && strstr(r.out, "\"precision\":\"fast\""), "exit %d: %s %s", r.status,
                 r.out ? r.out : "", r.err ? r.err : "");
    lt_cmd_free(&r);
}

static void test_eval_fast_reports_an_exact_reference(void) {
    if (!g_fast_ok) return;
    char dir[] = "/tmp/loom_test_precision_XXXXXX", cmd[2048];
    if (!mkdtemp(dir)) {
        LT_CHECK_MSG(0, "mkdtemp failed");
        return;
    }
    snprintf(cmd, sizeof cmd, LOOM " data prepare --tokenizer " MODEL "/tokenizer.json " CORPUS " -o %s/d.bin", dir);
    lt_cmd_result r = lt_run_cmd(cmd);
    LT_CHECK_MSG(r.status == 0, "data prepare: %s", r.err ? r.err : "");
    lt_cmd_free(&r);
    snprintf(cmd, sizeof cmd,
             LOOM " eval --model " MODEL " --data %s/d.bin --seq 32 --max-windows 2 --precision fast --reference bf16 "
                  "--threads 1 --quiet",
             dir);
    r = lt_run_cmd(cmd);
    LT_CHECK_MSG(r.status == 0 && r.out && strstr(r.out, "\"precision\":\"fast\"") &&
                     strstr(r.out, "\"reference\":{\"weights\":\"bf16\",\"precision\":\"exact\"") &&
                     strstr(r.out, "\"path\":\"inference\""),
                 "exit %d: %s %s", r.status, r.out ? r.out : "", r.err ? r.err : "");
    lt_cmd_free(&r);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    r = lt_run_cmd(cmd);
    lt_cmd_free(&r);
}

/* The AVX2 path (LOOM_CPU_ISA=avx2, the path of CPUs without AVX-512): fast runs an int8
 * model and refuses the bf16 one naming a matrix and the feature; LOOM_CPU_ISA must name
 * a path this CPU runs (exit 2 otherwise); `loom cpu` reports avx_vnni. */
static void test_avx2_path_and_isa_variable(void) {
    const lm_cpu_features *f = lm_cpu_get_features();
    lt_cmd_result r = run("LOOM_CPU_ISA=bogus " LOOM " cpu%s", "");
    LT_CHECK_MSG(r.status == 2 && r.err && strstr(r.err, "LOOM_CPU_ISA=bogus") && strstr(r.err, "avx2"), "exit %d: %s",
                 r.status, r.err ? r.err : "");
    lt_cmd_free(&r);
    r = run(LOOM " cpu%s", "");
    LT_CHECK_MSG(r.status == 0 && r.out && strstr(r.out, "\"avx_vnni\":"), "exit %d: %s", r.status, r.out ? r.out : "");
    lt_cmd_free(&r);
    if (!(f->avx2 && f->fma && f->f16c)) {
        printf("  (no AVX2: the avx2 path is not run here)\n");
        return;
    }
    r = run("LOOM_CPU_ISA=avx2 " LOOM " logits --model %s --ids 1,2,3 --precision fast", MODEL);
    LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, "AVX512_BF16") && strstr(r.err, ".weight") &&
                     strstr(r.err, "--weights int8"),
                 "exit %d: %s", r.status, r.err ? r.err : "");
    lt_cmd_free(&r);
    r = run("LOOM_CPU_ISA=avx2 " LOOM " logits --model %s --ids 1,2,3 --weights int8 --precision fast", MODEL);
    LT_CHECK_MSG(r.status == 0 && r.out && strstr(r.out, "\"pos\":2"), "exit %d: %s", r.status, r.err ? r.err : "");
    lt_cmd_free(&r);
}

int main(void) {
    const lm_cpu_features *f = lm_cpu_get_features();
    g_fast_ok = lm_precision_check(lm_device_cpu(), LM_PRECISION_FAST) == LM_OK && f->avx512_bf16 && f->avx512bw &&
                f->avx512vl; /* bf16 weights run fast */
    LT_RUN(test_bad_value_is_refused_by_every_command);
    LT_RUN(test_fast_on_cuda_is_refused);
    LT_RUN(test_fast_runs_or_names_the_missing_feature);
    LT_RUN(test_bench_json_names_the_precision);
    LT_RUN(test_eval_fast_reports_an_exact_reference);
    LT_RUN(test_avx2_path_and_isa_variable);
    return lt_finish();
}
