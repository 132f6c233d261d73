/* tests/harness.h — the small test harness every loom test uses.
 *
 * Checks record failures and continue; lt_finish() prints "N passed, N failed" and
 * returns the process exit code. Comparisons use normalized MSE
 * sum((a-b)^2)/sum(b^2) plus max-abs, and NaN/Inf never pass. The allocation
 * tracker installs lm_set_alloc_hooks so tests can count live allocations and make
 * the Nth allocation fail.
 */
#ifndef LOOM_TEST_HARNESS_H
#define LOOM_TEST_HARNESS_H

#include "loom/loom.h"

#include <stdint.h>
#include <stdio.h>

extern int lt_failures_in_test;

void lt_fail(const char *file, int line, const char *fmt, ...);

#define LT_CHECK(cond)                                                   \
    do {                                                                 \
        if (!(cond)) lt_fail(__FILE__, __LINE__, "check failed: %s", #cond); \
    } while (0)
#define LT_CHECK_MSG(cond, ...)                                \
    do {                                                       \
        if (!(cond)) lt_fail(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
/* expr must return LM_OK; prints lm_last_error() otherwise. */
#define LT_CHECK_OK(expr)                                                                                  \
    do {                                                                                                   \
        lm_status lt__s = (expr);                                                                          \
        if (lt__s != LM_OK)                                                                                \
            lt_fail(__FILE__, __LINE__, "%s returned %s: %s", #expr, lm_status_name(lt__s), lm_last_error()); \
    } while (0)
/* expr must return exactly the given status. */
#define LT_CHECK_STATUS(expr, want)                                                                          \
    do {                                                                                                     \
        lm_status lt__s = (expr);                                                                            \
        if (lt__s != (want))                                                                                 \
            lt_fail(__FILE__, __LINE__, "%s returned %s, expected %s (%s)", #expr, lm_status_name(lt__s),   \
                    lm_status_name(want), lm_last_error());                                                  \
    } while (0)

/* Runs one test function, reporting its name. */
#define LT_RUN(fn) lt_run(#fn, fn)
void lt_run(const char *name, void (*fn)(void));
/* Prints the summary line and returns 0 if everything passed, 1 otherwise. */
int lt_finish(void);
/* Exits with 77 (CTest "skipped") and a reason. */
void lt_skip(const char *why);

/* ---- deterministic random numbers (splitmix64) --------------------------------- */
typedef struct lt_rng {
    uint64_t s;
} lt_rng;
lt_rng lt_rng_seed(uint64_t seed);
uint64_t lt_rng_u64(lt_rng *r);
double lt_rng_uniform(lt_rng *r);                 /* [0, 1) */
double lt_rng_normal(lt_rng *r);                  /* N(0, 1) */
int64_t lt_rng_int(lt_rng *r, int64_t lo, int64_t hi); /* [lo, hi] inclusive */

/* ---- comparisons -------------------------------------------------------------------- */
typedef struct lt_metrics {
    double nmse, max_abs;
    int64_t nonfinite; /* count of NaN/Inf in got */
} lt_metrics;
lt_metrics lt_measure(const double *got, const double *want, int64_t n);
/* Fails (and prints metrics) unless nmse <= nmse_tol, max_abs <= abs_tol and all finite. */
int lt_check_close(const char *what, const double *got, const double *want, int64_t n, double nmse_tol,
                   double abs_tol);

/* ---- tensors --------------------------------------------------------------------------- */
/* Reads any CPU view (any dtype, any strides) into a new row-major double array (free()). */
double *lt_view_to_f64(const lm_tensor_view *v);
/* A new contiguous CPU tensor of dtype filled with N(0, scale^2) values, rounded to dtype. */
lm_tensor *lt_random_tensor(lt_rng *r, lm_dtype dt, int ndim, const int64_t *shape, double scale);
/* A new contiguous CPU tensor poisoned with NaN (floats) / 0xA5 bytes (ints). */
lm_tensor *lt_poisoned_tensor(lm_dtype dt, int ndim, const int64_t *shape);
/* Raw f32 rows for the kernel-level tests (free()): M rows ld apart, elements k < K
 * N(0, 1) and the padding k >= K NaN; poisoned: every element NaN. Both allocate one
 * float more than M * ld (a NaN sentinel past the end). */
float *lt_random_rows(lt_rng *r, int64_t M, int64_t K, int64_t ld);
float *lt_poisoned_rows(int64_t M, int64_t ld);

/* ---- allocation tracking ------------------------------------------------------------------ */
/* Installs counting hooks; fail_at = k makes the k-th allocation (1-based) from now
 * fail, 0 = never. */
void lt_alloc_track(int64_t fail_at);
void lt_alloc_untrack(void); /* restores default hooks */
int64_t lt_alloc_live(void); /* allocations not yet freed since lt_alloc_track */
int64_t lt_alloc_count(void); /* allocations attempted since lt_alloc_track */


/* ---- reference fixtures (scripts/lmfx.py writes them) ---------------------------------------- */
typedef struct lt_fixture_tensor {
    char name[64];
    int is_int;      /* 1: i64 data, 0: f64 data */
    int ndim;
    int64_t shape[LM_MAX_DIMS];
    int64_t numel;
    double *f64;     /* [numel] when !is_int */
    int64_t *i64;    /* [numel] when is_int */
} lt_fixture_tensor;
typedef struct lt_fixture {
    int count;
    lt_fixture_tensor *tensors; /* [count] */
} lt_fixture;
/* Loads path (relative paths are taken from the source tree). Returns 0 on failure
 * after recording a test failure that names the file. */
int lt_fixture_load(const char *path, lt_fixture *fx);
void lt_fixture_free(lt_fixture *fx);
/* The tensor called name, or NULL (and a recorded failure) when missing. */
const lt_fixture_tensor *lt_fixture_get(const lt_fixture *fx, const char *name);
/* A new contiguous CPU tensor of dtype holding the fixture's values (rounded to dtype). */
lm_tensor *lt_fixture_tensor_to(const lt_fixture_tensor *t, lm_dtype dt);

/* ---- running commands (tests of the CLI) ----------------------------------------- */
typedef struct lt_cmd_result {
    int status; /* exit status; -1 when the shell did not exit normally */
    char *out;  /* stdout, NUL-terminated (lm_free; NULL when it could not be read) */
    char *err;  /* stderr, likewise */
} lt_cmd_result;
/* Runs `( cmd )` through the shell with stdin from /dev/null (cmd's own redirections
 * and pipes still apply inside) and stdout and stderr captured whole. */
lt_cmd_result lt_run_cmd(const char *cmd);
void lt_cmd_free(lt_cmd_result *r);

/* ---- the operation profile (LOOM_PROFILE, loom/autograd.h) ---------------------- */
/* lm_ag_profile_report's text, NUL-terminated (free()). */
char *lt_profile_report(void);
/* The report's row for operation name: 1 with its milliseconds and calls, 0 when absent. */
int lt_profile_row(const char *report, const char *name, double *ms, long long *calls);
/* The marks' bookkeeping on any device (LOOM_PROFILE must be on): a reset keeps the
 * last mark as the base; 10,000 marks on g (more than one batch of events) are all
 * counted and timed; a mark on g2, another context, starts a new batch (its first mark
 * and the first one back on g are not charged). */
void lt_profile_check_batches(lm_ctx *g, lm_ctx *g2);

/* 1 in a build with AddressSanitizer (gcc or clang), else 0. */
#if defined(__SANITIZE_ADDRESS__)
#define LT_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LT_UNDER_ASAN 1
#endif
#endif
#ifndef LT_UNDER_ASAN
#define LT_UNDER_ASAN 0
#endif

#endif
