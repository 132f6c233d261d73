/* loom/base.h — status codes, error detail, allocation and logging hooks, CPU
 * features, thread pool and read-only file mapping.
 *
 * Every fallible loom function returns lm_status (0 = LM_OK) and writes results
 * through out-parameters. On failure a human-readable detail is kept per thread in
 * lm_last_error(). The library never prints to stdout and never exits: messages go
 * to the logging hook (silent by default) and memory comes from the allocation hook.
 */
#ifndef LOOM_BASE_H
#define LOOM_BASE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* LM_API marks every public function: libloom is compiled with -fvisibility=hidden,
 * so these are the only symbols libloom.so exports. scripts/mark_lm_api.py adds it
 * to new declarations in the include/loom headers. */
#if defined(__GNUC__) || defined(__clang__)
#define LM_API __attribute__((visibility("default")))
#else
#define LM_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- version --------------------------------------------------------------------
 * The version of these headers; lm_version() answers the library's ("0.1.0"), so a
 * program can tell when it runs against a libloom.so other than the one it was built
 * with. CMakeLists.txt checks at configure time that these match project(VERSION)
 * (the SONAME, the CMake package and loom.pc take theirs from it). */
#define LM_VERSION_MAJOR 0
#define LM_VERSION_MINOR 1
#define LM_VERSION_PATCH 0
#define LM_VERSION_STRING "0.1.0"

/* "MAJOR.MINOR.PATCH" of the library in use. Static string. */
LM_API const char *lm_version(void);

/* X(name, value, message). The table only grows at the end: values are ABI. */
#define LM_STATUS_TABLE(X)                                                        \
    X(OK, 0, "success")                                                            \
    X(INVALID_ARGUMENT, 1, "invalid argument")                                     \
    X(OUT_OF_MEMORY, 2, "out of memory")                                           \
    X(SHAPE_MISMATCH, 3, "shape mismatch")                                         \
    X(DTYPE_MISMATCH, 4, "dtype mismatch")                                         \
    X(UNSUPPORTED, 5, "not supported")                                            \
    X(OUT_OF_RANGE, 6, "index or view out of range")                               \
    X(IO_ERROR, 7, "input/output error")                                           \
    X(PARSE_ERROR, 8, "malformed input data")                                      \
    X(NOT_FOUND, 9, "not found")                                                   \
    X(DEVICE_ERROR, 10, "device error")                                            \
    X(INTERNAL, 11, "internal error")

typedef enum lm_status {
#define LM__STATUS_ENUM(name, value, msg) LM_##name = value,
    LM_STATUS_TABLE(LM__STATUS_ENUM)
#undef LM__STATUS_ENUM
} lm_status;

/* "LM_SHAPE_MISMATCH"; "LM_UNKNOWN_STATUS" for values outside the table. Static. */
LM_API const char *lm_status_name(lm_status s);
/* "shape mismatch": the generic message for the code. Static string. */
LM_API const char *lm_status_str(lm_status s);
/* The detail of the last failure on this thread ("" when none). Valid until the
 * next loom call on this thread that fails or clears it. */
LM_API const char *lm_last_error(void);
LM_API void lm_clear_error(void);

/* ---- allocation hook ---------------------------------------------------------
 * All host memory the library owns comes from these hooks (default: malloc family).
 * Tests install a hook that fails after N allocations to prove error paths leak
 * nothing. Setting the hooks is not thread-safe; do it before other loom calls. */
typedef struct lm_alloc_hooks {
    void *(*alloc)(void *user, size_t nbytes, size_t align); /* NULL on failure */
    void (*free)(void *user, void *ptr);                     /* accepts NULL */
    void *user;
} lm_alloc_hooks;

/* hooks == NULL restores the defaults. */
LM_API void lm_set_alloc_hooks(const lm_alloc_hooks *hooks);

/* ---- logging hook -------------------------------------------------------------
 * Silent by default. The CLI installs a stderr logger. */
typedef enum lm_log_level { LM_LOG_ERROR = 0, LM_LOG_WARN = 1, LM_LOG_INFO = 2, LM_LOG_DEBUG = 3 } lm_log_level;
typedef void (*lm_log_fn)(void *user, lm_log_level level, const char *msg);
/* Messages at or below max_level reach fn. fn == NULL silences the library. */
LM_API void lm_set_log_fn(lm_log_fn fn, void *user, lm_log_level max_level);

/* ---- CPU features (detected once at run time with cpuid/xgetbv) -------------- */
typedef struct lm_cpu_features {
    int avx2, fma, f16c;
    int avx512f, avx512bw, avx512vl, avx512_bf16, avx512_fp16;
    int amx_tile, amx_bf16;
    int logical_cpus; /* CPUs this process may run on */
    int avx512_vnni;  /* VPDPBUSD on zmm (with the OS saving zmm state) */
    int avx_vnni;     /* VPDPBUSD on ymm, VEX-encoded (AVX-VNNI: no AVX-512 needed) */
    int amx_int8;     /* AMX-INT8 tile products (TDPBSUD ...), with the tile state granted (as amx_tile) */
} lm_cpu_features;

/* Pointer to a process-wide, immutable description. Never NULL. */
LM_API const lm_cpu_features *lm_cpu_get_features(void);

/* ---- thread pool ----------------------------------------------------------------
 * A fixed set of workers that run one parallel-for at a time. The calling thread
 * takes part as worker 0, so a pool of n threads starts n-1 workers. */
typedef struct lm_threadpool lm_threadpool;
/* fn is called for every task index in [0, ntasks); worker in [0, nthreads). */
typedef void (*lm_task_fn)(void *arg, int64_t task, int worker);

/* nthreads <= 0 means one per logical CPU. The caller owns *out: lm_threadpool_destroy. */
LM_API lm_status lm_threadpool_create(int nthreads, lm_threadpool **out);
LM_API void lm_threadpool_destroy(lm_threadpool *pool); /* accepts NULL; joins workers */
LM_API int lm_threadpool_size(const lm_threadpool *pool); /* 1 for NULL */
/* Runs fn for every task and returns when all are done. pool == NULL runs inline.
 * Not re-entrant: fn must not call lm_threadpool_run on the same pool. */
LM_API void lm_threadpool_run(lm_threadpool *pool, int64_t ntasks, lm_task_fn fn, void *arg);

/* ---- read-only file mapping ------------------------------------------------------ */
typedef struct lm_file_map {
    const uint8_t *data; /* [size] bytes, read-only; NULL when size == 0 */
    size_t size;
} lm_file_map;

/* Maps a whole file read-only. Errors: LM_IO_ERROR naming path and errno text. */
LM_API lm_status lm_file_map_open(const char *path, lm_file_map *map);
LM_API void lm_file_map_close(lm_file_map *map); /* accepts a zeroed map; zeroes it */
/* Reads a whole file into a NUL-terminated buffer owned by the caller (lm_free). */
LM_API lm_status lm_file_read_all(const char *path, char **out, size_t *size);

/* ---- random numbers: xoshiro256** seeded through splitmix64 ----------------------
 * The same seed gives the same stream on every machine; the whole state is four
 * words, so checkpoints can store and replay it. Used by sampling, data shuffling
 * and seeded initialisation. */
typedef struct lm_rng {
    uint64_t s[4];
} lm_rng;

LM_API void lm_rng_seed(lm_rng *r, uint64_t seed);
LM_API uint64_t lm_rng_next(lm_rng *r);
LM_API double lm_rng_uniform(lm_rng *r);            /* [0, 1), 53 random bits */
LM_API double lm_rng_normal(lm_rng *r);             /* N(0, 1), Box-Muller (one draw per call) */
LM_API uint64_t lm_rng_below(lm_rng *r, uint64_t n); /* uniform in [0, n), n >= 1, unbiased */

/* Memory from the allocation hook, for objects the library hands to callers. */
LM_API void *lm_malloc(size_t nbytes);
LM_API void lm_free(void *ptr);

#ifdef __cplusplus
}
#endif
#endif
