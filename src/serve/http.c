/* serve/http.c — the OpenAI-compatible HTTP server (loom/server.h) on libmicrohttpd.
 *
 * Threads: libmicrohttpd serves each connection on its own thread (up to
 * max_connections); the model and the scheduler run on the thread inside
 * lm_server_run. A POST becomes a job of n choices (one scheduler request each). The
 * scheduler's callback, on the model thread, only queues small event records on the
 * job and signals it; the connection thread turns them into JSON or server-sent
 * events, so formatting never delays a model step. A job is shared by its connection
 * and its unfinished choices (a reference count under the job's lock) and freed by
 * whichever lets go last.
 *
 * Disconnects: while a connection waits for tokens it polls its socket; a closed peer
 * cancels the job's choices, whose slots are free at the next step.
 */
#include "serve/http.h"
#include "loom/trace.h"

#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

/* ---- metrics -------------------------------------------------------------------------- */
static const double TTFT_BOUNDS[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double ITL_BOUNDS[] = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
static const double E2E_BOUNDS[] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
#define NB(a) ((int)(sizeof(a) / sizeof(a[0])))

typedef struct histogram {
    const char *name, *help;
    const double *bounds;
    int n;
    int64_t counts[16]; /* per bound, not cumulative; [n] = over the last bound */
    double sum;
    int64_t total;
} histogram;

static void hist_add(histogram *h, double v) {
    int i = 0;
    while (i < h->n && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->total++;
}

/* ---- jobs ------------------------------------------------------------------------------ */
typedef struct event {
    int choice;
    lm_serve_event_kind kind;
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_ids[LM_SERVE_MAX_TOP_LOGPROBS];
    float top_logprobs[LM_SERVE_MAX_TOP_LOGPROBS];
    char *text; /* lm__alloc'd copy, NUL-terminated */
    size_t len;
    lm_finish_reason reason;
    lm_status status;
    int64_t prompt_tokens, completion_tokens;
} event;

typedef struct job job;
typedef struct choice {
    job *j;
    int index;
    int64_t request;
    int finished;
    double last_token; /* for inter-token latency */
    int64_t tokens;
} choice;

struct job {
    lm_server *srv;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    lm__oai_request req;
    int32_t *prompt;
    size_t n_prompt;
    choice ch[LM__OAI_MAX_N];
    int n_choices, finished;
    event *q; /* [nq] queued events, consumed from qhead */
    int64_t nq, qhead, cap_q;
    int disconnected, cancelled;
    int fd; /* the client's socket */
    double submitted;
    char id[48];
    long long created;
    /* streaming state (connection thread) */
    char *out;
    size_t out_len, out_off;
    int64_t cap_out;
    int role_sent[LM__OAI_MAX_N];
    int done_sent;
    double last_sent; /* lm_scheduler_now() when the headers or bytes last went out (keep-alive comments) */
    int64_t prompt_tokens, completion_tokens;
    int error; /* a choice ended with LM_FINISH_ERROR */
    char error_message[256];
};

typedef struct conn_state {
    char *body;
    size_t len;
    int64_t cap;
    int too_big;
} conn_state;

struct lm_server {
    const lm_model *m;
    lm_tokenizer *tok;
    lm_chat_template *chat; /* NULL: chat requests are refused */
    char *chat_error;       /* why the template is missing or unusable */
    lm_scheduler *sched;
    lm_server_options o;
    char name[256], host[64], *api_key;
    int32_t bos; /* prepended to completion prompts, or -1 */
    int64_t context;
    struct MHD_Daemon *d;
    int port;
    volatile sig_atomic_t stop;
    int stopping;  /* set by the model thread; connections read it */
    int admitting; /* generation handlers between their shutdown check and their submission */
    int jobs;      /* jobs alive (a connection may still be writing one out) */
    long long started;
    pthread_mutex_t mmu; /* metrics */
    int64_t http_count[2][6]; /* [completions, chat] x [200, 400, 404/401/405/413, 429, 500, 503] */
    int64_t other_requests;
    histogram ttft, itl, e2e;
    int64_t prompt_tokens, completion_tokens;
};

static void job_release(job *j); /* drops one reference (the caller holds none of the job's lock) */

static int on_event(void *user, const lm_serve_event *ev) {
    choice *c = user;
    job *j = c->j;
    lm_server *s = j->srv;
    double now = lm_scheduler_now();
    pthread_mutex_lock(&s->mmu);
    if (ev->kind == LM_SERVE_TOKEN) {
        if (c->tokens == 0) hist_add(&s->ttft, now - j->submitted);
        else hist_add(&s->itl, now - c->last_token);
    } else {
        hist_add(&s->e2e, now - j->submitted);
        s->prompt_tokens += ev->prompt_tokens;
        s->completion_tokens += ev->completion_tokens;
    }
    pthread_mutex_unlock(&s->mmu);
    if (ev->kind == LM_SERVE_TOKEN) c->tokens++, c->last_token = now;
    event e;
    memset(&e, 0, sizeof e);
    e.choice = c->index;
    e.kind = ev->kind;
    e.id = ev->id;
    e.logprob = ev->logprob;
    e.n_top = ev->n_top;
    memcpy(e.top_ids, ev->top_ids, sizeof e.top_ids);
    memcpy(e.top_logprobs, ev->top_logprobs, sizeof e.top_logprobs);
    e.reason = ev->reason;
    e.status = ev->status;
    e.prompt_tokens = ev->prompt_tokens;
    e.completion_tokens = ev->completion_tokens;
    e.len = ev->len;
    e.text = lm__alloc(ev->len + 1, 1);
    pthread_mutex_lock(&j->mu);
    int lost = !e.text || LM__PUSH(j->q, j->nq, j->cap_q, e) != LM_OK;
    if (lost) { /* out of memory: end this choice with an error rather than drop text silently */
        lm__free(e.text);
        j->error = 1;
        snprintf(j->error_message, sizeof j->error_message, "out of memory while queueing a token");
    } else {
        memcpy(j->q[j->nq - 1].text, ev->text, ev->len);
        j->q[j->nq - 1].text[ev->len] = 0;
    }
    if (ev->kind == LM_SERVE_FINISH) {
        c->finished = 1;
        j->finished++;
        if (ev->reason == LM_FINISH_ERROR && !j->error) {
            j->error = 1;
            snprintf(j->error_message, sizeof j->error_message, "%s", ev->message);
        }
    }
    int cancel = j->disconnected || j->cancelled || lost;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (ev->kind == LM_SERVE_FINISH) job_release(j); /* the choice's reference */
    return cancel && ev->kind == LM_SERVE_TOKEN;
}

static void job_free(job *j) {
    __atomic_sub_fetch(&j->srv->jobs, 1, __ATOMIC_SEQ_CST);
    for (int64_t i = j->qhead; i < j->nq; i++) lm__free(j->q[i].text);
    lm__free(j->q);
    lm__free(j->out);
    lm__free(j->prompt);
    lm__oai_request_free(&j->req);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    lm__free(j);
}

static void job_release(job *j) {
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (last) job_free(j);
}

/* Cancels every unfinished choice (the caller holds no lock). */
static void job_cancel(job *j) {
    int64_t ids[LM__OAI_MAX_N];
    int n = 0;
    pthread_mutex_lock(&j->mu);
    j->cancelled = 1;
    for (int i = 0; i < j->n_choices; i++)
        if (!j->ch[i].finished) ids[n++] = j->ch[i].request;
    pthread_mutex_unlock(&j->mu);
    for (int i = 0; i < n; i++) lm_scheduler_cancel(j->srv->sched, ids[i]);
}

/* 1 when the peer closed its side of the connection. */
static int peer_closed(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR)) return 1;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Waits (with the job's lock held) up to 100 ms for news; marks a disconnect. */
static void job_wait_locked(job *j) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_nsec += 100 * 1000 * 1000;
    if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&j->cv, &j->mu, &t);
    if (!j->disconnected && peer_closed(j->fd)) j->disconnected = 1;
}

/* ---- JSON building ------------------------------------------------------------------- */
/* A JSON string of bytes that may hold invalid UTF-8 (a token's raw bytes): invalid
 * sequences become U+FFFD, as a lossy decode would. */
static json_t *lossy_string(const char *b, size_t n) {
    json_t *s = json_stringn(b, n);
    if (s) return s;
    char *fixed = lm__alloc(3 * n + 1, 1);
    if (!fixed) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)b[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = len > 0 && i + (size_t)len <= n;
        for (int k = 1; ok && k < len; k++) ok = ((unsigned char)b[i + k] & 0xC0) == 0x80;
        if (ok && len > 1) ok = json_stringn(b + i, (size_t)len) != NULL; /* overlong or surrogate forms */
        if (ok) {
            memcpy(fixed + o, b + i, (size_t)len);
            o += (size_t)len, i += (size_t)len;
        } else {
            memcpy(fixed + o, "\xEF\xBF\xBD", 3);
            o += 3, i++;
        }
    }
    s = json_stringn(fixed, o);
    lm__free(fixed);
    return s;
}

static json_t *token_string(const lm_server *s, int32_t id) {
    const char *b = "";
    size_t n = 0;
    if (lm_tokenizer_id_to_bytes(s->tok, id, &b, &n) != LM_OK) b = "", n = 0;
    return lossy_string(b, n);
}

static json_t *token_bytes(const lm_server *s, int32_t id) {
    const char *b = "";
    size_t n = 0;
    if (lm_tokenizer_id_to_bytes(s->tok, id, &b, &n) != LM_OK) n = 0;
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)b[i]));
    return a;
}

/* Chat logprobs entry of one token event. */
static json_t *chat_logprob(const lm_server *s, const event *e) {
    json_t *top = json_array();
    for (int k = 0; k < e->n_top; k++)
        json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", token_string(s, e->top_ids[k]), "logprob",
                                             (double)e->top_logprobs[k], "bytes", token_bytes(s, e->top_ids[k])));
    return json_pack("{s:o, s:f, s:o, s:o}", "token", token_string(s, e->id), "logprob", (double)e->logprob, "bytes",
                     token_bytes(s, e->id), "top_logprobs", top);
}

/* Completions logprobs: appends one token to {tokens, token_logprobs, top_logprobs, text_offset}. */
static void completion_logprob_add(const lm_server *s, json_t *lp, const event *e, int64_t *offset) {
    json_t *tok = token_string(s, e->id);
    json_array_append(json_object_get(lp, "tokens"), tok);
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(e->logprob));
    json_t *top = json_object();
    for (int k = 0; k < e->n_top; k++) {
        json_t *t = token_string(s, e->top_ids[k]);
        json_object_set_new(top, json_string_value(t), json_real(e->top_logprobs[k]));
        json_decref(t);
    }
    json_array_append_new(json_object_get(lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer(*offset));
    *offset += (int64_t)json_string_length(tok);
    json_decref(tok);
}

static json_t *completion_logprobs_new(void) {
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

static const char *finish_name(lm_finish_reason r) {
    switch (r) {
    case LM_FINISH_LENGTH: return "length";
    case LM_FINISH_EOS:
    case LM_FINISH_STOP: return "stop";
    case LM_FINISH_CANCELLED: return "abort";
    case LM_FINISH_ERROR: return "error";
    }
    return "stop";
}

static json_t *usage_json(const job *j) {
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)j->prompt_tokens, "completion_tokens",
                     (json_int_t)j->completion_tokens, "total_tokens", (json_int_t)(j->prompt_tokens + j->completion_tokens));
}

static json_t *envelope(const job *j, const char *object) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", j->id, "object", object, "created", (json_int_t)j->created, "model",
                     j->srv->name);
}

/* ---- responses ----------------------------------------------------------------------- */
static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *type, const char *body,
                                 size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) return send_text(c, 500, "application/json", "{\"error\":{\"message\":\"out of memory\"}}", 37);
    enum MHD_Result ok = send_text(c, status, "application/json", s, strlen(s));
    free(s);
    return ok;
}

static int status_index(unsigned status) {
    switch (status) {
    case 200: return 0;
    case 400: return 1;
    case 429: return 3;
    case 500: return 4;
    case 503: return 5;
    default: return 2;
    }
}

static void count_status(lm_server *s, int endpoint, unsigned status) {
    pthread_mutex_lock(&s->mmu);
    if (endpoint >= 0) s->http_count[endpoint][status_index(status)]++;
    else s->other_requests++;
    pthread_mutex_unlock(&s->mmu);
}

static enum MHD_Result send_error(lm_server *s, struct MHD_Connection *c, int endpoint, unsigned status,
                                  const char *message, const char *param, const char *code) {
    const char *type = status == 401 ? "authentication_error"
                       : status == 429 ? "rate_limit_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    count_status(s, endpoint, status);
    char *body = lm__oai_error_json(message, type, param, code);
    if (!body) body = lm__oai_error_json("the error message is not valid UTF-8", type, param, code);
    if (!body) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
    lm__free(body);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (status == 405) MHD_add_response_header(r, "Allow", endpoint >= 0 ? "POST" : "GET");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

/* ---- streaming --------------------------------------------------------------------------- */
static void out_append(job *j, const char *s, size_t n) {
    if (lm__reserve((void **)&j->out, &j->cap_out, (int64_t)(j->out_len + n), 1) != LM_OK) {
        lm_clear_error();
        j->disconnected = 1; /* no memory to stream: end the response */
        return;
    }
    memcpy(j->out + j->out_len, s, n);
    j->out_len += n;
}

static void out_sse(job *j, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) {
        j->disconnected = 1;
        return;
    }
    out_append(j, "data: ", 6);
    out_append(j, s, strlen(s));
    out_append(j, "\n\n", 2);
    free(s);
}

/* One queued event as an SSE chunk (with the job's lock held). */
static void stream_event(job *j, const event *e) {
    lm_server *s = j->srv;
    int chat = j->req.kind == LM__OAI_CHAT;
    if (e->kind == LM_SERVE_FINISH) {
        j->prompt_tokens = e->prompt_tokens; /* every choice has the same prompt */
        j->completion_tokens += e->completion_tokens;
    }
    if (e->kind == LM_SERVE_TOKEN && e->len == 0 && !j->req.logprobs && (!chat || j->role_sent[e->choice])) return;
    json_t *o = envelope(j, chat ? "chat.completion.chunk" : "text_completion");
    json_t *c = json_pack("{s:i}", "index", e->choice);
    json_t *text = lossy_string(e->text, e->len);
    if (chat) {
        json_t *delta = json_object();
        if (!j->role_sent[e->choice]) json_object_set_new(delta, "role", json_string("assistant")), j->role_sent[e->choice] = 1;
        if (e->len || e->kind == LM_SERVE_TOKEN) json_object_set(delta, "content", text);
        json_object_set_new(c, "delta", delta);
        json_t *lp = json_null();
        if (j->req.logprobs && e->kind == LM_SERVE_TOKEN) lp = json_pack("{s:[o]}", "content", chat_logprob(s, e));
        json_object_set_new(c, "logprobs", lp);
    } else {
        json_object_set(c, "text", text);
        json_t *lp = json_null();
        if (j->req.logprobs && e->kind == LM_SERVE_TOKEN) {
            int64_t off = 0;
            lp = completion_logprobs_new();
            completion_logprob_add(s, lp, e, &off);
        }
        json_object_set_new(c, "logprobs", lp);
    }
    json_decref(text);
    json_object_set_new(c, "finish_reason", e->kind == LM_SERVE_FINISH ? json_string(finish_name(e->reason)) : json_null());
    json_object_set_new(o, "choices", json_pack("[o]", c));
    out_sse(j, o);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    /* The connection's idle timeout counts from the last bytes sent, also while this
     * reader waits for the scheduler (a request queued behind a full batch): a quiet
     * stream sends an SSE comment line, which clients ignore, every quarter of it. */
    const double keepalive = j->srv->o.idle_timeout_s / 4;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (j->out_off < j->out_len) {
            size_t n = LM_MIN(max, j->out_len - j->out_off);
            memcpy(buf, j->out + j->out_off, n);
            j->out_off += n;
            if (j->out_off == j->out_len) j->out_off = j->out_len = 0;
            j->last_sent = lm_scheduler_now();
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)n;
        }
        if (j->disconnected) break;
        if (j->qhead < j->nq) {
            event *e = &j->q[j->qhead++];
            stream_event(j, e);
            lm__free(e->text);
            e->text = NULL;
            if (j->qhead == j->nq) j->qhead = j->nq = 0;
            continue;
        }
        if (j->finished == j->n_choices) {
            if (j->done_sent) {
                pthread_mutex_unlock(&j->mu);
                return MHD_CONTENT_READER_END_OF_STREAM;
            }
            if (j->error) {
                char *err = lm__oai_error_json(j->error_message, "server_error", NULL, NULL);
                if (err) out_append(j, "data: ", 6), out_append(j, err, strlen(err)), out_append(j, "\n\n", 2);
                lm__free(err);
            }
            if (j->req.include_usage) {
                json_t *o = envelope(j, j->req.kind == LM__OAI_CHAT ? "chat.completion.chunk" : "text_completion");
                json_object_set_new(o, "choices", json_array());
                json_object_set_new(o, "usage", usage_json(j));
                out_sse(j, o);
            }
            out_append(j, "data: [DONE]\n\n", 14);
            j->done_sent = 1;
            continue;
        }
        if (lm_scheduler_now() - j->last_sent >= keepalive) {
            static const char comment[] = ": keep-alive\n\n";
            out_append(j, comment, sizeof comment - 1);
            continue;
        }
        job_wait_locked(j);
    }
    pthread_mutex_unlock(&j->mu);
    job_cancel(j);
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_done(void *cls) { /* the response is gone: the connection lets go of the job */
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    int unfinished = j->finished < j->n_choices;
    if (unfinished) j->disconnected = 1;
    pthread_mutex_unlock(&j->mu);
    if (unfinished) job_cancel(j);
    job_release(j);
}

/* ---- non-streaming -------------------------------------------------------------------- */
/* Waits for every choice, then builds the whole response. NULL when the client left. */
static json_t *collect(job *j, unsigned *status) {
    lm_server *s = j->srv;
    int chat = j->req.kind == LM__OAI_CHAT;
    char *text[LM__OAI_MAX_N] = {0};
    size_t len[LM__OAI_MAX_N] = {0};
    int64_t cap[LM__OAI_MAX_N] = {0}, offset[LM__OAI_MAX_N] = {0};
    json_t *lp[LM__OAI_MAX_N] = {0};
    lm_finish_reason reason[LM__OAI_MAX_N] = {0};
    for (int i = 0; i < j->n_choices && j->req.logprobs; i++)
        lp[i] = chat ? json_pack("{s:[]}", "content") : completion_logprobs_new();
    pthread_mutex_lock(&j->mu);
    int oom = 0;
    for (;;) {
        while (j->qhead < j->nq) {
            event *e = &j->q[j->qhead++];
            int i = e->choice;
            if (lm__reserve((void **)&text[i], &cap[i], (int64_t)(len[i] + e->len + 1), 1) != LM_OK) oom = 1;
            else memcpy(text[i] + len[i], e->text, e->len), len[i] += e->len;
            if (e->kind == LM_SERVE_TOKEN && lp[i]) {
                if (chat) json_array_append_new(json_object_get(lp[i], "content"), chat_logprob(s, e));
                else completion_logprob_add(s, lp[i], e, &offset[i]);
            }
            if (e->kind == LM_SERVE_FINISH) {
                reason[i] = e->reason;
                j->prompt_tokens = e->prompt_tokens;
                j->completion_tokens += e->completion_tokens;
            }
            lm__free(e->text);
            e->text = NULL;
        }
        j->qhead = j->nq = 0;
        if (j->finished == j->n_choices || j->disconnected) break;
        job_wait_locked(j);
    }
    int left = j->disconnected, error = j->error;
    char message[256];
    snprintf(message, sizeof message, "%s", j->error_message);
    pthread_mutex_unlock(&j->mu);
    json_t *o = NULL;
    if (left) {
        job_cancel(j);
    } else if (error || oom) {
        *status = 500;
        char *e = lm__oai_error_json(oom ? "out of memory" : message, "server_error", NULL, NULL);
        o = e ? json_loads(e, 0, NULL) : NULL;
        lm__free(e);
    } else {
        *status = 200;
        o = envelope(j, chat ? "chat.completion" : "text_completion");
        json_t *choices = json_array();
        for (int i = 0; i < j->n_choices; i++) {
            json_t *t = lossy_string(text[i] ? text[i] : "", len[i]);
            json_t *c = chat ? json_pack("{s:i, s:{s:s, s:o}}", "index", i, "message", "role", "assistant", "content", t)
                             : json_pack("{s:i, s:o}", "index", i, "text", t);
            json_object_set(c, "logprobs", lp[i] ? lp[i] : json_null());
            json_object_set_new(c, "finish_reason", json_string(finish_name(reason[i])));
            json_array_append_new(choices, c);
        }
        json_object_set_new(o, "choices", choices);
        json_object_set_new(o, "usage", usage_json(j));
    }
    for (int i = 0; i < j->n_choices; i++) lm__free(text[i]), json_decref(lp[i]);
    return o;
}

/* ---- the POST endpoints ------------------------------------------------------------------ */
static lm_status encode_prompt(lm_server *s, job *j) {
    lm__oai_request *r = &j->req;
    if (r->prompt_ids) {
        int32_t V = (int32_t)lm_model_get_config(s->m)->vocab_size;
        for (size_t i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] >= V)
                return lm__error(LM_INVALID_ARGUMENT, "prompt token %zu is id %d, outside the vocabulary of %d", i,
                                 r->prompt_ids[i], V);
        j->prompt = r->prompt_ids, j->n_prompt = r->n_prompt_ids;
        r->prompt_ids = NULL;
        return LM_OK;
    }
    char *text = r->prompt;
    char *rendered = NULL;
    if (r->kind == LM__OAI_CHAT) {
        if (!s->chat) return lm__error(LM_INVALID_ARGUMENT, "%s", s->chat_error);
        int64_t tr = lm_trace_begin();
        lm_status st = lm_chat_template_render(s->chat, r->messages_json, r->tools_json, r->add_generation_prompt,
                                               r->template_kwargs, &rendered);
        lm_trace_end(tr, "serve", "chat template", NULL);
        if (st != LM_OK) return lm__error_context(LM_INVALID_ARGUMENT, "the chat template");
        text = rendered;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int64_t tr = lm_trace_begin();
    lm_status st = lm_tokenizer_encode(s->tok, text, strlen(text), &ids, &n);
    lm_trace_end(tr, "serve", "tokenize", NULL);
    lm_free(rendered);
    if (st != LM_OK) return lm__error_context(LM_INVALID_ARGUMENT, "the prompt");
    int bos = r->kind == LM__OAI_COMPLETION && s->bos >= 0 && !(n > 0 && ids[0] == s->bos);
    j->prompt = lm__calloc(n + (size_t)bos + 1, sizeof *j->prompt);
    if (!j->prompt) {
        lm_free(ids);
        return LM_OUT_OF_MEMORY;
    }
    if (bos) j->prompt[0] = s->bos;
    if (n) memcpy(j->prompt + bos, ids, n * sizeof *ids);
    j->n_prompt = n + (size_t)bos;
    lm_free(ids);
    if (j->n_prompt == 0) return lm__error(LM_INVALID_ARGUMENT, "the prompt is empty");
    return LM_OK;
}

static uint64_t fresh_seed(void) {
    static uint64_t counter;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    uint64_t x = (uint64_t)t.tv_nsec ^ ((uint64_t)t.tv_sec << 30) ^ (__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull);
    x ^= x >> 31;
    return x * 0xBF58476D1CE4E5B9ull;
}

static enum MHD_Result generate(lm_server *s, struct MHD_Connection *c, int endpoint, conn_state *cs, int *admitted);

/* The model thread leaves its loop only when no handler is between the shutdown check
 * and its submission (`admitting`), so no request is submitted after it stopped stepping. */
static enum MHD_Result handle_generate(lm_server *s, struct MHD_Connection *c, int endpoint, conn_state *cs) {
    if (lm_trace_enabled()) lm_trace_thread_name("http connection");
    __atomic_add_fetch(&s->admitting, 1, __ATOMIC_SEQ_CST);
    int admitted = 0;
    if (__atomic_load_n(&s->stopping, __ATOMIC_SEQ_CST)) {
        __atomic_sub_fetch(&s->admitting, 1, __ATOMIC_SEQ_CST);
        return send_error(s, c, endpoint, 503, "the server is shutting down", NULL, NULL);
    }
    enum MHD_Result ok = generate(s, c, endpoint, cs, &admitted);
    if (!admitted) __atomic_sub_fetch(&s->admitting, 1, __ATOMIC_SEQ_CST);
    return ok;
}

static enum MHD_Result generate(lm_server *s, struct MHD_Connection *c, int endpoint, conn_state *cs, int *admitted) {
    if (cs->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body exceeds %zu bytes", s->o.max_body_bytes);
        return send_error(s, c, endpoint, 413, msg, NULL, NULL);
    }
    job *j = lm__calloc(1, sizeof *j);
    if (!j) return send_error(s, c, endpoint, 500, "out of memory", NULL, NULL);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    __atomic_add_fetch(&s->jobs, 1, __ATOMIC_SEQ_CST);
    j->srv = s;
    j->refs = 1;
    j->fd = -1;
    char param[64];
    lm_status st = lm__oai_parse(cs->body ? cs->body : "", cs->len, endpoint ? LM__OAI_CHAT : LM__OAI_COMPLETION, &j->req,
                                 param, sizeof param);
    enum MHD_Result ok;
    if (st != LM_OK) {
        ok = send_error(s, c, endpoint, st == LM_OUT_OF_MEMORY ? 500 : 400, lm_last_error(), param, NULL);
        job_release(j);
        return ok;
    }
    lm__oai_request *r = &j->req;
    if (r->model && strcmp(r->model, s->name) != 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "The model '%.200s' does not exist (this server serves '%.150s')", r->model, s->name);
        ok = send_error(s, c, endpoint, 404, msg, "model", "model_not_found");
        job_release(j);
        return ok;
    }
    if ((st = encode_prompt(s, j)) != LM_OK) {
        ok = send_error(s, c, endpoint, st == LM_OUT_OF_MEMORY ? 500 : 400, lm_last_error(),
                        endpoint ? "messages" : "prompt", NULL);
        job_release(j);
        return ok;
    }
    if (r->params.max_tokens < 0) r->params.max_tokens = endpoint ? s->context - (int64_t)j->n_prompt : 16;
    if ((int64_t)j->n_prompt + r->params.max_tokens > s->context || r->params.max_tokens < 1) {
        char msg[300];
        snprintf(msg, sizeof msg,
                 "This model's maximum context length is %lld tokens. However, you requested %lld tokens (%zu in the %s, "
                 "%lld for the completion).",
                 (long long)s->context, (long long)((int64_t)j->n_prompt + LM_MAX(r->params.max_tokens, 0)), j->n_prompt,
                 endpoint ? "messages" : "prompt", (long long)r->params.max_tokens);
        ok = send_error(s, c, endpoint, 400, msg, "max_tokens", "context_length_exceeded");
        job_release(j);
        return ok;
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->created = (long long)time(NULL);
    snprintf(j->id, sizeof j->id, "%s-%016llx", endpoint ? "chatcmpl" : "cmpl", (unsigned long long)fresh_seed());
    j->submitted = lm_scheduler_now();
    int explicit_seed = r->params.sampler.seed != 0;
    uint64_t base = explicit_seed ? r->params.sampler.seed : fresh_seed();
    /* every choice holds a reference until its FINISH event */
    j->n_choices = r->n;
    j->refs += r->n;
    for (int i = 0; i < r->n; i++) {
        lm_serve_params p = r->params;
        p.sampler.seed = base + (uint64_t)i;
        j->ch[i].j = j, j->ch[i].index = i;
        st = lm_scheduler_submit(s->sched, j->prompt, j->n_prompt, &p, on_event, &j->ch[i], &j->ch[i].request);
        if (st != LM_OK) { /* drop the choices never submitted; cancel those that were */
            pthread_mutex_lock(&j->mu);
            j->refs -= r->n - i;
            j->n_choices = i;
            pthread_mutex_unlock(&j->mu);
            job_cancel(j);
            unsigned code = st == LM_UNSUPPORTED ? 429 : st == LM_OUT_OF_MEMORY ? 500 : 400;
            ok = send_error(s, c, endpoint, code, lm_last_error(), NULL, NULL);
            job_release(j);
            return ok;
        }
    }
    __atomic_sub_fetch(&s->admitting, 1, __ATOMIC_SEQ_CST); /* submitted: the scheduler sees it now */
    *admitted = 1;
    if (r->stream) {
        j->last_sent = lm_scheduler_now(); /* the headers go out now (only this connection's reader reads it) */
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, j, stream_done);
        if (!resp) { /* the connection's reference is dropped by hand */
            job_cancel(j);
            job_release(j);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        count_status(s, endpoint, 200);
        ok = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return ok;
    }
    unsigned status = 200;
    json_t *o = collect(j, &status);
    if (!o) {
        job_release(j);
        return MHD_NO; /* the client left */
    }
    count_status(s, endpoint, status);
    ok = send_json(c, status, o);
    job_release(j);
    return ok;
}

/* ---- the GET endpoints ------------------------------------------------------------------- */
static enum MHD_Result handle_models(lm_server *s, struct MHD_Connection *c) {
    count_status(s, -1, 200);
    return send_json(c, 200,
                     json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:I}]}", "object", "list", "data", "id", s->name, "object",
                               "model", "created", (json_int_t)s->started, "owned_by", "loom", "max_model_len",
                               (json_int_t)s->context));
}

static void metric(char **buf, size_t *len, int64_t *cap, const char *fmt, ...) LM__PRINTF(4, 5);
static void metric(char **buf, size_t *len, int64_t *cap, const char *fmt, ...) {
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap); /* measured first: lines of any length */
    va_end(ap);
    if (n >= 0 && lm__reserve((void **)buf, cap, (int64_t)(*len + (size_t)n + 1), 1) == LM_OK) {
        vsnprintf(*buf + *len, (size_t)n + 1, fmt, again);
        *len += (size_t)n;
    }
    va_end(again);
}

static void metric_hist(char **b, size_t *n, int64_t *cap, const histogram *h) {
    metric(b, n, cap, "# HELP %s %s\n# TYPE %s histogram\n", h->name, h->help, h->name);
    int64_t cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->counts[i];
        metric(b, n, cap, "%s_bucket{le=\"%g\"} %lld\n", h->name, h->bounds[i], (long long)cum);
    }
    metric(b, n, cap, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.6f\n%s_count %lld\n", h->name, (long long)h->total, h->name,
           h->sum, h->name, (long long)h->total);
}

static enum MHD_Result handle_metrics(lm_server *s, struct MHD_Connection *c) {
    lm_sched_stats st;
    lm_scheduler_stats_get(s->sched, &st);
    char *b = NULL;
    size_t n = 0;
    int64_t cap = 0;
    static const char *codes[6] = {"200", "400", "4xx", "429", "500", "503"};
    static const char *eps[2] = {"completions", "chat_completions"};
    pthread_mutex_lock(&s->mmu);
    metric(&b, &n, &cap, "# HELP loom_http_requests_total Generation requests answered, by endpoint and status.\n"
                         "# TYPE loom_http_requests_total counter\n");
    for (int e = 0; e < 2; e++)
        for (int k = 0; k < 6; k++)
            metric(&b, &n, &cap, "loom_http_requests_total{endpoint=\"%s\",status=\"%s\"} %lld\n", eps[e], codes[k],
                   (long long)s->http_count[e][k]);
    metric(&b, &n, &cap, "# HELP loom_prompt_tokens_total Prompt tokens of finished requests.\n"
                         "# TYPE loom_prompt_tokens_total counter\nloom_prompt_tokens_total %lld\n",
           (long long)s->prompt_tokens);
    metric(&b, &n, &cap, "# HELP loom_generation_tokens_total Tokens generated by finished requests.\n"
                         "# TYPE loom_generation_tokens_total counter\nloom_generation_tokens_total %lld\n",
           (long long)s->completion_tokens);
    metric_hist(&b, &n, &cap, &s->ttft);
    metric_hist(&b, &n, &cap, &s->itl);
    metric_hist(&b, &n, &cap, &s->e2e);
    pthread_mutex_unlock(&s->mmu);
    metric(&b, &n, &cap,
           "# HELP loom_requests_finished_total Scheduler requests (choices) finished, by outcome.\n"
           "# TYPE loom_requests_finished_total counter\n"
           "loom_requests_finished_total{outcome=\"completed\"} %lld\n"
           "loom_requests_finished_total{outcome=\"cancelled\"} %lld\n"
           "loom_requests_finished_total{outcome=\"failed\"} %lld\n"
           "# HELP loom_requests_rejected_total Requests refused at submission (queue full or too long).\n"
           "# TYPE loom_requests_rejected_total counter\nloom_requests_rejected_total %lld\n",
           (long long)(st.finished - st.cancelled - st.failed), (long long)st.cancelled, (long long)st.failed,
           (long long)st.rejected);
    metric(&b, &n, &cap,
           "# HELP loom_queue_length Requests waiting for a slot.\n# TYPE loom_queue_length gauge\nloom_queue_length %lld\n"
           "# HELP loom_requests_running Requests holding a slot.\n# TYPE loom_requests_running gauge\n"
           "loom_requests_running %lld\n",
           (long long)st.pending, (long long)st.running);
    metric(&b, &n, &cap,
           "# HELP loom_kv_slots_used KV-cache slots (sequences) in use.\n# TYPE loom_kv_slots_used gauge\n"
           "loom_kv_slots_used %lld\n# HELP loom_kv_slots_free KV-cache slots free.\n# TYPE loom_kv_slots_free gauge\n"
           "loom_kv_slots_free %lld\n# HELP loom_kv_tokens_reserved KV-cache positions reserved by running requests.\n"
           "# TYPE loom_kv_tokens_reserved gauge\nloom_kv_tokens_reserved %lld\n"
           "# HELP loom_kv_tokens_capacity KV-cache positions in all.\n# TYPE loom_kv_tokens_capacity gauge\n"
           "loom_kv_tokens_capacity %lld\n",
           (long long)st.slots_used, (long long)(st.slots_total - st.slots_used), (long long)st.kv_tokens_used,
           (long long)st.kv_tokens_capacity);
    if (st.kv_blocks_total)
        metric(&b, &n, &cap,
               "# HELP loom_kv_blocks_used Paged KV-cache blocks held by requests.\n# TYPE loom_kv_blocks_used gauge\n"
               "loom_kv_blocks_used %lld\n# HELP loom_kv_blocks_free Paged KV-cache blocks no request holds.\n"
               "# TYPE loom_kv_blocks_free gauge\nloom_kv_blocks_free %lld\n"
               "# HELP loom_kv_blocks_cached Blocks registered for prefix reuse (held or not).\n"
               "# TYPE loom_kv_blocks_cached gauge\nloom_kv_blocks_cached %lld\n"
               "# HELP loom_prefix_cache_query_tokens_total Prompt tokens looked up in the prefix cache.\n"
               "# TYPE loom_prefix_cache_query_tokens_total counter\nloom_prefix_cache_query_tokens_total %lld\n"
               "# HELP loom_prefix_cache_hit_tokens_total Prompt tokens found cached (not computed).\n"
               "# TYPE loom_prefix_cache_hit_tokens_total counter\nloom_prefix_cache_hit_tokens_total %lld\n"
               "# HELP loom_prefix_cache_hit_rate Hit tokens over query tokens so far.\n"
               "# TYPE loom_prefix_cache_hit_rate gauge\nloom_prefix_cache_hit_rate %.6f\n"
               "# HELP loom_preemptions_total Requests preempted for blocks (recomputed later).\n"
               "# TYPE loom_preemptions_total counter\nloom_preemptions_total %lld\n",
               (long long)st.kv_blocks_used, (long long)(st.kv_blocks_total - st.kv_blocks_used),
               (long long)st.kv_blocks_cached, (long long)st.prefix_query_tokens, (long long)st.prefix_hit_tokens,
               st.prefix_query_tokens ? (double)st.prefix_hit_tokens / (double)st.prefix_query_tokens : 0.0,
               (long long)st.preemptions);
    metric(&b, &n, &cap,
           "# HELP loom_model_steps_total Model steps run, by kind.\n# TYPE loom_model_steps_total counter\n"
           "loom_model_steps_total{kind=\"prefill\"} %lld\nloom_model_steps_total{kind=\"decode\"} %lld\n",
           (long long)st.prefill_steps, (long long)st.decode_steps);
    count_status(s, -1, 200);
    enum MHD_Result ok = b ? send_text(c, 200, "text/plain; version=0.0.4", b, n) : MHD_NO;
    lm__free(b);
    return ok;
}

/* ---- routing --------------------------------------------------------------------------- */
static int authorized(const lm_server *s, struct MHD_Connection *c) {
    if (!s->api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    const char *k = h + 7, *want = s->api_key;
    size_t a = strlen(k), b = strlen(want);
    unsigned diff = (unsigned)(a ^ b); /* compare every byte: no early exit on the first mismatch */
    for (size_t i = 0; i < b; i++) diff |= (unsigned)(want[i] ^ (i < a ? k[i] : 0));
    return diff == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    lm_server *s = cls;
    conn_state *cs = *con_cls;
    if (!cs) { /* the headers: set up the body buffer, refuse an announced oversize body early */
        if (!(cs = lm__calloc(1, sizeof *cs))) return MHD_NO;
        *con_cls = cs;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body_bytes) cs->too_big = 1;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cs->too_big && cs->len + *upload_size > s->o.max_body_bytes) cs->too_big = 1;
        if (!cs->too_big) {
            if (lm__reserve((void **)&cs->body, &cs->cap, (int64_t)(cs->len + *upload_size + 1), 1) != LM_OK) return MHD_NO;
            memcpy(cs->body + cs->len, upload, *upload_size);
            cs->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    int post = !strcmp(method, "POST"), get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    int endpoint = !strcmp(url, "/v1/completions") ? 0 : !strcmp(url, "/v1/chat/completions") ? 1 : -1;
    if (!strncmp(url, "/v1/", 4) && !authorized(s, c))
        return send_error(s, c, endpoint, 401, "a valid API key is required (Authorization: Bearer KEY)", NULL,
                          "invalid_api_key");
    if (endpoint >= 0) {
        if (!post) return send_error(s, c, endpoint, 405, "use POST on this path", NULL, NULL);
        return handle_generate(s, c, endpoint, cs);
    }
    int known = !strcmp(url, "/v1/models") || !strcmp(url, "/health") || !strcmp(url, "/metrics") || !strcmp(url, "/");
    if (known && !get) return send_error(s, c, -1, 405, "use GET on this path", NULL, NULL);
    if (!strcmp(url, "/v1/models")) return handle_models(s, c);
    if (!strcmp(url, "/metrics")) return handle_metrics(s, c);
    if (!strcmp(url, "/health")) {
        count_status(s, -1, s->stopping ? 503 : 200);
        return s->stopping ? send_text(c, 503, "application/json", "{\"status\":\"stopping\"}", 21)
                           : send_text(c, 200, "application/json", "{\"status\":\"ok\"}", 15);
    }
    if (!strcmp(url, "/")) {
        size_t n = 0;
        const char *page = lm__serve_page(&n);
        count_status(s, -1, 200);
        return send_text(c, 200, "text/html; charset=utf-8", page, n);
    }
    char msg[300];
    snprintf(msg, sizeof msg, "no such path: %.200s", url);
    return send_error(s, c, -1, 404, msg, NULL, "not_found");
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    conn_state *cs = *con_cls;
    if (!cs) return;
    lm__free(cs->body);
    lm__free(cs);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = 0;
    lm__log(LM_LOG_DEBUG, "http: %s", line);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */
void lm_server_options_default(lm_server_options *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->max_body_bytes = 4u << 20;
    o->max_connections = 512;
    o->idle_timeout_s = 30;
    o->shutdown_grace_s = 10;
    o->prepend_bos = -1;
    lm_sched_options_default(&o->sched);
}

static int64_t largest_context(const lm_model *m, const lm_sched_options *o) {
    switch (o->kind) {
    case LM_SCHED_REFERENCE: return o->context ? o->context : lm_model_get_config(m)->max_position_embeddings;
    case LM_SCHED_CONTINUOUS: return o->context;
    case LM_SCHED_BUCKETED: return o->bucket_context[o->n_buckets - 1];
    }
    return 0;
}

lm_status lm_server_create(const lm_model *m, const char *model_dir, const lm_server_options *o, lm_server **out) {
    if (!m || !model_dir || !o || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_server_create: NULL argument");
    *out = NULL;
    if (o->port < 0 || o->port > 65535) return lm__error(LM_INVALID_ARGUMENT, "server: port %d outside [0, 65535]", o->port);
    if (o->max_connections < 1 || o->max_body_bytes < 64 || !(o->idle_timeout_s > 0) || !(o->shutdown_grace_s >= 0))
        return lm__error(LM_INVALID_ARGUMENT, "server: bad limits (connections %d, body %zu bytes, idle %g s, grace %g s)",
                         o->max_connections, o->max_body_bytes, o->idle_timeout_s, o->shutdown_grace_s);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)o->port);
    const char *host = o->host ? o->host : "127.0.0.1";
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1)
        return lm__error(LM_INVALID_ARGUMENT, "server: '%s' is not an IPv4 address (e.g. 127.0.0.1 or 0.0.0.0)", host);
    lm_server *s = lm__calloc(1, sizeof *s);
    if (!s) return LM_OUT_OF_MEMORY;
    s->m = m;
    s->o = *o;
    s->bos = -1;
    s->started = (long long)time(NULL);
    pthread_mutex_init(&s->mmu, NULL);
    s->ttft = (histogram){"loom_time_to_first_token_seconds", "Submission to first token, per choice.", TTFT_BOUNDS,
                          NB(TTFT_BOUNDS), {0}, 0, 0};
    s->itl = (histogram){"loom_inter_token_latency_seconds", "Gap between successive tokens of a choice.", ITL_BOUNDS,
                         NB(ITL_BOUNDS), {0}, 0, 0};
    s->e2e = (histogram){"loom_request_latency_seconds", "Submission to finish, per choice.", E2E_BOUNDS, NB(E2E_BOUNDS),
                         {0}, 0, 0};
    snprintf(s->host, sizeof s->host, "%s", host);
    lm_status st = LM_OK;
    if (o->model_name && o->model_name[0]) {
        snprintf(s->name, sizeof s->name, "%s", o->model_name);
    } else { /* the directory's last component */
        size_t n = strlen(model_dir);
        while (n > 1 && model_dir[n - 1] == '/') n--;
        size_t b = n;
        while (b > 0 && model_dir[b - 1] != '/') b--;
        snprintf(s->name, sizeof s->name, "%.*s", (int)(n - b), model_dir + b);
    }
    if (o->api_key && !(s->api_key = lm__strdup(o->api_key))) st = LM_OUT_OF_MEMORY;
    s->context = largest_context(m, &o->sched);
    if (st == LM_OK) st = lm__serve_load_text(model_dir, s->m, o->prepend_bos, &s->tok, &s->chat, &s->chat_error, &s->bos);
    if (st == LM_OK) st = lm_scheduler_create(m, s->tok, &o->sched, &s->sched);
    if (st == LM_OK) {
        s->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                                    MHD_USE_ERROR_LOG,
                                0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                                MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
                                (unsigned)(o->idle_timeout_s + 0.999), MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u,
                                MHD_OPTION_END);
        if (!s->d) st = lm__error(LM_IO_ERROR, "server: cannot listen on %s:%d (%s)", host, o->port, strerror(errno));
    }
    if (st == LM_OK) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
        s->port = di ? di->port : o->port;
    }
    if (st != LM_OK) {
        lm_server_destroy(s);
        return st;
    }
    *out = s;
    return LM_OK;
}

int lm_server_port(const lm_server *s) { return s ? s->port : 0; }
const char *lm_server_model_name(const lm_server *s) { return s ? s->name : ""; }

void lm_server_stop(lm_server *s) {
    if (s) s->stop = 1;
}

lm_status lm_server_run(lm_server *s, lm_ctx *ctx) {
    if (!s || !ctx) return lm__error(LM_INVALID_ARGUMENT, "lm_server_run: NULL argument");
    double stop_at = 0;
    int cancelled = 0;
    lm_trace_thread_name("scheduler");
    for (;;) {
        if (s->stop && !s->stopping) {
            __atomic_store_n(&s->stopping, 1, __ATOMIC_SEQ_CST);
            MHD_socket listener = MHD_quiesce_daemon(s->d); /* no new connections */
            if (listener != MHD_INVALID_SOCKET) close(listener);
            stop_at = lm_scheduler_now();
            lm__log(LM_LOG_INFO, "server: stopping; in-flight requests have %.1f s to finish", s->o.shutdown_grace_s);
        }
        if (s->stopping) {
            /* admitting first: a handler that starts after this read sees `stopping` and
             * refuses; one that started before has submitted by the time it reads 0 */
            int admitting = __atomic_load_n(&s->admitting, __ATOMIC_SEQ_CST);
            lm_sched_stats st;
            lm_scheduler_stats_get(s->sched, &st);
            if (st.pending + st.running == 0 && admitting == 0) break;
            if (!cancelled && lm_scheduler_now() - stop_at > s->o.shutdown_grace_s) {
                lm__scheduler_cancel_all(s->sched);
                cancelled = 1;
            }
        }
        if (!lm_scheduler_wait(s->sched, 0.05)) continue;
        int busy = 0;
        LM_TRY(lm_scheduler_step(s->sched, ctx, &busy));
    }
    /* every request has finished; let the connections write out what they hold (bounded:
     * a client that stopped reading is cut off when the daemon stops) */
    for (int i = 0; i < 200 && __atomic_load_n(&s->jobs, __ATOMIC_SEQ_CST) > 0; i++) {
        struct timespec t = {0, 25 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
    return LM_OK;
}

void lm_server_destroy(lm_server *s) {
    if (!s) return;
    if (s->d) MHD_stop_daemon(s->d); /* joins the connection threads */
    lm_scheduler_destroy(s->sched);
    lm_chat_template_destroy(s->chat);
    lm__free(s->chat_error);
    lm_tokenizer_destroy(s->tok);
    lm__free(s->api_key);
    pthread_mutex_destroy(&s->mmu);
    lm__free(s);
}
