/* plan/dplan_run.c — a decode schedule run on the CPU the way SMs would run it, and
 * the decode step it plans (loom/plan.h lm_decode_step).
 *
 * An item runs its piece of the op through the public operators on views of the
 * executor's storage: a linear's rows (w, bias and scale rows, the output's columns;
 * the input form recomputed over the whole x), SwiGLU columns as the gate and up rows
 * into scratch then lm_swiglu_out, a group of q|k|v heads as their rows into scratch,
 * then RoPE into q or RoPE and the KV store (v: the store), kv heads of attention with
 * their query heads. Scratch is the item's own (registers and shared memory on a GPU),
 * outside the footprints. Whole ops run as the executor runs them.
 */
#include "nn/internal.h"
#include "ops/internal.h"
#include "plan/dplan.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define IN(k) (op->in[k] >= 0 ? &V[op->in[k]] : NULL)

static lm_status scratch(int64_t M, int64_t n, float **buf, lm_tensor_view *v) {
    *buf = lm__calloc((size_t)LM_MAX(M * n, 1), sizeof **buf);
    if (!*buf) return LM_OUT_OF_MEMORY;
    int64_t shape[2] = {M, n};
    return lm_tensor_view_init(v, *buf, LM_F32, lm_device_cpu(), 2, shape, NULL);
}

static lm_status rows(const lm_tensor_view *v, int64_t lo, int64_t hi, lm_tensor_view *out, const lm_tensor_view **p) {
    if (!v) {
        *p = NULL;
        return LM_OK;
    }
    *p = out;
    return lm_tensor_view_slice(v, 0, lo, hi, 1, out);
}

/* The linear's rows [lo, hi) of op (inputs x, w, bias, norm at in[0..3], scales at in[sc])
 * into out, with its input form. */
static lm_status linear_rows(lm_ctx *ctx, const lm_tensor_view *V, const lm__gop *op, int bias, int norm, int sc,
                             lm_linear_input input, int bits_group, int accumulate, int64_t lo, int64_t hi,
                             const lm_tensor_view *out) {
    lm_tensor_view w, b, s;
    const lm_tensor_view *bp, *sp, *wp;
    LM_TRY(rows(&V[op->in[1]], lo, hi, &w, &wp));
    LM_TRY(rows(IN(bias), lo, hi, &b, &bp));
    LM_TRY(rows(IN(sc), lo, hi, &s, &sp));
    lm_linear_params lp = {.input = input, .norm_weight = IN(norm), .eps = (float)op->a, .accumulate = accumulate,
                           .w_scales = sp, .w_bits = bits_group > 0 ? 4 : 0, .w_group = bits_group};
    return lm_linear_out(ctx, &V[op->in[0]], wp, bp, &lp, out);
}

static lm_status run_swiglu(lm_ctx *ctx, const lm_tensor_view *V, const lm__gop *op, int64_t lo, int64_t hi) {
    const lm_tensor_view *o = &V[op->out];
    int64_t M = o->shape[0], I = o->shape[o->ndim - 1];
    float *gb = NULL, *ub = NULL;
    lm_tensor_view gv, uv, os;
    lm_status st = scratch(M, hi - lo, &gb, &gv);
    if (st == LM_OK) st = scratch(M, hi - lo, &ub, &uv);
    lm_linear_input in = (lm_linear_input)op->i[0];
    if (st == LM_OK) st = linear_rows(ctx, V, op, 2, 3, 5, in, (int)op->b, 0, lo, hi, &gv);
    if (st == LM_OK) st = linear_rows(ctx, V, op, 2, 3, 5, in, (int)op->b, 0, I + lo, I + hi, &uv);
    if (st == LM_OK) st = lm_tensor_view_slice(o, o->ndim - 1, lo, hi, 1, &os);
    if (st == LM_OK) st = lm_swiglu_out(ctx, &gv, &uv, &os);
    lm__free(gb), lm__free(ub);
    return st;
}

/* Head h's pairs [k0, k1) of the q|k|v front: both row ranges (dims k0.. and D/2 + k0..)
 * into scratch [M, 2n], RoPE over them as one head of 2n dims with inv_freq[k0, k1) (q
 * and k), then the two halves into q or stored into the cache. */
static lm_status qkv_head(lm_ctx *ctx, const lm_tensor_view *V, const lm__gop *op, int64_t h, int64_t k0, int64_t k1) {
    const lm_tensor_view *q = &V[op->out];
    int64_t B = q->shape[0], T = q->shape[1], D = q->shape[3], n = k1 - k0;
    int64_t hq = lm__dp_heads_q(op), hkv = V[op->in[8]].shape[1];
    float *yb = NULL, *rb = NULL;
    lm_tensor_view y, yh, y4, r4, fr, dst, dh, src;
    int64_t s4[4] = {B, T, 1, 2 * n};
    lm_status st = scratch(B * T, 2 * n, &yb, &y);
    if (st == LM_OK) st = scratch(B * T, 2 * n, &rb, &fr);
    for (int half = 0; half < 2 && st == LM_OK; half++) {
        st = lm_tensor_view_slice(&y, 1, half * n, (half + 1) * n, 1, &yh);
        int64_t r0 = h * D + half * D / 2 + k0;
        if (st == LM_OK)
            st = linear_rows(ctx, V, op, 4, 2, 3, (lm_linear_input)op->i[1], (int)op->i[2], 0, r0, r0 + n, &yh);
    }
    if (st == LM_OK) st = lm_tensor_view_init(&y4, yb, LM_F32, lm_device_cpu(), 4, s4, NULL);
    if (st == LM_OK) st = lm_tensor_view_init(&r4, rb, LM_F32, lm_device_cpu(), 4, s4, NULL);
    const lm_tensor_view *from = &y4;
    if (st == LM_OK && h < hq + hkv) { /* q and k rotate */
        lm_tensor_view inv;
        st = lm_tensor_view_slice(&V[op->in[5]], 0, k0, k1, 1, &inv);
        lm_rope_params rp = {LM_ROPE_SPLIT_HALF, &inv, (float)op->b, IN(6), 0, NULL};
        if (st == LM_OK) st = lm_rope_out(ctx, &y4, &rp, &r4);
        from = &r4;
    }
    int v = h < hq ? op->out : h < hq + hkv ? op->in[8] : op->in[9];
    int64_t hh = h < hq ? h : h < hq + hkv ? h - hq : h - hq - hkv;
    if (st == LM_OK) st = lm_tensor_view_slice(&V[v], h < hq ? 2 : 1, hh, hh + 1, 1, &dst);
    for (int half = 0; half < 2 && st == LM_OK; half++) {
        st = lm_tensor_view_slice(&dst, 3, half * D / 2 + k0, half * D / 2 + k1, 1, &dh);
        if (st == LM_OK) st = lm_tensor_view_slice(from, 3, half * n, (half + 1) * n, 1, &src);
        if (st != LM_OK) break;
        if (h < hq) st = lm_tensor_view_copy(ctx, &dh, &src);
        else st = lm_kv_store_out(ctx, &dh, &src, IN(7), IN(6));
    }
    lm__free(yb), lm__free(rb);
    return st;
}

static lm_status run_qkv(lm_ctx *ctx, const lm_tensor_view *V, const lm__gop *op, const lm__dp_item *it) {
    for (int64_t h = it->lo; h < it->hi; h++) LM_TRY(qkv_head(ctx, V, op, h, it->k0, it->k1));
    return LM_OK;
}

/* Units [lo, hi) of (row b, kv head h): the operator on row b's queries of the group,
 * its slot (or block table) and position, the caches' head h. */
static lm_status run_attn(lm_exec *e, lm_ctx *ctx, const lm__gop *op, int64_t lo, int64_t hi) {
    const lm_tensor_view *V = e->view;
    int64_t G = lm__dp_group(e->g, op), hkv = V[op->in[1]].shape[1];
    lm_kv_attention_params p = {(float)op->a, op->i[1], NULL}; /* a CPU run: the CPU splits no keys */
    for (int64_t u = lo; u < hi; u++) {
        int64_t b = u / hkv, h = u % hkv;
        lm_tensor_view r, q, kc, vc, o, sl, ps;
        LM_TRY(lm_tensor_view_slice(&V[op->in[0]], 0, b, b + 1, 1, &r));
        LM_TRY(lm_tensor_view_slice(&r, 2, h * G, (h + 1) * G, 1, &q));
        LM_TRY(lm_tensor_view_slice(&V[op->in[1]], 1, h, h + 1, 1, &kc));
        LM_TRY(lm_tensor_view_slice(&V[op->in[2]], 1, h, h + 1, 1, &vc));
        LM_TRY(lm_tensor_view_slice(&V[op->in[3]], 0, b, b + 1, 1, &sl));
        LM_TRY(lm_tensor_view_slice(&V[op->in[4]], 0, b, b + 1, 1, &ps));
        LM_TRY(lm_tensor_view_slice(&V[op->out], 0, b, b + 1, 1, &r));
        LM_TRY(lm_tensor_view_slice(&r, 2, h * G, (h + 1) * G, 1, &o));
        LM_TRY(lm_attention_cache_out(ctx, &q, &kc, &vc, &sl, &ps, &p, &o));
    }
    return LM_OK;
}

/* Keys [k0, k1) of kv head h for every row, token and query head of its group: the
 * softmax partials (in double, stored as f32) of the positions the token sees (up to its
 * own, inside the window), as lm__ref_attention_cache's rows see them. */
static void run_attn_part(lm_decode_plan *p, const lm__gop *op, const lm__dp_item *it) {
    const lm_tensor_view *V = p->e->view, *q = &V[op->in[0]], *kc = &V[op->in[1]], *vc = &V[op->in[2]];
    const lm_tensor_view *slots = &V[op->in[3]], *pos = &V[op->in[4]];
    int64_t B = q->shape[0], T = q->shape[1], Hq = q->shape[2], D = q->shape[3], P = kc->shape[2];
    int64_t G = lm__dp_group(p->g, op), h = it->lo, window = op->i[1];
    double scale = op->a, acc[LM__DP_MAX_HEAD_DIM];
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            int64_t at = lm__ld_index(pos->dtype, pos->data, b * pos->stride[0] + t * pos->stride[1]);
            int64_t j0 = LM_MAX(it->k0, window > 0 ? at - window + 1 : 0), j1 = LM_MIN(it->k1, at + 1);
            for (int64_t hq = h * G; hq < (h + 1) * G; hq++) {
                double m = -INFINITY, l = 0;
                for (int64_t d = 0; d < D; d++) acc[d] = 0;
                int64_t qo = b * q->stride[0] + t * q->stride[1] + hq * q->stride[2];
                for (int64_t j = j0; j < j1; j++) {
                    int64_t blk = lm__kv_block(slots, b, j, P), o = j % P;
                    int64_t ko = blk * kc->stride[0] + h * kc->stride[1] + o * kc->stride[2];
                    int64_t vo = blk * vc->stride[0] + h * vc->stride[1] + o * vc->stride[2];
                    double sc = 0;
                    for (int64_t d = 0; d < D; d++)
                        sc += lm__ld(q->dtype, q->data, qo + d * q->stride[3]) *
                              lm__ld(kc->dtype, kc->data, ko + d * kc->stride[3]);
                    sc *= scale;
                    double mn = fmax(m, sc), f = exp(m - mn), e = exp(sc - mn);
                    l = l * f + e;
                    for (int64_t d = 0; d < D; d++)
                        acc[d] = acc[d] * f + e * lm__ld(vc->dtype, vc->data, vo + d * vc->stride[3]);
                    m = mn;
                }
                float *r = p->part + lm__dp_part_at(it->poff, T, Hq, it->nc, D, b, t, hq, it->c);
                r[0] = (float)m, r[1] = (float)l;
                for (int64_t d = 0; d < D; d++) r[2 + d] = (float)acc[d];
            }
        }
}

/* The nc chunks of kv head h merged: out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c
 * (M the largest m_c); 0 where the token sees no key. */
static void run_attn_combine(lm_decode_plan *p, const lm__gop *op, const lm__dp_item *it) {
    const lm_tensor_view *V = p->e->view, *q = &V[op->in[0]], *out = &V[op->out];
    int64_t B = q->shape[0], T = q->shape[1], Hq = q->shape[2], D = q->shape[3], G = lm__dp_group(p->g, op);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t hq = it->lo * G; hq < it->hi * G; hq++) {
                double M = -INFINITY, L = 0, o[LM__DP_MAX_HEAD_DIM];
                for (int64_t c = 0; c < it->nc; c++)
                    M = fmax(M, p->part[lm__dp_part_at(it->poff, T, Hq, it->nc, D, b, t, hq, c)]);
                for (int64_t d = 0; d < D; d++) o[d] = 0;
                for (int64_t c = 0; c < it->nc && M > -INFINITY; c++) {
                    const float *r = p->part + lm__dp_part_at(it->poff, T, Hq, it->nc, D, b, t, hq, c);
                    if (r[0] == -INFINITY) continue;
                    double f = exp((double)r[0] - M);
                    L += f * r[1];
                    for (int64_t d = 0; d < D; d++) o[d] += f * r[2 + d];
                }
                int64_t oo = b * out->stride[0] + t * out->stride[1] + hq * out->stride[2];
                for (int64_t d = 0; d < D; d++) lm__st(out->dtype, out->data, oo + d * out->stride[3], L > 0 ? o[d] / L : 0.0);
            }
}

/* Rows [lo, hi) of a row op: the executor's own call on row slices of its output(s)
 * and row inputs (the view table patched for the call, then restored). */
static lm_status run_mrows(lm_exec *e, lm_ctx *ctx, const lm__gop *op, int64_t i, int64_t lo, int64_t hi) {
    int vals[LM__G_MAX_IN + 2], n = 0;
    for (int k = 0; k < op->nin; k++)
        if (op->in[k] >= 0 && lm__dp_row_input(op, k)) vals[n++] = op->in[k];
    vals[n++] = op->out;
    if (op->out2 >= 0) vals[n++] = op->out2;
    lm_tensor_view saved[LM__G_MAX_IN + 2], cut[LM__G_MAX_IN + 2];
    for (int k = 0; k < n; k++) {
        saved[k] = e->view[vals[k]];
        LM_TRY(lm_tensor_view_slice(&saved[k], 0, lo, hi, 1, &cut[k]));
    }
    for (int k = 0; k < n; k++) e->view[vals[k]] = cut[k]; /* a value in two roles gets the same cut */
    lm_status st = lm__exec_run_op(e, ctx, i);
    for (int k = n - 1; k >= 0; k--) e->view[vals[k]] = saved[k];
    return st;
}

static lm_status run_item(lm_decode_plan *p, lm_ctx *ctx, const lm__dp_item *it) {
    lm_exec *e = p->e;
    const lm_tensor_view *V = e->view;
    const lm__gop *op = &p->g->ops[it->op];
    switch (it->kind) {
    case LM__DP_WHOLE: return lm__exec_run_op(e, ctx, it->op);
    case LM__DP_ROWS: {
        const lm_tensor_view *o = &V[op->out];
        lm_tensor_view os;
        LM_TRY(lm_tensor_view_slice(o, o->ndim - 1, it->lo, it->hi, 1, &os));
        return linear_rows(ctx, V, op, 2, 3, 5, (lm_linear_input)op->i[0], (int)op->b, (int)op->i[3], it->lo, it->hi,
                           &os);
    }
    case LM__DP_SWIGLU: return run_swiglu(ctx, V, op, it->lo, it->hi);
    case LM__DP_QKV: return run_qkv(ctx, V, op, it);
    case LM__DP_ATTN: return run_attn(e, ctx, op, it->lo, it->hi);
    case LM__DP_ATTN_PART: run_attn_part(p, op, it); return LM_OK;
    case LM__DP_ATTN_COMBINE: run_attn_combine(p, op, it); return LM_OK;
    case LM__DP_MROWS: return run_mrows(e, ctx, op, it->op, it->lo, it->hi);
    }
    return lm__error(LM_INTERNAL, "decode plan: item kind %d", (int)it->kind);
}

static uint64_t next_rand(uint64_t *s) { /* xorshift64* */
    uint64_t x = *s;
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

lm_status lm_decode_plan_run_cpu(lm_decode_plan *p, lm_ctx *ctx, uint64_t order) {
    if (!p || !ctx) return lm__error(LM_INVALID_ARGUMENT, "lm_decode_plan_run_cpu: NULL argument");
    lm_exec *e = p->e;
    lm_device_caps caps;
    LM_TRY(lm_device_caps_get(e->device, &caps));
    if (!caps.host_addressable || !lm_device_equal(lm_ctx_device(ctx), e->device))
        return lm__error(LM_INVALID_ARGUMENT, "lm_decode_plan_run_cpu: the executor and the context must be on the CPU");
    LM_TRY(lm__exec_prepare(e));
    if (e->resolves != p->resolves)
        return lm__error(LM_INVALID_ARGUMENT, "lm_decode_plan_run_cpu: the executor's bindings changed since the plan "
                         "was made (its footprints are stale); make a new plan");
    if (e->opt.poison) {
        LM_TRY(lm__exec_poison(e));
        if (p->part) memset(p->part, 0xff, (size_t)p->npart * sizeof *p->part); /* NaN partials */
    }
    int S = p->opt.sms;
    int64_t n = p->nitems, left = n;
    int64_t *cur = lm__calloc((size_t)S, sizeof *cur);
    int *ready = lm__calloc((size_t)S, sizeof *ready);
    unsigned char *done = lm__calloc((size_t)LM_MAX(n, 1), 1);
    lm_status st = cur && ready && done ? LM_OK : LM_OUT_OF_MEMORY;
    for (int s = 0; st == LM_OK && s < S; s++) cur[s] = p->sm_begin[s];
    uint64_t rng = order * 0x9E3779B97F4A7C15ULL + 1;
    while (st == LM_OK && left > 0) {
        int nready = 0, first = -1;
        for (int s = 0; s < S; s++) {
            if (cur[s] >= p->sm_begin[s + 1]) continue;
            const lm__dp_item *it = &p->items[p->order[cur[s]]];
            int ok = 1;
            for (int d = 0; ok && d < it->ndep; d++) ok = done[p->deps[it->dep0 + d]];
            if (!ok) continue;
            ready[nready++] = s;
            if (first < 0 || p->order[cur[s]] < p->order[cur[first]]) first = s;
        }
        if (!nready) {
            st = lm__error(LM_INTERNAL, "decode plan: no SM can go on with %lld items left (a dependency cycle)",
                           (long long)left);
            break;
        }
        int s = order == 0 ? first : ready[next_rand(&rng) % (uint64_t)nready];
        int32_t i = p->order[cur[s]++];
        st = run_item(p, ctx, &p->items[i]);
        if (st != LM_OK) {
            lm__error_context(st, "decode plan: item %d (%s)", i, p->g->ops[p->items[i].op].name);
            break;
        }
        done[i] = 1;
        left--;
    }
    lm__free(cur), lm__free(ready), lm__free(done);
    if (st == LM_OK) e->runs++;
    return st;
}

/* ---- the decode step as the CUDA executor prepares it, on the CPU ------------------------------ */

struct lm_decode_step {
    const lm_model *m;
    lm_exec *e;
    lm_tensor **made; /* stacked weights and the caches */
    int64_t nmade, cap_made;
    int64_t batch, vocab;
    lm_tensor_view ids, positions, slots; /* the executor's input buffers */
};

static lm_status keep(lm_decode_step *s, lm_tensor *t) {
    lm_status st = LM__PUSH(s->made, s->nmade, s->cap_made, t);
    if (st != LM_OK) lm_tensor_destroy(t);
    return st;
}

static lm_status lookup(void *user, const char *name, lm_tensor_view *out) {
    lm_decode_step *s = user;
    const lm_tensor *t = lm__model_weight(s->m, name);
    if (!t) { /* a stack of the GPU's passes ("qkv_proj", "gate_up_proj") */
        lm_tensor *st = NULL;
        LM_TRY(lm__model_stacked_weight(s->m, name, &st));
        LM_TRY(keep(s, st));
        t = st;
    }
    *out = *lm_tensor_as_view(t);
    return LM_OK;
}

void lm_decode_step_destroy(lm_decode_step *s) {
    if (!s) return;
    lm_exec_destroy(s->e);
    for (int64_t i = 0; i < s->nmade; i++) lm_tensor_destroy(s->made[i]);
    lm__free(s->made);
    lm__free(s);
}

lm_exec *lm_decode_step_exec(lm_decode_step *s) { return s ? s->e : NULL; }

lm_status lm_decode_step_create(lm_ctx *ctx, const lm_model *m, int64_t batch, int64_t cache_tokens,
                                lm_decode_step **out) {
    if (!ctx || !m || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_decode_step_create: NULL argument");
    *out = NULL;
    lm_device dev = lm_ctx_device(ctx);
    lm_device_caps caps;
    LM_TRY(lm_device_caps_get(dev, &caps));
    if (!caps.host_addressable != !lm__model_on_host(m)) {
        char d[32];
        return lm__error(LM_INVALID_ARGUMENT, "lm_decode_step_create: the context is on %s but the model is %s",
                         lm_device_format(dev, d, sizeof d), lm__model_on_host(m) ? "in host memory" : "on a device");
    }
    if (batch < 1 || cache_tokens < 1)
        return lm__error(LM_INVALID_ARGUMENT, "lm_decode_step_create: batch %lld and cache_tokens %lld must be >= 1",
                         (long long)batch, (long long)cache_tokens);
    const lm_model_config *c = lm_model_get_config(m);
    lm_decoder_options o; /* as nn/kv_cache.c builds a step: each weight in its own dtype */
    lm_decoder_options_default(&o);
    o.batch = batch, o.tokens = 1, o.cache_slots = batch, o.cache_tokens = cache_tokens;
    o.act_dtype = o.vector_dtype = LM_F32;
    o.kv_dtype = caps.host_addressable ? LM_F32 : LM_BF16;
    o.param_dtype = lm__model_param_dtype, o.param_user = (void *)m;
    lm_decode_step *s = lm__calloc(1, sizeof *s);
    if (!s) return LM_OUT_OF_MEMORY;
    s->m = m, s->batch = batch, s->vocab = c->vocab_size;
    lm_graph *g = NULL, *fused = NULL;
    lm_status st = lm_graph_build_decoder(c, &o, &g);
    lm_exec_options eo;
    lm_exec_options_default(&eo);
    eo.poison = 1;
    if (caps.host_addressable) { /* the CUDA executor's passes under the GPU's rules, run as they are */
        lm__pass_env env;
        lm__exec_gpu_rules(&env);
        if (st == LM_OK) st = lm__exec_gpu_passes(g, &env, &fused);
        eo.fuse = 0, eo.capture = 0;
        if (st == LM_OK) st = lm_exec_create(ctx, fused, &eo, &s->e);
    } else if (st == LM_OK) { /* the device's own passes */
        st = lm_exec_create(ctx, g, &eo, &s->e);
    }
    if (st == LM_OK) st = lm_exec_bind_params(s->e, lookup, s);
    int64_t cs[4] = {batch, c->num_key_value_heads, cache_tokens, c->head_dim};
    for (int64_t l = 0; st == LM_OK && l < c->num_hidden_layers; l++)
        for (int kv = 0; st == LM_OK && kv < 2; kv++) {
            char name[40];
            lm_tensor *t = NULL;
            snprintf(name, sizeof name, "%s_cache.%lld", kv ? "v" : "k", (long long)l);
            st = lm_tensor_zeros(dev, o.kv_dtype, 4, cs, &t);
            if (st == LM_OK) st = keep(s, t);
            if (st == LM_OK) st = lm_exec_bind(s->e, name, lm_tensor_as_view(t));
        }
    if (st == LM_OK) st = lm_exec_input(s->e, "ids", &s->ids);
    if (st == LM_OK) st = lm_exec_input(s->e, "positions", &s->positions);
    if (st == LM_OK) st = lm_exec_input(s->e, "slots", &s->slots);
    lm_graph_destroy(g), lm_graph_destroy(fused);
    if (st != LM_OK) {
        lm_decode_step_destroy(s);
        return st;
    }
    *out = s;
    return LM_OK;
}

lm_status lm_decode_step_run(lm_decode_step *s, lm_ctx *ctx, const int32_t *ids, const int32_t *positions,
                             lm_decode_plan *plan, uint64_t order, float *logits) {
    if (!s || !ctx || !ids || !positions || !logits)
        return lm__error(LM_INVALID_ARGUMENT, "lm_decode_step_run: NULL argument");
    if (plan && plan->e != s->e)
        return lm__error(LM_INVALID_ARGUMENT, "lm_decode_step_run: the plan is of another executor");
    int32_t *host = lm__calloc((size_t)(3 * s->batch), sizeof *host);
    if (!host) return LM_OUT_OF_MEMORY;
    lm_status st = LM_OK;
    for (int64_t b = 0; b < s->batch; b++) {
        if (ids[b] < 0 || ids[b] >= s->vocab)
            st = lm__error(LM_OUT_OF_RANGE, "lm_decode_step_run: token id %d of row %lld is outside the vocabulary "
                           "(%lld)", ids[b], (long long)b, (long long)s->vocab);
        host[b] = ids[b], host[s->batch + b] = positions[b], host[2 * s->batch + b] = (int32_t)b;
    }
    if (st == LM_OK) st = lm_tensor_view_write(ctx, &s->ids, host);
    if (st == LM_OK) st = lm_tensor_view_write(ctx, &s->positions, host + s->batch);
    if (st == LM_OK) st = lm_tensor_view_write(ctx, &s->slots, host + 2 * s->batch);
    lm__free(host);
    LM_TRY(st);
    lm_device_caps caps;
    LM_TRY(lm_device_caps_get(lm_ctx_device(ctx), &caps));
    if (plan && !caps.host_addressable) LM_TRY(lm_decode_plan_run_cuda(plan, ctx));
    else if (plan) LM_TRY(lm_decode_plan_run_cpu(plan, ctx, order));
    else LM_TRY(lm_exec_run(s->e, ctx));
    lm_tensor_view y;
    LM_TRY(lm_exec_output(s->e, 0, &y));
    return lm_tensor_view_read(ctx, &y, logits);
}
