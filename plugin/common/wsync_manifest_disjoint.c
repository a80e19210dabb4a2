/* A staged bucket's tensors each own their bytes: two byte ranges of one manifest that overlap
 * mean a tensor's offset points into another tensor, whose bytes would then be written in its
 * place. Checked at parse, before anything is written, whether or not digests are verified. */
#define _GNU_SOURCE /* qsort_r */
#include <stdlib.h>

#include "wsync_error.h"
#include "wsync_manifest_parts.h"

static int wsync_disjoint_cmp(const void *a, const void *b, void *tensors)
{
    const wsync_tensor_desc_t *t = tensors;
    const uint64_t x = t[*(const size_t *)a].offset;
    const uint64_t y = t[*(const size_t *)b].offset;
    return x < y ? -1 : x > y;
}

wsync_result_t wsync_manifest_check_disjoint(const wsync_tensor_desc_t *t, size_t n,
                                             wsync_error_t *err)
{
    size_t *order = malloc((n ? n : 1) * sizeof(*order));
    size_t k = 0;
    if (order == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "cannot allocate %zu tensor indices", n);
    int sorted = 1;
    for (size_t i = 0; i < n; i++)
        if (t[i].nbytes != 0) {
            sorted = sorted && (k == 0 || t[order[k - 1]].offset <= t[i].offset);
            order[k++] = i;
        }
    if (!sorted) /* our producers emit in offset order: the sort is for other ones */
        qsort_r(order, k, sizeof(*order), wsync_disjoint_cmp, (void *)t);
    wsync_result_t r = WSYNC_OK;
    for (size_t j = 1; j < k && r == WSYNC_OK; j++) {
        const wsync_tensor_desc_t *a = &t[order[j - 1]], *b = &t[order[j]];
        if (b->offset < a->offset + a->nbytes) /* extents checked: no overflow */
            r = WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                           "tensors[%zu] (\"%.80s\") at offset %llu overlaps tensors[%zu] "
                           "(\"%.80s\", offset %llu + nbytes %llu): every tensor of a staged "
                           "bucket has bytes of its own",
                           order[j], b->name, (unsigned long long)b->offset, order[j - 1], a->name,
                           (unsigned long long)a->offset, (unsigned long long)a->nbytes);
    }
    free(order);
    return r;
}
