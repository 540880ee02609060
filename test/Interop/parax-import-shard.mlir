// RUN: parax-opt %s --parax-import-shard="axes=tp" | FileCheck %s --check-prefix=IMPORT
// RUN: parax-opt %s --parax-import-shard="axes=tp" --parax-partition | FileCheck %s --check-prefix=PART
// RUN: not parax-opt %s --parax-import-shard="axes=dp,tp" 2>&1 | FileCheck %s --check-prefix=AXES

// Upstream shard annotations on a parax MLP become parax shardings (user
// constraints); unannotated ops follow them; partitioning gives Megatron's
// single all-reduce.

// IMPORT: parax.grid @g (tp = 4)
// IMPORT-LABEL: func.func @mlp
// IMPORT-SAME: parax.sharding = #parax.sharding<@g, [{tp}, {}]>
// IMPORT-SAME: parax.sharding = #parax.sharding<@g, [{}, {tp}]>
// IMPORT-NOT: shard.
// IMPORT: parax.linear {{.*}}parax.shardings = [#parax.sharding<@g, [{}, {tp}]>]
// PART-LABEL: func.func @mlp
// PART-COUNT-1: parax.all_reduce
// PART-NOT: parax.all_gather
// PART: return
// AXES: import: 2 axis names for a grid of 1 axes
shard.grid @g(shape = 4)
func.func @mlp(%x: tensor<16x64xf32>, %up: tensor<256x64xf32> {parax.param = "up"},
               %down: tensor<64x256xf32> {parax.param = "down"}) -> tensor<16x64xf32> {
  %s0 = shard.sharding @g split_axes = [[0]] : !shard.sharding
  %up_s = shard.shard %up to %s0 : tensor<256x64xf32>
  %s1 = shard.sharding @g split_axes = [[], [0]] : !shard.sharding
  %down_s = shard.shard %down to %s1 : tensor<64x256xf32>
  %h = parax.linear %x, %up_s {transpose_w} : (tensor<16x64xf32>, tensor<256x64xf32>) -> tensor<16x256xf32>
  %h_s = shard.shard %h to %s1 : tensor<16x256xf32>
  %y = parax.linear %h_s, %down_s {transpose_w} : (tensor<16x256xf32>, tensor<64x256xf32>) -> tensor<16x64xf32>
  return %y : tensor<16x64xf32>
}
