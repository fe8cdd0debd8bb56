// swiglu: y = silu(a) * b = a * sigmoid(a) * b, elementwise over same-shaped a and b, one pass.
// Backward: da = g * b * s * (1 + a * (1 - s)), db = g * a * s, with s = sigmoid(a).
#include "../csrc/common.h"

namespace opscope::swiglu {

template <typename T>
OPSCOPE_CLONES void forward_run(const T* a, const T* b, T* y, int64_t n, bool stream) {
  using A = acc_t<T>;
  write_run(y, n, stream, [&](int64_t i) {
    const A av = A(a[i]);
    return av * sigmoid(av) * A(b[i]);
  });
}

template <typename T>
OPSCOPE_CLONES void backward_run(const T* g, const T* a, const T* b, T* da, T* db, int64_t n) {
  using A = acc_t<T>;
  for (int64_t i = 0; i < n; ++i) {
    const A av = A(a[i]), gv = A(g[i]), s = sigmoid(av);
    da[i] = T(gv * A(b[i]) * s * (A(1) + av * (A(1) - s)));
    db[i] = T(gv * av * s);
  }
}

void check_inputs(const at::Tensor& a, const at::Tensor& b, const char* op) {
  check_cpu(a, op, "a");
  check_cpu(b, op, "b");
  check_floating(a, op, "a");
  check_same_dtype(a, b, op, "a", "b");
  check_same_shape(a, b, op, "a", "b");
}

at::Tensor forward(const at::Tensor& a, const at::Tensor& b, int64_t grain) {
  const char* op = "opscope::swiglu";
  check_inputs(a, b, op);
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  at::Tensor y = at::empty(a.sizes(), a.options().memory_format(at::MemoryFormat::Contiguous));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a.scalar_type(), "swiglu", [&] {
    const scalar_t* pa = ac.const_data_ptr<scalar_t>();
    const scalar_t* pb = bc.const_data_ptr<scalar_t>();
    scalar_t* py = y.mutable_data_ptr<scalar_t>();
    const bool stream = streams<scalar_t>(a.numel());  // non-temporal stores for a large float32 y
    at::parallel_for(0, a.numel(), grain_or(grain, 32768), [&](int64_t i0, int64_t i1) {
      forward_run<scalar_t>(pa + i0, pb + i0, py + i0, i1 - i0, stream);
      if (stream) stream_fence();
    });
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> backward(const at::Tensor& grad, const at::Tensor& a, const at::Tensor& b,
                                            int64_t grain) {
  const char* op = "opscope::swiglu_backward";
  check_inputs(a, b, op);
  check_cpu(grad, op, "grad");
  check_same_dtype(grad, a, op, "grad", "a");
  check_same_shape(grad, a, op, "grad", "a");
  const at::Tensor ac = a.contiguous(), bc = b.contiguous(), gc = grad.contiguous();
  auto opts = a.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor da = at::empty(a.sizes(), opts), db = at::empty(a.sizes(), opts);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a.scalar_type(), "swiglu_backward", [&] {
    const scalar_t* pa = ac.const_data_ptr<scalar_t>();
    const scalar_t* pb = bc.const_data_ptr<scalar_t>();
    const scalar_t* pg = gc.const_data_ptr<scalar_t>();
    scalar_t* pda = da.mutable_data_ptr<scalar_t>();
    scalar_t* pdb = db.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, a.numel(), grain_or(grain, 32768), [&](int64_t i0, int64_t i1) {
      backward_run<scalar_t>(pg + i0, pa + i0, pb + i0, pda + i0, pdb + i0, i1 - i0);
    });
  });
  return {da, db};
}

}  // namespace opscope::swiglu

TORCH_LIBRARY_FRAGMENT(opscope_cpu, m) {
  m.def("swiglu_forward(Tensor a, Tensor b, int grain=0) -> Tensor", &opscope::swiglu::forward);
  m.def("swiglu_backward(Tensor grad, Tensor a, Tensor b, int grain=0) -> (Tensor, Tensor)",
        &opscope::swiglu::backward);
}
