/* tools/loom/cmd_train.c — `loom train`: trains or fine-tunes a model on token shards
 * (from `loom data prepare`) with AdamW, writing Hugging Face checkpoints.
 *
 * Output: a live progress line on stderr (step, loss, learning rate, tokens/s, MFU on
 * CUDA, ETA; redrawn in place on a terminal, one line per ~5% otherwise), a JSON line
 * per logged step (every --log-every steps and the last; step_s is the mean over the
 * steps since the previous one) and per validation in OUT/log.jsonl, a line saying how
 * steps run (on a GPU: one captured CUDA graph), checkpoints in OUT/checkpoint-NNNNNN
 * every --save-every steps and the last one in OUT/final. Each checkpoint is a Hugging
 * Face directory plus train_state.bin; --resume CHECKPOINT continues from it and
 * replays the remaining steps bit for bit, after cutting log.jsonl back to the
 * checkpoint's step.
 *
 * Every input is checked before the first step (output directory writable, tokenizer
 * loadable, token ids inside the model's vocabulary, the resumed step below --steps),
 * so a run never trains for hours to fail at its first save. Before that, leftovers
 * of interrupted saves in OUT are recovered or removed (lm_train_checkpoints_recover).
 *
 * Data parallel: started by an MPI launcher (`mpirun -np N loom train ...`) every
 * process is one rank of the run (lm_dist, lm_trainer_set_dist). Rank 0 alone touches
 * OUT (recovery, log.jsonl, checkpoints) and prints progress; every rank checks its
 * inputs, and its error messages start with "rank R: ". A rank that fails ends the whole
 * job (MPI_Abort), so no rank waits for it forever. Ranks must be given the same
 * options: a fingerprint of them is compared with rank 0's before the first step.
 * --zero 1 shards the AdamW state over the ranks (ZeRO-1, lm_trainer_set_zero); the
 * start reports the optimizer-state bytes per rank.
 */
#include "args.h"
#include "commands.h"
#include "common.h"
#include "loom/io_write.h"
#include "loom/train.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct train_args {
    const char *model, *config, *data, *val_data, *out, *resume, *schedule, *tokenizer, *device, *dtype, *trace;
    int batch, grad_accum, threads, no_shuffle, zero;
    float peak_tflops;
    int steps, seq, warmup, val_every, val_batches, save_every, log_every;
    float lr, min_lr, clip, weight_decay, beta1, beta2;
    uint64_t seed;
} train_args;

typedef struct session {
    train_args a;
    lm_dist *dist;      /* the ranks of this run (a world of one without a launcher) */
    int rank0;          /* 1 on rank 0: the one that writes OUT and prints progress */
    lm_train_options o;
    lm_ctx *ctx;
    lm_train_model *model;
    lm_data_loader *data, *val;
    lm_trainer *trainer;
    FILE *log;
    double t0;
    int64_t first_step; /* steps already done when this process started */
    double flops_per_token; /* training FLOPs per token (MFU), 0 on the CPU */
} session;

/* "rank R: " in a run of several ranks, else "": the start of every error line. */
static char g_rank_tag[32];

/* One line on stderr, "[rank R: ]loom train: " + the message, written with one call so
 * that lines of several ranks do not interleave. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static void say(const char *fmt, ...) {
    char line[8192];
    int n = snprintf(line, sizeof line, "%sloom train: ", g_rank_tag);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fputs(line, stderr);
    fflush(stderr);
}

static const char *k_synopsis = "(--model DIR | --config FILE) --data TRAIN.bin --out DIR [options]";

static int parse(int argc, char **argv, train_args *a) {
    *a = (train_args){.schedule = "cosine", .device = "cpu", .batch = 8, .grad_accum = 1, .steps = 100, .seq = 256,
                      .warmup = 10, .val_batches = 4, .lr = 3e-4f, .min_lr = -1, .clip = 1.0f, .weight_decay = 0.1f,
                      .beta1 = 0.9f, .beta2 = 0.95f, .seed = 1, .peak_tflops = 989.4f};
    const cli_opt opts[] = {
        {"model", CLI_STRING, &a->model, "DIR: Hugging Face model to fine-tune"},
        {"config", CLI_STRING, &a->config, "FILE: config.json of a model to train from scratch (seeded init)"},
        {"data", CLI_STRING, &a->data, "A.bin[,B.bin...]: training token shards (required)"},
        {"val-data", CLI_STRING, &a->val_data, "FILE: held-out token shard for the validation loss"},
        {"out", CLI_STRING, &a->out, "DIR: output directory for log.jsonl and checkpoints (required)"},
        {"resume", CLI_STRING, &a->resume, "DIR: a checkpoint to continue from (same --batch, --seq and ranks x "
                                           "--grad-accum)"},
        {"steps", CLI_INT, &a->steps, "N: optimizer steps of the whole run (default 100)"},
        {"batch", CLI_INT, &a->batch, "B: sequences per micro-batch (default 8)"},
        {"seq", CLI_INT, &a->seq, "T: tokens per sequence (default 256)"},
        {"grad-accum", CLI_INT, &a->grad_accum, "N: micro-batches per step on each rank (default 1)"},
        {"zero", CLI_INT, &a->zero, "N: ZeRO stage of data parallel: 0 = AdamW state on every rank (default), 1 = "
                                    "sharded over the ranks, 1/N each (CPU only)"},
        {"lr", CLI_FLOAT, &a->lr, "X: peak learning rate (default 3e-4)"},
        {"min-lr", CLI_FLOAT, &a->min_lr, "X: final learning rate (default lr / 10)"},
        {"warmup", CLI_INT, &a->warmup, "N: linear warmup steps (default 10)"},
        {"schedule", CLI_STRING, &a->schedule, "NAME: cosine, linear or constant (default cosine)"},
        {"clip", CLI_FLOAT, &a->clip, "X: global gradient-norm limit, 0 = off (default 1.0)"},
        {"weight-decay", CLI_FLOAT, &a->weight_decay, "X: AdamW decoupled weight decay of matrices (default 0.1)"},
        {"beta1", CLI_FLOAT, &a->beta1, "X: AdamW beta1 (default 0.9)"},
        {"beta2", CLI_FLOAT, &a->beta2, "X: AdamW beta2 (default 0.95)"},
        {"seed", CLI_U64, &a->seed, "N: seed of the initialisation and the data order (default 1)"},
        {"val-every", CLI_INT, &a->val_every, "N: validate every N steps (default: only at the end)"},
        {"val-batches", CLI_INT, &a->val_batches, "N: batches per validation (default 4)"},
        {"save-every", CLI_COUNT, &a->save_every, "N: checkpoint every N steps (default: only at the end)"},
        {"log-every", CLI_COUNT, &a->log_every, "N: log the loss every N steps and at the last (default 1); on a GPU "
                                                "the steps between never wait for the device"},
        {"tokenizer", CLI_STRING, &a->tokenizer, "FILE: tokenizer.json copied into checkpoints"},
        {"device", CLI_STRING, &a->device, "cpu|cuda[:N]: where to train (default cpu)"},
        {"dtype", CLI_STRING, &a->dtype, "f32|bf16: compute dtype (default bf16 on CUDA, f32 on the CPU); master "
                                         "weights, gradients and optimizer state stay f32"},
        {"no-shuffle", CLI_FLAG, &a->no_shuffle, "serve the training windows in file order"},
        {"peak-tflops", CLI_FLOAT, &a->peak_tflops, "X: the GPU's peak dense bf16 TFLOP/s for MFU (default 989.4, "
                                                    "H100/H200 SXM)"},
        {"threads", CLI_COUNT, &a->threads, "N: CPU threads (default: all)"},
        CLI_TRACE_OPT(&a->trace),
        {NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos;
    int rc = cli_parse("train", k_synopsis, opts, argc, argv, pos, 0, &npos);
    if (rc) return rc;
    if ((!a->model == !a->config && !a->resume) || !a->data || !a->out) {
        say("give --data, --out and exactly one of --model / --config (or --resume)\n");
        return 2;
    }
    if (a->zero != 0 && a->zero != 1) {
        say("--zero must be 0 (optimizer state on every rank) or 1 (sharded over the ranks), not %d\n", a->zero);
        return 2;
    }
    if (a->min_lr < 0) a->min_lr = a->lr / 10;
    return 0;
}

/* An informational line of rank 0 (no rank tag). */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static void note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("loom train: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

/* cli_fail's message with the rank tag. */
static int fail(const char *what, lm_status st) {
    const char *detail = lm_last_error();
    say("%s: %s%s%s\n", what, lm_status_str(st), detail[0] ? ": " : "", detail);
    return 1;
}

/* Splits "a,b,c" into up to 64 paths inside buf. */
static int split_paths(const char *list, char *buf, size_t size, const char **paths) {
    snprintf(buf, size, "%s", list);
    int n = 0;
    for (char *p = buf; p && *p && n < 64; n++) {
        paths[n] = p;
        p = strchr(p, ',');
        if (p) *p++ = '\0';
    }
    return n;
}

static void print_recovery(void *user, const char *line) { note("%s\n", line); }

/* Creates OUT when needed, proves it writable (a file is created there and removed),
 * then recovers or removes the leftovers of interrupted saves. */
static int prepare_out(const char *out) {
    struct stat sb;
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        say("cannot create the output directory '%s': %s\n", out, strerror(errno));
        return 1;
    }
    if (stat(out, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        say("--out '%s' is not a directory\n", out);
        return 1;
    }
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/log.jsonl", out);
    lm_atomic_file *f = NULL;
    lm_status st = lm_atomic_file_open(probe, &f); /* creates log.jsonl.tmp-PID */
    lm_atomic_file_abort(f);
    if (st != LM_OK) return fail("the output directory is not writable", st);
    if ((st = lm_train_checkpoints_recover(out, print_recovery, NULL)) != LM_OK)
        return fail("cannot clean up after an interrupted run", st);
    return 0;
}

/* --tokenizer must be a regular file that loads as a tokenizer (it is copied into
 * every checkpoint; finding it broken at the first save would waste the run). */
static int check_tokenizer(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        say("--tokenizer '%s': %s\n", path, strerror(errno));
        return 1;
    }
    if (!S_ISREG(sb.st_mode)) {
        say("--tokenizer '%s' is not a regular file\n", path);
        return 1;
    }
    lm_tokenizer *tok = NULL;
    lm_status st = lm_tokenizer_load(path, &tok);
    lm_tokenizer_destroy(tok);
    return st == LM_OK ? 0 : fail("--tokenizer does not load", st);
}

/* Every token of the shard at path must be a valid id of the model (vocab ids). A
 * shard records its vocabulary size (every id below it) or 0 when it does not: then
 * its ids are scanned for the largest, O(tokens). */
static int check_shard_vocab(const char *path, const char *option, int64_t vocab) {
    char what[64];
    snprintf(what, sizeof what, "cannot open %s", option);
    lm_token_shard *sh = NULL;
    lm_status st = lm_token_shard_open(path, &sh);
    if (st != LM_OK) return fail(what, st);
    int64_t recorded = lm_token_shard_vocab(sh), n = lm_token_shard_count(sh), max_id = -1, at = 0;
    int32_t buf[16384];
    for (int64_t i = 0; st == LM_OK && recorded == 0 && i < n; i += 16384) {
        int64_t k = n - i < 16384 ? n - i : 16384;
        st = lm_token_shard_read(sh, i, k, buf);
        for (int64_t j = 0; st == LM_OK && j < k; j++)
            if (buf[j] > max_id) max_id = buf[j], at = i + j;
    }
    lm_token_shard_close(sh);
    if (st != LM_OK) return fail(what, st);
    if (recorded > vocab) {
        say("%s '%s' was made with a vocabulary of %lld ids, but the model has %lld\n", option, path,
            (long long)recorded, (long long)vocab);
        return 1;
    }
    if (max_id >= vocab) {
        say("%s '%s' records no vocabulary and holds token id %lld (at index %lld), outside the model's vocabulary "
            "of %lld\n",
            option, path, (long long)max_id, (long long)at, (long long)vocab);
        return 1;
    }
    return 0;
}

/* The log of a resumed run: the lines before the first one of a step after `step`
 * are kept (validation lines of kept steps too; a torn last line of a killed run is
 * dropped), so the steps the resumed run replays are not logged twice. The file is
 * replaced atomically. */
static int truncate_log(const char *path, int64_t step) {
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) return 0;
    char *text = NULL;
    size_t n = 0, keep = 0, dropped = 0;
    lm_status st = lm_file_read_all(path, &text, &n);
    if (st != LM_OK) return fail("cannot read the log", st);
    while (keep < n) {
        const char *line = text + keep, *nl = memchr(line, '\n', n - keep);
        if (!nl) break;
        json_t *j = json_loadb(line, (size_t)(nl - line), 0, NULL), *s = j ? json_object_get(j, "step") : NULL;
        int later = s && json_is_integer(s) && json_integer_value(s) > step;
        json_decref(j);
        if (later) break;
        keep = (size_t)(nl - text) + 1;
    }
    for (size_t i = keep; i < n; i++) dropped += text[i] == '\n' || i + 1 == n;
    if (keep < n) st = lm_file_write_atomic(path, text, keep);
    lm_free(text);
    if (st != LM_OK) return fail("cannot rewrite the log", st);
    if (dropped)
        note("%s: dropped %zu line%s logged after step %lld (those steps are trained again)\n", path, dropped,
             dropped == 1 ? "" : "s", (long long)step);
    return 0;
}

/* --device for this rank: plain "cuda" with several ranks on a host means one GPU per
 * rank (local rank modulo the GPUs); "cuda:N" is taken as given. */
static int pick_device(const session *s, lm_device *dev) {
    lm_status st = lm_device_parse(s->a.device, dev);
    if (st != LM_OK) return fail("bad --device", st);
    int gpus = lm_cuda_device_count();
    if (!strcmp(s->a.device, "cuda") && lm_dist_local_size(s->dist) > 1 && gpus > 0)
        dev->index = lm_dist_local_rank(s->dist) % gpus;
    return 0;
}

/* Rank 0's options must be every rank's (a rank given other ones would silently train
 * another model, or step out of line in the collectives): an FNV-1a hash of the
 * arguments that shape the run is compared with rank 0's. */
static int check_same_args(session *s) {
    if (lm_dist_size(s->dist) == 1) return 0;
    const train_args *a = &s->a;
    char text[16384];
    snprintf(text, sizeof text,
             "%s|%s|%s|%s|%s|%s|%s|%s|%d|%d|%d|%d|%d|%d|%d|%d|%d|%d|%.9g|%.9g|%.9g|%.9g|%.9g|%.9g|%llu",
             a->model ? a->model : "", a->config ? a->config : "", a->data, a->val_data ? a->val_data : "",
             a->resume ? a->resume : "", a->schedule, a->dtype ? a->dtype : "", a->out, a->batch, a->grad_accum,
             a->no_shuffle, a->zero, a->steps, a->seq, a->warmup, a->val_every, a->val_batches, a->save_every, a->lr,
             a->min_lr, a->clip, a->weight_decay, a->beta1, a->beta2, (unsigned long long)a->seed);
    uint64_t mine = 0xcbf29ce484222325ull, root;
    for (const char *p = text; *p; p++) mine = (mine ^ (uint8_t)*p) * 0x100000001b3ull;
    root = mine;
    lm_status st = lm_dist_broadcast(s->dist, &root, sizeof root, 0);
    if (st != LM_OK) return fail("cannot compare the options of the ranks", st);
    if (root != mine) {
        say("the training options of this rank differ from rank 0's (give every rank the same arguments)\n");
        return 2;
    }
    return 0;
}

static int open_all(session *s) {
    const train_args *a = &s->a;
    lm_device dev;
    lm_status st = LM_OK;
    int rc = pick_device(s, &dev);
    if (!rc && a->tokenizer) rc = check_tokenizer(a->tokenizer);
    if (!rc && s->rank0) rc = prepare_out(a->out); /* rank 0 alone touches OUT */
    if (rc) return rc;
    /* the others wait for the recovery: it may restore the checkpoint --resume names */
    if ((st = lm_dist_barrier(s->dist)) != LM_OK) return fail("cannot wait for rank 0", st);
    if (a->resume) {
        int64_t saved = 0;
        if ((st = lm_train_checkpoint_check(a->resume, &saved)) != LM_OK) return fail("cannot resume", st);
        if (saved >= a->steps) {
            say("--steps %d is not beyond step %lld of the checkpoint '%s': nothing to train (give the whole run's "
                "length)\n",
                a->steps, (long long)saved, a->resume);
            return 2;
        }
    }
    if ((st = lm_ctx_create(dev, a->threads, &s->ctx)) != LM_OK) return fail("cannot create a context", st);
    if (a->resume) st = lm_train_model_load(a->resume, dev, &s->model);
    else if (a->model) st = lm_train_model_load(a->model, dev, &s->model);
    else st = lm_train_model_init(a->config, a->seed, dev, &s->model);
    if (st != LM_OK) return fail("cannot set up the model", st);
    lm_device_caps caps;
    if ((st = lm_device_caps_get(dev, &caps)) != LM_OK) return fail("device", st);
    const char *dtype = a->dtype ? a->dtype : caps.fast_16bit ? "bf16" : "f32"; /* the device's fast path */
    if (strcmp(dtype, "f32") && strcmp(dtype, "bf16")) {
        say("--dtype must be f32 or bf16, not '%s'\n", dtype);
        return 2;
    }
    st = lm_train_model_set_compute_dtype(s->model, dtype[0] == 'b' ? LM_BF16 : LM_F32);
    if (st != LM_OK) return fail("bad --dtype", st);
    if (caps.fast_16bit) s->flops_per_token = lm_train_model_flops_per_token(s->model, a->seq); /* for MFU */
    char buf[8192];
    const char *paths[64];
    int n = split_paths(a->data, buf, sizeof buf, paths);
    int64_t vocab = lm_train_model_config(s->model)->vocab_size;
    for (int i = 0; i < n; i++)
        if ((rc = check_shard_vocab(paths[i], "--data", vocab))) return rc;
    if (a->val_data && (rc = check_shard_vocab(a->val_data, "--val-data", vocab))) return rc;
    if ((st = lm_data_loader_create(n, paths, a->seq, a->seed, !a->no_shuffle, &s->data)) != LM_OK) return fail("cannot open --data", st);
    if (a->val_data && (st = lm_data_loader_create(1, &a->val_data, a->seq, 0, 0, &s->val)) != LM_OK)
        return fail("cannot open --val-data", st);
    lm_train_options_default(&s->o);
    s->o.steps = a->steps, s->o.batch = a->batch, s->o.seq = a->seq, s->o.grad_accum = a->grad_accum;
    s->o.lr = a->lr, s->o.min_lr = a->min_lr, s->o.warmup = a->warmup, s->o.clip = a->clip;
    s->o.log_every = a->log_every > 1 ? a->log_every : 1;
    s->o.adamw = (lm_adamw_config){a->beta1, a->beta2, 1e-8, a->weight_decay};
    if ((st = lm_lr_schedule_parse(a->schedule, &s->o.schedule)) != LM_OK) return fail("bad --schedule", st);
    if ((st = lm_trainer_create(s->model, s->data, &s->o, &s->trainer)) != LM_OK) return fail("bad options", st);
    if ((st = lm_trainer_set_dist(s->trainer, s->dist)) != LM_OK) return fail("bad options", st);
    if ((st = lm_trainer_set_zero(s->trainer, a->zero)) != LM_OK) {
        say("--zero %d: %s: %s\n", a->zero, lm_status_str(st), lm_last_error());
        return 2;
    }
    if (a->resume && (st = lm_trainer_resume(s->trainer, s->ctx, a->resume)) != LM_OK) return fail("cannot resume", st);
    s->first_step = lm_trainer_step_count(s->trainer);
    if ((rc = check_same_args(s)) || !s->rank0) return rc;
    snprintf(buf, sizeof buf, "%s/log.jsonl", a->out);
    if (a->resume && (rc = truncate_log(buf, s->first_step))) return rc;
    if (!(s->log = fopen(buf, a->resume ? "a" : "w"))) {
        say("cannot write '%s': %s\n", buf, strerror(errno));
        return 1;
    }
    return 0;
}

static void close_all(session *s) {
    if (s->log) fclose(s->log);
    lm_trainer_destroy(s->trainer);
    lm_data_loader_destroy(s->val);
    lm_data_loader_destroy(s->data);
    lm_train_model_destroy(s->model);
    lm_ctx_destroy(s->ctx);
}

static void progress(const session *s, const lm_train_step_info *in, double tok_s, int last) {
    static int tty = -1;
    if (tty < 0) tty = isatty(2);
    int64_t every = s->a.steps / 20 > 0 ? s->a.steps / 20 : 1;
    if (!tty && !last && in->step % every != 0) return;
    double eta = tok_s > 0 ? (double)(s->a.steps - in->step) * (double)in->tokens / tok_s : 0;
    char mfu[32] = "";
    if (s->flops_per_token > 0 && s->a.peak_tflops > 0)
        snprintf(mfu, sizeof mfu, "  MFU %.1f%%", 100.0 * tok_s * s->flops_per_token / (s->a.peak_tflops * 1e12));
    fprintf(stderr, "%sstep %lld/%d  loss %.4f  lr %.2e  |g| %.3f  %.0f tok/s%s  ETA %dm%02ds%s", tty ? "\r" : "",
            (long long)in->step, s->a.steps, in->loss, in->lr, in->grad_norm, tok_s, mfu, (int)(eta / 60),
            (int)fmod(eta, 60), tty && !last ? "   " : "\n");
    fflush(stderr);
}

static int validate(session *s, int64_t step) {
    double loss = 0;
    lm_status st = lm_trainer_evaluate(s->trainer, s->ctx, s->val, s->a.val_batches, &loss);
    if (st != LM_OK) return fail("validation failed", st);
    if (!s->rank0) return 0;
    fprintf(s->log, "{\"step\":%lld,\"val_loss\":%.9g}\n", (long long)step, loss);
    fflush(s->log);
    fprintf(stderr, "%sstep %lld  validation loss %.4f\n", isatty(2) ? "\n" : "", (long long)step, loss);
    return 0;
}

static int save(session *s, const char *name) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", s->a.out, name);
    lm_status st = lm_trainer_save(s->trainer, s->ctx, dir, s->a.tokenizer);
    if (st != LM_OK) return fail("cannot save a checkpoint", st);
    if (s->rank0) fprintf(stderr, "%scheckpoint %s\n", isatty(2) ? "\n" : "", dir);
    return 0;
}

/* Rank 0's step line in log.jsonl and its progress line. */
static void log_step(session *s, const lm_train_step_info *in, double tok_s, double step_s) {
    fprintf(s->log,
            "{\"step\":%lld,\"loss\":%.9g,\"lr\":%.6g,\"grad_norm\":%.6g,\"tokens\":%lld,\"tokens_per_s\":%.1f,"
            "\"step_s\":%.6f}\n",
            (long long)in->step, in->loss, in->lr, in->grad_norm, (long long)in->tokens, tok_s, step_s);
    fflush(s->log);
    progress(s, in, tok_s, in->step == s->a.steps);
}

/* Rank 0's summary after the last step: the profile and the peak device memory. */
static void report_end(session *s) {
    if (lm_ag_profile_enabled())
        fprintf(stderr, "steps %lld-%d:\n", (long long)(s->first_step + (s->a.steps > s->first_step + 1 ? 2 : 1)),
                s->a.steps);
    lm_ag_profile_report(stderr);
    lm_device_memory_stats ms;
    if (lm_device_memory_stats_get(lm_ctx_device(s->ctx), &ms) == LM_OK) { /* devices with a caching allocator */
        fprintf(s->log, "{\"peak_bytes\":%lld,\"peak_reserved_bytes\":%lld}\n", (long long)ms.peak_bytes,
                (long long)ms.peak_reserved_bytes);
        fprintf(stderr, "device memory: peak %.2f GiB in use, %.2f GiB reserved by the caching allocator\n",
                (double)ms.peak_bytes / (1 << 30), (double)ms.peak_reserved_bytes / (1 << 30));
    }
}

/* The optimizer-state line: the bytes of AdamW moments each rank holds (every rank's
 * count is shared, so rank 0 reports the largest), against the unsharded 8 x numel. */
static int report_optimizer_state(session *s) {
    int n = lm_dist_size(s->dist);
    double *bytes = calloc((size_t)n, sizeof *bytes), most = 0;
    if (!bytes) {
        say("out of memory\n");
        return 1;
    }
    bytes[lm_dist_rank(s->dist)] = (double)lm_trainer_optimizer_state_bytes(s->trainer);
    lm_status st = lm_dist_allreduce_sum_f64(s->dist, bytes, n);
    for (int r = 0; r < n; r++) most = bytes[r] > most ? bytes[r] : most;
    free(bytes);
    if (st != LM_OK) return fail("cannot share the optimizer-state sizes", st);
    if (!s->rank0) return 0;
    double whole = 8.0 * (double)lm_train_model_numel(s->model), mib = 1024.0 * 1024.0;
    if (lm_trainer_zero_stage(s->trainer) == 1)
        note("optimizer state: %.3f MiB per rank (ZeRO-1 over %d rank%s; %.0f bytes on the largest slice, %.3f MiB "
             "unsharded)\n",
             most / mib, n, n == 1 ? "" : "s", most, whole / mib);
    else
        note("optimizer state: %.3f MiB per rank (%.0f bytes, replicated on each of %d rank%s)\n", most / mib, most, n,
             n == 1 ? "" : "s");
    if (n > 1) note("gradients summed over the ranks by %s\n", lm_trainer_collectives(s->trainer));
    return 0;
}

static int loop(session *s) {
    double tokens = 0;
    s->t0 = cli_now();
    double t_prev = s->t0;
    int64_t logged = s->first_step; /* the last step whose loss was read */
    for (int64_t step = s->first_step + 1; step <= s->a.steps; step++) {
        lm_train_step_info in;
        lm_status st = lm_trainer_step(s->trainer, s->ctx, &in);
        if (st != LM_OK) return fail("training step failed", st);
        tokens += (double)in.tokens;
        if (s->rank0 && (step == s->first_step + 2 || (step == s->a.steps && step == s->first_step + 1))) {
            int64_t k = lm_trainer_graph_kernels(s->trainer);
            char kern[48] = "";
            if (k > 0) snprintf(kern, sizeof kern, " of %lld kernels", (long long)k);
            note("%straining steps: %s%s\n", isatty(2) ? "\n" : "", lm_trainer_step_form(s->trainer), kern);
        }
        if (in.stats && !isfinite(in.loss)) {
            if (s->rank0) fputc('\n', stderr);
            say("the loss became %g at step %lld (lower --lr?)\n", in.loss, (long long)step);
            return 1;
        }
        int every = s->a.log_every > 1 ? s->a.log_every : 1;
        if (in.stats && (step % every == 0 || step == s->a.steps)) { /* a GPU reads only these */
            double now = cli_now(), step_s = (now - t_prev) / (double)(step - logged);
            t_prev = now, logged = step;
            double elapsed = now - s->t0, tok_s = tokens / (elapsed > 0 ? elapsed : 1e-9);
            if (s->rank0) log_step(s, &in, tok_s, step_s);
        }
        if (step == s->first_step + 1 && step < s->a.steps) lm_ag_profile_reset(); /* steady state: skip warm-up */
        if (s->val && s->a.val_every > 0 && step % s->a.val_every == 0 && step < s->a.steps && validate(s, step)) return 1;
        char name[64];
        snprintf(name, sizeof name, "checkpoint-%06lld", (long long)step);
        if (s->a.save_every > 0 && step % s->a.save_every == 0 && step < s->a.steps && save(s, name)) return 1;
    }
    if (s->val && validate(s, s->a.steps)) return 1;
    if (s->rank0) report_end(s);
    return save(s, "final");
}

/* Threads per rank when --threads is not given: with several ranks on a host, the
 * CPUs the launcher left this rank (its binding) but at most an equal share of the
 * host's, so ranks that are not bound do not oversubscribe the cores. */
static int default_threads(const lm_dist *d) {
    int local = lm_dist_local_size(d);
    if (local <= 1) return 0; /* one per logical CPU (lm_ctx_create) */
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int share = online > 0 ? (int)(online / local) : 1, bound = lm_cpu_get_features()->logical_cpus;
    int n = bound < share ? bound : share;
    return n > 0 ? n : 1;
}

int cmd_train(int argc, char **argv) {
    session s;
    memset(&s, 0, sizeof s);
    lm_status st = lm_dist_create(&s.dist); /* MPI_Init under a launcher */
    if (st != LM_OK) return fail("cannot join the data-parallel run", st);
    s.rank0 = lm_dist_rank(s.dist) == 0;
    if (lm_dist_size(s.dist) > 1) snprintf(g_rank_tag, sizeof g_rank_tag, "rank %d: ", lm_dist_rank(s.dist));
    int rc = parse(argc, argv, &s.a);
    if (rc == 1) rc = 0; /* --help */
    else if (!rc) {
        if (!s.a.threads) s.a.threads = default_threads(s.dist);
        if (!s.rank0) s.a.trace = NULL; /* one trace file: rank 0's */
        cli_enable_logging(0);
        int traced = cli_trace_start("train", s.a.trace);
        rc = traced ? open_all(&s) : 1;
        if (!rc) {
            const lm_model_config *c = lm_train_model_config(s.model);
            char ranks[64] = "";
            if (lm_dist_size(s.dist) > 1) snprintf(ranks, sizeof ranks, "%d ranks x ", lm_dist_size(s.dist));
            if (s.rank0)
                note("%s, %lld parameters, %s compute on %s, %d steps of %s%d x %d x %d tokens, starting at step "
                     "%lld\n",
                     lm_arch_name(c->arch), (long long)lm_train_model_numel(s.model),
                     lm_dtype_name(lm_train_model_compute_dtype(s.model)), s.a.device, s.a.steps, ranks,
                     s.a.grad_accum, s.a.batch, s.a.seq, (long long)s.first_step);
            rc = report_optimizer_state(&s);
            if (!rc) rc = loop(&s);
        }
        close_all(&s);
        if (traced) rc = cli_trace_stop("train", rc);
    }
    if (rc && lm_dist_size(s.dist) > 1) {
        /* this rank cannot go on: end them all rather than leave them waiting in a collective */
        fflush(NULL);
        lm_dist_abort(s.dist, rc);
    }
    lm_dist_destroy(s.dist); /* MPI_Finalize */
    return rc;
}
