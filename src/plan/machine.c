/* plan/machine.c — machine descriptions: presets and the JSON loader.
 *
 * Every target fact the planner and simulator use lives in lm_plan_machine. The
 * ipu21 preset cites where each constant comes from (docs/PLAN.md has the table);
 * "assumption" marks numbers loom chose where no public figure exists. The small
 * presets keep ipu21's per-tile rates and shrink tiles/SRAM so tests run in
 * milliseconds. A JSON description starts from "base" (default ipu21) and
 * overrides fields by name; unknown keys and out-of-range values are errors.
 * Invariant: sram_bytes (what the planner may allocate) = sram_tile_bytes (the JSON
 * "sram_bytes") - sram_reserved_bytes, derived after every preset and parse.
 */
#include "plan/internal.h"

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>

/* Graphcore IPU21 (the Mk2-derived IPU of the C600 card). */
static const struct lm_plan_machine k_ipu21 = {
    .name = "ipu21",
    /* 1,472 tiles, 900 MB In-Processor-Memory = 624 KiB per tile, 6 worker threads
     * per tile (8,832 threads): Graphcore Mk2 GC200 / C600 product specifications. */
    .tiles = 1472,
    .sram_tile_bytes = 624 * 1024,
    /* Code, vertex state, control and exchange code live in the same SRAM on the real
     * machine (Poplar's "always-live" memory). No figure is published for these
     * workloads: 96 KiB (15% of the tile) is an assumption; docs/PLAN.md
     * ("Calibration") gives the predictions' sensitivity to it. */
    .sram_reserved_bytes = 96 * 1024,
    .workers = 6,
    /* 64-bit loads/stores (poplibs include/popnn/DeviceInfo.hpp dataPathWidth = 64):
     * loom keeps every buffer 8-byte aligned. */
    .align = 8,
    /* 1.5 GHz: 280 TFLOPS FP16 (C600) / (1,472 tiles x 128 FLOP/cycle) = 1.49 GHz. */
    .clock_hz = 1.5e9,
    /* AMP matrix unit: 250 TFLOPS FP16 / 62.5 TFLOPS FP32 at 1.33 GHz on 1,472
     * tiles (Mk2 GC200) = 128 and 32 FLOP/cycle/tile. */
    .mm_flops_f16 = 128.0,
    .mm_flops_f32 = 32.0,
    /* One AMP pass holds k x n weights: k = half vector width 4 x conv-unit pipeline
     * depth 4 = 16 (f16), 2 x 4 = 8 (f32) (poplibs DeviceInfo); n = 16 (f16) / 8 (f32)
     * conv units, twice Mk1's 8 / 4 to give Mk2's doubled rate (assumption). */
    .mm_k_grain_f16 = 16,
    .mm_n_grain_f16 = 16,
    .mm_k_grain_f32 = 8,
    .mm_n_grain_f32 = 8,
    /* Calibrated (docs/PLAN.md "Calibration") against measured packed-GEMM kernels on
     * IPU21 (R rows streamed x K x C, f16): R48/K240/C64 35,022 and 33,102 cycles,
     * R96/K64/C64 12,108 (R128/K64/C64 19,944 is not explained by this form: -29%).
     * The call cost is < 1% of every measured point and cannot be fitted from them:
     * it stays poplibs' ConvPartial1x1 supervisor estimate 55 + 13 + 13 = 81
     * (lib/poplin/PerformanceEstimation.hpp). The per-row cost's free fit (3.88
     * cycles) lies below the AMP's peak of 16 x 16 x 2 / 128 = 4 cycles per row, so it
     * is held at that bound; the pass cost is then the relative least-squares fit
     * over the three points, 372 (poplibs' estimate was 313). Plans streaming more
     * than the measured 48-128 rows per pass extrapolate this fit. */
    .mm_call_cycles = 81,
    .mm_pass_cycles = 372,
    .mm_row_cycles_f16 = 4.0,
    /* No f32 kernel was measured: the peak rate, 8 x 8 x 2 / 32 (assumption). */
    .mm_row_cycles_f32 = 4.0,
    /* 64-bit data path: one 8-byte load or store per cycle (memcpyBytesPerCycle =
     * dataPathWidth / 8 in poplibs); f32v2 / f16v4 vector arithmetic. */
    .vec_bytes_per_cycle = 8.0,
    .vec_flops_f16 = 4.0,
    .vec_flops_f32 = 2.0,
    /* Hardware transcendental support (IPU programmer's guide); one cycle per
     * element is an assumption. */
    .transc_cycles_per_elem = 1.0,
    /* poplibs zero-vertex estimate: 12 supervisor cycles + 6 workers x 6 setup. */
    .vec_call_cycles = 48,
    /* 8 TB/s IPU-Exchange / (1,472 tiles x 1.33 GHz) = 4.1 B/cycle; the poplibs IPU
     * model uses ipuExchangeBandwidth = 4 (include/popnn/Net.hpp). */
    .exch_bytes_per_cycle = 4.0,
    /* poplibs IPU model setGlobalSyncCycles(500) (lib/popnn/Net.cpp era tools). */
    .sync_cycles = 500,
    /* Per message: exchange instruction setup (assumption; no measured exchange
     * point to fit it to, see docs/PLAN.md "Calibration"). */
    .msg_cycles = 8,
    /* On-tile copies: bytes / the 64-bit data path (memcpyBytesPerCycle in poplibs).
     * A measured 16 x 116 f16 transposed unpack takes 10,896 cycles for 3,712 B (18,318
     * before an optimisation) where this charges 512: a rearrangement pays per
     * contiguous run (5.6 cycles each, fitted to that point), which a bytes-only model
     * cannot express without charging contiguous copies 23x too much. Not fitted:
     * docs/PLAN.md ("Calibration") gives the residual and the plans' sensitivity. */
    .copy_bytes_per_cycle = 8.0,
};

/* sram_bytes = what the planner may allocate (parse_object keeps it >= 256) */
static void derive(struct lm_plan_machine *m) { m->sram_bytes = m->sram_tile_bytes - m->sram_reserved_bytes; }

static void small_from(struct lm_plan_machine *m, const char *name, int64_t tiles, int64_t sram) {
    *m = k_ipu21;
    snprintf(m->name, sizeof m->name, "%s", name);
    m->tiles = tiles;
    m->sram_tile_bytes = sram;
    m->sram_reserved_bytes = 0; /* test machines: their SRAM sizes are chosen for the tests' shapes */
}

static lm_status preset(const char *name, struct lm_plan_machine *m) {
    if (!strcmp(name, "ipu21"))
        *m = k_ipu21;
    else if (!strcmp(name, "small16"))
        small_from(m, "small16", 16, 64 * 1024);
    else if (!strcmp(name, "small4"))
        small_from(m, "small4", 4, 32 * 1024);
    else
        return lm__error(LM_NOT_FOUND, "no machine preset named '%s' (ipu21, small16, small4)", name);
    derive(m);
    return LM_OK;
}

lm_status lm_plan_machine_preset(const char *name, lm_plan_machine **out) {
    if (!name || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_machine_preset: NULL argument");
    *out = NULL;
    struct lm_plan_machine tmp;
    LM_TRY(preset(name, &tmp));
    lm_plan_machine *m = lm__alloc(sizeof *m, 16);
    if (!m) return LM_OUT_OF_MEMORY;
    *m = tmp;
    *out = m;
    return LM_OK;
}

/* ---- JSON ------------------------------------------------------------------------------------ */
typedef struct field_desc {
    const char *key;
    int is_int;
    size_t offset;
    double lo, hi;
} field_desc;

#define FI(k, lo, hi)                                                                                                  \
    { #k, 1, offsetof(struct lm_plan_machine, k), lo, hi }
/* the JSON key "sram_bytes" is the physical size; the struct's sram_bytes is derived */
#define FI_AS(key, k, lo, hi)                                                                                          \
    { key, 1, offsetof(struct lm_plan_machine, k), lo, hi }
#define FD(k, lo, hi)                                                                                                  \
    { #k, 0, offsetof(struct lm_plan_machine, k), lo, hi }
static const field_desc k_fields[] = {
    FI(tiles, 1, 1 << 20),
    FI_AS("sram_bytes", sram_tile_bytes, 256, (double)(1LL << 34)),
    FI(sram_reserved_bytes, 0, (double)(1LL << 34)),
    FI(align, 1, 4096),
    FD(clock_hz, 1e6, 1e11),
    FI(workers, 1, 64),
    FD(mm_flops_f16, 1e-3, 1e6),
    FD(mm_flops_f32, 1e-3, 1e6),
    FI(mm_k_grain_f16, 1, 4096),
    FI(mm_n_grain_f16, 1, 4096),
    FI(mm_k_grain_f32, 1, 4096),
    FI(mm_n_grain_f32, 1, 4096),
    FI(mm_call_cycles, 0, 1e9),
    FI(mm_pass_cycles, 0, 1e9),
    FD(mm_row_cycles_f16, 0, 1e6),
    FD(mm_row_cycles_f32, 0, 1e6),
    FD(vec_bytes_per_cycle, 1e-3, 1e6),
    FD(vec_flops_f16, 1e-3, 1e6),
    FD(vec_flops_f32, 1e-3, 1e6),
    FD(transc_cycles_per_elem, 0, 1e6),
    FI(vec_call_cycles, 0, 1e9),
    FD(exch_bytes_per_cycle, 1e-3, 1e6),
    FI(sync_cycles, 0, 1e9),
    FI(msg_cycles, 0, 1e9),
    FD(copy_bytes_per_cycle, 1e-3, 1e6),
};
#define N_FIELDS ((int)(sizeof k_fields / sizeof k_fields[0]))

static lm_status set_field(struct lm_plan_machine *m, const field_desc *f, const json_t *v, const char *src) {
    if (!json_is_number(v)) return lm__error(LM_PARSE_ERROR, "machine '%s': field \"%s\" is not a number", src, f->key);
    double x = json_number_value(v);
    if (f->is_int && (!json_is_integer(v)))
        return lm__error(LM_PARSE_ERROR, "machine '%s': field \"%s\" must be an integer", src, f->key);
    if (!(x >= f->lo && x <= f->hi))
        return lm__error(LM_PARSE_ERROR, "machine '%s': field \"%s\" = %g is outside [%g, %g]", src, f->key, x, f->lo,
                         f->hi);
    char *p = (char *)m + f->offset;
    if (f->is_int)
        *(int64_t *)p = (int64_t)json_integer_value(v);
    else
        *(double *)p = x;
    return LM_OK;
}

static lm_status parse_object(const json_t *root, const char *src, struct lm_plan_machine *m) {
    const json_t *base = json_object_get(root, "base");
    if (base && !json_is_string(base))
        return lm__error(LM_PARSE_ERROR, "machine '%s': field \"base\" is not a string", src);
    lm_status st = preset(base ? json_string_value(base) : "ipu21", m);
    if (st != LM_OK) return lm__error_context(LM_PARSE_ERROR, "machine '%s': field \"base\"", src);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)root, key, v) {
        if (!strcmp(key, "base")) continue;
        if (!strcmp(key, "name")) {
            const char *nm = json_is_string(v) ? json_string_value(v) : NULL;
            int ok = nm && *nm && strlen(nm) < sizeof m->name;
            for (const char *c = nm; ok && *c; c++) ok = (unsigned char)*c >= 0x20 && *c != '"' && *c != '\\';
            if (!ok)
                return lm__error(LM_PARSE_ERROR,
                                 "machine '%s': field \"name\" must be 1..%zu printable characters without quotes", src,
                                 sizeof m->name - 1);
            snprintf(m->name, sizeof m->name, "%s", nm);
            continue;
        }
        int found = 0;
        for (int i = 0; i < N_FIELDS && !found; i++)
            if (!strcmp(key, k_fields[i].key)) {
                LM_TRY(set_field(m, &k_fields[i], v, src));
                found = 1;
            }
        if (!found) return lm__error(LM_PARSE_ERROR, "machine '%s': unknown field \"%s\"", src, key);
    }
    if (m->align & (m->align - 1))
        return lm__error(LM_PARSE_ERROR, "machine '%s': field \"align\" = %lld is not a power of two", src,
                         (long long)m->align);
    if (m->sram_tile_bytes % m->align)
        return lm__error(LM_PARSE_ERROR, "machine '%s': sram_bytes %lld is not a multiple of align %lld", src,
                         (long long)m->sram_tile_bytes, (long long)m->align);
    if (m->sram_reserved_bytes % m->align)
        return lm__error(LM_PARSE_ERROR, "machine '%s': sram_reserved_bytes %lld is not a multiple of align %lld", src,
                         (long long)m->sram_reserved_bytes, (long long)m->align);
    if (m->sram_tile_bytes - m->sram_reserved_bytes < 256)
        return lm__error(LM_PARSE_ERROR,
                         "machine '%s': sram_reserved_bytes %lld leaves less than 256 bytes of sram_bytes %lld for data",
                         src, (long long)m->sram_reserved_bytes, (long long)m->sram_tile_bytes);
    derive(m);
    return LM_OK;
}

lm_status lm_plan_machine_parse(const char *json, const char *source, lm_plan_machine **out) {
    if (!json || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_machine_parse: NULL argument");
    *out = NULL;
    const char *src = source ? source : "<string>";
    json_error_t err;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return lm__error(LM_PARSE_ERROR, "machine '%s': invalid JSON at line %d column %d: %s", src, err.line,
                         err.column, err.text);
    lm_status st = LM_OK;
    struct lm_plan_machine tmp;
    if (!json_is_object(root))
        st = lm__error(LM_PARSE_ERROR, "machine '%s': the top level is not an object", src);
    else
        st = parse_object(root, src, &tmp);
    json_decref(root);
    if (st != LM_OK) return st;
    lm_plan_machine *m = lm__alloc(sizeof *m, 16);
    if (!m) return LM_OUT_OF_MEMORY;
    *m = tmp;
    *out = m;
    return LM_OK;
}

lm_status lm_plan_machine_load(const char *path, lm_plan_machine **out) {
    if (!path || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_machine_load: NULL argument");
    *out = NULL;
    char *text = NULL;
    LM_TRY(lm_file_read_all(path, &text, NULL));
    lm_status st = lm_plan_machine_parse(text, path, out);
    lm_free(text);
    return st;
}

void lm_plan_machine_destroy(lm_plan_machine *m) { lm__free(m); }
const char *lm_plan_machine_name(const lm_plan_machine *m) { return m ? m->name : ""; }
int64_t lm_plan_machine_tiles(const lm_plan_machine *m) { return m ? m->tiles : 0; }
int64_t lm_plan_machine_sram_bytes(const lm_plan_machine *m) { return m ? m->sram_tile_bytes : 0; }
double lm_plan_machine_clock_hz(const lm_plan_machine *m) { return m ? m->clock_hz : 0; }

double lm_plan_machine_matmul_flops(const lm_plan_machine *m, lm_dtype dt) {
    if (!m) return 0;
    return dt == LM_F16 ? m->mm_flops_f16 : dt == LM_F32 ? m->mm_flops_f32 : 0;
}

lm_status lm_plan_machine_to_json(const lm_plan_machine *m, char **out) {
    if (!m || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_machine_to_json: NULL argument");
    *out = NULL;
    lm__plan_sbuf b = {0};
    lm__plan_sbuf_printf(&b, "{\"name\":\"%s\"", m->name);
    for (int i = 0; i < N_FIELDS; i++) {
        const char *p = (const char *)m + k_fields[i].offset;
        if (k_fields[i].is_int)
            lm__plan_sbuf_printf(&b, ",\"%s\":%lld", k_fields[i].key, (long long)*(const int64_t *)p);
        else
            lm__plan_sbuf_printf(&b, ",\"%s\":%.17g", k_fields[i].key, *(const double *)p);
    }
    lm__plan_sbuf_printf(&b, "}");
    return lm__plan_sbuf_finish(&b, out);
}
