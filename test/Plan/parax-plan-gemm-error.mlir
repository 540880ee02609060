// RUN: parax-opt %s -verify-diagnostics --parax-plan="cluster=dgx-a100-80gb workload=train:batch=8,seq=16,gemm=fp8"
// RUN: not parax-opt %s --parax-plan="cluster=dgx-h100 workload=train:batch=8,seq=16,gemm=int4" 2>&1 | FileCheck %s --check-prefix=DTYPE

// DTYPE: workload 'train:batch=8,seq=16,gemm=int4': gemm (the GEMMs' dtype) must be fp8, bf16, f16 or f32, got 'int4'

// FP8 GEMMs on a device without an FP8 figure (the A100): refused, naming
// the dtype and the device.
// expected-error @+1 {{parax-plan: gemm=fp8: the cluster's device (A100 SXM4 80GB) has no fp8 figure in its peak_tflops}}
func.func @fp8_on_an_a100(%tok: tensor<1x16xi32>,
    %emb: tensor<64x32xbf16> {parax.param = "emb"},
    %w: tensor<32x32xbf16> {parax.param = "w"}) -> tensor<1x16x32xbf16> {
  %h = parax.embedding %tok, %emb {parax.layer = -1 : i64} : (tensor<1x16xi32>, tensor<64x32xbf16>) -> tensor<1x16x32xbf16>
  %y = parax.linear %h, %w {parax.layer = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x32xbf16>) -> tensor<1x16x32xbf16>
  return %y : tensor<1x16x32xbf16>
}
