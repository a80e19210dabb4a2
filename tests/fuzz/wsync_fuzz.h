/* Shared by the fuzz harnesses: the libFuzzer entry point and a check that aborts (a finding)
 * when an invariant a parser promises does not hold. */
#ifndef WSYNC_FUZZ_H
#define WSYNC_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define WSYNC_FUZZ_CHECK(cond)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
