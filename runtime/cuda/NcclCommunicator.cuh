// NcclCommunicator.cuh - the CUDA backend's collectives: NCCL communicators
// per set of grid axes (unique id over MPI, ncclCommSplit), issued on their
// own stream, watched by a watchdog at host synchronisations; or, when
// ranks share a GPU, staged through host memory and MPI.
// Included by CudaExecutor.cu only (one translation unit).

#ifndef PARAX_RUNTIME_CUDA_NCCLCOMMUNICATOR_CUH
#define PARAX_RUNTIME_CUDA_NCCLCOMMUNICATOR_CUH

#include "CudaCommon.cuh"
#include "parax/runtime/Communicator.h"
#include "parax/runtime/CudaExecutor.h"
#include "parax/runtime/StallWatchdog.h"

#include <cuda_bf16.h>
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace parax::runtime {

//===----------------------------------------------------------------------===//
// NCCL
//===----------------------------------------------------------------------===//

class NcclCommunicator {
public:
  std::vector<int64_t> shape;
  int rank = 0, size = 1;
  double timeout = 300;
  // Host-staged: several ranks share one GPU (NCCL refuses a communicator
  // with two ranks on one device), so collectives copy to the host and go
  // through MPI. Slower, same results; it lets a one-GPU machine run every
  // sharded program.
  bool staged = false;
  std::string note; // how the ranks' collectives run where they share GPUs (parax-run prints it)
  ncclComm_t world = nullptr;
  std::vector<ncclComm_t> comms; // per axis mask (NCCL)
  std::vector<MPI_Comm> mpiComms; // per axis mask (host-staged)
  std::unique_ptr<StallWatchdog> stalls; // host-staged: MPI calls that never return end the job
  std::vector<int> sizes;
  // NCCL work runs on its own stream, ordered after the compute stream's
  // work so far by `ready`. Each collective records its own event, which
  // `takeIssued` hands to the executor: the compute stream waits for it
  // when it needs the result (so independent work may run meanwhile). The
  // host does not wait: `drain` (at every host synchronisation) watches
  // the collectives in flight, oldest first.
  cudaStream_t commStream = nullptr;
  cudaEvent_t ready = nullptr;
  struct InFlight {
    cudaEvent_t done;
    const char *op;
    int stage, instruction; // the instruction that issued it
    bool spare = true;      // back to spareEvents once done (a graph's stay with it)
    std::string describe() const {
      return std::string(op) + " (stage " + std::to_string(stage) +
             (instruction >= 0 ? " instruction " + std::to_string(instruction) : std::string(", the optimizer")) +
             ")";
    }
  };
  std::deque<InFlight> inFlight;
  std::vector<cudaEvent_t> spareEvents;
  int issuerStage = 0, issuerInstruction = 0; // the instruction now running (for reports)
  cudaEvent_t issued = nullptr; // see takeIssued
  bool capturing = false;
  std::vector<cudaEvent_t> capturedEvents; // graph nodes that order the compute stream after a collective
  // One event per collective of the captured graph, recorded as an external
  // node: each replay records it for real, so the watchdog can name the
  // collective that stalls inside a graph.
  std::vector<InFlight> graphEvents;
  std::vector<cudaEvent_t> watchPool; // made before the capture, one per collective

  /// Grows `pool` to `n` events.
  static Status fill(std::vector<cudaEvent_t> &pool, size_t n) {
    while (pool.size() < n) {
      cudaEvent_t e = nullptr;
      PARAX_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      pool.push_back(e);
    }
    return Status::ok();
  }
  /// Records a spare (or new) event on `stream`.
  Status recordEvent(cudaStream_t stream, cudaEvent_t &event) {
    Status st = fill(spareEvents, 1);
    if (!st.isOk()) return st;
    event = spareEvents.back();
    spareEvents.pop_back();
    PARAX_CUDA(cudaEventRecord(event, stream));
    return Status::ok();
  }

  Status onCommStream(cudaStream_t compute, const char *op,
                      const std::function<ncclResult_t(cudaStream_t)> &issue) {
    PARAX_CUDA(cudaEventRecord(ready, compute));
    PARAX_CUDA(cudaStreamWaitEvent(commStream, ready, 0));
    ncclResult_t e = issue(commStream);
    if (e != ncclSuccess)
      return Status::error(std::string(op) + ": " + ncclGetErrorString(e));
    cudaEvent_t done = nullptr;
    Status st = recordEvent(commStream, done);
    if (!st.isOk()) return st;
    // In a capture `done` is a node of the graph, not a record the watchdog
    // could wait for: a second event, recorded as an external node, is.
    if (capturing) {
      capturedEvents.push_back(done);
      if (watchPool.empty()) return Status::error(std::string(op) + ": more collectives than the capture expected");
      cudaEvent_t watched = watchPool.back();
      watchPool.pop_back();
      graphEvents.push_back({watched, op, issuerStage, issuerInstruction, false});
      PARAX_CUDA(cudaEventRecordWithFlags(watched, commStream, cudaEventRecordExternal));
    } else {
      inFlight.push_back({done, op, issuerStage, issuerInstruction});
    }
    issued = done;
    return Status::ok();
  }

  /// Around a stream capture of the executor's step (its collectives become
  /// nodes of the graph); `kept`: the graph will be replayed (else its
  /// events go).
  /// `collectives`: how many the step issues (their events are made now:
  /// nothing but stream work happens inside the capture). Call before the
  /// capture begins.
  Status beginCapture(int collectives) {
    dropGraphEvents();
    Status st = fill(watchPool, collectives);
    if (st.isOk()) st = fill(spareEvents, collectives);
    capturing = st.isOk();
    return st;
  }
  void endCapture(bool kept) {
    capturing = false;
    spareEvents.insert(spareEvents.end(), capturedEvents.begin(), capturedEvents.end());
    capturedEvents.clear();
    if (!kept) dropGraphEvents();
  }
  /// After the captured graph was launched: the watchdog watches each of
  /// its collectives, in order.
  void watchGraph() { inFlight.insert(inFlight.end(), graphEvents.begin(), graphEvents.end()); }

  /// The event that completes the collective just issued, or null when it
  /// has completed already (host-staged, or nothing to do). Valid until the
  /// next `drain`.
  cudaEvent_t takeIssued() {
    cudaEvent_t done = issued;
    issued = nullptr;
    return done;
  }

  /// Waits until every collective issued so far has finished, polling NCCL
  /// for asynchronous errors; on an error, or when one collective has not
  /// finished after `timeout` seconds, aborts every communicator and names
  /// that collective and the instruction that issued it (parax-run adds the
  /// rank).
  Status drain() {
    while (!inFlight.empty()) {
      InFlight &front = inFlight.front();
      auto start = std::chrono::steady_clock::now();
      while (true) {
        // Queried first, errors checked after: a collective that failed and
        // still let its stream go on is reported, not taken as finished.
        cudaError_t q = cudaEventQuery(front.done);
        for (size_t i = 0; i <= comms.size(); ++i) {
          ncclComm_t c = i < comms.size() ? comms[i] : world; // world: send/recv
          if (!c)
            continue;
          ncclResult_t async = ncclSuccess;
          ncclCommGetAsyncError(c, &async);
          if (async != ncclSuccess && async != ncclInProgress) {
            abortAll();
            return Status::error(front.describe() + ": NCCL error " +
                                 ncclGetErrorString(async));
          }
        }
        if (q == cudaSuccess)
          break;
        if (q != cudaErrorNotReady)
          return Status::error(front.describe() + ": " + cudaGetErrorString(q));
        double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (elapsed > timeout) {
          abortAll();
          return Status::error(front.describe() + " timed out after " +
                               std::to_string(static_cast<int>(timeout)) + " s");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      if (front.spare) spareEvents.push_back(front.done);
      inFlight.pop_front();
    }
    return Status::ok();
  }

  // Every operation takes device buffers of `n` elements of `e`. The
  // host-staged path moves them as floats (bf16 widened exactly; integers
  // as their bits, never reduced).
  Status allReduce(void *buf, size_t n, Elem e, unsigned mask, cudaStream_t stream) {
    if (!staged) {
      return onCommStream(stream, "all_reduce", [&](cudaStream_t c) {
        return ncclAllReduce(buf, buf, n, ncclTypeOf(e), ncclSum, comms[mask], c);
      });
    }
    auto watched = stalls->watch("all_reduce");
    std::vector<float> h;
    Status st = toHost(h, buf, n, e, stream);
    if (!st.isOk()) return st;
    MPI_Allreduce(MPI_IN_PLACE, h.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, mpiComms[mask]);
    return toDevice(buf, h, e, stream);
  }
  /// `out` holds sizes[mask] pieces of `n`, in group order.
  Status allGather(const void *in, void *out, size_t n, Elem e, unsigned mask, cudaStream_t stream) {
    if (!staged) {
      return onCommStream(stream, "all_gather", [&](cudaStream_t c) {
        return ncclAllGather(in, out, n, ncclTypeOf(e), comms[mask], c);
      });
    }
    auto watched = stalls->watch("all_gather");
    std::vector<float> a, b(n * sizes[mask]);
    Status st = toHost(a, in, n, e, stream);
    if (!st.isOk()) return st;
    MPI_Allgather(a.data(), static_cast<int>(n), MPI_FLOAT, b.data(), static_cast<int>(n), MPI_FLOAT,
                  mpiComms[mask]);
    return toDevice(out, b, e, stream);
  }
  /// `in` holds sizes[mask] pieces of `n`; `out` gets the sum of this rank's.
  Status reduceScatter(const void *in, void *out, size_t n, Elem e, unsigned mask, cudaStream_t stream) {
    if (!staged) {
      return onCommStream(stream, "reduce_scatter", [&](cudaStream_t c) {
        return ncclReduceScatter(in, out, n, ncclTypeOf(e), ncclSum, comms[mask], c);
      });
    }
    auto watched = stalls->watch("reduce_scatter");
    std::vector<float> a, b(n);
    Status st = toHost(a, in, n * sizes[mask], e, stream);
    if (!st.isOk()) return st;
    std::vector<int> counts(sizes[mask], static_cast<int>(n));
    MPI_Reduce_scatter(a.data(), b.data(), counts.data(), MPI_FLOAT, MPI_SUM, mpiComms[mask]);
    return toDevice(out, b, e, stream);
  }
  /// Piece p of `in` (n elements each) goes to group member p.
  Status allToAll(const void *in, void *out, size_t n, Elem e, unsigned mask, cudaStream_t stream) {
    if (!staged) {
      // Grouped send/recv: ncclAlltoAll would raise the NCCL floor from
      // 2.18 (ncclCommSplit) to 2.28.
      size_t piece = n * elemBytes(e);
      return onCommStream(stream, "all_to_all", [&](cudaStream_t c) {
        ncclResult_t r = ncclGroupStart();
        for (int p = 0; r == ncclSuccess && p < sizes[mask]; ++p) {
          r = ncclSend(static_cast<const char *>(in) + p * piece, n, ncclTypeOf(e), p, comms[mask], c);
          if (r == ncclSuccess)
            r = ncclRecv(static_cast<char *>(out) + p * piece, n, ncclTypeOf(e), p, comms[mask], c);
        }
        ncclResult_t end = ncclGroupEnd();
        return r != ncclSuccess ? r : end;
      });
    }
    auto watched = stalls->watch("all_to_all");
    std::vector<float> a, b(n * sizes[mask]);
    Status st = toHost(a, in, b.size(), e, stream);
    if (!st.isOk()) return st;
    MPI_Alltoall(a.data(), static_cast<int>(n), MPI_FLOAT, b.data(), static_cast<int>(n), MPI_FLOAT,
                 mpiComms[mask]);
    return toDevice(out, b, e, stream);
  }
  /// Blocks of their own sizes: `in` holds sendCounts[p] elements for
  /// member p, block after block; `out` gets recvCounts[p] from member p
  /// likewise (what member p sends here). Empty blocks are not sent.
  Status allToAllv(const void *in, const std::vector<size_t> &sendCounts, void *out,
                   const std::vector<size_t> &recvCounts, Elem e, unsigned mask, cudaStream_t stream) {
    size_t sent = 0, received = 0;
    for (size_t n : sendCounts) sent += n;
    for (size_t n : recvCounts) received += n;
    if (!staged) {
      return onCommStream(stream, "all_to_all", [&](cudaStream_t c) {
        ncclResult_t r = ncclGroupStart();
        size_t from = 0, to = 0;
        for (int p = 0; r == ncclSuccess && p < sizes[mask]; ++p) {
          if (sendCounts[p])
            r = ncclSend(static_cast<const char *>(in) + from * elemBytes(e), sendCounts[p], ncclTypeOf(e), p,
                         comms[mask], c);
          if (r == ncclSuccess && recvCounts[p])
            r = ncclRecv(static_cast<char *>(out) + to * elemBytes(e), recvCounts[p], ncclTypeOf(e), p,
                         comms[mask], c);
          from += sendCounts[p];
          to += recvCounts[p];
        }
        ncclResult_t end = ncclGroupEnd();
        return r != ncclSuccess ? r : end;
      });
    }
    std::vector<int> sc, sd, rc, rd;
    if (!mpiBlocks(sendCounts, sc, sd) || !mpiBlocks(recvCounts, rc, rd))
      return Status::error("all_to_all: more than 2^31 - 1 values a rank (MPI_Alltoallv's int counts)");
    auto watched = stalls->watch("all_to_all");
    std::vector<float> a, b(received);
    Status st = toHost(a, in, sent, e, stream);
    if (!st.isOk()) return st;
    MPI_Alltoallv(a.data(), sc.data(), sd.data(), MPI_FLOAT, b.data(), rc.data(), rd.data(), MPI_FLOAT,
                  mpiComms[mask]);
    return toDevice(out, b, e, stream);
  }
  /// One send or receive of `n` elements of `e` with world rank `peer`.
  struct PointToPoint {
    void *buf;
    size_t n;
    Elem e;
    int peer;
    bool send;
  };
  /// Sends and receives that progress together (one NCCL group, or
  /// nonblocking MPI calls waited for together), completing as a whole. A
  /// send may wait for its peer's receive (NCCL's rendezvous; MPI's large
  /// messages): two pipeline stages that each send before they receive
  /// would wait for each other, unless the sends go in one group with the
  /// receives (as Megatron-LM's send_forward_recv_backward does).
  Status exchange(const std::vector<PointToPoint> &ops, cudaStream_t stream) {
    const char *op = ops.size() > 1 ? "send/recv" : ops[0].send ? "send" : "recv";
    if (!staged) {
      return onCommStream(stream, op, [&](cudaStream_t c) {
        ncclResult_t r = ncclGroupStart();
        for (const PointToPoint &p : ops) {
          if (r != ncclSuccess) break;
          r = p.send ? ncclSend(p.buf, p.n, ncclTypeOf(p.e), p.peer, world, c)
                     : ncclRecv(p.buf, p.n, ncclTypeOf(p.e), p.peer, world, c);
        }
        ncclResult_t end = ncclGroupEnd();
        return r != ncclSuccess ? r : end;
      });
    }
    auto watched = stalls->watch(op);
    std::vector<std::vector<float>> host(ops.size());
    std::vector<MPI_Request> requests(ops.size(), MPI_REQUEST_NULL);
    for (size_t k = 0; k < ops.size(); ++k) {
      const PointToPoint &p = ops[k];
      Status st = p.send ? toHost(host[k], p.buf, p.n, p.e, stream) : Status::ok();
      if (!st.isOk()) return st;
      host[k].resize(p.n);
      int count = static_cast<int>(p.n);
      if (p.send)
        MPI_Isend(host[k].data(), count, MPI_FLOAT, p.peer, 0, MPI_COMM_WORLD, &requests[k]);
      else
        MPI_Irecv(host[k].data(), count, MPI_FLOAT, p.peer, 0, MPI_COMM_WORLD, &requests[k]);
    }
    MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
    for (size_t k = 0; k < ops.size(); ++k) {
      Status st = ops[k].send ? Status::ok() : toDevice(ops[k].buf, host[k], ops[k].e, stream);
      if (!st.isOk()) return st;
    }
    return Status::ok();
  }

  // Set once the watchdog has aborted: its report names the collective,
  // whichever instruction's synchronisation found it.
  bool aborted = false;
  void dropGraphEvents() {
    for (InFlight &f : graphEvents) watchPool.push_back(f.done);
    graphEvents.clear();
  }

  void abortAll() {
    aborted = true;
    for (ncclComm_t &c : comms)
      if (c) { ncclCommAbort(c); c = nullptr; }
    if (world) { ncclCommAbort(world); world = nullptr; }
  }
  ~NcclCommunicator() {
    for (ncclComm_t c : comms)
      if (c) ncclCommDestroy(c);
    if (world) ncclCommDestroy(world);
    for (MPI_Comm &c : mpiComms)
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
    if (ready) cudaEventDestroy(ready);
    for (InFlight &f : inFlight) cudaEventDestroy(f.done);
    for (cudaEvent_t e : capturedEvents) cudaEventDestroy(e);
    dropGraphEvents();
    for (cudaEvent_t e : watchPool) cudaEventDestroy(e);
    for (cudaEvent_t e : spareEvents) cudaEventDestroy(e);
    if (commStream) cudaStreamDestroy(commStream);
  }

private:
  static Status toHost(std::vector<float> &dst, const void *src, size_t n, Elem e, cudaStream_t stream) {
    dst.resize(n);
    return copyToHost(dst.data(), src, n, e, stream);
  }
  static Status toDevice(void *dst, const std::vector<float> &src, Elem e, cudaStream_t stream) {
    return copyToDevice(dst, src.data(), src.size(), e, stream);
  }
};

bool isHostStaged(const NcclCommunicator *comm) { return comm && comm->staged; }
std::string collectivesNote(const NcclCommunicator *comm) { return comm ? comm->note : std::string(); }

StatusOr<NcclCommunicator *>
createNcclCommunicator(const std::vector<int64_t> &shape, int rank, int size, int device,
                       double timeoutSeconds) {
  PARAX_CUDA(cudaSetDevice(device));
  auto comm = std::make_unique<NcclCommunicator>();
  comm->shape = shape;
  comm->rank = rank;
  comm->size = size;
  comm->timeout = timeoutSeconds;
  // Ranks on this node against GPUs on this node, agreed by every rank.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int onNode = 1;
  MPI_Comm_size(node, &onNode);
  MPI_Comm_free(&node);
  const char *forced = std::getenv("PARAX_COLLECTIVES");
  std::string choice = forced ? forced : "";
  if (!choice.empty() && choice != "mpi" && choice != "nccl")
    return PARAX_ERROR("PARAX_COLLECTIVES='" + choice +
                       "': expected mpi (collectives staged through host memory) or nccl (NCCL even where "
                       "ranks share a GPU: NCCL 2.30 or newer)");
  // More ranks than GPUs: NCCL before 2.30 refuses a communicator with two
  // ranks on one device; 2.30 runs them when asked (NCCL_MULTI_RANK_GPU_ENABLE,
  // its init.cc), which PARAX_COLLECTIVES=nccl does.
  const int devices = cudaDeviceCount();
  bool shared = onNode > devices;
  int version = 0;
  PARAX_NCCL(ncclGetVersion(&version));
  bool severalRanksAGpu = version >= 23000;
  int staged = choice == "mpi" || (shared && !(choice == "nccl" && severalRanksAGpu));
  MPI_Allreduce(MPI_IN_PLACE, &staged, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  comm->staged = staged != 0;
  std::string named = std::to_string(version / 10000) + "." + std::to_string(version % 10000 / 100) + "." +
                      std::to_string(version % 100);
  if (shared && choice == "nccl" && comm->staged)
    comm->note = "PARAX_COLLECTIVES=nccl: NCCL " + named +
                 " runs one rank a GPU (2.30 or newer runs several): collectives go through host memory and MPI";
  if (shared && !comm->staged) {
    setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", /*overwrite=*/0);
    comm->note = std::to_string(onNode) + " ranks share " + std::to_string(devices) +
                 " GPU(s) through NCCL " + named + " (PARAX_COLLECTIVES=nccl, NCCL_MULTI_RANK_GPU_ENABLE=1)";
  }
  if (comm->staged)
    comm->stalls = std::make_unique<StallWatchdog>(rank, timeoutSeconds);
  if (!comm->staged) {
    ncclUniqueId id;
    if (rank == 0)
      PARAX_NCCL(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    PARAX_NCCL(ncclCommInitRank(&comm->world, size, id, rank));
    PARAX_CUDA(cudaStreamCreateWithFlags(&comm->commStream, cudaStreamNonBlocking));
    PARAX_CUDA(cudaEventCreateWithFlags(&comm->ready, cudaEventDisableTiming));
  }
  unsigned axes = shape.size();
  comm->comms.assign(1u << axes, nullptr);
  comm->mpiComms.assign(1u << axes, MPI_COMM_NULL);
  comm->sizes.assign(1u << axes, 1);
  // Every rank splits for every mask in the same order (the splits are
  // collective over the parent); every rank belongs to one group per mask.
  for (unsigned mask = 1; mask < (1u << axes); ++mask) {
    GroupSplit g = groupSplit(shape, rank, mask);
    if (comm->staged)
      MPI_Comm_split(MPI_COMM_WORLD, static_cast<int>(g.color), static_cast<int>(g.key),
                     &comm->mpiComms[mask]);
    else
      PARAX_NCCL(ncclCommSplit(comm->world, static_cast<int>(g.color), static_cast<int>(g.key),
                               &comm->comms[mask], nullptr));
    comm->sizes[mask] = static_cast<int>(g.members);
  }
  return comm.release();
}

void destroyNcclCommunicator(NcclCommunicator *comm) { delete comm; }

} // namespace parax::runtime

#endif // PARAX_RUNTIME_CUDA_NCCLCOMMUNICATOR_CUH
