/* LoRA fixtures shared by the GPU adapter test and wsync-bench-cuda --lora: PEFT directories with
 * random values of every float dtype, and engine adapter slots in host or device memory.
 * Test/benchmark code: not thread safe; failures are reported through `why`. */
#ifndef WSYNC_CUDA_LORA_H
#define WSYNC_CUDA_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "wsync_abi.h"

typedef struct wl_module {
    char hf[128]; /* "model.layers.0.self_attn.q_proj" */
    int64_t r, in, out;
    wsync_dtype_t dtype;
} wl_module_t;

typedef struct wl_target {
    char module[128];
    int64_t in, out;
    wsync_dtype_t dtype;
    size_t n_parts;
    char part_names[4][128];
    int64_t part_offset[4], part_out[4];
} wl_target_t;

typedef struct wl_slot {
    wsync_adapter_slot_t slot;
    wsync_adapter_target_t *targets;
    wsync_adapter_part_t *parts; /* 4 per target */
    volatile int active;
    int on_device;
    size_t *a_bytes, *b_bytes;
} wl_slot_t;

/* Write dir/adapter_config.json (config text) and dir/adapter_model.safetensors: module k gets
 * A [r, in] and B [out, r] in its dtype, random values (full mantissas, some tiny and huge ones)
 * from `seed`. Returns 0 or -1 with why. */
int wl_write_dir(const char *dir, const char *config, const wl_module_t *m, size_t n, uint64_t seed,
                 char *why, size_t why_len);

/* Slot of n targets with max_rank; buffers (both copies) filled with 0xA5; on_device: cudaMalloc
 * on the current device, else malloc. */
int wl_slot_init(wl_slot_t *s, const char *name, uint32_t max_rank, const wl_target_t *t, size_t n,
                 int on_device);
void wl_slot_free(wl_slot_t *s);
/* Compare copy `idx` of a device slot with copy `idx` of a host slot of the same targets: every
 * byte of A and B, rank and scaling. Returns the number of differing bytes (+1 per differing
 * rank/scaling), describing the first in why. */
uint64_t wl_slot_compare(const wl_slot_t *dev, const wl_slot_t *host, int idx, char *why,
                         size_t why_len);
/* 1 when every byte of copy idx of a device slot is `byte`. */
int wl_slot_all(const wl_slot_t *dev, int idx, unsigned char byte);

/* Qwen3-8B shapes (hidden 4096, intermediate 12288, 32 q heads, 8 kv heads of 128), `layers`
 * layers, all 7 linear modules per layer as unpacked targets (bf16) and rank-r bf16 modules.
 * Arrays are malloc'd (7 * layers entries). */
void wl_qwen3_8b(unsigned layers, int64_t r, wl_target_t **t, wl_module_t **m, size_t *n);

#endif
