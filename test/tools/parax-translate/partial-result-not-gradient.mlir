// RUN: parax-translate --to-executable %s -verify-diagnostics -o /dev/null

// A result that is a partial sum over cp but no gradient: the runtime adds
// the partial sums of gradients only (with its data-parallel reduction), so
// the translation refuses it rather than write a file whose result would
// be one rank's part.

parax.grid @g(cp = 2)
func.func @forward(%x: tensor<4xf32>) -> (tensor<4xf32> {parax.global_sharding = #parax.sharding<@g, [{}], partial = {cp}>}) {
  %y = parax.silu %x : (tensor<4xf32>) -> tensor<4xf32>
  // expected-error @+1 {{result #0 is a partial sum but not a gradient (the runtime adds the partial sums of gradients only)}}
  return %y : tensor<4xf32>
}
