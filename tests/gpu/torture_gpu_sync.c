/* Cross-process sync through libwsync_cuda.so with digests: the producer stages tensors of
 * awkward sizes (vector path, 16-byte tail, odd lengths, empty) over three generations; the
 * consumer copies them whole, as a row-parallel 2-D slice and from a misaligned source into a
 * misaligned destination (byte path), all verified by the fused digest against host wsync64,
 * and again unverified with the copy engines taking a share of the contiguous ops (tensor 0 also
 * cut into 8 pieces dealt alternately to two strided regions of one allocation, as a MoE layer's
 * experts land in fused w13/w2: two 2-D copies for the copy engines, gaps left alone); then a wrong
 * digest, an out-of-bounds op and a replayed generation are refused, the last two before any byte
 * is written. */
#include <stdlib.h>
#include <string.h>

#include "wsync_gpu_test.h"
#include "wsync_digest.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#define SYNC_GENS 3
#define SYNC_SLOT (8ull << 20) /* trainer offset of tensor k: k * SYNC_SLOT */
#define PIECES 8               /* tensor 0 cut into pieces for the fused destination */
#define PIECE (1000ull * 4096 * 2 / PIECES)
#define GAP_A 4096ull /* even pieces land PIECE + GAP_A apart, odd ones PIECE + GAP_B apart */
#define GAP_B 8192ull
#define FUSED_BYTES ((PIECES / 2) * (2 * PIECE + GAP_A + GAP_B))

typedef struct sync_tensor {
    const char *name;
    wsync_dtype_t dtype;
    int64_t rows, cols;
    uint64_t bytes;
} sync_tensor_t;

static const sync_tensor_t T[] = {
    {"model.layers.0.mlp.up_proj.weight", WSYNC_DTYPE_BF16, 1000, 4096, 1000 * 4096 * 2},
    {"model.norm.weight", WSYNC_DTYPE_F32, 1, 7, 28},
    {"odd.bytes", WSYNC_DTYPE_U8, 1, 12345, 12345},
    {"model.layers.0.self_attn.o_proj.weight", WSYNC_DTYPE_BF16, 4096, 256, 4096 * 256 * 2},
    {"empty", WSYNC_DTYPE_BF16, 1, 0, 0},
};
#define NT (sizeof(T) / sizeof(T[0]))

static uint64_t seed_of(uint64_t g)
{
    return 0x77000000ull * g + 3;
}

/* Host wsync64 of `rows` rows of `row_bytes` of tensor k's pattern from byte `first`, pitch. */
static uint64_t host_digest(uint64_t g, size_t k, uint64_t first, uint64_t rows, uint64_t row_bytes,
                            uint64_t pitch, unsigned char *out)
{
    wsync64_state_t st;
    wsync64_init(&st);
    unsigned char *row = malloc(row_bytes ? row_bytes : 1);
    for (uint64_t r = 0; r < rows; r++) {
        for (uint64_t b = 0; b < row_bytes; b++)
            row[b] = wg_pattern_byte(seed_of(g) + k * SYNC_SLOT / 8, first + r * pitch + b);
        wsync64_update(&st, row, row_bytes);
        if (out)
            memcpy(out + r * row_bytes, row, row_bytes);
    }
    free(row);
    return wsync64_final(&st);
}

static int producer(int fd, void *arg)
{
    const wsync_plugin_t *p = wg_load(arg, 0);
    WG_CK(cudaSetDevice(0));
    wsync_staging_config_t cfg = {
        .struct_size = sizeof(cfg), .bytes = 64u << 20, .flags = WSYNC_STAGING_FIXED_LAYOUT};
    wsync_staging_t *s;
    WG_OK(p->producer->create(&cfg, &s, err));
    cudaStream_t st;
    WG_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    unsigned char *trainer;
    WG_CK(cudaMalloc((void **)&trainer, NT * SYNC_SLOT));
    wsync_stage_tensor_t t[NT];
    for (size_t k = 0; k < NT; k++)
        t[k] = (wsync_stage_tensor_t){.struct_size = sizeof(t[k]),
                                      .name = T[k].name,
                                      .dtype = T[k].dtype,
                                      .ndim = 2,
                                      .shape = {T[k].rows, T[k].cols},
                                      .src = trainer + k * SYNC_SLOT};
    uint64_t last = 0;
    for (uint64_t g = 1; g <= SYNC_GENS; g++) {
        if (last)
            WG_OK(p->producer->wait_consumed(s, st, last, err));
        WG_CK(wh_fill(trainer, NT * SYNC_SLOT, seed_of(g), st));
        WG_OK(p->producer->stage(s, st, t, NT, err));
        const char *json;
        WG_OK(p->producer->publish(s, st, g == SYNC_GENS, &json, &last, err));
        /* the stage kernel's digests equal host wsync64 of the staged bytes */
        const wsync_plugin_t *pp = p;
        (void)pp;
        WG_CHECK(wh_send_str(fd, json) == 0, "send");
        char *ack;
        WG_CHECK(wh_recv(fd, &ack, NULL) == 0, "no ack");
        wh_free(ack);
    }
    /* restaging before wait_consumed is refused (the consumer may still read the buffer) */
    wsync_error_t e = {.struct_size = sizeof(e)};
    WG_CHECK(p->producer->stage(s, st, t, NT, &e) == WSYNC_ERR_BUSY,
             "restage before wait_consumed accepted");
    WG_OK(p->producer->wait_consumed(s, st, last, err));
    /* a layout change is refused with FIXED_LAYOUT, nothing staged */
    wsync_stage_tensor_t bad = t[0];
    bad.shape[0] = 999;
    e = (wsync_error_t){.struct_size = sizeof(e)};
    WG_CHECK(p->producer->stage(s, st, &bad, 1, &e) == WSYNC_ERR_LAYOUT_MISMATCH,
             "layout change accepted");
    wg_close_and_retire(p, s, fd);
    return 0;
}

/* Where piece i of tensor 0 lands in the fused destination. */
static uint64_t fused_at(size_t i)
{
    const uint64_t half = (PIECES / 2) * (PIECE + GAP_A);
    return i % 2 == 0 ? (i / 2) * (PIECE + GAP_A) : half + (i / 2) * (PIECE + GAP_B);
}

/* ops[0..PIECES): tensor 0's pieces into `fused`. */
static void fused_ops(wsync_copy_op_t *ops, uint64_t src_offset, unsigned char *fused)
{
    for (size_t i = 0; i < PIECES; i++)
        ops[i] = (wsync_copy_op_t){.src_offset = src_offset + i * PIECE,
                                   .src_pitch = PIECE,
                                   .dst = fused + fused_at(i),
                                   .dst_pitch = PIECE,
                                   .dst_extent = FUSED_BYTES - fused_at(i),
                                   .rows = 1,
                                   .row_bytes = PIECE};
}

/* The fused destination holds every piece of generation g's tensor 0, and poison in the gaps. */
static int fused_ok(uint64_t g, const unsigned char *got, unsigned char *want)
{
    for (size_t i = 0; i < PIECES; i++) {
        host_digest(g, 0, i * PIECE, 1, PIECE, PIECE, want);
        if (memcmp(got + fused_at(i), want, PIECE) != 0)
            return 0;
        const uint64_t end = fused_at(i) + PIECE, gap = i % 2 == 0 ? GAP_A : GAP_B;
        for (uint64_t b = end; b < end + gap && b < FUSED_BYTES; b++)
            if (got[b] != 0x5a)
                return 0;
    }
    return 1;
}

/* The engine side sets the copy engines' share between calls (WSYNC_CUDA_CE_*): it runs the
 * benchmarks' build of the plugin, which reads them at every call; the trainer runs the product. */
static int consumer(int fd, void *arg)
{
    (void)arg;
    const wsync_plugin_t *p = wg_load(WG_PLUGIN_TUNABLE, 0);
    wsync_consumer_t *c = wg_consumer(p, 0);
    wsync_stream_t st;
    WG_OK(p->consumer->stream_create(c, &st, err));
    unsigned char *dst[NT], *dst2, *slice, *odd;
    for (size_t k = 0; k < NT; k++)
        WG_OK(p->consumer->mem_alloc(c, T[k].bytes + 16, (void **)&dst[k], err));
    const uint64_t slice_rows = 4096, slice_bytes = 128, src_pitch = 512, col0 = 192;
    WG_OK(p->consumer->mem_alloc(c, slice_rows * slice_bytes, (void **)&slice, err));
    WG_OK(p->consumer->mem_alloc(c, 4096, (void **)&odd, err));
    WG_OK(p->consumer->mem_alloc(c, T[0].bytes + 16, (void **)&dst2, err));
    unsigned char *fused, *poison = malloc(FUSED_BYTES), *fused_host = malloc(FUSED_BYTES);
    WG_OK(p->consumer->mem_alloc(c, FUSED_BYTES, (void **)&fused, err));
    memset(poison, 0x5a, FUSED_BYTES);
    unsigned char *host = malloc(T[0].bytes);
    unsigned char *want = malloc(T[0].bytes);
    const wsync_manifest_t *m = NULL;
    char *json = NULL;
    wsync_handle_t *h = NULL;
    for (uint64_t g = 1; g <= SYNC_GENS; g++) {
        size_t len;
        WG_CHECK(wh_recv(fd, &json, &len) == 0, "no manifest");
        WG_OK(p->consumer->parse_manifest(c, json, len, &m, err));
        WG_CHECK(m->n_tensors == NT && m->generation == g, "manifest %llu",
                 (unsigned long long)m->generation);
        WG_OK(p->consumer->open_handle(c, &m->buffer, &h, err));
        wsync_copy_op_t ops[NT + 3];
        for (size_t k = 0; k < NT; k++) {
            WG_CHECK(m->tensors[k].has_digest, "no digest for %s", T[k].name);
            uint64_t d = host_digest(g, k, 0, 1, T[k].bytes, T[k].bytes, NULL);
            WG_CHECK(d == m->tensors[k].digest, "%s: stage digest %016llx, host %016llx", T[k].name,
                     (unsigned long long)m->tensors[k].digest, (unsigned long long)d);
            ops[k] = (wsync_copy_op_t){.src_offset = m->tensors[k].offset,
                                       .src_pitch = T[k].bytes,
                                       .dst = dst[k],
                                       .dst_pitch = T[k].bytes,
                                       .dst_extent = T[k].bytes + 16,
                                       .rows = 1,
                                       .row_bytes = T[k].bytes,
                                       .digest = m->tensors[k].digest,
                                       .has_digest = 1};
        }
        /* row-parallel narrowing of tensor 3: columns [96, 160) of every row, 2-D */
        ops[NT] = (wsync_copy_op_t){.src_offset = m->tensors[3].offset + col0,
                                    .src_pitch = src_pitch,
                                    .dst = slice,
                                    .dst_pitch = slice_bytes,
                                    .dst_extent = slice_rows * slice_bytes,
                                    .rows = slice_rows,
                                    .row_bytes = slice_bytes,
                                    .has_digest = 1};
        ops[NT].digest = host_digest(g, 3, col0, slice_rows, slice_bytes, src_pitch, NULL);
        /* byte path: odd source offset, odd destination, odd length */
        ops[NT + 1] = (wsync_copy_op_t){.src_offset = m->tensors[2].offset + 5,
                                        .src_pitch = 3001,
                                        .dst = odd + 3,
                                        .dst_pitch = 3001,
                                        .dst_extent = 4093,
                                        .rows = 1,
                                        .row_bytes = 3001,
                                        .has_digest = 1};
        ops[NT + 1].digest = host_digest(g, 2, 5, 1, 3001, 3001, NULL);
        /* last generation: one more op whose digest is wrong; record_consumed must say so */
        const int last_gen = g == SYNC_GENS;
        ops[NT + 2] = ops[0];
        ops[NT + 2].dst = dst2;
        ops[NT + 2].digest ^= 1;
        WG_OK(p->consumer->copy_weights(c, h, st, m->generation, ops, NT + 2 + last_gen,
                                        WSYNC_COPY_VERIFY, err));
        /* The same generation again, unverified (split calls may carry one generation until
         * it is recorded): the copy engines take a share of the contiguous ops, every one over
         * 4 lanes (g 1), half the bytes of those of 1 MiB or more over 3 lanes (g 2), the
         * default (g 3); the bytes must be the same. Tensor 0 goes to the spare, which holds
         * the previous generation's bytes. */
        static const char *share[] = {"1", "0.5", NULL}, *min_bytes[] = {"0", "1048576", NULL};
        static const char *lanes[] = {"4", "3", NULL};
        if (lanes[g - 1])
            setenv("WSYNC_CUDA_CE_LANES", lanes[g - 1], 1);
        if (share[g - 1])
            setenv("WSYNC_CUDA_CE_SHARE", share[g - 1], 1);
        if (min_bytes[g - 1])
            setenv("WSYNC_CUDA_CE_MIN_BYTES", min_bytes[g - 1], 1);
        wsync_copy_op_t again[NT + 2 + PIECES];
        for (size_t k = 0; k < NT + 2; k++) {
            again[k] = ops[k];
            again[k].has_digest = 0;
        }
        again[0].dst = dst2;
        fused_ops(again + NT + 2, m->tensors[0].offset, fused);
        WG_OK(p->consumer->mem_copy(c, fused, poison, FUSED_BYTES, 0, err));
        WG_OK(p->consumer->copy_weights(c, h, st, m->generation, again, NT + 2 + PIECES, 0, err));
        unsetenv("WSYNC_CUDA_CE_SHARE");
        unsetenv("WSYNC_CUDA_CE_MIN_BYTES");
        unsetenv("WSYNC_CUDA_CE_LANES");
        if (last_gen) {
            wsync_error_t e = {.struct_size = sizeof(e)};
            WG_CHECK(p->consumer->record_consumed(c, h, 1, &e) == WSYNC_ERR_DIGEST_MISMATCH,
                     "wrong digest not reported");
            WG_CHECK(strstr(e.message, "op 7") != NULL, "mismatch names the wrong op: %s",
                     e.message);
        } else {
            WG_OK(p->consumer->record_consumed(c, h, 1, err));
        }
        /* bytes too, not just digests */
        WG_OK(p->consumer->mem_copy(c, host, dst[0], T[0].bytes, 1, err));
        host_digest(g, 0, 0, 1, T[0].bytes, T[0].bytes, want);
        WG_CHECK(memcmp(host, want, T[0].bytes) == 0, "tensor 0 bytes differ");
        WG_OK(p->consumer->mem_copy(c, host, slice, slice_rows * slice_bytes, 1, err));
        host_digest(g, 3, col0, slice_rows, slice_bytes, src_pitch, want);
        WG_CHECK(memcmp(host, want, slice_rows * slice_bytes) == 0, "slice bytes differ");
        WG_OK(p->consumer->mem_copy(c, host, odd + 3, 3001, 1, err));
        host_digest(g, 2, 5, 1, 3001, 3001, want);
        WG_CHECK(memcmp(host, want, 3001) == 0, "byte-path bytes differ");
        WG_OK(p->consumer->mem_copy(c, host, dst2, T[0].bytes, 1, err));
        host_digest(g, 0, 0, 1, T[0].bytes, T[0].bytes, want);
        WG_CHECK(memcmp(host, want, T[0].bytes) == 0,
                 "tensor 0 bytes differ after the unverified copy (CE share %s)",
                 share[g - 1] ? share[g - 1] : "default");
        WG_OK(p->consumer->mem_copy(c, host, dst[3], T[3].bytes, 1, err));
        host_digest(g, 3, 0, 1, T[3].bytes, T[3].bytes, want);
        WG_CHECK(memcmp(host, want, T[3].bytes) == 0,
                 "tensor 3 bytes differ after the unverified copy (CE share %s)",
                 share[g - 1] ? share[g - 1] : "default");
        WG_OK(p->consumer->mem_copy(c, host, odd + 3, 3001, 1, err));
        host_digest(g, 2, 5, 1, 3001, 3001, want);
        WG_CHECK(memcmp(host, want, 3001) == 0, "byte-path bytes differ (unverified)");
        WG_OK(p->consumer->mem_copy(c, fused_host, fused, FUSED_BYTES, 1, err));
        WG_CHECK(fused_ok(g, fused_host, want),
                 "fused destination differs: a piece is wrong or a gap was written (CE share %s)",
                 share[g - 1] ? share[g - 1] : "default");
        if (g < SYNC_GENS) {
            WG_OK(p->consumer->close_handle(c, h, err));
            p->consumer->manifest_free(c, m);
            wh_free(json);
            WG_CHECK(wh_send_str(fd, "ack") == 0, "send");
        }
    }
    /* Last generation still open: refused copies write nothing. */
    wsync_copy_op_t op;
    wsync_error_t e = {.struct_size = sizeof(e)};
    uint64_t g = m->generation;
    /* out of bounds: nothing is written (poison stays) */
    WG_OK(p->consumer->stream_synchronize(c, st, err));
    memset(host, 0x5a, 4096);
    WG_OK(p->consumer->mem_copy(c, odd, host, 4096, 0, err));
    op = (wsync_copy_op_t){.src_offset = m->tensors[2].offset,
                           .src_pitch = 4096,
                           .dst = odd,
                           .dst_pitch = 4096,
                           .dst_extent = 4095,
                           .rows = 1,
                           .row_bytes = 4096};
    e.code = WSYNC_OK;
    WG_CHECK(p->consumer->copy_weights(c, h, st, g + 1, &op, 1, 0, &e) == WSYNC_ERR_OUT_OF_BOUNDS,
             "dst_extent overrun accepted");
    op.dst_extent = 4096;
    op.src_offset = m->buffer.bytes - 100;
    e.code = WSYNC_OK;
    WG_CHECK(p->consumer->copy_weights(c, h, st, g + 1, &op, 1, 0, &e) == WSYNC_ERR_OUT_OF_BOUNDS,
             "source overrun accepted");
    op.src_offset = m->tensors[2].offset;
    e.code = WSYNC_OK;
    WG_CHECK(p->consumer->copy_weights(c, h, st, g - 1, &op, 1, 0, &e) ==
                 WSYNC_ERR_STALE_GENERATION,
             "replayed generation accepted");
    WG_OK(p->consumer->stream_synchronize(c, st, err));
    WG_OK(p->consumer->mem_copy(c, want, odd, 4096, 1, err));
    WG_CHECK(memcmp(host, want, 4096) == 0, "a refused copy wrote bytes");
    /* the adapter path refuses a missing source and slot (torture_gpu_adapter covers loads) */
    e.code = WSYNC_OK;
    WG_CHECK(p->consumer->hot_load_adapter(c, NULL, NULL, NULL, &e) == WSYNC_ERR_INVALID_ARGUMENT,
             "hot_load_adapter");

    WG_OK(p->consumer->close_handle(c, h, err));
    p->consumer->manifest_free(c, m);
    wh_free(json);
    WG_CHECK(wh_send_str(fd, "ack") == 0, "send");
    WG_CHECK(wh_send_str(fd, "closed") == 0, "send");
    WG_OK(p->consumer->stream_destroy(c, st, err));
    WG_OK(p->consumer->finalize(c, err));
    free(host);
    free(want);
    free(poison);
    free(fused_host);
    return 0;
}

static void test_sync_with_digests(void **state)
{
    (void)state;
    assert_true(wg_pair_passes(producer, consumer, (void *)WG_PLUGIN));
}

int main(void)
{
    wg_require_device(WG_PLUGIN);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sync_with_digests)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
