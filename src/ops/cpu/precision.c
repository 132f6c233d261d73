/* ops/cpu/precision.c — lm_precision names, the device check, and the per-thread
 * precision of the CPU linear GEMM (ops/cpu/precision.h).
 *
 * Fast with bf16 weights needs the AVX-512 kernels (F, BW, VL, FMA, F16C) plus
 * AVX512_BF16 (cpuid leaf 7 subleaf 1, EAX bit 5; base/cpu.c also requires the OS to
 * save zmm state); with int8 / int4 weights the AVX2 path suffices (AVX-VNNI where the
 * CPU has it). A CPU with neither is refused here; one with AVX2 alone is refused at
 * model load when a linear would read bf16 weights (nn/model.c); never silently
 * replaced by exact. On CUDA fast changes the products of fp8 weights only (x quantized
 * to e4m3 per row for the fp8 tensor-core GEMM); model load refuses it for other weights.
 * Where the CPU also has AMX-BF16 and the OS granted the tile state (base/cpu.c asks
 * for it), the fast GEMM runs its microkernel on the tiles (LOOM_CPU_AMX=0 keeps it on
 * VDPBF16PS: for comparisons and tests of both on one machine); likewise, with AMX-INT8,
 * the fast int8 / int4 GEMM (the same variable keeps it on VPDPBUSD).
 */
#include "ops/cpu/precision.h"

#include "ops/cpu/isa.h"
#include "runtime/internal.h"

#include <stdlib.h>
#include <string.h>

static _Thread_local lm_precision t_precision = LM_PRECISION_EXACT;

lm_precision lm__cpu_precision(void) { return t_precision; }

lm_precision lm__cpu_precision_set(lm_precision p) {
    lm_precision old = t_precision;
    t_precision = p;
    return old;
}

/* 1 when this build has the x86 kernels and the CPU runs the avx512 path and feature. */
static int avx512_and(int feature) {
#ifdef LM__HAVE_X86_KERNELS
    return feature && lm__cpu_isa_supported(LM__CPU_ISA_AVX512);
#else
    (void)feature;
    return 0;
#endif
}

int lm__cpu_bf16dot_supported(void) { return avx512_and(lm_cpu_get_features()->avx512_bf16); }

int lm__cpu_i8dot_supported(void) { return avx512_and(lm_cpu_get_features()->avx512_vnni); }

int lm__cpu_bf16dot_runs(void) {
#ifdef LM__HAVE_X86_KERNELS
    return lm__cpu_bf16dot_supported() && lm__cpu_isa_active() == LM__CPU_ISA_AVX512;
#else
    return 0;
#endif
}

int lm__cpu_i8fast_supported(void) {
#ifdef LM__HAVE_X86_KERNELS
    return lm__cpu_isa_supported(LM__CPU_ISA_AVX2);
#else
    return 0;
#endif
}

int lm__cpu_avx_vnni_active(void) {
    if (!lm_cpu_get_features()->avx_vnni) return 0;
    const char *env = getenv("LOOM_CPU_AVX_VNNI");
    return !(env && strcmp(env, "0") == 0);
}

static int amx_allowed(void) {
    const char *env = getenv("LOOM_CPU_AMX");
    return !(env && strcmp(env, "0") == 0);
}

int lm__cpu_amx_bf16_active(void) {
    const lm_cpu_features *f = lm_cpu_get_features();
    return avx512_and(f->avx512_bf16 && f->amx_tile && f->amx_bf16) && amx_allowed();
}

int lm__cpu_amx_int8_active(void) {
    const lm_cpu_features *f = lm_cpu_get_features();
    return avx512_and(f->avx512_vnni && f->amx_tile && f->amx_int8) && amx_allowed();
}

const char *lm_precision_name(lm_precision p) {
    return p == LM_PRECISION_EXACT ? "exact" : p == LM_PRECISION_FAST ? "fast" : "invalid";
}

lm_status lm_precision_parse(const char *text, lm_precision *out) {
    if (!text || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_precision_parse: NULL argument");
    for (int p = LM_PRECISION_EXACT; p <= LM_PRECISION_FAST; p++)
        if (strcmp(text, lm_precision_name((lm_precision)p)) == 0) {
            *out = (lm_precision)p;
            return LM_OK;
        }
    return lm__error(LM_INVALID_ARGUMENT, "precision '%s': expected exact or fast", text);
}

lm_status lm_precision_check(lm_device d, lm_precision p) {
    if (p == LM_PRECISION_EXACT) return LM_OK;
    if (p != LM_PRECISION_FAST) return lm__error(LM_INVALID_ARGUMENT, "precision %d: expected exact (0) or fast (1)", (int)p);
    if (!lm__device_host_addressable(d)) return LM_OK; /* CUDA: fp8 weights only (lm_model_load_opts checks) */
#ifndef LM__HAVE_X86_KERNELS
    return lm__error(LM_UNSUPPORTED, "precision fast needs x86-64 vector products (AVX2 byte products for int8 / int4 "
                                     "weights, AVX512_BF16 for bf16); this build has no x86 vector kernels");
#else
    const lm_cpu_features *f = lm_cpu_get_features();
    if (lm__cpu_bf16dot_supported()) return LM_OK;
    if (lm__cpu_i8fast_supported()) return LM_OK; /* int8 / int4 only: lm_model_load_opts checks the weights */
    return lm__error(LM_UNSUPPORTED, "precision fast needs AVX2 byte products (int8 / int4 weights) or AVX512_BF16 "
                                     "(VDPBF16PS, every weight); this CPU has neither (avx2 %d, fma %d, f16c %d); "
                                     "exact, the default, runs anywhere", f->avx2, f->fma, f->f16c);
#endif
}
