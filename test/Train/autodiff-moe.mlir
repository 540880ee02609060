// RUN: parax-opt %s -split-input-file --parax-autodiff | FileCheck %s

// A mixture-of-experts block: the experts' gradient (by x, the router's
// weights and the three stacks) is one op, experts_grad; the router's, by
// its logits, is router_grad, then a linear back to x and a
// linear_weight_grad for the gate, as a linear's. The indices get none.

parax.grid @g(ep = 2)
// CHECK-LABEL: func.func @moe
// CHECK-SAME: -> (tensor<f32>, tensor<16x16xf32> {parax.grad = "w0"}, tensor<4x16xf32> {parax.grad = "gate"}, tensor<4x24x16xf32> {parax.grad = "experts.{e}.w1"}, tensor<4x24x16xf32> {parax.grad = "experts.{e}.w3"}, tensor<4x16x24xf32> {parax.grad = "experts.{e}.w2"})
// CHECK: %[[DX:.*]], %[[DW:.*]], %[[DG:.*]], %[[DU:.*]], %[[DD:.*]] = parax.experts_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : {{.*}} -> (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<4x24x16xf32>, tensor<4x24x16xf32>, tensor<4x16x24xf32>)
// CHECK: %[[DL:.*]] = parax.router_grad softmax %{{.*}}, %{{.*}}, %[[DW]] {normalize, num_experts = 4 : i64, top_k = 2 : i64} : {{.*}} -> tensor<2x4x4xf32>
// CHECK: parax.linear %[[DL]], %{{.*}} : (tensor<2x4x4xf32>, tensor<4x16xf32>) -> tensor<2x4x16xf32>
// CHECK: parax.linear_weight_grad %{{.*}}, %[[DL]] {transpose_w} : {{.*}} -> tensor<4x16xf32>
func.func @moe(%x0: tensor<2x4x16xf32>, %labels: tensor<2x4xi32>,
    %w0: tensor<16x16xf32> {parax.param = "w0"},
    %gate: tensor<4x16xf32> {parax.param = "gate"},
    %w1: tensor<4x24x16xf32> {parax.param = "experts.{e}.w1", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>},
    %w3: tensor<4x24x16xf32> {parax.param = "experts.{e}.w3", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>},
    %w2: tensor<4x16x24xf32> {parax.param = "experts.{e}.w2", parax.sharding = #parax.sharding<@g, [{ep}, {}, {}]>}) -> tensor<f32> {
  %x = parax.linear %x0, %w0 {transpose_w, parax.shardings = [#parax.sharding<@g, [{ep}, {}, {}]>]} : (tensor<2x4x16xf32>, tensor<16x16xf32>) -> tensor<2x4x16xf32>
  %w, %i = parax.router softmax %x, %gate {num_experts = 4 : i64, top_k = 2 : i64, normalize, parax.shardings = [#parax.sharding<@g, [{ep}, {}, {}]>, #parax.sharding<@g, [{ep}, {}, {}]>]} : (tensor<2x4x16xf32>, tensor<4x16xf32>) -> (tensor<2x4x2xf32>, tensor<2x4x2xi32>)
  %y = parax.experts %x, %w, %i, %w1, %w3, %w2 {parax.shardings = [#parax.sharding<@g, [{ep}, {}, {}]>]} : (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<4x24x16xf32>, tensor<4x24x16xf32>, tensor<4x16x24xf32>) -> tensor<2x4x16xf32>
  %l = parax.cross_entropy %y, %labels {parax.shardings = [#parax.sharding<@g, [], partial = {ep}>]} : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Qwen2-MoE's gated shared expert: sigmoid(x · g) · shared. The product's
// gradient by its broadcast [.., 1] operand is summed back (sum_to); the
// sigmoid's is sigmoid_grad.
// CHECK-LABEL: func.func @gated
// CHECK: %[[H:.*]] = parax.linear %{{.*}}, %{{.*}} {transpose_w} : (tensor<2x4x16xf32>, tensor<16x16xf32>)
// CHECK: %[[DY:.*]] = parax.cross_entropy_grad
// CHECK: %[[DG:.*]] = parax.mul %[[DY]], %[[H]] : (tensor<2x4x16xf32>, tensor<2x4x16xf32>) -> tensor<2x4x16xf32>
// CHECK: %[[SUM:.*]] = parax.sum_to %[[DG]] : (tensor<2x4x16xf32>) -> tensor<2x4x1xf32>
// CHECK: parax.mul %[[DY]], %{{.*}} : (tensor<2x4x16xf32>, tensor<2x4x1xf32>) -> tensor<2x4x16xf32>
// CHECK: parax.sigmoid_grad %{{.*}}, %[[SUM]] : (tensor<2x4x1xf32>, tensor<2x4x1xf32>) -> tensor<2x4x1xf32>
func.func @gated(%x: tensor<2x4x16xf32>, %labels: tensor<2x4xi32>,
    %g: tensor<1x16xf32> {parax.param = "g"}, %s: tensor<16x16xf32> {parax.param = "s"}) -> tensor<f32> {
  %a = parax.linear %x, %g {transpose_w} : (tensor<2x4x16xf32>, tensor<1x16xf32>) -> tensor<2x4x1xf32>
  %b = parax.sigmoid %a : (tensor<2x4x1xf32>) -> tensor<2x4x1xf32>
  %h = parax.linear %x, %s {transpose_w} : (tensor<2x4x16xf32>, tensor<16x16xf32>) -> tensor<2x4x16xf32>
  %y = parax.mul %b, %h : (tensor<2x4x1xf32>, tensor<2x4x16xf32>) -> tensor<2x4x16xf32>
  %l = parax.cross_entropy %y, %labels : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// DeepSeek-V3: a concat's inputs get their slices of dy; a broadcast's
// operand the sum over what it was broadcast over; the router's correction
// bias, used only to choose experts, gets no gradient (and is no result).
// CHECK-LABEL: func.func @deepseek
// CHECK-SAME: -> (tensor<f32>, tensor<2x1x8xf32> {parax.grad = "c"}, tensor<4x16xf32> {parax.grad = "gate"}, tensor<4x24x16xf32> {parax.grad = "w1"}, tensor<4x24x16xf32> {parax.grad = "w3"}, tensor<4x16x24xf32> {parax.grad = "w2"}, tensor<16x8xf32> {parax.grad = "a"})
// CHECK: parax.router_grad sigmoid %{{.*}}, %{{.*}}, %{{.*}}, %arg4 {num_experts = 4 : i64, num_groups = 2 : i64, scaling_factor = 2.500000e+00 : f64, top_k = 2 : i64}
// CHECK: parax.slice %{{.*}} {dim = 2 : i64, start = 0 : i64} : (tensor<2x4x16xf32>) -> tensor<2x4x8xf32>
// CHECK: %[[B:.*]] = parax.slice %{{.*}} {dim = 2 : i64, start = 8 : i64} : (tensor<2x4x16xf32>) -> tensor<2x4x8xf32>
// CHECK: parax.sum_to %[[B]] : (tensor<2x4x8xf32>) -> tensor<2x1x8xf32>
func.func @deepseek(%x: tensor<2x4x16xf32>, %c: tensor<2x1x8xf32> {parax.param = "c"}, %labels: tensor<2x4xi32>,
    %gate: tensor<4x16xf32> {parax.param = "gate"}, %bias: tensor<4xf32> {parax.param = "bias"},
    %w1: tensor<4x24x16xf32> {parax.param = "w1"}, %w3: tensor<4x24x16xf32> {parax.param = "w3"},
    %w2: tensor<4x16x24xf32> {parax.param = "w2"}, %a: tensor<16x8xf32> {parax.param = "a"}) -> tensor<f32> {
  %p = parax.linear %x, %a : (tensor<2x4x16xf32>, tensor<16x8xf32>) -> tensor<2x4x8xf32>
  %cb = parax.broadcast %c : (tensor<2x1x8xf32>) -> tensor<2x4x8xf32>
  %z = parax.concat %p, %cb {dim = 2 : i64} : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x16xf32>
  %w, %i = parax.router sigmoid %z, %gate, %bias {num_experts = 4 : i64, top_k = 2 : i64, num_groups = 2 : i64, topk_groups = 1 : i64, scaling_factor = 2.5 : f64} : (tensor<2x4x16xf32>, tensor<4x16xf32>, tensor<4xf32>) -> (tensor<2x4x2xf32>, tensor<2x4x2xi32>)
  %y = parax.experts %z, %w, %i, %w1, %w3, %w2 : (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<4x24x16xf32>, tensor<4x24x16xf32>, tensor<4x16x24xf32>) -> tensor<2x4x16xf32>
  %l = parax.cross_entropy %y, %labels : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A load-balancing loss (aux_loss_coef): its gradient joins the router's
// (router_load counts every token's choices; router_aux_grad takes it to
// the logits, T = 8 tokens); the loss returned adds its value.
// CHECK-LABEL: func.func @balanced
// CHECK: %[[LOGITS:.*]] = parax.router_grad softmax
// CHECK-NEXT: %[[LOAD:.*]] = parax.router_load softmax %{{.*}}, %{{.*}} {normalize, num_experts = 4 : i64, top_k = 2 : i64} : (tensor<2x4x16xf32>, tensor<4x16xf32>) -> tensor<4xf32>
// CHECK-NEXT: %[[AUX:.*]] = parax.router_aux_grad softmax %{{.*}}, %{{.*}}, %[[LOAD]] {coefficient = 2.000000e-02 : f64, num_experts = 4 : i64, num_tokens = 8 : i64}
// CHECK-NEXT: parax.add %[[LOGITS]], %[[AUX]]
// CHECK: return %{{[0-9]+}},
func.func @balanced(%x: tensor<2x4x16xf32>, %labels: tensor<2x4xi32>,
    %gate: tensor<4x16xf32> {parax.param = "gate"},
    %w1: tensor<4x24x16xf32> {parax.param = "w1"}, %w3: tensor<4x24x16xf32> {parax.param = "w3"},
    %w2: tensor<4x16x24xf32> {parax.param = "w2"}) -> tensor<f32> {
  %w, %i = parax.router softmax %x, %gate {num_experts = 4 : i64, top_k = 2 : i64, normalize, aux_loss_coef = 0.02 : f64} : (tensor<2x4x16xf32>, tensor<4x16xf32>) -> (tensor<2x4x2xf32>, tensor<2x4x2xi32>)
  %y = parax.experts %x, %w, %i, %w1, %w3, %w2 : (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<4x24x16xf32>, tensor<4x24x16xf32>, tensor<4x16x24xf32>) -> tensor<2x4x16xf32>
  %l = parax.cross_entropy %y, %labels : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Two balanced layers balance together (transformers' form: every layer's
// rows at once): both loads are made once, at the first router
// differentiated (the last layer's), and summed; each router_aux_grad takes
// the sum over T = 2 layers x 8 tokens.
// CHECK-LABEL: func.func @balanced_layers
// CHECK: parax.router_grad softmax
// CHECK-NEXT: %[[L1:.*]] = parax.router_load softmax %arg0,
// CHECK-NEXT: %[[L2:.*]] = parax.router_load softmax %{{.*}},
// CHECK-NEXT: %[[SUM:.*]] = parax.add %[[L1]], %[[L2]] : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
// CHECK-NEXT: parax.router_aux_grad softmax %{{.*}}, %{{.*}}, %[[SUM]] {{{.*}}num_tokens = 16 : i64}
// CHECK-NOT: parax.router_load
// CHECK: parax.router_aux_grad softmax %arg0, %{{.*}}, %[[SUM]] {{{.*}}num_tokens = 16 : i64}
// The loss returned: the cross-entropy plus the balancing loss's value,
// from the same loads and the routers' scores summed likewise.
// CHECK: %[[S1:.*]] = parax.router_load softmax %arg0, {{.*}}scores
// CHECK-NEXT: %[[S2:.*]] = parax.router_load softmax {{.*}}scores
// CHECK-NEXT: %[[SCORES:.*]] = parax.add %[[S1]], %[[S2]]
// CHECK-NEXT: %[[VALUE:.*]] = parax.balance_loss %[[SUM]], %[[SCORES]] {coefficient = 2.000000e-02 : f64, num_experts = 4 : i64, num_tokens = 16 : i64}
// CHECK-NEXT: %[[LOSS:.*]] = parax.add %{{.*}}, %[[VALUE]] : (tensor<f32>, tensor<f32>) -> tensor<f32>
// The balancing loss returned apart too, last (for logging).
// CHECK-NEXT: return %[[LOSS]], {{.*}}, %[[VALUE]] : tensor<f32>, {{.*}}, tensor<f32>
func.func @balanced_layers(%x: tensor<2x4x16xf32>, %labels: tensor<2x4xi32>,
    %gate: tensor<4x16xf32> {parax.param = "gate"}, %gate2: tensor<4x16xf32> {parax.param = "gate2"},
    %w1: tensor<4x24x16xf32> {parax.param = "w1"}, %w3: tensor<4x24x16xf32> {parax.param = "w3"},
    %w2: tensor<4x16x24xf32> {parax.param = "w2"}) -> tensor<f32> {
  %w, %i = parax.router softmax %x, %gate {num_experts = 4 : i64, top_k = 2 : i64, normalize, aux_loss_coef = 0.02 : f64} : (tensor<2x4x16xf32>, tensor<4x16xf32>) -> (tensor<2x4x2xf32>, tensor<2x4x2xi32>)
  %y = parax.experts %x, %w, %i, %w1, %w3, %w2 : (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<4x24x16xf32>, tensor<4x24x16xf32>, tensor<4x16x24xf32>) -> tensor<2x4x16xf32>
  %w_2, %i_2 = parax.router softmax %y, %gate2 {num_experts = 4 : i64, top_k = 2 : i64, normalize, aux_loss_coef = 0.02 : f64} : (tensor<2x4x16xf32>, tensor<4x16xf32>) -> (tensor<2x4x2xf32>, tensor<2x4x2xi32>)
  %y2 = parax.experts %y, %w_2, %i_2, %w1, %w3, %w2 : (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<4x24x16xf32>, tensor<4x24x16xf32>, tensor<4x16x24xf32>) -> tensor<2x4x16xf32>
  %l = parax.cross_entropy %y2, %labels : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// DeepSeek-V3's sequence-wise balance loss (sequence_aux): each router its
// own load per sequence, [B = 2, E = 4], not summed over the layers;
// router_aux_grad over it with coefficient α / top_k = 0.01, T = 4 tokens a
// sequence, 2 sequences; the loss returned adds each layer's value
// (balance_loss per sequence, of the routers' normalised scores).
// CHECK-LABEL: func.func @sequence_balanced
// CHECK-SAME: tensor<4x16x24xf32> {parax.grad = "w2"}, tensor<f32> {parax.loss_term = "balance"})
// CHECK: parax.router_grad sigmoid
// CHECK-NEXT: %[[L2:.*]] = parax.router_load sigmoid %{{.*}}, %{{.*}} {num_experts = 4 : i64, top_k = 2 : i64} : (tensor<2x4x16xf32>, tensor<4x16xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: parax.router_aux_grad sigmoid %{{.*}}, %{{.*}}, %[[L2]] {coefficient = 1.000000e-02 : f64, num_experts = 4 : i64, num_sequences = 2 : i64, num_tokens = 4 : i64} : (tensor<2x4x16xf32>, tensor<4x16xf32>, tensor<2x4xf32>) -> tensor<2x4x4xf32>
// CHECK: parax.router_grad sigmoid
// CHECK-NEXT: %[[L1:.*]] = parax.router_load sigmoid %arg0, {{.*}} -> tensor<2x4xf32>
// CHECK-NEXT: parax.router_aux_grad sigmoid %arg0, %{{.*}}, %[[L1]] {{.*}}num_sequences = 2 : i64
// CHECK: %[[S2:.*]] = parax.router_load sigmoid {{.*}}scores{{.*}} -> tensor<2x4xf32>
// CHECK-NEXT: %[[V2:.*]] = parax.balance_loss %[[L2]], %[[S2]] {coefficient = 1.000000e-02 : f64, num_experts = 4 : i64, num_sequences = 2 : i64, num_tokens = 4 : i64} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<f32>
// CHECK-NEXT: %[[S1:.*]] = parax.router_load sigmoid %arg0, {{.*}}scores
// CHECK-NEXT: %[[V1:.*]] = parax.balance_loss %[[L1]], %[[S1]]
// CHECK-NEXT: %[[BALANCE:.*]] = parax.add %[[V2]], %[[V1]]
// CHECK-NEXT: %[[LOSS:.*]] = parax.add %{{.*}}, %[[BALANCE]]
// CHECK-NEXT: return %[[LOSS]], {{.*}}, %[[BALANCE]] : tensor<f32>, {{.*}}, tensor<f32>
func.func @sequence_balanced(%x: tensor<2x4x16xf32>, %labels: tensor<2x4xi32>,
    %gate: tensor<4x16xf32> {parax.param = "gate"}, %gate2: tensor<4x16xf32> {parax.param = "gate2"},
    %w1: tensor<4x24x16xf32> {parax.param = "w1"}, %w3: tensor<4x24x16xf32> {parax.param = "w3"},
    %w2: tensor<4x16x24xf32> {parax.param = "w2"}) -> tensor<f32> {
  %w, %i = parax.router sigmoid %x, %gate {num_experts = 4 : i64, top_k = 2 : i64, aux_loss_coef = 0.02 : f64, sequence_aux} : (tensor<2x4x16xf32>, tensor<4x16xf32>) -> (tensor<2x4x2xf32>, tensor<2x4x2xi32>)
  %y = parax.experts %x, %w, %i, %w1, %w3, %w2 : (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<4x24x16xf32>, tensor<4x24x16xf32>, tensor<4x16x24xf32>) -> tensor<2x4x16xf32>
  %w2b, %i2 = parax.router sigmoid %y, %gate2 {num_experts = 4 : i64, top_k = 2 : i64, aux_loss_coef = 0.02 : f64, sequence_aux} : (tensor<2x4x16xf32>, tensor<4x16xf32>) -> (tensor<2x4x2xf32>, tensor<2x4x2xi32>)
  %z = parax.experts %y, %w2b, %i2, %w1, %w3, %w2 : (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<4x24x16xf32>, tensor<4x24x16xf32>, tensor<4x16x24xf32>) -> tensor<2x4x16xf32>
  %l = parax.cross_entropy %z, %labels : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}
