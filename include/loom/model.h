/* loom/model.h — decoder-only transformer models loaded from Hugging Face
 * directories (llama, mistral, qwen2, qwen3), a KV cache, and the forward pass.
 *
 * Weights: large matrices (embeddings, projections, lm_head) stay in their stored
 * dtype (f32, bf16 or f16) inside the memory-mapped safetensors files and are widened
 * to f32 on the fly by the matmul; norm weights and biases (small) are converted to
 * f32 at load. All activations, the KV cache and accumulation are f32 on the CPU.
 * On a CUDA device the matrices are uploaded as bf16 (whatever their stored dtype),
 * the KV cache is bf16, the residual stream and every accumulation are f32, and each
 * step shape is captured once as a CUDA graph and replayed.
 * Int8 weights (lm_model_load_opts, docs/QUANTIZATION.md; also int4, fp8): the layer
 * projections (and an untied lm_head) as i8 with one f32 scale per output row, read by
 * the int8 linear operator; the embedding table, norms and biases stay float.
 * The forward pass is the decoder graph (loom/graph.h) run by an executor
 * (loom/exec.h) with the device's fused operators.
 *
 * A forward step appends T tokens to each of B cache slots: batched prefill (equal
 * lengths per call) and one-token decode (T = 1) where every slot may sit at a
 * different position. A model is immutable after load and may be shared by threads;
 * a KV cache and an lm_ctx belong to one thread at a time.
 */
#ifndef LOOM_MODEL_H
#define LOOM_MODEL_H

#include "loom/config.h"
#include "loom/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lm_model lm_model;

/* Loads dir/config.json (+ generation_config.json) and the checkpoint, checks every
 * tensor's presence, dtype and shape against the config (errors name the tensor),
 * and maps the weights; for a CUDA device it also uploads them (LM_UNSUPPORTED in a
 * build without CUDA, LM_DEVICE_ERROR for a missing GPU). The caller owns *out:
 * lm_model_destroy. */
LM_API lm_status lm_model_load(const char *dir, lm_device device, lm_model **out);

/* Which weights a model runs with (docs/QUANTIZATION.md). Public enum: grows at the end. */
typedef enum lm_weights {
    LM_WEIGHTS_AUTO = 0, /* what the directory holds (its quantization_config, else its float dtype) */
    LM_WEIGHTS_BF16 = 1, /* float matrices as bf16 (f32/f16 checkpoints are converted at load); refused for a
                            directory that holds int8 weights */
    LM_WEIGHTS_INT8 = 2, /* the projections as int8 with per-output-row f32 scales: quantized at load from a
                            float directory (lm_quantize_int8_rows), or as stored by `loom quantize`. */
    LM_WEIGHTS_INT4 = 3, /* the projections as packed int4 with one bf16 scale per group of 32/64/128 inputs
                            (lm_model_load_options.quant_group): quantized at load from a float directory
                            (lm_quantize_int4_groups), or as stored by `loom quantize --to int4`. */
    LM_WEIGHTS_FP8 = 4   /* the projections as fp8 e4m3 with per-output-row f32 scales (lm_quantize_fp8_rows, or
                            `loom quantize --to fp8`); the CPU runs them through the reference (slow), CUDA
                            through its quantized kernels. */
} lm_weights;
LM_API const char *lm_weights_name(lm_weights w); /* "auto", "bf16", "int8", "int4", "fp8"; "invalid" */
/* "auto", "bf16", "int8", "int4" or "fp8" -> *out; LM_INVALID_ARGUMENT naming the text otherwise. */
LM_API lm_status lm_weights_parse(const char *text, lm_weights *out);

typedef struct lm_model_load_options {
    lm_weights weights;    /* LM_WEIGHTS_AUTO */
    int32_t quant_modules; /* LM_WEIGHTS_INT8 from a float directory: LM_QUANT_* module bits (config.h);
                              0 = lm_quant_modules_default (every projection, an untied lm_head) */
    int32_t quant_group;   /* LM_WEIGHTS_INT4 from a float directory: inputs per scale, 32, 64 or 128 (0 = 32);
                              another value, or one that does not divide a quantized matrix's inputs, is
                              LM_INVALID_ARGUMENT */
    lm_precision precision; /* LM_PRECISION_EXACT (0); LM_PRECISION_FAST rounds x to bf16 in the CPU products
                               of bf16 weights and to int8 blocks in those of int8 / int4 weights (loom/ops.h;
                               lm_precision_check's errors for a device or CPU that cannot run it; on a CPU
                               without AVX512_BF16, LM_UNSUPPORTED naming a bf16 matrix a linear reads) */
    int64_t reserved[6];   /* zero */
} lm_model_load_options;
LM_API void lm_model_load_options_default(lm_model_load_options *o);
/* lm_model_load with options (o NULL: the defaults, which is lm_model_load). Errors
 * besides lm_model_load's: LM_UNSUPPORTED for LM_WEIGHTS_BF16 of an int8
 * directory; for an int8 directory, LM_NOT_FOUND / LM_DTYPE_MISMATCH / LM_SHAPE_MISMATCH
 * naming the weight or scale tensor at fault. lm_model_get_config reports the format
 * run (quant_format, quant_modules), also when quantized at load. */
LM_API lm_status lm_model_load_opts(const char *dir, lm_device device, const lm_model_load_options *o,
                                    lm_model **out);
/* The weights the model runs with: LM_WEIGHTS_INT8, LM_WEIGHTS_INT4 or LM_WEIGHTS_BF16
 * (float matrices, whatever their dtype); an int4 model's group is its config's
 * quant_group. */
LM_API lm_weights lm_model_weights(const lm_model *m);
/* The precision the model's forward pass runs its CPU products at (the load option). */
LM_API lm_precision lm_model_precision(const lm_model *m);
LM_API void lm_model_destroy(lm_model *m); /* accepts NULL */
LM_API const lm_model_config *lm_model_get_config(const lm_model *m); /* borrowed */
LM_API lm_device lm_model_device(const lm_model *m);                  /* where the weights and forward pass live */
/* Bytes of weights the forward pass reads per token (for roofline estimates). */
LM_API int64_t lm_model_weight_bytes(const lm_model *m);

typedef struct lm_kv_cache lm_kv_cache;

/* A cache of `slots` independent sequences of up to max_tokens positions each:
 * K and V [layers, slots, kv_heads, max_tokens, head_dim] on the model's device, f32
 * on the CPU and bf16 on CUDA. Caller owns *out. */
LM_API lm_status lm_kv_cache_create(const lm_model *m, int slots, int64_t max_tokens, lm_kv_cache **out);
LM_API void lm_kv_cache_destroy(lm_kv_cache *c); /* accepts NULL */
/* The prepared steps of a cache (one executor per step shape in use, include/loom/
 * exec.h): they share one activation arena, as large as the largest plan among them. */
typedef struct lm_kv_cache_steps {
    int64_t programs;      /* step executors held */
    int64_t arena_bytes;   /* the shared activation arena */
    int64_t planned_bytes; /* the largest executor's planned arena (= arena_bytes once it ran) */
    int64_t live_bytes;    /* the largest live lower bound: what any plan of those steps needs */
    int64_t owned_bytes;   /* operator workspaces, summed over the executors */
    int64_t last_kernels;  /* kernel launches one replay of the most recently run step makes
                            * (0 while it runs uncaptured: on the CPU, on its first run, traced) */
} lm_kv_cache_steps;
LM_API lm_status lm_kv_cache_steps_get(const lm_kv_cache *c, lm_kv_cache_steps *out);
LM_API int lm_kv_cache_slots(const lm_kv_cache *c);
LM_API int64_t lm_kv_cache_capacity(const lm_kv_cache *c);
/* Tokens already stored in slot (its next position); -1 for an invalid slot. */
LM_API int64_t lm_kv_cache_length(const lm_kv_cache *c, int slot);
/* Forgets a slot's contents (length 0). */
LM_API lm_status lm_kv_cache_reset(lm_kv_cache *c, int slot);

/* A paged cache: a pool of `blocks` blocks of `block_size` positions each, K and V
 * [layers, blocks, kv_heads, block_size, head_dim] (f32 in host memory, bf16 on a
 * device). Its sequences are the caller's: each step names every row's block table
 * (up to max_blocks_per_row blocks, so a row holds up to max_blocks_per_row *
 * block_size positions) and where the row's new tokens start; rows may share blocks
 * they only read (a common prefix), as lm_kv_store_out says. lm_kv_cache_slots gives
 * the number of blocks and lm_kv_cache_capacity the block size; the slot functions
 * (lm_model_forward, lm_kv_cache_length, lm_kv_cache_reset) refuse a paged cache. */
LM_API lm_status lm_kv_cache_create_paged(const lm_model *m, int64_t blocks, int64_t block_size,
                                          int64_t max_blocks_per_row, lm_kv_cache **out);
LM_API int64_t lm_kv_cache_blocks_per_row(const lm_kv_cache *c); /* 0 for a cache of slots */

/* Runs T new tokens for each of B slots and appends them to the cache.
 * slots [B]: distinct slot indices; ids [B, T] row-major token ids.
 * logits: f32 written as [B, T, vocab] when all_positions, else [B, vocab] for the
 * last position of each row; NULL skips the output projection entirely.
 * Errors: LM_OUT_OF_RANGE for an id outside the vocabulary or a slot that would
 * exceed the cache capacity or max_position_embeddings (nothing is appended then).
 * Sliding-window layers attend to the last sliding_window positions only. */
LM_API lm_status lm_model_forward(const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, const int *slots, int B,
                                  const int32_t *ids, int64_t T, float *logits, int all_positions);

/* Like lm_model_forward, but instead of returning logits it picks the next token of
 * each row from its last position's logits where they are (lm_sample_out's rules:
 * greedy, or temperature, top-k, top-p and min-p), so no logits row crosses to the
 * host: next_ids[B]. Row b draws with (params->seed, params->draw, b): reproducible,
 * but not lm_sampler's random stream (repetition penalties need lm_sampler and the
 * logits). Parameters outside their ranges are LM_INVALID_ARGUMENT. */
LM_API lm_status lm_model_forward_sample(const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, const int *slots, int B,
                                         const int32_t *ids, int64_t T, const lm_sample_params *params, int32_t *next_ids);
/* The same with one record per row: params [B] (row b's settings, seed and draw; with
 * LM_SAMPLE_OWN_STREAM a row's draws do not depend on its place in the batch). */
LM_API lm_status lm_model_forward_sample_rows(const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, const int *slots, int B,
                                              const int32_t *ids, int64_t T, const lm_sample_params *params,
                                              int32_t *next_ids);

/* A step of B rows over a paged cache: tables [B, max_blocks_per_row] i32 (row-major;
 * entries past a row's last position are not read), start [B] the position of each
 * row's first new token (the positions before it are already stored in its blocks),
 * ids [B, T]. logits as lm_model_forward. Errors: LM_OUT_OF_RANGE for a block outside
 * the pool, a row past its table or max_position_embeddings, an id outside the
 * vocabulary; LM_INVALID_ARGUMENT for a block two rows write. Nothing is stored then. */
LM_API lm_status lm_model_forward_paged(const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, const int32_t *tables,
                                        const int64_t *start, int B, const int32_t *ids, int64_t T, float *logits,
                                        int all_positions);
/* The same, picking each row's next token where the logits are (one sampling record
 * per row, as lm_model_forward_sample_rows). */
LM_API lm_status lm_model_forward_paged_sample(const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, const int32_t *tables,
                                               const int64_t *start, int B, const int32_t *ids, int64_t T,
                                               const lm_sample_params *params, int32_t *next_ids);

#ifdef __cplusplus
}
#endif
#endif
