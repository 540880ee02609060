// parax-embed-session: a program that runs, trains and generates with an
// executable through the runtime library's Session (Parax::Runtime only),
// without parax-run. One rank, or every rank of the executable's grid under
// mpirun.
//
//   parax-embed-session run MODEL.pxe WEIGHTS OUT.npy INPUT.npy...
//   parax-embed-session train MODEL.pxe WEIGHTS STEPS LR INPUT.npy...   (AdamW)
//   parax-embed-session generate MODEL.pxe WEIGHTS TOKENS PROMPT.npy OUT.npy

#include "parax/runtime/Session.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace parax::runtime;

namespace {

int fail(const Status &s) {
  std::fprintf(stderr, "parax-embed-session: %s\n", s.message().c_str());
  MPI_Abort(MPI_COMM_WORLD, 1); // (the other ranks would wait for this one)
  return 1;
}

} // namespace

int main(int argc, char **argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  const int fixed = what == "run" ? 5 : what == "train" ? 6 : what == "generate" ? 7 : 0;
  if (!fixed || argc < fixed || (what == "generate" && argc != fixed)) {
    std::fprintf(stderr, "usage: parax-embed-session run MODEL.pxe WEIGHTS OUT.npy INPUT.npy...\n"
                         "       parax-embed-session train MODEL.pxe WEIGHTS STEPS LR INPUT.npy...\n"
                         "       parax-embed-session generate MODEL.pxe WEIGHTS TOKENS PROMPT.npy OUT.npy\n");
    return 2;
  }
  MPI_Init(&argc, &argv);
  SessionOptions options;
  options.executable = argv[2];
  options.weights = argv[3];
  auto opened = Session::open(options);
  if (!opened.isOk()) return fail(opened.status());
  Session &session = *opened.value();
  std::vector<Tensor> inputs;
  for (int k = what == "run" ? 5 : 6; k < argc && what != "generate"; ++k) {
    auto t = readNpy(argv[k]);
    if (!t.isOk()) return fail(t.status());
    inputs.push_back(std::move(t.value()));
  }
  if (what == "run") {
    std::vector<Tensor> results;
    Status s = session.run(inputs, results);
    if (!s.isOk()) return fail(s);
    if (session.holdsResults() && session.replica() == 0) s = writeNpy(argv[4], results[0]);
    if (!s.isOk()) return fail(s);
  } else if (what == "train") {
    OptimizerConfig adamw;
    adamw.kind = "adamw";
    adamw.lr = std::atof(argv[5]);
    for (int step = 0, steps = std::atoi(argv[4]); step < steps; ++step) {
      Session::StepReport report;
      Status s = session.trainStep(inputs, adamw, report);
      if (!s.isOk()) return fail(s);
      if (session.holdsResults() && session.replica() == 0)
        std::printf("step %lld: loss %.9g, gradient norm %.9g\n", static_cast<long long>(report.step), report.loss,
                    report.gradNorm);
    }
  } else {
    auto prompt = readNpy(argv[5]);
    if (!prompt.isOk()) return fail(prompt.status());
    Tensor sequence;
    Status s = session.generate(prompt.value(), std::atoll(argv[4]), Sampling(), sequence);
    if (!s.isOk()) return fail(s);
    if (session.holdsResults() && session.replica() == 0) s = writeNpy(argv[6], sequence);
    if (!s.isOk()) return fail(s);
  }
  opened.value().reset(); // (its communicators before MPI ends)
  MPI_Finalize();
  return 0;
}
