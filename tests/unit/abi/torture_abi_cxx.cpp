// The ABI headers in a C++ translation unit (g++ -std=c++17 -pedantic -Wall -Wextra -Werror),
// as an engine written in C++ includes them: WSYNC_HAS_OP and WSYNC_HAS_FIELD compile without
// GNU extensions and answer the growth rule (a smaller struct_size hides the member), and the
// client library's wsync_strerror links from C++.
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "wsync_abi.h"
#include "wsync_client.h"

static wsync_result_t fake_copy(wsync_consumer_t *, wsync_handle_t *, wsync_stream_t, uint64_t,
                                const wsync_copy_op_t *, size_t, uint32_t, wsync_error_t *)
{
    return WSYNC_OK;
}

int main()
{
    int passed = 0, failed = 0;
    auto check = [&](bool ok, const char *what) {
        ok ? passed++ : failed++;
        if (!ok)
            std::printf("FAILED: %s\n", what);
    };
    wsync_consumer_ops_t t;
    std::memset(&t, 0, sizeof(t));
    t.struct_size = sizeof(t);
    t.copy_weights = fake_copy;
    check(WSYNC_HAS_OP(wsync_consumer_ops_t, &t, copy_weights), "copy_weights present");
    check(!WSYNC_HAS_OP(wsync_consumer_ops_t, &t, record_consumed), "NULL member absent");
    t.struct_size = offsetof(wsync_consumer_ops_t, copy_weights);
    check(!WSYNC_HAS_OP(wsync_consumer_ops_t, &t, copy_weights), "past struct_size absent");
    const wsync_consumer_ops_t *none = nullptr;
    check(!WSYNC_HAS_OP(wsync_consumer_ops_t, none, copy_weights), "NULL table");
    wsync_host_t h = {};
    h.struct_size = offsetof(wsync_host_t, log_level);
    check(WSYNC_HAS_FIELD(wsync_host_t, &h, log_user), "log_user inside");
    check(!WSYNC_HAS_FIELD(wsync_host_t, &h, log_level), "log_level outside");
    check(std::strcmp(wsync_strerror(WSYNC_ERR_BAD_MANIFEST), "malformed manifest") == 0,
          "wsync_strerror");
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
