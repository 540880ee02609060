// RUN: parax-opt %s -split-input-file --parax-split-fused-params | FileCheck %s

// A fused qkv weight and bias read only through slices: one parameter per
// slice, each a box of the same checkpoint tensor; the slices are gone. A
// slice taken twice becomes one parameter. Data arguments keep their place.

// CHECK-LABEL: func.func @fused
// CHECK-SAME: %arg0: tensor<2x8xf32>
// CHECK-SAME: %arg1: tensor<8x8xf32> {parax.param = "qkv.weight", parax.param_offset = array<i64: 0, 0>, parax.param_shape = array<i64: 8, 24>}
// CHECK-SAME: %arg2: tensor<8x8xf32> {parax.param = "qkv.weight", parax.param_offset = array<i64: 0, 8>, parax.param_shape = array<i64: 8, 24>}
// CHECK-SAME: %arg3: tensor<8x8xf32> {parax.param = "qkv.weight", parax.param_offset = array<i64: 0, 16>, parax.param_shape = array<i64: 8, 24>}
// CHECK-SAME: %arg4: tensor<8xf32> {parax.param = "qkv.bias", parax.param_offset = array<i64: 8>, parax.param_shape = array<i64: 24>}
// CHECK-SAME: %arg5: tensor<2x8xf32>
// CHECK-NOT: parax.slice
// CHECK: parax.linear %arg0, %arg1 :
// CHECK: parax.linear %arg0, %arg2, %arg4 :
// CHECK: parax.linear %arg0, %arg3 :
// CHECK: parax.linear %arg5, %arg2, %arg4 :
func.func @fused(%x: tensor<2x8xf32>, %w: tensor<8x24xf32> {parax.param = "qkv.weight"},
                 %b: tensor<24xf32> {parax.param = "qkv.bias"}, %y: tensor<2x8xf32>) -> (tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>) {
  %wq = parax.slice %w {dim = 1, start = 0} : (tensor<8x24xf32>) -> tensor<8x8xf32>
  %wk = parax.slice %w {dim = 1, start = 8} : (tensor<8x24xf32>) -> tensor<8x8xf32>
  %wv = parax.slice %w {dim = 1, start = 16} : (tensor<8x24xf32>) -> tensor<8x8xf32>
  %bk = parax.slice %b {dim = 0, start = 8} : (tensor<24xf32>) -> tensor<8xf32>
  %bk2 = parax.slice %b {dim = 0, start = 8} : (tensor<24xf32>) -> tensor<8xf32>
  %q = parax.linear %x, %wq : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
  %k = parax.linear %x, %wk, %bk : (tensor<2x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
  %v = parax.linear %x, %wv : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
  %s = parax.linear %y, %wk, %bk2 : (tensor<2x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
  return %q, %k, %v, %s : tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>
}

// -----

// A piece of a piece: the offsets add up, the checkpoint shape stays.

// CHECK-LABEL: func.func @nested
// CHECK-SAME: %arg0: tensor<4x8xf32> {parax.param = "w", parax.param_offset = array<i64: 6, 16>, parax.param_shape = array<i64: 16, 24>}
// CHECK-NOT: parax.slice
func.func @nested(%w: tensor<8x8xf32> {parax.param = "w", parax.param_offset = array<i64: 4, 16>, parax.param_shape = array<i64: 16, 24>}) -> tensor<4x8xf32> {
  %p = parax.slice %w {dim = 0, start = 2} : (tensor<8x8xf32>) -> tensor<4x8xf32>
  return %p : tensor<4x8xf32>
}

// -----

// Left as they are: a parameter also read whole, one already sharded by
// hand, a stack of experts, and a function that is called.

// CHECK-LABEL: func.func @kept
// CHECK-COUNT-3: parax.slice
// CHECK-NOT: parax.param_offset
parax.grid @g(tp = 2)
func.func @kept(%x: tensor<2x8xf32>, %w: tensor<8x16xf32> {parax.param = "w"},
                %s: tensor<8x16xf32> {parax.param = "s", parax.sharding = #parax.sharding<@g, [{}, {tp}]>},
                %e: tensor<2x8x16xf32> {parax.param = "experts.{e}.w"}) -> (tensor<8x8xf32>, tensor<8x16xf32>, tensor<8x8xf32>, tensor<1x8x16xf32>) {
  %a = parax.slice %w {dim = 1, start = 0} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  %b = parax.slice %s {dim = 1, start = 8} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  %c = parax.slice %e {dim = 0, start = 1} : (tensor<2x8x16xf32>) -> tensor<1x8x16xf32>
  return %a, %w, %b, %c : tensor<8x8xf32>, tensor<8x16xf32>, tensor<8x8xf32>, tensor<1x8x16xf32>
}

// -----

// CHECK-LABEL: func.func @callee
// CHECK: parax.slice
func.func @callee(%w: tensor<8x16xf32> {parax.param = "w"}) -> tensor<8x8xf32> {
  %a = parax.slice %w {dim = 1, start = 0} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  return %a : tensor<8x8xf32>
}
func.func @caller(%w: tensor<8x16xf32>) -> tensor<8x8xf32> {
  %a = func.call @callee(%w) : (tensor<8x16xf32>) -> tensor<8x8xf32>
  return %a : tensor<8x8xf32>
}
