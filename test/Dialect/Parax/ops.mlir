// RUN: parax-opt %s | parax-opt | FileCheck %s
// RUN: parax-opt %s --mlir-print-op-generic | parax-opt | FileCheck %s

// Round trip of every parax op: printed, re-parsed and printed again.

// CHECK-LABEL: func.func @embeddings
func.func @embeddings(%ids: tensor<2x16xi32>, %wte: tensor<256x64xf32>, %wpe: tensor<128x64xbf16>)
    -> (tensor<2x16x64xf32>, tensor<1x16x64xbf16>) {
  // CHECK: parax.embedding %{{.*}}, %{{.*}} : (tensor<2x16xi32>, tensor<256x64xf32>) -> tensor<2x16x64xf32>
  %h = parax.embedding %ids, %wte : (tensor<2x16xi32>, tensor<256x64xf32>) -> tensor<2x16x64xf32>
  // CHECK: parax.position_embedding %{{.*}} {offset = 8 : i64} : (tensor<128x64xbf16>) -> tensor<1x16x64xbf16>
  %p = parax.position_embedding %wpe {offset = 8} : (tensor<128x64xbf16>) -> tensor<1x16x64xbf16>
  return %h, %p : tensor<2x16x64xf32>, tensor<1x16x64xbf16>
}

// CHECK-LABEL: func.func @linears
func.func @linears(%x: tensor<2x16x64xf32>, %w: tensor<64x128xf32>, %wt: tensor<128x64xf32>, %b: tensor<128xf32>)
    -> (tensor<2x16x128xf32>, tensor<2x16x128xf32>) {
  // CHECK: parax.linear %{{.*}}, %{{.*}}, %{{.*}} : (tensor<2x16x64xf32>, tensor<64x128xf32>, tensor<128xf32>) -> tensor<2x16x128xf32>
  %y = parax.linear %x, %w, %b : (tensor<2x16x64xf32>, tensor<64x128xf32>, tensor<128xf32>) -> tensor<2x16x128xf32>
  // CHECK: parax.linear %{{.*}}, %{{.*}} {transpose_w} : (tensor<2x16x64xf32>, tensor<128x64xf32>) -> tensor<2x16x128xf32>
  %z = parax.linear %x, %wt {transpose_w} : (tensor<2x16x64xf32>, tensor<128x64xf32>) -> tensor<2x16x128xf32>
  return %y, %z : tensor<2x16x128xf32>, tensor<2x16x128xf32>
}

// CHECK-LABEL: func.func @head_linears
func.func @head_linears(%x: tensor<2x1x4x16xf32>, %w: tensor<4x16x32xf32>, %wt: tensor<4x8x32xf32>)
    -> tensor<2x1x4x8xf32> {
  // CHECK: parax.head_linear %{{.*}}, %{{.*}} : (tensor<2x1x4x16xf32>, tensor<4x16x32xf32>) -> tensor<2x1x4x32xf32>
  %y = parax.head_linear %x, %w : (tensor<2x1x4x16xf32>, tensor<4x16x32xf32>) -> tensor<2x1x4x32xf32>
  // CHECK: parax.head_linear %{{.*}}, %{{.*}} {transpose_w} : (tensor<2x1x4x32xf32>, tensor<4x8x32xf32>) -> tensor<2x1x4x8xf32>
  %z = parax.head_linear %y, %wt {transpose_w} : (tensor<2x1x4x32xf32>, tensor<4x8x32xf32>) -> tensor<2x1x4x8xf32>
  return %z : tensor<2x1x4x8xf32>
}

// CHECK-LABEL: func.func @norms_and_rope
func.func @norms_and_rope(%x: tensor<2x16x64xf32>, %w: tensor<64xf32>, %b: tensor<64xf32>, %q: tensor<2x16x4x16xf32>)
    -> (tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x16x4x16xf32>, tensor<2x16x4x16xf32>) {
  // CHECK: parax.rms_norm %{{.*}}, %{{.*}} {eps = 1.000000e-05 : f64}
  %r = parax.rms_norm %x, %w {eps = 1.0e-05 : f64} : (tensor<2x16x64xf32>, tensor<64xf32>) -> tensor<2x16x64xf32>
  // CHECK: parax.layer_norm %{{.*}}, %{{.*}}, %{{.*}} {eps = 1.000000e-05 : f64}
  %l = parax.layer_norm %x, %w, %b {eps = 1.0e-05 : f64} : (tensor<2x16x64xf32>, tensor<64xf32>, tensor<64xf32>) -> tensor<2x16x64xf32>
  // CHECK: parax.rope %{{.*}} {rotary_dim = 16 : i64, theta = 5.000000e+05 : f64}
  %e = parax.rope %q {theta = 500000.0 : f64, rotary_dim = 16} : (tensor<2x16x4x16xf32>) -> tensor<2x16x4x16xf32>
  // Partial, interleaved rotary with a position offset and Llama 3.1 scaling.
  // CHECK: parax.rope %{{.*}} {interleaved, position_offset = 4 : i64, rotary_dim = 8 : i64, scaling = {factor = 8.000000e+00 : f64, high_freq_factor = 4.000000e+00 : f64, low_freq_factor = 1.000000e+00 : f64, original_max_position_embeddings = 8192 : i64, rope_type = "llama3"}, theta = 1.000000e+04 : f64}
  %p = parax.rope %q {theta = 10000.0 : f64, rotary_dim = 8, interleaved, position_offset = 4, scaling = {rope_type = "llama3", factor = 8.0 : f64, low_freq_factor = 1.0 : f64, high_freq_factor = 4.0 : f64, original_max_position_embeddings = 8192 : i64}} : (tensor<2x16x4x16xf32>) -> tensor<2x16x4x16xf32>
  return %r, %l, %e, %p : tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x16x4x16xf32>, tensor<2x16x4x16xf32>
}

// CHECK-LABEL: func.func @attention
func.func @attention(%q: tensor<2x16x4x16xf32>, %k: tensor<2x16x2x16xf32>, %v: tensor<2x16x2x8xf32>,
                     %kc: tensor<2x24x2x16xf32>, %vc: tensor<2x24x2x8xf32>)
    -> (tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>) {
  // Grouped-query (4 query heads, 2 KV heads), value head dim 8 != qk head dim 16.
  // CHECK: parax.attention %{{.*}}, %{{.*}}, %{{.*}} {causal, head_dim = 16 : i64, num_heads = 4 : i64, num_kv_heads = 2 : i64, scale = 2.500000e-01 : f64}
  %o = parax.attention %q, %k, %v {causal, num_heads = 4, num_kv_heads = 2, head_dim = 16, scale = 0.25 : f64}
      : (tensor<2x16x4x16xf32>, tensor<2x16x2x16xf32>, tensor<2x16x2x8xf32>) -> tensor<2x16x4x8xf32>
  // More keys than queries (a cached prefix).
  // CHECK: parax.attention {{.*}} : (tensor<2x16x4x16xf32>, tensor<2x24x2x16xf32>, tensor<2x24x2x8xf32>) -> tensor<2x16x4x8xf32>
  %c = parax.attention %q, %kc, %vc {causal, num_heads = 4, num_kv_heads = 2, head_dim = 16, scale = 0.25 : f64}
      : (tensor<2x16x4x16xf32>, tensor<2x24x2x16xf32>, tensor<2x24x2x8xf32>) -> tensor<2x16x4x8xf32>
  return %o, %c : tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>
}

// A generation step: keys written into a cache at a run-time position, which
// the rope, the position table and the attention read too.
// CHECK-LABEL: func.func @generation_step
func.func @generation_step(%q: tensor<2x1x4x16xf32>, %k: tensor<2x1x2x16xf32>, %cache: tensor<2x64x2x16xf32>,
                           %wpe: tensor<128x64xf32>, %pos: tensor<i32>)
    -> (tensor<2x1x4x16xf32>, tensor<1x1x64xf32>) {
  // CHECK: parax.rope %{{.*}}, %{{.*}} {rotary_dim = 16 : i64, theta = 1.000000e+04 : f64} : (tensor<2x1x2x16xf32>, tensor<i32>) -> tensor<2x1x2x16xf32>
  %r = parax.rope %k, %pos {theta = 10000.0 : f64, rotary_dim = 16} : (tensor<2x1x2x16xf32>, tensor<i32>) -> tensor<2x1x2x16xf32>
  // CHECK: parax.cache_update %{{.*}}, %{{.*}}, %{{.*}} : (tensor<2x64x2x16xf32>, tensor<2x1x2x16xf32>, tensor<i32>) -> tensor<2x64x2x16xf32>
  %c = parax.cache_update %cache, %r, %pos : (tensor<2x64x2x16xf32>, tensor<2x1x2x16xf32>, tensor<i32>) -> tensor<2x64x2x16xf32>
  // CHECK: parax.attention %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {causal, {{.*}}} : (tensor<2x1x4x16xf32>, tensor<2x64x2x16xf32>, tensor<2x64x2x16xf32>, tensor<i32>) -> tensor<2x1x4x16xf32>
  %o = parax.attention %q, %c, %c, %pos {causal, num_heads = 4, num_kv_heads = 2, head_dim = 16, scale = 0.25 : f64}
      : (tensor<2x1x4x16xf32>, tensor<2x64x2x16xf32>, tensor<2x64x2x16xf32>, tensor<i32>) -> tensor<2x1x4x16xf32>
  // CHECK: parax.position_embedding %{{.*}}, %{{.*}} : (tensor<128x64xf32>, tensor<i32>) -> tensor<1x1x64xf32>
  %p = parax.position_embedding %wpe, %pos : (tensor<128x64xf32>, tensor<i32>) -> tensor<1x1x64xf32>
  return %o, %p : tensor<2x1x4x16xf32>, tensor<1x1x64xf32>
}

// A sliding window's generation step: the window read out of a ring of its
// last 3 tokens, the step's keys written in; the attention over the window.
// CHECK-LABEL: func.func @ring_generation_step
func.func @ring_generation_step(%q: tensor<2x1x4x16xf32>, %k: tensor<2x1x2x16xf32>, %ring: tensor<2x3x2x16xf32>,
                                %pos: tensor<i32>) -> tensor<2x1x4x16xf32> {
  // CHECK: %{{.*}}, %{{.*}} = parax.ring_cache_update %{{.*}}, %{{.*}}, %{{.*}} : (tensor<2x3x2x16xf32>, tensor<2x1x2x16xf32>, tensor<i32>) -> (tensor<2x4x2x16xf32>, tensor<2x3x2x16xf32>)
  %w, %r = parax.ring_cache_update %ring, %k, %pos : (tensor<2x3x2x16xf32>, tensor<2x1x2x16xf32>, tensor<i32>) -> (tensor<2x4x2x16xf32>, tensor<2x3x2x16xf32>)
  // CHECK: parax.attention %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {causal, {{.*}}ring{{.*}}window = 4 : i64} : (tensor<2x1x4x16xf32>, tensor<2x4x2x16xf32>, tensor<2x4x2x16xf32>, tensor<i32>) -> tensor<2x1x4x16xf32>
  %o = parax.attention %q, %w, %w, %pos {causal, ring, window = 4, num_heads = 4, num_kv_heads = 2, head_dim = 16, scale = 0.25 : f64}
      : (tensor<2x1x4x16xf32>, tensor<2x4x2x16xf32>, tensor<2x4x2x16xf32>, tensor<i32>) -> tensor<2x1x4x16xf32>
  return %o : tensor<2x1x4x16xf32>
}

// CHECK-LABEL: func.func @elementwise
func.func @elementwise(%a: tensor<2x16x64xf32>, %b: tensor<1x16x64xf32>, %g: tensor<2x16x1xf32>)
    -> (tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x16x64xf32>) {
  // CHECK: parax.add %{{.*}}, %{{.*}} : (tensor<2x16x64xf32>, tensor<1x16x64xf32>) -> tensor<2x16x64xf32>
  %0 = parax.add %a, %b : (tensor<2x16x64xf32>, tensor<1x16x64xf32>) -> tensor<2x16x64xf32>
  // CHECK: parax.mul %{{.*}}, %{{.*}} : (tensor<2x16x1xf32>, tensor<2x16x64xf32>) -> tensor<2x16x64xf32>
  %1 = parax.mul %g, %a : (tensor<2x16x1xf32>, tensor<2x16x64xf32>) -> tensor<2x16x64xf32>
  // CHECK: parax.silu
  %2 = parax.silu %a : (tensor<2x16x64xf32>) -> tensor<2x16x64xf32>
  // CHECK: parax.sigmoid
  %3 = parax.sigmoid %a : (tensor<2x16x64xf32>) -> tensor<2x16x64xf32>
  // CHECK: parax.gelu tanh
  %4 = parax.gelu tanh %a : (tensor<2x16x64xf32>) -> tensor<2x16x64xf32>
  // CHECK: parax.gelu none
  %5 = parax.gelu none %a : (tensor<2x16x64xf32>) -> tensor<2x16x64xf32>
  // CHECK: parax.swiglu
  %6 = parax.swiglu %a, %0 : (tensor<2x16x64xf32>, tensor<2x16x64xf32>) -> tensor<2x16x64xf32>
  return %0, %1, %2, %3, %4, %5, %6 : tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x16x64xf32>
}

// CHECK-LABEL: func.func @shapes
func.func @shapes(%x: tensor<2x16x64xf32>, %h: tensor<2x16x4x24xf32>, %r: tensor<2x16x1x8xf32>)
    -> (tensor<2x16x4x16xf32>, tensor<2x4x16x16xf32>, tensor<2x16x4x8xf32>, tensor<2x16x4x32xf32>) {
  // CHECK: parax.reshape %{{.*}} : (tensor<2x16x64xf32>) -> tensor<2x16x4x16xf32>
  %0 = parax.reshape %x : (tensor<2x16x64xf32>) -> tensor<2x16x4x16xf32>
  // CHECK: parax.transpose %{{.*}} {permutation = array<i64: 0, 2, 1, 3>}
  %1 = parax.transpose %0 {permutation = array<i64: 0, 2, 1, 3>} : (tensor<2x16x4x16xf32>) -> tensor<2x4x16x16xf32>
  // CHECK: parax.slice %{{.*}} {dim = 3 : i64, start = 16 : i64} : (tensor<2x16x4x24xf32>) -> tensor<2x16x4x8xf32>
  %2 = parax.slice %h {dim = 3, start = 16} : (tensor<2x16x4x24xf32>) -> tensor<2x16x4x8xf32>
  // CHECK: parax.broadcast %{{.*}} : (tensor<2x16x1x8xf32>) -> tensor<2x16x4x8xf32>
  %3 = parax.broadcast %r : (tensor<2x16x1x8xf32>) -> tensor<2x16x4x8xf32>
  // CHECK: parax.concat %{{.*}}, %{{.*}} {dim = 3 : i64} : (tensor<2x16x4x24xf32>, tensor<2x16x4x8xf32>) -> tensor<2x16x4x32xf32>
  %4 = parax.concat %h, %3 {dim = 3} : (tensor<2x16x4x24xf32>, tensor<2x16x4x8xf32>) -> tensor<2x16x4x32xf32>
  return %0, %1, %2, %4 : tensor<2x16x4x16xf32>, tensor<2x4x16x16xf32>, tensor<2x16x4x8xf32>, tensor<2x16x4x32xf32>
}

// CHECK-LABEL: func.func @moe
func.func @moe(%x: tensor<2x16x64xf32>, %gate: tensor<8x64xf32>, %bias: tensor<8xf32>,
               %wg: tensor<8x96x64xf32>, %wu: tensor<8x96x64xf32>, %wd: tensor<8x64x96xf32>)
    -> (tensor<2x16x64xf32>, tensor<2x16x4xf32>) {
  // Mixtral-style: softmax, top-2, renormalised.
  // CHECK: %{{.*}}, %{{.*}} = parax.router softmax %{{.*}}, %{{.*}} {normalize, num_experts = 8 : i64, top_k = 2 : i64}
  %w, %i = parax.router softmax %x, %gate {num_experts = 8, top_k = 2, normalize}
      : (tensor<2x16x64xf32>, tensor<8x64xf32>) -> (tensor<2x16x2xf32>, tensor<2x16x2xi32>)
  // CHECK: parax.experts
  %y = parax.experts %x, %w, %i, %wg, %wu, %wd
      : (tensor<2x16x64xf32>, tensor<2x16x2xf32>, tensor<2x16x2xi32>, tensor<8x96x64xf32>, tensor<8x96x64xf32>, tensor<8x64x96xf32>) -> tensor<2x16x64xf32>
  // DeepSeek-V3-style: sigmoid, correction bias, group-limited, scaled.
  // CHECK: parax.router sigmoid %{{.*}}, %{{.*}}, %{{.*}} {normalize, num_experts = 8 : i64, num_groups = 4 : i64, scaling_factor = 2.500000e+00 : f64, top_k = 4 : i64, topk_groups = 2 : i64}
  %w2, %i2 = parax.router sigmoid %x, %gate, %bias {num_experts = 8, top_k = 4, normalize, scaling_factor = 2.5 : f64, num_groups = 4, topk_groups = 2}
      : (tensor<2x16x64xf32>, tensor<8x64xf32>, tensor<8xf32>) -> (tensor<2x16x4xf32>, tensor<2x16x4xi32>)
  return %y, %w2 : tensor<2x16x64xf32>, tensor<2x16x4xf32>
}

// CHECK-LABEL: func.func @loss
func.func @loss(%logits: tensor<2x16x256xf32>, %labels: tensor<2x16xi32>) -> tensor<f32> {
  // CHECK: parax.cross_entropy %{{.*}}, %{{.*}} : (tensor<2x16x256xf32>, tensor<2x16xi32>) -> tensor<f32>
  %l = parax.cross_entropy %logits, %labels : (tensor<2x16x256xf32>, tensor<2x16xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

parax.grid @vocab(tp = 2)

// Vocab-parallel: this rank's half of the vocabulary, every token's
// logsumexp over all of it.
// CHECK-LABEL: func.func @vocab_parallel_loss
func.func @vocab_parallel_loss(%logits: tensor<2x16x128xbf16>, %labels: tensor<2x16xi32>, %n: tensor<f32>) -> (tensor<f32>, tensor<2x16x128xbf16>) {
  // CHECK: parax.logsumexp %{{.*}} : (tensor<2x16x128xbf16>) -> tensor<2x16x1xf32>
  %p = parax.logsumexp %logits : (tensor<2x16x128xbf16>) -> tensor<2x16x1xf32>
  // CHECK: parax.cross_entropy %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {ignore_index = -100 : i64, vocab_axes = ["tp"], vocab_grid = @vocab}
  %l = parax.cross_entropy %logits, %labels, %n, %p {ignore_index = -100 : i64, vocab_grid = @vocab, vocab_axes = ["tp"]}
      : (tensor<2x16x128xbf16>, tensor<2x16xi32>, tensor<f32>, tensor<2x16x1xf32>) -> tensor<f32>
  // CHECK: parax.cross_entropy_grad %{{.*}}, %{{.*}}, %{{.*}} {vocab_axes = ["tp"], vocab_grid = @vocab}
  %d = parax.cross_entropy_grad %logits, %labels, %p {vocab_grid = @vocab, vocab_axes = ["tp"]}
      : (tensor<2x16x128xbf16>, tensor<2x16xi32>, tensor<2x16x1xf32>) -> tensor<2x16x128xbf16>
  return %l, %d : tensor<f32>, tensor<2x16x128xbf16>
}

// CHECK-LABEL: func.func @gradients
func.func @gradients(%ids: tensor<2x16xi32>, %x: tensor<2x16x64xf32>, %w: tensor<64xf32>, %lw: tensor<128x64xf32>,
                     %g: tensor<2x16x128xf32>, %logits: tensor<2x16x256xf32>, %q: tensor<2x16x4x16xf32>,
                     %k: tensor<2x16x2x16xf32>) {
  // CHECK: parax.cross_entropy_grad %{{.*}}, %{{.*}} : (tensor<2x16x256xf32>, tensor<2x16xi32>) -> tensor<2x16x256xf32>
  %dl = parax.cross_entropy_grad %logits, %ids : (tensor<2x16x256xf32>, tensor<2x16xi32>) -> tensor<2x16x256xf32>
  // CHECK: parax.linear_weight_grad %{{.*}}, %{{.*}} {transpose_w} : (tensor<2x16x64xf32>, tensor<2x16x128xf32>) -> tensor<128x64xf32>
  %dw = parax.linear_weight_grad %x, %g {transpose_w} : (tensor<2x16x64xf32>, tensor<2x16x128xf32>) -> tensor<128x64xf32>
  // CHECK: parax.rms_norm_grad %{{.*}}, %{{.*}}, %{{.*}} {eps = 1.000000e-05 : f64}
  %dx = parax.rms_norm_grad %x, %w, %x {eps = 1.0e-5 : f64} : (tensor<2x16x64xf32>, tensor<64xf32>, tensor<2x16x64xf32>) -> tensor<2x16x64xf32>
  // CHECK: parax.rms_norm_weight_grad %{{.*}}, %{{.*}} {eps = 1.000000e-05 : f64}
  %dn = parax.rms_norm_weight_grad %x, %x {eps = 1.0e-5 : f64} : (tensor<2x16x64xf32>, tensor<2x16x64xf32>) -> tensor<64xf32>
  // CHECK: parax.swiglu_grad %{{.*}}, %{{.*}}, %{{.*}} {operand = 1 : i64}
  %dg = parax.swiglu_grad %g, %g, %g {operand = 1} : (tensor<2x16x128xf32>, tensor<2x16x128xf32>, tensor<2x16x128xf32>) -> tensor<2x16x128xf32>
  // CHECK: = parax.attention_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {causal, head_dim = 16 : i64, num_heads = 4 : i64, num_kv_heads = 2 : i64, scale = 2.500000e-01 : f64}
  %dq, %dk, %dv = parax.attention_grad %q, %k, %k, %q {causal, num_heads = 4, num_kv_heads = 2, head_dim = 16, scale = 0.25 : f64}
      : (tensor<2x16x4x16xf32>, tensor<2x16x2x16xf32>, tensor<2x16x2x16xf32>, tensor<2x16x4x16xf32>)
      -> (tensor<2x16x4x16xf32>, tensor<2x16x2x16xf32>, tensor<2x16x2x16xf32>)
  // CHECK: parax.rope %{{.*}} {inverse, rotary_dim = 16 : i64, theta = 1.000000e+04 : f64}
  %r = parax.rope %q {theta = 1.0e4 : f64, rotary_dim = 16, inverse} : (tensor<2x16x4x16xf32>) -> tensor<2x16x4x16xf32>
  // CHECK: parax.embedding_grad %{{.*}}, %{{.*}} : (tensor<2x16xi32>, tensor<2x16x64xf32>) -> tensor<256x64xf32>
  %de = parax.embedding_grad %ids, %x : (tensor<2x16xi32>, tensor<2x16x64xf32>) -> tensor<256x64xf32>
  // CHECK: parax.sum_to %{{.*}} : (tensor<2x16x64xf32>) -> tensor<1x1x64xf32>
  %db = parax.sum_to %x : (tensor<2x16x64xf32>) -> tensor<1x1x64xf32>
  // CHECK: parax.gelu_grad tanh %{{.*}}, %{{.*}} : (tensor<2x16x128xf32>, tensor<2x16x128xf32>) -> tensor<2x16x128xf32>
  %dgelu = parax.gelu_grad tanh %g, %g : (tensor<2x16x128xf32>, tensor<2x16x128xf32>) -> tensor<2x16x128xf32>
  // CHECK: parax.layer_norm_grad %{{.*}}, %{{.*}}, %{{.*}} {eps = 1.000000e-05 : f64}
  %dln = parax.layer_norm_grad %x, %w, %x {eps = 1.0e-5 : f64} : (tensor<2x16x64xf32>, tensor<64xf32>, tensor<2x16x64xf32>) -> tensor<2x16x64xf32>
  // CHECK: parax.layer_norm_weight_grad %{{.*}}, %{{.*}} {eps = 1.000000e-05 : f64}
  %dlw = parax.layer_norm_weight_grad %x, %x {eps = 1.0e-5 : f64} : (tensor<2x16x64xf32>, tensor<2x16x64xf32>) -> tensor<64xf32>
  // CHECK: parax.position_embedding_grad %{{.*}} {offset = 3 : i64} : (tensor<1x1x64xf32>) -> tensor<128x64xf32>
  %dpos = parax.position_embedding_grad %db {offset = 3} : (tensor<1x1x64xf32>) -> tensor<128x64xf32>
  return
}

// MoE gradients round-trip.
// CHECK-LABEL: func.func @moe_gradients
// CHECK: parax.router_grad sigmoid %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {num_experts = 4 : i64, scaling_factor = 2.500000e+00 : f64, top_k = 2 : i64}
// CHECK: parax.experts_grad
// CHECK: parax.sigmoid_grad
func.func @moe_gradients(%x: tensor<2x4x16xf32>, %g: tensor<4x16xf32>, %dw: tensor<2x4x2xf32>, %b: tensor<4xf32>,
                         %i: tensor<2x4x2xi32>, %wg: tensor<4x24x16xf32>, %wd: tensor<4x16x24xf32>) -> tensor<2x4x4xf32> {
  %d = parax.router_grad sigmoid %x, %g, %dw, %b {num_experts = 4, top_k = 2, scaling_factor = 2.5} : (tensor<2x4x16xf32>, tensor<4x16xf32>, tensor<2x4x2xf32>, tensor<4xf32>) -> tensor<2x4x4xf32>
  %dx, %dws, %dg, %du, %dd = parax.experts_grad %x, %dw, %i, %wg, %wg, %wd, %x : (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<4x24x16xf32>, tensor<4x24x16xf32>, tensor<4x16x24xf32>, tensor<2x4x16xf32>) -> (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<4x24x16xf32>, tensor<4x24x16xf32>, tensor<4x16x24xf32>)
  %s = parax.sigmoid_grad %d, %d : (tensor<2x4x4xf32>, tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  return %s : tensor<2x4x4xf32>
}
