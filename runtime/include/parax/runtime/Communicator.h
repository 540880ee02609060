// Communicator.h - collectives over groups of grid ranks.
//
// A group is a set of grid axes (as a bit mask over the grid's axes, in
// grid order): the ranks that differ from this one only along those axes,
// ordered by their coordinates on them (major to minor). Executors see only
// this interface; MPI (and NCCL, later) live behind it.

#ifndef PARAX_RUNTIME_COMMUNICATOR_H
#define PARAX_RUNTIME_COMMUNICATOR_H

#include "parax/runtime/Status.h"

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace parax::runtime {

class Communicator {
public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Number of ranks in the group `axesMask`.
  virtual int groupSize(unsigned axesMask) const = 0;
  virtual Status allReduce(float *data, size_t n, unsigned axesMask) = 0;
  /// out holds groupSize * n values, block i from the group's rank i.
  virtual Status allGather(const float *in, size_t n, float *out, unsigned axesMask) = 0;
  /// allGather into an inner dimension's layout, with no pass after to lay
  /// it out: each rank's block is `rows` runs of `run` values, and run r of
  /// the group's rank i lands at out[(r * groupSize + i) * run].
  virtual Status allGatherRuns(const float *in, size_t rows, size_t run, float *out, unsigned axesMask) = 0;
  /// allGatherRuns onto the group's first rank alone (its coordinates on
  /// the group's axes 0): `out` is written there, not read or written on
  /// the others, which only send.
  virtual Status gatherRuns(const float *in, size_t rows, size_t run, float *out, unsigned axesMask) = 0;
  /// in holds groupSize blocks of n; out receives the sum of block `my index`.
  virtual Status reduceScatter(const float *in, float *out, size_t n, unsigned axesMask) = 0;
  /// in holds groupSize blocks of n (block i to rank i); out likewise from them.
  virtual Status allToAll(const float *in, float *out, size_t n, unsigned axesMask) = 0;
  /// Blocks of their own sizes: `in` holds sendCounts[i] values for rank i,
  /// block after block in group order; `out` gets recvCounts[j] values from
  /// rank j likewise (recvCounts[j] must be what rank j sends here).
  virtual Status allToAllv(const float *in, const std::vector<size_t> &sendCounts, float *out,
                           const std::vector<size_t> &recvCounts, unsigned axesMask) = 0;
  /// May return before the peer receives (MPI: the values are copied and
  /// sent in the background); sends to one peer arrive in order.
  virtual Status send(const float *data, size_t n, int peerRank) = 0;
  /// Moves sends in flight along (MPI has no progress thread: without a
  /// call into it a large message waits while the sender computes). The
  /// executor calls it between instructions.
  virtual Status progress() { return Status::ok(); }
  virtual Status recv(float *data, size_t n, int peerRank) = 0;
  /// Ends the whole job (every rank) after an error on this one.
  [[noreturn]] virtual void abort(const std::string &message) = 0;
};

/// This rank's group over the axes in `axesMask`, as a communicator split
/// wants it: `color` numbers the group (the coordinates off those axes),
/// `key` this rank's place in it (the coordinates on them), `members` its size.
struct GroupSplit {
  int64_t color = 0, key = 0, members = 1;
};
GroupSplit groupSplit(const std::vector<int64_t> &shape, int64_t rank, unsigned axesMask);

/// MPI's int counts and displacements (`sizes`, `offsets`) for blocks of
/// `counts` values packed one after another; false when they pass INT_MAX.
bool mpiBlocks(const std::vector<size_t> &counts, std::vector<int> &sizes, std::vector<int> &offsets);

/// The MPI communicator for a grid of `shape` (MPI must be initialised and
/// the world size equal to the grid size). An operation that has not
/// finished after `stallTimeoutSeconds` ends the job naming the rank and
/// the operation (StallWatchdog), instead of hanging.
StatusOr<std::unique_ptr<Communicator>>
createMpiCommunicator(const std::vector<int64_t> &shape, double stallTimeoutSeconds = 300);

/// Keeps the communicator abortMpiJob meets other failing ranks on (a
/// duplicate of the world): collective, every rank once after MPI_Init
/// (createMpiCommunicator calls it too; later calls do nothing).
void prepareMpiAbort();

/// Ends an MPI job after this rank has reported an error: first gives the
/// other ranks that meet the same error (a collective's check every rank
/// makes) up to `graceSeconds` to report theirs -- a non-blocking barrier
/// on prepareMpiAbort's communicator, which only failing ranks enter --
/// and, when they all did, a moment for the launcher to forward what they
/// printed; then MPI_Abort. Without that communicator, MPI_Abort at once.
[[noreturn]] void abortMpiJob(double graceSeconds = 5);

/// In-process communicators for a grid of `shape`, one per rank, to be used
/// from one thread each (unit tests): the same group semantics as MPI's.
std::vector<std::unique_ptr<Communicator>>
createThreadCommunicators(const std::vector<int64_t> &shape);
/// Ends every wait of `any`'s world (one of createThreadCommunicators'), now
/// and later, in an error: what a stall watchdog does to a job, for ranks
/// that are threads of one process.
void cancelThreadCommunicators(Communicator &any);

} // namespace parax::runtime

#endif // PARAX_RUNTIME_COMMUNICATOR_H
