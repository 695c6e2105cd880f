#!/usr/bin/env bash
# bundle/pack.sh BUILD_DIR OUT.tar.xz: packs a cuda build (./run.sh gpu-bundle makes it) into one
# self-contained tarball for a GPU machine: the test binaries registered for cuda (the build's
# tests/cuda_suites.txt), the benchmarks, libmeshrt, its cuda plugin libmeshrt_cuda.so (and the mpi
# plugin when built) and the shared libraries they need that a CUDA
# machine lacks (OpenBLAS, oneTBB, Google Benchmark ...; never glibc, libstdc++, the CUDA runtime,
# cuBLAS or NCCL, which come from that machine), tests/data, the JAX comparison script and
# run-gpu.sh at its root. Binaries are stripped; the tarball must stay under 32 MiB.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$(cd "$here/.." && pwd)"
build="$(cd "${1:?usage: pack.sh BUILD_DIR OUT.tar.xz}" && pwd)"
out="${2:?usage: pack.sh BUILD_DIR OUT.tar.xz}"
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
limit=$((32 * 1024 * 1024))

manifest="$build/tests/cuda_suites.txt"
[ -f "$manifest" ] || { echo "pack.sh: $manifest missing: build with tests first" >&2; exit 1; }

stage_root="$(mktemp -d)"
trap 'rm -rf "$stage_root"' EXIT
stage="$stage_root/meshrt-gpu"
mkdir -p "$stage/bin" "$stage/lib" "$stage/bench"

# The programs: every cuda suite, and the GPU benchmarks.
bins=()
while IFS=$'\t' read -r name exe _; do
  [ -n "$name" ] && bins+=("$exe")
done < "$manifest"
bins+=("$build/bench/meshrt-bench" "$build/bench/meshrt-kernel-report"
       "$build/examples/meshrt-mlp-bench" "$build/examples/meshrt-demo")
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "pack.sh: $b is not built" >&2; exit 1; }
  cp "$b" "$stage/bin/"
done

# Shared libraries the programs load, except those a CUDA machine provides: the C library and
# its loader, the C++ runtime, the CUDA driver and runtime, cuBLAS and NCCL.
provided='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so'
declare -A seen=()
for b in "${bins[@]}"; do
  while read -r lib path; do
    [ -n "$path" ] || continue
    if [[ "$lib" =~ $provided ]] || [ -n "${seen[$lib]:-}" ]; then continue; fi
    seen[$lib]=1
    cp -L "$path" "$stage/lib/$lib"
  done < <(ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
done
[ -f "$stage/lib/libmeshrt.so.0" ] || ls "$stage/lib" | grep -q '^libmeshrt' ||
  { echo "pack.sh: libmeshrt was not among the libraries found" >&2; exit 1; }
# The platform plugins (loaded with dlopen, so ldd above does not list them), next to libmeshrt,
# and what they need that a CUDA machine lacks.
[ -f "$build/libmeshrt_cuda.so" ] || { echo "pack.sh: $build/libmeshrt_cuda.so is not built" >&2; exit 1; }
for plugin in "$build"/libmeshrt_cuda.so "$build"/libmeshrt_mpi.so; do
  [ -f "$plugin" ] || continue
  cp "$plugin" "$stage/lib/"
  while read -r lib path; do
    if [[ "$lib" =~ $provided ]] || [ -n "${seen[$lib]:-}" ] || [[ "$lib" == libmeshrt* ]]; then continue; fi
    seen[$lib]=1
    cp -L "$path" "$stage/lib/$lib"
  done < <(ldd "$plugin" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
done
strip --strip-unneeded "$stage"/bin/* "$stage"/lib/*

# The manifest with the binaries' names inside the bundle.
awk -F'\t' -v OFS='\t' 'NF == 6 { $2 = "bin/" $1; print }' "$manifest" > "$stage/cuda_suites.txt"
cp -r "$src/tests/data" "$stage/data"
cp "$src/bench/jax_gpu_step.py" "$src/bench/ncu_summary.py" "$stage/bench/"
cp "$here/run-gpu.sh" "$stage/run-gpu.sh"
chmod +x "$stage/run-gpu.sh"
{
  echo "meshrt $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$src" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%MZ) on $(uname -m), cuda architectures: $(grep -E '^CMAKE_CUDA_ARCHITECTURES:' "$build/CMakeCache.txt" | cut -d= -f2)"
} > "$stage/VERSION"

tar -C "$stage_root" -cJf "$out" meshrt-gpu
size=$(stat -c %s "$out")
echo "pack.sh: $out: $((size / 1024)) KiB, $(ls "$stage/bin" | wc -l) programs, $(ls "$stage/lib" | wc -l) libraries"
if [ "$size" -gt "$limit" ]; then
  echo "pack.sh: the bundle is over 32 MiB ($size bytes)" >&2
  exit 1
fi
