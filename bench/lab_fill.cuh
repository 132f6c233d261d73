/* bench/lab_fill.cuh — the kernel labs' input filler: p[i] = a hash of (i, seed) mapped to
 * uniform values in [-sc / 2, sc / 2), rounded to bf16, so two runs (and two builds) of a
 * lab see the same inputs without a host copy. Included by the bench/*.cu labs only. */
#ifndef LOOM_BENCH_LAB_FILL_CUH
#define LOOM_BENCH_LAB_FILL_CUH

#include <cuda_bf16.h>
#include <stdint.h>

__global__ void lab_fill(__nv_bfloat16 *p, int64_t n, uint32_t seed, float sc) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        h ^= h >> 15;
        p[i] = __float2bfloat16(((h & 0xffff) / 65536.f - 0.5f) * sc);
    }
}

#endif
