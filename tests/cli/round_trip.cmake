# For each INPUT (a ;-list) and each printed stage (STAGES, default fgraph;fused): fpatc ARGS
# --emit=STAGE INPUT, then the same on the printed text, must print the identical text, and
# the text must contain MUST (if given). Printing and parsing again gives the same program.
if(NOT DEFINED STAGES)
  set(STAGES fgraph fused)
endif()
set(i 0)
# Tests running in parallel share WORK: name the files after this run's inputs.
string(MD5 tag "${INPUTS};${ARGS}")
foreach(input ${INPUTS})
  foreach(stage ${STAGES})
    math(EXPR i "${i} + 1")
    execute_process(COMMAND ${CMD} ${ARGS} --emit=${stage} ${input}
      RESULT_VARIABLE rc OUTPUT_VARIABLE first ERROR_VARIABLE err)
    if(NOT rc STREQUAL "0")
      message(FATAL_ERROR "${input} --emit=${stage}: exit ${rc}\n${err}")
    endif()
    set(tmp ${WORK}/round-trip-${tag}-${i}.fgraph)
    file(WRITE ${tmp} "${first}")
    execute_process(COMMAND ${CMD} ${ARGS} --emit=${stage} ${tmp}
      RESULT_VARIABLE rc OUTPUT_VARIABLE second ERROR_VARIABLE err)
    if(NOT rc STREQUAL "0")
      message(FATAL_ERROR "${input} --emit=${stage}, parsed again: exit ${rc}\n${err}\n${first}")
    endif()
    if(NOT first STREQUAL second)
      message(FATAL_ERROR "${input} --emit=${stage} is not a fixed point:\n${first}\n---\n${second}")
    endif()
    if(DEFINED MUST AND stage STREQUAL "fused" AND NOT first MATCHES "${MUST}")
      message(FATAL_ERROR "${input} --emit=fused lacks '${MUST}':\n${first}")
    endif()
  endforeach()
endforeach()
