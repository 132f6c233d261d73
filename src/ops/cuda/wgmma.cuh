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
 * Operand lists are written out in full: PTX asm has no loops.
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

/* D (64 x 64, f32) (+)= A (64 x 16, descriptor) B (16 x 64, descriptor, K-major). */
__device__ __forceinline__ void wg_ss_n64(float *d, uint64_t da, uint64_t db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(accumulate));
}

/* D (64 x 64, f32) += A (64 x 16, bf16 registers in the mma.sync A layout) B (16 x 64,
 * descriptor, MN-major: the tnsp-b form). */
__device__ __forceinline__ void wg_rs_n64_t(float *d, const uint32_t *a, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

/* D (64 x 128, f32) += A (64 x 16, bf16 registers in the mma.sync A layout) B (16 x 128,
 * descriptor, MN-major: the tnsp-b form). */
__device__ __forceinline__ void wg_rs_n128_t(float *d, const uint32_t *a, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

#endif
