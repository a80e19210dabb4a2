/* Test fixtures for the adapter layer: PEFT directories written from scratch (safetensors per
 * the format, adapter_config.json text) and engine slots in host memory with snapshots, so a
 * test can prove that a refused load left every byte untouched. */
#ifndef WSYNC_TEST_ADAPTER_FIXTURE_H
#define WSYNC_TEST_ADAPTER_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "wsync_abi.h"

/* Deterministic values k/64, |k| <= 48: exact in bf16, f16, f32 and f64. */
double fx_value(uint32_t seed, uint64_t i);

/* Store / load one element of a float dtype at p[i]. */
void fx_store(void *p, wsync_dtype_t dt, uint64_t i, double v);
double fx_load(const void *p, wsync_dtype_t dt, uint64_t i);

/* A LoRA module to write: A [r, in] with seed, B [out, r] with seed + 1. */
typedef struct fx_module {
    const char *hf_module; /* "model.layers.0.self_attn.q_proj" */
    int64_t r, in, out;
    wsync_dtype_t dtype;
    uint32_t seed;
} fx_module_t;

/* mkdtemp under $TMPDIR; the returned path is static storage per call site buffer. */
void fx_tempdir(char *buf, size_t len);
void fx_rmtree(const char *dir);
void fx_write_text(const char *dir, const char *file, const char *text);
/* Write adapter_model.safetensors (with __metadata__ {"format": "pt"}). */
void fx_write_adapter(const char *dir, const fx_module_t *mods, size_t n);
/* Write raw bytes: 8-byte header length (hlen_override when non-zero), header text, data. */
void fx_write_raw_safetensors(const char *path, const char *header, uint64_t hlen_override,
                              const void *data, size_t data_len);

/* An engine slot in host memory. Buffers are filled with 0xA5 until written. */
typedef struct fx_target_spec {
    const char *module;
    int64_t in, out;
    wsync_dtype_t dtype;
    size_t n_parts;
    wsync_adapter_part_t parts[4];
} fx_target_spec_t;

typedef struct fx_slot {
    wsync_adapter_slot_t slot;
    wsync_adapter_target_t targets[16];
    wsync_adapter_part_t parts[16][4];
    volatile int active;
    size_t a_bytes[16], b_bytes[16];
} fx_slot_t;

void fx_slot_init(fx_slot_t *s, const char *name, uint32_t max_rank, const fx_target_spec_t *t,
                  size_t n);
void fx_slot_free(fx_slot_t *s);

/* Every byte the slot owns, plus ranks, scalings and *active. */
typedef struct fx_snapshot {
    uint8_t *bytes;
    size_t len;
} fx_snapshot_t;
void fx_snapshot_take(const fx_slot_t *s, fx_snapshot_t *snap);
int fx_snapshot_equal(const fx_slot_t *s, const fx_snapshot_t *snap);
void fx_snapshot_free(fx_snapshot_t *snap);

#endif
