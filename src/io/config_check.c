/* io/config_check.c — the Hugging Face tensor names and shapes a config implies, and
 * the check of a checkpoint against them.
 *
 * Linear weights are [out_features, in_features] as torch stores them. The list is
 * 1 + layers * per_layer + 1 (+1 for an untied lm_head) entries, enumerated by index
 * without allocation: entry i maps to (layer, slot) arithmetically.
 */
#include "io/internal.h"
#include "loom/config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef enum slot_kind {
    S_INPUT_NORM, S_Q, S_K, S_V, S_O, S_Q_NORM, S_K_NORM, S_POST_NORM, S_GATE, S_UP, S_DOWN
} slot_kind;

typedef struct slot {
    slot_kind kind;
    int bias; /* 1: the .bias of the projection, 0: its .weight (or the norm weight) */
} slot;

/* The per-layer tensors cfg implies, in order. Returns the count (at most 16). */
static int layer_slots(const lm_model_config *cfg, slot *s) {
    int n = 0;
    s[n++] = (slot){S_INPUT_NORM, 0};
    for (slot_kind k = S_Q; k <= S_V; k++) {
        s[n++] = (slot){k, 0};
        if (cfg->qkv_bias) s[n++] = (slot){k, 1};
    }
    s[n++] = (slot){S_O, 0};
    if (cfg->o_bias) s[n++] = (slot){S_O, 1};
    if (cfg->qk_norm) {
        s[n++] = (slot){S_Q_NORM, 0};
        s[n++] = (slot){S_K_NORM, 0};
    }
    s[n++] = (slot){S_POST_NORM, 0};
    for (slot_kind k = S_GATE; k <= S_DOWN; k++) {
        s[n++] = (slot){k, 0};
        if (cfg->mlp_bias) s[n++] = (slot){k, 1};
    }
    return n;
}

static void set2(lm_tensor_spec *sp, int64_t out, int64_t in) {
    sp->ndim = 2;
    sp->shape[0] = out;
    sp->shape[1] = in;
}

static void layer_spec(const lm_model_config *cfg, int64_t layer, slot s, lm_tensor_spec *sp) {
    static const char *const names[] = {
        [S_INPUT_NORM] = "input_layernorm",  [S_Q] = "self_attn.q_proj",       [S_K] = "self_attn.k_proj",
        [S_V] = "self_attn.v_proj",          [S_O] = "self_attn.o_proj",       [S_Q_NORM] = "self_attn.q_norm",
        [S_K_NORM] = "self_attn.k_norm",     [S_POST_NORM] = "post_attention_layernorm",
        [S_GATE] = "mlp.gate_proj",          [S_UP] = "mlp.up_proj",           [S_DOWN] = "mlp.down_proj",
    };
    int64_t hid = cfg->hidden_size, q = cfg->num_attention_heads * cfg->head_dim;
    int64_t kv = cfg->num_key_value_heads * cfg->head_dim, inter = cfg->intermediate_size;
    snprintf(sp->name, sizeof sp->name, "model.layers.%lld.%s.%s", (long long)layer, names[s.kind],
             s.bias ? "bias" : "weight");
    switch (s.kind) {
    case S_INPUT_NORM:
    case S_POST_NORM: set2(sp, hid, 0); break;
    case S_Q_NORM:
    case S_K_NORM: set2(sp, cfg->head_dim, 0); break;
    case S_Q: set2(sp, q, hid); break;
    case S_K:
    case S_V: set2(sp, kv, hid); break;
    case S_O: set2(sp, hid, q); break;
    case S_GATE:
    case S_UP: set2(sp, inter, hid); break;
    case S_DOWN: set2(sp, hid, inter); break;
    }
    if (s.kind == S_INPUT_NORM || s.kind == S_POST_NORM || s.kind == S_Q_NORM || s.kind == S_K_NORM || s.bias) {
        sp->ndim = 1; /* norms and biases: [out_features] */
        sp->shape[1] = 0;
    }
}

int64_t lm_model_config_tensor_count(const lm_model_config *cfg) {
    slot s[16];
    return 2 + cfg->num_hidden_layers * layer_slots(cfg, s) + (cfg->tie_word_embeddings ? 0 : 1);
}

lm_status lm_model_config_tensor(const lm_model_config *cfg, int64_t i, lm_tensor_spec *spec) {
    if (!cfg || !spec) return lm__error(LM_INVALID_ARGUMENT, "lm_model_config_tensor: NULL argument");
    int64_t count = lm_model_config_tensor_count(cfg);
    if (i < 0 || i >= count)
        return lm__error(LM_OUT_OF_RANGE, "expected tensor %lld out of range [0, %lld)", (long long)i,
                         (long long)count);
    memset(spec, 0, sizeof *spec);
    slot s[16];
    int64_t per = layer_slots(cfg, s), body = cfg->num_hidden_layers * per;
    if (i == 0) {
        snprintf(spec->name, sizeof spec->name, "model.embed_tokens.weight");
        set2(spec, cfg->vocab_size, cfg->hidden_size);
    } else if (i <= body) {
        layer_spec(cfg, (i - 1) / per, s[(i - 1) % per], spec);
    } else if (i == body + 1) {
        snprintf(spec->name, sizeof spec->name, "model.norm.weight");
        spec->ndim = 1;
        spec->shape[0] = cfg->hidden_size;
    } else {
        snprintf(spec->name, sizeof spec->name, "lm_head.weight");
        set2(spec, cfg->vocab_size, cfg->hidden_size);
    }
    return LM_OK;
}

static lm_status check_entry(const lm_checkpoint *ck, const lm_tensor_spec *sp, const lm_safetensors_entry *e) {
    if (!lm_dtype_is_float(e->dtype))
        return lm__error(LM_DTYPE_MISMATCH, "tensor '%s' in checkpoint '%s': dtype %s is not f32, bf16 or f16",
                         sp->name, lm_checkpoint_path(ck), lm_dtype_name(e->dtype));
    int same = e->ndim == sp->ndim;
    for (int d = 0; same && d < sp->ndim; d++) same = e->shape[d] == sp->shape[d];
    if (same) return LM_OK;
    char have[160], want[64];
    return lm__error(LM_SHAPE_MISMATCH, "tensor '%s': shape %s != expected %s", sp->name,
                     lm__io_shape_str(e->ndim, e->shape, have, sizeof have),
                     lm__io_shape_str(sp->ndim, sp->shape, want, sizeof want));
}

/* A quantized weight and its scales, as a quantized directory stores them: int8 i8 [out,
 * in] (fp8: F8_E4M3 [out, in]) with f32 [out] scales; int4 u8 [out, in/2] with bf16 (or,
 * as written before bf16 group scales, f32) [out, in/group] scales. */
static lm_status check_quant_entry(const lm_model_config *cfg, const lm_checkpoint *ck, const lm_tensor_spec *sp) {
    lm_safetensors_entry e;
    char scale[sizeof sp->name + 8], have[160], want[64];
    int int4 = cfg->quant_format == LM_QUANT_INT4, fp8 = cfg->quant_format == LM_QUANT_FP8, G = cfg->quant_group;
    const char *fmt = lm_quant_format_name((lm_quant_format)cfg->quant_format);
    int64_t qs[2] = {sp->shape[0], int4 ? sp->shape[1] / 2 : sp->shape[1]};
    int64_t ss[2] = {sp->shape[0], int4 && G > 0 ? sp->shape[1] / G : 1};
    if (int4 && (G <= 0 || sp->shape[1] % G))
        return lm__error(LM_SHAPE_MISMATCH, "tensor '%s': %lld inputs are not a multiple of the int4 group_size %d",
                         sp->name, (long long)sp->shape[1], G);
    LM_TRY(lm_checkpoint_find(ck, sp->name, &e));
    if (e.dtype != (int4 ? LM_U8 : fp8 ? LM_F8_E4M3 : LM_I8))
        return lm__error(LM_DTYPE_MISMATCH, "tensor '%s' in checkpoint '%s': dtype %s, but quantization_config says "
                         "it is %s", sp->name, lm_checkpoint_path(ck), e.dtype_name,
                         int4 ? "int4 (u8, two values per byte)" : fp8 ? "fp8 (F8_E4M3)" : "int8 (i8)");
    int same = e.ndim == 2 && e.shape[0] == qs[0] && e.shape[1] == qs[1];
    if (!same)
        return lm__error(LM_SHAPE_MISMATCH, "tensor '%s': shape %s != expected %s", sp->name,
                         lm__io_shape_str(e.ndim, e.shape, have, sizeof have), lm__io_shape_str(2, qs, want, sizeof want));
    snprintf(scale, sizeof scale, "%s_scale", sp->name);
    lm_status st = lm_checkpoint_find(ck, scale, &e);
    if (st == LM_NOT_FOUND)
        return lm__error(LM_NOT_FOUND, "checkpoint '%s': scale tensor '%s' of %s weight '%s' is missing",
                         lm_checkpoint_path(ck), scale, fmt, sp->name);
    LM_TRY(st);
    if (e.dtype != LM_F32 && !(int4 && e.dtype == LM_BF16))
        return lm__error(LM_DTYPE_MISMATCH, "scale tensor '%s': dtype %s, expected %s", scale, e.dtype_name,
                         int4 ? "BF16 or F32" : "F32");
    if (int4 && (e.ndim != 2 || e.shape[0] != ss[0] || e.shape[1] != ss[1]))
        return lm__error(LM_SHAPE_MISMATCH, "scale tensor '%s': shape %s != expected %s (one per group of %d inputs "
                         "of '%s')", scale, lm__io_shape_str(e.ndim, e.shape, have, sizeof have),
                         lm__io_shape_str(2, ss, want, sizeof want), G, sp->name);
    if (!int4 && (e.ndim != 1 || e.shape[0] != sp->shape[0]))
        return lm__error(LM_SHAPE_MISMATCH, "scale tensor '%s': shape %s != expected [%lld] (one per output row of '%s')",
                         scale, lm__io_shape_str(e.ndim, e.shape, have, sizeof have), (long long)sp->shape[0], sp->name);
    for (int64_t r = 0; r < ss[0] * ss[1]; r++) {
        float v;
        if (e.dtype == LM_BF16) {
            uint16_t h;
            memcpy(&h, (const char *)e.data + 2 * r, 2);
            v = lm_bf16_to_f32(h);
        } else
            memcpy(&v, (const char *)e.data + 4 * r, 4);
        if (!(v > 0 && v < INFINITY))
            return lm__error(LM_INVALID_ARGUMENT, "scale tensor '%s': element %lld is %g (scales are finite and > 0)",
                             scale, (long long)r, (double)v);
    }
    return LM_OK;
}

lm_status lm_model_config_check_checkpoint(const lm_model_config *cfg, const lm_checkpoint *ck) {
    if (!cfg || !ck) return lm__error(LM_INVALID_ARGUMENT, "lm_model_config_check_checkpoint: NULL argument");
    int64_t n = lm_model_config_tensor_count(cfg);
    lm_tensor_spec sp;
    lm_safetensors_entry e;
    for (int64_t i = 0; i < n; i++) {
        LM_TRY(lm_model_config_tensor(cfg, i, &sp));
        if (cfg->quant_format && lm_model_config_tensor_quantized(cfg, sp.name)) {
            LM_TRY(check_quant_entry(cfg, ck, &sp));
            continue;
        }
        LM_TRY(lm_checkpoint_find(ck, sp.name, &e));
        if (cfg->quant_format && (e.dtype == LM_I8 || e.dtype == LM_U8 || e.dtype == LM_F8_E4M3))
            return lm__error(LM_DTYPE_MISMATCH, "tensor '%s' in checkpoint '%s' is %s, but quantization_config.modules "
                             "does not list its module (it must be f32, bf16 or f16)", sp.name, lm_checkpoint_path(ck),
                             e.dtype == LM_I8 ? "int8" : e.dtype == LM_U8 ? "u8 (int4)" : "fp8 (F8_E4M3)");
        LM_TRY(check_entry(ck, &sp, &e));
    }
    if (!cfg->tie_word_embeddings) return LM_OK;
    lm_status s = lm_checkpoint_find(ck, "lm_head.weight", &e);
    if (s == LM_NOT_FOUND) {
        lm_clear_error(); /* a tied checkpoint normally omits it */
        return LM_OK;
    }
    LM_TRY(s);
    snprintf(sp.name, sizeof sp.name, "lm_head.weight");
    set2(&sp, cfg->vocab_size, cfg->hidden_size);
    return check_entry(ck, &sp, &e);
}
