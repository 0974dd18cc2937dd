/* Two-rank MPI ping-pong that checks every byte: rank 0 sends a pattern, rank 1 checks it,
 * adds one to each byte and sends it back, rank 0 checks the reply. Built by ecosystem.sh
 * with each MPI's own mpicc; prints one line per size with the count of bad bytes. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  int rank, size;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // --init-only: MPI_Init and MPI_Finalize, nothing else (a BTL's start-up report is then
  // flushed by a normal finalize, not raced by an abort).
  if (argc > 1 && strcmp(argv[1], "--init-only") == 0) {
    MPI_Finalize();
    return 0;
  }
  if (size != 2) {
    if (rank == 0) fprintf(stderr, "mpi_pingpong needs exactly 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int sizes[] = {8, 4096, 65536, 1 << 20};
  for (unsigned s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    const int n = sizes[s], iters = n >= 65536 ? 20 : 100;
    unsigned char* buf = malloc(n);
    long bad = 0, all_bad = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
      if (rank == 0) {
        for (int k = 0; k < n; k++) buf[k] = (unsigned char)(k * 7 + i);
        MPI_Send(buf, n, MPI_BYTE, 1, i, MPI_COMM_WORLD);
        MPI_Recv(buf, n, MPI_BYTE, 1, i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (int k = 0; k < n; k++) bad += buf[k] != (unsigned char)(k * 7 + i + 1);
      } else {
        MPI_Recv(buf, n, MPI_BYTE, 0, i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (int k = 0; k < n; k++) {
          bad += buf[k] != (unsigned char)(k * 7 + i);
          buf[k]++;
        }
        MPI_Send(buf, n, MPI_BYTE, 0, i, MPI_COMM_WORLD);
      }
    }
    double us = (MPI_Wtime() - t0) * 1e6 / iters / 2;
    MPI_Reduce(&bad, &all_bad, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
      printf("pingpong %d bytes x %d: %.1f us one-way, %ld bad bytes\n", n, iters, us, all_bad);
    free(buf);
  }
  MPI_Finalize();
  return 0;
}
