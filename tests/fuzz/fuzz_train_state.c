/* tests/fuzz/fuzz_train_state.c — libFuzzer target for train_state.bin
 * (src/train/state.c): the input is a whole state file. It is validated without a
 * model (the check a checkpoint directory gets before --resume) and read in full for
 * a model of 8 parameters in 2 tensors (header, field ranges, sizes, the checksum;
 * the moments are copied only from a file that passes). Errors are expected and must
 * say why. Build: the `fuzz` CMake preset. */
#include "fuzz_util.h"
#include "loom/loom.h"
#include "train/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_scratch_file("train_state", ".bin", data, size);
    lm__train_state s;
    if (lm__train_state_check(path, &s) != LM_OK && !lm_last_error()[0]) __builtin_trap();
    lm_tensor *m1 = NULL, *m2 = NULL;
    int64_t n = 8;
    if (lm_tensor_zeros(lm_device_cpu(), LM_F32, 1, &n, &m1) != LM_OK ||
        lm_tensor_zeros(lm_device_cpu(), LM_F32, 1, &n, &m2) != LM_OK)
        abort();
    if (lm__train_state_read(path, 8, 2, &s, m1, m2) != LM_OK && !lm_last_error()[0]) __builtin_trap();
    lm_tensor_destroy(m1);
    lm_tensor_destroy(m2);
    return 0;
}
