/* tests/fuzz/fuzz_chat_template.c — libFuzzer entry point for the chat template interpreter
 * (src/chat): the input is a template source; it is parsed and, when it parses,
 * rendered over a fixed conversation with tools under small limits. Any crash,
 * sanitizer report or leak is a bug; parse and render errors are expected. Built
 * by the `fuzz` CMake preset; run: scripts/fuzz.sh chat_template.
 */
#include "loom/chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char k_messages[] =
    "[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\" hi\\n\"},"
    "{\"role\":\"assistant\",\"content\":\"<think>x</think>ok\"},{\"role\":\"assistant\",\"content\":null,"
    "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},"
    "{\"role\":\"tool\",\"content\":\"r\"},{\"role\":\"user\",\"content\":\"again\"}]";
static const char k_tools[] = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *src = malloc(size + 1);
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = '\0';
    lm_chat_template *t = NULL;
    if (lm_chat_template_parse(src, "<s>", "</s>", &t) == LM_OK) {
        lm_chat_template_set_limit(t, LM_CHAT_LIMIT_LOOP_ITERATIONS, 20000);
        lm_chat_template_set_limit(t, LM_CHAT_LIMIT_MEMORY_BYTES, 32 << 20);
        lm_chat_template_set_limit(t, LM_CHAT_LIMIT_STRING_BYTES, 1 << 20);
        lm_chat_template_set_limit(t, LM_CHAT_LIMIT_WORK, 2000000);
        char *out = NULL;
        lm_chat_template_render(t, k_messages, size % 2 ? k_tools : NULL, (int)(size % 3 == 0),
                                "{\"enable_thinking\": false}", &out);
        lm_free(out);
        lm_chat_template_destroy(t);
    }
    free(src);
    return 0;
}
