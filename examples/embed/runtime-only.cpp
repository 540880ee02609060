// parax-embed-runtime: a program that only runs executables links
// Parax::Runtime, which brings no MLIR or LLVM along.
//
//   parax-embed-runtime MODEL.pxe

#include "parax/runtime/Executable.h"

#include <cstdio>

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: parax-embed-runtime MODEL.pxe\n");
    return 2;
  }
  auto exe = parax::runtime::loadExecutable(argv[1]);
  if (!exe.isOk()) {
    std::fprintf(stderr, "%s\n", exe.status().message().c_str());
    return 1;
  }
  std::printf("runtime: %s is valid: %lld ranks, %d stage(s)", argv[1],
              static_cast<long long>(parax::runtime::gridSize(exe.value())),
              exe.value().stages_size());
  for (const auto &stage : exe.value().stages())
    std::printf(", stage %d: %d instructions", stage.index(), stage.instructions_size());
  std::printf("\n");
  return 0;
}
