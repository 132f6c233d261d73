/* tools/loom/cmd_logits.c — `loom logits`: one forward pass over given ids, printing
 * per position {"pos","logsumexp","top":[[id,logit],...],"probe":[logit,...]} as
 * JSON lines (a diagnostic contract other tools parse: keep the format). --device
 * runs the forward pass on a GPU (bf16 weights there); the output is the same. */
#include "args.h"
#include "commands.h"
#include "common.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* 1 when logit a ranks before logit b in the "top" list: the larger logit first, the
 * smaller id on a tie (the order of a stable sort by descending logit); a NaN ranks
 * after every number. */
static int ranks_before(const float *row, int64_t a, int64_t b) {
    if (isnan(row[a]) || isnan(row[b])) return isnan(row[a]) == isnan(row[b]) ? a < b : !isnan(row[a]);
    return row[a] > row[b] || (row[a] == row[b] && a < b);
}

/* heap[0..n) is a binary heap whose root ranks last (the one a better id replaces). */
static void sift_down(const float *row, int64_t *heap, int64_t n, int64_t i) {
    for (;;) {
        int64_t worst = i, l = 2 * i + 1, r = l + 1;
        if (l < n && ranks_before(row, heap[worst], heap[l])) worst = l;
        if (r < n && ranks_before(row, heap[worst], heap[r])) worst = r;
        if (worst == i) return;
        int64_t t = heap[i];
        heap[i] = heap[worst], heap[worst] = t;
        i = worst;
    }
}

/* The k (<= V) best ids of row in rank order, into top[0..k): a heap of the k best
 * seen so far, then the heap sorted by popping its root (the worst) into the back.
 * O(V log k) time, k ids of memory. */
static void top_ids(const float *row, int64_t V, int64_t k, int64_t *top) {
    for (int64_t i = 0; i < k; i++) top[i] = i;
    for (int64_t i = k / 2; i-- > 0;) sift_down(row, top, k, i);
    for (int64_t i = k; i < V; i++)
        if (k > 0 && ranks_before(row, i, top[0])) top[0] = i, sift_down(row, top, k, 0);
    for (int64_t n = k; n > 1; n--) {
        int64_t t = top[0];
        top[0] = top[n - 1], top[n - 1] = t;
        sift_down(row, top, n - 1, 0);
    }
}

/* One JSON line; top[] is scratch for k ids. */
static void print_position(int64_t pos, const float *row, int64_t V, int64_t k, int64_t *top, const int32_t *probe,
                           size_t nprobe) {
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < V; i++) mx = row[i] > mx ? row[i] : mx;
    for (int64_t i = 0; i < V; i++) sum += exp((double)row[i] - mx);
    printf("{\"pos\":%lld,\"logsumexp\":%.9g,\"top\":[", (long long)pos, mx + log(sum));
    top_ids(row, V, k, top);
    for (int64_t j = 0; j < k; j++) printf("%s[%lld,%.9g]", j ? "," : "", (long long)top[j], row[top[j]]);
    printf("],\"probe\":[");
    for (size_t j = 0; j < nprobe; j++) printf("%s%.9g", j ? "," : "", row[probe[j]]);
    printf("]}\n");
}

int cmd_logits(int argc, char **argv) {
    const char *model_dir = NULL, *ids_text = NULL, *probe_text = NULL, *device_text = NULL, *weights_text = NULL;
    int top = 5, threads = 0;
    const cli_opt opts[] = {
        {"model", CLI_STRING, &model_dir, "DIR: Hugging Face model directory (required)"},
        {"ids", CLI_STRING, &ids_text, "1,2,3: token ids to run (required)"},
        {"top", CLI_COUNT, &top, "K: how many of the largest logits to print per position, largest first, the "
                                 "smaller id first on a tie (default 5; at most the vocabulary size: a larger K "
                                 "prints the whole vocabulary)"},
        {"probe", CLI_STRING, &probe_text, "a,b,c: token ids whose logits to print at every position"},
        {"threads", CLI_COUNT, &threads, "N: CPU threads (default: all)"},
        {"device", CLI_STRING, &device_text, "DEV: cpu (default), cuda or cuda:N"},
        CLI_WEIGHTS_OPT(&weights_text),
        {NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos;
    int rc = cli_parse("logits", "--model DIR --ids 1,2,3 [--top K] [--probe a,b,c]", opts, argc, argv, pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (!model_dir || !ids_text) {
        fprintf(stderr, "loom logits: --model and --ids are required\n");
        return 2;
    }
    lm_device device;
    lm_weights weights;
    if (!cli_parse_device("logits", device_text, &device) || !cli_parse_weights("logits", weights_text, &weights)) return 2;
    int32_t *ids = NULL, *probe = NULL;
    size_t n = 0, nprobe = 0;
    if (!cli_parse_ids(ids_text, &ids, &n)) return 2;
    if (probe_text && !cli_parse_ids(probe_text, &probe, &nprobe)) {
        free(ids);
        return 2;
    }
    lm_model *m = cli_load_model_weights("logits", model_dir, device, weights);
    lm_ctx *ctx = NULL;
    lm_kv_cache *cache = NULL;
    float *logits = NULL;
    int64_t *best = NULL;
    rc = 1;
    if (!m) goto done;
    const lm_model_config *cfg = lm_model_get_config(m);
    int64_t V = cfg->vocab_size, k = top < V ? top : V;
    for (size_t j = 0; j < nprobe; j++)
        if (probe[j] >= V) {
            fprintf(stderr, "loom logits: --probe id %d is outside the vocabulary of %lld\n", probe[j], (long long)V);
            rc = 2;
            goto done;
        }
    if ((int64_t)n > cfg->max_position_embeddings) {
        fprintf(stderr, "loom logits: --ids holds %zu ids, more than the model's context of %lld "
                        "(max_position_embeddings)\n", n, (long long)cfg->max_position_embeddings);
        rc = 2;
        goto done;
    }
    lm_status st = lm_ctx_create(device, threads, &ctx);
    if (st == LM_OK) st = lm_kv_cache_create(m, 1, (int64_t)n, &cache);
    if (st != LM_OK) {
        rc = cli_fail("logits", "setup failed", st);
        goto done;
    }
    if ((size_t)V <= SIZE_MAX / sizeof(float) / n) logits = malloc(sizeof(float) * (size_t)V * n);
    best = malloc(sizeof *best * (size_t)(k > 0 ? k : 1));
    int slot = 0;
    if (!logits || !best) {
        fprintf(stderr, "loom logits: out of memory for %zu x %lld logits (%.1f MiB)\n", n, (long long)V,
                (double)sizeof(float) * (double)V * (double)n / (1 << 20));
        goto done;
    }
    st = lm_model_forward(m, ctx, cache, &slot, 1, ids, (int64_t)n, logits, 1);
    if (st != LM_OK) {
        rc = cli_fail("logits", "forward pass failed", st);
        goto done;
    }
    for (size_t t = 0; t < n; t++) print_position((int64_t)t, logits + t * (size_t)V, V, k, best, probe, nprobe);
    rc = 0;
done:
    free(logits);
    free(best);
    free(ids);
    free(probe);
    lm_kv_cache_destroy(cache);
    lm_ctx_destroy(ctx);
    lm_model_destroy(m);
    return rc;
}
