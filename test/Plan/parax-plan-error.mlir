// RUN: parax-opt %s -split-input-file -verify-diagnostics --parax-plan="cluster=dgx-h100 workload=train:batch=8,seq=16"
// RUN: not parax-opt %s -split-input-file --parax-plan="cluster=nonesuch workload=train:batch=8,seq=16" 2>&1 | FileCheck %s --check-prefix=CLUSTER
// RUN: not parax-opt %s --parax-plan="cluster=dgx-h100 workload=train:seq=16" 2>&1 | FileCheck %s --check-prefix=WORKLOAD
// RUN: not parax-opt %s -split-input-file --parax-plan="cluster=dgx-h100:nodes=9223372036854775807 workload=train:batch=8,seq=16" 2>&1 | FileCheck %s --check-prefix=HUGE

// CLUSTER: cluster 'nonesuch' is neither a preset
// WORKLOAD: workload 'train:seq=16': needs batch=N
// HUGE: cluster 'dgx-h100:nodes=9223372036854775807': 9223372036854775807 nodes of 8 devices are more than parax plans for (16777216 devices at most)

// A model whose weights (one 96 GB linear) cannot fit in 8 x 85.5 GB with any
// placement the planner may use: the error says what overflows.
// expected-error @+1 {{parax-plan: nothing fits in 85.5 GB per device}}
func.func @negative_too_big(%tok: tensor<1x16xi32>,
    %emb: tensor<64x16384xbf16> {parax.param = "emb"},
    %w: tensor<3000000x16384xbf16> {parax.param = "w"}) -> tensor<1x16x3000000xbf16> {
  %h = parax.embedding %tok, %emb {parax.layer = -1 : i64} : (tensor<1x16xi32>, tensor<64x16384xbf16>) -> tensor<1x16x16384xbf16>
  %y = parax.linear %h, %w {transpose_w, parax.layer = 0 : i64} : (tensor<1x16x16384xbf16>, tensor<3000000x16384xbf16>) -> tensor<1x16x3000000xbf16>
  return %y : tensor<1x16x3000000xbf16>
}

// -----

// A weight of 2^64 elements: its count wrapped to 0 in the cost interface
// (a 274.88 B-parameter model, 0 FLOPs a token).
// expected-error @+1 {{argument #2 ('tensor<4294967296x4294967296xbf16>') has more than 2^53 elements: no device holds it}}
func.func @negative_huge(%tok: tensor<1x16xi32>,
    %emb: tensor<64x4294967296xbf16> {parax.param = "emb"},
    %w: tensor<4294967296x4294967296xbf16> {parax.param = "w"}) -> tensor<1x16x4294967296xbf16> {
  %h = parax.embedding %tok, %emb {parax.layer = -1 : i64} : (tensor<1x16xi32>, tensor<64x4294967296xbf16>) -> tensor<1x16x4294967296xbf16>
  %y = parax.linear %h, %w {transpose_w, parax.layer = 0 : i64} : (tensor<1x16x4294967296xbf16>, tensor<4294967296x4294967296xbf16>) -> tensor<1x16x4294967296xbf16>
  return %y : tensor<1x16x4294967296xbf16>
}

// -----

func.func @negative_no_layer(%tok: tensor<1x16xi32>, %emb: tensor<64x32xbf16> {parax.param = "emb"}) -> tensor<1x16x32xbf16> {
  // expected-error @+1 {{the planner needs every op's 'parax.layer'}}
  %h = parax.embedding %tok, %emb : (tensor<1x16xi32>, tensor<64x32xbf16>) -> tensor<1x16x32xbf16>
  return %h : tensor<1x16x32xbf16>
}

// -----

// expected-error @+1 {{the planner needs a token input}}
func.func @negative_no_tokens(%ids: tensor<16xi32>, %emb: tensor<64x32xbf16> {parax.param = "emb"}) -> tensor<16x32xbf16> {
  %h = parax.embedding %ids, %emb {parax.layer = -1 : i64} : (tensor<16xi32>, tensor<64x32xbf16>) -> tensor<16x32xbf16>
  return %h : tensor<16x32xbf16>
}

// -----

// A decode step over a KV cache planned for training: refused, naming the
// cache and the workload to use.
// expected-error @+1 {{parax-plan: this graph is a step over a KV cache of 5 tokens (built with --past or --cache): plan it with a decode workload (decode:batch=B,context=5), not 'train:batch=8,seq=16}}
func.func @negative_cache_for_training(%tok: tensor<1x1xi32>, %emb: tensor<64x32xbf16> {parax.param = "emb"},
    %past_k: tensor<1x5x2x16xbf16>, %past_v: tensor<1x5x2x16xbf16>) -> tensor<1x1x2x16xbf16> {
  %h = parax.embedding %tok, %emb {parax.layer = -1 : i64} : (tensor<1x1xi32>, tensor<64x32xbf16>) -> tensor<1x1x32xbf16>
  %x = parax.reshape %h {parax.layer = 0 : i64} : (tensor<1x1x32xbf16>) -> tensor<1x1x2x16xbf16>
  %k = parax.concat %past_k, %x {dim = 1 : i64, parax.layer = 0 : i64} : (tensor<1x5x2x16xbf16>, tensor<1x1x2x16xbf16>) -> tensor<1x6x2x16xbf16>
  %v = parax.concat %past_v, %x {dim = 1 : i64, parax.layer = 0 : i64} : (tensor<1x5x2x16xbf16>, tensor<1x1x2x16xbf16>) -> tensor<1x6x2x16xbf16>
  %o = parax.attention %x, %k, %v {causal, num_heads = 2 : i64, num_kv_heads = 2 : i64, head_dim = 16 : i64, scale = 0.25 : f64, parax.layer = 0 : i64}
      : (tensor<1x1x2x16xbf16>, tensor<1x6x2x16xbf16>, tensor<1x6x2x16xbf16>) -> tensor<1x1x2x16xbf16>
  return %o : tensor<1x1x2x16xbf16>
}
