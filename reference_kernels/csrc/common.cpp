// Out-of-line helpers declared in common.h, plus introspection ops the tests use.
#include "common.h"

#include <atomic>

namespace opscope {

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
  if (__builtin_cpu_supports("x86-64-v2")) return "x86-64-v2 (SSE4.2)";
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
