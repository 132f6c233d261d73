/* io/data_loader.c — windows of seq + 1 tokens over token shards, served in a seeded
 * per-epoch permutation (see loom/data.h). Window w maps through a prefix sum of
 * per-shard window counts to (shard, start = k * seq); a window never crosses a shard
 * boundary. An epoch's permutation is drawn from the RNG state stored for the start
 * of that epoch, and the next epoch starts from the state the draw left behind, so a
 * restored state replays the same order. O(windows) memory. Window arithmetic stays
 * below the shards' token counts, so it cannot overflow whatever seq is.
 */
#include "base/internal.h"
#include "loom/data.h"

#include <string.h>

struct lm_data_loader {
    int nshards;
    lm_token_shard **shards; /* [nshards] */
    int64_t *first;          /* [nshards + 1] first global window of each shard */
    int64_t seq, windows, vocab;
    uint64_t seed;
    int shuffle;
    int64_t *order;          /* [windows] this epoch's permutation */
    lm_data_loader_state st;
    lm_rng after;            /* RNG state after drawing this epoch's permutation */
    int32_t *row;            /* [seq + 1] one window */
};

/* order = a permutation drawn from the epoch-start state (Fisher-Yates), or the
 * identity; leaves the advanced state in dl->after. */
static void start_epoch(lm_data_loader *dl, int64_t epoch, const uint64_t rng_state[4]) {
    memcpy(dl->st.rng, rng_state, sizeof dl->st.rng);
    memcpy(dl->after.s, rng_state, sizeof dl->after.s);
    dl->st.epoch = epoch;
    dl->st.cursor = 0;
    for (int64_t i = 0; i < dl->windows; i++) dl->order[i] = i;
    if (!dl->shuffle) return;
    for (int64_t i = dl->windows - 1; i > 0; i--) {
        int64_t j = (int64_t)lm_rng_below(&dl->after, (uint64_t)i + 1), t = dl->order[i];
        dl->order[i] = dl->order[j];
        dl->order[j] = t;
    }
}

void lm_data_loader_rewind(lm_data_loader *dl) {
    lm_rng r;
    lm_rng_seed(&r, dl->seed);
    start_epoch(dl, 0, r.s);
}

static lm_status open_shards(lm_data_loader *dl, const char *const *paths) {
    for (int i = 0; i < dl->nshards; i++) {
        LM_TRY(lm_token_shard_open(paths[i], &dl->shards[i]));
        int64_t n = lm_token_shard_count(dl->shards[i]);
        dl->first[i + 1] = dl->first[i] + (n > dl->seq ? (n - 1) / dl->seq : 0);
        dl->vocab = LM_MAX(dl->vocab, lm_token_shard_vocab(dl->shards[i]));
    }
    dl->windows = dl->first[dl->nshards];
    if (dl->windows == 0) /* said without computing seq + 1: seq may be INT64_MAX */
        return lm__error(LM_INVALID_ARGUMENT, "data loader: no shard holds more than seq = %lld tokens (a window is "
                         "seq + 1 tokens)", (long long)dl->seq);
    dl->order = lm__calloc((size_t)dl->windows, sizeof *dl->order);
    dl->row = lm__calloc((size_t)dl->seq + 1, sizeof *dl->row);
    return dl->order && dl->row ? LM_OK : LM_OUT_OF_MEMORY;
}

lm_status lm_data_loader_create(int n, const char *const *paths, int64_t seq, uint64_t seed, int shuffle,
                                lm_data_loader **out) {
    if (n < 1 || !paths || !out || seq < 1)
        return lm__error(LM_INVALID_ARGUMENT, "lm_data_loader_create: %d shards, seq %lld", n, (long long)seq);
    *out = NULL;
    lm_data_loader *dl = lm__calloc(1, sizeof *dl);
    if (!dl) return LM_OUT_OF_MEMORY;
    dl->nshards = n;
    dl->seq = seq;
    dl->seed = seed;
    dl->shuffle = shuffle != 0;
    dl->shards = lm__calloc((size_t)n, sizeof *dl->shards);
    dl->first = lm__calloc((size_t)n + 1, sizeof *dl->first);
    lm_status st = dl->shards && dl->first ? open_shards(dl, paths) : LM_OUT_OF_MEMORY;
    if (st != LM_OK) {
        lm_data_loader_destroy(dl);
        return st;
    }
    lm_data_loader_rewind(dl);
    *out = dl;
    return LM_OK;
}

void lm_data_loader_destroy(lm_data_loader *dl) {
    if (!dl) return;
    for (int i = 0; dl->shards && i < dl->nshards; i++) lm_token_shard_close(dl->shards[i]);
    lm__free(dl->shards);
    lm__free(dl->first);
    lm__free(dl->order);
    lm__free(dl->row);
    lm__free(dl);
}

int64_t lm_data_loader_windows(const lm_data_loader *dl) { return dl->windows; }
int64_t lm_data_loader_vocab(const lm_data_loader *dl) { return dl->vocab; }

/* Reads global window w: seq + 1 tokens into row. */
static lm_status read_window(const lm_data_loader *dl, int64_t w, int32_t *row) {
    int s = 0;
    while (dl->first[s + 1] <= w) s++; /* few shards: a linear scan is enough */
    return lm_token_shard_read(dl->shards[s], (w - dl->first[s]) * dl->seq, dl->seq + 1, row);
}

lm_status lm_data_loader_next(lm_data_loader *dl, int batch, int32_t *inputs, int32_t *targets) {
    if (!dl || batch < 1 || !inputs || !targets) return lm__error(LM_INVALID_ARGUMENT, "lm_data_loader_next: bad arguments");
    int64_t T = dl->seq;
    for (int b = 0; b < batch; b++) {
        if (dl->st.cursor == dl->windows) {
            if (dl->st.epoch == INT64_MAX)
                return lm__error(LM_OUT_OF_RANGE, "data loader: epoch %lld is the last one it can count",
                                 (long long)dl->st.epoch);
            start_epoch(dl, dl->st.epoch + 1, dl->after.s);
        }
        LM_TRY(read_window(dl, dl->order[dl->st.cursor], dl->row));
        /* inputs: the window's first T tokens; targets: the same shifted by one */
        memcpy(inputs + (int64_t)b * T, dl->row, (size_t)T * sizeof *dl->row);
        memcpy(targets + (int64_t)b * T, dl->row + 1, (size_t)T * sizeof *dl->row);
        dl->st.cursor++;
    }
    return LM_OK;
}

lm_data_loader_state lm_data_loader_get_state(const lm_data_loader *dl) { return dl->st; }

lm_status lm_data_loader_set_state(lm_data_loader *dl, const lm_data_loader_state *st) {
    if (!dl || !st) return lm__error(LM_INVALID_ARGUMENT, "lm_data_loader_set_state: NULL argument");
    if (st->epoch < 0 || st->cursor < 0 || st->cursor > dl->windows)
        return lm__error(LM_OUT_OF_RANGE, "data loader: saved position (epoch %lld, window %lld) does not fit a data set of "
                                          "%lld windows per epoch",
                         (long long)st->epoch, (long long)st->cursor, (long long)dl->windows);
    start_epoch(dl, st->epoch, st->rng);
    dl->st.cursor = st->cursor;
    return LM_OK;
}
