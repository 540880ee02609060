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

def ParaxSplitFusedParamsPass : Pass<"parax-split-fused-params", "mlir::ModuleOp"> {
  let summary = "Make each slice of a fused parameter a parameter of its own";
  let description = [{
    A parameter that the graph reads only through `parax.slice` (GPT-2's
    `c_attn` holds q, k and v side by side in one checkpoint tensor) becomes
    one parameter per distinct slice: a box of the same checkpoint tensor,
    recorded as `parax.param_offset` (where the box starts) and
    `parax.param_shape` (the checkpoint tensor's shape). The slices go.

    The planner can then give each piece its own layout (q, k and v split
    by heads under TP), and every rank loads only its box of each piece
    instead of the whole fused tensor. `--parax-plan` runs this first.
    Functions that are called, partitioned, or whose fused parameter already
    has a sharding are left as they are; so are stacked `{e}` parameters.
  }];
}

#endif // PARAX_DIALECT_PARAX_TRANSFORMS_PASSES_TD
