/* exec/ops.c — what each graph op means as a public operator call, and the views of
 * the values between them.
 *
 * Views follow the IR: reshape (also of strided views, when the strides allow it:
 * runs of dims that are contiguous with each other may merge and split, as torch's
 * view does; otherwise the graph is refused at resolve time, never copied), permute
 * and slice; kv_store's result is its cache, an accumulating linear's its residual.
 * The IR's attention ops are token-major ([B, T, H, D]); lm_attention_out takes
 * head-major views, so the executor passes permuted views (no copies).
 */
#include "exec/internal.h"

#include <string.h>

/* Reshape of a strided view without copying: dims of v are grouped into chunks that
 * are contiguous among themselves; each chunk's element count must be covered by
 * whole dims of the new shape, which get the chunk's strides. 0 when impossible. */
static int view_reshape(const lm_tensor_view *v, int ndim, const int64_t *shape, lm_tensor_view *out) {
    lm_tensor_view r = *v;
    r.ndim = ndim;
    for (int i = 0; i < ndim; i++) r.shape[i] = shape[i];
    int vd = ndim - 1;
    int64_t chunk_stride = v->ndim ? v->stride[v->ndim - 1] : 1, tensor_n = 1, view_n = 1;
    for (int td = v->ndim - 1; td >= 0; td--) {
        tensor_n *= v->shape[td];
        int chunk_ends = td == 0 || (v->shape[td - 1] != 1 && v->stride[td - 1] != tensor_n * chunk_stride);
        if (!chunk_ends) continue;
        while (vd >= 0 && (view_n < tensor_n || shape[vd] == 1)) {
            r.stride[vd] = view_n * chunk_stride;
            view_n *= shape[vd];
            vd--;
        }
        if (view_n != tensor_n) return 0;
        if (td > 0) {
            chunk_stride = v->stride[td - 1];
            tensor_n = view_n = 1;
        }
    }
    for (; vd >= 0; vd--) { /* leading unit dims */
        if (shape[vd] != 1) return 0;
        r.stride[vd] = 1;
    }
    *out = r;
    return 1;
}

static lm_status resolve_view(lm_exec *e, const lm__gop *op) {
    const lm_graph *g = e->g;
    const lm__gvalue *o = &g->values[op->out];
    const lm_tensor_view *x = &e->view[op->in[0]];
    lm_tensor_view *out = &e->view[op->out];
    switch (op->kind) {
    case LM__GOP_RESHAPE:
        if (!view_reshape(x, o->ndim, o->dims, out))
            return lm__error(LM_UNSUPPORTED, "executor: reshape '%s' of a strided value is not a view", op->name);
        return LM_OK;
    case LM__GOP_PERMUTE: return lm_tensor_view_permute(x, op->perm, out);
    case LM__GOP_SLICE: return lm_tensor_view_slice(x, (int)op->i[0], op->i[1], op->i[2], op->i[3], out);
    default: return lm__error(LM_INTERNAL, "executor: op '%s' is not a view", op->name);
    }
}

static lm_status arena_view(lm_exec *e, int v) {
    const lm__gvalue *x = &e->g->values[v];
    return lm_tensor_view_init(&e->view[v], (char *)e->arena + e->offset[v], x->dtype, e->device, x->ndim, x->dims, NULL);
}

lm_status lm__exec_resolve(lm_exec *e) {
    const lm_graph *g = e->g;
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *op = &g->ops[i];
        if (lm__gop_is_leaf(op->kind)) {
            if (!e->bound[op->out])
                return lm__error(LM_INVALID_ARGUMENT, "executor: %s '%s' is not bound",
                                 op->kind == LM__GOP_INPUT ? "input" : "parameter", op->name);
            continue;
        }
        if (lm__gop_is_view(op->kind)) {
            LM_TRY(resolve_view(e, op));
            continue;
        }
        int k = lm__gop_inplace_input(op);
        if (k >= 0) e->view[op->out] = e->view[op->in[k]]; /* written in place: the operand's own view */
        else LM_TRY(arena_view(e, op->out));
        if (op->out2 >= 0) LM_TRY(arena_view(e, op->out2));
    }
    return LM_OK;
}

/* [B, T, H, D] as [B, H, T, D] */
static lm_status heads_first(const lm_tensor_view *v, lm_tensor_view *out) {
    return lm_tensor_view_transpose(v, 1, 2, out);
}

static lm_status run_attention(lm_exec *e, lm_ctx *ctx, const lm__gop *op) {
    lm_tensor_view q, k, v, o;
    LM_TRY(heads_first(&e->view[op->in[0]], &q));
    LM_TRY(heads_first(&e->view[op->in[1]], &k));
    LM_TRY(heads_first(&e->view[op->in[2]], &v));
    LM_TRY(heads_first(&e->view[op->out], &o));
    return lm_attention_window_out(ctx, &q, &k, &v, (float)op->a, (int)op->i[0], op->i[1], &o);
}

/* Op i's workspace as a u8 view in *ws, or NULL when it has none. */
static lm_status workspace(const lm_exec *e, int64_t i, lm_tensor_view *ws, const lm_tensor_view **out) {
    *out = NULL;
    if (!e->work[i]) return LM_OK;
    int64_t n = (int64_t)e->work_bytes[i];
    LM_TRY(lm_tensor_view_init(ws, e->work[i], LM_U8, e->device, 1, &n, NULL));
    *out = ws;
    return LM_OK;
}

void lm__exec_linear_params(const lm_exec *e, int64_t i, lm_linear_params *lin, lm_qkv_rope_params *qkv) {
    const lm__gop *op = &e->g->ops[i];
    const lm_tensor_view *V = e->view;
#define IN(k) (op->in[k] >= 0 ? &V[op->in[k]] : NULL)
    memset(lin, 0, sizeof *lin);
    if (qkv) memset(qkv, 0, sizeof *qkv);
    switch (op->kind) {
    case LM__GOP_LINEAR:
    case LM__GOP_LINEAR_SWIGLU: /* b: the int4 group (graph/ir.h) */
        lin->input = (lm_linear_input)op->i[0], lin->norm_weight = IN(3), lin->eps = (float)op->a;
        lin->accumulate = op->kind == LM__GOP_LINEAR ? (int)op->i[3] : 0;
        lin->w_scales = IN(5), lin->w_bits = op->b > 0 ? 4 : 0, lin->w_group = (int)op->b;
        break;
    case LM__GOP_LINEAR_QKV_ROPE:
        lin->input = (lm_linear_input)op->i[1], lin->norm_weight = IN(2), lin->eps = (float)op->a;
        lin->w_scales = IN(3), lin->w_bits = op->i[2] > 0 ? 4 : 0, lin->w_group = (int)op->i[2];
        if (qkv) {
            qkv->q_heads = op->i[0], qkv->bias = IN(4), qkv->inv_freq = IN(5), qkv->attn_factor = (float)op->b;
        }
        break;
    default: break;
    }
#undef IN
}

lm_status lm__exec_run_op(lm_exec *e, lm_ctx *ctx, int64_t i) {
    const lm__gop *op = &e->g->ops[i];
    const lm_tensor_view *V = e->view;
    const lm_tensor_view *x = op->nin > 0 ? &V[op->in[0]] : NULL, *out = &V[op->out];
#define IN(k) (op->in[k] >= 0 ? &V[op->in[k]] : NULL)
    switch (op->kind) {
    case LM__GOP_INPUT:
    case LM__GOP_PARAM:
    case LM__GOP_RESHAPE:
    case LM__GOP_PERMUTE:
    case LM__GOP_SLICE: return LM_OK;
    case LM__GOP_MATMUL: return lm_matmul_out(ctx, x, IN(1), out);
    case LM__GOP_BIAS_ADD:
    case LM__GOP_ADD: return lm_add_out(ctx, x, IN(1), out);
    case LM__GOP_MUL: return lm_mul_out(ctx, x, IN(1), out);
    case LM__GOP_SILU: return lm_silu_out(ctx, x, out);
    case LM__GOP_SOFTMAX: return lm_softmax_out(ctx, x, (float)op->a, 0, out);
    case LM__GOP_RMSNORM: return lm_rmsnorm_out(ctx, x, IN(1), (float)op->a, out);
    case LM__GOP_CAST: return lm_cast_out(ctx, x, out);
    case LM__GOP_EMBEDDING: return lm_embedding_out(ctx, x, IN(1), out);
    case LM__GOP_SWIGLU: return lm_swiglu_out(ctx, x, IN(1), out);
    case LM__GOP_ROPE: {
        lm_rope_params rp = {LM_ROPE_SPLIT_HALF, IN(2), (float)op->a, IN(1), 0, NULL};
        return lm_rope_out(ctx, x, &rp, out);
    }
    case LM__GOP_ATTENTION: return run_attention(e, ctx, op);
    case LM__GOP_KV_STORE: return lm_kv_store_out(ctx, x, IN(1), IN(2), IN(3));
    case LM__GOP_ATTENTION_CACHE: {
        lm_tensor_view ws;
        const lm_tensor_view *wsp = NULL;
        LM_TRY(workspace(e, i, &ws, &wsp));
        lm_kv_attention_params p = {(float)op->a, op->i[1], wsp};
        return lm_attention_cache_out(ctx, x, IN(1), IN(2), IN(3), IN(4), &p, out);
    }
    case LM__GOP_LINEAR_CE: return lm_linear_cross_entropy_out(ctx, x, IN(1), IN(2), op->i[0], out);
    case LM__GOP_SAMPLE: {
        lm_tensor_view ws;
        const lm_tensor_view *wsp = NULL;
        LM_TRY(workspace(e, i, &ws, &wsp));
        return lm_sample_out(ctx, x, IN(1), wsp, out);
    }
    case LM__GOP_ADD_RMSNORM: return lm_add_rmsnorm_out(ctx, x, IN(1), IN(2), (float)op->a, out, &V[op->out2]);
    case LM__GOP_LINEAR: {
        lm_tensor_view ws;
        lm_linear_params p;
        lm__exec_linear_params(e, i, &p, NULL);
        LM_TRY(workspace(e, i, &ws, &p.workspace)); /* quantized weights on CUDA, more than 8 rows */
        return lm_linear_out(ctx, x, IN(1), IN(2), &p, out);
    }
    case LM__GOP_QKV_ROPE_STORE: {
        lm_qkv_rope_params p = {op->i[0], IN(1), IN(2), IN(3), (float)op->a, IN(4), (float)op->b};
        return lm_qkv_rope_store_out(ctx, x, &p, IN(6), IN(5), IN(7), IN(8), out);
    }
    case LM__GOP_LINEAR_SWIGLU: {
        lm_linear_params p;
        lm__exec_linear_params(e, i, &p, NULL);
        return lm_linear_swiglu_out(ctx, x, IN(1), IN(2), &p, out);
    }
    case LM__GOP_LINEAR_QKV_ROPE: {
        lm_linear_params lp;
        lm_qkv_rope_params p;
        lm__exec_linear_params(e, i, &lp, &p);
        return lm_linear_qkv_rope_store_out(ctx, x, IN(1), &lp, &p, IN(7), IN(6), IN(8), IN(9), out);
    }
    default:
        return lm__error(LM_UNSUPPORTED, "executor: op '%s' (%s) has no engine operator", op->name,
                         lm__gop_name(op->kind));
    }
#undef IN
}

lm_status lm__exec_check_ops(const lm_graph *g) {
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *op = &g->ops[i];
        switch (op->kind) {
        case LM__GOP_GELU:
        case LM__GOP_LAYERNORM:
        case LM__GOP_REPEAT_IN:
        case LM__GOP_REPEAT_OUT:
            return lm__error(LM_UNSUPPORTED, "executor: op '%s' (%s) has no engine operator (tile compiler only)",
                             op->name, lm__gop_name(op->kind));
        default: break;
        }
        if (op->region >= 0)
            return lm__error(LM_UNSUPPORTED, "executor: op '%s' sits in a repeat region (tile compiler only)", op->name);
    }
    return LM_OK;
}

size_t lm__exec_workspace_bytes(const lm_graph *g, int64_t i, lm_device d) {
    const lm__gop *op = &g->ops[i];
    const lm__gvalue *a = &g->values[op->in[0]];
    if (op->kind == LM__GOP_ATTENTION_CACHE) { /* a row holds P positions, or NB blocks of P when paged */
        const lm__gvalue *table = &g->values[op->in[3]];
        int64_t P = g->values[op->in[1]].dims[2], row = table->ndim == 2 ? table->dims[1] * P : P;
        return lm_attention_cache_workspace_bytes(d, a->dims[0] * a->dims[1], a->dims[2], a->dims[3], row);
    }
    if (op->kind == LM__GOP_SAMPLE) return lm_sample_workspace_bytes(d, a->dims[0]);
    if (op->kind == LM__GOP_LINEAR && op->in[5] >= 0) { /* quantized weights (int4: b is the group) */
        const lm__gvalue *w = &g->values[op->in[1]], *y = &g->values[op->out];
        int64_t K = op->b > 0 ? 2 * w->dims[1] : w->dims[1];
        return lm_linear_workspace_bytes(d, y->dims[0], w->dims[0], K, w->dtype);
    }
    return 0;
}
