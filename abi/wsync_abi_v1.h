/*
 * wsync ABI, version 1 — FROZEN.
 *
 * This header is the contract between an inference engine (the "host" that dlopens the plugin)
 * and a wsync plugin (libwsync_cpu.so, libwsync_cuda.so, ...). Once released, nothing in it may
 * change: later versions append members to the tables (guarded by WSYNC_HAS_OP) or add a new
 * frozen header wsync_abi_v2.h. See docs/ABI.md for the growth rules.
 *
 * Conventions used by every member below:
 *   - Every table and every host-filled struct starts with `size_t struct_size`; the filler sets it
 *     to sizeof() of the struct it was compiled against. Readers never touch a member that lies
 *     past struct_size (WSYNC_HAS_OP / WSYNC_HAS_FIELD).
 *   - Every function returns wsync_result_t. `err` may be NULL; when it is not, the first failure
 *     reported into it is kept (first error wins) and nothing is allocated.
 *   - Strings passed in are borrowed for the duration of the call unless a member says otherwise.
 *   - Nothing in a plugin aborts, exits or prints: diagnostics go to the host's logger only.
 *   - The stream rule: every wsync_stream_t argument names the stream the work is ordered on, and
 *     NULL means what it means in every CUDA API, the legacy default stream (torch's default
 *     stream, whose cuda_stream is 0): the work runs after everything the caller queued there.
 *     cudaStreamPerThread and cudaStreamLegacy are accepted as the handles they are. A plugin
 *     never substitutes a private stream. CPU backend: NULL is the plugin's in-order queue of
 *     that consumer or staging buffer (the caller's CPU work is done when it calls).
 */
#ifndef WSYNC_ABI_V1_H
#define WSYNC_ABI_V1_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version changelog:
 *   1 — first release.
 *       wsync_consumer_ops_v1_t: create, parse_manifest, manifest_free, open_handle,
 *         close_handle, copy_weights, record_consumed, hot_load_adapter, enqueue_host_fn,
 *         finalize; optional stream_create, stream_destroy, stream_synchronize, unload_adapter,
 *         mem_alloc, mem_free, mem_copy.
 *       wsync_producer_ops_v1_t: create, stage, publish, wait_consumed, retire; optional
 *         stream_create, stream_destroy, stream_synchronize, read_back.
 *       wsync_plugin_v1_t (name, version, consumer, producer) from wsync_plugin_init.
 *       Buffer kinds: cuda_ipc (1), host_shm (2), cuda_vmm_fd (3), torch_expandable (4, appended
 *         in 0.1.1, with torch's own handles as kind "torch" on the wire).
 *       Results 0-17; WSYNC_ERR_BAD_REQUEST (18), WSYNC_ERR_BAD_ADAPTER (19) appended in 0.1.1.
 *       wsync_consumer_config_v1_t: device_ordinal, timeout_ms; max_manifest_bytes and
 *         max_manifest_tensors appended in 0.1.1.
 *       Flags: WSYNC_COPY_VERIFY; WSYNC_STAGING_FIXED_LAYOUT, WSYNC_STAGING_NO_DIGESTS.
 *       Appended in 0.1.2 (direct mode): WSYNC_STAGING_DIRECT; buffer kind host_pid (5);
 *         wsync_manifest_v1_t.n_segments, segments, tensor_segment;
 *         wsync_consumer_ops_v1_t.copy_segments (optional); digest_regions (optional, the
 *         weight checker).
 *       Appended in 0.1.3: buffer kind cuda_vmm_run (6), direct mode's segments in cuMem memory;
 *         wsync_quant_v1_t and wsync_consumer_ops_v1_t.copy_quantized (optional): FP8 engine
 *         parameters quantized from bf16 / f16 / f32 sources inside the copy.
 *       Appended in 0.1.4: the copy_quantized flag WSYNC_COPY_QUANT_ONE_PASS.
 *       Appended in 0.1.5: wsync_stage_tensor_v1_t.src_dtype (a converting stage);
 *         wsync_producer_ops_v1_t.register_host, unregister_host (optional: stage from host
 *         memory, a checkpoint's mapping, on CUDA).
 *       Appended in 0.1.6: the copy_quantized kinds WSYNC_QUANT_FP8_CHANNEL (one scale per row)
 *         and WSYNC_QUANT_FP8_TENSOR (one scale for every op naming the same scale_dst).
 *       0.1.7: no member added. Behaviour within the rules: a copy of a generation its buffer
 *         never published is BAD_MANIFEST; the manifest limits' defaults are 16 MiB and 65536
 *         tensors; a staged manifest's tensors must own disjoint, element-aligned bytes.
 *       Appended in 0.1.8: wsync_error_v1_t.op and op_valid, the failing op's index.
 *       Appended in 0.1.9: buffer kind nixl (7) and WSYNC_STAGING_NIXL, buckets pulled across
 *         processes and hosts over NIXL.
 *       Appended in 0.1.10: wsync_manifest_v1_t.plan and replay, WSYNC_ERR_UNKNOWN_PLAN (20):
 *         a bucket's validated copy plan recorded once and replayed by id (manifest schema 2). */
#define WSYNC_ABI_VERSION_1 1u

/* ------------------------------------------------------------------ results */

/* Values are explicit and never renumbered; new codes are appended. */
typedef enum wsync_result {
    WSYNC_OK = 0,
    WSYNC_ERR_INVALID_ARGUMENT = 1, /* caller misuse: NULL where not allowed, bad flag, ... */
    WSYNC_ERR_INCOMPATIBLE = 2,     /* no common ABI version */
    WSYNC_ERR_NO_DEVICE = 3,        /* backend has no usable device/driver on this machine */
    WSYNC_ERR_NOT_SUPPORTED = 4,    /* member or feature not implemented by this plugin */
    WSYNC_ERR_OUT_OF_MEMORY = 5,
    WSYNC_ERR_BAD_MANIFEST = 6,     /* manifest JSON malformed or fails schema validation */
    WSYNC_ERR_OUT_OF_BOUNDS = 7,    /* a copy op or tensor lies outside its buffer/parameter */
    WSYNC_ERR_STALE_GENERATION = 8, /* generation not newer than the last one consumed */
    WSYNC_ERR_TIMEOUT = 9,          /* a bounded wait expired */
    WSYNC_ERR_DIGEST_MISMATCH = 10, /* wsync64 of copied bytes differs from the manifest */
    WSYNC_ERR_SYSTEM = 11,          /* an OS / driver call failed; message has errno or code */
    WSYNC_ERR_BUSY = 12,            /* resource still in use (e.g. retire while mapped) */
    WSYNC_ERR_LAYOUT_MISMATCH = 13, /* retained staging layout differs from the new one */
    WSYNC_ERR_NOT_FOUND = 14,       /* named object (tensor, parameter, adapter) unknown */
    WSYNC_ERR_PEER_GONE = 15,       /* the other process exited or closed the buffer */
    WSYNC_ERR_INTERNAL = 16,        /* a bug in wsync; please report with the message */
    WSYNC_ERR_PERMISSION = 17,      /* another user's object, or a mode other than 0600 */
    WSYNC_ERR_BAD_REQUEST = 18,     /* an engine request (shims): not JSON, no method, a field
                                       missing or of the wrong type; appended in 0.1.1 */
    WSYNC_ERR_BAD_ADAPTER = 19,     /* a LoRA adapter's files or tensors (adapter_config.json,
                                       safetensors, PEFT names) are malformed; appended in 0.1.1 */
    WSYNC_ERR_UNKNOWN_PLAN = 20     /* a replayed plan id this engine holds no plan under, or
                                       whose segments changed: send the bucket in full; the
                                       bucket stays unconsumed; appended in 0.1.10 */
} wsync_result_t;

/* --------------------------------------------------------- error and logging */

#define WSYNC_ERROR_MESSAGE_LEN_V1 320
#define WSYNC_ERROR_WHERE_LEN_V1 64

/* Caller-owned error details. Zero-initialise (or set code = WSYNC_OK) before the first call;
 * a plugin fills it only when `code` is still WSYNC_OK (first error wins). Never allocates. */
typedef struct wsync_error_v1 {
    size_t struct_size;
    wsync_result_t code;
    char where[WSYNC_ERROR_WHERE_LEN_V1];     /* the function that failed, e.g. "copy_weights" */
    char message[WSYNC_ERROR_MESSAGE_LEN_V1]; /* names the offending value and what to do */
    /* Appended in 0.1.8. When the failure is one op's (a copy op, a region, a quantized op, or
     * the scales of op i), op_valid is 1 and op its index in the call's array; else op_valid
     * is 0. A plugin writes them only when struct_size covers them (WSYNC_HAS_FIELD), so a host
     * finds the failing op without reading the message. */
    uint64_t op;
    uint32_t op_valid;
} wsync_error_v1_t;

typedef enum wsync_log_level {
    WSYNC_LOG_ERROR = 0,
    WSYNC_LOG_WARN = 1,
    WSYNC_LOG_INFO = 2,
    WSYNC_LOG_DEBUG = 3
} wsync_log_level_t;

/* Host logger. May be called from any thread, including plugin worker threads; the host must
 * make it thread safe. Must not call back into the plugin. */
typedef void (*wsync_log_fn_v1_t)(void *user, wsync_log_level_t level, const char *file, int line,
                                  const char *fmt, ...);

/* --------------------------------------------------------------- data types */

/* Element types, values fixed. Names on the wire are PyTorch's ("bfloat16", "float32", ...). */
typedef enum wsync_dtype {
    WSYNC_DTYPE_INVALID = 0,
    WSYNC_DTYPE_BF16 = 1,
    WSYNC_DTYPE_F16 = 2,
    WSYNC_DTYPE_F32 = 3,
    WSYNC_DTYPE_F64 = 4,
    WSYNC_DTYPE_I8 = 5,
    WSYNC_DTYPE_U8 = 6,
    WSYNC_DTYPE_I16 = 7,
    WSYNC_DTYPE_I32 = 8,
    WSYNC_DTYPE_I64 = 9,
    WSYNC_DTYPE_BOOL = 10,
    WSYNC_DTYPE_F8_E4M3 = 11,
    WSYNC_DTYPE_F8_E5M2 = 12
} wsync_dtype_t;

#define WSYNC_MAX_DIMS_V1 8
#define WSYNC_HANDLE_MAX_V1 128 /* bytes of an opaque handle (cudaIpcMemHandle_t is 64) */
#define WSYNC_DEVICE_MAX_V1 64  /* "GPU-<uuid>" or "cpu" */

typedef enum wsync_buffer_kind {
    WSYNC_BUFFER_INVALID = 0,
    WSYNC_BUFFER_CUDA_IPC = 1,    /* legacy cudaIpcMemHandle_t */
    WSYNC_BUFFER_HOST_SHM = 2,    /* POSIX shared memory; handle bytes are the shm name */
    WSYNC_BUFFER_CUDA_VMM_FD = 3, /* a cuMem allocation exported as a POSIX fd (the default
                                     staging kind of the CUDA plugin) */
    /* PyTorch expandable segments: torch's share of cuMem allocations (a header and one POSIX fd
     * per segment, mapped back to back). Manifests name a torch handle as kind "torch" (torch's
     * bytes verbatim, 'c' or 'e'); parse_manifest turns 'c' into CUDA_IPC and 'e' into this. */
    WSYNC_BUFFER_TORCH_EXPANDABLE = 4,
    /* Appended in 0.1.2, a segment kind only (direct mode): the producer process's own memory,
     * read by the CPU backend with process_vm_readv; handle bytes are the segment's address in
     * that process (8 bytes, little-endian). */
    WSYNC_BUFFER_HOST_PID = 5,
    /* Appended in 0.1.3, a segment kind only (direct mode): a run of the producer's cuMem chunks
     * (PyTorch's expandable segments, VMM memory), one POSIX fd per chunk, mapped back to back by
     * the CUDA backend; the handle names a descriptor listing the fds (docs/ABI.md). */
    WSYNC_BUFFER_CUDA_VMM_RUN = 6,
    /* Appended in 0.1.9, a bucket's buffer (staged mode, WSYNC_STAGING_NIXL): the producer's
     * staging segment registered with its NIXL agent, read by the consumer with one-sided NIXL
     * READs, on this host or another (docs/DESIGN.md, "Beyond one host"). Handle bytes: the data
     * region's address and the control block's (8 bytes each, little-endian) in the producer,
     * then its agent's name. The manifest's buffer carries the agent's metadata ("peer",
     * base64), loaded by parse_manifest; pid is 0. */
    WSYNC_BUFFER_NIXL = 7
} wsync_buffer_kind_t;

/* ------------------------------------------------------------ manifest view */

/* One tensor of a bucket, as validated by parse_manifest: offset + nbytes lies inside the buffer,
 * nbytes == element size x product(shape), names are unique and non-empty. */
typedef struct wsync_tensor_desc_v1 {
    size_t struct_size;
    const char *name;
    wsync_dtype_t dtype;
    uint32_t ndim;
    int64_t shape[WSYNC_MAX_DIMS_V1];
    uint64_t offset; /* bytes from the start of the buffer's usable region */
    uint64_t nbytes;
    uint64_t digest; /* wsync64, valid when has_digest */
    int has_digest;
} wsync_tensor_desc_v1_t;

/* The staging buffer a manifest names. For a foreign buffer (e.g. a PyTorch storage exported with
 * reduce_tensor) `base_offset` is the storage offset inside the IPC allocation, and
 * has_ready / has_consumed may be 0. */
typedef struct wsync_buffer_desc_v1 {
    size_t struct_size;
    wsync_buffer_kind_t kind;
    uint8_t handle[WSYNC_HANDLE_MAX_V1];
    uint32_t handle_len;
    uint64_t bytes;       /* usable bytes from base_offset */
    uint64_t base_offset; /* start of the usable region inside the mapped allocation */
    int64_t pid;          /* producer pid */
    char device[WSYNC_DEVICE_MAX_V1];
    uint8_t ready[WSYNC_HANDLE_MAX_V1]; /* event handle (CUDA) or backend token */
    uint32_t ready_len;
    int has_ready;
    uint8_t consumed[WSYNC_HANDLE_MAX_V1];
    uint32_t consumed_len;
    int has_consumed;
    char control[WSYNC_HANDLE_MAX_V1]; /* optional shm name of the control segment ("" = none) */
} wsync_buffer_desc_v1_t;

/* A parsed, fully validated manifest. Owned by the plugin; valid until manifest_free. */
typedef struct wsync_manifest_v1 {
    size_t struct_size;
    uint32_t schema;     /* the "wsync" field */
    uint64_t generation; /* strictly increasing per buffer */
    int finished;        /* last bucket of this weight version */
    wsync_buffer_desc_v1_t buffer;
    size_t n_tensors;
    const wsync_tensor_desc_v1_t *tensors;
    /* Appended in 0.1.2 (direct mode, WSYNC_STAGING_DIRECT): the producer's own memory that the
     * tensors live in, each segment an allocation of its own (cuda_ipc: a cudaMalloc segment,
     * its handle the 64 IPC bytes then the producer's 8-byte allocation id, so memory freed and
     * re-made at the same address is another buffer; host_pid on the CPU backend). `buffer` is
     * then the bucket's synchronisation object alone (ready, consumed, generations): its few
     * bytes hold no tensor, so copy_weights of these tensors against it is refused as out of
     * bounds, and copy_segments reads them. n_segments is 0 otherwise. tensor_segment[i] is
     * the segment of tensors[i] (its offset counts from that segment's start): a parallel array,
     * since the tensor array's element size is fixed in v1. NULL without segments. */
    size_t n_segments;
    const wsync_buffer_desc_v1_t *segments;
    const uint32_t *tensor_segment;
    /* Appended in 0.1.10 (docs/DESIGN.md, "Plan once, replay"): the plan id this manifest
     * records ("plan", schema 1: its tensors are validated and mapped as always, and the engine
     * keeps the result under the id), or, with replay set, the plan it replays ("replay",
     * schema 2: no tensors; buffer, generation, finished and the segments as always). NULL:
     * neither. At most WSYNC_PLAN_ID_MAX_V1 characters of [0-9A-Za-z._:-]. */
    const char *plan;
    int replay;
} wsync_manifest_v1_t;
#define WSYNC_PLAN_ID_MAX_V1 64

/* ------------------------------------------------------------ copy operations */

/* One 2-D copy: `rows` rows of `row_bytes` each, from src_offset (bytes into the buffer's usable
 * region) with src_pitch between rows, to dst with dst_pitch. A 1-D copy is rows = 1.
 * dst_extent is the size in bytes of the engine parameter region that contains dst, from dst:
 * the plugin refuses an op whose last byte would fall outside [dst, dst + dst_extent).
 * When the call asks for verification and has_digest is set, the wsync64 digest of the bytes the
 * op reads (rows concatenated in order) must equal `digest`.
 * No struct_size: ops come in arrays indexed by the caller's sizeof, so the element size is part
 * of v1 and never changes. A field it needs later comes with a new member that takes a new
 * array type (or with v2), never by growing this struct. */
typedef struct wsync_copy_op_v1 {
    uint64_t src_offset;
    uint64_t src_pitch;
    void *dst;
    uint64_t dst_pitch;
    uint64_t dst_extent;
    uint64_t rows;
    uint64_t row_bytes;
    uint64_t digest;
    int has_digest;
} wsync_copy_op_v1_t;

#define WSYNC_COPY_VERIFY 0x1u /* compute wsync64 of every op with has_digest and compare */
/* Appended in 0.1.4, copy_quantized only (copy_weights and copy_segments refuse it): check each
 * quantized block for NaN and infinity as it is quantized, in the one pass over the sources,
 * instead of a check of the whole call before anything is written. A block holding such a value
 * (a row for WSYNC_QUANT_FP8_CHANNEL; for WSYNC_QUANT_FP8_TENSOR every op sharing its scale) is
 * left as it was, every other op and block of the call is written, and the error
 * (INVALID_ARGUMENT naming the op, row and column) is reported by record_consumed. */
#define WSYNC_COPY_QUANT_ONE_PASS 0x2u

/* Appended in 0.1.3. How op i of copy_quantized turns its source into its destination. kind
 * WSYNC_QUANT_NONE: a plain copy (op as in copy_weights). WSYNC_QUANT_FP8_BLOCK: the source is
 * rows x cols elements of src_dtype (bf16, f16 or f32; op.row_bytes = cols x its size, at
 * op.src_pitch), the destination rows x cols e4m3fn bytes at op.dst_pitch (op.dst_extent bytes
 * from op.dst), quantized in blocks of 128 x 128 from the op's first row and column: per block
 * amax = max |x| (at least 1e-4), each value x * ((1 / amax) x 448) in float cast to e4m3fn
 * (nearest even, saturating), and the block's float scale amax x (1 / 448) (the reciprocal
 * rounded to float: amax / 448 as torch computes it on a CUDA tensor) at scale_dst + (row block) x
 * scale_pitch + (column block) x 4, inside scale_extent bytes from scale_dst (DeepGEMM's
 * per_block_cast_to_fp8, the layout of weight / weight_scale_inv in DeepSeek-V3 and Qwen3-FP8
 * checkpoints). A NaN or infinite source value refuses the whole call, before anything is written.
 * Appended in 0.1.6, vLLM's `weight_scale` layouts (its CUDA kernels' arithmetic, in float, with
 * IEEE division; the clamp is fmaxf(-448, fminf(y, 448)) before the cast):
 * WSYNC_QUANT_FP8_CHANNEL: one scale per row, the float at scale_dst + row x scale_pitch (inside
 * scale_extent): scale = max(amax_row / 448, 1 / (448 x 512)), each value x / scale, clamped and
 * cast (vLLM's dynamic per-token quantization, applied to the rows of the destination).
 * WSYNC_QUANT_FP8_TENSOR: one scale for every op of the call with this kind and the same scale_dst
 * (the parts of one engine parameter: q, k and v of qkv_proj): amax over all of their sources,
 * scale = amax / 448 at scale_dst, each value x x (1 / scale), clamped and cast (vLLM's dynamic
 * per-tensor scaled_fp8_quant: an all-zero tensor gets scale 0 and every byte 0x7e, as 0 x inf is
 * NaN, which fminf takes to 448); scale_pitch is ignored, scale_extent bounds the 4 bytes. Those
 * ops must all be in the one call: a plugin cannot see a part that another call carries.
 * No struct_size: an array element whose size is fixed in v1, like wsync_copy_op_v1_t. */
#define WSYNC_QUANT_NONE 0u
#define WSYNC_QUANT_FP8_BLOCK 1u
#define WSYNC_QUANT_FP8_CHANNEL 2u
#define WSYNC_QUANT_FP8_TENSOR 3u
typedef struct wsync_quant_v1 {
    uint32_t kind;
    wsync_dtype_t src_dtype;
    uint64_t cols;
    void *scale_dst;
    uint64_t scale_pitch;
    uint64_t scale_extent;
} wsync_quant_v1_t;

/* --------------------------------------------------------------- adapters */

/* One engine LoRA module in an adapter slot. The engine owns both buffers; A is [max_rank, in]
 * and B is [out, max_rank], row-major, in `dtype`. Two copies (index 0/1) let the plugin load the
 * shadow copy while requests read the active one; *active (owned by the engine, read by it per
 * request) is switched by the plugin only after every byte of the shadow is written.
 * A packed module (qkv_proj, gate_up_proj) lists its parts: each part is an HF module suffix
 * (e.g. "q_proj") whose B rows start at out_offset.
 * No struct_size, as for wsync_copy_op_v1_t: parts are an array element whose size is fixed in
 * v1; growth is a new array type in a grown wsync_adapter_target (after its struct_size), never
 * a bigger element. */
typedef struct wsync_adapter_part_v1 {
    const char *hf_module; /* e.g. "model.layers.0.self_attn.q_proj" */
    int64_t out_offset;
    int64_t out_features;
} wsync_adapter_part_v1_t;

typedef struct wsync_adapter_target_v1 {
    size_t struct_size;
    const char *module; /* engine module name */
    wsync_dtype_t dtype;
    int64_t in_features;
    int64_t out_features;
    void *lora_a[2];
    void *lora_b[2];
    float scaling[2]; /* written by the plugin for the copy it loads */
    uint32_t rank[2]; /* written by the plugin: the adapter's rank for this module */
    size_t n_parts;   /* 0: the module maps one HF module named `module` */
    const wsync_adapter_part_v1_t *parts;
} wsync_adapter_target_v1_t;

typedef struct wsync_adapter_slot_v1 {
    size_t struct_size;
    const char *adapter_name;
    uint32_t max_rank;
    size_t n_targets;
    wsync_adapter_target_v1_t *targets;
    volatile int *active; /* 0 or 1; engine-owned */
} wsync_adapter_slot_v1_t;

typedef enum wsync_adapter_source_kind {
    WSYNC_ADAPTER_FROM_DIR = 1,     /* a PEFT directory on a local file system */
    WSYNC_ADAPTER_FROM_MANIFEST = 2 /* tensors of an opened producer buffer */
} wsync_adapter_source_kind_t;

struct wsync_handle;

typedef struct wsync_adapter_source_v1 {
    size_t struct_size;
    wsync_adapter_source_kind_t kind;
    const char *path;                    /* FROM_DIR */
    struct wsync_handle *handle;         /* FROM_MANIFEST: an open handle */
    const wsync_manifest_v1_t *manifest; /* FROM_MANIFEST: tensors named as PEFT saves them */
    const char *adapter_config_json;     /* FROM_MANIFEST: PEFT's adapter_config.json text */
} wsync_adapter_source_v1_t;

/* --------------------------------------------------------------- consumer */

struct wsync_consumer;        /* one per engine device; opaque */
struct wsync_handle;          /* a cached mapping of one producer buffer; opaque */
typedef void *wsync_stream_t; /* cudaStream_t (NULL: legacy default); CPU backend: a plugin queue */
typedef void (*wsync_host_fn_t)(void *user);

typedef struct wsync_consumer_config_v1 {
    size_t struct_size;
    int device_ordinal;  /* CUDA ordinal; ignored by the CPU backend */
    uint32_t timeout_ms; /* bound on any host-side wait (0 = 30000) */
    /* Appended in 0.1.1. parse_manifest refuses a text over these limits before it parses
     * (nothing is allocated for it): bytes of text (0 = 16 MiB) and JSON objects in it, the
     * tensors being all but the root and its buffer (0 = 65536). */
    uint64_t max_manifest_bytes;
    uint64_t max_manifest_tensors;
} wsync_consumer_config_v1_t;

typedef struct wsync_consumer_ops_v1 {
    size_t struct_size;
    uint32_t abi_version;

    /* Create a consumer bound to one device. Blocking; not thread safe with finalize.
     * *out is owned by the caller until finalize. */
    wsync_result_t (*create)(const wsync_consumer_config_v1_t *config, struct wsync_consumer **out,
                             wsync_error_v1_t *err);

    /* Parse and completely validate a manifest (JSON text, len bytes). Nothing is mapped or
     * copied. On success *out is plugin-owned until manifest_free. Thread safe. Non-blocking. */
    wsync_result_t (*parse_manifest)(struct wsync_consumer *c, const char *json, size_t len,
                                     const wsync_manifest_v1_t **out, wsync_error_v1_t *err);
    void (*manifest_free)(struct wsync_consumer *c, const wsync_manifest_v1_t *m);

    /* Map the producer buffer `desc` (or return the cached mapping: keyed by kind, handle bytes,
     * pid, device; a second open of the same buffer maps nothing and adds a reference).
     * Blocking (first open only). Thread safe. Release with close_handle. */
    wsync_result_t (*open_handle)(struct wsync_consumer *c, const wsync_buffer_desc_v1_t *desc,
                                  struct wsync_handle **out, wsync_error_v1_t *err);

    /* Drop one reference; the mapping is unmapped when the last reference goes and no copy is in
     * flight on it (waits for its streams). Blocking. */
    wsync_result_t (*close_handle)(struct wsync_consumer *c, struct wsync_handle *h,
                                   wsync_error_v1_t *err);

    /* Enqueue on `stream`: wait for the producer's *ready* of `generation`, then every op (one
     * launch on CUDA). Every op is validated (source inside the buffer, destination inside its
     * dst_extent, no two ops writing a common destination byte, generation newer than the last
     * one copied from this buffer) BEFORE anything is enqueued; on error nothing is written.
     * Non-blocking: returns once enqueued. With WSYNC_COPY_VERIFY a digest mismatch is reported by
     * record_consumed (the stream-ordered result), and the bytes of that op are written anyway:
     * callers that need all-or-nothing copy into a shadow first. Thread safe per handle only with
     * distinct streams. Stream: the copies run on `stream` itself (NULL: the legacy default
     * stream), after the caller's work queued there; *consumed* follows them (record_consumed). */
    wsync_result_t (*copy_weights)(struct wsync_consumer *c, struct wsync_handle *h,
                                   wsync_stream_t stream, uint64_t generation,
                                   const wsync_copy_op_v1_t *ops, size_t n_ops, uint32_t flags,
                                   wsync_error_v1_t *err);

    /* Record *consumed* for the last generation copied from `h`, on the stream(s) that carried
     * those copies (joined when several) — there is deliberately no stream argument. Blocks until
     * the copies are done only if `wait` is non-zero (needed to report digest results);
     * otherwise non-blocking and digest results surface at the next record. */
    wsync_result_t (*record_consumed)(struct wsync_consumer *c, struct wsync_handle *h, int wait,
                                      wsync_error_v1_t *err);

    /* Load a LoRA adapter into `slot` (shadow copy, then switch *active). Validates every name,
     * shape and dtype against the slot before writing. The copies run on `stream` (NULL: the
     * legacy default stream). Blocking. May return NOT_SUPPORTED. */
    wsync_result_t (*hot_load_adapter)(struct wsync_consumer *c,
                                       const wsync_adapter_source_v1_t *src,
                                       wsync_adapter_slot_v1_t *slot, wsync_stream_t stream,
                                       wsync_error_v1_t *err);

    /* Run fn(user) on a CPU thread once all work enqueued before it on `stream` (NULL: the legacy
     * default stream) is done, in stream order. fn must not call into the plugin. Non-blocking. */
    wsync_result_t (*enqueue_host_fn)(struct wsync_consumer *c, wsync_stream_t stream,
                                      wsync_host_fn_t fn, void *user, wsync_error_v1_t *err);

    /* Close every handle, stop worker threads, free the consumer. Blocking. c is invalid after. */
    wsync_result_t (*finalize)(struct wsync_consumer *c, wsync_error_v1_t *err);

    /* Optional helpers. CPU backend: streams are in-order queues run by a worker thread; CUDA:
     * cudaStreamCreateWithFlags(NonBlocking). stream_synchronize(NULL) waits for the legacy
     * default stream (CPU backend: the consumer's own queue). */
    wsync_result_t (*stream_create)(struct wsync_consumer *c, wsync_stream_t *out,
                                    wsync_error_v1_t *err);
    wsync_result_t (*stream_destroy)(struct wsync_consumer *c, wsync_stream_t s,
                                     wsync_error_v1_t *err);
    wsync_result_t (*stream_synchronize)(struct wsync_consumer *c, wsync_stream_t s,
                                         wsync_error_v1_t *err);

    /* Optional: forget an adapter (zero its rank in both copies after requests drain). */
    wsync_result_t (*unload_adapter)(struct wsync_consumer *c, wsync_adapter_slot_v1_t *slot,
                                     wsync_error_v1_t *err);

    /* Optional: memory helpers so device-agnostic callers (CLI, tests, reference engine) can
     * allocate "engine" memory. CPU backend: malloc; CUDA: cudaMalloc. */
    wsync_result_t (*mem_alloc)(struct wsync_consumer *c, size_t bytes, void **out,
                                wsync_error_v1_t *err);
    wsync_result_t (*mem_free)(struct wsync_consumer *c, void *p, wsync_error_v1_t *err);
    /* Blocking copy between host memory and plugin memory. kind: 0 host→plugin, 1 plugin→host. */
    wsync_result_t (*mem_copy)(struct wsync_consumer *c, void *dst, const void *src, size_t bytes,
                               int kind, wsync_error_v1_t *err);

    /* Appended in 0.1.2 (optional). copy_weights for a manifest with segments (direct mode):
     * `h` is the open handle of the manifest's buffer (ready, consumed and the generation rule
     * are its), segs[k] the open handle of segments[k] (open_handle of each), and ops[i] reads
     * from segs[op_segment[i]] (src_offset from that segment's start). One launch for every op
     * of every segment; validated as copy_weights validates (each source inside its segment,
     * destinations in extent and disjoint) before anything is enqueued. record_consumed(h)
     * follows. */
    wsync_result_t (*copy_segments)(struct wsync_consumer *c, struct wsync_handle *h,
                                    struct wsync_handle *const *segs, size_t n_segs,
                                    wsync_stream_t stream, uint64_t generation,
                                    const wsync_copy_op_v1_t *ops, const uint32_t *op_segment,
                                    size_t n_ops, uint32_t flags, wsync_error_v1_t *err);

    /* Appended in 0.1.2 (optional). wsync64 of n regions of plugin memory (engine parameters,
     * a trainer's tensors): region i is regions[i].rows rows of row_bytes at dst, dst_pitch
     * apart, digested as a copy op's bytes are (rows concatenated); the other fields are ignored.
     * Runs on `stream` after the work queued there; blocking (out[i] is set on return). */
    wsync_result_t (*digest_regions)(struct wsync_consumer *c, wsync_stream_t stream,
                                     const wsync_copy_op_v1_t *regions, size_t n, uint64_t *out,
                                     wsync_error_v1_t *err);

    /* Appended in 0.1.3 (optional). copy_weights whose ops may quantize: quant[i] says how op i
     * becomes its destination (wsync_quant_v1_t). Validated as copy_weights is (sources inside
     * the buffer; destinations, and scale regions, inside their extents and disjoint), then
     * every quantized source is checked for NaN and infinity before any op writes: a bad value
     * refuses the call (INVALID_ARGUMENT naming the op, its row and column) with nothing
     * written; with WSYNC_COPY_QUANT_ONE_PASS the check rides in the quantizing pass instead
     * (the source is read once, a bad block is left unwritten, record_consumed reports it).
     * Ordering, generations and *consumed* as copy_weights. */
    wsync_result_t (*copy_quantized)(struct wsync_consumer *c, struct wsync_handle *h,
                                     wsync_stream_t stream, uint64_t generation,
                                     const wsync_copy_op_v1_t *ops, const wsync_quant_v1_t *quant,
                                     size_t n_ops, uint32_t flags, wsync_error_v1_t *err);
} wsync_consumer_ops_v1_t;

/* --------------------------------------------------------------- producer */

struct wsync_staging; /* a retained staging buffer; opaque */

#define WSYNC_STAGING_FIXED_LAYOUT 0x1u /* the first stage fixes names/dtypes/shapes for life */
/* Stage without computing wsync64 digests: less work per bucket, at the price of no end-to-end
 * verification for this buffer. publish still waits for the stage copy (a manifest never
 * precedes its bytes). */
#define WSYNC_STAGING_NO_DIGESTS 0x2u
/* Appended in 0.1.2. Direct mode: the buffer holds no bytes of the bucket (`bytes` is ignored);
 * stage names the tensors where they live, in the caller's own memory (no copy), finding the
 * allocation that holds each one and exporting it once (cached by address and allocation id);
 * publish records *ready* after the caller's work on the stream and emits a manifest with
 * segments (wsync_manifest_v1_t). Nothing of the plugin's is reused, so stage needs no
 * wait_consumed between buckets: several buckets of one sync may be in flight. The caller must
 * not write the tensors between publish and wait_consumed of that generation. No digests are
 * computed. */
#define WSYNC_STAGING_DIRECT 0x4u
/* Appended in 0.1.9. The staging buffer is also registered with the process's NIXL agent and
 * published as a nixl buffer (WSYNC_BUFFER_NIXL): consumers on other hosts pull it and write
 * *consumed* back into it, so wait_consumed works as for a local consumer. Not with
 * WSYNC_STAGING_DIRECT. NOT_SUPPORTED at create when NIXL cannot be loaded. */
#define WSYNC_STAGING_NIXL 0x8u

typedef struct wsync_staging_config_v1 {
    size_t struct_size;
    uint64_t bytes;      /* capacity of the staging buffer */
    int device_ordinal;  /* CUDA ordinal; ignored by the CPU backend */
    uint32_t flags;      /* WSYNC_STAGING_* */
    uint32_t timeout_ms; /* bound on wait_consumed / retire (0 = 30000) */
} wsync_staging_config_v1_t;

/* A tensor the producer stages: `src` is plugin memory (device memory for CUDA), or host memory
 * given to register_host. `dtype` and `shape` are what the staging holds and the manifest names.
 * Appended in 0.1.5: `src_dtype`, the dtype of the elements at `src` (WSYNC_DTYPE_INVALID, or a
 * struct_size that ends before it: `dtype`). When it differs, both must be floating point (bf16,
 * f16, f32, f64) and the stage converts each element once, rounding to nearest even (an f32
 * checkpoint staged for a bf16 engine); any other pair is refused naming the tensor and both
 * dtypes, nothing staged. Digests are of the converted bytes. */
typedef struct wsync_stage_tensor_v1 {
    size_t struct_size;
    const char *name;
    wsync_dtype_t dtype;
    uint32_t ndim;
    int64_t shape[WSYNC_MAX_DIMS_V1];
    const void *src;
    wsync_dtype_t src_dtype;
} wsync_stage_tensor_v1_t;

typedef struct wsync_producer_ops_v1 {
    size_t struct_size;
    uint32_t abi_version;

    /* Allocate the retained staging buffer once; it lives until retire. Blocking. */
    wsync_result_t (*create)(const wsync_staging_config_v1_t *config, struct wsync_staging **out,
                             wsync_error_v1_t *err);

    /* Start a new bucket: pack `tensors` back to back (256-byte aligned) into the staging buffer
     * with stream-ordered copies on `stream`, computing wsync64 digests. The packing order puts
     * the tensors of one fused engine parameter side by side (docs/ABI.md, "Packing order"); the
     * manifest lists them in that order. The caller must have
     * waited for *consumed* of the previous generation (wait_consumed) before calling.
     * With WSYNC_STAGING_FIXED_LAYOUT, names/dtypes/shapes must equal the first bucket's
     * (LAYOUT_MISMATCH otherwise, nothing written). The copies read the sources on `stream`
     * (NULL: the legacy default stream), after the caller's writes queued there. Non-blocking
     * on CUDA. */
    wsync_result_t (*stage)(struct wsync_staging *s, wsync_stream_t stream,
                            const wsync_stage_tensor_v1_t *tensors, size_t n,
                            wsync_error_v1_t *err);

    /* Record *ready* for the next generation on `stream` (NULL: the legacy default stream; use
     * the stream stage ran on) and emit the manifest (NUL-terminated JSON, plugin-owned, valid
     * until the next publish or retire). Non-blocking. */
    wsync_result_t (*publish)(struct wsync_staging *s, wsync_stream_t stream, int finished,
                              const char **manifest_json, uint64_t *generation,
                              wsync_error_v1_t *err);

    /* Make the producer wait until the consumer's *consumed* for `generation` has fired. Call it
     * after the consumer's ack for that generation (legacy CUDA IPC events only carry the latest
     * record). CUDA: stream-ordered on `stream`, non-blocking; CPU backend: blocks up to timeout_ms
     * and returns TIMEOUT, the staging buffer staying valid for a restarted consumer. */
    wsync_result_t (*wait_consumed)(struct wsync_staging *s, wsync_stream_t stream,
                                    uint64_t generation, wsync_error_v1_t *err);

    /* Free the staging buffer. Refused with BUSY while a consumer still has it mapped (the
     * consumer closes, acks, then the producer retires). Blocking. */
    wsync_result_t (*retire)(struct wsync_staging *s, wsync_error_v1_t *err);

    /* Optional: the backend's own streams and memory, for producers with none of their own. */
    wsync_result_t (*stream_create)(struct wsync_staging *s, wsync_stream_t *out,
                                    wsync_error_v1_t *err);
    wsync_result_t (*stream_destroy)(struct wsync_staging *s, wsync_stream_t st,
                                     wsync_error_v1_t *err);
    wsync_result_t (*stream_synchronize)(struct wsync_staging *s, wsync_stream_t st,
                                         wsync_error_v1_t *err);
    /* Read the bytes of the current bucket back to host memory (tests, digests). Blocking. */
    wsync_result_t (*read_back)(struct wsync_staging *s, uint64_t offset, void *dst, size_t bytes,
                                wsync_error_v1_t *err);

    /* Optional, appended in 0.1.5: let stage read `bytes` of host memory at `ptr` (a mapped
     * checkpoint shard, read-only mappings included) until unregister_host of the same `ptr`.
     * CUDA: the range is page-locked and mapped for the device (cudaHostRegister), and a stage
     * moves it over PCIe on the copy engines, converting behind them (pinned memory from
     * cudaHostAlloc is read by the stage kernel without it; other host memory is not readable
     * by the device). CPU: host memory is plugin
     * memory; the call only checks its arguments. Ranges may not overlap. Blocking; process-wide
     * (any staging of the plugin may read a registered range). */
    wsync_result_t (*register_host)(struct wsync_staging *s, const void *ptr, uint64_t bytes,
                                    wsync_error_v1_t *err);
    wsync_result_t (*unregister_host)(struct wsync_staging *s, const void *ptr,
                                      wsync_error_v1_t *err);
} wsync_producer_ops_v1_t;

/* ----------------------------------------------------------------- plugin */

/* Filled by the host before init. */
typedef struct wsync_host_v1 {
    size_t struct_size;
    wsync_log_fn_v1_t log; /* NULL: the plugin logs nothing */
    void *log_user;
    wsync_log_level_t log_level; /* most verbose level the host wants */
} wsync_host_v1_t;

/* Returned by init; static storage owned by the plugin for the life of the process. */
typedef struct wsync_plugin_v1 {
    size_t struct_size;
    uint32_t abi_version;
    const char *name;    /* "cpu", "cuda" */
    const char *version; /* plugin release, "MAJOR.MINOR.PATCH" */
    const wsync_consumer_ops_v1_t *consumer;
    const wsync_producer_ops_v1_t *producer;
} wsync_plugin_v1_t;

/* The only exported symbol.
 * In/out negotiation: the host writes its highest supported ABI version into *abi_version; the
 * plugin writes back the highest version it supports that is <= the host's and returns the tables
 * of that version, or writes its own lowest version and returns WSYNC_ERR_INCOMPATIBLE. The host
 * then checks the answer against its own minimum. Blocking; call once per process before any
 * other member (later calls return the same tables). NO_DEVICE: the backend cannot run here. */
typedef wsync_result_t (*wsync_plugin_init_fn_t)(uint32_t *abi_version, const wsync_host_v1_t *host,
                                                 const wsync_plugin_v1_t **out,
                                                 wsync_error_v1_t *err);
#define WSYNC_PLUGIN_INIT_SYMBOL "wsync_plugin_init"

/* ---------------------------------------------------------- growth helpers */

/* True when `table`, a pointer to a table of type `type`, was built with `member` (struct_size
 * covers it) and it is non-NULL: WSYNC_HAS_OP(wsync_consumer_ops_t, ops, unload_adapter). The
 * type is named, as in libfabric's FI_CHECK_OP, so the test needs no typeof: standard C and C++
 * alike. */
#define WSYNC_HAS_OP(type, table, member)                                                          \
    ((table) != NULL &&                                                                            \
     (table)->struct_size >= offsetof(type, member) + sizeof(((const type *)0)->member) &&         \
     (table)->member != NULL)

/* True when a host-filled struct `s` of type `type` is large enough to hold `member`. */
#define WSYNC_HAS_FIELD(type, s, member)                                                           \
    ((s) != NULL && (s)->struct_size >= offsetof(type, member) + sizeof(((const type *)0)->member))

#ifdef __cplusplus
}
#endif

#endif /* WSYNC_ABI_V1_H */
