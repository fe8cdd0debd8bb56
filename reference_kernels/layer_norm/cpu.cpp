// layer_norm over the trailing `normalized_shape` dims, affine fused into the write:
//   pass 1 (one pass over the row): mean and variance by Welford's update in WL independent lanes
//          (no sum-of-squares cancellation), the lanes merged pairwise with Chan's formula. The row is
//          shifted by its first element K first, so a large common offset costs no precision;
//   pass 2 (row still in cache): y = ((x - K) - mean') * rstd * weight + bias, mean' = mean - K.
// Backward recomputes mean/rstd per row; with xhat = (x - mean) * rstd and q = g * w:
//   dx = rstd * (q - mean(q) - xhat * mean(q * xhat)),  dw = col sums of g * xhat,  db = col sums of g.
#include "../csrc/common.h"

namespace opscope::layer_norm {

constexpr int64_t WL = 32;  // Welford lanes: two AVX-512 vectors, so two independent update chains

// Statistics of x - shift, shift = x[0]: returns the shifted mean and the (biased) variance.
template <typename T>
OPSCOPE_INLINE void welford(const T* x, int64_t n, acc_t<T>& shift, acc_t<T>& mean, acc_t<T>& var) {
  using A = acc_t<T>;
  const A K = n ? A(x[0]) : A(0);
  shift = K;
  A m[WL] = {}, m2[WL] = {};
  const int64_t blocks = n / WL;
  for (int64_t b = 0; b < blocks; ++b) {
    const A inv = A(1) / A(b + 1);
    for (int64_t l = 0; l < WL; ++l) {
      const A v = A(x[b * WL + l]) - K;
      const A d = v - m[l];
      m[l] += d * inv;
      m2[l] += d * (v - m[l]);
    }
  }
  // Merge lanes pairwise: equal counts c each, so mean = (ma + mb) / 2, M2 = M2a + M2b + d^2 c / 2.
  A count = A(blocks);
  for (int64_t width = WL / 2; width >= 1; width /= 2) {
    for (int64_t l = 0; l < width; ++l) {
      const A d = m[l + width] - m[l];
      m[l] += d * A(0.5);
      m2[l] += m2[l + width] + d * d * count * A(0.5);
    }
    count *= 2;
  }
  A mu = blocks ? m[0] : A(0), M2 = blocks ? m2[0] : A(0);
  count = A(blocks * WL);
  for (int64_t j = blocks * WL; j < n; ++j) {  // the tail, one element at a time
    const A v = A(x[j]) - K;
    count += 1;
    const A d = v - mu;
    mu += d / count;
    M2 += d * (v - mu);
  }
  mean = mu;
  var = n ? M2 / A(n) : A(0);
}

template <typename T>
OPSCOPE_CLONES void forward_rows(const T* x, const acc_t<T>* w, const acc_t<T>* b, T* y, int64_t rows, int64_t n,
                                 double eps, bool stream) {
  using A = acc_t<T>;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    A shift, mean, var;
    welford<T>(xr, n, shift, mean, var);
    const A rstd = A(1) / std::sqrt(var + A(eps));
    T* yr = y + r * n;
    write_run(yr, n, stream, [&](int64_t j) { return ((A(xr[j]) - shift) - mean) * rstd * w[j] + b[j]; });
  }
}

template <typename T>
OPSCOPE_CLONES void backward_row(const T* g, const T* x, const acc_t<T>* w, T* dx, acc_t<T>* dw, acc_t<T>* db,
                                 int64_t n, double eps) {
  using A = acc_t<T>;
  A shift, mean, var;
  welford<T>(x, n, shift, mean, var);
  const A rstd = A(1) / std::sqrt(var + A(eps));
  const A sq = lane_sum<A>(n, [&](int64_t j) { return A(g[j]) * w[j]; });
  const A sqx = lane_sum<A>(n, [&](int64_t j) { return A(g[j]) * w[j] * ((A(x[j]) - shift) - mean) * rstd; });
  const A mq = sq / A(n), mqx = sqx / A(n);
  for (int64_t j = 0; j < n; ++j) {
    const A gv = A(g[j]), xhat = ((A(x[j]) - shift) - mean) * rstd;
    dx[j] = T(rstd * (gv * w[j] - mq - xhat * mqx));
    dw[j] += gv * xhat;
    db[j] += gv;
  }
}

int64_t check_inputs(const at::Tensor& x, at::IntArrayRef shape, const std::optional<at::Tensor>& w,
                     const std::optional<at::Tensor>& b, const char* op) {
  check_cpu(x, op, "x");
  check_floating(x, op, "x");
  const int64_t k = shape.size();
  TORCH_CHECK_VALUE(k >= 1 && x.dim() >= k && x.sizes().slice(x.dim() - k) == shape, op,
                    ": normalized_shape ", shape, " must equal the trailing dims of x's shape ", x.sizes());
  for (const auto& [t, name] : {std::pair{&w, "weight"}, std::pair{&b, "bias"}}) {
    if (!t->has_value()) continue;
    check_cpu(**t, op, name);
    check_floating(**t, op, name);
    TORCH_CHECK_VALUE((*t)->sizes() == shape, op, ": ", name, " must have shape normalized_shape ", shape,
                      ", got ", (*t)->sizes());
  }
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

at::Tensor affine_or(const std::optional<at::Tensor>& t, int64_t n, double fill, at::ScalarType act) {
  auto acc = act == at::kDouble ? at::kDouble : at::kFloat;
  if (t.has_value()) return as_acc_contiguous(*t, act).reshape({n});
  return at::empty({n}, at::TensorOptions().dtype(acc)).fill_(fill);
}

at::Tensor forward(const at::Tensor& x, at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                   const std::optional<at::Tensor>& bias, double eps, int64_t grain) {
  const char* op = "opscope::layer_norm";
  const int64_t n = check_inputs(x, normalized_shape, weight, bias, op);
  const at::Tensor xc = x.contiguous();
  const at::Tensor wc = affine_or(weight, n, 1.0, x.scalar_type());
  const at::Tensor bc = affine_or(bias, n, 0.0, x.scalar_type());
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t rows = n ? x.numel() / n : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "layer_norm", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* px = xc.const_data_ptr<scalar_t>();
    const A* pw = wc.const_data_ptr<A>();
    const A* pb = bc.const_data_ptr<A>();
    scalar_t* py = y.mutable_data_ptr<scalar_t>();
    const bool stream = streams<scalar_t>(x.numel());  // non-temporal stores for a large float32 y
    at::parallel_for(0, rows, row_grain(grain, n), [&](int64_t r0, int64_t r1) {
      forward_rows<scalar_t>(px + r0 * n, pw, pb, py + r0 * n, r1 - r0, n, eps, stream);
      if (stream) stream_fence();
    });
  });
  return y;
}

// Returns (dx, dweight, dbias); dweight/dbias are empty (shape [0]) when weight/bias are absent.
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const at::Tensor& grad, const at::Tensor& x,
                                                        at::IntArrayRef normalized_shape,
                                                        const std::optional<at::Tensor>& weight,
                                                        const std::optional<at::Tensor>& bias, double eps,
                                                        int64_t grain) {
  const char* op = "opscope::layer_norm_backward";
  const int64_t n = check_inputs(x, normalized_shape, weight, bias, op);
  check_cpu(grad, op, "grad");
  check_same_dtype(grad, x, op, "grad", "x");
  check_same_shape(grad, x, op, "grad", "x");
  const at::Tensor xc = x.contiguous(), gc = grad.contiguous();
  const at::Tensor wc = affine_or(weight, n, 1.0, x.scalar_type());
  at::Tensor dx = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor dw = at::empty({n}, wc.options()), db = at::empty({n}, wc.options());
  const int64_t rows = n ? x.numel() / n : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "layer_norm_backward", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* px = xc.const_data_ptr<scalar_t>();
    const scalar_t* pg = gc.const_data_ptr<scalar_t>();
    const A* pw = wc.const_data_ptr<A>();
    scalar_t* pdx = dx.mutable_data_ptr<scalar_t>();
    chunked_column_sums<A>(rows, n, 2, row_grain(grain, n), {dw.mutable_data_ptr<A>(), db.mutable_data_ptr<A>()},
                           [&](int64_t r, A* partial) {
      backward_row<scalar_t>(pg + r * n, px + r * n, pw, pdx + r * n, partial, partial + n, n, eps);
    });
  });
  // Absent parameters get distinct empty tensors (outputs of a custom op must not alias each other).
  return {dx, weight.has_value() ? dw.to(weight->scalar_type()).reshape(normalized_shape) : at::empty({0}, x.options()),
          bias.has_value() ? db.to(bias->scalar_type()).reshape(normalized_shape) : at::empty({0}, x.options())};
}

}  // namespace opscope::layer_norm

TORCH_LIBRARY_FRAGMENT(opscope_cpu, m) {
  m.def("layer_norm_forward(Tensor x, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps, "
        "int grain=0) -> Tensor", &opscope::layer_norm::forward);
  m.def("layer_norm_backward(Tensor grad, Tensor x, int[] normalized_shape, Tensor? weight, Tensor? bias, "
        "float eps, int grain=0) -> (Tensor, Tensor, Tensor)", &opscope::layer_norm::backward);
}
