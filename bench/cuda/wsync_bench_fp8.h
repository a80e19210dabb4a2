/* wsync-bench-cuda --fp8: the quantizing copy (copy_quantized) of a layout from the producer's
 * staging buffer into FP8 engine parameters, as SGLang and vLLM hold a DeepSeek-V3 / Qwen3-FP8
 * model: every linear weight (q, k, v, o, gate, up, down; the experts' w13 and w2) e4m3fn with a
 * float32 scale per 128 x 128 block (weight_scale_inv), fused as the engine fuses them; the
 * embeddings, norms, router and lm_head bf16. Rows, CUDA events, median of `iters`, each call
 * timed twice: call to done (the call's host work included) and GPU alone (the host work done
 * while a kernel spins ahead of the call):
 *   the limit: one cudaMemcpyAsync moving (bytes read + bytes written) / 2;
 *   copy_quantized with WSYNC_COPY_QUANT_ONE_PASS (the NaN check inside the quantizing pass),
 *   and without it (the sources checked before anything is written);
 *   for a layout with experts, expert parallelism 8: each rank's call over the experts it owns
 *   (a contiguous E / 8 of them, the default placement of vLLM and SGLang) into local expert
 *   slots, its bytes written and its time against the EP 1 call.
 * Every plain parameter is checked against the trainer's fill; the quantized parameters of the
 * first and last layer (for MoE the first and last expert of each rank's share) against the host
 * reference quantizer (plugin/common/wsync_fp8.h), byte for byte. The torch loop frameworks use
 * today is timed beside the same call in bench/python/bench_fp8.py. */
#ifndef WSYNC_BENCH_FP8_H
#define WSYNC_BENCH_FP8_H

#include "wsync_bench_engine.h"

/* E: the layout grouped (wb_layout_group) with its events and stream, no parameters allocated;
 * h and m: the producer's staging buffer holding the whole layout (one bucket of `one`).
 * Prints the rows; returns the number of wrong parameters (0: every check passed). */
unsigned long long wb_fp8_run(wb_engine_t *E, wsync_handle_t *h, const wsync_manifest_t *m,
                              wb_plan_t *one, unsigned iters);

#endif
