/* CUDA elementwise kernels against the CPU reference operators, per float dtype:
 * add and mul with a broadcast operand and a permuted (non-row-major) operand into a
 * strided poisoned output; scale (by a host or a device factor), silu and swiglu on
 * permuted inputs; casts between every float pair, int -> float, int -> int with the
 * range check (the first value that does not fit is reported and nothing is written);
 * and the forward pass's swiglu_packed_to_bf16 (f32 or bf16 [gate | up] rows -> bf16) against
 * reference swiglu + cast. Contiguous aligned bf16 and f32 operands (and a broadcast
 * bias row) take the 16-byte vector path, contiguous float casts the vector cast.
 * The autograd's widened accumulation (f32 += bf16/f16/f32) on both paths, exact.
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"
#include "ops/internal.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

static lm_ctx *g_ctx, *g_ref;

typedef lm_status (*binary_fn)(const lm_tensor_view *, const lm_tensor_view *, const lm_tensor_view *, cudaStream_t);
typedef lm_status (*binary_ref)(lm_ctx *, const lm_tensor_view *, const lm_tensor_view *, const lm_tensor_view *);

static void check_binary(const char *name, binary_fn gpu, binary_ref ref, lm_dtype dt) {
    lt_rng r = lt_rng_seed(11);
    int64_t shape[3] = {3, 37, 29}, bshape[2] = {37, 1};
    lm_tensor_view ah, ad, bh, bd, oh, od, eb;
    ct_pair a = ct_random_reversed(&r, dt, 3, shape, 1.0, &ah, &ad);
    ct_pair b = ct_random(&r, dt, 2, bshape, 1.0);
    bh = *lm_tensor_as_view(b.h);
    bd = *lm_tensor_as_view(b.d);
    ct_pair o = ct_poisoned_strided(dt, 3, shape, &oh, &od);
    lm_tensor *want = lt_poisoned_tensor(dt, 3, shape);
    LT_CHECK_OK(ref(g_ref, &ah, &bh, lm_tensor_as_view(want)));
    LT_CHECK_OK(lm_tensor_view_expand(&bd, 3, shape, &eb));
    LT_CHECK_OK(gpu(&ad, &eb, &od, ct_stream(g_ctx)));
    char what[64];
    snprintf(what, sizeof what, "%s %s", name, lm_dtype_name(dt));
    ct_check(g_ctx, what, &o, &od, lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 16.0));
    ct_pair_free(&a), ct_pair_free(&b), ct_pair_free(&o);
    lm_tensor_destroy(want);
}

/* Contiguous, aligned bf16 (f32) operands: the vector path (8 (4) elements a step), in
 * place too. */
static void check_vector_path(lm_dtype dt) {
    lt_rng r = lt_rng_seed(13 + (uint64_t)dt);
    int64_t shape[2] = {24, 96};
    ct_pair a = ct_random(&r, dt, 2, shape, 2.0), b = ct_random(&r, dt, 2, shape, 1.0);
    static const char *const names[3] = {"add", "mul", "swiglu"};
    binary_fn gpu[3] = {lm__cuda_add, lm__cuda_mul, lm__cuda_swiglu};
    binary_ref ref[3] = {lm_add_out, lm_mul_out, lm_swiglu_out};
    char what[80];
    for (int i = 0; i < 3; i++) {
        ct_pair o = ct_poisoned(dt, 2, shape);
        lm_tensor *want = lt_poisoned_tensor(dt, 2, shape);
        LT_CHECK_OK(ref[i](g_ref, lm_tensor_as_view(a.h), lm_tensor_as_view(b.h), lm_tensor_as_view(want)));
        LT_CHECK_OK(gpu[i](lm_tensor_as_view(a.d), lm_tensor_as_view(b.d), lm_tensor_as_view(o.d), ct_stream(g_ctx)));
        snprintf(what, sizeof what, "%s %s contiguous (vector path)", names[i], lm_dtype_name(dt));
        ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 8.0));
        ct_pair_free(&o);
        lm_tensor_destroy(want);
    }
    /* a bias row broadcast over the rows */
    int64_t n = 96;
    ct_pair bias = ct_random(&r, dt, 1, &n, 1.0), o = ct_poisoned(dt, 2, shape);
    lm_tensor *wb = lt_poisoned_tensor(dt, 2, shape);
    lm_tensor_view eh, ed;
    LT_CHECK_OK(lm_tensor_view_expand(lm_tensor_as_view(bias.h), 2, shape, &eh));
    LT_CHECK_OK(lm_tensor_view_expand(lm_tensor_as_view(bias.d), 2, shape, &ed));
    LT_CHECK_OK(lm_add_out(g_ref, lm_tensor_as_view(a.h), &eh, lm_tensor_as_view(wb)));
    LT_CHECK_OK(lm__cuda_add(lm_tensor_as_view(a.d), &ed, lm_tensor_as_view(o.d), ct_stream(g_ctx)));
    snprintf(what, sizeof what, "add %s + broadcast bias row (vector path)", lm_dtype_name(dt));
    ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(wb),
             ct_nmse(dt), ct_abs(dt, 8.0));
    ct_pair_free(&bias), ct_pair_free(&o);
    lm_tensor_destroy(wb);
    lm_tensor *want = lt_poisoned_tensor(dt, 2, shape);
    LT_CHECK_OK(lm_add_out(g_ref, lm_tensor_as_view(a.h), lm_tensor_as_view(b.h), lm_tensor_as_view(want)));
    LT_CHECK_OK(lm__cuda_add(lm_tensor_as_view(a.d), lm_tensor_as_view(b.d), lm_tensor_as_view(a.d), ct_stream(g_ctx)));
    snprintf(what, sizeof what, "add %s in place (vector path)", lm_dtype_name(dt));
    ct_check(g_ctx, what, &a, lm_tensor_as_view(a.d), lm_tensor_as_view(want),
             ct_nmse(dt), ct_abs(dt, 8.0));
    lm_tensor_destroy(want);
    ct_pair_free(&a), ct_pair_free(&b);
}

static void test_add_mul_broadcast_strided(void) {
    for (int k = 0; k < 3; k++) {
        check_binary("add", lm__cuda_add, lm_add_out, ct_floats[k]);
        check_binary("mul", lm__cuda_mul, lm_mul_out, ct_floats[k]);
    }
}

static void test_scale_silu_swiglu(void) {
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k];
        lt_rng r = lt_rng_seed(12 + (uint64_t)k);
        int64_t shape[2] = {33, 70};
        lm_tensor_view xh, xd, uh, ud, oh, od;
        ct_pair x = ct_random_reversed(&r, dt, 2, shape, 3.0, &xh, &xd);
        ct_pair u = ct_random_reversed(&r, dt, 2, shape, 1.0, &uh, &ud);
        ct_pair o = ct_poisoned_strided(dt, 2, shape, &oh, &od);
        lm_tensor *want = lt_poisoned_tensor(dt, 2, shape);
        char what[64];
        LT_CHECK_OK(lm_scale_out(g_ref, &xh, -0.37f, lm_tensor_as_view(want)));
        LT_CHECK_OK(lm__cuda_scale(&xd, -0.37f, &od, ct_stream(g_ctx)));
        snprintf(what, sizeof what, "scale %s", lm_dtype_name(dt));
        ct_check(g_ctx, what, &o, &od, lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 4.0));
        /* the factor from a device scalar (lm_scale_by_out): the same single rounding */
        lm_tensor *sh = NULL;
        LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 0, NULL, &sh));
        *(float *)lm_tensor_data(sh) = -0.37f;
        ct_pair sc = ct_pair_of(sh);
        LT_CHECK_OK(lm_scale_by_out(g_ctx, &xd, lm_tensor_as_view(sc.d), &od));
        snprintf(what, sizeof what, "scale_by %s", lm_dtype_name(dt));
        ct_check(g_ctx, what, &o, &od, lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 4.0));
        if (dt != LM_F16) { /* contiguous bf16 or f32: the vector kernel */
            int64_t cs[2] = {16, 72};
            ct_pair c = ct_random(&r, dt, 2, cs, 3.0), co = ct_poisoned(dt, 2, cs);
            lm_tensor *cw = lt_poisoned_tensor(dt, 2, cs);
            LT_CHECK_OK(lm_scale_out(g_ref, lm_tensor_as_view(c.h), -0.37f, lm_tensor_as_view(cw)));
            LT_CHECK_OK(lm_scale_by_out(g_ctx, lm_tensor_as_view(c.d), lm_tensor_as_view(sc.d), lm_tensor_as_view(co.d)));
            snprintf(what, sizeof what, "scale_by %s (vector path)", lm_dtype_name(dt));
            ct_check(g_ctx, what, &co, lm_tensor_as_view(co.d), lm_tensor_as_view(cw), 0.0, 0.0);
            ct_pair_free(&c), ct_pair_free(&co);
            lm_tensor_destroy(cw);
        }
        ct_pair_free(&sc);
        LT_CHECK_OK(lm_silu_out(g_ref, &xh, lm_tensor_as_view(want)));
        LT_CHECK_OK(lm__cuda_silu(&xd, &od, ct_stream(g_ctx)));
        snprintf(what, sizeof what, "silu %s", lm_dtype_name(dt));
        ct_check(g_ctx, what, &o, &od, lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 10.0));
        LT_CHECK_OK(lm_swiglu_out(g_ref, &xh, &uh, lm_tensor_as_view(want)));
        LT_CHECK_OK(lm__cuda_swiglu(&xd, &ud, &od, ct_stream(g_ctx)));
        snprintf(what, sizeof what, "swiglu %s", lm_dtype_name(dt));
        ct_check(g_ctx, what, &o, &od, lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 30.0));
        ct_pair_free(&x), ct_pair_free(&u), ct_pair_free(&o);
        lm_tensor_destroy(want);
    }
}

static void test_contiguous_vector_path(void) {
    check_vector_path(LM_BF16);
    check_vector_path(LM_F32);
}

static void check_cast(lm_dtype from, lm_dtype to) {
    lt_rng r = lt_rng_seed(13);
    int64_t shape[2] = {17, 23};
    lm_tensor *h = NULL;
    if (lm_dtype_is_float(from)) h = lt_random_tensor(&r, from, 2, shape, 100.0);
    else {
        LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), from, 2, shape, &h));
        for (int64_t i = 0; i < 17 * 23; i++) {
            int64_t v = (int64_t)lt_rng_int(&r, 0, 250);
            if (from == LM_I32) ((int32_t *)lm_tensor_data(h))[i] = (int32_t)v;
            else if (from == LM_I64) ((int64_t *)lm_tensor_data(h))[i] = v;
            else ((uint8_t *)lm_tensor_data(h))[i] = (uint8_t)v;
        }
    }
    ct_pair x = ct_pair_of(h);
    lm_tensor_view xh, xd;
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(x.h), 0, 1, &xh));
    xd = ct_mirror(x.h, &xh, x.d);
    int64_t tshape[2] = {23, 17};
    ct_pair o = ct_poisoned(to, 2, tshape);
    lm_tensor *want = lt_poisoned_tensor(to, 2, tshape);
    LT_CHECK_OK(lm_cast_out(g_ref, &xh, lm_tensor_as_view(want)));
    LT_CHECK_OK(lm__cuda_cast(&xd, lm_tensor_as_view(o.d), ct_stream(g_ctx)));
    char what[64];
    snprintf(what, sizeof what, "cast %s -> %s", lm_dtype_name(from), lm_dtype_name(to));
    ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), 0.0, 0.0); /* exact */
    ct_pair_free(&x), ct_pair_free(&o);
    lm_tensor_destroy(want);
}

/* Contiguous aligned float views, numel a multiple of 8: the vector cast (exact too). */
static void test_cast_contiguous_vector_path(void) {
    int64_t shape[2] = {17, 24};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            lt_rng r = lt_rng_seed(17 + (uint64_t)(3 * i + j));
            ct_pair x = ct_random(&r, ct_floats[i], 2, shape, 100.0), o = ct_poisoned(ct_floats[j], 2, shape);
            lm_tensor *want = lt_poisoned_tensor(ct_floats[j], 2, shape);
            LT_CHECK_OK(lm_cast_out(g_ref, lm_tensor_as_view(x.h), lm_tensor_as_view(want)));
            LT_CHECK_OK(lm__cuda_cast(lm_tensor_as_view(x.d), lm_tensor_as_view(o.d), ct_stream(g_ctx)));
            char what[64];
            snprintf(what, sizeof what, "cast %s -> %s contiguous", lm_dtype_name(ct_floats[i]),
                     lm_dtype_name(ct_floats[j]));
            ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), 0.0, 0.0);
            ct_pair_free(&x), ct_pair_free(&o);
            lm_tensor_destroy(want);
        }
}

static void test_cast_every_pair(void) {
    const lm_dtype all[] = {LM_F32, LM_BF16, LM_F16};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) check_cast(all[i], all[j]);
    check_cast(LM_I32, LM_F32);
    check_cast(LM_I64, LM_BF16);
    check_cast(LM_U8, LM_F16);
    check_cast(LM_I64, LM_I32);
    check_cast(LM_I32, LM_U8);
    check_cast(LM_U8, LM_I64);
}

static void test_cast_int_range_is_checked_first(void) {
    int64_t n = 1000;
    lm_tensor *h = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_I64, 1, &n, &h));
    int64_t *v = lm_tensor_data(h);
    for (int64_t i = 0; i < n; i++) v[i] = i % 200;
    v[700] = 300, v[900] = -5; /* 700 is the first that does not fit in u8 */
    ct_pair x = ct_pair_of(h);
    ct_pair o = ct_poisoned(LM_U8, 1, &n);
    LT_CHECK_STATUS(lm__cuda_cast(lm_tensor_as_view(x.d), lm_tensor_as_view(o.d), ct_stream(g_ctx)), LM_OUT_OF_RANGE);
    LT_CHECK_MSG(strstr(lm_last_error(), "300") != NULL, "message: %s", lm_last_error());
    double *got = ct_read(g_ctx, &o, lm_tensor_as_view(o.d));
    LT_CHECK(got[0] == 0xA5 && got[999] == 0xA5); /* untouched */
    free(got);
    ct_pair_free(&x), ct_pair_free(&o);
}

/* f32 gate|up: I a multiple of 4 (the 4-wide kernel) and not (one output per thread
 * step); bf16 gate|up: I a multiple of 8 (the 8-wide kernel), of 4 only, and neither.
 * The reference runs on the rows widened to f32 (exact for bf16). */
static void test_swiglu_packed_matches_reference(void) {
    const int64_t cases[4][2] = {{7, 200}, {7, 199}, {37, 4864}, {5, 196}};
    for (int bf = 0; bf < 2; bf++)
        for (int k = 0; k < 4; k++) {
            lt_rng r = lt_rng_seed(14 + (uint64_t)k + 10 * (uint64_t)bf);
            int64_t rows = cases[k][0], I = cases[k][1], shape[2] = {rows, 2 * I}, oshape[2] = {rows, I};
            ct_pair gu = ct_random(&r, bf ? LM_BF16 : LM_F32, 2, shape, 2.0);
            lm_tensor *wide = lt_poisoned_tensor(LM_F32, 2, shape);
            LT_CHECK_OK(lm_cast_out(g_ref, lm_tensor_as_view(gu.h), lm_tensor_as_view(wide)));
            lm_tensor_view g, u;
            LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(wide), 1, 0, I, 1, &g));
            LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(wide), 1, I, 2 * I, 1, &u));
            lm_tensor *act32 = lt_poisoned_tensor(LM_F32, 2, oshape), *want = lt_poisoned_tensor(LM_BF16, 2, oshape);
            LT_CHECK_OK(lm_swiglu_out(g_ref, &g, &u, lm_tensor_as_view(act32)));
            LT_CHECK_OK(lm_cast_out(g_ref, lm_tensor_as_view(act32), lm_tensor_as_view(want)));
            ct_pair o = ct_poisoned(LM_BF16, 2, oshape);
            LT_CHECK_OK(lm__cuda_swiglu_packed_to_bf16(lm_tensor_data(gu.d), bf, rows, I, lm_tensor_data(o.d),
                                                       ct_stream(g_ctx)));
            char what[80];
            snprintf(what, sizeof what, "swiglu_packed_to_bf16 %s %lld x %lld", bf ? "bf16" : "f32", (long long)rows,
                     (long long)I);
            ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(LM_BF16),
                     ct_abs(LM_BF16, 20.0));
            ct_pair_free(&gu), ct_pair_free(&o);
            lm_tensor_destroy(wide), lm_tensor_destroy(act32), lm_tensor_destroy(want);
        }
}

/* acc (f32) += x widened, in place, against the CPU operator (cast + f32 add): exact.
 * The vector path (contiguous, aligned, numel a multiple of 8), the readable one (acc a
 * transposed view, x reversed, numel 91) and the dispatching operator on the CUDA
 * context; a wrong dtype or shape is refused and acc left as it was. */
static void check_accumulate(lm_dtype xt, int strided) {
    lt_rng r = lt_rng_seed(19 + (uint64_t)xt + 7 * (uint64_t)strided);
    int64_t shape[2] = {17, 24}, sshape[2] = {13, 7};
    const int64_t *sh = strided ? sshape : shape;
    lm_tensor_view ah, ad, xh, xd;
    int64_t tshape[2] = {sh[1], sh[0]}; /* strided: acc is the transpose of a [7, 13] tensor */
    ct_pair acc = ct_random(&r, LM_F32, 2, strided ? tshape : sh, 3.0), x;
    if (strided) {
        LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(acc.h), 0, 1, &ah));
        ad = ct_mirror(acc.h, &ah, acc.d);
        x = ct_random_reversed(&r, xt, 2, sh, 2.0, &xh, &xd);
    } else {
        ah = *lm_tensor_as_view(acc.h), ad = *lm_tensor_as_view(acc.d);
        x = ct_random(&r, xt, 2, sh, 2.0);
        xh = *lm_tensor_as_view(x.h), xd = *lm_tensor_as_view(x.d);
    }
    lm_tensor *want = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 2, sh, &want));
    LT_CHECK_OK(lm_tensor_view_copy(g_ref, lm_tensor_as_view(want), &ah));
    LT_CHECK_OK(lm__accumulate_out(g_ref, lm_tensor_as_view(want), &xh));
    char what[80];
    snprintf(what, sizeof what, "add widened f32 += %s%s", lm_dtype_name(xt), strided ? " (strided)" : " (vector path)");
    LT_CHECK_OK(lm__cuda_accumulate(&ad, &xd, ct_stream(g_ctx)));
    ct_check(g_ctx, what, &acc, &ad, lm_tensor_as_view(want), 0.0, 0.0);
    /* the dispatching operator on the CUDA context, twice more: acc = want + 2 x */
    LT_CHECK_OK(lm__accumulate_out(g_ctx, &ad, &xd));
    LT_CHECK_OK(lm__accumulate_out(g_ref, lm_tensor_as_view(want), &xh));
    snprintf(what, sizeof what, "lm__accumulate_out f32 += %s%s", lm_dtype_name(xt), strided ? " (strided)" : "");
    ct_check(g_ctx, what, &acc, &ad, lm_tensor_as_view(want), 0.0, 0.0);
    ct_pair_free(&acc), ct_pair_free(&x);
    lm_tensor_destroy(want);
}

static void test_add_widened(void) {
    for (int i = 0; i < 3; i++)
        for (int strided = 0; strided < 2; strided++) check_accumulate(ct_floats[i], strided);
}

/* A bf16 acc through the dispatcher: x (f32) rounded to bf16, then the bf16 add, as the
 * CPU reference does (bf16 gates: the two adds may round a sum differently). */
static void test_add_widened_into_bf16(void) {
    lt_rng r = lt_rng_seed(29);
    int64_t shape[2] = {9, 40};
    ct_pair acc = ct_random(&r, LM_BF16, 2, shape, 2.0), x = ct_random(&r, LM_F32, 2, shape, 1.0);
    LT_CHECK_OK(lm__accumulate_out(g_ref, lm_tensor_as_view(acc.h), lm_tensor_as_view(x.h)));
    LT_CHECK_OK(lm__accumulate_out(g_ctx, lm_tensor_as_view(acc.d), lm_tensor_as_view(x.d)));
    ct_check(g_ctx, "lm__accumulate_out bf16 += f32", &acc, lm_tensor_as_view(acc.d), lm_tensor_as_view(acc.h),
             ct_nmse(LM_BF16), ct_abs(LM_BF16, 3.0));
    ct_pair_free(&acc), ct_pair_free(&x);
}

static void test_add_widened_refuses_bad_operands(void) {
    lt_rng r = lt_rng_seed(23);
    int64_t shape[2] = {4, 8}, other[2] = {8, 4};
    ct_pair acc = ct_random(&r, LM_F32, 2, shape, 1.0);
    ct_pair x = ct_random(&r, LM_BF16, 2, shape, 1.0), xo = ct_random(&r, LM_BF16, 2, other, 1.0);
    lm_tensor *i32 = NULL;
    LT_CHECK_OK(lm_tensor_zeros(ct_gpu, LM_I32, 2, shape, &i32));
    LT_CHECK_STATUS(lm__accumulate_out(g_ctx, lm_tensor_as_view(i32), lm_tensor_as_view(x.d)), LM_UNSUPPORTED);
    lm_tensor_destroy(i32);
    LT_CHECK_STATUS(lm__accumulate_out(g_ctx, lm_tensor_as_view(acc.d), lm_tensor_as_view(xo.d)), LM_SHAPE_MISMATCH);
    LT_CHECK_MSG(strstr(lm_last_error(), "accumulate") != NULL, "message: %s", lm_last_error());
    ct_check(g_ctx, "refused add widened leaves acc", &acc, lm_tensor_as_view(acc.d), lm_tensor_as_view(acc.h), 0.0, 0.0);
    ct_pair_free(&acc), ct_pair_free(&x), ct_pair_free(&xo);
}

int main(void) {
    g_ctx = ct_start();
    g_ref = ct_ref_ctx();
    LT_RUN(test_add_mul_broadcast_strided);
    LT_RUN(test_contiguous_vector_path);
    LT_RUN(test_scale_silu_swiglu);
    LT_RUN(test_cast_every_pair);
    LT_RUN(test_cast_contiguous_vector_path);
    LT_RUN(test_cast_int_range_is_checked_first);
    LT_RUN(test_swiglu_packed_matches_reference);
    LT_RUN(test_add_widened);
    LT_RUN(test_add_widened_into_bf16);
    LT_RUN(test_add_widened_refuses_bad_operands);
    lm_ctx_destroy(g_ref);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
