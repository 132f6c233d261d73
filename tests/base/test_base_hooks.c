/* Tests for the allocation and logging hooks: a custom allocation hook receives every
 * library allocation with its user pointer and alignment, NULL restores the default,
 * and making the k-th allocation fail (for every k) turns lm_tensor_create,
 * lm_storage_create, lm_ctx_create and lm_threadpool_create into LM_OUT_OF_MEMORY with
 * no leak; thread-pool workers never call the hooks themselves. Logging is silent
 * by default and filtered by level.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include "base/internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- an allocation hook that counts (thread-safe) and fails the k-th call ------ */
typedef struct counting_hook {
    atomic_llong calls, live, frees;
    long long fail_at; /* 1-based; 0 = never */
    size_t last_nbytes, last_align;
    void *last_ptr;
} counting_hook;

static void *counting_alloc(void *user, size_t nbytes, size_t align) {
    counting_hook *h = user;
    long long n = atomic_fetch_add(&h->calls, 1) + 1;
    if (h->fail_at && n == h->fail_at) return NULL;
    size_t rounded = (nbytes + align - 1) / align * align;
    void *p = aligned_alloc(align, rounded ? rounded : align);
    if (p) atomic_fetch_add(&h->live, 1);
    h->last_nbytes = nbytes;
    h->last_align = align;
    h->last_ptr = p;
    return p;
}

static void counting_free(void *user, void *p) {
    counting_hook *h = user;
    if (!p) return;
    atomic_fetch_add(&h->live, -1);
    atomic_fetch_add(&h->frees, 1);
    free(p);
}

static void hook_install(counting_hook *h, long long fail_at) {
    atomic_init(&h->calls, 0);
    atomic_init(&h->live, 0);
    atomic_init(&h->frees, 0);
    h->fail_at = fail_at;
    lm_alloc_hooks hooks = {counting_alloc, counting_free, h};
    lm_set_alloc_hooks(&hooks);
}

static void test_custom_hook_receives_calls_and_null_restores_default(void) {
    counting_hook h;
    hook_install(&h, 0);
    void *p = lm_malloc(100);
    LT_CHECK(p != NULL && atomic_load(&h.calls) == 1);
    LT_CHECK(h.last_ptr == p && h.last_nbytes == 100 && h.last_align == 64);
    LT_CHECK(((uintptr_t)p & 63) == 0);
    lm_free(p);
    LT_CHECK(atomic_load(&h.frees) == 1 && atomic_load(&h.live) == 0);
    lm_free(NULL);
    LT_CHECK(atomic_load(&h.frees) == 1);

    /* lm__alloc raises small alignments to a pointer's size and keeps large ones */
    void *q = lm__alloc(3, 1), *r = lm__alloc(10, 4096);
    LT_CHECK(h.last_align == 4096 && ((uintptr_t)r & 4095) == 0);
    LT_CHECK(q && ((uintptr_t)q % sizeof(void *)) == 0);
    lm__free(q);
    lm__free(r);
    unsigned char *z = lm__calloc(37, 3);
    int zero = 1;
    for (int i = 0; z && i < 111; i++) zero &= z[i] == 0;
    LT_CHECK(z && zero);
    lm__free(z);

    lm_set_alloc_hooks(NULL);
    long long before = atomic_load(&h.calls);
    p = lm_malloc(16);
    LT_CHECK(p != NULL && atomic_load(&h.calls) == before);
    lm_free(p);
    /* a hook table missing a function is treated as "restore the defaults" */
    lm_alloc_hooks partial = {counting_alloc, NULL, &h};
    lm_set_alloc_hooks(&partial);
    p = lm_malloc(16);
    LT_CHECK(atomic_load(&h.calls) == before);
    lm_free(p);
    lm_set_alloc_hooks(NULL);
}

/* The default hook: the alignment asked for below 4 MiB; 4 MiB and more start on a
 * 2 MiB boundary on Linux (huge-page advice, base/alloc.c); every byte writable. */
static void test_default_alignment_small_and_large(void) {
    static const size_t sizes[] = {1, 100, 4096, ((size_t)4 << 20) - 1, (size_t)4 << 20, ((size_t)9 << 20) + 3};
    static const size_t aligns[] = {8, 64, 4096};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
            unsigned char *p = lm__alloc(sizes[i], aligns[a]);
            LT_CHECK_MSG(p != NULL, "size %zu align %zu", sizes[i], aligns[a]);
            if (!p) continue;
#ifdef __linux__
            size_t want = sizes[i] >= ((size_t)4 << 20) ? ((size_t)2 << 20) : aligns[a];
#else
            size_t want = aligns[a]; /* no huge-page advice elsewhere */
#endif
            LT_CHECK_MSG((uintptr_t)p % want == 0, "size %zu align %zu: %p not %zu-aligned", sizes[i], aligns[a],
                         (void *)p, want);
            memset(p, 0x5a, sizes[i]);
            LT_CHECK(p[sizes[i] - 1] == 0x5a);
            lm__free(p);
        }
}

static void test_alloc_failure_sets_out_of_memory_detail(void) {
    counting_hook h;
    hook_install(&h, 1);
    lm_clear_error();
    LT_CHECK(lm_malloc(123) == NULL);
    LT_CHECK(strstr(lm_last_error(), "123") != NULL);
    LT_CHECK(lm__calloc(SIZE_MAX / 2, 4) == NULL);
    LT_CHECK(strstr(lm_last_error(), "overflows") != NULL);
    LT_CHECK(atomic_load(&h.calls) == 1); /* the overflowing request never reached the hook */
    lm_set_alloc_hooks(NULL);
}

/* ---- every k-th allocation fails: OOM, *out stays NULL, nothing leaks ------------- */
typedef lm_status (*make_fn)(void **out);
typedef void (*destroy_fn)(void *obj);

static lm_status make_tensor(void **out) {
    int64_t shape[3] = {2, 3, 5};
    return lm_tensor_create(lm_device_cpu(), LM_BF16, 3, shape, (lm_tensor **)out);
}
static void destroy_tensor(void *o) { lm_tensor_destroy(o); }
static lm_status make_storage(void **out) { return lm_storage_create(lm_device_cpu(), 1000, (lm_storage **)out); }
static void destroy_storage(void *o) { lm_storage_release(o); }
static lm_status make_ctx(void **out) { return lm_ctx_create(lm_device_cpu(), 4, (lm_ctx **)out); }
static void destroy_ctx(void *o) { lm_ctx_destroy(o); }
static lm_status make_pool(void **out) { return lm_threadpool_create(5, (lm_threadpool **)out); }
static void destroy_pool(void *o) { lm_threadpool_destroy(o); }

static void check_every_failure(const char *what, make_fn make, destroy_fn destroy, int min_allocs) {
    int k = 1;
    for (;; k++) {
        counting_hook h;
        hook_install(&h, k);
        void *obj = (void *)&h; /* must be reset to NULL on failure */
        lm_status st = make(&obj);
        long long calls = atomic_load(&h.calls);
        if (st == LM_OK) {
            LT_CHECK_MSG(calls < k, "%s: allocation %d failed but the call succeeded", what, k);
            destroy(obj);
        } else {
            LT_CHECK_MSG(st == LM_OUT_OF_MEMORY, "%s: fail_at %d gave %s (%s)", what, k, lm_status_name(st),
                         lm_last_error());
            LT_CHECK_MSG(obj == NULL, "%s: fail_at %d left *out set", what, k);
        }
        LT_CHECK_MSG(atomic_load(&h.live) == 0, "%s: fail_at %d leaked %lld allocations", what, k,
                     (long long)atomic_load(&h.live));
        lm_set_alloc_hooks(NULL);
        if (st == LM_OK || k > 1000) break;
    }
    LT_CHECK_MSG(k - 1 >= min_allocs, "%s: only %d allocations were exercised", what, k - 1);
}

static void test_failure_injection_every_allocation(void) {
    check_every_failure("lm_tensor_create", make_tensor, destroy_tensor, 3);
    check_every_failure("lm_storage_create", make_storage, destroy_storage, 2);
    check_every_failure("lm_ctx_create", make_ctx, destroy_ctx, 3);
    check_every_failure("lm_threadpool_create", make_pool, destroy_pool, 3);
}

/* ---- pool allocations happen on the creating thread ---------------------------------
 * Workers must not call the hooks: a hook that is not thread-safe (the test harness's
 * lt_alloc_track counters are plain integers) would race with the creating thread. */
static pthread_t g_owner;
static atomic_int g_foreign_calls;

static void *owner_alloc(void *user, size_t nbytes, size_t align) {
    if (!pthread_equal(pthread_self(), g_owner)) atomic_fetch_add(&g_foreign_calls, 1);
    return counting_alloc(user, nbytes, align);
}

static void owner_free(void *user, void *p) {
    if (p && !pthread_equal(pthread_self(), g_owner)) atomic_fetch_add(&g_foreign_calls, 1);
    counting_free(user, p);
}

static void test_pool_hooks_called_only_by_creating_thread(void) {
    counting_hook h;
    hook_install(&h, 0);
    lm_alloc_hooks hooks = {owner_alloc, owner_free, &h};
    lm_set_alloc_hooks(&hooks);
    g_owner = pthread_self();
    atomic_store(&g_foreign_calls, 0);
    for (int i = 0; i < 20; i++) {
        lm_ctx *ctx = NULL;
        LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 2 + i % 6, &ctx));
        lm_ctx_destroy(ctx);
    }
    lm_set_alloc_hooks(NULL);
    LT_CHECK_MSG(atomic_load(&g_foreign_calls) == 0, "%d hook calls came from worker threads",
                 atomic_load(&g_foreign_calls));
    LT_CHECK(atomic_load(&h.live) == 0);
}

/* ---- logging ------------------------------------------------------------------------ */
typedef struct log_sink {
    int count[4];
    char last[2048];
} log_sink;

static void sink_fn(void *user, lm_log_level level, const char *msg) {
    log_sink *s = user;
    if ((int)level >= 0 && (int)level < 4) s->count[level]++;
    snprintf(s->last, sizeof s->last, "%s", msg);
}

/* Runs failing library calls with stdout/stderr pointed at a temp file; returns the
 * number of bytes that reached either stream. */
static long output_of_failures(void) {
    char path[] = "/tmp/loom_test_logXXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    fflush(stdout);
    fflush(stderr);
    int out = dup(1), err = dup(2);
    dup2(fd, 1);
    dup2(fd, 2);
    lm_dtype dt;
    lm_dtype_parse("nope", &dt);
    lm_file_map map;
    lm_file_map_open("/nonexistent/loom/file", &map);
    lm__log(LM_LOG_ERROR, "an error nobody listens to");
    lm__error(LM_INTERNAL, "an internal error");
    fflush(stdout);
    fflush(stderr);
    dup2(out, 1);
    dup2(err, 2);
    close(out);
    close(err);
    long size = (long)lseek(fd, 0, SEEK_END);
    close(fd);
    unlink(path);
    return size;
}

static void test_logging_silent_by_default(void) {
    LT_CHECK_MSG(output_of_failures() == 0, "the library wrote to stdout/stderr without a log hook");
}

static void test_logging_filters_by_level(void) {
    log_sink s;
    memset(&s, 0, sizeof s);
    lm_set_log_fn(sink_fn, &s, LM_LOG_WARN);
    lm__log(LM_LOG_ERROR, "e%d", 1);
    lm__log(LM_LOG_WARN, "w%d", 2);
    lm__log(LM_LOG_INFO, "i");
    lm__log(LM_LOG_DEBUG, "d");
    LT_CHECK(s.count[LM_LOG_ERROR] == 1 && s.count[LM_LOG_WARN] == 1);
    LT_CHECK(s.count[LM_LOG_INFO] == 0 && s.count[LM_LOG_DEBUG] == 0);
    LT_CHECK(strcmp(s.last, "w2") == 0);
    /* errors are reported at debug level, with the status name and the detail */
    lm__error(LM_IO_ERROR, "cannot open 'x'");
    LT_CHECK(s.count[LM_LOG_DEBUG] == 0);
    lm_set_log_fn(sink_fn, &s, LM_LOG_DEBUG);
    lm__error(LM_IO_ERROR, "cannot open 'x'");
    LT_CHECK(s.count[LM_LOG_DEBUG] == 1);
    LT_CHECK(strstr(s.last, "LM_IO_ERROR") && strstr(s.last, "cannot open 'x'"));
    /* messages longer than the formatting buffer arrive truncated, NUL-terminated */
    static char big[3000];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    lm__log(LM_LOG_INFO, "%s", big);
    LT_CHECK(s.count[LM_LOG_INFO] == 1 && strlen(s.last) > 100 && strlen(s.last) < sizeof big - 1);
    /* fn == NULL silences the library again */
    lm_set_log_fn(NULL, NULL, LM_LOG_DEBUG);
    lm__log(LM_LOG_ERROR, "gone");
    LT_CHECK(s.count[LM_LOG_ERROR] == 1);
    LT_CHECK(output_of_failures() == 0);
    lm_set_log_fn(NULL, NULL, LM_LOG_WARN);
}

int main(void) {
    LT_RUN(test_custom_hook_receives_calls_and_null_restores_default);
    LT_RUN(test_default_alignment_small_and_large);
    LT_RUN(test_alloc_failure_sets_out_of_memory_detail);
    LT_RUN(test_failure_injection_every_allocation);
    LT_RUN(test_pool_hooks_called_only_by_creating_thread);
    LT_RUN(test_logging_silent_by_default);
    LT_RUN(test_logging_filters_by_level);
    return lt_finish();
}
