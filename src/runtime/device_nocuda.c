/* runtime/device_nocuda.c — the CUDA backend's registration in a build without CUDA
 * (compiled only then, as every *_nocuda.c file): the lookup answers NULL, which
 * device.c reports as "cuda:N requested but loom was built without CUDA" and
 * lm_cuda_compiled() as 0. Builds with CUDA compile device_cuda.c instead. */
#include "runtime/internal.h"

const lm__device_backend *lm__device_backend_cuda(void) { return NULL; }
