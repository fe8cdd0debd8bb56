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
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>  // SSE's non-temporal store (_mm_stream_ps), part of baseline x86-64
#define OPSCOPE_STREAM 1
#else
#define OPSCOPE_STREAM 0
#endif

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

// ---- math that vectorizes: exp (degree-5 minimax, <= 3 ulp), erfc (relative error < 1e-6) --------------

// exp(x) = 2^n * p(r), n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts), p a degree-5 minimax
// polynomial (relative error 7.6e-8 on |r| <= ln2 / 2; measured max 3 ulp over the float range). The
// rounding is the add-and-subtract of 1.5 * 2^23, whose low bits are n: no floor, no int conversion.
// aten's CPU softmax uses an exp of this budget (Vectorized::exp_u20, degree 5, <= 20 ulp).
// Below -87.34 (e^x under the smallest normal float) it returns 0, above 88.38 (where 2^n would need
// n = 128) +inf, as Cephes' expf; NaN stays NaN.
template <bool CheckHigh = true>
OPSCOPE_INLINE float vexp(float x) {
  const float hi = 88.3762626647949f, lo = -87.3365447504019f;
  float xc = x < lo ? lo : x;  // NaN passes through both clamps (comparisons with NaN are false)
  if constexpr (CheckHigh) xc = xc > hi ? hi : xc;
  const float magic = 12582912.0f;  // 1.5 * 2^23
  const float t = xc * 1.44269504088896341f + magic;
  const float fx = t - magic;
  const float r = (xc - fx * 0.693359375f) + fx * 2.12194440e-4f;
  float p = 8.2974083e-3f * r + 4.1916807e-2f;
  p = p * r + 1.6667586e-1f;
  p = p * r + 4.9998882e-1f;
  p = p * r + 9.9999969e-1f;
  p = p * r + 1.0000001f;
  int32_t bits;
  __builtin_memcpy(&bits, &t, sizeof(bits));
  bits = static_cast<int32_t>(static_cast<uint32_t>(bits) << 23) + (127 << 23);  // 2^n (n in t's low bits)
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof(scale));
  float y = p * scale;
  y = x < lo ? 0.0f : y;
  if constexpr (CheckHigh) y = x > hi ? std::numeric_limits<float>::infinity() : y;
  return y;
}
// exp(x) for x <= 88.37 only (softmax's z - max <= 0, erfc's exponent): no overflow check.
OPSCOPE_INLINE float vexp_low(float x) { return vexp<false>(x); }
OPSCOPE_INLINE double vexp_low(double x) { return std::exp(x); }
OPSCOPE_INLINE double vexp(double x) { return std::exp(x); }

// The normal tail Phi(-|x|) = erfc(|x| / sqrt 2) / 2 as t * exp(P(t) - x^2 / 2), t = 1 / (1 + 0.4 |x| / sqrt 2):
// the form of Numerical Recipes' erfcc, with P a degree-6 polynomial fitted (minimax, relative) to
// log(erfc(z) / t) + z^2 on z in [0, 9.5] (2.3e-6; the 1/2 folded into its constant term as - ln 2).
// x^2 / 2 is rounded once (not through z = |x| / sqrt 2 and z * z): in the far tail the exponent's
// rounding is the largest error. Relative error < 1e-5 down to Phi = 1e-30 (|x| = 11.4).
OPSCOPE_INLINE float normal_tail(float x) {
  const float t = 1.0f / (1.0f + std::fabs(x) * 0.28284271247461901f);
  float p = 2.325590914e-01f * t - 7.262138947e-01f;
  p = p * t + 5.685364159e-01f;
  p = p * t - 4.915812085e-02f;
  p = p * t + 4.675265860e-01f;
  p = p * t + 9.952588234e-01f;
  p = p * t - 2.181653803f;  // -1.488506622 - ln 2
  return t * vexp_low(p - 0.5f * (x * x));  // the exponent is <= 0
}

// Standard normal CDF Phi(x), accurate to ~1e-5 relative in both tails.
OPSCOPE_INLINE float normal_cdf(float x) {
  const float e = normal_tail(x);
  return x < 0.0f ? e : 1.0f - e;
}
OPSCOPE_INLINE double normal_cdf(double x) { return 0.5 * std::erfc(-x * 0.70710678118654752440); }
OPSCOPE_INLINE double normal_tail(double x) { return 0.5 * std::erfc(std::fabs(x) * 0.70710678118654752440); }

template <typename A> OPSCOPE_INLINE A sigmoid(A x) { return A(1) / (A(1) + vexp(-x)); }

// ---- streaming (non-temporal) stores ---------------------------------------------------------------
// An output much larger than the caches is written with non-temporal stores (SSE's movntps, baseline
// x86-64): the lines go to memory without first being read into the cache (a normal store reads each
// line before writing it: 4 streams of traffic for a + b instead of 3). Only float32 outputs, only on
// x86-64, only from STREAM_MIN_BYTES: a smaller output is likely read again soon, from the cache.
// A task that streamed calls stream_fence() before it ends (non-temporal stores are weakly ordered).
constexpr int64_t STREAM_MIN_BYTES = int64_t(16) << 20;  // 16 MiB: above a core's L2 and a CCX's L3 share
constexpr int64_t STREAM_BLOCK = 32;                     // elements computed into registers per store group

template <typename T> inline bool streams(int64_t numel) {
  return OPSCOPE_STREAM && std::is_same_v<T, float> && numel * int64_t(sizeof(T)) >= STREAM_MIN_BYTES;
}

inline void stream_fence() {
#if OPSCOPE_STREAM
  _mm_sfence();
#endif
}

// o[i] = T(f(i)) for i in [0, n); with non-temporal stores when `stream` (float only): the aligned middle
// in blocks of STREAM_BLOCK values computed first (the compiler keeps them in vector registers).
template <typename T, typename F>
OPSCOPE_INLINE void write_run(T* o, int64_t n, bool stream, const F& f) {
  int64_t i = 0;
#if OPSCOPE_STREAM
  if constexpr (std::is_same_v<T, float>) {
    if (stream) {
      for (; i < n && (reinterpret_cast<uintptr_t>(o + i) & 63) != 0; ++i) o[i] = f(i);
      for (; i + STREAM_BLOCK <= n; i += STREAM_BLOCK) {
        alignas(64) float blk[STREAM_BLOCK];
        for (int64_t l = 0; l < STREAM_BLOCK; ++l) blk[l] = f(i + l);
        for (int64_t l = 0; l < STREAM_BLOCK; l += 4) _mm_stream_ps(o + i + l, _mm_load_ps(blk + l));
      }
    }
  }
#endif
  for (; i < n; ++i) o[i] = T(f(i));
}

// Software prefetch of [p, p + n) into the cache, one hint per 64-byte line: a row kernel that reads a
// row in a reduction pass and then computes on it prefetches the next row during the compute, chunk by
// chunk (PREFETCH_CHUNK elements of the row per chunk of its own work), so the two overlap.
constexpr int64_t PREFETCH_CHUNK = 256;
template <typename T>
OPSCOPE_INLINE void prefetch_range(const T* p, int64_t n) {
  constexpr int64_t step = 64 / sizeof(T) > 0 ? 64 / sizeof(T) : 1;
  for (int64_t j = 0; j < n; j += step) __builtin_prefetch(p + j, 0, 3);
}

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

// max over v[0, n) (NaN ignored, as the comparisons skip it): LANES running maxima kept in one GCC vector
// (vector_size: each clone compiles it to its own ISA's registers, two ymm or four xmm where there is no
// zmm); the lane-array form of lane_sum does not vectorize for max.
template <typename A>
OPSCOPE_INLINE A lane_max(const A* v, int64_t n) {
  constexpr int64_t W = 64 / sizeof(A);
  typedef A V __attribute__((vector_size(64)));
  V mx;
  for (int64_t l = 0; l < W; ++l) mx[l] = -std::numeric_limits<A>::infinity();
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    V x;
    __builtin_memcpy(&x, v + i, sizeof(V));
    mx = x > mx ? x : mx;
  }
  A m = -std::numeric_limits<A>::infinity();
  for (int64_t l = 0; l < W; ++l) m = mx[l] > m ? mx[l] : m;
  for (; i < n; ++i) m = v[i] > m ? v[i] : m;
  return m;
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
