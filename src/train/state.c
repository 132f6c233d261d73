/* train/state.c — train_state.bin, everything a checkpoint needs beyond the weights to
 * resume bit-exactly. Little-endian layout:
 *   [0, 8) magic "LMTRSTAT"   [8, 12) u32 version (1)   [12, 16) u32 0
 *   u64 step, numel, nparams, batch, seq, grad_accum     (48 bytes)
 *   u64 data loader rng[4], i64 epoch, i64 cursor       (48 bytes)
 *   f32 first moments [numel], f32 second moments [numel]
 *   u64 FNV-1a 64 checksum of every byte before it
 * Reading validates size, magic, version, geometry and checksum before anything is
 * copied out, so a damaged file changes nothing and the error says what is wrong.
 */
#include "train/internal.h"
#include "runtime/internal.h"

#include "loom/io_write.h"

#include <string.h>

#define STATE_MAGIC "LMTRSTAT"
#define STATE_VERSION 1u
#define STATE_HEADER 112

static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}
#define FNV_START 0xcbf29ce484222325ull

static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void encode_header(const lm__train_state *s, uint8_t *h) {
    memset(h, 0, STATE_HEADER);
    memcpy(h, STATE_MAGIC, 8);
    h[8] = STATE_VERSION;
    uint64_t f[12] = {(uint64_t)s->step, (uint64_t)s->numel, (uint64_t)s->nparams, (uint64_t)s->batch, (uint64_t)s->seq,
                      (uint64_t)s->grad_accum, s->data.rng[0], s->data.rng[1], s->data.rng[2], s->data.rng[3],
                      (uint64_t)s->data.epoch, (uint64_t)s->data.cursor};
    for (int i = 0; i < 12; i++) put64(h + 16 + 8 * i, f[i]);
}

/* A host copy of a flat moment buffer (the tensor itself when the host reads its memory). */
static lm_status host_bytes(lm_ctx *ctx, const lm_tensor *t, lm_tensor **tmp, const uint8_t **bytes) {
    *tmp = NULL;
    if (lm__device_host_addressable(lm_tensor_device(t))) {
        *bytes = lm_tensor_data(t);
        return LM_OK;
    }
    LM_TRY(lm_tensor_to_device(ctx, t, lm_device_cpu(), tmp));
    *bytes = lm_tensor_data(*tmp);
    return LM_OK;
}

lm_status lm__train_state_write(lm_ctx *ctx, const char *path, const lm__train_state *s, const lm_tensor *m1,
                                const lm_tensor *m2) {
    uint8_t header[STATE_HEADER], tail[8];
    encode_header(s, header);
    uint64_t h = fnv1a(FNV_START, header, STATE_HEADER);
    lm_atomic_file *f = NULL;
    LM_TRY(lm_atomic_file_open(path, &f));
    lm_status st = lm_atomic_file_write(f, header, STATE_HEADER);
    const lm_tensor *moments[2] = {m1, m2};
    for (int k = 0; st == LM_OK && k < 2; k++) {
        lm_tensor *tmp = NULL;
        const uint8_t *bytes = NULL;
        size_t n = (size_t)s->numel * sizeof(float);
        st = host_bytes(ctx, moments[k], &tmp, &bytes);
        if (st == LM_OK) {
            h = fnv1a(h, bytes, n);
            st = lm_atomic_file_write(f, bytes, n);
        }
        lm_tensor_destroy(tmp);
    }
    put64(tail, h);
    if (st == LM_OK) st = lm_atomic_file_write(f, tail, 8);
    if (st != LM_OK) {
        lm_atomic_file_abort(f);
        return st;
    }
    return lm_atomic_file_commit(f);
}

static lm_status check_layout(const char *path, const lm_file_map *map, int64_t expect_numel, int64_t expect_nparams,
                              lm__train_state *s) {
    const uint8_t *d = map->data;
    if (map->size < STATE_HEADER + 8)
        return lm__error(LM_PARSE_ERROR, "training state '%s': truncated (%zu bytes; the header alone needs %d)", path,
                         map->size, STATE_HEADER + 8);
    if (memcmp(d, STATE_MAGIC, 8) != 0)
        return lm__error(LM_PARSE_ERROR, "training state '%s': not a loom training state (bad magic)", path);
    uint32_t version = (uint32_t)(d[8] | d[9] << 8 | d[10] << 16 | (uint32_t)d[11] << 24);
    if (version != STATE_VERSION)
        return lm__error(LM_PARSE_ERROR, "training state '%s': version %u is not supported (expected %u)", path, version,
                         STATE_VERSION);
    uint64_t f[12];
    for (int i = 0; i < 12; i++) f[i] = get64(d + 16 + 8 * i);
    *s = (lm__train_state){(int64_t)f[0], (int64_t)f[1], (int64_t)f[2], (int64_t)f[3], (int64_t)f[4], (int64_t)f[5],
                           {{f[6], f[7], f[8], f[9]}, (int64_t)f[10], (int64_t)f[11]}};
    if (s->numel != expect_numel || s->nparams != expect_nparams)
        return lm__error(LM_SHAPE_MISMATCH, "training state '%s': saved for %lld parameters in %lld tensors, but the model "
                                            "has %lld in %lld",
                         path, (long long)s->numel, (long long)s->nparams, (long long)expect_numel,
                         (long long)expect_nparams);
    uint64_t want = STATE_HEADER + 8 * (uint64_t)s->numel + 8;
    if (map->size != want)
        return lm__error(LM_PARSE_ERROR, "training state '%s': %zu bytes, expected %llu (truncated or extended)", path,
                         map->size, (unsigned long long)want);
    if (fnv1a(FNV_START, d, map->size - 8) != get64(d + map->size - 8))
        return lm__error(LM_PARSE_ERROR, "training state '%s': checksum mismatch (the file is corrupt)", path);
    if (s->step < 0 || s->batch < 1 || s->seq < 1 || s->grad_accum < 1 || s->data.epoch < 0 || s->data.cursor < 0)
        return lm__error(LM_PARSE_ERROR, "training state '%s': out-of-range fields", path);
    return LM_OK;
}

lm_status lm__train_state_read(const char *path, int64_t expect_numel, int64_t expect_nparams, lm__train_state *s,
                               lm_tensor *m1, lm_tensor *m2) {
    lm_file_map map = {0};
    LM_TRY(lm_file_map_open(path, &map));
    lm_status st = check_layout(path, &map, expect_numel, expect_nparams, s);
    size_t n = (size_t)expect_numel * sizeof(float);
    if (st == LM_OK)
        st = lm_device_copy(lm_tensor_device(m1), lm_tensor_data(m1), lm_device_cpu(), map.data + STATE_HEADER, n);
    if (st == LM_OK)
        st = lm_device_copy(lm_tensor_device(m2), lm_tensor_data(m2), lm_device_cpu(), map.data + STATE_HEADER + n, n);
    lm_file_map_close(&map);
    return st;
}
