// softmax's torch binding (torch.ops.opscope_cuda.softmax_forward / _backward): the additive mask is
// converted once to the accumulation type and addressed through broadcast strides over up to 3 leading
// dims (coalesced here; expanded once when they do not fit), never materialized to x's shape otherwise.
#include "../csrc/cuda_binding.h"
#include "cuda_launchers.h"

namespace opscope::softmax_cuda {
namespace {

at::Tensor softmax_forward(const at::Tensor& x, double scale, const std::optional<at::Tensor>& mask) {
  const char* op = "opscope::softmax";
  check_cuda(x, op, "x");
  check_floating(x, op, "x");
  TORCH_CHECK_VALUE(x.dim() >= 1, op, ": x must have at least one dim");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t n = x.size(-1);
  auto [xc, rows] = rows_view(x, n);
  at::Tensor y = at::empty_like(xc);
  at::Tensor mc;
  std::vector<int64_t> ls{1, 1, 1}, lst{0, 0, 0};
  int64_t ms = 0;
  if (mask.has_value()) {
    check_same_device(x, *mask, op, "x", "mask");
    TORCH_CHECK(mask->is_floating_point(), op, ": mask must be an additive floating mask");
    TORCH_CHECK_VALUE(broadcast_shape(x.sizes(), mask->sizes(), op, "x", "mask") == x.sizes().vec(), op,
                      ": mask must broadcast to x's shape without growing it");
    mc = mask->to(acc_of(x)).contiguous();
    auto st = expanded_strides(mc, x.sizes());
    std::vector<int64_t> s, t;
    for (int64_t d = 0; d + 1 < x.dim(); ++d) {
      if (x.size(d) == 1) continue;
      if (!s.empty() && t.back() == st[d] * x.size(d)) { s.back() *= x.size(d); t.back() = st[d]; }
      else { s.push_back(x.size(d)); t.push_back(st[d]); }
    }
    if (s.size() > 3) {  // cannot be addressed through 3 leading dims: expand it once
      mc = mc.expand(x.sizes()).contiguous();
      s = {rows}; t = {n};
      st.back() = 1;
    }
    for (size_t i = 0; i < s.size(); ++i) { ls[3 - s.size() + i] = s[i]; lst[3 - s.size() + i] = t[i]; }
    ms = st.back();
  }
  if (rows) opscope_cuda::softmax_forward(xc.const_data_ptr(), mc.defined() ? mc.const_data_ptr() : nullptr,
                                          y.mutable_data_ptr(), rows, n, scale, ls.data(), lst.data(), ms, code(x),
                                          stream_of(x));
  return y;
}

at::Tensor softmax_backward(const at::Tensor& grad, const at::Tensor& y, double scale) {
  const char* op = "opscope::softmax_backward";
  check_grad(grad, y, op, "y");
  const c10::cuda::CUDAGuard guard(y.device());
  const int64_t n = y.size(-1);
  auto [yc, rows] = rows_view(y, n);
  const at::Tensor gc = grad.contiguous();
  at::Tensor dx = at::empty_like(yc);
  if (rows) opscope_cuda::softmax_backward(gc.const_data_ptr(), yc.const_data_ptr(), dx.mutable_data_ptr(), rows, n,
                                           scale, code(y), stream_of(y));
  return dx;
}

}  // namespace
}  // namespace opscope::softmax_cuda

TORCH_LIBRARY_FRAGMENT(opscope_cuda, m) {
  m.def("softmax_forward(Tensor x, float scale, Tensor? mask) -> Tensor", &opscope::softmax_cuda::softmax_forward);
  m.def("softmax_backward(Tensor grad, Tensor y, float scale) -> Tensor", &opscope::softmax_cuda::softmax_backward);
}
