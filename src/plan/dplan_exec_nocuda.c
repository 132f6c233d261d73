/* plan/dplan_exec_nocuda.c — a decode schedule's GPU run in a build without CUDA. */
#include "plan/dplan.h"

lm_status lm__dp_exec_enqueue(lm_decode_plan *p, lm_ctx *ctx) {
    (void)p, (void)ctx;
    return lm__error(LM_UNSUPPORTED, "lm_decode_plan_run_cuda: this build has no CUDA");
}

lm_status lm__dp_exec_finish(lm_decode_plan *p, lm_ctx *ctx) {
    (void)p, (void)ctx;
    return LM_OK;
}

void lm__dp_exec_free(lm_decode_plan *p) { (void)p; }

lm_status lm__dp_exec_profile(lm_decode_plan *p, lm_ctx *ctx, char **out) {
    (void)p, (void)ctx, (void)out;
    return lm__error(LM_UNSUPPORTED, "lm_decode_plan_profile_cuda: this build has no CUDA");
}
