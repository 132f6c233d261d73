/* tests/fuzz/fuzz_config.c — libFuzzer target for config.json
 * (src/io/config*.c): the input is parsed as a model config; when it parses, the
 * derived facts (tensor list, RoPE tables, per-layer windows) are computed and the same
 * text is merged as a generation_config.json. Errors are expected and must say why.
 * Build: the `fuzz` CMake preset. */
#include "loom/loom.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lm_model_config cfg;
    if (lm_model_config_parse((const char *)data, size, "fuzz", &cfg) != LM_OK) {
        if (!lm_last_error()[0]) __builtin_trap();
        return 0;
    }
    /* the first and last tensors (a config may declare millions of layers: each lookup is
     * O(1), but walking them all would only time the loop) */
    const int64_t nt = lm_model_config_tensor_count(&cfg);
    for (int64_t i = 0; i < nt; i = i == 2048 && nt > 4096 ? nt - 2048 : i + 1) {
        lm_tensor_spec spec;
        if (lm_model_config_tensor(&cfg, i, &spec) != LM_OK) __builtin_trap(); /* listed tensors describe */
    }
    int64_t half = cfg.head_dim / 2 > 0 && cfg.head_dim / 2 < (1 << 16) ? cfg.head_dim / 2 : 0;
    double *inv = half ? malloc(sizeof(double) * (size_t)half) : NULL, scaling = 0;
    if (inv) lm_model_config_rope(&cfg, inv, &scaling);
    free(inv);
    for (int64_t l = 0; l < cfg.num_hidden_layers && l < 2048; l++) (void)lm_model_config_layer_window(&cfg, l);
    (void)lm_model_config_merge_generation(&cfg, (const char *)data, size, "fuzz generation_config");
    return 0;
}
