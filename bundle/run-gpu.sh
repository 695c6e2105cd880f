#!/usr/bin/env bash
# run-gpu.sh: meshrt's GPU bundle (made by ./run.sh gpu-bundle), unpacked anywhere on an x86-64
# Linux machine with a GPU, a CUDA 13 driver and runtime, cuBLAS and NCCL.
#
#   ./run-gpu.sh [--out DIR] [--k "1 2 4 8"] [--jobs N] [--no-bench] [--no-tests] [--quick]
#                [--benches "kernels mlp tf32 bf16 collectives lt graphs fibers chains jax ncu profile"]
#       runs every cuda suite at each k (logical devices per GPU) with MESHRT_REQUIRE_CUDA=1, one
#       process per suite and k, then the GPU benchmarks (kernels against the copy bound, the seed
#       MLP step to completion, collectives, the collective matmul, JAX's step on the same GPU
#       when python3 can import jax; `lt`, `graphs`, `fibers`, `chains`: suites and the step again
#       with MESHRT_CUDA_MATMUL=lt, MESHRT_CUDA_GRAPHS=1, MESHRT_CUDA_EXECUTOR=fibers,
#       MESHRT_CUDA_FUSION=chains; `ncu` and
#       `profile`, run only when named:
#       GPU time per kernel with Nsight Compute, Nsight Systems summaries); writes DIR/report.md
#       and DIR/logs/, prints a summary last.
#       Exits 1 when any case fails, a benchmark fails, or cuda is not usable.
#   ./run-gpu.sh --check
#       only checks the unpacked layout and that every program's libraries resolve (cpu CI).
#
# cuBLAS, the CUDA runtime and NCCL are found on LD_LIBRARY_PATH, in the CUDA install
# (/usr/local/cuda*), or in a Python wheel's folder (nvidia/*/lib: pip's nvidia-nccl-cu13 ...).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
check=0 quick=0 run_tests=1 run_bench=1 jobs=4
ks="1 2 4 8"
benches="kernels mlp tf32 bf16 collectives lt graphs fibers chains jax"
out="$PWD/meshrt-gpu-report"
while [ $# -gt 0 ]; do
  case "$1" in
    --check) check=1 ;;
    --quick) quick=1 ;;
    --no-tests) run_tests=0 ;;
    --no-bench) run_bench=0 ;;
    --k) ks="$2"; shift ;;
    --benches) benches="$2"; shift ;;
    --jobs) jobs="$2"; shift ;;
    --out) out="$2"; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "run-gpu.sh: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
  shift
done

die() { echo "run-gpu.sh: $*" >&2; exit 1; }

# ---- layout
[ -f "$here/cuda_suites.txt" ] || die "cuda_suites.txt missing next to the script: unpack the whole bundle"
for d in bin lib data bench; do [ -d "$here/$d" ] || die "$d/ missing next to the script: unpack the whole bundle"; done
suites=()
while IFS=$'\t' read -r name exe devs filter min kvals; do
  [ -n "$name" ] || continue
  [ -x "$here/$exe" ] || die "$exe listed in cuda_suites.txt is missing or not executable"
  suites+=("$name"$'\t'"$exe"$'\t'"$devs"$'\t'"$filter"$'\t'"$min"$'\t'"$kvals")
done < "$here/cuda_suites.txt"
[ ${#suites[@]} -gt 0 ] || die "cuda_suites.txt lists no suite"
for f in global_view_expected.txt autodiff_expected.txt mlp_expected.txt; do
  [ -f "$here/data/$f" ] || die "data/$f missing"
done
for p in meshrt-bench meshrt-kernel-report meshrt-mlp-bench meshrt-demo; do
  [ -x "$here/bin/$p" ] || die "bin/$p missing"
done

# ---- libraries: the bundle's own first, then wherever the machine keeps the CUDA ones
libdirs=("$here/lib")
[ -n "${LD_LIBRARY_PATH:-}" ] && IFS=: read -r -a extra <<< "$LD_LIBRARY_PATH" && libdirs+=("${extra[@]}")
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 \
         /usr/local/cuda-13*/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
  [ -d "$d" ] && libdirs+=("$d")
done
if command -v python3 >/dev/null 2>&1; then
  while read -r site; do
    for d in "$site"/nvidia/*/lib; do [ -d "$d" ] && libdirs+=("$d"); done
  done < <(python3 -c 'import site, sys
for p in site.getsitepackages() + [site.getusersitepackages()] + sys.path: print(p)' 2>/dev/null | sort -u)
fi
LD_LIBRARY_PATH="$(IFS=:; echo "${libdirs[*]}")"
export LD_LIBRARY_PATH

# Where each CUDA library the programs and the cuda plugin need resolves, and what does not.
[ -f "$here/lib/libmeshrt_cuda.so" ] || die "lib/libmeshrt_cuda.so (the cuda platform) is missing: unpack the whole bundle"
missing=""
for p in "$here"/bin/* "$here"/lib/libmeshrt_cuda.so; do
  while read -r lib; do
    case " $missing " in *" $lib "*) ;; *) missing="$missing $lib" ;; esac
  done < <(ldd "$p" 2>/dev/null | awk '/not found/ {print $1}')
  if ldd "$p" 2>&1 | grep -q "version .* not found"; then
    ldd "$p" 2>&1 | grep "version .* not found" | sort -u >&2
    die "$(basename "$p") needs a newer system library than this machine has (above)"
  fi
done
# The programs' run paths still name the build tree: meshrt's own library must come from here.
for p in "$here"/bin/*; do
  where="$(ldd "$p" 2>/dev/null | awk '$1 ~ /^libmeshrt/ {print $3; exit}')"
  case "$where" in
    "$here"/lib/*|"") ;;
    *) die "$(basename "$p") loads libmeshrt from $where, outside the bundle: lib/ is incomplete; repack it" ;;
  esac
done
if [ -n "$missing" ]; then
  echo "run-gpu.sh: these libraries were not found:$missing" >&2
  echo "  searched: ${LD_LIBRARY_PATH//:/ }" >&2
  echo "  the CUDA runtime and cuBLAS come with the CUDA 13 toolkit (/usr/local/cuda/lib64); NCCL" >&2
  echo "  with libnccl2 or 'pip install nvidia-nccl-cu13'; add their folders to LD_LIBRARY_PATH" >&2
  exit 1
fi
resolved() {  # the file a library name resolves to for the cuda plugin
  ldd "$here/lib/libmeshrt_cuda.so" 2>/dev/null | awk -v l="$1" '$1 ~ "^"l {print $3; exit}'
}
cudart="$(readlink -f "$(resolved libcudart)" 2>/dev/null)"
cublas="$(readlink -f "$(resolved libcublas.so)" 2>/dev/null)"
nccl="$(readlink -f "$(resolved libnccl)" 2>/dev/null)"
# Every program must start: list a suite's tests (needs no GPU).
"$here/bin/test_astype" --gtest_list_tests > /dev/null 2>&1 || die "bin/test_astype does not start: $("$here/bin/test_astype" --gtest_list_tests 2>&1 | tail -3)"
if [ "$check" = 1 ]; then
  echo "run-gpu.sh --check: layout OK (${#suites[@]} cuda suites, $(ls "$here/bin" | wc -l) programs, $(ls "$here/lib" | wc -l) bundled libraries); every library resolves"
  echo "  cuda runtime: ${cudart:-?}"
  echo "  cuBLAS:       ${cublas:-?}"
  echo "  NCCL:         ${nccl:-?}"
  exit 0
fi

# ---- the machine
mkdir -p "$out/logs" || die "cannot create $out"
report="$out/report.md"
gpu="unknown GPU" driver="?"
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu="$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)"
  driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
fi
start=$(date +%s)
{
  echo "# meshrt GPU run"
  echo
  echo "- $(head -1 "$here/VERSION" 2>/dev/null); $(sed -n 2p "$here/VERSION" 2>/dev/null)"
  echo "- run $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname): $gpu, driver $driver"
  echo "- CUDA runtime $(basename "${cudart:-?}"), cuBLAS $(basename "${cublas:-?}"), NCCL $(basename "${nccl:-?}")"
} > "$report"

failures=()
cuda_unusable=0
# Is cuda usable at all? (A suite's start checks it before any test; this one runs none.)
probe="$(cd "$here" && MESHRT_REQUIRE_CUDA=1 ./bin/test_astype --gtest_filter=NoSuchTest \
           --meshrt-env=MESHRT_PLATFORM=cuda 2>&1)"
if [ $? -ne 0 ]; then
  echo "$probe" | tail -3 >&2
  {
    echo
    echo "## The cuda platform is not usable here"
    echo
    echo "$probe" | tail -3
  } >> "$report"
  echo "report: $report"
  die "the cuda platform is not usable on this machine (above); nothing was run"
fi

# ---- the suites: one process per suite and k
declare -A cell=()
run_suite() {  # name exe devs filter min k [tag VAR=value...] -> logs/name.kK[tag].log and .rc
  local name="$1" exe="$2" devs="$3" filter="$4" min="$5" k="$6" tag="${7:-}"
  shift $(( $# < 7 ? $# : 7 ))
  local log="$out/logs/$name.k$k$tag.log"
  ( cd "$here" && env "$@" MESHRT_REQUIRE_CUDA=1 MESHRT_CPU_DEVICES="$devs" MESHRT_TEST_DATA_DIR="$here/data" \
      timeout "${suite_limit:-600}" "./$exe" "--gtest_filter=$filter" --meshrt-env=MESHRT_PLATFORM=cuda \
      "--meshrt-env=MESHRT_CUDA_DEVICES_PER_GPU=$k" "--meshrt-env=MESHRT_TEST_MIN_DEVICES=$min" ) \
      > "$log" 2>&1
  echo $? > "$log.rc"
}
# A suite's gtest counts from its log: sets pass, fail and skip (the caller's, when local there).
counts() {
  pass=$(grep -oE '^\[  PASSED  \] [0-9]+' "$1" | grep -oE '[0-9]+$' | tail -1)
  fail=$(grep -oE '^\[  FAILED  \] [0-9]+ tests?,' "$1" | grep -oE '[0-9]+' | tail -1)
  skip=$(grep -oE '^\[  SKIPPED \] [0-9]+ tests?,' "$1" | grep -oE '[0-9]+' | tail -1)
}
# A failed suite's first failed cases and its log's last lines, on one line (the summary's).
failed_cases() {
  (grep -E '^\[  FAILED  \] [A-Za-z]' "$1" | head -4; tail -2 "$1") | tr '\n' ' ' | cut -c1-400
}
if [ "$run_tests" = 1 ]; then
  echo "run-gpu.sh: ${#suites[@]} cuda suites at k = $ks, $jobs at a time; logs in $out/logs"
  for entry in "${suites[@]}"; do
    IFS=$'\t' read -r name exe devs filter min kvals <<< "$entry"
    for k in $ks; do
      case " $kvals " in *" $k "*) ;; *) continue ;; esac
      while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
      run_suite "$name" "$exe" "$devs" "$filter" "$min" "$k" &
    done
  done
  # The demo on cuda: every part, no mismatch.
  ( cd "$here" && MESHRT_CUDA_DEVICES_PER_GPU=8 timeout 300 ./bin/meshrt-demo --platform=cuda --quick ) \
    > "$out/logs/demo.k8.log" 2>&1
  echo $? > "$out/logs/demo.k8.log.rc"
  wait
  {
    echo
    echo "## Tests (cases passed / failed / skipped; a whole suite skips when k gives it too few devices)"
    echo
    printf "| suite |"; for k in $ks; do printf " k=%s |" "$k"; done; echo
    printf "| --- |"; for k in $ks; do printf " --- |"; done; echo
  } >> "$report"
  for entry in "${suites[@]}"; do
    IFS=$'\t' read -r name exe devs filter min kvals <<< "$entry"
    printf "| %s |" "$name" >> "$report"
    for k in $ks; do
      log="$out/logs/$name.k$k.log"
      if [ ! -f "$log.rc" ]; then printf " — |" >> "$report"; continue; fi
      rc=$(cat "$log.rc")
      counts "$log"
      if [ "$rc" = 77 ]; then
        printf " suite skipped (%s devices < %s) |" "$k" "$min" >> "$report"
      elif [ "$rc" = 0 ]; then
        printf " %s / 0 / %s |" "${pass:-0}" "${skip:-0}" >> "$report"
      else
        printf " **%s / %s / %s (exit %s)** |" "${pass:-0}" "${fail:-?}" "${skip:-0}" "$rc" >> "$report"
        failures+=("$name at k=$k (exit $rc): $(failed_cases "$log")")
        grep -q "is not usable" "$log" && cuda_unusable=1
        # Once more with device-to-device copies waited on by the host (MESHRT_CUDA_SYNC_COPIES=1):
        # a failure that goes away is an ordering problem of the stream-ordered copies.
        if ! grep -q "is not usable" "$log"; then
          ( cd "$here" && MESHRT_CUDA_SYNC_COPIES=1 MESHRT_REQUIRE_CUDA=1 MESHRT_CPU_DEVICES="$devs" \
              MESHRT_TEST_DATA_DIR="$here/data" timeout 600 "./$exe" "--gtest_filter=$filter" \
              --meshrt-env=MESHRT_PLATFORM=cuda "--meshrt-env=MESHRT_CUDA_DEVICES_PER_GPU=$k" \
              "--meshrt-env=MESHRT_TEST_MIN_DEVICES=$min" ) > "$log.sync-copies" 2>&1
          src=$?
          failures+=("$name at k=$k rerun with MESHRT_CUDA_SYNC_COPIES=1: $([ $src = 0 ] && echo passed || echo "failed too (exit $src)")")
        fi
      fi
    done
    echo >> "$report"
  done
  rc=$(cat "$out/logs/demo.k8.log.rc")
  if [ "$rc" != 0 ] || grep -qE "MISMATCH|error|eager: NO|preserved: NO" "$out/logs/demo.k8.log"; then
    failures+=("meshrt-demo --platform=cuda --quick (exit $rc): $(grep -E 'MISMATCH|error' "$out/logs/demo.k8.log" | head -2 | tr '\n' ' ')")
    echo "| meshrt-demo --platform=cuda --quick (k=8) | **failed** |" >> "$report"
  else
    echo "| meshrt-demo --platform=cuda --quick (k=8) | ran, no mismatch |" >> "$report"
  fi
fi

# ---- the benchmarks, to completion
bench() {  # title k timeout command... : runs it, appends its output to the report
  local title="$1" k="$2" limit="$3"
  shift 3
  local log="$out/logs/bench.$(echo "$title" | tr -c 'A-Za-z0-9' '_' | cut -c1-40).log"
  echo "run-gpu.sh: $title"
  ( cd "$here" && MESHRT_PLATFORM=cuda MESHRT_CUDA_DEVICES_PER_GPU="$k" timeout "$limit" "$@" ) > "$log" 2>&1
  local rc=$?
  {
    echo
    echo "### $title"
    echo
    echo "\`MESHRT_PLATFORM=cuda MESHRT_CUDA_DEVICES_PER_GPU=$k $*\`"
    echo
    if grep -q '^| ' "$log"; then cat "$log"; else echo '```'; cat "$log"; echo '```'; fi
  } >> "$report"
  if [ $rc -ne 0 ] || grep -q "#wrong [1-9]\|Out of bounds values : [1-9]" "$log"; then
    failures+=("benchmark '$title' (exit $rc): $(tail -2 "$log" | tr '\n' ' ' | cut -c1-200)")
  fi
}
if [ "$run_bench" = 1 ] && [ "$cuda_unusable" = 0 ]; then
  echo -e "\n## Benchmarks (every time ends in a real wait)" >> "$report"
  q=(); [ "$quick" = 1 ] && q=(--quick)
  n=20; w=5; [ "$quick" = 1 ] && n=3 && w=1
  want() { case " $benches " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
  reps="$([ "$quick" = 1 ] && echo 2 || echo 10)"
  want kernels && bench "Kernels against the copy bound, seed step products, collective matmul (8 logical devices)" 8 240 \
    ./bin/meshrt-kernel-report "${q[@]}"
  want mlp && bench "Seed MLP step [784, 1024x5, 8], batch 8192, f32: 1 logical device and 8 (DP, FSDP, TP, 2-D)" 8 240 \
    ./bin/meshrt-mlp-bench --resident-only --repeats "$reps" "${q[@]}"
  want tf32 && bench "Seed MLP step, 1 logical device, matmul precision tf32 (MESHRT_MATMUL_PRECISION=tf32)" 2 120 \
    env MESHRT_MATMUL_PRECISION=tf32 ./bin/meshrt-mlp-bench --resident-only --strategy single --repeats "$reps" "${q[@]}"
  # bf16 mixed precision (float32 master parameters, bfloat16 layers): JAX's step_bf16 below.
  want bf16 && bench "Seed MLP step, 1 logical device, bf16 mixed precision (--dtype bf16)" 2 120 \
    ./bin/meshrt-mlp-bench --resident-only --strategy single --dtype bf16 --repeats 3 "${q[@]}"
  # Suites run again under an opt-in setting: env_suites TAG "VAR=value ..." suite:k ...
  env_suites() {
    local tag="$1" vars="$2"
    shift 2
    local runs=() spec name exe devs filter min kvals k
    {
      echo
      echo "### Suites with $vars (cases passed / failed / skipped)"
      echo
      echo "| suite | k | result |"
      echo "| --- | --- | --- |"
    } >> "$report"
    for spec in "$@"; do
      for entry in "${suites[@]}"; do
        IFS=$'\t' read -r name exe devs filter min kvals <<< "$entry"
        [ "$name" = "${spec%:*}" ] || continue
        k="${spec#*:}"
        while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
        # An opt-in that hangs must not take a whole device call: 180 s per suite (exit 124).
        # shellcheck disable=SC2086
        suite_limit=180 run_suite "$name" "$exe" "$devs" "$filter" "$min" "$k" ".$tag" $vars &
        runs+=("$name $k")
      done
    done
    wait
    for r in "${runs[@]}"; do
      read -r name k <<< "$r"
      local log="$out/logs/$name.k$k.$tag.log" rc pass fail skip
      rc=$(cat "$log.rc")
      counts "$log"
      echo "| $name | $k | ${pass:-0} / ${fail:-0} / ${skip:-0} (exit $rc) |" >> "$report"
      if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then  # 77: the suite skipped (too few devices)
        failures+=("$name at k=$k with $vars (exit $rc): $(failed_cases "$log")")
      fi
    done
  }
  # cuBLASLt (MESHRT_CUDA_MATMUL=lt): every float32 product through cuBLASLt, and jit's layers
  # with their bias add and relu in the product's epilogue. The suites that multiply run again
  # under it (CudaKernels.LtEpiloguesGiveTheUnfusedBits runs only then; test_jit and test_mlp
  # check jitted steps against eager bit for bit), then the step at both precisions.
  if want lt; then
    env_suites lt "MESHRT_CUDA_MATMUL=lt" test_cuda_kernels:1 test_ops:1 test_jit:8 test_mlp:8 \
      test_global_view:8 test_autodiff_jax:8
    bench "Seed MLP step, 1 logical device, MESHRT_CUDA_MATMUL=lt (cuBLASLt; jit fuses bias and relu)" 2 120 \
      env MESHRT_CUDA_MATMUL=lt ./bin/meshrt-mlp-bench --resident-only --strategy single --repeats "$reps" "${q[@]}"
    bench "Seed MLP step, 1 logical device, MESHRT_CUDA_MATMUL=lt at tf32" 2 120 \
      env MESHRT_CUDA_MATMUL=lt MESHRT_MATMUL_PRECISION=tf32 ./bin/meshrt-mlp-bench --resident-only --strategy single --repeats "$reps" "${q[@]}"
    bench "A layer's product, bias and relu: eager op by op, eager as one expression, jit; its backward through relu, eager and jit; MESHRT_CUDA_MATMUL=lt" 2 120 \
      env MESHRT_CUDA_MATMUL=lt ./bin/meshrt-kernel-report --layers-only "${q[@]}"
  fi
  # CUDA graphs (MESHRT_CUDA_GRAPHS=1): jit's compiled steps captured where their addresses
  # repeat and launched as one graph per step and device. The jit suites run again under it,
  # then the step on one logical device (both precisions) and on 8 (DP, FSDP), and with lt too.
  if want graphs; then
    env_suites graphs "MESHRT_CUDA_GRAPHS=1" test_cuda_kernels:1 test_jit:8 test_mlp:8 test_optim:8 \
      test_autodiff_jax:8
    bench "Seed MLP step with MESHRT_CUDA_GRAPHS=1: 1 logical device and 8 (DP, FSDP, TP, 2-D)" 8 240 \
      env MESHRT_CUDA_GRAPHS=1 ./bin/meshrt-mlp-bench --resident-only --repeats "$reps" "${q[@]}"
    bench "Seed MLP step, 1 logical device, MESHRT_CUDA_GRAPHS=1 MESHRT_CUDA_MATMUL=lt at tf32" 2 120 \
      env MESHRT_CUDA_GRAPHS=1 MESHRT_CUDA_MATMUL=lt MESHRT_MATMUL_PRECISION=tf32 ./bin/meshrt-mlp-bench --resident-only --strategy single --repeats "$reps" "${q[@]}"
  fi
  # One GPU's logical devices as fibers on one thread (MESHRT_CUDA_EXECUTOR=fibers): the suites
  # whose bodies meet in collectives run again under it, then the psum latency and the steps.
  if want fibers; then
    env_suites fibers "MESHRT_CUDA_EXECUTOR=fibers" test_collectives:8 test_shard_map:8 test_jit:8 \
      test_jit_shard_map:8 test_mlp:8 test_collective_matmul:8
    bench "psum of one float over 8 logical devices, MESHRT_CUDA_EXECUTOR=fibers" 8 120 \
      env MESHRT_CUDA_EXECUTOR=fibers ./bin/meshrt-bench all_reduce -b 4 -e 4 -g 8 --platform cuda --algo direct,ring,bidi_ring -n $((n * 15)) -w $((w * 6))
    bench "Seed MLP step with MESHRT_CUDA_EXECUTOR=fibers (and with MESHRT_CUDA_GRAPHS=1 below)" 8 240 \
      env MESHRT_CUDA_EXECUTOR=fibers ./bin/meshrt-mlp-bench --resident-only --repeats "$reps" "${q[@]}"
    bench "Seed MLP step with MESHRT_CUDA_EXECUTOR=fibers MESHRT_CUDA_GRAPHS=1" 8 240 \
      env MESHRT_CUDA_EXECUTOR=fibers MESHRT_CUDA_GRAPHS=1 ./bin/meshrt-mlp-bench --resident-only --repeats "$reps" "${q[@]}"
  fi
  # Fused elementwise chains (MESHRT_CUDA_FUSION=chains): jit runs every chain of elementwise
  # kernels the chain kernel takes as one kernel. CudaKernels.ChainsMatchCpu runs only then; the
  # jit, MLP, optimizer and JAX gradient suites check jitted steps against eager bit for bit.
  if want chains; then
    env_suites chains "MESHRT_CUDA_FUSION=chains" test_cuda_kernels:1 test_jit:8 test_mlp:8 \
      test_optim:8 test_autodiff_jax:8 test_jit_shard_map:8
    bench "Seed MLP step with MESHRT_CUDA_FUSION=chains: 1 logical device and 8 (DP, FSDP, TP, 2-D)" 8 240 \
      env MESHRT_CUDA_FUSION=chains ./bin/meshrt-mlp-bench --resident-only --repeats "$reps" "${q[@]}"
    bench "Fused pairs and adam's update (3 chains), eager and jit, MESHRT_CUDA_FUSION=chains" 2 120 \
      env MESHRT_CUDA_FUSION=chains ./bin/meshrt-kernel-report --fused-only "${q[@]}"
    bench "The same rows with the default MESHRT_CUDA_FUSION=pairs (adam unfused), for the ratio" 2 120 \
      ./bin/meshrt-kernel-report --fused-only "${q[@]}"
  fi
  if want collectives; then
    bench "psum of one float over 8 logical devices (latency)" 8 120 \
      ./bin/meshrt-bench all_reduce -b 4 -e 4 -g 8 --platform cuda --algo direct,ring,bidi_ring -n $((n * 15)) -w $((w * 6))
    bench "all_reduce 8 B - 1 GiB over 4 logical devices" 4 240 \
      ./bin/meshrt-bench all_reduce -b 8 -e "$([ "$quick" = 1 ] && echo 1M || echo 1G)" -f 8 -g 4 --platform cuda --algo direct,ring,bidi_ring -n "$n" -w "$w"
    for op in all_gather reduce_scatter all_to_all ppermute; do
      bench "$op 16 MiB over 4 logical devices" 4 120 \
        ./bin/meshrt-bench "$op" -b 16M -e 16M -g 4 --platform cuda --algo direct,ring,bidi_ring -n "$n" -w "$w"
    done
  fi
  # Where the step's GPU time goes: Nsight Systems' kernel, copy and API summaries of the jitted
  # DP and FSDP steps on 8 logical devices (only when nsys is on the machine).
  if want profile; then
    if command -v nsys >/dev/null 2>&1; then
      for st in dp fsdp; do
        bench "Nsight Systems summary: $st step on 8 logical devices" 8 90 \
          sh -c "nsys profile --trace=cuda,osrt --sample=none --force-overwrite=true -o '$out/logs/$st' \
                   ./bin/meshrt-mlp-bench --resident-only --strategy $st --repeats 2 > /dev/null 2>&1 &&
                 nsys stats --report cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_api_sum,osrt_sum \
                   --format table '$out/logs/$st.nsys-rep' 2>&1 | cut -c1-220 | head -150"
      done
    else
      echo -e "\n### Profile\n\nnsys is not on this machine: no step profile." >> "$report"
    fi
  fi
  # Where the GPU time goes, per kernel (Nsight Compute's gpu__time_duration.sum, summed by
  # kernel by bench/ncu_summary.py): the jitted step on one logical device at both precisions and
  # the DP step on 8, and the kernel report's single ops. ncu replays each kernel to time it, so
  # these runs are slow and their wall times mean nothing; only the per-kernel times do.
  if want ncu; then
    if command -v ncu >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1; then
      for spec in "single highest" "single tf32" "dp highest"; do
        read -r st prec <<< "$spec"
        csv="$out/logs/ncu.$st.$prec.csv"
        bench "ncu: GPU time per kernel, $st step, precision $prec (8 logical devices)" 8 240 \
          sh -c "MESHRT_MATMUL_PRECISION=$prec ncu --csv --print-units base --metrics gpu__time_duration.sum \
                   --launch-count 5000 ./bin/meshrt-mlp-bench --resident-only --strategy $st --repeats 1 \
                   > '$csv' 2> '$csv.err'; python3 bench/ncu_summary.py '$csv' || tail -5 '$csv.err'"
      done
    else
      echo -e "\n### ncu\n\nncu or python3 is not on this machine: no per-kernel profile." >> "$report"
    fi
  fi
  if ! want jax; then
    :
  elif command -v python3 >/dev/null 2>&1 && python3 -c 'import jax' >/dev/null 2>&1; then
    bench "JAX on the same GPU: jit(value_and_grad) of the seed step, precision highest and default, bf16 mixed" 1 300 \
      python3 bench/jax_gpu_step.py --repeats "$([ "$quick" = 1 ] && echo 3 || echo 50)" "${q[@]}"
  else
    echo -e "\n### JAX\n\npython3 cannot import jax on this machine: no JAX comparison." >> "$report"
  fi
fi

# ---- summary, last
elapsed=$(( $(date +%s) - start ))
{
  echo
  echo "## Summary"
  echo
  if [ ${#failures[@]} -eq 0 ] && [ "$cuda_unusable" = 0 ]; then
    echo "All green in ${elapsed} s."
  else
    echo "${#failures[@]} failure(s) in ${elapsed} s:"
    for f in "${failures[@]}"; do echo "- $f"; done
  fi
} >> "$report"
echo
sed -n '/^## Tests/,/^## Benchmarks/p' "$report" | grep -v '^## Benchmarks'
sed -n '/^## Summary/,$p' "$report"
echo "report: $report"
if [ "$cuda_unusable" = 1 ]; then
  echo "run-gpu.sh: the cuda platform is not usable here (see the logs above)" >&2
  exit 1
fi
[ ${#failures[@]} -eq 0 ]
