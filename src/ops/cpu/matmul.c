/* ops/cpu/matmul.c — driver of the tuned CPU linear layer (see matmul.h): picks the
 * kernel set for the active ISA, splits the work into thread-pool tasks and owns the
 * packing scratch.
 *
 * gemv (M up to 4-8, see the kernel tables): tasks are contiguous ranges of W rows,
 * so every weight is read from memory once per call. GEMM: tasks are (N block of <= nc
 * columns, M block) pairs; each task packs its W block one K block (<= kc) at a time
 * into its worker's scratch (kc * nc floats, sized for L2) and sweeps all its x rows
 * over it. Every y element is computed by one task in one fixed order, so the result
 * is the same for any thread count. int8 weights (lm__cpu_linear_i8) take the same
 * split: their kernels apply the row scale, the bias and the accumulate as they store
 * (gemv) or pack the scale into the panels and add the bias after the last K block;
 * int4 weights (lm__cpu_linear_i4, wdt u8 here) the same with one scale per group;
 * bf16 group scales (lm__i4_weights.scales16) are read where f32 ones are, by the
 * gemvs with the dtype a constant in each copy and by the GEMMs' packs per scale.
 * Fast precision (bf16 weights; ops/cpu/precision.h): the same tasks and blocks with
 * the lm__bf16dot_kernels, whose panels hold bf16 pairs and whose x strips are
 * rounded to bf16 once per (task, K block, mr rows) in the worker's scratch; the gemv
 * rounds all of x once per call and streams W rows as pairs; still one fixed order
 * per y element, so also thread-count independent. int8 and int4 weights at fast
 * precision: gemv and GEMM quantize x once per call (lm__i8dot_kernels: int8 blocks of
 * 64 k, VPDPBUSD); the GEMM packs the weights as unsigned bytes, 4 k per panel lane, and
 * keeps the same tasks and blocks (kc a multiple of 64), so it too is thread-count
 * independent.
 */
#include "ops/cpu/matmul.h"

#include "ops/cpu/matmul_kernels.h"
#include "ops/cpu/precision.h"

/* Below this many multiply-adds (a few microseconds on one core) a call runs on the
 * calling thread alone: waking the pool would cost about as much as it saves. */
#define SERIAL_MACS 65536.0

typedef struct linear_job {
    const lm__linear_kernels *kern;
    const lm__bf16dot_kernels *fast; /* non-NULL: the GEMM runs the fast-precision kernels (wdt bf16) */
    const float *x; /* [M, K] rows ldx apart */
    const void *w;  /* [N, K] rows ldw apart, dtype wdt */
    float *y;       /* [M, N] rows ldy apart */
    const float *scales, *bias; /* wdt i8: [N] row scales and [N] bias (or NULL) */
    int accumulate;             /* wdt i8 / u8 (int4): y += product */
    int64_t lds;                /* wdt u8 (int4): scales [N, K / group], rows lds apart */
    int group;                  /* wdt u8 (int4): k per scale */
    const uint16_t *scales16;   /* wdt u8 (int4) with bf16 scales (scales NULL): [N, K / group], rows lds apart */
    lm_dtype wdt;
    int64_t ldx, ldw, ldy, M, N, K;
    int64_t rows_per_task;  /* gemv: W rows per task */
    int64_t kc, nc, mc;     /* GEMM: K block, N block (multiple of nr), M block (multiple of mr) */
    int64_t tasks_n;        /* GEMM: N blocks; task t covers N block t % tasks_n, M block t / tasks_n */
    float *scratch;         /* GEMM: [workers][slice bytes] packed W (fast: then the bf16 x strip), one slice per pool worker */
    size_t slice;           /* GEMM: bytes of one worker's scratch, a multiple of 64 */
    float *xsplit;          /* int4 gemv with kern->i4_split: [M, K] x in the kernel's even/odd order */
    uint32_t *xfast;        /* fast gemv: [M, ldxf] x rounded to bf16 pairs, once per call */
    int64_t ldxf;
    const lm__i8dot_kernels *i8fast; /* fast int8 / int4: x quantized per block into xi8, once per call */
    void *xi8;
    int i8unit; /* fast int8 / int4 GEMM: xi8 holds the GEMM's x, in units of this many k (0: not this path) */
} linear_job;

static const lm__linear_kernels *kernels_for(lm__cpu_isa isa) {
#ifdef LM__HAVE_X86_KERNELS
    if (isa == LM__CPU_ISA_AVX512) return &lm__linear_kernels_avx512;
    if (isa == LM__CPU_ISA_AVX2) return &lm__linear_kernels_avx2;
#else
    (void)isa;
#endif
    return &lm__linear_kernels_scalar;
}

static int is_small(const linear_job *j) { return (double)j->M * (double)j->N * (double)j->K < SERIAL_MACS; }

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

/* The int4 weights from W row n0 on, with their f32 or bf16 scales. */
static lm__i4_weights i4_at(const linear_job *j, int64_t n0) {
    return (lm__i4_weights){(const uint8_t *)j->w + n0 * j->ldw, j->ldw, j->scales ? j->scales + n0 * j->lds : NULL,
                            j->lds, j->group, j->bias ? j->bias + n0 : NULL, j->accumulate,
                            j->scales16 ? j->scales16 + n0 * j->lds : NULL};
}

/* The int4 gemv over W rows [n0, n1), with its f32 or bf16 scales. */
static void gemv_task_i4(const linear_job *j, int64_t n0, int64_t n1) {
    lm__i4_weights W = i4_at(j, n0);
    if (j->xi8) j->i8fast->gemv_i4(j->xi8, j->M, j->K, &W, n1 - n0, j->y + n0, j->ldy);
    else
        j->kern->gemv_i4(j->xsplit ? j->xsplit : j->x, j->xsplit ? j->K : j->ldx, j->M, &W, n1 - n0, j->K, j->y + n0,
                         j->ldy);
}

static void gemv_task(void *arg, int64_t task, int worker) {
    (void)worker;
    const linear_job *j = arg;
    int64_t n0 = task * j->rows_per_task, n1 = LM_MIN(j->N, n0 + j->rows_per_task);
    if (j->wdt == LM_U8) {
        gemv_task_i4(j, n0, n1);
        return;
    }
    if (j->wdt == LM_I8 && j->xi8) {
        lm__i8_epilogue ep = {j->scales + n0, j->bias ? j->bias + n0 : NULL, j->accumulate};
        j->i8fast->gemv(j->xi8, j->M, j->K, (const int8_t *)j->w + n0 * j->ldw, j->ldw, &ep, n1 - n0, j->y + n0, j->ldy);
        return;
    }
    if (j->wdt == LM_I8) {
        lm__i8_epilogue ep = {j->scales + n0, j->bias ? j->bias + n0 : NULL, j->accumulate};
        j->kern->gemv_i8(j->x, j->ldx, j->M, (const int8_t *)j->w + n0 * j->ldw, j->ldw, &ep, n1 - n0, j->K, j->y + n0,
                         j->ldy);
        return;
    }
    if (j->xfast) {
        j->fast->gemv(j->xfast, j->ldxf, j->M, (const uint16_t *)j->w + n0 * j->ldw, j->ldw, n1 - n0, j->K, j->y + n0,
                      j->ldy);
        return;
    }
    j->kern->gemv(j->x, j->ldx, j->M, lm__w_at(j->w, j->wdt, j->ldw, n0, 0), j->wdt, j->ldw, n1 - n0, j->K, j->y + n0,
                  j->ldy);
}

/* Pairs in a K block of kl and the row stride (in pairs) of a rounded x strip. */
static int64_t pairs_of(int64_t kl) { return (kl + 1) / 2; }
static int64_t strip_ld(int64_t kc) { return round_up(pairs_of(kc), 16); }

/* gemm_task with the fast-precision kernels: panels of bf16 pairs (kp rows of nr
 * pairs each), the x strip of each mr rows rounded once per K block, then swept over
 * every panel of the task's N block. */
static void gemm_task_bf16dot(const linear_job *j, int64_t task, int worker) {
    const lm__bf16dot_kernels *kn = j->fast;
    int64_t nr = kn->nr, mr = kn->mr, ldd = strip_ld(j->kc);
    int64_t n0 = task % j->tasks_n * j->nc, n1 = LM_MIN(j->N, n0 + j->nc);
    int64_t m0 = task / j->tasks_n * j->mc, m1 = LM_MIN(j->M, m0 + j->mc);
    uint32_t *bp = (uint32_t *)((char *)j->scratch + (size_t)worker * j->slice);
    uint32_t *xs = bp + (size_t)(pairs_of(j->kc) * j->nc); /* [mr, ldd] pairs after the panels */
    const uint16_t *w = j->w;
    for (int64_t k0 = 0; k0 < j->K; k0 += j->kc) {
        int64_t kl = LM_MIN(j->kc, j->K - k0), kp = pairs_of(kl);
        for (int64_t n = n0; n < n1; n += nr)
            kn->pack(w + n * j->ldw + k0, j->ldw, (int)LM_MIN(nr, n1 - n), kl, bp + (n - n0) * kp);
        for (int64_t m = m0; m < m1; m += mr) {
            int rows = (int)LM_MIN(mr, m1 - m);
            kn->round_x(j->x + m * j->ldx + k0, j->ldx, rows, kl, xs, ldd);
            for (int64_t n = n0; n < n1; n += nr)
                kn->micro(kp, xs, ldd, rows, bp + (n - n0) * kp, j->y + m * j->ldy + n, j->ldy,
                          (int)LM_MIN(nr, n1 - n), k0 > 0);
        }
    }
}

/* gemm_task with the fast int8 / int4 kernels: each panel of nr columns packed as bytes
 * (int4: with its units' group scales after all the panels), then every tile of mr x
 * rows of the prepared x against it. int8's row scales are applied as tiles are stored
 * (each K block's partial sum times the scale), the bias after the last K block. */
static void gemm_task_i8dot(const linear_job *j, int64_t task, int worker) {
    const lm__i8dot_kernels *kn = j->i8fast;
    const int64_t nr = kn->gemm_nr, mr = kn->gemm_mr, U = j->i8unit;
    int64_t n0 = task % j->tasks_n * j->nc, n1 = LM_MIN(j->N, n0 + j->nc);
    int64_t m0 = task / j->tasks_n * j->mc, m1 = LM_MIN(j->M, m0 + j->mc);
    uint8_t *bp = (uint8_t *)j->scratch + (size_t)worker * j->slice;
    float *gs = (float *)(bp + round_up(j->kc, 64) * j->nc); /* int4: [panels][units][nr] */
    for (int64_t k0 = 0; k0 < j->K; k0 += j->kc) {
        int64_t kl = LM_MIN(j->kc, j->K - k0), kp = round_up(kl, 64), nu = ceil_div(kl, U);
        for (int64_t n = n0; n < n1; n += nr) {
            int ncols = (int)LM_MIN(nr, n1 - n);
            if (j->wdt == LM_U8) {
                lm__i4_weights W = i4_at(j, n);
                kn->pack_i4(&W, ncols, k0, kl, (int)U, bp + (n - n0) * kp, gs + (n - n0) / nr * nu * nr);
            } else
                kn->pack_i8((const int8_t *)j->w + n * j->ldw + k0, j->ldw, ncols, kl, bp + (n - n0) * kp);
        }
        for (int64_t m = m0; m < m1; m += mr)
            for (int64_t n = n0; n < n1; n += nr) {
                lm__i8dot_tile t = {.xprep = j->xi8, .K = j->K, .unit = (int)U, .m0 = m, .k0 = k0, .nu = nu,
                                    .mrows = (int)LM_MIN(mr, m1 - m), .ncols = (int)LM_MIN(nr, n1 - n),
                                    .bp = bp + (n - n0) * kp,
                                    .gs = j->wdt == LM_U8 ? gs + (n - n0) / nr * nu * nr : NULL,
                                    .cs = j->wdt == LM_I8 ? j->scales + n : NULL, .c = j->y + m * j->ldy + n,
                                    .ldc = j->ldy, .accumulate = k0 > 0 || j->accumulate};
                kn->micro(&t);
            }
    }
    if (j->bias)
        for (int64_t m = m0; m < m1; m++)
            for (int64_t n = n0; n < n1; n++) j->y[m * j->ldy + n] += j->bias[n];
}

static void gemm_task(void *arg, int64_t task, int worker) {
    const linear_job *j = arg;
    if (j->i8unit) {
        gemm_task_i8dot(j, task, worker);
        return;
    }
    if (j->fast) {
        gemm_task_bf16dot(j, task, worker);
        return;
    }
    const lm__linear_kernels *kn = j->kern;
    int64_t nr = kn->nr, mr = kn->mr;
    int64_t n0 = task % j->tasks_n * j->nc, n1 = LM_MIN(j->N, n0 + j->nc);
    int64_t m0 = task / j->tasks_n * j->mc, m1 = LM_MIN(j->M, m0 + j->mc);
    float *bp = (float *)((char *)j->scratch + (size_t)worker * j->slice);
    for (int64_t k0 = 0; k0 < j->K; k0 += j->kc) {
        int64_t kl = LM_MIN(j->kc, j->K - k0);
        /* Panel p holds columns n0 + p * nr ..: kl rows of nr floats. */
        for (int64_t n = n0; n < n1; n += nr) {
            if (j->wdt == LM_U8) {
                lm__i4_weights W = i4_at(j, n);
                kn->pack_i4(&W, (int)LM_MIN(nr, n1 - n), k0, kl, bp + (n - n0) * kl);
            } else if (j->wdt == LM_I8)
                kn->pack_i8((const int8_t *)j->w + n * j->ldw + k0, j->ldw, j->scales + n, (int)LM_MIN(nr, n1 - n), kl,
                            bp + (n - n0) * kl);
            else
                kn->pack(lm__w_at(j->w, j->wdt, j->ldw, n, k0), j->wdt, j->ldw, (int)LM_MIN(nr, n1 - n), kl,
                         bp + (n - n0) * kl);
        }
        /* x strip (mr x kl, ~6 KB) stays in L1 while it sweeps the L2-resident block. */
        for (int64_t m = m0; m < m1; m += mr)
            for (int64_t n = n0; n < n1; n += nr)
                kn->micro(kl, j->x + m * j->ldx + k0, j->ldx, (int)LM_MIN(mr, m1 - m), bp + (n - n0) * kl,
                          j->y + m * j->ldy + n, j->ldy, (int)LM_MIN(nr, n1 - n), k0 > 0 || j->accumulate);
    }
    if (j->bias) /* the bias after the product, as the gemv's epilogue adds it */
        for (int64_t m = m0; m < m1; m++)
            for (int64_t n = n0; n < n1; n++) j->y[m * j->ldy + n] += j->bias[n];
}

/* Strip task of the fast int8 / int4 GEMM's x (quantized into xi8). */
static void prep_task(void *arg, int64_t task, int worker) {
    (void)worker;
    const linear_job *j = arg;
    j->i8fast->gemm_prep_x(j->x, j->ldx, j->M, j->K, j->i8unit, j->wdt == LM_I8 ? 128 : 8, j->xi8, task, task + 1);
}

static void run_gemv(lm_threadpool *pool, linear_job *j) {
    if (is_small(j)) pool = NULL;
    int64_t threads = lm_threadpool_size(pool);
    /* About 4 tasks per thread balance uneven progress; at least SERIAL_MACS each. */
    double macs = (double)j->M * (double)j->N * (double)j->K;
    int64_t tasks = threads == 1 ? 1 : (int64_t)LM_MIN(4.0 * (double)threads, LM_MAX(1.0, macs / SERIAL_MACS));
    j->rows_per_task = round_up(ceil_div(j->N, tasks), 16);
    lm_threadpool_run(pool, ceil_div(j->N, j->rows_per_task), gemv_task, j);
}

/* Chooses kc, nc, mc so blocks fit in cache and there are enough tasks for the pool,
 * from the tile and block limits of the kernels that run (the fast ones or kern). */
static void plan_gemm(linear_job *j, int64_t threads) {
    struct { int64_t mr, nr, kc, nc; } kb = {j->kern->mr, j->kern->nr, j->kern->kc, j->kern->nc}, *kn = &kb;
    if (j->fast) kb.mr = j->fast->mr, kb.nr = j->fast->nr, kb.kc = j->fast->kc, kb.nc = j->fast->nc;
    if (j->i8unit) {
        kb.mr = j->i8fast->gemm_mr, kb.nr = j->i8fast->gemm_nr;
        kb.kc = j->i8fast->gemm_kc, kb.nc = j->i8fast->gemm_nc;
    }
    /* K blocks of whole x blocks (64 k) for the fast int8 / int4 kernels */
    j->kc = LM_MIN(kn->kc, round_up(ceil_div(j->K, ceil_div(j->K, kn->kc)), j->i8unit ? 64 : 16));
    int64_t panels = ceil_div(j->N, kn->nr), max_panels = kn->nc / kn->nr;
    int64_t blocks_n = ceil_div(panels, max_panels);
    if (blocks_n < threads) blocks_n = LM_MIN(threads, panels);
    else blocks_n = LM_MIN(round_up(blocks_n, threads), panels); /* whole rounds of tasks */
    j->nc = ceil_div(panels, blocks_n) * kn->nr;
    j->tasks_n = ceil_div(j->N, j->nc);
    /* Too few N blocks for the pool (narrow W): split M as well. */
    int64_t blocks_m = LM_MIN(ceil_div(threads, j->tasks_n), ceil_div(j->M, kn->mr));
    j->mc = round_up(ceil_div(j->M, blocks_m), kn->mr);
}

static lm_status run_gemm(lm_threadpool *pool, linear_job *j) {
    if (is_small(j)) pool = NULL;
    int64_t threads = lm_threadpool_size(pool);
    plan_gemm(j, threads);
    int64_t tasks = j->tasks_n * ceil_div(j->M, j->mc);
    int64_t workers = tasks > 1 ? threads : 1;
    if (j->fast) /* pair panels, then an x strip of mr rows */
        j->slice = (size_t)(pairs_of(j->kc) * j->nc + j->fast->mr * strip_ld(j->kc)) * sizeof(uint32_t);
    else if (j->i8unit) /* byte panels, then (int4) the units' group scales */
        j->slice = (size_t)(round_up(j->kc, 64) * j->nc) + (size_t)(ceil_div(j->kc, j->i8unit) * j->nc) * sizeof(float);
    else
        j->slice = (size_t)(j->kc * j->nc) * sizeof(float);
    j->slice = (j->slice + 63) / 64 * 64;
    size_t bytes = (size_t)workers * j->slice;
    j->scratch = lm__alloc(bytes, 64);
    if (!j->scratch)
        return lm__error(LM_OUT_OF_MEMORY, "cpu linear: packing scratch of %zu bytes for %lld workers failed", bytes,
                         (long long)workers);
    lm_threadpool_run(pool, tasks, gemm_task, j);
    lm__free(j->scratch);
    j->scratch = NULL;
    return LM_OK;
}

static lm_status check_args(const float *x, int64_t ldx, const void *w, lm_dtype wdtype, int64_t ldw,
                            const float *y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
    const char *op = "cpu linear";
    if (wdtype != LM_F32 && wdtype != LM_BF16 && wdtype != LM_F16 && wdtype != LM_I8 && wdtype != LM_U8)
        return lm__error(LM_UNSUPPORTED, "%s: weight dtype %s; expected f32, bf16, f16, i8 or u8 (int4)", op,
                         lm_dtype_name(wdtype));
    if (M < 0 || N < 0 || K < 0)
        return lm__error(LM_INVALID_ARGUMENT, "%s: negative size M=%lld N=%lld K=%lld", op, (long long)M,
                         (long long)N, (long long)K);
    if (ldx < 0 || ldw < 0 || (M > 1 && ldy < N))
        return lm__error(LM_INVALID_ARGUMENT, "%s: row strides ldx=%lld ldw=%lld ldy=%lld invalid for N=%lld", op,
                         (long long)ldx, (long long)ldw, (long long)ldy, (long long)N);
    if (M > 0 && N > 0 && (!y || (K > 0 && (!x || !w))))
        return lm__error(LM_INVALID_ARGUMENT, "%s: NULL %s", op, !y ? "y" : !x ? "x" : "w");
    return LM_OK;
}

/* x [M, K] (rows ldx apart) into dst [M, K] dense, each block of 2L k as its L even-k
 * values then its L odd-k values (K is a multiple of 2L). O(M * K), once per call. */
static void split_x(const float *x, int64_t ldx, int64_t M, int64_t K, int L, float *dst) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < K; b += 2 * L)
            for (int i = 0; i < L; i++) {
                dst[m * K + b + i] = x[m * ldx + b + 2 * i];
                dst[m * K + b + L + i] = x[m * ldx + b + 2 * i + 1];
            }
}

/* LM_OK when fast kernels whose feature this CPU and build have (supported) can run
 * now, else LM_UNSUPPORTED naming what is missing: never a silent exact run
 * (lm_precision_check refuses such a CPU at model load, so this is reached only
 * through an ISA override or a direct call). what: the weights, in the message. */
static lm_status fast_usable(int supported, const char *what, const char *feature) {
#ifdef LM__HAVE_X86_KERNELS
    lm__cpu_isa isa = lm__cpu_isa_active();
    if (supported && isa == LM__CPU_ISA_AVX512) return LM_OK;
    if (supported)
        return lm__error(LM_UNSUPPORTED, "cpu linear: precision fast%s runs on the avx512 path, but it is overridden "
                         "to %s", what, lm__cpu_isa_name(isa));
#endif
    return lm__error(LM_UNSUPPORTED, "cpu linear: precision fast%s needs the %s CPU feature, which this CPU or build "
                     "lacks", what, feature);
}

/* The fast-precision kernels of bf16 weights (AVX512_BF16; the GEMM's microkernel on
 * AMX tiles where lm__cpu_amx_bf16_active). */
static lm_status fast_kernels(const lm__bf16dot_kernels **out) {
    LM_TRY(fast_usable(lm__cpu_bf16dot_supported(), "", "AVX512_BF16 (VDPBF16PS)"));
#ifdef LM__HAVE_X86_KERNELS
    *out = lm__cpu_amx_bf16_active() ? &lm__bf16dot_kernels_amx : &lm__bf16dot_kernels_avx512;
#endif
    return LM_OK;
}

static _Thread_local const lm__i8dot_kernels *t_i8fast_forced;

const lm__i8dot_kernels *lm__cpu_i8fast_force(const lm__i8dot_kernels *k) {
    const lm__i8dot_kernels *old = t_i8fast_forced;
    t_i8fast_forced = k;
    return old;
}

/* The fast kernels of int8 and int4 weights: on the avx512 path with AVX512_VNNI its
 * VPDPBUSD set, with the GEMM's products on AMX tiles where lm__cpu_amx_int8_active; on
 * the avx2 path (or avx512 without VNNI) the AVX-VNNI set where lm__cpu_avx_vnni_active,
 * else the AVX2 one (each a gemv and a packed GEMM). The scalar path has none:
 * LM_UNSUPPORTED, never a silent exact run. */
static lm_status i8fast_kernels(const lm__i8dot_kernels **out) {
#ifdef LM__HAVE_X86_KERNELS
    lm__cpu_isa isa = lm__cpu_isa_active();
    if (isa == LM__CPU_ISA_AVX512 && lm__cpu_i8dot_supported()) {
        *out = t_i8fast_forced                ? t_i8fast_forced
               : lm__cpu_amx_int8_active() ? &lm__i8dot_kernels_amx
                                            : &lm__i8dot_kernels_avx512;
        return LM_OK;
    }
    if (isa >= LM__CPU_ISA_AVX2) {
        *out = lm__cpu_avx_vnni_active() ? &lm__i8dot_kernels_avxvnni : &lm__i8dot_kernels_avx2;
        return LM_OK;
    }
    return lm__error(LM_UNSUPPORTED, "cpu linear: precision fast with int8/int4 weights needs the avx2 or avx512 "
                     "path (AVX2 byte products), but it is overridden to %s", lm__cpu_isa_name(isa));
#else
    (void)out;
    return lm__error(LM_UNSUPPORTED, "cpu linear: precision fast with int8/int4 weights needs AVX2 byte products; "
                     "this build has no x86 vector kernels");
#endif
}

static lm_status run(lm_threadpool *pool, linear_job *j, lm_precision prec) {
    j->kern = kernels_for(lm__cpu_isa_active());
    const int i8dot = prec == LM_PRECISION_FAST && (j->wdt == LM_I8 || j->wdt == LM_U8);
    const lm__i8dot_kernels *i8k = NULL;
    if (i8dot) LM_TRY(i8fast_kernels(&i8k));
    if (j->M <= (j->wdt == LM_F32 ? j->kern->gemv_max_m_f32 : j->kern->gemv_max_m_16)) {
        int L = j->kern->i4_split;
        if (i8dot) { /* x quantized once, shared */
            j->i8fast = i8k;
            size_t bytes = j->i8fast->x_bytes(j->M, j->K);
            if (!(j->xi8 = lm__alloc(bytes, 64)))
                return lm__error(LM_OUT_OF_MEMORY, "cpu linear: fast int8 x scratch of %zu bytes", bytes);
            if (j->wdt == LM_I8) j->i8fast->prep_x(j->x, j->ldx, j->M, j->K, j->xi8);
            else j->i8fast->prep_x_i4(j->x, j->ldx, j->M, j->K, j->xi8);
        } else if (prec == LM_PRECISION_FAST && j->wdt == LM_BF16) { /* x rounded to bf16 pairs once, shared by the tasks */
            LM_TRY(fast_kernels(&j->fast));
            j->ldxf = strip_ld(j->K);
            size_t bytes = (size_t)(j->M * j->ldxf) * sizeof(uint32_t);
            if (!(j->xfast = lm__alloc(bytes, 64)))
                return lm__error(LM_OUT_OF_MEMORY, "cpu linear: fast x scratch of %zu bytes", bytes);
            j->fast->round_x(j->x, j->ldx, (int)j->M, j->K, j->xfast, j->ldxf);
        } else if (j->wdt == LM_U8 && L) {
            size_t bytes = (size_t)(j->M * j->K) * sizeof(float);
            if (!(j->xsplit = lm__alloc(bytes, 64)))
                return lm__error(LM_OUT_OF_MEMORY, "cpu linear: int4 x scratch of %zu bytes", bytes);
            split_x(j->x, j->ldx, j->M, j->K, L, j->xsplit);
        }
        run_gemv(pool, j);
        lm__free(j->xsplit), lm__free(j->xfast), lm__free(j->xi8);
        j->xsplit = NULL, j->xfast = NULL, j->xi8 = NULL;
        return LM_OK;
    }
    if (prec == LM_PRECISION_FAST && j->wdt == LM_BF16) LM_TRY(fast_kernels(&j->fast));
    if (i8dot) { /* x quantized once, every task reads it */
        j->i8unit = j->wdt == LM_U8 && j->group == 32 ? 32 : 64;
        j->i8fast = i8k;
#ifdef LM__HAVE_X86_KERNELS
        if (j->i8unit == 32 && i8k->gemm_unit64_only) j->i8fast = &lm__i8dot_kernels_avx512;
#endif
        size_t bytes = j->i8fast->gemm_x_bytes(j->M, j->K, j->i8unit);
        if (!(j->xi8 = lm__alloc(bytes, 64)))
            return lm__error(LM_OUT_OF_MEMORY, "cpu linear: fast int8 x scratch of %zu bytes", bytes);
        lm_threadpool_run(is_small(j) ? NULL : pool, ceil_div(j->M, j->i8fast->gemm_mr), prep_task, j);
        lm_status st = run_gemm(pool, j);
        lm__free(j->xi8);
        j->xi8 = NULL;
        return st;
    }
    return run_gemm(pool, j);
}

lm_status lm__cpu_linear(lm_threadpool *pool, const float *x, int64_t ldx, const void *w, lm_dtype wdtype,
                         int64_t ldw, float *y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
    return lm__cpu_linear_prec(pool, lm__cpu_precision(), x, ldx, w, wdtype, ldw, y, ldy, M, N, K);
}

lm_status lm__cpu_linear_prec(lm_threadpool *pool, lm_precision prec, const float *x, int64_t ldx, const void *w,
                              lm_dtype wdtype, int64_t ldw, float *y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
    LM_TRY(check_args(x, ldx, w, wdtype, ldw, y, ldy, M, N, K));
    if (prec != LM_PRECISION_EXACT && prec != LM_PRECISION_FAST)
        return lm__error(LM_INVALID_ARGUMENT, "cpu linear: precision %d", (int)prec);
    if (wdtype == LM_I8 || wdtype == LM_U8)
        return lm__error(LM_INVALID_ARGUMENT, "cpu linear: %s weights need their scales (lm__cpu_linear_i8 / _i4)",
                         wdtype == LM_I8 ? "int8" : "int4");
    if (M == 0 || N == 0) return LM_OK;
    if (K == 0) { /* the empty sum */
        for (int64_t m = 0; m < M; m++) memset(y + m * ldy, 0, (size_t)N * sizeof(float));
        return LM_OK;
    }
    linear_job j = {.x = x, .w = w, .y = y, .wdt = wdtype, .ldx = ldx, .ldw = ldw, .ldy = ldy, .M = M, .N = N, .K = K};
    return run(pool, &j, prec);
}

lm_status lm__cpu_linear_i8(lm_threadpool *pool, const float *x, int64_t ldx, const int8_t *q, int64_t ldq,
                            const float *scales, const float *bias, int accumulate, float *y, int64_t ldy, int64_t M,
                            int64_t N, int64_t K) {
    return lm__cpu_linear_i8_prec(pool, lm__cpu_precision(), x, ldx, q, ldq, scales, bias, accumulate, y, ldy, M, N, K);
}

lm_status lm__cpu_linear_i8_prec(lm_threadpool *pool, lm_precision prec, const float *x, int64_t ldx, const int8_t *q,
                                 int64_t ldq, const float *scales, const float *bias, int accumulate, float *y,
                                 int64_t ldy, int64_t M, int64_t N, int64_t K) {
    if (prec != LM_PRECISION_EXACT && prec != LM_PRECISION_FAST)
        return lm__error(LM_INVALID_ARGUMENT, "cpu linear: precision %d", (int)prec);
    LM_TRY(check_args(x, ldx, q, LM_I8, ldq, y, ldy, M, N, K));
    if (M == 0 || N == 0) return LM_OK;
    if (!scales) return lm__error(LM_INVALID_ARGUMENT, "cpu linear: NULL int8 row scales");
    if (K == 0) { /* the empty sum: the bias alone */
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                float v = bias ? bias[n] : 0.0f;
                y[m * ldy + n] = accumulate ? y[m * ldy + n] + v : v;
            }
        return LM_OK;
    }
    linear_job j = {.x = x, .w = q, .y = y, .scales = scales, .bias = bias, .accumulate = accumulate, .wdt = LM_I8,
                    .ldx = ldx, .ldw = ldq, .ldy = ldy, .M = M, .N = N, .K = K};
    return run(pool, &j, prec);
}

/* The bias alone (K == 0: the empty sum), into or onto y. */
static void bias_only(const float *bias, int accumulate, float *y, int64_t ldy, int64_t M, int64_t N) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float v = bias ? bias[n] : 0.0f;
            y[m * ldy + n] = accumulate ? y[m * ldy + n] + v : v;
        }
}

lm_status lm__cpu_linear_i4(lm_threadpool *pool, const float *x, int64_t ldx, const uint8_t *q, int64_t ldq,
                            const void *scales, lm_dtype sdt, int64_t lds, int group, const float *bias,
                            int accumulate, float *y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
    return lm__cpu_linear_i4_prec(pool, lm__cpu_precision(), x, ldx, q, ldq, scales, sdt, lds, group, bias,
                                  accumulate, y, ldy, M, N, K);
}

lm_status lm__cpu_linear_i4_prec(lm_threadpool *pool, lm_precision prec, const float *x, int64_t ldx, const uint8_t *q,
                                 int64_t ldq, const void *scales, lm_dtype sdt, int64_t lds, int group,
                                 const float *bias, int accumulate, float *y, int64_t ldy, int64_t M, int64_t N,
                                 int64_t K) {
    if (prec != LM_PRECISION_EXACT && prec != LM_PRECISION_FAST)
        return lm__error(LM_INVALID_ARGUMENT, "cpu linear: precision %d", (int)prec);
    LM_TRY(check_args(x, ldx, q, LM_U8, ldq, y, ldy, M, N, K));
    if ((group != 32 && group != 64 && group != 128) || K % group)
        return lm__error(LM_INVALID_ARGUMENT, "cpu linear: int4 group %d with K = %lld (32, 64 or 128 dividing K)",
                         group, (long long)K);
    if (M == 0 || N == 0) return LM_OK;
    if (!scales || lds < 0) return lm__error(LM_INVALID_ARGUMENT, "cpu linear: NULL int4 group scales");
    if (sdt != LM_F32 && sdt != LM_BF16)
        return lm__error(LM_UNSUPPORTED, "cpu linear: int4 group scales of dtype %s; expected f32 or bf16",
                         lm_dtype_name(sdt));
    if (K == 0) {
        bias_only(bias, accumulate, y, ldy, M, N);
        return LM_OK;
    }
    linear_job j = {.x = x, .w = q, .y = y, .scales = sdt == LM_F32 ? scales : NULL,
                    .scales16 = sdt == LM_BF16 ? scales : NULL, .bias = bias, .accumulate = accumulate, .lds = lds,
                    .group = group, .wdt = LM_U8, .ldx = ldx, .ldw = ldq, .ldy = ldy, .M = M, .N = N, .K = K};
    return run(pool, &j, prec);
}

/* ---- mapping lm_matmul_out views onto lm__cpu_linear ------------------------------------ */
typedef struct linear_args {
    int64_t M, N, K, ldx, ldw, ldy;
} linear_args;

/* Merges the batch dims and M (all dims but the last) of v into one row dimension:
 * *rows rows, *ld elements apart. 0 when the strides do not nest. */
static int merge_rows(const lm_tensor_view *v, int64_t *rows, int64_t *ld) {
    int64_t n = 1, next = 0;
    *ld = 0;
    for (int d = v->ndim - 2; d >= 0; d--) {
        if (v->shape[d] == 0) {
            *rows = 0;
            return 1;
        }
        if (v->shape[d] == 1) continue;
        if (n == 1) *ld = v->stride[d];
        else if (v->stride[d] != next) return 0;
        next = v->stride[d] * v->shape[d];
        n *= v->shape[d];
    }
    *rows = n;
    return 1;
}

static int describe(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out, linear_args *la) {
    if (!a || !b || !out) return 0;
    if (a->dtype != LM_F32 || out->dtype != LM_F32) return 0;
    if (b->dtype != LM_F32 && b->dtype != LM_BF16 && b->dtype != LM_F16) return 0;
    if (a->device.type != LM_DEVICE_CPU || b->device.type != LM_DEVICE_CPU || out->device.type != LM_DEVICE_CPU)
        return 0;
    int nd = out->ndim, bn = b->ndim;
    if (nd < 2 || a->ndim != nd || bn < 2 || bn > nd) return 0;
    for (int d = 0; d < nd - 1; d++)
        if (a->shape[d] != out->shape[d]) return 0; /* same batch dims and M */
    for (int d = 0; d < bn - 2; d++)
        if (b->shape[d] != 1 && b->stride[d] != 0) return 0; /* one weight for every batch */
    la->K = a->shape[nd - 1];
    la->N = out->shape[nd - 1];
    if (b->shape[bn - 2] != la->K || b->shape[bn - 1] != la->N) return 0;
    if ((la->K > 1 && (a->stride[nd - 1] != 1 || b->stride[bn - 2] != 1)) || (la->N > 1 && out->stride[nd - 1] != 1))
        return 0;
    la->ldw = la->N > 1 ? b->stride[bn - 1] : 0;
    if (!merge_rows(a, &la->M, &la->ldx)) return 0;
    int64_t rows_out;
    if (!merge_rows(out, &rows_out, &la->ldy) || rows_out != la->M) return 0;
    if (la->M > 1 && la->ldy < la->N) return 0;
    return 1;
}

int lm__cpu_linear_supported(const lm_tensor_view *a, const lm_tensor_view *b_transposed_weight,
                             const lm_tensor_view *out) {
    linear_args la;
    return describe(a, b_transposed_weight, out, &la);
}

lm_status lm__cpu_linear_views(lm_threadpool *pool, const lm_tensor_view *a, const lm_tensor_view *b_transposed_weight,
                               const lm_tensor_view *out) {
    linear_args la;
    if (!describe(a, b_transposed_weight, out, &la))
        return lm__error(LM_UNSUPPORTED, "cpu linear: views do not map onto x [M, K] @ W[N, K]^T with unit inner "
                                         "strides and mergeable rows");
    return lm__cpu_linear(pool, a->data, la.ldx, b_transposed_weight->data, b_transposed_weight->dtype, la.ldw,
                          out->data, la.ldy, la.M, la.N, la.K);
}
