// bias_gelu's torch binding (torch.ops.opscope_cuda.bias_gelu_forward / _backward): checks, x as rows
// of its last dim, the bias in the accumulation type, dbias through a chunked workspace.
#include "../csrc/cuda_binding.h"
#include "cuda_launchers.h"

namespace opscope::bias_gelu_cuda {
namespace {

at::Tensor bias_gelu_forward(const at::Tensor& x, const at::Tensor& bias, std::string approximate) {
  const char* op = "opscope::bias_gelu";
  check_cuda(x, op, "x");
  check_same_device(x, bias, op, "x", "bias");
  check_floating(x, op, "x");
  TORCH_CHECK_VALUE(approximate == "none" || approximate == "tanh", op, ": approximate must be 'none' or 'tanh'");
  TORCH_CHECK_VALUE(bias.dim() == 1 && x.dim() >= 1 && bias.size(0) == x.size(-1), op, ": bias must be 1-D with x's last dim");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t n = x.size(-1);
  auto [xc, rows] = rows_view(x, n);
  const at::Tensor bc = bias.to(acc_of(x)).contiguous();
  at::Tensor y = at::empty_like(xc);
  if (rows) opscope_cuda::bias_gelu_forward(xc.const_data_ptr(), bc.const_data_ptr(), y.mutable_data_ptr(), rows, n,
                                            approximate == "tanh", code(x), stream_of(x));
  return y;
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& bias,
                                                      std::string approximate) {
  const char* op = "opscope::bias_gelu_backward";
  check_grad(grad, x, op, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t n = x.size(-1);
  auto [xc, rows] = rows_view(x, n);
  const at::Tensor gc = grad.contiguous(), bc = bias.to(acc_of(x)).contiguous();
  at::Tensor dx = at::empty_like(xc), db = at::empty({n}, bc.options());
  at::Tensor work = at::empty({std::max<int64_t>(opscope_cuda::chunked_workspace(rows, n, 1), 1)}, bc.options());
  if (rows) opscope_cuda::bias_gelu_backward(gc.const_data_ptr(), xc.const_data_ptr(), bc.const_data_ptr(),
                                             dx.mutable_data_ptr(), db.mutable_data_ptr(), work.mutable_data_ptr(), rows,
                                             n, approximate == "tanh", code(x), stream_of(x));
  else db.zero_();
  return {dx, db.to(bias.scalar_type())};
}

}  // namespace
}  // namespace opscope::bias_gelu_cuda

TORCH_LIBRARY_FRAGMENT(opscope_cuda, m) {
  m.def("bias_gelu_forward(Tensor x, Tensor bias, str approximate) -> Tensor",
        &opscope::bias_gelu_cuda::bias_gelu_forward);
  m.def("bias_gelu_backward(Tensor grad, Tensor x, Tensor bias, str approximate) -> (Tensor, Tensor)",
        &opscope::bias_gelu_cuda::bias_gelu_backward);
}
