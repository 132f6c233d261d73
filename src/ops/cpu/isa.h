/* ops/cpu/isa.h — which vector instruction set the tuned CPU kernels use.
 *
 * The library is compiled with generic x86-64 flags; vector kernels carry per-function
 * target attributes (LM__TARGET_AVX512 / LM__TARGET_AVX2) and are only called after
 * lm__cpu_isa_active() says the CPU (cpuid + OS register state, see base/cpu.c)
 * supports them. Tests force a lower path with lm__cpu_set_isa_override so every
 * path runs on one machine. Non-x86 builds only ever select the scalar path.
 */
#ifndef LOOM_OPS_CPU_ISA_H
#define LOOM_OPS_CPU_ISA_H

#include "base/internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LM__HAVE_X86_KERNELS 1
/* AVX-512: F (zmm, masks, vcvtph2ps zmm), BW+VL (16-bit masked loads), FMA, F16C. */
#define LM__TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define LM__TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
/* AVX-512 plus BF16 (VDPBF16PS, VCVTNE2PS2BF16): the fast-precision GEMM only
 * (matmul_bf16dot_avx512.c), called after lm__cpu_bf16dot_supported(). */
#define LM__TARGET_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#endif

/* Ordered: a higher value needs a superset of the features of a lower one. */
typedef enum lm__cpu_isa { LM__CPU_ISA_SCALAR = 0, LM__CPU_ISA_AVX2 = 1, LM__CPU_ISA_AVX512 = 2 } lm__cpu_isa;
#define LM__CPU_ISA_COUNT 3
#define LM__CPU_ISA_AUTO (-1)

/* 1 if this build has the kernels and this CPU can run them. */
int lm__cpu_isa_supported(lm__cpu_isa isa);
/* The path tuned kernels take now: the override when set, else the best supported. */
lm__cpu_isa lm__cpu_isa_active(void);
/* "scalar", "avx2", "avx512". */
const char *lm__cpu_isa_name(lm__cpu_isa isa);
/* Forces a path for later calls (tests and benchmarks); LM__CPU_ISA_AUTO clears it.
 * LM_UNSUPPORTED when the CPU or build cannot run it, LM_INVALID_ARGUMENT for other
 * values; the previous setting is kept on failure. Process-wide: set it while no
 * tuned kernel is running. */
lm_status lm__cpu_set_isa_override(int isa);

#endif
