# Multi-GPU tests (docs/MULTIGPU.md). Included from tests/gpu/CMakeLists.txt after the
# wsync_gpu_test library is defined; needs plugin/cuda/nccl (wsync_cuda_multigpu).
# Each prints "SKIPPED: <test> needs N GPUs, found M" and exits 77 on smaller machines and on CI;
# torture_gpu_nccl also skips when libnccl.so.2 is not found (WSYNC_NCCL_LIB names it).
add_library(wsync_gpu_multi STATIC ${CMAKE_CURRENT_LIST_DIR}/wsync_gpu_multi.c)
target_include_directories(wsync_gpu_multi PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(wsync_gpu_multi PUBLIC CUDA::cudart_static)

wsync_add_unit_test(torture_gpu_tp SOURCES ${CMAKE_CURRENT_LIST_DIR}/torture_gpu_tp.c
  LIBS wsync_gpu_multi wsync_gpu_test wsync_refengine wsync_common CUDA::cudart_static
  LABELS gpu multigpu)
add_dependencies(torture_gpu_tp wsync_cuda)

foreach(t peer nccl)
  wsync_add_unit_test(torture_gpu_${t} SOURCES ${CMAKE_CURRENT_LIST_DIR}/torture_gpu_${t}.c
    LIBS wsync_gpu_multi wsync_gpu_test wsync_cuda_multigpu wsync_common CUDA::cudart_static
    LABELS gpu multigpu)
  add_dependencies(torture_gpu_${t} wsync_cuda)
endforeach()
foreach(t tp peer nccl)
  set_tests_properties(torture_gpu_${t} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
endforeach()

# No device needed: the manifest's buffer.nccl object.
wsync_add_unit_test(torture_nccl_desc SOURCES ${CMAKE_CURRENT_LIST_DIR}/torture_nccl_desc.c
  LIBS wsync_cuda_multigpu wsync_common LABELS cuda)

# Where NCCL's header is installed (it is never linked): check our declarations against it.
find_path(WSYNC_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
if(WSYNC_NCCL_INCLUDE_DIR)
  wsync_add_unit_test(torture_nccl_api SOURCES ${CMAKE_CURRENT_LIST_DIR}/torture_nccl_api.c
    LIBS wsync_abi CUDA::cudart_static LABELS cuda)
  target_include_directories(torture_nccl_api PRIVATE ${WSYNC_NCCL_INCLUDE_DIR}
    ${PROJECT_SOURCE_DIR}/plugin/cuda/nccl)
endif()
