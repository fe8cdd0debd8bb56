// Launchers of bias_gelu's CUDA kernels (forward, and backward with its chunked dbias).
// Defined in cuda.cu (pure CUDA), called by cuda_binding.cpp after it has checked the tensors; the
// conventions (dtype codes, accumulation-type parameters, workspaces) are in ../csrc/cuda_interface.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../csrc/cuda_interface.h"

namespace opscope_cuda {

void bias_gelu_forward(const void* x, const void* bias, void* y, int64_t rows, int64_t n, bool tanh, int dtype,
                       cudaStream_t stream);
// work: chunked_workspace(rows, n, 1) elements.
void bias_gelu_backward(const void* g, const void* x, const void* bias, void* dx, void* dbias, void* work,
                        int64_t rows, int64_t n, bool tanh, int dtype, cudaStream_t stream);

}  // namespace opscope_cuda
