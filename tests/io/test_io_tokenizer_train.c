/* Tests for byte-level BPE training (loom/tokenizer_train.h): the written
 * tokenizer.json loads and round-trips seen and unseen text (CJK, emoji, whitespace
 * runs); training is byte-for-byte deterministic across runs and thread counts;
 * merges on tiny corpora match ones worked out by hand (HF's tie-break) and, on a
 * random corpus, a naive trainer that recounts every pair each step; pieces counted
 * in chunks equal the pieces of the whole text; vocabulary sizes, special ids and
 * the preset JSON (against the real Llama 3 / Qwen3 files when present); errors and
 * allocation failures.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "io/tokenizer_internal.h"
#include "io_files.h"

#include "loom/tokenizer.h"
#include "loom/tokenizer_train.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char k_corpus[] = LOOM_SOURCE_DIR "/tests/data/train/corpus.txt";

/* ---- helpers -------------------------------------------------------------------------------- */
static lm_tokenizer_train_options opts(int32_t vocab, const char *const *specials, int n_special) {
    lm_tokenizer_train_options o;
    lm_tokenizer_train_options_default(&o);
    o.vocab_size = vocab;
    o.special_tokens = specials;
    o.n_special = n_special;
    o.n_threads = 1;
    return o;
}

static lm_tokenizer_train_input buffer(const char *text) {
    return (lm_tokenizer_train_input){NULL, text, strlen(text)};
}

/* Trains on inputs and loads the result; NULL (and a failure) on error. *json_out
 * (optional) receives the text (lm_free). */
static lm_tokenizer *train_load(const lm_tokenizer_train_input *in, int n, const lm_tokenizer_train_options *o,
                                char **json_out, lm_tokenizer_train_stats *stats) {
    char *json = NULL;
    size_t len = 0;
    lm_status s = lm_tokenizer_train(in, n, o, &json, &len, stats);
    LT_CHECK_MSG(s == LM_OK, "train: %s: %s", lm_status_name(s), lm_last_error());
    if (s != LM_OK) return NULL;
    LT_CHECK(strlen(json) == len);
    lm_tokenizer *tok = NULL;
    s = lm_tokenizer_load_json(json, len, &tok);
    LT_CHECK_MSG(s == LM_OK, "load: %s: %s", lm_status_name(s), lm_last_error());
    if (json_out) *json_out = json;
    else lm_free(json);
    return tok;
}

/* decode(encode(text)) == text. */
static void check_roundtrip(const lm_tokenizer *tok, const char *text, size_t n) {
    int32_t *ids = NULL;
    size_t k = 0;
    lm_status s = lm_tokenizer_encode(tok, text, n, &ids, &k);
    LT_CHECK_MSG(s == LM_OK, "encode: %s", lm_last_error());
    char *back = NULL;
    size_t len = 0;
    if (s == LM_OK) LT_CHECK_OK(lm_tokenizer_decode(tok, ids, k, 0, &back, &len));
    LT_CHECK_MSG(back && len == n && memcmp(back, text, n) == 0, "round trip differs for '%.*s'", (int)LM_MIN(n, 80),
                 text);
    lm_free(back);
    lm_free(ids);
}

static json_t *merges_of(const char *json) {
    json_t *root = json_loads(json, 0, NULL);
    json_t *m = json_incref(json_object_get(json_object_get(root, "model"), "merges"));
    json_decref(root);
    return m;
}

/* A deterministic pseudo-text of about n bytes: words over the first `letters` letters, digits,
 * punctuation, newlines and some multi-byte characters. */
static char *synthetic_text(size_t n, uint64_t seed, int letters) {
    static const char *extra[] = {"\xE4\xBD\xA0\xE5\xA5\xBD", "\xF0\x9F\x98\x80", "\xC3\xA9t\xC3\xA9", "  ", "\t",
                                  "\r\n", "don't", "I'M", "3.14", "\xE2\x80\x83"};
    lt_rng r = lt_rng_seed(seed);
    char *t = malloc(n + 64);
    size_t o = 0;
    while (o < n) {
        int k = (int)lt_rng_int(&r, 0, 9);
        if (k < 6) {
            int len = (int)lt_rng_int(&r, 1, 7);
            for (int i = 0; i < len; i++) t[o++] = (char)('a' + lt_rng_int(&r, 0, letters - 1));
        } else if (k < 7) {
            const char *e = extra[lt_rng_int(&r, 0, 9)];
            memcpy(t + o, e, strlen(e));
            o += strlen(e);
        } else if (k < 8) {
            t[o++] = (char)('0' + lt_rng_int(&r, 0, 9));
        } else {
            t[o++] = ".,;!?-\n"[lt_rng_int(&r, 0, 6)];
        }
        t[o++] = lt_rng_int(&r, 0, 9) < 8 ? ' ' : '\n';
    }
    t[o] = '\0';
    return t;
}

/* ---- (a) loads and round-trips ---------------------------------------------------------------- */
static void test_trained_file_loads_and_round_trips(void) {
    char *dir = tw_tmpdir(), path[512];
    tw_path(path, sizeof path, dir, "tokenizer.json");
    const char *specials[] = {"<|endoftext|>", "<|pad|>"};
    lm_tokenizer_train_options o = opts(600, specials, 2);
    lm_tokenizer_train_input in = {k_corpus, NULL, 0};
    lm_tokenizer_train_stats st;
    LT_CHECK_OK(lm_tokenizer_train_write(&in, 1, &o, path, &st));
    lm_tokenizer *tok = NULL;
    LT_CHECK_OK(lm_tokenizer_load(path, &tok));
    if (tok) {
        char *corpus = NULL;
        size_t n = 0;
        LT_CHECK_OK(lm_file_read_all(k_corpus, &corpus, &n));
        check_roundtrip(tok, corpus, n);
        int32_t *ids = NULL;
        size_t k = 0;
        LT_CHECK_OK(lm_tokenizer_encode(tok, corpus, n, &ids, &k));
        LT_CHECK_MSG(k < n / 3, "the trained merges compress the corpus: %zu ids for %zu bytes", k, n);
        lm_free(ids);
        lm_free(corpus);
        static const char *unseen[] = {
            "",
            "Hello, World! THE WEAVER'S loom isn't here; they'll've gone.",
            "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xEF\xBC\x81 "
            "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
            "emoji \xF0\x9F\x98\x80\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7!",
            "   leading\t\ttabs  and   runs   \n\n\n  \r\n\r\n trailing   ",
            "numbers 1234567 3.14159 -42e-7 \xD9\xA3\xD9\xA4",
            "\xC3\xA9\xCC\x81 combining, \xE2\x80\x83" "em space, \xC2\xA0nbsp, \xE1\xA0\x8E mongolian",
            "<|endoftext|>text<|pad|><|endoftext|>",
        };
        for (size_t i = 0; i < sizeof unseen / sizeof unseen[0]; i++)
            check_roundtrip(tok, unseen[i], strlen(unseen[i]));
    }
    lm_tokenizer_destroy(tok);
    tw_rmtree(dir);
    free(dir);
}

static void test_multilingual_corpus_round_trips(void) {
    char *text = synthetic_text(200000, 7, 6);
    lm_tokenizer_train_input in = buffer(text);
    const char *presets[] = {"llama3", "qwen2", "gpt2"};
    for (int p = 0; p < 3; p++) {
        lm_tokenizer_train_options o = opts(1500, NULL, 0);
        o.pretokenizer = presets[p];
        lm_tokenizer *tok = train_load(&in, 1, &o, NULL, NULL);
        if (!tok) continue;
        check_roundtrip(tok, text, strlen(text));
        const char *unseen = "zzz \xE4\xB8\x96\xE7\x95\x8C\xF0\x9F\x98\x80\xF0\x9F\x98\x81  \n\n x\xC2\xA0y 99999";
        check_roundtrip(tok, unseen, strlen(unseen));
        lm_tokenizer_destroy(tok);
    }
    free(text);
}

/* ---- (b) determinism ---------------------------------------------------------------------------- */
static void test_training_is_deterministic_across_runs_and_threads(void) {
    char *text = synthetic_text(2600000, 11, 6); /* > 2 chunks of 1 MiB */
    const char *specials[] = {"<s>"};
    lm_tokenizer_train_input in[2] = {buffer(text), {k_corpus, NULL, 0}};
    char *json[3] = {NULL, NULL, NULL};
    size_t len[3] = {0, 0, 0};
    int threads[3] = {1, 1, 2};
    for (int i = 0; i < 3; i++) {
        lm_tokenizer_train_options o = opts(2000, specials, 1);
        o.n_threads = threads[i];
        LT_CHECK_OK(lm_tokenizer_train(in, 2, &o, &json[i], &len[i], NULL));
    }
    LT_CHECK(json[0] && json[1] && len[0] == len[1] && memcmp(json[0], json[1], len[0]) == 0);
    LT_CHECK_MSG(json[0] && json[2] && len[0] == len[2] && memcmp(json[0], json[2], len[0]) == 0,
                 "1 and 2 threads give different files");
    for (int i = 0; i < 3; i++) lm_free(json[i]);
    free(text);
}

/* Counting in chunks (cut at newlines) sees exactly the pieces of the whole text. */
static void test_chunked_counting_equals_whole_text(void) {
    char *text = synthetic_text(3200000, 5, 6);
    size_t n = strlen(text);
    const char *presets[] = {"llama3", "gpt2"};
    for (int p = 0; p < 2; p++) {
        lm_tokenizer_train_options o = opts(300, NULL, 0);
        o.pretokenizer = presets[p];
        o.n_threads = 2;
        lm_tokenizer_train_input in = buffer(text);
        lm_tokenizer_train_stats st;
        lm_tokenizer *tok = train_load(&in, 1, &o, NULL, &st);
        if (!tok) continue;
        lm__tok_state *state = NULL;
        LT_CHECK_OK(lm__tok_state_create(tok, 0, &state));
        const uint8_t *base;
        size_t count = 0;
        if (state) LT_CHECK_OK(lm__tok_pretokenize(tok, state, (const uint8_t *)text, n, &base, &count));
        LT_CHECK_MSG(st.pieces == count, "%s: %llu pieces counted in chunks, %zu in the whole text", presets[p],
                     (unsigned long long)st.pieces, count);
        LT_CHECK(st.bytes == n);
        lm__tok_state_destroy(state);
        lm_tokenizer_destroy(tok);
    }
    free(text);
}

/* ---- (c) merges worked out by hand -------------------------------------------------------------- */
static void test_tiny_corpus_merges_match_hand_computation(void) {
    /* pieces "aaab" x1, " aaab" x1, " aab" x1. (a,a)=5 -> "aa"; then (aa,a), (a,b),
     * (Ġ,aa) all 2: the smallest ids win, a=64 b=65 < Ġ=220 -> "ab"; then (Ġ,aa) 2 ->
     * "Ġaa"; then all 1: (aa,ab) [256,257] < (Ġaa,b) [258,65] < (Ġaa,ab) [258,257]. */
    lm_tokenizer_train_input in = buffer("aaab aaab aab");
    lm_tokenizer_train_options o = opts(300, NULL, 0);
    char *json = NULL;
    lm_tokenizer_train_stats st;
    lm_tokenizer *tok = train_load(&in, 1, &o, &json, &st);
    json_t *m = json ? merges_of(json) : NULL;
    json_t *want = json_loads("[[\"a\",\"a\"],[\"a\",\"b\"],[\"\xC4\xA0\",\"aa\"],[\"aa\",\"ab\"],"
                              "[\"\xC4\xA0\x61\x61\",\"b\"],[\"\xC4\xA0\x61\x61\",\"ab\"]]",
                              0, NULL);
    LT_CHECK_MSG(m && json_equal(m, want), "merges differ from the hand computation");
    LT_CHECK(st.merges == 6 && st.exhausted && st.vocab_size == 262);
    LT_CHECK(st.pieces == 3 && st.words == 3);
    if (tok) {
        LT_CHECK(lm_tokenizer_vocab_size(tok) == 262); /* (d): fewer than asked: the pairs ran out */
        int32_t id = -1;
        LT_CHECK_OK(lm_tokenizer_token_to_id(tok, "!", 1, &id));
        LT_CHECK(id == 0);
        LT_CHECK_OK(lm_tokenizer_token_to_id(tok, "a", 1, &id));
        LT_CHECK(id == 64);
        LT_CHECK_OK(lm_tokenizer_token_to_id(tok, "\xC4\xA0", 2, &id)); /* Ġ: byte 0x20, the 33rd non-printable */
        LT_CHECK(id == 220);
        LT_CHECK_OK(lm_tokenizer_token_to_id(tok, "\xC4\x80", 2, &id)); /* Ā: byte 0x00 */
        LT_CHECK(id == 188);
        LT_CHECK_OK(lm_tokenizer_token_to_id(tok, "aa", 2, &id));
        LT_CHECK(id == 256);
        LT_CHECK_OK(lm_tokenizer_token_to_id(tok, "\xC4\xA0\x61\x61\x61\x62", 6, &id)); /* Ġaaab */
        LT_CHECK(id == 261);
        int32_t *ids = NULL;
        size_t k = 0;
        LT_CHECK_OK(lm_tokenizer_encode(tok, " aaab", 5, &ids, &k));
        LT_CHECK(k == 1 && ids && ids[0] == 261);
        lm_free(ids);
    }
    json_decref(m), json_decref(want);
    lm_free(json);
    lm_tokenizer_destroy(tok);

    /* min_frequency 2 stops after the three merges seen at least twice */
    o.min_frequency = 2;
    json = NULL;
    tok = train_load(&in, 1, &o, &json, &st);
    LT_CHECK(st.merges == 3 && st.exhausted && st.vocab_size == 259);
    lm_free(json);
    lm_tokenizer_destroy(tok);

    /* overlapping pairs merge left to right: "aaaaa" -> aa aa a, where (aa,a) and (aa,aa)
     * occur once each and (aa,a) has the smaller right id -> aa aaa -> aaaaa */
    in = buffer("aaaaa");
    o = opts(300, NULL, 0);
    json = NULL;
    tok = train_load(&in, 1, &o, &json, &st);
    m = json ? merges_of(json) : NULL;
    want = json_loads("[[\"a\",\"a\"],[\"aa\",\"a\"],[\"aa\",\"aaa\"]]", 0, NULL);
    LT_CHECK_MSG(m && json_equal(m, want), "overlapping merges differ");
    json_decref(m), json_decref(want);
    lm_free(json);
    lm_tokenizer_destroy(tok);
}

/* ---- incremental counts equal a naive trainer ------------------------------------------------------ */
typedef struct naive_word {
    int32_t sym[256];
    int n;
    int64_t count;
} naive_word;

/* Recounts all pairs every step (same rule: highest count, then smallest ids; a
 * merged pair is never chosen again; a string that exists keeps its id). Returns the
 * merges as a JSON array of byte-level string pairs. */
static json_t *naive_train(const lm_tokenizer *tok, const char *text, int32_t vocab) {
    enum { MAXT = 1024 };
    lm__tok_state *st = NULL;
    LT_CHECK_OK(lm__tok_state_create(tok, 0, &st));
    const uint8_t *base;
    size_t count = 0;
    LT_CHECK_OK(lm__tok_pretokenize(tok, st, (const uint8_t *)text, strlen(text), &base, &count));
    naive_word *w = calloc(count, sizeof *w);
    int nw = 0;
    for (size_t i = 0; i < count; i++) { /* distinct pieces, counted (quadratic but small) */
        const uint8_t *p = base + st->pa[i].off;
        size_t len = st->pa[i].len;
        LT_CHECK(len <= 256);
        if (len < 2 || len > 256) continue;
        naive_word x = {.n = (int)len, .count = 1};
        for (size_t k = 0; k < len; k++) lm_tokenizer_token_to_id(tok, (const char *)tok->byte_utf8[p[k]],
                                                                  tok->byte_utf8[p[k]][1] ? 2 : 1, &x.sym[k]);
        int j = 0;
        while (j < nw && !(w[j].n == x.n && memcmp(w[j].sym, x.sym, (size_t)x.n * 4) == 0)) j++;
        if (j == nw) w[nw++] = x;
        else w[j].count++;
    }
    static char str[MAXT][256];
    static uint8_t merged[MAXT][MAXT];
    static int64_t pc[MAXT][MAXT];
    memset(merged, 0, sizeof merged);
    int ntok = 256;
    for (int32_t id = 0; id < 256; id++) {
        const char *s;
        size_t len;
        lm_tokenizer_id_to_token(tok, id, &s, &len);
        memcpy(str[id], s, len + 1);
    }
    json_t *out = json_array();
    while (ntok < vocab && ntok < MAXT) {
        for (int a = 0; a < ntok; a++) memset(pc[a], 0, (size_t)ntok * sizeof pc[0][0]);
        for (int i = 0; i < nw; i++)
            for (int k = 0; k + 1 < w[i].n; k++) pc[w[i].sym[k]][w[i].sym[k + 1]] += w[i].count;
        int ba = -1, bb = -1;
        for (int a = 0; a < ntok; a++)
            for (int b = 0; b < ntok; b++)
                if (pc[a][b] > 0 && !merged[a][b] && (ba < 0 || pc[a][b] > pc[ba][bb])) ba = a, bb = b;
        if (ba < 0) break;
        merged[ba][bb] = 1;
        char s[sizeof str[0]];
        size_t la = strlen(str[ba]), lb = strlen(str[bb]);
        LT_CHECK(la + lb < sizeof s);
        if (la + lb >= sizeof s) break;
        memcpy(s, str[ba], la);
        memcpy(s + la, str[bb], lb + 1);
        int t = 0;
        while (t < ntok && strcmp(str[t], s) != 0) t++;
        if (t == ntok) memcpy(str[ntok++], s, la + lb + 1);
        json_array_append_new(out, json_pack("[s, s]", str[ba], str[bb]));
        for (int i = 0; i < nw; i++) { /* left to right, non-overlapping */
            int o = 0;
            for (int r = 0; r < w[i].n;) {
                if (r + 1 < w[i].n && w[i].sym[r] == ba && w[i].sym[r + 1] == bb) w[i].sym[o++] = t, r += 2;
                else w[i].sym[o++] = w[i].sym[r++];
            }
            w[i].n = o;
        }
    }
    free(w);
    lm__tok_state_destroy(st);
    return out;
}

static void test_incremental_merges_equal_naive_recount(void) {
    char *text = synthetic_text(30000, 3, 3);
    lm_tokenizer_train_input in = buffer(text);
    lm_tokenizer_train_options o = opts(700, NULL, 0);
    char *json = NULL;
    lm_tokenizer *tok = train_load(&in, 1, &o, &json, NULL);
    if (tok) {
        json_t *got = merges_of(json), *want = naive_train(tok, text, 700);
        LT_CHECK_MSG(json_equal(got, want), "merges differ from the naive trainer (%zu vs %zu merges)",
                     json_array_size(got), json_array_size(want));
        for (size_t i = 0; i < json_array_size(got) && i < json_array_size(want); i++)
            if (!json_equal(json_array_get(got, i), json_array_get(want, i))) {
                LT_CHECK_MSG(0, "first difference at merge %zu", i);
                break;
            }
        json_decref(got), json_decref(want);
    }
    lm_free(json);
    lm_tokenizer_destroy(tok);
    free(text);
}

/* ---- (d) vocabulary size and special tokens ------------------------------------------------------ */
static void test_vocab_size_and_special_tokens(void) {
    const char *specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    lm_tokenizer_train_input in = {k_corpus, NULL, 0};
    lm_tokenizer_train_options o = opts(600, specials, 3); /* the corpus allows 427 merges */
    lm_tokenizer_train_stats st;
    lm_tokenizer *tok = train_load(&in, 1, &o, NULL, &st);
    if (!tok) return;
    LT_CHECK(lm_tokenizer_vocab_size(tok) == 600 && st.vocab_size == 600 && !st.exhausted);
    LT_CHECK(st.merges == 600 - 256 - 3);
    for (int32_t i = 0; i < 3; i++) {
        int32_t id = -1;
        LT_CHECK_OK(lm_tokenizer_token_to_id(tok, specials[i], strlen(specials[i]), &id));
        LT_CHECK(id == i && lm_tokenizer_is_special(tok, id));
    }
    int32_t id = -1;
    LT_CHECK_OK(lm_tokenizer_token_to_id(tok, "!", 1, &id));
    LT_CHECK(id == 3); /* the byte symbols follow the specials */
    const char *text = "<|im_start|>user\nthe loom<|im_end|><|endoftext|>";
    int32_t *ids = NULL;
    size_t k = 0;
    LT_CHECK_OK(lm_tokenizer_encode(tok, text, strlen(text), &ids, &k));
    LT_CHECK(k >= 5 && ids && ids[0] == 1 && ids[k - 2] == 2 && ids[k - 1] == 0);
    for (size_t i = 1; ids && i + 2 < k; i++) LT_CHECK(ids[i] >= 3);
    lm_free(ids);
    check_roundtrip(tok, text, strlen(text));
    lm_tokenizer_destroy(tok);

    /* special tokens in the corpus are cut out: no merge spans or contains them */
    in = buffer("ab<|endoftext|>ab<|endoftext|>ab<|endoftext|>");
    o = opts(300, specials, 1);
    char *json = NULL;
    tok = train_load(&in, 1, &o, &json, &st);
    json_t *m = json ? merges_of(json) : NULL;
    json_t *want = json_loads("[[\"a\",\"b\"]]", 0, NULL);
    LT_CHECK_MSG(m && json_equal(m, want), "special tokens leaked into the merges");
    LT_CHECK(st.pieces == 3 && st.words == 1);
    json_decref(m), json_decref(want);
    lm_free(json);
    lm_tokenizer_destroy(tok);

    /* a merge whose string is a special token's content is refused: with the special
     * "Ġa", (Ġ,a) is skipped. Words Ġa x2, Ġxy x3: (x,y) 3 [ids 88,89] beats (Ġ,x) 3
     * [221,88]; then (Ġ,xy) 3; then (Ġ,a) 2 is refused and nothing is left. */
    const char *g_a[] = {"\xC4\xA0\x61"};
    in = buffer(" a a xy xy xy");
    o = opts(300, g_a, 1);
    json = NULL;
    tok = train_load(&in, 1, &o, &json, &st);
    m = json ? merges_of(json) : NULL;
    want = json_loads("[[\"x\",\"y\"],[\"\xC4\xA0\",\"xy\"]]", 0, NULL);
    LT_CHECK_MSG(m && json_equal(m, want), "a merge into a special token's content was not refused");
    LT_CHECK(st.exhausted && st.merges == 2);
    json_decref(m), json_decref(want);
    if (tok) check_roundtrip(tok, " a xy", 5);
    lm_free(json);
    lm_tokenizer_destroy(tok);
}

/* The preset JSON is exactly that of the real files (skipped when they are absent). */
static void check_component(const char *json, const char *real_path, const char *key) {
    json_t *real = json_load_file(real_path, 0, NULL);
    if (!real) return;
    json_t *ours = json_loads(json, 0, NULL);
    LT_CHECK_MSG(json_equal(json_object_get(ours, key), json_object_get(real, key)), "%s differs from %s", key,
                 real_path);
    json_decref(ours), json_decref(real);
}

static void test_presets_match_real_files(void) {
    lm_tokenizer_train_input in = buffer("some text to train on, some text");
    const char *presets[] = {"llama3", "qwen2"};
    const char *files[] = {LOOM_SOURCE_DIR "/third_party/tokenizers/llama3/tokenizer.json",
                           LOOM_SOURCE_DIR "/third_party/tokenizers/qwen3/tokenizer.json"};
    for (int p = 0; p < 2; p++) {
        lm_tokenizer_train_options o = opts(300, NULL, 0);
        o.pretokenizer = presets[p];
        char *json = NULL;
        size_t len = 0;
        LT_CHECK_OK(lm_tokenizer_train(&in, 1, &o, &json, &len, NULL));
        if (!json) continue;
        check_component(json, files[p], "pre_tokenizer");
        check_component(json, files[p], "decoder");
        if (p == 1) check_component(json, files[p], "post_processor");
        json_t *root = json_loads(json, 0, NULL);
        const char *keys[] = {"version", "truncation", "padding", "added_tokens", "normalizer",
                              "pre_tokenizer", "post_processor", "decoder", "model"};
        void *it = json_object_iter(root);
        for (int i = 0; i < 9; i++, it = json_object_iter_next(root, it))
            LT_CHECK_MSG(it && strcmp(json_object_iter_key(it), keys[i]) == 0, "key %d is not '%s'", i, keys[i]);
        LT_CHECK(json_is_null(json_object_get(root, "normalizer")));
        json_decref(root);
        lm_free(json);
    }
}

/* ---- progress -------------------------------------------------------------------------------------- */
typedef struct progress_log {
    int calls, done;
    uint64_t bytes_done, bytes_total;
    int64_t merges_done;
} progress_log;

static void on_progress(void *user, const lm_tokenizer_train_progress *p) {
    progress_log *l = user;
    l->calls++;
    if (p->stage == LM_TOKENIZER_TRAIN_DONE) {
        l->done++;
        l->bytes_done = p->bytes_done, l->bytes_total = p->bytes_total, l->merges_done = p->merges_done;
    }
}

static void test_progress_reports_stages(void) {
    lm_tokenizer_train_input in = {k_corpus, NULL, 0};
    lm_tokenizer_train_options o = opts(400, NULL, 0);
    progress_log l = {0};
    o.progress = on_progress, o.progress_user = &l, o.progress_interval = 0;
    char *json = NULL;
    size_t len = 0;
    LT_CHECK_OK(lm_tokenizer_train(&in, 1, &o, &json, &len, NULL));
    LT_CHECK(l.calls >= 3 && l.done == 1);
    LT_CHECK(l.bytes_done == l.bytes_total && l.bytes_total > 2000 && l.merges_done == 400 - 256);
    lm_free(json);
}

/* ---- (e) errors ------------------------------------------------------------------------------------- */
static void expect_error(const lm_tokenizer_train_input *in, int n, const lm_tokenizer_train_options *o,
                         lm_status want, const char *needle) {
    char *json = NULL;
    size_t len = 0;
    lm_status s = lm_tokenizer_train(in, n, o, &json, &len, NULL);
    LT_CHECK_MSG(s == want, "got %s, expected %s (%s)", lm_status_name(s), lm_status_name(want), lm_last_error());
    LT_CHECK_MSG(strstr(lm_last_error(), needle) != NULL, "error '%s' does not mention '%s'", lm_last_error(),
                 needle);
    LT_CHECK(json == NULL);
}

static void test_errors_name_the_problem(void) {
    lm_tokenizer_train_input text = buffer("hello world");
    const char *specials[] = {"<a>", "<b>"};
    lm_tokenizer_train_options o = opts(257, specials, 2);
    expect_error(&text, 1, &o, LM_INVALID_ARGUMENT, "258");
    o = opts(255, NULL, 0);
    expect_error(&text, 1, &o, LM_INVALID_ARGUMENT, "vocab size 255");
    lm_tokenizer_train_input missing = {"/nonexistent/corpus.txt", NULL, 0};
    o = opts(300, NULL, 0);
    expect_error(&missing, 1, &o, LM_IO_ERROR, "/nonexistent/corpus.txt");
    lm_tokenizer_train_input empty[2] = {buffer(""), buffer("")};
    expect_error(empty, 2, &o, LM_INVALID_ARGUMENT, "empty");
    expect_error(NULL, 0, &o, LM_INVALID_ARGUMENT, "empty");
    const char *eot[] = {"<|endoftext|>"};
    lm_tokenizer_train_input only_special = buffer("<|endoftext|><|endoftext|>");
    o = opts(300, eot, 1);
    expect_error(&only_special, 1, &o, LM_INVALID_ARGUMENT, "empty");
    lm_tokenizer_train_input bad[2] = {buffer("fine"), buffer("ok \xC3\x28 bad")};
    o = opts(300, NULL, 0);
    expect_error(bad, 2, &o, LM_INVALID_ARGUMENT, "byte offset 3");
    expect_error(bad, 2, &o, LM_INVALID_ARGUMENT, "input 1");
    o.pretokenizer = "bert";
    expect_error(&text, 1, &o, LM_INVALID_ARGUMENT, "'bert'");
    const char *dup[] = {"<a>", "<a>"};
    o = opts(300, dup, 2);
    expect_error(&text, 1, &o, LM_INVALID_ARGUMENT, "twice");
    const char *blank[] = {""};
    o = opts(300, blank, 1);
    expect_error(&text, 1, &o, LM_INVALID_ARGUMENT, "empty");
    const char *byte_sym[] = {"a"};
    o = opts(300, byte_sym, 1);
    expect_error(&text, 1, &o, LM_INVALID_ARGUMENT, "byte-level symbol");
    o = opts(300, NULL, 0);
    LT_CHECK_STATUS(lm_tokenizer_train_write(&text, 1, &o, "/nonexistent/dir/tokenizer.json", NULL), LM_IO_ERROR);
    LT_CHECK(strstr(lm_last_error(), "/nonexistent/dir/tokenizer.json") != NULL);
    char *json = NULL;
    size_t len = 0;
    LT_CHECK_STATUS(lm_tokenizer_train(&text, 1, NULL, &json, &len, NULL), LM_INVALID_ARGUMENT);
}

static void test_allocation_failures_leak_nothing(void) {
    lm_tokenizer_train_input in = buffer("the loom, the weaver; the loom's thread \xE4\xBD\xA0\xE5\xA5\xBD!\n\nthe");
    const char *specials[] = {"<s>"};
    int reached_end = 0;
    for (int64_t k = 1; k < 5000 && !reached_end; k++) {
        lm_tokenizer_train_options o = opts(290, specials, 1);
        lt_alloc_track(k);
        char *json = NULL;
        size_t len = 0;
        lm_status s = lm_tokenizer_train(&in, 1, &o, &json, &len, NULL);
        lm_free(json);
        LT_CHECK_MSG(s == LM_OK || s == LM_OUT_OF_MEMORY, "fail_at %lld: %s (%s)", (long long)k, lm_status_name(s),
                     lm_last_error());
        LT_CHECK_MSG(lt_alloc_live() == 0, "fail_at %lld leaks %lld allocations", (long long)k,
                     (long long)lt_alloc_live());
        reached_end = lt_alloc_count() < k;
        lt_alloc_untrack();
    }
    LT_CHECK(reached_end);
}

int main(void) {
    LT_RUN(test_trained_file_loads_and_round_trips);
    LT_RUN(test_multilingual_corpus_round_trips);
    LT_RUN(test_training_is_deterministic_across_runs_and_threads);
    LT_RUN(test_chunked_counting_equals_whole_text);
    LT_RUN(test_tiny_corpus_merges_match_hand_computation);
    LT_RUN(test_incremental_merges_equal_naive_recount);
    LT_RUN(test_vocab_size_and_special_tokens);
    LT_RUN(test_presets_match_real_files);
    LT_RUN(test_progress_reports_stages);
    LT_RUN(test_errors_name_the_problem);
    LT_RUN(test_allocation_failures_leak_nothing);
    return lt_finish();
}
