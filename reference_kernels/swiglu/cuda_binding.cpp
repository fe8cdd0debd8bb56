// swiglu's torch binding (torch.ops.opscope_cuda.swiglu_forward / _backward): a and b of one device,
// dtype and shape, made contiguous for the elementwise launchers.
#include "../csrc/cuda_binding.h"
#include "cuda_launchers.h"

namespace opscope::swiglu_cuda {
namespace {

at::Tensor swiglu_forward(const at::Tensor& a, const at::Tensor& b) {
  const char* op = "opscope::swiglu";
  check_cuda(a, op, "a");
  check_same_device(a, b, op, "a", "b");
  check_floating(a, op, "a");
  check_same_dtype(a, b, op, "a", "b");
  check_same_shape(a, b, op, "a", "b");
  const c10::cuda::CUDAGuard guard(a.device());
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  at::Tensor y = at::empty_like(ac);
  if (y.numel()) opscope_cuda::swiglu_forward(ac.const_data_ptr(), bc.const_data_ptr(), y.mutable_data_ptr(), y.numel(),
                                              code(a), stream_of(a));
  return y;
}

std::tuple<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad, const at::Tensor& a, const at::Tensor& b) {
  const char* op = "opscope::swiglu_backward";
  check_cuda(a, op, "a");
  check_same_device(a, b, op, "a", "b");
  check_same_device(a, grad, op, "a", "grad");
  check_same_dtype(a, b, op, "a", "b");
  check_same_dtype(a, grad, op, "a", "grad");
  check_same_shape(a, b, op, "a", "b");
  check_same_shape(a, grad, op, "a", "grad");
  const c10::cuda::CUDAGuard guard(a.device());
  const at::Tensor ac = a.contiguous(), bc = b.contiguous(), gc = grad.contiguous();
  at::Tensor da = at::empty_like(ac), db = at::empty_like(ac);
  if (da.numel()) opscope_cuda::swiglu_backward(gc.const_data_ptr(), ac.const_data_ptr(), bc.const_data_ptr(),
                                                da.mutable_data_ptr(), db.mutable_data_ptr(), da.numel(), code(a),
                                                stream_of(a));
  return {da, db};
}

}  // namespace
}  // namespace opscope::swiglu_cuda

TORCH_LIBRARY_FRAGMENT(opscope_cuda, m) {
  m.def("swiglu_forward(Tensor a, Tensor b) -> Tensor", &opscope::swiglu_cuda::swiglu_forward);
  m.def("swiglu_backward(Tensor grad, Tensor a, Tensor b) -> (Tensor, Tensor)", &opscope::swiglu_cuda::swiglu_backward);
}
