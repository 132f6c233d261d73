/* serve/blocks.c — the block pool of a paged KV cache, with prefix caching.
 *
 * Every block has a reference count (the requests whose tables name it). A full block
 * may be registered under the hash of the token prefix it ends (the chain hash of its
 * tokens and every token before them, so equal hashes mean equal K/V contents): a
 * later request whose prompt starts with the same tokens takes those blocks instead of
 * computing them. Unreferenced blocks are free (never registered) or evictable
 * (registered, kept in release order and reused oldest first when no free block is
 * left: O(1) per allocation).
 * Lookups go through a chained hash table keyed by the chain hash; a match is
 * confirmed on the block's tokens and its parent's hash, so a hash collision is
 * never trusted.
 */
#include "serve/internal.h"

#include <string.h>

static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 31);
}

#define CHAIN_SEED 0x51ED270B27A3F1ull /* the hash of the empty prefix */

/* The chain hash of block k of tokens given the hash of the blocks before it. */
static uint64_t block_hash(const lm__blocks *bm, const int32_t *tokens, int64_t k, uint64_t parent) {
    uint64_t h = parent;
    for (int64_t i = 0; i < bm->bs; i++) h = mix(h, (uint32_t)tokens[k * bm->bs + i]);
    return h;
}

/* The chain hash of the first k + 1 blocks of tokens; *parent that of the first k. */
static uint64_t chain_hash(const lm__blocks *bm, const int32_t *tokens, int64_t k, uint64_t *parent) {
    uint64_t h = CHAIN_SEED, prev = CHAIN_SEED;
    for (int64_t b = 0; b <= k; b++) prev = h, h = block_hash(bm, tokens, b, h);
    *parent = prev;
    return h;
}

lm_status lm__blocks_init(lm__blocks *bm, int64_t nblocks, int64_t bs) {
    memset(bm, 0, sizeof *bm);
    bm->n = nblocks, bm->bs = bs;
    bm->nbuckets = 1;
    while (bm->nbuckets < 2 * nblocks) bm->nbuckets *= 2;
    bm->ref = lm__calloc((size_t)nblocks, sizeof *bm->ref);
    bm->hash = lm__calloc((size_t)nblocks, sizeof *bm->hash);
    bm->parent = lm__calloc((size_t)nblocks, sizeof *bm->parent);
    bm->cached = lm__calloc((size_t)nblocks, 1);
    bm->lru_prev = lm__calloc((size_t)nblocks, sizeof *bm->lru_prev);
    bm->lru_next = lm__calloc((size_t)nblocks, sizeof *bm->lru_next);
    bm->lru_head = bm->lru_tail = -1;
    bm->tokens = lm__calloc((size_t)(nblocks * bs), sizeof *bm->tokens);
    bm->chain_next = lm__calloc((size_t)nblocks, sizeof *bm->chain_next);
    bm->bucket = lm__calloc((size_t)bm->nbuckets, sizeof *bm->bucket);
    bm->free_list = lm__calloc((size_t)nblocks, sizeof *bm->free_list);
    if (!bm->ref || !bm->hash || !bm->parent || !bm->cached || !bm->lru_prev || !bm->lru_next || !bm->tokens || !bm->chain_next ||
        !bm->bucket || !bm->free_list) {
        lm__blocks_free(bm);
        return lm__error(LM_OUT_OF_MEMORY, "paged cache: the table of %lld blocks", (long long)nblocks);
    }
    for (int64_t i = 0; i < bm->nbuckets; i++) bm->bucket[i] = -1;
    for (int64_t i = 0; i < nblocks; i++) bm->free_list[i] = (int32_t)(nblocks - 1 - i); /* block 0 comes out first */
    bm->nfree = nblocks;
    return LM_OK;
}

void lm__blocks_free(lm__blocks *bm) {
    lm__free(bm->ref), lm__free(bm->hash), lm__free(bm->parent), lm__free(bm->cached), lm__free(bm->lru_prev);
    lm__free(bm->lru_next);
    lm__free(bm->tokens), lm__free(bm->chain_next), lm__free(bm->bucket), lm__free(bm->free_list);
    memset(bm, 0, sizeof *bm);
}

/* The evictable list: a registered block joins its tail when its last holder lets go
 * and leaves it when it is taken again (prefix hit) or evicted (from the head). */
static void lru_push(lm__blocks *bm, int32_t b) {
    bm->lru_prev[b] = bm->lru_tail, bm->lru_next[b] = -1;
    if (bm->lru_tail >= 0) bm->lru_next[bm->lru_tail] = b;
    else bm->lru_head = b;
    bm->lru_tail = b;
    bm->evictable++;
}

static void lru_unlink(lm__blocks *bm, int32_t b) {
    if (bm->lru_prev[b] >= 0) bm->lru_next[bm->lru_prev[b]] = bm->lru_next[b];
    else bm->lru_head = bm->lru_next[b];
    if (bm->lru_next[b] >= 0) bm->lru_prev[bm->lru_next[b]] = bm->lru_prev[b];
    else bm->lru_tail = bm->lru_prev[b];
    bm->evictable--;
}

static void unregister(lm__blocks *bm, int32_t blk) {
    int32_t *at = &bm->bucket[bm->hash[blk] & (uint64_t)(bm->nbuckets - 1)];
    while (*at != blk) at = &bm->chain_next[*at];
    *at = bm->chain_next[blk];
    bm->cached[blk] = 0;
    bm->ncached--;
}

/* A registered block holding exactly block k of tokens (chain hash h, parent's hash
 * parent), or -1. */
static int32_t find(const lm__blocks *bm, const int32_t *tokens, int64_t k, uint64_t h, uint64_t parent) {
    for (int32_t b = bm->bucket[h & (uint64_t)(bm->nbuckets - 1)]; b >= 0; b = bm->chain_next[b])
        if (bm->hash[b] == h && bm->parent[b] == parent &&
            !memcmp(bm->tokens + b * bm->bs, tokens + k * bm->bs, sizeof *tokens * (size_t)bm->bs))
            return b;
    return -1;
}

int64_t lm__blocks_match(lm__blocks *bm, const int32_t *tokens, int64_t n, int32_t *table) {
    int64_t k = 0;
    uint64_t parent = CHAIN_SEED;
    for (; (k + 1) * bm->bs <= n - 1; k++) { /* full blocks, leaving the last token to compute */
        uint64_t h = block_hash(bm, tokens, k, parent); /* the chain grows one block at a time */
        int32_t b = find(bm, tokens, k, h, parent);
        parent = h;
        if (b < 0) break;
        if (bm->ref[b]++ == 0) lru_unlink(bm, b);
        table[k] = b;
    }
    return k;
}

int lm__blocks_alloc(lm__blocks *bm, int32_t *out) {
    int32_t b = -1;
    if (bm->nfree > 0) {
        b = bm->free_list[--bm->nfree];
    } else if (bm->lru_head >= 0) { /* the least recently released registered block */
        b = bm->lru_head;
        lru_unlink(bm, b);
        unregister(bm, b);
    }
    if (b < 0) return -1;
    bm->ref[b] = 1;
    *out = b;
    return 0;
}

int64_t lm__blocks_available(const lm__blocks *bm) { return bm->nfree + bm->evictable; }

void lm__blocks_release(lm__blocks *bm, const int32_t *table, int64_t n) {
    for (int64_t k = 0; k < n; k++) {
        int32_t b = table[k];
        if (--bm->ref[b] > 0) continue;
        if (bm->cached[b]) lru_push(bm, b);
        else bm->free_list[bm->nfree++] = b;
    }
}

void lm__blocks_register(lm__blocks *bm, const int32_t *tokens, int64_t k, int32_t blk) {
    if (bm->cached[blk]) return;
    uint64_t parent, h = chain_hash(bm, tokens, k, &parent);
    if (find(bm, tokens, k, h, parent) >= 0) return; /* an equal block is registered already: this one stays private */
    bm->hash[blk] = h, bm->parent[blk] = parent;
    memcpy(bm->tokens + blk * bm->bs, tokens + k * bm->bs, sizeof *tokens * (size_t)bm->bs);
    int32_t *head = &bm->bucket[h & (uint64_t)(bm->nbuckets - 1)];
    bm->chain_next[blk] = *head;
    *head = blk;
    bm->cached[blk] = 1;
    bm->ncached++;
}
