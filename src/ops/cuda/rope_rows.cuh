/* ops/cuda/rope_rows.cuh — the rotary embedding kernel shared by the forward (rope.cu)
 * and the input gradient of the backward (rope_backward.cu); never installed.
 *
 * x, out [B, T, H, D] (any strides). A block takes a tile of `tok` tokens at a time:
 * first one thread per (token, pair i) computes the angle pos * inv_freq[i] and its
 * cos/sin in double (positions reach 1e5 and more, where a float angle would be off
 * by 1e-2 radians), scales them by attn_factor and keeps them in shared memory with
 * the token's offsets; then the threads walk the tile's (token, head, pair) items in
 * order (neighbouring threads: neighbouring pairs, so loads coalesce), each rotating
 * one pair (a, b) to (a c - b s, b c + a s) with s = sgn * sin: sgn = +1 is the forward,
 * sgn = -1 its transpose (the gradient). A bias [H, D] (forward only) is added before
 * the rotation. Each thread reads both members of its pair before writing them, so
 * in-place use is safe. The split-half style without a bias over same-dtype, aligned,
 * unit-stride views runs rope_rows_vec_kernel: the same arithmetic on 16-byte vectors
 * of pairs (8 bf16 a load). O(B T H D); the angles O(B T D / 2).
 */
#ifndef LOOM_OPS_CUDA_ROPE_ROWS_CUH
#define LOOM_OPS_CUDA_ROPE_ROWS_CUH

#include "ops/cuda/rows_vec.cuh"

#define ROPE_THREADS 256
#define ROPE_MAX_TOK 64
#define ROPE_ITEMS 2048    /* pairs a tile aims at (8 per thread) */
#define ROPE_VEC_ITEMS 512 /* 16-byte vector items a tile aims at (2 per thread) */

struct lm__cuda_rope_args {
    int style; /* LM_ROPE_SPLIT_HALF or LM_ROPE_INTERLEAVED */
    const float *inv_freq;
    int64_t inv_stride;
    float attn_factor;
    const void *pos; /* NULL: pos_offset + t */
    int pos_is64, pos_ndim;
    int64_t pos_stride[2];
    int64_t pos_offset;
    int64_t B, T, H, half;
};

/* The kernel arguments of p for a [B, T, H, D] view x. */
static inline lm__cuda_rope_args lm__cuda_rope_args_of(const lm_rope_params *p, const lm_tensor_view *x) {
    lm__cuda_rope_args a;
    memset(&a, 0, sizeof a);
    a.style = (int)p->style;
    a.inv_freq = (const float *)p->inv_freq->data;
    a.inv_stride = p->inv_freq->stride[0];
    a.attn_factor = p->attn_factor;
    a.pos_offset = p->pos_offset;
    if (p->positions) {
        a.pos = p->positions->data;
        a.pos_is64 = p->positions->dtype == LM_I64;
        a.pos_ndim = p->positions->ndim;
        for (int i = 0; i < a.pos_ndim; i++) a.pos_stride[i] = p->positions->stride[i];
    }
    a.B = x->shape[0], a.T = x->shape[1], a.H = x->shape[2], a.half = x->shape[3] / 2;
    return a;
}

/* Position of token (b, t). */
__device__ __forceinline__ int64_t rope_position(const lm__cuda_rope_args &a, int64_t b, int64_t t) {
    if (!a.pos) return a.pos_offset + t;
    return a.pos_ndim == 1 ? ld_index_at(a.pos, a.pos_is64, t * a.pos_stride[0])
                           : ld_index_at(a.pos, a.pos_is64, b * a.pos_stride[0] + t * a.pos_stride[1]);
}

/* attn_factor * (cos, sin) of pair i at position pos. */
__device__ __forceinline__ void rope_cos_sin(const lm__cuda_rope_args &a, int64_t pos, int64_t i, float *c, float *s) {
    double sn, cs;
    sincos((double)pos * (double)a.inv_freq[i * a.inv_stride], &sn, &cs);
    *c = (float)(cs * a.attn_factor);
    *s = (float)(sn * a.attn_factor);
}

/* Element indices of pair i within a head. */
__device__ __forceinline__ void rope_pair(const lm__cuda_rope_args &a, int64_t i, int64_t *ia, int64_t *ib) {
    *ia = a.style == LM_ROPE_INTERLEAVED ? 2 * i : i;
    *ib = a.style == LM_ROPE_INTERLEAVED ? 2 * i + 1 : i + a.half;
}

/* The angle phase of a tile: cos/sin of each (token lt < nt, pair i) at [lt * half + i]
 * and each token's offsets of x and out (batch and token strides); ends with a barrier. */
__device__ __forceinline__ void rope_tile_angles(const lm__cuda_rope_args &a, const lm__cuda_nd &nx,
                                                 const lm__cuda_nd &no, int64_t t0, int nt, float *cs, float *sn,
                                                 int64_t *xoff, int64_t *ooff) {
    const int half = (int)a.half;
    for (int j = threadIdx.x; j < nt * half; j += blockDim.x) {
        int lt = j / half, i = j - lt * half;
        int64_t g = t0 + lt, b = g / a.T, t = g - b * a.T;
        rope_cos_sin(a, rope_position(a, b, t), i, &cs[j], &sn[j]);
        if (i == 0) {
            xoff[lt] = b * nx.stride[0] + t * nx.stride[1];
            ooff[lt] = b * no.stride[0] + t * no.stride[1];
        }
    }
    __syncthreads();
}

/* The tile loop of both kernels: per tile of `tok` tokens the angle phase, then
 * item(j, lt, cos, sin, xoff, ooff) for each of the tile's items j < nt * per (lt: the
 * item's token in the tile), then a barrier (the next tile replaces the angles).
 * Shared memory: cos and sin [tok * half] floats. */
template <typename F>
__device__ __forceinline__ void rope_tiles(const lm__cuda_rope_args &a, const lm__cuda_nd &nx, const lm__cuda_nd &no,
                                           int tok, int per, F item) {
    extern __shared__ float rope_sh[];
    __shared__ int64_t xoff[ROPE_MAX_TOK], ooff[ROPE_MAX_TOK];
    float *cs = rope_sh, *sn = rope_sh + tok * (int)a.half;
    const int64_t ntok = a.B * a.T;
    for (int64_t t0 = (int64_t)blockIdx.x * tok; t0 < ntok; t0 += (int64_t)gridDim.x * tok) {
        const int nt = (int)(ntok - t0 < tok ? ntok - t0 : tok);
        rope_tile_angles(a, nx, no, t0, nt, cs, sn, xoff, ooff);
        for (int j = threadIdx.x; j < nt * per; j += blockDim.x) item(j, j / per, cs, sn, xoff, ooff);
        __syncthreads();
    }
}

/* Any strides; out has dtype out_dt (st_dt); an item is one pair. */
template <typename T>
__global__ void __launch_bounds__(ROPE_THREADS) rope_rows_kernel(const T *x, lm__cuda_nd nx, const T *bias, int64_t bs0,
                                                                  int64_t bs1, void *out, int out_dt, lm__cuda_nd no,
                                                                  lm__cuda_rope_args a, float sgn, int tok) {
    const int half = (int)a.half, per = (int)(a.H * a.half);
    rope_tiles(a, nx, no, tok, per,
               [&](int j, int lt, const float *cs, const float *sn, const int64_t *xoff, const int64_t *ooff) {
                   int r = j - lt * per, h = r / half, i = r - h * half;
                   float c = cs[lt * half + i], s = sgn * sn[lt * half + i];
                   int64_t ia, ib;
                   rope_pair(a, i, &ia, &ib);
                   const T *xp = x + xoff[lt] + h * nx.stride[2];
                   float va = ld(xp + ia * nx.stride[3]), vb = ld(xp + ib * nx.stride[3]);
                   if (bias) {
                       va += ld(bias + h * bs0 + ia * bs1);
                       vb += ld(bias + h * bs0 + ib * bs1);
                   }
                   int64_t ob = ooff[lt] + h * no.stride[2];
                   st_dt(out, out_dt, ob + ia * no.stride[3], va * c - vb * s);
                   st_dt(out, out_dt, ob + ib * no.stride[3], vb * c + va * s);
               });
}

/* The split-half style over x and out of one dtype T with unit last strides and every
 * 16-byte vector of a half-head aligned (rope_rows_vec_ok): an item is one vector of
 * VEC pairs, its a halves and b halves read and written 16 bytes at a time. No bias. */
template <typename T>
__global__ void __launch_bounds__(ROPE_THREADS) rope_rows_vec_kernel(const T *x, lm__cuda_nd nx, T *out, lm__cuda_nd no,
                                                                      lm__cuda_rope_args a, float sgn, int tok) {
    constexpr int VEC = 16 / sizeof(T);
    const int half = (int)a.half, hv = half / VEC, per = (int)a.H * hv;
    rope_tiles(a, nx, no, tok, per,
               [&](int j, int lt, const float *cs, const float *sn, const int64_t *xoff, const int64_t *ooff) {
                   int r = j - lt * per, h = r / hv, i0 = (r - h * hv) * VEC;
                   const T *xp = x + xoff[lt] + h * nx.stride[2] + i0;
                   T *op = out + ooff[lt] + h * no.stride[2] + i0;
                   float va[VEC], vb[VEC], ra[VEC], rb[VEC];
                   unpack16(*(const uint4 *)xp, va, x), unpack16(*(const uint4 *)(xp + half), vb, x);
#pragma unroll
                   for (int e = 0; e < VEC; e++) {
                       float c = cs[lt * half + i0 + e], s = sgn * sn[lt * half + i0 + e];
                       ra[e] = va[e] * c - vb[e] * s;
                       rb[e] = vb[e] * c + va[e] * s;
                   }
                   *(uint4 *)op = pack16<T>(ra);
                   *(uint4 *)(op + half) = pack16<T>(rb);
               });
}

/* 1 when v's last dim is unit-stride and every 16-byte vector of a half-head starts
 * on a 16-byte boundary (data and the b, t, h strides multiples of the vector). */
static inline int rope_rows_vec_ok(const lm_tensor_view *v, int64_t half) {
    int64_t vec = 16 / (int64_t)lm_dtype_size(v->dtype);
    if (!lm__cuda_aligned16(v->data) || v->stride[3] != 1 || half % vec != 0) return 0;
    for (int i = 0; i < 3; i++)
        if (v->shape[i] > 1 && v->stride[i] % vec != 0) return 0;
    return 1;
}

/* Queues rope_rows_kernel over x -> out (x's float dtype; out any float dtype), or the
 * vector kernel when the style, dtypes and layouts allow it (same arithmetic). */
static inline lm_status lm__cuda_rope_rows(const lm_tensor_view *x, const void *bias, int64_t bs0, int64_t bs1,
                                           const lm_tensor_view *out, const lm__cuda_rope_args &a, float sgn,
                                           const char *what, cudaStream_t s) {
    int64_t ntok = a.B * a.T, per = a.H * a.half;
    if (ntok == 0 || per == 0) return LM_OK;
    int64_t tok = LM_MAX((int64_t)1, LM_MIN((int64_t)ROPE_MAX_TOK, ROPE_ITEMS / per));
    size_t smem = 2 * sizeof(float) * (size_t)(tok * a.half);
    if (smem > 48 * 1024 || per * ROPE_MAX_TOK > INT32_MAX)
        return lm__error(LM_UNSUPPORTED, "%s: %lld heads x head dim %lld exceed the CUDA kernel's limit (head dim <= 12288)",
                         what, (long long)a.H, (long long)(2 * a.half));
    LM_TRY(lm__cuda_float_only(x->dtype));
    if (!bias && a.style == LM_ROPE_SPLIT_HALF && out->dtype == x->dtype && rope_rows_vec_ok(x, a.half) &&
        rope_rows_vec_ok(out, a.half)) {
        int64_t vec = 16 / (int64_t)lm_dtype_size(x->dtype), items = a.H * (a.half / vec);
        int64_t vtok = LM_MAX((int64_t)1, LM_MIN((int64_t)ROPE_MAX_TOK, ROPE_VEC_ITEMS / items));
        size_t vsmem = 2 * sizeof(float) * (size_t)(vtok * a.half);
        if (vsmem <= 48 * 1024) {
            unsigned vblocks = (unsigned)LM_MIN((ntok + vtok - 1) / vtok, (int64_t)132 * 16);
            LM__CUDA_FLOAT_SWITCH(x->dtype, T,
                                 rope_rows_vec_kernel<T><<<vblocks, ROPE_THREADS, vsmem, s>>>(
                                     (const T *)x->data, lm__cuda_nd_of(x), (T *)out->data, lm__cuda_nd_of(out), a, sgn,
                                     (int)vtok));
            return lm__cuda_launched(what);
        }
    }
    unsigned blocks = (unsigned)LM_MIN((ntok + tok - 1) / tok, (int64_t)132 * 16);
    LM__CUDA_FLOAT_SWITCH(x->dtype, T,
                         rope_rows_kernel<T><<<blocks, ROPE_THREADS, smem, s>>>(
                             (const T *)x->data, lm__cuda_nd_of(x), (const T *)bias, bs0, bs1, out->data, (int)out->dtype,
                             lm__cuda_nd_of(out), a, sgn, (int)tok));
    return lm__cuda_launched(what);
}

#endif
