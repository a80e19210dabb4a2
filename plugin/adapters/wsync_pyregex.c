/* Python-re subset → POSIX ERE translation, whole-string matching. */
#include "wsync_pyregex.h"

#include <stdlib.h>
#include <string.h>

#include "wsync_error.h"

typedef struct wsync_rxbuf {
    char *s;
    size_t len, cap;
} wsync_rxbuf_t;

static int wsync_rx_put(wsync_rxbuf_t *b, const char *s)
{
    size_t n = strlen(s);
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *p = realloc(b->s, cap);
        if (p == NULL)
            return -1;
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n + 1);
    b->len += n;
    return 0;
}

static int wsync_rx_putc(wsync_rxbuf_t *b, char c)
{
    char s[2] = {c, 0};
    return wsync_rx_put(b, s);
}

/* Bracket-expression body for a class escape, or NULL. */
static const char *wsync_rx_class(char c)
{
    switch (c) {
    case 'd':
        return "0-9";
    case 'w':
        return "A-Za-z0-9_";
    case 's':
        return " \t\n\r\f\v";
    default:
        return NULL;
    }
}

/* Limits that keep a hostile pattern from making regcomp() explode (memory and time grow with
 * counted and stacked repetitions). PEFT patterns are short module-name regexes. */
#define WSYNC_RX_MAX_PATTERN 1024u
#define WSYNC_RX_MAX_COUNT 64u       /* the largest m or n in {m,n} */
#define WSYNC_RX_MAX_QUANTIFIERS 32u /* quantifiers in one pattern */

/* Length of a counted repetition "{m}", "{m,}" or "{m,n}" at p (0 if p does not start one);
 * *max gets the largest number in it. */
static size_t wsync_rx_counted(const char *p, unsigned long *max)
{
    size_t i = 1;
    int digits = 0, comma = 0;
    unsigned long cur = 0;
    *max = 0;
    for (; p[i] != '\0' && p[i] != '}'; i++) {
        if (p[i] >= '0' && p[i] <= '9') {
            cur = cur * 10u + (unsigned long)(p[i] - '0');
            if (cur > 100000u)
                cur = 100000u;
            digits = 1;
        } else if (p[i] == ',' && !comma && digits) {
            comma = 1;
            *max = cur;
            cur = 0;
        } else {
            return 0;
        }
    }
    if (p[i] != '}' || !digits)
        return 0;
    if (cur > *max)
        *max = cur;
    return i + 1;
}

/* Translate `p` and append to b. Returns NULL on success, else a static reason. */
static const char *wsync_rx_translate(wsync_rxbuf_t *b, const char *p)
{
    int in_bracket = 0;
    int after_quantifier = 0; /* the last thing emitted was a quantifier */
    unsigned quantifiers = 0;
    if (strlen(p) > WSYNC_RX_MAX_PATTERN)
        return "more than 1024 characters";
    for (size_t i = 0; p[i] != '\0'; i++) {
        char c = p[i];
        int rc = 0;
        if (!in_bracket && (c == '*' || c == '+' || c == '?' || c == '{')) {
            unsigned long count = 0;
            size_t n = c == '{' ? wsync_rx_counted(p + i, &count) : 1;
            if (n == 0) { /* a '{' that starts no counted repetition is literal, as in Python */
                rc = wsync_rx_put(b, "\\{");
                after_quantifier = 0;
                if (rc != 0)
                    return "out of memory";
                continue;
            }
            if (after_quantifier)
                return "a repeated quantifier (\"multiple repeat\" in Python)";
            if (count > WSYNC_RX_MAX_COUNT)
                return "a counted repetition above 64";
            if (++quantifiers > WSYNC_RX_MAX_QUANTIFIERS)
                return "more than 32 quantifiers";
            for (size_t k = 0; k < n && rc == 0; k++)
                rc = wsync_rx_putc(b, p[i + k]);
            i += n - 1;
            if (p[i + 1] == '?') /* lazy → greedy: same whole-string language */
                i++;
            after_quantifier = 1;
            if (rc != 0)
                return "out of memory";
            continue;
        }
        after_quantifier = 0;
        if (!in_bracket && c == '}') {
            if (wsync_rx_put(b, "\\}") != 0)
                return "out of memory";
            continue;
        }
        if (in_bracket) {
            if (c == ']' && !(in_bracket == 1)) {
                in_bracket = 0;
                rc = wsync_rx_putc(b, c);
            } else if (c == '\\') {
                char e = p[++i];
                const char *cls = wsync_rx_class(e);
                if (e == '\0')
                    return "a trailing backslash";
                if (cls)
                    rc = wsync_rx_put(b, cls);
                else if (e == ']' || e == '-' || e == '^' || e == '[')
                    return "an escaped ']', '-', '^' or '[' inside [...]";
                else if (strchr(".\\*+?(){}|$/_:", e))
                    rc = wsync_rx_putc(b, e);
                else
                    return "an escape POSIX cannot express inside [...]";
                in_bracket = 2;
            } else {
                /* in_bracket == 1: first member, where ']' (and '^' before it) are literal. */
                if (!(in_bracket == 1 && c == '^'))
                    in_bracket = 2;
                rc = wsync_rx_putc(b, c);
            }
        } else if (c == '[') {
            in_bracket = 1;
            rc = wsync_rx_putc(b, c);
        } else if (c == '\\') {
            char e = p[++i];
            const char *cls = wsync_rx_class((char)(e | 0x20));
            if (e == '\0')
                return "a trailing backslash";
            if (cls && e >= 'a') {
                rc = wsync_rx_putc(b, '[') || wsync_rx_put(b, cls) || wsync_rx_putc(b, ']');
            } else if (cls) {
                rc = wsync_rx_put(b, "[^") || wsync_rx_put(b, cls) || wsync_rx_putc(b, ']');
            } else if (strchr(".\\*+?()[]{}|^$", e)) {
                rc = wsync_rx_putc(b, '\\') || wsync_rx_putc(b, e);
            } else if (strchr("/_-:,=<>!\"'#&~@%", e)) {
                rc = wsync_rx_putc(b, e);
            } else {
                return "an escape POSIX cannot express (\\b, \\A, \\Z, back-references, ...)";
            }
        } else if (c == '(' && p[i + 1] == '?') {
            if (p[i + 2] != ':')
                return "a (?...) group other than (?:...) (look-around, named group, flags)";
            rc = wsync_rx_putc(b, '(');
            i += 2;
        } else {
            rc = wsync_rx_putc(b, c);
        }
        if (rc != 0)
            return "out of memory";
    }
    if (in_bracket)
        return "an unterminated [...]";
    return NULL;
}

wsync_result_t wsync_pyregex_compile(wsync_pyregex_t *rx, const char *prefix_pattern,
                                     const char *pattern, const char *what, wsync_error_t *err)
{
    wsync_rxbuf_t b = {0};
    const char *why = NULL;
    rx->compiled = 0;
    if (wsync_rx_put(&b, "^(") != 0)
        why = "out of memory";
    if (!why && prefix_pattern && *prefix_pattern)
        why = wsync_rx_translate(&b, prefix_pattern);
    if (!why)
        why = wsync_rx_putc(&b, '(') ? "out of memory" : wsync_rx_translate(&b, pattern);
    if (!why && wsync_rx_put(&b, "))$") != 0)
        why = "out of memory";
    if (why) {
        free(b.s);
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER,
                          "%s: regex \"%s\" uses %s; use plain names or simple patterns", what,
                          pattern, why);
    }
    int rc = regcomp(&rx->re, b.s, REG_EXTENDED | REG_NOSUB);
    free(b.s);
    if (rc != 0) {
        char msg[96];
        regerror(rc, &rx->re, msg, sizeof(msg));
        return WSYNC_FAIL(err, WSYNC_ERR_BAD_ADAPTER, "%s: regex \"%s\" is invalid: %s", what,
                          pattern, msg);
    }
    rx->compiled = 1;
    return WSYNC_OK;
}

int wsync_pyregex_match(const wsync_pyregex_t *rx, const char *s)
{
    return rx->compiled && regexec(&rx->re, s, 0, NULL, 0) == 0;
}

void wsync_pyregex_free(wsync_pyregex_t *rx)
{
    if (rx != NULL && rx->compiled) {
        regfree(&rx->re);
        rx->compiled = 0;
    }
}
