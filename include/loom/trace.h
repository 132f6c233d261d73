/* loom/trace.h — step traces: a timeline of one process as Chrome trace-event JSON
 * (lm_trace_html / `loom trace view` turn it into an offline page; Perfetto opens it too;
 * docs/TIMELINES.md, "Step traces").
 *
 * lm_trace_start opens the file; from then on the library's instrumentation points
 * (per operator, prefill / decode step / sample, training phases, server requests,
 * allocator high-water marks) append events, and lm_trace_stop completes the file.
 * Off, every instrumentation point costs one call and one predictable branch: no
 * clock read, no allocation, no lock. On, an event is formatted on the calling
 * thread and appended under one mutex to a 1 MiB buffer that is streamed to the file,
 * so memory stays bounded however long the run; the file is written beside the path
 * and renamed into place at stop, so a reader never sees a half-written trace.
 *
 * Times are CLOCK_MONOTONIC in nanoseconds (lm_trace_now); the file holds
 * microseconds. Host events carry pid 1 and one tid per thread (a thread_name
 * metadata event names it); spans given a track (device work) go to pid 2, one tid per
 * track. Names, categories and details are copied and JSON-escaped (invalid UTF-8
 * becomes U+FFFD), so any string may be passed and freed after the call.
 */
#ifndef LOOM_TRACE_H
#define LOOM_TRACE_H

#include "loom/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Starts tracing into path (the file appears at lm_trace_stop). Errors: LM_IO_ERROR
 * naming the file and errno's text when it cannot be created; LM_INVALID_ARGUMENT
 * when a trace is already running. */
LM_API lm_status lm_trace_start(const char *path);
/* Ends the trace: writes what is buffered, closes the JSON and renames the file into
 * place. A no-op (LM_OK) when no trace runs. Errors: LM_IO_ERROR naming the file when a
 * write, close or rename failed (the partial file is removed). Events dropped over
 * the size cap are counted in the file ("otherData") and logged as a warning. */
LM_API lm_status lm_trace_stop(void);
/* 1 while a trace runs. One relaxed atomic load. */
LM_API int lm_trace_enabled(void);
/* Events written (or buffered) since lm_trace_start; dropped ones are not counted. */
LM_API int64_t lm_trace_event_count(void);
/* The trace clock: CLOCK_MONOTONIC in nanoseconds. */
LM_API int64_t lm_trace_now(void);

/* A span on the calling thread ("X" event: start + duration, so spans nest by
 * construction). t0 = lm_trace_begin() is the start time, or 0 when tracing is off
 * (no clock read); lm_trace_end(t0, ...) writes the span ending now and does nothing
 * when t0 is 0. detail (may be NULL) goes into the event's args.
 *     int64_t t0 = lm_trace_begin();
 *     ... work ...
 *     lm_trace_end(t0, "generate", "prefill", NULL); */
LM_API int64_t lm_trace_begin(void);
LM_API void lm_trace_end(int64_t t0, const char *cat, const char *name, const char *detail);
/* A span [t0, t1] (lm_trace_now times) on track: NULL = the calling thread, else a
 * named track of the device process (pid 2), e.g. "cuda:0 stream". */
LM_API void lm_trace_span(const char *track, const char *cat, const char *name, const char *detail, int64_t t0,
                          int64_t t1);
/* A point in time on the calling thread ("i" event, thread scope). */
LM_API void lm_trace_instant(const char *cat, const char *name, const char *detail);
/* A counter sample ("C" event): name's series "value" is value from now on. */
LM_API void lm_trace_counter(const char *name, double value);
/* The process's peak resident memory (getrusage) as the counter "host peak RSS
 * (bytes)", written only when it rose since the last call of this trace. */
LM_API void lm_trace_memory(void);
/* Async spans ("b"/"e" with an id, "n" for a point): an operation that crosses
 * threads, such as a server request. Spans with the same cat and id nest; t is an
 * lm_trace_now time. The caller writes each begin before its end. */
LM_API void lm_trace_async_begin(const char *cat, const char *name, int64_t id, int64_t t, const char *detail);
LM_API void lm_trace_async_end(const char *cat, const char *name, int64_t id, int64_t t);
LM_API void lm_trace_async_instant(const char *cat, const char *name, int64_t id, int64_t t, const char *detail);
/* Names the calling thread in traces (this one and later ones); copied. */
LM_API void lm_trace_thread_name(const char *name);

/* A trace-event JSON file (json[0..len): the object loom writes, {"traceEvents":[...]},
 * or a bare array of events) as one self-contained HTML page in *out (lm_free it): rows
 * per process and thread with nested spans by depth, async spans in lanes, counters as
 * step charts, instants as ticks, zoom and pan, tooltips, and a summary of self time
 * per span name and busy time per thread (docs/TIMELINES.md, "Step traces"). No network
 * is needed to open it. source_name (may be NULL) titles the page and names the input in
 * errors. Errors: LM_PARSE_ERROR naming the fault and the event's index (not JSON, no
 * event array, an event without "ph" or "ts", an "E" without its "B", a negative
 * duration...); LM_INVALID_ARGUMENT for input over 1 GiB. */
LM_API lm_status lm_trace_html(const char *json, size_t len, const char *source_name, char **out);

#ifdef __cplusplus
}
#endif
#endif
