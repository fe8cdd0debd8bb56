// rms_norm's torch binding (torch.ops.opscope_cuda.rms_norm_forward / _backward): weight's shape is x's
// trailing dims, converted once to the accumulation type; dw through a chunked workspace.
#include "../csrc/cuda_binding.h"
#include "cuda_launchers.h"

namespace opscope::rms_norm_cuda {
namespace {

at::Tensor rms_norm_forward(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const char* op = "opscope::rms_norm";
  const int64_t n = check_norm(x, weight.sizes(), op);
  check_same_device(x, weight, op, "x", "weight");
  const c10::cuda::CUDAGuard guard(x.device());
  auto [xc, rows] = rows_view(x, n);
  const at::Tensor wc = param(weight, n, 1.0, x);
  at::Tensor y = at::empty_like(xc);
  if (rows) opscope_cuda::rms_norm_forward(xc.const_data_ptr(), wc.const_data_ptr(), y.mutable_data_ptr(), rows, n, eps,
                                           code(x), stream_of(x));
  return y;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
                                                     double eps) {
  const char* op = "opscope::rms_norm_backward";
  const int64_t n = check_norm(x, weight.sizes(), op);
  check_same_device(x, weight, op, "x", "weight");
  check_grad(grad, x, op, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  auto [xc, rows] = rows_view(x, n);
  const at::Tensor gc = grad.contiguous(), wc = param(weight, n, 1.0, x);
  at::Tensor dx = at::empty_like(xc), dw = at::zeros({n}, wc.options());
  at::Tensor work = at::empty({std::max<int64_t>(opscope_cuda::chunked_workspace(rows, n, 1), 1)}, wc.options());
  if (rows) opscope_cuda::rms_norm_backward(gc.const_data_ptr(), xc.const_data_ptr(), wc.const_data_ptr(),
                                            dx.mutable_data_ptr(), dw.mutable_data_ptr(), work.mutable_data_ptr(), rows,
                                            n, eps, code(x), stream_of(x));
  return {dx, dw.to(weight.scalar_type()).reshape(weight.sizes())};
}

}  // namespace
}  // namespace opscope::rms_norm_cuda

TORCH_LIBRARY_FRAGMENT(opscope_cuda, m) {
  m.def("rms_norm_forward(Tensor x, Tensor weight, float eps) -> Tensor", &opscope::rms_norm_cuda::rms_norm_forward);
  m.def("rms_norm_backward(Tensor grad, Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)",
        &opscope::rms_norm_cuda::rms_norm_backward);
}
