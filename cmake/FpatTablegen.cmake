# Runs fpat-tblgen at build time, as LLVM's tablegen() does. Used by fpat's own build and,
# installed with the package, by projects that find_package(fpat).
#
#   fpat_tablegen(<output> SOURCE <file.fpat> ARGS <action and options...>)
#
# <output> is written to the current binary directory; SOURCE may be relative to the current
# source directory. A depfile lists every .fpat file read, so editing an included file
# regenerates the output; --write-if-changed keeps an unchanged output (and everything compiled
# from it) from rebuilding. The tool runs in the project's source directory with a relative
# path, so generated comments name files as the project does (`patterns/gemm.fpat`), the same
# on every machine. Example:
#
#   fpat_tablegen(MyTable.inc SOURCE my.fpat
#                 ARGS --gen-matcher-table --table-function myTable -I patterns)
function(fpat_tablegen output)
  cmake_parse_arguments(ARG "" "SOURCE" "ARGS" ${ARGN})
  if(NOT ARG_SOURCE)
    message(FATAL_ERROR "fpat_tablegen(${output}): SOURCE <file.fpat> is required")
  endif()
  if(TARGET fpat::fpat-tblgen) # an installed fpat
    set(tool fpat::fpat-tblgen)
    set(tool_dependency $<TARGET_FILE:fpat::fpat-tblgen>)
  else() # fpat's own build
    set(tool fpat-tblgen)
    set(tool_dependency fpat-tblgen)
  endif()
  get_filename_component(source ${ARG_SOURCE} ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${source})
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${output})
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${tool} ${rel} ${ARG_ARGS} -o ${out} -d ${out}.d --write-if-changed
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    DEPENDS ${tool_dependency} ${source}
    DEPFILE ${out}.d
    COMMENT "fpat-tblgen: ${rel} -> ${output}"
    VERBATIM)
endfunction()
