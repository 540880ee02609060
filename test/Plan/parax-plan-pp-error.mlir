// RUN: parax-opt %s -verify-diagnostics --parax-plan="cluster=dgx-h100 workload=train:batch=8,seq=16,pp=2"

// A graph with no decoder layer (one linear) pinned to two pipeline
// stages: the error names the stage count against the layers.
// expected-error @+1 {{pp=2 is more stages than the model's 0 decoder layer(s)}}
func.func @f(%tok: tensor<8x16xi32>, %emb: tensor<64x32xbf16> {parax.param = "emb"}, %w0: tensor<32x32xbf16> {parax.param = "w0"}) -> tensor<8x16x32xbf16> {
  %h = parax.embedding %tok, %emb {parax.layer = -1 : i64} : (tensor<8x16xi32>, tensor<64x32xbf16>) -> tensor<8x16x32xbf16>
  %a = parax.linear %h, %w0 {transpose_w, parax.layer = 0 : i64} : (tensor<8x16x32xbf16>, tensor<32x32xbf16>) -> tensor<8x16x32xbf16>
  return %a : tensor<8x16x32xbf16>
}
