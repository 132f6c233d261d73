/* io/tokenizer_pretok.c — normalizer (NFC) and pre-tokenizers (Split, ByteLevel,
 * Digits, Sequence) of tokenizer.json.
 *
 * A pre-tokenizer Sequence is flattened into steps that each map a list of pieces to
 * a new list, exactly as Hugging Face applies them piece by piece: a regex sees one
 * piece as its whole subject (so lookarounds stop at piece edges). Hugging Face's
 * patterns are Oniguruma-flavoured; PCRE2 (UTF + UCP) agrees except for `\s`, which
 * PCRE2 extends by U+180E, so `\s`/`\S` are rewritten to Oniguruma's exact set
 * (\t-\r, U+0085 and \p{Z}). ByteLevel must be the last step: its byte-to-char
 * mapping is applied by the BPE stage (tok->byte_level), not materialized here.
 * The steps run depth-first over batches of events (see "running the steps"), so
 * their scratch memory does not grow with the text.
 * Cost: one PCRE2 (JIT) scan per step over the text, O(pieces) bookkeeping.
 */
#include "io/tokenizer_internal.h"

#include <string.h>
#include <utf8proc.h>

#define ONIG_SPACE "\\t-\\r\\x{85}\\p{Z}"
static const char k_gpt2_pattern[] = /* GPT-2's split, used by ByteLevel with use_regex */
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- normalizer ----------------------------------------------------------------------- */
lm_status lm__tok_parse_normalizer(lm_tokenizer *tok, json_t *j) {
    if (!j || json_is_null(j)) return LM_OK;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return lm__error(LM_PARSE_ERROR, "tokenizer.json: normalizer has no \"type\"");
    if (strcmp(type, "NFC") == 0) {
        tok->nfc = 1;
        return LM_OK;
    }
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(j, "normalizers");
        if (!json_is_array(list)) return lm__error(LM_PARSE_ERROR, "tokenizer.json: normalizer Sequence has no list");
        for (size_t i = 0; i < json_array_size(list); i++)
            LM_TRY(lm__tok_parse_normalizer(tok, json_array_get(list, i)));
        return LM_OK;
    }
    return lm__error(LM_UNSUPPORTED, "tokenizer.json: normalizer type '%s' is not supported (supported: NFC, Sequence)",
                     type);
}

/* Code point ranges whose characters are NFC_Quick_Check=Yes, combining class 0 and
 * never the second character of a canonical composition (checked against the
 * Unicode 14 data): a text made only of them is already NFC, whatever their order. */
static const uint32_t k_nfc_inert[][2] = {
    {0x0000, 0x02FF},   {0x0370, 0x0373},   {0x0375, 0x0377}, {0x037A, 0x037D}, {0x0384, 0x0386}, {0x0388, 0x038A},
    {0x038C, 0x038C},   {0x038E, 0x03A1},   {0x03A3, 0x0482}, {0x2002, 0x2064}, {0x2066, 0x206F}, {0x2190, 0x2328},
    {0x232B, 0x2426},   {0x2460, 0x2ADB},   {0x3000, 0x3029}, {0x3030, 0x303F}, {0x3041, 0x3096}, {0x309B, 0x30FF},
    {0x3105, 0x312F},   {0x3131, 0x318E},   {0x3190, 0x31E3}, {0x31F0, 0x321E}, {0x3220, 0xA48C}, {0xAC00, 0xD7A3},
    {0xFE00, 0xFE19},   {0xFE30, 0xFE52},   {0xFE54, 0xFE66}, {0xFE68, 0xFE6B}, {0xFE70, 0xFE74}, {0xFE76, 0xFEFC},
    {0xFEFF, 0xFEFF},   {0xFF01, 0xFFBE},   {0x1F1E6, 0x1F202}, {0x1F300, 0x1F6D7}, {0x1F900, 0x1FA53},
    {0x20000, 0x2A6DF},
};

static int nfc_inert(uint32_t cp) {
    size_t lo = 0, hi = sizeof k_nfc_inert / sizeof k_nfc_inert[0];
    while (lo < hi) { /* first range whose end >= cp */
        size_t mid = (lo + hi) / 2;
        if (k_nfc_inert[mid][1] < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < sizeof k_nfc_inert / sizeof k_nfc_inert[0] && k_nfc_inert[lo][0] <= cp;
}

lm_status lm__tok_nfc(const uint8_t *s, size_t n, int32_t **ucs, int64_t *ucs_cap, const uint8_t **out, size_t *out_n) {
    *out = s, *out_n = n;
    size_t i = 0, clen;
    while (i < n && (s[i] < 0x80 || nfc_inert(lm__utf8_decode(s + i, &clen)))) i += s[i] < 0x80 ? 1 : clen;
    if (i == n) return LM_OK; /* quick check: already NFC */
    const utf8proc_option_t opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    for (;;) {
        utf8proc_ssize_t k = utf8proc_decompose(s, (utf8proc_ssize_t)n, *ucs, (utf8proc_ssize_t)*ucs_cap, opt);
        if (k < 0) return lm__error(LM_INTERNAL, "tokenizer: NFC failed: %s", utf8proc_errmsg(k));
        if (k < *ucs_cap) { /* +1: reencode writes a terminating NUL */
            utf8proc_ssize_t len = utf8proc_reencode(*ucs, k, opt);
            if (len < 0) return lm__error(LM_INTERNAL, "tokenizer: NFC failed: %s", utf8proc_errmsg(len));
            *out = (const uint8_t *)*ucs, *out_n = (size_t)len;
            return LM_OK;
        }
        lm__free(*ucs), *ucs = NULL, *ucs_cap = 0; /* nothing to keep: decompose rewrites it */
        LM_TRY(lm__reserve((void **)ucs, ucs_cap, (int64_t)k + 1, sizeof(int32_t)));
    }
}

/* ---- regex compilation ------------------------------------------------------------------- */
static void *pcre_alloc(PCRE2_SIZE n, void *user) {
    (void)user;
    return lm__alloc(n, 16);
}

static void pcre_free(void *p, void *user) {
    (void)user;
    lm__free(p);
}

/* Rewrites Oniguruma's `\s` / `\S` into PCRE2 classes with the same members. Other
 * escapes are copied unchanged. *out (lm__alloc) is NUL-terminated. */
static lm_status translate_pattern(const char *pat, size_t n, char **out) {
    size_t cap = n * 24 + 1, o = 0;
    char *d = lm__alloc(cap, 1);
    if (!d) return LM_OUT_OF_MEMORY;
    int depth = 0; /* character-class nesting */
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < n) {
            char e = pat[++i];
            const char *rep = NULL;
            if (e == 's') rep = depth ? ONIG_SPACE : "[" ONIG_SPACE "]";
            else if (e == 'S' && !depth) rep = "[^" ONIG_SPACE "]";
            if (rep) {
                memcpy(d + o, rep, strlen(rep));
                o += strlen(rep);
            } else {
                d[o++] = c, d[o++] = e;
            }
            continue;
        }
        if (c == '[') {
            if (depth && i + 1 < n && pat[i + 1] == ':') { /* POSIX class [:name:] */
                const char *end = strstr(pat + i, ":]");
                size_t k = end && (size_t)(end - pat) < n ? (size_t)(end - pat) + 2 - i : 1;
                memcpy(d + o, pat + i, k);
                o += k, i += k - 1;
                continue;
            }
            depth++;
            d[o++] = c;
            if (i + 1 < n && pat[i + 1] == '^') d[o++] = pat[++i];
            if (i + 1 < n && pat[i + 1] == ']') d[o++] = pat[++i]; /* a leading ']' is literal */
            continue;
        }
        if (c == ']' && depth) depth--;
        d[o++] = c;
    }
    d[o] = '\0';
    *out = d;
    return LM_OK;
}

static lm_status check_step_count(const lm_tokenizer *tok) {
    if (tok->n_steps < LM__TOK_MAX_STEPS) return LM_OK;
    return lm__error(LM_UNSUPPORTED, "tokenizer.json: pre_tokenizer has more than %d steps", LM__TOK_MAX_STEPS);
}

/* Compiles a split pattern (literal when is_literal) into a new step. */
static lm_status add_split(lm_tokenizer *tok, const char *pat, size_t n, int is_literal, lm__tok_behavior behavior,
                           int invert) {
    LM_TRY(check_step_count(tok));
    lm__tok_step *steps = lm__alloc(((size_t)tok->n_steps + 1) * sizeof *steps, 16);
    if (!steps) return LM_OUT_OF_MEMORY;
    if (tok->n_steps) memcpy(steps, tok->steps, (size_t)tok->n_steps * sizeof *steps);
    lm__free(tok->steps);
    tok->steps = steps;
    lm__tok_step *st = &tok->steps[tok->n_steps];
    *st = (lm__tok_step){.kind = LM__STEP_SPLIT, .behavior = behavior, .invert = invert};
    char *src = NULL;
    if (!is_literal) LM_TRY(translate_pattern(pat, n, &src));
    pcre2_compile_context *cc = pcre2_compile_context_create(tok->pcre_gctx);
    if (!cc) {
        lm__free(src);
        return lm__error(LM_OUT_OF_MEMORY, "tokenizer: cannot allocate a regex compile context");
    }
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    int err;
    PCRE2_SIZE at;
    uint32_t opts = PCRE2_UTF | PCRE2_NO_UTF_CHECK | (is_literal ? PCRE2_LITERAL : PCRE2_UCP);
    st->re = pcre2_compile((PCRE2_SPTR)(src ? src : pat), src ? PCRE2_ZERO_TERMINATED : n, opts, &err, &at, cc);
    pcre2_compile_context_free(cc);
    lm__free(src);
    if (!st->re) {
        if (err == PCRE2_ERROR_HEAP_FAILED)
            return lm__error(LM_OUT_OF_MEMORY, "tokenizer: out of memory compiling a regex");
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return lm__error(LM_PARSE_ERROR, "tokenizer.json: pre_tokenizer Split pattern '%.*s' does not compile: %s",
                         (int)n, pat, (const char *)msg);
    }
    tok->n_steps++;
    /* JIT is an accelerator only: on failure (no JIT, no memory) the interpreter runs. */
    st->jit = pcre2_jit_compile(st->re, PCRE2_JIT_COMPLETE) == 0;
    return LM_OK;
}

static lm_status add_prefix_space_step(lm_tokenizer *tok) {
    LM_TRY(check_step_count(tok));
    lm__tok_step *steps = lm__alloc(((size_t)tok->n_steps + 1) * sizeof *steps, 16);
    if (!steps) return LM_OUT_OF_MEMORY;
    if (tok->n_steps) memcpy(steps, tok->steps, (size_t)tok->n_steps * sizeof *steps);
    lm__free(tok->steps);
    tok->steps = steps;
    tok->steps[tok->n_steps++] = (lm__tok_step){.kind = LM__STEP_PREFIX_SPACE};
    return LM_OK;
}

void lm__tok_steps_free(lm_tokenizer *tok) {
    for (int i = 0; i < tok->n_steps; i++) pcre2_code_free(tok->steps[i].re);
    lm__free(tok->steps);
    tok->steps = NULL;
    tok->n_steps = 0;
    pcre2_general_context_free(tok->pcre_gctx);
    tok->pcre_gctx = NULL;
}

/* ---- pre-tokenizer JSON --------------------------------------------------------------------- */
static int json_flag(json_t *obj, const char *key, int dflt) {
    json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static lm_status parse_behavior(json_t *j, lm__tok_behavior *out) {
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    const char *s = json_string_value(j);
    for (int i = 0; s && i < 5; i++)
        if (strcmp(s, names[i]) == 0) return *out = (lm__tok_behavior)i, LM_OK;
    return lm__error(LM_PARSE_ERROR, "tokenizer.json: Split behavior '%s' is unknown", s ? s : "(missing)");
}

static lm_status parse_split(lm_tokenizer *tok, json_t *j) {
    json_t *pattern = json_object_get(j, "pattern");
    json_t *rx = json_object_get(pattern, "Regex"), *str = json_object_get(pattern, "String");
    json_t *p = json_is_string(rx) ? rx : str;
    if (!json_is_string(p))
        return lm__error(LM_PARSE_ERROR,
                         "tokenizer.json: Split needs \"pattern\": {\"Regex\": ...} or {\"String\": ...}");
    lm__tok_behavior behavior = LM__SPLIT_ISOLATED;
    LM_TRY(parse_behavior(json_object_get(j, "behavior"), &behavior));
    return add_split(tok, json_string_value(p), json_string_length(p), p == str, behavior, json_flag(j, "invert", 0));
}

static lm_status parse_one(lm_tokenizer *tok, json_t *j) {
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return lm__error(LM_PARSE_ERROR, "tokenizer.json: pre_tokenizer has no \"type\"");
    if (tok->byte_level)
        return lm__error(LM_UNSUPPORTED, "tokenizer.json: pre_tokenizer '%s' after ByteLevel is not supported "
                                         "(ByteLevel must come last)", type);
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(j, "pretokenizers");
        if (!json_is_array(list))
            return lm__error(LM_PARSE_ERROR, "tokenizer.json: pre_tokenizer Sequence has no list");
        for (size_t i = 0; i < json_array_size(list); i++) LM_TRY(parse_one(tok, json_array_get(list, i)));
        return LM_OK;
    }
    if (strcmp(type, "Split") == 0) return parse_split(tok, j);
    if (strcmp(type, "Digits") == 0)
        return add_split(tok, "\\p{N}", 5, 0,
                         json_flag(j, "individual_digits", 0) ? LM__SPLIT_ISOLATED : LM__SPLIT_CONTIGUOUS, 0);
    if (strcmp(type, "ByteLevel") == 0) {
        if (json_flag(j, "add_prefix_space", 1)) LM_TRY(add_prefix_space_step(tok));
        if (json_flag(j, "use_regex", 1))
            LM_TRY(add_split(tok, k_gpt2_pattern, sizeof k_gpt2_pattern - 1, 0, LM__SPLIT_ISOLATED, 0));
        tok->byte_level = 1;
        return LM_OK;
    }
    return lm__error(LM_UNSUPPORTED,
                     "tokenizer.json: pre_tokenizer type '%s' is not supported (supported: Split, ByteLevel, Digits, "
                     "Sequence)", type);
}

lm_status lm__tok_parse_pretokenizer(lm_tokenizer *tok, json_t *j) {
    tok->pcre_gctx = pcre2_general_context_create(pcre_alloc, pcre_free, NULL);
    if (!tok->pcre_gctx) return lm__error(LM_OUT_OF_MEMORY, "tokenizer: cannot allocate the regex context");
    if (!j || json_is_null(j)) return LM_OK;
    if (!json_is_object(j)) return lm__error(LM_PARSE_ERROR, "tokenizer.json: pre_tokenizer is not an object");
    return parse_one(tok, j);
}

/* ---- running the steps ------------------------------------------------------------------------
 * The steps run depth-first: a split step reads the events of its piece in batches of
 * st->batch_events, folds a batch into pieces and passes each one through the later steps
 * (down to fn) before it reads the next batch. So the scratch per step holds one batch,
 * however long the text, instead of every piece of the text at once. The result is the
 * same as splitting the whole text step after step, as Hugging Face does, because
 *  - each match is searched for in the whole piece (the same subject, so lookarounds
 *    see the same text) from the same start offset as in one pass, and
 *  - a batch ends only between two events that the behavior's fold does not join
 *    (joins()); the fold joins neighbouring events pairwise, so folding the batches
 *    one after the other gives the same pieces as folding all events at once.
 * Only a run of events that all join (one long piece) has to be held whole. */
typedef struct scan {
    size_t at;   /* where the next match search starts */
    size_t prev; /* end of the last event */
    int done;    /* events cover the whole subject */
} scan;

static lm_status push_piece(lm__tok_piece **list, int64_t *cap, size_t *n, size_t off, size_t len) {
    if (!len) return LM_OK; /* Hugging Face drops empty splits */
    return LM__PUSH(*list, *n, *cap, ((lm__tok_piece){off, len}));
}

/* Appends the non-empty matches of step->re in the subject s[0..n), from sc->at on, and
 * the unmatched parts between them to lv->ev[*count..) as events, until there are
 * `limit` events or the subject is covered (then sc->done). */
static lm_status find_events(const lm__tok_step *step, lm__tok_state *st, lm__tok_level *lv, const uint8_t *s,
                             size_t n, scan *sc, size_t *count, size_t limit) {
    size_t k = *count;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
    while (!sc->done && k < limit) {
        int rc = PCRE2_ERROR_NOMATCH;
        if (sc->at < n) {
            rc = step->jit ? pcre2_jit_match(step->re, s, n, sc->at, 0, st->md, NULL)
                           : pcre2_match(step->re, s, n, sc->at, PCRE2_NO_UTF_CHECK, st->md, NULL);
            if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* deep backtracking: the interpreter keeps its stack on the heap */
                rc = pcre2_match(step->re, s, n, sc->at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, st->md, NULL);
        }
        if (rc == PCRE2_ERROR_NOMATCH) {
            LM_TRY(lm__reserve((void **)&lv->ev, &lv->ev_cap, (int64_t)k + 1, sizeof *lv->ev));
            if (sc->prev < n) lv->ev[k++] = (lm__tok_event){sc->prev, n, 0};
            sc->done = 1;
            break;
        }
        if (rc < 0) {
            if (rc == PCRE2_ERROR_NOMEMORY || rc == PCRE2_ERROR_HEAP_FAILED)
                return lm__error(LM_OUT_OF_MEMORY, "tokenizer: out of memory in a regex match");
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return lm__error(LM_INTERNAL, "tokenizer: regex match failed: %s", (const char *)msg);
        }
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* an empty match splits nothing: step over one character */
            size_t clen;
            lm__utf8_decode(s + sc->at, &clen);
            sc->at += clen;
            continue;
        }
        LM_TRY(lm__reserve((void **)&lv->ev, &lv->ev_cap, (int64_t)k + 2, sizeof *lv->ev));
        if (ms > sc->prev) lv->ev[k++] = (lm__tok_event){sc->prev, ms, 0};
        lv->ev[k++] = (lm__tok_event){ms, me, 1};
        sc->prev = sc->at = me;
    }
    *count = k;
    return LM_OK;
}

/* 1 when the fold of step's behavior joins event b to the event a just before it. */
static int joins(const lm__tok_step *step, const lm__tok_event *a, const lm__tok_event *b) {
    int ma = a->match != step->invert, mb = b->match != step->invert;
    switch (step->behavior) {
    case LM__SPLIT_CONTIGUOUS: return ma == mb;
    case LM__SPLIT_MERGED_WITH_PREVIOUS: return mb && !ma;
    case LM__SPLIT_MERGED_WITH_NEXT: return ma && !mb;
    default: return 0; /* Removed, Isolated: every event is a piece of its own */
    }
}

/* Applies the split behavior to the events (Hugging Face's NormalizedString::split
 * folds) and appends the resulting pieces to the list. */
static lm_status apply_behavior(const lm__tok_step *step, lm__tok_event *ev, size_t k, lm__tok_piece **list,
                                int64_t *cap, size_t *n) {
    if (step->invert)
        for (size_t i = 0; i < k; i++) ev[i].match = !ev[i].match;
    size_t m = 0; /* folded events are compacted into ev[0..m); .match now means "removed" */
    int prev_match = 0;
    if (step->behavior == LM__SPLIT_MERGED_WITH_NEXT) {
        for (size_t i = k; i-- > 0;) { /* fold from the right, then restore order */
            lm__tok_event e = ev[i];
            if (e.match && !prev_match && m) ev[k - m].start = e.start;
            else ev[k - ++m] = (lm__tok_event){e.start, e.end, 0};
            prev_match = e.match;
        }
        memmove(ev, ev + k - m, m * sizeof *ev);
    } else {
        for (size_t i = 0; i < k; i++) {
            lm__tok_event e = ev[i];
            int merge = (step->behavior == LM__SPLIT_CONTIGUOUS && e.match == prev_match) ||
                        (step->behavior == LM__SPLIT_MERGED_WITH_PREVIOUS && e.match && !prev_match);
            if (merge && m) ev[m - 1].end = e.end;
            else ev[m++] = (lm__tok_event){e.start, e.end, step->behavior == LM__SPLIT_REMOVED && e.match};
            prev_match = e.match;
        }
    }
    for (size_t i = 0; i < m; i++)
        if (!ev[i].match) LM_TRY(push_piece(list, cap, n, ev[i].start, ev[i].end - ev[i].start));
    return LM_OK;
}

/* Steps i.. on the piece s[0..n) (n >= 1), its pieces to fn. Recursion depth: the
 * number of steps (at most LM__TOK_MAX_STEPS). */
static lm_status run_step(const lm_tokenizer *tok, lm__tok_state *st, int i, const uint8_t *s, size_t n,
                          lm__tok_piece_fn fn, void *arg) {
    if (i == tok->n_steps) return fn(arg, s, n);
    const lm__tok_step *step = &tok->steps[i];
    lm__tok_level *lv = &st->levels[i];
    if (step->kind == LM__STEP_PREFIX_SPACE) { /* ByteLevel add_prefix_space: ' ' before a piece without one */
        if (s[0] == ' ') return run_step(tok, st, i + 1, s, n, fn, arg);
        LM_TRY(lm__reserve((void **)&lv->text, &lv->text_cap, (int64_t)n + 1, 1));
        lv->text[0] = ' ';
        memcpy(lv->text + 1, s, n);
        return run_step(tok, st, i + 1, lv->text, n + 1, fn, arg);
    }
    scan sc = {0, 0, 0};
    size_t k = 0, joined = 0; /* events lv->ev[0..k); each of ev[1..joined) joins the one before it */
    for (;;) {
        LM_TRY(find_events(step, st, lv, s, n, &sc, &k, k + LM_MIN(st->batch_events, SIZE_MAX - k)));
        /* fold up to the last event that does not join the one before it: the events
         * after it may still join events not read yet */
        size_t cut = k;
        if (!sc.done) {
            cut = 0;
            for (size_t c = k - 1; c >= LM_MAX(joined, 1) && !cut; c--)
                if (!joins(step, &lv->ev[c - 1], &lv->ev[c])) cut = c;
        }
        if (cut) {
            size_t np = 0;
            LM_TRY(apply_behavior(step, lv->ev, cut, &lv->piece, &lv->piece_cap, &np));
            for (size_t p = 0; p < np; p++)
                LM_TRY(run_step(tok, st, i + 1, s + lv->piece[p].off, lv->piece[p].len, fn, arg));
            k -= cut;
            memmove(lv->ev, lv->ev + cut, k * sizeof *lv->ev);
        }
        joined = k;
        if (sc.done) return LM_OK;
    }
}

lm_status lm__tok_pretokenize_each(const lm_tokenizer *tok, lm__tok_state *st, const uint8_t *s, size_t n,
                                   lm__tok_piece_fn fn, void *arg) {
    return n ? run_step(tok, st, 0, s, n, fn, arg) : LM_OK;
}

typedef struct gather {
    lm__tok_state *st;
    size_t bytes, count; /* used in st->text2, st->pa */
} gather;

static lm_status gather_piece(void *arg, const uint8_t *p, size_t n) {
    gather *g = arg;
    lm__tok_state *st = g->st;
    LM_TRY(lm__reserve((void **)&st->text2, &st->text2_cap, (int64_t)(g->bytes + n), 1));
    LM_TRY(LM__PUSH(st->pa, g->count, st->pa_cap, ((lm__tok_piece){g->bytes, n})));
    memcpy(st->text2 + g->bytes, p, n);
    g->bytes += n;
    return LM_OK;
}

lm_status lm__tok_pretokenize(const lm_tokenizer *tok, lm__tok_state *st, const uint8_t *s, size_t n,
                              const uint8_t **base, size_t *count) {
    gather g = {st, 0, 0};
    lm_status status = lm__tok_pretokenize_each(tok, st, s, n, gather_piece, &g);
    *base = st->text2;
    *count = g.count;
    return status;
}
