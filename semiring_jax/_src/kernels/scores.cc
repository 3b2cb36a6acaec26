// CPU kernels for the score recursions of acyclic Fsas (XLA FFI handlers).
//
// The level-scheduled lax.scan of scores/level_scan.py runs on every backend; on
// the CPU, XLA spends most of each level step launching small kernels. Here
// one call walks the schedule's levels and pulls each state's incoming arcs
// from the schedule's pull order (`Schedule.pull_*`, built on the host), so
// every table is read front to back and the work is one pass over the arcs.
//
// Shapes (every buffer may carry leading batch dimensions, flattened to N):
//   weight    [N, A]     arc weights (f32 or f64: one handler per dtype)
//   final     [N, S]     final weights, the same dtype
//   final_mask [N, S]    bool, which states are final (tot_score's kernels
//                        only): another state's final weight is not read,
//                        as if -inf, and its final gradient is 0
//   pos_state [N, L, W]  int32, the state at each level position; S = none
//   pull_end  [N, L, W]  int32, where each position's arcs end in pull order
//   pull_arc  [N, A]     int32, arcs by destination position, then index
//   pull_src  [N, A]     int32, their source states
//   src       [N, A]     int32, each arc's source state (trace-back only)
// The sizes are checked against each other, and every index against them,
// so a schedule that belongs to another Fsa is an error, not a stray read.
// State 0 is the start; the Fsa is acyclic (checked on the host), so every
// arc goes from a lower level to a higher one.
//
// Scores are kept in double for either input dtype: float32 inputs then
// lose nothing to the depth of the Fsa (a 100,000-level chain's scores
// reach 2e5, where a float's spacing is 0.016), and float64 ones keep
// their precision (exp and log are libm's for them; float32 inputs use
// the float SIMD exp on O(1) arguments).
//
// LOG:      alpha[s] = logsumexp(one(s), alpha[src a] + w[a] for a into s)
//   forward keeps local[j] = exp(alpha[src] + w - m_s) for the j-th arc in
//   pull order (m_s the maximum term of its level, or of its state when
//   that is far below) and norm[s] = 1 / sum, so that posterior =
//   gamma[dst] * norm[dst] * local. backward: gamma[s] = exp(alpha[s] +
//   final[s] - Z) + the posteriors of the arcs leaving s.
// TROPICAL: alpha[s] = max(one(s), alpha[src a] + w[a]); choice[s] is the
//   winning arc, -1 for the start's empty prefix or none. Ties: the empty
//   prefix, then the lowest arc index (pull order keeps arc order within a
//   state), as scores/level_scan.py documents.
//
// NaN in a real arc's weight or in a final state's final weight (any
// final weight where no final_mask is given) makes the total NaN and every
// gradient entry NaN, but for the final gradient of a state final_mask marks
// non-final: 0, as that weight is never read. +inf stays +inf where a path
// uses it (-inf absorbs it, `Times`); LOG gradients of a +inf total are NaN,
// TROPICAL ones the indicator of the best path, as the scans give.

#include <new>

#include "common.h"

namespace {

ffi::Error Fail(const std::string& what) { return FailIn("score kernel", what); }

struct Sizes {
  int64_t n = 1;           // batch entries
  int64_t num_arcs = 0;    // A
  int64_t num_states = 0;  // S
  int64_t levels = 0;      // L
  int64_t width = 0;       // W
};

template <typename Dims>
std::string Shape(const Dims& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

// Sizes of weight [.., A], final [.., S], pos_state [.., L, W], pull_end
// like pos_state, pull_arc, pull_src (and src) like weight, and final_mask
// (where given) like final, all with the same leading dimensions.
template <typename W, typename F, typename M, typename I>
ffi::Error GetSizes(const W& weight, const F& final_weight, const M* final_mask, const I& pos_state,
                    const I& pull_end, const I& pull_arc, const I& pull_src, const I* src,
                    Sizes* z) {
  auto a = weight.dimensions();
  auto s = final_weight.dimensions();
  auto p = pos_state.dimensions();
  if (a.size() < 1 || s.size() < 1 || p.size() < 2) return Fail("tables of too low a rank");
  z->num_arcs = a.back();
  z->num_states = s.back();
  z->levels = p[p.size() - 2];
  z->width = p.back();
  z->n = LeadingCount(a, 1);
  if (z->num_states < 1) return Fail("no states");
  if (z->levels > 0 && z->width < 1) return Fail("levels of no width");
  const bool same = LeadingCount(s, 1) == z->n && LeadingCount(p, 2) == z->n &&
                    Shape(pull_end.dimensions()) == Shape(p) &&
                    Shape(pull_arc.dimensions()) == Shape(a) &&
                    Shape(pull_src.dimensions()) == Shape(a) &&
                    (src == nullptr || Shape(src->dimensions()) == Shape(a)) &&
                    (final_mask == nullptr || Shape(final_mask->dimensions()) == Shape(s));
  if (!same) {
    const std::string mask =
        final_mask == nullptr ? "" : ", final_mask " + Shape(final_mask->dimensions());
    return Fail("tables of mismatched sizes: weight " + Shape(a) + ", final_weight " + Shape(s) +
                mask + ", pos_state " + Shape(p) + ", pull_end " + Shape(pull_end.dimensions()) +
                ", pull_arc " + Shape(pull_arc.dimensions()) + " (a schedule of another Fsa?)");
  }
  return ffi::Error::Success();
}

// Pointers to one batch entry's tables.
template <typename T>
struct Entry {
  const T* weight;
  const T* final_weight;
  const bool* final_mask;  // nullptr: every state's final weight is read
  const int32_t* pos_state;
  const int32_t* pull_end;
  const int32_t* pull_arc;
  const int32_t* pull_src;
};

// Whether state s's final weight counts (final_mask, where given).
template <typename T>
inline bool IsFinal(const Entry<T>& e, int64_t s) {
  return e.final_mask == nullptr || e.final_mask[s];
}

// State s's final weight as the recursions read it: -inf (the zero) on a
// state final_mask marks non-final, whatever is stored there (NaN too).
template <typename T>
inline T FinalAt(const Entry<T>& e, int64_t s) {
  return IsFinal(e, s) ? e.final_weight[s] : kNegInf<T>;
}

// final_grad [S] = fill on the final states, 0 on the others: a final
// weight that is not read has no effect on the total, whatever it is.
template <typename T>
void FillFinalGrad(const Entry<T>& e, int64_t S, T fill, T* final_grad) {
  for (int64_t s = 0; s < S; ++s) final_grad[s] = IsFinal(e, s) ? fill : T(0);
}

// The first pull index of position p (positions are flattened [L * W]).
inline int64_t PullBegin(const int32_t* pull_end, int64_t p) { return p == 0 ? 0 : pull_end[p - 1]; }

inline bool Below(int64_t i, int64_t size) {
  return static_cast<uint64_t>(i) < static_cast<uint64_t>(size);
}

// Whether the entry's tables index only within its sizes: pull_end rises
// within [0, A], every pulled arc and source exists, states are < S or the
// S of an empty position. Checked once per entry, so the recursions below
// can trust them. Every call reads every table once here, so the loops are
// free of branches (each ORs its elements' faults into one word) and the
// compiler vectorises them: with a branch per element this check cost as
// much as a TROPICAL forward pass.
template <typename T>
bool TablesFit(const Sizes& z, const Entry<T>& e) {
  const int64_t positions = z.levels * z.width;
  // The indices are int32, so any size past 2^32 - 1 bounds none of them.
  const uint32_t A = static_cast<uint32_t>(std::min<int64_t>(z.num_arcs, UINT32_MAX));
  const uint32_t S = static_cast<uint32_t>(std::min<int64_t>(z.num_states, UINT32_MAX - 1));
  // pull_end[-1] is 0: the first position starts the pull order.
  uint32_t bad = 0;
  if (positions > 0) {
    bad = (static_cast<uint32_t>(e.pull_end[0]) > A) | (static_cast<uint32_t>(e.pos_state[0]) > S) |
          ((e.pull_end[0] > 0) & (static_cast<uint32_t>(e.pos_state[0]) == S));
  }
  for (int64_t p = 1; p < positions; ++p) {
    const int32_t begin = e.pull_end[p - 1], end = e.pull_end[p];
    const uint32_t state = static_cast<uint32_t>(e.pos_state[p]);
    bad |= (end < begin) | (static_cast<uint32_t>(end) > A) | (state > S) |
           ((end > begin) & (state == S));
  }
  if (bad != 0) return false;
  // Pulls past the last position's end are padding: their arcs must exist,
  // their sources are never read.
  const int64_t real_end = positions > 0 ? e.pull_end[positions - 1] : 0;
  for (int64_t j = 0; j < real_end; ++j) {
    bad |= (static_cast<uint32_t>(e.pull_arc[j]) >= A) |
           (static_cast<uint32_t>(e.pull_src[j]) >= S);
  }
  for (int64_t j = real_end; j < z.num_arcs; ++j) {
    bad |= static_cast<uint32_t>(e.pull_arc[j]) >= A;
  }
  return bad == 0;
}

// A state whose best term is this far below its level's best is shifted by
// its own maximum instead of the level's, so that its terms cannot
// underflow (exp(-60) is about 1e-26, far above float's smallest normal).
constexpr double kOwnShiftBelow = -60;

// What a LOG forward pass leaves for its backward pass, in scratch.
template <typename T>
struct LogState {
  double* alpha;  // [S]
  double* norm;   // [S], 1 / each state's sum of terms
  double* shift;  // [S], what its terms were shifted by: alpha = shift + log(1 / norm)
  T* local;       // [A] in pull order: exp(term - shift)
  double* term;   // [A] alpha[src] + weight in pull order; only the current
                  // level's, from its first arc, unless kept (ForEntropy)
  double* best;   // [W], each position's best term in the current level
};

template <typename T>
size_t LogStateBytes(const Sizes& z) {
  return 3 * Workspace::Bytes<double>(z.num_states) + Workspace::Bytes<T>(z.num_arcs) +
         Workspace::Bytes<double>(z.num_arcs) + Workspace::Bytes<double>(z.width);
}

template <typename T>
LogState<T> TakeLogState(const Sizes& z, Workspace* space) {
  LogState<T> st;
  st.alpha = space->Take<double>(z.num_states);
  st.norm = space->Take<double>(z.num_states);
  st.shift = space->Take<double>(z.num_states);
  st.local = space->Take<T>(z.num_arcs);
  st.term = space->Take<double>(z.num_arcs);
  st.best = space->Take<double>(z.width);
  return st;
}

// local[j] = exp(term[j] - shift) for j < n: four lanes at a time for
// float32 inputs.
inline void ExpShifted(int64_t n, double shift, const double* term, float* local) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    Doubles4 d;
    std::memcpy(&d, term + j, sizeof(d));
    const Floats4 e = FastExp4(__builtin_convertvector(d - shift, Floats4));
    std::memcpy(local + j, &e, sizeof(e));
  }
  for (; j < n; ++j) local[j] = FastExp(static_cast<float>(term[j] - shift));
}

inline void ExpShifted(int64_t n, double shift, const double* term, double* local) {
  for (int64_t j = 0; j < n; ++j) local[j] = std::exp(term[j] - shift);
}

// Whether no arc weight is NaN or +inf (padding's included), read in one
// branch-free pass. Then alpha is never NaN or +inf either, a plain sum is
// the semiring's Times (only -inf absorbs, and -inf + finite is -inf), and
// the recursions skip their per-arc NaN tracking.
template <typename T>
bool WeightsPlain(const Sizes& z, const Entry<T>& e) {
  uint32_t bad = 0;
  for (int64_t a = 0; a < z.num_arcs; ++a) bad |= !(e.weight[a] < kPosInf<T>);
  return bad == 0;
}

// alpha ⊗ w in a forward pass: a plain sum where WeightsPlain holds.
template <bool kPlain>
inline double TimesIn(double alpha, double w) {
  return kPlain ? alpha + w : Times(alpha, w);
}

// exp(x) of x <= 0 in double, without libm's call where x is -inf (a
// state that is not final): most states of a graph, and the call would cost
// as much as a pass over the arcs.
inline double ExpOfEnd(double x) { return x > kNegInf<double> ? std::exp(x) : 0.0; }

// One entry's LOG forward pass; returns the total score, NaN when a real
// arc's weight or a final weight is NaN. A level at a time:
// gather every incoming term alpha[src] + weight (pull order), exponentiate
// the level's terms in one long loop shifted by the level's maximum finite
// term, then sum per state.
template <bool kPlain, bool kKeep, typename T>
double LogForward(const Sizes& z, const Entry<T>& e, const LogState<T>& st) {
  const int64_t S = z.num_states, W = z.width;
  for (int64_t s = 0; s < S; ++s) {
    st.alpha[s] = s == 0 ? 0.0 : kNegInf<double>;
    st.norm[s] = 0.0;
    st.shift[s] = 0.0;
  }
  bool nan = false;
  for (int64_t level = 0; level < z.levels; ++level) {
    const int64_t first_p = level * W;
    const int64_t level_begin = PullBegin(e.pull_end, first_p);
    // Unless kept, term is indexed from the level's first arc, so that it
    // stays in cache.
    const int64_t t0 = kKeep ? 0 : level_begin;
    const int64_t level_end = e.pull_end[first_p + W - 1];
    double level_best = kNegInf<double>;
    for (int64_t p = first_p; p < first_p + W; ++p) {
      const int64_t begin = PullBegin(e.pull_end, p), end = e.pull_end[p];
      if (begin == end) continue;
      const int32_t s = e.pos_state[p];
      double best = st.alpha[s];  // the empty prefix (start) or zero
      for (int64_t j = begin; j < end; ++j) {
        const T w = e.weight[e.pull_arc[j]];
        if (!kPlain) nan |= w != w;
        const double x = TimesIn<kPlain>(st.alpha[e.pull_src[j]], static_cast<double>(w));
        st.term[j - t0] = x;
        best = std::max(best, x);
      }
      st.best[p - first_p] = best;
      if (best < kPosInf<double>) level_best = std::max(level_best, best);
    }
    if (level_best > kNegInf<double>) {
      ExpShifted(level_end - level_begin, level_best, st.term + (level_begin - t0),
                 st.local + level_begin);
    }
    for (int64_t p = first_p; p < first_p + W; ++p) {
      const int64_t begin = PullBegin(e.pull_end, p), end = e.pull_end[p];
      if (begin == end) continue;
      const int32_t s = e.pos_state[p];
      const double best = st.best[p - first_p];
      if (!(best > kNegInf<double>) || !(best < kPosInf<double>)) {
        // Unreachable (alpha stays -inf) or through a +inf weight (+inf;
        // its posteriors are undefined, see above): no shares.
        std::fill(st.local + begin, st.local + end, T(0));
        st.alpha[s] = best > kNegInf<double> ? best : st.alpha[s];
        continue;
      }
      double shift = level_best;
      if (best - level_best < kOwnShiftBelow) {
        shift = best;
        ExpShifted(end - begin, shift, st.term + (begin - t0), st.local + begin);
      }
      double sum = s == 0 ? static_cast<double>(ExpOf(static_cast<T>(st.alpha[s] - shift))) : 0.0;
      for (int64_t j = begin; j < end; ++j) sum += static_cast<double>(st.local[j]);
      st.norm[s] = 1.0 / sum;
      st.shift[s] = shift;
      st.alpha[s] = shift + std::log(sum);
    }
  }
  // ⊕ over the states of alpha ⊗ final.
  double best = kNegInf<double>;
  for (int64_t s = 0; s < S; ++s) {
    const T f = FinalAt(e, s);
    nan |= f != f;
    best = std::max(best, Times(st.alpha[s], static_cast<double>(f)));
  }
  if (nan) return kNaN<double>;
  if (!(best > kNegInf<double>) || !(best < kPosInf<double>)) return best;
  double sum = 0;
  for (int64_t s = 0; s < S; ++s) {
    sum += ExpOfEnd(Times(st.alpha[s], static_cast<double>(FinalAt(e, s))) - best);
  }
  return best + std::log(sum);
}

template <typename T>
double LogForwardOne(const Sizes& z, const Entry<T>& e, const LogState<T>& st) {
  return WeightsPlain(z, e) ? LogForward<true, false>(z, e, st)
                            : LogForward<false, false>(z, e, st);
}

// LogForwardOne for the entropy, which reads every term afterwards (to form
// O(1) differences of score-sized values): it keeps all of term.
template <typename T>
double LogForwardForEntropy(const Sizes& z, const Entry<T>& e, const LogState<T>& st) {
  return WeightsPlain(z, e) ? LogForward<true, true>(z, e, st)
                            : LogForward<false, true>(z, e, st);
}

// One entry's LOG gradients: d total / d weight [A] and d total / d final [S].
template <typename T>
void LogBackwardOne(const Sizes& z, const Entry<T>& e, const LogState<T>& st, double total,
                    T* arc_grad, T* final_grad, Workspace* space) {
  const int64_t S = z.num_states, A = z.num_arcs, P = z.levels * z.width;
  // Undefined where the returned total (rounded to T) is NaN or +inf: NaN in,
  // a +inf weight, or a float total past T's range; tot_score applies no
  // mask of its own to the kernel's gradients.
  const T rounded = static_cast<T>(total);
  if (rounded != rounded || rounded == kPosInf<T>) {
    std::fill(arc_grad, arc_grad + A, kNaN<T>);
    FillFinalGrad(e, S, kNaN<T>, final_grad);
    return;
  }
  if (!(total > kNegInf<double>)) {  // no successful path: the gradient is exactly 0
    std::fill(arc_grad, arc_grad + A, T(0));
    std::fill(final_grad, final_grad + S, T(0));
    return;
  }
  double* gamma = space->Take<double>(S);  // the posterior of passing through each state
  for (int64_t s = 0; s < S; ++s) {
    gamma[s] = ExpOfEnd(Times(st.alpha[s], static_cast<double>(FinalAt(e, s))) - total);
    final_grad[s] = static_cast<T>(std::min(gamma[s], 1.0));
  }
  // Zeros first: padding arcs, and any arc that pull_arc fails to list.
  std::fill(arc_grad, arc_grad + A, T(0));
  for (int64_t p = P - 1; p >= 0; --p) {
    const int64_t begin = PullBegin(e.pull_end, p), end = e.pull_end[p];
    if (begin == end) continue;
    const double g = gamma[e.pos_state[p]] * st.norm[e.pos_state[p]];
    for (int64_t j = begin; j < end; ++j) {
      const double posterior = g * static_cast<double>(st.local[j]);
      arc_grad[e.pull_arc[j]] = static_cast<T>(std::min(posterior, 1.0));
      gamma[e.pull_src[j]] += posterior;
    }
  }
}

// One entry's TROPICAL forward pass: alpha, each state's chosen arc, the
// total (NaN as in LogForwardOne).
template <bool kPlain, typename T>
double TropicalForward(const Sizes& z, const Entry<T>& e, double* alpha, int32_t* choice) {
  const int64_t S = z.num_states;
  for (int64_t s = 0; s < S; ++s) {
    alpha[s] = s == 0 ? 0.0 : kNegInf<double>;
    choice[s] = -1;
  }
  bool nan = false;
  for (int64_t p = 0; p < z.levels * z.width; ++p) {
    const int64_t begin = PullBegin(e.pull_end, p), end = e.pull_end[p];
    if (begin == end) continue;
    const int32_t s = e.pos_state[p];
    double best = alpha[s];
    int32_t chosen = -1;
    for (int64_t j = begin; j < end; ++j) {
      const int32_t a = e.pull_arc[j];
      const T w = e.weight[a];
      if (!kPlain) nan |= w != w;
      // A plain sum even where a weight is +inf: where Times gives -inf
      // (the zero absorbing +inf) the sum is NaN, and neither is > best.
      const double x = alpha[e.pull_src[j]] + static_cast<double>(w);
      if (x > best) {
        best = x;
        chosen = a;
      }
    }
    alpha[s] = best;
    choice[s] = chosen;
  }
  double best = kNegInf<double>;
  for (int64_t s = 0; s < S; ++s) {
    const T f = FinalAt(e, s);
    nan |= f != f;
    best = std::max(best, Times(alpha[s], static_cast<double>(f)));
  }
  return nan ? kNaN<double> : best;
}

template <typename T>
double TropicalForwardOne(const Sizes& z, const Entry<T>& e, double* alpha, int32_t* choice) {
  return WeightsPlain(z, e) ? TropicalForward<true>(z, e, alpha, choice)
                            : TropicalForward<false>(z, e, alpha, choice);
}

// One entry's best path: the indicator of its arcs and of its final state,
// the lowest-numbered one with the best score.
template <typename T>
void TropicalBackwardOne(const Sizes& z, const Entry<T>& e, const int32_t* src,
                         const double* alpha, const int32_t* choice, double total, T* arc_grad,
                         T* final_grad) {
  const int64_t A = z.num_arcs, S = z.num_states;
  const T fill = total != total ? kNaN<T> : T(0);
  std::fill(arc_grad, arc_grad + A, fill);
  FillFinalGrad(e, S, fill, final_grad);
  if (!(total > kNegInf<double>)) return;  // no path (gradient exactly 0) or NaN
  int64_t best_state = 0;
  for (int64_t s = 0; s < S; ++s) {
    if (Times(alpha[s], static_cast<double>(FinalAt(e, s))) == total) {
      best_state = s;
      break;
    }
  }
  final_grad[best_state] = T(1);
  // At most S steps: a path of an acyclic Fsa visits each state once.
  int64_t s = best_state;
  for (int64_t step = 0; step < S && Below(choice[s], A); ++step) {
    const int32_t a = choice[s];
    arc_grad[a] = T(1);
    if (!Below(src[a], S)) break;
    s = src[a];
  }
}

// -- FFI handlers: one per op and dtype; the loop over batch entries ---------

template <ffi::DataType D>
using Floats = ffi::Buffer<D>;
using Ints = ffi::Buffer<ffi::S32>;
using Bools = ffi::Buffer<ffi::PRED>;

template <ffi::DataType D>
Entry<ffi::NativeType<D>> EntryAt(const Sizes& z, int64_t i, const Floats<D>& weight,
                                  const Floats<D>& final_weight, const Bools* final_mask,
                                  const Ints& pos_state, const Ints& pull_end,
                                  const Ints& pull_arc, const Ints& pull_src) {
  const int64_t positions = z.levels * z.width;
  return {
      weight.typed_data() + i * z.num_arcs,
      final_weight.typed_data() + i * z.num_states,
      final_mask == nullptr ? nullptr : final_mask->typed_data() + i * z.num_states,
      pos_state.typed_data() + i * positions,
      pull_end.typed_data() + i * positions,
      pull_arc.typed_data() + i * z.num_arcs,
      pull_src.typed_data() + i * z.num_arcs,
  };
}

// Runs body(z, i, entry) for every batch entry on the pool, after checking
// the tables' sizes against each other (and final_mask's and src's, where
// given) and each entry's indices against its sizes.
template <ffi::DataType D, typename Body>
ffi::Error ForEachEntry(ffi::ThreadPool& pool, const Floats<D>& weight,
                        const Floats<D>& final_weight, const Bools* final_mask,
                        const Ints& pos_state, const Ints& pull_end, const Ints& pull_arc,
                        const Ints& pull_src, const Ints* src, const Body& body) {
  Sizes z;
  if (auto error = GetSizes(weight, final_weight, final_mask, pos_state, pull_end, pull_arc,
                            pull_src, src, &z);
      error.failure()) {
    return error;
  }
  std::atomic<int64_t> misfit{-1};
  ForEntries(pool, z.n, z.num_arcs, [&](int64_t i) {
    const auto e = EntryAt<D>(z, i, weight, final_weight, final_mask, pos_state, pull_end,
                              pull_arc, pull_src);
    if (!TablesFit(z, e)) {
      misfit.store(i);
      return;
    }
    body(z, i, e);
  });
  if (misfit.load() >= 0) {
    return Fail("batch entry " + std::to_string(misfit.load()) +
                ": the schedule's tables index outside the Fsa's " +
                std::to_string(z.num_states) + " states and " + std::to_string(z.num_arcs) +
                " arcs (a schedule of another Fsa?)");
  }
  return ffi::Error::Success();
}

template <ffi::DataType D>
ffi::Error LogTotal(ffi::ThreadPool pool, Floats<D> weight, Floats<D> final_weight,
                    Bools final_mask, Ints pos_state, Ints pull_end, Ints pull_arc,
                    Ints pull_src, ffi::ResultBuffer<D> total) {
  using T = ffi::NativeType<D>;
  return ForEachEntry<D>(
      pool, weight, final_weight, &final_mask, pos_state, pull_end, pull_arc, pull_src, nullptr,
      [&](const Sizes& z, int64_t i, const Entry<T>& e) {
        Workspace space(LogStateBytes<T>(z));
        total->typed_data()[i] =
            static_cast<T>(LogForwardOne<T>(z, e, TakeLogState<T>(z, &space)));
      });
}

template <ffi::DataType D>
ffi::Error LogGrad(ffi::ThreadPool pool, Floats<D> weight, Floats<D> final_weight,
                   Bools final_mask, Ints pos_state, Ints pull_end, Ints pull_arc, Ints pull_src,
                   ffi::ResultBuffer<D> total, ffi::ResultBuffer<D> arc_grad,
                   ffi::ResultBuffer<D> final_grad) {
  using T = ffi::NativeType<D>;
  return ForEachEntry<D>(
      pool, weight, final_weight, &final_mask, pos_state, pull_end, pull_arc, pull_src, nullptr,
      [&](const Sizes& z, int64_t i, const Entry<T>& e) {
        Workspace space(LogStateBytes<T>(z) + Workspace::Bytes<double>(z.num_states));
        const LogState<T> st = TakeLogState<T>(z, &space);
        const double value = LogForwardOne<T>(z, e, st);
        total->typed_data()[i] = static_cast<T>(value);
        LogBackwardOne<T>(z, e, st, value, arc_grad->typed_data() + i * z.num_arcs,
                          final_grad->typed_data() + i * z.num_states, &space);
      });
}

// A TROPICAL forward pass's scratch: alpha [S] and each state's choice [S].
struct TropicalState {
  double* alpha;
  int32_t* choice;
};

inline size_t TropicalStateBytes(const Sizes& z) {
  return Workspace::Bytes<double>(z.num_states) + Workspace::Bytes<int32_t>(z.num_states);
}

inline TropicalState TakeTropicalState(const Sizes& z, Workspace* space) {
  double* alpha = space->Take<double>(z.num_states);
  return {alpha, space->Take<int32_t>(z.num_states)};
}

template <ffi::DataType D>
ffi::Error TropicalTotal(ffi::ThreadPool pool, Floats<D> weight, Floats<D> final_weight,
                         Bools final_mask, Ints pos_state, Ints pull_end, Ints pull_arc,
                         Ints pull_src, ffi::ResultBuffer<D> total) {
  using T = ffi::NativeType<D>;
  return ForEachEntry<D>(
      pool, weight, final_weight, &final_mask, pos_state, pull_end, pull_arc, pull_src, nullptr,
      [&](const Sizes& z, int64_t i, const Entry<T>& e) {
        Workspace space(TropicalStateBytes(z));
        const TropicalState st = TakeTropicalState(z, &space);
        total->typed_data()[i] =
            static_cast<T>(TropicalForwardOne<T>(z, e, st.alpha, st.choice));
      });
}

template <ffi::DataType D>
ffi::Error TropicalGrad(ffi::ThreadPool pool, Floats<D> weight, Floats<D> final_weight,
                        Bools final_mask, Ints pos_state, Ints pull_end, Ints pull_arc,
                        Ints pull_src, Ints src, ffi::ResultBuffer<D> total,
                        ffi::ResultBuffer<D> arc_grad, ffi::ResultBuffer<D> final_grad) {
  using T = ffi::NativeType<D>;
  return ForEachEntry<D>(
      pool, weight, final_weight, &final_mask, pos_state, pull_end, pull_arc, pull_src, &src,
      [&](const Sizes& z, int64_t i, const Entry<T>& e) {
        Workspace space(TropicalStateBytes(z));
        const TropicalState st = TakeTropicalState(z, &space);
        const double value = TropicalForwardOne<T>(z, e, st.alpha, st.choice);
        total->typed_data()[i] = static_cast<T>(value);
        TropicalBackwardOne<T>(z, e, src.typed_data() + i * z.num_arcs, st.alpha,
                               st.choice, value, arc_grad->typed_data() + i * z.num_arcs,
                               final_grad->typed_data() + i * z.num_states);
      });
}

// -- KBEST: the k best path scores --------------------------------------------
//
// Lazily, after Huang and Chiang's "Better k-best parsing" (2005, algorithm
// 3) on a graph: one Viterbi pass gives every state its best prefix (rank
// 0); a state's further prefixes are computed only when a longer list
// downstream asks for them. A state's r-th best prefix comes from a
// candidate heap over (pull index j, rank c): its arc j extending the c-th
// best prefix into j's source. Each pop pushes the popped pair's successor
// (j, c + 1), which first asks the source for its (c + 1)-th prefix, and so
// on up the path. The k best totals come the same way from a heap over
// (state, rank) of prefix ⊗ final weight. The work is one pass over the
// arcs plus, for each of the k paths, about its length heap steps (and one
// heap of a state's in-arcs the first time that state is asked for a
// second prefix), against k times the arcs for merging every state's
// k-list. Ties: the empty prefix, then the lower pull index (arc order
// within a state), then the lower rank; in the total the lower state, then
// the lower rank. A score's gradient is 1 on its path's arcs and final
// state, traced back through the (j, c) pairs.

// A prefix of a state, or a candidate for one: its score, the pull index
// of its last arc (-1: the start's empty prefix, -2: none) and the rank it
// extends at that arc's source. For the total, `j` is the end state.
struct Prefix {
  double value;
  int32_t j;
  int32_t rank;
};

// Whether a comes before b (a heap's top is the first).
inline bool Before(const Prefix& a, const Prefix& b) {
  return a.value > b.value || (a.value == b.value && (a.j < b.j || (a.j == b.j && a.rank < b.rank)));
}

// For std::*_heap, which keep the largest by `less` on top.
inline bool After(const Prefix& a, const Prefix& b) { return Before(b, a); }

enum class KBestOutcome { kOk, kNaN, kMisfit };

// One entry's lazy k-best search. Per state: its best prefix and position
// from the Viterbi pass, how many prefixes are known (`count`, 0 where
// none), how many of them have had their successor pushed, and — once
// asked for a second — a candidate heap and a block of further prefixes
// (see Grow), both taken from pools that grow with the prefixes asked
// for, not with S * k.
template <typename T>
class KBestSearch {
 public:
  KBestSearch(const Sizes& z, const Entry<T>& e, int64_t k, Workspace* space)
      : S_(z.num_states), P_(z.levels * z.width), k_(k), e_(e) {
    best_ = space->Take<Best>(S_);
    lazy_ = space->Take<Lazy>(S_);
    stack_state_ = space->Take<int32_t>(S_ + 1);
    stack_need_ = space->Take<int32_t>(S_ + 1);
  }

  static size_t Bytes(const Sizes& z) {
    return Workspace::Bytes<Best>(z.num_states) + Workspace::Bytes<Lazy>(z.num_states) +
           2 * Workspace::Bytes<int32_t>(z.num_states + 1);
  }

  // The Viterbi pass (rank 0 of every state). kMisfit where a state has
  // arcs at two positions, or pulls from a state whose position comes
  // later (the tables are then no level order of an acyclic Fsa); kNaN
  // where a real arc's or a final weight is NaN.
  KBestOutcome Forward() {
    for (int64_t s = 0; s < S_; ++s) {
      best_[s] = {s == 0 ? 0.0 : kNegInf<double>, s == 0 ? -1 : -2, kUnseen};
      lazy_[s] = {-1, -1, 0, 0, 0, 0};
    }
    bool nan = false;
    for (int64_t p = 0; p < P_; ++p) {
      const int64_t begin = PullBegin(e_.pull_end, p), end = e_.pull_end[p];
      if (begin == end) continue;
      Best& state = best_[e_.pos_state[p]];
      if (state.pos != kUnseen) return KBestOutcome::kMisfit;
      state.pos = static_cast<int32_t>(p);
      double value = state.value;
      int32_t chosen = state.j;
      for (int64_t j = begin; j < end; ++j) {
        const double w = Weight(j);
        nan |= w != w;
        Best& src = best_[e_.pull_src[j]];
        // A source not seen yet must never be seen (it has no arcs in);
        // one seen must be at an earlier position.
        if (src.pos < 0) {
          src.pos = kReadUnseen;
        } else if (src.pos >= p) {
          return KBestOutcome::kMisfit;
        }
        const double x = Times(src.value, w);
        if (x > value) {
          value = x;
          chosen = static_cast<int32_t>(j);
        }
      }
      state = {value, chosen, static_cast<int32_t>(p)};
    }
    for (int64_t s = 0; s < S_; ++s) {
      nan |= e_.final_weight[s] != e_.final_weight[s];
      lazy_[s].count = best_[s].value > kNegInf<double> ? 1 : 0;
    }
    return nan ? KBestOutcome::kNaN : KBestOutcome::kOk;
  }

  // The k best totals ⊗ final weight, best first, into out_score [k] with
  // their end states and ranks. Returns how many exist, or -1 where the
  // asks run deeper than S states (a cycle in the tables).
  int64_t Totals(double* out_score, int32_t* out_state, int32_t* out_rank) {
    std::vector<Prefix> heap;
    for (int64_t s = 0; s < S_; ++s) {
      const double x = Times(best_[s].value, Final(s));
      if (x > kNegInf<double>) heap.push_back({x, static_cast<int32_t>(s), 0});
    }
    std::make_heap(heap.begin(), heap.end(), After);
    int64_t found = 0;
    while (found < k_ && !heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), After);
      const Prefix top = heap.back();
      heap.pop_back();
      out_score[found] = top.value;
      out_state[found] = top.j;
      out_rank[found++] = top.rank;
      if (found == k_) break;
      // The successor (state, rank + 1) before the next pop.
      const int32_t s = top.j;
      if (!Ensure(s, top.rank + 2)) return -1;
      if (lazy_[s].count >= top.rank + 2) {
        const double x = Times(At(s, top.rank + 1).value, Final(s));
        if (x > kNegInf<double>) {
          heap.push_back({x, s, top.rank + 1});
          std::push_heap(heap.begin(), heap.end(), After);
        }
      }
    }
    return found;
  }

  // The arcs of the path ending in (state, rank), from its last arc back,
  // into path [length], which the caller filled with A (so A past its
  // start). False where the path has more than `length` arcs (tables whose
  // arcs stay within a level).
  bool TraceBack(int64_t state, int64_t rank, int64_t length, int32_t* path) const {
    for (int64_t step = 0; Below(state, S_) && rank < lazy_[state].count; ++step) {
      const Prefix at = At(state, rank);
      if (at.j < 0) return true;
      if (step == length) return false;
      path[step] = e_.pull_arc[at.j];
      state = e_.pull_src[at.j];
      rank = at.rank;
    }
    return true;
  }

 private:
  // A state's best prefix, and its position (kUnseen, or kReadUnseen once
  // read as a source before any position named it).
  struct Best {
    double value;
    int32_t j;
    int32_t pos;
  };
  static constexpr int32_t kUnseen = -1, kReadUnseen = -2;

  // What the lazy phase keeps of a state, side by side: where its heap and
  // its prefixes of rank >= 1 start in their pools (-1: none yet), how many
  // prefixes it has (0 where none), how many of those have had their
  // successor pushed, its heap's size and its block's room.
  struct Lazy {
    int64_t heap_at;
    int64_t block;
    int32_t count;
    int32_t pushed;
    int32_t heap_size;
    int32_t room;
  };

  double Weight(int64_t j) const { return static_cast<double>(e_.weight[e_.pull_arc[j]]); }
  double Final(int64_t s) const { return static_cast<double>(e_.final_weight[s]); }

  // The r-th best prefix of s (r < lazy_[s].count).
  Prefix At(int64_t s, int64_t r) const {
    if (r == 0) return {best_[s].value, best_[s].j, 0};
    return blocks_[static_cast<size_t>(lazy_[s].block + r - 1)];
  }

  bool Exhausted(int64_t s) const {
    const Lazy& at = lazy_[s];
    return at.heap_at >= 0 && at.heap_size == 0 && at.pushed == at.count;
  }

  // s's candidates besides its best: each in-arc's source's best, and the
  // empty prefix at the start.
  void StartHeap(int64_t s) {
    Lazy& at = lazy_[s];
    at.heap_at = static_cast<int64_t>(heaps_.size());
    const Best& best = best_[s];
    if (s == 0 && best.j != -1) heaps_.push_back({0.0, -1, 0});
    if (best.pos >= 0) {
      for (int64_t j = PullBegin(e_.pull_end, best.pos), end = e_.pull_end[best.pos]; j < end;
           ++j) {
        if (j == best.j) continue;
        const double x = Times(best_[e_.pull_src[j]].value, Weight(j));
        if (x > kNegInf<double>) heaps_.push_back({x, static_cast<int32_t>(j), 0});
      }
    }
    at.heap_size = static_cast<int32_t>(heaps_.size() - at.heap_at);
    // Room for one successor: each pop is preceded by at most one push,
    // so the heap never holds more than its start plus one.
    heaps_.push_back({});
    Prefix* heap = heaps_.data() + at.heap_at;
    std::make_heap(heap, heap + at.heap_size, After);
  }

  // Moves s's prefixes of rank >= 1 to a block of twice the room (16 at
  // first, at most k - 1) at the pool's end: the pool then holds at most
  // about twice the prefixes asked for, or 16 a state, whatever k is.
  void Grow(int64_t s) {
    Lazy& at = lazy_[s];
    const int32_t room = static_cast<int32_t>(
        std::min<int64_t>(k_ - 1, std::max<int64_t>(16, 2 * int64_t{at.room})));
    const int64_t block = static_cast<int64_t>(blocks_.size());
    blocks_.resize(blocks_.size() + room);
    if (at.room > 0) {
      std::copy(blocks_.begin() + at.block, blocks_.begin() + at.block + at.room,
                blocks_.begin() + block);
    }
    at.block = block;
    at.room = room;
  }

  // Makes s's count >= need, or s exhausted; false where the asks run
  // deeper than S states (only tables with a cycle do: on an acyclic Fsa
  // the stack is a path back from s).
  bool Ensure(int64_t s, int64_t need) {
    int64_t top = 0;
    stack_state_[top] = static_cast<int32_t>(s);
    stack_need_[top++] = static_cast<int32_t>(need);
    while (top > 0) {
      const int64_t v = stack_state_[top - 1], want = stack_need_[top - 1];
      Lazy& at = lazy_[v];
      if (at.count >= want || at.count == 0 || Exhausted(v)) {
        --top;
        continue;
      }
      if (at.heap_at < 0) StartHeap(v);
      if (at.pushed < at.count) {
        // The last prefix's successor: its arc over the source's next one.
        const Prefix last = At(v, at.count - 1);
        if (last.j >= 0) {
          const int64_t src = e_.pull_src[last.j];
          const int32_t known = lazy_[src].count;
          if (known < last.rank + 2 && !Exhausted(src)) {
            if (top > S_) return false;
            stack_state_[top] = static_cast<int32_t>(src);
            stack_need_[top++] = last.rank + 2;
            continue;
          }
          if (known >= last.rank + 2) {
            const double x = Times(At(src, last.rank + 1).value, Weight(last.j));
            if (x > kNegInf<double>) {
              Prefix* heap = heaps_.data() + at.heap_at;
              heap[at.heap_size++] = {x, last.j, last.rank + 1};
              std::push_heap(heap, heap + at.heap_size, After);
            }
          }
        }
        at.pushed = at.count;
      }
      if (at.heap_size == 0) continue;  // exhausted: popped above
      Prefix* heap = heaps_.data() + at.heap_at;
      std::pop_heap(heap, heap + at.heap_size, After);
      const Prefix next = heap[--at.heap_size];
      if (at.count - 1 == at.room) Grow(v);
      blocks_[static_cast<size_t>(at.block + at.count - 1)] = next;
      ++at.count;
    }
    return true;
  }

  int64_t S_, P_, k_;
  Entry<T> e_;
  Best* best_;
  Lazy* lazy_;
  int32_t *stack_state_, *stack_need_;
  std::vector<Prefix> heaps_;   // each asked state's candidates
  std::vector<Prefix> blocks_;  // each asked state's prefixes of rank 1, 2, ...
};

template <ffi::DataType D>
ffi::Error KBest(ffi::ThreadPool pool, Floats<D> weight, Floats<D> final_weight, Ints pos_state,
                 Ints pull_end, Ints pull_arc, Ints pull_src, int64_t k,
                 ffi::ResultBuffer<D> scores, ffi::ResultBuffer<ffi::S32> paths,
                 ffi::ResultBuffer<ffi::S32> ends) {
  using T = ffi::NativeType<D>;
  if (k < 1 || k > std::numeric_limits<int32_t>::max() / 2) {
    return Fail("k must be in [1, 2^30), got " + std::to_string(k));
  }
  const auto path_dims = paths->dimensions();
  const int64_t length = path_dims.size() < 2 ? 0 : path_dims.back();
  if (length < 1) return Fail("paths of no length");
  const int64_t n = LeadingCount(weight.dimensions(), 1);
  if (static_cast<int64_t>(scores->element_count()) != n * k ||
      static_cast<int64_t>(ends->element_count()) != n * k ||
      static_cast<int64_t>(paths->element_count()) != n * k * length) {
    return Fail("results of the wrong sizes for k = " + std::to_string(k));
  }
  std::atomic<int64_t> misfit{-1}, no_memory{-1};
  auto error = ForEachEntry<D>(
      pool, weight, final_weight, nullptr, pos_state, pull_end, pull_arc, pull_src, nullptr,
      [&](const Sizes& z, int64_t i, const Entry<T>& e) {
        int32_t* end_state = ends->typed_data() + i * k;
        int32_t* path = paths->typed_data() + i * k * length;
        T* out = scores->typed_data() + i * k;
        const int32_t none_arc = static_cast<int32_t>(z.num_arcs);
        std::fill(out, out + k, kNegInf<T>);
        std::fill(end_state, end_state + k, static_cast<int32_t>(z.num_states));
        std::fill(path, path + k * length, none_arc);
        try {
          Workspace space(KBestSearch<T>::Bytes(z) + Workspace::Bytes<double>(k) +
                          Workspace::Bytes<int32_t>(k));
          KBestSearch<T> search(z, e, k, &space);
          double* best = space.Take<double>(k);
          int32_t* rank = space.Take<int32_t>(k);
          KBestOutcome outcome = search.Forward();
          if (outcome == KBestOutcome::kNaN) {
            std::fill(out, out + k, kNaN<T>);
            return;
          }
          const int64_t found =
              outcome == KBestOutcome::kOk ? search.Totals(best, end_state, rank) : -1;
          bool fits = found >= 0;
          for (int64_t r = 0; fits && r < found; ++r) {
            out[r] = static_cast<T>(best[r]);
            fits = search.TraceBack(end_state[r], rank[r], length, path + r * length);
          }
          if (!fits) misfit.store(i);
        } catch (const std::bad_alloc&) {
          no_memory.store(i);
        }
      });
  if (error.failure()) return error;
  if (misfit.load() >= 0) {
    return Fail("batch entry " + std::to_string(misfit.load()) +
                ": the schedule's pull tables are not in level order (a state at two"
                " positions, or pulling from a later one or from its own level)");
  }
  if (no_memory.load() >= 0) {
    return Fail("batch entry " + std::to_string(no_memory.load()) +
                ": out of memory for the prefixes of k = " + std::to_string(k) + " paths");
  }
  return ffi::Error::Success();
}

// -- ENTROPY: the entropy of the LOG path distribution and its gradient -------
//
// After LogForwardForEntropy (alpha, and each term's share pi_j = local[j] *
// norm[s] of its state's mass), a second forward pass carries h[s], the
// entropy of the prefixes into s, by the mixture rule
//   h[s] = Σ pi_j (h[src] - log pi_j),   -log pi_j = (shift[s] - t_j) + log sum[s],
// the start's empty prefix a term of score 0. The surprise -log pi_j is
// formed relative to the state's shift (the largest term, or its level's),
// never as alpha[s] - t_j: alpha holds shift + log sum rounded to the
// scores' grid (at scores of 1e15 a double's spacing is 0.125, at 1e17
// 16), which would lose the O(1) part that is the entropy. The states'
// ends mix likewise, relative to the largest end: H = Σ share_s (h[s] -
// log share_s). The gradient, the covariance of an arc's use with the path
// score, is -gamma_a (A[src] + w_a + C[dst] - E) with A, C the expected
// prefix and suffix scores and E = E[score]; as those are score-sized, it
// is restated with A = alpha - h, C = beta - hb and E = Z - H as
//   dH/dw_a = -gamma_a (log gamma_a - h[src] - hb[dst] + H)
//   dH/df_s = -share_s (log share_s - h[s] + H),
// where hb[s], the entropy of the suffixes from s, comes from the backward
// pass by the same mixture rule over the posteriors leaving s (and s's
// own end), so that nothing score-sized is subtracted, in double.
// No path: H = 0 and gradients 0; NaN in, or a +inf mass: NaN.

template <typename T>
size_t EntropyStateBytes(const Sizes& z) {
  return LogStateBytes<T>(z) + 5 * Workspace::Bytes<double>(z.num_states);
}

template <typename T>
void EntropyOne(const Sizes& z, const Entry<T>& e, Workspace* space, T* value, T* arc_grad,
                T* final_grad) {
  const int64_t S = z.num_states, A = z.num_arcs, P = z.levels * z.width;
  const LogState<T> st = TakeLogState<T>(z, space);
  double* entropy = space->Take<double>(S);   // h[s]
  double* share = space->Take<double>(S);     // each end's share of the total
  double* surprise = space->Take<double>(S);  // -log share[s], where share[s] > 0
  double* gamma = space->Take<double>(S);
  double* suffix = space->Take<double>(S);  // Σ over what leaves s: posterior (hb - log posterior)
  const double total = LogForwardForEntropy<T>(z, e, st);
  if (total != total || total == kPosInf<double>) {
    *value = kNaN<T>;
    std::fill(arc_grad, arc_grad + A, kNaN<T>);
    std::fill(final_grad, final_grad + S, kNaN<T>);
    return;
  }
  std::fill(arc_grad, arc_grad + A, T(0));
  std::fill(final_grad, final_grad + S, T(0));
  if (!(total > kNegInf<double>)) {
    *value = T(0);
    return;
  }
  std::fill(entropy, entropy + S, 0.0);
  for (int64_t p = 0; p < P; ++p) {
    const int64_t begin = PullBegin(e.pull_end, p), end = e.pull_end[p];
    if (begin == end) continue;
    const int32_t s = e.pos_state[p];
    const double alpha = st.alpha[s];
    if (!(alpha > kNegInf<double>) || !(alpha < kPosInf<double>)) continue;
    const double shift = st.shift[s], log_sum = -std::log(st.norm[s]);
    double h = 0;
    for (int64_t j = begin; j < end; ++j) {
      const double pi = static_cast<double>(st.local[j]) * st.norm[s];
      if (!(pi > 0)) continue;
      h += pi * (entropy[e.pull_src[j]] + ((shift - st.term[j]) + log_sum));
    }
    if (s == 0) h += std::exp(-shift) * st.norm[s] * (shift + log_sum);  // the empty prefix
    entropy[s] = h;
  }
  // The ends' shares, relative to the largest end (total = top + log Σ).
  double top = kNegInf<double>;
  for (int64_t s = 0; s < S; ++s) {
    top = std::max(top, Times(st.alpha[s], static_cast<double>(e.final_weight[s])));
  }
  double sum = 0;
  for (int64_t s = 0; s < S; ++s) {
    sum += std::exp(Times(st.alpha[s], static_cast<double>(e.final_weight[s])) - top);
  }
  const double log_sum = std::log(sum);
  double h = 0;
  for (int64_t s = 0; s < S; ++s) {
    const double end = Times(st.alpha[s], static_cast<double>(e.final_weight[s]));
    surprise[s] = end > kNegInf<double> ? (top - end) + log_sum : kPosInf<double>;
    share[s] = std::exp(-surprise[s]);
    if (share[s] > 0) h += share[s] * (entropy[s] + surprise[s]);
  }
  *value = static_cast<T>(std::max(h, 0.0));
  for (int64_t s = 0; s < S; ++s) {
    gamma[s] = share[s];
    suffix[s] = share[s] > 0 ? share[s] * surprise[s] : 0.0;
    if (share[s] > 0) final_grad[s] = static_cast<T>(-share[s] * (h - surprise[s] - entropy[s]));
  }
  for (int64_t p = P - 1; p >= 0; --p) {
    const int64_t begin = PullBegin(e.pull_end, p), end = e.pull_end[p];
    if (begin == end) continue;
    const int32_t d = e.pos_state[p];
    if (!(gamma[d] > 0)) continue;
    const double g = gamma[d] * st.norm[d];
    const double log_gamma = std::log(gamma[d]);
    const double ahead = suffix[d] / gamma[d] + log_gamma;  // hb[d]
    // log posterior_j = log gamma[d] + log pi_j, pi_j relative to the shift.
    const double log_g = log_gamma + std::log(st.norm[d]);
    for (int64_t j = begin; j < end; ++j) {
      const double posterior = g * static_cast<double>(st.local[j]);
      if (!(posterior > 0)) continue;
      const int32_t a = e.pull_arc[j], src = e.pull_src[j];
      const double log_posterior = (st.term[j] - st.shift[d]) + log_g;
      arc_grad[a] = static_cast<T>(-posterior * (log_posterior - entropy[src] - ahead + h));
      gamma[src] += posterior;
      suffix[src] += posterior * (ahead - log_posterior);
    }
  }
}

template <ffi::DataType D>
ffi::Error Entropy(ffi::ThreadPool pool, Floats<D> weight, Floats<D> final_weight,
                   Ints pos_state, Ints pull_end, Ints pull_arc, Ints pull_src,
                   ffi::ResultBuffer<D> value, ffi::ResultBuffer<D> arc_grad,
                   ffi::ResultBuffer<D> final_grad) {
  using T = ffi::NativeType<D>;
  return ForEachEntry<D>(
      pool, weight, final_weight, nullptr, pos_state, pull_end, pull_arc, pull_src, nullptr,
      [&](const Sizes& z, int64_t i, const Entry<T>& e) {
        Workspace space(EntropyStateBytes<T>(z));
        EntropyOne<T>(z, e, &space, value->typed_data() + i,
                      arc_grad->typed_data() + i * z.num_arcs,
                      final_grad->typed_data() + i * z.num_states);
      });
}

// The bindings: inputs, then results, as the handlers above take them.
template <ffi::DataType D>
auto Tables() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<Floats<D>>()  // weight [N, A]
      .template Arg<Floats<D>>()  // final_weight [N, S]
      .template Arg<Ints>()       // pos_state [N, L, W]
      .template Arg<Ints>()       // pull_end [N, L, W]
      .template Arg<Ints>()       // pull_arc [N, A]
      .template Arg<Ints>();      // pull_src [N, A]
}

// tot_score's: final_mask [N, S] after final_weight.
template <ffi::DataType D>
auto MaskedTables() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<Floats<D>>()  // weight [N, A]
      .template Arg<Floats<D>>()  // final_weight [N, S]
      .template Arg<Bools>()      // final_mask [N, S]
      .template Arg<Ints>()       // pos_state [N, L, W]
      .template Arg<Ints>()       // pull_end [N, L, W]
      .template Arg<Ints>()       // pull_arc [N, A]
      .template Arg<Ints>();      // pull_src [N, A]
}

}  // namespace

// total [N]
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjLogTotalF32, LogTotal<ffi::F32>,
                              MaskedTables<ffi::F32>().Ret<Floats<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjLogTotalF64, LogTotal<ffi::F64>,
                              MaskedTables<ffi::F64>().Ret<Floats<ffi::F64>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjTropicalTotalF32, TropicalTotal<ffi::F32>,
                              MaskedTables<ffi::F32>().Ret<Floats<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjTropicalTotalF64, TropicalTotal<ffi::F64>,
                              MaskedTables<ffi::F64>().Ret<Floats<ffi::F64>>());
// total [N], arc_grad [N, A], final_grad [N, S]
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjLogGradF32, LogGrad<ffi::F32>,
                              MaskedTables<ffi::F32>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjLogGradF64, LogGrad<ffi::F64>,
                              MaskedTables<ffi::F64>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Floats<ffi::F64>>());
// src [N, A] after the tables
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjTropicalGradF32, TropicalGrad<ffi::F32>,
                              MaskedTables<ffi::F32>()
                                  .Arg<Ints>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjTropicalGradF64, TropicalGrad<ffi::F64>,
                              MaskedTables<ffi::F64>()
                                  .Arg<Ints>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Floats<ffi::F64>>());
// k best: scores [N, k], paths [N, k, L] (arcs, A past the end), ends [N, k]
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjKBestF32, KBest<ffi::F32>,
                              Tables<ffi::F32>()
                                  .Attr<int64_t>("k")
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Ints>()
                                  .Ret<Ints>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjKBestF64, KBest<ffi::F64>,
                              Tables<ffi::F64>()
                                  .Attr<int64_t>("k")
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Ints>()
                                  .Ret<Ints>());
// entropy [N], arc_grad [N, A], final_grad [N, S]
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjEntropyF32, Entropy<ffi::F32>,
                              Tables<ffi::F32>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjEntropyF64, Entropy<ffi::F64>,
                              Tables<ffi::F64>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Floats<ffi::F64>>());
