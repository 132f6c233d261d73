/* base/trace.c — the step tracer behind loom/trace.h: Chrome trace-event JSON.
 *
 * Invariants: g_on is 1 exactly while a trace file is open; it is the only thing an
 * instrumentation point reads when tracing is off. An event is formatted into a stack
 * buffer on the calling thread (strings JSON-escaped and cut to fit), then appended
 * under g_mu to one 1 MiB buffer that is written to "<path>.tmp-<pid>" whenever it
 * fills; lm_trace_stop closes the JSON and renames the file to path. Memory is the
 * buffer; the file is capped (LOOM_TRACE_MAX_MB, default 2048) and events past the
 * cap are counted as dropped. A thread's tid is assigned at its first event; its
 * thread_name metadata is written once per trace (t_named holds the trace's session
 * number). An event that races with lm_trace_stop is dropped: the file only takes
 * events while g.f is open, checked under the lock.
 */
#include "internal.h"
#include "loom/trace.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define BUF_BYTES ((size_t)1 << 20) /* the write buffer: one fwrite per MiB of events */
#define EVENT_BYTES 1536            /* one formatted event; strings are cut to fit */
#define STRING_BYTES 400            /* most escaped bytes of one name, category or detail */
#define MAX_TRACKS 32               /* named device tracks per trace */
#define HOST_PID 1
#define DEVICE_PID 2

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int g_on;
static atomic_int g_next_tid;
static atomic_llong g_events;

static struct {
    FILE *f;           /* the temporary file, open while tracing */
    char *path, *tmp;  /* the destination and "<path>.tmp-<pid>" */
    char *buf;         /* [BUF_BYTES] events not yet written */
    size_t len;
    int64_t written;   /* bytes handed to the file, the cap's measure */
    int64_t cap;       /* most bytes of events in the file */
    int64_t dropped;   /* events past the cap or after a write error */
    int err;           /* errno of the first failed write, 0 when none */
    uint64_t session;  /* counts lm_trace_start calls: thread metadata is per session */
    int64_t rss_peak;  /* the last "host peak RSS" counter value */
    char tracks[MAX_TRACKS][64];
    int ntracks;
} g;

static _Thread_local int t_tid;          /* 0 until the thread's first event */
static _Thread_local uint64_t t_named;   /* the session whose file has this thread's name */
static _Thread_local char t_name[64];

int64_t lm_trace_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int lm_trace_enabled(void) { return atomic_load_explicit(&g_on, memory_order_relaxed); }

int64_t lm_trace_event_count(void) { return atomic_load(&g_events); }

/* ---- formatting one event ----------------------------------------------------------------- */

typedef struct ev {
    char b[EVENT_BYTES];
    size_t n;
} ev;

static void put(ev *e, const char *s) {
    size_t k = strlen(s);
    if (e->n + k >= sizeof e->b) k = sizeof e->b - 1 - e->n; /* cannot happen: strings are bounded */
    memcpy(e->b + e->n, s, k);
    e->n += k;
    e->b[e->n] = '\0';
}

static void putf(ev *e, const char *fmt, ...) LM__PRINTF(2, 3);
static void putf(ev *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(e->b + e->n, sizeof e->b - e->n, fmt, ap);
    va_end(ap);
    if (k > 0) e->n = LM_MIN(e->n + (size_t)k, sizeof e->b - 1);
}

/* Length of the valid UTF-8 sequence at s (1-4), or 0 when it is not one. */
static int utf8_len(const unsigned char *s) {
    unsigned c = s[0];
    int n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (n == 2 && c < 0xc2) return 0; /* overlong */
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (n == 3 && ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0))) return 0; /* overlong, surrogate */
    if (n == 4 && ((c == 0xf0 && s[1] < 0x90) || c > 0xf4 || (c == 0xf4 && s[1] >= 0x90))) return 0;
    return n;
}

/* s as a JSON string literal, at most STRING_BYTES escaped bytes (cut between
 * characters); NULL is "". */
static void put_str(ev *e, const char *s) {
    char *o = e->b + e->n;
    size_t n = 0;
    o[n++] = '"';
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    while (*p && n < STRING_BYTES) {
        unsigned c = *p;
        int len = utf8_len(p);
        if (c == '"' || c == '\\') o[n++] = '\\', o[n++] = (char)c, p++;
        else if (c == '\n') o[n++] = '\\', o[n++] = 'n', p++;
        else if (c == '\t') o[n++] = '\\', o[n++] = 't', p++;
        else if (c < 0x20) n += (size_t)snprintf(o + n, 8, "\\u%04x", c), p++;
        else if (len == 0) memcpy(o + n, "\\ufffd", 6), n += 6, p++;
        else memcpy(o + n, p, (size_t)len), n += (size_t)len, p += len;
    }
    o[n++] = '"';
    o[n] = '\0';
    e->n += n;
}

/* v in decimal (events are formatted by hand: printf was half of a span's cost). */
static void put_int(ev *e, int64_t v) {
    char d[24];
    int n = 0;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do d[n++] = (char)('0' + u % 10), u /= 10; while (u);
    if (v < 0) e->b[e->n++] = '-';
    while (n) e->b[e->n++] = d[--n];
    e->b[e->n] = '\0';
}

/* Microseconds with nanosecond digits, exactly: 1234567 ns -> "1234.567". */
static void put_us(ev *e, int64_t ns) {
    if (ns < 0) put(e, "-"), ns = -ns;
    put_int(e, ns / 1000);
    int64_t f = ns % 1000;
    e->b[e->n++] = '.';
    e->b[e->n++] = (char)('0' + f / 100);
    e->b[e->n++] = (char)('0' + f / 10 % 10);
    e->b[e->n++] = (char)('0' + f % 10);
    e->b[e->n] = '\0';
}

/* The common head: {"name":..,"cat":..,"ph":"X","pid":P,"tid":T */
static void head(ev *e, const char *ph, const char *cat, const char *name, int pid, int tid) {
    put(e, "{\"name\":");
    put_str(e, name);
    put(e, ",\"cat\":");
    put_str(e, cat ? cat : "loom");
    put(e, ",\"ph\":\"");
    put(e, ph);
    put(e, "\",\"pid\":");
    put_int(e, pid);
    put(e, ",\"tid\":");
    put_int(e, tid);
}

static void put_detail(ev *e, const char *detail) {
    if (!detail) return;
    put(e, ",\"args\":{\"detail\":");
    put_str(e, detail);
    put(e, "}");
}

/* ---- the file ------------------------------------------------------------------------------ */

static void flush_locked(void) {
    if (g.len && !g.err && fwrite(g.buf, 1, g.len, g.f) != g.len) g.err = errno ? errno : EIO;
    g.len = 0;
}

/* Appends one event (with its separator) under g_mu. */
static void append_locked(const char *s, size_t n) {
    if (g.err || g.written + (int64_t)n + 2 > g.cap) {
        g.dropped++;
        return;
    }
    if (g.len + n + 2 > BUF_BYTES) flush_locked();
    int first = atomic_load(&g_events) == 0;
    if (!first) g.buf[g.len++] = ',', g.buf[g.len++] = '\n';
    memcpy(g.buf + g.len, s, n);
    g.len += n;
    g.written += (int64_t)n + 2;
    atomic_fetch_add(&g_events, 1);
}

static void metadata_locked(const char *what, int pid, int tid, const char *name) {
    ev e = {{0}, 0};
    putf(&e, "{\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":", what, pid, tid);
    put_str(&e, name);
    put(&e, "}}");
    append_locked(e.b, e.n);
}

static int my_tid(void) {
    if (!t_tid) t_tid = atomic_fetch_add(&g_next_tid, 1) + 1;
    return t_tid;
}

/* Names the calling thread in this trace's file once (under g_mu). */
static void name_thread_locked(void) {
    if (t_named == g.session) return;
    t_named = g.session;
    char name[64];
    if (t_name[0]) snprintf(name, sizeof name, "%s", t_name);
    else snprintf(name, sizeof name, "thread %d", t_tid);
    metadata_locked("thread_name", HOST_PID, t_tid, name);
}

/* Writes a host event of the calling thread. */
static void emit_host(const ev *e) {
    pthread_mutex_lock(&g_mu);
    if (g.f) {
        name_thread_locked();
        append_locked(e->b, e->n);
    }
    pthread_mutex_unlock(&g_mu);
}

lm_status lm_trace_start(const char *path) {
    if (!path || !path[0]) return lm__error(LM_INVALID_ARGUMENT, "lm_trace_start: no file name");
    pthread_mutex_lock(&g_mu);
    lm_status st = LM_OK;
    if (g.f) {
        st = lm__error(LM_INVALID_ARGUMENT, "lm_trace_start: a trace into '%s' is already running", g.path);
        goto out;
    }
    size_t n = strlen(path) + 32;
    g.path = lm__strdup(path);
    g.tmp = lm__alloc(n, 1);
    g.buf = lm__alloc(BUF_BYTES, 64);
    if (!g.path || !g.tmp || !g.buf) {
        st = LM_OUT_OF_MEMORY;
        goto fail;
    }
    snprintf(g.tmp, n, "%s.tmp-%ld", path, (long)getpid());
    if (!(g.f = fopen(g.tmp, "w"))) {
        st = lm__error(LM_IO_ERROR, "trace file '%s': cannot create '%s': %s", path, g.tmp, strerror(errno));
        goto fail;
    }
    const char *mb = getenv("LOOM_TRACE_MAX_MB");
    g.cap = mb && atoll(mb) > 0 ? atoll(mb) << 20 : (int64_t)2048 << 20;
    g.len = 0, g.written = 0, g.dropped = 0, g.err = 0, g.rss_peak = 0, g.ntracks = 0;
    g.session++;
    atomic_store(&g_events, 0);
    if (fputs("{\"traceEvents\":[\n", g.f) == EOF) g.err = errno ? errno : EIO;
    if (!t_name[0]) snprintf(t_name, sizeof t_name, "main");
    my_tid();
    metadata_locked("process_name", HOST_PID, 0, "loom");
    name_thread_locked();
    atomic_store(&g_on, 1);
    goto out;
fail:
    lm__free(g.path);
    lm__free(g.tmp);
    lm__free(g.buf);
    g.path = g.tmp = g.buf = NULL;
out:
    pthread_mutex_unlock(&g_mu);
    return st;
}

lm_status lm_trace_stop(void) {
    pthread_mutex_lock(&g_mu);
    if (!g.f) {
        pthread_mutex_unlock(&g_mu);
        return LM_OK;
    }
    atomic_store(&g_on, 0);
    flush_locked();
    int64_t events = atomic_load(&g_events);
    if (!g.err && fprintf(g.f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"loom %s\",\"events\":%lld,"
                               "\"dropped_events\":%lld}}\n",
                          lm_version(), (long long)events, (long long)g.dropped) < 0)
        g.err = errno ? errno : EIO;
    if (!g.err && fflush(g.f) != 0) g.err = errno ? errno : EIO;
    if (fclose(g.f) != 0 && !g.err) g.err = errno ? errno : EIO;
    g.f = NULL;
    lm_status st = LM_OK;
    if (g.err) {
        st = lm__error(LM_IO_ERROR, "trace file '%s': writing '%s' failed after %lld events: %s", g.path, g.tmp,
                       (long long)events, strerror(g.err));
        remove(g.tmp);
    } else if (rename(g.tmp, g.path) != 0) {
        st = lm__error(LM_IO_ERROR, "trace file '%s': cannot rename '%s' to it: %s", g.path, g.tmp, strerror(errno));
        remove(g.tmp);
    } else if (g.dropped) {
        lm__log(LM_LOG_WARN, "trace file '%s': %lld events dropped past the %lld MiB cap (LOOM_TRACE_MAX_MB)", g.path,
                (long long)g.dropped, (long long)(g.cap >> 20));
    }
    lm__free(g.path);
    lm__free(g.tmp);
    lm__free(g.buf);
    g.path = g.tmp = g.buf = NULL;
    pthread_mutex_unlock(&g_mu);
    return st;
}

/* ---- events ------------------------------------------------------------------------------- */

int64_t lm_trace_begin(void) { return lm_trace_enabled() ? lm_trace_now() : 0; }

static void span_host(const char *cat, const char *name, const char *detail, int64_t t0, int64_t t1) {
    ev e = {{0}, 0};
    head(&e, "X", cat, name, HOST_PID, my_tid());
    put(&e, ",\"ts\":");
    put_us(&e, t0);
    put(&e, ",\"dur\":");
    put_us(&e, t1 > t0 ? t1 - t0 : 0);
    put_detail(&e, detail);
    put(&e, "}");
    emit_host(&e);
}

void lm_trace_end(int64_t t0, const char *cat, const char *name, const char *detail) {
    if (!t0 || !lm_trace_enabled()) return;
    span_host(cat, name, detail, t0, lm_trace_now());
}

/* The tid of a device track in this trace, naming it at first use; 0 when the table
 * is full (under g_mu). */
static int track_tid_locked(const char *track) {
    int i = 0;
    while (i < g.ntracks && strncmp(g.tracks[i], track, sizeof g.tracks[i] - 1) != 0) i++;
    if (i == g.ntracks) {
        if (i == MAX_TRACKS) return 0;
        snprintf(g.tracks[i], sizeof g.tracks[i], "%s", track);
        g.ntracks++;
        if (i == 0) metadata_locked("process_name", DEVICE_PID, 0, "loom devices");
        metadata_locked("thread_name", DEVICE_PID, i + 1, g.tracks[i]);
    }
    return i + 1;
}

void lm_trace_span(const char *track, const char *cat, const char *name, const char *detail, int64_t t0, int64_t t1) {
    if (!lm_trace_enabled()) return;
    if (!track) {
        span_host(cat, name, detail, t0, t1);
        return;
    }
    ev e = {{0}, 0};
    pthread_mutex_lock(&g_mu);
    int tid = g.f ? track_tid_locked(track) : 0;
    if (tid) {
        head(&e, "X", cat, name, DEVICE_PID, tid);
        put(&e, ",\"ts\":");
        put_us(&e, t0);
        put(&e, ",\"dur\":");
        put_us(&e, t1 > t0 ? t1 - t0 : 0);
        put_detail(&e, detail);
        put(&e, "}");
        append_locked(e.b, e.n);
    } else if (g.f) {
        g.dropped++;
    }
    pthread_mutex_unlock(&g_mu);
}

void lm_trace_instant(const char *cat, const char *name, const char *detail) {
    if (!lm_trace_enabled()) return;
    ev e = {{0}, 0};
    head(&e, "i", cat, name, HOST_PID, my_tid());
    put(&e, ",\"s\":\"t\",\"ts\":");
    put_us(&e, lm_trace_now());
    put_detail(&e, detail);
    put(&e, "}");
    emit_host(&e);
}

void lm_trace_counter(const char *name, double value) {
    if (!lm_trace_enabled() || !isfinite(value)) return;
    ev e = {{0}, 0};
    head(&e, "C", "memory", name, HOST_PID, my_tid());
    put(&e, ",\"ts\":");
    put_us(&e, lm_trace_now());
    putf(&e, ",\"args\":{\"value\":%.17g}}", value);
    emit_host(&e);
}

void lm_trace_memory(void) {
    if (!lm_trace_enabled()) return;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return;
    int64_t bytes = (int64_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
    pthread_mutex_lock(&g_mu);
    int rose = bytes > g.rss_peak;
    if (rose) g.rss_peak = bytes;
    pthread_mutex_unlock(&g_mu);
    if (rose) lm_trace_counter("host peak RSS (bytes)", (double)bytes);
}

static void async_event(const char *ph, const char *cat, const char *name, int64_t id, int64_t t, const char *detail) {
    if (!lm_trace_enabled()) return;
    ev e = {{0}, 0};
    head(&e, ph, cat, name, HOST_PID, my_tid());
    put(&e, ",\"id\":");
    put_int(&e, id);
    put(&e, ",\"ts\":");
    put_us(&e, t);
    put_detail(&e, detail);
    put(&e, "}");
    emit_host(&e);
}

void lm_trace_async_begin(const char *cat, const char *name, int64_t id, int64_t t, const char *detail) {
    async_event("b", cat, name, id, t, detail);
}

void lm_trace_async_end(const char *cat, const char *name, int64_t id, int64_t t) {
    async_event("e", cat, name, id, t, NULL);
}

void lm_trace_async_instant(const char *cat, const char *name, int64_t id, int64_t t, const char *detail) {
    async_event("n", cat, name, id, t, detail);
}

void lm_trace_thread_name(const char *name) {
    snprintf(t_name, sizeof t_name, "%s", name ? name : "");
    t_named = 0; /* written again at the thread's next event */
}
