# Embeds files into the binary as string literals, so that fpat needs no source tree at run
# time (kernel headers travel inside fpatc to any machine).
#
#   fpat_embed(<output.cpp> FUNCTION <qualified::name> FILES <files...>)
#
# defines  const std::vector<std::pair<std::string_view, std::string_view>>& <name>();
# mapping each file's name to its contents.
function(fpat_embed output)
  cmake_parse_arguments(ARG "" "FUNCTION" "FILES" ${ARGN})
  add_custom_command(
    OUTPUT ${output}
    COMMAND ${CMAKE_COMMAND} -DOUTPUT=${output} -DFUNCTION=${ARG_FUNCTION}
            "-DFILES=${ARG_FILES}" -P ${PROJECT_SOURCE_DIR}/cmake/FpatEmbedScript.cmake
    DEPENDS ${ARG_FILES} ${PROJECT_SOURCE_DIR}/cmake/FpatEmbedScript.cmake
    COMMENT "Embedding ${ARG_FUNCTION}"
    VERBATIM)
endfunction()
