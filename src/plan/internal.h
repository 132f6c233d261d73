/* plan/internal.h — shared types of the tile compiler: machine, layouts and
 * redistribution pieces (the graph IR it compiles is graph/ir.h).
 *
 * Invariants: a layout maps every (shard, replica) to a distinct tile in [0, tiles);
 * shards are padded to the full block in storage; views keep each shard on its tile,
 * so a view never moves data. All sizes are int64 elements or bytes as named.
 */
#ifndef LOOM_PLAN_INTERNAL_H
#define LOOM_PLAN_INTERNAL_H

#include "base/internal.h"
#include "graph/ir.h"
#include "loom/plan.h"

#include <stdint.h>
#include <string.h>

#define LM__PLAN_MAX_DIMS LM__G_MAX_DIMS
#define LM__PLAN_MAX_REP 4

/* A growing text buffer for reports; on allocation failure it records the error
 * once and further appends are ignored (check .failed at the end). */
typedef struct lm__plan_sbuf {
    char *p; /* [cap] NUL-terminated text */
    int64_t len, cap;
    int failed;
} lm__plan_sbuf;
void lm__plan_sbuf_printf(lm__plan_sbuf *b, const char *fmt, ...) LM__PRINTF(2, 3);
/* Hands the text to the caller (*out, free with lm_free) or frees it on failure. */
lm_status lm__plan_sbuf_finish(lm__plan_sbuf *b, char **out);

static inline int64_t lm__plan_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t lm__plan_round_up(int64_t a, int64_t b) { return lm__plan_ceil_div(a, b) * b; }

/* ---- machine ------------------------------------------------------------------------------- */
struct lm_plan_machine {
    char name[LM__G_NAME];
    int64_t tiles;      /* tiles (cores with private SRAM) */
    int64_t sram_bytes; /* SRAM per tile available to data: sram_tile_bytes - sram_reserved_bytes (derived) */
    int64_t sram_tile_bytes;     /* physical SRAM per tile (the JSON field "sram_bytes") */
    int64_t sram_reserved_bytes; /* of which code, vertex state and exchange tables: never allocated */
    int64_t align;      /* allocation alignment in bytes (power of two) */
    double clock_hz;
    int64_t workers;                        /* hardware worker threads per tile */
    double mm_flops_f16;                    /* matrix unit FLOP/cycle/tile, f16 operands, f32 accumulation */
    double mm_flops_f32;                    /* the same for f32 operands */
    int64_t mm_k_grain_f16, mm_n_grain_f16; /* one matrix-unit pass: k x n weights */
    int64_t mm_k_grain_f32, mm_n_grain_f32;
    int64_t mm_call_cycles;        /* fixed cost of one matmul kernel call */
    int64_t mm_pass_cycles;        /* fixed cost of each k x n weight pass (load + worker restart) */
    double mm_row_cycles_f16;      /* cycles per streamed row per pass, f16 operands (peak: k*n*2 / FLOP rate) */
    double mm_row_cycles_f32;      /* the same for f32 operands */
    double vec_bytes_per_cycle;    /* bytes per cycle of one load or store stream (data path) */
    double vec_flops_f16;          /* elementwise FLOP/cycle/tile on f16 (vector lanes) */
    double vec_flops_f32;          /* the same on f32 */
    double transc_cycles_per_elem; /* exp / tanh / rsqrt per element */
    int64_t vec_call_cycles;       /* fixed cost of one vector kernel call */
    double exch_bytes_per_cycle;   /* per tile, each direction */
    int64_t sync_cycles;           /* barrier before each exchange phase */
    int64_t msg_cycles;            /* per transfer (message) in an exchange slot */
    double copy_bytes_per_cycle;   /* on-tile copy / rearrangement (layout conversions, local pieces) */
};

/* ---- layouts ---------------------------------------------------------------------------------- */
typedef struct lm__plan_layout {
    int8_t ndim;
    int8_t nrep;                     /* replica axes in use */
    int8_t partial;                  /* 1: replica axis 0 holds partial sums to be added */
    int8_t order[LM__PLAN_MAX_DIMS]; /* storage order within a shard, outermost first */
    lm_dtype dtype;
    int64_t dims[LM__PLAN_MAX_DIMS];  /* logical shape */
    int64_t block[LM__PLAN_MAX_DIMS]; /* shard extent per dim (padded); grid = ceil(dims/block) */
    int64_t grid[LM__PLAN_MAX_DIMS];
    int64_t tstride[LM__PLAN_MAX_DIMS]; /* tile step per shard coordinate */
    int64_t rcount[LM__PLAN_MAX_REP];   /* replica axis sizes */
    int64_t rstride[LM__PLAN_MAX_REP];  /* tile step per replica coordinate */
    int64_t tile0;
} lm__plan_layout;

/* One shard on tile0 (grid all 1), row-major storage. */
void lm__plan_layout_init(lm__plan_layout *l, int ndim, const int64_t *dims, lm_dtype dt);
/* Canonical form (call after editing fields directly): grid-1 dims get stride 0,
 * unit replica axes are dropped, unit-block dims move innermost in storage order. */
void lm__plan_layout_canon(lm__plan_layout *l);
/* Sets block[d] (clamped to [1, dims[d]]) and recomputes grid[d]. */
void lm__plan_layout_set_block(lm__plan_layout *l, int d, int64_t block);
/* Appends a replica axis; returns 0 when LM__PLAN_MAX_REP axes are in use. */
int lm__plan_layout_add_rep(lm__plan_layout *l, int64_t count, int64_t stride);
int64_t lm__plan_layout_shards(const lm__plan_layout *l);
int64_t lm__plan_layout_reps(const lm__plan_layout *l);
int64_t lm__plan_layout_shard_elems(const lm__plan_layout *l); /* padded */
int64_t lm__plan_layout_shard_bytes(const lm__plan_layout *l);
/* Element strides of the padded shard storage (dense in 'order'). */
void lm__plan_layout_strides(const lm__plan_layout *l, int64_t *strides);
/* Linear shard index <-> coordinates (row-major over grid). */
void lm__plan_layout_coord(const lm__plan_layout *l, int64_t shard, int64_t *coord);
int64_t lm__plan_layout_tile(const lm__plan_layout *l, int64_t shard, int64_t rep);
/* Logical box [lo, hi) of a shard; returns 0 when the shard is empty. */
int lm__plan_layout_box(const lm__plan_layout *l, int64_t shard, int64_t *lo, int64_t *hi);
/* 1 when every (shard, replica) lies on a distinct tile in [0, tiles). */
int lm__plan_layout_valid(const lm__plan_layout *l, int64_t tiles);
/* Fills shard_of[t] / rep_of[t] (-1 when tile t holds no shard). Arrays of [tiles]. */
void lm__plan_layout_tilemap(const lm__plan_layout *l, int64_t tiles, int32_t *shard_of, int32_t *rep_of);
int lm__plan_layout_equal(const lm__plan_layout *a, const lm__plan_layout *b);
uint64_t lm__plan_layout_hash(const lm__plan_layout *l);
/* The layout of a value whose dim i indexes like lx's dim d0 + i (a bias [N] of x's
 * last dim, RoPE positions [B, T] of x [B, T, H, D]): lx's blocks (clamped to dims),
 * tile strides and first tile, replicated over lx's other split dims and over lx's
 * replicas, so every tile holding a shard of lx holds the matching part. 0 when that
 * needs more than LM__PLAN_MAX_REP replica axes. */
int lm__plan_layout_project(const lm__plan_layout *lx, int d0, int ndim, const int64_t *dims, lm_dtype dt,
                            lm__plan_layout *out);
/* The same placement with replicas removed (replica 0 kept) and partial cleared. */
void lm__plan_layout_strip_reps(const lm__plan_layout *in, lm__plan_layout *out);
/* Short human description: "[729x1152] blk 32x1152 grid 23x1 ts 64,0 rep 4:16 @0". */
void lm__plan_layout_format(const lm__plan_layout *l, char *buf, size_t n);

/* Maps a layout of a view op's input to its output (and back). 0 when the storage of
 * a shard cannot be described by the other side (the consumer must then convert). */
int lm__plan_view_map(const lm__gop *op, const lm_graph *g, const lm__plan_layout *in, lm__plan_layout *out);
int lm__plan_view_unmap(const lm__gop *op, const lm_graph *g, const lm__plan_layout *out, lm__plan_layout *in);
/* Through the whole view chain from v's root to v (and back). */
int lm__plan_view_chain_map(const lm_graph *g, int v, const lm__plan_layout *root_layout, lm__plan_layout *out);
int lm__plan_view_chain_unmap(const lm_graph *g, int v, const lm__plan_layout *view_layout,
                              lm__plan_layout *root_layout);

/* A box of view value v in its root's coordinates (and back); 0 when the box is not
 * a box on the other side. */
int lm__plan_view_chain_box_unmap(const lm_graph *g, int v, const int64_t *lo, const int64_t *hi, int64_t *rlo,
                                  int64_t *rhi);
int lm__plan_view_chain_box_map(const lm_graph *g, int v, const int64_t *rlo, const int64_t *rhi, int64_t *lo,
                                int64_t *hi);

/* Root coordinates = A x view coordinates for view value v; 0 when the chain merges
 * dims (not affine). */
int lm__plan_view_chain_affine(const lm_graph *g, int v, int64_t A[LM__PLAN_MAX_DIMS][LM__PLAN_MAX_DIMS]);

/* ---- redistribution ------------------------------------------------------------------------- */
/* One piece of a conversion: box [lo, hi) (root coordinates) moves from a source
 * (shard, replica) to a destination (shard, replica). Pieces with equal source and
 * equal box but different destinations form one multicast. */
typedef struct lm__plan_piece {
    int32_t src_tile, dst_tile;
    int32_t src_shard, dst_shard;
    int32_t src_rep, dst_rep;
    int64_t lo[LM__PLAN_MAX_DIMS], hi[LM__PLAN_MAX_DIMS];
} lm__plan_piece;

/* Per-tile scratch for redistribution (sized for one machine). */
typedef struct lm__plan_ws {
    int64_t tiles;
    int32_t *shard_of, *rep_of; /* [tiles] tile map of the source layout */
    int64_t *acc;               /* [5 * tiles] recv, send, msgs, local, add */
} lm__plan_ws;
lm_status lm__plan_ws_init(lm__plan_ws *w, int64_t tiles);
void lm__plan_ws_free(lm__plan_ws *w);

/* Destination shards restricted to coordinates [lo, hi) of dim (dim -1: all). A
 * windowed destination layout only needs valid tiles inside the window (streamed
 * operands shift tile0 so each step's window lands on the compute grid). */
typedef struct lm__plan_window {
    int dim;
    int64_t lo, hi;
} lm__plan_window;

/* Pieces converting layout s into layout d (same shape). For a partial s (one
 * replica axis: the contributors) every contributor sends; otherwise the source
 * replica is a local one when the destination tile holds one, else replica
 * (destination shard mod replicas). Caller frees *out with lm__free. */
lm_status lm__plan_redist_pieces(const lm__plan_layout *s, const lm__plan_layout *d, lm__plan_ws *w,
                                 lm__plan_piece **out, int64_t *n);

typedef struct lm__plan_xcost {
    int64_t max_recv, max_send; /* bytes on the busiest tile (a multicast counts once for its sender) */
    int64_t max_msgs;           /* messages received by the busiest tile */
    int64_t max_local;          /* bytes copied on-tile by the busiest tile */
    int64_t max_add;            /* partial elements accumulated by the busiest tile */
    int64_t total_recv;         /* bytes received over all tiles */
} lm__plan_xcost;

/* Exchange statistics of s -> d without storing pieces. */
void lm__plan_redist_stats(const lm__plan_layout *s, const lm__plan_layout *d, lm__plan_ws *w, lm__plan_xcost *out);
/* The same in parts: clear, accumulate several conversions sharing one phase, summarize. */
lm_status lm__plan_redist_pieces_w(const lm__plan_layout *s, const lm__plan_layout *d, const lm__plan_window *win,
                                   lm__plan_ws *w, lm__plan_piece **out, int64_t *n);
void lm__plan_redist_clear(lm__plan_ws *w);
void lm__plan_redist_accumulate(const lm__plan_layout *s, const lm__plan_layout *d, const lm__plan_window *win,
                                lm__plan_ws *w);
void lm__plan_redist_summary(const lm__plan_ws *w, int partial, int64_t shard_elems, lm__plan_xcost *out);

/* ---- executable packages (package.c) -------------------------------------------------------- */
/* The package bytes of p (caller frees *out with lm__free). */
lm_status lm__plan_package_encode(const lm_plan *p, uint8_t **out, size_t *size);
/* Section id's (1..15, docs/PLAN.md section 8) place in a package; 0 when the table
 * entry points outside the bytes. For tests and the fuzzer, which edit sections. */
int lm__plan_package_section(const uint8_t *data, size_t size, int id, size_t *offset, size_t *bytes,
                             int64_t *count);
/* Recomputes every section checksum and the header's after an edit (tests, fuzzer). */
void lm__plan_package_reseal(uint8_t *data, size_t size);

#endif
