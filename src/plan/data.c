/* plan/data.c — the data a simulation starts from, shared by the simulator and the
 * CPU reference so both sides start from identical numbers.
 *
 * With a caller's data source (lm_plan_sim_options.fill) every input and parameter
 * is asked for once (parameters inside a Repeat body once per iteration, named
 * "NAME#ITER") before anything runs, rounded to its dtype and kept: O(sum of their
 * elements) floats. Without one, values are generated on demand: value v at repeat
 * iteration it draws from a splitmix64 stream seeded by (seed, v, it); element i is
 * mean + std * N(0,1) (Box-Muller, cosine branch) rounded to the value's dtype; i32
 * values (RoPE positions, the only integers the tile machine reads) are the index
 * along their last axis, the positions of a prefill. O(numel) per request.
 */
#include "plan/low.h"

#include <math.h>
#include <stdio.h>

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void generate(const lm_graph *g, int v, int64_t iter, uint64_t seed, float *out) {
    const lm__gvalue *val = &g->values[v];
    const lm__gop *op = &g->ops[val->op];
    int64_t n = lm__gvalue_numel(val);
    if (val->dtype == LM_I32) {
        int64_t last = val->dims[val->ndim - 1];
        for (int64_t i = 0; i < n; i++) out[i] = (float)(i % last);
        return;
    }
    double mean = op->kind == LM__GOP_PARAM ? op->a : 0.0, std = op->b;
    uint64_t s = seed ^ ((uint64_t)(v + 1) * 0xd1b54a32d192ed03ULL) ^ ((uint64_t)(iter + 1) * 0x8cb92ba72f3d8dd7ULL);
    for (int64_t i = 0; i < n; i++) {
        double u1 = ((double)(splitmix(&s) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
        double u2 = (double)(splitmix(&s) >> 11) * (1.0 / 9007199254740992.0);
        double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        float f = (float)(mean + std * z);
        out[i] = val->dtype == LM_F16 ? lm_f16_to_f32(lm_f32_to_f16(f)) : f;
    }
}

/* Copies of value v: one per repeat iteration for a parameter declared in a body. */
static int64_t copies(const lm_graph *g, int v) {
    int r = g->values[v].region;
    return r >= 0 ? g->regions[r].count : 1;
}

/* Rounds the caller's floats to v's dtype in place; integers for i32. */
static lm_status round_given(const lm__gvalue *val, const char *name, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (val->dtype == LM_F16) {
            x[i] = lm_f16_to_f32(lm_f32_to_f16(x[i]));
        } else if (val->dtype == LM_I32 && !(x[i] == floorf(x[i]) && fabsf(x[i]) <= 16777216.0f)) {
            return lm__error(LM_INVALID_ARGUMENT,
                             "sim data source: '%s' element %lld = %g is not an i32 value carried exactly by a float "
                             "(an integer of magnitude <= 2^24)",
                             name, (long long)i, (double)x[i]);
        }
    }
    return LM_OK;
}

static lm_status ask(const lm__plan_data *d, const lm_plan_sim_options *o, int v, int64_t it, float *dst) {
    const lm__gvalue *val = &d->g->values[v];
    char name[LM__G_NAME + 24];
    if (val->region >= 0)
        snprintf(name, sizeof name, "%s#%lld", val->name, (long long)it);
    else
        snprintf(name, sizeof name, "%s", val->name);
    lm_clear_error();
    lm_status st = o->fill(o->fill_user, name, val->dtype, val->ndim, val->dims, dst);
    if (st != LM_OK) {
        if (*lm_last_error()) return lm__error_context(st, "sim data source: value '%s'", name);
        return lm__error(st, "sim data source: value '%s': the callback returned %s", name, lm_status_name(st));
    }
    return round_given(val, name, dst, lm__gvalue_numel(val));
}

lm_status lm__plan_data_init(lm__plan_data *d, const lm_graph *g, const lm_plan_sim_options *o) {
    memset(d, 0, sizeof *d);
    d->g = g;
    d->seed = o->seed;
    if (!o->fill) return LM_OK;
    d->given = lm__calloc((size_t)g->nvalues, sizeof *d->given);
    if (!d->given) return LM_OUT_OF_MEMORY;
    for (int64_t v = 0; v < g->nvalues; v++) {
        lm__gopk k = g->ops[g->values[v].op].kind;
        if (k != LM__GOP_INPUT && k != LM__GOP_PARAM) continue;
        int64_t n = lm__gvalue_numel(&g->values[v]), c = copies(g, (int)v);
        d->given[v] = lm__alloc(sizeof(float) * (size_t)(n * c), 64);
        if (!d->given[v]) {
            lm__plan_data_free(d);
            return LM_OUT_OF_MEMORY;
        }
        for (int64_t it = 0; it < c; it++) {
            lm_status st = ask(d, o, (int)v, it, d->given[v] + it * n);
            if (st != LM_OK) {
                lm__plan_data_free(d);
                return st;
            }
        }
    }
    return LM_OK;
}

void lm__plan_data_free(lm__plan_data *d) {
    if (d->given)
        for (int64_t v = 0; v < d->g->nvalues; v++) lm__free(d->given[v]);
    lm__free(d->given);
    d->given = NULL;
}

void lm__plan_data_get(const lm__plan_data *d, int v, int64_t iter, float *out) {
    if (!d->given) {
        generate(d->g, v, iter, d->seed, out);
        return;
    }
    int64_t n = lm__gvalue_numel(&d->g->values[v]);
    memcpy(out, d->given[v] + (iter % copies(d->g, v)) * n, sizeof(float) * (size_t)n);
}
