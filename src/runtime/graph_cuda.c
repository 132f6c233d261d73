/* runtime/graph_cuda.c — CUDA events and stream capture into replayable graphs
 * (built only with CUDA). Thin wrappers that map every CUDA error to a status.
 *
 * Capture uses cudaStreamCaptureModeThreadLocal: only the capturing thread is barred
 * from unsafe calls (cudaMalloc, synchronizing the device) while a capture is open, so
 * other threads keep working. A capture that fails to end or instantiate leaves no
 * graph behind and the stream usable again.
 */
#include "runtime/cuda.h"

#include <cuda_runtime_api.h>

lm_status lm__cuda_event_create(int index, void **event) {
    LM_TRY(lm__cuda_check(cudaSetDevice(index), "cudaSetDevice"));
    cudaEvent_t e;
    LM_TRY(lm__cuda_check(cudaEventCreate(&e), "cudaEventCreate"));
    *event = e;
    return LM_OK;
}

void lm__cuda_event_destroy(void *event) {
    if (event) cudaEventDestroy((cudaEvent_t)event);
}

lm_status lm__cuda_event_record(void *event, void *stream) {
    return lm__cuda_check(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream), "cudaEventRecord");
}

lm_status lm__cuda_event_sync(void *event) {
    return lm__cuda_check(cudaEventSynchronize((cudaEvent_t)event), "cudaEventSynchronize");
}

lm_status lm__cuda_event_elapsed(void *start, void *end, double *ms) {
    float f = 0;
    LM_TRY(lm__cuda_check(cudaEventElapsedTime(&f, (cudaEvent_t)start, (cudaEvent_t)end), "cudaEventElapsedTime"));
    *ms = f;
    return LM_OK;
}

lm_status lm__cuda_stream_wait(void *stream, void *event) {
    return lm__cuda_check(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0), "cudaStreamWaitEvent");
}

lm_status lm__cuda_capture_begin(void *stream) {
    return lm__cuda_check(cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal),
                          "cudaStreamBeginCapture");
}

/* Kernel nodes of a captured graph (memset, copy and event nodes are not counted). */
static lm_status count_kernels(cudaGraph_t graph, int64_t *kernels) {
    size_t n = 0;
    LM_TRY(lm__cuda_check(cudaGraphGetNodes(graph, NULL, &n), "cudaGraphGetNodes"));
    cudaGraphNode_t *nodes = n ? lm__calloc(n, sizeof *nodes) : NULL;
    if (n && !nodes) return LM_OUT_OF_MEMORY;
    lm_status st = n ? lm__cuda_check(cudaGraphGetNodes(graph, nodes, &n), "cudaGraphGetNodes") : LM_OK;
    *kernels = 0;
    for (size_t i = 0; st == LM_OK && i < n; i++) {
        enum cudaGraphNodeType type;
        st = lm__cuda_check(cudaGraphNodeGetType(nodes[i], &type), "cudaGraphNodeGetType");
        if (st == LM_OK && type == cudaGraphNodeTypeKernel) ++*kernels;
    }
    lm__free(nodes);
    return st;
}

lm_status lm__cuda_capture_end(void *stream, void **exec, int64_t *kernels) {
    *exec = NULL;
    *kernels = 0;
    cudaGraph_t graph = NULL;
    lm_status st = lm__cuda_check(cudaStreamEndCapture((cudaStream_t)stream, &graph), "cudaStreamEndCapture");
    if (st != LM_OK) {
        cudaGetLastError();
        if (graph) cudaGraphDestroy(graph);
        return st;
    }
    st = count_kernels(graph, kernels);
    if (st != LM_OK) {
        cudaGraphDestroy(graph);
        return st;
    }
    cudaGraphExec_t e = NULL;
    st = lm__cuda_check(cudaGraphInstantiate(&e, graph, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(graph); /* the executable graph keeps what it needs */
    if (st != LM_OK) return st;
    *exec = e;
    return LM_OK;
}

lm_status lm__cuda_graph_launch(void *exec, void *stream) {
    return lm__cuda_check(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream), "cudaGraphLaunch");
}

void lm__cuda_graph_destroy(void *exec) {
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}
