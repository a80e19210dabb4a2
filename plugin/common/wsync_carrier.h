/* The streams that carried copies from one mapped buffer, for both backends: record_consumed
 * joins the pending ones and records *consumed* on the first, and close_handle drains them all
 * before the unmap (docs/DESIGN.md §2). A fixed table: no allocation on the copy path. */
#ifndef WSYNC_COMMON_CARRIER_H
#define WSYNC_COMMON_CARRIER_H

#include <stddef.h>
#include <stdint.h>

#define WSYNC_CARRIER_MAX 16 /* distinct streams tracked per mapping */

typedef struct wsync_carrier {
    void *stream;  /* the backend's stream */
    void *event;   /* the backend's marker object of this slot (CUDA: an event), kept on reuse */
    uint64_t mark; /* the backend's marker value (CPU: the last task on `stream` that reads) */
    int pending;   /* carried copies since the last record_consumed */
} wsync_carrier_t;

typedef struct wsync_carriers {
    wsync_carrier_t at[WSYNC_CARRIER_MAX];
    size_t n;
} wsync_carriers_t;

/* The entry of `stream`: its own, a new one (event NULL: the backend makes it), or the slot of a
 * carrier with nothing pending, whose stream and mark are copied to *evicted first so that the
 * backend drains them before reuse (evicted->stream is NULL when nothing was evicted). NULL when
 * all WSYNC_CARRIER_MAX carriers are pending (BUSY for the caller). */
wsync_carrier_t *wsync_carriers_use(wsync_carriers_t *t, void *stream, wsync_carrier_t *evicted);

/* The pending entries into out[WSYNC_CARRIER_MAX], in table order (out[0] is the one that
 * *consumed* is recorded on); returns how many. */
size_t wsync_carriers_pending(wsync_carriers_t *t, wsync_carrier_t **out);

/* Nothing pending any more (after record_consumed). */
void wsync_carriers_settle(wsync_carriers_t *t);

/* Drop the entry of `stream` (a destroyed stream, or a slot whose setup failed); returns its
 * event (NULL if none) for the backend to free. */
void *wsync_carriers_forget(wsync_carriers_t *t, void *stream);

#endif
