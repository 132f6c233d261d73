/* tools/loom/cmd_chat.c — `loom chat`: an interactive terminal chat on a model with a
 * chat template, on the serving code: the conversation is rendered by the model's
 * template (loom/chat.h), each reply is one request of a single-slot continuous
 * scheduler (loom/serve.h), streamed to stdout as it is generated.
 *
 * Lines typed are user messages; "/reset" forgets the conversation, "/exit" (or end of
 * input) quits. A conversation that no longer fits the context is refused with a hint
 * to /reset.
 */
#include "args.h"
#include "commands.h"
#include "common.h"
#include "loom/chat.h"
#include "loom/serve.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct reply {
    char *text;
    size_t len, cap;
    int done;
    lm_finish_reason reason;
    char error[256];
} reply;

static int on_event(void *user, const lm_serve_event *ev) {
    reply *r = user;
    fwrite(ev->text, 1, ev->len, stdout);
    fflush(stdout);
    if (r->len + ev->len + 1 > r->cap) {
        size_t cap = (r->len + ev->len + 1) * 2;
        char *grown = realloc(r->text, cap);
        if (!grown) return 1; /* cancel: no room to keep the reply */
        r->text = grown, r->cap = cap;
    }
    memcpy(r->text + r->len, ev->text, ev->len);
    r->len += ev->len;
    r->text[r->len] = 0;
    if (ev->kind == LM_SERVE_FINISH) {
        r->done = 1;
        r->reason = ev->reason;
        snprintf(r->error, sizeof r->error, "%s", ev->message);
    }
    return 0;
}

int cmd_chat(int argc, char **argv) {
    const char *model_dir = NULL, *device_text = NULL, *weights_text = NULL, *system = NULL;
    int max_tokens = 512, threads = 0, context = 0;
    float temperature = 0.7f, top_p = 1.0f;
    uint64_t seed = 0;
    const cli_opt opts[] = {
        {"model", CLI_STRING, &model_dir, "DIR: model directory with tokenizer.json and a chat template (required)"},
        {"device", CLI_STRING, &device_text, "DEV: cpu (default), cuda or cuda:N"},
        CLI_WEIGHTS_OPT(&weights_text),
        {"system", CLI_STRING, &system, "TEXT: a system message at the start of the conversation"},
        {"max-tokens", CLI_INT, &max_tokens, "N: longest reply (default 512)"},
        {"temperature", CLI_FLOAT, &temperature, "T: sampling temperature (default 0.7; 0 = greedy)"},
        {"top-p", CLI_FLOAT, &top_p, "P: nucleus sampling (default 1 = off)"},
        {"seed", CLI_U64, &seed, "S: random seed (default 0)"},
        {"context", CLI_INT, &context, "N: conversation length limit in tokens (default min(4096, the model's))"},
        {"threads", CLI_COUNT, &threads, "N: CPU threads (default: all)"},
        {NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos;
    int rc = cli_parse("chat", "--model DIR [--system TEXT] [options]", opts, argc, argv, pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (!model_dir) {
        fprintf(stderr, "loom chat: --model is required\n");
        return 2;
    }
    if (max_tokens < 1 || context < 0 || threads < 0 || !(temperature >= 0) || !(top_p > 0 && top_p <= 1)) {
        fprintf(stderr, "loom chat: --max-tokens >= 1, --temperature >= 0, --top-p in (0, 1], counts >= 0\n");
        return 2;
    }
    lm_device device;
    lm_weights weights;
    if (!cli_parse_device("chat", device_text, &device) || !cli_parse_weights("chat", weights_text, &weights))
        return 2;
    lm_model *m = NULL;
    lm_tokenizer *tok = NULL;
    lm_chat_template *tpl = NULL;
    lm_scheduler *sched = NULL;
    lm_ctx *ctx = NULL;
    json_t *history = json_array();
    char line[16384];
    lm_status st;
    rc = 1;
    char path[1200];
    if ((st = lm_chat_template_load(model_dir, &tpl)) != LM_OK) {
        rc = cli_fail("chat", "cannot load the chat template", st);
        goto done;
    }
    if ((st = lm_tokenizer_load(cli_model_tokenizer_path(model_dir, path, sizeof path), &tok)) != LM_OK) {
        rc = cli_fail("chat", "cannot load tokenizer.json", st);
        goto done;
    }
    if (!(m = cli_load_model_weights("chat", model_dir, device, weights))) goto done;
    int64_t max_pos = lm_model_get_config(m)->max_position_embeddings;
    lm_sched_options so;
    lm_sched_options_default(&so);
    so.slots = 1;
    so.context = context ? context : (max_pos < 4096 ? max_pos : 4096);
    if ((st = lm_ctx_create(device, threads, &ctx)) != LM_OK || (st = lm_scheduler_create(m, tok, &so, &sched)) != LM_OK) {
        rc = cli_fail("chat", "cannot set up the model", st);
        goto done;
    }
    if (system) json_array_append_new(history, json_pack("{s:s, s:s}", "role", "system", "content", system));
    fprintf(stderr, "loom chat: %s (context %lld tokens). /reset forgets, /exit quits.\n", model_dir, (long long)so.context);
    for (uint64_t turn = 0;; turn++) {
        fputs("> ", stderr);
        fflush(stderr);
        if (!fgets(line, sizeof line, stdin)) break;
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (!n) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            json_array_clear(history);
            if (system) json_array_append_new(history, json_pack("{s:s, s:s}", "role", "system", "content", system));
            fprintf(stderr, "(conversation cleared)\n");
            continue;
        }
        json_t *msg = json_pack("{s:s, s:s%}", "role", "user", "content", line, n);
        if (!msg) {
            fprintf(stderr, "loom chat: the message is not valid UTF-8\n");
            continue;
        }
        json_array_append_new(history, msg);
        char *messages = json_dumps(history, JSON_COMPACT), *prompt = NULL;
        int32_t *ids = NULL;
        size_t nids = 0;
        st = messages ? lm_chat_template_render(tpl, messages, NULL, 1, NULL, &prompt) : LM_OUT_OF_MEMORY;
        free(messages);
        if (st == LM_OK) st = lm_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &nids);
        lm_free(prompt);
        lm_serve_params p;
        lm_serve_params_default(&p);
        p.sampler.greedy = temperature == 0;
        p.sampler.temperature = temperature;
        p.sampler.top_p = top_p;
        p.sampler.seed = seed + turn;
        p.decode_flags = LM_TOKENIZER_SKIP_SPECIAL;
        int64_t room = so.context - (int64_t)nids;
        p.max_tokens = room < max_tokens ? room : max_tokens;
        reply r = {0};
        int64_t id = 0;
        if (st == LM_OK && p.max_tokens < 1) {
            fprintf(stderr, "loom chat: the conversation (%zu tokens) fills the context of %lld; /reset to start over\n",
                    nids, (long long)so.context);
            json_array_remove(history, json_array_size(history) - 1);
            lm_free(ids);
            continue;
        }
        if (st == LM_OK) st = lm_scheduler_submit(sched, ids, nids, &p, on_event, &r, &id);
        lm_free(ids);
        int busy = 1;
        while (st == LM_OK && busy && !r.done) st = lm_scheduler_step(sched, ctx, &busy);
        fputc('\n', stdout);
        fflush(stdout);
        if (st != LM_OK || r.reason == LM_FINISH_ERROR) {
            if (st == LM_OK) fprintf(stderr, "loom chat: %s\n", r.error);
            else cli_fail("chat", "this turn failed", st);
            json_array_remove(history, json_array_size(history) - 1);
            free(r.text);
            continue;
        }
        json_array_append_new(history, json_pack("{s:s, s:s%}", "role", "assistant", "content", r.text ? r.text : "", r.len));
        free(r.text);
    }
    rc = 0;
done:
    json_decref(history);
    lm_scheduler_destroy(sched);
    lm_ctx_destroy(ctx);
    lm_model_destroy(m);
    lm_chat_template_destroy(tpl);
    lm_tokenizer_destroy(tok);
    return rc;
}
