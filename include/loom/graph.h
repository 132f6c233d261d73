/* loom/graph.h — the model-step graph IR: fixed-shape SSA values and ops in program
 * order, views that move no data, and Repeat regions. One IR serves every consumer:
 * the decoder builder (one description of the model per mode), the rewrite passes,
 * the executors (CPU, CUDA, autograd) and the tile compiler (loom/plan.h).
 *
 * This header is the public builder API for the ops a tile-compiler workload uses;
 * the decoder builder adds model-step ops (embedding, RoPE, attention, KV cache)
 * internally. Values are referred to by lm_graph_value handles returned by the
 * builders; every builder validates shapes/dtypes and names the op in its error
 * detail. Values have 1..4 dimensions.
 */
#ifndef LOOM_GRAPH_H
#define LOOM_GRAPH_H

#include "loom/base.h"
#include "loom/config.h"
#include "loom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lm_graph lm_graph;
typedef int32_t lm_graph_value;

typedef enum lm_graph_unary_kind { LM_GRAPH_GELU = 0, LM_GRAPH_SILU = 1 } lm_graph_unary_kind;
typedef enum lm_graph_binary_kind { LM_GRAPH_ADD = 0, LM_GRAPH_MUL = 1 } lm_graph_binary_kind;

LM_API lm_status lm_graph_create(lm_graph **out);
LM_API void lm_graph_destroy(lm_graph *g);

/* Activations fed by the caller; the simulator fills them with N(0, std^2). Shapes
 * have 1..4 dimensions; dtype f32 or f16. */
LM_API lm_status lm_graph_input(lm_graph *g, const char *name, lm_dtype dt, int ndim, const int64_t *shape,
                                double std, lm_graph_value *out);
/* Resident parameters (weights, biases, norm scales) filled with mean + N(0, std^2).
 * Inside a Repeat body a parameter has one copy per iteration. */
LM_API lm_status lm_graph_param(lm_graph *g, const char *name, lm_dtype dt, int ndim, const int64_t *shape,
                                double mean, double std, lm_graph_value *out);
/* a [..., M, K] x b [..., K, N] -> [..., M, N] in out_dt with f32 accumulation. a and
 * b have the same leading (batch) dims, or b has none (shared weights). */
LM_API lm_status lm_graph_matmul(lm_graph *g, const char *name, lm_graph_value a, lm_graph_value b, lm_dtype out_dt,
                                 lm_graph_value *out);
/* x [..., N] + bias [N]. */
LM_API lm_status lm_graph_bias_add(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value bias,
                                   lm_graph_value *out);
/* GeLU uses the tanh approximation (gelu_pytorch_tanh). */
LM_API lm_status lm_graph_unary(lm_graph *g, const char *name, lm_graph_unary_kind op, lm_graph_value x,
                                lm_graph_value *out);
/* Same shapes and dtypes. */
LM_API lm_status lm_graph_binary(lm_graph *g, const char *name, lm_graph_binary_kind op, lm_graph_value a, lm_graph_value b,
                                 lm_graph_value *out);
/* softmax(scale * x) over the last axis. */
LM_API lm_status lm_graph_softmax(lm_graph *g, const char *name, lm_graph_value x, double scale, lm_graph_value *out);
/* Over the last axis; gamma/beta [N] (beta may be -1 for none). */
LM_API lm_status lm_graph_layer_norm(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value gamma,
                                     lm_graph_value beta, double eps, lm_graph_value *out);
LM_API lm_status lm_graph_rms_norm(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value gamma, double eps,
                                   lm_graph_value *out);
/* Views (no data movement): reshape keeps the element order; permute reorders axes
 * (out axis i = in axis perm[i]). split_heads [T, H*D] -> [H, T, D] and merge_heads
 * [H, T, D] -> [T, H*D] are reshape+permute compositions. */
LM_API lm_status lm_graph_reshape(lm_graph *g, const char *name, lm_graph_value x, int ndim, const int64_t *shape,
                                  lm_graph_value *out);
LM_API lm_status lm_graph_permute(lm_graph *g, const char *name, lm_graph_value x, const int *perm,
                                  lm_graph_value *out);
LM_API lm_status lm_graph_split_heads(lm_graph *g, const char *name, lm_graph_value x, int64_t heads,
                                      lm_graph_value *out);
LM_API lm_status lm_graph_merge_heads(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value *out);
/* Rotary position embedding of x [B, T, H, D] (D even) at positions [B, T] (i32
 * input) with inv_freq [D/2] (f32 parameter): each head's dims (i, i + D/2) rotate by
 * position * inv_freq[i] (Hugging Face llama's rotate_half pairing); attn_factor
 * scales cos and sin (yarn). Output: x's shape and dtype. */
LM_API lm_status lm_graph_rope(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value positions,
                               lm_graph_value inv_freq, double attn_factor, lm_graph_value *out);
/* q [B, Tq, Hq, D], k [B, Tk, Hkv, D], v [B, Tk, Hkv, Dv] -> [B, Tq, Hq, Dv] (token
 * major, as the projections produce them): softmax(q k^T * scale) v per head; query
 * head h reads kv head h / (Hq / Hkv).
 * causal: query i (at key position i + Tk - Tq) sees keys j <= i + Tk - Tq; window
 * > 0 (causal only) also drops keys j <= i + Tk - Tq - window, keeping the last
 * `window` positions up to the query's own (Hugging Face sliding-window attention). */
LM_API lm_status lm_graph_attention(lm_graph *g, const char *name, lm_graph_value q, lm_graph_value k, lm_graph_value v,
                                    double scale, int causal, int64_t window, lm_graph_value *out);
/* silu(gate) * up, same shapes and dtype. */
LM_API lm_status lm_graph_swiglu(lm_graph *g, const char *name, lm_graph_value gate, lm_graph_value up,
                                 lm_graph_value *out);
/* Repeat an identical block count times. outer[i] (defined before) seeds the body
 * input inner[i]; after the body, repeat_end(body_out) carries body_out[i] into the
 * next iteration's inner[i] (same shape and dtype) and returns the last iteration's
 * values as outer_out[i]. At most 4 carried values; no nesting. */
LM_API lm_status lm_graph_repeat_begin(lm_graph *g, int64_t count, int n, const lm_graph_value *outer,
                                       lm_graph_value *inner);
LM_API lm_status lm_graph_repeat_end(lm_graph *g, int n, const lm_graph_value *body_out, lm_graph_value *outer_out);
/* Marks a value as a program output (compared with the reference). */
LM_API lm_status lm_graph_output(lm_graph *g, lm_graph_value v);
/* A named value the simulator validates against the reference where it is produced
 * (every iteration inside a Repeat). */
LM_API lm_status lm_graph_checkpoint(lm_graph *g, lm_graph_value v, const char *name);

/* ---- the decoder builder: one description of llama / mistral / qwen2 / qwen3 ---------------
 * Builds the canonical graph of a model step from a config (architecture features are
 * the config's flags). Names the executors bind by:
 *   inputs   "ids" [B, T] i32 (step, train); "positions" [B, T] i32 ([1, T] in layer
 *            mode); "slots" [B] i32 (step: the cache slot of each row; [B, NB], the rows'
 *            block tables, for a paged cache); "k_cache.L",
 *            "v_cache.L" [slots, kv_heads, cache_tokens, head_dim] per layer L (step);
 *            "targets" [B*T] i32 (train, loss; -100 = ignored); "sample_params" u8
 *            [B * LM_SAMPLE_PARAMS_BYTES] (step, sample: one record per row);
 *            "hidden" [T, hidden] (layer)
 *   params   the Hugging Face tensor names ("model.layers.3.mlp.up_proj.weight", ...)
 *            plus "rope.inv_freq" [head_dim / 2] f32 (lm_model_config_rope's table)
 *   outputs  the single program output: logits f32 [B, V] (last token of each row) or
 *            [B*T, V]; next ids i32 [B]; the loss (f32 scalar [1]); the hidden state
 *            [B*T, hidden] (step with no output, layer mode). */
typedef enum lm_decoder_mode {
    LM_DECODER_STEP = 0,  /* B rows x T new tokens appended to a KV cache (prefill and decode) */
    LM_DECODER_TRAIN = 1, /* B rows x T tokens from position 0, causal self-attention, no cache */
    LM_DECODER_LAYER = 2  /* one decoder layer on T tokens, hidden state in and out (tile compiler) */
} lm_decoder_mode;

typedef enum lm_decoder_output {
    LM_DECODER_OUT_NONE = 0,        /* step: the hidden state (the caches are updated) */
    LM_DECODER_OUT_LAST_LOGITS = 1, /* step: logits of each row's last token */
    LM_DECODER_OUT_ALL_LOGITS = 2,  /* step, train: logits of every token */
    LM_DECODER_OUT_SAMPLE = 3,      /* step: each row's next token, picked where the logits are (lm_sample_out) */
    LM_DECODER_OUT_LOSS = 4         /* train: mean cross-entropy against "targets" (output projection fused) */
} lm_decoder_output;

typedef struct lm_decoder_options {
    lm_decoder_mode mode;
    lm_decoder_output output;
    int64_t batch, tokens;             /* B rows of T tokens (layer mode: B = 1) */
    int64_t cache_slots, cache_tokens; /* step: the KV cache geometry (paged: blocks, and positions per block) */
    int64_t cache_blocks_per_row;      /* step: 0 = one slot per row ("slots" [B]); NB > 0 = a paged cache
                                          ("slots" is the block table [B, NB], see lm_kv_store_out) */
    int64_t layer;                     /* layer mode: which layer */
    lm_dtype act_dtype;                /* residual stream and activations */
    lm_dtype matrix_dtype;             /* 2-d weights (unless param_dtype says otherwise) */
    lm_dtype vector_dtype;             /* norm weights and biases */
    lm_dtype kv_dtype;                 /* the KV cache (step) */
    /* Optional: the dtype of parameter `name` (default: matrix_dtype or vector_dtype). */
    lm_dtype (*param_dtype)(void *user, const char *name, lm_dtype dflt);
    void *param_user;
    /* Tied embeddings whose config quantizes lm_head (the loader's quantized copy of the
     * table, "lm_head.weight"): 1 makes the output matrix the float table instead, for
     * row counts where the copy's product would cost more (a device's dequantizing pass
     * past its GEMV rows; lm_linear_workspace_bytes > 0). 0 (default): the copy. */
    int tied_head_float;
} lm_decoder_options;

/* Step mode, last-token logits, B = T = 1, every dtype f32. */
LM_API void lm_decoder_options_default(lm_decoder_options *o);
/* The canonical graph (no fused ops) of config c for o. LM_INVALID_ARGUMENT names an
 * option that does not fit the mode. Caller owns *out. */
LM_API lm_status lm_graph_build_decoder(const lm_model_config *c, const lm_decoder_options *o, lm_graph **out);

#ifdef __cplusplus
}
#endif
#endif
