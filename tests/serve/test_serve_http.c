/* The HTTP server end to end on loopback, with a tiny random model: completions and
 * chat (JSON and server-sent events) return the scheduler's tokens, streams equal the
 * non-streamed text and end with [DONE], usage and logprobs are present, n choices,
 * every bad request gets its OpenAI error object and status (400/401/404/405/413),
 * a client that disconnects mid-stream cancels its request and frees its slot, many
 * concurrent streams all complete with the slots back to zero, a barrage of hostile
 * requests leaves the server answering correctly, /metrics reports, and a stop lets
 * in-flight requests finish.
 * LM_TEST_LABELS: unit model
 */
#include "serve_test.h"

/* ---- tests -------------------------------------------------------------------------------- */
static void test_health_models_and_paths(void) {
    response r = request("GET", "/health", NULL, NULL);
    LT_CHECK(r.status == 200 && strstr(r.body, "\"ok\""));
    response_free(&r);
    r = request("GET", "/v1/models", NULL, NULL);
    json_t *o = body_json(&r);
    LT_CHECK(r.status == 200 && o);
    LT_CHECK(!strcmp(json_string_value(json_object_get(json_array_get(json_object_get(o, "data"), 0), "id")), "tiny"));
    json_decref(o);
    response_free(&r);
    r = request("GET", "/nope", NULL, NULL);
    o = body_json(&r);
    LT_CHECK(r.status == 404 && json_object_get(o, "error"));
    json_decref(o);
    response_free(&r);
    r = request("GET", "/v1/completions", NULL, NULL);
    LT_CHECK(r.status == 405 && find_ci(r.raw, "Allow: POST"));
    response_free(&r);
    r = request("GET", "/", NULL, NULL);
    LT_CHECK(r.status == 200 && strstr(r.body, "<!doctype html>") && strstr(r.body, "/v1/chat/completions"));
    response_free(&r);
}

static void test_completion_json_and_stream(void) {
    response r = request("POST", "/v1/completions", with(COMPLETION, ""), NULL);
    json_t *o = body_json(&r);
    LT_CHECK_MSG(r.status == 200 && o, "status %d: %s", r.status, r.body);
    json_t *c = json_array_get(json_object_get(o, "choices"), 0);
    const char *text = json_string_value(json_object_get(c, "text"));
    LT_CHECK(text && !strcmp(json_string_value(json_object_get(c, "finish_reason")), "length"));
    json_t *u = json_object_get(o, "usage");
    LT_CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) == 5 &&
             json_integer_value(json_object_get(u, "completion_tokens")) == 12 &&
             json_integer_value(json_object_get(u, "total_tokens")) == 17);
    LT_CHECK(!strcmp(json_string_value(json_object_get(o, "object")), "text_completion"));
    /* the same request streamed: the same text, a usage chunk, then [DONE] */
    response s = request("POST", "/v1/completions",
                         with(COMPLETION, ", \"stream\": true, \"stream_options\": {\"include_usage\": true}"), NULL);
    LT_CHECK(s.status == 200 && find_ci(s.raw, "text/event-stream"));
    int done, chunks;
    int64_t usage;
    char *st = sse_text(&s, 0, &done, &usage, &chunks);
    LT_CHECK_MSG(text && !strcmp(st, text), "streamed '%s' vs '%s'", st, text ? text : "");
    LT_CHECK(done && usage == 12 && chunks >= 2);
    free(st);
    response_free(&s);
    json_decref(o);
    response_free(&r);
    /* logprobs with 2 alternatives, and n = 3 sampled choices with a seed */
    r = request("POST", "/v1/completions", with(COMPLETION, ", \"logprobs\": 2"), NULL);
    o = body_json(&r);
    json_t *lp = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs");
    LT_CHECK(r.status == 200 && json_array_size(json_object_get(lp, "token_logprobs")) == 12 &&
             json_array_size(json_object_get(lp, "tokens")) == 12 && json_array_size(json_object_get(lp, "top_logprobs")) == 12);
    json_decref(o);
    response_free(&r);
    r = request("POST", "/v1/completions",
                "{\"prompt\": [5, 17, 99], \"max_tokens\": 6, \"n\": 3, \"seed\": 7, \"temperature\": 1.0}", NULL);
    o = body_json(&r);
    LT_CHECK(r.status == 200 && json_array_size(json_object_get(o, "choices")) == 3 &&
             json_integer_value(json_object_get(json_object_get(o, "usage"), "completion_tokens")) == 18);
    json_decref(o);
    response_free(&r);
}

static void test_chat_json_and_stream(void) {
    const char *body = "{\"model\": \"tiny\", \"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, "
                       "{\"role\": \"user\", \"content\": \"hello there\"}], \"max_tokens\": 9, \"temperature\": 0, "
                       "\"ignore_eos\": true%s}";
    response r = request("POST", "/v1/chat/completions", with(body, ""), NULL);
    json_t *o = body_json(&r);
    LT_CHECK_MSG(r.status == 200 && o, "status %d: %s", r.status, r.body);
    json_t *m = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    const char *text = json_string_value(json_object_get(m, "content"));
    LT_CHECK(text && !strcmp(json_string_value(json_object_get(m, "role")), "assistant"));
    LT_CHECK(!strcmp(json_string_value(json_object_get(o, "object")), "chat.completion"));
    response s = request("POST", "/v1/chat/completions", with(body, ", \"stream\": true"), NULL);
    int done, chunks;
    int64_t usage;
    char *st = sse_text(&s, 1, &done, &usage, &chunks);
    LT_CHECK_MSG(text && !strcmp(st, text) && done && usage == -1, "streamed '%s' vs '%s'", st, text ? text : "");
    LT_CHECK(strstr(s.body, "\"role\":\"assistant\"") && strstr(s.body, "chat.completion.chunk"));
    free(st);
    response_free(&s);
    json_decref(o);
    response_free(&r);
    /* chat logprobs */
    r = request("POST", "/v1/chat/completions", with(body, ", \"logprobs\": true, \"top_logprobs\": 3"), NULL);
    o = body_json(&r);
    json_t *content = json_object_get(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs"), "content");
    LT_CHECK(r.status == 200 && json_array_size(content) == 9 &&
             json_array_size(json_object_get(json_array_get(content, 0), "top_logprobs")) == 3);
    json_decref(o);
    response_free(&r);
}

typedef struct bad_case {
    const char *path, *body, *headers;
    int status;
    const char *param; /* expected "param", or NULL */
} bad_case;

static void test_bad_requests(void) {
    static char big[70 * 1024];
    memset(big, 'x', sizeof big - 1);
    memcpy(big, "{\"prompt\": \"", 12);
    const bad_case cases[] = {
        {"/v1/completions", "{\"prompt\": [1, 2", NULL, 400, NULL},
        {"/v1/completions", "[1, 2]", NULL, 400, NULL},
        {"/v1/completions", "{\"prompt\": [1, 2], \"max_tokens\": \"ten\"}", NULL, 400, "max_tokens"},
        {"/v1/completions", "{\"prompt\": [1, 2], \"max_tokens\": 0}", NULL, 400, "max_tokens"},
        {"/v1/completions", "{\"prompt\": [1, 2], \"max_tokens\": 99999999999999999999}", NULL, 400, NULL},
        {"/v1/completions", "{\"prompt\": [1, 2], \"temperature\": 3}", NULL, 400, "temperature"},
        {"/v1/completions", "{\"prompt\": [1, 2], \"top_p\": 0}", NULL, 400, "top_p"},
        {"/v1/completions", "{\"prompt\": [1, 2], \"n\": 100}", NULL, 400, "n"},
        {"/v1/completions", "{\"prompt\": [1, 2], \"stop\": [1]}", NULL, 400, "stop"},
        {"/v1/completions", "{\"prompt\": [1, 2], \"echo\": true}", NULL, 400, "echo"},
        {"/v1/completions", "{\"prompt\": [1, 2], \"stream\": \"yes\"}", NULL, 400, "stream"},
        {"/v1/completions", "{\"prompt\": [1, 2], \"max_tokens\": 1023}", NULL, 400, "max_tokens"}, /* context 1024 */
        {"/v1/completions", "{\"prompt\": [1, 99999]}", NULL, 400, "prompt"},
        {"/v1/completions", "{\"prompt\": \"\\u0000\"}", NULL, 400, NULL},
        {"/v1/completions", "{\"prompt\": \"bad \xff utf-8\"}", NULL, 400, NULL},
        {"/v1/completions", "{\"max_tokens\": 3}", NULL, 400, "prompt"},
        {"/v1/completions", "{\"model\": \"other\", \"prompt\": [1]}", NULL, 404, "model"},
        {"/v1/chat/completions", "{\"messages\": []}", NULL, 400, "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"content\": \"x\"}]}", NULL, 400, "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": 3}", NULL, 400,
         "logprobs"},
        {"/v1/completions", big, NULL, 413, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const bad_case *c = &cases[i];
        response r = request("POST", c->path, c->body, c->headers);
        json_t *o = body_json(&r);
        const char *param = o ? error_param(o) : NULL;
        LT_CHECK_MSG(r.status == c->status && o && json_is_string(json_object_get(json_object_get(o, "error"), "message")),
                     "case %zu: status %d, body %.200s", i, r.status, r.body);
        if (c->param) LT_CHECK_MSG(param && !strcmp(param, c->param), "case %zu: param %s, want %s", i, param ? param : "null", c->param);
        json_decref(o);
        response_free(&r);
    }
}

static void test_api_key(void) {
    stop();
    start("sekret", 4);
    response r = request("GET", "/v1/models", NULL, NULL);
    LT_CHECK(r.status == 401);
    response_free(&r);
    r = request("GET", "/v1/models", NULL, "Authorization: Bearer wrong\r\n");
    LT_CHECK(r.status == 401);
    response_free(&r);
    r = request("GET", "/v1/models", NULL, "Authorization: Bearer sekret\r\n");
    LT_CHECK(r.status == 200);
    response_free(&r);
    r = request("GET", "/health", NULL, NULL); /* outside /v1/: open */
    LT_CHECK(r.status == 200);
    response_free(&r);
    stop();
    start(NULL, 4);
}

/* A client that leaves mid-stream cancels every choice of its request: 16 choices of
 * 1,000 tokens over 4 slots take seconds, so they cannot all finish before the
 * disconnect is seen. */
static void test_disconnect_cancels(void) {
    int64_t cancelled = metric("loom_requests_finished_total{outcome=\"cancelled\"}");
    int fd = dial();
    const char *body = "{\"prompt\": [5, 6, 7], \"max_tokens\": 1000, \"n\": 16, \"seed\": 1, \"ignore_eos\": true, "
                       "\"stream\": true}";
    char head[256];
    int n = snprintf(head, sizeof head,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     strlen(body));
    send_all(fd, head, (size_t)n);
    send_all(fd, body, strlen(body));
    char buf[512];
    LT_CHECK(recv(fd, buf, sizeof buf, 0) > 0); /* the stream started */
    close(fd);
    LT_CHECK_MSG(wait_metric("loom_requests_running", 0) && wait_metric("loom_queue_length", 0),
                 "the disconnected stream kept running");
    int64_t now = metric("loom_requests_finished_total{outcome=\"cancelled\"}");
    LT_CHECK_MSG(now >= cancelled + 12 && now <= cancelled + 16, "%lld choices cancelled", (long long)(now - cancelled));
    LT_CHECK(wait_metric("loom_kv_slots_used", 0));
}

static void test_many_concurrent_streams(void) {
    enum { N = 64 };
    pthread_t th[N];
    client cl[N];
    for (int i = 0; i < N; i++) cl[i] = (client){i, 0, 0}, pthread_create(&th[i], NULL, stream_client, &cl[i]);
    int ok = 0;
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL), ok += cl[i].ok;
    LT_CHECK_MSG(ok == N, "%d of %d streams completed", ok, N);
    LT_CHECK(wait_metric("loom_kv_slots_used", 0) && metric("loom_queue_length") == 0);
}

static void test_hostile_barrage(void) { hostile_barrage(300); }

/* The same server on a paged cache: the same greedy text as the slot cache, and
 * prompts with a common prefix find its blocks cached (/metrics). */
static void test_paged_server(void) {
    const char *body = "{\"prompt\": [5, 17, 99, 200, 31, 8, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, %d], "
                       "\"max_tokens\": 9, \"temperature\": 0, \"ignore_eos\": true}";
    char b[512];
    char *want[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) { /* the slot cache's answers */
        snprintf(b, sizeof b, body, 40 + i);
        response r = request("POST", "/v1/completions", b, NULL);
        json_t *o = body_json(&r);
        const char *t = json_string_value(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "text"));
        LT_CHECK(r.status == 200 && t);
        want[i] = strdup(t ? t : "");
        json_decref(o);
        response_free(&r);
    }
    stop();
    start_paged(NULL, 4, 1);
    for (int i = 0; i < 3; i++) {
        snprintf(b, sizeof b, body, 40 + i);
        response r = request("POST", "/v1/completions", b, NULL);
        json_t *o = body_json(&r);
        const char *t = json_string_value(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "text"));
        LT_CHECK_MSG(r.status == 200 && t && !strcmp(t, want[i]), "paged request %d: '%s' vs '%s'", i, t ? t : "", want[i]);
        json_decref(o);
        response_free(&r);
        free(want[i]);
    }
    int64_t hits = metric("loom_prefix_cache_hit_tokens_total");
    LT_CHECK_MSG(hits == 2 * 16, "%lld prompt tokens found cached", (long long)hits); /* two full blocks of 8, twice */
    /* a finished request's blocks are counted free after the step that retires it, which
     * may come after its response: wait for it */
    LT_CHECK(wait_metric("loom_kv_blocks_used", 0) && metric("loom_kv_blocks_free") > 0);
    stop();
    start(NULL, 4);
}

static void *stop_thread(void *arg) {
    (void)arg;
    stop();
    return NULL;
}

/* A stream in flight when the server is told to stop still finishes with [DONE]. */
static void test_stop_finishes_in_flight(void) {
    int fd = dial();
    const char *body = "{\"prompt\": [5, 6, 7], \"max_tokens\": 240, \"ignore_eos\": true, \"stream\": true}";
    char head[256];
    int n = snprintf(head, sizeof head,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     strlen(body));
    send_all(fd, head, (size_t)n);
    send_all(fd, body, strlen(body));
    size_t cap = 1 << 20, len = 0;
    char *raw = malloc(cap);
    ssize_t k = recv(fd, raw, cap - 1, 0); /* the stream started */
    LT_CHECK(k > 0);
    len = k > 0 ? (size_t)k : 0;
    pthread_t th;
    pthread_create(&th, NULL, stop_thread, NULL);
    while (len + 1 < cap && (k = recv(fd, raw + len, cap - 1 - len, 0)) > 0) len += (size_t)k;
    raw[len] = 0;
    close(fd);
    pthread_join(th, NULL);
    LT_CHECK_MSG(strstr(raw, "data: [DONE]") != NULL, "the in-flight stream did not end with [DONE]");
    LT_CHECK(strstr(raw, "\"finish_reason\":\"length\"") != NULL);
    free(raw);
    start(NULL, 4);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    make_model_dir();
    LT_CHECK_OK(lm_model_load(DIR, lm_device_cpu(), &g_model));
    start(NULL, 4);
    LT_RUN(test_health_models_and_paths);
    LT_RUN(test_completion_json_and_stream);
    LT_RUN(test_chat_json_and_stream);
    LT_RUN(test_bad_requests);
    LT_RUN(test_api_key);
    LT_RUN(test_disconnect_cancels);
    LT_RUN(test_many_concurrent_streams);
    LT_RUN(test_hostile_barrage);
    LT_RUN(test_paged_server);
    LT_RUN(test_stop_finishes_in_flight);
    stop();
    lm_model_destroy(g_model);
    return lt_finish();
}
