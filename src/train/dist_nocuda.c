/* train/dist_nocuda.c — stands in for train/dist_cuda.c in builds without CUDA or
 * without NCCL's header: no GPU collectives; every entry point says why. */
#include "train/internal.h"

static lm_status no_nccl(void) {
    return lm__error(LM_UNSUPPORTED, "GPU collectives (NCCL) are not in this build of loom: it was built without CUDA "
                                     "or without NCCL's header nccl.h (install NCCL's development files and rebuild)");
}

lm_status lm__nccl_load(void) { return no_nccl(); }

lm_status lm__nccl_unique_id(unsigned char id[LM__NCCL_ID_BYTES]) {
    (void)id;
    return no_nccl();
}

lm_status lm__nccl_create(int nranks, int rank, const unsigned char id[LM__NCCL_ID_BYTES], lm_device dev,
                          lm__nccl **out) {
    (void)nranks, (void)rank, (void)id, (void)dev;
    *out = NULL;
    return no_nccl();
}

void lm__nccl_destroy(lm__nccl *c) { (void)c; }
int lm__nccl_version(void) { return 0; }

lm_status lm__nccl_allreduce_f32_overlapped(lm__nccl *c, lm_ctx *ctx, float *buf, int64_t n) {
    (void)c, (void)ctx, (void)buf, (void)n;
    return no_nccl();
}

lm_status lm__nccl_join(lm__nccl *c, lm_ctx *ctx) {
    (void)c, (void)ctx;
    return no_nccl();
}

lm_status lm__nccl_reduce_scatter_f32(lm__nccl *c, lm_ctx *ctx, float *buf, const int64_t *bounds) {
    (void)c, (void)ctx, (void)buf, (void)bounds;
    return no_nccl();
}

lm_status lm__nccl_allgather_f32(lm__nccl *c, lm_ctx *ctx, float *buf, const int64_t *bounds) {
    (void)c, (void)ctx, (void)buf, (void)bounds;
    return no_nccl();
}
