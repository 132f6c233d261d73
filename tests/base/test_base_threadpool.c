/* Tests for the thread pool: every task index runs exactly once, on a worker id in
 * [0, size), across repeated runs, pool sizes 1, 2 and 7 and task counts 0, 1, 3 and
 * 1000; a NULL pool runs inline on the caller in index order; argument checks;
 * destroy accepts NULL and pools that never ran.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#define MAX_TASKS 1000

typedef struct run_record {
    atomic_int hits[MAX_TASKS]; /* [ntasks] times each index ran */
    atomic_int bad_worker;      /* calls with a worker id outside [0, nthreads) */
    atomic_int bad_task;        /* calls with a task index outside [0, ntasks) */
    int nthreads;
    int64_t ntasks;
    int sleepy; /* 1: every 97th task sleeps briefly, so costs are uneven */
} run_record;

static void record_task(void *arg, int64_t task, int worker) {
    run_record *r = arg;
    if (worker < 0 || worker >= r->nthreads) atomic_fetch_add(&r->bad_worker, 1);
    if (task < 0 || task >= r->ntasks) {
        atomic_fetch_add(&r->bad_task, 1);
        return;
    }
    if (r->sleepy && task % 97 == 0) {
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    atomic_fetch_add(&r->hits[task], 1);
}

static int check_run(lm_threadpool *pool, run_record *r, int64_t ntasks) {
    for (int i = 0; i < MAX_TASKS; i++) atomic_store(&r->hits[i], 0);
    atomic_store(&r->bad_worker, 0);
    atomic_store(&r->bad_task, 0);
    r->nthreads = lm_threadpool_size(pool);
    r->ntasks = ntasks;
    lm_threadpool_run(pool, ntasks, record_task, r);
    int ok = atomic_load(&r->bad_worker) == 0 && atomic_load(&r->bad_task) == 0;
    for (int64_t t = 0; t < MAX_TASKS; t++) ok &= atomic_load(&r->hits[t]) == (t < ntasks ? 1 : 0);
    return ok;
}

static void test_every_task_runs_exactly_once(void) {
    static run_record rec; /* large: keep it off the stack */
    const int sizes[] = {1, 2, 7};
    const int64_t counts[] = {0, 1, 3, 1000};
    for (int si = 0; si < 3; si++) {
        lm_threadpool *pool = NULL;
        LT_CHECK_OK(lm_threadpool_create(sizes[si], &pool));
        if (!pool) continue;
        LT_CHECK(lm_threadpool_size(pool) == sizes[si]);
        for (int run = 0; run < 50; run++) {
            int64_t n = counts[run % 4];
            rec.sleepy = run % 5 == 0;
            LT_CHECK_MSG(check_run(pool, &rec, n), "pool of %d, run %d, %lld tasks: a task ran twice, never, or on "
                         "a bad worker", sizes[si], run, (long long)n);
        }
        lm_threadpool_destroy(pool);
    }
}

typedef struct inline_record {
    pthread_t caller;
    int64_t next; /* the index expected next: inline runs are in order */
    int wrong_thread, wrong_worker, out_of_order;
} inline_record;

static void inline_task(void *arg, int64_t task, int worker) {
    inline_record *r = arg;
    if (!pthread_equal(pthread_self(), r->caller)) r->wrong_thread++;
    if (worker != 0) r->wrong_worker++;
    if (task != r->next++) r->out_of_order++;
}

static void test_null_pool_runs_inline_in_order(void) {
    inline_record r = {pthread_self(), 0, 0, 0, 0};
    lm_threadpool_run(NULL, 500, inline_task, &r);
    LT_CHECK(r.next == 500 && r.wrong_thread == 0 && r.wrong_worker == 0 && r.out_of_order == 0);
    LT_CHECK(lm_threadpool_size(NULL) == 1);
    r.next = 0;
    lm_threadpool_run(NULL, 0, inline_task, &r);
    lm_threadpool_run(NULL, -5, inline_task, &r);
    LT_CHECK(r.next == 0);
    /* a one-thread pool also runs on the caller */
    lm_threadpool *one = NULL;
    LT_CHECK_OK(lm_threadpool_create(1, &one));
    lm_threadpool_run(one, 300, inline_task, &r);
    LT_CHECK(r.next == 300 && r.wrong_thread == 0 && r.out_of_order == 0);
    lm_threadpool_destroy(one);
}

static void test_negative_task_count_runs_nothing(void) {
    static run_record rec;
    lm_threadpool *pool = NULL;
    LT_CHECK_OK(lm_threadpool_create(3, &pool));
    LT_CHECK(check_run(pool, &rec, -7));
    LT_CHECK(check_run(pool, &rec, 10)); /* and the pool still works afterwards */
    lm_threadpool_destroy(pool);
}

static void test_create_arguments_and_destroy(void) {
    lm_threadpool *pool = (lm_threadpool *)&pool;
    LT_CHECK_STATUS(lm_threadpool_create(2, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_threadpool_create(100000, &pool), LM_INVALID_ARGUMENT);
    LT_CHECK(pool == NULL);
    LT_CHECK_OK(lm_threadpool_create(0, &pool)); /* one per logical CPU */
    LT_CHECK(pool && lm_threadpool_size(pool) == lm_cpu_get_features()->logical_cpus);
    lm_threadpool_destroy(pool);
    lm_threadpool_destroy(NULL);
    /* pools that never run must still shut down cleanly */
    for (int i = 0; i < 20; i++) {
        LT_CHECK_OK(lm_threadpool_create(1 + i % 4, &pool));
        lm_threadpool_destroy(pool);
    }
}

typedef struct sum_arg {
    const int64_t *values; /* [n] */
    atomic_llong total;
} sum_arg;

static void sum_task(void *arg, int64_t task, int worker) {
    (void)worker;
    sum_arg *s = arg;
    atomic_fetch_add(&s->total, s->values[task]);
}

static void test_run_returns_after_all_tasks_finish(void) {
    /* arg lives on this stack frame: run() may only return once workers are done */
    lm_threadpool *pool = NULL;
    LT_CHECK_OK(lm_threadpool_create(4, &pool));
    int64_t values[257];
    for (int i = 0; i < 257; i++) values[i] = i * 3 + 1;
    for (int run = 0; run < 200; run++) {
        sum_arg s = {values, 0};
        int64_t n = 1 + run % 257;
        lm_threadpool_run(pool, n, sum_task, &s);
        LT_CHECK_MSG(atomic_load(&s.total) == 3 * n * (n - 1) / 2 + n, "run %d: sum %lld", run,
                     (long long)atomic_load(&s.total));
    }
    lm_threadpool_destroy(pool);
}

int main(void) {
    LT_RUN(test_every_task_runs_exactly_once);
    LT_RUN(test_null_pool_runs_inline_in_order);
    LT_RUN(test_negative_task_count_runs_nothing);
    LT_RUN(test_create_arguments_and_destroy);
    LT_RUN(test_run_returns_after_all_tasks_finish);
    return lt_finish();
}
