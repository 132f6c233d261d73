/* tools/loom/cmd_run_plan.c — `loom run-plan FILE.lmx`: run an executable plan package
 * (lm_plan_package_write, `loom plan ... -o FILE.lmx`) with the simulator as the
 * device, without the compiler.
 *
 * The package is loaded and validated first (checksums, every index and range, the
 * rebuilt graph, the plan checker: lm_plan_package_load); --machine NAME|FILE also
 * refuses a package built for another machine. Inputs and parameters are the
 * simulator's seeded data (--seed, what `loom plan` uses) or, with --inputs DIR, one
 * file DIR/NAME.bin per input and parameter binding: its elements dense row-major in
 * the binding's dtype, little-endian (f32: IEEE binary32, f16: binary16, i32: two's
 * complement, |v| <= 2^24), a parameter of a repeat body holding its copies one after
 * another; the size must match exactly. --outputs DIR writes each program output as
 * DIR/NAME.bin in the same format (the directory is created if missing). The report
 * is `loom plan`'s: the mid program, predicted and simulated cycles, every numerical
 * check against the CPU reference (which reads the same inputs).
 * Exit status: 0 when the run and every check pass, 1 on failure, 2 for usage errors.
 */
#include "args.h"
#include "commands.h"
#include "common.h"
#include "loom/io_write.h"
#include "loom/plan.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct input {
    lm_plan_binding b;
    float *v; /* [copies * numel] as floats (exact for f16 and for i32 up to 2^24) */
} input;

typedef struct inputs {
    input *in; /* [n] */
    int64_t n;
} inputs;

static int64_t numel(const lm_plan_binding *b) {
    int64_t n = 1;
    for (int d = 0; d < b->ndim; d++) n *= b->shape[d];
    return n;
}

/* A binding's file name: NAME.bin inside dir; 0 when the name cannot be a file name. */
static int file_of(const char *dir, const char *name, char *buf, size_t n) {
    if (!name[0] || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..")) return 0;
    return snprintf(buf, n, "%s/%s.bin", dir, name) < (int)n;
}

static void shape_str(const lm_plan_binding *b, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < b->ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? "," : "", (long long)b->shape[d]);
    if (k < n) snprintf(buf + k, n - k, "] %s", lm_dtype_name(b->dtype));
}

static int read_input(const char *dir, input *in) {
    char path[4096], shape[96];
    const lm_plan_binding *b = &in->b;
    if (!file_of(dir, b->name, path, sizeof path)) {
        fprintf(stderr, "loom run-plan: input '%s': the name cannot be a file name in '%s'\n", b->name, dir);
        return 1;
    }
    char *data = NULL;
    size_t size = 0;
    lm_status st = lm_file_read_all(path, &data, &size);
    if (st != LM_OK) {
        fprintf(stderr, "loom run-plan: input '%s': %s\n", b->name, lm_last_error());
        return 1;
    }
    int64_t n = numel(b) * b->copies, es = (int64_t)lm_dtype_size(b->dtype);
    shape_str(b, shape, sizeof shape);
    if ((int64_t)size != n * es) {
        fprintf(stderr,
                "loom run-plan: input '%s': '%s' has %zu bytes, expected %lld (%s%s = %lld elements of %lld bytes)\n",
                b->name, path, size, (long long)(n * es), shape, b->copies > 1 ? " x copies" : "", (long long)n,
                (long long)es);
        lm_free(data);
        return 1;
    }
    in->v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    int rc = in->v ? 0 : 1;
    const uint8_t *p = (const uint8_t *)data;
    for (int64_t i = 0; i < n && !rc; i++, p += es) {
        uint32_t u = 0;
        for (int k = 0; k < es; k++) u |= (uint32_t)p[k] << (8 * k);
        if (b->dtype == LM_F16) {
            in->v[i] = lm_f16_to_f32((uint16_t)u);
        } else if (b->dtype == LM_I32) {
            int32_t x = (int32_t)u;
            if (x > (1 << 24) || x < -(1 << 24)) {
                fprintf(stderr, "loom run-plan: input '%s': element %lld of '%s' = %d is beyond +-2^24\n", b->name,
                        (long long)i, path, x);
                rc = 1;
            }
            in->v[i] = (float)x;
        } else {
            memcpy(&in->v[i], &u, 4);
        }
    }
    if (!in->v) fprintf(stderr, "loom run-plan: out of memory reading '%s'\n", path);
    lm_free(data);
    return rc;
}

static void inputs_free(inputs *ins) {
    for (int64_t i = 0; i < ins->n; i++) free(ins->in[i].v);
    free(ins->in);
    ins->in = NULL;
    ins->n = 0;
}

static int read_inputs(const char *dir, const lm_plan *p, inputs *ins) {
    int64_t n = lm_plan_binding_count(p);
    ins->in = calloc((size_t)(n ? n : 1), sizeof *ins->in);
    if (!ins->in) return 1;
    for (int64_t i = 0; i < n; i++) {
        lm_plan_binding b;
        if (lm_plan_binding_get(p, i, &b) != LM_OK || b.kind == LM_PLAN_BIND_OUTPUT) continue;
        input *in = &ins->in[ins->n++];
        in->b = b;
        if (read_input(dir, in)) return 1;
    }
    return 0;
}

/* The simulator's data source: NAME, or NAME#ITER for a repeat body's parameter. */
static lm_status fill(void *user, const char *name, lm_dtype dtype, int ndim, const int64_t *shape, float *dst) {
    const inputs *ins = user;
    (void)dtype, (void)ndim, (void)shape;
    const char *hash = strrchr(name, '#');
    for (int pass = 0; pass < 2; pass++)
        for (int64_t i = 0; i < ins->n; i++) {
            const input *in = &ins->in[i];
            int64_t it = 0, n = numel(&in->b);
            if (pass == 0 && strcmp(in->b.name, name)) continue;
            if (pass == 1) {
                size_t len = strlen(in->b.name);
                char *end = NULL;
                if (!hash || (size_t)(hash - name) != len || strncmp(name, in->b.name, len)) continue;
                it = strtoll(hash + 1, &end, 10);
                if (!end || *end || it < 0 || it >= in->b.copies) continue;
            }
            memcpy(dst, in->v + it * n, sizeof(float) * (size_t)n);
            return LM_OK;
        }
    return LM_NOT_FOUND; /* the package's bindings list every value the simulator asks for */
}

static int write_outputs(const char *dir, const lm_plan *p, const lm_plan_sim *s, int *written) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "loom run-plan: cannot create '%s': %s\n", dir, strerror(errno));
        return 1;
    }
    *written = 0;
    for (int64_t i = 0; i < lm_plan_binding_count(p); i++) {
        lm_plan_binding b;
        if (lm_plan_binding_get(p, i, &b) != LM_OK || b.kind != LM_PLAN_BIND_OUTPUT) continue;
        char path[4096];
        if (!file_of(dir, b.name, path, sizeof path)) {
            fprintf(stderr, "loom run-plan: output '%s': the name cannot be a file name in '%s'\n", b.name, dir);
            return 1;
        }
        int64_t n = numel(&b), es = (int64_t)lm_dtype_size(b.dtype);
        float *v = malloc(sizeof(float) * (size_t)n);
        uint8_t *bytes = malloc((size_t)(n * es));
        lm_status st = v && bytes ? lm_plan_sim_output(s, b.name, v, n) : LM_OUT_OF_MEMORY;
        for (int64_t k = 0; k < n && st == LM_OK; k++) {
            uint32_t u;
            if (b.dtype == LM_F16)
                u = lm_f32_to_f16(v[k]);
            else if (b.dtype == LM_I32)
                u = (uint32_t)(int32_t)lrintf(v[k]);
            else
                memcpy(&u, &v[k], 4);
            for (int j = 0; j < es; j++) bytes[k * es + j] = (uint8_t)(u >> (8 * j));
        }
        if (st == LM_OK) st = lm_file_write_atomic(path, bytes, (size_t)(n * es));
        free(v);
        free(bytes);
        if (st != LM_OK) return cli_fail("run-plan", "output", st);
        ++*written;
    }
    return 0;
}

static int load_machine(const char *name, lm_plan_machine **m) {
    lm_status st = lm_plan_machine_preset(name, m);
    if (st == LM_NOT_FOUND) st = lm_plan_machine_load(name, m);
    if (st != LM_OK) return cli_fail("run-plan", "machine", st);
    return 0;
}

int cmd_run_plan(int argc, char **argv) {
    const char *in_dir = NULL, *out_dir = NULL, *machine = NULL;
    int json = 0, threads = 0;
    uint64_t seed = 1;
    const cli_opt opts[] = {
        {"inputs", CLI_STRING, &in_dir, "DIR: read each input and parameter from DIR/NAME.bin (default: seeded data)"},
        {"outputs", CLI_STRING, &out_dir, "DIR: write each program output to DIR/NAME.bin"},
        {"machine", CLI_STRING, &machine, "NAME|FILE: refuse a package built for another machine"},
        {"seed", CLI_U64, &seed, "N: seed of the generated data without --inputs (default 1)"},
        {"threads", CLI_COUNT, &threads, "N: simulator threads (default: all CPUs)"},
        {"json", CLI_FLAG, &json, "print one JSON object instead of text"},
        {NULL, 0, NULL, NULL}};
    const char *pos[2];
    int npos;
    const char *syn = "FILE.lmx [--inputs DIR] [--outputs DIR] [--json]";
    int rc = cli_parse("run-plan", syn, opts, argc, argv, pos, 2, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (npos != 1) {
        cli_usage(stderr, "run-plan", syn, opts);
        return 2;
    }
    const char *file = pos[0];
    lm_plan_machine *m = NULL;
    lm_plan *p = NULL;
    lm_plan_sim *sim = NULL;
    char *text = NULL;
    inputs ins = {NULL, 0};
    if (machine && (rc = load_machine(machine, &m)) != 0) return rc;
    double t0 = cli_now();
    lm_status st = lm_plan_package_load(file, m, &p);
    double load_s = cli_now() - t0;
    if (st != LM_OK) {
        rc = cli_fail("run-plan", "package", st);
        goto done;
    }
    if (in_dir && read_inputs(in_dir, p, &ins)) {
        rc = 1;
        goto done;
    }
    lm_plan_sim_options so;
    lm_plan_sim_options_default(&so);
    so.seed = seed;
    so.threads = threads;
    if (in_dir) so.fill = fill, so.fill_user = &ins;
    st = lm_plan_simulate(p, &so, &sim);
    if (st != LM_OK) {
        rc = cli_fail("run-plan", "simulate", st);
        goto done;
    }
    int written = 0;
    if (out_dir && write_outputs(out_dir, p, sim, &written)) {
        rc = 1;
        goto done;
    }
    const lm_plan_machine *pm = lm_plan_get_machine(p);
    lm_plan_summary s;
    lm_plan_get_summary(p, &s);
    lm_plan_sim_summary ss;
    lm_plan_sim_get_summary(sim, &ss);
    st = json ? lm_plan_report_json(p, sim, &text) : lm_plan_report_text(p, sim, &text);
    if (st != LM_OK) {
        rc = cli_fail("run-plan", "report", st);
        goto done;
    }
    if (json) {
        printf("{\"package\":");
        cli_json_string(stdout, file, strlen(file));
        printf(",\"inputs\":");
        if (in_dir)
            cli_json_string(stdout, in_dir, strlen(in_dir));
        else
            printf("null");
        printf(",\"seed\":%llu,\"outputs\":", (unsigned long long)seed);
        if (out_dir)
            cli_json_string(stdout, out_dir, strlen(out_dir));
        else
            printf("null");
        printf(",\"outputs_written\":%d,\"load_seconds\":%.4f,\"plan_check\":{\"ran\":true,\"passed\":true,"
               "\"kernel_calls\":%lld,\"transfers\":%lld},\"plan\":%s}\n",
               written, load_s, (long long)s.kernel_calls, (long long)s.transfers, text);
    } else {
        printf("loom run-plan %s on %s (%lld tiles x %lld KiB)\n", file, lm_plan_machine_name(pm),
               (long long)lm_plan_machine_tiles(pm), (long long)(lm_plan_machine_sram_bytes(pm) / 1024));
        fputs(text, stdout);
        printf("plan check          passed at load (%lld kernel calls, %lld transfers: SRAM ownership and bounds, "
               "slots, exchange hazards); package loaded in %.3f s\n",
               (long long)s.kernel_calls, (long long)s.transfers, load_s);
        if (in_dir)
            printf("inputs              %lld files from %s\n", (long long)ins.n, in_dir);
        else
            printf("inputs              seeded data (seed %llu)\n", (unsigned long long)seed);
        if (out_dir) printf("outputs             %d files written to %s\n", written, out_dir);
    }
    rc = ss.checks_failed ? 1 : 0;
    if (rc) fprintf(stderr, "loom run-plan: %d of %d numerical checks failed\n", ss.checks_failed, ss.checks);
done:
    lm_free(text);
    inputs_free(&ins);
    lm_plan_sim_destroy(sim);
    lm_plan_destroy(p);
    lm_plan_machine_destroy(m);
    return rc;
}
