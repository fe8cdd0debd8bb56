// Launchers of softmax's CUDA kernels. The mask (may be null) is read through the strides of up to 3
// leading dims and its last-dim stride, never materialized.
// Defined in cuda.cu (pure CUDA), called by cuda_binding.cpp after it has checked the tensors; the
// conventions (dtype codes, accumulation-type parameters, workspaces) are in ../csrc/cuda_interface.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../csrc/cuda_interface.h"

namespace opscope_cuda {

void softmax_forward(const void* x, const void* mask, void* y, int64_t rows, int64_t n, double scale,
                     const int64_t* lead_sizes3, const int64_t* lead_strides3, int64_t mask_last_stride, int dtype,
                     cudaStream_t stream);
void softmax_backward(const void* g, const void* y, void* dx, int64_t rows, int64_t n, double scale, int dtype,
                      cudaStream_t stream);

}  // namespace opscope_cuda
