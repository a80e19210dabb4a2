/* Rollback mode: the shadow copies of parameters a version writes (wsync_driver.h). */
#include "wsync_driver_impl.h"

#include <stdlib.h>
#include <string.h>

#include "wsync_error.h"

static int wsync_shadow_cmp(const void *a, const void *b)
{
    const uintptr_t x = (uintptr_t)((const wsync_shadow_t *)a)->param;
    const uintptr_t y = (uintptr_t)((const wsync_shadow_t *)b)->param;
    return x < y ? -1 : x > y;
}

wsync_result_t wsync_driver_set_shadows(wsync_driver_t *d, const wsync_shadow_t *shadows, size_t n,
                                        wsync_error_t *err)
{
    wsync_shadow_t *t = NULL;
    if (n > 0) {
        if (shadows == NULL || (t = malloc(n * sizeof(*t))) == NULL)
            return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                                "set_shadows: %zu shadows at NULL (or no memory)", n);
        memcpy(t, shadows, n * sizeof(*t));
        qsort(t, n, sizeof(*t), wsync_shadow_cmp);
        wsync_driver_plans_clear(d); /* their ops were redirected by the old shadows */
        for (size_t i = 0; i < n; i++)
            if (t[i].param == NULL || t[i].shadow == NULL ||
                (i > 0 && (uintptr_t)t[i - 1].param + t[i - 1].bytes > (uintptr_t)t[i].param)) {
                free(t);
                return WSYNC_RECORD(err, WSYNC_ERR_INVALID_ARGUMENT,
                                    "set_shadows: shadow %zu is NULL or its parameter overlaps "
                                    "another",
                                    i);
            }
    }
    free(d->shadows);
    d->shadows = t;
    d->n_shadows = n;
    return WSYNC_OK;
}

/* An op into a shadowed parameter writes the shadow instead; 1 when it still writes a live
 * parameter (moves bytes outside every shadow). */
int wsync_driver_redirect(const wsync_driver_t *d, wsync_copy_op_t *op)
{
    if (op->rows == 0 || op->row_bytes == 0)
        return 0;
    const uintptr_t dst = (uintptr_t)op->dst;
    size_t lo = 0, hi = d->n_shadows;
    while (lo < hi) { /* the last shadow whose param starts at or before dst */
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)d->shadows[mid].param <= dst)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return 1;
    const wsync_shadow_t *s = &d->shadows[lo - 1];
    if (dst - (uintptr_t)s->param >= s->bytes)
        return 1;
    op->dst = (unsigned char *)s->shadow + (dst - (uintptr_t)s->param);
    return 0;
}
