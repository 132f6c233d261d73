/* ops/cuda/mma.cuh — warp-level tensor-core pieces shared by the attention kernels
 * (sm_80+): the m16n8k16 bf16 product, its fragments read from shared memory with
 * ldmatrix, bf16 packing, 2^x, and 16-byte cp.async staging. Fragment layouts (PTX
 * ISA; g = lane / 4, c = lane % 4): A {(g, 2c), (g+8, 2c), (g, 2c+8), (g+8, 2c+8)}
 * pairs, B {(k 2c, n g), (k 2c+8, n g)} pairs, C {(g, 2c), (g, 2c+1), (g+8, 2c),
 * (g+8, 2c+1)}. Included by .cu files only. */
#ifndef LOOM_OPS_CUDA_MMA_CUH
#define LOOM_OPS_CUDA_MMA_CUH

#include "ops/cuda/common.cuh"

__device__ __forceinline__ void mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 2^x as the bare hardware approximation (ex2.approx.ftz: the instruction exp2f is
 * built on, without exp2f's extra steps for subnormal results, which flush to 0 here;
 * 2^-inf = 0). The exponent is the per-element work of these kernels: on the H200 the
 * forward ran 20% and the backward 17% faster, with outputs unchanged in a checksum to
 * 7 digits (bench/NOTES.md v13). */
__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pk(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* The A fragment (bf16 pairs) of k-chunk kk (16 columns) from f32 C-layout tiles x: the
 * C layout of two adjacent n-tiles is the A layout of one k-chunk. */
__device__ __forceinline__ void pack_a(const float (*x)[4], int kk, uint32_t *a) {
    a[0] = pk(x[2 * kk][0], x[2 * kk][1]), a[1] = pk(x[2 * kk][2], x[2 * kk][3]);
    a[2] = pk(x[2 * kk + 1][0], x[2 * kk + 1][1]), a[3] = pk(x[2 * kk + 1][2], x[2 * kk + 1][3]);
}

/* 16-byte asynchronous copy from global to shared memory (cp.async, bypassing L1);
 * ok = 0 writes 16 zero bytes and reads nothing (src must still be a valid address). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool ok) {
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool ok) {
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all(void) { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

/* B fragments of two adjacent n-tiles [n0, n0 + 16) at k offset k0 of a shared [n][k]
 * array (pitch ld): ldmatrix.x4, r[0..1] for n-tile n0, r[2..3] for n0 + 8 (lane l
 * addresses row (l & 7) of matrix l / 8: n-half (l >> 4), k-half (l >> 3) & 1). */
__device__ __forceinline__ void frag_b_x4(const bf16 *sm, int ld, int n0, int k0, int lane, uint32_t *r) {
    const bf16 *p = sm + (n0 + (lane & 7) + ((lane >> 4) & 1) * 8) * ld + k0 + ((lane >> 3) & 1) * 8;
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* B fragments of two adjacent n-tiles [n0, n0 + 16) for k rows [k0, k0 + 16) of a
 * shared row-major [k][n] array (pitch ld): ldmatrix.x4.trans, r[0..1] for n-tile n0,
 * r[2..3] for n0 + 8. Rows are 16-byte aligned and the pitch spreads 8 rows over all
 * banks. */
__device__ __forceinline__ void frag_b_trans(const bf16 *sm, int ld, int k0, int n0, int lane, uint32_t *r) {
    const bf16 *p = sm + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8;
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

#endif
