// RUN: parax-opt %s --parax-import-shard="axes=tp" -split-input-file -verify-diagnostics

// What the importer cannot express is named where it stands.

shard.grid @g(shape = 4)
func.func @halos(%x: tensor<16x64xf32>, %w: tensor<256x64xf32> {parax.param = "w"}) -> tensor<16x256xf32> {
  %s = shard.sharding @g split_axes = [[0]] halo_sizes = [1, 1] : !shard.sharding
  // expected-error @below {{import: halos and uneven shards are not supported}}
  %w_s = shard.shard %w to %s : tensor<256x64xf32>
  %h = parax.linear %x, %w_s {transpose_w} : (tensor<16x64xf32>, tensor<256x64xf32>) -> tensor<16x256xf32>
  return %h : tensor<16x256xf32>
}

// -----

shard.grid @g(shape = 4)
func.func @sharding_from_an_argument(%x: tensor<16x64xf32>, %s: !shard.sharding) -> tensor<16x64xf32> {
  // expected-error @below {{import: the sharding must come from shard.sharding}}
  %x_s = shard.shard %x to %s : tensor<16x64xf32>
  return %x_s : tensor<16x64xf32>
}

// -----

shard.grid @g(shape = 4)
func.func @not_a_parax_result(%x: tensor<16x64xf32>) -> tensor<16x64xf32> {
  %s = shard.sharding @g split_axes = [[0]] : !shard.sharding
  %c = tensor.empty() : tensor<16x64xf32>
  // expected-error @below {{import: an annotation on neither an argument, a returned value nor a parax op's result}}
  %c_s = shard.shard %c to %s : tensor<16x64xf32>
  %y = parax.add %x, %c_s : (tensor<16x64xf32>, tensor<16x64xf32>) -> tensor<16x64xf32>
  return %y : tensor<16x64xf32>
}
