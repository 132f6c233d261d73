/* bench/cuda_train_ops.c — a timing lab for the public operators one training step
 * of the Qwen2.5-0.5B shape runs on CUDA in bf16 (B*T = 8192 rows), through the same
 * calls the autograd tape makes: each operation runs 3 times to warm up, then the
 * mean of 10 timed with events, printed as one JSON line with achieved TFLOP/s (GEMMs)
 * or GB/s (memory-bound operators, counting each operand read or written once).
 * AdamW runs as one tensor (f32 grads) and as the model's 290 tensors (bf16 grads, the
 * multi-tensor launch), aligned and one element off (its scalar loop); the RMSNorm
 * backward runs on aligned rows (the tuned row-vector kernel) and on rows one element
 * off (the readable kernels), so old and new paths are timed side by side.
 * Correctness lives in tests/cuda; this only times.
 * Built by scripts/gpu_check.sh (step lab) against the library:
 *   cc -O2 -Iinclude -Isrc bench/cuda_train_ops.c BUILD/libloom.a -lcudart -lcublasLt ...
 * Usage: cuda_train_ops [rows [name-substring]]
 */
#include "loom/ops_backward.h"
#include "loom/runtime.h"
#include "loom/tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LM_TRY(e)                    \
    do {                             \
        lm_status st_ = (e);         \
        if (st_ != LM_OK) return st_; \
    } while (0)

static lm_ctx *g_ctx;
static const lm_device g_dev = {LM_DEVICE_CUDA, 0};

static lm_tensor *make(lm_dtype dt, int nd, const int64_t *shape) {
    lm_tensor *t = NULL;
    if (lm_tensor_zeros(g_dev, dt, nd, shape, &t) != LM_OK) {
        fprintf(stderr, "alloc: %s\n", lm_last_error());
        exit(1);
    }
    return t;
}
#define V(t) lm_tensor_as_view(t)
#define T2(dt, a, b) make(dt, 2, (int64_t[]){a, b})

typedef lm_status (*op_fn)(void *arg);

static const char *g_only; /* argv[2]: time only the operators whose name contains it */

static void report(const char *name, op_fn fn, void *arg, double flops, double bytes) {
    if (g_only && !strstr(name, g_only)) return;
    lm_event *a = NULL, *b = NULL;
    lm_event_create(g_ctx, &a);
    lm_event_create(g_ctx, &b);
    for (int i = 0; i < 3; i++)
        if (fn(arg) != LM_OK) {
            fprintf(stderr, "%s failed: %s\n", name, lm_last_error());
            exit(1);
        }
    lm_event_record(a, g_ctx);
    for (int i = 0; i < 10; i++) fn(arg);
    lm_event_record(b, g_ctx);
    lm_event_synchronize(b);
    double ms = 0;
    lm_event_elapsed_ms(a, b, &ms);
    ms /= 10;
    printf("{\"op\":\"%s\",\"us\":%.1f", name, ms * 1e3);
    if (flops > 0) printf(",\"tflops\":%.1f", flops / (ms * 1e-3) / 1e12);
    if (bytes > 0) printf(",\"gb_s\":%.0f", bytes / (ms * 1e-3) / 1e9);
    printf("}\n");
    fflush(stdout);
    lm_event_destroy(a);
    lm_event_destroy(b);
}

typedef struct lin {
    lm_tensor *x, *w, *y, *dx, *dw, *bias;
} lin;
static lm_status lin_fwd(void *p) {
    lin *l = p;
    lm_tensor_view wt;
    LM_TRY(lm_tensor_view_transpose(V(l->w), 0, 1, &wt));
    return lm_matmul_out(g_ctx, V(l->x), &wt, V(l->y));
}
static lm_status lin_bias(void *p) {
    lin *l = p;
    return lm_add_out(g_ctx, V(l->y), V(l->bias), V(l->y));
}
static lm_status lin_bwd(void *p) {
    lin *l = p;
    lm_tensor_view wt, dwt;
    LM_TRY(lm_tensor_view_transpose(V(l->w), 0, 1, &wt));
    LM_TRY(lm_tensor_view_transpose(V(l->dw), 0, 1, &dwt));
    return lm_matmul_backward_out(g_ctx, V(l->x), &wt, V(l->y), V(l->dx), &dwt);
}
/* what training runs since the weight gradient goes straight into the f32 buffer:
 * dx, then dw^T += dy^T x by the GEMM (l->bias holds the f32 [N, K] buffer here) */
static lm_status lin_bwd_into_f32(void *p) {
    lin *l = p;
    lm_tensor_view wt, dwt;
    LM_TRY(lm_tensor_view_transpose(V(l->w), 0, 1, &wt));
    LM_TRY(lm_tensor_view_transpose(V(l->bias), 0, 1, &dwt));
    LM_TRY(lm_matmul_backward_out(g_ctx, V(l->x), &wt, V(l->y), V(l->dx), NULL));
    return lm_matmul_backward_acc_out(g_ctx, V(l->x), &wt, V(l->y), NULL, &dwt);
}
static lm_status grad_to_f32(void *p) { /* what a bound f32 gradient buffer costs per bf16 weight gradient */
    lin *l = p;
    lm_tensor *tmp = NULL;
    LM_TRY(lm_cast(g_ctx, V(l->dw), LM_F32, &tmp));
    lm_status st = lm_add_out(g_ctx, V(l->bias), V(tmp), V(l->bias));
    lm_tensor_destroy(tmp);
    return st;
}

typedef struct ew {
    lm_tensor *a, *b, *c, *d, *e, *w, *dw;
} ew;
static lm_status ew_add(void *p) {
    ew *e = p;
    return lm_add_out(g_ctx, V(e->a), V(e->b), V(e->c));
}
static lm_status ew_swiglu(void *p) {
    ew *e = p;
    return lm_swiglu_out(g_ctx, V(e->a), V(e->b), V(e->c));
}
static lm_status ew_swiglu_bwd(void *p) {
    ew *e = p;
    return lm_swiglu_backward_out(g_ctx, V(e->a), V(e->b), V(e->c), V(e->d), V(e->e));
}
static lm_status ew_addnorm(void *p) {
    ew *e = p;
    return lm_add_rmsnorm_out(g_ctx, V(e->a), V(e->b), V(e->w), 1e-6f, V(e->c), V(e->d));
}
static lm_status ew_addnorm_bwd(void *p) {
    ew *e = p;
    return lm_add_rmsnorm_backward_out(g_ctx, V(e->a), V(e->w), 1e-6f, V(e->b), V(e->c), V(e->d), V(e->dw));
}
static lm_status ew_addnorm_bwd_dx(void *p) {
    ew *e = p;
    return lm_add_rmsnorm_backward_out(g_ctx, V(e->a), V(e->w), 1e-6f, V(e->b), V(e->c), V(e->d), NULL);
}
static lm_status ew_norm_bwd(void *p) {
    ew *e = p;
    return lm_rmsnorm_backward_out(g_ctx, V(e->a), V(e->w), 1e-6f, V(e->b), V(e->d), V(e->dw));
}
/* The same shapes through views one element off the 16-byte row boundaries: the
 * readable (strided) kernels of ops/cuda/norm_backward.cu, for comparison. */
typedef struct ewv {
    lm_tensor_view a, b, c, d;
    lm_tensor *w, *dw;
} ewv;
static lm_status ewv_addnorm_bwd(void *p) {
    ewv *e = p;
    return lm_add_rmsnorm_backward_out(g_ctx, &e->a, V(e->w), 1e-6f, &e->b, &e->c, &e->d, V(e->dw));
}
static lm_status ew_cast(void *p) {
    ew *e = p;
    return lm_cast_out(g_ctx, V(e->a), V(e->b));
}

/* RoPE of the q projection as the training step calls it: [1, R, 14, 64] bf16 with
 * [1, R] i32 positions (t mod 1024) and the Qwen2.5 inverse frequencies. */
typedef struct rp {
    lm_tensor *x, *y, *inv, *pos;
} rp;
static lm_status rope_fwd(void *p) {
    rp *r = p;
    lm_rope_params q = {LM_ROPE_SPLIT_HALF, V(r->inv), 1.0f, V(r->pos), 0, NULL};
    return lm_rope_out(g_ctx, V(r->x), &q, V(r->y));
}
static lm_status rope_bwd(void *p) {
    rp *r = p;
    lm_rope_params q = {LM_ROPE_SPLIT_HALF, V(r->inv), 1.0f, V(r->pos), 0, NULL};
    return lm_rope_backward_out(g_ctx, V(r->y), &q, V(r->x), NULL);
}
static lm_status col_sum(void *p) { /* a bias gradient: [R, N] summed over the rows */
    ew *e = p;
    return lm_sum_out(g_ctx, V(e->a), 0, V(e->b));
}

typedef struct att {
    lm_tensor *q, *k, *v, *o, *dq, *dk, *dv, *lse;
    lm_tensor_view qv, kv, vv, ov, dqv, dkv, dvv;
    float scale;
} att;
static lm_status att_fwd_lse(void *p) {
    att *a = p;
    return lm_attention_lse_out(g_ctx, &a->qv, &a->kv, &a->vv, a->scale, 1, 0, &a->ov, V(a->lse));
}
static lm_status att_bwd_lse(void *p) { /* dout = out, as att_bwd */
    att *a = p;
    return lm_attention_backward_lse_out(g_ctx, &a->qv, &a->kv, &a->vv, &a->ov, V(a->lse), &a->ov, a->scale, 1, 0,
                                         &a->dqv, &a->dkv, &a->dvv);
}
static lm_status att_fwd(void *p) {
    att *a = p;
    return lm_attention_out(g_ctx, &a->qv, &a->kv, &a->vv, a->scale, 1, &a->ov);
}
static lm_status att_bwd(void *p) {
    att *a = p;
    return lm_attention_backward_out(g_ctx, &a->qv, &a->kv, &a->vv, &a->ov, a->scale, 1, &a->dqv, &a->dkv, &a->dvv);
}

typedef struct lce {
    lm_tensor *x, *w, *tg, *loss, *dloss, *dx, *dw;
} lce;
static lm_status lce_fwd(void *p) {
    lce *l = p;
    return lm_linear_cross_entropy_out(g_ctx, V(l->x), V(l->w), V(l->tg), -100, V(l->loss));
}
static lm_status lce_bwd(void *p) {
    lce *l = p;
    return lm_linear_cross_entropy_backward_out(g_ctx, V(l->x), V(l->w), V(l->tg), -100, V(l->dloss), V(l->dx), V(l->dw));
}
/* what training runs: the loss with its gradients at dloss = 1, then their scaling */
static lm_status lce_grads(void *p) {
    lce *l = p;
    return lm_linear_cross_entropy_grads_out(g_ctx, V(l->x), V(l->w), V(l->tg), -100, V(l->loss), V(l->dx), V(l->dw));
}
static lm_status lce_scale(void *p) {
    lce *l = p;
    lm_status st = lm_scale_by_out(g_ctx, V(l->dx), V(l->dloss), V(l->dx));
    return st == LM_OK ? lm_scale_by_out(g_ctx, V(l->dw), V(l->dloss), V(l->dw)) : st;
}

typedef struct opt {
    lm_tensor *p, *g, *m, *v;
} opt;
static lm_status adamw(void *arg) {
    opt *o = arg;
    float wd = 0.1f;
    lm_adamw_hparams hp = {3e-4, 0.9, 0.95, 1e-8, 1, 1.0};
    return lm_adamw_update(g_ctx, 1, V(o->p), V(o->g), V(o->m), V(o->v), &wd, &hp);
}
/* Every parameter tensor of Qwen2.5-0.5B (tied embeddings): views into flat buffers. */
#define QWEN_TENSORS (1 + 24 * 12 + 1)
typedef struct optlist {
    int n;
    lm_tensor_view p[QWEN_TENSORS], g[QWEN_TENSORS], m[QWEN_TENSORS], v[QWEN_TENSORS];
    float wd[QWEN_TENSORS];
} optlist;
/* shift: every view starts that many elements later (1: off the 16-byte boundaries;
 * the last tensor is one element shorter). Returns the element count covered. */
static int64_t optlist_init(optlist *l, lm_tensor *p, lm_tensor *g, lm_tensor *m, lm_tensor *v, int64_t shift) {
    int64_t sizes[QWEN_TENSORS], k = 0, off = shift;
    sizes[k++] = 151936 * 896;
    for (int i = 0; i < 24; i++) {
        const int64_t layer[12] = {896 * 896, 896, 128 * 896, 128, 128 * 896, 128, 896 * 896, 4864 * 896, 4864 * 896,
                                   896 * 4864, 896, 896};
        for (int j = 0; j < 12; j++) sizes[k++] = layer[j];
    }
    sizes[k++] = 896 - shift;
    l->n = (int)k;
    for (int i = 0; i < l->n; i++) {
        lm_tensor *ts[4] = {p, g, m, v};
        lm_tensor_view *vs[4] = {&l->p[i], &l->g[i], &l->m[i], &l->v[i]};
        for (int t = 0; t < 4; t++)
            if (lm_tensor_view_slice(V(ts[t]), 0, off, off + sizes[i], 1, vs[t]) != LM_OK) {
                fprintf(stderr, "optlist: %s\n", lm_last_error());
                exit(1);
            }
        l->wd[i] = sizes[i] == 896 || sizes[i] == 128 ? 0.0f : 0.1f; /* no decay on norms and biases */
        off += sizes[i];
    }
    return off - shift;
}
static lm_status adamw_list(void *arg) {
    optlist *l = arg;
    lm_adamw_hparams hp = {3e-4, 0.9, 0.95, 1e-8, 1, 1.0};
    return lm_adamw_update(g_ctx, l->n, l->p, l->g, l->m, l->v, l->wd, &hp);
}
static lm_status sumsq(void *arg) {
    opt *o = arg;
    return lm_sum_squares_out(g_ctx, 1, V(o->g), V(o->m));
}

int main(int argc, char **argv) {
    g_only = argc > 2 ? argv[2] : NULL;
    int64_t R = argc > 1 ? atoll(argv[1]) : 8192, H = 896, I = 4864, Vv = 151936, B = 8, Tt = R / 8;
    if (lm_ctx_create(g_dev, 1, &g_ctx) != LM_OK) {
        fprintf(stderr, "no CUDA context: %s\n", lm_last_error());
        return 1;
    }
    const int64_t shapes[4][2] = {{896, 896}, {128, 896}, {4864, 896}, {896, 4864}}; /* [N, K] */
    const char *names[4] = {"q/o 896x896", "k/v 128x896", "gate/up 4864x896", "down 896x4864"};
    for (int i = 0; i < 4; i++) {
        int64_t N = shapes[i][0], K = shapes[i][1];
        lin l = {T2(LM_BF16, R, K), T2(LM_BF16, N, K), T2(LM_BF16, R, N), T2(LM_BF16, R, K), T2(LM_BF16, N, K), NULL};
        char nm[64];
        double fl = 2.0 * (double)R * (double)N * (double)K;
        snprintf(nm, sizeof nm, "linear fwd %s", names[i]);
        report(nm, lin_fwd, &l, fl, 0);
        snprintf(nm, sizeof nm, "linear bwd (dx+dw) %s", names[i]);
        report(nm, lin_bwd, &l, 2 * fl, 0);
        l.bias = make(LM_F32, 2, (int64_t[]){N, K});
        snprintf(nm, sizeof nm, "weight grad bf16 -> f32 add %s", names[i]);
        report(nm, grad_to_f32, &l, 0, (double)N * K * (2 + 4 + 4 + 4 + 4 + 4));
        snprintf(nm, sizeof nm, "linear bwd dx + dw added into f32 by the GEMM %s", names[i]);
        report(nm, lin_bwd_into_f32, &l, 2 * fl, 0);
        lm_tensor_destroy(l.bias);
        l.bias = make(LM_BF16, 1, &N);
        snprintf(nm, sizeof nm, "bias add %s", names[i]);
        report(nm, lin_bias, &l, 0, (double)R * N * 4);
        lm_tensor_destroy(l.x), lm_tensor_destroy(l.w), lm_tensor_destroy(l.y), lm_tensor_destroy(l.dx);
        lm_tensor_destroy(l.dw), lm_tensor_destroy(l.bias);
    }
    ew e = {T2(LM_BF16, R, I), T2(LM_BF16, R, I), T2(LM_BF16, R, I), T2(LM_BF16, R, I), T2(LM_BF16, R, I), NULL, NULL};
    report("add bf16 [R, I]", ew_add, &e, 0, (double)R * I * 6);
    report("swiglu fwd [R, I]", ew_swiglu, &e, 0, (double)R * I * 6);
    report("swiglu bwd [R, I]", ew_swiglu_bwd, &e, 0, (double)R * I * 10);
    for (int i = 0; i < 5; i++) lm_tensor_destroy(((lm_tensor **)&e)[i]);
    ew n = {T2(LM_BF16, R, H), T2(LM_BF16, R, H), T2(LM_BF16, R, H), T2(LM_BF16, R, H), NULL,
            make(LM_BF16, 1, &H), make(LM_BF16, 1, &H)};
    report("add_rmsnorm fwd [R, H]", ew_addnorm, &n, 0, (double)R * H * 8);
    report("add_rmsnorm bwd [R, H]", ew_addnorm_bwd, &n, 0, (double)R * H * 8);
    report("rmsnorm bwd [R, H]", ew_norm_bwd, &n, 0, (double)R * H * 6);
    report("add_rmsnorm bwd [R, H] dx only (one kernel, no dweight)", ew_addnorm_bwd_dx, &n, 0, (double)R * H * 8);
    {
        ewv u = {.w = n.w, .dw = n.dw};
        lm_tensor *flat[4];
        lm_tensor_view *uv[4] = {&u.a, &u.b, &u.c, &u.d};
        int64_t len = R * H + 8;
        for (int i = 0; i < 4; i++) {
            flat[i] = make(LM_BF16, 1, &len);
            lm_tensor_view sl;
            if (lm_tensor_view_slice(V(flat[i]), 0, 1, 1 + R * H, 1, &sl) != LM_OK ||
                lm_tensor_view_reshape(&sl, 2, (int64_t[]){R, H}, uv[i]) != LM_OK) {
                fprintf(stderr, "view: %s\n", lm_last_error());
                exit(1);
            }
        }
        report("add_rmsnorm bwd [R, H] readable path (rows off 16-byte boundaries)", ewv_addnorm_bwd, &u, 0,
               (double)R * H * 8);
        for (int i = 0; i < 4; i++) lm_tensor_destroy(flat[i]);
    }
    {
        int64_t shape[4] = {1, R, 14, 64}, half = 32, ps[2] = {1, R};
        float *f = malloc(sizeof(float) * 32);
        int32_t *pv = malloc(sizeof(int32_t) * (size_t)R);
        for (int i = 0; i < 32; i++) f[i] = (float)pow(1000000.0, -2.0 * i / 64.0);
        for (int64_t i = 0; i < R; i++) pv[i] = (int32_t)(i % 1024);
        rp q = {make(LM_BF16, 4, shape), make(LM_BF16, 4, shape), NULL, NULL};
        if (lm_tensor_from_host(g_dev, LM_F32, 1, &half, f, &q.inv) != LM_OK ||
            lm_tensor_from_host(g_dev, LM_I32, 2, ps, pv, &q.pos) != LM_OK) {
            fprintf(stderr, "upload: %s\n", lm_last_error());
            exit(1);
        }
        report("rope fwd q [1, R, 14, 64]", rope_fwd, &q, 0, (double)R * 896 * 4);
        report("rope bwd q [1, R, 14, 64]", rope_bwd, &q, 0, (double)R * 896 * 4);
        lm_tensor_destroy(q.x), lm_tensor_destroy(q.y), lm_tensor_destroy(q.inv), lm_tensor_destroy(q.pos);
        free(f), free(pv);
        int64_t widths[2] = {896, 128};
        for (int i = 0; i < 2; i++) {
            ew b = {T2(LM_BF16, R, widths[i]), make(LM_BF16, 1, &widths[i]), NULL, NULL, NULL, NULL, NULL};
            char nm[64];
            snprintf(nm, sizeof nm, "bias grad column sums [R, %lld]", (long long)widths[i]);
            report(nm, col_sum, &b, 0, (double)R * widths[i] * 2);
            lm_tensor_destroy(b.a), lm_tensor_destroy(b.b);
        }
        int64_t E = 151936LL * 896;
        ew g = {make(LM_BF16, 1, &E), make(LM_F32, 1, &E), make(LM_F32, 1, &E), NULL, NULL, NULL, NULL};
        ew g2 = {g.b, g.c, g.c, NULL, NULL, NULL, NULL};
        report("cast bf16 -> f32 [136M] (a widened gradient)", ew_cast, &g, 0, (double)E * 6);
        report("add f32 [136M] in place (into the gradient buffer)", ew_add, &g2, 0, (double)E * 12);
        lm_tensor_destroy(g.a), lm_tensor_destroy(g.b), lm_tensor_destroy(g.c);
    }
    int64_t P = 494032768;
    ew c = {make(LM_F32, 1, &P), make(LM_BF16, 1, &P), NULL, NULL, NULL, NULL, NULL};
    report("cast f32 -> bf16 weights [494M]", ew_cast, &c, 0, (double)P * 6);
    opt o = {c.a, make(LM_F32, 1, &P), make(LM_F32, 1, &P), make(LM_F32, 1, &P)};
    report("adamw f32 [494M]", adamw, &o, 0, (double)P * 28);
    {
        static optlist ol;
        int64_t cov = optlist_init(&ol, c.a, c.b, o.m, o.v, 0);
        report("adamw Qwen2.5-0.5B 290 tensors, bf16 grads [494M]", adamw_list, &ol, 0, (double)cov * 26);
        cov = optlist_init(&ol, c.a, c.b, o.m, o.v, 1);
        report("adamw Qwen2.5-0.5B 290 tensors, bf16 grads, off 16-byte boundaries (scalar loop)", adamw_list, &ol, 0,
               (double)cov * 26);
    }
    lm_tensor_destroy(o.m);
    o.m = make(LM_F32, 0, NULL);
    report("sum of squares f32 [494M]", sumsq, &o, 0, (double)P * 4);
    lm_tensor_destroy(c.a), lm_tensor_destroy(c.b), lm_tensor_destroy(o.g), lm_tensor_destroy(o.m), lm_tensor_destroy(o.v);
    for (int i = 0; i < 4; i++) lm_tensor_destroy(((lm_tensor **)&n)[i]);
    lm_tensor_destroy(n.w), lm_tensor_destroy(n.dw);
    /* attention: [B, T, H, D] buffers viewed [B, H, T, D] (B, T, Hq, Hkv, D below); the
     * step's shape, the Llama-3.2-1B training shape (B 4, T 2048, 32 query heads over 8 kv
     * heads) and a head dim 128 shape (Llama-3-8B's heads, B 2, T 2048) */
    const int64_t ashapes[3][5] = {{B, Tt, 14, 2, 64}, {4, 2 * Tt, 32, 8, 64}, {2, 2 * Tt, 32, 8, 128}};
    for (int sh = 0; sh < 3; sh++) {
        int64_t ab = ashapes[sh][0], at = ashapes[sh][1], hq = ashapes[sh][2], hk = ashapes[sh][3], hd = ashapes[sh][4];
        att a;
        a.scale = 1.0f / sqrtf((float)hd);
        int64_t qs[4] = {ab, at, hq, hd}, ks[4] = {ab, at, hk, hd};
        a.q = make(LM_BF16, 4, qs), a.o = make(LM_BF16, 4, qs), a.dq = make(LM_BF16, 4, qs);
        a.k = make(LM_BF16, 4, ks), a.v = make(LM_BF16, 4, ks);
        a.dk = make(LM_BF16, 4, ks), a.dv = make(LM_BF16, 4, ks);
        lm_tensor *ts[7] = {a.q, a.k, a.v, a.o, a.dq, a.dk, a.dv};
        lm_tensor_view *vs[7] = {&a.qv, &a.kv, &a.vv, &a.ov, &a.dqv, &a.dkv, &a.dvv};
        for (int i = 0; i < 7; i++) lm_tensor_view_transpose(V(ts[i]), 1, 2, vs[i]);
        double afl = 4.0 * ab * hq * (double)at * at * hd / 2; /* causal */
        char nm[128];
        snprintf(nm, sizeof nm, "attention fwd (flash) B%lld T%lld H%lld/%lld D%lld causal", (long long)ab, (long long)at,
                 (long long)hq, (long long)hk, (long long)hd);
        report(nm, att_fwd, &a, afl, 0);
        snprintf(nm, sizeof nm, "attention bwd (flash, incl. recompute) B%lld T%lld H%lld/%lld D%lld causal",
                 (long long)ab, (long long)at, (long long)hq, (long long)hk, (long long)hd);
        report(nm, att_bwd, &a, 2.5 * afl, 0);
        int64_t ls[3] = {ab, hq, at};
        a.lse = make(LM_F32, 3, ls);
        snprintf(nm, sizeof nm, "attention fwd (flash, keeping lse) B%lld T%lld H%lld/%lld D%lld causal", (long long)ab,
                 (long long)at, (long long)hq, (long long)hk, (long long)hd);
        report(nm, att_fwd_lse, &a, afl, 0);
        snprintf(nm, sizeof nm, "attention bwd (flash, from saved out + lse) B%lld T%lld H%lld/%lld D%lld causal",
                 (long long)ab, (long long)at, (long long)hq, (long long)hk, (long long)hd);
        report(nm, att_bwd_lse, &a, 2.5 * afl, 0);
        lm_tensor_destroy(a.lse);
        for (int i = 0; i < 7; i++) lm_tensor_destroy(ts[i]);
    }
    lce l = {T2(LM_BF16, R, H), T2(LM_BF16, Vv, H), make(LM_I32, 1, &R), make(LM_F32, 0, NULL),
             make(LM_F32, 0, NULL), T2(LM_BF16, R, H), T2(LM_BF16, Vv, H)};
    float one = 1.0f;
    lm_tensor_view_write(g_ctx, V(l.dloss), &one);
    double lfl = 2.0 * R * (double)Vv * H;
    report("linear+CE fwd", lce_fwd, &l, lfl, 0);
    report("linear+CE bwd", lce_bwd, &l, 3 * lfl, 0);
    report("linear+CE fwd with grads (training)", lce_grads, &l, 3 * lfl, 0);
    report("linear+CE grads scaled by dloss (training bwd)", lce_scale, &l, 0, 4.0 * (R + (double)Vv) * H);
    lm_ctx_destroy(g_ctx);
    return 0;
}
