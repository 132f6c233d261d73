/* tools/loom/cmd_bench.c — `loom bench`: measured speed as one JSON object per result.
 *
 *   bench bandwidth                 multi-threaded read bandwidth of this machine (GB/s)
 *   bench decode  --model DIR       tokens/s of one-token decode steps, beside the
 *                                   memory-bandwidth roofline (weight bytes per token /
 *                                   measured read bandwidth) and the weight bandwidth
 *                                   the steps achieved; kernels_per_step counts the
 *                                   kernel launches of the captured step (0 uncaptured)
 *   bench prefill --model DIR       tokens/s of a T-token prompt forward pass, and its
 *                                   FLOPs (cli_prefill_flops) over the best time as
 *                                   achieved_tflop_s
 *   bench tokenize --tokenizer FILE encode throughput (MB/s) over a text corpus
 *   bench serve   --url URL         load test of an OpenAI-compatible server (cmd_bench_serve.c)
 * Timings use the monotonic clock; each result reports the best of --repeat runs and
 * their median, so a noisy neighbour shows up as a gap between the two.
 * --device cuda measures on a GPU instead (bench_device.c).
 */
#include "args.h"
#include "bench_device.h"
#include "commands.h"
#include "common.h"

#include <stdlib.h>
#include <string.h>

/* ---- bandwidth: every thread XOR-folds its share of a buffer larger than the caches.
 * Eight independent 64-bit integer lanes keep the loop limited by memory, not by an
 * add's latency (a floating-point sum chain capped the probe below what the decode
 * kernel itself streams). */
typedef struct bw_job {
    const uint64_t *buf; /* [n] */
    int64_t n, chunks;
    uint64_t folds[1024]; /* per worker, so the loads cannot be optimized away */
} bw_job;

static void bw_task(void *arg, int64_t task, int worker) {
    bw_job *j = arg;
    int64_t per = j->n / j->chunks, lo = task * per, hi = task == j->chunks - 1 ? j->n : lo + per;
    uint64_t f[8] = {0};
    for (int64_t i = lo; i + 7 < hi; i += 8)
        for (int k = 0; k < 8; k++) f[k] ^= j->buf[i + k];
    j->folds[worker] ^= f[0] ^ f[1] ^ f[2] ^ f[3] ^ f[4] ^ f[5] ^ f[6] ^ f[7];
}

/* Read bandwidth in GB/s with the context's threads over a 1 GiB buffer; best of 5. */
static double measure_bandwidth(lm_ctx *ctx) {
    int64_t n = (int64_t)1 << 27; /* 1 GiB of 64-bit words */
    uint64_t *buf = malloc(sizeof(uint64_t) * (size_t)n);
    if (!buf) return 0;
    for (int64_t i = 0; i < n; i++) buf[i] = (uint64_t)i * 0x9E3779B97F4A7C15ull;
    bw_job job = {buf, n, 256, {0}};
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double t0 = cli_now();
        lm_threadpool_run(lm_ctx_threadpool(ctx), job.chunks, bw_task, &job);
        double gbs = (double)n * sizeof(uint64_t) / (cli_now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    free(buf);
    return best;
}

typedef struct bench_opts {
    const char *model, *tokenizer, *corpus, *device;
    int threads, repeat, tokens, prompt, batch;
    lm_weights weights; /* --weights (decode, prefill) */
} bench_opts;

static int bench_bandwidth(const bench_opts *o, lm_ctx *ctx) {
    printf("{\"bench\":\"bandwidth\",\"threads\":%d,\"read_gb_s\":%.2f}\n", lm_threadpool_size(lm_ctx_threadpool(ctx)),
           measure_bandwidth(ctx));
    (void)o;
    return 0;
}

static void random_ids(int32_t *ids, int64_t n, int64_t vocab, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((seed >> 33) % (uint64_t)vocab);
    }
}

static int bench_model(const bench_opts *o, lm_ctx *ctx, int decode) {
    const char *cmd = decode ? "bench decode" : "bench prefill";
    lm_model *m = cli_load_model_weights(cmd, o->model, lm_device_cpu(), o->weights);
    if (!m) return 1;
    const lm_model_config *c = lm_model_get_config(m);
    int B = o->batch;
    int64_t P = o->prompt, N = decode ? o->tokens : 0, V = c->vocab_size;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(B * (P + N + 1)));
    float *logits = malloc(sizeof(float) * (size_t)(B * V));
    int *slots = malloc(sizeof(int) * (size_t)B);
    double *times = calloc((size_t)o->repeat, sizeof(double));
    lm_kv_cache *cache = NULL;
    int rc = 1;
    lm_status st = ids && logits && slots && times ? lm_kv_cache_create(m, B, P + N + 1, &cache) : LM_OUT_OF_MEMORY;
    if (st != LM_OK) {
        cli_fail(cmd, "setup failed", st);
        goto done;
    }
    for (int b = 0; b < B; b++) slots[b] = b;
    random_ids(ids, (int64_t)B * (P + N + 1), V, 12345);
    for (int r = 0; r < o->repeat && st == LM_OK; r++) {
        for (int b = 0; b < B; b++) lm_kv_cache_reset(cache, b);
        double t0 = cli_now();
        int64_t tr = lm_trace_begin();
        st = lm_model_forward(m, ctx, cache, slots, B, ids, P, logits, 0);
        lm_trace_end(tr, "bench", "prefill", NULL);
        double t1 = cli_now();
        for (int64_t s = 0; s < N && st == LM_OK; s++) {
            tr = lm_trace_begin();
            st = lm_model_forward(m, ctx, cache, slots, B, ids + B * (P + s), 1, logits, 0);
            lm_trace_end(tr, "bench", "decode step", NULL);
        }
        times[r] = decode ? cli_now() - t1 : t1 - t0;
    }
    if (st != LM_OK) {
        cli_fail(cmd, "forward pass failed", st);
        goto done;
    }
    double best, med;
    cli_best_median(times, o->repeat, &best, &med);
    int64_t toks = decode ? N * B : P * B;
    int threads = lm_threadpool_size(lm_ctx_threadpool(ctx));
    printf("{\"bench\":\"%s\",\"model\":\"%s\",\"arch\":\"%s\",\"weight_dtype\":\"%s\",\"weights\":\"%s\","
           "\"precision\":\"%s\",\"threads\":%d,\"batch\":%d,\"prompt_tokens\":%lld,\"tokens\":%lld,\"best_s\":%.6f,\"median_s\":%.6f,\"tok_per_s\":%.3f,"
           "\"median_tok_per_s\":%.3f",
           decode ? "decode" : "prefill", o->model, lm_arch_name(c->arch), lm_dtype_name(c->dtype),
           lm_weights_name(lm_model_weights(m)), lm_precision_name(lm_model_precision(m)), threads, B,
           (long long)P, (long long)toks, best, med, toks / best, toks / med);
    cli_print_steps(cache); /* the step arena beside what any plan would need */
    if (decode) cli_print_roofline((double)lm_model_weight_bytes(m), "read_gb_s", measure_bandwidth(ctx), toks / best, B);
    else cli_print_flops(cli_prefill_flops(c, P, B), best);
    printf("}\n");
    rc = 0;
done:
    free(ids);
    free(logits);
    free(slots);
    free(times);
    lm_kv_cache_destroy(cache);
    lm_model_destroy(m);
    return rc;
}

static int bench_tokenize(const bench_opts *o) {
    lm_tokenizer *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    lm_status st = lm_tokenizer_load(o->tokenizer, &tok);
    if (st != LM_OK) return cli_fail("bench tokenize", "cannot load the tokenizer", st);
    if ((st = lm_file_read_all(o->corpus, &text, &len)) != LM_OK) {
        lm_tokenizer_destroy(tok);
        return cli_fail("bench tokenize", "cannot read the corpus", st);
    }
    double *times = calloc((size_t)o->repeat, sizeof(double));
    size_t ntok = 0;
    for (int r = 0; r < o->repeat && st == LM_OK; r++) {
        int32_t *ids = NULL;
        double t0 = cli_now();
        st = lm_tokenizer_encode(tok, text, len, &ids, &ntok);
        times[r] = cli_now() - t0;
        lm_free(ids);
    }
    int rc = 0;
    if (st != LM_OK) rc = cli_fail("bench tokenize", "encode failed", st);
    else {
        double best, med;
        cli_best_median(times, o->repeat, &best, &med);
        printf("{\"bench\":\"tokenize\",\"tokenizer\":\"%s\",\"bytes\":%zu,\"tokens\":%zu,\"best_s\":%.6f,\"median_s\":%.6f,"
               "\"mb_per_s\":%.3f}\n",
               o->tokenizer, len, ntok, best, med, len / best / 1e6);
    }
    free(times);
    lm_free(text);
    lm_tokenizer_destroy(tok);
    return rc;
}

static int bench_run(bench_opts *o, const char *what, int decode, int prefill);

int cmd_bench(int argc, char **argv) {
    bench_opts o = {NULL, NULL, NULL, NULL, 0, 3, 64, 512, 1, LM_WEIGHTS_AUTO};
    int prompt = -1;
    const char *trace = NULL, *weights = NULL;
    const cli_opt opts[] = {
        {"model", CLI_STRING, &o.model, "DIR: model directory (decode, prefill)"},
        {"tokenizer", CLI_STRING, &o.tokenizer, "FILE: tokenizer.json (tokenize)"},
        {"corpus", CLI_STRING, &o.corpus, "FILE: UTF-8 text to encode (tokenize)"},
        {"threads", CLI_INT, &o.threads, "N: CPU threads (default: all)"},
        {"repeat", CLI_INT, &o.repeat, "R: runs per measurement (default 3)"},
        {"tokens", CLI_INT, &o.tokens, "N: decode steps per run (default 64)"},
        {"prompt", CLI_INT, &prompt, "T: prompt tokens (default 512 for prefill, 16 for decode)"},
        {"batch", CLI_INT, &o.batch, "B: sequences per step (default 1)"},
        {"device", CLI_STRING, &o.device, "DEV: cpu (default), cuda or cuda:N (bandwidth, decode, prefill)"},
        CLI_WEIGHTS_OPT(&weights),
        CLI_TRACE_OPT(&trace),
        {NULL, 0, NULL, NULL}};
    if (argc > 0 && !strcmp(argv[0], "serve")) return cmd_bench_serve(argc - 1, argv + 1);
    const char *pos[1];
    int npos;
    int rc = cli_parse("bench", "bandwidth|decode|prefill|tokenize [options]  (serve: see loom bench serve --help)", opts,
                       argc, argv, pos, 1, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    const char *what = npos ? pos[0] : "";
    int decode = !strcmp(what, "decode"), prefill = !strcmp(what, "prefill");
    o.prompt = prompt >= 0 ? prompt : decode ? 16 : 512;
    if (!cli_parse_weights("bench", weights, &o.weights)) return 2;
    if (o.repeat < 1 || o.tokens < 1 || o.prompt < 1 || o.batch < 1) {
        fprintf(stderr, "loom bench: --repeat, --tokens, --prompt and --batch must be >= 1\n");
        return 2;
    }
    if (!cli_trace_start("bench", trace)) return 1;
    return cli_trace_stop("bench", bench_run(&o, what, decode, prefill));
}

/* The measurement named by what (the options checked). */
static int bench_run(bench_opts *o_in, const char *what, int decode, int prefill) {
    bench_opts o = *o_in;
    if (!strcmp(what, "tokenize")) {
        if (!o.tokenizer || !o.corpus) {
            fprintf(stderr, "loom bench tokenize: --tokenizer and --corpus are required\n");
            return 2;
        }
        return bench_tokenize(&o);
    }
    if (!decode && !prefill && strcmp(what, "bandwidth")) {
        fprintf(stderr, "loom bench: expected bandwidth, decode, prefill, tokenize or serve\n");
        return 2;
    }
    if ((decode || prefill) && !o.model) {
        fprintf(stderr, "loom bench %s: --model DIR is required\n", what);
        return 2;
    }
    lm_device dev;
    if (!cli_parse_device("bench", o.device, &dev)) return 2;
    lm_device_caps caps;
    lm_status cs = lm_device_caps_get(dev, &caps);
    if (cs != LM_OK) return cli_fail("bench", "device", cs);
    if (caps.async) { /* timed with device-side token selection and the device's copy bandwidth */
        bench_device_opts d = {o.model, o.repeat, o.batch, o.prompt, o.tokens, o.weights};
        return decode || prefill ? bench_device_model(&d, dev, decode) : bench_device_bandwidth(dev, o.repeat);
    }
    lm_ctx *ctx = NULL;
    lm_status st = lm_ctx_create(lm_device_cpu(), o.threads, &ctx);
    if (st != LM_OK) return cli_fail("bench", "cannot create a context", st);
    int rc = decode || prefill ? bench_model(&o, ctx, decode) : bench_bandwidth(&o, ctx);
    lm_ctx_destroy(ctx);
    return rc;
}
