// swiglu on CUDA: elementwise silu(a) * b and its gradients, grid-stride loops with 16-byte vector
// loads when the pointers are aligned (scalar tail).
#include "../csrc/cuda_common.cuh"
#include "cuda_launchers.h"

namespace opscope_cuda {

template <typename A> __device__ __forceinline__ A sigm(A v) { return A(1) / (A(1) + exp(-v)); }

template <typename T, int V>
__global__ void swiglu_fwd(const T* a, const T* b, T* y, int64_t n) {
  using VT = Vec<T, V>;
  const int64_t nv = n / V, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nv; i += stride) {
    VT va = reinterpret_cast<const VT*>(a)[i], vb = reinterpret_cast<const VT*>(b)[i], vo;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const auto x = to_acc(va.v[k]);
      vo.v[k] = from_acc<T>(x * sigm(x) * to_acc(vb.v[k]));
    }
    reinterpret_cast<VT*>(y)[i] = vo;
  }
  for (int64_t i = nv * V + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) {
    const auto x = to_acc(a[i]);
    y[i] = from_acc<T>(x * sigm(x) * to_acc(b[i]));
  }
}

template <typename T>
__global__ void swiglu_bwd(const T* g, const T* a, const T* b, T* da, T* db, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const auto x = to_acc(a[i]), gv = to_acc(g[i]);
    const auto s = sigm(x);
    da[i] = from_acc<T>(gv * to_acc(b[i]) * s * (decltype(x)(1) + x * (decltype(x)(1) - s)));
    db[i] = from_acc<T>(gv * x * s);
  }
}

void swiglu_forward(const void* a, const void* b, void* y, int64_t n, int dtype, cudaStream_t stream) {
  const bool vec = aligned16(a) && aligned16(b) && aligned16(y);
  OPSCOPE_CUDA_DISPATCH(dtype, {
    constexpr int V = 16 / sizeof(T);
    if (vec) swiglu_fwd<T, V><<<blocks_for(n / V + 1), kThreads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), n);
    else swiglu_fwd<T, 1><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                                   static_cast<T*>(y), n);
  });
}

void swiglu_backward(const void* g, const void* a, const void* b, void* da, void* db, int64_t n, int dtype,
                     cudaStream_t stream) {
  OPSCOPE_CUDA_DISPATCH(dtype, {
    swiglu_bwd<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(g), static_cast<const T*>(a),
                                                           static_cast<const T*>(b), static_cast<T*>(da),
                                                           static_cast<T*>(db), n);
  });
}

}  // namespace opscope_cuda
