// RUN: parax-opt %s -split-input-file --parax-tp-overlap=chunks=2 | FileCheck %s
// RUN: parax-opt %s -split-input-file --parax-tp-overlap=chunks=4 | FileCheck %s --check-prefix=FOUR

// A row-parallel GEMM's partial sum, all-reduced: two row chunks along the
// batch (dim 0), each multiplied and all-reduced alone, then joined.
// CHECK-LABEL: func.func @row_parallel
// CHECK: %[[X0:.*]] = parax.slice %arg0 {dim = 0 : i64, start = 0 : i64} : (tensor<2x8x16xf32>) -> tensor<1x8x16xf32>
// CHECK: %[[P0:.*]] = parax.linear %[[X0]], %arg1 {transpose_w} : (tensor<1x8x16xf32>, tensor<32x16xf32>) -> tensor<1x8x32xf32>
// CHECK: %[[Y0:.*]] = parax.all_reduce %[[P0]] over @g ["tp"] : tensor<1x8x32xf32> -> tensor<1x8x32xf32>
// CHECK: %[[X1:.*]] = parax.slice %arg0 {dim = 0 : i64, start = 1 : i64}
// CHECK: %[[P1:.*]] = parax.linear %[[X1]], %arg1
// CHECK: %[[Y1:.*]] = parax.all_reduce %[[P1]]
// CHECK: %[[J:.*]] = parax.concat %[[Y0]], %[[Y1]] {dim = 0 : i64} : (tensor<1x8x32xf32>, tensor<1x8x32xf32>) -> tensor<2x8x32xf32>
// CHECK: parax.add %[[J]], %arg2
// Four chunks: of the leading dimensions only the sequence (8) divides by
// 4: split there, 2 positions a chunk.
// FOUR-LABEL: func.func @row_parallel
// FOUR-COUNT-4: parax.all_reduce {{.*}} : tensor<2x2x32xf32> -> tensor<2x2x32xf32>
// FOUR: parax.concat {{.*}} {dim = 1 : i64}
// FOUR-LABEL: func.func @reduce_scatter_keeps_its_dim
parax.grid @g(tp = 2)
func.func @row_parallel(%x: tensor<2x8x16xf32>, %w: tensor<32x16xf32>, %r: tensor<2x8x32xf32>) -> tensor<2x8x32xf32> {
  %p = parax.linear %x, %w {transpose_w} : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %y = parax.all_reduce %p over @g ["tp"] : tensor<2x8x32xf32> -> tensor<2x8x32xf32>
  %z = parax.add %y, %r : (tensor<2x8x32xf32>, tensor<2x8x32xf32>) -> tensor<2x8x32xf32>
  return %z : tensor<2x8x32xf32>
}

// -----

// Sequence parallelism's reduce-scatter along the sequence (dim 1): the
// chunks are along the batch, so each rank keeps the same rows.
// CHECK-LABEL: func.func @reduce_scatter_keeps_its_dim
// CHECK: parax.reduce_scatter {{.*}} dim 1 : tensor<1x8x32xf32> -> tensor<1x4x32xf32>
// CHECK: parax.reduce_scatter {{.*}} dim 1 : tensor<1x8x32xf32> -> tensor<1x4x32xf32>
// CHECK: parax.concat {{.*}} {dim = 0 : i64} : (tensor<1x4x32xf32>, tensor<1x4x32xf32>) -> tensor<2x4x32xf32>
// A column-parallel head's logits gathered on the features: chunks along
// the batch too.
// CHECK: parax.all_gather {{.*}} dim 2 : tensor<1x4x32xf32> -> tensor<1x4x64xf32>
// CHECK: parax.all_gather {{.*}} dim 2 : tensor<1x4x32xf32> -> tensor<1x4x64xf32>
// CHECK: parax.concat {{.*}} {dim = 0 : i64} : (tensor<1x4x64xf32>, tensor<1x4x64xf32>) -> tensor<2x4x64xf32>
// With 4 chunks the batch does not divide and the sequence is the
// reduce-scatter's own: the sequence viewed as [2 ranks' pieces, 4 rows],
// each piece's rows cut alike, so each rank still keeps its 4 contiguous
// rows; the gather then splits the sequence.
// FOUR: %[[V:.*]] = parax.reshape %arg0 : (tensor<2x8x16xf32>) -> tensor<2x2x4x16xf32>
// FOUR: parax.slice %[[V]] {dim = 2 : i64, start = 0 : i64} : (tensor<2x2x4x16xf32>) -> tensor<2x2x1x16xf32>
// FOUR: parax.reduce_scatter {{.*}} dim 1 : tensor<2x2x1x32xf32> -> tensor<2x1x1x32xf32>
// FOUR: parax.slice %[[V]] {dim = 2 : i64, start = 3 : i64}
// FOUR: %[[J:.*]] = parax.concat {{.*}} {dim = 2 : i64} : ({{.*}}) -> tensor<2x1x4x32xf32>
// FOUR: parax.reshape %[[J]] : (tensor<2x1x4x32xf32>) -> tensor<2x4x32xf32>
// FOUR-COUNT-4: parax.all_gather {{.*}} dim 2 : tensor<2x1x32xf32> -> tensor<2x1x64xf32>
parax.grid @g(tp = 2)
func.func @reduce_scatter_keeps_its_dim(%x: tensor<2x8x16xf32>, %w: tensor<32x16xf32>, %h: tensor<32x32xf32>) -> tensor<2x4x64xf32> {
  %p = parax.linear %x, %w {transpose_w} : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %y = parax.reduce_scatter %p over @g ["tp"] dim 1 : tensor<2x8x32xf32> -> tensor<2x4x32xf32>
  %l = parax.linear %y, %h {transpose_w} : (tensor<2x4x32xf32>, tensor<32x32xf32>) -> tensor<2x4x32xf32>
  %g = parax.all_gather %l over @g ["tp"] dim 2 : tensor<2x4x32xf32> -> tensor<2x4x64xf32>
  return %g : tensor<2x4x64xf32>
}

// -----

// Left whole: a GEMM whose result is read by more than its collective, and
// one with no leading dimension that divides (3 rows), and a collective
// not fed by a GEMM.
// CHECK-LABEL: func.func @left_whole
// CHECK-NOT: parax.slice
// CHECK-NOT: parax.concat
// CHECK: return
parax.grid @g(tp = 2)
func.func @left_whole(%x: tensor<2x8x16xf32>, %w: tensor<32x16xf32>, %o: tensor<3x16xf32>, %v: tensor<2x8x32xf32>) -> (tensor<2x8x32xf32>, tensor<2x8x32xf32>, tensor<3x32xf32>, tensor<2x8x32xf32>) {
  %p = parax.linear %x, %w {transpose_w} : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %y = parax.all_reduce %p over @g ["tp"] : tensor<2x8x32xf32> -> tensor<2x8x32xf32>
  %q = parax.linear %o, %w {transpose_w} : (tensor<3x16xf32>, tensor<32x16xf32>) -> tensor<3x32xf32>
  %s = parax.all_reduce %q over @g ["tp"] : tensor<3x32xf32> -> tensor<3x32xf32>
  %t = parax.all_reduce %v over @g ["tp"] : tensor<2x8x32xf32> -> tensor<2x8x32xf32>
  return %y, %p, %s, %t : tensor<2x8x32xf32>, tensor<2x8x32xf32>, tensor<3x32xf32>, tensor<2x8x32xf32>
}

// -----

// Sequence parallelism's all-gather before two column-parallel GEMMs: the
// gather in chunks along the batch, the second chunk's gather issued
// before the first chunk's GEMMs (it travels while they multiply), each
// GEMM's chunks joined.
// CHECK-LABEL: func.func @gather_then_gemms
// CHECK: %[[X0:.*]] = parax.slice %arg0 {dim = 0 : i64, start = 0 : i64} : (tensor<2x4x16xf32>) -> tensor<1x4x16xf32>
// CHECK: %[[G0:.*]] = parax.all_gather %[[X0]] over @g ["tp"] dim 1 : tensor<1x4x16xf32> -> tensor<1x8x16xf32>
// CHECK: %[[X1:.*]] = parax.slice %arg0 {dim = 0 : i64, start = 1 : i64}
// CHECK: %[[G1:.*]] = parax.all_gather %[[X1]]
// CHECK: %[[Q0:.*]] = parax.linear %[[G0]], %arg1
// CHECK: %[[K0:.*]] = parax.linear %[[G0]], %arg2
// CHECK: %[[Q1:.*]] = parax.linear %[[G1]], %arg1
// CHECK: %[[K1:.*]] = parax.linear %[[G1]], %arg2
// CHECK: %[[Q:.*]] = parax.concat %[[Q0]], %[[Q1]] {dim = 0 : i64} : (tensor<1x8x32xf32>, tensor<1x8x32xf32>) -> tensor<2x8x32xf32>
// CHECK: %[[K:.*]] = parax.concat %[[K0]], %[[K1]] {dim = 0 : i64}
// CHECK: parax.add %[[Q]], %[[K]]
// A gather something else reads too (a training step's weight gradient):
// the GEMM in chunks as above, the other reader given the gathered chunks
// joined.
// CHECK-LABEL: func.func @gather_read_by_more
// CHECK: %[[G0:.*]] = parax.all_gather {{.*}} : tensor<1x4x16xf32> -> tensor<1x8x16xf32>
// CHECK: %[[G1:.*]] = parax.all_gather
// CHECK: %[[Q:.*]] = parax.concat {{.*}} -> tensor<2x8x32xf32>
// CHECK: %[[G:.*]] = parax.concat %[[G0]], %[[G1]] {dim = 0 : i64} : (tensor<1x8x16xf32>, tensor<1x8x16xf32>) -> tensor<2x8x16xf32>
// CHECK: %[[H:.*]] = parax.add %[[G]], %[[G]]
// CHECK: return %[[Q]], %[[H]]
// A gather no GEMM reads stays whole.
// CHECK-LABEL: func.func @gather_read_by_no_gemm
// CHECK-NOT: parax.slice
// CHECK: return
parax.grid @g(tp = 2)
func.func @gather_then_gemms(%x: tensor<2x4x16xf32>, %wq: tensor<32x16xf32>, %wk: tensor<32x16xf32>) -> tensor<2x8x32xf32> {
  %g = parax.all_gather %x over @g ["tp"] dim 1 : tensor<2x4x16xf32> -> tensor<2x8x16xf32>
  %q = parax.linear %g, %wq {transpose_w} : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %k = parax.linear %g, %wk {transpose_w} : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %s = parax.add %q, %k : (tensor<2x8x32xf32>, tensor<2x8x32xf32>) -> tensor<2x8x32xf32>
  return %s : tensor<2x8x32xf32>
}
func.func @gather_read_by_more(%x: tensor<2x4x16xf32>, %wq: tensor<32x16xf32>) -> (tensor<2x8x32xf32>, tensor<2x8x16xf32>) {
  %g = parax.all_gather %x over @g ["tp"] dim 1 : tensor<2x4x16xf32> -> tensor<2x8x16xf32>
  %q = parax.linear %g, %wq {transpose_w} : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %h = parax.add %g, %g : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %q, %h : tensor<2x8x32xf32>, tensor<2x8x16xf32>
}
func.func @gather_read_by_no_gemm(%x: tensor<2x4x16xf32>) -> tensor<2x8x16xf32> {
  %g = parax.all_gather %x over @g ["tp"] dim 1 : tensor<2x4x16xf32> -> tensor<2x8x16xf32>
  %h = parax.add %g, %g : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %h : tensor<2x8x16xf32>
}

// -----

// A sequence-parallel microbatch of one sequence: only the sequence is left
// to cut, and it is the collectives' dimension. Gathered: each rank's piece
// viewed as [1, 4 rows], chunk i the rows i of every rank's piece, the
// GEMMs on [2 ranks, 2 rows], joined [2, 4] and seen as the 8 positions.
// Scattered likewise (the view's outer extent the 2 ranks).
// CHECK-LABEL: func.func @one_sequence
// CHECK: %[[V:.*]] = parax.reshape %arg0 : (tensor<1x4x16xf32>) -> tensor<1x1x4x16xf32>
// CHECK: %[[X0:.*]] = parax.slice %[[V]] {dim = 2 : i64, start = 0 : i64} : (tensor<1x1x4x16xf32>) -> tensor<1x1x2x16xf32>
// CHECK: %[[G0:.*]] = parax.all_gather %[[X0]] over @g ["tp"] dim 1 : tensor<1x1x2x16xf32> -> tensor<1x2x2x16xf32>
// CHECK: %[[X1:.*]] = parax.slice %[[V]] {dim = 2 : i64, start = 2 : i64}
// CHECK: %[[G1:.*]] = parax.all_gather %[[X1]]
// CHECK: %[[Q0:.*]] = parax.linear %[[G0]], %arg1 {transpose_w} : (tensor<1x2x2x16xf32>, tensor<32x16xf32>) -> tensor<1x2x2x32xf32>
// CHECK: %[[Q1:.*]] = parax.linear %[[G1]], %arg1
// CHECK: %[[J:.*]] = parax.concat %[[Q0]], %[[Q1]] {dim = 2 : i64} : (tensor<1x2x2x32xf32>, tensor<1x2x2x32xf32>) -> tensor<1x2x4x32xf32>
// CHECK: %[[Q:.*]] = parax.reshape %[[J]] : (tensor<1x2x4x32xf32>) -> tensor<1x8x32xf32>
// CHECK: %[[W:.*]] = parax.reshape %[[Q]] : (tensor<1x8x32xf32>) -> tensor<1x2x4x32xf32>
// CHECK: parax.reduce_scatter {{.*}} dim 1 : tensor<1x2x2x16xf32> -> tensor<1x1x2x16xf32>
// CHECK: parax.reduce_scatter {{.*}} dim 1 : tensor<1x2x2x16xf32> -> tensor<1x1x2x16xf32>
// CHECK: %[[S:.*]] = parax.concat {{.*}} {dim = 2 : i64} : (tensor<1x1x2x16xf32>, tensor<1x1x2x16xf32>) -> tensor<1x1x4x16xf32>
// CHECK: %[[Y:.*]] = parax.reshape %[[S]] : (tensor<1x1x4x16xf32>) -> tensor<1x4x16xf32>
// CHECK: return %[[Y]]
parax.grid @g(tp = 2)
func.func @one_sequence(%x: tensor<1x4x16xf32>, %wq: tensor<32x16xf32>, %wo: tensor<16x32xf32>) -> tensor<1x4x16xf32> {
  %g = parax.all_gather %x over @g ["tp"] dim 1 : tensor<1x4x16xf32> -> tensor<1x8x16xf32>
  %q = parax.linear %g, %wq {transpose_w} : (tensor<1x8x16xf32>, tensor<32x16xf32>) -> tensor<1x8x32xf32>
  %p = parax.linear %q, %wo {transpose_w} : (tensor<1x8x32xf32>, tensor<16x32xf32>) -> tensor<1x8x16xf32>
  %y = parax.reduce_scatter %p over @g ["tp"] dim 1 : tensor<1x8x16xf32> -> tensor<1x4x16xf32>
  return %y : tensor<1x4x16xf32>
}
