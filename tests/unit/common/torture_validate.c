/* Copy-op and generation validation: bounds, pitches, overflow, zero-size ops. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "wsync_client.h"
#include "wsync_error.h"
#include "wsync_validate.h"

static char dst_mem[4096];

static wsync_copy_op_t op1d(uint64_t src_offset, uint64_t bytes, uint64_t dst_extent)
{
    wsync_copy_op_t op = {.src_offset = src_offset,
                          .src_pitch = 0,
                          .dst = dst_mem,
                          .dst_pitch = 0,
                          .dst_extent = dst_extent,
                          .rows = 1,
                          .row_bytes = bytes};
    return op;
}

static void expect_fail_at(const wsync_copy_op_t *ops, size_t n, uint64_t src_bytes,
                           wsync_result_t code, const char *needle, int line)
{
    wsync_error_t err;
    memset(&err, 0, sizeof(err));
    wsync_result_t r = wsync_validate_copy_ops(ops, n, src_bytes, &err);
    if (r != code || strstr(err.message, needle) == NULL)
        print_error("line %d: got %d \"%s\", want %d with \"%s\"\n", line, r, err.message, code,
                    needle);
    assert_int_equal(r, code);
    assert_int_equal(err.code, code);
    assert_non_null(strstr(err.message, needle));
}
#define expect_fail(ops, n, src, code, needle)                                                     \
    expect_fail_at((ops), (n), (src), (code), (needle), __LINE__)
#define OOB WSYNC_ERR_OUT_OF_BOUNDS
#define INVAL WSYNC_ERR_INVALID_ARGUMENT

static void test_valid_ops(void **state)
{
    (void)state;
    wsync_copy_op_t ops[3];
    ops[0] = op1d(0, 1024, 1024);
    ops[1] = op1d(3072, 1024, 4096); /* ends exactly at the buffer's end */
    ops[1].dst = dst_mem + 1024;     /* each destination byte takes one op */
    /* 2-D: 4 rows of 64 bytes, pitch 256 in the source and 128 in the destination. */
    ops[2] = (wsync_copy_op_t){.src_offset = 1024,
                               .src_pitch = 256,
                               .dst = dst_mem + 2048,
                               .dst_pitch = 128,
                               .dst_extent = 3 * 128 + 64,
                               .rows = 4,
                               .row_bytes = 64};
    assert_int_equal(wsync_validate_copy_ops(ops, 3, 4096, NULL), WSYNC_OK);
    assert_int_equal(wsync_copy_ops_bytes(ops, 3), 1024 + 1024 + 256);
    /* Zero ops is fine. */
    assert_int_equal(wsync_validate_copy_ops(NULL, 0, 0, NULL), WSYNC_OK);
    assert_int_equal(wsync_copy_ops_bytes(NULL, 0), 0);
}

static void test_zero_size_ops(void **state)
{
    (void)state;
    /* Empty tensors: no bytes move, so no pointer or bound matters. */
    wsync_copy_op_t ops[2];
    ops[0] = op1d(UINT64_MAX, 0, 0);
    ops[0].dst = NULL;
    ops[1] = (wsync_copy_op_t){.src_offset = 99999, .dst = NULL, .rows = 0, .row_bytes = 64};
    assert_int_equal(wsync_validate_copy_ops(ops, 2, 16, NULL), WSYNC_OK);
    assert_int_equal(wsync_copy_ops_bytes(ops, 2), 0);
}

static void test_source_bounds(void **state)
{
    (void)state;
    wsync_copy_op_t ops[2] = {op1d(0, 16, 16), op1d(4000, 97, 4096)};
    expect_fail(ops, 2, 4096, OOB, "op 1: source bytes [4000, 4097) exceed the buffer's 4096");
    wsync_copy_op_t two_d = {.src_offset = 0,
                             .src_pitch = 1024,
                             .dst = dst_mem,
                             .dst_pitch = 64,
                             .dst_extent = 4096,
                             .rows = 4,
                             .row_bytes = 64};
    /* Last row starts at 3072, ends at 3136: inside 3136, outside 3135. */
    assert_int_equal(wsync_validate_copy_ops(&two_d, 1, 3136, NULL), WSYNC_OK);
    expect_fail(&two_d, 1, 3135, OOB, "op 0: source bytes [0, 3136) exceed the buffer's 3135");
}

static void test_destination_bounds(void **state)
{
    (void)state;
    wsync_copy_op_t op = op1d(0, 513, 512);
    expect_fail(&op, 1, 4096, OOB, "op 0: writes 513 bytes from dst but dst_extent is 512");
    wsync_copy_op_t two_d = {.src_offset = 0,
                             .src_pitch = 64,
                             .dst = dst_mem,
                             .dst_pitch = 256,
                             .dst_extent = 3 * 256 + 63,
                             .rows = 4,
                             .row_bytes = 64};
    expect_fail(&two_d, 1, 4096, OOB, "writes 832 bytes from dst but dst_extent is 831");
}

static void test_pitches(void **state)
{
    (void)state;
    wsync_copy_op_t op = {.src_offset = 0,
                          .src_pitch = 32,
                          .dst = dst_mem,
                          .dst_pitch = 64,
                          .dst_extent = 4096,
                          .rows = 2,
                          .row_bytes = 64};
    expect_fail(&op, 1, 4096, INVAL, "src_pitch 32 / dst_pitch 64 smaller than row_bytes 64");
    op.src_pitch = 64;
    op.dst_pitch = 0;
    expect_fail(&op, 1, 4096, INVAL, "dst_pitch 0 smaller than row_bytes 64");
    /* Pitches do not matter for a single row. */
    op.rows = 1;
    assert_int_equal(wsync_validate_copy_ops(&op, 1, 4096, NULL), WSYNC_OK);
}

static void test_null_dst_and_ops(void **state)
{
    (void)state;
    wsync_copy_op_t ops[2] = {op1d(0, 8, 8), op1d(8, 8, 8)};
    ops[1].dst = NULL;
    expect_fail(ops, 2, 4096, INVAL, "op 1: dst is NULL but the op moves 1 x 8 bytes");
    expect_fail(NULL, 3, 4096, INVAL, "ops is NULL but n_ops is 3");
}

/* copy_weights' arguments, one check for both backends. */
static void test_copy_args(void **state)
{
    (void)state;
    wsync_copy_op_t op = op1d(0, 8, 8);
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_validate_copy_args(&op, 1, WSYNC_COPY_VERIFY, &err), WSYNC_OK);
    assert_int_equal(wsync_validate_copy_args(NULL, 0, 0, &err), WSYNC_OK);
    assert_int_equal(wsync_validate_copy_args(NULL, 2, 0, &err), INVAL);
    assert_non_null(strstr(err.message, "ops is NULL with n_ops 2"));
    wsync_error_t e2 = {.struct_size = sizeof(e2)};
    assert_int_equal(wsync_validate_copy_args(&op, 1, 0x6, &e2), INVAL);
    assert_non_null(strstr(e2.message, "unknown copy flags 0x6"));
    wsync_error_t e3 = {.struct_size = sizeof(e3)};
    assert_int_equal(wsync_validate_copy_args(&op, (size_t)UINT32_MAX + 1, 0, &e3), INVAL);
    assert_non_null(strstr(e3.message, "4294967296 ops in one call"));
}

static void test_overflow(void **state)
{
    (void)state;
    /* src_offset + row_bytes wraps past 2^64 into a small number. */
    wsync_copy_op_t op = op1d(UINT64_MAX - 7, 16, 16);
    expect_fail(&op, 1, 4096, OOB, "op 0: src_offset 18446744073709551608");
    expect_fail(&op, 1, 4096, OOB, "overflows 64 bits");
    /* rows x pitch wraps. */
    wsync_copy_op_t two_d = {.src_offset = 0,
                             .src_pitch = 1ull << 62,
                             .dst = dst_mem,
                             .dst_pitch = 64,
                             .dst_extent = 4096,
                             .rows = 5,
                             .row_bytes = 64};
    expect_fail(&two_d, 1, UINT64_MAX, OOB, "overflows 64 bits");
    two_d.src_pitch = 64;
    two_d.dst_pitch = 1ull << 62;
    expect_fail(&two_d, 1, UINT64_MAX, OOB, "x dst_pitch 4611686018427387904");
    two_d.dst_pitch = 64;
    two_d.row_bytes = 64;
    two_d.rows = UINT64_MAX;
    expect_fail(&two_d, 1, UINT64_MAX, OOB, "overflows 64 bits");
    /* bytes() saturates instead of wrapping. */
    wsync_copy_op_t big[2] = {op1d(0, UINT64_MAX, 0), op1d(0, 2, 0)};
    assert_int_equal(wsync_copy_ops_bytes(big, 2), UINT64_MAX);
}

static void test_first_error_wins(void **state)
{
    (void)state;
    wsync_copy_op_t ops[2] = {op1d(0, 8, 4), op1d(99999, 8, 8)};
    wsync_error_t err;
    memset(&err, 0, sizeof(err));
    assert_int_equal(wsync_validate_copy_ops(ops, 2, 4096, &err), OOB);
    assert_non_null(strstr(err.message, "op 0:"));
    /* A second failure does not overwrite the first. */
    assert_int_equal(wsync_validate_copy_ops(ops + 1, 1, 4096, &err), OOB);
    assert_non_null(strstr(err.message, "op 0:"));
    assert_null(strstr(err.message, "99999"));
}

static void test_generation(void **state)
{
    (void)state;
    wsync_error_t err;
    assert_int_equal(wsync_validate_generation(0, 1, NULL), WSYNC_OK);
    assert_int_equal(wsync_validate_generation(41, 42, NULL), WSYNC_OK);
    assert_int_equal(wsync_validate_generation(41, 1000, NULL), WSYNC_OK);
    memset(&err, 0, sizeof(err));
    assert_int_equal(wsync_validate_generation(42, 42, &err), WSYNC_ERR_STALE_GENERATION);
    assert_non_null(strstr(err.message, "generation 42 is not newer"));
    memset(&err, 0, sizeof(err));
    assert_int_equal(wsync_validate_generation(42, 7, &err), WSYNC_ERR_STALE_GENERATION);
    assert_non_null(strstr(err.message, "generation 7 is not newer"));
    assert_non_null(strstr(err.message, "(42)"));
    assert_int_equal(wsync_validate_generation(0, 0, NULL), WSYNC_ERR_STALE_GENERATION);
    assert_int_equal(wsync_validate_generation(UINT64_MAX, UINT64_MAX, NULL),
                     WSYNC_ERR_STALE_GENERATION);
}

static wsync_copy_op_t op2d(size_t at, uint64_t rows, uint64_t pitch, uint64_t row_bytes)
{
    return (wsync_copy_op_t){.src_offset = 0,
                             .src_pitch = row_bytes,
                             .dst = dst_mem + at,
                             .dst_pitch = pitch,
                             .dst_extent = (rows - 1) * pitch + row_bytes,
                             .rows = rows,
                             .row_bytes = row_bytes};
}

/* Two ops that write a common destination byte are refused naming both; rows that interleave
 * without touching (columns of one matrix) are fine; the check is exact for strided ops. */
static void test_overlapping_destinations(void **state)
{
    (void)state;
    wsync_copy_op_t ops[4];
    ops[0] = op1d(0, 512, 512);
    ops[1] = op1d(0, 512, 512);
    ops[1].dst = dst_mem + 511; /* one byte in common */
    expect_fail(ops, 2, 4096, INVAL, "op 0 and op 1 write overlapping destination bytes");
    /* the same in reverse order (sorted internally) */
    wsync_copy_op_t rev[2] = {ops[1], ops[0]};
    expect_fail(rev, 2, 4096, INVAL, "op 0 and op 1 write overlapping");
    /* columns 0-31 and 32-63 of 8 rows of 64 bytes: interleaved, disjoint */
    ops[0] = op2d(0, 8, 64, 32);
    ops[1] = op2d(32, 8, 64, 32);
    assert_int_equal(wsync_validate_copy_ops(ops, 2, 4096, NULL), WSYNC_OK);
    /* columns 0-32 and 32-63: byte 32 of every row twice */
    ops[0] = op2d(0, 8, 64, 33);
    expect_fail(ops, 2, 4096, INVAL, "op 0 and op 1");
    /* a strided op whose gaps hold two contiguous ops, then a third that hits a row */
    ops[0] = op2d(0, 4, 256, 64); /* [0,64) [256,320) [512,576) [768,832) */
    ops[1] = op1d(0, 128, 128);   /* [64,192) */
    ops[1].dst = dst_mem + 64;
    ops[2] = op1d(0, 128, 128); /* [320,448) */
    ops[2].dst = dst_mem + 320;
    assert_int_equal(wsync_validate_copy_ops(ops, 3, 4096, NULL), WSYNC_OK);
    ops[3] = op1d(0, 8, 8); /* [700, 708) misses, then [828, 836) hits row 3 */
    ops[3].dst = dst_mem + 700;
    assert_int_equal(wsync_validate_copy_ops(ops, 4, 4096, NULL), WSYNC_OK);
    ops[3].dst = dst_mem + 828;
    expect_fail(ops, 4, 4096, INVAL, "op 0 and op 3");
    /* zero-byte ops at the same place as another are not writes */
    ops[0] = op1d(0, 512, 512);
    ops[1] = op1d(0, 0, 512);
    assert_int_equal(wsync_validate_copy_ops(ops, 2, 4096, NULL), WSYNC_OK);
}

/* copy_quantized's ops: a 200 x 256 bf16 source quantized into 200 x 256 fp8 bytes with 2 x 2
 * block scales, beside a plain op; each wrong field refused by name; a scale region that meets
 * another destination is an overlap (scales are op n + i). */
static char q_dst[256 * 200 + 64], q_scales[64];

/* That source's two ops and their quant entries. */
static void quant_fixture(wsync_copy_op_t ops[2], wsync_quant_t q[2])
{
    ops[0] = (wsync_copy_op_t){.src_offset = 0,
                               .src_pitch = 512,
                               .dst = q_dst,
                               .dst_pitch = 256,
                               .dst_extent = 256 * 200,
                               .rows = 200,
                               .row_bytes = 512};
    ops[1] = op1d(200 * 512, 64, 64);
    ops[1].dst = q_dst + 256 * 200;
    q[0] = (wsync_quant_t){.kind = WSYNC_QUANT_FP8_BLOCK,
                           .src_dtype = WSYNC_DTYPE_BF16,
                           .cols = 256,
                           .scale_dst = q_scales,
                           .scale_pitch = 8,
                           .scale_extent = 16};
    q[1] = (wsync_quant_t){.kind = WSYNC_QUANT_NONE};
}

/* copy_quantized's check of ops and q with memo (NULL: none), twice (a refused call must stay
 * refused): `code`, and a message holding `msg` when not NULL. */
static void expect_quant(wsync_validate_memo_t *memo, const wsync_copy_op_t *ops,
                         const wsync_quant_t *q, uint64_t src_bytes, wsync_result_t code,
                         const char *msg)
{
    for (int k = 0; k < 2; k++) {
        wsync_error_t err = {.struct_size = sizeof(err)};
        assert_int_equal(wsync_validate_quant_ops_memo(memo, ops, q, 2, src_bytes, &err), code);
        if (msg != NULL)
            assert_non_null(strstr(err.message, msg));
    }
}

/* The rules of wsync_validate_quant_ops, checked with memo (NULL: none) after the valid call. */
static void quant_ops(wsync_validate_memo_t *memo)
{
    wsync_copy_op_t ops[2];
    wsync_quant_t q[2];
    quant_fixture(ops, q);
    const uint64_t src = 200 * 512 + 64;
    expect_quant(memo, ops, q, src, WSYNC_OK, NULL);

    wsync_quant_t bad[2];
    memcpy(bad, q, sizeof(q));
    bad[0].scale_extent = 12; /* 2 x 2 floats need 16 */
    expect_quant(memo, ops, bad, src, OOB, "the scales of op 0: ");
    memcpy(bad, q, sizeof(q));
    bad[0].cols = 255;
    expect_quant(memo, ops, bad, src, INVAL, "op 0: row_bytes 512 is not cols 255");
    memcpy(bad, q, sizeof(q));
    bad[0].src_dtype = WSYNC_DTYPE_I32;
    expect_quant(memo, ops, bad, src, INVAL, "op 0: quant kind 1 from dtype");
    expect_quant(memo, ops, q, 200 * 512 - 1, OOB, NULL); /* the source runs past the buffer */
    memcpy(bad, q, sizeof(q));
    bad[0].scale_dst = q_dst + 256 * 200 + 8; /* the scales land on op 1's bytes */
    bad[0].scale_extent = 64;
    expect_quant(memo, ops, bad, src, INVAL,
                 "op 1 and the scales of op 0 write overlapping destination bytes");
    memcpy(bad, q, sizeof(q));
    bad[0].kind = 4; /* no such kind */
    expect_quant(memo, ops, bad, src, INVAL, "op 0: quant kind 4");
    wsync_copy_op_t bad_ops[2];
    memcpy(bad_ops, ops, sizeof(ops));
    bad_ops[1].dst = q_dst + 100; /* op 1's bytes on op 0's */
    expect_quant(memo, bad_ops, q, src, INVAL, "op 0 and op 1 write overlapping destination bytes");
    expect_quant(memo, ops, q, src, WSYNC_OK, NULL);
}

static void test_quant_ops(void **state)
{
    (void)state;
    quant_ops(NULL);
    /* with a consumer's memo, which keeps the calls it found valid: every other call (other ops,
     * other quant entries, another source size) is still checked whole, twice over one memo */
    wsync_validate_memo_t memo = {0};
    quant_ops(&memo);
    int held = 0;
    for (unsigned k = 0; k < WSYNC_VALIDATE_MEMO_SLOTS; k++)
        held += memo.call[k].n == 2;
    assert_int_equal(held, 1); /* the valid call, kept once: its later checks find it */
    quant_ops(&memo);
    wsync_validate_memo_free(&memo);
    assert_null(memo.call[0].in);
}

/* Per-channel scales: one float per row inside scale_extent; per-tensor: one float shared by
 * every TENSOR op naming it, counted once, but not by an op of another kind. */
/* Row and tensor scales, checked with memo (NULL: none). */
static void row_and_tensor_scales(wsync_validate_memo_t *memo)
{
    wsync_copy_op_t ops[2] = {
        {.src_pitch = 512,
         .dst = q_dst,
         .dst_pitch = 256,
         .dst_extent = 256 * 100,
         .rows = 100,
         .row_bytes = 512},
        {.src_offset = 100 * 512,
         .src_pitch = 512,
         .dst = q_dst + 256 * 100,
         .dst_pitch = 256,
         .dst_extent = 256 * 100,
         .rows = 100,
         .row_bytes = 512},
    };
    static char scales[4 * 200];
    wsync_quant_t q[2];
    for (int k = 0; k < 2; k++)
        q[k] = (wsync_quant_t){.kind = WSYNC_QUANT_FP8_CHANNEL,
                               .src_dtype = WSYNC_DTYPE_BF16,
                               .cols = 256,
                               .scale_dst = scales + 400 * k,
                               .scale_pitch = 4,
                               .scale_extent = 800 - 400 * (uint64_t)k};
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_validate_quant_ops_memo(memo, ops, q, 2, 200 * 512, &err), WSYNC_OK);
    q[1].scale_dst = scales + 396; /* its first row's scale is op 0's last */
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(wsync_validate_quant_ops_memo(memo, ops, q, 2, 200 * 512, &err), INVAL);
    assert_non_null(strstr(err.message, "the scales of op 0 and the scales of op 1 write "
                                        "overlapping destination bytes"));
    q[1].scale_dst = scales + 400;
    q[1].scale_extent = 396; /* 100 floats need 400 bytes */
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(wsync_validate_quant_ops_memo(memo, ops, q, 2, 200 * 512, &err), OOB);
    assert_non_null(strstr(err.message, "the scales of op 1: "));
    for (int k = 0; k < 2; k++)
        q[k] = (wsync_quant_t){.kind = WSYNC_QUANT_FP8_TENSOR,
                               .src_dtype = WSYNC_DTYPE_BF16,
                               .cols = 256,
                               .scale_dst = scales,
                               .scale_extent = 4};
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(wsync_validate_quant_ops_memo(memo, ops, q, 2, 200 * 512, &err), WSYNC_OK);
    q[1].kind = WSYNC_QUANT_FP8_CHANNEL; /* a row scale on the tensor's */
    q[1].scale_pitch = 4;
    q[1].scale_extent = 800;
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(wsync_validate_quant_ops_memo(memo, ops, q, 2, 200 * 512, &err), INVAL);
    assert_non_null(strstr(err.message, "overlapping destination bytes"));
}

static void test_quant_row_and_tensor_scales(void **state)
{
    (void)state;
    row_and_tensor_scales(NULL);
    /* with a consumer's memo: its scratch is reused by every call (the shared-scale flags of the
     * tensor-scale call before the channel-scale call must not hide that call's overlap) */
    wsync_validate_memo_t memo = {0};
    row_and_tensor_scales(&memo);
    void *scratch = memo.scratch;
    assert_non_null(scratch);
    row_and_tensor_scales(&memo);
    assert_ptr_equal(memo.scratch, scratch);
    wsync_validate_memo_free(&memo);
    assert_null(memo.scratch);
}

/* A consumer's memo: the same ops again pass without a sort; ops whose destinations differ from
 * the kept ones anywhere (first, middle, last, one more or one fewer) are checked in full, an
 * overlap still refused by name; a refused call leaves no memo that could pass it; the source
 * bounds are checked on every call. */
static int memo_holds(const wsync_validate_memo_t *memo, size_t n)
{
    for (unsigned k = 0; k < WSYNC_VALIDATE_MEMO_SLOTS; k++)
        if (memo->slot[k].n == n)
            return 1;
    return 0;
}

static void test_memo(void **state)
{
    (void)state;
    enum { N = 64 };
    wsync_copy_op_t ops[N];
    for (size_t i = 0; i < N; i++) { /* out of address order: the memo keeps the given order */
        ops[i] = op1d(0, 32, 32);
        ops[i].dst = dst_mem + 32 * ((i * 37) % N);
    }
    wsync_validate_memo_t memo = {0};
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_validate_copy_ops_memo(&memo, ops, N, 4096, &err), WSYNC_OK);
    assert_true(memo_holds(&memo, N));
    assert_int_equal(wsync_validate_copy_ops_memo(&memo, ops, N, 4096, &err), WSYNC_OK);
    const size_t at[3] = {0, N / 2, N - 1};
    for (size_t k = 0; k < 3; k++) { /* an overlap at the first, a middle and the last op */
        wsync_copy_op_t bad[N];
        memcpy(bad, ops, sizeof(bad));
        bad[at[k]].dst = (char *)bad[(at[k] + 1) % N].dst + 31;
        err = (wsync_error_t){.struct_size = sizeof(err)};
        assert_int_equal(wsync_validate_copy_ops_memo(&memo, bad, N, 4096, &err), INVAL);
        assert_non_null(strstr(err.message, "write overlapping destination bytes"));
        err = (wsync_error_t){.struct_size = sizeof(err)};
        assert_int_equal(wsync_validate_copy_ops_memo(&memo, bad, N, 4096, &err), INVAL);
        assert_int_equal(wsync_validate_copy_ops_memo(&memo, ops, N, 4096, &err), WSYNC_OK);
        assert_true(memo_holds(&memo, N));
    }
    /* one fewer op, then one more that overlaps */
    assert_int_equal(wsync_validate_copy_ops_memo(&memo, ops, N - 1, 4096, &err), WSYNC_OK);
    assert_true(memo_holds(&memo, N - 1));
    wsync_copy_op_t more[N + 1];
    memcpy(more, ops, sizeof(ops));
    more[N] = op1d(0, 8, 8);
    more[N].dst = dst_mem + 4;
    assert_int_equal(wsync_validate_copy_ops_memo(&memo, more, N + 1, 4096, &err), INVAL);
    /* the same destinations with a source past the buffer: the bounds are checked every call */
    assert_int_equal(wsync_validate_copy_ops_memo(&memo, ops, N, 4096, &err), WSYNC_OK);
    wsync_copy_op_t far[N];
    memcpy(far, ops, sizeof(far));
    far[5].src_offset = 4096 - 16;
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(wsync_validate_copy_ops_memo(&memo, far, N, 4096, &err), OOB);
    assert_non_null(strstr(err.message, "op 5"));
    /* the failing op is in the error itself (wsync_error_t.op), not only in its text */
    uint64_t failed = 0;
    assert_true(wsync_error_op(&err, &failed));
    assert_int_equal(failed, 5);
    /* a caller whose struct predates the members gets the message, and nothing past its size */
    struct {
        wsync_error_t e;
    } old;
    memset(&old, 0xab, sizeof(old));
    old.e.struct_size = offsetof(wsync_error_t, op);
    old.e.code = WSYNC_OK;
    assert_int_equal(wsync_validate_copy_ops_memo(&memo, far, N, 4096, &old.e), OOB);
    assert_non_null(strstr(old.e.message, "op 5"));
    assert_false(wsync_error_op(&old.e, NULL));
    assert_int_equal(old.e.op, 0xababababababababull);
    assert_int_equal(old.e.op_valid, 0xababababu);
    /* copy_quantized's ops share the memo: scales meeting a weight are refused after a pass */
    wsync_copy_op_t q_ops[2];
    wsync_quant_t q[2];
    quant_fixture(q_ops, q);
    assert_int_equal(wsync_validate_quant_ops_memo(&memo, q_ops, q, 2, 200 * 512 + 64, &err),
                     WSYNC_OK);
    assert_int_equal(wsync_validate_quant_ops_memo(&memo, q_ops, q, 2, 200 * 512 + 64, &err),
                     WSYNC_OK);
    q[0].scale_dst = q_dst + 256 * 200 + 8;
    q[0].scale_extent = 64;
    err = (wsync_error_t){.struct_size = sizeof(err)};
    assert_int_equal(wsync_validate_quant_ops_memo(&memo, q_ops, q, 2, 200 * 512 + 64, &err),
                     INVAL);
    assert_non_null(
        strstr(err.message, "op 1 and the scales of op 0 write overlapping destination bytes"));
    assert_true(wsync_error_op(&err, &failed));
    assert_int_equal(failed, 1);
    /* a failure that is no op's clears the index of an earlier one */
    wsync_error_clear(&err);
    assert_false(wsync_error_op(&err, NULL));
    /* more op sets than slots: each still checked, the refused one refused */
    for (size_t k = 0; k < 2 * WSYNC_VALIDATE_MEMO_SLOTS; k++) {
        wsync_copy_op_t one[2] = {op1d(0, 16, 16), op1d(0, 16, 16)};
        one[0].dst = dst_mem + 16 * (k % 200);
        one[1].dst = (char *)one[0].dst + 16;
        assert_int_equal(wsync_validate_copy_ops_memo(&memo, one, 2, 4096, &err), WSYNC_OK);
        one[1].dst = (char *)one[0].dst + 15;
        assert_int_equal(wsync_validate_copy_ops_memo(&memo, one, 2, 4096, &err), INVAL);
    }
    wsync_validate_memo_free(&memo);
    for (unsigned k = 0; k < WSYNC_VALIDATE_MEMO_SLOTS; k++)
        assert_null(memo.slot[k].spans);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_ops),
        cmocka_unit_test(test_overlapping_destinations),
        cmocka_unit_test(test_zero_size_ops),
        cmocka_unit_test(test_source_bounds),
        cmocka_unit_test(test_destination_bounds),
        cmocka_unit_test(test_pitches),
        cmocka_unit_test(test_null_dst_and_ops),
        cmocka_unit_test(test_overflow),
        cmocka_unit_test(test_first_error_wins),
        cmocka_unit_test(test_generation),
        cmocka_unit_test(test_copy_args),
        cmocka_unit_test(test_quant_ops),
        cmocka_unit_test(test_quant_row_and_tensor_scales),
        cmocka_unit_test(test_memo),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
