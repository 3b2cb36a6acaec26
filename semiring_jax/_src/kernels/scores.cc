// CPU kernels for the score recursions of acyclic Fsas (XLA FFI handlers).
//
// The level-scheduled lax.scan of recursions.py runs on every backend; on
// the CPU, XLA spends most of each level step launching small kernels. Here
// one call walks the schedule's levels and pulls each state's incoming arcs
// from the schedule's pull order (`Schedule.pull_*`, built on the host), so
// every table is read front to back and the work is one pass over the arcs.
//
// Shapes (every buffer may carry leading batch dimensions, flattened to N):
//   weight    [N, A]     arc weights (f32 or f64)
//   final     [N, S]     final weights
//   pos_state [N, L, W]  int32, the state at each level position; S = none
//   pull_end  [N, L, W]  int32, where each position's arcs end in pull order
//   pull_arc  [N, A]     int32, arcs by destination position, then index
//   pull_src  [N, A]     int32, their source states
//   src       [N, A]     int32, each arc's source state (trace-back only)
// State 0 is the start; the Fsa is acyclic (checked on the host), so every
// arc goes from a lower level to a higher one.
//
// LOG:      alpha[s] = logsumexp(one(s), alpha[src a] + w[a] for a into s)
//   forward saves local[j] = exp(alpha[src] + w - m_s) for the j-th arc in
//   pull order (m_s the maximum term of its state) and norm[s] = 1 / sum,
//   so that posterior = gamma[dst] * norm[dst] * local.
//   backward: gamma[s] = exp(alpha[s] + final[s] - Z) + the posteriors of
//   the arcs leaving s. No exp or log per arc in the backward.
// TROPICAL: alpha[s] = max(one(s), alpha[src a] + w[a]); choice[s] is the
//   winning arc, -1 for the start's empty prefix or none. Ties: the empty
//   prefix, then the lowest arc index (pull order keeps arc order within a
//   state), as recursions.py documents.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

namespace {

struct Sizes {
  int64_t n = 1;           // batch entries
  int64_t num_arcs = 0;    // A
  int64_t num_states = 0;  // S
  int64_t levels = 0;      // L
  int64_t width = 0;       // W
};

ffi::Error Fail(const char* what) { return FailIn("score kernel", what); }

// Sizes from the trailing dimensions of weight [.., A], final [.., S] and
// pos_state [.., L, W]; N from final's element count.
ffi::Error GetSizes(const ffi::AnyBuffer& arcs, const ffi::AnyBuffer& final_weight,
                    const ffi::AnyBuffer* pos_state, Sizes* z) {
  auto a = arcs.dimensions();
  auto s = final_weight.dimensions();
  if (a.size() < 1 || s.size() < 1) return Fail("arrays of rank 0");
  z->num_arcs = a.back();
  z->num_states = s.back();
  if (z->num_states < 1) return Fail("no states");
  z->n = static_cast<int64_t>(final_weight.element_count()) / z->num_states;
  if (pos_state != nullptr) {
    auto p = pos_state->dimensions();
    if (p.size() < 2) return Fail("pos_state of rank < 2");
    z->levels = p[p.size() - 2];
    z->width = p.back();
  }
  return ffi::Error::Success();
}

// v[i] = exp(v[i] - shift) for i < n, four lanes at a time.
inline void ExpShifted(int64_t n, float shift, float* v) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const Floats4 e = FastExp4(Load4(v + i) - shift);
    std::memcpy(v + i, &e, sizeof(e));
  }
  for (; i < n; ++i) v[i] = FastExp(v[i] - shift);
}

inline void ExpShifted(int64_t n, double shift, double* v) {
  for (int64_t i = 0; i < n; ++i) v[i] = std::exp(v[i] - shift);
}

// out[i] = exp(a[i] + b[i] - shift) for i < n; returns the sum of out.
inline float ExpOfSum(int64_t n, const float* a, const float* b, float shift, float* out) {
  Floats4 lanes = Splat(0.0f);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const Floats4 e = FastExp4(Load4(a + i) + Load4(b + i) - shift);
    std::memcpy(out + i, &e, sizeof(e));
    lanes += e;
  }
  float sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i) {
    out[i] = FastExp(a[i] + b[i] - shift);
    sum += out[i];
  }
  return sum;
}

inline double ExpOfSum(int64_t n, const double* a, const double* b, double shift, double* out) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = std::exp(a[i] + b[i] - shift);
    sum += out[i];
  }
  return sum;
}

// Pointers to one batch entry's tables.
template <typename T>
struct Entry {
  const T* weight;
  const T* final_weight;
  const int32_t* pos_state;
  const int32_t* pull_end;
  const int32_t* pull_arc;
  const int32_t* pull_src;
};

// The first pull index of position p (positions are flattened [L * W]).
inline int64_t PullBegin(const int32_t* pull_end, int64_t p) { return p == 0 ? 0 : pull_end[p - 1]; }

inline bool IsState(int32_t s, int64_t num_states) {
  return static_cast<uint32_t>(s) < static_cast<uint64_t>(num_states);
}

// ⊕ over the states of alpha + final (LOG).
template <typename T>
T LogTotal(int64_t num_states, const T* alpha, const T* final_weight) {
  T best = kNegInf<T>;
  for (int64_t s = 0; s < num_states; ++s) best = std::max(best, alpha[s] + final_weight[s]);
  if (!(best > kNegInf<T>) || !std::isfinite(best)) return best;
  T* terms = Scratch<T>(num_states);
  return best + std::log(ExpOfSum(num_states, alpha, final_weight, best, terms));
}

// A state whose best term is this far below its level's best is shifted by
// its own maximum instead of the level's, so that its terms cannot
// underflow (exp(-60) is about 1e-26, far above float's smallest normal).
template <typename T>
constexpr T kOwnShiftBelow = T(-60);

// One entry's LOG forward pass; returns the total score. A level at a time:
// gather every incoming term alpha[src] + weight into `local` (pull order),
// exponentiate the level's terms in one long loop shifted by the level's
// maximum term, then sum per state. local stays unnormalised; norm[s] is
// 1 / sum, so that local * norm is each arc's share of its state.
template <typename T>
T LogForwardOne(const Sizes& z, const Entry<T>& e, T* alpha, T* local, T* norm) {
  const int64_t S = z.num_states, W = z.width;
  for (int64_t s = 0; s < S; ++s) {
    alpha[s] = s == 0 ? T(0) : kNegInf<T>;
    norm[s] = T(0);
  }
  T* state_best = Scratch<T>(W);
  for (int64_t level = 0; level < z.levels; ++level) {
    const int64_t first_p = level * W;
    const int64_t level_begin = PullBegin(e.pull_end, first_p);
    const int64_t level_end = e.pull_end[first_p + W - 1];
    T level_best = kNegInf<T>;
    for (int64_t p = first_p; p < first_p + W; ++p) {
      const int32_t s = e.pos_state[p];
      const int64_t begin = PullBegin(e.pull_end, p), end = e.pull_end[p];
      if (begin == end || !IsState(s, S)) continue;
      T best = alpha[s];  // the empty prefix (start) or zero
      for (int64_t j = begin; j < end; ++j) {
        const T x = alpha[e.pull_src[j]] + e.weight[e.pull_arc[j]];
        local[j] = x;
        best = std::max(best, x);
      }
      state_best[p - first_p] = best;
      level_best = std::max(level_best, best);
    }
    if (!(level_best > kNegInf<T>)) {  // nothing reaches this level
      std::fill(local + level_begin, local + level_end, T(0));
      continue;
    }
    ExpShifted(level_end - level_begin, level_best, local + level_begin);
    for (int64_t p = first_p; p < first_p + W; ++p) {
      const int32_t s = e.pos_state[p];
      const int64_t begin = PullBegin(e.pull_end, p), end = e.pull_end[p];
      if (begin == end || !IsState(s, S)) continue;
      const T best = state_best[p - first_p];
      if (!(best > kNegInf<T>)) continue;  // unreachable: alpha stays, local is 0
      T shift = level_best;
      if (best - level_best < kOwnShiftBelow<T>) {
        shift = best;
        for (int64_t j = begin; j < end; ++j) {
          local[j] = FastExp(alpha[e.pull_src[j]] + e.weight[e.pull_arc[j]] - shift);
        }
      }
      T sum = s == 0 ? FastExp(alpha[s] - shift) : T(0);  // only the start has a prefix
      for (int64_t j = begin; j < end; ++j) sum += local[j];
      norm[s] = T(1) / sum;
      alpha[s] = shift + std::log(sum);
    }
  }
  // Padding arcs belong to no state; zero their slots (the backward never
  // reads them, but an output should hold no stale memory).
  const int64_t real_end = z.levels * W > 0 ? e.pull_end[z.levels * W - 1] : 0;
  std::fill(local + real_end, local + z.num_arcs, T(0));
  return LogTotal(S, alpha, e.final_weight);
}

// One entry's LOG backward pass: d total / d weight and d total / d final.
template <typename T>
void LogBackwardOne(const Sizes& z, const Entry<T>& e, const T* alpha, const T* local,
                    const T* norm, T total, T* arc_grad, T* final_grad) {
  const int64_t S = z.num_states, P = z.levels * z.width;
  if (!(total > kNegInf<T>)) {  // no successful path: the gradient is exactly 0
    std::fill(arc_grad, arc_grad + z.num_arcs, T(0));
    std::fill(final_grad, final_grad + S, T(0));
    return;
  }
  ExpOfSum(S, alpha, e.final_weight, total, final_grad);
  T* gamma = Scratch<T>(S);  // the posterior of passing through each state
  std::copy(final_grad, final_grad + S, gamma);
  // Every arc is written once: the real ones by their state, padding here.
  const int64_t real_end = P > 0 ? e.pull_end[P - 1] : 0;
  for (int64_t j = real_end; j < z.num_arcs; ++j) arc_grad[e.pull_arc[j]] = T(0);
  for (int64_t p = P - 1; p >= 0; --p) {
    const int32_t s = e.pos_state[p];
    const int64_t begin = PullBegin(e.pull_end, p), end = e.pull_end[p];
    if (begin == end) continue;
    const T g = IsState(s, S) ? gamma[s] * norm[s] : T(0);
    for (int64_t j = begin; j < end; ++j) {
      const T posterior = g * local[j];
      arc_grad[e.pull_arc[j]] = posterior;
      gamma[e.pull_src[j]] += posterior;
    }
  }
}

// One entry's TROPICAL forward pass; returns the total score.
template <typename T>
T TropicalForwardOne(const Sizes& z, const Entry<T>& e, T* alpha, int32_t* choice) {
  const int64_t S = z.num_states;
  for (int64_t s = 0; s < S; ++s) {
    alpha[s] = s == 0 ? T(0) : kNegInf<T>;
    choice[s] = -1;
  }
  for (int64_t p = 0; p < z.levels * z.width; ++p) {
    const int32_t s = e.pos_state[p];
    const int64_t begin = PullBegin(e.pull_end, p), end = e.pull_end[p];
    if (begin == end || !IsState(s, S)) continue;
    T best = alpha[s];
    int32_t chosen = -1;
    for (int64_t j = begin; j < end; ++j) {
      const int32_t a = e.pull_arc[j];
      const T x = alpha[e.pull_src[j]] + e.weight[a];
      if (x > best) {
        best = x;
        chosen = a;
      }
    }
    alpha[s] = best;
    choice[s] = chosen;
  }
  T best = kNegInf<T>;
  for (int64_t s = 0; s < S; ++s) best = std::max(best, alpha[s] + e.final_weight[s]);
  return best;
}

// One entry's best path: the indicator of its arcs and of its final state,
// the lowest-numbered one with the best score.
template <typename T>
void TropicalBackwardOne(const Sizes& z, const T* final_weight, const int32_t* src,
                         const T* alpha, const int32_t* choice, T* arc_grad, T* final_grad) {
  const int64_t A = z.num_arcs, S = z.num_states;
  std::fill(arc_grad, arc_grad + A, T(0));
  std::fill(final_grad, final_grad + S, T(0));
  int64_t best_state = -1;
  T best = kNegInf<T>;
  for (int64_t s = 0; s < S; ++s) {
    const T x = alpha[s] + final_weight[s];
    if (x > best) {
      best = x;
      best_state = s;
    }
  }
  if (best_state < 0) return;  // no successful path: the gradient is exactly 0
  final_grad[best_state] = T(1);
  // At most S steps: a path of an acyclic Fsa visits each state once.
  int64_t s = best_state;
  for (int64_t step = 0; step < S && choice[s] >= 0 && choice[s] < A; ++step) {
    const int32_t a = choice[s];
    arc_grad[a] = T(1);
    s = src[a];
    if (!IsState(static_cast<int32_t>(s), S)) break;
  }
}

// -- FFI handlers: dtype dispatch and the loop over batch entries ------------

template <typename T>
Entry<T> EntryAt(const Sizes& z, int64_t i, const ffi::AnyBuffer& weight,
                 const ffi::AnyBuffer& final_weight, const ffi::AnyBuffer& pos_state,
                 const ffi::AnyBuffer& pull_end, const ffi::AnyBuffer& pull_arc,
                 const ffi::AnyBuffer& pull_src) {
  const int64_t positions = z.levels * z.width;
  return Entry<T>{
      weight.typed_data<T>() + i * z.num_arcs,
      final_weight.typed_data<T>() + i * z.num_states,
      pos_state.typed_data<int32_t>() + i * positions,
      pull_end.typed_data<int32_t>() + i * positions,
      pull_arc.typed_data<int32_t>() + i * z.num_arcs,
      pull_src.typed_data<int32_t>() + i * z.num_arcs,
  };
}

// Runs body.template operator()<T>() for the float type of `buffer`.
template <typename Body>
ffi::Error ForFloatType(const ffi::AnyBuffer& buffer, Body body) {
  switch (buffer.element_type()) {
    case ffi::F32:
      return body(float{});
    case ffi::F64:
      return body(double{});
    default:
      return Fail("weights must be float32 or float64");
  }
}

ffi::Error LogForward(ffi::ThreadPool pool, ffi::AnyBuffer weight, ffi::AnyBuffer final_weight,
                      ffi::AnyBuffer pos_state, ffi::AnyBuffer pull_end, ffi::AnyBuffer pull_arc,
                      ffi::AnyBuffer pull_src, ffi::Result<ffi::AnyBuffer> total,
                      ffi::Result<ffi::AnyBuffer> alpha, ffi::Result<ffi::AnyBuffer> local,
                      ffi::Result<ffi::AnyBuffer> norm) {
  Sizes z;
  if (auto error = GetSizes(weight, final_weight, &pos_state, &z); error.failure()) return error;
  return ForFloatType(weight, [&](auto zero) {
    using T = decltype(zero);
    ForEntries(pool, z.n, z.num_arcs, [&](int64_t i) {
      const Entry<T> e = EntryAt<T>(z, i, weight, final_weight, pos_state, pull_end, pull_arc,
                                    pull_src);
      total->typed_data<T>()[i] =
          LogForwardOne<T>(z, e, alpha->typed_data<T>() + i * z.num_states,
                           local->typed_data<T>() + i * z.num_arcs,
                           norm->typed_data<T>() + i * z.num_states);
    });
    return ffi::Error::Success();
  });
}

ffi::Error LogBackward(ffi::ThreadPool pool, ffi::AnyBuffer final_weight, ffi::AnyBuffer pos_state,
                       ffi::AnyBuffer pull_end, ffi::AnyBuffer pull_arc, ffi::AnyBuffer pull_src,
                       ffi::AnyBuffer alpha, ffi::AnyBuffer local, ffi::AnyBuffer norm,
                       ffi::AnyBuffer total, ffi::Result<ffi::AnyBuffer> arc_grad,
                       ffi::Result<ffi::AnyBuffer> final_grad) {
  Sizes z;
  if (auto error = GetSizes(local, final_weight, &pos_state, &z); error.failure()) return error;
  return ForFloatType(final_weight, [&](auto zero) {
    using T = decltype(zero);
    ForEntries(pool, z.n, z.num_arcs, [&](int64_t i) {
      // `local` stands in for the weights, which the backward does not read.
      const Entry<T> e =
          EntryAt<T>(z, i, local, final_weight, pos_state, pull_end, pull_arc, pull_src);
      LogBackwardOne<T>(z, e, alpha.typed_data<T>() + i * z.num_states,
                        local.typed_data<T>() + i * z.num_arcs,
                        norm.typed_data<T>() + i * z.num_states, total.typed_data<T>()[i],
                        arc_grad->typed_data<T>() + i * z.num_arcs,
                        final_grad->typed_data<T>() + i * z.num_states);
    });
    return ffi::Error::Success();
  });
}

ffi::Error TropicalForward(ffi::ThreadPool pool, ffi::AnyBuffer weight, ffi::AnyBuffer final_weight,
                           ffi::AnyBuffer pos_state, ffi::AnyBuffer pull_end,
                           ffi::AnyBuffer pull_arc, ffi::AnyBuffer pull_src,
                           ffi::Result<ffi::AnyBuffer> total, ffi::Result<ffi::AnyBuffer> alpha,
                           ffi::Result<ffi::AnyBuffer> choice) {
  Sizes z;
  if (auto error = GetSizes(weight, final_weight, &pos_state, &z); error.failure()) return error;
  return ForFloatType(weight, [&](auto zero) {
    using T = decltype(zero);
    ForEntries(pool, z.n, z.num_arcs, [&](int64_t i) {
      const Entry<T> e = EntryAt<T>(z, i, weight, final_weight, pos_state, pull_end, pull_arc,
                                    pull_src);
      total->typed_data<T>()[i] =
          TropicalForwardOne<T>(z, e, alpha->typed_data<T>() + i * z.num_states,
                                choice->typed_data<int32_t>() + i * z.num_states);
    });
    return ffi::Error::Success();
  });
}

ffi::Error TropicalBackward(ffi::ThreadPool pool, ffi::AnyBuffer final_weight, ffi::AnyBuffer src, ffi::AnyBuffer alpha,
                            ffi::AnyBuffer choice, ffi::Result<ffi::AnyBuffer> arc_grad,
                            ffi::Result<ffi::AnyBuffer> final_grad) {
  Sizes z;
  if (auto error = GetSizes(src, final_weight, nullptr, &z); error.failure()) return error;
  return ForFloatType(final_weight, [&](auto zero) {
    using T = decltype(zero);
    ForEntries(pool, z.n, z.num_states, [&](int64_t i) {
      TropicalBackwardOne<T>(z, final_weight.typed_data<T>() + i * z.num_states,
                             src.typed_data<int32_t>() + i * z.num_arcs,
                             alpha.typed_data<T>() + i * z.num_states,
                             choice.typed_data<int32_t>() + i * z.num_states,
                             arc_grad->typed_data<T>() + i * z.num_arcs,
                             final_grad->typed_data<T>() + i * z.num_states);
    });
    return ffi::Error::Success();
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SjLogForward, LogForward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // weight [N, A]
                                  .Arg<ffi::AnyBuffer>()  // final_weight [N, S]
                                  .Arg<ffi::AnyBuffer>()  // pos_state [N, L, W]
                                  .Arg<ffi::AnyBuffer>()  // pull_end [N, L, W]
                                  .Arg<ffi::AnyBuffer>()  // pull_arc [N, A]
                                  .Arg<ffi::AnyBuffer>()  // pull_src [N, A]
                                  .Ret<ffi::AnyBuffer>()  // total [N]
                                  .Ret<ffi::AnyBuffer>()  // alpha [N, S]
                                  .Ret<ffi::AnyBuffer>()  // local [N, A], pull order
                                  .Ret<ffi::AnyBuffer>());  // norm [N, S]

XLA_FFI_DEFINE_HANDLER_SYMBOL(SjLogBackward, LogBackward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // final_weight [N, S]
                                  .Arg<ffi::AnyBuffer>()  // pos_state [N, L, W]
                                  .Arg<ffi::AnyBuffer>()  // pull_end [N, L, W]
                                  .Arg<ffi::AnyBuffer>()  // pull_arc [N, A]
                                  .Arg<ffi::AnyBuffer>()  // pull_src [N, A]
                                  .Arg<ffi::AnyBuffer>()  // alpha [N, S]
                                  .Arg<ffi::AnyBuffer>()  // local [N, A]
                                  .Arg<ffi::AnyBuffer>()  // norm [N, S]
                                  .Arg<ffi::AnyBuffer>()  // total [N]
                                  .Ret<ffi::AnyBuffer>()  // arc_grad [N, A]
                                  .Ret<ffi::AnyBuffer>());  // final_grad [N, S]

XLA_FFI_DEFINE_HANDLER_SYMBOL(SjTropicalForward, TropicalForward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // weight [N, A]
                                  .Arg<ffi::AnyBuffer>()  // final_weight [N, S]
                                  .Arg<ffi::AnyBuffer>()  // pos_state [N, L, W]
                                  .Arg<ffi::AnyBuffer>()  // pull_end [N, L, W]
                                  .Arg<ffi::AnyBuffer>()  // pull_arc [N, A]
                                  .Arg<ffi::AnyBuffer>()  // pull_src [N, A]
                                  .Ret<ffi::AnyBuffer>()  // total [N]
                                  .Ret<ffi::AnyBuffer>()  // alpha [N, S]
                                  .Ret<ffi::AnyBuffer>());  // choice [N, S] int32

XLA_FFI_DEFINE_HANDLER_SYMBOL(SjTropicalBackward, TropicalBackward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // final_weight [N, S]
                                  .Arg<ffi::AnyBuffer>()  // src [N, A]
                                  .Arg<ffi::AnyBuffer>()  // alpha [N, S]
                                  .Arg<ffi::AnyBuffer>()  // choice [N, S] int32
                                  .Ret<ffi::AnyBuffer>()  // arc_grad [N, A]
                                  .Ret<ffi::AnyBuffer>());  // final_grad [N, S]
