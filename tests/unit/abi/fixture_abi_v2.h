/* A hypothetical ABI v2 for the negotiation tests only: the consumer table of v1 with one
 * member appended, the way a real v2 would grow (docs/ABI.md). */
#ifndef WSYNC_FIXTURE_ABI_V2_H
#define WSYNC_FIXTURE_ABI_V2_H

#include "wsync_abi.h"

typedef struct fixture_consumer_v2 {
    wsync_consumer_ops_v1_t v1; /* struct_size covers future_op when the plugin speaks v2 */
    wsync_result_t (*future_op)(int x);
} fixture_consumer_v2_t;

#endif
