/* train/state.c — train_state.bin, everything a checkpoint needs beyond the weights to
 * resume bit-exactly. Little-endian layout:
 *   [0, 8) magic "LMTRSTAT"   [8, 12) u32 version (1)   [12, 16) u32 0
 *   u64 step, numel, nparams, batch, seq, grad_accum     (48 bytes)
 *   u64 data loader rng[4], i64 epoch, i64 cursor       (48 bytes)
 *   f32 first moments [numel], f32 second moments [numel]
 * grad_accum is the micro-batches per optimizer step over all data-parallel ranks
 * (ranks x --grad-accum), what a resumed run must reproduce whatever its rank count;
 * files written before data parallel came from one rank, so theirs means the same.
 *   u64 FNV-1a 64 checksum of every byte before it
 * The file holds the whole moments whether the run sharded them (ZeRO-1: rank 0
 * gathers them to write; each rank reads its slice back) or not, so a checkpoint
 * resumes under any rank count and either setting.
 * Reading validates size, magic, version, geometry, checksum and the range of every
 * field before anything is copied out, so a damaged file changes nothing and the
 * error names what is wrong. lm__train_state_check does the same without a model and
 * without the checksum pass (O(1): it only maps the file), to tell a complete
 * checkpoint from a partial one.
 */
#include "train/internal.h"
#include "runtime/internal.h"

#include "loom/io_write.h"

#include <stdint.h>
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

/* The plausibility limit of step, seq and the data position: 2^40 steps are ~35 years
 * at one step per millisecond, so anything larger is a damaged or forged file. */
#define STATE_FIELD_MAX ((int64_t)1 << 40)

/* Decodes the header into *s after checking size, magic and version. */
static lm_status decode_header(const char *path, const lm_file_map *map, lm__train_state *s) {
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
    return LM_OK;
}

/* The file size the header's numel implies (the moments, the header and the checksum). */
static lm_status check_size(const char *path, const lm_file_map *map, const lm__train_state *s) {
    if (s->numel < 1 || (uint64_t)s->numel > (UINT64_MAX - STATE_HEADER - 8) / 8)
        return lm__error(LM_PARSE_ERROR, "training state '%s': numel %lld is out of range", path, (long long)s->numel);
    uint64_t want = STATE_HEADER + 8 * (uint64_t)s->numel + 8;
    if (map->size != want)
        return lm__error(LM_PARSE_ERROR, "training state '%s': %zu bytes, expected %llu (truncated or extended)", path,
                         map->size, (unsigned long long)want);
    return LM_OK;
}

/* Ranges of the decoded fields, each refusal naming its field: a checksum proves the
 * file is what was written, not that what was written makes sense. */
static lm_status check_fields(const char *path, const lm__train_state *s) {
    const struct {
        const char *name;
        int64_t value, lo, hi;
    } f[] = {{"step", s->step, 0, STATE_FIELD_MAX},
             {"nparams", s->nparams, 1, INT32_MAX},
             {"batch", s->batch, 1, INT32_MAX},
             {"seq", s->seq, 1, STATE_FIELD_MAX},
             {"grad_accum", s->grad_accum, 1, INT32_MAX},
             {"data epoch", s->data.epoch, 0, STATE_FIELD_MAX},
             {"data cursor", s->data.cursor, 0, STATE_FIELD_MAX}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].value < f[i].lo || f[i].value > f[i].hi)
            return lm__error(LM_PARSE_ERROR, "training state '%s': %s %lld is out of range [%lld, %lld]", path, f[i].name,
                             (long long)f[i].value, (long long)f[i].lo, (long long)f[i].hi);
    /* xoshiro256** never leaves the all-zero state (it would draw zeros forever) and
     * lm_rng_seed never produces it, so such a state was not written by a loader */
    if ((s->data.rng[0] | s->data.rng[1] | s->data.rng[2] | s->data.rng[3]) == 0)
        return lm__error(LM_PARSE_ERROR, "training state '%s': the data loader rng state is all zero", path);
    return LM_OK;
}

static lm_status check_layout(const char *path, const lm_file_map *map, int64_t expect_numel, int64_t expect_nparams,
                              lm__train_state *s) {
    LM_TRY(decode_header(path, map, s));
    if (s->numel != expect_numel || s->nparams != expect_nparams)
        return lm__error(LM_SHAPE_MISMATCH, "training state '%s': saved for %lld parameters in %lld tensors, but the model "
                                            "has %lld in %lld",
                         path, (long long)s->numel, (long long)s->nparams, (long long)expect_numel,
                         (long long)expect_nparams);
    LM_TRY(check_size(path, map, s));
    if (fnv1a(FNV_START, map->data, map->size - 8) != get64(map->data + map->size - 8))
        return lm__error(LM_PARSE_ERROR, "training state '%s': checksum mismatch (the file is corrupt)", path);
    return check_fields(path, s);
}

lm_status lm__train_state_check(const char *path, lm__train_state *s) {
    lm_file_map map = {0};
    LM_TRY(lm_file_map_open(path, &map));
    lm_status st = decode_header(path, &map, s);
    if (st == LM_OK) st = check_size(path, &map, s);
    if (st == LM_OK) st = check_fields(path, s);
    lm_file_map_close(&map);
    return st;
}

lm_status lm__train_state_read_range(const char *path, int64_t expect_numel, int64_t expect_nparams, int64_t first,
                                     lm__train_state *s, lm_tensor *m1, lm_tensor *m2) {
    int64_t count = lm_tensor_numel(m1);
    if (first < 0 || count != lm_tensor_numel(m2) || count > expect_numel - first)
        return lm__error(LM_INVALID_ARGUMENT, "training state '%s': moments [%lld, +%lld) outside the %lld parameters",
                         path, (long long)first, (long long)count, (long long)expect_numel);
    lm_file_map map = {0};
    LM_TRY(lm_file_map_open(path, &map));
    lm_status st = check_layout(path, &map, expect_numel, expect_nparams, s);
    size_t n = (size_t)count * sizeof(float), whole = (size_t)expect_numel * sizeof(float);
    if (st == LM_OK && n) { /* laid out as checked: the first moments after the header, the second numel floats on */
        const uint8_t *base = map.data + STATE_HEADER + (size_t)first * sizeof(float);
        st = lm_device_copy(lm_tensor_device(m1), lm_tensor_data(m1), lm_device_cpu(), base, n);
        if (st == LM_OK) st = lm_device_copy(lm_tensor_device(m2), lm_tensor_data(m2), lm_device_cpu(), base + whole, n);
    }
    lm_file_map_close(&map);
    return st;
}

lm_status lm__train_state_read(const char *path, int64_t expect_numel, int64_t expect_nparams, lm__train_state *s,
                               lm_tensor *m1, lm_tensor *m2) {
    return lm__train_state_read_range(path, expect_numel, expect_nparams, 0, s, m1, m2);
}
