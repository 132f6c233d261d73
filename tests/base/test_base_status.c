/* Tests for the status table and the per-thread error detail: every status of the
 * X-macro table has its own name and message, unknown values have a fallback name,
 * lm_last_error() is thread-local, long details are truncated (never overflowed),
 * and lm__error_context() prefixes the detail of an error passing up a layer.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include "base/internal.h"

#include <pthread.h>
#include <string.h>

typedef struct status_row {
    lm_status value;
    const char *name; /* "LM_" #name, as the table spells it */
    const char *msg;
} status_row;

static const status_row k_rows[] = {
#define ROW(name, value, msg) {LM_##name, "LM_" #name, msg},
    LM_STATUS_TABLE(ROW)
#undef ROW
};
#define NROWS ((int)(sizeof k_rows / sizeof k_rows[0]))

static void test_every_status_has_distinct_name_and_message(void) {
    LT_CHECK(LM_OK == 0);
    for (int i = 0; i < NROWS; i++) {
        /* values are ABI: dense from 0 in table order */
        LT_CHECK_MSG((int)k_rows[i].value == i, "%s has value %d, expected %d", k_rows[i].name, (int)k_rows[i].value, i);
        LT_CHECK_MSG(strcmp(lm_status_name(k_rows[i].value), k_rows[i].name) == 0, "name of %d is %s", i,
                     lm_status_name(k_rows[i].value));
        LT_CHECK(strcmp(lm_status_str(k_rows[i].value), k_rows[i].msg) == 0);
        LT_CHECK(strlen(k_rows[i].msg) > 0);
        for (int j = 0; j < i; j++) {
            LT_CHECK_MSG(strcmp(lm_status_name(k_rows[i].value), lm_status_name(k_rows[j].value)) != 0,
                         "statuses %d and %d share a name", i, j);
            LT_CHECK_MSG(strcmp(lm_status_str(k_rows[i].value), lm_status_str(k_rows[j].value)) != 0,
                         "statuses %d and %d share a message", i, j);
        }
    }
}

static void test_unknown_status_has_fallback_name(void) {
    const lm_status unknown[] = {(lm_status)NROWS, (lm_status)999, (lm_status)-1};
    for (int i = 0; i < 3; i++) {
        LT_CHECK(strcmp(lm_status_name(unknown[i]), "LM_UNKNOWN_STATUS") == 0);
        const char *s = lm_status_str(unknown[i]);
        LT_CHECK(s && strlen(s) > 0);
        for (int j = 0; j < NROWS; j++) LT_CHECK(strcmp(s, k_rows[j].msg) != 0);
    }
}

static void test_error_detail_set_by_library_and_cleared(void) {
    lm_clear_error();
    LT_CHECK(strcmp(lm_last_error(), "") == 0);
    lm_dtype dt;
    LT_CHECK_STATUS(lm_dtype_parse("float8", &dt), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "float8") != NULL);
    lm_clear_error();
    LT_CHECK(lm_last_error()[0] == '\0');
    LT_CHECK(lm__error(LM_PARSE_ERROR, "bad token %d in '%s'", 7, "x.json") == LM_PARSE_ERROR);
    LT_CHECK(strcmp(lm_last_error(), "bad token 7 in 'x.json'") == 0);
}

/* ---- thread-locality: two threads set different details between barriers ------ */
typedef struct thread_probe {
    pthread_barrier_t *barrier;
    char seen_before[64]; /* detail the thread saw before setting its own */
    char seen_after[64];  /* its own detail after the main thread set a different one */
} thread_probe;

static void *probe_main(void *raw) {
    thread_probe *p = raw;
    snprintf(p->seen_before, sizeof p->seen_before, "%s", lm_last_error());
    lm__error(LM_IO_ERROR, "detail from worker");
    pthread_barrier_wait(p->barrier); /* both details are set */
    pthread_barrier_wait(p->barrier); /* main has read its own and overwritten it */
    snprintf(p->seen_after, sizeof p->seen_after, "%s", lm_last_error());
    return NULL;
}

static void test_last_error_is_per_thread(void) {
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, 2);
    thread_probe probe = {&barrier, "", ""};
    lm__error(LM_SHAPE_MISMATCH, "detail from main");
    pthread_t th;
    LT_CHECK(pthread_create(&th, NULL, probe_main, &probe) == 0);
    pthread_barrier_wait(&barrier);
    LT_CHECK(strcmp(lm_last_error(), "detail from main") == 0);
    lm__error(LM_NOT_FOUND, "main again");
    pthread_barrier_wait(&barrier);
    pthread_join(th, NULL);
    pthread_barrier_destroy(&barrier);
    LT_CHECK_MSG(strcmp(probe.seen_before, "") == 0, "a new thread saw '%s'", probe.seen_before);
    LT_CHECK_MSG(strcmp(probe.seen_after, "detail from worker") == 0, "worker saw '%s'", probe.seen_after);
    LT_CHECK(strcmp(lm_last_error(), "main again") == 0);
}

static void test_long_details_are_truncated(void) {
    static char big[5000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    lm__error(LM_INTERNAL, "%s", big);
    size_t n = strlen(lm_last_error());
    LT_CHECK_MSG(n > 500 && n < sizeof big - 1, "detail length %zu", n);
    LT_CHECK(strncmp(lm_last_error(), big, n) == 0);

    /* a long prefix over a long detail stays bounded and keeps the prefix first */
    lm__error(LM_IO_ERROR, "%s", big);
    big[3000] = '\0';
    memset(big, 'p', 3000);
    LT_CHECK(lm__error_context(LM_IO_ERROR, "%s", big) == LM_IO_ERROR);
    size_t m = strlen(lm_last_error());
    LT_CHECK(m == n);
    LT_CHECK(lm_last_error()[0] == 'p' && lm_last_error()[m - 1] == 'p');
}

static void test_error_context_prefixes_detail(void) {
    lm__error(LM_IO_ERROR, "cannot open 'a.bin'");
    LT_CHECK(lm__error_context(LM_IO_ERROR, "loading shard %d", 3) == LM_IO_ERROR);
    LT_CHECK_MSG(strcmp(lm_last_error(), "loading shard 3: cannot open 'a.bin'") == 0, "got '%s'", lm_last_error());
    LT_CHECK(lm__error_context(LM_NOT_FOUND, "model '%s'", "tiny") == LM_NOT_FOUND);
    LT_CHECK(strcmp(lm_last_error(), "model 'tiny': loading shard 3: cannot open 'a.bin'") == 0);
    /* a long existing detail is cut at the end, the new prefix survives */
    char mid[900];
    memset(mid, 'm', sizeof mid - 1);
    mid[sizeof mid - 1] = '\0';
    lm__error(LM_IO_ERROR, "%s", mid);
    lm__error_context(LM_IO_ERROR, "%s", mid);
    const char *e = lm_last_error();
    LT_CHECK(strncmp(e, mid, sizeof mid - 1) == 0 && e[sizeof mid - 1] == ':');
}

static void test_error_may_quote_the_previous_detail(void) {
    /* "wrap: %s" with lm_last_error() as argument reads the buffer it writes */
    lm__error(LM_PARSE_ERROR, "unexpected '}' at byte 17");
    lm__error(LM_PARSE_ERROR, "config.json: %s", lm_last_error());
    LT_CHECK_MSG(strcmp(lm_last_error(), "config.json: unexpected '}' at byte 17") == 0, "got '%s'", lm_last_error());
}

int main(void) {
    LT_RUN(test_every_status_has_distinct_name_and_message);
    LT_RUN(test_unknown_status_has_fallback_name);
    LT_RUN(test_error_detail_set_by_library_and_cleared);
    LT_RUN(test_last_error_is_per_thread);
    LT_RUN(test_long_details_are_truncated);
    LT_RUN(test_error_context_prefixes_detail);
    LT_RUN(test_error_may_quote_the_previous_detail);
    return lt_finish();
}
