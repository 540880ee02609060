// RUN: parax-translate --to-executable %s -verify-diagnostics -o /dev/null

// A partitioned piece of a fused parameter: locally 8x4, globally 8x8 (tp=2
// on dimension 1), starting at column 20 of a 24-column checkpoint tensor.
// The function's verifier cannot see the global extent; the translation
// can, and refuses the piece instead of writing a file the loader would
// read past the tensor with.

parax.grid @g(tp = 2)
// expected-error @+1 {{argument #0: its piece (offset 20, extent 8 in dimension 1) is outside the checkpoint tensor (extent 24)}}
func.func @forward(%w: tensor<8x4xf32> {parax.param = "qkv", parax.param_offset = array<i64: 0, 20>, parax.param_shape = array<i64: 8, 24>, parax.global_sharding = #parax.sharding<@g, [{}, {tp}]>}) -> tensor<8x4xf32> {
  return %w : tensor<8x4xf32>
}
