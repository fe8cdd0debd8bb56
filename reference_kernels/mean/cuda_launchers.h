// Launcher of mean's CUDA kernels: x (contiguous) viewed as [K1, R, K0] averaged over R into K1 * K0 outputs.
// Defined in cuda.cu (pure CUDA), called by cuda_binding.cpp after it has checked the tensors; the
// conventions (dtype codes, accumulation-type parameters, workspaces) are in ../csrc/cuda_interface.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../csrc/cuda_interface.h"

namespace opscope_cuda {

void mean_dim(const void* x, void* out, int64_t k1, int64_t r, int64_t k0, int dtype, cudaStream_t stream);

}  // namespace opscope_cuda
