# Meta-test: the torn-weight case must FAIL against a plugin that records *consumed* before its
# copies finish (libwsync_cpu_broken.so), and say so. Passes only when the suite exits non-zero
# AND printed the TORN diagnosis — proof that the case can fail for the right reason.
# Usage: cmake -DSUITE=<wsync_conformance> -DSHIM=<shim> -DPLUGIN=<broken .so> -P expect_torn.cmake
execute_process(COMMAND ${SUITE} --shim ${SHIM} --plugin ${PLUGIN} --case torn
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(rc EQUAL 0)
  message(FATAL_ERROR "the torn-weight case PASSED against ${PLUGIN}: it cannot catch an early "
    "consumed record")
endif()
if(NOT out MATCHES "TORN: ")
  message(FATAL_ERROR "the suite failed (${rc}) but not with the torn-weight diagnosis:\n${err}")
endif()
message("OK: the torn-weight case caught ${PLUGIN} (exit ${rc})")
