// Shared helpers for the CPU kernels (one extension, see reference_kernels/_build.py).
//
// Vectorization: hot loops are plain pointer loops that GCC auto-vectorizes at -O3. Each hot function
// is marked OPSCOPE_CLONES, so GCC emits an x86-64-v4 (AVX-512), an x86-64-v3 (AVX2+FMA) and a baseline
// copy plus a resolver that picks one when the library is loaded: one build serves every x86-64 CPU.
// Helpers called from a cloned function are always_inline so they are compiled for the clone's ISA.
// Reductions keep LANES independent accumulators (a fixed, documented summation order that vectorizes
// without -ffast-math); NaN/Inf semantics are IEEE (no fast-math).
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OPSCOPE_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "arch=x86-64-v2", "default")))
#else
#define OPSCOPE_CLONES
#endif
#define OPSCOPE_INLINE inline __attribute__((always_inline))

namespace opscope {

constexpr int64_t LANES = 16;  // independent accumulators per reduction (one AVX-512 float vector)

// float for float/bfloat16/half, double for double.
template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };
template <typename T> using acc_t = typename Acc<T>::type;

// ---- entry checks (trap 1: device and dtype checked before any pointer is touched) ----------------

inline void check_floating(const at::Tensor& t, const char* op, const char* name) {
  auto s = t.scalar_type();
  TORCH_CHECK(s == at::kFloat || s == at::kDouble || s == at::kBFloat16 || s == at::kHalf, op, ": ", name,
              " must be float32, float64, bfloat16 or float16, got ", s);
}

inline void check_cpu(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " is on ", t.device(),
              "; this is the CPU kernel (all tensors must be on the CPU)");
}

inline void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op, const char* na,
                             const char* nb) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": ", na, " and ", nb,
              " must have the same dtype, got ", a.scalar_type(), " and ", b.scalar_type(),
              " (convert one explicitly)");
}

inline void check_same_shape(const at::Tensor& a, const at::Tensor& b, const char* op, const char* na,
                             const char* nb) {
  TORCH_CHECK_VALUE(a.sizes() == b.sizes(), op, ": ", na, " and ", nb, " must have the same shape, got ",
              a.sizes(), " and ", b.sizes());
}

// A parameter (weight, bias, mask) of another floating dtype than the activation is converted
// explicitly to the accumulation dtype once, here, not silently per element (trap 1, mixed precision).
// The caller keeps the returned tensor in a named local for the whole kernel (trap 2).
inline at::Tensor as_acc_contiguous(const at::Tensor& t, at::ScalarType activation) {
  auto acc = activation == at::kDouble ? at::kDouble : at::kFloat;
  return t.to(acc).contiguous();
}

inline int64_t grain_or(int64_t grain, int64_t fallback) { return grain > 0 ? grain : fallback; }

// ---- math that vectorizes: exp (Cephes expf, ~1 ulp), erfc (Numerical Recipes erfcc, rel. err. < 1.2e-7)

OPSCOPE_INLINE float vexp(float x) {
  const float hi = 88.3762626647949f, lo = -87.3365447504019f;
  float xc = std::min(std::max(x, lo), hi);
  float fx = std::floor(xc * 1.44269504088896341f + 0.5f);
  float r = xc - fx * 0.693359375f + fx * 2.12194440e-4f;
  float z = r * r;
  float y = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r +
             1.6666665459e-1f) * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  int32_t n = static_cast<int32_t>(fx);
  int32_t bits = (n + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof(scale));
  y = y * scale;
  y = x < lo ? 0.0f : y;
  y = x > hi ? std::numeric_limits<float>::infinity() : y;
  return x != x ? x : y;  // NaN in, NaN out
}
OPSCOPE_INLINE double vexp(double x) { return std::exp(x); }

// erfc(x) for x >= 0.
OPSCOPE_INLINE float erfc_pos(float z) {
  float t = 1.0f / (1.0f + 0.5f * z);
  float p = -0.82215223f + t * 0.17087277f;
  p = 1.48851587f + t * p;
  p = -1.13520398f + t * p;
  p = 0.27886807f + t * p;
  p = -0.18628806f + t * p;
  p = 0.09678418f + t * p;
  p = 0.37409196f + t * p;
  p = 1.00002368f + t * p;
  return t * vexp(-z * z - 1.26551223f + t * p);
}

// Standard normal CDF Phi(x) = erfc(-x / sqrt 2) / 2, accurate to ~1e-7 relative in both tails.
OPSCOPE_INLINE float normal_cdf(float x) {
  float e = 0.5f * erfc_pos(std::fabs(x) * 0.70710678118654752f);
  return x < 0.0f ? e : 1.0f - e;
}
OPSCOPE_INLINE double normal_cdf(double x) { return 0.5 * std::erfc(-x * 0.70710678118654752440); }

template <typename A> OPSCOPE_INLINE A sigmoid(A x) { return A(1) / (A(1) + vexp(-x)); }

// ---- broadcasting: shapes and strides (shared by broadcast_add and softmax's mask) ------------------

inline std::vector<int64_t> broadcast_shape(at::IntArrayRef a, at::IntArrayRef b, const char* op, const char* na,
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

// Strides (in elements) of `t` seen as broadcast to `shape`: 0 along stretched or missing dims.
inline std::vector<int64_t> expanded_strides(const at::Tensor& t, at::IntArrayRef shape) {
  const int64_t n = shape.size(), k = t.dim();
  std::vector<int64_t> st(n, 0);
  for (int64_t i = 0; i < k; ++i) st[n - k + i] = t.size(i) == 1 ? 0 : t.stride(i);
  return st;
}

}  // namespace opscope

namespace opscope {

// ---- row helpers (inlined into the cloned callers) ---------------------------------------------------

// sum_j f(j) over [0, n) with LANES accumulators: lane l takes j = l, l + LANES, ...; lanes are then
// added in order 0..LANES-1 and the tail last. Fixed order: the same result on any thread count.
template <typename A, typename F>
OPSCOPE_INLINE A lane_sum(int64_t n, const F& f) {
  A acc[LANES] = {};
  const int64_t full = n - n % LANES;
  for (int64_t i = 0; i < full; i += LANES)
    for (int64_t l = 0; l < LANES; ++l) acc[l] += f(i + l);
  A s = 0;
  for (int64_t l = 0; l < LANES; ++l) s += acc[l];
  for (int64_t i = full; i < n; ++i) s += f(i);
  return s;
}

// Column sums of per-row contributions without races and independent of the thread count: rows are
// cut into fixed chunks of ROW_CHUNK; each chunk accumulates into its own partial vectors (one thread
// owns a chunk), then partials are added in chunk order. `row(r, partials)` adds row r's contributions
// into partials[s * n + j] for each of the `nsums` sums.
constexpr int64_t ROW_CHUNK = 32;

template <typename A, typename RowFn>
void chunked_column_sums(int64_t rows, int64_t n, int64_t nsums, int64_t grain_rows, std::vector<A*> outs,
                         const RowFn& row) {
  const int64_t chunks = (rows + ROW_CHUNK - 1) / ROW_CHUNK;
  std::vector<A> partial(static_cast<size_t>(std::max<int64_t>(chunks, 1) * nsums * n), A(0));
  const int64_t grain_chunks = std::max<int64_t>(1, grain_rows / ROW_CHUNK);
  at::parallel_for(0, chunks, grain_chunks, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      A* p = partial.data() + c * nsums * n;
      for (int64_t r = c * ROW_CHUNK; r < std::min(rows, (c + 1) * ROW_CHUNK); ++r) row(r, p);
    }
  });
  at::parallel_for(0, n, 2048, [&](int64_t j0, int64_t j1) {
    for (int64_t s = 0; s < nsums; ++s) {
      A* out = outs[s];
      for (int64_t j = j0; j < j1; ++j) out[j] = A(0);
      for (int64_t c = 0; c < chunks; ++c) {
        const A* p = partial.data() + (c * nsums + s) * n;
        for (int64_t j = j0; j < j1; ++j) out[j] += p[j];
      }
    }
  });
}

// Rows of a [rows, n] view for at::parallel_for: about `target` elements per task.
inline int64_t row_grain(int64_t grain, int64_t n, int64_t target = 32768) {
  return grain > 0 ? grain : std::max<int64_t>(1, target / std::max<int64_t>(n, 1));
}

}  // namespace opscope
