/* ops/cuda/wgmma.cuh — Hopper warpgroup products (wgmma) and their shared-memory
 * layout, for kernels built for sm_90a (never installed).
 *
 * A warpgroup is 4 consecutive warps (128 threads, the first warp's index a multiple
 * of 4); one wgmma.mma_async computes D (64 x N, f32 registers) (+)= A (64 x 16) B
 * (16 x N) for the whole group, asynchronously: issue, commit a group, wait for it.
 * Accumulator layout per warp w of the group: rows 16 w + g and 16 w + g + 8 (g = lane
 * / 4, c = lane % 4); register 4 j + r holds column 8 j + 2 c + (r & 1) of row
 * 16 w + g + (r >> 1) * 8 — for each 8-column chunk j the C layout of mma.sync
 * m16n8k16, so code written for mma.sync fragments reads it unchanged. An A operand
 * from registers has mma.sync's A layout (rows of the warp as above, columns 2 c, 2 c
 * + 8 in pairs).
 *
 * Operands in shared memory are read through 64-bit matrix descriptors, here always
 * in the 128-byte swizzle: a tile of R rows x C bf16 (C a multiple of 64) is stored as
 * C / 64 column blocks of R x 128 bytes (block cb at cb * R * 128), and in each block
 * row r's 16-byte chunk q sits at chunk q ^ (r % 8) (sw_offset). Blocks start on
 * 1,024 bytes (8 rows: one swizzle atom).
 * - K-major operand (A, or a B whose rows are the n index, e.g. K in Q K^T): the 16
 *   k values of one product sit in one row's 32 bytes; descriptor start = block of
 *   column k + (k % 64) * 2 bytes, stride between 8-row groups 1,024 bytes.
 * - MN-major B (rows are the k index, e.g. V in P V; the tnsp-b form): 16 k rows at
 *   start = row k0's address, 8-row groups 1,024 bytes apart, column blocks (64 n
 *   each) R * 128 bytes apart.
 * Shared memory written by threads (st.shared, cp.async) must be made visible to the
 * products with fence_async_smem() before the barrier that publishes it.
 * Operand lists are written out in full (PTX asm has no loops): scripts/gen_wgmma.py
 * writes them into wgmma_products.cuh.
 */
#ifndef LOOM_OPS_CUDA_WGMMA_CUH
#define LOOM_OPS_CUDA_WGMMA_CUH

#include <stdint.h>

/* Byte offset of element (r, col) in a 128-byte-swizzled tile of R rows (see above). */
__host__ __device__ __forceinline__ uint32_t sw_offset(int R, int r, int col) {
    return (uint32_t)((col >> 6) * R * 128 + r * 128 + ((((col & 63) >> 3) ^ (r & 7)) << 4) + (col & 7) * 2);
}

/* A shared-memory matrix descriptor in the 128-byte swizzle: start address, leading
 * byte offset (MN-major: between 64-column blocks), stride byte offset (between 8-row
 * groups). */
__device__ __forceinline__ uint64_t wg_desc(const void *smem, uint32_t lbo, uint32_t sbo) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((a & 0x3FFFF) >> 4) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 |
           (uint64_t)((sbo >> 4) & 0x3FFF) << 32 | 1ull << 62;
}

__device__ __forceinline__ void wg_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Thread writes to shared memory made visible to the async proxy (wgmma operands). */
__device__ __forceinline__ void fence_async_smem(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* Keeps the compiler from moving accesses of an accumulator across a wgmma wait. */
template <int R> __device__ __forceinline__ void wg_hold(float *d) {
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* The products themselves, one function per form and width (generated). */
#include "ops/cuda/wgmma_products.cuh"

#endif
