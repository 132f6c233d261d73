/* plan/dplan_sync.cuh — the flags and counters a decode schedule's blocks wait on
 * (dplan_replay.cu, dplan_exec.cu): a poll acquires at GPU scope, a release publishes
 * everything the block did before its barrier. Included by .cu files only. */
#ifndef LOOM_PLAN_DPLAN_SYNC_CUH
#define LOOM_PLAN_DPLAN_SYNC_CUH

__device__ __forceinline__ unsigned lm__dp_ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void lm__dp_st_release(unsigned *p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void lm__dp_add_release(unsigned *p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

#endif
