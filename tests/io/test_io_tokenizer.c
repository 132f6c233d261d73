/* Tests for the tokenizer.json BPE tokenizer. A tiny hand-written tokenizer.json
 * exercises every component deterministically (merge order, ignore_merges, splits
 * and their behaviors, Digits, ByteLevel, NFC, added-token matching and flags,
 * decode and streaming, errors, allocation failures, concurrent encodes). Then the
 * real Qwen3 / Llama 3 / DeepSeek V3 files must reproduce the Hugging Face
 * tokenizers 0.23.2 ids and decoded text of every corpus line; when those files are
 * absent (CI fetches them with scripts/fetch_tokenizers.sh) the test is skipped.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include "io/tokenizer_internal.h" /* the pre-tokenizer's batch size, varied below */
#include "loom/tokenizer.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- the tiny tokenizer -----------------------------------------------------------------
 * Byte-level forms: U+0120 'Ġ' = ' ', U+00C3 U+00A9 = bytes of 'é', U+00CC U+0123 = bytes
 * of U+0301, U+00F0 U+0141 U+013A U+0122 = bytes of U+1F600, U+00E1 U+0142 U+0130 = bytes
 * of U+180E. */
static const char k_vocab[] =
    "\"a\":0,\"b\":1,\"c\":2,\"d\":3,\"\\u0120\":4,\"1\":5,\"2\":6,\"3\":7,\"ab\":8,\"bc\":9,\"abc\":10,"
    "\"\\u0120a\":11,\"\\u0120ab\":12,\"cd\":13,\"<\":14,\">\":15,\"x\":16,\"\\u00c3\":17,\"\\u00a9\":18,"
    "\"\\u00c3\\u00a9\":19,\"e\":20,\"\\u00cc\":21,\"\\u00f0\":22,\"\\u0141\":23,\"\\u013a\":24,\"\\u0122\":25,"
    "\"\\u00f0\\u0141\":26,\"\\u013a\\u0122\":27,\"aa\":31,\"ca\":32,\"12\":33,\"123\":34,\"-\":35,\"a-\":36,"
    "\"b-\":37,\"-b\":38,\"-c\":39,\"--\":40,\"z\":44,\"\\u0123\":45,\"y\":46,\"\\u00e1\":47,\"\\u0142\":48,"
    "\"\\u0130\":49,\"\\u0120\\u00e1\":50";
static const char k_merges[] =
    "\"\\u0120 a\",\"\\u0120a b\",\"a b\",\"b c\",\"ab c\",\"a a\",\"1 2\",\"12 3\",\"\\u00c3 \\u00a9\","
    "\"\\u00f0 \\u0141\",\"\\u013a \\u0122\",\"c d\",\"\\u0120 \\u00e1\"";
static const char k_added[] =
    "{\"id\":28,\"content\":\"<x>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"
    "\"special\":true},"
    "{\"id\":29,\"content\":\"<xy>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"
    "\"special\":false},"
    "{\"id\":30,\"content\":\"\\u00e9\",\"normalized\":true,\"special\":false},"
    "{\"id\":41,\"content\":\"<l>\",\"lstrip\":true,\"normalized\":false,\"special\":false},"
    "{\"id\":42,\"content\":\"<r>\",\"rstrip\":true,\"normalized\":false,\"special\":false},"
    "{\"id\":43,\"content\":\"zz\",\"single_word\":true,\"normalized\":false,\"special\":false}";
static const char k_byte_level[] = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}";

/* A tokenizer.json from parts; model_extra is spliced into "model" (e.g. "\"ignore_merges\":true,"). */
static char *tiny_json(const char *normalizer, const char *pre, const char *model_extra, const char *vocab,
                       const char *merges, const char *added, const char *decoder) {
    static char buf[16384];
    snprintf(buf, sizeof buf,
             "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[%s],\"normalizer\":%s,"
             "\"pre_tokenizer\":%s,\"post_processor\":null,\"decoder\":%s,\"model\":{\"type\":\"BPE\",\"dropout\":null,"
             "\"unk_token\":null,%s\"vocab\":{%s},\"merges\":[%s]}}",
             added, normalizer, pre, decoder, model_extra, vocab, merges);
    return buf;
}

static lm_status load_tiny(const char *normalizer, const char *pre, const char *model_extra, const char *merges,
                           const char *added, lm_tokenizer **tok) {
    const char *j = tiny_json(normalizer, pre, model_extra, k_vocab, merges, added, "{\"type\":\"ByteLevel\"}");
    return lm_tokenizer_load_json(j, strlen(j), tok);
}

/* Encodes text and checks the ids equal want[0..n). */
static void check_ids(lm_tokenizer *tok, const char *text, const int32_t *want, size_t n) {
    int32_t *ids = NULL;
    size_t got = 0;
    LT_CHECK_OK(lm_tokenizer_encode(tok, text, strlen(text), &ids, &got));
    int same = got == n && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    if (!same) {
        char msg[512];
        size_t o = 0;
        for (size_t i = 0; i < got && o < 400; i++) o += (size_t)snprintf(msg + o, sizeof msg - o, " %d", ids[i]);
        msg[o] = '\0';
        lt_fail(__FILE__, __LINE__, "encode('%s') gave [%s ] (%zu ids, want %zu)", text, msg, got, n);
    }
    lm_free(ids);
}
#define CHECK_IDS(tok, text, ...)                                           \
    do {                                                                    \
        const int32_t want_[] = {__VA_ARGS__};                              \
        check_ids(tok, text, want_, sizeof want_ / sizeof want_[0]);        \
    } while (0)

static void test_bpe_applies_lowest_rank_first_then_leftmost(void) {
    static const struct {
        const char *merges, *text;
        int32_t want[3];
        size_t n;
    } cases[] = {
        {"\"b c\",\"a b\"", "abc", {0, 9}, 2},                 /* bc (rank 0) blocks ab */
        {"\"a b\",\"b c\"", "abc", {8, 2}, 2},                 /* ab (rank 0) blocks bc */
        {"\"b c\",\"a b\",\"a bc\"", "abc", {10}, 1},          /* b+c, then a+bc */
        {"[\"a\",\"b\"],[\"ab\",\"c\"]", "abc", {10}, 1},       /* pair form of merges */
        {"\"a a\"", "aaa", {31, 0}, 2},                        /* equal ranks: leftmost first */
        {"", "abc", {0, 1, 2}, 3},                             /* no merges: one id per byte */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lm_tokenizer *tok = NULL;
        LT_CHECK_OK(load_tiny("null", k_byte_level, "", cases[i].merges, "", &tok));
        if (tok) check_ids(tok, cases[i].text, cases[i].want, cases[i].n);
        lm_tokenizer_destroy(tok);
    }
}

static void test_ignore_merges_emits_vocabulary_words_whole(void) {
    lm_tokenizer *plain = NULL, *ignoring = NULL;
    LT_CHECK_OK(load_tiny("null", k_byte_level, "", k_merges, "", &plain));
    LT_CHECK_OK(load_tiny("null", k_byte_level, "\"ignore_merges\":true,", k_merges, "", &ignoring));
    if (!plain || !ignoring) goto done;
    CHECK_IDS(plain, "ca", 2, 0); /* no merge "c a" exists */
    CHECK_IDS(ignoring, "ca", 32);
    CHECK_IDS(ignoring, "abc", 10);
done:
    lm_tokenizer_destroy(plain);
    lm_tokenizer_destroy(ignoring);
}

static void test_byte_level_regex_and_prefix_space(void) {
    lm_tokenizer *tok = NULL;
    LT_CHECK_OK(load_tiny("null", k_byte_level, "", k_merges, "", &tok));
    if (tok) {
        CHECK_IDS(tok, "ab  ab", 8, 4, 12); /* GPT-2 regex: "ab", " ", " ab" */
        CHECK_IDS(tok, " ab", 12);
        /* U+180E is not \s for Oniguruma (it is for plain PCRE2): " U+180E" stays one piece */
        CHECK_IDS(tok, "a \xE1\xA0\x8E" "b", 0, 50, 48, 49, 1);
        check_ids(tok, "", NULL, 0);
    }
    lm_tokenizer_destroy(tok);
    /* Split first, then ByteLevel prepends a space to every piece lacking one. */
    const char *pre = "{\"type\":\"Sequence\",\"pretokenizers\":["
                      "{\"type\":\"Split\",\"pattern\":{\"Regex\":\" ?[a-z]+\"},"
                      "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":true,"
                      "\"use_regex\":false}]}";
    LT_CHECK_OK(load_tiny("null", pre, "", k_merges, "", &tok));
    if (tok) CHECK_IDS(tok, "ab ab", 12, 12);
    lm_tokenizer_destroy(tok);
}

static void test_split_behaviors_match_hugging_face(void) {
    static const struct {
        const char *behavior;
        int invert;
        int32_t want[6];
        size_t n;
    } cases[] = {
        {"Isolated", 0, {0, 35, 1, 35, 35, 2}, 6},  {"Removed", 0, {0, 1, 2}, 3},
        {"MergedWithPrevious", 0, {36, 37, 35, 2}, 4}, {"MergedWithNext", 0, {0, 38, 35, 39}, 4},
        {"Contiguous", 0, {0, 35, 1, 40, 2}, 5},    {"Removed", 1, {35, 35, 35}, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char pre[256];
        snprintf(pre, sizeof pre,
                 "{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"%s\",\"invert\":%s}",
                 cases[i].behavior, cases[i].invert ? "true" : "false");
        lm_tokenizer *tok = NULL;
        LT_CHECK_OK(load_tiny("null", pre, "\"ignore_merges\":true,", "", "", &tok));
        if (tok) check_ids(tok, "a-b--c", cases[i].want, cases[i].n);
        lm_tokenizer_destroy(tok);
    }
}

static void test_digits_pre_tokenizer(void) {
    lm_tokenizer *tok = NULL;
    const char *seq = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":%s},"
                      "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}";
    char pre[256];
    snprintf(pre, sizeof pre, seq, "true");
    LT_CHECK_OK(load_tiny("null", pre, "", k_merges, "", &tok));
    if (tok) CHECK_IDS(tok, "a123", 0, 5, 6, 7);
    lm_tokenizer_destroy(tok);
    snprintf(pre, sizeof pre, seq, "false");
    LT_CHECK_OK(load_tiny("null", pre, "", k_merges, "", &tok));
    if (tok) CHECK_IDS(tok, "a123", 0, 34);
    lm_tokenizer_destroy(tok);
}

static void test_added_tokens_longest_match_and_flags(void) {
    lm_tokenizer *tok = NULL;
    LT_CHECK_OK(load_tiny("null", k_byte_level, "", k_merges, k_added, &tok));
    if (!tok) return;
    CHECK_IDS(tok, "a<xy>b<x>c<x", 0, 29, 1, 28, 2, 14, 16);
    CHECK_IDS(tok, "<x><x>", 28, 28);
    CHECK_IDS(tok, "a <l> b<r>  c", 0, 41, 4, 1, 42, 2); /* lstrip eats " ", rstrip eats "  " */
    CHECK_IDS(tok, "zz zzz", 43, 4, 44, 44, 44);          /* single_word rejects "zz" inside "zzz" */
    LT_CHECK(lm_tokenizer_is_special(tok, 28) && !lm_tokenizer_is_special(tok, 29));
    LT_CHECK(!lm_tokenizer_is_special(tok, 0) && !lm_tokenizer_is_special(tok, -1));
    LT_CHECK(!lm_tokenizer_is_special(tok, 1000) && !lm_tokenizer_is_special(NULL, 28));
    LT_CHECK(lm_tokenizer_vocab_size(tok) == 51);
    int32_t id = -1;
    LT_CHECK_OK(lm_tokenizer_token_to_id(tok, "<xy>", 4, &id));
    LT_CHECK(id == 29);
    LT_CHECK_OK(lm_tokenizer_token_to_id(tok, "\xC4\xA0" "ab", 4, &id)); /* "Ġab" */
    LT_CHECK(id == 12);
    LT_CHECK_STATUS(lm_tokenizer_token_to_id(tok, "nope", 4, &id), LM_NOT_FOUND);
    const char *s = NULL;
    size_t n = 0;
    LT_CHECK_OK(lm_tokenizer_id_to_token(tok, 12, &s, &n));
    LT_CHECK(n == 4 && strcmp(s, "\xC4\xA0" "ab") == 0);
    LT_CHECK_OK(lm_tokenizer_id_to_bytes(tok, 12, &s, &n));
    LT_CHECK(n == 3 && memcmp(s, " ab", 3) == 0);
    LT_CHECK_OK(lm_tokenizer_id_to_token(tok, 28, &s, &n));
    LT_CHECK(n == 3 && strcmp(s, "<x>") == 0);
    LT_CHECK_STATUS(lm_tokenizer_id_to_token(tok, 51, &s, &n), LM_OUT_OF_RANGE);
    LT_CHECK_STATUS(lm_tokenizer_id_to_token(tok, 33 + 100, &s, &n), LM_OUT_OF_RANGE);
    /* skip-special decode drops "<x>" but keeps the non-special "<xy>" */
    const int32_t ids[] = {0, 28, 29, 1};
    char *text = NULL;
    size_t len = 0;
    LT_CHECK_OK(lm_tokenizer_decode(tok, ids, 4, LM_TOKENIZER_SKIP_SPECIAL, &text, &len));
    LT_CHECK(text && len == 6 && strcmp(text, "a<xy>b") == 0);
    lm_free(text);
    lm_tokenizer_destroy(tok);
}

static void test_nfc_and_normalized_added_tokens(void) {
    lm_tokenizer *nfc = NULL, *raw = NULL, *seq = NULL;
    LT_CHECK_OK(load_tiny("{\"type\":\"NFC\"}", k_byte_level, "", k_merges, k_added, &nfc));
    LT_CHECK_OK(load_tiny("null", k_byte_level, "", k_merges, k_added, &raw));
    const char *nfc_seq = "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"}]}";
    LT_CHECK_OK(load_tiny(nfc_seq, k_byte_level, "", k_merges, "", &seq));
    if (!nfc || !raw || !seq) goto done;
    CHECK_IDS(nfc, "e\xCC\x81", 30);         /* e + U+0301 composes to the normalized added token */
    CHECK_IDS(raw, "e\xCC\x81", 20, 21, 45); /* without NFC the bytes go through BPE */
    CHECK_IDS(seq, "e\xCC\x81", 19);         /* composed, then merged by BPE */
    CHECK_IDS(seq, "\xC3\xA9", 19);
done:
    lm_tokenizer_destroy(nfc), lm_tokenizer_destroy(raw), lm_tokenizer_destroy(seq);
}

static void test_decode_and_stream_hold_back_partial_characters(void) {
    lm_tokenizer *tok = NULL;
    LT_CHECK_OK(load_tiny("null", k_byte_level, "", k_merges, k_added, &tok));
    if (!tok) return;
    CHECK_IDS(tok, "\xF0\x9F\x98\x80", 26, 27); /* U+1F600 splits into two tokens of two bytes */
    char *text = NULL;
    size_t len = 0;
    const int32_t half[] = {26}, bad[] = {25, 0}, bogus[] = {0, 51};
    LT_CHECK_OK(lm_tokenizer_decode(tok, half, 1, 0, &text, &len));
    LT_CHECK(len == 2 && memcmp(text, "\xF0\x9F", 2) == 0 && text[2] == '\0');
    lm_free(text);
    LT_CHECK_OK(lm_tokenizer_decode(tok, half, 1, LM_TOKENIZER_LOSSY, &text, &len));
    LT_CHECK(len == 3 && strcmp(text, "\xEF\xBF\xBD") == 0);
    lm_free(text);
    LT_CHECK_OK(lm_tokenizer_decode(tok, bad, 2, LM_TOKENIZER_LOSSY, &text, &len)); /* lone 0x80, then 'a' */
    LT_CHECK(len == 4 && strcmp(text, "\xEF\xBF\xBD" "a") == 0);
    lm_free(text);
    LT_CHECK_STATUS(lm_tokenizer_decode(tok, bogus, 2, 0, &text, &len), LM_OUT_OF_RANGE);
    LT_CHECK(text == NULL);

    lm_tokenizer_stream *st = NULL;
    LT_CHECK_OK(lm_tokenizer_stream_create(tok, 0, &st));
    const char *out = NULL;
    size_t n = 99;
    LT_CHECK_OK(lm_tokenizer_stream_push(st, 0, &out, &n));
    LT_CHECK(n == 1 && out[0] == 'a');
    LT_CHECK_OK(lm_tokenizer_stream_push(st, 26, &out, &n));
    LT_CHECK(n == 0); /* the emoji is incomplete: nothing yet */
    LT_CHECK_STATUS(lm_tokenizer_stream_push(st, -3, &out, &n), LM_OUT_OF_RANGE);
    LT_CHECK_OK(lm_tokenizer_stream_push(st, 27, &out, &n));
    LT_CHECK(n == 4 && memcmp(out, "\xF0\x9F\x98\x80", 4) == 0);
    LT_CHECK_OK(lm_tokenizer_stream_push(st, 26, &out, &n));
    LT_CHECK(n == 0);
    LT_CHECK_OK(lm_tokenizer_stream_flush(st, &out, &n)); /* a cut character ends as U+FFFD */
    LT_CHECK(n == 3 && memcmp(out, "\xEF\xBF\xBD", 3) == 0);
    LT_CHECK_OK(lm_tokenizer_stream_push(st, 22, &out, &n)); /* 0xF0 then 'a': invalid, emitted at once */
    LT_CHECK(n == 0);
    LT_CHECK_OK(lm_tokenizer_stream_push(st, 0, &out, &n));
    LT_CHECK(n == 4 && memcmp(out, "\xEF\xBF\xBD" "a", 4) == 0);
    lm_tokenizer_stream_destroy(st);
    LT_CHECK_OK(lm_tokenizer_stream_create(tok, LM_TOKENIZER_SKIP_SPECIAL, &st));
    LT_CHECK_OK(lm_tokenizer_stream_push(st, 28, &out, &n));
    LT_CHECK(n == 0);
    lm_tokenizer_stream_destroy(st);
    lm_tokenizer_stream_destroy(NULL);
    lm_tokenizer_destroy(tok);
}

static void test_invalid_utf8_input_is_rejected_with_offset(void) {
    lm_tokenizer *tok = NULL;
    LT_CHECK_OK(load_tiny("{\"type\":\"NFC\"}", k_byte_level, "", k_merges, k_added, &tok));
    if (!tok) return;
    static const char *bad[] = {"ab\x80", "ab\xE2\x82", "ab\xC0\xAF", "ab\xED\xA0\x80", "ab\xFF", "ab\xF4\x90\x80\x80"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        LT_CHECK_STATUS(lm_tokenizer_encode(tok, bad[i], strlen(bad[i]), &ids, &n), LM_INVALID_ARGUMENT);
        LT_CHECK_MSG(strstr(lm_last_error(), "byte offset 2") != NULL, "case %zu: detail '%s'", i, lm_last_error());
        LT_CHECK(ids == NULL && n == 0);
    }
    int32_t buf[4];
    size_t n = 0;
    /* "abc abc ab" -> abc | Gab c | Gab (G = the byte-level space) */
    LT_CHECK_STATUS(lm_tokenizer_encode_out(tok, "abc abc ab", 10, buf, 2, &n), LM_OUT_OF_RANGE);
    LT_CHECK(n == 4 && buf[0] == 10 && buf[1] == 12);
    LT_CHECK_OK(lm_tokenizer_encode_out(tok, "abc abc ab", 10, buf, 4, &n));
    LT_CHECK(n == 4 && buf[2] == 2 && buf[3] == 12);
    LT_CHECK_STATUS(lm_tokenizer_encode(tok, "q", 1, &(int32_t *){NULL}, &n), LM_NOT_FOUND); /* 'q' not in vocab */
    lm_tokenizer_destroy(tok);
}

static void expect_load_error(const char *json, lm_status want, const char *detail) {
    lm_tokenizer *tok = NULL;
    LT_CHECK_STATUS(lm_tokenizer_load_json(json, strlen(json), &tok), want);
    LT_CHECK(tok == NULL);
    LT_CHECK_MSG(strstr(lm_last_error(), detail) != NULL, "detail '%s' lacks '%s'", lm_last_error(), detail);
    lm_tokenizer_destroy(tok);
}

static void test_malformed_tokenizer_json_gives_specific_errors(void) {
    const char *bl = "{\"type\":\"ByteLevel\"}";
    expect_load_error("{\"added_tokens\":[],\"decoder\":{\"type\":\"ByteLevel\"}}", LM_PARSE_ERROR,
                      "missing \"model\"");
    expect_load_error("{\"model\":", LM_PARSE_ERROR, "line 1");
    expect_load_error(tiny_json("null", "{\"type\":\"Whitespace\"}", "", k_vocab, "", "", bl), LM_UNSUPPORTED,
                      "'Whitespace'");
    expect_load_error(tiny_json("{\"type\":\"Lowercase\"}", k_byte_level, "", k_vocab, "", "", bl), LM_UNSUPPORTED,
                      "'Lowercase'");
    expect_load_error(tiny_json("null", k_byte_level, "", k_vocab, "", "", "{\"type\":\"WordPiece\"}"), LM_UNSUPPORTED,
                      "'WordPiece'");
    expect_load_error(tiny_json("null", k_byte_level, "", k_vocab, "", "", "null"), LM_UNSUPPORTED, "decoder");
    expect_load_error(tiny_json("null", k_byte_level, "\"byte_fallback\":true,", k_vocab, "", "", bl), LM_UNSUPPORTED,
                      "byte_fallback");
    expect_load_error(tiny_json("null", k_byte_level, "", k_vocab, "\"a b\",\"abc\"", "", bl), LM_PARSE_ERROR,
                      "merges[1]");
    expect_load_error(tiny_json("null", k_byte_level, "", k_vocab, "[\"a\"]", "", bl), LM_PARSE_ERROR, "merges[0]");
    expect_load_error(tiny_json("null", k_byte_level, "", k_vocab, "\"a q\"", "", bl), LM_PARSE_ERROR, "'q'");
    expect_load_error(tiny_json("null", k_byte_level, "", k_vocab, "\"d a\"", "", bl), LM_PARSE_ERROR, "'da'");
    expect_load_error(tiny_json("null", k_byte_level, "", "\"a\":0,\"b\":0", "", "", bl), LM_PARSE_ERROR, "id 0");
    expect_load_error(tiny_json("null", k_byte_level, "", "\"a\":-1", "", "", bl), LM_PARSE_ERROR, "vocab['a']");
    expect_load_error(tiny_json("null",
                                "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(ab\"},\"behavior\":\"Isolated\","
                                "\"invert\":false}",
                                "", k_vocab, "", "", bl),
                      LM_PARSE_ERROR, "does not compile");
    expect_load_error(tiny_json("null",
                                "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Sideways\","
                                "\"invert\":false}",
                                "", k_vocab, "", "", bl),
                      LM_PARSE_ERROR, "'Sideways'");
    expect_load_error(tiny_json("null",
                                "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"ByteLevel\"},{\"type\":"
                                "\"Digits\",\"individual_digits\":true}]}",
                                "", k_vocab, "", "", bl),
                      LM_UNSUPPORTED, "ByteLevel must come last");
    const char *wp = "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}},\"decoder\":{\"type\":\"ByteLevel\"}}";
    expect_load_error(wp, LM_UNSUPPORTED, "'WordPiece'");
    lm_tokenizer *tok = NULL;
    LT_CHECK_STATUS(lm_tokenizer_load("/nonexistent/tokenizer.json", &tok), LM_IO_ERROR);
    LT_CHECK_STATUS(lm_tokenizer_load_json(NULL, 5, &tok), LM_INVALID_ARGUMENT);
    lm_tokenizer_destroy(NULL);
}

static void test_allocation_failures_leak_nothing(void) {
    const char *text = "a<xy>b ab  ab \xC3\xA9 123 \xF0\x9F\x98\x80"; /* NFC-stable */
    int reached_end = 0;
    for (int64_t k = 1; k < 2000 && !reached_end; k++) {
        lt_alloc_track(k);
        lm_tokenizer *tok = NULL;
        lm_status s = load_tiny("{\"type\":\"NFC\"}", k_byte_level, "", k_merges, k_added, &tok);
        if (s == LM_OK) {
            int32_t *ids = NULL;
            size_t n = 0;
            s = lm_tokenizer_encode(tok, text, strlen(text), &ids, &n);
            char *back = NULL;
            size_t len = 0;
            if (s == LM_OK) s = lm_tokenizer_decode(tok, ids, n, 0, &back, &len);
            if (s == LM_OK) LT_CHECK(len == strlen(text) && memcmp(back, text, len) == 0);
            lm_free(back);
            lm_free(ids);
            lm_tokenizer_destroy(tok);
        }
        LT_CHECK_MSG(s == LM_OK || s == LM_OUT_OF_MEMORY, "fail_at %lld: %s", (long long)k, lm_status_name(s));
        LT_CHECK_MSG(lt_alloc_live() == 0, "fail_at %lld leaks %lld allocations", (long long)k,
                     (long long)lt_alloc_live());
        reached_end = lt_alloc_count() < k; /* the injected failure was never reached */
        lt_alloc_untrack();
    }
    LT_CHECK(reached_end);
}

typedef struct thread_job {
    lm_tokenizer *tok;
    const int32_t *want; /* [n_want] the single-threaded result */
    size_t n_want;
    int failures;
} thread_job;

static const char k_thread_text[] = "ab  ab abc <x> e\xCC\x81 \xF0\x9F\x98\x80 a123";

static void *encode_many(void *arg) {
    thread_job *job = arg;
    for (int i = 0; i < 300; i++) {
        int32_t ids[64];
        size_t n = 0;
        if (lm_tokenizer_encode_out(job->tok, k_thread_text, strlen(k_thread_text), ids, 64, &n) != LM_OK ||
            n != job->n_want || memcmp(ids, job->want, n * sizeof *ids) != 0)
            job->failures++;
    }
    return NULL;
}

/* Encodes from 4 threads at once (one uses the shared cached state, the others
 * temporary states) and checks every result equals the single-threaded one. */
static void test_concurrent_encodes_agree(void) {
    lm_tokenizer *tok = NULL;
    LT_CHECK_OK(load_tiny("{\"type\":\"NFC\"}", k_byte_level, "", k_merges, k_added, &tok));
    if (!tok) return;
    CHECK_IDS(tok, k_thread_text, 8, 4, 12, 12, 2, 4, 28, 4, 30, 4, 26, 27, 11, 34);
    int32_t *want = NULL;
    size_t n_want = 0;
    LT_CHECK_OK(lm_tokenizer_encode(tok, k_thread_text, strlen(k_thread_text), &want, &n_want));
    thread_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){tok, want, n_want, 0};
        LT_CHECK(pthread_create(&th[i], NULL, encode_many, &jobs[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        LT_CHECK_MSG(jobs[i].failures == 0, "thread %d: %d wrong encodes", i, jobs[i].failures);
    }
    lm_free(want);
    lm_tokenizer_destroy(tok);
}

/* ---- long texts: the streamed encode equals the whole-text one -------------------------------- */

/* A single line of n bytes (no newline) from pieces the tiny tokenizer knows: letters,
 * spaces, digits, '-', added tokens, a decomposed and a precomposed 'é', an emoji, and
 * long runs of one kind (chains of events that the split behaviors join). */
static char *long_line(uint64_t seed, size_t n) {
    static const char *parts[] = {"a", "b", "c", "d", "ab", "abc", " ", "  ", " ab", "1", "12", "123", "-", "--",
                                  "a-", "-b", "<x>", "<xy>", "<l>", " <r> ", "zz", " zz ", "e\xCC\x81", "\xC3\xA9",
                                  "\xF0\x9F\x98\x80", "x", "y", "<", ">"};
    lt_rng r = lt_rng_seed(seed);
    char *s = malloc(n + 64);
    size_t len = 0;
    while (s && len < n) {
        const char *p = parts[lt_rng_int(&r, 0, sizeof parts / sizeof parts[0] - 1)];
        size_t reps = lt_rng_int(&r, 0, 15) == 0 ? (size_t)lt_rng_int(&r, 50, 3000) : 1; /* a long run */
        for (size_t k = 0; k < reps && len < n; k++) {
            size_t m = strlen(p);
            if (len + m > n) break;
            memcpy(s + len, p, m);
            len += m;
        }
        if (len + 4 > n) break; /* never cut a character: stop short of the end */
    }
    if (s) s[len] = '\0';
    return s;
}

/* The ids of text with the pre-tokenizer's split steps folding `batch` events at a time
 * (SIZE_MAX: all events of a piece at once, i.e. the whole text in one pass). */
static int32_t *encode_batched(lm_tokenizer *tok, const char *text, size_t batch, size_t *n) {
    tok->state->batch_events = batch;
    int32_t *ids = NULL;
    LT_CHECK_OK(lm_tokenizer_encode(tok, text, strlen(text), &ids, n));
    tok->state->batch_events = LM__TOK_BATCH_EVENTS;
    return ids;
}

/* Every split behavior (and inverted), Digits, ByteLevel with and without the prefix
 * space and a Sequence of them, with NFC, ignore_merges and added tokens: a long single
 * line encodes to the same ids whole and streamed in batches of 1, 2, 7 and the
 * default number of events. */
static void test_streamed_encode_equals_whole_text(void) {
    static const char *behaviors[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    char pre[24][512];
    int np = 0;
    for (int b = 0; b < 5; b++)
        for (int inv = 0; inv < 2; inv++)
            snprintf(pre[np++], sizeof pre[0],
                     "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
                     "\"-|[0-9]+|a+\"},\"behavior\":\"%s\",\"invert\":%s},{\"type\":\"ByteLevel\","
                     "\"add_prefix_space\":%s,\"use_regex\":%s}]}",
                     behaviors[b], inv ? "true" : "false", b % 2 ? "true" : "false", inv ? "true" : "false");
    snprintf(pre[np++], sizeof pre[0], "%s", k_byte_level);
    snprintf(pre[np++], sizeof pre[0], "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}");
    snprintf(pre[np++], sizeof pre[0],
             "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":false},"
             "{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"MergedWithNext\",\"invert\":false},"
             "{\"type\":\"Digits\",\"individual_digits\":true},{\"type\":\"ByteLevel\",\"add_prefix_space\":true,"
             "\"use_regex\":true}]}");
    char *text = long_line(42, 200000);
    for (int i = 0; text && i < np; i++) {
        lm_tokenizer *tok = NULL;
        /* ignore_merges makes a joined piece such as "--" one id, so a wrong join shows */
        LT_CHECK_OK(load_tiny(i % 2 ? "{\"type\":\"NFC\"}" : "null", pre[i], i % 4 < 2 ? "\"ignore_merges\":true," : "",
                              k_merges, k_added, &tok));
        if (!tok) continue;
        size_t nw = 0;
        int32_t *whole = encode_batched(tok, text, SIZE_MAX, &nw);
        LT_CHECK_MSG(nw > 16384, "pre-tokenizer %d: %zu ids (want several flushes of ids)", i, nw);
        static const size_t batches[] = {1, 2, 7, LM__TOK_BATCH_EVENTS};
        for (size_t b = 0; whole && b < sizeof batches / sizeof batches[0]; b++) {
            size_t n = 0;
            int32_t *ids = encode_batched(tok, text, batches[b], &n);
            size_t at = 0;
            while (ids && at < n && at < nw && ids[at] == whole[at]) at++;
            LT_CHECK_MSG(ids && n == nw && at == n, "pre-tokenizer %d, batches of %zu: %zu ids vs %zu whole, first "
                         "difference at id %zu", i, batches[b], n, nw, at);
            lm_free(ids);
        }
        /* encode_out streams into the caller's buffer: the same ids, and the count when short */
        int32_t *buf = whole ? malloc(nw * sizeof *buf) : NULL;
        size_t n = 0;
        if (buf) {
            LT_CHECK_OK(lm_tokenizer_encode_out(tok, text, strlen(text), buf, nw, &n));
            LT_CHECK(n == nw && memcmp(buf, whole, nw * sizeof *buf) == 0);
            LT_CHECK_STATUS(lm_tokenizer_encode_out(tok, text, strlen(text), buf, nw / 2, &n), LM_OUT_OF_RANGE);
            LT_CHECK(n == nw && memcmp(buf, whole, nw / 2 * sizeof *buf) == 0);
        }
        free(buf);
        lm_free(whole);
        lm_tokenizer_destroy(tok);
    }
    free(text);
}

/* ---- the real tokenizers against Hugging Face references ------------------------------------ */
static const char *k_real[] = {"qwen3", "llama3", "deepseek_v3"};

static int real_files_present(void) {
    for (int i = 0; i < 3; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/third_party/tokenizers/%s/tokenizer.json", LOOM_SOURCE_DIR, k_real[i]);
        FILE *f = fopen(path, "rb");
        if (!f) return 0;
        fclose(f);
    }
    return 1;
}

/* Reads a .jsonl file into an array of JSON values (json_decref each, free the array). */
static json_t **read_jsonl(const char *rel, size_t *count) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", LOOM_SOURCE_DIR, rel);
    char *data = NULL;
    size_t size = 0;
    *count = 0;
    if (lm_file_read_all(path, &data, &size) != LM_OK) {
        lt_fail(__FILE__, __LINE__, "cannot read %s: %s", path, lm_last_error());
        return NULL;
    }
    json_t **out = calloc(size + 1, sizeof *out);
    for (char *line = data, *end; line < data + size; line = end + 1) {
        end = memchr(line, '\n', (size_t)(data + size - line));
        if (!end) end = data + size;
        json_error_t err;
        json_t *v = json_loadb(line, (size_t)(end - line), JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
        if (v) out[(*count)++] = v;
        else lt_fail(__FILE__, __LINE__, "%s line %zu: %s", rel, *count + 1, err.text);
    }
    lm_free(data);
    return out;
}

static void check_one_real(const char *name, json_t **corpus, size_t nc) {
    char rel[256], path[1024];
    snprintf(path, sizeof path, "%s/third_party/tokenizers/%s/tokenizer.json", LOOM_SOURCE_DIR, name);
    snprintf(rel, sizeof rel, "tests/data/tokenizer/%s.refs.jsonl", name);
    size_t nr = 0;
    json_t **refs = read_jsonl(rel, &nr);
    lm_tokenizer *tok = NULL;
    LT_CHECK_OK(lm_tokenizer_load(path, &tok));
    LT_CHECK_MSG(nr == nc, "%s: %zu refs for %zu corpus lines", name, nr, nc);
    int id_fail = 0, dec_fail = 0;
    for (size_t i = 0; tok && i < nc && i < nr; i++) {
        const char *text = json_string_value(corpus[i]);
        size_t len = json_string_length(corpus[i]);
        json_t *want = json_object_get(refs[i], "ids"), *decoded = json_object_get(refs[i], "decoded");
        int32_t *ids = NULL;
        size_t n = 0;
        LT_CHECK_OK(lm_tokenizer_encode(tok, text, len, &ids, &n));
        int same = n == json_array_size(want);
        for (size_t k = 0; same && k < n; k++) same = ids[k] == json_integer_value(json_array_get(want, k));
        if (!same && id_fail++ < 5)
            lt_fail(__FILE__, __LINE__, "%s line %zu: ids differ from Hugging Face", name, i + 1);
        /* exact bytes back wherever HF's decode reproduces the text (not when NFC changed it) */
        char *back = NULL, *lossy = NULL;
        size_t blen = 0, llen = 0;
        LT_CHECK_OK(lm_tokenizer_decode(tok, ids, n, 0, &back, &blen));
        LT_CHECK_OK(lm_tokenizer_decode(tok, ids, n, LM_TOKENIZER_LOSSY, &lossy, &llen));
        const char *hf = json_string_value(decoded);
        size_t hlen = json_string_length(decoded);
        int ok = lossy && llen == hlen && memcmp(lossy, hf, hlen) == 0;
        if (hlen == len && memcmp(hf, text, len) == 0) ok = ok && back && blen == len && memcmp(back, text, len) == 0;
        /* the stream, fed one id at a time, yields the same text */
        lm_tokenizer_stream *st = NULL;
        LT_CHECK_OK(lm_tokenizer_stream_create(tok, 0, &st));
        char *acc = malloc(hlen * 3 + 16);
        size_t alen = 0;
        for (size_t k = 0; st && k <= n; k++) {
            const char *piece = NULL;
            size_t plen = 0;
            lm_status s = k < n ? lm_tokenizer_stream_push(st, ids[k], &piece, &plen)
                                : lm_tokenizer_stream_flush(st, &piece, &plen);
            if (s != LM_OK || alen + plen > hlen * 3 + 16) {
                ok = 0;
                break;
            }
            memcpy(acc + alen, piece, plen);
            alen += plen;
        }
        ok = ok && alen == hlen && memcmp(acc, hf, hlen) == 0;
        if (!ok && dec_fail++ < 5)
            lt_fail(__FILE__, __LINE__, "%s line %zu: decode differs from Hugging Face", name, i + 1);
        free(acc);
        lm_tokenizer_stream_destroy(st);
        lm_free(back), lm_free(lossy), lm_free(ids);
    }
    LT_CHECK_MSG(id_fail == 0 && dec_fail == 0, "%s: %d id and %d decode mismatches", name, id_fail, dec_fail);
    if (tok) { /* long inputs stay linear: a 100k-letter word and a 60k-space run */
        size_t big = 100000;
        char *s = malloc(big + 64);
        memset(s, 'a', big);
        int32_t *ids = NULL;
        size_t n = 0;
        LT_CHECK_OK(lm_tokenizer_encode(tok, s, big, &ids, &n));
        LT_CHECK(n > 0 && n < big);
        lm_free(ids);
        memset(s, ' ', 60000);
        memcpy(s + 60000, "x\n", 2);
        LT_CHECK_OK(lm_tokenizer_encode(tok, s, 60002, &ids, &n));
        char *back = NULL;
        size_t blen = 0;
        LT_CHECK_OK(lm_tokenizer_decode(tok, ids, n, 0, &back, &blen));
        LT_CHECK(blen == 60002 && back && memcmp(back, s, blen) == 0);
        lm_free(back), lm_free(ids);
        free(s);
    }
    lm_tokenizer_destroy(tok);
    for (size_t i = 0; i < nr; i++) json_decref(refs[i]);
    free(refs);
}

static void test_real_tokenizers_match_hugging_face(void) {
    size_t nc = 0;
    json_t **corpus = read_jsonl("tests/data/tokenizer/corpus.jsonl", &nc);
    LT_CHECK(nc > 100);
    for (int i = 0; corpus && i < 3; i++) check_one_real(k_real[i], corpus, nc);
    for (size_t i = 0; i < nc; i++) json_decref(corpus[i]);
    free(corpus);
}

int main(void) {
    LT_RUN(test_bpe_applies_lowest_rank_first_then_leftmost);
    LT_RUN(test_ignore_merges_emits_vocabulary_words_whole);
    LT_RUN(test_byte_level_regex_and_prefix_space);
    LT_RUN(test_split_behaviors_match_hugging_face);
    LT_RUN(test_digits_pre_tokenizer);
    LT_RUN(test_added_tokens_longest_match_and_flags);
    LT_RUN(test_nfc_and_normalized_added_tokens);
    LT_RUN(test_decode_and_stream_hold_back_partial_characters);
    LT_RUN(test_invalid_utf8_input_is_rejected_with_offset);
    LT_RUN(test_malformed_tokenizer_json_gives_specific_errors);
    LT_RUN(test_allocation_failures_leak_nothing);
    LT_RUN(test_concurrent_encodes_agree);
    LT_RUN(test_streamed_encode_equals_whole_text);
    if (!real_files_present()) {
        if (lt_finish() != 0) return 1;
        lt_skip("third_party/tokenizers/{qwen3,llama3,deepseek_v3}/tokenizer.json absent: run "
                "scripts/fetch_tokenizers.sh to compare against Hugging Face");
    }
    LT_RUN(test_real_tokenizers_match_hugging_face);
    return lt_finish();
}
