/* Cross-GPU access for the consumer: a producer buffer on GPU a read by a copy kernel on GPU b.
 * The manifest names the producer's device as "GPU-<uuid>" (buffer.device); the consumer
 * resolves it to an ordinal of this process and enables peer access from its own device to that
 * one before the copy kernel reads the mapping (NVLink or PCIe P2P). Legacy IPC opens with
 * cudaIpcMemLazyEnablePeerAccess already map the memory for the consumer's device; this makes
 * the requirement explicit, gives a clear error when the two GPUs cannot reach each other, and
 * covers cuda_vmm_fd mappings, whose cuMemSetAccess needs the same peer capability.
 * Thread safe (the CUDA runtime serialises peer enabling; an already enabled pair is success). */
#ifndef WSYNC_CUDA_PEER_H
#define WSYNC_CUDA_PEER_H

#include "wsync_abi.h"

/* Ordinal (in this process's CUDA_VISIBLE_DEVICES numbering) of the GPU whose UUID text is
 * `uuid` ("GPU-xxxxxxxx-xxxx-..."), in *ordinal; -1 when no visible device has it (the producer's
 * GPU is hidden from this process). Errors: INVALID_ARGUMENT (NULL), SYSTEM (CUDA). Blocking. */
wsync_result_t wsync_cuda_peer_ordinal(const char *uuid, int *ordinal, wsync_error_t *err);

/* Make memory of the producer's GPU `producer_uuid` readable by kernels on `device` (the current
 * device on return). Same GPU, "" or "cpu": nothing to do. A producer GPU this process cannot
 * see: logs a WARN and returns OK (the IPC open decides). Errors: NOT_SUPPORTED when
 * cudaDeviceCanAccessPeer says no (the message names both GPUs: place producer and engine on
 * GPUs with P2P, or use the nccl path), SYSTEM for other CUDA failures. *peer (may be NULL) gets
 * the producer's ordinal, or -1 when same GPU / not visible. Blocking; call once per mapping,
 * before the first copy (wsync_cuda_map does it before opening the handle). */
wsync_result_t wsync_cuda_peer_enable(int device, const char *producer_uuid, int *peer,
                                      wsync_error_t *err);

#endif
