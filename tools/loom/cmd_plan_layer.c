/* tools/loom/cmd_plan_layer.c — `loom plan layer --model DIR`: one decoder layer of
 * a real Hugging Face checkpoint through the tile compiler.
 *
 * The layer comes from the engine's one decoder builder (layer mode, f16 values,
 * the RoPE table in f32): the same description the CPU, CUDA and autograd executors
 * run. It is planned for the tile machine, the plan is checked (lm_plan_check, before
 * anything runs; --no-check skips it; its verdict and time are reported), simulated
 * with the checkpoint's weights rounded to f16 and an input of real embedding rows
 * (token ids from --seed), and the simulated output is compared with
 * the CPU executor running the same layer in f32 on the same (f16-rounded) weights
 * and input. Gate: NMSE <= 1e-4 and max |d| <= 2% of max |y| (the simulation stores
 * every activation in f16, the CPU keeps them in f32: ~1e-6 NMSE is expected).
 * --timeline FILE.html writes the per-tile timeline page (another name: the per-phase SVG).
 * Exit status: 0 when the plan, the simulator's own checks and the CPU comparison
 * pass; 1 otherwise; 2 for usage errors.
 */
#include "args.h"
#include "commands.h"
#include "common.h"
#include "loom/io_write.h"
#include "loom/plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct layer_data {
    lm_checkpoint *ck;
    const lm_model_config *c;
    int64_t T;
    float *hidden;   /* [T, H] the layer's input (f16-rounded embedding rows) */
    float *inv_freq; /* [head_dim / 2] */
    lm_tensor **f32; /* [nkeep] f32 copies of the f16-rounded weights, for the CPU executor */
    int nkeep, cap_keep;
} layer_data;

static float round_f16(float v) { return lm_f16_to_f32(lm_f32_to_f16(v)); }

/* The checkpoint tensor `name` as f16-rounded floats [n] (a new malloc'd array). */
static lm_status read_weight(const layer_data *d, const char *name, float **out, int64_t *n) {
    lm_tensor *t = NULL;
    lm_status st = lm_checkpoint_tensor(d->ck, name, &t);
    if (st != LM_OK) return st;
    *n = lm_tensor_numel(t);
    float *v = malloc(sizeof(float) * (size_t)*n);
    const void *src = lm_tensor_data(t);
    lm_dtype dt = lm_tensor_dtype(t);
    for (int64_t i = 0; v && i < *n; i++) {
        float x = dt == LM_F32 ? ((const float *)src)[i]
                  : dt == LM_BF16 ? lm_bf16_to_f32(((const uint16_t *)src)[i])
                                  : lm_f16_to_f32(((const uint16_t *)src)[i]);
        v[i] = round_f16(x);
    }
    lm_tensor_destroy(t);
    if (!v) return LM_OUT_OF_MEMORY;
    *out = v;
    return LM_OK;
}

/* The simulator's data source: inputs and parameters by graph name. */
static lm_status fill(void *user, const char *name, lm_dtype dtype, int ndim, const int64_t *shape, float *dst) {
    const layer_data *d = user;
    (void)dtype;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    if (!strcmp(name, "hidden")) {
        memcpy(dst, d->hidden, sizeof(float) * (size_t)n);
        return LM_OK;
    }
    if (!strcmp(name, "positions")) {
        for (int64_t i = 0; i < n; i++) dst[i] = (float)i;
        return LM_OK;
    }
    if (!strcmp(name, "rope.inv_freq")) {
        memcpy(dst, d->inv_freq, sizeof(float) * (size_t)n);
        return LM_OK;
    }
    float *w = NULL;
    int64_t have = 0;
    lm_status st = read_weight(d, name, &w, &have);
    if (st != LM_OK) return st;
    if (have != n) {
        free(w);
        return LM_SHAPE_MISMATCH;
    }
    memcpy(dst, w, sizeof(float) * (size_t)n);
    free(w);
    return LM_OK;
}

/* The CPU executor's parameters: f32 tensors of the same f16-rounded values. */
static lm_status bind_param(void *user, const char *name, lm_tensor_view *out) {
    layer_data *d = user;
    int64_t shape[2] = {0, 0}, n = 0;
    int ndim = 1;
    float *w = NULL;
    if (!strcmp(name, "rope.inv_freq")) {
        shape[0] = d->c->head_dim / 2;
    } else {
        lm_tensor *t = NULL;
        lm_status st = lm_checkpoint_tensor(d->ck, name, &t);
        if (st != LM_OK) return st;
        ndim = lm_tensor_ndim(t);
        for (int i = 0; i < ndim; i++) shape[i] = lm_tensor_dim(t, i);
        lm_tensor_destroy(t);
        if ((st = read_weight(d, name, &w, &n)) != LM_OK) return st;
    }
    lm_tensor *t = NULL;
    if (d->nkeep >= d->cap_keep) {
        free(w);
        fprintf(stderr, "loom plan layer: more parameters than the %d expected (at '%s')\n", d->cap_keep, name);
        return LM_OUT_OF_RANGE;
    }
    lm_status st = lm_tensor_from_host(lm_device_cpu(), LM_F32, ndim, shape, w ? w : d->inv_freq, &t);
    free(w);
    if (st != LM_OK) return st;
    d->f32[d->nkeep++] = t;
    *out = *lm_tensor_as_view(t);
    return LM_OK;
}

static int prepare(layer_data *d, const char *dir, uint64_t seed) {
    const lm_model_config *c = d->c;
    int64_t H = c->hidden_size, half = c->head_dim / 2;
    lm_status st = lm_checkpoint_open(dir, &d->ck);
    if (st != LM_OK) return cli_fail("plan layer", "checkpoint", st);
    float *emb = NULL;
    int64_t n = 0;
    if ((st = read_weight(d, "model.embed_tokens.weight", &emb, &n)) != LM_OK) return cli_fail("plan layer", "embedding", st);
    d->hidden = malloc(sizeof(float) * (size_t)(d->T * H));
    d->inv_freq = malloc(sizeof(float) * (size_t)half);
    double *freq = malloc(sizeof(double) * (size_t)half), factor = 1;
    int64_t cap = 4 * c->num_hidden_layers * 8 + 8;
    d->f32 = calloc((size_t)cap, sizeof *d->f32);
    d->cap_keep = (int)cap;
    if (!d->hidden || !d->inv_freq || !freq || !d->f32) {
        free(emb), free(freq);
        return cli_fail("plan layer", "memory", LM_OUT_OF_MEMORY);
    }
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t t = 0; t < d->T; t++) { /* rows of the embedding table at seeded token ids */
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int64_t id = (int64_t)((s >> 33) % (uint64_t)c->vocab_size);
        memcpy(d->hidden + t * H, emb + id * H, sizeof(float) * (size_t)H);
    }
    st = lm_model_config_rope(c, freq, &factor);
    for (int64_t i = 0; st == LM_OK && i < half; i++) d->inv_freq[i] = (float)freq[i];
    free(emb), free(freq);
    if (st != LM_OK) return cli_fail("plan layer", "rope", st);
    return 0;
}

static void release(layer_data *d) {
    for (int i = 0; i < d->nkeep; i++) lm_tensor_destroy(d->f32[i]);
    free(d->f32), free(d->hidden), free(d->inv_freq);
    lm_checkpoint_close(d->ck);
}

static lm_status build(const lm_model_config *c, int64_t layer, int64_t T, lm_dtype dt, lm_graph **g) {
    lm_decoder_options o;
    lm_decoder_options_default(&o);
    o.mode = LM_DECODER_LAYER;
    o.layer = layer, o.batch = 1, o.tokens = T;
    o.act_dtype = o.matrix_dtype = o.vector_dtype = dt;
    return lm_graph_build_decoder(c, &o, g);
}

/* The same layer on the CPU executor in f32: y [T, H]. */
static int cpu_layer(layer_data *d, int64_t layer, float *y) {
    lm_ctx *ctx = NULL;
    lm_graph *g = NULL;
    lm_exec *e = NULL;
    int64_t hs[2] = {d->T, d->c->hidden_size}, ps[2] = {1, d->T};
    lm_tensor *x = NULL, *pos = NULL;
    int32_t *p = malloc(sizeof(int32_t) * (size_t)d->T);
    for (int64_t t = 0; p && t < d->T; t++) p[t] = (int32_t)t;
    lm_status st = p ? lm_ctx_create(lm_device_cpu(), 0, &ctx) : LM_OUT_OF_MEMORY;
    if (st == LM_OK) st = build(d->c, layer, d->T, LM_F32, &g);
    if (st == LM_OK) st = lm_exec_create(ctx, g, NULL, &e);
    if (st == LM_OK) st = lm_exec_bind_params(e, bind_param, d);
    if (st == LM_OK) st = lm_tensor_from_host(lm_device_cpu(), LM_F32, 2, hs, d->hidden, &x);
    if (st == LM_OK) st = lm_tensor_from_host(lm_device_cpu(), LM_I32, 2, ps, p, &pos);
    if (st == LM_OK) st = lm_exec_bind(e, "hidden", lm_tensor_as_view(x));
    if (st == LM_OK) st = lm_exec_bind(e, "positions", lm_tensor_as_view(pos));
    if (st == LM_OK) st = lm_exec_run(e, ctx);
    lm_tensor_view out;
    if (st == LM_OK) st = lm_exec_output(e, 0, &out);
    if (st == LM_OK) st = lm_tensor_view_read(ctx, &out, y);
    lm_exec_destroy(e);
    lm_graph_destroy(g);
    lm_tensor_destroy(x);
    lm_tensor_destroy(pos);
    lm_ctx_destroy(ctx);
    free(p);
    return st == LM_OK ? 0 : cli_fail("plan layer", "CPU executor", st);
}

static void compare(const float *got, const float *want, int64_t n, double *nmse, double *rel) {
    double num = 0, den = 0, md = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        double dd = (double)got[i] - want[i];
        num += dd * dd, den += (double)want[i] * want[i];
        if (!(fabs(dd) <= md)) md = fabs(dd);
        mx = fmax(mx, fabs(want[i]));
    }
    *nmse = num / (den > 0 ? den : 1);
    *rel = md / (mx > 0 ? mx : 1);
}

int cmd_plan_layer(int argc, char **argv) {
    const char *model = NULL, *machine_name = "ipu21", *timeline = NULL;
    int tokens = 128, layer = 0, beam = 8, threads = 0, json = 0, no_check = 0;
    uint64_t seed = 1;
    const cli_opt opts[] = {
        {"model", CLI_STRING, &model, "DIR: a Hugging Face model directory (config.json + safetensors)"},
        {"machine", CLI_STRING, &machine_name, "NAME|FILE: ipu21, small16, small4 or a machine JSON file (default ipu21)"},
        {"json", CLI_FLAG, &json, "print one JSON object instead of text"},
        {"no-check", CLI_FLAG, &no_check, "skip the independent plan checker (SRAM ownership, exchange hazards)"},
        {"layer", CLI_INT, &layer, "N: which decoder layer (default 0)"},
        {"tokens", CLI_INT, &tokens, "T: tokens through the layer (default 128)"},
        {"beam", CLI_INT, &beam, "N: beam width of the plan search (default 8)"},
        {"threads", CLI_INT, &threads, "N: simulator threads (default: all CPUs)"},
        {"seed", CLI_U64, &seed, "N: seed of the input's token ids (default 1)"},
        {"timeline", CLI_STRING, &timeline, "FILE: FILE.html writes the per-tile timeline page, other names the "
                                            "per-phase SVG"},
        {NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos;
    int rc = cli_parse("plan layer", "--model DIR [options]", opts, argc, argv, pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (!model || tokens < 1 || tokens > 65536 || layer < 0 || beam < 1) {
        fprintf(stderr, "loom plan layer: needs --model DIR, --tokens in [1, 65536], --layer >= 0, --beam >= 1\n");
        return 2;
    }
    lm_model_config cfg;
    lm_status st = lm_model_config_load(model, &cfg);
    if (st != LM_OK) return cli_fail("plan layer", "config", st);
    if (layer >= cfg.num_hidden_layers) {
        fprintf(stderr, "loom plan layer: --layer %d but the model has %lld layers\n", layer, (long long)cfg.num_hidden_layers);
        return 2;
    }
    layer_data d = {NULL, &cfg, tokens, NULL, NULL, NULL, 0, 0};
    lm_plan_machine *m = NULL;
    lm_graph *g = NULL;
    lm_plan *p = NULL;
    lm_plan_sim *sim = NULL;
    char *text = NULL;
    int64_t n = (int64_t)tokens * cfg.hidden_size;
    float *ysim = malloc(sizeof(float) * (size_t)n), *ycpu = malloc(sizeof(float) * (size_t)n);
    rc = !ysim || !ycpu ? cli_fail("plan layer", "memory", LM_OUT_OF_MEMORY) : prepare(&d, model, seed);
    if (!rc && (st = lm_plan_machine_preset(machine_name, &m)) == LM_NOT_FOUND) st = lm_plan_machine_load(machine_name, &m);
    if (!rc && st != LM_OK) rc = cli_fail("plan layer", "machine", st);
    if (!rc && (st = build(&cfg, layer, tokens, LM_F16, &g)) != LM_OK) rc = cli_fail("plan layer", "graph", st);
    lm_plan_options o;
    lm_plan_options_default(&o);
    o.beam_width = beam;
    if (!rc && (st = lm_plan_compile(g, m, &o, &p)) != LM_OK) rc = cli_fail("plan layer", "compile", st);
    double check_s = 0;
    if (!rc && !no_check) {
        double t0 = cli_now();
        if ((st = lm_plan_check(p)) != LM_OK) rc = cli_fail("plan layer", "plan check", st);
        check_s = cli_now() - t0;
    }
    lm_plan_summary ps = {0};
    if (p) lm_plan_get_summary(p, &ps);
    char check_json[160];
    if (no_check)
        snprintf(check_json, sizeof check_json, "{\"ran\":false}");
    else
        snprintf(check_json, sizeof check_json,
                 "{\"ran\":true,\"passed\":true,\"kernel_calls\":%lld,\"transfers\":%lld,\"seconds\":%.4f}",
                 (long long)ps.kernel_calls, (long long)ps.transfers, check_s);
    lm_plan_sim_options so;
    lm_plan_sim_options_default(&so);
    so.threads = threads, so.fill = fill, so.fill_user = &d;
    if (!rc && (st = lm_plan_simulate(p, &so, &sim)) != LM_OK) rc = cli_fail("plan layer", "simulate", st);
    char out_name[64]; /* the builder's name of the layer's result */
    snprintf(out_name, sizeof out_name, "layers.%d.mlp_residual", layer);
    if (!rc && (st = lm_plan_sim_output(sim, out_name, ysim, n)) != LM_OK) rc = cli_fail("plan layer", "output", st);
    if (!rc) rc = cpu_layer(&d, layer, ycpu);
    double nmse = INFINITY, rel = INFINITY;
    if (!rc) compare(ysim, ycpu, n, &nmse, &rel);
    int agree = nmse <= 1e-4 && rel <= 2e-2;
    lm_plan_sim_summary ss = {0};
    if (sim) lm_plan_sim_get_summary(sim, &ss);
    if (!rc && json) {
        if ((st = lm_plan_report_json(p, sim, &text)) != LM_OK) rc = cli_fail("plan layer", "report", st);
        else
            printf("{\"workload\":\"layer\",\"model\":\"%s\",\"arch\":\"%s\",\"layer\":%d,\"tokens\":%d,"
                   "\"cpu_nmse\":%.3g,\"cpu_max_rel\":%.3g,\"cpu_agrees\":%s,\"plan_check\":%s,\"plan\":%s}\n",
                   model, lm_arch_name(cfg.arch), layer, tokens, nmse, rel, agree ? "true" : "false", check_json, text);
    } else if (!rc) {
        if ((st = lm_plan_report_text(p, sim, &text)) != LM_OK) rc = cli_fail("plan layer", "report", st);
        else {
            printf("loom plan layer %d of %s (%s, hidden %lld, %lld/%lld heads x %lld, MLP %lld%s) x %d tokens on %s "
                   "(%lld tiles)\n", layer, model, lm_arch_name(cfg.arch), (long long)cfg.hidden_size,
                   (long long)cfg.num_attention_heads, (long long)cfg.num_key_value_heads, (long long)cfg.head_dim,
                   (long long)cfg.intermediate_size,
                   lm_model_config_layer_window(&cfg, layer) ? ", sliding window" : "", tokens,
                   lm_plan_machine_name(m), (long long)lm_plan_machine_tiles(m));
            fputs(text, stdout);
            if (no_check)
                printf("plan check          skipped (--no-check)\n");
            else
                printf("plan check          passed (%lld kernel calls, %lld transfers: SRAM ownership and bounds, "
                       "slots, exchange hazards) in %.3f s\n",
                       (long long)ps.kernel_calls, (long long)ps.transfers, check_s);
            printf("CPU executor        NMSE %.3g, max |d| %.3g of max |y| (gate 1e-4, 2e-2): %s\n", nmse, rel,
                   agree ? "agrees" : "DISAGREES");
        }
    }
    if (!rc && timeline) {
        const char *dot = strrchr(timeline, '.');
        int html = dot && (!strcmp(dot, ".html") || !strcmp(dot, ".htm"));
        lm_free(text);
        text = NULL;
        if ((st = html ? lm_plan_timeline_html(p, sim, &text) : lm_plan_timeline_svg(p, sim, &text)) != LM_OK)
            rc = cli_fail("plan layer", "timeline", st);
        else if ((st = lm_file_write_atomic(timeline, text, strlen(text))) != LM_OK)
            rc = cli_fail("plan layer", timeline, st);
    }
    if (!rc && (!agree || ss.checks_failed)) {
        fprintf(stderr, "loom plan layer: %s\n", ss.checks_failed ? "simulator checks failed" : "the CPU executor disagrees");
        rc = 1;
    }
    lm_free(text);
    lm_plan_sim_destroy(sim);
    lm_plan_destroy(p);
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
    release(&d);
    free(ysim), free(ycpu);
    return rc;
}
