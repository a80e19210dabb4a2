# wsync-bench-multigpu (docs/PERFORMANCE.md, "Several GPUs"). Included from
# bench/cuda/CMakeLists.txt after wsync_cuda_harness is defined; needs
# plugin/cuda/nccl/CMakeLists.txt (wsync_cuda_multigpu).
add_executable(wsync-bench-multigpu ${CMAKE_CURRENT_LIST_DIR}/wsync_bench_multigpu.c)
target_link_libraries(wsync-bench-multigpu PRIVATE wsync_cuda_harness wsync_cuda_multigpu
  CUDA::cudart_static)
set_target_properties(wsync-bench-multigpu PROPERTIES
  RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin
  CUDA_RUNTIME_LIBRARY Static)
add_dependencies(wsync-bench-multigpu wsync_cuda)
