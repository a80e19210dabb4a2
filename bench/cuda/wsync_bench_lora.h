/* wsync-bench-cuda --lora: hot-loading a rank-32 all-linear adapter of a Qwen3-8B-shaped model
 * into a device slot, from a producer's staging buffer (FROM_MANIFEST) and from a PEFT
 * directory in page cache (FROM_DIR) against read() into pinned memory + cudaMemcpy. */
#ifndef WSYNC_BENCH_LORA_H
#define WSYNC_BENCH_LORA_H

/* Consumer side (forks `self --role lora-producer`). Returns the exit status. */
int wb_lora_main(const char *self, const char *plugin, unsigned iters, unsigned layers);
/* The producer process: stages dir's tensors on request over fd. */
int wb_lora_producer_main(const char *plugin, int fd, const char *dir);

#endif
