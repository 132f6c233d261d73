/* nn/model.c — loading a Hugging Face model directory into an lm_model: the config
 * and a table of named weights.
 *
 * The checkpoint is validated against config.json first (names, dtypes, shapes), so
 * every lookup below succeeds for a valid directory. In host memory, matrices are
 * zero-copy views of the mapped safetensors data in their stored dtype (the matmul
 * widens them on the fly) where that data is 64-byte aligned, else aligned copies
 * (align_host_matrix); 1-d tensors (norms, biases) become f32 copies because the
 * normalization and bias operators take one dtype per call. A model for another
 * device is loaded the same way and then uploaded (nn/upload.c), after which the
 * mapped host tensors are released.
 *
 * Weights (lm_model_load_options.weights, docs/QUANTIZATION.md): as stored; bf16
 * (float matrices converted at load); or int8, either quantized here from a float
 * checkpoint (lm_quantize_int8_rows: the same function `loom quantize` uses, so both
 * give the same bytes) or mapped from a directory `loom quantize` wrote, whose
 * "<weight>_scale" tensors are checked (present, f32 [out], finite and > 0) before use;
 * int4 the same way (lm_quantize_int4_groups; u8 [out, in/2] weights, scales bf16
 * [out, in/group]; a directory's f32 ones, as written before bf16 group scales, load as
 * they are); fp8 as int8 (lm_quantize_fp8_rows; f8_e4m3 [out, in] weights).
 * Quantized weights load on CUDA too: nn/upload.c copies their bytes and their scales as
 * they are (bf16 group scales stay bf16), and the linear operator's CUDA kernels read
 * them (training still refuses them).
 */
#include "nn/internal.h"
#include "ops/cpu/precision.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int lm__model_on_host(const lm_model *m) { return m->on_host; }

static int64_t find(const lm_model *m, const char *name, int *found) {
    int64_t lo = 0, hi = m->nw;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        int c = strcmp(m->w[mid].name, name);
        if (c == 0) {
            *found = 1;
            return mid;
        }
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    *found = 0;
    return lo;
}

const lm_tensor *lm__model_weight(const lm_model *m, const char *name) {
    int found;
    int64_t i = find(m, name, &found);
    return found ? m->w[i].t : NULL;
}

lm_status lm__model_stacked_weight(const lm_model *m, const char *name, lm_tensor **out) {
    *out = NULL;
    const char *which = strstr(name, "qkv_proj") ? "qkv_proj" : strstr(name, "gate_up_proj") ? "gate_up_proj" : NULL;
    if (!which) return lm__error(LM_NOT_FOUND, "the model has no weight '%s'", name);
    static const char *const qkv[3] = {"q_proj", "k_proj", "v_proj"}, *const gu[2] = {"gate_proj", "up_proj"};
    const char *at = strstr(name, which), *tail = at + strlen(which); /* ".weight", ".weight_scale", ".bias" */
    int n = which[0] == 'q' ? 3 : 2;
    const lm_tensor *t[3];
    int64_t rows = 0;
    for (int i = 0; i < n; i++) {
        char part[192];
        snprintf(part, sizeof part, "%.*s%s%.32s", (int)LM_MIN(128, at - name), name, n == 3 ? qkv[i] : gu[i], tail);
        if (!(t[i] = lm__model_weight(m, part)))
            return lm__error(LM_NOT_FOUND, "the model has no weight '%s' to stack into '%s'", part, name);
        rows += lm_tensor_dim(t[i], 0);
    }
    int nd = lm_tensor_ndim(t[0]);
    int64_t shape[2] = {rows, nd == 2 ? lm_tensor_dim(t[0], 1) : 1};
    LM_TRY(lm_tensor_create(lm_device_cpu(), lm_tensor_dtype(t[0]), nd, shape, out));
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)lm_tensor_numel(t[i]) * lm_dtype_size(lm_tensor_dtype(t[i]));
        memcpy((char *)lm_tensor_data(*out) + off, lm_tensor_data(t[i]), bytes);
        off += bytes;
    }
    return LM_OK;
}

lm_dtype lm__model_param_dtype(void *user, const char *name, lm_dtype dflt) {
    const lm_tensor *t = lm__model_weight(user, name);
    return t ? lm_tensor_dtype(t) : dflt;
}

lm_status lm__model_add_weight(lm_model *m, const char *name, lm_tensor *t) {
    int found;
    int64_t i = find(m, name, &found);
    if (found) {
        lm_tensor_destroy(t);
        return lm__error(LM_INTERNAL, "model: weight '%s' added twice", name);
    }
    if (strlen(name) >= sizeof m->w[0].name) {
        lm_tensor_destroy(t);
        return lm__error(LM_UNSUPPORTED, "model: weight name '%.40s...' is too long", name);
    }
    if (lm__reserve((void **)&m->w, &m->cap_w, m->nw + 1, sizeof *m->w) != LM_OK) {
        lm_tensor_destroy(t);
        return LM_OUT_OF_MEMORY;
    }
    memmove(&m->w[i + 1], &m->w[i], sizeof *m->w * (size_t)(m->nw - i));
    snprintf(m->w[i].name, sizeof m->w[i].name, "%s", name);
    m->w[i].t = t;
    m->nw++;
    return LM_OK;
}

/* How the matrices are loaded (from lm_model_load_options and the directory). */
typedef struct load_plan {
    lm_model_config stored; /* the directory's config (what its checkpoint must hold) */
    int quantize;           /* quantize the modules of m->cfg.quant_modules at load */
    int tied_head;          /* add lm_head.weight: the tied table quantized (the table stays float) */
    int to_bf16;            /* convert float matrices that are not bf16 to bf16 */
} load_plan;

lm_status lm__quantize_matrix(lm_ctx *ctx, const lm_model_config *cfg, const lm_tensor_view *w, lm_tensor **q,
                              lm_tensor **scales) {
    int int4 = cfg->quant_format == LM_QUANT_INT4, G = cfg->quant_group;
    int64_t N = w->shape[0], K = w->shape[1], qs[2] = {N, int4 ? K / 2 : K}, ss[2] = {N, int4 && G ? K / G : 1};
    *q = *scales = NULL;
    if (int4 && (G <= 0 || K % G))
        return lm__error(LM_INVALID_ARGUMENT, "int4 group %d does not divide the %lld inputs", G, (long long)K);
    int fp8 = cfg->quant_format == LM_QUANT_FP8;
    lm_status st = lm_tensor_create(lm_device_cpu(), int4 ? LM_U8 : fp8 ? LM_F8_E4M3 : LM_I8, 2, qs, q);
    /* int4 group scales in bf16 (4.5 bits a weight at groups of 32), int8 / fp8 row scales f32 */
    if (st == LM_OK) st = lm_tensor_create(lm_device_cpu(), int4 ? LM_BF16 : LM_F32, int4 ? 2 : 1, ss, scales);
    if (st == LM_OK)
        st = int4  ? lm_quantize_int4_groups(ctx, w, lm_tensor_as_view(*q), lm_tensor_as_view(*scales), G)
             : fp8 ? lm_quantize_fp8_rows(ctx, w, lm_tensor_as_view(*q), lm_tensor_as_view(*scales))
                   : lm_quantize_int8_rows(ctx, w, lm_tensor_as_view(*q), lm_tensor_as_view(*scales));
    if (st != LM_OK) {
        lm_tensor_destroy(*q), lm_tensor_destroy(*scales);
        *q = *scales = NULL;
    }
    return st;
}

/* A mapped host matrix whose data does not start on a 64-byte boundary (safetensors
 * aligns its tensors only to 8 bytes, so most do not), replaced by an aligned copy: a
 * CPU gemv streaming such rows splits a vector load over two cache lines every other
 * load, and decode measured ~20% slower (bench/NOTES.md). Aligned ones stay zero-copy. */
static lm_status align_host_matrix(const lm_model *m, lm_tensor **t) {
    if (!m->on_host || ((uintptr_t)lm_tensor_data(*t) & 63) == 0) return LM_OK;
    lm_tensor *c = NULL;
    LM_TRY(lm_tensor_to_device(NULL, *t, lm_device_cpu(), &c)); /* a new, 64-byte-aligned host tensor */
    lm_tensor_destroy(*t);
    *t = c;
    return LM_OK;
}

/* One matrix as the plan says: the mapped view (or its aligned copy), a bf16 copy, or
 * i8 + scales. */
static lm_status load_matrix(lm_model *m, const load_plan *lp, lm_checkpoint *ck, lm_ctx *ctx, const lm_tensor_spec *sp) {
    lm_tensor *raw = NULL, *q = NULL, *sc = NULL;
    char scale[sizeof sp->name + 8];
    snprintf(scale, sizeof scale, "%s_scale", sp->name);
    LM_TRY(lm_checkpoint_tensor(ck, sp->name, &raw));
    lm_status st = LM_OK;
    if (lm_model_config_tensor_quantized(&lp->stored, sp->name)) { /* stored int8: mapped, with its mapped scales */
        st = lm_checkpoint_tensor(ck, scale, &sc);
        q = raw, raw = NULL;
        if (st == LM_OK) st = align_host_matrix(m, &q);
    } else if (lp->quantize && lm_model_config_tensor_quantized(&m->cfg, sp->name)) {
        st = lm__quantize_matrix(ctx, &m->cfg, lm_tensor_as_view(raw), &q, &sc);
        if (st != LM_OK) st = lm__error_context(st, "quantizing '%s' to %s", sp->name,
                                                lm_quant_format_name((lm_quant_format)m->cfg.quant_format));
    } else if (lp->to_bf16 && lm_tensor_dtype(raw) != LM_BF16) {
        st = lm_cast(ctx, lm_tensor_as_view(raw), LM_BF16, &q);
    } else {
        q = raw, raw = NULL;
        st = align_host_matrix(m, &q);
    }
    lm_tensor_destroy(raw);
    if (st != LM_OK) {
        lm_tensor_destroy(q);
        lm_tensor_destroy(sc);
        return st;
    }
    st = lm__model_add_weight(m, sp->name, q); /* takes q, also on failure */
    if (st == LM_OK && sc) return lm__model_add_weight(m, scale, sc);
    lm_tensor_destroy(sc);
    return st;
}

/* Every expected tensor: matrices by the plan, vectors cast to f32. */
static lm_status load_tensors(lm_model *m, const load_plan *lp, lm_checkpoint *ck, lm_ctx *ctx) {
    int64_t n = lm_model_config_tensor_count(&m->cfg);
    for (int64_t i = 0; i < n; i++) {
        lm_tensor_spec spec;
        LM_TRY(lm_model_config_tensor(&m->cfg, i, &spec));
        if (spec.ndim == 2) {
            LM_TRY(load_matrix(m, lp, ck, ctx, &spec));
            continue;
        }
        lm_tensor *raw = NULL, *t = NULL;
        LM_TRY(lm_checkpoint_tensor(ck, spec.name, &raw));
        lm_status st = lm_cast(ctx, lm_tensor_as_view(raw), LM_F32, &t);
        lm_tensor_destroy(raw);
        if (st == LM_OK) st = lm__model_add_weight(m, spec.name, t);
        LM_TRY(st);
    }
    return LM_OK;
}

/* "rope.inv_freq": transformers keeps the table in f32, computed here in double. */
static lm_status load_rope(lm_model *m) {
    int64_t half = m->cfg.head_dim / 2;
    double *freq = lm__calloc((size_t)half, sizeof *freq), scaling = 1;
    if (!freq) return LM_OUT_OF_MEMORY;
    lm_tensor *t = NULL;
    lm_status st = lm_model_config_rope(&m->cfg, freq, &scaling);
    if (st == LM_OK) st = lm_tensor_create(lm_device_cpu(), LM_F32, 1, &half, &t);
    if (st == LM_OK) {
        float *f = lm_tensor_data(t);
        for (int64_t i = 0; i < half; i++) f[i] = (float)freq[i];
        st = lm__model_add_weight(m, "rope.inv_freq", t);
    }
    lm__free(freq);
    return st;
}

/* lm_head.weight (+ _scale): the tied embedding table quantized as the output matrix,
 * in int8 whatever the projections' format (the head sets every logit: int4 there cost
 * the default model 1% of perplexity more than int8, see docs/QUANTIZATION.md). */
static lm_status quantize_tied_head(lm_model *m, lm_ctx *ctx) {
    const lm_tensor *emb = lm__model_weight(m, "model.embed_tokens.weight");
    if (!emb) return lm__error(LM_INTERNAL, "quantizing the tied lm_head: no embedding table");
    lm_model_config int8 = m->cfg;
    int8.quant_format = LM_QUANT_INT8;
    lm_tensor *q = NULL, *sc = NULL;
    lm_status st = lm__quantize_matrix(ctx, &int8, lm_tensor_as_view(emb), &q, &sc);
    if (st != LM_OK) return lm__error_context(st, "quantizing the tied lm_head to int8");
    st = lm__model_add_weight(m, "lm_head.weight", q); /* takes q, also on failure */
    if (st == LM_OK) return lm__model_add_weight(m, "lm_head.weight_scale", sc);
    lm_tensor_destroy(sc);
    return st;
}

static int64_t nbytes(const lm_tensor *t) { return t ? lm_tensor_numel(t) * (int64_t)lm_dtype_size(lm_tensor_dtype(t)) : 0; }

/* Per token: every layer tensor, the final norm, the output matrix, and one row of
 * the embedding table (the tied table counts once, whole, as the output matrix, unless
 * a quantized copy of it is the output matrix). */
static int64_t host_bytes_per_token(const lm_model *m) {
    const lm_model_config *c = &m->cfg;
    int64_t total = 0;
    for (int64_t i = 0; i < m->nw; i++) total += nbytes(m->w[i].t);
    const lm_tensor *emb = lm__model_weight(m, "model.embed_tokens.weight");
    int64_t row = nbytes(emb) / (c->vocab_size ? c->vocab_size : 1);
    total += c->tie_word_embeddings && !lm__model_weight(m, "lm_head.weight") ? row : row - nbytes(emb);
    return total - nbytes(lm__model_weight(m, "rope.inv_freq"));
}

static lm_status load_all(lm_model *m, const load_plan *lp, const char *dir) {
    lm_checkpoint *ck = NULL;
    lm_ctx *ctx = NULL;
    lm_status st = lm_ctx_create(lm_device_cpu(), 0, &ctx); /* quantizing at load: every logical CPU */
    if (st == LM_OK) st = lm_checkpoint_open(dir, &ck);
    if (st == LM_OK)
        st = lm_model_config_check_checkpoint(&lp->stored, ck);
    if (st == LM_OK) st = load_tensors(m, lp, ck, ctx);
    if (st == LM_OK && lp->tied_head) st = quantize_tied_head(m, ctx);
    if (st == LM_OK) st = load_rope(m);
    lm_checkpoint_close(ck); /* tensors keep their own references to the mapped files */
    lm_ctx_destroy(ctx);
    if (st == LM_OK) m->weight_bytes = host_bytes_per_token(m);
    return st;
}

const char *lm_weights_name(lm_weights w) {
    return w == LM_WEIGHTS_AUTO ? "auto" : w == LM_WEIGHTS_BF16 ? "bf16" : w == LM_WEIGHTS_INT8 ? "int8"
           : w == LM_WEIGHTS_INT4 ? "int4" : w == LM_WEIGHTS_FP8 ? "fp8" : "invalid";
}

lm_status lm_weights_parse(const char *text, lm_weights *out) {
    if (!text || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_weights_parse: NULL argument");
    for (int w = LM_WEIGHTS_AUTO; w <= LM_WEIGHTS_FP8; w++)
        if (strcmp(text, lm_weights_name((lm_weights)w)) == 0) {
            *out = (lm_weights)w;
            return LM_OK;
        }
    return lm__error(LM_INVALID_ARGUMENT, "weights '%s': expected auto, bf16, int8, int4 or fp8", text);
}

void lm_model_load_options_default(lm_model_load_options *o) {
    if (o) memset(o, 0, sizeof *o);
}

/* The load plan for the options, the directory's config and the device; m->cfg
 * becomes the config of what runs (quant_format/quant_modules when int8). */
static lm_status plan_load(lm_model *m, const char *dir, const lm_model_load_options *o, load_plan *lp) {
    lm_weights want = o ? o->weights : LM_WEIGHTS_AUTO;
    int32_t mods = o && o->quant_modules ? o->quant_modules : lm_quant_modules_default(&m->cfg);
    memset(lp, 0, sizeof *lp);
    lp->stored = m->cfg;
    if ((unsigned)want > LM_WEIGHTS_FP8) return lm__error(LM_INVALID_ARGUMENT, "lm_model_load_opts: weights %d", (int)want);
    int stored = m->cfg.quant_format;
    const char *stored_name = lm_quant_format_name((lm_quant_format)stored);
    if (want == LM_WEIGHTS_BF16 && stored)
        return lm__error(LM_UNSUPPORTED, "model '%s' holds %s weights (config.json quantization_config); its float "
                         "weights are not there: load the directory it was quantized from for bf16", dir, stored_name);
    int want_fmt = want == LM_WEIGHTS_INT8   ? LM_QUANT_INT8
                   : want == LM_WEIGHTS_INT4 ? LM_QUANT_INT4
                   : want == LM_WEIGHTS_FP8  ? LM_QUANT_FP8
                                             : 0;
    if (want_fmt && stored && stored != want_fmt)
        return lm__error(LM_UNSUPPORTED, "model '%s' holds %s weights; %s needs the float directory it was quantized "
                         "from", dir, stored_name, lm_weights_name(want));
    int group = o && o->quant_group ? o->quant_group : 32;
    if (want_fmt == LM_QUANT_INT4 && stored && o && o->quant_group && o->quant_group != m->cfg.quant_group)
        return lm__error(LM_UNSUPPORTED, "model '%s' holds int4 weights of group %d, not %d", dir,
                         (int)m->cfg.quant_group, (int)o->quant_group);
    if (want_fmt && !stored) {
        if (mods & ~((1 << LM_QUANT_MODULE_COUNT) - 1) || !mods)
            return lm__error(LM_INVALID_ARGUMENT, "lm_model_load_opts: quant_modules 0x%x", (unsigned)mods);
        if (want_fmt == LM_QUANT_INT4) {
            int64_t attn = m->cfg.num_attention_heads * m->cfg.head_dim;
            if (group != 32 && group != 64 && group != 128)
                return lm__error(LM_INVALID_ARGUMENT, "lm_model_load_opts: int4 group %d; expected 32, 64 or 128",
                                 group);
            if (m->cfg.hidden_size % group || m->cfg.intermediate_size % group || attn % group)
                return lm__error(LM_INVALID_ARGUMENT, "model '%s': int4 group %d does not divide hidden_size %lld, "
                                 "intermediate_size %lld and heads x head_dim %lld", dir, group,
                                 (long long)m->cfg.hidden_size, (long long)m->cfg.intermediate_size, (long long)attn);
            m->cfg.quant_group = group;
        }
        m->cfg.quant_format = want_fmt;
        m->cfg.quant_modules = mods;
        lp->quantize = 1;
    } else if (stored && m->cfg.tie_word_embeddings && !(o && o->quant_modules && !(o->quant_modules & LM_QUANT_LM_HEAD))) {
        m->cfg.quant_modules |= LM_QUANT_LM_HEAD; /* a stored directory keeps a tied table float: copy it below */
    }
    /* A tied output matrix is quantized as a copy of the table (the embedding lookups keep
     * the float table). A device holds both: its step programs take the copy where its
     * product runs without a dequantizing pass (up to the GEMV's rows) and the table past
     * that (nn/kv_cache.c). */
    if (m->cfg.tie_word_embeddings && (m->cfg.quant_modules & LM_QUANT_LM_HEAD)) lp->tied_head = 1;
    m->weights = m->cfg.quant_format == LM_QUANT_INT8   ? LM_WEIGHTS_INT8
                 : m->cfg.quant_format == LM_QUANT_INT4 ? LM_WEIGHTS_INT4
                 : m->cfg.quant_format == LM_QUANT_FP8  ? LM_WEIGHTS_FP8
                                                        : LM_WEIGHTS_BF16;
    lp->to_bf16 = want == LM_WEIGHTS_BF16 && m->on_host; /* a device gets bf16 matrices anyway (nn/upload.c) */
    return LM_OK;
}

/* On a device (CUDA) precision fast is the fp8 weights' mode (x quantized to e4m3 per
 * row for the fp8 tensor-core GEMM): a model with other weights is refused, naming
 * them, once the weights to run are known and before any is read. */
static lm_status fast_check_device(const lm_model *m) {
    if (m->precision != LM_PRECISION_FAST || m->on_host || m->weights == LM_WEIGHTS_FP8) return LM_OK;
    return lm__error(LM_UNSUPPORTED, "precision fast on CUDA runs fp8 weights' products on the fp8 tensor cores (x "
                     "quantized to e4m3 per row); this model's weights are %s, whose products already run on tensor "
                     "cores at exact precision: load with --weights fp8, or use precision exact",
                     lm_weights_name(m->weights));
}

/* Precision fast on a CPU without AVX512_BF16 (or with the ISA path overridden below
 * avx512) runs only int8 / int4 products (the AVX2 path's kernels,
 * ops/cpu/matmul_i8dot_avx2.c): LM_UNSUPPORTED naming the first bf16
 * matrix (not int4's bf16 group scales) a linear would read (a projection, the output matrix, or the tied embedding
 * table when no quantized copy is the head), before any step runs into it. f32 and f16
 * matrices stay exact in fast mode, as everywhere. */
static lm_status fast_check_weights(const lm_model *m) {
    if (m->precision != LM_PRECISION_FAST || !m->on_host || lm__cpu_bf16dot_runs()) return LM_OK;
    const int tied_float = m->cfg.tie_word_embeddings && !lm__model_weight(m, "lm_head.weight");
    for (int64_t i = 0; i < m->nw; i++) {
        const lm_tensor *t = m->w[i].t;
        const char *name = m->w[i].name;
        if (lm_tensor_dtype(t) != LM_BF16 || lm_tensor_ndim(t) != 2) continue;
        if (strcmp(name, "model.embed_tokens.weight") == 0 && !tied_float) continue; /* a gather, not a product */
        size_t nl = strlen(name);
        if (nl > 6 && strcmp(name + nl - 6, "_scale") == 0) continue; /* int4 group scales, not a matrix */
        return lm__error(LM_UNSUPPORTED, "precision fast: this CPU lacks AVX512_BF16 (VDPBF16PS), so fast products "
                         "run on int8 / int4 weights only (AVX2 / AVX-VNNI byte products), and '%s' is bf16; load "
                         "with --weights int8 or int4, or use precision exact", name);
    }
    return LM_OK;
}

lm_status lm_model_load_opts(const char *dir, lm_device device, const lm_model_load_options *o, lm_model **out) {
    if (!dir || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_model_load: NULL argument");
    *out = NULL;
    lm_precision prec = o ? o->precision : LM_PRECISION_EXACT;
    lm_status ps = lm_precision_check(device, prec); /* before anything is read: the CPU or device cannot run it */
    if (ps != LM_OK) return lm__error_context(ps, "lm_model_load_opts");
    lm_device_caps caps;
    lm_status cs = lm_device_caps_get(device, &caps); /* names a device this build or machine lacks */
    if (cs != LM_OK) return lm__error_context(cs, "lm_model_load");
    lm_model *m = lm__calloc(1, sizeof *m);
    if (!m) return LM_OUT_OF_MEMORY;
    m->device = device;
    m->precision = prec;
    m->on_host = caps.host_addressable;
    load_plan lp;
    lm_status st = lm_model_config_load(dir, &m->cfg);
    if (st == LM_OK) st = plan_load(m, dir, o, &lp);
    if (st == LM_OK) st = fast_check_device(m);
    if (st == LM_OK) st = load_all(m, &lp, dir);
    if (st == LM_OK) st = fast_check_weights(m);
    if (st == LM_OK && !lm__model_on_host(m)) st = lm__model_upload(m);
    if (st != LM_OK) {
        lm_model_destroy(m);
        return st;
    }
    *out = m;
    return LM_OK;
}

lm_status lm_model_load(const char *dir, lm_device device, lm_model **out) {
    return lm_model_load_opts(dir, device, NULL, out);
}

lm_weights lm_model_weights(const lm_model *m) { return m ? m->weights : LM_WEIGHTS_AUTO; }
lm_precision lm_model_precision(const lm_model *m) { return m ? m->precision : LM_PRECISION_EXACT; }

void lm_model_destroy(lm_model *m) {
    if (!m) return;
    for (int64_t i = 0; i < m->nw; i++) lm_tensor_destroy(m->w[i].t);
    lm__free(m->w);
    lm__free(m);
}

const lm_model_config *lm_model_get_config(const lm_model *m) { return &m->cfg; }
lm_device lm_model_device(const lm_model *m) { return m->device; }
int64_t lm_model_weight_bytes(const lm_model *m) { return m->weight_bytes; }
