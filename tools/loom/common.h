/* tools/loom/common.h — helpers shared by the loom subcommands: error reporting,
 * model/context setup and JSON string output. */
#ifndef LOOM_CLI_COMMON_H
#define LOOM_CLI_COMMON_H

#include "loom/loom.h"
#include "loom/model.h"

#include <stdio.h>

/* Prints "loom CMD: WHAT: <status message>: <detail>" to stderr; returns 1. */
int cli_fail(const char *cmd, const char *what, lm_status st);
/* Writes s[0..n) as a JSON string literal (UTF-8 passed through, controls escaped). */
void cli_json_string(FILE *f, const char *s, size_t n);
/* Installs a stderr logger for the library at the given verbosity. */
void cli_enable_logging(int verbose);
/* Loads a model on the CPU (reporting errors); returns NULL on failure. */
lm_model *cli_load_model(const char *cmd, const char *dir);
/* Loads a model on device (reporting errors); returns NULL on failure. */
lm_model *cli_load_model_on(const char *cmd, const char *dir, lm_device device);
/* The --weights option of the commands that run a model (docs/QUANTIZATION.md). */
#define CLI_WEIGHTS_OPT(dest)                                                                                    \
    {"weights", CLI_STRING, (dest), "int8|int4|fp8|bf16: the weights to run (default: what the directory "      \
                                    "holds); int8/int4/fp8 quantize a float directory at load, bf16 converts "   \
                                    "f32/f16 matrices at load"},                                                  \
    {"group", CLI_COUNT, &cli_weights_group, "G: --weights int4: inputs per scale, 32, 64 or 128 (default 32)"}, \
    CLI_PRECISION_OPT
/* The --precision option (docs/QUANTIZATION.md, "Fast precision"); part of CLI_WEIGHTS_OPT. */
#define CLI_PRECISION_OPT                                                                                       \
    {"precision", CLI_STRING, &cli_precision_text, "exact|fast: CPU products (default exact); fast rounds "     \
                                                   "activations to bf16 for AVX512_BF16 dot products with bf16 " \
                                                   "weights and in prefill attention, and to int8 blocks for "  \
                                                   "byte products (AVX512_VNNI or AMX-INT8, AVX-VNNI or AVX2) " \
                                                   "with int8 and int4 weights (bf16 weights refused on CPUs "  \
                                                   "without AVX512_BF16); on CUDA fp8 weights "                 \
                                                   "only: x quantized to e4m3 per row for fp8 "                 \
                                                   "tensor-core GEMMs past 8 rows"}
/* --group of CLI_WEIGHTS_OPT (0: not given); read by cli_load_model_weights. */
extern int cli_weights_group;
/* --precision of CLI_WEIGHTS_OPT (NULL: not given, exact); checked by cli_parse_weights,
 * read by cli_load_model_weights. */
extern const char *cli_precision_text;
/* Parses a --weights value (NULL: LM_WEIGHTS_AUTO; "int4:G" is int4 with group G, for
 * commands without --group), and checks the --precision text. Prints an error and
 * returns 0 when either is not valid. */
int cli_parse_weights(const char *cmd, const char *text, lm_weights *out);
/* The --precision in effect (LM_PRECISION_EXACT when not given; cli_parse_weights has
 * checked the text). */
lm_precision cli_precision(void);
/* Loads a model on device with the given weights (reporting errors; int4 with the
 * group of --group or "int4:G") at the --precision given; NULL on failure. */
lm_model *cli_load_model_weights(const char *cmd, const char *dir, lm_device device, lm_weights weights);
/* The same at an explicit precision (eval's --reference runs exact). */
lm_model *cli_load_model_precision(const char *cmd, const char *dir, lm_device device, lm_weights weights,
                                   lm_precision precision);
/* ---- writing model directories (cmd_convert.c; loom convert and loom quantize) ---- */
/* OUT is created when missing; it may not be the source directory itself. Prints why and returns 0 otherwise. */
int cli_prepare_out(const char *cmd, const char *src, const char *out);
/* Copies every regular file of src_dir except weights (*.safetensors and their index),
 * config.json, train_state.bin and dot files into out_dir, each atomically; counts them. */
int cli_copy_assets(const char *cmd, const char *src_dir, const char *out_dir, int *copied);
/* src_dir/config.json, edited by edit(root, user) (returns 0 after printing why), to
 * out_dir/config.json atomically (2-space indent, key order kept). */
struct json_t;
int cli_write_config(const char *cmd, const char *src_dir, const char *out_dir, int (*edit)(struct json_t *root, void *user),
                     void *user);
/* Parses a --device value ("cpu", "cuda", "cuda:N"; NULL means cpu) into *out.
 * Prints an error and returns 0 when the text is not a device. */
int cli_parse_device(const char *cmd, const char *text, lm_device *out);
/* Monotonic wall clock in seconds (for timing). */
double cli_now(void);
/* Sorts times[0..n) (n >= 1) and returns the fastest in *best and the median in *median. */
void cli_best_median(double *times, int n, double *best, double *median);
/* The decode and prefill benches' shared JSON fields (CPU and device alike), printed as
 * ",\"key\":value" pairs into an object already open on stdout. Steps: the cache's step
 * executors, arena and live bytes, and the kernel launches of its latest captured step.
 * Roofline: bytes a step reads, the measured bandwidth under bw_key, the bandwidth the
 * steps reached (bytes x steps_per_s), the roofline tokens/s (bw / bytes x batch) and
 * the fraction of it that tok_per_s is. */
void cli_print_steps(const lm_kv_cache *cache);
void cli_print_roofline(double bytes, const char *bw_key, double bw_gb_s, double tok_per_s, int batch);
/* The multiply-add work of a prefill of T tokens in each of B rows from an empty cache,
 * as 2 FLOPs a multiply-add: every layer's products (q|k|v, o, gate|up, down), the
 * attention's two products over the (query, key) pairs each head scores (T (T + 1) / 2,
 * fewer in sliding-window layers) and the head over each row's last position; norms,
 * RoPE and the softmax are not counted. */
double cli_prefill_flops(const lm_model_config *c, int64_t T, int B);
/* Prints ",\"prefill_flops\":F,\"achieved_tflop_s\":F / seconds / 1e12". */
void cli_print_flops(double flops, double seconds);
/* The model used when --model is not given: $LOOM_DEFAULT_MODEL when set and not
 * empty, else the default model of the source tree (models/default). Prints which one
 * to stderr; prints why and returns NULL when it has no config.json. */
const char *cli_default_model(const char *cmd);
/* Step traces (loom/trace.h, docs/TIMELINES.md, "Step traces"): the --trace option of generate, bench,
 * train and serve, and its start and stop. */
#define CLI_TRACE_OPT(dest)                                                                                  \
    {"trace", CLI_STRING, (dest), "FILE: write a Chrome trace-event JSON timeline of this run to FILE (view it " \
                                  "offline with `loom trace view FILE`, or in Perfetto; also $LOOM_TRACE=FILE)"}
/* Starts a trace into path, or $LOOM_TRACE when path is NULL (nothing when neither is
 * set), and makes sure it is stopped when the process exits. Prints why and returns 0
 * when the file cannot be created; 1 otherwise. */
int cli_trace_start(const char *cmd, const char *path);
/* Stops the trace (if one runs) and returns rc, or 1 (after printing why) when rc was
 * 0 and the trace file could not be written. */
int cli_trace_stop(const char *cmd, int rc);
/* Finds the tokenizer.json beside a model: dir/tokenizer.json. Returns buf. */
const char *cli_model_tokenizer_path(const char *dir, char *buf, size_t size);

#endif
