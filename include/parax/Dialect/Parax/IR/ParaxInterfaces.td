//===- ParaxInterfaces.td - parax op interfaces ------------*- tablegen -*-===//
//
// The cost interface: what the planner reads from every op of a model graph.
//
//===----------------------------------------------------------------------===//

#ifndef PARAX_DIALECT_PARAX_IR_PARAXINTERFACES_TD
#define PARAX_DIALECT_PARAX_IR_PARAXINTERFACES_TD

include "mlir/IR/OpBase.td"

def Parax_CostOpInterface : OpInterface<"CostOpInterface"> {
  let description = [{
    Forward-pass cost of one op for the shapes it has in the IR: floating
    point operations (a fused multiply-add counts as two), and the bytes it
    reads from and writes to device memory when it runs as one kernel
    (operands and results once each; no intermediate such as an attention
    score matrix is materialised). Counts follow `docs/cost-model.md`.
  }];
  let cppNamespace = "::parax";

  let methods = [
    InterfaceMethod<"Floating point operations of the forward pass.",
      "uint64_t", "getFlops">,
    InterfaceMethod<"Bytes read from device memory.",
      "uint64_t", "getBytesRead", (ins), [{}], [{
        return ::parax::detail::defaultBytesRead($_op);
      }]>,
    InterfaceMethod<"Bytes written to device memory.",
      "uint64_t", "getBytesWritten", (ins), [{}], [{
        return ::parax::detail::defaultBytesWritten($_op);
      }]>,
  ];
}

#endif // PARAX_DIALECT_PARAX_IR_PARAXINTERFACES_TD
