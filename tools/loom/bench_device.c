/* tools/loom/bench_device.c — `loom bench ... --device cuda`: GPU measurements as one
 * JSON object per result (the CPU versions live in cmd_bench.c).
 *
 *   bandwidth  device-to-device copy of 1 GiB, counted as bytes read + written per
 *              second (the usual "copy bandwidth"); best of --repeat
 *   prefill    one forward pass of B rows x T prompt tokens ending in a device-side
 *              greedy pick of each row's next token (what generation needs)
 *   decode     after that prefill, N - 1 one-token steps of B rows, each feeding back
 *              the tokens picked on the device (graph replay from the third step)
 * Every run starts from an empty cache; one untimed warm-up run comes first (cuBLASLt
 * heuristics, buffer allocation, graph capture). Memory: the allocator's peak bytes
 * in use and reserved over the whole process, weights included. The decode roofline
 * is copy bandwidth / bytes one step must read (weights + the KV cache at the mean
 * context length), times B tokens per step; achieved_gb_s is those bytes times the
 * steps per second the best run reached, and kernels_per_step the kernel launches in
 * the captured step of the latest decode (a graph's kernel nodes). A prefill reports
 * its FLOPs (cli_prefill_flops) and the rate its best run reached (achieved_tflop_s).
 */
#include "bench_device.h"
#include "common.h"

#include <stdlib.h>
#include <string.h>

/* Copy bandwidth in GB/s (read + write bytes), best of `repeat`; 0 on failure. */
static double copy_bandwidth(lm_device dev, int repeat) {
    size_t n = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    double best = 0;
    if (lm_device_alloc(dev, n, &a) == LM_OK && lm_device_alloc(dev, n, &b) == LM_OK) {
        lm_device_fill(dev, a, n, &(uint8_t){1}, 1);
        for (int r = 0; r < repeat + 1; r++) {
            double t0 = cli_now();
            if (lm_device_copy(dev, b, dev, a, n) != LM_OK) break;
            double gbs = 2.0 * (double)n / (cli_now() - t0) / 1e9;
            if (r > 0 && gbs > best) best = gbs; /* run 0 warms up */
        }
    }
    lm_device_free(dev, a);
    lm_device_free(dev, b);
    return best;
}

int bench_device_bandwidth(lm_device dev, int repeat) {
    char name[32];
    double gbs = copy_bandwidth(dev, repeat);
    if (gbs <= 0) return cli_fail("bench bandwidth", "device copy failed", LM_DEVICE_ERROR);
    printf("{\"bench\":\"bandwidth\",\"device\":\"%s\",\"copy_gb_s\":%.2f}\n", lm_device_format(dev, name, sizeof name), gbs);
    return 0;
}

static void random_ids(int32_t *ids, int64_t n, int64_t vocab, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((seed >> 33) % (uint64_t)vocab);
    }
}

typedef struct run_state {
    lm_model *m;
    lm_ctx *ctx;
    lm_kv_cache *cache;
    int *slots;     /* [B] */
    int32_t *ids;   /* [B * P] prompt */
    int32_t *next;  /* [B] tokens picked by the last step */
    lm_sample_params greedy; /* draw = the step */
} run_state;

/* One prefill + (decode ? N - 1 steps : none); *t_prefill and *t_decode in seconds. */
static lm_status one_run(run_state *s, const bench_device_opts *o, int decode, double *t_prefill, double *t_decode) {
    lm_status st = LM_OK;
    for (int b = 0; b < o->batch && st == LM_OK; b++) st = lm_kv_cache_reset(s->cache, b);
    double t0 = cli_now();
    s->greedy.draw = 0;
    if (st == LM_OK)
        st = lm_model_forward_sample(s->m, s->ctx, s->cache, s->slots, o->batch, s->ids, o->prompt, &s->greedy, s->next);
    double t1 = cli_now();
    for (int64_t step = 1; decode && step < o->tokens && st == LM_OK; step++) {
        s->greedy.draw = (uint64_t)step;
        st = lm_model_forward_sample(s->m, s->ctx, s->cache, s->slots, o->batch, s->next, 1, &s->greedy, s->next);
    }
    *t_prefill = t1 - t0;
    *t_decode = cli_now() - t1;
    return st;
}

static void print_result(const bench_device_opts *o, run_state *s, int decode, double best, double med) {
    const lm_model_config *c = lm_model_get_config(s->m);
    lm_device dev = lm_model_device(s->m);
    char name[32];
    int64_t toks = decode ? (o->tokens - 1) * o->batch : o->prompt * o->batch;
    lm_device_memory_stats ms = {0};
    lm_device_memory_stats_get(dev, &ms);
    printf("{\"bench\":\"%s\",\"model\":\"%s\",\"arch\":\"%s\",\"device\":\"%s\",\"weight_dtype\":\"%s\","
           "\"weights\":\"%s\",\"batch\":%d,"
           "\"prompt_tokens\":%lld,\"tokens\":%lld,\"best_s\":%.6f,\"median_s\":%.6f,\"tok_per_s\":%.3f,"
           "\"median_tok_per_s\":%.3f,\"peak_bytes\":%lld,\"peak_reserved_bytes\":%lld,\"backend_allocs\":%lld",
           decode ? "decode" : "prefill", o->model, lm_arch_name(c->arch), lm_device_format(dev, name, sizeof name),
           lm_dtype_name(c->dtype), lm_weights_name(lm_model_weights(s->m)), o->batch, (long long)o->prompt, (long long)toks, best, med, toks / best, toks / med, (long long)ms.peak_bytes,
           (long long)ms.peak_reserved_bytes, (long long)ms.backend_allocs);
    cli_print_steps(s->cache); /* the step arena beside what any plan would need */
    if (decode) {
        double kv_token = 2.0 * (double)(c->num_hidden_layers * c->num_key_value_heads * c->head_dim) * 2; /* K+V bf16 */
        double mean_ctx = (double)o->prompt + (double)o->tokens / 2;
        double bytes = (double)lm_model_weight_bytes(s->m) + o->batch * mean_ctx * kv_token;
        cli_print_roofline(bytes, "copy_gb_s", copy_bandwidth(dev, 5), toks / best, o->batch);
    } else {
        cli_print_flops(cli_prefill_flops(c, o->prompt, o->batch), best);
    }
    printf("}\n");
}

int bench_device_model(const bench_device_opts *o, lm_device dev, int decode) {
    const char *cmd = decode ? "bench decode" : "bench prefill";
    run_state s;
    memset(&s, 0, sizeof s);
    s.greedy = (lm_sample_params){.greedy = 1, .temperature = 1.0f, .top_p = 1.0f};
    if (!(s.m = cli_load_model_weights(cmd, o->model, dev, o->weights))) return 1;
    const lm_model_config *c = lm_model_get_config(s.m);
    int B = o->batch, rc = 1;
    s.ids = malloc(sizeof(int32_t) * (size_t)B * (size_t)o->prompt);
    s.next = malloc(sizeof(int32_t) * (size_t)B);
    s.slots = malloc(sizeof(int) * (size_t)B);
    double *times = calloc((size_t)o->repeat, sizeof(double));
    lm_status st = s.ids && s.next && s.slots && times ? lm_ctx_create(dev, 1, &s.ctx) : LM_OUT_OF_MEMORY;
    if (st == LM_OK) st = lm_kv_cache_create(s.m, B, o->prompt + o->tokens + 1, &s.cache);
    if (st != LM_OK) {
        cli_fail(cmd, "setup failed", st);
        goto done;
    }
    for (int b = 0; b < B; b++) s.slots[b] = b;
    random_ids(s.ids, (int64_t)B * o->prompt, c->vocab_size, 12345);
    double tp, td;
    st = one_run(&s, o, decode, &tp, &td); /* warm-up */
    for (int r = 0; r < o->repeat && st == LM_OK; r++) {
        st = one_run(&s, o, decode, &tp, &td);
        times[r] = decode ? td : tp;
    }
    if (st != LM_OK) {
        cli_fail(cmd, "forward pass failed", st);
        goto done;
    }
    double best, med;
    cli_best_median(times, o->repeat, &best, &med);
    print_result(o, &s, decode, best, med);
    rc = 0;
done:
    free(s.ids);
    free(s.next);
    free(s.slots);
    free(times);
    lm_kv_cache_destroy(s.cache);
    lm_ctx_destroy(s.ctx);
    lm_model_destroy(s.m);
    return rc;
}
