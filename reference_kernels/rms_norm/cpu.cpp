// rms_norm: y = x * rsqrt(mean(x^2 over the normalized dims) + eps) * weight, one row per task:
// the sum of squares (LANES accumulators) then the scaled write, the row still in cache.
// Backward recomputes rstd per row (nothing saved but x): with q = g * w,
//   dx = rstd * q - x * rstd^3 * sum(q * x) / n,   dw = column sums of g * x * rstd (chunked).
#include "../csrc/common.h"

namespace opscope::rms_norm {

template <typename T>
OPSCOPE_CLONES void forward_rows(const T* x, const acc_t<T>* w, T* y, int64_t rows, int64_t n, double eps,
                                 bool stream) {
  using A = acc_t<T>;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    const A ss = lane_sum<A>(n, [&](int64_t j) { const A v = A(xr[j]); return v * v; });
    const A rstd = A(1) / std::sqrt(ss / A(n) + A(eps));
    T* yr = y + r * n;
    write_run(yr, n, stream, [&](int64_t j) { return A(xr[j]) * rstd * w[j]; });
  }
}

template <typename T>
OPSCOPE_CLONES void backward_row(const T* g, const T* x, const acc_t<T>* w, T* dx, acc_t<T>* dw, int64_t n,
                                 double eps) {
  using A = acc_t<T>;
  const A ss = lane_sum<A>(n, [&](int64_t j) { const A v = A(x[j]); return v * v; });
  const A rstd = A(1) / std::sqrt(ss / A(n) + A(eps));
  const A dot = lane_sum<A>(n, [&](int64_t j) { return A(g[j]) * w[j] * A(x[j]); });
  const A c = rstd * rstd * rstd * dot / A(n);
  for (int64_t j = 0; j < n; ++j) {
    const A xv = A(x[j]), gv = A(g[j]);
    dx[j] = T(rstd * gv * w[j] - xv * c);
    dw[j] += gv * xv * rstd;
  }
}

int64_t check_inputs(const at::Tensor& x, const at::Tensor& w, const char* op) {
  check_cpu(x, op, "x");
  check_cpu(w, op, "weight");
  check_floating(x, op, "x");
  check_floating(w, op, "weight");
  const int64_t k = w.dim();
  TORCH_CHECK_VALUE(k >= 1 && x.dim() >= k && x.sizes().slice(x.dim() - k) == w.sizes(), op,
                    ": weight's shape ", w.sizes(), " must equal the trailing dims of x's shape ", x.sizes());
  return w.numel();
}

at::Tensor forward(const at::Tensor& x, const at::Tensor& weight, double eps, int64_t grain) {
  const char* op = "opscope::rms_norm";
  const int64_t n = check_inputs(x, weight, op);
  const at::Tensor xc = x.contiguous();
  const at::Tensor wc = as_acc_contiguous(weight, x.scalar_type());  // mixed precision: explicit
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t rows = n ? x.numel() / n : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* px = xc.const_data_ptr<scalar_t>();
    const A* pw = wc.const_data_ptr<A>();
    scalar_t* py = y.mutable_data_ptr<scalar_t>();
    const bool stream = streams<scalar_t>(x.numel());  // non-temporal stores for a large float32 y
    at::parallel_for(0, rows, row_grain(grain, n), [&](int64_t r0, int64_t r1) {
      forward_rows<scalar_t>(px + r0 * n, pw, py + r0 * n, r1 - r0, n, eps, stream);
      if (stream) stream_fence();
    });
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
                                            double eps, int64_t grain) {
  const char* op = "opscope::rms_norm_backward";
  const int64_t n = check_inputs(x, weight, op);
  check_cpu(grad, op, "grad");
  check_same_dtype(grad, x, op, "grad", "x");
  check_same_shape(grad, x, op, "grad", "x");
  const at::Tensor xc = x.contiguous(), gc = grad.contiguous();
  const at::Tensor wc = as_acc_contiguous(weight, x.scalar_type());
  at::Tensor dx = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor dw = at::empty(weight.sizes(), wc.options());
  const int64_t rows = n ? x.numel() / n : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm_backward", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* px = xc.const_data_ptr<scalar_t>();
    const scalar_t* pg = gc.const_data_ptr<scalar_t>();
    const A* pw = wc.const_data_ptr<A>();
    scalar_t* pdx = dx.mutable_data_ptr<scalar_t>();
    chunked_column_sums<A>(rows, n, 1, row_grain(grain, n), {dw.mutable_data_ptr<A>()},
                           [&](int64_t r, A* partial) {
      backward_row<scalar_t>(pg + r * n, px + r * n, pw, pdx + r * n, partial, n, eps);
    });
  });
  return {dx, dw.to(weight.scalar_type())};
}

}  // namespace opscope::rms_norm

TORCH_LIBRARY_FRAGMENT(opscope_cpu, m) {
  m.def("rms_norm_forward(Tensor x, Tensor weight, float eps, int grain=0) -> Tensor", &opscope::rms_norm::forward);
  m.def("rms_norm_backward(Tensor grad, Tensor x, Tensor weight, float eps, int grain=0) -> (Tensor, Tensor)",
        &opscope::rms_norm::backward);
}
