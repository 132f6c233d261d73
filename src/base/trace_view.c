/* base/trace_view.c — a trace-event JSON file as one self-contained HTML page
 * (lm_trace_html): `loom trace view`, for machines without Perfetto (docs/TIMELINES.md,
 * "Step traces").
 *
 * The events (X, B/E, b/e/n, C, i/I, M; other phases are counted and skipped) are
 * parsed with jansson, checked (errors name the source and the event's index), and
 * reduced to tracks: one per thread (pid, tid) holding its spans sorted by start with
 * their nesting depth and self time (duration less the parts of its direct children
 * inside it), one per lane of async spans (ids of one pid and category placed greedily
 * in the first lane free at their start), one per counter series. Times are integer
 * nanoseconds from the earliest event, so self times add up exactly: per thread, the
 * self times of properly nested spans sum to the durations of its top-level spans.
 * Output: the page of the end of this file around one JSON element (strings and span
 * kinds interned, span starts delta-encoded); the page draws it on a canvas.
 * O(events log events) time; memory: jansson's tree plus ~60 bytes per event.
 */
#include "internal.h"
#include "loom/trace.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#define MAX_INPUT ((size_t)1 << 30) /* bytes: jansson needs several times the file in memory */
#define DETAIL_BYTES 300            /* longest detail kept (UTF-8 bytes; cut between characters) */
#define MAX_TS_US 1e15              /* |ts| and dur bound (31 years): nanoseconds fit int64 */

/* ---- a growing string ------------------------------------------------------------------------- */

typedef struct sbuf {
    char *p; /* [cap], NUL-terminated at n */
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t k) {
    if (b->oom) return;
    if (b->n + k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + k + 1) cap *= 2;
        char *q = lm__alloc(cap, 16);
        if (!q) {
            b->oom = 1;
            return;
        }
        if (b->n) memcpy(q, b->p, b->n);
        lm__free(b->p);
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->n, s, k);
    b->n += k;
    b->p[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_int(sbuf *b, int64_t v) {
    char d[24];
    int n = 0;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do d[n++] = (char)('0' + u % 10), u /= 10;
    while (u);
    if (v < 0) d[n++] = '-';
    char o[24];
    for (int i = 0; i < n; i++) o[i] = d[n - 1 - i];
    sb_put(b, o, (size_t)n);
}

static void sb_num(sbuf *b, double v) {
    char t[40];
    int k = snprintf(t, sizeof t, "%.9g", isfinite(v) ? v : 0.0);
    sb_put(b, t, (size_t)k);
}

/* s[0..n) as a JSON string safe inside <script>: '<', '>' and '&' escaped too. */
static void sb_jstr(sbuf *b, const char *s, size_t n) {
    sb_put(b, "\"", 1);
    size_t run = 0; /* bytes copied as they are, written in one call */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&') {
            run++;
            continue;
        }
        sb_put(b, s + i - run, run);
        run = 0;
        char e[8];
        if (c == '"' || c == '\\') e[0] = '\\', e[1] = (char)c, sb_put(b, e, 2);
        else sb_put(b, e, (size_t)snprintf(e, sizeof e, "\\u%04x", c));
    }
    sb_put(b, s + n - run, run);
    sb_put(b, "\"", 1);
}

/* ---- interning: byte strings -> dense indices ------------------------------------------------ */

typedef struct htab {
    sbuf pool;        /* the keys back to back, each followed by a NUL */
    int64_t *off;     /* [n] where key i starts in pool */
    int64_t n, cap;
    int32_t *slot;    /* [nslot] key index or -1; at most half full */
    int64_t nslot;
} htab;

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static const char *ht_key(const htab *h, int64_t i) { return h->pool.p + h->off[i]; }
static size_t ht_len(const htab *h, int64_t i) {
    return (size_t)((i + 1 < h->n ? h->off[i + 1] : (int64_t)h->pool.n) - h->off[i] - 1);
}

static lm_status ht_grow(htab *h) {
    int64_t n = h->nslot ? 2 * h->nslot : 256;
    int32_t *s = lm__alloc(sizeof(int32_t) * (size_t)n, 16);
    if (!s) return LM_OUT_OF_MEMORY;
    for (int64_t i = 0; i < n; i++) s[i] = -1;
    for (int64_t i = 0; i < h->n; i++) {
        uint64_t k = hash_bytes(ht_key(h, i), ht_len(h, i)) & (uint64_t)(n - 1);
        while (s[k] >= 0) k = (k + 1) & (uint64_t)(n - 1);
        s[k] = (int32_t)i;
    }
    lm__free(h->slot);
    h->slot = s, h->nslot = n;
    return LM_OK;
}

/* The index of key s[0..n), added when new (*added then 1). */
static lm_status ht_get(htab *h, const char *s, size_t n, int32_t *idx, int *added) {
    if (2 * (h->n + 1) > h->nslot) LM_TRY(ht_grow(h));
    uint64_t k = hash_bytes(s, n) & (uint64_t)(h->nslot - 1);
    for (; h->slot[k] >= 0; k = (k + 1) & (uint64_t)(h->nslot - 1)) {
        int32_t j = h->slot[k];
        if (ht_len(h, j) == n && !memcmp(ht_key(h, j), s, n)) {
            *idx = j, *added = 0;
            return LM_OK;
        }
    }
    if (h->n >= INT32_MAX - 1) return lm__error(LM_OUT_OF_MEMORY, "over 2^31 distinct strings");
    LM_TRY(lm__reserve((void **)&h->off, &h->cap, h->n + 1, sizeof *h->off));
    int64_t at = (int64_t)h->pool.n;
    sb_put(&h->pool, s, n);
    sb_put(&h->pool, "", 1); /* the separating NUL */
    if (h->pool.oom) return LM_OUT_OF_MEMORY;
    h->off[h->n] = at;
    h->slot[k] = (int32_t)h->n;
    *idx = (int32_t)h->n++, *added = 1;
    return LM_OK;
}

static void ht_free(htab *h) {
    lm__free(h->pool.p), lm__free(h->off), lm__free(h->slot);
    memset(h, 0, sizeof *h);
}

/* ---- the model: kinds, tracks, processes ----------------------------------------------------- */

typedef struct vspan {
    int64_t t0, t1, self; /* ns, absolute; self: t1 - t0 less the direct children inside */
    int32_t kind, detail; /* kind: (name, category); detail: string, 0 for none */
    int32_t depth, id;    /* nesting depth; async: the id's string */
    int64_t seq;          /* event index: ties keep file order */
} vspan;

typedef struct vinst {
    int64_t t, seq;
    int32_t kind, detail, id;
} vinst;

typedef struct vpoint {
    int64_t t, seq;
    double v;
} vpoint;

typedef struct vopen { /* a begin event waiting for its end */
    int64_t t0, seq;
    int32_t kind, detail;
} vopen;

enum { TK_THREAD, TK_LANE, TK_COUNTER, TK_ID /* one async id: merged into a lane, not shown */ };

typedef struct track {
    int kind;           /* TK_* */
    int64_t tid;        /* thread: its tid; lane: its number from 0 */
    int32_t proc;       /* index in tv.pr */
    int32_t name;       /* string: thread name, counter name, lane's category; 0 unnamed */
    int32_t cat, id;    /* TK_ID: category and id strings */
    int64_t sort;       /* thread_sort_index (0 when none) */
    vspan *sp;          /* [nsp] sorted by (t0, -t1, seq) once finished */
    int64_t nsp, cap_sp;
    vinst *in;          /* [nin] sorted by t once finished */
    int64_t nin, cap_in;
    vpoint *pt;         /* [npt] counter samples, sorted by t once finished */
    int64_t npt, cap_pt;
    vopen *op;          /* [nop] open B (thread) or b (async id) events, innermost last */
    int64_t nop, cap_op;
    int32_t depth;      /* rows: deepest span's depth + 1 */
    int64_t busy;       /* ns inside at least one span */
    int64_t first, last, seq; /* TK_ID: hull of its spans, first event */
} track;

typedef struct proc {
    int64_t pid, sort;
    int32_t name;
} proc;

typedef struct kstat {
    int64_t self, total, count;   /* thread spans */
    int64_t acount, atotal;       /* async spans */
    int64_t icount;               /* instants */
} kstat;

typedef struct tv {
    const char *src;
    htab str, kinds, tracks, procs;
    kstat *ks;     /* [kinds.n] */
    int64_t cap_ks;
    track *tr;     /* [tracks.n] */
    int64_t cap_tr;
    proc *pr;      /* [procs.n] */
    int64_t cap_pr;
    int64_t tmin, tmax;
    int have_t;
    int64_t nevents, nspans, ninst, npoints, skipped, unclosed, dropped;
    int32_t producer;
} tv;

static lm_status fault(const tv *V, size_t i, const char *fmt, ...) LM__PRINTF(3, 4);
static lm_status fault(const tv *V, size_t i, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return lm__error(LM_PARSE_ERROR, "trace '%s': event %zu: %s", V->src, i, msg);
}

static lm_status intern(tv *V, const char *s, size_t n, int32_t *out) {
    int added;
    return ht_get(&V->str, s, n, out, &added);
}

/* A detail string: cut to DETAIL_BYTES between UTF-8 characters, with an ellipsis. */
static lm_status intern_detail(tv *V, const char *s, size_t n, int32_t *out) {
    if (n <= DETAIL_BYTES) return intern(V, s, n, out);
    char buf[DETAIL_BYTES + 4];
    size_t k = DETAIL_BYTES;
    while (k > 0 && ((unsigned char)s[k] & 0xc0) == 0x80) k--;
    memcpy(buf, s, k);
    memcpy(buf + k, "\xe2\x80\xa6", 3);
    return intern(V, buf, k + 3, out);
}

/* Kind k's (name, category) strings (keys are unaligned bytes in the pool). */
static void kind_key(const tv *V, int64_t k, int32_t key[2]) { memcpy(key, ht_key(&V->kinds, k), 2 * sizeof(int32_t)); }

static lm_status kind_of(tv *V, int32_t name, int32_t cat, int32_t *out) {
    int32_t key[2] = {name, cat};
    int added;
    LM_TRY(lm__reserve((void **)&V->ks, &V->cap_ks, V->kinds.n + 1, sizeof *V->ks)); /* before a key is added */
    LM_TRY(ht_get(&V->kinds, (const char *)key, sizeof key, out, &added));
    if (added) memset(&V->ks[*out], 0, sizeof *V->ks);
    return LM_OK;
}

static lm_status proc_of(tv *V, int64_t pid, int32_t *out) {
    int added;
    LM_TRY(lm__reserve((void **)&V->pr, &V->cap_pr, V->procs.n + 1, sizeof *V->pr));
    LM_TRY(ht_get(&V->procs, (const char *)&pid, sizeof pid, out, &added));
    if (added) V->pr[*out] = (proc){pid, 0, 0};
    return LM_OK;
}

/* The track of key (built by the caller, starting with its TK_ letter), created empty
 * with kind and proc when new. Pointers into V->tr are invalid after this call. */
static lm_status track_of(tv *V, const char *key, size_t n, int kind, int64_t pid, int32_t *out) {
    int added;
    LM_TRY(lm__reserve((void **)&V->tr, &V->cap_tr, V->tracks.n + 1, sizeof *V->tr)); /* every key has its track */
    LM_TRY(ht_get(&V->tracks, key, n, out, &added));
    if (added) {
        track *t = &V->tr[*out];
        memset(t, 0, sizeof *t);
        t->kind = kind;
        LM_TRY(proc_of(V, pid, &t->proc));
    }
    return LM_OK;
}

static lm_status thread_track(tv *V, int64_t pid, int64_t tid, int32_t *out) {
    char key[64];
    int n = snprintf(key, sizeof key, "T%lld/%lld", (long long)pid, (long long)tid);
    LM_TRY(track_of(V, key, (size_t)n, TK_THREAD, pid, out));
    V->tr[*out].tid = tid;
    return LM_OK;
}

/* ---- reading events --------------------------------------------------------------------------- */

/* A string member (absent: ""), or a fault. */
static lm_status str_member(const tv *V, json_t *e, size_t i, const char *key, const char **s, size_t *n) {
    json_t *j = json_object_get(e, key);
    *s = "", *n = 0;
    if (!j || json_is_null(j)) return LM_OK;
    if (!json_is_string(j)) return fault(V, i, "\"%s\" is not a string", key);
    *s = json_string_value(j), *n = json_string_length(j);
    return LM_OK;
}

/* An integer member pid or tid (absent: 0); integral reals are taken, strings refused. */
static lm_status int_member(const tv *V, json_t *e, size_t i, const char *key, int64_t *v) {
    json_t *j = json_object_get(e, key);
    *v = 0;
    if (!j) return LM_OK;
    if (json_is_integer(j)) {
        *v = (int64_t)json_integer_value(j);
        return LM_OK;
    }
    double d = json_is_real(j) ? json_real_value(j) : NAN;
    if (!(d == floor(d) && fabs(d) < 9e15)) return fault(V, i, "\"%s\" is not an integer", key);
    *v = (int64_t)d;
    return LM_OK;
}

/* A required time member ("ts", "dur") in microseconds, as nanoseconds. */
static lm_status time_member(const tv *V, json_t *e, size_t i, const char *key, int64_t *ns) {
    json_t *j = json_object_get(e, key);
    if (!j) return fault(V, i, "no \"%s\" (%s)", key, !strcmp(key, "ts") ? "timestamp" : "duration");
    if (!json_is_number(j)) return fault(V, i, "\"%s\" is not a number", key);
    double us = json_number_value(j);
    if (!isfinite(us) || fabs(us) > MAX_TS_US) return fault(V, i, "\"%s\" %g is out of range", key, us);
    *ns = llround(us * 1000.0);
    return LM_OK;
}

/* args.detail when it is the only argument, else the arguments as compact JSON. */
static lm_status detail_of(tv *V, json_t *e, int32_t *out) {
    json_t *a = json_object_get(e, "args");
    *out = 0;
    if (!a || json_is_null(a) || (json_is_object(a) && json_object_size(a) == 0)) return LM_OK;
    json_t *d = json_is_object(a) ? json_object_get(a, "detail") : NULL;
    if (d && json_is_string(d) && json_object_size(a) == 1)
        return intern_detail(V, json_string_value(d), json_string_length(d), out);
    char *s = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s) return lm__error(LM_OUT_OF_MEMORY, "trace '%s': formatting an event's arguments", V->src);
    lm_status st = intern_detail(V, s, strlen(s), out);
    free(s); /* jansson's allocation */
    return st;
}

static void see_time(tv *V, int64_t t0, int64_t t1) {
    if (!V->have_t) V->tmin = t0, V->tmax = t1, V->have_t = 1;
    V->tmin = LM_MIN(V->tmin, t0);
    V->tmax = LM_MAX(V->tmax, t1);
}

static lm_status push_span(tv *V, int32_t ti, int64_t t0, int64_t t1, int32_t kind, int32_t detail, int32_t depth,
                           int64_t seq) {
    track *t = &V->tr[ti];
    vspan s = {t0, t1, t1 - t0, kind, detail, depth, t->id, seq};
    V->nspans++;
    return LM__PUSH(t->sp, t->nsp, t->cap_sp, s);
}

static lm_status metadata(tv *V, json_t *e, size_t i, const char *name, int64_t pid, int64_t tid) {
    json_t *a = json_object_get(e, "args");
    json_t *nm = json_is_object(a) ? json_object_get(a, "name") : NULL;
    json_t *si = json_is_object(a) ? json_object_get(a, "sort_index") : NULL;
    int32_t p, ti, s = 0;
    if (nm && json_is_string(nm)) LM_TRY(intern(V, json_string_value(nm), json_string_length(nm), &s));
    if (!strcmp(name, "process_name") || !strcmp(name, "process_sort_index")) {
        LM_TRY(proc_of(V, pid, &p));
        if (s) V->pr[p].name = s;
        if (si && json_is_integer(si)) V->pr[p].sort = (int64_t)json_integer_value(si);
    } else if (!strcmp(name, "thread_name") || !strcmp(name, "thread_sort_index")) {
        LM_TRY(thread_track(V, pid, tid, &ti));
        if (s) V->tr[ti].name = s;
        if (si && json_is_integer(si)) V->tr[ti].sort = (int64_t)json_integer_value(si);
    }
    (void)i;
    return LM_OK;
}

/* The track of an async event's id (its pid, category and "id" or "id2"). */
static lm_status async_track(tv *V, json_t *e, size_t i, int64_t pid, const char *cat, size_t ncat, int32_t *out) {
    json_t *j = json_object_get(e, "id");
    if (!j) j = json_object_get(e, "id2");
    if (!j) return fault(V, i, "async event without an \"id\"");
    char idb[64], *dumped = NULL;
    const char *id = idb;
    size_t nid;
    if (json_is_integer(j)) nid = (size_t)snprintf(idb, sizeof idb, "%lld", (long long)json_integer_value(j));
    else if (json_is_real(j)) nid = (size_t)snprintf(idb, sizeof idb, "%.17g", json_real_value(j));
    else if (json_is_string(j)) id = json_string_value(j), nid = json_string_length(j);
    else if ((dumped = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY)) != NULL) id = dumped, nid = strlen(dumped);
    else return lm__error(LM_OUT_OF_MEMORY, "trace '%s': formatting an id", V->src);
    int32_t cs, is;
    lm_status st = intern(V, cat, ncat, &cs);
    if (st == LM_OK) st = intern_detail(V, id, nid, &is);
    free(dumped);
    LM_TRY(st);
    char key[64];
    int n = snprintf(key, sizeof key, "A%lld/%d/%d", (long long)pid, cs, is);
    LM_TRY(track_of(V, key, (size_t)n, TK_ID, pid, out));
    track *t = &V->tr[*out];
    if (!t->nsp && !t->nin && !t->nop) t->cat = cs, t->id = is, t->seq = (int64_t)i;
    return LM_OK;
}

static lm_status async_event(tv *V, json_t *e, size_t i, char ph, int64_t pid, const char *cat, size_t ncat,
                             int32_t kind, int32_t detail, int64_t t) {
    int32_t ti;
    LM_TRY(async_track(V, e, i, pid, cat, ncat, &ti));
    track *a = &V->tr[ti];
    if (ph == 'b') {
        vopen o = {t, (int64_t)i, kind, detail};
        return LM__PUSH(a->op, a->nop, a->cap_op, o);
    }
    if (ph == 'n') {
        vinst in = {t, (int64_t)i, kind, detail, a->id};
        V->ninst++;
        V->ks[kind].icount++;
        return LM__PUSH(a->in, a->nin, a->cap_in, in);
    }
    int32_t want[2], have[2]; /* (name, category) */
    kind_key(V, kind, want);
    if (!a->nop)
        return fault(V, i, "async end (\"e\") of '%.100s' id %.100s with no open begin (\"b\")",
                     ht_key(&V->str, want[0]), ht_key(&V->str, a->id));
    int64_t k = a->nop - 1; /* the innermost open span of the same name, else the innermost */
    for (int64_t j = a->nop - 1; j >= 0; j--) {
        kind_key(V, a->op[j].kind, have);
        if (have[0] == want[0]) {
            k = j;
            break;
        }
    }
    vopen o = a->op[k];
    if (t < o.t0) return fault(V, i, "async end (\"e\") before its begin (event %lld)", (long long)o.seq);
    memmove(a->op + k, a->op + k + 1, sizeof *a->op * (size_t)(a->nop - k - 1));
    a->nop--;
    if (detail && !o.detail) o.detail = detail;
    return push_span(V, ti, o.t0, t, o.kind, o.detail, (int32_t)k, o.seq);
}

static lm_status counter_event(tv *V, json_t *e, size_t i, int64_t pid, const char *name, size_t nname, int64_t t) {
    json_t *a = json_object_get(e, "args");
    if (!json_is_object(a)) return fault(V, i, "counter (\"C\") without an \"args\" object");
    const char *key;
    json_t *v;
    json_object_foreach(a, key, v) {
        if (!json_is_number(v)) continue; /* Chrome plots numbers only */
        char label[DETAIL_BYTES + 64];
        int k = snprintf(label, sizeof label, "%.*s%s%s", (int)LM_MIN(nname, (size_t)DETAIL_BYTES), name,
                         strcmp(key, "value") ? " " : "", strcmp(key, "value") ? key : "");
        int32_t s, ti;
        LM_TRY(intern(V, label, (size_t)LM_MIN((size_t)k, sizeof label - 1), &s));
        char tk[64];
        int n = snprintf(tk, sizeof tk, "C%lld/%d", (long long)pid, s);
        LM_TRY(track_of(V, tk, (size_t)n, TK_COUNTER, pid, &ti));
        track *c = &V->tr[ti];
        c->name = s;
        vpoint p = {t, (int64_t)i, json_number_value(v)};
        V->npoints++;
        LM_TRY(LM__PUSH(c->pt, c->npt, c->cap_pt, p));
    }
    return LM_OK;
}

static lm_status add_event(tv *V, json_t *e, size_t i) {
    if (!json_is_object(e)) return fault(V, i, "not an object");
    json_t *jph = json_object_get(e, "ph");
    if (!jph) return fault(V, i, "no \"ph\" (phase)");
    const char *ph = json_string_value(jph);
    if (!ph || json_string_length(jph) != 1) return fault(V, i, "\"ph\" is not a one-letter string");
    const char *name, *cat;
    size_t nname, ncat;
    int64_t pid, tid, t, dur;
    LM_TRY(str_member(V, e, i, "name", &name, &nname));
    LM_TRY(str_member(V, e, i, "cat", &cat, &ncat));
    LM_TRY(int_member(V, e, i, "pid", &pid));
    LM_TRY(int_member(V, e, i, "tid", &tid));
    char c = ph[0];
    if (c == 'M') return metadata(V, e, i, name, pid, tid);
    if (!strchr("XBEbenCiI", c)) {
        V->skipped++; /* flows, samples, objects, marks...: not drawn */
        return LM_OK;
    }
    LM_TRY(time_member(V, e, i, "ts", &t));
    int32_t ns, cs, kind, detail, ti;
    if (c == 'C') {
        see_time(V, t, t);
        return counter_event(V, e, i, pid, name, nname, t);
    }
    LM_TRY(intern(V, name, nname, &ns));
    LM_TRY(intern(V, cat, ncat, &cs));
    LM_TRY(kind_of(V, ns, cs, &kind));
    LM_TRY(detail_of(V, e, &detail));
    if (c == 'b' || c == 'e' || c == 'n') {
        see_time(V, t, t);
        return async_event(V, e, i, c, pid, cat, ncat, kind, detail, t);
    }
    LM_TRY(thread_track(V, pid, tid, &ti));
    track *tr = &V->tr[ti];
    switch (c) {
    case 'X':
        LM_TRY(time_member(V, e, i, "dur", &dur));
        if (dur < 0) return fault(V, i, "negative duration (\"dur\" %.3f us)", (double)dur / 1000.0);
        see_time(V, t, t + dur);
        return push_span(V, ti, t, t + dur, kind, detail, 0, (int64_t)i);
    case 'B': {
        see_time(V, t, t);
        vopen o = {t, (int64_t)i, kind, detail};
        return LM__PUSH(tr->op, tr->nop, tr->cap_op, o);
    }
    case 'E': {
        if (!tr->nop)
            return fault(V, i, "end (\"E\") with no open begin (\"B\") on pid %lld tid %lld", (long long)pid,
                         (long long)tid);
        vopen o = tr->op[--tr->nop];
        if (t < o.t0) return fault(V, i, "end (\"E\") before its begin (event %lld)", (long long)o.seq);
        see_time(V, t, t);
        return push_span(V, ti, o.t0, t, o.kind, o.detail ? o.detail : detail, 0, o.seq);
    }
    default: { /* i, I */
        see_time(V, t, t);
        vinst in = {t, (int64_t)i, kind, detail, 0};
        V->ninst++;
        V->ks[kind].icount++;
        return LM__PUSH(tr->in, tr->nin, tr->cap_in, in);
    }
    }
}

/* ---- finishing: nesting, self time, lanes ------------------------------------------------------ */

static int cmp_span(const void *a, const void *b) {
    const vspan *x = a, *y = b;
    if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
    if (x->t1 != y->t1) return x->t1 > y->t1 ? -1 : 1; /* the longer (the parent) first */
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int cmp_inst(const void *a, const void *b) {
    const vinst *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int cmp_point(const void *a, const void *b) {
    const vpoint *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* A thread's spans: sorted, depth by a stack of open parents, self time, busy time. */
static lm_status nest_thread(tv *V, track *t, int64_t **stk, int64_t *cap) {
    for (; t->nop > 0; V->unclosed++) { /* a B without its E ends with the trace */
        vopen o = t->op[--t->nop];
        vspan s = {o.t0, V->tmax, V->tmax - o.t0, o.kind, o.detail, 0, 0, o.seq};
        V->nspans++;
        LM_TRY(LM__PUSH(t->sp, t->nsp, t->cap_sp, s));
    }
    if (t->nsp) qsort(t->sp, (size_t)t->nsp, sizeof *t->sp, cmp_span);
    if (t->nin) qsort(t->in, (size_t)t->nin, sizeof *t->in, cmp_inst);
    LM_TRY(lm__reserve((void **)stk, cap, t->nsp, sizeof **stk));
    int64_t n = 0, covered = INT64_MIN;
    t->depth = 1, t->busy = 0;
    for (int64_t i = 0; i < t->nsp; i++) {
        vspan *s = &t->sp[i];
        while (n && t->sp[(*stk)[n - 1]].t1 <= s->t0 && !(t->sp[(*stk)[n - 1]].t1 == s->t0 && s->t1 == s->t0 &&
                                                          t->sp[(*stk)[n - 1]].t0 == s->t0))
            n--;
        s->depth = (int32_t)n;
        if (n) {
            vspan *p = &t->sp[(*stk)[n - 1]];
            p->self -= LM_MIN(s->t1, p->t1) - s->t0; /* the child's part inside its parent */
        }
        (*stk)[n++] = i;
        t->depth = LM_MAX(t->depth, (int32_t)n);
        t->busy += LM_MAX(0, s->t1 - LM_MAX(s->t0, covered));
        covered = LM_MAX(covered, s->t1);
    }
    for (int64_t i = 0; i < t->nsp; i++) {
        vspan *s = &t->sp[i];
        if (s->self < 0) s->self = 0; /* overlapping (improperly nested) children */
        kstat *k = &V->ks[s->kind];
        k->self += s->self, k->total += s->t1 - s->t0, k->count++;
    }
    return LM_OK;
}

typedef struct idref {
    int32_t proc, cat;
    int64_t first, seq;
    int32_t track;
} idref;

static int cmp_idref(const void *a, const void *b) {
    const idref *x = a, *y = b;
    if (x->proc != y->proc) return x->proc < y->proc ? -1 : 1;
    if (x->cat != y->cat) return x->cat < y->cat ? -1 : 1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Async ids into lanes: per (process, category), each id in the first lane whose last
 * id ended by its first event, a new lane when none has. */
static lm_status assign_lanes(tv *V) {
    idref *ids = NULL;
    int64_t nids = 0, cap_ids = 0, *lane_end = NULL, cap_le = 0;
    int32_t *lane_tr = NULL;
    int64_t cap_lt = 0;
    lm_status st = LM_OK;
    int64_t ntr = V->tracks.n; /* lanes are appended after */
    for (int64_t i = 0; i < ntr && st == LM_OK; i++) {
        track *t = &V->tr[i];
        if (t->kind != TK_ID) continue;
        for (; t->nop > 0; V->unclosed++) {
            vopen o = t->op[--t->nop];
            vspan s = {o.t0, V->tmax, 0, o.kind, o.detail, (int32_t)t->nop, t->id, o.seq};
            V->nspans++;
            if ((st = LM__PUSH(t->sp, t->nsp, t->cap_sp, s)) != LM_OK) break;
        }
        t->first = INT64_MAX, t->last = INT64_MIN;
        for (int64_t j = 0; j < t->nsp; j++) t->first = LM_MIN(t->first, t->sp[j].t0), t->last = LM_MAX(t->last, t->sp[j].t1);
        for (int64_t j = 0; j < t->nin; j++) t->first = LM_MIN(t->first, t->in[j].t), t->last = LM_MAX(t->last, t->in[j].t);
        idref r = {t->proc, t->cat, t->first, t->seq, (int32_t)i};
        if (st == LM_OK && (t->nsp || t->nin)) st = LM__PUSH(ids, nids, cap_ids, r);
    }
    if (st == LM_OK && nids) qsort(ids, (size_t)nids, sizeof *ids, cmp_idref);
    int64_t nl = 0;
    for (int64_t i = 0; i < nids && st == LM_OK; i++) {
        if (i == 0 || ids[i].proc != ids[i - 1].proc || ids[i].cat != ids[i - 1].cat) nl = 0;
        track *id = &V->tr[ids[i].track];
        int64_t l = 0;
        while (l < nl && lane_end[l] > id->first) l++;
        if (l == nl) {
            char key[64];
            int n = snprintf(key, sizeof key, "L%d/%d/%lld", ids[i].proc, ids[i].cat, (long long)l);
            int32_t ti;
            if ((st = lm__reserve((void **)&lane_end, &cap_le, nl + 1, sizeof *lane_end)) != LM_OK) break;
            if ((st = lm__reserve((void **)&lane_tr, &cap_lt, nl + 1, sizeof *lane_tr)) != LM_OK) break;
            if ((st = track_of(V, key, (size_t)n, TK_LANE, V->pr[ids[i].proc].pid, &ti)) != LM_OK) break;
            V->tr[ti].tid = l, V->tr[ti].name = ids[i].cat;
            lane_tr[nl++] = ti;
        }
        id = &V->tr[ids[i].track]; /* track_of may have moved the array */
        track *ln = &V->tr[lane_tr[l]];
        lane_end[l] = id->last;
        for (int64_t j = 0; j < id->nsp && st == LM_OK; j++) {
            vspan s = id->sp[j];
            s.self = s.t1 - s.t0;
            V->ks[s.kind].acount++, V->ks[s.kind].atotal += s.t1 - s.t0;
            ln->depth = LM_MAX(ln->depth, s.depth + 1);
            st = LM__PUSH(ln->sp, ln->nsp, ln->cap_sp, s);
        }
        for (int64_t j = 0; j < id->nin && st == LM_OK; j++) st = LM__PUSH(ln->in, ln->nin, ln->cap_in, id->in[j]);
    }
    for (int64_t i = ntr; i < V->tracks.n; i++) {
        track *t = &V->tr[i];
        if (t->nsp) qsort(t->sp, (size_t)t->nsp, sizeof *t->sp, cmp_span);
        if (t->nin) qsort(t->in, (size_t)t->nin, sizeof *t->in, cmp_inst);
        t->depth = LM_MAX(t->depth, 1);
    }
    lm__free(ids), lm__free(lane_end), lm__free(lane_tr);
    return st;
}

static lm_status finish(tv *V) {
    int64_t *stk = NULL, cap = 0;
    lm_status st = LM_OK;
    for (int64_t i = 0; i < V->tracks.n && st == LM_OK; i++) {
        track *t = &V->tr[i];
        if (t->kind == TK_THREAD) st = nest_thread(V, t, &stk, &cap);
        else if (t->kind == TK_COUNTER && t->npt) qsort(t->pt, (size_t)t->npt, sizeof *t->pt, cmp_point);
    }
    lm__free(stk);
    return st == LM_OK ? assign_lanes(V) : st;
}

/* ---- output ------------------------------------------------------------------------------------ */

typedef struct order {
    int64_t a, b, c, d; /* sort keys */
    int64_t idx;
} order;

static int cmp_order(const void *x, const void *y) {
    const order *p = x, *q = y;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    if (p->b != q->b) return p->b < q->b ? -1 : 1;
    if (p->c != q->c) return p->c < q->c ? -1 : 1;
    if (p->d != q->d) return p->d < q->d ? -1 : 1;
    return p->idx < q->idx ? -1 : p->idx > q->idx;
}

static void emit_track(const tv *V, const track *t, int64_t proc_out, sbuf *b) {
    int64_t o = V->tmin;
    sb_str(b, "{\"p\":");
    sb_int(b, proc_out);
    sb_str(b, ",\"k\":");
    sb_int(b, t->kind);
    sb_str(b, ",\"tid\":");
    sb_int(b, t->tid);
    sb_str(b, ",\"n\":");
    sb_int(b, t->name);
    sb_str(b, ",\"busy\":");
    sb_int(b, t->busy);
    sb_str(b, ",\"depth\":");
    sb_int(b, t->depth);
    /* spans: start (delta from the previous span's), duration, kind, detail, depth,
     * self time (thread) or id (lane) */
    sb_str(b, ",\"s\":[");
    int64_t prev = 0;
    for (int64_t i = 0; i < t->nsp; i++) {
        const vspan *s = &t->sp[i];
        if (i) sb_put(b, ",", 1);
        sb_int(b, s->t0 - o - prev), prev = s->t0 - o;
        sb_put(b, ",", 1), sb_int(b, s->t1 - s->t0);
        sb_put(b, ",", 1), sb_int(b, s->kind);
        sb_put(b, ",", 1), sb_int(b, s->detail);
        sb_put(b, ",", 1), sb_int(b, s->depth);
        sb_put(b, ",", 1), sb_int(b, t->kind == TK_LANE ? s->id : s->self);
    }
    /* instants: time (delta), kind, detail, id */
    sb_str(b, "],\"i\":[");
    prev = 0;
    for (int64_t i = 0; i < t->nin; i++) {
        const vinst *s = &t->in[i];
        if (i) sb_put(b, ",", 1);
        sb_int(b, s->t - o - prev), prev = s->t - o;
        sb_put(b, ",", 1), sb_int(b, s->kind);
        sb_put(b, ",", 1), sb_int(b, s->detail);
        sb_put(b, ",", 1), sb_int(b, s->id);
    }
    /* counter samples: time (delta), value */
    sb_str(b, "],\"c\":[");
    prev = 0;
    for (int64_t i = 0; i < t->npt; i++) {
        if (i) sb_put(b, ",", 1);
        sb_int(b, t->pt[i].t - o - prev), prev = t->pt[i].t - o;
        sb_put(b, ",", 1), sb_num(b, t->pt[i].v);
    }
    sb_str(b, "]}");
}

static lm_status emit(const tv *V, sbuf *b) {
    int64_t ntr = V->tracks.n, npr = V->procs.n, nk = V->kinds.n;
    order *to = lm__alloc(sizeof(order) * (size_t)(ntr + 1), 16);
    order *po = lm__alloc(sizeof(order) * (size_t)(npr + 1), 16);
    order *ko = lm__alloc(sizeof(order) * (size_t)(nk + 1), 16);
    int64_t *pout = lm__calloc((size_t)npr + 1, sizeof(int64_t)); /* a process's index in the page, -1 none */
    int64_t *ntracks = lm__calloc((size_t)npr + 1, sizeof(int64_t));
    if (!to || !po || !ko || !pout || !ntracks) {
        lm__free(to), lm__free(po), lm__free(ko), lm__free(pout), lm__free(ntracks);
        return LM_OUT_OF_MEMORY;
    }
    for (int64_t i = 0; i < ntr; i++)
        if (V->tr[i].kind != TK_ID) ntracks[V->tr[i].proc]++;
    int64_t np = 0;
    for (int64_t i = 0; i < npr; i++)
        if (ntracks[i]) po[np++] = (order){V->pr[i].sort, V->pr[i].pid, 0, 0, i};
    qsort(po, (size_t)np, sizeof *po, cmp_order);
    for (int64_t i = 0; i < npr; i++) pout[i] = -1;
    for (int64_t i = 0; i < np; i++) pout[po[i].idx] = i;
    int64_t nt = 0;
    for (int64_t i = 0; i < ntr; i++) {
        const track *t = &V->tr[i];
        if (t->kind == TK_ID) continue;
        /* threads by sort index and tid, then lanes by category and number, then counters by name */
        int64_t group = t->kind == TK_THREAD ? 0 : t->kind == TK_LANE ? 1 : 2;
        to[nt++] = (order){pout[t->proc], group, t->kind == TK_THREAD ? t->sort : t->name,
                           t->kind == TK_COUNTER ? 0 : t->tid, i};
    }
    qsort(to, (size_t)nt, sizeof *to, cmp_order);
    int64_t ntop = 0;
    for (int64_t i = 0; i < nk; i++)
        if (V->ks[i].count) ko[ntop++] = (order){-V->ks[i].self, -V->ks[i].count, 0, 0, i};
    qsort(ko, (size_t)ntop, sizeof *ko, cmp_order);

    sb_str(b, "{\"version\":1,\"source\":");
    sb_jstr(b, V->src, strlen(V->src));
    sb_str(b, ",\"producer\":");
    sb_int(b, V->producer);
    sb_str(b, ",\"wall\":");
    sb_int(b, V->tmax - V->tmin);
    sb_str(b, ",\"origin_us\":");
    char t[48];
    sb_put(b, t, (size_t)snprintf(t, sizeof t, "%.3f", (double)V->tmin / 1000.0));
    const int64_t counts[] = {V->nevents, V->nspans, V->ninst, V->npoints, V->skipped, V->unclosed, V->dropped};
    const char *const names[] = {"events", "spans", "instants", "samples", "skipped", "unclosed", "dropped"};
    for (int i = 0; i < 7; i++) {
        sb_str(b, ",\"");
        sb_str(b, names[i]);
        sb_str(b, "\":");
        sb_int(b, counts[i]);
    }
    sb_str(b, ",\n\"strings\":[");
    for (int64_t i = 0; i < V->str.n; i++) {
        if (i) sb_put(b, ",", 1);
        sb_jstr(b, ht_key(&V->str, i), ht_len(&V->str, i));
    }
    /* kinds: name, category, self ns, total ns, count (thread spans), async count, async total ns, instants */
    sb_str(b, "],\n\"kinds\":[");
    for (int64_t i = 0; i < nk; i++) {
        int32_t key[2];
        kind_key(V, i, key);
        const kstat *k = &V->ks[i];
        const int64_t v[] = {key[0], key[1], k->self, k->total, k->count, k->acount, k->atotal, k->icount};
        sb_str(b, i ? ",[" : "[");
        for (int j = 0; j < 8; j++) {
            if (j) sb_put(b, ",", 1);
            sb_int(b, v[j]);
        }
        sb_put(b, "]", 1);
    }
    sb_str(b, "],\n\"top\":[");
    for (int64_t i = 0; i < ntop; i++) {
        if (i) sb_put(b, ",", 1);
        sb_int(b, ko[i].idx);
    }
    sb_str(b, "],\n\"procs\":[");
    for (int64_t i = 0; i < np; i++) {
        const proc *p = &V->pr[po[i].idx];
        sb_str(b, i ? ",[" : "[");
        sb_int(b, p->pid);
        sb_put(b, ",", 1);
        sb_int(b, p->name);
        sb_put(b, "]", 1);
    }
    sb_str(b, "],\n\"tracks\":[");
    for (int64_t i = 0; i < nt; i++) {
        if (i) sb_str(b, ",\n");
        emit_track(V, &V->tr[to[i].idx], to[i].a, b);
    }
    sb_str(b, "]}");
    lm__free(to), lm__free(po), lm__free(ko), lm__free(pout), lm__free(ntracks);
    return b->oom ? LM_OUT_OF_MEMORY : LM_OK;
}

static lm_status load(tv *V, const char *json, size_t len) {
    json_error_t err;
    json_t *root = json_loadb(json, len, JSON_DECODE_ANY, &err);
    if (!root)
        return lm__error(LM_PARSE_ERROR, "trace '%s': not JSON: %s (line %d, column %d)", V->src, err.text, err.line,
                         err.column);
    json_t *events = root;
    lm_status st = LM_OK;
    if (json_is_object(root)) {
        events = json_object_get(root, "traceEvents");
        json_t *od = json_object_get(root, "otherData");
        json_t *pr = json_is_object(od) ? json_object_get(od, "producer") : NULL;
        json_t *dr = json_is_object(od) ? json_object_get(od, "dropped_events") : NULL;
        if (pr && json_is_string(pr)) st = intern(V, json_string_value(pr), json_string_length(pr), &V->producer);
        if (dr && json_is_integer(dr)) V->dropped = (int64_t)json_integer_value(dr);
        if (!json_is_array(events))
            st = lm__error(LM_PARSE_ERROR, "trace '%s': the top-level object has no \"traceEvents\" array", V->src);
    } else if (!json_is_array(root)) {
        st = lm__error(LM_PARSE_ERROR, "trace '%s': the top level is not an object or an array of events", V->src);
    }
    if (st == LM_OK) {
        V->nevents = (int64_t)json_array_size(events);
        for (size_t i = 0; i < json_array_size(events) && st == LM_OK; i++) st = add_event(V, json_array_get(events, i), i);
    }
    json_decref(root);
    return st;
}

/* The page around the data, as NULL-terminated arrays of lines (at the end of the file). */
static const char *const *page_head(void);
static const char *const *page_tail(void);

lm_status lm_trace_html(const char *json, size_t len, const char *source_name, char **out) {
    if (out) *out = NULL;
    if ((!json && len) || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_trace_html: NULL argument");
    tv V;
    memset(&V, 0, sizeof V);
    V.src = source_name ? source_name : "(trace)";
    if (len > MAX_INPUT)
        return lm__error(LM_INVALID_ARGUMENT, "trace '%s': %zu bytes is over the viewer's limit of %zu MiB", V.src, len,
                         MAX_INPUT >> 20);
    int32_t empty;
    lm_status st = intern(&V, "", 0, &empty); /* string 0: none */
    if (st == LM_OK) st = load(&V, json ? json : "", len);
    if (st == LM_OK) st = finish(&V);
    sbuf b = {0};
    if (st == LM_OK) {
        for (const char *const *l = page_head(); *l; l++) sb_str(&b, *l);
        st = emit(&V, &b);
        for (const char *const *l = page_tail(); *l; l++)
            if (*l == lm__html_nav_marker)
                for (const char *const *n = lm__html_nav_js; *n; n++) sb_str(&b, *n);
            else
                sb_str(&b, *l);
        if (b.oom) st = LM_OUT_OF_MEMORY;
    }
    for (int64_t i = 0; i < V.tracks.n; i++) {
        track *t = &V.tr[i];
        lm__free(t->sp), lm__free(t->in), lm__free(t->pt), lm__free(t->op);
    }
    lm__free(V.tr), lm__free(V.pr), lm__free(V.ks);
    ht_free(&V.str), ht_free(&V.kinds), ht_free(&V.tracks), ht_free(&V.procs);
    if (st != LM_OK) {
        lm__free(b.p);
        return st == LM_OUT_OF_MEMORY ? lm__error(st, "trace '%s': out of memory building the page", V.src) : st;
    }
    *out = b.p;
    return LM_OK;
}

/* ---- the page ---------------------------------------------------------------------------------- */
/* PAGE-BEGIN: plain HTML, CSS and ES5 JavaScript (no library, no network), one C string
 * per line; the data element sits between the two halves. window.loomTrace is the hook
 * scripts and tests/tools/browser_trace.py use (draw, fit, zoom, findSpan, counters). */
static const char *const *page_head(void) {
    static const char *const lines[] = {
        "<!DOCTYPE html>\n",
        "<html lang=\"en\"><head><meta charset=\"utf-8\">\n",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
        "<title>loom trace</title>\n",
        "<style>\n",
        "body{margin:0;font:13px/1.35 system-ui,sans-serif;color:#222;background:#fff;display:flex;flex-direction:column;height:100vh}\n",
        "#top{padding:8px 12px 4px;border-bottom:1px solid #ddd;max-height:48vh;overflow:auto;flex:none}\n",
        "h1{font-size:16px;margin:0 0 2px}\n",
        "#summary{margin:2px 0 6px}\n",
        "#summary .warn{color:#a40}\n",
        "#tables{display:flex;flex-wrap:wrap;gap:6px 28px;align-items:flex-start}\n",
        "#tables h2{font-size:13px;margin:2px 0;font-weight:600}\n",
        "#tables h2 small{font-weight:400;color:#666}\n",
        "table{border-collapse:collapse;font-size:12px}\n",
        "td,th{padding:0 6px;text-align:right;white-space:nowrap}\n",
        "td.l,th.l{text-align:left;max-width:240px;overflow:hidden;text-overflow:ellipsis}\n",
        "th{font-weight:600;border-bottom:1px solid #ccc}\n",
        "tr.more td{color:#666}\n",
        ".bar{display:inline-block;height:9px;vertical-align:-1px}\n",
        ".sw{display:inline-block;width:10px;height:10px;vertical-align:-1px;border:1px solid #0002}\n",
        "#legend{margin:4px 0 0}\n",
        "#legend span{margin-right:12px;white-space:nowrap}\n",
        "#controls{margin:4px 0}\n",
        "#controls button{font:inherit;margin-right:4px}\n",
        "#hint{color:#555}\n",
        "#scroller{flex:1;overflow-y:auto;overflow-x:hidden;position:relative}\n",
        "#cv{position:sticky;top:0;display:block;cursor:crosshair}\n",
        "#tip{position:fixed;display:none;pointer-events:none;background:#fffff4;border:1px solid #888;padding:4px 6px;\n",
        "font-size:12px;white-space:pre-line;max-width:560px;box-shadow:1px 1px 4px #0003;z-index:9}\n",
        "</style></head><body>\n",
        "<div id=\"top\">\n",
        "<h1 id=\"title\">loom trace</h1>\n",
        "<div id=\"summary\"></div>\n",
        "<div id=\"tables\">\n",
        "<div><h2>Which operations dominate <small>self time per span name (its duration less its children's), share of the wall time</small></h2><table id=\"ops\"></table></div>\n",
        "<div><h2>Where the machine idles <small>per thread: time inside a span (busy) and outside (idle)</small></h2><table id=\"threads\"></table></div>\n",
        "<div id=\"asyncbox\"><h2>Async spans <small>(requests: not in the self times)</small></h2><table id=\"async\"></table></div>\n",
        "</div>\n",
        "<div id=\"legend\"></div>\n",
        "<div id=\"controls\"><button id=\"fit\">fit (0)</button><button id=\"zin\">zoom in (+)</button><button id=\"zout\">zoom out (&minus;)</button>\n",
        "<span id=\"hint\">&nbsp;ctrl+wheel or +/&minus; zoom, double-click zooms in (shift: out), drag or shift+wheel pans, click a process to fold it</span></div>\n",
        "</div>\n",
        "<div id=\"scroller\"><canvas id=\"cv\"></canvas><div id=\"spacer\"></div></div>\n",
        "<div id=\"tip\"></div>\n",
        "<script type=\"application/json\" id=\"tv-data\">\n",
        NULL};
    return lines;
}

static const char *const *page_tail(void) {
    static const char *const lines[] = {
        "</script>\n",
        "<script>\n",
        "(function () {\n",
        "'use strict';\n",
        "var D = JSON.parse(document.getElementById('tv-data').textContent);\n",
        "var api = window.loomTrace = {ready: false, data: D, draws: 0, drawnRows: 0, drawnSpans: 0, aggregated: 0};\n",
        "var S = D.strings, K = D.kinds;\n",
        "function $(id) { return document.getElementById(id); }\n",
        "var total = Math.max(D.wall, 1);\n",
        "var LABELW = 230, RIGHT = 12, AXISH = 22, ROWH = 16, PROCH = 20, CTRH = 30, IDLE = '#f0f0f0';\n",
        "/* ---- formatting ---- */\n",
        "function fmtT(ns) {\n",
        "  var a = Math.abs(ns);\n",
        "  if (a >= 1e9) return (ns / 1e9).toFixed(a >= 1e11 ? 1 : a >= 1e10 ? 2 : 3) + ' s';\n",
        "  if (a >= 1e6) return (ns / 1e6).toFixed(a >= 1e8 ? 1 : a >= 1e7 ? 2 : 3) + ' ms';\n",
        "  if (a >= 1e3) return (ns / 1e3).toFixed(a >= 1e5 ? 1 : a >= 1e4 ? 2 : 3) + ' \\u00b5s';\n",
        "  return Math.round(ns) + ' ns';\n",
        "}\n",
        "function pct(x) { return (100 * x).toFixed(x >= 0.1 ? 1 : 2) + '%'; }\n",
        "function num(n) { return n.toLocaleString('en-US'); }\n",
        "function fmtV(v, name) {\n",
        "  if (/bytes/.test(name)) { var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0; while (Math.abs(v) >= 1024 && i < 4) { v /= 1024; i++; } return (i ? v.toFixed(1) : '' + v) + ' ' + u[i]; }\n",
        "  return Math.abs(v) >= 1e6 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3) : '' + Math.round(v * 1000) / 1000;\n",
        "}\n",
        "/* ---- colours: hue by category, shade by name ---- */\n",
        "var CATH = {op: 212, kernel: 140, generate: 28, bench: 28, serve: 40, train: 280, request: 178, memory: 0};\n",
        "function hashStr(s) { var h = 2166136261; for (var i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 16777619); } return h >>> 0; }\n",
        "function catHue(c) { return CATH.hasOwnProperty(c) ? CATH[c] : hashStr(c) % 360; }\n",
        "var COL = K.map(function (k) {\n",
        "  var name = S[k[0]], h = hashStr(name), hue = (catHue(S[k[1]]) + (h % 29) - 14 + 360) % 360;\n",
        "  return 'hsl(' + hue + ',' + (48 + (h >>> 8) % 30) + '%,' + (36 + (h >>> 16) % 20) + '%)';\n",
        "});\n",
        "function kname(kd) { return S[K[kd][0]] || '(unnamed)'; }\n",
        "/* ---- tracks ---- */\n",
        "var P = D.procs.map(function (p) { return {pid: p[0], name: S[p[1]] || 'process ' + p[0], open: true, tracks: []}; });\n",
        "var TR = D.tracks.map(function (t) {\n",
        "  var tr = {k: t.k, tid: t.tid, p: P[t.p], name: S[t.n], busy: t.busy, depth: Math.max(1, t.depth)};\n",
        "  tr.label = t.k === 0 ? (tr.name || 'thread ' + t.tid) : t.k === 1 ? (tr.name || 'async') + ' #' + (t.tid + 1) : tr.name;\n",
        "  var s = t.s, n = s.length / 6, j;\n",
        "  tr.st = new Float64Array(n); tr.du = new Float64Array(n); tr.kd = new Int32Array(n);\n",
        "  tr.de = new Int32Array(n); tr.dp = new Int32Array(n); tr.x = new Float64Array(n);\n",
        "  for (var acc = 0, q = 0; q < n; q++) {\n",
        "    j = 6 * q; acc += s[j]; tr.st[q] = acc; tr.du[q] = s[j + 1]; tr.kd[q] = s[j + 2]; tr.de[q] = s[j + 3]; tr.dp[q] = s[j + 4]; tr.x[q] = s[j + 5];\n",
        "  }\n",
        "  var lv = [], cnt = new Int32Array(tr.depth);\n",
        "  for (q = 0; q < n; q++) cnt[tr.dp[q]]++;\n",
        "  for (var d = 0; d < tr.depth; d++) lv.push({ix: new Int32Array(cnt[d]), me: new Float64Array(cnt[d]), n: 0});\n",
        "  for (q = 0; q < n; q++) { var L = lv[tr.dp[q]]; L.ix[L.n++] = q; }\n",
        "  lv.forEach(function (L) { var m = -Infinity; for (var i = 0; i < L.n; i++) { var q2 = L.ix[i]; m = Math.max(m, tr.st[q2] + tr.du[q2]); L.me[i] = m; } });\n",
        "  tr.lv = lv;\n",
        "  var I = t.i, ni = I.length / 4;\n",
        "  tr.it = new Float64Array(ni); tr.ik = new Int32Array(ni); tr.ide = new Int32Array(ni); tr.iid = new Int32Array(ni);\n",
        "  for (acc = 0, q = 0; q < ni; q++) { acc += I[4 * q]; tr.it[q] = acc; tr.ik[q] = I[4 * q + 1]; tr.ide[q] = I[4 * q + 2]; tr.iid[q] = I[4 * q + 3]; }\n",
        "  var C = t.c, nc = C.length / 2;\n",
        "  tr.ct = new Float64Array(nc); tr.cv = new Float64Array(nc); tr.cmax = 0; tr.cmin = 0;\n",
        "  for (acc = 0, q = 0; q < nc; q++) { acc += C[2 * q]; tr.ct[q] = acc; tr.cv[q] = C[2 * q + 1]; tr.cmax = Math.max(tr.cmax, tr.cv[q]); tr.cmin = Math.min(tr.cmin, tr.cv[q]); }\n",
        "  tr.p.tracks.push(tr);\n",
        "  return tr;\n",
        "});\n",
        "/* ---- summary ---- */\n",
        "function el(tag, cls, text) { var e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined) e.textContent = text; return e; }\n",
        "function row(tb, cells) {\n",
        "  var r = el('tr');\n",
        "  cells.forEach(function (c) { var td = el('td', c[1] || ''); if (c[0] instanceof Node) td.appendChild(c[0]); else td.textContent = c[0]; if (c[2]) td.title = c[2]; r.appendChild(td); });\n",
        "  tb.appendChild(r); return r;\n",
        "}\n",
        "function head(tb, cols) { var r = el('tr'); cols.forEach(function (c) { r.appendChild(el('th', c[1] || '', c[0])); }); tb.appendChild(r); }\n",
        "function swatch(c) { var s = el('span', 'sw'); s.style.background = c; return s; }\n",
        "function bar(frac, c, wpx) { var s = el('span', 'bar'); s.style.width = Math.max(1, Math.round(Math.min(1, frac) * wpx)) + 'px'; s.style.background = c; return s; }\n",
        "function barPair(busy) {\n",
        "  var s = el('span'), i = el('span', 'bar');\n",
        "  i.style.width = Math.round(120 * Math.max(0, 1 - Math.min(1, busy))) + 'px'; i.style.background = IDLE; i.style.outline = '1px solid #ddd';\n",
        "  s.appendChild(bar(busy, '#4a7fc1', 120)); s.appendChild(i); return s;\n",
        "}\n",
        "document.title = 'loom trace \\u2014 ' + D.source;\n",
        "$('title').textContent = 'loom trace \\u2014 ' + D.source;\n",
        "var nth = TR.filter(function (t) { return t.k === 0; }), nlanes = TR.filter(function (t) { return t.k === 1; }).length;\n",
        "var sm = $('summary');\n",
        "sm.textContent = 'wall time ' + fmtT(D.wall) + ' \\u00b7 ' + num(D.events) + ' events: ' + num(D.spans) + ' spans, ' + num(D.instants) + ' instants, ' +\n",
        "  num(D.samples) + ' counter samples \\u00b7 ' + P.length + ' processes, ' + nth.length + ' threads' + (nlanes ? ', ' + nlanes + ' async lanes' : '') +\n",
        "  (D.producer ? ' \\u00b7 written by ' + S[D.producer] : '');\n",
        "function warn(t) { sm.appendChild(document.createTextNode(' \\u00b7 ')); sm.appendChild(el('span', 'warn', t)); }\n",
        "if (D.skipped) warn(num(D.skipped) + ' events of other phases (flows, samples...) not shown');\n",
        "if (D.unclosed) warn(num(D.unclosed) + ' begin events without an end, drawn to the end of the trace');\n",
        "if (D.dropped) warn(num(D.dropped) + ' events were dropped by the writer (size cap)');\n",
        "var ops = $('ops'), TOPN = 15;\n",
        "head(ops, [[''], ['span', 'l'], ['category', 'l'], ['self time'], ['share of wall'], [''], ['count'], ['mean self'], ['incl. children']]);\n",
        "var selfSum = 0;\n",
        "D.top.forEach(function (kd) { selfSum += K[kd][2]; });\n",
        "D.top.slice(0, TOPN).forEach(function (kd) {\n",
        "  var k = K[kd];\n",
        "  row(ops, [[swatch(COL[kd])], [kname(kd), 'l', kname(kd)], [S[k[1]], 'l'], [fmtT(k[2])], [pct(k[2] / total)], [bar(k[2] / total, COL[kd], 90)],\n",
        "            [num(k[4])], [fmtT(k[2] / k[4])], [fmtT(k[3])]]);\n",
        "});\n",
        "if (D.top.length > TOPN) {\n",
        "  var rest = 0; D.top.slice(TOPN).forEach(function (kd) { rest += K[kd][2]; });\n",
        "  row(ops, [[''], [(D.top.length - TOPN) + ' more names', 'l'], [''], [fmtT(rest)], [pct(rest / total)], [''], [''], [''], ['']]).className = 'more';\n",
        "}\n",
        "if (!D.top.length) row(ops, [['no spans']]);\n",
        "var tht = $('threads');\n",
        "head(tht, [['thread', 'l'], ['process', 'l'], ['busy'], ['idle'], ['busy share of the wall time', 'l']]);\n",
        "nth.forEach(function (t) {\n",
        "  var b = t.busy / total;\n",
        "  row(tht, [[t.label, 'l', 'tid ' + t.tid], [t.p.name, 'l', 'pid ' + t.p.pid], [fmtT(t.busy)], [fmtT(Math.max(0, D.wall - t.busy))], [barPair(b), 'l', pct(b) + ' busy, ' + pct(1 - b) + ' idle']]);\n",
        "});\n",
        "var asy = K.map(function (k, i) { return i; }).filter(function (i) { return K[i][5] > 0; });\n",
        "if (asy.length) {\n",
        "  var at = $('async');\n",
        "  head(at, [[''], ['span', 'l'], ['category', 'l'], ['count'], ['mean'], ['total']]);\n",
        "  asy.sort(function (a, b) { return K[b][6] - K[a][6]; });\n",
        "  asy.forEach(function (kd) { var k = K[kd]; row(at, [[swatch(COL[kd])], [kname(kd), 'l'], [S[k[1]], 'l'], [num(k[5])], [fmtT(k[6] / k[5])], [fmtT(k[6])]]); });\n",
        "} else $('asyncbox').style.display = 'none';\n",
        "var cats = {};\n",
        "K.forEach(function (k) { if (k[4] || k[5] || k[7]) cats[S[k[1]]] = 1; });\n",
        "var lg = $('legend');\n",
        "lg.appendChild(el('span', '', 'colour = category (hue), shaded per name:'));\n",
        "Object.keys(cats).sort().forEach(function (c) {\n",
        "  var s = el('span'); s.appendChild(swatch('hsl(' + catHue(c) + ',60%,46%)')); s.appendChild(document.createTextNode(c || '(none)')); lg.appendChild(s);\n",
        "});\n",
        "var s2 = el('span'); s2.appendChild(swatch(IDLE)); s2.appendChild(document.createTextNode('idle (no span on the thread)')); lg.appendChild(s2);\n",
        "/* ---- the timeline ---- */\n",
        "var sc = $('scroller'), cv = $('cv'), ctx = cv.getContext('2d'), tip = $('tip'), spacer = $('spacer');\n",
        "var rows = [], rowY = [0], contentH = 0;\n",
        "function buildRows() {\n",
        "  rows = []; rowY = [0]; var y = 0;\n",
        "  P.forEach(function (p) {\n",
        "    rows.push({t: 'p', p: p}); y += PROCH; rowY.push(y);\n",
        "    if (!p.open) return;\n",
        "    p.tracks.forEach(function (tr) {\n",
        "      if (tr.k === 2) { rows.push({t: 'c', tr: tr}); y += CTRH; rowY.push(y); return; }\n",
        "      for (var d = 0; d < tr.depth; d++) { rows.push({t: 's', tr: tr, d: d}); y += ROWH; rowY.push(y); }\n",
        "    });\n",
        "  });\n",
        "  contentH = y;\n",
        "}\n",
        "var t0 = 0, t1 = total, W = 0, H = 0, drag = null, pending = false;\n",
        "function plotW() { return Math.max(10, W - LABELW - RIGHT); }\n",
        "function X(t) { return LABELW + (t - t0) * plotW() / (t1 - t0); }\n",
        "function T(x) { return t0 + (x - LABELW) * (t1 - t0) / plotW(); }\n",
        "function rowAt(y) { var lo = 0, hi = rows.length - 1; if (hi < 0 || y < 0 || y >= contentH) return -1;\n",
        "  while (lo < hi) { var m = (lo + hi + 1) >> 1; if (rowY[m] <= y) lo = m; else hi = m - 1; } return lo; }\n",
        "function firstEnd(L, t) { var lo = 0, hi = L.n; while (lo < hi) { var m = (lo + hi) >> 1; if (L.me[m] < t) lo = m + 1; else hi = m; } return lo; }\n",
        "function firstAt(a, n, t) { var lo = 0, hi = n; while (lo < hi) { var m = (lo + hi) >> 1; if (a[m] < t) lo = m + 1; else hi = m; } return lo; }\n",
        "function label(text, y, h, bold) {\n",
        "  ctx.fillStyle = '#333'; ctx.font = (bold ? 'bold 11px' : '11px') + ' system-ui,sans-serif'; ctx.fillText(text, 6, y + h - 4, LABELW - 12);\n",
        "}\n",
        "function drawSpanRow(tr, d, y, h) {\n",
        "  var x0 = LABELW, x1 = W - RIGHT, k = plotW() / (t1 - t0);\n",
        "  if (d === 0) { ctx.fillStyle = '#e2e2e2'; ctx.fillRect(0, y, W, 1); label(tr.label, y, h); }\n",
        "  var xa = Math.max(x0, X(0)), xb = Math.min(x1, X(total));\n",
        "  if (tr.k === 0 && xb > xa) { ctx.fillStyle = IDLE; ctx.fillRect(xa, y + 2, xb - xa, h - 3); }\n",
        "  var L = tr.lv[d], bpx = -1, cov = 0, bk = 0, bw = -1;\n",
        "  function flush() {\n",
        "    if (bpx < 0) return;\n",
        "    ctx.globalAlpha = Math.max(0.45, Math.min(1, cov)); ctx.fillStyle = COL[bk]; ctx.fillRect(bpx, y + 2, 1, h - 3); ctx.globalAlpha = 1;\n",
        "    api.aggregated++; bpx = -1; cov = 0; bw = -1;\n",
        "  }\n",
        "  ctx.font = '10px system-ui,sans-serif';\n",
        "  for (var q = firstEnd(L, t0); q < L.n; q++) {\n",
        "    var j = L.ix[q], s = tr.st[j]; if (s > t1) break;\n",
        "    var a = LABELW + (s - t0) * k, b = a + tr.du[j] * k;\n",
        "    if (b < x0 || a > x1) continue;\n",
        "    if (a < x0) a = x0; if (b > x1) b = x1;\n",
        "    if (b - a >= 1) {\n",
        "      flush(); ctx.fillStyle = COL[tr.kd[j]]; ctx.fillRect(a, y + 2, b - a > 3 ? b - a - 1 : b - a, h - 3); api.drawnSpans++;\n",
        "      if (b - a > 28) { ctx.save(); ctx.beginPath(); ctx.rect(a, y, b - a - 2, h); ctx.clip(); ctx.fillStyle = '#fff'; ctx.fillText(kname(tr.kd[j]), a + 3, y + h - 4); ctx.restore(); }\n",
        "    } else {\n",
        "      var px = Math.floor(a); if (px !== bpx) { flush(); bpx = px; }\n",
        "      cov += b - a; if (b - a > bw) { bw = b - a; bk = tr.kd[j]; }\n",
        "    }\n",
        "  }\n",
        "  flush();\n",
        "  if (d === 0 && tr.it.length) { /* instants: dark ticks with a cap */\n",
        "    ctx.fillStyle = '#222'; var last = -1;\n",
        "    for (q = firstAt(tr.it, tr.it.length, t0); q < tr.it.length && tr.it[q] <= t1; q++) {\n",
        "      var xi = Math.floor(X(tr.it[q])); if (xi === last || xi < x0 || xi > x1) continue; last = xi;\n",
        "      ctx.fillRect(xi, y + 1, 1, h - 2); ctx.fillRect(xi - 2, y + 1, 5, 2);\n",
        "    }\n",
        "  }\n",
        "}\n",
        "function drawCounterRow(tr, y, h) {\n",
        "  var x0 = LABELW, x1 = W - RIGHT, n = tr.ct.length;\n",
        "  ctx.fillStyle = '#e2e2e2'; ctx.fillRect(0, y, W, 1);\n",
        "  label(tr.label, y, h - 12); ctx.fillStyle = '#666'; ctx.font = '10px system-ui,sans-serif';\n",
        "  ctx.fillText('max ' + fmtV(tr.cmax, tr.label), 6, y + h - 4, LABELW - 12);\n",
        "  if (!n) return;\n",
        "  var range = tr.cmax - tr.cmin || 1, base = y + h - 2, sy = (h - 6) / range;\n",
        "  var q = Math.max(0, firstAt(tr.ct, n, t0) - 1);\n",
        "  ctx.fillStyle = 'hsl(10,55%,62%)';\n",
        "  for (; q < n && tr.ct[q] <= t1; q++) {\n",
        "    var a = Math.max(x0, X(tr.ct[q])), b = Math.min(x1, X(q + 1 < n ? tr.ct[q + 1] : total));\n",
        "    if (b < a) continue;\n",
        "    var hv = (tr.cv[q] - tr.cmin) * sy; ctx.fillRect(a, base - hv, Math.max(1, b - a), Math.max(1, hv));\n",
        "  }\n",
        "}\n",
        "function drawProcRow(p, y, h) {\n",
        "  ctx.fillStyle = '#eef2f8'; ctx.fillRect(0, y, W, h);\n",
        "  label((p.open ? '\\u25be ' : '\\u25b8 ') + p.name + ' (pid ' + p.pid + ', ' + p.tracks.length + ' tracks)', y, h, true);\n",
        "}\n",
        "function niceStep(span) { var p = Math.pow(10, Math.floor(Math.log10(span))), f = span / p; return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p; }\n",
        "function draw() {\n",
        "  pending = false; api.draws++;\n",
        "  var dpr = window.devicePixelRatio || 1;\n",
        "  W = sc.clientWidth; H = sc.clientHeight;\n",
        "  if (cv.width !== Math.round(W * dpr) || cv.height !== Math.round(H * dpr)) {\n",
        "    cv.width = Math.round(W * dpr); cv.height = Math.round(H * dpr); cv.style.width = W + 'px'; cv.style.height = H + 'px';\n",
        "  }\n",
        "  spacer.style.height = Math.max(0, contentH - (H - AXISH)) + 'px';\n",
        "  ctx.setTransform(dpr, 0, 0, dpr, 0, 0); ctx.clearRect(0, 0, W, H);\n",
        "  api.drawnRows = 0; api.drawnSpans = 0; api.aggregated = 0;\n",
        "  ctx.save(); ctx.beginPath(); ctx.rect(0, AXISH, W, H - AXISH); ctx.clip();\n",
        "  var off = sc.scrollTop;\n",
        "  for (var r = Math.max(0, rowAt(off)); r < rows.length && AXISH + rowY[r] - off < H; r++) {\n",
        "    var R = rows[r], y = AXISH + rowY[r] - off, h = rowY[r + 1] - rowY[r];\n",
        "    if (R.t === 'p') drawProcRow(R.p, y, h); else if (R.t === 'c') drawCounterRow(R.tr, y, h); else drawSpanRow(R.tr, R.d, y, h);\n",
        "    api.drawnRows++;\n",
        "  }\n",
        "  ctx.restore();\n",
        "  /* the axis: time since the trace's first event */\n",
        "  ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, W, AXISH);\n",
        "  ctx.fillStyle = '#333'; ctx.font = '10px system-ui,sans-serif';\n",
        "  ctx.fillText('time from start', 6, 13);\n",
        "  var w = t1 - t0, step = niceStep(w / Math.max(2, Math.floor(plotW() / 100)));\n",
        "  var u = w >= 2e9 ? [1e9, 's'] : w >= 2e6 ? [1e6, 'ms'] : w >= 2e3 ? [1e3, '\\u00b5s'] : [1, 'ns'];\n",
        "  var dec = Math.max(0, Math.ceil(-Math.log10(step / u[0]) - 1e-9));\n",
        "  for (var t = Math.ceil(t0 / step) * step; t <= t1; t += step) {\n",
        "    var x = X(t); ctx.fillRect(x, AXISH - 5, 1, 5); ctx.fillText((t / u[0]).toFixed(dec) + ' ' + u[1], x + 2, 12);\n",
        "  }\n",
        "  ctx.fillStyle = '#ccc'; ctx.fillRect(0, AXISH - 1, W, 1); ctx.fillRect(LABELW - 1, 0, 1, H);\n",
        "}\n",
        "var MINW = 50; /* the narrowest zoom, ns (redraw, zoom, fit: lm__html_nav_js) */\n",
        "/* ---- hover ---- */\n",
        "function spanAt(tr, d, t, slack) {\n",
        "  var L = tr.lv[d], best = -1, bd = Infinity;\n",
        "  for (var q = firstEnd(L, t - slack); q < L.n; q++) {\n",
        "    var j = L.ix[q], s = tr.st[j], e = s + tr.du[j]; if (s > t + slack) break;\n",
        "    var dist = t < s ? s - t : t > e ? t - e : 0;\n",
        "    if (dist < bd || (dist === bd && dist === 0)) { bd = dist; best = j; }\n",
        "  }\n",
        "  return bd <= slack ? best : -1;\n",
        "}\n",
        "function who(tr) { return (tr.k === 1 ? 'async lane ' + tr.label : 'thread ' + tr.label + ' (tid ' + tr.tid + ')') + ' \\u00b7 ' + tr.p.name + ' (pid ' + tr.p.pid + ')'; }\n",
        "function describe(x, y) {\n",
        "  if (y < AXISH) return null;\n",
        "  var ri = rowAt(y - AXISH + sc.scrollTop); if (ri < 0) return null;\n",
        "  var R = rows[ri], t = T(x), slack = 2 * (t1 - t0) / plotW();\n",
        "  if (R.t === 'p') return 'process ' + R.p.name + ' (pid ' + R.p.pid + '): ' + R.p.tracks.length + ' tracks\\nclick to ' + (R.p.open ? 'fold' : 'unfold');\n",
        "  var tr = R.tr;\n",
        "  if (R.t === 'c') {\n",
        "    if (x < LABELW) return 'counter ' + tr.label + '\\n' + tr.ct.length + ' samples, max ' + fmtV(tr.cmax, tr.label);\n",
        "    var q = firstAt(tr.ct, tr.ct.length, t + 1e-9) - 1;\n",
        "    return q < 0 ? 'counter ' + tr.label + ': no sample yet' : 'counter ' + tr.label + '\\n' + fmtV(tr.cv[q], tr.label) + ' from ' + fmtT(tr.ct[q]);\n",
        "  }\n",
        "  if (x < LABELW) return who(tr) + (tr.k === 0 ? '\\nbusy ' + fmtT(tr.busy) + ' (' + pct(tr.busy / total) + ' of the wall time), idle ' + fmtT(Math.max(0, D.wall - tr.busy)) : '');\n",
        "  if (R.d === 0) for (var qi = firstAt(tr.it, tr.it.length, t - slack); qi < tr.it.length && tr.it[qi] <= t + slack; qi++)\n",
        "    return kname(tr.ik[qi]) + '  (' + (S[K[tr.ik[qi]][1]] || 'no category') + ', instant)' + (tr.ide[qi] ? '\\n' + S[tr.ide[qi]] : '') +\n",
        "      '\\nat ' + fmtT(tr.it[qi]) + (tr.iid[qi] ? ' \\u00b7 id ' + S[tr.iid[qi]] : '') + '\\n' + who(tr);\n",
        "  var j = spanAt(tr, R.d, t, slack);\n",
        "  if (j < 0) return (tr.k === 0 ? 'idle \\u2014 ' : '') + who(tr) + '\\nat ' + fmtT(t);\n",
        "  var txt = kname(tr.kd[j]) + '  (' + (S[K[tr.kd[j]][1]] || 'no category') + ')';\n",
        "  if (tr.de[j]) txt += '\\n' + S[tr.de[j]];\n",
        "  txt += '\\nstart ' + fmtT(tr.st[j]) + ' \\u00b7 duration ' + fmtT(tr.du[j]);\n",
        "  if (tr.k === 0) txt += ' \\u00b7 self ' + fmtT(tr.x[j]);\n",
        "  txt += '\\ndepth ' + tr.dp[j] + (tr.k === 1 ? ' \\u00b7 id ' + S[tr.x[j]] : '') + '\\n' + who(tr);\n",
        "  return txt;\n",
        "}\n",
        "function hover(ev) {\n",
        "  var rc = cv.getBoundingClientRect();\n",
        "  if (drag) { var dx = ev.clientX - drag.x; t0 = drag.t0 - dx * (t1 - t0) / plotW(); t1 = t0 + drag.w; clampPan(); redraw(); }\n",
        "  var txt = describe(ev.clientX - rc.left, ev.clientY - rc.top);\n",
        "  if (!txt) { tip.style.display = 'none'; return; }\n",
        "  tip.textContent = txt; tip.style.display = 'block';\n",
        "  var x = ev.clientX + 14, y = ev.clientY + 14;\n",
        "  if (x + tip.offsetWidth > window.innerWidth) x = Math.max(0, ev.clientX - tip.offsetWidth - 8);\n",
        "  if (y + tip.offsetHeight > window.innerHeight) y = Math.max(0, ev.clientY - tip.offsetHeight - 8);\n",
        "  tip.style.left = x + 'px'; tip.style.top = y + 'px';\n",
        "}\n",
        "cv.addEventListener('mousemove', hover);\n",
        "cv.addEventListener('mouseleave', function () { tip.style.display = 'none'; });\n",
        "cv.addEventListener('mousedown', function (ev) {\n",
        "  var rc = cv.getBoundingClientRect(), y = ev.clientY - rc.top;\n",
        "  if (y >= AXISH) { var ri = rowAt(y - AXISH + sc.scrollTop); if (ri >= 0 && rows[ri].t === 'p') { rows[ri].p.open = !rows[ri].p.open; buildRows(); redraw(); return; } }\n",
        "  drag = {x: ev.clientX, t0: t0, w: t1 - t0};\n",
        "});\n",
        lm__html_nav_marker, /* the shared navigation: lm__html_nav_js */
        "/* for tests and scripts: draw now, zoom to [a, b] ns, and the page position of a visible span */\n",
        "api.draw = draw; api.fit = function () { t0 = 0; t1 = total; draw(); };\n",
        "api.zoom = function (a, b) { t0 = a; t1 = Math.max(a + 50, b); clampPan(); draw(); };\n",
        "api.tracks = TR.length;\n",
        "api.findSpan = function (name) {\n",
        "  var rc = cv.getBoundingClientRect(), k = plotW() / (t1 - t0);\n",
        "  for (var r = Math.max(0, rowAt(sc.scrollTop)); r < rows.length && AXISH + rowY[r] - sc.scrollTop < H; r++) {\n",
        "    var R = rows[r]; if (R.t !== 's') continue;\n",
        "    var tr = R.tr, L = tr.lv[R.d];\n",
        "    for (var q = firstEnd(L, t0); q < L.n; q++) {\n",
        "      var j = L.ix[q]; if (tr.st[j] > t1) break;\n",
        "      var a = Math.max(LABELW, X(tr.st[j])), b = Math.min(W - RIGHT, X(tr.st[j]) + tr.du[j] * k);\n",
        "      if (kname(tr.kd[j]) === name && b - a >= 3)\n",
        "        return {x: rc.left + (a + b) / 2, y: rc.top + AXISH + rowY[r] - sc.scrollTop + (rowY[r + 1] - rowY[r]) / 2, depth: R.d};\n",
        "    }\n",
        "  }\n",
        "  return null;\n",
        "};\n",
        "buildRows(); draw();\n",
        "api.readyMs = performance.now(); api.ready = true;\n",
        "})();\n",
        "</script>\n",
        "</body></html>\n",
        NULL};
    return lines;
}
/* PAGE-END */
