/* Fuzz target: wsync_wire_recv, the length-prefixed framing, fed through a socketpair.
 * The input bytes are written to one end, which is then closed; the other end receives
 * messages until an error. Invariants: every message received is at most WSYNC_WIRE_MAX_MESSAGE
 * bytes, NUL-terminated, and equal to the bytes framed in the input; the end of the stream is
 * reported as an error (PEER_GONE or a clear refusal), never as a message; the receiver never
 * hangs (bounded by its timeout). Then send → recv of the input as one message is the identity. */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wsync_fuzz.h"
#include "wsync_wire.h"

#define MAX_INPUT (64u << 10) /* below the socket buffer: the write never blocks */

static void write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        WSYNC_FUZZ_CHECK(w > 0);
        p += w;
        n -= (size_t)w;
    }
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void frames(const uint8_t *data, size_t size)
{
    int sv[2];
    WSYNC_FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    write_all(sv[1], data, size);
    close(sv[1]);

    size_t pos = 0;
    for (;;) {
        char *buf = NULL;
        size_t len = 0;
        wsync_error_t err = {.struct_size = sizeof(err)};
        wsync_result_t r = wsync_wire_recv(sv[0], &buf, &len, 1000, &err);
        if (r != WSYNC_OK) {
            WSYNC_FUZZ_CHECK(err.code == r && err.message[0] != '\0');
            WSYNC_FUZZ_CHECK(r != WSYNC_ERR_TIMEOUT); /* the peer closed: never wait for more */
            break;
        }
        /* A message is accepted only when all of it was in the input. */
        WSYNC_FUZZ_CHECK(pos + 4 <= size);
        uint32_t n = le32(data + pos);
        WSYNC_FUZZ_CHECK(n == len && len <= WSYNC_WIRE_MAX_MESSAGE);
        WSYNC_FUZZ_CHECK(pos + 4 + len <= size);
        WSYNC_FUZZ_CHECK(buf != NULL && buf[len] == '\0');
        WSYNC_FUZZ_CHECK(len == 0 || memcmp(buf, data + pos + 4, len) == 0);
        pos += 4 + len;
        free(buf);
    }
    close(sv[0]);
}

static void round_trip(const uint8_t *data, size_t size)
{
    int sv[2];
    wsync_error_t err = {.struct_size = sizeof(err)};
    WSYNC_FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    WSYNC_FUZZ_CHECK(wsync_wire_send(sv[1], data, size, &err) == WSYNC_OK);
    char *buf = NULL;
    size_t len = 0;
    WSYNC_FUZZ_CHECK(wsync_wire_recv(sv[0], &buf, &len, 1000, &err) == WSYNC_OK);
    WSYNC_FUZZ_CHECK(len == size && buf[len] == '\0');
    WSYNC_FUZZ_CHECK(size == 0 || memcmp(buf, data, size) == 0);
    free(buf);
    close(sv[0]);
    close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > MAX_INPUT)
        return 0;
    frames(data, size);
    round_trip(data, size);
    return 0;
}
