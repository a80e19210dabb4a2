/* The model layer: the HF tensor list (names, dtypes, shapes) of a Hugging Face config.json for
 * Llama, Mistral, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE and Mixtral (tied embeddings: no lm_head),
 * and the two built-in layouts as configs of it: Qwen3-8B ("dense", 399 tensors) and
 * Qwen3-30B-A3B ("moe", 393 tensors per layer + 3), optionally shrunk by `scale` (large dims and
 * head counts divided, head_dim, names and count kept). Synthetic tensor contents are a pure
 * function of (name, version), so a consumer can check what it received without trusting any
 * digest. */
#ifndef WSYNC_MODEL_H
#define WSYNC_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "wsync_abi.h"

#define WSYNC_MODEL_ALIGN 256u /* packing alignment, the same as the producer's staging */
#define WSYNC_MODEL_NAME_MAX 80

typedef struct wsync_model_tensor {
    char name[WSYNC_MODEL_NAME_MAX];
    wsync_dtype_t dtype;
    uint32_t ndim;
    int64_t shape[2];
    uint64_t nbytes;
    uint64_t offset; /* in the packed image of the whole model (WSYNC_MODEL_ALIGN-aligned) */
    /* A checkpoint's tensor (cfg->model_dir): its bytes in the read-only mapping, of file_dtype
     * (converted to dtype when they differ: floating point only). NULL: synthetic contents. */
    const void *data;
    wsync_dtype_t file_dtype;
} wsync_model_tensor_t;

typedef struct wsync_model_config {
    const char *layout;      /* "dense" or "moe" */
    unsigned scale;          /* >= 1: hidden, intermediate and vocab dims >= 512 are divided by it;
                              * attention widths stay whole heads of 128 (head counts divided, at least
                              * one kv head, q heads a multiple of kv heads); expert counts are kept */
    unsigned layers;         /* 0: the real model's (dense 36, moe 48) */
    const char *model_dir;   /* a Hugging Face model directory: its config's tensor list and its
                              * checkpoint's bytes (layout, scale and layers are then ignored) */
    wsync_dtype_t dtype;     /* with model_dir: the dtype the model holds its floating-point
                              * tensors in (a bf16 engine for an f32 checkpoint); 0: the file's */
    const char *config_json; /* the text of a config.json alone: its tensor list, synthetic
                              * contents (planning a model without its weights: wsync plan);
                              * layout, scale and layers are then ignored */
} wsync_model_config_t;

typedef struct wsync_model {
    char layout[32];
    wsync_model_tensor_t *tensors;
    size_t n;
    uint64_t payload_bytes; /* sum of nbytes */
    uint64_t packed_bytes;  /* size of the packed image */
    uint64_t max_nbytes;
    size_t *slots; /* open-addressing name index: tensor index + 1, 0 = empty */
    size_t nslots;
    /* What holds the tensors' bytes (a checkpoint, wsync_checkpoint.h), closed by
     * wsync_model_free through owner_close; NULL for synthetic contents. */
    void *owner;
    void (*owner_close)(void *owner);
} wsync_model_t;

/* Build the tensor list from whichever source cfg names (wsync_model_build.c: the top of the
 * model layer). Returns 0, or -1 with `why` explaining (unknown layout, bad scale). */
int wsync_model_build(wsync_model_t *m, const wsync_model_config_t *cfg, char *why, size_t len);
/* Offsets in the packed image, totals and the name index of a tensor list filled by the model
 * layer's readers. 0, or -1 out of memory. */
int wsync_model_finish(wsync_model_t *m);
void wsync_model_free(wsync_model_t *m);

/* FNV-1a of a name: the hash of the model's name index (and of other name indexes). */
uint64_t wsync_model_hash(const char *s);

/* Index of the tensor called `name`, or -1. */
long wsync_model_find(const wsync_model_t *m, const char *name);

/* Write the content of tensor t for weight version `version` (t->nbytes bytes) into host dst: a
 * checkpoint's bytes (the same for every version, converted to t->dtype), else synthetic. */
void wsync_model_fill(const wsync_model_tensor_t *t, uint64_t version, void *dst);

#endif
