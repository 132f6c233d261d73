/* `loom bench serve` and its HTTP client. Unit tests of the pieces (numpy's percentile
 * rule, length SPECs, URLs, OpenAI error bodies and chunks, the SSE reader and the
 * chunked decoder fed at every possible split), then the real CLI binary against an
 * in-test fake OpenAI server on 127.0.0.1: streamed completions and chat (usage or
 * not), --no-stream, a prompts file, tokenizer-exact prompts, 429 answers carrying an
 * OpenAI error object, streams cut mid-way, malformed SSE, an unreachable server, a
 * server with no models, bad arguments and Ctrl-C. The JSON is checked for counts,
 * the server's messages, token totals and ordered percentiles; timings only for sanity.
 * The CLI sources are compiled into this test (tools/ is not a library), so static
 * helpers are reachable.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include "../../tools/loom/args.c"
#include "../../tools/loom/cmd_bench_serve.c"
#define LOOM_DEFAULT_MODEL_DIR LOOM_SOURCE_DIR "/models/default"
#include "../../tools/loom/common.c"
#include "../../tools/loom/http_client.c"

#include <arpa/inet.h>
#include <spawn.h>
#include <stdarg.h>
#include <sys/wait.h>

#define LOOM LOOM_BINARY_DIR "/loom"

extern char **environ;

/* ---- unit tests ------------------------------------------------------------------------ */

static void test_percentile_is_numpy_linear_interpolation(void) {
    double a[] = {1, 2, 3, 4};
    /* numpy.percentile([1,2,3,4], [0,50,95,99,100]) = 1, 2.5, 3.85, 3.97, 4 */
    LT_CHECK(percentile_sorted(a, 4, 0) == 1);
    LT_CHECK(fabs(percentile_sorted(a, 4, 50) - 2.5) < 1e-12);
    LT_CHECK(fabs(percentile_sorted(a, 4, 95) - 3.85) < 1e-12);
    LT_CHECK(fabs(percentile_sorted(a, 4, 99) - 3.97) < 1e-12);
    LT_CHECK(percentile_sorted(a, 4, 100) == 4);
    double one[] = {7};
    LT_CHECK(percentile_sorted(one, 1, 0) == 7 && percentile_sorted(one, 1, 99) == 7 && percentile_sorted(one, 1, 100) == 7);
    double v[] = {50, 10, 40, 20, 30}; /* unsorted: summarize sorts */
    summary s = summarize(v, 5);
    LT_CHECK(s.n == 5 && s.mean == 30 && s.p50 == 30 && s.max == 50);
    LT_CHECK(fabs(s.p95 - 48) < 1e-12 && fabs(s.p99 - 49.6) < 1e-12); /* numpy: 48.0, 49.6 */
    summary z = summarize(NULL, 0);
    LT_CHECK(z.n == 0 && z.max == 0);
}

static void test_length_spec_parsing(void) {
    span s;
    char err[256];
    LT_CHECK(parse_span("5", &s, err, sizeof err) == 0 && s.lo == 5 && s.hi == 5);
    LT_CHECK(parse_span("3-9", &s, err, sizeof err) == 0 && s.lo == 3 && s.hi == 9);
    LT_CHECK(parse_span("7-7", &s, err, sizeof err) == 0 && s.lo == 7 && s.hi == 7);
    LT_CHECK(parse_span("10000000", &s, err, sizeof err) == 0);
    const char *bad[] = {"", "0", "9-3", "a", "3-", "-3", "3-4-5", " 3", "1.5", "0-4", "10000001", "99999999999999999999", "4 "};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = '\0';
        LT_CHECK_MSG(parse_span(bad[i], &s, err, sizeof err) < 0, "'%s' was accepted", bad[i]);
        LT_CHECK_MSG(strstr(err, "expected N or A-B"), "'%s': message '%s'", bad[i], err);
    }
    lm_rng r;
    lm_rng_seed(&r, 1);
    span u = {3, 5};
    int seen[6] = {0};
    for (int i = 0; i < 300; i++) {
        int x = span_draw(u, &r);
        LT_CHECK(x >= 3 && x <= 5);
        if (x >= 3 && x <= 5) seen[x] = 1;
    }
    LT_CHECK(seen[3] && seen[4] && seen[5]);
}

static void test_url_parsing(void) {
    http_url u;
    char err[HTTP_ERR_MAX], auth[300];
    LT_CHECK(http_url_parse("http://localhost:8000", &u, err, sizeof err) == 0);
    LT_CHECK(!strcmp(u.host, "localhost") && !strcmp(u.port, "8000") && !strcmp(u.path, ""));
    LT_CHECK(http_url_parse("HTTP://127.0.0.1/", &u, err, sizeof err) == 0);
    LT_CHECK(!strcmp(u.host, "127.0.0.1") && !strcmp(u.port, "80") && !strcmp(u.path, ""));
    LT_CHECK(http_url_parse("http://[::1]:9000/proxy/v1/", &u, err, sizeof err) == 0);
    LT_CHECK(!strcmp(u.host, "::1") && !strcmp(u.port, "9000") && !strcmp(u.path, "/proxy/v1"));
    http_url_authority(&u, auth, sizeof auth);
    LT_CHECK(!strcmp(auth, "[::1]:9000"));
    struct {
        const char *url, *want;
    } bad[] = {{"https://api.example.com", "TLS is not supported; use http://"},
               {"localhost:8000", "must start with http://"},
               {"ftp://x", "unsupported scheme"},
               {"http://", "missing the host"},
               {"http://:80", "missing the host"},
               {"http://h:0", "invalid port"},
               {"http://h:65536", "invalid port"},
               {"http://h:8x", "invalid port"},
               {"http://h:", "invalid port"},
               {"http://user:pw@h", "user information"},
               {"http://[::1", "missing ']'"},
               {"http://h/x?y=1", "queries"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = '\0';
        LT_CHECK_MSG(http_url_parse(bad[i].url, &u, err, sizeof err) < 0, "'%s' was accepted", bad[i].url);
        LT_CHECK_MSG(strstr(err, bad[i].want), "'%s': message '%s'", bad[i].url, err);
    }
}

static void test_openai_error_bodies_and_chunks(void) {
    char m[256];
    const char *openai = "{\"error\":{\"message\":\"Rate limit reached\",\"type\":\"requests\",\"code\":429}}";
    error_message(openai, strlen(openai), m, sizeof m);
    LT_CHECK(!strcmp(m, "Rate limit reached"));
    const char *vllm = "{\"object\":\"error\",\"message\":\"max_tokens too large\",\"code\":400}";
    error_message(vllm, strlen(vllm), m, sizeof m);
    LT_CHECK(!strcmp(m, "max_tokens too large"));
    error_message("{\"detail\":\"Not Found\"}", 22, m, sizeof m);
    LT_CHECK(!strcmp(m, "Not Found"));
    error_message("Bad\ngateway", 11, m, sizeof m);
    LT_CHECK(!strcmp(m, "Bad gateway"));
    error_message("", 0, m, sizeof m);
    LT_CHECK(!strcmp(m, "(empty body)"));

    json_t *j = json_loads("{\"choices\":[{\"index\":0,\"text\":\"hi\",\"finish_reason\":null}]}", 0, NULL);
    chunk_info c = chunk_read(j);
    LT_CHECK(c.has_text && !c.finished && !c.has_usage && c.text && !strcmp(c.text, "hi"));
    json_decref(j);
    j = json_loads("{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}", 0, NULL);
    c = chunk_read(j); /* a role-only delta carries no text */
    LT_CHECK(!c.has_text && !c.finished);
    json_decref(j);
    j = json_loads("{\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"},\"finish_reason\":\"stop\"}]}", 0, NULL);
    c = chunk_read(j);
    LT_CHECK(c.has_text && c.finished);
    json_decref(j);
    j = json_loads("{\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":7}}", 0, NULL);
    c = chunk_read(j);
    LT_CHECK(!c.has_text && c.has_usage && c.prompt_tokens == 11 && c.completion_tokens == 7);
    json_decref(j);
}

/* SSE events recorded as "event|data" joined by '\x1e'. */
typedef struct event_log {
    char buf[4096];
    size_t len;
    int stop_at_done;
} event_log;

static int record_event(void *user, const char *event, const char *data, size_t len) {
    event_log *l = user;
    l->len += (size_t)snprintf(l->buf + l->len, sizeof l->buf - l->len, "%s|%.*s\x1e", event, (int)len, data);
    return l->stop_at_done && len == 6 && !memcmp(data, "[DONE]", 6);
}

static const char SSE_STREAM[] = ": keep-alive comment\r\n"
                                 "data: {\"a\":1}\r\n\r\n"
                                 "event: ping\ndata: line1\ndata:line2\n\n"
                                 "data:nospace\r\r"
                                 "id: 5\nretry: 10\ndata: [DONE]\n\n"
                                 "error: {\"message\":\"boom\"}\n\n"
                                 "data: not terminated";
static const char SSE_EVENTS[] = "|{\"a\":1}\x1eping|line1\nline2\x1e|nospace\x1e|[DONE]\x1e"
                                 "error|{\"message\":\"boom\"}\x1e";

/* Feeds text to a fresh reader in pieces: size 0 = all at once, 1 = byte by byte,
 * otherwise random sizes in [1, size]. */
static void sse_split(const char *text, size_t n, size_t size, lt_rng *rng, event_log *log) {
    sse_reader r;
    sse_reader_init(&r);
    memset(log, 0, sizeof *log);
    for (size_t i = 0; i < n;) {
        size_t k = size == 0 ? n - i : size == 1 ? 1 : (size_t)lt_rng_int(rng, 1, (int64_t)size);
        if (k > n - i) k = n - i;
        LT_CHECK(sse_reader_feed(&r, text + i, k, record_event, log) == 0);
        i += k;
    }
    sse_reader_deinit(&r);
}

static void test_sse_events_are_the_same_for_every_split(void) {
    event_log log;
    lt_rng rng = lt_rng_seed(7);
    size_t n = sizeof SSE_STREAM - 1;
    sse_split(SSE_STREAM, n, 0, &rng, &log);
    LT_CHECK_MSG(!strcmp(log.buf, SSE_EVENTS), "whole: '%s'", log.buf);
    sse_split(SSE_STREAM, n, 1, &rng, &log);
    LT_CHECK_MSG(!strcmp(log.buf, SSE_EVENTS), "byte by byte: '%s'", log.buf);
    for (int t = 0; t < 200; t++) {
        sse_split(SSE_STREAM, n, (size_t)(2 + t % 23), &rng, &log);
        LT_CHECK_MSG(!strcmp(log.buf, SSE_EVENTS), "random split %d: '%s'", t, log.buf);
    }
    for (size_t cut = 0; cut <= n; cut++) { /* every two-piece split */
        sse_reader r;
        sse_reader_init(&r);
        memset(&log, 0, sizeof log);
        sse_reader_feed(&r, SSE_STREAM, cut, record_event, &log);
        sse_reader_feed(&r, SSE_STREAM + cut, n - cut, record_event, &log);
        LT_CHECK_MSG(!strcmp(log.buf, SSE_EVENTS), "cut at %zu", cut);
        sse_reader_deinit(&r);
    }
    /* the callback's non-zero result stops the reader */
    sse_reader r;
    sse_reader_init(&r);
    memset(&log, 0, sizeof log);
    log.stop_at_done = 1;
    LT_CHECK(sse_reader_feed(&r, SSE_STREAM, n, record_event, &log) == 1);
    LT_CHECK(strstr(log.buf, "[DONE]") && !strstr(log.buf, "boom"));
    sse_reader_deinit(&r);
}

/* Chunked decoding: payload bytes to an SSE reader and a copy. */
typedef struct dechunk {
    char payload[4096];
    size_t len;
    sse_reader sse;
    event_log log;
} dechunk;

static int dechunk_body(void *user, const char *data, size_t n) {
    dechunk *d = user;
    memcpy(d->payload + d->len, data, n);
    d->len += n;
    return sse_reader_feed(&d->sse, data, n, record_event, &d->log) < 0 ? -1 : 0;
}

/* Encodes text in chunks of 1..max bytes (so boundaries fall inside SSE events), with
 * hex in both cases, a chunk extension now and then, a trailer and bytes after the end. */
static size_t chunk_encode(const char *text, size_t n, int max, lt_rng *rng, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = (size_t)lt_rng_int(rng, 1, max);
        if (k > n - i) k = n - i;
        o += (size_t)sprintf(out + o, k % 2 ? "%zx" : "%zX", k);
        if (lt_rng_int(rng, 0, 4) == 0) o += (size_t)sprintf(out + o, ";ext=\"v\"");
        o += (size_t)sprintf(out + o, lt_rng_int(rng, 0, 5) == 0 ? "\n" : "\r\n");
        memcpy(out + o, text + i, k);
        o += k;
        o += (size_t)sprintf(out + o, "\r\n");
        i += k;
    }
    o += (size_t)sprintf(out + o, "0\r\nX-Trailer: yes\r\n\r\nEXTRA");
    return o;
}

static void test_chunked_decoding_with_boundaries_inside_events(void) {
    lt_rng rng = lt_rng_seed(11);
    static char wire[16384];
    size_t n = sizeof SSE_STREAM - 1;
    for (int t = 0; t < 100; t++) {
        size_t w = chunk_encode(SSE_STREAM, n, 1 + t % 40, &rng, wire);
        dechunk d;
        memset(&d, 0, sizeof d);
        sse_reader_init(&d.sse);
        http_chunked c;
        http_chunked_init(&c);
        char err[HTTP_ERR_MAX] = "";
        int rc = 0;
        size_t i = 0, piece = t % 3 == 0 ? 1 : (size_t)(1 + t % 17);
        while (i < w && rc == 0) {
            size_t k = piece == 1 ? 1 : (size_t)lt_rng_int(&rng, 1, (int64_t)piece);
            if (k > w - i) k = w - i;
            size_t used = 0;
            rc = http_chunked_feed(&c, wire + i, k, &used, dechunk_body, &d, err, sizeof err);
            LT_CHECK(used <= k && (rc != 0 || used == k));
            i += used;
        }
        LT_CHECK_MSG(rc == 1, "round %d: rc %d (%s)", t, rc, err);
        LT_CHECK_MSG(w - i == 5 && !memcmp(wire + i, "EXTRA", 5), "round %d: %zu bytes left", t, w - i);
        LT_CHECK(d.len == n && !memcmp(d.payload, SSE_STREAM, n));
        LT_CHECK_MSG(!strcmp(d.log.buf, SSE_EVENTS), "round %d: events '%s'", t, d.log.buf);
        sse_reader_deinit(&d.sse);
    }
    struct {
        const char *wire, *want;
    } bad[] = {{"zz\r\nab\r\n", "bad chunk-size line 'zz'"},
               {"3\r\nabcX", "expected CRLF after chunk data"},
               {"\r\n", "bad chunk-size"},
               {"3x\r\nabc\r\n", "bad chunk-size"},
               {"1000000000000000\r\n", "bad chunk-size"}};
    for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
        http_chunked c;
        http_chunked_init(&c);
        char err[HTTP_ERR_MAX] = "";
        size_t used;
        LT_CHECK(http_chunked_feed(&c, bad[b].wire, strlen(bad[b].wire), &used, NULL, NULL, err, sizeof err) == -1);
        LT_CHECK_MSG(strstr(err, bad[b].want), "'%s': message '%s'", bad[b].wire, err);
    }
}

/* ---- the fake OpenAI server ---------------------------------------------------------------- */

typedef struct fake_server {
    int fd, port;
    pthread_t thread;
    atomic_int stop, conns;
    /* behaviour */
    int no_models;    /* GET /v1/models lists nothing */
    int reject_every; /* every k-th POST answers 429 with an OpenAI error object */
    int close_every;  /* every k-th POST closes the connection after 2 text events */
    int garbage_every; /* every k-th POST streams an event that is not JSON */
    int no_usage;     /* no usage chunk */
    int chunk_delay_us;
    /* observations, under mu */
    pthread_mutex_t mu;
    int posts, bad_bodies, auth_seen, ignore_eos_seen, include_usage_seen;
    long long max_tokens_sum, served_tokens, prompt_words;
    int max_tokens_min, max_tokens_max;
    char *prompts[64]; /* the first prompts served (completions) */
    int nprompts;
} fake_server;

typedef struct fake_conn {
    fake_server *s;
    int fd;
} fake_conn;

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Case-insensitive strstr (strcasestr is a GNU extension). */
static const char *find_ci(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (; *hay; hay++)
        if (strncasecmp(hay, needle, n) == 0) return hay;
    return NULL;
}

static void put(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

static void put_str(int fd, const char *p) { put(fd, p, strlen(p)); }

/* One HTTP chunk per half of the event, so chunk boundaries fall inside SSE events. */
static void put_event(int fd, const char *event, int salt) {
    size_t n = strlen(event), cut = 1 + (size_t)(salt * 7 + 3) % (n - 1);
    char head[32];
    snprintf(head, sizeof head, "%zx\r\n", cut);
    put_str(fd, head);
    put(fd, event, cut);
    snprintf(head, sizeof head, "\r\n%zx\r\n", n - cut);
    put_str(fd, head);
    put(fd, event + cut, n - cut);
    put_str(fd, "\r\n");
}

static void put_json(int fd, int status, const char *reason, const char *body) {
    char head[256];
    snprintf(head, sizeof head,
             "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", status,
             reason, strlen(body));
    put_str(fd, head);
    put_str(fd, body);
}

static int count_words(const char *s) {
    int n = 0;
    for (const char *p = s; *p; p++)
        if (*p != ' ' && (p == s || p[-1] == ' ')) n++;
    return n;
}

static void serve_post(fake_server *s, int fd, int chat, const char *body, int auth) {
    json_t *j = json_loads(body, 0, NULL);
    int max_tokens = (int)json_integer_value(json_object_get(j, "max_tokens"));
    int stream = json_is_true(json_object_get(j, "stream"));
    const char *prompt = json_string_value(json_object_get(j, "prompt"));
    int words = prompt ? count_words(prompt) : 0;
    json_t *msgs = json_object_get(j, "messages"), *m;
    size_t i;
    json_array_foreach(msgs, i, m) {
        const char *c = json_string_value(json_object_get(m, "content"));
        words += c ? count_words(c) : 0;
    }
    pthread_mutex_lock(&s->mu);
    int n = ++s->posts;
    if (!j || max_tokens < 1 || !json_is_string(json_object_get(j, "model")) || (!prompt && !json_is_array(msgs)))
        s->bad_bodies++;
    s->auth_seen += auth;
    s->ignore_eos_seen += json_is_true(json_object_get(j, "ignore_eos"));
    s->include_usage_seen += json_is_true(json_object_get(json_object_get(j, "stream_options"), "include_usage"));
    s->max_tokens_sum += max_tokens;
    if (s->posts == 1 || max_tokens < s->max_tokens_min) s->max_tokens_min = max_tokens;
    if (max_tokens > s->max_tokens_max) s->max_tokens_max = max_tokens;
    int reject = s->reject_every && n % s->reject_every == 0, cut = s->close_every && n % s->close_every == 0;
    int garbage = s->garbage_every && n % s->garbage_every == 0;
    if (!reject && !cut && !garbage) {
        s->served_tokens += max_tokens;
        s->prompt_words += words;
        if (prompt && s->nprompts < 64) s->prompts[s->nprompts++] = strdup(prompt);
    }
    pthread_mutex_unlock(&s->mu);
    if (reject) {
        put_json(fd, 429, "Too Many Requests",
                 "{\"error\":{\"message\":\"fake rate limit: slow down\",\"type\":\"rate_limit_error\","
                 "\"code\":\"rate_limit_exceeded\"}}");
    } else if (!stream) {
        char out[512];
        snprintf(out, sizeof out,
                 chat ? "{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"w w\"},"
                        "\"finish_reason\":\"length\"}],"
                        "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}"
                      : "{\"choices\":[{\"index\":0,\"text\":\"w w\",\"finish_reason\":\"length\"}],"
                        "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}",
                 words, max_tokens);
        put_json(fd, 200, "OK", out);
    } else {
        put_str(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n"
                    "Cache-Control: no-cache\r\nConnection: close\r\n\r\n");
        put_event(fd, ": ping\n\n", n);
        if (chat) /* a role-only delta first, as OpenAI and vLLM send */
            put_event(fd, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\n", n);
        char ev[512];
        for (int t = 0; t < max_tokens; t++) {
            if (cut && t == 2) goto done; /* close mid-stream */
            if (garbage && t == 1) put_event(fd, "data: {this is not json\n\n", n);
            snprintf(ev, sizeof ev,
                     chat ? "data: {\"id\":\"c%d\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
                            "\"delta\":{\"content\":\"w%d \"},\"finish_reason\":null}]}\r\n\r\n"
                          : "data: {\"id\":\"c%d\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,"
                            "\"text\":\"w%d \",\"finish_reason\":null}]}\n\n",
                     n, t);
            put_event(fd, ev, n + t);
            if (s->chunk_delay_us) sleep_us(s->chunk_delay_us);
            if (atomic_load(&s->stop)) goto done;
        }
        put_event(fd, chat ? "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"
                           : "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n",
                  n);
        if (!s->no_usage) {
            snprintf(ev, sizeof ev,
                     "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n",
                     words, max_tokens, words + max_tokens);
            put_event(fd, ev, n);
        }
        put_event(fd, "data: [DONE]\n\n", n);
        put_str(fd, "0\r\n\r\n");
    }
done:
    json_decref(j);
}

static void *fake_conn_main(void *arg) {
    fake_conn *c = arg;
    fake_server *s = c->s;
    char *buf = malloc(1 << 20);
    size_t have = 0, head = 0;
    while (buf && !(head = header_end(buf, have)) && have < (1 << 20) - 1) {
        ssize_t r = recv(c->fd, buf + have, (1 << 20) - 1 - have, 0);
        if (r <= 0) break;
        have += (size_t)r;
    }
    if (buf && head) {
        buf[have] = '\0';
        size_t clen = 0;
        const char *cl = find_ci(buf, "content-length:");
        if (cl && cl < buf + head) clen = (size_t)strtoul(cl + 15, NULL, 10);
        while (have < head + clen && have < (1 << 20) - 1) {
            ssize_t r = recv(c->fd, buf + have, (1 << 20) - 1 - have, 0);
            if (r <= 0) break;
            have += (size_t)r;
        }
        buf[have] = '\0';
        const char *a = find_ci(buf, "authorization: bearer sekrit");
        int auth = a && a < buf + head;
        if (!strncmp(buf, "GET /v1/models ", 15)) {
            put_json(c->fd, 200, "OK",
                     s->no_models ? "{\"object\":\"list\",\"data\":[]}"
                                  : "{\"object\":\"list\",\"data\":[{\"id\":\"fake-model\",\"object\":\"model\"}]}");
        } else if (!strncmp(buf, "GET /raw ", 9)) { /* close-delimited body */
            put_str(c->fd, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end");
        } else if (!strncmp(buf, "GET /hang ", 10)) {
            for (int i = 0; i < 100 && !atomic_load(&s->stop); i++) sleep_us(20000);
        } else if (!strncmp(buf, "POST /v1/completions ", 21)) {
            serve_post(s, c->fd, 0, buf + head, auth);
        } else if (!strncmp(buf, "POST /v1/chat/completions ", 26)) {
            serve_post(s, c->fd, 1, buf + head, auth);
        } else {
            put_json(c->fd, 404, "Not Found", "{\"detail\":\"Not Found\"}");
        }
    }
    free(buf);
    close(c->fd);
    free(c);
    atomic_fetch_sub(&s->conns, 1);
    return NULL;
}

static void *fake_accept_main(void *arg) {
    fake_server *s = arg;
    while (!atomic_load(&s->stop)) {
        struct pollfd p = {s->fd, POLLIN, 0};
        if (poll(&p, 1, 20) <= 0) continue;
        int fd = accept(s->fd, NULL, NULL);
        if (fd < 0) continue;
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        fake_conn *c = malloc(sizeof *c);
        c->s = s;
        c->fd = fd;
        atomic_fetch_add(&s->conns, 1);
        pthread_t t;
        pthread_attr_t ta;
        pthread_attr_init(&ta);
        pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &ta, fake_conn_main, c) != 0) {
            close(fd);
            free(c);
            atomic_fetch_sub(&s->conns, 1);
        }
        pthread_attr_destroy(&ta);
    }
    return NULL;
}

/* Listens on 127.0.0.1 at an ephemeral port; the caller sets behaviour fields first. */
static int fake_start(fake_server *s) {
    s->fd = socket(AF_INET, SOCK_STREAM, 0);
    fcntl(s->fd, F_SETFD, FD_CLOEXEC);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(s->fd, (struct sockaddr *)&a, sizeof a) || listen(s->fd, 256) ||
        getsockname(s->fd, (struct sockaddr *)&a, &len)) {
        lt_fail(__FILE__, __LINE__, "fake server: cannot listen on 127.0.0.1: %s", strerror(errno));
        close(s->fd);
        return 0;
    }
    s->port = ntohs(a.sin_port);
    pthread_mutex_init(&s->mu, NULL);
    atomic_init(&s->stop, 0);
    atomic_init(&s->conns, 0);
    pthread_create(&s->thread, NULL, fake_accept_main, s);
    return 1;
}

static void fake_stop(fake_server *s) {
    atomic_store(&s->stop, 1);
    pthread_join(s->thread, NULL);
    for (int i = 0; i < 500 && atomic_load(&s->conns) > 0; i++) sleep_us(10000);
    close(s->fd);
    pthread_mutex_destroy(&s->mu);
    for (int i = 0; i < s->nprompts; i++) free(s->prompts[i]);
}

/* ---- running the CLI ------------------------------------------------------------------------ */

typedef struct cli_run {
    int status; /* exit code, or -signal */
    char *out, *err;
    json_t *json; /* stdout parsed, or NULL */
} cli_run;

static char *slurp(const char *path) {
    char *buf = NULL;
    size_t n = 0;
    return lm_file_read_all(path, &buf, &n) == LM_OK ? buf : NULL;
}

static pid_t spawn_loom(const char **args, const char *out, const char *err) {
    const char *argv[64] = {LOOM};
    int n = 1;
    for (; args[n - 1] && n < 63; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = -1;
    if (posix_spawn(&pid, LOOM, &fa, NULL, (char *const *)argv, environ) != 0) pid = -1;
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}

static cli_run finish_loom(pid_t pid, const char *out, const char *err) {
    cli_run r = {-1000, NULL, NULL, NULL};
    int st = 0;
    if (pid > 0 && waitpid(pid, &st, 0) == pid) r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
    r.out = slurp(out);
    r.err = slurp(err);
    remove(out);
    remove(err);
    r.json = r.out ? json_loads(r.out, 0, NULL) : NULL;
    return r;
}

static void out_paths(char *out, char *err) {
    sprintf(out, "/tmp/loom_bench_serve_out.%d", (int)getpid());
    sprintf(err, "/tmp/loom_bench_serve_err.%d", (int)getpid());
}

/* Runs `loom bench serve ARGS...` (NULL-terminated) to completion. */
static cli_run run_bench(const char *first, ...) {
    const char *args[60] = {"bench", "serve"};
    int n = 2;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && n < 59; a = va_arg(ap, const char *)) args[n++] = a;
    va_end(ap);
    args[n] = NULL;
    char out[64], err[64];
    out_paths(out, err);
    return finish_loom(spawn_loom(args, out, err), out, err);
}

static void run_free(cli_run *r) {
    lm_free(r->out);
    lm_free(r->err);
    json_decref(r->json);
}

static long long jint(json_t *o, const char *key) { return json_integer_value(json_object_get(o, key)); }

static const char *jstr(json_t *o, const char *key) {
    const char *v = json_string_value(json_object_get(o, key));
    return v ? v : "";
}

static double jnum(json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }

/* The statistics object is present and ordered: 0 <= p50 <= p95 <= p99 <= max, mean within. */
static void check_stats(json_t *o, const char *key, long long n) {
    json_t *s = json_object_get(o, key);
    LT_CHECK_MSG(json_is_object(s), "%s missing", key);
    if (!json_is_object(s)) return;
    double mean = jnum(s, "mean"), p50 = jnum(s, "p50"), p95 = jnum(s, "p95"), p99 = jnum(s, "p99"), max = jnum(s, "max");
    LT_CHECK_MSG(p50 >= 0 && p50 <= p95 && p95 <= p99 && p99 <= max, "%s: p50 %g p95 %g p99 %g max %g", key, p50, p95, p99,
                 max);
    LT_CHECK_MSG(mean >= 0 && mean <= max + 1e-9, "%s: mean %g max %g", key, mean, max);
    if (n >= 0) LT_CHECK_MSG(jint(s, "n") == n, "%s: n %lld, expected %lld", key, jint(s, "n"), n);
}

static void url_of(const fake_server *s, char *buf) { sprintf(buf, "http://127.0.0.1:%d", s->port); }

static int have_loom(void) {
    if (access(LOOM, X_OK) == 0) return 1;
    lt_fail(__FILE__, __LINE__, "%s is missing: build the loom target first", LOOM);
    return 0;
}

/* ---- end-to-end tests ------------------------------------------------------------------------- */

static void test_streamed_completions_against_a_fake_server(void) {
    fake_server s = {0};
    s.chunk_delay_us = 200;
    if (!have_loom() || !fake_start(&s)) return;
    char url[64];
    url_of(&s, url);
    cli_run r = run_bench("--url", url, "--requests", "20", "--concurrency", "4", "--output-tokens", "3-9",
                          "--prompt-tokens", "5-12", "--ignore-eos", "--seed", "3", "--api-key", "sekrit", NULL);
    LT_CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    LT_CHECK_MSG(r.json != NULL, "stdout is not one JSON object: %s", r.out ? r.out : "");
    json_t *o = r.json, *cfg = json_object_get(o, "config");
    LT_CHECK(!strcmp(jstr(cfg, "model"), "fake-model")); /* from GET /v1/models */
    LT_CHECK(jint(o, "completed") == 20 && jint(o, "failed") == 0 && json_array_size(json_object_get(o, "errors")) == 0);
    LT_CHECK(json_is_false(json_object_get(cfg, "prompt_tokens_exact")));
    pthread_mutex_lock(&s.mu);
    LT_CHECK(s.posts == 20 && s.bad_bodies == 0 && s.auth_seen == 20 && s.ignore_eos_seen == 20 && s.include_usage_seen == 20);
    LT_CHECK_MSG(s.max_tokens_min >= 3 && s.max_tokens_max <= 9 && s.max_tokens_min < s.max_tokens_max, "max_tokens %d..%d",
                 s.max_tokens_min, s.max_tokens_max);
    LT_CHECK_MSG(jint(o, "total_output_tokens") == s.max_tokens_sum, "output tokens %lld, server sent %lld",
                 jint(o, "total_output_tokens"), s.max_tokens_sum);
    LT_CHECK(jint(o, "total_input_tokens") == s.prompt_words && s.prompt_words >= 20 * 5 && s.prompt_words <= 20 * 12);
    long long out_tokens = s.max_tokens_sum;
    pthread_mutex_unlock(&s.mu);
    LT_CHECK(jint(o, "usage_reported") == 20);
    check_stats(o, "ttft_ms", 20);
    check_stats(o, "e2e_ms", 20);
    check_stats(o, "tpot_ms", 20);
    check_stats(o, "itl_ms", out_tokens - 20); /* one gap fewer than chunks per request */
    json_t *ttft = json_object_get(o, "ttft_ms"), *e2e = json_object_get(o, "e2e_ms");
    LT_CHECK(jnum(ttft, "max") <= jnum(e2e, "max") && jnum(ttft, "mean") <= jnum(e2e, "mean"));
    LT_CHECK(jnum(o, "duration_s") > 0 && jnum(o, "requests_per_s") > 0 && jnum(o, "output_tokens_per_s") > 0);
    LT_CHECK(jnum(o, "total_tokens_per_s") >= jnum(o, "output_tokens_per_s"));
    run_free(&r);
    fake_stop(&s);
}

static void test_chat_with_a_prompts_file_and_no_usage(void) {
    fake_server s = {0};
    s.no_usage = 1;
    if (!have_loom() || !fake_start(&s)) return;
    char url[64], path[64], outjson[64];
    url_of(&s, url);
    sprintf(path, "/tmp/loom_bench_serve_prompts.%d.jsonl", (int)getpid());
    sprintf(outjson, "/tmp/loom_bench_serve_result.%d.json", (int)getpid());
    FILE *f = fopen(path, "w");
    fputs("{\"prompt\": \"hello there\", \"max_tokens\": 3}\n"
          "\n"
          "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"hi\"}], "
          "\"max_tokens\": 5}\n"
          "{\"prompt\": \"x\"}\n",
          f);
    fclose(f);
    cli_run r = run_bench("--url", url, "--endpoint", "chat", "--model", "m", "--prompts", path, "--requests", "7",
                          "--output-tokens", "2", "--rate", "500", "--concurrency", "2", "--out", outjson, NULL);
    LT_CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    json_t *o = r.json;
    LT_CHECK(jint(o, "completed") == 7 && jint(o, "failed") == 0);
    /* lines cycle 3,5,2,3,5,2,3; the role-only first delta is not a token */
    LT_CHECK_MSG(jint(o, "total_output_tokens") == 23, "output tokens %lld", jint(o, "total_output_tokens"));
    LT_CHECK(jint(o, "usage_reported") == 0);
    LT_CHECK(!strcmp(jstr(json_object_get(o, "config"), "arrivals"), "poisson"));
    pthread_mutex_lock(&s.mu);
    LT_CHECK(s.posts == 7 && s.bad_bodies == 0 && s.max_tokens_sum == 23 && s.ignore_eos_seen == 0);
    pthread_mutex_unlock(&s.mu);
    check_stats(o, "itl_ms", 23 - 7);
    char *saved = slurp(outjson);
    LT_CHECK_MSG(saved && r.out && !strcmp(saved, r.out), "--out differs from stdout");
    lm_free(saved);
    run_free(&r);

    /* bad lines are errors naming the line */
    f = fopen(path, "w");
    fputs("{\"prompt\": \"ok\"}\n{\"prompt\": 5}\n", f);
    fclose(f);
    r = run_bench("--url", url, "--model", "m", "--prompts", path, NULL);
    LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, ":2:") && strstr(r.err, "\"prompt\" must be a string"), "exit %d: %s",
                 r.status, r.err ? r.err : "");
    run_free(&r);
    f = fopen(path, "w");
    fputs("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\nnot json\n", f);
    fclose(f);
    r = run_bench("--url", url, "--model", "m", "--prompts", path, NULL);
    LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, ":1:") && strstr(r.err, "--endpoint chat"), "exit %d: %s", r.status,
                 r.err ? r.err : "");
    run_free(&r);
    r = run_bench("--url", url, "--model", "m", "--endpoint", "chat", "--prompts", path, NULL);
    LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, ":2:"), "exit %d: %s", r.status, r.err ? r.err : "");
    run_free(&r);
    remove(path);
    remove(outjson);
    fake_stop(&s);
}

static void test_no_stream_measures_end_to_end_only(void) {
    fake_server s = {0};
    if (!have_loom() || !fake_start(&s)) return;
    char url[64];
    sprintf(url, "http://localhost:%d/v1/", s.port); /* a name, and the API root given with its /v1 */
    cli_run r = run_bench("--url", url, "--requests", "6", "--output-tokens", "4", "--prompt-tokens", "3", "--no-stream", NULL);
    LT_CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    json_t *o = r.json;
    LT_CHECK(jint(o, "completed") == 6 && jint(o, "total_output_tokens") == 24 && jint(o, "total_input_tokens") == 18);
    LT_CHECK(json_is_null(json_object_get(o, "tpot_ms")) && json_is_null(json_object_get(o, "itl_ms")));
    check_stats(o, "ttft_ms", 6);
    check_stats(o, "e2e_ms", 6);
    LT_CHECK(jnum(json_object_get(o, "ttft_ms"), "p50") == jnum(json_object_get(o, "e2e_ms"), "p50"));
    LT_CHECK(!strcmp(jstr(json_object_get(o, "config"), "path"), "/v1/completions"));
    run_free(&r);
    fake_stop(&s);
}

static void test_failures_carry_the_server_message(void) {
    fake_server s = {0};
    s.reject_every = 3;
    if (!have_loom() || !fake_start(&s)) return;
    char url[64];
    url_of(&s, url);
    cli_run r = run_bench("--url", url, "--requests", "9", "--concurrency", "1", "--output-tokens", "4", "--prompt-tokens", "4", NULL);
    LT_CHECK_MSG(r.status == 1, "exit %d: %s", r.status, r.err ? r.err : "");
    json_t *o = r.json, *errors = json_object_get(o, "errors");
    LT_CHECK(jint(o, "completed") == 6 && jint(o, "failed") == 3 && json_array_size(errors) == 3);
    for (size_t i = 0; i < json_array_size(errors); i++) {
        json_t *e = json_array_get(errors, i);
        const char *m = json_string_value(json_object_get(e, "message"));
        LT_CHECK(jint(e, "status") == 429 && jint(e, "request") == (long long)(3 * i + 2));
        LT_CHECK_MSG(m && strstr(m, "HTTP 429") && strstr(m, "fake rate limit: slow down"), "message '%s'", m ? m : "");
    }
    LT_CHECK(jint(o, "total_output_tokens") == 24);
    check_stats(o, "e2e_ms", 6);
    LT_CHECK(r.err && strstr(r.err, "3 of 9 requests failed") && strstr(r.err, "fake rate limit"));
    run_free(&r);
    fake_stop(&s);

    fake_server c = {0};
    c.close_every = 4;
    if (!fake_start(&c)) return;
    url_of(&c, url);
    r = run_bench("--url", url, "--requests", "8", "--concurrency", "1", "--output-tokens", "6", "--prompt-tokens", "2", NULL);
    o = r.json;
    errors = json_object_get(o, "errors");
    LT_CHECK_MSG(r.status == 1 && jint(o, "completed") == 6 && jint(o, "failed") == 2, "exit %d: %s", r.status,
                 r.out ? r.out : "");
    for (size_t i = 0; i < json_array_size(errors); i++) {
        const char *m = json_string_value(json_object_get(json_array_get(errors, i), "message"));
        LT_CHECK_MSG(m && strstr(m, "connection closed by 127.0.0.1:") && strstr(m, "middle of the response") &&
                         strstr(m, "after 2 text chunks"),
                     "message '%s'", m ? m : "");
    }
    run_free(&r);
    fake_stop(&c);

    fake_server g = {0};
    g.garbage_every = 2;
    if (!fake_start(&g)) return;
    url_of(&g, url);
    r = run_bench("--url", url, "--requests", "4", "--output-tokens", "3", "--prompt-tokens", "2", "--endpoint", "chat", NULL);
    o = r.json;
    errors = json_object_get(o, "errors");
    LT_CHECK_MSG(r.status == 1 && jint(o, "completed") == 2 && jint(o, "failed") == 2, "exit %d: %s", r.status,
                 r.out ? r.out : "");
    const char *m = json_string_value(json_object_get(json_array_get(errors, 0), "message"));
    LT_CHECK_MSG(m && strstr(m, "malformed SSE event") && strstr(m, "this is not json"), "message '%s'", m ? m : "");
    run_free(&r);
    fake_stop(&g);
}

static void test_setup_errors_name_the_problem(void) {
    if (!have_loom()) return;
    cli_run r = run_bench("--url", "https://api.example.com", NULL);
    LT_CHECK(r.status == 2 && r.err && strstr(r.err, "TLS is not supported; use http://") && !r.json);
    run_free(&r);
    r = run_bench(NULL);
    LT_CHECK(r.status == 2 && r.err && strstr(r.err, "--url"));
    run_free(&r);
    r = run_bench("--url", "http://127.0.0.1:1", "--prompt-tokens", "9-3", NULL);
    LT_CHECK(r.status == 2 && r.err && strstr(r.err, "--prompt-tokens") && strstr(r.err, "'9-3'"));
    run_free(&r);
    r = run_bench("--url", "http://127.0.0.1:1", "--output-tokens", "0", NULL);
    LT_CHECK(r.status == 2 && r.err && strstr(r.err, "--output-tokens"));
    run_free(&r);
    r = run_bench("--url", "http://127.0.0.1:1", "--rate", "-3", NULL);
    LT_CHECK(r.status == 2 && r.err && strstr(r.err, "--rate"));
    run_free(&r);
    r = run_bench("--url", "http://127.0.0.1:1", "--endpoint", "embeddings", NULL);
    LT_CHECK(r.status == 2 && r.err && strstr(r.err, "--endpoint"));
    run_free(&r);
    r = run_bench("--url", "http://127.0.0.1:1", "--bogus", NULL);
    LT_CHECK(r.status == 2 && r.err && strstr(r.err, "--bogus"));
    run_free(&r);

    /* A port nobody listens on: a socket bound and closed again. */
    fake_server dead = {0};
    if (!fake_start(&dead)) return;
    int port = dead.port;
    fake_stop(&dead);
    char url[64], want[64];
    sprintf(url, "http://127.0.0.1:%d", port);
    sprintf(want, "connection refused by 127.0.0.1:%d", port);
    r = run_bench("--url", url, NULL);
    LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, want) && strstr(r.err, "/v1/models"), "exit %d: %s", r.status,
                 r.err ? r.err : "");
    run_free(&r);
    r = run_bench("--url", url, "--model", "m", "--requests", "3", NULL);
    LT_CHECK(r.status == 1 && jint(r.json, "failed") == 3 && jint(r.json, "completed") == 0);
    const char *m = json_string_value(json_object_get(json_array_get(json_object_get(r.json, "errors"), 0), "message"));
    LT_CHECK_MSG(m && strstr(m, want), "message '%s'", m ? m : "");
    LT_CHECK(json_is_null(json_object_get(r.json, "ttft_ms")));
    run_free(&r);

    fake_server empty = {0};
    empty.no_models = 1;
    if (!fake_start(&empty)) return;
    url_of(&empty, url);
    r = run_bench("--url", url, NULL);
    LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, "lists no models") && strstr(r.err, "--model"), "exit %d: %s",
                 r.status, r.err ? r.err : "");
    run_free(&r);
    strcat(url, "/nowhere");
    r = run_bench("--url", url, NULL);
    LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, "HTTP 404") && strstr(r.err, "Not Found"), "exit %d: %s", r.status,
                 r.err ? r.err : "");
    run_free(&r);
    fake_stop(&empty);
}

static void test_tokenizer_prompts_have_the_exact_length(void) {
    const char *path = LOOM_SOURCE_DIR "/third_party/tokenizers/qwen3/tokenizer.json";
    if (access(path, R_OK) != 0) {
        printf("  (qwen3 tokenizer.json absent: run scripts/fetch_tokenizers.sh; part skipped)\n");
        return;
    }
    fake_server s = {0};
    if (!have_loom() || !fake_start(&s)) return;
    char url[64];
    url_of(&s, url);
    cli_run r = run_bench("--url", url, "--requests", "8", "--prompt-tokens", "20-40", "--output-tokens", "2", "--tokenizer",
                          path, "--seed", "5", NULL);
    LT_CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    LT_CHECK(json_is_true(json_object_get(json_object_get(r.json, "config"), "prompt_tokens_exact")));
    lm_tokenizer *tok = NULL;
    LT_CHECK_OK(lm_tokenizer_load(path, &tok));
    pthread_mutex_lock(&s.mu);
    LT_CHECK(s.nprompts == 8);
    for (int i = 0; tok && i < s.nprompts; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        LT_CHECK_OK(lm_tokenizer_encode(tok, s.prompts[i], strlen(s.prompts[i]), &ids, &n));
        LT_CHECK_MSG(n >= 20 && n <= 40, "prompt %d has %zu tokens: '%s'", i, n, s.prompts[i]);
        lm_free(ids);
    }
    pthread_mutex_unlock(&s.mu);
    lm_tokenizer_destroy(tok);
    run_free(&r);
    fake_stop(&s);
}

static void test_ctrl_c_reports_what_completed(void) {
    fake_server s = {0};
    s.chunk_delay_us = 20000; /* 200 tokens: 4 s per request */
    if (!have_loom() || !fake_start(&s)) return;
    char url[64], out[64], err[64];
    url_of(&s, url);
    out_paths(out, err);
    const char *args[] = {"bench", "serve", "--url", url, "--model", "m", "--requests", "50", "--concurrency", "2",
                          "--output-tokens", "200", "--prompt-tokens", "3", NULL};
    pid_t pid = spawn_loom(args, out, err);
    for (int i = 0; i < 1000; i++) { /* until both workers have a request in flight */
        pthread_mutex_lock(&s.mu);
        int posts = s.posts;
        pthread_mutex_unlock(&s.mu);
        if (posts >= 2) break;
        sleep_us(10000);
    }
    sleep_us(50000);
    if (pid > 0) kill(pid, SIGINT);
    cli_run r = finish_loom(pid, out, err);
    LT_CHECK_MSG(r.status == 130, "exit %d: %s", r.status, r.err ? r.err : "");
    json_t *o = r.json;
    LT_CHECK_MSG(o && json_is_true(json_object_get(o, "interrupted")), "stdout: %s", r.out ? r.out : "");
    LT_CHECK(jint(o, "cancelled") == 2 && jint(o, "failed") == 0 && jint(o, "completed") == 0);
    LT_CHECK(jint(o, "not_sent") == 48);
    LT_CHECK(r.err && strstr(r.err, "interrupted"));
    run_free(&r);
    fake_stop(&s);
}

/* The client itself: Content-Length, close-delimited bodies, timeouts, 404s. */
typedef struct body_buf {
    char data[4096];
    size_t len;
} body_buf;

static int collect(void *user, const char *data, size_t n) {
    body_buf *b = user;
    if (b->len + n < sizeof b->data) memcpy(b->data + b->len, data, n);
    b->len += n;
    return 0;
}

static void test_http_client_framings_and_timeouts(void) {
    fake_server s = {0};
    if (!fake_start(&s)) return;
    char text[64], err[HTTP_ERR_MAX];
    sprintf(text, "http://localhost:%d/", s.port); /* a name through getaddrinfo (::1 may refuse first) */
    http_url u;
    LT_CHECK(http_url_parse(text, &u, err, sizeof err) == 0 && u.naddrs == 0);
    http_response resp;
    body_buf b = {{0}, 0};
    http_request q = {&u, "GET", "/v1/models", NULL, NULL, 0, 10, NULL};
    LT_CHECK_MSG(http_send(&q, &resp, collect, &b, err, sizeof err) == 0, "%s", err);
    LT_CHECK(resp.status == 200 && resp.content_length == (int64_t)b.len && !resp.chunked && strstr(b.data, "fake-model"));
    LT_CHECK(!strcmp(resp.content_type, "application/json"));
    LT_CHECK_MSG(http_url_resolve(&u, err, sizeof err) == 0 && u.naddrs >= 1, "%s", err); /* resolved once */
    b.len = 0;
    q.path = "/raw";
    LT_CHECK_MSG(http_send(&q, &resp, collect, &b, err, sizeof err) == 0, "%s", err);
    LT_CHECK(resp.status == 200 && resp.content_length == -1 && b.len == 13 && !memcmp(b.data, "until the end", 13));
    b.len = 0;
    q.path = "/missing";
    LT_CHECK(http_send(&q, &resp, collect, &b, err, sizeof err) == 0 && resp.status == 404);
    q.path = "/hang";
    q.timeout_s = 0.2;
    LT_CHECK(http_send(&q, &resp, collect, &b, err, sizeof err) == -1);
    LT_CHECK_MSG(strstr(err, "timed out after 0.2 s") && strstr(err, ":"), "message '%s'", err);
    volatile sig_atomic_t cancel = 1;
    q.timeout_s = 0;
    q.cancel = &cancel;
    LT_CHECK(http_send(&q, &resp, collect, &b, err, sizeof err) == -1 && !strcmp(err, "cancelled"));
    fake_stop(&s);
}

int main(void) {
    LT_RUN(test_percentile_is_numpy_linear_interpolation);
    LT_RUN(test_length_spec_parsing);
    LT_RUN(test_url_parsing);
    LT_RUN(test_openai_error_bodies_and_chunks);
    LT_RUN(test_sse_events_are_the_same_for_every_split);
    LT_RUN(test_chunked_decoding_with_boundaries_inside_events);
    LT_RUN(test_http_client_framings_and_timeouts);
    LT_RUN(test_streamed_completions_against_a_fake_server);
    LT_RUN(test_chat_with_a_prompts_file_and_no_usage);
    LT_RUN(test_no_stream_measures_end_to_end_only);
    LT_RUN(test_failures_carry_the_server_message);
    LT_RUN(test_setup_errors_name_the_problem);
    LT_RUN(test_tokenizer_prompts_have_the_exact_length);
    LT_RUN(test_ctrl_c_reports_what_completed);
    return lt_finish();
}
