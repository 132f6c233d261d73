/* chat/template.c — the public chat template API: parse, load from a model directory,
 * render a conversation, limits; and the identifier table of a template.
 *
 * A render binds what transformers' apply_chat_template passes (messages, tools —
 * None when absent —, documents=None, add_generation_prompt, the bos/eos special
 * tokens, then the extra variables), runs the template into an arena-backed sink and
 * copies the text out with lm_malloc. Identifiers are interned in an open-addressing
 * hash table (O(1) per lookup), so parse time stays linear in the source.
 */
#include "chat/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const int64_t k_default_limits[LM__CHAT_NLIMITS] = {
    [LM_CHAT_LIMIT_STRING_BYTES] = 64ll << 20,
    [LM_CHAT_LIMIT_MEMORY_BYTES] = 512ll << 20,
    [LM_CHAT_LIMIT_LOOP_ITERATIONS] = 10000000,
    [LM_CHAT_LIMIT_CALL_DEPTH] = 64,
    [LM_CHAT_LIMIT_WORK] = 100000000,
};

lm_status lm__chat_syntax_error(lm_status s, int32_t line, int32_t col, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return lm__error(s, "chat template %d:%d: %s", line, col, msg);
}

/* ---- identifiers --------------------------------------------------------------------------- */
static uint32_t hash_name(const char *s, size_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static int32_t find_slot(const lm_chat_template *t, const char *name, size_t n, uint32_t *slot) {
    if (!t->hash_cap) return -1;
    uint32_t mask = (uint32_t)t->hash_cap - 1, i = hash_name(name, n) & mask;
    for (;; i = (i + 1) & mask) {
        int32_t id = t->name_hash[i] - 1;
        if (id < 0) {
            if (slot) *slot = i;
            return -1;
        }
        if (strlen(t->names[id]) == n && memcmp(t->names[id], name, n) == 0) return id;
    }
}

int32_t lm__chat_name_id(const lm_chat_template *t, const char *name, size_t n) { return find_slot(t, name, n, NULL); }

int32_t lm__chat_intern(lm_chat_template *t, const char *name, size_t n) {
    uint32_t slot = 0;
    int32_t id = find_slot(t, name, n, &slot);
    if (id >= 0) return id;
    if (t->nnames == INT32_MAX / 4) return -1;
    if (2 * (t->nnames + 1) > t->hash_cap) { /* keep the table at most half full */
        int32_t cap = t->hash_cap ? 2 * t->hash_cap : 64;
        int32_t *h = lm__chat_alloc(&t->arena, (size_t)cap * sizeof *h);
        if (!h) return -1;
        memset(h, 0, (size_t)cap * sizeof *h);
        for (int32_t k = 0; k < t->nnames; k++) {
            uint32_t i = hash_name(t->names[k], strlen(t->names[k])) & (uint32_t)(cap - 1);
            while (h[i]) i = (i + 1) & (uint32_t)(cap - 1);
            h[i] = k + 1;
        }
        t->name_hash = h, t->hash_cap = cap;
        find_slot(t, name, n, &slot);
    }
    if (t->nnames == t->cap_names) {
        int32_t cap = t->cap_names ? 2 * t->cap_names : 64;
        const char **names = lm__chat_grow(&t->arena, t->names, (size_t)t->cap_names * sizeof *names,
                                           (size_t)cap * sizeof *names);
        if (!names) return -1;
        t->names = names, t->cap_names = cap;
    }
    char *copy = lm__chat_alloc(&t->arena, n + 1);
    if (!copy) return -1;
    memcpy(copy, name, n);
    copy[n] = '\0';
    t->names[t->nnames] = copy;
    t->name_hash[slot] = t->nnames + 1;
    return t->nnames++;
}

/* ---- parse ------------------------------------------------------------------------------------ */
/* Offset of the first invalid UTF-8 byte in s, or -1 when s is valid (no overlongs, no
 * surrogates, nothing above U+10FFFF). */
static int64_t utf8_invalid_at(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned char b = p[i];
        size_t len;
        uint32_t cp, min;
        if (b < 0x80) {
            i++;
            continue;
        }
        if ((b & 0xE0) == 0xC0) len = 2, cp = b & 0x1F, min = 0x80;
        else if ((b & 0xF0) == 0xE0) len = 3, cp = b & 0x0F, min = 0x800;
        else if ((b & 0xF8) == 0xF0) len = 4, cp = b & 0x07, min = 0x10000;
        else return (int64_t)i;
        if (i + len > n) return (int64_t)i;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return (int64_t)i;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return (int64_t)i;
        i += len;
    }
    return -1;
}

static lm_status copy_token(lm_chat_template *t, const char *tok, const char *what, const char **out) {
    *out = NULL;
    if (!tok) return LM_OK;
    size_t n = strlen(tok);
    if (utf8_invalid_at(tok, n) >= 0) return lm__error(LM_INVALID_ARGUMENT, "chat template: %s is not valid UTF-8", what);
    char *p = lm__chat_alloc(&t->arena, n + 1);
    if (!p) return lm__error(LM_OUT_OF_MEMORY, "chat template: out of memory");
    memcpy(p, tok, n + 1);
    *out = p;
    return LM_OK;
}

/* Real chat templates are a few KiB to a few tens of KiB; the syntax tree costs up to
 * ~100 bytes per source byte, so the source is capped to keep parsing memory bounded. */
enum { MAX_SOURCE_BYTES = 1 << 20 };

static lm_status parse_into(lm_chat_template *t, const char *source, const char *bos, const char *eos) {
    size_t n = strlen(source);
    if (n > MAX_SOURCE_BYTES)
        return lm__error(LM_OUT_OF_RANGE, "chat template: the source has %zu bytes (at most %d)", n, MAX_SOURCE_BYTES);
    int64_t bad = utf8_invalid_at(source, n);
    if (bad >= 0)
        return lm__error(LM_INVALID_ARGUMENT, "chat template: the source is not valid UTF-8 (byte offset %lld)", (long long)bad);
    LM_TRY(copy_token(t, bos, "bos_token", &t->bos));
    LM_TRY(copy_token(t, eos, "eos_token", &t->eos));
    lm__ctok *toks;
    int32_t ntoks;
    LM_TRY(lm__chat_lex(t, source, n, &toks, &ntoks));
    LM_TRY(lm__chat_parse(t, toks, ntoks));
    t->global_of = lm__chat_alloc(&t->arena, (size_t)t->nnames + 1);
    if (!t->global_of) return lm__error(LM_OUT_OF_MEMORY, "chat template: out of memory");
    for (int32_t i = 0; i < t->nnames; i++) {
        t->global_of[i] = -1;
        for (int g = 0; g < CG_COUNT; g++)
            if (strcmp(t->names[i], lm__chat_global_names[g]) == 0) t->global_of[i] = (int8_t)g;
    }
    return LM_OK;
}

lm_status lm_chat_template_parse(const char *source, const char *bos_token, const char *eos_token,
                                 lm_chat_template **out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_chat_template_parse: out is NULL");
    *out = NULL;
    if (!source) return lm__error(LM_INVALID_ARGUMENT, "lm_chat_template_parse: source is NULL");
    lm_chat_template *t = lm__alloc(sizeof *t, 16);
    if (!t) return lm__error(LM_OUT_OF_MEMORY, "chat template: out of memory");
    memset(t, 0, sizeof *t);
    memcpy(t->limits, k_default_limits, sizeof t->limits);
    lm_status s = parse_into(t, source, bos_token, eos_token);
    if (s != LM_OK) {
        lm_chat_template_destroy(t);
        return s;
    }
    *out = t;
    return LM_OK;
}

void lm_chat_template_destroy(lm_chat_template *t) {
    if (!t) return;
    lm__chat_arena_free(&t->arena);
    lm__free(t);
}

lm_status lm_chat_template_set_limit(lm_chat_template *t, lm_chat_limit which, int64_t value) {
    if (!t) return lm__error(LM_INVALID_ARGUMENT, "lm_chat_template_set_limit: template is NULL");
    if ((int)which < 0 || (int)which >= LM__CHAT_NLIMITS)
        return lm__error(LM_INVALID_ARGUMENT, "lm_chat_template_set_limit: unknown limit %d", (int)which);
    if (value < 1 || (which == LM_CHAT_LIMIT_CALL_DEPTH && value > 100000))
        return lm__error(LM_INVALID_ARGUMENT, "lm_chat_template_set_limit: value %lld out of range", (long long)value);
    t->limits[which] = value;
    return LM_OK;
}

/* ---- load ----------------------------------------------------------------------------------------- */
static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = lm__alloc(a + b + 2, 1);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

/* A special token of tokenizer_config.json: a string or {"content": ...}; NULL if absent. */
static const char *special_token(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static lm_status load(const char *path, const char *name, lm_chat_template **out) {
    char *cfg_path = NULL, *jinja_path = NULL, *cfg_text = NULL, *jinja_text = NULL;
    json_t *cfg = NULL;
    lm_status s = LM_OK;
    if (is_dir(path)) { /* transformers: chat_template.jinja is "default", additional_chat_templates/<name>.jinja the others */
        char file[600];
        if (strcmp(name, "default") == 0) snprintf(file, sizeof file, "chat_template.jinja");
        else snprintf(file, sizeof file, "additional_chat_templates/%s.jinja", name);
        cfg_path = join_path(path, "tokenizer_config.json");
        jinja_path = join_path(path, file);
        if (!cfg_path || !jinja_path) {
            s = lm__error(LM_OUT_OF_MEMORY, "chat template: out of memory");
            goto done;
        }
        if (!is_file(jinja_path)) {
            lm__free(jinja_path);
            jinja_path = NULL;
        }
    } else {
        cfg_path = lm__strdup(path);
        if (!cfg_path) {
            s = lm__error(LM_OUT_OF_MEMORY, "chat template: out of memory");
            goto done;
        }
    }
    const char *source = NULL;
    if (!jinja_path || is_file(cfg_path)) {
        size_t size;
        s = lm_file_read_all(cfg_path, &cfg_text, &size);
        if (s != LM_OK) goto done;
        json_error_t err;
        cfg = json_loadb(cfg_text, size, JSON_DECODE_INT_AS_REAL, &err); /* model_max_length may exceed 64 bits */
        if (!json_is_object(cfg)) {
            s = lm__error(LM_PARSE_ERROR, "'%s' is not a JSON object: line %d, column %d: %s", cfg_path, err.line,
                          err.column, cfg ? "not an object" : err.text);
            goto done;
        }
    }
    if (jinja_path) {
        size_t size;
        s = lm_file_read_all(jinja_path, &jinja_text, &size);
        if (s != LM_OK) goto done;
        if (strlen(jinja_text) != size) {
            s = lm__error(LM_INVALID_ARGUMENT, "'%s' contains a NUL byte", jinja_path);
            goto done;
        }
        source = jinja_text;
    } else {
        json_t *ct = json_object_get(cfg, "chat_template");
        if (json_is_string(ct) && strcmp(name, "default") == 0) {
            source = json_string_value(ct);
        } else if (json_is_array(ct)) {
            size_t i;
            json_t *e;
            json_array_foreach(ct, i, e) {
                const char *n = json_string_value(json_object_get(e, "name"));
                json_t *tmpl = json_object_get(e, "template");
                if (n && strcmp(n, name) == 0 && json_is_string(tmpl)) source = json_string_value(tmpl);
            }
        }
        if (!source) {
            s = json_is_string(ct) || json_is_array(ct)
                    ? lm__error(LM_NOT_FOUND, "'%s': no chat template named '%s'", cfg_path, name)
                    : lm__error(LM_NOT_FOUND, "'%s' has no \"chat_template\" (and there is no chat_template.jinja beside it)",
                                cfg_path);
            goto done;
        }
    }
    s = lm_chat_template_parse(source, cfg ? special_token(cfg, "bos_token") : NULL,
                               cfg ? special_token(cfg, "eos_token") : NULL, out);
    if (s != LM_OK) s = lm__error_context(s, "'%s'", jinja_path ? jinja_path : cfg_path);
done:
    json_decref(cfg);
    lm_free(cfg_text);
    lm_free(jinja_text);
    lm__free(cfg_path);
    lm__free(jinja_path);
    return s;
}

lm_status lm_chat_template_load_named(const char *path, const char *name, lm_chat_template **out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_chat_template_load: out is NULL");
    *out = NULL;
    if (!path || !name) return lm__error(LM_INVALID_ARGUMENT, "lm_chat_template_load: path or name is NULL");
    if (!name[0] || name[0] == '.' || strchr(name, '/') || strlen(name) > 256)
        return lm__error(LM_INVALID_ARGUMENT, "lm_chat_template_load: '%s' is not a template name", name);
    return load(path, name, out);
}

lm_status lm_chat_template_load(const char *path, lm_chat_template **out) {
    return lm_chat_template_load_named(path, "default", out);
}

/* ---- render ----------------------------------------------------------------------------------------- */
static lm_status parse_json(const char *text, const char *what, json_t **out) {
    json_error_t err;
    *out = json_loads(text, JSON_DECODE_ANY, &err);
    if (!*out)
        return lm__error(LM_PARSE_ERROR, "chat template: %s is not valid JSON: line %d, column %d: %s", what, err.line,
                         err.column, err.text);
    return LM_OK;
}

static const char *json_kind(json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_NULL: return "null";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "a number";
    }
}

/* Binds name to v in the root scope when the template mentions name. */
static int bind_var(lm__crt *c, const char *name, lm__cv v) {
    int32_t id = lm__chat_name_id(c->t, name, strlen(name));
    return id < 0 ? 0 : lm__chat_scope_set(c, NULL, c->root, id, v);
}

static int bind_all(lm__crt *c, json_t *msgs, json_t *tools, json_t *extra, int agp) {
    lm__cv v;
    if (lm__cv_from_json(c, msgs, &v, 0) || bind_var(c, "messages", v)) return -1;
    if (tools && !json_is_null(tools)) {
        if (lm__cv_from_json(c, tools, &v, 0)) return -1;
    } else {
        v = lm__cv_none();
    }
    if (bind_var(c, "tools", v) || bind_var(c, "documents", lm__cv_none()) ||
        bind_var(c, "add_generation_prompt", lm__cv_bool(agp)))
        return -1;
    if (c->t->bos && bind_var(c, "bos_token", lm__cv_str(c->t->bos, strlen(c->t->bos)))) return -1;
    if (c->t->eos && bind_var(c, "eos_token", lm__cv_str(c->t->eos, strlen(c->t->eos)))) return -1;
    if (extra) {
        const char *key;
        json_t *val;
        json_object_foreach(extra, key, val) {
            if (lm__cv_from_json(c, val, &v, 0) || bind_var(c, key, v)) return -1;
        }
    }
    return 0;
}

static lm_status check_inputs(json_t *msgs, json_t *tools, json_t *extra) {
    if (!json_is_array(msgs))
        return lm__error(LM_INVALID_ARGUMENT, "chat template: messages must be a JSON array of messages, not %s", json_kind(msgs));
    if (json_array_size(msgs) == 0)
        return lm__error(LM_INVALID_ARGUMENT, "chat template: messages is empty (transformers refuses an empty conversation)");
    if (tools && !json_is_array(tools) && !json_is_null(tools))
        return lm__error(LM_INVALID_ARGUMENT, "chat template: tools must be a JSON array, not %s", json_kind(tools));
    if (extra) {
        if (!json_is_object(extra))
            return lm__error(LM_INVALID_ARGUMENT, "chat template: extra variables must be a JSON object, not %s", json_kind(extra));
        static const char *const reserved[] = {"messages", "tools", "documents", "add_generation_prompt", NULL};
        for (int i = 0; reserved[i]; i++)
            if (json_object_get(extra, reserved[i]))
                return lm__error(LM_INVALID_ARGUMENT,
                                 "chat template: extra variable '%s' is a render argument of its own (transformers: got "
                                 "multiple values for it)", reserved[i]);
    }
    return LM_OK;
}

lm_status lm_chat_template_render(const lm_chat_template *t, const char *messages_json, const char *tools_json,
                                  int add_generation_prompt, const char *extra_json, char **out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_chat_template_render: out is NULL");
    *out = NULL;
    if (!t || !messages_json) return lm__error(LM_INVALID_ARGUMENT, "lm_chat_template_render: template or messages is NULL");
    json_t *msgs = NULL, *tools = NULL, *extra = NULL;
    lm_status s = parse_json(messages_json, "messages", &msgs);
    if (s == LM_OK && tools_json) s = parse_json(tools_json, "tools", &tools);
    if (s == LM_OK && extra_json) s = parse_json(extra_json, "extra variables", &extra);
    if (s == LM_OK) s = check_inputs(msgs, tools, extra);
    if (s != LM_OK) {
        json_decref(msgs);
        json_decref(tools);
        json_decref(extra);
        return s;
    }
    lm__crt c;
    memset(&c, 0, sizeof c);
    c.t = t;
    c.status = LM_OK;
    c.arena.limit = (size_t)t->limits[LM_CHAT_LIMIT_MEMORY_BYTES];
    c.max_str = t->limits[LM_CHAT_LIMIT_STRING_BYTES];
    c.max_iter = t->limits[LM_CHAT_LIMIT_LOOP_ITERATIONS];
    c.max_calls = (int)t->limits[LM_CHAT_LIMIT_CALL_DEPTH];
    c.max_work = t->limits[LM_CHAT_LIMIT_WORK];
    lm__csink sink = {0};
    c.out = &sink;
    c.root = lm__crt_alloc(&c, NULL, sizeof *c.root);
    if (c.root) {
        memset(c.root, 0, sizeof *c.root);
        c.scope = c.root;
        if (bind_all(&c, msgs, tools, extra, add_generation_prompt) == 0) lm__chat_exec(&c, t->body, t->n, c.root);
    }
    if (c.status == LM_OK) {
        char *text = lm_malloc(sink.n + 1);
        if (!text) {
            s = lm__error(LM_OUT_OF_MEMORY, "chat template: out of memory for the %zu-byte output", sink.n);
        } else {
            if (sink.n) memcpy(text, sink.p, sink.n);
            text[sink.n] = '\0';
            *out = text;
        }
    } else if (c.line > 0) {
        s = lm__error(c.status, "chat template %d:%d: %s", c.line, c.col, c.msg);
    } else {
        s = lm__error(c.status, "chat template: %s", c.msg);
    }
    lm__chat_arena_free(&c.arena);
    json_decref(msgs);
    json_decref(tools);
    json_decref(extra);
    return s;
}
