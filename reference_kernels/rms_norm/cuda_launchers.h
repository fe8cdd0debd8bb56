// Launchers of rms_norm's CUDA kernels (forward, and backward with its chunked dw).
// Defined in cuda.cu (pure CUDA), called by cuda_binding.cpp after it has checked the tensors; the
// conventions (dtype codes, accumulation-type parameters, workspaces) are in ../csrc/cuda_interface.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../csrc/cuda_interface.h"

namespace opscope_cuda {

void rms_norm_forward(const void* x, const void* w, void* y, int64_t rows, int64_t n, double eps, int dtype,
                      cudaStream_t stream);
// work: chunked_workspace(rows, n, 1) elements.
void rms_norm_backward(const void* g, const void* x, const void* w, void* dx, void* dw, void* work, int64_t rows,
                       int64_t n, double eps, int dtype, cudaStream_t stream);

}  // namespace opscope_cuda
