/* bench/cpu_linear_int8.c — decode GEMV cost of int8 against bf16 weights on the CPU:
 * lm__cpu_linear (bf16 W) and lm__cpu_linear_i8 (int8 W + f32 row scales), one x row,
 * at the Qwen2.5-0.5B shapes (K=896,N=4864 up/gate; K=4864,N=896 down; K=896,N=151936
 * lm_head), 1 and 2 threads, plus one prefill GEMM (M=128) to show packing int8 costs
 * what packing bf16 does, and one small L2-resident GEMV (the kernels' compute
 * ceiling, with no DRAM traffic). Each other weight matrix is replicated into enough copies (>= 384
 * MB in all) that every call streams cold weights from DRAM, as a decode step does;
 * calls of the two dtypes alternate, so both see the same machine state. Prints one
 * JSON object per (shape, threads, dtype): median and best microseconds per call over
 * the runs and, for the gemv, the weight bytes read per second of the median (the
 * scales are counted: 4N bytes; GFLOP/s for the GEMM), then the int8/bf16 speedup of
 * the medians.
 *
 * Build (after building libloom.a in BUILD):
 *   cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc bench/cpu_linear_int8.c \
 *      BUILD/libloom.a -ljansson -lpcre2-8 -lutf8proc -lm -lpthread -o cpu_linear_int8
 * Run: ./cpu_linear_int8 [runs] [isa: scalar|avx2|avx512]
 *
 * Lab (not in src/): an AVX-512 VNNI gemv that also quantizes x, "vnni" below. x is
 * cut into groups of 32 values, each with its own f32 scale (max |x| / 127); the
 * product of one 64-byte chunk of a weight row is vpdpbusd(|xq| as u8, q with the
 * sign of xq folded in by a masked negate), 16 int32 lanes of 4 products each. A
 * group is the 32 values one lane sees over 8 consecutive chunks (a 512-value super
 * block; lane L holds k = 64c + 4L + j, c < 8, j < 4), so a lane's int32 sum needs one
 * scale and is converted to f32 once per 512 weights. Its error is that of 8-bit
 * activations (reported as NMSE against the f32-exact int8 product), which is why it
 * is not in the library: lm_linear_out promises f32 rounding only.
 */
#include "loom/loom.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/matmul.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_VNNI_LAB 1
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

/* x quantized for the lab kernel: K padded to whole 64-value chunks. */
typedef struct vnni_x {
    int64_t K, kp, nsb;
    uint8_t *mag;   /* [kp] |xq| */
    uint64_t *neg;  /* [kp / 64] bit j of word c: xq[64c + j] < 0 */
    float *scale;   /* [nsb * 16] group scales, lane-major within a super block */
} vnni_x;

static void vnni_quantize_x(const float *x, int64_t K, vnni_x *v) {
    v->K = K, v->kp = (K + 63) / 64 * 64, v->nsb = (v->kp + 511) / 512;
    memset(v->mag, 0, (size_t)v->kp);
    memset(v->neg, 0, sizeof(uint64_t) * (size_t)(v->kp / 64));
    for (int64_t sb = 0; sb < v->nsb; sb++)
        for (int lane = 0; lane < 16; lane++) {
            float amax = 0;
            for (int c = 0; c < 8; c++)
                for (int j = 0; j < 4; j++) {
                    int64_t k = sb * 512 + c * 64 + 4 * lane + j;
                    if (k < K) amax = fmaxf(amax, fabsf(x[k]));
                }
            float sc = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
            v->scale[sb * 16 + lane] = sc;
            for (int c = 0; c < 8; c++)
                for (int j = 0; j < 4; j++) {
                    int64_t k = sb * 512 + c * 64 + 4 * lane + j;
                    if (k >= K) continue;
                    int qv = (int)nearbyintf(x[k] * inv);
                    v->mag[k] = (uint8_t)abs(qv);
                    if (qv < 0) v->neg[k / 64] |= 1ull << (k % 64);
                }
        }
}

/* y[r] = scales[r] * sum over super blocks of (group scales . int32 lane sums). */
VNNI_TARGET static void vnni_gemv_rows(const vnni_x *v, const int8_t *q, int64_t ldq, const float *scales,
                                       int64_t nrows, float *y) {
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t r = 0; r < nrows; r++) {
        const int8_t *qr = q + r * ldq;
        __m512 facc = _mm512_setzero_ps();
        for (int64_t sb = 0; sb < v->nsb; sb++) {
            __m512i a0 = zero, a1 = zero;
            for (int c = 0; c < 8; c++) {
                int64_t k0 = sb * 512 + c * 64;
                if (k0 >= v->K) break;
                __builtin_prefetch(qr + k0 + 4096, 0, 3);
                int64_t left = v->K - k0;
                __mmask64 m = left >= 64 ? ~0ull : (1ull << left) - 1;
                __m512i qv = _mm512_maskz_loadu_epi8(m, qr + k0);
                qv = _mm512_mask_sub_epi8(qv, (__mmask64)v->neg[k0 / 64], zero, qv);
                __m512i xa = _mm512_loadu_si512((const void *)(v->mag + k0));
                if (c & 1) a1 = _mm512_dpbusd_epi32(a1, xa, qv);
                else a0 = _mm512_dpbusd_epi32(a0, xa, qv);
            }
            facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)), _mm512_loadu_ps(v->scale + sb * 16),
                                   facc);
        }
        y[r] = _mm512_reduce_add_ps(facc) * scales[r];
    }
}

typedef struct vnni_job {
    const vnni_x *v;
    const int8_t *q;
    const float *scales;
    float *y;
    int64_t N, K, rows_per_task;
} vnni_job;

static void vnni_task(void *arg, int64_t task, int worker) {
    (void)worker;
    const vnni_job *j = arg;
    int64_t n0 = task * j->rows_per_task, n1 = n0 + j->rows_per_task < j->N ? n0 + j->rows_per_task : j->N;
    vnni_gemv_rows(j->v, j->q + n0 * j->K, j->K, j->scales + n0, n1 - n0, j->y + n0);
}

/* The lab gemv for one x row: quantize x, then rows split like the library's gemv. */
static void vnni_linear(lm_threadpool *pool, const float *x, vnni_x *v, const int8_t *q, const float *scales,
                        float *y, int64_t N, int64_t K) {
    vnni_quantize_x(x, K, v);
    int64_t tasks = 4 * lm_threadpool_size(pool);
    vnni_job j = {v, q, scales, y, N, K, ((N + tasks - 1) / tasks + 15) / 16 * 16};
    lm_threadpool_run(pool, (N + j.rows_per_task - 1) / j.rows_per_task, vnni_task, &j);
}
#endif

#define POOL_BYTES (384.0 * 1024 * 1024)

typedef struct shape {
    const char *name;
    int64_t M, K, N;
    int hot; /* 1: one copy that stays in L2, the kernels' compute ceiling */
} shape;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static int copies_for(double bytes) {
    int c = (int)(POOL_BYTES / bytes + 0.999);
    return c < 2 ? 2 : c;
}

static void print_result(const shape *s, int threads, const char *dt, double *t, int runs, double bytes) {
    qsort(t, (size_t)runs, sizeof *t, cmp_double);
    double med = t[runs / 2];
    /* gemv: weight bytes per second; GEMM (M > 1): GFLOP/s */
    double rate = s->M == 1 ? bytes / med * 1e-3 : 2.0 * (double)(s->M * s->N * s->K) / med * 1e-3;
    printf("{\"bench\": \"cpu_linear_int8\", \"shape\": \"%s\", \"M\": %lld, \"K\": %lld, \"N\": %lld, "
           "\"threads\": %d, "
           "\"dtype\": \"%s\", \"us_median\": %.1f, \"us_best\": %.1f, \"%s\": %.2f}\n",
           s->name, (long long)s->M, (long long)s->K, (long long)s->N, threads, dt, med, t[0],
           s->M == 1 ? "weight_GBps" : "GFLOPs", rate);
}

static void bench_shape(const shape *s, int runs) {
    int64_t M = s->M, K = s->K, N = s->N;
    double b16 = 2.0 * (double)(N * K), b8 = (double)(N * K) + 4.0 * (double)N;
    /* int8 copies: even ones for the library kernel, odd ones for the lab kernel, so
     * neither reads what the other just pulled into the L3 */
    int c16 = s->hot ? 1 : copies_for(b16), c8 = s->hot ? 1 : (copies_for(b8) + 1) / 2 * 2;
    uint16_t **w16 = xmalloc(sizeof *w16 * (size_t)c16);
    int8_t **w8 = xmalloc(sizeof *w8 * (size_t)c8);
    float **sc = xmalloc(sizeof *sc * (size_t)c8);
    for (int c = 0; c < c16; c++) {
        w16[c] = xmalloc(sizeof(uint16_t) * (size_t)(N * K));
        for (int64_t i = 0; i < N * K; i++)
            w16[c][i] = lm_f32_to_bf16(((float)(next_u32() % 2001) - 1000.0f) * 1e-5f);
    }
    for (int c = 0; c < c8; c++) {
        w8[c] = xmalloc((size_t)(N * K));
        sc[c] = xmalloc(sizeof(float) * (size_t)N);
        for (int64_t i = 0; i < N * K; i++) w8[c][i] = (int8_t)((int)(next_u32() % 255) - 127);
        for (int64_t n = 0; n < N; n++) sc[c][n] = 1e-4f;
    }
    float *x = xmalloc(sizeof(float) * (size_t)(M * K)), *y = xmalloc(sizeof(float) * (size_t)(M * N));
    for (int64_t i = 0; i < M * K; i++) x[i] = ((float)(next_u32() % 2001) - 1000.0f) * 1e-3f;
    double *t16 = xmalloc(sizeof(double) * (size_t)runs), *t8 = xmalloc(sizeof(double) * (size_t)runs);
    double *tv = xmalloc(sizeof(double) * (size_t)runs);
#ifdef HAVE_VNNI_LAB
    int vnni = M == 1 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
    vnni_x vx = {0};
    float *yv = xmalloc(sizeof(float) * (size_t)N);
    if (vnni) {
        int64_t kp = (K + 63) / 64 * 64;
        vx.mag = xmalloc((size_t)kp), vx.neg = xmalloc(sizeof(uint64_t) * (size_t)(kp / 64));
        vx.scale = xmalloc(sizeof(float) * (size_t)((kp + 511) / 512 * 16));
    }
#endif
    for (int threads = 1; threads <= 2; threads++) {
        lm_threadpool *pool = NULL;
        if (threads > 1 && lm_threadpool_create(threads, &pool) != LM_OK) {
            fprintf(stderr, "threadpool: %s\n", lm_last_error());
            exit(1);
        }
        /* one untimed pass over every copy warms the pool and the page tables */
        for (int c = 0; c < (c16 > c8 ? c16 : c8); c++) {
            lm__cpu_linear(pool, x, K, w16[c % c16], LM_BF16, K, y, N, M, N, K);
            lm__cpu_linear_i8(pool, x, K, w8[c % c8], K, sc[c % c8], NULL, 0, y, N, M, N, K);
        }
        for (int r = 0; r < runs; r++) {
            double t0 = now_us();
            lm__cpu_linear(pool, x, K, w16[r % c16], LM_BF16, K, y, N, M, N, K);
            double t1 = now_us();
            int i8 = (2 * r) % c8, lab = (2 * r + 1) % c8;
            lm__cpu_linear_i8(pool, x, K, w8[i8], K, sc[i8], NULL, 0, y, N, M, N, K);
            double t2 = now_us();
            t16[r] = t1 - t0, t8[r] = t2 - t1;
#ifdef HAVE_VNNI_LAB
            if (vnni) {
                double t3 = now_us();
                vnni_linear(pool, x, &vx, w8[lab], sc[lab], yv, N, K);
                tv[r] = now_us() - t3;
            }
#endif
        }
        print_result(s, threads, "bf16", t16, runs, b16);
        print_result(s, threads, "i8", t8, runs, b8);
        double med16 = t16[runs / 2], med8 = t8[runs / 2];
        printf("{\"bench\": \"cpu_linear_int8\", \"shape\": \"%s\", \"threads\": %d, \"i8_speedup_median\": %.2f}\n",
               s->name, threads, med16 / med8);
#ifdef HAVE_VNNI_LAB
        if (vnni) {
            /* error of the lab kernel: NMSE against the exact (double) int8 product */
            lm__cpu_linear_i8(pool, x, K, w8[0], K, sc[0], NULL, 0, y, N, M, N, K);
            vnni_linear(pool, x, &vx, w8[0], sc[0], yv, N, K);
            double num = 0, den = 0, num8 = 0;
            for (int64_t n = 0; n < N; n++) {
                double exact = 0;
                for (int64_t k = 0; k < K; k++) exact += (double)x[k] * w8[0][n * K + k];
                exact *= sc[0][n];
                num += (yv[n] - exact) * (yv[n] - exact), num8 += (y[n] - exact) * (y[n] - exact);
                den += exact * exact;
            }
            print_result(s, threads, "i8_vnni_lab", tv, runs, b8);
            printf("{\"bench\": \"cpu_linear_int8\", \"shape\": \"%s\", \"threads\": %d, "
                   "\"vnni_vs_i8_speedup_median\": %.2f, \"vnni_nmse\": %.3g, \"i8_nmse\": %.3g}\n",
                   s->name, threads, med8 / tv[runs / 2], num / den, num8 / den);
        }
#endif
        fflush(stdout);
        lm_threadpool_destroy(pool);
    }
    for (int c = 0; c < c16; c++) free(w16[c]);
    for (int c = 0; c < c8; c++) free(w8[c]), free(sc[c]);
#ifdef HAVE_VNNI_LAB
    free(vx.mag), free(vx.neg), free(vx.scale), free(yv);
#endif
    free(w16), free(w8), free(sc), free(x), free(y), free(t16), free(t8), free(tv);
}

int main(int argc, char **argv) {
    int runs = argc > 1 ? atoi(argv[1]) : 21;
    if (runs < 1) runs = 1;
    if (argc > 2) {
        int isa = -1;
        for (int i = 0; i < LM__CPU_ISA_COUNT; i++)
            if (strcmp(argv[2], lm__cpu_isa_name((lm__cpu_isa)i)) == 0) isa = i;
        if (isa < 0 || lm__cpu_set_isa_override(isa) != LM_OK) {
            fprintf(stderr, "isa '%s' is unknown or not runnable here\n", argv[2]);
            return 2;
        }
    }
    printf("{\"bench\": \"cpu_linear_int8\", \"isa\": \"%s\", \"runs\": %d}\n", lm__cpu_isa_name(lm__cpu_isa_active()),
           runs);
    static const shape shapes[] = {
        {"up/gate K=896 N=4864", 1, 896, 4864, 0},
        {"down K=4864 N=896", 1, 4864, 896, 0},
        {"lm_head K=896 N=151936", 1, 896, 151936, 0},
        {"prefill up/gate M=128 K=896 N=4864", 128, 896, 4864, 0},
        {"hot (L2-resident) K=896 N=256", 1, 896, 256, 1},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        bench_shape(&shapes[i], shapes[i].hot ? runs * 50 : shapes[i].N > 100000 ? (runs + 1) / 2 : runs);
    return 0;
}
