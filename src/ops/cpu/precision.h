/* ops/cpu/precision.h — the precision the linear products run at on this thread
 * (loom/ops.h lm_precision; docs/QUANTIZATION.md "Fast precision"), and the CPU
 * features the fast kernels need.
 *
 * A model's forward pass (nn/step.c) sets its load-time precision around the executor
 * run and restores the previous value after it; lm__cpu_linear reads it on the calling
 * thread when it plans a call (pool workers only run the plan), and ops/linear.c passes
 * it to the CUDA quantized product (fp8 weights), so concurrent models on different
 * threads never see each other's setting. Default: exact.
 */
#ifndef LOOM_OPS_CPU_PRECISION_H
#define LOOM_OPS_CPU_PRECISION_H

#include "loom/ops.h"

/* This thread's precision (LM_PRECISION_EXACT until set). */
lm_precision lm__cpu_precision(void);
/* Sets this thread's precision; returns the previous one (to restore). */
lm_precision lm__cpu_precision_set(lm_precision p);
/* 1 when this build and CPU can run the fast GEMM (AVX-512 F/BW/VL + AVX512_BF16, with
 * the OS saving zmm state), whatever the ISA override says. */
int lm__cpu_bf16dot_supported(void);
/* 1 when it also runs now: supported and the active ISA path is avx512 (not overridden
 * lower). */
int lm__cpu_bf16dot_runs(void);
/* 1 when this build and CPU can run the AVX-512 fast int8 / int4 kernels (AVX-512
 * F/BW/VL + AVX512_VNNI). */
int lm__cpu_i8dot_supported(void);
/* 1 when this build and CPU can run fast int8 / int4 products at all: the AVX-512 set,
 * or the AVX2 path's (AVX2, FMA, F16C; matmul_i8dot_avx2.c). */
int lm__cpu_i8fast_supported(void);
/* 1 when the AVX2 path's fast int8 / int4 products use AVX-VNNI (VEX VPDPBUSD): the CPU
 * has it and the environment does not say LOOM_CPU_AVX_VNNI=0 (read at each call; the
 * AVX2-only set then runs, for comparisons and tests of both on one machine). */
int lm__cpu_avx_vnni_active(void);
/* 1 when the fast GEMM of bf16 weights runs its microkernel on AMX tiles: the fast GEMM
 * is supported, the CPU has AMX-TILE and AMX-BF16, the OS granted the tile state, and
 * the environment does not say LOOM_CPU_AMX=0 (read at each call). */
int lm__cpu_amx_bf16_active(void);
/* 1 when the fast int8 / int4 GEMM (prefill) runs its products on AMX tiles: the AVX-512
 * set is supported, the CPU has AMX-TILE and AMX-INT8, the OS granted the tile state,
 * and the environment does not say LOOM_CPU_AMX=0 (read at each call). */
int lm__cpu_amx_int8_active(void);

#endif
