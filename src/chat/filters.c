/* chat/filters.c — Jinja's filters and tests, the globals transformers' environment
 * provides, and argument binding for all builtins.
 *
 * Each filter follows jinja2/filters.py (3.1) as it behaves with autoescape off: the
 * same signature (positional or keyword), the same handling of Undefined (`length`
 * of Undefined is 0, `int` of it raises), the same outputs (`map`, `select`,
 * `selectattr`, `unique`, `items` and `reverse` give one-shot generators, `sort`
 * and `list` lists). `tojson` is transformers' override (json.dumps, ensure_ascii off).
 * Globals: range (at most MAX_RANGE items, as the sandbox), dict, namespace,
 * raise_exception (fails the render with the template's message verbatim) and
 * strftime_now (local time). Jinja builtins that loom leaves out are refused by name
 * at parse time (the -2 entries).
 */
#include "chat/internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <utf8proc.h>

enum { MAX_RANGE = 100000 };

/* ---- names ------------------------------------------------------------------------------------- */
typedef enum fid {
    FL_ABS, FL_ATTR, FL_CAPITALIZE, FL_CENTER, FL_COUNT, FL_D, FL_DEFAULT, FL_DICTSORT, FL_FIRST, FL_FLOAT, FL_INDENT,
    FL_INT, FL_ITEMS, FL_JOIN, FL_LAST, FL_LENGTH, FL_LIST, FL_LOWER, FL_MAP, FL_MAX, FL_MIN, FL_REJECT, FL_REJECTATTR,
    FL_REPLACE, FL_REVERSE, FL_ROUND, FL_SAFE, FL_SELECT, FL_SELECTATTR, FL_SORT, FL_STRING, FL_SUM, FL_TITLE,
    FL_TOJSON, FL_TRIM, FL_UNIQUE, FL_UPPER, FL_WORDCOUNT, FL_N
} fid;

static const char *const k_filters[FL_N] = {
    "abs", "attr", "capitalize", "center", "count", "d", "default", "dictsort", "first", "float", "indent",
    "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr",
    "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title",
    "tojson", "trim", "unique", "upper", "wordcount",
};

static const char *const k_filters_unsupported[] = {
    "batch", "e", "escape", "filesizeformat", "forceescape", "format", "groupby", "pprint", "random",
    "slice", "striptags", "truncate", "urlencode", "urlize", "wordwrap", "xmlattr", NULL,
};

typedef enum tid {
    TS_BOOLEAN, TS_CALLABLE, TS_DEFINED, TS_DIVISIBLEBY, TS_EQ, TS_EQUALTO, TS_EVEN, TS_FALSE, TS_FLOAT, TS_GE,
    TS_GREATERTHAN, TS_GT, TS_IN, TS_INTEGER, TS_ITERABLE, TS_LE, TS_LESSTHAN, TS_LOWER, TS_LT, TS_MAPPING, TS_NE,
    TS_NONE, TS_NUMBER, TS_ODD, TS_SAMEAS, TS_SEQUENCE, TS_STRING, TS_TRUE, TS_UNDEFINED, TS_UPPER, TS_N
} tid;

static const char *const k_tests[TS_N] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "even", "false", "float", "ge",
    "greaterthan", "gt", "in", "integer", "iterable", "le", "lessthan", "lower", "lt", "mapping", "ne",
    "none", "number", "odd", "sameas", "sequence", "string", "true", "undefined", "upper",
};

/* The operator spellings of tests, usable by name in select('>', 1) and friends. */
static const struct {
    const char *name;
    tid id;
} k_test_aliases[] = {{"==", TS_EQ}, {"!=", TS_NE}, {">", TS_GT}, {">=", TS_GE}, {"<", TS_LT}, {"<=", TS_LE}};

static const char *const k_tests_unsupported[] = {"escaped", "filter", "test", NULL};

const char *const lm__chat_global_names[CG_COUNT] = {
    "range", "dict", "namespace", "raise_exception", "strftime_now", "lipsum", "cycler", "joiner",
};

int lm__chat_global_unsupported(int id) { return id == CG_LIPSUM || id == CG_CYCLER || id == CG_JOINER; }

static int lookup(const char *const *table, int n, const char *const *unsupported, const char *name, size_t len) {
    for (int i = 0; i < n; i++)
        if (strlen(table[i]) == len && memcmp(table[i], name, len) == 0) return i;
    for (int i = 0; unsupported[i]; i++)
        if (strlen(unsupported[i]) == len && memcmp(unsupported[i], name, len) == 0) return -2;
    return -1;
}

int lm__chat_filter_id(const char *name, size_t n) { return lookup(k_filters, FL_N, k_filters_unsupported, name, n); }
int lm__chat_test_id(const char *name, size_t n) {
    for (size_t i = 0; i < sizeof k_test_aliases / sizeof k_test_aliases[0]; i++)
        if (strlen(k_test_aliases[i].name) == n && memcmp(k_test_aliases[i].name, name, n) == 0) return k_test_aliases[i].id;
    return lookup(k_tests, TS_N, k_tests_unsupported, name, n);
}

/* ---- argument binding ------------------------------------------------------------------------------ */
int lm__cargs_bind(lm__crt *c, const lm__cnode *at, const char *what, const lm__cargs *a, const char *const *names,
                   int nnames, lm__cv *slot, int *given) {
    if (a->n > nnames) {
        if (nnames == 0) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "%s takes no arguments (%d given)", what, a->n);
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "%s takes at most %d arguments (%d given)", what, nnames, a->n);
    }
    for (int i = 0; i < a->n; i++) {
        slot[i] = a->v[i];
        given[i] = 1;
    }
    for (int k = 0; k < a->nkw; k++) {
        int j = -1;
        for (int i = 0; i < nnames && j < 0; i++)
            if (strcmp(names[i], a->kw[k]) == 0) j = i;
        if (j < 0) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "%s got an unexpected keyword argument '%s'", what, a->kw[k]);
        if (given[j]) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "%s got multiple values for argument '%s'", what, a->kw[k]);
        slot[j] = a->v[a->n + k];
        given[j] = 1;
    }
    return 0;
}

/* Binds into slot[] after setting defaults; nreq leading parameters are required. */
static int bindf(lm__crt *c, const lm__cnode *at, const char *what, const lm__cargs *a, const char *const *names,
                 int nnames, int nreq, const lm__cv *defaults, lm__cv *slot, int *given) {
    for (int i = 0; i < nnames; i++) {
        slot[i] = defaults ? defaults[i] : lm__cv_none();
        given[i] = 0;
    }
    if (lm__cargs_bind(c, at, what, a, names, nnames, slot, given)) return -1;
    for (int i = 0; i < nreq; i++)
        if (!given[i])
            return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "%s missing required argument '%s'", what, names[i]);
    return 0;
}

/* ---- helpers --------------------------------------------------------------------------------------- */
static int undefined_fail(lm__crt *c, const lm__cnode *at, const lm__cv *u) {
    return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "%s", u->u.s.p ? u->u.s.p : "an undefined value was used");
}

static int is_int(const lm__cv *v) { return v->kind == CV_INT || v->kind == CV_BOOL; }
static int64_t ival(const lm__cv *v) { return v->kind == CV_BOOL ? v->u.b : v->u.i; }

static int gen_of(lm__crt *c, const lm__cnode *at, lm__cv *items, int64_t n, const char *name, lm__cv *out) {
    lm__cv_list *l = lm__crt_list(c, at, 0, CL_GEN);
    if (!l) return -1;
    l->v = items;
    l->n = n;
    l->gen_name = name;
    *out = lm__cv_of_list(l);
    return 0;
}

/* Jinja's make_attrgetter: "a.b.0" looked up step by step with getitem semantics. */
static int attr_get(lm__crt *c, const lm__cnode *at, const lm__cv *item, const lm__cv *attr, lm__cv *out) {
    if (attr->kind != CV_STR) return lm__chat_getitem(c, at, item, attr, out);
    lm__cv cur = *item;
    const char *p = attr->u.s.p;
    size_t n = attr->u.s.n, start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && p[i] != '.') continue;
        lm__cv key = lm__cv_str(p + start, i - start);
        int digits = i > start;
        int64_t v = 0;
        for (size_t k = start; k < i && digits; k++) {
            if (!isdigit((unsigned char)p[k]) || v > (INT64_MAX - 9) / 10) digits = 0;
            else v = v * 10 + (p[k] - '0');
        }
        if (digits) key = lm__cv_int(v);
        if (lm__chat_getitem(c, at, &cur, &key, &cur)) return -1;
        start = i + 1;
    }
    *out = cur;
    return 0;
}

/* The sort / unique / min / max key: the attribute (comma-separated attributes make a
 * tuple when multi), lower-cased for strings unless case_sensitive. */
static int sort_key(lm__crt *c, const lm__cnode *at, const lm__cv *item, const lm__cv *attr, int case_sensitive, int multi,
                    lm__cv *out) {
    if (attr->kind == CV_NONE) {
        *out = *item;
    } else if (multi && attr->kind == CV_STR && memchr(attr->u.s.p, ',', attr->u.s.n)) {
        int64_t parts = 1;
        for (size_t i = 0; i < attr->u.s.n; i++) parts += attr->u.s.p[i] == ',';
        lm__cv_list *l = lm__crt_list(c, at, parts, CL_LIST);
        if (!l) return -1;
        size_t start = 0;
        int64_t k = 0;
        for (size_t i = 0; i <= attr->u.s.n; i++) {
            if (i < attr->u.s.n && attr->u.s.p[i] != ',') continue;
            lm__cv one = lm__cv_str(attr->u.s.p + start, i - start);
            if (sort_key(c, at, item, &one, case_sensitive, 0, &l->v[k++])) return -1;
            start = i + 1;
        }
        *out = lm__cv_of_list(l);
        return 0;
    } else if (attr_get(c, at, item, attr, out)) {
        return -1;
    }
    if (!case_sensitive && out->kind == CV_STR) return lm__cstr_case(c, at, out, CC_LOWER, out);
    return 0;
}

/* Stable merge sort of idx[0..n) by keys (Python's sorted, reverse keeps stability). */
static int merge_sort(lm__crt *c, const lm__cnode *at, const lm__cv *keys, int64_t *idx, int64_t *tmp, int64_t n,
                      int reverse) {
    if (n < 2) return 0;
    int64_t h = n / 2;
    if (merge_sort(c, at, keys, idx, tmp, h, reverse) || merge_sort(c, at, keys, idx + h, tmp, n - h, reverse)) return -1;
    int64_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int take_right = reverse ? lm__cv_lt(c, at, &keys[idx[i]], &keys[idx[j]]) : lm__cv_lt(c, at, &keys[idx[j]], &keys[idx[i]]);
        if (take_right < 0) return -1;
        tmp[k++] = take_right ? idx[j++] : idx[i++];
    }
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, (size_t)n * sizeof *idx);
    return 0;
}

static int sorted_copy(lm__crt *c, const lm__cnode *at, const lm__cv *items, const lm__cv *keys, int64_t n, int reverse,
                       lm__cv *out) {
    int64_t *idx = n ? lm__crt_alloc(c, at, (size_t)n * sizeof *idx) : NULL;
    int64_t *tmp = n ? lm__crt_alloc(c, at, (size_t)n * sizeof *tmp) : NULL;
    if (n && (!idx || !tmp)) return -1;
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    if (merge_sort(c, at, keys, idx, tmp, n, reverse)) return -1;
    lm__cv_list *l = lm__crt_list(c, at, n, CL_LIST);
    if (!l) return -1;
    for (int64_t i = 0; i < n; i++) l->v[i] = items[idx[i]];
    *out = lm__cv_of_list(l);
    return 0;
}

static int to_str(lm__crt *c, const lm__cnode *at, const lm__cv *v, lm__cv *out) { return lm__cv_to_str(c, at, v, out); }

/* Python int(str, base) for base 10 (whitespace, sign and underscores allowed). */
static int parse_int(const char *p, size_t n, int base, int64_t *out) {
    size_t i = 0;
    while (i < n && lm__cuni_space((unsigned char)p[i])) i++;
    while (n > i && lm__cuni_space((unsigned char)p[n - 1])) n--;
    int neg = 0;
    if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
    if (base == 16 && i + 1 < n && p[i] == '0' && (p[i + 1] == 'x' || p[i + 1] == 'X')) i += 2;
    if (i >= n) return 0;
    uint64_t v = 0;
    int last_us = 1;
    for (; i < n; i++) {
        if (p[i] == '_') {
            if (last_us) return 0;
            last_us = 1;
            continue;
        }
        int d = isdigit((unsigned char)p[i]) ? p[i] - '0' : isalpha((unsigned char)p[i]) ? tolower((unsigned char)p[i]) - 'a' + 10 : 99;
        if (d >= base) return 0;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return 0;
        v = v * (uint64_t)base + (uint64_t)d;
        last_us = 0;
    }
    if (last_us) return 0;
    if (v > (uint64_t)INT64_MAX + (uint64_t)neg) return 0;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

/* Python float(str): whitespace, underscores between digits, inf / nan spellings. */
static int parse_float(const char *p, size_t n, double *out) {
    char buf[128];
    size_t i = 0, o = 0;
    while (i < n && lm__cuni_space((unsigned char)p[i])) i++;
    while (n > i && lm__cuni_space((unsigned char)p[n - 1])) n--;
    if (i >= n || n - i >= sizeof buf) return 0;
    for (; i < n; i++) {
        char ch = p[i];
        if (ch == '_') {
            if (!o || !isdigit((unsigned char)buf[o - 1]) || i + 1 >= n || !isdigit((unsigned char)p[i + 1])) return 0;
            continue;
        }
        if (!isalnum((unsigned char)ch) && ch != '.' && ch != '+' && ch != '-') return 0;
        buf[o++] = ch;
    }
    buf[o] = '\0';
    const char *s = buf + (buf[0] == '+' || buf[0] == '-');
    int neg = buf[0] == '-';
    if (!strcasecmp(s, "inf") || !strcasecmp(s, "infinity")) {
        *out = neg ? -INFINITY : INFINITY;
        return 1;
    }
    if (!strcasecmp(s, "nan")) {
        *out = NAN;
        return 1;
    }
    for (const char *q = s; *q; q++) /* no hex floats, no other words */
        if (isalpha((unsigned char)*q) && *q != 'e' && *q != 'E') return 0;
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (*end != '\0' || end == buf) return 0;
    *out = v;
    return 1;
}

/* Python round(x, ndigits) for floats: correctly rounded, ties to even. */
static double round_float(double x, int64_t nd) {
    if (!isfinite(x) || nd > 300) return x;
    if (nd >= 0) {
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)LM_MIN(nd, 340), x);
        return strtod(buf, NULL);
    }
    if (nd < -308) return copysign(0.0, x);
    double p = pow(10.0, (double)-nd), y = x / p, z = nearbyint(y);
    return z * p;
}

/* ---- filters ---------------------------------------------------------------------------------------- */
static int f_int(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cargs *a, lm__cv *out) {
    static const char *const names[] = {"default", "base"};
    lm__cv defs[2] = {lm__cv_int(0), lm__cv_int(10)}, s[2];
    int g[2];
    if (bindf(c, at, "filter 'int'", a, names, 2, 0, defs, s, g)) return -1;
    int base = is_int(&s[1]) ? (int)ival(&s[1]) : 10;
    switch (v->kind) {
    case CV_UNDEF: return undefined_fail(c, at, v);
    case CV_BOOL:
    case CV_INT: *out = lm__cv_int(ival(v)); return 0;
    case CV_FLOAT:
        if (isinf(v->u.f)) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "cannot convert float infinity to integer");
        if (isnan(v->u.f)) break;
        if (fabs(v->u.f) >= 9223372036854775808.0) return lm__crt_fail(c, at, LM_UNSUPPORTED, "integer overflow (64-bit)");
        *out = lm__cv_int((int64_t)v->u.f);
        return 0;
    case CV_STR: {
        int64_t iv;
        double fv;
        if (base >= 2 && base <= 36 && parse_int(v->u.s.p, v->u.s.n, base, &iv)) {
            *out = lm__cv_int(iv);
            return 0;
        }
        if (parse_float(v->u.s.p, v->u.s.n, &fv)) {
            if (isinf(fv)) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "cannot convert float infinity to integer");
            if (!isnan(fv) && fabs(fv) < 9223372036854775808.0) {
                *out = lm__cv_int((int64_t)fv);
                return 0;
            }
        }
        break;
    }
    default: break;
    }
    *out = s[0];
    return 0;
}

static int f_float(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cargs *a, lm__cv *out) {
    static const char *const names[] = {"default"};
    lm__cv def = lm__cv_float(0.0), s;
    int g;
    if (bindf(c, at, "filter 'float'", a, names, 1, 0, &def, &s, &g)) return -1;
    double f;
    switch (v->kind) {
    case CV_UNDEF: return undefined_fail(c, at, v);
    case CV_BOOL:
    case CV_INT: *out = lm__cv_float((double)ival(v)); return 0;
    case CV_FLOAT: *out = *v; return 0;
    case CV_STR:
        if (parse_float(v->u.s.p, v->u.s.n, &f)) {
            *out = lm__cv_float(f);
            return 0;
        }
        break;
    default: break;
    }
    *out = s;
    return 0;
}

static int f_round(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cargs *a, lm__cv *out) {
    static const char *const names[] = {"precision", "method"};
    lm__cv defs[2] = {lm__cv_int(0), lm__cv_str("common", 6)}, s[2];
    int g[2];
    if (bindf(c, at, "filter 'round'", a, names, 2, 0, defs, s, g)) return -1;
    const char *m = s[1].kind == CV_STR ? s[1].u.s.p : "";
    size_t mn = s[1].kind == CV_STR ? s[1].u.s.n : 0;
    int method = mn == 6 && !memcmp(m, "common", 6) ? 0 : mn == 4 && !memcmp(m, "ceil", 4) ? 1
               : mn == 5 && !memcmp(m, "floor", 5) ? 2 : -1;
    if (method < 0) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "method must be common, ceil or floor");
    if (!is_int(&s[0]))
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "'%s' object cannot be interpreted as an integer", lm__cv_type_name(&s[0]));
    int64_t nd = ival(&s[0]);
    if (v->kind != CV_INT && v->kind != CV_BOOL && v->kind != CV_FLOAT)
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "type %s doesn't define __round__ method", lm__cv_type_name(v));
    if (method) { /* math.floor/ceil(value * 10**precision) / 10**precision: always a float */
        double x = v->kind == CV_FLOAT ? v->u.f : (double)ival(v), p = pow(10.0, (double)nd);
        double r = (method == 1 ? ceil(x * p) : floor(x * p)) / p;
        *out = lm__cv_float(r);
        return 0;
    }
    if (v->kind == CV_FLOAT) {
        *out = lm__cv_float(round_float(v->u.f, nd));
        return 0;
    }
    int64_t x = ival(v);
    if (nd >= 0) {
        *out = lm__cv_int(x);
        return 0;
    }
    if (nd < -18) {
        *out = lm__cv_int(0);
        return 0;
    }
    int64_t p = 1;
    for (int64_t i = 0; i < -nd; i++) p *= 10;
    int64_t q = x / p, r = x % p;
    if (r < 0) r += p, q--;
    if (2 * r > p || (2 * r == p && (q & 1))) q++; /* ties to even */
    int64_t res;
    if (__builtin_mul_overflow(q, p, &res)) return lm__crt_fail(c, at, LM_UNSUPPORTED, "integer overflow (64-bit)");
    *out = lm__cv_int(res);
    return 0;
}

static int f_tojson(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cargs *a, lm__cv *out) {
    static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    lm__cv defs[4] = {lm__cv_bool(0), lm__cv_none(), lm__cv_none(), lm__cv_bool(0)}, s[4];
    int g[4];
    if (bindf(c, at, "filter 'tojson'", a, names, 4, 0, defs, s, g)) return -1;
    lm__cjson_opts o = {.ensure_ascii = lm__cv_truthy(&s[0]), .sort_keys = lm__cv_truthy(&s[3])};
    char *spaces = NULL;
    if (s[1].kind == CV_STR) {
        o.indent = s[1].u.s.p, o.indent_n = s[1].u.s.n;
    } else if (is_int(&s[1])) {
        int64_t w = ival(&s[1]);
        if (w > 4096) return lm__crt_fail(c, at, LM_UNSUPPORTED, "tojson indent %lld is too large", (long long)w);
        w = LM_MAX(w, 0);
        if (!(spaces = lm__crt_alloc(c, at, (size_t)w + 1))) return -1;
        memset(spaces, ' ', (size_t)w);
        o.indent = spaces, o.indent_n = (size_t)w;
    } else if (s[1].kind != CV_NONE) {
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "can't multiply sequence by non-int of type '%s'", lm__cv_type_name(&s[1]));
    }
    o.item_sep = o.indent ? "," : ", ", o.item_sep_n = o.indent ? 1 : 2;
    o.key_sep = ": ", o.key_sep_n = 2;
    if (s[2].kind != CV_NONE) {
        const lm__cv *items;
        int64_t n;
        if (s[2].kind != CV_LIST || lm__cv_iter(c, at, &s[2], &items, &n) || n != 2 || items[0].kind != CV_STR ||
            items[1].kind != CV_STR)
            return c->status != LM_OK ? -1
                                      : lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "tojson separators must be a pair of strings");
        o.item_sep = items[0].u.s.p, o.item_sep_n = items[0].u.s.n;
        o.key_sep = items[1].u.s.p, o.key_sep_n = items[1].u.s.n;
    }
    lm__csink sink = {0};
    if (lm__cv_write_json(c, at, v, &o, &sink)) return -1;
    *out = lm__csink_value(&sink);
    return 0;
}

static int f_indent(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cargs *a, lm__cv *out) {
    static const char *const names[] = {"width", "first", "blank"};
    lm__cv defs[3] = {lm__cv_int(4), lm__cv_bool(0), lm__cv_bool(0)}, s[3];
    int g[3];
    if (bindf(c, at, "filter 'indent'", a, names, 3, 0, defs, s, g)) return -1;
    if (v->kind == CV_UNDEF) return undefined_fail(c, at, v);
    if (v->kind != CV_STR)
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "unsupported operand type(s) for +=: '%s' and 'str'", lm__cv_type_name(v));
    lm__cv ind;
    if (s[0].kind == CV_STR) {
        ind = s[0];
    } else if (is_int(&s[0])) {
        int64_t w = LM_MAX(ival(&s[0]), 0);
        if (w > c->max_str) return lm__crt_fail(c, at, LM_OUT_OF_RANGE, "indent width too large");
        char *sp = lm__crt_strbuf(c, at, (size_t)w);
        if (!sp) return -1;
        memset(sp, ' ', (size_t)w);
        ind = lm__cv_str(sp, (size_t)w);
    } else {
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "can't multiply sequence by non-int of type '%s'", lm__cv_type_name(&s[0]));
    }
    lm__csink t = {0};
    if (lm__csink_put(c, at, &t, v->u.s.p, v->u.s.n) || lm__csink_putc(c, at, &t, '\n')) return -1;
    lm__cv text = lm__csink_value(&t), lines;
    if (lm__cstr_splitlines(c, at, &text, 0, &lines)) return -1;
    const lm__cv_list *l = lines.u.l;
    lm__csink r = {0};
    if (lm__cv_truthy(&s[1]) && lm__csink_put(c, at, &r, ind.u.s.p, ind.u.s.n)) return -1;
    int blank = lm__cv_truthy(&s[2]);
    for (int64_t i = 0; i < l->n; i++) {
        if (i) {
            if (lm__csink_putc(c, at, &r, '\n')) return -1;
            if ((blank || l->v[i].u.s.n) && lm__csink_put(c, at, &r, ind.u.s.p, ind.u.s.n)) return -1;
        }
        if (lm__csink_put(c, at, &r, l->v[i].u.s.p, l->v[i].u.s.n)) return -1;
    }
    *out = lm__csink_value(&r);
    return 0;
}

/* select / reject / selectattr / rejectattr / map over the items of v. */
static int f_select(lm__crt *c, const lm__cnode *at, int id, const lm__cv *v, const lm__cargs *a, lm__cv *out) {
    if (!lm__cv_truthy(v)) return gen_of(c, at, NULL, 0, "generator", out); /* Jinja: `if value:` before anything */
    const lm__cv *items;
    int64_t n;
    int by_attr = id == FL_SELECTATTR || id == FL_REJECTATTR, want = id == FL_SELECT || id == FL_SELECTATTR;
    int first_arg = by_attr ? 1 : 0;
    if (a->nkw) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "filter '%s' got an unexpected keyword argument '%s'", k_filters[id], a->kw[0]);
    if (by_attr && a->n < 1) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "Missing parameter for attribute name");
    int test = -1;
    if (a->n > first_arg) {
        const lm__cv *name = &a->v[first_arg];
        if (name->kind != CV_STR || (test = lm__chat_test_id(name->u.s.p, name->u.s.n)) < 0) {
            lm__cv sname;
            if (to_str(c, at, name, &sname)) return -1;
            return lm__crt_fail(c, at, test == -2 ? LM_UNSUPPORTED : LM_INVALID_ARGUMENT, "No test named '%.*s'.",
                                (int)LM_MIN(sname.u.s.n, 80), sname.u.s.p);
        }
    }
    if (lm__cv_iter(c, at, v, &items, &n)) return -1;
    lm__cv *kept = n ? lm__crt_alloc(c, at, (size_t)n * sizeof *kept) : NULL;
    if (n && !kept) return -1;
    int64_t k = 0;
    lm__cargs rest = {.n = a->n > first_arg ? a->n - first_arg - 1 : 0, .v = a->n > first_arg ? a->v + first_arg + 1 : NULL};
    for (int64_t i = 0; i < n; i++) {
        lm__cv x = items[i];
        if (by_attr && attr_get(c, at, &items[i], &a->v[0], &x)) return -1;
        int r;
        if (test >= 0) {
            if (lm__chat_test(c, at, test, &x, &rest, &r)) return -1;
        } else {
            r = lm__cv_truthy(&x);
        }
        if (r == want) kept[k++] = items[i];
    }
    return gen_of(c, at, kept, k, "generator", out);
}

static int f_map(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cargs *a, lm__cv *out) {
    if (!lm__cv_truthy(v)) return gen_of(c, at, NULL, 0, "generator", out); /* Jinja: `if value:` before anything */
    const lm__cv *items;
    int64_t n;
    const lm__cv *attr = NULL, *def = NULL;
    for (int k = 0; k < a->nkw; k++) {
        if (!strcmp(a->kw[k], "attribute")) attr = &a->v[a->n + k];
        else if (!strcmp(a->kw[k], "default")) def = &a->v[a->n + k];
        else if (!attr) return lm__crt_fail(c, at, LM_UNSUPPORTED, "unsupported keyword argument '%s' to map with a filter", a->kw[k]);
    }
    int filter = -1;
    if (!attr) {
        if (a->n < 1) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "map requires a filter argument");
        if (a->v[0].kind != CV_STR || (filter = lm__chat_filter_id(a->v[0].u.s.p, a->v[0].u.s.n)) < 0) {
            lm__cv sname;
            if (to_str(c, at, &a->v[0], &sname)) return -1;
            return lm__crt_fail(c, at, filter == -2 ? LM_UNSUPPORTED : LM_INVALID_ARGUMENT, "No filter named '%.*s'.",
                                (int)LM_MIN(sname.u.s.n, 80), sname.u.s.p);
        }
    } else if (a->n) {
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "map with attribute= takes no positional arguments");
    }
    if (lm__cv_iter(c, at, v, &items, &n)) return -1;
    lm__cv *res = n ? lm__crt_alloc(c, at, (size_t)n * sizeof *res) : NULL;
    if (n && !res) return -1;
    lm__cargs rest = {.n = a->n > 0 ? a->n - 1 : 0, .nkw = attr ? 0 : a->nkw, .v = a->v ? a->v + 1 : NULL, .kw = a->kw};
    for (int64_t i = 0; i < n; i++) {
        if (attr) {
            if (attr_get(c, at, &items[i], attr, &res[i])) return -1;
            if (def && res[i].kind == CV_UNDEF) res[i] = *def;
        } else if (lm__chat_filter(c, at, filter, &items[i], &rest, &res[i])) {
            return -1;
        }
    }
    return gen_of(c, at, res, n, "generator", out);
}

static int f_reverse(lm__crt *c, const lm__cnode *at, const lm__cv *v, lm__cv *out) {
    if (v->kind == CV_STR) {
        char *buf = lm__crt_strbuf(c, at, v->u.s.n);
        if (!buf) return -1;
        size_t o = v->u.s.n;
        for (size_t i = 0; i < v->u.s.n;) {
            size_t len;
            lm__cutf8_get(v->u.s.p + i, &len);
            o -= len;
            memcpy(buf + o, v->u.s.p + i, len);
            i += len;
        }
        *out = lm__cv_str(buf, v->u.s.n);
        return 0;
    }
    if (v->kind != CV_LIST && v->kind != CV_DICT && v->kind != CV_RANGE && v->kind != CV_UNDEF)
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "argument must be iterable");
    int gen = v->kind == CV_LIST && v->u.l->kind == CL_GEN;
    const lm__cv *items;
    int64_t n;
    if (lm__cv_iter(c, at, v, &items, &n)) return -1;
    lm__cv *r = n ? lm__crt_alloc(c, at, (size_t)n * sizeof *r) : NULL;
    if (n && !r) return -1;
    for (int64_t i = 0; i < n; i++) r[i] = items[n - 1 - i];
    if (gen) { /* not reversible: list(value) reversed */
        lm__cv_list *l = lm__crt_list(c, at, 0, CL_LIST);
        if (!l) return -1;
        l->v = r, l->n = n;
        *out = lm__cv_of_list(l);
        return 0;
    }
    const char *name = v->kind == CV_DICT ? "dict_reversekeyiterator" : v->kind == CV_RANGE ? "range_iterator"
                     : v->kind == CV_LIST && v->u.l->kind == CL_LIST ? "list_reverseiterator" : "reversed";
    return gen_of(c, at, r, n, name, out);
}

static int f_first_last(lm__crt *c, const lm__cnode *at, int last, const lm__cv *v, lm__cv *out) {
    if (last && (v->kind == CV_LIST && v->u.l->kind == CL_GEN))
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "'%s' object is not reversible", lm__cv_type_name(v));
    if (last && v->kind != CV_LIST && v->kind != CV_STR && v->kind != CV_DICT && v->kind != CV_RANGE && v->kind != CV_UNDEF)
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "'%s' object is not reversible", lm__cv_type_name(v));
    if (!last && v->kind == CV_LIST && v->u.l->kind == CL_GEN) { /* consume one item */
        lm__cv_list *l = v->u.l;
        if (l->pos < l->n) {
            *out = l->v[l->pos++];
            return 0;
        }
        *out = lm__cv_undef("No first item, sequence was empty.");
        return 0;
    }
    const lm__cv *items;
    int64_t n;
    if (lm__cv_iter(c, at, v, &items, &n)) return -1;
    if (n == 0) *out = lm__cv_undef(last ? "No last item, sequence was empty." : "No first item, sequence was empty.");
    else *out = items[last ? n - 1 : 0];
    return 0;
}

static int f_minmax(lm__crt *c, const lm__cnode *at, int max, const lm__cv *v, const lm__cargs *a, lm__cv *out) {
    static const char *const names[] = {"case_sensitive", "attribute"};
    lm__cv defs[2] = {lm__cv_bool(0), lm__cv_none()}, s[2];
    int g[2];
    if (bindf(c, at, max ? "filter 'max'" : "filter 'min'", a, names, 2, 0, defs, s, g)) return -1;
    const lm__cv *items;
    int64_t n;
    if (lm__cv_iter(c, at, v, &items, &n)) return -1;
    if (n == 0) {
        *out = lm__cv_undef(max ? "No largest item, sequence was empty." : "No smallest item, sequence was empty.");
        return 0;
    }
    int cs = lm__cv_truthy(&s[0]);
    int64_t best = 0;
    lm__cv bk, k;
    if (sort_key(c, at, &items[0], &s[1], cs, 0, &bk)) return -1;
    for (int64_t i = 1; i < n; i++) {
        if (sort_key(c, at, &items[i], &s[1], cs, 0, &k)) return -1;
        int r = max ? lm__cv_lt(c, at, &bk, &k) : lm__cv_lt(c, at, &k, &bk);
        if (r < 0) return -1;
        if (r) best = i, bk = k;
    }
    *out = items[best];
    return 0;
}

static int f_sum(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cargs *a, lm__cv *out) {
    static const char *const names[] = {"attribute", "start"};
    lm__cv defs[2] = {lm__cv_none(), lm__cv_int(0)}, s[2];
    int g[2];
    if (bindf(c, at, "filter 'sum'", a, names, 2, 0, defs, s, g)) return -1;
    const lm__cv *items;
    int64_t n;
    if (lm__cv_iter(c, at, v, &items, &n)) return -1;
    lm__cv total = s[1];
    for (int64_t i = 0; i < n; i++) {
        lm__cv x = items[i];
        if (s[0].kind != CV_NONE && attr_get(c, at, &items[i], &s[0], &x)) return -1;
        if (x.kind == CV_UNDEF) return undefined_fail(c, at, &x);
        int tn = total.kind == CV_INT || total.kind == CV_BOOL || total.kind == CV_FLOAT;
        int xn = x.kind == CV_INT || x.kind == CV_BOOL || x.kind == CV_FLOAT;
        if (tn && xn) {
            if (total.kind == CV_FLOAT || x.kind == CV_FLOAT) {
                double a1 = total.kind == CV_FLOAT ? total.u.f : (double)ival(&total);
                double b1 = x.kind == CV_FLOAT ? x.u.f : (double)ival(&x);
                total = lm__cv_float(a1 + b1);
            } else {
                int64_t r;
                if (__builtin_add_overflow(ival(&total), ival(&x), &r))
                    return lm__crt_fail(c, at, LM_UNSUPPORTED, "integer overflow (64-bit)");
                total = lm__cv_int(r);
            }
        } else {
            return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "unsupported operand type(s) for +: '%s' and '%s'",
                                lm__cv_type_name(&total), lm__cv_type_name(&x));
        }
    }
    *out = total;
    return 0;
}

static int f_unique(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cargs *a, lm__cv *out) {
    static const char *const names[] = {"case_sensitive", "attribute"};
    lm__cv defs[2] = {lm__cv_bool(0), lm__cv_none()}, s[2];
    int g[2];
    if (bindf(c, at, "filter 'unique'", a, names, 2, 0, defs, s, g)) return -1;
    const lm__cv *items;
    int64_t n, k = 0;
    if (lm__cv_iter(c, at, v, &items, &n)) return -1;
    lm__cv *kept = n ? lm__crt_alloc(c, at, (size_t)n * sizeof *kept) : NULL;
    lm__cv *seen = n ? lm__crt_alloc(c, at, (size_t)n * sizeof *seen) : NULL;
    if (n && (!kept || !seen)) return -1;
    int cs = lm__cv_truthy(&s[0]);
    for (int64_t i = 0; i < n; i++) {
        lm__cv key;
        if (sort_key(c, at, &items[i], &s[1], cs, 0, &key)) return -1;
        if ((key.kind == CV_LIST && key.u.l->kind != CL_TUPLE) || key.kind == CV_DICT)
            return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "unhashable type: '%s'", lm__cv_type_name(&key));
        int dup = 0;
        if (lm__crt_charge(c, at, k)) return -1; /* quadratic: every new key against the kept ones */
        for (int64_t j = 0; j < k && !dup; j++) {
            dup = lm__cv_eq(c, at, &seen[j], &key);
            if (dup < 0) return -1;
        }
        if (!dup) seen[k] = key, kept[k++] = items[i];
    }
    return gen_of(c, at, kept, k, "generator", out);
}

static int f_sort(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cargs *a, lm__cv *out) {
    static const char *const names[] = {"reverse", "case_sensitive", "attribute"};
    lm__cv defs[3] = {lm__cv_bool(0), lm__cv_bool(0), lm__cv_none()}, s[3];
    int g[3];
    if (bindf(c, at, "filter 'sort'", a, names, 3, 0, defs, s, g)) return -1;
    const lm__cv *items;
    int64_t n;
    if (lm__cv_iter(c, at, v, &items, &n)) return -1;
    lm__cv *keys = n ? lm__crt_alloc(c, at, (size_t)n * sizeof *keys) : NULL;
    if (n && !keys) return -1;
    for (int64_t i = 0; i < n; i++)
        if (sort_key(c, at, &items[i], &s[2], lm__cv_truthy(&s[1]), 1, &keys[i])) return -1;
    return sorted_copy(c, at, items, keys, n, lm__cv_truthy(&s[0]), out);
}

static int f_dictsort(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cargs *a, lm__cv *out) {
    static const char *const names[] = {"case_sensitive", "by", "reverse"};
    lm__cv defs[3] = {lm__cv_bool(0), lm__cv_str("key", 3), lm__cv_bool(0)}, s[3];
    int g[3];
    if (bindf(c, at, "filter 'dictsort'", a, names, 3, 0, defs, s, g)) return -1;
    if (v->kind == CV_UNDEF) return undefined_fail(c, at, v);
    if (v->kind != CV_DICT)
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "'%s' object has no attribute 'items'", lm__cv_type_name(v));
    int by_value;
    if (s[1].kind == CV_STR && s[1].u.s.n == 3 && !memcmp(s[1].u.s.p, "key", 3)) by_value = 0;
    else if (s[1].kind == CV_STR && s[1].u.s.n == 5 && !memcmp(s[1].u.s.p, "value", 5)) by_value = 1;
    else return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "You can only sort by either \"key\" or \"value\"");
    const lm__cv_dict *d = v->u.d;
    lm__cv *pairs = d->n ? lm__crt_alloc(c, at, (size_t)d->n * sizeof *pairs) : NULL;
    lm__cv *keys = d->n ? lm__crt_alloc(c, at, (size_t)d->n * sizeof *keys) : NULL;
    if (d->n && (!pairs || !keys)) return -1;
    for (int64_t i = 0; i < d->n; i++) {
        lm__cv_list *p = lm__crt_list(c, at, 2, CL_TUPLE);
        if (!p) return -1;
        p->v[0] = d->k[i], p->v[1] = d->v[i];
        pairs[i] = lm__cv_of_list(p);
        keys[i] = by_value ? d->v[i] : d->k[i];
        if (!lm__cv_truthy(&s[0]) && keys[i].kind == CV_STR && lm__cstr_case(c, at, &keys[i], CC_LOWER, &keys[i])) return -1;
    }
    return sorted_copy(c, at, pairs, keys, d->n, lm__cv_truthy(&s[2]), out);
}

static int f_join(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cargs *a, lm__cv *out) {
    static const char *const names[] = {"d", "attribute"};
    lm__cv defs[2] = {lm__cv_str("", 0), lm__cv_none()}, s[2], sep;
    int g[2];
    if (bindf(c, at, "filter 'join'", a, names, 2, 0, defs, s, g) || to_str(c, at, &s[0], &sep)) return -1;
    const lm__cv *items;
    int64_t n;
    if (lm__cv_iter(c, at, v, &items, &n)) return -1;
    lm__csink sink = {0};
    for (int64_t i = 0; i < n; i++) {
        lm__cv x = items[i];
        if (s[1].kind != CV_NONE && attr_get(c, at, &items[i], &s[1], &x)) return -1;
        if (i && lm__csink_put(c, at, &sink, sep.u.s.p, sep.u.s.n)) return -1;
        if (lm__cv_write_str(c, at, &x, &sink)) return -1;
    }
    *out = lm__csink_value(&sink);
    return 0;
}

static int f_items(lm__crt *c, const lm__cnode *at, const lm__cv *v, lm__cv *out) {
    if (v->kind == CV_UNDEF) return gen_of(c, at, NULL, 0, "generator", out);
    if (v->kind != CV_DICT) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "Can only get item pairs from a mapping.");
    const lm__cv_dict *d = v->u.d;
    lm__cv *pairs = d->n ? lm__crt_alloc(c, at, (size_t)d->n * sizeof *pairs) : NULL;
    if (d->n && !pairs) return -1;
    for (int64_t i = 0; i < d->n; i++) {
        lm__cv_list *p = lm__crt_list(c, at, 2, CL_TUPLE);
        if (!p) return -1;
        p->v[0] = d->k[i], p->v[1] = d->v[i];
        pairs[i] = lm__cv_of_list(p);
    }
    return gen_of(c, at, pairs, d->n, "generator", out);
}

static int f_abs(lm__crt *c, const lm__cnode *at, const lm__cv *v, lm__cv *out) {
    if (v->kind == CV_UNDEF) return undefined_fail(c, at, v);
    if (v->kind == CV_FLOAT) *out = lm__cv_float(fabs(v->u.f));
    else if (is_int(v)) {
        if (ival(v) == INT64_MIN) return lm__crt_fail(c, at, LM_UNSUPPORTED, "integer overflow (64-bit)");
        *out = lm__cv_int(ival(v) < 0 ? -ival(v) : ival(v));
    } else {
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "bad operand type for abs(): '%s'", lm__cv_type_name(v));
    }
    return 0;
}

static int f_wordcount(lm__crt *c, const lm__cnode *at, const lm__cv *v, lm__cv *out) {
    lm__cv s;
    if (to_str(c, at, v, &s)) return -1;
    int64_t words = 0;
    int in_word = 0;
    for (size_t i = 0; i < s.u.s.n;) {
        size_t len;
        uint32_t cp = lm__cutf8_get(s.u.s.p + i, &len);
        i += len;
        utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
        int w = cp == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
        if (w && !in_word) words++;
        in_word = w;
    }
    *out = lm__cv_int(words);
    return 0;
}

int lm__chat_filter(lm__crt *c, const lm__cnode *at, int id, const lm__cv *v, const lm__cargs *a, lm__cv *out) {
    lm__cv s[4], t;
    if (v->kind == CV_STR && lm__crt_charge(c, at, (int64_t)(v->u.s.n / 64))) return -1;
    int g[4];
    char what[48];
    snprintf(what, sizeof what, "filter '%s'", id >= 0 && id < FL_N ? k_filters[id] : "?");
    static const char *const none[] = {NULL};
    switch (id) {
    case FL_ABS: return bindf(c, at, what, a, none, 0, 0, NULL, s, g) ? -1 : f_abs(c, at, v, out);
    case FL_ATTR: {
        static const char *const names[] = {"name"};
        if (bindf(c, at, what, a, names, 1, 1, NULL, s, g)) return -1;
        if (v->kind == CV_UNDEF) return undefined_fail(c, at, v);
        if (s[0].kind != CV_STR) {
            *out = lm__cv_undef("attribute name must be a string");
            return 0;
        }
        return lm__chat_getattr(c, at, v, s[0].u.s.p, s[0].u.s.n, out);
    }
    case FL_CAPITALIZE:
    case FL_LOWER:
    case FL_UPPER:
    case FL_TITLE: {
        static const lm__ccase mode[FL_N] = {[FL_CAPITALIZE] = CC_CAPITALIZE, [FL_LOWER] = CC_LOWER,
                                             [FL_UPPER] = CC_UPPER, [FL_TITLE] = CC_JINJA_TITLE};
        if (bindf(c, at, what, a, none, 0, 0, NULL, s, g) || to_str(c, at, v, &t)) return -1;
        return lm__cstr_case(c, at, &t, mode[id], out);
    }
    case FL_CENTER: {
        static const char *const names[] = {"width"};
        lm__cv def = lm__cv_int(80);
        if (bindf(c, at, what, a, names, 1, 0, &def, s, g) || to_str(c, at, v, &t)) return -1;
        lm__cargs margs = {.n = 1, .v = s};
        return lm__chat_method_call(c, at, &t, lm__chat_method_id(&t, "center", 6), &margs, out);
    }
    case FL_COUNT:
    case FL_LENGTH: {
        int64_t n;
        if (bindf(c, at, what, a, none, 0, 0, NULL, s, g) || lm__cv_len(c, at, v, &n)) return -1;
        *out = lm__cv_int(n);
        return 0;
    }
    case FL_D:
    case FL_DEFAULT: {
        static const char *const names[] = {"default_value", "boolean"};
        lm__cv defs[2] = {lm__cv_str("", 0), lm__cv_bool(0)};
        if (bindf(c, at, what, a, names, 2, 0, defs, s, g)) return -1;
        *out = v->kind == CV_UNDEF || (lm__cv_truthy(&s[1]) && !lm__cv_truthy(v)) ? s[0] : *v;
        return 0;
    }
    case FL_DICTSORT: return f_dictsort(c, at, v, a, out);
    case FL_FIRST:
    case FL_LAST:
        if (bindf(c, at, what, a, none, 0, 0, NULL, s, g)) return -1;
        return f_first_last(c, at, id == FL_LAST, v, out);
    case FL_FLOAT: return f_float(c, at, v, a, out);
    case FL_INDENT: return f_indent(c, at, v, a, out);
    case FL_INT: return f_int(c, at, v, a, out);
    case FL_ITEMS:
        if (bindf(c, at, what, a, none, 0, 0, NULL, s, g)) return -1;
        return f_items(c, at, v, out);
    case FL_JOIN: return f_join(c, at, v, a, out);
    case FL_LIST: {
        const lm__cv *items;
        int64_t n;
        if (bindf(c, at, what, a, none, 0, 0, NULL, s, g) || lm__cv_iter(c, at, v, &items, &n)) return -1;
        lm__cv_list *l = lm__crt_list(c, at, n, CL_LIST);
        if (!l) return -1;
        if (n) memcpy(l->v, items, (size_t)n * sizeof *l->v);
        *out = lm__cv_of_list(l);
        return 0;
    }
    case FL_MAP: return f_map(c, at, v, a, out);
    case FL_MAX:
    case FL_MIN: return f_minmax(c, at, id == FL_MAX, v, a, out);
    case FL_REJECT:
    case FL_REJECTATTR:
    case FL_SELECT:
    case FL_SELECTATTR: return f_select(c, at, id, v, a, out);
    case FL_REPLACE: {
        static const char *const names[] = {"old", "new", "count"};
        lm__cv o, n;
        if (bindf(c, at, what, a, names, 3, 2, NULL, s, g) || to_str(c, at, v, &t) || to_str(c, at, &s[0], &o) ||
            to_str(c, at, &s[1], &n))
            return -1;
        int64_t count = -1;
        if (s[2].kind != CV_NONE) {
            if (!is_int(&s[2]))
                return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "'%s' object cannot be interpreted as an integer", lm__cv_type_name(&s[2]));
            count = ival(&s[2]);
        }
        return lm__cstr_replace(c, at, &t, &o, &n, count, out);
    }
    case FL_REVERSE:
        if (bindf(c, at, what, a, none, 0, 0, NULL, s, g)) return -1;
        return f_reverse(c, at, v, out);
    case FL_ROUND: return f_round(c, at, v, a, out);
    case FL_SAFE:
    case FL_STRING:
        if (bindf(c, at, what, a, none, 0, 0, NULL, s, g)) return -1;
        return to_str(c, at, v, out);
    case FL_SORT: return f_sort(c, at, v, a, out);
    case FL_SUM: return f_sum(c, at, v, a, out);
    case FL_TOJSON: return f_tojson(c, at, v, a, out);
    case FL_TRIM: {
        static const char *const names[] = {"chars"};
        if (bindf(c, at, what, a, names, 1, 0, NULL, s, g) || to_str(c, at, v, &t)) return -1;
        if (s[0].kind != CV_NONE && s[0].kind != CV_STR)
            return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "strip arg must be None or str");
        return lm__cstr_strip(c, at, &t, s[0].kind == CV_STR ? &s[0] : NULL, 1, 1, out);
    }
    case FL_UNIQUE: return f_unique(c, at, v, a, out);
    case FL_WORDCOUNT:
        if (bindf(c, at, what, a, none, 0, 0, NULL, s, g)) return -1;
        return f_wordcount(c, at, v, out);
    default: return lm__crt_fail(c, at, LM_INTERNAL, "unknown filter id %d", id);
    }
}

/* ---- tests ------------------------------------------------------------------------------------------ */
static int mod2(lm__crt *c, const lm__cnode *at, const lm__cv *v, int64_t div, int *rem_zero, int *rem_one) {
    if (v->kind == CV_UNDEF) return undefined_fail(c, at, v);
    if (is_int(v)) {
        if (div == 0) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "integer modulo by zero");
        int64_t m = ival(v) % div;
        if (m != 0 && ((m < 0) != (div < 0))) m += div;
        *rem_zero = m == 0;
        *rem_one = m == 1;
        return 0;
    }
    if (v->kind == CV_FLOAT) {
        if (div == 0) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "float modulo");
        double m = fmod(v->u.f, (double)div);
        if (m != 0 && ((m < 0) != (div < 0))) m += (double)div;
        *rem_zero = m == 0;
        *rem_one = m == 1;
        return 0;
    }
    return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "unsupported operand type(s) for %%: '%s' and 'int'", lm__cv_type_name(v));
}

int lm__chat_test(lm__crt *c, const lm__cnode *at, int id, const lm__cv *v, const lm__cargs *a, int *out) {
    static const char *const none[] = {NULL};
    static const char *const other[] = {"other"};
    static const char *const seq[] = {"seq"};
    static const char *const num[] = {"num"};
    lm__cv s[1];
    int g[1], z = 0, one = 0;
    char what[48];
    snprintf(what, sizeof what, "test '%s'", id >= 0 && id < TS_N ? k_tests[id] : "?");
    const char *const *names = none;
    int nn = 0;
    switch (id) {
    case TS_DIVISIBLEBY: names = num, nn = 1; break;
    case TS_IN: names = seq, nn = 1; break;
    case TS_EQ: case TS_EQUALTO: case TS_NE: case TS_GE: case TS_GT: case TS_GREATERTHAN: case TS_LE: case TS_LT:
    case TS_LESSTHAN: case TS_SAMEAS: names = other, nn = 1; break;
    default: break;
    }
    if (bindf(c, at, what, a, names, nn, nn, NULL, s, g)) return -1;
    switch (id) {
    case TS_BOOLEAN: *out = v->kind == CV_BOOL; return 0;
    case TS_CALLABLE: *out = v->kind == CV_FUNC || v->kind == CV_UNDEF; return 0; /* Undefined has __call__ */
    case TS_DEFINED: *out = v->kind != CV_UNDEF; return 0;
    case TS_UNDEFINED: *out = v->kind == CV_UNDEF; return 0;
    case TS_DIVISIBLEBY:
        if (!is_int(&s[0]))
            return lm__crt_fail(c, at, LM_UNSUPPORTED, "divisibleby with a %s divisor", lm__cv_type_name(&s[0]));
        if (mod2(c, at, v, ival(&s[0]), &z, &one)) return -1;
        *out = z;
        return 0;
    case TS_EVEN:
    case TS_ODD:
        if (mod2(c, at, v, 2, &z, &one)) return -1;
        *out = id == TS_EVEN ? z : one;
        return 0;
    case TS_EQ:
    case TS_EQUALTO:
    case TS_NE: {
        int r = lm__cv_eq(c, at, v, &s[0]);
        if (r < 0) return -1;
        *out = id == TS_NE ? !r : r;
        return 0;
    }
    case TS_GE:
    case TS_GT:
    case TS_GREATERTHAN:
    case TS_LE:
    case TS_LT:
    case TS_LESSTHAN: {
        int op = id == TS_GE ? CMP_GE : id == TS_LE ? CMP_LE : (id == TS_GT || id == TS_GREATERTHAN) ? CMP_GT : CMP_LT;
        int r = lm__cv_compare(c, at, v, &s[0], op);
        if (r < 0) return -1;
        *out = r;
        return 0;
    }
    case TS_IN: {
        int r = lm__cv_contains(c, at, &s[0], v);
        if (r < 0) return -1;
        *out = r;
        return 0;
    }
    case TS_FALSE: *out = v->kind == CV_BOOL && !v->u.b; return 0;
    case TS_TRUE: *out = v->kind == CV_BOOL && v->u.b; return 0;
    case TS_FLOAT: *out = v->kind == CV_FLOAT; return 0;
    case TS_INTEGER: *out = v->kind == CV_INT; return 0;
    case TS_NUMBER: *out = v->kind == CV_INT || v->kind == CV_BOOL || v->kind == CV_FLOAT; return 0;
    case TS_STRING: *out = v->kind == CV_STR; return 0;
    case TS_NONE: *out = v->kind == CV_NONE; return 0;
    case TS_MAPPING: *out = v->kind == CV_DICT; return 0;
    case TS_ITERABLE:
        *out = v->kind == CV_LIST || v->kind == CV_DICT || v->kind == CV_STR || v->kind == CV_RANGE ||
               v->kind == CV_UNDEF || v->kind == CV_LOOP;
        return 0;
    case TS_SEQUENCE:
        *out = v->kind == CV_STR || v->kind == CV_DICT || v->kind == CV_RANGE || v->kind == CV_UNDEF ||
               (v->kind == CV_LIST && (v->u.l->kind == CL_LIST || v->u.l->kind == CL_TUPLE));
        return 0;
    case TS_LOWER:
    case TS_UPPER: {
        lm__cv t, r;
        if (to_str(c, at, v, &t)) return -1;
        lm__cargs none_args = {0};
        int mid = lm__chat_method_id(&t, id == TS_LOWER ? "islower" : "isupper", 7);
        if (lm__chat_method_call(c, at, &t, mid, &none_args, &r)) return -1;
        *out = r.u.b;
        return 0;
    }
    case TS_SAMEAS: {
        const lm__cv *o = &s[0];
        if (v->kind != o->kind) *out = 0;
        else if (v->kind == CV_NONE || v->kind == CV_UNDEF) *out = v->kind == CV_NONE;
        else if (v->kind == CV_BOOL) *out = v->u.b == o->u.b;
        else if (v->kind == CV_INT) *out = v->u.i == o->u.i && v->u.i >= -5 && v->u.i <= 256; /* CPython's small ints */
        else if (v->kind == CV_STR) *out = v->u.s.p == o->u.s.p && v->u.s.n == o->u.s.n;
        else if (v->kind == CV_FLOAT) *out = 0;
        else *out = v->u.l == o->u.l; /* same object (pointer identity for every reference kind) */
        return 0;
    }
    default: return lm__crt_fail(c, at, LM_INTERNAL, "unknown test id %d", id);
    }
}

/* ---- globals ------------------------------------------------------------------------------------------ */
static int as_index(lm__crt *c, const lm__cnode *at, const lm__cv *v, int64_t *out) {
    if (v->kind == CV_UNDEF) return undefined_fail(c, at, v);
    if (!is_int(v))
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "'%s' object cannot be interpreted as an integer", lm__cv_type_name(v));
    *out = ival(v);
    return 0;
}

static int g_range(lm__crt *c, const lm__cnode *at, const lm__cargs *a, lm__cv *out) {
    if (a->nkw) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "range() takes no keyword arguments");
    if (a->n < 1) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "range expected at least 1 argument, got 0");
    if (a->n > 3) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "range expected at most 3 arguments, got %d", a->n);
    int64_t start = 0, stop = 0, step = 1;
    if (a->n == 1) {
        if (as_index(c, at, &a->v[0], &stop)) return -1;
    } else if (as_index(c, at, &a->v[0], &start) || as_index(c, at, &a->v[1], &stop) ||
               (a->n == 3 && as_index(c, at, &a->v[2], &step))) {
        return -1;
    }
    if (step == 0) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "range() arg 3 must not be zero");
    uint64_t n = 0;
    if (step > 0 && start < stop) n = ((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)step + 1;
    else if (step < 0 && start > stop) n = ((uint64_t)start - (uint64_t)stop - 1) / (0 - (uint64_t)step) + 1;
    if (n > MAX_RANGE)
        return lm__crt_fail(c, at, LM_OUT_OF_RANGE,
                            "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
    lm__cv_range *r = lm__crt_alloc(c, at, sizeof *r);
    if (!r) return -1;
    r->start = start, r->stop = stop, r->step = step, r->n = (int64_t)n;
    *out = (lm__cv){.kind = CV_RANGE, .u.r = r};
    return 0;
}

/* dict(*args, **kwargs) — also namespace()'s constructor. */
static int g_dict(lm__crt *c, const lm__cnode *at, const lm__cargs *a, int ns, lm__cv *out) {
    const char *name = ns ? "namespace" : "dict";
    if (a->n > 1) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "%s expected at most 1 argument, got %d", name, a->n);
    lm__cv_dict *d = lm__crt_dict(c, at, a->nkw);
    if (!d) return -1;
    if (a->n == 1) {
        const lm__cv *src = &a->v[0];
        if (src->kind == CV_DICT) {
            for (int64_t i = 0; i < src->u.d->n; i++)
                if (lm__crt_dict_set(c, at, d, src->u.d->k[i], src->u.d->v[i])) return -1;
        } else {
            const lm__cv *items;
            int64_t n;
            if (lm__cv_iter(c, at, src, &items, &n)) return -1;
            for (int64_t i = 0; i < n; i++) {
                const lm__cv *pair;
                int64_t pn = 0;
                if (items[i].kind == CV_LIST || items[i].kind == CV_STR) {
                    if (lm__cv_iter(c, at, &items[i], &pair, &pn)) return -1;
                }
                if (pn != 2)
                    return lm__crt_fail(c, at, LM_INVALID_ARGUMENT,
                                        "dictionary update sequence element #%lld has length %lld; 2 is required",
                                        (long long)i, (long long)pn);
                if ((pair[0].kind == CV_LIST && pair[0].u.l->kind != CL_TUPLE) || pair[0].kind == CV_DICT)
                    return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "unhashable type: '%s'", lm__cv_type_name(&pair[0]));
                if (lm__crt_dict_set(c, at, d, pair[0], pair[1])) return -1;
            }
        }
    }
    for (int k = 0; k < a->nkw; k++)
        if (lm__crt_dict_set(c, at, d, lm__cv_str(a->kw[k], strlen(a->kw[k])), a->v[a->n + k])) return -1;
    *out = (lm__cv){.kind = ns ? CV_NS : CV_DICT, .u.d = d};
    return 0;
}

/* strftime on the current local time, as datetime.now().strftime does (%f microseconds;
 * %z and %Z empty for a naive datetime). */
static int g_strftime_now(lm__crt *c, const lm__cnode *at, const lm__cargs *a, lm__cv *out) {
    static const char *const names[] = {"format"};
    lm__cv s[1];
    int g[1];
    if (bindf(c, at, "strftime_now()", a, names, 1, 1, NULL, s, g)) return -1;
    if (s[0].kind != CV_STR)
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "strftime() argument 1 must be str, not %s", lm__cv_type_name(&s[0]));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    time_t now = ts.tv_sec;
    struct tm tm;
    localtime_r(&now, &tm);
    lm__csink sink = {0};
    const char *p = s[0].u.s.p;
    size_t n = s[0].u.s.n;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '%' || i + 1 >= n) {
            if (lm__csink_putc(c, at, &sink, p[i])) return -1;
            continue;
        }
        char spec = p[++i], buf[128];
        size_t len = 0;
        if (spec == 'f') len = (size_t)snprintf(buf, sizeof buf, "%06ld", (long)(ts.tv_nsec / 1000));
        else if (spec == 'z' || spec == 'Z') len = 0;
        else if (spec == '%') buf[0] = '%', len = 1;
        else {
            char fmt[4] = {'%', spec, 0, 0};
            if (spec == 'E' || spec == 'O') { /* modifiers take the next character too */
                if (i + 1 < n) fmt[2] = p[++i];
            }
            len = strftime(buf, sizeof buf, fmt, &tm);
        }
        if (lm__csink_put(c, at, &sink, buf, len)) return -1;
    }
    *out = lm__csink_value(&sink);
    return 0;
}

int lm__chat_global_call(lm__crt *c, const lm__cnode *at, int id, const lm__cargs *a, lm__cv *out) {
    switch (id) {
    case CG_RANGE: return g_range(c, at, a, out);
    case CG_DICT: return g_dict(c, at, a, 0, out);
    case CG_NAMESPACE: return g_dict(c, at, a, 1, out);
    case CG_RAISE_EXCEPTION: {
        static const char *const names[] = {"message"};
        lm__cv s[1], m;
        int g[1];
        if (bindf(c, at, "raise_exception()", a, names, 1, 1, NULL, s, g) || lm__cv_to_str(c, at, &s[0], &m)) return -1;
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "%.*s", (int)LM_MIN(m.u.s.n, 900), m.u.s.p);
    }
    case CG_STRFTIME_NOW: return g_strftime_now(c, at, a, out);
    default:
        return lm__crt_fail(c, at, LM_UNSUPPORTED, "unsupported global function '%s'", lm__chat_global_names[id]);
    }
}
