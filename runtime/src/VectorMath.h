// VectorMath.h - exp-bound loops of the CPU executor, eight floats at a time
// through glibc's vector math library (libmvec: the AVX2 expf the compiler
// itself calls when it vectorises a loop of expf). Internal to the CPU
// executor; a CPU without AVX2/FMA takes the scalar loops.

#ifndef PARAX_RUNTIME_VECTORMATH_H
#define PARAX_RUNTIME_VECTORMATH_H

#include <cstdint>

namespace parax::runtime {

/// y[k] = silu(g[k]) · u[k] = g[k] / (1 + exp(-g[k])) · u[k] (SwiGLU); u
/// null: silu(g[k]) alone.
void siluTimes(const float *g, const float *u, float *y, int64_t n);

/// SwiGLU's backward over n elements, s = sigmoid(g[k]): the gate's
/// gradient d[k] = dy[k] · u[k] · (s + g[k] · s · (1 - s)) (operand 0), or
/// the up projection's d[k] = dy[k] · g[k] · s (operand 1).
void swigluGradient(const float *g, const float *u, const float *dy, int operand, float *d, int64_t n);

/// x[t] = exp(x[t] - shift) for t < n, and their sum (in double): a
/// softmax row's numerators, `shift` its largest score.
double expShifted(float *x, int64_t n, float shift);

/// The sum of exp(x[t] - shift) for t < n (in double), x left as it is.
double expSum(const float *x, int64_t n, float shift);

/// The largest of x[0 .. n) (-inf for none).
float largest(const float *x, int64_t n);

/// x[0 .. n) replaced by its softmax: exp(x - max) over their sum (in
/// double), each scaled by the sum's reciprocal (n > 0).
void softmax(float *x, int64_t n);

} // namespace parax::runtime

#endif // PARAX_RUNTIME_VECTORMATH_H
