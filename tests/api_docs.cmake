# Runs Doxygen over the public headers (docs/Doxyfile) and fails when a public function, class or
# enumerator of a header listed in COMPLETE lacks its doc comment. The other public headers still
# have undocumented symbols (overloads sharing one comment, struct fields, enumerators); their
# counts are printed so the list can grow header by header.
# Usage: cmake -DROOT=<repo> -DDOXYGEN=<exe> -DWORK=<dir> -P api_docs.cmake
cmake_minimum_required(VERSION 3.20)
set(COMPLETE include/meshrt/meshrt.h runtime/distributed.h global/jit_program.h)
file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/Doxyfile "@INCLUDE = ${ROOT}/docs/Doxyfile\nOUTPUT_DIRECTORY = ${WORK}\n")
execute_process(COMMAND ${DOXYGEN} ${WORK}/Doxyfile WORKING_DIRECTORY ${ROOT}
                RESULT_VARIABLE rc ERROR_VARIABLE warnings OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "doxygen failed (${rc}):\n${warnings}")
endif()
string(REPLACE "${ROOT}/" "" warnings "${warnings}")
string(REGEX MATCHALL "[^\n]*is not documented[^\n]*" undocumented "${warnings}")
set(failures "")
set(counts "")
foreach(w IN LISTS undocumented)
  string(REGEX MATCH "^[^:]+" file "${w}")
  if(file IN_LIST COMPLETE)
    list(APPEND failures "${w}")
  endif()
endforeach()
list(LENGTH undocumented n)
message(STATUS "${n} undocumented public symbols outside the complete headers (known gap)")
if(failures)
  list(JOIN failures "\n  " lines)
  message(FATAL_ERROR "public symbols without a doc comment:\n  ${lines}")
endif()
