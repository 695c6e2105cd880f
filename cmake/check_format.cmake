# Fails when a source file differs from what clang-format (.clang-format) makes of it.
# Usage: cmake -DROOT=<repo> -DCLANG_FORMAT=<exe> -P check_format.cmake
file(GLOB_RECURSE files RELATIVE ${ROOT}
     ${ROOT}/core/* ${ROOT}/backends/* ${ROOT}/collectives/* ${ROOT}/runtime/* ${ROOT}/global/*
     ${ROOT}/autodiff/* ${ROOT}/bench/* ${ROOT}/examples/* ${ROOT}/tests/* ${ROOT}/include/* ${ROOT}/fuzz/*)
list(FILTER files INCLUDE REGEX "\\.(h|cpp|cu|c)$")
list(FILTER files EXCLUDE REGEX "^tests/data/")
set(bad "")
foreach(f IN LISTS files)
  execute_process(COMMAND ${CLANG_FORMAT} --dry-run --Werror ${f} WORKING_DIRECTORY ${ROOT}
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    string(APPEND bad "  ${f}\n")
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "not clang-formatted (run: clang-format -i <file>):\n${bad}")
endif()
