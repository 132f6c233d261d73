/* bench/cuda_kernels.c — a timing lab for the forward pass's CUDA kernels at one
 * model shape (default Qwen2.5-0.5B), in the llm.c dev/cuda habit: each kernel runs
 * on synthetic device buffers, 20 warm-up launches then the mean of 200 timed with
 * events, printed as one JSON line per kernel with achieved GB/s (decode) or TFLOP/s
 * (prefill GEMMs). Correctness lives in tests/cuda; this only times.
 * Built by scripts/gpu_check.sh against the library (needs the internal headers):
 *   cc -O2 -Iinclude -Isrc bench/cuda_kernels.c BUILD/libloom.a -lcudart -lcublasLt ...
 * Usage: cuda_kernels [H I Hq Hkv hd V ctx]
 */
#include "ops/cuda/cuda_ops.h"

#include <stdio.h>
#include <stdlib.h>

static lm_ctx *g_ctx;
static cudaStream_t g_s;

static void *dev(size_t bytes) {
    void *p = NULL;
    if (lm_device_alloc(lm_device_cuda(0), bytes, &p) != LM_OK) {
        fprintf(stderr, "alloc %zu: %s\n", bytes, lm_last_error());
        exit(1);
    }
    uint16_t one = 0x3c00; /* small finite bf16/f16-ish pattern; values do not matter */
    lm_device_fill(lm_device_cuda(0), p, bytes & ~(size_t)1, &one, 2);
    return p;
}

typedef lm_status (*kernel_fn)(void *arg);

/* Mean microseconds per launch of fn over 200 runs after 20 warm-ups. */
static double time_us(kernel_fn fn, void *arg) {
    lm_event *a = NULL, *b = NULL;
    lm_event_create(g_ctx, &a);
    lm_event_create(g_ctx, &b);
    for (int i = 0; i < 20; i++)
        if (fn(arg) != LM_OK) {
            fprintf(stderr, "kernel failed: %s\n", lm_last_error());
            exit(1);
        }
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

static lm_status run_gemv(void *arg) { return lm__cuda_gemv_v2(arg, g_s); }

typedef struct lt_args {
    const lm__cuda_blas *blas;
    void *x, *w;
    float *out;
    int64_t M, N, K;
} lt_args;
static lm_status run_lt(void *arg) {
    lt_args *a = arg;
    return lm__cuda_linear_lt(a->blas, a->x, a->K, a->w, NULL, a->out, a->N, a->M, a->N, a->K, g_s);
}

typedef struct attn_args {
    lm__cuda_attn_params p;
    lm__cuda_kv kv;
    int B;
    int64_t T;
} attn_args;
static lm_status run_rows(void *arg) {
    attn_args *a = arg;
    return lm__cuda_attention_rows_v2(&a->p, &a->kv, g_s);
}
static lm_status run_flash(void *arg) {
    attn_args *a = arg;
    return lm__cuda_attention_prefill_v3(&a->p, a->B, a->T, &a->kv, g_s);
}

typedef struct sample_args {
    float *logits;
    int64_t rows, V;
    lm__cuda_sample_params *p;
    int32_t *out;
    void *work;
} sample_args;
static lm_status run_sample(void *arg) {
    sample_args *a = arg;
    return lm__cuda_sample_v2(a->logits, a->rows, a->V, a->V, a->p, a->out, a->work, g_s);
}

typedef struct rope_args {
    lm__cuda_qkv_params p;
    lm__cuda_kv kv;
} rope_args;
static lm_status run_rope(void *arg) {
    rope_args *a = arg;
    return lm__cuda_qkv_rope_v2(&a->p, &a->kv, g_s);
}

static void report(const char *name, double us, double bytes, double flops) {
    printf("{\"kernel\":\"%s\",\"us\":%.2f,\"gb_s\":%.1f,\"tflop_s\":%.1f}\n", name, us, bytes / us / 1e3, flops / us / 1e6);
}

int main(int argc, char **argv) {
    int64_t H = 896, I = 4864, Hq = 14, Hkv = 2, hd = 64, V = 151936, ctx = 144;
    if (argc == 8) {
        H = atoll(argv[1]), I = atoll(argv[2]), Hq = atoll(argv[3]), Hkv = atoll(argv[4]);
        hd = atoll(argv[5]), V = atoll(argv[6]), ctx = atoll(argv[7]);
    }
    if (lm_cuda_device_count() == 0 || lm_ctx_create(lm_device_cuda(0), 1, &g_ctx) != LM_OK) return 77;
    g_s = (cudaStream_t)lm_ctx_stream(g_ctx);
    const lm__cuda_blas *blas = NULL;
    lm__ctx_cuda_blas(g_ctx, &blas);
    int64_t nqkv = (Hq + 2 * Hkv) * hd, qd = Hq * hd, T = 512, maxr = 512;
    float *x = dev(4 * maxr * 2 * I), *out = dev(4 * maxr * (V > 2 * I ? V : 2 * I)), *nw = dev(4 * H);
    void *wqkv = dev(2 * nqkv * H), *wo = dev(2 * H * qd), *wgu = dev(2 * 2 * I * H), *wd = dev(2 * H * I);
    void *emb = dev(2 * V * H), *xb = dev(2 * maxr * I);
    /* decode GEMVs, M = 1 */
    struct {
        const char *name;
        lm__cuda_gemv_in in;
        void *w;
        int64_t N, K;
    } g[5] = {{"gemv qkv (rmsnorm)", LM__CUDA_GEMV_RMSNORM, wqkv, nqkv, H},
              {"gemv o", LM__CUDA_GEMV_PLAIN, wo, H, qd},
              {"gemv gate|up (rmsnorm)", LM__CUDA_GEMV_RMSNORM, wgu, 2 * I, H},
              {"gemv down (swiglu)", LM__CUDA_GEMV_SWIGLU, wd, H, I},
              {"gemv lm_head (rmsnorm)", LM__CUDA_GEMV_RMSNORM, emb, V, H}};
    for (int m = 1; m <= 8; m *= 8)
        for (int i = 0; i < 5; i++) {
            lm__cuda_gemv_params p = {g[i].in, x, g[i].in == LM__CUDA_GEMV_SWIGLU ? 2 * g[i].K : g[i].K, nw, 1e-6f, g[i].w,
                                     NULL, out, g[i].N, 0, m, g[i].N, g[i].K};
            char name[64];
            snprintf(name, sizeof name, "%s M%d", g[i].name, m);
            report(name, time_us(run_gemv, &p), 2.0 * g[i].N * g[i].K, 2.0 * m * g[i].N * g[i].K);
        }
    /* decode attention and the fused rope, one layer of the KV cache */
    int slots = 32;
    int64_t max_t = 512;
    void *kc = dev(2 * slots * Hkv * max_t * hd), *vc = dev(2 * slots * Hkv * max_t * hd);
    int32_t pos[512], slot[512];
    for (int i = 0; i < 512; i++) pos[i] = (int32_t)(i < 32 ? ctx : i), slot[i] = i < 32 ? i : 0;
    int32_t *dpos = dev(4 * 512), *dslot = dev(4 * 512);
    lm_device_copy(lm_device_cuda(0), dpos, lm_device_cpu(), pos, sizeof pos);
    lm_device_copy(lm_device_cuda(0), dslot, lm_device_cpu(), slot, sizeof slot);
    int nsplit = lm__cuda_attention_rows_splits(max_t);
    float *partial = dev(4 * lm__cuda_attention_rows_workspace(512, (int)Hq, (int)hd, nsplit));
    int *counters = dev(4 * 512 * Hq);
    cudaMemset(counters, 0, 4 * 512 * Hq);
    lm__cuda_kv kv = {kc, vc, max_t, (int)Hkv, (int)hd};
    for (int b = 1; b <= 32; b *= 32) {
        attn_args a = {{x, 0, dpos, dslot, b, (int)Hq, 0.125f, out, 0, partial, counters, nsplit}, kv, 1, 1};
        char name[64];
        snprintf(name, sizeof name, "attention_rows ctx %lld B%d", (long long)ctx, b);
        report(name, time_us(run_rows, &a), 2.0 * b * 2 * Hkv * (ctx + 1) * hd, 0);
        rope_args r = {{x, NULL, NULL, NULL, 1e-6f, nw, 1.f, dpos, dslot, b, (int)Hq, 0, out}, kv};
        snprintf(name, sizeof name, "qkv_rope B%d", b);
        report(name, time_us(run_rope, &r), 4.0 * b * nqkv, 0);
    }
    lm__cuda_sample_params sp = {1, 1.f, 0, 1.f, 0.f, 0, 0};
    lm__cuda_sample_params *dsp = dev(sizeof sp);
    lm_device_copy(lm_device_cuda(0), dsp, lm_device_cpu(), &sp, sizeof sp);
    sample_args sa = {out, 1, V, dsp, dslot, dev(lm__cuda_sample_workspace(32))};
    report("sample greedy B1", time_us(run_sample, &sa), 4.0 * V, 0);
    sa.rows = 32;
    report("sample greedy B32", time_us(run_sample, &sa), 4.0 * V * 32, 0);
    /* prefill: cuBLASLt GEMMs at T = 512 and the flash kernel */
    struct {
        const char *name;
        void *w;
        int64_t N, K;
    } l[4] = {{"lt qkv T512", wqkv, nqkv, H}, {"lt o T512", wo, H, qd}, {"lt gate|up T512", wgu, 2 * I, H},
              {"lt down T512", wd, H, I}};
    for (int i = 0; i < 4; i++) {
        lt_args a = {blas, xb, l[i].w, out, T, l[i].N, l[i].K};
        report(l[i].name, time_us(run_lt, &a), 2.0 * (l[i].N * l[i].K + T * l[i].K + 2 * T * l[i].N), 2.0 * T * l[i].N * l[i].K);
    }
    for (int i = 0; i < 512; i++) pos[i] = i, slot[i] = 0;
    lm_device_copy(lm_device_cuda(0), dpos, lm_device_cpu(), pos, sizeof pos);
    lm_device_copy(lm_device_cuda(0), dslot, lm_device_cpu(), slot, sizeof slot);
    attn_args f = {{xb, 1, dpos, dslot, T, (int)Hq, 0.125f, out, 1, NULL, NULL, 1}, kv, 1, T};
    report("flash prefill T512", time_us(run_flash, &f), 0, 4.0 * Hq * hd * T * T / 2);
    attn_args fr = {{xb, 1, dpos, dslot, T, (int)Hq, 0.125f, out, 1, partial, counters, nsplit}, kv, 1, T};
    report("rows prefill T512 (fallback)", time_us(run_rows, &fr), 0, 4.0 * Hq * hd * T * T / 2);
    lm_ctx_destroy(g_ctx);
    return 0;
}
