/* chat/parse.c — Jinja's grammar, as jinja2/parser.py defines it, into lm__cnode trees.
 *
 * Expression precedence, loosest first: `a if c else b`; or; and; not; comparisons
 * (== != < <= > >= in, not in; chained); + -; ~; * / // %; ** (left-associative, as
 * in Jinja); unary - +; then a primary with its postfix (.attr, [key], [a:b:c], calls)
 * and filters / tests (`|f(args)`, `is [not] t args`), which bind tighter than any
 * binary operator. Statements: if/elif/else, for (targets, inline if, else), set
 * (names, tuples, ns.attr, block set), macro, call, filter, with, print, break,
 * continue and transformers' generation; other Jinja tags fail naming themselves.
 *
 * Names are resolved here: every filter and test must exist; every call of a plain
 * name must call a global loom provides or a name the template binds (a macro, a set
 * or loop variable, a parameter). Nesting is bounded (MAX_EXPR_DEPTH for
 * expressions, MAX_STMT_DEPTH for statements) so that neither parsing nor
 * evaluation can exhaust the stack. Time and memory are O(tokens).
 */
#include "chat/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { MAX_EXPR_DEPTH = 200, MAX_STMT_DEPTH = 100 };

typedef struct nvec {
    lm__cnode **v;
    int32_t n, cap;
} nvec;

/* The macro (or call block, or generation body) being parsed: what its body uses. */
typedef struct frame {
    lm__cparams *params; /* NULL for a generation body */
    struct frame *outer;
} frame;

typedef struct parser {
    lm_chat_template *t;
    const lm__ctok *tk; /* [ntk], ends with T_EOF */
    int32_t ntk, pos;
    lm_status err;
    int depth;      /* expression recursion */
    int stmt_depth; /* statement nesting */
    int loops;      /* for loops around the statement being parsed, in this frame */
    frame *fr;
    nvec calls;     /* N_CALL nodes whose callee is a plain name, checked at the end */
    uint8_t *bound; /* [cap_bound] names bound somewhere (assigned, looped over, params) */
    int32_t cap_bound;
} parser;

/* ---- helpers -------------------------------------------------------------------------- */
static const lm__ctok *cur(parser *p) { return &p->tk[p->pos]; }
static const lm__ctok *look(parser *p) { return &p->tk[p->pos + 1 < p->ntk ? p->pos + 1 : p->pos]; }
static void next(parser *p) {
    if (p->tk[p->pos].type != T_EOF) p->pos++;
}

static int is_op(const lm__ctok *k, int op) { return k->type == T_OP && k->op == op; }
static int is_name(const lm__ctok *k, const char *name) {
    return k->type == T_NAME && k->n == strlen(name) && memcmp(k->p, name, k->n) == 0;
}

static const char *k_op_text[] = {
    "+", "-", "/", "//", "*", "**", "%", "~", "[", "]", "(", ")", "{", "}",
    "==", "!=", ">", ">=", "<", "<=", "=", ".", ":", "|", ",", ";",
};

/* A token as error messages name it. */
static void describe(const lm__ctok *k, char *buf, size_t size) {
    switch (k->type) {
    case T_EOF: snprintf(buf, size, "end of template"); break;
    case T_DATA: snprintf(buf, size, "template text"); break;
    case T_VAR_BEGIN: snprintf(buf, size, "'{{'"); break;
    case T_VAR_END: snprintf(buf, size, "'}}'"); break;
    case T_BLOCK_BEGIN: snprintf(buf, size, "'{%%'"); break;
    case T_BLOCK_END: snprintf(buf, size, "'%%}'"); break;
    case T_NAME: snprintf(buf, size, "'%.*s'", (int)LM_MIN(k->n, 64), k->p); break;
    case T_STRING: snprintf(buf, size, "a string"); break;
    case T_INT: snprintf(buf, size, "an integer"); break;
    case T_FLOAT: snprintf(buf, size, "a float"); break;
    default: snprintf(buf, size, "'%s'", k_op_text[k->op]); break;
    }
}

static void *fail(parser *p, lm_status s, const lm__ctok *at, const char *fmt, ...) LM__PRINTF(4, 5);
static void *fail(parser *p, lm_status s, const lm__ctok *at, const char *fmt, ...) {
    if (p->err != LM_OK) return NULL;
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->err = lm__chat_syntax_error(s, at->line, at->col, "%s", msg);
    return NULL;
}

static void *oom(parser *p) {
    if (p->err == LM_OK) p->err = lm__error(LM_OUT_OF_MEMORY, "chat template: out of memory while parsing");
    return NULL;
}

static void *unexpected(parser *p, const char *wanted) {
    char got[96];
    describe(cur(p), got, sizeof got);
    if (wanted) return fail(p, LM_PARSE_ERROR, cur(p), "expected %s, got %s", wanted, got);
    return fail(p, LM_PARSE_ERROR, cur(p), "unexpected %s", got);
}

static int expect_op(parser *p, int op) {
    if (is_op(cur(p), op)) {
        next(p);
        return 1;
    }
    char want[16];
    snprintf(want, sizeof want, "'%s'", k_op_text[op]);
    unexpected(p, want);
    return 0;
}

static int expect_block_end(parser *p) {
    if (cur(p)->type == T_BLOCK_END) {
        next(p);
        return 1;
    }
    unexpected(p, "'%}' (end of statement block)");
    return 0;
}

static lm__cnode *node(parser *p, uint8_t type, const lm__ctok *at) {
    lm__cnode *e = lm__chat_alloc(&p->t->arena, sizeof *e);
    if (!e) return oom(p);
    memset(e, 0, sizeof *e);
    e->type = type;
    e->line = at->line;
    e->col = at->col;
    e->depth = 1;
    return e;
}

static int nvec_push(parser *p, nvec *v, lm__cnode *x) {
    if (v->n == v->cap) {
        int32_t cap = v->cap ? 2 * v->cap : 4;
        lm__cnode **q = lm__chat_grow(&p->t->arena, v->v, (size_t)v->cap * sizeof *q, (size_t)cap * sizeof *q);
        if (!q) {
            oom(p);
            return 0;
        }
        v->v = q, v->cap = cap;
    }
    v->v[v->n++] = x;
    return 1;
}

/* Sets e->depth from its children; fails when the expression nests too deeply. */
static lm__cnode *sealed(parser *p, lm__cnode *e) {
    if (!e) return NULL;
    int32_t d = 0;
    if (e->a) d = LM_MAX(d, e->a->depth);
    if (e->b) d = LM_MAX(d, e->b->depth);
    if (e->c) d = LM_MAX(d, e->c->depth);
    for (int32_t i = 0; i < e->n; i++)
        if (e->kids[i]) d = LM_MAX(d, e->kids[i]->depth);
    e->depth = d + 1;
    if (e->depth > MAX_EXPR_DEPTH) {
        lm__ctok at = {.line = e->line, .col = e->col};
        return fail(p, LM_OUT_OF_RANGE, &at, "expression nested more than %d deep", MAX_EXPR_DEPTH);
    }
    return e;
}

static int32_t intern(parser *p, const char *s, size_t n) {
    int32_t id = lm__chat_intern(p->t, s, n);
    if (id < 0) oom(p);
    return id;
}

static void mark_bound(parser *p, int32_t id) {
    if (id < 0) return;
    if (id >= p->cap_bound) {
        int32_t cap = LM_MAX(2 * p->cap_bound, id + 64);
        uint8_t *b = lm__chat_grow(&p->t->arena, p->bound, (size_t)p->cap_bound, (size_t)cap);
        if (!b) {
            oom(p);
            return;
        }
        memset(b + p->cap_bound, 0, (size_t)(cap - p->cap_bound));
        p->bound = b, p->cap_bound = cap;
    }
    p->bound[id] = 1;
}

static int enter(parser *p) {
    if (++p->depth > MAX_EXPR_DEPTH) {
        fail(p, LM_OUT_OF_RANGE, cur(p), "expression nested more than %d deep", MAX_EXPR_DEPTH);
        return 0;
    }
    return 1;
}

/* ---- expressions -------------------------------------------------------------------------- */
static lm__cnode *parse_expression(parser *p, int with_condexpr);
static lm__cnode *parse_tuple(parser *p, int simplified, int with_condexpr, const char *extra_end,
                              int explicit_parens);
static lm__cnode *parse_unary(parser *p, int with_filter);
static lm__cnode *parse_primary(parser *p);

static lm__cnode *make_name(parser *p, const lm__ctok *k) {
    lm__cnode *e = node(p, N_NAME, k);
    if (!e) return NULL;
    e->id = intern(p, k->p, k->n);
    if (e->id < 0) return NULL;
    e->k = lm__cv_str(p->t->names[e->id], k->n);
    frame *f = p->fr; /* the innermost macro or call block: names its body may take implicitly */
    while (f && !f->params) f = f->outer;
    if (f) {
        if (e->id == p->t->id_varargs) f->params->uses_varargs = 1;
        if (e->id == p->t->id_kwargs) f->params->uses_kwargs = 1;
        if (e->id == p->t->id_caller) f->params->uses_caller = 1;
    }
    return e;
}

/* Call arguments "(a, b, k=v)" into e->kids / e->kw. */
static int parse_call_args(parser *p, lm__cnode *e) {
    const lm__ctok *open = cur(p);
    if (!expect_op(p, TO_LPAREN)) return 0;
    nvec pos = {0}, kwv = {0};
    int32_t *kw = NULL, nkw = 0, cap_kw = 0;
    int need_comma = 0;
    while (!is_op(cur(p), TO_RPAREN)) {
        if (need_comma) {
            if (!expect_op(p, TO_COMMA)) return 0;
            if (is_op(cur(p), TO_RPAREN)) break;
        }
        if (is_op(cur(p), TO_MUL) || is_op(cur(p), TO_POW)) {
            fail(p, LM_UNSUPPORTED, cur(p), "unsupported *args / **kwargs in a call");
            return 0;
        }
        if (cur(p)->type == T_NAME && is_op(look(p), TO_ASSIGN)) {
            int32_t id = intern(p, cur(p)->p, cur(p)->n);
            if (id < 0) return 0;
            next(p);
            next(p);
            lm__cnode *v = parse_expression(p, 1);
            if (!v) return 0;
            if (nkw == cap_kw) {
                int32_t cap = cap_kw ? 2 * cap_kw : 4;
                int32_t *q = lm__chat_grow(&p->t->arena, kw, (size_t)cap_kw * sizeof *q, (size_t)cap * sizeof *q);
                if (!q) return !!oom(p);
                kw = q, cap_kw = cap;
            }
            kw[nkw++] = id;
            if (!nvec_push(p, &kwv, v)) return 0;
        } else {
            if (nkw) {
                fail(p, LM_PARSE_ERROR, open, "invalid syntax for function call expression (positional argument after a keyword argument)");
                return 0;
            }
            lm__cnode *v = parse_expression(p, 1);
            if (!v || !nvec_push(p, &pos, v)) return 0;
        }
        need_comma = 1;
    }
    if (!expect_op(p, TO_RPAREN)) return 0;
    for (int32_t i = 0; i < kwv.n; i++)
        if (!nvec_push(p, &pos, kwv.v[i])) return 0;
    e->kids = pos.v;
    e->n = pos.n;
    e->kw = kw;
    e->nkw = nkw;
    return 1;
}

static lm__cnode *parse_call(parser *p, lm__cnode *callee) {
    lm__cnode *e = node(p, N_CALL, cur(p));
    if (!e) return NULL;
    e->line = callee->line, e->col = callee->col;
    e->a = callee;
    if (!parse_call_args(p, e)) return NULL;
    if (callee->type == N_NAME && !nvec_push(p, &p->calls, e)) return NULL;
    return sealed(p, e);
}

/* One subscript: an expression or a slice a:b:c. */
static lm__cnode *parse_subscribed(parser *p) {
    const lm__ctok *at = cur(p);
    lm__cnode *args[3] = {NULL, NULL, NULL};
    if (is_op(cur(p), TO_COLON)) {
        next(p);
    } else {
        lm__cnode *e = parse_expression(p, 1);
        if (!e) return NULL;
        if (!is_op(cur(p), TO_COLON)) return e;
        next(p);
        args[0] = e;
    }
    if (!is_op(cur(p), TO_COLON) && !is_op(cur(p), TO_RBRACKET) && !is_op(cur(p), TO_COMMA)) {
        if (!(args[1] = parse_expression(p, 1))) return NULL;
    }
    if (is_op(cur(p), TO_COLON)) {
        next(p);
        if (!is_op(cur(p), TO_RBRACKET) && !is_op(cur(p), TO_COMMA)) {
            if (!(args[2] = parse_expression(p, 1))) return NULL;
        }
    }
    lm__cnode *s = node(p, N_SLICE, at);
    if (!s) return NULL;
    s->a = args[0], s->b = args[1], s->c = args[2];
    return sealed(p, s);
}

/* Postfix expressions are positioned where their object starts ("x.y.z" at x). */
static lm__cnode *at_obj(lm__cnode *e, const lm__cnode *obj) {
    if (e) e->line = obj->line, e->col = obj->col;
    return e;
}

static lm__cnode *parse_subscript(parser *p, lm__cnode *obj) {
    const lm__ctok *at = cur(p);
    if (is_op(at, TO_DOT)) {
        next(p);
        const lm__ctok *k = cur(p);
        if (k->type == T_NAME) {
            next(p);
            lm__cnode *e = at_obj(node(p, N_GETATTR, at), obj);
            if (!e) return NULL;
            e->a = obj;
            e->k = lm__cv_str(k->p, k->n);
            return sealed(p, e);
        }
        if (k->type != T_INT) return unexpected(p, "a name or number after '.'");
        next(p);
        lm__cnode *key = node(p, N_CONST, k), *e = at_obj(node(p, N_GETITEM, at), obj);
        if (!key || !e) return NULL;
        key->k = lm__cv_int(k->i);
        e->a = obj, e->b = key;
        return sealed(p, e);
    }
    next(p); /* '[' */
    nvec args = {0};
    while (!is_op(cur(p), TO_RBRACKET)) {
        if (args.n && !expect_op(p, TO_COMMA)) return NULL;
        if (args.n && is_op(cur(p), TO_RBRACKET)) break;
        lm__cnode *s = parse_subscribed(p);
        if (!s || !nvec_push(p, &args, s)) return NULL;
    }
    if (!expect_op(p, TO_RBRACKET)) return NULL;
    lm__cnode *key;
    if (args.n == 1) {
        key = args.v[0];
    } else {
        if (!(key = node(p, N_TUPLE, at))) return NULL;
        key->kids = args.v, key->n = args.n;
        if (!sealed(p, key)) return NULL;
    }
    lm__cnode *e = at_obj(node(p, N_GETITEM, at), obj);
    if (!e) return NULL;
    e->a = obj, e->b = key;
    return sealed(p, e);
}

static lm__cnode *parse_postfix(parser *p, lm__cnode *e) {
    while (e) {
        if (is_op(cur(p), TO_DOT) || is_op(cur(p), TO_LBRACKET)) e = parse_subscript(p, e);
        else if (is_op(cur(p), TO_LPAREN)) e = parse_call(p, e);
        else break;
    }
    return e;
}

/* A filter or test name, dotted parts joined ("a.b"), into name[cap] (cut at cap - 1);
 * 0 after recording the error when a part is not a name. */
static int dotted_name(parser *p, char *name, size_t cap, size_t *n) {
    *n = 0;
    for (;;) {
        const lm__ctok *q = cur(p);
        if (q->type != T_NAME) {
            unexpected(p, "a name"); /* records the error; returns NULL */
            return 0;
        }
        int w = snprintf(name + *n, cap - *n, "%s%.*s", *n ? "." : "", (int)q->n, q->p);
        *n = LM_MIN(cap - 1, *n + (size_t)LM_MAX(w, 0));
        next(p);
        if (!is_op(cur(p), TO_DOT)) return 1;
        next(p);
    }
}

static lm__cnode *parse_filter(parser *p, lm__cnode *operand, int start_inline) {
    lm__cnode *e = operand;
    while (is_op(cur(p), TO_PIPE) || start_inline) {
        if (!start_inline) next(p);
        start_inline = 0;
        const lm__ctok *k = cur(p);
        if (k->type != T_NAME) return unexpected(p, "a filter name");
        char name[128];
        size_t n = 0;
        if (!dotted_name(p, name, sizeof name, &n)) return NULL; /* dotted names are syntax; no filter has one */
        int id = lm__chat_filter_id(name, n);
        if (id == -2) return fail(p, LM_UNSUPPORTED, k, "unsupported filter '%s'", name);
        if (id < 0) return fail(p, LM_PARSE_ERROR, k, "unknown filter '%s'", name);
        lm__cnode *f = node(p, N_FILTER, k);
        if (!f) return NULL;
        f->a = e;
        f->id = id;
        f->k = lm__cv_str(k->p, k->n);
        if (is_op(cur(p), TO_LPAREN) && !parse_call_args(p, f)) return NULL;
        if (!(e = sealed(p, f))) return NULL;
    }
    return e;
}

static lm__cnode *parse_test(parser *p, lm__cnode *operand) {
    const lm__ctok *is = cur(p);
    next(p);
    int negated = 0;
    if (is_name(cur(p), "not")) {
        next(p);
        negated = 1;
    }
    const lm__ctok *k = cur(p);
    if (k->type != T_NAME) return unexpected(p, "a test name");
    char name[128];
    size_t n = 0;
    if (!dotted_name(p, name, sizeof name, &n)) return NULL;
    int id = lm__chat_test_id(name, n);
    if (id == -2) return fail(p, LM_UNSUPPORTED, k, "unsupported test '%s'", name);
    if (id < 0) return fail(p, LM_PARSE_ERROR, k, "unknown test '%s'", name);
    lm__cnode *t = node(p, N_TEST, is);
    if (!t) return NULL;
    t->a = operand;
    t->id = id;
    t->k = lm__cv_str(k->p, k->n);
    const lm__ctok *c = cur(p);
    if (is_op(c, TO_LPAREN)) {
        if (!parse_call_args(p, t)) return NULL;
    } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT ||
                is_op(c, TO_LPAREN) || is_op(c, TO_LBRACKET) || is_op(c, TO_LBRACE)) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) return fail(p, LM_PARSE_ERROR, c, "you cannot chain multiple tests with 'is'");
        lm__cnode *arg = parse_postfix(p, parse_primary(p));
        if (!arg) return NULL;
        lm__cnode **kids = lm__chat_alloc(&p->t->arena, sizeof *kids);
        if (!kids) return oom(p);
        kids[0] = arg;
        t->kids = kids, t->n = 1;
    }
    if (!sealed(p, t)) return NULL;
    if (!negated) return t;
    lm__cnode *e = node(p, N_NOT, is);
    if (!e) return NULL;
    e->a = t;
    return sealed(p, e);
}

static lm__cnode *parse_filter_expr(parser *p, lm__cnode *e) {
    while (e) {
        if (is_op(cur(p), TO_PIPE)) e = parse_filter(p, e, 0);
        else if (is_name(cur(p), "is")) e = parse_test(p, e);
        else if (is_op(cur(p), TO_LPAREN)) e = parse_call(p, e);
        else break;
    }
    return e;
}

static lm__cnode *parse_list_or_dict(parser *p, int dict) {
    const lm__ctok *at = cur(p);
    next(p);
    int close = dict ? TO_RBRACE : TO_RBRACKET;
    nvec items = {0};
    while (!is_op(cur(p), close)) {
        if (items.n && !expect_op(p, TO_COMMA)) return NULL;
        if (is_op(cur(p), close)) break;
        lm__cnode *k = parse_expression(p, 1);
        if (!k || !nvec_push(p, &items, k)) return NULL;
        if (dict) {
            if (!expect_op(p, TO_COLON)) return NULL;
            lm__cnode *v = parse_expression(p, 1);
            if (!v || !nvec_push(p, &items, v)) return NULL;
        }
    }
    if (!expect_op(p, close)) return NULL;
    lm__cnode *e = node(p, dict ? N_DICT : N_LIST, at);
    if (!e) return NULL;
    e->kids = items.v, e->n = items.n;
    return sealed(p, e);
}

static lm__cnode *parse_primary(parser *p) {
    const lm__ctok *k = cur(p);
    if (p->err != LM_OK) return NULL;
    if (k->type == T_NAME) {
        lm__cnode *e;
        if (is_name(k, "true") || is_name(k, "True") || is_name(k, "false") || is_name(k, "False")) {
            if (!(e = node(p, N_CONST, k))) return NULL;
            e->k = lm__cv_bool(k->p[0] == 't' || k->p[0] == 'T');
        } else if (is_name(k, "none") || is_name(k, "None")) {
            if (!(e = node(p, N_CONST, k))) return NULL;
            e->k = lm__cv_none();
        } else {
            e = make_name(p, k);
        }
        next(p);
        return e;
    }
    if (k->type == T_STRING) {
        size_t total = 0;
        int32_t count = 0;
        for (int32_t i = p->pos; p->tk[i].type == T_STRING; i++) total += p->tk[i].n, count++;
        lm__cnode *e = node(p, N_CONST, k);
        if (!e) return NULL;
        if (count == 1) {
            e->k = lm__cv_str(k->p, k->n);
            next(p);
            return e;
        }
        char *buf = lm__chat_alloc(&p->t->arena, total + 1);
        if (!buf) return oom(p);
        size_t o = 0;
        for (int32_t i = 0; i < count; i++) {
            memcpy(buf + o, cur(p)->p, cur(p)->n);
            o += cur(p)->n;
            next(p);
        }
        e->k = lm__cv_str(buf, o);
        return e;
    }
    if (k->type == T_INT || k->type == T_FLOAT) {
        lm__cnode *e = node(p, N_CONST, k);
        if (!e) return NULL;
        e->k = k->type == T_INT ? lm__cv_int(k->i) : lm__cv_float(k->f);
        next(p);
        return e;
    }
    if (is_op(k, TO_LPAREN)) {
        next(p);
        lm__cnode *e = parse_tuple(p, 0, 1, NULL, 1);
        if (!e || !expect_op(p, TO_RPAREN)) return NULL;
        return e;
    }
    if (is_op(k, TO_LBRACKET)) return parse_list_or_dict(p, 0);
    if (is_op(k, TO_LBRACE)) return parse_list_or_dict(p, 1);
    return unexpected(p, NULL);
}

static lm__cnode *parse_unary(parser *p, int with_filter) {
    if (!enter(p)) return NULL;
    const lm__ctok *k = cur(p);
    lm__cnode *e;
    if (is_op(k, TO_SUB) || is_op(k, TO_ADD)) {
        next(p);
        lm__cnode *a = parse_unary(p, 0);
        if (!a || !(e = node(p, is_op(k, TO_SUB) ? N_NEG : N_POS, k))) return NULL;
        e->a = a;
        e = sealed(p, e);
    } else {
        e = parse_primary(p);
    }
    e = parse_postfix(p, e);
    if (with_filter) e = parse_filter_expr(p, e);
    p->depth--;
    return e;
}

static lm__cnode *binop(parser *p, uint8_t type, uint8_t op, lm__cnode *a, lm__cnode *b, const lm__ctok *at) {
    if (!a || !b) return NULL;
    lm__cnode *e = node(p, type, at);
    if (!e) return NULL;
    e->op = op;
    e->a = a, e->b = b;
    e->line = a->line, e->col = a->col;
    return sealed(p, e);
}

static lm__cnode *parse_pow(parser *p) {
    lm__cnode *e = parse_unary(p, 1);
    while (e && is_op(cur(p), TO_POW)) {
        const lm__ctok *at = cur(p);
        next(p);
        e = binop(p, N_BINOP, OP_POW, e, parse_unary(p, 1), at);
    }
    return e;
}

static lm__cnode *parse_math2(parser *p) {
    lm__cnode *e = parse_pow(p);
    for (;;) {
        const lm__ctok *at = cur(p);
        int op = is_op(at, TO_MUL) ? OP_MUL : is_op(at, TO_DIV) ? OP_DIV : is_op(at, TO_FLOORDIV) ? OP_FLOORDIV
               : is_op(at, TO_MOD) ? OP_MOD : -1;
        if (!e || op < 0) return e;
        next(p);
        e = binop(p, N_BINOP, (uint8_t)op, e, parse_pow(p), at);
    }
}

static lm__cnode *parse_concat(parser *p) {
    const lm__ctok *at = cur(p);
    lm__cnode *first = parse_math2(p);
    if (!first || !is_op(cur(p), TO_TILDE)) return first;
    nvec args = {0};
    if (!nvec_push(p, &args, first)) return NULL;
    while (is_op(cur(p), TO_TILDE)) {
        next(p);
        lm__cnode *x = parse_math2(p);
        if (!x || !nvec_push(p, &args, x)) return NULL;
    }
    lm__cnode *e = node(p, N_CONCAT, at);
    if (!e) return NULL;
    e->kids = args.v, e->n = args.n;
    return sealed(p, e);
}

static lm__cnode *parse_math1(parser *p) {
    lm__cnode *e = parse_concat(p);
    for (;;) {
        const lm__ctok *at = cur(p);
        int op = is_op(at, TO_ADD) ? OP_ADD : is_op(at, TO_SUB) ? OP_SUB : -1;
        if (!e || op < 0) return e;
        next(p);
        e = binop(p, N_BINOP, (uint8_t)op, e, parse_concat(p), at);
    }
}

static lm__cnode *parse_compare(parser *p) {
    const lm__ctok *at = cur(p);
    lm__cnode *first = parse_math1(p);
    if (!first) return NULL;
    nvec rhs = {0};
    uint8_t ops[64];
    int32_t nops = 0;
    for (;;) {
        const lm__ctok *k = cur(p);
        int op = -1;
        if (k->type == T_OP) {
            op = k->op == TO_EQ ? CMP_EQ : k->op == TO_NE ? CMP_NE : k->op == TO_LT ? CMP_LT : k->op == TO_LE ? CMP_LE
               : k->op == TO_GT ? CMP_GT : k->op == TO_GE ? CMP_GE : -1;
            if (op >= 0) next(p);
        } else if (is_name(k, "in")) {
            op = CMP_IN;
            next(p);
        } else if (is_name(k, "not") && is_name(look(p), "in")) {
            op = CMP_NOTIN;
            next(p);
            next(p);
        }
        if (op < 0) break;
        if (nops == (int32_t)sizeof ops) return fail(p, LM_OUT_OF_RANGE, k, "too many chained comparisons");
        ops[nops++] = (uint8_t)op;
        lm__cnode *x = parse_math1(p);
        if (!x || !nvec_push(p, &rhs, x)) return NULL;
    }
    if (!nops) return first;
    lm__cnode *e = node(p, N_COMPARE, at);
    if (!e) return NULL;
    e->a = first;
    e->kids = rhs.v, e->n = rhs.n;
    if (!(e->ops = lm__chat_alloc(&p->t->arena, (size_t)nops))) return oom(p);
    memcpy(e->ops, ops, (size_t)nops);
    return sealed(p, e);
}

static lm__cnode *parse_not(parser *p) {
    if (is_name(cur(p), "not")) {
        const lm__ctok *at = cur(p);
        if (!enter(p)) return NULL;
        next(p);
        lm__cnode *a = parse_not(p);
        p->depth--;
        lm__cnode *e = a ? node(p, N_NOT, at) : NULL;
        if (!e) return NULL;
        e->a = a;
        return sealed(p, e);
    }
    return parse_compare(p);
}

static lm__cnode *parse_and(parser *p) {
    lm__cnode *e = parse_not(p);
    while (e && is_name(cur(p), "and")) {
        const lm__ctok *at = cur(p);
        next(p);
        e = binop(p, N_AND, 0, e, parse_not(p), at);
    }
    return e;
}

static lm__cnode *parse_or(parser *p) {
    lm__cnode *e = parse_and(p);
    while (e && is_name(cur(p), "or")) {
        const lm__ctok *at = cur(p);
        next(p);
        e = binop(p, N_OR, 0, e, parse_and(p), at);
    }
    return e;
}

static lm__cnode *parse_condexpr(parser *p) {
    lm__cnode *e = parse_or(p);
    while (e && is_name(cur(p), "if")) {
        const lm__ctok *at = cur(p);
        next(p);
        lm__cnode *test = parse_or(p), *other = NULL;
        if (!test) return NULL;
        if (is_name(cur(p), "else")) {
            next(p);
            if (!(other = parse_condexpr(p))) return NULL;
        }
        lm__cnode *c = node(p, N_CONDEXPR, at);
        if (!c) return NULL;
        c->line = e->line, c->col = e->col;
        c->a = test, c->b = e, c->c = other;
        e = sealed(p, c);
    }
    return e;
}

static lm__cnode *parse_expression(parser *p, int with_condexpr) {
    if (!enter(p)) return NULL;
    lm__cnode *e = with_condexpr ? parse_condexpr(p) : parse_or(p);
    p->depth--;
    return e;
}

static int is_tuple_end(parser *p, const char *extra_end) {
    const lm__ctok *k = cur(p);
    if (k->type == T_VAR_END || k->type == T_BLOCK_END || is_op(k, TO_RPAREN)) return 1;
    return extra_end && is_name(k, extra_end);
}

static lm__cnode *parse_tuple(parser *p, int simplified, int with_condexpr, const char *extra_end,
                              int explicit_parens) {
    const lm__ctok *at = cur(p);
    nvec items = {0};
    int is_tuple = 0;
    for (;;) {
        if (items.n && !expect_op(p, TO_COMMA)) return NULL;
        if (is_tuple_end(p, extra_end)) break;
        lm__cnode *e = simplified ? parse_primary(p) : parse_expression(p, with_condexpr);
        if (!e || !nvec_push(p, &items, e)) return NULL;
        if (is_op(cur(p), TO_COMMA)) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_parens) return unexpected(p, "an expression");
    }
    lm__cnode *e = node(p, N_TUPLE, at);
    if (!e) return NULL;
    e->kids = items.v, e->n = items.n;
    return sealed(p, e);
}

/* ---- statements ------------------------------------------------------------------------------ */
static int subparse(parser *p, const char *const *end, nvec *body);
static lm__cnode *parse_statement(parser *p);

/* The assignable target of set / for / with: a name or a tuple of names. */
static lm__cnode *check_target(parser *p, lm__cnode *e) {
    if (!e) return NULL;
    if (e->type == N_NAME) {
        mark_bound(p, e->id);
        return e;
    }
    if (e->type == N_TUPLE) {
        for (int32_t i = 0; i < e->n; i++)
            if (!check_target(p, e->kids[i])) return NULL;
        return e;
    }
    lm__ctok at = {.line = e->line, .col = e->col};
    return fail(p, LM_PARSE_ERROR, &at, "cannot assign to this expression");
}

static lm__cnode *parse_assign_target(parser *p, const char *extra_end, int with_namespace) {
    const lm__ctok *k = cur(p);
    if (with_namespace && k->type == T_NAME && is_op(look(p), TO_DOT)) {
        next(p);
        next(p);
        const lm__ctok *attr = cur(p);
        if (attr->type != T_NAME) return unexpected(p, "an attribute name");
        next(p);
        lm__cnode *e = node(p, N_NSREF, k);
        if (!e) return NULL;
        e->id = intern(p, k->p, k->n);
        e->k = lm__cv_str(attr->p, attr->n);
        return e->id < 0 ? NULL : e;
    }
    return check_target(p, parse_tuple(p, 1, 1, extra_end, 0));
}

/* Statements up to one of the end tags; leaves the parser on that tag's name. */
static int parse_body(parser *p, const char *const *end, nvec *body, const lm__ctok *opener, const char *what) {
    if (!expect_block_end(p)) return 0;
    if (++p->stmt_depth > MAX_STMT_DEPTH) {
        fail(p, LM_OUT_OF_RANGE, opener, "statements nested more than %d deep", MAX_STMT_DEPTH);
        return 0;
    }
    int ok = subparse(p, end, body);
    p->stmt_depth--;
    if (!ok) return 0;
    if (cur(p)->type == T_EOF) {
        char tags[128] = "";
        size_t n = 0;
        for (int i = 0; end[i]; i++)
            n += (size_t)snprintf(tags + n, sizeof tags - n, "%s'%s'", i ? (end[i + 1] ? ", " : " or ") : "", end[i]);
        fail(p, LM_PARSE_ERROR, cur(p), "unexpected end of template: the '%s' at %d:%d is not closed (expected %s)",
             what, opener->line, opener->col, tags);
        return 0;
    }
    return 1;
}

static lm__cnode *parse_if(parser *p, const lm__ctok *at) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const end_only[] = {"endif", NULL};
    lm__cnode *top = node(p, N_IF, at), *e = top;
    if (!top) return NULL;
    for (;;) {
        if (!(e->a = parse_tuple(p, 0, 0, NULL, 0))) return NULL;
        nvec body = {0};
        if (!parse_body(p, ends, &body, at, "if")) return NULL;
        e->kids = body.v, e->n = body.n;
        if (is_name(cur(p), "elif")) {
            const lm__ctok *k = cur(p);
            next(p);
            lm__cnode *sub = node(p, N_IF, k);
            if (!sub) return NULL;
            if (!(e->kids2 = lm__chat_alloc(&p->t->arena, sizeof(lm__cnode *)))) return oom(p);
            e->kids2[0] = sub, e->n2 = 1;
            e = sub;
            continue;
        }
        if (is_name(cur(p), "else")) {
            next(p);
            nvec other = {0};
            if (!parse_body(p, end_only, &other, at, "if")) return NULL;
            e->kids2 = other.v, e->n2 = other.n;
        }
        next(p); /* endif */
        return top;
    }
}

static lm__cnode *parse_for(parser *p, const lm__ctok *at) {
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const end_only[] = {"endfor", NULL};
    lm__cnode *e = node(p, N_FOR, at);
    if (!e || !(e->a = parse_assign_target(p, "in", 0))) return NULL;
    if (!is_name(cur(p), "in")) return unexpected(p, "'in'");
    next(p);
    if (!(e->b = parse_tuple(p, 0, 0, "recursive", 0))) return NULL;
    if (is_name(cur(p), "if")) {
        next(p);
        if (!(e->c = parse_expression(p, 1))) return NULL;
    }
    if (is_name(cur(p), "recursive")) return fail(p, LM_UNSUPPORTED, cur(p), "unsupported recursive for loop");
    nvec body = {0}, other = {0};
    p->loops++;
    int ok = parse_body(p, ends, &body, at, "for");
    p->loops--;
    if (!ok) return NULL;
    if (is_name(cur(p), "else")) {
        next(p);
        if (!parse_body(p, end_only, &other, at, "for")) return NULL;
    }
    next(p); /* endfor */
    e->kids = body.v, e->n = body.n;
    e->kids2 = other.v, e->n2 = other.n;
    return e;
}

/* A filter chain for block set / filter blocks: its innermost operand is NULL. */
static lm__cnode *parse_filter_chain(parser *p) { return parse_filter(p, NULL, 1); }

static lm__cnode *parse_set(parser *p, const lm__ctok *at) {
    static const char *const ends[] = {"endset", NULL};
    lm__cnode *target = parse_assign_target(p, NULL, 1);
    if (!target) return NULL;
    if (is_op(cur(p), TO_ASSIGN)) {
        next(p);
        lm__cnode *e = node(p, N_SET, at);
        if (!e || !(e->b = parse_tuple(p, 0, 1, NULL, 0))) return NULL;
        e->a = target;
        return e;
    }
    lm__cnode *e = node(p, N_SET_BLOCK, at);
    if (!e) return NULL;
    e->a = target;
    if (is_op(cur(p), TO_PIPE)) {
        next(p);
        if (!(e->c = parse_filter_chain(p))) return NULL;
    }
    nvec body = {0};
    if (!parse_body(p, ends, &body, at, "set")) return NULL;
    next(p);
    e->kids = body.v, e->n = body.n;
    return e;
}

/* "(a, b=default, ...)" of a macro or call block. */
static lm__cparams *parse_signature(parser *p) {
    lm__cparams *ps = lm__chat_alloc(&p->t->arena, sizeof *ps);
    if (!ps) return oom(p);
    memset(ps, 0, sizeof *ps);
    if (!expect_op(p, TO_LPAREN)) return NULL;
    nvec defaults = {0};
    int32_t cap = 0;
    while (!is_op(cur(p), TO_RPAREN)) {
        if (ps->n && !expect_op(p, TO_COMMA)) return NULL;
        const lm__ctok *k = cur(p);
        if (k->type != T_NAME) return unexpected(p, "a parameter name");
        if (is_name(k, "true") || is_name(k, "false") || is_name(k, "none") || is_name(k, "True") ||
            is_name(k, "False") || is_name(k, "None"))
            return fail(p, LM_PARSE_ERROR, k, "cannot use '%.*s' as a parameter name", (int)k->n, k->p);
        int32_t id = intern(p, k->p, k->n);
        if (id < 0) return NULL;
        mark_bound(p, id);
        next(p);
        lm__cnode *def = NULL;
        if (is_op(cur(p), TO_ASSIGN)) {
            next(p);
            if (!(def = parse_expression(p, 1))) return NULL;
        } else if (defaults.n && defaults.v[defaults.n - 1]) {
            return fail(p, LM_PARSE_ERROR, k, "non-default argument follows default argument");
        }
        if (ps->n == cap) {
            int32_t c2 = cap ? 2 * cap : 4;
            int32_t *ids = lm__chat_grow(&p->t->arena, ps->ids, (size_t)cap * sizeof *ids, (size_t)c2 * sizeof *ids);
            if (!ids) return oom(p);
            ps->ids = ids, cap = c2;
        }
        ps->ids[ps->n++] = id;
        if (!nvec_push(p, &defaults, def)) return NULL;
    }
    next(p);
    ps->defaults = defaults.v;
    return ps;
}

/* A macro or call-block body: a frame of its own (break/continue do not cross it). */
static int parse_frame_body(parser *p, lm__cparams *ps, const char *const *end, nvec *body, const lm__ctok *at,
                            const char *what) {
    frame f = {.params = ps, .outer = p->fr};
    int loops = p->loops;
    p->fr = &f;
    p->loops = 0;
    int ok = parse_body(p, end, body, at, what);
    p->fr = f.outer;
    p->loops = loops;
    return ok;
}

static lm__cnode *parse_macro(parser *p, const lm__ctok *at) {
    static const char *const ends[] = {"endmacro", NULL};
    const lm__ctok *k = cur(p);
    if (k->type != T_NAME) return unexpected(p, "a macro name");
    lm__cnode *e = node(p, N_MACRO, at);
    if (!e) return NULL;
    e->id = intern(p, k->p, k->n);
    if (e->id < 0) return NULL;
    mark_bound(p, e->id);
    e->k = lm__cv_str(k->p, k->n);
    next(p);
    if (!(e->params = parse_signature(p))) return NULL;
    nvec body = {0};
    if (!parse_frame_body(p, e->params, ends, &body, at, "macro")) return NULL;
    next(p);
    e->kids = body.v, e->n = body.n;
    return e;
}

static lm__cnode *parse_call_block(parser *p, const lm__ctok *at) {
    static const char *const ends[] = {"endcall", NULL};
    lm__cnode *e = node(p, N_CALLBLOCK, at);
    if (!e) return NULL;
    if (is_op(cur(p), TO_LPAREN)) {
        if (!(e->params = parse_signature(p))) return NULL;
    } else {
        if (!(e->params = lm__chat_alloc(&p->t->arena, sizeof *e->params))) return oom(p);
        memset(e->params, 0, sizeof *e->params);
    }
    const lm__ctok *ck = cur(p);
    if (!(e->a = parse_expression(p, 1))) return NULL;
    if (e->a->type != N_CALL) return fail(p, LM_PARSE_ERROR, ck, "expected a call after 'call'");
    nvec body = {0};
    if (!parse_frame_body(p, e->params, ends, &body, at, "call")) return NULL;
    next(p);
    e->kids = body.v, e->n = body.n;
    return e;
}

static lm__cnode *parse_filter_block(parser *p, const lm__ctok *at) {
    static const char *const ends[] = {"endfilter", NULL};
    lm__cnode *e = node(p, N_FILTERBLOCK, at);
    if (!e || !(e->c = parse_filter_chain(p))) return NULL;
    nvec body = {0};
    if (!parse_body(p, ends, &body, at, "filter")) return NULL;
    next(p);
    e->kids = body.v, e->n = body.n;
    return e;
}

static lm__cnode *parse_with(parser *p, const lm__ctok *at) {
    static const char *const ends[] = {"endwith", NULL};
    lm__cnode *e = node(p, N_WITH, at);
    if (!e) return NULL;
    nvec pairs = {0};
    while (cur(p)->type != T_BLOCK_END) {
        if (pairs.n && !expect_op(p, TO_COMMA)) return NULL;
        lm__cnode *t = parse_assign_target(p, NULL, 0);
        if (!t || !expect_op(p, TO_ASSIGN)) return NULL;
        lm__cnode *v = parse_expression(p, 1);
        if (!v || !nvec_push(p, &pairs, t) || !nvec_push(p, &pairs, v)) return NULL;
    }
    nvec body = {0};
    if (!parse_body(p, ends, &body, at, "with")) return NULL;
    next(p);
    e->kids = body.v, e->n = body.n;
    e->kids2 = pairs.v, e->n2 = pairs.n;
    return e;
}

static lm__cnode *parse_generation(parser *p, const lm__ctok *at) {
    static const char *const ends[] = {"endgeneration", NULL};
    lm__cnode *e = node(p, N_SCOPE, at);
    if (!e) return NULL;
    nvec body = {0};
    if (!parse_frame_body(p, NULL, ends, &body, at, "generation")) return NULL;
    next(p);
    e->kids = body.v, e->n = body.n;
    return e;
}

static const char *const k_unsupported_tags[] = {"block", "extends", "include", "import", "from", "autoescape", NULL};

/* After "{%": one statement, its closing "%}" consumed. */
static lm__cnode *parse_statement(parser *p) {
    const lm__ctok *k = cur(p);
    if (k->type != T_NAME) return unexpected(p, "a tag name");
    next(p);
    lm__cnode *e = NULL;
    if (is_name(k, "if")) e = parse_if(p, k);
    else if (is_name(k, "for")) e = parse_for(p, k);
    else if (is_name(k, "set")) e = parse_set(p, k);
    else if (is_name(k, "macro")) e = parse_macro(p, k);
    else if (is_name(k, "call")) e = parse_call_block(p, k);
    else if (is_name(k, "filter")) e = parse_filter_block(p, k);
    else if (is_name(k, "with")) e = parse_with(p, k);
    else if (is_name(k, "generation")) e = parse_generation(p, k);
    else if (is_name(k, "print")) { /* {% print a, b %} prints each expression */
        nvec items = {0};
        while (cur(p)->type != T_BLOCK_END) {
            if (items.n && !expect_op(p, TO_COMMA)) return NULL;
            lm__cnode *x = parse_expression(p, 1);
            if (!x || !nvec_push(p, &items, x)) return NULL;
        }
        if ((e = node(p, N_OUTPUT, k))) e->kids = items.v, e->n = items.n;
    } else if (is_name(k, "break") || is_name(k, "continue")) {
        if (!p->loops) return fail(p, LM_PARSE_ERROR, k, "'%.*s' outside a for loop", (int)k->n, k->p);
        e = node(p, is_name(k, "break") ? N_BREAK : N_CONTINUE, k);
    } else {
        for (int i = 0; k_unsupported_tags[i]; i++)
            if (is_name(k, k_unsupported_tags[i]))
                return fail(p, LM_UNSUPPORTED, k, "unsupported tag '%s'", k_unsupported_tags[i]);
        return fail(p, LM_PARSE_ERROR, k, "unknown tag '%.*s'", (int)LM_MIN(k->n, 64), k->p);
    }
    if (!e || !expect_block_end(p)) return NULL;
    return e;
}

/* Statements until EOF (end == NULL) or a block tag whose name is in end. */
static int subparse(parser *p, const char *const *end, nvec *body) {
    for (;;) {
        const lm__ctok *k = cur(p);
        if (p->err != LM_OK) return 0;
        if (k->type == T_EOF) return 1; /* parse_body reports a missing end tag */
        if (k->type == T_DATA) {
            lm__cnode *e = node(p, N_DATA, k);
            if (!e) return 0;
            e->k = lm__cv_str(k->p, k->n);
            next(p);
            if (!nvec_push(p, body, e)) return 0;
            continue;
        }
        if (k->type == T_VAR_BEGIN) {
            next(p);
            lm__cnode *e = node(p, N_OUTPUT, k);
            if (!e || !(e->a = parse_tuple(p, 0, 1, NULL, 0))) return 0;
            if (cur(p)->type != T_VAR_END) {
                unexpected(p, "'}}' (end of print statement)");
                return 0;
            }
            next(p);
            if (!nvec_push(p, body, e)) return 0;
            continue;
        }
        if (k->type == T_BLOCK_BEGIN) {
            next(p);
            if (end)
                for (int i = 0; end[i]; i++)
                    if (is_name(cur(p), end[i])) return 1;
            const lm__ctok *t = cur(p);
            if (t->type == T_NAME &&
                ((t->n > 3 && memcmp(t->p, "end", 3) == 0) || is_name(t, "elif") || is_name(t, "else"))) {
                char tags[128] = "no open block takes it";
                size_t n = 0;
                for (int i = 0; end && end[i]; i++)
                    n += (size_t)snprintf(tags + n, sizeof tags - n, "%s'%s'", i ? (end[i + 1] ? ", " : " or ") : "expected ",
                                          end[i]);
                return !!fail(p, LM_PARSE_ERROR, t, "unexpected '%.*s' (%s)", (int)LM_MIN(t->n, 64), t->p, tags);
            }
            lm__cnode *e = parse_statement(p);
            if (!e || !nvec_push(p, body, e)) return 0;
            continue;
        }
        unexpected(p, NULL);
        return 0;
    }
}

/* Every call of a plain name must reach a global or a name the template binds. */
static void check_calls(parser *p) {
    for (int32_t i = 0; i < p->calls.n && p->err == LM_OK; i++) {
        const lm__cnode *call = p->calls.v[i], *callee = call->a;
        int32_t id = callee->id;
        if (id < p->cap_bound && p->bound[id]) continue;
        if (id == p->t->id_caller || id == p->t->id_loop) continue;
        const char *name = p->t->names[id];
        int g = -1;
        for (int k = 0; k < CG_COUNT; k++)
            if (strcmp(name, lm__chat_global_names[k]) == 0) g = k;
        lm__ctok at = {.line = callee->line, .col = callee->col};
        if (g >= 0 && lm__chat_global_unsupported(g)) fail(p, LM_UNSUPPORTED, &at, "unsupported global function '%s'", name);
        else if (g < 0) fail(p, LM_UNSUPPORTED, &at, "unknown function '%s' (neither a global loom provides nor a macro)", name);
    }
}

lm_status lm__chat_parse(lm_chat_template *t, const lm__ctok *toks, int32_t ntoks) {
    parser p = {.t = t, .tk = toks, .ntk = ntoks};
    t->id_loop = intern(&p, "loop", 4);
    t->id_varargs = intern(&p, "varargs", 7);
    t->id_kwargs = intern(&p, "kwargs", 6);
    t->id_caller = intern(&p, "caller", 6);
    if (p.err != LM_OK) return p.err;
    nvec body = {0};
    if (subparse(&p, NULL, &body)) check_calls(&p);
    if (p.err != LM_OK) return p.err;
    t->body = body.v;
    t->n = body.n;
    return LM_OK;
}
