/* plan/data.c — deterministic input and parameter data shared by the simulator and
 * the CPU reference.
 *
 * Value v at repeat iteration it draws from a splitmix64 stream seeded by (seed, v,
 * it); element i is mean + std * N(0,1) (Box-Muller, cosine branch), rounded to the
 * value's dtype so both sides start from identical numbers. O(numel).
 */
#include "plan/low.h"

#include <math.h>

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void lm__plan_data_fill(const lm_graph *g, int v, int64_t iter, uint64_t seed, float *out) {
    const lm__gvalue *val = &g->values[v];
    const lm__gop *op = &g->ops[val->op];
    double mean = op->kind == LM__GOP_PARAM ? op->a : 0.0, std = op->b;
    uint64_t s = seed ^ ((uint64_t)(v + 1) * 0xd1b54a32d192ed03ULL) ^ ((uint64_t)(iter + 1) * 0x8cb92ba72f3d8dd7ULL);
    int64_t n = lm__gvalue_numel(val);
    for (int64_t i = 0; i < n; i++) {
        double u1 = ((double)(splitmix(&s) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
        double u2 = (double)(splitmix(&s) >> 11) * (1.0 / 9007199254740992.0);
        double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        float f = (float)(mean + std * z);
        out[i] = val->dtype == LM_F16 ? lm_f16_to_f32(lm_f32_to_f16(f)) : f;
    }
}
