/* loom/io_write.h — crash-safe file writes and the safetensors writer.
 *
 * Atomic writes: data goes to a temporary file beside the target (same directory, so
 * the final rename never crosses a filesystem), is flushed with fsync, then renamed
 * over the target, and the directory is fsynced so the rename itself is durable. A
 * reader therefore sees either the old file or the complete new one, never a torn
 * write; a crash leaves at most a stray "<name>.tmp-<pid>" file.
 *
 * The safetensors writer produces what lm_safetensors_open (and the Hugging Face
 * reader) accept: an 8-byte little-endian header length, a JSON header padded with
 * spaces to a multiple of 8 bytes (so every tensor's data is aligned to its element
 * size when tensors are ordered by decreasing alignment), then the tensors' bytes.
 */
#ifndef LOOM_IO_WRITE_H
#define LOOM_IO_WRITE_H

#include "loom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- atomic file -------------------------------------------------------------------- */
typedef struct lm_atomic_file lm_atomic_file;

/* Creates path's temporary sibling for writing. Errors: LM_IO_ERROR naming the file. */
LM_API lm_status lm_atomic_file_open(const char *path, lm_atomic_file **out);
LM_API lm_status lm_atomic_file_write(lm_atomic_file *f, const void *data, size_t n);
/* fsync, close, rename over path, fsync the directory; frees f (also on failure, when
 * the temporary file is removed). */
LM_API lm_status lm_atomic_file_commit(lm_atomic_file *f);
/* Removes the temporary file and frees f; accepts NULL. */
LM_API void lm_atomic_file_abort(lm_atomic_file *f);
/* The whole of data[0..n) to path, atomically. */
LM_API lm_status lm_file_write_atomic(const char *path, const void *data, size_t n);
/* fsync of a directory (after creating or renaming entries in it). */
LM_API lm_status lm_dir_sync(const char *dir);
/* Fault injection for tests: after `after` more successful lm_atomic_file_write calls
 * in this process (counted from this call, every file together), each later one fails
 * with errno err without writing, as a full disk (ENOSPC) or a failing device (EIO)
 * would; after < 0 turns injection off (the default). Process-wide. */
LM_API void lm_atomic_file_inject_fault(int64_t after, int err);

/* ---- safetensors ----------------------------------------------------------------------
 * Writes n tensors (any device: device tensors are copied to the host in chunks; any
 * strides: written in logical row-major order) named names[i], plus "__metadata__"
 * from the NULL-terminated key/value list meta (may be NULL), atomically to path.
 * Names must be distinct, non-empty, and shorter than 256 bytes; dtypes f32, bf16,
 * f16, i32, i64 or u8. Tensors are laid out in decreasing element size, then name
 * order, so each one's data is aligned to its element size. */
LM_API lm_status lm_safetensors_write(lm_ctx *ctx, const char *path, int n, const char *const *names,
                                      const lm_tensor_view *tensors, const char *const *meta);

#ifdef __cplusplus
}
#endif
#endif
