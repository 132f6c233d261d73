/* The OpenAI request parser (serve/openai.c): every field lands in the request with
 * its OpenAI meaning and defaults; wrong types and values are refused naming the
 * field; unsupported fields are refused rather than ignored; unknown fields are
 * ignored; and a deterministic mutation loop (the fuzz target's body, fuzz/
 * fuzz_openai_request.c, run over byte mutations of real bodies) never crashes, leaks
 * or fails without saying why (ASan/UBSan in the sanitize build).
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "serve/openai.h"

#include <string.h>

static lm_status parse(const char *body, lm__oai_kind kind, lm__oai_request *r, char *param) {
    return lm__oai_parse(body, strlen(body), kind, r, param, 64);
}

static void test_fields_and_defaults(void) {
    lm__oai_request r;
    char param[64];
    LT_CHECK_OK(parse("{\"prompt\": \"hi\"}", LM__OAI_COMPLETION, &r, param));
    LT_CHECK(!strcmp(r.prompt, "hi") && r.params.max_tokens == -1 && r.n == 1 && !r.stream && !r.logprobs);
    LT_CHECK(r.params.sampler.temperature == 1.0f && !r.params.sampler.greedy && r.params.sampler.top_p == 1.0f);
    LT_CHECK(r.params.decode_flags == LM_TOKENIZER_SKIP_SPECIAL && r.params.n_stop == 0 && !r.model);
    lm__oai_request_free(&r);
    LT_CHECK_OK(parse("{\"model\": \"m\", \"prompt\": [1, 2, 3], \"max_tokens\": 7, \"temperature\": 0, \"top_p\": 0.5, "
                      "\"top_k\": 4, \"min_p\": 0.1, \"seed\": 99, \"stop\": [\"a\", \"\", \"bc\"], \"n\": 3, "
                      "\"presence_penalty\": 0.5, \"frequency_penalty\": -1, \"repetition_penalty\": 1.1, "
                      "\"logprobs\": 2, \"stream\": true, \"stream_options\": {\"include_usage\": true}, "
                      "\"ignore_eos\": true, \"skip_special_tokens\": false, \"user\": \"x\", \"unknown\": [1]}",
                      LM__OAI_COMPLETION, &r, param));
    LT_CHECK(!strcmp(r.model, "m") && r.n_prompt_ids == 3 && r.prompt_ids[2] == 3 && r.params.max_tokens == 7);
    LT_CHECK(r.params.sampler.greedy && r.params.sampler.top_p == 0.5f && r.params.sampler.top_k == 4 &&
             r.params.sampler.seed == 99 && r.params.sampler.repetition_penalty == 1.1f);
    LT_CHECK(r.params.n_stop == 2 && !strcmp(r.params.stop[0], "a") && !strcmp(r.params.stop[1], "bc")); /* "" dropped */
    LT_CHECK(r.n == 3 && r.stream && r.include_usage && r.logprobs && r.params.logprobs && r.params.top_logprobs == 2);
    LT_CHECK(r.params.presence_penalty == 0.5f && r.params.frequency_penalty == -1.0f && r.params.ignore_eos &&
             r.params.decode_flags == 0);
    lm__oai_request_free(&r);
    /* chat: text parts joined; tools and template kwargs kept as JSON; logprobs is a bool */
    LT_CHECK_OK(parse("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, "
                      "{\"type\": \"text\", \"text\": \"b\"}]}], \"tools\": [{\"type\": \"function\"}], "
                      "\"chat_template_kwargs\": {\"enable_thinking\": false}, \"logprobs\": true, \"top_logprobs\": 5, "
                      "\"max_completion_tokens\": 9, \"add_generation_prompt\": false}",
                      LM__OAI_CHAT, &r, param));
    LT_CHECK(r.messages_json && strstr(r.messages_json, "\"content\":\"ab\"") && r.tools_json &&
             strstr(r.template_kwargs, "enable_thinking") && r.logprobs && r.params.top_logprobs == 5 &&
             r.params.max_tokens == 9 && !r.add_generation_prompt);
    lm__oai_request_free(&r);
}

static void test_refusals_name_the_field(void) {
    static const struct {
        lm__oai_kind kind;
        const char *body, *param;
        lm_status st;
    } cases[] = {
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\"", "", LM_PARSE_ERROR},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"prompt\": \"y\"}", "", LM_PARSE_ERROR}, /* duplicate keys */
        {LM__OAI_COMPLETION, "\"just a string\"", "", LM_PARSE_ERROR},
        {LM__OAI_COMPLETION, "[1, 2]", "", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{}", "prompt", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": []}", "prompt", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": [\"a\", \"b\"]}", "prompt", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": [1, -2]}", "prompt", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": 5}", "prompt", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"model\": 1}", "model", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": 1.5}", "max_tokens", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": -1}", "max_tokens", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"temperature\": \"hot\"}", "temperature", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"temperature\": 2.5}", "temperature", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"top_p\": 1.5}", "top_p", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"top_k\": -5}", "top_k", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"min_p\": 1}", "min_p", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"seed\": \"1\"}", "seed", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"n\": 0}", "n", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"stop\": 3}", "stop", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION,
         "{\"prompt\": \"x\", \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\","
         "\"14\",\"15\",\"16\",\"17\"]}",
         "stop", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"presence_penalty\": 3}", "presence_penalty", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": 21}", "logprobs", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"stream\": 1}", "stream", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"stream_options\": true}", "stream_options", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"echo\": true}", "echo", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"suffix\": \"s\"}", "suffix", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"best_of\": 2}", "best_of", LM_INVALID_ARGUMENT},
        {LM__OAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": 10}}", "logit_bias", LM_INVALID_ARGUMENT},
        {LM__OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
                       "{\"type\": \"json_object\"}}", "response_format", LM_INVALID_ARGUMENT},
        {LM__OAI_CHAT, "{\"messages\": {}}", "messages", LM_INVALID_ARGUMENT},
        {LM__OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages", LM_INVALID_ARGUMENT},
        {LM__OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", "messages",
         LM_INVALID_ARGUMENT},
        {LM__OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}", "top_logprobs",
         LM_INVALID_ARGUMENT},
        {LM__OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": {}}", "tools",
         LM_INVALID_ARGUMENT},
        {LM__OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": []}",
         "chat_template_kwargs", LM_INVALID_ARGUMENT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        lm__oai_request r;
        char param[64];
        lm_status st = parse(cases[i].body, cases[i].kind, &r, param);
        LT_CHECK_MSG(st == cases[i].st && !strcmp(param, cases[i].param) && lm_last_error()[0],
                     "case %zu: %s, param '%s' (want %s, '%s'): %s", i, lm_status_name(st), param,
                     lm_status_name(cases[i].st), cases[i].param, lm_last_error());
        lm__oai_request_free(&r);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The fuzz target's body over byte mutations of real request bodies. */
static void test_mutations_never_crash(void) {
    static const char *seeds[] = {
        "{\"model\": \"m\", \"prompt\": \"Hello\", \"max_tokens\": 16, \"temperature\": 0.7, \"stop\": [\"\\n\"], "
        "\"stream\": true, \"stream_options\": {\"include_usage\": true}, \"logprobs\": 3, \"n\": 2}",
        "{\"prompt\": [1, 2, 3, 4], \"seed\": 5, \"top_p\": 0.9, \"top_k\": 40, \"presence_penalty\": 0.5}",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": [{\"type\": "
        "\"text\", \"text\": \"a\"}]}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
        "\"logprobs\": true, \"top_logprobs\": 2, \"chat_template_kwargs\": {\"x\": 1}}",
    };
    lt_rng g = lt_rng_seed(2024);
    char buf[1024];
    for (int it = 0; it < 20000; it++) {
        const char *s = seeds[it % 3];
        size_t n = strlen(s);
        memcpy(buf, s, n);
        int edits = (int)lt_rng_int(&g, 1, 6);
        for (int e = 0; e < edits; e++) {
            size_t at = (size_t)lt_rng_int(&g, 0, (int64_t)n - 1);
            int op = (int)lt_rng_int(&g, 0, 3);
            if (op == 0) buf[at] = (char)lt_rng_int(&g, 0, 255);                                  /* flip a byte */
            else if (op == 1 && n > 1) memmove(buf + at, buf + at + 1, n - at - 1), n--;          /* delete */
            else if (op == 2 && n + 1 < sizeof buf) memmove(buf + at + 1, buf + at, n - at), n++; /* duplicate */
            else buf[at] = "{}[]\":,0-e.\\"[lt_rng_int(&g, 0, 12)];                              /* structure */
        }
        LLVMFuzzerTestOneInput((const uint8_t *)buf, n);
    }
}

int main(void) {
    LT_RUN(test_fields_and_defaults);
    LT_RUN(test_refusals_name_the_field);
    LT_RUN(test_mutations_never_crash);
    return lt_finish();
}

#include "../fuzz/fuzz_openai_request.c"
