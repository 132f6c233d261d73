/* The loom CLI's input checks, run as a user would run it: a FIFO or directory given
 * as --tokenizer, config.json, tokenizer.json, model.safetensors, --data, a data
 * prepare input, plan --machine or a plot-loss log ends the command at once with a
 * message naming it (under `timeout 10`, so a regression fails instead of hanging);
 * `loom logits --top` is clamped to the vocabulary and ordered as a full sort;
 * `loom generate --max-new` is checked against the model's context and every failure
 * under a memory limit says why; `loom plot-loss` draws losses of +-1e308 and equal
 * losses with finite coordinates only; `loom data prepare` and `loom tokenize` check
 * their numbers and paths before any work, and tokenize a long single line to the
 * library's ids.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include "loom/tokenizer.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define LOOM LOOM_BINARY_DIR "/loom"
#define MODEL LOOM_SOURCE_DIR "/tests/data/models/llama_gqa2_f32"
#define TRAIN_TOKENIZER LOOM_SOURCE_DIR "/tests/data/train/tokenizer.json"
#define CORPUS LOOM_SOURCE_DIR "/tests/data/train/corpus.txt"

/* ASan reserves terabytes of address space: a `ulimit -v` run cannot even start. */
#define UNDER_ASAN LT_UNDER_ASAN

static char g_dir[64];


/* g_dir/name (a static buffer of a small ring). */
static const char *at(const char *name) {
    static char buf[8][256];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

/* A model directory g_dir/name linking to MODEL's files, with `entry` made a FIFO
 * ('p') or a directory ('d') instead. */
static void model_with(const char *name, const char *entry, char kind) {
    static const char *files[] = {"config.json", "model.safetensors", "generation_config.json"};
    char dir[256], p[512];
    snprintf(dir, sizeof dir, "%s", at(name));
    mkdir(dir, 0700);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        if (!strcmp(files[i], entry)) continue;
        char target[512];
        snprintf(target, sizeof target, "%s/%s", MODEL, files[i]);
        LT_CHECK(symlink(target, p) == 0);
    }
    snprintf(p, sizeof p, "%s/%s", dir, entry);
    LT_CHECK_MSG(kind == 'p' ? mkfifo(p, 0600) == 0 : mkdir(p, 0700) == 0, "cannot make %s", p);
}

static void test_fifo_and_directory_inputs_fail_at_once(void) {
    LT_CHECK(mkfifo(at("fifo"), 0600) == 0);
    model_with("m_st_fifo", "model.safetensors", 'p');
    model_with("m_st_dir", "model.safetensors", 'd');
    model_with("m_cfg_fifo", "config.json", 'p');
    model_with("m_gen_fifo", "generation_config.json", 'p');
    model_with("m_tok_fifo", "tokenizer.json", 'p');
    char machine[256];
    snprintf(machine, sizeof machine, "%s", at("fifo"));
    struct {
        char cmd[1024];
        const char *needle;
    } cases[12];
    int n = 0;
#define CASE(needle_, fmt, ...) \
    snprintf(cases[n].cmd, sizeof cases[n].cmd, "timeout 10 " fmt, __VA_ARGS__), cases[n++].needle = needle_
    CASE("fifo' is a FIFO", "%s tokenize --tokenizer %s", LOOM, machine);
    CASE("fifo' is a FIFO", "%s data prepare --tokenizer %s %s -o %s", LOOM, machine, CORPUS, at("out.bin"));
    CASE("fifo' is a FIFO", "%s data prepare --tokenizer %s %s %s -o %s", LOOM, TRAIN_TOKENIZER, CORPUS, machine,
         at("out.bin"));
    CASE("model.safetensors' is a FIFO", "%s logits --model %s --ids 1", LOOM, at("m_st_fifo"));
    CASE("model.safetensors' is a directory", "%s logits --model %s --ids 1", LOOM, at("m_st_dir"));
    CASE("config.json' is a FIFO", "%s logits --model %s --ids 1", LOOM, at("m_cfg_fifo"));
    CASE("generation_config.json' is a FIFO", "%s generate --model %s --ids 1 --max-new 1 --print-ids", LOOM,
         at("m_gen_fifo"));
    CASE("tokenizer.json' is a FIFO", "%s generate --model %s --ids 1 --max-new 1", LOOM, at("m_tok_fifo"));
    CASE("fifo' is a FIFO", "%s generate --model %s --prompt hi --tokenizer %s --max-new 1", LOOM, MODEL, machine);
    CASE("fifo' is a FIFO", "%s train --model %s --data %s --out %s --steps 1", LOOM, MODEL, machine, at("train"));
    CASE("fifo' is a FIFO", "%s plan gemm 64 64 64 --machine %s", LOOM, machine);
    CASE("fifo' is a FIFO", "%s plot-loss %s -o %s", LOOM, machine, at("x.svg"));
#undef CASE
    for (int i = 0; i < n; i++) {
        lt_cmd_result r = lt_run_cmd(cases[i].cmd);
        LT_CHECK_MSG(r.status != 0 && r.status != 124 && r.err && strstr(r.err, cases[i].needle),
                     "'%s': exit %d (124 = it blocked), stderr '%s'", cases[i].cmd, r.status, r.err ? r.err : "");
        lt_cmd_free(&r);
    }
}

/* A full sort of the row (by descending logit, then id) equals `--top` with K beyond the
 * vocabulary, which prints exactly V entries; 0 prints none. */
static void test_logits_top_is_clamped_and_ordered_as_a_full_sort(void) {
    enum { V = 256 }; /* llama_gqa2_f32's vocabulary */
    char cmd[4096], *p = cmd;
    p += snprintf(p, sizeof cmd, "%s logits --model %s --ids 3,1,4 --top 2147483647 --threads 1 --probe ", LOOM, MODEL);
    for (int i = 0; i < V; i++) p += snprintf(p, (size_t)(cmd + sizeof cmd - p), i ? ",%d" : "%d", i);
    lt_cmd_result r = lt_run_cmd(cmd);
    LT_CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    int lines = 0;
    char *save = NULL;
    for (char *l = r.out ? strtok_r(r.out, "\n", &save) : NULL; l; l = strtok_r(NULL, "\n", &save), lines++) {
        json_t *o = json_loads(l, 0, NULL), *top = json_object_get(o, "top"), *probe = json_object_get(o, "probe");
        LT_CHECK_MSG(json_array_size(top) == V && json_array_size(probe) == V, "line %d: %zu top entries", lines,
                     json_array_size(top));
        /* the reference: insertion sort of all ids by (logit desc, id asc) */
        int order[V];
        double logit[V];
        for (int i = 0; i < V; i++) logit[i] = json_number_value(json_array_get(probe, (size_t)i));
        for (int i = 0; i < V; i++) {
            int j = i;
            while (j > 0 && logit[order[j - 1]] < logit[i]) order[j] = order[j - 1], j--;
            order[j] = i;
        }
        int same = json_array_size(top) == V;
        for (int k = 0; same && k < V; k++) {
            json_t *pair = json_array_get(top, (size_t)k);
            same = json_integer_value(json_array_get(pair, 0)) == order[k] &&
                   json_number_value(json_array_get(pair, 1)) == logit[order[k]];
        }
        LT_CHECK_MSG(same, "line %d: --top order differs from a full sort", lines);
        json_decref(o);
    }
    LT_CHECK(lines == 3);
    lt_cmd_free(&r);
    r = lt_run_cmd(LOOM " logits --model " MODEL " --ids 3 --top 0");
    LT_CHECK_MSG(r.status == 0 && r.out && strstr(r.out, "\"top\":[]"), "exit %d: %s", r.status, r.out ? r.out : "");
    lt_cmd_free(&r);
    r = lt_run_cmd(LOOM " logits --help");
    LT_CHECK(r.status == 0 && r.out && strstr(r.out, "at most the vocabulary size"));
    lt_cmd_free(&r);
}

static void test_generate_max_new_is_checked_against_the_context(void) {
    struct {
        const char *cmd;
        int status;
        const char *needle;
    } cases[] = {
        {LOOM " generate --model " MODEL " --ids 1,2 --max-new 2000000000 --print-ids", 2,
         "--max-new 2000000000 does not fit the model's context of 2048 positions"},
        {LOOM " generate --model " MODEL " --ids 1,2,3 --max-new 2046 --print-ids", 2, "at most 2045 new tokens fit"},
        {LOOM " generate --model " MODEL " --ids 1 --max-new 0", 2, "--max-new must be >= 1 (got 0)"},
        {LOOM " generate --model " MODEL " --ids 1 --max-new -5", 2, "--max-new must be >= 0 (got -5)"},
        {LOOM " generate --model " MODEL " --ids 1,2 --max-new 3 --print-ids", 0, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lt_cmd_result r = lt_run_cmd(cases[i].cmd);
        LT_CHECK_MSG(r.status == cases[i].status && r.err && strstr(r.err, cases[i].needle),
                     "'%s': exit %d, stderr '%s'", cases[i].cmd, r.status, r.err ? r.err : "");
        lt_cmd_free(&r);
    }
    if (UNDER_ASAN) {
        printf("  (the ulimit -v runs are skipped under AddressSanitizer)\n");
        return;
    }
    /* a build with CUDA links libraries (cuBLASLt) whose mapping alone exceeds 400 MB of
     * address space: the loader stops such a run before main, so there is nothing to test */
    lt_cmd_result r = lt_run_cmd("ulimit -v 400000; " LOOM " version");
    int fits = r.status == 0;
    lt_cmd_free(&r);
    if (!fits) {
        printf("  (the ulimit -v runs are skipped: this build's libraries do not load under 400 MB of address space)\n");
        return;
    }
    r = lt_run_cmd("ulimit -v 400000; " LOOM " generate --model " MODEL " --ids 1,2 --max-new 2000000000 --print-ids");
    LT_CHECK_MSG(r.status == 2 && r.err && strstr(r.err, "max_position_embeddings"), "exit %d: %s", r.status,
                 r.err ? r.err : "");
    lt_cmd_free(&r);
    /* at any memory limit a failure says why (127: the limit stopped the loader itself) */
    static const int limits_kb[] = {20000, 30000, 45000, 60000, 90000, 400000};
    for (size_t i = 0; i < sizeof limits_kb / sizeof limits_kb[0]; i++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd,
                 "ulimit -v %d; %s generate --model %s/models/default --prompt 'Once upon a time' --max-new 200 "
                 "--threads 1",
                 limits_kb[i], LOOM, LOOM_SOURCE_DIR);
        r = lt_run_cmd(cmd);
        LT_CHECK_MSG(r.status == 0 || r.status == 127 || (r.err && strstr(r.err, "loom generate: ")),
                     "ulimit -v %d: exit %d with no message: '%s'", limits_kb[i], r.status, r.err ? r.err : "");
        lt_cmd_free(&r);
    }
}

/* Every number in an attribute of the SVG parses as a finite value in a sane pixel
 * range, no "nan"/"inf" text appears, tags balance, and it is one <svg> element. */
static void check_svg(const char *path) {
    char *s = NULL;
    size_t n = 0;
    LT_CHECK_MSG(lm_file_read_all(path, &s, &n) == LM_OK, "no SVG at %s", path);
    if (!s) return;
    LT_CHECK(strncmp(s, "<svg ", 5) == 0 && n > 7 && strcmp(s + n - 7, "</svg>\n") == 0);
    int lt = 0, gt = 0, numbers = 0;
    for (size_t i = 0; i < n; i++) {
        lt += s[i] == '<', gt += s[i] == '>';
        LT_CHECK_MSG(strncasecmp(s + i, "nan", 3) && strncasecmp(s + i, "inf", 3), "%s: '%.20s' at byte %zu", path,
                     s + i, i);
    }
    LT_CHECK(lt == gt);
    static const char *attrs[] = {" x=\"", " y=\"", " x1=\"", " y1=\"", " x2=\"", " y2=\"", " cx=\"", " cy=\"",
                                  " points=\""};
    for (size_t a = 0; a < sizeof attrs / sizeof attrs[0]; a++)
        for (const char *q = strstr(s, attrs[a]); q; q = strstr(q + 1, attrs[a])) {
            const char *v = q + strlen(attrs[a]);
            while (*v && *v != '"') {
                char *end;
                double x = strtod(v, &end);
                LT_CHECK_MSG(end != v && isfinite(x) && fabs(x) < 1e5, "%s: bad coordinate '%.20s'", path, v);
                if (end == v) break;
                numbers++;
                v = end;
                while (*v == ',' || *v == ' ') v++;
            }
        }
    LT_CHECK(numbers > 10);
    lm_free(s);
}

static void test_plot_loss_draws_extreme_and_equal_losses(void) {
    static const struct {
        const char *name, *log;
    } logs[] = {
        {"huge", "{\"step\":1,\"loss\":1e308}\n{\"step\":2,\"loss\":-1e308}\n{\"step\":3,\"loss\":1.7e308,"
                 "\"val_loss\":-1.7e308}\n"},
        {"equal", "{\"step\":1,\"loss\":2.5}\n{\"step\":2,\"loss\":2.5}\n{\"step\":3,\"loss\":2.5}\n"},
        {"one", "{\"step\":1e300,\"loss\":1e300}\n"},
        {"max", "{\"step\":-1.7e308,\"loss\":1.7976931348623157e308}\n{\"step\":1.7e308,\"loss\":1.7e308}\n"},
    };
    for (size_t i = 0; i < sizeof logs / sizeof logs[0]; i++) {
        char log[256], svg[300], cmd[1024];
        snprintf(log, sizeof log, "%s", at(logs[i].name));
        snprintf(svg, sizeof svg, "%s.svg", log);
        FILE *f = fopen(log, "w");
        if (f) fputs(logs[i].log, f), fclose(f);
        snprintf(cmd, sizeof cmd, "%s plot-loss %s -o %s", LOOM, log, svg);
        lt_cmd_result r = lt_run_cmd(cmd);
        LT_CHECK_MSG(r.status == 0, "%s: exit %d: %s", logs[i].name, r.status, r.err ? r.err : "");
        check_svg(svg);
        lt_cmd_free(&r);
    }
    mkdir(at("svgdir"), 0700);
    struct {
        char cmd[1024];
        const char *needle;
    } bad[3];
    snprintf(bad[0].cmd, sizeof bad[0].cmd, "%s plot-loss %s -o %s --width 10", LOOM, at("equal"), at("w.svg"));
    bad[0].needle = "--width 10";
    snprintf(bad[1].cmd, sizeof bad[1].cmd, "%s plot-loss %s -o %s --height 2000000", LOOM, at("equal"), at("w.svg"));
    bad[1].needle = "--height 2000000";
    snprintf(bad[2].cmd, sizeof bad[2].cmd, "%s plot-loss %s -o %s", LOOM, at("equal"), at("svgdir"));
    bad[2].needle = "is a directory";
    for (int i = 0; i < 3; i++) {
        lt_cmd_result r = lt_run_cmd(bad[i].cmd);
        LT_CHECK_MSG(r.status == 2 && r.err && strstr(r.err, bad[i].needle), "'%s': exit %d: %s", bad[i].cmd,
                     r.status, r.err ? r.err : "");
        lt_cmd_free(&r);
    }
}

static void test_data_prepare_checks_before_any_work(void) {
    mkdir(at("outdir"), 0700);
    struct {
        char cmd[1024];
        const char *needle;
    } cases[5];
    const char *out = at("prep.bin");
#define CASE(i, needle_, ...) snprintf(cases[i].cmd, sizeof cases[i].cmd, __VA_ARGS__), cases[i].needle = needle_
    CASE(0, "--separator-id must be >= 0 (got -2)", "%s data prepare --tokenizer %s %s -o %s --separator-id -2", LOOM,
         TRAIN_TOKENIZER, CORPUS, out);
    CASE(1, "--separator-id 99999 is outside the tokenizer's vocabulary of 385",
         "%s data prepare --tokenizer %s %s -o %s --separator-id 99999", LOOM, TRAIN_TOKENIZER, CORPUS, out);
    CASE(2, "is a directory", "%s data prepare --tokenizer %s %s -o %s", LOOM, TRAIN_TOKENIZER, CORPUS, at("outdir"));
    CASE(3, "not both", "%s data prepare --tokenizer %s %s -o %s --separator-id 1 --separator x", LOOM,
         TRAIN_TOKENIZER, CORPUS, out);
    CASE(4, "no_such.txt", "%s data prepare --tokenizer %s %s %s -o %s", LOOM, TRAIN_TOKENIZER, CORPUS,
         at("no_such.txt"), out);
#undef CASE
    for (int i = 0; i < 5; i++) {
        lt_cmd_result r = lt_run_cmd(cases[i].cmd);
        LT_CHECK_MSG(r.status == 2 && r.err && strstr(r.err, cases[i].needle), "'%s': exit %d: %s", cases[i].cmd,
                     r.status, r.err ? r.err : "");
        lt_cmd_free(&r);
    }
    struct stat sb;
    LT_CHECK_MSG(stat(out, &sb) != 0, "a refused run wrote %s", out);
}

/* A 1 MB line without a newline tokenizes through `loom tokenize` to the library's ids. */
static void test_tokenize_a_long_single_line(void) {
    char *text = NULL;
    size_t len = 0;
    LT_CHECK_OK(lm_file_read_all(CORPUS, &text, &len));
    if (!text) return;
    size_t want_len = 1 << 20, n = 0;
    char *line = malloc(want_len + 1);
    while (n < want_len) { /* the corpus repeated, its newlines and tabs made spaces */
        for (size_t i = 0; i < len && n < want_len; i++) line[n++] = isspace((unsigned char)text[i]) ? ' ' : text[i];
    }
    while (n > 0 && (line[n - 1] & 0xC0) == 0x80) n--; /* do not end inside a character */
    if (n > 0 && (unsigned char)line[n - 1] >= 0xC0) n--;
    line[n] = '\0';
    json_t *s = json_stringn(line, n);
    char *js = json_dumps(s, JSON_ENCODE_ANY);
    FILE *f = fopen(at("line.jsonl"), "w");
    if (f && js) fprintf(f, "%s\n", js), fclose(f);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s tokenize --tokenizer %s < %s", LOOM, TRAIN_TOKENIZER, at("line.jsonl"));
    lt_cmd_result r = lt_run_cmd(cmd);
    LT_CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    json_t *got = r.out ? json_loads(r.out, 0, NULL) : NULL;
    lm_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t nids = 0;
    LT_CHECK_OK(lm_tokenizer_load(TRAIN_TOKENIZER, &tok));
    if (tok) LT_CHECK_OK(lm_tokenizer_encode(tok, line, n, &ids, &nids));
    int same = got && json_array_size(got) == nids && nids > 100000;
    for (size_t i = 0; same && i < nids; i++) same = json_integer_value(json_array_get(got, i)) == ids[i];
    LT_CHECK_MSG(same, "loom tokenize gave %zu ids, the library %zu", got ? json_array_size(got) : 0, nids);
    json_decref(got);
    json_decref(s);
    free(js);
    lm_free(ids);
    lm_tokenizer_destroy(tok);
    lt_cmd_free(&r);
    free(line);
    lm_free(text);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/loom_cli_inputs_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    LT_RUN(test_fifo_and_directory_inputs_fail_at_once);
    LT_RUN(test_logits_top_is_clamped_and_ordered_as_a_full_sort);
    LT_RUN(test_generate_max_new_is_checked_against_the_context);
    LT_RUN(test_plot_loss_draws_extreme_and_equal_losses);
    LT_RUN(test_data_prepare_checks_before_any_work);
    LT_RUN(test_tokenize_a_long_single_line);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", g_dir);
    return lt_finish();
}
