/* Standard base64 (RFC 4648, with padding). */
#ifndef WSYNC_COMMON_BASE64_H
#define WSYNC_COMMON_BASE64_H

#include <stddef.h>
#include <stdint.h>

/* Bytes needed for the encoding of n bytes, NUL included. */
size_t wsync_base64_encoded_size(size_t n);
/* Writes NUL-terminated text into out (capacity from wsync_base64_encoded_size). */
void wsync_base64_encode(const uint8_t *in, size_t n, char *out);
/* Strict decode: rejects bad characters, bad padding and lengths not a multiple of 4.
 * Returns decoded length, or -1 on malformed input, or -2 when it would exceed cap. */
long wsync_base64_decode(const char *in, uint8_t *out, size_t cap);

#endif
