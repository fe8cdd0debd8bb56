// rms_norm on CUDA: one block per row (grid-stride over rows): the block sums x^2 with a warp-shuffle
// reduction, then writes x * rstd * w. Backward: per row rstd and dot = sum(g w x) by block reductions,
// dx written in the same block; dw from per-chunk partials (rows of one chunk are handled by one block
// in order) combined in chunk order.
#include "../csrc/cuda_common.cuh"
#include "cuda_launchers.h"

namespace opscope_cuda {

template <typename T>
__global__ void rms_fwd(const T* x, const typename Acc<T>::type* w, T* y, int64_t rows, int64_t n, double eps) {
  using A = typename Acc<T>::type;
  __shared__ A shared[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * n;
    A ss = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) { const A v = to_acc(xr[j]); ss += v * v; }
    const A rstd = A(1) / sqrt(block_sum(ss, shared) / A(n) + A(eps));
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) y[r * n + j] = from_acc<T>(to_acc(xr[j]) * rstd * w[j]);
  }
}

// Block b handles the rows of chunk b (in order) and accumulates its partial dw in `part[b]`.
template <typename T>
__global__ void rms_bwd(const T* g, const T* x, const typename Acc<T>::type* w, T* dx, typename Acc<T>::type* part,
                        int64_t rows, int64_t n, double eps) {
  using A = typename Acc<T>::type;
  __shared__ A shared[32];
  const int64_t chunk = blockIdx.x;
  A* pw = part + chunk * n;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) pw[j] = 0;
  for (int64_t r = chunk * kRowChunk; r < rows && r < (chunk + 1) * kRowChunk; ++r) {
    const T* xr = x + r * n;
    const T* gr = g + r * n;
    A ss = 0, dot = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const A v = to_acc(xr[j]);
      ss += v * v;
      dot += to_acc(gr[j]) * w[j] * v;
    }
    const A rstd = A(1) / sqrt(block_sum(ss, shared) / A(n) + A(eps));
    const A c = rstd * rstd * rstd * block_sum(dot, shared) / A(n);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const A v = to_acc(xr[j]), gv = to_acc(gr[j]);
      dx[r * n + j] = from_acc<T>(rstd * gv * w[j] - v * c);
      pw[j] += gv * v * rstd;
    }
  }
}

void rms_norm_forward(const void* x, const void* w, void* y, int64_t rows, int64_t n, double eps, int dtype,
                      cudaStream_t stream) {
  OPSCOPE_CUDA_DISPATCH(dtype, {
    using A = typename Acc<T>::type;
    rms_fwd<T><<<blocks_for(rows, 1), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<const A*>(w),
                                                              static_cast<T*>(y), rows, n, eps);
  });
}

void rms_norm_backward(const void* g, const void* x, const void* w, void* dx, void* dw, void* work, int64_t rows,
                       int64_t n, double eps, int dtype, cudaStream_t stream) {
  const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk;
  OPSCOPE_CUDA_DISPATCH(dtype, {
    using A = typename Acc<T>::type;
    rms_bwd<T><<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(
        static_cast<const T*>(g), static_cast<const T*>(x), static_cast<const A*>(w), static_cast<T*>(dx),
        static_cast<A*>(work), rows, n, eps);
    column_combine<A, A><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const A*>(work), static_cast<A*>(dw),
                                                                 chunks, n);
  });
}

}  // namespace opscope_cuda
