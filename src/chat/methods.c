/* chat/methods.c — the methods templates call on values: str (split, strip,
 * startswith, replace, ...), dict (items, keys, values, get, copy), list and tuple
 * (count, index, copy), range (count, index) and the loop variable (cycle, changed),
 * with Python's semantics on code points, plus the string helpers filters share.
 *
 * The immutable sandbox refuses list and dict methods that mutate (append, update,
 * pop, ...): looking them up gives -3 and the caller makes the Undefined Jinja makes,
 * whose use raises "access to attribute 'append' of 'list' object is unsafe.". Python
 * methods loom does not implement (str.format, str.translate, ...) give -2 and fail
 * the render naming them. Anything else is not a method (-1): a dict key or Undefined.
 */
#include "chat/internal.h"

#include <stdio.h>
#include <string.h>
#include <utf8proc.h>

typedef enum mid {
    S_CAPITALIZE, S_CASEFOLD, S_CENTER, S_COUNT, S_ENDSWITH, S_FIND, S_INDEX, S_ISALNUM, S_ISALPHA, S_ISASCII,
    S_ISDECIMAL, S_ISDIGIT, S_ISLOWER, S_ISNUMERIC, S_ISPRINTABLE, S_ISSPACE, S_ISTITLE, S_ISUPPER, S_JOIN, S_LJUST,
    S_LOWER, S_LSTRIP, S_PARTITION, S_REMOVEPREFIX, S_REMOVESUFFIX, S_REPLACE, S_RFIND, S_RINDEX, S_RJUST,
    S_RPARTITION, S_RSPLIT, S_RSTRIP, S_SPLIT, S_SPLITLINES, S_STARTSWITH, S_STRIP, S_SWAPCASE, S_TITLE, S_UPPER,
    S_ZFILL,
    D_ITEMS, D_KEYS, D_VALUES, D_GET, D_COPY,
    L_COUNT, L_INDEX, L_COPY,
    LOOP_CYCLE, LOOP_CHANGED,
    M_COUNT
} mid;

static const char *const k_names[M_COUNT] = {
    "capitalize", "casefold", "center", "count", "endswith", "find", "index", "isalnum", "isalpha", "isascii",
    "isdecimal", "isdigit", "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust",
    "lower", "lstrip", "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust",
    "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title", "upper",
    "zfill",
    "items", "keys", "values", "get", "copy",
    "count", "index", "copy",
    "cycle", "changed",
};

static const char *const k_str_unsupported[] = {"encode", "expandtabs", "format", "format_map", "isidentifier",
                                                "maketrans", "translate", NULL};
static const char *const k_dict_unsafe[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
static const char *const k_list_unsafe[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort", NULL};

const char *lm__chat_method_name(int id) { return id >= 0 && id < M_COUNT ? k_names[id] : "?"; }

static int eq_name(const char *lit, const char *name, size_t n) { return strlen(lit) == n && memcmp(lit, name, n) == 0; }

static int in_list(const char *const *list, const char *name, size_t n) {
    for (int i = 0; list[i]; i++)
        if (eq_name(list[i], name, n)) return 1;
    return 0;
}

static int find_in(int lo, int hi, const char *name, size_t n) {
    for (int i = lo; i <= hi; i++)
        if (eq_name(k_names[i], name, n)) return i;
    return -1;
}

int lm__chat_method_id(const lm__cv *self, const char *name, size_t n) {
    switch (self->kind) {
    case CV_STR: {
        int id = find_in(S_CAPITALIZE, S_ZFILL, name, n);
        if (id >= 0) return id;
        return in_list(k_str_unsupported, name, n) ? -2 : -1;
    }
    case CV_DICT: {
        int id = find_in(D_ITEMS, D_COPY, name, n);
        if (id >= 0) return id;
        if (in_list(k_dict_unsafe, name, n)) return -3;
        return eq_name("fromkeys", name, n) ? -2 : -1;
    }
    case CV_LIST:
        if (self->u.l->kind == CL_LIST) {
            int id = find_in(L_COUNT, L_COPY, name, n);
            if (id >= 0) return id;
            return in_list(k_list_unsafe, name, n) ? -3 : -1;
        }
        if (self->u.l->kind == CL_TUPLE) return find_in(L_COUNT, L_INDEX, name, n);
        return -1;
    case CV_RANGE: return find_in(L_COUNT, L_INDEX, name, n);
    case CV_LOOP: return find_in(LOOP_CYCLE, LOOP_CHANGED, name, n);
    default: return -1;
    }
}

/* ---- string helpers ------------------------------------------------------------------------ */
static int type_error(lm__crt *c, const lm__cnode *at, const char *fmt, const lm__cv *v) {
    return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, fmt, lm__cv_type_name(v));
}

/* A buffer for a string transform that may grow the text by at most 1.5x + 4 bytes. */
static char *grow_buf(lm__crt *c, const lm__cnode *at, size_t n) {
    if (n > SIZE_MAX / 4) return NULL;
    return lm__crt_alloc(c, at, n * 2 + 8);
}

static int is_jinja_title_sep(uint32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || lm__cuni_space(cp);
}

static int cat_upper(uint32_t cp) {
    if (cp < 0x80) return cp >= 'A' && cp <= 'Z';
    return utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_LU;
}
static int cat_lower(uint32_t cp) {
    if (cp < 0x80) return cp >= 'a' && cp <= 'z';
    return utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_LL;
}
static int cat_title(uint32_t cp) {
    return cp >= 0x80 && utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_LT;
}

/* CPython's unconditional one-to-many case mappings (SpecialCasing.txt) for the
 * characters templates may meet: the sharp s, the Latin ligatures, 'ŉ' and 'İ'. Writes
 * the mapping of cp to out and returns its length, or 0 when cp maps one-to-one. */
static size_t special_case(uint32_t cp, int upper, int title, char *out) {
    static const struct {
        uint32_t cp;
        const char *upper, *title, *lower;
    } k_special[] = {
        {0x00DF, "SS", "Ss", NULL},       {0xFB00, "FF", "Ff", NULL},    {0xFB01, "FI", "Fi", NULL},
        {0xFB02, "FL", "Fl", NULL},       {0xFB03, "FFI", "Ffi", NULL},  {0xFB04, "FFL", "Ffl", NULL},
        {0xFB05, "ST", "St", NULL},       {0xFB06, "ST", "St", NULL},    {0x0149, "\xca\xbcN", "\xca\xbcN", NULL},
        {0x0130, NULL, NULL, "i\xcc\x87"},
    };
    for (size_t i = 0; i < sizeof k_special / sizeof k_special[0]; i++) {
        if (k_special[i].cp != cp) continue;
        const char *m = title ? k_special[i].title : upper ? k_special[i].upper : k_special[i].lower;
        if (!m) return 0;
        size_t n = strlen(m);
        memcpy(out, m, n);
        return n;
    }
    return 0;
}

enum { ACT_KEEP, ACT_UPPER, ACT_LOWER, ACT_TITLE };

/* Appends the case mapping act of cp to out; returns the bytes written. */
static size_t map_case(uint32_t cp, int act, char *out) {
    if (act == ACT_KEEP) return lm__cutf8_put(cp, out);
    if (cp >= 0x80) {
        size_t n = special_case(cp, act == ACT_UPPER, act == ACT_TITLE, out);
        if (n) return n;
    }
    uint32_t m = act == ACT_UPPER ? lm__cuni_upper(cp) : act == ACT_LOWER ? lm__cuni_lower(cp) : lm__cuni_title(cp);
    return lm__cutf8_put(m, out);
}

int lm__cstr_case(lm__crt *c, const lm__cnode *at, const lm__cv *s, lm__ccase mode, lm__cv *out) {
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    char *buf = grow_buf(c, at, n);
    if (!buf) return -1;
    size_t o = 0;
    int prev_cased = 0, first = 1, word_start = 1;
    for (size_t i = 0; i < n;) {
        size_t len;
        uint32_t cp = lm__cutf8_get(p + i, &len);
        int act;
        switch (mode) {
        case CC_UPPER: act = ACT_UPPER; break;
        case CC_LOWER: act = ACT_LOWER; break;
        case CC_TITLE: /* Python's str.title: title case after an uncased character */
            act = prev_cased ? ACT_LOWER : ACT_TITLE;
            prev_cased = lm__cuni_cased(cp);
            break;
        case CC_CAPITALIZE: act = first ? ACT_TITLE : ACT_LOWER; break;
        case CC_SWAPCASE: act = cat_upper(cp) ? ACT_LOWER : cat_lower(cp) ? ACT_UPPER : ACT_KEEP; break;
        default: /* Jinja's title filter: upper after a run of [-\s({[<], lower elsewhere */
            if (is_jinja_title_sep(cp)) {
                act = ACT_KEEP;
                word_start = 1;
            } else {
                act = word_start ? ACT_UPPER : ACT_LOWER;
                word_start = 0;
            }
        }
        first = 0;
        o += map_case(cp, act, buf + o);
        i += len;
    }
    if ((int64_t)o > c->max_str) return lm__crt_fail(c, at, LM_OUT_OF_RANGE, "string too long (LM_CHAT_LIMIT_STRING_BYTES)");
    *out = lm__cv_str(buf, o);
    return 0;
}

static int in_chars(uint32_t cp, const lm__cv *chars) {
    if (!chars) return lm__cuni_space(cp);
    for (size_t i = 0; i < chars->u.s.n;) {
        size_t len;
        if (lm__cutf8_get(chars->u.s.p + i, &len) == cp) return 1;
        i += len;
    }
    return 0;
}

int lm__cstr_strip(lm__crt *c, const lm__cnode *at, const lm__cv *s, const lm__cv *chars, int left, int right,
                   lm__cv *out) {
    const char *p = s->u.s.p;
    size_t b = 0, e = s->u.s.n;
    if (left)
        while (b < e) {
            size_t len;
            uint32_t cp = lm__cutf8_get(p + b, &len);
            if (!in_chars(cp, chars)) break;
            b += len;
        }
    if (right)
        while (e > b) {
            size_t start = e - 1, len;
            while (start > b && ((unsigned char)p[start] & 0xC0) == 0x80) start--;
            uint32_t cp = lm__cutf8_get(p + start, &len);
            if (!in_chars(cp, chars)) break;
            e = start;
        }
    *out = lm__cv_str(p + b, e - b);
    return 0;
}

static const char *memfind(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd[0] && memcmp(h + i, nd, nn) == 0) return h + i;
    return NULL;
}

static const char *memrfind(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn > hn) return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (memcmp(h + i, nd, nn) == 0) return h + i;
    return NULL;
}

int lm__cstr_replace(lm__crt *c, const lm__cnode *at, const lm__cv *s, const lm__cv *old, const lm__cv *new_,
                     int64_t count, lm__cv *out) {
    const char *p = s->u.s.p, *op = old->u.s.p, *np = new_->u.s.p;
    size_t n = s->u.s.n, on = old->u.s.n, nn = new_->u.s.n;
    lm__csink sink = {0};
    if (count < 0) count = INT64_MAX;
    if (on == 0) { /* before every code point and at the end */
        size_t i = 0;
        while (count > 0) {
            if (lm__csink_put(c, at, &sink, np, nn)) return -1;
            count--;
            if (i >= n) break;
            size_t len;
            lm__cutf8_get(p + i, &len);
            if (lm__csink_put(c, at, &sink, p + i, len)) return -1;
            i += len;
        }
        if (lm__csink_put(c, at, &sink, p + i, n - i)) return -1;
        *out = lm__csink_value(&sink);
        return 0;
    }
    size_t i = 0;
    while (count > 0) {
        const char *hit = memfind(p + i, n - i, op, on);
        if (!hit) break;
        size_t k = (size_t)(hit - p);
        if (lm__csink_put(c, at, &sink, p + i, k - i) || lm__csink_put(c, at, &sink, np, nn)) return -1;
        i = k + on;
        count--;
    }
    if (i == 0) {
        *out = *s;
        return 0;
    }
    if (lm__csink_put(c, at, &sink, p + i, n - i)) return -1;
    *out = lm__csink_value(&sink);
    return 0;
}

static int is_line_break(uint32_t cp) {
    return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
           cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

/* A growable list in the render arena. */
typedef struct lbuf {
    lm__cv *v;
    int64_t n, cap;
} lbuf;

static int lbuf_push(lm__crt *c, const lm__cnode *at, lbuf *b, lm__cv v) {
    if (b->n == b->cap) {
        int64_t cap = b->cap ? 2 * b->cap : 8;
        lm__cv *q = lm__crt_alloc(c, at, (size_t)cap * sizeof *q);
        if (!q) return -1;
        if (b->n) memcpy(q, b->v, (size_t)b->n * sizeof *q);
        b->v = q, b->cap = cap;
    }
    b->v[b->n++] = v;
    return 0;
}

static int lbuf_value(lm__crt *c, const lm__cnode *at, const lbuf *b, lm__cl_kind kind, lm__cv *out) {
    lm__cv_list *l = lm__crt_list(c, at, 0, kind);
    if (!l) return -1;
    l->v = b->v;
    l->n = b->n;
    *out = lm__cv_of_list(l);
    return 0;
}

int lm__cstr_splitlines(lm__crt *c, const lm__cnode *at, const lm__cv *s, int keepends, lm__cv *out) {
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, start = 0, i = 0;
    lbuf b = {0};
    while (i < n) {
        size_t len;
        uint32_t cp = lm__cutf8_get(p + i, &len);
        if (!is_line_break(cp)) {
            i += len;
            continue;
        }
        size_t end = i + len;
        if (cp == '\r' && end < n && p[end] == '\n') end++;
        if (lbuf_push(c, at, &b, lm__cv_str(p + start, (keepends ? end : i) - start))) return -1;
        start = i = end;
    }
    if (start < n && lbuf_push(c, at, &b, lm__cv_str(p + start, n - start))) return -1;
    return lbuf_value(c, at, &b, CL_LIST, out);
}

/* Python's str.split / str.rsplit. sep NULL: runs of whitespace. */
static int str_split(lm__crt *c, const lm__cnode *at, const lm__cv *s, const lm__cv *sep, int64_t maxsplit, int right,
                     lm__cv *out) {
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    lbuf b = {0};
    if (maxsplit < 0) maxsplit = INT64_MAX;
    if (sep) {
        const char *sp = sep->u.s.p;
        size_t sn = sep->u.s.n;
        if (sn == 0) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "empty separator");
        if (!right) {
            size_t i = 0;
            while (maxsplit > 0) {
                const char *hit = memfind(p + i, n - i, sp, sn);
                if (!hit) break;
                if (lbuf_push(c, at, &b, lm__cv_str(p + i, (size_t)(hit - p) - i))) return -1;
                i = (size_t)(hit - p) + sn;
                maxsplit--;
            }
            if (lbuf_push(c, at, &b, lm__cv_str(p + i, n - i))) return -1;
        } else {
            size_t e = n;
            while (maxsplit > 0) {
                const char *hit = memrfind(p, e, sp, sn);
                if (!hit) break;
                size_t k = (size_t)(hit - p);
                if (lbuf_push(c, at, &b, lm__cv_str(p + k + sn, e - k - sn))) return -1;
                e = k;
                maxsplit--;
            }
            if (lbuf_push(c, at, &b, lm__cv_str(p, e))) return -1;
            for (int64_t i = 0, j = b.n - 1; i < j; i++, j--) {
                lm__cv t = b.v[i];
                b.v[i] = b.v[j];
                b.v[j] = t;
            }
        }
        return lbuf_value(c, at, &b, CL_LIST, out);
    }
    /* whitespace splitting: decode to code points once */
    int64_t count = lm__cutf8_count(p, n);
    size_t *off = lm__crt_alloc(c, at, (size_t)(count + 1) * sizeof *off);
    uint8_t *sp = lm__crt_alloc(c, at, (size_t)count + 1);
    if (!off || !sp) return -1;
    size_t i = 0;
    for (int64_t k = 0; k < count; k++) {
        size_t len;
        off[k] = i;
        sp[k] = (uint8_t)lm__cuni_space(lm__cutf8_get(p + i, &len));
        i += len;
    }
    off[count] = n;
    if (!right) {
        int64_t k = 0;
        while (k < count) {
            while (k < count && sp[k]) k++;
            if (k == count) break;
            if (maxsplit == 0) { /* the rest, trailing whitespace included (as CPython) */
                if (lbuf_push(c, at, &b, lm__cv_str(p + off[k], n - off[k]))) return -1;
                break;
            }
            int64_t j = k;
            while (j < count && !sp[j]) j++;
            if (lbuf_push(c, at, &b, lm__cv_str(p + off[k], off[j] - off[k]))) return -1;
            maxsplit--;
            k = j;
        }
    } else {
        int64_t k = count;
        while (k > 0) {
            while (k > 0 && sp[k - 1]) k--;
            if (k == 0) break;
            if (maxsplit == 0) { /* the rest, leading whitespace included (as CPython) */
                if (lbuf_push(c, at, &b, lm__cv_str(p, off[k]))) return -1;
                break;
            }
            int64_t j = k;
            while (j > 0 && !sp[j - 1]) j--;
            if (lbuf_push(c, at, &b, lm__cv_str(p + off[j], off[k] - off[j]))) return -1;
            maxsplit--;
            k = j;
        }
        for (int64_t x = 0, y = b.n - 1; x < y; x++, y--) {
            lm__cv t = b.v[x];
            b.v[x] = b.v[y];
            b.v[y] = t;
        }
    }
    return lbuf_value(c, at, &b, CL_LIST, out);
}

/* Byte range of the code point slice [start, end) of s (Python index adjustment). */
static void cp_range(const lm__cv *s, const lm__cv *start, const lm__cv *end, size_t *b, size_t *e) {
    int64_t len = lm__cutf8_count(s->u.s.p, s->u.s.n);
    int64_t lo = 0, hi = len;
    if (start && start->kind != CV_NONE) {
        lo = start->kind == CV_BOOL ? start->u.b : start->u.i;
        if (lo < 0) lo = LM_MAX(lo + len, 0);
        lo = LM_MIN(lo, len);
    }
    if (end && end->kind != CV_NONE) {
        hi = end->kind == CV_BOOL ? end->u.b : end->u.i;
        if (hi < 0) hi = LM_MAX(hi + len, 0);
        hi = LM_MIN(hi, len);
    }
    size_t i = 0;
    int64_t k = 0;
    *b = *e = s->u.s.n;
    for (; k <= len; k++) {
        if (k == lo) *b = i;
        if (k == hi) *e = i;
        if (k == len) break;
        size_t l;
        lm__cutf8_get(s->u.s.p + i, &l);
        i += l;
    }
    if (hi < lo) *e = *b;
}

static int check_int_or_none(lm__crt *c, const lm__cnode *at, const lm__cv *v, const char *what) {
    if (v->kind == CV_NONE || v->kind == CV_INT || v->kind == CV_BOOL) return 0;
    return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "slice indices of %s must be integers or None", what);
}

static int need_str(lm__crt *c, const lm__cnode *at, const lm__cv *v, const char *what) {
    if (v->kind == CV_STR) return 0;
    if (v->kind == CV_UNDEF)
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "%s", v->u.s.p ? v->u.s.p : "an undefined value was used");
    return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "%s argument must be str, not %s", what, lm__cv_type_name(v));
}

/* ---- the method call ------------------------------------------------------------------------ */
static int bind(lm__crt *c, const lm__cnode *at, const char *what, const lm__cargs *a, int npos_max, int nreq,
                const char *const *names, lm__cv *slot, int *given) {
    for (int i = 0; i < npos_max; i++) slot[i] = lm__cv_none(), given[i] = 0;
    if (lm__cargs_bind(c, at, what, a, names, npos_max, slot, given)) return -1;
    for (int i = 0; i < nreq; i++)
        if (!given[i])
            return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "%s missing required argument '%s'", what, names[i]);
    return 0;
}

static int str_find_like(lm__crt *c, const lm__cnode *at, const lm__cv *s, int id, const lm__cv *slot, lm__cv *out) {
    if (need_str(c, at, &slot[0], k_names[id]) || check_int_or_none(c, at, &slot[1], k_names[id]) ||
        check_int_or_none(c, at, &slot[2], k_names[id]))
        return -1;
    size_t b, e;
    cp_range(s, &slot[1], &slot[2], &b, &e);
    const char *h = s->u.s.p + b;
    size_t hn = e >= b ? e - b : 0;
    const lm__cv *sub = &slot[0];
    if (id == S_COUNT) {
        if (e < b) {
            *out = lm__cv_int(0);
            return 0;
        }
        int64_t k = 0;
        if (sub->u.s.n == 0) {
            k = lm__cutf8_count(h, hn) + 1;
        } else {
            for (size_t i = 0; i + sub->u.s.n <= hn;) {
                const char *hit = memfind(h + i, hn - i, sub->u.s.p, sub->u.s.n);
                if (!hit) break;
                k++;
                i = (size_t)(hit - h) + sub->u.s.n;
            }
        }
        *out = lm__cv_int(k);
        return 0;
    }
    int rev = id == S_RFIND || id == S_RINDEX;
    const char *hit = e < b ? NULL : rev ? memrfind(h, hn, sub->u.s.p, sub->u.s.n) : memfind(h, hn, sub->u.s.p, sub->u.s.n);
    if (!hit) {
        if (id == S_INDEX || id == S_RINDEX) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "substring not found");
        *out = lm__cv_int(-1);
        return 0;
    }
    *out = lm__cv_int(lm__cutf8_count(s->u.s.p, (size_t)(hit - s->u.s.p)));
    return 0;
}

static int affix_match(lm__crt *c, const lm__cnode *at, const char *h, size_t hn, const lm__cv *pre, int end, int *res) {
    if (pre->kind == CV_STR) {
        size_t n = pre->u.s.n;
        *res = n <= hn && memcmp(end ? h + hn - n : h, pre->u.s.p, n) == 0;
        return 0;
    }
    if (pre->kind == CV_LIST && pre->u.l->kind == CL_TUPLE) {
        *res = 0;
        for (int64_t i = 0; i < pre->u.l->n && !*res; i++) {
            const lm__cv *x = &pre->u.l->v[i];
            if (x->kind != CV_STR)
                return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "tuple for %s must only contain str, not %s",
                                    end ? "endswith" : "startswith", lm__cv_type_name(x));
            if (affix_match(c, at, h, hn, x, end, res)) return -1;
        }
        return 0;
    }
    return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "%s first arg must be str or a tuple of str, not %s",
                        end ? "endswith" : "startswith", lm__cv_type_name(pre));
}

/* Python's is*() predicates over every code point. */
static int str_pred(int id, const lm__cv *s) {
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    if (n == 0) return id == S_ISASCII || id == S_ISPRINTABLE;
    int cased = 0, prev_cased = 0;
    for (size_t i = 0; i < n;) {
        size_t len;
        uint32_t cp = lm__cutf8_get(p + i, &len);
        i += len;
        utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
        int alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
        int dec = cat == UTF8PROC_CATEGORY_ND;
        int num = dec || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
        switch (id) {
        case S_ISALNUM: if (!alpha && !num) return 0; break;
        case S_ISALPHA: if (!alpha) return 0; break;
        case S_ISASCII: if (cp >= 0x80) return 0; break;
        case S_ISDECIMAL:
        case S_ISDIGIT: if (!dec) return 0; break;
        case S_ISNUMERIC: if (!num) return 0; break;
        case S_ISPRINTABLE: if (!lm__cuni_printable(cp)) return 0; break;
        case S_ISSPACE: if (!lm__cuni_space(cp)) return 0; break;
        case S_ISLOWER:
            if (cat_upper(cp) || cat_title(cp)) return 0;
            if (cat_lower(cp)) cased = 1;
            break;
        case S_ISUPPER:
            if (cat_lower(cp) || cat_title(cp)) return 0;
            if (cat_upper(cp)) cased = 1;
            break;
        default: /* S_ISTITLE */
            if (cat_upper(cp) || cat_title(cp)) {
                if (prev_cased) return 0;
                prev_cased = cased = 1;
            } else if (cat_lower(cp)) {
                if (!prev_cased) return 0;
                prev_cased = cased = 1;
            } else {
                prev_cased = 0;
            }
        }
    }
    return id == S_ISLOWER || id == S_ISUPPER || id == S_ISTITLE ? cased : 1;
}

static int str_pad(lm__crt *c, const lm__cnode *at, const lm__cv *s, int id, const lm__cv *slot, lm__cv *out) {
    if (slot[0].kind != CV_INT && slot[0].kind != CV_BOOL)
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "'%s' object cannot be interpreted as an integer",
                            lm__cv_type_name(&slot[0]));
    int64_t width = slot[0].kind == CV_BOOL ? slot[0].u.b : slot[0].u.i;
    const char *fill = " ";
    size_t fill_n = 1;
    if (id != S_ZFILL && slot[1].kind != CV_NONE) {
        if (slot[1].kind != CV_STR || lm__cutf8_count(slot[1].u.s.p, slot[1].u.s.n) != 1)
            return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "The fill character must be exactly one character long");
        fill = slot[1].u.s.p, fill_n = slot[1].u.s.n;
    }
    int64_t len = lm__cutf8_count(s->u.s.p, s->u.s.n);
    if (width <= len) {
        *out = *s;
        return 0;
    }
    int64_t pad = width - len, left;
    if (lm__crt_charge(c, at, pad / 64)) return -1;
    if (width > c->max_str) return lm__crt_fail(c, at, LM_OUT_OF_RANGE, "string too long (LM_CHAT_LIMIT_STRING_BYTES)");
    if (id == S_CENTER) left = pad / 2 + (pad & width & 1);
    else if (id == S_RJUST || id == S_ZFILL) left = pad;
    else left = 0;
    lm__csink sink = {0};
    size_t skip = 0;
    if (id == S_ZFILL) {
        fill = "0";
        if (s->u.s.n && (s->u.s.p[0] == '+' || s->u.s.p[0] == '-')) {
            if (lm__csink_putc(c, at, &sink, s->u.s.p[0])) return -1;
            skip = 1;
        }
    }
    for (int64_t i = 0; i < left; i++)
        if (lm__csink_put(c, at, &sink, fill, fill_n)) return -1;
    if (lm__csink_put(c, at, &sink, s->u.s.p + skip, s->u.s.n - skip)) return -1;
    for (int64_t i = left; i < pad; i++)
        if (lm__csink_put(c, at, &sink, fill, fill_n)) return -1;
    *out = lm__csink_value(&sink);
    return 0;
}

static int make_tuple3(lm__crt *c, const lm__cnode *at, lm__cv a, lm__cv b, lm__cv d, lm__cv *out) {
    lm__cv_list *l = lm__crt_list(c, at, 3, CL_TUPLE);
    if (!l) return -1;
    l->v[0] = a, l->v[1] = b, l->v[2] = d;
    *out = lm__cv_of_list(l);
    return 0;
}

static int str_method(lm__crt *c, const lm__cnode *at, const lm__cv *s, int id, const lm__cargs *a, lm__cv *out) {
    if (lm__crt_charge(c, at, (int64_t)(s->u.s.n / 64))) return -1;
    static const char *const no_args[] = {NULL};
    static const char *const sep_max[] = {"sep", "maxsplit"};
    static const char *const sub_range[] = {"sub", "start", "end"};
    static const char *const chars[] = {"chars"};
    static const char *const replace_args[] = {"old", "new", "count"};
    static const char *const width_fill[] = {"width", "fillchar"};
    static const char *const one[] = {"x"};
    static const char *const keepends[] = {"keepends"};
    char what[40];
    snprintf(what, sizeof what, "str.%s()", k_names[id]);
    lm__cv slot[3];
    int given[3];
    switch (id) {
    case S_SPLIT:
    case S_RSPLIT: {
        if (bind(c, at, what, a, 2, 0, sep_max, slot, given)) return -1;
        if (slot[0].kind != CV_NONE && need_str(c, at, &slot[0], "sep")) return -1;
        if (given[1] && slot[1].kind != CV_INT && slot[1].kind != CV_BOOL)
            return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "'%s' object cannot be interpreted as an integer",
                                lm__cv_type_name(&slot[1]));
        int64_t maxsplit = given[1] ? (slot[1].kind == CV_BOOL ? slot[1].u.b : slot[1].u.i) : -1;
        return str_split(c, at, s, slot[0].kind == CV_NONE ? NULL : &slot[0], maxsplit, id == S_RSPLIT, out);
    }
    case S_STRIP:
    case S_LSTRIP:
    case S_RSTRIP:
        if (bind(c, at, what, a, 1, 0, chars, slot, given)) return -1;
        if (slot[0].kind != CV_NONE && slot[0].kind != CV_STR)
            return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "%s arg must be None or str", k_names[id]);
        return lm__cstr_strip(c, at, s, slot[0].kind == CV_STR ? &slot[0] : NULL, id != S_RSTRIP, id != S_LSTRIP, out);
    case S_STARTSWITH:
    case S_ENDSWITH: {
        static const char *const names[] = {"prefix", "start", "end"};
        if (bind(c, at, what, a, 3, 1, names, slot, given) || check_int_or_none(c, at, &slot[1], k_names[id]) ||
            check_int_or_none(c, at, &slot[2], k_names[id]))
            return -1;
        size_t b, e;
        cp_range(s, &slot[1], &slot[2], &b, &e);
        int r = 0;
        if (e >= b && affix_match(c, at, s->u.s.p + b, e - b, &slot[0], id == S_ENDSWITH, &r)) return -1;
        *out = lm__cv_bool(r);
        return 0;
    }
    case S_FIND:
    case S_RFIND:
    case S_INDEX:
    case S_RINDEX:
    case S_COUNT:
        if (bind(c, at, what, a, 3, 1, sub_range, slot, given)) return -1;
        return str_find_like(c, at, s, id, slot, out);
    case S_REPLACE: {
        if (bind(c, at, what, a, 3, 2, replace_args, slot, given) || need_str(c, at, &slot[0], "replace") ||
            need_str(c, at, &slot[1], "replace"))
            return -1;
        int64_t count = -1;
        if (given[2]) {
            if (slot[2].kind != CV_INT && slot[2].kind != CV_BOOL)
                return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "'%s' object cannot be interpreted as an integer",
                                    lm__cv_type_name(&slot[2]));
            count = slot[2].kind == CV_BOOL ? slot[2].u.b : slot[2].u.i;
        }
        return lm__cstr_replace(c, at, s, &slot[0], &slot[1], count, out);
    }
    case S_JOIN: {
        if (bind(c, at, what, a, 1, 1, one, slot, given)) return -1;
        const lm__cv *items;
        int64_t n;
        if (lm__cv_iter(c, at, &slot[0], &items, &n)) return -1;
        lm__csink sink = {0};
        for (int64_t i = 0; i < n; i++) {
            if (items[i].kind != CV_STR)
                return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "sequence item %lld: expected str instance, %s found",
                                    (long long)i, lm__cv_type_name(&items[i]));
            if ((i && lm__csink_put(c, at, &sink, s->u.s.p, s->u.s.n)) ||
                lm__csink_put(c, at, &sink, items[i].u.s.p, items[i].u.s.n))
                return -1;
        }
        *out = lm__csink_value(&sink);
        return 0;
    }
    case S_PARTITION:
    case S_RPARTITION: {
        if (bind(c, at, what, a, 1, 1, one, slot, given) || need_str(c, at, &slot[0], k_names[id])) return -1;
        if (slot[0].u.s.n == 0) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "empty separator");
        const char *p = s->u.s.p;
        size_t n = s->u.s.n, sn = slot[0].u.s.n;
        const char *hit = id == S_PARTITION ? memfind(p, n, slot[0].u.s.p, sn) : memrfind(p, n, slot[0].u.s.p, sn);
        lm__cv empty = lm__cv_str("", 0);
        if (!hit) return id == S_PARTITION ? make_tuple3(c, at, *s, empty, empty, out) : make_tuple3(c, at, empty, empty, *s, out);
        size_t k = (size_t)(hit - p);
        return make_tuple3(c, at, lm__cv_str(p, k), slot[0], lm__cv_str(p + k + sn, n - k - sn), out);
    }
    case S_REMOVEPREFIX:
    case S_REMOVESUFFIX: {
        if (bind(c, at, what, a, 1, 1, one, slot, given) || need_str(c, at, &slot[0], k_names[id])) return -1;
        size_t n = s->u.s.n, k = slot[0].u.s.n;
        *out = *s;
        if (k <= n && id == S_REMOVEPREFIX && memcmp(s->u.s.p, slot[0].u.s.p, k) == 0) *out = lm__cv_str(s->u.s.p + k, n - k);
        if (k <= n && id == S_REMOVESUFFIX && memcmp(s->u.s.p + n - k, slot[0].u.s.p, k) == 0) *out = lm__cv_str(s->u.s.p, n - k);
        return 0;
    }
    case S_SPLITLINES:
        if (bind(c, at, what, a, 1, 0, keepends, slot, given)) return -1;
        return lm__cstr_splitlines(c, at, s, lm__cv_truthy(&slot[0]), out);
    case S_CENTER:
    case S_LJUST:
    case S_RJUST:
        if (bind(c, at, what, a, 2, 1, width_fill, slot, given)) return -1;
        return str_pad(c, at, s, id, slot, out);
    case S_ZFILL:
        if (bind(c, at, what, a, 1, 1, width_fill, slot, given)) return -1;
        return str_pad(c, at, s, id, slot, out);
    default:
        if (bind(c, at, what, a, 0, 0, no_args, slot, given)) return -1;
        switch (id) {
        case S_UPPER: return lm__cstr_case(c, at, s, CC_UPPER, out);
        case S_LOWER:
        case S_CASEFOLD: return lm__cstr_case(c, at, s, CC_LOWER, out);
        case S_TITLE: return lm__cstr_case(c, at, s, CC_TITLE, out);
        case S_CAPITALIZE: return lm__cstr_case(c, at, s, CC_CAPITALIZE, out);
        case S_SWAPCASE: return lm__cstr_case(c, at, s, CC_SWAPCASE, out);
        default: *out = lm__cv_bool(str_pred(id, s)); return 0;
        }
    }
}

static int seq_method(lm__crt *c, const lm__cnode *at, const lm__cv *self, int id, const lm__cargs *a, lm__cv *out) {
    static const char *const x[] = {"x"};
    static const char *const none[] = {NULL};
    lm__cv slot[1];
    int given[1];
    char what[40];
    snprintf(what, sizeof what, "%s.%s()", lm__cv_type_name(self), k_names[id]);
    if (id == L_COPY) {
        if (bind(c, at, what, a, 0, 0, none, slot, given)) return -1;
        lm__cv_list *l = lm__crt_list(c, at, self->u.l->n, CL_LIST);
        if (!l) return -1;
        if (l->n) memcpy(l->v, self->u.l->v, (size_t)l->n * sizeof *l->v);
        *out = lm__cv_of_list(l);
        return 0;
    }
    if (bind(c, at, what, a, 1, 1, x, slot, given)) return -1;
    const lm__cv *items;
    int64_t n, k = 0;
    if (lm__cv_iter(c, at, self, &items, &n)) return -1;
    for (int64_t i = 0; i < n; i++) {
        int r = lm__cv_eq(c, at, &items[i], &slot[0]);
        if (r < 0) return -1;
        if (r && id == L_INDEX) {
            *out = lm__cv_int(i);
            return 0;
        }
        k += r;
    }
    if (id == L_COUNT) {
        *out = lm__cv_int(k);
        return 0;
    }
    lm__csink s = {0};
    if (lm__cv_write_repr(c, at, &slot[0], &s)) return -1;
    return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "%.*s is not in %s", (int)LM_MIN(s.n, 200), s.p, lm__cv_type_name(self));
}

static int dict_method(lm__crt *c, const lm__cnode *at, const lm__cv *self, int id, const lm__cargs *a, lm__cv *out) {
    static const char *const get_args[] = {"key", "default"};
    static const char *const none[] = {NULL};
    lm__cv slot[2];
    int given[2];
    char what[40];
    snprintf(what, sizeof what, "dict.%s()", k_names[id]);
    const lm__cv_dict *d = self->u.d;
    if (lm__crt_charge(c, at, d->n / 8)) return -1;
    if (id == D_GET) {
        if (bind(c, at, what, a, 2, 1, get_args, slot, given)) return -1;
        if ((slot[0].kind == CV_LIST && slot[0].u.l->kind != CL_TUPLE) || slot[0].kind == CV_DICT)
            return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "unhashable type: '%s'", lm__cv_type_name(&slot[0]));
        int64_t i = lm__cv_dict_find(d, &slot[0]);
        *out = i >= 0 ? d->v[i] : slot[1];
        return 0;
    }
    if (bind(c, at, what, a, 0, 0, none, slot, given)) return -1;
    if (id == D_COPY) {
        *out = *self;
        return 0;
    }
    lm__cl_kind kind = id == D_ITEMS ? CL_ITEMS : id == D_KEYS ? CL_KEYS : CL_VALUES;
    lm__cv_list *l = lm__crt_list(c, at, 0, kind);
    if (!l) return -1;
    l->n = d->n;
    if (id == D_KEYS) l->v = d->k;
    else if (id == D_VALUES) l->v = d->v;
    else if (d->n) {
        if (!(l->v = lm__crt_alloc(c, at, (size_t)d->n * sizeof *l->v))) return -1;
        for (int64_t i = 0; i < d->n; i++) {
            lm__cv_list *pair = lm__crt_list(c, at, 2, CL_TUPLE);
            if (!pair) return -1;
            pair->v[0] = d->k[i];
            pair->v[1] = d->v[i];
            l->v[i] = lm__cv_of_list(pair);
        }
    }
    *out = lm__cv_of_list(l);
    return 0;
}

static int loop_method(lm__crt *c, const lm__cnode *at, lm__cv_loop *loop, int id, const lm__cargs *a, lm__cv *out) {
    if (a->nkw)
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "loop.%s() got an unexpected keyword argument '%s'", k_names[id], a->kw[0]);
    if (id == LOOP_CYCLE) {
        if (a->n == 0) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "no items for cycling given");
        *out = a->v[loop->i % a->n];
        return 0;
    }
    lm__cv_list *l = lm__crt_list(c, at, a->n, CL_TUPLE);
    if (!l) return -1;
    if (a->n) memcpy(l->v, a->v, (size_t)a->n * sizeof *l->v);
    lm__cv now = lm__cv_of_list(l);
    int same = 0;
    if (loop->has_changed) {
        same = lm__cv_eq(c, at, &loop->changed, &now);
        if (same < 0) return -1;
    }
    if (!same) {
        loop->changed = now;
        loop->has_changed = 1;
    }
    *out = lm__cv_bool(!same);
    return 0;
}

int lm__chat_method_call(lm__crt *c, const lm__cnode *at, const lm__cv *self, int id, const lm__cargs *a,
                         lm__cv *out) {
    switch (self->kind) {
    case CV_STR: return str_method(c, at, self, id, a, out);
    case CV_DICT: return dict_method(c, at, self, id, a, out);
    case CV_LIST:
    case CV_RANGE: return seq_method(c, at, self, id, a, out);
    case CV_LOOP: return loop_method(c, at, self->u.loop, id, a, out);
    default: return type_error(c, at, "'%s' object has no such method", self);
    }
}
