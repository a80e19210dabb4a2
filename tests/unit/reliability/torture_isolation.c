/* Isolation (docs/RELIABILITY.md, "Isolation"): staging shared memory is private to our uid
 * (mode 0600, unlinked at retire and at producer exit), segments that are not 0600 or not ours
 * are refused, the wire's Unix socket refuses peers of another uid (SO_PEERCRED), and hostile
 * copy ops are refused before a byte moves (guard pages around the engine parameter, canary
 * bytes inside it). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

/* Buffers cross the plugin and harness boundary (allocated there, freed here): real allocator. */
#undef malloc
#undef calloc
#undef realloc
#undef free

#include "rel_harness.h"
#include "wsync_manifest.h"
#ifdef REL_HAVE_WIRE
#include "wsync_wire.h"
#include "wsync_client.h"
#endif

#define NOBODY 65534u
#define PAGE 4096u
#define CANARY 0xCC

static rel_plugin_t plugin;

static void shm_path(const wsync_buffer_desc_t *b, char *path, size_t cap)
{
    snprintf(path, cap, "/dev/shm%.*s", (int)strnlen((const char *)b->handle, b->handle_len),
             (const char *)b->handle);
}

/* Parse the producer's manifest with the plugin (asserting it is valid). */
static const wsync_manifest_t *parse(rel_engine_t *e, const char *json)
{
    const wsync_manifest_t *m = NULL;
    wsync_error_t err = rel_err();
    wsync_result_t r = e->pl->C->parse_manifest(e->c, json, strlen(json), &m, &err);
    if (r != WSYNC_OK)
        fail_msg("parse_manifest: %s: %s", wsync_strerror(r), err.message);
    return m;
}

static void check_private(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(st.st_uid, geteuid());
}

static void test_shm_mode_0600_unlinked_at_retire(void **state)
{
    rel_producer_t p;
    rel_engine_t e;
    wsync_error_t err = rel_err();
    char path[256], cpath[256];
    (void)state;

    /* Segments a killed process of the same pid once left are not ours to count. */
    int before = rel_count_shm(getpid());
    rel_producer_create(&p, &plugin, 2, 1000, 2000);
    rel_engine_create(&e, &plugin, 2, 1000, 2000, NULL);
    assert_int_equal(rel_producer_bucket(&p, &err), WSYNC_OK);
    const wsync_manifest_t *m = parse(&e, p.manifest);
    assert_int_equal(m->buffer.kind, WSYNC_BUFFER_HOST_SHM);
    shm_path(&m->buffer, path, sizeof(path));
    check_private(path);
    cpath[0] = '\0';
    if (m->buffer.control[0] != '\0') {
        snprintf(cpath, sizeof(cpath), "/dev/shm%s", m->buffer.control);
        check_private(cpath);
    }
    assert_int_equal(rel_engine_sync(&e, p.manifest, &err), WSYNC_OK);
    assert_int_equal(plugin.P->wait_consumed(p.s, p.stream, 1, &err), WSYNC_OK);
    e.pl->C->manifest_free(e.c, m);
    rel_producer_destroy(&p, 1);
    assert_int_equal(access(path, F_OK), -1);
    if (cpath[0] != '\0')
        assert_int_equal(access(cpath, F_OK), -1);
    assert_int_equal(rel_count_shm(getpid()), before);
    rel_engine_destroy(&e);
}

/* Child: create a staging buffer, publish, reply the manifest, then exit(0) without retiring. */
static int role_producer_exit(int fd, int argc, char **argv)
{
    rel_producer_t p;
    wsync_error_t err = rel_err();
    (void)argc;
    (void)argv;
    rel_plugin_load(&plugin);
    rel_producer_create(&p, &plugin, 2, 1000, 2000);
    if (rel_producer_bucket(&p, &err) != WSYNC_OK)
        return 3;
    rel_send(fd, p.manifest, strlen(p.manifest));
    free(rel_recv(fd, 20000));
    exit(0);
}

static void test_shm_unlinked_on_producer_exit(void **state)
{
    rel_engine_t e;
    int fd;
    char path[256];
    (void)state;

    rel_engine_create(&e, &plugin, 2, 1000, 2000, NULL);
    pid_t pid = rel_spawn("producer-exit", &fd, NULL);
    char *json = rel_recv(fd, 20000);
    assert_non_null(json);
    const wsync_manifest_t *m = parse(&e, json);
    shm_path(&m->buffer, path, sizeof(path));
    assert_int_equal(access(path, F_OK), 0);
    assert_true(rel_count_shm(pid) >= 1);
    char cpath[256] = "";
    if (m->buffer.control[0] != '\0')
        snprintf(cpath, sizeof(cpath), "/dev/shm%s", m->buffer.control);
    rel_sendf(fd, "exit");
    assert_int_equal(rel_wait_exit(pid, 10000), 0);
    /* The segments this producer created, by name (a pid alone can be reused). */
    int left = (access(path, F_OK) == 0) + (cpath[0] != '\0' && access(cpath, F_OK) == 0);
    print_message("producer exited without retire: %d of its segment(s) left in /dev/shm\n", left);
    rel_unlink_shm_of(pid);
    assert_int_equal(left, 0);
    e.pl->C->manifest_free(e.c, m);
    free(json);
    close(fd);
    rel_engine_destroy(&e);
}

/* Skipped checks are counted: a run with any exits with WSYNC_TEST_SKIPPED, so ctest lists the
 * executable as skipped (with the reasons printed here) instead of as passed. */
#define WSYNC_TEST_SKIPPED 77
static int skipped_checks;
#define SKIP_BECAUSE(...)                                                                          \
    do {                                                                                           \
        print_message("SKIPPED: " __VA_ARGS__);                                                    \
        skipped_checks++;                                                                          \
        skip();                                                                                    \
    } while (0)

/* One published bucket whose segment is altered by `alter` (`what` says how, `needle` is in the
 * refusal): open_handle refuses with PERMISSION; `restore` undone, it opens. */
static void foreign_segment(int (*alter)(const char *path), int (*restore)(const char *path),
                            const char *what, const char *needle)
{
    rel_producer_t p;
    rel_engine_t e;
    wsync_error_t err = rel_err();
    wsync_handle_t *h = NULL;
    char path[256];

    rel_producer_create(&p, &plugin, 2, 1000, 2000);
    rel_engine_create(&e, &plugin, 2, 1000, 2000, NULL);
    assert_int_equal(rel_producer_bucket(&p, &err), WSYNC_OK);
    const wsync_manifest_t *m = parse(&e, p.manifest);
    shm_path(&m->buffer, path, sizeof(path));
    assert_int_equal(alter(path), 0);
    wsync_result_t r = plugin.C->open_handle(e.c, &m->buffer, &h, &err);
    print_message("segment %s: %s: %s\n", what, wsync_strerror(r), err.message);
    assert_int_equal(r, WSYNC_ERR_PERMISSION);
    assert_non_null(strstr(err.message, needle));
    assert_int_equal(restore(path), 0);
    err = rel_err();
    assert_int_equal(plugin.C->open_handle(e.c, &m->buffer, &h, &err), WSYNC_OK);
    assert_int_equal(plugin.C->close_handle(e.c, h, &err), WSYNC_OK);
    e.pl->C->manifest_free(e.c, m);
    rel_engine_destroy(&e);
    rel_producer_destroy(&p, 1);
}

static int mode_0644(const char *path)
{
    return chmod(path, 0644);
}
static int mode_0600(const char *path)
{
    return chmod(path, 0600);
}
static int owner_nobody(const char *path)
{
    return chown(path, NOBODY, NOBODY);
}
static int owner_root(const char *path)
{
    return chown(path, 0, 0);
}

/* chmod 0644: open_handle refuses with PERMISSION naming the mode; restored, it opens. */
static void test_open_refuses_foreign_segments(void **state)
{
    (void)state;
    foreign_segment(mode_0644, mode_0600, "chmod 0644", "0644");
}

/* A segment owned by another uid: refused naming the uid (needs root to chown). */
static void test_open_refuses_foreign_owner(void **state)
{
    (void)state;
    if (geteuid() != 0)
        SKIP_BECAUSE("a segment owned by uid %u needs root to chown\n", NOBODY);
    foreign_segment(owner_nobody, owner_root, "owned by uid 65534", "65534");
}

#ifdef REL_HAVE_WIRE
/* A child that becomes `nobody` and connects to `path`; exits 0 when connect succeeded, 10 when
 * it was refused with EACCES, 11 otherwise. */
static pid_t connect_as_nobody(const char *path)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
            _exit(12);
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
        if (connect(s, (struct sockaddr *)&a, sizeof(a)) != 0)
            _exit(errno == EACCES ? 10 : 11);
        uint32_t n = 2;
        (void)!send(s, &n, sizeof(n), MSG_NOSIGNAL);
        (void)!send(s, "{}", 2, MSG_NOSIGNAL);
        char c;
        (void)!read(s, &c, 1); /* until the server closes us */
        _exit(0);
    }
    return pid;
}

static void test_wire_refuses_other_uid(void **state)
{
    char path[108];
    wsync_error_t err = rel_err();
    (void)state;
    if (geteuid() != 0)
        SKIP_BECAUSE("the SO_PEERCRED test needs root to setuid(%u)\n", NOBODY);
    snprintf(path, sizeof(path), "/tmp/wsync-rel-%d.sock", (int)getpid());
    unlink(path);
    int lfd = wsync_wire_listen(path, &err);
    assert_true(lfd >= 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);

    /* Mode 0600 already keeps other users out at connect(). */
    pid_t pid = connect_as_nobody(path);
    assert_int_equal(rel_wait_exit(pid, 10000), 10);

    /* With the file opened up, SO_PEERCRED is the check that refuses. */
    assert_int_equal(chmod(path, 0666), 0);
    pid = connect_as_nobody(path);
    int fd = wsync_wire_accept(lfd, 5000, &err);
    print_message("peer uid %u: accept -> %d: %s: %s\n", NOBODY, fd, wsync_strerror(err.code),
                  err.message);
    assert_int_equal(fd, -1);
    assert_int_equal(err.code, WSYNC_ERR_PERMISSION);
    assert_non_null(strstr(err.message, "65534"));
    assert_int_equal(rel_wait_exit(pid, 10000), 0);

    /* Our own uid is accepted and can talk. */
    err = rel_err();
    int cfd = wsync_wire_connect(path, 5000, &err);
    assert_true(cfd >= 0);
    fd = wsync_wire_accept(lfd, 5000, &err);
    assert_true(fd >= 0);
    assert_int_equal(wsync_wire_send(cfd, "ping", 4, &err), WSYNC_OK);
    char *buf = NULL;
    size_t len = 0;
    assert_int_equal(wsync_wire_recv(fd, &buf, &len, 5000, &err), WSYNC_OK);
    assert_int_equal(len, 4);
    assert_memory_equal(buf, "ping", 4);
    free(buf);
    close(fd);
    close(cfd);
    close(lfd);
    unlink(path);
}
#endif

/* ---------------------------------------------------------- copy op bounds */

typedef struct hostile {
    const char *what;
    wsync_copy_op_t op;
} hostile_t;

static int canary_intact(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != CANARY)
            return 0;
    return 1;
}

static void test_hostile_copy_ops_refused(void **state)
{
    rel_producer_t p;
    rel_engine_t e;
    wsync_error_t err = rel_err();
    wsync_handle_t *h = NULL;
    (void)state;

    /* [PROT_NONE][param: one page][PROT_NONE]: a write one byte outside faults. */
    uint8_t *region =
        mmap(NULL, 3 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(region != MAP_FAILED);
    assert_int_equal(mprotect(region, PAGE, PROT_NONE), 0);
    assert_int_equal(mprotect(region + 2 * PAGE, PAGE, PROT_NONE), 0);
    uint8_t *param = region + PAGE;
    uint8_t *params[1] = {param};

    rel_producer_create(&p, &plugin, 1, PAGE, 2000);
    rel_engine_create(&e, &plugin, 1, PAGE, 2000, params);
    assert_int_equal(rel_producer_bucket(&p, &err), WSYNC_OK);
    const wsync_manifest_t *m = parse(&e, p.manifest);
    assert_int_equal(plugin.C->open_handle(e.c, &m->buffer, &h, &err), WSYNC_OK);
    const uint64_t B = m->buffer.bytes, off = m->tensors[0].offset;

    const wsync_copy_op_t ok = {.src_offset = off,
                                .src_pitch = PAGE,
                                .dst = param,
                                .dst_pitch = PAGE,
                                .dst_extent = PAGE,
                                .rows = 1,
                                .row_bytes = PAGE};
#define OP(...) ((wsync_copy_op_t){__VA_ARGS__})
    const hostile_t bad[] = {
        {"one byte past the parameter",
         OP(.src_offset = off, .dst = param, .dst_extent = PAGE, .rows = 1, .row_bytes = PAGE + 1,
            .src_pitch = PAGE + 1, .dst_pitch = PAGE + 1)},
        {"shifted destination",
         OP(.src_offset = off, .dst = param + 1, .dst_extent = PAGE - 1, .rows = 1,
            .row_bytes = PAGE, .src_pitch = PAGE, .dst_pitch = PAGE)},
        {"source past the buffer",
         OP(.src_offset = B - 16, .dst = param, .dst_extent = PAGE, .rows = 1, .row_bytes = 32,
            .src_pitch = 32, .dst_pitch = 32)},
        {"source offset overflow",
         OP(.src_offset = UINT64_MAX - 7, .dst = param, .dst_extent = PAGE, .rows = 1,
            .row_bytes = 16, .src_pitch = 16, .dst_pitch = 16)},
        {"second row past the parameter",
         OP(.src_offset = off, .src_pitch = 2048, .dst = param, .dst_pitch = 4096,
            .dst_extent = PAGE, .rows = 2, .row_bytes = 2048)},
        {"rows x pitch overflow",
         OP(.src_offset = off, .src_pitch = 2, .dst = param, .dst_pitch = 2, .dst_extent = PAGE,
            .rows = UINT64_MAX / 2 + 2, .row_bytes = 1)},
        {"huge destination pitch",
         OP(.src_offset = off, .src_pitch = 8, .dst = param, .dst_pitch = UINT64_MAX,
            .dst_extent = PAGE, .rows = 2, .row_bytes = 8)},
        {"overlapping source rows",
         OP(.src_offset = off, .src_pitch = 4, .dst = param, .dst_pitch = 8, .dst_extent = PAGE,
            .rows = 4, .row_bytes = 8)},
        {"overlapping destination rows",
         OP(.src_offset = off, .src_pitch = 8, .dst = param, .dst_pitch = 4, .dst_extent = PAGE,
            .rows = 4, .row_bytes = 8)},
        {"NULL destination", OP(.src_offset = off, .dst = NULL, .dst_extent = PAGE, .rows = 1,
                                .row_bytes = 8, .src_pitch = 8, .dst_pitch = 8)},
        {"zero pitch, several rows",
         OP(.src_offset = off, .src_pitch = 0, .dst = param, .dst_pitch = 0, .dst_extent = PAGE,
            .rows = 3, .row_bytes = 8)},
    };
#undef OP
    const size_t n_bad = sizeof(bad) / sizeof(bad[0]);
    uint64_t gen = 1;
    for (size_t i = 0; i < n_bad; i++) {
        /* Alone, then behind a valid op: validation is complete before anything is written. */
        for (int behind = 0; behind < 2; behind++) {
            wsync_copy_op_t ops[2] = {ok, bad[i].op};
            memset(param, CANARY, PAGE);
            err = rel_err();
            wsync_result_t r = plugin.C->copy_weights(e.c, h, NULL, gen, behind ? ops : ops + 1,
                                                      behind ? 2 : 1, 0, &err);
            if (behind == 0)
                print_message("hostile op \"%s\": %s: %s\n", bad[i].what, wsync_strerror(r),
                              err.message);
            if (r == WSYNC_OK)
                fail_msg("hostile op \"%s\" (behind a valid op: %d) was accepted", bad[i].what,
                         behind);
            assert_true(r == WSYNC_ERR_OUT_OF_BOUNDS || r == WSYNC_ERR_INVALID_ARGUMENT);
            assert_true(err.message[0] != '\0');
            /* Nothing may be in flight: record (wait) must find no new copy. */
            wsync_error_t rerr = rel_err();
            plugin.C->record_consumed(e.c, h, 1, &rerr);
            assert_true(canary_intact(param, PAGE));
        }
    }

    /* The valid op still works, and writes exactly the page. */
    memset(param, CANARY, PAGE);
    err = rel_err();
    assert_int_equal(plugin.C->copy_weights(e.c, h, NULL, gen, &ok, 1, 0, &err), WSYNC_OK);
    assert_int_equal(plugin.C->record_consumed(e.c, h, 1, &err), WSYNC_OK);
    assert_true(rel_engine_is_gen(&e, 1));
    assert_int_equal(plugin.C->close_handle(e.c, h, &err), WSYNC_OK);
    plugin.C->manifest_free(e.c, m);
    print_message("%zu hostile copy ops refused (alone and behind a valid op), canary intact\n",
                  n_bad);

    assert_int_equal(plugin.P->wait_consumed(p.s, p.stream, 1, &err), WSYNC_OK);
    rel_engine_destroy(&e);
    rel_producer_destroy(&p, 1);
    munmap(region, 3 * PAGE);
}

/* A manifest that claims a larger buffer than the segment: mapping it must not let an op read
 * past the real segment. */
static void test_manifest_overclaims_buffer(void **state)
{
    rel_producer_t p;
    rel_engine_t e;
    wsync_error_t err = rel_err();
    wsync_handle_t *h = NULL;
    wsync_manifest_owned_t *own = NULL;
    char *json = NULL;
    (void)state;

    rel_producer_create(&p, &plugin, 1, PAGE, 2000);
    rel_engine_create(&e, &plugin, 1, PAGE, 2000, NULL);
    assert_int_equal(rel_producer_bucket(&p, &err), WSYNC_OK);
    assert_int_equal(wsync_manifest_parse(p.manifest, strlen(p.manifest), &own, &err), WSYNC_OK);
    own->view.buffer.bytes = 1ull << 40;
    assert_int_equal(wsync_manifest_emit(&own->view, &json, &err), WSYNC_OK);
    const wsync_manifest_t *m = parse(&e, json);
    wsync_result_t r = plugin.C->open_handle(e.c, &m->buffer, &h, &err);
    print_message("manifest claiming 1 TiB for a %llu-byte segment: open_handle: %s: %s\n",
                  (unsigned long long)p.n * PAGE, wsync_strerror(r), err.message);
    if (r == WSYNC_OK) {
        uint8_t *dst = e.param[0];
        wsync_copy_op_t op = {.src_offset = 1ull << 30,
                              .src_pitch = 64,
                              .dst = dst,
                              .dst_pitch = 64,
                              .dst_extent = PAGE,
                              .rows = 1,
                              .row_bytes = 64};
        err = rel_err();
        r = plugin.C->copy_weights(e.c, h, NULL, 1, &op, 1, 0, &err);
        print_message("  copy from 1 GiB into it: %s: %s\n", wsync_strerror(r), err.message);
        assert_true(r == WSYNC_ERR_OUT_OF_BOUNDS);
        plugin.C->close_handle(e.c, h, &err);
    } else {
        assert_true(r == WSYNC_ERR_OUT_OF_BOUNDS || r == WSYNC_ERR_BAD_MANIFEST);
    }
    plugin.C->manifest_free(e.c, m);
    wsync_manifest_free(own);
    free(json);
    rel_engine_destroy(&e);
    rel_producer_destroy(&p, 1);
}

int main(int argc, char **argv)
{
    static const char *const roles[] = {"producer-exit"};
    static const rel_role_fn fns[] = {role_producer_exit};
    int rc = rel_child_main(argc, argv, roles, fns, 1);
    if (rc >= 0)
        return rc;

    rel_plugin_load(&plugin);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shm_mode_0600_unlinked_at_retire),
        cmocka_unit_test(test_shm_unlinked_on_producer_exit),
        cmocka_unit_test(test_open_refuses_foreign_segments),
        cmocka_unit_test(test_open_refuses_foreign_owner),
#ifdef REL_HAVE_WIRE
        cmocka_unit_test(test_wire_refuses_other_uid),
#endif
        cmocka_unit_test(test_hostile_copy_ops_refused),
        cmocka_unit_test(test_manifest_overclaims_buffer),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    return failed ? failed : skipped_checks ? WSYNC_TEST_SKIPPED : 0;
}
