# fpatc run away from the source tree (a scratch directory holding copies of a graph and a user
# pattern file) must work, and its generated code must mention neither the source nor the
# build tree: built-in patterns and kernel headers are embedded, and paths in generated
# comments are relative. Variables: CMD (fpatc), SRC (source tree), WORK (scratch), BUILD.
set(dir ${WORK}/relocated)
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir})
file(COPY ${SRC}/examples/transformer_mlp.fgraph ${SRC}/tests/patterns/epilogue_trees.fpat
     ${SRC}/tests/cli/inputs/epilogue_trees.fgraph DESTINATION ${dir})
# A copy of the binary: it must not name the source tree at all (nothing compiled in to read).
file(COPY ${CMD} DESTINATION ${dir})
get_filename_component(exe ${CMD} NAME)
string(REGEX REPLACE "([][+.*()^$?|\\])" "\\\\\\1" srcRe "${SRC}")
file(STRINGS ${dir}/${exe} hits REGEX "${srcRe}")
if(hits)
  message(FATAL_ERROR "${exe} names the source tree: ${hits}")
endif()
foreach(run "transformer_mlp.fgraph" "--patterns;${dir}/epilogue_trees.fpat;epilogue_trees.fgraph")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=FPAT_PATTERNS_DIR
                          ${dir}/${exe} --emit=cuda --out-dir out ${run}
    WORKING_DIRECTORY ${dir} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc STREQUAL "0")
    message(FATAL_ERROR "fpatc ${run} in ${dir}: exit ${rc}\n${out}\n${err}")
  endif()
endforeach()
file(GLOB generated ${dir}/out/*)
list(LENGTH generated count)
if(count LESS 10)
  message(FATAL_ERROR "expected generated kernels and headers in ${dir}/out, found ${count}")
endif()
foreach(f ${generated})
  file(READ ${f} text)
  foreach(tree ${SRC} ${BUILD} ${dir})
    string(FIND "${text}" "${tree}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "${f} mentions '${tree}'")
    endif()
  endforeach()
endforeach()
message(STATUS "${count} generated files, none mentions a checkout path")
