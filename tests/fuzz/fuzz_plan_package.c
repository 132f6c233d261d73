/* tests/fuzz/fuzz_plan_package.c — libFuzzer target for the executable plan package
 * loader (src/plan/package.c, `loom run-plan`): the input is a whole .lmx file. It is
 * parsed twice: as it is (the checksums guard every byte, so mutations mostly reach
 * the header and section-table checks) and with its checksums recomputed
 * (lm__plan_package_reseal), so that mutations reach the record validation, the
 * graph rebuild and the plan checker. Errors are expected and must say why. A package
 * that loads must pass lm_plan_check again, describe and report itself, re-encode
 * into a package that loads, and — when its program is small — simulate (every
 * kernel, transfer and checkpoint read inside its tile's SRAM image: ASan checks).
 * Only packages whose header declares at most 64 tiles of at most 1 MiB are given to
 * the loader, which keeps the loader's and simulator's memory within the fuzzer's
 * limits (the loader allocates per tile and per SRAM byte, as a real package of that
 * size needs). Build: the `fuzz` CMake preset. Seeds (tests/fuzz/corpus/plan_package, 9-25 KB
 * each, so run it with -max_len=32768): LOOM_PLAN_PACKAGE_SEEDS=DIR test_plan_package writes
 * them (a split-K GEMM with a reduction, a repeated MLP, RoPE + flash attention with a
 * kv-split combine, all on small4).
 */
#include "plan/low.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return (int64_t)v;
}

/* A rough count of the work a simulation would do (kernel element operations,
 * reference FLOPs, memory); 0 when it is too large to run on every input. */
static int small_enough(const lm_plan *p) {
    const lm__plan_low *low = &p->low;
    const lm_graph *g = p->g;
    double work = 0, mem = 0;
    for (int64_t t = 0; t < low->tiles; t++) mem += (double)low->peak[t];
    if (mem > 8.0 * 1048576 || lm__plan_kernel_scratch(low) > (1 << 20)) return 0;
    int64_t rep = 1;
    for (int64_t s = 0; s < low->nsteps; s++) {
        const lm__plan_step *st = &low->steps[s];
        if (st->kind == LM__PLAN_S_REPEAT) rep = st->count;
        if (st->kind == LM__PLAN_S_END) rep = 1;
        for (int64_t c = st->c0; c < st->c1; c++) {
            const lm__plan_call *call = &low->calls[c];
            double w = 0;
            for (int k = 0; k < 4; k++)
                if (call->op[k].buf >= 0) w += (double)lm__plan_opnd_elems(&call->op[k]);
            if (call->kernel == LM__PLAN_K_MATMUL) w *= (double)call->op[0].dims[2];
            if (call->kernel == LM__PLAN_K_REDUCE || call->kernel == LM__PLAN_K_FLASH_COMBINE)
                w *= (double)(call->i[0] + 1);
            work += w * (double)rep;
        }
        for (int64_t x = st->x0; x < st->x1; x++)
            work += (double)lm__plan_opnd_elems(&low->xfers[x].src) * low->xfers[x].ndst * (double)rep;
        work += (double)rep;
    }
    for (int64_t v = 0; v < g->nvalues; v++) {
        const lm__gvalue *val = &g->values[v];
        double copies = val->region >= 0 ? (double)g->regions[val->region].count : 1.0;
        mem += 4.0 * (double)lm__gvalue_numel(val) * copies;
        work += (double)lm__gvalue_numel(val) * copies;
        const lm__gop *op = &g->ops[val->op];
        if (op->kind == LM__GOP_ATTENTION) {
            const lm__gvalue *q = &g->values[op->in[0]], *k = &g->values[op->in[1]];
            work += (double)lm__gvalue_numel(q) * (double)k->dims[1] * 2 * copies;
        }
    }
    work += lm__graph_matmul_flops(g);
    return work < 2e7 && mem < 64.0 * 1048576;
}

static void exercise(const lm_plan *p) {
    if (lm_plan_check(p) != LM_OK) __builtin_trap(); /* the loader ran it already */
    char *text = NULL;
    if (lm_plan_describe(p, &text) != LM_OK) __builtin_trap();
    lm_free(text);
    lm_plan_summary s;
    if (lm_plan_get_summary(p, &s) != LM_OK) __builtin_trap();
    for (int64_t i = 0; i < lm_plan_binding_count(p); i++) {
        lm_plan_binding b;
        if (lm_plan_binding_get(p, i, &b) != LM_OK || !memchr(b.name, 0, sizeof b.name)) __builtin_trap();
    }
    uint8_t *again = NULL;
    size_t n = 0;
    if (lm__plan_package_encode(p, &again, &n) != LM_OK) __builtin_trap();
    lm_plan *q = NULL;
    if (lm_plan_package_parse(again, n, "fuzz re-encoded", NULL, &q) != LM_OK) __builtin_trap();
    lm_plan_destroy(q);
    lm__free(again);
    if (!small_enough(p)) return;
    lm_plan_sim_options o;
    lm_plan_sim_options_default(&o);
    o.threads = 1;
    lm_plan_sim *sim = NULL;
    if (lm_plan_simulate(p, &o, &sim) == LM_OK) {
        if (lm_plan_report_text(p, sim, &text) != LM_OK) __builtin_trap();
        lm_free(text);
        if (lm_plan_report_json(p, sim, &text) != LM_OK) __builtin_trap();
        lm_free(text);
        if (lm_plan_timeline_svg(p, sim, &text) != LM_OK) __builtin_trap();
        lm_free(text);
        lm_plan_sim_destroy(sim);
    }
}

static void load(const uint8_t *data, size_t size, const char *source) {
    lm_plan *p = NULL;
    if (lm_plan_package_parse(data, size, source, NULL, &p) != LM_OK) {
        if (!lm_last_error()[0]) __builtin_trap(); /* an error must say why */
        return;
    }
    exercise(p);
    lm_plan_destroy(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size >= 48 && (le64(data + 32) > 64 || le64(data + 40) > (1 << 20))) return 0;
    load(data, size, "fuzz");
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    lm__plan_package_reseal(copy, size);
    load(copy, size, "fuzz resealed");
    free(copy);
    return 0;
}
