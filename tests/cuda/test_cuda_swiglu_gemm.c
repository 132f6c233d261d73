/* The prefill's gate|up GEMM with its SwiGLU in the epilogue (ops/cuda/gemm_wg.cu, wgmma
 * products fed by tensor-memory copies) through lm_linear_swiglu_out with bf16 x, bf16
 * weights [2I, K] and a bf16 out, on fresh random inputs:
 *  - against the GPU's unfused path (the bf16 product by cuBLASLt, then the packed
 *    SwiGLU: the same roundings, another summation order, silu by the fast exponential):
 *    NMSE <= 1e-5 and max-abs <= 2^-6 of the largest |out| (a bf16 rounding of gate or up
 *    flipped by the order moves one output by ~2^-8 of itself);
 *  - against the CPU's composition (f32 product, then the SwiGLU), for the shapes of up
 *    to 10^8 multiply-adds a gate row (the readable reference is slow): NMSE <= 3e-5
 *    (bf16's gate) and max-abs <= 2^-5 of the largest |out|;
 *  - shapes: one tile (128 x 152), row and column edges (M 130, 333; I 200, 4,864 + 8),
 *    K with a tail of 8 inputs past the 64-wide steps (200) and Qwen2.5-0.5B's (896),
 *    M below a tile (5, through the operator directly); each at the widths 128 and 152
 *    (LOOM_CUDA_SWIGLU_GEMM_W) and the launcher's choice;
 *  - the persistent grid's tile loop: three blocks walking every tile
 *    (LOOM_CUDA_SWIGLU_GEMM_BLOCKS=3), K of 4 and 14 steps over the 4-stage ring;
 *  - strided x rows (ld K + 16) and a strided out (ld I + 8) whose pad columns are
 *    poisoned: they must stay NaN (stores masked at the edges);
 *  - one row block (batched decode): tiles of 64 and 128 rows at the widths 40, 64 and
 *    72 and the pick, M from 1 to 128, partial last tiles, three blocks walking 122 tiles
 *    through the ring (6 stages at 64 x 40, and 12 by LOOM_CUDA_SWIGLU_GEMM_STAGES); a
 *    forced width the kernel is not built with is refused by name (LM_INVALID_ARGUMENT)
 *    with the output untouched;
 *  - the fusion rule on this device (1 exactly where the kernel runs: an sm_90a build on a
 *    compute 9.0 device), and a bf16 model's prefill of 130 tokens with the fused GEMM
 *    against the same prefill with LOOM_CUDA_SWIGLU_GEMM=0 (logits NMSE <= 1e-5, every
 *    position's top-1 the same or within 1e-3 of the largest logit); and a batched decode
 *    (8 sequences: a 48-row prefill, then 5 steps of 8 rows, the later ones replaying the
 *    captured step) on against off, logits NMSE <= 1e-5.
 * And the few-rows product (ops/cuda/gemm_rows.cu: f32 out = bf16 x W^T (+ bias), 1-64
 * rows, K split over a cluster; graphs take it up to 16 rows of K <= 1,024 by default):
 * against cuBLASLt's GEMM and the CPU's f32 product (NMSE <= 1e-10, max-abs <= 2^-14 of
 * the largest |out|), the same bits on a
 * second run and through the operator, poisoned pad columns kept; every token tile and its
 * edges, N and K tails, splits forced (1, 3, 8, past K's steps); the refusals by name; and
 * the same batched decode with it on against off (logits NMSE <= 1e-5).
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

static lm_ctx *g_ctx, *g_ref;

/* 1 when this build and device run the wgmma kernels (as ct_flash_form decides). */
static int want_wgmma(void) {
#ifdef LOOM_CUDA_SM90A
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return major == 9 && minor == 0;
#else
    return 0;
#endif
}

/* A [rows, cols] view of the first cols columns of a [rows, ld] tensor. */
static lm_tensor_view narrow(const lm_tensor *t, int64_t cols) {
    lm_tensor_view v;
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(t), 1, 0, cols, 1, &v));
    return v;
}

/* View dv of device tensor dt, read back as doubles (free()). */
static double *read_view(const lm_tensor_view *dv, const lm_tensor *dt) {
    lm_tensor *h = NULL;
    LT_CHECK_OK(lm_tensor_to_device(g_ctx, dt, lm_device_cpu(), &h));
    LT_CHECK_OK(lm_ctx_synchronize(g_ctx));
    lm_tensor_view hv = ct_mirror(dt, dv, h);
    double *v = lt_view_to_f64(&hv);
    lm_tensor_destroy(h);
    return v;
}

/* Every value of the poisoned device tensor o.d still NaN: a refused call wrote nothing. */
static void check_untouched(const char *what, const ct_pair *o) {
    double *v = read_view(lm_tensor_as_view(o->d), o->d);
    int64_t n = lm_tensor_view_numel(lm_tensor_as_view(o->d)), kept = 0;
    for (int64_t i = 0; i < n; i++) kept += isnan(v[i]) != 0;
    LT_CHECK_MSG(kept == n, "%s: %lld outputs written", what, (long long)(n - kept));
    free(v);
}

static void compare(const char *what, const double *got, const double *want, int64_t n, double nmse_gate,
                    double abs_rel) {
    double num = 0, den = 0, md = 0, mx = 0;
    int finite = 1;
    for (int64_t i = 0; i < n; i++) {
        double d = got[i] - want[i];
        finite &= isfinite(got[i]) != 0;
        num += d * d, den += want[i] * want[i];
        md = fmax(md, fabs(d)), mx = fmax(mx, fabs(want[i]));
    }
    double nmse = num / (den > 0 ? den : 1);
    LT_CHECK_MSG(finite && den > 0 && nmse <= nmse_gate && md <= abs_rel * mx,
                 "%s: NMSE %.3g (gate %.1g), max |d| %.3g of %.3g (gate %.3g)", what, nmse, nmse_gate, md, mx,
                 abs_rel * mx);
}

static void run_case(int64_t M, int64_t K, int64_t I, const char *width, uint64_t seed) {
    if (width) setenv("LOOM_CUDA_SWIGLU_GEMM_W", width, 1);
    else unsetenv("LOOM_CUDA_SWIGLU_GEMM_W");
    lt_rng r = lt_rng_seed(seed);
    const int64_t ldx = K + 16, ldo = I + 8;
    int64_t xs[2] = {M, ldx}, ws[2] = {2 * I, K}, os[2] = {M, ldo}, ys[2] = {M, 2 * I}, ms[2] = {M, I};
    ct_pair xw = ct_random(&r, LM_BF16, 2, xs, 1.0), w = ct_random(&r, LM_BF16, 2, ws, 2.0 / sqrt((double)K));
    ct_pair o = ct_poisoned(LM_BF16, 2, os);
    lm_tensor_view xh = narrow(xw.h, K), xd = narrow(xw.d, K), od = narrow(o.d, I);
    lm_linear_params lp = {.input = LM_LINEAR_IN};
    char what[128];
    snprintf(what, sizeof what, "swiglu GEMM M %lld K %lld I %lld width %s", (long long)M, (long long)K, (long long)I,
             width ? width : "auto");
    /* (without the wgmma kernel the operator composes: this runs outside a capture) */
    LT_CHECK_OK(lm_linear_swiglu_out(g_ctx, &xd, lm_tensor_as_view(w.d), NULL, &lp, &od));
    /* the unfused GPU path: the bf16 product, then the packed SwiGLU */
    lm_tensor *y = NULL, *o2 = NULL, *want = NULL;
    LT_CHECK_OK(lm_tensor_create(ct_gpu, LM_BF16, 2, ys, &y));
    LT_CHECK_OK(lm_tensor_create(ct_gpu, LM_BF16, 2, ms, &o2));
    LT_CHECK_OK(lm_linear_out(g_ctx, &xd, lm_tensor_as_view(w.d), NULL, &lp, lm_tensor_as_view(y)));
    lm_tensor_view gate, up;
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(y), 1, 0, I, 1, &gate));
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(y), 1, I, 2 * I, 1, &up));
    LT_CHECK_OK(lm_swiglu_out(g_ctx, &gate, &up, lm_tensor_as_view(o2)));
    double *got = read_view(&od, o.d), *two = read_view(lm_tensor_as_view(o2), o2), *cpu = NULL;
    char w2[160];
    snprintf(w2, sizeof w2, "%s vs the unfused GPU path", what);
    compare(w2, got, two, M * I, 1e-5, 1.0 / 64);
    if (M * K * I <= 100000000) { /* the CPU's composition into f32 (the readable reference: small shapes) */
        want = lt_poisoned_tensor(LM_F32, 2, ms);
        LT_CHECK_OK(lm_linear_swiglu_out(g_ref, &xh, lm_tensor_as_view(w.h), NULL, &lp, lm_tensor_as_view(want)));
        cpu = lt_view_to_f64(lm_tensor_as_view(want));
        snprintf(w2, sizeof w2, "%s vs the CPU", what);
        compare(w2, got, cpu, M * I, 3e-5, 1.0 / 32);
    }
    /* the pad columns of the strided out stay poisoned */
    lm_tensor_view pad;
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(o.d), 1, I, ldo, 1, &pad));
    double *p = read_view(&pad, o.d);
    int64_t kept = 0;
    for (int64_t i = 0; i < M * (ldo - I); i++) kept += isnan(p[i]) != 0;
    LT_CHECK_MSG(kept == M * (ldo - I), "%s: %lld of %lld pad values written", what, (long long)(M * (ldo - I) - kept),
                 (long long)(M * (ldo - I)));
    free(got), free(two), free(cpu), free(p); /* free(NULL) is a no-op */
    lm_tensor_destroy(y), lm_tensor_destroy(o2), lm_tensor_destroy(want);
    ct_pair_free(&xw), ct_pair_free(&w), ct_pair_free(&o);
}

static void test_shapes_and_widths(void) {
    static const int64_t shapes[][3] = {{128, 64, 152}, {130, 896, 200}, {333, 200, 4872}, {512, 896, 4864}, {5, 256, 304}};
    static const char *const widths[3] = {"128", "152", NULL};
    uint64_t seed = 100;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int k = 0; k < 3; k++) run_case(shapes[s][0], shapes[s][1], shapes[s][2], widths[k], seed++);
    /* three blocks walking all the tiles: the stage ring's phases carried across tiles
     * (K of 4 steps, one ring a tile; and of 14, not a multiple of the 4 stages) */
    setenv("LOOM_CUDA_SWIGLU_GEMM_BLOCKS", "3", 1);
    for (int k = 0; k < 2; k++) {
        run_case(333, 200, 4872, widths[k], seed++);
        run_case(512, 896, 4864, widths[k], seed++);
    }
    unsetenv("LOOM_CUDA_SWIGLU_GEMM_BLOCKS");
    unsetenv("LOOM_CUDA_SWIGLU_GEMM_W");
}

/* One row block (batched decode, short prefills): tiles of 64 rows (M <= 64) or 128 at
 * the narrow widths 40, 64 and 72, and the launcher's pick; rows 1, 3, 32, 64 (one full
 * block), 65 and 128 (two warpgroups), I with a partial last tile for every width (200,
 * 4,872) and Qwen2.5-0.5B's 4,864; then three blocks walking 122 tiles of 40 with K of 14
 * steps through the ring of 6 stages and of 12 (a block's ring wraps inside and across
 * tiles). */
static void test_one_row_block(void) {
    static const int64_t shapes[][3] = {{1, 896, 4864}, {3, 200, 200}, {32, 896, 4864}, {64, 64, 4872}, {65, 896, 200},
                                        {128, 200, 4864}};
    static const char *const widths[4] = {"40", "64", "72", NULL};
    uint64_t seed = 300;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int k = 0; k < 4; k++) run_case(shapes[s][0], shapes[s][1], shapes[s][2], widths[k], seed++);
    setenv("LOOM_CUDA_SWIGLU_GEMM_BLOCKS", "3", 1);
    run_case(32, 896, 4864, "40", seed++);
    run_case(100, 896, 4872, "72", seed++);
    setenv("LOOM_CUDA_SWIGLU_GEMM_STAGES", "12", 1);
    run_case(32, 896, 4864, "40", seed++);
    unsetenv("LOOM_CUDA_SWIGLU_GEMM_STAGES");
    unsetenv("LOOM_CUDA_SWIGLU_GEMM_BLOCKS");
    /* a width the tile is not built with: refused by name, nothing written */
    if (want_wgmma()) {
        setenv("LOOM_CUDA_SWIGLU_GEMM_W", "48", 1);
        int64_t xs[2] = {4, 64}, ws[2] = {400, 64}, os[2] = {4, 200};
        lt_rng r = lt_rng_seed(seed);
        ct_pair x = ct_random(&r, LM_BF16, 2, xs, 1.0), w = ct_random(&r, LM_BF16, 2, ws, 0.1);
        ct_pair o = ct_poisoned(LM_BF16, 2, os);
        lm_linear_params lp = {.input = LM_LINEAR_IN};
        lm_status st = lm_linear_swiglu_out(g_ctx, lm_tensor_as_view(x.d), lm_tensor_as_view(w.d), NULL, &lp,
                                            lm_tensor_as_view(o.d));
        LT_CHECK_MSG(st == LM_INVALID_ARGUMENT && strstr(lm_last_error(), "LOOM_CUDA_SWIGLU_GEMM_W=48"),
                     "forced width 48: status %d, \"%s\"", (int)st, lm_last_error());
        lm_clear_error();
        check_untouched("forced width 48", &o);
        ct_pair_free(&x), ct_pair_free(&w), ct_pair_free(&o);
    }
    unsetenv("LOOM_CUDA_SWIGLU_GEMM_W");
}

static void test_rule(void) {
    int want = want_wgmma();
    LT_CHECK_MSG(lm__cuda_swiglu_gemm_wg_ok() == want, "swiglu GEMM runs: %d, expected %d", lm__cuda_swiglu_gemm_wg_ok(),
                 want);
    LT_CHECK(lm_linear_swiglu_fused(ct_gpu, LM_LINEAR_IN, 512, 896, LM_BF16, LM_BF16) == want);
    LT_CHECK(lm_linear_swiglu_fused(ct_gpu, LM_LINEAR_IN, 8, 896, LM_BF16, LM_BF16) == want); /* batched decode */
    LT_CHECK(lm_linear_swiglu_fused(ct_gpu, LM_LINEAR_IN, 4, 896, LM_BF16, LM_BF16) == 0);
    LT_CHECK(lm_linear_swiglu_fused(ct_gpu, LM_LINEAR_IN, 512, 896, LM_F32, LM_BF16) == 0);
    setenv("LOOM_CUDA_SWIGLU_GEMM", "0", 1);
    LT_CHECK(lm_linear_swiglu_fused(ct_gpu, LM_LINEAR_IN, 512, 896, LM_BF16, LM_BF16) == 0);
    unsetenv("LOOM_CUDA_SWIGLU_GEMM");
}

/* Prefill logits [T, V] of a bf16 checkpoint loaded on the GPU with the fused GEMM on or off. */
static float *prefill(const char *dir, const int32_t *ids, int T, int fused) {
    setenv("LOOM_CUDA_SWIGLU_GEMM", fused ? "1" : "0", 1);
    lm_model *m = NULL;
    LT_CHECK_OK(lm_model_load(dir, ct_gpu, &m));
    if (!m) return NULL;
    float *out = ct_model_logits(m, g_ctx, ids, T, 0);
    lm_model_destroy(m);
    unsetenv("LOOM_CUDA_SWIGLU_GEMM");
    return out;
}

static const char *const k_models[2] = {"llama3_scaled_bf16", "qwen2_window_bf16"};

/* The directory of test model mi and its vocabulary (0: it did not load), with n random
 * ids from seed. */
static int64_t model_ids(int mi, char *dir, size_t dir_bytes, int32_t *ids, int n, uint64_t seed) {
    snprintf(dir, dir_bytes, "%s/tests/data/models/%s", LOOM_SOURCE_DIR, k_models[mi]);
    lm_model *probe = NULL;
    LT_CHECK_OK(lm_model_load(dir, lm_device_cpu(), &probe));
    if (!probe) return 0;
    int64_t V = lm_model_get_config(probe)->vocab_size;
    lm_model_destroy(probe);
    lt_rng r = lt_rng_seed(seed);
    for (int t = 0; t < n; t++) ids[t] = (int32_t)lt_rng_int(&r, 0, V - 1);
    return V;
}

static void test_model_prefill(void) {
    for (int mi = 0; mi < 2; mi++) {
        char dir[512];
        enum { T = 130 };
        int32_t ids[T];
        int64_t V = model_ids(mi, dir, sizeof dir, ids, T, 900 + mi);
        if (!V) continue;
        float *on = prefill(dir, ids, T, 1), *off = prefill(dir, ids, T, 0);
        if (on && off) {
            ct_logits_cmp c = ct_logits_compare(on, off, T, V);
            double mx = 0;
            for (int64_t i = 0; i < T * V; i++) mx = fmax(mx, fabs(off[i]));
            int near = 1; /* a differing top-1 only where the two best are within 1e-3 of the largest logit */
            for (int t = 0; t < T && c.top1 < T; t++) {
                int64_t a = 0, b = 0;
                for (int64_t v = 1; v < V; v++) {
                    if (on[t * V + v] > on[t * V + a]) a = v;
                    if (off[t * V + v] > off[t * V + b]) b = v;
                }
                if (a != b) near &= fabs(off[t * V + a] - off[t * V + b]) <= 1e-3 * mx;
            }
            LT_CHECK_MSG(c.finite && c.nmse <= 1e-5 && near, "%s prefill %d: fused vs unfused NMSE %.3g, top-1 %d of %d",
                         k_models[mi], T, c.nmse, c.top1, T);
        }
        free(on), free(off);
    }
}

/* Batched decode of a bf16 checkpoint with a kernel switched on (sw=on: LOOM_CUDA_SWIGLU_GEMM=1,
 * LOOM_CUDA_ROWS_GEMM_MAX_ROWS=64) or off (sw=0):
 * B = 8 sequences prefilled with 6 tokens each (48 rows), then 5 decode steps of 8 rows,
 * the steps from the second replaying the captured step; logits [6 * B, V] (free()). */
enum { DEC_B = 8, DEC_P = 6, DEC_STEPS = 5 };
static float *batched_decode(const char *dir, const int32_t *ids, const char *sw, const char *on) {
    setenv(sw, on, 1);
    lm_model *m = NULL;
    LT_CHECK_OK(lm_model_load(dir, ct_gpu, &m));
    float *out = NULL;
    if (m) {
        int64_t V = lm_model_get_config(m)->vocab_size;
        out = malloc(sizeof(float) * (size_t)((1 + DEC_STEPS) * DEC_B * V));
        lm_kv_cache *c = NULL;
        int slots[DEC_B] = {0, 1, 2, 3, 4, 5, 6, 7};
        LT_CHECK_OK(lm_kv_cache_create(m, DEC_B, DEC_P + DEC_STEPS, &c));
        LT_CHECK_OK(lm_model_forward(m, g_ctx, c, slots, DEC_B, ids, DEC_P, out, 0));
        for (int t = 0; t < DEC_STEPS; t++)
            LT_CHECK_OK(lm_model_forward(m, g_ctx, c, slots, DEC_B, ids + DEC_B * DEC_P + t * DEC_B, 1,
                                         out + (1 + t) * DEC_B * V, 0));
        LT_CHECK_OK(lm_ctx_synchronize(g_ctx));
        lm_kv_cache_destroy(c);
        lm_model_destroy(m);
    }
    unsetenv(sw);
    return out;
}

static void model_batched_decode(const char *sw, const char *on_value, uint64_t seed) {
    for (int mi = 0; mi < 2; mi++) {
        char dir[512];
        int32_t ids[DEC_B * (DEC_P + DEC_STEPS)];
        int64_t V = model_ids(mi, dir, sizeof dir, ids, DEC_B * (DEC_P + DEC_STEPS), seed + mi);
        if (!V) continue;
        float *on = batched_decode(dir, ids, sw, on_value), *off = batched_decode(dir, ids, sw, "0");
        if (on && off) {
            const int rows = (1 + DEC_STEPS) * DEC_B;
            ct_logits_cmp c = ct_logits_compare(on, off, rows, V);
            LT_CHECK_MSG(c.finite && c.nmse <= 1e-5, "%s batched decode (8 rows): %s on vs off NMSE %.3g, top-1 %d "
                         "of %d", k_models[mi], sw, c.nmse, c.top1, rows);
        }
        free(on), free(off);
    }
}

static void test_model_batched_decode(void) { model_batched_decode("LOOM_CUDA_SWIGLU_GEMM", "1", 950); }

/* ---- the few-rows product (gemm_rows.cu) ---- */
/* out [M, N] f32 = x W^T (+ bias) for M rows of bf16 x (row stride K + 16), bf16 w [N, K]
 * and an f32 bias, into an out of row stride N + 8 whose pad columns are poisoned; splits
 * forces LOOM_CUDA_ROWS_GEMM_SPLITS (NULL: the launcher's). The kernel called directly
 * (twice: the same bits), the operator with graphs' rule at 64 rows
 * (LOOM_CUDA_ROWS_GEMM_MAX_ROWS=64 with K within _MIN_K and _MAX_K: it must take the kernel,
 * the same bits; with K past _MAX_K or under _MIN_K: cuBLASLt's bits), the operator with no
 * switch set (the default rule: the kernel's bits up to 16 rows and K <= 1,024, else
 * cuBLASLt's), cuBLASLt's GEMM (the rule at 0 rows) and the CPU's f32 product; NMSE <=
 * 1e-10 and max-abs <= 2^-14 of the largest |out| against the last two (f32 sums in
 * another order). Each operator call must also have launched the kernel exactly when its
 * rule admits the call (lm__cuda_linear_rows_wg_launches): where the kernel and cuBLASLt
 * agree in every bit (short K), the bits alone could not tell the paths apart. */
static void rows_case(int64_t M, int64_t K, int64_t N, int with_bias, const char *splits, uint64_t seed) {
    if (splits) setenv("LOOM_CUDA_ROWS_GEMM_SPLITS", splits, 1);
    else unsetenv("LOOM_CUDA_ROWS_GEMM_SPLITS");
    lt_rng r = lt_rng_seed(seed);
    const int64_t ldx = K + 16, ldo = N + 8;
    int64_t xs[2] = {M, ldx}, ws[2] = {N, K}, bs[1] = {N}, os[2] = {M, ldo}, ms[2] = {M, N};
    ct_pair xw = ct_random(&r, LM_BF16, 2, xs, 1.0), w = ct_random(&r, LM_BF16, 2, ws, 2.0 / sqrt((double)K));
    ct_pair b = ct_random(&r, LM_F32, 1, bs, 1.0), o1 = ct_poisoned(LM_F32, 2, os), o2 = ct_poisoned(LM_F32, 2, os);
    ct_pair o3 = ct_poisoned(LM_F32, 2, os), lt = ct_poisoned(LM_F32, 2, ms), kb = ct_poisoned(LM_F32, 2, ms);
    ct_pair kn = ct_poisoned(LM_F32, 2, ms), df = ct_poisoned(LM_F32, 2, ms);
    lm_tensor_view xh = narrow(xw.h, K), xd = narrow(xw.d, K), d1 = narrow(o1.d, N), d2 = narrow(o2.d, N),
                   d3 = narrow(o3.d, N);
    const lm_tensor_view *bd = with_bias ? lm_tensor_as_view(b.d) : NULL, *bh = with_bias ? lm_tensor_as_view(b.h) : NULL;
    lm_linear_params lp = {.input = LM_LINEAR_IN};
    char what[160];
    snprintf(what, sizeof what, "rows GEMM M %lld K %lld N %lld%s splits %s", (long long)M, (long long)K, (long long)N,
             with_bias ? " +bias" : "", splits ? splits : "auto");
    const void *wp = lm_tensor_as_view(w.d)->data;
    const float *bp = bd ? (const float *)bd->data : NULL;
    lm_status st = lm__cuda_linear_rows_wg(xd.data, ldx, wp, K, bp, M, N, K, (float *)d1.data, ldo, ct_stream(g_ctx));
    if (!want_wgmma()) { /* refused by name, nothing queued */
        LT_CHECK_MSG(st == LM_UNSUPPORTED && strstr(lm_last_error(), "sm_90"), "%s off sm_90a: status %d", what, (int)st);
        lm_clear_error();
    } else {
        LT_CHECK_OK(st);
        LT_CHECK_OK(lm__cuda_linear_rows_wg(xd.data, ldx, wp, K, bp, M, N, K, (float *)d3.data, ldo, ct_stream(g_ctx)));
        char kv[32];
        snprintf(kv, sizeof kv, "%lld", (long long)K);
        /* each operator call below: whether it launched the kernel (its launch count), then
         * the bits, which also show the path where the kernel and cuBLASLt differ in them */
        const int by_default = M <= 16 && K <= 1024; /* step_cuda.c's ROWS_WG_ROWS, ROWS_WG_MAX_K */
        long long took[5], n0;
        setenv("LOOM_CUDA_ROWS_GEMM_MAX_ROWS", "64", 1); /* graphs' rule: up to 64 rows, K within [K, K] */
        setenv("LOOM_CUDA_ROWS_GEMM_MIN_K", kv, 1), setenv("LOOM_CUDA_ROWS_GEMM_MAX_K", kv, 1);
        n0 = lm__cuda_linear_rows_wg_launches();
        LT_CHECK_OK(lm_linear_out(g_ctx, &xd, lm_tensor_as_view(w.d), bd, &lp, &d2));
        took[0] = lm__cuda_linear_rows_wg_launches() - n0;
        snprintf(kv, sizeof kv, "%lld", (long long)K - 1); /* K past the bound: cuBLASLt */
        setenv("LOOM_CUDA_ROWS_GEMM_MAX_K", kv, 1);
        n0 = lm__cuda_linear_rows_wg_launches();
        LT_CHECK_OK(lm_linear_out(g_ctx, &xd, lm_tensor_as_view(w.d), bd, &lp, lm_tensor_as_view(kb.d)));
        took[1] = lm__cuda_linear_rows_wg_launches() - n0;
        snprintf(kv, sizeof kv, "%lld", (long long)K + 1); /* K under the lower bound: cuBLASLt */
        setenv("LOOM_CUDA_ROWS_GEMM_MIN_K", kv, 1), unsetenv("LOOM_CUDA_ROWS_GEMM_MAX_K");
        n0 = lm__cuda_linear_rows_wg_launches();
        LT_CHECK_OK(lm_linear_out(g_ctx, &xd, lm_tensor_as_view(w.d), bd, &lp, lm_tensor_as_view(kn.d)));
        took[2] = lm__cuda_linear_rows_wg_launches() - n0;
        unsetenv("LOOM_CUDA_ROWS_GEMM_MIN_K"), unsetenv("LOOM_CUDA_ROWS_GEMM_MAX_ROWS");
        n0 = lm__cuda_linear_rows_wg_launches();
        LT_CHECK_OK(lm_linear_out(g_ctx, &xd, lm_tensor_as_view(w.d), bd, &lp, lm_tensor_as_view(df.d))); /* no switch */
        took[3] = lm__cuda_linear_rows_wg_launches() - n0;
        setenv("LOOM_CUDA_ROWS_GEMM_MAX_ROWS", "0", 1); /* none: cuBLASLt */
        n0 = lm__cuda_linear_rows_wg_launches();
        LT_CHECK_OK(lm_linear_out(g_ctx, &xd, lm_tensor_as_view(w.d), bd, &lp, lm_tensor_as_view(lt.d)));
        took[4] = lm__cuda_linear_rows_wg_launches() - n0;
        unsetenv("LOOM_CUDA_ROWS_GEMM_MAX_ROWS");
        LT_CHECK_MSG(took[0] == 1 && took[1] == 0 && took[2] == 0 && took[3] == by_default && took[4] == 0,
                     "%s: kernel launches %lld with K within the switches (want 1), %lld past _MAX_K, %lld under "
                     "_MIN_K, %lld with no switch (want %d), %lld at 0 rows (want 0 for each of those)", what, took[0],
                     took[1], took[2], took[3], by_default, took[4]);
        lm_tensor *want = lt_poisoned_tensor(LM_F32, 2, ms);
        LT_CHECK_OK(lm_linear_out(g_ref, &xh, lm_tensor_as_view(w.h), bh, &lp, lm_tensor_as_view(want)));
        double *got = read_view(lm_tensor_as_view(o1.d), o1.d), *again = read_view(lm_tensor_as_view(o3.d), o3.d);
        double *op = read_view(lm_tensor_as_view(o2.d), o2.d), *blas = read_view(lm_tensor_as_view(lt.d), lt.d);
        double *cpu = lt_view_to_f64(lm_tensor_as_view(want)), *kbl = read_view(lm_tensor_as_view(kb.d), kb.d);
        double *knl = read_view(lm_tensor_as_view(kn.d), kn.d), *dfl = read_view(lm_tensor_as_view(df.d), df.d);
        int64_t same = 0, same_op = 0, pads = 0, same_kb = 0, same_kn = 0, same_df = 0;
        for (int64_t i = 0; i < M * N; i++) {
            same_kb += memcmp(&kbl[i], &blas[i], sizeof kbl[i]) == 0;
            same_kn += memcmp(&knl[i], &blas[i], sizeof knl[i]) == 0;
        }
        LT_CHECK_MSG(same_kb == M * N && same_kn == M * N,
                     "%s: %lld of %lld outputs with K past LOOM_CUDA_ROWS_GEMM_MAX_K and %lld with K under _MIN_K the "
                     "bits of cuBLASLt's", what, (long long)same_kb, (long long)(M * N), (long long)same_kn);
        /* the default rule: the kernel for up to 16 rows and K <= 1,024, cuBLASLt past either */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++)
                same_df += memcmp(&dfl[i * N + j], by_default ? &got[i * ldo + j] : &blas[i * N + j], sizeof(double)) == 0;
        LT_CHECK_MSG(same_df == M * N, "%s: %lld of %lld outputs with no switch set the bits of %s", what,
                     (long long)same_df, (long long)(M * N), by_default ? "the kernel (default rule)" : "cuBLASLt's");
        double *g = malloc(sizeof(double) * (size_t)(M * N));
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < ldo; j++) {
                const double v = got[i * ldo + j];
                if (j >= N) {
                    pads += isnan(v) && isnan(again[i * ldo + j]) && isnan(op[i * ldo + j]);
                    continue;
                }
                g[i * N + j] = v;
                same += memcmp(&v, &again[i * ldo + j], sizeof v) == 0;
                same_op += memcmp(&v, &op[i * ldo + j], sizeof v) == 0;
            }
        LT_CHECK_MSG(same == M * N && same_op == M * N && pads == M * (ldo - N),
                     "%s: %lld of %lld outputs the same on a second run, %lld through the operator, %lld of %lld pads "
                     "kept", what, (long long)same, (long long)(M * N), (long long)same_op, (long long)pads,
                     (long long)(M * (ldo - N)));
        char w2[200];
        snprintf(w2, sizeof w2, "%s vs cuBLASLt", what);
        compare(w2, g, blas, M * N, 1e-10, 1.0 / 16384);
        snprintf(w2, sizeof w2, "%s vs the CPU", what);
        compare(w2, g, cpu, M * N, 1e-10, 1.0 / 16384);
        free(got), free(again), free(op), free(blas), free(cpu), free(g), free(kbl), free(knl), free(dfl);
        lm_tensor_destroy(want);
    }
    ct_pair_free(&xw), ct_pair_free(&w), ct_pair_free(&b), ct_pair_free(&o1), ct_pair_free(&o2), ct_pair_free(&o3);
    ct_pair_free(&lt), ct_pair_free(&kb), ct_pair_free(&kn), ct_pair_free(&df);
    unsetenv("LOOM_CUDA_ROWS_GEMM_SPLITS");
}

/* Rows 1-64 at each token tile (16, 32, 64) and its edges; Qwen2.5-0.5B's q|k|v (1,152 x
 * 896), o (896 x 896) and down (896 x 4,864); the default rule's edges (16 and 17 rows at
 * K = 896, K = 1,024 and 1,032 at 8 rows); N past a 64-output tile (100, 300); K with a
 * tail past the 64-wide steps (72, 200) and of one partial step (8); the splits forced to
 * 1 (down's 76 steps through the ring of 8 stages, wrapping 9 times), 3 (uneven shares and
 * output slices) and 8, and past K's steps (clamped). Then the refusals: 65 rows, a
 * misaligned x, K not a multiple of 8; each LM_UNSUPPORTED naming it, out untouched. */
static void test_rows_gemm(void) {
    LT_CHECK_MSG(lm__cuda_linear_rows_wg_ok() == want_wgmma(), "rows GEMM runs: %d, expected %d",
                 lm__cuda_linear_rows_wg_ok(), want_wgmma());
    static const int64_t shapes[][4] = {{1, 896, 1152, 1}, {3, 72, 100, 1}, {8, 896, 896, 0},  {16, 4864, 896, 0},
                                        {17, 896, 1152, 1}, {32, 4864, 896, 0}, {32, 896, 1152, 1}, {33, 200, 300, 1},
                                        {64, 896, 896, 0},  {64, 8, 64, 1},    {48, 4864, 896, 0},
                                        {16, 896, 1152, 1}, {8, 1024, 256, 0}, {8, 1032, 256, 0}};
    uint64_t seed = 1300;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        rows_case(shapes[i][0], shapes[i][1], shapes[i][2], (int)shapes[i][3], NULL, seed++);
    static const char *const splits[3] = {"1", "3", "8"};
    for (int k = 0; k < 3; k++) {
        rows_case(32, 4864, 896, 0, splits[k], seed++);
        rows_case(17, 896, 1152, 1, splits[k], seed++);
    }
    rows_case(5, 72, 100, 1, "8", seed++); /* 2 steps: clamped to 2 splits */
    if (!want_wgmma()) return;
    int64_t xs[2] = {65, 72}, ws[2] = {64, 72}, os[2] = {65, 64};
    lt_rng r = lt_rng_seed(seed);
    ct_pair x = ct_random(&r, LM_BF16, 2, xs, 1.0), w = ct_random(&r, LM_BF16, 2, ws, 0.1);
    ct_pair o = ct_poisoned(LM_F32, 2, os);
    const char *xp = (const char *)lm_tensor_as_view(x.d)->data;
    const void *wp = lm_tensor_as_view(w.d)->data;
    float *op = (float *)lm_tensor_as_view(o.d)->data;
    struct {
        const void *x;
        int64_t M, K;
        const char *why;
    } bad[3] = {{xp, 65, 72, "65 rows"}, {xp + 2, 4, 64, "x misaligned"}, {xp, 4, 68, "K 68"}};
    for (int i = 0; i < 3; i++) {
        lm_status st = lm__cuda_linear_rows_wg(bad[i].x, 72, wp, 72, NULL, bad[i].M, 64, bad[i].K, op, 64,
                                               ct_stream(g_ctx));
        LT_CHECK_MSG(st == LM_UNSUPPORTED && strstr(lm_last_error(), "multiples of 8"), "%s: status %d, \"%s\"",
                     bad[i].why, (int)st, lm_last_error());
        lm_clear_error();
    }
    check_untouched("refused calls", &o);
    ct_pair_free(&x), ct_pair_free(&w), ct_pair_free(&o);
}

/* Graphs' rule at 64 rows and no K bound: the kernel takes every product of the 48-row
 * prefill and the 8-row steps; against none (cuBLASLt). */
static void test_model_rows_gemm(void) {
    setenv("LOOM_CUDA_ROWS_GEMM_MAX_K", "1000000000", 1);
    model_batched_decode("LOOM_CUDA_ROWS_GEMM_MAX_ROWS", "64", 970);
    unsetenv("LOOM_CUDA_ROWS_GEMM_MAX_K");
}

int main(void) {
    g_ctx = ct_start();
    g_ref = ct_ref_ctx();
    LT_RUN(test_rule);
    LT_RUN(test_shapes_and_widths);
    LT_RUN(test_one_row_block);
    LT_RUN(test_model_prefill);
    LT_RUN(test_model_batched_decode);
    LT_RUN(test_rows_gemm);
    LT_RUN(test_model_rows_gemm);
    lm_ctx_destroy(g_ref);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
