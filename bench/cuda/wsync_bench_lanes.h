/* wsync-bench-cuda --lanes: how the copy engines and the copy kernel should share a batch of
 * separate tensors. Every row copies the same layout (packed source -> one allocation per
 * tensor) and prints its ratio to one cudaMemcpyAsync of the whole payload and to the
 * per-tensor loop, both run in the same process:
 *   - SM kernels on one 4 GiB buffer (after a second of warm-up): read only, write only, the
 *     plugin's kernel, copies by bytes in flight and cache hints, and the FP8 copy's 2:1
 *     read/write mix without its reduction (wsync_bench_kernels.h);
 *   - op-size sweep: 4 GiB cut into ops of S bytes, one cudaMemcpyAsync each, over K streams;
 *   - all ops on the copy engines over K streams (a cudaMemcpyAsync each, or one
 *     cudaMemcpyBatchAsync per stream);
 *   - the same captured into a CUDA graph;
 *   - the largest ops (>= T bytes, up to a share of the payload) on K copy-engine streams, the
 *     rest by the kernel; the same with runs of equal-size ops at constant strides as one
 *     strided copy each (the driver refuses those that span allocations: counted); and with
 *     each large op cut into a copy-engine head and a kernel tail. */
#ifndef WSYNC_BENCH_LANES_H
#define WSYNC_BENCH_LANES_H

/* layout "dense", "moe" or "both"; "none": the one-buffer kernel rows alone (with the 2:1
 * read/write mix of the FP8 copy). Returns the exit status. */
int wb_lanes_main(const char *layout, unsigned iters);

#endif
