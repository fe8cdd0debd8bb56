#pragma once
// sum / mean over one dim (shared by sum/cpu.cpp and mean/cpu.cpp), the strategy chosen by the
// tensor's shape and layout:
//   view the input as [K1, K0] kept positions x R reduced elements (kept dims merged where memory
//   allows; otherwise one contiguous copy, reported as "copy+...");
//   - "rows"    (inner-contiguous: the reduced dim has stride 1): each output is a contiguous row sum
//               (LANES accumulators); threads split the outputs;
//   - "columns" (strided-outer: the innermost kept dim has stride 1): a block of CB adjacent outputs is
//               accumulated together while R rows stream by, so every load is a contiguous vector;
//   - "-split"  when there are few outputs and R is long (fixed thresholds below): R is cut into fixed
//               chunks, each chunk's partial sums kept apart, then added in chunk order (columns-split:
//               a chunk's task sums all its columns, reading its rows whole and in order).
// Every threshold is a constant, never the thread count, so results are bitwise identical for any
// number of threads. Accumulation in float (double for float64); mean = sum * (1 / R).
#include "common.h"

namespace opscope::reduce {

constexpr int64_t CB = 256;                 // columns per block
constexpr int64_t ROW_SPLIT_MIN_R = 32768;  // rows strategy: split R when this long ...
constexpr int64_t ROW_SPLIT_MAX_K = 16;     // ... and there are at most this many outputs
constexpr int64_t ROW_CHUNK_R = 8192;
constexpr int64_t COL_SPLIT_MIN_R = 2048;   // columns strategy: split R when this long ...
constexpr int64_t COL_SPLIT_MAX_K = 4096;   // ... and there are at most this many outputs
constexpr int64_t COL_CHUNK_R = 256;

struct Plan {
  std::string strategy;
  int64_t K1 = 1, K0 = 1, R = 1, s1 = 0, s0 = 0, sr = 1;
  at::Tensor src;  // the tensor the strides refer to (a contiguous copy when one was needed)
};

inline bool try_plan(const at::Tensor& x, int64_t dim, Plan& p) {
  std::vector<std::pair<int64_t, int64_t>> kept;  // (size, stride), outermost first, merged
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d == dim || x.size(d) == 1) continue;
    if (!kept.empty() && kept.back().second == x.stride(d) * x.size(d)) {
      kept.back() = {kept.back().first * x.size(d), x.stride(d)};
    } else {
      kept.emplace_back(x.size(d), x.stride(d));
    }
  }
  if (kept.size() > 2) return false;
  while (kept.size() < 2) kept.insert(kept.begin(), {1, 0});
  p.K1 = kept[0].first; p.s1 = kept[0].second;
  p.K0 = kept[1].first; p.s0 = kept[1].second;
  p.R = x.dim() ? x.size(dim) : 1;
  p.sr = x.dim() ? x.stride(dim) : 1;
  const int64_t K = p.K1 * p.K0;
  if (p.sr == 1 || p.R == 1) {
    p.strategy = (p.R >= ROW_SPLIT_MIN_R && K <= ROW_SPLIT_MAX_K) ? "rows-split" : "rows";
    p.sr = 1;
  } else if (p.s0 == 1 || p.K0 == 1) {
    if (p.K0 == 1) { p.K0 = p.K1; p.s0 = p.s1; p.K1 = 1; p.s1 = 0; }  // one kept dim: make it the inner one
    if (p.s0 != 1 && p.K0 > 1) return false;
    p.strategy = (p.R >= COL_SPLIT_MIN_R && K <= COL_SPLIT_MAX_K) ? "columns-split" : "columns";
  } else {
    return false;
  }
  p.src = x;
  return true;
}

inline Plan plan_for(const at::Tensor& x, int64_t dim) {
  Plan p;
  if (try_plan(x, dim, p)) return p;
  const bool ok = try_plan(x.contiguous(), dim, p);  // a contiguous tensor always fits rows or columns
  TORCH_INTERNAL_ASSERT(ok);
  p.strategy = "copy+" + p.strategy;
  return p;
}

template <typename T>
OPSCOPE_CLONES void row_sums(const T* base, int64_t k0, int64_t k1, const Plan* p, acc_t<T>* out, int64_t r0,
                             int64_t r1) {
  using A = acc_t<T>;
  for (int64_t k = k0; k < k1; ++k) {
    const T* row = base + (k / p->K0) * p->s1 + (k % p->K0) * p->s0 + r0;
    out[k] = lane_sum<A>(r1 - r0, [&](int64_t j) { return A(row[j]); });
  }
}

// acc[0..cb) = sums over r in [r0, r1) of x[k1, c0 + j, r]. Four rows per pass over acc, added one after
// the other (the same sums, bit for bit, as a row at a time): acc goes through L1 once per four rows, not
// once per row, and four streams are in flight. acc never aliases x (the caller's own buffer).
template <typename T>
OPSCOPE_CLONES void column_block(const T* base, const Plan* p, int64_t k1, int64_t c0, int64_t cb, int64_t r0,
                                 int64_t r1, acc_t<T>* __restrict__ acc) {
  using A = acc_t<T>;
  for (int64_t j = 0; j < cb; ++j) acc[j] = A(0);
  const T* first = base + k1 * p->s1 + c0;
  const int64_t sr = p->sr;
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const T* __restrict__ a = first + r * sr;
    const T* __restrict__ b = a + sr;
    const T* __restrict__ c = b + sr;
    const T* __restrict__ d = c + sr;
    for (int64_t j = 0; j < cb; ++j) acc[j] = (((acc[j] + A(a[j])) + A(b[j])) + A(c[j])) + A(d[j]);
  }
  for (; r < r1; ++r) {
    const T* __restrict__ row = first + r * sr;
    for (int64_t j = 0; j < cb; ++j) acc[j] += A(row[j]);
  }
}

inline at::Tensor reduce(const at::Tensor& x, int64_t dim, bool keepdim, bool mean, int64_t grain, const char* op) {
  check_cpu(x, op, "x");
  check_floating(x, op, "x");
  const int64_t nd = std::max<int64_t>(x.dim(), 1);
  TORCH_CHECK_INDEX(dim >= -nd && dim < nd, op, ": dim ", dim, " is out of range for a tensor of ", x.dim(),
                    " dims");
  if (dim < 0) dim += nd;
  std::vector<int64_t> out_shape;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d != dim) out_shape.push_back(x.size(d));
    else if (keepdim) out_shape.push_back(1);
  }
  at::Tensor out = at::empty(out_shape, x.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  const Plan p = plan_for(x, dim);
  const int64_t K = p.K1 * p.K0, R = p.R;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "reduce", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* base = p.src.const_data_ptr<scalar_t>();
    std::vector<A> acc(K, A(0));
    const std::string& s = p.strategy;
    const bool split = s.size() > 6 && s.compare(s.size() - 6, 6, "-split") == 0;
    if (s.find("rows") != std::string::npos) {
      if (!split) {
        at::parallel_for(0, K, grain_or(grain, std::max<int64_t>(1, 32768 / std::max<int64_t>(R, 1))),
                         [&](int64_t k0, int64_t k1) { row_sums<scalar_t>(base, k0, k1, &p, acc.data(), 0, R); });
      } else {
        const int64_t chunks = (R + ROW_CHUNK_R - 1) / ROW_CHUNK_R;
        std::vector<A> part(K * chunks);
        at::parallel_for(0, K * chunks, grain_or(grain, 1), [&](int64_t i0, int64_t i1) {
          std::vector<A> one(K);
          for (int64_t i = i0; i < i1; ++i) {
            const int64_t k = i / chunks, c = i % chunks;
            row_sums<scalar_t>(base, k, k + 1, &p, one.data(), c * ROW_CHUNK_R, std::min(R, (c + 1) * ROW_CHUNK_R));
            part[i] = one[k];
          }
        });
        for (int64_t k = 0; k < K; ++k)
          for (int64_t c = 0; c < chunks; ++c) acc[k] += part[k * chunks + c];
      }
    } else {
      // split: one task per (k1, chunk of rows) over all K0 (<= COL_SPLIT_MAX_K) columns at once, so each
      // task reads whole rows, one after the other (memory in order: the prefetchers keep up); the sums
      // are the same (per column: rows in order within a chunk, chunks in order)
      const int64_t cbw = split ? std::max<int64_t>(p.K0, 1) : CB;
      const int64_t blocks = (p.K0 + cbw - 1) / cbw;
      const int64_t chunks = split ? (R + COL_CHUNK_R - 1) / COL_CHUNK_R : 1;
      const int64_t chunk_r = split ? COL_CHUNK_R : R;
      std::vector<A> part(split ? K * chunks : 0);
      const int64_t tasks = p.K1 * blocks * chunks;
      // grain counts outputs per task (as for rows; the tuning cache keys a shape class, not a strategy):
      // a task here covers cbw outputs
      const int64_t grain_tasks = grain > 0 ? std::max<int64_t>(1, grain / cbw) : 1;
      at::parallel_for(0, tasks, grain_tasks, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t c = t % chunks, blk = (t / chunks) % blocks, k1 = t / (chunks * blocks);
          const int64_t c0 = blk * cbw, cb = std::min(cbw, p.K0 - c0);
          A* dst = split ? part.data() + c * K + k1 * p.K0 + c0 : acc.data() + k1 * p.K0 + c0;
          column_block<scalar_t>(base, &p, k1, c0, cb, c * chunk_r, std::min(R, (c + 1) * chunk_r), dst);
        }
      });
      if (split)
        for (int64_t c = 0; c < chunks; ++c)
          for (int64_t k = 0; k < K; ++k) acc[k] += part[c * K + k];
    }
    const A scale = mean ? A(1) / A(R) : A(1);
    scalar_t* po = out.mutable_data_ptr<scalar_t>();
    for (int64_t k = 0; k < K; ++k) po[k] = scalar_t(acc[k] * scale);
  });
  return out;
}

inline std::string strategy(const at::Tensor& x, int64_t dim) {
  const int64_t nd = std::max<int64_t>(x.dim(), 1);
  TORCH_CHECK_INDEX(dim >= -nd && dim < nd, "opscope::sum: dim ", dim, " out of range");
  return plan_for(x, dim < 0 ? dim + nd : dim).strategy;
}

}  // namespace opscope::reduce
