// RUN: parax-opt %s --parax-autodiff | FileCheck %s
// RUN: parax-opt %s --parax-autodiff | FileCheck %s --check-prefix=COUNT

// One Llama block and its loss: the backward pass appends, in reverse
// order, the gradient of every op on the path to the loss, and the
// function returns the loss then one gradient per parameter.

// CHECK-LABEL: func.func @block
// CHECK-SAME: -> (tensor<f32>, tensor<32x16xf32> {parax.grad = "embed"}, tensor<16xf32> {parax.grad = "norm"}, tensor<16x16xf32> {parax.grad = "wq"}, tensor<8x16xf32> {parax.grad = "wk"}, tensor<8x16xf32> {parax.grad = "wv"}, tensor<16x16xf32> {parax.grad = "wo"}, tensor<24x16xf32> {parax.grad = "gate"}, tensor<24x16xf32> {parax.grad = "up"}, tensor<16x24xf32> {parax.grad = "down"}, tensor<32x16xf32> {parax.grad = "head"})
func.func @block(%ids: tensor<2x4xi32>, %labels: tensor<2x4xi32>,
                 %embed: tensor<32x16xf32> {parax.param = "embed"},
                 %norm: tensor<16xf32> {parax.param = "norm"},
                 %wq: tensor<16x16xf32> {parax.param = "wq"},
                 %wk: tensor<8x16xf32> {parax.param = "wk"},
                 %wv: tensor<8x16xf32> {parax.param = "wv"},
                 %wo: tensor<16x16xf32> {parax.param = "wo"},
                 %gate: tensor<24x16xf32> {parax.param = "gate"},
                 %up: tensor<24x16xf32> {parax.param = "up"},
                 %down: tensor<16x24xf32> {parax.param = "down"},
                 %head: tensor<32x16xf32> {parax.param = "head"}) -> tensor<f32> {
  %h = parax.embedding %ids, %embed {parax.layer = -1 : i64} : (tensor<2x4xi32>, tensor<32x16xf32>) -> tensor<2x4x16xf32>
  %n = parax.rms_norm %h, %norm {eps = 1.0e-5 : f64, parax.layer = 0 : i64} : (tensor<2x4x16xf32>, tensor<16xf32>) -> tensor<2x4x16xf32>
  %q = parax.linear %n, %wq {transpose_w, parax.layer = 0 : i64} : (tensor<2x4x16xf32>, tensor<16x16xf32>) -> tensor<2x4x16xf32>
  %k = parax.linear %n, %wk {transpose_w, parax.layer = 0 : i64} : (tensor<2x4x16xf32>, tensor<8x16xf32>) -> tensor<2x4x8xf32>
  %v = parax.linear %n, %wv {transpose_w, parax.layer = 0 : i64} : (tensor<2x4x16xf32>, tensor<8x16xf32>) -> tensor<2x4x8xf32>
  %q4 = parax.reshape %q : (tensor<2x4x16xf32>) -> tensor<2x4x4x4xf32>
  %k4 = parax.reshape %k : (tensor<2x4x8xf32>) -> tensor<2x4x2x4xf32>
  %v4 = parax.reshape %v : (tensor<2x4x8xf32>) -> tensor<2x4x2x4xf32>
  %qr = parax.rope %q4 {theta = 1.0e4 : f64, rotary_dim = 4} : (tensor<2x4x4x4xf32>) -> tensor<2x4x4x4xf32>
  %kr = parax.rope %k4 {theta = 1.0e4 : f64, rotary_dim = 4} : (tensor<2x4x2x4xf32>) -> tensor<2x4x2x4xf32>
  %a = parax.attention %qr, %kr, %v4 {causal, num_heads = 4, num_kv_heads = 2, head_dim = 4, scale = 0.5 : f64} : (tensor<2x4x4x4xf32>, tensor<2x4x2x4xf32>, tensor<2x4x2x4xf32>) -> tensor<2x4x4x4xf32>
  %a3 = parax.reshape %a : (tensor<2x4x4x4xf32>) -> tensor<2x4x16xf32>
  %o = parax.linear %a3, %wo {transpose_w} : (tensor<2x4x16xf32>, tensor<16x16xf32>) -> tensor<2x4x16xf32>
  %r = parax.add %h, %o : (tensor<2x4x16xf32>, tensor<2x4x16xf32>) -> tensor<2x4x16xf32>
  %g = parax.linear %r, %gate {transpose_w} : (tensor<2x4x16xf32>, tensor<24x16xf32>) -> tensor<2x4x24xf32>
  %u = parax.linear %r, %up {transpose_w} : (tensor<2x4x16xf32>, tensor<24x16xf32>) -> tensor<2x4x24xf32>
  %s = parax.swiglu %g, %u : (tensor<2x4x24xf32>, tensor<2x4x24xf32>) -> tensor<2x4x24xf32>
  %d = parax.linear %s, %down {transpose_w} : (tensor<2x4x24xf32>, tensor<16x24xf32>) -> tensor<2x4x16xf32>
  %logits = parax.linear %d, %head {transpose_w, parax.layer = 1 : i64} : (tensor<2x4x16xf32>, tensor<32x16xf32>) -> tensor<2x4x32xf32>
  %loss = parax.cross_entropy %logits, %labels : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
// The loss's gradient first, the head's weight and input next, then back
// through the block; each gradient op keeps its forward op's layer.
// CHECK: %[[DLOGITS:.*]] = parax.cross_entropy_grad %{{.*}}, %arg1 : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<2x4x32xf32>
// CHECK: parax.linear %[[DLOGITS]], %arg11 {parax.layer = 1 : i64} :
// CHECK: parax.linear_weight_grad %{{.*}}, %[[DLOGITS]] {parax.layer = 1 : i64, transpose_w}
// CHECK: parax.swiglu_grad {{.*}} {operand = 0 : i64}
// CHECK: parax.swiglu_grad {{.*}} {operand = 1 : i64}
// CHECK: %[[DQ:.*]], %[[DK:.*]], %[[DV:.*]] = parax.attention_grad
// CHECK-SAME: causal, head_dim = 4 : i64, num_heads = 4 : i64, num_kv_heads = 2 : i64
// CHECK: parax.rope %[[DK]] {inverse, rotary_dim = 4 : i64
// CHECK: parax.rope %[[DQ]] {inverse, rotary_dim = 4 : i64
// CHECK: parax.rms_norm_grad
// CHECK: parax.rms_norm_weight_grad
// CHECK: parax.embedding_grad %arg0, %{{.*}} {parax.layer = -1 : i64} : (tensor<2x4xi32>, tensor<2x4x16xf32>) -> tensor<32x16xf32>
// One weight gradient per linear (8), one input gradient per linear (8
// more linears), and besides the forward's residual add, the sums of the
// gradients of values read more than once: %h (norm and residual: 1), %n
// (three linears: 2), %r (two linears: 1).
// COUNT-COUNT-8: parax.linear_weight_grad
// COUNT-NOT: parax.linear_weight_grad
// COUNT: return
// RUN: parax-opt %s --parax-autodiff | FileCheck %s --check-prefix=ADDS
// ADDS-COUNT-5: parax.add
// ADDS-NOT: parax.add
// RUN: parax-opt %s --parax-autodiff | FileCheck %s --check-prefix=LINEARS
// LINEARS-COUNT-16: parax.linear %
// LINEARS-NOT: parax.linear %
