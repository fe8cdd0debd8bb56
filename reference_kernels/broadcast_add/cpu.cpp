// broadcast_add: out = a + b for any two broadcastable shapes, with a TensorIterator-like loop:
//   1. the output shape by the right-aligned rule (size-1 and missing dims stretched);
//   2. each input's strides seen in the output shape (0 along stretched dims), no copies, so
//      non-contiguous inputs are read in place;
//   3. adjacent dims merged where every operand is contiguous across them ("coalescing"), so the
//      innermost loop is as long as possible;
//   4. the flat output range split across threads (grain = elements per task); each task walks its
//      range as runs of the innermost dim, with the run specialized for stride patterns
//      (both unit: vector add; one 0: vector + scalar; else strided); a float32 output of 16 MiB or more
//      is written with non-temporal stores (common.h: write_run).
#include "../csrc/common.h"

namespace opscope::broadcast_add {

template <typename T>
OPSCOPE_CLONES void add_run(const T* a, int64_t sa, const T* b, int64_t sb, T* o, int64_t n, bool stream) {
  using A = acc_t<T>;
  if (sa == 1 && sb == 1) {
    write_run(o, n, stream, [&](int64_t i) { return A(a[i]) + A(b[i]); });
  } else if (sa == 1 && sb == 0) {
    const A bv = A(b[0]);
    write_run(o, n, stream, [&](int64_t i) { return A(a[i]) + bv; });
  } else if (sa == 0 && sb == 1) {
    const A av = A(a[0]);
    write_run(o, n, stream, [&](int64_t i) { return av + A(b[i]); });
  } else {
    write_run(o, n, stream, [&](int64_t i) { return A(a[i * sa]) + A(b[i * sb]); });
  }
}

struct Plan {
  std::vector<int64_t> sizes, sa, sb;  // coalesced, innermost last; output is contiguous
};

// Merge dim d-1 into d while all operands step over both as one dim.
Plan coalesce(std::vector<int64_t> sizes, std::vector<int64_t> sa, std::vector<int64_t> sb) {
  Plan p;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 1) continue;  // size-1 dims carry no stride information
    if (!p.sizes.empty()) {
      const int64_t n = sizes[i];
      if (p.sa.back() == sa[i] * n && p.sb.back() == sb[i] * n) {
        p.sizes.back() *= n;
        p.sa.back() = sa[i];
        p.sb.back() = sb[i];
        continue;
      }
    }
    p.sizes.push_back(sizes[i]);
    p.sa.push_back(sa[i]);
    p.sb.push_back(sb[i]);
  }
  if (p.sizes.empty()) p = Plan{{1}, {0}, {0}};
  return p;
}

at::Tensor forward(const at::Tensor& a, const at::Tensor& b, int64_t grain) {
  const char* op = "opscope::broadcast_add";
  check_cpu(a, op, "a");
  check_cpu(b, op, "b");
  check_floating(a, op, "a");
  check_same_dtype(a, b, op, "a", "b");
  auto shape = broadcast_shape(a.sizes(), b.sizes(), op, "a", "b");
  at::Tensor out = at::empty(shape, a.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t numel = out.numel();
  if (numel == 0) return out;
  Plan p = coalesce(shape, expanded_strides(a, shape), expanded_strides(b, shape));
  const int64_t nd = p.sizes.size(), inner = p.sizes.back();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a.scalar_type(), "broadcast_add", [&] {
    const scalar_t* pa = a.const_data_ptr<scalar_t>();
    const scalar_t* pb = b.const_data_ptr<scalar_t>();
    scalar_t* po = out.mutable_data_ptr<scalar_t>();
    const bool stream = streams<scalar_t>(numel);
    at::parallel_for(0, numel, grain_or(grain, 32768), [&](int64_t begin, int64_t end) {
      // Multi-index of `begin` over the outer dims, then runs of the innermost dim.
      std::vector<int64_t> idx(nd, 0);
      int64_t rest = begin;
      for (int64_t d = nd - 1; d >= 0; --d) {
        idx[d] = rest % p.sizes[d];
        rest /= p.sizes[d];
      }
      int64_t offa = 0, offb = 0;
      for (int64_t d = 0; d < nd; ++d) {
        offa += idx[d] * p.sa[d];
        offb += idx[d] * p.sb[d];
      }
      int64_t pos = begin;
      while (pos < end) {
        const int64_t n = std::min(inner - idx[nd - 1], end - pos);
        add_run<scalar_t>(pa + offa, p.sa[nd - 1], pb + offb, p.sb[nd - 1], po + pos, n, stream);
        pos += n;
        // Advance the multi-index by n (carry into outer dims).
        idx[nd - 1] += n;
        offa += n * p.sa[nd - 1];
        offb += n * p.sb[nd - 1];
        for (int64_t d = nd - 1; d > 0 && idx[d] == p.sizes[d]; --d) {
          idx[d] = 0;
          offa -= p.sizes[d] * p.sa[d];
          offb -= p.sizes[d] * p.sb[d];
          ++idx[d - 1];
          offa += p.sa[d - 1];
          offb += p.sb[d - 1];
        }
      }
      if (stream) stream_fence();
    });
  });
  return out;
}

}  // namespace opscope::broadcast_add

TORCH_LIBRARY_FRAGMENT(opscope_cpu, m) {
  m.def("broadcast_add_forward(Tensor a, Tensor b, int grain=0) -> Tensor", &opscope::broadcast_add::forward);
}
