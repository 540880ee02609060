// parax-run - run a .pxe executable on CPU ranks under mpirun.
//
//   mpirun -np N parax-run model.pxe --weights W.safetensors \
//       --input tokens.npy [--input labels.npy] --output logits.npy [--steps K]
//   mpirun -np N parax-run step.pxe --weights W.safetensors [--prefill chunk.pxe] \
//       --input prompt.npy --generate K --output tokens.npy [--output logits.npy]
//   mpirun -np N parax-run train.pxe --weights W.safetensors --input tokens.npy \
//       --input labels.npy --optimizer adamw --lr 1e-3 --steps K --save-weights OUT.safetensors
//
// N must equal the executable's grid size. Every rank loads only its slice of
// the weights; the last stage's rank with all other coordinates 0 writes the
// outputs. A failing rank prints its error with its rank and ends the job.
//
// The job's phases: Run.h.

#include "Run.h"

#include <cstdio>
#include <cstdlib>
#include <new>

int main(int argc, char **argv) {
  // An allocation that fails past prepare's check (the optimizer's state,
  // a gathered result): a named error, not an abort.
  std::set_new_handler([] {
    std::fputs("parax-run: out of host memory (an allocation failed; the program's buffers, its "
               "optimizer state and the results need more than this process may take)\n",
               stderr);
    std::_Exit(1);
  });
  parax::run::Run run(argc, argv);
  return run.execute();
}
