// broadcast_add on CUDA: a grid-stride loop over the output; each operand read through its broadcast
// strides (0 along stretched dims) over up to 4 coalesced dims; when both operands are contiguous and
// the same shape as the output, 16-byte vector loads and stores.
#include "../csrc/cuda_common.cuh"
#include "cuda_launchers.h"

namespace opscope_cuda {

struct Strides4 { int64_t s[4], a[4], b[4]; };

template <typename T>
__global__ void add_strided(const T* a, const T* b, T* out, int64_t n, Strides4 st) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t rest = i, oa = 0, ob = 0;
    for (int d = 3; d >= 0; --d) {
      const int64_t idx = rest % st.s[d];
      rest /= st.s[d];
      oa += idx * st.a[d];
      ob += idx * st.b[d];
    }
    out[i] = from_acc<T>(to_acc(a[oa]) + to_acc(b[ob]));
  }
}

template <typename T>
__global__ void add_vectorized(const T* a, const T* b, T* out, int64_t n) {
  constexpr int V = 16 / sizeof(T);
  using VT = Vec<T, V>;
  const int64_t nv = n / V;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nv; i += stride) {
    VT va = reinterpret_cast<const VT*>(a)[i], vb = reinterpret_cast<const VT*>(b)[i], vo;
#pragma unroll
    for (int k = 0; k < V; ++k) vo.v[k] = from_acc<T>(to_acc(va.v[k]) + to_acc(vb.v[k]));
    reinterpret_cast<VT*>(out)[i] = vo;
  }
  for (int64_t i = nv * V + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = from_acc<T>(to_acc(a[i]) + to_acc(b[i]));
}

void broadcast_add(const void* a, const void* b, void* out, int64_t n, const int64_t* sizes4, const int64_t* sa4,
                   const int64_t* sb4, int dtype, cudaStream_t stream) {
  Strides4 st;
  bool dense = true;
  int64_t expect = 1;
  for (int d = 3; d >= 0; --d) {
    st.s[d] = sizes4[d];
    st.a[d] = sa4[d];
    st.b[d] = sb4[d];
    if (sizes4[d] > 1 && (sa4[d] != expect || sb4[d] != expect)) dense = false;
    expect *= sizes4[d];
  }
  const bool vec = dense && aligned16(a) && aligned16(b) && aligned16(out);
  OPSCOPE_CUDA_DISPATCH(dtype, {
    if (vec) add_vectorized<T><<<blocks_for(n / (16 / sizeof(T)) + 1), kThreads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n);
    else add_strided<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                                 static_cast<T*>(out), n, st);
  });
}

}  // namespace opscope_cuda
