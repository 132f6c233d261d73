/* tests/fuzz/fuzz_safetensors.c — libFuzzer target for the safetensors reader
 * (src/io/safetensors.c): the input is a whole file. When it opens, every entry is
 * listed, looked up by name, turned into a tensor and summed over its bytes (every
 * pointer handed out must lie inside the mapping: ASan checks), and the metadata is
 * read. Errors are expected and must say why. Build: the `fuzz` CMake preset. */
#include "fuzz_util.h"
#include "loom/loom.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_scratch_file("safetensors", ".safetensors", data, size);
    lm_safetensors *st = NULL;
    lm_status s = lm_safetensors_open(path, &st);
    if (s != LM_OK) {
        if (!lm_last_error()[0]) __builtin_trap(); /* an error must say why */
        return 0;
    }
    unsigned sum = 0;
    for (int64_t i = 0; i < lm_safetensors_count(st); i++) {
        lm_safetensors_entry e;
        if (lm_safetensors_info(st, i, &e) != LM_OK) continue;
        const unsigned char *p = e.data;
        for (size_t b = 0; b < e.nbytes; b++) sum += p[b];
        lm_safetensors_entry again;
        if (lm_safetensors_find(st, e.name, &again) != LM_OK || again.data != e.data) __builtin_trap();
        lm_tensor *t = NULL;
        if (lm_safetensors_tensor(st, e.name, &t) == LM_OK) {
            const unsigned char *q = lm_tensor_data(t);
            size_t n = (size_t)lm_tensor_numel(t) * lm_dtype_size(lm_tensor_dtype(t));
            for (size_t b = 0; b < n; b++) sum += q[b];
            lm_tensor_destroy(t);
        }
    }
    (void)lm_safetensors_metadata(st, "format");
    lm_safetensors_close(st);
    return (int)(sum & 0); /* keep the reads */
}
