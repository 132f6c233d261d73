/* CUDA lm_linear_out with quantized weights (ops/cuda/gemv_quant.cu) against the CPU
 * reference (LM_IMPL_REF, double) on the same quantized bytes: int8, fp8 e4m3 and int4
 * (G = 32, 128), weights quantized on the host by lm_quantize_* from fresh random
 * floats, M in {1, 3, 8, 17, 64}, odd N (67: split-K GEMV; 4229: one warp per row
 * pair), K multiples of 128 (2,048 and 7,168 at M = 1 and 8: the GEMV's input staged
 * in shared memory, and at M = 8, K = 7,168 read from global memory per use, or with a
 * workspace given the workspace path: lm__quant_ws_rows), every input form (plain, RMSNorm, SwiGLU), bias,
 * accumulate; outputs NaN-poisoned before each run (except under accumulate, where
 * they hold the residual). Also the readable kernel (K = 40 off the 16-weight vectors,
 * a strided bf16 out), and a model: llama_gqa2_f32 / qwen2_bias_sharded loaded with
 * --weights int8 / int4 / fp8 on CUDA against the same quantized model on the CPU.
 * int4 runs with bf16 group scales (as models load), and bf16 scales must give the exact
 * output of the same scales in f32 on every path.
 * Gates: the GEMV (M <= 8) keeps x f32 and decodes weights exactly, so only f32
 * summation order and the fast exp/rsqrt differ: NMSE <= 1e-8, max-abs <= 1e-4 of the
 * largest |output|. Past 8 rows both paths run (without and with a workspace): the
 * tensor-core kernel rounds x (and int4's q * scale) to bf16, the workspace path x and
 * q * scale (2^-9 relative each): NMSE <= 3e-5, max-abs <= 2e-2 of the largest |output|;
 * 16,500 x 1,024 weights go through the workspace in two chunks (int8, int4 G = 128).
 * The model: logits NMSE <= 1e-3 and top-1 agreement >= 22/24 (bf16 KV cache and
 * embedding table on CUDA; the quantized projections are the same bytes).
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else
#include "loom/model.h"

static lm_ctx *g_ctx, *g_ref;
/* int4 cases: the device reads the group scales as bf16 (1) or as their exact f32 copy
 * (0); the reference always reads the f32 copy. g_keep: run_case leaves the device's
 * output in g_kept (M x N doubles) for a caller to compare two runs bit for bit. */
static int g_s16 = 1, g_keep;
static double *g_kept;

enum { F_I8, F_F8, F_I4 };
static const char *const k_fmt[] = {"int8", "fp8", "int4"};

typedef struct qcase {
    int fmt, group, M;
    int64_t N, K;
    lm_linear_input in;
    int bias, accumulate;
    lm_dtype out_dt;
    int strided_out;
    int ws; /* pass a workspace of lm_linear_workspace_bytes (M > 8: the bf16 copies + cuBLASLt path) */
} qcase;

static double max_abs(const lm_tensor_view *v) {
    double *d = lt_view_to_f64(v), m = 0;
    for (int64_t i = 0; i < lm_tensor_view_numel(v); i++)
        if (fabs(d[i]) > m) m = fabs(d[i]);
    free(d);
    return m;
}

/* Runs one case and checks it; returns the output's NMSE against the reference. */
static double run_case(const qcase *c, uint64_t seed) {
    lt_rng r = lt_rng_seed(seed);
    int i4 = c->fmt == F_I4;
    int64_t M = c->M, N = c->N, K = c->K;
    int64_t ws[2] = {N, K}, qs[2] = {N, i4 ? K / 2 : K}, ss[2] = {N, i4 ? K / c->group : 1};
    int64_t xs[2] = {M, c->in == LM_LINEAR_IN_SWIGLU ? 2 * K : K}, os[2] = {M, N}, ns[1] = {N}, ks[1] = {K};
    lm_tensor *w = lt_random_tensor(&r, LM_F32, 2, ws, 1.0 / sqrt((double)K)), *q = NULL, *sc = NULL, *sc16 = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), i4 ? LM_U8 : c->fmt == F_F8 ? LM_F8_E4M3 : LM_I8, 2, qs, &q));
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, i4 ? 2 : 1, ss, &sc));
    if (i4) { /* bf16 group scales, as a loaded model's, and their exact f32 copy */
        LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_BF16, 2, ss, &sc16));
        LT_CHECK_OK(lm_quantize_int4_groups(g_ref, lm_tensor_as_view(w), lm_tensor_as_view(q), lm_tensor_as_view(sc16),
                                            c->group));
        LT_CHECK_OK(lm_cast_out(g_ref, lm_tensor_as_view(sc16), lm_tensor_as_view(sc)));
    } else if (c->fmt == F_F8)
        LT_CHECK_OK(lm_quantize_fp8_rows(g_ref, lm_tensor_as_view(w), lm_tensor_as_view(q), lm_tensor_as_view(sc)));
    else
        LT_CHECK_OK(lm_quantize_int8_rows(g_ref, lm_tensor_as_view(w), lm_tensor_as_view(q), lm_tensor_as_view(sc)));
    ct_pair qp = ct_pair_of(q), sp = ct_pair_of(i4 && g_s16 ? sc16 : sc);
    ct_pair x = ct_random(&r, LM_F32, 2, xs, 1.0);
    ct_pair b = ct_random(&r, LM_F32, 1, ns, 1.0);
    lm_tensor *nh = lt_random_tensor(&r, LM_F32, 1, ks, 0.5);
    float *nd = lm_tensor_data(nh);
    for (int64_t k = 0; k < K; k++) nd[k] += 1.0f;
    ct_pair nw = ct_pair_of(nh);
    /* out: poisoned, or the residual under accumulate; strided: every other column */
    lm_tensor_view oh, od;
    ct_pair o;
    if (c->accumulate) {
        o = ct_random(&r, c->out_dt, 2, os, 1.0);
        oh = *lm_tensor_as_view(o.h), od = *lm_tensor_as_view(o.d);
    } else if (c->strided_out) {
        o = ct_poisoned_strided(c->out_dt, 2, os, &oh, &od);
    } else {
        o = ct_poisoned(c->out_dt, 2, os);
        oh = *lm_tensor_as_view(o.h), od = *lm_tensor_as_view(o.d);
    }
    lm_tensor *want = lt_poisoned_tensor(c->out_dt, 2, os);
    if (c->accumulate) LT_CHECK_OK(lm_cast_out(g_ref, &oh, lm_tensor_as_view(want)));
    lm_linear_params ph = {.input = c->in, .norm_weight = lm_tensor_as_view(nw.h), .eps = 1e-5f,
                           .accumulate = c->accumulate, .w_scales = lm_tensor_as_view(sc), .w_bits = i4 ? 4 : 0,
                           .w_group = i4 ? c->group : 0};
    lm_linear_params pd = ph;
    pd.norm_weight = lm_tensor_as_view(nw.d), pd.w_scales = lm_tensor_as_view(sp.d);
    lm_tensor *work = NULL;
    if (c->ws) {
        int64_t wb[1] = {(int64_t)lm_linear_workspace_bytes(ct_gpu, M, N, K, lm_tensor_dtype(q))};
        LT_CHECK(wb[0] > 0 || M <= 8);
        if (wb[0] > 0) {
            LT_CHECK_OK(lm_tensor_create(ct_gpu, LM_U8, 1, wb, &work));
            pd.workspace = lm_tensor_as_view(work);
        }
    }
    LT_CHECK_OK(lm_linear_out(g_ref, lm_tensor_as_view(x.h), lm_tensor_as_view(q), c->bias ? lm_tensor_as_view(b.h) : NULL,
                              &ph, lm_tensor_as_view(want)));
    LT_CHECK_OK(lm_linear_out(g_ctx, lm_tensor_as_view(x.d), lm_tensor_as_view(qp.d),
                              c->bias ? lm_tensor_as_view(b.d) : NULL, &pd, &od));
    int mma = M > 8 || work; /* bf16 rounding: past 8 rows, and on the workspace path at any rows */
    double big = max_abs(lm_tensor_as_view(want));
    double nmse = c->out_dt != LM_F32 ? ct_nmse(c->out_dt) + (mma ? 3e-5 : 0) : mma ? 3e-5 : 1e-8;
    double tol = (mma || c->out_dt != LM_F32 ? 2e-2 : 1e-4) * (big > 0 ? big : 1);
    char what[160];
    snprintf(what, sizeof what, "%s%s%d%s M=%d N=%lld K=%lld in=%d bias=%d acc=%d out=%s%s%s", k_fmt[c->fmt],
             i4 ? " G=" : "", i4 ? c->group : 0, i4 ? (g_s16 ? " bf16 scales" : " f32 scales") : "", c->M,
             (long long)N, (long long)K, (int)c->in, c->bias, c->accumulate, lm_dtype_name(c->out_dt),
             c->strided_out ? " strided" : "", work ? " workspace" : "");
    ct_check(g_ctx, what, &o, &od, lm_tensor_as_view(want), nmse, tol);
    double *got = ct_read(g_ctx, &o, &od), *ref = lt_view_to_f64(lm_tensor_as_view(want)), se = 0, sr = 0;
    for (int64_t i = 0; i < M * N; i++) se += (got[i] - ref[i]) * (got[i] - ref[i]), sr += ref[i] * ref[i];
    if (g_keep) free(g_kept), g_kept = got, got = NULL;
    free(got), free(ref);
    lm_tensor_destroy(sp.h == sc ? sc16 : sc); /* sp owns the copy it uploaded; the other one is ours */
    lm_tensor_destroy(work);
    lm_tensor_destroy(want), lm_tensor_destroy(w);
    ct_pair_free(&qp), ct_pair_free(&sp), ct_pair_free(&x), ct_pair_free(&b), ct_pair_free(&nw), ct_pair_free(&o);
    return sr > 0 ? se / sr : se;
}

/* Every format and group at every M, plain and with bias, small (split-K) N. */
static void test_formats_and_rows(void) {
    static const int fmts[4][2] = {{F_I8, 0}, {F_F8, 0}, {F_I4, 32}, {F_I4, 128}};
    static const int Ms[5] = {1, 3, 8, 17, 64};
    uint64_t seed = 1000;
    for (int f = 0; f < 4; f++)
        for (int mi = 0; mi < 5; mi++)
            for (int bias = 0; bias < 2; bias++)
                for (int ws = 0; ws <= (Ms[mi] > 8); ws++) {
                    qcase c = {fmts[f][0], fmts[f][1], Ms[mi], 67, 384, LM_LINEAR_IN, bias, 0, LM_F32, 0, ws};
                    run_case(&c, seed++);
                }
}

/* Large N (one warp per row pair in the GEMV), K = 256. */
static void test_large_n(void) {
    static const int fmts[4][2] = {{F_I8, 0}, {F_F8, 0}, {F_I4, 32}, {F_I4, 128}};
    uint64_t seed = 2000;
    for (int f = 0; f < 4; f++) {
        qcase c = {fmts[f][0], fmts[f][1], 1, 4229, 256, LM_LINEAR_IN, 1, 0, LM_F32, 0, 0};
        run_case(&c, seed++);
        c.M = 3, c.accumulate = 1;
        run_case(&c, seed++);
        c.M = 17;
        run_case(&c, seed++);
        c.ws = 1;
        run_case(&c, seed++);
    }
}

/* The workspace path when the weights do not fit its 32 MiB at once: rows in chunks of
 * 16,384 (the last one 116 rows), each chunk's bias and output columns. */
static void test_workspace_chunks(void) {
    static const int fmts[2][2] = {{F_I8, 0}, {F_I4, 128}};
    uint64_t seed = 2500;
    for (int f = 0; f < 2; f++) {
        qcase c = {fmts[f][0], fmts[f][1], 9, 16500, 1024, LM_LINEAR_IN_RMSNORM, 1, 1, LM_F32, 0, 1};
        size_t need = lm_linear_workspace_bytes(ct_gpu, 9, 16500, 1024, f ? LM_U8 : LM_I8);
        LT_CHECK_MSG(need == (size_t)(9 * 1024 * 2) + (size_t)16384 * 1024 * 2, /* 18,432: a multiple of 256 */
                     "workspace bytes %zu", need);
        run_case(&c, seed++);
    }
}

/* RMSNorm and SwiGLU prologues, accumulate, on both paths. */
static void test_fused_inputs(void) {
    static const int fmts[3][2] = {{F_I8, 0}, {F_F8, 0}, {F_I4, 64}};
    static const int Ms[3] = {1, 5, 33};
    uint64_t seed = 3000;
    for (int f = 0; f < 3; f++)
        for (int mi = 0; mi < 3; mi++)
            for (int in = 1; in <= 2; in++)
                for (int acc = 0; acc < 2; acc++)
                    for (int ws = 0; ws <= (Ms[mi] > 8); ws++) {
                        qcase c = {fmts[f][0], fmts[f][1], Ms[mi], 131, 256, (lm_linear_input)in, 1, acc, LM_F32, 0,
                                   ws};
                        run_case(&c, seed++);
                    }
}

/* Long rows: the GEMV stages in(x) in shared memory (K = 2,048; K = 7,168 at M = 1)
 * or, past the opt-in limit (M = 8, K = 7,168: 229 KiB), reads it from global memory. */
static void test_long_rows(void) {
    static const int fmts[3][2] = {{F_I8, 0}, {F_F8, 0}, {F_I4, 128}};
    static const int Ks[2] = {2048, 7168};
    uint64_t seed = 3500;
    for (int f = 0; f < 3; f++)
        for (int ki = 0; ki < 2; ki++)
            for (int m = 1; m <= 8; m += 7)
                for (int in = 1; in <= 2; in++) {
                    qcase c = {fmts[f][0], fmts[f][1], m, 67, Ks[ki], (lm_linear_input)in, 1, in == 2, LM_F32, 0, 0};
                    run_case(&c, seed++);
                }
}

/* 3-8 rows whose inputs the GEMV cannot stage (K = 7,168 at 5 and 8 rows: 229 KiB; K =
 * 65,536 at 3 rows: no GPU's shared memory) take the workspace path when given one (the
 * executor always gives it: lm_linear_workspace_bytes asks for it), and the GEMV without
 * it. The workspace path rounds x to bf16, so its error must be far above the GEMV's:
 * that tells the paths apart. 4 rows of K = 7,168 stage (115 KiB) and keep the GEMV. */
static void test_unstaged_rows(void) {
    static const int fmts[3][2] = {{F_I8, 0}, {F_F8, 0}, {F_I4, 128}};
    static const struct {
        int M;
        int64_t K;
    } rows[3] = {{5, 7168}, {8, 7168}, {3, 65536}};
    uint64_t seed = 3700;
    for (int f = 0; f < 3; f++) {
        for (int i = 0; i < 3; i++) {
            lm_dtype dt = fmts[f][0] == F_I4 ? LM_U8 : fmts[f][0] == F_F8 ? LM_F8_E4M3 : LM_I8;
            LT_CHECK_MSG(lm_linear_workspace_bytes(ct_gpu, rows[i].M, 67, rows[i].K, dt) > 0, "%s: M=%d K=%lld asks "
                         "for no workspace", k_fmt[fmts[f][0]], rows[i].M, (long long)rows[i].K);
            for (int in = 0; in <= 2; in += 2) {
                qcase c = {fmts[f][0], fmts[f][1], rows[i].M, 67, rows[i].K, (lm_linear_input)in, 1, in == 2, LM_F32, 0,
                           0};
                double gemv = run_case(&c, seed);
                c.ws = 1;
                double ws = run_case(&c, seed++);
                LT_CHECK_MSG(gemv < 1e-8 && ws > 1e-7, "%s M=%d K=%lld: NMSE %.3g without the workspace, %.3g with it "
                             "(the GEMV's f32 inputs, then bf16 copies)", k_fmt[fmts[f][0]], rows[i].M,
                             (long long)rows[i].K, gemv, ws);
            }
        }
        lm_dtype dt = fmts[f][0] == F_I4 ? LM_U8 : fmts[f][0] == F_F8 ? LM_F8_E4M3 : LM_I8;
        LT_CHECK(lm_linear_workspace_bytes(ct_gpu, 4, 67, 7168, dt) == 0);
        LT_CHECK(lm_linear_workspace_bytes(ct_gpu, 2, 67, 65536, dt) == 0); /* 1-2 rows: the GEMV, per-use reads */
        /* the pair epilogues need staged inputs */
        LT_CHECK(lm_linear_swiglu_fused(ct_gpu, LM_LINEAR_IN_RMSNORM, 8, 2048, LM_F32, dt));
        LT_CHECK(!lm_linear_swiglu_fused(ct_gpu, LM_LINEAR_IN_RMSNORM, 8, 65536, LM_F32, dt));
        LT_CHECK(!lm_linear_qkv_rope_fused(ct_gpu, LM_LINEAR_IN_RMSNORM, 3, 65536, LM_F32, dt, 0));
    }
    LT_CHECK(!lm_linear_qkv_rope_fused(ct_gpu, LM_LINEAR_IN_RMSNORM, 2, 65536, LM_F32, LM_BF16, 0));
    LT_CHECK(lm_linear_qkv_rope_fused(ct_gpu, LM_LINEAR_IN_RMSNORM, 2, 2048, LM_F32, LM_BF16, 0));
}

/* One and two rows with a row's K split over 1, 2, 4 or 8 warps (LOOM_CUDA_GEMV_KSPLIT,
 * forced; the rounds rule picks among them by shape), every format and input form. */
static void test_forced_splits(void) {
    static const int fmts[4][2] = {{F_I8, 0}, {F_F8, 0}, {F_I4, 32}, {F_I4, 128}};
    static const char *const splits[4] = {"1", "2", "4", "8"};
    uint64_t seed = 3900;
    for (int v = 0; v < 4; v++) {
        setenv("LOOM_CUDA_GEMV_KSPLIT", splits[v], 1);
        for (int f = 0; f < 4; f++)
            for (int m = 1; m <= 2; m++)
                for (int in = 0; in <= 2; in++) {
                    /* one row: K = 3,072, an odd number of weight batches per warp at a split of 1 */
                    const int64_t K = m == 1 ? 3072 : 2048;
                    qcase c = {fmts[f][0], fmts[f][1], m, in == 1 ? 4229 : 67, K, (lm_linear_input)in, in != 2,
                               in == 2, LM_F32, 0, 0};
                    run_case(&c, seed++);
                }
    }
    unsetenv("LOOM_CUDA_GEMV_KSPLIT");
}

/* The readable kernel: K off the vector size, bf16 and strided outputs. */
static void test_readable_layouts(void) {
    uint64_t seed = 4000;
    for (int f = 0; f < 2; f++)
        for (int m = 3; m <= 17; m += 14) {
            qcase c = {f, 0, m, 33, 40, LM_LINEAR_IN_RMSNORM, 1, 0, LM_F32, 0, 0};
            run_case(&c, seed++);
        }
    static const int fmts[3][2] = {{F_I8, 0}, {F_F8, 0}, {F_I4, 32}};
    for (int f = 0; f < 3; f++) {
        qcase c = {fmts[f][0], fmts[f][1], 3, 33, 64, LM_LINEAR_IN, 1, 0, LM_BF16, 0, 0};
        run_case(&c, seed++);
        c.out_dt = LM_F32, c.strided_out = 1, c.M = 9;
        run_case(&c, seed++);
    }
}

/* int4 with bf16 group scales gives the bits of the same scales in f32 on every path: the
 * GEMV (1, 2 and 8 rows, every input form, a row's K split 1-8 ways), the workspace path
 * (3 unstaged rows; 17 rows; 16,500 rows in two chunks, whose second starts at a scale
 * row offset), the tensor-core kernel without a workspace, and the readable kernel
 * (strided out). Every other case of this file runs int4 with bf16 scales against the
 * reference (g_s16 = 1). */
static void test_int4_bf16_scales_bitwise(void) {
    static const qcase cs[] = {
        {F_I4, 32, 1, 4229, 2048, LM_LINEAR_IN_RMSNORM, 1, 0, LM_F32, 0, 0},
        {F_I4, 64, 2, 67, 2048, LM_LINEAR_IN_SWIGLU, 0, 1, LM_F32, 0, 0},
        {F_I4, 128, 8, 131, 256, LM_LINEAR_IN, 1, 1, LM_F32, 0, 0},
        {F_I4, 128, 3, 67, 65536, LM_LINEAR_IN, 1, 0, LM_F32, 0, 1},
        {F_I4, 32, 17, 67, 384, LM_LINEAR_IN_RMSNORM, 1, 0, LM_F32, 0, 1},
        {F_I4, 128, 9, 16500, 1024, LM_LINEAR_IN_RMSNORM, 1, 1, LM_F32, 0, 1},
        {F_I4, 64, 33, 131, 256, LM_LINEAR_IN_SWIGLU, 1, 0, LM_F32, 0, 0},
        {F_I4, 32, 9, 33, 64, LM_LINEAR_IN, 1, 0, LM_F32, 1, 0},
    };
    static const char *const splits[3] = {NULL, "1", "8"};
    uint64_t seed = 4500;
    g_keep = 1;
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int v = 0; v < (cs[i].M <= 2 ? 3 : 1); v++, seed++) {
            if (splits[v]) setenv("LOOM_CUDA_GEMV_KSPLIT", splits[v], 1);
            double *out[2];
            for (int s16 = 0; s16 < 2; s16++) {
                g_s16 = s16;
                run_case(&cs[i], seed);
                out[s16] = g_kept, g_kept = NULL;
            }
            int64_t n = cs[i].M * cs[i].N, bad = -1;
            for (int64_t j = 0; out[0] && out[1] && j < n && bad < 0; j++)
                if (memcmp(&out[0][j], &out[1][j], sizeof(double)) != 0) bad = j;
            LT_CHECK_MSG(out[0] && out[1] && bad < 0, "int4 G=%d M=%d N=%lld K=%lld split %s: bf16 scales differ from "
                         "f32 ones at %lld (%.9g vs %.9g)", cs[i].group, cs[i].M, (long long)cs[i].N,
                         (long long)cs[i].K, splits[v] ? splits[v] : "auto", (long long)bad,
                         bad >= 0 ? out[1][bad] : 0.0, bad >= 0 ? out[0][bad] : 0.0);
            free(out[0]), free(out[1]);
            if (splits[v]) unsetenv("LOOM_CUDA_GEMV_KSPLIT");
        }
    g_keep = 0, g_s16 = 1;
}

/* The GPU passes fuse quantized linears (every form, accumulate, any rows of f32 x),
 * and the workspace is asked for only past the GEMV's 8 rows. */
static void test_supported_rule(void) {
    static const lm_dtype q[3] = {LM_I8, LM_F8_E4M3, LM_U8};
    for (int i = 0; i < 3; i++) {
        LT_CHECK(lm_linear_supported(ct_gpu, LM_LINEAR_IN, 0, 1, 256, LM_F32, q[i]));
        LT_CHECK(lm_linear_supported(ct_gpu, LM_LINEAR_IN_SWIGLU, 1, 512, 256, LM_F32, q[i]));
        LT_CHECK(!lm_linear_supported(ct_gpu, LM_LINEAR_IN, 0, 512, 256, LM_BF16, q[i]));
        LT_CHECK(lm_linear_workspace_bytes(ct_gpu, 8, 64, 256, q[i]) == 0);
        LT_CHECK(lm_linear_workspace_bytes(ct_gpu, 9, 64, 256, q[i]) == 4608 + 64 * 256 * 2); /* 9 x 256 bf16 */
        LT_CHECK(lm_linear_workspace_bytes(ct_gpu, 9, 64, 200, q[i]) == 3840 + 64 * 200 * 2);  /* 3,600 -> 3,840 */
        LT_CHECK(lm_linear_workspace_bytes(lm_device_cpu(), 64, 64, 256, q[i]) == 0);
    }
    LT_CHECK(lm_linear_workspace_bytes(ct_gpu, 64, 64, 256, LM_BF16) == 0);
}

/* ---- the model ---- */
#define MODELS LOOM_SOURCE_DIR "/tests/data/models/"
#define T 24

static lm_model *load(const char *dir, lm_device d, lm_weights w) {
    lm_model_load_options o;
    lm_model_load_options_default(&o);
    o.weights = w;
    lm_model *m = NULL;
    LT_CHECK_OK(lm_model_load_opts(dir, d, &o, &m));
    return m;
}

static void compare_model(const char *dir, lm_weights w) {
    lm_ctx *cpu = NULL;
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &cpu));
    lm_model *h = load(dir, lm_device_cpu(), w), *g = load(dir, ct_gpu, w);
    if (!h || !g) {
        lm_model_destroy(h), lm_model_destroy(g), lm_ctx_destroy(cpu);
        return;
    }
    LT_CHECK(lm_model_weights(g) == w);
    int64_t V = lm_model_get_config(h)->vocab_size;
    int32_t ids[T];
    lt_rng r = lt_rng_seed(7);
    for (int t = 0; t < T; t++) ids[t] = (int32_t)lt_rng_int(&r, 0, V - 1);
    float *want = ct_model_logits(h, cpu, ids, T, 0);
    for (int decode = 0; decode < 2; decode++) {
        float *got = ct_model_logits(g, g_ctx, ids, T, decode);
        ct_logits_cmp c = ct_logits_compare(got, want, T, V);
        double nmse = c.nmse, md = c.max_abs;
        int agree = c.top1, finite = c.finite;
        printf("  %s %s %s cuda vs cpu: nmse %.2e max|d| %.3g top-1 %d/%d\n", dir + strlen(MODELS),
               lm_weights_name(w), decode ? "decode" : "prefill", nmse, md, agree, T);
        LT_CHECK_MSG(finite && nmse <= 1e-3, "%s %s: nmse %.3g", dir, lm_weights_name(w), nmse);
        LT_CHECK_MSG(agree >= T - 2, "%s %s: top-1 %d/%d", dir, lm_weights_name(w), agree, T);
        free(got);
    }
    free(want);
    lm_model_destroy(h), lm_model_destroy(g), lm_ctx_destroy(cpu);
}

static void test_model_logits_cuda_vs_cpu(void) {
    static const lm_weights ws[3] = {LM_WEIGHTS_INT8, LM_WEIGHTS_INT4, LM_WEIGHTS_FP8};
    for (int i = 0; i < 3; i++) {
        compare_model(MODELS "llama_gqa2_f32", ws[i]);
        compare_model(MODELS "qwen2_bias_sharded", ws[i]);
    }
}

/* A tied model quantized at load on CUDA (qwen2_bias_sharded, int8) keeps the table's
 * int8 copy as its head where the product is the GEMV: one-token decode steps stay within
 * the model gate of the CPU's logits (which use the copy too) and differ from those of the
 * same model with the float table as its head (quant_modules without lm_head); a 24-token
 * prefill (past the GEMV's rows) takes the table, so both models give the same bits
 * there; the bytes a token reads drop by the table less its copy. */
static void test_tied_head_copy_on_cuda(void) {
    const char *dir = MODELS "qwen2_bias_sharded";
    lm_model_load_options o;
    lm_model_load_options_default(&o);
    o.weights = LM_WEIGHTS_INT8;
    lm_model *g = NULL, *gt = NULL, *h = load(dir, lm_device_cpu(), LM_WEIGHTS_INT8);
    LT_CHECK_OK(lm_model_load_opts(dir, ct_gpu, &o, &g));
    o.quant_modules = lm_quant_modules_default(NULL) & ~LM_QUANT_LM_HEAD;
    LT_CHECK_OK(lm_model_load_opts(dir, ct_gpu, &o, &gt));
    lm_ctx *cpu = NULL;
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &cpu));
    if (!g || !gt || !h || !cpu) {
        lm_model_destroy(g), lm_model_destroy(gt), lm_model_destroy(h), lm_ctx_destroy(cpu);
        return;
    }
    const lm_model_config *c = lm_model_get_config(g);
    LT_CHECK(c->tie_word_embeddings && (c->quant_modules & LM_QUANT_LM_HEAD));
    LT_CHECK(!(lm_model_get_config(gt)->quant_modules & LM_QUANT_LM_HEAD));
    int64_t V = c->vocab_size, H = c->hidden_size;
    LT_CHECK_MSG(lm_model_weight_bytes(gt) - lm_model_weight_bytes(g) == V * H * 2 - V * (H + 4),
                 "bytes per token %lld (int8 copy as the head) vs %lld (the bf16 table)",
                 (long long)lm_model_weight_bytes(g), (long long)lm_model_weight_bytes(gt));
    int32_t ids[T];
    lt_rng r = lt_rng_seed(11);
    for (int t = 0; t < T; t++) ids[t] = (int32_t)lt_rng_int(&r, 0, V - 1);
    float *want = ct_model_logits(h, cpu, ids, T, 1), *dec = ct_model_logits(g, g_ctx, ids, T, 1),
          *dect = ct_model_logits(gt, g_ctx, ids, T, 1), *pre = ct_model_logits(g, g_ctx, ids, T, 0),
          *pret = ct_model_logits(gt, g_ctx, ids, T, 0);
    ct_logits_cmp copy = ct_logits_compare(dec, want, T, V), tab = ct_logits_compare(dect, want, T, V),
                  two = ct_logits_compare(dec, dect, T, V);
    printf("  tied int8 head, decode vs the CPU's (int8 copy): copy nmse %.2e top-1 %d/%d, table nmse %.2e top-1 "
           "%d/%d; copy vs table max|d| %.3g\n", copy.nmse, copy.top1, T, tab.nmse, tab.top1, T, two.max_abs);
    LT_CHECK_MSG(copy.finite && copy.nmse <= 1e-3 && copy.top1 >= T - 2, "copy: nmse %.3g top-1 %d/%d", copy.nmse,
                 copy.top1, T);
    LT_CHECK_MSG(two.max_abs > 0, "decode: the copy model's logits are the table model's (the copy is not the head)");
    LT_CHECK_MSG(memcmp(pre, pret, sizeof(float) * (size_t)(T * V)) == 0, "a %d-token prefill: the copy model's "
                 "logits differ from the table model's (it should take the table past the GEMV's rows)", T);
    free(want), free(dec), free(dect), free(pre), free(pret);
    lm_model_destroy(g), lm_model_destroy(gt), lm_model_destroy(h), lm_ctx_destroy(cpu);
}

/* An fp8 model on CUDA reports its format. */
static void test_fp8_model_config(void) {
    lm_model *g = load(MODELS "llama_gqa2_f32", ct_gpu, LM_WEIGHTS_FP8);
    LT_CHECK(g != NULL && lm_model_get_config(g)->quant_format == LM_QUANT_FP8);
    lm_model_destroy(g);
}

int main(void) {
    g_ctx = ct_start();
    g_ref = ct_ref_ctx();
    LT_RUN(test_supported_rule);
    LT_RUN(test_formats_and_rows);
    LT_RUN(test_large_n);
    LT_RUN(test_workspace_chunks);
    LT_RUN(test_fused_inputs);
    LT_RUN(test_long_rows);
    LT_RUN(test_unstaged_rows);
    LT_RUN(test_forced_splits);
    LT_RUN(test_readable_layouts);
    LT_RUN(test_int4_bf16_scales_bitwise);
    LT_RUN(test_model_logits_cuda_vs_cpu);
    LT_RUN(test_fp8_model_config);
    LT_RUN(test_tied_head_copy_on_cuda);
    lm_ctx_destroy(g_ref);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
