/* MPI ping-pong between two ranks, every message's bytes checked (rank 1
 * adds one to each byte it sees and sends it back), then an allreduce:
 * Open MPI over UCX's verbs transports on burst (cargo xtask interop).
 * Prints one line per size: half round trip and bandwidth. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
	int rank, n;
	const int sizes[] = { 8, 4096, 65536, 1 << 20, 4 << 20 };

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		int len = sizes[s], iters = len > 65536 ? 20 : 1000;
		unsigned char *buf = malloc(len);
		double t0 = MPI_Wtime();

		for (int i = 0; i < iters; i++) {
			if (rank == 0) {
				for (int j = 0; j < len; j++)
					buf[j] = (unsigned char)(i + j);
				MPI_Send(buf, len, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
				MPI_Recv(buf, len, MPI_BYTE, 1, 0, MPI_COMM_WORLD,
					 MPI_STATUS_IGNORE);
				for (int j = 0; j < len; j++)
					if (buf[j] != (unsigned char)(i + j + 1)) {
						printf("BAD data: size %d iteration %d byte %d\n",
						       len, i, j);
						MPI_Abort(MPI_COMM_WORLD, 1);
					}
			} else {
				MPI_Recv(buf, len, MPI_BYTE, 0, 0, MPI_COMM_WORLD,
					 MPI_STATUS_IGNORE);
				for (int j = 0; j < len; j++)
					buf[j] = (unsigned char)(buf[j] + 1);
				MPI_Send(buf, len, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
			}
		}
		double t = MPI_Wtime() - t0;
		if (rank == 0)
			printf("size %d: %.2f us half round trip, %.1f MB/s\n", len,
			       t / iters / 2 * 1e6, 2.0 * len * iters / t / 1e6);
		free(buf);
	}
	double v = rank + 1, sum = 0;
	MPI_Allreduce(&v, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	if (rank == 0)
		printf("allreduce %s (%g)\n", sum == n * (n + 1) / 2.0 ? "ok" : "BAD", sum);
	MPI_Finalize();
	return 0;
}
