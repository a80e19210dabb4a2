/* wsync64: order-independent, index-keyed 64-bit digest (docs/DESIGN.md §2). Not cryptographic.
 * Word j = the j-th little-endian 8-byte word of the tensor, tail zero-padded;
 * digest = mix(sum_j mix(w_j ^ (j * 0x9E3779B97F4A7C15)) ^ nbytes), mix = splitmix64 finalizer.
 * The CUDA kernel computes the same function; tests/unit/common keeps the shared vectors. */
#ifndef WSYNC_COMMON_DIGEST_H
#define WSYNC_COMMON_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#define WSYNC64_GOLDEN 0x9E3779B97F4A7C15ull

static inline uint64_t wsync_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Streaming state, so a 2-D op (rows concatenated) can be digested row by row. */
typedef struct wsync64_state {
    uint64_t sum;
    uint64_t nbytes;  /* bytes consumed so far */
    uint64_t partial; /* bytes of an incomplete word, little-endian */
    unsigned npartial;
} wsync64_state_t;

void wsync64_init(wsync64_state_t *s);
void wsync64_update(wsync64_state_t *s, const void *p, size_t n);
uint64_t wsync64_final(const wsync64_state_t *s);

/* One-shot. */
uint64_t wsync64(const void *p, size_t n);

/* "wsync64:<16 lowercase hex>" into buf (>= 25 bytes); parse returns 0 on success, -1 if the text
 * is not exactly that form. */
void wsync64_format(uint64_t d, char *buf);
int wsync64_parse(const char *text, uint64_t *out);

#endif
