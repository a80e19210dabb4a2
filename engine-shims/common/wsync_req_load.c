/* wsync_req_loadb (see wsync_request.h): an engine request's long strings taken out by a scan,
 * the rest parsed by jansson. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_request.h"
#include "wsync_swar.h"

#define WSYNC_REQ_MAX_LONG 16 /* long values per request; more: json_loadb whole */

/* A byte that ends a fast run inside a string: '"', '\\', a control character or non-ASCII (the
 * last two send the request through json_loadb, which checks them). */
static int stop_byte(unsigned char c)
{
    return c == '"' || c == '\\' || c < 0x20 || c >= 0x80;
}

static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    return i;
}

/* Of the 8 bytes in x (little-endian), the stop bytes' high bits: '"', '\\', below 0x20, from
 * 0x80. The lowest set bit is exact (a borrow only marks bytes above a true match). */
static uint64_t stop_bits(uint64_t x)
{
    return wsync_swar_eq(x, '"') | wsync_swar_eq(x, '\\') | wsync_swar_below(x, 0x20) |
           wsync_swar_high(x);
}

/* The index of the first stop byte in s[i, n), or n: eight bytes a step. */
static size_t next_stop(const char *s, size_t i, size_t n)
{
    for (; i + 8 <= n; i += 8) {
        const uint64_t m = stop_bits(wsync_swar_load(s + i));
        if (m != 0)
            return i + wsync_swar_first(m);
    }
    while (i < n && !stop_byte((unsigned char)s[i]))
        i++;
    return i;
}

/* The letters after a backslash that the fast path undoes itself. */
static int plain_escape(char e)
{
    switch (e) {
    case '"':
    case '\\':
    case '/':
    case 'b':
    case 'f':
    case 'n':
    case 'r':
    case 't':
        return 1;
    default:
        return 0;
    }
}

/* The first backslash in [p, stop), or stop. */
static const char *next_backslash(const char *p, const char *stop)
{
    while (p < stop && *p != '\\')
        p++;
    return p;
}

/* The string at s[i] == '"': the index after its closing quote, or 0 when it holds anything but
 * the plain escapes (\" \\ \/ \b \f \n \r \t) and printable ASCII. */
static size_t string_end(const char *s, size_t i, size_t n)
{
    for (i++; (i = next_stop(s, i, n)) < n;) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"')
            return i + 1;
        if (c != '\\' || i + 1 >= n || !plain_escape(s[i + 1]))
            return 0;
        i += 2;
    }
    return 0;
}

/* The value at s[i]: the index after it (strings, containers and scalars), or 0. */
static size_t value_end(const char *s, size_t i, size_t n)
{
    if (i >= n)
        return 0;
    if (s[i] == '"')
        return string_end(s, i, n);
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        while (i < n) {
            if (s[i] == '"') {
                if ((i = string_end(s, i, n)) == 0)
                    return 0;
                continue;
            }
            depth += s[i] == '{' || s[i] == '[';
            depth -= s[i] == '}' || s[i] == ']';
            i++;
            if (depth == 0)
                return i;
        }
        return 0;
    }
    while (i < n && strchr(",}] \t\n\r", s[i]) == NULL)
        i++;
    return i;
}

/* The string s[i..end) (quotes included) as a jansson string, escapes undone. */
static json_t *string_value(const char *s, size_t i, size_t end)
{
    const size_t n = end - i - 2;
    const char *at = memchr(s + i + 1, '\\', n);
    if (at == NULL)
        return json_stringn_nocheck(s + i + 1, n);
    char *b = malloc(n ? n : 1);
    size_t k = 0;
    for (const char *j = s + i + 1, *stop = s + end - 1; b != NULL && j < stop;) {
        const size_t run = (size_t)(at - j); /* bytes up to the next backslash */
        memcpy(b + k, j, run);
        k += run;
        if (at == stop)
            break;
        const char e = at[1];
        b[k++] = e == 'b'   ? '\b'
                 : e == 'f' ? '\f'
                 : e == 'n' ? '\n'
                 : e == 'r' ? '\r'
                 : e == 't' ? '\t'
                            : e;
        j = at + 2;
        at = next_backslash(j, stop);
    }
    json_t *v = b != NULL ? json_stringn_nocheck(b, k) : NULL;
    free(b);
    return v;
}

#define WSYNC_REQ_ENDS 8 /* string ends an array value remembers (one per engine rank) */

typedef struct long_value {
    size_t key, key_len;                 /* the key's bytes (no escapes) */
    size_t at, end;                      /* the value: a string or an array of strings */
    size_t ends[WSYNC_REQ_ENDS], n_ends; /* an array's first strings: where each ends */
} long_value_t;

/* The array at s[i] == '[' when it holds only strings, one of them long, with JSON's commas:
 * its end, else 0. The ends of its first WSYNC_REQ_ENDS strings go in v (when not NULL). */
static size_t long_string_array(const char *s, size_t i, size_t n, long_value_t *v)
{
    int any = 0;
    i = skip_ws(s, i + 1, n);
    if (i < n && s[i] == ']')
        return 0;
    while (i < n) {
        if (s[i] != '"')
            return 0;
        const size_t e = string_end(s, i, n);
        if (e == 0)
            return 0;
        if (v != NULL && v->n_ends < WSYNC_REQ_ENDS)
            v->ends[v->n_ends++] = e;
        any |= e - i - 2 >= WSYNC_REQ_LONG_STRING;
        i = skip_ws(s, e, n);
        if (i < n && s[i] == ']')
            return any ? i + 1 : 0;
        if (i >= n || s[i] != ',')
            return 0;
        i = skip_ws(s, i + 1, n);
    }
    return 0;
}

/* The top-level members whose values are long strings: 1 when the request can be taken this
 * way (*nv of them in v), 0 to leave it to json_loadb. */
static int scan(const char *s, size_t n, long_value_t *v, size_t *nv)
{
    size_t i = skip_ws(s, 0, n);
    *nv = 0;
    if (i >= n || s[i] != '{')
        return 0;
    for (i = skip_ws(s, i + 1, n); i < n && s[i] != '}';) {
        if (s[i] != '"')
            return 0;
        const size_t ke = string_end(s, i, n);
        if (ke == 0 || memchr(s + i + 1, '\\', ke - i - 2) != NULL)
            return 0;
        size_t at = skip_ws(s, ke, n);
        if (at >= n || s[at] != ':')
            return 0;
        at = skip_ws(s, at + 1, n);
        long_value_t lv = {.key = i + 1, .key_len = ke - i - 2, .at = at};
        const size_t ae = at < n && s[at] == '[' ? long_string_array(s, at, n, &lv) : 0;
        const size_t ve = ae != 0 ? ae : value_end(s, at, n); /* an array of strings: read once */
        if (ve == 0)
            return 0;
        if ((s[at] == '"' && ve - at - 2 >= WSYNC_REQ_LONG_STRING) || ae != 0) {
            for (size_t k = 0; k < *nv; k++) /* a key given twice: json_loadb's rules */
                if (v[k].key_len == ke - i - 2 &&
                    memcmp(s + v[k].key, s + i + 1, v[k].key_len) == 0)
                    return 0;
            if (*nv == WSYNC_REQ_MAX_LONG)
                return 0;
            lv.end = ve;
            v[(*nv)++] = lv;
        }
        i = skip_ws(s, ve, n);
        if (i < n && s[i] == ',')
            i = skip_ws(s, i + 1, n);
    }
    return i < n;
}

/* Long value v as jansson values. */
static json_t *long_json(const char *s, const long_value_t *v)
{
    if (s[v->at] == '"')
        return string_value(s, v->at, v->end);
    json_t *a = json_array();
    size_t k = 0;
    for (size_t i = skip_ws(s, v->at + 1, v->end); a != NULL && s[i] == '"'; k++) {
        const size_t e = k < v->n_ends ? v->ends[k] : string_end(s, i, v->end);
        if (json_array_append_new(a, string_value(s, i, e)) != 0) {
            json_decref(a);
            return NULL;
        }
        i = skip_ws(s, e, v->end);
        if (s[i] == ',')
            i = skip_ws(s, i + 1, v->end);
    }
    return a;
}

json_t *wsync_req_loadb(const char *text, size_t len, json_error_t *err)
{
    long_value_t v[WSYNC_REQ_MAX_LONG];
    size_t nv = 0;
    if (text == NULL || !scan(text, len, v, &nv) || nv == 0)
        return json_loadb(text, len, 0, err);
    /* the request with each long value replaced by null, parsed; then the values set */
    char *rest = malloc(len + 1);
    if (rest == NULL)
        return json_loadb(text, len, 0, err);
    size_t k = 0, from = 0;
    for (size_t i = 0; i < nv; i++) {
        memcpy(rest + k, text + from, v[i].at - from);
        k += v[i].at - from;
        memcpy(rest + k, "null", 4);
        k += 4;
        from = v[i].end;
    }
    memcpy(rest + k, text + from, len - from);
    k += len - from;
    json_t *req = json_loadb(rest, k, 0, err);
    free(rest);
    for (size_t i = 0; req != NULL && i < nv; i++) {
        char key[256];
        json_t *val = v[i].key_len < sizeof(key) ? long_json(text, &v[i]) : NULL;
        if (val == NULL) { /* out of memory or a key too long to copy: the slow way */
            json_decref(req);
            return json_loadb(text, len, 0, err);
        }
        memcpy(key, text + v[i].key, v[i].key_len);
        key[v[i].key_len] = '\0';
        if (!json_is_null(json_object_get(req, key))) { /* given again with a short value */
            json_decref(val);
            json_decref(req);
            return json_loadb(text, len, 0, err);
        }
        json_object_set_new(req, key, val);
    }
    return req;
}
