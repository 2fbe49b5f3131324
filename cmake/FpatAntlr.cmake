# Generates an ANTLR4 C++ parser into the build tree and wraps it in a static library.
#
#   fpat_antlr_grammar(<target> GRAMMAR <file.g4> PACKAGE <namespace>)
#
# Debian's antlr4_generate() runs `java -jar` on a jar without a class path, which fails; the
# `antlr4` wrapper script sets the class path, so we call it directly.
find_program(FPAT_ANTLR4 NAMES antlr4 REQUIRED
  DOC "ANTLR4 tool (Debian package antlr4)")

function(fpat_antlr_grammar target)
  cmake_parse_arguments(ARG "" "GRAMMAR;PACKAGE" "" ${ARGN})
  get_filename_component(name ${ARG_GRAMMAR} NAME_WE)
  set(out ${CMAKE_CURRENT_BINARY_DIR}/antlr/${name})
  set(srcs
    ${out}/${name}Lexer.cpp ${out}/${name}Parser.cpp
    ${out}/${name}Visitor.cpp ${out}/${name}BaseVisitor.cpp)
  add_custom_command(
    OUTPUT ${srcs}
    COMMAND ${FPAT_ANTLR4} -Dlanguage=Cpp -visitor -no-listener -package ${ARG_PACKAGE}
            -Xexact-output-dir -o ${out} ${ARG_GRAMMAR}
    MAIN_DEPENDENCY ${ARG_GRAMMAR}
    COMMENT "ANTLR4: generating the ${name} parser"
    VERBATIM)
  add_library(${target} STATIC ${srcs})
  target_include_directories(${target} SYSTEM PUBLIC $<BUILD_INTERFACE:${out}>)
  target_link_libraries(${target} PUBLIC fpat_antlr_runtime)
  # Generated code is not ours to clean up: relax warnings for it alone.
  # ANTLR 4.7 emits u8"" literals, which are char8_t in C++20.
  target_compile_options(${target} PRIVATE -w -fno-char8_t)
endfunction()
