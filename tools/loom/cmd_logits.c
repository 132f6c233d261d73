/* tools/loom/cmd_logits.c — `loom logits`: one forward pass over given ids, printing
 * per position {"pos","logsumexp","top":[[id,logit],...],"probe":[logit,...]} as
 * JSON lines (a diagnostic contract other tools parse: keep the format). --device
 * runs the forward pass on a GPU (bf16 weights there); the output is the same. */
#include "args.h"
#include "commands.h"
#include "common.h"

#include <math.h>
#include <stdlib.h>

static void print_position(int64_t pos, const float *row, int64_t V, int top, const int32_t *probe, size_t nprobe) {
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < V; i++) mx = row[i] > mx ? row[i] : mx;
    for (int64_t i = 0; i < V; i++) sum += exp((double)row[i] - mx);
    printf("{\"pos\":%lld,\"logsumexp\":%.9g,\"top\":[", (long long)pos, mx + log(sum));
    /* top-k by repeated selection: k is small (default 5) */
    int64_t *picked = calloc((size_t)(top > 0 ? top : 1), sizeof *picked);
    for (int k = 0; k < top && k < V; k++) {
        int64_t best = -1;
        for (int64_t i = 0; i < V; i++) {
            int used = 0;
            for (int j = 0; j < k; j++) used |= picked[j] == i;
            if (!used && (best < 0 || row[i] > row[best])) best = i;
        }
        picked[k] = best;
        printf("%s[%lld,%.9g]", k ? "," : "", (long long)best, row[best]);
    }
    free(picked);
    printf("],\"probe\":[");
    for (size_t j = 0; j < nprobe; j++) printf("%s%.9g", j ? "," : "", row[probe[j]]);
    printf("]}\n");
}

int cmd_logits(int argc, char **argv) {
    const char *model_dir = NULL, *ids_text = NULL, *probe_text = NULL, *device_text = NULL;
    int top = 5, threads = 0;
    const cli_opt opts[] = {
        {"model", CLI_STRING, &model_dir, "DIR: Hugging Face model directory (required)"},
        {"ids", CLI_STRING, &ids_text, "1,2,3: token ids to run (required)"},
        {"top", CLI_COUNT, &top, "K: how many of the largest logits to print per position (default 5)"},
        {"probe", CLI_STRING, &probe_text, "a,b,c: token ids whose logits to print at every position"},
        {"threads", CLI_COUNT, &threads, "N: CPU threads (default: all)"},
        {"device", CLI_STRING, &device_text, "DEV: cpu (default), cuda or cuda:N"},
        {NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos;
    int rc = cli_parse("logits", "--model DIR --ids 1,2,3 [--top K] [--probe a,b,c]", opts, argc, argv, pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (!model_dir || !ids_text) {
        fprintf(stderr, "loom logits: --model and --ids are required\n");
        return 2;
    }
    if (top < 0) {
        fprintf(stderr, "loom logits: --top must be >= 0\n");
        return 2;
    }
    lm_device device;
    if (!cli_parse_device("logits", device_text, &device)) return 2;
    int32_t *ids = NULL, *probe = NULL;
    size_t n = 0, nprobe = 0;
    if (!cli_parse_ids(ids_text, &ids, &n)) return 2;
    if (probe_text && !cli_parse_ids(probe_text, &probe, &nprobe)) {
        free(ids);
        return 2;
    }
    lm_model *m = cli_load_model_on("logits", model_dir, device);
    lm_ctx *ctx = NULL;
    lm_kv_cache *cache = NULL;
    float *logits = NULL;
    rc = 1;
    if (!m) goto done;
    int64_t V = lm_model_get_config(m)->vocab_size;
    for (size_t j = 0; j < nprobe; j++)
        if (probe[j] >= V) {
            fprintf(stderr, "loom logits: --probe id %d is outside the vocabulary of %lld\n", probe[j], (long long)V);
            rc = 2;
            goto done;
        }
    lm_status st = lm_ctx_create(device, threads, &ctx);
    if (st == LM_OK) st = lm_kv_cache_create(m, 1, (int64_t)n, &cache);
    if (st != LM_OK) {
        rc = cli_fail("logits", "setup failed", st);
        goto done;
    }
    logits = malloc(sizeof(float) * (size_t)V * n);
    int slot = 0;
    if (!logits) {
        fprintf(stderr, "loom logits: out of memory for %zu x %lld logits\n", n, (long long)V);
        goto done;
    }
    st = lm_model_forward(m, ctx, cache, &slot, 1, ids, (int64_t)n, logits, 1);
    if (st != LM_OK) {
        rc = cli_fail("logits", "forward pass failed", st);
        goto done;
    }
    for (size_t t = 0; t < n; t++) print_position((int64_t)t, logits + t * (size_t)V, V, top, probe, nprobe);
    rc = 0;
done:
    free(logits);
    free(ids);
    free(probe);
    lm_kv_cache_destroy(cache);
    lm_ctx_destroy(ctx);
    lm_model_destroy(m);
    return rc;
}
