// parax-run - run a .pxe executable on CPU ranks under mpirun.
//
//   mpirun -np N parax-run model.pxe --weights W.safetensors \
//       --input tokens.npy [--input labels.npy] --output logits.npy [--steps K]
//
// N must equal the executable's grid size. Every rank loads only its slice of
// the weights; the last stage's rank with all other coordinates 0 writes the
// outputs. A failing rank prints its error with its rank and ends the job.

#define OMPI_SKIP_MPICXX 1
#include "parax/runtime/Checkpoint.h"
#include "parax/runtime/Communicator.h"
#include "parax/runtime/Executable.h"
#include "parax/runtime/Executor.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace parax::runtime;

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: mpirun -np N parax-run MODEL.pxe --weights W.safetensors "
               "--input X.npy [--input Y.npy] [--output OUT.npy] [--steps K]\n");
}

} // namespace

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto die = [&](const std::string &message) {
    std::fprintf(stderr, "parax-run: rank %d: %s\n", rank, message.c_str());
    std::fflush(stderr);
    if (size > 1)
      MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
    std::exit(1);
  };

  std::string model, weights, output;
  std::vector<std::string> inputs;
  int steps = 1;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        usage();
        die("missing value after " + arg);
      }
      return argv[++i];
    };
    if (arg == "--weights") weights = value();
    else if (arg == "--input") inputs.push_back(value());
    else if (arg == "--output") output = value();
    else if (arg == "--steps") steps = std::atoi(value().c_str());
    else if (arg == "--help" || arg == "-h") { usage(); MPI_Finalize(); return 0; }
    else if (!arg.empty() && arg[0] == '-') die("unknown option " + arg);
    else model = arg;
  }
  if (model.empty() || weights.empty()) {
    usage();
    die("an executable and --weights are required");
  }
  if (steps < 1) die("--steps must be at least 1");

  StatusOr<parax::pxe::Executable> exe = loadExecutable(model);
  if (!exe.isOk()) die(exe.status().message());
  int64_t grid = gridSize(exe.value());
  if (grid != size)
    die("the executable's grid has " + std::to_string(grid) + " ranks but mpirun started " +
        std::to_string(size) + " (use mpirun -np " + std::to_string(grid) + ")");

  std::vector<int64_t> shape(exe.value().grid().shape().begin(), exe.value().grid().shape().end());
  std::unique_ptr<Communicator> comm;
  if (size > 1) {
    auto created = createMpiCommunicator(shape);
    if (!created.isOk()) die(created.status().message());
    comm = std::move(created.value());
  }
  auto ckpt = Checkpoint::open(weights);
  if (!ckpt.isOk()) die(ckpt.status().message());
  std::vector<Tensor> inputTensors;
  for (const std::string &path : inputs) {
    auto t = readNpy(path);
    if (!t.isOk()) die(t.status().message());
    inputTensors.push_back(std::move(t.value()));
  }

  Executor executor;
  Status s = executor.prepare(exe.value(), rank, comm.get(), *ckpt.value(), inputTensors);
  if (!s.isOk()) die(s.message());
  std::vector<double> times;
  for (int step = 0; step < steps; ++step) {
    if (size > 1) MPI_Barrier(MPI_COMM_WORLD);
    auto start = std::chrono::steady_clock::now();
    s = executor.run();
    if (!s.isOk()) die(s.message());
    if (size > 1) MPI_Barrier(MPI_COMM_WORLD);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }

  // The writer: last stage, every other coordinate 0.
  const auto &coords = exe.value().ranks(rank).values();
  bool writer = executor.stage() + 1 == exe.value().stages_size();
  for (int i = 0; i < coords.size(); ++i)
    if (exe.value().grid().axis_names(i) != "pp" && coords[i] != 0)
      writer = false;
  if (writer) {
    std::vector<Tensor> outs = executor.outputs();
    if (!output.empty()) {
      if (outs.empty()) die("the executable has no outputs to write");
      s = writeNpy(output, outs[0]);
      if (!s.isOk()) die(s.message());
    }
    std::sort(times.begin(), times.end());
    std::printf("parax-run: %d rank(s), %zu instructions on rank %d, step time %.3f ms "
                "(median of %d)\n",
                size, executor.instructionCount(), rank, 1e3 * times[times.size() / 2], steps);
  }
  comm.reset(); // frees the sub-communicators before MPI ends
  MPI_Finalize();
  return 0;
}
