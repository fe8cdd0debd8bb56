// Launchers of the CUDA kernels (defined in each kernel's cuda.cu), called by cuda_binding.cpp after
// it has checked the tensors. Pointers are device pointers to contiguous data unless strides are given;
// `dtype` is opscope_cuda::DType; parameter vectors (weight, bias, mask) are in the accumulation type
// (float, double for float64). Workspaces are allocated by the caller.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace opscope_cuda {

enum DType : int { DT_F32 = 0, DT_F64 = 1, DT_BF16 = 2, DT_F16 = 3 };

void broadcast_add(const void* a, const void* b, void* out, int64_t n, const int64_t* sizes4, const int64_t* sa4,
                   const int64_t* sb4, int dtype, cudaStream_t stream);
void bias_gelu_forward(const void* x, const void* bias, void* y, int64_t rows, int64_t n, bool tanh, int dtype,
                       cudaStream_t stream);
void bias_gelu_backward(const void* g, const void* x, const void* bias, void* dx, void* dbias, void* work,
                        int64_t rows, int64_t n, bool tanh, int dtype, cudaStream_t stream);
void swiglu_forward(const void* a, const void* b, void* y, int64_t n, int dtype, cudaStream_t stream);
void swiglu_backward(const void* g, const void* a, const void* b, void* da, void* db, int64_t n, int dtype,
                     cudaStream_t stream);
void rms_norm_forward(const void* x, const void* w, void* y, int64_t rows, int64_t n, double eps, int dtype,
                      cudaStream_t stream);
void rms_norm_backward(const void* g, const void* x, const void* w, void* dx, void* dw, void* work, int64_t rows,
                       int64_t n, double eps, int dtype, cudaStream_t stream);
void layer_norm_forward(const void* x, const void* w, const void* b, void* y, int64_t rows, int64_t n, double eps,
                        int dtype, cudaStream_t stream);
void layer_norm_backward(const void* g, const void* x, const void* w, void* dx, void* dw, void* db, void* work,
                         int64_t rows, int64_t n, double eps, int dtype, cudaStream_t stream);
void softmax_forward(const void* x, const void* mask, void* y, int64_t rows, int64_t n, double scale,
                     const int64_t* lead_sizes3, const int64_t* lead_strides3, int64_t mask_last_stride, int dtype,
                     cudaStream_t stream);
void softmax_backward(const void* g, const void* y, void* dx, int64_t rows, int64_t n, double scale, int dtype,
                      cudaStream_t stream);
void reduce_dim(const void* x, void* out, int64_t k1, int64_t r, int64_t k0, bool mean, int dtype,
                cudaStream_t stream);

// Workspace sizes (in elements of the accumulation type) the backward launchers need.
inline int64_t chunked_workspace(int64_t rows, int64_t n, int64_t sums) {
  return ((rows + 31) / 32) * n * sums;
}

}  // namespace opscope_cuda
