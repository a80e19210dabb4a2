# wsync_add_plugin(<target> <output-name> SOURCES ... LIBS ...
#                  [FIXTURE NAME <plugin name> WRAP <symbol>... INCLUDES <dir>...])
# A dlopen-able plugin: versioned SONAME, hidden visibility, one exported symbol (version script).
# FIXTURE builds a deliberately broken test plugin from the same sources: not versioned, never
# installed, named NAME in its table (WSYNC_PLUGIN_NAME), each WRAP symbol replaced at link time
# by the __wrap_<symbol> a fixture source defines (ld --wrap), INCLUDES for those sources.
function(wsync_add_plugin target output)
  cmake_parse_arguments(P "FIXTURE" "NAME" "SOURCES;LIBS;WRAP;INCLUDES" ${ARGN})
  add_library(${target} SHARED ${P_SOURCES})
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME ${output}
    C_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib)
  target_compile_definitions(${target} PRIVATE WSYNC_VERSION_STRING="${PROJECT_VERSION}")
  target_link_libraries(${target} PRIVATE ${P_LIBS})
  target_link_options(${target} PRIVATE
    -Wl,--version-script=${PROJECT_SOURCE_DIR}/cmake/wsync_plugin.map -Wl,--no-undefined)
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/wsync_plugin.map)
  if(P_FIXTURE)
    target_compile_definitions(${target} PRIVATE WSYNC_PLUGIN_NAME="${P_NAME}")
    target_include_directories(${target} PRIVATE ${P_INCLUDES})
    foreach(sym ${P_WRAP})
      target_link_options(${target} PRIVATE -Wl,--wrap=${sym})
    endforeach()
  else()
    # A wheel (scikit-build-core sets SKBUILD) stores no symlinks: one file, the name dlopen uses.
    if(NOT SKBUILD)
      set_target_properties(${target} PROPERTIES
        VERSION ${PROJECT_VERSION}
        SOVERSION ${PROJECT_VERSION_MAJOR})
    endif()
    install(TARGETS ${target} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  endif()
endfunction()
