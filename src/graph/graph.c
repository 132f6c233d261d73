/* graph/graph.c — the graph IR (graph/ir.h): fixed-shape SSA values, ops in program
 * order, views and Repeat regions, with the validating public builders.
 *
 * Invariants: ops are appended in a valid topological order; a value defined in a
 * Repeat body is visible only inside that body (the region's outer_out values carry
 * results out); parameters inside a body have one copy per iteration; views record
 * their root value (the one owning storage). Errors name the op being built. The
 * builders check what any consumer needs (shapes, dtype agreement); what a consumer
 * cannot run (the tile compiler's f32/f16-only kernels, say) it rejects itself.
 */
#include "graph/ir.h"

#include <math.h>
#include <stdio.h>

lm_status lm_graph_create(lm_graph **out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_graph_create: NULL argument");
    lm_graph *g = lm__calloc(1, sizeof *g);
    if (!g) return LM_OUT_OF_MEMORY;
    g->open_region = -1;
    *out = g;
    return LM_OK;
}

void lm_graph_destroy(lm_graph *g) {
    if (!g) return;
    lm__free(g->values);
    lm__free(g->ops);
    lm__free(g->checks);
    lm__free(g);
}

int lm__gop_is_view(lm__gopk k) { return k == LM__GOP_RESHAPE || k == LM__GOP_PERMUTE || k == LM__GOP_SLICE; }
int lm__gop_inplace_input(const lm__gop *op) {
    if (op->kind == LM__GOP_KV_STORE) return 0;
    if (op->kind == LM__GOP_LINEAR && op->i[3]) return 4;
    if (op->kind == LM__GOP_ADD_RMSNORM && op->i[0]) return 1;
    return -1;
}

int lm__gop_is_elementwise(lm__gopk k) {
    return k == LM__GOP_BIAS_ADD || k == LM__GOP_GELU || k == LM__GOP_SILU || k == LM__GOP_ADD ||
           k == LM__GOP_MUL;
}
int lm__gop_is_rows(lm__gopk k) {
    return k == LM__GOP_SOFTMAX || k == LM__GOP_LAYERNORM || k == LM__GOP_RMSNORM;
}

const char *lm__gop_name(lm__gopk k) {
    static const char *const names[LM__GOP_COUNT] = {
        "input",     "param",    "matmul",   "bias_add",    "gelu",          "silu",       "add",
        "mul",       "softmax",  "layer_norm", "rms_norm",  "reshape",       "permute",    "repeat_in",
        "repeat_out", "slice",   "cast",     "embedding",   "swiglu",        "rope",       "attention",
        "kv_store",  "attention_cache", "linear_cross_entropy", "sample", "add_rmsnorm", "linear",
        "qkv_rope_store", "linear_qkv_rope", "linear_swiglu"};
    return (unsigned)k < LM__GOP_COUNT ? names[k] : "invalid";
}

int64_t lm__gvalue_numel(const lm__gvalue *v) {
    int64_t n = 1;
    for (int i = 0; i < v->ndim; i++) n *= v->dims[i];
    return n;
}

double lm__graph_matmul_flops(const lm_graph *g) {
    double f = 0;
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *op = &g->ops[i];
        if (op->kind != LM__GOP_MATMUL) continue;
        const lm__gvalue *a = &g->values[op->in[0]], *o = &g->values[op->out];
        double one = 2.0 * (double)lm__gvalue_numel(o) * (double)a->dims[a->ndim - 1];
        f += one * (double)(op->region >= 0 ? g->regions[op->region].count : 1);
    }
    return f;
}

/* ---- builders ---------------------------------------------------------------------------------- */
static const char *op_label(const lm_graph *g, const char *name, char *buf, size_t n) {
    if (name && *name) return name;
    snprintf(buf, n, "op%lld", (long long)g->nops);
    return buf;
}

static lm_status check_name(const char *what, const char *name) {
    if (strlen(name) >= LM__G_NAME)
        return lm__error(LM_INVALID_ARGUMENT, "%s '%.40s...': name longer than %d characters", what, name,
                         LM__G_NAME - 1);
    return LM_OK;
}

/* A value usable by a new op: exists and is visible from the open region. */
lm_status lm__graph_check_value(const lm_graph *g, lm_graph_value v, const char *op, const char *role) {
    if (v < 0 || v >= g->nvalues)
        return lm__error(LM_INVALID_ARGUMENT, "op '%s': %s value %d does not exist", op, role, (int)v);
    int r = g->values[v].region;
    if (r >= 0 && r != g->open_region)
        return lm__error(LM_INVALID_ARGUMENT, "op '%s': %s value '%s' is defined inside a closed repeat body", op, role,
                         g->values[v].name);
    return LM_OK;
}

lm_status lm__graph_check_shape(const char *op, int ndim, const int64_t *shape) {
    if (ndim < 1 || ndim > LM__G_MAX_DIMS)
        return lm__error(LM_INVALID_ARGUMENT, "op '%s': %d dimensions (1..%d supported)", op, ndim, LM__G_MAX_DIMS);
    if (!shape) return lm__error(LM_INVALID_ARGUMENT, "op '%s': NULL shape", op);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 1 || shape[i] > (1LL << 31))
            return lm__error(LM_INVALID_ARGUMENT, "op '%s': dimension %d = %lld outside [1, 2^31]", op, i,
                             (long long)shape[i]);
    return LM_OK;
}

/* Appends op + its output value; *out_value receives the value id. */
lm_status lm__graph_append(lm_graph *g, lm__gopk kind, const char *name, const int *in, int nin, int ndim,
                           const int64_t *dims_in, lm_dtype dt, lm__gop **op_out, lm_graph_value *out_value) {
    int64_t dims[LM__G_MAX_DIMS]; /* dims_in may point into g->values, which may move below */
    for (int i = 0; i < ndim; i++) dims[i] = dims_in[i];
    LM_TRY(lm__reserve((void **)&g->ops, &g->cap_ops, g->nops + 1, sizeof *g->ops));
    LM_TRY(lm__reserve((void **)&g->values, &g->cap_values, g->nvalues + 1, sizeof *g->values));
    lm__gop *op = &g->ops[g->nops];
    memset(op, 0, sizeof *op);
    op->kind = kind;
    snprintf(op->name, sizeof op->name, "%s", name);
    op->nin = nin;
    op->out2 = -1;
    for (int i = 0; i < LM__G_MAX_IN; i++) op->in[i] = -1;
    for (int i = 0; i < nin; i++) {
        op->in[i] = in[i];
        if (in[i] >= 0) g->values[in[i]].nuses++;
    }
    op->region = g->open_region;
    lm__gvalue *v = &g->values[g->nvalues];
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", name);
    v->ndim = ndim;
    for (int i = 0; i < ndim; i++) v->dims[i] = dims[i];
    v->dtype = dt;
    v->op = (int)g->nops;
    v->root = lm__gop_is_view(kind) ? g->values[in[0]].root : (int)g->nvalues;
    v->region = g->open_region;
    op->out = (int)g->nvalues;
    *out_value = (lm_graph_value)g->nvalues;
    g->nops++;
    g->nvalues++;
    if (op_out) *op_out = op;
    return LM_OK;
}

lm_status lm__graph_add_out2(lm_graph *g, const char *name, int ndim, const int64_t *dims_in, lm_dtype dt,
                             lm_graph_value *out) {
    if (g->nops < 1 || g->ops[g->nops - 1].out2 >= 0)
        return lm__error(LM_INTERNAL, "graph: a second output needs a last op without one");
    int64_t dims[LM__G_MAX_DIMS];
    for (int i = 0; i < ndim; i++) dims[i] = dims_in[i];
    LM_TRY(lm__reserve((void **)&g->values, &g->cap_values, g->nvalues + 1, sizeof *g->values));
    lm__gvalue *v = &g->values[g->nvalues];
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", name);
    v->ndim = ndim;
    for (int i = 0; i < ndim; i++) v->dims[i] = dims[i];
    v->dtype = dt;
    v->op = (int)g->nops - 1;
    v->root = (int)g->nvalues;
    v->region = g->open_region;
    g->ops[g->nops - 1].out2 = (int)g->nvalues;
    *out = (lm_graph_value)g->nvalues++;
    return LM_OK;
}

static lm_status leaf(lm_graph *g, lm__gopk kind, const char *name, lm_dtype dt, int ndim,
                      const int64_t *shape, double mean, double std, lm_graph_value *out) {
    if (!g || !out) return lm__error(LM_INVALID_ARGUMENT, "graph: NULL argument");
    char buf[32];
    const char *nm = op_label(g, name, buf, sizeof buf);
    LM_TRY(check_name(lm__gop_name(kind), nm));
    LM_TRY(lm__graph_check_shape(nm, ndim, shape));
    if (!(std >= 0 && isfinite(std) && isfinite(mean)))
        return lm__error(LM_INVALID_ARGUMENT, "op '%s': initial mean/std must be finite and std >= 0", nm);
    if (kind == LM__GOP_INPUT && g->open_region >= 0)
        return lm__error(LM_INVALID_ARGUMENT, "input '%s': inputs cannot be declared inside a repeat body", nm);
    lm__gop *op;
    LM_TRY(lm__graph_append(g, kind, nm, NULL, 0, ndim, shape, dt, &op, out));
    op->a = mean;
    op->b = std;
    return LM_OK;
}

lm_status lm_graph_input(lm_graph *g, const char *name, lm_dtype dt, int ndim, const int64_t *shape,
                         double std, lm_graph_value *out) {
    return leaf(g, LM__GOP_INPUT, name, dt, ndim, shape, 0.0, std, out);
}

lm_status lm_graph_param(lm_graph *g, const char *name, lm_dtype dt, int ndim, const int64_t *shape,
                         double mean, double std, lm_graph_value *out) {
    return leaf(g, LM__GOP_PARAM, name, dt, ndim, shape, mean, std, out);
}

lm_status lm__graph_begin_op(const lm_graph *g, const void *out, const char *name, char *buf, size_t n,
                             const char **nm) {
    *nm = "?"; /* set on every path: callers name the op in their errors */
    if (!g || !out) return lm__error(LM_INVALID_ARGUMENT, "graph: NULL argument");
    *nm = op_label(g, name, buf, n);
    return check_name("op", *nm);
}

lm_status lm_graph_matmul(lm_graph *g, const char *name, lm_graph_value a, lm_graph_value b, lm_dtype out_dt,
                          lm_graph_value *out) {
    char nm_buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, nm_buf, sizeof nm_buf, &nm));
    LM_TRY(lm__graph_check_value(g, a, nm, "left"));
    LM_TRY(lm__graph_check_value(g, b, nm, "right"));
    const lm__gvalue *va = &g->values[a], *vb = &g->values[b];
    if (va->dtype != vb->dtype && !(va->dtype == LM_F32 && (vb->dtype == LM_BF16 || vb->dtype == LM_F16)))
        return lm__error(LM_DTYPE_MISMATCH, "matmul '%s': operands are %s and %s", nm, lm_dtype_name(va->dtype),
                         lm_dtype_name(vb->dtype));
    if (va->ndim < 2 || vb->ndim < 2 || vb->ndim > va->ndim)
        return lm__error(LM_SHAPE_MISMATCH, "matmul '%s': operands must be [..., M, K] x [..., K, N] (got %d-D x %d-D)",
                         nm, va->ndim, vb->ndim);
    int64_t K = va->dims[va->ndim - 1];
    if (vb->dims[vb->ndim - 2] != K)
        return lm__error(LM_SHAPE_MISMATCH, "matmul '%s': inner dimensions %lld and %lld differ", nm, (long long)K,
                         (long long)vb->dims[vb->ndim - 2]);
    for (int i = 0; i < vb->ndim - 2; i++) /* b's batch dims (if any) are a's trailing batch dims */
        if (vb->dims[i] != va->dims[va->ndim - vb->ndim + i])
            return lm__error(LM_SHAPE_MISMATCH, "matmul '%s': batch dimensions %lld and %lld differ", nm,
                             (long long)va->dims[va->ndim - vb->ndim + i], (long long)vb->dims[i]);
    int64_t dims[LM__G_MAX_DIMS];
    int nd = va->ndim;
    for (int i = 0; i < nd - 1; i++) dims[i] = va->dims[i];
    dims[nd - 1] = vb->dims[vb->ndim - 1];
    int in[2] = {a, b};
    return lm__graph_append(g, LM__GOP_MATMUL, nm, in, 2, nd, dims, out_dt, NULL, out);
}

lm_status lm_graph_bias_add(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value bias,
                            lm_graph_value *out) {
    char nm_buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, nm_buf, sizeof nm_buf, &nm));
    LM_TRY(lm__graph_check_value(g, x, nm, "input"));
    LM_TRY(lm__graph_check_value(g, bias, nm, "bias"));
    const lm__gvalue *vx = &g->values[x], *vb = &g->values[bias];
    if (vb->ndim != 1 || vb->dims[0] != vx->dims[vx->ndim - 1])
        return lm__error(LM_SHAPE_MISMATCH, "bias_add '%s': bias must be [%lld]", nm,
                         (long long)vx->dims[vx->ndim - 1]);
    if (vb->dtype != vx->dtype)
        return lm__error(LM_DTYPE_MISMATCH, "bias_add '%s': bias dtype %s differs from input %s", nm,
                         lm_dtype_name(vb->dtype), lm_dtype_name(vx->dtype));
    int in[2] = {x, bias};
    return lm__graph_append(g, LM__GOP_BIAS_ADD, nm, in, 2, vx->ndim, vx->dims, vx->dtype, NULL, out);
}

lm_status lm_graph_unary(lm_graph *g, const char *name, lm_graph_unary_kind op, lm_graph_value x,
                         lm_graph_value *out) {
    char nm_buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, nm_buf, sizeof nm_buf, &nm));
    LM_TRY(lm__graph_check_value(g, x, nm, "input"));
    if (op != LM_GRAPH_GELU && op != LM_GRAPH_SILU)
        return lm__error(LM_INVALID_ARGUMENT, "op '%s': unknown unary kind %d", nm, (int)op);
    const lm__gvalue *vx = &g->values[x];
    int in[1] = {x};
    return lm__graph_append(g, op == LM_GRAPH_GELU ? LM__GOP_GELU : LM__GOP_SILU, nm, in, 1, vx->ndim, vx->dims, vx->dtype,
                  NULL, out);
}

lm_status lm_graph_binary(lm_graph *g, const char *name, lm_graph_binary_kind op, lm_graph_value a, lm_graph_value b,
                          lm_graph_value *out) {
    char nm_buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, nm_buf, sizeof nm_buf, &nm));
    LM_TRY(lm__graph_check_value(g, a, nm, "left"));
    LM_TRY(lm__graph_check_value(g, b, nm, "right"));
    if (op != LM_GRAPH_ADD && op != LM_GRAPH_MUL)
        return lm__error(LM_INVALID_ARGUMENT, "op '%s': unknown binary kind %d", nm, (int)op);
    const lm__gvalue *va = &g->values[a], *vb = &g->values[b];
    int same = va->ndim == vb->ndim && va->dtype == vb->dtype;
    for (int i = 0; same && i < va->ndim; i++) same = va->dims[i] == vb->dims[i];
    if (!same) return lm__error(LM_SHAPE_MISMATCH, "op '%s': operands differ in shape or dtype", nm);
    int in[2] = {a, b};
    return lm__graph_append(g, op == LM_GRAPH_ADD ? LM__GOP_ADD : LM__GOP_MUL, nm, in, 2, va->ndim, va->dims, va->dtype,
                  NULL, out);
}

lm_status lm_graph_softmax(lm_graph *g, const char *name, lm_graph_value x, double scale, lm_graph_value *out) {
    char nm_buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, nm_buf, sizeof nm_buf, &nm));
    LM_TRY(lm__graph_check_value(g, x, nm, "input"));
    if (!isfinite(scale)) return lm__error(LM_INVALID_ARGUMENT, "softmax '%s': scale is not finite", nm);
    const lm__gvalue *vx = &g->values[x];
    int in[1] = {x};
    lm__gop *op;
    LM_TRY(lm__graph_append(g, LM__GOP_SOFTMAX, nm, in, 1, vx->ndim, vx->dims, vx->dtype, &op, out));
    op->a = scale;
    return LM_OK;
}

static lm_status norm(lm_graph *g, lm__gopk kind, const char *name, lm_graph_value x, lm_graph_value gamma,
                      lm_graph_value beta, double eps, lm_graph_value *out) {
    char nm_buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, nm_buf, sizeof nm_buf, &nm));
    LM_TRY(lm__graph_check_value(g, x, nm, "input"));
    LM_TRY(lm__graph_check_value(g, gamma, nm, "gamma"));
    if (beta >= 0) LM_TRY(lm__graph_check_value(g, beta, nm, "beta"));
    if (!(eps > 0 && isfinite(eps))) return lm__error(LM_INVALID_ARGUMENT, "norm '%s': eps must be > 0", nm);
    const lm__gvalue *vx = &g->values[x];
    int64_t n = vx->dims[vx->ndim - 1];
    for (int i = 0; i < (beta >= 0 ? 2 : 1); i++) {
        const lm__gvalue *p = &g->values[i ? beta : gamma];
        if (p->ndim != 1 || p->dims[0] != n || p->dtype != vx->dtype)
            return lm__error(LM_SHAPE_MISMATCH, "norm '%s': %s must be [%lld] %s", nm, i ? "beta" : "gamma", (long long)n,
                             lm_dtype_name(vx->dtype));
    }
    int in[3] = {x, gamma, beta};
    lm__gop *op;
    LM_TRY(lm__graph_append(g, kind, nm, in, beta >= 0 ? 3 : 2, vx->ndim, vx->dims, vx->dtype, &op, out));
    op->a = eps;
    return LM_OK;
}

lm_status lm_graph_layer_norm(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value gamma,
                              lm_graph_value beta, double eps, lm_graph_value *out) {
    return norm(g, LM__GOP_LAYERNORM, name, x, gamma, beta, eps, out);
}

lm_status lm_graph_rms_norm(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value gamma, double eps,
                            lm_graph_value *out) {
    return norm(g, LM__GOP_RMSNORM, name, x, gamma, -1, eps, out);
}

lm_status lm_graph_reshape(lm_graph *g, const char *name, lm_graph_value x, int ndim, const int64_t *shape,
                           lm_graph_value *out) {
    char nm_buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, nm_buf, sizeof nm_buf, &nm));
    LM_TRY(lm__graph_check_value(g, x, nm, "input"));
    LM_TRY(lm__graph_check_shape(nm, ndim, shape));
    const lm__gvalue *vx = &g->values[x];
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    if (n != lm__gvalue_numel(vx))
        return lm__error(LM_SHAPE_MISMATCH, "reshape '%s': %lld elements cannot view %lld", nm, (long long)n,
                         (long long)lm__gvalue_numel(vx));
    int in[1] = {x};
    return lm__graph_append(g, LM__GOP_RESHAPE, nm, in, 1, ndim, shape, vx->dtype, NULL, out);
}

lm_status lm_graph_permute(lm_graph *g, const char *name, lm_graph_value x, const int *perm,
                           lm_graph_value *out) {
    char nm_buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, nm_buf, sizeof nm_buf, &nm));
    LM_TRY(lm__graph_check_value(g, x, nm, "input"));
    if (!perm) return lm__error(LM_INVALID_ARGUMENT, "permute '%s': NULL perm", nm);
    const lm__gvalue *vx = &g->values[x];
    int seen[LM__G_MAX_DIMS] = {0};
    int64_t dims[LM__G_MAX_DIMS] = {0};
    for (int i = 0; i < vx->ndim; i++) {
        if (perm[i] < 0 || perm[i] >= vx->ndim || seen[perm[i]]++)
            return lm__error(LM_INVALID_ARGUMENT, "permute '%s': perm is not a permutation of %d axes", nm, vx->ndim);
        dims[i] = vx->dims[perm[i]];
    }
    int in[1] = {x}, nd = vx->ndim;
    lm__gop *op;
    LM_TRY(lm__graph_append(g, LM__GOP_PERMUTE, nm, in, 1, nd, dims, vx->dtype, &op, out));
    for (int i = 0; i < nd; i++) op->perm[i] = perm[i];
    return LM_OK;
}

lm_status lm_graph_split_heads(lm_graph *g, const char *name, lm_graph_value x, int64_t heads,
                               lm_graph_value *out) {
    char nm_buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, nm_buf, sizeof nm_buf, &nm));
    LM_TRY(lm__graph_check_value(g, x, nm, "input"));
    const lm__gvalue *vx = &g->values[x];
    if (vx->ndim != 2 || heads < 1 || vx->dims[1] % heads)
        return lm__error(LM_SHAPE_MISMATCH, "split_heads '%s': input must be [T, H*D] with H = %lld", nm,
                         (long long)heads);
    int64_t shape[3] = {vx->dims[0], heads, vx->dims[1] / heads};
    char sub[LM__G_NAME];
    snprintf(sub, sizeof sub, "%.40s.view", nm);
    lm_graph_value r;
    LM_TRY(lm_graph_reshape(g, sub, x, 3, shape, &r));
    const int perm[3] = {1, 0, 2};
    return lm_graph_permute(g, nm, r, perm, out);
}

lm_status lm_graph_merge_heads(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value *out) {
    char nm_buf[32];
    const char *nm;
    LM_TRY(lm__graph_begin_op(g, out, name, nm_buf, sizeof nm_buf, &nm));
    LM_TRY(lm__graph_check_value(g, x, nm, "input"));
    const lm__gvalue *vx = &g->values[x];
    if (vx->ndim != 3) return lm__error(LM_SHAPE_MISMATCH, "merge_heads '%s': input must be [H, T, D]", nm);
    int64_t shape[2] = {vx->dims[1], vx->dims[0] * vx->dims[2]};
    char sub[LM__G_NAME];
    snprintf(sub, sizeof sub, "%.40s.view", nm);
    const int perm[3] = {1, 0, 2};
    lm_graph_value p;
    LM_TRY(lm_graph_permute(g, sub, x, perm, &p));
    return lm_graph_reshape(g, nm, p, 2, shape, out);
}

/* ---- repeat, outputs, checkpoints -------------------------------------------------------------- */
lm_status lm_graph_repeat_begin(lm_graph *g, int64_t count, int n, const lm_graph_value *outer,
                                lm_graph_value *inner) {
    if (!g || !outer || !inner) return lm__error(LM_INVALID_ARGUMENT, "repeat_begin: NULL argument");
    if (g->open_region >= 0) return lm__error(LM_UNSUPPORTED, "repeat_begin: repeats do not nest");
    if (g->nregions >= (int)(sizeof g->regions / sizeof g->regions[0]))
        return lm__error(LM_UNSUPPORTED, "repeat_begin: at most %d repeats per graph",
                         (int)(sizeof g->regions / sizeof g->regions[0]));
    if (count < 1) return lm__error(LM_INVALID_ARGUMENT, "repeat_begin: count %lld < 1", (long long)count);
    if (n < 1 || n > LM__G_MAX_CARRY)
        return lm__error(LM_INVALID_ARGUMENT, "repeat_begin: %d carried values (1..%d)", n, LM__G_MAX_CARRY);
    for (int i = 0; i < n; i++) LM_TRY(lm__graph_check_value(g, outer[i], "repeat_begin", "carried"));
    int r = g->nregions;
    lm__gregion *rg = &g->regions[r];
    memset(rg, 0, sizeof *rg);
    rg->count = count;
    rg->begin = (int)g->nops;
    rg->ncarry = n;
    g->open_region = r;
    g->nregions++;
    for (int i = 0; i < n; i++) {
        const lm__gvalue *v = &g->values[outer[i]];
        char nm[LM__G_NAME];
        snprintf(nm, sizeof nm, "repeat%d.in%d", r, i);
        int in[1] = {outer[i]};
        lm_status st = lm__graph_append(g, LM__GOP_REPEAT_IN, nm, in, 1, v->ndim, v->dims, v->dtype, NULL, &inner[i]);
        if (st != LM_OK) return st;
        rg->outer_in[i] = outer[i];
        rg->body_in[i] = inner[i];
    }
    return LM_OK;
}

lm_status lm_graph_repeat_end(lm_graph *g, int n, const lm_graph_value *body_out, lm_graph_value *outer_out) {
    if (!g || !body_out || !outer_out) return lm__error(LM_INVALID_ARGUMENT, "repeat_end: NULL argument");
    if (g->open_region < 0) return lm__error(LM_INVALID_ARGUMENT, "repeat_end: no repeat is open");
    lm__gregion *rg = &g->regions[g->open_region];
    if (n != rg->ncarry) return lm__error(LM_INVALID_ARGUMENT, "repeat_end: %d values for %d carried", n, rg->ncarry);
    for (int i = 0; i < n; i++) {
        LM_TRY(lm__graph_check_value(g, body_out[i], "repeat_end", "body output"));
        const lm__gvalue *a = &g->values[body_out[i]], *b = &g->values[rg->body_in[i]];
        int same = a->ndim == b->ndim && a->dtype == b->dtype && a->region == g->open_region;
        for (int d = 0; same && d < a->ndim; d++) same = a->dims[d] == b->dims[d];
        if (!same)
            return lm__error(LM_SHAPE_MISMATCH, "repeat_end: body output '%s' must be a body value shaped like '%s'",
                             a->name, b->name);
    }
    rg->end = (int)g->nops;
    int r = g->open_region;
    g->open_region = -1;
    for (int i = 0; i < n; i++) {
        const lm__gvalue *v = &g->values[body_out[i]];
        char nm[LM__G_NAME];
        snprintf(nm, sizeof nm, "repeat%d.out%d", r, i);
        int in[1] = {body_out[i]};
        LM_TRY(lm__graph_append(g, LM__GOP_REPEAT_OUT, nm, in, 1, v->ndim, v->dims, v->dtype, NULL, &outer_out[i]));
        g->ops[g->nops - 1].a = r;
        rg->body_out[i] = body_out[i];
        rg->outer_out[i] = outer_out[i];
    }
    return LM_OK;
}

lm_status lm_graph_output(lm_graph *g, lm_graph_value v) {
    if (!g) return lm__error(LM_INVALID_ARGUMENT, "graph_output: NULL graph");
    LM_TRY(lm__graph_check_value(g, v, "output", "output"));
    if (g->values[v].region >= 0)
        return lm__error(LM_INVALID_ARGUMENT, "output '%s': outputs must be defined outside repeat bodies",
                         g->values[v].name);
    g->values[v].output = 1;
    return LM_OK;
}

lm_status lm_graph_checkpoint(lm_graph *g, lm_graph_value v, const char *name) {
    if (!g || !name) return lm__error(LM_INVALID_ARGUMENT, "graph_checkpoint: NULL argument");
    LM_TRY(lm__graph_check_value(g, v, name, "checkpoint"));
    if (strlen(name) >= sizeof g->checks[0].name)
        return lm__error(LM_INVALID_ARGUMENT, "checkpoint '%.40s...': name too long", name);
    LM_TRY(lm__reserve((void **)&g->checks, &g->cap_checks, g->nchecks + 1, sizeof *g->checks));
    lm__gcheck *c = &g->checks[g->nchecks++];
    c->value = v;
    snprintf(c->name, sizeof c->name, "%s", name);
    return LM_OK;
}

lm_status lm__graph_clone(const lm_graph *g, lm_graph **out) {
    lm_graph *c;
    LM_TRY(lm_graph_create(&c));
    lm_status st = lm__reserve((void **)&c->values, &c->cap_values, g->nvalues, sizeof *c->values);
    if (st == LM_OK) st = lm__reserve((void **)&c->ops, &c->cap_ops, g->nops, sizeof *c->ops);
    if (st == LM_OK && g->nchecks)
        st = lm__reserve((void **)&c->checks, &c->cap_checks, g->nchecks, sizeof *c->checks);
    if (st != LM_OK) {
        lm_graph_destroy(c);
        return st;
    }
    if (g->nvalues) memcpy(c->values, g->values, sizeof *g->values * (size_t)g->nvalues);
    if (g->nops) memcpy(c->ops, g->ops, sizeof *g->ops * (size_t)g->nops);
    if (g->nchecks) memcpy(c->checks, g->checks, sizeof *g->checks * (size_t)g->nchecks);
    c->nvalues = g->nvalues;
    c->nops = g->nops;
    c->nchecks = g->nchecks;
    memcpy(c->regions, g->regions, sizeof g->regions);
    c->nregions = g->nregions;
    c->open_region = g->open_region;
    *out = c;
    return LM_OK;
}
