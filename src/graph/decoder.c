/* graph/decoder.c — the one description of a decoder-only transformer (llama,
 * mistral, qwen2, qwen3): a model config and a mode in, a graph out.
 *
 * Architecture features are flags of the config (qkv/o/mlp biases, qwen3's per-head
 * q/k RMSNorm, grouped kv heads, tied embeddings, RoPE scaling through the
 * inv_freq table, sliding windows per layer); the modes differ only where they must:
 *   step   B rows x T new tokens at per-row positions, K/V written into a cache and
 *          attention over everything the row's slot holds (prefill and decode alike);
 *   train  B rows x T tokens from position 0, causal self-attention, the fused
 *          output projection + cross-entropy (or the logits);
 *   layer  one decoder layer on T tokens, hidden state in and out (tile compiler).
 * Per layer, for N = B*T rows of the residual stream x [N, H]:
 *   h = rmsnorm(x); q, k, v = h W^T (+b); [B, T, heads, D] views; (qwen3) rmsnorm of
 *   q and k per head; rope at the rows' positions; attention (grouped kv heads,
 *   causal, the layer's window); x += attn Wo^T (+b); h = rmsnorm(x);
 *   x += (silu(h Wg^T) * h Wu^T) Wd^T.
 * Int8 weights (the parameter's dtype is i8: lm_decoder_options.param_dtype says so)
 * are the exception to the matmul form: such a projection is one linear op reading
 * "<name>.weight" (i8) and its per-row scales "<name>.weight_scale" (f32 [out]), as
 * the operator takes them (lm_linear_params.w_scales); train mode refuses them. Int4
 * weights (dtype u8: the parameter is [out, in/2], two values per byte) likewise, with
 * scales f32 [out, in / config quant_group] and the group in the op's attribute b. The
 * embedding table, norms and biases stay float (a tied lm_head is the table).
 * The graph is otherwise canonical: no fused ops. Executors rewrite it for their device
 * (graph/rewrite.c, graph/fuse.c). Parameters are named by their Hugging Face
 * tensor names, plus "rope.inv_freq"; inputs and outputs by the names in
 * include/loom/graph.h.
 */
#include "graph/ir.h"

#include "loom/config.h"
#include "loom/ops.h"

#include <math.h>
#include <stdio.h>

void lm_decoder_options_default(lm_decoder_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->mode = LM_DECODER_STEP;
    o->output = LM_DECODER_OUT_LAST_LOGITS;
    o->batch = o->tokens = 1;
    o->act_dtype = o->matrix_dtype = o->vector_dtype = o->kv_dtype = LM_F32;
}

typedef struct builder {
    lm_graph *g;
    const lm_model_config *c;
    const lm_decoder_options *o;
    int64_t B, T, N; /* rows, tokens per row, N = B * T */
    double rope_factor; /* the attention factor of the config's RoPE scaling (yarn), else 1 */
    lm_graph_value positions, slots, inv_freq, embed;
} builder;

static lm_dtype param_dtype(const builder *b, const char *name, int ndim) {
    lm_dtype d = ndim == 2 ? b->o->matrix_dtype : b->o->vector_dtype;
    return b->o->param_dtype ? b->o->param_dtype(b->o->param_user, name, d) : d;
}

/* A new parameter value. (Each name is created once: the only parameter read twice,
 * a tied embedding, is kept in builder.embed.) */
static lm_status param(builder *b, const char *name, int ndim, const int64_t *shape, lm_graph_value *out) {
    double std = ndim == 2 ? 1.0 / sqrt((double)shape[1]) : 0.02, mean = 0.0;
    size_t n = strlen(name);
    if (n >= 11 && strcmp(name + n - 11, "norm.weight") == 0) mean = 1.0, std = 0.0; /* the simulator's fill */
    lm_dtype dt = param_dtype(b, name, ndim);
    if (dt == LM_U8 && ndim == 2) { /* int4: two values per byte along the inputs */
        if (shape[1] % 2)
            return lm__error(LM_SHAPE_MISMATCH, "decoder graph: int4 weight '%s' has an odd number of inputs (%lld)",
                             name, (long long)shape[1]);
        int64_t packed[2] = {shape[0], shape[1] / 2};
        return lm_graph_param(b->g, name, dt, 2, packed, 0.0, 0.0, out);
    }
    return lm_graph_param(b->g, name, dt, ndim, shape, mean, std, out);
}

static lm_status layer_param(builder *b, int64_t l, const char *suffix, int ndim, const int64_t *shape,
                             lm_graph_value *out) {
    char name[128]; /* longer than LM__G_NAME is refused by the param builder, naming it */
    snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l, suffix);
    return param(b, name, ndim, shape, out);
}

/* 1 for a quantized weight value: i8 (int8), u8 (int4, two values per byte) or
 * f8_e4m3 (fp8, built as int8 is: one f32 scale per row). */
static int quantized(const builder *b, lm_graph_value w) {
    lm_dtype d = b->g->values[w].dtype;
    return d == LM_I8 || d == LM_U8 || d == LM_F8_E4M3;
}

/* A quantized weight w (parameter "<name>.weight": int8 i8 [n_out, K], or int4 u8
 * [n_out, K/2]): its scales are the parameter "<name>.weight_scale" (int8: f32
 * [n_out], one per row; int4: [n_out, K / quant_group], one per group of the config's
 * quant_group inputs, f32 or, as param_dtype says, bf16) and the product is one linear
 * op (quantized weights have no canonical matmul form). Training them is refused. */
static lm_status linear_quant(builder *b, const char *nm, lm_graph_value x, lm_graph_value w, const char *wname,
                              lm_graph_value bias, lm_dtype out_dt, lm_graph_value *y) {
    char s[LM__G_NAME + 8];
    int int4 = b->g->values[w].dtype == LM_U8;
    if (b->o->mode == LM_DECODER_TRAIN)
        return lm__error(LM_UNSUPPORTED, "decoder graph (train): '%s' is an %s weight; quantized weights cannot be "
                         "trained (train from the float checkpoint)", wname,
                         int4 ? "int4" : b->g->values[w].dtype == LM_F8_E4M3 ? "fp8" : "int8");
    int64_t N = b->g->values[w].dims[0], K = b->g->values[x].dims[1], G = b->c->quant_group;
    lm_graph_value sc;
    snprintf(s, sizeof s, "%s_scale", wname);
    if (!int4) {
        int64_t ns[1] = {N};
        LM_TRY(lm_graph_param(b->g, s, LM_F32, 1, ns, 1.0 / 127, 0.0, &sc));
        return lm__graph_linear_int8(b->g, nm, x, w, sc, bias, out_dt, y);
    }
    if (G <= 0 || K % G)
        return lm__error(LM_INVALID_ARGUMENT, "decoder graph: int4 weight '%s' with %lld inputs needs the config's "
                         "quant_group (%lld) to divide them", wname, (long long)K, (long long)G);
    int64_t ss[2] = {N, K / G};
    lm_dtype sdt = b->o->param_dtype ? b->o->param_dtype(b->o->param_user, s, LM_F32) : LM_F32;
    LM_TRY(lm_graph_param(b->g, s, sdt, 2, ss, 1.0 / 7, 0.0, &sc));
    return lm__graph_linear_int4(b->g, nm, x, w, sc, (int)G, bias, out_dt, y);
}

/* y [N, out] = x [N, in] @ W[out, in]^T (+ bias): W enters as a permuted view (or, for
 * an int8 W, one linear op with its scales). */
static lm_status linear(builder *b, const char *nm, lm_graph_value x, int64_t l, const char *wname, int bias,
                        int64_t n_out, lm_graph_value *y) {
    int64_t n_in = b->g->values[x].dims[1], ws[2] = {n_out, n_in};
    lm_graph_value w, wt, bv = -1;
    char s[LM__G_NAME], vn[LM__G_NAME];
    snprintf(s, sizeof s, "%s.weight", wname);
    LM_TRY(l >= 0 ? layer_param(b, l, s, 2, ws, &w) : param(b, s, 2, ws, &w));
    if (quantized(b, w)) {
        char full[LM__G_NAME];
        snprintf(full, sizeof full, "%s", b->g->ops[b->g->values[w].op].name);
        if (bias) {
            snprintf(s, sizeof s, "%s.bias", wname);
            int64_t bs[1] = {n_out};
            LM_TRY(l >= 0 ? layer_param(b, l, s, 1, bs, &bv) : param(b, s, 1, bs, &bv));
        }
        return linear_quant(b, nm, x, w, full, bv, b->o->act_dtype, y);
    }
    static const int tr[2] = {1, 0};
    snprintf(vn, sizeof vn, "%.50s.wT", nm);
    LM_TRY(lm_graph_permute(b->g, vn, w, tr, &wt));
    if (!bias) return lm_graph_matmul(b->g, nm, x, wt, b->o->act_dtype, y);
    lm_graph_value mm;
    snprintf(vn, sizeof vn, "%.50s.mm", nm);
    LM_TRY(lm_graph_matmul(b->g, vn, x, wt, b->o->act_dtype, &mm));
    snprintf(s, sizeof s, "%s.bias", wname);
    int64_t bs[1] = {n_out};
    LM_TRY(l >= 0 ? layer_param(b, l, s, 1, bs, &bv) : param(b, s, 1, bs, &bv));
    return lm_graph_bias_add(b->g, nm, mm, bv, y);
}

static lm_status norm(builder *b, const char *nm, lm_graph_value x, lm_graph_value w, lm_graph_value *y) {
    return lm__graph_rmsnorm(b->g, nm, x, w, b->c->rms_norm_eps, b->g->values[x].dtype, y);
}

static void lname(char *buf, size_t n, int64_t l, const char *what) {
    snprintf(buf, n, "layers.%lld.%s", (long long)l, what);
}

/* [N, heads * D] -> [B, T, heads, D] */
static lm_status heads(builder *b, const char *nm, lm_graph_value x, int64_t nheads, lm_graph_value *y) {
    int64_t s[4] = {b->B, b->T, nheads, b->c->head_dim};
    return lm_graph_reshape(b->g, nm, x, 4, s, y);
}

/* The cache inputs of layer l: [S, Hkv, P, D]. */
static lm_status cache_inputs(builder *b, int64_t l, lm_graph_value *kc, lm_graph_value *vc) {
    int64_t s[4] = {b->o->cache_slots, b->c->num_key_value_heads, b->o->cache_tokens, b->c->head_dim};
    char nm[LM__G_NAME];
    snprintf(nm, sizeof nm, "k_cache.%lld", (long long)l);
    LM_TRY(lm_graph_input(b->g, nm, b->o->kv_dtype, 4, s, 1.0, kc));
    snprintf(nm, sizeof nm, "v_cache.%lld", (long long)l);
    return lm_graph_input(b->g, nm, b->o->kv_dtype, 4, s, 1.0, vc);
}

static lm_status attention_block(builder *b, int64_t l, lm_graph_value h, lm_graph_value *out) {
    const lm_model_config *c = b->c;
    int64_t D = c->head_dim, Hq = c->num_attention_heads, Hkv = c->num_key_value_heads;
    char nm[LM__G_NAME];
    lm_graph_value q, k, v, a;
    lname(nm, sizeof nm, l, "q");
    LM_TRY(linear(b, nm, h, l, "self_attn.q_proj", c->qkv_bias, Hq * D, &q));
    lname(nm, sizeof nm, l, "k");
    LM_TRY(linear(b, nm, h, l, "self_attn.k_proj", c->qkv_bias, Hkv * D, &k));
    lname(nm, sizeof nm, l, "v");
    LM_TRY(linear(b, nm, h, l, "self_attn.v_proj", c->qkv_bias, Hkv * D, &v));
    lname(nm, sizeof nm, l, "q_heads");
    LM_TRY(heads(b, nm, q, Hq, &q));
    lname(nm, sizeof nm, l, "k_heads");
    LM_TRY(heads(b, nm, k, Hkv, &k));
    lname(nm, sizeof nm, l, "v_heads");
    LM_TRY(heads(b, nm, v, Hkv, &v));
    if (c->qk_norm) {
        int64_t ds[1] = {D};
        lm_graph_value qn, kn;
        LM_TRY(layer_param(b, l, "self_attn.q_norm.weight", 1, ds, &qn));
        LM_TRY(layer_param(b, l, "self_attn.k_norm.weight", 1, ds, &kn));
        lname(nm, sizeof nm, l, "q_norm");
        LM_TRY(norm(b, nm, q, qn, &q));
        lname(nm, sizeof nm, l, "k_norm");
        LM_TRY(norm(b, nm, k, kn, &k));
    }
    lname(nm, sizeof nm, l, "q_rope");
    LM_TRY(lm_graph_rope(b->g, nm, q, b->positions, b->inv_freq, b->rope_factor, &q));
    lname(nm, sizeof nm, l, "k_rope");
    LM_TRY(lm_graph_rope(b->g, nm, k, b->positions, b->inv_freq, b->rope_factor, &k));
    double scale = 1.0 / sqrt((double)D);
    int64_t window = lm_model_config_layer_window(c, l);
    lname(nm, sizeof nm, l, "attention");
    if (b->o->mode == LM_DECODER_STEP) {
        lm_graph_value kc, vc;
        char sn[LM__G_NAME];
        LM_TRY(cache_inputs(b, l, &kc, &vc));
        lname(sn, sizeof sn, l, "k_store");
        LM_TRY(lm__graph_kv_store(b->g, sn, kc, k, b->slots, b->positions, &kc));
        lname(sn, sizeof sn, l, "v_store");
        LM_TRY(lm__graph_kv_store(b->g, sn, vc, v, b->slots, b->positions, &vc));
        LM_TRY(lm__graph_attention_cache(b->g, nm, q, kc, vc, b->slots, b->positions, scale, window, &a));
    } else {
        LM_TRY(lm_graph_attention(b->g, nm, q, k, v, scale, 1, window, &a));
    }
    int64_t flat[2] = {b->N, Hq * D};
    lname(nm, sizeof nm, l, "attention_rows");
    LM_TRY(lm_graph_reshape(b->g, nm, a, 2, flat, &a));
    lname(nm, sizeof nm, l, "o");
    return linear(b, nm, a, l, "self_attn.o_proj", c->o_bias, c->hidden_size, out);
}

static lm_status mlp_block(builder *b, int64_t l, lm_graph_value h, lm_graph_value *out) {
    const lm_model_config *c = b->c;
    char nm[LM__G_NAME];
    lm_graph_value g, u, s;
    lname(nm, sizeof nm, l, "gate");
    LM_TRY(linear(b, nm, h, l, "mlp.gate_proj", c->mlp_bias, c->intermediate_size, &g));
    lname(nm, sizeof nm, l, "up");
    LM_TRY(linear(b, nm, h, l, "mlp.up_proj", c->mlp_bias, c->intermediate_size, &u));
    lname(nm, sizeof nm, l, "swiglu");
    LM_TRY(lm_graph_swiglu(b->g, nm, g, u, &s));
    lname(nm, sizeof nm, l, "down");
    return linear(b, nm, s, l, "mlp.down_proj", c->mlp_bias, c->hidden_size, out);
}

/* x -> x + attention(rmsnorm(x)) -> + mlp(rmsnorm(.)) */
static lm_status layer(builder *b, int64_t l, lm_graph_value x, lm_graph_value *out) {
    int64_t hs[1] = {b->c->hidden_size};
    char nm[LM__G_NAME];
    lm_graph_value w, h, o;
    LM_TRY(layer_param(b, l, "input_layernorm.weight", 1, hs, &w));
    lname(nm, sizeof nm, l, "attention_norm");
    LM_TRY(norm(b, nm, x, w, &h));
    LM_TRY(attention_block(b, l, h, &o));
    lname(nm, sizeof nm, l, "attention_residual");
    LM_TRY(lm_graph_binary(b->g, nm, LM_GRAPH_ADD, x, o, &x));
    LM_TRY(layer_param(b, l, "post_attention_layernorm.weight", 1, hs, &w));
    lname(nm, sizeof nm, l, "mlp_norm");
    LM_TRY(norm(b, nm, x, w, &h));
    LM_TRY(mlp_block(b, l, h, &o));
    lname(nm, sizeof nm, l, "mlp_residual");
    return lm_graph_binary(b->g, nm, LM_GRAPH_ADD, x, o, out);
}

static lm_status inputs(builder *b) {
    const lm_decoder_options *o = b->o;
    double *f = lm__calloc((size_t)(b->c->head_dim / 2), sizeof *f);
    if (!f) return LM_OUT_OF_MEMORY;
    lm_status st = lm_model_config_rope(b->c, f, &b->rope_factor); /* the table itself is bound by the executor */
    lm__free(f);
    LM_TRY(st);
    int64_t ps[2] = {o->mode == LM_DECODER_LAYER ? 1 : b->B, b->T}, fs[1] = {b->c->head_dim / 2};
    LM_TRY(lm_graph_input(b->g, "positions", LM_I32, 2, ps, 1.0, &b->positions));
    LM_TRY(lm_graph_param(b->g, "rope.inv_freq", LM_F32, 1, fs, 0.0, 0.0, &b->inv_freq));
    if (o->mode == LM_DECODER_STEP) { /* each row's slot, or its block table (paged) */
        int64_t ss[2] = {b->B, o->cache_blocks_per_row};
        LM_TRY(lm_graph_input(b->g, "slots", LM_I32, o->cache_blocks_per_row ? 2 : 1, ss, 1.0, &b->slots));
    }
    return LM_OK;
}

static lm_status head_weight(builder *b, lm_graph_value *w) {
    const lm_model_config *c = b->c;
    int64_t s[2] = {c->vocab_size, c->hidden_size};
    /* a tied head is the table itself, unless the loader made a quantized copy of it (and
     * the options do not ask for the table anyway) */
    int table = c->tie_word_embeddings && (!lm_model_config_tensor_quantized(c, "lm_head.weight") ||
                                           b->o->tied_head_float);
    if (table && b->embed >= 0) {
        *w = b->embed;
        return LM_OK;
    }
    return param(b, table ? "model.embed_tokens.weight" : "lm_head.weight", 2, s, w);
}

/* The final norm and the output the options ask for, from the last residual x [N, H]. */
static lm_status outputs(builder *b, lm_graph_value x) {
    const lm_model_config *c = b->c;
    const lm_decoder_options *o = b->o;
    int64_t H = c->hidden_size, hs[1] = {H};
    lm_graph_value nw, h, w, y;
    if (o->output == LM_DECODER_OUT_NONE) {
        LM_TRY(lm_graph_output(b->g, x)); /* the hidden state: the caches are the point */
        return LM_OK;
    }
    LM_TRY(param(b, "model.norm.weight", 1, hs, &nw));
    if (o->output == LM_DECODER_OUT_LAST_LOGITS || o->output == LM_DECODER_OUT_SAMPLE) {
        int64_t s3[3] = {b->B, b->T, H}, s2[2] = {b->B, H};
        LM_TRY(lm_graph_reshape(b->g, "rows", x, 3, s3, &x));
        LM_TRY(lm__graph_slice(b->g, "last_token", x, 1, b->T - 1, b->T, &x));
        LM_TRY(lm_graph_reshape(b->g, "last_rows", x, 2, s2, &x));
    }
    LM_TRY(norm(b, "final_norm", x, nw, &h));
    LM_TRY(head_weight(b, &w));
    if (o->output == LM_DECODER_OUT_LOSS) {
        int64_t ts[1] = {b->N};
        if (quantized(b, w))
            return lm__error(LM_UNSUPPORTED, "decoder graph: 'lm_head.weight' is a quantized weight; the fused loss takes "
                             "float weights (train from the float checkpoint)");
        lm_graph_value t;
        LM_TRY(lm_graph_input(b->g, "targets", LM_I32, 1, ts, 1.0, &t));
        LM_TRY(lm__graph_linear_ce(b->g, "loss", h, w, t, -100, &y));
        return lm_graph_output(b->g, y);
    }
    if (quantized(b, w)) { /* an untied, int8 or int4 lm_head (train mode is refused there) */
        LM_TRY(linear_quant(b, "logits", h, w, "lm_head.weight", -1, LM_F32, &y));
    } else {
        static const int tr[2] = {1, 0};
        lm_graph_value wt;
        LM_TRY(lm_graph_permute(b->g, "lm_head.wT", w, tr, &wt));
        LM_TRY(lm_graph_matmul(b->g, "logits", h, wt, LM_F32, &y));
    }
    if (o->output == LM_DECODER_OUT_SAMPLE) {
        int64_t ps[1] = {o->batch * LM_SAMPLE_PARAMS_BYTES}; /* one record per row */
        lm_graph_value p;
        LM_TRY(lm_graph_input(b->g, "sample_params", LM_U8, 1, ps, 1.0, &p));
        LM_TRY(lm__graph_sample(b->g, "next_ids", y, p, &y));
    }
    return lm_graph_output(b->g, y);
}

static lm_status check_options(const lm_model_config *c, const lm_decoder_options *o) {
    const char *m = o->mode == LM_DECODER_STEP ? "step" : o->mode == LM_DECODER_TRAIN ? "train" : "layer";
    if ((unsigned)o->mode > LM_DECODER_LAYER) return lm__error(LM_INVALID_ARGUMENT, "decoder graph: unknown mode %d", (int)o->mode);
    if (o->batch < 1 || o->tokens < 1)
        return lm__error(LM_INVALID_ARGUMENT, "decoder graph (%s): %lld rows x %lld tokens", m, (long long)o->batch,
                         (long long)o->tokens);
    int ok = o->mode == LM_DECODER_STEP   ? o->output <= LM_DECODER_OUT_SAMPLE
             : o->mode == LM_DECODER_TRAIN ? o->output == LM_DECODER_OUT_LOSS || o->output == LM_DECODER_OUT_ALL_LOGITS
                                           : 1;
    if (!ok) return lm__error(LM_INVALID_ARGUMENT, "decoder graph (%s): output %d does not apply", m, (int)o->output);
    if (o->mode == LM_DECODER_STEP && o->cache_blocks_per_row < 0)
        return lm__error(LM_INVALID_ARGUMENT, "decoder graph (step): %lld blocks per row", (long long)o->cache_blocks_per_row);
    if (o->mode == LM_DECODER_STEP && !o->cache_blocks_per_row &&
        (o->cache_slots < o->batch || o->cache_tokens < o->tokens))
        return lm__error(LM_INVALID_ARGUMENT, "decoder graph (step): a cache of %lld slots x %lld tokens cannot take %lld "
                         "rows x %lld tokens", (long long)o->cache_slots, (long long)o->cache_tokens,
                         (long long)o->batch, (long long)o->tokens);
    if (o->mode == LM_DECODER_STEP && o->cache_blocks_per_row &&
        (o->cache_slots < 1 || o->cache_tokens < 1 || o->cache_blocks_per_row * o->cache_tokens < o->tokens))
        return lm__error(LM_INVALID_ARGUMENT, "decoder graph (step): a paged cache of %lld blocks of %lld tokens, %lld per "
                         "row, cannot take rows of %lld tokens", (long long)o->cache_slots, (long long)o->cache_tokens,
                         (long long)o->cache_blocks_per_row, (long long)o->tokens);
    if (o->mode == LM_DECODER_LAYER && (o->layer < 0 || o->layer >= c->num_hidden_layers || o->batch != 1))
        return lm__error(LM_INVALID_ARGUMENT, "decoder graph (layer): layer %lld of %lld, one row", (long long)o->layer,
                         (long long)c->num_hidden_layers);
    return LM_OK;
}

static lm_status build(builder *b) {
    const lm_model_config *c = b->c;
    const lm_decoder_options *o = b->o;
    lm_graph_value x;
    LM_TRY(inputs(b));
    if (o->mode == LM_DECODER_LAYER) {
        int64_t s[2] = {b->T, c->hidden_size};
        LM_TRY(lm_graph_input(b->g, "hidden", o->act_dtype, 2, s, 1.0, &x));
        LM_TRY(layer(b, o->layer, x, &x));
        return lm_graph_output(b->g, x);
    }
    int64_t is[2] = {b->B, b->T}, es[2] = {c->vocab_size, c->hidden_size}, flat[2] = {b->N, c->hidden_size};
    lm_graph_value ids, table;
    LM_TRY(lm_graph_input(b->g, "ids", LM_I32, 2, is, 1.0, &ids));
    LM_TRY(param(b, "model.embed_tokens.weight", 2, es, &table));
    b->embed = table;
    lm_dtype tdt = b->g->values[table].dtype; /* rows come out in the table's dtype, then widen */
    LM_TRY(lm__graph_embedding(b->g, "embedding", table, ids, tdt, &x));
    if (tdt != o->act_dtype) LM_TRY(lm__graph_cast(b->g, "embedding_rows", x, o->act_dtype, &x));
    LM_TRY(lm_graph_reshape(b->g, "residual", x, 2, flat, &x));
    for (int64_t l = 0; l < c->num_hidden_layers; l++) LM_TRY(layer(b, l, x, &x));
    return outputs(b, x);
}

lm_status lm_graph_build_decoder(const lm_model_config *c, const lm_decoder_options *o, lm_graph **out) {
    if (!c || !o || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_graph_build_decoder: NULL argument");
    *out = NULL;
    LM_TRY(check_options(c, o));
    builder b = {NULL, c, o, o->batch, o->tokens, o->batch * o->tokens, 1.0, -1, -1, -1, -1};
    LM_TRY(lm_graph_create(&b.g));
    lm_status st = build(&b);
    if (st != LM_OK) {
        lm_graph_destroy(b.g);
        return lm__error_context(st, "building the %s decoder graph", lm_arch_name(c->arch));
    }
    *out = b.g;
    return LM_OK;
}
