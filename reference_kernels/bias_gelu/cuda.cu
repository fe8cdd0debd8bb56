// bias_gelu on CUDA: grid-stride loop over x with the bias indexed by column (erf form via erff, tanh
// form as x * sigmoid(2u)). Backward: dx elementwise; dbias from per-chunk partial column sums
// (kRowChunk rows per chunk) combined in chunk order, no atomics.
#include "../csrc/cuda_common.cuh"
#include "cuda_launchers.h"

namespace opscope_cuda {

template <typename A>
__device__ __forceinline__ A gelu_val(A v, bool tanh_form) {
  if (tanh_form) {
    const A u = A(0.7978845608028654) * (v + A(0.044715) * v * v * v);
    return v / (A(1) + exp(A(-2) * u));
  }
  return A(0.5) * v * erfc(-v * A(0.7071067811865476));
}

template <typename A>
__device__ __forceinline__ A gelu_grad(A v, bool tanh_form) {
  if (tanh_form) {
    const A u = A(0.7978845608028654) * (v + A(0.044715) * v * v * v);
    const A s = A(1) / (A(1) + exp(A(-2) * u));
    return s + v * A(2) * s * (A(1) - s) * A(0.7978845608028654) * (A(1) + A(3 * 0.044715) * v * v);
  }
  return A(0.5) * erfc(-v * A(0.7071067811865476)) + v * A(0.3989422804014327) * exp(A(-0.5) * v * v);
}

template <typename T>
__global__ void bias_gelu_fwd(const T* x, const typename Acc<T>::type* bias, T* y, int64_t total, int64_t n,
                              bool tanh_form) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_acc<T>(gelu_val(to_acc(x[i]) + bias[i % n], tanh_form));
}

// One block per (row chunk, column tile): dx for those rows, and the chunk's partial dbias.
template <typename T>
__global__ void bias_gelu_bwd(const T* g, const T* x, const typename Acc<T>::type* bias, T* dx,
                              typename Acc<T>::type* part, int64_t rows, int64_t n, bool tanh_form) {
  using A = typename Acc<T>::type;
  const int64_t chunk = blockIdx.y;
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < n; c += (int64_t)gridDim.x * blockDim.x) {
    A acc = 0;
    for (int64_t r = chunk * kRowChunk; r < rows && r < (chunk + 1) * kRowChunk; ++r) {
      const int64_t i = r * n + c;
      const A d = to_acc(g[i]) * gelu_grad(to_acc(x[i]) + bias[c], tanh_form);
      dx[i] = from_acc<T>(d);
      acc += d;
    }
    part[chunk * n + c] = acc;
  }
}

void bias_gelu_forward(const void* x, const void* bias, void* y, int64_t rows, int64_t n, bool tanh_form, int dtype,
                       cudaStream_t stream) {
  OPSCOPE_CUDA_DISPATCH(dtype, {
    using A = typename Acc<T>::type;
    bias_gelu_fwd<T><<<blocks_for(rows * n), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const A*>(bias), static_cast<T*>(y), rows * n, n, tanh_form);
  });
}

void bias_gelu_backward(const void* g, const void* x, const void* bias, void* dx, void* dbias, void* work,
                        int64_t rows, int64_t n, bool tanh_form, int dtype, cudaStream_t stream) {
  const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk;
  OPSCOPE_CUDA_DISPATCH(dtype, {
    using A = typename Acc<T>::type;
    dim3 grid(static_cast<unsigned>((n + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
    bias_gelu_bwd<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(g), static_cast<const T*>(x),
                                                     static_cast<const A*>(bias), static_cast<T*>(dx),
                                                     static_cast<A*>(work), rows, n, tanh_form);
    column_combine<A, A><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const A*>(work), static_cast<A*>(dbias),
                                                                 chunks, n);
  });
}

}  // namespace opscope_cuda
