/* Executable plan packages (.lmx, src/plan/package.c): for GEMMs, MLPs (one with a
 * repeat), flash and materialized attention, the attention op under a forced kv-split
 * grid and a small decoder layer (RoPE, i32 positions, SwiGLU, norms) on small4 and
 * small16, write -> load -> simulate gives bit-identical outputs, identical cycles and
 * check results, and re-encodes to the same bytes; every corruption is refused with a
 * message naming the package: truncation at many lengths, a flipped byte in each
 * section (checksums), forged records with fixed-up checksums (tile, offset, buffer,
 * slot, step and graph indices, an overlapping buffer the checker catches), wrong
 * magic and version, a package for another machine; loading and writing survive every
 * allocation failure without leaks; `loom run-plan` runs a package on seeded data and
 * on --inputs files, writes --outputs equal to the library's, and refuses bad files.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "plan_test_util.h"
#include "plan/low.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define LOOM LOOM_BINARY_DIR "/loom"

static char g_dir[256]; /* a scratch directory for this process */

static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static lm_plan_machine *machine(const char *name) {
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_preset(name, &m));
    return m;
}

static lm_plan *compile_graph(const char *what, const lm_graph *g, const char *mach, const lm_plan_options *o) {
    lm_plan_machine *m = machine(mach);
    lm_plan *p = NULL;
    lm_status st = lm_plan_compile(g, m, o, &p);
    LT_CHECK_MSG(st == LM_OK, "%s on %s: %s", what, mach, lm_last_error());
    lm_plan_machine_destroy(m);
    return p;
}

static lm_plan *compile_workload_grid(const char *mach, lm_plan_workload_kind k, int64_t a, int64_t b, int64_t c,
                                      int64_t heads, lm_dtype dt, lm_plan_attention att, const int64_t *grid) {
    lm_plan_workload w;
    plan_test_workload(&w, k, a, b, c, heads, dt);
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_plan_workload_build(&w, &g));
    lm_plan_options o;
    lm_plan_options_default(&o);
    o.attention = att;
    for (int i = 0; grid && i < 3; i++) o.gemm_grid[i] = grid[i];
    lm_plan *p = g ? compile_graph(lm_plan_workload_name(k), g, mach, &o) : NULL;
    lm_graph_destroy(g);
    return p;
}

static lm_plan *compile_workload(const char *mach, lm_plan_workload_kind k, int64_t a, int64_t b, int64_t c,
                                 int64_t heads, lm_dtype dt, lm_plan_attention att) {
    return compile_workload_grid(mach, k, a, b, c, heads, dt, att, NULL);
}

/* The attention op alone (token-major, grouped kv heads, causal) under a forced flash grid. */
static lm_plan *compile_attention_op(const char *mach, const int64_t grid[4]) {
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_graph_create(&g));
    int64_t qs[4] = {1, 32, 4, 16}, ks[4] = {1, 32, 2, 16};
    lm_graph_value q = -1, k = -1, v = -1, a = -1;
    LT_CHECK_OK(lm_graph_input(g, "q", LM_F16, 4, qs, 1, &q));
    LT_CHECK_OK(lm_graph_input(g, "k", LM_F16, 4, ks, 1, &k));
    LT_CHECK_OK(lm_graph_input(g, "v", LM_F16, 4, ks, 1, &v));
    LT_CHECK_OK(lm_graph_attention(g, "attn", q, k, v, 0.25, 1, 0, &a));
    LT_CHECK_OK(lm_graph_output(g, a));
    lm_plan_options o;
    lm_plan_options_default(&o);
    for (int i = 0; i < 4; i++) o.flash_grid[i] = grid[i];
    lm_plan *p = compile_graph("attention op", g, mach, &o);
    lm_graph_destroy(g);
    return p;
}

/* A Qwen-shaped decoder layer: RMSNorm, q/k/v with biases through permuted [out, in]
 * weights, q/k norms, RoPE at i32 positions, grouped causal attention, SwiGLU MLP. */
static lm_graph_value lin(lm_graph *g, const char *name, lm_graph_value x, int64_t in, int64_t out, int bias) {
    char nm[64];
    int64_t ws[2] = {out, in}, bs[1] = {out};
    const int perm[2] = {1, 0};
    lm_graph_value w = -1, wt = -1, y = -1, b = -1, yb = -1;
    snprintf(nm, sizeof nm, "%s.weight", name);
    LT_CHECK_OK(lm_graph_param(g, nm, LM_F16, 2, ws, 0, 1.0 / sqrt((double)in), &w));
    snprintf(nm, sizeof nm, "%s.weight_t", name);
    LT_CHECK_OK(lm_graph_permute(g, nm, w, perm, &wt));
    snprintf(nm, sizeof nm, "%s.matmul", name);
    LT_CHECK_OK(lm_graph_matmul(g, bias ? nm : name, x, wt, LM_F16, &y));
    if (!bias) return y;
    snprintf(nm, sizeof nm, "%s.bias", name);
    LT_CHECK_OK(lm_graph_param(g, nm, LM_F16, 1, bs, 0, 0.1, &b));
    LT_CHECK_OK(lm_graph_bias_add(g, name, y, b, &yb));
    return yb;
}

static lm_graph_value rms(lm_graph *g, const char *name, lm_graph_value x, int64_t n) {
    char nm[64];
    int64_t s1[1] = {n};
    lm_graph_value w = -1, y = -1;
    snprintf(nm, sizeof nm, "%s.weight", name);
    LT_CHECK_OK(lm_graph_param(g, nm, LM_F16, 1, s1, 1.0, 0.1, &w));
    LT_CHECK_OK(lm_graph_rms_norm(g, name, x, w, 1e-6, &y));
    return y;
}

static lm_plan *compile_layer(void) {
    const int64_t T = 16, H = 32, Hq = 4, Hkv = 2, D = 8, I = 64;
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_graph_create(&g));
    int64_t xs[2] = {T, H}, ps[2] = {1, T}, fs[1] = {D / 2}, q4s[4] = {1, T, Hq, D}, k4s[4] = {1, T, Hkv, D},
            as[2] = {T, Hq * D};
    lm_graph_value x = -1, pos = -1, inv = -1, q4 = -1, k4 = -1, v4 = -1, qr = -1, kr = -1, a = -1, a2 = -1, x1 = -1,
                   s = -1, y = -1;
    LT_CHECK_OK(lm_graph_input(g, "x", LM_F16, 2, xs, 1.0, &x));
    LT_CHECK_OK(lm_graph_input(g, "pos", LM_I32, 2, ps, 0, &pos));
    LT_CHECK_OK(lm_graph_param(g, "rope.inv_freq", LM_F32, 1, fs, 0.3, 0.1, &inv));
    lm_graph_value h = rms(g, "input_layernorm", x, H);
    lm_graph_value q = lin(g, "self_attn.q_proj", h, H, Hq * D, 1);
    lm_graph_value k = lin(g, "self_attn.k_proj", h, H, Hkv * D, 1);
    lm_graph_value v = lin(g, "self_attn.v_proj", h, H, Hkv * D, 1);
    LT_CHECK_OK(lm_graph_reshape(g, "q4", q, 4, q4s, &q4));
    LT_CHECK_OK(lm_graph_reshape(g, "k4", k, 4, k4s, &k4));
    LT_CHECK_OK(lm_graph_reshape(g, "v4", v, 4, k4s, &v4));
    q4 = rms(g, "self_attn.q_norm", q4, D);
    k4 = rms(g, "self_attn.k_norm", k4, D);
    LT_CHECK_OK(lm_graph_rope(g, "q_rope", q4, pos, inv, 1.0, &qr));
    LT_CHECK_OK(lm_graph_rope(g, "k_rope", k4, pos, inv, 1.0, &kr));
    LT_CHECK_OK(lm_graph_attention(g, "attn", qr, kr, v4, 1.0 / sqrt((double)D), 1, 0, &a));
    LT_CHECK_OK(lm_graph_checkpoint(g, a, "attention"));
    LT_CHECK_OK(lm_graph_reshape(g, "attn2", a, 2, as, &a2));
    lm_graph_value o = lin(g, "self_attn.o_proj", a2, Hq * D, H, 0);
    LT_CHECK_OK(lm_graph_binary(g, "x1", LM_GRAPH_ADD, x, o, &x1));
    lm_graph_value h2 = rms(g, "post_attention_layernorm", x1, H);
    lm_graph_value gt = lin(g, "mlp.gate_proj", h2, H, I, 0);
    lm_graph_value up = lin(g, "mlp.up_proj", h2, H, I, 0);
    LT_CHECK_OK(lm_graph_swiglu(g, "swiglu", gt, up, &s));
    lm_graph_value d = lin(g, "mlp.down_proj", s, I, H, 0);
    LT_CHECK_OK(lm_graph_binary(g, "y", LM_GRAPH_ADD, x1, d, &y));
    LT_CHECK_OK(lm_graph_output(g, y));
    lm_plan *p = compile_graph("decoder layer", g, "small4", NULL);
    lm_graph_destroy(g);
    return p;
}

/* ---- write -> load -> simulate ------------------------------------------------------------------------ */
static lm_plan_sim *simulate(const lm_plan *p) {
    lm_plan_sim_options so;
    lm_plan_sim_options_default(&so);
    so.threads = 2;
    so.seed = 7;
    lm_plan_sim *s = NULL;
    LT_CHECK_OK(lm_plan_simulate(p, &so, &s));
    return s;
}

static uint8_t *encode(const lm_plan *p, size_t *n) {
    uint8_t *data = NULL;
    *n = 0;
    LT_CHECK_OK(lm__plan_package_encode(p, &data, n));
    return data;
}

/* The loaded plan runs exactly like the compiled one. */
static void same_run(const char *what, const lm_plan *p, const lm_plan *q) {
    lm_plan_sim *a = simulate(p), *b = simulate(q);
    if (!a || !b) goto done;
    lm_plan_sim_summary sa, sb;
    LT_CHECK_OK(lm_plan_sim_get_summary(a, &sa));
    LT_CHECK_OK(lm_plan_sim_get_summary(b, &sb));
    LT_CHECK_MSG(sa.cycles == sb.cycles && sa.compute_cycles == sb.compute_cycles &&
                     sa.exchange_cycles == sb.exchange_cycles && sa.sync_cycles == sb.sync_cycles &&
                     sa.exchange_bytes == sb.exchange_bytes && sa.sram_peak_bytes == sb.sram_peak_bytes,
                 "%s: cycles %.0f vs %.0f", what, sa.cycles, sb.cycles);
    LT_CHECK_MSG(sa.checks == sb.checks && sb.checks >= 1 && sb.checks_failed == 0, "%s: %d/%d checks, %d failed", what,
                 sb.checks, sa.checks, sb.checks_failed);
    for (int i = 0; i < lm_plan_sim_check_count(a) && i < lm_plan_sim_check_count(b); i++) {
        lm_plan_check_result ra, rb;
        LT_CHECK_OK(lm_plan_sim_check_get(a, i, &ra));
        LT_CHECK_OK(lm_plan_sim_check_get(b, i, &rb));
        LT_CHECK_MSG(!strcmp(ra.name, rb.name) && ra.iteration == rb.iteration && ra.nmse == rb.nmse &&
                         ra.rel_abs == rb.rel_abs && ra.pass == rb.pass,
                     "%s: check %d '%s' differs", what, i, ra.name);
    }
    int outputs = 0;
    for (int64_t i = 0; i < lm_plan_binding_count(q); i++) {
        lm_plan_binding bd;
        LT_CHECK_OK(lm_plan_binding_get(q, i, &bd));
        if (bd.kind != LM_PLAN_BIND_OUTPUT) continue;
        int64_t n = 1;
        for (int d = 0; d < bd.ndim; d++) n *= bd.shape[d];
        float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
        LT_CHECK_OK(lm_plan_sim_output(a, bd.name, x, n));
        LT_CHECK_OK(lm_plan_sim_output(b, bd.name, y, n));
        LT_CHECK_MSG(!memcmp(x, y, sizeof(float) * (size_t)n), "%s: output '%s' differs", what, bd.name);
        free(x), free(y);
        outputs++;
    }
    LT_CHECK_MSG(outputs >= 1, "%s: no output bindings", what);
done:
    lm_plan_sim_destroy(a);
    lm_plan_sim_destroy(b);
}

static void round_trip(const char *what, lm_plan *p) {
    if (!p) return;
    const char *path = tmp_path("round.lmx");
    LT_CHECK_OK(lm_plan_package_write(p, path));
    lm_plan *q = NULL;
    lm_status st = lm_plan_package_load(path, lm_plan_get_machine(p), &q);
    LT_CHECK_MSG(st == LM_OK, "%s: load: %s", what, lm_last_error());
    if (q) {
        LT_CHECK_OK(lm_plan_check(q));
        lm_plan_summary a, b;
        LT_CHECK_OK(lm_plan_get_summary(p, &a));
        LT_CHECK_OK(lm_plan_get_summary(q, &b));
        LT_CHECK(!memcmp(&a, &b, sizeof a));
        char *da = NULL, *db = NULL;
        LT_CHECK_OK(lm_plan_describe(p, &da));
        LT_CHECK_OK(lm_plan_describe(q, &db));
        LT_CHECK_MSG(da && db && !strcmp(da, db), "%s: descriptions differ", what);
        lm_free(da), lm_free(db);
        LT_CHECK(lm_plan_binding_count(p) == lm_plan_binding_count(q));
        size_t na, nb;
        uint8_t *ea = encode(p, &na), *eb = encode(q, &nb);
        LT_CHECK_MSG(ea && eb && na == nb && !memcmp(ea, eb, na), "%s: the loaded plan re-encodes differently", what);
        lm__free(ea), lm__free(eb);
        same_run(what, p, q);
    }
    lm_plan_destroy(q);
    lm_plan_destroy(p);
}

static void test_round_trips_are_exact(void) {
    round_trip("gemm small16", compile_workload("small16", LM_PLAN_WL_GEMM, 64, 48, 80, 1, LM_F16, LM_PLAN_ATTN_AUTO));
    round_trip("gemm small4 f32",
               compile_workload("small4", LM_PLAN_WL_GEMM, 48, 40, 32, 1, LM_F32, LM_PLAN_ATTN_AUTO));
    round_trip("mlp small16", compile_workload("small16", LM_PLAN_WL_MLP, 64, 96, 160, 1, LM_F16, LM_PLAN_ATTN_AUTO));
    round_trip("mlp small4 f32", compile_workload("small4", LM_PLAN_WL_MLP, 24, 32, 40, 1, LM_F32, LM_PLAN_ATTN_AUTO));
    round_trip("mlp-repeat small16",
               compile_workload("small16", LM_PLAN_WL_MLP_REPEAT, 32, 64, 128, 1, LM_F16, LM_PLAN_ATTN_AUTO));
    round_trip("flash attention small16",
               compile_workload("small16", LM_PLAN_WL_ATTENTION, 48, 64, 64, 4, LM_F16, LM_PLAN_ATTN_FLASH));
    round_trip("materialized attention small16",
               compile_workload("small16", LM_PLAN_WL_ATTENTION, 48, 64, 64, 4, LM_F16, LM_PLAN_ATTN_MATERIALIZED));
    round_trip("flash attention small16 f32",
               compile_workload("small16", LM_PLAN_WL_ATTENTION, 27, 48, 48, 3, LM_F32, LM_PLAN_ATTN_FLASH));
    static const int64_t grid[4] = {4, 2, 2, 2}; /* a kv head shared by two head blocks, kv-split combine */
    round_trip("attention op, kv split", compile_attention_op("small16", grid));
    round_trip("decoder layer small4", compile_layer());
}

/* ---- corruption ------------------------------------------------------------------------------------------ */
/* Section ids and record field offsets (docs/PLAN.md section 8). */
enum {
    S_MACHINE = 1,
    S_SUMMARY,
    S_GOPS,
    S_REGIONS,
    S_CHECKS,
    S_BINDINGS,
    S_MVALS,
    S_MOPS,
    S_TILES,
    S_BUFS,
    S_BUFMAP,
    S_STEPS,
    S_CALLS,
    S_XFERS,
    S_XDST,
    S_END
};
static const char *const k_names[S_END] = {
    "",         "machine",    "summary",   "graph ops",   "graph regions", "graph checkpoints",
    "bindings", "mid values", "mid ops",   "tiles",       "buffers",       "buffer map",
    "steps",    "calls",      "transfers", "destinations"};
#define HEADER_BYTES (64 + 32 * 15 + 8)

static void put32(uint8_t *p, int64_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)((uint64_t)v >> (8 * i));
}
static void put64(uint8_t *p, int64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)((uint64_t)v >> (8 * i));
}
static int64_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return (int32_t)v;
}
static int64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return (int64_t)v;
}

/* Record i of section id (its bytes inside data), NULL when out of range. */
static uint8_t *record(uint8_t *data, size_t n, int id, int64_t i) {
    size_t off, bytes;
    int64_t count;
    if (!lm__plan_package_section(data, n, id, &off, &bytes, &count) || i < 0 || i >= count) return NULL;
    return data + off + (size_t)i * (bytes / (size_t)count);
}
static int64_t count_of(const uint8_t *data, size_t n, int id) {
    int64_t count = 0;
    lm__plan_package_section(data, n, id, NULL, NULL, &count);
    return count;
}

/* data must be refused by the loader with LM_PARSE_ERROR and a detail naming the
 * source and containing needle. */
static void refused(const char *what, const uint8_t *data, size_t n, const lm_plan_machine *expect,
                    const char *needle) {
    lm_plan *q = NULL;
    lm_status st = lm_plan_package_parse(data, n, "forged.lmx", expect, &q);
    LT_CHECK_MSG(st == LM_PARSE_ERROR, "%s: %s (%s)", what, lm_status_name(st), st ? lm_last_error() : "accepted");
    LT_CHECK_MSG(st == LM_OK ||
                     (strstr(lm_last_error(), "plan package 'forged.lmx'") && strstr(lm_last_error(), needle)),
                 "%s: detail '%s' lacks '%s'", what, lm_last_error(), needle);
    LT_CHECK(q == NULL);
    lm_plan_destroy(q);
}

/* A copy of data with one edit applied and the checksums fixed up. */
typedef void (*edit_fn)(uint8_t *data, size_t n, void *arg);
static void forged(const char *what, const uint8_t *data, size_t n, edit_fn fn, void *arg, const char *needle) {
    uint8_t *c = malloc(n);
    memcpy(c, data, n);
    fn(c, n, arg);
    lm__plan_package_reseal(c, n);
    refused(what, c, n, NULL, needle);
    free(c);
}

/* A package with section id's bytes replaced (later sections move), resealed. */
static uint8_t *replace_section(const uint8_t *data, size_t n, int id, const void *bytes, size_t len, size_t *out_n) {
    size_t off, old;
    lm__plan_package_section(data, n, id, &off, &old, NULL);
    size_t m = n - old + len;
    uint8_t *c = malloc(m);
    memcpy(c, data, off);
    memcpy(c + off, bytes, len);
    memcpy(c + off + len, data + off + old, n - off - old);
    put64(c + 16, (int64_t)m);
    put64(c + 64 + 32 * (id - 1) + 16, (int64_t)len);
    for (int k = id + 1; k < S_END; k++) {
        uint8_t *e = c + 64 + 32 * (k - 1) + 8;
        put64(e, get64(e) + (int64_t)len - (int64_t)old);
    }
    lm__plan_package_reseal(c, m);
    *out_n = m;
    return c;
}

typedef struct fedit {
    int id;
    int64_t rec;   /* record index (-1: the last) */
    int at, width; /* byte offset in the record, 4 or 8 */
    int64_t value;
    int add; /* 1: add value to the field instead of setting it */
} fedit;

static void apply(uint8_t *data, size_t n, void *arg) {
    const fedit *e = arg;
    int64_t i = e->rec >= 0 ? e->rec : count_of(data, n, e->id) - 1;
    uint8_t *r = record(data, n, e->id, i);
    if (!r) {
        lt_fail(__FILE__, __LINE__, "no record %lld in section %s", (long long)i, k_names[e->id]);
        return;
    }
    int64_t v = e->add ? (e->width == 4 ? get32(r + e->at) : get64(r + e->at)) + e->value : e->value;
    if (e->width == 4)
        put32(r + e->at, v);
    else
        put64(r + e->at, v);
}

/* The first compute step's first call, and the first transfer of an exchange step. */
static int64_t first_call_with_kernel(const lm_plan *p, int kernel) {
    for (int64_t i = 0; i < p->low.ncalls; i++)
        if (p->low.calls[i].kernel == kernel) return i;
    return 0;
}

static void test_every_corruption_is_refused(void) {
    lm_plan *p = compile_workload("small16", LM_PLAN_WL_MLP, 64, 96, 160, 1, LM_F16, LM_PLAN_ATTN_AUTO);
    if (!p) return;
    size_t n = 0;
    uint8_t *data = encode(p, &n);
    if (!data) return;
    lm_plan *q = NULL;
    LT_CHECK_OK(lm_plan_package_parse(data, n, "good.lmx", NULL, &q));
    lm_plan_destroy(q);
    const char *path = tmp_path("cut.lmx");

    /* truncated at many lengths, through the file loader (the detail names the path) */
    size_t cuts[64];
    int nc = 0;
    size_t fixed[] = {0, 1, 7, 8, 63, 64, HEADER_BYTES - 1, HEADER_BYTES, n - 1};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) cuts[nc++] = fixed[i];
    for (int id = 1; id < S_END && nc < 60; id++) {
        size_t off, bytes;
        lm__plan_package_section(data, n, id, &off, &bytes, NULL);
        cuts[nc++] = off + bytes / 2;
        if (bytes) cuts[nc++] = off + bytes - 1;
    }
    for (int i = 0; i < nc; i++) {
        LT_CHECK_OK(lm_file_write_atomic(path, data, cuts[i]));
        lm_status st = lm_plan_package_load(path, NULL, &q);
        LT_CHECK_MSG(st == LM_PARSE_ERROR && strstr(lm_last_error(), path) && strstr(lm_last_error(), "truncated"),
                     "cut at %zu of %zu: %s: %s", cuts[i], n, lm_status_name(st), lm_last_error());
        lm_plan_destroy(q);
        q = NULL;
    }
    uint8_t *longer = malloc(n + 1);
    memcpy(longer, data, n);
    longer[n] = 0;
    refused("one byte appended", longer, n + 1, NULL, "trailing bytes");
    free(longer);
    LT_CHECK_STATUS(lm_plan_package_load(tmp_path("missing.lmx"), NULL, &q), LM_IO_ERROR);
    LT_CHECK(strstr(lm_last_error(), "missing.lmx") != NULL);

    /* a flipped byte anywhere: the header's checksum or the section's */
    uint8_t *c = malloc(n);
    for (size_t at = 8; at < HEADER_BYTES; at += 37) {
        memcpy(c, data, n);
        c[at] ^= 0x10;
        char what[64];
        snprintf(what, sizeof what, "header byte %zu", at);
        refused(what, c, n, NULL, at < 16 ? "" : "header checksum mismatch");
    }
    for (int id = 1; id < S_END; id++) {
        size_t off, bytes;
        lm__plan_package_section(data, n, id, &off, &bytes, NULL);
        size_t at[3] = {off, off + bytes / 2, off + bytes - 1};
        for (int k = 0; k < 3 && bytes; k++) {
            memcpy(c, data, n);
            c[at[k]] ^= 0x01;
            char what[64], needle[64];
            snprintf(what, sizeof what, "section %s byte %zu", k_names[id], at[k] - off);
            snprintf(needle, sizeof needle, "section '%s': checksum mismatch", k_names[id]);
            refused(what, c, n, NULL, needle);
        }
    }
    memcpy(c, data, n);
    c[0] = 'P';
    refused("magic", c, n, NULL, "bad magic");
    memcpy(c, data, n);
    put32(c + 8, 2);
    lm__plan_package_reseal(c, n);
    refused("version", c, n, NULL, "format version 2");
    free(c);

    /* forged records whose checksums were fixed up: the indices and ranges are checked */
    int64_t T = p->m.tiles, mm = first_call_with_kernel(p, LM__PLAN_K_MATMUL);
    int64_t nbufs = p->low.nbufs, other_tile_buf = 0, no_op3 = 0;
    while (no_op3 < p->low.ncalls - 1 && p->low.calls[no_op3].op[3].buf >= 0) no_op3++;
    int64_t fused = 0; /* a call with a fused bias epilogue (the MLP's fc1 and fc2) */
    while (fused < p->low.ncalls - 1 && !(p->low.calls[fused].i[2] & LM__PLAN_EPI_BIAS)) fused++;
    LT_CHECK(p->low.calls[fused].i[2] & LM__PLAN_EPI_BIAS);
    while (other_tile_buf < nbufs - 1 && p->low.bufs[other_tile_buf].tile == p->low.calls[mm].tile) other_tile_buf++;
    struct {
        const char *what;
        fedit e;
        const char *needle;
    } cases[] = {
        {"call tile", {S_CALLS, 0, 0, 4, T, 0}, "tile out of range"},
        {"call kernel", {S_CALLS, 0, 4, 4, 99, 0}, "unknown kernel"},
        {"operand buffer", {S_CALLS, mm, 8, 4, nbufs, 0}, "buffer"},
        {"operand on another tile's buffer", {S_CALLS, mm, 8, 4, other_tile_buf, 0}, "lives on tile"},
        {"operand offset", {S_CALLS, mm, 8 + 16, 8, 1 << 20, 1}, "leaves buffer"},
        {"operand stride", {S_CALLS, mm, 8 + 48, 4, 1 << 16, 1}, "leaves buffer"},
        {"operand dims", {S_CALLS, mm, 8 + 24, 4, 1, 1}, "operands are not"},
        {"absent operand with a shape", {S_CALLS, no_op3, 8 + 3 * 56 + 4, 4, 7, 0}, "absent operand 3"},
        {"epilogue code", {S_CALLS, fused, 256, 8, 9, 0}, "epilogue 9"},
        {"epilogue without its bias bit", {S_CALLS, fused, 256, 8, 2, 0}, "epilogue 2"},
        {"call cycles", {S_CALLS, 0, 264, 8, 0x4090000000000000LL, 0}, "costs it"},
        {"transfer source tile", {S_XFERS, 0, 0, 4, T, 0}, "tile"},
        {"transfer slot", {S_XFERS, 0, 4, 4, 1 << 20, 0}, "slot"},
        {"transfer bytes", {S_XFERS, 0, 64, 8, 1, 1}, "bytes for its box"},
        {"transfer destinations", {S_XFERS, 0, 80, 4, 1 << 20, 0}, "destinations"},
        {"destination tile", {S_XDST, 0, 0, 4, -1, 0}, "destination tile"},
        {"destination offset", {S_XDST, 0, 8 + 16, 8, 1 << 20, 1}, "leaves buffer"},
        {"buffer offset", {S_BUFS, -1, 40, 8, 1 << 16, 1}, "buffer"},
        {"buffer tile", {S_BUFS, 0, 0, 4, T, 0}, "buffer 0"},
        {"buffer alias", {S_BUFS, 0, 8, 4, 5, 0}, "alias"},
        {"buffer map", {S_BUFMAP, 0, 4, 4, T, 0}, "buffer map entry 0"},
        {"tile peak", {S_TILES, 0, 0, 8, 1 << 20, 0}, "tile 0: peak"},
        {"mid value layout", {S_MVALS, 0, 24 + 208, 8, T, 0}, "layout"},
        {"mid value graph value", {S_MVALS, 0, 0, 4, 1 << 20, 0}, "graph value"},
        {"mid op input", {S_MOPS, 1, 12, 4, 1 << 20, 0}, "mid op 1"},
        {"step calls", {S_STEPS, -1, 16, 8, 1, 1}, "step"},
        {"step kind", {S_STEPS, 0, 0, 4, 9, 0}, "step 0"},
        {"graph op input", {S_GOPS, -1, 72, 4, 1 << 20, 0}, "graph op"},
        {"graph op shape", {S_GOPS, 0, 192, 8, 1, 1}, "graph op"},
        {"graph checkpoint value", {S_CHECKS, 0, 0, 4, 1 << 20, 0}, "checkpoint"},
        {"binding", {S_BINDINGS, 0, 8, 4, 0x41414141, 0}, "binding 0"},
        {"summary", {S_SUMMARY, 0, 72, 8, 1, 1}, "summary"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        forged(cases[i].what, data, n, apply, &cases[i].e, cases[i].needle);

    /* a buffer moved onto another one live at the same time: only the checker can tell */
    const lm__plan_low *low = &p->low;
    int tried = 0, caught = 0;
    uint8_t *moved = malloc(n);
    for (int64_t a = 0; a < low->nbufs && tried < 40; a++)
        for (int64_t b = 0; b < low->nbufs && tried < 40; b++) {
            const lm__plan_buf *x = &low->bufs[a], *y = &low->bufs[b];
            if (a == b || x->tile != y->tile || x->first < 0 || y->first < 0 || x->alias >= 0 || y->alias >= 0 ||
                x->placed || y->placed || x->offset == y->offset || x->first >= y->last || y->first >= x->last ||
                y->offset + x->bytes > low->peak[x->tile])
                continue;
            fedit e = {S_BUFS, a, 40, 8, y->offset, 0};
            memcpy(moved, data, n);
            apply(moved, n, &e);
            lm__plan_package_reseal(moved, n);
            tried++;
            if (lm_plan_package_parse(moved, n, "forged.lmx", NULL, &q) == LM_OK) { /* a benign overlap */
                lm_plan_destroy(q);
                continue;
            }
            LT_CHECK_MSG(strstr(lm_last_error(), "the plan checker refuses"), "overlap: %s", lm_last_error());
            caught++;
        }
    free(moved);
    q = NULL;
    LT_CHECK_MSG(caught >= 1, "%d of %d overlapping buffers refused", caught, tried);

    /* another machine: asked for, or forged into the machine section */
    lm_plan_machine *m4 = machine("small4"), *m16 = machine("small16"), *same = NULL;
    refused("expected small4", data, n, m4, "built for machine 'small16'");
    LT_CHECK_OK(lm_plan_machine_parse("{\"base\": \"small16\"}", "same", &same));
    LT_CHECK_OK(lm_plan_package_parse(data, n, "good.lmx", same, &q));
    lm_plan_destroy(q);
    lm_plan_machine_destroy(same);
    LT_CHECK_OK(lm_plan_machine_parse("{\"base\": \"small16\", \"mm_pass_cycles\": 100}", "slow", &same));
    refused("expected other rates", data, n, same, "mm_pass_cycles");
    char *json = NULL;
    size_t m2 = 0;
    LT_CHECK_OK(lm_plan_machine_to_json(m4, &json));
    uint8_t *other = replace_section(data, n, S_MACHINE, json, strlen(json), &m2);
    refused("small4 machine section", other, m2, NULL, "header says 16 tiles x 65536 bytes");
    put64(other + 32, 4);
    put64(other + 40, 32768);
    lm__plan_package_reseal(other, m2);
    refused("small4 machine section and header", other, m2, NULL, "section 'tiles': 16 records for 4 tiles");
    free(other);
    lm_free(json);
    LT_CHECK_OK(lm_plan_machine_to_json(same, &json)); /* same tiles and SRAM, another cost model */
    other = replace_section(data, n, S_MACHINE, json, strlen(json), &m2);
    refused("another cost model", other, m2, NULL, "costs it");
    free(other);
    lm_free(json);
    const char *loose = "{\"name\": \"small16\", \"base\": \"small16\"}";
    other = replace_section(data, n, S_MACHINE, loose, strlen(loose), &m2);
    refused("hand-written machine JSON", other, m2, NULL, "lm_plan_machine_to_json form");
    free(other);
    lm_plan_machine_destroy(same);
    lm_plan_machine_destroy(m4);
    lm_plan_machine_destroy(m16);
    lm__free(data);
    lm_plan_destroy(p);
}

/* ---- allocation failures ----------------------------------------------------------------------------- */
static void test_no_leaks_under_allocation_failure(void) {
    lm_plan *p = compile_workload("small16", LM_PLAN_WL_MLP_REPEAT, 32, 64, 128, 1, LM_F16, LM_PLAN_ATTN_AUTO);
    if (!p) return;
    const char *path = tmp_path("alloc.lmx");
    LT_CHECK_OK(lm_plan_package_write(p, path));
    lt_alloc_track(0);
    lm_plan *q = NULL;
    LT_CHECK_OK(lm_plan_package_load(path, NULL, &q));
    int64_t total = lt_alloc_count();
    lm_plan_destroy(q);
    lt_alloc_untrack();
    int failed = 0;
    for (int64_t f = 1; f <= total + 1; f++) {
        lt_alloc_track(f);
        q = NULL;
        lm_status st = lm_plan_package_load(path, NULL, &q);
        LT_CHECK_MSG(st == LM_OK || st == LM_OUT_OF_MEMORY, "load, failing allocation %lld: %s: %s", (long long)f,
                     lm_status_name(st), lm_last_error());
        LT_CHECK_MSG((st == LM_OK) == (q != NULL), "load, failing allocation %lld: status and plan disagree",
                     (long long)f);
        failed += st != LM_OK;
        lm_plan_destroy(q);
        LT_CHECK_MSG(lt_alloc_live() == 0, "load, failing allocation %lld leaked %lld", (long long)f,
                     (long long)lt_alloc_live());
        lt_alloc_untrack();
    }
    LT_CHECK_MSG(failed >= total, "%d of %lld failing allocations failed the load", failed, (long long)total);
    lt_alloc_track(0);
    LT_CHECK_OK(lm_plan_package_write(p, tmp_path("alloc2.lmx")));
    total = lt_alloc_count();
    lt_alloc_untrack();
    for (int64_t f = 1; f <= total; f++) {
        lt_alloc_track(f);
        lm_status st = lm_plan_package_write(p, tmp_path("alloc2.lmx"));
        LT_CHECK_MSG(st == LM_OK || st == LM_OUT_OF_MEMORY, "write, failing allocation %lld: %s", (long long)f,
                     lm_status_name(st));
        LT_CHECK_MSG(lt_alloc_live() == 0, "write, failing allocation %lld leaked %lld", (long long)f,
                     (long long)lt_alloc_live());
        lt_alloc_untrack();
    }
    lm_plan_destroy(p);
}

/* ---- loom run-plan ------------------------------------------------------------------------------------- */
typedef struct run_result {
    int status;
    char *out, *err; /* stdout, stderr (NUL-terminated, lm_free) */
} run_result;

static run_result run(const char *cmd) {
    char full[4096];
    const char *o = tmp_path("stdout.txt"), *e = tmp_path("stderr.txt");
    snprintf(full, sizeof full, "%s >'%s' 2>'%s'", cmd, o, e);
    run_result r = {0, NULL, NULL};
    int st = system(full);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    size_t n;
    if (lm_file_read_all(o, &r.out, &n) != LM_OK) r.out = NULL;
    if (lm_file_read_all(e, &r.err, &n) != LM_OK) r.err = NULL;
    return r;
}

static void run_free(run_result *r) {
    lm_free(r->out);
    lm_free(r->err);
}

/* The caller's data for every input and parameter binding: deterministic values in
 * the binding's dtype (positions: a permutation-like pattern of integers). */
typedef struct data_set {
    lm_plan_binding b[64];
    float *v[64]; /* [copies * numel] */
    int n;
} data_set;

static int64_t numel_of(const lm_plan_binding *b) {
    int64_t n = 1;
    for (int d = 0; d < b->ndim; d++) n *= b->shape[d];
    return n;
}

static void data_make(const lm_plan *p, data_set *ds) {
    memset(ds, 0, sizeof *ds);
    lt_rng r = lt_rng_seed(77);
    for (int64_t i = 0; i < lm_plan_binding_count(p) && ds->n < 64; i++) {
        lm_plan_binding b;
        LT_CHECK_OK(lm_plan_binding_get(p, i, &b));
        if (b.kind == LM_PLAN_BIND_OUTPUT) continue;
        int64_t n = numel_of(&b) * b.copies, last = b.shape[b.ndim - 1];
        float *v = malloc(sizeof(float) * (size_t)n);
        for (int64_t k = 0; k < n; k++) {
            double x =
                b.kind == LM_PLAN_BIND_PARAM ? 0.2 * lt_rng_normal(&r) + (b.ndim == 1 ? 0.5 : 0.0) : lt_rng_normal(&r);
            v[k] = b.dtype == LM_I32   ? (float)((k * 5 + 3) % last)
                   : b.dtype == LM_F16 ? lm_f16_to_f32(lm_f32_to_f16((float)x))
                                       : (float)x;
        }
        ds->b[ds->n] = b;
        ds->v[ds->n++] = v;
    }
}

static void data_free(data_set *ds) {
    for (int i = 0; i < ds->n; i++) free(ds->v[i]);
    ds->n = 0;
}

static lm_status data_fill(void *user, const char *name, lm_dtype dtype, int ndim, const int64_t *shape, float *dst) {
    const data_set *ds = user;
    (void)dtype, (void)ndim, (void)shape;
    for (int i = 0; i < ds->n; i++) {
        size_t len = strlen(ds->b[i].name);
        int64_t it = 0;
        if (strcmp(name, ds->b[i].name)) {
            if (strncmp(name, ds->b[i].name, len) || name[len] != '#') continue;
            it = atoll(name + len + 1);
        }
        int64_t n = numel_of(&ds->b[i]);
        memcpy(dst, ds->v[i] + it * n, sizeof(float) * (size_t)n);
        return LM_OK;
    }
    return LM_NOT_FOUND;
}

/* Writes every binding as DIR/NAME.bin (little-endian, the binding's dtype). */
static void data_write(const data_set *ds, const char *dir) {
    mkdir(dir, 0700);
    for (int i = 0; i < ds->n; i++) {
        const lm_plan_binding *b = &ds->b[i];
        int64_t n = numel_of(b) * b->copies, es = (int64_t)lm_dtype_size(b->dtype);
        uint8_t *bytes = malloc((size_t)(n * es));
        for (int64_t k = 0; k < n; k++) {
            uint32_t u;
            if (b->dtype == LM_F16)
                u = lm_f32_to_f16(ds->v[i][k]);
            else if (b->dtype == LM_I32)
                u = (uint32_t)(int32_t)ds->v[i][k];
            else
                memcpy(&u, &ds->v[i][k], 4);
            for (int j = 0; j < es; j++) bytes[k * es + j] = (uint8_t)(u >> (8 * j));
        }
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.bin", dir, b->name);
        LT_CHECK_OK(lm_file_write_atomic(path, bytes, (size_t)(n * es)));
        free(bytes);
    }
}

/* Output NAME of run directory dir as floats (NULL when unreadable or of the wrong size). */
static float *read_output(const char *dir, const lm_plan_binding *b) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.bin", dir, b->name);
    char *raw = NULL;
    size_t size = 0;
    int64_t n = numel_of(b), es = (int64_t)lm_dtype_size(b->dtype);
    if (lm_file_read_all(path, &raw, &size) != LM_OK || (int64_t)size != n * es) {
        lm_free(raw);
        return NULL;
    }
    float *v = malloc(sizeof(float) * (size_t)n);
    const uint8_t *q = (const uint8_t *)raw;
    for (int64_t k = 0; k < n; k++) {
        uint32_t u = 0;
        for (int j = 0; j < es; j++) u |= (uint32_t)q[k * es + j] << (8 * j);
        if (b->dtype == LM_F16)
            v[k] = lm_f16_to_f32((uint16_t)u);
        else
            memcpy(&v[k], &u, 4);
    }
    lm_free(raw);
    return v;
}

static void cli_case(const char *what, lm_plan *p, const char *bad_input) {
    if (!p) return;
    char pkg[600], cmd[2048], in[600], out[600];
    snprintf(pkg, sizeof pkg, "%s", tmp_path("cli.lmx"));
    snprintf(in, sizeof in, "%s", tmp_path("in"));
    snprintf(out, sizeof out, "%s", tmp_path("out"));
    LT_CHECK_OK(lm_plan_package_write(p, pkg));
    lm_plan *q = NULL;
    LT_CHECK_OK(lm_plan_package_load(pkg, NULL, &q));
    if (!q) goto done;

    /* seeded data: the cycles and checks `loom plan` would print */
    lm_plan_sim_options so;
    lm_plan_sim_options_default(&so);
    so.threads = 1;
    lm_plan_sim *s = NULL;
    LT_CHECK_OK(lm_plan_simulate(q, &so, &s));
    lm_plan_sim_summary sum = {0};
    if (s) LT_CHECK_OK(lm_plan_sim_get_summary(s, &sum));
    lm_plan_sim_destroy(s);
    snprintf(cmd, sizeof cmd, LOOM " run-plan '%s' --json --threads 1", pkg);
    run_result r = run(cmd);
    LT_CHECK_MSG(r.status == 0, "%s: exit %d: %s", what, r.status, r.err ? r.err : "");
    char want[96];
    snprintf(want, sizeof want, "\"simulation\":{\"cycles\":%.0f,", sum.cycles);
    LT_CHECK_MSG(r.out && r.out[0] == '{' && strstr(r.out, want) && strstr(r.out, "\"checks_failed\":0") &&
                     strstr(r.out, "\"inputs\":null"),
                 "%s: JSON lacks %s: %s", what, want, r.out ? r.out : "");
    run_free(&r);

    /* --inputs / --outputs: the files round trip exactly through the simulator */
    data_set ds;
    data_make(q, &ds);
    data_write(&ds, in);
    so.fill = data_fill;
    so.fill_user = &ds;
    s = NULL;
    LT_CHECK_OK(lm_plan_simulate(q, &so, &s));
    snprintf(cmd, sizeof cmd, LOOM " run-plan '%s' --inputs '%s' --outputs '%s' --threads 2", pkg, in, out);
    r = run(cmd);
    LT_CHECK_MSG(r.status == 0, "%s: exit %d: %s", what, r.status, r.err ? r.err : "");
    LT_CHECK_MSG(r.out && strstr(r.out, "loom run-plan") && strstr(r.out, "files from") &&
                     strstr(r.out, "written to") && strstr(r.out, "plan check          passed at load"),
                 "%s: %s", what, r.out ? r.out : "");
    run_free(&r);
    int outputs = 0;
    for (int64_t i = 0; s && i < lm_plan_binding_count(q); i++) {
        lm_plan_binding b;
        LT_CHECK_OK(lm_plan_binding_get(q, i, &b));
        if (b.kind != LM_PLAN_BIND_OUTPUT) continue;
        int64_t n = numel_of(&b);
        float *want_v = malloc(sizeof(float) * (size_t)n), *got = read_output(out, &b);
        LT_CHECK_OK(lm_plan_sim_output(s, b.name, want_v, n));
        LT_CHECK_MSG(got && !memcmp(got, want_v, sizeof(float) * (size_t)n), "%s: output file '%s' differs", what,
                     b.name);
        free(want_v), free(got);
        outputs++;
    }
    LT_CHECK(outputs >= 1);
    lm_plan_sim_destroy(s);

    /* bad input files: a wrong size, a missing one */
    if (bad_input) {
        char path[700];
        snprintf(path, sizeof path, "%s/%s.bin", in, bad_input);
        LT_CHECK_OK(lm_file_write_atomic(path, "abc", 3));
        snprintf(cmd, sizeof cmd, LOOM " run-plan '%s' --inputs '%s'", pkg, in);
        r = run(cmd);
        LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, path) && strstr(r.err, "has 3 bytes, expected"),
                     "%s: exit %d: %s", what, r.status, r.err ? r.err : "");
        run_free(&r);
        remove(path);
        r = run(cmd);
        LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, path), "%s: exit %d: %s", what, r.status,
                     r.err ? r.err : "");
        run_free(&r);
    }
    data_free(&ds);
done:
    lm_plan_destroy(q);
    lm_plan_destroy(p);
}

static void test_run_plan_cli(void) {
    cli_case("mlp-repeat",
             compile_workload("small16", LM_PLAN_WL_MLP_REPEAT, 32, 64, 128, 1, LM_F16, LM_PLAN_ATTN_AUTO),
             "fc1.weight");
    cli_case("decoder layer", compile_layer(), "pos");

    /* refusals: usage, a missing, corrupt or mismatched package */
    lm_plan *p = compile_workload("small16", LM_PLAN_WL_GEMM, 32, 32, 32, 1, LM_F16, LM_PLAN_ATTN_AUTO);
    if (!p) return;
    char pkg[600], cmd[1600];
    snprintf(pkg, sizeof pkg, "%s", tmp_path("gemm.lmx"));
    LT_CHECK_OK(lm_plan_package_write(p, pkg));
    run_result r = run(LOOM " run-plan");
    LT_CHECK_MSG(r.status == 2, "no package: exit %d", r.status);
    run_free(&r);
    snprintf(cmd, sizeof cmd, LOOM " run-plan '%s.missing'", pkg);
    r = run(cmd);
    LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, ".missing"), "missing: exit %d: %s", r.status, r.err);
    run_free(&r);
    snprintf(cmd, sizeof cmd, LOOM " run-plan '%s' --machine small4", pkg);
    r = run(cmd);
    LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, "built for machine 'small16'") && strstr(r.err, pkg),
                 "other machine: exit %d: %s", r.status, r.err);
    run_free(&r);
    snprintf(cmd, sizeof cmd, LOOM " run-plan '%s' --machine small16", pkg);
    r = run(cmd);
    LT_CHECK_MSG(r.status == 0, "same machine: exit %d: %s", r.status, r.err);
    run_free(&r);
    char *raw = NULL;
    size_t n = 0;
    LT_CHECK_OK(lm_file_read_all(pkg, &raw, &n));
    if (raw && n > 1000) {
        raw[n - 10] ^= 0x20;
        LT_CHECK_OK(lm_file_write_atomic(pkg, raw, n));
        snprintf(cmd, sizeof cmd, LOOM " run-plan '%s'", pkg);
        r = run(cmd);
        LT_CHECK_MSG(r.status == 1 && r.err && strstr(r.err, "checksum mismatch") && strstr(r.err, pkg),
                     "corrupt: exit %d: %s", r.status, r.err);
        run_free(&r);
    }
    lm_free(raw);
    lm_plan_destroy(p);
}

/* ---- fuzz seeds -------------------------------------------------------------------------------------------
 * LOOM_PLAN_PACKAGE_SEEDS=DIR writes the seed corpus of tests/fuzz/fuzz_plan_package.c
 * (small packages covering matmul, reduce, repeat, flash and RoPE kernels). */
static void write_seed(const char *dir, const char *name, lm_plan *p) {
    if (!p) return;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    LT_CHECK_OK(lm_plan_package_write(p, path));
    struct stat sb;
    if (stat(path, &sb) == 0) printf("seed %s: %lld bytes\n", path, (long long)sb.st_size);
    lm_plan_destroy(p);
}

static void write_seeds(const char *dir) {
    mkdir(dir, 0755);
    static const int64_t split_k[3] = {1, 2, 2}, split_mn[3] = {2, 2, 1}; /* exchanges and a reduction */
    write_seed(dir, "gemm_small4.lmx",
               compile_workload_grid("small4", LM_PLAN_WL_GEMM, 16, 24, 32, 1, LM_F16, LM_PLAN_ATTN_AUTO, split_k));
    write_seed(
        dir, "mlp_repeat_small4.lmx",
        compile_workload_grid("small4", LM_PLAN_WL_MLP_REPEAT, 8, 16, 16, 1, LM_F16, LM_PLAN_ATTN_AUTO, split_mn));
    static const int64_t grid[4] = {2, 1, 2, 1};
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_graph_create(&g));
    int64_t qs[4] = {1, 8, 2, 8}, ks[4] = {1, 8, 1, 8}, ps[2] = {1, 8}, fs[1] = {4};
    lm_graph_value q = -1, k = -1, v = -1, pos = -1, inv = -1, qr = -1, a = -1;
    LT_CHECK_OK(lm_graph_input(g, "q", LM_F16, 4, qs, 1, &q));
    LT_CHECK_OK(lm_graph_input(g, "k", LM_F16, 4, ks, 1, &k));
    LT_CHECK_OK(lm_graph_input(g, "v", LM_F16, 4, ks, 1, &v));
    LT_CHECK_OK(lm_graph_input(g, "pos", LM_I32, 2, ps, 0, &pos));
    LT_CHECK_OK(lm_graph_param(g, "inv_freq", LM_F32, 1, fs, 0.3, 0.1, &inv));
    LT_CHECK_OK(lm_graph_rope(g, "q_rope", q, pos, inv, 1.0, &qr));
    LT_CHECK_OK(lm_graph_attention(g, "attn", qr, k, v, 0.35, 1, 0, &a));
    LT_CHECK_OK(lm_graph_output(g, a));
    lm_plan_options o;
    lm_plan_options_default(&o);
    for (int i = 0; i < 4; i++) o.flash_grid[i] = grid[i];
    write_seed(dir, "rope_attention_small4.lmx", compile_graph("seed attention", g, "small4", &o));
    lm_graph_destroy(g);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/loom_test_plan_package.%d", (int)getpid());
    mkdir(g_dir, 0700);
    const char *seeds = getenv("LOOM_PLAN_PACKAGE_SEEDS");
    if (seeds && *seeds) {
        write_seeds(seeds);
        return lt_finish();
    }
    LT_RUN(test_round_trips_are_exact);
    LT_RUN(test_every_corruption_is_refused);
    LT_RUN(test_no_leaks_under_allocation_failure);
    LT_RUN(test_run_plan_cli);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return lt_finish();
}
