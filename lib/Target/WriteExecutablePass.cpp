//===- WriteExecutablePass.cpp - write a .pxe from a pass pipeline -------===//

#include "parax/Target/Executable.h"
#include "parax/Target/Passes.h"

#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/ToolOutputFile.h"

namespace parax {
#define GEN_PASS_DEF_PARAXWRITEEXECUTABLEPASS
#include "parax/Target/Passes.h.inc"
} // namespace parax

using namespace mlir;

namespace {

struct ParaxWriteExecutablePass
    : public parax::impl::ParaxWriteExecutablePassBase<ParaxWriteExecutablePass> {
  using Base::Base;

  void runOnOperation() override {
    std::string error;
    std::unique_ptr<llvm::ToolOutputFile> file = openOutputFile(output, &error);
    if (!file) {
      mlir::emitError(getOperation().getLoc()) << "cannot write the executable: " << error;
      return signalPassFailure();
    }
    if (failed(parax::translateToExecutable(getOperation(), file->os())))
      return signalPassFailure();
    file->keep();
    markAllAnalysesPreserved();
  }
};

} // namespace
