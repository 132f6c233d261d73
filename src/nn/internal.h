/* nn/internal.h — the model and KV-cache records shared by the nn sources (never
 * installed).
 *
 * A model is its config plus a table of named weights on its device: every tensor
 * the config expects (Hugging Face names), "rope.inv_freq", and on devices that are
 * not host memory also the stacked projections the CUDA rewrite passes bind
 * ("model.layers.N.self_attn.qkv_proj.weight" = q|k|v rows, "...mlp.gate_up_proj.
 * weight" = gate|up rows, and their biases), whose per-projection names are row
 * views of the same storage. With int8 weights (CPU only) a quantized projection
 * "<name>.weight" is i8 [out, in] and its scales "<name>.weight_scale" f32 [out]. The forward pass is the decoder graph
 * (graph/decoder.c) run by an executor (exec/); a KV cache keeps the executors of
 * the step shapes it has seen, since they bind its tensors.
 */
#ifndef LOOM_NN_INTERNAL_H
#define LOOM_NN_INTERNAL_H

#include "base/internal.h"
#include "loom/exec.h"
#include "loom/model.h"

typedef struct lm__weight {
    char name[96];
    lm_tensor *t; /* owned reference */
} lm__weight;

struct lm_model {
    lm_model_config cfg;
    lm_device device;
    lm__weight *w; /* [nw] sorted by name */
    int64_t nw, cap_w;
    int64_t weight_bytes; /* bytes one decode step reads */
    int on_host;          /* the device is host memory: mapped weights, f32 KV cache (else bf16, uploaded) */
    lm_weights weights;   /* LM_WEIGHTS_INT8: the projections are i8 + "<name>_scale" f32 [out]; LM_WEIGHTS_INT4:
                             u8 [out, in/2] + "<name>_scale" f32 [out, in/group]; else float */
    lm_precision precision; /* of the CPU products in the forward pass (set around each executor run, nn/step.c) */
};

/* nn/model.c: float weights w [out, in] quantized as cfg's quant_format says (int8:
 * q i8 [out, in], scales f32 [out]; int4: q u8 [out, in/2], scales f32 [out,
 * in/quant_group]) into new host tensors; the one function quantize-at-load and
 * `loom quantize` share, so both give the same bytes. */
lm_status lm__quantize_matrix(lm_ctx *ctx, const lm_model_config *cfg, const lm_tensor_view *w, lm_tensor **q,
                              lm_tensor **scales);

/* nn/model.c: the weight called name, or NULL. */
const lm_tensor *lm__model_weight(const lm_model *m, const char *name);
/* nn/model.c: for a stacked name ("...qkv_proj.weight", "...gate_up_proj.bias", their
 * "_scale"s) a new host tensor of its members' rows in order (q|k|v, gate|up; as
 * nn/upload.c stacks them on a device); LM_NOT_FOUND naming what is missing. */
lm_status lm__model_stacked_weight(const lm_model *m, const char *name, lm_tensor **out);
/* nn/model.c: lm_decoder_options.param_dtype for model user (an lm_model *): the dtype
 * of the weight called name as the model holds it (quantized projections, a float
 * table), dflt for a name it lacks. */
lm_dtype lm__model_param_dtype(void *user, const char *name, lm_dtype dflt);
/* nn/model.c: adds (takes) t under name; keeps the table sorted. */
lm_status lm__model_add_weight(lm_model *m, const char *name, lm_tensor *t);
/* nn/upload.c: moves the host weight table of m onto m->device: matrices as bf16
 * (q|k|v and gate|up stacked), vectors as f32, one device allocation. */
lm_status lm__model_upload(lm_model *m);
/* nn/model.c: whether weights and the forward pass run in host memory (mapped
 * weights in their stored dtype, f32 KV cache) or on a device (bf16). */
int lm__model_on_host(const lm_model *m);

/* One prepared step shape of a cache: the executor and its input buffers. */
typedef struct lm__step_prog {
    int64_t B, T;
    lm_decoder_output output;
    lm_exec *exec;
    lm_tensor_view ids, positions, slots, sample; /* the inputs ([B, T], [B, T], [B] or [B, NB], params): views
                                                     of dev_in */
    lm_device device;  /* of the staging memory */
    struct lm__step_layout {
        size_t ids, positions, slots, next, params, bytes; /* byte offsets, and the size */
    } layout;          /* of host_in and dev_in: ids [B*T], positions [B*T], slots [B] (or block
                          tables [B*NB]), sampled ids [B]
                          (i32), then one sampling record per row, 8-aligned */
    char *host_in;     /* lm_host_alloc staging (pinned for a GPU, so the copy is queued) */
    lm_tensor *dev_in; /* the same layout on the device: one copy moves every input of a step */
    int64_t last_used; /* for eviction */
} lm__step_prog;

struct lm_kv_cache {
    int layers, slots;                 /* slots: the slots, or the blocks of a paged cache */
    int64_t kv_heads, max_tokens, head_dim; /* max_tokens: positions per slot, or per block */
    int64_t blocks_per_row;            /* 0: a cache of slots; NB: paged, block tables [B, NB] */
    lm_tensor *k, *v; /* [layers, slots, kv_heads, max_tokens, head_dim]: f32 in host memory, bf16 on a device */
    int64_t *length;  /* [slots] tokens stored per slot (NULL when paged: the caller tracks lengths) */
    lm__step_prog *progs; /* [nprogs] executors of the step shapes seen (evicted least recently used) */
    int nprogs, cap_progs;
    int64_t clock;
    /* One activation arena shared by every step executor: steps run one at a time and
     * each is read back before the next, so the largest plan is all the memory needed. */
    lm_device arena_device;
    void *arena;
    size_t arena_bytes;
};

/* nn/kv_cache.c: the prepared step of m for (B, T, output) on cache, built on first
 * use (and the least recently used one evicted beyond the cache's budget). */
lm_status lm__kv_cache_program(const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, int64_t B, int64_t T,
                               lm_decoder_output output, lm__step_prog **out);

#endif
