/* Both ends of a nixl buffer (wsync_nixl_buffer.h). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wsync_base64.h"
#include "wsync_clock.h"
#include "wsync_error.h"
#include "wsync_nixl_buffer.h"

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int k = 0; k < 8; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int k = 0; k < 8; k++)
        v |= (uint64_t)p[k] << (8 * k);
    return v;
}

/* ------------------------------------------------------------------ producer */

wsync_result_t wsync_nixl_export(void *segment, uint64_t bytes, uint64_t data_offset,
                                 wsync_nixl_export_t *x, wsync_error_t *err)
{
    wsync_result_t r = wsync_nixl_register(segment, bytes, 0, 0, &x->reg, err);
    if (r != WSYNC_OK)
        return r;
    x->control = (uint64_t)(uintptr_t)segment;
    x->data = x->control + data_offset;
    return WSYNC_OK;
}

void wsync_nixl_export_end(wsync_nixl_export_t *x)
{
    wsync_nixl_deregister(x->reg);
    x->reg = NULL;
}

void wsync_nixl_export_desc(const wsync_nixl_export_t *x, wsync_buffer_desc_t *d)
{
    const char *self = wsync_nixl_self();
    const size_t n = strlen(self);
    d->kind = WSYNC_BUFFER_NIXL;
    put_u64(d->handle, x->data);
    put_u64(d->handle + 8, x->control);
    memcpy(d->handle + WSYNC_NIXL_HANDLE_HEAD, self, n);
    d->handle_len = (uint32_t)(WSYNC_NIXL_HANDLE_HEAD + n);
    d->pid = 0;
    d->control[0] = '\0';
}

wsync_result_t wsync_nixl_export_peer(char **b64, wsync_error_t *err)
{
    uint8_t *md = NULL;
    size_t len = 0;
    wsync_result_t r = wsync_nixl_metadata(&md, &len, err);
    if (r != WSYNC_OK)
        return r;
    *b64 = malloc(wsync_base64_encoded_size(len));
    if (*b64 == NULL) {
        free(md);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu bytes of metadata", len);
    }
    wsync_base64_encode(md, len, *b64);
    free(md);
    return WSYNC_OK;
}

wsync_result_t wsync_nixl_segment(wsync_nixl_ranges_t *set, uint64_t start, uint64_t bytes,
                                  wsync_buffer_desc_t *seg, wsync_error_t *err)
{
    wsync_result_t r = wsync_nixl_cover(set, start, start + bytes, 0, err);
    if (r != WSYNC_OK)
        return r;
    const wsync_nixl_export_t x = {.data = start, .control = 0};
    wsync_nixl_export_desc(&x, seg);
    return WSYNC_OK;
}

/* ------------------------------------------------------------------ consumer */

wsync_result_t wsync_nixl_buffer_peer(const char *b64, const wsync_buffer_desc_t *d,
                                      const char *field, wsync_error_t *err)
{
    wsync_result_t r0 = wsync_nixl_start(err);
    if (r0 != WSYNC_OK)
        return r0;
    const char *self = wsync_nixl_self();
    if (d->handle_len == WSYNC_NIXL_HANDLE_HEAD + strlen(self) &&
        memcmp(d->handle + WSYNC_NIXL_HANDLE_HEAD, self, strlen(self)) == 0)
        return WSYNC_OK; /* this process's own buffer */
    const size_t n = strlen(b64);
    uint8_t *md = malloc(n / 4 * 3 + 3);
    if (md == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory to decode %s", field);
    long len = wsync_base64_decode(b64, md, n / 4 * 3 + 3);
    wsync_result_t r;
    char name[WSYNC_NIXL_NAME_MAX];
    if (len <= 0 || (size_t)len > WSYNC_NIXL_MD_MAX)
        r = WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                       "%s: not base64 of 1..%u bytes of NIXL agent metadata (%zu characters)",
                       field, WSYNC_NIXL_MD_MAX, n);
    else
        r = wsync_nixl_peer(md, (size_t)len, name, err);
    free(md);
    return r;
}

wsync_result_t wsync_nixl_buffer_open(const wsync_buffer_desc_t *d, void *landing, int vram,
                                      wsync_nixl_buffer_t *b, wsync_error_t *err)
{
    memset(b, 0, sizeof(*b));
    const uint32_t name_len =
        d->handle_len > WSYNC_NIXL_HANDLE_HEAD ? d->handle_len - WSYNC_NIXL_HANDLE_HEAD : 0;
    if (name_len == 0 || name_len >= WSYNC_NIXL_NAME_MAX ||
        memchr(d->handle + WSYNC_NIXL_HANDLE_HEAD, '\0', name_len) != NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "nixl buffer: handle of %u bytes; want 16 bytes of addresses, then the "
                          "producer's agent name (1..%u bytes, no NUL)",
                          d->handle_len, WSYNC_NIXL_NAME_MAX - 1);
    memcpy(b->peer, d->handle + WSYNC_NIXL_HANDLE_HEAD, name_len);
    b->remote_data = get_u64(d->handle) + d->base_offset;
    b->remote_control = get_u64(d->handle + 8);
    snprintf(b->what, sizeof(b->what), "the bucket buffer at 0x%llx of %s",
             (unsigned long long)b->remote_data, b->peer);
    wsync_result_t r = wsync_nixl_start(err);
    if (r != WSYNC_OK)
        return r;
    if (b->remote_control == 0) /* a segment: its peer is its buffer's, checked there */
        return landing == NULL ? WSYNC_OK
                               : WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                                            "nixl buffer of %s names no control block: only a "
                                            "segment of a direct manifest may",
                                            b->peer);
    if (landing == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                          "nixl segment of %s names a control block: only a bucket's buffer has "
                          "one",
                          b->peer);
    if (!wsync_nixl_knows(b->peer))
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_FOUND,
                          "nixl buffer of peer %s: no metadata of that agent was loaded; its "
                          "manifest's buffer.peer field carries it",
                          b->peer);
    b->landing = landing;
    b->bytes = d->bytes;
    b->vram = vram;
    /* the control block as read (page-sized: it is read whole), then the word written back */
    if (posix_memalign((void **)&b->seen, 4096, WSYNC_CONTROL_SIZE + 64) != 0)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for a control block copy");
    memset(b->seen, 0, WSYNC_CONTROL_SIZE + 64);
    b->word = (uint64_t *)((uint8_t *)b->seen + WSYNC_CONTROL_SIZE);
    if ((r = wsync_nixl_register(b->seen, WSYNC_CONTROL_SIZE + 64, 0, 0, &b->host_reg, err)) ==
        WSYNC_OK)
        r = wsync_nixl_register(landing, d->bytes, vram, 0, &b->landing_reg, err);
    if (r != WSYNC_OK)
        wsync_nixl_buffer_close(b);
    return r;
}

void wsync_nixl_buffer_close(wsync_nixl_buffer_t *b)
{
    wsync_nixl_ranges_end(&b->dsts);
    wsync_nixl_deregister(b->landing_reg);
    wsync_nixl_deregister(b->host_reg);
    free(b->seen);
    b->landing_reg = b->host_reg = NULL;
    b->seen = NULL;
}

/* Read the producer's control block once into b->seen. */
static wsync_result_t nixl_read_control(wsync_nixl_buffer_t *b, uint32_t timeout_ms,
                                        wsync_error_t *err)
{
    const wsync_nixl_span_t span = {.local = (uint64_t)(uintptr_t)b->seen,
                                    .remote = b->remote_control,
                                    .bytes = sizeof(wsync_control_t)};
    return wsync_nixl_transfer(0, b->peer, &span, 1, 0, timeout_ms, b->what, err);
}

/* Check the producer's control block holds `generation`, published and ready (direct: at least
 * that generation; its buckets live in the producer's tensors, which it keeps until every
 * bucket in flight is consumed). Ready is set in the producer's stream order after publish
 * returned the manifest: before the pull (wait) it is read again until it comes, up to
 * timeout_ms. */
static wsync_result_t nixl_check_control(wsync_nixl_buffer_t *b, uint64_t generation,
                                         uint32_t timeout_ms, int wait, int direct,
                                         const char *when, wsync_error_t *err)
{
    const uint64_t deadline = wsync_now_ms() + (timeout_ms ? timeout_ms : 30000u);
    wsync_control_t *c = b->seen;
    for (;;) {
        wsync_result_t r = nixl_read_control(b, timeout_ms, err);
        if (r != WSYNC_OK)
            return r;
        if (c->magic != WSYNC_CONTROL_MAGIC)
            return WSYNC_FAIL(err, WSYNC_ERR_PEER_GONE,
                              "%s: no control block at 0x%llx %s (magic 0x%x): the producer "
                              "freed that buffer; ask it for a new manifest",
                              b->what, (unsigned long long)b->remote_control, when, c->magic);
        if (atomic_load(&c->retired))
            return WSYNC_FAIL(err, WSYNC_ERR_PEER_GONE,
                              "%s was retired by its producer %s; ask it for a new manifest",
                              b->what, when);
        const uint64_t ready = atomic_load(&c->ready_generation);
        const uint64_t published = atomic_load(&c->published_generation);
        if (published < generation)
            return WSYNC_FAIL(err, WSYNC_ERR_BAD_MANIFEST,
                              "%s: generation %llu was never published there (published %llu); "
                              "the manifest is not its producer's",
                              b->what, (unsigned long long)generation,
                              (unsigned long long)published);
        if (!direct && (ready > generation || published > generation))
            return WSYNC_FAIL(err, WSYNC_ERR_STALE_GENERATION,
                              "%s holds generation %llu %s, not the manifest's %llu: the "
                              "producer staged again before this consumer read it",
                              b->what, (unsigned long long)published, when,
                              (unsigned long long)generation);
        if (ready == generation || (direct && ready > generation))
            return WSYNC_OK;
        if (!wait || wsync_now_ms() > deadline)
            return WSYNC_FAIL(err, WSYNC_ERR_TIMEOUT,
                              "%s: generation %llu published but not ready %s (ready %llu, "
                              "waited up to %u ms)",
                              b->what, (unsigned long long)generation, when,
                              (unsigned long long)ready, timeout_ms ? timeout_ms : 30000u);
        struct timespec pause = {0, 200000}; /* 0.2 ms: a stage's copy is still running */
        nanosleep(&pause, NULL);
    }
}

static int span_cmp(const void *a, const void *b)
{
    const wsync_nixl_span_t *x = a, *y = b;
    return x->local < y->local ? -1 : x->local > y->local;
}

/* Rows read with wide gaps (a column slice of a tensor-parallel shard) are pulled row by row, up
 * to this many; anything else is pulled as its whole extent. */
#define NIXL_ROW_SPANS_MAX 4096u

/* The source ranges of ops (offsets into the buffer), sorted and merged. */
static wsync_result_t nixl_spans(const wsync_copy_op_t *ops, size_t n, wsync_nixl_span_t **out,
                                 size_t *n_out, wsync_error_t *err)
{
    size_t cap = n + 1, k = 0;
    wsync_nixl_span_t *s = malloc(cap * sizeof(*s));
    if (s == NULL)
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu spans", cap);
    for (size_t i = 0; i < n; i++) {
        const wsync_copy_op_t *o = &ops[i];
        if (o->rows == 0 || o->row_bytes == 0)
            continue;
        const int by_row =
            o->rows > 1 && o->rows <= NIXL_ROW_SPANS_MAX && o->src_pitch >= 2 * o->row_bytes;
        const uint64_t pieces = by_row ? o->rows : 1;
        if (k + pieces > cap) {
            cap = 2 * (k + pieces);
            void *p = realloc(s, cap * sizeof(*s));
            if (p == NULL) {
                free(s);
                return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu spans", cap);
            }
            s = p;
        }
        for (uint64_t r = 0; r < pieces; r++) {
            const uint64_t at = o->src_offset + r * o->src_pitch;
            const uint64_t len =
                by_row ? o->row_bytes : (o->rows - 1) * o->src_pitch + o->row_bytes;
            s[k++] = (wsync_nixl_span_t){.local = at, .remote = at, .bytes = len};
        }
    }
    qsort(s, k, sizeof(*s), span_cmp);
    size_t m = 0;
    for (size_t i = 0; i < k; i++) {
        if (m > 0 && s[i].local <= s[m - 1].local + s[m - 1].bytes) {
            const uint64_t end = s[i].local + s[i].bytes;
            if (end > s[m - 1].local + s[m - 1].bytes)
                s[m - 1].bytes = end - s[m - 1].local;
            s[m - 1].remote = s[m - 1].local;
        } else {
            s[m++] = s[i];
        }
    }
    *out = s;
    *n_out = m;
    return WSYNC_OK;
}

/* The spans moved (after the caller checked the producer's control block holds `generation`),
 * then the block read again: it still holds it (direct: at least it). Frees spans. */
static wsync_result_t nixl_pull_checked(wsync_nixl_buffer_t *b, wsync_nixl_span_t *spans, size_t n,
                                        uint64_t generation, uint32_t timeout_ms, int direct,
                                        wsync_error_t *err)
{
    wsync_result_t r = wsync_nixl_transfer(0, b->peer, spans, n, b->vram, timeout_ms, b->what, err);
    free(spans);
    if (r == WSYNC_OK)
        r = nixl_check_control(b, generation, timeout_ms, 0, direct, "after the pull", err);
    return r;
}

wsync_result_t wsync_nixl_buffer_pull(wsync_nixl_buffer_t *b, const wsync_copy_op_t *ops, size_t n,
                                      uint64_t generation, uint32_t timeout_ms, wsync_error_t *err)
{
    wsync_nixl_span_t *spans = NULL;
    size_t n_spans = 0;
    wsync_result_t r = nixl_check_control(b, generation, timeout_ms, 1, 0, "before the pull", err);
    if (r == WSYNC_OK)
        r = nixl_spans(ops, n, &spans, &n_spans, err);
    if (r != WSYNC_OK)
        return r;
    for (size_t i = 0; i < n_spans; i++) { /* offsets become addresses (validated in bounds) */
        spans[i].local = (uint64_t)(uintptr_t)b->landing + spans[i].local;
        spans[i].remote = b->remote_data + spans[i].remote;
    }
    return nixl_pull_checked(b, spans, n_spans, generation, timeout_ms, 0, err);
}

wsync_result_t wsync_nixl_buffer_consumed(wsync_nixl_buffer_t *b, uint64_t generation,
                                          uint32_t timeout_ms, wsync_error_t *err)
{
    *b->word = generation;
    const wsync_nixl_span_t span = {.local = (uint64_t)(uintptr_t)b->word,
                                    .remote = b->remote_control +
                                              offsetof(wsync_control_t, consumed_generation),
                                    .bytes = sizeof(uint64_t)};
    return wsync_nixl_transfer(1, b->peer, &span, 1, 0, timeout_ms, b->what, err);
}

/* Op i as spans from the producer's buffer into its destination: one when both sides are
 * contiguous, else one a row. */
static wsync_result_t nixl_op_spans(uint64_t base, const wsync_copy_op_t *o, wsync_nixl_span_t **s,
                                    size_t *k, size_t *cap, wsync_error_t *err)
{
    const int whole =
        o->rows == 1 || (o->src_pitch == o->row_bytes && o->dst_pitch == o->row_bytes);
    const uint64_t pieces = whole ? 1 : o->rows;
    if (*k + pieces > *cap) {
        const size_t want = 2 * (*k + pieces);
        void *p = realloc(*s, want * sizeof(**s));
        if (p == NULL)
            return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "no memory for %zu spans", want);
        *s = p;
        *cap = want;
    }
    for (uint64_t r = 0; r < pieces; r++)
        (*s)[(*k)++] = (wsync_nixl_span_t){.local = (uint64_t)(uintptr_t)o->dst + r * o->dst_pitch,
                                           .remote = base + o->src_offset + r * o->src_pitch,
                                           .bytes = whole ? o->rows * o->row_bytes : o->row_bytes};
    return WSYNC_OK;
}

/* Ops' sources at base + src_offset in the producer, straight into their destinations. */
static wsync_result_t nixl_pull_into(wsync_nixl_buffer_t *b, uint64_t base,
                                     const wsync_copy_op_t *ops, size_t n, uint64_t generation,
                                     uint32_t timeout_ms, wsync_error_t *err)
{
    wsync_nixl_span_t *spans = NULL;
    size_t k = 0, cap = 0;
    wsync_result_t r =
        nixl_check_control(b, generation, timeout_ms, 1, base == 0, "before the pull", err);
    for (size_t i = 0; r == WSYNC_OK && i < n; i++) {
        const wsync_copy_op_t *o = &ops[i];
        if (o->rows == 0 || o->row_bytes == 0)
            continue;
        const uint64_t start = (uint64_t)(uintptr_t)o->dst;
        r = wsync_nixl_cover(&b->dsts, start, start + o->dst_extent, b->vram, err);
        if (r == WSYNC_OK)
            r = nixl_op_spans(base, o, &spans, &k, &cap, err);
    }
    if (r != WSYNC_OK) {
        free(spans);
        return r;
    }
    return nixl_pull_checked(b, spans, k, generation, timeout_ms, base == 0, err);
}

wsync_result_t wsync_nixl_buffer_pull_into(wsync_nixl_buffer_t *b, const wsync_copy_op_t *ops,
                                           size_t n, uint64_t generation, uint32_t timeout_ms,
                                           wsync_error_t *err)
{
    return nixl_pull_into(b, b->remote_data, ops, n, generation, timeout_ms, err);
}

wsync_result_t wsync_nixl_buffer_pull_segments(wsync_nixl_buffer_t *b, const wsync_copy_op_t *ops,
                                               size_t n, uint64_t generation, uint32_t timeout_ms,
                                               wsync_error_t *err)
{
    return nixl_pull_into(b, 0, ops, n, generation, timeout_ms, err);
}
