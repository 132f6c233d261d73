/* tests/serve/serve_test.h — what the server tests share: a model directory (the
 * test checkpoint, the small training tokenizer, a ChatML-like template), a server on
 * a free loopback port run on its own thread, a minimal HTTP/1.1 client, SSE parsing,
 * /metrics reads and a barrage of hostile requests. Included by one test file each.
 */
#ifndef LOOM_TESTS_SERVE_TEST_H
#define LOOM_TESTS_SERVE_TEST_H

#include "harness.h"
#include "loom/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SRC LOOM_SOURCE_DIR "/tests/data/models/qwen3_headdim"
#ifndef DIR
#define DIR LOOM_BINARY_DIR "/serve_http_model"
#endif

static lm_model *g_model;
static lm_server *g_srv;
static int g_port;
static pthread_t g_thread;
static lm_status g_run_status;

/* A model directory: the test checkpoint, the small training tokenizer and a ChatML
 * template. */
static inline void make_model_dir(void) {
    mkdir(DIR, 0755);
    unlink(DIR "/config.json"), unlink(DIR "/model.safetensors"), unlink(DIR "/tokenizer.json");
    LT_CHECK(symlink(SRC "/config.json", DIR "/config.json") == 0);
    LT_CHECK(symlink(SRC "/model.safetensors", DIR "/model.safetensors") == 0);
    LT_CHECK(symlink(LOOM_SOURCE_DIR "/tests/data/train/tokenizer.json", DIR "/tokenizer.json") == 0);
    FILE *f = fopen(DIR "/tokenizer_config.json", "w");
    LT_CHECK(f != NULL);
    fputs("{\"chat_template\": \"{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\\n{% endfor %}"
          "{% if add_generation_prompt %}<assistant>{% endif %}\"}\n",
          f);
    fclose(f);
}

static inline void *run_server(void *arg) {
    lm_ctx *ctx = NULL;
    g_run_status = lm_ctx_create(lm_device_cpu(), 1, &ctx);
    if (g_run_status == LM_OK) g_run_status = lm_server_run(arg, ctx);
    lm_ctx_destroy(ctx);
    return NULL;
}

static inline void start_paged(const char *api_key, int slots, int paged) {
    lm_server_options o;
    lm_server_options_default(&o);
    o.port = 0;
    o.api_key = api_key;
    o.model_name = "tiny";
    o.max_body_bytes = 64 * 1024;
    o.idle_timeout_s = 2;
    o.sched.slots = slots;
    o.sched.context = 1024;
    o.sched.paged = paged, o.sched.block_size = 8;
    LT_CHECK_OK(lm_server_create(g_model, DIR, &o, &g_srv));
    g_port = lm_server_port(g_srv);
    LT_CHECK(g_port > 0);
    pthread_create(&g_thread, NULL, run_server, g_srv);
}

static inline void start(const char *api_key, int slots) { start_paged(api_key, slots, 0); }

static inline void stop(void) {
    lm_server_stop(g_srv);
    pthread_join(g_thread, NULL);
    LT_CHECK_OK(g_run_status);
    lm_server_destroy(g_srv);
    g_srv = NULL;
}

/* ---- a minimal HTTP client --------------------------------------------------------------- */
static inline int dial(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)g_port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static inline void send_all(int fd, const char *b, size_t n) {
    while (n) {
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
        if (k <= 0) return;
        b += k, n -= (size_t)k;
    }
}

typedef struct response {
    int status;
    char *raw; /* headers + body */
    size_t len;
    char *body; /* into raw; chunked framing removed */
    size_t body_len;
} response;

static inline void response_free(response *r) { free(r->raw); }

/* Case-insensitive strstr (header names). */
static inline char *find_ci(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (const char *p = hay; *p; p++) {
        size_t i = 0;
        while (i < n && p[i] && tolower((unsigned char)p[i]) == tolower((unsigned char)needle[i])) i++;
        if (i == n) return (char *)p;
    }
    return NULL;
}

/* Removes chunked transfer framing in place. */
static inline void unchunk(response *r) {
    char *in = r->body, *out = r->body, *end = r->raw + r->len;
    while (in < end) {
        char *nl = strstr(in, "\r\n");
        if (!nl) break;
        size_t n = strtoul(in, NULL, 16);
        in = nl + 2;
        if (n == 0 || in + n > end) break;
        memmove(out, in, n);
        out += n, in += n + 2;
    }
    *out = 0;
    r->body_len = (size_t)(out - r->body);
}

/* Sends a request (Connection: close) and reads the whole response. */
static inline response request(const char *method, const char *path, const char *body, const char *extra_headers) {
    response r = {0};
    int fd = dial();
    if (fd < 0) return r;
    char head[1024];
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s", method, path,
                     extra_headers ? extra_headers : "");
    if (body) n += snprintf(head + n, sizeof head - (size_t)n, "Content-Type: application/json\r\nContent-Length: %zu\r\n", strlen(body));
    n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
    send_all(fd, head, (size_t)n);
    if (body) send_all(fd, body, strlen(body));
    size_t cap = 4096;
    r.raw = malloc(cap);
    for (;;) {
        if (r.len + 1024 > cap) r.raw = realloc(r.raw, cap *= 2);
        ssize_t k = recv(fd, r.raw + r.len, cap - r.len - 1, 0);
        if (k <= 0) break;
        r.len += (size_t)k;
    }
    close(fd);
    r.raw[r.len] = 0;
    sscanf(r.raw, "HTTP/1.%*d %d", &r.status);
    char *b = strstr(r.raw, "\r\n\r\n");
    r.body = b ? b + 4 : r.raw + r.len;
    r.body_len = (size_t)(r.raw + r.len - r.body);
    if (find_ci(r.raw, "Transfer-Encoding: chunked") && find_ci(r.raw, "Transfer-Encoding: chunked") < r.body) unchunk(&r);
    return r;
}

static inline json_t *body_json(const response *r) { return json_loadb(r->body, r->body_len, JSON_ALLOW_NUL, NULL); }

static inline const char *error_param(json_t *o) { return json_string_value(json_object_get(json_object_get(o, "error"), "param")); }

/* Concatenated "text" (completions) or delta content (chat) of an SSE body; *done = 1
 * when it ends with [DONE]; *usage = completion_tokens of a usage chunk (or -1). */
static inline char *sse_text(const response *r, int chat, int *done, int64_t *usage, int *chunks) {
    char *text = calloc(1, r->body_len + 1);
    size_t n = 0;
    *done = 0, *usage = -1, *chunks = 0;
    const char *p = r->body;
    while ((p = strstr(p, "data: ")) != NULL) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e) break;
        if (!strncmp(p, "[DONE]", 6)) {
            *done = 1;
            break;
        }
        json_t *o = json_loadb(p, (size_t)(e - p), JSON_ALLOW_NUL, NULL); /* random models emit NUL bytes */
        LT_CHECK_MSG(o != NULL, "an SSE event is not JSON: %.*s", (int)(e - p), p);
        if (!o) {
            FILE *f = fopen(LOOM_BINARY_DIR "/sse_fail.txt", "wb");
            if (f) fwrite(r->raw, 1, r->len, f), fclose(f);
        }
        (*chunks)++;
        json_t *c = json_array_get(json_object_get(o, "choices"), 0);
        json_t *t = chat ? json_object_get(json_object_get(c, "delta"), "content") : json_object_get(c, "text");
        if (json_is_string(t)) memcpy(text + n, json_string_value(t), json_string_length(t)), n += json_string_length(t);
        json_t *u = json_object_get(o, "usage");
        if (u) *usage = json_integer_value(json_object_get(u, "completion_tokens"));
        json_decref(o);
        p = e;
    }
    return text;
}

static inline void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static inline int64_t metric(const char *name) {
    response r = request("GET", "/metrics", NULL, NULL);
    int64_t v = -1;
    const char *p = r.body;
    size_t n = strlen(name);
    while ((p = strstr(p, name)) != NULL) {
        if ((p == r.body || p[-1] == '\n') && p[n] == ' ') {
            v = strtoll(p + n + 1, NULL, 10);
            break;
        }
        p += n;
    }
    response_free(&r);
    return v;
}

/* Polls a metric until it equals want (up to ~20 s: a bound, not a timing claim). */
static inline int wait_metric(const char *name, int64_t want) {
    for (int i = 0; i < 400; i++) {
        if (metric(name) == want) return 1;
        sleep_ms(50);
    }
    return 0;
}

typedef struct client {
    int index, ok, max_tokens;
} client;

static inline void *stream_client(void *arg) {
    client *c = arg;
    char body[256];
    snprintf(body, sizeof body,
             "{\"prompt\": [%d, 9, 10], \"max_tokens\": %d, \"ignore_eos\": true, \"stream\": true, \"temperature\": 0}",
             10 + c->index % 50, c->max_tokens ? c->max_tokens : 4 + c->index % 13);
    response r = request("POST", "/v1/completions", body, NULL);
    int done, chunks;
    int64_t usage;
    char *t = sse_text(&r, 0, &done, &usage, &chunks);
    c->ok = r.status == 200 && done;
    free(t);
    response_free(&r);
    return NULL;
}

static const char *COMPLETION = "{\"model\": \"tiny\", \"prompt\": [5, 17, 99, 200, 31], \"max_tokens\": 12, "
                                "\"temperature\": 0, \"ignore_eos\": true%s}";

static inline char *with(const char *fmt, const char *extra) {
    static char b[2048];
    snprintf(b, sizeof b, fmt, extra);
    return b;
}

/* Random and hostile requests; the server must answer each (or close it) and then
 * still serve a correct completion. */
static inline void hostile_barrage(int count) {
    lt_rng g = lt_rng_seed(99);
    static const char *fragments[] = {"{", "}", "[", "]", "\"prompt\"", ":", ",", "\"max_tokens\"", "1e999", "-1",
                                      "null", "true", "\"\\ud800\"", "\"stream\"", "\xc3\x28", "99999999999999999999999"};
    for (int i = 0; i < count; i++) {
        char body[512];
        size_t n = 0;
        int parts = (int)lt_rng_int(&g, 0, 20);
        for (int k = 0; k < parts && n < 400; k++) {
            const char *f = fragments[lt_rng_int(&g, 0, (int64_t)(sizeof fragments / sizeof *fragments) - 1)];
            size_t fl = strlen(f);
            memcpy(body + n, f, fl);
            n += fl;
        }
        body[n] = 0;
        int kind = (int)lt_rng_int(&g, 0, 3);
        if (kind == 3) { /* a partial request: headers announce more body than is sent, then close */
            int fd = dial();
            char head[800];
            int hn = snprintf(head, sizeof head, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n%s", body);
            send_all(fd, head, (size_t)hn);
            close(fd);
            continue;
        }
        response r = request(kind == 2 ? "PUT" : "POST", kind == 1 ? "/v1/chat/completions" : "/v1/completions", body, NULL);
        LT_CHECK_MSG(r.status == 0 || (r.status >= 200 && r.status < 500), "request %d got %d", i, r.status);
        if (r.status >= 400) {
            json_t *o = body_json(&r);
            LT_CHECK_MSG(o && json_object_get(o, "error"), "request %d: error body %.100s", i, r.body);
            json_decref(o);
        }
        response_free(&r);
    }
    /* a slowloris connection: a header line, then nothing; the server must keep serving */
    int slow = dial();
    send_all(slow, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n", 41);
    response r = request("POST", "/v1/completions", with(COMPLETION, ""), NULL);
    LT_CHECK(r.status == 200);
    response_free(&r);
    /* the idle timeout (2 s here) closes the slow connection */
    struct pollfd p = {slow, POLLIN, 0};
    LT_CHECK(poll(&p, 1, 10000) == 1);
    char c;
    LT_CHECK(recv(slow, &c, 1, 0) <= 0);
    close(slow);
}

#endif
