/* Eight bytes a step (SWAR) for the text scanners (UTF-8 check, request load and dump): masks
 * whose high bits mark the bytes of a little-endian word that match. Only the lowest marked byte
 * is exact (a borrow can mark bytes above a true match), which is all a scan for the first one
 * needs; the masks OR together with that property kept. */
#ifndef WSYNC_COMMON_SWAR_H
#define WSYNC_COMMON_SWAR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define WSYNC_SWAR_ONES 0x0101010101010101ull
#define WSYNC_SWAR_HIGH 0x8080808080808080ull

static inline uint64_t wsync_swar_load(const void *p)
{
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}

/* the bytes equal to c */
static inline uint64_t wsync_swar_eq(uint64_t x, unsigned char c)
{
    const uint64_t y = x ^ (WSYNC_SWAR_ONES * c);
    return (y - WSYNC_SWAR_ONES) & ~y & WSYNC_SWAR_HIGH;
}

/* the bytes below c (c at most 0x80) */
static inline uint64_t wsync_swar_below(uint64_t x, unsigned char c)
{
    return (x - WSYNC_SWAR_ONES * c) & ~x & WSYNC_SWAR_HIGH;
}

/* the bytes from 0x80 (not ASCII) */
static inline uint64_t wsync_swar_high(uint64_t x)
{
    return x & WSYNC_SWAR_HIGH;
}

/* The index of the lowest marked byte of a mask that is not 0. */
static inline size_t wsync_swar_first(uint64_t m)
{
    return (size_t)__builtin_ctzll(m) / 8;
}

#endif
