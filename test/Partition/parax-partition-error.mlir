// RUN: parax-opt %s -split-input-file --parax-partition -verify-diagnostics

// Layouts no local program can compute, and inconsistent stage annotations,
// are errors at the op or function — never a crash or a silent replication.

parax.grid @g(tp = 4)
func.func @negative_norm_split_hidden(%x: tensor<2x16xf32>, %w: tensor<16xf32>) -> tensor<2x16xf32> {
  // expected-error @+1 {{cannot partition this op with result layout [{}, {tp}]: a norm needs its whole last dimension}}
  %y = parax.rms_norm %x, %w {eps = 1.0e-5 : f64, parax.shardings = [#parax.sharding<@g, [{}, {tp}]>]} : (tensor<2x16xf32>, tensor<16xf32>) -> tensor<2x16xf32>
  return %y : tensor<2x16xf32>
}

// -----

parax.grid @g(cp = 2)
func.func @negative_cache_attention_sequence(%q: tensor<1x8x4x8xf32>, %c: tensor<1x32x4x8xf32>, %p: tensor<i32>) -> tensor<1x8x4x8xf32> {
  // expected-error @+1 {{attention over a KV cache at a run-time position cannot split its queries over ranks}}
  %o = parax.attention %q, %c, %c, %p {causal, num_heads = 4, num_kv_heads = 4, head_dim = 8, scale = 0.35 : f64, parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}, {}]>]}
      : (tensor<1x8x4x8xf32>, tensor<1x32x4x8xf32>, tensor<1x32x4x8xf32>, tensor<i32>) -> tensor<1x8x4x8xf32>
  return %o : tensor<1x8x4x8xf32>
}

// -----

parax.grid @g(cp = 2)
func.func @negative_rope_at_a_position_split(%x: tensor<1x8x4x8xf32>, %p: tensor<i32>) -> tensor<1x8x4x8xf32> {
  // expected-error @+1 {{positions at a run-time position cannot be split over ranks}}
  %y = parax.rope %x, %p {theta = 1.0e4 : f64, rotary_dim = 8, parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}, {}]>]}
      : (tensor<1x8x4x8xf32>, tensor<i32>) -> tensor<1x8x4x8xf32>
  return %y : tensor<1x8x4x8xf32>
}

// -----

parax.grid @g(tp = 8)
func.func @negative_kv_heads(%q: tensor<1x8x24x8xf32>, %k: tensor<1x8x3x8xf32>) -> tensor<1x8x24x8xf32> {
  // expected-error @+1 {{3 KV heads neither split over nor evenly serve 8 ranks}}
  %o = parax.attention %q, %k, %k {num_heads = 24, num_kv_heads = 3, head_dim = 8, scale = 0.35 : f64, parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}, {}]>]}
      : (tensor<1x8x24x8xf32>, tensor<1x8x3x8xf32>, tensor<1x8x3x8xf32>) -> tensor<1x8x24x8xf32>
  return %o : tensor<1x8x24x8xf32>
}

// -----

parax.grid @g(tp = 4)
func.func @negative_partial_silu(%x: tensor<2x16xf32>) -> tensor<2x16xf32> {
  // expected-error @+1 {{it is not linear, its result cannot be a partial sum}}
  %y = parax.silu %x {parax.shardings = [#parax.sharding<@g, [{}, {}], partial = {tp}>]} : (tensor<2x16xf32>) -> tensor<2x16xf32>
  return %y : tensor<2x16xf32>
}

// -----

parax.grid @g(tp = 2)
// expected-error @+1 {{ops name 2 pipeline stages but the grid's 'pp' axis has size 0}}
func.func @negative_stages_without_pp(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = parax.silu %x {parax.stage = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %b = parax.silu %a {parax.stage = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %b : tensor<4xf32>
}

// -----

// expected-error @+1 {{nothing says how to partition this function}}
func.func @negative_no_grid(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = parax.silu %x : (tensor<4xf32>) -> tensor<4xf32>
  return %a : tensor<4xf32>
}

// -----

parax.grid @g(tp = 2)
func.func @negative_partitioned_twice(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{this function is already partitioned}}
  %a = parax.all_reduce %x over @g ["tp"] : tensor<4xf32> -> tensor<4xf32>
  return %a : tensor<4xf32>
}

// -----

parax.grid @g(tp = 2)
parax.grid @h(tp = 2)
// expected-error @+1 {{shardings of one function name different grids}}
func.func @negative_conflicting_grids(%x: tensor<4xf32> {parax.sharding = #parax.sharding<@g, [{tp}]>}) -> tensor<4xf32> {
  %a = parax.silu %x {parax.shardings = [#parax.sharding<@h, [{tp}]>]} : (tensor<4xf32>) -> tensor<4xf32>
  return %a : tensor<4xf32>
}

// -----

parax.grid @g(cp = 2) {cyclic_axes = ["cp"]}
// A rank loads a block of an argument, never every N-th element.
// expected-error @+1 {{argument #0 is split over a cyclic axis: a rank loads a block of an argument; leave it unannotated}}
func.func @negative_cyclic_argument(%x: tensor<2x8x16xf32> {parax.sharding = #parax.sharding<@g, [{}, {cp}, {}]>}) -> tensor<2x8x16xf32> {
  %y = parax.silu %x {parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}]>]} : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %y : tensor<2x8x16xf32>
}

// -----

parax.grid @g(cp = 2, tp = 2) {cyclic_axes = ["cp"]}
func.func @negative_cyclic_axis_inside(%x: tensor<2x8x16xf32>) -> tensor<2x8x16xf32> {
  // expected-error @+2 {{the cyclic axis 'cp' must come first among its dimension's axes}}
  // expected-error @+1 {{while partitioning this op}}
  %y = parax.silu %x {parax.shardings = [#parax.sharding<@g, [{}, {tp, cp}, {}]>]} : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %y : tensor<2x8x16xf32>
}

// -----

parax.grid @g(dp = 2, tp = 2)
// (Labels split over another axis cannot be sliced to the tokens' split:
// integers are never gathered or moved.)
func.func @negative_loss_split_unlike_its_labels(%l: tensor<2x8x16xf32> {parax.sharding = #parax.sharding<@g, [{dp}, {}, {}]>},
    %y: tensor<2x8xi32> {parax.sharding = #parax.sharding<@g, [{tp}, {}]>}) -> tensor<f32> {
  // expected-error @+1 {{cannot partition this op with result layout [], partial = {dp}: its partial sum must be over the axes that split its labels, [{tp}, {}]}}
  %loss = parax.cross_entropy %l, %y {parax.shardings = [#parax.sharding<@g, [], partial = {dp}>]} : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

parax.grid @g(pp = 2)
// expected-error @+1 {{ops name 3 pipeline stages but the grid's 'pp' axis has size 2 (interleaved chunks: a multiple of it)}}
func.func @negative_chunks_not_a_multiple(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = parax.silu %x {parax.stage = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %b = parax.silu %a {parax.stage = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %c = parax.silu %b {parax.stage = 2 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %c : tensor<4xf32>
}

// -----

parax.grid @g(pp = 2)
// Interleaved chunks exchange only with their neighbouring virtual stages:
// the runtime pairs each chunk's receives with its neighbour's sends.
func.func @negative_chunks_skip_a_stage(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = parax.silu %x {parax.stage = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %b = parax.silu %x {parax.stage = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %c = parax.silu %b {parax.stage = 2 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  // expected-error @+1 {{interleaved pipeline: this op on virtual stage 3 reads a value of virtual stage 0; chunks may only exchange with the next and the previous virtual stage}}
  %d = parax.add %a, %c {parax.stage = 3 : i64} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %d : tensor<4xf32>
}

// -----

parax.grid @g(pp = 2)
func.func @negative_chunks_out_of_order(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = parax.silu %x {parax.stage = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %a2 = parax.silu %a {parax.stage = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  // expected-error @+1 {{interleaved pipeline: a value of virtual stage 0 would be received before this op (virtual stage 1) needs it}}
  %b = parax.silu %a2 {parax.stage = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %c = parax.silu %b {parax.stage = 2 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %d = parax.add %c, %a {parax.stage = 3 : i64} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %d : tensor<4xf32>
}

// -----

parax.grid @g(pp = 2)
// expected-error @+1 {{interleaved pipeline: result made on virtual stage 2 is returned by another stage}}
func.func @negative_chunks_result_elsewhere(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = parax.silu %x {parax.stage = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %b = parax.silu %a {parax.stage = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %c = parax.silu %b {parax.stage = 2 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %d = parax.silu %c {parax.stage = 3 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %e = parax.add %c, %c {parax.stage = 2 : i64} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %e : tensor<4xf32>
}

// -----

parax.grid @g(ep = 2)
// expected-error @+5 {{plan: expert_capacity must be a number >= 1 (the rows a rank's expert dispatch holds, per (token, choice) pair of its own), got 5.000000e-01}}
func.func @negative_expert_capacity(%x: tensor<1x4x8xf32>, %w: tensor<1x4x2xf32>, %i: tensor<1x4x2xi32>,
    %wg: tensor<8x16x8xf32> {parax.param = "e.{e}.w1", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>},
    %wu: tensor<8x16x8xf32> {parax.param = "e.{e}.w3", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>},
    %wd: tensor<8x8x16xf32> {parax.param = "e.{e}.w2", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>}) -> tensor<1x4x8xf32>
    attributes {parax.plan = #parax.plan<expert_capacity = 0.5 : f64>} {
  %y = parax.experts %x, %w, %i, %wg, %wu, %wd : (tensor<1x4x8xf32>, tensor<1x4x2xf32>, tensor<1x4x2xi32>, tensor<8x16x8xf32>, tensor<8x16x8xf32>, tensor<8x8x16xf32>) -> tensor<1x4x8xf32>
  return %y : tensor<1x4x8xf32>
}

// -----

// A weight three stages read whose gradient only two make parts of: the
// third stage's copy would never be updated.
parax.grid @g(pp = 3)
// expected-error @+1 {{pipeline stage 2 reads parameter "w" but makes no part of its gradient, which other stages make: its copy would not be updated}}
func.func @tied_part_missing(%x: tensor<4x4xf32>, %w: tensor<4x4xf32> {parax.param = "w"})
    -> (tensor<4x4xf32>, tensor<4x4xf32> {parax.grad = "w"}) {
  %a = parax.add %x, %w {parax.stage = 0 : i64} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %b = parax.add %a, %w {parax.stage = 1 : i64} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %c = parax.add %b, %w {parax.stage = 2 : i64} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %g = parax.add %a, %b {parax.stage = 1 : i64} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  return %c, %g : tensor<4x4xf32>, tensor<4x4xf32>
}

// -----

// ... and a part made on a stage that does not read the weight.
parax.grid @g(pp = 2)
// expected-error @+1 {{pipeline stage 1 makes a part of the gradient of "w" but does not read the parameter: no stage would return that part}}
func.func @tied_part_elsewhere(%x: tensor<4x4xf32>, %w: tensor<4x4xf32> {parax.param = "w"})
    -> (tensor<4x4xf32>, tensor<4x4xf32> {parax.grad = "w"}) {
  %a = parax.add %x, %w {parax.stage = 0 : i64} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %b = parax.add %a, %a {parax.stage = 1 : i64} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %g = parax.add %a, %b {parax.stage = 1 : i64} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  return %b, %g : tensor<4x4xf32>, tensor<4x4xf32>
}

// -----

// Expert parallelism in a training step with the same tokens on both ep
// ranks (a batch of 1): each rank's copy would reach the experts, whose
// gradients would count every token twice.
parax.grid @g(ep = 2)
func.func @negative_experts_gradient_of_shared_tokens(%x: tensor<1x4x8xf32>, %w: tensor<1x4x2xf32>, %i: tensor<1x4x2xi32>,
    %wg: tensor<8x16x8xf32> {parax.param = "e.{e}.w1", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>},
    %wu: tensor<8x16x8xf32> {parax.param = "e.{e}.w3", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>},
    %wd: tensor<8x8x16xf32> {parax.param = "e.{e}.w2", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>},
    %dy: tensor<1x4x8xf32>) -> tensor<1x4x8xf32> {
  // expected-error @+1 {{expert parallelism in a training step needs each rank over 'ep' to hold its own tokens (a share of the batch), but they are [{}, {}, {}], the same on its 2 ranks, whose experts' gradients would count every token that many times}}
  %dx, %dws, %dg, %du, %dd = parax.experts_grad %x, %w, %i, %wg, %wu, %wd, %dy : (tensor<1x4x8xf32>, tensor<1x4x2xf32>, tensor<1x4x2xi32>, tensor<8x16x8xf32>, tensor<8x16x8xf32>, tensor<8x8x16xf32>, tensor<1x4x8xf32>) -> (tensor<1x4x8xf32>, tensor<1x4x2xf32>, tensor<8x16x8xf32>, tensor<8x16x8xf32>, tensor<8x8x16xf32>)
  return %dx : tensor<1x4x8xf32>
}

// -----

// A split that does not divide its dimension (a sum over tp of tokens whose
// one sequence cannot be dealt to two ranks): refused, where each rank
// used to get a tensor of zero rows.
parax.grid @g(tp = 2)
func.func @negative_split_that_does_not_divide(%x: tensor<1x3x16xf32>, %dy: tensor<1x3x16xf32>) -> tensor<16xf32> {
  // expected-error @+2 {{cannot reshard to [{tp}, {}, {}]: dimension 0 of size 1 does not split over 2 ranks}}
  // expected-error @+1 {{while partitioning this op}}
  %g = parax.rms_norm_weight_grad %x, %dy {eps = 1.0e-5 : f64, parax.shardings = [#parax.sharding<@g, [{}], partial = {tp}>]} : (tensor<1x3x16xf32>, tensor<1x3x16xf32>) -> tensor<16xf32>
  return %g : tensor<16xf32>
}
