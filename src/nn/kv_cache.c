/* nn/kv_cache.c — per-slot K/V storage for incremental decoding, and the prepared
 * steps (executors) that read and write it.
 *
 * Layout [layers, slots, kv_heads, max_tokens, head_dim]: one slot's keys for one
 * head are contiguous over positions, so attention reads a [kv_heads, t, head_dim]
 * view without gathering. A paged cache has the same layout over blocks
 * [layers, blocks, kv_heads, block_size, head_dim]; its steps take the rows' block
 * tables instead of slots, and the caller tracks each sequence's length. f32 in host memory, bf16 (zero-filled) on a device.
 * Memory: 2 * layers * slots * kv_heads * max_tokens * head_dim * (4 or 2) bytes,
 * allocated once. A step shape (rows, tokens, output) gets its executor on first use:
 * the decoder graph of the model for that shape, bound to the model's weights, to
 * this cache's per-layer slices and to its inputs: views of one device block laid out
 * as the host staging (lm__step_prog.layout), so a step's inputs travel in one copy. Executors keep
 * their arenas (and, on a GPU, captured replays), so the cache keeps up to
 * 2 * slots + 4 of them and evicts the least recently used beyond that.
 */
#include "nn/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* slots blocks of max_tokens positions; blocks_per_row 0: a cache of slots. */
static lm_status create(const lm_model *m, int slots, int64_t max_tokens, int64_t blocks_per_row, lm_kv_cache **out) {
    const lm_model_config *c = &m->cfg;
    lm_kv_cache *kv = lm__calloc(1, sizeof *kv);
    if (!kv) return LM_OUT_OF_MEMORY;
    kv->layers = (int)c->num_hidden_layers;
    kv->slots = slots;
    kv->kv_heads = c->num_key_value_heads;
    kv->max_tokens = max_tokens;
    kv->head_dim = c->head_dim;
    kv->blocks_per_row = blocks_per_row;
    int64_t shape[5] = {kv->layers, slots, kv->kv_heads, max_tokens, kv->head_dim};
    lm_dtype dt = lm__model_on_host(m) ? LM_F32 : LM_BF16;
    lm_status st = lm_tensor_zeros(m->device, dt, 5, shape, &kv->k);
    if (st == LM_OK) st = lm_tensor_zeros(m->device, dt, 5, shape, &kv->v);
    if (st == LM_OK && !blocks_per_row && !(kv->length = lm__calloc((size_t)slots, sizeof *kv->length)))
        st = LM_OUT_OF_MEMORY;
    if (st != LM_OK) {
        lm_kv_cache_destroy(kv);
        return st;
    }
    *out = kv;
    return LM_OK;
}

lm_status lm_kv_cache_create(const lm_model *m, int slots, int64_t max_tokens, lm_kv_cache **out) {
    if (!m || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_kv_cache_create: NULL argument");
    *out = NULL;
    if (slots < 1 || max_tokens < 1)
        return lm__error(LM_INVALID_ARGUMENT, "kv cache: %d slots x %lld tokens (both must be >= 1)", slots,
                         (long long)max_tokens);
    if (max_tokens > m->cfg.max_position_embeddings)
        return lm__error(LM_INVALID_ARGUMENT, "kv cache: %lld tokens exceed max_position_embeddings %lld",
                         (long long)max_tokens, (long long)m->cfg.max_position_embeddings);
    return create(m, slots, max_tokens, 0, out);
}

lm_status lm_kv_cache_create_paged(const lm_model *m, int64_t blocks, int64_t block_size, int64_t max_blocks_per_row,
                                   lm_kv_cache **out) {
    if (!m || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_kv_cache_create_paged: NULL argument");
    *out = NULL;
    if (blocks < 1 || blocks > INT32_MAX || block_size < 1 || max_blocks_per_row < 1 ||
        max_blocks_per_row > INT32_MAX / block_size)
        return lm__error(LM_INVALID_ARGUMENT, "paged kv cache: %lld blocks of %lld tokens, %lld per row (each >= 1)",
                         (long long)blocks, (long long)block_size, (long long)max_blocks_per_row);
    return create(m, (int)blocks, block_size, max_blocks_per_row, out);
}

int64_t lm_kv_cache_blocks_per_row(const lm_kv_cache *c) { return c ? c->blocks_per_row : 0; }

static void prog_free(lm__step_prog *p) {
    lm_exec_destroy(p->exec);
    lm_host_free(p->device, p->host_in);
    lm_tensor_destroy(p->dev_in);
    memset(p, 0, sizeof *p);
}

void lm_kv_cache_destroy(lm_kv_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->nprogs; i++) prog_free(&c->progs[i]);
    lm__free(c->progs);
    lm_device_free(c->arena_device, c->arena);
    lm_tensor_destroy(c->k);
    lm_tensor_destroy(c->v);
    lm__free(c->length);
    lm__free(c);
}

lm_status lm_kv_cache_steps_get(const lm_kv_cache *c, lm_kv_cache_steps *out) {
    if (!c || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_kv_cache_steps_get: NULL argument");
    memset(out, 0, sizeof *out);
    out->arena_bytes = (int64_t)c->arena_bytes;
    int64_t last = -1;
    for (int i = 0; i < c->nprogs; i++) {
        lm_exec_stats st;
        if (!c->progs[i].exec) continue;
        LM_TRY(lm_exec_get_stats(c->progs[i].exec, &st));
        if (c->progs[i].last_used > last) last = c->progs[i].last_used, out->last_kernels = st.kernels;
        out->programs++;
        out->live_bytes = LM_MAX(out->live_bytes, st.live_bytes);
        out->planned_bytes = LM_MAX(out->planned_bytes, st.arena_bytes);
        out->owned_bytes += st.owned_bytes;
    }
    return LM_OK;
}

int lm_kv_cache_slots(const lm_kv_cache *c) { return c->slots; }
int64_t lm_kv_cache_capacity(const lm_kv_cache *c) { return c->max_tokens; }

int64_t lm_kv_cache_length(const lm_kv_cache *c, int slot) {
    return (c->length && slot >= 0 && slot < c->slots) ? c->length[slot] : -1;
}

lm_status lm_kv_cache_reset(lm_kv_cache *c, int slot) {
    if (c && c->blocks_per_row) return lm__error(LM_INVALID_ARGUMENT, "kv cache: a paged cache has no slots to reset");
    if (!c || slot < 0 || slot >= c->slots)
        return lm__error(LM_OUT_OF_RANGE, "kv cache: slot %d outside [0, %d)", slot, c ? c->slots : 0);
    c->length[slot] = 0;
    return LM_OK;
}

/* ---- prepared steps ------------------------------------------------------------------------- */
/* Layer l's slice of a cache tensor: [slots, kv_heads, max_tokens, head_dim]. */
static lm_status layer_view(const lm_tensor *t, int64_t l, lm_tensor_view *out) {
    return lm_tensor_view_select(lm_tensor_as_view(t), 0, l, out);
}

static lm_status lookup_weight(void *user, const char *name, lm_tensor_view *out) {
    const lm_tensor *t = lm__model_weight(user, name);
    if (!t) return lm__error(LM_NOT_FOUND, "the model has no weight '%s'", name);
    *out = *lm_tensor_as_view(t);
    return LM_OK;
}

static lm_status bind_caches(lm_exec *e, const lm_kv_cache *c) {
    for (int l = 0; l < c->layers; l++) {
        char name[32];
        lm_tensor_view v;
        snprintf(name, sizeof name, "k_cache.%d", l);
        LM_TRY(layer_view(c->k, l, &v));
        LM_TRY(lm_exec_bind(e, name, &v));
        snprintf(name, sizeof name, "v_cache.%d", l);
        LM_TRY(layer_view(c->v, l, &v));
        LM_TRY(lm_exec_bind(e, name, &v));
    }
    return LM_OK;
}

/* Gives p's executor the cache's shared arena, first growing it (and moving every
 * other executor onto the new block: they recapture on their next run) when p plans
 * more than it holds. */
static lm_status share_arena(lm_ctx *ctx, lm_kv_cache *c, lm__step_prog *p) {
    lm_exec_stats st;
    LM_TRY(lm_exec_get_stats(p->exec, &st));
    if ((size_t)st.arena_bytes > c->arena_bytes) {
        void *grown = NULL;
        LM_TRY(lm_device_alloc(lm_ctx_device(ctx), (size_t)st.arena_bytes, &grown));
        lm_status s = c->arena ? lm_ctx_synchronize(ctx) : LM_OK; /* nothing still reads the old block */
        for (int i = 0; i < c->nprogs; i++) /* cannot fail: the new block is larger than every plan */
            if (c->progs[i].exec && &c->progs[i] != p) (void)lm_exec_set_arena(c->progs[i].exec, grown, (size_t)st.arena_bytes);
        lm_device_free(c->arena_device, c->arena);
        c->arena = grown, c->arena_bytes = (size_t)st.arena_bytes, c->arena_device = lm_ctx_device(ctx);
        LM_TRY(s);
    }
    return lm_exec_set_arena(p->exec, c->arena, c->arena_bytes);
}

static lm_status prog_build(const lm_model *m, lm_ctx *ctx, lm_kv_cache *c, lm__step_prog *p) {
    lm_decoder_options o;
    lm_decoder_options_default(&o);
    o.mode = LM_DECODER_STEP;
    o.output = p->output;
    o.batch = p->B, o.tokens = p->T;
    o.cache_slots = c->slots, o.cache_tokens = c->max_tokens, o.cache_blocks_per_row = c->blocks_per_row;
    o.act_dtype = o.vector_dtype = LM_F32;
    o.kv_dtype = lm_tensor_dtype(c->k);
    o.param_dtype = lm__model_param_dtype;
    o.param_user = (void *)m;
    /* a tied head's quantized copy where its product needs no dequantizing workspace (the
     * CPU always; a GPU up to its GEMV's rows), else the float table; LOOM_TIED_HEAD=table
     * takes the table at every row count (measurements) */
    const lm_tensor *copy = m->cfg.tie_word_embeddings ? lm__model_weight(m, "lm_head.weight") : NULL;
    if (copy) {
        int64_t rows = p->output == LM_DECODER_OUT_ALL_LOGITS ? p->B * p->T : p->B;
        const char *force = getenv("LOOM_TIED_HEAD");
        o.tied_head_float = (force && strcmp(force, "table") == 0) ||
                            lm_linear_workspace_bytes(lm_ctx_device(ctx), rows, lm_tensor_dim(copy, 0),
                                                      m->cfg.hidden_size, lm_tensor_dtype(copy)) > 0;
    }
    lm_graph *g = NULL;
    LM_TRY(lm_graph_build_decoder(&m->cfg, &o, &g));
    lm_exec_options eo;
    lm_exec_options_default(&eo);
    eo.external_arena = 1;
    lm_status st = lm_exec_create(ctx, g, &eo, &p->exec);
    lm_graph_destroy(g);
    LM_TRY(st);
    LM_TRY(share_arena(ctx, c, p));
    LM_TRY(lm_exec_bind_params(p->exec, lookup_weight, (void *)m));
    LM_TRY(bind_caches(p->exec, c));
    p->device = lm_ctx_device(ctx);
    int64_t NB = c->blocks_per_row ? c->blocks_per_row : 1;
    size_t n = (size_t)(p->B * p->T) * sizeof(int32_t), nb = (size_t)p->B * sizeof(int32_t), ns = nb * (size_t)NB;
    struct lm__step_layout *l = &p->layout;
    l->ids = 0, l->positions = n, l->slots = 2 * n, l->next = 2 * n + ns;
    l->params = (2 * n + ns + nb + 7) & ~(size_t)7;
    l->bytes = l->params + (size_t)p->B * sizeof(lm_sample_params);
    void *h = NULL;
    LM_TRY(lm_host_alloc(p->device, l->bytes, &h));
    p->host_in = h;
    int64_t total = (int64_t)l->bytes;
    LM_TRY(lm_tensor_zeros(p->device, LM_U8, 1, &total, &p->dev_in));
    /* the inputs are views of one device block laid out as the host staging */
    char *base = lm_tensor_data(p->dev_in);
    int64_t bt[2] = {p->B, p->T}, b1[2] = {p->B, NB}, pb[1] = {p->B * LM_SAMPLE_PARAMS_BYTES};
    LM_TRY(lm_tensor_view_init(&p->ids, base + l->ids, LM_I32, p->device, 2, bt, NULL));
    LM_TRY(lm_tensor_view_init(&p->positions, base + l->positions, LM_I32, p->device, 2, bt, NULL));
    LM_TRY(lm_tensor_view_init(&p->slots, base + l->slots, LM_I32, p->device, c->blocks_per_row ? 2 : 1, b1, NULL));
    LM_TRY(lm_exec_bind(p->exec, "ids", &p->ids));
    LM_TRY(lm_exec_bind(p->exec, "positions", &p->positions));
    LM_TRY(lm_exec_bind(p->exec, "slots", &p->slots));
    if (p->output == LM_DECODER_OUT_SAMPLE) {
        LM_TRY(lm_tensor_view_init(&p->sample, base + l->params, LM_U8, p->device, 1, pb, NULL));
        LM_TRY(lm_exec_bind(p->exec, "sample_params", &p->sample));
    }
    return LM_OK;
}

lm_status lm__kv_cache_program(const lm_model *m, lm_ctx *ctx, lm_kv_cache *c, int64_t B, int64_t T,
                               lm_decoder_output output, lm__step_prog **out) {
    c->clock++;
    for (int i = 0; i < c->nprogs; i++) {
        lm__step_prog *p = &c->progs[i];
        if (p->B == B && p->T == T && p->output == output) {
            p->last_used = c->clock;
            *out = p;
            return LM_OK;
        }
    }
    int budget = 2 * c->slots + 4, slot = c->nprogs;
    if (c->nprogs >= budget) { /* evict the least recently used */
        slot = 0;
        for (int i = 1; i < c->nprogs; i++)
            if (c->progs[i].last_used < c->progs[slot].last_used) slot = i;
        prog_free(&c->progs[slot]);
    } else {
        int64_t cap = c->cap_progs;
        LM_TRY(lm__reserve((void **)&c->progs, &cap, c->nprogs + 1, sizeof *c->progs));
        c->cap_progs = (int)cap;
        c->nprogs++;
    }
    lm__step_prog *p = &c->progs[slot];
    memset(p, 0, sizeof *p);
    p->B = B, p->T = T, p->output = output, p->last_used = c->clock;
    lm_status st = prog_build(m, ctx, c, p);
    if (st != LM_OK) {
        prog_free(p);
        c->progs[slot] = c->progs[--c->nprogs]; /* keep the table dense */
        return lm__error_context(st, "preparing a step of %lld rows x %lld tokens", (long long)B, (long long)T);
    }
    *out = p;
    return LM_OK;
}
