/* CUDA attention kernels against the CPU reference attention:
 *  - the readable kernel per float dtype: GQA, causal and not, Dv != D, q/k/v/out as
 *    permuted views of [B, T, H, D] buffers, and 2500 keys (three online-softmax chunks);
 *  - rows_v2 (decode / generic prefill) over a bf16 cache: groups of 1, 4 and 7 query
 *    heads, head dims 12, 16, 64, contexts from 1 key to 2000 keys (one split up to
 *    eight splits of 256 keys combined by the last block), f32 and bf16 q and out; run
 *    twice to prove the split counters are left at zero (what graph replay relies on);
 *  - prefill_v3 (tensor-core flash) for head dims 64 and 128: two rows with different
 *    cached prefixes, partial query tiles, cache positions past the written range
 *    poisoned with NaN (they must never leak into the output).
 * The reference runs in f32 on the same bf16-rounded q/K/V. Gates: rows_v2 keeps
 * probabilities in f32 (NMSE 1e-9 for f32 out); the flash kernel rounds P to bf16 for
 * the P V product (relative 2^-9 per weight, NMSE ~1e-6): NMSE 2e-5 / max-abs 0.02.
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

static lm_ctx *g_ctx, *g_ref;

/* [B, T, H, D] random buffer viewed [B, H, T, D]. */
static ct_pair bthd(lt_rng *r, lm_dtype dt, int64_t B, int64_t T, int64_t H, int64_t D, lm_tensor_view *hv,
                    lm_tensor_view *dv) {
    int64_t s[4] = {B, T, H, D};
    ct_pair p = ct_random(r, dt, 4, s, 1.0);
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(p.h), 1, 2, hv));
    *dv = ct_mirror(p.h, hv, p.d);
    return p;
}

static void check_readable(lm_dtype dt, int causal, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv) {
    lt_rng r = lt_rng_seed(71 + (uint64_t)Tk);
    int64_t B = 2, D = 16, Dv = 12;
    lm_tensor_view qh, qd, kh, kd, vh, vd;
    ct_pair q = bthd(&r, dt, B, Tq, Hq, D, &qh, &qd), k = bthd(&r, dt, B, Tk, Hkv, D, &kh, &kd);
    ct_pair v = bthd(&r, dt, B, Tk, Hkv, Dv, &vh, &vd);
    int64_t os[4] = {B, Tq, Hq, Dv};
    ct_pair o = ct_poisoned(dt, 4, os);
    lm_tensor_view oh, od;
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(o.h), 1, 2, &oh));
    od = ct_mirror(o.h, &oh, o.d);
    lm_tensor *want = lt_poisoned_tensor(dt, 4, os);
    lm_tensor_view wv;
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(want), 1, 2, &wv));
    float scale = 0.25f;
    LT_CHECK_OK(lm_attention_out(g_ref, &qh, &kh, &vh, scale, causal, &wv));
    LT_CHECK_OK(lm__cuda_attention(&qd, &kd, &vd, scale, causal, &od, ct_stream(g_ctx)));
    char what[96];
    snprintf(what, sizeof what, "attention %s causal %d Tq %lld Tk %lld", lm_dtype_name(dt), causal, (long long)Tq,
             (long long)Tk);
    ct_check(g_ctx, what, &o, &od, &wv, ct_nmse(dt), ct_abs(dt, 2.0));
    ct_pair_free(&q), ct_pair_free(&k), ct_pair_free(&v), ct_pair_free(&o);
    lm_tensor_destroy(want);
}

static void test_readable_attention(void) {
    for (int kx = 0; kx < 3; kx++) {
        check_readable(ct_floats[kx], 1, 5, 9, 4, 2);
        check_readable(ct_floats[kx], 0, 7, 3, 6, 3);
    }
    check_readable(LM_F32, 1, 3, 2500, 2, 1);
    check_readable(LM_BF16, 0, 2, 2500, 4, 4);
}

/* A bf16 cache [slots, Hkv, max_t, hd]: random below valid[slot] positions, NaN above. */
static ct_pair make_cache(lt_rng *r, int slots, int Hkv, int64_t max_t, int64_t hd, const int64_t *valid) {
    int64_t s[4] = {slots, Hkv, max_t, hd};
    lm_tensor *h = lt_random_tensor(r, LM_BF16, 4, s, 1.0);
    uint16_t *p = lm_tensor_data(h);
    for (int sl = 0; sl < slots; sl++)
        for (int kh = 0; kh < Hkv; kh++)
            for (int64_t t = valid[sl]; t < max_t; t++)
                for (int64_t d = 0; d < hd; d++) p[(((int64_t)sl * Hkv + kh) * max_t + t) * hd + d] = 0x7fc0;
    return ct_pair_of(h);
}

/* Reference for one query token: q f32 [Hq, hd] of token tok, keys [0, len) of slot:
 * out f32 [Hq, hd] written into want at token tok. */
static void ref_token(const lm_tensor *q32, const lm_tensor *cache_k, const lm_tensor *cache_v, int64_t tok, int slot,
                      int64_t len, int64_t Tq, int64_t q0, lm_tensor *want) {
    int64_t Hq = lm_tensor_dim(q32, 1), hd = lm_tensor_dim(q32, 2), Hkv = lm_tensor_dim(cache_k, 1);
    lm_tensor_view qv, kv, vv, ov;
    /* q tokens [q0, q0 + Tq) as [1, Hq, Tq, hd] */
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(q32), 0, q0, q0 + Tq, 1, &qv));
    LT_CHECK_OK(lm_tensor_view_transpose(&qv, 0, 1, &qv));
    int64_t one[2] = {1, Hq};
    LT_CHECK_OK(lm_tensor_view_split_axis(&qv, 0, 2, one, &qv));
    LT_CHECK_OK(lm_tensor_view_select(lm_tensor_as_view(cache_k), 0, slot, &kv));
    LT_CHECK_OK(lm_tensor_view_slice(&kv, 1, 0, len, 1, &kv));
    LT_CHECK_OK(lm_tensor_view_select(lm_tensor_as_view(cache_v), 0, slot, &vv));
    LT_CHECK_OK(lm_tensor_view_slice(&vv, 1, 0, len, 1, &vv));
    int64_t onek[2] = {1, Hkv};
    LT_CHECK_OK(lm_tensor_view_split_axis(&kv, 0, 2, onek, &kv));
    LT_CHECK_OK(lm_tensor_view_split_axis(&vv, 0, 2, onek, &vv));
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(want), 0, q0, q0 + Tq, 1, &ov));
    LT_CHECK_OK(lm_tensor_view_transpose(&ov, 0, 1, &ov));
    LT_CHECK_OK(lm_tensor_view_split_axis(&ov, 0, 2, one, &ov));
    LT_CHECK_OK(lm_attention_out(g_ref, &qv, &kv, &vv, 1.0f / sqrtf((float)hd), 1, &ov));
    (void)tok;
}

static lm_tensor *to_f32(const lm_tensor *t) {
    lm_tensor *o = NULL;
    LT_CHECK_OK(lm_cast(g_ref, lm_tensor_as_view(t), LM_F32, &o));
    return o;
}

static void check_rows(int Hq, int Hkv, int64_t hd, int64_t max_t, int ntok, const int32_t *tpos, const int32_t *tslot,
                       int q_bf16, int out_bf16) {
    lt_rng r = lt_rng_seed(81 + (uint64_t)(hd + max_t));
    int slots = 3;
    int64_t valid[3] = {max_t, max_t, max_t};
    ct_pair kc = make_cache(&r, slots, Hkv, max_t, hd, valid), vc = make_cache(&r, slots, Hkv, max_t, hd, valid);
    int64_t qs[3] = {ntok, Hq, hd}, nt = ntok;
    ct_pair q = ct_random(&r, q_bf16 ? LM_BF16 : LM_F32, 3, qs, 1.0);
    lm_tensor *posh = NULL, *sloth = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, &nt, tpos, &posh));
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, &nt, tslot, &sloth));
    ct_pair pos = ct_pair_of(posh), slot = ct_pair_of(sloth);
    int nsplit = lm__cuda_attention_rows_splits(max_t);
    size_t ws = lm__cuda_attention_rows_workspace(ntok, Hq, (int)hd, nsplit);
    int64_t wsn = (int64_t)ws, cn = (int64_t)ntok * Hq;
    ct_pair part = ct_poisoned(LM_F32, 1, &wsn);
    lm_tensor *zeros = NULL, *cz = NULL;
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_I32, 1, &cn, &zeros));
    LT_CHECK_OK(lm_tensor_to_device(NULL, zeros, ct_gpu, &cz));
    ct_pair o = ct_poisoned(out_bf16 ? LM_BF16 : LM_F32, 3, qs);
    lm__cuda_attn_params p = {lm_tensor_data(q.d), q_bf16, lm_tensor_data(pos.d), lm_tensor_data(slot.d), ntok, Hq,
                             1.0f / sqrtf((float)hd), lm_tensor_data(o.d), out_bf16, lm_tensor_data(part.d),
                             lm_tensor_data(cz), nsplit};
    lm__cuda_kv kv = {lm_tensor_data(kc.d), lm_tensor_data(vc.d), max_t, Hkv, (int)hd};
    lm_tensor *q32 = to_f32(q.h), *k32 = to_f32(kc.h), *v32 = to_f32(vc.h), *want32 = lt_poisoned_tensor(LM_F32, 3, qs);
    for (int t = 0; t < ntok; t++) ref_token(q32, k32, v32, t, tslot[t], tpos[t] + 1, 1, t, want32);
    lm_tensor *want = lt_poisoned_tensor(out_bf16 ? LM_BF16 : LM_F32, 3, qs);
    LT_CHECK_OK(lm_cast_out(g_ref, lm_tensor_as_view(want32), lm_tensor_as_view(want)));
    lm_dtype odt = out_bf16 ? LM_BF16 : LM_F32;
    for (int rep = 0; rep < 2; rep++) {
        LT_CHECK_OK(lm_tensor_view_poison(NULL, lm_tensor_as_view(o.d)));
        LT_CHECK_OK(lm__cuda_attention_rows_v2(&p, &kv, ct_stream(g_ctx)));
        char what[128];
        snprintf(what, sizeof what, "attention_rows_v2 G %d hd %lld max_t %lld q %s out %s run %d", Hq / Hkv,
                 (long long)hd, (long long)max_t, q_bf16 ? "bf16" : "f32", out_bf16 ? "bf16" : "f32", rep);
        ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), out_bf16 ? ct_nmse(odt) : 1e-9,
                 ct_abs(odt, 1.0));
    }
    lm_tensor *cback = NULL; /* the counters are back at zero */
    LT_CHECK_OK(lm_ctx_synchronize(g_ctx));
    LT_CHECK_OK(lm_tensor_to_device(NULL, cz, lm_device_cpu(), &cback));
    int nonzero = 0;
    for (int64_t i = 0; cback && i < cn; i++) nonzero += ((int32_t *)lm_tensor_data(cback))[i] != 0;
    LT_CHECK_MSG(nonzero == 0, "%d split counters left non-zero", nonzero);
    lm_tensor_destroy(cback), lm_tensor_destroy(zeros), lm_tensor_destroy(cz);
    lm_tensor_destroy(q32), lm_tensor_destroy(k32), lm_tensor_destroy(v32), lm_tensor_destroy(want32);
    lm_tensor_destroy(want);
    ct_pair_free(&kc), ct_pair_free(&vc), ct_pair_free(&q), ct_pair_free(&pos), ct_pair_free(&slot);
    ct_pair_free(&part), ct_pair_free(&o);
}

static void test_rows_v2_decode(void) {
    int32_t pos_a[4] = {0, 63, 64, 300}, slot_a[4] = {0, 1, 2, 1};
    check_rows(14, 2, 64, 512, 4, pos_a, slot_a, 0, 0); /* Qwen2.5-0.5B shape: group 7 */
    check_rows(14, 2, 64, 512, 4, pos_a, slot_a, 1, 1);
    int32_t pos_b[3] = {1999, 700, 5}, slot_b[3] = {2, 0, 1};
    check_rows(8, 2, 16, 2048, 3, pos_b, slot_b, 0, 0); /* eight splits */
    check_rows(32, 8, 64, 2048, 3, pos_b, slot_b, 1, 0);
    int32_t pos_c[2] = {9, 2}, slot_c[2] = {0, 0};
    check_rows(4, 4, 12, 40, 2, pos_c, slot_c, 0, 0);
}

static void check_prefill(int Hq, int Hkv, int64_t hd, int out_bf16) {
    lt_rng r = lt_rng_seed(91 + (uint64_t)hd);
    const int B = 2, slots = 3;
    const int64_t T = 70, max_t = 256, start[2] = {0, 100};
    const int slot_of[2] = {2, 0};
    int64_t valid[3] = {start[1] + T, 0, start[0] + T}; /* by slot: what exists after this call */
    ct_pair kc = make_cache(&r, slots, Hkv, max_t, hd, valid), vc = make_cache(&r, slots, Hkv, max_t, hd, valid);
    int64_t ntok = B * T, qs[3] = {ntok, Hq, hd};
    ct_pair q = ct_random(&r, LM_BF16, 3, qs, 1.0);
    int32_t tpos[140], tslot[140];
    for (int b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) tpos[b * T + t] = (int32_t)(start[b] + t), tslot[b * T + t] = slot_of[b];
    lm_tensor *posh = NULL, *sloth = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, &ntok, tpos, &posh));
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, &ntok, tslot, &sloth));
    ct_pair pos = ct_pair_of(posh), slot = ct_pair_of(sloth);
    ct_pair o = ct_poisoned(out_bf16 ? LM_BF16 : LM_F32, 3, qs);
    lm__cuda_attn_params p = {lm_tensor_data(q.d), 1, lm_tensor_data(pos.d), lm_tensor_data(slot.d), ntok, Hq,
                             1.0f / sqrtf((float)hd), lm_tensor_data(o.d), out_bf16, NULL, NULL, 1};
    lm__cuda_kv kv = {lm_tensor_data(kc.d), lm_tensor_data(vc.d), max_t, Hkv, (int)hd};
    LT_CHECK_OK(lm__cuda_attention_prefill_v3(&p, B, T, &kv, ct_stream(g_ctx)));
    lm_tensor *q32 = to_f32(q.h), *k32 = to_f32(kc.h), *v32 = to_f32(vc.h), *want32 = lt_poisoned_tensor(LM_F32, 3, qs);
    for (int b = 0; b < B; b++) ref_token(q32, k32, v32, b * T, slot_of[b], start[b] + T, T, b * T, want32);
    lm_tensor *want = lt_poisoned_tensor(out_bf16 ? LM_BF16 : LM_F32, 3, qs);
    LT_CHECK_OK(lm_cast_out(g_ref, lm_tensor_as_view(want32), lm_tensor_as_view(want)));
    char what[96];
    snprintf(what, sizeof what, "attention_prefill_v3 Hq %d Hkv %d hd %lld out %s", Hq, Hkv, (long long)hd,
             out_bf16 ? "bf16" : "f32");
    ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), out_bf16 ? 5e-5 : 2e-5,
             out_bf16 ? 0.03 : 0.02);
    lm_tensor_destroy(q32), lm_tensor_destroy(k32), lm_tensor_destroy(v32), lm_tensor_destroy(want32);
    lm_tensor_destroy(want);
    ct_pair_free(&kc), ct_pair_free(&vc), ct_pair_free(&q), ct_pair_free(&pos), ct_pair_free(&slot), ct_pair_free(&o);
}

static void test_prefill_v3_flash(void) {
    LT_CHECK(lm__cuda_attention_prefill_v3_supports(64) && lm__cuda_attention_prefill_v3_supports(128) &&
             !lm__cuda_attention_prefill_v3_supports(96));
    check_prefill(4, 2, 64, 0);
    check_prefill(4, 2, 64, 1);
    check_prefill(2, 2, 128, 0);
    check_prefill(14, 2, 64, 1);
}

int main(void) {
    g_ctx = ct_start();
    g_ref = ct_ref_ctx();
    LT_RUN(test_readable_attention);
    LT_RUN(test_rows_v2_decode);
    LT_RUN(test_prefill_v3_flash);
    lm_ctx_destroy(g_ref);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
