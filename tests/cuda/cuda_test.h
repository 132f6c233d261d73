/* tests/cuda/cuda_test.h — helpers shared by the CUDA tests (header only).
 *
 * The pattern of every CUDA operator test: build inputs on the host (random, rounded
 * to the dtype, often strided views of a larger tensor), compute the truth with the
 * CPU reference operators (a context with LM_IMPL_REF), mirror the very same views
 * onto the GPU (same strides, same offsets into an uploaded copy of the parent),
 * poison the GPU outputs with NaN, run the launcher on the context's stream,
 * synchronize, read the outputs back through the same views, and compare with
 * NMSE + max-abs gates (NaN never passes, so an unwritten element fails).
 * Gates: the GPU accumulates in f32 where the reference uses double, and both round
 * once to the output dtype, so results differ by accumulated f32 error (~1e-7
 * relative) plus occasional one-ulp rounding flips of the output: NMSE 1e-10 (f32),
 * 3e-5 (bf16: one ulp is up to 2^-7 relative), 3e-7 (f16).
 */
#ifndef LOOM_TESTS_CUDA_TEST_H
#define LOOM_TESTS_CUDA_TEST_H

#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef LOOM_HAVE_CUDA
#include "loom/model.h"
#include "ops/cuda/cuda_ops.h"

static const lm_device ct_gpu = {LM_DEVICE_CUDA, 0};
static const lm_dtype ct_floats[] = {LM_F32, LM_BF16, LM_F16};

static inline double ct_nmse(lm_dtype dt) { return dt == LM_F32 ? 1e-10 : dt == LM_BF16 ? 3e-5 : 3e-7; }
/* About one ulp of the dtype at magnitude `scale` (plus f32 accumulation slack). */
static inline double ct_abs(lm_dtype dt, double scale) {
    return scale * (dt == LM_F32 ? 1e-5 : dt == LM_BF16 ? 1.6e-2 : 2e-3);
}

/* A CPU context forced to the readable reference level. */
static inline lm_ctx *ct_ref_ctx(void) {
    lm_ctx *c = NULL;
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &c));
    lm_ctx_set_impl(c, LM_IMPL_REF);
    return c;
}

static inline cudaStream_t ct_stream(lm_ctx *gctx) { return (cudaStream_t)lm_ctx_stream(gctx); }

/* A device tensor holding a copy of host tensor h (contiguous h: same layout). */
static inline lm_tensor *ct_upload(const lm_tensor *h) {
    lm_tensor *d = NULL;
    LT_CHECK_OK(lm_tensor_to_device(NULL, h, ct_gpu, &d));
    return d;
}

/* The view on parent `to` that `hv` is on parent `from`: same dtype, shape, strides
 * and element offset from the parent's first element; device taken from `to`. */
static inline lm_tensor_view ct_mirror(const lm_tensor *from, const lm_tensor_view *hv, const lm_tensor *to) {
    lm_tensor_view v = *hv;
    size_t es = lm_dtype_size(hv->dtype);
    ptrdiff_t off = ((const char *)hv->data - (const char *)lm_tensor_data(from)) / (ptrdiff_t)es;
    v.data = (char *)lm_tensor_data(to) + off * (ptrdiff_t)es;
    v.device = lm_tensor_device(to);
    return v;
}

/* A host parent tensor and a device copy of it. */
typedef struct ct_pair {
    lm_tensor *h, *d;
} ct_pair;

static inline ct_pair ct_pair_of(lm_tensor *h) { return (ct_pair){h, ct_upload(h)}; }
static inline void ct_pair_free(ct_pair *p) {
    lm_tensor_destroy(p->h);
    lm_tensor_destroy(p->d);
    p->h = p->d = NULL;
}
/* A random host tensor (N(0, scale^2), rounded to dt) and its device copy. */
static inline ct_pair ct_random(lt_rng *r, lm_dtype dt, int nd, const int64_t *shape, double scale) {
    return ct_pair_of(lt_random_tensor(r, dt, nd, shape, scale));
}
/* A NaN-poisoned device tensor (and a host twin used for views). */
static inline ct_pair ct_poisoned(lm_dtype dt, int nd, const int64_t *shape) {
    return ct_pair_of(lt_poisoned_tensor(dt, nd, shape));
}

/* Waits for the context and reads the device view v (of parent p.d) as doubles in
 * row-major order (free()). */
static inline double *ct_read(lm_ctx *gctx, const ct_pair *p, const lm_tensor_view *v) {
    LT_CHECK_OK(lm_ctx_synchronize(gctx));
    lm_tensor *back = NULL;
    LT_CHECK_OK(lm_tensor_to_device(NULL, p->d, lm_device_cpu(), &back));
    if (!back) return calloc(1, sizeof(double));
    lm_tensor_view hv = ct_mirror(p->d, v, back);
    double *out = lt_view_to_f64(&hv);
    lm_tensor_destroy(back);
    return out;
}

/* Compares device view dv (parent dp) with host view want, element for element. */
static inline int ct_check(lm_ctx *gctx, const char *what, const ct_pair *dp, const lm_tensor_view *dv,
                           const lm_tensor_view *want, double nmse, double abs_tol) {
    double *got = ct_read(gctx, dp, dv), *ref = lt_view_to_f64(want);
    int ok = lt_check_close(what, got, ref, lm_tensor_view_numel(want), nmse, abs_tol);
    free(got);
    free(ref);
    return ok;
}

/* Largest |v[i]| of n doubles (NaN compares false, so it never wins). */
static inline double ct_max_abs(const double *v, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabs(v[i]) > m) m = fabs(v[i]);
    return m;
}

/* Two [T, V] logit tables compared: NMSE of got against want, max |got - want|, the
 * positions whose argmax agrees (ties to the lower index), and whether got is finite. */
typedef struct ct_logits_cmp {
    double nmse, max_abs;
    int top1, finite;
} ct_logits_cmp;
static inline ct_logits_cmp ct_logits_compare(const float *got, const float *want, int64_t T, int64_t V) {
    ct_logits_cmp c = {0, 0, 0, 1};
    double se = 0, sw = 0;
    for (int64_t i = 0; i < T * V; i++) {
        double e = (double)got[i] - want[i];
        c.finite &= isfinite(got[i]) != 0;
        se += e * e, sw += (double)want[i] * want[i];
        if (fabs(e) > c.max_abs) c.max_abs = fabs(e);
    }
    for (int64_t t = 0; t < T; t++) {
        int64_t a = 0, b = 0;
        for (int64_t v = 1; v < V; v++) {
            if (got[t * V + v] > got[t * V + a]) a = v;
            if (want[t * V + v] > want[t * V + b]) b = v;
        }
        c.top1 += a == b;
    }
    c.nmse = se / (sw > 0 ? sw : 1);
    return c;
}

/* Logits [T, V] (free()) of model m on ctx from a fresh one-slot cache: one prefill of the
 * T tokens ids (every position's logits), or T one-token decode steps; waits for ctx. */
static inline float *ct_model_logits(const lm_model *m, lm_ctx *ctx, const int32_t *ids, int T, int decode) {
    int64_t V = lm_model_get_config(m)->vocab_size;
    float *out = malloc(sizeof(float) * (size_t)(T * V));
    lm_kv_cache *c = NULL;
    int slot = 0;
    LT_CHECK_OK(lm_kv_cache_create(m, 1, T, &c));
    if (decode)
        for (int t = 0; t < T; t++) LT_CHECK_OK(lm_model_forward(m, ctx, c, &slot, 1, ids + t, 1, out + t * V, 0));
    else
        LT_CHECK_OK(lm_model_forward(m, ctx, c, &slot, 1, ids, T, out, 1));
    LT_CHECK_OK(lm_ctx_synchronize(ctx));
    lm_kv_cache_destroy(c);
    return out;
}

/* A dims-reversed random tensor viewed back (permuted) to logical shape `shape`:
 * no stride is row-major when nd >= 2. */
static inline ct_pair ct_random_reversed(lt_rng *r, lm_dtype dt, int nd, const int64_t *shape, double scale,
                                         lm_tensor_view *hv, lm_tensor_view *dv) {
    int64_t rs[LM_MAX_DIMS];
    int perm[LM_MAX_DIMS];
    for (int i = 0; i < nd; i++) rs[i] = shape[nd - 1 - i], perm[i] = nd - 1 - i;
    ct_pair p = ct_random(r, dt, nd, rs, scale);
    LT_CHECK_OK(lm_tensor_view_permute(lm_tensor_as_view(p.h), perm, hv));
    *dv = ct_mirror(p.h, hv, p.d);
    return p;
}

/* A poisoned tensor whose last dim is twice as long, viewed with step 2: a strided
 * output of logical shape `shape`. */
static inline ct_pair ct_poisoned_strided(lm_dtype dt, int nd, const int64_t *shape, lm_tensor_view *hv,
                                          lm_tensor_view *dv) {
    int64_t s[LM_MAX_DIMS];
    memcpy(s, shape, sizeof(int64_t) * (size_t)nd);
    s[nd - 1] *= 2;
    ct_pair p = ct_poisoned(dt, nd, s);
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(p.h), nd - 1, 0, s[nd - 1], 2, hv));
    *dv = ct_mirror(p.h, hv, p.d);
    return p;
}

/* Skips (exit 77) without a GPU; returns a CUDA context otherwise. */
/* Sets LOOM_FLASH_WGMMA to form (1 wgmma, 0 mma.sync) and checks the flash kernels
 * take it: the wgmma form on a compute 9.0 device when the build has sm_90a code, the
 * mma.sync form everywhere else (so a pass meant for the wgmma kernels cannot quietly
 * test the mma.sync ones). */
static inline void ct_flash_form(int form) {
    setenv("LOOM_FLASH_WGMMA", form ? "1" : "0", 1);
    int want = 0;
#ifdef LOOM_CUDA_SM90A
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    want = form && major == 9 && minor == 0;
#endif
    LT_CHECK_MSG(lm__cuda_flash_attention_wgmma() == want, "flash kernels: wgmma form %d, expected %d",
                 lm__cuda_flash_attention_wgmma(), want);
}

static inline lm_ctx *ct_start(void) {
    if (lm_cuda_device_count() == 0) lt_skip("no CUDA device");
    lm_ctx *g = NULL;
    LT_CHECK_OK(lm_ctx_create(ct_gpu, 1, &g));
    if (!g) lt_skip("cannot create a CUDA context");
    return g;
}
#endif

#endif
