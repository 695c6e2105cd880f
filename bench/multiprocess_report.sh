#!/usr/bin/env bash
# psum across processes against one process and Open MPI's own MPI_Allreduce, measured in the same
# run (interleaved, REPS rounds; medians): 8 cpu devices as 1x8 (one process), 2x4 (mpirun -np 2),
# and a flat 8-rank MPI_Allreduce (bench/mpi_baseline.c).
#   bench/multiprocess_report.sh [BUILD_DIR] [REPS]
set -euo pipefail
build="${1:-build}"
reps="${2:-5}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MESHRT_PLATFORM=cpu
mpirun=(mpirun --oversubscribe --bind-to none --mca btl self,vader)
bench="$build/bench/meshrt-bench"
base="$build/bench/mpi_baseline"

# The time column (us) of meshrt-bench's row for `bytes`.
row_us() { awk -v b="$1" '$1 == b { print $6 }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

for bytes in 4 67108864; do
  if [ "$bytes" = 4 ]; then iters=2000 warm=200 base_iters=2000; else iters=5 warm=1 base_iters=5; fi
  : > /tmp/mp_report_1x8 ; : > /tmp/mp_report_2x4 ; : > /tmp/mp_report_mpi
  for ((r = 0; r < reps; ++r)); do
    MESHRT_CPU_DEVICES=8 "$bench" all_reduce -b "$bytes" -e "$bytes" -g 8 -n "$iters" -w "$warm" \
      2>/dev/null | row_us "$bytes" >> /tmp/mp_report_1x8
    "${mpirun[@]}" -np 2 -x MESHRT_CPU_DEVICES=4 "$bench" all_reduce -b "$bytes" -e "$bytes" \
      --procs -n "$iters" -w "$warm" 2>/dev/null | row_us "$bytes" >> /tmp/mp_report_2x4
    "${mpirun[@]}" -np 8 "$base" "$bytes" "$base_iters" 1 | awk '{ print $2 }' >> /tmp/mp_report_mpi
  done
  printf "psum %10s B/device: 1x8 %10s us   2x4 %10s us   flat MPI_Allreduce 8 ranks %10s us  (medians of %s)\n" \
    "$bytes" "$(median < /tmp/mp_report_1x8)" "$(median < /tmp/mp_report_2x4)" \
    "$(median < /tmp/mp_report_mpi)" "$reps"
done
