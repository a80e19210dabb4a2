/* wsync-bench-cuda --digest: the weight checker's digest pass (the consumer's digest_regions)
 * over an engine's parameters, against the physical limit run in the same process: one
 * read-only kernel over a buffer of the same bytes (HBM read bandwidth). Also printed for
 * scale: one cudaMemcpyAsync of the same bytes (read and write). docs/PERFORMANCE.md. */
#ifndef WSYNC_BENCH_DIGEST_H
#define WSYNC_BENCH_DIGEST_H

/* layout "dense", "moe" or "both"; plugin: the CUDA plugin's path. Returns the exit status. */
int wb_digest_main(const char *plugin, const char *layout, unsigned iters);

#endif
