/* tests/harness.c — implementation of the test harness (see harness.h). */
#include "harness.h"

#include "loom/autograd.h"

#include <math.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int lt_failures_in_test;
static int g_passed, g_failed;

void lt_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    lt_failures_in_test++;
}

void lt_run(const char *name, void (*fn)(void)) {
    lt_failures_in_test = 0;
    lm_clear_error();
    fn();
    if (lt_failures_in_test) {
        g_failed++;
        printf("FAIL %s (%d failed checks)\n", name, lt_failures_in_test);
    } else {
        g_passed++;
        printf("ok   %s\n", name);
    }
    fflush(stdout);
}

int lt_finish(void) {
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}

void lt_skip(const char *why) {
    printf("skipped: %s\n", why);
    exit(77);
}

lt_rng lt_rng_seed(uint64_t seed) { return (lt_rng){seed * 0x9E3779B97F4A7C15ull + 1}; }

uint64_t lt_rng_u64(lt_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double lt_rng_uniform(lt_rng *r) { return (double)(lt_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

double lt_rng_normal(lt_rng *r) {
    double u1 = lt_rng_uniform(r), u2 = lt_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t lt_rng_int(lt_rng *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(lt_rng_u64(r) % (uint64_t)(hi - lo + 1));
}

lt_metrics lt_measure(const double *got, const double *want, int64_t n) {
    lt_metrics m = {0, 0, 0};
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            m.nonfinite++;
            continue;
        }
        double d = got[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
        if (fabs(d) > m.max_abs) m.max_abs = fabs(d);
    }
    m.nmse = den > 0 ? num / den : num;
    return m;
}

int lt_check_close(const char *what, const double *got, const double *want, int64_t n, double nmse_tol,
                   double abs_tol) {
    lt_metrics m = lt_measure(got, want, n);
    int ok = m.nonfinite == 0 && m.nmse <= nmse_tol && m.max_abs <= abs_tol;
    if (!ok)
        lt_fail(__FILE__, __LINE__, "%s: nmse %.3g (tol %.3g), max_abs %.3g (tol %.3g), %lld non-finite of %lld",
                what, m.nmse, nmse_tol, m.max_abs, abs_tol, (long long)m.nonfinite, (long long)n);
    return ok;
}

static double load_f64(lm_dtype dt, const void *p) {
    switch (dt) {
    case LM_F32: return *(const float *)p;
    case LM_BF16: return lm_bf16_to_f32(*(const uint16_t *)p);
    case LM_F16: return lm_f16_to_f32(*(const uint16_t *)p);
    case LM_I32: return *(const int32_t *)p;
    case LM_I64: return (double)*(const int64_t *)p;
    case LM_U8: return *(const uint8_t *)p;
    case LM_I8: return *(const int8_t *)p;
    }
    return NAN;
}

double *lt_view_to_f64(const lm_tensor_view *v) {
    int64_t n = lm_tensor_view_numel(v);
    double *out = malloc((size_t)(n ? n : 1) * sizeof(double));
    size_t es = lm_dtype_size(v->dtype);
    int64_t idx[LM_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; i++) {
        int64_t off = 0;
        for (int d = 0; d < v->ndim; d++) off += idx[d] * v->stride[d];
        out[i] = load_f64(v->dtype, (const char *)v->data + off * (int64_t)es);
        for (int d = v->ndim - 1; d >= 0; d--) {
            if (++idx[d] < v->shape[d]) break;
            idx[d] = 0;
        }
    }
    return out;
}

lm_tensor *lt_random_tensor(lt_rng *r, lm_dtype dt, int ndim, const int64_t *shape, double scale) {
    lm_tensor *t = NULL;
    if (lm_tensor_create(lm_device_cpu(), dt, ndim, shape, &t) != LM_OK) return NULL;
    int64_t n = lm_tensor_numel(t);
    void *p = lm_tensor_data(t);
    for (int64_t i = 0; i < n; i++) {
        double x = lt_rng_normal(r) * scale;
        switch (dt) {
        case LM_F32: ((float *)p)[i] = (float)x; break;
        case LM_BF16: ((uint16_t *)p)[i] = lm_f32_to_bf16((float)x); break;
        case LM_F16: ((uint16_t *)p)[i] = lm_f32_to_f16((float)x); break;
        case LM_I32: ((int32_t *)p)[i] = (int32_t)(x * 100); break;
        case LM_I64: ((int64_t *)p)[i] = (int64_t)(x * 100); break;
        case LM_U8: ((uint8_t *)p)[i] = (uint8_t)lt_rng_u64(r); break;
        case LM_I8: ((int8_t *)p)[i] = (int8_t)lt_rng_u64(r); break;
        }
    }
    return t;
}

lm_tensor *lt_poisoned_tensor(lm_dtype dt, int ndim, const int64_t *shape) {
    lm_tensor *t = NULL;
    if (lm_tensor_create(lm_device_cpu(), dt, ndim, shape, &t) != LM_OK) return NULL;
    if (lm_tensor_view_poison(NULL, lm_tensor_as_view(t)) != LM_OK) {
        lm_tensor_destroy(t);
        return NULL;
    }
    return t;
}

/* atomic: the library may free from other threads (e.g. storage released by a worker) */
static atomic_llong g_live, g_count;
static int64_t g_fail_at;

static void *track_alloc(void *user, size_t nbytes, size_t align) {
    (void)user;
    long long n = atomic_fetch_add(&g_count, 1) + 1;
    if (g_fail_at && n == g_fail_at) return NULL;
    size_t rounded = (nbytes + align - 1) / align * align;
    void *p = aligned_alloc(align, rounded ? rounded : align);
    if (p) g_live++;
    return p;
}

static void track_free(void *user, void *p) {
    (void)user;
    if (p) {
        g_live--;
        free(p);
    }
}

void lt_alloc_track(int64_t fail_at) {
    atomic_store(&g_live, 0);
    atomic_store(&g_count, 0);
    g_fail_at = fail_at;
    lm_alloc_hooks h = {track_alloc, track_free, NULL};
    lm_set_alloc_hooks(&h);
}

void lt_alloc_untrack(void) { lm_set_alloc_hooks(NULL); }
int64_t lt_alloc_live(void) { return g_live; }
int64_t lt_alloc_count(void) { return g_count; }

int lt_fixture_load(const char *path, lt_fixture *fx) {
    char full[1024];
    if (path[0] == '/') snprintf(full, sizeof full, "%s", path);
    else snprintf(full, sizeof full, "%s/%s", LOOM_SOURCE_DIR, path);
    memset(fx, 0, sizeof *fx);
    FILE *f = fopen(full, "rb");
    if (!f) {
        lt_fail(__FILE__, __LINE__, "cannot open fixture %s", full);
        return 0;
    }
    char line[512];
    int ok = fgets(line, sizeof line, f) && strcmp(line, "LMFX1\n") == 0;
    while (ok && fgets(line, sizeof line, f)) {
        lt_fixture_tensor t;
        memset(&t, 0, sizeof t);
        char dt[8];
        int used = 0;
        if (sscanf(line, "%63s %7s %d%n", t.name, dt, &t.ndim, &used) != 3 || t.ndim < 0 || t.ndim > LM_MAX_DIMS) {
            ok = 0;
            break;
        }
        t.is_int = strcmp(dt, "i64") == 0;
        t.numel = 1;
        char *p = line + used;
        for (int d = 0; d < t.ndim; d++) {
            t.shape[d] = strtoll(p, &p, 10);
            t.numel *= t.shape[d];
        }
        size_t n = (size_t)t.numel;
        void *buf = malloc(n ? n * 8 : 8);
        if (fread(buf, 8, n, f) != n) {
            free(buf);
            ok = 0;
            break;
        }
        if (t.is_int) t.i64 = buf;
        else t.f64 = buf;
        lt_fixture_tensor *grown = realloc(fx->tensors, sizeof *grown * (size_t)(fx->count + 1));
        grown[fx->count++] = t;
        fx->tensors = grown;
    }
    fclose(f);
    if (!ok) {
        lt_fail(__FILE__, __LINE__, "fixture %s is malformed", full);
        lt_fixture_free(fx);
    }
    return ok;
}

void lt_fixture_free(lt_fixture *fx) {
    for (int i = 0; i < fx->count; i++) {
        free(fx->tensors[i].f64);
        free(fx->tensors[i].i64);
    }
    free(fx->tensors);
    memset(fx, 0, sizeof *fx);
}

const lt_fixture_tensor *lt_fixture_get(const lt_fixture *fx, const char *name) {
    for (int i = 0; i < fx->count; i++)
        if (strcmp(fx->tensors[i].name, name) == 0) return &fx->tensors[i];
    lt_fail(__FILE__, __LINE__, "fixture has no tensor '%s'", name);
    return NULL;
}

lm_tensor *lt_fixture_tensor_to(const lt_fixture_tensor *t, lm_dtype dt) {
    lm_tensor *out = NULL;
    if (lm_tensor_create(lm_device_cpu(), dt, t->ndim, t->shape, &out) != LM_OK) return NULL;
    void *p = lm_tensor_data(out);
    for (int64_t i = 0; i < t->numel; i++) {
        double v = t->is_int ? (double)t->i64[i] : t->f64[i];
        switch (dt) {
        case LM_F32: ((float *)p)[i] = (float)v; break;
        case LM_BF16: ((uint16_t *)p)[i] = lm_f32_to_bf16((float)v); break;
        case LM_F16: ((uint16_t *)p)[i] = lm_f32_to_f16((float)v); break;
        case LM_I32: ((int32_t *)p)[i] = (int32_t)(t->is_int ? t->i64[i] : (int64_t)v); break;
        case LM_I64: ((int64_t *)p)[i] = t->is_int ? t->i64[i] : (int64_t)v; break;
        case LM_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
        case LM_I8: ((int8_t *)p)[i] = (int8_t)v; break;
        }
    }
    return out;
}

lt_cmd_result lt_run_cmd(const char *cmd) {
    static int counter;
    char out[128], err[128];
    snprintf(out, sizeof out, "/tmp/lt_cmd_%d_%d.out", (int)getpid(), counter);
    snprintf(err, sizeof err, "/tmp/lt_cmd_%d_%d.err", (int)getpid(), counter++);
    size_t len = strlen(cmd) + 2 * sizeof out + 64;
    char *full = malloc(len);
    lt_cmd_result r = {-1, NULL, NULL};
    if (!full) return r;
    snprintf(full, len, "( %s ) </dev/null >%s 2>%s", cmd, out, err);
    int st = system(full);
    free(full);
    r.status = st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    size_t n = 0;
    if (lm_file_read_all(out, &r.out, &n) != LM_OK) r.out = NULL;
    if (lm_file_read_all(err, &r.err, &n) != LM_OK) r.err = NULL;
    remove(out);
    remove(err);
    return r;
}

void lt_cmd_free(lt_cmd_result *r) {
    lm_free(r->out);
    lm_free(r->err);
    r->out = r->err = NULL;
}

float *lt_random_rows(lt_rng *r, int64_t M, int64_t K, int64_t ld) {
    float *x = malloc(sizeof(float) * (size_t)(M * ld + 1));
    for (int64_t i = 0; i < M * ld; i++) x[i] = i % ld < K ? (float)lt_rng_normal(r) : NAN;
    x[M * ld] = NAN;
    return x;
}

float *lt_poisoned_rows(int64_t M, int64_t ld) {
    float *y = malloc(sizeof(float) * (size_t)(M * ld + 1));
    for (int64_t i = 0; i < M * ld + 1; i++) y[i] = NAN;
    return y;
}

/* ---- the operation profile ------------------------------------------------------------ */
char *lt_profile_report(void) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        LT_CHECK_MSG(0, "open_memstream failed");
        return NULL;
    }
    lm_ag_profile_report(f);
    fclose(f);
    return buf;
}

int lt_profile_row(const char *report, const char *name, double *ms, long long *calls) {
    char key[96];
    snprintf(key, sizeof key, "  %s ", name);
    const char *p = report ? strstr(report, key) : NULL;
    return p && sscanf(p + strlen(key), "%lf %lld", ms, calls) == 2;
}

void lt_profile_check_batches(lm_ctx *g, lm_ctx *g2) {
    double ms = 0;
    long long calls = 0;
    lm_ag_profile_reset();
    lm_ag_profile_mark(g, "t ", "after reset");
    for (int i = 0; i < 10000; i++) lm_ag_profile_mark(g, "t ", i % 2 ? "odd" : "even");
    char *r = lt_profile_report();
    LT_CHECK_MSG(lt_profile_row(r, "t after reset", &ms, &calls) && calls == 1, "after reset:\n%s", r);
    LT_CHECK_MSG(lt_profile_row(r, "t odd", &ms, &calls) && calls == 5000 && ms >= 0, "odd:\n%s", r);
    LT_CHECK_MSG(lt_profile_row(r, "t even", &ms, &calls) && calls == 5000 && ms >= 0, "even:\n%s", r);
    LT_CHECK_MSG(r && !strstr(r, "could not be timed"), "lost marks:\n%s", r);
    int rows = 0; /* only these three: the reset forgot every earlier total */
    for (const char *p = r; p && (p = strstr(p, "\n  t ")) != NULL; p++) rows++;
    LT_CHECK_MSG(rows == 3, "%d rows after a reset and three names:\n%s", rows, r);
    free(r);
    lm_ag_profile_reset();
    lm_ag_profile_mark(g2, "t ", "c2first");
    lm_ag_profile_mark(g2, "t ", "c2second");
    lm_ag_profile_mark(g, "t ", "back");
    lm_ag_profile_mark(g, "t ", "again");
    r = lt_profile_report();
    LT_CHECK_MSG(r && !strstr(r, "t c2first"), "a mark on a new context was charged:\n%s", r);
    LT_CHECK_MSG(lt_profile_row(r, "t c2second", &ms, &calls) && calls == 1, "c2second:\n%s", r);
    LT_CHECK_MSG(!lt_profile_row(r, "t back", &ms, &calls), "a mark after a context change was charged:\n%s", r);
    LT_CHECK_MSG(lt_profile_row(r, "t again", &ms, &calls) && calls == 1, "again:\n%s", r);
    free(r);
}
