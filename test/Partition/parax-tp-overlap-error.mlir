// RUN: parax-opt %s --parax-tp-overlap=chunks=1 -verify-diagnostics

// A GEMM split into one chunk is no split: the option is named.
// expected-error@below {{parax-tp-overlap: chunks must be at least 2 (got 1)}}
module {
  parax.grid @g(tp = 2)
}
