/* base/clock.c — the monotonic clock the library times things with. */
#include "internal.h"

#include <time.h>

double lm__now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
