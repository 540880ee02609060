// RUN: parax-opt %s -split-input-file --parax-autodiff --parax-partition | FileCheck %s
// RUN: parax-opt %s -split-input-file --parax-autodiff --parax-partition=vocab-parallel=false | FileCheck %s --check-prefix=GATHER

// The backward pass takes its layouts from propagation: gradients flow
// through the same splits as the forward pass, and a weight's gradient,
// summed over tokens, is a partial sum over the axes that split them.

parax.grid @g(tp = 4)
// Megatron's MLP: the forward's one all-reduce (the row-parallel output);
// backward, the column/row pair runs in reverse with no communication
// (the input's gradient is not needed: a data input), each weight's
// gradient computed in its own split and returned in it, where the
// optimizer updates the weight's box: no gather. Each result says which
// of the model's results it is and where its box lies.
// CHECK-LABEL: func.func @mlp
// CHECK-SAME: -> (tensor<f32> {parax.result = 0 : i64},
// CHECK-SAME: tensor<64x16xf32> {parax.global_sharding = #parax.sharding<@g, [{tp}, {}]>, parax.grad = "up", parax.result = 1 : i64},
// CHECK-SAME: tensor<16x64xf32> {parax.global_sharding = #parax.sharding<@g, [{}, {tp}]>, parax.grad = "down", parax.result = 2 : i64})
// CHECK: parax.all_reduce
// CHECK: parax.cross_entropy_grad
// CHECK-NOT: parax.all_reduce
// CHECK-NOT: parax.all_gather
// CHECK: parax.linear_weight_grad {{.*}} -> tensor<16x64xf32>
// CHECK: parax.linear_weight_grad {{.*}} -> tensor<64x16xf32>
// CHECK-NEXT: return
func.func @mlp(%x: tensor<2x8x16xf32>, %labels: tensor<2x8xi32>,
    %up: tensor<256x16xf32> {parax.param = "up", parax.sharding = #parax.sharding<@g, [{tp}, {}]>},
    %down: tensor<16x256xf32> {parax.param = "down", parax.sharding = #parax.sharding<@g, [{}, {tp}]>}) -> tensor<f32> {
  %h = parax.linear %x, %up {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}]>]} : (tensor<2x8x16xf32>, tensor<256x16xf32>) -> tensor<2x8x256xf32>
  %y = parax.linear %h, %down {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {}], partial = {tp}>]} : (tensor<2x8x256xf32>, tensor<16x256xf32>) -> tensor<2x8x16xf32>
  %l = parax.cross_entropy %y, %labels : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

parax.grid @g(dp = 2, tp = 2)
// Tokens split over dp (here an axis of the program, as expert
// parallelism's is), the labels too: the loss and its gradient are
// computed on each rank's tokens (num_tokens: the whole mean's count), the
// loss a partial sum over dp; each weight's gradient is a partial sum over
// dp too, and returned so (the runtime sums it with its data-parallel
// reduction, once a step): one all-reduce over dp, the loss's; no logits
// gathered.
// CHECK-LABEL: func.func @tokens
// CHECK-SAME: tensor<128x16xf32> {parax.global_sharding = #parax.sharding<@g, [{tp}, {}], partial = {dp}>, parax.grad = "up"
// CHECK-SAME: tensor<16x128xf32> {parax.global_sharding = #parax.sharding<@g, [{}, {tp}], partial = {dp}>, parax.grad = "down"
// CHECK-NOT: parax.all_gather
// CHECK: parax.cross_entropy {{.*}} {num_tokens = 16 : i64} : (tensor<1x8x16xf32>, tensor<1x8xi32>) -> tensor<f32>
// CHECK: parax.cross_entropy_grad {{.*}} {num_tokens = 16 : i64} : (tensor<1x8x16xf32>, tensor<1x8xi32>) -> tensor<1x8x16xf32>
// CHECK-NOT: parax.all_gather
// CHECK: parax.linear_weight_grad {{.*}} : (tensor<1x8x16xf32>, tensor<1x8x128xf32>) -> tensor<128x16xf32>
// CHECK-COUNT-1: parax.all_reduce {{.*}} over @g ["dp"] : tensor<f32>
// CHECK-NOT: parax.all_reduce
// CHECK: return
func.func @tokens(%x: tensor<2x8x16xf32> {parax.sharding = #parax.sharding<@g, [{dp}, {}, {}]>},
    %labels: tensor<2x8xi32> {parax.sharding = #parax.sharding<@g, [{dp}, {}]>},
    %up: tensor<256x16xf32> {parax.param = "up", parax.sharding = #parax.sharding<@g, [{tp}, {}]>},
    %down: tensor<16x256xf32> {parax.param = "down", parax.sharding = #parax.sharding<@g, [{}, {tp}]>}) -> tensor<f32> {
  %h = parax.linear %x, %up {transpose_w, parax.shardings = [#parax.sharding<@g, [{dp}, {}, {tp}]>]} : (tensor<2x8x16xf32>, tensor<256x16xf32>) -> tensor<2x8x256xf32>
  %y = parax.linear %h, %down {transpose_w, parax.shardings = [#parax.sharding<@g, [{dp}, {}, {}], partial = {tp}>]} : (tensor<2x8x256xf32>, tensor<16x256xf32>) -> tensor<2x8x16xf32>
  %l = parax.cross_entropy %y, %labels : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

parax.grid @g(dp = 2, tp = 2)
// A gradient whose dy is whole (the forward gathered its weight over tp)
// but whose parameter is split over tp: each rank slices dy (no transfer)
// and computes only its box, which is returned still a partial sum over dp
// -- no whole 16x16 gradient, no all-reduce of it: the loss's is the one.
// CHECK-LABEL: func.func @sliced
// CHECK-SAME: tensor<8x16xf32> {parax.global_sharding = #parax.sharding<@g, [{tp}, {}], partial = {dp}>, parax.grad = "w"
// CHECK: parax.all_gather {{.*}} over @g ["tp"]
// CHECK: %[[DY:.*]] = parax.cross_entropy_grad
// CHECK: %[[SLICE:.*]] = parax.shard_slice %[[DY]] over @g ["tp"] dim 2 : tensor<1x8x16xf32> -> tensor<1x8x8xf32>
// CHECK: %[[BOX:.*]] = parax.linear_weight_grad %{{.*}}, %[[SLICE]] {{.*}} -> tensor<8x16xf32>
// CHECK-NOT: tensor<16x16xf32>
// CHECK: parax.all_reduce {{.*}} over @g ["dp"] : tensor<f32>
// CHECK-NOT: parax.all_reduce
// CHECK: return %{{.*}}, %[[BOX]]
func.func @sliced(%x: tensor<2x8x16xf32> {parax.sharding = #parax.sharding<@g, [{dp}, {}, {}]>},
    %labels: tensor<2x8xi32> {parax.sharding = #parax.sharding<@g, [{dp}, {}]>},
    %w: tensor<16x16xf32> {parax.param = "w", parax.sharding = #parax.sharding<@g, [{tp}, {}]>}) -> tensor<f32> {
  %y = parax.linear %x, %w {transpose_w, parax.shardings = [#parax.sharding<@g, [{dp}, {}, {}]>]} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %l = parax.cross_entropy %y, %labels : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

parax.grid @g(tp = 2)
// A table split on its hidden dimension whose dy is a partial sum over tp
// (the head's dx): dy is reduce-scattered to the rank's columns and each
// rank computes its 32x8 box, where dy was all-reduced and the whole
// 32x16 gradient computed, then sliced.
// CHECK-LABEL: func.func @columns
// CHECK: %[[DY:.*]] = parax.reduce_scatter %{{.*}} over @g ["tp"] dim 2 : tensor<2x4x16xf32> -> tensor<2x4x8xf32>
// CHECK: %[[BOX:.*]] = parax.embedding_grad %arg0, %[[DY]] : (tensor<2x4xi32>, tensor<2x4x8xf32>) -> tensor<32x8xf32>
// CHECK-NOT: parax.all_reduce
// CHECK: return %{{.*}}, %[[BOX]],
func.func @columns(%ids: tensor<2x4xi32>, %labels: tensor<2x4xi32>,
    %embed: tensor<32x16xf32> {parax.param = "embed", parax.sharding = #parax.sharding<@g, [{}, {tp}]>},
    %head: tensor<32x16xf32> {parax.param = "head", parax.sharding = #parax.sharding<@g, [{tp}, {}]>}) -> tensor<f32> {
  %h = parax.embedding %ids, %embed {parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}]>]} : (tensor<2x4xi32>, tensor<32x16xf32>) -> tensor<2x4x16xf32>
  %y = parax.linear %h, %head {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {}]>]} : (tensor<2x4x16xf32>, tensor<32x16xf32>) -> tensor<2x4x32xf32>
  %l = parax.cross_entropy %y, %labels : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

parax.grid @g(tp = 2)
// A vocab-parallel table and head, and vocab-parallel cross-entropy: the
// logits stay split (no 2x4x32 gathered), every token's logsumexp over the
// whole vocabulary made of each rank's (a 2x4x1 gathered), the loss a
// partial sum over tp (one all-reduce of a scalar), dlogits the rank's
// columns, from which the head's gradient is its 16x16 box; the table's
// accumulates the rank's rows only (vocab_axes).
// CHECK-LABEL: func.func @rows
// CHECK-NOT: tensor<2x4x32xf32>
// CHECK: %[[PART:.*]] = parax.logsumexp %[[LOGITS:.*]] : (tensor<2x4x16xf32>) -> tensor<2x4x1xf32>
// CHECK: %[[PARTS:.*]] = parax.all_gather %[[PART]] over @g ["tp"] dim 2 : tensor<2x4x1xf32> -> tensor<2x4x2xf32>
// CHECK: %[[LSE:.*]] = parax.logsumexp %[[PARTS]] : (tensor<2x4x2xf32>) -> tensor<2x4x1xf32>
// CHECK: %[[LOSS:.*]] = parax.cross_entropy %[[LOGITS]], %arg1, %[[LSE]] {vocab_axes = ["tp"], vocab_grid = @g}
// CHECK: %[[DLOGITS:.*]] = parax.cross_entropy_grad %[[LOGITS]], %arg1, %[[LSE]] {vocab_axes = ["tp"], vocab_grid = @g} : {{.*}} -> tensor<2x4x16xf32>
// CHECK: %[[HEAD:.*]] = parax.linear_weight_grad %{{.*}}, %[[DLOGITS]] {transpose_w} : (tensor<2x4x16xf32>, tensor<2x4x16xf32>) -> tensor<16x16xf32>
// CHECK: %[[TABLE:.*]] = parax.embedding_grad %arg0, %{{.*}} {vocab_axes = ["tp"], vocab_grid = @g} : (tensor<2x4xi32>, tensor<2x4x16xf32>) -> tensor<16x16xf32>
// CHECK: %[[SUM:.*]] = parax.all_reduce %[[LOSS]] over @g ["tp"] : tensor<f32>
// CHECK-NOT: 32x16
// CHECK-NOT: tensor<2x4x32xf32>
// CHECK: return %[[SUM]], %[[TABLE]], %[[HEAD]]
// (vocab-parallel=false: the logits gathered, the loss over all of them)
// GATHER-LABEL: func.func @rows
// GATHER-NOT: parax.logsumexp
// GATHER: parax.all_gather %{{.*}} over @g ["tp"] dim 2 : tensor<2x4x16xf32> -> tensor<2x4x32xf32>
// GATHER: parax.cross_entropy %{{.*}}, %arg1 : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
// GATHER-NOT: parax.logsumexp
func.func @rows(%ids: tensor<2x4xi32>, %labels: tensor<2x4xi32>,
    %embed: tensor<32x16xf32> {parax.param = "embed", parax.sharding = #parax.sharding<@g, [{tp}, {}]>},
    %head: tensor<32x16xf32> {parax.param = "head", parax.sharding = #parax.sharding<@g, [{tp}, {}]>}) -> tensor<f32> {
  %h = parax.embedding %ids, %embed {parax.shardings = [#parax.sharding<@g, [{}, {}, {}], partial = {tp}>]} : (tensor<2x4xi32>, tensor<32x16xf32>) -> tensor<2x4x16xf32>
  %y = parax.linear %h, %head {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}]>]} : (tensor<2x4x16xf32>, tensor<32x16xf32>) -> tensor<2x4x32xf32>
  %l = parax.cross_entropy %y, %labels : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

parax.grid @g(cp = 2) {cyclic_axes = ["cp"]}
// Context parallelism: the table's gradient from each rank's positions.
// The ids (loaded whole, as the embedding reads them) are dealt out as dy
// arrives, cyclically, and the gradient is returned a partial sum over cp
// (summed by the runtime's reduction), where dy was all-gathered over cp
// and every rank summed every position.
// CHECK-LABEL: func.func @positions
// CHECK-SAME: tensor<32x16xf32> {parax.global_sharding = #parax.sharding<@g, [{}, {}], partial = {cp}>, parax.grad = "embed"
// CHECK: %[[DX:.*]] = parax.linear %{{.*}}, %arg3 : (tensor<1x4x32xf32>, tensor<32x16xf32>) -> tensor<1x4x16xf32>
// CHECK: %[[DEALT:.*]] = parax.reshape %arg0 : (tensor<1x8xi32>) -> tensor<1x4x2xi32>
// CHECK: %[[MINE:.*]] = parax.shard_slice %[[DEALT]] over @g ["cp"] dim 2
// CHECK: %[[IDS:.*]] = parax.reshape %[[MINE]] : (tensor<1x4x1xi32>) -> tensor<1x4xi32>
// CHECK: %[[TABLE:.*]] = parax.embedding_grad %[[IDS]], %[[DX]] : (tensor<1x4xi32>, tensor<1x4x16xf32>) -> tensor<32x16xf32>
// CHECK-NOT: parax.all_gather
// CHECK: return %{{.*}}, %[[TABLE]],
func.func @positions(%ids: tensor<1x8xi32>, %labels: tensor<1x8xi32>,
    %embed: tensor<32x16xf32> {parax.param = "embed"},
    %head: tensor<32x16xf32> {parax.param = "head"}) -> tensor<f32> {
  %h = parax.embedding %ids, %embed : (tensor<1x8xi32>, tensor<32x16xf32>) -> tensor<1x8x16xf32>
  %y = parax.linear %h, %head {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}]>]} : (tensor<1x8x16xf32>, tensor<32x16xf32>) -> tensor<1x8x32xf32>
  %l = parax.cross_entropy %y, %labels : (tensor<1x8x32xf32>, tensor<1x8xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

parax.grid @g(cp = 2) {cyclic_axes = ["cp"]}
// Context parallelism: attention's dk and dv, partial sums over the keys'
// whole sequence, are reduce-scattered back to the keys' and values' own
// positions (cyclically, as the forward pass gathered them), so the K and
// V projections' backward runs on a rank's 4 positions: no all-reduce of
// dk or dv, no gather of the normed input for their weights' gradients,
// no whole-sequence dx. The embedding looks up this rank's ids only (dealt
// out once, for the forward pass and the table's gradient alike).
// CHECK-LABEL: func.func @keys
// CHECK: %[[DEALT:.*]] = parax.shard_slice {{.*}} over @g ["cp"] dim 2 : tensor<1x4x2xi32> -> tensor<1x4x1xi32>
// CHECK: %[[IDS:.*]] = parax.reshape %[[DEALT]] : (tensor<1x4x1xi32>) -> tensor<1x4xi32>
// CHECK: parax.embedding %[[IDS]], {{.*}} -> tensor<1x4x16xf32>
// CHECK-COUNT-2: parax.all_gather {{.*}} over @g ["cp"] dim 2 : tensor<1x4x1x2x8xf32> -> tensor<1x4x2x2x8xf32>
// CHECK: parax.attention_grad
// CHECK-NOT: parax.all_reduce {{.*}}x8xf32>
// CHECK-NOT: parax.all_gather
// CHECK-COUNT-2: parax.reduce_scatter {{.*}} over @g ["cp"] dim 2 : tensor<1x4x2x2x8xf32> -> tensor<1x4x1x2x8xf32>
// CHECK-NOT: parax.all_gather
// CHECK-COUNT-3: parax.linear_weight_grad {{.*}} : (tensor<1x4x16xf32>, tensor<1x4x16xf32>) -> tensor<16x16xf32>
// CHECK-NOT: parax.all_gather
// CHECK: parax.rms_norm_grad {{.*}} -> tensor<1x4x16xf32>
// CHECK: parax.embedding_grad %[[IDS]], {{.*}} : (tensor<1x4xi32>, tensor<1x4x16xf32>) -> tensor<32x16xf32>
// CHECK: parax.all_reduce {{.*}} over @g ["cp"] : tensor<f32> -> tensor<f32>
// CHECK-NOT: parax.all_reduce
// CHECK: return
func.func @keys(%ids: tensor<1x8xi32>, %labels: tensor<1x8xi32>,
    %wte: tensor<32x16xf32> {parax.param = "wte"}, %wn: tensor<16xf32> {parax.param = "wn"},
    %wq: tensor<16x16xf32> {parax.param = "wq"}, %wk: tensor<16x16xf32> {parax.param = "wk"},
    %wv: tensor<16x16xf32> {parax.param = "wv"}, %head: tensor<32x16xf32> {parax.param = "head"}) -> tensor<f32> {
  %e = parax.embedding %ids, %wte {parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}]>]} : (tensor<1x8xi32>, tensor<32x16xf32>) -> tensor<1x8x16xf32>
  %x = parax.rms_norm %e, %wn {eps = 1.0e-5 : f64, parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}]>]} : (tensor<1x8x16xf32>, tensor<16xf32>) -> tensor<1x8x16xf32>
  %hq = parax.linear %x, %wq {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}]>]} : (tensor<1x8x16xf32>, tensor<16x16xf32>) -> tensor<1x8x16xf32>
  %hk = parax.linear %x, %wk {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}]>]} : (tensor<1x8x16xf32>, tensor<16x16xf32>) -> tensor<1x8x16xf32>
  %hv = parax.linear %x, %wv {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}]>]} : (tensor<1x8x16xf32>, tensor<16x16xf32>) -> tensor<1x8x16xf32>
  %q = parax.reshape %hq {parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}, {}]>]} : (tensor<1x8x16xf32>) -> tensor<1x8x2x8xf32>
  %k = parax.reshape %hk {parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}, {}]>]} : (tensor<1x8x16xf32>) -> tensor<1x8x2x8xf32>
  %v = parax.reshape %hv {parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}, {}]>]} : (tensor<1x8x16xf32>) -> tensor<1x8x2x8xf32>
  %o = parax.attention %q, %k, %v {causal, num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64, parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}, {}]>]} : (tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>) -> tensor<1x8x2x8xf32>
  %y = parax.reshape %o {parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}]>]} : (tensor<1x8x2x8xf32>) -> tensor<1x8x16xf32>
  %logits = parax.linear %y, %head {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}]>]} : (tensor<1x8x16xf32>, tensor<32x16xf32>) -> tensor<1x8x32xf32>
  %l = parax.cross_entropy %logits, %labels : (tensor<1x8x32xf32>, tensor<1x8xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

parax.grid @g(tp = 2)
// A norm's gradients read x as the forward norm read it: on its rows
// (sequence parallelism), though x, the embedding's result, is held split
// on the hidden size. The forward's all-to-all'd copy of x is reused, dy
// (a partial sum over tp from the column-parallel head) reduce-scattered
// to the rows; no gather of x, no all-reduce of dy.
// CHECK-LABEL: func.func @norm_rows
// CHECK: %[[E:.*]] = parax.embedding {{.*}} -> tensor<1x8x8xf32>
// CHECK: %[[ROWS:.*]] = parax.all_to_all %[[E]] over @g ["tp"] split 1 concat 2 : tensor<1x8x8xf32> -> tensor<1x4x16xf32>
// CHECK: parax.rms_norm %[[ROWS]]
// CHECK: %[[DY:.*]] = parax.reduce_scatter {{.*}} over @g ["tp"] dim 1 : tensor<1x8x16xf32> -> tensor<1x4x16xf32>
// CHECK: parax.rms_norm_grad %[[ROWS]], %{{.*}}, %[[DY]] {{.*}} -> tensor<1x4x16xf32>
// CHECK: parax.rms_norm_weight_grad %[[ROWS]], %[[DY]] {{.*}} -> tensor<16xf32>
// CHECK-NOT: parax.all_reduce {{.*}}x16xf32>
// CHECK: return
func.func @norm_rows(%ids: tensor<1x8xi32>, %labels: tensor<1x8xi32>,
    %wte: tensor<32x16xf32> {parax.param = "wte", parax.sharding = #parax.sharding<@g, [{}, {tp}]>},
    %wn: tensor<16xf32> {parax.param = "wn"},
    %head: tensor<32x16xf32> {parax.param = "head", parax.sharding = #parax.sharding<@g, [{tp}, {}]>}) -> tensor<f32> {
  %e = parax.embedding %ids, %wte {parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}]>]} : (tensor<1x8xi32>, tensor<32x16xf32>) -> tensor<1x8x16xf32>
  %x = parax.rms_norm %e, %wn {eps = 1.0e-5 : f64, parax.shardings = [#parax.sharding<@g, [{}, {tp}, {}]>]} : (tensor<1x8x16xf32>, tensor<16xf32>) -> tensor<1x8x16xf32>
  %logits = parax.linear %x, %head {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}]>]} : (tensor<1x8x16xf32>, tensor<32x16xf32>) -> tensor<1x8x32xf32>
  %l = parax.cross_entropy %logits, %labels : (tensor<1x8x32xf32>, tensor<1x8xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

parax.grid @g(tp = 2)
// A bias's gradient over tokens split on tp (sequence parallelism): its
// sum_to is a partial sum over tp and stays one through the reshape to
// the bias's shape; returned so (summed by the runtime's reduction), where
// it was all-reduced before the reshape, once a bias a microbatch.
// CHECK-LABEL: func.func @bias_rows
// CHECK-SAME: tensor<16xf32> {parax.global_sharding = #parax.sharding<@g, [{}], partial = {tp}>, parax.grad = "b"
// CHECK: parax.sum_to {{.*}} : (tensor<1x4x16xf32>) -> tensor<1x1x16xf32>
// CHECK-NEXT: parax.reshape {{.*}} : (tensor<1x1x16xf32>) -> tensor<16xf32>
// CHECK-NOT: parax.all_reduce {{.*}}16xf32>
// CHECK: return
func.func @bias_rows(%x: tensor<1x8x16xf32>, %labels: tensor<1x8xi32>,
    %w: tensor<16x16xf32> {parax.param = "w"}, %b: tensor<16xf32> {parax.param = "b"}) -> tensor<f32> {
  %y = parax.linear %x, %w, %b {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {tp}, {}]>]} : (tensor<1x8x16xf32>, tensor<16x16xf32>, tensor<16xf32>) -> tensor<1x8x16xf32>
  %l = parax.cross_entropy %y, %labels {parax.shardings = [#parax.sharding<@g, [], partial = {tp}>]} : (tensor<1x8x16xf32>, tensor<1x8xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

parax.grid @g(pp = 2)
// Pipeline stages: each gradient op runs in its forward op's stage. Stage
// 0 sends its activation forward, then receives the gradient by it (after
// sending: no stage waits for what it has not sent), computes its weight's
// gradient and returns it itself (result 1): a gradient stays with its
// parameter. The last stage returns the loss and its own weight's.
// CHECK-LABEL: func.func @stages_stage0
// CHECK-SAME: -> (tensor<32x16xf32> {parax.grad = "a", parax.result = 1 : i64})
// CHECK: parax.linear
// CHECK-NEXT: parax.send {{.*}} to 1
// CHECK-NEXT: parax.recv {{.*}} from 1
// CHECK-NEXT: parax.linear_weight_grad
// CHECK-NEXT: return
// CHECK-LABEL: func.func @stages_stage1
// CHECK-SAME: -> (tensor<f32> {parax.result = 0 : i64}, tensor<16x32xf32> {parax.grad = "b", parax.result = 2 : i64})
// CHECK: parax.recv {{.*}} from 0
// CHECK: parax.cross_entropy_grad
// CHECK: parax.send {{.*}} to 0
// CHECK-NOT: parax.recv
// CHECK: return
func.func @stages(%x: tensor<2x8x16xf32>, %labels: tensor<2x8xi32>,
    %a: tensor<32x16xf32> {parax.param = "a"},
    %b: tensor<16x32xf32> {parax.param = "b"}) -> tensor<f32> {
  %h = parax.linear %x, %a {transpose_w, parax.stage = 0 : i64} : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %y = parax.linear %h, %b {transpose_w, parax.stage = 1 : i64} : (tensor<2x8x32xf32>, tensor<16x32xf32>) -> tensor<2x8x16xf32>
  %l = parax.cross_entropy %y, %labels {parax.stage = 1 : i64} : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

parax.grid @g(pp = 2)
// A weight read by two stages (an embedding tied to the head): both hold
// it, and each returns its part of the gradient, the gradient of its own
// use, marked `parax.stage_part` (the runtime adds the parts once a
// step): no transfer of the weight's gradient between the stages.
// CHECK-LABEL: func.func @tied_stage0
// CHECK-SAME: -> (tensor<16x16xf32> {parax.grad = "w", parax.result = 1 : i64, parax.stage_part})
// CHECK-NOT: {{send|recv}}{{.*}}tensor<16x16xf32>
// CHECK: %[[PART0:.*]] = parax.linear_weight_grad
// CHECK-NEXT: return %[[PART0]]
// CHECK-LABEL: func.func @tied_stage1
// CHECK-SAME: -> (tensor<f32> {parax.result = 0 : i64}, tensor<16x16xf32> {parax.grad = "w", parax.result = 1 : i64, parax.stage_part})
// CHECK-NOT: {{send|recv}}{{.*}}tensor<16x16xf32>
// CHECK: %[[PART1:.*]] = parax.linear_weight_grad
// CHECK-NEXT: return %{{.*}}, %[[PART1]]
func.func @tied(%x: tensor<2x8x16xf32>, %labels: tensor<2x8xi32>,
    %w: tensor<16x16xf32> {parax.param = "w"}) -> tensor<f32> {
  %h = parax.linear %x, %w {transpose_w, parax.stage = 0 : i64} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %y = parax.linear %h, %w {transpose_w, parax.stage = 1 : i64} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %l = parax.cross_entropy %y, %labels {parax.stage = 1 : i64} : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %l : tensor<f32>
}
