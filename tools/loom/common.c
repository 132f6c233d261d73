/* tools/loom/common.c — shared CLI helpers (see common.h). */
#include "common.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void cli_best_median(double *times, int n, double *best, double *median) {
    qsort(times, (size_t)n, sizeof *times, cmp_double);
    *best = times[0];
    *median = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
}

void cli_print_steps(const lm_kv_cache *cache) {
    lm_kv_cache_steps ks;
    if (lm_kv_cache_steps_get(cache, &ks) != LM_OK) return;
    printf(",\"step_executors\":%lld,\"step_arena_bytes\":%lld,\"step_live_bytes\":%lld,\"kernels_per_step\":%lld",
           (long long)ks.programs, (long long)ks.arena_bytes, (long long)ks.live_bytes, (long long)ks.last_kernels);
}

void cli_print_roofline(double bytes, const char *bw_key, double bw_gb_s, double tok_per_s, int batch) {
    double roof = bw_gb_s * 1e9 / bytes * batch; /* each step reads the bytes once for all rows */
    printf(",\"bytes_per_step\":%.0f,\"%s\":%.2f,\"achieved_gb_s\":%.2f,\"roofline_tok_per_s\":%.3f,"
           "\"fraction_of_roofline\":%.4f",
           bytes, bw_key, bw_gb_s, bytes * (tok_per_s / batch) / 1e9, roof, tok_per_s / roof);
}

double cli_prefill_flops(const lm_model_config *c, int64_t T, int B) {
    double h = (double)c->hidden_size, hd = (double)c->head_dim, heads = (double)c->num_attention_heads;
    double kv = (double)c->num_key_value_heads, t = (double)T;
    double per_token = 2.0 * (h * (heads + 2.0 * kv) * hd + heads * hd * h + 3.0 * h * (double)c->intermediate_size);
    double sum = 0;
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        int64_t win = lm_model_config_layer_window(c, l);
        double w = (double)win; /* query i scores keys 0..i, or min(i + 1, W) in a window of W */
        double pairs = win > 0 && T > win ? w * (w + 1.0) / 2.0 + (t - w) * w : t * (t + 1.0) / 2.0;
        sum += per_token * t + 4.0 * heads * hd * pairs;
    }
    return (sum + 2.0 * h * (double)c->vocab_size) * B;
}

void cli_print_flops(double flops, double seconds) {
    printf(",\"prefill_flops\":%.0f,\"achieved_tflop_s\":%.6f", flops, flops / seconds / 1e12);
}

int cli_fail(const char *cmd, const char *what, lm_status st) {
    const char *detail = lm_last_error();
    fprintf(stderr, "loom %s: %s: %s%s%s\n", cmd, what, lm_status_str(st), detail[0] ? ": " : "", detail);
    return 1;
}

void cli_json_string(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (c < 0x20 || c == 0x7f) fprintf(f, "\\u%04x", c);
            else fputc(c, f);
        }
    }
    fputc('"', f);
}

static void log_stderr(void *user, lm_log_level level, const char *msg) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    (void)user;
    fprintf(stderr, "loom [%s] %s\n", names[level], msg);
}

void cli_enable_logging(int verbose) {
    lm_set_log_fn(log_stderr, NULL, verbose > 1 ? LM_LOG_DEBUG : verbose ? LM_LOG_INFO : LM_LOG_WARN);
}

lm_model *cli_load_model(const char *cmd, const char *dir) { return cli_load_model_on(cmd, dir, lm_device_cpu()); }

int cli_parse_device(const char *cmd, const char *text, lm_device *out) {
    if (!text) {
        *out = lm_device_cpu();
        return 1;
    }
    if (lm_device_parse(text, out) == LM_OK) return 1;
    fprintf(stderr, "loom %s: --device: %s\n", cmd, lm_last_error());
    return 0;
}

int cli_weights_group;       /* --group (CLI_WEIGHTS_OPT) */
static int g_text_group;     /* the G of a "--weights int4:G" */

const char *cli_precision_text; /* --precision (CLI_WEIGHTS_OPT) */

lm_precision cli_precision(void) {
    lm_precision p = LM_PRECISION_EXACT;
    if (cli_precision_text) lm_precision_parse(cli_precision_text, &p);
    return p;
}

int cli_parse_weights(const char *cmd, const char *text, lm_weights *out) {
    *out = LM_WEIGHTS_AUTO;
    lm_precision p;
    if (cli_precision_text && lm_precision_parse(cli_precision_text, &p) != LM_OK) {
        fprintf(stderr, "loom %s: --precision '%s' is not exact or fast\n", cmd, cli_precision_text);
        return 0;
    }
    if (text && strncmp(text, "int4:", 5) == 0) {
        char *end = NULL;
        long g = strtol(text + 5, &end, 10);
        if (end && !*end && (g == 32 || g == 64 || g == 128)) {
            g_text_group = (int)g;
            *out = LM_WEIGHTS_INT4;
            return 1;
        }
        fprintf(stderr, "loom %s: --weights '%s': the int4 group is 32, 64 or 128 (int4:32)\n", cmd, text);
        return 0;
    }
    if (!text || lm_weights_parse(text, out) == LM_OK) return 1;
    fprintf(stderr, "loom %s: --weights '%s' is not int8, int4, int4:G (G 32, 64 or 128), fp8, bf16 or auto\n", cmd, text);
    return 0;
}

lm_model *cli_load_model_on(const char *cmd, const char *dir, lm_device device) {
    return cli_load_model_weights(cmd, dir, device, LM_WEIGHTS_AUTO);
}

lm_model *cli_load_model_weights(const char *cmd, const char *dir, lm_device device, lm_weights weights) {
    return cli_load_model_precision(cmd, dir, device, weights, cli_precision());
}

lm_model *cli_load_model_precision(const char *cmd, const char *dir, lm_device device, lm_weights weights,
                                   lm_precision precision) {
    lm_model *m = NULL;
    lm_model_load_options o;
    lm_model_load_options_default(&o);
    o.weights = weights;
    o.precision = precision;
    if (cli_weights_group && weights != LM_WEIGHTS_INT4) {
        fprintf(stderr, "loom %s: --group applies to --weights int4 only\n", cmd);
        return NULL;
    }
    if (weights == LM_WEIGHTS_INT4) o.quant_group = g_text_group ? g_text_group : cli_weights_group;
    lm_status st = lm_model_load_opts(dir, device, &o, &m);
    if (st != LM_OK) {
        char what[1200];
        snprintf(what, sizeof what, "cannot load model '%s'", dir);
        cli_fail(cmd, what, st);
        return NULL;
    }
    return m;
}

const char *cli_model_tokenizer_path(const char *dir, char *buf, size_t size) {
    snprintf(buf, size, "%s/tokenizer.json", dir);
    return buf;
}

const char *cli_default_model(const char *cmd) {
    const char *env = getenv("LOOM_DEFAULT_MODEL");
    const char *dir = env && *env ? env : LOOM_DEFAULT_MODEL_DIR;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "loom %s: no --model given, and the default model %s'%s' has no config.json; pass --model DIR\n",
                cmd, env && *env ? "(LOOM_DEFAULT_MODEL) " : "", dir);
        return NULL;
    }
    fprintf(stderr, "loom %s: no --model given; using the default model %s\n", cmd, dir);
    return dir;
}

static const char *g_trace_cmd; /* the command whose trace runs, for the exit handler's message */

static void trace_at_exit(void) {
    if (lm_trace_enabled()) cli_trace_stop(g_trace_cmd, 0);
}

int cli_trace_start(const char *cmd, const char *path) {
    if (!path) path = getenv("LOOM_TRACE");
    if (!path || !*path) return 1;
    lm_status st = lm_trace_start(path);
    if (st != LM_OK) {
        cli_fail(cmd, "cannot start the trace", st);
        return 0;
    }
    static int registered;
    g_trace_cmd = cmd;
    if (!registered) registered = atexit(trace_at_exit) == 0; /* early returns and exit() stop it too */
    return 1;
}

int cli_trace_stop(const char *cmd, int rc) {
    lm_status st = lm_trace_stop();
    if (st == LM_OK) return rc;
    cli_fail(cmd, "cannot write the trace", st);
    return rc ? rc : 1;
}
