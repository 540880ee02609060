//===- Passes.td - interoperability with upstream shard ----*- tablegen -*-===//

#ifndef PARAX_INTEROP_PASSES_TD
#define PARAX_INTEROP_PASSES_TD

include "mlir/Pass/PassBase.td"

def ParaxExportShardPass : Pass<"parax-export-shard", "mlir::ModuleOp"> {
  let summary = "Export shardings as upstream shard annotations on linalg";
  let description = [{
    Rewrites parax linears (2-D inputs, no bias), silu / swiglu / add and the
    two contractions of attention (scores = q·kᵀ and out = p·v, one head
    per KV head) into `linalg.generic`, and the parax grid and shardings into
    `shard.grid`, `shard.sharding` and `shard.shard` annotations, so that
    `mlir-opt --sharding-propagation --shard-partition` partitions it.
    Partial sums are not annotated (upstream infers them). The softmax
    between the attention contractions is left out: upstream cannot
    partition it (PLATFORM.md); the export is for comparing plans, not an
    executable equivalent of attention. Other ops are errors.
  }];
  let dependentDialects = ["mlir::linalg::LinalgDialect",
                           "mlir::arith::ArithDialect",
                           "mlir::math::MathDialect",
                           "mlir::tensor::TensorDialect",
                           "mlir::shard::ShardDialect"];
}

def ParaxImportShardPass : Pass<"parax-import-shard", "mlir::ModuleOp"> {
  let summary = "Import upstream shard annotations as parax shardings";
  let description = [{
    Turns a `shard.grid` into a `parax.grid` of the same name (axis names from
    `axes`, else `a0`, `a1`, ...), and `shard.shard` annotations into
    constraints: on a function argument `parax.sharding`, on a parax op's
    result `parax.shardings`, `annotate_for_users` on a returned value the
    function result's `parax.sharding`. The shard ops are removed.
  }];
  let options = [
    ListOption<"axes", "axes", "std::string",
               "Names of the grid axes, in order (default a0, a1, ...)">,
  ];
}

#endif // PARAX_INTEROP_PASSES_TD
