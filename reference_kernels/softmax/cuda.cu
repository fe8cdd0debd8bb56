// softmax on CUDA: one block per row, online: each thread keeps a running max and a running sum of
// exp(z - max) over its strided elements (rescaling the sum when its max grows), the block merges the
// (max, sum) pairs, then a second pass writes exp(z - max) / sum. The mask is read through broadcast
// strides over up to 3 leading dims (the binding coalesces them), never materialized.
#include "../csrc/cuda_common.cuh"
#include "cuda_launchers.h"

namespace opscope_cuda {

struct Lead3 { int64_t size[3], stride[3]; };

template <typename A>
__device__ __forceinline__ void online_merge(A& m, A& s, A m2, A s2) {
  const A nm = max(m, m2);
  if (nm == -INFINITY) return;
  s = s * exp(m - nm) + s2 * exp(m2 - nm);
  m = nm;
}

template <typename T>
__global__ void softmax_fwd(const T* x, const typename Acc<T>::type* mask, T* y, int64_t rows, int64_t n, double scale,
                            Lead3 lead, int64_t ms) {
  using A = typename Acc<T>::type;
  __shared__ A sm[32], ss[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * n;
    const A* mr = nullptr;
    if (mask) {
      const int64_t i2 = r % lead.size[2], i1 = (r / lead.size[2]) % lead.size[1], i0 = r / (lead.size[2] * lead.size[1]);
      mr = mask + i0 * lead.stride[0] + i1 * lead.stride[1] + i2 * lead.stride[2];
    }
    auto z = [&](int64_t j) { return to_acc(xr[j]) * A(scale) + (mr ? mr[j * ms] : A(0)); };
    A m = -INFINITY, s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) online_merge(m, s, z(j), A(1));
    for (int o = 16; o > 0; o >>= 1)
      online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();
    if (threadIdx.x == 0) {
      A tm = -INFINITY, ts = 0;
      for (int k = 0; k < (int)(blockDim.x >> 5); ++k) online_merge(tm, ts, sm[k], ss[k]);
      sm[0] = tm;
      ss[0] = ts;
    }
    __syncthreads();
    const A mx = sm[0], inv = A(1) / ss[0];
    __syncthreads();
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) y[r * n + j] = from_acc<T>(exp(z(j) - mx) * inv);
  }
}

template <typename T>
__global__ void softmax_bwd(const T* g, const T* y, T* dx, int64_t rows, int64_t n, double scale) {
  using A = typename Acc<T>::type;
  __shared__ A shared[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    A dot = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dot += to_acc(g[r * n + j]) * to_acc(y[r * n + j]);
    dot = block_sum(dot, shared);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      dx[r * n + j] = from_acc<T>(A(scale) * to_acc(y[r * n + j]) * (to_acc(g[r * n + j]) - dot));
  }
}

void softmax_forward(const void* x, const void* mask, void* y, int64_t rows, int64_t n, double scale,
                     const int64_t* lead_sizes3, const int64_t* lead_strides3, int64_t mask_last_stride, int dtype,
                     cudaStream_t stream) {
  Lead3 lead;
  for (int d = 0; d < 3; ++d) { lead.size[d] = lead_sizes3[d]; lead.stride[d] = lead_strides3[d]; }
  OPSCOPE_CUDA_DISPATCH(dtype, {
    using A = typename Acc<T>::type;
    softmax_fwd<T><<<blocks_for(rows, 1), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const A*>(mask), static_cast<T*>(y), rows, n, scale, lead,
        mask_last_stride);
  });
}

void softmax_backward(const void* g, const void* y, void* dx, int64_t rows, int64_t n, double scale, int dtype,
                      cudaStream_t stream) {
  OPSCOPE_CUDA_DISPATCH(dtype, {
    softmax_bwd<T><<<blocks_for(rows, 1), kThreads, 0, stream>>>(static_cast<const T*>(g), static_cast<const T*>(y),
                                                                  static_cast<T*>(dx), rows, n, scale);
  });
}

}  // namespace opscope_cuda
