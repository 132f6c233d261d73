/* tools/loom/cmd_bench_serve.c — `loom bench serve --url http://HOST:PORT`: a load
 * generator for any OpenAI-compatible HTTP server (loom serve, vLLM, llama.cpp's
 * llama-server), printing one JSON object with throughput and latency statistics.
 *
 * Requests are planned up front from the seed (lengths, prompt seeds, arrival times),
 * so a run is reproducible whatever the concurrency. The main thread releases them at
 * their arrival times (Poisson at --rate R, or all at once); C worker threads each run
 * one request at a time over its own connection (http_client.c), so at most C are in
 * flight. A streamed request is timed per SSE event: TTFT is send (before connect) to
 * the first event carrying text, ITL the gaps between such events, E2E send to
 * [DONE]. Statistics cover completed requests only; percentiles use numpy's default
 * rule (linear interpolation between closest ranks). Ctrl-C stops submitting, cancels
 * the requests in flight and reports what completed.
 */
#include "args.h"
#include "commands.h"
#include "common.h"
#include "http_client.h"
#include "loom/tokenizer.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define CMD "bench serve"

enum {
    SPAN_MAX = 10000000,              /* largest token count a SPEC may ask for */
    ERROR_BODY_MAX = 64 * 1024,       /* bytes of an error body kept for its message */
    JSON_BODY_MAX = 64 * 1024 * 1024, /* bytes of a non-streamed response kept */
    ERRORS_SHOWN = 5,                 /* failed requests listed in the report */
    MAX_WORKERS = 1024
};

/* ---- pure helpers (unit-tested) ------------------------------------------------------ */

/* Percentile p (0..100) of x[0..n), sorted ascending, n >= 1, by numpy's default rule:
 * h = (n-1)p/100, result = x[floor h] + (h - floor h)(x[floor h + 1] - x[floor h]). */
static double percentile_sorted(const double *x, size_t n, double p) {
    double h = (double)(n - 1) * p / 100.0;
    size_t lo = (size_t)floor(h);
    if (lo + 1 >= n) return x[n - 1];
    return x[lo] + (h - (double)lo) * (x[lo + 1] - x[lo]);
}

static int cmp_seconds(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct summary {
    size_t n;
    double mean, p50, p95, p99, max;
} summary;

/* Sorts v[0..n) and summarizes it (all zero when n == 0). */
static summary summarize(double *v, size_t n) {
    summary s = {n, 0, 0, 0, 0, 0};
    if (n == 0) return s;
    qsort(v, n, sizeof *v, cmp_seconds);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    s.mean = sum / (double)n;
    s.p50 = percentile_sorted(v, n, 50);
    s.p95 = percentile_sorted(v, n, 95);
    s.p99 = percentile_sorted(v, n, 99);
    s.max = v[n - 1];
    return s;
}

typedef struct span {
    int lo, hi; /* inclusive; lo == hi for a fixed length */
} span;

/* Parses a length SPEC: "N" or "A-B" with 1 <= A <= B <= SPAN_MAX. 0, or -1 with err. */
static int parse_span(const char *text, span *s, char *err, size_t errlen) {
    long v[2] = {0, 0};
    int k = 0;
    const char *p = text;
    for (;;) {
        const char *start = p;
        long x = 0;
        while (*p >= '0' && *p <= '9' && x <= SPAN_MAX) x = x * 10 + (*p++ - '0');
        if (p == start || (*p >= '0' && *p <= '9')) break;
        v[k++] = x;
        if (*p == '-' && k == 1) {
            p++;
            continue;
        }
        if (*p == '\0') {
            if (k == 1) v[1] = v[0];
            if (v[0] >= 1 && v[0] <= v[1] && v[1] <= SPAN_MAX) {
                s->lo = (int)v[0];
                s->hi = (int)v[1];
                return 0;
            }
        }
        break;
    }
    snprintf(err, errlen, "'%s' is not a length: expected N or A-B (uniform) with 1 <= A <= B <= %d", text, SPAN_MAX);
    return -1;
}

static int span_draw(span s, lm_rng *rng) { return s.lo + (int)lm_rng_below(rng, (uint64_t)(s.hi - s.lo) + 1); }

/* The message of an OpenAI-style error body: {"error":{"message":...}}, {"error":"..."},
 * vLLM's older {"object":"error","message":...} or FastAPI's {"detail":...}; otherwise
 * the text itself (control characters as spaces, cut at 300 bytes). */
static void error_message(const char *body, size_t len, char *out, size_t size) {
    json_t *j = json_loadb(body, len, 0, NULL), *e = json_object_get(j, "error");
    const char *msg = NULL;
    char *dumped = NULL;
    if (json_is_object(e)) msg = json_string_value(json_object_get(e, "message"));
    else if (json_is_string(e)) msg = json_string_value(e);
    if (!msg) msg = json_string_value(json_object_get(j, "message"));
    if (!msg && json_object_get(j, "detail")) {
        json_t *d = json_object_get(j, "detail");
        msg = json_is_string(d) ? json_string_value(d) : (dumped = json_dumps(d, JSON_COMPACT));
    }
    if (!msg && json_is_object(e)) msg = dumped = json_dumps(e, JSON_COMPACT);
    size_t n = 0;
    if (msg) {
        snprintf(out, size, "%s", msg);
    } else {
        for (size_t i = 0; i < len && n + 1 < size && i < 300; i++) {
            unsigned char c = (unsigned char)body[i];
            out[n++] = c < 0x20 ? ' ' : (char)c;
        }
        if (n == 0 && size > 8) n = (size_t)snprintf(out, size, "(empty body)");
        out[n < size ? n : size - 1] = '\0';
    }
    free(dumped);
    json_decref(j);
}

/* ---- one response chunk ----------------------------------------------------------------
 * What a streamed chunk (or a whole non-streamed response) says: whether a choice
 * carries text (completions "text", chat "delta.content" / "delta.reasoning_content",
 * non-streamed "message.content"), whether a choice finished, and the usage. */
typedef struct chunk_info {
    int has_text, finished, has_usage;
    int64_t completion_tokens, prompt_tokens;
    const char *text; /* the first choice's text (borrowed from the JSON), or NULL */
} chunk_info;

static int nonempty(json_t *s) { return json_is_string(s) && json_string_length(s) > 0; }

static chunk_info chunk_read(json_t *j) {
    chunk_info ci = {0, 0, 0, 0, 0, NULL};
    json_t *choices = json_object_get(j, "choices"), *ch;
    size_t i;
    json_array_foreach(choices, i, ch) {
        json_t *delta = json_object_get(ch, "delta"), *msg = json_object_get(ch, "message");
        json_t *cands[] = {json_object_get(ch, "text"), json_object_get(delta, "content"),
                           json_object_get(delta, "reasoning_content"), json_object_get(msg, "content"),
                           json_object_get(msg, "reasoning_content")};
        for (size_t k = 0; k < sizeof cands / sizeof *cands; k++)
            if (nonempty(cands[k])) {
                ci.has_text = 1;
                if (!ci.text) ci.text = json_string_value(cands[k]);
            }
        if (json_is_string(json_object_get(ch, "finish_reason"))) ci.finished = 1;
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) {
        ci.has_usage = 1;
        ci.completion_tokens = json_integer_value(json_object_get(u, "completion_tokens"));
        ci.prompt_tokens = json_integer_value(json_object_get(u, "prompt_tokens"));
    }
    return ci;
}

/* ---- prompts ------------------------------------------------------------------------------ */

static const char *const WORDS[] = {
    "the",     "of",      "and",    "to",      "in",     "is",     "you",     "that",   "it",      "he",
    "was",     "for",     "on",     "are",     "as",     "with",   "his",     "they",   "at",      "be",
    "this",    "have",    "from",   "or",      "one",    "had",    "by",      "word",   "but",     "not",
    "what",    "all",     "were",   "we",      "when",   "your",   "can",     "said",   "there",   "use",
    "an",      "each",    "which",  "she",     "do",     "how",    "their",   "if",     "will",    "up",
    "other",   "about",   "out",    "many",    "then",   "them",   "these",   "so",     "some",    "her",
    "would",   "make",    "like",   "him",     "into",   "time",   "has",     "look",   "two",     "more",
    "write",   "go",      "see",    "number",  "no",     "way",    "could",   "people", "my",      "than",
    "first",   "water",   "been",   "call",    "who",    "oil",    "its",     "now",    "find",    "long",
    "down",    "day",     "did",    "get",     "come",   "made",   "may",     "part",   "over",    "new",
    "sound",   "take",    "only",   "little",  "work",   "know",   "place",   "year",   "live",    "me",
    "back",    "give",    "most",   "very",    "after",  "thing",  "our",     "just",   "name",    "good",
    "sentence", "man",    "think",  "say",     "great",  "where",  "help",    "through", "much",   "before",
    "line",    "right",   "too",    "mean",    "old",    "any",    "same",    "tell",   "boy",     "follow",
    "came",    "want",    "show",   "also",    "around", "form",   "three",   "small",  "set",     "put",
    "end",     "does",    "another", "well",   "large",  "must",   "big",     "even",   "such",    "because",
    "turn",    "here",    "why",    "ask",     "went",   "men",    "read",    "need",   "land",    "different",
    "home",    "us",      "move",   "try",     "kind",   "hand",   "picture", "again",  "change",  "off",
    "play",    "spell",   "air",    "away",    "animal", "house",  "point",   "page",   "letter",  "mother",
    "answer",  "found",   "study",  "still",   "learn",  "should", "world",   "high",   "every",   "near"};
enum { NWORDS = sizeof WORDS / sizeof *WORDS };

typedef struct text_buf {
    char *p;
    size_t len, cap;
} text_buf;

static int text_words(text_buf *t, lm_rng *rng, size_t count) {
    for (size_t i = 0; i < count; i++) {
        const char *w = WORDS[lm_rng_below(rng, NWORDS)];
        size_t wl = strlen(w);
        if (t->len + wl + 2 > t->cap) {
            size_t cap = t->cap ? 2 * t->cap : 1024;
            while (cap < t->len + wl + 2) cap *= 2;
            char *q = realloc(t->p, cap);
            if (!q) return -1;
            t->p = q;
            t->cap = cap;
        }
        if (t->len) t->p[t->len++] = ' ';
        memcpy(t->p + t->len, w, wl);
        t->len += wl;
        t->p[t->len] = '\0';
    }
    return 0;
}

/* A prompt of n random common words (about n tokens), or with a tokenizer exactly n
 * tokens: words are added until the text encodes to >= n ids, then the first n ids are
 * decoded. *tokens receives the count the text re-encodes to (n when exact; a cut inside
 * a word can re-encode differently), or n without a tokenizer. *text is malloc'd. */
static int make_prompt(const lm_tokenizer *tok, uint64_t seed, int n, char **text, int *tokens) {
    lm_rng rng;
    lm_rng_seed(&rng, seed);
    text_buf t = {NULL, 0, 0};
    if (!tok) {
        if (text_words(&t, &rng, (size_t)n) < 0) return -1;
        *text = t.p;
        *tokens = n;
        return 0;
    }
    size_t batch = (size_t)n + (size_t)n / 4 + 8;
    int32_t *ids = NULL;
    size_t nids = 0;
    for (;;) {
        if (text_words(&t, &rng, batch) < 0) goto fail;
        lm_free(ids);
        ids = NULL;
        if (lm_tokenizer_encode(tok, t.p, t.len, &ids, &nids) != LM_OK) goto fail;
        if (nids >= (size_t)n) break;
        batch = (size_t)n - nids + 8;
    }
    char *cut = NULL;
    size_t cut_len = 0;
    if (lm_tokenizer_decode(tok, ids, (size_t)n, LM_TOKENIZER_LOSSY, &cut, &cut_len) != LM_OK) goto fail;
    lm_free(ids);
    ids = NULL;
    if (lm_tokenizer_encode(tok, cut, cut_len, &ids, &nids) != LM_OK) {
        lm_free(cut);
        goto fail;
    }
    free(t.p);
    *text = malloc(cut_len + 1);
    if (*text) memcpy(*text, cut, cut_len + 1);
    lm_free(cut);
    lm_free(ids);
    *tokens = (int)nids;
    return *text ? 0 : -1;
fail:
    lm_free(ids);
    free(t.p);
    return -1;
}

typedef struct prompt_line {
    char *prompt;   /* the "prompt" text, or NULL */
    char *messages; /* the "messages" array as compact JSON, or NULL */
    int max_tokens; /* 0: drawn from --output-tokens */
} prompt_line;

static void prompt_lines_free(prompt_line *l, size_t n) {
    for (size_t i = 0; l && i < n; i++) {
        free(l[i].prompt);
        free(l[i].messages);
    }
    free(l);
}

/* Reads a JSONL prompts file: each non-blank line {"prompt": "..."} or {"messages":
 * [...]} with an optional "max_tokens". Returns 0, or 1 after printing an error that
 * names the line. */
static int load_prompts(const char *path, int chat, prompt_line **out, size_t *count) {
    char *text = NULL;
    size_t len = 0;
    lm_status st = lm_file_read_all(path, &text, &len);
    if (st != LM_OK) return cli_fail(CMD, "cannot read --prompts", st);
    prompt_line *lines = NULL;
    size_t n = 0, cap = 0, lineno = 0;
    int rc = 0;
    for (char *p = text; p < text + len && rc == 0;) {
        char *e = memchr(p, '\n', (size_t)(text + len - p));
        if (!e) e = text + len;
        lineno++;
        char *q = p;
        while (q < e && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
        if (q == e) {
            p = e + 1;
            continue;
        }
        json_error_t jerr;
        json_t *j = json_loadb(p, (size_t)(e - p), 0, &jerr);
        json_t *pr = json_object_get(j, "prompt"), *ms = json_object_get(j, "messages");
        json_t *mt = json_object_get(j, "max_tokens");
        const char *bad = NULL;
        if (!j) bad = jerr.text;
        else if (!json_is_object(j)) bad = "not a JSON object";
        else if ((pr != NULL) == (ms != NULL)) bad = "expected {\"prompt\": \"...\"} or {\"messages\": [...]}";
        else if (pr && !json_is_string(pr)) bad = "\"prompt\" must be a string";
        else if (ms && (!json_is_array(ms) || json_array_size(ms) == 0)) bad = "\"messages\" must be a non-empty array";
        else if (ms && !chat) bad = "\"messages\" needs --endpoint chat";
        else if (mt && (!json_is_integer(mt) || json_integer_value(mt) < 1 || json_integer_value(mt) > SPAN_MAX))
            bad = "\"max_tokens\" must be an integer >= 1";
        if (bad) {
            fprintf(stderr, "loom %s: %s:%zu: %s\n", CMD, path, lineno, bad);
            rc = 1;
        } else {
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                prompt_line *g = realloc(lines, cap * sizeof *g);
                if (!g) rc = 1;
                else lines = g;
            }
            if (rc == 0) {
                prompt_line *l = &lines[n++];
                l->prompt = pr ? strdup(json_string_value(pr)) : NULL;
                l->messages = ms ? json_dumps(ms, JSON_COMPACT) : NULL;
                l->max_tokens = mt ? (int)json_integer_value(mt) : 0;
                if (!l->prompt && !l->messages) rc = 1;
            }
            if (rc) fprintf(stderr, "loom %s: out of memory reading %s\n", CMD, path);
        }
        json_decref(j);
        p = e + 1;
    }
    lm_free(text);
    if (rc == 0 && n == 0) {
        fprintf(stderr, "loom %s: %s holds no prompts\n", CMD, path);
        rc = 1;
    }
    if (rc) {
        prompt_lines_free(lines, n);
        return rc;
    }
    *out = lines;
    *count = n;
    return 0;
}

/* ---- the run ------------------------------------------------------------------------------- */

typedef struct planned {
    int prompt_tokens; /* requested prompt length (random prompts) */
    int max_tokens;    /* sent as max_tokens */
    uint64_t seed;     /* of the prompt's words */
    double arrival;    /* seconds after the start */
} planned;

typedef struct result {
    int ok, cancelled;
    int status;                /* HTTP status; 0 when none arrived */
    double ttft, e2e;          /* seconds */
    double *itl;               /* [n_itl] seconds between successive text chunks */
    size_t n_itl;
    int64_t output_tokens, prompt_tokens;
    int usage;                 /* 1 when the server reported usage */
    int prompt_exact;          /* 1 when the prompt re-encodes to the requested count */
    char *error;               /* malloc'd when !ok */
} result;

typedef struct bench {
    /* configuration (read-only while workers run) */
    http_url url;
    const char *url_text, *tokenizer_path, *prompts_path, *in_spec, *out_spec;
    int chat, stream, ignore_eos, requests, concurrency;
    double rate, timeout_s; /* rate 0: burst */
    span in, out;
    uint64_t seed;
    char model[512];
    const char *endpoint;   /* "/v1/completions" or "/v1/chat/completions", after url.path */
    char path[1100];        /* url.path + endpoint, for the report */
    char headers[1024];     /* extra request headers */
    const lm_tokenizer *tok;
    const prompt_line *lines;
    size_t nlines;
    planned *plan;          /* [requests] */
    result *res;            /* [requests] */
    /* shared state, under mu */
    pthread_mutex_t mu;
    pthread_cond_t work;    /* workers wait for released requests */
    pthread_cond_t main;    /* the main thread waits for completions */
    int next, released, inflight, finished, failed, cancelled, stop;
    atomic_llong tokens;    /* output tokens seen so far (progress line) */
} bench;

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

/* Per-request state while its response streams in. */
typedef struct req_ctx {
    result *r;             /* NULL for GET /v1/models */
    http_response resp;
    sse_reader sse;
    int sse_mode;          /* 1 once the body is known to be an event stream */
    int done, finished;    /* [DONE] seen; a choice had a finish_reason */
    int chunks;            /* events that carried text */
    double t0, t_prev;     /* send time; time of the previous text chunk */
    size_t itl_cap;
    char *body;            /* [body_len] a non-streamed or error body */
    size_t body_len, body_cap, body_limit;
    char err[HTTP_ERR_MAX];
    atomic_llong *tokens;
} req_ctx;

static int text_chunk(req_ctx *c) {
    double t = cli_now();
    if (c->chunks++ == 0) {
        c->r->ttft = t - c->t0;
    } else {
        if (c->r->n_itl == c->itl_cap) {
            size_t cap = c->itl_cap ? 2 * c->itl_cap : 64;
            double *g = realloc(c->r->itl, cap * sizeof *g);
            if (!g) {
                snprintf(c->err, sizeof c->err, "out of memory recording latencies");
                return -1;
            }
            c->r->itl = g;
            c->itl_cap = cap;
        }
        c->r->itl[c->r->n_itl++] = t - c->t_prev;
    }
    c->t_prev = t;
    atomic_fetch_add(c->tokens, 1);
    return 0;
}

static int on_event(void *user, const char *event, const char *data, size_t len) {
    req_ctx *c = user;
    if (strcmp(event, "error") == 0) {
        char msg[400];
        error_message(data, len, msg, sizeof msg);
        snprintf(c->err, sizeof c->err, "error event in the stream: %s", msg);
        return -1;
    }
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        c->done = 1;
        return 1; /* nothing follows [DONE]: stop reading */
    }
    json_error_t jerr;
    json_t *j = json_loadb(data, len, 0, &jerr);
    if (!json_is_object(j)) {
        snprintf(c->err, sizeof c->err, "malformed SSE event (expected a JSON object or [DONE]): '%.80s'", data);
        json_decref(j);
        return -1;
    }
    int rc = 0;
    if (json_object_get(j, "error")) {
        char msg[400];
        error_message(data, len, msg, sizeof msg);
        snprintf(c->err, sizeof c->err, "error event in the stream: %s", msg);
        rc = -1;
    } else {
        chunk_info ci = chunk_read(j);
        if (ci.has_text) rc = text_chunk(c);
        if (ci.finished) c->finished = 1;
        if (ci.has_usage) {
            c->r->usage = 1;
            c->r->output_tokens = ci.completion_tokens;
            c->r->prompt_tokens = ci.prompt_tokens;
        }
    }
    json_decref(j);
    return rc;
}

static int status_ok(int status) { return status >= 200 && status < 300; }

static int on_body(void *user, const char *data, size_t n) {
    req_ctx *c = user;
    /* An event stream by its type, or (a server that does not label it) by its start. */
    int sniffed = c->body_len == 0 && !strstr(c->resp.content_type, "json") &&
                  (data[0] == ':' || (n >= 5 && !memcmp(data, "data:", 5)));
    int sse = c->sse_mode || strstr(c->resp.content_type, "text/event-stream") || sniffed;
    if (c->r && status_ok(c->resp.status) && sse) { /* c->r is NULL for GET /v1/models */
        c->sse_mode = 1;
        int rc = sse_reader_feed(&c->sse, data, n, on_event, c);
        if (rc == -1 && !c->err[0]) snprintf(c->err, sizeof c->err, "malformed SSE stream (a line over 16 MiB)");
        return rc;
    }
    if (c->body_len + n > c->body_limit) { /* an error body: the start is enough for the message */
        if (!status_ok(c->resp.status)) return 0;
        snprintf(c->err, sizeof c->err, "response body over %d MiB", JSON_BODY_MAX >> 20);
        return -1;
    }
    if (c->body_len + n + 1 > c->body_cap) {
        size_t cap = c->body_cap ? c->body_cap : 4096;
        while (cap < c->body_len + n + 1) cap *= 2;
        char *g = realloc(c->body, cap);
        if (!g) {
            snprintf(c->err, sizeof c->err, "out of memory reading the response");
            return -1;
        }
        c->body = g;
        c->body_cap = cap;
    }
    memcpy(c->body + c->body_len, data, n);
    c->body_len += n;
    c->body[c->body_len] = '\0';
    return 0;
}

/* The JSON request body of request i (malloc'd), its prompt token count in *ptoks. */
static char *request_body(const bench *b, int i, int *ptoks, int *exact) {
    const planned *pl = &b->plan[i];
    const prompt_line *line = b->lines ? &b->lines[(size_t)i % b->nlines] : NULL;
    char *prompt = NULL;
    json_t *o = json_object(), *content = NULL;
    *ptoks = 0;
    *exact = 0;
    if (line && line->messages) {
        content = json_loads(line->messages, 0, NULL);
    } else if (line) {
        content = json_string(line->prompt);
    } else {
        if (make_prompt(b->tok, pl->seed, pl->prompt_tokens, &prompt, ptoks) < 0) {
            json_decref(o);
            return NULL;
        }
        *exact = b->tok && *ptoks == pl->prompt_tokens;
        content = json_string(prompt);
        free(prompt);
    }
    json_object_set_new(o, "model", json_string(b->model));
    if (b->chat && !(line && line->messages)) {
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string("user"));
        json_object_set_new(m, "content", content);
        content = json_array();
        json_array_append_new(content, m);
    }
    json_object_set_new(o, b->chat ? "messages" : "prompt", content);
    json_object_set_new(o, "max_tokens", json_integer(pl->max_tokens));
    if (b->ignore_eos) json_object_set_new(o, "ignore_eos", json_true());
    if (b->stream) {
        json_object_set_new(o, "stream", json_true());
        json_object_set_new(o, "stream_options", json_pack("{s:b}", "include_usage", 1));
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

static void fail_result(result *r, const char *msg) {
    r->ok = 0;
    free(r->error);
    r->error = strdup(msg);
}

/* A request that did not finish: an HTTP error status, a transport or stream error,
 * or Ctrl-C. */
static void record_failure(result *r, const req_ctx *c, int rc, const char *herr) {
    char msg[HTTP_ERR_MAX + 200];
    if (c->resp.status != 0 && !status_ok(c->resp.status) && !(rc < 0 && g_interrupted)) {
        char detail[400];
        error_message(c->body ? c->body : "", c->body_len, detail, sizeof detail);
        snprintf(msg, sizeof msg, "HTTP %d: %s", c->resp.status, detail);
    } else if (g_interrupted && !c->err[0]) {
        r->cancelled = 1;
        snprintf(msg, sizeof msg, "cancelled by Ctrl-C");
    } else if (c->err[0]) { /* the stream's own error (the callback stopped the transfer) */
        snprintf(msg, sizeof msg, "%s", c->err);
    } else {
        snprintf(msg, sizeof msg, "%s", herr);
        if (c->sse_mode) snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " after %d text chunks", c->chunks);
    }
    fail_result(r, msg);
}

/* A streamed response read to its end: complete if [DONE] or a finish_reason came. */
static void record_stream(const bench *b, result *r, const req_ctx *c) {
    if (!c->done && !c->finished) {
        char msg[200];
        snprintf(msg, sizeof msg, "the stream ended without [DONE] or a finish_reason (after %d text chunks)", c->chunks);
        fail_result(r, msg);
        return;
    }
    r->ok = 1;
    if (!r->usage) r->output_tokens = c->chunks;
    else if (r->output_tokens > c->chunks) /* chunks that carried several tokens: keep progress honest */
        atomic_fetch_add(c->tokens, r->output_tokens - c->chunks);
    if (!b->stream || c->chunks == 0) r->ttft = r->e2e; /* no text arrived before the end */
}

/* One JSON response (--no-stream, or a server that ignored "stream"). Without usage the
 * output is counted with the tokenizer when there is one, else it is unknown (0). */
static void record_json(const bench *b, result *r, const req_ctx *c) {
    json_t *j = json_loadb(c->body ? c->body : "", c->body_len, 0, NULL);
    if (!json_is_object(j) || json_object_get(j, "error")) {
        char detail[400], msg[500];
        error_message(c->body ? c->body : "", c->body_len, detail, sizeof detail);
        snprintf(msg, sizeof msg, "%s: %s", j ? "error in the response" : "the response is not JSON", detail);
        fail_result(r, msg);
        json_decref(j);
        return;
    }
    chunk_info ci = chunk_read(j);
    r->ok = 1;
    r->ttft = r->e2e;
    if (ci.has_usage) {
        r->usage = 1;
        r->output_tokens = ci.completion_tokens;
        r->prompt_tokens = ci.prompt_tokens;
    } else if (ci.text && b->tok) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (lm_tokenizer_encode(b->tok, ci.text, strlen(ci.text), &ids, &n) == LM_OK) r->output_tokens = (int64_t)n;
        lm_free(ids);
    }
    atomic_fetch_add(c->tokens, r->output_tokens);
    json_decref(j);
}

/* Sends request i and records its result in b->res[i]. */
static void run_request(bench *b, int i) {
    result *r = &b->res[i];
    int planned_tokens = 0;
    char *body = request_body(b, i, &planned_tokens, &r->prompt_exact);
    if (!body) {
        fail_result(r, "cannot build the request (out of memory or tokenizer failure)");
        return;
    }
    req_ctx c;
    memset(&c, 0, sizeof c);
    c.r = r;
    c.body_limit = JSON_BODY_MAX;
    c.tokens = &b->tokens;
    sse_reader_init(&c.sse);
    http_request q = {&b->url, "POST", b->endpoint, b->headers, body, strlen(body), b->timeout_s, &g_interrupted};
    char herr[HTTP_ERR_MAX];
    c.t0 = cli_now();
    int rc = http_send(&q, &c.resp, on_body, &c, herr, sizeof herr);
    r->e2e = cli_now() - c.t0;
    r->status = c.resp.status;
    free(body);
    sse_reader_deinit(&c.sse);
    if (rc < 0 || !status_ok(c.resp.status)) record_failure(r, &c, rc, herr);
    else if (c.sse_mode) record_stream(b, r, &c);
    else record_json(b, r, &c);
    if (r->ok && !r->usage) r->prompt_tokens = planned_tokens;
    free(c.body);
}

static void *worker(void *arg) {
    bench *b = arg;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->stop && b->next < b->requests && b->next >= b->released) pthread_cond_wait(&b->work, &b->mu);
        if (b->stop || g_interrupted || b->next >= b->requests) break; /* Ctrl-C: take nothing new */
        int i = b->next++;
        b->inflight++;
        pthread_mutex_unlock(&b->mu);
        run_request(b, i);
        pthread_mutex_lock(&b->mu);
        b->inflight--;
        b->finished++;
        if (b->res[i].cancelled) b->cancelled++;
        else if (!b->res[i].ok) b->failed++;
        pthread_cond_signal(&b->main);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* Writes the progress line (b->mu held). */
static void progress(bench *b, double elapsed, double tok_s, int tty, int last) {
    fprintf(stderr, "%sbench serve: %d/%d completed, %d failed, %d in flight, %.1f s, %.0f output tok/s%s",
            tty ? "\r" : "", b->finished - b->failed - b->cancelled, b->requests, b->failed, b->inflight, elapsed, tok_s,
            tty && !last ? "   " : "\n");
    fflush(stderr);
}

static void deadline_in(struct timespec *ts, double seconds) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    double t = (double)ts->tv_nsec * 1e-9 + seconds;
    ts->tv_sec += (time_t)floor(t);
    ts->tv_nsec = (long)((t - floor(t)) * 1e9);
    if (ts->tv_nsec >= 1000000000L) ts->tv_sec++, ts->tv_nsec -= 1000000000L;
}

/* Releases requests at their arrival times until all finish or Ctrl-C; returns the
 * duration in seconds (the first release to the last completion). */
static double dispatch(bench *b) {
    int tty = isatty(2);
    double every = tty ? 0.5 : 5.0, t_start = cli_now(), last_print = 0;
    long long last_tokens = 0;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        double now = cli_now() - t_start;
        if (g_interrupted && !b->stop) {
            b->stop = 1;
            pthread_cond_broadcast(&b->work);
        }
        int before = b->released;
        while (!b->stop && b->released < b->requests && b->plan[b->released].arrival <= now) b->released++;
        if (b->released != before) pthread_cond_broadcast(&b->work);
        if (b->finished == b->requests || (b->stop && b->inflight == 0)) break;
        if (now - last_print >= every) {
            long long tk = atomic_load(&b->tokens);
            progress(b, now, (double)(tk - last_tokens) / (now - last_print > 0 ? now - last_print : 1), tty, 0);
            last_print = now;
            last_tokens = tk;
        }
        double wait = 0.1; /* also the latency of noticing Ctrl-C */
        if (!b->stop && b->released < b->requests && b->plan[b->released].arrival - now < wait)
            wait = b->plan[b->released].arrival - now;
        if (wait > 0) {
            struct timespec ts;
            deadline_in(&ts, wait);
            pthread_cond_timedwait(&b->main, &b->mu, &ts);
        }
    }
    double total = cli_now() - t_start;
    long long tk = atomic_load(&b->tokens);
    progress(b, total, total > 0 ? (double)tk / total : 0, tty, 1);
    pthread_mutex_unlock(&b->mu);
    return total;
}

/* Fills b->model from GET /v1/models (the first id). Returns 0, or 1 after an error. */
static int discover_model(bench *b) {
    req_ctx c;
    memset(&c, 0, sizeof c);
    c.body_limit = JSON_BODY_MAX;
    double limit = b->timeout_s > 0 && b->timeout_s < 30 ? b->timeout_s : 30;
    http_request q = {&b->url, "GET", "/v1/models", b->headers, NULL, 0, limit, &g_interrupted};
    char herr[HTTP_ERR_MAX];
    int rc = http_send(&q, &c.resp, on_body, &c, herr, sizeof herr);
    json_t *j = rc == 0 && status_ok(c.resp.status) ? json_loadb(c.body ? c.body : "", c.body_len, 0, NULL) : NULL;
    json_t *first = json_array_get(json_object_get(j, "data"), 0);
    const char *id = json_string_value(json_object_get(first, "id"));
    int out = 1;
    if (rc < 0) {
        char auth[300];
        http_url_authority(&b->url, auth, sizeof auth);
        fprintf(stderr, "loom %s: cannot list the server's models (GET http://%s%s/v1/models): %s\n", CMD, auth, b->url.path,
                herr);
    } else if (!status_ok(c.resp.status)) {
        char detail[400];
        error_message(c.body ? c.body : "", c.body_len, detail, sizeof detail);
        fprintf(stderr, "loom %s: GET %s/v1/models answered HTTP %d: %s (pass --model NAME)\n", CMD, b->url.path,
                c.resp.status, detail);
    } else if (!id || !id[0]) {
        fprintf(stderr, "loom %s: the server lists no models at GET /v1/models; pass --model NAME\n", CMD);
    } else {
        snprintf(b->model, sizeof b->model, "%s", id);
        out = 0;
    }
    json_decref(j);
    free(c.body);
    return out;
}

/* ---- the report --------------------------------------------------------------------------- */

static double round_to(double x, double unit) { return round(x / unit) * unit; }

static json_t *summary_json(double *v, size_t n, double scale) {
    if (n == 0) return json_null();
    summary s = summarize(v, n);
    return json_pack("{s:f,s:f,s:f,s:f,s:f,s:I}", "mean", round_to(s.mean * scale, 1e-3), "p50",
                     round_to(s.p50 * scale, 1e-3), "p95", round_to(s.p95 * scale, 1e-3), "p99",
                     round_to(s.p99 * scale, 1e-3), "max", round_to(s.max * scale, 1e-3), "n", (json_int_t)s.n);
}

static json_t *report(const bench *b, double duration, int *any_failed) {
    int n = b->requests, completed = 0, failed = 0, cancelled = 0, usage = 0, exact = 1;
    int64_t in_tokens = 0, out_tokens = 0;
    size_t n_itl = 0;
    for (int i = 0; i < n; i++) n_itl += b->res[i].ok ? b->res[i].n_itl : 0;
    double *ttft = malloc(sizeof(double) * (size_t)n + 1), *tpot = malloc(sizeof(double) * (size_t)n + 1),
           *e2e = malloc(sizeof(double) * (size_t)n + 1), *itl = malloc(sizeof(double) * n_itl + 1);
    size_t n_tpot = 0, k_itl = 0;
    json_t *errors = json_array();
    for (int i = 0; i < n; i++) {
        const result *r = &b->res[i];
        if (r->cancelled) cancelled++;
        if (!r->ok) {
            if (r->error && !r->cancelled) {
                failed++;
                if (json_array_size(errors) < ERRORS_SHOWN)
                    json_array_append_new(errors, json_pack("{s:i,s:i,s:s}", "request", i, "status", r->status,
                                                            "message", r->error));
            }
            continue;
        }
        ttft[completed] = r->ttft;
        e2e[completed] = r->e2e;
        completed++;
        usage += r->usage;
        exact &= r->prompt_exact;
        in_tokens += r->prompt_tokens;
        out_tokens += r->output_tokens;
        if (b->stream && r->output_tokens > 1) tpot[n_tpot++] = (r->e2e - r->ttft) / (double)(r->output_tokens - 1);
        if (r->n_itl) memcpy(itl + k_itl, r->itl, r->n_itl * sizeof *itl);
        k_itl += r->n_itl;
    }
    json_t *cfg = json_object();
    json_object_set_new(cfg, "url", json_string(b->url_text));
    json_object_set_new(cfg, "endpoint", json_string(b->chat ? "chat" : "completions"));
    json_object_set_new(cfg, "path", json_string(b->path));
    json_object_set_new(cfg, "model", json_string(b->model));
    json_object_set_new(cfg, "requests", json_integer(n));
    json_object_set_new(cfg, "concurrency", json_integer(b->concurrency));
    json_object_set_new(cfg, "arrivals", json_string(b->rate > 0 ? "poisson" : "burst"));
    json_object_set_new(cfg, "rate", b->rate > 0 ? json_real(b->rate) : json_null());
    json_object_set_new(cfg, "prompts", json_string(b->prompts_path ? "file" : b->tok ? "tokenizer" : "random-words"));
    json_object_set_new(cfg, "prompts_file", b->prompts_path ? json_string(b->prompts_path) : json_null());
    json_object_set_new(cfg, "tokenizer", b->tokenizer_path ? json_string(b->tokenizer_path) : json_null());
    json_object_set_new(cfg, "prompt_tokens", b->prompts_path ? json_null() : json_string(b->in_spec));
    json_object_set_new(cfg, "prompt_tokens_exact", json_boolean(!b->prompts_path && b->tok && exact));
    json_object_set_new(cfg, "output_tokens", json_string(b->out_spec));
    json_object_set_new(cfg, "ignore_eos", json_boolean(b->ignore_eos));
    json_object_set_new(cfg, "stream", json_boolean(b->stream));
    json_object_set_new(cfg, "seed", json_integer((json_int_t)b->seed));
    json_object_set_new(cfg, "timeout_s", b->timeout_s > 0 ? json_real(b->timeout_s) : json_null());

    json_t *o = json_object();
    json_object_set_new(o, "bench", json_string("serve"));
    json_object_set_new(o, "config", cfg);
    json_object_set_new(o, "completed", json_integer(completed));
    json_object_set_new(o, "failed", json_integer(failed));
    json_object_set_new(o, "cancelled", json_integer(cancelled));
    json_object_set_new(o, "not_sent", json_integer(n - b->next));
    json_object_set_new(o, "interrupted", json_boolean(g_interrupted));
    json_object_set_new(o, "errors", errors);
    json_object_set_new(o, "duration_s", json_real(round_to(duration, 1e-6)));
    double d = duration > 0 ? duration : 1;
    json_object_set_new(o, "requests_per_s", json_real(round_to(completed / d, 1e-4)));
    json_object_set_new(o, "output_tokens_per_s", json_real(round_to((double)out_tokens / d, 1e-3)));
    json_object_set_new(o, "total_tokens_per_s", json_real(round_to((double)(in_tokens + out_tokens) / d, 1e-3)));
    json_object_set_new(o, "total_input_tokens", json_integer(in_tokens));
    json_object_set_new(o, "total_output_tokens", json_integer(out_tokens));
    json_object_set_new(o, "usage_reported", json_integer(usage));
    json_object_set_new(o, "ttft_ms", summary_json(ttft, (size_t)completed, 1e3));
    json_object_set_new(o, "tpot_ms", b->stream ? summary_json(tpot, n_tpot, 1e3) : json_null());
    json_object_set_new(o, "itl_ms", b->stream ? summary_json(itl, k_itl, 1e3) : json_null());
    json_object_set_new(o, "e2e_ms", summary_json(e2e, (size_t)completed, 1e3));
    free(ttft);
    free(tpot);
    free(e2e);
    free(itl);
    *any_failed = failed > 0;
    return o;
}

/* ---- the command ---------------------------------------------------------------------------- */

/* Plans every request from the seed: lengths and prompt seeds from one stream, the
 * Poisson gaps from another, so changing --rate keeps the same prompts. */
static int make_plan(bench *b) {
    b->plan = calloc((size_t)b->requests, sizeof *b->plan);
    b->res = calloc((size_t)b->requests, sizeof *b->res);
    if (!b->plan || !b->res) return -1;
    lm_rng lengths, gaps;
    lm_rng_seed(&lengths, b->seed);
    lm_rng_seed(&gaps, b->seed ^ 0x5851F42D4C957F2Dull);
    double t = 0;
    for (int i = 0; i < b->requests; i++) {
        planned *p = &b->plan[i];
        p->prompt_tokens = span_draw(b->in, &lengths);
        p->max_tokens = span_draw(b->out, &lengths);
        p->seed = lm_rng_next(&lengths);
        const prompt_line *line = b->lines ? &b->lines[(size_t)i % b->nlines] : NULL;
        if (line && line->max_tokens > 0) p->max_tokens = line->max_tokens;
        if (b->rate > 0 && i > 0) t += -log(1.0 - lm_rng_uniform(&gaps)) / b->rate;
        p->arrival = t;
    }
    return 0;
}

/* Starts the workers, releases the requests and joins the workers. Returns the
 * duration in seconds, or -1 when no worker could start. */
static double run_all(bench *b) {
    struct rlimit fds; /* one socket per worker: lift the soft descriptor limit if it is short */
    rlim_t need = (rlim_t)b->concurrency + 64;
    if (getrlimit(RLIMIT_NOFILE, &fds) == 0 && fds.rlim_cur != RLIM_INFINITY && fds.rlim_cur < need) {
        fds.rlim_cur = fds.rlim_max == RLIM_INFINITY || fds.rlim_max > need ? need : fds.rlim_max;
        setrlimit(RLIMIT_NOFILE, &fds);
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* dispatch() times its waits on it */
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->work, NULL);
    pthread_cond_init(&b->main, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&b->tokens, 0);
    pthread_t *threads = calloc((size_t)b->concurrency, sizeof *threads);
    pthread_attr_t ta;
    pthread_attr_init(&ta);
    pthread_attr_setstacksize(&ta, (size_t)1 << 20); /* workers keep little on the stack */
    int started = 0;
    for (; threads && started < b->concurrency; started++)
        if (pthread_create(&threads[started], &ta, worker, b) != 0) break;
    pthread_attr_destroy(&ta);
    double duration = -1;
    if (started == 0) fprintf(stderr, "loom %s: cannot start worker threads\n", CMD);
    else {
        if (started < b->concurrency) fprintf(stderr, "loom %s: only %d worker threads started\n", CMD, started);
        duration = dispatch(b);
    }
    pthread_mutex_lock(&b->mu);
    b->stop = 1;
    pthread_cond_broadcast(&b->work);
    pthread_mutex_unlock(&b->mu);
    for (int t = 0; t < started; t++) pthread_join(threads[t], NULL);
    free(threads);
    pthread_cond_destroy(&b->work);
    pthread_cond_destroy(&b->main);
    pthread_mutex_destroy(&b->mu);
    return duration;
}

/* Prints the report (and writes --out); returns the exit status. */
static int finish(bench *b, double duration, const char *out_path) {
    int any_failed = 0;
    json_t *o = report(b, duration, &any_failed);
    char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
    json_decref(o);
    if (!text) {
        fprintf(stderr, "loom %s: out of memory writing the result\n", CMD);
        return 1;
    }
    printf("%s\n", text);
    fflush(stdout);
    int code = g_interrupted ? 130 : any_failed ? 1 : 0;
    if (out_path) {
        FILE *f = fopen(out_path, "w");
        int bad = !f || fprintf(f, "%s\n", text) < 0;
        if ((f && fclose(f) != 0) || bad) {
            fprintf(stderr, "loom %s: cannot write --out '%s'\n", CMD, out_path);
            if (code == 0) code = 1;
        }
    }
    free(text);
    const char *first = NULL;
    for (int i = 0; i < b->requests && !first; i++)
        if (!b->res[i].ok && !b->res[i].cancelled && b->res[i].error) first = b->res[i].error;
    if (first) fprintf(stderr, "loom %s: %d of %d requests failed; first error: %s\n", CMD, b->failed, b->requests, first);
    if (g_interrupted)
        fprintf(stderr, "loom %s: interrupted; %d requests completed, %d cancelled in flight, %d not sent\n", CMD,
                b->finished - b->failed - b->cancelled, b->cancelled, b->requests - b->next);
    return code;
}

typedef struct options {
    const char *url, *endpoint, *model, *rate, *in_spec, *out_spec, *prompts, *tokenizer, *api_key, *out_path;
    int requests, concurrency, ignore_eos, no_stream;
    float timeout;
    uint64_t seed;
} options;

/* Prints "loom bench serve: <message>" and returns 2 (a usage error). */
static int usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "loom %s: ", CMD);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

/* Checks the options and fills b's configuration. Returns 0, or 2 after a message. */
static int configure(bench *b, const options *o) {
    char err[HTTP_ERR_MAX];
    if (!o->url) return usage_error("--url http://HOST:PORT is required (see loom %s --help)", CMD);
    if (http_url_parse(o->url, &b->url, err, sizeof err) < 0) return usage_error("--url: %s", err);
    if (strcmp(o->endpoint, "completions") && strcmp(o->endpoint, "chat"))
        return usage_error("--endpoint must be completions or chat, not '%s'", o->endpoint);
    if (o->requests < 1 || o->concurrency < 0) return usage_error("--requests and --concurrency must be >= 1");
    if (o->rate && strcmp(o->rate, "inf") && strcmp(o->rate, "infinity")) {
        char *end = NULL;
        b->rate = strtod(o->rate, &end);
        if (end == o->rate || *end || !(b->rate > 0) || !isfinite(b->rate))
            return usage_error("--rate must be a positive number of requests/s or inf, not '%s'", o->rate);
    }
    if (!(o->timeout >= 0)) return usage_error("--timeout must be >= 0 seconds");
    if (o->prompts && o->in_spec) return usage_error("--prompt-tokens and --prompts exclude each other");
    b->in_spec = o->in_spec ? o->in_spec : "512";
    b->out_spec = o->out_spec;
    if (parse_span(b->in_spec, &b->in, err, sizeof err) < 0) return usage_error("--prompt-tokens: %s", err);
    if (parse_span(b->out_spec, &b->out, err, sizeof err) < 0) return usage_error("--output-tokens: %s", err);
    const char *key = o->api_key ? o->api_key : getenv("OPENAI_API_KEY");
    if (key && (strpbrk(key, "\r\n") || strlen(key) > 900))
        return usage_error("--api-key must be one line of at most 900 bytes");
    if (key && key[0]) snprintf(b->headers, sizeof b->headers, "Authorization: Bearer %s\r\n", key);
    b->url_text = o->url;
    b->tokenizer_path = o->tokenizer;
    b->prompts_path = o->prompts;
    b->chat = !strcmp(o->endpoint, "chat");
    b->stream = !o->no_stream;
    b->ignore_eos = o->ignore_eos;
    b->requests = o->requests;
    b->concurrency = o->concurrency ? o->concurrency : o->requests;
    if (b->concurrency > b->requests) b->concurrency = b->requests;
    if (b->concurrency > MAX_WORKERS) b->concurrency = MAX_WORKERS;
    b->timeout_s = o->timeout;
    b->seed = o->seed;
    /* A URL given as ".../v1" names the API root; the endpoints add their own "/v1". */
    size_t n = strlen(b->url.path);
    if (n >= 3 && strcmp(b->url.path + n - 3, "/v1") == 0) b->url.path[n - 3] = '\0';
    b->endpoint = b->chat ? "/v1/chat/completions" : "/v1/completions";
    snprintf(b->path, sizeof b->path, "%s%s", b->url.path, b->endpoint);
    return 0;
}

static const char SYNOPSIS[] =
    "--url http://HOST:PORT [options]\n"
    "Load-tests an OpenAI-compatible server (loom serve, vLLM, llama-server) over plain HTTP (no TLS)\n"
    "and prints one JSON object: throughput and TTFT/TPOT/ITL/E2E statistics in ms.\n"
    "Exit status: 0 all requests succeeded, 1 some failed (the JSON is still printed) or setup failed,\n"
    "2 bad arguments, 130 interrupted by Ctrl-C (what completed is reported).";

int cmd_bench_serve(int argc, char **argv) {
    options o = {NULL, "completions", NULL, NULL, NULL, "128", NULL, NULL, NULL, NULL, 100, 0, 0, 0, 600, 0};
    const cli_opt opts[] = {
        {"url", CLI_STRING, &o.url, "URL: the server, http://HOST:PORT[/PREFIX] (plain HTTP; https is not supported)"},
        {"endpoint", CLI_STRING, &o.endpoint, "E: completions (/v1/completions, default) or chat (/v1/chat/completions)"},
        {"model", CLI_STRING, &o.model, "NAME: model to request (default: the first id of GET /v1/models)"},
        {"requests", CLI_INT, &o.requests, "N: requests to send (default 100)"},
        {"concurrency", CLI_INT, &o.concurrency, "C: most requests in flight (default: --requests, at most 1024)"},
        {"rate", CLI_STRING, &o.rate, "R: Poisson arrivals at R requests/s; inf (default) sends all at once"},
        {"prompt-tokens", CLI_STRING, &o.in_spec, "SPEC: prompt length, N or A-B uniform (default 512)"},
        {"output-tokens", CLI_STRING, &o.out_spec, "SPEC: max_tokens per request, N or A-B uniform (default 128)"},
        {"prompts", CLI_STRING, &o.prompts,
         "FILE: JSONL prompts, {\"prompt\":...} or {\"messages\":[...]}, optional \"max_tokens\"; cycled"},
        {"tokenizer", CLI_STRING, &o.tokenizer, "FILE: tokenizer.json, for prompts of exactly the requested token count"},
        {"seed", CLI_U64, &o.seed, "S: seed of lengths, prompts and arrivals (default 0)"},
        {"timeout", CLI_FLOAT, &o.timeout, "SECONDS: limit per request, connect to last byte (default 600; 0: none)"},
        {"ignore-eos", CLI_FLAG, &o.ignore_eos, "send \"ignore_eos\": true (vLLM/loom) so outputs reach max_tokens"},
        {"no-stream", CLI_FLAG, &o.no_stream, "one JSON response per request (only E2E is measured; TTFT = E2E)"},
        {"api-key", CLI_STRING, &o.api_key, "KEY: sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)"},
        {"out", CLI_STRING, &o.out_path, "FILE: also write the JSON result there"},
        {NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos;
    int rc = cli_parse(CMD, SYNOPSIS, opts, argc, argv, pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    bench b;
    memset(&b, 0, sizeof b);
    if ((rc = configure(&b, &o)) != 0) return rc;

    json_object_seed(0); /* before worker threads create objects */
    lm_tokenizer *tok = NULL;
    prompt_line *lines = NULL;
    char err[HTTP_ERR_MAX];
    struct sigaction sa, old_sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    g_interrupted = 0;
    sigaction(SIGINT, &sa, &old_sa);
    rc = 1;
    if (o.tokenizer) {
        lm_status st = lm_tokenizer_load(o.tokenizer, &tok);
        if (st != LM_OK) {
            cli_fail(CMD, "cannot load the tokenizer", st);
            goto cleanup;
        }
    }
    if (o.prompts && load_prompts(o.prompts, b.chat, &lines, &b.nlines)) goto cleanup;
    b.tok = tok;
    b.lines = lines;
    if (http_url_resolve(&b.url, err, sizeof err) < 0) { /* once: no lookups inside the timings */
        fprintf(stderr, "loom %s: --url: %s\n", CMD, err);
        goto cleanup;
    }
    if (o.model) snprintf(b.model, sizeof b.model, "%s", o.model);
    else if (discover_model(&b)) goto cleanup;
    if (make_plan(&b) < 0) {
        fprintf(stderr, "loom %s: out of memory planning %d requests\n", CMD, b.requests);
        goto cleanup;
    }
    double duration = run_all(&b);
    if (duration >= 0) rc = finish(&b, duration, o.out_path);
cleanup:
    sigaction(SIGINT, &old_sa, NULL);
    for (int i = 0; b.res && i < b.requests; i++) {
        free(b.res[i].itl);
        free(b.res[i].error);
    }
    free(b.res);
    free(b.plan);
    prompt_lines_free(lines, b.nlines);
    lm_tokenizer_destroy(tok);
    return rc;
}
