// Launchers of broadcast_add's CUDA kernels: out = a + b over up to 4 coalesced dims, each operand
// read through its broadcast strides (0 along stretched dims).
// Defined in cuda.cu (pure CUDA), called by cuda_binding.cpp after it has checked the tensors; the
// conventions (dtype codes, accumulation-type parameters, workspaces) are in ../csrc/cuda_interface.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../csrc/cuda_interface.h"

namespace opscope_cuda {

void broadcast_add(const void* a, const void* b, void* out, int64_t n, const int64_t* sizes4, const int64_t* sa4,
                   const int64_t* sb4, int dtype, cudaStream_t stream);

}  // namespace opscope_cuda
