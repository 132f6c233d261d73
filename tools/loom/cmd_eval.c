/* tools/loom/cmd_eval.c — `loom eval --model DIR --data SHARD.bin`: the mean next-token
 * cross-entropy (nats) and perplexity of a model over a whole token shard, as JSON.
 *
 * The shard is cut as `loom train` cuts it (windows of seq + 1 tokens at multiples of
 * seq, in file order), so every token after the first of each window is predicted
 * once with up to seq - 1 tokens of context; the mean is over all predicted tokens.
 * The model runs through the training model's forward (no gradients): f32 on the CPU,
 * bf16 compute with f32 accumulation on CUDA unless --dtype f32.
 */
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
    const char *model, *data, *device, *dtype;
    int seq, batch, threads, max_windows, quiet;
} eval_args;

static int run(const eval_args *a) {
    lm_device dev;
    if (!cli_parse_device("eval", a->device, &dev)) return 2;
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
