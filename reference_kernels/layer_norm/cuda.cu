// layer_norm on CUDA: one block per row. Statistics in one pass: each thread keeps a Welford
// (count, mean, M2) over its strided elements of the row (shifted by x[0]), then the block merges them
// with Chan's formula through warp shuffles; then the affine write. Backward: per row the statistics and
// the two means (of g*w and g*w*xhat), dx in the same block, dw/db from per-chunk partials.
#include "../csrc/cuda_common.cuh"
#include "cuda_launchers.h"

namespace opscope_cuda {

template <typename A>
__device__ __forceinline__ void chan_merge(A& n, A& mean, A& m2, A nb, A meanb, A m2b) {
  const A total = n + nb;
  if (total == A(0)) return;
  const A d = meanb - mean;
  mean += d * nb / total;
  m2 += m2b + d * d * n * nb / total;
  n = total;
}

// Row statistics: (shift, shifted mean, biased variance), the same in every thread of the block.
template <typename T, typename A>
__device__ void row_stats(const T* xr, int64_t len, A& shift, A& mean, A& var, A* shared) {
  shift = to_acc(xr[0]);
  A n = 0, mu = 0, m2 = 0;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    const A v = to_acc(xr[j]) - shift;
    n += 1;
    const A d = v - mu;
    mu += d / n;
    m2 += d * (v - mu);
  }
  for (int o = 16; o > 0; o >>= 1)
    chan_merge(n, mu, m2, __shfl_xor_sync(0xffffffffu, n, o), __shfl_xor_sync(0xffffffffu, mu, o),
               __shfl_xor_sync(0xffffffffu, m2, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) { shared[warp] = n; shared[32 + warp] = mu; shared[64 + warp] = m2; }
  __syncthreads();
  if (threadIdx.x == 0) {
    A tn = 0, tm = 0, t2 = 0;
    for (int k = 0; k < warps; ++k) chan_merge(tn, tm, t2, shared[k], shared[32 + k], shared[64 + k]);
    shared[0] = tm;
    shared[1] = t2 / A(len);
  }
  __syncthreads();
  mean = shared[0];
  var = shared[1];
  __syncthreads();
}

template <typename T>
__global__ void ln_fwd(const T* x, const typename Acc<T>::type* w, const typename Acc<T>::type* b, T* y, int64_t rows,
                       int64_t n, double eps) {
  using A = typename Acc<T>::type;
  __shared__ A shared[96];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * n;
    A shift, mean, var;
    row_stats<T, A>(xr, n, shift, mean, var, shared);
    const A rstd = A(1) / sqrt(var + A(eps));
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      y[r * n + j] = from_acc<T>(((to_acc(xr[j]) - shift) - mean) * rstd * w[j] + b[j]);
  }
}

template <typename T>
__global__ void ln_bwd(const T* g, const T* x, const typename Acc<T>::type* w, T* dx, typename Acc<T>::type* part,
                       int64_t rows, int64_t n, double eps) {
  using A = typename Acc<T>::type;
  __shared__ A shared[96];
  const int64_t chunk = blockIdx.x;
  A* pw = part + (2 * chunk) * n;
  A* pb = part + (2 * chunk + 1) * n;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) { pw[j] = 0; pb[j] = 0; }
  for (int64_t r = chunk * kRowChunk; r < rows && r < (chunk + 1) * kRowChunk; ++r) {
    const T* xr = x + r * n;
    const T* gr = g + r * n;
    A shift, mean, var;
    row_stats<T, A>(xr, n, shift, mean, var, shared);
    const A rstd = A(1) / sqrt(var + A(eps));
    A sq = 0, sqx = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const A q = to_acc(gr[j]) * w[j];
      sq += q;
      sqx += q * ((to_acc(xr[j]) - shift) - mean) * rstd;
    }
    const A mq = block_sum(sq, shared) / A(n), mqx = block_sum(sqx, shared) / A(n);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const A gv = to_acc(gr[j]), xhat = ((to_acc(xr[j]) - shift) - mean) * rstd;
      dx[r * n + j] = from_acc<T>(rstd * (gv * w[j] - mq - xhat * mqx));
      pw[j] += gv * xhat;
      pb[j] += gv;
    }
  }
}

void layer_norm_forward(const void* x, const void* w, const void* b, void* y, int64_t rows, int64_t n, double eps,
                        int dtype, cudaStream_t stream) {
  OPSCOPE_CUDA_DISPATCH(dtype, {
    using A = typename Acc<T>::type;
    ln_fwd<T><<<blocks_for(rows, 1), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<const A*>(w),
                                                             static_cast<const A*>(b), static_cast<T*>(y), rows, n, eps);
  });
}

void layer_norm_backward(const void* g, const void* x, const void* w, void* dx, void* dw, void* db, void* work,
                         int64_t rows, int64_t n, double eps, int dtype, cudaStream_t stream) {
  const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk;
  OPSCOPE_CUDA_DISPATCH(dtype, {
    using A = typename Acc<T>::type;
    ln_bwd<T><<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(
        static_cast<const T*>(g), static_cast<const T*>(x), static_cast<const A*>(w), static_cast<T*>(dx),
        static_cast<A*>(work), rows, n, eps);
    // partials are laid out [chunk][2][n]: combine dw from rows 0,2,4..., db from 1,3,5... via stride 2n
    column_combine<A, A><<<blocks_for(2 * n), kThreads, 0, stream>>>(static_cast<const A*>(work),
                                                                     static_cast<A*>(dw), chunks, 2 * n);
  });
  (void)db;  // dw points at a [2, n] buffer: its second row is db (see cuda_binding.cpp)
}

}  // namespace opscope_cuda
