#define _GNU_SOURCE
/* Wire: round trips across fork (small and big), bounded waits, a vanished peer, lengths over the
 * maximum, the uid check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

/* Static functions (the peer check) are reached by including the module. */
#include "wsync_wire.c"

static char dir[64];
static char sock[128];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/wsync-wire-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(sock, sizeof(sock), "%s/s", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(sock);
    rmdir(dir);
    return 0;
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 131u + seed + (i >> 12));
}

static int child_status(pid_t pid)
{
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

/* Child: connect, send `n` patterned bytes, expect "ack:<n>" back. */
static int child_send(size_t n)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    unsigned char *msg = malloc(n + 1);
    char want[64], *reply = NULL;
    size_t len = 0;
    int fd = wsync_wire_connect(sock, 5000, &err);

    if (fd < 0 || msg == NULL)
        return 2;
    fill(msg, n, 7);
    if (wsync_wire_send(fd, msg, n, &err) != WSYNC_OK)
        return 3;
    if (wsync_wire_recv(fd, &reply, &len, 10000, &err) != WSYNC_OK)
        return 4;
    snprintf(want, sizeof(want), "ack:%zu", n);
    if (len != strlen(want) || strcmp(reply, want) != 0)
        return 5;
    free(reply);
    free(msg);
    close(fd);
    return 0;
}

static void roundtrip(size_t n)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    int lfd = wsync_wire_listen(sock, &err);
    char *buf = NULL, ack[64];
    unsigned char *want;
    size_t len = 0;
    pid_t pid;
    int fd;

    assert_true(lfd >= 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(child_send(n));
    fd = wsync_wire_accept(lfd, 5000, &err);
    assert_true(fd >= 0);
    assert_int_equal(wsync_wire_recv(fd, &buf, &len, 10000, &err), WSYNC_OK);
    assert_int_equal(len, n);
    assert_int_equal(buf[n], '\0');
    want = malloc(n + 1);
    fill(want, n, 7);
    assert_memory_equal(buf, want, n);
    snprintf(ack, sizeof(ack), "ack:%zu", n);
    assert_int_equal(wsync_wire_send(fd, ack, strlen(ack), &err), WSYNC_OK);
    assert_int_equal(child_status(pid), 0);
    free(want);
    free(buf);
    close(fd);
    close(lfd);
}

static void test_roundtrip_fork(void **state)
{
    (void)state;
    roundtrip(5);
}

static void test_big_message(void **state)
{
    (void)state;
    roundtrip(64u << 20);
}

static void test_empty_message(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    int sv[2];
    char *buf = NULL;
    size_t len = 99;

    (void)state;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(wsync_wire_send(sv[0], NULL, 0, &err), WSYNC_OK);
    assert_int_equal(wsync_wire_recv(sv[1], &buf, &len, 1000, &err), WSYNC_OK);
    assert_int_equal(len, 0);
    assert_string_equal(buf, "");
    free(buf);
    close(sv[0]);
    close(sv[1]);
}

static void test_recv_timeout(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    int sv[2];
    char *buf = (char *)1;
    size_t len = 1;
    double t0;

    (void)state;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    t0 = (double)wsync_wire_now_ms();
    assert_int_equal(wsync_wire_recv(sv[1], &buf, &len, 100, &err), WSYNC_ERR_TIMEOUT);
    assert_true((double)wsync_wire_now_ms() - t0 >= 90);
    assert_null(buf);
    assert_int_equal(err.code, WSYNC_ERR_TIMEOUT);
    /* Half a message then silence is a timeout too, not a short read. */
    err.code = WSYNC_OK;
    assert_int_equal(write(sv[0],
                           "\x10\x00\x00\x00"
                           "abc",
                           7),
                     7);
    assert_int_equal(wsync_wire_recv(sv[1], &buf, &len, 100, &err), WSYNC_ERR_TIMEOUT);
    close(sv[0]);
    close(sv[1]);
}

static void test_peer_gone(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    int sv[2];
    char *buf = NULL;
    size_t len = 0;

    (void)state;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    close(sv[0]);
    assert_int_equal(wsync_wire_recv(sv[1], &buf, &len, 1000, &err), WSYNC_ERR_PEER_GONE);
    assert_non_null(strstr(err.message, "closed"));
    /* No SIGPIPE: sending to a closed peer is an error. */
    err.code = WSYNC_OK;
    assert_int_equal(wsync_wire_send(sv[1], "x", 1, &err), WSYNC_ERR_PEER_GONE);
    close(sv[1]);

    /* Closed in the middle of a message. */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(write(sv[0],
                           "\x10\x00\x00\x00"
                           "abc",
                           7),
                     7);
    close(sv[0]);
    err.code = WSYNC_OK;
    assert_int_equal(wsync_wire_recv(sv[1], &buf, &len, 1000, &err), WSYNC_ERR_PEER_GONE);
    assert_non_null(strstr(err.message, "middle"));
    close(sv[1]);
}

static void test_oversize(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    unsigned char hdr[4];
    uint32_t n = WSYNC_WIRE_MAX_MESSAGE + 1;
    int sv[2];
    char *buf = NULL;
    size_t len = 0;

    (void)state;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    for (int i = 0; i < 4; i++)
        hdr[i] = (unsigned char)(n >> (8 * i));
    assert_int_equal(write(sv[0], hdr, 4), 4);
    assert_int_equal(wsync_wire_recv(sv[1], &buf, &len, 1000, &err), WSYNC_ERR_BAD_MANIFEST);
    assert_null(buf);
    assert_non_null(strstr(err.message, "268435457"));
    /* The sender refuses before touching the (here bogus) buffer. */
    err.code = WSYNC_OK;
    assert_int_equal(wsync_wire_send(sv[0], "", (size_t)WSYNC_WIRE_MAX_MESSAGE + 1, &err),
                     WSYNC_ERR_INVALID_ARGUMENT);
    close(sv[0]);
    close(sv[1]);
}

static void test_accept_connect_bounds(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    char longpath[200];
    int lfd;

    (void)state;
    assert_int_equal(wsync_wire_connect(sock, 50, &err), -1);
    assert_int_equal(err.code, WSYNC_ERR_TIMEOUT);
    assert_non_null(strstr(err.message, sock));

    err.code = WSYNC_OK;
    lfd = wsync_wire_listen(sock, &err);
    assert_true(lfd >= 0);
    assert_int_equal(wsync_wire_accept(lfd, 50, &err), -1);
    assert_int_equal(err.code, WSYNC_ERR_TIMEOUT);
    close(lfd);

    memset(longpath, 'a', sizeof(longpath) - 1);
    longpath[0] = '/';
    longpath[sizeof(longpath) - 1] = '\0';
    err.code = WSYNC_OK;
    assert_int_equal(wsync_wire_listen(longpath, &err), -1);
    assert_int_equal(err.code, WSYNC_ERR_INVALID_ARGUMENT);
}

static void test_socket_mode(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    struct stat st;
    int lfd = wsync_wire_listen(sock, &err);

    (void)state;
    assert_true(lfd >= 0);
    assert_int_equal(stat(sock, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    close(lfd);
}

/* Another uid is refused, naming it. */
static void test_peer_uid(void **state)
{
    wsync_error_t err = {.struct_size = sizeof(err)};
    int sv[2];

    (void)state;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(wsync_wire_check_peer(sv[1], geteuid(), &err), WSYNC_OK);
    assert_int_equal(wsync_wire_check_peer(sv[1], geteuid() + 1, &err), WSYNC_ERR_PERMISSION);
    char uid[32];
    snprintf(uid, sizeof(uid), "uid %u", (unsigned)geteuid());
    assert_non_null(strstr(err.message, uid));
    close(sv[0]);
    close(sv[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip_fork, setup, teardown),
        cmocka_unit_test_setup_teardown(test_big_message, setup, teardown),
        cmocka_unit_test(test_empty_message),
        cmocka_unit_test(test_recv_timeout),
        cmocka_unit_test(test_peer_gone),
        cmocka_unit_test(test_oversize),
        cmocka_unit_test_setup_teardown(test_accept_connect_bounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_socket_mode, setup, teardown),
        cmocka_unit_test(test_peer_uid),
    };
    signal(SIGPIPE, SIG_DFL);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
