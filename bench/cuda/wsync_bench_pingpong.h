/* wsync-bench-cuda --pingpong: the cost of two processes taking turns on one GPU, with the
 * hand-off on the GPU (stream memory operations), on the host, or with hosts waiting on words the
 * GPU writes (both sides, or the consumer alone), against one process. */
#ifndef WSYNC_BENCH_PINGPONG_H
#define WSYNC_BENCH_PINGPONG_H

/* Forks the producer side itself; prints the table. Returns the exit status. */
int wb_pingpong_main(unsigned iters);

#endif
