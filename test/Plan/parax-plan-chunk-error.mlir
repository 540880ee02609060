// RUN: parax-opt %s -verify-diagnostics --parax-plan="cluster=dgx-h100 workload=prefill:batch=1,seq=8"

// A generation step's chunk planned as a prefill longer than its caches
// hold: refused, naming both workloads it may be planned with.
// expected-error @+1 {{parax-plan: this graph is a step over a KV cache of 4 tokens (built with --past or --cache): plan it with a decode workload (decode:batch=B,context=4), or as a prefill chunk (prefill:batch=B,seq=P, P <= 4), not 'prefill:batch=1,seq=8'}}
func.func @chunk_longer_than_the_cache(%tok: tensor<1x2xi32>, %pos: tensor<i32>,
    %emb: tensor<64x32xbf16> {parax.param = "emb"}, %cache: tensor<1x4x2x16xbf16>) -> tensor<1x4x2x16xbf16> {
  %h = parax.embedding %tok, %emb {parax.layer = -1 : i64} : (tensor<1x2xi32>, tensor<64x32xbf16>) -> tensor<1x2x32xbf16>
  %x = parax.reshape %h {parax.layer = 0 : i64} : (tensor<1x2x32xbf16>) -> tensor<1x2x2x16xbf16>
  %c = parax.cache_update %cache, %x, %pos {parax.layer = 0 : i64} : (tensor<1x4x2x16xbf16>, tensor<1x2x2x16xbf16>, tensor<i32>) -> tensor<1x4x2x16xbf16>
  return %c : tensor<1x4x2x16xbf16>
}
