/* loom/serve.h — request schedulers: many generation requests over one model.
 *
 * A request is a prompt (token ids), its sampling settings and a callback. A
 * scheduler admits requests, runs model steps and calls each request's callback
 * with every token (its id, log-probabilities when asked, and the text that became
 * final) and once at the end (finish reason and usage). Three kinds:
 *
 *   LM_SCHED_REFERENCE   one request at a time on its own single-row KV cache: the
 *                        oracle the others are tested against.
 *   LM_SCHED_CONTINUOUS  a fixed number of slots over one KV cache. Requests are
 *                        admitted at step boundaries into the lowest free slot;
 *                        pending prompts of equal length prefill together in one
 *                        step (up to max_prefill_tokens); all running rows, each at its own position, decode in
 *                        one batched step. A finished or cancelled request frees its
 *                        slot at once.
 *   LM_SCHED_BUCKETED    several continuous schedulers ("buckets", each with its own
 *                        slots and context length) over one model. A request goes to
 *                        the smallest bucket whose context holds prompt + max_tokens;
 *                        with spill_to_larger, to the first larger one with a free
 *                        slot when that bucket is full. Requests never migrate.
 *
 * Threads: lm_scheduler_submit, _cancel and _stats may be called from any thread;
 * lm_scheduler_step (and so every callback) runs on one thread at a time, the one
 * that owns the lm_ctx. Greedy tokens do not depend on the arrival order or on what
 * else shares a batch on the CPU; on CUDA the batched kernels round differently from
 * the single-row ones unless the scheduler is deterministic (then a request's steps
 * run through row-independent kernels: slower, but equal to the reference's).
 */
#ifndef LOOM_SERVE_H
#define LOOM_SERVE_H

#include "loom/generate.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lm_sched_kind { LM_SCHED_REFERENCE = 0, LM_SCHED_CONTINUOUS = 1, LM_SCHED_BUCKETED = 2 } lm_sched_kind;

#define LM_SCHED_MAX_BUCKETS 8
#define LM_SERVE_MAX_TOP_LOGPROBS 20

typedef struct lm_sched_options {
    lm_sched_kind kind;
    int slots;              /* CONTINUOUS: rows decoded together (>= 1) */
    int64_t context;        /* CONTINUOUS: tokens per slot (prompt + output); REFERENCE: the
                               most a request may use (0: max_position_embeddings) */
    int n_buckets;          /* BUCKETED: [1, LM_SCHED_MAX_BUCKETS] */
    int bucket_slots[LM_SCHED_MAX_BUCKETS];
    int64_t bucket_context[LM_SCHED_MAX_BUCKETS]; /* strictly increasing */
    int spill_to_larger;    /* BUCKETED: a full bucket may hand a request to a larger one */
    int max_queue;          /* pending requests accepted before submit refuses (0: 1024) */
    int paged;              /* CONTINUOUS: a paged KV cache: blocks of block_size positions taken as
                               requests grow, shared by equal prompt prefixes (prefix caching); when
                               blocks run out the newest request is preempted and later recomputed */
    int64_t block_size;     /* paged: positions per block (0: 16) */
    int64_t kv_blocks;      /* paged: blocks in the pool (0: enough for every slot's whole context) */
    int64_t max_prefill_tokens; /* a prefill step takes equal-length prompts up to this many tokens in all
                               (at least one prompt); 0: 2048. Smaller: earlier first tokens for the
                               first of many simultaneous arrivals */
    int deterministic;      /* batch-invariant steps: a request's tokens do not depend on what shares
                               its steps. The CPU always is; on CUDA prompts then run one per step and
                               decode steps take at most 2 rows (the rows graphs give the
                               row-independent GEMV; more run the GEMM), and the
                               reference scheduler's caches take `context` positions (the attention's
                               reduction depends on the cache's capacity). With a paged cache it turns
                               prefix reuse off; a request preempted for blocks recomputes its
                               positions in a prefill, which on CUDA may round differently */
} lm_sched_options;

LM_API void lm_sched_options_default(lm_sched_options *o); /* CONTINUOUS, 8 slots, context 2048 */

typedef enum lm_finish_reason {
    LM_FINISH_LENGTH = 0,    /* max_tokens reached */
    LM_FINISH_EOS = 1,       /* an end-of-sequence id */
    LM_FINISH_STOP = 2,      /* a stop string (cut from the text) */
    LM_FINISH_CANCELLED = 3, /* lm_scheduler_cancel, or the callback returned nonzero */
    LM_FINISH_ERROR = 4      /* the model step failed; event.status and .message say why */
} lm_finish_reason;
LM_API const char *lm_finish_reason_name(lm_finish_reason r); /* "length", "eos", "stop", ... */

typedef enum lm_serve_event_kind { LM_SERVE_TOKEN = 0, LM_SERVE_FINISH = 1 } lm_serve_event_kind;

typedef struct lm_serve_event {
    lm_serve_event_kind kind;
    int64_t request;   /* the id submit returned */
    /* TOKEN: one generated id (eos ids included, their text is empty) */
    int32_t id;
    float logprob;     /* log-softmax of the sampled id over the model's raw logits (when logprobs) */
    int n_top;         /* top_logprobs entries below */
    int32_t top_ids[LM_SERVE_MAX_TOP_LOGPROBS];
    float top_logprobs[LM_SERVE_MAX_TOP_LOGPROBS];
    /* TOKEN and FINISH: text that became final (complete UTF-8, stop strings cut) */
    const char *text;
    size_t len;
    /* FINISH */
    lm_finish_reason reason;
    lm_status status;       /* LM_OK unless reason == LM_FINISH_ERROR */
    const char *message;    /* the error's detail, or "" */
    int64_t prompt_tokens, completion_tokens;
} lm_serve_event;

/* Called on the stepping thread. Return nonzero to cancel the request (a FINISH event
 * with LM_FINISH_CANCELLED follows). The event and its text are valid during the call. */
typedef int (*lm_serve_event_fn)(void *user, const lm_serve_event *ev);

typedef struct lm_serve_params {
    int64_t max_tokens;        /* >= 1 */
    lm_sampler_params sampler; /* greedy / temperature, top_k, top_p, min_p, repetition_penalty, seed */
    float presence_penalty;    /* [-2, 2]: subtracted once from every id generated so far */
    float frequency_penalty;   /* [-2, 2]: subtracted per occurrence among the generated ids */
    const char *const *stop;   /* [n_stop] non-empty strings (copied at submit) */
    int n_stop;
    int ignore_eos;
    int logprobs;              /* 1: report each token's logprob */
    int top_logprobs;          /* [0, LM_SERVE_MAX_TOP_LOGPROBS] alternatives per token (needs logprobs) */
    unsigned decode_flags;     /* LM_TOKENIZER_SKIP_SPECIAL hides special tokens in text */
} lm_serve_params;

LM_API void lm_serve_params_default(lm_serve_params *p); /* 16 tokens, greedy */

/* Per-request timings and placement, for logs and metrics. */
typedef struct lm_serve_snapshot {
    int64_t request;
    int bucket, slot;            /* where it ran (-1 before admission) */
    int64_t prompt_tokens, completion_tokens;
    double submitted, first_token, finished; /* lm_scheduler_now() seconds; 0 when not yet */
    int done;
    lm_finish_reason reason;
} lm_serve_snapshot;

typedef struct lm_sched_stats {
    int64_t submitted, finished, cancelled, failed, rejected;
    int64_t pending, running;            /* now */
    int64_t steps, prefill_steps, decode_steps;
    int64_t prompt_tokens, completion_tokens;
    int64_t slots_total, slots_used;     /* over every bucket */
    int64_t kv_tokens_capacity, kv_tokens_used;
    int64_t kv_blocks_total, kv_blocks_used;  /* paged: the pool, and blocks held by requests */
    int64_t kv_blocks_cached;                 /* paged: registered for prefix reuse (held or not) */
    int64_t prefix_query_tokens, prefix_hit_tokens; /* paged: prompt tokens admitted, and those found cached */
    int64_t preemptions;
} lm_sched_stats;

typedef struct lm_scheduler lm_scheduler;

/* The scheduler borrows m and tok (tok may be NULL: no text, no stop strings); it
 * allocates its KV caches now (so a bad size fails here). Errors name the option. */
LM_API lm_status lm_scheduler_create(const lm_model *m, const lm_tokenizer *tok, const lm_sched_options *o,
                                     lm_scheduler **out);
/* Finishes nothing: requests still pending or running are dropped without events. */
LM_API void lm_scheduler_destroy(lm_scheduler *s); /* accepts NULL */

/* Queues a request (the prompt and stop strings are copied). *id receives its id.
 * LM_INVALID_ARGUMENT for bad parameters, LM_OUT_OF_RANGE when prompt + max_tokens
 * fits no slot of this scheduler, LM_UNSUPPORTED ("queue full") beyond max_queue.
 * Its callback then runs on the stepping thread. Thread-safe. */
LM_API lm_status lm_scheduler_submit(lm_scheduler *s, const int32_t *prompt, size_t n_prompt,
                                     const lm_serve_params *p, lm_serve_event_fn cb, void *user, int64_t *id);
/* Asks for a request to end; it finishes (LM_FINISH_CANCELLED) at the next step
 * boundary, and its slot is free after. Unknown or finished ids are ignored. Thread-safe. */
LM_API void lm_scheduler_cancel(lm_scheduler *s, int64_t id);
/* Runs one step: admission, then one model step (a prefill group or one batched
 * decode). *busy = 1 while requests remain. A model failure finishes the requests in
 * that step with LM_FINISH_ERROR and returns LM_OK (the scheduler keeps serving). */
LM_API lm_status lm_scheduler_step(lm_scheduler *s, lm_ctx *ctx, int *busy);
/* Blocks until a request is pending or running, or until timeout_s passes, or until
 * lm_scheduler_wake. Returns 1 when there is work. Thread-safe. */
LM_API int lm_scheduler_wait(lm_scheduler *s, double timeout_s);
LM_API void lm_scheduler_wake(lm_scheduler *s);
LM_API void lm_scheduler_stats_get(lm_scheduler *s, lm_sched_stats *out); /* thread-safe */
/* The snapshot of request id (finished ones are kept until taken): LM_NOT_FOUND when
 * unknown. take = 1 forgets a finished request's snapshot. Thread-safe. */
LM_API lm_status lm_scheduler_snapshot(lm_scheduler *s, int64_t id, int take, lm_serve_snapshot *out);
LM_API double lm_scheduler_now(void); /* the scheduler's clock, seconds (monotonic) */

#ifdef __cplusplus
}
#endif
#endif
