/* train/trainer.c — the training loop: one optimizer step = zeroed gradients, then
 * grad_accum micro-batches of forward + backward (each scaled by 1 / grad_accum, so
 * the update follows the mean loss), global-norm clipping folded into the AdamW pass,
 * and the scheduled learning rate. Also evaluation, and checkpoints (weights +
 * train_state.bin) assembled in a temporary directory and renamed into place.
 * Everything the next step depends on (weights, moments, step, data position) is in
 * a checkpoint, so a resumed run replays the same steps bit for bit.
 */
#include "train/internal.h"

#include "loom/io_write.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct lm_trainer {
    lm_train_model *model;
    lm_data_loader *data;
    lm_train_options o;
    lm_optimizer *opt;
    int32_t *ids, *targets; /* [batch * seq] host micro-batch */
};

void lm_train_options_default(lm_train_options *o) {
    *o = (lm_train_options){100, 8, 256, 1, LM_LR_COSINE, 3e-4, 3e-5, 10, 1.0, {0.9, 0.95, 1e-8, 0.1}};
}

static lm_status check_options(const lm_train_options *o, const lm_train_model *m, const lm_data_loader *d) {
    if (o->steps < 1 || o->batch < 1 || o->seq < 1 || o->grad_accum < 1 || o->warmup < 0)
        return lm__error(LM_INVALID_ARGUMENT, "training options: steps %lld, batch %d, seq %lld, grad_accum %d and warmup "
                                              "%lld must be positive (warmup may be 0)",
                         (long long)o->steps, o->batch, (long long)o->seq, o->grad_accum, (long long)o->warmup);
    if (!(o->lr >= 0 && o->min_lr >= 0 && o->min_lr <= o->lr))
        return lm__error(LM_INVALID_ARGUMENT, "training options: need 0 <= min_lr (%g) <= lr (%g)", o->min_lr, o->lr);
    if (o->seq > m->cfg.max_position_embeddings)
        return lm__error(LM_INVALID_ARGUMENT, "training options: seq %lld exceeds max_position_embeddings %lld",
                         (long long)o->seq, (long long)m->cfg.max_position_embeddings);
    if (lm_data_loader_vocab(d) > m->cfg.vocab_size)
        return lm__error(LM_INVALID_ARGUMENT, "training data use a vocabulary of %lld ids but the model has %lld",
                         (long long)lm_data_loader_vocab(d), (long long)m->cfg.vocab_size);
    return LM_OK;
}

lm_status lm_trainer_create(lm_train_model *model, lm_data_loader *data, const lm_train_options *o, lm_trainer **out) {
    if (!model || !data || !o || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_trainer_create: NULL argument");
    *out = NULL;
    LM_TRY(check_options(o, model, data));
    lm_trainer *t = lm__calloc(1, sizeof *t);
    if (!t) return LM_OUT_OF_MEMORY;
    t->model = model, t->data = data, t->o = *o;
    size_t n = (size_t)o->batch * (size_t)o->seq;
    t->ids = lm__calloc(n, sizeof *t->ids);
    t->targets = lm__calloc(n, sizeof *t->targets);
    lm_status st = t->ids && t->targets ? lm_optimizer_create(model, &o->adamw, &t->opt) : LM_OUT_OF_MEMORY;
    if (st != LM_OK) {
        lm_trainer_destroy(t);
        return st;
    }
    *out = t;
    return LM_OK;
}

void lm_trainer_destroy(lm_trainer *t) {
    if (!t) return;
    lm_optimizer_destroy(t->opt);
    lm__free(t->ids);
    lm__free(t->targets);
    lm__free(t);
}

int64_t lm_trainer_step_count(const lm_trainer *t) { return lm_optimizer_steps(t->opt); }

lm_status lm_trainer_step(lm_trainer *t, lm_ctx *ctx, lm_train_step_info *info) {
    if (!t || !ctx || !info) return lm__error(LM_INVALID_ARGUMENT, "lm_trainer_step: NULL argument");
    const lm_train_options *o = &t->o;
    lm_ag_profile_mark(ctx, "step ", "(between steps)");
    LM_TRY(lm_train_model_zero_grad(t->model, ctx));
    lm_ag_profile_mark(ctx, "step ", "zero_grad");
    double loss = 0, norm = 0;
    for (int a = 0; a < o->grad_accum; a++) {
        float l = 0;
        LM_TRY(lm_data_loader_next(t->data, o->batch, t->ids, t->targets));
        lm_ag_profile_mark(ctx, "step ", "data");
        LM_TRY(lm_train_model_forward_backward(t->model, ctx, t->ids, t->targets, o->batch, o->seq,
                                               1.0f / (float)o->grad_accum, &l));
        loss += l;
    }
    LM_TRY(lm_train_model_grad_norm(t->model, ctx, &norm));
    lm_ag_profile_mark(ctx, "step ", "grad_norm");
    /* torch.nn.utils.clip_grad_norm_: coefficient max / (norm + 1e-6), at most 1 */
    double scale = o->clip > 0 && isfinite(norm) ? LM_MIN(1.0, o->clip / (norm + 1e-6)) : 1.0;
    int64_t step = lm_optimizer_steps(t->opt);
    lm_lr_schedule s = {o->schedule, o->lr, o->min_lr, o->warmup, o->steps};
    double lr = lm_lr_at(&s, step);
    LM_TRY(lm_optimizer_step(t->opt, ctx, lr, scale));
    lm_ag_profile_mark(ctx, "step ", "adamw");
    *info = (lm_train_step_info){step + 1, loss / o->grad_accum, lr, norm,
                                 (int64_t)o->grad_accum * o->batch * o->seq};
    return LM_OK;
}

lm_status lm_trainer_evaluate(lm_trainer *t, lm_ctx *ctx, lm_data_loader *val, int64_t batches, double *loss) {
    if (!t || !ctx || !val || batches < 1 || !loss) return lm__error(LM_INVALID_ARGUMENT, "lm_trainer_evaluate: bad arguments");
    lm_data_loader_rewind(val);
    double sum = 0;
    for (int64_t b = 0; b < batches; b++) {
        float l = 0;
        LM_TRY(lm_data_loader_next(val, t->o.batch, t->ids, t->targets));
        LM_TRY(lm_train_model_loss(t->model, ctx, t->ids, t->targets, t->o.batch, t->o.seq, &l));
        sum += l;
    }
    *loss = sum / (double)batches;
    return LM_OK;
}

/* ---- checkpoints --------------------------------------------------------------------------- */
static lm_status sys_fail(const char *what, const char *path) {
    return lm__error(LM_IO_ERROR, "%s '%s': %s", what, path, strerror(errno));
}

/* Removes the regular files of dir, then dir itself (a checkpoint has no subfolders). */
static lm_status remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? LM_OK : sys_fail("cannot open directory", dir);
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0) {
            closedir(d);
            return sys_fail("cannot remove", path);
        }
    }
    closedir(d);
    return rmdir(dir) == 0 ? LM_OK : sys_fail("cannot remove directory", dir);
}

static lm_status write_state(lm_trainer *t, lm_ctx *ctx, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/train_state.bin", dir);
    lm__train_state s = {lm_optimizer_steps(t->opt), t->model->numel, t->model->nparams, t->o.batch, t->o.seq,
                         t->o.grad_accum, lm_data_loader_get_state(t->data)};
    return lm__train_state_write(ctx, path, &s, t->opt->m1, t->opt->m2);
}

/* The parent directory of dir, for the fsync after the rename. */
static void parent_of(const char *dir, char *buf, size_t size) {
    const char *slash = strrchr(dir, '/');
    if (!slash) snprintf(buf, size, ".");
    else if (slash == dir) snprintf(buf, size, "/");
    else snprintf(buf, size, "%.*s", (int)(slash - dir), dir);
}

lm_status lm_trainer_save(lm_trainer *t, lm_ctx *ctx, const char *dir, const char *tokenizer_path) {
    if (!t || !ctx || !dir) return lm__error(LM_INVALID_ARGUMENT, "lm_trainer_save: NULL argument");
    char tmp[4096], old[4096], parent[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", dir, (long)getpid());
    snprintf(old, sizeof old, "%s.old-%ld", dir, (long)getpid());
    LM_TRY(remove_dir(tmp)); /* a leftover of an interrupted save by this process id */
    if (mkdir(tmp, 0755) != 0) return sys_fail("cannot create directory", tmp);
    lm_status st = lm_train_model_save(t->model, ctx, tmp, tokenizer_path);
    if (st == LM_OK) st = write_state(t, ctx, tmp);
    if (st == LM_OK) st = lm_dir_sync(tmp);
    struct stat sb;
    int had = stat(dir, &sb) == 0;
    if (st == LM_OK && had && rename(dir, old) != 0) st = sys_fail("cannot move the previous checkpoint aside", dir);
    if (st == LM_OK && rename(tmp, dir) != 0) {
        st = sys_fail("cannot rename the checkpoint into place", dir);
        if (had) rename(old, dir);
    }
    if (st != LM_OK) {
        remove_dir(tmp);
        return st;
    }
    parent_of(dir, parent, sizeof parent);
    st = lm_dir_sync(parent);
    return st == LM_OK && had ? remove_dir(old) : st;
}

lm_status lm_trainer_resume(lm_trainer *t, lm_ctx *ctx, const char *dir) {
    if (!t || !ctx || !dir) return lm__error(LM_INVALID_ARGUMENT, "lm_trainer_resume: NULL argument");
    char path[4096];
    snprintf(path, sizeof path, "%s/train_state.bin", dir);
    lm_tensor *m1 = NULL, *m2 = NULL;
    lm__train_state s;
    const lm_train_model *m = t->model;
    lm_status st = lm_tensor_create(m->device, LM_F32, 1, &m->numel, &m1);
    if (st == LM_OK) st = lm_tensor_create(m->device, LM_F32, 1, &m->numel, &m2);
    if (st == LM_OK) st = lm__train_state_read(path, m->numel, m->nparams, &s, m1, m2);
    if (st == LM_OK && (s.batch != t->o.batch || s.seq != t->o.seq || s.grad_accum != t->o.grad_accum))
        st = lm__error(LM_INVALID_ARGUMENT, "training state '%s' was saved with batch %lld, seq %lld, grad_accum %lld; "
                                            "resuming with %d, %lld, %d would not replay the same batches",
                       path, (long long)s.batch, (long long)s.seq, (long long)s.grad_accum, t->o.batch, (long long)t->o.seq,
                       t->o.grad_accum);
    if (st == LM_OK && s.data.cursor > lm_data_loader_windows(t->data))
        st = lm__error(LM_OUT_OF_RANGE, "training state '%s': data position %lld is beyond the %lld windows of this data "
                                        "set (was it saved for other data?)",
                       path, (long long)s.data.cursor, (long long)lm_data_loader_windows(t->data));
    if (st == LM_OK) { /* commit: copy the moments in, then the data position (cannot fail now) */
        lm_tensor *keep1 = t->opt->m1, *keep2 = t->opt->m2;
        size_t n = (size_t)m->numel * sizeof(float);
        st = lm_device_copy(m->device, lm_tensor_data(keep1), m->device, lm_tensor_data(m1), n);
        if (st == LM_OK) st = lm_device_copy(m->device, lm_tensor_data(keep2), m->device, lm_tensor_data(m2), n);
        if (st == LM_OK) st = lm_data_loader_set_state(t->data, &s.data);
        if (st == LM_OK) t->opt->steps = s.step;
    }
    lm_tensor_destroy(m1);
    lm_tensor_destroy(m2);
    return st;
}
