# Runs CMD ARGS INPUT (with ENV NAME=VALUE pairs if given) and requires exit code RC (default 1)
# and stderr matching the regular expression MATCH.
if(NOT DEFINED RC)
  set(RC 1)
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env ${ENV} ${CMD} ${ARGS} ${INPUT}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc STREQUAL "${RC}")
  message(FATAL_ERROR "expected exit code ${RC}, got '${rc}'\nstdout:\n${out}\nstderr:\n${err}")
endif()
if(NOT err MATCHES "${MATCH}")
  message(FATAL_ERROR "stderr does not match '${MATCH}':\n${err}")
endif()
