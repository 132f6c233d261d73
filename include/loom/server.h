/* loom/server.h — an OpenAI-compatible HTTP server over a scheduler (loom/serve.h).
 *
 * Endpoints: POST /v1/completions and /v1/chat/completions (JSON, or server-sent
 * events when "stream": true, ending with "data: [DONE]"), GET /v1/models, GET
 * /health, GET /metrics (Prometheus text format) and GET / (a chat page). Errors are
 * OpenAI error objects with the fitting status: 400 for malformed JSON, wrong types or
 * values and prompts longer than the context, 401 for a missing or wrong API key, 404
 * for an unknown path or model, 405 for a wrong method, 413 for a body over the
 * limit, 429 when the queue is full, 503 while shutting down.
 *
 * Threads: HTTP connections are served by libmicrohttpd, one thread per connection
 * (a bounded number); the model runs on the thread that calls lm_server_run, which
 * owns the lm_ctx. A client that disconnects cancels its request.
 */
#ifndef LOOM_SERVER_H
#define LOOM_SERVER_H

#include "loom/serve.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lm_server_options {
    const char *host;          /* listen address (default "127.0.0.1") */
    int port;                  /* 0: any free port (lm_server_port says which) */
    const char *model_name;    /* the id /v1/models lists and requests must name (default: the directory's name) */
    const char *api_key;       /* NULL: no authentication; else "Authorization: Bearer KEY" on /v1/ */
    size_t max_body_bytes;     /* default 4 MiB */
    int max_connections;       /* default 512 */
    double idle_timeout_s;     /* a connection idle this long is closed (default 30) */
    double shutdown_grace_s;   /* on stop, in-flight requests may finish for this long, then are cancelled (default 10) */
    int prepend_bos;           /* completions: -1 auto (as tokenizer.json's post-processor does), 0 no, 1 yes */
    lm_sched_options sched;
} lm_server_options;

LM_API void lm_server_options_default(lm_server_options *o);

typedef struct lm_server lm_server;

/* model_dir is read for tokenizer.json (required), tokenizer_config.json (the chat
 * template, optional: without one, chat requests get a 400) and the model's name. The
 * model must have been loaded from it. Binds the socket now (errors name the address).
 * The server borrows m. */
LM_API lm_status lm_server_create(const lm_model *m, const char *model_dir, const lm_server_options *o, lm_server **out);
LM_API int lm_server_port(const lm_server *s);
LM_API const char *lm_server_model_name(const lm_server *s); /* the id clients use; borrowed */
/* Serves until lm_server_stop: runs the scheduler on this thread with ctx (on the
 * model's device). Returns LM_OK after a clean stop. */
LM_API lm_status lm_server_run(lm_server *s, lm_ctx *ctx);
/* Asks lm_server_run to stop: new requests get 503, in-flight ones get the grace
 * period. Async-signal-safe (it only sets a flag), so a SIGINT handler may call it. */
LM_API void lm_server_stop(lm_server *s);
LM_API void lm_server_destroy(lm_server *s); /* accepts NULL; after lm_server_run returned */

#ifdef __cplusplus
}
#endif
#endif
