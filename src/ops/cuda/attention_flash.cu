/* ops/cuda/attention_flash.cu — the flash attention of loom on tensor cores, one tile
 * code for the forward, the backward and the KV-cache prefill: bf16 views [B, H, T, D]
 * with any batch/head/token strides (the transposed views of [B, T, H, D]
 * activations), grouped kv heads read in place, causal (bottom-right aligned: query
 * i sees keys j <= i + Tk - Tq) or not, and a sliding window (query i also sees only
 * keys j > i + Tk - Tq - window).
 * Cache mode (forward only): batch row b's T queries sit at positions start .. start +
 * T - 1 (start = row_pos[b, 0]), so Tk = start + T for that row, and its key j lives
 * in block row_table[b, j / P] of the caches [S, Hkv, P, D] at offset j % P. With one
 * entry per row (nb = 1, the row's slot) the slot is the K/V batch index, as in
 * training; with nb > 1 (a paged cache) each key row of a tile finds its block through
 * the table (a tile may straddle blocks): one thread per row looks the next tile's
 * entries up while the current tile computes, so staging reads them from shared memory
 * and the table adds no round trip. A row whose positions pass nb * P, or one of
 * whose table entries holding keys its queries see (from the first query's window
 * start to Tk - 1) is outside the pool, writes NaN and reads no keys; staged rows
 * before the window whose entry is out of range (e.g. freed blocks) load as zeros, and
 * are masked.
 *
 * Two forms of the same three kernels (and the cache-mode forward without a block
 * table): on sm_90 devices Hopper warpgroup products (fa_fwd_wg, fa_dkdv_wg, fa_dq_wg
 * below, wgmma.cuh), elsewhere (or with LOOM_FLASH_WGMMA=0) mma.sync. In both the
 * per-element passes are the same code on the same fragment layout.
 * mma.sync form: all products m16n8k16 (bf16 in, f32 accumulate); tiles of 64 rows per
 * block, 16 per warp, 4 warps. Fragment layouts (PTX ISA; g = lane / 4, c = lane % 4):
 * A {(g, 2c), (g+8, 2c), (g, 2c+8), (g+8, 2c+8)} pairs, B {(k 2c, n g), (k 2c+8, n g)}
 * pairs read from shared memory laid out [n][k], C {(g, 2c), (g, 2c+1), (g+8, 2c),
 * (g+8, 2c+1)}. The C layout of two adjacent n-tiles is the A layout of one k-chunk,
 * so probabilities computed in registers feed the next product directly. Operands
 * are staged row-major only (cp.async, double-buffered: the next tile is in flight
 * while the current one is computed); B fragments are read with ldmatrix, and a B
 * operand needed transposed (V, dO, Q, K as the k-by-n matrix of a product over rows)
 * with ldmatrix.trans. Blocks per SM (launch bounds, D = 64): 3 for all three kernels;
 * at that bound (168 registers) the backward pair spills a few registers and still ran
 * 3-8% faster than at 2 (more warps to hide the products' latency).
 *
 * forward   grid (query tiles, Hq, B): per key tile S = Q K^T, online softmax in the
 *           exp2 domain (scale * log2 e folded in), O += P V; writes O and, when asked,
 *           the row's logsumexp L = (m + log2 l) ln 2 (natural log of the softmax
 *           denominator of the scaled scores; the kernels below work with L log2 e).
 * backward  (as FlashAttention-2, without atomics): O and L come from the forward
 *           (lm__cuda_flash_attention_lse) or the forward is recomputed for them;
 *           D_i = dO_i . O_i; then
 *           dK/dV kernel, grid (key tiles, Hq, B): each warp keeps 16 keys' K and V
 *             fragments and dK, dV accumulators in registers and walks every query
 *             tile of its query head that sees its keys: S^T = K Q^T,
 *             P^T = exp2(S^T - L), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - D),
 *             dK += dS^T Q; finally dK *= scale. With grouped heads each query head
 *             writes f32 partials and a last kernel adds the group's heads in order
 *             (one block per kv head would leave most of the GPU idle);
 *           dQ kernel, grid (query tiles, Hq, B): S = Q K^T, P, dP = dO V^T,
 *             dS = P (dP - D), dQ += dS K over the visible key tiles; dQ *= scale.
 *           Every gradient element is written once by one thread: run-independent.
 * Requirements (lm__cuda_flash_attention_supports): bf16 q, k, v, dout; D = Dv in {64,
 * 128}; unit stride in the last dim and 16-byte aligned rows; Tk >= Tq when causal.
 * Gradients and the output may be bf16 or f32 (unit last stride).
 * Work O(B Hq Tq Tk D) on tensor cores; nothing of size Tq x Tk exists.
 */
#include "ops/cuda/cuda_backward.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/wgmma.cuh"

#define TILE 64
#define NWARP 4
#define PADE 8 /* bf16 of padding per shared row: fragment loads hit 32 distinct banks */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

struct fa_view { /* a [B, H, T, D] view: element strides of b, h, t (d is unit) */
    void *p;
    int64_t sb, sh, st;
};

struct fa_args {
    fa_view q, k, v, o, dout, dq, dk, dv;
    int o_f32, dq_f32, dk_f32, dv_f32;
    int64_t Hq, Hkv, Tq, Tk;
    float scale_log2, scale;
    int causal;
    int64_t window; /* > 0: keys more than window - 1 before the query's position are hidden */
    /* cache mode (forward): k, v are pools of blocks [S, Hkv, P, D] */
    const int32_t *row_table; /* [B, nb] each row's blocks, or NULL (not cache mode) */
    const int32_t *row_pos;   /* [B, Tq] positions, consecutive per row */
    int64_t nblocks, nb, P;   /* S, table entries per row, positions per block (Tk = nb * P) */
    float *lse; /* [B, Hq, Tq] logsumexp (natural log) */
    float *dd;  /* [B, Hq, Tq] rowsum(dO * O) */
    float *pk, *pv; /* grouped heads: [B, Hq, Tk, D] f32 per-query-head dK, dV partials, else NULL */
};

static fa_view fa_of(const lm_tensor_view *v) {
    fa_view f = {v ? v->data : NULL, 0, 0, 0};
    if (v) f.sb = v->stride[0], f.sh = v->stride[1], f.st = v->stride[2];
    return f;
}

__device__ __forceinline__ const bf16 *row_ptr(const fa_view &v, int64_t b, int64_t h, int64_t t) {
    return (const bf16 *)v.p + b * v.sb + h * v.sh + t * v.st;
}

/* A fragments of 16 rows [r0, r0 + 16) x HD of a view (rows past n read as 0). */
template <int HD>
__device__ __forceinline__ void load_a(uint32_t (*a)[4], const fa_view &v, int64_t b, int64_t h, int64_t r0,
                                       int64_t n, int g, int c) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int64_t t = r0 + g + (r & 1) * 8;
            int col = kk * 16 + 2 * c + (r >> 1) * 8;
            a[kk][r] = t < n ? *(const uint32_t *)(row_ptr(v, b, h, t) + col) : 0u;
        }
}

/* Cache mode, paged: the table entry (a block, not yet checked; -1 past the row's n
 * keys) and the offset in it of key t, the load left in flight until the entry is
 * used. 32-bit division: keys are i32 positions and P < 2^31 (the launcher checks). */
static __device__ __forceinline__ void key_entry(const fa_args &a, const int32_t *tab, int64_t t, int64_t n,
                                                 int32_t *block, int32_t *off) {
    uint32_t e = (uint32_t)t / (uint32_t)a.P;
    *block = t < n ? tab[e] : -1;
    *off = (int32_t)(t - (int64_t)e * a.P);
}

/* 16-byte chunks per thread in a tile of TILE rows of HD bf16 */
template <int HD> struct tile_chunks {
    static constexpr int PER = TILE * HD / 8 / (NWARP * 32);
    static_assert(TILE * HD / 8 % (NWARP * 32) == 0, "tile chunks divide evenly among the threads");
};

/* TILE rows [t0, t0 + TILE) of two views copied into shared memory with cp.async (rows
 * past n as zeros); complete after cp_async_wait_all. */
template <int HD>
__device__ __forceinline__ void stage2_async(const fa_view &v0, const fa_view &v1, int64_t b, int64_t h, int64_t t0,
                                             int64_t n, bf16 *rm0, bf16 *rm1) {
    constexpr int PER = tile_chunks<HD>::PER;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        int i = threadIdx.x + j * NWARP * 32, row = i / (HD / 8), ch = i % (HD / 8);
        int64_t t = t0 + row;
        bool ok = t < n;
        cp_async16(rm0 + row * (HD + PADE) + ch * 8, ok ? row_ptr(v0, b, h, t) + ch * 8 : (const bf16 *)v0.p, ok);
        cp_async16(rm1 + row * (HD + PADE) + ch * 8, ok ? row_ptr(v1, b, h, t) + ch * 8 : (const bf16 *)v1.p, ok);
    }
}

/* Cache mode, paged: the K and V element offsets of one key row from its table entry
 * (block, offset; see key_entry) and kv head, or -1 for a block outside the pool. */
static __device__ __forceinline__ void row_offsets(const fa_args &a, int32_t block, int32_t off, int64_t kvh,
                                                   int64_t *ko, int64_t *vo) {
    bool in = block >= 0 && block < a.nblocks;
    *ko = in ? block * a.k.sb + kvh * a.k.sh + off * a.k.st : -1;
    *vo = in ? block * a.v.sb + kvh * a.v.sh + off * a.v.st : -1;
}

/* stage2_async of a tile's TILE key rows from a paged cache, row r at element offset
 * kofs[r] of the K cache and vofs[r] of the V cache (shared memory; the rows' blocks
 * and kv head already applied), or -1: a block outside the pool (past the keys, or a
 * hidden key before a window: the row check covers every visible one), staged as zeros. */
template <int HD>
__device__ __forceinline__ void stage2_paged_async(const fa_args &a, const int64_t *kofs, const int64_t *vofs,
                                                   bf16 *rm0, bf16 *rm1) {
    constexpr int PER = tile_chunks<HD>::PER;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        int i = threadIdx.x + j * NWARP * 32, row = i / (HD / 8), ch = i % (HD / 8);
        int64_t ko = kofs[row], vo = vofs[row];
        cp_async16(rm0 + row * (HD + PADE) + ch * 8, (const bf16 *)a.k.p + (ko >= 0 ? ko + ch * 8 : 0), ko >= 0);
        cp_async16(rm1 + row * (HD + PADE) + ch * 8, (const bf16 *)a.v.p + (vo >= 0 ? vo + ch * 8 : 0), vo >= 0);
    }
}

/* B fragment pair at n-row nrow, k offset k0 of a shared [n][k] array with row pitch ld. */
__device__ __forceinline__ void frag_b(const bf16 *sm, int ld, int nrow, int k0, int c, uint32_t *b0, uint32_t *b1) {
    *b0 = *(const uint32_t *)(sm + nrow * ld + k0 + 2 * c);
    *b1 = *(const uint32_t *)(sm + nrow * ld + k0 + 8 + 2 * c);
}

__device__ __forceinline__ void store_pair(void *base, int f32, int64_t off, float a, float b) {
    if (f32) *(float2 *)((float *)base + off) = make_float2(a, b);
    else *(__nv_bfloat162 *)((bf16 *)base + off) = __floats2bfloat162_rn(a, b);
}

/* 16 x HD accumulator rows (r0 + g, r0 + g + 8) scaled by mul into a view. */
template <int HD>
__device__ __forceinline__ void store_rows(const fa_view &v, int f32, int64_t b, int64_t h, int64_t r0, int64_t n,
                                           float (*acc)[4], const float *mul, int g, int c) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int64_t t = r0 + g + i * 8;
        if (t >= n) continue;
        int64_t off = b * v.sb + h * v.sh + t * v.st;
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++)
            store_pair(v.p, f32, off + dt * 8 + 2 * c, acc[dt][2 * i] * mul[i], acc[dt][2 * i + 1] * mul[i]);
    }
}

/* ---- forward ------------------------------------------------------------------------------ */
/* The mask of one tile in 32-bit numbers relative to its corner (query qr, key kr): the
 * element of query qr + i and key kr + j is hidden when j >= kn (past the keys),
 * j - i > dc (causal) or j - i <= dw (before the window). Differences outside [-128,
 * 128] act as unbounded: within a tile |j - i| < 128. */
struct tile_mask {
    int kn, dc, dw;
};
__device__ __forceinline__ int clamp128(int64_t x) { return (int)LM_MAX((int64_t)-128, LM_MIN((int64_t)128, x)); }
__device__ __forceinline__ tile_mask mask_of(const fa_args &a, int64_t qr, int64_t kr, int64_t Tk, int64_t off) {
    tile_mask t;
    t.kn = clamp128(Tk - kr);
    t.dc = a.causal ? clamp128(qr + off - kr) : 128; /* key kj > qi + off */
    t.dw = a.window > 0 ? clamp128(qr + off - a.window - kr) : -128; /* key kj <= qi + off - window */
    return t;
}
__device__ __forceinline__ bool masked(const tile_mask &t, int qi, int kj) {
    return kj >= t.kn || kj - qi > t.dc || kj - qi <= t.dw;
}

/* The per-element passes over one 16 x TILE tile of products, EDGE = the tile needs the
 * mask (instantiated twice: the mask would otherwise cost every tile as much as the
 * rest of the pass). (g, c) is the lane's fragment position (C layout). */
/* forward: s *= scale (log2 domain), hidden -> -inf; mloc[i] = max of row half i */
template <bool EDGE>
__device__ __forceinline__ void fwd_scores(float (*s)[4], const tile_mask &tm, float scale_log2, int g, int c,
                                           float *mloc) {
#pragma unroll
    for (int nt = 0; nt < TILE / 8; nt++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            float v = s[nt][r] * scale_log2;
            if (EDGE && masked(tm, g + (r >> 1) * 8, nt * 8 + 2 * c + (r & 1))) v = -INFINITY;
            s[nt][r] = v;
            mloc[r >> 1] = fmaxf(mloc[r >> 1], v);
        }
}

/* dK/dV: rows are keys, columns queries: P^T = 2^(S^T scale - L log2 e) (0 when hidden
 * or past the qn queries), dS^T = P^T (dP^T - D). The exponent of a hidden element is
 * taken and discarded (its inputs are finite staged values). */
template <bool EDGE>
__device__ __forceinline__ void dkdv_probs(float (*p)[4], float (*dp)[4], const float *lt, const float *dtt,
                                           const tile_mask &tm, int qn, float scale_log2, int g, int c) {
#pragma unroll
    for (int nt = 0; nt < TILE / 8; nt++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int col = nt * 8 + 2 * c + (r & 1), key = g + (r >> 1) * 8;
            float pv = fa_exp2(p[nt][r] * scale_log2 - lt[col] * LOG2E);
            if (EDGE && (col >= qn || masked(tm, col, key))) pv = 0.f;
            p[nt][r] = pv;
            dp[nt][r] = pv * (dp[nt][r] - dtt[col]);
        }
}

/* dQ: rows are queries (L already in log2 units), dS = P (dP - D) into dp. */
template <bool EDGE>
__device__ __forceinline__ void dq_scores(const float (*p)[4], float (*dp)[4], const float *L, const float *Dr,
                                          const tile_mask &tm, int qn, float scale_log2, int g, int c) {
#pragma unroll
    for (int nt = 0; nt < TILE / 8; nt++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int row = g + (r >> 1) * 8, col = nt * 8 + 2 * c + (r & 1);
            float pv = fa_exp2(p[nt][r] * scale_log2 - L[r >> 1]);
            if (EDGE && (row >= qn || masked(tm, row, col))) pv = 0.f;
            dp[nt][r] = pv * (dp[nt][r] - Dr[r >> 1]);
        }
}

/* Cache mode, one table entry a row (a slot cache): Tk and the K/V batch index (the
 * row's slot) of batch row b; 0 when its positions pass the cache or the slot is
 * outside it. */
__device__ __forceinline__ bool slot_row(const fa_args &a, int64_t b, int64_t *Tk, int64_t *kb) {
    int64_t start = a.row_pos[b * a.Tq];
    *Tk = start + a.Tq;
    if (start < 0 || *Tk > a.nb * a.P) return false;
    *kb = a.row_table[b * a.nb];
    return *kb >= 0 && *kb < a.nblocks;
}

/* One tile into a warp's running softmax (row halves i = 0, 1 of the lane): mloc (the
 * lane's maxima of the tile's scores, scaled, or raw when FOLD: scale > 0 folded into
 * the exponent's FMA) reduced over the row's 4 lanes; the running max m and sum l
 * updated; s becomes 2^(score - m); alpha the factor the row's O must be scaled by. A
 * row that has seen only hidden keys subtracts 0 (2^-inf = 0). */
template <int COLS, bool FOLD>
__device__ __forceinline__ void softmax_tile(float (*s)[4], float *mloc, float scale_log2, float *m_run,
                                             float *l_run, float *alpha) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        mloc[i] = fmaxf(mloc[i], __shfl_xor_sync(0xffffffffu, mloc[i], 1));
        mloc[i] = fmaxf(mloc[i], __shfl_xor_sync(0xffffffffu, mloc[i], 2));
        if (FOLD) mloc[i] *= scale_log2; /* -inf stays -inf: scale > 0 */
        float m_new = fmaxf(m_run[i], mloc[i]);
        alpha[i] = m_new == -INFINITY ? 1.f : fa_exp2(m_run[i] - m_new);
        m_run[i] = m_new;
        l_run[i] *= alpha[i];
    }
    const float mu[2] = {m_run[0] == -INFINITY ? 0.f : m_run[0], m_run[1] == -INFINITY ? 0.f : m_run[1]};
#pragma unroll
    for (int nt = 0; nt < COLS / 8; nt++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            float e = FOLD ? fa_exp2(fmaf(s[nt][r], scale_log2, -mu[r >> 1])) : fa_exp2(s[nt][r] - mu[r >> 1]);
            s[nt][r] = e;
            l_run[r >> 1] += e;
        }
}

template <int HD> __device__ __forceinline__ void rescale_rows(float (*o)[4], const float *alpha) {
#pragma unroll
    for (int dt = 0; dt < HD / 8; dt++) {
        o[dt][0] *= alpha[0], o[dt][1] *= alpha[0];
        o[dt][2] *= alpha[1], o[dt][3] *= alpha[1];
    }
}

/* The forward's end for a warp's 16 rows from q0: the row sums over the 4 lanes, the
 * logsumexp when asked, O / l stored. */
template <int HD>
__device__ __forceinline__ void fwd_finish(const fa_args &a, int64_t b, int64_t h, int64_t q0, int g, int c,
                                           const float *m_run, float *l_run, float (*o)[4]) {
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
        inv[i] = l_run[i] > 0.f ? 1.f / l_run[i] : 0.f;
        int64_t t = q0 + g + i * 8;
        if (a.lse && c == 0 && t < a.Tq)
            a.lse[(b * a.Hq + h) * a.Tq + t] = l_run[i] > 0.f ? (m_run[i] + log2f(l_run[i])) * LN2 : INFINITY;
    }
    store_rows<HD>(a.o, a.o_f32, b, h, q0, a.Tq, o, inv, g, c);
}

/* PAGED: cache mode with nb != 1 (keys through the row's block table). Key tiles are
 * double-buffered: tile i + 1 is copied (cp.async) while tile i is computed. Causal
 * grids run their longest query tiles first. A warp skips the tiles none of its rows
 * sees. */
template <int HD, bool PAGED>
__global__ void __launch_bounds__(NWARP * 32, HD == 64 ? 3 : 2) fa_fwd(fa_args a) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int PITCH = HD + PADE, STAGE = TILE * PITCH;
    bf16 *ks = (bf16 *)fa_smem, *vs = ks + 2 * STAGE; /* [2][TILE][PITCH] each */
    __shared__ int64_t kofs[2][PAGED ? TILE : 1], vofs[2][PAGED ? TILE : 1]; /* PAGED: a tile's key rows */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int64_t h = blockIdx.y, b = blockIdx.z, kvh = h / (a.Hq / a.Hkv);
    const int64_t qtile = a.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int64_t first_q = qtile * TILE, q0 = first_q + warp * 16; /* the warp's rows q0 .. q0 + 15 */
    int64_t Tk = a.Tk, kb = b; /* keys of this row, and the batch index of its K/V */
    const int32_t *tab = NULL; /* cache mode: the row's block table [nb] */
    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    if (a.row_table) { /* cache mode: the row's first position and its blocks */
        int bad;
        if (PAGED) { /* every entry holding a key some query sees; block-uniform verdict */
            int64_t start = a.row_pos[b * a.Tq];
            tab = a.row_table + b * a.nb, Tk = start + a.Tq;
            bad = start < 0 || Tk > a.nb * a.P;
            int64_t lo = a.window > 0 ? LM_MAX((int64_t)0, start + 1 - a.window) : 0;
            for (int64_t e = lo / a.P + threadIdx.x; !bad && e <= (Tk - 1) / a.P; e += NWARP * 32)
                bad = tab[e] < 0 || tab[e] >= a.nblocks;
            bad = __syncthreads_or(bad);
        } else {
            bad = !slot_row(a, b, &Tk, &kb);
        }
        if (bad) {
            const float nan2[2] = {NAN, NAN};
            store_rows<HD>(a.o, a.o_f32, b, h, q0, a.Tq, o, nan2, g, c);
            return;
        }
    }
    const int64_t off = Tk - a.Tq;
    uint32_t qa[HD / 16][4];
    load_a<HD>(qa, a.q, b, h, q0, a.Tq, g, c);
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    const int64_t last_q = LM_MIN(a.Tq, first_q + TILE) - 1;
    const int64_t kend = a.causal ? LM_MIN(Tk, last_q + off + 1) : Tk;
    const int64_t kbegin = a.window > 0 ? LM_MAX((int64_t)0, first_q + off - a.window + 1) / TILE * TILE : 0;
    /* the warp's own keys: up to its last row's (causal), from its first row's window start */
    const int64_t wend = a.causal ? LM_MIN(kend, LM_MIN(a.Tq, q0 + 16) - 1 + off + 1) : kend;
    const int64_t wbegin = a.window > 0 ? q0 + off - a.window + 1 : 0;
    int32_t nblk = -1, noff = 0; /* PAGED, thread r < TILE: the entry of row r of the next tile to stage */
    if (PAGED && threadIdx.x < TILE) {
        key_entry(a, tab, kbegin + threadIdx.x, Tk, &nblk, &noff);
        row_offsets(a, nblk, noff, kvh, &kofs[0][threadIdx.x], &vofs[0][threadIdx.x]);
        key_entry(a, tab, kbegin + TILE + threadIdx.x, Tk, &nblk, &noff); /* in flight */
    }
    if (PAGED) __syncthreads();
    if (kbegin < kend) {
        if (PAGED) stage2_paged_async<HD>(a, kofs[0], vofs[0], ks, vs);
        else stage2_async<HD>(a.k, a.v, kb, kvh, kbegin, Tk, ks, vs);
    }
    cp_async_commit();
    int buf = 0;
    for (int64_t k0 = kbegin; k0 < kend; k0 += TILE, buf ^= 1) {
        cp_async_wait_all(); /* tile k0 is in buffer buf */
        if (PAGED && threadIdx.x < TILE && k0 + TILE < kend) {
            row_offsets(a, nblk, noff, kvh, &kofs[buf ^ 1][threadIdx.x], &vofs[buf ^ 1][threadIdx.x]);
            if (k0 + 2 * TILE < kend) key_entry(a, tab, k0 + 2 * TILE + threadIdx.x, Tk, &nblk, &noff);
        }
        __syncthreads(); /* tile k0 visible to all; every warp is done with buffer buf ^ 1 */
        if (k0 + TILE < kend) {
            bf16 *kn = ks + (buf ^ 1) * STAGE, *vn = vs + (buf ^ 1) * STAGE;
            if (PAGED) stage2_paged_async<HD>(a, kofs[buf ^ 1], vofs[buf ^ 1], kn, vn);
            else stage2_async<HD>(a.k, a.v, kb, kvh, k0 + TILE, Tk, kn, vn);
        }
        cp_async_commit();
        if (k0 >= wend || k0 + TILE <= wbegin) continue; /* warp-uniform: no row of this warp sees the tile */
        const bf16 *kt = ks + buf * STAGE, *vt = vs + buf * STAGE;
        float s[TILE / 8][4];
#pragma unroll
        for (int nt = 0; nt < TILE / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
        for (int np = 0; np < TILE / 16; np++)
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t r[4];
                frag_b_x4(kt, PITCH, np * 16, kk * 16, lane, r);
                mma16816(s[2 * np], qa[kk], r[0], r[1]);
                mma16816(s[2 * np + 1], qa[kk], r[2], r[3]);
            }
        float mloc[2] = {-INFINITY, -INFINITY};
        /* warp-uniform: only tiles crossing the diagonal, the window's edge or the end of
         * the keys need the mask (a separate instance: the mask costs as much per element as
         * the rest of this pass) */
        const bool edge = k0 + TILE > Tk || (a.causal && k0 + TILE - 1 > q0 + off) || a.window > 0;
        const tile_mask tm = mask_of(a, q0, k0, Tk, off);
        if (edge) fwd_scores<true>(s, tm, a.scale_log2, g, c, mloc);
        else fwd_scores<false>(s, tm, a.scale_log2, g, c, mloc);
        float alpha[2];
        softmax_tile<TILE, false>(s, mloc, a.scale_log2, m_run, l_run, alpha);
        rescale_rows<HD>(o, alpha);
#pragma unroll
        for (int kk = 0; kk < TILE / 16; kk++) {
            uint32_t pa[4];
            pack_a(s, kk, pa);
#pragma unroll
            for (int dt = 0; dt < HD / 8; dt += 2) {
                uint32_t r[4];
                frag_b_trans(vt, PITCH, kk * 16, dt * 8, lane, r);
                mma16816(o[dt], pa, r[0], r[1]);
                mma16816(o[dt + 1], pa, r[2], r[3]);
            }
        }
    }
    cp_async_wait_all(); /* nothing left in flight at exit (an empty last group) */
    fwd_finish<HD>(a, b, h, q0, g, c, m_run, l_run, o);
}

/* ---- forward on Hopper warpgroups (sm_90a) ------------------------------------------------- */
/* The same forward with wgmma products (wgmma.cuh): a block is one warpgroup and takes
 * 64 query rows (each warp 16 as in fa_fwd) and walks key tiles of 64 rows. Q, K and V
 * are staged with cp.async into 128-byte-swizzled tiles, K and V in three stages (tile
 * j + 1 is copied while tile j's S and tile j - 1's P V run);
 * S = Q K^T reads both operands from shared memory, the probabilities stay in
 * registers as the A operand of O += P V, whose B (V, rows are keys) is read
 * transposed from the same kind of tile. Per warpgroup the products are pipelined: S
 * of tile j is issued with the P V of the previous tile still pending, so the tensor
 * cores compute while the softmax of tile j runs; O is rescaled once that P V is done.
 * The softmax, masks, outputs and logsumexp are fa_fwd's, on the same fragment layout.
 * Measured on the H200 (bench/NOTES.md, training v15): 128-key tiles and two
 * warpgroups sharing a block's K/V tiles were slower; so was this kernel without the
 * pipelining. Not for paged caches (their rows are gathered through the table:
 * fa_fwd<HD, true>) and only for scale > 0 (folded into the exponent's FMA; others take
 * fa_fwd). */
template <int HD> struct wg_tiles {
    static constexpr int NS = 3;                                     /* K/V stages */
    static constexpr int TBYTES = TILE * HD * 2;                     /* Q, or one K or V stage */
    static constexpr size_t SMEM = 1024 + TBYTES + 2 * NS * TBYTES; /* + alignment to 1,024 bytes; D 64: 57 KiB */
};

/* Rows [t0, t0 + R) of a view into a swizzled tile of R rows (rows past n as zeros),
 * by the block's NT threads with cp.async. Thread i copies 16-byte chunk i % (HD / 8) of
 * rows i / (HD / 8) + j NT / (HD / 8): one row pointer and one shared offset (the row's
 * swizzle, r % 8, is the same for all its rows), advanced by constants. */
template <int HD, int R, int NT>
__device__ __forceinline__ void stage_sw_async(const fa_view &v, int64_t b, int64_t h, int64_t t0, int64_t n,
                                               unsigned char *dst) {
    constexpr int CH = HD / 8, RSTEP = NT / CH;
    static_assert(NT % CH == 0 && R % RSTEP == 0 && RSTEP % 8 == 0, "tile chunks divide evenly among the threads");
    const int r0 = threadIdx.x / CH, ch = threadIdx.x % CH;
    const bf16 *src = row_ptr(v, b, h, t0 + r0) + ch * 8;
    const int64_t step = RSTEP * v.st, left = n - t0 - r0; /* rows r0 + j RSTEP < left exist */
    unsigned char *d = dst + sw_offset(R, r0, ch * 8);
#pragma unroll
    for (int j = 0; j < R / RSTEP; j++) {
        bool ok = j * RSTEP < left;
        cp_async16(d + j * RSTEP * 128, ok ? src + j * step : (const bf16 *)v.p, ok);
    }
}

/* Descriptors into a swizzled tile of R rows, from the tile's base descriptor (wg_desc
 * of its first byte; offsets stay inside the 14-bit address field): a K-major operand
 * over rows [row0, row0 + 64) (A) or all R rows (B) at k step kk (16 columns); an
 * MN-major B (base made with R * 128 as the leading offset) over rows [k0, k0 + 16) and
 * every column. desc_at moves a base by a byte offset (another stage). */
__device__ __forceinline__ uint64_t desc_at(uint64_t base, uint32_t bytes) { return base + (bytes >> 4); }
template <int R> __device__ __forceinline__ uint64_t desc_k(uint64_t base, int row0, int kk) {
    return desc_at(base, (kk >> 2) * R * 128 + row0 * 128 + (kk & 3) * 32);
}
template <int R> __device__ __forceinline__ uint64_t desc_mn(uint64_t base, int k0) { return desc_at(base, k0 * 128); }

template <int N> __device__ __forceinline__ void wg_rs_t(float *d, const uint32_t *a, uint64_t db);
template <> __device__ __forceinline__ void wg_rs_t<64>(float *d, const uint32_t *a, uint64_t db) {
    wg_rs_n64_t(d, a, db);
}
template <> __device__ __forceinline__ void wg_rs_t<128>(float *d, const uint32_t *a, uint64_t db) {
    wg_rs_n128_t(d, a, db);
}

/* The scores' pass with the scale folded into the exponent (scale > 0): hidden -> -inf,
 * mloc[i] = the raw maximum of row half i. */
template <bool EDGE, int COLS>
__device__ __forceinline__ void raw_scores(float (*s)[4], const tile_mask &tm, int g, int c, float *mloc) {
#pragma unroll
    for (int nt = 0; nt < COLS / 8; nt++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            if (EDGE && masked(tm, g + (r >> 1) * 8, nt * 8 + 2 * c + (r & 1))) s[nt][r] = -INFINITY;
            mloc[r >> 1] = fmaxf(mloc[r >> 1], s[nt][r]);
        }
}

template <int HD>
__global__ void __launch_bounds__(128, HD == 64 ? 3 : 2) fa_fwd_wg(fa_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef wg_tiles<HD> W;
    constexpr int BK = TILE;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    unsigned char *qs = fa_smem + ((1024 - ((uint32_t)__cvta_generic_to_shared(fa_smem) & 1023)) & 1023);
    unsigned char *ks = qs + W::TBYTES, *vs = ks + W::NS * W::TBYTES; /* [NS] stages each */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int64_t h = blockIdx.x, b = blockIdx.y, kvh = h / (a.Hq / a.Hkv);
    const int64_t qtile = a.causal ? gridDim.z - 1 - blockIdx.z : blockIdx.z; /* grid (Hq, B, tiles) */
    const int64_t first_q = qtile * TILE, q0 = first_q + warp * 16;
    int64_t Tk = a.Tk, kb = b;
    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    if (a.row_table && !slot_row(a, b, &Tk, &kb)) { /* cache mode, one entry a row; block-uniform */
        const float nan2[2] = {NAN, NAN};
        store_rows<HD>(a.o, a.o_f32, b, h, q0, a.Tq, o, nan2, g, c);
        return;
    }
    const int64_t off = Tk - a.Tq;
    const int64_t last_q = LM_MIN(a.Tq, first_q + TILE) - 1;
    const int64_t kend = a.causal ? LM_MIN(Tk, last_q + off + 1) : Tk;
    const int64_t kbegin = a.window > 0 ? LM_MAX((int64_t)0, first_q + off - a.window + 1) / BK * BK : 0;
    /* (No branch around the products that the compiler cannot prove uniform: it would
     * serialize them.) */
    const uint64_t qd = wg_desc(qs, 16, 1024), kd = wg_desc(ks, 16, 1024), vd = wg_desc(vs, BK * 128, 1024);
    stage_sw_async<HD, TILE, 128>(a.q, b, h, first_q, a.Tq, qs);
    if (kbegin < kend) {
        stage_sw_async<HD, BK, 128>(a.k, kb, kvh, kbegin, Tk, ks);
        stage_sw_async<HD, BK, 128>(a.v, kb, kvh, kbegin, Tk, vs);
    }
    cp_async_commit();
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    uint32_t pa[BK / 16][4]; /* the previous tile's probabilities (A fragments of its P V) */
    /* One tile: S = Q K^T of tile k0 (stage st); unless first, the previous tile's P V
     * (stage pst) behind it; the softmax of S while that runs; then O rescaled. */
    auto step = [&](int64_t k0, int st, int pst, bool first) {
        cp_async_wait_all(); /* tile k0 (and Q) in place */
        fence_async_smem();  /* ... and visible to the products */
        __syncthreads();     /* for every thread; no warpgroup reads stage st + 1 any more */
        const int nx = st == W::NS - 1 ? 0 : st + 1;
        if (k0 + BK < kend) {
            stage_sw_async<HD, BK, 128>(a.k, kb, kvh, k0 + BK, Tk, ks + nx * W::TBYTES);
            stage_sw_async<HD, BK, 128>(a.v, kb, kvh, k0 + BK, Tk, vs + nx * W::TBYTES);
        }
        cp_async_commit();
        float s[BK / 8][4];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wg_ss_n64(&s[0][0], desc_k<TILE>(qd, 0, kk), desc_k<BK>(desc_at(kd, st * W::TBYTES), 0, kk), kk > 0);
        wg_commit();
        if (!first) {
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++)
                wg_rs_t<HD>(&o[0][0], pa[kk], desc_mn<BK>(desc_at(vd, pst * W::TBYTES), kk * 16));
            wg_commit();
            wg_wait<1>(); /* S is done */
        } else {
            wg_wait<0>();
        }
        wg_hold<BK / 2>(&s[0][0]);
        float mloc[2] = {-INFINITY, -INFINITY};
        const bool edge = k0 + BK > Tk || (a.causal && k0 + BK - 1 > q0 + off) || a.window > 0;
        const tile_mask tm = mask_of(a, q0, k0, Tk, off);
        if (edge) raw_scores<true, BK>(s, tm, g, c, mloc);
        else raw_scores<false, BK>(s, tm, g, c, mloc);
        float alpha[2];
        softmax_tile<BK, true>(s, mloc, a.scale_log2, m_run, l_run, alpha);
        if (!first) { /* the previous P V has read pa and added into o */
            wg_wait<0>();
            wg_hold<HD / 2>(&o[0][0]);
        }
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) pack_a(s, kk, pa[kk]);
        rescale_rows<HD>(o, alpha);
    };
    if (kbegin < kend) {
        step(kbegin, 0, 0, true);
        int st = 0; /* the stage of the previous tile */
        for (int64_t k0 = kbegin + BK; k0 < kend; k0 += BK) {
            const int nst = st == W::NS - 1 ? 0 : st + 1;
            step(k0, nst, st, false);
            st = nst;
        }
        wg_fence(); /* the last tile's P V */
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
            wg_rs_t<HD>(&o[0][0], pa[kk], desc_mn<BK>(desc_at(vd, st * W::TBYTES), kk * 16));
        wg_commit();
        wg_wait<0>();
        wg_hold<HD / 2>(&o[0][0]);
    }
    cp_async_wait_all();
    fwd_finish<HD>(a, b, h, q0, g, c, m_run, l_run, o);
#else
    __trap(); /* launched only on sm_90 devices, which run the sm_90a build */
#endif
}

/* ---- backward: D = rowsum(dO * O), O bf16 or f32 [B, Hq, Tq, HD] through its view ---------- */
template <int HD>
__global__ void fa_dot(fa_args a, int64_t rows) {
    int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    int64_t t = row % a.Tq, h = (row / a.Tq) % a.Hq, b = row / (a.Tq * a.Hq);
    const bf16 *d = row_ptr(a.dout, b, h, t);
    int64_t o = b * a.o.sb + h * a.o.sh + t * a.o.st;
    float acc = 0.f;
    for (int e = lane; e < HD; e += 32)
        acc += __bfloat162float(d[e]) *
               (a.o_f32 ? ((const float *)a.o.p)[o + e] : __bfloat162float(((const bf16 *)a.o.p)[o + e]));
    acc = warp_sum(acc);
    if (lane == 0) a.dd[row] = acc;
}

/* fa_dot for bf16 O whose rows (and dO's) are 16-byte aligned: HD / 8 lanes own a row,
 * each reading 16 bytes of dO and of O, so a warp covers 256 / HD rows; rows are taken
 * in (b, t, h) order, h fastest, so a warp's rows are neighbours in a token-major
 * layout. Each lane adds its 8 products in order, then the row's lanes are added by
 * xor shuffles. */
template <int HD>
__global__ void fa_dot_vec(fa_args a, int64_t rows) {
    constexpr int LPR = HD / 8; /* lanes per row */
    int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / LPR;
    int part = threadIdx.x % LPR;
    bool ok = row < rows;
    int64_t h = ok ? row % a.Hq : 0, t = ok ? (row / a.Hq) % a.Tq : 0, b = ok ? row / (a.Hq * a.Tq) : 0;
    float acc = 0.f;
    if (ok) {
        uint4 du = *(const uint4 *)(row_ptr(a.dout, b, h, t) + part * 8);
        uint4 ou = *(const uint4 *)(row_ptr(a.o, b, h, t) + part * 8);
        const __nv_bfloat162 *d2 = (const __nv_bfloat162 *)&du, *o2 = (const __nv_bfloat162 *)&ou;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 x = __bfloat1622float2(d2[i]), y = __bfloat1622float2(o2[i]);
            acc += x.x * y.x;
            acc += x.y * y.y;
        }
    }
#pragma unroll
    for (int off = LPR / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (ok && part == 0) a.dd[(b * a.Hq + h) * a.Tq + t] = acc;
}

/* 1 when fa_dot_vec may read v's rows: data and the b, h, t strides on 16 bytes. */
static int fa_rows16(const fa_view &v) {
    return (((uintptr_t)v.p | (uintptr_t)(v.sb * 2) | (uintptr_t)(v.sh * 2) | (uintptr_t)(v.st * 2)) & 15) == 0;
}

/* The two products of a backward kernel over one staged tile: p = A1 X^T and dp = A2 Y^T
 * for the warp's 16 rows, with X and Y [TILE][PITCH] row-major in shared memory (the n
 * side: TILE columns) and A1, A2 the rows' A fragments over HD. */
template <int HD>
__device__ __forceinline__ void two_products(const uint32_t (*a1)[4], const bf16 *x, const uint32_t (*a2)[4],
                                             const bf16 *y, int lane, float (*p)[4], float (*dp)[4]) {
#pragma unroll
    for (int nt = 0; nt < TILE / 8; nt++)
#pragma unroll
        for (int r = 0; r < 4; r++) p[nt][r] = dp[nt][r] = 0.f;
#pragma unroll
    for (int np = 0; np < TILE / 16; np++)
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t r[4];
            frag_b_x4(x, HD + PADE, np * 16, kk * 16, lane, r);
            mma16816(p[2 * np], a1[kk], r[0], r[1]);
            mma16816(p[2 * np + 1], a1[kk], r[2], r[3]);
            frag_b_x4(y, HD + PADE, np * 16, kk * 16, lane, r);
            mma16816(dp[2 * np], a2[kk], r[0], r[1]);
            mma16816(dp[2 * np + 1], a2[kk], r[2], r[3]);
        }
}

/* dK/dV kernels' start for the block's keys from k0: the accumulators zeroed and the
 * query tiles [qstart, qstop) that see them (causal: query i sees key j when i >= j -
 * off; with a window only while i <= j - off + window - 1). */
template <int HD>
__device__ __forceinline__ void dkdv_start(const fa_args &a, int64_t k0, int64_t off, float (*dk)[4], float (*dv)[4],
                                           int64_t *qstart, int64_t *qstop) {
#pragma unroll
    for (int i = 0; i < HD / 8; i++)
#pragma unroll
        for (int r = 0; r < 4; r++) dk[i][r] = dv[i][r] = 0.f;
    *qstart = a.causal ? LM_MAX((int64_t)0, k0 - off) / TILE * TILE : 0;
    *qstop = a.window > 0 ? LM_MIN(a.Tq, k0 + TILE - 1 - off + a.window) : a.Tq;
}

/* dK/dV kernels' end for a warp's 16 keys from kw: dK scaled, both stored (grouped
 * heads: this query head's f32 share, summed by fa_group_sum). */
template <int HD>
__device__ __forceinline__ void dkdv_finish(const fa_args &a, int64_t b, int64_t h, int64_t kvh, int64_t kw, int g,
                                            int c, float (*dk)[4], float (*dv)[4]) {
    const float one[2] = {1.f, 1.f}, sc[2] = {a.scale, a.scale};
    if (a.pk) {
        fa_view pk = {a.pk, a.Hq * a.Tk * HD, a.Tk * HD, HD}, pv = {a.pv, a.Hq * a.Tk * HD, a.Tk * HD, HD};
        store_rows<HD>(pk, 1, b, h, kw, a.Tk, dk, sc, g, c);
        store_rows<HD>(pv, 1, b, h, kw, a.Tk, dv, one, g, c);
        return;
    }
    if (a.dk.p) store_rows<HD>(a.dk, a.dk_f32, b, kvh, kw, a.Tk, dk, sc, g, c);
    if (a.dv.p) store_rows<HD>(a.dv, a.dv_f32, b, kvh, kw, a.Tk, dv, one, g, c);
}

/* ---- backward: dK, dV ----------------------------------------------------------------------- */
/* Query tiles (Q, dO, their L and D) are double-buffered in shared memory: tile i + 1
 * is copied (cp.async) while tile i is computed. */
template <int HD>
__global__ void __launch_bounds__(NWARP * 32, HD == 64 ? 3 : 2) fa_dkdv(fa_args a) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int PITCH = HD + PADE, STAGE = TILE * PITCH;
    bf16 *qs = (bf16 *)fa_smem;             /* [2][TILE][PITCH] Q row-major */
    bf16 *ds = qs + 2 * STAGE;              /* [2][TILE][PITCH] dO row-major */
    float *lq = (float *)(ds + 2 * STAGE);  /* [2][TILE] L of the tile's queries */
    float *dq = lq + 2 * TILE;              /* [2][TILE] D of the tile's queries */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int64_t h = blockIdx.y, b = blockIdx.z, kvh = h / (a.Hq / a.Hkv), off = a.Tk - a.Tq;
    const int64_t k0 = (int64_t)blockIdx.x * TILE, kw = k0 + warp * 16; /* block's and warp's first key */
    const int64_t rows = (b * a.Hq + h) * a.Tq; /* this head's first L / D entry */
    uint32_t ka[HD / 16][4], va[HD / 16][4];
    load_a<HD>(ka, a.k, b, kvh, kw, a.Tk, g, c);
    load_a<HD>(va, a.v, b, kvh, kw, a.Tk, g, c);
    float dk[HD / 8][4], dv[HD / 8][4];
    int64_t qstart, qstop;
    dkdv_start<HD>(a, k0, off, dk, dv, &qstart, &qstop);
    /* query tile q0 into buffer bf: Q, dO and their L and D (rows past Tq read as 0: masked) */
    auto stage = [&](int64_t q0, int bf) {
        stage2_async<HD>(a.q, a.dout, b, h, q0, a.Tq, qs + bf * STAGE, ds + bf * STAGE);
        if (threadIdx.x < TILE) {
            int64_t t = q0 + threadIdx.x;
            cp_async4(lq + bf * TILE + threadIdx.x, a.lse + (t < a.Tq ? rows + t : 0), t < a.Tq);
            cp_async4(dq + bf * TILE + threadIdx.x, a.dd + (t < a.Tq ? rows + t : 0), t < a.Tq);
        }
    };
    if (qstart < qstop) stage(qstart, 0);
    cp_async_commit();
    int buf = 0;
    for (int64_t q0 = qstart; q0 < qstop; q0 += TILE, buf ^= 1) {
        cp_async_wait_all();
        __syncthreads(); /* tile q0 visible to all; every warp is done with buffer buf ^ 1 */
        if (q0 + TILE < qstop) stage(q0 + TILE, buf ^ 1);
        cp_async_commit();
        const bf16 *qt = qs + buf * STAGE, *dt = ds + buf * STAGE;
        const float *lt = lq + buf * TILE, *dtt = dq + buf * TILE;
        float p[TILE / 8][4], dp[TILE / 8][4];
        two_products<HD>(ka, qt, va, dt, lane, p, dp); /* S^T = K Q^T, dP^T = V dO^T */
        const bool edge = kw + 16 > a.Tk || q0 + TILE > a.Tq || (a.causal && kw + 15 > q0 + off) || a.window > 0;
        const tile_mask tm = mask_of(a, q0, kw, a.Tk, off);
        const int qn = clamp128(a.Tq - q0);
        if (edge) dkdv_probs<true>(p, dp, lt, dtt, tm, qn, a.scale_log2, g, c);
        else dkdv_probs<false>(p, dp, lt, dtt, tm, qn, a.scale_log2, g, c);
#pragma unroll
        for (int kk = 0; kk < TILE / 16; kk++) {
            uint32_t pa[4], sa[4];
            pack_a(p, kk, pa);
            pack_a(dp, kk, sa);
#pragma unroll
            for (int d8 = 0; d8 < HD / 8; d8 += 2) {
                uint32_t r[4];
                frag_b_trans(dt, PITCH, kk * 16, d8 * 8, lane, r);
                mma16816(dv[d8], pa, r[0], r[1]); /* dV += P^T dO */
                mma16816(dv[d8 + 1], pa, r[2], r[3]);
                frag_b_trans(qt, PITCH, kk * 16, d8 * 8, lane, r);
                mma16816(dk[d8], sa, r[0], r[1]); /* dK += dS^T Q */
                mma16816(dk[d8 + 1], sa, r[2], r[3]);
            }
        }
    }
    cp_async_wait_all();
    dkdv_finish<HD>(a, b, h, kvh, kw, g, c, dk, dv);
}

/* dK, dV [b, kvh, j, :] = sum over the group's query heads (in head order) of the
 * partials; one thread per pair of elements. */
template <int HD>
__global__ void fa_group_sum(fa_args a, int64_t B) {
    int64_t group = a.Hq / a.Hkv, n = B * a.Hkv * a.Tk * (HD / 4);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t d = (i % (HD / 4)) * 4, r = i / (HD / 4), j = r % a.Tk, kvh = (r / a.Tk) % a.Hkv, b = r / (a.Tk * a.Hkv);
        float4 k = make_float4(0.f, 0.f, 0.f, 0.f), v = k;
        for (int64_t hh = 0; hh < group; hh++) {
            int64_t o = ((b * a.Hq + kvh * group + hh) * a.Tk + j) * HD + d;
            float4 pk = *(const float4 *)(a.pk + o), pv = *(const float4 *)(a.pv + o);
            k.x += pk.x, k.y += pk.y, k.z += pk.z, k.w += pk.w;
            v.x += pv.x, v.y += pv.y, v.z += pv.z, v.w += pv.w;
        }
        if (a.dk.p) {
            int64_t o = b * a.dk.sb + kvh * a.dk.sh + j * a.dk.st + d;
            store_pair(a.dk.p, a.dk_f32, o, k.x, k.y);
            store_pair(a.dk.p, a.dk_f32, o + 2, k.z, k.w);
        }
        if (a.dv.p) {
            int64_t o = b * a.dv.sb + kvh * a.dv.sh + j * a.dv.st + d;
            store_pair(a.dv.p, a.dv_f32, o, v.x, v.y);
            store_pair(a.dv.p, a.dv_f32, o + 2, v.z, v.w);
        }
    }
}

/* dQ kernels' start for a warp's rows from q0: each row half's L (log2 units) and D
 * (rows past Tq: L = inf, so p = 0), and the accumulator zeroed. */
template <int HD>
__device__ __forceinline__ void dq_start(const fa_args &a, int64_t b, int64_t h, int64_t q0, int g, float *L,
                                         float *Dr, float (*dq)[4]) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int64_t t = q0 + g + i * 8;
        L[i] = t < a.Tq ? a.lse[(b * a.Hq + h) * a.Tq + t] * LOG2E : INFINITY;
        Dr[i] = t < a.Tq ? a.dd[(b * a.Hq + h) * a.Tq + t] : 0.f;
    }
#pragma unroll
    for (int i = 0; i < HD / 8; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
}

/* ---- backward: dQ --------------------------------------------------------------------------- */
/* Key tiles (K, V) double-buffered as in the forward. */
template <int HD>
__global__ void __launch_bounds__(NWARP * 32, HD == 64 ? 3 : 2) fa_dq(fa_args a) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int PITCH = HD + PADE, STAGE = TILE * PITCH;
    bf16 *ks = (bf16 *)fa_smem;  /* [2][TILE][PITCH] K row-major */
    bf16 *vs = ks + 2 * STAGE;   /* [2][TILE][PITCH] V row-major */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int64_t h = blockIdx.y, b = blockIdx.z, kvh = h / (a.Hq / a.Hkv), off = a.Tk - a.Tq;
    const int64_t qtile = a.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x; /* longest tiles first */
    const int64_t q0 = qtile * TILE + warp * 16;
    uint32_t qa[HD / 16][4], oa[HD / 16][4];
    load_a<HD>(qa, a.q, b, h, q0, a.Tq, g, c);
    load_a<HD>(oa, a.dout, b, h, q0, a.Tq, g, c);
    float L[2], Dr[2], dq[HD / 8][4];
    dq_start<HD>(a, b, h, q0, g, L, Dr, dq);
    const int64_t first_q = qtile * TILE, last_q = LM_MIN(a.Tq, first_q + TILE) - 1;
    const int64_t kend = a.causal ? LM_MIN(a.Tk, last_q + off + 1) : a.Tk;
    const int64_t kbegin = a.window > 0 ? LM_MAX((int64_t)0, first_q + off - a.window + 1) / TILE * TILE : 0;
    const int64_t wend = a.causal ? LM_MIN(kend, LM_MIN(a.Tq, q0 + 16) - 1 + off + 1) : kend;
    const int64_t wbegin = a.window > 0 ? q0 + off - a.window + 1 : 0;
    if (kbegin < kend) stage2_async<HD>(a.k, a.v, b, kvh, kbegin, a.Tk, ks, vs);
    cp_async_commit();
    int buf = 0;
    for (int64_t k0 = kbegin; k0 < kend; k0 += TILE, buf ^= 1) {
        cp_async_wait_all();
        __syncthreads();
        if (k0 + TILE < kend)
            stage2_async<HD>(a.k, a.v, b, kvh, k0 + TILE, a.Tk, ks + (buf ^ 1) * STAGE, vs + (buf ^ 1) * STAGE);
        cp_async_commit();
        if (k0 >= wend || k0 + TILE <= wbegin) continue; /* warp-uniform: no row of this warp sees the tile */
        const bf16 *kt = ks + buf * STAGE, *vt = vs + buf * STAGE;
        float p[TILE / 8][4], dp[TILE / 8][4];
        two_products<HD>(qa, kt, oa, vt, lane, p, dp); /* S = Q K^T, dP = dO V^T */
        const bool edge = k0 + TILE > a.Tk || q0 + 16 > a.Tq || (a.causal && k0 + TILE - 1 > q0 + off) || a.window > 0;
        const tile_mask tm = mask_of(a, q0, k0, a.Tk, off);
        const int qn = clamp128(a.Tq - q0);
        if (edge) dq_scores<true>(p, dp, L, Dr, tm, qn, a.scale_log2, g, c);
        else dq_scores<false>(p, dp, L, Dr, tm, qn, a.scale_log2, g, c);
#pragma unroll
        for (int kk = 0; kk < TILE / 16; kk++) {
            uint32_t sa[4];
            pack_a(dp, kk, sa);
#pragma unroll
            for (int d8 = 0; d8 < HD / 8; d8 += 2) {
                uint32_t r[4];
                frag_b_trans(kt, PITCH, kk * 16, d8 * 8, lane, r);
                mma16816(dq[d8], sa, r[0], r[1]); /* dQ += dS K */
                mma16816(dq[d8 + 1], sa, r[2], r[3]);
            }
        }
    }
    cp_async_wait_all();
    const float sc[2] = {a.scale, a.scale};
    store_rows<HD>(a.dq, a.dq_f32, b, h, q0, a.Tq, dq, sc, g, c);
}

/* ---- backward on Hopper warpgroups (sm_90a) -------------------------------------------------- */
/* fa_dkdv and fa_dq with wgmma products: one warpgroup a block, each warp's 16 rows and
 * every per-element pass as there. The block's own tile (K and V, or Q and dO; 64 rows)
 * and the walked tiles (Q and dO, or K and V; 64 rows, double-buffered) are staged
 * swizzled; all four products of a tile read their second operand from shared memory
 * (K-major for S and dP, MN-major for the accumulating ones), the probabilities and dS
 * come from registers. */
template <int HD> struct wgb_tiles {
    static constexpr int TB = TILE * HD * 2;                                 /* one 64-row tile */
    static constexpr size_t SMEM = 1024 + 6 * TB + sizeof(float) * 4 * TILE; /* own 2, walked 2 x 2, L and D */
};

/* two_products on warpgroups: p = A1 X^T and dp = A2 Y^T over HD, all four operands
 * 64-row K-major tiles given by their base descriptors; returns with both done. */
template <int HD>
__device__ __forceinline__ void two_products_wg(uint64_t a1, uint64_t x, uint64_t a2, uint64_t y, float (*p)[4],
                                                float (*dp)[4]) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wg_ss_n64(&p[0][0], desc_k<TILE>(a1, 0, kk), desc_k<TILE>(x, 0, kk), kk > 0);
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wg_ss_n64(&dp[0][0], desc_k<TILE>(a2, 0, kk), desc_k<TILE>(y, 0, kk), kk > 0);
    wg_commit();
    wg_wait<0>();
    wg_hold<TILE / 2>(&p[0][0]);
    wg_hold<TILE / 2>(&dp[0][0]);
}

template <int HD>
__global__ void __launch_bounds__(128, 2) fa_dkdv_wg(fa_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef wgb_tiles<HD> W;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    unsigned char *ks = fa_smem + ((1024 - ((uint32_t)__cvta_generic_to_shared(fa_smem) & 1023)) & 1023);
    unsigned char *vs = ks + W::TB, *qs = vs + W::TB, *ds = qs + 2 * W::TB; /* Q, dO: [2] stages */
    float *lq = (float *)(ds + 2 * W::TB), *dq = lq + 2 * TILE;             /* [2][TILE] L, D */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int64_t h = blockIdx.x, b = blockIdx.y, kvh = h / (a.Hq / a.Hkv), off = a.Tk - a.Tq;
    const int64_t k0 = (int64_t)blockIdx.z * TILE, kw = k0 + warp * 16;
    const int64_t rows = (b * a.Hq + h) * a.Tq;
    float dk[HD / 8][4], dv[HD / 8][4];
    int64_t qstart, qstop;
    dkdv_start<HD>(a, k0, off, dk, dv, &qstart, &qstop);
    auto stage = [&](int64_t q0, int bf) {
        stage_sw_async<HD, TILE, 128>(a.q, b, h, q0, a.Tq, qs + bf * W::TB);
        stage_sw_async<HD, TILE, 128>(a.dout, b, h, q0, a.Tq, ds + bf * W::TB);
        if (threadIdx.x < TILE) {
            int64_t t = q0 + threadIdx.x;
            cp_async4(lq + bf * TILE + threadIdx.x, a.lse + (t < a.Tq ? rows + t : 0), t < a.Tq);
            cp_async4(dq + bf * TILE + threadIdx.x, a.dd + (t < a.Tq ? rows + t : 0), t < a.Tq);
        }
    };
    stage_sw_async<HD, TILE, 128>(a.k, b, kvh, k0, a.Tk, ks);
    stage_sw_async<HD, TILE, 128>(a.v, b, kvh, k0, a.Tk, vs);
    if (qstart < qstop) stage(qstart, 0);
    const uint64_t kd = wg_desc(ks, 16, 1024), vd = wg_desc(vs, 16, 1024);
    const uint64_t qkd = wg_desc(qs, 16, 1024), dkd = wg_desc(ds, 16, 1024); /* K-major views of Q, dO */
    const uint64_t qmd = wg_desc(qs, TILE * 128, 1024), dmd = wg_desc(ds, TILE * 128, 1024); /* MN-major */
    cp_async_commit();
    int buf = 0;
    for (int64_t q0 = qstart; q0 < qstop; q0 += TILE, buf ^= 1) {
        cp_async_wait_all();
        fence_async_smem();
        __syncthreads();
        if (q0 + TILE < qstop) stage(q0 + TILE, buf ^ 1);
        cp_async_commit();
        const uint64_t qt = desc_at(qkd, buf * W::TB), dt = desc_at(dkd, buf * W::TB);
        const uint64_t qtm = desc_at(qmd, buf * W::TB), dtm = desc_at(dmd, buf * W::TB);
        const float *lt = lq + buf * TILE, *dtt = dq + buf * TILE;
        float p[TILE / 8][4], dp[TILE / 8][4];
        two_products_wg<HD>(kd, qt, vd, dt, p, dp); /* S^T = K Q^T, dP^T = V dO^T */
        const bool edge = kw + 16 > a.Tk || q0 + TILE > a.Tq || (a.causal && kw + 15 > q0 + off) || a.window > 0;
        const tile_mask tm = mask_of(a, q0, kw, a.Tk, off);
        const int qn = clamp128(a.Tq - q0);
        if (edge) dkdv_probs<true>(p, dp, lt, dtt, tm, qn, a.scale_log2, g, c);
        else dkdv_probs<false>(p, dp, lt, dtt, tm, qn, a.scale_log2, g, c);
        uint32_t pa[TILE / 16][4], sa[TILE / 16][4];
#pragma unroll
        for (int kk = 0; kk < TILE / 16; kk++) pack_a(p, kk, pa[kk]), pack_a(dp, kk, sa[kk]);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < TILE / 16; kk++) {
            wg_rs_t<HD>(&dv[0][0], pa[kk], desc_mn<TILE>(dtm, kk * 16)); /* dV += P^T dO */
            wg_rs_t<HD>(&dk[0][0], sa[kk], desc_mn<TILE>(qtm, kk * 16)); /* dK += dS^T Q */
        }
        wg_commit();
        wg_wait<0>();
        wg_hold<HD / 2>(&dv[0][0]);
        wg_hold<HD / 2>(&dk[0][0]);
    }
    cp_async_wait_all();
    dkdv_finish<HD>(a, b, h, kvh, kw, g, c, dk, dv);
#else
    __trap();
#endif
}

template <int HD>
__global__ void __launch_bounds__(128, HD == 64 ? 3 : 2) fa_dq_wg(fa_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef wgb_tiles<HD> W;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    unsigned char *qs = fa_smem + ((1024 - ((uint32_t)__cvta_generic_to_shared(fa_smem) & 1023)) & 1023);
    unsigned char *os = qs + W::TB, *ks = os + W::TB, *vs = ks + 2 * W::TB; /* K, V: [2] stages */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int64_t h = blockIdx.x, b = blockIdx.y, kvh = h / (a.Hq / a.Hkv), off = a.Tk - a.Tq;
    const int64_t qtile = a.causal ? gridDim.z - 1 - blockIdx.z : blockIdx.z;
    const int64_t first_q = qtile * TILE, q0 = first_q + warp * 16;
    float L[2], Dr[2], dq[HD / 8][4];
    dq_start<HD>(a, b, h, q0, g, L, Dr, dq);
    const int64_t last_q = LM_MIN(a.Tq, first_q + TILE) - 1;
    const int64_t kend = a.causal ? LM_MIN(a.Tk, last_q + off + 1) : a.Tk;
    const int64_t kbegin = a.window > 0 ? LM_MAX((int64_t)0, first_q + off - a.window + 1) / TILE * TILE : 0;
    /* the warpgroup's keys: the block's (its 64 rows are the block's) */
    stage_sw_async<HD, TILE, 128>(a.q, b, h, first_q, a.Tq, qs);
    stage_sw_async<HD, TILE, 128>(a.dout, b, h, first_q, a.Tq, os);
    const uint64_t qd = wg_desc(qs, 16, 1024), od = wg_desc(os, 16, 1024);
    const uint64_t kkd = wg_desc(ks, 16, 1024), vkd = wg_desc(vs, 16, 1024), kmd = wg_desc(ks, TILE * 128, 1024);
    if (kbegin < kend) {
        stage_sw_async<HD, TILE, 128>(a.k, b, kvh, kbegin, a.Tk, ks);
        stage_sw_async<HD, TILE, 128>(a.v, b, kvh, kbegin, a.Tk, vs);
    }
    cp_async_commit();
    int buf = 0;
    for (int64_t k0 = kbegin; k0 < kend; k0 += TILE, buf ^= 1) {
        cp_async_wait_all();
        fence_async_smem();
        __syncthreads();
        if (k0 + TILE < kend) {
            stage_sw_async<HD, TILE, 128>(a.k, b, kvh, k0 + TILE, a.Tk, ks + (buf ^ 1) * W::TB);
            stage_sw_async<HD, TILE, 128>(a.v, b, kvh, k0 + TILE, a.Tk, vs + (buf ^ 1) * W::TB);
        }
        cp_async_commit();
        const uint64_t kt = desc_at(kkd, buf * W::TB), vt = desc_at(vkd, buf * W::TB);
        const uint64_t ktm = desc_at(kmd, buf * W::TB);
        float p[TILE / 8][4], dp[TILE / 8][4];
        two_products_wg<HD>(qd, kt, od, vt, p, dp); /* S = Q K^T, dP = dO V^T */
        const bool edge = k0 + TILE > a.Tk || q0 + 16 > a.Tq || (a.causal && k0 + TILE - 1 > q0 + off) || a.window > 0;
        const tile_mask tm = mask_of(a, q0, k0, a.Tk, off);
        const int qn = clamp128(a.Tq - q0);
        if (edge) dq_scores<true>(p, dp, L, Dr, tm, qn, a.scale_log2, g, c);
        else dq_scores<false>(p, dp, L, Dr, tm, qn, a.scale_log2, g, c);
        uint32_t sa[TILE / 16][4];
#pragma unroll
        for (int kk = 0; kk < TILE / 16; kk++) pack_a(dp, kk, sa[kk]);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < TILE / 16; kk++) /* dQ += dS K */
            wg_rs_t<HD>(&dq[0][0], sa[kk], desc_mn<TILE>(ktm, kk * 16));
        wg_commit();
        wg_wait<0>();
        wg_hold<HD / 2>(&dq[0][0]);
    }
    cp_async_wait_all();
    const float sc[2] = {a.scale, a.scale};
    store_rows<HD>(a.dq, a.dq_f32, b, h, q0, a.Tq, dq, sc, g, c);
#else
    __trap();
#endif
}

/* ---- host side -------------------------------------------------------------------------------- */
static int view_ok(const lm_tensor_view *v, int64_t D, int bf16_only) {
    if (!v) return 1;
    if (v->ndim != 4 || v->shape[3] != D || v->stride[3] != 1) return 0;
    if (bf16_only ? v->dtype != LM_BF16 : (v->dtype != LM_BF16 && v->dtype != LM_F32)) return 0;
    if (((uintptr_t)v->data % 16) != 0) return 0;
    for (int i = 0; i < 3; i++)
        if (v->shape[i] > 1 && v->stride[i] % 8 != 0) return 0;
    return 1;
}

int lm__cuda_flash_attention_supports(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                     int causal, const lm_tensor_view *out) {
    int64_t D = q->shape[3];
    if ((D != 64 && D != 128) || v->shape[3] != D || (causal && k->shape[2] < q->shape[2])) return 0;
    return view_ok(q, D, 1) && view_ok(k, D, 1) && view_ok(v, D, 1) && view_ok(out, D, 0);
}

static fa_args args_of(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v, float scale,
                       int causal, int64_t window) {
    fa_args a;
    memset(&a, 0, sizeof a);
    a.q = fa_of(q), a.k = fa_of(k), a.v = fa_of(v);
    a.Hq = q->shape[1], a.Hkv = k->shape[1], a.Tq = q->shape[2], a.Tk = k->shape[2];
    a.scale = scale, a.scale_log2 = scale * LOG2E, a.causal = causal, a.window = window; /* 0 unless causal (ops) */
    return a;
}

static lm__cuda_kernel_facts fwd_facts[2][2], dkdv_facts[2][2], dq_facts[2][2]; /* [HD 128][PAGED / wgmma] */

/* Raises a kernel's dynamic shared-memory limit where smem needs it, once per kernel and
 * device (lm__cuda_blocks_per_sm keeps what it raised). */
static lm_status kernel_smem(lm__cuda_kernel_facts *f, const void *kernel, size_t smem, const char *what) {
    int per_sm = 0;
    return lm__cuda_check(lm__cuda_blocks_per_sm(f, kernel, NWARP * 32, smem, &per_sm), what);
}

template <int HD, bool PAGED>
static lm_status launch_fwd(const fa_args &a, int64_t B, cudaStream_t s) {
    size_t smem = sizeof(bf16) * 4 * TILE * (HD + PADE); /* K and V, two stages */
    LM_TRY(kernel_smem(&fwd_facts[HD == 128][PAGED], (const void *)fa_fwd<HD, PAGED>, smem,
                       "flash attention forward: kernel attributes"));
    dim3 grid((unsigned)((a.Tq + TILE - 1) / TILE), (unsigned)a.Hq, (unsigned)B);
    fa_fwd<HD, PAGED><<<grid, NWARP * 32, smem, s>>>(a);
    return lm__cuda_launched("flash attention forward");
}

static lm__cuda_kernel_facts wg_facts[2]; /* [HD 128] */

template <int HD>
static lm_status launch_fwd_wg(const fa_args &a, int64_t B, cudaStream_t s) {
    const void *k = (const void *)fa_fwd_wg<HD>;
    int per_sm = 0;
    LM_TRY(lm__cuda_check(lm__cuda_blocks_per_sm(&wg_facts[HD == 128], k, 128, wg_tiles<HD>::SMEM, &per_sm),
                          "flash attention forward (wgmma): kernel attributes"));
    /* tiles slowest in the launch order, so causal grids start their longest tiles first
     * across all heads and rows, not per (head, row) */
    dim3 grid((unsigned)a.Hq, (unsigned)B, (unsigned)((a.Tq + TILE - 1) / TILE));
    fa_fwd_wg<HD><<<grid, 128, wg_tiles<HD>::SMEM, s>>>(a);
    return lm__cuda_launched("flash attention forward (wgmma)");
}

/* The wgmma kernels run where the build and the device allow (lm__cuda_sm90a) unless
 * LOOM_FLASH_WGMMA=0 (read on each call: tests and benchmarks compare the two kernel
 * forms in one process). */
static int use_wgmma(void) {
    const char *e = getenv("LOOM_FLASH_WGMMA");
    return !(e && e[0] == '0' && e[1] == 0) && lm__cuda_sm90a();
}

int lm__cuda_flash_attention_wgmma(void) { return use_wgmma(); }

template <int HD>
static lm_status forward(const fa_args &a, int64_t B, cudaStream_t s) {
    if (a.row_table && a.nb != 1) return launch_fwd<HD, true>(a, B, s);
    if (!use_wgmma() || a.scale <= 0 || (a.Tq + TILE - 1) / TILE > 65535) /* grid z */
        return launch_fwd<HD, false>(a, B, s);
    return launch_fwd_wg<HD>(a, B, s);
}

lm_status lm__cuda_flash_attention(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                   float scale, int causal, int64_t window, const lm_tensor_view *out, cudaStream_t s) {
    fa_args a = args_of(q, k, v, scale, causal, window);
    a.o = fa_of(out), a.o_f32 = out->dtype == LM_F32;
    if (lm_tensor_view_numel(out) == 0) return LM_OK;
    return q->shape[3] == 64 ? forward<64>(a, q->shape[0], s) : forward<128>(a, q->shape[0], s);
}

/* recompute: run the forward for O and L first (else a.o and a.lse hold the forward's). */
template <int HD>
static lm_status backward(fa_args a, int64_t B, int recompute, cudaStream_t s) {
    if (recompute) LM_TRY(forward<HD>(a, B, s)); /* O (f32) and L */
    int64_t rows = B * a.Hq * a.Tq;
    if (!a.o_f32 && fa_rows16(a.o) && fa_rows16(a.dout))
        fa_dot_vec<HD><<<(unsigned)((rows * (HD / 8) + 255) / 256), 256, 0, s>>>(a, rows);
    else
        fa_dot<HD><<<(unsigned)((rows + 7) / 8), 256, 0, s>>>(a, rows);
    LM_TRY(lm__cuda_launched("flash attention rowsum(dO * O)"));
    const int wg = use_wgmma() && LM_MAX(a.Tq, a.Tk) <= (int64_t)65535 * TILE; /* tiles in grid z */
    if (a.dk.p || a.dv.p) {
        size_t smem = wg ? wgb_tiles<HD>::SMEM : sizeof(bf16) * 4 * TILE * (HD + PADE) + sizeof(float) * 4 * TILE;
        const void *k = wg ? (const void *)fa_dkdv_wg<HD> : (const void *)fa_dkdv<HD>;
        LM_TRY(kernel_smem(&dkdv_facts[HD == 128][wg], k, smem, "flash attention dK/dV: kernel attributes"));
        dim3 grid((unsigned)((a.Tk + TILE - 1) / TILE), (unsigned)a.Hq, (unsigned)B);
        dim3 wgrid((unsigned)a.Hq, (unsigned)B, (unsigned)((a.Tk + TILE - 1) / TILE)); /* key tiles slowest */
        if (wg) fa_dkdv_wg<HD><<<wgrid, NWARP * 32, smem, s>>>(a);
        else fa_dkdv<HD><<<grid, NWARP * 32, smem, s>>>(a);
        LM_TRY(lm__cuda_launched("flash attention dK/dV"));
        if (a.pk) {
            int64_t n = B * a.Hkv * a.Tk * (HD / 4);
            fa_group_sum<HD><<<lm__cuda_blocks(n, 256), 256, 0, s>>>(a, B);
            LM_TRY(lm__cuda_launched("flash attention dK/dV group sum"));
        }
    }
    if (a.dq.p) {
        size_t smem = wg ? wgb_tiles<HD>::SMEM : sizeof(bf16) * 4 * TILE * (HD + PADE); /* two stages */
        const void *k = wg ? (const void *)fa_dq_wg<HD> : (const void *)fa_dq<HD>;
        LM_TRY(kernel_smem(&dq_facts[HD == 128][wg], k, smem, "flash attention dQ: kernel attributes"));
        dim3 grid((unsigned)((a.Tq + TILE - 1) / TILE), (unsigned)a.Hq, (unsigned)B);
        dim3 wgrid((unsigned)a.Hq, (unsigned)B, (unsigned)((a.Tq + TILE - 1) / TILE)); /* query tiles slowest */
        if (wg) fa_dq_wg<HD><<<wgrid, NWARP * 32, smem, s>>>(a);
        else fa_dq<HD><<<grid, NWARP * 32, smem, s>>>(a);
        LM_TRY(lm__cuda_launched("flash attention dQ"));
    }
    return LM_OK;
}

/* The backward from the forward's out and lse when given (both or neither), else with
 * the forward recomputed into a workspace. */
static lm_status flash_backward(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                const lm_tensor_view *out, const lm_tensor_view *lse, const lm_tensor_view *dout,
                                float scale, int causal, int64_t window, const lm_tensor_view *dq,
                                const lm_tensor_view *dk, const lm_tensor_view *dv, cudaStream_t s) {
    int64_t B = q->shape[0], D = q->shape[3], rows = B * q->shape[1] * q->shape[2];
    if (rows == 0 || (!dq && !dk && !dv)) return LM_OK;
    fa_args a = args_of(q, k, v, scale, causal, window);
    a.dout = fa_of(dout), a.dq = fa_of(dq), a.dk = fa_of(dk), a.dv = fa_of(dv);
    a.dq_f32 = dq && dq->dtype == LM_F32, a.dk_f32 = dk && dk->dtype == LM_F32, a.dv_f32 = dv && dv->dtype == LM_F32;
    int grouped = q->shape[1] != k->shape[1] && (dk || dv), saved = out != NULL;
    int64_t krows = B * q->shape[1] * k->shape[2]; /* per-query-head dK/dV partial rows */
    /* workspace: (recomputing) O f32 [rows, D] and L [rows]; D [rows]; (grouped) dK and
     * dV partials [krows, D] */
    size_t r4 = ((size_t)rows + 3) / 4 * 4; /* lse and dd padded: the partials start on 16 bytes (float4 loads) */
    size_t bytes =
        sizeof(float) * ((saved ? r4 : (size_t)rows * (size_t)D + 2 * r4) + (grouped ? 2 * (size_t)krows * (size_t)D : 0));
    void *work = NULL;
    LM_TRY(lm__cuda_check(cudaMallocAsync(&work, bytes, s), "cudaMallocAsync (flash attention backward)"));
    float *w = (float *)work;
    if (saved) {
        a.o = fa_of(out), a.o_f32 = out->dtype == LM_F32;
        a.lse = (float *)lse->data;
    } else {
        a.o = (fa_view){w, q->shape[1] * q->shape[2] * D, q->shape[2] * D, D};
        a.o_f32 = 1;
        a.lse = w + rows * D;
        w = a.lse + r4;
    }
    a.dd = w;
    if (grouped) a.pk = a.dd + r4, a.pv = a.pk + krows * D;
    lm_status st = D == 64 ? backward<64>(a, B, !saved, s) : backward<128>(a, B, !saved, s);
    cudaFreeAsync(work, s);
    return st;
}

lm_status lm__cuda_flash_attention_backward(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                            const lm_tensor_view *dout, float scale, int causal, int64_t window,
                                            const lm_tensor_view *dq, const lm_tensor_view *dk,
                                            const lm_tensor_view *dv, cudaStream_t s) {
    return flash_backward(q, k, v, NULL, NULL, dout, scale, causal, window, dq, dk, dv, s);
}

lm_status lm__cuda_flash_attention_lse(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                       float scale, int causal, int64_t window, const lm_tensor_view *out,
                                       const lm_tensor_view *lse, cudaStream_t s) {
    fa_args a = args_of(q, k, v, scale, causal, window);
    a.o = fa_of(out), a.o_f32 = out->dtype == LM_F32;
    a.lse = (float *)lse->data;
    if (lm_tensor_view_numel(out) == 0) return LM_OK;
    return q->shape[3] == 64 ? forward<64>(a, q->shape[0], s) : forward<128>(a, q->shape[0], s);
}

lm_status lm__cuda_flash_attention_backward_lse(const lm_tensor_view *q, const lm_tensor_view *k,
                                                const lm_tensor_view *v, const lm_tensor_view *out,
                                                const lm_tensor_view *lse, const lm_tensor_view *dout, float scale,
                                                int causal, int64_t window, const lm_tensor_view *dq,
                                                const lm_tensor_view *dk, const lm_tensor_view *dv, cudaStream_t s) {
    return flash_backward(q, k, v, out, lse, dout, scale, causal, window, dq, dk, dv, s);
}

/* ---- cache mode: a prefill step's attention over its slots ----------------------------------- */
int lm__cuda_attention_cache_flash_supports(const lm_tensor_view *q, const lm_tensor_view *k_cache,
                                            const lm_tensor_view *v_cache, const lm_tensor_view *out) {
    int64_t D = q->shape[3]; /* token-major q, out [B, T, H, D] and caches [S, Hkv, P, D]: the same rules */
    return (D == 64 || D == 128) && view_ok(q, D, 1) && view_ok(k_cache, D, 1) && view_ok(v_cache, D, 1) &&
           view_ok(out, D, 0);
}

/* A token-major view [B, T, H, D] as the kernels' [B, H, T] strides. */
static fa_view token_major(const lm_tensor_view *v) {
    fa_view f = {v->data, v->stride[0], v->stride[2], v->stride[1]};
    return f;
}

lm_status lm__cuda_attention_cache_flash(const lm_tensor_view *q, const lm_tensor_view *k_cache,
                                         const lm_tensor_view *v_cache, const lm_tensor_view *slots,
                                         const lm_tensor_view *positions, float scale, int64_t window,
                                         const lm_tensor_view *out, cudaStream_t s) {
    fa_args a;
    memset(&a, 0, sizeof a);
    int64_t B = q->shape[0], T = q->shape[1], P = k_cache->shape[2], D = q->shape[3];
    a.q = token_major(q), a.o = token_major(out), a.o_f32 = out->dtype == LM_F32;
    a.k = fa_of(k_cache), a.v = fa_of(v_cache); /* [S, Hkv, P, D]: a block indexes the batch stride */
    a.nb = slots->ndim == 2 ? slots->shape[1] : 1, a.P = P, a.nblocks = k_cache->shape[0];
    a.Hq = q->shape[2], a.Hkv = k_cache->shape[1], a.Tq = T, a.Tk = a.nb * P;
    a.scale = scale, a.scale_log2 = scale * LOG2E, a.causal = 1, a.window = window;
    a.row_table = (const int32_t *)slots->data, a.row_pos = (const int32_t *)positions->data;
    if (a.nb != 1 && P > INT32_MAX)
        return lm__error(LM_UNSUPPORTED, "attention_cache (flash): blocks of %lld positions", (long long)P);
    if (B == 0 || T == 0) return LM_OK;
    return D == 64 ? forward<64>(a, B, s) : forward<128>(a, B, s);
}
