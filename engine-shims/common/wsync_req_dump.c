/* wsync_req_dumps (see wsync_request.h): jansson's compact text, with long strings escaped by a
 * table scan instead of jansson's per-character string writer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_request.h"
#include "wsync_swar.h"
#include "wsync_text.h"

/* v as json_dumps writes it (a scalar, or a container with no long string). */
static void put_jansson(wsync_text_t *b, const json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (s == NULL)
        b->bad = 1;
    else
        wsync_text_put(b, s, strlen(s));
    free(s);
}

/* The index of the first byte of s[i, n) that is not written as itself ('"', '\\', control
 * characters, DEL, non-ASCII), or n: eight bytes a step (the lowest marked byte is exact). */
static size_t escape_at(const char *s, size_t i, size_t n)
{
    for (; i + 8 <= n; i += 8) {
        const uint64_t x = wsync_swar_load(s + i);
        const uint64_t m = wsync_swar_eq(x, '"') | wsync_swar_eq(x, '\\') | wsync_swar_eq(x, 0x7f) |
                           wsync_swar_below(x, 0x20) | wsync_swar_high(x);
        if (m != 0)
            return i + wsync_swar_first(m);
    }
    for (; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x7f)
            break;
    }
    return i;
}

/* A long string of printable ASCII: quoted, '"' and '\\' escaped, as jansson writes it; 0 when
 * it holds anything else (control characters, non-ASCII), which jansson's writer then takes. */
static int put_long_string(wsync_text_t *b, const char *s, size_t n)
{
    if (wsync_text_room(b, 2 * n + 2) == NULL) /* every byte escaped, and the quotes */
        return 1;                              /* b->bad says it */
    char *const start = b->p + b->len, *o = start;
    *o++ = '"';
    for (size_t i = 0; i < n;) {
        const size_t j = escape_at(s, i, n);
        memcpy(o, s + i, j - i);
        o += j - i;
        if (j == n)
            break;
        const unsigned char c = (unsigned char)s[j];
        if (c < 0x20 || c >= 0x7f) /* not ours: nothing written */
            return 0;
        *o++ = '\\';
        *o++ = (char)c;
        i = j + 1;
    }
    *o++ = '"';
    b->len += (size_t)(o - start);
    b->p[b->len] = '\0';
    return 1;
}

static int is_long(const json_t *v)
{
    return json_is_string(v) && json_string_length(v) >= WSYNC_REQ_LONG_STRING;
}

/* Whether v holds a long string at most `depth` levels down. */
static int long_inside(const json_t *v, int depth)
{
    const char *k;
    const json_t *e;
    size_t i;
    if (is_long(v))
        return 1;
    if (depth == 0)
        return 0;
    if (json_is_array(v)) {
        json_array_foreach(v, i, e) if (long_inside(e, depth - 1)) return 1;
    } else if (json_is_object(v)) {
        json_object_foreach((json_t *)v, k, e) if (long_inside(e, depth - 1)) return 1;
    }
    return 0;
}

static void put_value(wsync_text_t *b, const json_t *v, int depth)
{
    const char *k;
    const json_t *e;
    size_t i;
    if (is_long(v) && put_long_string(b, json_string_value(v), json_string_length(v)))
        return;
    if (!long_inside(v, depth) || (!json_is_array(v) && !json_is_object(v))) {
        put_jansson(b, v);
        return;
    }
    if (json_is_array(v)) {
        wsync_text_put(b, "[", 1);
        json_array_foreach(v, i, e)
        {
            if (i > 0)
                wsync_text_put(b, ",", 1);
            put_value(b, e, depth - 1);
        }
        wsync_text_put(b, "]", 1);
        return;
    }
    int first = 1;
    wsync_text_put(b, "{", 1);
    json_object_foreach((json_t *)v, k, e)
    {
        json_t *key = json_string_nocheck(k);
        if (!first)
            wsync_text_put(b, ",", 1);
        first = 0;
        if (key == NULL)
            b->bad = 1;
        else
            put_jansson(b, key);
        json_decref(key);
        wsync_text_put(b, ":", 1);
        put_value(b, e, depth - 1);
    }
    wsync_text_put(b, "}", 1);
}

char *wsync_req_dumps(const json_t *v)
{
    wsync_text_t b = {0};
    if (v == NULL)
        return NULL;
    put_value(&b, v, 4);
    wsync_text_put(&b, "", 0);
    if (b.bad) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
