/* plan/dplan_replay_nocuda.c — the schedule skeleton's launcher in a build without CUDA. */
#include "plan/dplan_replay.h"

lm_status lm__dp_replay_cuda(const lm__dp_replay *r, double *mean_us, double *min_us) {
    (void)r, (void)mean_us, (void)min_us;
    return lm__error(LM_UNSUPPORTED, "decode plan replay: this build has no CUDA");
}
