/* The loom CLI's machine-readable contracts, run as a user would run them:
 * `loom logits` JSON lines (keys, sorted top list, probes, values equal to the library's
 * forward pass), `loom bench decode` JSON (roofline, achieved bandwidth, kernels per step), `loom generate --print-ids` (equal to transformers' greedy ids from
 * tests/data/models), `loom tokenize` both ways on a real tokenizer (skipped if the
 * npm tokenizers are absent), `loom train` on the CPU (log lines with per-step times,
 * --no-shuffle serving the same batches whatever the seed, the LOOM_PROFILE report,
 * --dtype errors), `loom plan layer` on real checkpoints (its simulation agrees with
 * the CPU executor), `loom plan decode` (the schedule checked and run against the executor), `loom chat` over stdin, `loom tokenizer train`, `loom convert` (exact rounding both ways,
 * refusals), `loom eval` (equal to the library's loss), the default model (held-out loss, used without --model),
 * and the exit codes and messages of bad invocations.
 * LM_TEST_LABELS: unit model
 */
#include "harness.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define LOOM LOOM_BINARY_DIR "/loom"
#define MODELS LOOM_SOURCE_DIR "/tests/data/models/"

static char *slurp(const char *path) {
    char *buf = NULL;
    size_t n = 0;
    if (lm_file_read_all(path, &buf, &n) != LM_OK) return NULL;
    return buf;
}

static void test_logits_lines_match_the_library(void) {
    lt_cmd_result r = lt_run_cmd(LOOM " logits --model " MODELS "llama_gqa2_f32 --ids 3,1,4,1,5 --top 3 --probe 7,9 --threads 1");
    LT_CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    lm_model *m = NULL;
    LT_CHECK_OK(lm_model_load(MODELS "llama_gqa2_f32", lm_device_cpu(), &m));
    lm_ctx *ctx = NULL;
    lm_kv_cache *c = NULL;
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &ctx));
    LT_CHECK_OK(lm_kv_cache_create(m, 1, 5, &c));
    int64_t V = lm_model_get_config(m)->vocab_size;
    float *want = malloc(sizeof(float) * 5 * (size_t)V);
    int32_t ids[5] = {3, 1, 4, 1, 5};
    int slot = 0;
    LT_CHECK_OK(lm_model_forward(m, ctx, c, &slot, 1, ids, 5, want, 1));
    char *line = r.out, *save = NULL;
    int lines = 0;
    for (char *l = r.out ? strtok_r(line, "\n", &save) : NULL; l; l = strtok_r(NULL, "\n", &save), lines++) {
        json_error_t e;
        json_t *o = json_loads(l, 0, &e);
        LT_CHECK_MSG(o && json_is_object(o), "line %d is not a JSON object: %s", lines, l);
        if (!o) continue;
        LT_CHECK(json_integer_value(json_object_get(o, "pos")) == lines);
        json_t *top = json_object_get(o, "top"), *probe = json_object_get(o, "probe");
        LT_CHECK(json_array_size(top) == 3 && json_array_size(probe) == 2);
        const float *row = want + lines * V;
        double prev = INFINITY;
        for (size_t k = 0; k < json_array_size(top); k++) {
            json_t *pair = json_array_get(top, k);
            int64_t id = json_integer_value(json_array_get(pair, 0));
            double logit = json_number_value(json_array_get(pair, 1));
            LT_CHECK(id >= 0 && id < V && logit <= prev);
            if (id >= 0 && id < V) LT_CHECK_MSG(fabs(logit - row[id]) < 1e-5, "pos %d top %zu: %g vs %g", lines, k, logit, row[id]);
            prev = logit;
        }
        LT_CHECK(fabs(json_number_value(json_array_get(probe, 0)) - row[7]) < 1e-5);
        LT_CHECK(fabs(json_number_value(json_array_get(probe, 1)) - row[9]) < 1e-5);
        LT_CHECK(json_number_value(json_object_get(o, "logsumexp")) >= prev);
        json_decref(o);
    }
    LT_CHECK(lines == 5);
    free(want);
    lm_kv_cache_destroy(c);
    lm_ctx_destroy(ctx);
    lm_model_destroy(m);
    lt_cmd_free(&r);
}

/* `loom bench decode` prints one JSON object: the speed, the roofline beside the weight
 * bandwidth the steps achieved (bytes_per_step x steps/s), and kernels_per_step, 0 on
 * the CPU (no captured step). No timing is asserted beyond positivity. */
static void test_bench_decode_json(void) {
    lt_cmd_result r = lt_run_cmd(LOOM " bench decode --model " MODELS "llama_gqa2_f32 --prompt 4 --tokens 3 --repeat 2 "
                                      "--threads 1");
    LT_CHECK_MSG(r.status == 0, "bench decode exited %d: %s", r.status, r.err ? r.err : "");
    json_error_t e;
    json_t *o = r.out ? json_loads(r.out, 0, &e) : NULL;
    LT_CHECK_MSG(o != NULL, "bench decode output is not one JSON object: %s", r.out ? r.out : "(none)");
    if (o) {
        const char *keys[] = {"tok_per_s", "bytes_per_step", "achieved_gb_s", "roofline_tok_per_s",
                              "fraction_of_roofline", "kernels_per_step"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            LT_CHECK_MSG(json_object_get(o, keys[i]) != NULL, "no '%s' in %s", keys[i], r.out);
        double tps = json_number_value(json_object_get(o, "tok_per_s"));
        double bytes = json_number_value(json_object_get(o, "bytes_per_step"));
        double achieved = json_number_value(json_object_get(o, "achieved_gb_s"));
        LT_CHECK(tps > 0 && bytes > 0);
        /* batch 1: one step per token (the printed value has two decimals) */
        LT_CHECK_MSG(fabs(achieved - bytes * tps / 1e9) <= 0.006 + 1e-6 * achieved,
                     "achieved %.4f GB/s, bytes x tok/s gives %.4f", achieved, bytes * tps / 1e9);
        LT_CHECK(json_integer_value(json_object_get(o, "kernels_per_step")) == 0);
    }
    json_decref(o);
    lt_cmd_free(&r);
}

/* `loom bench prefill` reports the prompt's FLOPs and the rate its best run reached. The
 * FLOPs of the two test models, by hand (2 a multiply-add; hidden 64, 4 heads of 16, 2 kv
 * heads, MLP 128, 2 layers, vocabulary 256): a token's layer products are 2 (64 x 8 x 16 +
 * 64 x 64 + 3 x 64 x 128) = 73,728; a scored (query, key) pair costs 4 x 4 x 16 = 256 a
 * layer; the head over the last position 2 x 64 x 256 = 32,768 a row.
 * llama_gqa2_f32, 2 rows of 8: (2 x (73,728 x 8 + 256 x 36) + 32,768) x 2 = 2,461,696.
 * mistral_window_f32 (window 7 in every layer), 12 tokens: query i scores min(i + 1, 7)
 * keys, 28 + 5 x 7 = 63 pairs: 2 x (73,728 x 12 + 256 x 63) + 32,768 = 1,834,496. */
static void test_bench_prefill_flops(void) {
    const struct {
        const char *args;
        double flops;
    } cases[] = {{"llama_gqa2_f32 --prompt 8 --batch 2", 2461696.0}, {"mistral_window_f32 --prompt 12", 1834496.0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, LOOM " bench prefill --repeat 2 --threads 1 --model " MODELS "%s", cases[i].args);
        lt_cmd_result r = lt_run_cmd(cmd);
        LT_CHECK_MSG(r.status == 0, "%s exited %d: %s", cmd, r.status, r.err ? r.err : "");
        json_error_t e;
        json_t *o = r.out ? json_loads(r.out, 0, &e) : NULL;
        LT_CHECK_MSG(o != NULL, "bench prefill output is not one JSON object: %s", r.out ? r.out : "(none)");
        if (o) {
            double flops = json_number_value(json_object_get(o, "prefill_flops"));
            double tflops = json_number_value(json_object_get(o, "achieved_tflop_s"));
            double best = json_number_value(json_object_get(o, "best_s"));
            LT_CHECK_MSG(flops == cases[i].flops, "%s: prefill_flops %.0f, by hand %.0f", cmd, flops, cases[i].flops);
            /* best_s is printed to the microsecond (a relative error up to 0.5e-6 / best_s),
             * the rate to 6 decimals */
            LT_CHECK_MSG(best > 0 && tflops > 0 &&
                             fabs(tflops - flops / best / 1e12) <= 1e-6 + 1.01 * tflops * 0.5e-6 / best,
                         "%s: achieved %.6f TFLOP/s, flops / best_s gives %.6f", cmd, tflops, flops / best / 1e12);
        }
        json_decref(o);
        lt_cmd_free(&r);
    }
}

static void test_generate_print_ids_equals_transformers_greedy(void) {
    lt_fixture fx;
    if (!lt_fixture_load("tests/data/models/qwen3_headdim/refs.lmfx", &fx)) return;
    const lt_fixture_tensor *ids = lt_fixture_get(&fx, "prompt0_ids"), *greedy = lt_fixture_get(&fx, "prompt0_greedy");
    char cmd[2048], *p = cmd;
    p += snprintf(p, sizeof cmd, LOOM " generate --model " MODELS "qwen3_headdim --greedy --print-ids --ignore-eos --max-new %lld --ids ",
                  (long long)greedy->numel);
    for (int64_t i = 0; i < ids->numel; i++) p += snprintf(p, (size_t)(cmd + sizeof cmd - p), i ? ",%lld" : "%lld", (long long)ids->i64[i]);
    lt_cmd_result r = lt_run_cmd(cmd);
    LT_CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    json_t *arr = r.out ? json_loads(r.out, 0, NULL) : NULL;
    LT_CHECK(arr && json_array_size(arr) == (size_t)greedy->numel);
    for (size_t i = 0; arr && i < json_array_size(arr) && i < (size_t)greedy->numel; i++)
        LT_CHECK_MSG(json_integer_value(json_array_get(arr, i)) == greedy->i64[i], "token %zu differs", i);
    json_decref(arr);
    lt_cmd_free(&r);
    lt_fixture_free(&fx);
}

static void test_tokenize_round_trip_on_a_real_tokenizer(void) {
    const char *tok = LOOM_SOURCE_DIR "/third_party/tokenizers/qwen3/tokenizer.json";
    FILE *f = fopen(tok, "rb");
    if (!f) {
        printf("  (qwen3 tokenizer.json absent: run scripts/fetch_tokenizers.sh; part skipped)\n");
        return;
    }
    fclose(f);
    lt_cmd_result r = lt_run_cmd("printf '%s\\n' '\"Hello world\"' '\"\"' | " LOOM " tokenize --tokenizer " LOOM_SOURCE_DIR
                       "/third_party/tokenizers/qwen3/tokenizer.json");
    LT_CHECK_MSG(r.status == 0 && r.out && strcmp(r.out, "[9707,1879]\n[]\n") == 0, "tokenize gave '%s' / %s",
                 r.out ? r.out : "", r.err ? r.err : "");
    lt_cmd_free(&r);
    r = lt_run_cmd("printf '%s\\n' '[9707,1879]' | " LOOM " tokenize --decode --tokenizer " LOOM_SOURCE_DIR
            "/third_party/tokenizers/qwen3/tokenizer.json");
    LT_CHECK_MSG(r.status == 0 && r.out && strcmp(r.out, "\"Hello world\"\n") == 0, "decode gave '%s'", r.out ? r.out : "");
    lt_cmd_free(&r);
    r = lt_run_cmd("printf '%s\\n' 'not json' | " LOOM " tokenize --tokenizer " LOOM_SOURCE_DIR "/third_party/tokenizers/qwen3/tokenizer.json");
    LT_CHECK(r.status == 1 && r.err && strstr(r.err, "line 1") && strstr(r.err, "invalid JSON"));
    lt_cmd_free(&r);
}

/* The "loss" values of a train log, in order (at most max). */
static int log_losses(const char *dir, double *out, int max) {
    char path[512];
    snprintf(path, sizeof path, "%s/log.jsonl", dir);
    char *text = slurp(path);
    int n = 0;
    for (char *line = text ? strtok(text, "\n") : NULL; line && n < max; line = strtok(NULL, "\n")) {
        json_t *j = json_loads(line, 0, NULL);
        json_t *l = j ? json_object_get(j, "loss") : NULL;
        if (l) {
            out[n++] = json_number_value(l);
            LT_CHECK_MSG(json_is_number(json_object_get(j, "step_s")), "no step_s in '%s'", line);
        }
        json_decref(j);
    }
    lm_free(text);
    return n;
}

static void test_train_on_the_cpu(void) {
    const char *shard = LOOM_BINARY_DIR "/cli_train.bin", *out = LOOM_BINARY_DIR "/cli_train_out";
    lt_cmd_result r = lt_run_cmd(LOOM " data prepare --tokenizer " LOOM_SOURCE_DIR "/tests/data/train/tokenizer.json " LOOM_SOURCE_DIR
                            "/tests/data/train/corpus.txt -o " LOOM_BINARY_DIR "/cli_train.bin");
    LT_CHECK_MSG(r.status == 0, "data prepare: exit %d: %s", r.status, r.err ? r.err : "");
    lt_cmd_free(&r);
    double a[4], b[4], c[4];
    const char *model = LOOM_SOURCE_DIR "/tests/data/train/loom_checkpoint";
    char cmd[2048];
    for (int k = 0; k < 3; k++) {
        snprintf(cmd, sizeof cmd,
                 "%s%s train --model %s --data %s --out %s --steps 3 --batch 2 --seq 16 --threads 1 --seed %d %s",
                 k == 0 ? "LOOM_PROFILE=1 " : "", LOOM, model, shard, out, k == 1 ? 7 : 1, k < 2 ? "--no-shuffle" : "");
        r = lt_run_cmd(cmd);
        LT_CHECK_MSG(r.status == 0, "train run %d: exit %d: %s", k, r.status, r.err ? r.err : "");
        LT_CHECK_MSG(r.err && strstr(r.err, "f32 compute on cpu") && !strstr(r.err, "MFU"), "stderr: %s",
                     r.err ? r.err : "");
        if (k == 0)
            LT_CHECK_MSG(r.err && strstr(r.err, "profile (LOOM_PROFILE)") && strstr(r.err, "bwd ag_linear") &&
                             strstr(r.err, "step adamw"),
                         "no profile report: %s", r.err ? r.err : "");
        LT_CHECK(log_losses(out, k == 0 ? a : k == 1 ? b : c, 4) == 3);
        lt_cmd_free(&r);
    }
    /* file order whatever the seed: the same batches and losses; shuffled: others */
    for (int i = 0; i < 3; i++) LT_CHECK_MSG(a[i] == b[i], "step %d: %.9g vs %.9g with --no-shuffle", i, a[i], b[i]);
    LT_CHECK_MSG(a[0] != c[0], "shuffled and file-order first batches gave the same loss %.9g", a[0]);
    /* --log-every 2 over 3 steps: steps 2 and 3 (the last) are logged, with run 0's losses;
     * the step form is reported (the CPU: eager, statistics read every step) */
    snprintf(cmd, sizeof cmd, "%s train --model %s --data %s --out %s --steps 3 --batch 2 --seq 16 --threads 1 "
             "--no-shuffle --log-every 2", LOOM, model, shard, out);
    r = lt_run_cmd(cmd);
    LT_CHECK_MSG(r.status == 0 && r.err && strstr(r.err, "training steps: eager (statistics read by the host"),
                 "--log-every: exit %d: %s", r.status, r.err ? r.err : "");
    double d[4];
    int nd = log_losses(out, d, 4);
    LT_CHECK_MSG(nd == 2 && d[0] == a[1] && d[1] == a[2], "--log-every 2: %d lines", nd);
    lt_cmd_free(&r);
    struct {
        const char *extra;
        int status;
        const char *needle;
    } bad[] = {{"--dtype bf16", 1, "needs a device with 16-bit matrix units"}, {"--dtype f16", 2, "--dtype must be f32 or bf16"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s train --model %s --data %s --out %s --steps 1 --batch 2 --seq 16 %s", LOOM, model,
                 shard, out, bad[i].extra);
        r = lt_run_cmd(cmd);
        LT_CHECK_MSG(r.status == bad[i].status && r.err && strstr(r.err, bad[i].needle), "'%s': exit %d, stderr '%s'",
                     bad[i].extra, r.status, r.err ? r.err : "");
        lt_cmd_free(&r);
    }
}

/* `loom plan layer`: a real checkpoint's decoder layer (GQA, qkv biases; qwen3's
 * head_dim and q/k norms; mistral's sliding window of 7 over 24 tokens) planned on a small tile machine, simulated, and checked
 * against the CPU executor; the JSON names the architecture and the agreement. */
static void test_plan_layer_agrees_with_the_cpu_executor(void) {
    const char *models[] = {"qwen2_bias_sharded", "qwen3_headdim", "mistral_window_f32"};
    for (int i = 0; i < 3; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, LOOM " plan layer --model " MODELS "%s --tokens 24 --layer 1 --machine small16 --json",
                 models[i]);
        lt_cmd_result r = lt_run_cmd(cmd);
        LT_CHECK_MSG(r.status == 0, "%s: exit %d: %s", models[i], r.status, r.err ? r.err : "");
        json_error_t je;
        json_t *o = r.out ? json_loads(r.out, 0, &je) : NULL;
        LT_CHECK_MSG(o && json_is_true(json_object_get(o, "cpu_agrees")), "%s: %s", models[i], r.out ? r.out : "");
        double nmse = json_number_value(json_object_get(o, "cpu_nmse"));
        LT_CHECK_MSG(nmse <= 1e-5, "%s: NMSE %g", models[i], nmse); /* tighter than the CLI's own 1e-4 gate */
        json_decref(o);
        lt_cmd_free(&r);
    }
}

/* `loom plan decode`: the step of a bf16 checkpoint as SM work items, checked, and run
 * on the CPU in two interleavings against the executor; the JSON reports the schedule,
 * the predicted step (the cost model's) and both verdicts. */
static void test_plan_decode_json(void) {
    lt_cmd_result r = lt_run_cmd(LOOM " plan decode --model " MODELS "llama3_scaled_bf16 --sms 6 --steps 3 --orders 3 "
                                      "--min-item-kib 0.25 --json");
    LT_CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    json_t *o = r.out ? json_loads(r.out, 0, NULL) : NULL;
    LT_CHECK_MSG(o != NULL, "not JSON: %s", r.out ? r.out : "");
    if (o) {
        json_t *check = json_object_get(o, "check"), *run = json_object_get(o, "cpu_run");
        LT_CHECK(json_integer_value(json_object_get(o, "sms")) == 6);
        LT_CHECK(json_integer_value(json_object_get(o, "items")) > json_integer_value(json_object_get(o, "ops_split")));
        LT_CHECK(json_number_value(json_object_get(o, "predicted_step_us")) > 0);
        LT_CHECK(json_is_true(json_object_get(check, "ran")) && json_is_true(json_object_get(check, "passed")));
        LT_CHECK(json_integer_value(json_object_get(run, "orders")) == 3 && json_is_true(json_object_get(run, "passed")));
        LT_CHECK_MSG(json_number_value(json_object_get(run, "nmse")) <= 1e-10, "nmse %g",
                     json_number_value(json_object_get(run, "nmse")));
    }
    json_decref(o);
    lt_cmd_free(&r);
}

/* `loom chat` reads messages from stdin: one streamed reply line per message, /reset
 * clears the conversation, end of input quits with 0; the reply to the same first
 * message at temperature 0 is the same after a reset. A model without a chat
 * template is refused naming the problem. */
/* `loom plan ... -o FILE.lmx` writes a checked plan that `loom run-plan` loads and
 * simulates to the same predicted cycles; an unchecked plan is not written. */
static void test_plan_package_from_the_cli(void) {
    lt_cmd_result r = lt_run_cmd(LOOM " plan gemm 64 48 96 --machine small4 --no-sim --json -o " LOOM_BINARY_DIR
                                      "/cli_gemm.lmx");
    LT_CHECK_MSG(r.status == 0, "plan -o: exit %d: %s", r.status, r.err ? r.err : "");
    json_t *a = r.out ? json_loads(r.out, 0, NULL) : NULL;
    lt_cmd_free(&r);
    r = lt_run_cmd(LOOM " run-plan " LOOM_BINARY_DIR "/cli_gemm.lmx --json");
    LT_CHECK_MSG(r.status == 0, "run-plan: exit %d: %s", r.status, r.err ? r.err : "");
    json_t *b = r.out ? json_loads(r.out, 0, NULL) : NULL;
    lt_cmd_free(&r);
    double pa = json_number_value(json_object_get(json_object_get(a, "plan"), "predicted_cycles"));
    double pb = json_number_value(json_object_get(json_object_get(b, "plan"), "predicted_cycles"));
    LT_CHECK_MSG(a && b && pa > 0 && pa == pb, "predicted cycles %g (plan) vs %g (run-plan)", pa, pb);
    json_decref(a), json_decref(b);
    r = lt_run_cmd(LOOM " plan gemm 64 48 96 --machine small4 --no-sim --no-check -o " LOOM_BINARY_DIR "/cli_never.lmx");
    LT_CHECK_MSG(r.status == 2 && r.err && strstr(r.err, "drop --no-check"), "exit %d: %s", r.status, r.err ? r.err : "");
    lt_cmd_free(&r);
}

static void test_chat_reads_stdin(void) {
    const char *dir = LOOM_BINARY_DIR "/cli_chat_model";
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && ln -sf " MODELS "qwen3_headdim/config.json " MODELS "qwen3_headdim/model.safetensors %s/ && "
             "ln -sf " LOOM_SOURCE_DIR "/tests/data/train/tokenizer.json %s/ && printf '%%s' "
             "'{\"chat_template\": \"{%% for m in messages %%}<{{ m.role }}>{{ m.content }}\\n{%% endfor %%}<assistant>\"}' "
             "> %s/tokenizer_config.json",
             dir, dir, dir, dir);
    LT_CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd,
             "printf 'hello there\n/reset\nhello there\nand more\n' | " LOOM " chat --model %s --temperature 0 "
             "--max-tokens 6 --threads 1",
             dir);
    lt_cmd_result r = lt_run_cmd(cmd);
    LT_CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    LT_CHECK(r.err && strstr(r.err, "(conversation cleared)"));
    int lines = 0;
    for (const char *p = r.out ? r.out : ""; *p; p++) lines += *p == '\n';
    LT_CHECK_MSG(lines >= 3, "%d reply lines", lines);
    /* the first reply repeats after /reset (same conversation, greedy) */
    const char *second = r.out ? strchr(r.out, '\n') : NULL;
    LT_CHECK(second && !strncmp(r.out, second + 1, (size_t)(second - r.out)));
    lt_cmd_free(&r);
    r = lt_run_cmd("printf 'hi\n' | " LOOM " chat --model " MODELS "qwen3_headdim");
    LT_CHECK(r.status == 1 && r.err && strstr(r.err, "chat template"));
    lt_cmd_free(&r);
}

/* `loom tokenizer train` writes a tokenizer.json that `loom tokenize` loads and that
 * round-trips the corpus' first line; a vocabulary smaller than the byte alphabet is
 * refused naming the size. */
static void test_tokenizer_train(void) {
    const char *out = LOOM_BINARY_DIR "/cli_trained_tokenizer.json";
    lt_cmd_result r = lt_run_cmd(LOOM " tokenizer train --vocab 400 --special '<|endoftext|>' " LOOM_SOURCE_DIR
                            "/tests/data/train/corpus.txt -o " LOOM_BINARY_DIR "/cli_trained_tokenizer.json");
    LT_CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    LT_CHECK(r.out && strstr(r.out, "\"vocab_size\":400"));
    lt_cmd_free(&r);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "echo '\"Hello, tokenizer! <|endoftext|>\"' | " LOOM " tokenize --tokenizer %s | " LOOM
             " tokenize --tokenizer %s --decode", out, out);
    r = lt_run_cmd(cmd);
    LT_CHECK_MSG(r.status == 0 && r.out && strstr(r.out, "Hello, tokenizer! <|endoftext|>"), "round trip: %s / %s",
                 r.out ? r.out : "", r.err ? r.err : "");
    lt_cmd_free(&r);
    r = lt_run_cmd(LOOM " tokenizer train --vocab 10 " LOOM_SOURCE_DIR "/tests/data/train/corpus.txt -o /tmp/never.json");
    LT_CHECK(r.status != 0 && r.err && strstr(r.err, "10"));
    lt_cmd_free(&r);
}

/* Reads element i of an entry as a float (f32, bf16 or f16). */
static float entry_float(const lm_safetensors_entry *e, int64_t i) {
    if (e->dtype == LM_F32) {
        float x;
        memcpy(&x, (const char *)e->data + 4 * i, 4);
        return x;
    }
    uint16_t h;
    memcpy(&h, (const char *)e->data + 2 * i, 2);
    return e->dtype == LM_BF16 ? lm_bf16_to_f32(h) : lm_f16_to_f32(h);
}

/* Every tensor of `got` holds the `want` tensor's values rounded to got's dtype. */
static void check_converted(const char *want_dir, const char *got_dir, lm_dtype dt) {
    lm_checkpoint *a = NULL, *b = NULL;
    LT_CHECK_OK(lm_checkpoint_open(want_dir, &a));
    LT_CHECK_OK(lm_checkpoint_open(got_dir, &b));
    if (!a || !b) goto out;
    LT_CHECK(lm_checkpoint_count(a) == lm_checkpoint_count(b));
    for (int64_t t = 0; t < lm_checkpoint_count(a); t++) {
        lm_safetensors_entry ea, eb;
        LT_CHECK_OK(lm_checkpoint_find(a, lm_checkpoint_name(a, t), &ea));
        if (lm_checkpoint_find(b, ea.name, &eb) != LM_OK) {
            LT_CHECK_MSG(0, "tensor %s missing after convert", ea.name);
            continue;
        }
        LT_CHECK_MSG(eb.dtype == dt && eb.ndim == ea.ndim, "%s: dtype %d ndim %d", ea.name, (int)eb.dtype, eb.ndim);
        int64_t n = (int64_t)(ea.nbytes / lm_dtype_size(ea.dtype)), bad = 0;
        for (int64_t i = 0; i < n; i++) {
            float x = entry_float(&ea, i), want = dt == LM_BF16 ? lm_bf16_to_f32(lm_f32_to_bf16(x)) : x;
            bad += entry_float(&eb, i) != want;
        }
        LT_CHECK_MSG(bad == 0, "%s: %lld of %lld elements differ", ea.name, (long long)bad, (long long)n);
    }
out:
    lm_checkpoint_close(a);
    lm_checkpoint_close(b);
}

static void test_convert_round_trips_and_refuses_bad_output(void) {
    const char *bf = LOOM_BINARY_DIR "/cli_conv_bf16", *f32 = LOOM_BINARY_DIR "/cli_conv_f32";
    lt_cmd_result r = lt_run_cmd("rm -rf " LOOM_BINARY_DIR "/cli_conv_bf16 " LOOM_BINARY_DIR "/cli_conv_f32 " LOOM_BINARY_DIR
                       "/cli_conv_big && " LOOM " convert --model " MODELS "llama_gqa2_f32 --dtype bf16 -o " LOOM_BINARY_DIR
                       "/cli_conv_bf16");
    LT_CHECK_MSG(r.status == 0 && r.out && strstr(r.out, "\"dtype\":\"bf16\""), "exit %d: %s %s", r.status,
                 r.out ? r.out : "", r.err ? r.err : "");
    lt_cmd_free(&r);
    check_converted(MODELS "llama_gqa2_f32", bf, LM_BF16);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", bf);
    json_t *cfg = json_load_file(path, 0, NULL);
    LT_CHECK_MSG(cfg && !strcmp(json_string_value(json_object_get(cfg, "torch_dtype")) ?: "", "bfloat16"),
                 "config.json torch_dtype not bfloat16");
    json_decref(cfg);
    snprintf(path, sizeof path, "%s/generation_config.json", bf);
    FILE *f = fopen(path, "r");
    LT_CHECK_MSG(f != NULL, "generation_config.json was not copied");
    if (f) fclose(f);
    /* back to f32: exact */
    r = lt_run_cmd(LOOM " convert --model " LOOM_BINARY_DIR "/cli_conv_bf16 --dtype f32 -o " LOOM_BINARY_DIR "/cli_conv_f32");
    LT_CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    lt_cmd_free(&r);
    check_converted(bf, f32, LM_F32);
    /* an f32 value beyond f16's range is refused, naming the tensor */
    const char *big = LOOM_BINARY_DIR "/cli_conv_big";
    LT_CHECK(mkdir(big, 0777) == 0);
    float vals[2] = {1.0f, 1e6f};
    lm_tensor *t = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_F32, 1, (int64_t[]){2}, vals, &t));
    lm_ctx *ctx = NULL;
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &ctx));
    const char *names[1] = {"big.weight"};
    snprintf(path, sizeof path, "%s/model.safetensors", big);
    LT_CHECK_OK(lm_safetensors_write(ctx, path, 1, names, lm_tensor_as_view(t), NULL));
    lm_tensor_destroy(t);
    lm_ctx_destroy(ctx);
    r = lt_run_cmd("cp " MODELS "llama_gqa2_f32/config.json " LOOM_BINARY_DIR "/cli_conv_big/ && " LOOM " convert --model " LOOM_BINARY_DIR
            "/cli_conv_big --dtype f16 -o " LOOM_BINARY_DIR "/cli_conv_big_f16");
    LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, "'big.weight'") && strstr(r.err, "does not fit f16"),
                 "exit %d: %s", r.status, r.err ? r.err : "");
    lt_cmd_free(&r);
    struct {
        const char *cmd;
        int status;
        const char *needle;
    } bad[] = {{LOOM " convert --model " MODELS "llama_gqa2_f32 --dtype bf16 -o " MODELS "llama_gqa2_f32", 1,
                "is the source directory"},
               {LOOM " convert --model " MODELS "llama_gqa2_f32 --dtype i32 -o /tmp/never", 2, "--dtype 'i32'"},
               {LOOM " convert --model " MODELS "llama_gqa2_f32 --dtype bf16", 2, "required"},
               {LOOM " convert --model /nonexistent/dir --dtype bf16 -o " LOOM_BINARY_DIR "/cli_conv_none", 1,
                "/nonexistent/dir"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = lt_run_cmd(bad[i].cmd);
        LT_CHECK_MSG(r.status == bad[i].status && r.err && strstr(r.err, bad[i].needle), "'%s': exit %d, stderr '%s'",
                     bad[i].cmd, r.status, r.err ? r.err : "");
        lt_cmd_free(&r);
    }
}

/* `loom eval` prints the windows-weighted mean of the library's no-grad loss. */
static void test_eval_equals_the_library_loss(void) {
    const char *model = LOOM_SOURCE_DIR "/tests/data/train/loom_checkpoint", *shard = LOOM_BINARY_DIR "/cli_eval.bin";
    lt_cmd_result r = lt_run_cmd(LOOM " data prepare --tokenizer " LOOM_SOURCE_DIR "/tests/data/train/tokenizer.json " LOOM_SOURCE_DIR
                            "/tests/data/train/heldout.txt -o " LOOM_BINARY_DIR "/cli_eval.bin");
    LT_CHECK_MSG(r.status == 0, "data prepare: %s", r.err ? r.err : "");
    lt_cmd_free(&r);
    r = lt_run_cmd(LOOM " eval --model " LOOM_SOURCE_DIR "/tests/data/train/loom_checkpoint --data " LOOM_BINARY_DIR
                 "/cli_eval.bin --seq 16 --batch 3 --threads 1 --quiet");
    LT_CHECK_MSG(r.status == 0, "eval: exit %d: %s", r.status, r.err ? r.err : "");
    json_t *o = r.out ? json_loads(r.out, 0, NULL) : NULL;
    LT_CHECK_MSG(o != NULL, "eval printed '%s'", r.out ? r.out : "");
    lt_cmd_free(&r);
    lm_train_model *m = NULL;
    lm_data_loader *dl = NULL;
    lm_ctx *ctx = NULL;
    LT_CHECK_OK(lm_train_model_load(model, lm_device_cpu(), &m));
    LT_CHECK_OK(lm_data_loader_create(1, &shard, 16, 0, 0, &dl));
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &ctx));
    int64_t windows = dl ? lm_data_loader_windows(dl) : 0;
    double sum = 0;
    int32_t in[3 * 16], tg[3 * 16];
    for (int64_t w = 0; m && dl && w < windows; w += 3) {
        int b = windows - w < 3 ? (int)(windows - w) : 3;
        float loss = 0;
        LT_CHECK_OK(lm_data_loader_next(dl, b, in, tg));
        LT_CHECK_OK(lm_train_model_loss(m, ctx, in, tg, b, 16, &loss));
        sum += (double)loss * b;
    }
    double want = windows ? sum / (double)windows : 0, got = json_number_value(json_object_get(o, "loss"));
    LT_CHECK_MSG(windows > 3 && json_integer_value(json_object_get(o, "windows")) == windows, "windows %lld",
                 (long long)windows);
    LT_CHECK_MSG(fabs(got - want) < 2e-6, "eval loss %.7f, library %.7f", got, want);
    LT_CHECK(fabs(json_number_value(json_object_get(o, "perplexity")) - exp(want)) < 1e-3 * exp(want));
    json_decref(o);
    lm_ctx_destroy(ctx);
    lm_data_loader_destroy(dl);
    lm_train_model_destroy(m);
    /* a shard made with a larger vocabulary than the model's is refused */
    int32_t ids[40] = {0};
    LT_CHECK_OK(lm_token_shard_write(LOOM_BINARY_DIR "/cli_eval_big.bin", ids, 40, 100000));
    r = lt_run_cmd(LOOM " eval --model " LOOM_SOURCE_DIR "/tests/data/train/loom_checkpoint --data " LOOM_BINARY_DIR
                 "/cli_eval_big.bin --seq 16");
    LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, "vocabulary of 100000"), "exit %d: %s", r.status,
                 r.err ? r.err : "");
    lt_cmd_free(&r);
}

/* The shipped default model predicts held-out English far better than chance (ln 8192
 * = 9.01 nats) and `loom generate` uses it when --model is not given. */
static void test_default_model_reads_english(void) {
    lt_cmd_result r = lt_run_cmd("(" LOOM " data prepare --tokenizer " LOOM_SOURCE_DIR "/models/default/tokenizer.json " LOOM_SOURCE_DIR
                       "/tests/data/default_model/heldout.txt -o " LOOM_BINARY_DIR "/cli_default_heldout.bin >/dev/null) && " LOOM
                       " eval --model " LOOM_SOURCE_DIR "/models/default --data " LOOM_BINARY_DIR
                       "/cli_default_heldout.bin --seq 256 --batch 4 --quiet");
    json_t *o = r.status == 0 && r.out ? json_loads(r.out, 0, NULL) : NULL;
    double loss = o ? json_number_value(json_object_get(o, "loss")) : 99;
    printf("  default model: held-out loss %.4f nats/token\n", loss);
    LT_CHECK_MSG(loss < 3.8, "held-out loss %.4f (exit %d: %s)", loss, r.status, r.err ? r.err : "");
    json_decref(o);
    lt_cmd_free(&r);
    r = lt_run_cmd(LOOM " generate --prompt 'It was a fine morning, and' --max-new 40 --seed 1");
    LT_CHECK_MSG(r.status == 0 && r.err && strstr(r.err, "using the default model"), "exit %d: %s", r.status,
                 r.err ? r.err : "");
    size_t n = r.out ? strlen(r.out) : 0, plain = 0, spaces = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)r.out[i];
        plain += (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || strchr(" ,.;:'\"!?-\n", c);
        spaces += c == ' ';
    }
    LT_CHECK_MSG(n > 60 && plain * 100 >= n * 95 && spaces >= 8, "not English-looking text: '%s'", r.out ? r.out : "");
    lt_cmd_free(&r);
    r = lt_run_cmd("LOOM_DEFAULT_MODEL=/nonexistent/model " LOOM " generate --prompt hi");
    LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, "/nonexistent/model") && strstr(r.err, "--model"),
                 "exit %d: %s", r.status, r.err ? r.err : "");
    lt_cmd_free(&r);
}

static void test_bad_invocations_exit_nonzero_with_a_reason(void) {
    struct {
        const char *cmd;
        int status;
        const char *needle;
    } cases[] = {
        {LOOM " logits --model /nonexistent/dir --ids 1", 1, "/nonexistent/dir"},
        {LOOM " logits --model " MODELS "llama_gqa2_f32 --ids 1,x", 2, "invalid token id list"},
        {LOOM " logits --model " MODELS "llama_gqa2_f32 --ids 1 --frobnicate", 2, "unknown option '--frobnicate'"},
        {LOOM " logits --model " MODELS "llama_gqa2_f32 --ids 99999", 1, "outside the vocabulary"},
        {LOOM " generate --model " MODELS "llama_gqa2_f32 --ids 1 --max-new 0", 2, "--max-new"},
        {LOOM " generate --model " MODELS "llama_gqa2_f32 --ids 1 --print-ids --temperature nan", 2, "--temperature"},
        {LOOM " generate --model " MODELS "llama_gqa2_f32 --ids 1 --temperature -1", 2, "--temperature must be >= 0"},
        {LOOM " generate --model " MODELS "llama_gqa2_f32 --ids 1 --top-k -7", 2, "--top-k must be >= 0 (got -7)"},
        {LOOM " generate --model " MODELS "llama_gqa2_f32 --ids 1 --top-p -1", 2, "--top-p must be >= 0"},
        {LOOM " generate --model " MODELS "llama_gqa2_f32 --ids 1 --threads -3", 2, "--threads must be >= 0 (got -3)"},
        {LOOM " generate --model " MODELS "llama_gqa2_f32 --ids 1,2, --print-ids", 2, "ends with a comma"},
        {LOOM " train --model " MODELS "llama_gqa2_f32 --data /nonexistent --out /tmp/x --save-every -1", 2,
         "--save-every must be >= 0"},
        {LOOM " frobnicate", 2, "unknown command"},
        {LOOM " plan layer --tokens 8", 2, "--model"},
        {LOOM " plan layer --model " MODELS "llama_gqa2_f32 --layer 9", 2, "--layer 9"},
        {LOOM " plan layer --model /nonexistent/dir", 1, "/nonexistent/dir"},
        {LOOM " plan decode --sms 4", 2, "--model"},
        {LOOM " plan decode --model /nonexistent/dir", 1, "/nonexistent/dir"},
        {LOOM " plan decode --model " MODELS "llama_gqa2_f32 --sms 5000", 1, "sms = 5000"},
        {LOOM " plan decode --model " MODELS "llama_gqa2_f32 --steps 20 --cache 8", 2, "--cache >= 20"},
        {LOOM " plan decode --model " MODELS "llama_gqa2_f32 --sms -2", 2, "--sms"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lt_cmd_result r = lt_run_cmd(cases[i].cmd);
        LT_CHECK_MSG(r.status == cases[i].status && r.err && strstr(r.err, cases[i].needle),
                     "'%s': exit %d, stderr '%s'", cases[i].cmd, r.status, r.err ? r.err : "");
        lt_cmd_free(&r);
    }
}

int main(void) {
    LT_RUN(test_logits_lines_match_the_library);
    LT_RUN(test_bench_decode_json);
    LT_RUN(test_bench_prefill_flops);
    LT_RUN(test_generate_print_ids_equals_transformers_greedy);
    LT_RUN(test_tokenize_round_trip_on_a_real_tokenizer);
    LT_RUN(test_train_on_the_cpu);
    LT_RUN(test_plan_layer_agrees_with_the_cpu_executor);
    LT_RUN(test_plan_package_from_the_cli);
    LT_RUN(test_plan_decode_json);
    LT_RUN(test_chat_reads_stdin);
    LT_RUN(test_tokenizer_train);
    LT_RUN(test_convert_round_trips_and_refuses_bad_output);
    LT_RUN(test_eval_equals_the_library_loss);
    LT_RUN(test_default_model_reads_english);
    LT_RUN(test_bad_invocations_exit_nonzero_with_a_reason);
    return lt_finish();
}
