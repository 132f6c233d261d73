/* Tests for CPU feature detection: the description is one immutable object, its
 * features are consistent with each other (AVX-512 implies AVX2, AMX-BF16 implies
 * AMX tiles, ...), logical_cpus matches this process's affinity mask, and on Linux
 * the SIMD flags agree with /proc/cpuinfo (the kernel clears flags whose register
 * state it does not support, as loom's own XCR0 check does).
 * LM_TEST_LABELS: unit
 */
#define _GNU_SOURCE
#include "harness.h"

#include <pthread.h>
#include <sched.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static void *features_from_thread(void *unused) {
    (void)unused;
    return (void *)lm_cpu_get_features();
}

static void test_features_object_is_stable(void) {
    const lm_cpu_features *f = lm_cpu_get_features();
    LT_CHECK(f != NULL && f == lm_cpu_get_features());
    pthread_t th;
    void *other = NULL;
    LT_CHECK(pthread_create(&th, NULL, features_from_thread, NULL) == 0);
    pthread_join(th, &other);
    LT_CHECK(other == (void *)f);
}

static void test_features_are_consistent(void) {
    const lm_cpu_features *f = lm_cpu_get_features();
    int flags[] = {f->avx2, f->fma, f->f16c, f->avx512f, f->avx512bw, f->avx512vl, f->avx512_bf16, f->avx512_fp16,
                   f->amx_tile, f->amx_bf16, f->avx512_vnni};
    for (int i = 0; i < 11; i++) LT_CHECK_MSG(flags[i] == 0 || flags[i] == 1, "feature %d is %d", i, flags[i]);
    LT_CHECK(!f->avx512f || f->avx2);
    LT_CHECK(!f->avx512bw || f->avx512f);
    LT_CHECK(!f->avx512vl || f->avx512f);
    LT_CHECK(!f->avx512_bf16 || f->avx512f);
    LT_CHECK(!f->avx512_fp16 || f->avx512f);
    LT_CHECK(!f->avx512_vnni || f->avx512f);
    LT_CHECK(!f->amx_bf16 || f->amx_tile);
    LT_CHECK(f->logical_cpus >= 1);
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) LT_CHECK(f->logical_cpus == CPU_COUNT(&set));
#endif
}

#if defined(__linux__) && (defined(__x86_64__) || defined(__i386__))
/* 1 if word appears as a whole token in line (the "flags" line of /proc/cpuinfo). */
static int cpuinfo_flag(const char *line, const char *word) {
    size_t n = strlen(word);
    for (const char *p = line; (p = strstr(p, word)) != NULL; p += n) {
        int starts = p == line || p[-1] == ' ' || p[-1] == '\t';
        int ends = p[n] == ' ' || p[n] == '\n' || p[n] == '\0';
        if (starts && ends) return 1;
    }
    return 0;
}

static int read_flags_line(char *line, size_t cap) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return 0;
    int found = 0;
    while (!found && fgets(line, (int)cap, f)) found = strncmp(line, "flags", 5) == 0;
    fclose(f);
    return found;
}

static void test_features_agree_with_proc_cpuinfo(void) {
    static char line[16384];
    if (!read_flags_line(line, sizeof line)) {
        printf("  (no flags line in /proc/cpuinfo: nothing to compare)\n");
        return;
    }
    const lm_cpu_features *f = lm_cpu_get_features();
    const struct {
        const char *flag;
        int have;
    } rows[] = {{"avx2", f->avx2},         {"fma", f->fma},           {"f16c", f->f16c},
                {"avx512f", f->avx512f},   {"avx512bw", f->avx512bw}, {"avx512vl", f->avx512vl},
                {"avx512_bf16", f->avx512_bf16}, {"avx512_fp16", f->avx512_fp16}, {"avx512_vnni", f->avx512_vnni},
                {"avx_vnni", f->avx_vnni}};
    for (int i = 0; i < (int)(sizeof rows / sizeof rows[0]); i++)
        LT_CHECK_MSG(cpuinfo_flag(line, rows[i].flag) == rows[i].have, "%s: cpuinfo %d, loom %d", rows[i].flag,
                     cpuinfo_flag(line, rows[i].flag), rows[i].have);
    /* AMX also needs the kernel to grant tile state to the process: loom may report 0
     * on an AMX CPU only if that request is refused. */
    int amx_info = cpuinfo_flag(line, "amx_tile");
    LT_CHECK_MSG(!f->amx_tile || amx_info, "loom reports AMX tiles that /proc/cpuinfo lacks");
    if (amx_info && !f->amx_tile) {
        long granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */);
        LT_CHECK_MSG(granted != 0, "AMX tiles are present and grantable but loom reports none");
    }
    LT_CHECK(f->amx_bf16 == (f->amx_tile && cpuinfo_flag(line, "amx_bf16")));
    LT_CHECK(f->amx_int8 == (f->amx_tile && cpuinfo_flag(line, "amx_int8")));
}
#endif

int main(void) {
    LT_RUN(test_features_object_is_stable);
    LT_RUN(test_features_are_consistent);
#if defined(__linux__) && (defined(__x86_64__) || defined(__i386__))
    LT_RUN(test_features_agree_with_proc_cpuinfo);
#endif
    return lt_finish();
}
