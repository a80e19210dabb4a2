# Several GPUs (docs/MULTIGPU.md): peer access for cross-GPU IPC and the nccl transport. NCCL is
# dlopened at run time, so nothing here links against it.
# Included from plugin/cuda/CMakeLists.txt after wsync_cuda_kernel is defined:
#   - WSYNC_CUDA_MULTIGPU_SOURCES go into the plugin (appended to WSYNC_CUDA_SOURCES);
#   - wsync_cuda_multigpu is the same code as a static library (with the backend's CUDA
#     utilities) for the GPU tests and the multi-GPU benchmark, which drive its C API directly.
set(WSYNC_CUDA_MULTIGPU_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/wsync_cuda_peer.c
  ${CMAKE_CURRENT_LIST_DIR}/wsync_nccl_loader.c
  ${CMAKE_CURRENT_LIST_DIR}/wsync_nccl_desc.c
  ${CMAKE_CURRENT_LIST_DIR}/wsync_cuda_nccl.c)

add_library(wsync_cuda_multigpu STATIC ${WSYNC_CUDA_MULTIGPU_SOURCES}
  ${CMAKE_CURRENT_LIST_DIR}/wsync_cuda_util.c)
set_target_properties(wsync_cuda_multigpu PROPERTIES
  POSITION_INDEPENDENT_CODE ON
  CUDA_RUNTIME_LIBRARY Static)
target_include_directories(wsync_cuda_multigpu PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(wsync_cuda_multigpu PUBLIC wsync_cuda_kernel wsync_adapters wsync_common
  PkgConfig::JANSSON CUDA::cudart_static ${CMAKE_DL_LIBS})
