// RUN: parax-opt %s -split-input-file --parax-autodiff --parax-recompute=mode=full | FileCheck %s --check-prefix=FULL
// RUN: parax-opt %s -split-input-file --parax-autodiff --parax-recompute=mode=selective | FileCheck %s --check-prefix=SEL
// RUN: parax-opt %s -split-input-file --parax-autodiff --parax-recompute | FileCheck %s --check-prefix=PLAN
// RUN: parax-opt %s -split-input-file --parax-autodiff --parax-recompute=mode=none | FileCheck %s --check-prefix=NONE

// One transformer layer (layer 0) and a head (layer 1, holding the loss).
// Full recomputation runs layer 0's forward again in its backward pass,
// each copy just before its first reader (the layer's first gradient op,
// which reads only the incoming gradient, comes before them all: a
// pipeline stage receives its gradient before it recomputes); the clones
// nothing reads are dropped, and the gradient ops read the copies; the
// head is never recomputed (its backward comes first). Selective
// recomputation runs again only the norm and the activation (and views of
// them), reading the kept linears' results.

// FULL-LABEL: func.func @layer
// FULL: %[[N:.*]] = parax.rms_norm %[[X:.*]], %arg3
// FULL: %[[G:.*]] = parax.linear %[[N]], %arg4
// FULL: %[[U:.*]] = parax.linear %[[N]], %arg5
// FULL: %[[S:.*]] = parax.swiglu %[[G]], %[[U]]
// FULL: parax.cross_entropy_grad
// FULL: parax.linear_weight_grad %{{.*}}, %{{.*}} {parax.layer = 1 : i64, transpose_w}
// FULL-NEXT: parax.linear %{{.*}}, %arg6 {parax.layer = 0 : i64}
// FULL-NEXT: %[[N2:.*]] = parax.rms_norm %[[X]], %arg3 {eps = 1.000000e-05 : f64, parax.layer = 0 : i64}
// FULL-NEXT: %[[U2:.*]] = parax.linear %[[N2]], %arg5
// FULL-NEXT: %[[G2:.*]] = parax.linear %[[N2]], %arg4
// FULL-NEXT: %[[S2:.*]] = parax.swiglu %[[G2]], %[[U2]]
// FULL-NEXT: parax.linear_weight_grad %[[S2]], %{{.*}} {parax.layer = 0 : i64, transpose_w}
// FULL: parax.swiglu_grad %[[G2]], %[[U2]]
// FULL: parax.linear_weight_grad %[[N2]]
// FULL: parax.rms_norm_grad %[[X]], %arg3
// FULL-COUNT-1: parax.rms_norm_weight_grad %[[X]]
// FULL: return

// SEL-LABEL: func.func @layer
// SEL: %[[N:.*]] = parax.rms_norm %[[X:.*]], %arg3
// SEL: %[[G:.*]] = parax.linear %[[N]], %arg4
// SEL: %[[U:.*]] = parax.linear %[[N]], %arg5
// SEL: parax.cross_entropy_grad
// SEL: parax.linear %{{.*}}, %arg6 {parax.layer = 0 : i64}
// SEL-NEXT: %[[S2:.*]] = parax.swiglu %[[G]], %[[U]] {parax.layer = 0 : i64}
// SEL-NEXT: parax.linear_weight_grad %[[S2]]
// SEL: parax.swiglu_grad %[[G]], %[[U]]
// SEL: %[[N2:.*]] = parax.rms_norm %[[X]], %arg3 {eps = 1.000000e-05 : f64, parax.layer = 0 : i64}
// SEL-NEXT: parax.linear_weight_grad %[[N2]]

// Without a plan (mode=plan) or with mode=none: nothing recomputed.
// PLAN-COUNT-1: parax.swiglu %
// PLAN-NOT: parax.swiglu %
// NONE-COUNT-1: parax.rms_norm %
// NONE-NOT: parax.rms_norm %
func.func @layer(%ids: tensor<2x4xi32>, %labels: tensor<2x4xi32>,
                 %embed: tensor<32x16xf32> {parax.param = "embed"},
                 %norm: tensor<16xf32> {parax.param = "norm"},
                 %gate: tensor<24x16xf32> {parax.param = "gate"},
                 %up: tensor<24x16xf32> {parax.param = "up"},
                 %down: tensor<16x24xf32> {parax.param = "down"},
                 %head: tensor<32x16xf32> {parax.param = "head"}) -> tensor<f32> {
  %h = parax.embedding %ids, %embed {parax.layer = -1 : i64} : (tensor<2x4xi32>, tensor<32x16xf32>) -> tensor<2x4x16xf32>
  %n = parax.rms_norm %h, %norm {eps = 1.0e-5 : f64, parax.layer = 0 : i64} : (tensor<2x4x16xf32>, tensor<16xf32>) -> tensor<2x4x16xf32>
  %g = parax.linear %n, %gate {transpose_w, parax.layer = 0 : i64} : (tensor<2x4x16xf32>, tensor<24x16xf32>) -> tensor<2x4x24xf32>
  %u = parax.linear %n, %up {transpose_w, parax.layer = 0 : i64} : (tensor<2x4x16xf32>, tensor<24x16xf32>) -> tensor<2x4x24xf32>
  %s = parax.swiglu %g, %u {parax.layer = 0 : i64} : (tensor<2x4x24xf32>, tensor<2x4x24xf32>) -> tensor<2x4x24xf32>
  %d = parax.linear %s, %down {transpose_w, parax.layer = 0 : i64} : (tensor<2x4x24xf32>, tensor<16x24xf32>) -> tensor<2x4x16xf32>
  %r = parax.add %h, %d {parax.layer = 0 : i64} : (tensor<2x4x16xf32>, tensor<2x4x16xf32>) -> tensor<2x4x16xf32>
  %logits = parax.linear %r, %head {transpose_w, parax.layer = 1 : i64} : (tensor<2x4x16xf32>, tensor<32x16xf32>) -> tensor<2x4x32xf32>
  %loss = parax.cross_entropy %logits, %labels {parax.layer = 1 : i64} : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// A plan's choice (mode=plan, the default) is followed.
// PLAN-LABEL: func.func @planned
// PLAN-COUNT-2: parax.swiglu %
func.func @planned(%x: tensor<2x4x16xf32>, %labels: tensor<2x4xi32>,
                   %gate: tensor<24x16xf32> {parax.param = "gate"},
                   %up: tensor<24x16xf32> {parax.param = "up"},
                   %down: tensor<32x24xf32> {parax.param = "down"}) -> tensor<f32>
    attributes {parax.plan = #parax.plan<recompute = "selective">} {
  %g = parax.linear %x, %gate {transpose_w, parax.layer = 0 : i64} : (tensor<2x4x16xf32>, tensor<24x16xf32>) -> tensor<2x4x24xf32>
  %u = parax.linear %x, %up {transpose_w, parax.layer = 0 : i64} : (tensor<2x4x16xf32>, tensor<24x16xf32>) -> tensor<2x4x24xf32>
  %s = parax.swiglu %g, %u {parax.layer = 0 : i64} : (tensor<2x4x24xf32>, tensor<2x4x24xf32>) -> tensor<2x4x24xf32>
  %logits = parax.linear %s, %down {transpose_w, parax.layer = 0 : i64} : (tensor<2x4x24xf32>, tensor<32x24xf32>) -> tensor<2x4x32xf32>
  %loss = parax.cross_entropy %logits, %labels {parax.layer = 1 : i64} : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// A low-rank latent's up-projection, more than 4x as wide as its input
// (DeepSeek-V3's MLA: q_b_proj 16x, kv_b_proj 64x), is made again under
// selective recomputation from the norm of the kept latent, made again
// too; the down-projection to the latent is kept, not made again.
// SEL-LABEL: func.func @latent
// SEL: %[[C:.*]] = parax.linear %arg0, %arg2 {parax.layer = 0 : i64, transpose_w}
// SEL: %[[N:.*]] = parax.rms_norm %[[C]], %arg3
// SEL: %[[U:.*]] = parax.linear %[[N]], %arg4 {parax.layer = 0 : i64, transpose_w}
// SEL: parax.cross_entropy_grad
// SEL-NOT: parax.linear %{{.*}}, %arg2
// SEL: %[[N2:.*]] = parax.rms_norm %[[C]], %arg3
// SEL-NEXT: %[[U2:.*]] = parax.linear %[[N2]], %arg4 {parax.layer = 0 : i64, transpose_w}
// SEL-NEXT: parax.mul %{{.*}}, %[[U2]]
// SEL-NOT: parax.linear %{{.*}}, %arg2
// SEL: parax.linear_weight_grad %[[N2]]
// SEL-NOT: parax.linear %{{.*}}, %arg2
// SEL: return
// NONE-LABEL: func.func @latent
// NONE-COUNT-1: parax.rms_norm %
// NONE-NOT: parax.rms_norm %
func.func @latent(%x: tensor<2x4x16xf32>, %labels: tensor<2x4xi32>,
                  %down: tensor<4x16xf32> {parax.param = "down"},
                  %norm: tensor<4xf32> {parax.param = "norm"},
                  %up: tensor<40x4xf32> {parax.param = "up"},
                  %head: tensor<32x40xf32> {parax.param = "head"}) -> tensor<f32> {
  %c = parax.linear %x, %down {transpose_w, parax.layer = 0 : i64} : (tensor<2x4x16xf32>, tensor<4x16xf32>) -> tensor<2x4x4xf32>
  %n = parax.rms_norm %c, %norm {eps = 1.0e-5 : f64, parax.layer = 0 : i64} : (tensor<2x4x4xf32>, tensor<4xf32>) -> tensor<2x4x4xf32>
  %u = parax.linear %n, %up {transpose_w, parax.layer = 0 : i64} : (tensor<2x4x4xf32>, tensor<40x4xf32>) -> tensor<2x4x40xf32>
  %a = parax.mul %u, %u {parax.layer = 0 : i64} : (tensor<2x4x40xf32>, tensor<2x4x40xf32>) -> tensor<2x4x40xf32>
  %logits = parax.linear %a, %head {transpose_w, parax.layer = 1 : i64} : (tensor<2x4x40xf32>, tensor<32x40xf32>) -> tensor<2x4x32xf32>
  %loss = parax.cross_entropy %logits, %labels {parax.layer = 1 : i64} : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
