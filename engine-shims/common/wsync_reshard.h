/* Resharding (docs/RESHARD.md): a trainer and an engine with different parallelism. The trainer's
 * layout says, per trainer rank, which rectangle of which HF tensor it holds and where in its
 * segment; the engine's side is the shims' mapping (wsync_map_plan: the rectangle of each HF
 * tensor an engine rank needs and where it lands). The plan of one engine rank is every
 * intersection of the two, as copy ops from (trainer rank, segment offset) into the engine's
 * parameters: each destination byte written exactly once, each source byte read at most once,
 * no full tensor gathered anywhere. A rectangle several trainer ranks hold (data-parallel
 * replicas) is read from the nearest: the same GPU, then the same node, then another node; among
 * equally near replicas (in rank order) the engine rank on GPU g takes number g mod their count,
 * so the engine ranks share them out instead of all reading one.
 * Deterministic: the same inputs give the same ops in the same order. Pure functions; thread safe.
 */
#ifndef WSYNC_RESHARD_H
#define WSYNC_RESHARD_H

#include <stddef.h>
#include <stdint.h>

#include "wsync_abi.h"
#include "wsync_mapping.h"

/* One trainer rank's piece of HF tensor `tensor`: rows [r0, r0 + rows) x columns [c0, c0 + cols)
 * (a 1-D tensor is one row), row-major in the rank's segment at `offset`, `pitch` bytes a row. */
typedef struct wsync_reshard_piece {
    uint32_t rank;
    size_t tensor;
    int64_t r0, rows, c0, cols;
    uint64_t offset, pitch;
} wsync_reshard_piece_t;

/* Where a rank runs: its GPU (global index) and node. */
typedef struct wsync_reshard_place {
    uint32_t gpu, node;
} wsync_reshard_place_t;

typedef enum wsync_reshard_link {
    WSYNC_LINK_LOCAL = 0,  /* the same GPU: a copy inside HBM */
    WSYNC_LINK_NVLINK = 1, /* another GPU of the node (peer IPC) */
    WSYNC_LINK_NET = 2     /* another node (NCCL) */
} wsync_reshard_link_t;
#define WSYNC_LINKS 3

/* One op of a plan: op.src_offset / op.src_pitch are in trainer rank src_rank's segment; op.dst
 * and op.dst_pitch in the engine's parameters (as wsync_map_plan placed them). */
typedef struct wsync_reshard_op {
    uint32_t src_rank;
    size_t tensor;
    wsync_reshard_link_t link;
    wsync_copy_op_t op;
} wsync_reshard_op_t;

/* The trainer's layout: pieces of tensors[0..n) over ranks [0, n_ranks), placed at place[rank]. */
typedef struct wsync_reshard_src {
    const wsync_tensor_desc_t *tensors; /* name, dtype, ndim, shape (offset unused) */
    size_t n_tensors;
    const wsync_reshard_piece_t *pieces;
    size_t n_pieces;
    const wsync_reshard_place_t *place;
    uint32_t n_ranks;
} wsync_reshard_src_t;

/* The plan of the engine rank that `eng` answers for, running at `where`: *ops (wsync_reshard_free
 * it) and *n_ops. Refused naming the tensor: pieces of it that overlap without being equal, a
 * rectangle the engine needs that the pieces do not cover, a piece outside its tensor; and what
 * wsync_map_plan refuses (an unknown name, a shape the engine's parameter disagrees with). */
wsync_result_t wsync_reshard_plan(const wsync_map_table_t *table, const wsync_engine_ops_t *eng,
                                  wsync_reshard_place_t where, const wsync_reshard_src_t *src,
                                  wsync_reshard_op_t **ops, size_t *n_ops, wsync_error_t *err);

/* The trainer's pieces sorted and checked once (pieces of a tensor that overlap without being
 * equal are refused here, naming it), for the plans of many engine ranks. */
typedef struct wsync_reshard_index wsync_reshard_index_t;
wsync_result_t wsync_reshard_index_build(const wsync_reshard_src_t *src,
                                         wsync_reshard_index_t **out, wsync_error_t *err);
void wsync_reshard_index_free(wsync_reshard_index_t *x);
/* wsync_reshard_plan with src's index built by wsync_reshard_index_build. */
wsync_result_t wsync_reshard_plan_indexed(const wsync_map_table_t *table,
                                          const wsync_engine_ops_t *eng,
                                          wsync_reshard_place_t where,
                                          const wsync_reshard_src_t *src,
                                          const wsync_reshard_index_t *x, wsync_reshard_op_t **ops,
                                          size_t *n_ops, wsync_error_t *err);

/* Frees what wsync_reshard_plan and wsync_reshard_trainer_layout allocated (ops, pieces). */
void wsync_reshard_free(void *p);

/* A plan's bytes: per link kind, and per trainer rank sent over a link (out[rank][link], n_ranks
 * rows; NULL to skip). */
typedef struct wsync_reshard_bytes {
    uint64_t link[WSYNC_LINKS];
    uint64_t ops;
} wsync_reshard_bytes_t;
void wsync_reshard_count(const wsync_reshard_op_t *ops, size_t n, wsync_reshard_bytes_t *in,
                         uint64_t (*out)[WSYNC_LINKS]);

/* The trainer layouts wsync builds itself (Megatron-style and FSDP2): world = tp x fsdp x dp x pp
 * ranks, rank = tp_i + tp x (fsdp_i + fsdp x (dp_i + dp x pp_i)). Each tensor splits as the
 * mapping's rule for it says (wsync_tp_split_t: column-parallel dim 0, row-parallel dim 1, or
 * replicated), over tp; then over fsdp by dim 0 of that shard (FSDP2's chunks: ceil(rows / fsdp)
 * each, the last ones shorter or empty; a 1-D tensor by its elements); layers over pp stages in
 * contiguous runs (embeddings on the first, the final norm and lm_head on the last); dp ranks are
 * replicas. Expert parallelism (ep > 1, Megatron's EP inside the data-parallel group): the
 * experts of a layer are split over ep ranks in the linear placement (wsync_map_ep_owner), fsdp
 * rank f being EP rank f mod ep, and each expert is chunked over the fsdp / ep ranks of its EP
 * rank instead of all fsdp ranks. Each rank's pieces are packed in tensor order,
 * WSYNC_MAP_ALIGN-aligned. */
typedef struct wsync_reshard_trainer {
    uint32_t tp, fsdp, dp, pp;
    int64_t kv_heads; /* the model's, to refuse a tp that splits a query group; 0: unchecked */
    uint32_t ep;      /* expert parallelism over the fsdp ranks (dividing fsdp); 0 or 1: none */
} wsync_reshard_trainer_t;

/* Pieces of tensors[0..n) for trainer `t`: *pieces (wsync_reshard_free), *n_pieces, and each rank's
 * segment size in seg_bytes[rank] (world entries; NULL to skip). Refused naming the tensor: a
 * split the TP size does not divide (k/v heads fewer than tp included), or a name no rule of
 * `table` matches. */
wsync_result_t wsync_reshard_trainer_layout(const wsync_map_table_t *table,
                                            const wsync_reshard_trainer_t *t,
                                            const wsync_tensor_desc_t *tensors, size_t n,
                                            wsync_reshard_piece_t **pieces, size_t *n_pieces,
                                            uint64_t *seg_bytes, wsync_error_t *err);

#endif
