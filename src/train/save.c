/* train/save.c — writing a training model as a Hugging Face directory: the f32 master
 * weights as model.safetensors (Hugging Face names; a tied model stores no
 * lm_head.weight), config.json as loaded with torch_dtype (and dtype, when present)
 * set to float32 so readers keep the precision, and the assets beside the source
 * model (generation_config.json, tokenizer.json, tokenizer_config.json) copied.
 * Every file is replaced atomically.
 */
#include "train/internal.h"

#include "loom/io_write.h"

#include <jansson.h>
#include <stdio.h>
#include <sys/stat.h>

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static lm_status copy_file(const char *from, const char *to) {
    char *data = NULL;
    size_t n = 0;
    LM_TRY(lm_file_read_all(from, &data, &n));
    lm_status st = lm_file_write_atomic(to, data, n);
    lm_free(data);
    return st;
}

/* The source config with its dtype keys set to float32, pretty-printed in key order. */
static lm_status write_config(const lm_train_model *m, const char *path) {
    json_error_t err;
    json_t *root = json_loadb(m->config_json, m->config_len, 0, &err);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return lm__error(LM_PARSE_ERROR, "saving config.json: the source config no longer parses (%s)", err.text);
    }
    int ok = json_object_set_new(root, "torch_dtype", json_string("float32")) == 0;
    if (ok && json_object_get(root, "dtype")) ok = json_object_set_new(root, "dtype", json_string("float32")) == 0;
    size_t flags = JSON_INDENT(2) | JSON_PRESERVE_ORDER, len = ok ? json_dumpb(root, NULL, 0, flags) : 0;
    char *text = len ? lm__alloc(len + 1, 1) : NULL;
    lm_status st = text ? LM_OK : LM_OUT_OF_MEMORY;
    if (st == LM_OK) {
        json_dumpb(root, text, len, flags);
        text[len] = '\n';
        st = lm_file_write_atomic(path, text, len + 1);
    }
    lm__free(text);
    json_decref(root);
    return st;
}

static lm_status write_weights(const lm_train_model *m, lm_ctx *ctx, const char *path) {
    const char **names = lm__calloc((size_t)m->nparams, sizeof *names);
    lm_tensor_view *views = lm__calloc((size_t)m->nparams, sizeof *views);
    lm_status st = names && views ? LM_OK : LM_OUT_OF_MEMORY;
    for (int i = 0; st == LM_OK && i < m->nparams; i++) {
        names[i] = m->params[i].name;
        views[i] = *lm_tensor_as_view(m->params[i].value);
    }
    static const char *const meta[] = {"format", "pt", NULL};
    if (st == LM_OK) st = lm_safetensors_write(ctx, path, m->nparams, names, views, meta);
    lm__free(names);
    lm__free(views);
    return st;
}

lm_status lm_train_model_save(const lm_train_model *m, lm_ctx *ctx, const char *dir, const char *tokenizer_path) {
    if (!m || !ctx || !dir) return lm__error(LM_INVALID_ARGUMENT, "lm_train_model_save: NULL argument");
    char path[4096], src[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    LM_TRY(write_weights(m, ctx, path));
    snprintf(path, sizeof path, "%s/config.json", dir);
    LM_TRY(write_config(m, path));
    static const char *const assets[] = {"generation_config.json", "tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof assets / sizeof assets[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, assets[i]);
        if (i == 1 && tokenizer_path) {
            LM_TRY(copy_file(tokenizer_path, path));
            continue;
        }
        if (!m->source_dir) continue;
        snprintf(src, sizeof src, "%s/%s", m->source_dir, assets[i]);
        if (is_file(src)) LM_TRY(copy_file(src, path));
    }
    return LM_OK;
}
