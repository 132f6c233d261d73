/* base/cpu.c — run-time CPU feature detection (x86-64: cpuid + xgetbv).
 *
 * A feature counts only when the CPU reports it AND the OS saves the register state
 * it needs (XCR0 bits for AVX/AVX-512; on Linux, AMX tile data must also be granted
 * to the process with arch_prctl(ARCH_REQ_XCOMP_PERM)). Detection runs once; the
 * result is immutable afterwards. Non-x86 builds report no SIMD features.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif
#define LM__X86 1
#endif

static lm_cpu_features g_features;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#ifdef LM__X86
static uint64_t read_xcr0(void) {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

/* Linux keeps AMX tile state off until the process asks for it. */
static int request_amx_permission(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    const int ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}

static void detect_x86(lm_cpu_features *f) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    f->fma = (c >> 12) & 1;
    f->f16c = (c >> 29) & 1;
    uint64_t xcr0 = osxsave ? read_xcr0() : 0;
    int ymm_ok = (xcr0 & 0x6) == 0x6;          /* SSE + AVX state */
    int zmm_ok = ymm_ok && (xcr0 & 0xe0) == 0xe0; /* opmask + ZMM state */
    int amx_ok = (xcr0 & 0x60000) == 0x60000;   /* XTILECFG + XTILEDATA */
    if (!ymm_ok || !avx) {
        f->fma = f->f16c = 0;
        return;
    }
    if (__get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    f->avx2 = (b >> 5) & 1;
    if (zmm_ok) {
        f->avx512f = (b >> 16) & 1;
        f->avx512bw = (b >> 30) & 1;
        f->avx512vl = (b >> 31) & 1;
        f->avx512_fp16 = (d >> 23) & 1;
        f->avx512_vnni = (c >> 11) & 1;
    }
    int amx_tile = (d >> 24) & 1, amx_bf16 = (d >> 22) & 1, amx_int8 = (d >> 25) & 1;
    unsigned a1, b1, c1, d1;
    __cpuid_count(7, 1, a1, b1, c1, d1);
    if (zmm_ok) f->avx512_bf16 = (a1 >> 5) & 1;
    f->avx_vnni = f->avx2 && ((a1 >> 4) & 1);
    if (amx_tile && amx_ok && request_amx_permission()) {
        f->amx_tile = 1;
        f->amx_bf16 = amx_bf16;
        f->amx_int8 = amx_int8;
    }
}
#endif

static void detect(void) {
#ifdef LM__X86
    detect_x86(&g_features);
#endif
    int n = 0;
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#endif
    if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    g_features.logical_cpus = n > 0 ? n : 1;
}

const lm_cpu_features *lm_cpu_get_features(void) {
    pthread_once(&g_once, detect);
    return &g_features;
}
