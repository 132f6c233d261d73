/* serve/scheduler.c — the reference, continuous-batching and length-bucketed
 * schedulers (loom/serve.h).
 *
 * All three are one machine: a list of buckets, each a KV cache with a fixed number
 * of slots and a context length, and the requests placed in them. The continuous
 * scheduler is one bucket; the bucketed one several; the reference scheduler is one
 * single-slot bucket whose cache is made for each request (prompt + max_tokens
 * positions), so it is exactly lm_generate's serial path.
 *
 * A step: take cancellations, admit pending requests (FIFO; each into the lowest
 * free slot of its bucket), then per bucket one model step: if any admitted request
 * has not run its prompt, the oldest such prompt's length L is chosen and the waiting
 * prompts of length L (the oldest among them, up to max_prefill_tokens in all) run in
 * one [rows, L] prefill; otherwise every running
 * row decodes one token in one [rows, 1] step, each row at its own position (the
 * step's positions and slot indices are inputs of the graph). On the CPU the logits
 * rows are read where they are and each request picks its token (serve/request.c); on
 * a GPU the tokens are picked on the device, one sampling record per row, unless a
 * row needs its logits on the host (log-probabilities, penalties).
 *
 * Locking: `mu` guards the request lists and counters that other threads read or
 * write (submit, cancel, stats, snapshots); the stepping thread releases it while a
 * model step or a callback runs.
 */
#include "ops/internal.h"
#include "serve/internal.h"
#include "loom/trace.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#define MAX_SNAPSHOTS 4096 /* finished requests' snapshots kept until taken */

typedef struct bucket {
    int slots;
    int64_t context;
    lm_kv_cache *cache;   /* NULL for the reference scheduler between requests */
    lm__req **slot_req;   /* [slots] the request in each slot, or NULL */
    int64_t admitted;     /* admission counter: orders the prefill queue */
} bucket;

struct lm_scheduler {
    const lm_model *m;
    const lm_tokenizer *tok;
    lm_sched_options o;
    int per_request_cache; /* the reference scheduler */
    int device_sampling;   /* the logits live off the host: sample there when every row allows it */
    int paged;             /* one bucket over a paged cache (blocks, prefix caching, preemption) */
    lm__blocks bm;
    int64_t nb_row;        /* paged: table entries per row */
    bucket b[LM_SCHED_MAX_BUCKETS];
    int nb;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int woken;
    lm__req **live; /* [nlive] pending and running, in submission order */
    int64_t nlive, cap_live;
    lm_serve_snapshot *done; /* [ndone] finished, not yet taken */
    int64_t ndone, cap_done;
    int64_t next_id;
    lm_sched_stats st;
    /* step scratch (stepping thread only) */
    int *rows_slot;
    lm__req **rows;
    int32_t *ids, *next, *tables;
    int64_t *starts;
    lm_sample_params *records;
    float *logits;
    int64_t cap_rows, cap_ids, cap_logits, cap_next, cap_records, cap_tables, cap_starts;
};

double lm_scheduler_now(void) { return lm__now_seconds(); }

void lm_sched_options_default(lm_sched_options *o) {
    memset(o, 0, sizeof *o);
    o->kind = LM_SCHED_CONTINUOUS;
    o->slots = 8;
    o->context = 2048;
}

static lm_status check_options(const lm_model_config *c, const lm_sched_options *o) {
    if (o->max_queue < 0) return lm__error(LM_INVALID_ARGUMENT, "scheduler: max_queue %d must be >= 0", o->max_queue);
    if (o->paged && o->kind != LM_SCHED_CONTINUOUS)
        return lm__error(LM_INVALID_ARGUMENT, "scheduler: a paged cache goes with the continuous scheduler");
    if (o->block_size < 0 || o->kv_blocks < 0 || o->kv_blocks > INT32_MAX)
        return lm__error(LM_INVALID_ARGUMENT, "scheduler: block_size %lld and kv_blocks %lld must be >= 0",
                         (long long)o->block_size, (long long)o->kv_blocks);
    if (o->max_prefill_tokens < 0)
        return lm__error(LM_INVALID_ARGUMENT, "scheduler: max_prefill_tokens %lld must be >= 0", (long long)o->max_prefill_tokens);
    switch (o->kind) {
    case LM_SCHED_REFERENCE:
        if (o->context < 0 || o->context > c->max_position_embeddings)
            return lm__error(LM_INVALID_ARGUMENT, "scheduler: context %lld outside [0, max_position_embeddings %lld]",
                             (long long)o->context, (long long)c->max_position_embeddings);
        return LM_OK;
    case LM_SCHED_CONTINUOUS:
        if (o->slots < 1 || o->context < 1 || o->context > c->max_position_embeddings)
            return lm__error(LM_INVALID_ARGUMENT, "scheduler: %d slots x context %lld (slots >= 1, context in [1, %lld])",
                             o->slots, (long long)o->context, (long long)c->max_position_embeddings);
        return LM_OK;
    case LM_SCHED_BUCKETED:
        if (o->n_buckets < 1 || o->n_buckets > LM_SCHED_MAX_BUCKETS)
            return lm__error(LM_INVALID_ARGUMENT, "scheduler: %d buckets (1 to %d)", o->n_buckets, LM_SCHED_MAX_BUCKETS);
        for (int i = 0; i < o->n_buckets; i++) {
            if (o->bucket_slots[i] < 1 || o->bucket_context[i] < 1 || o->bucket_context[i] > c->max_position_embeddings)
                return lm__error(LM_INVALID_ARGUMENT, "scheduler: bucket %d has %d slots x context %lld", i,
                                 o->bucket_slots[i], (long long)o->bucket_context[i]);
            if (i > 0 && o->bucket_context[i] <= o->bucket_context[i - 1])
                return lm__error(LM_INVALID_ARGUMENT, "scheduler: bucket contexts must increase (%lld after %lld)",
                                 (long long)o->bucket_context[i], (long long)o->bucket_context[i - 1]);
        }
        return LM_OK;
    }
    return lm__error(LM_INVALID_ARGUMENT, "scheduler: unknown kind %d", (int)o->kind);
}

lm_status lm_scheduler_create(const lm_model *m, const lm_tokenizer *tok, const lm_sched_options *o, lm_scheduler **out) {
    if (!m || !o || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_scheduler_create: NULL argument");
    *out = NULL;
    const lm_model_config *c = lm_model_get_config(m);
    LM_TRY(check_options(c, o));
    lm_device_caps caps;
    lm_scheduler *s = lm__calloc(1, sizeof *s);
    if (!s) return LM_OUT_OF_MEMORY;
    s->m = m, s->tok = tok, s->o = *o;
    s->device_sampling = lm_device_caps_get(lm_model_device(m), &caps) == LM_OK && !caps.host_addressable;
    if (!s->o.max_queue) s->o.max_queue = 1024;
    if (!s->o.max_prefill_tokens) s->o.max_prefill_tokens = 2048;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->next_id = 1;
    lm_status st = LM_OK;
    if (o->kind == LM_SCHED_REFERENCE) {
        s->per_request_cache = 1;
        s->nb = 1;
        s->b[0].slots = 1;
        s->b[0].context = o->context ? o->context : c->max_position_embeddings;
    } else if (o->kind == LM_SCHED_CONTINUOUS) {
        s->nb = 1;
        s->b[0].slots = o->slots;
        s->b[0].context = o->context;
    } else {
        s->nb = o->n_buckets;
        for (int i = 0; i < s->nb; i++) s->b[i].slots = o->bucket_slots[i], s->b[i].context = o->bucket_context[i];
    }
    s->paged = o->kind == LM_SCHED_CONTINUOUS && o->paged;
    for (int i = 0; st == LM_OK && i < s->nb; i++) {
        bucket *b = &s->b[i];
        if (!(b->slot_req = lm__calloc((size_t)b->slots, sizeof *b->slot_req))) st = LM_OUT_OF_MEMORY;
        if (st == LM_OK && s->paged) {
            int64_t bs = o->block_size ? o->block_size : 16;
            s->nb_row = (b->context + bs - 1) / bs;
            int64_t blocks = o->kv_blocks ? o->kv_blocks : (int64_t)b->slots * s->nb_row;
            st = lm_kv_cache_create_paged(m, blocks, bs, s->nb_row, &b->cache);
            if (st == LM_OK) st = lm__blocks_init(&s->bm, blocks, bs);
            if (st != LM_OK)
                st = lm__error_context(st, "scheduler: the paged KV cache of %lld blocks x %lld tokens", (long long)blocks,
                                       (long long)bs);
            s->st.kv_blocks_total = blocks;
            s->st.kv_tokens_capacity = blocks * bs;
            s->st.slots_total += b->slots;
            continue;
        }
        if (st == LM_OK && !s->per_request_cache) {
            st = lm_kv_cache_create(m, b->slots, b->context, &b->cache);
            if (st != LM_OK)
                st = lm__error_context(st, "scheduler: the KV cache of %d slots x %lld tokens", b->slots, (long long)b->context);
        }
        s->st.slots_total += b->slots;
        if (!s->per_request_cache) s->st.kv_tokens_capacity += (int64_t)b->slots * b->context;
    }
    if (st != LM_OK) {
        lm_scheduler_destroy(s);
        return st;
    }
    *out = s;
    return LM_OK;
}

void lm_scheduler_destroy(lm_scheduler *s) {
    if (!s) return;
    for (int64_t i = 0; i < s->nlive; i++) lm__req_free(s->live[i]);
    lm__free(s->live);
    lm__free(s->done);
    for (int i = 0; i < s->nb; i++) {
        lm_kv_cache_destroy(s->b[i].cache);
        lm__free(s->b[i].slot_req);
    }
    lm__free(s->rows_slot);
    lm__free(s->rows);
    lm__free(s->ids);
    lm__free(s->next);
    lm__free(s->tables);
    lm__free(s->starts);
    if (s->paged) lm__blocks_free(&s->bm);
    lm__free(s->records);
    lm__free(s->logits);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    lm__free(s);
}

/* The bucket a request of `need` positions goes to, given the free slots now; -1
 * when none can ever hold it; -2 when its buckets are full (it waits). */
static int route(const lm_scheduler *s, int64_t need, int admit) {
    int first = -1;
    for (int i = 0; i < s->nb; i++)
        if (need <= s->b[i].context) {
            first = i;
            break;
        }
    if (first < 0) return -1;
    if (!admit) return first;
    int last = s->o.spill_to_larger ? s->nb - 1 : first;
    for (int i = first; i <= last; i++)
        for (int k = 0; k < s->b[i].slots; k++)
            if (!s->b[i].slot_req[k]) return i;
    return -2;
}

lm_status lm_scheduler_submit(lm_scheduler *s, const int32_t *prompt, size_t n_prompt, const lm_serve_params *p,
                              lm_serve_event_fn cb, void *user, int64_t *id) {
    if (!s || !p || !id) return lm__error(LM_INVALID_ARGUMENT, "lm_scheduler_submit: NULL argument");
    *id = 0;
    const lm_model_config *c = lm_model_get_config(s->m);
    int64_t need = (int64_t)n_prompt + p->max_tokens;
    if (p->max_tokens >= 1 && n_prompt > 0 && route(s, need, 0) < 0) {
        pthread_mutex_lock(&s->mu);
        s->st.rejected++;
        pthread_mutex_unlock(&s->mu);
        return lm__error(LM_OUT_OF_RANGE, "request: %zu prompt tokens + max_tokens %lld = %lld exceed the context of %lld",
                         n_prompt, (long long)p->max_tokens, (long long)need, (long long)s->b[s->nb - 1].context);
    }
    if (s->paged && p->max_tokens >= 1 && (need + s->bm.bs - 1) / s->bm.bs > s->bm.n) {
        pthread_mutex_lock(&s->mu);
        s->st.rejected++;
        pthread_mutex_unlock(&s->mu);
        return lm__error(LM_OUT_OF_RANGE, "request: %lld positions need %lld blocks of %lld; the pool has %lld",
                         (long long)need, (long long)((need + s->bm.bs - 1) / s->bm.bs), (long long)s->bm.bs,
                         (long long)s->bm.n);
    }
    lm__req *r = NULL;
    LM_TRY(lm__req_create(c, s->tok, prompt, n_prompt, p, cb, user, &r));
    r->submitted = lm_scheduler_now();
    pthread_mutex_lock(&s->mu);
    lm_status st = LM_OK;
    int64_t pending = s->st.pending;
    if (pending >= s->o.max_queue) {
        s->st.rejected++;
        st = lm__error(LM_UNSUPPORTED, "request: the queue is full (%lld pending)", (long long)pending);
    } else if ((st = LM__PUSH(s->live, s->nlive, s->cap_live, r)) == LM_OK) {
        r->id = s->next_id++;
        *id = r->id;
        s->st.submitted++;
        s->st.pending++;
        s->woken = 1;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (st != LM_OK) lm__req_free(r);
    return st;
}

void lm_scheduler_cancel(lm_scheduler *s, int64_t id) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    for (int64_t i = 0; i < s->nlive; i++)
        if (s->live[i]->id == id) s->live[i]->cancel = 1;
    s->woken = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void lm__scheduler_cancel_all(lm_scheduler *s) {
    pthread_mutex_lock(&s->mu);
    for (int64_t i = 0; i < s->nlive; i++) s->live[i]->cancel = 1;
    s->woken = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void lm_scheduler_wake(lm_scheduler *s) {
    pthread_mutex_lock(&s->mu);
    s->woken = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int lm_scheduler_wait(lm_scheduler *s, double timeout_s) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double t = (double)until.tv_sec + until.tv_nsec * 1e-9 + (timeout_s > 0 ? timeout_s : 0);
    until.tv_sec = (time_t)t;
    until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
    pthread_mutex_lock(&s->mu);
    while (s->nlive == 0 && !s->woken)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &until) != 0) break;
    s->woken = 0;
    int work = s->nlive > 0;
    pthread_mutex_unlock(&s->mu);
    return work;
}

void lm_scheduler_stats_get(lm_scheduler *s, lm_sched_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    pthread_mutex_unlock(&s->mu);
}

static void snapshot_of(const lm__req *r, lm_serve_snapshot *o) {
    memset(o, 0, sizeof *o);
    o->request = r->id;
    o->bucket = r->bucket, o->slot = r->slot;
    o->prompt_tokens = r->n_prompt;
    o->completion_tokens = r->n_history - r->n_prompt;
    o->submitted = r->submitted, o->first_token = r->first_token, o->finished = r->finished;
    o->done = r->state == LM__REQ_DONE;
    o->reason = r->reason;
}

lm_status lm_scheduler_snapshot(lm_scheduler *s, int64_t id, int take, lm_serve_snapshot *out) {
    if (!s || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_scheduler_snapshot: NULL argument");
    lm_status st = LM_OK;
    pthread_mutex_lock(&s->mu);
    int found = 0;
    for (int64_t i = 0; i < s->nlive && !found; i++)
        if (s->live[i]->id == id) snapshot_of(s->live[i], out), found = 1;
    for (int64_t i = 0; i < s->ndone && !found; i++)
        if (s->done[i].request == id) {
            *out = s->done[i], found = 1;
            if (take) s->done[i] = s->done[--s->ndone];
        }
    if (!found) st = lm__error(LM_NOT_FOUND, "scheduler: no request %lld", (long long)id);
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* ---- the stepping thread ----------------------------------------------------------------- */

/* The pool's counts into the stats (under the lock). */
static void paged_stats_locked(lm_scheduler *s) {
    s->st.kv_blocks_used = s->bm.n - s->bm.nfree - s->bm.evictable;
    s->st.kv_blocks_cached = s->bm.ncached;
    s->st.kv_tokens_used = s->st.kv_blocks_used * s->bm.bs;
}

/* The request's lifetime as async trace spans (id = request id): "request" around
 * "queue" (submitted -> first admitted), "prefill" (-> first token), "decode" (->
 * finished) and a "finish" point naming the reason. Phases a request never reached
 * are left out; times are clamped so each phase starts where the last one ended. */
static void trace_request(const lm__req *r) {
    static const char *reasons[] = {"length", "eos", "stop string", "cancelled", "error"};
    int64_t t_sub = (int64_t)(r->submitted * 1e9), t_end = LM_MAX((int64_t)(r->finished * 1e9), t_sub);
    int64_t t_adm = r->admitted > 0 ? LM_MIN(LM_MAX((int64_t)(r->admitted * 1e9), t_sub), t_end) : t_end;
    int64_t t_tok = r->first_token > 0 ? LM_MIN(LM_MAX((int64_t)(r->first_token * 1e9), t_adm), t_end) : t_end;
    char detail[160];
    snprintf(detail, sizeof detail, "prompt %lld tokens, %lld generated, preempted %lld times", (long long)r->n_prompt,
             (long long)(r->n_history - r->n_prompt), (long long)r->preempted);
    lm_trace_async_begin("request", "request", r->id, t_sub, detail);
    lm_trace_async_begin("request", "queue", r->id, t_sub, NULL);
    lm_trace_async_end("request", "queue", r->id, t_adm);
    if (r->admitted > 0) {
        lm_trace_async_begin("request", "prefill", r->id, t_adm, NULL);
        lm_trace_async_end("request", "prefill", r->id, t_tok);
        if (r->first_token > 0) {
            lm_trace_async_begin("request", "decode", r->id, t_tok, NULL);
            lm_trace_async_end("request", "decode", r->id, t_end);
        }
    }
    unsigned reason = (unsigned)r->reason;
    lm_trace_async_instant("request", "finish", r->id, t_end, reason < 5 ? reasons[reason] : "?");
    lm_trace_async_end("request", "request", r->id, t_end);
}

/* Frees r's slot and moves it from the live list to the snapshots (under the lock). */
static void retire_locked(lm_scheduler *s, lm__req *r) {
    if (lm_trace_enabled()) trace_request(r);
    if (r->slot >= 0) {
        bucket *b = &s->b[r->bucket];
        b->slot_req[r->slot] = NULL;
        s->st.running--;
        s->st.slots_used--;
        s->st.kv_tokens_used -= r->reserved;
        if (s->paged) {
            lm__blocks_release(&s->bm, r->table, r->nblk);
            r->nblk = 0;
            paged_stats_locked(s);
        }
        if (s->per_request_cache) {
            lm_kv_cache_destroy(b->cache);
            b->cache = NULL;
            s->st.kv_tokens_capacity = 0;
        }
    } else {
        s->st.pending--;
    }
    s->st.finished++;
    if (r->reason == LM_FINISH_CANCELLED) s->st.cancelled++;
    if (r->reason == LM_FINISH_ERROR) s->st.failed++;
    s->st.completion_tokens += r->n_history - r->n_prompt;
    for (int64_t i = 0; i < s->nlive; i++)
        if (s->live[i] == r) {
            memmove(s->live + i, s->live + i + 1, (size_t)(s->nlive - i - 1) * sizeof *s->live);
            s->nlive--;
            break;
        }
    lm_serve_snapshot snap;
    snapshot_of(r, &snap);
    if (s->ndone == MAX_SNAPSHOTS) { /* forget the oldest */
        memmove(s->done, s->done + 1, (size_t)(s->ndone - 1) * sizeof *s->done);
        s->ndone--;
    }
    if (LM__PUSH(s->done, s->ndone, s->cap_done, snap) != LM_OK) lm_clear_error(); /* a lost snapshot only */
    lm__req_free(r);
}

static void retire(lm_scheduler *s, lm__req *r) {
    pthread_mutex_lock(&s->mu);
    retire_locked(s, r);
    pthread_mutex_unlock(&s->mu);
}

/* Requests the caller asked to cancel: finished (event sent without the lock). */
static void take_cancellations(lm_scheduler *s) {
    for (;;) {
        lm__req *r = NULL;
        pthread_mutex_lock(&s->mu);
        for (int64_t i = 0; i < s->nlive && !r; i++)
            if (s->live[i]->cancel && s->live[i]->state != LM__REQ_DONE) r = s->live[i];
        pthread_mutex_unlock(&s->mu);
        if (!r) return;
        lm__req_finish(r, LM_FINISH_CANCELLED, LM_OK, NULL);
        retire(s, r);
    }
}

/* Paged admission of r: the registered blocks equal to its prompt's leading full blocks,
 * then fresh blocks for the rest of what it must run (the prompt, or after a
 * preemption everything but its last token); *ok = 0 (nothing taken) when the pool
 * cannot give them now. */
static lm_status paged_admit(lm_scheduler *s, lm__req *r, int *ok) {
    *ok = 0;
    if (!r->table && !(r->table = lm__calloc((size_t)s->nb_row, sizeof *r->table))) return LM_OUT_OF_MEMORY;
    int64_t len = r->recompute ? r->n_history - 1 : r->n_prompt, bs = s->bm.bs;
    /* deterministic: no prefix reuse (a tail computed alone rounds differently from the whole prompt on a GPU) */
    int64_t matched = s->o.deterministic ? 0 : lm__blocks_match(&s->bm, r->history, len, r->table);
    int64_t blocks = (len + bs - 1) / bs;
    if (lm__blocks_available(&s->bm) < blocks - matched) {
        lm__blocks_release(&s->bm, r->table, matched);
        return LM_OK;
    }
    for (int64_t k = matched; k < blocks; k++) LM_ASSERT(lm__blocks_alloc(&s->bm, &r->table[k]) == 0);
    r->nblk = blocks;
    r->computed = matched * bs;
    r->prefill_end = len;
    s->st.prefix_query_tokens += len;
    s->st.prefix_hit_tokens += matched * bs;
    *ok = 1;
    return LM_OK;
}

/* Places pending requests into free slots, oldest first. A reference-scheduler
 * request whose cache cannot be made ends with the error. */
static void admit(lm_scheduler *s) {
    lm__req *failed = NULL;
    lm_status st = LM_OK;
    pthread_mutex_lock(&s->mu);
    for (int64_t i = 0; i < s->nlive && !failed; i++) {
        lm__req *r = s->live[i];
        if (r->state != LM__REQ_PENDING || r->cancel) continue;
        int bi = route(s, r->n_prompt + r->p.max_tokens, 1);
        if (bi < 0) continue;
        bucket *b = &s->b[bi];
        int k = 0;
        while (b->slot_req[k]) k++;
        int64_t need = r->n_prompt + r->p.max_tokens;
        if (s->paged) {
            int ok = 0;
            st = paged_admit(s, r, &ok);
            if (st != LM_OK) {
                failed = r;
                break;
            }
            if (!ok) break; /* not enough blocks yet: later requests wait too (FIFO) */
        }
        /* deterministic: the reference's cache has the scheduler's context, like the others' (the
         * attention's reduction over the cache depends on its capacity) */
        if (s->per_request_cache && s->o.deterministic && s->o.context) need = s->o.context;
        st = s->paged ? LM_OK
             : s->per_request_cache ? lm_kv_cache_create(s->m, 1, need, &b->cache) : lm_kv_cache_reset(b->cache, k);
        if (st != LM_OK) {
            failed = r;
            break;
        }
        if (s->per_request_cache) s->st.kv_tokens_capacity = need;
        b->slot_req[k] = r;
        r->bucket = bi, r->slot = k;
        r->state = LM__REQ_PREFILL;
        if (r->admitted == 0) r->admitted = lm_scheduler_now();
        r->order = b->admitted++;
        s->st.pending--;
        s->st.running++;
        s->st.slots_used++;
        r->reserved = s->paged ? 0 : s->per_request_cache ? need : b->context;
        s->st.kv_tokens_used += r->reserved;
        if (s->paged) paged_stats_locked(s);
    }
    pthread_mutex_unlock(&s->mu);
    if (failed) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", lm_last_error());
        lm_clear_error();
        lm__req_finish(failed, LM_FINISH_ERROR, st, msg);
        retire(s, failed);
    }
}

static lm_status reserve_rows(lm_scheduler *s, int64_t rows, int64_t ids, int64_t vocab) {
    int64_t cr = s->cap_rows;
    LM_TRY(lm__reserve((void **)&s->rows_slot, &cr, rows, sizeof *s->rows_slot));
    LM_TRY(lm__reserve((void **)&s->rows, &s->cap_rows, rows, sizeof *s->rows));
    LM_TRY(lm__reserve((void **)&s->ids, &s->cap_ids, ids, sizeof *s->ids));
    LM_TRY(lm__reserve((void **)&s->next, &s->cap_next, rows, sizeof *s->next));
    LM_TRY(lm__reserve((void **)&s->records, &s->cap_records, rows, sizeof *s->records));
    LM_TRY(lm__reserve((void **)&s->tables, &s->cap_tables, rows * LM_MAX(s->nb_row, 1), sizeof *s->tables));
    LM_TRY(lm__reserve((void **)&s->starts, &s->cap_starts, rows, sizeof *s->starts));
    return lm__reserve((void **)&s->logits, &s->cap_logits, rows * vocab, sizeof *s->logits);
}

/* Ends every request of the failed step with the error (their slots are freed). */
static void fail_rows(lm_scheduler *s, int64_t n, lm_status st) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", lm_last_error());
    for (int64_t i = 0; i < n; i++) {
        lm__req_finish(s->rows[i], LM_FINISH_ERROR, st, msg);
        retire(s, s->rows[i]);
    }
    lm_clear_error();
}

/* Paged: takes running request v off its slot and its blocks, back to the queue; it is
 * readmitted later and recomputes its prompt and the tokens it has made so far. */
static void preempt(lm_scheduler *s, bucket *b, lm__req *v) {
    pthread_mutex_lock(&s->mu);
    lm__blocks_release(&s->bm, v->table, v->nblk);
    v->nblk = 0, v->computed = 0;
    b->slot_req[v->slot] = NULL;
    v->slot = v->bucket = -1;
    v->state = LM__REQ_PENDING;
    v->recompute = 1;
    v->preempted++;
    s->st.preemptions++;
    s->st.running--, s->st.slots_used--, s->st.pending++;
    paged_stats_locked(s);
    pthread_mutex_unlock(&s->mu);
}

/* Paged: a block for each running row whose next position starts one; when the pool is
 * out, the newest running request is preempted (possibly the row itself). */
static void paged_grow(lm_scheduler *s, bucket *b) {
    for (int k = 0; k < b->slots; k++) {
        lm__req *r = b->slot_req[k];
        if (!r || r->state != LM__REQ_RUNNING || r->cancel || r->computed < r->nblk * s->bm.bs) continue;
        while (b->slot_req[k] == r && lm__blocks_alloc(&s->bm, &r->table[r->nblk]) != 0) {
            lm__req *v = NULL;
            for (int j = 0; j < b->slots; j++) {
                lm__req *q = b->slot_req[j];
                if (q && q->state == LM__REQ_RUNNING && (!v || q->order > v->order)) v = q;
            }
            preempt(s, b, v);
        }
        if (b->slot_req[k] == r) r->nblk++;
    }
}

/* Runs rows [at, at + rows) of the step's staging: ids [rows, T], the paged tables and
 * starts or the slots; picks tokens on the device or returns logits. */
static lm_status forward_rows(lm_scheduler *s, lm_ctx *ctx, bucket *b, int64_t at, int rows, int64_t T, int on_device) {
    const lm_model_config *c = lm_model_get_config(s->m);
    const int32_t *ids = s->ids + at * T;
    if (s->paged) {
        const int32_t *tab = s->tables + at * s->nb_row;
        return on_device ? lm_model_forward_paged_sample(s->m, ctx, b->cache, tab, s->starts + at, rows, ids, T,
                                                         s->records + at, s->next + at)
                         : lm_model_forward_paged(s->m, ctx, b->cache, tab, s->starts + at, rows, ids, T,
                                                  s->logits + at * c->vocab_size, 0);
    }
    return on_device ? lm_model_forward_sample_rows(s->m, ctx, b->cache, s->rows_slot + at, rows, ids, T,
                                                    s->records + at, s->next + at)
                     : lm_model_forward(s->m, ctx, b->cache, s->rows_slot + at, rows, ids, T,
                                        s->logits + at * c->vocab_size, 0);
}

/* What a waiting request runs in its prefill: its prompt, or (paged) the tail past
 * the cached prefix, or everything but its last token after a preemption. */
static int64_t prefill_len(const lm_scheduler *s, const lm__req *r) {
    return s->paged ? r->prefill_end - r->computed : r->n_prompt;
}

/* One model step in bucket bi: a prefill group if any prompt waits, else one decode. */
static lm_status step_bucket(lm_scheduler *s, lm_ctx *ctx, int bi, int *ran) {
    bucket *b = &s->b[bi];
    const lm_model_config *c = lm_model_get_config(s->m);
    *ran = 0;
    lm__req *oldest = NULL;
    int64_t n = 0;
    for (int k = 0; k < b->slots; k++) {
        lm__req *r = b->slot_req[k];
        if (r && r->state == LM__REQ_PREFILL && (!oldest || r->order < oldest->order)) oldest = r;
    }
    if (!oldest && s->paged) paged_grow(s, b);
    int64_t T = oldest ? prefill_len(s, oldest) : 1;
    LM_TRY(reserve_rows(s, b->slots, (int64_t)b->slots * T, c->vocab_size));
    /* the rows: the oldest waiting prompt first, then others of its length in slot
     * order while the step holds max_prefill_tokens; or every running row */
    for (int k = -1; k < b->slots; k++) {
        lm__req *r = k < 0 ? oldest : b->slot_req[k];
        if (!r || r->cancel) continue;
        int take = oldest ? (k < 0 || (r != oldest && r->state == LM__REQ_PREFILL && prefill_len(s, r) == T &&
                                       (n + 1) * T <= s->o.max_prefill_tokens && !s->o.deterministic))
                          : k >= 0 && r->state == LM__REQ_RUNNING;
        if (!take) continue;
        s->rows[n] = r;
        s->rows_slot[n] = r->slot;
        int64_t from = s->paged ? r->computed : 0;
        if (oldest)
            memcpy(s->ids + n * T, r->history + from, (size_t)T * sizeof *s->ids);
        else
            s->ids[n] = r->next;
        if (s->paged) {
            for (int64_t e = 0; e < s->nb_row; e++) s->tables[n * s->nb_row + e] = e < r->nblk ? r->table[e] : -1;
            s->starts[n] = r->computed;
        }
        n++;
    }
    if (n == 0) return LM_OK;
    *ran = 1;
    /* Off the host, the tokens are picked beside the logits when no row needs them here. */
    int on_device = s->device_sampling;
    for (int64_t i = 0; i < n && on_device; i++) on_device = lm__req_device_samplable(s->rows[i]);
    lm_status st = LM_OK;
    if (on_device)
        for (int64_t i = 0; i < n; i++) s->records[i] = lm__req_device_params(s->rows[i]);
    /* deterministic: one row per model step when prefilling, else at most the rows whose
     * projections, attention and sampling do not depend on the step's other rows: on a
     * device the rows graphs give the GEMV (lm__linear_graph_gemv_rows: past them bf16
     * weights take the GEMM, whose sums may depend on the row count), on the CPU 8 */
    int64_t rows = s->device_sampling ? LM_MAX(1, lm__linear_graph_gemv_rows()) : LM__LINEAR_GEMV_MAX_ROWS;
    int64_t chunk = s->o.deterministic ? (oldest ? 1 : rows) : n;
    int64_t tr = lm_trace_begin();
    for (int64_t at = 0; at < n && st == LM_OK; at += chunk)
        st = forward_rows(s, ctx, b, at, (int)LM_MIN(chunk, n - at), T, on_device);
    if (tr) {
        char detail[64];
        snprintf(detail, sizeof detail, "%lld rows x %lld tokens", (long long)n, (long long)T);
        lm_trace_end(tr, "serve", oldest ? "prefill step" : "decode step", detail);
        lm_trace_memory();
    }
    pthread_mutex_lock(&s->mu);
    s->st.steps++;
    if (oldest) s->st.prefill_steps++, s->st.prompt_tokens += n * T;
    else s->st.decode_steps++;
    pthread_mutex_unlock(&s->mu);
    if (st != LM_OK) {
        fail_rows(s, n, st);
        return LM_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        lm__req *r = s->rows[i];
        if (s->paged) { /* the positions now stored; blocks that filled up become reusable prefixes */
            int64_t before = r->computed;
            r->computed += T;
            for (int64_t k = before / s->bm.bs; k < r->computed / s->bm.bs; k++)
                lm__blocks_register(&s->bm, r->history, k, r->table[k]);
        }
        if (oldest) r->state = LM__REQ_RUNNING;
        if (oldest && r->recompute) { /* its next token is known already */
            r->recompute = 0;
            continue;
        }
        int finished = 0;
        tr = lm_trace_begin(); /* picking the token (on the host), detokenizing, the request's callback */
        lm_status rs = on_device ? lm__req_accept_id(r, c, s->next[i], &finished)
                                 : lm__req_accept(r, c, s->logits + i * c->vocab_size, &finished);
        lm_trace_end(tr, "serve", "sample", NULL);
        if (rs != LM_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", lm_last_error());
            lm_clear_error();
            lm__req_finish(r, LM_FINISH_ERROR, rs, msg);
            finished = 1;
        }
        if (finished) retire(s, r);
    }
    if (s->paged) {
        pthread_mutex_lock(&s->mu);
        paged_stats_locked(s);
        pthread_mutex_unlock(&s->mu);
    }
    return LM_OK;
}

lm_status lm_scheduler_step(lm_scheduler *s, lm_ctx *ctx, int *busy) {
    if (!s || !ctx) return lm__error(LM_INVALID_ARGUMENT, "lm_scheduler_step: NULL argument");
    take_cancellations(s);
    admit(s);
    for (int i = 0; i < s->nb; i++) {
        int ran = 0;
        LM_TRY(step_bucket(s, ctx, i, &ran));
    }
    if (busy) {
        pthread_mutex_lock(&s->mu);
        *busy = s->nlive > 0;
        pthread_mutex_unlock(&s->mu);
    }
    return LM_OK;
}
