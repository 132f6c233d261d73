/* tests/fuzz/fuzz_openai_request.c — libFuzzer entry point for the OpenAI request parser
 * (src/serve/openai.c): the input is a request body, parsed as a completion and as a
 * chat request. Any crash, sanitizer report or leak is a bug; parse errors are
 * expected (each must name its problem). Build: the `fuzz` CMake preset; run:
 * scripts/fuzz.sh openai_request.
 * (tests/serve/test_serve_openai.c runs the same body through a deterministic mutation
 * loop in every CI run.)
 */
#include "serve/openai.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int kind = 0; kind < 2; kind++) {
        lm__oai_request r;
        char param[64];
        lm_status st = lm__oai_parse((const char *)data, size, (lm__oai_kind)kind, &r, param, sizeof param);
        if (st != LM_OK && !lm_last_error()[0]) __builtin_trap(); /* an error must say why */
        lm__oai_request_free(&r);
    }
    return 0;
}
