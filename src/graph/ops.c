/* graph/ops.c — builders of the model-step ops (embedding, RoPE, attention with and
 * without a KV cache, SwiGLU, casts, slices, the fused loss and the sampler).
 *
 * Each checks shapes and dtypes the way the public operator that runs it will, so a
 * graph that builds can run: errors name the op and the operand at build time rather
 * than in the middle of a step. Shapes follow include/loom/ops.h.
 */
#include "graph/ir.h"
#include "loom/ops.h"

#include <math.h>

static int is_float(lm_dtype dt) { return dt == LM_F32 || dt == LM_BF16 || dt == LM_F16; }

static lm_status want_float(const lm_graph *g, const char *nm, const char *role, lm_graph_value v) {
    if (is_float(g->values[v].dtype)) return LM_OK;
    return lm__error(LM_DTYPE_MISMATCH, "op '%s': %s '%s' is %s, expected a float dtype", nm, role, g->values[v].name,
                     lm_dtype_name(g->values[v].dtype));
}

static lm_status want_i32(const lm_graph *g, const char *nm, const char *role, lm_graph_value v) {
    if (g->values[v].dtype == LM_I32) return LM_OK;
    return lm__error(LM_DTYPE_MISMATCH, "op '%s': %s '%s' is %s, expected i32", nm, role, g->values[v].name,
                     lm_dtype_name(g->values[v].dtype));
}

/* v has ndim dims equal to want (entries < 0 match anything). */
static lm_status want_shape(const lm_graph *g, const char *nm, const char *role, lm_graph_value v, int ndim,
                            const int64_t *want) {
    const lm__gvalue *x = &g->values[v];
    int ok = x->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = want[i] < 0 || x->dims[i] == want[i];
    if (ok) return LM_OK;
    char got[96] = "", exp[96] = "";
    for (int i = 0, n = 0; i < x->ndim; i++) n += snprintf(got + n, sizeof got - (size_t)n, i ? ", %lld" : "%lld", (long long)x->dims[i]);
    for (int i = 0, n = 0; i < ndim; i++)
        n += want[i] < 0 ? snprintf(exp + n, sizeof exp - (size_t)n, i ? ", *" : "*")
                         : snprintf(exp + n, sizeof exp - (size_t)n, i ? ", %lld" : "%lld", (long long)want[i]);
    return lm__error(LM_SHAPE_MISMATCH, "op '%s': %s '%s' is [%s], expected [%s]", nm, role, x->name, got, exp);
}

/* ---- public builders ----------------------------------------------------------------------- */
lm_status lm_graph_rope(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value positions,
                        lm_graph_value inv_freq, double attn_factor, lm_graph_value *out) {
    char buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, buf, sizeof buf, &nm));
    LM_TRY(lm__graph_check_value(g, x, nm, "input"));
    LM_TRY(lm__graph_check_value(g, positions, nm, "positions"));
    LM_TRY(lm__graph_check_value(g, inv_freq, nm, "inv_freq"));
    const lm__gvalue *vx = &g->values[x];
    LM_TRY(want_float(g, nm, "input", x));
    if (vx->ndim != 4 || vx->dims[3] % 2)
        return lm__error(LM_SHAPE_MISMATCH, "rope '%s': input must be [B, T, H, D] with D even", nm);
    int64_t ps[2] = {vx->dims[0], vx->dims[1]}, fs[1] = {vx->dims[3] / 2};
    LM_TRY(want_i32(g, nm, "positions", positions));
    LM_TRY(want_shape(g, nm, "positions", positions, 2, ps));
    if (g->values[inv_freq].dtype != LM_F32) return lm__error(LM_DTYPE_MISMATCH, "rope '%s': inv_freq must be f32", nm);
    LM_TRY(want_shape(g, nm, "inv_freq", inv_freq, 1, fs));
    if (!(attn_factor > 0 && isfinite(attn_factor)))
        return lm__error(LM_INVALID_ARGUMENT, "rope '%s': attention factor %g must be finite and > 0", nm, attn_factor);
    int in[3] = {x, positions, inv_freq};
    lm__gop *op;
    LM_TRY(lm__graph_append(g, LM__GOP_ROPE, nm, in, 3, vx->ndim, vx->dims, vx->dtype, &op, out));
    op->a = attn_factor;
    return LM_OK;
}

lm_status lm_graph_attention(lm_graph *g, const char *name, lm_graph_value q, lm_graph_value k, lm_graph_value v,
                             double scale, int causal, int64_t window, lm_graph_value *out) {
    char buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, buf, sizeof buf, &nm));
    LM_TRY(lm__graph_check_value(g, q, nm, "q"));
    LM_TRY(lm__graph_check_value(g, k, nm, "k"));
    LM_TRY(lm__graph_check_value(g, v, nm, "v"));
    LM_TRY(want_float(g, nm, "q", q));
    const lm__gvalue *vq = &g->values[q], *vk = &g->values[k], *vv = &g->values[v];
    if (vq->ndim != 4) return lm__error(LM_SHAPE_MISMATCH, "attention '%s': q must be [B, Tq, Hq, D]", nm);
    int64_t ks[4] = {vq->dims[0], -1, -1, vq->dims[3]};
    LM_TRY(want_shape(g, nm, "k", k, 4, ks));
    int64_t vs[4] = {vq->dims[0], vk->dims[1], vk->dims[2], -1};
    LM_TRY(want_shape(g, nm, "v", v, 4, vs));
    if (vk->dtype != vq->dtype || vv->dtype != vq->dtype)
        return lm__error(LM_DTYPE_MISMATCH, "attention '%s': q, k and v must share one dtype", nm);
    if (vq->dims[2] % vk->dims[2])
        return lm__error(LM_SHAPE_MISMATCH, "attention '%s': %lld query heads are not a multiple of %lld kv heads", nm,
                         (long long)vq->dims[2], (long long)vk->dims[2]);
    if (causal && vk->dims[1] < vq->dims[1])
        return lm__error(LM_SHAPE_MISMATCH, "attention '%s': causal needs at least as many keys (%lld) as queries (%lld)",
                         nm, (long long)vk->dims[1], (long long)vq->dims[1]);
    if (window < 0 || (window > 0 && !causal))
        return lm__error(LM_INVALID_ARGUMENT, "attention '%s': window %lld (>= 0, and only with causal)", nm,
                         (long long)window);
    if (!(scale > 0 && isfinite(scale))) return lm__error(LM_INVALID_ARGUMENT, "attention '%s': scale %g", nm, scale);
    int64_t os[4] = {vq->dims[0], vq->dims[1], vq->dims[2], vv->dims[3]};
    int in[3] = {q, k, v};
    lm__gop *op;
    LM_TRY(lm__graph_append(g, LM__GOP_ATTENTION, nm, in, 3, 4, os, vq->dtype, &op, out));
    op->a = scale;
    op->i[0] = causal != 0;
    op->i[1] = window;
    return LM_OK;
}

lm_status lm_graph_swiglu(lm_graph *g, const char *name, lm_graph_value gate, lm_graph_value up,
                          lm_graph_value *out) {
    char buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, buf, sizeof buf, &nm));
    LM_TRY(lm__graph_check_value(g, gate, nm, "gate"));
    LM_TRY(lm__graph_check_value(g, up, nm, "up"));
    LM_TRY(want_float(g, nm, "gate", gate));
    const lm__gvalue *a = &g->values[gate];
    LM_TRY(want_shape(g, nm, "up", up, a->ndim, a->dims));
    if (g->values[up].dtype != a->dtype) return lm__error(LM_DTYPE_MISMATCH, "swiglu '%s': gate and up dtypes differ", nm);
    int in[2] = {gate, up};
    return lm__graph_append(g, LM__GOP_SWIGLU, nm, in, 2, a->ndim, a->dims, a->dtype, NULL, out);
}

/* ---- internal builders ---------------------------------------------------------------------- */
lm_status lm__graph_slice(lm_graph *g, const char *name, lm_graph_value x, int dim, int64_t start, int64_t stop,
                          lm_graph_value *out) {
    char buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, buf, sizeof buf, &nm));
    LM_TRY(lm__graph_check_value(g, x, nm, "input"));
    const lm__gvalue *vx = &g->values[x];
    if (dim < 0 || dim >= vx->ndim || start < 0 || stop > vx->dims[dim] || start >= stop)
        return lm__error(LM_INVALID_ARGUMENT, "slice '%s': [%lld, %lld) of dim %d", nm, (long long)start,
                         (long long)stop, dim);
    int64_t dims[LM__G_MAX_DIMS];
    memcpy(dims, vx->dims, sizeof dims);
    dims[dim] = stop - start;
    int in[1] = {x};
    lm__gop *op;
    LM_TRY(lm__graph_append(g, LM__GOP_SLICE, nm, in, 1, vx->ndim, dims, vx->dtype, &op, out));
    op->i[0] = dim, op->i[1] = start, op->i[2] = stop, op->i[3] = 1;
    return LM_OK;
}

lm_status lm__graph_cast(lm_graph *g, const char *name, lm_graph_value x, lm_dtype dt, lm_graph_value *out) {
    char buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, buf, sizeof buf, &nm));
    LM_TRY(lm__graph_check_value(g, x, nm, "input"));
    const lm__gvalue *vx = &g->values[x];
    int in[1] = {x};
    return lm__graph_append(g, LM__GOP_CAST, nm, in, 1, vx->ndim, vx->dims, dt, NULL, out);
}

lm_status lm__graph_rmsnorm(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value weight, double eps,
                            lm_dtype out_dt, lm_graph_value *out) {
    char buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, buf, sizeof buf, &nm));
    LM_TRY(lm__graph_check_value(g, x, nm, "input"));
    LM_TRY(lm__graph_check_value(g, weight, nm, "weight"));
    LM_TRY(want_float(g, nm, "input", x));
    const lm__gvalue *vx = &g->values[x];
    int64_t ws[1] = {vx->dims[vx->ndim - 1]};
    LM_TRY(want_shape(g, nm, "weight", weight, 1, ws));
    if (!is_float(out_dt) || !(eps >= 0 && isfinite(eps)))
        return lm__error(LM_INVALID_ARGUMENT, "rms_norm '%s': output dtype %s, eps %g", nm, lm_dtype_name(out_dt), eps);
    int in[2] = {x, weight};
    lm__gop *op;
    LM_TRY(lm__graph_append(g, LM__GOP_RMSNORM, nm, in, 2, vx->ndim, vx->dims, out_dt, &op, out));
    op->a = eps;
    return LM_OK;
}

lm_status lm__graph_embedding(lm_graph *g, const char *name, lm_graph_value table, lm_graph_value ids, lm_dtype out_dt,
                              lm_graph_value *out) {
    char buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, buf, sizeof buf, &nm));
    LM_TRY(lm__graph_check_value(g, table, nm, "table"));
    LM_TRY(lm__graph_check_value(g, ids, nm, "ids"));
    LM_TRY(want_float(g, nm, "table", table));
    LM_TRY(want_i32(g, nm, "ids", ids));
    const lm__gvalue *t = &g->values[table], *i = &g->values[ids];
    if (t->ndim != 2 || i->ndim >= LM__G_MAX_DIMS)
        return lm__error(LM_SHAPE_MISMATCH, "embedding '%s': table [V, D] and ids of at most %d dims", nm,
                         LM__G_MAX_DIMS - 1);
    int64_t dims[LM__G_MAX_DIMS];
    for (int d = 0; d < i->ndim; d++) dims[d] = i->dims[d];
    dims[i->ndim] = t->dims[1];
    int in[2] = {table, ids};
    return lm__graph_append(g, LM__GOP_EMBEDDING, nm, in, 2, i->ndim + 1, dims, out_dt, NULL, out);
}

/* Checks of the cache-step operands shared by kv_store and attention_cache: a cache
 * [S, Hkv, P, D], slots (the block table) [B] or [B, NB] i32 and positions [B, T] i32. */
static lm_status check_cache_step(const lm_graph *g, const char *nm, const char *role, lm_graph_value cache,
                                  lm_graph_value slots, lm_graph_value positions, int64_t B, int64_t T) {
    if (g->values[cache].ndim != 4) return lm__error(LM_SHAPE_MISMATCH, "op '%s': %s must be [S, Hkv, P, D]", nm, role);
    int64_t bs[2] = {B, -1}, ps[2] = {B, T};
    LM_TRY(want_i32(g, nm, "slots", slots));
    LM_TRY(want_shape(g, nm, "slots", slots, g->values[slots].ndim == 2 ? 2 : 1, bs));
    LM_TRY(want_i32(g, nm, "positions", positions));
    return want_shape(g, nm, "positions", positions, 2, ps);
}

lm_status lm__graph_kv_store(lm_graph *g, const char *name, lm_graph_value cache, lm_graph_value x,
                             lm_graph_value slots, lm_graph_value positions, lm_graph_value *out) {
    char buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, buf, sizeof buf, &nm));
    LM_TRY(lm__graph_check_value(g, cache, nm, "cache"));
    LM_TRY(lm__graph_check_value(g, x, nm, "rows"));
    LM_TRY(lm__graph_check_value(g, slots, nm, "slots"));
    LM_TRY(lm__graph_check_value(g, positions, nm, "positions"));
    const lm__gvalue *vx = &g->values[x], *vc = &g->values[cache];
    if (vx->ndim != 4) return lm__error(LM_SHAPE_MISMATCH, "kv_store '%s': rows must be [B, T, Hkv, D]", nm);
    LM_TRY(check_cache_step(g, nm, "cache", cache, slots, positions, vx->dims[0], vx->dims[1]));
    int64_t cs[4] = {-1, vx->dims[2], -1, vx->dims[3]};
    LM_TRY(want_shape(g, nm, "cache", cache, 4, cs));
    int in[4] = {cache, x, slots, positions};
    LM_TRY(lm__graph_append(g, LM__GOP_KV_STORE, nm, in, 4, vc->ndim, vc->dims, vc->dtype, NULL, out));
    g->values[*out].root = g->values[cache].root; /* the cache itself, updated in place */
    return LM_OK;
}

lm_status lm__graph_attention_cache(lm_graph *g, const char *name, lm_graph_value q, lm_graph_value k_cache,
                                    lm_graph_value v_cache, lm_graph_value slots, lm_graph_value positions,
                                    double scale, int64_t window, lm_graph_value *out) {
    char buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, buf, sizeof buf, &nm));
    LM_TRY(lm__graph_check_value(g, q, nm, "q"));
    LM_TRY(lm__graph_check_value(g, k_cache, nm, "k_cache"));
    LM_TRY(lm__graph_check_value(g, v_cache, nm, "v_cache"));
    LM_TRY(lm__graph_check_value(g, slots, nm, "slots"));
    LM_TRY(lm__graph_check_value(g, positions, nm, "positions"));
    LM_TRY(want_float(g, nm, "q", q));
    const lm__gvalue *vq = &g->values[q], *kc = &g->values[k_cache];
    if (vq->ndim != 4) return lm__error(LM_SHAPE_MISMATCH, "attention_cache '%s': q must be [B, T, Hq, D]", nm);
    LM_TRY(check_cache_step(g, nm, "k_cache", k_cache, slots, positions, vq->dims[0], vq->dims[1]));
    int64_t cs[4] = {-1, -1, -1, vq->dims[3]};
    LM_TRY(want_shape(g, nm, "k_cache", k_cache, 4, cs));
    LM_TRY(want_shape(g, nm, "v_cache", v_cache, 4, kc->dims));
    if (vq->dims[2] % kc->dims[1])
        return lm__error(LM_SHAPE_MISMATCH, "attention_cache '%s': %lld query heads are not a multiple of %lld kv heads",
                         nm, (long long)vq->dims[2], (long long)kc->dims[1]);
    if (window < 0 || !(scale > 0 && isfinite(scale)))
        return lm__error(LM_INVALID_ARGUMENT, "attention_cache '%s': window %lld, scale %g", nm, (long long)window, scale);
    int in[5] = {q, k_cache, v_cache, slots, positions};
    lm__gop *op;
    LM_TRY(lm__graph_append(g, LM__GOP_ATTENTION_CACHE, nm, in, 5, 4, vq->dims, vq->dtype, &op, out));
    op->a = scale;
    op->i[1] = window;
    return LM_OK;
}

lm_status lm__graph_linear_ce(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value w,
                              lm_graph_value targets, int64_t ignore_index, lm_graph_value *out) {
    char buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, buf, sizeof buf, &nm));
    LM_TRY(lm__graph_check_value(g, x, nm, "x"));
    LM_TRY(lm__graph_check_value(g, w, nm, "w"));
    LM_TRY(lm__graph_check_value(g, targets, nm, "targets"));
    LM_TRY(want_float(g, nm, "x", x));
    const lm__gvalue *vx = &g->values[x];
    if (vx->ndim != 2) return lm__error(LM_SHAPE_MISMATCH, "linear_cross_entropy '%s': x must be [N, H]", nm);
    int64_t ws[2] = {-1, vx->dims[1]}, ts[1] = {vx->dims[0]}, scalar[1] = {1};
    LM_TRY(want_shape(g, nm, "w", w, 2, ws));
    LM_TRY(want_i32(g, nm, "targets", targets));
    LM_TRY(want_shape(g, nm, "targets", targets, 1, ts));
    int in[3] = {x, w, targets};
    lm__gop *op;
    LM_TRY(lm__graph_append(g, LM__GOP_LINEAR_CE, nm, in, 3, 1, scalar, LM_F32, &op, out));
    op->i[0] = ignore_index;
    return LM_OK;
}

lm_status lm__graph_sample(lm_graph *g, const char *name, lm_graph_value logits, lm_graph_value params,
                           lm_graph_value *out) {
    char buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, buf, sizeof buf, &nm));
    LM_TRY(lm__graph_check_value(g, logits, nm, "logits"));
    LM_TRY(lm__graph_check_value(g, params, nm, "params"));
    const lm__gvalue *vl = &g->values[logits];
    if (vl->ndim != 2 || vl->dtype != LM_F32)
        return lm__error(LM_SHAPE_MISMATCH, "sample '%s': logits must be f32 [R, V]", nm);
    if (g->values[params].dtype != LM_U8) return lm__error(LM_DTYPE_MISMATCH, "sample '%s': params must be u8", nm);
    const lm__gvalue *vp = &g->values[params];
    if (vp->ndim != 1 || (vp->dims[0] != LM_SAMPLE_PARAMS_BYTES && vp->dims[0] != vl->dims[0] * LM_SAMPLE_PARAMS_BYTES))
        return lm__error(LM_SHAPE_MISMATCH, "sample '%s': params must be u8 [%d] or [R * %d]", nm, LM_SAMPLE_PARAMS_BYTES,
                         LM_SAMPLE_PARAMS_BYTES);
    int64_t rs[1] = {vl->dims[0]};
    int in[2] = {logits, params};
    return lm__graph_append(g, LM__GOP_SAMPLE, nm, in, 2, 1, rs, LM_I32, NULL, out);
}

/* The linear op of quantized weights: int8 (group 0: w i8 [N, K], scales f32 [N]) or
 * int4 (group 32/64/128: w u8 [N, K/2] of nibbles, scales f32 [N, K/group]). */
static lm_status linear_quant(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value w,
                              lm_graph_value w_scales, int group, lm_graph_value bias, lm_dtype out_dt,
                              lm_graph_value *out) {
    char buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, buf, sizeof buf, &nm));
    LM_TRY(lm__graph_check_value(g, x, nm, "input"));
    LM_TRY(lm__graph_check_value(g, w, nm, "weight"));
    LM_TRY(lm__graph_check_value(g, w_scales, nm, "weight scales"));
    if (bias >= 0) LM_TRY(lm__graph_check_value(g, bias, nm, "bias"));
    LM_TRY(want_float(g, nm, "input", x));
    const lm__gvalue *vx = &g->values[x], *vw = &g->values[w];
    /* int8 and fp8 (f8_e4m3) weights share the form: one f32 scale per row */
    if ((group ? vw->dtype != LM_U8 : vw->dtype != LM_I8 && vw->dtype != LM_F8_E4M3) || vw->ndim != 2)
        return lm__error(LM_DTYPE_MISMATCH, "linear '%s': %s weight '%s' must be %s (is %s, %d-D)", nm,
                         group ? "int4" : "int8/fp8", vw->name, group ? "u8 [N, K/2]" : "i8 or f8_e4m3 [N, K]",
                         lm_dtype_name(vw->dtype), vw->ndim);
    int64_t N = vw->dims[0], K = (group ? 2 : 1) * vw->dims[1], xs[2] = {-1, K}, ns[1] = {N};
    if (group && ((group != 32 && group != 64 && group != 128) || K % group))
        return lm__error(LM_INVALID_ARGUMENT, "linear '%s': int4 group %d (32, 64 or 128 dividing K = %lld)", nm, group,
                         (long long)K);
    int64_t ss[2] = {N, group ? K / group : 1};
    LM_TRY(want_shape(g, nm, "input", x, 2, xs));
    lm_dtype sdt = g->values[w_scales].dtype;
    if (sdt != LM_F32 && !(group && sdt == LM_BF16)) /* int4 group scales may be bf16 */
        return lm__error(LM_DTYPE_MISMATCH, "linear '%s': weight scales '%s' must be f32%s (are %s)", nm,
                         g->values[w_scales].name, group ? " or bf16" : "", lm_dtype_name(sdt));
    LM_TRY(want_shape(g, nm, "weight scales", w_scales, group ? 2 : 1, group ? ss : ns));
    if (bias >= 0) {
        LM_TRY(want_float(g, nm, "bias", bias));
        LM_TRY(want_shape(g, nm, "bias", bias, 1, ns));
    }
    if (!is_float(out_dt)) return lm__error(LM_DTYPE_MISMATCH, "linear '%s': output dtype %s", nm, lm_dtype_name(out_dt));
    int in[6] = {x, w, bias, -1, -1, w_scales};
    int64_t ys[2] = {vx->dims[0], N};
    lm__gop *op;
    LM_TRY(lm__graph_append(g, LM__GOP_LINEAR, nm, in, 6, 2, ys, out_dt, &op, out));
    op->i[0] = LM_LINEAR_IN;
    op->i[1] = bias >= 0;
    op->b = group; /* the int4 format: k per scale (0: int8) */
    return LM_OK;
}

lm_status lm__graph_linear_int8(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value w,
                                lm_graph_value w_scales, lm_graph_value bias, lm_dtype out_dt, lm_graph_value *out) {
    return linear_quant(g, name, x, w, w_scales, 0, bias, out_dt, out);
}

lm_status lm__graph_linear_int4(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value w,
                                lm_graph_value w_scales, int group, lm_graph_value bias, lm_dtype out_dt,
                                lm_graph_value *out) {
    return linear_quant(g, name, x, w, w_scales, group, bias, out_dt, out);
}
