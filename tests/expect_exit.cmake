# Runs EXE on the cuda platform with MESHRT_REQUIRE_CUDA=REQUIRE and fails unless it exits with
# EXIT and prints something matching REGEX (tests/test_main.cpp's skip-or-fail decision).
# Usage: cmake -DEXE=<test binary> -DREQUIRE=<value> -DEXIT=<code> -DREGEX=<regex> -P expect_exit.cmake
execute_process(
  COMMAND ${EXE} --meshrt-env=MESHRT_PLATFORM=cuda --meshrt-env=MESHRT_REQUIRE_CUDA=${REQUIRE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc STREQUAL "${EXIT}")
  message(FATAL_ERROR "exit code ${rc}, expected ${EXIT}:\n${out}${err}")
endif()
if(NOT "${out}${err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match '${REGEX}':\n${out}${err}")
endif()
