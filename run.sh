#!/usr/bin/env bash
# meshrt's entry point.
#   ./run.sh demo                         set up, build, run the walkthrough on 8 simulated cpu devices
#   ./run.sh test [--sanitize=thread|address]   set up, build, run the whole suite (CTest); a
#                                         sanitizer builds build-<name>/ (RelWithDebInfo) and any
#                                         report fails the test: address = ASan + UBSan + LSan
#                                         (about 14 min for the suite on 2 cores), thread = TSan
#                                         (about 21 min); the multi-process tests use the Open MPI
#                                         suppression files in tests/sanitizers/
#   ./run.sh test --sanitize=address --ci-subset   the same, over CI's subset only (CTest label
#                                         sanitize_ci: collectives, shard_map, global view, jit,
#                                         autodiff, trees, the mpirun tests)
#   ./run.sh fuzz [SECONDS]               build the libFuzzer targets (fuzz/, clang) in build-fuzz/
#                                         and run each for SECONDS (default 45) on a copy of its
#                                         seed corpus fuzz/corpus/<target>; fails on any crash
#   ./run.sh perf [--quick]               set up, build, print the collective performance report
#   ./run.sh bench                        set up, build, run the Google Benchmark suites
#   (meshrt-bench, the nccl-tests-style CLI, is build/bench/meshrt-bench; see README)
#   ./run.sh build                        set up and build only
#   ./run.sh docs                         the API reference: Doxygen over the public headers into
#                                         build/docs/html (the guide is docs/*.md)
#   ./run.sh gpu-bundle [OUT.tar.xz]      build the cuda platform (MPI off) in build-gpu/ and pack
#                                         the GPU bundle (default meshrt-gpu-bundle.tar.xz): unpack
#                                         it on a GPU machine and run ./meshrt-gpu/run-gpu.sh
#   ./run.sh packages [command]           print the Debian packages `command` (default test) installs
# Installs missing Debian packages with apt-get (needs root or sudo). Every command installs the
# one package list below: Open MPI is in it for the perf baseline and the multi-process runtime.
set -euo pipefail
cd "$(dirname "$0")"

cmd="${1:-demo}"
[ $# -gt 0 ] && shift
sanitize=""
ci_subset=0
extra=()
for arg in "$@"; do
  case "$arg" in
    --sanitize=thread|--sanitize=address) sanitize="${arg#--sanitize=}" ;;
    --ci-subset) ci_subset=1 ;;
    --sanitize=*) echo "run.sh: --sanitize takes thread or address" >&2; exit 2 ;;
    *) extra+=("$arg") ;;
  esac
done

packages=(build-essential cmake ninja-build ccache pkg-config libtbb-dev libopenblas-dev
          libgtest-dev libgmock-dev libbenchmark-dev clang clang-format openmpi-bin libopenmpi-dev)

# The packages a command needs: the shared list, plus gnuplot for bench's plots.
for_cmd="$cmd"
[ "$cmd" = packages ] && for_cmd="${extra[0]:-test}"
if [ "$for_cmd" = bench ]; then packages+=(gnuplot-nox); fi
if [ "$for_cmd" = docs ]; then packages+=(doxygen); fi
# libFuzzer's runtime (clang's -fsanitize=fuzzer) is only a recommendation of clang's packages.
if [ "$for_cmd" = fuzz ]; then packages+=(libclang-rt-dev); fi

install_missing() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  echo "run.sh: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q || true
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

build_dir="build"
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release)
if [ "$cmd" = gpu-bundle ]; then
  # Kernels for Ampere (sm_80: A100) and Hopper (sm_90: H100, H200); MPI off: one process per
  # GPU machine run, and no Open MPI needed there.
  build_dir="build-gpu"
  cmake_args+=(-DMESHRT_BUILD_CUDA=ON -DMESHRT_BUILD_MPI=OFF "-DCMAKE_CUDA_ARCHITECTURES=${MESHRT_CUDA_ARCHS:-80;90}")
fi
if [ -n "$sanitize" ]; then
  build_dir="build-$sanitize"
  cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMESHRT_SANITIZE="$sanitize" -DMESHRT_BUILD_BENCHMARKS=OFF)
fi
command -v ccache >/dev/null 2>&1 && cmake_args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)

configure_and_build() {
  install_missing
  cmake -S . -B "$build_dir" "${cmake_args[@]}" > "$build_dir.configure.log" 2>&1 ||
    { cat "$build_dir.configure.log"; exit 1; }
  cmake --build "$build_dir" -j "$(nproc)" "$@"
}

jobs=$(nproc)
case "$cmd" in
  demo)
    configure_and_build --target meshrt-demo
    MESHRT_CPU_DEVICES="${MESHRT_CPU_DEVICES:-8}" "./$build_dir/examples/meshrt-demo" "${extra[@]}"
    ;;
  test)
    configure_and_build
    if [ "$sanitize" = "thread" ]; then
      export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
    elif [ "$sanitize" = "address" ]; then
      export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    fi
    if [ "$ci_subset" = 1 ]; then
      [ -n "$sanitize" ] || { echo "run.sh: --ci-subset goes with --sanitize=..." >&2; exit 2; }
      extra+=(-L sanitize_ci)
    fi
    ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" "${extra[@]}"
    ;;
  fuzz)
    configure_and_build --target meshrt  # fuzz_bench_args links the core
    seconds="${extra[0]:-45}"
    cmake -S fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
      "-DMESHRT_CORE=$PWD/$build_dir/libmeshrt.so" \
      $(command -v ccache >/dev/null 2>&1 && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache) \
      > build-fuzz.configure.log 2>&1 || { cat build-fuzz.configure.log; exit 1; }
    cmake --build build-fuzz -j "$(nproc)"
    # New inputs go to a scratch copy: the committed corpus holds seeds and regressions only.
    for corpus in fuzz/corpus/*/; do
      target="$(basename "$corpus")"
      [ -x "build-fuzz/fuzz_$target" ] || { echo "run.sh: build-fuzz/fuzz_$target was not built" >&2; exit 1; }
      work="build-fuzz/corpus/$target"
      mkdir -p "$work"
      echo "run.sh: fuzz_$target for ${seconds} s"
      # -malloc_limit_mb: one allocation above 1 GiB is a failure (an input-chosen size).
      if ! "./build-fuzz/fuzz_$target" -max_total_time="$seconds" -rss_limit_mb=2048 \
          -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="build-fuzz/$target-" \
          "$work" "$corpus" > "$work.log" 2>&1; then
        tail -n 60 "$work.log"
        echo "run.sh: fuzz_$target failed; its input is build-fuzz/$target-*, its log $work.log" >&2
        exit 1
      fi
      grep -E "^(Done|stat::number_of_executed_units)" "$work.log" || true
    done
    ;;
  perf)
    configure_and_build --target meshrt-perf-report meshrt-ops-report mpi_baseline
    "./$build_dir/bench/meshrt-perf-report" "${extra[@]}"
    echo
    "./$build_dir/bench/meshrt-ops-report" "${extra[@]}"
    ;;
  bench)
    configure_and_build
    export MESHRT_CPU_DEVICES="${MESHRT_CPU_DEVICES:-8}"
    "./$build_dir/bench/bench_collectives" "${extra[@]}"
    "./$build_dir/bench/bench_transfer" "${extra[@]}"
    ;;
  build)
    configure_and_build
    ;;
  docs)
    install_missing
    mkdir -p build/docs  # Doxygen makes only the last folder of OUTPUT_DIRECTORY
    doxygen docs/Doxyfile
    echo "run.sh: the API reference is build/docs/html/index.html"
    ;;
  gpu-bundle)
    configure_and_build
    ./bundle/pack.sh "$build_dir" "${extra[0]:-meshrt-gpu-bundle.tar.xz}"
    ;;
  packages)
    echo "${packages[@]}"
    ;;
  *)
    echo "usage: ./run.sh demo | test [--sanitize=thread|address [--ci-subset]] | fuzz [SECONDS] | perf [--quick] | bench | build | docs | gpu-bundle [OUT.tar.xz] | packages [command]" >&2
    exit 2
    ;;
esac
