/* Tests for the step tracer (loom/trace.h): a trace starts and stops into a complete
 * Chrome trace-event file (one at a time; stop without start is a no-op), spans nested
 * on several threads at once come out properly nested per thread with each thread
 * named, counters / instants / async spans / device-track spans have their fields,
 * odd names (quotes, backslashes, control bytes, invalid UTF-8, very long) are escaped
 * into valid JSON, an unwritable path and a failed rename give LM_IO_ERROR naming the
 * file, a failed allocation at start leaks nothing, the size cap drops and counts
 * events while the file stays valid, and off, every entry point does nothing: no
 * file, no event, no allocation, lm_trace_begin() == 0. Files are read back with
 * jansson and, when /usr/bin/python3 exists, checked by tests/tools/validate_trace.py.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include "loom/trace.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define OUT LOOM_BINARY_DIR "/test_trace_"

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* The file parsed (NULL and a failure when it is not JSON with a traceEvents array). */
static json_t *load(const char *path) {
    json_error_t e;
    json_t *doc = json_load_file(path, 0, &e);
    LT_CHECK_MSG(doc != NULL, "%s: not JSON: %s (line %d)", path, e.text, e.line);
    LT_CHECK_MSG(doc && json_is_array(json_object_get(doc, "traceEvents")), "%s: no traceEvents array", path);
    return doc;
}

/* tests/tools/validate_trace.py on path (skipped without python3). */
static void validate(const char *path, const char *expect) {
    if (access("/usr/bin/python3", X_OK) != 0) return;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/tools/validate_trace.py '%s'%s%s%s", LOOM_SOURCE_DIR, path,
             expect ? " --expect '" : "", expect ? expect : "", expect ? "'" : "");
    lt_cmd_result r = lt_run_cmd(cmd);
    LT_CHECK_MSG(r.status == 0, "validate_trace.py %s: exit %d\n%s%s", path, r.status, r.out ? r.out : "",
                 r.err ? r.err : "");
    lt_cmd_free(&r);
}

/* The events named name (borrowed references into doc), at most max. */
static int named(json_t *doc, const char *name, json_t **out, int max) {
    json_t *evs = json_object_get(doc, "traceEvents"), *e;
    size_t i;
    int n = 0;
    json_array_foreach(evs, i, e) {
        const char *nm = json_string_value(json_object_get(e, "name"));
        if (nm && !strcmp(nm, name)) {
            if (n < max) out[n] = e;
            n++;
        }
    }
    return n;
}

static const char *ph_of(json_t *e) { return json_string_value(json_object_get(e, "ph")); }

static void test_start_stop_writes_a_complete_file(void) {
    const char *path = OUT "basic.json";
    remove(path);
    LT_CHECK_OK(lm_trace_stop()); /* nothing running: a no-op */
    LT_CHECK(!lm_trace_enabled());
    LT_CHECK_OK(lm_trace_start(path));
    LT_CHECK(lm_trace_enabled());
    LT_CHECK_STATUS(lm_trace_start(OUT "second.json"), LM_INVALID_ARGUMENT);
    LT_CHECK_MSG(strstr(lm_last_error(), "already running") != NULL, "message: %s", lm_last_error());
    LT_CHECK_MSG(!exists(path), "the file appears only when the trace stops");
    int64_t outer = lm_trace_begin();
    LT_CHECK(outer != 0);
    int64_t inner = lm_trace_begin();
    struct timespec pause = {0, 200 * 1000};
    nanosleep(&pause, NULL);
    lm_trace_end(inner, "test", "inner", "detail text");
    lm_trace_end(outer, "test", "outer", NULL);
    lm_trace_end(0, "test", "never", NULL); /* begun while off: nothing */
    LT_CHECK(lm_trace_event_count() >= 4);  /* process + thread names, two spans */
    LT_CHECK_OK(lm_trace_stop());
    LT_CHECK(!lm_trace_enabled());
    LT_CHECK_OK(lm_trace_stop());
    json_t *doc = load(path);
    json_t *in[2], *out[2];
    LT_CHECK(named(doc, "inner", in, 2) == 1 && named(doc, "outer", out, 2) == 1 && named(doc, "never", in + 1, 1) == 0);
    if (doc && named(doc, "inner", in, 1) == 1 && named(doc, "outer", out, 1) == 1) {
        LT_CHECK(!strcmp(ph_of(in[0]), "X"));
        double its = json_number_value(json_object_get(in[0], "ts")), idur = json_number_value(json_object_get(in[0], "dur"));
        double ots = json_number_value(json_object_get(out[0], "ts")), odur = json_number_value(json_object_get(out[0], "dur"));
        LT_CHECK_MSG(idur >= 200 && ots <= its && its + idur <= ots + odur + 1e-3, "inner [%f +%f] outer [%f +%f]", its,
                     idur, ots, odur);
        LT_CHECK(!strcmp(json_string_value(json_object_get(json_object_get(in[0], "args"), "detail")), "detail text"));
        json_t *tn[1];
        LT_CHECK(named(doc, "thread_name", tn, 1) >= 1);
        LT_CHECK(json_integer_value(json_object_get(json_object_get(doc, "otherData"), "dropped_events")) == 0);
    }
    json_decref(doc);
    validate(path, "inner,outer,thread_name,process_name");
}

/* ---- several threads ------------------------------------------------------------------------ */

typedef struct worker {
    int index;
} worker;

static void *work(void *arg) {
    worker *w = arg;
    char name[32];
    snprintf(name, sizeof name, "worker %d", w->index);
    lm_trace_thread_name(name);
    for (int i = 0; i < 200; i++) {
        int64_t a = lm_trace_begin();
        int64_t b = lm_trace_begin();
        int64_t c = lm_trace_begin();
        lm_trace_end(c, "test", "leaf", NULL);
        lm_trace_end(b, "test", "middle", NULL);
        lm_trace_counter("worker counter", (double)(w->index * 1000 + i));
        lm_trace_end(a, "test", "step", NULL);
    }
    return NULL;
}

static void test_nested_spans_from_several_threads(void) {
    const char *path = OUT "threads.json";
    enum { N = 4 };
    LT_CHECK_OK(lm_trace_start(path));
    pthread_t th[N];
    worker w[N];
    for (int i = 0; i < N; i++) {
        w[i].index = i;
        LT_CHECK(pthread_create(&th[i], NULL, work, &w[i]) == 0);
    }
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    LT_CHECK_OK(lm_trace_stop());
    json_t *doc = load(path);
    json_t *one[1];
    LT_CHECK_MSG(named(doc, "leaf", one, 1) == N * 200 && named(doc, "step", one, 1) == N * 200, "leaf %d step %d",
                 named(doc, "leaf", one, 1), named(doc, "step", one, 1));
    LT_CHECK(named(doc, "worker counter", one, 1) == N * 200);
    /* one distinct tid per worker, each named */
    json_t *names[16];
    int nn = named(doc, "thread_name", names, 16), workers = 0;
    for (int i = 0; i < nn && i < 16; i++) {
        const char *v = json_string_value(json_object_get(json_object_get(names[i], "args"), "name"));
        workers += v && !strncmp(v, "worker ", 7);
    }
    LT_CHECK_MSG(workers == N, "%d worker threads named", workers);
    json_decref(doc);
    validate(path, "leaf,middle,step,worker counter");
}

/* ---- the other kinds of event --------------------------------------------------------------- */

static void test_counters_instants_async_and_tracks(void) {
    const char *path = OUT "kinds.json";
    LT_CHECK_OK(lm_trace_start(path));
    lm_trace_counter("bytes", 1234567.0);
    lm_trace_counter("nan is skipped", 0.0 / 0.0);
    lm_trace_instant("test", "mark", "why");
    lm_trace_memory();
    lm_trace_memory(); /* not risen: no second sample */
    int64_t t = lm_trace_now();
    lm_trace_async_begin("request", "request", 7, t, "prompt 3 tokens");
    lm_trace_async_begin("request", "queue", 7, t, NULL);
    lm_trace_async_end("request", "queue", 7, t + 1000);
    lm_trace_async_instant("request", "finish", 7, t + 2000, "length");
    lm_trace_async_end("request", "request", 7, t + 2000);
    lm_trace_span("cuda:0 stream", "kernel", "matmul", "layers.0.q", t, t + 500);
    lm_trace_span("cuda:0 stream", "kernel", "rope", NULL, t + 500, t + 600);
    lm_trace_span(NULL, "test", "host span", NULL, t, t + 10);
    LT_CHECK_OK(lm_trace_stop());
    json_t *doc = load(path);
    json_t *e[4];
    LT_CHECK(named(doc, "bytes", e, 4) == 1 && !strcmp(ph_of(e[0]), "C") &&
             json_number_value(json_object_get(json_object_get(e[0], "args"), "value")) == 1234567.0);
    LT_CHECK(named(doc, "nan is skipped", e, 4) == 0);
    LT_CHECK(named(doc, "mark", e, 4) == 1 && !strcmp(ph_of(e[0]), "i"));
    LT_CHECK(named(doc, "host peak RSS (bytes)", e, 4) == 1 &&
             json_number_value(json_object_get(json_object_get(e[0], "args"), "value")) > 0);
    LT_CHECK(named(doc, "queue", e, 4) == 2 && !strcmp(ph_of(e[0]), "b") && !strcmp(ph_of(e[1]), "e") &&
             json_integer_value(json_object_get(e[0], "id")) == 7);
    LT_CHECK(named(doc, "finish", e, 4) == 1 && !strcmp(ph_of(e[0]), "n"));
    LT_CHECK(named(doc, "matmul", e, 4) == 1 && json_integer_value(json_object_get(e[0], "pid")) == 2);
    json_t *tn[8];
    int n = named(doc, "thread_name", tn, 8), track = 0;
    for (int i = 0; i < n && i < 8; i++)
        track += !strcmp(json_string_value(json_object_get(json_object_get(tn[i], "args"), "name")), "cuda:0 stream");
    LT_CHECK(track == 1);
    json_decref(doc);
    validate(path, "bytes,mark,request,queue,finish,matmul,rope,host span");
}

static void test_odd_names_are_escaped(void) {
    const char *path = OUT "escape.json";
    char longname[3000];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    const char *names[] = {"quote \" and \\ backslash", "new\nline\ttab\r\x01\x1f", "caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80",
                           "bad \xff\xfe utf8 \xc3", "surrogate \xed\xa0\x80 overlong \xc0\xaf", "", longname};
    LT_CHECK_OK(lm_trace_start(path));
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int64_t t0 = lm_trace_begin();
        lm_trace_end(t0, names[i], names[i], names[i]);
    }
    lm_trace_end(lm_trace_begin(), NULL, "null category and detail", NULL);
    LT_CHECK_OK(lm_trace_stop());
    json_t *doc = load(path);
    json_t *e[2];
    for (int i = 0; i < 3; i++) LT_CHECK_MSG(named(doc, names[i], e, 2) == 1, "name %d did not round-trip", i);
    LT_CHECK(named(doc, "bad \xef\xbf\xbd\xef\xbf\xbd utf8 \xef\xbf\xbd", e, 2) == 1);
    LT_CHECK(named(doc, "null category and detail", e, 2) == 1);
    /* the long name is cut, whole events still parse */
    json_t *evs = json_object_get(doc, "traceEvents"), *ev;
    size_t i;
    int cut = 0;
    json_array_foreach(evs, i, ev) {
        const char *nm = json_string_value(json_object_get(ev, "name"));
        if (nm && nm[0] == 'x') cut = strlen(nm) >= 300 && strlen(nm) < 1000;
    }
    LT_CHECK(cut);
    json_decref(doc);
    validate(path, NULL);
}

/* ---- failures ------------------------------------------------------------------------------- */

static void test_io_errors_name_the_file(void) {
    const char *bad = "/nonexistent-loom-dir/trace.json";
    LT_CHECK_STATUS(lm_trace_start(bad), LM_IO_ERROR);
    LT_CHECK_MSG(strstr(lm_last_error(), bad) && strstr(lm_last_error(), "No such file"), "message: %s", lm_last_error());
    LT_CHECK(!lm_trace_enabled());
    LT_CHECK_STATUS(lm_trace_start(NULL), LM_INVALID_ARGUMENT);
    /* the destination is a directory: the rename at stop fails, the partial file goes */
    const char *dir = OUT "dir.json";
    mkdir(dir, 0755);
    LT_CHECK_OK(lm_trace_start(dir));
    lm_trace_instant("test", "lost", NULL);
    LT_CHECK_STATUS(lm_trace_stop(), LM_IO_ERROR);
    LT_CHECK_MSG(strstr(lm_last_error(), dir) && strstr(lm_last_error(), "rename"), "message: %s", lm_last_error());
    LT_CHECK(!lm_trace_enabled());
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", dir, (long)getpid());
    LT_CHECK_MSG(!exists(tmp), "%s was left behind", tmp);
    rmdir(dir);
    /* a failed allocation at start: an error, nothing running, nothing leaked */
    for (int k = 1; k <= 3; k++) {
        lt_alloc_track(k);
        LT_CHECK_STATUS(lm_trace_start(OUT "oom.json"), LM_OUT_OF_MEMORY);
        LT_CHECK(!lm_trace_enabled());
        LT_CHECK(lt_alloc_live() == 0);
        lt_alloc_untrack();
    }
}

static void test_size_cap_drops_and_counts_events(void) {
    const char *path = OUT "cap.json";
    setenv("LOOM_TRACE_MAX_MB", "1", 1);
    LT_CHECK_OK(lm_trace_start(path));
    unsetenv("LOOM_TRACE_MAX_MB");
    for (int i = 0; i < 20000; i++) lm_trace_end(lm_trace_begin(), "test", "filler span with a longish name", "detail");
    int64_t kept = lm_trace_event_count();
    LT_CHECK_OK(lm_trace_stop());
    json_t *doc = load(path);
    json_int_t dropped = json_integer_value(json_object_get(json_object_get(doc, "otherData"), "dropped_events"));
    LT_CHECK_MSG(dropped > 0 && kept + dropped >= 20000, "kept %lld, dropped %lld", (long long)kept, (long long)dropped);
    LT_CHECK((int64_t)json_array_size(json_object_get(doc, "traceEvents")) == kept);
    json_decref(doc);
    struct stat sb;
    LT_CHECK(stat(path, &sb) == 0 && sb.st_size <= (1 << 20) + 4096);
    validate(path, NULL);
}

/* Off: one branch per call, nothing else (no clock read, file, event or allocation). */
static void test_free_when_off(void) {
    const char *path = OUT "off.json";
    remove(path);
    LT_CHECK(!lm_trace_enabled());
    int64_t before = lm_trace_event_count();
    lt_alloc_track(0);
    int64_t nonzero = 0;
    for (int i = 0; i < 1000; i++) {
        int64_t t0 = lm_trace_begin();
        nonzero += t0 != 0;
        lm_trace_end(t0, "test", "off", "detail");
        lm_trace_end(12345, "test", "off with a time", NULL); /* begun in an earlier trace */
        lm_trace_counter("off", i);
        lm_trace_instant("test", "off", NULL);
        lm_trace_async_begin("c", "off", i, 1, NULL);
        lm_trace_async_end("c", "off", i, 2);
        lm_trace_async_instant("c", "off", i, 2, NULL);
        lm_trace_span("track", "c", "off", NULL, 1, 2);
        lm_trace_memory();
    }
    LT_CHECK(nonzero == 0);
    LT_CHECK_MSG(lt_alloc_count() == 0, "%lld allocations while off", (long long)lt_alloc_count());
    lt_alloc_untrack();
    LT_CHECK(lm_trace_event_count() == before); /* the last trace's count, untouched */
    LT_CHECK(!exists(path));
    /* a later trace holds none of it */
    LT_CHECK_OK(lm_trace_start(path));
    LT_CHECK_OK(lm_trace_stop());
    json_t *doc = load(path), *e[1];
    LT_CHECK(named(doc, "off", e, 1) == 0 && named(doc, "off with a time", e, 1) == 0);
    LT_CHECK(json_array_size(json_object_get(doc, "traceEvents")) == 2); /* process and thread names */
    json_decref(doc);
}

int main(void) {
    LT_RUN(test_start_stop_writes_a_complete_file);
    LT_RUN(test_nested_spans_from_several_threads);
    LT_RUN(test_counters_instants_async_and_tracks);
    LT_RUN(test_odd_names_are_escaped);
    LT_RUN(test_io_errors_name_the_file);
    LT_RUN(test_size_cap_drops_and_counts_events);
    LT_RUN(test_free_when_off);
    return lt_finish();
}
