/* tools/loom/cmd_convert.c — `loom convert --model DIR --dtype bf16|f16|f32 -o OUT`:
 * writes a copy of a Hugging Face model directory whose floating-point weights are
 * stored in another dtype (f32 -> bf16 and f16 round to nearest even; bf16/f16 -> f32
 * is exact). Integer tensors are copied unchanged. The output holds one
 * model.safetensors (sharded inputs are joined), config.json with "torch_dtype" (and
 * "dtype", when present) set to the new type, and every other regular file of the
 * source directory except weights and a training checkpoint's train_state.bin.
 * Values that do not fit the target (f32 beyond f16's range) are refused, naming the
 * tensor. Every file is written atomically; OUT may not be the source directory.
 */
#include "args.h"
#include "commands.h"
#include "common.h"

#include "loom/io_write.h"
#include "loom/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *hf_dtype_name(lm_dtype dt) {
    return dt == LM_BF16 ? "bfloat16" : dt == LM_F16 ? "float16" : "float32";
}

static float load_float(const void *data, lm_dtype dt, int64_t i) {
    if (dt == LM_F32) {
        float x;
        memcpy(&x, (const char *)data + 4 * i, 4);
        return x;
    }
    uint16_t h;
    memcpy(&h, (const char *)data + 2 * i, 2);
    return dt == LM_BF16 ? lm_bf16_to_f32(h) : lm_f16_to_f32(h);
}

/* Converts one entry into a new tensor of dtype `to`. Returns 0 after printing an
 * error when a finite value would overflow the target. */
static int convert_entry(const lm_safetensors_entry *e, lm_dtype to, lm_tensor **out) {
    lm_status st = lm_tensor_create(lm_device_cpu(), to, e->ndim, e->shape, out);
    if (st != LM_OK) return cli_fail("convert", e->name, st) == 0;
    int64_t n = lm_tensor_numel(*out);
    char *dst = lm_tensor_data(*out);
    for (int64_t i = 0; i < n; i++) {
        float x = load_float(e->data, e->dtype, i);
        if (to == LM_F32) {
            memcpy(dst + 4 * i, &x, 4);
            continue;
        }
        uint16_t h = to == LM_BF16 ? lm_f32_to_bf16(x) : lm_f32_to_f16(x);
        float back = to == LM_BF16 ? lm_bf16_to_f32(h) : lm_f16_to_f32(h);
        if (isfinite(x) && !isfinite(back)) {
            fprintf(stderr, "loom convert: tensor '%s' element %lld = %g does not fit %s\n", e->name, (long long)i,
                    (double)x, lm_dtype_name(to));
            lm_tensor_destroy(*out);
            *out = NULL;
            return 0;
        }
        memcpy(dst + 2 * i, &h, 2);
    }
    return 1;
}

int cli_write_config(const char *cmd, const char *src_dir, const char *out_dir, int (*edit)(json_t *root, void *user),
                     void *user) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", src_dir);
    json_error_t err;
    char *raw = NULL;
    size_t raw_len = 0;
    lm_status rst = lm_file_read_all(path, &raw, &raw_len); /* regular files only */
    if (rst != LM_OK) return cli_fail(cmd, path, rst) == 0;
    json_t *root = json_loadb(raw, raw_len, 0, &err);
    lm_free(raw);
    if (!root || !json_is_object(root)) {
        fprintf(stderr, "loom %s: '%s' is not a JSON object (%s)\n", cmd, path, root ? "not an object" : err.text);
        json_decref(root);
        return 0;
    }
    int ok = edit(root, user);
    char *text = ok ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text) {
        fprintf(stderr, "loom %s: out of memory writing config.json\n", cmd);
        return 0;
    }
    size_t len = strlen(text);
    char *with_nl = realloc(text, len + 2);
    if (!with_nl) {
        free(text);
        return 0;
    }
    with_nl[len] = '\n', with_nl[len + 1] = 0;
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    lm_status st = lm_file_write_atomic(path, with_nl, len + 1);
    free(with_nl);
    return st == LM_OK || cli_fail(cmd, path, st) == 0;
}

static int set_dtype(json_t *root, void *user) {
    const char *name = hf_dtype_name(*(const lm_dtype *)user);
    int ok = json_object_set_new(root, "torch_dtype", json_string(name)) == 0;
    if (ok && json_object_get(root, "dtype")) ok = json_object_set_new(root, "dtype", json_string(name)) == 0;
    return ok;
}

static int write_config(const char *src_dir, const char *out_dir, lm_dtype to) {
    return cli_write_config("convert", src_dir, out_dir, set_dtype, &to);
}

/* Weights, their index and a checkpoint's optimizer state are not copied. */
static int is_skipped(const char *name) {
    size_t n = strlen(name);
    return !strcmp(name, "config.json") || !strcmp(name, "train_state.bin") || !strcmp(name, "model.safetensors.index.json") ||
           (n > 12 && !strcmp(name + n - 12, ".safetensors")) || name[0] == '.';
}

int cli_copy_assets(const char *cmd, const char *src_dir, const char *out_dir, int *copied) {
    DIR *d = opendir(src_dir);
    if (!d) {
        fprintf(stderr, "loom %s: cannot list '%s': %s\n", cmd, src_dir, strerror(errno));
        return 0;
    }
    int ok = 1;
    struct dirent *de;
    while (ok && (de = readdir(d))) {
        if (is_skipped(de->d_name)) continue;
        char from[4096], to[4096];
        snprintf(from, sizeof from, "%s/%s", src_dir, de->d_name);
        snprintf(to, sizeof to, "%s/%s", out_dir, de->d_name);
        struct stat s;
        if (stat(from, &s) != 0 || !S_ISREG(s.st_mode)) continue;
        char *data = NULL;
        size_t n = 0;
        lm_status st = lm_file_read_all(from, &data, &n);
        if (st == LM_OK) st = lm_file_write_atomic(to, data, n);
        lm_free(data);
        if (st != LM_OK) ok = cli_fail(cmd, from, st) == 0;
        else (*copied)++;
    }
    closedir(d);
    return ok;
}

int cli_prepare_out(const char *cmd, const char *src, const char *out) {
    struct stat a, b;
    if (stat(out, &b) != 0) {
        if (errno != ENOENT || mkdir(out, 0777) != 0) {
            fprintf(stderr, "loom %s: cannot create '%s': %s\n", cmd, out, strerror(errno));
            return 0;
        }
        return 1;
    }
    if (!S_ISDIR(b.st_mode)) {
        fprintf(stderr, "loom %s: '%s' exists and is not a directory\n", cmd, out);
        return 0;
    }
    if (stat(src, &a) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
        fprintf(stderr, "loom %s: the output directory is the source directory '%s'\n", cmd, src);
        return 0;
    }
    return 1;
}

static int convert(const char *dir, const char *out, lm_dtype to) {
    lm_checkpoint *ck = NULL;
    lm_status st = lm_checkpoint_open(dir, &ck);
    if (st != LM_OK) return cli_fail("convert", dir, st);
    int64_t n = lm_checkpoint_count(ck);
    lm_tensor **tensors = calloc((size_t)(n ? n : 1), sizeof *tensors);
    lm_tensor_view *views = calloc((size_t)(n ? n : 1), sizeof *views);
    const char **names = calloc((size_t)(n ? n : 1), sizeof *names);
    int ok = tensors && views && names, converted = 0, copied = 0;
    if (!ok) fprintf(stderr, "loom convert: out of memory\n");
    size_t bytes_in = 0, bytes_out = 0;
    for (int64_t i = 0; ok && i < n; i++) {
        lm_safetensors_entry e;
        names[i] = lm_checkpoint_name(ck, i);
        st = lm_checkpoint_find(ck, names[i], &e);
        if (st != LM_OK) {
            ok = cli_fail("convert", names[i], st) == 0;
            break;
        }
        bytes_in += e.nbytes;
        if (lm_dtype_is_float(e.dtype) && e.dtype != to) {
            ok = convert_entry(&e, to, &tensors[i]);
            converted += ok;
        } else {
            st = lm_checkpoint_tensor(ck, names[i], &tensors[i]);
            if (st != LM_OK) ok = cli_fail("convert", names[i], st) == 0;
        }
        if (ok) {
            views[i] = *lm_tensor_as_view(tensors[i]);
            bytes_out += (size_t)lm_tensor_numel(tensors[i]) * lm_dtype_size(lm_tensor_dtype(tensors[i]));
        }
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    if (ok) {
        lm_ctx *ctx = NULL;
        static const char *const meta[] = {"format", "pt", NULL};
        st = lm_ctx_create(lm_device_cpu(), 1, &ctx);
        if (st == LM_OK) st = lm_safetensors_write(ctx, path, (int)n, names, views, meta);
        lm_ctx_destroy(ctx);
        if (st != LM_OK) ok = cli_fail("convert", path, st) == 0;
    }
    for (int64_t i = 0; tensors && i < n; i++) lm_tensor_destroy(tensors[i]);
    free(tensors), free(views), free(names);
    lm_checkpoint_close(ck);
    ok = ok && write_config(dir, out, to) && cli_copy_assets("convert", dir, out, &copied) && lm_dir_sync(out) == LM_OK;
    if (!ok) return 1;
    printf("{\"out\":");
    cli_json_string(stdout, out, strlen(out));
    printf(",\"dtype\":\"%s\",\"tensors\":%lld,\"converted\":%d,\"files_copied\":%d,\"bytes_in\":%zu,\"bytes_out\":%zu}\n",
           lm_dtype_name(to), (long long)n, converted, copied, bytes_in, bytes_out);
    return 0;
}

int cmd_convert(int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *dtype = NULL;
    const cli_opt opts[] = {{"model", CLI_STRING, &dir, "DIR: the Hugging Face model directory to read (required)"},
                            {"dtype", CLI_STRING, &dtype, "TYPE: bf16, f16 or f32: the weights' new dtype (required)"},
                            {"out", CLI_STRING, &out, "DIR: the directory to write (also -o; created when missing; required)"},
                            {NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos = 0;
    int rc = cli_parse("convert", "--model DIR --dtype bf16|f16|f32 -o OUT", opts, argc, argv, pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (!dir || !out || !dtype) {
        fprintf(stderr, "loom convert: --model DIR, --dtype TYPE and -o OUT are required\n");
        return 2;
    }
    lm_dtype to;
    if (lm_dtype_parse(dtype, &to) != LM_OK || !lm_dtype_is_float(to)) {
        fprintf(stderr, "loom convert: --dtype '%s' is not one of bf16, f16, f32\n", dtype);
        return 2;
    }
    if (!cli_prepare_out("convert", dir, out)) return 1;
    return convert(dir, out, to);
}
