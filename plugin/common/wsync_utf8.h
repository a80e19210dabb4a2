/* UTF-8 validation by the rules of jansson's own check: names travel as JSON strings. */
#ifndef WSYNC_COMMON_UTF8_H
#define WSYNC_COMMON_UTF8_H

#include <stddef.h>

/* Length of the UTF-8 sequence at s (1-4), or 0 when it is not valid UTF-8 (no overlong forms,
 * no surrogates, nothing above U+10FFFF). s[0] must not be NUL. */
size_t wsync_utf8_len(const unsigned char *s);
/* Byte index of the first invalid sequence of the NUL-terminated s, or (size_t)-1 if none. */
size_t wsync_utf8_invalid_at(const char *s);
/* The same for the len bytes at s (a NUL among them is invalid): ASCII eight bytes a step, for
 * texts of megabytes (a manifest of thousands of tensors). */
size_t wsync_utf8_invalid_n(const char *s, size_t len);

#endif
