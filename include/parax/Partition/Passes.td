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

def ParaxTpOverlapPass : Pass<"parax-tp-overlap", "mlir::ModuleOp"> {
  let summary = "Split the GEMMs beside each TP collective into row chunks, so that a chunk's transfer runs beside the next chunk's GEMMs";
  let description = [{
    For every `parax.linear` of a partitioned program whose one use is an
    `all_reduce`, a `reduce_scatter` or an `all_gather` (a row-parallel
    GEMM's partial sum; a column-parallel GEMM's piece gathered), splits
    its rows into `chunks` pieces along the first leading dimension that
    divides by `chunks` and is not the collective's own (where none does,
    a sequence-parallel microbatch of one sequence, along the collective's
    dimension viewed as [ranks' pieces, rows], each piece's rows cut
    alike, so each rank keeps one contiguous piece): each piece sliced,
    multiplied and sent by a collective of its own, then the results joined
    (`parax.concat`). The runtime issues each collective on its own stream
    and waits for it only where its result is read, so the transfer of
    chunk i runs while chunk i + 1 multiplies (Megatron-Core's and
    TransformerEngine's TP communication overlap, by decomposition). The
    same rows reach the same ranks: results are unchanged. A GEMM with no
    such dimension is left whole. Likewise an `all_gather` that
    `parax.linear`s read as their input: gathered in chunks, chunk i's GEMMs
    issued after chunk i + 1's gather, each GEMM's chunks joined, and its
    other readers given the gathered chunks joined.

    ```mlir
    %p = parax.linear %x, %w {transpose_w} : (tensor<2x16x64xf32>, tensor<32x64xf32>) -> tensor<2x16x32xf32>
    %y = parax.all_reduce %p over @g ["tp"] : tensor<2x16x32xf32> -> tensor<2x16x32xf32>
    // chunks=2:
    %x0 = parax.slice %x {dim = 0, start = 0} : (tensor<2x16x64xf32>) -> tensor<1x16x64xf32>
    %p0 = parax.linear %x0, %w {transpose_w} : ...
    %y0 = parax.all_reduce %p0 over @g ["tp"] : ...
    (the same for rows 1..1)
    %y = parax.concat %y0, %y1 {dim = 0} : ...
    ```
  }];
  let options = [
    Option<"chunks", "chunks", "int64_t", /*default=*/"2",
           "Pieces each GEMM's rows are split into (at least 2)">,
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
