// sum / mean over one dim on CUDA (shared by sum/cuda.cu and mean/cuda.cu), the input contiguous and
// viewed as [K1, R, K0]. Strategy by shape:
// K0 == 1 ("rows"): one block per output, threads stride the contiguous row, a warp-shuffle block sum;
// otherwise ("columns"): one thread per output column (consecutive threads read consecutive addresses,
// so every row step is one coalesced load), adding the R rows in order. The sum is multiplied by
// `scale` (1 for sum, 1/R for mean) before the store.
#pragma once

#include "cuda_common.cuh"

namespace opscope_cuda {

template <typename T>
__global__ void reduce_rows(const T* x, T* out, int64_t k, int64_t r, double scale) {
  using A = typename Acc<T>::type;
  __shared__ A shared[32];
  for (int64_t row = blockIdx.x; row < k; row += gridDim.x) {
    A s = 0;
    for (int64_t j = threadIdx.x; j < r; j += blockDim.x) s += to_acc(x[row * r + j]);
    s = block_sum(s, shared);
    if (threadIdx.x == 0) out[row] = from_acc<T>(s * A(scale));
  }
}

template <typename T>
__global__ void reduce_columns(const T* x, T* out, int64_t k1, int64_t r, int64_t k0, double scale) {
  using A = typename Acc<T>::type;
  const int64_t total = k1 * k0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t a = i / k0, c = i % k0;
    const T* base = x + a * r * k0 + c;
    A s = 0;
    for (int64_t j = 0; j < r; ++j) s += to_acc(base[j * k0]);
    out[i] = from_acc<T>(s * A(scale));
  }
}

inline void reduce_dim(const void* x, void* out, int64_t k1, int64_t r, int64_t k0, double scale, int dtype,
                       cudaStream_t stream) {
  OPSCOPE_CUDA_DISPATCH(dtype, {
    if (k0 == 1)
      reduce_rows<T><<<blocks_for(k1, 1), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(out), k1,
                                                                  r, scale);
    else
      reduce_columns<T><<<blocks_for(k1 * k0), kThreads, 0, stream>>>(static_cast<const T*>(x),
                                                                       static_cast<T*>(out), k1, r, k0, scale);
  });
}

}  // namespace opscope_cuda
