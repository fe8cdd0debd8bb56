// Launchers of swiglu's CUDA kernels (elementwise forward and backward).
// Defined in cuda.cu (pure CUDA), called by cuda_binding.cpp after it has checked the tensors; the
// conventions (dtype codes, accumulation-type parameters, workspaces) are in ../csrc/cuda_interface.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../csrc/cuda_interface.h"

namespace opscope_cuda {

void swiglu_forward(const void* a, const void* b, void* y, int64_t n, int dtype, cudaStream_t stream);
void swiglu_backward(const void* g, const void* a, const void* b, void* da, void* db, int64_t n, int dtype,
                     cudaStream_t stream);

}  // namespace opscope_cuda
