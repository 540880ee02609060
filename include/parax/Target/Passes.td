//===- Passes.td - target passes ---------------------------*- tablegen -*-===//

#ifndef PARAX_TARGET_PASSES_TD
#define PARAX_TARGET_PASSES_TD

include "mlir/Pass/PassBase.td"

def ParaxWriteExecutablePass : Pass<"parax-write-executable", "mlir::ModuleOp"> {
  let summary = "Write the partitioned module as a .pxe executable";
  let description = [{
    The last step of the plan -> partition -> executable pipeline for
    embedders: what `parax-translate --to-executable` writes, written to
    `output` from inside a pass pipeline. The IR is unchanged.
  }];
  let options = [
    Option<"output", "output", "std::string", /*default=*/"\"model.pxe\"",
           "Path of the executable to write">,
  ];
}

#endif // PARAX_TARGET_PASSES_TD
