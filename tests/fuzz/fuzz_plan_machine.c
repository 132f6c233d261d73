/* tests/fuzz/fuzz_plan_machine.c — libFuzzer target for the tile-machine description
 * (`loom plan --machine FILE`, src/plan/machine.c): the input is a machine JSON text.
 * When it parses, its derived figures are read and its complete JSON form must parse
 * back to the same description (to_json(parse(to_json(m))) == to_json(m)). Errors are expected and must say why.
 * Build: the `fuzz` CMake preset. */
#include "loom/loom.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *json = malloc(size + 1);
    if (!json) return 0;
    memcpy(json, data, size);
    json[size] = '\0';
    lm_plan_machine *m = NULL;
    if (lm_plan_machine_parse(json, "fuzz", &m) != LM_OK) {
        if (!lm_last_error()[0]) __builtin_trap();
    } else {
        (void)lm_plan_machine_name(m);
        (void)lm_plan_machine_tiles(m);
        (void)lm_plan_machine_sram_bytes(m);
        (void)lm_plan_machine_clock_hz(m);
        (void)lm_plan_machine_matmul_flops(m, LM_BF16);
        (void)lm_plan_machine_matmul_flops(m, LM_F32);
        char *a = NULL, *b = NULL;
        lm_plan_machine *again = NULL;
        if (lm_plan_machine_to_json(m, &a) != LM_OK || lm_plan_machine_parse(a, "fuzz round trip", &again) != LM_OK ||
            lm_plan_machine_to_json(again, &b) != LM_OK || strcmp(a, b) != 0)
            __builtin_trap();
        lm_free(a), lm_free(b);
        lm_plan_machine_destroy(again);
        lm_plan_machine_destroy(m);
    }
    free(json);
    return 0;
}
