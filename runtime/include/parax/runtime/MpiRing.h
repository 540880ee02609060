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

/// `in`: the group's size P chunks of `n` values; `out`: chunk r (this
/// rank's place in `comm`) summed over the group. `send` and `received`
/// are scratch a caller may keep from one call to the next.
Status ringReduceScatter(const float *in, float *out, size_t n, MPI_Comm comm, std::vector<float> &send,
                         std::vector<float> &received);

} // namespace parax::runtime

#endif // PARAX_RUNTIME_MPIRING_H
