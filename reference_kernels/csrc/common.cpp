// Out-of-line helpers declared in common.h, plus introspection ops the tests use.
#include "common.h"

#include <atomic>

namespace opscope {

std::vector<int64_t> broadcast_shape(at::IntArrayRef a, at::IntArrayRef b, const char* op, const char* na,
                                     const char* nb) {
  // The right-aligned rule: compare trailing dims; equal, or one of them 1 (stretched), or missing.
  const int64_t n = std::max<int64_t>(a.size(), b.size());
  std::vector<int64_t> out(n);
  for (int64_t i = 1; i <= n; ++i) {
    const int64_t da = i <= static_cast<int64_t>(a.size()) ? a[a.size() - i] : 1;
    const int64_t db = i <= static_cast<int64_t>(b.size()) ? b[b.size() - i] : 1;
    TORCH_CHECK_VALUE(da == db || da == 1 || db == 1, op, ": shapes ", a, " (", na, ") and ", b, " (", nb,
                      ") are not broadcastable: dim ", -i, " (counted from the right) has sizes ", da,
                      " and ", db, "; each pair of aligned dims must be equal or one of them 1");
    out[n - i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<int64_t> expanded_strides(const at::Tensor& t, at::IntArrayRef shape) {
  const int64_t n = shape.size(), k = t.dim();
  std::vector<int64_t> st(n, 0);
  for (int64_t i = 0; i < k; ++i) {
    const int64_t d = n - k + i;
    st[d] = t.size(i) == 1 ? 0 : t.stride(i);
  }
  return st;
}

// How many distinct threads at::parallel_for used for `n` items of grain 1 (the tests check that the
// extension really runs on torch's intra-op pool, and that torch.set_num_threads governs it).
int64_t threads_used(int64_t n) {
  std::atomic<uint64_t> mask{0};
  at::parallel_for(0, n, 1, [&](int64_t, int64_t) { mask |= uint64_t(1) << (at::get_thread_num() % 64); });
  return __builtin_popcountll(mask.load());
}

// Which clone the ifunc resolvers picked on this CPU (same test GCC's resolver makes).
std::string isa() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4 (AVX-512)";
  if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3 (AVX2)";
  return "baseline";
#else
  return "baseline";
#endif
}

}  // namespace opscope

TORCH_LIBRARY_FRAGMENT(opscope_cpu, m) {
  m.def("threads_used(int n) -> int", &opscope::threads_used);
  m.def("isa() -> str", &opscope::isa);
}
