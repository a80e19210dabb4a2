/* Registered host ranges. Contract in wsync_host_ranges.h. A sorted array under one mutex: a
 * process registers a few checkpoint shards, so a lookup is a binary search over a handful. */
#include "wsync_host_ranges.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_error.h"

static pthread_mutex_t wsync_hr_lock = PTHREAD_MUTEX_INITIALIZER;
static wsync_host_range_t *wsync_hr;
static size_t wsync_hr_n, wsync_hr_cap;

/* The first range whose end is past p (ranges sorted by host address, disjoint). */
static size_t wsync_hr_lower(uintptr_t p)
{
    size_t lo = 0, hi = wsync_hr_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (wsync_hr[mid].host + wsync_hr[mid].bytes <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static wsync_result_t wsync_hr_meets(uintptr_t p, uint64_t bytes, wsync_error_t *err)
{
    size_t i = wsync_hr_lower(p);
    if (i < wsync_hr_n && wsync_hr[i].host < p + bytes)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "register_host(%p, %llu): meets the registered range %p + %llu; ranges "
                          "may not overlap",
                          (void *)p, (unsigned long long)bytes, (void *)wsync_hr[i].host,
                          (unsigned long long)wsync_hr[i].bytes);
    return WSYNC_OK;
}

wsync_result_t wsync_host_ranges_check(const void *ptr, uint64_t bytes, wsync_error_t *err)
{
    const uintptr_t p = (uintptr_t)ptr;
    if (ptr == NULL || bytes == 0 || p + bytes < p)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "register_host(%p, %llu): needs a non-NULL pointer and 1 or more bytes "
                          "that do not wrap the address space",
                          ptr, (unsigned long long)bytes);
    pthread_mutex_lock(&wsync_hr_lock);
    wsync_result_t rc = wsync_hr_meets(p, bytes, err);
    pthread_mutex_unlock(&wsync_hr_lock);
    return rc;
}

wsync_result_t wsync_host_ranges_add(const wsync_host_range_t *r, wsync_error_t *err)
{
    pthread_mutex_lock(&wsync_hr_lock);
    wsync_result_t rc = wsync_hr_meets(r->host, r->bytes, err);
    if (rc == WSYNC_OK && wsync_hr_n == wsync_hr_cap) {
        size_t cap = wsync_hr_cap ? 2 * wsync_hr_cap : 16;
        wsync_host_range_t *grown = realloc(wsync_hr, cap * sizeof(*grown));
        if (grown == NULL)
            rc = WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "register_host: no memory for range %zu",
                            wsync_hr_n + 1);
        else
            wsync_hr = grown, wsync_hr_cap = cap;
    }
    if (rc == WSYNC_OK) {
        size_t i = wsync_hr_lower(r->host);
        memmove(&wsync_hr[i + 1], &wsync_hr[i], (wsync_hr_n - i) * sizeof(*wsync_hr));
        wsync_hr[i] = *r;
        wsync_hr_n++;
    }
    pthread_mutex_unlock(&wsync_hr_lock);
    return rc;
}

wsync_result_t wsync_host_ranges_remove(const void *ptr, wsync_error_t *err)
{
    pthread_mutex_lock(&wsync_hr_lock);
    size_t i = wsync_hr_lower((uintptr_t)ptr);
    const int found = i < wsync_hr_n && wsync_hr[i].host == (uintptr_t)ptr;
    if (found) {
        memmove(&wsync_hr[i], &wsync_hr[i + 1], (wsync_hr_n - i - 1) * sizeof(*wsync_hr));
        if (--wsync_hr_n == 0) { /* nothing registered: nothing held (a plugin may be unloaded) */
            free(wsync_hr);
            wsync_hr = NULL;
            wsync_hr_cap = 0;
        }
    }
    pthread_mutex_unlock(&wsync_hr_lock);
    if (!found)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "unregister_host(%p): no range registered starts there", ptr);
    return WSYNC_OK;
}

int wsync_host_ranges_hold(const void *p, uint64_t bytes)
{
    const uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&wsync_hr_lock);
    size_t i = wsync_hr_lower(a);
    const int hit = i < wsync_hr_n && wsync_hr[i].host <= a &&
                    a + bytes <= wsync_hr[i].host + wsync_hr[i].bytes;
    pthread_mutex_unlock(&wsync_hr_lock);
    return hit;
}
