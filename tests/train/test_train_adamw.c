/* Tests for the optimizer pieces: lm_adamw_update against a hand calculation (two
 * steps written out with their constants) and against torch.optim.AdamW
 * (scripts/gen_train_refs.py: four steps, per-step learning rates, per-group weight
 * decay, clip_grad_norm_ with max_norm 1 folded in as grad_scale); the sum of squares
 * behind the global norm; one call over several tensors equals one call per tensor;
 * a bad entry leaves every tensor unchanged; the schedules at their corners; the
 * optimizer object applying decay to matrices only; and the device-values forms of a
 * captured CUDA step (lm__adamw_update_dyn, lm__clip_scale_out) refused on the CPU.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "loom/train.h"
#include "ops/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;

#define V(t) lm_tensor_as_view(t)

static lm_tensor *vec(int64_t n, const float *v) {
    lm_tensor *t = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_F32, 1, &n, v, &t));
    return t;
}

static void test_adamw_matches_hand_calculation(void) {
    float p0 = 1.0f, g1 = 0.5f, g2 = -0.25f, zero = 0.0f, wd = 0.1f;
    lm_tensor *p = vec(1, &p0), *g = vec(1, &g1), *m = vec(1, &zero), *v = vec(1, &zero);
    lm_adamw_hparams hp = {0.1, 0.9, 0.999, 1e-8, 1, 1.0};
    LT_CHECK_OK(lm_adamw_update(g_ctx, 1, V(p), V(g), V(m), V(v), &wd, &hp));
    /* p = 1 * (1 - 0.1 * 0.1) = 0.99; m = 0.05; v = 0.00025; m_hat = 0.5; v_hat = 0.25
     * p -= 0.1 * 0.5 / (0.5 + 1e-8)  ->  0.890000002 */
    LT_CHECK(fabs(*(float *)lm_tensor_data(p) - 0.890000002) < 1e-7);
    LT_CHECK(fabs(*(float *)lm_tensor_data(m) - 0.05) < 1e-8 && fabs(*(float *)lm_tensor_data(v) - 0.00025) < 1e-10); /* f32 */
    *(float *)lm_tensor_data(g) = g2;
    hp.step = 2;
    hp.grad_scale = 2.0; /* g = -0.5 */
    LT_CHECK_OK(lm_adamw_update(g_ctx, 1, V(p), V(g), V(m), V(v), &wd, &hp));
    /* p = 0.890000002 * 0.99 = 0.88110000198; m = 0.045 - 0.05 = -0.005; v = 0.00024975 + 0.00025
     * = 0.00049975; m_hat = -0.005 / 0.19 = -0.0263157895; v_hat = 0.00049975 / 0.001999 = 0.25
     * (to 1e-12); p -= 0.1 * -0.0263157895 / (0.5 + 1e-8)  ->  0.88636315987 */
    double m_hat = -0.005 / 0.19, v_hat = 0.00049975 / (1 - 0.999 * 0.999);
    double want = 0.890000002 * 0.99 - 0.1 * m_hat / (sqrt(v_hat) + 1e-8);
    LT_CHECK_MSG(fabs(*(float *)lm_tensor_data(p) - want) < 2e-7, "step 2: %.9g vs %.9g", *(float *)lm_tensor_data(p), want);
    lm_tensor_destroy(p), lm_tensor_destroy(g), lm_tensor_destroy(m), lm_tensor_destroy(v);
}

static lm_tensor *from_fixture(const lt_fixture *fx, const char *key) {
    const lt_fixture_tensor *t = lt_fixture_get(fx, key);
    return t ? lt_fixture_tensor_to(t, LM_F32) : NULL;
}

static void test_adamw_with_clipping_matches_torch(void) {
    lt_fixture fx;
    if (!lt_fixture_load("tests/data/train/adamw_ref.lmfx", &fx)) return;
    lm_tensor_view pv[3], gv[3], mv[3], vv[3];
    lm_tensor *p[3], *m[3], *v[3], *g[3] = {NULL};
    char key[32];
    const lt_fixture_tensor *lr = lt_fixture_get(&fx, "lr"), *wd = lt_fixture_get(&fx, "wd");
    const lt_fixture_tensor *norm = lt_fixture_get(&fx, "norm");
    float wdf[3];
    for (int k = 0; k < 3; k++) {
        snprintf(key, sizeof key, "p0.%d", k);
        p[k] = from_fixture(&fx, key);
        const lm_tensor_view *pk = V(p[k]);
        LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, pk->ndim, pk->shape, &m[k]));
        LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, pk->ndim, pk->shape, &v[k]));
        pv[k] = *pk, mv[k] = *V(m[k]), vv[k] = *V(v[k]);
        wdf[k] = (float)wd->f64[k];
    }
    lm_tensor *ss = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 0, NULL, &ss));
    for (int step = 1; step <= 4; step++) {
        for (int k = 0; k < 3; k++) {
            snprintf(key, sizeof key, "g%d.%d", step, k);
            lm_tensor_destroy(g[k]);
            g[k] = from_fixture(&fx, key);
            gv[k] = *V(g[k]);
        }
        LT_CHECK_OK(lm_sum_squares_out(g_ctx, 3, gv, V(ss)));
        double n = sqrt(*(float *)lm_tensor_data(ss));
        LT_CHECK_MSG(fabs(n - norm->f64[step - 1]) < 1e-6 * norm->f64[step - 1], "norm %.9g vs torch %.9g", n,
                     norm->f64[step - 1]);
        double scale = 1.0 / (n + 1e-6) < 1.0 ? 1.0 / (n + 1e-6) : 1.0; /* torch's clip coefficient */
        lm_adamw_hparams hp = {lr->f64[step - 1], 0.9, 0.95, 1e-8, step, scale};
        LT_CHECK_OK(lm_adamw_update(g_ctx, 3, pv, gv, mv, vv, wdf, &hp));
        for (int k = 0; k < 3; k++) {
            snprintf(key, sizeof key, "p%d.%d", step, k);
            const lt_fixture_tensor *want = lt_fixture_get(&fx, key);
            double *got = lt_view_to_f64(&pv[k]);
            if (want) lt_check_close(key, got, want->f64, want->numel, 1e-13, 2e-6);
            free(got);
        }
    }
    for (int k = 0; k < 3; k++) lm_tensor_destroy(p[k]), lm_tensor_destroy(m[k]), lm_tensor_destroy(v[k]), lm_tensor_destroy(g[k]);
    lm_tensor_destroy(ss);
    lt_fixture_free(&fx);
}

static void test_multi_tensor_call_equals_separate_calls_and_checks_first(void) {
    lt_rng r = lt_rng_seed(5);
    int64_t s1 = 6, s2[2] = {2, 3};
    lm_tensor *pa = lt_random_tensor(&r, LM_F32, 1, &s1, 1), *pb = lt_random_tensor(&r, LM_F32, 2, s2, 1);
    lm_tensor *ga = lt_random_tensor(&r, LM_BF16, 1, &s1, 1), *gb = lt_random_tensor(&r, LM_F32, 2, s2, 1);
    lm_tensor *ma, *mb, *va, *vb, *qa, *qb;
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 1, &s1, &ma));
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 2, s2, &mb));
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 1, &s1, &va));
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 2, s2, &vb));
    LT_CHECK_OK(lm_tensor_contiguous(g_ctx, pa, &qa)); /* aliases: copy instead */
    lm_tensor_destroy(qa);
    LT_CHECK_OK(lm_cast(g_ctx, V(pa), LM_F32, &qa));
    LT_CHECK_OK(lm_cast(g_ctx, V(pb), LM_F32, &qb));
    lm_tensor_view P[2] = {*V(pa), *V(pb)}, G[2] = {*V(ga), *V(gb)}, M[2] = {*V(ma), *V(mb)}, W[2] = {*V(va), *V(vb)};
    float wd[2] = {0.1f, 0.0f};
    lm_adamw_hparams hp = {0.01, 0.9, 0.95, 1e-8, 3, 0.5};
    /* a shape mismatch in the second entry: nothing changes, not even the first */
    lm_tensor_view badm = M[1];
    M[1] = *V(ma);
    LT_CHECK_STATUS(lm_adamw_update(g_ctx, 2, P, G, M, W, wd, &hp), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "m[1]") != NULL);
    LT_CHECK(memcmp(lm_tensor_data(pa), lm_tensor_data(qa), 6 * sizeof(float)) == 0);
    M[1] = badm;
    LT_CHECK_OK(lm_adamw_update(g_ctx, 2, P, G, M, W, wd, &hp));
    lm_tensor *m2, *v2;
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 1, &s1, &m2));
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 1, &s1, &v2));
    LT_CHECK_OK(lm_adamw_update(g_ctx, 1, V(qa), V(ga), V(m2), V(v2), wd, &hp));
    LT_CHECK(memcmp(lm_tensor_data(pa), lm_tensor_data(qa), 6 * sizeof(float)) == 0);
    lm_adamw_hparams bad = hp;
    bad.beta2 = 1.0;
    LT_CHECK_STATUS(lm_adamw_update(g_ctx, 2, P, G, M, W, wd, &bad), LM_INVALID_ARGUMENT);
    bad = hp;
    bad.step = 0;
    LT_CHECK_STATUS(lm_adamw_update(g_ctx, 2, P, G, M, W, wd, &bad), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_adamw_update(g_ctx, 1, P, P, M, W, wd, &hp), LM_INVALID_ARGUMENT); /* grads aliasing params */
    /* entries are updated at the same time (one launch on CUDA): written tensors of two
     * entries must not overlap, nor one entry's gradient another's written tensor; two
     * entries may share a gradient (it is only read) */
    lm_tensor_view P2[2] = {P[0], P[0]}, G2[2] = {G[0], G[0]}, M2[2] = {M[0], M[1]}, W2[2] = {W[0], W[1]};
    M2[1] = *V(m2), W2[1] = *V(v2);
    LT_CHECK_STATUS(lm_adamw_update(g_ctx, 2, P2, G2, M2, W2, wd, &hp), LM_INVALID_ARGUMENT);
    LT_CHECK_MSG(strstr(lm_last_error(), "params[0] and params[1] overlap") != NULL, "%s", lm_last_error());
    lm_tensor_view M3[2] = {M[0], M[0]}, P3[2] = {P[0], *V(qa)};
    LT_CHECK_STATUS(lm_adamw_update(g_ctx, 2, P3, G2, M3, W2, wd, &hp), LM_INVALID_ARGUMENT);
    LT_CHECK_MSG(strstr(lm_last_error(), "m[0] and m[1] overlap") != NULL, "%s", lm_last_error());
    lm_tensor_view G4[2] = {G[0], *V(qa)}, P4[2] = {P[0], *V(qa)}; /* entry 1's grads are its own params: refused */
    LT_CHECK_STATUS(lm_adamw_update(g_ctx, 2, P4, G4, M2, W2, wd, &hp), LM_INVALID_ARGUMENT);
    lm_tensor_view G5[2] = {*V(qa), G[0]}; /* entry 0's grads are entry 1's params */
    LT_CHECK_STATUS(lm_adamw_update(g_ctx, 2, P4, G5, M2, W2, wd, &hp), LM_INVALID_ARGUMENT);
    LT_CHECK_MSG(strstr(lm_last_error(), "grads[0]") != NULL && strstr(lm_last_error(), "params[1]") != NULL, "%s",
                 lm_last_error());
    LT_CHECK_OK(lm_adamw_update(g_ctx, 2, P4, G2, M2, W2, wd, &hp)); /* a shared gradient */
    lm_tensor *all[] = {pa, pb, ga, gb, ma, mb, va, vb, qa, qb, m2, v2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lm_tensor_destroy(all[i]);
}

static void test_schedules(void) {
    lm_lr_schedule c = {LM_LR_COSINE, 1.0, 0.1, 4, 14};
    LT_CHECK(fabs(lm_lr_at(&c, 0) - 0.25) < 1e-12 && fabs(lm_lr_at(&c, 3) - 1.0) < 1e-12);
    LT_CHECK(fabs(lm_lr_at(&c, 4) - 1.0) < 1e-12);                /* decay starts at the peak */
    LT_CHECK(fabs(lm_lr_at(&c, 9) - 0.55) < 1e-12);               /* halfway: (1 + 0.1) / 2 */
    LT_CHECK(fabs(lm_lr_at(&c, 14) - 0.1) < 1e-12 && fabs(lm_lr_at(&c, 99) - 0.1) < 1e-12);
    lm_lr_schedule l = {LM_LR_LINEAR, 2.0, 0.0, 0, 10};
    LT_CHECK(fabs(lm_lr_at(&l, 0) - 2.0) < 1e-12 && fabs(lm_lr_at(&l, 5) - 1.0) < 1e-12 && lm_lr_at(&l, 10) == 0.0);
    lm_lr_schedule k = {LM_LR_CONSTANT, 0.5, 0.0, 2, 10};
    LT_CHECK(fabs(lm_lr_at(&k, 0) - 0.25) < 1e-12 && lm_lr_at(&k, 7) == 0.5);
    lm_lr_schedule_kind kind;
    LT_CHECK_OK(lm_lr_schedule_parse("linear", &kind));
    LT_CHECK(kind == LM_LR_LINEAR);
    LT_CHECK_STATUS(lm_lr_schedule_parse("step", &kind), LM_INVALID_ARGUMENT);
}

static void test_optimizer_decays_matrices_only(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/train_adamw_config.json", LOOM_BINARY_DIR);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs("{\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":16,\"hidden_size\":8,\"intermediate_size\":8,"
          "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,\"max_position_embeddings\":32}",
          f);
    fclose(f);
    lm_train_model *m = NULL;
    lm_optimizer *o = NULL;
    LT_CHECK_OK(lm_train_model_init(path, 3, lm_device_cpu(), &m));
    lm_adamw_config c = {0.9, 0.95, 1e-8, 0.5};
    LT_CHECK_OK(lm_optimizer_create(m, &c, &o));
    lm_train_param w, b, n;
    LT_CHECK_OK(lm_train_model_find(m, "model.layers.0.self_attn.q_proj.weight", &w));
    LT_CHECK_OK(lm_train_model_find(m, "model.layers.0.self_attn.q_proj.bias", &b));
    LT_CHECK_OK(lm_train_model_find(m, "model.norm.weight", &n));
    LT_CHECK(w.decay == 1 && b.decay == 0 && n.decay == 0);
    float w0 = ((float *)w.value.data)[3], n0 = ((float *)n.value.data)[0];
    LT_CHECK_OK(lm_train_model_zero_grad(m, g_ctx)); /* zero gradients: only decay moves anything */
    LT_CHECK_OK(lm_optimizer_step(o, g_ctx, 0.1, 1.0));
    LT_CHECK(lm_optimizer_steps(o) == 1);
    LT_CHECK(fabsf(((float *)w.value.data)[3] - w0 * 0.95f) < 1e-7f && ((float *)n.value.data)[0] == n0);
    LT_CHECK_STATUS(lm_train_model_find(m, "model.embed", &w), LM_NOT_FOUND);
    lm_optimizer_destroy(o);
    lm_train_model_destroy(m);
}

/* The device-values forms of a captured training step run on CUDA contexts only, and
 * their values tensor must be 4 doubles: both refused by name, nothing changed. */
static void test_device_value_forms_are_refused_here(void) {
    float p0 = 1.0f, g1 = 0.5f, zero = 0.0f, wd = 0.1f;
    lm_tensor *p = vec(1, &p0), *g = vec(1, &g1), *m = vec(1, &zero), *v = vec(1, &zero), *dyn = NULL, *bad = NULL;
    int64_t four = 4, one = 1;
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_I64, 1, &four, &dyn));
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 1, &four, &bad));
    lm_adamw_hparams hp = {0.1, 0.9, 0.999, 1e-8, 1, 1.0};
    LT_CHECK_STATUS(lm__adamw_update_dyn(g_ctx, 1, V(p), V(g), V(m), V(v), &wd, &hp, V(dyn)), LM_UNSUPPORTED);
    LT_CHECK_MSG(strstr(lm_last_error(), "CUDA contexts only"), "%s", lm_last_error());
    LT_CHECK_STATUS(lm__adamw_update_dyn(g_ctx, 1, V(p), V(g), V(m), V(v), &wd, &hp, V(bad)), LM_INVALID_ARGUMENT);
    LT_CHECK_MSG(strstr(lm_last_error(), "dyn must be a contiguous i64"), "%s", lm_last_error());
    LT_CHECK(*(float *)lm_tensor_data(p) == 1.0f && *(float *)lm_tensor_data(m) == 0.0f);
    lm_tensor *ss = NULL;
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 0, &one, &ss));
    LT_CHECK_STATUS(lm__clip_scale_out(g_ctx, V(ss), 1.0, V(dyn)), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm__clip_scale_out(g_ctx, V(ss), 1.0, NULL), LM_INVALID_ARGUMENT);
    lm_tensor_destroy(p), lm_tensor_destroy(g), lm_tensor_destroy(m), lm_tensor_destroy(v);
    lm_tensor_destroy(dyn), lm_tensor_destroy(bad), lm_tensor_destroy(ss);
}

int main(void) {
    if (lm_ctx_create(lm_device_cpu(), 1, &g_ctx) != LM_OK) return 1;
    LT_RUN(test_device_value_forms_are_refused_here);
    LT_RUN(test_adamw_matches_hand_calculation);
    LT_RUN(test_adamw_with_clipping_matches_torch);
    LT_RUN(test_multi_tensor_call_equals_separate_calls_and_checks_first);
    LT_RUN(test_schedules);
    LT_RUN(test_optimizer_decays_matrices_only);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
