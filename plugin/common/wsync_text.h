/* A growable NUL-terminated text (the manifest emit, the request dump): room is asked for before
 * each write, and the first allocation that fails marks the text bad, after which every write is
 * dropped (the caller checks bad once, at the end). Inline: its writers emit thousands of short
 * pieces per manifest. */
#ifndef WSYNC_COMMON_TEXT_H
#define WSYNC_COMMON_TEXT_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct wsync_text {
    char *p;
    size_t len, cap;
    int bad; /* out of memory */
} wsync_text_t;

/* Where n more bytes (and a NUL after them) go; NULL when there is no room (t->bad). */
static inline char *wsync_text_room(wsync_text_t *t, size_t n)
{
    if (t->bad)
        return NULL;
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        while (cap < t->len + n + 1)
            cap *= 2;
        char *p = realloc(t->p, cap);
        if (p == NULL) {
            t->bad = 1;
            return NULL;
        }
        t->p = p;
        t->cap = cap;
    }
    return t->p + t->len;
}

static inline void wsync_text_put(wsync_text_t *t, const char *s, size_t n)
{
    char *w = wsync_text_room(t, n);
    if (w != NULL) {
        memcpy(w, s, n);
        t->len += n;
        t->p[t->len] = '\0';
    }
}

#endif
