/* core/view.c — TensorView construction and zero-copy transforms.
 *
 * Every function here is metadata-only: it validates arguments, fills *out and
 * touches no element. A transform of a view that lies inside its storage yields a
 * view that lies inside it too, so bounds are only checked where a view is built
 * from raw numbers (lm_tensor_from_storage / lm_tensor_from_view). view_init rejects
 * layouts whose extent does not fit in int64, so index arithmetic cannot overflow.
 * out may alias the input: results are built in a local copy first.
 */
#include "base/internal.h"
#include "loom/tensor.h"

#include <string.h>

static lm_status check_dims(int ndim, const int64_t *shape, const int64_t *strides) {
    if (ndim < 0 || ndim > LM_MAX_DIMS)
        return lm__error(LM_INVALID_ARGUMENT, "ndim %d outside [0, %d]", ndim, LM_MAX_DIMS);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return lm__error(LM_INVALID_ARGUMENT, "negative dimension %lld at axis %d", (long long)shape[i], i);
        if (strides && strides[i] < 0)
            return lm__error(LM_INVALID_ARGUMENT, "negative stride %lld at axis %d", (long long)strides[i], i);
    }
    return LM_OK;
}

/* numel with overflow check against INT64_MAX */
static lm_status checked_numel(int ndim, const int64_t *shape, int64_t *out) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] != 0 && n > INT64_MAX / shape[i])
            return lm__error(LM_INVALID_ARGUMENT, "element count overflows int64");
        n *= shape[i];
    }
    *out = n;
    return LM_OK;
}

/* 1 if a * b fits in int64 (a, b >= 0). */
static int mul_fits(int64_t a, int64_t b) { return b == 0 || a <= INT64_MAX / b; }

/* 1 if the view's extent, sum((shape-1)*stride) + 1 elements, fits in int64, so
 * index arithmetic on any view built here cannot overflow. */
static int span_fits(const lm_tensor_view *r) {
    int64_t limit = INT64_MAX - 1, span = 0;
    for (int i = 0; i < r->ndim; i++)
        if (r->shape[i] == 0) return 1;
    for (int i = 0; i < r->ndim; i++) {
        int64_t n = r->shape[i] - 1;
        if (n && r->stride[i] > (limit - span) / n) return 0;
        span += n * r->stride[i];
    }
    return 1;
}

lm_status lm_tensor_view_init(lm_tensor_view *v, void *data, lm_dtype dtype, lm_device device, int ndim,
                              const int64_t *shape, const int64_t *strides) {
    if (!v || (ndim > 0 && !shape)) return lm__error(LM_INVALID_ARGUMENT, "lm_tensor_view_init: NULL argument");
    if (!lm_dtype_valid(dtype)) return lm__error(LM_INVALID_ARGUMENT, "invalid dtype %d", (int)dtype);
    LM_TRY(check_dims(ndim, shape, strides));
    int64_t n = 0;
    LM_TRY(checked_numel(ndim, shape, &n));
    lm_tensor_view r;
    memset(&r, 0, sizeof r);
    r.data = data;
    r.dtype = dtype;
    r.device = device;
    r.ndim = ndim;
    int64_t st = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        r.shape[i] = shape[i];
        r.stride[i] = strides ? strides[i] : st;
        int64_t dim = shape[i] ? shape[i] : 1; /* an empty view still gets distinct strides */
        if (i > 0 && !strides && !mul_fits(st, dim))
            return lm__error(LM_INVALID_ARGUMENT, "contiguous strides of a %d-d shape overflow int64", ndim);
        st *= dim;
    }
    if (!span_fits(&r))
        return lm__error(LM_OUT_OF_RANGE, "view spans more than 2^63 elements (stride too large for its shape)");
    if (n > 0 && !data) return lm__error(LM_INVALID_ARGUMENT, "NULL data for a view of %lld elements", (long long)n);
    *v = r;
    return LM_OK;
}

int64_t lm_tensor_view_numel(const lm_tensor_view *v) {
    int64_t n = 1;
    for (int i = 0; i < v->ndim; i++) n *= v->shape[i];
    return n;
}

int lm_tensor_view_is_contiguous(const lm_tensor_view *v) {
    for (int i = 0; i < v->ndim; i++)
        if (v->shape[i] == 0) return 1; /* no elements: any strides will do */
    int64_t st = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        if (v->shape[i] != 1 && v->stride[i] != st) return 0;
        st *= v->shape[i];
    }
    return 1;
}

int64_t lm_tensor_view_extent(const lm_tensor_view *v) {
    int64_t last = 0;
    for (int i = 0; i < v->ndim; i++) {
        if (v->shape[i] == 0) return 0;
        last += (v->shape[i] - 1) * v->stride[i];
    }
    return last + 1;
}

int lm_tensor_view_overlaps_self(const lm_tensor_view *v) {
    /* Sort the dims of size > 1 by stride; the layout is injective if each stride is
     * at least the span of all smaller-stride dims (sufficient, and exact for the
     * layouts views can produce). */
    int idx[LM_MAX_DIMS], n = 0;
    for (int i = 0; i < v->ndim; i++) {
        if (v->shape[i] == 0) return 0;
        if (v->shape[i] > 1) idx[n++] = i;
    }
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && v->stride[idx[b]] < v->stride[idx[b - 1]]; b--) {
            int t = idx[b];
            idx[b] = idx[b - 1];
            idx[b - 1] = t;
        }
    int64_t span = 1; /* elements covered by the smaller dims */
    for (int a = 0; a < n; a++) {
        int64_t s = v->stride[idx[a]];
        if (s < span) return 1;
        span = s * (v->shape[idx[a]] - 1) + span;
    }
    return 0;
}

static lm_status check_axis(const lm_tensor_view *v, int *dim, const char *what) {
    int d = *dim < 0 ? *dim + v->ndim : *dim;
    if (d < 0 || d >= v->ndim)
        return lm__error(LM_OUT_OF_RANGE, "%s: axis %d out of range for %d-d view", what, *dim, v->ndim);
    *dim = d;
    return LM_OK;
}

lm_status lm_tensor_view_reshape(const lm_tensor_view *v, int ndim, const int64_t *shape, lm_tensor_view *out) {
    if (ndim < 0 || ndim > LM_MAX_DIMS) return lm__error(LM_INVALID_ARGUMENT, "reshape: ndim %d outside [0, %d]", ndim, LM_MAX_DIMS);
    if (!lm_tensor_view_is_contiguous(v))
        return lm__error(LM_UNSUPPORTED, "reshape needs a contiguous view (call lm_tensor_contiguous first)");
    int64_t n = lm_tensor_view_numel(v), known = 1, dims[LM_MAX_DIMS];
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        dims[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0) return lm__error(LM_INVALID_ARGUMENT, "reshape: more than one -1 in the shape");
            infer = i;
        } else if (shape[i] < 0) {
            return lm__error(LM_INVALID_ARGUMENT, "reshape: negative dimension %lld", (long long)shape[i]);
        } else {
            if (shape[i] && known > INT64_MAX / shape[i]) return lm__error(LM_INVALID_ARGUMENT, "reshape: size overflow");
            known *= shape[i];
        }
    }
    if (infer >= 0) {
        if (known == 0 || n % known != 0)
            return lm__error(LM_SHAPE_MISMATCH, "reshape: cannot infer -1 for %lld elements", (long long)n);
        dims[infer] = n / known;
        known = n;
    }
    if (known != n)
        return lm__error(LM_SHAPE_MISMATCH, "reshape: %lld elements cannot take a shape of %lld", (long long)n, (long long)known);
    return lm_tensor_view_init(out, v->data, v->dtype, v->device, ndim, dims, NULL);
}

lm_status lm_tensor_view_permute(const lm_tensor_view *v, const int *perm, lm_tensor_view *out) {
    lm_tensor_view r = *v;
    int seen[LM_MAX_DIMS] = {0};
    for (int i = 0; i < v->ndim; i++) {
        int p = perm[i];
        if (p < 0 || p >= v->ndim || seen[p])
            return lm__error(LM_INVALID_ARGUMENT, "permute: entry %d (%d) is not a permutation of %d axes", i, p, v->ndim);
        seen[p] = 1;
        r.shape[i] = v->shape[p];
        r.stride[i] = v->stride[p];
    }
    *out = r;
    return LM_OK;
}

lm_status lm_tensor_view_transpose(const lm_tensor_view *v, int d0, int d1, lm_tensor_view *out) {
    LM_TRY(check_axis(v, &d0, "transpose"));
    LM_TRY(check_axis(v, &d1, "transpose"));
    int perm[LM_MAX_DIMS];
    for (int i = 0; i < v->ndim; i++) perm[i] = i;
    perm[d0] = d1;
    perm[d1] = d0;
    return lm_tensor_view_permute(v, perm, out);
}

lm_status lm_tensor_view_slice(const lm_tensor_view *v, int dim, int64_t start, int64_t stop, int64_t step,
                               lm_tensor_view *out) {
    LM_TRY(check_axis(v, &dim, "slice"));
    if (step < 1) return lm__error(LM_INVALID_ARGUMENT, "slice: step %lld must be >= 1", (long long)step);
    if (start < 0 || stop < start || stop > v->shape[dim])
        return lm__error(LM_OUT_OF_RANGE, "slice [%lld:%lld] outside axis %d of size %lld", (long long)start,
                         (long long)stop, dim, (long long)v->shape[dim]);
    lm_tensor_view r = *v;
    int64_t len = stop == start ? 0 : 1 + (stop - start - 1) / step; /* no overflow for huge steps */
    if (len > 0) r.data = (char *)v->data + start * v->stride[dim] * (int64_t)lm_dtype_size(v->dtype);
    r.shape[dim] = len;
    /* with two or more picks, step < shape and the new stride stays inside the span */
    r.stride[dim] = len > 1 ? v->stride[dim] * step : v->stride[dim];
    *out = r;
    return LM_OK;
}

lm_status lm_tensor_view_select(const lm_tensor_view *v, int dim, int64_t index, lm_tensor_view *out) {
    LM_TRY(check_axis(v, &dim, "select"));
    if (index < 0 || index >= v->shape[dim])
        return lm__error(LM_OUT_OF_RANGE, "select: index %lld outside axis %d of size %lld", (long long)index, dim,
                         (long long)v->shape[dim]);
    lm_tensor_view r = *v;
    r.data = (char *)v->data + index * v->stride[dim] * (int64_t)lm_dtype_size(v->dtype);
    for (int i = dim; i < v->ndim - 1; i++) {
        r.shape[i] = v->shape[i + 1];
        r.stride[i] = v->stride[i + 1];
    }
    r.ndim = v->ndim - 1;
    r.shape[r.ndim] = r.stride[r.ndim] = 0;
    *out = r;
    return LM_OK;
}

lm_status lm_tensor_view_split_axis(const lm_tensor_view *v, int dim, int nfactors, const int64_t *factors,
                                    lm_tensor_view *out) {
    LM_TRY(check_axis(v, &dim, "split_axis"));
    if (nfactors < 1 || v->ndim - 1 + nfactors > LM_MAX_DIMS)
        return lm__error(LM_INVALID_ARGUMENT, "split_axis: %d factors do not fit in %d dims", nfactors, LM_MAX_DIMS);
    int64_t f[LM_MAX_DIMS], known = 1, n = v->shape[dim];
    int infer = -1;
    for (int i = 0; i < nfactors; i++) {
        f[i] = factors[i];
        if (f[i] == -1 && infer < 0) infer = i;
        else if (f[i] < 0) return lm__error(LM_INVALID_ARGUMENT, "split_axis: bad factor %lld", (long long)f[i]);
        else if (!mul_fits(known, f[i])) return lm__error(LM_SHAPE_MISMATCH, "split_axis: factors overflow int64");
        else known *= f[i];
    }
    if (infer >= 0) {
        if (known == 0 || n % known) return lm__error(LM_SHAPE_MISMATCH, "split_axis: cannot infer -1 for size %lld", (long long)n);
        f[infer] = n / known;
        known = n;
    }
    if (known != n)
        return lm__error(LM_SHAPE_MISMATCH, "split_axis: factors multiply to %lld, axis %d has size %lld", (long long)known,
                         dim, (long long)n);
    lm_tensor_view r = *v;
    int64_t st = v->stride[dim];
    for (int i = nfactors - 1; i >= 0; i--) {
        r.shape[dim + i] = f[i];
        r.stride[dim + i] = st;
        if (i > 0 && !mul_fits(st, f[i])) /* absurd layouts only: strides near 2^63 */
            return lm__error(LM_SHAPE_MISMATCH, "split_axis: factor strides overflow int64");
        st *= f[i];
    }
    for (int i = dim + 1; i < v->ndim; i++) {
        r.shape[i + nfactors - 1] = v->shape[i];
        r.stride[i + nfactors - 1] = v->stride[i];
    }
    r.ndim = v->ndim + nfactors - 1;
    *out = r;
    return LM_OK;
}

lm_status lm_tensor_view_merge_axes(const lm_tensor_view *v, int dim, int count, lm_tensor_view *out) {
    LM_TRY(check_axis(v, &dim, "merge_axes"));
    if (count < 1 || dim + count > v->ndim)
        return lm__error(LM_OUT_OF_RANGE, "merge_axes: axes [%d, %d) outside %d-d view", dim, dim + count, v->ndim);
    int64_t size = 1;
    for (int i = dim; i < dim + count; i++) size *= v->shape[i];
    /* The merged axis keeps the stride of its innermost axis of size > 1; every
     * outer axis of size > 1 must step over exactly the axes inside it. Axes of
     * size 1 have no meaningful stride; an empty range merges trivially. */
    int64_t stride = 1, expect = -1;
    for (int i = dim + count - 1; i >= dim && size > 0; i--) {
        if (v->shape[i] == 1) continue;
        if (expect < 0) {
            stride = v->stride[i];
        } else if (v->stride[i] != expect) {
            return lm__error(LM_UNSUPPORTED, "merge_axes: axes %d..%d do not nest in memory (materialize with contiguous)",
                             dim, dim + count - 1);
        }
        expect = v->stride[i] * v->shape[i];
    }
    lm_tensor_view r = *v;
    r.shape[dim] = size;
    r.stride[dim] = stride;
    for (int i = dim + count; i < v->ndim; i++) {
        r.shape[i - count + 1] = v->shape[i];
        r.stride[i - count + 1] = v->stride[i];
    }
    r.ndim = v->ndim - count + 1;
    for (int i = r.ndim; i < LM_MAX_DIMS; i++) r.shape[i] = r.stride[i] = 0;
    *out = r;
    return LM_OK;
}

lm_status lm_tensor_view_expand(const lm_tensor_view *v, int ndim, const int64_t *shape, lm_tensor_view *out) {
    if (ndim < v->ndim || ndim > LM_MAX_DIMS)
        return lm__error(LM_SHAPE_MISMATCH, "expand: cannot broadcast %d-d view to %d dims", v->ndim, ndim);
    lm_tensor_view r = *v;
    int lead = ndim - v->ndim;
    for (int i = ndim - 1; i >= 0; i--) {
        int64_t want = shape[i];
        if (want < 0) return lm__error(LM_INVALID_ARGUMENT, "expand: negative dimension %lld", (long long)want);
        if (i < lead) {
            r.shape[i] = want;
            r.stride[i] = 0;
            continue;
        }
        int64_t have = v->shape[i - lead];
        if (have == want) {
            r.shape[i] = have;
            r.stride[i] = v->stride[i - lead];
        } else if (have == 1) {
            r.shape[i] = want;
            r.stride[i] = 0;
        } else {
            return lm__error(LM_SHAPE_MISMATCH, "expand: axis %d of size %lld cannot broadcast to %lld", i - lead,
                             (long long)have, (long long)want);
        }
    }
    r.ndim = ndim;
    *out = r;
    return LM_OK;
}
