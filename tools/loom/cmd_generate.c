/* tools/loom/cmd_generate.c — `loom generate`: sample a continuation of a text prompt
 * (streamed to stdout as it is produced) or of token ids (--print-ids prints the new
 * ids as one JSON array: a contract other tools parse). --device cuda runs the model
 * on a GPU, where tokens are picked on the device unless a repetition penalty is set. */
#include "args.h"
#include "commands.h"
#include "common.h"
#include "loom/config.h"
#include "loom/generate.h"

#include <stdlib.h>
#include <string.h>

typedef struct out_state {
    int print_ids;
    int32_t *ids; /* [cap] generated ids when print_ids */
    size_t n, cap;
} out_state;

static int on_token(void *user, int32_t id, const char *text, size_t len) {
    out_state *o = user;
    if (o->print_ids) {
        if (id >= 0 && o->n < o->cap) o->ids[o->n++] = id;
        return 0;
    }
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static const char *k_reasons[] = {"length", "eos", "stop string", "callback"};

int cmd_generate(int argc, char **argv) {
    const char *model_dir = NULL, *prompt = NULL, *ids_text = NULL, *tok_path = NULL, *stop = NULL, *device_text = NULL, *weights_text = NULL;
    const char *trace = NULL;
    int max_new = 64, greedy = 0, print_ids = 0, ignore_eos = 0, threads = 0, stats = 0, bos = 0, top_k = -1;
    float temperature = -1, top_p = -1, min_p = 0, rep = 1;
    uint64_t seed = 0;
    const cli_opt opts[] = {
        {"model", CLI_STRING, &model_dir, "DIR: Hugging Face model directory (default: loom's default model)"},
        {"prompt", CLI_STRING, &prompt, "TEXT: prompt text (encoded with the model's tokenizer.json)"},
        {"ids", CLI_STRING, &ids_text, "1,2,3: prompt as token ids instead of text"},
        {"tokenizer", CLI_STRING, &tok_path, "FILE: tokenizer.json (default: DIR/tokenizer.json)"},
        {"max-new", CLI_COUNT, &max_new, "N: most tokens to generate, >= 1; the prompt and these must fit in the "
                                         "model's context (max_position_embeddings) (default 64)"},
        {"greedy", CLI_FLAG, &greedy, "always take the most likely token"},
        {"temperature", CLI_NONNEG, &temperature, "T: sampling temperature (default: generation_config.json, else 1)"},
        {"top-k", CLI_COUNT, &top_k, "K: keep the K most likely tokens (0 = off)"},
        {"top-p", CLI_NONNEG, &top_p, "P: keep the smallest set with probability >= P (1 = off)"},
        {"min-p", CLI_NONNEG, &min_p, "P: drop tokens below P times the top probability (0 = off)"},
        {"repetition-penalty", CLI_NONNEG, &rep, "R: penalize tokens already seen (1 = off)"},
        {"seed", CLI_U64, &seed, "S: random seed (default 0); the same seed repeats the same text"},
        {"stop", CLI_STRING, &stop, "TEXT: stop when this text is generated (it is not printed)"},
        {"ignore-eos", CLI_FLAG, &ignore_eos, "do not stop at the model's end-of-sequence tokens"},
        {"bos", CLI_FLAG, &bos, "prepend the model's bos_token_id to the prompt"},
        {"print-ids", CLI_FLAG, &print_ids, "print the generated ids as one JSON array instead of text"},
        {"threads", CLI_COUNT, &threads, "N: CPU threads (default: all)"},
        {"stats", CLI_FLAG, &stats, "print timing to stderr at the end"},
        {"device", CLI_STRING, &device_text, "DEV: cpu (default), cuda or cuda:N"},
        CLI_WEIGHTS_OPT(&weights_text),
        CLI_TRACE_OPT(&trace),
        {NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos;
    int rc = cli_parse("generate", "[--model DIR] (--prompt TEXT | --ids 1,2,3) [options]", opts, argc, argv, pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (!prompt == !ids_text) {
        fprintf(stderr, "loom generate: exactly one of --prompt or --ids is required\n");
        return 2;
    }
    if (max_new < 1) {
        fprintf(stderr, "loom generate: --max-new must be >= 1 (got %d)\n", max_new);
        return 2;
    }
    /* the sampler's ranges, said before the model loads (top_p -1: not given) */
    const char *bad = NULL;
    float got = 0;
    if (top_p == 0 || top_p > 1) bad = "--top-p must be in (0, 1]", got = top_p;
    else if (min_p >= 1) bad = "--min-p must be in [0, 1)", got = min_p;
    else if (rep == 0) bad = "--repetition-penalty must be > 0", got = rep;
    if (bad) {
        fprintf(stderr, "loom generate: %s (got %g)\n", bad, got);
        return 2;
    }
    lm_device device;
    lm_weights weights;
    if (!cli_parse_device("generate", device_text, &device) || !cli_parse_weights("generate", weights_text, &weights))
        return 2;
    if (!model_dir && !(model_dir = cli_default_model("generate"))) return 1;
    if (!cli_trace_start("generate", trace)) return 1;
    /* --max-new against the context from config.json alone, before the weights load:
     * the prompt takes at least one position */
    lm_model_config pre;
    lm_status st = lm_model_config_load(model_dir, &pre);
    if (st != LM_OK) {
        char what[1200];
        snprintf(what, sizeof what, "cannot load model '%s'", model_dir);
        return cli_fail("generate", what, st);
    }
    if (max_new >= pre.max_position_embeddings) {
        fprintf(stderr, "loom generate: --max-new %d does not fit the model's context of %lld positions "
                        "(max_position_embeddings): at most %lld new tokens after a one-token prompt\n",
                max_new, (long long)pre.max_position_embeddings, (long long)pre.max_position_embeddings - 1);
        return 2;
    }
    lm_model *m = NULL;
    lm_tokenizer *tok = NULL;
    lm_ctx *ctx = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    out_state out = {print_ids, NULL, 0, 0};
    rc = 1;
    char tpath[1200];
    if (!tok_path && (prompt || !print_ids)) tok_path = cli_model_tokenizer_path(model_dir, tpath, sizeof tpath);
    if (ids_text && !cli_parse_ids(ids_text, &ids, &n)) return 2;
    if (!(m = cli_load_model_weights("generate", model_dir, device, weights))) goto done;
    const lm_model_config *cfg = lm_model_get_config(m);
    if (tok_path && (st = lm_tokenizer_load(tok_path, &tok)) != LM_OK) {
        char what[1300];
        snprintf(what, sizeof what, "cannot load tokenizer '%s'", tok_path);
        rc = cli_fail("generate", what, st);
        goto done;
    }
    if (bos && cfg->bos_token_id < 0) {
        fprintf(stderr, "loom generate: --bos given but the model's config has no bos_token_id\n");
        rc = 2;
        goto done;
    }
    if (prompt) {
        int32_t *enc = NULL;
        size_t nenc = 0;
        int64_t tr = lm_trace_begin();
        st = lm_tokenizer_encode(tok, prompt, strlen(prompt), &enc, &nenc);
        lm_trace_end(tr, "generate", "tokenize", NULL);
        if (st != LM_OK) {
            rc = cli_fail("generate", "cannot encode the prompt", st);
            goto done;
        }
        ids = malloc(sizeof(int32_t) * (nenc + 1));
        if (ids && nenc) memcpy(ids, enc, nenc * sizeof *enc);
        lm_free(enc);
        n = nenc;
    }
    if (ids && bos) { /* ids has room for one more: shift right and put bos first */
        int32_t *grown = prompt ? ids : realloc(ids, sizeof(int32_t) * (n + 1));
        if (grown) {
            memmove(grown + 1, grown, n * sizeof *grown);
            grown[0] = (int32_t)cfg->bos_token_id;
            n++;
        } else {
            free(ids);
        }
        ids = grown;
    }
    if (!ids) {
        fprintf(stderr, "loom generate: out of memory for the prompt's %zu ids\n", n + 1);
        goto done;
    }
    if ((int64_t)n + max_new > cfg->max_position_embeddings) {
        fprintf(stderr, "loom generate: the prompt's %zu tokens and --max-new %d exceed the model's context of %lld "
                        "positions (max_position_embeddings): at most %lld new tokens fit\n",
                n, max_new, (long long)cfg->max_position_embeddings,
                (long long)((int64_t)n < cfg->max_position_embeddings ? cfg->max_position_embeddings - (int64_t)n : 0));
        rc = 2;
        goto done;
    }
    lm_generate_params p = {0};
    p.max_new_tokens = max_new;
    p.sampler = lm_sampler_params_default();
    const lm_generation_defaults *g = &cfg->generation;
    p.sampler.greedy = greedy || (g->present && !g->do_sample && temperature < 0 && top_p < 0 && top_k < 0);
    p.sampler.temperature = temperature >= 0 ? temperature : (float)g->temperature;
    p.sampler.top_k = top_k >= 0 ? top_k : (g->present ? (int)g->top_k : 0);
    p.sampler.top_p = top_p >= 0 ? top_p : (float)g->top_p;
    p.sampler.min_p = min_p;
    p.sampler.repetition_penalty = rep;
    p.sampler.seed = seed;
    p.stop = &stop;
    p.n_stop = stop ? 1 : 0;
    p.ignore_eos = ignore_eos;
    p.decode_flags = LM_TOKENIZER_SKIP_SPECIAL;
    if (print_ids && !(out.ids = malloc(sizeof(int32_t) * (size_t)max_new))) {
        fprintf(stderr, "loom generate: out of memory for %d generated ids\n", max_new);
        goto done;
    }
    out.cap = (size_t)max_new;
    if ((st = lm_ctx_create(device, threads, &ctx)) != LM_OK) {
        rc = cli_fail("generate", "cannot create a context", st);
        goto done;
    }
    lm_generate_result res;
    st = lm_generate(m, ctx, print_ids ? NULL : tok, ids, n, &p, on_token, &out, &res);
    if (st != LM_OK) {
        if (!print_ids) printf("\n");
        rc = cli_fail("generate", "generation failed", st);
        goto done;
    }
    if (print_ids) {
        printf("[");
        for (size_t i = 0; i < out.n; i++) printf("%s%d", i ? "," : "", out.ids[i]);
        printf("]\n");
    } else {
        printf("\n");
    }
    fflush(stdout); /* the text first, then the timing line on stderr */
    if (stats)
        fprintf(stderr, "loom generate: %lld prompt tokens in %.3f s (%.1f tok/s), %lld new in %.3f s (%.1f tok/s), stop: %s\n",
                (long long)res.prompt_tokens, res.prefill_seconds, res.prompt_tokens / (res.prefill_seconds + 1e-12),
                (long long)res.new_tokens, res.decode_seconds,
                res.new_tokens > 1 ? (res.new_tokens - 1) / (res.decode_seconds + 1e-12) : 0.0, k_reasons[res.reason]);
    rc = 0;
done:
    free(ids);
    free(out.ids);
    lm_ctx_destroy(ctx);
    lm_tokenizer_destroy(tok);
    lm_model_destroy(m);
    return cli_trace_stop("generate", rc);
}
