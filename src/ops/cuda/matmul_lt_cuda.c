/* ops/cuda/matmul_lt_cuda.c — matmul and the forward pass's linear layers through
 * cuBLASLt (built only with CUDA).
 *
 * cuBLASLt is column-major; a row-major out[M, N] is the column-major N x M matrix
 * D = op(A) op(B) with A taken from b ([K, N] viewed column-major) and B from a. A
 * view with unit stride in its last dim is "not transposed", one with unit stride in
 * its second-to-last dim is transposed; anything else is left to the readable
 * kernel. Accumulation and scaling are f32 (CUBLAS_COMPUTE_32F: no TF32 shortcuts for
 * f32 inputs). Building descriptors and asking the heuristic costs tens of
 * microseconds of host time, more than a small GEMM runs, so a plan (descriptors +
 * algorithm) is built once per problem (shape, types, transposes, leading dims,
 * alignments, bias, device) and kept in a process-wide table of LT_CACHE plans (the
 * algorithm is the fastest of the heuristic's first 24, timed once on first use); a
 * call only sets the bias (and scale) pointers and enqueues, under one mutex (the
 * pointers live in the shared descriptor).
 *
 * fp8 products (lm__cuda_linear_lt_fp8): e4m3 operands, both K-major (the "TN" form
 * Hopper's fp8 tensor-core GEMMs require), with one f32 scale per output row of each
 * operand (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F): D[n, m] = sa[n] * sb[m] *
 * sum_k A[k, n] B[k, m] in f32 sums.
 */
#include "ops/cuda/cuda_ops.h"

#include <cublasLt.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct lt_problem {
    int device, tab, tc, opa, opb, bias, accumulate;
    int scaled; /* 1: tab is e4m3 with outer-vector f32 scales for A and B */
    int64_t m, n, k, lda, ldb, ldc, batch, sa, sb, sc;
    int align_a, align_b, align_c;
} lt_problem;

/* A problem's descriptors and chosen algorithm, kept for the life of the process. */
typedef struct lt_plan {
    lt_problem p;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} lt_plan;

#define LT_CACHE 256
static lt_plan g_plans[LT_CACHE]; /* [g_nplans] in use, replaced round-robin when full */
static int g_nplans, g_next;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* guards g_plans and each call's pointers */

static lm_status lt_check(cublasStatus_t cs, const char *what) {
    if (cs == CUBLAS_STATUS_SUCCESS) return LM_OK;
    return lm__error(LM_DEVICE_ERROR, "%s: %s (%d)", what, cublasLtGetStatusString(cs), (int)cs);
}

/* Largest power of two (<= 256) dividing the address. */
static int alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 1;
    while (al < 256 && (a % (uintptr_t)(al * 2)) == 0) al *= 2;
    return al;
}

typedef struct lt_descs {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
} lt_descs;

static void descs_destroy(lt_descs *d) {
    if (d->pref) cublasLtMatmulPreferenceDestroy(d->pref);
    if (d->lc) cublasLtMatrixLayoutDestroy(d->lc);
    if (d->lb) cublasLtMatrixLayoutDestroy(d->lb);
    if (d->la) cublasLtMatrixLayoutDestroy(d->la);
    if (d->op) cublasLtMatmulDescDestroy(d->op);
}

static lm_status layout(cublasLtMatrixLayout_t *l, int type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                        int64_t stride) {
    LM_TRY(lt_check(cublasLtMatrixLayoutCreate(l, (cudaDataType_t)type, (uint64_t)rows, (uint64_t)cols, ld),
                    "cublasLtMatrixLayoutCreate"));
    if (batch > 1) {
        int32_t count = (int32_t)batch;
        LM_TRY(lt_check(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
                        "cublasLtMatrixLayoutSetAttribute"));
        LM_TRY(lt_check(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                         sizeof stride),
                        "cublasLtMatrixLayoutSetAttribute"));
    }
    return LM_OK;
}

/* The device pointers a call sets in its plan's descriptor: the bias, and for scaled
 * (fp8) problems the scale vectors of A and B. */
typedef struct lt_ptrs {
    const float *bias, *scale_a, *scale_b;
} lt_ptrs;

static lm_status set_ptrs(cublasLtMatmulDesc_t op, const lt_problem *p, const lt_ptrs *q) {
    if (q->bias)
        LM_TRY(lt_check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &q->bias, sizeof q->bias),
                        "BIAS_POINTER"));
    if (p->scaled) {
        LM_TRY(lt_check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &q->scale_a,
                                                       sizeof q->scale_a),
                        "A_SCALE_POINTER"));
        LM_TRY(lt_check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &q->scale_b,
                                                       sizeof q->scale_b),
                        "B_SCALE_POINTER"));
    }
    return LM_OK;
}

static lm_status build(const lm__cuda_blas *blas, const lt_problem *p, const lt_ptrs *q, lt_descs *d) {
    LM_TRY(lt_check(cublasLtMatmulDescCreate(&d->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate"));
    int32_t opa = p->opa, opb = p->opb;
    LM_TRY(lt_check(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "TRANSA"));
    LM_TRY(lt_check(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "TRANSB"));
    if (q->bias) {
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        LM_TRY(lt_check(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "EPILOGUE"));
    }
    if (p->scaled) {
        int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        LM_TRY(lt_check(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode),
                        "A_SCALE_MODE"));
        LM_TRY(lt_check(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode),
                        "B_SCALE_MODE"));
    }
    LM_TRY(set_ptrs(d->op, p, q));
    int64_t arows = p->opa == CUBLAS_OP_N ? p->m : p->k, acols = p->opa == CUBLAS_OP_N ? p->k : p->m;
    int64_t brows = p->opb == CUBLAS_OP_N ? p->k : p->n, bcols = p->opb == CUBLAS_OP_N ? p->n : p->k;
    LM_TRY(layout(&d->la, p->tab, arows, acols, p->lda, p->batch, p->sa));
    LM_TRY(layout(&d->lb, p->tab, brows, bcols, p->ldb, p->batch, p->sb));
    LM_TRY(layout(&d->lc, p->tc, p->m, p->n, p->ldc, p->batch, p->sc));
    LM_TRY(lt_check(cublasLtMatmulPreferenceCreate(&d->pref), "cublasLtMatmulPreferenceCreate"));
    uint64_t ws = blas->workspace_bytes;
    uint32_t aa = (uint32_t)p->align_a, ab = (uint32_t)p->align_b, ac = (uint32_t)p->align_c;
    LM_TRY(lt_check(cublasLtMatmulPreferenceSetAttribute(d->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                    "MAX_WORKSPACE_BYTES"));
    LM_TRY(lt_check(cublasLtMatmulPreferenceSetAttribute(d->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa),
                    "MIN_ALIGNMENT_A"));
    LM_TRY(lt_check(cublasLtMatmulPreferenceSetAttribute(d->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab),
                    "MIN_ALIGNMENT_B"));
    LM_TRY(lt_check(cublasLtMatmulPreferenceSetAttribute(d->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac),
                    "MIN_ALIGNMENT_C"));
    return lt_check(cublasLtMatmulPreferenceSetAttribute(d->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof ac),
                    "MIN_ALIGNMENT_D");
}

static void plan_destroy(lt_plan *pl) {
    lt_descs d = {pl->op, pl->la, pl->lb, pl->lc, NULL};
    descs_destroy(&d);
    memset(pl, 0, sizeof *pl);
}

/* Index of the fastest of n candidate algorithms for this problem, timed on stream s
 * with the call's own operands (one warm-up run, then TIMED_RUNS runs timed together:
 * a single run of a small GEMM is too noisy to rank), with the call's beta: cuBLASLt
 * runs other kernels for beta = 1 (they read C), so they are ranked as they will run
 * (ranked with beta = 0, an accumulating GEMM of the training step was seen running a
 * kernel 1.5x slower than another candidate's). 0 when the stream is being
 * captured into a graph (nothing may run then) or when timing fails. */
#define TIMED_RUNS 3
static int fastest(const lm__cuda_blas *blas, lt_descs *d, const cublasLtMatmulHeuristicResult_t *res, int n,
                   const void *A, const void *B, void *C, float beta, cudaStream_t s) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (n < 2 || cudaStreamIsCapturing(s, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return 0;
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
        if (e0) cudaEventDestroy(e0);
        cudaGetLastError();
        return 0;
    }
    const float alpha = 1.f;
    int best = 0;
    float best_ms = 1e30f;
    for (int i = 0; i < n; i++) {
        int ok = 1;
        for (int rep = 0; rep <= TIMED_RUNS && ok; rep++) {
            if (rep == 1) cudaEventRecord(e0, s);
            ok = cublasLtMatmul((cublasLtHandle_t)blas->handle, d->op, &alpha, A, d->la, B, d->lb, &beta, C, d->lc, C,
                                d->lc, &res[i].algo, blas->workspace, blas->workspace_bytes, s) == CUBLAS_STATUS_SUCCESS;
        }
        cudaEventRecord(e1, s);
        float ms = 0;
        if (ok && cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess &&
            ms < best_ms)
            best_ms = ms, best = i;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGetLastError();
    return best;
}

/* fastest() for a call that accumulates into C: the candidates are timed accumulating
 * into a zeroed scratch matrix of C's layout (allocated for the timing, one unbatched
 * problem), so C is left alone. 0 while the stream is captured or when the scratch
 * cannot be had. */
static int fastest_scratch(const lm__cuda_blas *blas, const lt_problem *p, lt_descs *d,
                           const cublasLtMatmulHeuristicResult_t *res, int n, const void *A, const void *B,
                           cudaStream_t s) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (n < 2 || p->batch != 1 || cudaStreamIsCapturing(s, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone)
        return 0;
    size_t es = p->tc == CUDA_R_32F ? 4 : 2, bytes = ((size_t)p->ldc * (size_t)(p->n - 1) + (size_t)p->m) * es;
    void *scratch = NULL;
    if (cudaMalloc(&scratch, bytes) != cudaSuccess || cudaMemsetAsync(scratch, 0, bytes, s) != cudaSuccess) {
        if (scratch) cudaFree(scratch);
        cudaGetLastError();
        return 0;
    }
    int best = fastest(blas, d, res, n, A, B, scratch, 1.f, s);
    cudaStreamSynchronize(s);
    cudaFree(scratch);
    cudaGetLastError();
    return best;
}

/* Whether plans are timed (the default) or take cuBLASLt's first heuristic choice
 * (LOOM_GEMM_AUTOTUNE=0): timing picks the fastest kernel on this GPU at this moment, so
 * two processes (two runs, or the ranks of one) may pick different kernels for the same
 * GEMM and round differently; the heuristic's choice depends only on the problem and
 * the GPU, so such runs compute the same bits. */
static int autotune(void) {
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("LOOM_GEMM_AUTOTUNE");
        on = !(v && strcmp(v, "0") == 0);
    }
    return on;
}

/* The cached plan of problem p, built on first use: descriptors, then the fastest of
 * the heuristic's first CANDIDATES algorithms on these operands. Called with g_mu held. */
#define CANDIDATES 24
static lm_status plan_get(const lm__cuda_blas *blas, const lt_problem *p, const lt_ptrs *q, const void *A,
                          const void *B, void *C, cudaStream_t s, lt_plan **out) {
    for (int i = 0; i < g_nplans; i++)
        if (memcmp(&g_plans[i].p, p, sizeof *p) == 0) {
            *out = &g_plans[i];
            return LM_OK;
        }
    lt_descs d = {0};
    lm_status st = build(blas, p, q, &d);
    cublasLtMatmulHeuristicResult_t res[CANDIDATES];
    int n = 0;
    if (st == LM_OK)
        st = lt_check(cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)blas->handle, d.op, d.la, d.lb, d.lc, d.lc, d.pref,
                                                     CANDIDATES, res, &n),
                      "cublasLtMatmulAlgoGetHeuristic");
    if (st == LM_OK && n == 0)
        st = lm__error(LM_UNSUPPORTED, "cuBLASLt has no algorithm for %lld x %lld x %lld", (long long)p->m,
                       (long long)p->n, (long long)p->k);
    if (d.pref) cublasLtMatmulPreferenceDestroy(d.pref);
    d.pref = NULL;
    if (st != LM_OK) {
        descs_destroy(&d);
        return st;
    }
    int best = !autotune() ? 0
               : p->accumulate ? fastest_scratch(blas, p, &d, res, n, A, B, s)
                               : fastest(blas, &d, res, n, A, B, C, 0.f, s);
    lt_plan *pl;
    if (g_nplans < LT_CACHE) {
        pl = &g_plans[g_nplans++];
    } else { /* full: replace the oldest plan */
        pl = &g_plans[g_next];
        g_next = (g_next + 1) % LT_CACHE;
        plan_destroy(pl);
    }
    *pl = (lt_plan){*p, d.op, d.la, d.lb, d.lc, res[best].algo};
    *out = pl;
    return LM_OK;
}

/* D = op(A) op(B) (+ bias per row of D) for problem p; A, B, C are device pointers. */
static lm_status lt_run(const lm__cuda_blas *blas, lt_problem *p, const void *A, const void *B, void *C,
                        const lt_ptrs *q, cudaStream_t s) {
    p->align_a = alignment(A), p->align_b = alignment(B), p->align_c = alignment(C);
    p->bias = q->bias != NULL;
    cudaGetDevice(&p->device);
    const float alpha = 1.f, beta = p->accumulate ? 1.f : 0.f;
    pthread_mutex_lock(&g_mu);
    lt_plan *pl = NULL;
    lm_status st = plan_get(blas, p, q, A, B, C, s, &pl);
    if (st == LM_OK) st = set_ptrs(pl->op, p, q);
    if (st == LM_OK)
        st = lt_check(cublasLtMatmul((cublasLtHandle_t)blas->handle, pl->op, &alpha, A, pl->la, B, pl->lb, &beta, C, pl->lc,
                                     C, pl->lc, &pl->algo, blas->workspace, blas->workspace_bytes, s),
                      "cublasLtMatmul");
    pthread_mutex_unlock(&g_mu);
    return st;
}

static int cuda_type(lm_dtype dt) {
    return dt == LM_F32 ? CUDA_R_32F : dt == LM_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

/* A row-major-indexed operand X [rows, cols] with strides (s0, s1) enters cuBLASLt as
 * op(Y) = X^T ([cols, rows] column-major): unit s1 means Y = X^T itself in memory
 * (op N, ld s0); unit s0 means Y = X (op T, ld s1). Returns 0 for any other layout. */
static int as_operand(int64_t rows, int64_t cols, int64_t s0, int64_t s1, int *op, int64_t *ld) {
    if (s1 == 1 && s0 >= LM_MAX(cols, 1)) {
        *op = CUBLAS_OP_N, *ld = s0;
        return 1;
    }
    if (s0 == 1 && s1 >= LM_MAX(rows, 1)) {
        *op = CUBLAS_OP_T, *ld = s1;
        return 1;
    }
    return 0;
}

lm_status lm__cuda_matmul_lt(const lm__cuda_blas *blas, const lm_tensor_view *a, const lm_tensor_view *b,
                            const lm_tensor_view *out, cudaStream_t s) {
    return lm__cuda_matmul_lt_ex(blas, a, b, out, 0, s);
}

lm_status lm__cuda_matmul_lt_ex(const lm__cuda_blas *blas, const lm_tensor_view *a, const lm_tensor_view *b,
                               const lm_tensor_view *out, int accumulate, cudaStream_t s) {
    int nd = out->ndim;
    if (a->dtype != b->dtype || (a->dtype != out->dtype && out->dtype != LM_F32) || nd > 3)
        return lm__error(LM_UNSUPPORTED, "matmul (cuBLASLt): mixed dtypes or more than one batch dim");
    int64_t M = out->shape[nd - 2], N = out->shape[nd - 1], K = a->shape[nd - 1];
    if (lm_tensor_view_numel(out) == 0) return LM_OK;
    lt_problem p;
    memset(&p, 0, sizeof p);
    p.tab = cuda_type(a->dtype), p.tc = cuda_type(out->dtype), p.accumulate = accumulate != 0;
    p.m = N, p.n = M, p.k = K, p.batch = nd == 3 ? out->shape[0] : 1;
    int ok = K > 0 && out->stride[nd - 1] == 1 && out->stride[nd - 2] >= N;
    ok = ok && as_operand(K, N, b->stride[nd - 2], b->stride[nd - 1], &p.opa, &p.lda); /* b -> A */
    ok = ok && as_operand(M, K, a->stride[nd - 2], a->stride[nd - 1], &p.opb, &p.ldb); /* a -> B */
    if (!ok) return lm__error(LM_UNSUPPORTED, "matmul (cuBLASLt): layout not supported");
    p.ldc = out->stride[nd - 2];
    if (nd == 3) p.sa = b->stride[0], p.sb = a->stride[0], p.sc = out->stride[0];
    const lt_ptrs q = {0};
    return lt_run(blas, &p, b->data, a->data, out->data, &q, s);
}

lm_status lm__cuda_linear_lt(const lm__cuda_blas *blas, const void *x, int64_t ldx, const void *w, const float *bias,
                            void *out, int out_bf16, int64_t ldo, int64_t M, int64_t N, int64_t K, int accumulate,
                            cudaStream_t s) {
    if (M == 0 || N == 0) return LM_OK;
    if (out_bf16 && (bias || accumulate))
        return lm__error(LM_UNSUPPORTED, "linear (cuBLASLt): a bf16 out takes no bias and no accumulate");
    lt_problem p;
    memset(&p, 0, sizeof p);
    p.tab = CUDA_R_16BF, p.tc = out_bf16 ? CUDA_R_16BF : CUDA_R_32F, p.accumulate = accumulate != 0;
    p.opa = CUBLAS_OP_T, p.opb = CUBLAS_OP_N; /* A = w [N, K] row-major = K x N column-major, transposed */
    p.m = N, p.n = M, p.k = K;
    p.lda = K, p.ldb = ldx, p.ldc = ldo, p.batch = 1;
    const lt_ptrs q = {bias, NULL, NULL};
    return lt_run(blas, &p, w, x, out, &q, s);
}

lm_status lm__cuda_linear_lt_fp8(const lm__cuda_blas *blas, const void *xq, int64_t ldx, const float *x_scales,
                                const void *wq, int64_t ldw, const float *w_scales, float *out, int64_t ldo, int64_t M,
                                int64_t N, int64_t K, int accumulate, cudaStream_t s) {
    if (M == 0 || N == 0) return LM_OK;
    if (K % 16 || ldx % 16 || ldw % 16)
        return lm__error(LM_UNSUPPORTED, "linear (cuBLASLt fp8): K %lld and the row strides (%lld, %lld) must be "
                         "multiples of 16", (long long)K, (long long)ldx, (long long)ldw);
    lt_problem p;
    memset(&p, 0, sizeof p);
    p.tab = CUDA_R_8F_E4M3, p.tc = CUDA_R_32F, p.accumulate = accumulate != 0, p.scaled = 1;
    p.opa = CUBLAS_OP_T, p.opb = CUBLAS_OP_N; /* both K-major: w [N, K] and x [M, K] row-major */
    p.m = N, p.n = M, p.k = K;
    p.lda = ldw, p.ldb = ldx, p.ldc = ldo, p.batch = 1;
    const lt_ptrs q = {NULL, w_scales, x_scales};
    return lt_run(blas, &p, wq, xq, out, &q, s);
}
