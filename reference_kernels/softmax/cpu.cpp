// softmax over the last dim of z = x * scale + mask (mask optional, additive, broadcastable to x).
// Per row, with the row in a float buffer that stays in L1/L2 (the output row itself for float32):
//   pass 1: z and its max (LANES running maxima);  pass 2: e = exp(z - max) in place and their sum
//   (LANES accumulators);  pass 3: y = e / sum. One exp per element; x is read once from memory.
// The mask is never materialized: each row finds its mask row through the mask's broadcast strides.
// Backward (from the saved output y): dx = scale * y * (g - sum(g * y)).
#include "../csrc/common.h"

namespace opscope::softmax {

template <typename T, int MaskKind>  // MaskKind: 0 none, 1 contiguous last dim, 2 strided (or stride 0)
OPSCOPE_CLONES void forward_row(const T* x, const acc_t<T>* mask, int64_t ms, acc_t<T>* buf, T* y, int64_t n,
                                double scale) {
  using A = acc_t<T>;
  const A sc = A(scale);
  const int64_t full = n - n % LANES;
  // pass 1: z = x * scale (+ mask) into buf, with LANES running maxima
  A mx[LANES];
  for (int64_t l = 0; l < LANES; ++l) mx[l] = -std::numeric_limits<A>::infinity();
  auto z = [&](int64_t j) {
    if constexpr (MaskKind == 0) return A(x[j]) * sc;
    else if constexpr (MaskKind == 1) return A(x[j]) * sc + mask[j];
    else return A(x[j]) * sc + mask[j * ms];
  };
  // (flat loops: each vectorizes on its own; a fused lane loop with exp inside does not)
  for (int64_t j = 0; j < n; ++j) buf[j] = z(j);
  for (int64_t i = 0; i < full; i += LANES)
    for (int64_t l = 0; l < LANES; ++l) mx[l] = buf[i + l] > mx[l] ? buf[i + l] : mx[l];
  A m = -std::numeric_limits<A>::infinity();
  for (int64_t l = 0; l < LANES; ++l) m = mx[l] > m ? mx[l] : m;
  for (int64_t j = full; j < n; ++j) m = buf[j] > m ? buf[j] : m;
  // pass 2: e = exp(z - max) in place, then their sum (LANES accumulators)
  for (int64_t j = 0; j < n; ++j) buf[j] = vexp(buf[j] - m);
  const A s = lane_sum<A>(n, [&](int64_t j) { return buf[j]; });
  // pass 3: normalize (the row is still in L1/L2)
  const A inv = A(1) / s;
  for (int64_t j = 0; j < n; ++j) y[j] = T(buf[j] * inv);
}

template <typename T>
OPSCOPE_CLONES void backward_row(const T* g, const T* y, T* dx, int64_t n, double scale) {
  using A = acc_t<T>;
  const A dot = lane_sum<A>(n, [&](int64_t j) { return A(g[j]) * A(y[j]); });
  const A sc = A(scale);
  for (int64_t j = 0; j < n; ++j) dx[j] = T(sc * A(y[j]) * (A(g[j]) - dot));
}

at::Tensor forward(const at::Tensor& x, double scale, const std::optional<at::Tensor>& mask, int64_t grain) {
  const char* op = "opscope::softmax";
  check_cpu(x, op, "x");
  check_floating(x, op, "x");
  TORCH_CHECK_VALUE(x.dim() >= 1, op, ": x must have at least one dim");
  at::Tensor mc;  // the mask in the accumulation dtype (explicit conversion), unexpanded
  std::vector<int64_t> mstride;
  if (mask.has_value()) {
    check_cpu(*mask, op, "mask");
    TORCH_CHECK(mask->is_floating_point(), op, ": mask must be an additive floating mask (0 keeps, -inf drops), "
                "got ", mask->scalar_type(), "; convert a boolean mask with torch.where(mask, 0.0, -inf)");
    broadcast_shape(x.sizes(), mask->sizes(), op, "x", "mask");
    TORCH_CHECK_VALUE(mask->dim() <= x.dim() && broadcast_shape(x.sizes(), mask->sizes(), op, "x", "mask") ==
                      x.sizes().vec(), op, ": mask of shape ", mask->sizes(), " must broadcast to x's shape ",
                      x.sizes(), " without growing it");
    mc = as_acc_contiguous(*mask, x.scalar_type());
    mstride = expanded_strides(mc, x.sizes());
  }
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0, nd = x.dim();
  const auto sizes = x.sizes().vec();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "softmax", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* px = xc.const_data_ptr<scalar_t>();
    const A* pm = mc.defined() ? mc.const_data_ptr<A>() : nullptr;
    scalar_t* py = y.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, row_grain(grain, n), [&](int64_t r0, int64_t r1) {
      std::vector<A> local(std::is_same_v<scalar_t, A> ? 0 : n);
      for (int64_t r = r0; r < r1; ++r) {
        const A* mrow = nullptr;
        if (pm) {  // unravel r over x's leading dims, dot with the mask's broadcast strides
          int64_t off = 0, rest = r;
          for (int64_t d = nd - 2; d >= 0; --d) {
            off += (rest % sizes[d]) * mstride[d];
            rest /= sizes[d];
          }
          mrow = pm + off;
        }
        A* buf;
        if constexpr (std::is_same_v<scalar_t, A>) buf = reinterpret_cast<A*>(py + r * n);
        else buf = local.data();
        if (!pm) forward_row<scalar_t, 0>(px + r * n, nullptr, 0, buf, py + r * n, n, scale);
        else if (mstride[nd - 1] == 1) forward_row<scalar_t, 1>(px + r * n, mrow, 1, buf, py + r * n, n, scale);
        else forward_row<scalar_t, 2>(px + r * n, mrow, mstride[nd - 1], buf, py + r * n, n, scale);
      }
    });
  });
  return y;
}

at::Tensor backward(const at::Tensor& grad, const at::Tensor& y, double scale, int64_t grain) {
  const char* op = "opscope::softmax_backward";
  check_cpu(grad, op, "grad");
  check_cpu(y, op, "y");
  check_floating(y, op, "y");
  check_same_dtype(grad, y, op, "grad", "y");
  check_same_shape(grad, y, op, "grad", "y");
  const at::Tensor gc = grad.contiguous(), yc = y.contiguous();
  at::Tensor dx = at::empty(y.sizes(), y.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t n = y.size(-1), rows = n ? y.numel() / n : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, y.scalar_type(), "softmax_backward", [&] {
    const scalar_t* pg = gc.const_data_ptr<scalar_t>();
    const scalar_t* py = yc.const_data_ptr<scalar_t>();
    scalar_t* pdx = dx.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, row_grain(grain, n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) backward_row<scalar_t>(pg + r * n, py + r * n, pdx + r * n, n, scale);
    });
  });
  return dx;
}

}  // namespace opscope::softmax

TORCH_LIBRARY_FRAGMENT(opscope_cpu, m) {
  m.def("softmax_forward(Tensor x, float scale, Tensor? mask, int grain=0) -> Tensor", &opscope::softmax::forward);
  m.def("softmax_backward(Tensor grad, Tensor y, float scale, int grain=0) -> Tensor", &opscope::softmax::backward);
}
