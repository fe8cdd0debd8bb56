// bias_gelu: y = gelu(x + bias) in one pass over x (the bias add fused into the activation), with
// GELU's erf form x * Phi(x) or its tanh form. The erf form uses a vectorizable normal tail (common.h:
// normal_tail, relative error < 1e-5 in both tails): x * Phi(-|x|), or x minus it for x >= 0. The tanh
// form is written as x * sigmoid(2u), which is 0.5 x (1 + tanh u) without tanh's cancellation near u = 0.
// Backward (recomputes x + bias): dx = g * gelu'(x + bias); dbias = column sums of dx (chunked).
#include "../csrc/common.h"

namespace opscope::bias_gelu {

constexpr double kBeta = 0.79788456080286535588;   // sqrt(2 / pi)
constexpr double kKappa = 0.044715;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

template <typename A, bool Tanh>
OPSCOPE_INLINE A gelu(A v) {
  if constexpr (Tanh) {
    const A u = A(kBeta) * (v + A(kKappa) * v * v * v);
    return v * sigmoid(A(2) * u);
  } else {
    const A ve = v * normal_tail(v);  // v * Phi(-|v|)
    return v < A(0) ? ve : v - ve;    // v * Phi(v)
  }
}

template <typename A, bool Tanh>
OPSCOPE_INLINE A gelu_grad(A v) {
  if constexpr (Tanh) {
    const A u = A(kBeta) * (v + A(kKappa) * v * v * v);
    const A s = sigmoid(A(2) * u);
    return s + v * A(2) * s * (A(1) - s) * A(kBeta) * (A(1) + A(3 * kKappa) * v * v);
  } else {
    return normal_cdf(v) + v * A(kInvSqrt2Pi) * vexp(A(-0.5) * v * v);
  }
}

template <typename T, bool Tanh>
OPSCOPE_CLONES void forward_rows(const T* x, const acc_t<T>* b, T* y, int64_t rows, int64_t n, bool stream) {
  using A = acc_t<T>;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    write_run(y + r * n, n, stream, [&](int64_t j) { return gelu<A, Tanh>(A(xr[j]) + b[j]); });
  }
}

template <typename T, bool Tanh>
OPSCOPE_CLONES void backward_row(const T* g, const T* x, const acc_t<T>* b, T* dx, acc_t<T>* db, int64_t n) {
  using A = acc_t<T>;
  for (int64_t j = 0; j < n; ++j) {
    const A d = A(g[j]) * gelu_grad<A, Tanh>(A(x[j]) + b[j]);
    dx[j] = T(d);
    db[j] += d;
  }
}

bool is_tanh(const std::string& approximate) {
  TORCH_CHECK_VALUE(approximate == "none" || approximate == "tanh",
                    "opscope::bias_gelu: approximate must be 'none' or 'tanh', got '", approximate, "'");
  return approximate == "tanh";
}

void check_inputs(const at::Tensor& x, const at::Tensor& bias, const char* op) {
  check_cpu(x, op, "x");
  check_cpu(bias, op, "bias");
  check_floating(x, op, "x");
  check_floating(bias, op, "bias");
  TORCH_CHECK_VALUE(x.dim() >= 1 && bias.dim() == 1 && bias.size(0) == x.size(-1), op,
                    ": bias must be 1-D with x's last dim (", x.dim() ? x.size(-1) : 0, "), got shape ",
                    bias.sizes());
}

at::Tensor forward(const at::Tensor& x, const at::Tensor& bias, std::string approximate, int64_t grain) {
  const char* op = "opscope::bias_gelu";
  check_inputs(x, bias, op);
  const bool tanh = is_tanh(approximate);
  const at::Tensor xc = x.contiguous();                    // named: alive until the kernel returns
  const at::Tensor bc = as_acc_contiguous(bias, x.scalar_type());
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "bias_gelu", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* px = xc.const_data_ptr<scalar_t>();
    const A* pb = bc.const_data_ptr<A>();
    scalar_t* py = y.mutable_data_ptr<scalar_t>();
    const bool stream = streams<scalar_t>(x.numel());  // non-temporal stores for a large float32 y
    at::parallel_for(0, rows, row_grain(grain, n), [&](int64_t r0, int64_t r1) {
      if (tanh) forward_rows<scalar_t, true>(px + r0 * n, pb, py + r0 * n, r1 - r0, n, stream);
      else forward_rows<scalar_t, false>(px + r0 * n, pb, py + r0 * n, r1 - r0, n, stream);
      if (stream) stream_fence();
    });
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& bias,
                                            std::string approximate, int64_t grain) {
  const char* op = "opscope::bias_gelu_backward";
  check_inputs(x, bias, op);
  check_cpu(grad, op, "grad");
  check_same_dtype(grad, x, op, "grad", "x");
  check_same_shape(grad, x, op, "grad", "x");
  const bool tanh = is_tanh(approximate);
  const at::Tensor xc = x.contiguous(), gc = grad.contiguous();
  const at::Tensor bc = as_acc_contiguous(bias, x.scalar_type());
  at::Tensor dx = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor db_acc = at::empty({bias.size(0)}, bc.options());
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "bias_gelu_backward", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* px = xc.const_data_ptr<scalar_t>();
    const scalar_t* pg = gc.const_data_ptr<scalar_t>();
    const A* pb = bc.const_data_ptr<A>();
    scalar_t* pdx = dx.mutable_data_ptr<scalar_t>();
    chunked_column_sums<A>(rows, n, 1, row_grain(grain, n), {db_acc.mutable_data_ptr<A>()},
                           [&](int64_t r, A* partial) {
      if (tanh) backward_row<scalar_t, true>(pg + r * n, px + r * n, pb, pdx + r * n, partial, n);
      else backward_row<scalar_t, false>(pg + r * n, px + r * n, pb, pdx + r * n, partial, n);
    });
  });
  return {dx, db_acc.to(bias.scalar_type())};
}

}  // namespace opscope::bias_gelu

TORCH_LIBRARY_FRAGMENT(opscope_cpu, m) {
  m.def("bias_gelu_forward(Tensor x, Tensor bias, str approximate, int grain=0) -> Tensor",
        &opscope::bias_gelu::forward);
  m.def("bias_gelu_backward(Tensor grad, Tensor x, Tensor bias, str approximate, int grain=0) -> (Tensor, Tensor)",
        &opscope::bias_gelu::backward);
}
