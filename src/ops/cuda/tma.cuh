/* ops/cuda/tma.cuh — tensor-memory copies (TMA) and the shared-memory barriers that ring
 * them, for the wgmma kernels built for sm_90a (gemm_wg.cu, gemm_rows.cu; never
 * installed).
 *
 * Host side: lm__cuda_bf16_map describes a bf16 [rows, cols] matrix (rows ld elements
 * apart) to the copy engine in boxes of box_rows x 64 with the 128-byte swizzle (wgmma.cuh's
 * shared-memory layout), zeros past its edges; lm__cuda_tma_ok says whether the driver gave
 * cuTensorMapEncodeTiled. Device side (sm_90a bodies only): mbarrier init / expect-tx /
 * arrive / parity wait, one 2-D box copy completing on an mbarrier, and the cluster's
 * barrier and distributed shared-memory loads.
 */
#ifndef LOOM_OPS_CUDA_TMA_CUH
#define LOOM_OPS_CUDA_TMA_CUH

#include "ops/cuda/common.cuh"

#include <cuda.h>

/* Inputs a box spans: 64 bf16 = one 128-byte swizzled row. */
#define LM__TMA_BK 64

/* Fills *m for the bf16 [rows, cols] matrix at base (rows ld elements apart), read in
 * boxes of box_rows x LM__TMA_BK; who names the caller in errors. */
lm_status lm__cuda_bf16_map(CUtensorMap *m, const void *base, int64_t rows, int64_t cols, int64_t ld, int box_rows,
                            const char *who);
/* 1 when the driver gave cuTensorMapEncodeTiled (looked up once). */
int lm__cuda_tma_ok(void);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity) {
    asm volatile("{\n.reg .pred done;\n"
                 "wait_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_%=;\n}\n" ::"r"(smem_u32(b)),
                 "r"(parity)
                 : "memory");
}
/* A 2-D box of the tensor map at (c0 = inner coordinate, c1 = row) into this block's
 * shared memory, completing on its mbarrier b. */
__device__ __forceinline__ void tma_2d(void *dst, const CUtensorMap *map, int c0, int c1, uint64_t *b) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                 "%3}], [%4];\n" ::"r"(smem_u32(dst)),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(smem_u32(b))
                 : "memory");
}
/* Every thread of every block of the cluster arrives (its shared-memory stores released),
 * then waits for all (acquiring theirs). */
__device__ __forceinline__ void cluster_sync(void) {
    asm volatile("barrier.cluster.arrive.release;\n"
                 "barrier.cluster.wait.acquire;\n" ::
                     : "memory");
}
/* The f32 at p in the shared memory of the cluster's block `rank` (p an address of this
 * block's dynamic shared memory: the blocks share its layout). */
__device__ __forceinline__ float ld_cluster_f32(const float *p, int rank) {
    uint32_t a;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(a) : "r"(smem_u32(p)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(a) : "memory");
    return v;
}
#endif

#endif
