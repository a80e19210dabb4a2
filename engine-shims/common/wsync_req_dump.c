/* wsync_req_dumps (see wsync_request.h): jansson's compact text, with long strings escaped by a
 * table scan instead of jansson's per-character string writer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_request.h"

typedef struct text_buf {
    char *p;
    size_t len, cap;
    int failed;
} text_buf_t;

/* Room for n more bytes and a NUL; 0 when there is none (b->failed). */
static int grow(text_buf_t *b, size_t n)
{
    if (b->failed)
        return 0;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (p == NULL) {
            b->failed = 1;
            return 0;
        }
        b->p = p;
        b->cap = cap;
    }
    return 1;
}

static void put(text_buf_t *b, const char *s, size_t n)
{
    if (!grow(b, n))
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* v as json_dumps writes it (a scalar, or a container with no long string). */
static void put_jansson(text_buf_t *b, const json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (s == NULL)
        b->failed = 1;
    else
        put(b, s, strlen(s));
    free(s);
}

/* The index of the first byte of s[i, n) that is not written as itself ('"', '\\', control
 * characters, DEL, non-ASCII), or n: eight bytes a step (the lowest marked byte is exact). */
static size_t escape_at(const char *s, size_t i, size_t n)
{
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, s + i, 8);
        const uint64_t q = x ^ (ones * '"'), bs = x ^ (ones * '\\'), del = x ^ (ones * 0x7f);
        const uint64_t m = (((q - ones) & ~q) | ((bs - ones) & ~bs) | ((del - ones) & ~del) |
                            ((x - ones * 0x20) & ~x) | x) &
                           high;
        if (m != 0)
            return i + (size_t)__builtin_ctzll(m) / 8;
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
static int put_long_string(text_buf_t *b, const char *s, size_t n)
{
    if (!grow(b, 2 * n + 2)) /* every byte escaped, and the quotes */
        return 1;            /* b->failed says it */
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

static void put_value(text_buf_t *b, const json_t *v, int depth)
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
        put(b, "[", 1);
        json_array_foreach(v, i, e)
        {
            if (i > 0)
                put(b, ",", 1);
            put_value(b, e, depth - 1);
        }
        put(b, "]", 1);
        return;
    }
    int first = 1;
    put(b, "{", 1);
    json_object_foreach((json_t *)v, k, e)
    {
        json_t *key = json_string_nocheck(k);
        if (!first)
            put(b, ",", 1);
        first = 0;
        if (key == NULL)
            b->failed = 1;
        else
            put_jansson(b, key);
        json_decref(key);
        put(b, ":", 1);
        put_value(b, e, depth - 1);
    }
    put(b, "}", 1);
}

char *wsync_req_dumps(const json_t *v)
{
    text_buf_t b = {0};
    if (v == NULL)
        return NULL;
    put_value(&b, v, 4);
    put(&b, "", 0);
    if (b.failed) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
