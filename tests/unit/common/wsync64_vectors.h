/* wsync64 test vectors shared by the host and CUDA digest tests. The expected values come
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
        case WSYNC64_PAT_ZERO:
            buf[i] = 0;
            break;
        case WSYNC64_PAT_ONES:
            buf[i] = 0xff;
            break;
        case WSYNC64_PAT_INDEX:
            buf[i] = (unsigned char)(i & 0xff);
            break;
        case WSYNC64_PAT_MUL:
            buf[i] = (unsigned char)((i * 131 + 17) % 251);
            break;
        case WSYNC64_PAT_LCG:
            x = x * 1103515245u + 12345u;
            buf[i] = (unsigned char)(x >> 24);
            break;
        }
    }
}

static const wsync64_vector_t wsync64_vectors[] = {
    {0, WSYNC64_PAT_ZERO, 0x0000000000000000ull},
    {0, WSYNC64_PAT_ONES, 0x0000000000000000ull},
    {0, WSYNC64_PAT_INDEX, 0x0000000000000000ull},
    {0, WSYNC64_PAT_MUL, 0x0000000000000000ull},
    {0, WSYNC64_PAT_LCG, 0x0000000000000000ull},
    {1, WSYNC64_PAT_ZERO, 0x5692161d100b05e5ull},
    {1, WSYNC64_PAT_ONES, 0x4801cc271adb45ceull},
    {1, WSYNC64_PAT_INDEX, 0x5692161d100b05e5ull},
    {1, WSYNC64_PAT_MUL, 0xf8a9cea276b02ba5ull},
    {1, WSYNC64_PAT_LCG, 0xfc3d460fdc85ee8eull},
    {7, WSYNC64_PAT_ZERO, 0x12ae30237b17df14ull},
    {7, WSYNC64_PAT_ONES, 0xe7bc0a9ecb7253c8ull},
    {7, WSYNC64_PAT_INDEX, 0xb3552a84cbfe9348ull},
    {7, WSYNC64_PAT_MUL, 0xe7ee94ada2ef0ba9ull},
    {7, WSYNC64_PAT_LCG, 0x35fed2d4998352cfull},
    {8, WSYNC64_PAT_ZERO, 0xd56b1fbb9ceba9e8ull},
    {8, WSYNC64_PAT_ONES, 0x71dddfc3c55c1e5full},
    {8, WSYNC64_PAT_INDEX, 0x942ddfd0def53671ull},
    {8, WSYNC64_PAT_MUL, 0x0ffa0e43f27e8099ull},
    {8, WSYNC64_PAT_LCG, 0x1e0b40ca6fb6c7d7ull},
    {9, WSYNC64_PAT_ZERO, 0x4ee0e777b18c0cb8ull},
    {9, WSYNC64_PAT_ONES, 0x81509ec48dfa6e1eull},
    {9, WSYNC64_PAT_INDEX, 0xe97ce9f5e1712761ull},
    {9, WSYNC64_PAT_MUL, 0xfb05ba1b80c4ec36ull},
    {9, WSYNC64_PAT_LCG, 0x366c55dc3905e186ull},
    {15, WSYNC64_PAT_ZERO, 0x37c058f06764d144ull},
    {15, WSYNC64_PAT_ONES, 0x27804f182cc2c06full},
    {15, WSYNC64_PAT_INDEX, 0x1db820b933f64ad5ull},
    {15, WSYNC64_PAT_MUL, 0x6fcae4eec1458c42ull},
    {15, WSYNC64_PAT_LCG, 0x9d52a6cdfba6a7c0ull},
    {16, WSYNC64_PAT_ZERO, 0x54299505cbf550b8ull},
    {16, WSYNC64_PAT_ONES, 0x32e06cf65dc0b3e7ull},
    {16, WSYNC64_PAT_INDEX, 0xa9c24001dfaa5488ull},
    {16, WSYNC64_PAT_MUL, 0x6b760cefa431fe18ull},
    {16, WSYNC64_PAT_LCG, 0x84aff7753a32229bull},
    {17, WSYNC64_PAT_ZERO, 0x6228dc766115b77full},
    {17, WSYNC64_PAT_ONES, 0x9dcd28191955d388ull},
    {17, WSYNC64_PAT_INDEX, 0x6657d8b87726b8b4ull},
    {17, WSYNC64_PAT_MUL, 0x8793b6ecde140f09ull},
    {17, WSYNC64_PAT_LCG, 0x52973f6f67fc40a8ull},
    {255, WSYNC64_PAT_ZERO, 0xab81b83188b42f1dull},
    {255, WSYNC64_PAT_ONES, 0x6ad4fe03ebfebb56ull},
    {255, WSYNC64_PAT_INDEX, 0x1c78615b4a5c0256ull},
    {255, WSYNC64_PAT_MUL, 0x99eebe17ca8307c2ull},
    {255, WSYNC64_PAT_LCG, 0x57077a9938e1cbc6ull},
    {4096, WSYNC64_PAT_ZERO, 0x7a4846ab938e31ccull},
    {4096, WSYNC64_PAT_ONES, 0x7370a2f897149cc7ull},
    {4096, WSYNC64_PAT_INDEX, 0x10de726214e46578ull},
    {4096, WSYNC64_PAT_MUL, 0xe874df4bf685566full},
    {4096, WSYNC64_PAT_LCG, 0xa82f7bb526e281b9ull},
    {1000003, WSYNC64_PAT_ZERO, 0xebbe4740e0b408b4ull},
    {1000003, WSYNC64_PAT_ONES, 0x3bd8d4519a43ef05ull},
    {1000003, WSYNC64_PAT_INDEX, 0x18b9d28564afeb05ull},
    {1000003, WSYNC64_PAT_MUL, 0x3e0fb046025c7bbfull},
    {1000003, WSYNC64_PAT_LCG, 0x4e9b4062f57b61a0ull},
};

#define WSYNC64_N_VECTORS (sizeof(wsync64_vectors) / sizeof(wsync64_vectors[0]))

#endif
