#!/usr/bin/env python3
"""Reference wsync64 (docs/DESIGN.md § 2), written from the definition and independent of the C
code. Prints the vector table of wsync64_vectors.h: python3 wsync64_vectors.py > wsync64_vectors.h
"""

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def wsync64(data):
    padded = data + b"\0" * (-len(data) % 8)
    total = 0
    for j in range(len(padded) // 8):
        w = int.from_bytes(padded[8 * j:8 * j + 8], "little")
        total = (total + mix(w ^ ((j * GOLDEN) & M64))) & M64
    return mix(total ^ len(data))


def fill(pattern, n):
    if pattern == 0:  # zeros
        return bytes(n)
    if pattern == 1:  # all 0xff
        return b"\xff" * n
    if pattern == 2:  # byte index
        return bytes(i & 0xFF for i in range(n))
    if pattern == 3:  # (i * 131 + 17) mod 251
        return bytes((i * 131 + 17) % 251 for i in range(n))
    out = bytearray(n)  # pattern 4: 32-bit LCG, top byte
    x = 1
    for i in range(n):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        out[i] = x >> 24
    return bytes(out)


LENGTHS = [0, 1, 7, 8, 9, 15, 16, 17, 255, 4096, 1000003]
PATTERNS = ["WSYNC64_PAT_ZERO", "WSYNC64_PAT_ONES", "WSYNC64_PAT_INDEX", "WSYNC64_PAT_MUL",
            "WSYNC64_PAT_LCG"]

HEADER = """/* wsync64 test vectors shared by the host and CUDA digest tests. The expected values come
 * from tests/unit/common/wsync64_vectors.py, a reference written from docs/DESIGN.md § 2
 * independently of plugin/common/wsync_digest.c; regenerate with
 *   python3 tests/unit/common/wsync64_vectors.py > tests/unit/common/wsync64_vectors.h
 *   clang-format -i tests/unit/common/wsync64_vectors.h */
#ifndef WSYNC64_VECTORS_H
#define WSYNC64_VECTORS_H

#include <stddef.h>
#include <stdint.h>

typedef enum wsync64_pattern {
    WSYNC64_PAT_ZERO = 0,  /* 0x00 */
    WSYNC64_PAT_ONES = 1,  /* 0xff */
    WSYNC64_PAT_INDEX = 2, /* i & 0xff */
    WSYNC64_PAT_MUL = 3,   /* (i * 131 + 17) % 251 */
    WSYNC64_PAT_LCG = 4    /* x = x * 1103515245 + 12345 (mod 2^32) from x = 1; top byte */
} wsync64_pattern_t;

typedef struct wsync64_vector {
    size_t length;
    wsync64_pattern_t pattern;
    uint64_t expected;
} wsync64_vector_t;

/* Fill buf[0..n) with `pattern`. */
static inline void wsync64_vector_fill(wsync64_pattern_t pattern, unsigned char *buf, size_t n)
{
    uint32_t x = 1;
    for (size_t i = 0; i < n; i++) {
        switch (pattern) {
        case WSYNC64_PAT_ZERO: buf[i] = 0; break;
        case WSYNC64_PAT_ONES: buf[i] = 0xff; break;
        case WSYNC64_PAT_INDEX: buf[i] = (unsigned char)(i & 0xff); break;
        case WSYNC64_PAT_MUL: buf[i] = (unsigned char)((i * 131 + 17) % 251); break;
        case WSYNC64_PAT_LCG:
            x = x * 1103515245u + 12345u;
            buf[i] = (unsigned char)(x >> 24);
            break;
        }
    }
}

static const wsync64_vector_t wsync64_vectors[] = {"""

FOOTER = """};

#define WSYNC64_N_VECTORS (sizeof(wsync64_vectors) / sizeof(wsync64_vectors[0]))

#endif"""


def main():
    print(HEADER)
    for n in LENGTHS:
        for p, name in enumerate(PATTERNS):
            d = wsync64(fill(p, n))
            print("    {%d, %s, 0x%016xull}," % (n, name, d))
    print(FOOTER)


if __name__ == "__main__":
    main()
