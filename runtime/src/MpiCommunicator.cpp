// MpiCommunicator.cpp - collectives over MPI sub-communicators, one per set
// of grid axes, all created up front (MPI_Comm_split is collective over the
// world, so every rank creates them in the same order before running).

#define OMPI_SKIP_MPICXX 1
#include "parax/runtime/Communicator.h"
#include "parax/runtime/MpiRing.h"
#include "parax/runtime/StallWatchdog.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <list>
#include <memory>
#include <thread>

#include <unistd.h>

namespace parax::runtime {

namespace {

// The rings' messages (MPI_Sendrecv on a group's own communicator).
constexpr int kRingTag = 1;

// ranksShareCores(): set by the communicator's creation.
std::atomic<bool> shareCores{false};

// abortMpiJob's meeting place: a duplicate of the world that only ranks
// ending in an error use (set by the communicator's creation).
MPI_Comm abortComm = MPI_COMM_NULL;

Status check(int rc, const char *what) {
  if (rc == MPI_SUCCESS)
    return Status::ok();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return Status::error(std::string(what) + " failed: " + std::string(text, len));
}

// A non-blocking call's return code, then its request waited for.
Status finish(int rc, MPI_Request &request, const char *what) {
  if (Status s = check(rc, what); !s.isOk())
    return s;
  return mpiWaitAll(1, &request, what);
}

class MpiCommunicator : public Communicator {
public:
  MpiCommunicator(std::vector<int64_t> shape, double stallTimeout)
      : shape_(std::move(shape)), stallTimeout_(stallTimeout) {}
  ~MpiCommunicator() override {
    // Sends still in flight finish before the communicators go (their
    // receivers take them; a stalled one ends the job, watched).
    if (!pending_.empty()) {
      auto watched = watchdog_->watch("finishing sends (MPI_Wait)");
      for (Pending &p : pending_)
        MPI_Wait(&p.request, MPI_STATUS_IGNORE);
    }
    for (MPI_Comm &c : comms_)
      if (c != MPI_COMM_NULL)
        MPI_Comm_free(&c);
  }

  Status init() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    watchdog_ = std::make_unique<StallWatchdog>(rank_, stallTimeout_);
    unsigned axes = shape_.size();
    comms_.assign(1u << axes, MPI_COMM_NULL);
    sizes_.assign(1u << axes, 1);
    for (unsigned mask = 1; mask < (1u << axes); ++mask) {
      GroupSplit g = groupSplit(shape_, rank_, mask);
      Status s = check(MPI_Comm_split(MPI_COMM_WORLD, static_cast<int>(g.color),
                                      static_cast<int>(g.key), &comms_[mask]),
                       "MPI_Comm_split");
      if (!s.isOk())
        return s;
      sizes_[mask] = static_cast<int>(g.members);
    }
    // Ranks on this node against its cores (collective, like the splits).
    MPI_Comm node = MPI_COMM_NULL;
    if (Status s = check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
                         "MPI_Comm_split_type");
        !s.isOk())
      return s;
    int local = 1;
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    shareCores.store(local > sysconf(_SC_NPROCESSORS_ONLN), std::memory_order_relaxed);
    prepareMpiAbort();
    return Status::ok();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int groupSize(unsigned mask) const override {
    return mask < sizes_.size() ? sizes_[mask] : 0;
  }

  Status allReduce(float *data, size_t n, unsigned mask) override {
    int P = groupSize(mask);
    if (P == 1)
      return Status::ok();
    auto watched = watchdog_->watch("all_reduce");
    // Small messages (latency-bound) through MPI; large ones as a ring
    // reduce-scatter then a ring all-gather of n / P values a step (each
    // chunk summed once, on one rank, so every rank ends with the same
    // values): Open MPI 4.1's MPI_Allreduce moves less than half the
    // all-gather's bandwidth here.
    if (n * sizeof(float) < kRingBytes) {
      MPI_Request request;
      return finish(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comms_[mask], &request),
                    request, "MPI_Iallreduce");
    }
    int r = 0;
    MPI_Comm_rank(comms_[mask], &r);
    int next = (r + 1) % P, prev = (r + P - 1) % P;
    auto index = [P](int c) { return static_cast<size_t>(((c % P) + P) % P); };
    auto begin = [&](int c) { return index(c) * n / P; };
    auto size = [&](int c) { return (index(c) + 1) * n / P - begin(c); };
    if (n / P + 1 > static_cast<size_t>(std::numeric_limits<int>::max()))
      return Status::error("all_reduce: more than 2^31 - 1 values a rank's chunk (MPI's int counts)");
    ringReceived_.resize(n / P + 1);
    for (int s = 0; s < P - 1; ++s) { // reduce-scatter: chunk r - 2 - s gains this rank's part
      int out = r - 1 - s, in = r - 2 - s;
      Status st = mpiSendRecv(data + begin(out), static_cast<int>(size(out)), next, ringReceived_.data(),
                              static_cast<int>(size(in)), prev, kRingTag, comms_[mask]);
      if (!st.isOk()) return st;
      float *sum = data + begin(in);
      for (size_t i = 0; i < size(in); ++i) sum[i] += ringReceived_[i];
    }
    for (int s = 0; s < P - 1; ++s) { // all-gather: chunk r - s, whole, passed on
      int out = r - s, in = r - 1 - s;
      Status st = mpiSendRecv(data + begin(out), static_cast<int>(size(out)), next, data + begin(in),
                              static_cast<int>(size(in)), prev, kRingTag, comms_[mask]);
      if (!st.isOk()) return st;
    }
    return Status::ok();
  }
  Status allGather(const float *in, size_t n, float *out, unsigned mask) override {
    auto watched = watchdog_->watch("all_gather");
    MPI_Request request;
    return finish(
        MPI_Iallgather(in, static_cast<int>(n), MPI_FLOAT, out, static_cast<int>(n), MPI_FLOAT, comms_[mask], &request),
        request, "MPI_Iallgather");
  }
  Status allGatherRuns(const float *in, size_t rows, size_t run, float *out, unsigned mask) override {
    if (rows == 1) return allGather(in, run, out, mask); // (one run a rank: the blocks lie as gathered)
    return gatherRunsTo(in, rows, run, out, mask, /*everyRank=*/true);
  }
  Status gatherRuns(const float *in, size_t rows, size_t run, float *out, unsigned mask) override {
    return gatherRunsTo(in, rows, run, out, mask, /*everyRank=*/false);
  }
  // allGatherRuns, or its gather onto the group's first rank (key 0).
  Status gatherRunsTo(const float *in, size_t rows, size_t run, float *out, unsigned mask, bool everyRank) {
    const char *what = everyRank ? "all_gather" : "all_gather (onto the group's first rank)";
    auto watched = watchdog_->watch(what);
    int members = 0;
    MPI_Comm_size(comms_[mask], &members);
    if (rows * run > size_t(std::numeric_limits<int>::max()) || run * members > size_t(std::numeric_limits<int>::max()))
      return Status::error(std::string(what) + " of " + std::to_string(rows) + " runs of " + std::to_string(run) +
                           " values: more than MPI's int counts hold");
    // The runs of one rank's block as they lie in `out`: a vector type
    // whose extent is one run, so that block i starts i runs in.
    MPI_Datatype runs, spaced;
    MPI_Type_vector(static_cast<int>(rows), static_cast<int>(run), static_cast<int>(run * members), MPI_FLOAT, &runs);
    MPI_Type_create_resized(runs, 0, static_cast<MPI_Aint>(run * sizeof(float)), &spaced);
    MPI_Type_commit(&spaced);
    MPI_Request request;
    const int count = static_cast<int>(rows * run);
    Status s = everyRank
                   ? finish(MPI_Iallgather(in, count, MPI_FLOAT, out, 1, spaced, comms_[mask], &request), request,
                            "MPI_Iallgather")
                   : finish(MPI_Igather(in, count, MPI_FLOAT, out, 1, spaced, 0, comms_[mask], &request), request,
                            "MPI_Igather");
    MPI_Type_free(&spaced);
    MPI_Type_free(&runs);
    return s;
  }
  Status reduceScatter(const float *in, float *out, size_t n, unsigned mask) override {
    // (a ring: Open MPI 4.1's MPI_Reduce_scatter took 1.45 ms for 2 MB
    // over 2 ranks where an all-gather of as much took 0.25, and
    // MPI_Reduce_scatter_block 10-25x more again; the ring took 0.3)
    auto watched = watchdog_->watch("reduce_scatter");
    return ringReduceScatter(in, out, n, comms_[mask], ringSend_, ringReceived_);
  }
  Status allToAll(const float *in, float *out, size_t n, unsigned mask) override {
    auto watched = watchdog_->watch("all_to_all");
    MPI_Request request;
    return finish(
        MPI_Ialltoall(in, static_cast<int>(n), MPI_FLOAT, out, static_cast<int>(n), MPI_FLOAT, comms_[mask], &request),
        request, "MPI_Ialltoall");
  }
  Status allToAllv(const float *in, const std::vector<size_t> &sendCounts, float *out,
                   const std::vector<size_t> &recvCounts, unsigned mask) override {
    // MPI counts and displacements are ints.
    std::vector<int> sc, sd, rc, rd;
    if (!mpiBlocks(sendCounts, sc, sd) || !mpiBlocks(recvCounts, rc, rd))
      return Status::error("all_to_all: more than 2^31 - 1 values a rank (MPI_Alltoallv's int counts)");
    auto watched = watchdog_->watch("all_to_all");
    MPI_Request request;
    return finish(MPI_Ialltoallv(in, sc.data(), sd.data(), MPI_FLOAT, out, rc.data(), rd.data(), MPI_FLOAT,
                                 comms_[mask], &request),
                  request, "MPI_Ialltoallv");
  }
  // A send does not wait for its receive: the values are copied and sent
  // with MPI_Isend, moved along by progress() (the executor calls it
  // between instructions) and finished at the end.
  // So a pipeline stage may send one microbatch's activations and go on to
  // another's backward pass while the next stage is busy (1F1B); sends and
  // receives between two stages still pair up in order.
  Status progress() override {
    for (auto it = pending_.begin(); it != pending_.end();) {
      int done = 0;
      Status s = check(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (!s.isOk())
        return s;
      it = done ? pending_.erase(it) : std::next(it);
    }
    return Status::ok();
  }
  Status send(const float *data, size_t n, int peer) override {
    if (Status s = progress(); !s.isOk())
      return s;
    pending_.emplace_back();
    Pending &p = pending_.back();
    p.values.assign(data, data + n);
    return check(MPI_Isend(p.values.data(), static_cast<int>(n), MPI_FLOAT, peer, 0, MPI_COMM_WORLD, &p.request),
                 "MPI_Isend");
  }
  Status recv(float *data, size_t n, int peer) override {
    auto watched = watchdog_->watch("recv");
    MPI_Request request;
    return finish(MPI_Irecv(data, static_cast<int>(n), MPI_FLOAT, peer, 0, MPI_COMM_WORLD, &request), request,
                  "MPI_Irecv");
  }
  [[noreturn]] void abort(const std::string &message) override {
    std::fprintf(stderr, "parax-run: rank %d: %s\n", rank_, message.c_str());
    std::fflush(stderr);
    abortMpiJob();
  }

private:
  std::vector<int64_t> shape_;
  double stallTimeout_;
  std::unique_ptr<StallWatchdog> watchdog_; // see createMpiCommunicator
  int rank_ = 0, size_ = 1;
  std::vector<MPI_Comm> comms_;
  std::vector<int> sizes_;
  struct Pending {
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<float> values;
  };
  std::list<Pending> pending_; // sends in flight (a list: their buffers stay put)
  // The reduce-scatter ring's partial sum sent on and the one received
  // (kept: one allocation a size, not one a call).
  static constexpr size_t kRingBytes = 64 << 10;
  std::vector<float> ringSend_, ringReceived_;
};

} // namespace

bool ranksShareCores() { return shareCores.load(std::memory_order_relaxed); }

namespace {

// mpiWaitAll's and mpiBarrier's wait: ranks that share cores yield for
// `yieldFor`, then sleep between tests.
Status waitFor(int count, MPI_Request *requests, const char *what, std::chrono::milliseconds yieldFor) {
  using Clock = std::chrono::steady_clock;
  const bool sleepy = ranksShareCores();
  const Clock::time_point start = sleepy ? Clock::now() : Clock::time_point();
  auto nap = std::chrono::microseconds(10);
  for (;;) {
    int done = 0;
    if (Status s = check(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE), what); !s.isOk())
      return s;
    if (done)
      return Status::ok();
    if (sleepy) {
      if (Clock::now() - start < yieldFor) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds(200));
      }
    }
  }
}

} // namespace

Status mpiWaitAll(int count, MPI_Request *requests, const char *what) {
  // Longer than the waits inside a step (a core-mate's compute between two
  // collectives: a few ms to tens of ms), shorter than a late rank's.
  return waitFor(count, requests, what, std::chrono::milliseconds(50));
}

Status mpiBarrier(MPI_Comm comm, const char *what) {
  MPI_Request request;
  if (Status s = check(MPI_Ibarrier(comm, &request), what); !s.isOk())
    return s;
  return waitFor(1, &request, what, std::chrono::milliseconds(0));
}

Status mpiSendRecv(const float *send, int sendCount, int next, float *recv, int recvCount, int prev, int tag,
                   MPI_Comm comm) {
  MPI_Request requests[2];
  if (Status s = check(MPI_Irecv(recv, recvCount, MPI_FLOAT, prev, tag, comm, &requests[0]), "MPI_Irecv");
      !s.isOk())
    return s;
  if (Status s = check(MPI_Isend(send, sendCount, MPI_FLOAT, next, tag, comm, &requests[1]), "MPI_Isend");
      !s.isOk()) {
    MPI_Cancel(&requests[0]);
    MPI_Request_free(&requests[0]);
    return s;
  }
  return mpiWaitAll(2, requests, "MPI_Sendrecv");
}

Status ringReduceScatter(const float *in, float *out, size_t n, MPI_Comm comm, std::vector<float> &send,
                         std::vector<float> &received) {
  int P = 1, r = 0;
  MPI_Comm_size(comm, &P);
  MPI_Comm_rank(comm, &r);
  if (P == 1) {
    std::copy(in, in + n, out);
    return Status::ok();
  }
  if (n > static_cast<size_t>(std::numeric_limits<int>::max()))
    return Status::error("reduce_scatter: more than 2^31 - 1 values a rank (MPI's int counts)");
  // Chunk c's partial sum starts at rank c + 1 and goes round, each rank
  // adding its own, to end summed at rank c after P - 1 steps.
  int next = (r + 1) % P, prev = (r + P - 1) % P;
  auto chunk = [&](int c) { return in + static_cast<size_t>(((c % P) + P) % P) * n; };
  send.assign(chunk(r - 1), chunk(r - 1) + n);
  received.resize(n);
  for (int s = 0; s < P - 1; ++s) {
    Status st = mpiSendRecv(send.data(), static_cast<int>(n), next, received.data(), static_cast<int>(n), prev,
                            kRingTag, comm);
    if (!st.isOk()) return st;
    const float *own = chunk(r - 2 - s); // (the chunk received: its partial sum, plus this rank's)
    float *sum = s == P - 2 ? out : send.data();
    for (size_t i = 0; i < n; ++i) sum[i] = received[i] + own[i];
  }
  return Status::ok();
}

GroupSplit groupSplit(const std::vector<int64_t> &shape, int64_t rank, unsigned axesMask) {
  std::vector<int64_t> coords(shape.size());
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    coords[i] = rank % shape[i];
    rank /= shape[i];
  }
  GroupSplit g;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (axesMask & (1u << i)) {
      g.key = g.key * shape[i] + coords[i];
      g.members *= shape[i];
    } else {
      g.color = g.color * shape[i] + coords[i];
    }
  }
  return g;
}

bool mpiBlocks(const std::vector<size_t> &counts, std::vector<int> &sizes, std::vector<int> &offsets) {
  size_t at = 0;
  for (size_t n : counts) {
    if (at + n > static_cast<size_t>(std::numeric_limits<int>::max())) return false;
    sizes.push_back(static_cast<int>(n));
    offsets.push_back(static_cast<int>(at));
    at += n;
  }
  return true;
}

void prepareMpiAbort() {
  if (abortComm == MPI_COMM_NULL && MPI_Comm_dup(MPI_COMM_WORLD, &abortComm) != MPI_SUCCESS)
    abortComm = MPI_COMM_NULL;
}

void abortMpiJob(double graceSeconds) {
  if (abortComm != MPI_COMM_NULL) {
    MPI_Request request;
    if (MPI_Ibarrier(abortComm, &request) == MPI_SUCCESS) {
      auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(graceSeconds);
      int met = 0;
      while (!met && std::chrono::steady_clock::now() < until) {
        if (MPI_Test(&request, &met, MPI_STATUS_IGNORE) != MPI_SUCCESS)
          break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      // (every rank reported: mpirun forwards their lines before the abort
      // ends them; without the pause a rank's can be lost with it)
      if (met)
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  }
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

StatusOr<std::unique_ptr<Communicator>>
createMpiCommunicator(const std::vector<int64_t> &shape, double stallTimeoutSeconds) {
  auto comm = std::make_unique<MpiCommunicator>(shape, stallTimeoutSeconds);
  Status s = comm->init();
  if (!s.isOk())
    return s;
  return std::unique_ptr<Communicator>(std::move(comm));
}

} // namespace parax::runtime
