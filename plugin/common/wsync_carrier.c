/* The stream-carrier table shared by both backends (wsync_carrier.h). */
#include "wsync_carrier.h"

#include <string.h>

wsync_carrier_t *wsync_carriers_use(wsync_carriers_t *t, void *stream, wsync_carrier_t *evicted)
{
    wsync_carrier_t *u = NULL;
    memset(evicted, 0, sizeof(*evicted));
    for (size_t i = 0; i < t->n; i++)
        if (t->at[i].stream == stream)
            return &t->at[i];
    if (t->n < WSYNC_CARRIER_MAX) {
        u = &t->at[t->n++];
        memset(u, 0, sizeof(*u));
    } else {
        for (size_t i = 0; i < t->n && u == NULL; i++)
            if (!t->at[i].pending)
                u = &t->at[i];
        if (u == NULL)
            return NULL;
        *evicted = *u;
    }
    u->stream = stream;
    u->mark = 0;
    u->pending = 0;
    return u;
}

size_t wsync_carriers_pending(wsync_carriers_t *t, wsync_carrier_t **out)
{
    size_t k = 0;
    for (size_t i = 0; i < t->n; i++)
        if (t->at[i].pending)
            out[k++] = &t->at[i];
    return k;
}

void wsync_carriers_settle(wsync_carriers_t *t)
{
    for (size_t i = 0; i < t->n; i++)
        t->at[i].pending = 0;
}

void *wsync_carriers_forget(wsync_carriers_t *t, void *stream)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->at[i].stream == stream) {
            void *ev = t->at[i].event;
            t->at[i] = t->at[--t->n];
            return ev;
        }
    return NULL;
}
