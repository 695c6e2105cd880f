# The core without its plugins (see tests/CMakeLists.txt): run from a folder holding only
# libmeshrt, then with a plugin that needs a missing library, then with one built for another core.
#   cmake -DPROBE -DCORE -DNEEDS_DEP -DOTHER_ABI -DHAVE_CUDA -DWORK -P plugins.cmake
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/core" "${WORK}/needs_dep" "${WORK}/other_abi")
# The core under its soname; LD_LIBRARY_PATH wins over the probe's run path to the build tree.
file(COPY_FILE "${CORE}" "${WORK}/core/libmeshrt.so.0")
function(probe out_var)
  execute_process(COMMAND env -u MESHRT_PLUGIN_DIR MESHRT_PLATFORM=cpu
                          LD_LIBRARY_PATH=${WORK}/core ${ARGN} "${PROBE}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "plugin_probe failed (${rc}): ${out}${err}")
  endif()
  message(STATUS "${out}")
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

# 1. No plugin anywhere: cpu works, cuda says why, memory stays small.
probe(out)
if(NOT out MATCHES "platforms: cpu\n" OR NOT out MATCHES "cpu op: 8\n")
  message(FATAL_ERROR "the core alone did not run on cpu:\n${out}")
endif()
if(HAVE_CUDA)
  set(want "the cuda plugin libmeshrt_cuda.so could not be loaded: [^\n]*libmeshrt_cuda.so: cannot open shared object file")
else()
  set(want "meshrt was built without the cuda platform")
endif()
if(NOT out MATCHES "cuda: [^\n]*${want}")
  message(FATAL_ERROR "cuda's reason is not the missing plugin:\n${out}")
endif()
string(REGEX MATCH "rss:[ \t]*([0-9]+) kB" _ "${out}")
if(NOT CMAKE_MATCH_1)
  message(FATAL_ERROR "plugin_probe did not report its resident memory:\n${out}")
elseif(SANITIZE)
  message(STATUS "resident memory ${CMAKE_MATCH_1} kB not checked under the ${SANITIZE} sanitizer")
elseif(CMAKE_MATCH_1 GREATER 30720)
  message(FATAL_ERROR "a program on the core alone holds ${CMAKE_MATCH_1} kB resident (limit 30 MiB)")
endif()

# 2. A plugin that needs a library which is not there: the reason names that library.
file(COPY_FILE "${NEEDS_DEP}" "${WORK}/needs_dep/libmeshrt_cuda.so")
probe(out MESHRT_PLUGIN_DIR=${WORK}/needs_dep)
if(NOT out MATCHES "cuda: [^\n]*could not be loaded: libmeshrt_fake_dep.so: cannot open shared object file")
  message(FATAL_ERROR "a plugin with a missing library was not reported as such:\n${out}")
endif()

# 3. A plugin built against another core is refused.
file(COPY_FILE "${OTHER_ABI}" "${WORK}/other_abi/libmeshrt_cuda.so")
probe(out MESHRT_PLUGIN_DIR=${WORK}/other_abi)
if(NOT out MATCHES "cuda: [^\n]*was built against another meshrt \\(plugin ABI 999, this core [0-9]+\\)")
  message(FATAL_ERROR "a plugin of another ABI was not refused:\n${out}")
endif()
