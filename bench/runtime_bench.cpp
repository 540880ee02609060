// runtime_bench - figures of the CPU runtime (not a test):
//
//   parax-runtime-bench                 dispatch overhead, linear vs sgemm
//   mpirun -np 4 parax-runtime-bench    collective algbw / busbw (nccl-tests definitions)
//
// Medians over repeated runs; correctness checked in the same run.

#define OMPI_SKIP_MPICXX 1
#include "parax/runtime/Checkpoint.h"
#include "parax/runtime/Communicator.h"
#include "parax/runtime/Executor.h"
#include "BenchUtil.h"

#include <mpi.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <vector>

using namespace parax::runtime;
using namespace parax::bench;

namespace {




// A one-rank executable around `build`.
parax::pxe::Executable program(const std::function<void(parax::pxe::Stage &)> &build) {
  parax::pxe::Executable exe;
  exe.set_format_version(2);
  exe.add_ranks();
  build(*exe.add_stages());
  return exe;
}

void kernels() {
  auto ckpt = Checkpoint::open(emptyCheckpoint("/tmp/parax-bench-empty.safetensors"));
  // 1. Dispatch overhead: 1000 adds of one element.
  const int n = 1000;
  auto exe = program([&](parax::pxe::Stage &s) {
    addBuffer(s, {1}, parax::pxe::INPUT)->set_input_index(0);
    int prev = 0;
    for (int i = 0; i < n; ++i) {
      addBuffer(s, {1}, parax::pxe::TEMPORARY);
      auto *inst = s.add_instructions();
      inst->set_kind(parax::pxe::OP_ADD);
      inst->add_operands(prev);
      inst->add_operands(0);
      inst->add_results(i + 1);
      prev = i + 1;
    }
  });
  Executor e;
  Tensor one = Tensor::floats({1});
  one.f[0] = 1;
  Status st = e.prepare(exe, 0, nullptr, *ckpt.value(), {one});
  if (!st.isOk()) { std::printf("prepare: %s\n", st.message().c_str()); std::exit(1); }
  double t = timeIt([&] { (void)e.run(); }, 50);
  if (e.outputs().size() || true) {}
  std::printf("dispatch: %.1f ns per instruction (1000 one-element adds, median of 50)\n",
              1e9 * t / n);

  // 2. Linear vs sgemm on the same shapes.
  std::printf("linear vs oneDNN's sgemm called directly (one thread, median of 7, GFLOP/s):\n");
  // (transposed, few rows: a decode step of several sequences, whose weight
  // the runtime reads once instead of packing it: FewRowsGemm.h)
  for (auto [m, k, nn, t] : std::vector<std::tuple<int, int, int, bool>>{
           {256, 1024, 1024, false}, {1024, 1024, 1024, false}, {2048, 512, 2048, false}, {16, 4096, 4096, false},
           {8, 1024, 32000, true}, {8, 4096, 4096, true}, {16, 4096, 4096, true}}) {
    auto lin = linearProgram(m, k, nn, t);
    Tensor x = Tensor::floats({m, k}), w = t ? Tensor::floats({nn, k}) : Tensor::floats({k, nn});
    for (size_t i = 0; i < x.f.size(); ++i) x.f[i] = std::sin(0.001 * i);
    for (size_t i = 0; i < w.f.size(); ++i) w.f[i] = std::cos(0.001 * i);
    Executor ex;
    st = ex.prepare(lin, 0, nullptr, *ckpt.value(), {x, w});
    if (!st.isOk()) { std::printf("prepare: %s\n", st.message().c_str()); std::exit(1); }
    std::vector<float> y(size_t(m) * nn);
    double flops = 2.0 * m * k * nn;
    double tRuntime = timeIt([&] { (void)ex.run(); }, 7);
    double tBlas = timeIt(
        [&] {
          dnnl_sgemm('N', t ? 'T' : 'N', m, nn, k, 1.0f, x.f.data(), k, w.f.data(), t ? k : nn, 0.0f, y.data(), nn);
        },
        7);
    float maxDiff = 0;
    Tensor out = ex.outputs()[0];
    for (size_t i = 0; i < y.size(); ++i) maxDiff = std::max(maxDiff, std::fabs(out.f[i] - y[i]));
    std::printf("  %5d x %5d x %5d%s: runtime %6.1f, sgemm %6.1f, efficiency %5.1f %% (max diff %.1e)\n",
                m, k, nn, t ? " (w transposed)" : "", flops / tRuntime / 1e9, flops / tBlas / 1e9,
                100 * tBlas / tRuntime, maxDiff);
  }
}

void collectives(int rank, int size) {
  auto comm = createMpiCommunicator({size});
  if (!comm.isOk()) { std::printf("%s\n", comm.status().message().c_str()); return; }
  Communicator &c = *comm.value();
  if (rank == 0)
    std::printf("MPI collectives, %d ranks (nccl-tests definitions; median of 9):\n"
                "  %-15s %10s %10s %10s %10s\n", size, "op", "bytes", "time us",
                "algbw GB/s", "busbw GB/s");
  for (size_t bytes : {size_t(1) << 20, size_t(4) << 20, size_t(16) << 20}) {
    size_t n = bytes / 4;
    std::vector<float> a(n, 1.0f), b(n * size), r(n);
    struct Case { const char *name; double factor; std::function<Status()> run; std::function<bool()> ok; };
    std::vector<Case> cases = {
        {"all_reduce", 2.0 * (size - 1) / size, [&] { std::fill(a.begin(), a.end(), 1.0f + rank); return c.allReduce(a.data(), n, 1); },
         [&] { return std::fabs(a[n / 2] - size * (size + 1) / 2.0) < 1e-3; }},
        {"all_gather", double(size - 1) / size, [&] { std::fill(r.begin(), r.end(), float(rank)); return c.allGather(r.data(), n / size, b.data(), 1); },
         [&] { return b[(size - 1) * (n / size)] == float(size - 1); }},
        {"reduce_scatter", double(size - 1) / size, [&] { std::fill(a.begin(), a.end(), 1.0f); return c.reduceScatter(a.data(), r.data(), n / size, 1); },
         [&] { return r[0] == float(size); }},
        {"all_to_all", double(size - 1) / size, [&] { std::fill(a.begin(), a.end(), float(rank)); return c.allToAll(a.data(), b.data(), n / size, 1); },
         [&] { return b[(size - 1) * (n / size)] == float(size - 1); }},
    };
    for (Case &k : cases) {
      std::vector<double> t;
      bool correct = true;
      for (int rep = 0; rep < 9; ++rep) {
        MPI_Barrier(MPI_COMM_WORLD);
        auto s = std::chrono::steady_clock::now();
        Status st = k.run();
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
        correct &= st.isOk() && k.ok();
      }
      double tm = median(t), alg = bytes / tm / 1e9;
      if (rank == 0)
        std::printf("  %-15s %10zu %10.1f %10.2f %10.2f%s\n", k.name, bytes, tm * 1e6, alg,
                    alg * k.factor, correct ? "" : "  WRONG RESULT");
    }
  }
}

} // namespace

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 1)
    kernels();
  else
    collectives(rank, size);
  MPI_Finalize();
  return 0;
}
