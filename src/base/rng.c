/* base/rng.c — xoshiro256** (Blackman & Vigna) seeded by splitmix64: the generator
 * behind sampling, data shuffling and seeded weight initialisation. Its whole state is four
 * words, so checkpoints store it and replay the same stream. */
#include "loom/base.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void lm_rng_seed(lm_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

uint64_t lm_rng_next(lm_rng *r) {
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double lm_rng_uniform(lm_rng *r) { return (double)(lm_rng_next(r) >> 11) * 0x1.0p-53; }

double lm_rng_normal(lm_rng *r) {
    double u1 = 1.0 - lm_rng_uniform(r), u2 = lm_rng_uniform(r); /* u1 in (0, 1]: log is finite */
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t lm_rng_below(lm_rng *r, uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n; /* reject the biased tail */
    uint64_t x;
    do x = lm_rng_next(r);
    while (x >= limit);
    return x % n;
}
