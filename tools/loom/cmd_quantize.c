/* tools/loom/cmd_quantize.c — `loom quantize --model DIR --to int8|int4|fp8 [--group G] -o OUT`: writes a copy
 * of a float Hugging Face model directory whose Linear projections are int8 with one
 * f32 scale per output row, in the layout loom loads directly (docs/QUANTIZATION.md):
 * model.safetensors holds "<name>.weight" as I8 [out, in] and "<name>.weight_scale" as
 * F32 [out] for every quantized projection (q/k/v/o, gate/up/down, and lm_head when it is
 * untied), every other tensor unchanged (embedding table, norms, biases: float);
 * config.json gains "quantization_config"; the other files (tokenizer, generation
 * config, ...) are copied. The quantization is lm_quantize_int8_rows, the function
 * `--weights int8` uses at load, so both give the same bytes. Every file is written
 * atomically, the weights before config.json (a directory cut short is refused by the
 * loader rather than misread). OUT may not be the source directory.
 * --to int4 [--group 32|64|128, default 32]: "<name>.weight" is U8 [out, in/2] (two
 * signed 4-bit values per byte, low nibble first) and "<name>.weight_scale" BF16 [out,
 * in/G], by lm_quantize_int4_groups (again the function `--weights int4` uses).
 */
#include "args.h"
#include "commands.h"
#include "common.h"

#include "loom/io_write.h"
#include "loom/safetensors.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char *scheme_of(const lm_model_config *c) {
    return c->quant_format == LM_QUANT_INT4 ? "group-wise symmetric" : "per-output-channel symmetric";
}

/* w quantized as c says into new tensors (the same calls as nn/model.c's quantize-at-load). */
static lm_status quantize_matrix(lm_ctx *ctx, const lm_model_config *c, const lm_tensor_view *w, lm_tensor **q,
                                 lm_tensor **sc) {
    int int4 = c->quant_format == LM_QUANT_INT4;
    int64_t qs[2] = {w->shape[0], int4 ? w->shape[1] / 2 : w->shape[1]};
    int64_t ss[2] = {w->shape[0], int4 ? w->shape[1] / c->quant_group : 1};
    int fp8 = c->quant_format == LM_QUANT_FP8;
    lm_status st = lm_tensor_create(lm_device_cpu(), int4 ? LM_U8 : fp8 ? LM_F8_E4M3 : LM_I8, 2, qs, q);
    if (st == LM_OK) st = lm_tensor_create(lm_device_cpu(), int4 ? LM_BF16 : LM_F32, int4 ? 2 : 1, ss, sc);
    if (st != LM_OK) return st;
    if (int4) return lm_quantize_int4_groups(ctx, w, lm_tensor_as_view(*q), lm_tensor_as_view(*sc), c->quant_group);
    if (fp8) return lm_quantize_fp8_rows(ctx, w, lm_tensor_as_view(*q), lm_tensor_as_view(*sc));
    return lm_quantize_int8_rows(ctx, w, lm_tensor_as_view(*q), lm_tensor_as_view(*sc));
}

static int add_quantization_config(json_t *root, void *user) {
    const lm_model_config *c = user;
    json_t *q = json_object(), *mods = json_array();
    int ok = q && mods;
    for (int i = 0; ok && i < LM_QUANT_MODULE_COUNT; i++)
        if (c->quant_modules & (1 << i)) ok = json_array_append_new(mods, json_string(lm_quant_module_name(i))) == 0;
    ok = ok && json_object_set_new(q, "quant_method", json_string("loom")) == 0 &&
         json_object_set_new(q, "format", json_string(lm_quant_format_name((lm_quant_format)c->quant_format))) == 0 &&
         json_object_set_new(q, "scheme", json_string(scheme_of(c))) == 0 &&
         (c->quant_format != LM_QUANT_INT4 || json_object_set_new(q, "group_size", json_integer(c->quant_group)) == 0) &&
         json_object_set(q, "modules", mods) == 0 && json_object_set(root, "quantization_config", q) == 0;
    json_decref(mods);
    json_decref(q);
    if (!ok) fprintf(stderr, "loom quantize: out of memory writing config.json\n");
    return ok;
}

typedef struct qtensors {
    lm_tensor **t;         /* [cap] owned */
    const char **names;    /* [cap] borrowed from the checkpoint, or scale_names */
    char (*scale_names)[128]; /* [cap] */
    int64_t n, cap;
} qtensors;

/* The checkpoint's tensors, the quantized modules' replaced by i8 / u8 + their scales. */
static int quantize_tensors(const char *dir, lm_checkpoint *ck, const lm_model_config *c, qtensors *q, int *nquant,
                            size_t *bytes_in) {
    int64_t n = lm_checkpoint_count(ck);
    q->cap = 2 * n;
    q->t = calloc((size_t)(q->cap ? q->cap : 1), sizeof *q->t);
    q->names = calloc((size_t)(q->cap ? q->cap : 1), sizeof *q->names);
    q->scale_names = calloc((size_t)(q->cap ? q->cap : 1), sizeof *q->scale_names);
    if (!q->t || !q->names || !q->scale_names) {
        fprintf(stderr, "loom quantize: out of memory\n");
        return 0;
    }
    lm_ctx *ctx = NULL;
    lm_status st = lm_ctx_create(lm_device_cpu(), 1, &ctx);
    for (int64_t i = 0; st == LM_OK && i < n; i++) {
        const char *name = lm_checkpoint_name(ck, i);
        lm_tensor *raw = NULL;
        if ((st = lm_checkpoint_tensor(ck, name, &raw)) != LM_OK) break;
        *bytes_in += (size_t)lm_tensor_numel(raw) * lm_dtype_size(lm_tensor_dtype(raw));
        if (!lm_model_config_tensor_quantized(c, name)) {
            q->names[q->n] = name;
            q->t[q->n++] = raw;
            continue;
        }
        const lm_tensor_view *w = lm_tensor_as_view(raw);
        lm_tensor *qt = NULL, *sc = NULL;
        st = quantize_matrix(ctx, c, w, &qt, &sc);
        lm_tensor_destroy(raw);
        snprintf(q->scale_names[q->n + 1], sizeof q->scale_names[0], "%s_scale", name);
        q->names[q->n] = name, q->t[q->n] = qt;
        q->names[q->n + 1] = q->scale_names[q->n + 1], q->t[q->n + 1] = sc;
        q->n += 2;
        if (st != LM_OK) {
            char what[256];
            snprintf(what, sizeof what, "tensor '%s' of '%s'", name, dir);
            cli_fail("quantize", what, st);
            lm_ctx_destroy(ctx);
            return 0;
        }
        (*nquant)++;
    }
    lm_ctx_destroy(ctx);
    if (st != LM_OK) return cli_fail("quantize", dir, st) == 0;
    return 1;
}

static int quantize(const char *dir, const char *out, lm_quant_format fmt, int group) {
    int int4 = fmt == LM_QUANT_INT4;
    lm_model_config cfg;
    lm_checkpoint *ck = NULL;
    lm_status st = lm_model_config_load(dir, &cfg);
    if (st != LM_OK) return cli_fail("quantize", dir, st);
    if (cfg.quant_format != LM_QUANT_NONE) {
        fprintf(stderr, "loom quantize: '%s' already holds %s weights (config.json quantization_config)\n", dir,
                lm_quant_format_name((lm_quant_format)cfg.quant_format));
        return 1;
    }
    if ((st = lm_checkpoint_open(dir, &ck)) != LM_OK) return cli_fail("quantize", dir, st);
    if ((st = lm_model_config_check_checkpoint(&cfg, ck)) != LM_OK) {
        lm_checkpoint_close(ck);
        return cli_fail("quantize", dir, st);
    }
    cfg.quant_format = fmt;
    cfg.quant_modules = lm_quant_modules_default(&cfg);
    if (cfg.tie_word_embeddings) /* the file keeps the one float table; loading quantizes the head's copy */
        cfg.quant_modules &= ~LM_QUANT_LM_HEAD;
    cfg.quant_group = int4 ? group : 0;
    int64_t attn = cfg.num_attention_heads * cfg.head_dim;
    if (int4 && (cfg.hidden_size % group || cfg.intermediate_size % group || attn % group)) {
        fprintf(stderr, "loom quantize: --group %d does not divide hidden_size %lld, intermediate_size %lld and "
                "heads x head_dim %lld of '%s'\n", group, (long long)cfg.hidden_size, (long long)cfg.intermediate_size,
                (long long)attn, dir);
        lm_checkpoint_close(ck);
        return 1;
    }
    qtensors q = {0};
    int nquant = 0, copied = 0;
    size_t bytes_in = 0, bytes_out = 0;
    int ok = quantize_tensors(dir, ck, &cfg, &q, &nquant, &bytes_in);
    lm_tensor_view *views = ok ? calloc((size_t)(q.n ? q.n : 1), sizeof *views) : NULL;
    ok = ok && views;
    for (int64_t i = 0; ok && i < q.n; i++) {
        views[i] = *lm_tensor_as_view(q.t[i]);
        bytes_out += (size_t)lm_tensor_numel(q.t[i]) * lm_dtype_size(lm_tensor_dtype(q.t[i]));
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    if (ok) {
        lm_ctx *ctx = NULL;
        char qdesc[96];
        snprintf(qdesc, sizeof qdesc, "loom %s %s", lm_quant_format_name((lm_quant_format)cfg.quant_format),
                 scheme_of(&cfg));
        const char *const meta[] = {"format", "pt", "quantization", qdesc, NULL};
        st = lm_ctx_create(lm_device_cpu(), 1, &ctx);
        if (st == LM_OK) st = lm_safetensors_write(ctx, path, (int)q.n, q.names, views, meta);
        lm_ctx_destroy(ctx);
        if (st != LM_OK) ok = cli_fail("quantize", path, st) == 0;
    }
    for (int64_t i = 0; q.t && i < q.n; i++) lm_tensor_destroy(q.t[i]);
    free(q.t), free(q.names), free(q.scale_names), free(views);
    lm_checkpoint_close(ck);
    ok = ok && cli_write_config("quantize", dir, out, add_quantization_config, &cfg) &&
         cli_copy_assets("quantize", dir, out, &copied) && lm_dir_sync(out) == LM_OK;
    if (!ok) return 1;
    printf("{\"out\":");
    cli_json_string(stdout, out, strlen(out));
    printf(",\"format\":\"%s\",\"scheme\":\"%s\",", lm_quant_format_name((lm_quant_format)cfg.quant_format),
           scheme_of(&cfg));
    if (int4) printf("\"group_size\":%d,", group);
    printf("\"modules\":[");
    for (int i = 0, k = 0; i < LM_QUANT_MODULE_COUNT; i++)
        if (cfg.quant_modules & (1 << i)) printf("%s\"%s\"", k++ ? "," : "", lm_quant_module_name(i));
    printf("],\"tensors\":%lld,\"quantized\":%d,\"files_copied\":%d,\"bytes_in\":%zu,\"bytes_out\":%zu}\n",
           (long long)q.n, nquant, copied, bytes_in, bytes_out);
    return 0;
}

int cmd_quantize(int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *to = NULL;
    int group = 0;
    const cli_opt opts[] = {{"model", CLI_STRING, &dir, "DIR: the float Hugging Face model directory to read (required)"},
                            {"to", CLI_STRING, &to, "FORMAT: int8 or fp8 (e4m3; per-output-channel "
                                                    "symmetric) or int4 (group-wise symmetric); required"},
                            {"group", CLI_COUNT, &group, "G: int4 inputs per scale, 32, 64 or 128 (default 32)"},
                            {"out", CLI_STRING, &out, "DIR: the directory to write (also -o; created when missing; required)"},
                            {NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos = 0;
    int rc = cli_parse("quantize", "--model DIR --to int8|int4|fp8 [--group G] -o OUT", opts, argc, argv, pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (!dir || !out || !to) {
        fprintf(stderr, "loom quantize: --model DIR, --to int8|int4|fp8 and -o OUT are required\n");
        return 2;
    }
    int int4 = strcmp(to, "int4") == 0, fp8 = strcmp(to, "fp8") == 0;
    if (!int4 && !fp8 && strcmp(to, "int8") != 0) {
        fprintf(stderr, "loom quantize: --to '%s' is not a format loom writes (int8, int4, fp8)\n", to);
        return 2;
    }
    if (group && !int4) {
        fprintf(stderr, "loom quantize: --group is for --to int4 only\n");
        return 2;
    }
    if (!group) group = 32;
    if (group != 32 && group != 64 && group != 128) {
        fprintf(stderr, "loom quantize: --group %d is not 32, 64 or 128\n", group);
        return 2;
    }
    if (!cli_prepare_out("quantize", dir, out)) return 1;
    return quantize(dir, out, int4 ? LM_QUANT_INT4 : fp8 ? LM_QUANT_FP8 : LM_QUANT_INT8, group);
}
