/* Decode schedules (loom/plan.h lm_decode_plan): the decode step as the CUDA executor
 * prepares it (the GPU's passes, run here on the CPU's operators) cut into work items
 * on 1, 2, 5 and 132 SMs, checked (every conflicting pair of items ordered by
 * dependencies, lists ascending), then run item by item on the CPU in the global order
 * and in seeded random interleavings of the SMs, with the activation arena poisoned:
 * four decode steps (positions 0..3; one, two and four rows: past two the GEMM path's
 * norms and SwiGLU are cut by rows, and attention by rows and kv heads) give the executor's logits
 * (NMSE <= 1e-10 and max |d| <= 1e-5 of max |logit|: the pieces run the same operators
 * on views, so only the GEMV's blocking over fewer rows may differ).
 * Models: bf16 weights (the fused q|k|v + RoPE + KV store and gate|up + SwiGLU GEMVs,
 * split by heads and RoPE's pairs, and by columns), f32 (unfused front), a sliding window with biases, and
 * int8 / int4 weights; attention cut by key chunks (softmax partials merged per kv
 * head) over 40 steps of a 64-position cache, with and without a sliding window. The
 * check must fail when a dependency is removed or a list is
 * reordered; a run after a binding change is refused; bad options are refused; on one
 * SM the predicted time is the sum of the item times.
 * LM_TEST_LABELS: unit model plan
 */
#include "harness.h"

#include "plan/dplan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;

static lm_model *load(const char *name, lm_weights w) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/models/%s", LOOM_SOURCE_DIR, name);
    lm_model_load_options lo;
    lm_model_load_options_default(&lo);
    lo.weights = w;
    lm_model *m = NULL;
    LT_CHECK_OK(lm_model_load_opts(dir, lm_device_cpu(), &lo, &m));
    return m;
}

static lm_decode_plan_options small_items(int sms) {
    lm_decode_plan_options o;
    lm_decode_plan_options_default(&o);
    o.sms = sms;
    o.item_bytes = 2048; /* the reference models are tiny: cut them fine */
    o.min_item_bytes = 256;
    return o;
}

/* Steps at positions 0 .. nsteps - 1 through the executor and through plan p of the
 * same step object; returns the worst NMSE. */
static double compare_steps(lm_decode_step *ref, lm_decode_step *s, lm_decode_plan *p, int64_t B, int64_t V,
                            uint64_t seed, int nsteps, const char *what) {
    int32_t ids[4], pos[4];
    float *want = malloc(sizeof(float) * (size_t)(B * V)), *got = malloc(sizeof(float) * (size_t)(B * V));
    double worst = 0;
    for (int t = 0; t < nsteps; t++) {
        for (int b = 0; b < B; b++) ids[b] = (int32_t)(((7 + 4 * b) * t + 3 + b) % V), pos[b] = t;
        LT_CHECK_OK(lm_decode_step_run(ref, g_ctx, ids, pos, NULL, 0, want));
        uint64_t order = t == 0 ? 0 : seed + (uint64_t)t;
        LT_CHECK_OK(lm_decode_step_run(s, g_ctx, ids, pos, p, order, got));
        double num = 0, den = 0, md = 0, mx = 0;
        for (int64_t i = 0; i < B * V; i++) {
            double d = (double)got[i] - want[i];
            num += d * d, den += (double)want[i] * want[i];
            md = fmax(md, fabs(d)), mx = fmax(mx, fabs(want[i]));
        }
        double nmse = num / (den > 0 ? den : 1);
        LT_CHECK_MSG(isfinite(nmse) && nmse <= 1e-10 && md <= 1e-5 * mx, "%s step %d order %llu: nmse %.3g, max |d| %.3g of %.3g",
                     what, t, (unsigned long long)order, nmse, md, mx);
        worst = fmax(worst, isfinite(nmse) ? nmse : 1);
    }
    free(want), free(got);
    return worst;
}

static int count_kind(const lm_decode_plan *p, lm__dp_kind k) {
    int n = 0;
    for (int64_t i = 0; i < p->nitems; i++) n += p->items[i].kind == k;
    return n;
}

/* Linear pieces start at whole row groups of the GPU's decode GEMV (LM__DP_ROW_QUANTUM
 * rows; SwiGLU columns and RoPE pairs half as many), so a persistent kernel's item is a
 * range of them; the pieces of one op cover its rows once. Returns the misplaced ones. */
static int misaligned(const lm_decode_plan *p) {
    int bad = 0;
    for (int64_t i = 0; i < p->nitems; i++) {
        const lm__dp_item *it = &p->items[i];
        if (it->kind == LM__DP_ROWS) bad += it->lo % LM__DP_ROW_QUANTUM != 0 || it->hi <= it->lo;
        if (it->kind == LM__DP_SWIGLU) bad += it->lo % (LM__DP_ROW_QUANTUM / 2) != 0 || it->hi <= it->lo;
        if (it->kind == LM__DP_QKV) bad += it->k0 % (LM__DP_ROW_QUANTUM / 2) != 0 || it->k1 <= it->k0;
    }
    return bad;
}

static void check_model(const char *name, lm_weights w, int fused_front) {
    lm_model *m = load(name, w);
    if (!m) return;
    int64_t V = lm_model_get_config(m)->vocab_size;
    for (int64_t B = 1; B <= 4; B *= 2) { /* 4 rows: the GEMM path's unfused norms and SwiGLU, cut by rows */
        lm_decode_step *ref = NULL, *s = NULL;
        LT_CHECK_OK(lm_decode_step_create(g_ctx, m, B, 16, &ref));
        LT_CHECK_OK(lm_decode_step_create(g_ctx, m, B, 16, &s));
        if (!ref || !s) break;
        static const int sms[4] = {1, 2, 5, 132};
        for (int k = 0; k < 4; k++) {
            lm_decode_plan_options o = small_items(sms[k]);
            lm_decode_plan *p = NULL;
            LT_CHECK_OK(lm_decode_plan_create(lm_decode_step_exec(s), &o, &p));
            if (!p) continue;
            LT_CHECK_OK(lm_decode_plan_check(p));
            lm_decode_plan_stats st;
            LT_CHECK_OK(lm_decode_plan_get_stats(p, &st));
            LT_CHECK(st.items > st.ops_split + st.ops_whole && st.ops_split > 0 && st.deps > 0);
            LT_CHECK_MSG(misaligned(p) == 0, "%s: %d pieces off the GEMV's row groups", name, misaligned(p));
            LT_CHECK(st.step_s > 0 && st.step_s <= st.busy_s * (1 + 1e-12));
            if (sms[k] == 1)
                LT_CHECK_MSG(fabs(st.step_s - st.busy_s) <= 1e-12 * st.busy_s, "one SM: step %.6g s, busy %.6g s",
                             st.step_s, st.busy_s);
            LT_CHECK(count_kind(p, LM__DP_ROWS) > 0 && count_kind(p, LM__DP_ATTN) > 0);
            int row_ops = 0;
            for (int64_t i = 0; i < p->g->nops; i++)
                row_ops += lm__dp_row_input(&p->g->ops[i], 0);
            if (B == 4 && sms[k] > 1 && row_ops) /* each such op in row pieces */
                LT_CHECK_MSG(count_kind(p, LM__DP_MROWS) >= 2 * row_ops, "%s: %d row pieces of %d row ops", name,
                             count_kind(p, LM__DP_MROWS), row_ops);
            const lm_model_config *c = lm_model_get_config(m);
            int heads = (int)((c->num_attention_heads + 2 * c->num_key_value_heads) * c->num_hidden_layers);
            if (fused_front && B <= 2 && sms[k] == 132 && c->head_dim >= 32) /* RoPE's pairs cut too (8 or more a piece) */
                LT_CHECK_MSG(count_kind(p, LM__DP_QKV) > heads, "%s: %d front items for %d heads", name,
                             count_kind(p, LM__DP_QKV), heads);
            if (fused_front && B <= 2) {
                LT_CHECK_MSG(count_kind(p, LM__DP_QKV) >= 3 && count_kind(p, LM__DP_SWIGLU) > 0,
                             "%s: %d front items, %d SwiGLU items", name, count_kind(p, LM__DP_QKV),
                             count_kind(p, LM__DP_SWIGLU));
            }
            char what[160];
            snprintf(what, sizeof what, "%s %s B%lld on %d SMs", name, lm_weights_name(w), (long long)B, sms[k]);
            compare_steps(ref, s, p, B, V, 1000u * (uint64_t)k + 17, 4, what);
            lm_decode_plan_destroy(p);
        }
        lm_decode_step_destroy(ref), lm_decode_step_destroy(s);
    }
    lm_model_destroy(m);
}

static void test_bf16_fused_front(void) {
    check_model("llama3_scaled_bf16", LM_WEIGHTS_AUTO, 1);
    check_model("qwen2_window_bf16", LM_WEIGHTS_AUTO, 1);
}

static void test_f32_and_window(void) {
    check_model("llama_gqa2_f32", LM_WEIGHTS_AUTO, 0);
    check_model("mistral_window_f32", LM_WEIGHTS_AUTO, 0);
}

static void test_quantized(void) {
    check_model("qwen2_bias_sharded", LM_WEIGHTS_INT8, 0);
    check_model("llama_gqa2_f32", LM_WEIGHTS_INT4, 0);
}

/* Attention cut by key chunks of each kv head (softmax partials merged per head): a
 * 64-position cache in chunks of 16, 40 steps so tokens see keys in up to three chunks
 * (and a sliding window cuts into them), against the executor's attention. */
static void check_key_split(const char *name) {
    lm_model *m = load(name, LM_WEIGHTS_AUTO);
    if (!m) return;
    int64_t V = lm_model_get_config(m)->vocab_size, B = 2;
    lm_decode_step *ref = NULL, *s = NULL;
    LT_CHECK_OK(lm_decode_step_create(g_ctx, m, B, 64, &ref));
    LT_CHECK_OK(lm_decode_step_create(g_ctx, m, B, 64, &s));
    lm_decode_plan_options o = small_items(16);
    o.item_bytes = 1024, o.min_item_bytes = 64;
    lm_decode_plan *p = NULL;
    if (ref && s) LT_CHECK_OK(lm_decode_plan_create(lm_decode_step_exec(s), &o, &p));
    if (p) {
        LT_CHECK_OK(lm_decode_plan_check(p));
        int parts = count_kind(p, LM__DP_ATTN_PART), merges = count_kind(p, LM__DP_ATTN_COMBINE);
        LT_CHECK_MSG(parts >= 4 * merges && merges > 0 && count_kind(p, LM__DP_ATTN) == 0,
                     "%s: %d key chunks, %d merges, %d whole heads", name, parts, merges, count_kind(p, LM__DP_ATTN));
        char what[96];
        snprintf(what, sizeof what, "%s key split", name);
        compare_steps(ref, s, p, B, V, 99, 40, what);
    }
    lm_decode_plan_destroy(p);
    lm_decode_step_destroy(ref), lm_decode_step_destroy(s);
    lm_model_destroy(m);
}

static void test_attention_key_split(void) {
    check_key_split("llama3_scaled_bf16");
    check_key_split("mistral_window_f32");
    check_key_split("qwen2_mqa_yarn");
}

/* A removed dependency or a reordered list is caught by the check; stale views and
 * bad options are refused. */
static void test_check_catches(void) {
    lm_model *m = load("llama3_scaled_bf16", LM_WEIGHTS_AUTO);
    if (!m) return;
    lm_decode_step *s = NULL;
    LT_CHECK_OK(lm_decode_step_create(g_ctx, m, 1, 16, &s));
    lm_decode_plan_options o = small_items(3);
    lm_decode_plan *p = NULL;
    LT_CHECK_OK(lm_decode_plan_create(lm_decode_step_exec(s), &o, &p));
    if (!p) goto out;
    LT_CHECK_OK(lm_decode_plan_check(p));
    int64_t a = -1;
    for (int64_t i = 0; i < p->nitems && a < 0; i++)
        if (p->items[i].kind == LM__DP_ATTN && p->items[i].ndep > 0) a = i;
    LT_CHECK(a >= 0);
    if (a >= 0) {
        while (p->items[a].ndep > 0) lm__dp_drop_dep(p, a, 0);
        LT_CHECK_STATUS(lm_decode_plan_check(p), LM_INTERNAL);
        LT_CHECK_MSG(strstr(lm_last_error(), "no chain of dependencies") != NULL, "%s", lm_last_error());
    }
    lm_decode_plan_destroy(p);
    p = NULL;
    LT_CHECK_OK(lm_decode_plan_create(lm_decode_step_exec(s), &o, &p));
    if (!p) goto out;
    for (int sm = 0; sm < o.sms; sm++)
        if (p->sm_begin[sm + 1] - p->sm_begin[sm] >= 2) {
            int32_t *l = &p->order[p->sm_begin[sm]], t = l[0];
            l[0] = l[1], l[1] = t;
            break;
        }
    LT_CHECK_STATUS(lm_decode_plan_check(p), LM_INTERNAL);
    LT_CHECK_MSG(strstr(lm_last_error(), "out of order") != NULL, "%s", lm_last_error());
    lm_decode_plan_destroy(p);
    p = NULL;
    /* the waits (op counters): fewer than the dependencies, and a dropped or misplaced
     * one is caught */
    for (int mut = 0; mut < 2; mut++) {
        LT_CHECK_OK(lm_decode_plan_create(lm_decode_step_exec(s), &o, &p));
        if (!p) goto out;
        lm_decode_plan_stats ps;
        LT_CHECK_OK(lm_decode_plan_get_stats(p, &ps));
        LT_CHECK_MSG(ps.waits > 0 && ps.waits < ps.deps, "waits %lld, deps %lld", (long long)ps.waits,
                     (long long)ps.deps);
        int64_t wi = -1, wk = -1;
        for (int64_t i = 0; i < p->nitems && wi < 0; i++)
            for (int64_t k = p->wait_begin[i]; k < p->wait_begin[i + 1] && wi < 0; k++)
                if (p->waits[k] < 0) wi = i, wk = k - p->wait_begin[i];
        LT_CHECK(wi >= 0);
        if (wi >= 0 && mut == 0) {
            lm__dp_drop_wait(p, wi, (int)wk);
            LT_CHECK_STATUS(lm_decode_plan_check(p), LM_INTERNAL);
            LT_CHECK_MSG(strstr(lm_last_error(), "do not cover its dependency") != NULL, "%s", lm_last_error());
        } else if (wi >= 0) { /* a counter of an op that finishes only later */
            p->waits[p->wait_begin[wi] + wk] = -p->item_op[p->nitems - 1] - 1;
            LT_CHECK_STATUS(lm_decode_plan_check(p), LM_INTERNAL);
            LT_CHECK_MSG(strstr(lm_last_error(), "is not earlier") != NULL, "%s", lm_last_error());
        }
        lm_decode_plan_destroy(p);
        p = NULL;
    }
    /* a binding change after planning: the run refuses the stale footprints */
    LT_CHECK_OK(lm_decode_plan_create(lm_decode_step_exec(s), &o, &p));
    const lm_model_config *c = lm_model_get_config(m);
    int64_t cs[4] = {1, c->num_key_value_heads, 16, c->head_dim};
    lm_tensor *t = NULL;
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 4, cs, &t));
    LT_CHECK_OK(lm_exec_bind(lm_decode_step_exec(s), "k_cache.0", lm_tensor_as_view(t)));
    LT_CHECK_STATUS(lm_decode_plan_run_cpu(p, g_ctx, 0), LM_INVALID_ARGUMENT);
    LT_CHECK_MSG(strstr(lm_last_error(), "bindings changed") != NULL, "%s", lm_last_error());
    lm_decode_plan_destroy(p);
    lm_tensor_destroy(t);
    /* options */
    lm_decode_plan *q = NULL;
    o.sms = 0;
    LT_CHECK_STATUS(lm_decode_plan_create(lm_decode_step_exec(s), &o, &q), LM_INVALID_ARGUMENT);
    o = small_items(2);
    o.item_s = -1;
    LT_CHECK_STATUS(lm_decode_plan_create(lm_decode_step_exec(s), &o, &q), LM_INVALID_ARGUMENT);
    LT_CHECK(q == NULL);
    LT_CHECK_STATUS(lm_decode_step_create(g_ctx, m, 0, 16, &(lm_decode_step *){NULL}), LM_INVALID_ARGUMENT);
out:
    lm_decode_step_destroy(s);
    lm_model_destroy(m);
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 2, &g_ctx));
    LT_RUN(test_bf16_fused_front);
    LT_RUN(test_f32_and_window);
    LT_RUN(test_quantized);
    LT_RUN(test_attention_key_split);
    LT_RUN(test_check_catches);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
