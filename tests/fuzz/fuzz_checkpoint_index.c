/* tests/fuzz/fuzz_checkpoint_index.c — libFuzzer target for sharded checkpoints
 * (src/io/checkpoint.c): the input is model.safetensors.index.json in a directory that
 * also holds two small valid shards (a.safetensors, b.safetensors) and a file that is
 * not a shard. When the directory opens, every name resolves and its tensor is read.
 * Errors are expected and must say why. Build: the `fuzz` CMake preset. */
#include "fuzz_util.h"
#include "loom/loom.h"

#include <string.h>
#include <sys/stat.h>

static char g_dir[256];

static void write_file(const char *name, const void *data, size_t n) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, n, f) != n) abort();
    fclose(f);
}

/* a shard holding two f32 tensors, written by the library itself */
static void write_shard(const char *name, const char *t1, const char *t2) {
    float v[6] = {1, 2, 3, 4, 5, 6};
    lm_tensor *a = NULL, *b = NULL;
    lm_ctx *ctx = NULL;
    if (lm_tensor_from_host(lm_device_cpu(), LM_F32, 1, (int64_t[]){2}, v, &a) != LM_OK ||
        lm_tensor_from_host(lm_device_cpu(), LM_F32, 2, (int64_t[]){2, 2}, v + 2, &b) != LM_OK ||
        lm_ctx_create(lm_device_cpu(), 1, &ctx) != LM_OK)
        abort();
    const char *names[2] = {t1, t2};
    lm_tensor_view views[2] = {*lm_tensor_as_view(a), *lm_tensor_as_view(b)};
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    if (lm_safetensors_write(ctx, p, 2, names, views, NULL) != LM_OK) abort();
    lm_tensor_destroy(a), lm_tensor_destroy(b), lm_ctx_destroy(ctx);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(g_dir, sizeof g_dir, "%s/loom-fuzz-index-%d", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
             (int)getpid());
    mkdir(g_dir, 0700);
    write_shard("a.safetensors", "model.embed_tokens.weight", "model.norm.weight");
    write_shard("b.safetensors", "lm_head.weight", "model.layers.0.mlp.up_proj.weight");
    write_file("not_a_shard.safetensors", "garbage", 7);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    write_file("model.safetensors.index.json", data, size);
    lm_checkpoint *ck = NULL;
    if (lm_checkpoint_open(g_dir, &ck) != LM_OK) {
        if (!lm_last_error()[0]) __builtin_trap();
        return 0;
    }
    for (int64_t i = 0; i < lm_checkpoint_count(ck); i++) {
        const char *name = lm_checkpoint_name(ck, i);
        lm_safetensors_entry e;
        if (!name || lm_checkpoint_find(ck, name, &e) != LM_OK) __builtin_trap(); /* every listed name resolves */
        lm_tensor *t = NULL;
        if (lm_checkpoint_tensor(ck, name, &t) == LM_OK) lm_tensor_destroy(t);
    }
    lm_checkpoint_close(ck);
    return 0;
}
