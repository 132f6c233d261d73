/* loom/safetensors.h — memory-mapped safetensors files and Hugging Face checkpoint
 * directories (one model.safetensors, or shards listed by model.safetensors.index.json).
 *
 * Format: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor
 * name to {"dtype", "shape", "data_offsets": [begin, end]} (byte offsets into the data
 * section that follows the header), and an optional "__metadata__" object of strings.
 * Opening validates the whole header (see lm_safetensors_open) before anything is
 * exposed, so every pointer handed out lies inside the mapping.
 *
 * Ownership: lm_safetensors and lm_checkpoint own a reference on each mapped file.
 * Tensors made by *_tensor() hold their own reference, so they stay valid after the
 * file or checkpoint is closed. Mapped memory is read-only: writing through a tensor
 * that aliases a mapping faults, and so does reading after the file was truncated in
 * place (replace checkpoints by writing a new file and renaming it). Open objects are
 * immutable and may be queried from several threads at once.
 */
#ifndef LOOM_SAFETENSORS_H
#define LOOM_SAFETENSORS_H

#include "loom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Header lengths above this are rejected as corrupt (the reference writer never
 * produces headers anywhere near it). */
#define LM_SAFETENSORS_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

/* One tensor of a safetensors file. Borrowed: valid while its file or checkpoint is
 * open. data may be unaligned for the dtype when the writer did not pad the header to
 * 8 bytes (the reference writer always does): read elements with memcpy, or use
 * lm_safetensors_tensor(), which always returns suitably aligned data. */
typedef struct lm_safetensors_entry {
    const char *name;       /* NUL-terminated tensor name */
    const char *dtype_name; /* the file's dtype string: "BF16", "F32", "F64", ... */
    lm_dtype dtype;         /* (lm_dtype)-1 when the dtype is not one loom supports */
    int ndim;               /* 0..LM_MAX_DIMS (0 with LM_UNSUPPORTED for larger ranks) */
    int64_t shape[LM_MAX_DIMS];
    const void *data; /* [nbytes] inside the read-only mapping */
    size_t nbytes;
    const char *file; /* path of the file that holds the tensor */
} lm_safetensors_entry;

/* ---- one file ------------------------------------------------------------------- */
typedef struct lm_safetensors lm_safetensors;

/* Maps path and validates its header. Each failure is LM_PARSE_ERROR with a detail
 * naming the file (and tensor): file shorter than 8 bytes; header length beyond the
 * file or above LM_SAFETENSORS_MAX_HEADER; header not JSON (jansson line/column/text),
 * not an object, or with duplicate keys; an entry that is not an object or lacks
 * dtype/shape/data_offsets; shape entries that are not non-negative integers;
 * data_offsets not [begin, end] integers with 0 <= begin <= end <= data section size;
 * end - begin != numel * dtype size; two non-empty tensors whose byte ranges overlap;
 * "__metadata__" that is not an object of strings. Tensors with a dtype loom does not
 * support (F64, I8, BOOL, ...) or more than LM_MAX_DIMS dimensions are still validated
 * and listed; only their info/find/tensor calls fail with LM_UNSUPPORTED. Gaps between
 * tensors and bytes after the last one are allowed. I/O failures are LM_IO_ERROR.
 * The caller owns *out: lm_safetensors_close. */
LM_API lm_status lm_safetensors_open(const char *path, lm_safetensors **out);
LM_API void lm_safetensors_close(lm_safetensors *st); /* accepts NULL */

LM_API const char *lm_safetensors_path(const lm_safetensors *st);
LM_API int64_t lm_safetensors_count(const lm_safetensors *st); /* tensors, "__metadata__" excluded */
/* Entries are ordered by name (strcmp). i outside [0, count) is LM_OUT_OF_RANGE.
 * LM_UNSUPPORTED (naming tensor, file and dtype string) for unsupported dtypes or
 * ranks; *entry is still filled (dtype = (lm_dtype)-1) so listings can show it. */
LM_API lm_status lm_safetensors_info(const lm_safetensors *st, int64_t i, lm_safetensors_entry *entry);
/* As info, by name; LM_NOT_FOUND naming the tensor and the file. */
LM_API lm_status lm_safetensors_find(const lm_safetensors *st, const char *name, lm_safetensors_entry *entry);
/* The "__metadata__" value for key, or NULL. Borrowed, valid while st is open. */
LM_API const char *lm_safetensors_metadata(const lm_safetensors *st, const char *key);
/* A contiguous CPU tensor of the named entry. Zero-copy over the mapping when the
 * data is aligned to its element size (always for files from the reference writer);
 * otherwise an aligned private copy, so typed element access is always safe. The
 * tensor keeps the mapping alive after lm_safetensors_close. Caller owns *out. */
LM_API lm_status lm_safetensors_tensor(const lm_safetensors *st, const char *name, lm_tensor **out);

/* ---- a checkpoint directory ------------------------------------------------------ */
typedef struct lm_checkpoint lm_checkpoint;

/* path is a directory holding model.safetensors or, failing that (the order
 * transformers uses), model.safetensors.index.json naming shards; or the path of one
 * .safetensors file. Errors:
 * LM_NOT_FOUND when the directory has neither file, or the index names a shard that
 * does not exist, or a tensor missing from the shard it is mapped to (each naming
 * tensor, shard and directory); LM_PARSE_ERROR for an index that is not JSON, lacks a
 * "weight_map" object, maps a name to a non-string or to a path that leaves the
 * directory; any lm_safetensors_open error of a shard. Tensors present in a shard but
 * absent from the weight map are not exposed (as in transformers). Caller owns *out. */
LM_API lm_status lm_checkpoint_open(const char *path, lm_checkpoint **out);
LM_API void lm_checkpoint_close(lm_checkpoint *ck); /* accepts NULL */

LM_API const char *lm_checkpoint_path(const lm_checkpoint *ck);
LM_API int64_t lm_checkpoint_count(const lm_checkpoint *ck);
/* Names ordered by strcmp, for iteration: i in [0, count), NULL otherwise. Borrowed. */
LM_API const char *lm_checkpoint_name(const lm_checkpoint *ck, int64_t i);
LM_API int lm_checkpoint_file_count(const lm_checkpoint *ck); /* 1 unless sharded */
/* LM_NOT_FOUND naming the tensor and the checkpoint path; LM_UNSUPPORTED as
 * lm_safetensors_info. */
LM_API lm_status lm_checkpoint_find(const lm_checkpoint *ck, const char *name, lm_safetensors_entry *entry);
/* As lm_safetensors_tensor; the tensor stays valid after lm_checkpoint_close. */
LM_API lm_status lm_checkpoint_tensor(const lm_checkpoint *ck, const char *name, lm_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
