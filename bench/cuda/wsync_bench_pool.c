/* See wsync_bench_pool.h. */
#include "wsync_bench_pool.h"

#include <stdlib.h>

#include <cuda_runtime_api.h>

#define WB_POOL_MIN_BLOCK 512ull
#define WB_POOL_SMALL_SIZE (1ull << 20)
#define WB_POOL_SMALL_BUFFER (2ull << 20)
#define WB_POOL_LARGE_BUFFER (20ull << 20)
#define WB_POOL_MIN_LARGE_ALLOC (10ull << 20)
#define WB_POOL_ROUND_LARGE (2ull << 20)

/* A free block: the unused tail of a segment (nothing is freed, so each segment has at most
 * one). */
typedef struct wb_free {
    size_t seg;
    uint64_t at, bytes;
    int small;
} wb_free_t;

static uint64_t wb_round_up(uint64_t v, uint64_t to)
{
    return (v + to - 1) / to * to;
}

int wb_pool_place(const uint64_t *bytes, size_t n, wb_pool_t *out)
{
    *out = (wb_pool_t){0};
    wb_free_t *fr = calloc(n ? n : 1, sizeof(*fr));
    out->seg_bytes = calloc(n ? n : 1, sizeof(*out->seg_bytes));
    out->seg = calloc(n ? n : 1, sizeof(*out->seg));
    out->offset = calloc(n ? n : 1, sizeof(*out->offset));
    if (fr == NULL || out->seg_bytes == NULL || out->seg == NULL || out->offset == NULL) {
        free(fr);
        wb_pool_free(out);
        return -1;
    }
    size_t nf = 0;
    for (size_t i = 0; i < n; i++) {
        const uint64_t size = bytes[i] < WB_POOL_MIN_BLOCK
                                  ? WB_POOL_MIN_BLOCK
                                  : wb_round_up(bytes[i], WB_POOL_MIN_BLOCK);
        const int small = size <= WB_POOL_SMALL_SIZE;
        size_t best = nf;
        for (size_t k = 0; k < nf; k++)
            if (fr[k].small == small && fr[k].bytes >= size &&
                (best == nf || fr[k].bytes < fr[best].bytes))
                best = k;
        if (best == nf) { /* a new segment, its whole size one free block */
            const uint64_t seg = small ? WB_POOL_SMALL_BUFFER
                                 : size < WB_POOL_MIN_LARGE_ALLOC
                                     ? WB_POOL_LARGE_BUFFER
                                     : wb_round_up(size, WB_POOL_ROUND_LARGE);
            out->seg_bytes[out->n_seg] = seg;
            fr[nf++] = (wb_free_t){.seg = out->n_seg++, .at = 0, .bytes = seg, .small = small};
        }
        wb_free_t *f = &fr[best];
        out->seg[i] = f->seg;
        out->offset[i] = f->at;
        const uint64_t left = f->bytes - size;
        const int split = small ? left >= WB_POOL_MIN_BLOCK : left > WB_POOL_SMALL_SIZE;
        if (split) {
            f->at += size;
            f->bytes = left;
        } else {
            *f = fr[--nf];
        }
    }
    free(fr);
    return 0;
}

unsigned char **wb_pool_alloc(wb_pool_t *p, size_t n)
{
    unsigned char **at = calloc(n ? n : 1, sizeof(*at));
    p->base = calloc(p->n_seg ? p->n_seg : 1, sizeof(*p->base));
    if (at == NULL || p->base == NULL) {
        free(at);
        return NULL;
    }
    for (size_t s = 0; s < p->n_seg; s++)
        if (cudaMalloc((void **)&p->base[s], p->seg_bytes[s]) != cudaSuccess) {
            free(at);
            return NULL;
        }
    for (size_t i = 0; i < n; i++)
        at[i] = p->base[p->seg[i]] + p->offset[i];
    return at;
}

void wb_pool_free(wb_pool_t *p)
{
    for (size_t s = 0; p->base != NULL && s < p->n_seg; s++)
        if (p->base[s] != NULL)
            cudaFree(p->base[s]);
    free(p->base);
    free(p->seg_bytes);
    free(p->seg);
    free(p->offset);
    *p = (wb_pool_t){0};
}
