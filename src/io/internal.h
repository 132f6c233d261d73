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
#include "loom/tokenizer.h"

#include <jansson.h>

/* "dir/name" from the allocation hook, or NULL (LM_OUT_OF_MEMORY recorded). */
char *lm__io_path_join(const char *dir, const char *name);
/* 0 if nothing is at path (stat says ENOENT or ENOTDIR), 1 otherwise: a file of any
 * kind, or one stat cannot see. Used to choose which file to open; opening it through
 * lm_file_read_all / lm_file_map_open then says what is wrong with it (a directory, a
 * FIFO, no permission), where "not a regular file" would read as "absent". stat never
 * opens the file, so it cannot block on a FIFO. */
int lm__io_exists(const char *path);
/* Parses len bytes of JSON, rejecting duplicate keys. On failure: LM_PARSE_ERROR
 * "<what> '<source>' is not valid JSON: line L, column C: <jansson text>". The caller
 * owns *out (json_decref). */
lm_status lm__io_json_parse(const char *text, size_t len, const char *what, const char *source, json_t **out);
/* Writes "[d0, d1, ...]" into buf (always NUL-terminated); returns buf. */
const char *lm__io_shape_str(int ndim, const int64_t *shape, char *buf, size_t size);

/* Receives ids of an encode in order, in batches; ids is valid only during the call. */
typedef lm_status (*lm__tok_sink)(void *arg, const int32_t *ids, size_t n);
/* lm_tokenizer_encode handing the ids to sink in batches as they are made, instead of
 * in one array at the end: the encode's own memory stays bounded (batches of a few
 * thousand ids and pre-tokenizer events) however long the text. The ids are those
 * lm_tokenizer_encode gives. On failure sink may have received part of them. */
lm_status lm__tokenizer_encode_each(const lm_tokenizer *tok, const char *text, size_t len, lm__tok_sink sink,
                                    void *arg);

/* safetensors internals the checkpoint layer builds on. Index order is by name. */
int64_t lm__safetensors_lookup(const lm_safetensors *st, const char *name); /* -1 if absent */
const char *lm__safetensors_name(const lm_safetensors *st, int64_t i);
lm_status lm__safetensors_tensor_at(const lm_safetensors *st, int64_t i, lm_tensor **out);

#endif
