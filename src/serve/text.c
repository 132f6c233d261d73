/* serve/text.c — the tokenizer, chat template and BOS rule of a model directory. */
#include "serve/http.h"

#include <jansson.h>
#include <string.h>
#include <sys/stat.h>

static lm_status join(const char *dir, const char *name, char *out, size_t cap) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return lm__error(LM_INVALID_ARGUMENT, "server: the path %s/%s is too long", dir, name);
    return LM_OK;
}

/* The first special token of a TemplateProcessing post-processor's "single" template. */
static const char *template_bos(json_t *pp) {
    if (!json_is_object(pp)) return NULL;
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (type && !strcmp(type, "Sequence")) {
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(pp, "processors"), i, p) {
            const char *b = template_bos(p);
            if (b) return b;
        }
        return NULL;
    }
    if (!type || strcmp(type, "TemplateProcessing") != 0) return NULL;
    json_t *first = json_array_get(json_object_get(pp, "single"), 0);
    json_t *sp = json_object_get(first, "SpecialToken");
    return sp ? json_string_value(json_object_get(sp, "id")) : NULL;
}

static lm_status detect_bos(const char *path, const lm_tokenizer *tok, int32_t *bos) {
    json_error_t err;
    char *text = NULL;
    size_t len = 0;
    LM_TRY(lm_file_read_all(path, &text, &len)); /* regular files only */
    json_t *root = json_loadb(text, len, 0, &err);
    lm_free(text);
    if (!root) return lm__error(LM_PARSE_ERROR, "server: %s: %s", path, err.text);
    const char *b = template_bos(json_object_get(root, "post_processor"));
    lm_status st = LM_OK;
    if (b && lm_tokenizer_token_to_id(tok, b, strlen(b), bos) != LM_OK)
        st = lm__error(LM_PARSE_ERROR, "server: %s: the post-processor's token '%s' is not in the vocabulary", path, b);
    json_decref(root);
    return st;
}

lm_status lm__serve_load_text(const char *model_dir, const lm_model *m, int prepend_bos, lm_tokenizer **tok,
                              lm_chat_template **chat, char **chat_error, int32_t *bos) {
    char path[4096];
    *tok = NULL, *chat = NULL, *chat_error = NULL, *bos = -1;
    LM_TRY(join(model_dir, "tokenizer.json", path, sizeof path));
    lm_status st = lm_tokenizer_load(path, tok);
    if (st != LM_OK) return lm__error_context(st, "server: the model's tokenizer %s", path);
    if (prepend_bos == 1) {
        int64_t id = lm_model_get_config(m)->bos_token_id;
        if (id < 0) return lm__error(LM_INVALID_ARGUMENT, "server: a BOS token was asked for but config.json has no bos_token_id");
        *bos = (int32_t)id;
    } else if (prepend_bos < 0) {
        LM_TRY(detect_bos(path, *tok, bos));
    }
    char jinja[4096];
    LM_TRY(join(model_dir, "tokenizer_config.json", path, sizeof path));
    LM_TRY(join(model_dir, "chat_template.jinja", jinja, sizeof jinja));
    struct stat sb;
    if (stat(path, &sb) != 0 && stat(jinja, &sb) != 0) {
        *chat_error = lm__strdup("this model has no chat template (no tokenizer_config.json or chat_template.jinja); "
                                 "use /v1/completions");
        return *chat_error ? LM_OK : LM_OUT_OF_MEMORY;
    }
    st = lm_chat_template_load(model_dir, chat); /* chat_template.jinja wins over tokenizer_config.json */
    if (st == LM_NOT_FOUND) {
        lm_clear_error();
        *chat_error = lm__strdup("this model has no chat template (tokenizer_config.json has no chat_template); use /v1/completions");
        return *chat_error ? LM_OK : LM_OUT_OF_MEMORY;
    }
    return st == LM_OK ? LM_OK : lm__error_context(st, "server: the chat template of %s", model_dir);
}
