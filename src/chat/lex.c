/* chat/lex.c — Jinja's lexer with the settings transformers uses (trim_blocks,
 * lstrip_blocks, keep_trailing_newline off, the default delimiters).
 *
 * The source is first normalized as Jinja does: "\r\n" and "\r" become "\n" and one
 * trailing newline is dropped. Whitespace control is decided here, on the text
 * before and after each tag: "{%-" / "{{-" / "{#-" strip all whitespace before the
 * tag; "-%}" / "-}}" / "-#}" all whitespace after it; lstrip_blocks removes the
 * spaces and tabs between a line start and a block or comment tag (not a {{ tag, not
 * "{%+"); trim_blocks removes one newline after "%}" and "#}" (not after "+%}").
 * "Whitespace" is Python's: str.isspace, unicode included. Inside tags the tokens are
 * Jinja's: names, integers (with _ and 0b/0o/0x), floats, strings with Python's
 * unicode-escape rules, and operators; a tag ends only when its brackets balance.
 * Every token records line:column (columns count code points, from 1). O(source).
 */
#include "chat/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_BRACKETS = 256 };

typedef struct lexer {
    lm_chat_template *t;
    const char *s; /* normalized source, [n] bytes + NUL */
    size_t n;
    lm__ctok *toks; /* [ntoks], capacity cap, in the template arena */
    int64_t ntoks, cap;
    int line_starting; /* the previous match ended with a newline (lstrip_blocks) */
    /* position cursor for line:column */
    size_t at;
    int32_t line, col;
} lexer;

/* line:column of byte offset pos (pos never moves backwards between calls). */
static void locate(lexer *lx, size_t pos, int32_t *line, int32_t *col) {
    while (lx->at < pos) {
        unsigned char ch = (unsigned char)lx->s[lx->at++];
        if (ch == '\n') {
            lx->line++;
            lx->col = 1;
        } else if ((ch & 0xC0) != 0x80) {
            lx->col++;
        }
    }
    *line = lx->line;
    *col = lx->col;
}

static lm_status fail_at(lexer *lx, lm_status s, size_t pos, const char *fmt, ...) LM__PRINTF(4, 5);
static lm_status fail_at(lexer *lx, lm_status s, size_t pos, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int32_t line, col;
    locate(lx, pos, &line, &col);
    return lm__chat_syntax_error(s, line, col, "%s", msg);
}

static lm__ctok *push(lexer *lx, uint8_t type, size_t pos) {
    if (lx->ntoks == lx->cap) {
        int64_t cap = lx->cap ? 2 * lx->cap : 256;
        lm__ctok *p = lm__chat_grow(&lx->t->arena, lx->toks, (size_t)lx->cap * sizeof *p, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        lx->toks = p, lx->cap = cap;
    }
    lm__ctok *k = &lx->toks[lx->ntoks++];
    memset(k, 0, sizeof *k);
    k->type = type;
    locate(lx, pos, &k->line, &k->col);
    return k;
}

#define PUSH(lx, type, pos, tokvar)                                                        \
    do {                                                                                   \
        tokvar = push(lx, type, pos);                                                      \
        if (!tokvar) return lm__error(LM_OUT_OF_MEMORY, "chat template: out of memory"); \
    } while (0)

/* Byte length of the whitespace character at p (0 when it is not one). */
static size_t space_at(const char *s, size_t p, size_t n) {
    if (p >= n) return 0;
    unsigned char ch = (unsigned char)s[p];
    if (ch < 0x80) return lm__cuni_space(ch) ? 1 : 0;
    size_t len;
    uint32_t cp = lm__cutf8_get(s + p, &len);
    return lm__cuni_space(cp) ? len : 0;
}

static size_t skip_space(const char *s, size_t p, size_t n) {
    size_t k;
    while ((k = space_at(s, p, n)) > 0) p += k;
    return p;
}

/* End of s[from, to) with trailing whitespace removed (Python's rstrip()). */
static size_t rstrip_end(const char *s, size_t from, size_t to) {
    while (to > from) {
        size_t start = to - 1;
        while (start > from && ((unsigned char)s[start] & 0xC0) == 0x80) start--;
        size_t len;
        uint32_t cp = lm__cutf8_get(s + start, &len);
        if (!lm__cuni_space(cp)) break;
        to = start;
    }
    return to;
}

/* Applies "-" (strip all) or lstrip_blocks to the text s[from, to) before a tag;
 * returns the new end. sign: '-', '+' or 0; lstrip: whether lstrip_blocks applies to
 * this kind of tag. */
static size_t strip_before(lexer *lx, size_t from, size_t to, char sign, int lstrip) {
    if (sign == '-') return rstrip_end(lx->s, from, to);
    if (sign == '+' || !lstrip) return to;
    size_t l_pos = from;
    int newline = 0;
    for (size_t i = to; i > from; i--)
        if (lx->s[i - 1] == '\n') {
            l_pos = i;
            newline = 1;
            break;
        }
    if (!newline && !lx->line_starting) return to;
    if (l_pos == to) return to;
    for (size_t p = l_pos; p < to;) {
        size_t k = space_at(lx->s, p, to);
        if (!k) return to;
        p += k;
    }
    return l_pos;
}

static lm_status emit_data(lexer *lx, size_t from, size_t to) {
    if (to <= from) return LM_OK;
    lm__ctok *k;
    PUSH(lx, T_DATA, from, k);
    k->p = lx->s + from;
    k->n = to - from;
    return LM_OK;
}

static int starts(const char *s, size_t p, size_t n, const char *lit) {
    size_t k = strlen(lit);
    return p + k <= n && memcmp(s + p, lit, k) == 0;
}

/* Block end at p: "+%}", "-%}" + whitespace, "%}" + one optional newline (trim_blocks).
 * Returns the end position or 0 when there is none. Sets line_starting. */
static size_t block_end_at(lexer *lx, size_t p) {
    const char *s = lx->s;
    size_t n = lx->n;
    if (starts(s, p, n, "+%}")) {
        lx->line_starting = 0;
        return p + 3;
    }
    if (starts(s, p, n, "-%}")) {
        size_t e = skip_space(s, p + 3, n);
        lx->line_starting = e > p + 3 && s[e - 1] == '\n';
        return e;
    }
    if (starts(s, p, n, "%}")) {
        size_t e = p + 2;
        lx->line_starting = 0;
        if (e < n && s[e] == '\n') e++, lx->line_starting = 1;
        return e;
    }
    return 0;
}

/* "{%" [sign] ws* "raw" ws* ("-%}" ws* | "%}") at p: the end position or 0. */
static size_t raw_begin_at(lexer *lx, size_t p) {
    const char *s = lx->s;
    size_t n = lx->n, q = p + 2;
    if (q < n && (s[q] == '-' || s[q] == '+')) q++;
    q = skip_space(s, q, n);
    if (!starts(s, q, n, "raw")) return 0;
    q = skip_space(s, q + 3, n);
    if (starts(s, q, n, "-%}")) {
        size_t e = skip_space(s, q + 3, n);
        lx->line_starting = e > q + 3 && s[e - 1] == '\n';
        return e;
    }
    if (starts(s, q, n, "%}")) {
        lx->line_starting = 0;
        return q + 2;
    }
    return 0;
}

/* The text of a raw block starts at p: finds "{%" [sign] ws* "endraw" ws* end. */
static lm_status lex_raw(lexer *lx, size_t p, size_t tag_pos, size_t *next) {
    const char *s = lx->s;
    size_t n = lx->n;
    for (size_t j = p; j + 1 < n; j++) {
        if (s[j] != '{' || s[j + 1] != '%') continue;
        size_t q = j + 2;
        char sign = 0;
        if (q < n && (s[q] == '-' || s[q] == '+')) sign = s[q++];
        q = skip_space(s, q, n);
        if (!starts(s, q, n, "endraw")) continue;
        q = skip_space(s, q + 6, n);
        int saved = lx->line_starting;
        size_t e = block_end_at(lx, q);
        if (!e) {
            lx->line_starting = saved;
            continue;
        }
        int after = lx->line_starting;
        lx->line_starting = saved;
        LM_TRY(emit_data(lx, p, strip_before(lx, p, j, sign, 1)));
        lx->line_starting = after;
        *next = e;
        return LM_OK;
    }
    return fail_at(lx, LM_PARSE_ERROR, tag_pos, "missing {%% endraw %%} for this raw block");
}

static lm_status lex_comment(lexer *lx, size_t p, size_t tag_pos, size_t *next) {
    const char *s = lx->s;
    size_t n = lx->n;
    for (size_t q = p; q + 1 < n; q++) {
        if (s[q] != '#' || s[q + 1] != '}') continue;
        char sign = q > p && (s[q - 1] == '-' || s[q - 1] == '+') ? s[q - 1] : 0;
        size_t e = q + 2;
        if (sign == '-') {
            e = skip_space(s, e, n);
            lx->line_starting = e > q + 2 && s[e - 1] == '\n';
        } else if (sign == '+') {
            lx->line_starting = 0;
        } else {
            lx->line_starting = 0;
            if (e < n && s[e] == '\n') e++, lx->line_starting = 1;
        }
        *next = e;
        return LM_OK;
    }
    return fail_at(lx, LM_PARSE_ERROR, tag_pos, "missing end of comment tag '#}'");
}

static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }
static int is_name_start(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static int is_name_char(char ch) { return is_name_start(ch) || is_digit(ch); }

/* (\d+_)*\d+ at p: its end, or 0 when p is not a digit. */
static size_t digits_at(const char *s, size_t p, size_t n) {
    if (p >= n || !is_digit(s[p])) return 0;
    size_t q = p;
    for (;;) {
        while (q < n && is_digit(s[q])) q++;
        if (q + 1 < n && s[q] == '_' && is_digit(s[q + 1])) {
            q++;
            continue;
        }
        return q;
    }
}

/* Jinja's float regex at p (not after a '.'): the end or 0. */
static size_t float_at(const char *s, size_t p, size_t n) {
    if (p > 0 && s[p - 1] == '.') return 0;
    size_t d = digits_at(s, p, n);
    if (!d) return 0;
    size_t frac = 0;
    if (d < n && s[d] == '.') frac = digits_at(s, d + 1, n);
    /* (\.D)? e [+-]? D — with the fraction first, then without */
    size_t bases[2] = {frac, d};
    for (int k = 0; k < 2; k++) {
        size_t e = bases[k];
        if (!e || e >= n || (s[e] != 'e' && s[e] != 'E')) continue;
        e++;
        if (e < n && (s[e] == '+' || s[e] == '-')) e++;
        size_t x = digits_at(s, e, n);
        if (x) return x;
    }
    return frac; /* \.D, or 0 */
}

static int hex_val(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Jinja's integer regex at p: the end (0 when none) and the value. */
static lm_status int_at(lexer *lx, size_t p, size_t *end, int64_t *val) {
    const char *s = lx->s;
    size_t n = lx->n, q = p;
    int base = 10;
    *end = 0;
    if (p >= n || !is_digit(s[p])) return LM_OK;
    if (s[p] == '0' && p + 1 < n && s[p + 1] && strchr("bBoOxX", s[p + 1])) {
        char b = (char)(s[p + 1] | 0x20);
        base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
        q = p + 2;
        size_t digits = 0;
        for (;;) {
            size_t r = q;
            if (r < n && s[r] == '_') r++;
            int v = r < n ? hex_val(s[r]) : -1;
            if (v < 0 || v >= base) break;
            q = r + 1;
            digits++;
        }
        if (!digits) { /* "0" alone, the letter starts a name */
            base = 10;
            q = p + 1;
        }
    } else if (s[p] == '0') { /* 0(_?0)* */
        q = p + 1;
        for (;;) {
            size_t r = q;
            if (r < n && s[r] == '_') r++;
            if (r < n && s[r] == '0') q = r + 1;
            else break;
        }
    } else { /* [1-9](_?\d)* */
        q = p + 1;
        for (;;) {
            size_t r = q;
            if (r < n && s[r] == '_') r++;
            if (r < n && is_digit(s[r])) q = r + 1;
            else break;
        }
    }
    uint64_t v = 0;
    for (size_t i = base == 10 ? p : p + 2; i < q; i++) {
        if (s[i] == '_') continue;
        uint64_t d = (uint64_t)hex_val(s[i]);
        if (v > (UINT64_MAX - d) / (uint64_t)base || v * (uint64_t)base + d > (uint64_t)INT64_MAX)
            return fail_at(lx, LM_UNSUPPORTED, p, "integer literal does not fit in 64 bits");
        v = v * (uint64_t)base + d;
    }
    *end = q;
    *val = (int64_t)v;
    return LM_OK;
}

/* Decodes a string literal body s[p, q) (Python unicode-escape after Jinja's
 * backslashreplace) into the template arena. */
static lm_status decode_string(lexer *lx, size_t p, size_t q, lm__ctok *k) {
    const char *s = lx->s;
    char *out = lm__chat_alloc(&lx->t->arena, 3 * (q - p) + 4);
    if (!out) return lm__error(LM_OUT_OF_MEMORY, "chat template: out of memory");
    size_t o = 0;
    for (size_t i = p; i < q;) {
        if (s[i] != '\\') {
            out[o++] = s[i++];
            continue;
        }
        char d = s[i + 1]; /* the lexer guarantees a character after each backslash */
        size_t start = i;
        i += 2;
        uint32_t cp = 0;
        int digits = 0;
        switch (d) {
        case '\n': continue;
        case '\\': out[o++] = '\\'; continue;
        case '\'': out[o++] = '\''; continue;
        case '"': out[o++] = '"'; continue;
        case 'a': out[o++] = '\a'; continue;
        case 'b': out[o++] = '\b'; continue;
        case 'f': out[o++] = '\f'; continue;
        case 'n': out[o++] = '\n'; continue;
        case 'r': out[o++] = '\r'; continue;
        case 't': out[o++] = '\t'; continue;
        case 'v': out[o++] = '\v'; continue;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        case 'N': return fail_at(lx, LM_UNSUPPORTED, start, "unsupported \\N{...} escape in a string");
        default:
            if (d >= '0' && d <= '7') {
                cp = (uint32_t)(d - '0');
                for (int m = 0; m < 2 && i < q && s[i] >= '0' && s[i] <= '7'; m++) cp = cp * 8 + (uint32_t)(s[i++] - '0');
                o += lm__cutf8_put(cp, out + o);
                continue;
            }
            out[o++] = '\\';
            if ((unsigned char)d >= 0x80) { /* the backslash escapes the first char of \xNN */
                size_t len;
                uint32_t c2 = lm__cutf8_get(s + start + 1, &len);
                i = start + 1 + len;
                o += (size_t)(c2 < 0x100 ? sprintf(out + o, "x%02x", c2)
                              : c2 < 0x10000 ? sprintf(out + o, "u%04x", c2)
                                             : sprintf(out + o, "U%08x", c2));
            } else {
                out[o++] = d;
            }
            continue;
        }
        for (int m = 0; m < digits; m++) {
            int v = i < q ? hex_val(s[i]) : -1;
            if (v < 0)
                return fail_at(lx, LM_PARSE_ERROR, start, "truncated \\%s escape in a string",
                               d == 'x' ? "xXX" : d == 'u' ? "uXXXX" : "UXXXXXXXX");
            cp = cp * 16 + (uint32_t)v;
            i++;
        }
        if (cp > 0x10FFFF) return fail_at(lx, LM_PARSE_ERROR, start, "illegal Unicode character in a string");
        if (cp >= 0xD800 && cp <= 0xDFFF)
            return fail_at(lx, LM_UNSUPPORTED, start, "surrogate code point escape in a string");
        o += lm__cutf8_put(cp, out + o);
    }
    k->p = out;
    k->n = o;
    return LM_OK;
}

typedef struct opdef {
    const char *text;
    uint8_t op;
} opdef;

static const opdef k_ops[] = {
    {"//", TO_FLOORDIV}, {"**", TO_POW}, {"==", TO_EQ}, {"!=", TO_NE}, {">=", TO_GE}, {"<=", TO_LE},
    {"+", TO_ADD},       {"-", TO_SUB},  {"/", TO_DIV}, {"*", TO_MUL}, {"%", TO_MOD}, {"~", TO_TILDE},
    {"[", TO_LBRACKET},  {"]", TO_RBRACKET}, {"(", TO_LPAREN}, {")", TO_RPAREN}, {"{", TO_LBRACE},
    {"}", TO_RBRACE},    {">", TO_GT},   {"<", TO_LT},  {"=", TO_ASSIGN}, {".", TO_DOT}, {":", TO_COLON},
    {"|", TO_PIPE},      {",", TO_COMMA}, {";", TO_SEMICOLON},
};

/* Tokens of a {{ }} or {% %} tag whose contents start at p. */
static lm_status lex_tag(lexer *lx, int is_var, size_t p, size_t *next) {
    const char *s = lx->s;
    size_t n = lx->n;
    char stack[MAX_BRACKETS];
    int depth = 0;
    lm__ctok *k;
    while (p < n) {
        if (depth == 0) {
            if (is_var) {
                if (starts(s, p, n, "-}}")) {
                    PUSH(lx, T_VAR_END, p, k);
                    size_t e = skip_space(s, p + 3, n);
                    lx->line_starting = e > p + 3 && s[e - 1] == '\n';
                    *next = e;
                    return LM_OK;
                }
                if (starts(s, p, n, "}}")) {
                    PUSH(lx, T_VAR_END, p, k);
                    lx->line_starting = 0;
                    *next = p + 2;
                    return LM_OK;
                }
            } else {
                size_t e = block_end_at(lx, p);
                if (e) {
                    PUSH(lx, T_BLOCK_END, p, k);
                    *next = e;
                    return LM_OK;
                }
            }
        }
        size_t w = skip_space(s, p, n);
        if (w > p) {
            p = w;
            continue;
        }
        char ch = s[p];
        size_t e = float_at(s, p, n);
        if (e) {
            char buf[64];
            size_t m = 0;
            for (size_t i = p; i < e && m + 1 < sizeof buf; i++)
                if (s[i] != '_') buf[m++] = s[i];
            buf[m] = '\0';
            PUSH(lx, T_FLOAT, p, k);
            k->f = strtod(buf, NULL);
            p = e;
            continue;
        }
        int64_t iv = 0;
        LM_TRY(int_at(lx, p, &e, &iv));
        if (e) {
            PUSH(lx, T_INT, p, k);
            k->i = iv;
            p = e;
            continue;
        }
        if (is_name_start(ch)) {
            e = p + 1;
            while (e < n && is_name_char(s[e])) e++;
            PUSH(lx, T_NAME, p, k);
            k->p = s + p;
            k->n = e - p;
            p = e;
            continue;
        }
        if (ch == '\'' || ch == '"') {
            size_t q = p + 1;
            while (q < n && s[q] != ch) q += s[q] == '\\' && q + 1 < n ? 2 : 1;
            if (q >= n) return fail_at(lx, LM_PARSE_ERROR, p, "unexpected character '%s' (unterminated string)", ch == '"' ? "\"" : "'");
            PUSH(lx, T_STRING, p, k);
            LM_TRY(decode_string(lx, p + 1, q, k));
            p = q + 1;
            continue;
        }
        const opdef *op = NULL;
        for (size_t i = 0; i < sizeof k_ops / sizeof k_ops[0]; i++)
            if (starts(s, p, n, k_ops[i].text)) {
                op = &k_ops[i];
                break;
            }
        if (!op) {
            char shown[8] = {0};
            size_t len = 1;
            if ((unsigned char)ch >= 0x80) lm__cutf8_get(s + p, &len);
            memcpy(shown, s + p, len);
            return fail_at(lx, LM_PARSE_ERROR, p, "unexpected character '%s'", shown);
        }
        if (op->op == TO_LPAREN || op->op == TO_LBRACKET || op->op == TO_LBRACE) {
            if (depth == MAX_BRACKETS) return fail_at(lx, LM_PARSE_ERROR, p, "brackets nested too deeply");
            stack[depth++] = op->op == TO_LPAREN ? ')' : op->op == TO_LBRACKET ? ']' : '}';
        } else if (op->op == TO_RPAREN || op->op == TO_RBRACKET || op->op == TO_RBRACE) {
            if (depth == 0) return fail_at(lx, LM_PARSE_ERROR, p, "unexpected '%s'", op->text);
            if (stack[depth - 1] != op->text[0]) {
                return fail_at(lx, LM_PARSE_ERROR, p, "unexpected '%s', expected '%c'", op->text, stack[depth - 1]);
            }
            depth--;
        }
        PUSH(lx, T_OP, p, k);
        k->op = op->op;
        p += strlen(op->text);
    }
    *next = n; /* the parser reports the missing end of the tag */
    return LM_OK;
}

/* Jinja's source normalization: newlines to "\n", one trailing newline dropped. */
static lm_status normalize(lm_chat_template *t, const char *src, size_t n, char **out, size_t *out_n) {
    char *s = lm__chat_alloc(&t->arena, n + 1);
    if (!s) return lm__error(LM_OUT_OF_MEMORY, "chat template: out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            s[o++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n') i++;
        } else {
            s[o++] = src[i];
        }
    }
    if (o > 0 && s[o - 1] == '\n') o--;
    s[o] = '\0';
    *out = s;
    *out_n = o;
    return LM_OK;
}

lm_status lm__chat_lex(lm_chat_template *t, const char *src, size_t n, lm__ctok **toks, int32_t *ntoks) {
    lexer lx = {.t = t, .line_starting = 1, .line = 1, .col = 1};
    char *s = NULL;
    LM_TRY(normalize(t, src, n, &s, &lx.n));
    lx.s = s;
    size_t pos = 0;
    lm__ctok *k;
    while (pos < lx.n) {
        size_t m = pos;
        int found = 0;
        while (m + 1 < lx.n) { /* the next "{{", "{%" or "{#" */
            const char *q = memchr(s + m, '{', lx.n - 1 - m);
            if (!q) break;
            m = (size_t)(q - s);
            if (s[m + 1] == '{' || s[m + 1] == '%' || s[m + 1] == '#') {
                found = 1;
                break;
            }
            m++;
        }
        if (!found) {
            LM_TRY(emit_data(&lx, pos, lx.n));
            break;
        }
        char kind = s[m + 1];
        char sign = m + 2 < lx.n && (s[m + 2] == '-' || s[m + 2] == '+') ? s[m + 2] : 0;
        int before = lx.line_starting;
        size_t raw_end = kind == '%' ? raw_begin_at(&lx, m) : 0; /* sets line_starting when it matches */
        int after_raw = lx.line_starting;
        lx.line_starting = before;
        LM_TRY(emit_data(&lx, pos, strip_before(&lx, pos, m, sign, kind != '{')));
        lx.line_starting = 0;
        size_t body = m + 2 + (sign ? 1 : 0);
        if (raw_end) {
            lx.line_starting = after_raw;
            LM_TRY(lex_raw(&lx, raw_end, m, &pos));
        } else if (kind == '#') {
            LM_TRY(lex_comment(&lx, body, m, &pos));
        } else {
            PUSH(&lx, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, m, k);
            LM_TRY(lex_tag(&lx, kind == '{', body, &pos));
        }
    }
    PUSH(&lx, T_EOF, lx.n, k);
    *toks = lx.toks;
    *ntoks = (int32_t)lx.ntoks;
    if (lx.ntoks > INT32_MAX) return lm__error(LM_OUT_OF_RANGE, "chat template: too many tokens");
    return LM_OK;
}
