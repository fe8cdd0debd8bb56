// Torch bindings of the CUDA kernels: check the tensors at the entry (device, dtype, shape), make them
// contiguous in named locals that outlive the launch, allocate outputs and workspaces with torch's
// caching allocator, launch on the current stream, and register the ops under torch.ops.opscope_cuda.
// Built by reference_kernels/_build.py only where torch has CUDA (the .cu files alone are compiled by
// the tests everywhere nvcc exists).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include "common.h"
#include "cuda_launchers.h"

namespace opscope {
namespace {

void check_cuda(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.is_cuda(), op, ": ", name, " is on ", t.device(), "; this is the CUDA kernel");
}

void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* op, const char* na, const char* nb) {
  TORCH_CHECK(a.device() == b.device(), op, ": ", na, " is on ", a.device(), " but ", nb, " is on ", b.device());
}

// The incoming gradient must match the tensor it is the gradient for (device, dtype, shape).
void check_grad(const at::Tensor& grad, const at::Tensor& t, const char* op, const char* name) {
  check_cuda(t, op, name);
  check_same_device(t, grad, op, name, "grad");
  check_same_dtype(grad, t, op, "grad", name);
  check_same_shape(grad, t, op, "grad", name);
}

int code(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return opscope_cuda::DT_F32;
    case at::kDouble: return opscope_cuda::DT_F64;
    case at::kBFloat16: return opscope_cuda::DT_BF16;
    default: return opscope_cuda::DT_F16;
  }
}

cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

at::ScalarType acc_of(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

at::Tensor param(const std::optional<at::Tensor>& t, int64_t n, double fill, const at::Tensor& x) {
  if (t.has_value()) return t->to(acc_of(x)).contiguous().reshape({n});
  return at::full({n}, fill, x.options().dtype(acc_of(x)));
}

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

std::pair<at::Tensor, int64_t> rows_view(const at::Tensor& x, int64_t n) {
  return {x.contiguous(), n ? x.numel() / n : 0};
}

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

int64_t check_norm(const at::Tensor& x, at::IntArrayRef shape, const char* op) {
  check_cuda(x, op, "x");
  check_floating(x, op, "x");
  const int64_t k = shape.size();
  TORCH_CHECK_VALUE(k >= 1 && x.dim() >= k && x.sizes().slice(x.dim() - k) == shape, op, ": shape ", shape,
                    " must equal the trailing dims of x's shape ", x.sizes());
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

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

at::Tensor reduce(const at::Tensor& x, int64_t dim, bool keepdim, bool mean, const char* op) {
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
  opscope_cuda::reduce_dim(xc.const_data_ptr(), out.mutable_data_ptr(), k1, r, k0, mean, code(x), stream_of(x));
  return out;
}

at::Tensor sum_forward(const at::Tensor& x, int64_t dim, bool keepdim) { return reduce(x, dim, keepdim, false, "opscope::sum"); }
at::Tensor mean_forward(const at::Tensor& x, int64_t dim, bool keepdim) { return reduce(x, dim, keepdim, true, "opscope::mean"); }

}  // namespace
}  // namespace opscope

TORCH_LIBRARY(opscope_cuda, m) {
  m.def("broadcast_add_forward(Tensor a, Tensor b) -> Tensor", &opscope::broadcast_add_forward);
  m.def("bias_gelu_forward(Tensor x, Tensor bias, str approximate) -> Tensor", &opscope::bias_gelu_forward);
  m.def("bias_gelu_backward(Tensor grad, Tensor x, Tensor bias, str approximate) -> (Tensor, Tensor)",
        &opscope::bias_gelu_backward);
  m.def("swiglu_forward(Tensor a, Tensor b) -> Tensor", &opscope::swiglu_forward);
  m.def("swiglu_backward(Tensor grad, Tensor a, Tensor b) -> (Tensor, Tensor)", &opscope::swiglu_backward);
  m.def("rms_norm_forward(Tensor x, Tensor weight, float eps) -> Tensor", &opscope::rms_norm_forward);
  m.def("rms_norm_backward(Tensor grad, Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)",
        &opscope::rms_norm_backward);
  m.def("layer_norm_forward(Tensor x, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> Tensor",
        &opscope::layer_norm_forward);
  m.def("layer_norm_backward(Tensor grad, Tensor x, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps) "
        "-> (Tensor, Tensor, Tensor)", &opscope::layer_norm_backward);
  m.def("softmax_forward(Tensor x, float scale, Tensor? mask) -> Tensor", &opscope::softmax_forward);
  m.def("softmax_backward(Tensor grad, Tensor y, float scale) -> Tensor", &opscope::softmax_backward);
  m.def("sum_forward(Tensor x, int dim, bool keepdim=False) -> Tensor", &opscope::sum_forward);
  m.def("mean_forward(Tensor x, int dim, bool keepdim=False) -> Tensor", &opscope::mean_forward);
}
