/* The CUDA AdamW step (ops/cuda/optim.cu: multi-tensor f32 kernel, strided fallback)
 * against the CPU reference (a context forced to LM_IMPL_REF, double arithmetic), on
 * the same rounded random inputs, through the public lm_adamw_update. Lists cover:
 * f32/bf16/f16 grads; sizes with 1-3 trailing elements past the 4-element vectors and
 * more than one 4096-element chunk; tensors misaligned by one element (the scalar
 * loop of the multi-tensor kernel, in p and in g alone); a permuted parameter view
 * (the strided kernel); an empty tensor; a list of 600+ tensors (more than one
 * launch's table); grad_scale != 1 and per-tensor weight decay.
 * Gate (per element, derived from f32 rounding, u = 2^-24): the kernel evaluates the
 * reference's formula in f32 with IEEE sqrt and division, so each result carries a few
 * roundings of its terms (grad scaling 1, constants 1 each, products and sums 1 each,
 * FMA contraction only removing some):
 *   m' = b1 m + (1-b1) g s          |dm| <= 4u (b1|m| + (1-b1)|g s|)   (+ the ref's own
 *   v' = b2 v + (1-b2) (g s)^2      |dv| <= 6u v'                       rounding: +1u)
 *   p' = p (1 - lr wd) - U,  U = step m' / (sqrt(v') / bc2 + eps):
 *        |dp| <= 3u (|p| + |p'|) + 10u |U| + step |dm| / denom
 * (the last term: the kernel's m' feeds its own update). Each bound is checked at
 * twice that size (headroom for the order in which contraction groups terms). A
 * cancelling m' can have a large *relative* error, so the bound is in terms of the
 * summands, not of the result; NaN never passes.
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#include "loom/ops_backward.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

#define HV(p) lm_tensor_as_view((p).h)
#define DV(p) lm_tensor_as_view((p).d)

static lm_ctx *g_ctx, *g_ref;
static const double U32 = 1.0 / 16777216.0; /* 2^-24: f32 unit roundoff */

/* One list entry: four parents (host + device) and the views the update sees. */
typedef struct entry {
    ct_pair p, g, m, v;
    lm_tensor_view ph, pd, gh, gd, mh, md, vh, vd;
    double *p0, *g0, *m0, *v0; /* inputs before the update, row-major [numel] */
} entry;

/* A random 1-d parent of n + off elements and its view [off, off + n) on both sides. */
static ct_pair shifted(lt_rng *r, lm_dtype dt, int64_t n, int64_t off, double scale, int square, lm_tensor_view *hv,
                       lm_tensor_view *dv) {
    int64_t len = n + off;
    lm_tensor *h = lt_random_tensor(r, dt, 1, &len, scale);
    if (square) {
        float *f = lm_tensor_data(h);
        for (int64_t k = 0; k < len; k++) f[k] = f[k] * f[k]; /* second moments are >= 0 */
    }
    ct_pair p = ct_pair_of(h);
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(p.h), 0, off, off + n, 1, hv));
    *dv = ct_mirror(p.h, hv, p.d);
    return p;
}

/* Entry of n elements (1-d), grads of dtype gdt; p_off / g_off shift p (and m, v) or
 * g alone by that many elements off their parents' aligned start. */
static void entry_1d(lt_rng *r, entry *e, int64_t n, lm_dtype gdt, int64_t p_off, int64_t g_off) {
    memset(e, 0, sizeof *e);
    e->p = shifted(r, LM_F32, n, p_off, 1.0, 0, &e->ph, &e->pd);
    e->g = shifted(r, gdt, n, g_off, 0.1, 0, &e->gh, &e->gd);
    e->m = shifted(r, LM_F32, n, p_off, 0.01, 0, &e->mh, &e->md);
    e->v = shifted(r, LM_F32, n, p_off, 0.01, 1, &e->vh, &e->vd);
}

/* Entry [8, 16] whose parameter is a permuted view (not contiguous). */
static void entry_permuted(lt_rng *r, entry *e, lm_dtype gdt) {
    int64_t s[2] = {8, 16};
    memset(e, 0, sizeof *e);
    e->p = ct_random_reversed(r, LM_F32, 2, s, 1.0, &e->ph, &e->pd);
    e->g = ct_random(r, gdt, 2, s, 0.1), e->gh = *HV(e->g), e->gd = *DV(e->g);
    e->m = ct_random(r, LM_F32, 2, s, 0.01), e->mh = *HV(e->m), e->md = *DV(e->m);
    lm_tensor *vt = lt_random_tensor(r, LM_F32, 2, s, 0.01);
    float *vv = lm_tensor_data(vt);
    for (int64_t k = 0; k < 128; k++) vv[k] = vv[k] * vv[k];
    e->v = ct_pair_of(vt), e->vh = *HV(e->v), e->vd = *DV(e->v);
}

static void entry_free(entry *e) {
    ct_pair_free(&e->p), ct_pair_free(&e->g), ct_pair_free(&e->m), ct_pair_free(&e->v);
    free(e->p0), free(e->g0), free(e->m0), free(e->v0);
}

/* Runs the list on both devices and checks every element against the bound above. */
static void run_list(const char *name, int n, entry *es, const float *wd, const lm_adamw_hparams *hp) {
    lm_tensor_view *ph = calloc((size_t)n * 8, sizeof *ph);
    lm_tensor_view *pd = ph + n, *gh = ph + 2 * n, *gd = ph + 3 * n, *mh = ph + 4 * n, *md = ph + 5 * n;
    lm_tensor_view *vh = ph + 6 * n, *vd = ph + 7 * n;
    for (int i = 0; i < n; i++) {
        entry *e = &es[i];
        ph[i] = e->ph, pd[i] = e->pd, gh[i] = e->gh, gd[i] = e->gd, mh[i] = e->mh, md[i] = e->md, vh[i] = e->vh,
        vd[i] = e->vd;
        e->p0 = lt_view_to_f64(&e->ph), e->g0 = lt_view_to_f64(&e->gh);
        e->m0 = lt_view_to_f64(&e->mh), e->v0 = lt_view_to_f64(&e->vh);
    }
    LT_CHECK_OK(lm_adamw_update(g_ref, n, ph, gh, mh, vh, wd, hp));
    LT_CHECK_OK(lm_adamw_update(g_ctx, n, pd, gd, md, vd, wd, hp));
    double b1 = hp->beta1, b2 = hp->beta2, s = hp->grad_scale;
    double step = hp->lr / (1.0 - pow(b1, (double)hp->step)), bc2 = sqrt(1.0 - pow(b2, (double)hp->step));
    int64_t bad = 0, total = 0;
    for (int i = 0; i < n; i++) {
        entry *e = &es[i];
        int64_t cnt = lm_tensor_view_numel(&e->ph);
        if (cnt == 0) continue;
        double *p1 = lt_view_to_f64(&e->ph), *m1 = lt_view_to_f64(&e->mh), *v1 = lt_view_to_f64(&e->vh);
        double *pg = ct_read(g_ctx, &e->p, &e->pd), *mg = ct_read(g_ctx, &e->m, &e->md), *vg = ct_read(g_ctx, &e->v, &e->vd);
        for (int64_t k = 0; k < cnt; k++) {
            double gs = e->g0[k] * s, M = b1 * fabs(e->m0[k]) + (1.0 - b1) * fabs(gs);
            double tol_m = 2 * 5 * U32 * M, tol_v = 2 * 7 * U32 * v1[k];
            double denom = sqrt(v1[k]) / bc2 + hp->eps, upd = step * fabs(m1[k]) / denom;
            double tol_p = 2 * (3 * U32 * (fabs(e->p0[k]) + fabs(p1[k])) + 10 * U32 * upd + step * tol_m / 2 / denom);
            int ok = fabs(pg[k] - p1[k]) <= tol_p && fabs(mg[k] - m1[k]) <= tol_m && fabs(vg[k] - v1[k]) <= tol_v;
            if (!ok && bad++ < 5)
                LT_CHECK_MSG(0, "%s tensor %d elem %lld: p %.9g vs %.9g (tol %.3g), m %.9g vs %.9g (tol %.3g), v %.9g vs %.9g (tol %.3g)",
                             name, i, (long long)k, pg[k], p1[k], tol_p, mg[k], m1[k], tol_m, vg[k], v1[k], tol_v);
            total++;
        }
        free(p1), free(m1), free(v1), free(pg), free(mg), free(vg);
    }
    LT_CHECK_MSG(bad == 0, "%s: %lld of %lld elements outside the f32 bound", name, (long long)bad, (long long)total);
    free(ph);
}

static void test_adamw_mixed(void) {
    lt_rng r = lt_rng_seed(501);
    entry es[8];
    entry_1d(&r, &es[0], 37 * 50, LM_F32, 0, 0);   /* 1850: two trailing elements */
    entry_1d(&r, &es[1], 129, LM_BF16, 0, 0);      /* one trailing element */
    entry_permuted(&r, &es[2], LM_F16);            /* strided kernel */
    entry_1d(&r, &es[3], 10001, LM_BF16, 0, 0);    /* three chunks */
    entry_1d(&r, &es[4], 4099, LM_F32, 1, 0);      /* p, m, v misaligned: scalar loop */
    entry_1d(&r, &es[5], 5000, LM_BF16, 0, 1);     /* g alone misaligned */
    entry_1d(&r, &es[6], 0, LM_F32, 1, 1);         /* empty (views of 1-element parents) */
    entry_1d(&r, &es[7], 8192 + 3, LM_F16, 0, 0);
    float wd[8] = {0.1f, 0.0f, 0.01f, 0.1f, 0.05f, 0.0f, 0.1f, 0.1f};
    lm_adamw_hparams hp = {1e-3, 0.9, 0.999, 1e-8, 3, 0.5};
    run_list("adamw mixed", 8, es, wd, &hp);
    for (int i = 0; i < 8; i++) entry_free(&es[i]);
}

/* More tensors than one launch's table holds (MT_MAX = 512), at step 1 and at a late
 * step (bias corrections near 1, larger lr, grad_scale 0.25), fresh inputs each. */
static void test_adamw_many(void) {
    enum { N = 600 };
    lm_adamw_hparams hps[2] = {{3e-4, 0.9, 0.95, 1e-8, 1, 1.0}, {1e-2, 0.9, 0.95, 1e-8, 1000, 0.25}};
    for (int h = 0; h < 2; h++) {
        lt_rng r = lt_rng_seed(503 + (uint64_t)h);
        entry *es = calloc(N, sizeof *es);
        float wd[N];
        for (int i = 0; i < N; i++) {
            entry_1d(&r, &es[i], 1 + (i * 37) % 300, i % 3 == 0 ? LM_F32 : LM_BF16, 0, 0);
            wd[i] = i % 2 ? 0.1f : 0.0f;
        }
        run_list(h ? "adamw 600 tensors step 1000" : "adamw 600 tensors step 1", N, es, wd, &hps[h]);
        for (int i = 0; i < N; i++) entry_free(&es[i]);
        free(es);
    }
}

int main(void) {
    g_ctx = ct_start();
    g_ref = ct_ref_ctx();
    LT_RUN(test_adamw_mixed);
    LT_RUN(test_adamw_many);
    lm_ctx_destroy(g_ref);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
