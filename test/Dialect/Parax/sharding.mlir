// RUN: parax-opt %s | parax-opt | FileCheck %s

// Grids with named axes and per-value shardings round-trip, on function
// arguments, function results and op results.

// CHECK: parax.grid @mesh (dp = 2, tp = 4)
parax.grid @mesh(dp = 2, tp = 4)
// CHECK: parax.grid @full (pp = 2, dp = 2, ep = 2, tp = 8)
parax.grid @full(pp = 2, dp = 2, ep = 2, tp = 8)

// CHECK-LABEL: func.func @megatron_mlp
// CHECK-SAME: parax.param = "mlp.up_proj.weight", parax.sharding = #parax.sharding<@mesh, [{tp}, {}]>
// CHECK-SAME: parax.param = "mlp.down_proj.weight", parax.sharding = #parax.sharding<@mesh, [{}, {tp}]>
// CHECK-SAME: -> (tensor<8x16x64xf32> {parax.sharding = #parax.sharding<@mesh, [{dp}, {}, {}]>})
func.func @megatron_mlp(
    %x: tensor<8x16x64xf32> {parax.sharding = #parax.sharding<@mesh, [{dp}, {}, {}]>},
    %up: tensor<256x64xf32> {parax.param = "mlp.up_proj.weight", parax.sharding = #parax.sharding<@mesh, [{tp}, {}]>},
    %down: tensor<64x256xf32> {parax.param = "mlp.down_proj.weight", parax.sharding = #parax.sharding<@mesh, [{}, {tp}]>})
    -> (tensor<8x16x64xf32> {parax.sharding = #parax.sharding<@mesh, [{dp}, {}, {}]>}) {
  // Column-parallel: output split on its last dim.
  // CHECK: parax.linear {{.*}}parax.shardings = [#parax.sharding<@mesh, [{dp}, {}, {tp}]>]
  %h = parax.linear %x, %up {transpose_w, parax.layer = 0 : i64, parax.shardings = [#parax.sharding<@mesh, [{dp}, {}, {tp}]>]}
      : (tensor<8x16x64xf32>, tensor<256x64xf32>) -> tensor<8x16x256xf32>
  // Row-parallel: a pending partial sum over tp.
  // CHECK: parax.linear {{.*}}parax.shardings = [#parax.sharding<@mesh, [{dp}, {}, {}], partial = {tp}>]
  %y = parax.linear %h, %down {transpose_w, parax.layer = 0 : i64, parax.shardings = [#parax.sharding<@mesh, [{dp}, {}, {}], partial = {tp}>]}
      : (tensor<8x16x256xf32>, tensor<64x256xf32>) -> tensor<8x16x64xf32>
  return %y : tensor<8x16x64xf32>
}

// CHECK-LABEL: func.func @multi_axis
func.func @multi_axis(%x: tensor<32x8xf32>) -> tensor<32x8xf32> {
  // One dimension split over two axes (major to minor), one result per entry.
  // CHECK: parax.silu {{.*}}parax.shardings = [#parax.sharding<@full, [{dp, tp}, {ep}]>]
  %y = parax.silu %x {parax.shardings = [#parax.sharding<@full, [{dp, tp}, {ep}]>]} : (tensor<32x8xf32>) -> tensor<32x8xf32>
  return %y : tensor<32x8xf32>
}

// CHECK-LABEL: func.func @router_two_results
func.func @router_two_results(%x: tensor<8x64xf32>, %g: tensor<4x64xf32>) -> tensor<8x2xf32> {
  // CHECK: parax.shardings = [#parax.sharding<@mesh, [{dp}, {}]>, #parax.sharding<@mesh, [{dp}, {}]>]
  %w, %i = parax.router softmax %x, %g {num_experts = 4, top_k = 2, parax.shardings = [#parax.sharding<@mesh, [{dp}, {}]>, #parax.sharding<@mesh, [{dp}, {}]>]}
      : (tensor<8x64xf32>, tensor<4x64xf32>) -> (tensor<8x2xf32>, tensor<8x2xi32>)
  return %w : tensor<8x2xf32>
}

// A stacked expert parameter ({e} = expert index along dimension 0).
// CHECK-LABEL: func.func @stacked
// CHECK-SAME: parax.param = "model.layers.0.mlp.experts.{e}.gate_proj.weight"
func.func @stacked(%w: tensor<8x16x64xbf16> {parax.param = "model.layers.0.mlp.experts.{e}.gate_proj.weight"}) {
  return
}

// The plan (a user's partial one: what it leaves out takes the defaults,
// not printed) and a stage's pipeline round-trip.
// CHECK-LABEL: func.func @planned
// CHECK-SAME: parax.plan = #parax.plan<ep = 4, schedule = "interleaved", virtual_stages = 2, recompute = "selective", expert_capacity = 1.500000e+00 : f64>
func.func @planned() attributes {parax.plan = #parax.plan<recompute = "selective", ep = 4, schedule = "interleaved", virtual_stages = 2, expert_capacity = 1.5 : f64>} {
  return
}
// CHECK-LABEL: func.func @stage1
// CHECK-SAME: parax.pipeline = #parax.pipeline<stage = 1, stages = 2, chunks = 2, schedule = "gpipe", micro_batches = 8, zero = 1>
func.func @stage1() attributes {parax.pipeline = #parax.pipeline<stage = 1, stages = 2, chunks = 2, schedule = "gpipe", micro_batches = 8, zero = 1>} {
  return
}
