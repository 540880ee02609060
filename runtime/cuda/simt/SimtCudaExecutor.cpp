// SimtCudaExecutor.cpp - the CUDA backend compiled as plain C++ against the
// SIMT emulator (Simt.h), so its kernels, cuBLAS and NCCL calls run on any
// machine: parax-run-simt --device cuda.
#include "../CudaExecutor.cu"
