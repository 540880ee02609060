// RUN: parax-opt %s -split-input-file --parax-export-shard | FileCheck %s --check-prefix=EXPORT
// RUN: parax-opt %s -split-input-file --parax-export-shard | mlir-opt -split-input-file --pass-pipeline='builtin.module(func.func(sharding-propagation,shard-partition))' | FileCheck %s --check-prefix=UPSTREAM
// RUN: parax-opt %s -split-input-file --parax-partition | FileCheck %s --check-prefix=OURS

// A Megatron MLP (column then row) and head-split attention contractions,
// exported to upstream shard on linalg: upstream's partitioner places the
// same collectives as ours.

parax.grid @g(tp = 4)
// EXPORT: shard.grid @g(shape = 4)
// EXPORT-LABEL: func.func @mlp
// EXPORT: shard.sharding @g split_axes = {{\[\[}}0], []]
// EXPORT: linalg.generic
// EXPORT: shard.shard %{{.*}} to %{{.*}} annotate_for_users
// UPSTREAM-LABEL: func.func @mlp
// UPSTREAM-COUNT-1: shard.all_reduce
// UPSTREAM-NOT: shard.all_gather
// UPSTREAM: return
// OURS-LABEL: func.func @mlp
// OURS-COUNT-1: parax.all_reduce
// OURS-NOT: parax.all_gather
// OURS: return
func.func @mlp(%x: tensor<16x64xf32>,
    %up: tensor<256x64xf32> {parax.param = "up", parax.sharding = #parax.sharding<@g, [{tp}, {}]>},
    %down: tensor<64x256xf32> {parax.param = "down", parax.sharding = #parax.sharding<@g, [{}, {tp}]>}) -> tensor<16x64xf32> {
  %h = parax.linear %x, %up {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {tp}]>]} : (tensor<16x64xf32>, tensor<256x64xf32>) -> tensor<16x256xf32>
  %a = parax.silu %h {parax.shardings = [#parax.sharding<@g, [{}, {tp}]>]} : (tensor<16x256xf32>) -> tensor<16x256xf32>
  %y = parax.linear %a, %down {transpose_w, parax.shardings = [#parax.sharding<@g, [{}, {}], partial = {tp}>]} : (tensor<16x256xf32>, tensor<64x256xf32>) -> tensor<16x64xf32>
  return %y : tensor<16x64xf32>
}

// -----

parax.grid @g(tp = 4)
// Attention split by heads: no communication inside it; the heads are
// gathered only to return the result whole.
// UPSTREAM-LABEL: func.func @attention
// UPSTREAM-NOT: shard.all_reduce
// UPSTREAM-COUNT-1: shard.all_gather
// UPSTREAM: return
// OURS-LABEL: func.func @attention
// OURS-NOT: parax.all_reduce
// OURS-COUNT-1: parax.all_gather
// OURS: return
func.func @attention(%q: tensor<2x8x4x16xf32> {parax.sharding = #parax.sharding<@g, [{}, {}, {tp}, {}]>},
                     %k: tensor<2x8x4x16xf32> {parax.sharding = #parax.sharding<@g, [{}, {}, {tp}, {}]>},
                     %v: tensor<2x8x4x16xf32> {parax.sharding = #parax.sharding<@g, [{}, {}, {tp}, {}]>}) -> tensor<2x8x4x16xf32> {
  %o = parax.attention %q, %k, %v {num_heads = 4, num_kv_heads = 4, head_dim = 16, scale = 0.25 : f64, parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}, {}]>]}
      : (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>) -> tensor<2x8x4x16xf32>
  return %o : tensor<2x8x4x16xf32>
}
