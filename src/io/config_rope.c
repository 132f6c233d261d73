/* io/config_rope.c — RoPE inverse frequencies and the cos/sin attention scaling for
 * each supported rope type, re-derived from the formulas of transformers'
 * modeling_rope_utils: _compute_default_rope_parameters,
 * _compute_linear_scaling_rope_parameters, _compute_llama3_parameters and
 * _compute_yarn_parameters (the version where an explicit yarn factor is kept and
 * original_max_position_embeddings only sets the correction range).
 *
 * Dimension d = head_dim (no partial rotary factor in the supported families);
 * inv_freq has d/2 entries, inv_freq[i] = theta^(-2i/d) before scaling. Everything
 * is computed in double; O(d).
 */
#include "io/internal.h"
#include "loom/config.h"

#include <math.h>

static const double k_pi = 3.14159265358979323846;

static void rope_default(double theta, int64_t d, double *inv) {
    for (int64_t i = 0; i < d / 2; i++) inv[i] = 1.0 / pow(theta, (double)(2 * i) / (double)d);
}

/* Llama 3.1: wavelengths shorter than original/high_freq_factor keep their frequency,
 * longer than original/low_freq_factor are divided by factor, and the band between
 * interpolates linearly in original/wavelength. */
static void rope_llama3(const lm_rope_scaling *r, int64_t d, double *inv) {
    double old_ctx = (double)r->original_max_position_embeddings;
    double low_wavelen = old_ctx / r->low_freq_factor, high_wavelen = old_ctx / r->high_freq_factor;
    for (int64_t i = 0; i < d / 2; i++) {
        double wavelen = 2 * k_pi / inv[i];
        if (wavelen < high_wavelen) continue;
        if (wavelen > low_wavelen) {
            inv[i] /= r->factor;
            continue;
        }
        double smooth = (old_ctx / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
        inv[i] = (1 - smooth) * inv[i] / r->factor + smooth * inv[i];
    }
}

/* YaRN's attention temperature term: 0.1 * mscale * ln(scale) + 1 above scale 1. */
static double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0; }

/* The (fractional) dimension index at which a frequency turns num_rotations times
 * over the original context. */
static double yarn_correction_dim(double num_rotations, int64_t d, double theta, double orig_ctx) {
    return (double)d * log(orig_ctx / (num_rotations * 2 * k_pi)) / (2 * log(theta));
}

/* YaRN: dimensions below `low` keep the extrapolated (original) frequency, above
 * `high` take the interpolated one (divided by factor), with a linear ramp between. */
static void rope_yarn(const lm_model_config *cfg, double *inv, double *attn) {
    const lm_rope_scaling *r = &cfg->rope_scaling;
    int64_t d = cfg->head_dim;
    double theta = cfg->rope_theta, factor = r->factor;
    double orig = (double)(r->original_max_position_embeddings ? r->original_max_position_embeddings
                                                               : cfg->max_position_embeddings);
    if (r->attention_factor > 0) *attn = r->attention_factor;
    else if (r->mscale != 0 && r->mscale_all_dim != 0)
        *attn = yarn_mscale(factor, r->mscale) / yarn_mscale(factor, r->mscale_all_dim);
    else *attn = yarn_mscale(factor, 1.0);

    double low = yarn_correction_dim(r->beta_fast, d, theta, orig);
    double high = yarn_correction_dim(r->beta_slow, d, theta, orig);
    if (r->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > (double)(d - 1)) high = (double)(d - 1);
    if (low == high) high += 0.001; /* avoid a zero-width ramp */
    for (int64_t i = 0; i < d / 2; i++) {
        double ramp = ((double)i - low) / (high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double extrapolation = 1 - ramp; /* weight of the unscaled frequency */
        double pos_freq = pow(theta, (double)(2 * i) / (double)d);
        inv[i] = 1.0 / (factor * pos_freq) * (1 - extrapolation) + 1.0 / pos_freq * extrapolation;
    }
}

lm_status lm_model_config_rope(const lm_model_config *cfg, double *inv_freq, double *attention_scaling) {
    if (!cfg || !inv_freq || !attention_scaling)
        return lm__error(LM_INVALID_ARGUMENT, "lm_model_config_rope: NULL argument");
    if (cfg->head_dim < 2 || cfg->head_dim % 2 || !(cfg->rope_theta > 1))
        return lm__error(LM_INVALID_ARGUMENT, "lm_model_config_rope: head_dim %lld must be even and rope_theta %g > 1",
                         (long long)cfg->head_dim, cfg->rope_theta);
    const lm_rope_scaling *r = &cfg->rope_scaling;
    *attention_scaling = 1.0;
    switch (r->type) {
    case LM_ROPE_DEFAULT:
        rope_default(cfg->rope_theta, cfg->head_dim, inv_freq);
        return LM_OK;
    case LM_ROPE_LINEAR:
        if (!(r->factor > 0)) break;
        rope_default(cfg->rope_theta, cfg->head_dim, inv_freq);
        for (int64_t i = 0; i < cfg->head_dim / 2; i++) inv_freq[i] /= r->factor;
        return LM_OK;
    case LM_ROPE_LLAMA3:
        if (!(r->factor > 0 && r->low_freq_factor > 0 && r->high_freq_factor > r->low_freq_factor &&
              r->original_max_position_embeddings > 0))
            break;
        rope_default(cfg->rope_theta, cfg->head_dim, inv_freq);
        rope_llama3(r, cfg->head_dim, inv_freq);
        return LM_OK;
    case LM_ROPE_YARN:
        if (!(r->factor > 0 && r->beta_fast > 0 && r->beta_slow > 0 && cfg->max_position_embeddings > 0)) break;
        rope_yarn(cfg, inv_freq, attention_scaling);
        return LM_OK;
    }
    return lm__error(LM_INVALID_ARGUMENT, "lm_model_config_rope: invalid parameters for rope type %s",
                     lm_rope_type_name(r->type));
}
