// broadcast_add's torch binding (torch.ops.opscope_cuda.broadcast_add_forward): checks, the output's
// broadcast shape, and the operands' strides coalesced to at most 4 dims for the launcher.
#include "../csrc/cuda_binding.h"
#include "cuda_launchers.h"

namespace opscope::broadcast_add_cuda {
namespace {

at::Tensor broadcast_add_forward(const at::Tensor& a, const at::Tensor& b) {
  const char* op = "opscope::broadcast_add";
  check_cuda(a, op, "a");
  check_same_device(a, b, op, "a", "b");
  check_floating(a, op, "a");
  check_same_dtype(a, b, op, "a", "b");
  const c10::cuda::CUDAGuard guard(a.device());
  auto shape = broadcast_shape(a.sizes(), b.sizes(), op, "a", "b");
  at::Tensor out = at::empty(shape, a.options());
  if (out.numel() == 0) return out;
  auto sa = expanded_strides(a, shape), sb = expanded_strides(b, shape);
  std::vector<int64_t> s4, a4, b4;  // coalesce to at most 4 dims, else fall back to contiguous copies
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (!s4.empty() && a4.back() == sa[i] * shape[i] && b4.back() == sb[i] * shape[i]) {
      s4.back() *= shape[i]; a4.back() = sa[i]; b4.back() = sb[i];
    } else {
      s4.push_back(shape[i]); a4.push_back(sa[i]); b4.push_back(sb[i]);
    }
  }
  at::Tensor ac = a, bc = b;
  if (s4.size() > 4) {
    ac = a.expand(shape).contiguous();
    bc = b.expand(shape).contiguous();
    s4 = {out.numel()}; a4 = {1}; b4 = {1};
  }
  while (s4.size() < 4) { s4.insert(s4.begin(), 1); a4.insert(a4.begin(), 0); b4.insert(b4.begin(), 0); }
  opscope_cuda::broadcast_add(ac.const_data_ptr(), bc.const_data_ptr(), out.mutable_data_ptr(), out.numel(), s4.data(),
                              a4.data(), b4.data(), code(a), stream_of(a));
  return out;
}

}  // namespace
}  // namespace opscope::broadcast_add_cuda

TORCH_LIBRARY_FRAGMENT(opscope_cuda, m) {
  m.def("broadcast_add_forward(Tensor a, Tensor b) -> Tensor", &opscope::broadcast_add_cuda::broadcast_add_forward);
}
