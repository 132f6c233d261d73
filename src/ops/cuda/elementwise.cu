/* ops/cuda/elementwise.cu — readable CUDA kernels for add, mul, scale, silu, swiglu
 * and cast, plus the fused SwiGLU of the model step (f32 gate|up rows to bf16).
 *
 * Readable kernels: one thread per output element in a grid-stride loop; every
 * operand is addressed through its own shape/strides (broadcast inputs arrive
 * expanded with stride 0), values are widened to float, computed, and rounded once
 * on store, matching the reference's single rounding. O(numel) work.
 * When every operand is a contiguous bf16 (or f32) view with 16-byte aligned data and
 * numel a multiple of 8 (4) (b may also be a bias row broadcast over the leading dims),
 * the same arithmetic runs one 16-byte vector per thread step (vec_kernel): identical
 * results, several times the bandwidth. A float-to-float cast of contiguous aligned
 * views runs 8 elements per step the same way (cast_vec_kernel).
 * swiglu_packed_to_bf16: rows of f32 or bf16 [gate | up] in, bf16 silu(gate) * up out,
 * contiguous; 4 (f32) or 8 (bf16) outputs per thread step when I is a multiple of that
 * and the rows are aligned.
 * Scale takes its factor from the host, or (scale_by) from an f32 on the device, read
 * by each thread: the factor of a training step's loss gradient, never synchronized.
 */
#include "ops/cuda/rows_vec.cuh"

enum { OP_ADD, OP_MUL, OP_SCALE, OP_SILU, OP_SWIGLU };

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

template <typename T>
__global__ void binary_kernel(int op, const T *a, lm__cuda_nd na, const T *b, lm__cuda_nd nb, T *out, lm__cuda_nd no,
                              int64_t n, float scale, const float *scale_at) {
    if (scale_at) scale = *scale_at;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float x = ld(a + nd_offset(na, i)), r;
        switch (op) {
        case OP_ADD: r = x + ld(b + nd_offset(nb, i)); break;
        case OP_MUL: r = x * ld(b + nd_offset(nb, i)); break;
        case OP_SCALE: r = x * scale; break;
        case OP_SILU: r = silu(x); break;
        default: r = silu(x) * ld(b + nd_offset(nb, i)); break; /* swiglu: a = gate, b = up */
        }
        st(out + nd_offset(no, i), r);
    }
}

/* bv > 0: b is one row of bv vectors broadcast over the rows (a bias). T: bf16 (8 per
 * 16-byte vector) or f32 (4). */
template <typename T>
__global__ void vec_kernel(int op, const uint4 *a, const uint4 *b, int64_t bv, uint4 *out, int64_t nv, float scale,
                           const float *scale_at) {
    constexpr int VEC = 16 / sizeof(T);
    if (scale_at) scale = *scale_at;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nv; i += (int64_t)gridDim.x * blockDim.x) {
        uint4 va = a[i], vb = b ? b[bv ? i % bv : i] : va;
        float x[VEC], y[VEC], r[VEC];
        unpack16(va, x, (const T *)NULL), unpack16(vb, y, (const T *)NULL);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            switch (op) {
            case OP_ADD: r[e] = x[e] + y[e]; break;
            case OP_MUL: r[e] = x[e] * y[e]; break;
            case OP_SCALE: r[e] = x[e] * scale; break;
            case OP_SILU: r[e] = silu(x[e]); break;
            default: r[e] = silu(x[e]) * y[e]; break;
            }
        }
        out[i] = pack16<T>(r);
    }
}

/* 1 when v is a contiguous bf16 or f32 view of dtype dt whose data is 16-byte aligned. */
static int vec_ok(const lm_tensor_view *v, lm_dtype dt) {
    return v->dtype == dt && (dt == LM_BF16 || dt == LM_F32) && lm_tensor_view_is_contiguous(v) &&
           ((uintptr_t)v->data % 16) == 0;
}

/* 1 when b is a row [N] of dtype dt (N a multiple of the vector, 16-byte aligned)
 * expanded over leading dims: every stride 0 except a unit last one. */
static int bias_row(const lm_tensor_view *b, lm_dtype dt, int vec) {
    int nd = b->ndim;
    if (nd < 2 || b->dtype != dt || b->stride[nd - 1] != 1 || b->shape[nd - 1] % vec != 0 ||
        ((uintptr_t)b->data % 16) != 0)
        return 0;
    for (int i = 0; i < nd - 1; i++)
        if (b->stride[i] != 0 && b->shape[i] != 1) return 0;
    return 1;
}

static lm_status run_binary(int op, const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out,
                            float scale, const float *scale_at, cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(out);
    if (n == 0) return LM_OK;
    lm_dtype dt = out->dtype;
    int vec = 16 / (int)lm_dtype_size(dt);
    int64_t bv = b && bias_row(b, dt, vec) ? b->shape[b->ndim - 1] / vec : 0;
    if (n % vec == 0 && vec_ok(a, dt) && vec_ok(out, dt) && (!b || bv || vec_ok(b, dt)) && lm_tensor_view_numel(a) == n &&
        (!b || bv || lm_tensor_view_numel(b) == n)) {
        const uint4 *pa = (const uint4 *)a->data, *pb = b ? (const uint4 *)b->data : NULL;
        unsigned g = lm__cuda_blocks(n / vec, 256);
        if (dt == LM_BF16) vec_kernel<bf16><<<g, 256, 0, s>>>(op, pa, pb, bv, (uint4 *)out->data, n / vec, scale, scale_at);
        else vec_kernel<float><<<g, 256, 0, s>>>(op, pa, pb, bv, (uint4 *)out->data, n / vec, scale, scale_at);
        return lm__cuda_launched("elementwise kernel (vec)");
    }
    lm__cuda_nd na = lm__cuda_nd_of(a), nb = lm__cuda_nd_of(b ? b : a), no = lm__cuda_nd_of(out);
    const void *pb = b ? b->data : a->data;
    LM_TRY(lm__cuda_float_only(out->dtype));
    LM__CUDA_FLOAT_SWITCH(out->dtype, T,
                         binary_kernel<T><<<lm__cuda_blocks(n, 256), 256, 0, s>>>(
                             op, (const T *)a->data, na, (const T *)pb, nb, (T *)out->data, no, n, scale,
                             scale_at));
    return lm__cuda_launched("elementwise kernel");
}

lm_status lm__cuda_add(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out, cudaStream_t s) {
    return run_binary(OP_ADD, a, b, out, 0.f, NULL, s);
}
lm_status lm__cuda_mul(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out, cudaStream_t s) {
    return run_binary(OP_MUL, a, b, out, 0.f, NULL, s);
}
lm_status lm__cuda_scale(const lm_tensor_view *x, float scale, const lm_tensor_view *out, cudaStream_t s) {
    return run_binary(OP_SCALE, x, NULL, out, scale, NULL, s);
}
lm_status lm__cuda_scale_by(const lm_tensor_view *x, const float *scale, const lm_tensor_view *out, cudaStream_t s) {
    return run_binary(OP_SCALE, x, NULL, out, 0.f, scale, s);
}
lm_status lm__cuda_silu(const lm_tensor_view *x, const lm_tensor_view *out, cudaStream_t s) {
    return run_binary(OP_SILU, x, NULL, out, 0.f, NULL, s);
}
lm_status lm__cuda_swiglu(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *out,
                         cudaStream_t s) {
    return run_binary(OP_SWIGLU, gate, up, out, 0.f, NULL, s);
}

/* ---- cast ---------------------------------------------------------------------------- */
__device__ __forceinline__ double ldv(const int32_t *p) { return *p; }
__device__ __forceinline__ double ldv(const int64_t *p) { return (double)*p; }
__device__ __forceinline__ double ldv(const uint8_t *p) { return *p; }
__device__ __forceinline__ double ldv(const int8_t *p) { return *p; }
__device__ __forceinline__ double ldv(const float *p) { return *p; }
__device__ __forceinline__ double ldv(const bf16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ double ldv(const __half *p) { return __half2float(*p); }
/* Float destinations round through float (as the reference's lm__st does). */
__device__ __forceinline__ void stv(float *p, double v) { *p = (float)v; }
__device__ __forceinline__ void stv(bf16 *p, double v) { *p = __float2bfloat16_rn((float)v); }
__device__ __forceinline__ void stv(__half *p, double v) { *p = __float2half_rn((float)v); }

template <typename TI, typename TO>
__global__ void cast_kernel(const TI *x, lm__cuda_nd nx, TO *out, lm__cuda_nd no, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        stv(out + nd_offset(no, i), ldv(x + nd_offset(nx, i)));
}

template <typename TI, typename TO>
__global__ void cast_int_kernel(const TI *x, lm__cuda_nd nx, TO *out, lm__cuda_nd no, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[nd_offset(no, i)] = (TO)x[nd_offset(nx, i)];
}

/* first[0] = smallest linear index whose value does not fit in [lo, hi]. */
template <typename TI>
__global__ void range_check_kernel(const TI *x, lm__cuda_nd nx, int64_t n, long long lo, long long hi,
                                   unsigned long long *first) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        long long v = (long long)x[nd_offset(nx, i)];
        if (v < lo || v > hi) atomicMin(first, (unsigned long long)i);
    }
}

/* Float to float over contiguous 16-byte aligned views, 8 values a step (n8 steps):
 * the same single rounding as cast_kernel (a float widened to double and back is exact). */
template <typename TI, typename TO>
__global__ void cast_vec_kernel(const TI *x, TO *out, int64_t n8) {
    constexpr int VI = 16 / sizeof(TI);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        float f[8];
#pragma unroll
        for (int k = 0; k < 8; k += VI) unpack16(*(const uint4 *)(x + 8 * i + k), f + k, x);
        pack_store<TO>(out + 8 * i, f, 8);
    }
}

static int cast_vec_ok(const lm_tensor_view *v) {
    return lm_dtype_is_float(v->dtype) && lm_tensor_view_is_contiguous(v) && ((uintptr_t)v->data % 16) == 0;
}

template <typename TO>
static lm_status cast_to(const lm_tensor_view *x, const lm_tensor_view *out, int64_t n, cudaStream_t s) {
    lm__cuda_nd nx = lm__cuda_nd_of(x), no = lm__cuda_nd_of(out);
    unsigned g = lm__cuda_blocks(n, 256);
    TO *o = (TO *)out->data;
    if (n % 8 == 0 && cast_vec_ok(x) && cast_vec_ok(out)) {
        unsigned gv = lm__cuda_blocks(n / 8, 256);
        switch (x->dtype) {
        case LM_F32: cast_vec_kernel<<<gv, 256, 0, s>>>((const float *)x->data, o, n / 8); break;
        case LM_BF16: cast_vec_kernel<<<gv, 256, 0, s>>>((const bf16 *)x->data, o, n / 8); break;
        default: cast_vec_kernel<<<gv, 256, 0, s>>>((const __half *)x->data, o, n / 8); break;
        }
        return lm__cuda_launched("cast kernel (vec)");
    }
    switch (x->dtype) {
    case LM_F32: cast_kernel<<<g, 256, 0, s>>>((const float *)x->data, nx, o, no, n); break;
    case LM_BF16: cast_kernel<<<g, 256, 0, s>>>((const bf16 *)x->data, nx, o, no, n); break;
    case LM_F16: cast_kernel<<<g, 256, 0, s>>>((const __half *)x->data, nx, o, no, n); break;
    case LM_I32: cast_kernel<<<g, 256, 0, s>>>((const int32_t *)x->data, nx, o, no, n); break;
    case LM_I64: cast_kernel<<<g, 256, 0, s>>>((const int64_t *)x->data, nx, o, no, n); break;
    case LM_U8: cast_kernel<<<g, 256, 0, s>>>((const uint8_t *)x->data, nx, o, no, n); break;
    case LM_I8: cast_kernel<<<g, 256, 0, s>>>((const int8_t *)x->data, nx, o, no, n); break;
    }
    return lm__cuda_launched("cast kernel");
}

template <typename TI>
static lm_status cast_int(const lm_tensor_view *x, const lm_tensor_view *out, int64_t n, cudaStream_t s) {
    lm__cuda_nd nx = lm__cuda_nd_of(x), no = lm__cuda_nd_of(out);
    const TI *in = (const TI *)x->data;
    long long lo = out->dtype == LM_U8 ? 0 : out->dtype == LM_I32 ? INT32_MIN : INT64_MIN;
    long long hi = out->dtype == LM_U8 ? 255 : out->dtype == LM_I32 ? INT32_MAX : INT64_MAX;
    unsigned g = lm__cuda_blocks(n, 256);
    unsigned long long *first = NULL, bad = ~0ull;
    LM_TRY(lm__cuda_check(cudaMallocAsync((void **)&first, sizeof bad, s), "cudaMallocAsync (cast check)"));
    lm_status st = lm__cuda_check(cudaMemcpyAsync(first, &bad, sizeof bad, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    if (st == LM_OK) {
        range_check_kernel<<<g, 256, 0, s>>>(in, nx, n, lo, hi, first);
        st = lm__cuda_launched("cast range check");
    }
    if (st == LM_OK) st = lm__cuda_check(cudaMemcpyAsync(&bad, first, sizeof bad, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
    if (st == LM_OK) st = lm__cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize (cast check)");
    cudaFreeAsync(first, s);
    LM_TRY(st);
    if (bad != ~0ull) {
        TI v;
        int64_t off = 0, i = (int64_t)bad;
        for (int d = nx.ndim - 1; d >= 0; d--) {
            off += (i % nx.shape[d]) * nx.stride[d];
            i /= nx.shape[d];
        }
        LM_TRY(lm__cuda_check(cudaMemcpy(&v, in + off, sizeof v, cudaMemcpyDeviceToHost), "cudaMemcpy"));
        return lm__error(LM_OUT_OF_RANGE, "cast: element %llu of x (%lld) does not fit in %s", bad, (long long)v,
                         lm_dtype_name(out->dtype));
    }
    switch (out->dtype) {
    case LM_I32: cast_int_kernel<<<g, 256, 0, s>>>(in, nx, (int32_t *)out->data, no, n); break;
    case LM_I64: cast_int_kernel<<<g, 256, 0, s>>>(in, nx, (int64_t *)out->data, no, n); break;
    default: cast_int_kernel<<<g, 256, 0, s>>>(in, nx, (uint8_t *)out->data, no, n); break;
    }
    return lm__cuda_launched("cast kernel");
}

/* ---- acc (f32) += x widened ------------------------------------------------------------ */
/* Readable: any strides; one element a thread step. */
template <typename TX>
__global__ void accumulate_kernel(float *acc, lm__cuda_nd na, const TX *x, lm__cuda_nd nx, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float *a = acc + nd_offset(na, i);
        *a += (float)ldv(x + nd_offset(nx, i));
    }
}

/* Contiguous, 16-byte aligned: 8 values a step (one or two 16-byte loads of x, two of acc). */
template <typename TX>
__global__ void accumulate_vec_kernel(float *acc, const TX *x, int64_t n8) {
    constexpr int VX = 16 / sizeof(TX);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        float f[8], a[8];
#pragma unroll
        for (int k = 0; k < 8; k += VX) unpack16(*(const uint4 *)(x + 8 * i + k), f + k, x);
        unpack16(*(const uint4 *)(acc + 8 * i), a, acc);
        unpack16(*(const uint4 *)(acc + 8 * i + 4), a + 4, acc);
#pragma unroll
        for (int k = 0; k < 8; k++) a[k] += f[k];
        pack_store<float>(acc + 8 * i, a, 8);
    }
}

lm_status lm__cuda_accumulate(const lm_tensor_view *acc, const lm_tensor_view *x, cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(acc);
    if (n == 0) return LM_OK;
    LM_TRY(lm__cuda_float_only(x->dtype));
    float *a = (float *)acc->data;
    if (n % 8 == 0 && cast_vec_ok(x) && cast_vec_ok(acc)) {
        unsigned g = lm__cuda_blocks(n / 8, 256);
        LM__CUDA_FLOAT_SWITCH(x->dtype, T, accumulate_vec_kernel<T><<<g, 256, 0, s>>>(a, (const T *)x->data, n / 8));
        return lm__cuda_launched("add widened kernel (vec)");
    }
    lm__cuda_nd na = lm__cuda_nd_of(acc), nx = lm__cuda_nd_of(x);
    LM__CUDA_FLOAT_SWITCH(x->dtype, T,
                         accumulate_kernel<T><<<lm__cuda_blocks(n, 256), 256, 0, s>>>(a, na, (const T *)x->data, nx, n));
    return lm__cuda_launched("add widened kernel");
}

lm_status lm__cuda_cast(const lm_tensor_view *x, const lm_tensor_view *out, cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(out);
    if (n == 0) return LM_OK;
    int fin = lm_dtype_is_float(x->dtype), fout = lm_dtype_is_float(out->dtype);
    if (fin && !fout)
        return lm__error(LM_UNSUPPORTED, "cast: %s -> %s is not supported (float to integer)", lm_dtype_name(x->dtype),
                         lm_dtype_name(out->dtype));
    if (!fout) {
        switch (x->dtype) {
        case LM_I32: return cast_int<int32_t>(x, out, n, s);
        case LM_I64: return cast_int<int64_t>(x, out, n, s);
        default: return cast_int<uint8_t>(x, out, n, s);
        }
    }
    switch (out->dtype) {
    case LM_F32: return cast_to<float>(x, out, n, s);
    case LM_BF16: return cast_to<bf16>(x, out, n, s);
    default: return cast_to<__half>(x, out, n, s);
    }
}

/* ---- the model step's SwiGLU: packed f32 or bf16 gate|up rows to bf16 ----------------------- */
template <typename T>
static __global__ void swiglu_packed_kernel(const T *gu, int64_t rows, int64_t I, bf16 *act) {
    int64_t n = rows * I;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / I, c = i - r * I;
        const T *row = gu + r * 2 * I;
        act[i] = __float2bfloat16_rn(silu(ld(row + c)) * ld(row + I + c));
    }
}

/* I a multiple of 4, gu 16-byte and act 8-byte aligned: 4 outputs per thread step (a
 * float4 of gate, one of up, 8 bytes stored), 32-bit index arithmetic; the same
 * arithmetic as swiglu_packed_kernel. */
static __global__ void swiglu_packed4_kernel(const float4 *gu, uint32_t rows, uint32_t I4, uint2 *act) {
    uint32_t n = rows * I4;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        uint32_t r = i / I4, c = i - r * I4;
        const float4 *row = gu + (size_t)r * 2 * I4;
        float4 g = row[c], u = row[I4 + c];
        __nv_bfloat162 lo = __floats2bfloat162_rn(silu(g.x) * u.x, silu(g.y) * u.y);
        __nv_bfloat162 hi = __floats2bfloat162_rn(silu(g.z) * u.z, silu(g.w) * u.w);
        act[i] = make_uint2(*(uint32_t *)&lo, *(uint32_t *)&hi);
    }
}

/* bf16 gate|up, I a multiple of 8, gu and act 16-byte aligned: 8 outputs per thread step
 * (16 bytes of gate, 16 of up, 16 stored); the same arithmetic as swiglu_packed_kernel. */
static __global__ void swiglu_packed8_bf16_kernel(const uint4 *gu, uint32_t rows, uint32_t I8, uint4 *act) {
    uint32_t n = rows * I8;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        uint32_t r = i / I8, c = i - r * I8;
        const uint4 *row = gu + (size_t)r * 2 * I8;
        uint4 g = row[c], u = row[I8 + c], o;
        const __nv_bfloat162 *g2 = (const __nv_bfloat162 *)&g, *u2 = (const __nv_bfloat162 *)&u;
        __nv_bfloat162 *o2 = (__nv_bfloat162 *)&o;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 gf = __bfloat1622float2(g2[k]), uf = __bfloat1622float2(u2[k]);
            o2[k] = __floats2bfloat162_rn(silu(gf.x) * uf.x, silu(gf.y) * uf.y);
        }
        act[i] = o;
    }
}

lm_status lm__cuda_swiglu_packed_to_bf16(const void *gu, int gu_bf16, int64_t rows, int64_t I, void *act,
                                         cudaStream_t s) {
    if (rows * I == 0) return LM_OK;
    if (gu_bf16) {
        if (I % 8 == 0 && rows * I / 8 <= (int64_t)UINT32_MAX / 2 && lm__cuda_aligned16(gu) && lm__cuda_aligned16(act)) {
            int64_t n8 = rows * I / 8;
            swiglu_packed8_bf16_kernel<<<lm__cuda_blocks(n8, 256), 256, 0, s>>>((const uint4 *)gu, (uint32_t)rows,
                                                                                 (uint32_t)(I / 8), (uint4 *)act);
        } else {
            swiglu_packed_kernel<bf16><<<lm__cuda_blocks(rows * I, 256), 256, 0, s>>>((const bf16 *)gu, rows, I,
                                                                                      (bf16 *)act);
        }
        return lm__cuda_launched("swiglu_packed_to_bf16");
    }
    if (I % 4 == 0 && rows * I / 4 <= (int64_t)UINT32_MAX / 2 && lm__cuda_aligned16(gu) && ((uintptr_t)act & 7) == 0) {
        int64_t n4 = rows * I / 4;
        swiglu_packed4_kernel<<<lm__cuda_blocks(n4, 256), 256, 0, s>>>((const float4 *)gu, (uint32_t)rows,
                                                                        (uint32_t)(I / 4), (uint2 *)act);
        return lm__cuda_launched("swiglu_packed_to_bf16");
    }
    swiglu_packed_kernel<float><<<lm__cuda_blocks(rows * I, 256), 256, 0, s>>>((const float *)gu, rows, I,
                                                                               (bf16 *)act);
    return lm__cuda_launched("swiglu_packed_to_bf16");
}
