# Fails when README.md or a page of docs/ names a file of the tree (`runtime/tensor_ops.h`,
# `examples/jit_demo.h`) that does not exist: docs that point at renamed files.
# Usage: cmake -DROOT=<repo> -P readme_paths.cmake
cmake_minimum_required(VERSION 3.20)
file(READ ${ROOT}/README.md readme)
file(GLOB pages ${ROOT}/docs/*.md)
foreach(page IN LISTS pages)
  file(READ ${page} text)
  string(APPEND readme "\n${text}")
endforeach()
string(REGEX MATCHALL
       "`(core|backends|collectives|runtime|global|autodiff|train|examples|tests|bench|bundle|cmake)/[A-Za-z0-9_./-]*\\.(h|cpp|cu|inc|cmake|py|sh|txt)`"
       named "${readme}")
list(REMOVE_DUPLICATES named)
set(generated tests/cuda_suites.txt)  # written into the build tree
set(missing "")
foreach(quoted IN LISTS named)
  string(REPLACE "`" "" path "${quoted}")
  if(NOT EXISTS "${ROOT}/${path}" AND NOT path IN_LIST generated)
    list(APPEND missing "${path}")
  endif()
endforeach()
list(LENGTH named count)
if(count LESS 10)
  message(FATAL_ERROR "README.md and docs/ name only ${count} files of the tree; the pattern is broken")
endif()
if(missing)
  message(FATAL_ERROR "README.md or docs/ name files that do not exist: ${missing}")
endif()
message(STATUS "README.md and docs/ name ${count} files of the tree; all exist")
