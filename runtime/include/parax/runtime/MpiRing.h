// MpiRing.h - a reduce-scatter as a ring of MPI_Sendrecv over an MPI
// communicator: each chunk's partial sum goes round the group, one chunk a
// step, each rank adding its own, and ends summed at its owner. Open MPI
// 4.1's MPI_Reduce_scatter and MPI_Reduce_scatter_block are several times
// slower on these machines (docs/executable.md). Used by the MPI
// communicator and by parax-run's ZeRO gradient reduction.

#ifndef PARAX_RUNTIME_MPIRING_H
#define PARAX_RUNTIME_MPIRING_H

#include "parax/runtime/Status.h"

#include <mpi.h>

#include <cstddef>
#include <vector>

namespace parax::runtime {

/// Whether this node runs more MPI ranks than it has cores (they then share
/// cores by time slicing): set once by the MPI communicator's creation
/// (MPI_Comm_split_type over shared memory, against the online cores).
bool ranksShareCores();

/// Waits for `count` requests, testing them (each test moves them along).
/// A rank with a core of its own spins, as MPI's blocking calls do; ranks
/// that share cores yield the core between tests for the first 50 ms (a
/// transfer over shared memory moves only while both sides test, so a nap
/// in its middle stalls it: waiting for a core-mate's compute and then
/// napping, a TP4 prefill on 4 ranks over 2 cores ran 10-15 % slower with
/// the naps from 2 ms), then sleep between tests (10 us, doubling to
/// 200 us), so that a rank long late does not leave its waiters spinning.
Status mpiWaitAll(int count, MPI_Request *requests, const char *what);

/// MPI_Barrier over `comm` (a step's end, to time it). Where ranks share
/// cores, a rank that arrives sleeps between tests from the first (10 us,
/// doubling to 200 us): nothing of its own moves in a barrier, and a
/// rank that yields instead still takes its turns on the core from a
/// core-mate that has not finished its step (4 ranks over 2 cores, a DP4
/// prefill of 4 x 256 tokens, no collective in its step: 216-223 ms a
/// step with MPI_Barrier, 184-212 with this; 178 if the cores were shared
/// evenly, docs/executable.md). Elsewhere it spins, as MPI_Barrier does.
Status mpiBarrier(MPI_Comm comm, const char *what);

/// MPI_Sendrecv through mpiWaitAll.
Status mpiSendRecv(const float *send, int sendCount, int next, float *recv, int recvCount, int prev, int tag,
                   MPI_Comm comm);

/// `in`: the group's size P chunks of `n` values; `out`: chunk r (this
/// rank's place in `comm`) summed over the group. `send` and `received`
/// are scratch a caller may keep from one call to the next.
Status ringReduceScatter(const float *in, float *out, size_t n, MPI_Comm comm, std::vector<float> &send,
                         std::vector<float> &received);

} // namespace parax::runtime

#endif // PARAX_RUNTIME_MPIRING_H
