/* The generation loop end to end on a reference checkpoint: greedy ids equal
 * transformers' continuation, streamed text equals the lossy decode of the ids, a
 * stop string cuts the text before its first occurrence (and is never streamed),
 * eos ids and the callback stop generation, seeded sampling repeats, and bad
 * parameters fail with the right status.
 * LM_TEST_LABELS: unit model
 */
#include "harness.h"
#include "loom/generate.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODEL LOOM_SOURCE_DIR "/tests/data/models/qwen3_headdim"
#define TOKENIZER LOOM_SOURCE_DIR "/tests/data/train/tokenizer.json" /* byte-level BPE, 384 ids */

typedef struct collected {
    char text[4096];
    size_t len;
    int32_t ids[256];
    int n, final_calls, stop_after;
} collected;

static int collect(void *user, int32_t id, const char *text, size_t len) {
    collected *c = user;
    if (c->len + len < sizeof c->text) {
        memcpy(c->text + c->len, text, len);
        c->len += len;
    }
    if (id < 0) c->final_calls++;
    else if (c->n < 256) c->ids[c->n++] = id;
    return c->stop_after && c->n >= c->stop_after;
}

static lm_model *g_model;
static lm_tokenizer *g_tok;
static lm_ctx *g_ctx;
static int32_t g_prompt[64];
static size_t g_nprompt;
static int64_t g_greedy[64], g_ngreedy;

static lm_generate_params greedy_params(int64_t max_new) {
    lm_generate_params p = {0};
    p.max_new_tokens = max_new;
    p.sampler = lm_sampler_params_default();
    p.sampler.greedy = 1;
    p.ignore_eos = 1;
    p.decode_flags = LM_TOKENIZER_SKIP_SPECIAL;
    return p;
}

static void test_greedy_ids_and_streamed_text(void) {
    collected c = {0};
    lm_generate_params p = greedy_params(g_ngreedy);
    lm_generate_result res;
    LT_CHECK_OK(lm_generate(g_model, g_ctx, g_tok, g_prompt, g_nprompt, &p, collect, &c, &res));
    LT_CHECK(res.reason == LM_STOP_LENGTH && res.new_tokens == g_ngreedy && c.n == g_ngreedy && c.final_calls == 1);
    for (int i = 0; i < c.n && i < g_ngreedy; i++) LT_CHECK_MSG(c.ids[i] == g_greedy[i], "token %d differs", i);
    char *want = NULL;
    size_t wlen = 0;
    LT_CHECK_OK(lm_tokenizer_decode(g_tok, c.ids, (size_t)c.n, LM_TOKENIZER_SKIP_SPECIAL | LM_TOKENIZER_LOSSY, &want, &wlen));
    LT_CHECK_MSG(wlen == c.len && memcmp(want, c.text, wlen) == 0, "streamed text differs from the decode of the ids");
    lm_free(want);
}

static void test_stop_string_cuts_before_its_first_occurrence(void) {
    collected full = {0};
    lm_generate_params p = greedy_params(g_ngreedy);
    LT_CHECK_OK(lm_generate(g_model, g_ctx, g_tok, g_prompt, g_nprompt, &p, collect, &full, NULL));
    /* a 2-byte stop string taken from the middle of the text, at a character start */
    size_t at = full.len / 2;
    while (at > 0 && ((unsigned char)full.text[at] & 0xC0) == 0x80) at--;
    LT_CHECK(full.len >= 4);
    char stop[8] = {0};
    memcpy(stop, full.text + at, 2);
    const char *first = NULL;
    for (size_t i = 0; i + 2 <= full.len && !first; i++)
        if (memcmp(full.text + i, stop, 2) == 0) first = full.text + i;
    const char *stops[1] = {stop};
    p.stop = stops;
    p.n_stop = 1;
    collected cut = {0};
    lm_generate_result res;
    LT_CHECK_OK(lm_generate(g_model, g_ctx, g_tok, g_prompt, g_nprompt, &p, collect, &cut, &res));
    LT_CHECK(res.reason == LM_STOP_STRING);
    size_t keep = first ? (size_t)(first - full.text) : 0;
    LT_CHECK_MSG(cut.len == keep && memcmp(cut.text, full.text, keep) == 0, "stop text: got %zu bytes, want %zu", cut.len,
                 keep);
}

static void test_eos_and_callback_stop_generation(void) {
    /* a copy of the model whose eos id is the 5th greedy token */
    char dir[] = "/tmp/loom_gen_XXXXXX";
    LT_CHECK(mkdtemp(dir) != NULL);
    char *cfg = NULL, path[512];
    size_t n = 0;
    LT_CHECK_OK(lm_file_read_all(MODEL "/config.json", &cfg, &n));
    char *pos = strstr(cfg, "\"eos_token_id\": 2");
    LT_CHECK(pos != NULL);
    if (!pos) return;
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "%.*s\"eos_token_id\": %lld%s", (int)(pos - cfg), cfg, (long long)g_greedy[4], pos + strlen("\"eos_token_id\": 2"));
    fclose(f);
    lm_free(cfg);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    LT_CHECK(symlink(MODEL "/model.safetensors", path) == 0);
    lm_model *m = NULL;
    LT_CHECK_OK(lm_model_load(dir, lm_device_cpu(), &m));
    int first = 0;
    while (g_greedy[first] != g_greedy[4]) first++;
    lm_generate_params p = greedy_params(g_ngreedy);
    p.ignore_eos = 0;
    collected c = {0};
    lm_generate_result res;
    LT_CHECK_OK(lm_generate(m, g_ctx, g_tok, g_prompt, g_nprompt, &p, collect, &c, &res));
    LT_CHECK_MSG(res.reason == LM_STOP_EOS && res.new_tokens == first + 1, "reason %d after %lld tokens", (int)res.reason,
                 (long long)res.new_tokens);
    lm_model_destroy(m);
    remove(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    remove(path);
    rmdir(dir);
    collected cb = {0};
    cb.stop_after = 3;
    LT_CHECK_OK(lm_generate(g_model, g_ctx, g_tok, g_prompt, g_nprompt, &p, collect, &cb, &res));
    LT_CHECK(res.reason == LM_STOP_CALLBACK && res.new_tokens == 3);
}

static void test_seeded_sampling_repeats(void) {
    lm_generate_params p = greedy_params(12);
    p.sampler.greedy = 0;
    p.sampler.temperature = 0.9f;
    p.sampler.top_p = 0.95f;
    p.sampler.seed = 77;
    collected a = {0}, b = {0};
    LT_CHECK_OK(lm_generate(g_model, g_ctx, NULL, g_prompt, g_nprompt, &p, collect, &a, NULL));
    LT_CHECK_OK(lm_generate(g_model, g_ctx, NULL, g_prompt, g_nprompt, &p, collect, &b, NULL));
    LT_CHECK(a.n == 12 && b.n == 12 && memcmp(a.ids, b.ids, sizeof(int32_t) * 12) == 0 && a.len == 0);
}

static void test_bad_parameters(void) {
    lm_generate_params p = greedy_params(4);
    LT_CHECK_STATUS(lm_generate(g_model, g_ctx, g_tok, g_prompt, 0, &p, NULL, NULL, NULL), LM_INVALID_ARGUMENT);
    p.max_new_tokens = 0;
    LT_CHECK_STATUS(lm_generate(g_model, g_ctx, g_tok, g_prompt, g_nprompt, &p, NULL, NULL, NULL), LM_INVALID_ARGUMENT);
    p.max_new_tokens = 4000;
    LT_CHECK_STATUS(lm_generate(g_model, g_ctx, g_tok, g_prompt, g_nprompt, &p, NULL, NULL, NULL), LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "max_position_embeddings") != NULL);
    p.max_new_tokens = 4;
    const char *stops[1] = {"x"};
    p.stop = stops;
    p.n_stop = 1;
    LT_CHECK_STATUS(lm_generate(g_model, g_ctx, NULL, g_prompt, g_nprompt, &p, NULL, NULL, NULL), LM_INVALID_ARGUMENT);
    const char *empty[1] = {""};
    p.stop = empty;
    LT_CHECK_STATUS(lm_generate(g_model, g_ctx, g_tok, g_prompt, g_nprompt, &p, NULL, NULL, NULL), LM_INVALID_ARGUMENT);
    int32_t bad = 1 << 20;
    p.n_stop = 0;
    LT_CHECK_STATUS(lm_generate(g_model, g_ctx, g_tok, &bad, 1, &p, NULL, NULL, NULL), LM_OUT_OF_RANGE);
}

int main(void) {
    lt_fixture fx;
    if (!lt_fixture_load("tests/data/models/qwen3_headdim/refs.lmfx", &fx)) return lt_finish();
    const lt_fixture_tensor *ids = lt_fixture_get(&fx, "prompt0_ids"), *greedy = lt_fixture_get(&fx, "prompt0_greedy");
    g_nprompt = (size_t)ids->numel;
    for (size_t i = 0; i < g_nprompt; i++) g_prompt[i] = (int32_t)ids->i64[i];
    g_ngreedy = greedy->numel;
    for (int64_t i = 0; i < g_ngreedy; i++) g_greedy[i] = greedy->i64[i];
    lt_fixture_free(&fx);
    LT_CHECK_OK(lm_model_load(MODEL, lm_device_cpu(), &g_model));
    LT_CHECK_OK(lm_tokenizer_load(TOKENIZER, &g_tok));
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ctx));
    LT_RUN(test_greedy_ids_and_streamed_text);
    LT_RUN(test_stop_string_cuts_before_its_first_occurrence);
    LT_RUN(test_eos_and_callback_stop_generation);
    LT_RUN(test_seeded_sampling_repeats);
    LT_RUN(test_bad_parameters);
    lm_ctx_destroy(g_ctx);
    lm_tokenizer_destroy(g_tok);
    lm_model_destroy(g_model);
    return lt_finish();
}
