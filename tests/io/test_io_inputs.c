/* Tests for inputs the io layer must refuse or bound, at the library level: files that
 * are not regular (a FIFO with no writer, a directory, a device) are refused at once,
 * named and said what they are, by every reader (whole-file reads, mappings,
 * tokenizer.json, config.json and generation_config.json, model.safetensors, token
 * shards, data prepare inputs); a SIGALRM watchdog turns a regression (a blocking
 * open) into a failure instead of a hang. Token shard and data loader positions near
 * INT64_MAX fail with messages and no overflow (run under UBSan too); a shard without
 * a recorded vocabulary says so instead of "outside [0, 0)"; data prepare streams a
 * long single line into the same ids as one encode.
 * LM_TEST_LABELS: unit
 */
#include "io_files.h"
#include "loom/config.h"
#include "loom/data.h"
#include "loom/safetensors.h"
#include "loom/tokenizer.h"

#include <signal.h>
#include <stdint.h>

#define TRAIN_TOKENIZER LOOM_SOURCE_DIR "/tests/data/train/tokenizer.json"
#define MODEL_CONFIG LOOM_SOURCE_DIR "/tests/data/models/llama_gqa2_f32/config.json"

static char *g_dir;

static int has(const char *needle) {
    if (strstr(lm_last_error(), needle)) return 1;
    fprintf(stderr, "  detail '%s' lacks '%s'\n", lm_last_error(), needle);
    return 0;
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_io_inputs: still running after 120 s: an open blocked (a FIFO opened before "
                              "its type was checked?)\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(1);
    _exit(1);
}

/* g_dir/name as a FIFO, a directory or a regular file with text. */
static const char *make(const char *name, char kind, const char *text) {
    static char buf[8][600];
    static int k;
    k = (k + 1) % 8;
    tw_path(buf[k], sizeof buf[k], g_dir, name);
    if (kind == 'p') LT_CHECK_MSG(mkfifo(buf[k], 0600) == 0, "mkfifo %s", buf[k]);
    else if (kind == 'd') LT_CHECK_MSG(mkdir(buf[k], 0700) == 0, "mkdir %s", buf[k]);
    else tw_write_text(buf[k], text);
    return buf[k];
}

/* Removes a model directory made by model_dir (files, FIFOs and one level of directories). */
static void remove_model_dir(const char *dir) {
    static const char *names[] = {"config.json", "generation_config.json", "model.safetensors",
                                  "model.safetensors.index.json", "shard.safetensors"};
    char p[700];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        tw_path(p, sizeof p, dir, names[i]);
        if (unlink(p) != 0) rmdir(p);
    }
    rmdir(dir);
}

static void test_non_regular_files_are_refused_at_once(void) {
    const char *fifo = make("fifo", 'p', NULL), *dir = make("dir", 'd', NULL);
    struct {
        const char *path, *kind;
    } cases[] = {{fifo, "is a FIFO"}, {dir, "is a directory"}, {"/dev/null", "is a character device"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = (char *)1;
        size_t n = 7;
        LT_CHECK_STATUS(lm_file_read_all(cases[i].path, &text, &n), LM_IO_ERROR);
        LT_CHECK(text == NULL && n == 0 && has(cases[i].path) && has(cases[i].kind));
        lm_file_map map;
        LT_CHECK_STATUS(lm_file_map_open(cases[i].path, &map), LM_IO_ERROR);
        LT_CHECK(map.data == NULL && has(cases[i].kind));
        lm_tokenizer *tok = NULL;
        LT_CHECK_STATUS(lm_tokenizer_load(cases[i].path, &tok), LM_IO_ERROR);
        LT_CHECK(tok == NULL && has(cases[i].kind));
        lm_token_shard *sh = NULL;
        LT_CHECK_STATUS(lm_token_shard_open(cases[i].path, &sh), LM_IO_ERROR);
        LT_CHECK(sh == NULL && has(cases[i].kind));
        lm_safetensors *st = NULL;
        LT_CHECK_STATUS(lm_safetensors_open(cases[i].path, &st), LM_IO_ERROR);
        LT_CHECK(st == NULL && has(cases[i].kind));
    }
    lm_tokenizer *tok = NULL;
    LT_CHECK_OK(lm_tokenizer_load(TRAIN_TOKENIZER, &tok));
    const char *inputs[2] = {TRAIN_TOKENIZER, fifo}, *out = make("out.bin", 'f', "");
    LT_CHECK_STATUS(lm_data_prepare(tok, 2, inputs, -1, out, NULL), LM_IO_ERROR);
    LT_CHECK(has(fifo) && has("is a FIFO"));
    lm_tokenizer_destroy(tok);
    unlink(fifo), rmdir(dir), unlink(out);
}

static void test_read_all_reads_regular_files_whole(void) {
    const char *empty = make("empty", 'f', "");
    char *text = NULL;
    size_t n = 7;
    LT_CHECK_OK(lm_file_read_all(empty, &text, &n));
    LT_CHECK(text && n == 0 && text[0] == '\0');
    lm_free(text);
    char big[10001];
    for (int i = 0; i < 10000; i++) big[i] = (char)('a' + i % 26);
    big[10000] = '\0';
    const char *p = make("big", 'f', big);
    LT_CHECK_OK(lm_file_read_all(p, &text, &n));
    LT_CHECK(text && n == 10000 && memcmp(text, big, 10000) == 0 && text[n] == '\0');
    lm_free(text);
    /* /proc files say size 0 and still have contents: the buffer grows as it reads */
    LT_CHECK_OK(lm_file_read_all("/proc/self/status", &text, &n));
    LT_CHECK(text && n > 0 && strstr(text, "Name:") != NULL && text[n] == '\0');
    lm_free(text);
    unlink(empty), unlink(p);
}

/* A model directory: config.json (a copy of a real one, or kind 'p'/'d'), and the entry
 * `name` of kind 'p' (FIFO) or 'd' (directory). */
static const char *model_dir(const char *sub, char config_kind, const char *name, char kind) {
    static char dir[600];
    tw_path(dir, sizeof dir, g_dir, sub);
    mkdir(dir, 0700);
    char p[700], *cfg = NULL;
    size_t n = 0;
    tw_path(p, sizeof p, dir, "config.json");
    if (config_kind == 'p') mkfifo(p, 0600);
    else if (lm_file_read_all(MODEL_CONFIG, &cfg, &n) == LM_OK) tw_write_text(p, cfg);
    lm_free(cfg);
    if (name) {
        tw_path(p, sizeof p, dir, name);
        if (kind == 'p') LT_CHECK(mkfifo(p, 0600) == 0);
        else LT_CHECK(mkdir(p, 0700) == 0);
    }
    return dir;
}

static void test_checkpoint_says_what_is_wrong_with_its_files(void) {
    static const struct {
        const char *name;
        char kind;
        const char *want;
    } cases[] = {{"model.safetensors", 'p', "model.safetensors' is a FIFO"},
                 {"model.safetensors", 'd', "model.safetensors' is a directory"},
                 {"model.safetensors.index.json", 'p', "model.safetensors.index.json' is a FIFO"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *dir = model_dir("ck", 'f', cases[i].name, cases[i].kind);
        lm_checkpoint *ck = NULL;
        LT_CHECK_STATUS(lm_checkpoint_open(dir, &ck), LM_IO_ERROR);
        LT_CHECK_MSG(ck == NULL && has(cases[i].want) && !strstr(lm_last_error(), "neither"), "case %zu", i);
        remove_model_dir(dir);
    }
    /* a shard the index names that is a directory: said so, not "does not exist" */
    const char *dir = model_dir("ck", 'f', "shard.safetensors", 'd');
    char p[700];
    tw_path(p, sizeof p, dir, "model.safetensors.index.json");
    tw_write_text(p, "{\"weight_map\": {\"model.a\": \"shard.safetensors\"}}");
    lm_checkpoint *ck = NULL;
    LT_CHECK_STATUS(lm_checkpoint_open(dir, &ck), LM_IO_ERROR);
    LT_CHECK(ck == NULL && has("shard.safetensors' is a directory"));
    remove_model_dir(dir);
    /* nothing there at all still reads as absent */
    dir = model_dir("ck", 'f', NULL, 0);
    LT_CHECK_STATUS(lm_checkpoint_open(dir, &ck), LM_NOT_FOUND);
    LT_CHECK(has("neither model.safetensors nor model.safetensors.index.json"));
    remove_model_dir(dir);
}

static void test_config_files_that_are_not_regular_are_refused(void) {
    lm_model_config cfg;
    const char *dir = model_dir("cfg", 'p', NULL, 0);
    LT_CHECK_STATUS(lm_model_config_load(dir, &cfg), LM_IO_ERROR);
    LT_CHECK(has("config.json' is a FIFO"));
    remove_model_dir(dir);
    dir = model_dir("cfg", 'f', "generation_config.json", 'p');
    LT_CHECK_STATUS(lm_model_config_load(dir, &cfg), LM_IO_ERROR);
    LT_CHECK(has("generation_config.json' is a FIFO"));
    remove_model_dir(dir);
    dir = model_dir("cfg", 'f', NULL, 0); /* no generation_config.json: fine */
    LT_CHECK_OK(lm_model_config_load(dir, &cfg));
    LT_CHECK(cfg.vocab_size > 0 && !cfg.generation.present);
    remove_model_dir(dir);
}

static void test_shard_positions_near_int64_max_fail_cleanly(void) {
    int32_t ids[5] = {1, 2, 3, 4, 0};
    const char *p = make("five.bin", 'f', "");
    LT_CHECK_OK(lm_token_shard_write(p, ids, 5, 10));
    lm_token_shard *s = NULL;
    LT_CHECK_OK(lm_token_shard_open(p, &s));
    if (!s) return;
    int32_t out[5];
    static const int64_t bad[][2] = {{INT64_MAX - 1, 5}, {INT64_MAX, INT64_MAX}, {0, INT64_MAX}, {1, 5},
                                     {-1, 1},            {0, -1},                {INT64_MIN, 2}, {6, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        LT_CHECK_STATUS(lm_token_shard_read(s, bad[i][0], bad[i][1], out), LM_OUT_OF_RANGE);
        char start[32];
        snprintf(start, sizeof start, "token %lld", (long long)bad[i][0]);
        LT_CHECK_MSG(has(start) && has("five.bin") && has("its 5 tokens"), "case %zu", i);
    }
    LT_CHECK_OK(lm_token_shard_read(s, 5, 0, out)); /* empty, at the end */
    LT_CHECK_OK(lm_token_shard_read(s, 1, 4, out));
    LT_CHECK(out[0] == 2 && out[3] == 0);
    lm_token_shard_close(s);

    /* a window longer than every shard, seq near INT64_MAX */
    const char *paths[1] = {p};
    lm_data_loader *dl = NULL;
    LT_CHECK_STATUS(lm_data_loader_create(1, paths, INT64_MAX, 1, 1, &dl), LM_INVALID_ARGUMENT);
    LT_CHECK(dl == NULL && has("9223372036854775807"));
    /* the last countable epoch ends with an error, not a wrapped counter */
    LT_CHECK_OK(lm_data_loader_create(1, paths, 2, 1, 1, &dl));
    if (dl) {
        lm_data_loader_state st = lm_data_loader_get_state(dl);
        st.epoch = INT64_MAX;
        st.cursor = lm_data_loader_windows(dl);
        LT_CHECK_OK(lm_data_loader_set_state(dl, &st));
        int32_t in[2], tg[2];
        LT_CHECK_STATUS(lm_data_loader_next(dl, 1, in, tg), LM_OUT_OF_RANGE);
        LT_CHECK(has("epoch"));
        st.epoch = INT64_MAX - 1;
        LT_CHECK_OK(lm_data_loader_set_state(dl, &st));
        LT_CHECK_OK(lm_data_loader_next(dl, 1, in, tg));
        LT_CHECK(lm_data_loader_get_state(dl).epoch == INT64_MAX);
    }
    lm_data_loader_destroy(dl);
    unlink(p);
}

static void test_shard_without_vocabulary_says_so(void) {
    const char *p = make("novocab.bin", 'f', "");
    int32_t ids[3] = {5, -3, 7};
    LT_CHECK_STATUS(lm_token_shard_write(p, ids, 3, 0), LM_OUT_OF_RANGE);
    LT_CHECK(has("token 1 = -3 is negative") && has("no vocabulary") && !strstr(lm_last_error(), "[0, 0)"));
    LT_CHECK_STATUS(lm_token_shard_write(p, ids, 3, 6), LM_OUT_OF_RANGE);
    LT_CHECK(has("outside [0, 6)"));
    /* the reader says the same of a written shard: i32 tokens, vocabulary 0, one negative */
    ids[1] = 3;
    LT_CHECK_OK(lm_token_shard_write(p, ids, 3, 0));
    char *data = NULL;
    size_t n = 0;
    LT_CHECK_OK(lm_file_read_all(p, &data, &n));
    if (data && n == LM_TOKEN_SHARD_HEADER + 12) {
        memset(data + LM_TOKEN_SHARD_HEADER + 4, 0xFF, 4); /* token 1 = -1 */
        tw_write_bytes(p, data, n);
        lm_token_shard *s = NULL;
        LT_CHECK_STATUS(lm_token_shard_open(p, &s), LM_PARSE_ERROR);
        LT_CHECK(has("token 1 = -1 is negative") && has("no vocabulary") && !strstr(lm_last_error(), "[0, 0)"));
    }
    lm_free(data);
    unlink(p);
}

/* The shard of one long line without a newline (several batches of ids) holds the ids
 * of one lm_tokenizer_encode of it, then the separator. */
static void test_prepare_streams_a_long_line_into_the_same_ids(void) {
    lm_tokenizer *tok = NULL;
    LT_CHECK_OK(lm_tokenizer_load(TRAIN_TOKENIZER, &tok));
    if (!tok) return;
    static const char *words[] = {"the ", "quick ", "brown ", "fox,", " jumps", "  over", "12 ", "345", "lazy\t"};
    size_t len = 0, cap = 1 << 21;
    char *text = malloc(cap + 16);
    lt_rng r = lt_rng_seed(5);
    while (len < cap) {
        const char *w = words[lt_rng_int(&r, 0, sizeof words / sizeof words[0] - 1)];
        memcpy(text + len, w, strlen(w));
        len += strlen(w);
    }
    const char *in = make("line.txt", 'f', ""), *out = make("line.bin", 'f', "");
    tw_write_bytes(in, text, len);
    int32_t *want = NULL;
    size_t nwant = 0;
    LT_CHECK_OK(lm_tokenizer_encode(tok, text, len, &want, &nwant));
    const char *inputs[1] = {in};
    int64_t count = 0;
    LT_CHECK_OK(lm_data_prepare(tok, 1, inputs, 384, out, &count));
    LT_CHECK_MSG(count == (int64_t)nwant + 1 && nwant > 100000, "%lld tokens, %zu from encode", (long long)count,
                 nwant);
    lm_token_shard *s = NULL;
    LT_CHECK_OK(lm_token_shard_open(out, &s));
    int32_t *got = malloc(sizeof *got * (size_t)(count > 0 ? count : 1));
    if (s && want && count == (int64_t)nwant + 1) {
        LT_CHECK_OK(lm_token_shard_read(s, 0, count, got));
        LT_CHECK(memcmp(got, want, nwant * sizeof *got) == 0 && got[nwant] == 384);
    }
    free(got);
    lm_token_shard_close(s);
    lm_free(want);
    free(text);
    lm_tokenizer_destroy(tok);
    unlink(in), unlink(out);
}

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(120); /* every open here returns at once; a blocked one would otherwise hang the suite */
    g_dir = tw_tmpdir();
    if (!g_dir) return 1;
    LT_RUN(test_non_regular_files_are_refused_at_once);
    LT_RUN(test_read_all_reads_regular_files_whole);
    LT_RUN(test_checkpoint_says_what_is_wrong_with_its_files);
    LT_RUN(test_config_files_that_are_not_regular_are_refused);
    LT_RUN(test_shard_positions_near_int64_max_fail_cleanly);
    LT_RUN(test_shard_without_vocabulary_says_so);
    LT_RUN(test_prepare_streams_a_long_line_into_the_same_ids);
    tw_rmtree(g_dir);
    free(g_dir);
    return lt_finish();
}
