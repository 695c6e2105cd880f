# Runs CMD (a list) and fails unless its output matches REGEX within MAX_SECONDS; the exit code is
# not checked (a failure case under mpirun ends the job with a non-zero code by design).
# Usage: cmake "-DCMD=prog;args" "-DREGEX=..." -DMAX_SECONDS=n -P expect_output.cmake
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT ${MAX_SECONDS})
string(TIMESTAMP t1 "%s")
math(EXPR took "${t1} - ${t0}")
message("exit ${rc} after ${took} s:\n${out}${err}")
if(NOT "${out}${err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match '${REGEX}'")
endif()
