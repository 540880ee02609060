// RUN: parax-opt %s -split-input-file --parax-autodiff --parax-partition | FileCheck %s

// DeepSeek-V3's sequence-wise balance loss under expert parallelism, the
// sequences split over ep: each rank's load holds its own sequence's row
// whole (no all-reduce of it); the loss value is each rank's sequences'
// sum, a partial sum over ep, all-reduced with the cross-entropy's.

parax.grid @g(ep = 2)
// CHECK-LABEL: func.func @sequences_split
// CHECK: parax.router_grad
// CHECK-NEXT: %[[LOAD:.*]] = parax.router_load {{.*}} : (tensor<1x4x16xf32>, tensor<4x16xf32>) -> tensor<1x4xf32>
// CHECK-NEXT: parax.router_aux_grad sigmoid %{{.*}}, %{{.*}}, %[[LOAD]] {coefficient = 1.000000e-02 : f64, num_experts = 4 : i64, num_sequences = 2 : i64, num_tokens = 4 : i64} : (tensor<1x4x16xf32>, tensor<4x16xf32>, tensor<1x4xf32>)
// CHECK-NOT: parax.all_reduce {{.*}} : tensor<1x4xf32>
// CHECK: %[[SCORES:.*]] = parax.router_load {{.*}}scores{{.*}} -> tensor<1x4xf32>
// CHECK-NEXT: parax.balance_loss %[[LOAD]], %[[SCORES]] {{.*}} : (tensor<1x4xf32>, tensor<1x4xf32>) -> tensor<f32>
// CHECK-NOT: parax.all_reduce {{.*}} : tensor<1x4xf32>
// CHECK: return
func.func @sequences_split(%x0: tensor<2x4x16xf32>, %labels: tensor<2x4xi32> {parax.sharding = #parax.sharding<@g, [{ep}, {}]>},
    %w0: tensor<16x16xf32> {parax.param = "w0"},
    %gate: tensor<4x16xf32> {parax.param = "gate"},
    %w1: tensor<4x24x16xf32> {parax.param = "experts.{e}.w1", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>},
    %w3: tensor<4x24x16xf32> {parax.param = "experts.{e}.w3", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>},
    %w2: tensor<4x16x24xf32> {parax.param = "experts.{e}.w2", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>}) -> tensor<f32> {
  %x = parax.linear %x0, %w0 {transpose_w, parax.shardings = [#parax.sharding<@g, [{ep}, {}, {}]>]} : (tensor<2x4x16xf32>, tensor<16x16xf32>) -> tensor<2x4x16xf32>
  %w, %i = parax.router sigmoid %x, %gate {num_experts = 4 : i64, top_k = 2 : i64, normalize, aux_loss_coef = 0.02 : f64, sequence_aux, parax.shardings = [#parax.sharding<@g, [{ep}, {}, {}]>, #parax.sharding<@g, [{ep}, {}, {}]>]} : (tensor<2x4x16xf32>, tensor<4x16xf32>) -> (tensor<2x4x2xf32>, tensor<2x4x2xi32>)
  %y = parax.experts %x, %w, %i, %w1, %w3, %w2 {parax.shardings = [#parax.sharding<@g, [{ep}, {}, {}]>]} : (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<4x24x16xf32>, tensor<4x24x16xf32>, tensor<4x16x24xf32>) -> tensor<2x4x16xf32>
  %l = parax.cross_entropy %y, %labels {parax.shardings = [#parax.sharding<@g, [], partial = {ep}>]} : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// One sequence split over cp: each rank counts its tokens of each
// sequence, a partial sum all-reduced over cp before router_aux_grad
// (num_tokens stays the whole sequence's 4).

parax.grid @g(cp = 2)
// CHECK-LABEL: func.func @sequence_split
// CHECK: %[[LOAD:.*]] = parax.router_load {{.*}} : (tensor<2x2x16xf32>, tensor<4x16xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: %[[WHOLE:.*]] = parax.all_reduce %[[LOAD]] over @g ["cp"] : tensor<2x4xf32> -> tensor<2x4xf32>
// CHECK-NEXT: parax.router_aux_grad sigmoid %{{.*}}, %{{.*}}, %[[WHOLE]] {{{.*}}num_sequences = 2 : i64, num_tokens = 4 : i64} : (tensor<2x2x16xf32>, tensor<4x16xf32>, tensor<2x4xf32>)
// CHECK: return
func.func @sequence_split(%x: tensor<2x4x16xf32>, %labels: tensor<2x4xi32> {parax.sharding = #parax.sharding<@g, [{}, {cp}]>},
    %gate: tensor<4x16xf32> {parax.param = "gate"},
    %w1: tensor<4x24x16xf32> {parax.param = "w1"}, %w3: tensor<4x24x16xf32> {parax.param = "w3"},
    %w2: tensor<4x16x24xf32> {parax.param = "w2"}) -> tensor<f32> {
  %w, %i = parax.router sigmoid %x, %gate {num_experts = 4 : i64, top_k = 2 : i64, aux_loss_coef = 0.02 : f64, sequence_aux, parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}]>, #parax.sharding<@g, [{}, {cp}, {}]>]} : (tensor<2x4x16xf32>, tensor<4x16xf32>) -> (tensor<2x4x2xf32>, tensor<2x4x2xi32>)
  %y = parax.experts %x, %w, %i, %w1, %w3, %w2 {parax.shardings = [#parax.sharding<@g, [{}, {cp}, {}]>]} : (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<4x24x16xf32>, tensor<4x24x16xf32>, tensor<4x16x24xf32>) -> tensor<2x4x16xf32>
  %l = parax.cross_entropy %y, %labels {parax.shardings = [#parax.sharding<@g, [], partial = {cp}>]} : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}
