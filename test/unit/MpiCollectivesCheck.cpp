// parax-mpi-collectives-check: the MPI communicator's collectives against
// exact sums, on however many ranks mpirun starts (driven by
// test/runtime/test_collectives.py): every rank's values are small
// integers, so any order of summation gives the same floats. Sizes below
// and above the ring's threshold, divisible by the ranks and not, and
// groups of the whole world and of one grid axis; and the all-gather into an
// inner dimension's layout (allGatherRuns: MPI's strided datatype), every
// value where its run says. Then a wait: rank 0 joins an all-reduce 300 ms
// late, and every rank prints whether ranks share this node's cores and
// the CPU time it spent waiting (test_collectives.py: on shared cores the
// waits sleep). Exit code 0 and "ok", or 1 and what differed.

#define OMPI_SKIP_MPICXX 1
#include "parax/runtime/Communicator.h"
#include "parax/runtime/MpiRing.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

using namespace parax::runtime;

static float valueOf(int rank, size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 97)); }

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int failures = 0;
  auto expect = [&](bool ok, const char *what, size_t n, size_t i, float got, float want) {
    if (ok) return true;
    std::fprintf(stderr, "rank %d: %s of %zu values: [%zu] = %g, not %g\n", rank, what, n, i, got, want);
    ++failures;
    return false;
  };
  // Grids: the whole world on one axis, and (an even world) 2 x size/2,
  // whose axis 1 groups ranks {2k, 2k + 1}.
  std::vector<std::vector<int64_t>> grids = {{size}};
  if (size % 2 == 0 && size > 2) grids.push_back({size / 2, 2});
  for (const std::vector<int64_t> &grid : grids) {
    StatusOr<std::unique_ptr<Communicator>> made = createMpiCommunicator(grid, 60);
    if (!made.isOk()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, made.status().message().c_str());
      return 1;
    }
    std::unique_ptr<Communicator> comm = std::move(made.value());
    unsigned mask = grid.size() == 1 ? 1u : 2u;
    int P = comm->groupSize(mask), first = grid.size() == 1 ? 0 : rank - rank % 2;
    int member = rank - first; // (this rank's place in its group)
    float weight = 0;          // sum over the group of (rank + 1)
    for (int g = 0; g < P; ++g) weight += first + g + 1;
    for (size_t n : {size_t(1000), size_t(16384 * P + 3), size_t(100003), size_t(262144 * P)}) {
      std::vector<float> x(n);
      for (size_t i = 0; i < n; ++i) x[i] = valueOf(rank, i);
      if (!comm->allReduce(x.data(), n, mask).isOk()) return 1;
      for (size_t i = 0; i < n; ++i)
        if (!expect(x[i] == weight * (i % 97), "all_reduce", n, i, x[i], weight * (i % 97))) break;
      // reduce-scatter: P chunks of m, this rank keeps chunk `member` summed
      size_t m = n / P + 1;
      std::vector<float> in(m * P), out(m, -1);
      for (size_t i = 0; i < in.size(); ++i) in[i] = valueOf(rank, i);
      if (!comm->reduceScatter(in.data(), out.data(), m, mask).isOk()) return 1;
      for (size_t i = 0; i < m; ++i) {
        size_t at = member * m + i;
        if (!expect(out[i] == weight * (at % 97), "reduce_scatter", m, i, out[i], weight * (at % 97))) break;
      }
    }
    // all_gather of `rows` runs of `run` a rank: run r of member g at
    // (r * P + g) * run, holding (first + g + 1) * ((r * run + j) % 97).
    for (auto [rows, run] : {std::pair<size_t, size_t>{1, 5}, {3, 1}, {7, 333}, {512, 1600}}) {
      std::vector<float> in(rows * run), out(rows * run * P, -1);
      for (size_t i = 0; i < in.size(); ++i) in[i] = valueOf(rank, i);
      if (!comm->allGatherRuns(in.data(), rows, run, out.data(), mask).isOk()) return 1;
      for (size_t i = 0; i < out.size(); ++i) {
        size_t r = i / (run * P), g = i / run % P, j = i % run;
        float want = static_cast<float>((first + g + 1) * ((r * run + j) % 97));
        if (!expect(out[i] == want, "all_gather of runs", rows * run, i, out[i], want)) break;
      }
    }
  }
  {
    StatusOr<std::unique_ptr<Communicator>> made = createMpiCommunicator({size}, 60);
    if (!made.isOk()) return 1;
    auto cpuSeconds = [] {
      timespec t{};
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
      return t.tv_sec + 1e-9 * t.tv_nsec;
    };
    float one = 1;
    if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto wall = std::chrono::steady_clock::now();
    double cpu = cpuSeconds();
    if (!made.value()->allReduce(&one, 1, 1).isOk()) return 1;
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
    std::printf("rank %d waited %.1f ms, on the CPU %.1f ms, cores shared %d\n", rank, 1e3 * waited,
                1e3 * (cpuSeconds() - cpu), ranksShareCores() ? 1 : 0);
    expect(one == size, "all_reduce after a wait", 1, 0, one, static_cast<float>(size));
    // The same wait at a barrier (a step's end): nothing of a waiting
    // rank's moves, so where ranks share cores it sleeps from the first.
    if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    wall = std::chrono::steady_clock::now();
    cpu = cpuSeconds();
    if (!mpiBarrier(MPI_COMM_WORLD, "the check's barrier").isOk()) return 1;
    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
    std::printf("rank %d waited at the barrier %.1f ms, on the CPU %.1f ms\n", rank, 1e3 * waited,
                1e3 * (cpuSeconds() - cpu));
  }
  if (rank == 0 && failures == 0)
    std::printf("ok: all_reduce, reduce_scatter and all_gather of runs on %d ranks\n", size);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
