/* Edge validation shared by backends: copy ops and generations, checked before anything is
 * enqueued, so an error leaves every destination untouched. */
#ifndef WSYNC_COMMON_VALIDATE_H
#define WSYNC_COMMON_VALIDATE_H

#include "wsync_abi.h"

/* Every op: dst non-NULL when it moves bytes; pitches >= row_bytes when rows > 1; last source
 * byte < src_bytes; last destination byte < dst_extent; no arithmetic overflow; no two ops write
 * a common destination byte (exactly, rows and pitches counted: interleaved rows that do not
 * touch are fine). Zero-byte ops are allowed (empty tensors). Message names the op indexes and
 * the offending numbers. */
wsync_result_t wsync_validate_copy_ops(const wsync_copy_op_t *ops, size_t n, uint64_t src_bytes,
                                       wsync_error_t *err);

/* The destination spans of the last op sets a consumer found disjoint (one slot per set, found
 * by its first span: a sync's buckets each keep theirs), in the order they were given: a call
 * whose spans equal a slot's byte for byte skips the sort and the scan (a steady sync passes the
 * same ops every time; 4 719 MoE tensors sort in about a millisecond). Every other rule is
 * checked on every call. Zero-initialised; one caller at a time (the consumer's lock);
 * wsync_validate_memo_free when the consumer ends. */
#define WSYNC_VALIDATE_MEMO_SLOTS 16
typedef struct wsync_validate_kept {
    void *spans;
    size_t n, cap; /* n: spans valid (0: none) */
} wsync_validate_kept_t;
/* A copy_quantized call found valid: its ops, then its quant entries, byte for byte. */
typedef struct wsync_validate_call {
    void *in;
    size_t n, cap; /* n: ops held (0: none) */
    uint64_t src_bytes;
} wsync_validate_call_t;
typedef struct wsync_validate_memo {
    wsync_validate_kept_t slot[WSYNC_VALIDATE_MEMO_SLOTS];
    unsigned next; /* the slot a new set takes */
    void *scratch; /* copy_quantized's destinations and scale flags, reused by the next call */
    size_t scratch_cap;
    wsync_validate_call_t call[WSYNC_VALIDATE_MEMO_SLOTS]; /* copy_quantized calls found valid */
    unsigned call_next;                                    /* the entry a new call takes */
} wsync_validate_memo_t;
void wsync_validate_memo_free(wsync_validate_memo_t *memo);

/* wsync_validate_copy_ops with a consumer's memo (NULL: none). */
wsync_result_t wsync_validate_copy_ops_memo(wsync_validate_memo_t *memo, const wsync_copy_op_t *ops,
                                            size_t n, uint64_t src_bytes, wsync_error_t *err);

/* copy_quantized's ops (wsync_quant_t): plain ops as above; a quantized op's source (rows of
 * row_bytes = cols x its dtype's size, at src_pitch) inside src_bytes, its fp8 bytes (rows of
 * cols at dst_pitch) inside dst_extent, its scales inside scale_extent (BLOCK: ceil(rows / 128)
 * rows of ceil(cols / 128) floats at scale_pitch; CHANNEL: rows floats at scale_pitch; TENSOR: one
 * float, shared by every TENSOR op naming it), and no two destinations (fp8 bytes, plain ops'
 * bytes, scales) meeting; in messages the scales of op i are op n + i. */
wsync_result_t wsync_validate_quant_ops(const wsync_copy_op_t *ops, const wsync_quant_t *quant,
                                        size_t n, uint64_t src_bytes, wsync_error_t *err);
/* The same with a consumer's memo (NULL: none): a call whose ops, quant entries and src_bytes
 * equal, byte for byte, those of one of the last WSYNC_VALIDATE_MEMO_SLOTS calls found valid is
 * valid without the checks (the rules depend on nothing else; a MoE bucket's 4 719 ops take
 * 0.1-0.2 ms to check, host time before the GPU starts). Any other call is checked whole. */
wsync_result_t wsync_validate_quant_ops_memo(wsync_validate_memo_t *memo,
                                             const wsync_copy_op_t *ops, const wsync_quant_t *quant,
                                             size_t n, uint64_t src_bytes, wsync_error_t *err);

/* copy_segments' ops (memo: a consumer's, or NULL): op_segment[i] < n_segs, op i inside segment
 * op_segment[i] (seg_bytes) with the per-op rules above, and no two ops of any segments writing a
 * common destination byte. On success *out (malloc'd; the caller frees) holds the ops with
 * src_offset moved to seg_base[op_segment[i]] + src_offset: the address the backend reads. */
wsync_result_t wsync_validate_segment_ops(wsync_validate_memo_t *memo, const wsync_copy_op_t *ops,
                                          const uint32_t *op_segment, size_t n,
                                          const uint64_t *seg_bytes, const uint64_t *seg_base,
                                          size_t n_segs, wsync_copy_op_t **out, wsync_error_t *err);

/* The same, the segments' sizes and addresses asked of the backend: seg(user, k, &bytes, &base)
 * returns 0, or -1 when segs[k] is no open segment handle of this consumer (INVALID_ARGUMENT
 * naming k and `what`). */
typedef int (*wsync_segment_fn)(void *user, size_t k, uint64_t *bytes, uint64_t *base);
wsync_result_t wsync_validate_segments(wsync_validate_memo_t *memo, const wsync_copy_op_t *ops,
                                       const uint32_t *op_segment, size_t n, size_t n_segs,
                                       wsync_segment_fn seg, void *user, const char *what,
                                       wsync_copy_op_t **out, wsync_error_t *err);

/* digest_regions' arguments, for every backend: consumer, regions and out non-NULL when n > 0,
 * n at most UINT32_MAX, and each region that has bytes a non-NULL dst with a pitch of at least
 * its row_bytes when it has several rows. INVALID_ARGUMENT naming the region. */
wsync_result_t wsync_validate_regions(const void *consumer, const wsync_copy_op_t *regions,
                                      size_t n, const uint64_t *out, wsync_error_t *err);

/* copy_weights' arguments, for every backend: ops non-NULL when n_ops > 0, n_ops at most
 * UINT32_MAX (one launch indexes ops with 32 bits), no flag but WSYNC_COPY_VERIFY.
 * INVALID_ARGUMENT naming the offending value. */
wsync_result_t wsync_validate_copy_args(const wsync_copy_op_t *ops, size_t n_ops, uint32_t flags,
                                        wsync_error_t *err);

/* generation must be > last (strictly increasing per buffer; a replay is refused). */
wsync_result_t wsync_validate_generation(uint64_t last, uint64_t generation, wsync_error_t *err);

/* An adapter source FROM_MANIFEST: `m` must be non-NULL, describe the buffer `key` was opened for
 * (wsync_cache_key_equal) and fit in the handle's `bytes`, and its generation must be newer than
 * `last_generation`. INVALID_ARGUMENT / STALE_GENERATION with the offending values. */
wsync_result_t wsync_validate_adapter_manifest(const wsync_manifest_t *m,
                                               const wsync_buffer_desc_t *key, uint64_t bytes,
                                               uint64_t last_generation, wsync_error_t *err);

/* hot_load_adapter's arguments: consumer, source and slot all non-NULL. */
wsync_result_t wsync_validate_adapter_call(const void *consumer, const wsync_adapter_source_t *src,
                                           const wsync_adapter_slot_t *slot, wsync_error_t *err);

/* Total bytes the ops move (for throughput reports). */
uint64_t wsync_copy_ops_bytes(const wsync_copy_op_t *ops, size_t n);

#endif
