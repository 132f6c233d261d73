/* generate.c — the smallest loom program: load a model directory (config.json,
 * model.safetensors and tokenizer.json beside them), encode a prompt and print its
 * greedy continuation as it streams.
 *
 *     ./generate MODEL_DIR ["prompt" [max_new_tokens]]
 */
#include <loom/loom.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int print_text(void *user, int32_t id, const char *text, size_t len) {
    (void)user, (void)id;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0; /* keep going */
}

static int fail(const char *what, lm_status st) {
    fprintf(stderr, "generate: %s: %s (%s)\n", what, lm_status_str(st), lm_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: %s MODEL_DIR [PROMPT [MAX_NEW_TOKENS]]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    const char *prompt = argc > 2 ? argv[2] : "Once upon a time";
    int max_new = argc > 3 ? atoi(argv[3]) : 32;
    if (max_new < 1) max_new = 1;
    fprintf(stderr, "loom %s (headers %s)\n", lm_version(), LM_VERSION_STRING);

    lm_model *model = NULL;
    lm_tokenizer *tok = NULL;
    lm_ctx *ctx = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = 1;
    char path[4096];
    lm_status st;

    if ((st = lm_model_load(dir, lm_device_cpu(), &model)) != LM_OK) {
        rc = fail("cannot load the model", st);
        goto done;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if ((st = lm_tokenizer_load(path, &tok)) != LM_OK) {
        rc = fail("cannot load the tokenizer", st);
        goto done;
    }
    if ((st = lm_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n_ids)) != LM_OK) {
        rc = fail("cannot encode the prompt", st);
        goto done;
    }
    if ((st = lm_ctx_create(lm_device_cpu(), 0, &ctx)) != LM_OK) { /* 0: one thread per CPU */
        rc = fail("cannot create a context", st);
        goto done;
    }
    lm_generate_params p = {0};
    p.max_new_tokens = max_new;
    p.sampler = lm_sampler_params_default();
    p.sampler.greedy = 1;
    p.decode_flags = LM_TOKENIZER_SKIP_SPECIAL;
    lm_generate_result res;
    printf("%s", prompt);
    if ((st = lm_generate(model, ctx, tok, ids, n_ids, &p, print_text, NULL, &res)) != LM_OK) {
        printf("\n");
        rc = fail("generation failed", st);
        goto done;
    }
    printf("\n");
    fprintf(stderr, "%lld prompt tokens, %lld new\n", (long long)res.prompt_tokens, (long long)res.new_tokens);
    rc = 0;
done:
    lm_free(ids);
    lm_ctx_destroy(ctx);
    lm_tokenizer_destroy(tok);
    lm_model_destroy(model);
    return rc;
}
