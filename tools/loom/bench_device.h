/* tools/loom/bench_device.h — GPU variants of `loom bench` (bench_device.c). */
#ifndef LOOM_CLI_BENCH_DEVICE_H
#define LOOM_CLI_BENCH_DEVICE_H

#include "loom/loom.h"

typedef struct bench_device_opts {
    const char *model;
    int repeat, batch;
    int64_t prompt, tokens; /* prompt tokens per row; new tokens per row (decode) */
    lm_weights weights;     /* --weights (int8 is refused on a GPU by the loader) */
} bench_device_opts;

/* Each prints one JSON line to stdout and returns the exit status. */
int bench_device_bandwidth(lm_device dev, int repeat);
int bench_device_model(const bench_device_opts *o, lm_device dev, int decode);

#endif
