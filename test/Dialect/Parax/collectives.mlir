// RUN: parax-opt %s | parax-opt | FileCheck %s

// Round trip of the communication ops of partitioned programs.

parax.grid @g(pp = 2, dp = 2, tp = 4)

// CHECK-LABEL: func.func @collectives
func.func @collectives(%p: tensor<2x16x64xf32>, %s: tensor<2x16x16xf32>, %a: tensor<2x4x64xf32>)
    -> (tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x4x64xf32>, tensor<2x16x16xf32>, tensor<2x16x16xf32>) {
  // CHECK: parax.all_reduce %{{.*}} over @g ["tp"] : tensor<2x16x64xf32> -> tensor<2x16x64xf32>
  %0 = parax.all_reduce %p over @g ["tp"] : tensor<2x16x64xf32> -> tensor<2x16x64xf32>
  // CHECK: parax.all_gather %{{.*}} over @g ["tp"] dim 2 : tensor<2x16x16xf32> -> tensor<2x16x64xf32>
  %1 = parax.all_gather %s over @g ["tp"] dim 2 : tensor<2x16x16xf32> -> tensor<2x16x64xf32>
  // CHECK: parax.reduce_scatter %{{.*}} over @g ["tp"] dim 1 : tensor<2x16x64xf32> -> tensor<2x4x64xf32>
  %2 = parax.reduce_scatter %p over @g ["tp"] dim 1 : tensor<2x16x64xf32> -> tensor<2x4x64xf32>
  // CHECK: parax.all_to_all %{{.*}} over @g ["tp"] split 2 concat 1 : tensor<2x4x64xf32> -> tensor<2x16x16xf32>
  %3 = parax.all_to_all %a over @g ["tp"] split 2 concat 1 : tensor<2x4x64xf32> -> tensor<2x16x16xf32>
  // Two axes: a group of 8 (dp major, tp minor).
  // CHECK: parax.shard_slice %{{.*}} over @g ["dp", "tp"] dim 2 : tensor<2x16x64xf32> -> tensor<2x16x8xf32>
  %4 = parax.shard_slice %p over @g ["dp", "tp"] dim 2 : tensor<2x16x64xf32> -> tensor<2x16x8xf32>
  // CHECK: parax.shard_slice %{{.*}} over @g ["tp"] dim 2 : tensor<2x16x64xf32> -> tensor<2x16x16xf32>
  %5 = parax.shard_slice %p over @g ["tp"] dim 2 : tensor<2x16x64xf32> -> tensor<2x16x16xf32>
  return %0, %1, %2, %3, %5 : tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x4x64xf32>, tensor<2x16x16xf32>, tensor<2x16x16xf32>
}

// CHECK-LABEL: func.func @bias_as_partial
func.func @bias_as_partial(%b: tensor<64xf32>) -> tensor<64xf32> {
  // CHECK: parax.to_partial %{{.*}} over @g ["tp"] : tensor<64xf32> -> tensor<64xf32>
  %0 = parax.to_partial %b over @g ["tp"] : tensor<64xf32> -> tensor<64xf32>
  return %0 : tensor<64xf32>
}

// CHECK-LABEL: func.func @stage0
func.func @stage0(%h: tensor<2x16x64xf32>) {
  // CHECK: parax.send %{{.*}} over @g ["pp"] to 1 : tensor<2x16x64xf32>
  parax.send %h over @g ["pp"] to 1 : tensor<2x16x64xf32>
  return
}

// CHECK-LABEL: func.func @stage1
func.func @stage1() -> tensor<2x16x64xf32> {
  // CHECK: parax.recv over @g ["pp"] from 0 : tensor<2x16x64xf32>
  %h = parax.recv over @g ["pp"] from 0 : tensor<2x16x64xf32>
  return %h : tensor<2x16x64xf32>
}

// CHECK-LABEL: func.func @vocab_parallel_embedding
func.func @vocab_parallel_embedding(%ids: tensor<2x16xi32>, %t: tensor<64x64xf32>) -> tensor<2x16x64xf32> {
  // CHECK: parax.embedding %{{.*}}, %{{.*}} {vocab_axes = ["tp"], vocab_grid = @g}
  %0 = parax.embedding %ids, %t {vocab_grid = @g, vocab_axes = ["tp"]} : (tensor<2x16xi32>, tensor<64x64xf32>) -> tensor<2x16x64xf32>
  return %0 : tensor<2x16x64xf32>
}

// A dispatch holding fewer rows than every rank's pairs (an expert
// capacity: 40 of the 128 any routing could send one rank).
// CHECK-LABEL: func.func @expert_capacity
func.func @expert_capacity(%x: tensor<2x8x64xf32>, %w: tensor<2x8x2xf32>, %i: tensor<2x8x2xi32>) -> tensor<2x8x64xf32> {
  // CHECK: parax.moe_dispatch {{.*}} -> (tensor<40x64xf32>, tensor<40x1xf32>, tensor<40x1xi32>)
  %r, %rw, %re = parax.moe_dispatch %x, %w, %i over @g ["tp"] {num_experts = 8} : (tensor<2x8x64xf32>, tensor<2x8x2xf32>, tensor<2x8x2xi32>) -> (tensor<40x64xf32>, tensor<40x1xf32>, tensor<40x1xi32>)
  // CHECK: parax.moe_combine {{.*}} : (tensor<40x64xf32>, tensor<2x8x2xi32>) -> tensor<2x8x64xf32>
  %c = parax.moe_combine %r, %i over @g ["tp"] {num_experts = 8} : (tensor<40x64xf32>, tensor<2x8x2xi32>) -> tensor<2x8x64xf32>
  return %c : tensor<2x8x64xf32>
}

// CHECK-LABEL: func.func @expert_parallel
func.func @expert_parallel(%x: tensor<2x8x64xf32>, %w: tensor<2x8x2xf32>, %i: tensor<2x8x2xi32>,
    %g: tensor<2x96x64xf32>, %u: tensor<2x96x64xf32>, %d: tensor<2x64x96xf32>) -> tensor<2x8x64xf32> {
  // CHECK: parax.moe_dispatch %{{.*}}, %{{.*}}, %{{.*}} over @g ["tp"] {num_experts = 8 : i64} : (tensor<2x8x64xf32>, tensor<2x8x2xf32>, tensor<2x8x2xi32>) -> (tensor<128x64xf32>, tensor<128x1xf32>, tensor<128x1xi32>)
  %r, %rw, %re = parax.moe_dispatch %x, %w, %i over @g ["tp"] {num_experts = 8} : (tensor<2x8x64xf32>, tensor<2x8x2xf32>, tensor<2x8x2xi32>) -> (tensor<128x64xf32>, tensor<128x1xf32>, tensor<128x1xi32>)
  %y = parax.experts %r, %rw, %re, %g, %u, %d : (tensor<128x64xf32>, tensor<128x1xf32>, tensor<128x1xi32>, tensor<2x96x64xf32>, tensor<2x96x64xf32>, tensor<2x64x96xf32>) -> tensor<128x64xf32>
  // CHECK: parax.moe_combine %{{.*}}, %{{.*}} over @g ["tp"] {num_experts = 8 : i64} : (tensor<128x64xf32>, tensor<2x8x2xi32>) -> tensor<2x8x64xf32>
  %c = parax.moe_combine %y, %i over @g ["tp"] {num_experts = 8} : (tensor<128x64xf32>, tensor<2x8x2xi32>) -> tensor<2x8x64xf32>
  return %c : tensor<2x8x64xf32>
}
