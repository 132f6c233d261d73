/* ops/cuda/table_nocuda.c — the CUDA operator table in a build without CUDA (compiled
 * only then, as every *_nocuda.c file): there is none, so operators pass has_cuda = 0
 * to lm__op_level. Builds with CUDA compile table_cuda.c instead. */
#include "ops/cuda_table.h"

#include <stddef.h>

const lm__cuda_ops *lm__cuda_ops_get(void) { return NULL; }
