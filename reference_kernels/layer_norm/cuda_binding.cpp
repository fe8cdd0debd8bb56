// layer_norm's torch binding (torch.ops.opscope_cuda.layer_norm_forward / _backward): normalized_shape is
// x's trailing dims; an absent weight is 1 and an absent bias 0 (converted once to the accumulation
// type); dw and db through one [2, n] buffer and a chunked workspace.
#include "../csrc/cuda_binding.h"
#include "cuda_launchers.h"

namespace opscope::layer_norm_cuda {
namespace {

at::Tensor layer_norm_forward(const at::Tensor& x, at::IntArrayRef shape, const std::optional<at::Tensor>& weight,
                              const std::optional<at::Tensor>& bias, double eps) {
  const char* op = "opscope::layer_norm";
  const int64_t n = check_norm(x, shape, op);
  const c10::cuda::CUDAGuard guard(x.device());
  auto [xc, rows] = rows_view(x, n);
  const at::Tensor wc = param(weight, n, 1.0, x), bc = param(bias, n, 0.0, x);
  at::Tensor y = at::empty_like(xc);
  if (rows) opscope_cuda::layer_norm_forward(xc.const_data_ptr(), wc.const_data_ptr(), bc.const_data_ptr(),
                                             y.mutable_data_ptr(), rows, n, eps, code(x), stream_of(x));
  return y;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(const at::Tensor& grad, const at::Tensor& x,
                                                                   at::IntArrayRef shape,
                                                                   const std::optional<at::Tensor>& weight,
                                                                   const std::optional<at::Tensor>& bias, double eps) {
  const char* op = "opscope::layer_norm_backward";
  const int64_t n = check_norm(x, shape, op);
  check_grad(grad, x, op, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  auto [xc, rows] = rows_view(x, n);
  const at::Tensor gc = grad.contiguous(), wc = param(weight, n, 1.0, x);
  at::Tensor dx = at::empty_like(xc), dwb = at::zeros({2, n}, wc.options());
  at::Tensor work = at::empty({std::max<int64_t>(opscope_cuda::chunked_workspace(rows, n, 2), 1)}, wc.options());
  if (rows) opscope_cuda::layer_norm_backward(gc.const_data_ptr(), xc.const_data_ptr(), wc.const_data_ptr(),
                                              dx.mutable_data_ptr(), dwb.mutable_data_ptr(), nullptr,
                                              work.mutable_data_ptr(), rows, n, eps, code(x), stream_of(x));
  return {dx, weight.has_value() ? dwb[0].to(weight->scalar_type()).reshape(shape).clone() : at::empty({0}, x.options()),
          bias.has_value() ? dwb[1].to(bias->scalar_type()).reshape(shape).clone() : at::empty({0}, x.options())};
}

}  // namespace
}  // namespace opscope::layer_norm_cuda

TORCH_LIBRARY_FRAGMENT(opscope_cuda, m) {
  m.def("layer_norm_forward(Tensor x, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> Tensor",
        &opscope::layer_norm_cuda::layer_norm_forward);
  m.def("layer_norm_backward(Tensor grad, Tensor x, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps) "
        "-> (Tensor, Tensor, Tensor)", &opscope::layer_norm_cuda::layer_norm_backward);
}
