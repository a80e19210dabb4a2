/* hot_load_adapter and unload_adapter as the ABI defines them, for every backend: the backend
 * supplies an executor for the plan (the CPU backend: wsync_adapter_plan_exec_host; CUDA: a
 * kernel) and, for FROM_MANIFEST sources, where the opened producer buffer is mapped. */
#ifndef WSYNC_ADAPTERS_ADAPTER_LOAD_H
#define WSYNC_ADAPTERS_ADAPTER_LOAD_H

#include "wsync_abi.h"
#include "wsync_adapter_plan.h"

/* Write every op of `plan`. Must return only when all bytes are written and visible to the
 * engine's readers (e.g. after a stream synchronize), or fail. Called at most once per load,
 * after every check passed. */
typedef wsync_result_t (*wsync_adapter_exec_fn_t)(const wsync_adapter_plan_t *plan, void *user,
                                                  wsync_error_t *err);

/* Load `src` into `slot`: build the adapter (FROM_DIR: read and map the directory;
 * FROM_MANIFEST: the manifest's tensors at buffer_base + offset, buffer_base being the start of
 * the buffer's usable region in this process), validate it completely against the slot, then
 * exec(plan) into the shadow copy and commit (rank/scaling of the shadow, release store of
 * *active). On any validation error nothing is written to either copy; if exec fails, only the
 * shadow may hold partial bytes and *active is unchanged. exec NULL: the host executor.
 * Blocking. Not thread safe per slot. */
wsync_result_t wsync_adapter_hot_load(const wsync_adapter_source_t *src, wsync_adapter_slot_t *slot,
                                      const void *buffer_base, wsync_adapter_exec_fn_t exec,
                                      void *exec_user, wsync_error_t *err);

/* Called between the switch to the emptied copy and the clearing of the other one: must return
 * once no request reads the previous copy any more. */
typedef wsync_result_t (*wsync_adapter_drain_fn_t)(void *user, wsync_error_t *err);

/* unload_adapter: zero the shadow copy (rank 0, scaling 0, A/B zero) and switch to it, drain,
 * then set rank 0 / scaling 0 in the other copy too. drain NULL: the caller guarantees no request
 * reads the slot. Blocking. */
wsync_result_t wsync_adapter_unload(wsync_adapter_slot_t *slot, wsync_adapter_exec_fn_t exec,
                                    void *exec_user, wsync_adapter_drain_fn_t drain,
                                    void *drain_user, wsync_error_t *err);

#endif
