/* chat/eval.c — runs a parsed chat template: expressions, statements, scopes, calls.
 *
 * Scoping is Jinja's as far as templates can observe it: `if` shares its scope; each
 * iteration of a `for` body gets a fresh scope whose parent is the scope around the
 * loop (so a `set` inside a loop is lost at the next iteration and after the loop,
 * which is why templates use namespace()); macros, call bodies, block sets, filter
 * blocks, `with` and `generation` bodies get their own scope. Attribute and item access
 * follow Jinja's sandbox: obj.name tries the attribute (a method) and then the item,
 * obj[key] the item and then the attribute; a miss is an Undefined that carries
 * Jinja's message and raises it when used.
 *
 * Guards: every nested evaluation counts against MAX_DEPTH (so hostile templates run
 * out of budget, not stack), macro calls against LM_CHAT_LIMIT_CALL_DEPTH, loop
 * iterations against LM_CHAT_LIMIT_LOOP_ITERATIONS and every evaluation step against
 * LM_CHAT_LIMIT_WORK.
 */
#include "chat/internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { MAX_DEPTH = 2000 };

/* ---- scopes ------------------------------------------------------------------------------ */
static lm__scope *scope_new(lm__crt *c, const lm__cnode *at, lm__scope *parent) {
    lm__scope *s = lm__crt_alloc(c, at, sizeof *s);
    if (!s) return NULL;
    memset(s, 0, sizeof *s);
    s->parent = parent;
    return s;
}

int lm__chat_scope_set(lm__crt *c, const lm__cnode *at, lm__scope *s, int32_t id, lm__cv v) {
    for (int32_t i = 0; i < s->n; i++)
        if (s->ids[i] == id) {
            s->vals[i] = v;
            return 0;
        }
    if (s->n == s->cap) {
        int32_t cap = s->cap ? 2 * s->cap : 4;
        int32_t *ids = lm__crt_alloc(c, at, (size_t)cap * sizeof *ids);
        lm__cv *vals = ids ? lm__crt_alloc(c, at, (size_t)cap * sizeof *vals) : NULL;
        if (!vals) return -1;
        if (s->n) {
            memcpy(ids, s->ids, (size_t)s->n * sizeof *ids);
            memcpy(vals, s->vals, (size_t)s->n * sizeof *vals);
        }
        s->ids = ids, s->vals = vals, s->cap = cap;
    }
    s->ids[s->n] = id;
    s->vals[s->n] = v;
    s->n++;
    return 0;
}

static lm__cv *scope_find(lm__scope *s, int32_t id) {
    for (; s; s = s->parent)
        for (int32_t i = 0; i < s->n; i++)
            if (s->ids[i] == id) return &s->vals[i];
    return NULL;
}

/* The global functions as values (immutable, shared by every render). */
static lm__cv_func k_globals[CG_COUNT] = {
    {.kind = CF_GLOBAL, .id = CG_RANGE},           {.kind = CF_GLOBAL, .id = CG_DICT},
    {.kind = CF_GLOBAL, .id = CG_NAMESPACE},       {.kind = CF_GLOBAL, .id = CG_RAISE_EXCEPTION},
    {.kind = CF_GLOBAL, .id = CG_STRFTIME_NOW},    {.kind = CF_GLOBAL, .id = CG_LIPSUM},
    {.kind = CF_GLOBAL, .id = CG_CYCLER},          {.kind = CF_GLOBAL, .id = CG_JOINER},
};

static int undefined_fail(lm__crt *c, const lm__cnode *at, const lm__cv *u) {
    return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "%s", u->u.s.p ? u->u.s.p : "an undefined value was used");
}

/* ---- attribute and item access -------------------------------------------------------------- */
static lm__cv undef_attr(lm__crt *c, const lm__cnode *at, const lm__cv *obj, const char *name, size_t n) {
    return lm__cv_undef(lm__crt_printf(c, at, "'%s' has no attribute '%.*s'", lm__cv_object_repr(obj), (int)n, name));
}

static lm__cv undef_item(lm__crt *c, const lm__cnode *at, const lm__cv *obj, const lm__cv *key) {
    lm__csink s = {0};
    if (lm__cv_write_repr(c, at, key, &s)) return lm__cv_undef(NULL);
    return lm__cv_undef(lm__crt_printf(c, at, "%s has no element %.*s", lm__cv_object_repr(obj), (int)s.n, s.p));
}

static int bound_method(lm__crt *c, const lm__cnode *at, const lm__cv *obj, int id, lm__cv *out) {
    lm__cv_func *f = lm__crt_alloc(c, at, sizeof *f);
    if (!f) return -1;
    memset(f, 0, sizeof *f);
    f->kind = CF_METHOD;
    f->id = (int16_t)id;
    f->self = *obj;
    *out = (lm__cv){.kind = CV_FUNC, .u.fn = f};
    return 0;
}

/* The attributes of the loop variable. 1 when name is one, 0 when not. */
static int loop_attr(const lm__cv_loop *l, const char *name, size_t n, lm__cv *out) {
#define IS(lit) (n == sizeof(lit) - 1 && memcmp(name, lit, n) == 0)
    if (IS("index")) *out = lm__cv_int(l->i + 1);
    else if (IS("index0")) *out = lm__cv_int(l->i);
    else if (IS("revindex")) *out = lm__cv_int(l->n - l->i);
    else if (IS("revindex0")) *out = lm__cv_int(l->n - l->i - 1);
    else if (IS("first")) *out = lm__cv_bool(l->i == 0);
    else if (IS("last")) *out = lm__cv_bool(l->i == l->n - 1);
    else if (IS("length")) *out = lm__cv_int(l->n);
    else if (IS("depth")) *out = lm__cv_int(1);
    else if (IS("depth0")) *out = lm__cv_int(0);
    else if (IS("previtem")) *out = l->i > 0 ? l->items[l->i - 1] : lm__cv_undef("there is no previous item");
    else if (IS("nextitem")) *out = l->i + 1 < l->n ? l->items[l->i + 1] : lm__cv_undef("there is no next item");
    else return 0;
    return 1;
#undef IS
}

int lm__chat_getattr(lm__crt *c, const lm__cnode *at, const lm__cv *obj, const char *name, size_t n, lm__cv *out) {
    if (obj->kind == CV_UNDEF) return undefined_fail(c, at, obj);
    int mid = lm__chat_method_id(obj, name, n);
    if (mid >= 0) return bound_method(c, at, obj, mid, out);
    if (mid == -3) {
        *out = lm__cv_undef(lm__crt_printf(c, at, "access to attribute '%.*s' of '%s' object is unsafe.", (int)n,
                                                name, lm__cv_type_name(obj)));
        return c->status == LM_OK ? 0 : -1;
    }
    if (mid == -2)
        return lm__crt_fail(c, at, LM_UNSUPPORTED, "unsupported method %s.%.*s()", lm__cv_type_name(obj), (int)n, name);
    lm__cv key = lm__cv_str(name, n);
    if (obj->kind == CV_DICT || obj->kind == CV_NS) {
        if (lm__crt_charge(c, at, obj->u.d->n / 8)) return -1; /* lookups scan the keys */
        int64_t i = lm__cv_dict_find(obj->u.d, &key);
        if (i >= 0) {
            *out = obj->u.d->v[i];
            return 0;
        }
    } else if (obj->kind == CV_LOOP && loop_attr(obj->u.loop, name, n, out)) {
        return 0;
    }
    *out = undef_attr(c, at, obj, name, n);
    return c->status == LM_OK ? 0 : -1;
}

/* An index into a sequence of length len (negative counts from the end): -1 if out. */
static int64_t seq_index(int64_t i, int64_t len) {
    if (i < 0) i += len;
    return i >= 0 && i < len ? i : -1;
}

/* Byte offset of code point index k in s (k <= count). */
static size_t utf8_offset(const char *p, size_t n, int64_t k) {
    size_t i = 0;
    while (k > 0 && i < n) {
        size_t len;
        lm__cutf8_get(p + i, &len);
        i += len;
        k--;
    }
    return i;
}

int lm__chat_getitem(lm__crt *c, const lm__cnode *at, const lm__cv *obj, const lm__cv *key, lm__cv *out) {
    if (obj->kind == CV_UNDEF) return undefined_fail(c, at, obj);
    int int_key = key->kind == CV_INT || key->kind == CV_BOOL;
    int64_t ik = key->kind == CV_BOOL ? key->u.b : key->u.i;
    switch (obj->kind) {
    case CV_LIST:
        if (int_key && (obj->u.l->kind == CL_LIST || obj->u.l->kind == CL_TUPLE)) {
            int64_t i = seq_index(ik, obj->u.l->n);
            if (i >= 0) {
                *out = obj->u.l->v[i];
                return 0;
            }
        }
        break;
    case CV_STR:
        if (int_key) {
            int64_t i = seq_index(ik, lm__cutf8_count(obj->u.s.p, obj->u.s.n));
            if (i >= 0) {
                size_t off = utf8_offset(obj->u.s.p, obj->u.s.n, i), len;
                lm__cutf8_get(obj->u.s.p + off, &len);
                *out = lm__cv_str(obj->u.s.p + off, len);
                return 0;
            }
        }
        break;
    case CV_DICT: {
        if (lm__crt_charge(c, at, obj->u.d->n / 8)) return -1;
        int64_t i = lm__cv_dict_find(obj->u.d, key);
        if (i >= 0) {
            *out = obj->u.d->v[i];
            return 0;
        }
        break;
    }
    case CV_RANGE:
        if (int_key) {
            int64_t i = seq_index(ik, obj->u.r->n);
            if (i >= 0) {
                *out = lm__cv_int(obj->u.r->start + i * obj->u.r->step);
                return 0;
            }
        }
        break;
    default: break;
    }
    if (key->kind == CV_STR) return lm__chat_getattr(c, at, obj, key->u.s.p, key->u.s.n, out);
    *out = undef_item(c, at, obj, key);
    return c->status == LM_OK ? 0 : -1;
}

/* Python's slice index adjustment; returns the slice length. */
static int64_t slice_adjust(int64_t len, const lm__cv *lo, const lm__cv *hi, int64_t step, int64_t *start) {
    int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? len : len - 1;
    int64_t s, e;
    if (lo->kind == CV_NONE) {
        s = step < 0 ? upper : lower;
    } else {
        s = lo->kind == CV_BOOL ? lo->u.b : lo->u.i;
        if (s < 0) s = LM_MAX(s + len, lower);
        else s = LM_MIN(s, upper);
    }
    if (hi->kind == CV_NONE) {
        e = step < 0 ? lower : upper;
    } else {
        e = hi->kind == CV_BOOL ? hi->u.b : hi->u.i;
        if (e < 0) e = LM_MAX(e + len, lower);
        else e = LM_MIN(e, upper);
    }
    *start = s;
    if (step < 0) return e < s ? (s - e - 1) / (-step) + 1 : 0;
    return s < e ? (e - s - 1) / step + 1 : 0;
}

static int eval_slice(lm__crt *c, const lm__cnode *e, const lm__cv *obj, lm__cv *out) {
    const lm__cnode *sl = e->b;
    lm__cv b[3] = {lm__cv_none(), lm__cv_none(), lm__cv_none()};
    const lm__cnode *parts[3] = {sl->a, sl->b, sl->c};
    for (int i = 0; i < 3; i++)
        if (parts[i] && lm__chat_eval(c, parts[i], &b[i])) return -1;
    if (obj->kind == CV_UNDEF) return undefined_fail(c, e, obj);
    for (int i = 0; i < 3; i++)
        if (b[i].kind != CV_NONE && b[i].kind != CV_INT && b[i].kind != CV_BOOL) {
            if (b[i].kind == CV_UNDEF) return undefined_fail(c, e, &b[i]);
            *out = lm__cv_undef("slice indices must be integers or None");
            return 0;
        }
    int64_t step = b[2].kind == CV_NONE ? 1 : b[2].kind == CV_BOOL ? b[2].u.b : b[2].u.i;
    if (step == 0) return lm__crt_fail(c, e, LM_INVALID_ARGUMENT, "slice step cannot be zero");
    if (step == INT64_MIN) step = -INT64_MAX;
    int64_t start, n;
    if (obj->kind == CV_LIST && (obj->u.l->kind == CL_LIST || obj->u.l->kind == CL_TUPLE)) {
        const lm__cv_list *l = obj->u.l;
        n = slice_adjust(l->n, &b[0], &b[1], step, &start);
        lm__cv_list *r = lm__crt_list(c, e, n, (lm__cl_kind)l->kind);
        if (!r) return -1;
        for (int64_t i = 0; i < n; i++) r->v[i] = l->v[start + i * step];
        *out = lm__cv_of_list(r);
        return 0;
    }
    if (obj->kind == CV_STR) {
        const char *p = obj->u.s.p;
        size_t bytes = obj->u.s.n;
        int64_t len = lm__cutf8_count(p, bytes);
        n = slice_adjust(len, &b[0], &b[1], step, &start);
        if (step == 1) {
            size_t from = utf8_offset(p, bytes, start), to = from + utf8_offset(p + from, bytes - from, n);
            *out = lm__cv_str(p + from, to - from);
            return 0;
        }
        size_t *offs = lm__crt_alloc(c, e, (size_t)(len + 1) * sizeof *offs); /* code point -> byte offset */
        if (!offs) return -1;
        size_t i = 0;
        for (int64_t k = 0; k < len; k++) {
            offs[k] = i;
            size_t l;
            lm__cutf8_get(p + i, &l);
            i += l;
        }
        offs[len] = bytes;
        size_t total = 0;
        for (int64_t k = 0; k < n; k++) {
            int64_t cpi = start + k * step;
            total += offs[cpi + 1] - offs[cpi];
        }
        char *buf = lm__crt_strbuf(c, e, total);
        if (!buf) return -1;
        size_t o = 0;
        for (int64_t k = 0; k < n; k++) {
            int64_t cpi = start + k * step;
            memcpy(buf + o, p + offs[cpi], offs[cpi + 1] - offs[cpi]);
            o += offs[cpi + 1] - offs[cpi];
        }
        *out = lm__cv_str(buf, o);
        return 0;
    }
    if (obj->kind == CV_RANGE) {
        const lm__cv_range *r = obj->u.r;
        n = slice_adjust(r->n, &b[0], &b[1], step, &start);
        lm__cv_range *q = lm__crt_alloc(c, e, sizeof *q);
        if (!q) return -1;
        q->start = r->start + start * r->step;
        q->step = r->step * step;
        q->n = n;
        q->stop = q->start + n * q->step;
        *out = (lm__cv){.kind = CV_RANGE, .u.r = q};
        return 0;
    }
    /* Jinja compiles a slice to a plain Python subscript (not the sandbox's getitem), so
     * slicing anything else raises. */
    if (obj->kind == CV_DICT) return lm__crt_fail(c, e, LM_INVALID_ARGUMENT, "unhashable type: 'slice'");
    return lm__crt_fail(c, e, LM_INVALID_ARGUMENT, "'%s' object is not subscriptable", lm__cv_type_name(obj));
}

/* ---- arithmetic ------------------------------------------------------------------------------- */
static int is_num(const lm__cv *v) { return v->kind == CV_BOOL || v->kind == CV_INT || v->kind == CV_FLOAT; }
static int is_int(const lm__cv *v) { return v->kind == CV_BOOL || v->kind == CV_INT; }
static int64_t ival(const lm__cv *v) { return v->kind == CV_BOOL ? v->u.b : v->u.i; }
static double fval(const lm__cv *v) { return v->kind == CV_FLOAT ? v->u.f : (double)ival(v); }

static const char *k_binop_sym[] = {"+", "-", "*", "/", "//", "%", "**"};

static int unsupported_operands(lm__crt *c, const lm__cnode *e, const lm__cv *a, const lm__cv *b) {
    return lm__crt_fail(c, e, LM_INVALID_ARGUMENT, "unsupported operand type(s) for %s: '%s' and '%s'", k_binop_sym[e->op],
                        lm__cv_type_name(a), lm__cv_type_name(b));
}

static int overflow(lm__crt *c, const lm__cnode *e) {
    return lm__crt_fail(c, e, LM_UNSUPPORTED, "integer overflow (loom's templates compute with 64-bit integers)");
}

static int concat_seq(lm__crt *c, const lm__cnode *e, const lm__cv *a, const lm__cv *b, lm__cv *out) {
    const lm__cv_list *x = a->u.l, *y = b->u.l;
    lm__cv_list *r = lm__crt_list(c, e, x->n + y->n, (lm__cl_kind)x->kind);
    if (!r) return -1;
    if (x->n) memcpy(r->v, x->v, (size_t)x->n * sizeof *r->v);
    if (y->n) memcpy(r->v + x->n, y->v, (size_t)y->n * sizeof *r->v);
    *out = lm__cv_of_list(r);
    return 0;
}

static int repeat(lm__crt *c, const lm__cnode *e, const lm__cv *seq, int64_t times, lm__cv *out) {
    if (times < 0) times = 0;
    if ((seq->kind == CV_STR ? seq->u.s.n : (size_t)seq->u.l->n) == 0) times = 0; /* '' * 10**12 is '' at once */
    if (seq->kind == CV_STR) {
        size_t n = seq->u.s.n;
        if (n && (uint64_t)times > (uint64_t)c->max_str / n)
            return lm__crt_fail(c, e, LM_OUT_OF_RANGE, "a string of more than %lld bytes (LM_CHAT_LIMIT_STRING_BYTES)",
                                (long long)c->max_str);
        char *buf = lm__crt_strbuf(c, e, n * (size_t)times);
        if (!buf) return -1;
        for (int64_t i = 0; i < times; i++) memcpy(buf + (size_t)i * n, seq->u.s.p, n);
        *out = lm__cv_str(buf, n * (size_t)times);
        return 0;
    }
    const lm__cv_list *l = seq->u.l;
    if (l->n && times > (c->max_str / 8) / l->n)
        return lm__crt_fail(c, e, LM_OUT_OF_RANGE, "a list of more than %lld items", (long long)(c->max_str / 8));
    lm__cv_list *r = lm__crt_list(c, e, l->n * times, (lm__cl_kind)l->kind);
    if (!r) return -1;
    for (int64_t i = 0; i < times; i++)
        if (l->n) memcpy(r->v + i * l->n, l->v, (size_t)l->n * sizeof *r->v);
    *out = lm__cv_of_list(r);
    return 0;
}

static int is_seq(const lm__cv *v) {
    return v->kind == CV_STR || (v->kind == CV_LIST && (v->u.l->kind == CL_LIST || v->u.l->kind == CL_TUPLE));
}

static int int_pow(lm__crt *c, const lm__cnode *e, int64_t base, int64_t exp, lm__cv *out) {
    int64_t r = 1;
    while (exp > 0) {
        if (exp & 1) {
            if (__builtin_mul_overflow(r, base, &r)) return overflow(c, e);
        }
        exp >>= 1;
        if (exp && __builtin_mul_overflow(base, base, &base)) return overflow(c, e);
    }
    *out = lm__cv_int(r);
    return 0;
}

static int binop(lm__crt *c, const lm__cnode *e, const lm__cv *a, const lm__cv *b, lm__cv *out) {
    if (a->kind == CV_UNDEF) return undefined_fail(c, e, a);
    if (b->kind == CV_UNDEF) return undefined_fail(c, e, b);
    int ints = is_int(a) && is_int(b), nums = is_num(a) && is_num(b);
    int64_t x = 0, y = 0, r;
    if (ints) x = ival(a), y = ival(b);
    switch (e->op) {
    case OP_ADD:
        if (ints) {
            if (__builtin_add_overflow(x, y, &r)) return overflow(c, e);
            *out = lm__cv_int(r);
            return 0;
        }
        if (nums) {
            *out = lm__cv_float(fval(a) + fval(b));
            return 0;
        }
        if (a->kind == CV_STR && b->kind == CV_STR) {
            char *buf = lm__crt_strbuf(c, e, a->u.s.n + b->u.s.n);
            if (!buf) return -1;
            memcpy(buf, a->u.s.p, a->u.s.n);
            memcpy(buf + a->u.s.n, b->u.s.p, b->u.s.n);
            *out = lm__cv_str(buf, a->u.s.n + b->u.s.n);
            return 0;
        }
        if (a->kind == CV_LIST && b->kind == CV_LIST && a->u.l->kind == b->u.l->kind &&
            (a->u.l->kind == CL_LIST || a->u.l->kind == CL_TUPLE))
            return concat_seq(c, e, a, b, out);
        if (a->kind == CV_STR || (a->kind == CV_LIST && (a->u.l->kind == CL_LIST || a->u.l->kind == CL_TUPLE)))
            return lm__crt_fail(c, e, LM_INVALID_ARGUMENT, "can only concatenate %s (not \"%s\") to %s", lm__cv_type_name(a),
                                lm__cv_type_name(b), lm__cv_type_name(a));
        return unsupported_operands(c, e, a, b);
    case OP_SUB:
        if (ints) {
            if (__builtin_sub_overflow(x, y, &r)) return overflow(c, e);
            *out = lm__cv_int(r);
            return 0;
        }
        if (nums) {
            *out = lm__cv_float(fval(a) - fval(b));
            return 0;
        }
        return unsupported_operands(c, e, a, b);
    case OP_MUL:
        if (ints) {
            if (__builtin_mul_overflow(x, y, &r)) return overflow(c, e);
            *out = lm__cv_int(r);
            return 0;
        }
        if (nums) {
            *out = lm__cv_float(fval(a) * fval(b));
            return 0;
        }
        if (is_seq(a) && is_int(b)) return repeat(c, e, a, ival(b), out);
        if (is_int(a) && is_seq(b)) return repeat(c, e, b, ival(a), out);
        if ((is_seq(a) && is_num(b)) || (is_num(a) && is_seq(b)))
            return lm__crt_fail(c, e, LM_INVALID_ARGUMENT, "can't multiply sequence by non-int of type '%s'",
                                lm__cv_type_name(is_seq(a) ? b : a));
        return unsupported_operands(c, e, a, b);
    case OP_DIV:
        if (!nums) return unsupported_operands(c, e, a, b);
        if (fval(b) == 0) return lm__crt_fail(c, e, LM_INVALID_ARGUMENT, "division by zero");
        *out = lm__cv_float(fval(a) / fval(b));
        return 0;
    case OP_FLOORDIV:
    case OP_MOD: {
        int div = e->op == OP_FLOORDIV;
        if (a->kind == CV_STR && e->op == OP_MOD)
            return lm__crt_fail(c, e, LM_UNSUPPORTED, "unsupported printf-style string formatting ('...' %% values)");
        if (!nums) return unsupported_operands(c, e, a, b);
        if (ints) {
            if (y == 0)
                return lm__crt_fail(c, e, LM_INVALID_ARGUMENT, div ? "integer division or modulo by zero" : "integer modulo by zero");
            if (x == INT64_MIN && y == -1) {
                if (div) return overflow(c, e);
                *out = lm__cv_int(0);
                return 0;
            }
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) q--, m += y;
            *out = lm__cv_int(div ? q : m);
            return 0;
        }
        double vx = fval(a), wx = fval(b);
        if (wx == 0)
            return lm__crt_fail(c, e, LM_INVALID_ARGUMENT, div ? "float floor division by zero" : "float modulo");
        double mod = fmod(vx, wx), d = (vx - mod) / wx;
        if (mod != 0) {
            if ((wx < 0) != (mod < 0)) {
                mod += wx;
                d -= 1.0;
            }
        } else {
            mod = copysign(0.0, wx);
        }
        double fd;
        if (d != 0) {
            fd = floor(d);
            if (d - fd > 0.5) fd += 1.0;
        } else {
            fd = copysign(0.0, vx / wx);
        }
        *out = lm__cv_float(div ? fd : mod);
        return 0;
    }
    case OP_POW:
        if (!nums) return unsupported_operands(c, e, a, b);
        if (ints && y >= 0) return int_pow(c, e, x, y, out);
        {
            double vx = fval(a), wx = fval(b);
            if (vx == 0 && wx < 0)
                return lm__crt_fail(c, e, LM_INVALID_ARGUMENT, "0.0 cannot be raised to a negative power");
            if (vx < 0 && wx != floor(wx))
                return lm__crt_fail(c, e, LM_UNSUPPORTED, "a negative number to a fractional power is complex");
            *out = lm__cv_float(pow(vx, wx));
            return 0;
        }
    default: return lm__crt_fail(c, e, LM_INTERNAL, "unknown operator");
    }
}

/* ---- calls --------------------------------------------------------------------------------------- */
/* Evaluates the arguments of a call, filter or test node (kids / kw) into args. extra
 * reserves room for one more keyword argument. */
static int eval_args(lm__crt *c, const lm__cnode *e, lm__cargs *args, int extra) {
    int32_t total = e->n + extra;
    args->n = e->n - e->nkw;
    args->nkw = e->nkw;
    args->v = NULL;
    args->kw = NULL;
    if (total == 0) return 0;
    args->v = lm__crt_alloc(c, e, (size_t)total * sizeof *args->v);
    args->kw = lm__crt_alloc(c, e, (size_t)(e->nkw + extra + 1) * sizeof *args->kw);
    if (!args->v || !args->kw) return -1;
    for (int32_t i = 0; i < e->n; i++)
        if (lm__chat_eval(c, e->kids[i], &args->v[i])) return -1;
    for (int32_t i = 0; i < e->nkw; i++) args->kw[i] = c->t->names[e->kw[i]];
    return 0;
}

static int assign(lm__crt *c, const lm__cnode *target, const lm__cv *v, lm__scope *s);

/* Binds a macro's or caller's parameters in scope s. */
static int bind_params(lm__crt *c, const lm__cnode *at, const char *name, const lm__cparams *ps, const lm__cargs *a,
                       lm__scope *s, const lm__cv *caller) {
    if (a->n > ps->n && !ps->uses_varargs)
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "macro '%s' takes not more than %d argument(s)", name, ps->n);
    lm__cv_dict *kwargs = NULL;
    if (ps->uses_kwargs && !(kwargs = lm__crt_dict(c, at, 0))) return -1;
    const lm__cv *cal = caller;
    for (int32_t k = 0; k < a->nkw; k++) {
        const char *kn = a->kw[k];
        int found = 0;
        for (int32_t i = 0; i < ps->n && !found; i++) found = strcmp(c->t->names[ps->ids[i]], kn) == 0;
        if (found) continue;
        if (strcmp(kn, "caller") == 0 && ps->uses_caller) {
            cal = &a->v[a->n + k];
            continue;
        }
        if (!kwargs) return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "macro '%s' takes no keyword argument '%s'", name, kn);
        if (lm__crt_dict_set(c, at, kwargs, lm__cv_str(kn, strlen(kn)), a->v[a->n + k])) return -1;
    }
    lm__scope *saved = c->scope;
    c->scope = s;
    int rc = 0;
    for (int32_t i = 0; i < ps->n && rc == 0; i++) {
        const char *pn = c->t->names[ps->ids[i]];
        lm__cv v = lm__cv_undef(NULL);
        int have = 0;
        if (i < a->n) {
            v = a->v[i];
            have = 1;
        }
        for (int32_t k = 0; k < a->nkw && !have; k++)
            if (strcmp(a->kw[k], pn) == 0) {
                v = a->v[a->n + k];
                have = 1;
            }
        if (!have && ps->defaults[i]) {
            if (lm__chat_eval(c, ps->defaults[i], &v)) rc = -1;
            have = 1;
        }
        if (!have) v = lm__cv_undef(lm__crt_printf(c, at, "parameter '%s' was not provided", pn));
        if (rc == 0 && lm__chat_scope_set(c, at, s, ps->ids[i], v)) rc = -1;
    }
    c->scope = saved;
    if (rc) return -1;
    if (ps->uses_varargs) {
        int64_t extra = a->n > ps->n ? a->n - ps->n : 0;
        lm__cv_list *l = lm__crt_list(c, at, extra, CL_TUPLE);
        if (!l) return -1;
        for (int64_t i = 0; i < extra; i++) l->v[i] = a->v[ps->n + i];
        if (lm__chat_scope_set(c, at, s, c->t->id_varargs, lm__cv_of_list(l))) return -1;
    }
    if (kwargs && lm__chat_scope_set(c, at, s, c->t->id_kwargs, (lm__cv){.kind = CV_DICT, .u.d = kwargs})) return -1;
    if (ps->uses_caller &&
        lm__chat_scope_set(c, at, s, c->t->id_caller, cal ? *cal : lm__cv_undef("no caller was given to this macro")))
        return -1;
    return 0;
}

/* Renders body in scope s into a fresh capture; *out = the captured text. Returns what
 * lm__chat_exec returns: a break or continue inside a block set or filter block leaves
 * the enclosing loop (the block is then dropped, as in Jinja). */
static int capture(lm__crt *c, lm__cnode *const *body, int32_t n, lm__scope *s, lm__cv *out) {
    lm__csink sink = {0}, *saved = c->out;
    c->out = &sink;
    int r = lm__chat_exec(c, body, n, s);
    c->out = saved;
    *out = lm__csink_value(&sink);
    return r;
}

static int call_macro(lm__crt *c, const lm__cnode *at, const lm__cv_func *f, const lm__cargs *a, lm__cv *out) {
    if (c->calls >= c->max_calls)
        return lm__crt_fail(c, at, LM_OUT_OF_RANGE, "macro calls nested more than %d deep (LM_CHAT_LIMIT_CALL_DEPTH)",
                            c->max_calls);
    const lm__cnode *m = f->node;
    char name[128];
    if (f->kind == CF_MACRO) snprintf(name, sizeof name, "%.*s", (int)LM_MIN(m->k.u.s.n, 100), m->k.u.s.p);
    else snprintf(name, sizeof name, "caller");
    lm__scope *s = scope_new(c, at, f->closure);
    if (!s || bind_params(c, at, name, m->params, a, s, NULL)) return -1;
    c->calls++;
    int r = capture(c, m->kids, m->n, s, out); /* break/continue cannot cross a macro (parse.c) */
    c->calls--;
    return r < 0 ? -1 : 0;
}

int lm__chat_call(lm__crt *c, const lm__cnode *at, const lm__cv *fn, const lm__cargs *args, lm__cv *out) {
    if (fn->kind == CV_UNDEF) return undefined_fail(c, at, fn);
    if (fn->kind != CV_FUNC)
        return lm__crt_fail(c, at, LM_INVALID_ARGUMENT, "'%s' object is not callable", lm__cv_type_name(fn));
    const lm__cv_func *f = fn->u.fn;
    switch (f->kind) {
    case CF_GLOBAL: return lm__chat_global_call(c, at, f->id, args, out);
    case CF_METHOD: return lm__chat_method_call(c, at, &f->self, f->id, args, out);
    default: return call_macro(c, at, f, args, out);
    }
}

static int eval_call(lm__crt *c, const lm__cnode *e, const lm__cv *caller, lm__cv *out) {
    lm__cv fn;
    const lm__cnode *callee = e->a;
    if (callee->type == N_GETATTR) { /* obj.method(...): no bound method object needed */
        lm__cv obj;
        if (lm__chat_eval(c, callee->a, &obj)) return -1;
        int mid = obj.kind == CV_UNDEF ? -1 : lm__chat_method_id(&obj, callee->k.u.s.p, callee->k.u.s.n);
        if (mid >= 0 && !caller) {
            lm__cargs args;
            if (eval_args(c, e, &args, 0)) return -1;
            return lm__chat_method_call(c, e, &obj, mid, &args, out);
        }
        if (lm__chat_getattr(c, callee, &obj, callee->k.u.s.p, callee->k.u.s.n, &fn)) return -1;
    } else if (lm__chat_eval(c, callee, &fn)) {
        return -1;
    }
    lm__cargs args;
    if (eval_args(c, e, &args, caller ? 1 : 0)) return -1;
    if (caller) {
        args.v[args.n + args.nkw] = *caller;
        args.kw[args.nkw] = "caller";
        args.nkw++;
    }
    return lm__chat_call(c, e, &fn, &args, out);
}

/* ---- expressions ----------------------------------------------------------------------------------- */
static int eval_filter(lm__crt *c, const lm__cnode *e, const lm__cv *input, lm__cv *out) {
    lm__cv v;
    if (!e->a) { /* the innermost filter of a block's chain: its operand is the block's text */
        v = input ? *input : lm__cv_undef(NULL);
    } else if (input && e->a->type == N_FILTER) {
        if (eval_filter(c, e->a, input, &v)) return -1;
    } else if (lm__chat_eval(c, e->a, &v)) {
        return -1;
    }
    lm__cargs args;
    if (eval_args(c, e, &args, 0)) return -1;
    return lm__chat_filter(c, e, e->id, &v, &args, out);
}

static int eval_compare(lm__crt *c, const lm__cnode *e, lm__cv *out) {
    lm__cv left, right;
    if (lm__chat_eval(c, e->a, &left)) return -1;
    for (int32_t i = 0; i < e->n; i++) {
        if (lm__chat_eval(c, e->kids[i], &right)) return -1;
        int r;
        switch (e->ops[i]) {
        case CMP_EQ: r = lm__cv_eq(c, e, &left, &right); break;
        case CMP_NE: r = lm__cv_eq(c, e, &left, &right); r = r < 0 ? r : !r; break;
        case CMP_IN: r = lm__cv_contains(c, e, &right, &left); break;
        case CMP_NOTIN: r = lm__cv_contains(c, e, &right, &left); r = r < 0 ? r : !r; break;
        default: r = lm__cv_compare(c, e, &left, &right, e->ops[i]); break;
        }
        if (r < 0) return -1;
        if (!r) {
            *out = lm__cv_bool(0);
            return 0;
        }
        left = right;
    }
    *out = lm__cv_bool(1);
    return 0;
}

static int eval_node(lm__crt *c, const lm__cnode *e, lm__cv *out) {
    lm__cv a, b;
    switch (e->type) {
    case N_CONST: *out = e->k; return 0;
    case N_NAME: {
        const lm__cv *v = scope_find(c->scope, e->id);
        if (v) {
            *out = *v;
            return 0;
        }
        int g = c->t->global_of[e->id];
        if (g >= 0) {
            *out = (lm__cv){.kind = CV_FUNC, .u.fn = &k_globals[g]};
            return 0;
        }
        *out = lm__cv_undef(lm__crt_printf(c, e, "'%s' is undefined", c->t->names[e->id]));
        return c->status == LM_OK ? 0 : -1;
    }
    case N_GETATTR:
        if (lm__chat_eval(c, e->a, &a)) return -1;
        return lm__chat_getattr(c, e, &a, e->k.u.s.p, e->k.u.s.n, out);
    case N_GETITEM:
        if (lm__chat_eval(c, e->a, &a)) return -1;
        if (e->b->type == N_SLICE) return eval_slice(c, e, &a, out);
        if (lm__chat_eval(c, e->b, &b)) return -1;
        return lm__chat_getitem(c, e, &a, &b, out);
    case N_SLICE: return lm__crt_fail(c, e, LM_UNSUPPORTED, "unsupported slice inside a tuple subscript");
    case N_CALL: return eval_call(c, e, NULL, out);
    case N_FILTER: return eval_filter(c, e, NULL, out);
    case N_TEST: {
        if (lm__chat_eval(c, e->a, &a)) return -1;
        lm__cargs args;
        int r;
        if (eval_args(c, e, &args, 0) || lm__chat_test(c, e, e->id, &a, &args, &r)) return -1;
        *out = lm__cv_bool(r);
        return 0;
    }
    case N_BINOP:
        if (lm__chat_eval(c, e->a, &a) || lm__chat_eval(c, e->b, &b)) return -1;
        return binop(c, e, &a, &b, out);
    case N_NEG:
    case N_POS:
        if (lm__chat_eval(c, e->a, &a)) return -1;
        if (a.kind == CV_UNDEF) return undefined_fail(c, e, &a);
        if (!is_num(&a))
            return lm__crt_fail(c, e, LM_INVALID_ARGUMENT, "bad operand type for unary %s: '%s'", e->type == N_NEG ? "-" : "+",
                                lm__cv_type_name(&a));
        if (a.kind == CV_FLOAT) *out = lm__cv_float(e->type == N_NEG ? -a.u.f : a.u.f);
        else if (e->type == N_POS) *out = lm__cv_int(ival(&a));
        else if (ival(&a) == INT64_MIN) return overflow(c, e);
        else *out = lm__cv_int(-ival(&a));
        return 0;
    case N_NOT:
        if (lm__chat_eval(c, e->a, &a)) return -1;
        *out = lm__cv_bool(!lm__cv_truthy(&a));
        return 0;
    case N_AND:
    case N_OR:
        if (lm__chat_eval(c, e->a, &a)) return -1;
        if (lm__cv_truthy(&a) == (e->type == N_OR)) {
            *out = a;
            return 0;
        }
        return lm__chat_eval(c, e->b, out);
    case N_COMPARE: return eval_compare(c, e, out);
    case N_CONDEXPR:
        if (lm__chat_eval(c, e->a, &a)) return -1;
        if (lm__cv_truthy(&a)) return lm__chat_eval(c, e->b, out);
        if (e->c) return lm__chat_eval(c, e->c, out);
        *out = lm__cv_undef(lm__crt_printf(c, e, "the inline if-expression on line %d evaluated to false and no else "
                                                 "section was defined.", e->line));
        return c->status == LM_OK ? 0 : -1;
    case N_CONCAT: {
        lm__csink s = {0};
        for (int32_t i = 0; i < e->n; i++)
            if (lm__chat_eval(c, e->kids[i], &a) || lm__cv_write_str(c, e, &a, &s)) return -1;
        *out = lm__csink_value(&s);
        return 0;
    }
    case N_LIST:
    case N_TUPLE: {
        lm__cv_list *l = lm__crt_list(c, e, e->n, e->type == N_LIST ? CL_LIST : CL_TUPLE);
        if (!l) return -1;
        for (int32_t i = 0; i < e->n; i++)
            if (lm__chat_eval(c, e->kids[i], &l->v[i])) return -1;
        *out = lm__cv_of_list(l);
        return 0;
    }
    case N_DICT: {
        lm__cv_dict *d = lm__crt_dict(c, e, e->n / 2);
        if (!d) return -1;
        for (int32_t i = 0; i + 1 < e->n; i += 2) {
            if (lm__chat_eval(c, e->kids[i], &a) || lm__chat_eval(c, e->kids[i + 1], &b)) return -1;
            if ((a.kind == CV_LIST && a.u.l->kind != CL_TUPLE) || a.kind == CV_DICT)
                return lm__crt_fail(c, e, LM_INVALID_ARGUMENT, "unhashable type: '%s'", lm__cv_type_name(&a));
            if (lm__crt_dict_set(c, e, d, a, b)) return -1;
        }
        *out = (lm__cv){.kind = CV_DICT, .u.d = d};
        return 0;
    }
    default: return lm__crt_fail(c, e, LM_INTERNAL, "statement evaluated as an expression");
    }
}

int lm__chat_eval(lm__crt *c, const lm__cnode *e, lm__cv *out) {
    if (lm__crt_charge(c, e, 1)) return -1;
    if (c->depth >= MAX_DEPTH)
        return lm__crt_fail(c, e, LM_OUT_OF_RANGE, "the template nests evaluation more than %d deep", MAX_DEPTH);
    c->depth++;
    int r = eval_node(c, e, out);
    c->depth--;
    return r;
}

/* ---- statements ---------------------------------------------------------------------------------------- */
static int assign(lm__crt *c, const lm__cnode *target, const lm__cv *v, lm__scope *s) {
    if (target->type == N_NAME) return lm__chat_scope_set(c, target, s, target->id, *v);
    if (target->type == N_NSREF) {
        lm__cv *ns = scope_find(s, target->id);
        if (!ns || ns->kind != CV_NS)
            return lm__crt_fail(c, target, LM_INVALID_ARGUMENT, "cannot assign attribute on non-namespace object");
        return lm__crt_dict_set(c, target, ns->u.d, target->k, *v);
    }
    /* a tuple of targets: unpack */
    if (v->kind == CV_UNDEF) return undefined_fail(c, target, v);
    if (v->kind != CV_LIST && v->kind != CV_STR && v->kind != CV_DICT && v->kind != CV_RANGE)
        return lm__crt_fail(c, target, LM_INVALID_ARGUMENT, "cannot unpack non-iterable %s object", lm__cv_type_name(v));
    const lm__cv *items;
    int64_t n;
    if (lm__cv_iter(c, target, v, &items, &n)) return -1;
    if (n < target->n)
        return lm__crt_fail(c, target, LM_INVALID_ARGUMENT, "not enough values to unpack (expected %d, got %lld)", target->n,
                            (long long)n);
    if (n > target->n)
        return lm__crt_fail(c, target, LM_INVALID_ARGUMENT, "too many values to unpack (expected %d)", target->n);
    for (int32_t i = 0; i < target->n; i++)
        if (assign(c, target->kids[i], &items[i], s)) return -1;
    return 0;
}

/* Applies a filter chain whose innermost operand is the block's text. */
static int apply_chain(lm__crt *c, const lm__cnode *chain, const lm__cv *text, lm__cv *out) {
    if (!chain) {
        *out = *text;
        return 0;
    }
    return eval_filter(c, chain, text, out);
}

static int exec_for(lm__crt *c, const lm__cnode *e) {
    lm__cv seq;
    if (lm__chat_eval(c, e->b, &seq)) return -1;
    if (seq.kind != CV_UNDEF && seq.kind != CV_LIST && seq.kind != CV_STR && seq.kind != CV_DICT && seq.kind != CV_RANGE)
        return lm__crt_fail(c, e->b, LM_INVALID_ARGUMENT, "'%s' object is not iterable", lm__cv_type_name(&seq));
    const lm__cv *items;
    int64_t n;
    if (lm__cv_iter(c, e, &seq, &items, &n)) return -1;
    lm__scope *s = scope_new(c, e, c->scope);
    if (!s) return -1;
    if (e->c) { /* the inline filter: keep the items it accepts */
        lm__cv *kept = n ? lm__crt_alloc(c, e, (size_t)n * sizeof *kept) : NULL;
        if (n && !kept) return -1;
        int64_t k = 0;
        lm__scope *saved = c->scope;
        for (int64_t i = 0; i < n; i++) {
            lm__cv ok;
            s->n = 0;
            c->scope = s;
            int r = assign(c, e->a, &items[i], s) || lm__chat_eval(c, e->c, &ok);
            c->scope = saved;
            if (r) return -1;
            if (lm__cv_truthy(&ok)) kept[k++] = items[i];
        }
        items = kept;
        n = k;
    }
    if (n == 0) {
        if (!e->n2) return 0;
        s->n = 0;
        return lm__chat_exec(c, e->kids2, e->n2, s);
    }
    lm__cv_loop *loop = lm__crt_alloc(c, e, sizeof *loop);
    if (!loop) return -1;
    memset(loop, 0, sizeof *loop);
    loop->n = n;
    loop->items = items;
    lm__cv loopv = {.kind = CV_LOOP, .u.loop = loop};
    for (int64_t i = 0; i < n; i++) {
        if (++c->iterations > c->max_iter)
            return lm__crt_fail(c, e, LM_OUT_OF_RANGE, "more than %lld loop iterations (LM_CHAT_LIMIT_LOOP_ITERATIONS)",
                                (long long)c->max_iter);
        loop->i = i;
        s->n = 0;
        if (lm__chat_scope_set(c, e, s, c->t->id_loop, loopv) || assign(c, e->a, &items[i], s)) return -1;
        int r = lm__chat_exec(c, e->kids, e->n, s);
        if (r < 0) return -1;
        if (r == LM__EXEC_BREAK) break;
    }
    return 0;
}

static int exec_stmt(lm__crt *c, const lm__cnode *e) {
    lm__cv v, text;
    if (lm__crt_charge(c, e, 1)) return -1;
    switch (e->type) {
    case N_DATA: return lm__csink_put(c, e, c->out, e->k.u.s.p, e->k.u.s.n);
    case N_OUTPUT:
        if (!e->a) { /* {% print a, b %} */
            for (int32_t i = 0; i < e->n; i++)
                if (lm__chat_eval(c, e->kids[i], &v) || lm__cv_write_str(c, e, &v, c->out)) return -1;
            return 0;
        }
        if (lm__chat_eval(c, e->a, &v)) return -1;
        return lm__cv_write_str(c, e, &v, c->out);
    case N_IF:
        if (lm__chat_eval(c, e->a, &v)) return -1;
        if (lm__cv_truthy(&v)) return lm__chat_exec(c, e->kids, e->n, c->scope);
        return lm__chat_exec(c, e->kids2, e->n2, c->scope);
    case N_FOR: return exec_for(c, e);
    case N_SET:
        if (lm__chat_eval(c, e->b, &v)) return -1;
        return assign(c, e->a, &v, c->scope);
    case N_SET_BLOCK: {
        lm__scope *s = scope_new(c, e, c->scope);
        int r = s ? capture(c, e->kids, e->n, s, &text) : -1;
        if (r) return r;
        if (apply_chain(c, e->c, &text, &v)) return -1;
        return assign(c, e->a, &v, c->scope);
    }
    case N_MACRO: {
        lm__cv_func *f = lm__crt_alloc(c, e, sizeof *f);
        if (!f) return -1;
        memset(f, 0, sizeof *f);
        f->kind = CF_MACRO;
        f->node = e;
        f->closure = c->scope;
        return lm__chat_scope_set(c, e, c->scope, e->id, (lm__cv){.kind = CV_FUNC, .u.fn = f});
    }
    case N_CALLBLOCK: {
        lm__cv_func *f = lm__crt_alloc(c, e, sizeof *f);
        if (!f) return -1;
        memset(f, 0, sizeof *f);
        f->kind = CF_CALLER;
        f->node = e;
        f->closure = c->scope;
        lm__cv caller = {.kind = CV_FUNC, .u.fn = f};
        if (eval_call(c, e->a, &caller, &v)) return -1;
        return lm__cv_write_str(c, e, &v, c->out);
    }
    case N_FILTERBLOCK: {
        lm__scope *s = scope_new(c, e, c->scope);
        int r = s ? capture(c, e->kids, e->n, s, &text) : -1;
        if (r) return r;
        if (apply_chain(c, e->c, &text, &v)) return -1;
        return lm__cv_write_str(c, e, &v, c->out);
    }
    case N_WITH: {
        lm__scope *s = scope_new(c, e, c->scope);
        if (!s) return -1;
        for (int32_t i = 0; i + 1 < e->n2; i += 2) {
            lm__cv val;
            if (lm__chat_eval(c, e->kids2[i + 1], &val) || assign(c, e->kids2[i], &val, s)) return -1;
        }
        return lm__chat_exec(c, e->kids, e->n, s);
    }
    case N_SCOPE: {
        lm__scope *s = scope_new(c, e, c->scope);
        return s ? lm__chat_exec(c, e->kids, e->n, s) : -1;
    }
    case N_BREAK: return LM__EXEC_BREAK;
    case N_CONTINUE: return LM__EXEC_CONTINUE;
    default: return lm__crt_fail(c, e, LM_INTERNAL, "expression executed as a statement");
    }
}

int lm__chat_exec(lm__crt *c, lm__cnode *const *body, int32_t n, lm__scope *s) {
    if (c->depth >= MAX_DEPTH)
        return lm__crt_fail(c, n ? body[0] : NULL, LM_OUT_OF_RANGE, "the template nests evaluation more than %d deep",
                            MAX_DEPTH);
    lm__scope *saved = c->scope;
    c->scope = s;
    c->depth++;
    int r = 0;
    for (int32_t i = 0; i < n && r == 0; i++) r = exec_stmt(c, body[i]);
    c->depth--;
    c->scope = saved;
    return r;
}
