# cmake -DBUILD=<fpat build tree> -DSOURCE=<fpat source tree> -DWORK=<scratch dir> -P consumer.cmake
#
# Installs fpat from BUILD, moves the installation (it must not depend on where it was
# installed), then configures, builds and runs tests/consumer against it, and runs the
# installed fpatc from a scratch directory on a copy of an example.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "'${cmd}' failed (${rc}):\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK})
run(${CMAKE_COMMAND} --install ${BUILD} --prefix ${WORK}/installed)
file(RENAME ${WORK}/installed ${WORK}/moved)
set(P ${WORK}/moved)

run(${CMAKE_COMMAND} -S ${SOURCE}/tests/consumer -B ${WORK}/consumer-build
  -DCMAKE_PREFIX_PATH=${P} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK}/consumer-build -j 2)
run(${WORK}/consumer-build/consumer)
if(NOT out MATCHES "consumer_gemm_relu_residual.*max abs err.*kernel fpat_consumer_gemm_relu_residual_sm90a")
  message(FATAL_ERROR "unexpected consumer output:\n${out}")
endif()
message(STATUS "consumer:\n${out}")

# The installed tool, run elsewhere on a copied graph: built-in patterns and kernel headers
# come from the binary, not from a source tree.
file(MAKE_DIRECTORY ${WORK}/elsewhere)
file(COPY ${SOURCE}/examples/llama_mlp.fgraph DESTINATION ${WORK}/elsewhere)
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=FPAT_PATTERNS_DIR --unset=FPAT_KERNEL_HEADERS
  ${P}/bin/fpatc llama_mlp.fgraph --emit=cuda --arch 90 --out-dir gen
  WORKING_DIRECTORY ${WORK}/elsewhere RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "rmsnorm_gemm_swiglu")
  message(FATAL_ERROR "installed fpatc failed (${rc}):\n${out}\n${err}")
endif()
run(${P}/bin/fpat-tblgen ${SOURCE}/tests/consumer/patterns/consumer.fpat --print-table)
message(STATUS "installed fpatc and fpat-tblgen ran from ${WORK}/elsewhere")
