//===- Passes.td - partitioning passes ---------------------*- tablegen -*-===//

#ifndef PARAX_PARTITION_PASSES_TD
#define PARAX_PARTITION_PASSES_TD

include "mlir/Pass/PassBase.td"

def ParaxPartitionPass : Pass<"parax-partition", "mlir::ModuleOp"> {
  let summary = "Rewrite an annotated model into per-stage SPMD programs";
  let description = [{
    Reads the shardings of an annotated model (from --parax-plan or written
    by hand; unannotated ops follow their operands or are replicated) and
    rewrites every model function into one function per pipeline stage
    (`@<name>_stage<s>`, or the same name for one stage) on local shapes,
    with the communication made explicit: all_reduce, all_gather,
    reduce_scatter, all_to_all, shard_slice and to_partial between layouts,
    send/recv across stage boundaries (grid axis `pp`). Each stage function
    carries `parax.pipeline = {stage, stages, schedule, micro_batches}`.
    Function results are made replicated. An op with no local rule for its
    layout is an error at the op.

    Logits split on the vocabulary (a column-parallel head) stay split for
    the cross-entropy and its gradient (vocab-parallel: every token's
    logsumexp gathered instead); `vocab-parallel=false` gathers the logits
    instead (to compare the two).
  }];
  let options = [
    Option<"vocabParallel", "vocab-parallel", "bool", /*default=*/"true",
           "Keep logits split on the vocabulary for the cross-entropy">,
  ];
}

def ParaxSpecializeRankPass : Pass<"parax-specialize-rank", "mlir::ModuleOp"> {
  let summary = "Print what one rank of a partitioned program runs";
  let description = [{
    For rank `rank` of the grid of a partitioned module, prints its grid
    coordinates, the stage function it runs, its local argument shapes (for
    a parameter also the box of its checkpoint tensor that this rank reads,
    `[begin:end, ...]`, with `of [shape]` for a piece of a fused tensor), and
    for every communication op the ranks of its group (or its peer). The IR
    is unchanged.
  }];
  let options = [
    Option<"rank", "rank", "int64_t", /*default=*/"0", "The rank to print">,
  ];
}

#endif // PARAX_PARTITION_PASSES_TD
