# The training example survives a crash and a change of mesh (examples/train, meshrt-train):
#   1. a reference run: 50 steps uninterrupted, FSDP on 8 devices (checksums of the final params and
#      optimizer state; every step's checkpoint kept for --compare-with)
#   2. the same run killed with _exit(137) right after step 30's save (--kill-after-save 30);
#      with MPIRUN set, this run is 2 processes x 4 devices (saved by 2 processes, resumed by 1)
#   3. resumed (--resume) from copies of that folder for steps 31..50:
#        FSDP on 8 devices                       the same summation order: bit for bit
#        DP on 8, DP on 4, 2-D (4x2)             another order: within TOL (below)
#      and, with clipping off (--clip 1e9), FSDP 8 -> DP 8 bit for bit
#   4. the loss plots: well-formed SVG with one polyline of 50 points, the resumed runs' too (the
#      losses before the crash come from the checkpoint's metadata)
# Bit equality holds where the resumed run adds the same numbers in the same order: the same
# data-parallel width keeps every gradient's batch sum (8 blocks, folded in device order under
# MESHRT_DETERMINISTIC=1) and FSDP -> DP keeps them too, but clip_by_global_norm's sum of squares
# is one sum per leaf under DP and 8 block sums + a psum under FSDP, so with clipping on FSDP -> DP
# differs in the last bits; fewer devices (or a feature axis) change the gradient sums themselves.
# TOL bounds max |a - b| / (largest |b| of the leaf) over every parameter and state value: see
# docs/optimizers-checkpoints.md, "Training example", for the arithmetic and the measured numbers.
# Usage: cmake -DEXE=meshrt-train -DWORK=<scratch dir> -DTOL=1e-4 [-DMPIRUN=mpirun;--flags;-np]
#              -P train_resume.cmake   (MESHRT_DETERMINISTIC=1 and 8 cpu devices in the environment)
cmake_policy(SET CMP0007 NEW)
if(NOT DEFINED EXE OR NOT DEFINED WORK OR NOT DEFINED TOL)
  message(FATAL_ERROR "usage: cmake -DEXE=... -DWORK=... -DTOL=... [-DMPIRUN=...] -P train_resume.cmake")
endif()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(failures "")

# Runs meshrt-train (prefix: an mpirun command line or nothing) in WORK; out gets its output.
function(train out expect_rc prefix)
  execute_process(COMMAND ${prefix} ${EXE} ${ARGN} WORKING_DIRECTORY ${WORK}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e TIMEOUT 180)
  string(REGEX REPLACE "step +[0-9]+/[0-9]+ [^\n]*\n" "" summary "${o}")
  message("$ ${prefix} meshrt-train ${ARGN}\nexit ${rc}; output without the step lines:\n${summary}${e}")
  if(NOT "${expect_rc}" STREQUAL "any" AND NOT rc STREQUAL "${expect_rc}")
    message(FATAL_ERROR "exit ${rc}, expected ${expect_rc}:\n${o}${e}")
  endif()
  set(${out} "${o}${e}" PARENT_SCOPE)
endfunction()

function(expect text regex what)
  if(NOT text MATCHES "${regex}")
    set(failures "${failures}  ${what}: output does not match '${regex}'\n" PARENT_SCOPE)
  endif()
endfunction()

# The two checksums a run prints (params;state).
function(checksums out text)
  if(NOT text MATCHES "params checksum (0x[0-9a-f]+).*optimizer state checksum (0x[0-9a-f]+)")
    message(FATAL_ERROR "no checksums in:\n${text}")
  endif()
  set(${out} "${CMAKE_MATCH_1};${CMAKE_MATCH_2}" PARENT_SCOPE)
endfunction()

# The SVG exists, is one document, and its polyline has `points` x,y pairs.
function(check_svg file points)
  if(NOT EXISTS ${WORK}/${file})
    set(failures "${failures}  ${file} was not written\n" PARENT_SCOPE)
    return()
  endif()
  file(READ ${WORK}/${file} svg)
  if(NOT svg MATCHES "^<\\?xml[^\n]*\n<svg xmlns=\"http://www.w3.org/2000/svg\"" OR NOT svg MATCHES "</svg>\n$"
     OR NOT svg MATCHES "<polyline [^>]*points=\"([^\"]*)\"/>")
    set(failures "${failures}  ${file}: not an SVG document with a polyline\n" PARENT_SCOPE)
    return()
  endif()
  string(REGEX MATCHALL "[0-9.]+,[0-9.]+" pairs "${CMAKE_MATCH_1}")
  list(LENGTH pairs n)
  string(REGEX MATCHALL "<polyline" lines "${svg}")
  list(LENGTH lines nlines)
  if(NOT n EQUAL points OR NOT nlines EQUAL 1)
    set(failures "${failures}  ${file}: ${nlines} polyline(s), ${n} points; expected 1 and ${points}\n" PARENT_SCOPE)
  endif()
endfunction()

# A resumed run's comparison with the reference's step 50: bit for bit, or within TOL.
function(check_compare text exact what)
  if(NOT text MATCHES "vs ref/50: ([0-9]+) of ([0-9]+) values differ; max \\|a-b\\| / max\\|leaf\\|: params ([-+.e0-9]+), state ([-+.e0-9]+)")
    set(failures "${failures}  ${what}: no comparison with ref/50 printed\n" PARENT_SCOPE)
    return()
  endif()
  set(differ ${CMAKE_MATCH_1})
  set(total ${CMAKE_MATCH_2})
  set(dp ${CMAKE_MATCH_3})
  set(ds ${CMAKE_MATCH_4})
  if(total LESS 500000)
    set(failures "${failures}  ${what}: compared only ${total} values\n" PARENT_SCOPE)
  elseif(exact AND NOT differ EQUAL 0)
    set(failures "${failures}  ${what}: ${differ} of ${total} values differ from the uninterrupted run; expected none\n" PARENT_SCOPE)
  elseif(NOT exact AND (NOT dp LESS TOL OR NOT ds LESS TOL))
    set(failures "${failures}  ${what}: params differ by ${dp}, state by ${ds} (of the leaf's largest value); expected < ${TOL}\n" PARENT_SCOPE)
  else()
    message("ok: ${what}: ${differ} of ${total} values differ, params ${dp}, state ${ds} (exact: ${exact}, TOL ${TOL})")
  endif()
endfunction()

function(expect_equal a b what)
  if(NOT "${a}" STREQUAL "${b}")
    set(failures "${failures}  ${what}: checksums ${a} differ from the uninterrupted run's ${b}\n" PARENT_SCOPE)
  else()
    message("ok: ${what}: checksums ${a} equal the uninterrupted run's")
  endif()
endfunction()

# 1. The uninterrupted reference.
train(ref 0 "" --strategy fsdp --mesh 8 --dir ref --plot ref.svg)
checksums(want "${ref}")
string(REGEX MATCHALL "\nstep +[0-9]+/50  loss" lines "\n${ref}")
list(LENGTH lines n)
if(NOT n EQUAL 50)
  string(APPEND failures "  reference: ${n} step lines, expected 50\n")
endif()
expect("${ref}" "wrote ref.svg \\(50 points\\)" "reference")
check_svg(ref.svg 50)

# 2. Killed right after step 30's save.
if(DEFINED MPIRUN AND NOT "${MPIRUN}" STREQUAL "")
  set(ENV{MESHRT_CPU_DEVICES} 4)
  train(killed any "${MPIRUN};2" --strategy fsdp --mesh 8 --dir run --kill-after-save 30)
  # mpirun ends the job when the first process exits: process 0 may be gone before it prints.
  expect("${killed}" "2 process\\(es\\)" "killed run under mpirun")
  set(ENV{MESHRT_CPU_DEVICES} 8)
else()
  train(killed 137 "" --strategy fsdp --mesh 8 --dir run --kill-after-save 30)
  expect("${killed}" "saved run/30 \\(sync\\)[^\n]*\nkilled after step 30's save" "killed run")
endif()
if(killed MATCHES "step +31/" OR NOT IS_DIRECTORY ${WORK}/run/30 OR EXISTS ${WORK}/run/40)
  string(APPEND failures "  the killed run went on after step 30 or left no step 30\n")
endif()
foreach(copy IN ITEMS dp8 dp4 2d)
  file(COPY ${WORK}/run/ DESTINATION ${WORK}/run_${copy})
endforeach()

# 3. Resumed: the same mesh (bit for bit), then other meshes and strategies (within TOL).
train(same 0 "" --strategy fsdp --mesh 8 --dir run --resume --compare-with ref --plot same.svg)
expect("${same}" "resumed run/30 \\(saved under fsdp on mesh 8\\) onto fsdp on mesh 8" "resume, same mesh")
expect("${same}" "\nstep  31/50  loss" "resume, same mesh")
checksums(got "${same}")
expect_equal("${got}" "${want}" "FSDP 8 -> FSDP 8")
check_compare("${same}" TRUE "FSDP 8 -> FSDP 8")
check_svg(same.svg 50)
foreach(case IN ITEMS "dp8|dp|8" "dp4|dp|4" "2d|2d|4x2")
  string(REPLACE "|" ";" case "${case}")
  list(GET case 0 dir)
  list(GET case 1 strategy)
  list(GET case 2 mesh)
  train(other 0 "" --strategy ${strategy} --mesh ${mesh} --dir run_${dir} --resume --compare-with ref
        --plot ${dir}.svg)
  expect("${other}" "resumed run_${dir}/30 \\(saved under fsdp on mesh 8\\) onto ${strategy} on mesh ${mesh}" "resume onto ${strategy} ${mesh}")
  check_compare("${other}" FALSE "FSDP 8 -> ${strategy} ${mesh}")
  check_svg(${dir}.svg 50)
endforeach()

# With clipping off, FSDP and DP over the same 8 devices add the same numbers in the same order.
train(ref_noclip 0 "" --strategy fsdp --mesh 8 --clip 1e9 --dir ref_noclip --plot ref_noclip.svg)
checksums(want_noclip "${ref_noclip}")
train(killed_noclip 137 "" --strategy fsdp --mesh 8 --clip 1e9 --dir run_noclip --kill-after-save 30)
train(noclip 0 "" --strategy dp --mesh 8 --clip 1e9 --dir run_noclip --resume --plot noclip.svg)
checksums(got_noclip "${noclip}")
expect_equal("${got_noclip}" "${want_noclip}" "FSDP 8 -> DP 8 without clipping")

if(NOT failures STREQUAL "")
  message(FATAL_ERROR "train_resume.cmake:\n${failures}")
endif()
