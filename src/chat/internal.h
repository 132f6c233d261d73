/* chat/internal.h — the chat template interpreter's shared pieces (never installed).
 *
 * Pipeline: lex.c turns the source into tokens (whitespace control, trim_blocks and
 * lstrip_blocks are applied to the data tokens there, as Jinja's lexer does);
 * parse.c builds the syntax tree and resolves filter, test and global names;
 * eval.c runs the tree; value.c gives values Python's semantics (str(), repr, ==, <,
 * truthiness, json.dumps); filters.c holds the filters, tests and globals, methods.c
 * the methods of strings, dicts, lists and the loop variable; unicode.c and memory.c
 * the character classes and the arenas.
 *
 * Memory: a template owns one arena (source copy, tokens, tree, names); a render owns
 * another that holds every value it makes and is freed whole when the render ends.
 * Values therefore carry no reference counts, a failed render cannot leak, and cycles
 * (a namespace holding itself) are harmless. Values are never mutated after they are
 * built, except namespaces and the read position of generators (as in Python).
 *
 * Errors inside a render: functions return 0 on success and -1 on failure after
 * recording the first failure in the render context (lm__crt_fail); the public entry
 * point turns it into lm__error("chat template L:C: ...").
 */
#ifndef LOOM_CHAT_INTERNAL_H
#define LOOM_CHAT_INTERNAL_H

#include "base/internal.h"
#include "loom/chat.h"

#include <jansson.h>
#include <stdint.h>

/* ---- arena ----------------------------------------------------------------------- */
typedef struct lm__chat_chunk lm__chat_chunk;
typedef struct lm__chat_arena {
    lm__chat_chunk *head; /* newest chunk first */
    char *cur, *end;      /* free bytes of the head chunk */
    size_t total;         /* bytes taken from the allocation hook */
    size_t limit;         /* refuse to take more than this (0 = no limit) */
} lm__chat_arena;

/* 16-byte aligned, uninitialized. NULL when the hook fails or the limit is reached
 * (nothing is recorded: callers name the failure). */
void *lm__chat_alloc(lm__chat_arena *a, size_t n);
/* Resizes the block p of old bytes to n bytes (in place when it is the newest one). */
void *lm__chat_grow(lm__chat_arena *a, void *p, size_t old, size_t n);
void lm__chat_arena_free(lm__chat_arena *a); /* frees every chunk; a is zeroed */

/* ---- values ------------------------------------------------------------------------- */
typedef enum lm__cv_kind {
    CV_UNDEF, /* Jinja Undefined; u.s.p = the message it raises when used (or NULL) */
    CV_NONE,
    CV_BOOL,
    CV_INT, /* 64-bit; Python ints are unbounded, overflow is an error here */
    CV_FLOAT,
    CV_STR,   /* u.s: UTF-8 bytes, not NUL-terminated */
    CV_LIST,  /* list, tuple, dict views, generators: u.l */
    CV_DICT,  /* u.d, insertion-ordered */
    CV_NS,    /* namespace(): u.d, the only mutable value */
    CV_RANGE, /* u.r */
    CV_FUNC,  /* global function, bound method, macro or caller: u.fn */
    CV_LOOP   /* the loop variable of a for: u.loop */
} lm__cv_kind;

/* Kinds of CV_LIST, for repr, subscripting and len(). */
typedef enum lm__cl_kind {
    CL_LIST,
    CL_TUPLE,
    CL_ITEMS,  /* dict_items: a list of 2-tuples */
    CL_KEYS,   /* dict_keys */
    CL_VALUES, /* dict_values */
    CL_GEN     /* a generator or iterator: read once, no len(), truthy even when empty */
} lm__cl_kind;

typedef struct lm__cv lm__cv;
typedef struct lm__cv_list lm__cv_list;
typedef struct lm__cv_dict lm__cv_dict;
typedef struct lm__cv_range lm__cv_range;
typedef struct lm__cv_func lm__cv_func;
typedef struct lm__cv_loop lm__cv_loop;

struct lm__cv {
    uint8_t kind; /* lm__cv_kind */
    union {
        int b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        lm__cv_list *l;
        lm__cv_dict *d;
        lm__cv_range *r;
        lm__cv_func *fn;
        lm__cv_loop *loop;
    } u;
};

struct lm__cv_list {
    int64_t n;
    lm__cv *v;            /* [n] */
    uint8_t kind;         /* lm__cl_kind */
    int64_t pos;          /* CL_GEN: items before pos were consumed */
    const char *gen_name; /* CL_GEN: Python type name ("generator", "list_reverseiterator") */
};

struct lm__cv_dict {
    int64_t n, cap;
    lm__cv *k, *v; /* [cap]; the first n are live */
};

struct lm__cv_range {
    int64_t start, stop, step, n; /* items start + i*step for i in [0, n) */
};

typedef enum lm__cfn_kind { CF_GLOBAL, CF_METHOD, CF_MACRO, CF_CALLER } lm__cfn_kind;

typedef struct lm__cnode lm__cnode;
typedef struct lm__scope lm__scope;

struct lm__cv_func {
    uint8_t kind;          /* lm__cfn_kind */
    int16_t id;            /* CF_GLOBAL: lm__cglobal; CF_METHOD: lm__cmethod */
    lm__cv self;           /* CF_METHOD: the receiver */
    const lm__cnode *node; /* CF_MACRO: the macro; CF_CALLER: the call block */
    lm__scope *closure;    /* CF_MACRO / CF_CALLER: scope the body sees */
};

struct lm__cv_loop {
    int64_t i, n;        /* index0, length */
    const lm__cv *items; /* [n] */
    lm__cv changed;      /* last value given to loop.changed() */
    int has_changed;
};

static inline lm__cv lm__cv_none(void) {
    lm__cv v = {.kind = CV_NONE};
    return v;
}
static inline lm__cv lm__cv_undef(const char *hint) {
    lm__cv v = {.kind = CV_UNDEF};
    v.u.s.p = hint;
    return v;
}
static inline lm__cv lm__cv_bool(int b) {
    lm__cv v = {.kind = CV_BOOL};
    v.u.b = !!b;
    return v;
}
static inline lm__cv lm__cv_int(int64_t i) {
    lm__cv v = {.kind = CV_INT};
    v.u.i = i;
    return v;
}
static inline lm__cv lm__cv_float(double f) {
    lm__cv v = {.kind = CV_FLOAT};
    v.u.f = f;
    return v;
}
static inline lm__cv lm__cv_str(const char *p, size_t n) {
    lm__cv v = {.kind = CV_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
static inline lm__cv lm__cv_of_list(lm__cv_list *l) {
    lm__cv v = {.kind = CV_LIST};
    v.u.l = l;
    return v;
}

/* ---- syntax tree --------------------------------------------------------------------- */
typedef enum lm__cnode_type {
    /* expressions */
    N_CONST,    /* k */
    N_NAME,     /* id */
    N_NSREF,    /* assignment target ns.attr: id = ns name, k = attr */
    N_GETATTR,  /* a.k (k: the attribute name) */
    N_GETITEM,  /* a[b]; b may be an N_SLICE */
    N_SLICE,    /* a:b:c, each may be NULL */
    N_CALL,     /* a(kids): n positional then nkw keyword values, names in kw */
    N_FILTER,   /* a|id(kids) (a NULL: the filtered text of a block); k = name */
    N_TEST,     /* a is id(kids); k = name */
    N_BINOP,    /* a op b */
    N_NEG,      /* -a */
    N_POS,      /* +a */
    N_NOT,      /* not a */
    N_AND,      /* a and b */
    N_OR,       /* a or b */
    N_COMPARE,  /* a ops[0] kids[0] ops[1] kids[1] ... (chained, as Python) */
    N_CONDEXPR, /* b if a else c (c may be NULL) */
    N_CONCAT,   /* kids[0] ~ kids[1] ~ ... */
    N_LIST,     /* [kids] */
    N_TUPLE,    /* (kids) */
    N_DICT,     /* {kids[0]: kids[1], ...}: n = 2 * pairs */
    /* statements (bodies in kids, else branches in kids2) */
    N_DATA,        /* literal text k */
    N_OUTPUT,      /* {{ a }}; {% print kids %} when a is NULL */
    N_IF,          /* if a: kids else kids2 (elif: an N_IF alone in kids2) */
    N_FOR,         /* for a in b if c: kids else kids2 */
    N_SET,         /* a = b (a: N_NAME, N_TUPLE of N_NAME, or N_NSREF) */
    N_SET_BLOCK,   /* a = text of kids, through the filter chain c (or NULL) */
    N_MACRO,       /* macro id(params) kids; see lm__cparams */
    N_CALLBLOCK,   /* call(params) a: kids is the caller's body */
    N_FILTERBLOCK, /* the text of kids through the filter chain c */
    N_WITH,        /* with kids2 = (target, value) pairs: kids */
    N_BREAK,
    N_CONTINUE,
    N_SCOPE /* {% generation %}: kids in a child scope */
} lm__cnode_type;

typedef enum lm__cbinop { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW } lm__cbinop;
typedef enum lm__ccmp { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN } lm__ccmp;

/* Macro and caller signatures. */
typedef struct lm__cparams {
    int32_t n;
    int32_t *ids;          /* [n] parameter name ids */
    lm__cnode **defaults;  /* [n] default expression or NULL */
    uint8_t uses_varargs, uses_kwargs, uses_caller;
} lm__cparams;

struct lm__cnode {
    uint8_t type; /* lm__cnode_type */
    uint8_t op;   /* N_BINOP: lm__cbinop */
    int32_t line, col;
    int32_t id;    /* N_NAME, N_NSREF, N_MACRO: name id; N_FILTER / N_TEST: builtin id */
    int32_t depth; /* nesting of the expression below and including this node */
    lm__cv k;      /* constant / text / attribute name / filter or test or macro name */
    lm__cnode *a, *b, *c;
    lm__cnode **kids; /* [n] */
    int32_t n;
    int32_t nkw;      /* calls, filters, tests: the last nkw kids are keyword arguments */
    int32_t *kw;      /* [nkw] their name ids */
    uint8_t *ops;     /* N_COMPARE: [n] lm__ccmp */
    lm__cnode **kids2; /* [n2] */
    int32_t n2;
    lm__cparams *params; /* N_MACRO, N_CALLBLOCK */
};

/* ---- tokens ----------------------------------------------------------------------------- */
typedef enum lm__ctok_type {
    T_EOF,
    T_DATA,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP
} lm__ctok_type;

/* Operator tokens. */
typedef enum lm__ctok_op {
    TO_ADD, TO_SUB, TO_DIV, TO_FLOORDIV, TO_MUL, TO_POW, TO_MOD, TO_TILDE,
    TO_LBRACKET, TO_RBRACKET, TO_LPAREN, TO_RPAREN, TO_LBRACE, TO_RBRACE,
    TO_EQ, TO_NE, TO_GT, TO_GE, TO_LT, TO_LE, TO_ASSIGN, TO_DOT, TO_COLON,
    TO_PIPE, TO_COMMA, TO_SEMICOLON
} lm__ctok_op;

typedef struct lm__ctok {
    uint8_t type, op;
    int32_t line, col;
    const char *p; /* T_DATA / T_STRING: the (decoded) text; T_NAME: the name */
    size_t n;
    int64_t i;     /* T_INT */
    double f;      /* T_FLOAT */
} lm__ctok;

/* ---- the template ------------------------------------------------------------------------ */
enum { LM__CHAT_NLIMITS = 5 };

struct lm_chat_template {
    lm__chat_arena arena; /* everything below lives here */
    lm__cnode **body;
    int32_t n;
    const char **names; /* [nnames] interned identifiers, NUL-terminated */
    int32_t nnames, cap_names;
    int32_t *name_hash; /* [hash_cap] open addressing: id + 1, 0 = empty */
    int32_t hash_cap;
    int8_t *global_of; /* [nnames] lm__cglobal named by each identifier, or -1 */
    int32_t id_loop, id_varargs, id_kwargs, id_caller;
    const char *bos, *eos; /* NULL: undefined */
    int64_t limits[LM__CHAT_NLIMITS];
};

/* Interns name[0..n) (parse time). Returns its id, or -1 when out of memory. */
int32_t lm__chat_intern(lm_chat_template *t, const char *name, size_t n);
/* The id of a name, or -1 when the template never mentions it. */
int32_t lm__chat_name_id(const lm_chat_template *t, const char *name, size_t n);

/* "chat template L:C: <fmt>" recorded with lm__error. */
lm_status lm__chat_syntax_error(lm_status s, int32_t line, int32_t col, const char *fmt, ...) LM__PRINTF(4, 5);

/* Normalizes newlines, drops one trailing newline and tokenizes source (lex.c). */
lm_status lm__chat_lex(lm_chat_template *t, const char *src, size_t n, lm__ctok **toks, int32_t *ntoks);
/* Builds t->body from the tokens (parse.c). */
lm_status lm__chat_parse(lm_chat_template *t, const lm__ctok *toks, int32_t ntoks);

/* ---- a render ------------------------------------------------------------------------------- */
typedef struct lm__csink {
    char *p;
    size_t n, cap;
} lm__csink;

struct lm__scope {
    lm__scope *parent;
    int32_t n, cap;
    int32_t *ids;  /* [cap] */
    lm__cv *vals;  /* [cap] */
};

typedef struct lm__crt {
    const lm_chat_template *t;
    lm__chat_arena arena;
    lm__csink *out;   /* where output goes now (a capture while a macro runs) */
    lm__scope *root;  /* the render variables; set at top level writes here */
    lm__scope *scope; /* the innermost scope of the statement running now */
    lm_status status; /* LM_OK until the first failure */
    char msg[1024];
    int32_t line, col;
    int depth;          /* recursion depth of evaluation (stack guard) */
    int calls;          /* nested macro calls */
    int64_t iterations; /* loop iterations so far */
    int64_t work;       /* steps so far (LM_CHAT_LIMIT_WORK) */
    int64_t max_str, max_iter, max_work;
    int max_calls;
} lm__crt;

/* Records the first failure (status, message, position of at) and returns -1. */
int lm__crt_fail(lm__crt *c, const lm__cnode *at, lm_status s, const char *fmt, ...) LM__PRINTF(4, 5);
/* Allocation inside a render; records LM_OUT_OF_MEMORY / the memory limit on failure. */
void *lm__crt_alloc(lm__crt *c, const lm__cnode *at, size_t n);
/* Charges units steps of work; fails (-1) past LM_CHAT_LIMIT_WORK. O(n) builtins charge
 * the items they visit (or bytes / 64), so no render can spin without bound. */
int lm__crt_charge(lm__crt *c, const lm__cnode *at, int64_t units);
/* A fresh uninitialized string of n bytes (checked against the string limit). */
char *lm__crt_strbuf(lm__crt *c, const lm__cnode *at, size_t n);
/* A new list of n items (uninitialized) of kind k. */
lm__cv_list *lm__crt_list(lm__crt *c, const lm__cnode *at, int64_t n, lm__cl_kind k);
lm__cv_dict *lm__crt_dict(lm__crt *c, const lm__cnode *at, int64_t cap);
/* Sets d[k] = v (replacing an equal key's value, keeping its position). */
int lm__crt_dict_set(lm__crt *c, const lm__cnode *at, lm__cv_dict *d, lm__cv k, lm__cv v);
/* A message formatted into the arena (NULL when out of memory: then c has failed). */
const char *lm__crt_printf(lm__crt *c, const lm__cnode *at, const char *fmt, ...) LM__PRINTF(3, 4);

int lm__csink_put(lm__crt *c, const lm__cnode *at, lm__csink *s, const char *p, size_t n);
int lm__csink_putc(lm__crt *c, const lm__cnode *at, lm__csink *s, char ch);
/* The sink's text as a string value (no copy: the sink must not be written again). */
lm__cv lm__csink_value(const lm__csink *s);

/* ---- Python semantics (value.c) ---------------------------------------------------------------- */
int lm__cv_truthy(const lm__cv *v);
/* Python's type name: 'str', 'int', 'NoneType', 'Undefined', 'dict', 'generator', ... */
const char *lm__cv_type_name(const lm__cv *v);
/* Jinja's object_type_repr: "None", "dict object", "str object", ... */
const char *lm__cv_object_repr(const lm__cv *v);
/* str(v) appended to s / repr(v) appended to s. */
int lm__cv_write_str(lm__crt *c, const lm__cnode *at, const lm__cv *v, lm__csink *s);
int lm__cv_write_repr(lm__crt *c, const lm__cnode *at, const lm__cv *v, lm__csink *s);
/* str(v) as a string value (strings are returned as they are). */
int lm__cv_to_str(lm__crt *c, const lm__cnode *at, const lm__cv *v, lm__cv *out);
/* Python ==: 1 or 0; -1 on failure (nesting too deep). */
int lm__cv_eq(lm__crt *c, const lm__cnode *at, const lm__cv *a, const lm__cv *b);
/* Python a < b: 1 or 0; -1 with a TypeError worded as Python's. */
int lm__cv_lt(lm__crt *c, const lm__cnode *at, const lm__cv *a, const lm__cv *b);
/* a op b for op in CMP_LT, CMP_LE, CMP_GT, CMP_GE: 1 or 0; -1 on failure. */
int lm__cv_compare(lm__crt *c, const lm__cnode *at, const lm__cv *a, const lm__cv *b, int op);
/* Items of an iterable (list, tuple, view, generator — consuming it —, range, string
 * as 1-character strings, dict keys, Undefined: none). TypeError for the rest. */
int lm__cv_iter(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cv **items, int64_t *n);
/* len(v): -1 with a TypeError when v has none. */
int lm__cv_len(lm__crt *c, const lm__cnode *at, const lm__cv *v, int64_t *n);
/* Python `needle in hay`: 1 / 0, -1 on TypeError. */
int lm__cv_contains(lm__crt *c, const lm__cnode *at, const lm__cv *hay, const lm__cv *needle);
/* Looks key up in d: the index or -1. */
int64_t lm__cv_dict_find(const lm__cv_dict *d, const lm__cv *key);

/* json.dumps options (transformers' tojson). */
typedef struct lm__cjson_opts {
    int ensure_ascii, sort_keys;
    const char *indent; /* NULL: no newlines */
    size_t indent_n;
    const char *item_sep, *key_sep;
    size_t item_sep_n, key_sep_n;
} lm__cjson_opts;
int lm__cv_write_json(lm__crt *c, const lm__cnode *at, const lm__cv *v, const lm__cjson_opts *o, lm__csink *s);
/* A jansson value as a template value (strings point into j, which must outlive the render). */
int lm__cv_from_json(lm__crt *c, json_t *j, lm__cv *out, int depth);
/* Python float repr ("1.0", "1e+16", "inf"): writes at most 32 bytes + NUL into buf. */
size_t lm__cfloat_repr(double f, char *buf);

/* ---- UTF-8 and unicode helpers (value.c) ---- */
/* Decodes the code point at p (valid UTF-8 assumed: the input was validated); *len = bytes. */
uint32_t lm__cutf8_get(const char *p, size_t *len);
size_t lm__cutf8_put(uint32_t cp, char *out); /* 1..4 bytes */
int64_t lm__cutf8_count(const char *p, size_t n); /* code points */
int lm__cuni_space(uint32_t cp);                  /* Python str.isspace */
uint32_t lm__cuni_upper(uint32_t cp);
uint32_t lm__cuni_lower(uint32_t cp);
uint32_t lm__cuni_title(uint32_t cp);
int lm__cuni_cased(uint32_t cp);     /* has a case (letter that upper/lower changes or is Lu/Ll/Lt) */
int lm__cuni_printable(uint32_t cp); /* Python str.isprintable */

/* ---- evaluation (eval.c) -------------------------------------------------------------------------- */
/* Positional then keyword arguments of a call. */
typedef struct lm__cargs {
    int32_t n, nkw;
    lm__cv *v;        /* [n + nkw] */
    const char **kw;  /* [nkw] keyword names */
} lm__cargs;

int lm__chat_eval(lm__crt *c, const lm__cnode *e, lm__cv *out);
/* Renders a statement list into c->out in scope s: 0, -1 on failure, or the pending
 * LM__EXEC_BREAK / LM__EXEC_CONTINUE. */
enum { LM__EXEC_BREAK = 1, LM__EXEC_CONTINUE = 2 };
int lm__chat_exec(lm__crt *c, lm__cnode *const *body, int32_t n, lm__scope *s);
/* Sets (or adds) variable id in scope s; -1 with the error recorded when out of memory
 * (at: the node to name, or NULL). */
int lm__chat_scope_set(lm__crt *c, const lm__cnode *at, lm__scope *s, int32_t id, lm__cv v);
int lm__chat_call(lm__crt *c, const lm__cnode *at, const lm__cv *fn, const lm__cargs *args, lm__cv *out);
/* Sandboxed obj.name and obj[key] (missing -> Undefined with Jinja's message). */
int lm__chat_getattr(lm__crt *c, const lm__cnode *at, const lm__cv *obj, const char *name, size_t n, lm__cv *out);
int lm__chat_getitem(lm__crt *c, const lm__cnode *at, const lm__cv *obj, const lm__cv *key, lm__cv *out);

/* ---- builtins (filters.c, methods.c) -------------------------------------------------------------------------- */
/* Global functions. */
typedef enum lm__cglobal {
    CG_RANGE, CG_DICT, CG_NAMESPACE, CG_RAISE_EXCEPTION, CG_STRFTIME_NOW, CG_LIPSUM, CG_CYCLER, CG_JOINER,
    CG_COUNT
} lm__cglobal;
extern const char *const lm__chat_global_names[CG_COUNT];
/* 1 for the globals Jinja has but loom does not implement (calling them fails). */
int lm__chat_global_unsupported(int id);

/* Filter and test ids by name: >= 0 supported, -1 unknown to Jinja, -2 a Jinja builtin
 * that loom does not implement. */
int lm__chat_filter_id(const char *name, size_t n);
int lm__chat_test_id(const char *name, size_t n);
int lm__chat_filter(lm__crt *c, const lm__cnode *at, int id, const lm__cv *v, const lm__cargs *a, lm__cv *out);
int lm__chat_test(lm__crt *c, const lm__cnode *at, int id, const lm__cv *v, const lm__cargs *a, int *out);
int lm__chat_global_call(lm__crt *c, const lm__cnode *at, int id, const lm__cargs *a, lm__cv *out);

/* Methods: lm__chat_method_id gives the method of a value's kind called name (>= 0),
 * -1 when the kind has no such attribute (then it is a key lookup or Undefined), -2
 * for a Python method loom does not implement, -3 for a method the immutable sandbox
 * refuses (list.append, dict.update, ...). */
int lm__chat_method_id(const lm__cv *self, const char *name, size_t n);
int lm__chat_method_call(lm__crt *c, const lm__cnode *at, const lm__cv *self, int id, const lm__cargs *a,
                         lm__cv *out);
const char *lm__chat_method_name(int id);

/* String operations shared by methods and filters (methods.c), with Python's semantics
 * on code points. */
typedef enum lm__ccase {
    CC_UPPER,
    CC_LOWER,
    CC_TITLE,       /* str.title() */
    CC_CAPITALIZE,
    CC_SWAPCASE,
    CC_JINJA_TITLE  /* Jinja's title filter: words start after a run of [-\s({[<] */
} lm__ccase;
int lm__cstr_case(lm__crt *c, const lm__cnode *at, const lm__cv *s, lm__ccase mode, lm__cv *out);
/* strip / lstrip / rstrip; chars NULL: whitespace. */
int lm__cstr_strip(lm__crt *c, const lm__cnode *at, const lm__cv *s, const lm__cv *chars, int left, int right,
                   lm__cv *out);
/* replace old by new, at most count times (count < 0: all). */
int lm__cstr_replace(lm__crt *c, const lm__cnode *at, const lm__cv *s, const lm__cv *old, const lm__cv *new_,
                     int64_t count, lm__cv *out);
/* Python's str.splitlines(keepends) as a list. */
int lm__cstr_splitlines(lm__crt *c, const lm__cnode *at, const lm__cv *s, int keepends, lm__cv *out);

/* Binds call arguments to a signature of nnames parameters: slot[i] receives the
 * positional argument i or the keyword argument names[i]; given[i] says which were
 * passed. what names the callee in errors ("filter 'join'"). */
int lm__cargs_bind(lm__crt *c, const lm__cnode *at, const char *what, const lm__cargs *a,
                   const char *const *names, int nnames, lm__cv *slot, int *given);

#endif
