// Shared by the CPU kernels: SIMD exp and log on float vectors, the
// semiring's ⊗ with its zero absorbing, per-thread scratch space, and a loop
// over batch entries that uses XLA's intra-op thread pool.

#ifndef SEMIRING_JAX_KERNELS_COMMON_H_
#define SEMIRING_JAX_KERNELS_COMMON_H_

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

inline ffi::Error FailIn(const char* kernel, const std::string& what) {
  return ffi::Error::InvalidArgument(std::string("semiring_jax ") + kernel + ": " + what);
}

template <typename T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

template <typename T>
constexpr T kPosInf = std::numeric_limits<T>::infinity();

template <typename T>
constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();

// a ⊗ b of LOG and TROPICAL, for inputs that hold no NaN (callers check
// for NaN apart, so that NaN in gives NaN out): a + b, but -inf (the zero)
// absorbs +inf instead of making NaN.
inline double Times(double a, double b) {
  return (a == kNegInf<double> || b == kNegInf<double>) ? kNegInf<double> : a + b;
}

// exp(x) for float without a libm call: Cephes' expf polynomial (relative
// error below 2e-7, about libm's) after x = n ln 2 + r, written on GCC/Clang
// vector types so that it is SIMD on any target. Exactly 0 below -86
// (below, results would be subnormal, which the CPU computes slowly), so
// -inf (the semiring zero) gives weight 0; NaN stays NaN.
typedef float Floats4 __attribute__((vector_size(16)));
typedef int32_t Ints4 __attribute__((vector_size(16)));
typedef float Floats8 __attribute__((vector_size(32)));
typedef int32_t Ints8 __attribute__((vector_size(32)));
typedef double Doubles4 __attribute__((vector_size(32)));

inline Floats4 Splat(float value) { return Floats4{value, value, value, value}; }

// exp on any float vector type F with the int vector type I of its size.
template <typename F, typename I>
inline F FastExpV(F x) {
  const F low = F{} - 86.0f, high = F{} + 88.0f;
  F clamped = x < low ? low : x;
  clamped = clamped > high ? high : clamped;
  const F v = clamped * 1.44269504088896341f + 0.5f;
  // floor by truncation (v > -127 here)
  const F truncated = __builtin_convertvector(__builtin_convertvector(v, I), F);
  const F n = truncated > v ? truncated - 1.0f : truncated;
  F r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const F r2 = r * r;
  F y = r * 1.9875691500e-4f + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r2 + r + 1.0f;
  const I bits = (__builtin_convertvector(n, I) + 127) << 23;
  F scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const F result = y * scale;
  return x < low ? F{} : result;  // NaN < low is false: NaN stays
}

inline Floats4 FastExp4(Floats4 x) { return FastExpV<Floats4, Ints4>(x); }
inline Floats8 FastExp8(Floats8 x) { return FastExpV<Floats8, Ints8>(x); }

inline float FastExp(float x) { return FastExp4(Splat(x))[0]; }

// exp at the precision of the input type: float SIMD for float32 inputs,
// libm for float64 ones (whose results must keep double precision).
inline float ExpOf(float x) { return FastExp(x); }
inline double ExpOf(double x) { return std::exp(x); }

// log(x) for float vectors: Cephes' logf polynomial (relative error below
// 2e-7) after x = m 2^e with m in [sqrt(1/2), sqrt(2)). For finite x > 0
// only (callers pass sums in [1, 3]); NaN stays NaN.
template <typename F, typename I>
inline F FastLogV(F x) {
  I bits;
  std::memcpy(&bits, &x, sizeof(bits));
  I exponent = ((bits >> 23) & 0xff) - 126;
  const I mantissa_bits = (bits & 0x007fffff) | 0x3f000000;  // m in [0.5, 1)
  F m;
  std::memcpy(&m, &mantissa_bits, sizeof(m));
  const auto small = m < 0.70710678118654752440f;
  exponent = small ? exponent - 1 : exponent;
  m = small ? m + m - 1.0f : m - 1.0f;
  const F e = __builtin_convertvector(exponent, F);
  const F z = m * m;
  F y = m * 7.0376836292e-2f - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y = y + e * -2.12194440e-4f;
  y = y - z * 0.5f;
  return m + y + e * 0.693359375f;
}

inline Floats8 FastLog8(Floats8 x) { return FastLogV<Floats8, Ints8>(x); }

// -- scratch space ------------------------------------------------------------

// Per-thread scratch, carved into typed arrays. Up to kKeepBytes it is kept
// between calls (allocating per call costs more than a small recursion);
// a larger request gets memory of its own, freed with the Workspace, so a
// thread never holds more than that after one huge input. A Workspace made
// while another lives on the same thread gets memory of its own too, so the
// two never share (or reallocate under each other) the kept buffer.
class Workspace {
 public:
  static constexpr size_t kKeepBytes = size_t(32) << 20;

  explicit Workspace(size_t bytes) {
    const size_t words = bytes / sizeof(Word) + 1;
    if (bytes <= kKeepBytes && !KeptInUse()) {
      thread_local std::vector<Word> kept;
      if (kept.size() < words) kept.resize(words);
      base_ = kept.data();
      KeptInUse() = holds_kept_ = true;
    } else {
      own_.resize(words);
      base_ = own_.data();
    }
  }

  ~Workspace() {
    if (holds_kept_) KeptInUse() = false;
  }

  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // `count` entries of U, aligned for any type; callers size the Workspace
  // with Bytes<U>(count) for each array they take.
  template <typename U>
  U* Take(int64_t count) {
    U* out = reinterpret_cast<U*>(base_ + used_);
    used_ += Bytes<U>(count) / sizeof(Word);
    return out;
  }

  template <typename U>
  static size_t Bytes(int64_t count) {
    const size_t raw = sizeof(U) * static_cast<size_t>(std::max<int64_t>(count, 0));
    return (raw + sizeof(Word) - 1) / sizeof(Word) * sizeof(Word);
  }

 private:
  typedef std::max_align_t Word;

  static bool& KeptInUse() {
    thread_local bool in_use = false;
    return in_use;
  }

  std::vector<Word> own_;
  Word* base_ = nullptr;
  size_t used_ = 0;
  bool holds_kept_ = false;
};

// -- batches over threads -----------------------------------------------------

// Batches smaller than this many arcs run on the calling thread: waking a
// pool thread costs more than it saves.
constexpr int64_t kParallelArcs = 16384;

// Runs body(i) for i < n on the calling thread and XLA's intra-op pool.
// Entries are claimed one at a time, so a pool thread that wakes late takes
// fewer of them. The caller waits only for entries already claimed: a task
// that starts after every entry is taken finds nothing to do and touches
// only the shared counters (kept alive by its shared_ptr), never `body`.
template <typename Body>
void ForEntries(ffi::ThreadPool& pool, int64_t n, int64_t arcs_per_entry, const Body& body) {
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), n - 1);
  if (helpers <= 0 || n * arcs_per_entry < kParallelArcs) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  struct Counters {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> busy{0};
  };
  auto counters = std::make_shared<Counters>();
  auto work = [counters, n, &body]() {
    counters->busy.fetch_add(1);
    for (int64_t i = counters->next.fetch_add(1); i < n; i = counters->next.fetch_add(1)) {
      body(i);
    }
    counters->busy.fetch_sub(1);
  };
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule(decltype(work)(work));  // a copy each
  work();
  while (counters->busy.load() > 0) std::this_thread::yield();
}

// The element count of all but the last `trailing` dimensions (the batch).
template <typename Dims>
int64_t LeadingCount(const Dims& dims, size_t trailing) {
  int64_t count = 1;
  for (size_t i = 0; i + trailing < dims.size(); ++i) count *= dims[i];
  return count;
}

}  // namespace

#endif  // SEMIRING_JAX_KERNELS_COMMON_H_
