# Runs fpat-tblgen at build time, as LLVM's tablegen() does.
#
#   fpat_tablegen(<output> SOURCE <file.fpat> ARGS <action and options...>)
#
# The output goes to the current binary dir. A depfile lists every .fpat file read, so editing
# any included file regenerates the output; --write-if-changed keeps unchanged outputs (and
# everything compiled from them) from rebuilding. The tool runs from the source root with
# relative paths, so generated comments name files as `patterns/gemm.fpat`, identical on every
# machine.
function(fpat_tablegen output)
  cmake_parse_arguments(ARG "" "SOURCE" "ARGS" ${ARGN})
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${output})
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${ARG_SOURCE})
  add_custom_command(
    OUTPUT ${out}
    COMMAND fpat-tblgen ${rel} ${ARG_ARGS} -o ${out} -d ${out}.d --write-if-changed
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    DEPENDS fpat-tblgen ${ARG_SOURCE}
    DEPFILE ${out}.d
    COMMENT "fpat-tblgen: ${rel} -> ${output}"
    VERBATIM)
endfunction()
