// mean over one dim on CUDA: the shared reduction kernels (../csrc/cuda_reduce.cuh, as sum) scale the sum
// by 1/R before the store.
#include "../csrc/cuda_reduce.cuh"
#include "cuda_launchers.h"

namespace opscope_cuda {

void mean_dim(const void* x, void* out, int64_t k1, int64_t r, int64_t k0, int dtype, cudaStream_t stream) {
  reduce_dim(x, out, k1, r, k0, 1.0 / static_cast<double>(r), dtype, stream);
}

}  // namespace opscope_cuda
