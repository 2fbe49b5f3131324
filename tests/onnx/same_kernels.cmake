# Runs fpatc up to code generation on an ONNX model and on the hand-written .fgraph of the same
# block, and requires the same kernels (pattern and configuration in each kernel's name).
# usage: cmake -DFPATC=... -DMODEL=... -DFGRAPH=... -DCACHE=... -P same_kernels.cmake
function(kernels input out)
  execute_process(COMMAND ${FPATC} --no-reference --no-graphviz --no-run --arch sm_90
                          --cache-dir ${CACHE} ${input}
    RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
  if(NOT rc STREQUAL "0")
    message(FATAL_ERROR "fpatc ${input} exited with ${rc}:\n${text}\n${err}")
  endif()
  string(REGEX MATCHALL ": fpat_[A-Za-z0-9_]+" names "${text}")
  list(SORT names)
  set(${out} "${names}" PARENT_SCOPE)
endfunction()
kernels(${MODEL} from_model)
kernels(${FGRAPH} by_hand)
if(NOT from_model STREQUAL by_hand OR from_model STREQUAL "")
  message(FATAL_ERROR "different kernels:\n  ${MODEL}: ${from_model}\n  ${FGRAPH}: ${by_hand}")
endif()
message(STATUS "same kernels: ${from_model}")
