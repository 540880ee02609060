// RUN: parax-opt %s --parax-autodiff --parax-partition | FileCheck %s

// Expert parallelism in the backward pass: the forward's dispatch is
// reused; dy is dispatched as the tokens were (2 dispatches in all); dx
// and the router weights' gradients come back (one combine each, the
// latter per choice); each rank's experts' gradients are whole (no
// all-reduce of the stacks: every token routed to an expert reached its
// rank); the gate's and w0's, over tokens split on ep, are returned as
// partial sums over ep (no all-reduce: the runtime sums them over dp x ep
// once a step, with the data-parallel reduction). The load-balancing loss
// (aux_loss_coef) needs every token's load: each rank's router_load is
// all-reduced over ep; num_tokens stays the whole's.

parax.grid @g(ep = 2)
// CHECK-LABEL: func.func @moe
// CHECK-SAME: tensor<16x16xf32> {parax.global_sharding = #parax.sharding<@g, [{}, {}], partial = {ep}>, parax.grad = "w0"
// CHECK-SAME: tensor<4x16xf32> {parax.global_sharding = #parax.sharding<@g, [{}, {}], partial = {ep}>, parax.grad = "gate"
// CHECK-SAME: tensor<2x24x16xf32> {parax.global_sharding = #parax.sharding<@g, [{ep}, {}, {}]>, parax.grad = "experts.{e}.w1"
// CHECK-COUNT-2: parax.moe_dispatch
// CHECK-NOT: parax.moe_dispatch
// CHECK: parax.experts_grad {{.*}} -> (tensor<16x16xf32>, tensor<16x1xf32>, tensor<2x24x16xf32>, tensor<2x24x16xf32>, tensor<2x16x24xf32>)
// CHECK-NEXT: parax.moe_combine {{.*}} -> tensor<1x4x16xf32>
// CHECK-NEXT: parax.moe_combine {{.*}} {num_experts = 4 : i64, per_choice} : (tensor<16x1xf32>, tensor<1x4x2xi32>) -> tensor<1x4x2x1xf32>
// CHECK-NEXT: parax.reshape {{.*}} -> tensor<1x4x2xf32>
// CHECK: parax.router_grad
// CHECK-NEXT: %[[LOAD:.*]] = parax.router_load {{.*}} : (tensor<1x4x16xf32>, tensor<4x16xf32>) -> tensor<4xf32>
// CHECK-NEXT: %[[WHOLE:.*]] = parax.all_reduce %[[LOAD]] over @g ["ep"] : tensor<4xf32> -> tensor<4xf32>
// CHECK-NEXT: parax.router_aux_grad softmax %{{.*}}, %{{.*}}, %[[WHOLE]] {coefficient = 2.000000e-02 : f64, num_experts = 4 : i64, num_tokens = 8 : i64} : (tensor<1x4x16xf32>
// CHECK-NOT: parax.all_reduce {{.*}} : tensor<{{4x16|16x16}}xf32>
// CHECK: parax.router_load
// CHECK-NEXT: parax.all_reduce {{.*}} over @g ["ep"] : tensor<4xf32>
// The loss, all-reduced: the one other all-reduce.
// CHECK: parax.all_reduce {{.*}} over @g ["ep"] : tensor<f32>
// CHECK-NOT: parax.all_reduce
// CHECK: return
func.func @moe(%x0: tensor<2x4x16xf32>, %labels: tensor<2x4xi32> {parax.sharding = #parax.sharding<@g, [{ep}, {}]>},
    %w0: tensor<16x16xf32> {parax.param = "w0"},
    %gate: tensor<4x16xf32> {parax.param = "gate"},
    %w1: tensor<4x24x16xf32> {parax.param = "experts.{e}.w1", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>},
    %w3: tensor<4x24x16xf32> {parax.param = "experts.{e}.w3", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>},
    %w2: tensor<4x16x24xf32> {parax.param = "experts.{e}.w2", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>}) -> tensor<f32> {
  %x = parax.linear %x0, %w0 {transpose_w, parax.shardings = [#parax.sharding<@g, [{ep}, {}, {}]>]} : (tensor<2x4x16xf32>, tensor<16x16xf32>) -> tensor<2x4x16xf32>
  %w, %i = parax.router softmax %x, %gate {num_experts = 4 : i64, top_k = 2 : i64, normalize, aux_loss_coef = 0.02 : f64, parax.shardings = [#parax.sharding<@g, [{ep}, {}, {}]>, #parax.sharding<@g, [{ep}, {}, {}]>]} : (tensor<2x4x16xf32>, tensor<4x16xf32>) -> (tensor<2x4x2xf32>, tensor<2x4x2xi32>)
  %y = parax.experts %x, %w, %i, %w1, %w3, %w2 {parax.shardings = [#parax.sharding<@g, [{ep}, {}, {}]>]} : (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<4x24x16xf32>, tensor<4x24x16xf32>, tensor<4x16x24xf32>) -> tensor<2x4x16xf32>
  %l = parax.cross_entropy %y, %labels {parax.shardings = [#parax.sharding<@g, [], partial = {ep}>]} : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}
