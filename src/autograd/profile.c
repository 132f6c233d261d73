/* autograd/profile.c — an opt-in operation profile: with LOOM_PROFILE=1 in the
 * environment, every recorded forward operation and every backward node marks the end
 * of its work in its context's queue, and the time from the previous mark to this one
 * is charged to its name, so a training step breaks down into per-operation totals.
 * Callers outside the tape (the trainer's optimizer, zeroing, norms) mark their own
 * phases with lm_ag_profile_mark.
 *
 * A mark records an event (lm_event_record) and does not wait: on a GPU the intervals
 * are the device's time between consecutive marks, so the work is timed as it runs,
 * one kernel after another, without a synchronization per operation; on the CPU, whose
 * work is synchronous, an event is the host clock. The events are resolved in batches
 * (when LM__PROF_EVENTS are pending, when the context changes, and before a report),
 * the last one kept as the base of the next batch. Where the host falls behind the
 * device, the idle gap is charged to the next mark's name. One process-wide table of
 * LM__PROF_MAX names, guarded by a mutex.
 */
#include "autograd/internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LM__PROF_MAX 96
#define LM__PROF_EVENTS 4096

typedef struct prof_entry {
    char name[48];
    double seconds;
    int64_t calls;
} prof_entry;

static prof_entry g_prof[LM__PROF_MAX];
static int g_nprof;
static int g_enabled = -1;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
/* Pending marks: g_ev[0..g_used) recorded in order on g_ctx; g_who[i] is the entry
 * charged with the interval (g_ev[i-1], g_ev[i]) (-1: none, e.g. the first mark). */
static lm_event *g_ev[LM__PROF_EVENTS];
static int g_who[LM__PROF_EVENTS];
static int g_used;
static lm_ctx *g_ctx;
static int64_t g_lost;     /* marks that could not be timed (an event failed) */
static int64_t g_unnamed;  /* marks past the LM__PROF_MAX names: charged to none */

int lm_ag_profile_enabled(void) {
    if (g_enabled < 0) {
        const char *e = getenv("LOOM_PROFILE");
        g_enabled = e && *e && strcmp(e, "0") != 0;
    }
    return g_enabled;
}

static void drop_events(void) {
    for (int i = 0; i < LM__PROF_EVENTS; i++) lm_event_destroy(g_ev[i]), g_ev[i] = NULL;
    g_used = 0;
    g_ctx = NULL;
}

/* The last pending mark becomes the only one: the base the next mark is timed from. */
static void keep_base(void) {
    lm_event *last = g_ev[g_used - 1];
    g_ev[g_used - 1] = g_ev[0], g_ev[0] = last;
    g_who[0] = -1;
    g_used = 1;
}

/* Charges every pending interval; the last event becomes the base of the next batch. */
static void resolve(void) {
    if (g_used == 0) return;
    if (lm_event_synchronize(g_ev[g_used - 1]) != LM_OK) {
        lm_clear_error();
        g_lost += g_used;
        drop_events();
        return;
    }
    for (int i = 1; i < g_used; i++) {
        double ms = 0;
        if (g_who[i] < 0) continue;
        if (lm_event_elapsed_ms(g_ev[i - 1], g_ev[i], &ms) != LM_OK) {
            lm_clear_error();
            g_lost++;
            continue;
        }
        g_prof[g_who[i]].seconds += ms * 1e-3, g_prof[g_who[i]].calls++;
    }
    keep_base();
}

static int entry_of(const char *key) {
    int i = 0;
    while (i < g_nprof && strcmp(g_prof[i].name, key) != 0) i++;
    if (i == g_nprof) {
        if (g_nprof == LM__PROF_MAX) {
            g_unnamed++;
            return -1;
        }
        snprintf(g_prof[g_nprof++].name, sizeof g_prof[0].name, "%s", key);
    }
    return i;
}

void lm_ag_profile_mark(lm_ctx *ctx, const char *prefix, const char *name) {
    if (!lm_ag_profile_enabled() || !ctx) return;
    char key[48];
    snprintf(key, sizeof key, "%s%s", prefix ? prefix : "", name ? name : "?");
    pthread_mutex_lock(&g_mu);
    if (ctx != g_ctx) { /* another queue: this batch ends here, the next starts from this mark */
        resolve();
        drop_events();
        g_ctx = ctx;
    }
    if (g_used == LM__PROF_EVENTS) resolve();
    int i = g_used;
    lm_status st = g_ev[i] ? LM_OK : lm_event_create(ctx, &g_ev[i]);
    if (st == LM_OK) st = lm_event_record(g_ev[i], ctx);
    if (st != LM_OK) { /* untimed: the next mark starts a new batch */
        lm_clear_error();
        g_lost++;
        resolve();
        drop_events();
    } else {
        g_who[i] = i == 0 ? -1 : entry_of(key);
        g_used++;
    }
    pthread_mutex_unlock(&g_mu);
}

void lm_ag_profile_reset(void) {
    pthread_mutex_lock(&g_mu);
    memset(g_prof, 0, sizeof g_prof);
    g_nprof = 0;
    g_lost = g_unnamed = 0;
    if (g_used > 0) keep_base(); /* the last mark stays the base of what follows */
    pthread_mutex_unlock(&g_mu);
}

static int by_time(const void *a, const void *b) {
    double x = ((const prof_entry *)a)->seconds, y = ((const prof_entry *)b)->seconds;
    return x < y ? 1 : x > y ? -1 : 0;
}

void lm_ag_profile_report(FILE *f) {
    if (!lm_ag_profile_enabled() || !f) return;
    pthread_mutex_lock(&g_mu);
    resolve();
    qsort(g_prof, (size_t)g_nprof, sizeof g_prof[0], by_time);
    double total = 0;
    for (int i = 0; i < g_nprof; i++) total += g_prof[i].seconds;
    fprintf(f, "profile (LOOM_PROFILE): %.3f s between marks\n  %-40s %10s %8s %6s\n", total, "operation", "ms",
            "calls", "%");
    for (int i = 0; i < g_nprof; i++)
        fprintf(f, "  %-40s %10.2f %8lld %5.1f%%\n", g_prof[i].name, g_prof[i].seconds * 1e3, (long long)g_prof[i].calls,
                total > 0 ? 100.0 * g_prof[i].seconds / total : 0.0);
    if (g_lost) fprintf(f, "  (%lld marks could not be timed)\n", (long long)g_lost);
    if (g_unnamed) fprintf(f, "  (%lld marks past the table's %d names, charged to none)\n", (long long)g_unnamed, LM__PROF_MAX);
    pthread_mutex_unlock(&g_mu);
}
