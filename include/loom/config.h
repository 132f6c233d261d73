/* loom/config.h — Hugging Face model configuration (config.json plus
 * generation_config.json) for the supported decoder families, RoPE frequency tables,
 * and the expected-tensor contract between a config and a checkpoint.
 *
 * lm_model_config is a public, plain struct on purpose: every layer above io (nn,
 * infer, plan, the CLI) reads many of its fields, and tests build small configs by
 * hand without JSON. It holds no pointers and owns nothing, so it can be copied,
 * compared and stored freely (no _deinit). Fields only grow at the end, taking space
 * from `reserved`, so the struct size stays fixed across minor versions.
 *
 * Defaults follow the transformers config classes (LlamaConfig, MistralConfig,
 * Qwen2Config, Qwen3Config) where config.json omits a key:
 *                           llama      mistral    qwen2      qwen3
 *   num_key_value_heads     = heads    8          32         32     (null -> heads)
 *   head_dim                hid/heads  hid/heads  hid/heads  128    (null -> hid/heads)
 *   max_position_embeddings 2048       131072     32768      32768
 *   bos / eos token id      1 / 2      1 / 2      none       none
 *   sliding_window          -          4096       4096 if use_sliding_window (or
 *                                                layer_types' "sliding_attention" layers)
 * and for all: rms_norm_eps 1e-6, rope_theta 10000, tie_word_embeddings false,
 * hidden_act "silu" (the only one accepted), attention_bias false.
 *
 * "quantization_config" (written by `loom quantize`; docs/QUANTIZATION.md) is loom's
 * own and strictly checked: {"quant_method": "loom", "format": "int8", "scheme":
 * "per-output-channel symmetric", "modules": ["q_proj", ..., "down_proj"(, "lm_head")]},
 * no other keys; or for int4 {"quant_method": "loom", "format": "int4", "scheme":
 * "group-wise symmetric", "group_size": 32|64|128, "modules": [...]} (group_size
 * required there and refused for int8); other quant_methods (gptq, awq, bitsandbytes,
 * ...) are LM_UNSUPPORTED.
 */
#ifndef LOOM_CONFIG_H
#define LOOM_CONFIG_H

#include "loom/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Public enums: grow only at the end. */
typedef enum lm_arch { LM_ARCH_LLAMA = 0, LM_ARCH_MISTRAL = 1, LM_ARCH_QWEN2 = 2, LM_ARCH_QWEN3 = 3 } lm_arch;
typedef enum lm_rope_type {
    LM_ROPE_DEFAULT = 0,
    LM_ROPE_LINEAR = 1,
    LM_ROPE_LLAMA3 = 2,
    LM_ROPE_YARN = 3
} lm_rope_type;

LM_API const char *lm_arch_name(lm_arch a);           /* "llama", "mistral", "qwen2", "qwen3"; "invalid" */
LM_API const char *lm_rope_type_name(lm_rope_type t); /* "default", "linear", "llama3", "yarn"; "invalid" */

/* config.json "rope_scaling" (or transformers-5 "rope_parameters"). null, absent or
 * type "default" is LM_ROPE_DEFAULT; the type key is "rope_type" or legacy "type". */
typedef struct lm_rope_scaling {
    lm_rope_type type;
    double factor;           /* linear, llama3, yarn: > 0 (required for them) */
    double low_freq_factor;  /* llama3 (required): > 0 */
    double high_freq_factor; /* llama3 (required): > low_freq_factor */
    /* llama3: required, > 0. yarn: 0 when absent, meaning max_position_embeddings. */
    int64_t original_max_position_embeddings;
    double beta_fast, beta_slow; /* yarn: 32 and 1 when absent, null or 0 (as transformers) */
    double attention_factor;     /* yarn: > 0, or 0 when absent (then derived from mscale) */
    double mscale;               /* yarn: 0 when absent */
    double mscale_all_dim;       /* yarn: 0 when absent */
    int truncate;                /* yarn: 1 (default) rounds the correction range outward */
} lm_rope_scaling;

#define LM_MAX_EOS_TOKENS 16

/* generation_config.json sampling defaults; transformers' GenerationConfig defaults
 * when the file or a key is absent. */
typedef struct lm_generation_defaults {
    int present;        /* 1 when a generation_config.json was merged */
    int do_sample;      /* 0 = greedy by default */
    double temperature; /* 1.0 */
    int64_t top_k;      /* 50; 0 disables */
    double top_p;       /* 1.0 */
} lm_generation_defaults;

typedef struct lm_model_config {
    lm_arch arch;                    /* from architectures[0], else model_type */
    int64_t vocab_size;              /* required, >= 1 */
    int64_t hidden_size;             /* required, >= 1 */
    int64_t intermediate_size;       /* required, >= 1 (MLP width) */
    int64_t num_hidden_layers;       /* required, >= 1 */
    int64_t num_attention_heads;     /* required, >= 1 (query heads) */
    int64_t num_key_value_heads;     /* divides num_attention_heads (GQA/MQA/MHA) */
    int64_t head_dim;                /* even, >= 2; q_proj has heads * head_dim rows */
    int64_t max_position_embeddings; /* >= 1 */
    double rms_norm_eps;             /* > 0 */
    double rope_theta;               /* > 1 (RoPE base) */
    lm_rope_scaling rope_scaling;
    int tie_word_embeddings; /* 1: lm_head reuses model.embed_tokens.weight */
    int qkv_bias;            /* q/k/v_proj have .bias: qwen2 always; llama/qwen3 attention_bias */
    int o_bias;              /* o_proj has .bias: llama/qwen3 attention_bias */
    int mlp_bias;            /* gate/up/down_proj have .bias: llama mlp_bias */
    int qk_norm;             /* per-head RMSNorm on q and k (q_norm/k_norm): qwen3 */
    /* Sliding-window attention: window in tokens, 0 = full attention everywhere. Kept
     * only when it is active and shorter than max_position_embeddings (mistral:
     * whenever set; qwen2/qwen3: when use_sliding_window is true). */
    int64_t sliding_window;
    int64_t sliding_window_first_layer; /* layers >= this use the window (qwen max_window_layers; mistral 0) */
    lm_dtype dtype;                     /* torch_dtype / dtype; LM_F32 when absent */
    int dtype_given;                    /* 1 when config.json named a dtype */
    int64_t bos_token_id;               /* -1 = none */
    int64_t pad_token_id;               /* -1 = none */
    int n_eos;                          /* entries used in eos_token_ids */
    int64_t eos_token_ids[LM_MAX_EOS_TOKENS]; /* config.json ids first, then new ones from generation_config.json */
    lm_generation_defaults generation;
    /* Weight quantization (config.json "quantization_config", docs/QUANTIZATION.md):
     * the stored format of the listed modules' weights; LM_QUANT_NONE (0) when absent. */
    int32_t quant_format;  /* lm_quant_format */
    int32_t quant_modules; /* LM_QUANT_* module bits: the projections whose weights are quantized */
    int32_t quant_group;   /* LM_QUANT_INT4: k per scale (32, 64 or 128); else 0 */
    int32_t reserved32;    /* zero */
    int64_t reserved[14];  /* zero; room for new fields */
} lm_model_config;

/* Formats of quantized weights. LM_QUANT_INT8: i8 [out, in] weights with one f32 scale
 * per output row (symmetric: w ~= q * scale, q in [-127, 127]) in the tensor
 * "<weight name>_scale" (f32 [out]), e.g. "model.layers.0.mlp.up_proj.weight_scale". */
/* LM_QUANT_INT4: u8 [out, in/2] weights, two signed 4-bit values per byte along in (low
 * nibble first; w ~= q * scale, q in [-7, 7] as written), with one scale per group of
 * quant_group inputs in "<weight name>_scale" (bf16 [out, in / quant_group]; f32 in
 * directories written before bf16 group scales, which load as stored). */
/* LM_QUANT_FP8: f8_e4m3 [out, in] weights with one f32 scale per output row (as int8,
 * with e4m3 values for the integers; "format": "fp8", int8's scheme and keys). */
typedef enum lm_quant_format { LM_QUANT_NONE = 0, LM_QUANT_INT8 = 1, LM_QUANT_INT4 = 2, LM_QUANT_FP8 = 3 } lm_quant_format;
/* Module bits of lm_model_config.quant_modules, in the order of their names
 * (lm_quant_module_name): the Linear projections of every layer, and an untied lm_head.
 * The embedding table, norms and biases are never quantized (a tied lm_head is the
 * embedding table, so it stays float too). */
enum {
    LM_QUANT_Q_PROJ = 1 << 0,
    LM_QUANT_K_PROJ = 1 << 1,
    LM_QUANT_V_PROJ = 1 << 2,
    LM_QUANT_O_PROJ = 1 << 3,
    LM_QUANT_GATE_PROJ = 1 << 4,
    LM_QUANT_UP_PROJ = 1 << 5,
    LM_QUANT_DOWN_PROJ = 1 << 6,
    LM_QUANT_LM_HEAD = 1 << 7,
    LM_QUANT_MODULE_COUNT = 8
};
LM_API const char *lm_quant_format_name(lm_quant_format f); /* "none", "int8", "int4", "fp8"; "invalid" */
/* The name of module bit i (1 << i): "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
 * "up_proj", "down_proj", "lm_head"; NULL outside [0, LM_QUANT_MODULE_COUNT). */
LM_API const char *lm_quant_module_name(int i);
/* The modules quantized by default for cfg: every layer projection and lm_head (a
 * tied lm_head as a quantized copy of the embedding table, made at load on the CPU;
 * a quantized directory keeps the one float table). */
LM_API int32_t lm_quant_modules_default(const lm_model_config *cfg);
/* 1 when cfg stores tensor `name` quantized (a ".weight" of a module in
 * cfg->quant_modules, with cfg->quant_format set), else 0. */
LM_API int lm_model_config_tensor_quantized(const lm_model_config *cfg, const char *name);

/* Parses config.json text. source names the file in error details. Errors:
 * LM_PARSE_ERROR for malformed JSON (with line/column), a missing required field, or
 * a field of the wrong type or out of range (each naming field and source);
 * LM_UNSUPPORTED for an unknown architecture/model_type, hidden_act other than
 * "silu", a rope type other than default/linear/llama3/yarn, an unknown dtype, or a
 * quantization_config loom does not run (each naming the value). *out is fully written on success, zeroed on failure. */
LM_API lm_status lm_model_config_parse(const char *json, size_t len, const char *source, lm_model_config *out);
/* Merges generation_config.json text: eos ids (appended when new), bos/pad when
 * config.json had none, and the sampling defaults. Same error rules. On failure cfg
 * is left unchanged. */
LM_API lm_status lm_model_config_merge_generation(lm_model_config *cfg, const char *json, size_t len, const char *source);
/* dir/config.json, plus dir/generation_config.json when it exists. */
LM_API lm_status lm_model_config_load(const char *dir, lm_model_config *out);

/* RoPE tables exactly as transformers' modeling_rope_utils computes them, but in
 * double precision (transformers uses float32; expect ~1e-7 relative differences).
 * inv_freq: [head_dim / 2] caller-owned. *attention_scaling: the factor transformers
 * multiplies cos and sin by (1 except for yarn). */
LM_API lm_status lm_model_config_rope(const lm_model_config *cfg, double *inv_freq, double *attention_scaling);

/* The attention window of layer `layer` in tokens: a query at position p sees keys
 * (p - window, p]; 0 = full causal attention (also for a NULL config). */
LM_API int64_t lm_model_config_layer_window(const lm_model_config *cfg, int64_t layer);

/* One tensor a checkpoint must hold for cfg, by its Hugging Face name. */
typedef struct lm_tensor_spec {
    char name[96];
    int ndim; /* 1 (norms, biases) or 2 (weights: [out_features, in_features]) */
    int64_t shape[2];
} lm_tensor_spec;

/* The expected tensors, in a fixed order: model.embed_tokens.weight; for each layer
 * input_layernorm, self_attn.{q,k,v}_proj (+bias), o_proj (+bias), q_norm/k_norm
 * (qwen3), post_attention_layernorm, mlp.{gate,up,down}_proj (+bias); model.norm.weight;
 * lm_head.weight unless tied. i outside [0, count) is LM_OUT_OF_RANGE. */
LM_API int64_t lm_model_config_tensor_count(const lm_model_config *cfg);
LM_API lm_status lm_model_config_tensor(const lm_model_config *cfg, int64_t i, lm_tensor_spec *spec);
/* Checks that ck holds every expected tensor with a float dtype and the expected
 * shape (and lm_head.weight's shape if a tied checkpoint still stores it); for a
 * quantized config (quant_format), the modules it lists as i8 [out, in] (int8) or u8
 * [out, in/2] (int4) with f32 "<weight>_scale" tensors of the format's shape, every
 * scale finite and > 0, and every other tensor float. Extra
 * tensors are ignored. Errors name the tensor: LM_NOT_FOUND, LM_UNSUPPORTED,
 * LM_DTYPE_MISMATCH, or LM_SHAPE_MISMATCH such as
 * "tensor 'model.layers.3.mlp.up_proj.weight': shape [64,32] != expected [96,32]". */
LM_API lm_status lm_model_config_check_checkpoint(const lm_model_config *cfg, const lm_checkpoint *ck);

#ifdef __cplusplus
}
#endif
#endif
