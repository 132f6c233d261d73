/* ops/cpu/isa.c — run-time choice of the vector path for tuned CPU kernels.
 *
 * AVX-512 needs F, BW, VL plus FMA and F16C; AVX2 needs AVX2, FMA and F16C (the
 * feature flags already include the OS register-state checks). The override is one
 * process-wide atomic so kernels running on pool threads read it without a lock; below
 * it, the environment's LOOM_CPU_ISA (read once), then the best path the CPU runs.
 */
#include "ops/cpu/isa.h"

#include "base/internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_int g_override = LM__CPU_ISA_AUTO;

int lm__cpu_isa_supported(lm__cpu_isa isa) {
    const lm_cpu_features *f = lm_cpu_get_features();
    switch (isa) {
    case LM__CPU_ISA_SCALAR: return 1;
#ifdef LM__HAVE_X86_KERNELS
    case LM__CPU_ISA_AVX2: return f->avx2 && f->fma && f->f16c;
    case LM__CPU_ISA_AVX512: return f->avx512f && f->avx512bw && f->avx512vl && f->avx2 && f->fma && f->f16c;
#endif
    default: (void)f; return 0;
    }
}

/* The path LOOM_CPU_ISA names (scalar, avx2, avx512), read once: for measuring a lower
 * path on a machine that has a higher one. A name this CPU or build cannot run, or an
 * unknown one, is reported (a warning through the log hook) and ignored. */
static atomic_int g_env = -2; /* -2: not read yet; LM__CPU_ISA_AUTO: unset or ignored */

static int env_isa(void) {
    int v = atomic_load_explicit(&g_env, memory_order_relaxed);
    if (v != -2) return v;
    v = LM__CPU_ISA_AUTO;
    const char *e = getenv("LOOM_CPU_ISA");
    if (e && *e) {
        for (int isa = 0; isa < LM__CPU_ISA_COUNT; isa++)
            if (strcmp(e, lm__cpu_isa_name((lm__cpu_isa)isa)) == 0) v = isa;
        if (v == LM__CPU_ISA_AUTO)
            lm__log(LM_LOG_WARN, "LOOM_CPU_ISA=%s is not scalar, avx2 or avx512: ignored", e);
        else if (!lm__cpu_isa_supported((lm__cpu_isa)v)) {
            lm__log(LM_LOG_WARN, "LOOM_CPU_ISA=%s: this CPU or build cannot run that path: ignored", e);
            v = LM__CPU_ISA_AUTO;
        }
    }
    atomic_store_explicit(&g_env, v, memory_order_relaxed);
    return v;
}

lm__cpu_isa lm__cpu_isa_active(void) {
    int o = atomic_load_explicit(&g_override, memory_order_relaxed);
    if (o != LM__CPU_ISA_AUTO) return (lm__cpu_isa)o;
    if ((o = env_isa()) != LM__CPU_ISA_AUTO) return (lm__cpu_isa)o;
    for (int isa = LM__CPU_ISA_COUNT - 1; isa > 0; isa--)
        if (lm__cpu_isa_supported((lm__cpu_isa)isa)) return (lm__cpu_isa)isa;
    return LM__CPU_ISA_SCALAR;
}

const char *lm__cpu_isa_name(lm__cpu_isa isa) {
    switch (isa) {
    case LM__CPU_ISA_SCALAR: return "scalar";
    case LM__CPU_ISA_AVX2: return "avx2";
    case LM__CPU_ISA_AVX512: return "avx512";
    }
    return "invalid";
}

lm_status lm__cpu_set_isa_override(int isa) {
    if (isa != LM__CPU_ISA_AUTO && (isa < 0 || isa >= LM__CPU_ISA_COUNT))
        return lm__error(LM_INVALID_ARGUMENT, "cpu isa override: %d is not a known instruction set", isa);
    if (isa != LM__CPU_ISA_AUTO && !lm__cpu_isa_supported((lm__cpu_isa)isa))
        return lm__error(LM_UNSUPPORTED, "cpu isa override: this CPU or build cannot run the %s path",
                         lm__cpu_isa_name((lm__cpu_isa)isa));
    atomic_store_explicit(&g_override, isa, memory_order_relaxed);
    return LM_OK;
}
