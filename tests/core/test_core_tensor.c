/* Tests for Storage and Tensor (DESIGN.md §2, one invariant at a time): storage
 * reference counting (views share it and keep it alive; wrapped memory is released
 * exactly once), scalars, zero-sized dims, rejection of negative dims/strides,
 * offsets/strides in elements, views that must lie inside their storage (ends, empty
 * views, overflowing strides), zero-copy derived tensors, contiguous(), copies
 * between strided views, to_device, CUDA requests in a CPU-only build, poisoning
 * strided views, device names, and no leak on any failed allocation.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;

/* A contiguous f32 tensor whose element i holds i. */
static lm_tensor *iota(int ndim, const int64_t *shape) {
    lm_tensor *t = NULL;
    if (lm_tensor_create(lm_device_cpu(), LM_F32, ndim, shape, &t) != LM_OK) return NULL;
    float *p = lm_tensor_data(t);
    for (int64_t i = 0; i < lm_tensor_numel(t); i++) p[i] = (float)i;
    return t;
}

static float at2(const lm_tensor *t, int64_t i, int64_t j) {
    const lm_tensor_view *v = lm_tensor_as_view(t);
    return ((const float *)v->data)[i * v->stride[0] + j * v->stride[1]];
}

/* ---- storage ------------------------------------------------------------------------ */
static void test_views_share_storage_and_keep_it_alive(void) {
    int64_t s[2] = {4, 6};
    lm_tensor *t = iota(2, s), *tt = NULL, *sl = NULL;
    lm_storage *st = lm_tensor_storage(t);
    LT_CHECK(lm_storage_refcount(st) == 1);
    LT_CHECK_OK(lm_tensor_transpose(t, 0, 1, &tt));
    LT_CHECK_OK(lm_tensor_slice(t, 1, 2, 6, 2, &sl));
    LT_CHECK(lm_tensor_storage(tt) == st && lm_tensor_storage(sl) == st && lm_storage_refcount(st) == 3);
    lm_tensor_destroy(t); /* the views still own references */
    LT_CHECK(lm_storage_refcount(st) == 2);
    LT_CHECK(at2(tt, 5, 3) == 3 * 6 + 5); /* reads freed memory if the storage died */
    LT_CHECK(at2(sl, 2, 1) == 2 * 6 + 4);
    lm_tensor_destroy(tt);
    LT_CHECK(lm_storage_refcount(st) == 1 && at2(sl, 3, 0) == 20);
    lm_tensor_destroy(sl);
    LT_CHECK(lm_storage_retain(NULL) == NULL);
    lm_storage_release(NULL);
    lm_tensor_destroy(NULL);
}

typedef struct release_probe {
    int calls;
    void *data;
} release_probe;

static void on_release(void *user, void *data) {
    release_probe *p = user;
    p->calls++;
    p->data = data;
}

static void test_wrap_releases_exactly_once(void) {
    float buf[12];
    release_probe probe = {0, NULL};
    lm_storage *s = NULL;
    LT_CHECK_OK(lm_storage_wrap(lm_device_cpu(), buf, sizeof buf, on_release, &probe, &s));
    LT_CHECK(lm_storage_data(s) == buf && lm_storage_nbytes(s) == sizeof buf);
    LT_CHECK(lm_device_equal(lm_storage_device(s), lm_device_cpu()));
    int64_t s34[2] = {3, 4}, s6[1] = {6};
    lm_tensor *a = NULL, *b = NULL;
    LT_CHECK_OK(lm_tensor_from_storage(s, LM_F32, 2, s34, NULL, 0, &a));
    LT_CHECK_OK(lm_tensor_from_storage(s, LM_F32, 1, s6, NULL, 6, &b));
    LT_CHECK(lm_storage_refcount(s) == 3 && lm_tensor_data(b) == buf + 6);
    lm_storage_retain(s);
    lm_storage_release(s);
    lm_storage_release(s); /* the creator's reference */
    lm_tensor_destroy(a);
    LT_CHECK(probe.calls == 0);
    lm_tensor_destroy(b);
    LT_CHECK(probe.calls == 1 && probe.data == buf);
    /* no release function: memory outlives the storage */
    LT_CHECK_OK(lm_storage_wrap(lm_device_cpu(), buf, sizeof buf, NULL, NULL, &s));
    lm_storage_release(s);
    LT_CHECK_STATUS(lm_storage_wrap(lm_device_cpu(), NULL, 8, on_release, &probe, &s), LM_INVALID_ARGUMENT);
    LT_CHECK(s == NULL && probe.calls == 1);
    /* an empty external buffer may be NULL, and an empty tensor over it has NULL data */
    int64_t s0[2] = {0, 5};
    LT_CHECK_OK(lm_storage_wrap(lm_device_cpu(), NULL, 0, NULL, NULL, &s));
    LT_CHECK_OK(lm_tensor_from_storage(s, LM_F32, 2, s0, NULL, 0, &a));
    LT_CHECK(a && lm_tensor_data(a) == NULL && lm_tensor_numel(a) == 0);
    lm_tensor_destroy(a);
    lm_storage_release(s);
}

/* ---- shapes ---------------------------------------------------------------------------- */
static void test_scalar_has_one_element(void) {
    lm_tensor *t = NULL, *r = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 0, NULL, &t));
    LT_CHECK(t && lm_tensor_ndim(t) == 0 && lm_tensor_numel(t) == 1);
    LT_CHECK(lm_storage_nbytes(lm_tensor_storage(t)) == 4 && lm_tensor_dim(t, 0) == -1);
    float x = 2.5f, y = 0;
    LT_CHECK_OK(lm_tensor_view_write(g_ctx, lm_tensor_as_view(t), &x));
    LT_CHECK_OK(lm_tensor_view_read(g_ctx, lm_tensor_as_view(t), &y));
    LT_CHECK(y == 2.5f);
    int64_t ones[3] = {1, 1, 1};
    LT_CHECK_OK(lm_tensor_reshape(t, 3, ones, &r));
    LT_CHECK(r && lm_tensor_numel(r) == 1 && lm_tensor_data(r) == lm_tensor_data(t));
    lm_tensor_destroy(r);
    LT_CHECK_OK(lm_tensor_contiguous(g_ctx, t, &r));
    LT_CHECK(r && lm_tensor_data(r) == lm_tensor_data(t));
    lm_tensor_destroy(r);
    lm_tensor_destroy(t);
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 0, NULL, &(int64_t){-7}, &t));
    LT_CHECK(t && *(int64_t *)lm_tensor_data(t) == -7);
    lm_tensor_destroy(t);
}

static void test_zero_sized_dims_are_valid(void) {
    int64_t s[3] = {3, 0, 5}, back[2] = {5, 0}, f[2] = {0, 5};
    lm_tensor *t = NULL, *v = NULL, *c = NULL, *d = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_BF16, 3, s, &t));
    LT_CHECK(t && lm_tensor_numel(t) == 0 && lm_tensor_view_extent(lm_tensor_as_view(t)) == 0);
    LT_CHECK(lm_tensor_as_view(t)->stride[0] == 5 && lm_tensor_as_view(t)->stride[1] == 5);
    lm_tensor_destroy(t);
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 3, s, &t));
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_F32, 3, s, NULL, &v)); /* no bytes to copy */
    lm_tensor_destroy(v);
    LT_CHECK_OK(lm_tensor_transpose(t, 0, 2, &v));
    LT_CHECK_OK(lm_tensor_contiguous(g_ctx, v, &c));
    LT_CHECK(c && lm_tensor_numel(c) == 0 && lm_tensor_dim(c, 0) == 5);
    LT_CHECK_OK(lm_tensor_to_device(g_ctx, v, lm_device_cpu(), &d));
    LT_CHECK(d && lm_tensor_numel(d) == 0);
    LT_CHECK_OK(lm_tensor_view_copy(g_ctx, lm_tensor_as_view(c), lm_tensor_as_view(v)));
    LT_CHECK_OK(lm_tensor_view_poison(g_ctx, lm_tensor_as_view(v)));
    lm_tensor_destroy(v), lm_tensor_destroy(c), lm_tensor_destroy(d);
    LT_CHECK_OK(lm_tensor_merge_axes(t, 1, 2, &v));
    LT_CHECK(v && lm_tensor_ndim(v) == 2 && lm_tensor_dim(v, 1) == 0);
    lm_tensor_destroy(v);
    LT_CHECK_OK(lm_tensor_slice(t, 0, 1, 1, 1, &v));
    LT_CHECK(v && lm_tensor_dim(v, 0) == 0);
    lm_tensor_destroy(v);
    LT_CHECK_OK(lm_tensor_reshape(t, 2, back, &v));
    lm_tensor_destroy(v);
    int64_t infer[2] = {0, -1};
    LT_CHECK_STATUS(lm_tensor_reshape(t, 2, infer, &v), LM_SHAPE_MISMATCH); /* -1 is ambiguous */
    LT_CHECK_OK(lm_tensor_split_axis(t, 1, 2, f, &v));
    LT_CHECK(v && lm_tensor_ndim(v) == 4);
    lm_tensor_destroy(v);
    lm_tensor_destroy(t);
}

static void test_negative_dims_and_strides_rejected(void) {
    int64_t neg[2] = {2, -1}, ok[2] = {2, 3}, neg_st[2] = {3, -1}, huge[2] = {INT64_C(1) << 31, INT64_C(1) << 31};
    lm_tensor *t = (lm_tensor *)&t;
    LT_CHECK_STATUS(lm_tensor_create(lm_device_cpu(), LM_F32, 2, neg, &t), LM_INVALID_ARGUMENT);
    LT_CHECK(t == NULL);
    LT_CHECK_STATUS(lm_tensor_zeros(lm_device_cpu(), LM_F32, 2, neg, &t), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_create(lm_device_cpu(), LM_F32, 9, ok, &t), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_create(lm_device_cpu(), (lm_dtype)17, 2, ok, &t), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_create(lm_device_cpu(), LM_F32, 2, ok, NULL), LM_INVALID_ARGUMENT);
    /* 2^62 f32 elements: the byte count overflows size_t before anything is allocated */
    LT_CHECK_STATUS(lm_tensor_create(lm_device_cpu(), LM_F32, 2, huge, &t), LM_OUT_OF_MEMORY);
    LT_CHECK(t == NULL);
    lm_storage *s = NULL;
    LT_CHECK_OK(lm_storage_create(lm_device_cpu(), 64, &s));
    LT_CHECK_STATUS(lm_tensor_from_storage(s, LM_F32, 2, ok, neg_st, 0, &t), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_from_storage(s, LM_F32, 2, neg, NULL, 0, &t), LM_INVALID_ARGUMENT);
    LT_CHECK(t == NULL && lm_storage_refcount(s) == 1);
    lm_storage_release(s);
}

/* ---- views inside storage ------------------------------------------------------------------ */
static void test_offsets_and_strides_are_in_elements(void) {
    const lm_dtype dts[3] = {LM_F32, LM_I64, LM_U8};
    for (int k = 0; k < 3; k++) {
        size_t es = lm_dtype_size(dts[k]);
        lm_storage *s = NULL;
        LT_CHECK_OK(lm_storage_create(lm_device_cpu(), 25 * es, &s));
        char *base = lm_storage_data(s);
        int64_t sh[2] = {2, 3}, st[2] = {5, 2};
        lm_tensor *t = NULL, *sl = NULL;
        LT_CHECK_OK(lm_tensor_from_storage(s, dts[k], 2, sh, st, 3, &t));
        LT_CHECK(lm_tensor_data(t) == base + 3 * es && lm_tensor_offset(t) == 3);
        LT_CHECK(lm_tensor_dtype(t) == dts[k] && lm_tensor_dim(t, -1) == 3 && lm_tensor_dim(t, -2) == 2);
        LT_CHECK_OK(lm_tensor_slice(t, 1, 1, 3, 1, &sl)); /* starts 2 elements later */
        LT_CHECK(lm_tensor_offset(sl) == 5 && lm_tensor_data(sl) == base + 5 * es);
        lm_tensor_destroy(sl);
        LT_CHECK_OK(lm_tensor_slice(t, 0, 1, 2, 1, &sl)); /* 5 elements later */
        LT_CHECK(lm_tensor_offset(sl) == 8 && lm_tensor_data(sl) == base + 8 * es);
        lm_tensor_destroy(sl);
        lm_tensor_destroy(t);
        lm_storage_release(s);
    }
}

static void test_from_storage_rejects_views_outside(void) {
    lm_storage *s = NULL;
    LT_CHECK_OK(lm_storage_create(lm_device_cpu(), 24 * 4 + 3, &s)); /* 24 whole f32 elements */
    lm_tensor *t = NULL;
    int64_t s46[2] = {4, 6}, s24[1] = {24}, s25[1] = {25}, s0[1] = {0}, one[1] = {1}, two[1] = {2};
    int64_t st7[2] = {7, 1}, st6[2] = {6, 1}, st23[1] = {23}, st24[1] = {24};
    struct {
        int ndim;
        const int64_t *shape, *strides;
        int64_t offset;
        lm_status want;
    } cases[] = {
        {2, s46, NULL, 0, LM_OK},           {2, s46, NULL, 1, LM_OUT_OF_RANGE}, /* one past the end */
        {1, s24, NULL, 0, LM_OK},           {1, s25, NULL, 0, LM_OUT_OF_RANGE},
        {2, s46, st6, 0, LM_OK},            {2, s46, st7, 0, LM_OUT_OF_RANGE},
        {1, two, st23, 0, LM_OK},           {1, two, st24, 0, LM_OUT_OF_RANGE},
        {1, one, NULL, 23, LM_OK},          {1, one, NULL, 24, LM_OUT_OF_RANGE},
        {1, one, NULL, -1, LM_OUT_OF_RANGE}, {1, one, NULL, INT64_MAX, LM_OUT_OF_RANGE},
        {1, s0, NULL, 24, LM_OK}, /* an empty view may sit at the end */
        {1, s0, NULL, 25, LM_OUT_OF_RANGE},  {1, s0, NULL, INT64_MAX, LM_OUT_OF_RANGE},
        {0, NULL, NULL, 23, LM_OK},          {0, NULL, NULL, 24, LM_OUT_OF_RANGE},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        lm_status st = lm_tensor_from_storage(s, LM_F32, cases[i].ndim, cases[i].shape, cases[i].strides,
                                              cases[i].offset, &t);
        LT_CHECK_MSG(st == cases[i].want, "case %d: %s, expected %s (%s)", i, lm_status_name(st),
                     lm_status_name(cases[i].want), lm_last_error());
        LT_CHECK(st == LM_OK ? t != NULL : t == NULL);
        lm_tensor_destroy(t);
    }
    /* strides whose span overflows int64 must fail, not wrap around */
    int64_t s2[1] = {2}, s3[1] = {3}, s22[2] = {2, 2}, big1[1] = {INT64_MAX}, big2[1] = {INT64_MAX / 2 + 1};
    int64_t big3[2] = {INT64_C(1) << 62, INT64_C(1) << 62}, big4[1] = {INT64_MAX / 8};
    LT_CHECK_STATUS(lm_tensor_from_storage(s, LM_F32, 1, s2, big1, 0, &t), LM_OUT_OF_RANGE);
    LT_CHECK_STATUS(lm_tensor_from_storage(s, LM_F32, 1, s3, big2, 0, &t), LM_OUT_OF_RANGE);
    LT_CHECK_STATUS(lm_tensor_from_storage(s, LM_F32, 2, s22, big3, 0, &t), LM_OUT_OF_RANGE);
    LT_CHECK_STATUS(lm_tensor_from_storage(s, LM_F32, 1, s2, big4, 5, &t), LM_OUT_OF_RANGE);
    LT_CHECK(t == NULL && lm_storage_refcount(s) == 1);
    LT_CHECK_STATUS(lm_tensor_from_storage(NULL, LM_F32, 1, s2, NULL, 0, &t), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_from_storage(s, LM_F32, 1, s2, NULL, 0, NULL), LM_INVALID_ARGUMENT);

    /* lm_tensor_from_view: the view must start inside, on an element boundary */
    LT_CHECK_OK(lm_tensor_from_storage(s, LM_F32, 2, s46, NULL, 0, &t));
    lm_tensor_view v = *lm_tensor_as_view(t);
    lm_tensor *u = NULL;
    v.data = (char *)lm_tensor_data(t) + 2;
    LT_CHECK_STATUS(lm_tensor_from_view(t, &v, &u), LM_OUT_OF_RANGE);
    v.data = (float *)lm_tensor_data(t) - 1;
    LT_CHECK_STATUS(lm_tensor_from_view(t, &v, &u), LM_OUT_OF_RANGE);
    v.data = (float *)lm_tensor_data(t) + 1; /* [4,6] from element 1 runs one past the end */
    LT_CHECK_STATUS(lm_tensor_from_view(t, &v, &u), LM_OUT_OF_RANGE);
    v = *lm_tensor_as_view(t);
    v.dtype = LM_I32;
    LT_CHECK_STATUS(lm_tensor_from_view(t, &v, &u), LM_INVALID_ARGUMENT);
    LT_CHECK(u == NULL);
    lm_tensor_destroy(t);
    lm_storage_release(s);
}

/* ---- zero-copy derived tensors ------------------------------------------------------------ */
static void test_derived_tensors_are_zero_copy(void) {
    int64_t s[3] = {2, 3, 12}, hd[2] = {4, 3}, flat[2] = {6, 12};
    int perm[3] = {2, 0, 1};
    lm_tensor *t = iota(3, s), *d[6] = {NULL};
    LT_CHECK_OK(lm_tensor_reshape(t, 2, flat, &d[0]));
    LT_CHECK_OK(lm_tensor_transpose(t, 0, 1, &d[1]));
    LT_CHECK_OK(lm_tensor_permute(t, perm, &d[2]));
    LT_CHECK_OK(lm_tensor_slice(t, 2, 3, 12, 4, &d[3]));
    LT_CHECK_OK(lm_tensor_split_axis(t, 2, 2, hd, &d[4]));
    LT_CHECK_OK(lm_tensor_merge_axes(t, 0, 2, &d[5]));
    for (int i = 0; i < 6; i++) {
        LT_CHECK(d[i] && lm_tensor_storage(d[i]) == lm_tensor_storage(t));
        LT_CHECK(lm_tensor_data(d[i]) == (i == 3 ? (float *)lm_tensor_data(t) + 3 : lm_tensor_data(t)));
    }
    LT_CHECK(lm_storage_refcount(lm_tensor_storage(t)) == 7);
    LT_CHECK(lm_tensor_dim(d[3], 2) == 3 && at2(d[0], 5, 11) == 71);
    lm_tensor *bad = NULL;
    LT_CHECK_STATUS(lm_tensor_reshape(d[1], 2, flat, &bad), LM_UNSUPPORTED); /* transposed: not contiguous */
    LT_CHECK_STATUS(lm_tensor_merge_axes(d[2], 0, 2, &bad), LM_UNSUPPORTED);
    LT_CHECK(bad == NULL);
    for (int i = 0; i < 6; i++) lm_tensor_destroy(d[i]);
    lm_tensor_destroy(t);
}

/* ---- contiguous / copies ------------------------------------------------------------------------ */
static void test_contiguous_materializes_logical_order(void) {
    const lm_dtype dts[LM_DTYPE_COUNT] = {LM_F32, LM_BF16, LM_F16, LM_I32, LM_I64, LM_U8};
    int64_t s[2] = {5, 7};
    for (int k = 0; k < LM_DTYPE_COUNT; k++) {
        size_t es = lm_dtype_size(dts[k]);
        lm_tensor *t = NULL, *tt = NULL, *c = NULL, *same = NULL;
        LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), dts[k], 2, s, &t));
        unsigned char *p = lm_tensor_data(t);
        for (size_t b = 0; b < 35 * es; b++) p[b] = (unsigned char)(b * 7 + 1);
        LT_CHECK_OK(lm_tensor_transpose(t, 0, 1, &tt));
        LT_CHECK_OK(lm_tensor_contiguous(g_ctx, tt, &c));
        LT_CHECK(c && lm_tensor_storage(c) != lm_tensor_storage(t));
        LT_CHECK(lm_tensor_view_is_contiguous(lm_tensor_as_view(c)) && lm_tensor_dim(c, 0) == 7);
        const unsigned char *q = lm_tensor_data(c);
        int bad = 0;
        for (int i = 0; i < 7; i++)
            for (int j = 0; j < 5; j++) bad += memcmp(q + (size_t)(i * 5 + j) * es, p + (size_t)(j * 7 + i) * es, es) != 0;
        LT_CHECK_MSG(bad == 0, "%s: %d elements out of logical order", lm_dtype_name(dts[k]), bad);
        LT_CHECK_OK(lm_tensor_contiguous(g_ctx, t, &same)); /* already contiguous: shares storage */
        LT_CHECK(same && lm_tensor_storage(same) == lm_tensor_storage(t) && lm_tensor_data(same) == p);
        lm_tensor_destroy(t), lm_tensor_destroy(tt), lm_tensor_destroy(c), lm_tensor_destroy(same);
    }
    /* a broadcast view materializes its repeats */
    int64_t row[2] = {1, 4}, four[2] = {3, 4};
    lm_tensor *r = iota(2, row), *e = NULL, *c = NULL;
    lm_tensor_view ev;
    LT_CHECK_OK(lm_tensor_view_expand(lm_tensor_as_view(r), 2, four, &ev));
    LT_CHECK_OK(lm_tensor_from_view(r, &ev, &e));
    LT_CHECK_OK(lm_tensor_contiguous(g_ctx, e, &c));
    for (int i = 0; c && i < 12; i++) LT_CHECK(((float *)lm_tensor_data(c))[i] == (float)(i % 4));
    lm_tensor_destroy(r), lm_tensor_destroy(e), lm_tensor_destroy(c);
}

static void test_view_copy_strided_to_strided(void) {
    lt_rng rng = lt_rng_seed(9);
    static float dst_buf[8192], src_buf[8192]; /* spans reach (4*2)^4 */
    for (int trial = 0; trial < 300; trial++) {
        int nd = (int)lt_rng_int(&rng, 0, 4);
        int64_t shape[LM_MAX_DIMS], dst_st[LM_MAX_DIMS], src_st[LM_MAX_DIMS];
        for (int d = 0; d < nd; d++) shape[d] = lt_rng_int(&rng, 1, 4);
        /* destination: each axis spaced by a step of 1 or 2 (disjoint); source: a random
         * permutation of a contiguous layout, possibly padded */
        int64_t span = 1;
        for (int d = nd - 1; d >= 0; d--) {
            dst_st[d] = span * lt_rng_int(&rng, 1, 2);
            span = dst_st[d] * shape[d];
        }
        int order[LM_MAX_DIMS];
        for (int d = 0; d < nd; d++) order[d] = d;
        for (int d = nd - 1; d > 0; d--) {
            int j = (int)lt_rng_int(&rng, 0, d), tmp = order[d];
            order[d] = order[j];
            order[j] = tmp;
        }
        span = lt_rng_int(&rng, 1, 2);
        for (int k = nd - 1; k >= 0; k--) {
            src_st[order[k]] = span;
            span *= shape[order[k]];
        }
        for (int i = 0; i < 8192; i++) src_buf[i] = (float)i, dst_buf[i] = -1.0f;
        lm_tensor_view dv, sv;
        LT_CHECK_OK(lm_tensor_view_init(&dv, dst_buf, LM_F32, lm_device_cpu(), nd, shape, dst_st));
        LT_CHECK_OK(lm_tensor_view_init(&sv, src_buf, LM_F32, lm_device_cpu(), nd, shape, src_st));
        LT_CHECK_OK(lm_tensor_view_copy(g_ctx, &dv, &sv));
        int64_t idx[LM_MAX_DIMS] = {0}, n = lm_tensor_view_numel(&dv), bad = 0, written = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t doff = 0, soff = 0;
            for (int d = 0; d < nd; d++) doff += idx[d] * dst_st[d], soff += idx[d] * src_st[d];
            bad += dst_buf[doff] != (float)soff;
            for (int d = nd - 1; d >= 0; d--) {
                if (++idx[d] < shape[d]) break;
                idx[d] = 0;
            }
        }
        for (int i = 0; i < 8192; i++) written += dst_buf[i] != -1.0f;
        LT_CHECK_MSG(bad == 0 && written == n, "trial %d: %lld wrong, %lld written of %lld", trial, (long long)bad,
                     (long long)written, (long long)n);
    }
}

static void test_view_copy_errors_and_self_copy(void) {
    int64_t s[2] = {3, 4}, s43[2] = {4, 3}, row[2] = {1, 4};
    lm_tensor *a = iota(2, s), *b = iota(2, s43), *h = NULL, *r = iota(2, row);
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F16, 2, s, &h));
    const lm_tensor_view *va = lm_tensor_as_view(a);
    LT_CHECK_STATUS(lm_tensor_view_copy(g_ctx, va, lm_tensor_as_view(h)), LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_tensor_view_copy(g_ctx, va, lm_tensor_as_view(b)), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_tensor_view_copy(g_ctx, NULL, va), LM_INVALID_ARGUMENT);
    lm_tensor_view ev;
    LT_CHECK_OK(lm_tensor_view_expand(lm_tensor_as_view(r), 2, s, &ev));
    LT_CHECK_STATUS(lm_tensor_view_copy(g_ctx, &ev, va), LM_INVALID_ARGUMENT); /* written twice */
    LT_CHECK_OK(lm_tensor_view_copy(g_ctx, va, &ev));                           /* reading repeats is fine */
    LT_CHECK(((float *)lm_tensor_data(a))[9] == 1.0f);
    LT_CHECK_OK(lm_tensor_view_copy(g_ctx, va, va)); /* a copy onto itself leaves it unchanged */
    LT_CHECK(((float *)lm_tensor_data(a))[10] == 2.0f);
    lm_tensor_destroy(a), lm_tensor_destroy(b), lm_tensor_destroy(h), lm_tensor_destroy(r);
}

static void test_read_write_strided_views(void) {
    int64_t s[2] = {4, 6};
    lm_tensor *t = iota(2, s), *tt = NULL;
    LT_CHECK_OK(lm_tensor_slice(t, 1, 1, 6, 2, &tt)); /* [4,3]: columns 1,3,5 */
    float got[12], put[12];
    LT_CHECK_OK(lm_tensor_view_read(g_ctx, lm_tensor_as_view(tt), got));
    for (int i = 0; i < 12; i++) LT_CHECK(got[i] == (float)((i / 3) * 6 + 1 + 2 * (i % 3)));
    for (int i = 0; i < 12; i++) put[i] = 100.0f + (float)i;
    LT_CHECK_OK(lm_tensor_view_write(g_ctx, lm_tensor_as_view(tt), put));
    const float *p = lm_tensor_data(t);
    LT_CHECK(p[0] == 0.0f && p[1] == 100.0f && p[2] == 2.0f && p[3] == 101.0f && p[23] == 111.0f);
    lm_tensor_destroy(t), lm_tensor_destroy(tt);
}

static void test_to_device_cpu_to_cpu_copies(void) {
    int64_t s[2] = {3, 5};
    lm_tensor *t = iota(2, s), *tt = NULL, *d = NULL, *d2 = NULL;
    LT_CHECK_OK(lm_tensor_transpose(t, 0, 1, &tt));
    LT_CHECK_OK(lm_tensor_to_device(g_ctx, tt, lm_device_cpu(), &d));
    LT_CHECK(d && lm_tensor_storage(d) != lm_tensor_storage(t) && lm_tensor_view_is_contiguous(lm_tensor_as_view(d)));
    for (int i = 0; d && i < 15; i++) LT_CHECK(((float *)lm_tensor_data(d))[i] == (float)((i % 3) * 5 + i / 3));
    LT_CHECK_OK(lm_tensor_to_device(g_ctx, t, lm_device_cpu(), &d2)); /* contiguous input: still a copy */
    LT_CHECK(d2 && lm_tensor_storage(d2) != lm_tensor_storage(t) && lm_storage_refcount(lm_tensor_storage(t)) == 2);
    LT_CHECK(d2 && memcmp(lm_tensor_data(d2), lm_tensor_data(t), 60) == 0);
    lm_tensor_destroy(t), lm_tensor_destroy(tt), lm_tensor_destroy(d), lm_tensor_destroy(d2);
}

static void test_cuda_requests_unsupported_without_cuda(void) {
    if (lm_cuda_compiled()) {
        printf("  (built with CUDA: the CPU-only error paths are not reachable)\n");
        return;
    }
    LT_CHECK(lm_cuda_device_count() == 0);
    int64_t s[1] = {4};
    lm_tensor *t = (lm_tensor *)&t, *c = NULL;
    LT_CHECK_STATUS(lm_tensor_create(lm_device_cuda(0), LM_F32, 1, s, &t), LM_UNSUPPORTED);
    LT_CHECK(t == NULL && strstr(lm_last_error(), "cuda:0") && strstr(lm_last_error(), "without CUDA"));
    LT_CHECK_STATUS(lm_tensor_zeros(lm_device_cuda(1), LM_F32, 1, s, &t), LM_UNSUPPORTED);
    lm_storage *st = NULL;
    LT_CHECK_STATUS(lm_storage_create(lm_device_cuda(0), 16, &st), LM_UNSUPPORTED);
    void *mem = NULL;
    char host[8];
    LT_CHECK_STATUS(lm_device_alloc(lm_device_cuda(0), 16, &mem), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_device_copy(lm_device_cuda(0), host, lm_device_cpu(), host, 8), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_device_fill(lm_device_cuda(0), host, 8, host, 2), LM_UNSUPPORTED);
    lm_ctx *ctx = NULL;
    LT_CHECK_STATUS(lm_ctx_create(lm_device_cuda(0), 1, &ctx), LM_UNSUPPORTED);
    LT_CHECK(ctx == NULL);
    t = iota(1, s);
    lt_alloc_track(0);
    LT_CHECK_STATUS(lm_tensor_to_device(g_ctx, t, lm_device_cuda(0), &c), LM_UNSUPPORTED);
    LT_CHECK(c == NULL && lt_alloc_live() == 0);
    lt_alloc_untrack();
    lm_tensor_destroy(t);
}

static void test_poison_strided_views(void) {
    const lm_dtype dts[LM_DTYPE_COUNT] = {LM_F32, LM_BF16, LM_F16, LM_I32, LM_I64, LM_U8};
    int64_t s[2] = {6, 8};
    for (int k = 0; k < LM_DTYPE_COUNT; k++) {
        size_t es = lm_dtype_size(dts[k]);
        lm_tensor *t = NULL, *sl = NULL, *v = NULL;
        LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), dts[k], 2, s, &t));
        LT_CHECK_OK(lm_tensor_slice(t, 1, 1, 8, 3, &sl)); /* columns 1, 4, 7 */
        LT_CHECK_OK(lm_tensor_transpose(sl, 0, 1, &v));
        LT_CHECK_OK(lm_tensor_view_poison(g_ctx, lm_tensor_as_view(v)));
        double *vals = lt_view_to_f64(lm_tensor_as_view(t));
        const unsigned char *bytes = lm_tensor_data(t);
        int bad = 0;
        for (int i = 0; i < 48; i++) {
            int hit = (i % 8) % 3 == 1;
            const unsigned char *e = bytes + (size_t)i * es;
            int poisoned = lm_dtype_is_float(dts[k]) ? isnan(vals[i]) : e[0] == 0xA5 && e[es - 1] == 0xA5;
            int zero = vals[i] == 0.0;
            bad += hit ? !poisoned : !zero;
        }
        free(vals);
        LT_CHECK_MSG(bad == 0, "%s: %d elements wrong after poisoning a strided view", lm_dtype_name(dts[k]), bad);
        lm_tensor_destroy(t), lm_tensor_destroy(sl), lm_tensor_destroy(v);
    }
    /* a broadcast view cannot be an output */
    int64_t row[2] = {1, 4}, four[2] = {3, 4};
    lm_tensor *r = iota(2, row);
    lm_tensor_view ev;
    LT_CHECK_OK(lm_tensor_view_expand(lm_tensor_as_view(r), 2, four, &ev));
    LT_CHECK_STATUS(lm_tensor_view_poison(g_ctx, &ev), LM_INVALID_ARGUMENT);
    lm_tensor_destroy(r);
}

/* ---- devices --------------------------------------------------------------------------------------- */
static void test_device_parse_and_format(void) {
    const struct {
        const char *text;
        lm_device want;
    } good[] = {{"cpu", {LM_DEVICE_CPU, 0}},      {"cuda", {LM_DEVICE_CUDA, 0}},    {"cuda:0", {LM_DEVICE_CUDA, 0}},
                {"cuda:7", {LM_DEVICE_CUDA, 7}}, {"cuda:1023", {LM_DEVICE_CUDA, 1023}}};
    char buf[32];
    for (int i = 0; i < 5; i++) {
        lm_device d = {LM_DEVICE_CUDA, 99};
        LT_CHECK_OK(lm_device_parse(good[i].text, &d));
        LT_CHECK(lm_device_equal(d, good[i].want));
        lm_device again;
        LT_CHECK(lm_device_format(d, buf, sizeof buf) == buf);
        LT_CHECK_OK(lm_device_parse(buf, &again));
        LT_CHECK(lm_device_equal(again, d));
    }
    const char *bad[] = {"gpu", "", "CPU", " cpu", "cpu ", "cuda:", "cuda:-1", "cuda:1x", "cuda:1024",
                         "cuda:99999999999999999999", "cuda0", "cuda:+1"};
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        lm_device d = {LM_DEVICE_CPU, 0};
        LT_CHECK_STATUS(lm_device_parse(bad[i], &d), LM_INVALID_ARGUMENT);
        LT_CHECK(strstr(lm_last_error(), bad[i]) != NULL);
    }
    lm_device d;
    LT_CHECK_STATUS(lm_device_parse(NULL, &d), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_device_parse("cpu", NULL), LM_INVALID_ARGUMENT);
    LT_CHECK(strcmp(lm_device_format(lm_device_cpu(), buf, sizeof buf), "cpu") == 0);
    LT_CHECK(strcmp(lm_device_format(lm_device_cuda(12), buf, sizeof buf), "cuda:12") == 0);
    LT_CHECK(strcmp(lm_device_format(lm_device_cuda(12), buf, 4), "cud") == 0); /* truncated, terminated */
    LT_CHECK(!lm_device_equal(lm_device_cpu(), lm_device_cuda(0)) && !lm_device_equal(lm_device_cuda(0), lm_device_cuda(1)));
}

/* ---- failed allocations leak nothing ------------------------------------------------------------- */
typedef lm_status (*op_fn)(const lm_tensor *in, lm_tensor **out);

static lm_tensor *g_in; /* a transposed [5,6] f32 view of a [6,5] tensor */

static lm_status op_create(const lm_tensor *in, lm_tensor **out) {
    (void)in;
    int64_t s[3] = {2, 3, 4};
    return lm_tensor_create(lm_device_cpu(), LM_F16, 3, s, out);
}
static lm_status op_zeros(const lm_tensor *in, lm_tensor **out) {
    (void)in;
    int64_t s[1] = {9};
    return lm_tensor_zeros(lm_device_cpu(), LM_I64, 1, s, out);
}
static lm_status op_from_host(const lm_tensor *in, lm_tensor **out) {
    (void)in;
    int64_t s[1] = {3};
    const float v[3] = {1, 2, 3};
    return lm_tensor_from_host(lm_device_cpu(), LM_F32, 1, s, v, out);
}
static lm_status op_transpose(const lm_tensor *in, lm_tensor **out) { return lm_tensor_transpose(in, 0, 1, out); }
static lm_status op_slice(const lm_tensor *in, lm_tensor **out) { return lm_tensor_slice(in, 1, 1, 6, 2, out); }
static lm_status op_contiguous(const lm_tensor *in, lm_tensor **out) { return lm_tensor_contiguous(g_ctx, in, out); }
static lm_status op_to_device(const lm_tensor *in, lm_tensor **out) {
    return lm_tensor_to_device(g_ctx, in, lm_device_cpu(), out);
}
static lm_status op_poison(const lm_tensor *in, lm_tensor **out) {
    *out = NULL;
    return lm_tensor_view_poison(g_ctx, lm_tensor_as_view(in)); /* strided: needs a scratch tensor */
}
static lm_status op_from_storage(const lm_tensor *in, lm_tensor **out) {
    int64_t s[1] = {10};
    return lm_tensor_from_storage(lm_tensor_storage(in), LM_F32, 1, s, NULL, 20, out);
}

static void test_failed_allocations_leak_nothing(void) {
    const struct {
        const char *name;
        op_fn fn;
        int min_allocs;
    } ops[] = {{"create", op_create, 3},         {"zeros", op_zeros, 3},       {"from_host", op_from_host, 3},
               {"transpose", op_transpose, 1},   {"slice", op_slice, 1},       {"contiguous", op_contiguous, 3},
               {"to_device", op_to_device, 4},   {"poison", op_poison, 3},     {"from_storage", op_from_storage, 1}};
    for (int i = 0; i < (int)(sizeof ops / sizeof ops[0]); i++) {
        int k = 1;
        for (;; k++) {
            lm_tensor *out = (lm_tensor *)&out;
            lt_alloc_track(k);
            lm_status st = ops[i].fn(g_in, &out);
            int64_t attempts = lt_alloc_count();
            if (st == LM_OK) {
                LT_CHECK_MSG(attempts < k, "%s: allocation %d failed but the call succeeded", ops[i].name, k);
                lm_tensor_destroy(out);
            } else {
                LT_CHECK_MSG(st == LM_OUT_OF_MEMORY, "%s, fail_at %d: %s", ops[i].name, k, lm_status_name(st));
                LT_CHECK_MSG(out == NULL, "%s, fail_at %d: *out not reset", ops[i].name, k);
            }
            LT_CHECK_MSG(lt_alloc_live() == 0, "%s, fail_at %d: %lld allocations leaked", ops[i].name, k,
                         (long long)lt_alloc_live());
            lt_alloc_untrack();
            if (st == LM_OK || k > 50) break;
        }
        LT_CHECK_MSG(k - 1 >= ops[i].min_allocs, "%s: only %d allocations exercised", ops[i].name, k - 1);
        LT_CHECK(lm_storage_refcount(lm_tensor_storage(g_in)) == 2);
    }
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ctx));
    LT_RUN(test_views_share_storage_and_keep_it_alive);
    LT_RUN(test_wrap_releases_exactly_once);
    LT_RUN(test_scalar_has_one_element);
    LT_RUN(test_zero_sized_dims_are_valid);
    LT_RUN(test_negative_dims_and_strides_rejected);
    LT_RUN(test_offsets_and_strides_are_in_elements);
    LT_RUN(test_from_storage_rejects_views_outside);
    LT_RUN(test_derived_tensors_are_zero_copy);
    LT_RUN(test_contiguous_materializes_logical_order);
    LT_RUN(test_view_copy_strided_to_strided);
    LT_RUN(test_view_copy_errors_and_self_copy);
    LT_RUN(test_read_write_strided_views);
    LT_RUN(test_to_device_cpu_to_cpu_copies);
    LT_RUN(test_cuda_requests_unsupported_without_cuda);
    LT_RUN(test_poison_strided_views);
    LT_RUN(test_device_parse_and_format);
    int64_t s[2] = {6, 5};
    lm_tensor *base = iota(2, s);
    lm_tensor_transpose(base, 0, 1, &g_in);
    LT_RUN(test_failed_allocations_leak_nothing);
    lm_tensor_destroy(g_in);
    lm_tensor_destroy(base);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
