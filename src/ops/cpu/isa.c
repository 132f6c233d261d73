/* ops/cpu/isa.c — run-time choice of the vector path for tuned CPU kernels.
 *
 * AVX-512 needs F, BW, VL plus FMA and F16C; AVX2 needs AVX2, FMA and F16C (the
 * feature flags already include the OS register-state checks). The override is one
 * process-wide atomic so kernels running on pool threads read it without a lock.
 */
#include "ops/cpu/isa.h"

#include <stdatomic.h>

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

lm__cpu_isa lm__cpu_isa_active(void) {
    int o = atomic_load_explicit(&g_override, memory_order_relaxed);
    if (o != LM__CPU_ISA_AUTO) return (lm__cpu_isa)o;
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
