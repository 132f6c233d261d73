/* tools/loom/cmd_serve.c — `loom serve`: the OpenAI-compatible HTTP server
 * (loom/server.h) on one model, until SIGINT or SIGTERM.
 *
 * The KV cache is sized at start and printed. On CUDA it is paged by default: a pool
 * of blocks (--block-size positions each) as large as --kv-memory (default: half of
 * the GPU's memory beside the weights), up to --slots (default 256) requests decoding
 * together; --slot-cache gives each request a slot of --context positions instead,
 * the CPU's default. --buckets 8x512,4x4096 makes a length-bucketed scheduler.
 */
#include "args.h"
#include "commands.h"
#include "common.h"
#include "loom/server.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

static lm_server *g_server;

static void on_signal(int sig) {
    (void)sig;
    lm_server_stop(g_server); /* only sets a flag */
}

/* "8x512,4x4096" -> buckets; 0 with a message on a malformed list. */
static int parse_buckets(const char *text, lm_sched_options *o) {
    o->n_buckets = 0;
    const char *p = text;
    while (*p) {
        char *end;
        long slots = strtol(p, &end, 10);
        if (end == p || *end != 'x') break;
        p = end + 1;
        long long ctx = strtoll(p, &end, 10);
        if (end == p || slots < 1 || ctx < 1 || o->n_buckets == LM_SCHED_MAX_BUCKETS) break;
        o->bucket_slots[o->n_buckets] = (int)slots;
        o->bucket_context[o->n_buckets++] = ctx;
        p = end;
        if (*p == ',') p++;
        else if (*p) break;
        if (!*p) return 1;
    }
    fprintf(stderr, "loom serve: --buckets '%s': expected SLOTSxCONTEXT[,SLOTSxCONTEXT...] (at most %d, contexts increasing)\n",
            text, LM_SCHED_MAX_BUCKETS);
    return 0;
}

/* Bytes of KV cache one position of one slot takes on the model's device. */
static int64_t kv_bytes_per_token(const lm_model *m) {
    const lm_model_config *c = lm_model_get_config(m);
    lm_device_caps caps;
    int host = lm_device_caps_get(lm_model_device(m), &caps) == LM_OK && caps.host_addressable;
    return 2 * c->num_hidden_layers * c->num_key_value_heads * c->head_dim * (host ? 4 : 2);
}

int cmd_serve(int argc, char **argv) {
    const char *model_dir = NULL, *device_text = NULL, *weights_text = NULL, *host = "127.0.0.1", *api_key = NULL, *name = NULL;
    const char *buckets = NULL, *scheduler = NULL, *bos_text = "auto", *trace = NULL;
    int port = 8080, slots = 0, threads = 0, spill = 0, max_queue = 0, verbose = 0, deterministic = 0;
    int max_connections = 512, max_prefill = 0, paged = 0, slot_cache = 0, block_size = 16;
    int64_t context = 0;
    float kv_memory_gib = 0, grace = 10, idle = 30;
    int context_i = 0;
    const cli_opt opts[] = {
        {"model", CLI_STRING, &model_dir, "DIR: Hugging Face model directory (required; tokenizer.json inside)"},
        {"device", CLI_STRING, &device_text, "DEV: cpu (default), cuda or cuda:N"},
        CLI_WEIGHTS_OPT(&weights_text),
        {"host", CLI_STRING, &host, "ADDR: IPv4 address to listen on (default 127.0.0.1; 0.0.0.0 for all)"},
        {"port", CLI_INT, &port, "N: TCP port (default 8080; 0 picks a free one)"},
        {"name", CLI_STRING, &name, "NAME: the model id clients use (default: the directory's name)"},
        {"api-key", CLI_STRING, &api_key, "KEY: require 'Authorization: Bearer KEY' on /v1/"},
        {"scheduler", CLI_STRING, &scheduler, "KIND: continuous (default), bucketed (with --buckets) or reference"},
        {"slots", CLI_INT, &slots, "N: requests decoded together (default 8 on the CPU, 256 on CUDA; with --slot-cache on CUDA: what --kv-memory holds, at most 256)"},
        {"context", CLI_INT, &context_i, "N: positions one request may hold, prompt + output (default min(4096, max_position_embeddings))"},
        {"kv-memory", CLI_FLOAT, &kv_memory_gib, "GIB: KV-cache budget: the paged pool, or what sizes --slots with --slot-cache (CUDA default: half the memory beside the weights)"},
        {"paged", CLI_FLAG, &paged, "a paged KV cache: blocks taken as requests grow, shared by equal prompt prefixes "
                                    "(the default on CUDA)"},
        {"slot-cache", CLI_FLAG, &slot_cache, "one KV slot of --context positions per request (the default on the CPU)"},
        {"block-size", CLI_INT, &block_size, "N: positions per block of the paged cache (default 16)"},
        {"buckets", CLI_STRING, &buckets, "LIST: length buckets, e.g. 16x512,4x4096 (slots x context each)"},
        {"spill", CLI_FLAG, &spill, "a full bucket may hand a request to a larger bucket with a free slot"},
        {"max-queue", CLI_INT, &max_queue, "N: pending requests before 429 (default 1024)"},
        {"max-prefill-tokens", CLI_INT, &max_prefill, "N: prompt tokens one prefill step takes at most (default 2048)"},
        {"max-connections", CLI_INT, &max_connections, "N: concurrent HTTP connections (default 512)"},
        {"bos", CLI_STRING, &bos_text, "auto|on|off: BOS before completion prompts (auto: as tokenizer.json's post-processor)"},
        {"shutdown-grace", CLI_FLOAT, &grace, "S: on SIGINT/SIGTERM, seconds in-flight requests may finish (default 10)"},
        {"idle-timeout", CLI_FLOAT, &idle, "S: close connections idle this long (default 30)"},
        {"deterministic", CLI_FLAG, &deterministic, "batch-invariant mode: a request's tokens do not depend on its batch"},
        {"threads", CLI_COUNT, &threads, "N: CPU threads (default: all)"},
        {"verbose", CLI_FLAG, &verbose, "log each step's detail"},
        CLI_TRACE_OPT(&trace),
        {NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos;
    int rc = cli_parse("serve", "--model DIR [--device cuda] [--host ADDR] [--port N] [options]", opts, argc, argv, pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (!model_dir) {
        fprintf(stderr, "loom serve: --model is required\n");
        return 2;
    }
    context = context_i;
    if (port < 0 || port > 65535 || slots < 0 || context < 0 || threads < 0 || max_queue < 0 || max_connections < 1 ||
        max_prefill < 0 || block_size < 1 ||
        !(kv_memory_gib >= 0) || !(grace >= 0) || !(idle > 0)) {
        fprintf(stderr, "loom serve: a numeric option is out of range (port 0-65535; counts, sizes and times >= 0)\n");
        return 2;
    }
    int prepend_bos = !strcmp(bos_text, "auto") ? -1 : !strcmp(bos_text, "on") ? 1 : !strcmp(bos_text, "off") ? 0 : -2;
    if (prepend_bos == -2) {
        fprintf(stderr, "loom serve: --bos must be auto, on or off\n");
        return 2;
    }
    lm_server_options o;
    lm_server_options_default(&o);
    o.host = host, o.port = port, o.api_key = api_key, o.model_name = name;
    o.max_connections = max_connections;
    o.shutdown_grace_s = grace, o.idle_timeout_s = idle;
    o.prepend_bos = prepend_bos;
    o.sched.max_queue = max_queue;
    o.sched.max_prefill_tokens = max_prefill;
    o.sched.deterministic = deterministic;
    if (!scheduler) scheduler = buckets ? "bucketed" : "continuous";
    if (!strcmp(scheduler, "bucketed")) {
        if (!buckets) {
            fprintf(stderr, "loom serve: --scheduler bucketed needs --buckets\n");
            return 2;
        }
        o.sched.kind = LM_SCHED_BUCKETED;
        o.sched.spill_to_larger = spill;
        if (!parse_buckets(buckets, &o.sched)) return 2;
    } else if (!strcmp(scheduler, "continuous")) {
        o.sched.kind = LM_SCHED_CONTINUOUS;
    } else if (!strcmp(scheduler, "reference")) {
        o.sched.kind = LM_SCHED_REFERENCE;
    } else {
        fprintf(stderr, "loom serve: --scheduler must be continuous, bucketed or reference\n");
        return 2;
    }
    if (paged && slot_cache) {
        fprintf(stderr, "loom serve: --paged and --slot-cache exclude each other\n");
        return 2;
    }
    if (paged && o.sched.kind != LM_SCHED_CONTINUOUS) {
        fprintf(stderr, "loom serve: --paged goes with the continuous scheduler\n");
        return 2;
    }
    if (buckets && o.sched.kind != LM_SCHED_BUCKETED) {
        fprintf(stderr, "loom serve: --buckets goes with --scheduler bucketed\n");
        return 2;
    }
    lm_device device;
    lm_weights weights;
    if (!cli_parse_device("serve", device_text, &device) || !cli_parse_weights("serve", weights_text, &weights))
        return 2;
    cli_enable_logging(verbose ? 2 : 1);
    if (!cli_trace_start("serve", trace)) return 1;
    lm_model *m = cli_load_model_weights("serve", model_dir, device, weights);
    if (!m) return cli_trace_stop("serve", 1);
    const lm_model_config *cfg = lm_model_get_config(m);
    lm_ctx *ctx = NULL;
    lm_status st;
    rc = 1;
    if (!context) context = cfg->max_position_embeddings < 4096 ? cfg->max_position_embeddings : 4096;
    if (o.sched.kind == LM_SCHED_CONTINUOUS) {
        int64_t per_slot = kv_bytes_per_token(m) * context;
        lm_device_caps caps;
        int host_mem = lm_device_caps_get(device, &caps) == LM_OK && caps.host_addressable;
        double budget = kv_memory_gib > 0 ? kv_memory_gib * 1073741824.0 : 0;
        if (!budget && !host_mem && caps.memory_bytes > 0) /* half of the GPU's memory beside the weights */
            budget = 0.5 * (double)(caps.memory_bytes - lm_model_weight_bytes(m));
        /* paged by default on a GPU; on the CPU a paged row's keys are gathered each step */
        if (!paged && !slot_cache && !host_mem) paged = 1;
        if (paged) { /* the budget buys blocks; slots only bound the rows decoded together */
            int64_t per_block = kv_bytes_per_token(m) * block_size;
            int64_t blocks = budget > 0 ? (int64_t)(budget / (double)per_block) : 0;
            if (!slots) slots = host_mem ? 8 : 256;
            if (!blocks) blocks = (int64_t)slots * ((context + block_size - 1) / block_size);
            if (blocks < (context + block_size - 1) / block_size) {
                fprintf(stderr, "loom serve: the KV budget holds %lld blocks, fewer than one request of %lld positions "
                        "needs\n", (long long)blocks, (long long)context);
                goto done;
            }
            o.sched.paged = 1, o.sched.block_size = block_size, o.sched.kv_blocks = blocks;
            o.sched.slots = slots;
            o.sched.context = context;
            fprintf(stderr, "loom serve: paged KV cache %lld blocks x %d positions = %.1f MiB; up to %d requests of %lld "
                    "positions decode together\n", (long long)blocks, block_size,
                    (double)per_block * (double)blocks / 1048576.0, slots, (long long)context);
        } else {
            if (!slots) {
                double fit = budget > 0 ? budget / (double)per_slot : 8;
                slots = fit > 256 ? 256 : (int)fit;
            }
            if (slots < 1) {
                fprintf(stderr, "loom serve: --kv-memory %.2f GiB holds no slot of %lld positions (%.1f MiB each)\n",
                        budget / 1073741824.0, (long long)context, (double)per_slot / 1048576.0);
                goto done;
            }
            o.sched.slots = slots;
            o.sched.context = context;
            fprintf(stderr, "loom serve: KV cache %d slots x %lld positions = %.1f MiB\n", slots, (long long)context,
                    (double)per_slot * slots / 1048576.0);
        }
    } else if (o.sched.kind == LM_SCHED_REFERENCE) {
        o.sched.context = context;
    }
    if ((st = lm_ctx_create(device, threads, &ctx)) != LM_OK) {
        rc = cli_fail("serve", "cannot create a context", st);
        goto done;
    }
    if ((st = lm_server_create(m, model_dir, &o, &g_server)) != LM_OK) {
        rc = cli_fail("serve", "cannot start the server", st);
        goto done;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    fprintf(stderr, "loom serve: listening on http://%s:%d (model '%s'; Ctrl-C stops)\n", host, lm_server_port(g_server),
            lm_server_model_name(g_server));
    fflush(stderr);
    if ((st = lm_server_run(g_server, ctx)) != LM_OK) {
        rc = cli_fail("serve", "the model loop failed", st);
        goto done;
    }
    fprintf(stderr, "loom serve: stopped\n");
    rc = 0;
done:
    lm_server_destroy(g_server);
    g_server = NULL;
    lm_ctx_destroy(ctx);
    lm_model_destroy(m);
    return cli_trace_stop("serve", rc);
}
