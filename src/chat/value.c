/* chat/value.c — Python's semantics for template values: truthiness, str() and repr(),
 * ==, ordering, `in`, iteration, len() and json.dumps, plus the conversion of JSON
 * input into values.
 *
 * What is printed matches CPython byte for byte: str of a float is its shortest
 * repr ("1.0", "1e+16"), containers print as their repr (['a', "it's"], {'k': 1},
 * (1,)), strings in a repr choose their quotes and escapes as CPython does. Errors
 * carry CPython's wording ("'<' not supported between instances of 'str' and 'int'").
 * json.dumps is transformers' tojson: ensure_ascii off by default, key order kept,
 * ", " / ": " separators (or "," with an indent). Recursion over nested values is
 * bounded by MAX_NEST (CPython raises RecursionError around the same depth).
 */
#include "chat/internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { MAX_NEST = 1000 };

int lm__cv_truthy(const lm__cv *v) {
    switch (v->kind) {
    case CV_UNDEF:
    case CV_NONE: return 0;
    case CV_BOOL: return v->u.b;
    case CV_INT: return v->u.i != 0;
    case CV_FLOAT: return v->u.f != 0;
    case CV_STR: return v->u.s.n > 0;
    case CV_LIST: return v->u.l->kind == CL_GEN || v->u.l->n > 0;
    case CV_DICT: return v->u.d->n > 0;
    case CV_RANGE: return v->u.r->n > 0;
    default: return 1;
    }
}

static const char *list_type_name(const lm__cv_list *l) {
    switch (l->kind) {
    case CL_TUPLE: return "tuple";
    case CL_ITEMS: return "dict_items";
    case CL_KEYS: return "dict_keys";
    case CL_VALUES: return "dict_values";
    case CL_GEN: return l->gen_name ? l->gen_name : "generator";
    default: return "list";
    }
}

const char *lm__cv_type_name(const lm__cv *v) {
    switch (v->kind) {
    case CV_UNDEF: return "Undefined";
    case CV_NONE: return "NoneType";
    case CV_BOOL: return "bool";
    case CV_INT: return "int";
    case CV_FLOAT: return "float";
    case CV_STR: return "str";
    case CV_LIST: return list_type_name(v->u.l);
    case CV_DICT: return "dict";
    case CV_NS: return "Namespace";
    case CV_RANGE: return "range";
    case CV_LOOP: return "LoopContext";
    case CV_FUNC:
        switch (v->u.fn->kind) {
        case CF_METHOD: return "builtin_function_or_method";
        case CF_MACRO:
        case CF_CALLER: return "Macro";
        default:
            return v->u.fn->id == CG_RAISE_EXCEPTION || v->u.fn->id == CG_STRFTIME_NOW || v->u.fn->id == CG_LIPSUM
                       ? "function"
                       : "type";
        }
    default: return "object";
    }
}

const char *lm__cv_object_repr(const lm__cv *v) {
    switch (v->kind) {
    case CV_NONE: return "None";
    case CV_UNDEF: return "jinja2.runtime.Undefined object";
    case CV_BOOL: return "bool object";
    case CV_INT: return "int object";
    case CV_FLOAT: return "float object";
    case CV_STR: return "str object";
    case CV_DICT: return "dict object";
    case CV_NS: return "jinja2.utils.Namespace object";
    case CV_RANGE: return "range object";
    case CV_LOOP: return "jinja2.runtime.LoopContext object";
    case CV_FUNC: return v->u.fn->kind == CF_MACRO || v->u.fn->kind == CF_CALLER ? "jinja2.runtime.Macro object"
                                                                                  : "builtin_function_or_method object";
    case CV_LIST:
        switch (v->u.l->kind) {
        case CL_TUPLE: return "tuple object";
        case CL_ITEMS: return "dict_items object";
        case CL_KEYS: return "dict_keys object";
        case CL_VALUES: return "dict_values object";
        case CL_GEN: return "generator object";
        default: return "list object";
        }
    default: return "object";
    }
}

/* ---- str() and repr() ---------------------------------------------------------------------- */
static int put(lm__crt *c, const lm__cnode *at, lm__csink *s, const char *p) {
    return lm__csink_put(c, at, s, p, strlen(p));
}

static int write_repr(lm__crt *c, const lm__cnode *at, const lm__cv *v, lm__csink *s, int depth);

static int write_str_repr(lm__crt *c, const lm__cnode *at, const char *p, size_t n, lm__csink *s) {
    int has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    if (lm__csink_putc(c, at, s, q)) return -1;
    size_t run = 0; /* bytes copied verbatim, flushed lazily */
    for (size_t i = 0; i < n;) {
        size_t len;
        uint32_t cp = lm__cutf8_get(p + i, &len);
        char esc[16];
        esc[0] = '\0';
        if (cp == (uint32_t)q || cp == '\\') snprintf(esc, sizeof esc, "\\%c", (char)cp);
        else if (cp == '\t') snprintf(esc, sizeof esc, "\\t");
        else if (cp == '\n') snprintf(esc, sizeof esc, "\\n");
        else if (cp == '\r') snprintf(esc, sizeof esc, "\\r");
        else if (!lm__cuni_printable(cp))
            snprintf(esc, sizeof esc, cp <= 0xFF ? "\\x%02x" : cp <= 0xFFFF ? "\\u%04x" : "\\U%08x", (unsigned)cp);
        if (esc[0]) {
            if (lm__csink_put(c, at, s, p + i - run, run) || put(c, at, s, esc)) return -1;
            run = 0;
        } else {
            run += len;
        }
        i += len;
    }
    if (lm__csink_put(c, at, s, p + n - run, run)) return -1;
    return lm__csink_putc(c, at, s, q);
}

static int nest_fail(lm__crt *c, const lm__cnode *at) {
    return lm__crt_fail(c, at, LM_OUT_OF_RANGE, "a value is nested more than %d deep", MAX_NEST);
}

static int write_seq(lm__crt *c, const lm__cnode *at, const lm__cv *v, int64_t n, const char *open, const char *close,
                     int tuple, lm__csink *s, int depth) {
    if (put(c, at, s, open)) return -1;
    for (int64_t i = 0; i < n; i++) {
        if (i && put(c, at, s, ", ")) return -1;
        if (write_repr(c, at, &v[i], s, depth + 1)) return -1;
    }
    if (tuple && n == 1 && lm__csink_putc(c, at, s, ',')) return -1;
    return put(c, at, s, close);
}

static int write_dict(lm__crt *c, const lm__cnode *at, const lm__cv_dict *d, lm__csink *s, int depth) {
    if (lm__csink_putc(c, at, s, '{')) return -1;
    for (int64_t i = 0; i < d->n; i++) {
        if (i && put(c, at, s, ", ")) return -1;
        if (write_repr(c, at, &d->k[i], s, depth + 1) || put(c, at, s, ": ") ||
            write_repr(c, at, &d->v[i], s, depth + 1))
            return -1;
    }
    return lm__csink_putc(c, at, s, '}');
}

static int write_func(lm__crt *c, const lm__cnode *at, const lm__cv_func *f, lm__csink *s) {
    char buf[160];
    switch (f->kind) {
    case CF_MACRO: {
        const lm__cv *name = &f->node->k;
        snprintf(buf, sizeof buf, "<Macro '%.*s'>", (int)LM_MIN(name->u.s.n, 100), name->u.s.p);
        break;
    }
    case CF_CALLER: snprintf(buf, sizeof buf, "<Macro 'caller'>"); break;
    case CF_METHOD:
        snprintf(buf, sizeof buf, "<built-in method %s of %s object>", lm__chat_method_name(f->id),
                 lm__cv_type_name(&f->self));
        break;
    default:
        switch (f->id) {
        case CG_RANGE: snprintf(buf, sizeof buf, "<class 'range'>"); break;
        case CG_DICT: snprintf(buf, sizeof buf, "<class 'dict'>"); break;
        case CG_NAMESPACE: snprintf(buf, sizeof buf, "<class 'jinja2.utils.Namespace'>"); break;
        case CG_CYCLER: snprintf(buf, sizeof buf, "<class 'jinja2.utils.Cycler'>"); break;
        case CG_JOINER: snprintf(buf, sizeof buf, "<class 'jinja2.utils.Joiner'>"); break;
        default: snprintf(buf, sizeof buf, "<function %s>", lm__chat_global_names[f->id]); break;
        }
    }
    return put(c, at, s, buf);
}

static int write_repr(lm__crt *c, const lm__cnode *at, const lm__cv *v, lm__csink *s, int depth) {
    if (depth > MAX_NEST) return nest_fail(c, at);
    char buf[64];
    switch (v->kind) {
    case CV_UNDEF: return put(c, at, s, "Undefined");
    case CV_STR: return write_str_repr(c, at, v->u.s.p, v->u.s.n, s);
    case CV_LIST: {
        const lm__cv_list *l = v->u.l;
        switch (l->kind) {
        case CL_TUPLE: return write_seq(c, at, l->v, l->n, "(", ")", 1, s, depth);
        case CL_ITEMS: return write_seq(c, at, l->v, l->n, "dict_items([", "])", 0, s, depth);
        case CL_KEYS: return write_seq(c, at, l->v, l->n, "dict_keys([", "])", 0, s, depth);
        case CL_VALUES: return write_seq(c, at, l->v, l->n, "dict_values([", "])", 0, s, depth);
        case CL_GEN:
            snprintf(buf, sizeof buf, "<%s object>", list_type_name(l));
            return put(c, at, s, buf);
        default: return write_seq(c, at, l->v, l->n, "[", "]", 0, s, depth);
        }
    }
    case CV_DICT: return write_dict(c, at, v->u.d, s, depth);
    case CV_NS:
        if (put(c, at, s, "<Namespace ") || write_dict(c, at, v->u.d, s, depth)) return -1;
        return lm__csink_putc(c, at, s, '>');
    case CV_RANGE: {
        const lm__cv_range *r = v->u.r;
        if (r->step == 1) snprintf(buf, sizeof buf, "range(%lld, %lld)", (long long)r->start, (long long)r->stop);
        else snprintf(buf, sizeof buf, "range(%lld, %lld, %lld)", (long long)r->start, (long long)r->stop, (long long)r->step);
        return put(c, at, s, buf);
    }
    case CV_LOOP:
        snprintf(buf, sizeof buf, "<LoopContext %lld/%lld>", (long long)v->u.loop->i + 1, (long long)v->u.loop->n);
        return put(c, at, s, buf);
    case CV_FUNC: return write_func(c, at, v->u.fn, s);
    default: return lm__cv_write_str(c, at, v, s);
    }
}

int lm__cv_write_repr(lm__crt *c, const lm__cnode *at, const lm__cv *v, lm__csink *s) {
    return write_repr(c, at, v, s, 0);
}

int lm__cv_write_str(lm__crt *c, const lm__cnode *at, const lm__cv *v, lm__csink *s) {
    char buf[40];
    switch (v->kind) {
    case CV_UNDEF: return 0;
    case CV_NONE: return put(c, at, s, "None");
    case CV_BOOL: return put(c, at, s, v->u.b ? "True" : "False");
    case CV_INT:
        snprintf(buf, sizeof buf, "%lld", (long long)v->u.i);
        return put(c, at, s, buf);
    case CV_FLOAT:
        lm__cfloat_repr(v->u.f, buf);
        return put(c, at, s, buf);
    case CV_STR: return lm__csink_put(c, at, s, v->u.s.p, v->u.s.n);
    default: return write_repr(c, at, v, s, 0);
    }
}

int lm__cv_to_str(lm__crt *c, const lm__cnode *at, const lm__cv *v, lm__cv *out) {
    if (v->kind == CV_STR) {
        *out = *v;
        return 0;
    }
    if (v->kind == CV_UNDEF) {
        *out = lm__cv_str("", 0);
        return 0;
    }
    lm__csink s = {0};
    if (lm__cv_write_str(c, at, v, &s)) return -1;
    *out = lm__csink_value(&s);
    return 0;
}

/* ---- equality and ordering ---------------------------------------------------------------------- */
static int is_num(const lm__cv *v) { return v->kind == CV_BOOL || v->kind == CV_INT || v->kind == CV_FLOAT; }
static int64_t as_int(const lm__cv *v) { return v->kind == CV_BOOL ? v->u.b : v->u.i; }

/* Exact comparison of an int and a double: -1, 0, 1, or 2 when f is NaN. */
static int cmp_int_float(int64_t i, double f) {
    if (isnan(f)) return 2;
    if (f >= 9223372036854775808.0) return -1;
    if (f < -9223372036854775808.0) return 1;
    double t = trunc(f);
    int64_t fi = (int64_t)t;
    if (i != fi) return i < fi ? -1 : 1;
    return t == f ? 0 : (f > t ? -1 : 1);
}

/* Numeric comparison: -1, 0, 1, or 2 (unordered: NaN). */
static int cmp_num(const lm__cv *a, const lm__cv *b) {
    if (a->kind != CV_FLOAT && b->kind != CV_FLOAT) {
        int64_t x = as_int(a), y = as_int(b);
        return x < y ? -1 : x > y;
    }
    if (a->kind == CV_FLOAT && b->kind == CV_FLOAT) {
        if (isnan(a->u.f) || isnan(b->u.f)) return 2;
        return a->u.f < b->u.f ? -1 : a->u.f > b->u.f;
    }
    if (a->kind == CV_FLOAT) {
        int r = cmp_int_float(as_int(b), a->u.f);
        return r == 2 ? 2 : -r;
    }
    return cmp_int_float(as_int(a), b->u.f);
}

static int str_cmp(const lm__cv *a, const lm__cv *b) {
    size_t n = LM_MIN(a->u.s.n, b->u.s.n);
    int r = n ? memcmp(a->u.s.p, b->u.s.p, n) : 0;
    if (r) return r < 0 ? -1 : 1;
    return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
}

static int eq_depth(lm__crt *c, const lm__cnode *at, const lm__cv *a, const lm__cv *b, int depth);

static int seq_eq(lm__crt *c, const lm__cnode *at, const lm__cv *x, const lm__cv *y, int64_t n, int depth) {
    for (int64_t i = 0; i < n; i++) {
        int r = eq_depth(c, at, &x[i], &y[i], depth + 1);
        if (r != 1) return r;
    }
    return 1;
}

static int64_t range_item(const lm__cv_range *r, int64_t i) { return r->start + i * r->step; }

static int dict_eq(lm__crt *c, const lm__cnode *at, const lm__cv_dict *a, const lm__cv_dict *b, int depth) {
    if (a->n != b->n) return 0;
    for (int64_t i = 0; i < a->n; i++) {
        int64_t j = lm__cv_dict_find(b, &a->k[i]);
        if (j < 0) return 0;
        int r = eq_depth(c, at, &a->v[i], &b->v[j], depth + 1);
        if (r != 1) return r;
    }
    return 1;
}

/* Set-like equality of dict_keys / dict_items views. */
static int view_eq(lm__crt *c, const lm__cnode *at, const lm__cv_list *a, const lm__cv_list *b, int depth) {
    if (a->n != b->n) return 0;
    if (lm__crt_charge(c, at, a->n * b->n)) return -1;
    for (int64_t i = 0; i < a->n; i++) {
        int found = 0;
        for (int64_t j = 0; j < b->n && !found; j++) {
            int r = eq_depth(c, at, &a->v[i], &b->v[j], depth + 1);
            if (r < 0) return -1;
            found = r;
        }
        if (!found) return 0;
    }
    return 1;
}

static int eq_depth(lm__crt *c, const lm__cnode *at, const lm__cv *a, const lm__cv *b, int depth) {
    if (depth > MAX_NEST) return nest_fail(c, at);
    if (is_num(a) && is_num(b)) return cmp_num(a, b) == 0;
    if (a->kind != b->kind) return 0;
    switch (a->kind) {
    case CV_UNDEF:
    case CV_NONE: return 1;
    case CV_STR:
        if (a->u.s.n != b->u.s.n) return 0;
        if (lm__crt_charge(c, at, (int64_t)(a->u.s.n / 64))) return -1;
        return memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
    case CV_LIST: {
        const lm__cv_list *x = a->u.l, *y = b->u.l;
        if (x == y) return 1;
        if (x->kind != y->kind) return 0;
        if (lm__crt_charge(c, at, LM_MIN(x->n, y->n))) return -1;
        if (x->kind == CL_LIST || x->kind == CL_TUPLE) return x->n == y->n ? seq_eq(c, at, x->v, y->v, x->n, depth) : 0;
        if (x->kind == CL_KEYS || x->kind == CL_ITEMS) return view_eq(c, at, x, y, depth);
        return 0;
    }
    case CV_DICT:
        if (a->u.d == b->u.d) return 1;
        if (lm__crt_charge(c, at, a->u.d->n * (a->u.d->n / 8 + 1))) return -1;
        return dict_eq(c, at, a->u.d, b->u.d, depth);
    case CV_RANGE: {
        const lm__cv_range *x = a->u.r, *y = b->u.r;
        if (x->n != y->n) return 0;
        if (x->n == 0) return 1;
        return x->start == y->start && (x->n == 1 || x->step == y->step);
    }
    case CV_NS: return a->u.d == b->u.d;
    case CV_LOOP: return a->u.loop == b->u.loop;
    case CV_FUNC:
        if (a->u.fn == b->u.fn) return 1;
        return a->u.fn->kind == CF_GLOBAL && b->u.fn->kind == CF_GLOBAL && a->u.fn->id == b->u.fn->id;
    default: return 0;
    }
}

int lm__cv_eq(lm__crt *c, const lm__cnode *at, const lm__cv *a, const lm__cv *b) { return eq_depth(c, at, a, b, 0); }

static int undefined_used(lm__crt *c, const lm__cnode *at, const lm__cv *u) {
    return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "%s", u->u.s.p ? u->u.s.p : "undefined value used");
}

/* Ordering of a and b for the operator op ("<", "<=", ...): -1, 0, 1 or 2 (unordered);
 * -2 on failure (TypeError, Undefined used). */
static int order(lm__crt *c, const lm__cnode *at, const lm__cv *a, const lm__cv *b, const char *op, int depth) {
    if (depth > MAX_NEST) return nest_fail(c, at) - 1;
    if (a->kind == CV_UNDEF) return undefined_used(c, at, a) - 1;
    if (b->kind == CV_UNDEF) return undefined_used(c, at, b) - 1;
    if (is_num(a) && is_num(b)) return cmp_num(a, b);
    if (a->kind == CV_STR && b->kind == CV_STR) return str_cmp(a, b);
    if (a->kind == CV_LIST && b->kind == CV_LIST && a->u.l->kind == b->u.l->kind &&
        (a->u.l->kind == CL_LIST || a->u.l->kind == CL_TUPLE)) {
        const lm__cv_list *x = a->u.l, *y = b->u.l;
        int64_t n = LM_MIN(x->n, y->n);
        for (int64_t i = 0; i < n; i++) {
            int e = eq_depth(c, at, &x->v[i], &y->v[i], depth + 1);
            if (e < 0) return -2;
            if (!e) return order(c, at, &x->v[i], &y->v[i], op, depth + 1);
        }
        return x->n < y->n ? -1 : x->n > y->n;
    }
    lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "'%s' not supported between instances of '%s' and '%s'", op,
                 lm__cv_type_name(a), lm__cv_type_name(b));
    return -2;
}

int lm__cv_lt(lm__crt *c, const lm__cnode *at, const lm__cv *a, const lm__cv *b) {
    int r = order(c, at, a, b, "<", 0);
    return r == -2 ? -1 : r == -1;
}

int lm__cv_compare(lm__crt *c, const lm__cnode *at, const lm__cv *a, const lm__cv *b, int op) {
    static const char *names[] = {"==", "!=", "<", "<=", ">", ">="};
    int r = order(c, at, a, b, names[op], 0);
    if (r == -2) return -1;
    if (r == 2) return 0;
    switch (op) {
    case CMP_LT: return r < 0;
    case CMP_LE: return r <= 0;
    case CMP_GT: return r > 0;
    default: return r >= 0;
    }
}

/* ---- containers --------------------------------------------------------------------------------- */
static int key_eq(const lm__cv *a, const lm__cv *b, int depth) {
    if (a->kind == CV_STR) return b->kind == CV_STR && a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
    if (is_num(a) && is_num(b)) return cmp_num(a, b) == 0;
    if (a->kind != b->kind) return 0;
    switch (a->kind) {
    case CV_NONE:
    case CV_UNDEF: return 1;
    case CV_LIST:
        if (a->u.l->kind != CL_TUPLE || b->u.l->kind != CL_TUPLE || a->u.l->n != b->u.l->n || depth > MAX_NEST) return 0;
        for (int64_t i = 0; i < a->u.l->n; i++)
            if (!key_eq(&a->u.l->v[i], &b->u.l->v[i], depth + 1)) return 0;
        return 1;
    case CV_NS:
    case CV_DICT: return a->u.d == b->u.d;
    case CV_FUNC: return a->u.fn == b->u.fn;
    case CV_LOOP: return a->u.loop == b->u.loop;
    case CV_RANGE: return a->u.r == b->u.r;
    default: return 0;
    }
}

int64_t lm__cv_dict_find(const lm__cv_dict *d, const lm__cv *key) {
    if (key->kind == CV_STR) {
        for (int64_t i = 0; i < d->n; i++)
            if (d->k[i].kind == CV_STR && d->k[i].u.s.n == key->u.s.n && memcmp(d->k[i].u.s.p, key->u.s.p, key->u.s.n) == 0)
                return i;
        return -1;
    }
    for (int64_t i = 0; i < d->n; i++)
        if (key_eq(key, &d->k[i], 0)) return i;
    return -1;
}

static int unhashable(const lm__cv *v) {
    return (v->kind == CV_LIST && v->u.l->kind != CL_TUPLE && v->u.l->kind != CL_GEN) || v->kind == CV_DICT;
}

int lm__cv_iter(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cv **items, int64_t *n) {
    *items = NULL;
    *n = 0;
    if (lm__crt_charge(c, at, v->kind == CV_STR ? (int64_t)(v->u.s.n / 64)
                              : v->kind == CV_LIST ? v->u.l->n : v->kind == CV_DICT ? v->u.d->n
                              : v->kind == CV_RANGE ? v->u.r->n : 0))
        return -1;
    switch (v->kind) {
    case CV_UNDEF: return 0;
    case CV_LIST: {
        lm__cv_list *l = v->u.l;
        if (l->kind == CL_GEN) {
            *items = l->v ? l->v + l->pos : NULL;
            *n = l->n - l->pos;
            l->pos = l->n;
        } else {
            *items = l->v;
            *n = l->n;
        }
        return 0;
    }
    case CV_DICT:
        *items = v->u.d->k;
        *n = v->u.d->n;
        return 0;
    case CV_RANGE: {
        const lm__cv_range *r = v->u.r;
        lm__cv *out = r->n ? lm__crt_alloc(c, at, (size_t)r->n * sizeof *out) : NULL;
        if (r->n && !out) return -1;
        for (int64_t i = 0; i < r->n; i++) out[i] = lm__cv_int(range_item(r, i));
        *items = out;
        *n = r->n;
        return 0;
    }
    case CV_STR: {
        int64_t count = lm__cutf8_count(v->u.s.p, v->u.s.n);
        lm__cv *out = count ? lm__crt_alloc(c, at, (size_t)count * sizeof *out) : NULL;
        if (count && !out) return -1;
        size_t i = 0;
        for (int64_t k = 0; k < count; k++) {
            size_t len;
            lm__cutf8_get(v->u.s.p + i, &len);
            out[k] = lm__cv_str(v->u.s.p + i, len);
            i += len;
        }
        *items = out;
        *n = count;
        return 0;
    }
    default:
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "'%s' object is not iterable", lm__cv_type_name(v));
    }
}

int lm__cv_len(lm__crt *c, const lm__cnode *at, const lm__cv *v, int64_t *n) {
    switch (v->kind) {
    case CV_UNDEF: *n = 0; return 0;
    case CV_STR: *n = lm__cutf8_count(v->u.s.p, v->u.s.n); return 0;
    case CV_LIST:
        if (v->u.l->kind == CL_GEN) break;
        *n = v->u.l->n;
        return 0;
    case CV_DICT: *n = v->u.d->n; return 0;
    case CV_RANGE: *n = v->u.r->n; return 0;
    case CV_LOOP: *n = v->u.loop->n; return 0;
    default: break;
    }
    return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "object of type '%s' has no len()", lm__cv_type_name(v));
}

static int str_find(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return 1;
    if (nn > hn) return 0;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd[0] && memcmp(h + i, nd, nn) == 0) return 1;
    return 0;
}

int lm__cv_contains(lm__crt *c, const lm__cnode *at, const lm__cv *hay, const lm__cv *needle) {
    if (hay->kind == CV_STR && lm__crt_charge(c, at, (int64_t)(hay->u.s.n / 64))) return -1;
    if (hay->kind == CV_DICT && lm__crt_charge(c, at, hay->u.d->n / 8)) return -1;
    switch (hay->kind) {
    case CV_STR:
        if (needle->kind != CV_STR)
            return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "'in <string>' requires string as left operand, not %s",
                                lm__cv_type_name(needle));
        return str_find(hay->u.s.p, hay->u.s.n, needle->u.s.p, needle->u.s.n);
    case CV_DICT:
        if (unhashable(needle))
            return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "unhashable type: '%s'", lm__cv_type_name(needle));
        return lm__cv_dict_find(hay->u.d, needle) >= 0;
    case CV_RANGE: {
        const lm__cv_range *r = hay->u.r;
        if (needle->kind == CV_INT || needle->kind == CV_BOOL) {
            int64_t x = as_int(needle);
            if (r->n == 0) return 0;
            int64_t last = range_item(r, r->n - 1);
            int64_t lo = r->step > 0 ? r->start : last, hi = r->step > 0 ? last : r->start;
            return x >= lo && x <= hi && (x - r->start) % r->step == 0;
        }
        if (lm__crt_charge(c, at, r->n)) return -1;
        for (int64_t i = 0; i < r->n; i++) {
            lm__cv item = lm__cv_int(range_item(r, i));
            if (lm__cv_eq(c, at, &item, needle) == 1) return 1;
        }
        return 0;
    }
    case CV_LIST:
        if (hay->u.l->kind == CL_KEYS && unhashable(needle))
            return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "unhashable type: '%s'", lm__cv_type_name(needle));
        /* fall through */
    case CV_UNDEF: {
        const lm__cv *items;
        int64_t n;
        if (lm__cv_iter(c, at, hay, &items, &n)) return -1;
        for (int64_t i = 0; i < n; i++) {
            int r = lm__cv_eq(c, at, &items[i], needle);
            if (r) {
                if (r == 1 && hay->kind == CV_LIST && hay->u.l->kind == CL_GEN) hay->u.l->pos = hay->u.l->pos - n + i + 1;
                return r;
            }
        }
        return 0;
    }
    default:
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "argument of type '%s' is not iterable", lm__cv_type_name(hay));
    }
}

/* ---- json.dumps -------------------------------------------------------------------------------------- */
static int json_str(lm__crt *c, const lm__cnode *at, const char *p, size_t n, int ascii, lm__csink *s) {
    if (lm__csink_putc(c, at, s, '"')) return -1;
    size_t run = 0;
    for (size_t i = 0; i < n;) {
        size_t len;
        uint32_t cp = lm__cutf8_get(p + i, &len);
        char esc[16];
        esc[0] = '\0';
        switch (cp) {
        case '"': snprintf(esc, sizeof esc, "\\\""); break;
        case '\\': snprintf(esc, sizeof esc, "\\\\"); break;
        case '\n': snprintf(esc, sizeof esc, "\\n"); break;
        case '\r': snprintf(esc, sizeof esc, "\\r"); break;
        case '\t': snprintf(esc, sizeof esc, "\\t"); break;
        case '\b': snprintf(esc, sizeof esc, "\\b"); break;
        case '\f': snprintf(esc, sizeof esc, "\\f"); break;
        default:
            if (cp < 0x20 || (ascii && cp > 0x7E)) {
                if (cp >= 0x10000) {
                    uint32_t v = cp - 0x10000;
                    snprintf(esc, sizeof esc, "\\u%04x\\u%04x", (unsigned)(0xD800 | (v >> 10)), (unsigned)(0xDC00 | (v & 0x3FF)));
                } else {
                    snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
                }
            }
        }
        if (esc[0]) {
            if (lm__csink_put(c, at, s, p + i - run, run) || put(c, at, s, esc)) return -1;
            run = 0;
        } else {
            run += len;
        }
        i += len;
    }
    if (lm__csink_put(c, at, s, p + n - run, run)) return -1;
    return lm__csink_putc(c, at, s, '"');
}

static int json_float(lm__crt *c, const lm__cnode *at, double f, lm__csink *s) {
    char buf[40];
    if (isnan(f)) return put(c, at, s, "NaN");
    if (isinf(f)) return put(c, at, s, f > 0 ? "Infinity" : "-Infinity");
    lm__cfloat_repr(f, buf);
    return put(c, at, s, buf);
}

static int json_newline(lm__crt *c, const lm__cnode *at, const lm__cjson_opts *o, int level, lm__csink *s) {
    if (lm__csink_putc(c, at, s, '\n')) return -1;
    for (int i = 0; i < level; i++)
        if (lm__csink_put(c, at, s, o->indent, o->indent_n)) return -1;
    return 0;
}

static int not_serializable(lm__crt *c, const lm__cnode *at, const lm__cv *v) {
    return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "Object of type %s is not JSON serializable", lm__cv_type_name(v));
}

/* A dict key as json.dumps converts it (str, int, float, bool, None). */
static int json_key(lm__crt *c, const lm__cnode *at, const lm__cv *k, const lm__cjson_opts *o, lm__csink *s) {
    char buf[40];
    switch (k->kind) {
    case CV_STR: return json_str(c, at, k->u.s.p, k->u.s.n, o->ensure_ascii, s);
    case CV_INT: snprintf(buf, sizeof buf, "\"%lld\"", (long long)k->u.i); return put(c, at, s, buf);
    case CV_BOOL: return put(c, at, s, k->u.b ? "\"true\"" : "\"false\"");
    case CV_NONE: return put(c, at, s, "\"null\"");
    case CV_FLOAT:
        if (lm__csink_putc(c, at, s, '"') || json_float(c, at, k->u.f, s)) return -1;
        return lm__csink_putc(c, at, s, '"');
    default:
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "keys must be str, int, float, bool or None, not %s",
                            lm__cv_type_name(k));
    }
}

static int json_value(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cjson_opts *o, int level,
                      lm__csink *s);

static int json_dict(lm__crt *c, const lm__cnode *at, const lm__cv_dict *d, const lm__cjson_opts *o, int level,
                     lm__csink *s) {
    if (d->n == 0) return put(c, at, s, "{}");
    int64_t *order_idx = lm__crt_alloc(c, at, (size_t)d->n * sizeof *order_idx);
    if (!order_idx) return -1;
    for (int64_t i = 0; i < d->n; i++) order_idx[i] = i;
    if (o->sort_keys) { /* insertion sort: stable, and sort_keys is rare */
        for (int64_t i = 1; i < d->n; i++) {
            int64_t x = order_idx[i], j = i;
            while (j > 0) {
                int lt = lm__cv_lt(c, at, &d->k[x], &d->k[order_idx[j - 1]]);
                if (lt < 0) return -1;
                if (!lt) break;
                order_idx[j] = order_idx[j - 1];
                j--;
            }
            order_idx[j] = x;
        }
    }
    if (lm__csink_putc(c, at, s, '{')) return -1;
    if (o->indent && json_newline(c, at, o, level + 1, s)) return -1;
    for (int64_t i = 0; i < d->n; i++) {
        int64_t k = order_idx[i];
        if (i) {
            if (lm__csink_put(c, at, s, o->item_sep, o->item_sep_n)) return -1;
            if (o->indent && json_newline(c, at, o, level + 1, s)) return -1;
        }
        if (json_key(c, at, &d->k[k], o, s) || lm__csink_put(c, at, s, o->key_sep, o->key_sep_n) ||
            json_value(c, at, &d->v[k], o, level + 1, s))
            return -1;
    }
    if (o->indent && json_newline(c, at, o, level, s)) return -1;
    return lm__csink_putc(c, at, s, '}');
}

static int json_value(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cjson_opts *o, int level,
                      lm__csink *s) {
    char buf[40];
    if (level > MAX_NEST) return nest_fail(c, at);
    switch (v->kind) {
    case CV_NONE: return put(c, at, s, "null");
    case CV_BOOL: return put(c, at, s, v->u.b ? "true" : "false");
    case CV_INT:
        snprintf(buf, sizeof buf, "%lld", (long long)v->u.i);
        return put(c, at, s, buf);
    case CV_FLOAT: return json_float(c, at, v->u.f, s);
    case CV_STR: return json_str(c, at, v->u.s.p, v->u.s.n, o->ensure_ascii, s);
    case CV_DICT: return json_dict(c, at, v->u.d, o, level, s);
    case CV_LIST: {
        const lm__cv_list *l = v->u.l;
        if (l->kind != CL_LIST && l->kind != CL_TUPLE) return not_serializable(c, at, v);
        if (l->n == 0) return put(c, at, s, "[]");
        if (lm__csink_putc(c, at, s, '[')) return -1;
        if (o->indent && json_newline(c, at, o, level + 1, s)) return -1;
        for (int64_t i = 0; i < l->n; i++) {
            if (i) {
                if (lm__csink_put(c, at, s, o->item_sep, o->item_sep_n)) return -1;
                if (o->indent && json_newline(c, at, o, level + 1, s)) return -1;
            }
            if (json_value(c, at, &l->v[i], o, level + 1, s)) return -1;
        }
        if (o->indent && json_newline(c, at, o, level, s)) return -1;
        return lm__csink_putc(c, at, s, ']');
    }
    default: return not_serializable(c, at, v);
    }
}

int lm__cv_write_json(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cjson_opts *o, lm__csink *s) {
    return json_value(c, at, v, o, 0, s);
}

/* ---- JSON input --------------------------------------------------------------------------------------- */
int lm__cv_from_json(lm__crt *c, json_t *j, lm__cv *out, int depth) {
    if (depth > MAX_NEST) return lm__crt_fail(c, NULL, LM_INVALID_ARGUMENT, "JSON input nested more than %d deep", MAX_NEST);
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        lm__cv_dict *d = lm__crt_dict(c, NULL, (int64_t)json_object_size(j));
        if (!d) return -1;
        const char *key;
        json_t *val;
        json_object_foreach(j, key, val) {
            d->k[d->n] = lm__cv_str(key, strlen(key));
            if (lm__cv_from_json(c, val, &d->v[d->n], depth + 1)) return -1;
            d->n++;
        }
        *out = (lm__cv){.kind = CV_DICT, .u.d = d};
        return 0;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        lm__cv_list *l = lm__crt_list(c, NULL, (int64_t)n, CL_LIST);
        if (!l) return -1;
        for (size_t i = 0; i < n; i++)
            if (lm__cv_from_json(c, json_array_get(j, i), &l->v[i], depth + 1)) return -1;
        *out = lm__cv_of_list(l);
        return 0;
    }
    case JSON_STRING: *out = lm__cv_str(json_string_value(j), json_string_length(j)); return 0;
    case JSON_INTEGER: *out = lm__cv_int((int64_t)json_integer_value(j)); return 0;
    case JSON_REAL: *out = lm__cv_float(json_real_value(j)); return 0;
    case JSON_TRUE: *out = lm__cv_bool(1); return 0;
    case JSON_FALSE: *out = lm__cv_bool(0); return 0;
    default: *out = lm__cv_none(); return 0;
    }
}
