// softmax over the last dim of z = x * scale + mask (mask optional, additive, broadcastable to x).
// Per row, with the row's exponentials in a float buffer of the task's own that stays in L1/L2:
//   pass 1: the row max (LANES running maxima): of x itself when there is no mask and scale > 0
//           (max(x * scale) = max(x) * scale: rounding is monotonic), else of z, written to the buffer;
//   pass 2: e = exp(z - max) into the buffer, then their sum (LANES accumulators); meanwhile the task's
//           next row is prefetched (the row is read while this one computes, not after);
//   pass 3: y = e / sum, with non-temporal stores for a float32 output of 16 MiB or more (common.h).
// x is read from memory once (pass 2 re-reads the row from cache), y written once; one exp per element
// (common.h's vexp: degree 5, <= 3 ulp, the accuracy budget of aten's own softmax exp).
// The mask is never materialized: each row finds its mask row through the mask's broadcast strides.
// Backward (from the saved output y): dx = scale * y * (g - sum(g * y)).
#include "../csrc/common.h"

namespace opscope::softmax {

template <typename T, int MaskKind>  // MaskKind: 0 none, 1 contiguous last dim, 2 strided (or stride 0)
OPSCOPE_CLONES void forward_row(const T* x, const acc_t<T>* mask, int64_t ms, acc_t<T>* buf, T* y, int64_t n,
                                double scale, bool stream, const T* next) {
  using A = acc_t<T>;
  const A sc = A(scale);
  auto z = [&](int64_t j) {
    if constexpr (MaskKind == 0) return A(x[j]) * sc;
    else if constexpr (MaskKind == 1) return A(x[j]) * sc + mask[j];
    else return A(x[j]) * sc + mask[j * ms];
  };
  // (flat loops: each vectorizes on its own; a fused lane loop with exp inside does not)
  bool direct = false;  // pass 1 on x itself, pass 2 computes z on the fly
  if constexpr (MaskKind == 0 && std::is_same_v<T, A>) direct = sc > A(0);
  // pass 2 runs in chunks, each also prefetching a chunk of the task's next row: its pass 1 then reads
  // from cache, and the memory traffic overlaps this row's exponentials
  auto exp_pass = [&](A m, auto&& arg) {
    for (int64_t c = 0; c < n; c += PREFETCH_CHUNK) {
      const int64_t e = std::min(n, c + PREFETCH_CHUNK);
      if (next != nullptr) prefetch_range(next + c, e - c);
      for (int64_t j = c; j < e; ++j) buf[j] = vexp_low(arg(j) - m);  // z - max <= 0 (or NaN)
    }
  };
  if (direct) {
    exp_pass(lane_max<A>(reinterpret_cast<const A*>(x), n) * sc, z);
  } else {
    for (int64_t j = 0; j < n; ++j) buf[j] = z(j);
    exp_pass(lane_max<A>(buf, n), [&](int64_t j) { return buf[j]; });
  }
  const A s = lane_sum<A>(n, [&](int64_t j) { return buf[j]; });
  const A inv = A(1) / s;
  write_run(y, n, stream, [&](int64_t j) { return buf[j] * inv; });
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
    const bool stream = streams<scalar_t>(x.numel());
    at::parallel_for(0, rows, row_grain(grain, n), [&](int64_t r0, int64_t r1) {
      std::vector<A> local(n);  // the task's row buffer
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
        A* buf = local.data();
        const scalar_t* next = r + 1 < r1 ? px + (r + 1) * n : nullptr;
        if (!pm) {
          forward_row<scalar_t, 0>(px + r * n, nullptr, 0, buf, py + r * n, n, scale, stream, next);
        } else if (mstride[nd - 1] == 1) {
          forward_row<scalar_t, 1>(px + r * n, mrow, 1, buf, py + r * n, n, scale, stream, next);
        } else {
          forward_row<scalar_t, 2>(px + r * n, mrow, mstride[nd - 1], buf, py + r * n, n, scale, stream, next);
        }
      }
      if (stream) stream_fence();
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
