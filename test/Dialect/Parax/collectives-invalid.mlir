// RUN: parax-opt %s -split-input-file -verify-diagnostics

// Communication ops check their grid, axes and shapes.

parax.grid @g(dp = 2, tp = 4)
func.func @negative_unknown_grid(%x: tensor<8xf32>) {
  // expected-error @+1 {{C1: unknown grid @h}}
  %0 = parax.all_reduce %x over @h ["tp"] : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
func.func @negative_unknown_axis(%x: tensor<8xf32>) {
  // expected-error @+1 {{C1: unknown grid axis 'ep' (grid @g has axes ["dp", "tp"])}}
  %0 = parax.all_reduce %x over @g ["ep"] : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
func.func @negative_axis_twice(%x: tensor<8xf32>) {
  // expected-error @+1 {{C1: grid axis 'tp' is named twice}}
  %0 = parax.all_reduce %x over @g ["tp", "tp"] : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
func.func @negative_axes_out_of_order(%x: tensor<8xf32>) {
  // expected-error @+1 {{C1: axes must follow the grid's order (grid @g has axes ["dp", "tp"])}}
  %0 = parax.all_reduce %x over @g ["tp", "dp"] : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
func.func @negative_no_axes(%x: tensor<8xf32>) {
  // expected-error @+1 {{C1: needs at least one grid axis}}
  %0 = parax.all_reduce %x over @g [] : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
func.func @negative_all_reduce_type(%x: tensor<8xf32>) {
  // expected-error @+1 {{C2: the result type must equal the operand type}}
  %0 = parax.all_reduce %x over @g ["tp"] : tensor<8xf32> -> tensor<2xf32>
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
func.func @negative_all_gather_shape(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{C2: expected result 'tensor<2x32xf32>'}}
  %0 = parax.all_gather %x over @g ["tp"] dim 1 : tensor<2x8xf32> -> tensor<2x16xf32>
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
func.func @negative_reduce_scatter_divisibility(%x: tensor<2x6xf32>) {
  // expected-error @+1 {{C2: dimension 1 of size 6 does not divide by 4}}
  %0 = parax.reduce_scatter %x over @g ["tp"] dim 1 : tensor<2x6xf32> -> tensor<2x1xf32>
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
func.func @negative_dim_range(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{C2: dim 2 is out of range}}
  %0 = parax.shard_slice %x over @g ["tp"] dim 2 : tensor<2x8xf32> -> tensor<2x2xf32>
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
func.func @negative_all_to_all_dims(%x: tensor<8x8xf32>) {
  // expected-error @+1 {{C2: split and concat must be distinct dimensions}}
  %0 = parax.all_to_all %x over @g ["tp"] split 1 concat 1 : tensor<8x8xf32> -> tensor<8x8xf32>
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
func.func @negative_all_to_all_shape(%x: tensor<8x8xf32>) {
  // expected-error @+1 {{C2: expected result 'tensor<32x2xf32>'}}
  %0 = parax.all_to_all %x over @g ["tp"] split 1 concat 0 : tensor<8x8xf32> -> tensor<8x8xf32>
  return
}

// -----

parax.grid @g(pp = 2, tp = 4)
func.func @negative_send_axes(%x: tensor<8xf32>) {
  // expected-error @+1 {{C1: point-to-point needs exactly one axis}}
  parax.send %x over @g ["pp", "tp"] to 1 : tensor<8xf32>
  return
}

// -----

parax.grid @g(pp = 2, tp = 4)
func.func @negative_recv_peer() {
  // expected-error @+1 {{C2: peer 2 is outside the axis (size 2)}}
  %0 = parax.recv over @g ["pp"] from 2 : tensor<8xf32>
  return
}

// -----

parax.grid @g(tp = 4)
func.func @negative_vocab_attrs(%ids: tensor<2xi32>, %t: tensor<8x4xf32>) {
  // expected-error @+1 {{C4: vocab_grid and vocab_axes come together}}
  %0 = parax.embedding %ids, %t {vocab_grid = @g} : (tensor<2xi32>, tensor<8x4xf32>) -> tensor<2x4xf32>
  return
}

// -----

parax.grid @g(ep = 3)
func.func @negative_dispatch_experts(%x: tensor<4x8xf32>, %w: tensor<4x2xf32>, %i: tensor<4x2xi32>) {
  // expected-error @+1 {{C2: 8 experts do not divide over 3 ranks}}
  %r, %rw, %re = parax.moe_dispatch %x, %w, %i over @g ["ep"] {num_experts = 8} : (tensor<4x8xf32>, tensor<4x2xf32>, tensor<4x2xi32>) -> (tensor<24x8xf32>, tensor<24x1xf32>, tensor<24x1xi32>)
  return
}

// -----

parax.grid @g(ep = 2)
func.func @negative_dispatch_rows(%x: tensor<4x8xf32>, %w: tensor<4x2xf32>, %i: tensor<4x2xi32>) {
  // expected-error @+1 {{C3: 6 rows: a rank holds from its 8 (token, choice) pairs to every rank's, 16}}
  %r, %rw, %re = parax.moe_dispatch %x, %w, %i over @g ["ep"] {num_experts = 8} : (tensor<4x8xf32>, tensor<4x2xf32>, tensor<4x2xi32>) -> (tensor<6x8xf32>, tensor<6x1xf32>, tensor<6x1xi32>)
  return
}

// -----

parax.grid @g(ep = 2)
func.func @negative_dispatch_too_many_rows(%x: tensor<4x8xf32>, %w: tensor<4x2xf32>, %i: tensor<4x2xi32>) {
  // expected-error @+1 {{C3: 17 rows: a rank holds from its 8 (token, choice) pairs to every rank's, 16}}
  %r, %rw, %re = parax.moe_dispatch %x, %w, %i over @g ["ep"] {num_experts = 8} : (tensor<4x8xf32>, tensor<4x2xf32>, tensor<4x2xi32>) -> (tensor<17x8xf32>, tensor<17x1xf32>, tensor<17x1xi32>)
  return
}

// -----

parax.grid @g(ep = 2)
func.func @negative_dispatch_shapes(%x: tensor<4x8xf32>, %w: tensor<4x2xf32>, %i: tensor<4x2xi32>) {
  // expected-error @+1 {{C3: expected results [R, 8], [R, 1], [R, 1] in x's element type (R rows, i32 experts)}}
  %r, %rw, %re = parax.moe_dispatch %x, %w, %i over @g ["ep"] {num_experts = 8} : (tensor<4x8xf32>, tensor<4x2xf32>, tensor<4x2xi32>) -> (tensor<12x8xf32>, tensor<10x1xf32>, tensor<12x1xi32>)
  return
}

// -----

parax.grid @g(ep = 2)
func.func @negative_combine_rows(%r: tensor<7x8xf32>, %i: tensor<4x2xi32>) {
  // expected-error @+1 {{C3: expected rows [R, H], R from 8 to 16 (as the dispatch's), and a result of indices' leading shape with H appended}}
  %y = parax.moe_combine %r, %i over @g ["ep"] {num_experts = 8} : (tensor<7x8xf32>, tensor<4x2xi32>) -> tensor<4x8xf32>
  return
}

// -----

parax.grid @g(ep = 2)
func.func @negative_combine_per_choice(%r: tensor<16x8xf32>, %i: tensor<4x2xi32>) {
  // expected-error @+1 {{C3: expected rows [R, H], R from 8 to 16 (as the dispatch's), and a result of indices' shape with H appended}}
  %y = parax.moe_combine %r, %i over @g ["ep"] {num_experts = 8, per_choice} : (tensor<16x8xf32>, tensor<4x2xi32>) -> tensor<4x8xf32>
  return
}
