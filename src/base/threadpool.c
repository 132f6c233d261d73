/* base/threadpool.c — a fixed pool of pthreads running one parallel-for at a time.
 *
 * Tasks are claimed with an atomic counter (dynamic scheduling: uneven task costs
 * balance themselves). The caller is worker 0 and works too; run() returns after
 * every worker has finished the generation it joined, so arg may live on the
 * caller's stack. Between runs, workers first spin for up to LM__SPIN_NS watching
 * the generation counter (a decode step issues hundreds of short parallel-fors, and a
 * condition-variable wake costs tens of microseconds), then sleep on a condition
 * variable; the caller waits for stragglers the same way.
 */
#include "internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define LM__SPIN_NS 50000 /* spin budget before sleeping, nanoseconds */

typedef struct worker_start {
    struct lm_threadpool *pool;
    int worker;
} worker_start;

struct lm_threadpool {
    int nthreads;
    pthread_t *threads;   /* [nthreads-1] */
    worker_start *starts; /* [nthreads-1]: owned by the pool so workers never call the
                             allocation hooks (which need not be thread-safe) */
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    atomic_ullong generation; /* bumped per run; workers wait for a new value */
    atomic_int busy;          /* workers still inside the current run */
    atomic_int stop;
    lm_task_fn fn;
    void *arg;
    int64_t ntasks;
    atomic_llong next;
};

static void drain(lm_threadpool *p, int worker) {
    for (;;) {
        int64_t t = atomic_fetch_add(&p->next, 1);
        if (t >= p->ntasks) break;
        p->fn(p->arg, t, worker);
    }
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spins until a new generation (or stop) appears or the budget runs out. */
static void spin_for_work(lm_threadpool *p, unsigned long long seen) {
    int64_t deadline = now_ns() + LM__SPIN_NS;
    for (unsigned i = 1;; i++) {
        if (atomic_load(&p->generation) != seen || atomic_load(&p->stop)) return;
        cpu_relax();
        if ((i & 63) == 0 && now_ns() > deadline) return;
    }
}

static void *worker_main(void *raw) {
    worker_start ws = *(worker_start *)raw;
    lm_threadpool *p = ws.pool;
    unsigned long long seen = 0;
    for (;;) {
        spin_for_work(p, seen);
        pthread_mutex_lock(&p->mu);
        while (!atomic_load(&p->stop) && atomic_load(&p->generation) == seen) pthread_cond_wait(&p->wake, &p->mu);
        pthread_mutex_unlock(&p->mu);
        if (atomic_load(&p->stop)) break;
        seen = atomic_load(&p->generation);
        drain(p, ws.worker);
        if (atomic_fetch_sub(&p->busy, 1) == 1) { /* last one out wakes the caller */
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

static void stop_workers(lm_threadpool *p, int started) {
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < started; i++) pthread_join(p->threads[i], NULL);
}

lm_status lm_threadpool_create(int nthreads, lm_threadpool **out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_threadpool_create: out is NULL");
    *out = NULL;
    if (nthreads <= 0) nthreads = lm_cpu_get_features()->logical_cpus;
    if (nthreads > 1024) return lm__error(LM_INVALID_ARGUMENT, "thread count %d exceeds 1024", nthreads);
    lm_threadpool *p = lm__calloc(1, sizeof *p);
    if (!p) return LM_OUT_OF_MEMORY;
    p->nthreads = nthreads;
    if (nthreads > 1) {
        p->threads = lm__calloc((size_t)nthreads - 1, sizeof(pthread_t));
        p->starts = p->threads ? lm__calloc((size_t)nthreads - 1, sizeof(worker_start)) : NULL;
        if (!p->starts) {
            lm__free(p->threads);
            lm__free(p);
            return LM_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int i = 0; i < nthreads - 1; i++) {
        p->starts[i] = (worker_start){p, i + 1};
        int rc = pthread_create(&p->threads[i], NULL, worker_main, &p->starts[i]);
        if (rc != 0) {
            stop_workers(p, i); /* sets stop: destroy below joins nobody twice */
            lm_threadpool_destroy(p);
            return lm__error(LM_INTERNAL, "pthread_create failed (%d)", rc);
        }
    }
    *out = p;
    return LM_OK;
}

void lm_threadpool_destroy(lm_threadpool *p) {
    if (!p) return;
    if (!p->stop) stop_workers(p, p->nthreads - 1);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    lm__free(p->threads);
    lm__free(p->starts);
    lm__free(p);
}

int lm_threadpool_size(const lm_threadpool *p) { return p ? p->nthreads : 1; }

void lm_threadpool_run(lm_threadpool *p, int64_t ntasks, lm_task_fn fn, void *arg) {
    if (ntasks <= 0) return;
    if (!p || p->nthreads == 1 || ntasks == 1) {
        for (int64_t t = 0; t < ntasks; t++) fn(arg, t, 0);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    p->ntasks = ntasks;
    atomic_store(&p->next, 0);
    atomic_store(&p->busy, p->nthreads - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->generation, 1); /* publishes fn/arg/ntasks (seq_cst) */
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    drain(p, 0);
    int64_t deadline = now_ns() + LM__SPIN_NS;
    for (unsigned i = 1; atomic_load(&p->busy) > 0; i++) {
        cpu_relax();
        if ((i & 63) == 0 && now_ns() > deadline) break;
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->busy) > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
