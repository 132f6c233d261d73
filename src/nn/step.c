/* nn/step.c — lm_model_forward and lm_model_forward_sample: a model step as the
 * decoder graph run by an executor.
 *
 * The request is checked on the host first (rows, slots, cache room, token ids,
 * sampling parameters), so nothing is appended on error and the device kernels only
 * ever see valid indices. Inputs (ids, positions, slots [, sampling record]) are
 * staged in host memory from lm_host_alloc (pinned on a GPU) and queued in one copy
 * into the device block the step executor's inputs are bound to, the executor runs (captured and replayed on a GPU from the
 * second run of a shape), and the logits or sampled ids are read back after one
 * wait; the slots' lengths advance only on success. The model's precision (fast or
 * exact CPU products, loom/ops.h) holds on this thread for the executor run only.
 */
#include "nn/internal.h"
#include "ops/cpu/precision.h"
#include "ops/internal.h"

#include <string.h>

/* What every step checks, slots or paged: the shape, the cache made for this model on
 * its device and of the right kind (paged or not), the ids inside the vocabulary. */
static lm_status check_common(const char *fn, const lm_model *m, const lm_kv_cache *cache, int paged, int B,
                              const int32_t *ids, int64_t T) {
    const lm_model_config *c = &m->cfg;
    if (B < 1 || T < 1 || !ids) return lm__error(LM_INVALID_ARGUMENT, "%s: %d rows x %lld tokens", fn, B, (long long)T);
    if (cache->layers != c->num_hidden_layers || cache->kv_heads != c->num_key_value_heads || cache->head_dim != c->head_dim)
        return lm__error(LM_INVALID_ARGUMENT, "%s: the KV cache was made for a different model", fn);
    if (!cache->blocks_per_row != !paged)
        return lm__error(LM_INVALID_ARGUMENT, paged ? "%s: the KV cache has slots, not blocks (lm_model_forward)"
                                                    : "%s: a paged KV cache takes block tables (lm_model_forward_paged)",
                         fn);
    if (!lm_device_equal(lm_tensor_device(cache->k), m->device))
        return lm__error(LM_INVALID_ARGUMENT, "%s: the KV cache lives on another device than the model", fn);
    for (int64_t i = 0; i < (int64_t)B * T; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return lm__error(LM_OUT_OF_RANGE, "%s: token id %d at row %lld, position %lld is outside the vocabulary of %lld",
                             fn, ids[i], (long long)(i / T), (long long)(i % T), (long long)c->vocab_size);
    return LM_OK;
}

static lm_status check_request(const lm_model *m, const lm_kv_cache *cache, const int *slots, int B,
                               const int32_t *ids, int64_t T) {
    if (!slots) return lm__error(LM_INVALID_ARGUMENT, "forward: NULL slots");
    LM_TRY(check_common("forward", m, cache, 0, B, ids, T));
    for (int b = 0; b < B; b++) {
        int slot = slots[b];
        if (slot < 0 || slot >= cache->slots)
            return lm__error(LM_OUT_OF_RANGE, "forward: slot %d outside the cache's %d slots", slot, cache->slots);
        for (int o = 0; o < b; o++)
            if (slots[o] == slot) return lm__error(LM_INVALID_ARGUMENT, "forward: slot %d appears twice", slot);
        int64_t end = cache->length[slot] + T;
        if (end > cache->max_tokens)
            return lm__error(LM_OUT_OF_RANGE, "forward: slot %d would hold %lld tokens, cache capacity is %lld", slot,
                             (long long)end, (long long)cache->max_tokens);
    }
    return LM_OK;
}

/* The context must run on the model's device. */
static lm_status check_device(const char *fn, const lm_model *m, lm_ctx *ctx) {
    if (lm_device_equal(lm_ctx_device(ctx), m->device)) return LM_OK;
    char a[32], b[32];
    return lm__error(LM_INVALID_ARGUMENT, "%s: the model is on %s but the context runs on %s", fn,
                     lm_device_format(m->device, a, sizeof a), lm_device_format(lm_ctx_device(ctx), b, sizeof b));
}

/* Queues the copy of the whole host staging (inputs and, for sampling steps, the
 * record) into the device block the executor's inputs are views of; on a GPU it runs
 * asynchronously from the pinned staging, which stays untouched until the step's
 * final synchronize. */
static lm_status put_inputs(lm_ctx *ctx, const lm__step_prog *p) {
    return lm_ctx_copy(ctx, p->device, lm_tensor_data(p->dev_in), lm_device_cpu(), p->host_in, p->layout.bytes);
}

/* ids, positions and slots of the step into the host staging. */
static lm_status write_inputs(lm_ctx *ctx, const lm_kv_cache *cache, lm__step_prog *p, const int *slots,
                              const int32_t *ids) {
    int32_t *hid = (int32_t *)(p->host_in + p->layout.ids), *hpos = (int32_t *)(p->host_in + p->layout.positions);
    int32_t *hslot = (int32_t *)(p->host_in + p->layout.slots);
    for (int64_t b = 0; b < p->B; b++) {
        hslot[b] = slots[b];
        for (int64_t t = 0; t < p->T; t++) {
            hid[b * p->T + t] = ids[b * p->T + t];
            hpos[b * p->T + t] = (int32_t)(cache->length[slots[b]] + t);
        }
    }
    return LM_OK;
}

/* The step's output for a logits buffer (NULL: none) of all or last positions. */
static lm_decoder_output logits_output(const float *logits, int all_positions) {
    return !logits ? LM_DECODER_OUT_NONE : all_positions ? LM_DECODER_OUT_ALL_LOGITS : LM_DECODER_OUT_LAST_LOGITS;
}

/* Runs the step's executor at the model's precision, restoring the thread's after. */
static lm_status exec_run(const lm_model *m, lm_ctx *ctx, const lm__step_prog *p) {
    lm_precision prev = lm__cpu_precision_set(m->precision);
    lm_status st = lm_exec_run(p->exec, ctx);
    lm__cpu_precision_set(prev);
    return st;
}

/* Runs a staged step and reads its logits (if any) back, then waits. */
static lm_status run_logits(const lm_model *m, lm_ctx *ctx, const lm__step_prog *p, float *logits) {
    LM_TRY(put_inputs(ctx, p));
    LM_TRY(exec_run(m, ctx, p));
    if (logits) {
        lm_tensor_view y;
        LM_TRY(lm_exec_output(p->exec, 0, &y));
        LM_TRY(lm_tensor_view_read(ctx, &y, logits));
    }
    return lm_ctx_synchronize(ctx);
}

static void advance(lm_kv_cache *cache, const int *slots, int B, int64_t T) {
    for (int b = 0; b < B; b++) cache->length[slots[b]] += T;
}

lm_status lm_model_forward(const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, const int *slots, int B,
                           const int32_t *ids, int64_t T, float *logits, int all_positions) {
    if (!m || !ctx || !cache) return lm__error(LM_INVALID_ARGUMENT, "lm_model_forward: NULL argument");
    LM_TRY(check_device("lm_model_forward", m, ctx));
    LM_TRY(check_request(m, cache, slots, B, ids, T));
    lm_decoder_output out = logits_output(logits, all_positions);
    lm__step_prog *p = NULL;
    LM_TRY(lm__kv_cache_program(m, ctx, cache, B, T, out, &p));
    LM_TRY(write_inputs(ctx, cache, p, slots, ids));
    LM_TRY(run_logits(m, ctx, p, logits));
    advance(cache, slots, B, T);
    return LM_OK;
}

/* Runs a staged sampling step and reads the B picked ids back: one queued copy into
 * the staging, then one wait. */
static lm_status run_sample(const lm_model *m, lm_ctx *ctx, const lm__step_prog *p, int B, int32_t *next_ids) {
    LM_TRY(put_inputs(ctx, p));
    LM_TRY(exec_run(m, ctx, p));
    lm_tensor_view y;
    LM_TRY(lm_exec_output(p->exec, 0, &y));
    LM_ASSERT(lm_tensor_view_is_contiguous(&y)); /* the sampler's own output */
    char *hout = p->host_in + p->layout.next;
    LM_TRY(lm_ctx_copy(ctx, lm_device_cpu(), hout, y.device, y.data, sizeof(int32_t) * (size_t)B));
    LM_TRY(lm_ctx_synchronize(ctx));
    memcpy(next_ids, hout, sizeof(int32_t) * (size_t)B);
    return LM_OK;
}

/* records: 1 (params applies to every row) or B (one per row). */
static lm_status forward_sample(const char *fn, const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, const int *slots,
                                int B, const int32_t *ids, int64_t T, const lm_sample_params *params, int records,
                                int32_t *next_ids) {
    if (!m || !ctx || !cache || !params || !next_ids) return lm__error(LM_INVALID_ARGUMENT, "%s: NULL argument", fn);
    LM_TRY(check_device(fn, m, ctx));
    for (int r = 0; r < records; r++) /* the device sampler reads the records unchecked */
        if (lm_sample_params_check(&params[r]) != LM_OK) return lm__error_context(LM_INVALID_ARGUMENT, "%s: row %d", fn, r);
    LM_TRY(check_request(m, cache, slots, B, ids, T));
    lm__step_prog *p = NULL;
    LM_TRY(lm__kv_cache_program(m, ctx, cache, B, T, LM_DECODER_OUT_SAMPLE, &p));
    LM_TRY(write_inputs(ctx, cache, p, slots, ids));
    lm_sample_params *rec = (lm_sample_params *)(p->host_in + p->layout.params);
    for (int b = 0; b < B; b++) rec[b] = params[records > 1 ? b : 0];
    LM_TRY(run_sample(m, ctx, p, B, next_ids));
    advance(cache, slots, B, T);
    return LM_OK;
}

lm_status lm_model_forward_sample(const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, const int *slots, int B,
                                  const int32_t *ids, int64_t T, const lm_sample_params *params, int32_t *next_ids) {
    return forward_sample("lm_model_forward_sample", m, ctx, cache, slots, B, ids, T, params, 1, next_ids);
}

lm_status lm_model_forward_sample_rows(const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, const int *slots, int B,
                                       const int32_t *ids, int64_t T, const lm_sample_params *params, int32_t *next_ids) {
    return forward_sample("lm_model_forward_sample_rows", m, ctx, cache, slots, B, ids, T, params, B, next_ids);
}

/* ---- paged caches ------------------------------------------------------------------------- */
/* Stages a paged step (ids, positions from start, the block tables) and checks it on the
 * host: the same rules as the operators (lm__kv_check_indices), before anything runs. */
static lm_status stage_paged(const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, const int32_t *tables,
                             const int64_t *start, int B, const int32_t *ids, int64_t T, lm_decoder_output out,
                             lm__step_prog **prog) {
    const lm_model_config *c = &m->cfg;
    if (!tables || !start) return lm__error(LM_INVALID_ARGUMENT, "forward (paged): NULL block tables or starts");
    LM_TRY(check_common("forward (paged)", m, cache, 1, B, ids, T));
    for (int b = 0; b < B; b++) {
        int64_t end = start[b] + T;
        if (start[b] < 0 || end > c->max_position_embeddings)
            return lm__error(LM_OUT_OF_RANGE, "forward (paged): row %d would hold positions [%lld, %lld), past "
                             "max_position_embeddings %lld", b, (long long)start[b], (long long)end,
                             (long long)c->max_position_embeddings);
    }
    lm__step_prog *p = NULL;
    LM_TRY(lm__kv_cache_program(m, ctx, cache, B, T, out, &p));
    int64_t NB = cache->blocks_per_row;
    int32_t *hid = (int32_t *)(p->host_in + p->layout.ids), *hpos = (int32_t *)(p->host_in + p->layout.positions);
    int32_t *htab = (int32_t *)(p->host_in + p->layout.slots);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            hid[b * T + t] = ids[b * T + t];
            hpos[b * T + t] = (int32_t)(start[b] + t);
        }
    memcpy(htab, tables, sizeof(int32_t) * (size_t)(B * NB));
    lm_tensor_view tv, pv; /* host views of the staging: the operators' checks, on the host */
    int64_t ts[2] = {B, NB}, ps[2] = {B, T};
    LM_TRY(lm_tensor_view_init(&tv, htab, LM_I32, lm_device_cpu(), 2, ts, NULL));
    LM_TRY(lm_tensor_view_init(&pv, hpos, LM_I32, lm_device_cpu(), 2, ps, NULL));
    LM_TRY(lm__kv_check_indices("forward (paged)", B, T, cache->slots, cache->max_tokens, &tv, &pv));
    *prog = p;
    return LM_OK;
}

lm_status lm_model_forward_paged(const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, const int32_t *tables,
                                 const int64_t *start, int B, const int32_t *ids, int64_t T, float *logits,
                                 int all_positions) {
    if (!m || !ctx || !cache) return lm__error(LM_INVALID_ARGUMENT, "lm_model_forward_paged: NULL argument");
    LM_TRY(check_device("lm_model_forward_paged", m, ctx));
    lm_decoder_output out = logits_output(logits, all_positions);
    lm__step_prog *p = NULL;
    LM_TRY(stage_paged(m, ctx, cache, tables, start, B, ids, T, out, &p));
    return run_logits(m, ctx, p, logits);
}

lm_status lm_model_forward_paged_sample(const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, const int32_t *tables,
                                        const int64_t *start, int B, const int32_t *ids, int64_t T,
                                        const lm_sample_params *params, int32_t *next_ids) {
    if (!m || !ctx || !cache || !params || !next_ids)
        return lm__error(LM_INVALID_ARGUMENT, "lm_model_forward_paged_sample: NULL argument");
    LM_TRY(check_device("lm_model_forward_paged_sample", m, ctx));
    for (int r = 0; r < B; r++) /* the device sampler reads the records unchecked */
        if (lm_sample_params_check(&params[r]) != LM_OK)
            return lm__error_context(LM_INVALID_ARGUMENT, "lm_model_forward_paged_sample: row %d", r);
    lm__step_prog *p = NULL;
    LM_TRY(stage_paged(m, ctx, cache, tables, start, B, ids, T, LM_DECODER_OUT_SAMPLE, &p));
    memcpy(p->host_in + p->layout.params, params, sizeof *params * (size_t)B);
    return run_sample(m, ctx, p, B, next_ids);
}
