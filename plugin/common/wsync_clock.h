/* Milliseconds of CLOCK_MONOTONIC, for the deadlines of bounded waits. */
#ifndef WSYNC_COMMON_CLOCK_H
#define WSYNC_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t wsync_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

#endif
