/* tools/loom/cmd_eval.c — `loom eval --model DIR --data SHARD.bin`: the mean next-token
 * cross-entropy (nats) and perplexity of a model over a whole token shard, as JSON.
 *
 * The shard is cut as `loom train` cuts it (windows of seq + 1 tokens at multiples of
 * seq, in file order), so every token after the first of each window is predicted
 * once with up to seq - 1 tokens of context; the mean is over all predicted tokens.
 * The model runs through the training model's forward (no gradients): f32 on the CPU,
 * bf16 compute with f32 accumulation on CUDA unless --dtype f32. With --weights
 * int8|int4[:G]|bf16 (or for a quantized directory, which the training model refuses) it runs
 * through the inference engine instead, one window at a time with every position's
 * logits; --reference W runs a second copy with weights W over the same windows and
 * reports how the two agree (docs/QUANTIZATION.md). --precision fast also runs the
 * inference engine (the training model has no fast mode); its --reference model runs
 * exact, so `--precision fast --reference bf16` measures what fast costs.
 */
#define LM_TRY_CLI(expr)                                                                                               \
    do {                                                                                                               \
        lm_status s_ = (expr);                                                                                         \
        if (s_ != LM_OK) return s_;                                                                                    \
    } while (0)
#include "args.h"
#include "commands.h"
#include "common.h"

#include "loom/data.h"
#include "loom/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct eval_args {
    const char *model, *data, *device, *dtype, *weights, *reference;
    int seq, batch, threads, max_windows, quiet;
} eval_args;

/* ---- the inference path (--weights, --reference, or an int8 directory) ------------------------
 * Each window runs through lm_model_forward (the engine generate runs, int8 weights
 * included) with every position's logits; the loss is computed here in double.
 * With a reference model the same window runs through it too, and the logits are
 * compared: top-1 agreement, NMSE sum((a-b)^2)/sum(b^2) and max |a-b| over all of them. */
typedef struct eval_model {
    lm_model *m;
    lm_kv_cache *cache;
    float *logits; /* [seq, vocab] */
    double nll;
} eval_model;

static int eval_model_open(const eval_args *a, lm_device dev, lm_weights w, lm_precision prec, eval_model *em) {
    memset(em, 0, sizeof *em);
    if (!(em->m = cli_load_model_precision("eval", a->model, dev, w, prec))) return 0;
    int64_t V = lm_model_get_config(em->m)->vocab_size;
    lm_status st = lm_kv_cache_create(em->m, 1, a->seq, &em->cache);
    if (st != LM_OK) return cli_fail("eval", "kv cache", st) == 0;
    if (!(em->logits = malloc(sizeof(float) * (size_t)a->seq * (size_t)V))) {
        fprintf(stderr, "loom eval: out of memory for %d x %lld logits\n", a->seq, (long long)V);
        return 0;
    }
    return 1;
}

static void eval_model_close(eval_model *em) {
    free(em->logits);
    lm_kv_cache_destroy(em->cache);
    lm_model_destroy(em->m);
}

/* One window through em; adds its targets' negative log-likelihood to em->nll. */
static lm_status eval_window(eval_model *em, lm_ctx *ctx, const int32_t *in, const int32_t *tg, int seq, int64_t *count) {
    int slot = 0;
    int64_t V = lm_model_get_config(em->m)->vocab_size, n = 0;
    LM_TRY_CLI(lm_kv_cache_reset(em->cache, 0));
    LM_TRY_CLI(lm_model_forward(em->m, ctx, em->cache, &slot, 1, in, seq, em->logits, 1));
    for (int t = 0; t < seq; t++) {
        if (tg[t] < 0 || tg[t] >= V) continue;
        const float *row = em->logits + (size_t)t * (size_t)V;
        double mx = row[0], sum = 0;
        for (int64_t v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
        for (int64_t v = 0; v < V; v++) sum += exp((double)row[v] - mx);
        em->nll += mx + log(sum) - row[tg[t]];
        n++;
    }
    *count = n;
    return LM_OK;
}

static int64_t argmax_row(const float *row, int64_t V) {
    int64_t b = 0;
    for (int64_t v = 1; v < V; v++)
        if (row[v] > row[b]) b = v;
    return b;
}

static int run_inference(const eval_args *a, lm_device dev, lm_weights w, lm_weights ref_w) {
    lm_ctx *ctx = NULL;
    lm_data_loader *dl = NULL;
    eval_model em, ref;
    int32_t *in = NULL, *tg = NULL;
    int rc = 1, has_ref = a->reference != NULL;
    memset(&ref, 0, sizeof ref);
    memset(&em, 0, sizeof em);
    lm_status st = lm_ctx_create(dev, a->threads, &ctx);
    if (st != LM_OK) return cli_fail("eval", "cannot create a context", st);
    if (!eval_model_open(a, dev, w, cli_precision(), &em) ||
        (has_ref && !eval_model_open(a, dev, ref_w, LM_PRECISION_EXACT, &ref)))
        goto done;
    int64_t V = lm_model_get_config(em.m)->vocab_size;
    if ((st = lm_data_loader_create(1, &a->data, a->seq, 0, 0, &dl)) != LM_OK) {
        cli_fail("eval", a->data, st);
        goto done;
    }
    if (lm_data_loader_vocab(dl) > V) {
        fprintf(stderr, "loom eval: '%s' was made with a vocabulary of %lld tokens; the model has %lld\n", a->data,
                (long long)lm_data_loader_vocab(dl), (long long)V);
        goto done;
    }
    int64_t windows = lm_data_loader_windows(dl), tokens = 0, agree = 0, compared = 0;
    if (a->max_windows > 0 && windows > a->max_windows) windows = a->max_windows;
    in = malloc(sizeof *in * (size_t)a->seq);
    tg = malloc(sizeof *tg * (size_t)a->seq);
    if (!in || !tg) goto done;
    double t0 = cli_now(), sq = 0, sq_ref = 0, max_abs = 0;
    for (int64_t wi = 0; wi < windows; wi++) {
        int64_t n = 0, nr = 0;
        if ((st = lm_data_loader_next(dl, 1, in, tg)) != LM_OK || (st = eval_window(&em, ctx, in, tg, a->seq, &n)) != LM_OK ||
            (has_ref && (st = eval_window(&ref, ctx, in, tg, a->seq, &nr)) != LM_OK)) {
            cli_fail("eval", "forward", st);
            goto done;
        }
        tokens += n;
        for (int t = 0; has_ref && t < a->seq; t++) {
            const float *x = em.logits + (size_t)t * (size_t)V, *y = ref.logits + (size_t)t * (size_t)V;
            agree += argmax_row(x, V) == argmax_row(y, V);
            compared++;
            for (int64_t v = 0; v < V; v++) {
                double d = (double)x[v] - y[v];
                sq += d * d, sq_ref += (double)y[v] * y[v];
                if (!(fabs(d) <= max_abs)) max_abs = fabs(d); /* NaN sticks */
            }
        }
        if (!a->quiet)
            fprintf(stderr, "%seval %lld/%lld windows  loss %.4f%s", isatty(2) ? "\r" : "", (long long)(wi + 1),
                    (long long)windows, em.nll / (double)(tokens ? tokens : 1), isatty(2) && wi + 1 < windows ? "" : "\n");
    }
    double mean = em.nll / (double)(tokens ? tokens : 1);
    printf("{\"model\":");
    cli_json_string(stdout, a->model, strlen(a->model));
    printf(",\"data\":");
    cli_json_string(stdout, a->data, strlen(a->data));
    printf(",\"device\":\"%s\",\"weights\":\"%s\",\"precision\":\"%s\",\"path\":\"inference\",\"seq\":%d,"
           "\"windows\":%lld,\"tokens\":%lld,\"loss\":%.6f,\"perplexity\":%.4f",
           dev.type == LM_DEVICE_CUDA ? "cuda" : "cpu", lm_weights_name(lm_model_weights(em.m)),
           lm_precision_name(lm_model_precision(em.m)), a->seq,
           (long long)windows, (long long)tokens, mean, exp(mean));
    if (has_ref) {
        double rmean = ref.nll / (double)(tokens ? tokens : 1);
        printf(",\"reference\":{\"weights\":\"%s\",\"precision\":\"exact\",\"loss\":%.6f,\"perplexity\":%.4f,\"perplexity_ratio\":%.6f,"
               "\"top1_agreement\":%.6f,\"positions\":%lld,\"logits_nmse\":%.3e,\"logits_max_abs\":%.4g}",
               lm_weights_name(lm_model_weights(ref.m)), rmean, exp(rmean), exp(mean - rmean),
               (double)agree / (double)(compared ? compared : 1), (long long)compared, sq / (sq_ref > 0 ? sq_ref : 1), max_abs);
    }
    printf(",\"seconds\":%.3f}\n", cli_now() - t0);
    rc = 0;
done:
    free(in), free(tg);
    lm_data_loader_destroy(dl);
    eval_model_close(&em);
    eval_model_close(&ref);
    lm_ctx_destroy(ctx);
    return rc;
}

static int run(const eval_args *a) {
    lm_device dev;
    lm_weights w, ref_w;
    if (!cli_parse_device("eval", a->device, &dev) || !cli_parse_weights("eval", a->weights, &w) ||
        !cli_parse_weights("eval", a->reference, &ref_w))
        return 2;
    lm_model_config cfg;
    int int8_dir = lm_model_config_load(a->model, &cfg) == LM_OK && cfg.quant_format != LM_QUANT_NONE;
    if (a->weights || a->reference || int8_dir || cli_precision() != LM_PRECISION_EXACT) {
        if (a->dtype) {
            fprintf(stderr, "loom eval: --dtype is for the training model's path; --weights/--reference/--precision (and int8 "
                            "directories) run the inference engine (f32 compute on the CPU)\n");
            return 2;
        }
        return run_inference(a, dev, w, ref_w);
    }
    lm_ctx *ctx = NULL;
    lm_train_model *m = NULL;
    lm_data_loader *dl = NULL;
    int32_t *in = NULL, *tg = NULL;
    int rc = 1;
    lm_status st = lm_ctx_create(dev, a->threads, &ctx);
    if (st != LM_OK) return cli_fail("eval", "cannot create a context", st);
    if ((st = lm_train_model_load(a->model, dev, &m)) != LM_OK) {
        cli_fail("eval", a->model, st);
        goto done;
    }
    lm_device_caps caps;
    if ((st = lm_device_caps_get(dev, &caps)) != LM_OK) {
        cli_fail("eval", "device", st);
        goto done;
    }
    const char *dtype = a->dtype ? a->dtype : caps.fast_16bit ? "bf16" : "f32";
    if (strcmp(dtype, "f32") && strcmp(dtype, "bf16")) {
        fprintf(stderr, "loom eval: --dtype must be f32 or bf16, not '%s'\n", dtype);
        rc = 2;
        goto done;
    }
    if ((st = lm_train_model_set_compute_dtype(m, dtype[0] == 'b' ? LM_BF16 : LM_F32)) != LM_OK) {
        cli_fail("eval", "--dtype", st);
        goto done;
    }
    int64_t vocab = lm_train_model_config(m)->vocab_size;
    if ((st = lm_data_loader_create(1, &a->data, a->seq, 0, 0, &dl)) != LM_OK) {
        cli_fail("eval", a->data, st);
        goto done;
    }
    if (lm_data_loader_vocab(dl) > vocab) {
        fprintf(stderr, "loom eval: '%s' was made with a vocabulary of %lld tokens; the model has %lld\n", a->data,
                (long long)lm_data_loader_vocab(dl), (long long)vocab);
        goto done;
    }
    int64_t windows = lm_data_loader_windows(dl);
    if (a->max_windows > 0 && windows > a->max_windows) windows = a->max_windows;
    in = malloc(sizeof *in * (size_t)a->batch * (size_t)a->seq);
    tg = malloc(sizeof *tg * (size_t)a->batch * (size_t)a->seq);
    if (!in || !tg) {
        fprintf(stderr, "loom eval: out of memory for a batch of %d x %d tokens\n", a->batch, a->seq);
        goto done;
    }
    double t0 = cli_now(), sum = 0, last_report = t0;
    int64_t done_windows = 0;
    int tty = isatty(2);
    while (done_windows < windows) {
        int b = windows - done_windows < a->batch ? (int)(windows - done_windows) : a->batch;
        float loss = 0;
        for (int64_t i = 0; i < (int64_t)b * a->seq; i++) in[i] = tg[i] = -1; /* poison: the loader must fill both */
        if ((st = lm_data_loader_next(dl, b, in, tg)) != LM_OK ||
            (st = lm_train_model_loss(m, ctx, in, tg, b, a->seq, &loss)) != LM_OK) {
            cli_fail("eval", "forward", st);
            goto done;
        }
        if (!isfinite(loss)) {
            fprintf(stderr, "loom eval: the loss of windows %lld..%lld is %g\n", (long long)done_windows,
                    (long long)(done_windows + b - 1), (double)loss);
            goto done;
        }
        sum += (double)loss * b;
        done_windows += b;
        double now = cli_now();
        if (!a->quiet && (now - last_report > (tty ? 0.2 : 5.0) || done_windows == windows)) {
            fprintf(stderr, "%seval %lld/%lld windows  loss %.4f%s", tty ? "\r" : "", (long long)done_windows,
                    (long long)windows, sum / (double)done_windows, tty && done_windows < windows ? "" : "\n");
            last_report = now;
        }
    }
    double mean = sum / (double)windows;
    printf("{\"model\":");
    cli_json_string(stdout, a->model, strlen(a->model));
    printf(",\"data\":");
    cli_json_string(stdout, a->data, strlen(a->data));
    printf(",\"device\":\"%s\",\"dtype\":\"%s\",\"seq\":%d,\"windows\":%lld,\"tokens\":%lld,\"loss\":%.6f,"
           "\"perplexity\":%.4f,\"seconds\":%.3f}\n",
           dev.type == LM_DEVICE_CUDA ? "cuda" : "cpu", dtype, a->seq, (long long)windows,
           (long long)windows * a->seq, mean, exp(mean), cli_now() - t0);
    rc = 0;
done:
    free(in), free(tg);
    lm_data_loader_destroy(dl);
    lm_train_model_destroy(m);
    lm_ctx_destroy(ctx);
    return rc;
}

int cmd_eval(int argc, char **argv) {
    eval_args a = {.seq = 512, .batch = 8, .threads = 0};
    const cli_opt opts[] = {
        {"model", CLI_STRING, &a.model, "DIR: Hugging Face model directory (required)"},
        {"data", CLI_STRING, &a.data, "FILE: token shard from `loom data prepare` (required)"},
        {"seq", CLI_COUNT, &a.seq, "T: tokens per window (default 512)"},
        {"batch", CLI_COUNT, &a.batch, "B: windows per forward pass (default 8)"},
        {"max-windows", CLI_COUNT, &a.max_windows, "N: only the first N windows (default: all)"},
        {"device", CLI_STRING, &a.device, "cpu|cuda[:N]: where to run (default cpu)"},
        {"dtype", CLI_STRING, &a.dtype, "f32|bf16: compute dtype (default bf16 on CUDA, f32 on the CPU)"},
        {"threads", CLI_COUNT, &a.threads, "N: CPU threads (default: all)"},
        {"weights", CLI_STRING, &a.weights, "int8|int4[:G]|fp8|bf16: run the inference engine with these weights instead of the "
                                            "training model (default for an int8 directory: int8; docs/QUANTIZATION.md)"},
        {"reference", CLI_STRING, &a.reference, "int8|int4[:G]|fp8|bf16|auto: also run the model with these weights and report "
                                                "top-1 agreement, logits NMSE and max |diff| against it (at exact precision)"},
        CLI_PRECISION_OPT,
        {"quiet", CLI_FLAG, &a.quiet, "no progress on stderr"},
        {NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos;
    int rc = cli_parse("eval", "--model DIR --data SHARD.bin [--seq T] [--batch B] [--device D]", opts, argc, argv, pos, 0,
                       &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (!a.model || !a.data) {
        fprintf(stderr, "loom eval: --model DIR and --data FILE are required\n");
        return 2;
    }
    if (a.seq < 1 || a.batch < 1) {
        fprintf(stderr, "loom eval: --seq and --batch must be at least 1\n");
        return 2;
    }
    return run(&a);
}
