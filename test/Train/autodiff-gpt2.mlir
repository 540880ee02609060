// RUN: parax-opt %s --parax-autodiff | FileCheck %s

// GPT-2's ops: the position table added with a broadcast (its gradient
// summed over the batch), LayerNorm, a fused QKV weight read through slices
// (their gradients joined by a concat), biases (summed over the tokens),
// GELU, and the embedding tied to the head (two gradients added).

// CHECK-LABEL: func.func @gpt2
// CHECK-SAME: -> (tensor<f32>, tensor<32x8xf32> {parax.grad = "wte"}, tensor<16x8xf32> {parax.grad = "wpe"}, tensor<8xf32> {parax.grad = "ln.w"}, tensor<8xf32> {parax.grad = "ln.b"}, tensor<8x24xf32> {parax.grad = "c_attn.w"}, tensor<24xf32> {parax.grad = "c_attn.b"}, tensor<8x8xf32> {parax.grad = "fc.w"}, tensor<8xf32> {parax.grad = "fc.b"})
func.func @gpt2(%ids: tensor<2x4xi32>, %labels: tensor<2x4xi32>,
                %wte: tensor<32x8xf32> {parax.param = "wte"},
                %wpe: tensor<16x8xf32> {parax.param = "wpe"},
                %lnw: tensor<8xf32> {parax.param = "ln.w"},
                %lnb: tensor<8xf32> {parax.param = "ln.b"},
                %qkv: tensor<8x24xf32> {parax.param = "c_attn.w"},
                %qkvb: tensor<24xf32> {parax.param = "c_attn.b"},
                %fc: tensor<8x8xf32> {parax.param = "fc.w"},
                %fcb: tensor<8xf32> {parax.param = "fc.b"}) -> tensor<f32> {
  %e = parax.embedding %ids, %wte : (tensor<2x4xi32>, tensor<32x8xf32>) -> tensor<2x4x8xf32>
  %p = parax.position_embedding %wpe {offset = 0 : i64} : (tensor<16x8xf32>) -> tensor<1x4x8xf32>
  %h = parax.add %e, %p : (tensor<2x4x8xf32>, tensor<1x4x8xf32>) -> tensor<2x4x8xf32>
  %n = parax.layer_norm %h, %lnw, %lnb {eps = 1.0e-5 : f64} : (tensor<2x4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %wq = parax.slice %qkv {dim = 1 : i64, start = 0 : i64} : (tensor<8x24xf32>) -> tensor<8x8xf32>
  %bq = parax.slice %qkvb {dim = 0 : i64, start = 0 : i64} : (tensor<24xf32>) -> tensor<8xf32>
  %wk = parax.slice %qkv {dim = 1 : i64, start = 8 : i64} : (tensor<8x24xf32>) -> tensor<8x8xf32>
  %bk = parax.slice %qkvb {dim = 0 : i64, start = 8 : i64} : (tensor<24xf32>) -> tensor<8xf32>
  %wv = parax.slice %qkv {dim = 1 : i64, start = 16 : i64} : (tensor<8x24xf32>) -> tensor<8x8xf32>
  %bv = parax.slice %qkvb {dim = 0 : i64, start = 16 : i64} : (tensor<24xf32>) -> tensor<8xf32>
  %q = parax.linear %n, %wq, %bq : (tensor<2x4x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %k = parax.linear %n, %wk, %bk : (tensor<2x4x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %v = parax.linear %n, %wv, %bv : (tensor<2x4x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %q4 = parax.reshape %q : (tensor<2x4x8xf32>) -> tensor<2x4x2x4xf32>
  %k4 = parax.reshape %k : (tensor<2x4x8xf32>) -> tensor<2x4x2x4xf32>
  %v4 = parax.reshape %v : (tensor<2x4x8xf32>) -> tensor<2x4x2x4xf32>
  %a = parax.attention %q4, %k4, %v4 {causal, num_heads = 2, num_kv_heads = 2, head_dim = 4, scale = 0.5 : f64} : (tensor<2x4x2x4xf32>, tensor<2x4x2x4xf32>, tensor<2x4x2x4xf32>) -> tensor<2x4x2x4xf32>
  %a3 = parax.reshape %a : (tensor<2x4x2x4xf32>) -> tensor<2x4x8xf32>
  %f = parax.linear %a3, %fc, %fcb : (tensor<2x4x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %g = parax.gelu tanh %f : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %r = parax.add %h, %g : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %logits = parax.linear %r, %wte {transpose_w} : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
  %loss = parax.cross_entropy %logits, %labels : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
// The head's gradients, then GELU's and the second linear's (its bias: dy
// summed over the tokens, reshaped to [8]).
// CHECK: %[[DLOGITS:.*]] = parax.cross_entropy_grad
// CHECK: %[[DHEAD:.*]] = parax.linear_weight_grad %{{.*}}, %[[DLOGITS]] {transpose_w}
// CHECK: %[[DG:.*]] = parax.gelu_grad tanh
// CHECK: %[[DFCB:.*]] = parax.sum_to %[[DG]] : (tensor<2x4x8xf32>) -> tensor<1x1x8xf32>
// CHECK: parax.reshape %[[DFCB]] : (tensor<1x1x8xf32>) -> tensor<8xf32>
// CHECK: parax.attention_grad
// CHECK: parax.layer_norm_grad
// CHECK: parax.layer_norm_weight_grad
// The position table's gradient: the residual's gradient summed over the
// batch; the embedding's added to the tied head's.
// CHECK: %[[DPOS:.*]] = parax.sum_to %{{.*}} : (tensor<2x4x8xf32>) -> tensor<1x4x8xf32>
// CHECK: parax.position_embedding_grad %[[DPOS]] : (tensor<1x4x8xf32>) -> tensor<16x8xf32>
// CHECK: %[[DEMB:.*]] = parax.embedding_grad
// CHECK: parax.add %[[DHEAD]], %[[DEMB]] : (tensor<32x8xf32>, tensor<32x8xf32>) -> tensor<32x8xf32>
// The fused weight's and bias's gradients: q's, k's and v's joined in order.
// CHECK: parax.concat {{.*}} {dim = 1 : i64} : (tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x24xf32>
// CHECK: parax.concat {{.*}} {dim = 0 : i64} : (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<24xf32>
// CHECK: return
