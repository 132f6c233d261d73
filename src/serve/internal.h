/* serve/internal.h — the request record and its token path, shared by the serving
 * sources (never installed).
 *
 * A request owns copies of its prompt and stop strings, its host sampler, its
 * streaming detokenizer and stop filter, and its history (prompt + generated ids,
 * which the repetition penalty reads). serve/request.c turns one row of logits into
 * the request's next token and events; serve/scheduler.c decides which requests run
 * in which model step.
 */
#ifndef LOOM_SERVE_INTERNAL_H
#define LOOM_SERVE_INTERNAL_H

#include "infer/internal.h"
#include "loom/serve.h"

typedef enum lm__req_state {
    LM__REQ_PENDING = 0, /* queued, no slot */
    LM__REQ_PREFILL,     /* holds a slot, prompt not yet run */
    LM__REQ_RUNNING,     /* prompt run; `next` is the id to feed */
    LM__REQ_DONE
} lm__req_state;

typedef struct lm__req {
    int64_t id;
    lm_serve_params p;
    char **stop; /* [p.n_stop] owned copies; p.stop points here */
    lm_serve_event_fn cb;
    void *user;
    lm__req_state state;
    int cancel; /* asked for by lm_scheduler_cancel (read and written under the scheduler's lock) */
    int bucket, slot;
    int64_t order;    /* admission order within the bucket: the prefill queue's order */
    /* paged caches */
    int32_t *table;      /* [blocks per row] the blocks holding its positions */
    int64_t nblk;        /* entries of table in use */
    int64_t computed;    /* positions stored in its blocks */
    int64_t prefill_end; /* PREFILL: positions [computed, prefill_end) are to be run */
    int recompute;       /* readmitted after preemption: its prefill picks no token */
    int64_t preempted;   /* times it was preempted */
    int64_t reserved; /* KV positions its slot holds (the stats' kv_tokens_used) */
    int32_t *history; /* [n_prompt + max_tokens]: the prompt, then the generated ids */
    int64_t n_prompt, n_history;
    int32_t next; /* RUNNING: the last generated id, fed to the next decode step */
    lm_sampler *sampler;
    lm_tokenizer_stream *stream; /* NULL without a tokenizer */
    lm__stop_filter filter;
    double submitted, first_token, finished;
    double admitted; /* first placed in a slot (lm_scheduler_now seconds; 0 until then): the trace's queue end */
    lm_finish_reason reason;
} lm__req;

/* serve/request.c */
/* Validates p against the model (vocabulary, ranges) and builds the record; the caller
 * owns *out (lm__req_free). */
lm_status lm__req_create(const lm_model_config *c, const lm_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
                         const lm_serve_params *p, lm_serve_event_fn cb, void *user, lm__req **out);
void lm__req_free(lm__req *r); /* accepts NULL */
/* Picks the request's next token from its logits row ([vocab]; used as scratch),
 * records it and sends the TOKEN event. *finished = 1 when the request ended (length,
 * eos, stop string or its callback asked to cancel); then the FINISH event was sent. */
lm_status lm__req_accept(lm__req *r, const lm_model_config *c, float *logits, int *finished);
/* The same with the token already picked on the device (lm_model_forward_sample_rows). */
lm_status lm__req_accept_id(lm__req *r, const lm_model_config *c, int32_t id, int *finished);
/* Whether the device sampler can pick the request's tokens: no log-probabilities and
 * no penalties (those need the logits on the host). */
int lm__req_device_samplable(const lm__req *r);
/* The device sampler's record for the request's next draw: its own stream (seed,
 * number of tokens generated so far). */
lm_sample_params lm__req_device_params(const lm__req *r);
/* Sends the FINISH event: flushes held text (unless a stop string ended it) and
 * records the reason. status/message describe an error finish. */
void lm__req_finish(lm__req *r, lm_finish_reason reason, lm_status status, const char *message);

/* serve/blocks.c: the block pool of a paged cache with prefix caching. */
typedef struct lm__blocks {
    int64_t n, bs;          /* blocks, positions per block */
    int32_t *ref;           /* [n] requests holding each block */
    uint64_t *hash, *parent; /* [n] registered blocks: the chain hash of the prefix they end, and the one before */
    uint8_t *cached;        /* [n] registered for prefix reuse */
    int32_t *lru_prev, *lru_next; /* [n] the evictable blocks, least recently released first (-1 ends) */
    int32_t lru_head, lru_tail;
    int32_t *tokens;        /* [n * bs] a registered block's tokens */
    int32_t *chain_next, *bucket; /* hash chains: [n] and [nbuckets] (-1 ends) */
    int64_t nbuckets;
    int32_t *free_list;     /* [nfree] blocks nobody holds that are not registered */
    int64_t nfree, evictable, ncached;
} lm__blocks;
lm_status lm__blocks_init(lm__blocks *bm, int64_t nblocks, int64_t bs);
void lm__blocks_free(lm__blocks *bm);
/* Takes the registered blocks equal to the full blocks of tokens[0, n - 1) (the last
 * token is always left to compute) into table[0..], one reference each; returns how
 * many (the longest matching prefix). */
int64_t lm__blocks_match(lm__blocks *bm, const int32_t *tokens, int64_t n, int32_t *table);
/* One block with one reference: free, else the least recently used evictable one; -1
 * when every block is held. */
int lm__blocks_alloc(lm__blocks *bm, int32_t *out);
int64_t lm__blocks_available(const lm__blocks *bm); /* blocks lm__blocks_alloc can still give */
/* Drops one reference of each of table[0, n). */
void lm__blocks_release(lm__blocks *bm, const int32_t *table, int64_t n);
/* Registers blk as block k of tokens (full, stored) for prefix reuse, unless an equal
 * block is registered already. */
void lm__blocks_register(lm__blocks *bm, const int32_t *tokens, int64_t k, int32_t blk);

/* serve/scheduler.c: asks every pending and running request to end (thread-safe). */
void lm__scheduler_cancel_all(lm_scheduler *s);

#endif
