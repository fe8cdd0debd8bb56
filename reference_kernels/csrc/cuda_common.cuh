// Shared device helpers for the CUDA kernels (pure CUDA C++: no torch headers, so every .cu compiles
// with nvcc alone; each kernel's cuda_binding.cpp checks the tensors and calls its launchers).
//
// Conventions: dtype codes DT_F32/DT_F64/DT_BF16/DT_F16; arithmetic in float (double for float64);
// elementwise kernels use grid-stride loops with 16-byte vector loads when every pointer is aligned;
// row kernels use one block per row (grid-stride over rows) and a warp-shuffle block reduction;
// cross-row sums (weight/bias gradients) go through fixed chunks of rows and a column-sum pass, so
// results do not depend on the launch configuration (no atomics).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_interface.h"

namespace opscope_cuda {

constexpr int kThreads = 256;
constexpr int kRowChunk = 32;

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_acc(float v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half(v); }
template <typename T> __device__ __forceinline__ T from_acc(double v) { return static_cast<T>(v); }

template <typename T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

inline int blocks_for(int64_t n, int per_block = kThreads) {
  int64_t b = (n + per_block - 1) / per_block;
  return static_cast<int>(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);
}

// Sum of `v` over the block; every thread gets the result. `shared` holds 32 values.
template <typename A>
__device__ __forceinline__ A block_sum(A v, A* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  A t = threadIdx.x < (blockDim.x >> 5) ? shared[threadIdx.x] : A(0);
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  if (threadIdx.x == 0) shared[0] = t;
  __syncthreads();
  return shared[0];
}

template <typename A>
__device__ __forceinline__ A block_max(A v, A* shared) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  A t = threadIdx.x < (blockDim.x >> 5) ? shared[threadIdx.x] : -INFINITY;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) t = max(t, __shfl_xor_sync(0xffffffffu, t, o));
  if (threadIdx.x == 0) shared[0] = t;
  __syncthreads();
  return shared[0];
}

// out[c] = sum over `chunks` rows of part[chunk][c] (in chunk order): the deterministic combine.
template <typename A, typename T>
__global__ void column_combine(const A* part, T* out, int64_t chunks, int64_t n) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < n; c += (int64_t)gridDim.x * blockDim.x) {
    A s = 0;
    for (int64_t k = 0; k < chunks; ++k) s += part[k * n + c];
    out[c] = from_acc<T>(s);
  }
}

#define OPSCOPE_CUDA_DISPATCH(dtype, ...)                 \
  switch (dtype) {                                         \
    case DT_F32: { using T = float; __VA_ARGS__; break; }  \
    case DT_F64: { using T = double; __VA_ARGS__; break; } \
    case DT_BF16: { using T = __nv_bfloat16; __VA_ARGS__; break; } \
    default: { using T = __half; __VA_ARGS__; break; }     \
  }

}  // namespace opscope_cuda
