/* PyTorch's CUDA storage handles in a manifest (wsync_torch_handle.h): the 66-byte 'c' form
 * becomes the 64-byte cuda_ipc handle (as kind "torch" and as kind "cuda_ipc"), the 'e' form
 * becomes kind torch_expandable with its header and fds; an unknown version or type, a wrong
 * length or an impossible header is refused naming the byte and its value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Library results are malloc'd; cmocka replaces free() with its checker below this point. */
static void real_free(void *p)
{
    free(p);
}

#include <cmocka.h>

#include "wsync_base64.h"
#include "wsync_error.h"
#include "wsync_manifest.h"
#include "wsync_torch_handle.h"

/* A manifest whose buffer is `kind` with the handle bytes h[0..n). */
static const char *doc(const char *kind, const uint8_t *h, size_t n)
{
    static char text[4096];
    char b64[512];
    wsync_base64_encode(h, n, b64);
    snprintf(text, sizeof(text),
             "{\"wsync\":1,\"generation\":1,\"buffer\":{\"kind\":\"%s\",\"handle\":\"%s\","
             "\"bytes\":4096,\"offset\":1024,\"pid\":4711,\"device\":\"GPU-0\"},\"tensors\":["
             "{\"name\":\"w\",\"dtype\":\"bfloat16\",\"shape\":[8],\"offset\":0,\"nbytes\":16}]}",
             kind, b64);
    return text;
}

static wsync_result_t parse(const char *json, wsync_manifest_owned_t **m, wsync_error_t *err)
{
    memset(err, 0, sizeof(*err));
    err->struct_size = sizeof(*err);
    *m = NULL;
    return wsync_manifest_parse(json, strlen(json), m, err);
}

static void expect_refused(const char *json, const char *needle)
{
    wsync_manifest_owned_t *m;
    wsync_error_t err;
    wsync_result_t r = parse(json, &m, &err);
    if (r != WSYNC_ERR_BAD_MANIFEST || strstr(err.message, needle) == NULL)
        print_error("got %d \"%s\", want BAD_MANIFEST with \"%s\"\n", r, err.message, needle);
    assert_int_equal(r, WSYNC_ERR_BAD_MANIFEST);
    assert_non_null(strstr(err.message, needle));
    assert_null(m);
}

static size_t c_handle(uint8_t *h)
{
    h[0] = 2;
    h[1] = 'c';
    for (int i = 0; i < 64; i++)
        h[2 + i] = (uint8_t)(i + 1);
    return 66;
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* torch's 'e' handle: version, type, {pid, pad, segment_size, n}, n fds. */
static size_t e_handle(uint8_t *h, uint32_t pid, uint64_t seg, uint64_t n, uint32_t first_fd)
{
    memset(h, 0, 26 + 4 * n);
    h[0] = 2;
    h[1] = 'e';
    put32(h + 2, pid);
    put64(h + 2 + 8, seg);
    put64(h + 2 + 16, n);
    for (uint64_t i = 0; i < n; i++)
        put32(h + 26 + 4 * i, first_fd + (uint32_t)i);
    return 26 + 4 * n;
}

static void test_c_form(void **state)
{
    (void)state;
    uint8_t h[66];
    size_t n = c_handle(h);
    const char *kinds[] = {"torch", "cuda_ipc"};
    for (int k = 0; k < 2; k++) {
        wsync_manifest_owned_t *m;
        wsync_error_t err;
        assert_int_equal(parse(doc(kinds[k], h, n), &m, &err), WSYNC_OK);
        assert_int_equal(m->view.buffer.kind, WSYNC_BUFFER_CUDA_IPC);
        assert_int_equal(m->view.buffer.handle_len, 64);
        assert_memory_equal(m->view.buffer.handle, h + 2, 64);
        assert_int_equal(m->view.buffer.base_offset, 1024);
        wsync_manifest_free(m);
    }
}

static void test_e_form(void **state)
{
    (void)state;
    uint8_t h[128];
    size_t n = e_handle(h, 4711, 20u << 20, 7, 40); /* 54 bytes, as torch makes for 7 segments */
    assert_int_equal(n, 54);
    wsync_manifest_owned_t *m;
    wsync_error_t err;
    assert_int_equal(parse(doc("torch", h, n), &m, &err), WSYNC_OK);
    const wsync_buffer_desc_t *b = &m->view.buffer;
    assert_int_equal(b->kind, WSYNC_BUFFER_TORCH_EXPANDABLE);
    assert_int_equal(b->handle_len, 52);
    wsync_torch_segments_t s;
    assert_int_equal(wsync_torch_segments_decode(b->handle, b->handle_len, &s, &err), WSYNC_OK);
    assert_int_equal(s.pid, 4711);
    assert_int_equal(s.segment_size, 20u << 20);
    assert_int_equal(s.n, 7);
    assert_int_equal(s.fds[0], 40);
    assert_int_equal(s.fds[6], 46);
    /* emitted, it parses again to the same descriptor */
    char *text = NULL;
    assert_int_equal(wsync_manifest_emit(&m->view, &text, &err), WSYNC_OK);
    assert_non_null(strstr(text, "\"kind\":\"torch_expandable\""));
    wsync_manifest_owned_t *m2;
    assert_int_equal(parse(text, &m2, &err), WSYNC_OK);
    assert_int_equal(m2->view.buffer.kind, WSYNC_BUFFER_TORCH_EXPANDABLE);
    assert_memory_equal(m2->view.buffer.handle, b->handle, b->handle_len);
    real_free(text);
    wsync_manifest_free(m2);
    wsync_manifest_free(m);
    /* the largest that fits the ABI's handle bytes */
    n = e_handle(h, 4711, 2u << 20, WSYNC_TORCH_SEGMENTS_MAX, 3);
    assert_true(n <= WSYNC_HANDLE_MAX);
    assert_int_equal(parse(doc("torch", h, n), &m, &err), WSYNC_OK);
    wsync_manifest_free(m);
}

static void test_refusals(void **state)
{
    (void)state;
    uint8_t h[200];
    size_t n = c_handle(h);
    h[0] = 3;
    expect_refused(doc("torch", h, n), "byte 0 of a torch handle is its version, 2; got 3");
    h[0] = 2;
    h[1] = 'x';
    expect_refused(doc("torch", h, n), "byte 1 of a torch handle is its type, 'c' (0x63) or 'e' "
                                       "(0x65); got 0x78");
    h[1] = 'c';
    expect_refused(doc("torch", h, 65), "a torch 'c' handle is 66 bytes");
    /* a 66-byte cuda_ipc handle that is not torch's: the plain length error */
    h[0] = 9;
    expect_refused(doc("cuda_ipc", h, n), "a cuda_ipc handle is 64 bytes");
    n = e_handle(h, 4711, 2u << 20, 3, 5);
    expect_refused(doc("torch", h, n - 1), "header says 3 segments (36 bytes), got 35 bytes");
    n = e_handle(h, 4711, 2u << 20, 0, 5);
    expect_refused(doc("torch", h, n), "names 0 segments; wsync takes 1 to 25");
    n = e_handle(h, 4711, 0, 2, 5);
    expect_refused(doc("torch", h, n), "segment_size 0");
    n = e_handle(h, 4711, 2u << 20, 2, 5);
    put32(h + 26 + 4, 0xffffffffu);
    expect_refused(doc("torch", h, n), "fd 1 is -1");
    n = e_handle(h, 0, 2u << 20, 2, 5);
    expect_refused(doc("torch", h, n), "pid 0");
    /* more segments than the ABI's handle holds: refused at the base64 field, naming the limit */
    n = e_handle(h, 4711, 2u << 20, 30, 5);
    expect_refused(doc("torch", h, n), "decodes to more than 128 bytes");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_c_form),
        cmocka_unit_test(test_e_form),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
