/* Tests for TensorView transforms (DESIGN.md §2): view_init validation (negative
 * dims/strides, ndim, overflowing sizes and spans), reshape (contiguous only),
 * transpose, permute, slice with step > 1, select, split_axis, merge_axes and expand
 * are metadata-only and address the right elements: every element of the result is
 * compared against index arithmetic on the source's logical layout. Also: out may
 * alias the input, and lm_tensor_view_overlaps_self is exact on the layouts these
 * transforms produce and never misses a real overlap.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

/* A contiguous f32 view over buf whose element i holds the value i, so every value
 * read through a derived view names the storage element it came from. */
static float g_buf[4096];

static lm_tensor_view iota_view(int ndim, const int64_t *shape) {
    for (int i = 0; i < 4096; i++) g_buf[i] = (float)i;
    lm_tensor_view v;
    memset(&v, 0, sizeof v);
    lm_status st = lm_tensor_view_init(&v, g_buf, LM_F32, lm_device_cpu(), ndim, shape, NULL);
    if (st != LM_OK) lt_fail(__FILE__, __LINE__, "iota view: %s", lm_last_error());
    return v;
}

/* Storage element that v's element idx reads (through v's strides). */
static int64_t source_of(const lm_tensor_view *v, const int64_t *idx) {
    int64_t off = 0;
    for (int d = 0; d < v->ndim; d++) off += idx[d] * v->stride[d];
    return (int64_t)((const float *)v->data)[off];
}

/* Odometer over shape; returns 0 after the last index. */
static int next_index(int ndim, const int64_t *shape, int64_t *idx) {
    for (int d = ndim - 1; d >= 0; d--) {
        if (++idx[d] < shape[d]) return 1;
        idx[d] = 0;
    }
    return 0;
}

/* expect(idx) = storage element that logical element idx of the result must read. */
typedef int64_t (*expect_fn)(const int64_t *idx);

static int check_elements(const char *what, const lm_tensor_view *v, expect_fn expect) {
    int64_t idx[LM_MAX_DIMS] = {0}, n = lm_tensor_view_numel(v), bad = 0;
    for (int64_t i = 0; i < n; i++, next_index(v->ndim, v->shape, idx))
        if (source_of(v, idx) != expect(idx) && bad++ < 3)
            lt_fail(__FILE__, __LINE__, "%s: element %lld reads %lld, expected %lld", what, (long long)i,
                    (long long)source_of(v, idx), (long long)expect(idx));
    return bad == 0;
}

static int64_t e_transpose(const int64_t *i) { return i[2] * 20 + i[1] * 5 + i[0]; } /* in[c][b][a], in {3,4,5} */
static int64_t e_permute(const int64_t *i) { return i[1] * 20 + i[2] * 5 + i[0]; }   /* in[b][c][a] */
static int64_t e_slice(const int64_t *i) { return i[0] * 9 + 1 + 3 * i[1]; }         /* in {4,9}[:, 1:8:3] */
static int64_t e_select_mid(const int64_t *i) { return i[0] * 20 + 2 * 5 + i[1]; }   /* in {3,4,5}[:, 2, :] */
static int64_t e_select_last(const int64_t *i) { return i[0] * 20 + i[1] * 5 + 4; }  /* in {3,4,5}[..., 4] */
static int64_t e_split(const int64_t *i) { return i[0] * 36 + i[1] * 12 + i[2] * 3 + i[3]; } /* {2,3,12} */
static int64_t e_merged(const int64_t *i) { return i[0] * 36 + i[1] * 12 + i[2]; }
static int64_t e_split_t(const int64_t *i) { return (i[1] * 3 + i[2]) * 4 + i[0]; } /* x {6,4}: x^T split */
static int64_t e_merge_rows(const int64_t *i) { return i[0] * 8 + i[1]; }
static int64_t e_expand(const int64_t *i) { return i[1]; } /* in {3,1}: in[b][0] */
static int64_t e_reshape(const int64_t *i) { return i[0] * 8 + i[1] * 2 + i[2]; }

static void test_init_validates_shape_and_strides(void) {
    lm_tensor_view v;
    int64_t neg_dim[2] = {2, -1}, ok[2] = {2, 3}, neg_stride[2] = {3, -1}, big[2] = {INT64_C(1) << 32, INT64_C(1) << 32};
    float x[8];
    LT_CHECK_STATUS(lm_tensor_view_init(&v, x, LM_F32, lm_device_cpu(), 2, neg_dim, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "-1") != NULL);
    LT_CHECK_STATUS(lm_tensor_view_init(&v, x, LM_F32, lm_device_cpu(), 2, ok, neg_stride), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_view_init(&v, x, LM_F32, lm_device_cpu(), 9, ok, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_view_init(&v, x, LM_F32, lm_device_cpu(), -1, ok, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_view_init(&v, x, (lm_dtype)9, lm_device_cpu(), 2, ok, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_view_init(&v, x, LM_F32, lm_device_cpu(), 2, big, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_view_init(&v, NULL, LM_F32, lm_device_cpu(), 2, ok, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_view_init(&v, x, LM_F32, lm_device_cpu(), 2, NULL, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_view_init(NULL, x, LM_F32, lm_device_cpu(), 2, ok, NULL), LM_INVALID_ARGUMENT);
    /* an empty view may have NULL data; its other dims may be huge but not overflow */
    int64_t empty[3] = {0, INT64_C(1) << 40, INT64_C(1) << 40};
    LT_CHECK_STATUS(lm_tensor_view_init(&v, NULL, LM_F32, lm_device_cpu(), 3, empty, NULL), LM_INVALID_ARGUMENT);
    int64_t empty_ok[3] = {0, 7, 5};
    LT_CHECK_OK(lm_tensor_view_init(&v, NULL, LM_F32, lm_device_cpu(), 3, empty_ok, NULL));
    LT_CHECK(v.stride[0] == 35 && v.stride[1] == 5 && v.stride[2] == 1);
    /* strides whose span does not fit in int64 describe no memory */
    int64_t two[1] = {2}, huge_stride[1] = {INT64_MAX}, four[2] = {2, 2};
    int64_t half_strides[2] = {INT64_C(1) << 62, INT64_C(1) << 62};
    LT_CHECK_STATUS(lm_tensor_view_init(&v, x, LM_F32, lm_device_cpu(), 1, two, huge_stride), LM_OUT_OF_RANGE);
    LT_CHECK_STATUS(lm_tensor_view_init(&v, x, LM_F32, lm_device_cpu(), 2, four, half_strides), LM_OUT_OF_RANGE);
    /* scalar: ndim 0, one element, shape may be NULL */
    LT_CHECK_OK(lm_tensor_view_init(&v, x, LM_F32, lm_device_cpu(), 0, NULL, NULL));
    LT_CHECK(lm_tensor_view_numel(&v) == 1 && lm_tensor_view_extent(&v) == 1 && lm_tensor_view_is_contiguous(&v));
    LT_CHECK_STATUS(lm_tensor_view_init(&v, NULL, LM_F32, lm_device_cpu(), 0, NULL, NULL), LM_INVALID_ARGUMENT);
}

static void test_contiguity_and_extent(void) {
    int64_t s[3] = {2, 3, 4};
    lm_tensor_view v = iota_view(3, s), t;
    LT_CHECK(lm_tensor_view_is_contiguous(&v) && lm_tensor_view_extent(&v) == 24);
    LT_CHECK_OK(lm_tensor_view_transpose(&v, 0, 2, &t));
    LT_CHECK(!lm_tensor_view_is_contiguous(&t) && lm_tensor_view_extent(&t) == 24);
    /* size-1 axes have no meaningful stride */
    int64_t s1[3] = {3, 1, 4}, st1[3] = {4, 999, 1};
    LT_CHECK_OK(lm_tensor_view_init(&t, g_buf, LM_F32, lm_device_cpu(), 3, s1, st1));
    LT_CHECK(lm_tensor_view_is_contiguous(&t) && lm_tensor_view_extent(&t) == 12);
    /* an empty view is contiguous whatever its strides */
    int64_t s0[2] = {0, 3}, st0[2] = {1, 7};
    LT_CHECK_OK(lm_tensor_view_init(&t, g_buf, LM_F32, lm_device_cpu(), 2, s0, st0));
    LT_CHECK(lm_tensor_view_is_contiguous(&t) && lm_tensor_view_extent(&t) == 0);
}

static void test_reshape_needs_contiguous_input(void) {
    int64_t s[3] = {2, 3, 4}, to[3] = {3, 4, 2}, flat[1] = {-1}, two_neg[2] = {-1, -1}, bad[2] = {5, 5};
    int64_t neg[2] = {-2, -12};
    lm_tensor_view v = iota_view(3, s), r, t;
    LT_CHECK_OK(lm_tensor_view_reshape(&v, 3, to, &r));
    LT_CHECK(r.data == v.data && r.stride[0] == 8 && r.stride[1] == 2 && r.stride[2] == 1);
    LT_CHECK(check_elements("reshape", &r, e_reshape));
    LT_CHECK_OK(lm_tensor_view_reshape(&v, 1, flat, &r));
    LT_CHECK(r.ndim == 1 && r.shape[0] == 24);
    LT_CHECK_STATUS(lm_tensor_view_reshape(&v, 0, NULL, &r), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_tensor_view_reshape(&v, 2, two_neg, &r), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_view_reshape(&v, 2, bad, &r), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_tensor_view_reshape(&v, 2, neg, &r), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_view_reshape(&v, 9, to, &r), LM_INVALID_ARGUMENT);
    LT_CHECK_OK(lm_tensor_view_transpose(&v, 1, 2, &t));
    LT_CHECK_STATUS(lm_tensor_view_reshape(&t, 1, flat, &r), LM_UNSUPPORTED);
    /* an outer-axis slice stays contiguous and reshapes from its own start */
    LT_CHECK_OK(lm_tensor_view_slice(&v, 0, 1, 2, 1, &t));
    LT_CHECK_OK(lm_tensor_view_reshape(&t, 1, flat, &r));
    LT_CHECK(r.data == g_buf + 12 && r.shape[0] == 12);
    /* scalar <-> {1,1} */
    int64_t ones[2] = {1, 1};
    lm_tensor_view sc;
    LT_CHECK_OK(lm_tensor_view_init(&sc, g_buf + 5, LM_F32, lm_device_cpu(), 0, NULL, NULL));
    LT_CHECK_OK(lm_tensor_view_reshape(&sc, 2, ones, &r));
    LT_CHECK_OK(lm_tensor_view_reshape(&r, 0, NULL, &r));
    LT_CHECK(r.ndim == 0 && r.data == g_buf + 5);
}

static void test_transpose_permute_address_right_elements(void) {
    int64_t s[3] = {3, 4, 5};
    lm_tensor_view v = iota_view(3, s), t;
    LT_CHECK_OK(lm_tensor_view_transpose(&v, 0, 2, &t));
    LT_CHECK(t.data == v.data && t.shape[0] == 5 && t.shape[1] == 4 && t.shape[2] == 3);
    LT_CHECK(check_elements("transpose", &t, e_transpose));
    LT_CHECK_OK(lm_tensor_view_transpose(&v, -1, 0, &t));
    LT_CHECK(check_elements("transpose (negative axis)", &t, e_transpose));
    LT_CHECK_STATUS(lm_tensor_view_transpose(&v, 0, 3, &t), LM_OUT_OF_RANGE);
    int perm[3] = {2, 0, 1}, dup[3] = {0, 0, 1}, oob[3] = {0, 1, 3};
    LT_CHECK_OK(lm_tensor_view_permute(&v, perm, &t));
    LT_CHECK(t.data == v.data && t.shape[0] == 5 && t.shape[1] == 3 && t.shape[2] == 4);
    LT_CHECK(check_elements("permute", &t, e_permute));
    LT_CHECK_STATUS(lm_tensor_view_permute(&v, dup, &t), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_view_permute(&v, oob, &t), LM_INVALID_ARGUMENT);
}

static void test_slice_and_select_address_right_elements(void) {
    int64_t s[2] = {4, 9};
    lm_tensor_view v = iota_view(2, s), t;
    LT_CHECK_OK(lm_tensor_view_slice(&v, 1, 1, 8, 3, &t)); /* columns 1, 4, 7 */
    LT_CHECK(t.shape[0] == 4 && t.shape[1] == 3 && t.stride[1] == 3 && t.data == g_buf + 1);
    LT_CHECK(check_elements("slice step 3", &t, e_slice));
    LT_CHECK_OK(lm_tensor_view_slice(&v, 1, 1, 9, 3, &t)); /* stop past the last pick: still 3 */
    LT_CHECK(t.shape[1] == 3);
    LT_CHECK_OK(lm_tensor_view_slice(&v, 0, 4, 4, 1, &t)); /* empty at the end is valid */
    LT_CHECK(t.shape[0] == 0 && lm_tensor_view_numel(&t) == 0);
    /* a huge step picks one element; neither the length nor the stride may overflow */
    LT_CHECK_OK(lm_tensor_view_slice(&v, 1, 2, 4, INT64_MAX, &t));
    LT_CHECK(t.shape[1] == 1 && t.data == g_buf + 2 && lm_tensor_view_extent(&t) == 28);
    LT_CHECK_OK(lm_tensor_view_slice(&v, 0, 1, 3, INT64_MAX, &t));
    LT_CHECK(t.shape[0] == 1 && t.data == g_buf + 9 && lm_tensor_view_extent(&t) == 9);
    LT_CHECK_STATUS(lm_tensor_view_slice(&v, 1, 0, 9, 0, &t), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_view_slice(&v, 1, 0, 10, 1, &t), LM_OUT_OF_RANGE);
    LT_CHECK_STATUS(lm_tensor_view_slice(&v, 1, 5, 4, 1, &t), LM_OUT_OF_RANGE);
    LT_CHECK_STATUS(lm_tensor_view_slice(&v, 1, -1, 4, 1, &t), LM_OUT_OF_RANGE);
    LT_CHECK_STATUS(lm_tensor_view_slice(&v, 2, 0, 1, 1, &t), LM_OUT_OF_RANGE);

    int64_t s3[3] = {3, 4, 5};
    lm_tensor_view w = iota_view(3, s3);
    LT_CHECK_OK(lm_tensor_view_select(&w, 1, 2, &t));
    LT_CHECK(t.ndim == 2 && t.shape[0] == 3 && t.shape[1] == 5 && t.data == g_buf + 10);
    LT_CHECK(check_elements("select", &t, e_select_mid));
    LT_CHECK_OK(lm_tensor_view_select(&w, -1, 4, &t));
    LT_CHECK(check_elements("select last axis", &t, e_select_last));
    LT_CHECK_STATUS(lm_tensor_view_select(&w, 1, 4, &t), LM_OUT_OF_RANGE);
    LT_CHECK_STATUS(lm_tensor_view_select(&w, 1, -1, &t), LM_OUT_OF_RANGE);
    lm_tensor_view sc;
    LT_CHECK_OK(lm_tensor_view_init(&sc, g_buf, LM_F32, lm_device_cpu(), 0, NULL, NULL));
    LT_CHECK_STATUS(lm_tensor_view_select(&sc, 0, 0, &t), LM_OUT_OF_RANGE);
}

static void test_split_and_merge_heads(void) {
    /* [B,T,H*D] = [2,3,12] -> [B,T,H,D] = [2,3,4,3] and back */
    int64_t s[3] = {2, 3, 12}, hd[2] = {4, -1};
    lm_tensor_view v = iota_view(3, s), t, m;
    LT_CHECK_OK(lm_tensor_view_split_axis(&v, 2, 2, hd, &t));
    LT_CHECK(t.ndim == 4 && t.shape[2] == 4 && t.shape[3] == 3 && t.stride[2] == 3 && t.data == v.data);
    LT_CHECK(check_elements("split heads", &t, e_split));
    LT_CHECK_OK(lm_tensor_view_merge_axes(&t, 2, 2, &m));
    LT_CHECK(m.ndim == 3 && m.shape[2] == 12 && m.stride[0] == 36 && m.stride[1] == 12 && m.stride[2] == 1);
    LT_CHECK(check_elements("merge heads", &m, e_merged));
    /* split of a strided (transposed) axis stays zero-copy */
    int64_t s2[2] = {6, 4}, f23[2] = {2, 3};
    lm_tensor_view x = iota_view(2, s2), xt;
    LT_CHECK_OK(lm_tensor_view_transpose(&x, 0, 1, &xt));
    LT_CHECK_OK(lm_tensor_view_split_axis(&xt, 1, 2, f23, &t));
    LT_CHECK(t.stride[1] == 12 && t.stride[2] == 4);
    LT_CHECK(check_elements("split transposed axis", &t, e_split_t));
    /* factor errors */
    int64_t bad[2] = {5, -1}, two_neg[2] = {-1, -1}, neg[2] = {-3, 4}, many[8] = {1, 1, 1, 1, 1, 1, 1, 12};
    int64_t overflow[3] = {INT64_C(1) << 32, INT64_C(1) << 32, 0};
    LT_CHECK_STATUS(lm_tensor_view_split_axis(&v, 2, 2, bad, &t), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_tensor_view_split_axis(&v, 2, 2, two_neg, &t), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_view_split_axis(&v, 2, 2, neg, &t), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_view_split_axis(&v, 2, 8, many, &t), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_view_split_axis(&v, 2, 0, hd, &t), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_view_split_axis(&v, 2, 3, overflow, &t), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_tensor_view_split_axis(&v, 3, 2, hd, &t), LM_OUT_OF_RANGE);
}

static void test_merge_needs_nesting_axes(void) {
    /* rows of a sliced [2,3,8][..., :4] still nest: merge (0,1) is zero-copy */
    int64_t s[3] = {2, 3, 8};
    lm_tensor_view v = iota_view(3, s), t, m;
    LT_CHECK_OK(lm_tensor_view_slice(&v, 2, 0, 4, 1, &t));
    LT_CHECK_OK(lm_tensor_view_merge_axes(&t, 0, 2, &m));
    LT_CHECK(m.ndim == 2 && m.shape[0] == 6 && m.stride[0] == 8 && m.data == v.data);
    LT_CHECK(check_elements("merge sliced rows", &m, e_merge_rows));
    LT_CHECK_STATUS(lm_tensor_view_merge_axes(&t, 1, 2, &m), LM_UNSUPPORTED); /* columns 0..3 of 8 */
    /* [2,3,4,5] with axes 1,2 swapped: no two neighbouring axes nest */
    int64_t s4[4] = {2, 3, 4, 5};
    lm_tensor_view w = iota_view(4, s4), wt;
    LT_CHECK_OK(lm_tensor_view_transpose(&w, 1, 2, &wt));
    for (int d = 0; d < 3; d++) {
        LT_CHECK_STATUS(lm_tensor_view_merge_axes(&wt, d, 2, &m), LM_UNSUPPORTED);
        LT_CHECK(strstr(lm_last_error(), "contiguous") != NULL);
    }
    /* size-1 axes with arbitrary strides do not block a merge */
    int64_t s1[3] = {3, 1, 4}, st1[3] = {4, 999, 1};
    LT_CHECK_OK(lm_tensor_view_init(&t, g_buf, LM_F32, lm_device_cpu(), 3, s1, st1));
    LT_CHECK_OK(lm_tensor_view_merge_axes(&t, 0, 3, &m));
    LT_CHECK(m.ndim == 1 && m.shape[0] == 12 && m.stride[0] == 1);
    LT_CHECK_OK(lm_tensor_view_merge_axes(&t, 1, 1, &m)); /* a single axis merges trivially */
    LT_CHECK(m.ndim == 3);
    LT_CHECK_STATUS(lm_tensor_view_merge_axes(&t, 2, 2, &m), LM_OUT_OF_RANGE);
    LT_CHECK_STATUS(lm_tensor_view_merge_axes(&t, 0, 0, &m), LM_OUT_OF_RANGE);
}

static void test_expand_broadcasts_with_zero_strides(void) {
    int64_t s[2] = {3, 1}, to[3] = {2, 3, 4}, bad[2] = {2, 1}, neg[3] = {2, 3, -1}, low[1] = {3};
    lm_tensor_view v = iota_view(2, s), e;
    LT_CHECK_OK(lm_tensor_view_expand(&v, 3, to, &e));
    LT_CHECK(e.ndim == 3 && e.stride[0] == 0 && e.stride[1] == 1 && e.stride[2] == 0 && e.data == v.data);
    LT_CHECK(check_elements("expand", &e, e_expand));
    LT_CHECK(lm_tensor_view_overlaps_self(&e));
    LT_CHECK_STATUS(lm_tensor_view_expand(&v, 2, bad, &e), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_tensor_view_expand(&v, 3, neg, &e), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_tensor_view_expand(&v, 1, low, &e), LM_SHAPE_MISMATCH);
}

static void test_out_may_alias_input(void) {
    int64_t s[3] = {2, 3, 12}, hd[2] = {4, 3}, flat[1] = {72}, to[4] = {5, 2, 3, 12};
    int perm[3] = {2, 0, 1};
    lm_tensor_view v = iota_view(3, s), ref, a;
    a = v;
    LT_CHECK_OK(lm_tensor_view_split_axis(&a, 2, 2, hd, &a));
    LT_CHECK(check_elements("split in place", &a, e_split));
    LT_CHECK_OK(lm_tensor_view_merge_axes(&a, 2, 2, &a));
    LT_CHECK(check_elements("merge in place", &a, e_merged));
    a = v;
    LT_CHECK_OK(lm_tensor_view_permute(&v, perm, &ref));
    LT_CHECK_OK(lm_tensor_view_permute(&a, perm, &a));
    LT_CHECK(memcmp(&a, &ref, sizeof a) == 0);
    a = v;
    LT_CHECK_OK(lm_tensor_view_transpose(&v, 0, 2, &ref));
    LT_CHECK_OK(lm_tensor_view_transpose(&a, 0, 2, &a));
    LT_CHECK(memcmp(&a, &ref, sizeof a) == 0);
    a = v;
    LT_CHECK_OK(lm_tensor_view_slice(&v, 2, 1, 12, 2, &ref));
    LT_CHECK_OK(lm_tensor_view_slice(&a, 2, 1, 12, 2, &a));
    LT_CHECK(memcmp(&a, &ref, sizeof a) == 0);
    a = v;
    LT_CHECK_OK(lm_tensor_view_select(&v, 1, 2, &ref));
    LT_CHECK_OK(lm_tensor_view_select(&a, 1, 2, &a));
    LT_CHECK(memcmp(&a, &ref, sizeof a) == 0);
    a = v;
    LT_CHECK_OK(lm_tensor_view_reshape(&a, 1, flat, &a));
    LT_CHECK(a.ndim == 1 && a.shape[0] == 72 && a.data == v.data);
    a = v;
    LT_CHECK_OK(lm_tensor_view_expand(&v, 4, to, &ref));
    LT_CHECK_OK(lm_tensor_view_expand(&a, 4, to, &a));
    LT_CHECK(memcmp(&a, &ref, sizeof a) == 0);
}

/* ---- overlaps_self -------------------------------------------------------------------- */
/* 1 if two index tuples of v reach the same element (brute force). */
static int really_overlaps(const lm_tensor_view *v) {
    int64_t n = lm_tensor_view_numel(v), idx[LM_MAX_DIMS] = {0}, ext = lm_tensor_view_extent(v);
    unsigned char *seen = calloc((size_t)(ext ? ext : 1), 1);
    int dup = 0;
    for (int64_t i = 0; i < n && !dup; i++, next_index(v->ndim, v->shape, idx)) {
        int64_t off = 0;
        for (int d = 0; d < v->ndim; d++) off += idx[d] * v->stride[d];
        dup = seen[off]++ != 0;
    }
    free(seen);
    return dup;
}

static void test_overlaps_self_on_named_layouts(void) {
    int64_t s[3] = {3, 4, 5}, one[2] = {1, 4}, to[2] = {3, 4}, bto[2] = {1, 4};
    lm_tensor_view v = iota_view(3, s), t;
    LT_CHECK(!lm_tensor_view_overlaps_self(&v));
    LT_CHECK_OK(lm_tensor_view_transpose(&v, 0, 2, &t));
    LT_CHECK(!lm_tensor_view_overlaps_self(&t));
    LT_CHECK_OK(lm_tensor_view_slice(&v, 2, 0, 5, 2, &t));
    LT_CHECK(!lm_tensor_view_overlaps_self(&t));
    LT_CHECK_OK(lm_tensor_view_select(&v, 1, 3, &t));
    LT_CHECK(!lm_tensor_view_overlaps_self(&t));
    lm_tensor_view r = iota_view(2, one);
    LT_CHECK_OK(lm_tensor_view_expand(&r, 2, to, &t)); /* rows repeat */
    LT_CHECK(lm_tensor_view_overlaps_self(&t));
    LT_CHECK_OK(lm_tensor_view_expand(&r, 2, bto, &t)); /* size-1 broadcast: still one element each */
    LT_CHECK(!lm_tensor_view_overlaps_self(&t));
    const int64_t sh[2] = {2, 3}, st_interleave[2] = {2, 1}, sq[2] = {3, 3}, st_ones[2] = {1, 1};
    const int64_t st_zero[2] = {0, 1}, empty[2] = {0, 3};
    LT_CHECK_OK(lm_tensor_view_init(&t, g_buf, LM_F32, lm_device_cpu(), 2, sh, st_interleave));
    LT_CHECK(lm_tensor_view_overlaps_self(&t));
    LT_CHECK_OK(lm_tensor_view_init(&t, g_buf, LM_F32, lm_device_cpu(), 2, sq, st_ones));
    LT_CHECK(lm_tensor_view_overlaps_self(&t));
    LT_CHECK_OK(lm_tensor_view_init(&t, g_buf, LM_F32, lm_device_cpu(), 2, empty, st_zero));
    LT_CHECK(!lm_tensor_view_overlaps_self(&t));
    LT_CHECK_OK(lm_tensor_view_init(&t, g_buf, LM_F32, lm_device_cpu(), 0, NULL, NULL));
    LT_CHECK(!lm_tensor_view_overlaps_self(&t));
}

static void test_overlaps_self_exact_on_transform_layouts_and_sound_on_random(void) {
    lt_rng r = lt_rng_seed(41);
    int missed = 0, false_alarm = 0;
    for (int trial = 0; trial < 400; trial++) {
        /* views built by permute + slice from a contiguous source never overlap */
        int nd = (int)lt_rng_int(&r, 1, 4);
        int64_t s[LM_MAX_DIMS];
        for (int d = 0; d < nd; d++) s[d] = lt_rng_int(&r, 1, 5);
        lm_tensor_view v = iota_view(nd, s);
        int perm[LM_MAX_DIMS];
        for (int d = 0; d < nd; d++) perm[d] = d;
        for (int d = nd - 1; d > 0; d--) {
            int j = (int)lt_rng_int(&r, 0, d), tmp = perm[d];
            perm[d] = perm[j];
            perm[j] = tmp;
        }
        lm_tensor_view_permute(&v, perm, &v);
        int d = (int)lt_rng_int(&r, 0, nd - 1);
        int64_t start = lt_rng_int(&r, 0, v.shape[d] - 1);
        lm_tensor_view_slice(&v, d, start, v.shape[d], lt_rng_int(&r, 1, 3), &v);
        if (lm_tensor_view_overlaps_self(&v)) false_alarm++;
        /* random strides: a "no overlap" answer must be true */
        lm_tensor_view w;
        int64_t st[LM_MAX_DIMS];
        for (int k = 0; k < nd; k++) st[k] = lt_rng_int(&r, 0, 12);
        lm_tensor_view_init(&w, g_buf, LM_F32, lm_device_cpu(), nd, s, st);
        int says = lm_tensor_view_overlaps_self(&w), truth = really_overlaps(&w);
        if (!says && truth) missed++;
        if (!truth && says && nd <= 1) false_alarm++; /* one axis: exact */
    }
    LT_CHECK_MSG(missed == 0, "%d overlapping layouts reported as disjoint", missed);
    LT_CHECK_MSG(false_alarm == 0, "%d disjoint transform layouts reported as overlapping", false_alarm);
}

int main(void) {
    LT_RUN(test_init_validates_shape_and_strides);
    LT_RUN(test_contiguity_and_extent);
    LT_RUN(test_reshape_needs_contiguous_input);
    LT_RUN(test_transpose_permute_address_right_elements);
    LT_RUN(test_slice_and_select_address_right_elements);
    LT_RUN(test_split_and_merge_heads);
    LT_RUN(test_merge_needs_nesting_axes);
    LT_RUN(test_expand_broadcasts_with_zero_strides);
    LT_RUN(test_out_may_alias_input);
    LT_RUN(test_overlaps_self_on_named_layouts);
    LT_RUN(test_overlaps_self_exact_on_transform_layouts_and_sound_on_random);
    return lt_finish();
}
