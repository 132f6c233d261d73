/* autograd/profile.c — an opt-in operation profile: with LOOM_PROFILE=1 in the
 * environment, every recorded forward operation and every backward node waits for
 * its context and charges the wall time since the previous mark to its name, so a
 * training step breaks down into per-operation totals (the waiting makes the run
 * slower; the split is what it is for). Callers outside the tape (the trainer's
 * optimizer, zeroing, norms) mark their own phases with lm_ag_profile_mark.
 * One process-wide table of LM__PROF_MAX names, guarded by a mutex.
 */
#include "autograd/internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LM__PROF_MAX 96

typedef struct prof_entry {
    char name[48];
    double seconds;
    int64_t calls;
} prof_entry;

static prof_entry g_prof[LM__PROF_MAX];
static int g_nprof;
static double g_last;
static int g_enabled = -1;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

int lm_ag_profile_enabled(void) {
    if (g_enabled < 0) {
        const char *e = getenv("LOOM_PROFILE");
        g_enabled = e && *e && strcmp(e, "0") != 0;
    }
    return g_enabled;
}

void lm_ag_profile_mark(lm_ctx *ctx, const char *prefix, const char *name) {
    if (!lm_ag_profile_enabled()) return;
    lm_ctx_synchronize(ctx);
    double t = lm__now_seconds();
    char key[48];
    snprintf(key, sizeof key, "%s%s", prefix ? prefix : "", name ? name : "?");
    pthread_mutex_lock(&g_mu);
    if (g_last > 0) {
        int i = 0;
        while (i < g_nprof && strcmp(g_prof[i].name, key) != 0) i++;
        if (i == g_nprof && g_nprof < LM__PROF_MAX) snprintf(g_prof[g_nprof++].name, sizeof g_prof[0].name, "%s", key);
        if (i < g_nprof) g_prof[i].seconds += t - g_last, g_prof[i].calls++;
    }
    g_last = t;
    pthread_mutex_unlock(&g_mu);
}

void lm_ag_profile_reset(void) {
    pthread_mutex_lock(&g_mu);
    memset(g_prof, 0, sizeof g_prof);
    g_nprof = 0;
    g_last = 0;
    pthread_mutex_unlock(&g_mu);
}

static int by_time(const void *a, const void *b) {
    double x = ((const prof_entry *)a)->seconds, y = ((const prof_entry *)b)->seconds;
    return x < y ? 1 : x > y ? -1 : 0;
}

void lm_ag_profile_report(FILE *f) {
    if (!lm_ag_profile_enabled() || !f) return;
    pthread_mutex_lock(&g_mu);
    qsort(g_prof, (size_t)g_nprof, sizeof g_prof[0], by_time);
    double total = 0;
    for (int i = 0; i < g_nprof; i++) total += g_prof[i].seconds;
    fprintf(f, "profile (LOOM_PROFILE): %.3f s marked\n  %-40s %10s %8s %6s\n", total, "operation", "ms", "calls", "%");
    for (int i = 0; i < g_nprof; i++)
        fprintf(f, "  %-40s %10.2f %8lld %5.1f%%\n", g_prof[i].name, g_prof[i].seconds * 1e3, (long long)g_prof[i].calls,
                total > 0 ? 100.0 * g_prof[i].seconds / total : 0.0);
    pthread_mutex_unlock(&g_mu);
}
