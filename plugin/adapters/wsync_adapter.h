/* An adapter as both sources describe it (a PEFT directory on disk, or tensors of a producer
 * buffer plus the adapter_config.json text): one entry per LoRA module with its rank, alpha,
 * scaling and its A [r, in] and B [out, r] tensors, checked against the config.
 *
 * Shape and dtype checks against an engine slot are the plan's job (wsync_adapter_plan.h). */
#ifndef WSYNC_ADAPTERS_ADAPTER_H
#define WSYNC_ADAPTERS_ADAPTER_H

#include <stddef.h>
#include <stdint.h>

#include "wsync_abi.h"
#include "wsync_tensor_view.h"

/* Where tensor bytes live; tells an executor how it may read them. */
typedef enum wsync_adapter_memory {
    WSYNC_ADAPTER_MEM_HOST = 0,  /* host memory (the read-only mapping of a safetensors file) */
    WSYNC_ADAPTER_MEM_BUFFER = 1 /* a mapped producer buffer: the backend's own memory kind */
} wsync_adapter_memory_t;

/* A tensor as PEFT names it ("base_model.model.<module>.lora_A.weight"). Row-major, packed;
 * `data` need not be aligned. */
typedef wsync_tensor_view_t wsync_adapter_tensor_t;

typedef struct wsync_adapter_module {
    const char *hf_module; /* path relative to the base model: "model.layers.0.self_attn.q_proj" */
    uint32_t rank;         /* from rank_pattern or r; equals a.shape[0] and b.shape[1] */
    double alpha;          /* from alpha_pattern or lora_alpha */
    double scaling;        /* alpha / rank, or alpha / sqrt(rank) with use_rslora */
    wsync_adapter_tensor_t a; /* [rank, in] */
    wsync_adapter_tensor_t b; /* [out, rank] */
} wsync_adapter_module_t;

typedef struct wsync_adapter_priv wsync_adapter_priv_t;

/* Immutable once built; safe to read from several threads. Tensor bytes stay valid until
 * wsync_adapter_free (FROM_DIR: the file mapping is owned here) or, for tensors handed to
 * wsync_adapter_from_tensors, as long as the caller keeps them. */
typedef struct wsync_adapter {
    wsync_adapter_memory_t memory;
    size_t n_modules;
    const wsync_adapter_module_t *modules; /* sorted by hf_module (strcmp) */
    wsync_adapter_priv_t *priv;
} wsync_adapter_t;

#define WSYNC_ADAPTER_CONFIG_MAX (16u * 1024u * 1024u) /* bytes of adapter_config.json */

/* Read a PEFT directory: adapter_config.json and adapter_model.safetensors (mapped, validated).
 * NOT_FOUND when either is missing; NOT_SUPPORTED when only adapter_model.bin is present.
 * Blocking (file I/O). *out is owned by the caller. */
wsync_result_t wsync_adapter_from_dir(const char *path, wsync_adapter_t **out, wsync_error_t *err);

/* Build from adapter_config.json text and named tensors (borrowed; their bytes must outlive
 * *out). `memory` says where the bytes live. */
wsync_result_t wsync_adapter_from_tensors(const char *config_json, size_t config_len,
                                          const wsync_adapter_tensor_t *tensors, size_t n,
                                          wsync_adapter_memory_t memory, wsync_adapter_t **out,
                                          wsync_error_t *err);

void wsync_adapter_free(wsync_adapter_t *a);

/* The module called `hf_module`, or NULL. */
const wsync_adapter_module_t *wsync_adapter_find(const wsync_adapter_t *a, const char *hf_module);

#endif
