/* Tests for the trace viewer page (lm_trace_html, loom/trace.h): a real trace written by
 * lm_trace_* from four threads (nested spans, instants), async requests and counters
 * comes out as a self-contained page (no network reference, no external script) whose
 * embedded JSON carries every thread by name, every span, instant and counter sample,
 * lanes for the overlapping requests, and self times that add up (per thread: the sum
 * of self times == the sum of the top-level durations == the busy time). A handcrafted
 * trace checks exact self times, the summary's order, B/E matching, greedy lane reuse
 * and names from metadata; a bare array of events gives the same page data. Malformed
 * input gives LM_PARSE_ERROR naming the source and the event index; names that could
 * close the <script> element are escaped; every failing allocation is refused cleanly.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "html_page_util.h"

#include "loom/trace.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define OUT LOOM_BINARY_DIR "/test_trace_view_"

static void check_trace_page(const char *html) {
    check_self_contained(html);
    LT_CHECK(strstr(html, "window.loomTrace") != NULL);
}

static int64_t ival(const json_t *a, size_t i) { return (int64_t)json_number_value(json_array_get(a, i)); }

static const char *string_at(const json_t *d, int64_t i) {
    return json_string_value(json_array_get(json_object_get(d, "strings"), (size_t)i));
}

/* Kind k's name. */
static const char *kind_name(const json_t *d, int64_t k) {
    return string_at(d, ival(json_array_get(json_object_get(d, "kinds"), (size_t)k), 0));
}

/* The first track of kind tk named name, or NULL. */
static json_t *track_named(const json_t *d, int tk, const char *name) {
    json_t *tracks = json_object_get(d, "tracks"), *t;
    size_t i;
    json_array_foreach(tracks, i, t) {
        const char *n = string_at(d, json_integer_value(json_object_get(t, "n")));
        if (json_integer_value(json_object_get(t, "k")) == tk && n && !strcmp(n, name)) return t;
    }
    return NULL;
}

typedef struct totals {
    int64_t spans, instants, samples, lanes, threads;
} totals;

/* Checks every thread track's invariants (sorted starts, depths below "depth", self
 * times within durations and adding up to the top-level durations and the busy time)
 * and counts what the tracks hold. */
static totals check_tracks(const json_t *d) {
    totals n = {0, 0, 0, 0, 0};
    json_t *tracks = json_object_get(d, "tracks"), *t;
    size_t i;
    json_array_foreach(tracks, i, t) {
        int64_t k = json_integer_value(json_object_get(t, "k")), depth = json_integer_value(json_object_get(t, "depth"));
        const json_t *s = json_object_get(t, "s");
        size_t ns = json_array_size(s) / 6;
        LT_CHECK(json_array_size(s) % 6 == 0 && json_array_size(json_object_get(t, "i")) % 4 == 0);
        n.spans += (int64_t)ns;
        n.instants += (int64_t)json_array_size(json_object_get(t, "i")) / 4;
        n.samples += (int64_t)json_array_size(json_object_get(t, "c")) / 2;
        n.lanes += k == 1, n.threads += k == 0;
        int64_t start = 0, self_sum = 0, top_sum = 0;
        for (size_t j = 0; j < ns; j++) {
            int64_t ds = ival(s, 6 * j), dur = ival(s, 6 * j + 1), dp = ival(s, 6 * j + 4), x = ival(s, 6 * j + 5);
            start += ds;
            LT_CHECK_MSG(j == 0 || ds >= 0, "track %zu: span %zu starts before its predecessor", i, j);
            LT_CHECK_MSG(dur >= 0 && dp >= 0 && dp < depth, "track %zu span %zu: dur %lld depth %lld of %lld", i, j,
                         (long long)dur, (long long)dp, (long long)depth);
            if (k == 0) {
                LT_CHECK_MSG(x >= 0 && x <= dur, "track %zu span %zu: self %lld of %lld", i, j, (long long)x,
                             (long long)dur);
                self_sum += x;
                if (dp == 0) top_sum += dur;
            }
        }
        if (k == 0) {
            LT_CHECK_MSG(self_sum == top_sum, "track %zu: self times add up to %lld ns, top-level spans to %lld", i,
                         (long long)self_sum, (long long)top_sum);
            LT_CHECK_MSG(json_integer_value(json_object_get(t, "busy")) == top_sum, "track %zu: busy %lld != %lld", i,
                         (long long)json_integer_value(json_object_get(t, "busy")), (long long)top_sum);
        }
    }
    return n;
}

/* ---- a real trace --------------------------------------------------------------------------- */

static void spin_ns(int64_t ns) {
    int64_t t = lm_trace_now();
    while (lm_trace_now() - t < ns) {
    }
}

static void *worker(void *arg) {
    char name[32];
    snprintf(name, sizeof name, "worker %d", (int)(intptr_t)arg);
    if ((intptr_t)arg > 0) lm_trace_thread_name(name); /* 0: the main thread, keeping its name */
    for (int i = 0; i < 40; i++) {
        int64_t step = lm_trace_begin();
        for (int j = 0; j < 3; j++) {
            int64_t op = lm_trace_begin();
            spin_ns(2000);
            if (j == 1) {
                int64_t k = lm_trace_begin();
                spin_ns(1000);
                lm_trace_end(k, "kernel", "inner", NULL);
            }
            lm_trace_end(op, "op", j == 0 ? "matmul" : j == 1 ? "attention" : "add", "layers.0");
        }
        if (i % 10 == 0) lm_trace_instant("phase", "tick", "every tenth step");
        lm_trace_end(step, "generate", "decode step", NULL);
    }
    return NULL;
}

static void test_real_trace_from_threads(void) {
    const char *path = OUT "real.json";
    LT_CHECK_OK(lm_trace_start(path));
    pthread_t th[3];
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, worker, (void *)(intptr_t)(i + 1));
    worker((void *)(intptr_t)0);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    int64_t t = lm_trace_now();
    /* requests 1 and 2 overlap (two lanes); 3 starts after 1 ended (reuses lane one) */
    lm_trace_async_begin("request", "request", 1, t, "prompt 5");
    lm_trace_async_begin("request", "queue", 1, t, NULL);
    lm_trace_async_end("request", "queue", 1, t + 1000);
    lm_trace_async_begin("request", "request", 2, t + 500, NULL);
    lm_trace_async_instant("request", "finish", 1, t + 3000, "length");
    lm_trace_async_end("request", "request", 1, t + 3000);
    lm_trace_async_end("request", "request", 2, t + 4000);
    lm_trace_async_begin("request", "request", 3, t + 3500, NULL);
    lm_trace_async_end("request", "request", 3, t + 5000);
    for (int i = 0; i < 5; i++) lm_trace_counter("test counter", i * 10.0);
    LT_CHECK_OK(lm_trace_stop());

    char *text = NULL;
    size_t len = 0;
    LT_CHECK_OK(lm_file_read_all(path, &text, &len));
    if (!text) return;
    json_t *in = json_loadb(text, len, 0, NULL);
    int64_t want_spans = 0, want_inst = 0, want_samples = 0, e_count = 0;
    json_t *ev;
    size_t i;
    json_array_foreach(json_object_get(in, "traceEvents"), i, ev) {
        const char *ph = json_string_value(json_object_get(ev, "ph"));
        want_spans += !strcmp(ph, "X") || !strcmp(ph, "b");
        want_inst += !strcmp(ph, "i") || !strcmp(ph, "n");
        want_samples += !strcmp(ph, "C");
        e_count++;
    }
    json_decref(in);
    char *html = NULL;
    LT_CHECK_OK(lm_trace_html(text, len, path, &html));
    lm_free(text);
    if (!html) return;
    check_trace_page(html);
    json_t *d = page_data(html, "tv-data");
    if (d) {
        totals n = check_tracks(d);
        LT_CHECK_MSG(n.spans == want_spans && json_integer_value(json_object_get(d, "spans")) == want_spans,
                     "%lld spans in the page, %lld in the trace", (long long)n.spans, (long long)want_spans);
        LT_CHECK_MSG(n.instants == want_inst, "%lld instants, want %lld", (long long)n.instants, (long long)want_inst);
        LT_CHECK_MSG(n.samples == want_samples && want_samples >= 5, "%lld samples, want %lld", (long long)n.samples,
                     (long long)want_samples);
        LT_CHECK(json_integer_value(json_object_get(d, "events")) == e_count);
        LT_CHECK_MSG(n.threads == 4 && n.lanes == 2, "%lld threads, %lld lanes", (long long)n.threads,
                     (long long)n.lanes);
        LT_CHECK(track_named(d, 0, "main") != NULL);
        LT_CHECK(track_named(d, 0, "worker 1") && track_named(d, 0, "worker 2") && track_named(d, 0, "worker 3"));
        LT_CHECK(track_named(d, 2, "test counter") != NULL);
        /* every thread made 40 steps of 3 ops and 40 inner kernel spans: depths 0..2 */
        json_t *w = track_named(d, 0, "worker 2");
        LT_CHECK(w && json_integer_value(json_object_get(w, "depth")) == 3);
        LT_CHECK(w && json_array_size(json_object_get(w, "s")) == 6 * (40 + 120 + 40));
        /* the top of the summary: the heaviest kind by self time has the largest self */
        const json_t *top = json_object_get(d, "top"), *kinds = json_object_get(d, "kinds");
        LT_CHECK(json_array_size(top) >= 5);
        for (size_t k = 1; k < json_array_size(top); k++)
            LT_CHECK(ival(json_array_get(kinds, (size_t)ival(top, k - 1)), 2) >=
                     ival(json_array_get(kinds, (size_t)ival(top, k)), 2));
        json_decref(d);
    }
    lm_free(html);
    remove(path);
}

/* ---- a handcrafted trace -------------------------------------------------------------------- */

/* Thread 1 (X): step [0,100] holding a [10,40] (holding c [15,25]) and b [50,90];
 * thread 2 (B/E): b [0,60] with an instant at 30. Async ids 7 and 8 overlap, id 9
 * starts after 7 ended. Self times: b 40+60 = 100, step 30, a 20, c 10 (us). */
#define EVENTS                                                                                                    \
    "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":5,\"tid\":0,\"args\":{\"name\":\"proc A\"}},"               \
    "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":5,\"tid\":1,\"args\":{\"name\":\"T one\"}},"                  \
    "{\"name\":\"c\",\"cat\":\"op\",\"ph\":\"X\",\"pid\":5,\"tid\":1,\"ts\":1015,\"dur\":10},"                    \
    "{\"name\":\"a\",\"cat\":\"op\",\"ph\":\"X\",\"pid\":5,\"tid\":1,\"ts\":1010,\"dur\":30,\"args\":{\"detail\":\"L0\"}}," \
    "{\"name\":\"b\",\"cat\":\"op\",\"ph\":\"X\",\"pid\":5,\"tid\":1,\"ts\":1050,\"dur\":40},"                    \
    "{\"name\":\"step\",\"cat\":\"phase\",\"ph\":\"X\",\"pid\":5,\"tid\":1,\"ts\":1000,\"dur\":100},"             \
    "{\"name\":\"b\",\"cat\":\"op\",\"ph\":\"B\",\"pid\":5,\"tid\":2,\"ts\":1000},"                               \
    "{\"name\":\"mark\",\"cat\":\"phase\",\"ph\":\"i\",\"s\":\"t\",\"pid\":5,\"tid\":2,\"ts\":1030},"             \
    "{\"ph\":\"E\",\"pid\":5,\"tid\":2,\"ts\":1060},"                                                             \
    "{\"name\":\"req\",\"cat\":\"request\",\"ph\":\"b\",\"pid\":5,\"tid\":1,\"id\":7,\"ts\":1000},"               \
    "{\"name\":\"req\",\"cat\":\"request\",\"ph\":\"b\",\"pid\":5,\"tid\":1,\"id\":8,\"ts\":1020},"               \
    "{\"name\":\"req\",\"cat\":\"request\",\"ph\":\"e\",\"pid\":5,\"tid\":1,\"id\":7,\"ts\":1040},"               \
    "{\"name\":\"req\",\"cat\":\"request\",\"ph\":\"b\",\"pid\":5,\"tid\":1,\"id\":\"9\",\"ts\":1040},"           \
    "{\"name\":\"req\",\"cat\":\"request\",\"ph\":\"e\",\"pid\":5,\"tid\":1,\"id\":\"9\",\"ts\":1070},"           \
    "{\"name\":\"req\",\"cat\":\"request\",\"ph\":\"e\",\"pid\":5,\"tid\":1,\"id\":8,\"ts\":1080},"               \
    "{\"name\":\"mem\",\"ph\":\"C\",\"pid\":5,\"tid\":1,\"ts\":1000,\"args\":{\"value\":3}},"                     \
    "{\"name\":\"mem\",\"ph\":\"C\",\"pid\":5,\"tid\":1,\"ts\":1050,\"args\":{\"value\":7.5}},"                   \
    "{\"name\":\"flow\",\"ph\":\"s\",\"pid\":5,\"tid\":1,\"ts\":1000,\"id\":1}"

static const char k_object[] = "{\"traceEvents\":[" EVENTS "],\"otherData\":{\"producer\":\"hand\"}}";
static const char k_array[] = "[" EVENTS "]";

/* The kind index of (name, cat) in d, -1 when absent. */
static int64_t kind_index(const json_t *d, const char *name, const char *cat) {
    const json_t *kinds = json_object_get(d, "kinds");
    for (size_t k = 0; k < json_array_size(kinds); k++) {
        const json_t *e = json_array_get(kinds, k);
        if (!strcmp(string_at(d, ival(e, 0)), name) && !strcmp(string_at(d, ival(e, 1)), cat)) return (int64_t)k;
    }
    return -1;
}

static void check_handcrafted(const char *html) {
    check_trace_page(html);
    json_t *d = page_data(html, "tv-data");
    if (!d) return;
    totals n = check_tracks(d);
    LT_CHECK(n.threads == 2 && n.lanes == 2 && n.spans == 4 + 1 + 3 && n.instants == 1 && n.samples == 2);
    LT_CHECK(json_integer_value(json_object_get(d, "wall")) == 100000); /* ns: the first event to the last end */
    LT_CHECK(json_integer_value(json_object_get(d, "skipped")) == 1);   /* the flow event */
    LT_CHECK(json_integer_value(json_object_get(d, "events")) == 18);
    const json_t *procs = json_object_get(d, "procs");
    LT_CHECK(json_array_size(procs) == 1 && ival(json_array_get(procs, 0), 0) == 5 &&
             !strcmp(string_at(d, ival(json_array_get(procs, 0), 1)), "proc A"));
    json_t *one = track_named(d, 0, "T one");
    LT_CHECK(one && json_integer_value(json_object_get(one, "depth")) == 3 &&
             json_integer_value(json_object_get(one, "busy")) == 100000);
    /* the summary: b (two spans, 100 us of self time), step 30, a 20, c 10 */
    const json_t *top = json_object_get(d, "top"), *kinds = json_object_get(d, "kinds");
    const char *order[] = {"b", "step", "a", "c"};
    const int64_t self[] = {100000, 30000, 20000, 10000}, count[] = {2, 1, 1, 1};
    LT_CHECK(json_array_size(top) == 4);
    for (int k = 0; k < 4 && (size_t)k < json_array_size(top); k++) {
        int64_t ki = ival(top, (size_t)k);
        const json_t *e = json_array_get(kinds, (size_t)ki);
        LT_CHECK_MSG(!strcmp(kind_name(d, ki), order[k]) && ival(e, 2) == self[k] && ival(e, 4) == count[k],
                     "top %d: %s self %lld count %lld", k, kind_name(d, ki), (long long)ival(e, 2), (long long)ival(e, 4));
    }
    int64_t a = kind_index(d, "a", "op"), req = kind_index(d, "req", "request");
    LT_CHECK(a >= 0 && ival(json_array_get(kinds, (size_t)a), 3) == 30000); /* total incl. children */
    LT_CHECK(req >= 0 && ival(json_array_get(kinds, (size_t)req), 5) == 3 &&
             ival(json_array_get(kinds, (size_t)req), 6) == 40000 + 60000 + 30000);
    /* lanes: 7 then 9 in the first, 8 in the second */
    json_t *tracks = json_object_get(d, "tracks"), *t;
    size_t i;
    json_array_foreach(tracks, i, t) {
        if (json_integer_value(json_object_get(t, "k")) != 1) continue;
        int64_t lane = json_integer_value(json_object_get(t, "tid"));
        const json_t *s = json_object_get(t, "s");
        LT_CHECK(json_array_size(s) == (lane == 0 ? 12u : 6u));
        LT_CHECK(!strcmp(string_at(d, ival(s, 5)), lane == 0 ? "7" : "8"));
        if (lane == 0 && json_array_size(s) == 12) LT_CHECK(!strcmp(string_at(d, ival(s, 11)), "9"));
    }
    /* the detail of "a" */
    const json_t *s1 = json_object_get(one, "s");
    LT_CHECK(json_array_size(s1) >= 12 && !strcmp(string_at(d, ival(s1, 9)), "L0"));
    json_decref(d);
}

static void test_handcrafted_summary_and_lanes(void) {
    char *html = NULL, *html2 = NULL;
    LT_CHECK_OK(lm_trace_html(k_object, strlen(k_object), "hand.json", &html));
    if (html) check_handcrafted(html);
    LT_CHECK(html && strstr(html, "\"producer\":") != NULL);
    /* a bare array: the same data (no producer) */
    LT_CHECK_OK(lm_trace_html(k_array, strlen(k_array), "hand.json", &html2));
    if (html2) check_handcrafted(html2);
    lm_free(html);
    lm_free(html2);
    /* empty traces are fine */
    LT_CHECK_OK(lm_trace_html("[]", 2, NULL, &html));
    lm_free(html);
    LT_CHECK_OK(lm_trace_html("{\"traceEvents\":[]}", 18, "empty.json", &html));
    json_t *d = html ? page_data(html, "tv-data") : NULL;
    LT_CHECK(d && json_integer_value(json_object_get(d, "wall")) == 0 && json_array_size(json_object_get(d, "tracks")) == 0);
    json_decref(d);
    lm_free(html);
}

static void test_names_are_escaped(void) {
    const char *in = "[{\"name\":\"</script><script>alert(1)</script>\",\"cat\":\"x&y\",\"ph\":\"X\",\"ts\":0,\"dur\":1,"
                     "\"args\":{\"n\":1,\"s\":\"caf\\u00e9 \\\"q\\\"\"}}]";
    char *html = NULL;
    LT_CHECK_OK(lm_trace_html(in, strlen(in), "esc<1>.json", &html));
    if (!html) return;
    LT_CHECK(!strstr(html, "alert(1)</script>") && !strstr(html, "esc<1>"));
    json_t *d = page_data(html, "tv-data");
    if (d) {
        LT_CHECK(!strcmp(kind_name(d, 0), "</script><script>alert(1)</script>"));
        LT_CHECK(!strcmp(json_string_value(json_object_get(d, "source")), "esc<1>.json"));
        const json_t *s = json_object_get(json_array_get(json_object_get(d, "tracks"), 0), "s");
        const char *detail = string_at(d, ival(s, 3)); /* more than one argument: the arguments as JSON */
        LT_CHECK_MSG(detail && strstr(detail, "\"n\":1") && strstr(detail, "caf\xc3\xa9"), "detail %s", detail);
        json_decref(d);
    }
    lm_free(html);
}

static void test_malformed_input_is_refused(void) {
    static const struct {
        const char *json, *says;
    } bad[] = {
        {"42", "not an object or an array"},
        {"{\"foo\":1}", "no \"traceEvents\" array"},
        {"{\"traceEvents\":[", "not JSON"},
        {"[1]", "event 0: not an object"},
        {"[{\"ph\":\"X\",\"ts\":1,\"dur\":1},{\"ts\":1}]", "event 1: no \"ph\""},
        {"[{\"ph\":\"XX\",\"ts\":1}]", "event 0: \"ph\" is not a one-letter string"},
        {"[{\"ph\":\"X\",\"dur\":1}]", "event 0: no \"ts\""},
        {"[{\"ph\":\"X\",\"ts\":\"1\",\"dur\":1}]", "event 0: \"ts\" is not a number"},
        {"[{\"ph\":\"X\",\"ts\":1}]", "event 0: no \"dur\""},
        {"[{\"ph\":\"i\",\"ts\":1},{\"ph\":\"X\",\"ts\":1,\"dur\":-2}]", "event 1: negative duration"},
        {"[{\"ph\":\"X\",\"ts\":1e300,\"dur\":1}]", "event 0: \"ts\" 1e+300 is out of range"},
        {"[{\"ph\":\"X\",\"ts\":1,\"dur\":1,\"pid\":\"a\"}]", "event 0: \"pid\" is not an integer"},
        {"[{\"ph\":\"X\",\"ts\":1,\"dur\":1,\"name\":3}]", "event 0: \"name\" is not a string"},
        {"[{\"ph\":\"B\",\"ts\":1,\"tid\":1},{\"ph\":\"E\",\"ts\":2,\"tid\":2}]", "event 1: end (\"E\") with no open begin"},
        {"[{\"ph\":\"B\",\"ts\":5},{\"ph\":\"E\",\"ts\":2}]", "event 1: end (\"E\") before its begin"},
        {"[{\"ph\":\"e\",\"ts\":1,\"id\":3,\"cat\":\"r\",\"name\":\"x\"}]", "event 0: async end (\"e\") of 'x' id 3"},
        {"[{\"ph\":\"b\",\"ts\":1,\"name\":\"x\"}]", "event 0: async event without an \"id\""},
        {"[{\"ph\":\"C\",\"ts\":1,\"name\":\"x\"}]", "event 0: counter (\"C\") without an \"args\" object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *html = (char *)1;
        lm_status st = lm_trace_html(bad[i].json, strlen(bad[i].json), "bad.json", &html);
        const char *msg = lm_last_error();
        LT_CHECK_MSG(st == LM_PARSE_ERROR && html == NULL && strstr(msg, "trace 'bad.json'") && strstr(msg, bad[i].says),
                     "%s: %s: %s (want '%s')", bad[i].json, lm_status_name(st), msg, bad[i].says);
    }
    /* over the size cap: refused before anything is read */
    char *html = NULL;
    LT_CHECK_STATUS(lm_trace_html("[]", ((size_t)1 << 30) + 1, "huge.json", &html), LM_INVALID_ARGUMENT);
    LT_CHECK(html == NULL && strstr(lm_last_error(), "huge.json") && strstr(lm_last_error(), "1024 MiB"));
    LT_CHECK_STATUS(lm_trace_html(NULL, 5, "x", &html), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_trace_html("[]", 2, "x", NULL), LM_INVALID_ARGUMENT);
    /* an unclosed B ends with the trace and is counted */
    const char *open = "[{\"ph\":\"B\",\"ts\":1,\"name\":\"x\"},{\"ph\":\"i\",\"ts\":9}]";
    LT_CHECK_OK(lm_trace_html(open, strlen(open), "open.json", &html));
    json_t *d = html ? page_data(html, "tv-data") : NULL;
    LT_CHECK(d && json_integer_value(json_object_get(d, "unclosed")) == 1 && json_integer_value(json_object_get(d, "wall")) == 8000);
    json_decref(d);
    lm_free(html);
}

static void test_allocation_failures_are_clean(void) {
    char *html = NULL;
    lt_alloc_track(0);
    LT_CHECK_OK(lm_trace_html(k_object, strlen(k_object), "hand.json", &html));
    int64_t total = lt_alloc_count();
    lm_free(html);
    lt_alloc_untrack();
    LT_CHECK(total > 10);
    for (int64_t f = 1; f <= total; f++) {
        html = NULL;
        lt_alloc_track(f);
        lm_status st = lm_trace_html(k_object, strlen(k_object), "hand.json", &html);
        LT_CHECK_MSG(st == LM_OUT_OF_MEMORY && html == NULL, "failing allocation %lld of %lld: %s", (long long)f,
                     (long long)total, lm_status_name(st));
        LT_CHECK_MSG(lt_alloc_live() == 0, "failing allocation %lld leaked %lld", (long long)f,
                     (long long)lt_alloc_live());
        lt_alloc_untrack();
        lm_free(html);
    }
}

int main(void) {
    LT_RUN(test_real_trace_from_threads);
    LT_RUN(test_handcrafted_summary_and_lanes);
    LT_RUN(test_names_are_escaped);
    LT_RUN(test_malformed_input_is_refused);
    LT_RUN(test_allocation_failures_are_clean);
    return lt_finish();
}
