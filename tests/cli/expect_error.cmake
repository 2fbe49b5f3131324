# Runs CMD ARGS INPUT and requires exit code 1 (not a signal, not 0) and a diagnostic of the
# form `INPUT:line:col: error:` on stderr.
execute_process(COMMAND ${CMD} ${ARGS} ${INPUT}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc STREQUAL "1")
  message(FATAL_ERROR "expected exit code 1, got '${rc}'\nstdout:\n${out}\nstderr:\n${err}")
endif()
string(REGEX MATCH "[^\n]*:[0-9]+:[0-9]+: error: " located "${err}")
if(NOT located)
  message(FATAL_ERROR "no 'file:line:col: error:' diagnostic on stderr:\n${err}")
endif()
