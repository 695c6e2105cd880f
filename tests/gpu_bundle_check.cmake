# The GPU bundle keeps working on a machine without a GPU: pack this build (bundle/pack.sh),
# unpack it, and run its script's --check (layout, every program's libraries resolve, a suite
# starts). Then remove a bundled library and expect --check to fail naming it.
#   cmake -DSRC=<source> -DBUILD=<build> -DWORK=<scratch> -P gpu_bundle_check.cmake
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
execute_process(COMMAND "${SRC}/bundle/pack.sh" "${BUILD}" "${WORK}/bundle.tar.xz"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pack.sh failed (${rc})")
endif()
execute_process(COMMAND tar -C "${WORK}" -xJf "${WORK}/bundle.tar.xz" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the bundle does not unpack")
endif()
# The unpacked copy must not lean on the build tree: run it with a clean library path.
execute_process(COMMAND env -u LD_LIBRARY_PATH "${WORK}/meshrt-gpu/run-gpu.sh" --check
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}${err}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "layout OK.*every library resolves")
  message(FATAL_ERROR "run-gpu.sh --check failed (${rc})")
endif()
file(GLOB meshrt_lib "${WORK}/meshrt-gpu/lib/libmeshrt.so*")
if(NOT meshrt_lib)
  message(FATAL_ERROR "the bundle has no libmeshrt")
endif()
file(REMOVE ${meshrt_lib})
execute_process(COMMAND env -u LD_LIBRARY_PATH "${WORK}/meshrt-gpu/run-gpu.sh" --check
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "(not found:.*|outside the bundle.*)libmeshrt|libmeshrt.*(not found|outside the bundle)")
  message(FATAL_ERROR "--check passed without libmeshrt (${rc}): ${out}${err}")
endif()
message(STATUS "without libmeshrt --check fails as it should: ${err}")
