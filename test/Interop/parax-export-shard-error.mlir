// RUN: parax-opt %s -split-input-file --parax-export-shard -verify-diagnostics

// Upstream shardings split a dimension in blocks only: a plan that deals a
// sequence out over a cyclic axis (context parallelism) cannot be written
// as them.
// expected-error @+1 {{export: upstream shard has no cyclic split (cyclic_axes ["cp"])}}
parax.grid @g(cp = 2) {cyclic_axes = ["cp"]}
func.func @f(%x: tensor<2x8x16xf32>) -> tensor<2x8x16xf32> {
  return %x : tensor<2x8x16xf32>
}
