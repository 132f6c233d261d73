/* loom/tensor.h — dtypes, Storage, Tensor and TensorView.
 *
 * Invariants (the "N0" contract):
 *  - Storage owns one host or device allocation with a reference count.
 *  - Tensor = metadata + one Storage reference; TensorView = metadata + raw pointer,
 *    owning nothing: it is the operator seam.
 *  - Shape {} (ndim 0) is a scalar with one element; zero-sized dimensions are valid;
 *    negative dimensions and negative strides are rejected. Strides and offsets are
 *    in elements. A stride of 0 (a broadcast view) is allowed for inputs.
 *  - A tensor's view lies entirely inside its Storage (checked at construction).
 *  - reshape needs a contiguous input and is zero-copy; transpose, permute, slice
 *    (positive step), split_axis and merge_axes are zero-copy; contiguous()
 *    materializes logical order. Nothing converts dtype or device implicitly.
 */
#ifndef LOOM_TENSOR_H
#define LOOM_TENSOR_H

#include "loom/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LM_MAX_DIMS 8

/* Public enum: grows only at the end. */
/* LM_I8: signed bytes, the storage of int8-quantized weights (their scales are a
 * separate f32 tensor). */
/* LM_F8_E4M3: fp8 e4m3 (the OCP "E4M3FN" of safetensors' F8_E4M3: 1 sign, 4 exponent
 * bits of bias 7, 3 mantissa bits, no infinities, S.1111.111 is NaN, largest finite
 * 448), the storage of fp8-quantized weights (their f32 per-row scales are separate). */
typedef enum lm_dtype {
    LM_F32 = 0,
    LM_BF16 = 1,
    LM_F16 = 2,
    LM_I32 = 3,
    LM_I64 = 4,
    LM_U8 = 5,
    LM_I8 = 6,
    LM_F8_E4M3 = 7
} lm_dtype;
#define LM_DTYPE_COUNT 8

LM_API size_t lm_dtype_size(lm_dtype dt);       /* bytes per element; 0 for invalid */
LM_API const char *lm_dtype_name(lm_dtype dt);  /* "f32", "bf16", ...; "invalid" otherwise */
LM_API int lm_dtype_is_float(lm_dtype dt);      /* f32, bf16, f16 */
LM_API int lm_dtype_valid(lm_dtype dt);
LM_API lm_status lm_dtype_parse(const char *name, lm_dtype *out); /* accepts lm_dtype_name() */

/* Round-to-nearest-even conversions; NaN stays NaN (quiet), overflow goes to inf. */
LM_API uint16_t lm_f32_to_bf16(float x);
LM_API float lm_bf16_to_f32(uint16_t x);
LM_API uint16_t lm_f32_to_f16(float x);
LM_API float lm_f16_to_f32(uint16_t x);
/* fp8 e4m3 (LM_F8_E4M3): decoding is exact (a 256-entry table; 0x7f/0xff are NaN);
 * encoding rounds to nearest, ties to even, saturates finite values beyond 448 (and
 * +-inf) to +-448, and maps NaN to 0x7f (sign kept). */
LM_API float lm_f8e4m3_to_f32(uint8_t x);
LM_API uint8_t lm_f32_to_f8e4m3(float x);

/* ---- Storage ------------------------------------------------------------------ */
typedef struct lm_storage lm_storage;
typedef void (*lm_release_fn)(void *user, void *data);

/* New allocation of nbytes on device, refcount 1, contents uninitialized. */
LM_API lm_status lm_storage_create(lm_device device, size_t nbytes, lm_storage **out);
/* Wraps external memory (e.g. a mapped file); release(user, data) runs when the last
 * reference goes (release may be NULL for memory that outlives the storage). */
LM_API lm_status lm_storage_wrap(lm_device device, void *data, size_t nbytes, lm_release_fn release, void *user,
                                 lm_storage **out);
LM_API lm_storage *lm_storage_retain(lm_storage *s);  /* returns s; accepts NULL */
LM_API void lm_storage_release(lm_storage *s);        /* drops one reference; accepts NULL */
LM_API void *lm_storage_data(const lm_storage *s);
LM_API size_t lm_storage_nbytes(const lm_storage *s);
LM_API lm_device lm_storage_device(const lm_storage *s);
LM_API int lm_storage_refcount(const lm_storage *s);

/* ---- TensorView: metadata + pointer, owns nothing ------------------------------- */
typedef struct lm_tensor_view {
    void *data; /* address of element [0,...,0]; may be NULL when numel == 0 */
    lm_dtype dtype;
    lm_device device;
    int ndim;                      /* 0..LM_MAX_DIMS; 0 = scalar */
    int64_t shape[LM_MAX_DIMS];    /* >= 0 */
    int64_t stride[LM_MAX_DIMS];   /* elements, >= 0 */
} lm_tensor_view;

/* strides == NULL means contiguous row-major. Validates ndim, dims and strides:
 * LM_INVALID_ARGUMENT for bad values, LM_OUT_OF_RANGE when the extent overflows int64. */
LM_API lm_status lm_tensor_view_init(lm_tensor_view *v, void *data, lm_dtype dtype, lm_device device, int ndim,
                                     const int64_t *shape, const int64_t *strides);
LM_API int64_t lm_tensor_view_numel(const lm_tensor_view *v);
LM_API int lm_tensor_view_is_contiguous(const lm_tensor_view *v); /* 1 for any empty view */
/* Span in elements from element 0 to the last element, plus one (0 if empty). */
LM_API int64_t lm_tensor_view_extent(const lm_tensor_view *v);
/* 1 if two distinct index tuples can reach the same element (a 0 stride on a
 * dimension > 1, or strides that interleave). Outputs must not overlap. */
LM_API int lm_tensor_view_overlaps_self(const lm_tensor_view *v);

/* Zero-copy view transforms; out may equal v. One shape entry of reshape may be -1. */
LM_API lm_status lm_tensor_view_reshape(const lm_tensor_view *v, int ndim, const int64_t *shape, lm_tensor_view *out);
LM_API lm_status lm_tensor_view_transpose(const lm_tensor_view *v, int d0, int d1, lm_tensor_view *out);
LM_API lm_status lm_tensor_view_permute(const lm_tensor_view *v, const int *perm, lm_tensor_view *out);
/* Elements start, start+step, ... < stop along dim; 0 <= start <= stop <= shape, step >= 1. */
LM_API lm_status lm_tensor_view_slice(const lm_tensor_view *v, int dim, int64_t start, int64_t stop, int64_t step,
                                      lm_tensor_view *out);
/* Removes dim by fixing it at index. */
LM_API lm_status lm_tensor_view_select(const lm_tensor_view *v, int dim, int64_t index, lm_tensor_view *out);
/* Splits dim into nfactors dims whose product is shape[dim] ([B,T,H*D] -> [B,T,H,D]);
 * one factor may be -1. Always zero-copy. */
LM_API lm_status lm_tensor_view_split_axis(const lm_tensor_view *v, int dim, int nfactors, const int64_t *factors,
                                           lm_tensor_view *out);
/* Merges dims [dim, dim+count) into one ([B,T,H,D] -> [B,T,H*D]). LM_UNSUPPORTED when
 * their strides do not nest (materialize with contiguous first). */
LM_API lm_status lm_tensor_view_merge_axes(const lm_tensor_view *v, int dim, int count, lm_tensor_view *out);
/* Broadcast view to shape (numpy rules, stride 0 on expanded dims). Input only. */
LM_API lm_status lm_tensor_view_expand(const lm_tensor_view *v, int ndim, const int64_t *shape, lm_tensor_view *out);

/* ---- Tensor: metadata + a Storage reference ------------------------------------ */
typedef struct lm_tensor lm_tensor;

/* New contiguous tensor on device, contents uninitialized. Caller owns *out. */
LM_API lm_status lm_tensor_create(lm_device device, lm_dtype dtype, int ndim, const int64_t *shape, lm_tensor **out);
/* As lm_tensor_create, filled with zero bytes. */
LM_API lm_status lm_tensor_zeros(lm_device device, lm_dtype dtype, int ndim, const int64_t *shape, lm_tensor **out);
/* New contiguous tensor on device holding a copy of numel elements at host_data. */
LM_API lm_status lm_tensor_from_host(lm_device device, lm_dtype dtype, int ndim, const int64_t *shape,
                                     const void *host_data, lm_tensor **out);
/* A tensor over existing storage (takes a new reference; the caller keeps its own).
 * strides == NULL means contiguous. LM_OUT_OF_RANGE unless the view lies inside. */
LM_API lm_status lm_tensor_from_storage(lm_storage *s, lm_dtype dtype, int ndim, const int64_t *shape,
                                        const int64_t *strides, int64_t offset, lm_tensor **out);
/* Zero-copy: a tensor over caller memory (host or device pointer) that every operator
 * accepts. data is element [0,...,0]; strides in elements (NULL = contiguous row-major,
 * 0 = broadcast, which outputs refuse). release(user, data) runs exactly once, when
 * the last tensor sharing this memory (derived views included) is destroyed; release
 * may be NULL for memory that outlives them. On failure release is not called and the
 * caller keeps the memory. loom cannot check that data lies on device: the caller
 * vouches for it, and for the extent the strides reach. Errors (LM_INVALID_ARGUMENT
 * unless said): out NULL, an invalid dtype, an unknown device type (LM_UNSUPPORTED
 * for a type this build lacks, LM_DEVICE_ERROR for a missing ordinal), ndim outside
 * 0..LM_MAX_DIMS, a negative dim or stride, an element count beyond int64, NULL data
 * with elements, data not aligned to the element size; LM_OUT_OF_RANGE for strides that
 * reach beyond int64 elements or the address space. */
LM_API lm_status lm_tensor_wrap(lm_device device, void *data, lm_dtype dtype, int ndim, const int64_t *shape,
                                const int64_t *strides, lm_release_fn release, void *user, lm_tensor **out);
LM_API void lm_tensor_destroy(lm_tensor *t); /* accepts NULL; releases its storage reference */

/* Borrowed metadata, valid while t lives. */
LM_API const lm_tensor_view *lm_tensor_as_view(const lm_tensor *t);
LM_API lm_storage *lm_tensor_storage(const lm_tensor *t); /* borrowed */
LM_API int64_t lm_tensor_offset(const lm_tensor *t);      /* elements from storage start */
LM_API void *lm_tensor_data(const lm_tensor *t);          /* address of element [0,...,0] */
LM_API int lm_tensor_ndim(const lm_tensor *t);
LM_API int64_t lm_tensor_dim(const lm_tensor *t, int i); /* negative i counts from the end */
LM_API int64_t lm_tensor_numel(const lm_tensor *t);
LM_API lm_dtype lm_tensor_dtype(const lm_tensor *t);
LM_API lm_device lm_tensor_device(const lm_tensor *t);

/* Zero-copy derived tensors sharing t's storage. Caller owns *out. */
LM_API lm_status lm_tensor_reshape(const lm_tensor *t, int ndim, const int64_t *shape, lm_tensor **out);
LM_API lm_status lm_tensor_transpose(const lm_tensor *t, int d0, int d1, lm_tensor **out);
LM_API lm_status lm_tensor_permute(const lm_tensor *t, const int *perm, lm_tensor **out);
LM_API lm_status lm_tensor_slice(const lm_tensor *t, int dim, int64_t start, int64_t stop, int64_t step, lm_tensor **out);
LM_API lm_status lm_tensor_split_axis(const lm_tensor *t, int dim, int nfactors, const int64_t *factors, lm_tensor **out);
LM_API lm_status lm_tensor_merge_axes(const lm_tensor *t, int dim, int count, lm_tensor **out);
/* A tensor over t's storage with the metadata of view v, which must lie inside it. */
LM_API lm_status lm_tensor_from_view(const lm_tensor *t, const lm_tensor_view *v, lm_tensor **out);

/* Same logical contents in row-major order. If t is already contiguous the result
 * shares its storage (zero-copy); otherwise it is materialized on t's device. */
LM_API lm_status lm_tensor_contiguous(lm_ctx *ctx, const lm_tensor *t, lm_tensor **out);
/* A contiguous copy of t on device (any pair of devices). Caller owns *out. */
LM_API lm_status lm_tensor_to_device(lm_ctx *ctx, const lm_tensor *t, lm_device device, lm_tensor **out);
/* Copies src into dst element by element (same dtype and shape, any strides, same
 * device, or both contiguous across devices). Strided views on a CUDA device need a
 * CUDA ctx of that device; copies within that device are queued on ctx's stream. dst must not overlap itself, and dst
 * and src must be the same view or not overlap at all. */
LM_API lm_status lm_tensor_view_copy(lm_ctx *ctx, const lm_tensor_view *dst, const lm_tensor_view *src);
/* Copies to/from contiguous host memory of numel elements. */
LM_API lm_status lm_tensor_view_read(lm_ctx *ctx, const lm_tensor_view *src, void *host_dst);
LM_API lm_status lm_tensor_view_write(lm_ctx *ctx, const lm_tensor_view *dst, const void *host_src);
/* Fills every element with NaN (floats) or 0xA5 bytes (integers): test poisoning. */
LM_API lm_status lm_tensor_view_poison(lm_ctx *ctx, const lm_tensor_view *v);

#ifdef __cplusplus
}
#endif
#endif
