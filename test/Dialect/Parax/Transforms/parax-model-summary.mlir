// RUN: parax-opt %s --parax-model-summary -o /dev/null | FileCheck %s
// RUN: parax-opt %s --parax-model-summary="output=%t.txt" | FileCheck %s --check-prefix=IR
// RUN: FileCheck %s < %t.txt
// RUN: not parax-opt %s --parax-model-summary="output=/nonexistent/dir/x.txt" 2>&1 | FileCheck %s --check-prefix=BADPATH

// A one-layer model small enough to count by hand:
//   embedding [16, 8] (bf16), one layer = rms_norm + linear [8 -> 32] +
//   silu + linear [32 -> 8] + residual add, epilogue rms_norm + lm head
//   [8 -> 16]. Tokens: 2 x 3 = 6.
//
// Parameters: 16*8 + 8 + 32*8 + 8*32 + 8 + 16*8 = 784 elements, 1568 bytes.
// FLOPs: embedding 0; rms_norm 4*48 = 192; up 2*6*8*32 = 3072; silu 4*192 =
//   768; down 2*6*32*8 = 3072; add 48; final rms_norm 192; head 2*6*8*16 =
//   1536. Total 8880, i.e. 1480 per token.

// CHECK-LABEL: model @forward
// CHECK-NEXT: decoder layers     1
// CHECK-NEXT: parameters         784 ({{.*}}) in 6 tensors
// CHECK-NEXT: parameter bytes    1568
// CHECK-NEXT: ops                8
// CHECK-NEXT: tokens per step    6
// CHECK-NEXT: forward FLOPs      8880
// CHECK-NEXT: FLOPs per token    1480
// Bytes read: embedding 24 + 96, rms_norm 96 + 16, up 96 + 512, silu 384,
// down 384 + 512, add 96 + 96, rms_norm 96 + 16, head 96 + 256.
// CHECK-NEXT: bytes read         2776
// CHECK-NEXT: bytes written      1440

// The IR itself is unchanged.
// IR: func.func @forward

// BADPATH: error: cannot open summary output

func.func @forward(%tokens: tensor<2x3xi32>,
    %emb: tensor<16x8xbf16> {parax.param = "model.embed_tokens.weight"},
    %n0: tensor<8xbf16> {parax.param = "model.layers.0.input_layernorm.weight"},
    %up: tensor<32x8xbf16> {parax.param = "model.layers.0.mlp.up_proj.weight"},
    %down: tensor<8x32xbf16> {parax.param = "model.layers.0.mlp.down_proj.weight"},
    %nf: tensor<8xbf16> {parax.param = "model.norm.weight"},
    %head: tensor<16x8xbf16> {parax.param = "lm_head.weight"}) -> tensor<2x3x16xbf16> {
  %h = parax.embedding %tokens, %emb {parax.layer = -1 : i64} : (tensor<2x3xi32>, tensor<16x8xbf16>) -> tensor<2x3x8xbf16>
  %x = parax.rms_norm %h, %n0 {eps = 1.0e-5 : f64, parax.layer = 0 : i64} : (tensor<2x3x8xbf16>, tensor<8xbf16>) -> tensor<2x3x8xbf16>
  %u = parax.linear %x, %up {transpose_w, parax.layer = 0 : i64} : (tensor<2x3x8xbf16>, tensor<32x8xbf16>) -> tensor<2x3x32xbf16>
  %a = parax.silu %u {parax.layer = 0 : i64} : (tensor<2x3x32xbf16>) -> tensor<2x3x32xbf16>
  %d = parax.linear %a, %down {transpose_w, parax.layer = 0 : i64} : (tensor<2x3x32xbf16>, tensor<8x32xbf16>) -> tensor<2x3x8xbf16>
  %r = parax.add %h, %d {parax.layer = 0 : i64} : (tensor<2x3x8xbf16>, tensor<2x3x8xbf16>) -> tensor<2x3x8xbf16>
  %f = parax.rms_norm %r, %nf {eps = 1.0e-5 : f64, parax.layer = 1 : i64} : (tensor<2x3x8xbf16>, tensor<8xbf16>) -> tensor<2x3x8xbf16>
  %l = parax.linear %f, %head {transpose_w, parax.layer = 1 : i64} : (tensor<2x3x8xbf16>, tensor<16x8xbf16>) -> tensor<2x3x16xbf16>
  return %l : tensor<2x3x16xbf16>
}
