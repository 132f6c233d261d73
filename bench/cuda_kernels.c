/* bench/cuda_kernels.c — a timing lab for the model step's CUDA operators at one
 * model shape (default Qwen2.5-0.5B), in the llm.c dev/cuda habit: each operator runs
 * through its public entry point (lm_linear_out, lm_attention_cache_out, ...) on
 * synthetic device tensors, exactly as the executor calls it; 20 warm-up calls then
 * the mean of 200 timed with events, printed as one JSON line per case with achieved
 * GB/s (decode) or TFLOP/s (prefill). Correctness lives in tests/cuda; this only times.
 * Built by scripts/gpu_check.sh against the library:
 *   cc -O2 -Iinclude bench/cuda_kernels.c BUILD/libloom.a -lcudart -lcublasLt ...
 * Quantized weights (int8, fp8, int4) run the same linear shapes at M = 1, 8, 32, 512;
 * bf16 batched-decode products at M = 4-32 (cuBLASLt) on rotating weight copies.
 * Usage: cuda_kernels [H I Hq Hkv hd V ctx]
 */
#include "loom/ops.h"
#include "loom/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;

static void die(const char *what) {
    fprintf(stderr, "%s: %s\n", what, lm_last_error());
    exit(1);
}

/* A device tensor filled with a small finite 16-bit pattern (values do not matter
 * for timing; f32 elements read it as small normal numbers). */
static lm_tensor *dev(lm_dtype dt, int ndim, const int64_t *shape) {
    lm_tensor *t = NULL;
    if (lm_tensor_zeros(lm_device_cuda(0), dt, ndim, shape, &t) != LM_OK) die("alloc");
    const lm_tensor_view *v = lm_tensor_as_view(t);
    uint16_t one = 0x3c00;
    size_t bytes = (size_t)lm_tensor_view_numel(v) * lm_dtype_size(dt);
    if (dt != LM_I32 && lm_device_fill(lm_device_cuda(0), v->data, bytes & ~(size_t)1, &one, 2) != LM_OK) die("fill");
    return t;
}

static const lm_tensor_view *V(lm_tensor *t) { return lm_tensor_as_view(t); }

static lm_tensor *dev_i32(int64_t n, const int32_t *host) {
    lm_tensor *t = NULL;
    if (lm_tensor_from_host(lm_device_cuda(0), LM_I32, 1, &n, host, &t) != LM_OK) die("upload");
    return t;
}

typedef lm_status (*case_fn)(void *arg);

/* Mean microseconds per call of fn over 200 runs after 20 warm-ups. */
static double time_us(case_fn fn, void *arg) {
    lm_event *a = NULL, *b = NULL;
    lm_event_create(g_ctx, &a);
    lm_event_create(g_ctx, &b);
    for (int i = 0; i < 20; i++)
        if (fn(arg) != LM_OK) die("operator");
    lm_event_record(a, g_ctx);
    for (int i = 0; i < 200; i++) fn(arg);
    lm_event_record(b, g_ctx);
    lm_event_synchronize(b);
    double ms = 0;
    lm_event_elapsed_ms(a, b, &ms);
    lm_event_destroy(a);
    lm_event_destroy(b);
    return ms * 1e3 / 200;
}

typedef struct linear_args {
    lm_tensor_view x, w, out;
    lm_linear_params p;
} linear_args;
static lm_status run_linear(void *arg) {
    linear_args *a = arg;
    return lm_linear_out(g_ctx, &a->x, &a->w, NULL, &a->p, &a->out);
}

/* A linear over n copies of its weights, the next copy each call. */
typedef struct rot_args {
    linear_args a;
    lm_tensor_view w[64];
    int n, i;
} rot_args;
static lm_status run_rot(void *arg) {
    rot_args *r = arg;
    r->a.w = r->w[r->i++ % r->n];
    return run_linear(&r->a);
}

typedef struct attn_args {
    lm_tensor_view q, kc, vc, slots, pos, out;
    lm_kv_attention_params p;
} attn_args;
static lm_status run_attn(void *arg) {
    attn_args *a = arg;
    return lm_attention_cache_out(g_ctx, &a->q, &a->kc, &a->vc, &a->slots, &a->pos, &a->p, &a->out);
}

typedef struct rope_args {
    lm_tensor_view qkv, slots, pos, kc, vc, q;
    lm_qkv_rope_params p;
} rope_args;
static lm_status run_rope(void *arg) {
    rope_args *a = arg;
    return lm_qkv_rope_store_out(g_ctx, &a->qkv, &a->p, &a->slots, &a->pos, &a->kc, &a->vc, &a->q);
}

typedef struct sample_args {
    lm_tensor_view logits, params, work, ids;
} sample_args;
static lm_status run_sample(void *arg) {
    sample_args *a = arg;
    return lm_sample_out(g_ctx, &a->logits, &a->params, &a->work, &a->ids);
}

static void report(const char *name, double us, double bytes, double flops) {
    printf("{\"kernel\":\"%s\",\"us\":%.2f,\"gb_s\":%.1f,\"tflop_s\":%.1f}\n", name, us, bytes / us / 1e3, flops / us / 1e6);
}

/* First `rows` rows of a [R, C] tensor. */
static lm_tensor_view rows_of(lm_tensor *t, int64_t rows) {
    lm_tensor_view v;
    lm_tensor_view_slice(V(t), 0, 0, rows, 1, &v);
    return v;
}

/* [B, T, ...inner] view of the first B*T rows and first prod(inner) columns of a
 * [R, C] tensor. */
static lm_tensor_view tokens_of(lm_tensor *t, int64_t B, int64_t T, int n, const int64_t *inner) {
    int64_t cols = 1;
    for (int i = 0; i < n; i++) cols *= inner[i];
    lm_tensor_view r = rows_of(t, B * T), c, bt, out;
    int64_t f[2] = {B, T};
    if (lm_tensor_view_slice(&r, 1, 0, cols, 1, &c) != LM_OK || lm_tensor_view_split_axis(&c, 0, 2, f, &bt) != LM_OK ||
        lm_tensor_view_split_axis(&bt, 2, n, inner, &out) != LM_OK)
        die("view");
    return out;
}

int main(int argc, char **argv) {
    int64_t H = 896, I = 4864, Hq = 14, Hkv = 2, hd = 64, Vocab = 151936, ctx = 144;
    if (argc == 8) {
        H = atoll(argv[1]), I = atoll(argv[2]), Hq = atoll(argv[3]), Hkv = atoll(argv[4]);
        hd = atoll(argv[5]), Vocab = atoll(argv[6]), ctx = atoll(argv[7]);
    }
    if (lm_cuda_device_count() == 0) return 77;
    if (lm_ctx_create(lm_device_cuda(0), 1, &g_ctx) != LM_OK) die("context");
    int64_t nqkv = (Hq + 2 * Hkv) * hd, qd = Hq * hd, T = 512, maxr = 512;
    int64_t wide = Vocab > 2 * I ? Vocab : 2 * I;
    int64_t xs[2] = {maxr, 2 * I}, os[2] = {maxr, wide}, hs[1] = {H};
    lm_tensor *x = dev(LM_F32, 2, xs), *out = dev(LM_F32, 2, os), *nw = dev(LM_F32, 1, hs), *xb = dev(LM_BF16, 2, xs);
    int64_t sq[2] = {nqkv, H}, so[2] = {H, qd}, sg[2] = {2 * I, H}, sd[2] = {H, I}, se[2] = {Vocab, H};
    lm_tensor *wqkv = dev(LM_BF16, 2, sq), *wo = dev(LM_BF16, 2, so), *wgu = dev(LM_BF16, 2, sg);
    lm_tensor *wd = dev(LM_BF16, 2, sd), *emb = dev(LM_BF16, 2, se);
    /* decode GEMVs, M = 1 and 8, through lm_linear_out's fused forms */
    struct {
        const char *name;
        lm_linear_input in;
        lm_tensor *w;
        int64_t N, K;
        int acc;
    } g[5] = {{"linear qkv (rmsnorm)", LM_LINEAR_IN_RMSNORM, wqkv, nqkv, H, 0},
              {"linear o (+residual)", LM_LINEAR_IN, wo, H, qd, 1},
              {"linear gate|up (rmsnorm)", LM_LINEAR_IN_RMSNORM, wgu, 2 * I, H, 0},
              {"linear down (swiglu, +residual)", LM_LINEAR_IN_SWIGLU, wd, H, I, 1},
              {"linear lm_head (rmsnorm)", LM_LINEAR_IN_RMSNORM, emb, Vocab, H, 0}};
    for (int m = 1; m <= 8; m *= 8)
        for (int i = 0; i < 5; i++) {
            linear_args a;
            memset(&a, 0, sizeof a);
            int64_t kx = g[i].in == LM_LINEAR_IN_SWIGLU ? 2 * g[i].K : g[i].K;
            lm_tensor_view xr = rows_of(x, m), orow = rows_of(out, m);
            lm_tensor_view_slice(&xr, 1, 0, kx, 1, &a.x);
            lm_tensor_view_slice(&orow, 1, 0, g[i].N, 1, &a.out);
            a.w = *V(g[i].w);
            lm_linear_params p = {.input = g[i].in, .norm_weight = g[i].in == LM_LINEAR_IN_RMSNORM ? V(nw) : NULL,
                                  .eps = 1e-6f, .accumulate = g[i].acc};
            if (g[i].in == LM_LINEAR_IN_RMSNORM && g[i].K != H) die("shape");
            a.p = p;
            /* (graphs give the GEMV fewer rows than lm_linear_out runs in it: lm__linear_graph_rule) */
            char name[80];
            snprintf(name, sizeof name, "%s M%d", g[i].name, m);
            report(name, time_us(run_linear, &a), 2.0 * g[i].N * g[i].K, 2.0 * m * g[i].N * g[i].K);
        }
    /* decode attention and the fused QKV front over one layer's cache */
    int64_t slots = 32, max_t = 512;
    int64_t cs[4] = {slots, Hkv, max_t, hd};
    lm_tensor *kc = dev(LM_BF16, 4, cs), *vc = dev(LM_BF16, 4, cs);
    int32_t pos[512], slot[512];
    for (int i = 0; i < 512; i++) pos[i] = (int32_t)ctx, slot[i] = i;
    lm_tensor *dpos = dev_i32(512, pos), *dslot = dev_i32(512, slot);
    int64_t fs[1] = {hd / 2};
    lm_tensor *inv = dev(LM_F32, 1, fs);
    for (int64_t b = 1; b <= 32; b *= 32) {
        size_t wb = lm_attention_cache_workspace_bytes(lm_device_cuda(0), b, Hq, hd, max_t);
        int64_t wn = wb ? (int64_t)wb : 1;
        lm_tensor *work = NULL;
        if (lm_tensor_zeros(lm_device_cuda(0), LM_U8, 1, &wn, &work) != LM_OK) die("workspace");
        attn_args a;
        memset(&a, 0, sizeof a);
        int64_t p2[2] = {b, 1}, q4[4] = {b, 1, Hq, hd};
        lm_tensor *qt = dev(LM_F32, 4, q4), *ot = dev(LM_F32, 4, q4); /* contiguous, as the step's */
        a.q = *V(qt), a.out = *V(ot);
        a.kc = *V(kc), a.vc = *V(vc);
        a.slots = rows_of(dslot, b);
        lm_tensor_view pr = rows_of(dpos, b);
        lm_tensor_view_reshape(&pr, 2, p2, &a.pos);
        a.p.scale = 0.125f, a.p.workspace = wb ? V(work) : NULL;
        char name[80];
        snprintf(name, sizeof name, "attention_cache ctx %lld B%lld", (long long)ctx, (long long)b);
        report(name, time_us(run_attn, &a), 2.0 * b * 2 * Hkv * (ctx + 1) * hd, 0);
        rope_args r;
        memset(&r, 0, sizeof r);
        int64_t x3[3] = {b, 1, nqkv};
        lm_tensor *qkv = dev(LM_F32, 3, x3); /* contiguous, as the stacked projection writes it */
        r.qkv = *V(qkv);
        r.q = *V(ot);
        r.kc = *V(kc), r.vc = *V(vc), r.slots = a.slots, r.pos = a.pos;
        r.p.q_heads = Hq, r.p.inv_freq = V(inv), r.p.attn_factor = 1.f, r.p.eps = 1e-6f;
        snprintf(name, sizeof name, "qkv_rope_store B%lld", (long long)b);
        report(name, time_us(run_rope, &r), 4.0 * b * nqkv, 0);
        lm_tensor_destroy(work), lm_tensor_destroy(qt), lm_tensor_destroy(ot), lm_tensor_destroy(qkv);
    }
    /* token selection */
    lm_sample_params sp;
    memset(&sp, 0, sizeof sp);
    sp.greedy = 1, sp.temperature = 1.f, sp.top_p = 1.f;
    int64_t pb = LM_SAMPLE_PARAMS_BYTES;
    lm_tensor *dsp = NULL;
    if (lm_tensor_from_host(lm_device_cuda(0), LM_U8, 1, &pb, &sp, &dsp) != LM_OK) die("params");
    int64_t wsb = (int64_t)lm_sample_workspace_bytes(lm_device_cuda(0), 32);
    lm_tensor *swork = dev(LM_U8, 1, &wsb), *ids = dev_i32(32, slot);
    for (int64_t b = 1; b <= 32; b *= 32) {
        sample_args s;
        lm_tensor_view lr = rows_of(out, b);
        lm_tensor_view_slice(&lr, 1, 0, Vocab, 1, &s.logits);
        s.params = *V(dsp), s.work = *V(swork), s.ids = rows_of(ids, b);
        char name[80];
        snprintf(name, sizeof name, "sample greedy B%lld", (long long)b);
        report(name, time_us(run_sample, &s), 4.0 * Vocab * b, 0);
    }
    /* prefill: the GEMM form of lm_linear_out at T = 512, and the flash attention */
    struct {
        const char *name;
        lm_tensor *w;
        int64_t N, K;
    } l[4] = {{"linear gemm qkv T512", wqkv, nqkv, H}, {"linear gemm o T512", wo, H, qd},
              {"linear gemm gate|up T512", wgu, 2 * I, H}, {"linear gemm down T512", wd, H, I}};
    for (int i = 0; i < 4; i++) {
        linear_args a;
        memset(&a, 0, sizeof a);
        lm_tensor_view xr = rows_of(xb, T), orow = rows_of(out, T);
        lm_tensor_view_slice(&xr, 1, 0, l[i].K, 1, &a.x);
        lm_tensor_view_slice(&orow, 1, 0, l[i].N, 1, &a.out);
        a.w = *V(l[i].w);
        a.p.input = LM_LINEAR_IN;
        report(l[i].name, time_us(run_linear, &a), 2.0 * (l[i].N * l[i].K + T * l[i].K + 2 * T * l[i].N),
               2.0 * T * l[i].N * l[i].K);
    }
    /* quantized weights (int8, fp8, int4 G32) in the same four shapes: the GEMV at M = 1
     * and 8 with the step's input forms, and past 8 rows (batched decode, prefill) the
     * workspace path (bf16 copies + cuBLASLt); GB/s counts the quantized weight bytes */
    static const struct {
        const char *name;
        lm_dtype dt;
        int bits, group;
    } qf[3] = {{"int8", LM_I8, 0, 0}, {"fp8", LM_F8_E4M3, 0, 0}, {"int4", LM_U8, 4, 32}};
    for (int f = 0; f < 3; f++)
        for (int i = 0; i < 4; i++) {
            int64_t N = g[i].N, K = g[i].K, cols = qf[f].bits == 4 ? K / 2 : K;
            int64_t qs[2] = {N, cols}, ss[2] = {N, qf[f].bits == 4 ? K / qf[f].group : 1};
            lm_tensor *qw = dev(qf[f].dt, 2, qs), *sc = dev(LM_F32, qf[f].bits == 4 ? 2 : 1, ss);
            static const int Ms[5] = {1, 4, 8, 32, 512};
            for (int mi = 0; mi < 5; mi++) {
                int m = Ms[mi];
                linear_args a;
                memset(&a, 0, sizeof a);
                int64_t kx = g[i].in == LM_LINEAR_IN_SWIGLU ? 2 * K : K;
                lm_tensor_view xr = rows_of(x, m), orow = rows_of(out, m);
                lm_tensor_view_slice(&xr, 1, 0, kx, 1, &a.x);
                lm_tensor_view_slice(&orow, 1, 0, N, 1, &a.out);
                a.w = *V(qw);
                lm_linear_params p = {.input = g[i].in, .norm_weight = g[i].in == LM_LINEAR_IN_RMSNORM ? V(nw) : NULL,
                                      .eps = 1e-6f, .accumulate = g[i].acc, .w_scales = V(sc), .w_bits = qf[f].bits,
                                      .w_group = qf[f].group};
                int64_t wsb = (int64_t)lm_linear_workspace_bytes(lm_device_cuda(0), m, N, K, qf[f].dt);
                lm_tensor *work = wsb ? dev(LM_U8, 1, &wsb) : NULL;
                p.workspace = work ? V(work) : NULL;
                a.p = p;
                char name[96];
                snprintf(name, sizeof name, "%s %s M%d", g[i].name, qf[f].name, m);
                double wbytes = (double)N * cols + 4.0 * ss[0] * ss[1];
                report(name, time_us(run_linear, &a), wbytes, 2.0 * m * N * K);
                lm_tensor_destroy(work);
            }
            lm_tensor_destroy(qw), lm_tensor_destroy(sc);
        }
    /* batched decode's bf16 products at M = 4, 8, 16, 32 (bf16 x, as the step gives them:
     * the cuBLASLt GEMM), each call on another copy of the weights cut from a 512 MiB
     * pool, so that they come from HBM as in a step and not from the L2 (the lm_head is
     * larger than the L2 by itself) */
    {
        int64_t pool_n = (int64_t)256 << 20;
        lm_tensor *pool = dev(LM_BF16, 1, &pool_n);
        struct {
            const char *name;
            int64_t N, K;
        } d[5] = {{"qkv", nqkv, H}, {"o", H, qd}, {"gate|up", 2 * I, H}, {"down", H, I}, {"lm_head", Vocab, H}};
        for (int m = 4; m <= 32; m *= 2)
            for (int i = 0; i < 5; i++) {
                rot_args a;
                memset(&a, 0, sizeof a);
                lm_tensor_view xr = rows_of(xb, m), orow = rows_of(out, m);
                lm_tensor_view_slice(&xr, 1, 0, d[i].K, 1, &a.a.x);
                lm_tensor_view_slice(&orow, 1, 0, d[i].N, 1, &a.a.out);
                a.a.p.input = LM_LINEAR_IN;
                int64_t per = d[i].N * d[i].K, copies = pool_n / per;
                a.n = (int)(copies < 1 ? 1 : copies > 64 ? 64 : copies);
                for (int c = 0; c < a.n; c++) {
                    int64_t shape[2] = {d[i].N, d[i].K};
                    lm_tensor_view flat;
                    if (copies >= 1) {
                        lm_tensor_view_slice(V(pool), 0, c * per, (c + 1) * per, 1, &flat);
                        lm_tensor_view_split_axis(&flat, 0, 2, shape, &a.w[c]);
                    } else {
                        a.w[c] = *V(emb);
                    }
                }
                char name[96];
                snprintf(name, sizeof name, "bf16 M%d: %s", m, d[i].name);
                report(name, time_us(run_rot, &a), 2.0 * d[i].N * d[i].K, 2.0 * m * d[i].N * d[i].K);
            }
        lm_tensor_destroy(pool);
    }
    for (int i = 0; i < 512; i++) pos[i] = i;
    lm_tensor *ppos = dev_i32(512, pos);
    attn_args f;
    memset(&f, 0, sizeof f);
    int64_t qh[2] = {Hq, hd}, p2[2] = {1, T};
    int64_t qos[2] = {T, qd};
    lm_tensor *qo = dev(LM_BF16, 2, qos);
    f.q = tokens_of(xb, 1, T, 2, qh);
    f.out = tokens_of(qo, 1, T, 2, qh);
    f.kc = *V(kc), f.vc = *V(vc), f.slots = rows_of(dslot, 1);
    lm_tensor_view pr = rows_of(ppos, T);
    lm_tensor_view_reshape(&pr, 2, p2, &f.pos);
    f.p.scale = 0.125f;
    report("attention_cache prefill T512", time_us(run_attn, &f), 0, 4.0 * Hq * hd * T * T / 2);
    lm_tensor *all[] = {x, out, nw, xb, wqkv, wo, wgu, wd, emb, kc, vc, dpos, dslot, inv, dsp, swork, ids, ppos, qo};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lm_tensor_destroy(all[i]);
    lm_ctx_destroy(g_ctx);
    return 0;
}
