/* Open MPI baseline for bench/perf_report: MPI_Allreduce (float32 sum) timed like osu_allreduce.
 * Usage: mpirun -np N ./mpi_baseline BYTES ITERS REPS; prints one line per rep: "us <max over
 * ranks>". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  long bytes = argc > 1 ? atol(argv[1]) : 4;
  int iters = argc > 2 ? atoi(argv[2]) : 100, reps = argc > 3 ? atoi(argv[3]) : 5;
  int count = (int)(bytes / 4);
  float* s = malloc((size_t)count * 4);
  float* r = malloc((size_t)count * 4);
  for (int i = 0; i < count; ++i) s[i] = (float)(rank + i % 7);
  for (int i = 0; i < 3; ++i) MPI_Allreduce(s, r, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  for (int k = 0; k < reps; ++k) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) MPI_Allreduce(s, r, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t = (MPI_Wtime() - t0) / iters, tmax = 0;
    MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("us %.3f\n", tmax * 1e6);
  }
  free(s);
  free(r);
  MPI_Finalize();
  return 0;
}
