/* io/internal.h — helpers shared by the io layer (never installed).
 *
 * JSON goes through jansson; lm__io_json_parse turns its error record (line, column,
 * text) into an LM_PARSE_ERROR that names the source. Paths built here are owned by
 * the caller and freed with lm__free.
 */
#ifndef LOOM_IO_INTERNAL_H
#define LOOM_IO_INTERNAL_H

#include "base/internal.h"
#include "loom/safetensors.h"

#include <jansson.h>

/* "dir/name" from the allocation hook, or NULL (LM_OUT_OF_MEMORY recorded). */
char *lm__io_path_join(const char *dir, const char *name);
/* 1 if path names an existing regular file, 0 otherwise (including errors). */
int lm__io_is_file(const char *path);
/* Parses len bytes of JSON, rejecting duplicate keys. On failure: LM_PARSE_ERROR
 * "<what> '<source>' is not valid JSON: line L, column C: <jansson text>". The caller
 * owns *out (json_decref). */
lm_status lm__io_json_parse(const char *text, size_t len, const char *what, const char *source, json_t **out);
/* Writes "[d0, d1, ...]" into buf (always NUL-terminated); returns buf. */
const char *lm__io_shape_str(int ndim, const int64_t *shape, char *buf, size_t size);

/* safetensors internals the checkpoint layer builds on. Index order is by name. */
int64_t lm__safetensors_lookup(const lm_safetensors *st, const char *name); /* -1 if absent */
const char *lm__safetensors_name(const lm_safetensors *st, int64_t i);
lm_status lm__safetensors_tensor_at(const lm_safetensors *st, int64_t i, lm_tensor **out);

#endif
