/* nn/upload.c — a loaded model's weights moved to a device that is not host memory.
 *
 * All weights live in one device storage, carved into 256-byte aligned pieces: per
 * layer the stacked projections (q|k|v rows as one [(Hq + 2 Hkv) D, H] matrix, gate|up
 * as one [2I, H] matrix, then o and down) in bf16, and norms, biases and the RoPE
 * table in f32. Each stack is registered under its own name (the CUDA rewrite passes
 * bind "qkv_proj" and "gate_up_proj" to run one GEMM where the graph has two or
 * three) and each projection under its Hugging Face name as a row view of the stack,
 * so the canonical graph binds too. Matrices stored as bf16 are copied straight from
 * the mapped file; f32/f16 ones are rounded to bf16 on the host in chunks of CHUNK
 * elements first. Pieces are listed once, sized, then uploaded in the same order, so
 * sizing and copying cannot disagree. The host table is replaced by the device one.
 * Quantized projections (i8, u8 int4, f8_e4m3) are copied byte for byte and stacked the
 * same way when the members share a dtype and width (graph/fuse.c stacks such
 * linears), each piece followed by its scales: "<stack>_scale" holding the members'
 * "<name>_scale" rows in order, each registered as a row view. Scales keep their dtype
 * (f32; int4's group scales bf16 as quantized, which the CUDA kernels read as they are)
 * unless a stack's members differ, when all are widened to f32 (exact).
 */
#include "nn/internal.h"

#include <string.h>

#include <stdio.h>

#define CHUNK ((int64_t)1 << 20) /* elements converted per host staging round */
#define ALIGN 256

/* One piece: up to three host tensors stacked by rows into one device tensor. */
typedef struct piece {
    char name[96];       /* the stack's name (the source's own name when alone) */
    const lm_tensor *src[3];
    char part[3][96];    /* names of the row views when stacked */
    int nsrc, f32;
    lm_dtype dt; /* the device dtype: bf16, f32, or a quantized source's own */
    int64_t offset, bytes, rows, cols;
} piece;

typedef struct plan {
    piece *p; /* [n] */
    int64_t n, cap;
} plan;

static int quantized(const lm_tensor *t) {
    lm_dtype d = lm_tensor_dtype(t);
    return d == LM_I8 || d == LM_U8 || d == LM_F8_E4M3;
}

static lm_status add(const lm_model *m, plan *pl, const char *stack, const char *const *names, int n, int f32) {
    const lm_tensor *src[3] = {NULL, NULL, NULL};
    int quant = 0, mixed = 0;
    for (int i = 0; i < n; i++) {
        if (!(src[i] = lm__model_weight(m, names[i]))) return i ? LM_INTERNAL : LM_OK; /* optional piece absent */
        quant |= quantized(src[i]);
        mixed |= i && (lm_tensor_dtype(src[i]) != lm_tensor_dtype(src[0]) ||
                       lm_tensor_dim(src[i], lm_tensor_ndim(src[i]) - 1) != lm_tensor_dim(src[0], lm_tensor_ndim(src[0]) - 1));
    }
    if (quant && mixed) { /* quantized members of different formats: each alone, with its scales */
        for (int i = 0; i < n; i++) LM_TRY(add(m, pl, NULL, &names[i], 1, f32));
        return LM_OK;
    }
    LM_TRY(lm__reserve((void **)&pl->p, &pl->cap, pl->n + 1, sizeof *pl->p));
    piece *q = &pl->p[pl->n++];
    memset(q, 0, sizeof *q);
    snprintf(q->name, sizeof q->name, "%s", n > 1 ? stack : names[0]);
    q->nsrc = n, q->f32 = f32;
    q->cols = lm_tensor_ndim(src[0]) == 2 ? lm_tensor_dim(src[0], 1) : 1;
    for (int i = 0; i < n; i++) {
        q->src[i] = src[i];
        snprintf(q->part[i], sizeof q->part[i], "%s", names[i]);
        q->rows += lm_tensor_dim(src[i], 0);
    }
    q->dt = quant ? lm_tensor_dtype(src[0]) : f32 ? LM_F32 : LM_BF16;
    q->bytes = q->rows * q->cols * (int64_t)lm_dtype_size(q->dt);
    if (quant) { /* "<name>_scale", f32 [N] or [N, K/G] (f32 or bf16), stacked as the weights are */
        char scale[3][96 + 8], stack_scale[96 + 8];
        const char *sp[3] = {scale[0], scale[1], scale[2]};
        int all16 = 1;
        for (int i = 0; i < n; i++) {
            snprintf(scale[i], sizeof scale[i], "%s_scale", names[i]);
            const lm_tensor *st = lm__model_weight(m, scale[i]);
            if (!st) return lm__error(LM_INTERNAL, "upload: '%s' has no scales", names[i]);
            all16 &= lm_tensor_dtype(st) == LM_BF16;
        }
        snprintf(stack_scale, sizeof stack_scale, "%s_scale", n > 1 ? stack : names[0]);
        LM_TRY(add(m, pl, stack_scale, sp, n, !all16)); /* bf16 pieces copy bf16 sources byte for byte */
    }
    return LM_OK;
}

static void lname(char *buf, size_t n, int64_t l, const char *suffix) {
    snprintf(buf, n, "model.layers.%lld.%s", (long long)l, suffix);
}

static lm_status add_layer(const lm_model *m, plan *pl, int64_t l) {
    static const char *const mats[3][4] = {
        {"self_attn.qkv_proj.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"},
        {"mlp.gate_up_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", NULL},
        {NULL, "self_attn.o_proj.weight", "mlp.down_proj.weight", NULL}};
    static const char *const vecs[] = {"input_layernorm.weight", "post_attention_layernorm.weight",
                                       "self_attn.q_norm.weight", "self_attn.k_norm.weight", "self_attn.o_proj.bias",
                                       "mlp.down_proj.bias"};
    char stack[96], names[3][96];
    const char *np[3] = {names[0], names[1], names[2]};
    for (int k = 0; k < 2; k++) { /* the stacks, weights then biases */
        int n = mats[k][3] ? 3 : 2;
        for (int bias = 0; bias < 2; bias++) {
            lname(stack, sizeof stack, l, mats[k][0]);
            if (bias) memcpy(stack + strlen(stack) - 6, "bias", 5); /* ".weight" -> ".bias" */
            for (int i = 0; i < n; i++) {
                lname(names[i], sizeof names[i], l, mats[k][1 + i]);
                if (bias) memcpy(names[i] + strlen(names[i]) - 6, "bias", 5);
            }
            LM_TRY(add(m, pl, stack, np, n, bias));
        }
    }
    for (int k = 0; k < 2; k++) {
        lname(names[0], sizeof names[0], l, mats[2][1 + k]);
        LM_TRY(add(m, pl, NULL, np, 1, 0));
    }
    for (size_t k = 0; k < sizeof vecs / sizeof vecs[0]; k++) {
        lname(names[0], sizeof names[0], l, vecs[k]);
        LM_TRY(add(m, pl, NULL, np, 1, 1));
    }
    return LM_OK;
}

static lm_status plan_model(const lm_model *m, plan *pl) {
    const char *const mats[] = {"model.embed_tokens.weight", "lm_head.weight"};
    const char *const vecs[] = {"model.norm.weight", "rope.inv_freq"};
    for (int i = 0; i < 2; i++) LM_TRY(add(m, pl, NULL, &mats[i], 1, 0));
    for (int i = 0; i < 2; i++) LM_TRY(add(m, pl, NULL, &vecs[i], 1, 1));
    for (int64_t l = 0; l < m->cfg.num_hidden_layers; l++) LM_TRY(add_layer(m, pl, l));
    int64_t off = 0;
    for (int64_t i = 0; i < pl->n; i++) {
        off = (off + ALIGN - 1) / ALIGN * ALIGN;
        pl->p[i].offset = off;
        off += pl->p[i].bytes;
    }
    return LM_OK;
}

/* Copies t to dst as bf16 or f32, through the host buffer stage [CHUNK * 4 bytes]
 * when a conversion is needed. */
static lm_status upload_tensor(lm_device dev, uint8_t *dst, const lm_tensor *t, int f32, uint8_t *stage) {
    lm_dtype dt = lm_tensor_dtype(t);
    int64_t n = lm_tensor_numel(t);
    const uint8_t *src = lm_tensor_data(t);
    if ((f32 && dt == LM_F32) || (!f32 && dt == LM_BF16) || quantized(t)) /* quantized: its bytes as they are */
        return lm_device_copy(dev, dst, lm_device_cpu(), src, (size_t)n * lm_dtype_size(dt));
    size_t es = f32 ? 4 : 2;
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        int64_t k = LM_MIN(CHUNK, n - i0);
        for (int64_t i = 0; i < k; i++) {
            float v;
            if (dt == LM_F32) v = ((const float *)src)[i0 + i];
            else if (dt == LM_BF16) v = lm_bf16_to_f32(((const uint16_t *)src)[i0 + i]);
            else v = lm_f16_to_f32(((const uint16_t *)src)[i0 + i]);
            if (f32) ((float *)stage)[i] = v;
            else ((uint16_t *)stage)[i] = lm_f32_to_bf16(v);
        }
        LM_TRY(lm_device_copy(dev, dst + (size_t)i0 * es, lm_device_cpu(), stage, (size_t)k * es));
    }
    return LM_OK;
}

/* The device tensors of piece q (the stack, and its row views) into model d. */
static lm_status register_piece(lm_model *d, lm_storage *s, const piece *q) {
    lm_dtype dt = q->dt;
    int64_t es = (int64_t)lm_dtype_size(dt), row = 0;
    int nd = lm_tensor_ndim(q->src[0]);
    for (int i = -1; i < q->nsrc; i++) {
        if (i < 0 && q->nsrc == 1) continue; /* a lone tensor is registered as its part */
        int64_t rows = i < 0 ? q->rows : lm_tensor_dim(q->src[i], 0);
        int64_t shape[2] = {rows, q->cols};
        lm_tensor *t = NULL;
        LM_TRY(lm_tensor_from_storage(s, dt, nd, shape, NULL, (q->offset / es) + (i < 0 ? 0 : row * q->cols), &t));
        LM_TRY(lm__model_add_weight(d, i < 0 ? q->name : q->part[i], t));
        if (i >= 0) row += rows;
    }
    return LM_OK;
}

/* Every piece but the RoPE table, with the embedding table counted as one row unless it
 * is the output matrix too (tied, without a quantized copy as "lm_head.weight"). A tied
 * model's copy is what a step of up to the GEMV's rows reads; more rows read the table. */
static int64_t bytes_per_token(const lm_model *m, const plan *pl) {
    int64_t total = 0, H = m->cfg.hidden_size;
    int head_copy = 0;
    for (int64_t i = 0; i < pl->n; i++) {
        if (strcmp(pl->p[i].name, "rope.inv_freq") != 0) total += pl->p[i].bytes;
        head_copy |= strcmp(pl->p[i].name, "lm_head.weight") == 0;
    }
    return total + H * 2 - (m->cfg.tie_word_embeddings && !head_copy ? 0 : m->cfg.vocab_size * H * 2);
}

lm_status lm__model_upload(lm_model *m) {
    plan pl = {NULL, 0, 0};
    lm_storage *s = NULL;
    lm_model dev = {.cfg = m->cfg, .device = m->device};
    uint8_t *stage = lm__alloc((size_t)CHUNK * 4, 64);
    lm_status st = stage ? plan_model(m, &pl) : LM_OUT_OF_MEMORY;
    int64_t total = pl.n ? pl.p[pl.n - 1].offset + pl.p[pl.n - 1].bytes : 0;
    if (st == LM_OK) st = lm_storage_create(m->device, (size_t)total, &s);
    for (int64_t i = 0; st == LM_OK && i < pl.n; i++) {
        uint8_t *dst = (uint8_t *)lm_storage_data(s) + pl.p[i].offset;
        for (int k = 0; k < pl.p[i].nsrc && st == LM_OK; k++) {
            st = upload_tensor(m->device, dst, pl.p[i].src[k], pl.p[i].f32, stage);
            dst += lm_tensor_numel(pl.p[i].src[k]) * (int64_t)lm_dtype_size(pl.p[i].dt);
        }
    }
    for (int64_t i = 0; st == LM_OK && i < pl.n; i++) st = register_piece(&dev, s, &pl.p[i]);
    if (st == LM_OK) dev.weight_bytes = bytes_per_token(m, &pl);
    lm__free(stage);
    lm__free(pl.p);
    lm_storage_release(s); /* the tensors hold their own references */
    if (st != LM_OK) {
        for (int64_t i = 0; i < dev.nw; i++) lm_tensor_destroy(dev.w[i].t);
        lm__free(dev.w);
        return lm__error_context(st, "uploading the weights to the device");
    }
    for (int64_t i = 0; i < m->nw; i++) lm_tensor_destroy(m->w[i].t); /* the mapped host tensors */
    lm__free(m->w);
    m->w = dev.w, m->nw = dev.nw, m->cap_w = dev.cap_w;
    m->weight_bytes = dev.weight_bytes;
    return LM_OK;
}
