/* tools/loom/cmd_plan.c — `loom plan WORKLOAD`: compile a workload for a tile machine,
 * run the independent plan checker on it (lm_plan_check: SRAM ownership and bounds,
 * exchange slots and hazards; --no-check skips it), simulate it with real data and
 * report predicted/simulated cycles, the compute lower bound, published figures, SRAM
 * use, planning time/memory, the checker's verdict and time, and the numerical check;
 * -o FILE.lmx writes the checked plan as an executable package (`loom run-plan`);
 * --timeline FILE.html the per-tile timeline page (lm_plan_timeline_html), another
 * name the per-phase SVG.
 * The checker runs before the simulator so a malformed program is refused with the
 * checker's message instead of being executed. Workloads: gemm M N K | mlp |
 * attention | mlp-repeat N | mlp-nobias | attention-qkv | encoder-layer | encoder-stack N; `plan layer` (a
 * decoder layer of a real checkpoint) lives in cmd_plan_layer.c, `plan decode` (a decode step as a
 * schedule for a GPU's SMs) in cmd_plan_decode.c.
 * Exit status: 0 plan ok (and checks passed), 1 failure (incl. a failed plan check),
 * 2 usage error.
 */
#include "args.h"
#include "commands.h"
#include "common.h"
#include "loom/io_write.h"
#include "loom/plan.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static int parse_size(const char *what, const char *s, int64_t *out) {
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (!end || *end || end == s || v < 1 || v > (1LL << 20)) {
        fprintf(stderr, "loom plan: %s '%s' is not an integer in [1, 1048576]\n", what, s);
        return 2;
    }
    *out = v;
    return 0;
}

static int load_machine(const char *name, lm_plan_machine **m) {
    lm_status st = lm_plan_machine_preset(name, m);
    if (st == LM_NOT_FOUND) st = lm_plan_machine_load(name, m);
    if (st != LM_OK) return cli_fail("plan", "machine", st);
    return 0;
}

/* Published IPU21 C600 cycles for the SigLIP workloads and GEMM 4096^3, 0 if none.
 * The published MLP has no biases and the published attention three projections
 * (Q/K/V, no output projection): mlp-nobias and attention-qkv are those workloads;
 * for mlp and attention the figure is shown with a note that it is another workload
 * (docs/PLAN.md, "Calibration"). */
static double published(const lm_plan_workload *w, const lm_plan_workload *d, lm_plan_attention att, int ipu21,
                        const char **what) {
    *what = "";
    if (!ipu21 || w->dtype != LM_F16) return 0;
    int sig = w->tokens == d->tokens && w->width == d->width && w->hidden == d->hidden && w->heads == d->heads;
    if (w->kind == LM_PLAN_WL_GEMM && w->m == 4096 && w->n == 4096 && w->k == 4096) return 2262696;
    if (w->kind == LM_PLAN_WL_MLP_NOBIAS && sig) return 172236;
    if (w->kind == LM_PLAN_WL_MLP && sig) {
        *what = " (of the MLP without biases: compare `loom plan mlp-nobias`)";
        return 172236;
    }
    int mat = att == LM_PLAN_ATTN_MATERIALIZED;
    if (w->kind == LM_PLAN_WL_ATTENTION_QKV && sig) {
        *what = mat ? " (materialized)" : " (flash)";
        return mat ? 320256 : 355320;
    }
    if (w->kind == LM_PLAN_WL_ATTENTION && sig) {
        *what = mat ? " (materialized, of attention with Q/K/V projections only: compare `loom plan attention-qkv`)"
                    : " (flash, of attention with Q/K/V projections only: compare `loom plan attention-qkv`)";
        return mat ? 320256 : 355320;
    }
    return 0;
}

/* Written atomically (a temporary sibling, then rename). */
static int write_file(const char *path, const char *text) {
    lm_status st = lm_file_write_atomic(path, text, strlen(text));
    return st == LM_OK ? 0 : cli_fail("plan", path, st);
}

/* FILE.html (or .htm): the per-tile HTML timeline; any other name: the per-phase SVG. */
static int is_html(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot && (!strcmp(dot, ".html") || !strcmp(dot, ".htm"));
}

static int64_t max_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (int64_t)ru.ru_maxrss * 1024;
}

int cmd_plan(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "layer")) return cmd_plan_layer(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "decode")) return cmd_plan_decode(argc - 1, argv + 1);
    const char *machine = "ipu21", *strategy = "auto", *grid = NULL, *partials = "f32", *dtype = "f16";
    const char *timeline = NULL, *package = NULL;
    int beam = 8, exhaustive = 0, json = 0, no_sim = 0, threads = 0, tokens = 0, width = 0, hidden = 0, heads = 0;
    int cands = 48, no_check = 0;
    uint64_t seed = 1;
    const cli_opt opts[] = {
        {"machine", CLI_STRING, &machine, "NAME|FILE: ipu21, small16, small4 or a machine JSON file (default ipu21)"},
        {"strategy", CLI_STRING, &strategy, "S: attention strategy auto, flash or materialized (default auto)"},
        {"gemm-grid", CLI_STRING, &grid, "MxNxK: force every matmul's M,N,K tile split (0 = free)"},
        {"partials", CLI_STRING, &partials, "T: dtype of cross-tile partial sums, f32 (default) or f16"},
        {"dtype", CLI_STRING, &dtype, "T: workload dtype f16 (default) or f32"},
        {"beam", CLI_INT, &beam, "N: beam width of the plan search (default 8)"},
        {"candidates", CLI_INT, &cands, "N: matmul partitions kept per op (default 48)"},
        {"exhaustive", CLI_FLAG, &exhaustive, "search every combination (small graphs only)"},
        {"tokens", CLI_INT, &tokens, "N: sequence length of mlp/attention (default 729)"},
        {"width", CLI_INT, &width, "N: model width (default 1152)"},
        {"hidden", CLI_INT, &hidden, "N: MLP hidden size (default 4304)"},
        {"heads", CLI_INT, &heads, "N: attention heads (default 16)"},
        {"no-sim", CLI_FLAG, &no_sim, "plan only: skip the simulation and numerical check"},
        {"no-check", CLI_FLAG, &no_check, "skip the independent plan checker (SRAM ownership, exchange hazards)"},
        {"threads", CLI_INT, &threads, "N: simulator threads (default: all CPUs)"},
        {"seed", CLI_U64, &seed, "N: data seed (default 1)"},
        {"json", CLI_FLAG, &json, "print one JSON object instead of text"},
        {"timeline", CLI_STRING, &timeline,
         "FILE: FILE.html writes the per-tile timeline page (with --no-sim: the predicted schedule); other names "
         "the simulated per-phase SVG"},
        {"out", CLI_STRING, &package, "FILE.lmx: write the plan as an executable package for `loom run-plan` (also -o)"},
        {NULL, 0, NULL, NULL}};
    const char *pos[4];
    int npos;
    const char *syn = "gemm M N K | mlp | attention | mlp-repeat N | mlp-nobias | attention-qkv | encoder-layer | "
                      "encoder-stack N  [options]   (or: plan "
                      "layer --model DIR ...)";
    int rc = cli_parse("plan", syn, opts, argc, argv, pos, 4, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    lm_plan_workload w, d;
    if (npos < 1) {
        cli_usage(stderr, "plan", syn, opts);
        return 2;
    }
    const char *kind = pos[0];
    lm_plan_workload_kind k;
    int want = 1;
    if (!strcmp(kind, "gemm"))
        k = LM_PLAN_WL_GEMM, want = 4;
    else if (!strcmp(kind, "mlp"))
        k = LM_PLAN_WL_MLP;
    else if (!strcmp(kind, "attention"))
        k = LM_PLAN_WL_ATTENTION;
    else if (!strcmp(kind, "mlp-repeat"))
        k = LM_PLAN_WL_MLP_REPEAT, want = 2;
    else if (!strcmp(kind, "mlp-nobias"))
        k = LM_PLAN_WL_MLP_NOBIAS;
    else if (!strcmp(kind, "attention-qkv"))
        k = LM_PLAN_WL_ATTENTION_QKV;
    else if (!strcmp(kind, "encoder-layer"))
        k = LM_PLAN_WL_ENCODER_LAYER;
    else if (!strcmp(kind, "encoder-stack"))
        k = LM_PLAN_WL_ENCODER_STACK, want = 2;
    else {
        fprintf(stderr, "loom plan: unknown workload '%s' (gemm, mlp, attention, mlp-repeat, mlp-nobias, "
                        "attention-qkv, encoder-layer, encoder-stack)\n",
                kind);
        return 2;
    }
    if (npos != want) {
        fprintf(stderr, "loom plan: %s takes %d argument%s\n", kind, want - 1, want == 2 ? "" : "s");
        return 2;
    }
    lm_plan_workload_default(k, &w);
    d = w;
    if (k == LM_PLAN_WL_GEMM &&
        (parse_size("M", pos[1], &w.m) || parse_size("N", pos[2], &w.n) || parse_size("K", pos[3], &w.k)))
        return 2;
    if ((k == LM_PLAN_WL_MLP_REPEAT || k == LM_PLAN_WL_ENCODER_STACK) && parse_size("repeat count", pos[1], &w.repeat))
        return 2;
    if (tokens) w.tokens = tokens;
    if (width) w.width = width;
    if (hidden) w.hidden = hidden;
    if (heads) w.heads = heads;
    if (lm_dtype_parse(dtype, &w.dtype) != LM_OK) {
        fprintf(stderr, "loom plan: --dtype must be f16 or f32\n");
        return 2;
    }
    lm_plan_options o;
    lm_plan_options_default(&o);
    o.beam_width = beam;
    o.exhaustive = exhaustive;
    o.gemm_candidates = cands;
    if (!strcmp(strategy, "flash"))
        o.attention = LM_PLAN_ATTN_FLASH;
    else if (!strcmp(strategy, "materialized"))
        o.attention = LM_PLAN_ATTN_MATERIALIZED;
    else if (strcmp(strategy, "auto") != 0) {
        fprintf(stderr, "loom plan: --strategy must be auto, flash or materialized\n");
        return 2;
    }
    if (lm_dtype_parse(partials, &o.partials) != LM_OK || (o.partials != LM_F32 && o.partials != LM_F16)) {
        fprintf(stderr, "loom plan: --partials must be f32 or f16\n");
        return 2;
    }
    if (grid) {
        long long a, b, c;
        char tail;
        if (sscanf(grid, "%lldx%lldx%lld%c", &a, &b, &c, &tail) != 3 || a < 0 || b < 0 || c < 0) {
            fprintf(stderr, "loom plan: --gemm-grid must look like 4x92x4 (0 = free)\n");
            return 2;
        }
        o.gemm_grid[0] = a, o.gemm_grid[1] = b, o.gemm_grid[2] = c;
    }
    lm_plan_machine *m = NULL;
    lm_graph *g = NULL;
    lm_plan *p = NULL;
    lm_plan_sim *sim = NULL;
    char *text = NULL;
    rc = load_machine(machine, &m);
    if (rc) return rc;
    lm_status st = lm_plan_workload_build(&w, &g);
    if (st != LM_OK) {
        rc = cli_fail("plan", "workload", st);
        goto done;
    }
    st = lm_plan_compile(g, m, &o, &p);
    if (st != LM_OK) {
        rc = cli_fail("plan", "compile", st);
        goto done;
    }
    int64_t plan_rss = max_rss_bytes();
    lm_plan_summary s;
    lm_plan_get_summary(p, &s);
    double check_s = 0;
    if (!no_check) {
        double t0 = cli_now();
        st = lm_plan_check(p);
        check_s = cli_now() - t0;
        if (st != LM_OK) {
            rc = cli_fail("plan", "plan check", st);
            goto done;
        }
    }
    if (package) {
        if (no_check) {
            fprintf(stderr, "loom plan: -o writes only checked plans (drop --no-check)\n");
            rc = 2;
            goto done;
        }
        st = lm_plan_package_write(p, package);
        if (st != LM_OK) {
            rc = cli_fail("plan", package, st);
            goto done;
        }
    }
    if (!no_sim) {
        lm_plan_sim_options so;
        lm_plan_sim_options_default(&so);
        so.seed = seed;
        so.threads = threads;
        st = lm_plan_simulate(p, &so, &sim);
        if (st != LM_OK) {
            rc = cli_fail("plan", "simulate", st);
            goto done;
        }
    }
    const char *pub_what;
    double pub = published(&w, &d, o.attention, !strcmp(lm_plan_machine_name(m), "ipu21"), &pub_what);
    lm_plan_sim_summary ss = {0};
    if (sim) lm_plan_sim_get_summary(sim, &ss);
    if (json) {
        st = lm_plan_report_json(p, sim, &text);
        if (st != LM_OK) {
            rc = cli_fail("plan", "report", st);
            goto done;
        }
        printf("{\"workload\":\"%s\",\"published_cycles\":%.0f,\"max_rss_bytes\":%lld,", kind, pub,
               (long long)plan_rss);
        if (no_check)
            printf("\"plan_check\":{\"ran\":false},");
        else
            printf("\"plan_check\":{\"ran\":true,\"passed\":true,\"kernel_calls\":%lld,\"transfers\":%lld,"
                   "\"seconds\":%.4f},",
                   (long long)s.kernel_calls, (long long)s.transfers, check_s);
        printf("\"plan\":%s}\n", text);
    } else {
        st = lm_plan_report_text(p, sim, &text);
        if (st != LM_OK) {
            rc = cli_fail("plan", "report", st);
            goto done;
        }
        printf("loom plan %s on %s (%lld tiles x %lld KiB)\n", kind, lm_plan_machine_name(m),
               (long long)lm_plan_machine_tiles(m), (long long)(lm_plan_machine_sram_bytes(m) / 1024));
        fputs(text, stdout);
        if (no_check)
            printf("plan check          skipped (--no-check)\n");
        else
            printf("plan check          passed (%lld kernel calls, %lld transfers: SRAM ownership and bounds, slots, "
                   "exchange hazards) in %.3f s\n",
                   (long long)s.kernel_calls, (long long)s.transfers, check_s);
        if (pub > 0)
            printf("published IPU21     %.0f cycles%s: loom predicts %.2fx that\n", pub, pub_what,
                   s.predicted_cycles / pub);
        printf("planner process     %.1f MiB max resident after planning\n", (double)plan_rss / 1048576.0);
        if (package) printf("package             %s (run it with `loom run-plan %s`)\n", package, package);
    }
    if (timeline) {
        if (!sim && !is_html(timeline)) {
            fprintf(stderr, "loom plan: an SVG --timeline needs the simulation (drop --no-sim, or write FILE.html)\n");
            rc = 2;
            goto done;
        }
        lm_free(text);
        text = NULL;
        st = is_html(timeline) ? lm_plan_timeline_html(p, sim, &text) : lm_plan_timeline_svg(p, sim, &text);
        if (st != LM_OK) {
            rc = cli_fail("plan", "timeline", st);
            goto done;
        }
        if (write_file(timeline, text)) {
            rc = 1;
            goto done;
        }
    }
    rc = sim && ss.checks_failed ? 1 : 0;
    if (rc) fprintf(stderr, "loom plan: %d of %d numerical checks failed\n", ss.checks_failed, ss.checks);
done:
    lm_free(text);
    lm_plan_sim_destroy(sim);
    lm_plan_destroy(p);
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
    return rc;
}
