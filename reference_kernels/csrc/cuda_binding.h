// What the kernels' torch bindings (<kernel>/cuda_binding.cpp) share: device and gradient checks at the
// entry, the dtype code and stream a launcher takes, parameters converted once to the accumulation type,
// and the [K1, R, K0] view of a one-dim reduction (sum, mean). Each binding checks its tensors, makes
// them contiguous in named locals that outlive the launch, allocates outputs and workspaces with torch's
// caching allocator, launches on the current stream and registers its ops under torch.ops.opscope_cuda.
// Bindings are built only where torch has CUDA (reference_kernels/_build.py); the tests compile them
// everywhere against the CPU wheel's headers.
#pragma once

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include "common.h"
#include "cuda_interface.h"

namespace opscope {

inline void check_cuda(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.is_cuda(), op, ": ", name, " is on ", t.device(), "; this is the CUDA kernel");
}

inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* op, const char* na,
                              const char* nb) {
  TORCH_CHECK(a.device() == b.device(), op, ": ", na, " is on ", a.device(), " but ", nb, " is on ", b.device());
}

// The incoming gradient must match the tensor it is the gradient for (device, dtype, shape).
inline void check_grad(const at::Tensor& grad, const at::Tensor& t, const char* op, const char* name) {
  check_cuda(t, op, name);
  check_same_device(t, grad, op, name, "grad");
  check_same_dtype(grad, t, op, "grad", name);
  check_same_shape(grad, t, op, "grad", name);
}

inline int code(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return opscope_cuda::DT_F32;
    case at::kDouble: return opscope_cuda::DT_F64;
    case at::kBFloat16: return opscope_cuda::DT_BF16;
    default: return opscope_cuda::DT_F16;
  }
}

inline cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

inline at::ScalarType acc_of(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// A weight or bias in the accumulation type, flat; absent: `fill` (1 for a weight, 0 for a bias).
inline at::Tensor param(const std::optional<at::Tensor>& t, int64_t n, double fill, const at::Tensor& x) {
  if (t.has_value()) return t->to(acc_of(x)).contiguous().reshape({n});
  return at::full({n}, fill, x.options().dtype(acc_of(x)));
}

// x as contiguous rows of n elements, and how many rows.
inline std::pair<at::Tensor, int64_t> rows_view(const at::Tensor& x, int64_t n) {
  return {x.contiguous(), n ? x.numel() / n : 0};
}

// The norms: `shape` must be x's trailing dims; returns the elements per row.
inline int64_t check_norm(const at::Tensor& x, at::IntArrayRef shape, const char* op) {
  check_cuda(x, op, "x");
  check_floating(x, op, "x");
  const int64_t k = shape.size();
  TORCH_CHECK_VALUE(k >= 1 && x.dim() >= k && x.sizes().slice(x.dim() - k) == shape, op, ": shape ", shape,
                    " must equal the trailing dims of x's shape ", x.sizes());
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

// A one-dim reduction's launcher (x viewed as [K1, R, K0], contiguous; out holds K1 * K0 values).
using ReduceLauncher = void (*)(const void* x, void* out, int64_t k1, int64_t r, int64_t k0, int dtype,
                                cudaStream_t stream);

// sum / mean over `dim`: the checks, the output's shape and the [K1, R, K0] view; an empty reduced dim
// gives 0 (sum) or NaN (mean) as torch does, without a launch.
inline at::Tensor reduce_one_dim(const at::Tensor& x, int64_t dim, bool keepdim, bool mean, const char* op,
                                 ReduceLauncher launch) {
  check_cuda(x, op, "x");
  check_floating(x, op, "x");
  const int64_t nd = std::max<int64_t>(x.dim(), 1);
  TORCH_CHECK_INDEX(dim >= -nd && dim < nd, op, ": dim ", dim, " is out of range");
  if (dim < 0) dim += nd;
  const c10::cuda::CUDAGuard guard(x.device());
  std::vector<int64_t> shape;
  int64_t k1 = 1, k0 = 1, r = x.dim() ? x.size(dim) : 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < dim) k1 *= x.size(d);
    if (d > dim) k0 *= x.size(d);
    if (d != dim) shape.push_back(x.size(d));
    else if (keepdim) shape.push_back(1);
  }
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty(shape, x.options());
  if (out.numel() == 0) return out;
  if (r == 0) return out.fill_(mean ? std::numeric_limits<double>::quiet_NaN() : 0.0);
  launch(xc.const_data_ptr(), out.mutable_data_ptr(), k1, r, k0, code(x), stream_of(x));
  return out;
}

}  // namespace opscope
