//===- Passes.td - parax dialect passes --------------------*- tablegen -*-===//

#ifndef PARAX_DIALECT_PARAX_TRANSFORMS_PASSES_TD
#define PARAX_DIALECT_PARAX_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def ParaxModelSummaryPass : Pass<"parax-model-summary", "mlir::ModuleOp"> {
  let summary = "Print parameters, bytes and FLOPs per token of each model";
  let description = [{
    For every function of the module that holds parax ops, prints (to stdout,
    or to the file named by `output`) the parameter count and bytes (from the
    `parax.param` arguments), the decoder layer count (from `parax.layer`),
    the forward FLOPs and bytes moved (from `CostOpInterface`), and FLOPs per
    token (tokens = elements of the first integer argument that is not a
    parameter). The IR is left unchanged. An op without a cost model is
    reported with a warning, never skipped silently.
  }];
  let options = [
    Option<"output", "output", "std::string", /*default=*/"\"-\"",
           "Where to write the summary ('-' is stdout)">,
  ];
}

#endif // PARAX_DIALECT_PARAX_TRANSFORMS_PASSES_TD
