// RUN: parax-opt %s -split-input-file --parax-partition | FileCheck %s

// The resharding table on a two-linear MLP (our naming: y = x · W; the seed
// article's "row" is our column), sequence parallelism, pipeline stages, data
// parallelism and multi-axis grids.

parax.grid @g(tp = 4)
// Column then row: one all-reduce, nothing else.
// CHECK-LABEL: func.func @col_row
// CHECK-SAME: tensor<64x16xf32> {parax.global_sharding = #parax.sharding<@g, [{tp}, {}]>, parax.param = "up"}
// CHECK-SAME: tensor<16x64xf32> {parax.global_sharding = #parax.sharding<@g, [{}, {tp}]>, parax.param = "down"}
// CHECK: parax.linear {{.*}} -> tensor<2x8x64xf32>
// CHECK: parax.linear {{.*}} -> tensor<2x8x16xf32>
// CHECK-COUNT-1: parax.all_reduce
// CHECK-NOT: parax.all_gather
// CHECK: return
func.func @col_row(%x: tensor<2x8x16xf32>,
    %up: tensor<256x16xf32> {parax.param = "up", parax.sharding = #parax.sharding<@g, [{tp}, {}]>},
    %down: tensor<16x256xf32> {parax.param = "down", parax.sharding = #parax.sharding<@g, [{}, {tp}]>}) -> tensor<2x8x16xf32> {
  %h = parax.linear %x, %up {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}]>]} : (tensor<2x8x16xf32>, tensor<256x16xf32>) -> tensor<2x8x256xf32>
  %y = parax.linear %h, %down {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {}], partial = {tp}>]} : (tensor<2x8x256xf32>, tensor<16x256xf32>) -> tensor<2x8x16xf32>
  return %y : tensor<2x8x16xf32>
}

// -----

parax.grid @g(tp = 4)
// Column then column: gather for the second layer, gather its output.
// CHECK-LABEL: func.func @col_col
// CHECK-COUNT-2: parax.all_gather
// CHECK-NOT: parax.all_reduce
// CHECK: return
func.func @col_col(%x: tensor<2x8x16xf32>, %a: tensor<256x16xf32> {parax.param = "a"}, %b: tensor<64x256xf32> {parax.param = "b"}) -> tensor<2x8x64xf32> {
  %h = parax.linear %x, %a {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}]>]} : (tensor<2x8x16xf32>, tensor<256x16xf32>) -> tensor<2x8x256xf32>
  %y = parax.linear %h, %b {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}]>]} : (tensor<2x8x256xf32>, tensor<64x256xf32>) -> tensor<2x8x64xf32>
  return %y : tensor<2x8x64xf32>
}

// -----

parax.grid @g(tp = 4)
// Row then row: the input arrives split as the first layer reads it (each
// rank loads its box: no shard_slice of it), partial sums before the second
// layer (reduce-scattered to the split it needs) and after it.
// CHECK-LABEL: func.func @row_row
// CHECK-SAME: %arg0: tensor<2x8x4xf32> {parax.global_sharding = #parax.sharding<@g, [{}, {}, {tp}]>, parax.input = 0 : i64}
// CHECK-NOT: parax.shard_slice %arg0
// CHECK: parax.reduce_scatter {{.*}} over @g ["tp"] dim 2
// CHECK: parax.all_reduce
// CHECK-NOT: parax.all_gather
// CHECK: return
func.func @row_row(%x: tensor<2x8x16xf32>, %a: tensor<64x16xf32> {parax.param = "a"}, %b: tensor<16x64xf32> {parax.param = "b"}) -> tensor<2x8x16xf32> {
  %h = parax.linear %x, %a {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {}], partial = {tp}>]} : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %y = parax.linear %h, %b {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {}], partial = {tp}>]} : (tensor<2x8x64xf32>, tensor<16x64xf32>) -> tensor<2x8x16xf32>
  return %y : tensor<2x8x16xf32>
}

// -----

parax.grid @g(tp = 4)
// A row-parallel linear with a bias adds it on one rank of the sum only.
// CHECK-LABEL: func.func @row_bias
// CHECK: parax.to_partial {{.*}} over @g ["tp"] : tensor<16xf32>
// CHECK: parax.linear
// CHECK: parax.all_reduce
func.func @row_bias(%x: tensor<2x64xf32>, %w: tensor<64x16xf32> {parax.param = "w"}, %b: tensor<16xf32> {parax.param = "b"}) -> tensor<2x16xf32> {
  %y = parax.linear %x, %w, %b {parax.shardings = [#parax.sharding<@g, [{}, {}], partial = {tp}>]} : (tensor<2x64xf32>, tensor<64x16xf32>, tensor<16xf32>) -> tensor<2x16xf32>
  return %y : tensor<2x16xf32>
}

// -----

parax.grid @g(tp = 4)
// Sequence parallelism: the norm and the residual add work on sequence
// slices; the all-reduce becomes a reduce-scatter (into the sequence split)
// and an all-gather (out of it, before the column-parallel linear).
// CHECK-LABEL: func.func @sequence_parallel
// CHECK: parax.rms_norm {{.*}} -> tensor<2x2x16xf32>
// CHECK: parax.all_gather {{.*}} over @g ["tp"] dim 1 : tensor<2x2x16xf32> -> tensor<2x8x16xf32>
// CHECK: parax.reduce_scatter {{.*}} over @g ["tp"] dim 1 : tensor<2x8x16xf32> -> tensor<2x2x16xf32>
// CHECK: parax.add {{.*}} -> tensor<2x2x16xf32>
// CHECK-NOT: parax.all_reduce
func.func @sequence_parallel(%x: tensor<2x8x16xf32> {parax.sharding = #parax.sharding<@g, [{}, {tp}, {}]>},
    %n: tensor<16xf32> {parax.param = "n"}, %a: tensor<64x16xf32> {parax.param = "a"}, %b: tensor<16x64xf32> {parax.param = "b"})
    -> (tensor<2x8x16xf32> {parax.sharding = #parax.sharding<@g, [{}, {tp}, {}]>}) {
  %h = parax.rms_norm %x, %n {eps = 1.0e-5 : f64, parax.shardings = [#parax.sharding<@g, [{}, {tp}, {}]>]} : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %u = parax.linear %h, %a {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}]>]} : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %d = parax.linear %u, %b {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {}], partial = {tp}>]} : (tensor<2x8x64xf32>, tensor<16x64xf32>) -> tensor<2x8x16xf32>
  %r = parax.add %x, %d {parax.shardings = [#parax.sharding<@g, [{}, {tp}, {}]>]} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %r : tensor<2x8x16xf32>
}

// -----

parax.grid @g(tp = 4)
// A value split on one dimension and wanted on another moves by all_to_all;
// an unannotated silu follows its operand.
// CHECK-LABEL: func.func @resplit
// CHECK: parax.silu {{.*}} -> tensor<8x2xf32>
// CHECK: parax.all_to_all {{.*}} over @g ["tp"] split 0 concat 1 : tensor<8x2xf32> -> tensor<2x8xf32>
func.func @resplit(%x: tensor<8x8xf32> {parax.sharding = #parax.sharding<@g, [{}, {tp}]>}, %w: tensor<8xf32> {parax.param = "w"})
    -> (tensor<8x8xf32>) {
  %s = parax.silu %x : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %y = parax.rms_norm %s, %w {eps = 1.0e-5 : f64, parax.shardings = [#parax.sharding<@g, [{tp}, {}]>]} : (tensor<8x8xf32>, tensor<8xf32>) -> tensor<8x8xf32>
  return %y : tensor<8x8xf32>
}

// -----

parax.grid @g(pp = 2, tp = 2)
// Two pipeline stages: one program each, one send/recv pair at the boundary.
// CHECK-LABEL: func.func @pipe_stage0
// CHECK-SAME: parax.pipeline = #parax.pipeline<stage = 0, stages = 2>
// CHECK: parax.linear
// CHECK: parax.send {{.*}} over @g ["pp"] to 1 : tensor<4x8xf32>
// CHECK-NEXT: return
// CHECK-LABEL: func.func @pipe_stage1
// CHECK-SAME: parax.pipeline = #parax.pipeline<stage = 1, stages = 2>
// CHECK: parax.recv over @g ["pp"] from 0 : tensor<4x8xf32>
// CHECK: parax.linear
// CHECK: return {{.*}} : tensor<4x8xf32>
// CHECK-NOT: parax.send
func.func @pipe(%x: tensor<4x8xf32>, %a: tensor<8x8xf32> {parax.param = "a"}, %b: tensor<8x8xf32> {parax.param = "b"}) -> tensor<4x8xf32> {
  %h = parax.linear %x, %a {parax.stage = 0 : i64} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %y = parax.linear %h, %b {parax.stage = 1 : i64} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

parax.grid @g(pp = 2)
// A stage that reads only the second data input says so: the loader feeds
// program input #1 (the labels), not its first data input.
// CHECK-LABEL: func.func @inputs_stage0
// CHECK-SAME: (%{{.*}}: tensor<2x8xi32> {parax.input = 0 : i64}
// CHECK-LABEL: func.func @inputs_stage1
// CHECK-SAME: (%{{.*}}: tensor<8x16xf32> {{{.*}}parax.param = "head"}
// CHECK: parax.cross_entropy
func.func @inputs(%tokens: tensor<2x8xi32>, %labels: tensor<2x8xi32>, %emb: tensor<16x8xf32> {parax.param = "emb"}, %head: tensor<8x16xf32> {parax.param = "head"}) -> tensor<f32> {
  %x = parax.embedding %tokens, %emb {parax.stage = 0 : i64} : (tensor<2x8xi32>, tensor<16x8xf32>) -> tensor<2x8x8xf32>
  %l = parax.linear %x, %head {parax.stage = 1 : i64} : (tensor<2x8x8xf32>, tensor<8x16xf32>) -> tensor<2x8x16xf32>
  %loss = parax.cross_entropy %l, %labels {parax.stage = 1 : i64} : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

parax.grid @g(ep = 2)
// A loss summed over the ranks that split its tokens (the plan's under
// expert parallelism): the labels, a program input, are loaded split as the
// logits are; the logits are never gathered, the loss is all-reduced.
// CHECK-LABEL: func.func @loss_where_its_tokens_are
// CHECK-SAME: %{{.*}}: tensor<1x8x16xf32> {{{.*}}}, %{{.*}}: tensor<1x8xi32> {parax.global_sharding = #parax.sharding<@g, [{ep}, {}]>, parax.input = 1 : i64}
// CHECK-NOT: parax.all_gather
// CHECK: parax.cross_entropy {{.*}} {num_tokens = 16 : i64} : (tensor<1x8x16xf32>, tensor<1x8xi32>)
// CHECK-COUNT-1: parax.all_reduce
// CHECK-NOT: parax.all_gather
func.func @loss_where_its_tokens_are(%l: tensor<2x8x16xf32> {parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>}, %y: tensor<2x8xi32>) -> tensor<f32> {
  %loss = parax.cross_entropy %l, %y {parax.shardings = [#parax.sharding<@g, [], partial = {ep}>]} : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

parax.grid @g(cp = 2) {cyclic_axes = ["cp"]}
// Under context parallelism the labels are loaded whole and dealt out in the
// program (every cp-th position, as the logits' sequence is): integers are
// sliced, never gathered; the logits stay each rank's own.
// CHECK-LABEL: func.func @labels_dealt_out_cyclically
// CHECK-SAME: %{{.*}}: tensor<2x8xi32> {parax.input = 1 : i64}
// CHECK-NOT: parax.all_gather
// CHECK: parax.silu {{.*}} -> tensor<2x4x16xf32>
// CHECK: parax.reshape {{.*}} : (tensor<2x8xi32>) -> tensor<2x4x2xi32>
// CHECK: parax.shard_slice {{.*}} over @g ["cp"] dim 2 : tensor<2x4x2xi32> -> tensor<2x4x1xi32>
// CHECK: parax.reshape {{.*}} -> tensor<2x4xi32>
// CHECK: parax.cross_entropy {{.*}} {num_tokens = 16 : i64} : (tensor<2x4x16xf32>, tensor<2x4xi32>)
// CHECK-COUNT-1: parax.all_reduce
// CHECK-NOT: parax.all_gather
func.func @labels_dealt_out_cyclically(%x: tensor<2x8x16xf32>, %y: tensor<2x8xi32>) -> tensor<f32> {
  %l = parax.silu %x {parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}]>]} : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %loss = parax.cross_entropy %l, %y {parax.shardings = [#parax.sharding<@g, [], partial = {cp}>]} : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

parax.grid @g(cp = 2, tp = 2) {cyclic_axes = ["cp"]}
// A sum pending over several axes is all-reduced once, over all of them:
// the loss, a partial sum over cp (its tokens) and tp (its vocabulary).
// CHECK-LABEL: func.func @one_reduction_over_two_axes
// CHECK: parax.cross_entropy {{.*}} : (tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<2x4x1xf32>) -> tensor<f32>
// CHECK-NEXT: parax.all_reduce {{.*}} over @g ["cp", "tp"] : tensor<f32> -> tensor<f32>
// CHECK-NOT: parax.all_reduce
// CHECK: return
func.func @one_reduction_over_two_axes(%x: tensor<2x8x16xf32>, %y: tensor<2x8xi32>,
    %head: tensor<32x16xf32> {parax.param = "head"}) -> tensor<f32> {
  %logits = parax.linear %x, %head {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {cp}, {tp}]>]} : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %loss = parax.cross_entropy %logits, %y {parax.shardings = [#parax.sharding<@g, [], partial = {cp}>]} : (tensor<2x8x32xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

parax.grid @g(ep = 2)
// A whole scalar (the load-balancing loss) added to that partial sum is
// counted once: one rank's share (to_partial), then one all-reduce.
// CHECK-LABEL: func.func @partial_loss_plus_a_whole_one
// CHECK: parax.cross_entropy
// CHECK: parax.to_partial
// CHECK: parax.add
// CHECK-COUNT-1: parax.all_reduce
// CHECK-NOT: parax.all_reduce
// CHECK: return
func.func @partial_loss_plus_a_whole_one(%l: tensor<2x8x16xf32> {parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>}, %y: tensor<2x8xi32>, %aux: tensor<f32>) -> tensor<f32> {
  %loss = parax.cross_entropy %l, %y {parax.shardings = [#parax.sharding<@g, [], partial = {ep}>]} : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<f32>
  %total = parax.add %loss, %aux : (tensor<f32>, tensor<f32>) -> tensor<f32>
  return %total : tensor<f32>
}

// -----

parax.grid @g(dp = 2, tp = 2)
// Data parallelism splits the batch: local shapes, no forward communication
// (the results are gathered to be returned whole); on a [dp, tp] grid the
// tensor-parallel all-reduce runs over tp only.
// CHECK-LABEL: func.func @data_and_tensor
// CHECK-SAME: %{{.*}}: tensor<2x8xi32>
// CHECK: parax.embedding {{.*}} -> tensor<2x8x16xf32>
// CHECK: parax.linear {{.*}} -> tensor<2x8x16xf32>
// CHECK: parax.all_reduce {{.*}} over @g ["tp"] : tensor<2x8x16xf32>
// CHECK: parax.all_gather {{.*}} over @g ["dp"] dim 0 : tensor<2x8x16xf32> -> tensor<4x8x16xf32>
func.func @data_and_tensor(%t: tensor<4x8xi32> {parax.sharding = #parax.sharding<@g, [{dp}, {}]>},
    %e: tensor<32x16xf32> {parax.param = "e"}, %w: tensor<16x16xf32> {parax.param = "w"}) -> tensor<4x8x16xf32> {
  %h = parax.embedding %t, %e {parax.shardings = [#parax.sharding<@g, [{dp}, {}, {}]>]} : (tensor<4x8xi32>, tensor<32x16xf32>) -> tensor<4x8x16xf32>
  %y = parax.linear %h, %w {parax.shardings = [#parax.sharding<@g, [{dp}, {}, {}], partial = {tp}>]} : (tensor<4x8x16xf32>, tensor<16x16xf32>) -> tensor<4x8x16xf32>
  return %y : tensor<4x8x16xf32>
}

// -----

parax.grid @g(tp = 2)
// Vocab-parallel embedding: the table's rows split, the lookup a partial sum.
// CHECK-LABEL: func.func @vocab_parallel
// CHECK: parax.embedding {{.*}} {vocab_axes = ["tp"], vocab_grid = @g} : (tensor<2x8xi32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
// CHECK: parax.all_reduce
func.func @vocab_parallel(%t: tensor<2x8xi32>, %e: tensor<32x16xf32> {parax.param = "e"}) -> tensor<2x8x16xf32> {
  %h = parax.embedding %t, %e {parax.shardings = [#parax.sharding<@g, [{}, {}, {}], partial = {tp}>]} : (tensor<2x8xi32>, tensor<32x16xf32>) -> tensor<2x8x16xf32>
  return %h : tensor<2x8x16xf32>
}

// -----

parax.grid @g(tp = 2)
// Attention split by heads (grouped-query: 4 query and 2 KV heads become 2
// and 1 per rank).
// CHECK-LABEL: func.func @heads
// CHECK: parax.attention {{.*}}num_heads = 2 : i64, num_kv_heads = 1 : i64{{.*}} : (tensor<1x8x2x8xf32>, tensor<1x8x1x8xf32>, tensor<1x8x1x8xf32>) -> tensor<1x8x2x8xf32>
func.func @heads(%q: tensor<1x8x4x8xf32>, %k: tensor<1x8x2x8xf32>, %v: tensor<1x8x2x8xf32>) -> tensor<1x8x4x8xf32> {
  %o = parax.attention %q, %k, %v {causal, num_heads = 4, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64, parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}, {}]>]}
      : (tensor<1x8x4x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>) -> tensor<1x8x4x8xf32>
  return %o : tensor<1x8x4x8xf32>
}

// -----

parax.grid @g(ep = 4)
// Expert parallelism: the router stays replicated; the experts' stacked
// weights split over ep (2 of 8 experts per rank); tokens go to their
// experts' ranks and back: exactly two all-to-alls (dispatch, combine).
// CHECK-LABEL: func.func @expert_parallel
// CHECK-SAME: tensor<2x16x8xf32> {parax.global_sharding = #parax.sharding<@g, [{ep}, {}, {}]>
// CHECK: parax.router softmax
// CHECK: parax.moe_dispatch {{.*}} over @g ["ep"] {num_experts = 8 : i64} : (tensor<1x4x8xf32>, tensor<1x4x2xf32>, tensor<1x4x2xi32>) -> (tensor<32x8xf32>, tensor<32x1xf32>, tensor<32x1xi32>)
// CHECK: parax.experts {{.*}} : (tensor<32x8xf32>, tensor<32x1xf32>, tensor<32x1xi32>, tensor<2x16x8xf32>, tensor<2x16x8xf32>, tensor<2x8x16xf32>) -> tensor<32x8xf32>
// CHECK: parax.moe_combine {{.*}} over @g ["ep"] {num_experts = 8 : i64} : (tensor<32x8xf32>, tensor<1x4x2xi32>) -> tensor<1x4x8xf32>
// CHECK-NOT: parax.moe_dispatch
// CHECK: return
func.func @expert_parallel(%x: tensor<1x4x8xf32>, %gate: tensor<8x8xf32> {parax.param = "gate"},
    %wg: tensor<8x16x8xf32> {parax.param = "e.{e}.w1", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>},
    %wu: tensor<8x16x8xf32> {parax.param = "e.{e}.w3", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>},
    %wd: tensor<8x8x16xf32> {parax.param = "e.{e}.w2", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>}) -> tensor<1x4x8xf32> {
  %w, %i = parax.router softmax %x, %gate {num_experts = 8, top_k = 2, normalize} : (tensor<1x4x8xf32>, tensor<8x8xf32>) -> (tensor<1x4x2xf32>, tensor<1x4x2xi32>)
  %y = parax.experts %x, %w, %i, %wg, %wu, %wd : (tensor<1x4x8xf32>, tensor<1x4x2xf32>, tensor<1x4x2xi32>, tensor<8x16x8xf32>, tensor<8x16x8xf32>, tensor<8x8x16xf32>) -> tensor<1x4x8xf32>
  return %y : tensor<1x4x8xf32>
}

// -----

parax.grid @g(ep = 4)
// The plan's expert capacity sizes the exchange: 1.5 x a rank's 8 (token,
// choice) pairs = 12 rows a rank, not the 32 every routing could need.
// CHECK-LABEL: func.func @expert_capacity
// CHECK: parax.moe_dispatch {{.*}} -> (tensor<12x8xf32>, tensor<12x1xf32>, tensor<12x1xi32>)
// CHECK: parax.experts {{.*}} -> tensor<12x8xf32>
// CHECK: parax.moe_combine {{.*}} : (tensor<12x8xf32>, tensor<1x4x2xi32>) -> tensor<1x4x8xf32>
func.func @expert_capacity(%x: tensor<1x4x8xf32>, %w: tensor<1x4x2xf32>, %i: tensor<1x4x2xi32>,
    %wg: tensor<8x16x8xf32> {parax.param = "e.{e}.w1", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>},
    %wu: tensor<8x16x8xf32> {parax.param = "e.{e}.w3", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>},
    %wd: tensor<8x8x16xf32> {parax.param = "e.{e}.w2", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>}) -> tensor<1x4x8xf32>
    attributes {parax.plan = #parax.plan<ep = 4, expert_capacity = 1.5 : f64>} {
  %y = parax.experts %x, %w, %i, %wg, %wu, %wd : (tensor<1x4x8xf32>, tensor<1x4x2xf32>, tensor<1x4x2xi32>, tensor<8x16x8xf32>, tensor<8x16x8xf32>, tensor<8x8x16xf32>) -> tensor<1x4x8xf32>
  return %y : tensor<1x4x8xf32>
}

// -----

parax.grid @g(tp = 4)
// Fewer KV heads (2) than ranks (4): KV heads stay whole on every rank, each
// rank's query heads (2 of 8) name their global position for the mapping.
// The inputs arrive as the attention reads them: q split by heads, k and v
// whole.
// CHECK-LABEL: func.func @kv_heads_replicated
// CHECK-SAME: %arg0: tensor<1x8x2x8xf32> {parax.global_sharding = #parax.sharding<@g, [{}, {}, {tp}, {}]>
// CHECK-SAME: %arg1: tensor<1x8x2x8xf32> {parax.global_sharding = #parax.sharding<@g, [{}, {}, {}, {}]>
// CHECK-NOT: parax.shard_slice
// CHECK: parax.attention {{.*}}head_axes = ["tp"], head_dim = 8 : i64, head_grid = @g, num_heads = 2 : i64, num_kv_heads = 2 : i64{{.*}} : (tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>) -> tensor<1x8x2x8xf32>
func.func @kv_heads_replicated(%q: tensor<1x8x8x8xf32>, %k: tensor<1x8x2x8xf32>, %v: tensor<1x8x2x8xf32>) -> tensor<1x8x8x8xf32> {
  %o = parax.attention %q, %k, %v {causal, num_heads = 8, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64, parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}, {}]>]}
      : (tensor<1x8x8x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>) -> tensor<1x8x8x8xf32>
  return %o : tensor<1x8x8x8xf32>
}

// -----

parax.grid @g(tp = 2)
// Multi-head latent attention's absorbed form: each rank its heads and their
// slices of the per-head weights (into the latent, attention over the one
// latent KV head every rank keeps, back out), then the row-parallel output
// projection: one all-reduce, nothing gathered.
// CHECK-LABEL: func.func @absorbed_latent_attention
// CHECK-SAME: tensor<2x8x16xf32> {parax.global_sharding = #parax.sharding<@g, [{tp}, {}, {}]>, parax.param = "w_uk"}
// CHECK-SAME: tensor<2x4x16xf32> {parax.global_sharding = #parax.sharding<@g, [{tp}, {}, {}]>, parax.param = "w_uv"}
// CHECK: parax.head_linear {{.*}} : (tensor<1x1x2x8xf32>, tensor<2x8x16xf32>) -> tensor<1x1x2x16xf32>
// CHECK: parax.attention {{.*}}head_axes = ["tp"]{{.*}}num_heads = 2 : i64, num_kv_heads = 1 : i64{{.*}} -> tensor<1x1x2x16xf32>
// CHECK: parax.head_linear {{.*}} {transpose_w} : (tensor<1x1x2x16xf32>, tensor<2x4x16xf32>) -> tensor<1x1x2x4xf32>
// CHECK-NOT: parax.all_gather
// CHECK-COUNT-1: parax.all_reduce
// CHECK-NOT: parax.all_gather
// CHECK: return
func.func @absorbed_latent_attention(%q: tensor<1x1x4x8xf32>, %k: tensor<1x5x1x16xf32>, %v: tensor<1x5x1x16xf32>,
    %uk: tensor<4x8x16xf32> {parax.param = "w_uk", parax.sharding = #parax.sharding<@g, [{tp}, {}, {}]>},
    %uv: tensor<4x4x16xf32> {parax.param = "w_uv", parax.sharding = #parax.sharding<@g, [{tp}, {}, {}]>},
    %o: tensor<8x16xf32> {parax.param = "o", parax.sharding = #parax.sharding<@g, [{}, {tp}]>}) -> tensor<1x1x8xf32> {
  %ql = parax.head_linear %q, %uk {parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}, {}]>]} : (tensor<1x1x4x8xf32>, tensor<4x8x16xf32>) -> tensor<1x1x4x16xf32>
  %a = parax.attention %ql, %k, %v {causal, num_heads = 4, num_kv_heads = 1, head_dim = 16, scale = 0.35 : f64, parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}, {}]>]}
      : (tensor<1x1x4x16xf32>, tensor<1x5x1x16xf32>, tensor<1x5x1x16xf32>) -> tensor<1x1x4x16xf32>
  %h = parax.head_linear %a, %uv {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}, {}]>]} : (tensor<1x1x4x16xf32>, tensor<4x4x16xf32>) -> tensor<1x1x4x4xf32>
  %r = parax.reshape %h {parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}]>]} : (tensor<1x1x4x4xf32>) -> tensor<1x1x16xf32>
  %y = parax.linear %r, %o {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {}], partial = {tp}>]} : (tensor<1x1x16xf32>, tensor<8x16xf32>) -> tensor<1x1x8xf32>
  return %y : tensor<1x1x8xf32>
}

// -----

parax.grid @g(pp = 2, dp = 2, tp = 2)
// All three at once (dp2 x tp2 x pp2, 8 ranks): the batch split over dp, a
// Megatron MLP per stage over tp, one send/recv pair between the stages.
// CHECK-LABEL: func.func @three_d_stage0
// CHECK-SAME: %{{.*}}: tensor<2x4x16xf32>
// CHECK: parax.linear {{.*}} -> tensor<2x4x32xf32>
// CHECK: parax.linear {{.*}} -> tensor<2x4x16xf32>
// CHECK: parax.all_reduce {{.*}} over @g ["tp"] : tensor<2x4x16xf32>
// CHECK: parax.send {{.*}} over @g ["pp"] to 1 : tensor<2x4x16xf32>
// CHECK-LABEL: func.func @three_d_stage1
// CHECK: parax.recv over @g ["pp"] from 0 : tensor<2x4x16xf32>
// CHECK: parax.all_reduce {{.*}} over @g ["tp"] : tensor<2x4x16xf32>
// CHECK: parax.all_gather {{.*}} over @g ["dp"] dim 0 : tensor<2x4x16xf32> -> tensor<4x4x16xf32>
// CHECK: return {{.*}} : tensor<4x4x16xf32>
func.func @three_d(%x: tensor<4x4x16xf32> {parax.sharding = #parax.sharding<@g, [{dp}, {}, {}]>},
    %a0: tensor<64x16xf32> {parax.param = "a0", parax.sharding = #parax.sharding<@g, [{tp}, {}]>},
    %b0: tensor<16x64xf32> {parax.param = "b0", parax.sharding = #parax.sharding<@g, [{}, {tp}]>},
    %a1: tensor<64x16xf32> {parax.param = "a1", parax.sharding = #parax.sharding<@g, [{tp}, {}]>},
    %b1: tensor<16x64xf32> {parax.param = "b1", parax.sharding = #parax.sharding<@g, [{}, {tp}]>}) -> tensor<4x4x16xf32> {
  %h0 = parax.linear %x, %a0 {transpose_w, parax.stage = 0 : i64, parax.shardings = [#parax.sharding<@g, [{dp}, {}, {tp}]>]} : (tensor<4x4x16xf32>, tensor<64x16xf32>) -> tensor<4x4x64xf32>
  %y0 = parax.linear %h0, %b0 {transpose_w, parax.stage = 0 : i64, parax.shardings = [#parax.sharding<@g, [{dp}, {}, {}], partial = {tp}>]} : (tensor<4x4x64xf32>, tensor<16x64xf32>) -> tensor<4x4x16xf32>
  %r0 = parax.add %x, %y0 {parax.stage = 0 : i64, parax.shardings = [#parax.sharding<@g, [{dp}, {}, {}]>]} : (tensor<4x4x16xf32>, tensor<4x4x16xf32>) -> tensor<4x4x16xf32>
  %h1 = parax.linear %r0, %a1 {transpose_w, parax.stage = 1 : i64, parax.shardings = [#parax.sharding<@g, [{dp}, {}, {tp}]>]} : (tensor<4x4x16xf32>, tensor<64x16xf32>) -> tensor<4x4x64xf32>
  %y1 = parax.linear %h1, %b1 {transpose_w, parax.stage = 1 : i64, parax.shardings = [#parax.sharding<@g, [{dp}, {}, {}], partial = {tp}>]} : (tensor<4x4x64xf32>, tensor<16x64xf32>) -> tensor<4x4x16xf32>
  return %y1 : tensor<4x4x16xf32>
}

// -----

parax.grid @g(cp = 2)
// Context parallelism: the sequence split from the embedding on. Each rank
// keeps its piece of the queries; the keys and values (after RoPE) are
// gathered for attention, and rope, attention and the position table know
// their piece (seq_axes). Nothing else moves until the logits leave.
// CHECK-LABEL: func.func @context_parallel
// CHECK-SAME: %arg0: tensor<2x4xi32> {parax.global_sharding = #parax.sharding<@g, [{}, {cp}]>, parax.input = 0 : i64}
// CHECK: parax.position_embedding {{.*}}seq_axes = ["cp"], seq_grid = @g{{.*}} -> tensor<1x4x16xf32>
// CHECK: parax.rope {{.*}}seq_axes = ["cp"], seq_grid = @g{{.*}} -> tensor<2x4x2x8xf32>
// CHECK: parax.rope {{.*}}seq_axes = ["cp"], seq_grid = @g{{.*}} -> tensor<2x4x2x8xf32>
// CHECK-NOT: parax.all_gather
// CHECK-COUNT-2: parax.all_gather {{.*}} over @g ["cp"] dim 1 : tensor<2x4x2x8xf32> -> tensor<2x8x2x8xf32>
// CHECK: parax.attention {{.*}}seq_axes = ["cp"], seq_grid = @g{{.*}} -> tensor<2x4x2x8xf32>
// CHECK-NOT: parax.all_gather {{.*}} dim 1 : tensor<2x4x16
// CHECK: parax.all_gather {{.*}} over @g ["cp"] dim 1 : tensor<2x4x16xf32> -> tensor<2x8x16xf32>
// CHECK-NEXT: return
func.func @context_parallel(%ids: tensor<2x8xi32>, %wte: tensor<32x16xf32> {parax.param = "wte"},
    %wpe: tensor<8x16xf32> {parax.param = "wpe"}, %wq: tensor<16x16xf32> {parax.param = "wq"}) -> tensor<2x8x16xf32> {
  %e = parax.embedding %ids, %wte {parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}]>]} : (tensor<2x8xi32>, tensor<32x16xf32>) -> tensor<2x8x16xf32>
  %p = parax.position_embedding %wpe {parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}]>]} : (tensor<8x16xf32>) -> tensor<1x8x16xf32>
  %x = parax.add %e, %p : (tensor<2x8x16xf32>, tensor<1x8x16xf32>) -> tensor<2x8x16xf32>
  %h = parax.linear %x, %wq {transpose_w} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %q = parax.reshape %h : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %qr = parax.rope %q {theta = 1.0e4 : f64, rotary_dim = 8} : (tensor<2x8x2x8xf32>) -> tensor<2x8x2x8xf32>
  %kr = parax.rope %q {theta = 1.0e4 : f64, rotary_dim = 8} : (tensor<2x8x2x8xf32>) -> tensor<2x8x2x8xf32>
  %o = parax.attention %qr, %kr, %q {causal, num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> tensor<2x8x2x8xf32>
  %y = parax.reshape %o : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  return %y : tensor<2x8x16xf32>
}

// -----

parax.grid @g(cp = 2) {cyclic_axes = ["cp"]}
// A cyclic axis deals the sequence out position by position: the tokens are
// read whole (a rank loads a block of an argument), the embedding's rows
// dealt out in the program (viewed [2, 4, 2, 16], this rank's index of the
// inner 2 kept); keys and values gathered back into place the same way;
// rope and attention know their positions are strided (seq_cyclic).
// CHECK-LABEL: func.func @cyclic_context_parallel
// CHECK-SAME: %arg0: tensor<2x8xi32> {parax.input = 0 : i64}
// CHECK: parax.reshape {{.*}} : (tensor<2x8x16xf32>) -> tensor<2x4x2x16xf32>
// CHECK-NEXT: parax.shard_slice {{.*}} over @g ["cp"] dim 2 : tensor<2x4x2x16xf32> -> tensor<2x4x1x16xf32>
// CHECK-NEXT: parax.reshape {{.*}} -> tensor<2x4x16xf32>
// CHECK: parax.rope {{.*}}seq_axes = ["cp"], seq_cyclic, seq_grid = @g
// CHECK: parax.reshape {{.*}} : (tensor<2x4x2x8xf32>) -> tensor<2x4x1x2x8xf32>
// CHECK-NEXT: parax.all_gather {{.*}} over @g ["cp"] dim 2 : tensor<2x4x1x2x8xf32> -> tensor<2x4x2x2x8xf32>
// CHECK-NEXT: parax.reshape {{.*}} -> tensor<2x8x2x8xf32>
// CHECK: parax.attention {{.*}}seq_axes = ["cp"], seq_cyclic, seq_grid = @g{{.*}} -> tensor<2x4x2x8xf32>
// CHECK: parax.all_gather {{.*}} over @g ["cp"] dim 2 : tensor<2x4x1x16xf32> -> tensor<2x4x2x16xf32>
// CHECK-NEXT: parax.reshape {{.*}} -> tensor<2x8x16xf32>
// CHECK-NEXT: return
func.func @cyclic_context_parallel(%ids: tensor<2x8xi32>, %wte: tensor<32x16xf32> {parax.param = "wte"},
    %wn: tensor<16xf32> {parax.param = "wn"}, %wq: tensor<16x16xf32> {parax.param = "wq"}) -> tensor<2x8x16xf32> {
  %e = parax.embedding %ids, %wte : (tensor<2x8xi32>, tensor<32x16xf32>) -> tensor<2x8x16xf32>
  %x = parax.rms_norm %e, %wn {eps = 1.0e-5 : f64, parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}]>]} : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %h = parax.linear %x, %wq {transpose_w} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %q = parax.reshape %h : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %qr = parax.rope %q {theta = 1.0e4 : f64, rotary_dim = 8} : (tensor<2x8x2x8xf32>) -> tensor<2x8x2x8xf32>
  %o = parax.attention %qr, %qr, %qr {causal, num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> tensor<2x8x2x8xf32>
  %y = parax.reshape %o : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  return %y : tensor<2x8x16xf32>
}

// -----

parax.grid @g(pp = 2)
// A value flowing back to an earlier stage (as a gradient does): sent by
// the later stage once made, received by the earlier one when first needed,
// after it has sent what the later stage waits for.
// CHECK-LABEL: func.func @back_and_forth_stage0
// CHECK: parax.silu
// CHECK-NEXT: parax.send {{.*}} to 1
// CHECK-NEXT: parax.recv {{.*}} from 1
// CHECK-NEXT: parax.silu
// CHECK-NEXT: parax.send {{.*}} to 1
// CHECK-LABEL: func.func @back_and_forth_stage1
// CHECK: parax.recv {{.*}} from 0
// CHECK-NEXT: parax.silu
// CHECK-NEXT: parax.send {{.*}} to 0
// CHECK-NEXT: parax.recv {{.*}} from 0
// CHECK-NEXT: return
func.func @back_and_forth(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = parax.silu %x {parax.stage = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %b = parax.silu %a {parax.stage = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %c = parax.silu %b {parax.stage = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %c : tensor<4xf32>
}

// -----

parax.grid @g(pp = 2)
// Interleaved chunks: four virtual stages on a pp axis of 2, virtual stage
// c on stage c % 2. Each stage's function holds its two chunks; the second
// chunk's forward pass begins at a receive marked range_start (the first
// chunk's begins the program), and the last chunk's activations travel
// from stage 1 back to stage 0.
// CHECK-LABEL: func.func @chunks_stage0
// CHECK-SAME: parax.pipeline = #parax.pipeline<stage = 0, stages = 2, chunks = 2>
// CHECK: parax.silu
// CHECK-NEXT: parax.send {{.*}} to 1
// CHECK-NEXT: parax.recv {{.*}} from 1 {range_start}
// CHECK-NEXT: parax.silu
// CHECK-NEXT: parax.send {{.*}} to 1
// CHECK-NEXT: return
// CHECK-LABEL: func.func @chunks_stage1
// CHECK-SAME: parax.pipeline = #parax.pipeline<stage = 1, stages = 2, chunks = 2>
// CHECK: parax.recv {{.*}} from 0 :
// CHECK-NEXT: parax.silu
// CHECK-NEXT: parax.send {{.*}} to 0
// CHECK-NEXT: parax.recv {{.*}} from 0 {range_start}
// CHECK-NEXT: parax.silu
// CHECK-NEXT: return
func.func @chunks(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = parax.silu %x {parax.stage = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %b = parax.silu %a {parax.stage = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %c = parax.silu %b {parax.stage = 2 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %d = parax.silu %c {parax.stage = 3 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %d : tensor<4xf32>
}

// -----

parax.grid @g(tp = 2)
// A split value read whole by one op and as a partial sum by another (a
// residual added to a row-parallel output): one all-gather; the partial
// sum is that gathered copy kept on one rank (it used to be gathered a
// second time).
// CHECK-LABEL: func.func @gathered_once
// CHECK: %[[H:.*]] = parax.silu
// CHECK-NEXT: %[[WHOLE:.*]] = parax.all_gather %[[H]] over @g ["tp"] dim 2
// CHECK-NOT: parax.all_gather
// CHECK: parax.to_partial %[[WHOLE]] over @g ["tp"]
// CHECK-NOT: parax.all_gather
// CHECK: return
func.func @gathered_once(%x: tensor<2x8x16xf32> {parax.sharding = #parax.sharding<@g, [{}, {}, {tp}]>},
    %w: tensor<16x16xf32> {parax.param = "w", parax.sharding = #parax.sharding<@g, [{}, {tp}]>}) -> tensor<2x8x16xf32> {
  %h = parax.silu %x {parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}]>]} : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %n = parax.silu %h {parax.shardings = [#parax.sharding<@g, [{}, {}, {}]>]} : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %y = parax.linear %n, %w {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {}], partial = {tp}>]} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %r = parax.add %h, %y {parax.shardings = [#parax.sharding<@g, [{}, {}, {}], partial = {tp}>]} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %r : tensor<2x8x16xf32>
}

// -----

parax.grid @g(cp = 2, tp = 2)
// A value split over tp (an embedding's hidden columns) read whole by one
// op (a norm) and split over the sequence by a later one (a residual add
// under sequence parallelism): the second takes its share of the gathered
// copy locally (it used to move the original by an all-to-all). Under cp
// the "whole" copy is still split over cp: any copy the wanted layout
// slices is taken.
// CHECK-LABEL: func.func @sliced_from_the_gathered_copy
// CHECK: %[[H:.*]] = parax.silu
// CHECK-NEXT: %[[WHOLE:.*]] = parax.all_gather %[[H]] over @g ["tp"] dim 2 : tensor<2x4x8xf32> -> tensor<2x4x16xf32>
// CHECK-NOT: parax.all_to_all
// CHECK: %[[MINE:.*]] = parax.shard_slice %[[WHOLE]] over @g ["tp"] dim 1 : tensor<2x4x16xf32> -> tensor<2x2x16xf32>
// CHECK-NOT: parax.all_to_all
// CHECK: parax.add %[[MINE]],
func.func @sliced_from_the_gathered_copy(%x: tensor<2x8x16xf32> {parax.sharding = #parax.sharding<@g, [{}, {cp}, {tp}]>},
    %w: tensor<16x16xf32> {parax.param = "w", parax.sharding = #parax.sharding<@g, [{}, {tp}]>}) -> tensor<2x8x16xf32> {
  %h = parax.silu %x {parax.shardings = [#parax.sharding<@g, [{}, {cp}, {tp}]>]} : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %n = parax.silu %h {parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}]>]} : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %y = parax.linear %n, %w {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}], partial = {tp}>]} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %r = parax.add %h, %y {parax.shardings = [#parax.sharding<@g, [{}, {cp, tp}, {}]>]} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %r : tensor<2x8x16xf32>
}

// -----

parax.grid @g(tp = 2)
// Two partial sums over the same ranks added where the sum is wanted
// whole (a loss of two cross-entropies): added as they are, the sum
// all-reduced once (it used to be one all-reduce each, then the add).
// CHECK-LABEL: func.func @partials_added_then_reduced
// CHECK-NOT: parax.all_reduce
// CHECK: %[[SUM:.*]] = parax.add
// CHECK-NEXT: %[[WHOLE:.*]] = parax.all_reduce %[[SUM]] over @g ["tp"]
// CHECK-NOT: parax.all_reduce
// CHECK: return %[[WHOLE]]
func.func @partials_added_then_reduced(%x: tensor<2x8x16xf32> {parax.sharding = #parax.sharding<@g, [{}, {}, {tp}]>},
    %w1: tensor<16x16xf32> {parax.param = "w1", parax.sharding = #parax.sharding<@g, [{}, {tp}]>},
    %w2: tensor<16x16xf32> {parax.param = "w2", parax.sharding = #parax.sharding<@g, [{}, {tp}]>}) -> tensor<2x8x16xf32> {
  %a = parax.linear %x, %w1 {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {}], partial = {tp}>]} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %b = parax.linear %x, %w2 {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {}], partial = {tp}>]} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %r = parax.add %a, %b {parax.shardings = [#parax.sharding<@g, [{}, {}, {}]>]} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %r : tensor<2x8x16xf32>
}
