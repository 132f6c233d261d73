/* tests/io/io_files.h — helpers the io tests share to write real files: scratch
 * directories, raw byte files, and a small safetensors writer.
 *
 * The writer lays tensors out back to back in the order given, with data_offsets
 * relative to the data section, and pads the JSON header with spaces so the data
 * section starts 8-aligned (as the reference writer does) or, with misalign = 1,
 * one byte past an 8-byte boundary. Header-only helpers (static inline) so each
 * test stays one translation unit.
 */
#ifndef LOOM_TESTS_IO_FILES_H
#define LOOM_TESTS_IO_FILES_H

#include "harness.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct tw_tensor {
    const char *name;
    const char *dtype; /* safetensors dtype string */
    int ndim;
    int64_t shape[LM_MAX_DIMS];
    const void *data; /* [nbytes] */
    size_t nbytes;
} tw_tensor;

/* A fresh directory under /tmp (free() the result; tw_rmtree removes it). */
static inline char *tw_tmpdir(void) {
    char tmpl[] = "/tmp/loom_io_XXXXXX";
    char *d = mkdtemp(tmpl);
    LT_CHECK_MSG(d != NULL, "mkdtemp failed");
    return d ? strdup(d) : NULL;
}

/* Removes a directory and the files directly inside it. */
static inline void tw_rmtree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

static inline void tw_path(char *buf, size_t size, const char *dir, const char *name) {
    snprintf(buf, size, "%s/%s", dir, name);
}

static inline void tw_write_bytes(const char *path, const void *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    LT_CHECK_MSG(f != NULL, "cannot create %s", path);
    if (!f) return;
    if (n) LT_CHECK(fwrite(bytes, 1, n, f) == n);
    fclose(f);
}

static inline void tw_write_text(const char *path, const char *text) { tw_write_bytes(path, text, strlen(text)); }

/* A raw file: 8-byte little-endian declared_len, the header text, then data_len data bytes. */
static inline void tw_write_raw(const char *path, uint64_t declared_len, const char *header, const void *data,
                                size_t data_len) {
    size_t hl = strlen(header);
    uint8_t *buf = malloc(8 + hl + data_len + 1);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(declared_len >> (8 * i));
    memcpy(buf + 8, header, hl);
    if (data_len) memcpy(buf + 8 + hl, data, data_len);
    tw_write_bytes(path, buf, 8 + hl + data_len);
    free(buf);
}

/* Builds a whole safetensors file in memory (malloc'd, *size bytes). */
static inline uint8_t *tw_build(const tw_tensor *ts, int n, int misalign, size_t *size) {
    size_t cap = 4096 + (size_t)n * 256, len = 0, off = 0, data_len = 0;
    char *h = malloc(cap);
    len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", ts[i].name, ts[i].dtype);
        for (int d = 0; d < ts[i].ndim; d++)
            len += (size_t)snprintf(h + len, cap - len, d ? ",%lld" : "%lld", (long long)ts[i].shape[d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off, off + ts[i].nbytes);
        off += ts[i].nbytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while ((8 + len) % 8 != (size_t)(misalign ? 1 : 0)) h[len++] = ' ';
    data_len = off;
    uint8_t *buf = malloc(8 + len + data_len + 1);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)len >> (8 * i));
    memcpy(buf + 8, h, len);
    off = 8 + len;
    for (int i = 0; i < n; i++) {
        if (ts[i].nbytes) memcpy(buf + off, ts[i].data, ts[i].nbytes);
        off += ts[i].nbytes;
    }
    free(h);
    *size = off;
    return buf;
}

static inline void tw_write_safetensors(const char *path, const tw_tensor *ts, int n, int misalign) {
    size_t size;
    uint8_t *buf = tw_build(ts, n, misalign, &size);
    tw_write_bytes(path, buf, size);
    free(buf);
}

#endif
