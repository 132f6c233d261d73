/* ops/cpu/pointwise.c — tuned elementwise maps (add, mul, scale, silu, swiglu, cast)
 * and the embedding gather (see pointwise.h).
 *
 * A map sees its operands as rows (ops/cpu/rows.h): dense tensors merge into one long
 * row, a [rows, N] view with a broadcast [N] bias stays `rows` rows. Rows are cut into
 * segments of at most SEG elements so that even one long row spreads over the pool;
 * a work unit is one (row, segment) pair and is done by one kernel call. Every output
 * element depends only on the same element of the inputs, so outputs may be the very
 * view of an input (in place). O(numel).
 */
#include "ops/cpu/pointwise.h"

#include "ops/cpu/pointwise_kernels.h"
#include "ops/cpu/rows.h"

/* 8192 f32 = 32 KB per operand: one kernel call amortizes its set-up many times over. */
#define SEG ((int64_t)8192)
/* silu and swiglu cost about four times a plain add per element (exp and a divide). */
#define EXP_COST 4

lm_status lm__cpu_reject(lm_ctx *ctx, const char *op, const char *needs) {
    if (lm_ctx_impl(ctx) != LM_IMPL_TUNED) return LM_OK;
    return lm__error(LM_UNSUPPORTED, "%s: the tuned CPU path needs %s; other views run at the reference level", op,
                     needs);
}

typedef enum map_kind { MAP_ADD, MAP_MUL, MAP_SCALE, MAP_SILU, MAP_SWIGLU, MAP_CAST } map_kind;

typedef struct map_job {
    const lm__pw_kernels *k;
    map_kind kind;
    lm__rows rows;      /* operands: in0, [in1,] out */
    const char *in0;    /* first input's element [0...0]; f32, or bf16/f16 for MAP_CAST */
    const float *in1;   /* second input (add, mul: step rows.inner[1] along a row; swiglu: up) */
    float *out;         /* f32 output */
    size_t in0_size;    /* bytes per in0 element */
    lm_dtype in0_dtype;
    float s;            /* MAP_SCALE factor */
    int64_t segs;       /* segments per row */
} map_job;

/* One row segment of add/mul. Either input may step 0 along the row (broadcast); the
 * ops commute exactly, so the kernels only ever see the second one broadcast. */
static void binary_row(const map_job *j, const float *a, const float *b, float *o, int64_t len) {
    void (*kern)(const float *, const float *, int, float *, int64_t) = j->kind == MAP_ADD ? j->k->add : j->k->mul;
    int64_t sa = j->rows.inner[0], sb = j->rows.inner[1];
    if (sa == 1) {
        kern(a, b, (int)sb, o, len);
    } else if (sb == 1) {
        kern(b, a, 0, o, len);
    } else { /* both fixed along the row */
        float v = j->kind == MAP_ADD ? a[0] + b[0] : a[0] * b[0];
        for (int64_t i = 0; i < len; i++) o[i] = v;
    }
}

static void map_range(void *arg, int64_t begin, int64_t end) {
    const map_job *j = arg;
    const lm__rows *r = &j->rows;
    int out_op = r->nops - 1;
    for (int64_t u = begin; u < end; u++) {
        int64_t row = u / j->segs, j0 = (u - row * j->segs) * SEG, len = LM_MIN(SEG, r->n - j0);
        int64_t off[LM__ROWS_MAX_OPS];
        lm__rows_offsets(r, row, off);
        const char *a = j->in0 + (size_t)(off[0] + j0 * r->inner[0]) * j->in0_size;
        const float *af = (const float *)a;
        float *o = j->out + off[out_op] + j0;
        switch (j->kind) {
        case MAP_ADD:
        case MAP_MUL: binary_row(j, af, j->in1 + off[1] + j0 * r->inner[1], o, len); break;
        case MAP_SCALE: j->k->scale(af, j->s, o, len); break;
        case MAP_SILU: j->k->silu(af, o, len); break;
        case MAP_SWIGLU: j->k->swiglu(af, j->in1 + off[1] + j0, o, len); break;
        case MAP_CAST: j->k->widen(a, j->in0_dtype, o, len); break;
        }
    }
}

/* Plans and runs a map over views v (inputs first, out last); inputs whose bit is set
 * in zero_ok may be broadcast along rows. */
static void run_map(lm_threadpool *pool, map_job *j, int nops, const lm_tensor_view *const *v, unsigned zero_ok,
                    int cost) {
    lm__rows_init(&j->rows, nops, v, 0, zero_ok);
    if (j->rows.count == 0) return;
    j->k = lm__pw_kernels_active();
    j->in0 = v[0]->data;
    j->in0_size = lm_dtype_size(v[0]->dtype);
    j->in0_dtype = v[0]->dtype;
    j->out = v[nops - 1]->data;
    j->segs = (j->rows.n + SEG - 1) / SEG;
    lm__cpu_parallel(pool, j->rows.count * j->segs, LM_MIN(SEG, j->rows.n) * cost, map_range, j);
}

/* Last dim of unit stride (or of size <= 1), or of stride 0 when may_broadcast: the
 * rule every map predicate applies to each operand; outer strides are free. */
static int last_ok(const lm_tensor_view *v, int may_broadcast) {
    if (v->ndim == 0 || v->shape[v->ndim - 1] <= 1) return 1;
    int64_t s = v->stride[v->ndim - 1];
    return s == 1 || (may_broadcast && s == 0);
}

/* All operands f32 with unit-stride last dims. */
static int f32_rows(int nops, const lm_tensor_view *const *v) {
    for (int k = 0; k < nops; k++)
        if (v[k]->dtype != LM_F32 || !last_ok(v[k], 0)) return 0;
    return 1;
}

int lm__cpu_binary_supported(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out) {
    return a->dtype == LM_F32 && b->dtype == LM_F32 && out->dtype == LM_F32 && last_ok(a, 1) && last_ok(b, 1) &&
           last_ok(out, 0);
}

void lm__cpu_binary(lm_threadpool *pool, int mul, const lm_tensor_view *a, const lm_tensor_view *b,
                    const lm_tensor_view *out) {
    const lm_tensor_view *v[] = {a, b, out};
    map_job j = {.kind = mul ? MAP_MUL : MAP_ADD, .in1 = b->data};
    run_map(pool, &j, 3, v, 3u, 1);
}

int lm__cpu_unary_supported(const lm_tensor_view *x, const lm_tensor_view *out) {
    const lm_tensor_view *v[] = {x, out};
    return f32_rows(2, v);
}

void lm__cpu_scale(lm_threadpool *pool, const lm_tensor_view *x, float s, const lm_tensor_view *out) {
    const lm_tensor_view *v[] = {x, out};
    map_job j = {.kind = MAP_SCALE, .s = s};
    run_map(pool, &j, 2, v, 0, 1);
}

void lm__cpu_silu(lm_threadpool *pool, const lm_tensor_view *x, const lm_tensor_view *out) {
    const lm_tensor_view *v[] = {x, out};
    map_job j = {.kind = MAP_SILU};
    run_map(pool, &j, 2, v, 0, EXP_COST);
}

int lm__cpu_swiglu_supported(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *out) {
    const lm_tensor_view *v[] = {gate, up, out};
    return f32_rows(3, v);
}

void lm__cpu_swiglu(lm_threadpool *pool, const lm_tensor_view *gate, const lm_tensor_view *up,
                    const lm_tensor_view *out) {
    const lm_tensor_view *v[] = {gate, up, out};
    map_job j = {.kind = MAP_SWIGLU, .in1 = up->data};
    run_map(pool, &j, 3, v, 0, EXP_COST);
}

int lm__cpu_cast_supported(const lm_tensor_view *x, const lm_tensor_view *out) {
    return lm_dtype_is_float(x->dtype) && out->dtype == LM_F32 && last_ok(x, 0) && last_ok(out, 0);
}

void lm__cpu_cast(lm_threadpool *pool, const lm_tensor_view *x, const lm_tensor_view *out) {
    const lm_tensor_view *v[] = {x, out};
    map_job j = {.kind = MAP_CAST};
    run_map(pool, &j, 2, v, 0, 1);
}

/* ---- embedding ----------------------------------------------------------------------------
 * ids and out's leading dims share a shape, so they form rows like a map: element e of
 * row r is one id and one output row of D elements. */
typedef struct gather_job {
    lm__rows rows;     /* operands: ids, out without its last dim */
    const char *ids;   /* ids element [0...0], i32 or i64 */
    lm_dtype ids_dtype;
    const char *table; /* [V, D] rows table_ld elements apart */
    char *out;         /* [..., D] */
    int64_t table_ld;
    size_t row_bytes, esize;
} gather_job;

static int64_t id_at(const gather_job *j, int64_t unit, int64_t *out_off) {
    int64_t row = unit / j->rows.n, e = unit - row * j->rows.n, off[2];
    lm__rows_offsets(&j->rows, row, off);
    *out_off = off[1] + e * j->rows.inner[1];
    return lm__ld_index(j->ids_dtype, j->ids, off[0] + e * j->rows.inner[0]);
}

static void gather_range(void *arg, int64_t begin, int64_t end) {
    const gather_job *j = arg;
    for (int64_t u = begin; u < end; u++) {
        int64_t o;
        int64_t id = id_at(j, u, &o);
        memcpy(j->out + (size_t)o * j->esize, j->table + (size_t)(id * j->table_ld) * j->esize, j->row_bytes);
    }
}

int lm__cpu_embedding_supported(const lm_tensor_view *table, const lm_tensor_view *ids, const lm_tensor_view *out) {
    int64_t d = table->shape[1];
    return table->dtype == out->dtype && (d <= 1 || (table->stride[1] == 1 && out->stride[out->ndim - 1] == 1));
}

int lm__cpu_embedding(lm_threadpool *pool, const lm_tensor_view *table, const lm_tensor_view *ids,
                      const lm_tensor_view *out) {
    lm_tensor_view lead = *out; /* out's leading dims, shaped like ids */
    lead.ndim--;
    const lm_tensor_view *v[] = {ids, &lead};
    gather_job j = {.ids = ids->data, .ids_dtype = ids->dtype, .table = table->data, .out = out->data,
                    .table_ld = table->stride[0], .esize = lm_dtype_size(table->dtype)};
    j.row_bytes = (size_t)table->shape[1] * j.esize;
    lm__rows_init(&j.rows, 2, v, 0, 1u); /* ids may repeat (stride 0): any step works here */
    int64_t units = j.rows.count * j.rows.n, vocab = table->shape[0], o;
    /* every id first, so a bad one leaves out untouched */
    for (int64_t u = 0; u < units; u++) {
        int64_t id = id_at(&j, u, &o);
        if (id < 0 || id >= vocab) return 0;
    }
    if (j.row_bytes > 0) lm__cpu_parallel(pool, units, table->shape[1], gather_range, &j);
    return 1;
}
