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
// NaN in a real arc's weight or in any final weight makes the total NaN
// and every gradient entry NaN. +inf stays +inf where a path uses it (-inf
// absorbs it, `Times`); LOG gradients of a +inf total are NaN, TROPICAL
// ones the indicator of the best path, as the scans give.

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
// like pos_state, and pull_arc, pull_src (and src) like weight, all with
// the same leading dimensions.
template <typename W, typename F, typename I>
ffi::Error GetSizes(const W& weight, const F& final_weight, const I& pos_state, const I& pull_end,
                    const I& pull_arc, const I& pull_src, const I* src, Sizes* z) {
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
                    (src == nullptr || Shape(src->dimensions()) == Shape(a));
  if (!same) {
    return Fail("tables of mismatched sizes: weight " + Shape(a) + ", final_weight " + Shape(s) +
                ", pos_state " + Shape(p) + ", pull_end " + Shape(pull_end.dimensions()) +
                ", pull_arc " + Shape(pull_arc.dimensions()) + " (a schedule of another Fsa?)");
  }
  return ffi::Error::Success();
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

inline bool Below(int64_t i, int64_t size) {
  return static_cast<uint64_t>(i) < static_cast<uint64_t>(size);
}

// Whether the entry's tables index only within its sizes: pull_end rises
// within [0, A], every pulled arc and source exists, states are < S or the
// S of an empty position. Checked once per entry (a read of each table),
// so the recursions below can trust them.
template <typename T>
bool TablesFit(const Sizes& z, const Entry<T>& e) {
  const int64_t positions = z.levels * z.width;
  int64_t previous = 0;
  for (int64_t p = 0; p < positions; ++p) {
    const int64_t end = e.pull_end[p];
    if (end < previous || end > z.num_arcs) return false;
    if (end > previous && !Below(e.pos_state[p], z.num_states)) return false;
    if (!Below(e.pos_state[p], z.num_states + 1)) return false;
    previous = end;
  }
  for (int64_t j = 0; j < previous; ++j) {
    if (!Below(e.pull_arc[j], z.num_arcs) || !Below(e.pull_src[j], z.num_states)) return false;
  }
  for (int64_t j = previous; j < z.num_arcs; ++j) {
    if (!Below(e.pull_arc[j], z.num_arcs)) return false;
  }
  return true;
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
  T* local;       // [A] in pull order: exp(term - shift)
  double* term;   // [A] in pull order: alpha[src] + weight
  double* best;   // [W], each position's best term in the current level
};

template <typename T>
size_t LogStateBytes(const Sizes& z) {
  return 2 * Workspace::Bytes<double>(z.num_states) + Workspace::Bytes<T>(z.num_arcs) +
         Workspace::Bytes<double>(z.num_arcs) + Workspace::Bytes<double>(z.width);
}

template <typename T>
LogState<T> TakeLogState(const Sizes& z, Workspace* space) {
  LogState<T> st;
  st.alpha = space->Take<double>(z.num_states);
  st.norm = space->Take<double>(z.num_states);
  st.local = space->Take<T>(z.num_arcs);
  st.term = space->Take<double>(z.num_arcs);
  st.best = space->Take<double>(z.width);
  return st;
}

// local[j] = exp(term[j] - shift) for j in [begin, end): four lanes at a
// time for float32 inputs.
inline void ExpShifted(int64_t begin, int64_t end, double shift, const double* term,
                       float* local) {
  int64_t j = begin;
  for (; j + 4 <= end; j += 4) {
    Doubles4 d;
    std::memcpy(&d, term + j, sizeof(d));
    const Floats4 e = FastExp4(__builtin_convertvector(d - shift, Floats4));
    std::memcpy(local + j, &e, sizeof(e));
  }
  for (; j < end; ++j) local[j] = FastExp(static_cast<float>(term[j] - shift));
}

inline void ExpShifted(int64_t begin, int64_t end, double shift, const double* term,
                       double* local) {
  for (int64_t j = begin; j < end; ++j) local[j] = std::exp(term[j] - shift);
}

// One entry's LOG forward pass; returns the total score, NaN when a real
// arc's weight or a final weight is NaN. A level at a time:
// gather every incoming term alpha[src] + weight (pull order), exponentiate
// the level's terms in one long loop shifted by the level's maximum finite
// term, then sum per state.
template <typename T>
double LogForwardOne(const Sizes& z, const Entry<T>& e, const LogState<T>& st) {
  const int64_t S = z.num_states, W = z.width;
  for (int64_t s = 0; s < S; ++s) {
    st.alpha[s] = s == 0 ? 0.0 : kNegInf<double>;
    st.norm[s] = 0.0;
  }
  bool nan = false;
  for (int64_t level = 0; level < z.levels; ++level) {
    const int64_t first_p = level * W;
    double level_best = kNegInf<double>;
    for (int64_t p = first_p; p < first_p + W; ++p) {
      const int64_t begin = PullBegin(e.pull_end, p), end = e.pull_end[p];
      if (begin == end) continue;
      const int32_t s = e.pos_state[p];
      double best = st.alpha[s];  // the empty prefix (start) or zero
      for (int64_t j = begin; j < end; ++j) {
        const T w = e.weight[e.pull_arc[j]];
        nan |= w != w;
        const double x = Times(st.alpha[e.pull_src[j]], static_cast<double>(w));
        st.term[j] = x;
        best = std::max(best, x);
      }
      st.best[p - first_p] = best;
      if (best < kPosInf<double>) level_best = std::max(level_best, best);
    }
    const int64_t level_begin = PullBegin(e.pull_end, first_p);
    const int64_t level_end = e.pull_end[first_p + W - 1];
    if (level_best > kNegInf<double>) {
      ExpShifted(level_begin, level_end, level_best, st.term, st.local);
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
        ExpShifted(begin, end, shift, st.term, st.local);
      }
      double sum = s == 0 ? static_cast<double>(ExpOf(static_cast<T>(st.alpha[s] - shift))) : 0.0;
      for (int64_t j = begin; j < end; ++j) sum += static_cast<double>(st.local[j]);
      st.norm[s] = 1.0 / sum;
      st.alpha[s] = shift + std::log(sum);
    }
  }
  // ⊕ over the states of alpha ⊗ final.
  double best = kNegInf<double>;
  for (int64_t s = 0; s < S; ++s) {
    const T f = e.final_weight[s];
    nan |= f != f;
    best = std::max(best, Times(st.alpha[s], static_cast<double>(f)));
  }
  if (nan) return kNaN<double>;
  if (!(best > kNegInf<double>) || !(best < kPosInf<double>)) return best;
  double sum = 0;
  for (int64_t s = 0; s < S; ++s) {
    sum += std::exp(Times(st.alpha[s], static_cast<double>(e.final_weight[s])) - best);
  }
  return best + std::log(sum);
}

// One entry's LOG gradients: d total / d weight [A] and d total / d final [S].
template <typename T>
void LogBackwardOne(const Sizes& z, const Entry<T>& e, const LogState<T>& st, double total,
                    T* arc_grad, T* final_grad, Workspace* space) {
  const int64_t S = z.num_states, A = z.num_arcs, P = z.levels * z.width;
  if (total != total || total == kPosInf<double>) {  // NaN in, or a +inf weight
    std::fill(arc_grad, arc_grad + A, kNaN<T>);
    std::fill(final_grad, final_grad + S, kNaN<T>);
    return;
  }
  if (!(total > kNegInf<double>)) {  // no successful path: the gradient is exactly 0
    std::fill(arc_grad, arc_grad + A, T(0));
    std::fill(final_grad, final_grad + S, T(0));
    return;
  }
  double* gamma = space->Take<double>(S);  // the posterior of passing through each state
  for (int64_t s = 0; s < S; ++s) {
    gamma[s] = std::exp(Times(st.alpha[s], static_cast<double>(e.final_weight[s])) - total);
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
template <typename T>
double TropicalForwardOne(const Sizes& z, const Entry<T>& e, double* alpha, int32_t* choice) {
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
      nan |= w != w;
      const double x = Times(alpha[e.pull_src[j]], static_cast<double>(w));
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
    const T f = e.final_weight[s];
    nan |= f != f;
    best = std::max(best, Times(alpha[s], static_cast<double>(f)));
  }
  return nan ? kNaN<double> : best;
}

// One entry's best path: the indicator of its arcs and of its final state,
// the lowest-numbered one with the best score.
template <typename T>
void TropicalBackwardOne(const Sizes& z, const T* final_weight, const int32_t* src,
                         const double* alpha, const int32_t* choice, double total, T* arc_grad,
                         T* final_grad) {
  const int64_t A = z.num_arcs, S = z.num_states;
  const T fill = total != total ? kNaN<T> : T(0);
  std::fill(arc_grad, arc_grad + A, fill);
  std::fill(final_grad, final_grad + S, fill);
  if (!(total > kNegInf<double>)) return;  // no path (gradient exactly 0) or NaN
  int64_t best_state = 0;
  for (int64_t s = 0; s < S; ++s) {
    if (Times(alpha[s], static_cast<double>(final_weight[s])) == total) {
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

template <ffi::DataType D>
Entry<ffi::NativeType<D>> EntryAt(const Sizes& z, int64_t i, const Floats<D>& weight,
                                  const Floats<D>& final_weight, const Ints& pos_state,
                                  const Ints& pull_end, const Ints& pull_arc,
                                  const Ints& pull_src) {
  const int64_t positions = z.levels * z.width;
  return {
      weight.typed_data() + i * z.num_arcs,     final_weight.typed_data() + i * z.num_states,
      pos_state.typed_data() + i * positions,   pull_end.typed_data() + i * positions,
      pull_arc.typed_data() + i * z.num_arcs,   pull_src.typed_data() + i * z.num_arcs,
  };
}

// Runs body(z, i, entry) for every batch entry on the pool, after checking
// the tables' sizes against each other (and src's, where given) and each
// entry's indices against its sizes.
template <ffi::DataType D, typename Body>
ffi::Error ForEachEntry(ffi::ThreadPool& pool, const Floats<D>& weight,
                        const Floats<D>& final_weight, const Ints& pos_state, const Ints& pull_end,
                        const Ints& pull_arc, const Ints& pull_src, const Ints* src,
                        const Body& body) {
  Sizes z;
  if (auto error =
          GetSizes(weight, final_weight, pos_state, pull_end, pull_arc, pull_src, src, &z);
      error.failure()) {
    return error;
  }
  std::atomic<int64_t> misfit{-1};
  ForEntries(pool, z.n, z.num_arcs, [&](int64_t i) {
    const auto e = EntryAt<D>(z, i, weight, final_weight, pos_state, pull_end, pull_arc, pull_src);
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
ffi::Error LogTotal(ffi::ThreadPool pool, Floats<D> weight, Floats<D> final_weight, Ints pos_state,
                    Ints pull_end, Ints pull_arc, Ints pull_src, ffi::ResultBuffer<D> total) {
  using T = ffi::NativeType<D>;
  return ForEachEntry<D>(
      pool, weight, final_weight, pos_state, pull_end, pull_arc, pull_src, nullptr,
      [&](const Sizes& z, int64_t i, const Entry<T>& e) {
        Workspace space(LogStateBytes<T>(z));
        total->typed_data()[i] =
            static_cast<T>(LogForwardOne<T>(z, e, TakeLogState<T>(z, &space)));
      });
}

template <ffi::DataType D>
ffi::Error LogGrad(ffi::ThreadPool pool, Floats<D> weight, Floats<D> final_weight, Ints pos_state,
                   Ints pull_end, Ints pull_arc, Ints pull_src, ffi::ResultBuffer<D> total,
                   ffi::ResultBuffer<D> arc_grad, ffi::ResultBuffer<D> final_grad) {
  using T = ffi::NativeType<D>;
  return ForEachEntry<D>(
      pool, weight, final_weight, pos_state, pull_end, pull_arc, pull_src, nullptr,
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
                         Ints pos_state, Ints pull_end, Ints pull_arc, Ints pull_src,
                         ffi::ResultBuffer<D> total) {
  using T = ffi::NativeType<D>;
  return ForEachEntry<D>(
      pool, weight, final_weight, pos_state, pull_end, pull_arc, pull_src, nullptr,
      [&](const Sizes& z, int64_t i, const Entry<T>& e) {
        Workspace space(TropicalStateBytes(z));
        const TropicalState st = TakeTropicalState(z, &space);
        total->typed_data()[i] =
            static_cast<T>(TropicalForwardOne<T>(z, e, st.alpha, st.choice));
      });
}

template <ffi::DataType D>
ffi::Error TropicalGrad(ffi::ThreadPool pool, Floats<D> weight, Floats<D> final_weight,
                        Ints pos_state, Ints pull_end, Ints pull_arc, Ints pull_src, Ints src,
                        ffi::ResultBuffer<D> total, ffi::ResultBuffer<D> arc_grad,
                        ffi::ResultBuffer<D> final_grad) {
  using T = ffi::NativeType<D>;
  return ForEachEntry<D>(
      pool, weight, final_weight, pos_state, pull_end, pull_arc, pull_src, &src,
      [&](const Sizes& z, int64_t i, const Entry<T>& e) {
        Workspace space(TropicalStateBytes(z));
        const TropicalState st = TakeTropicalState(z, &space);
        const double value = TropicalForwardOne<T>(z, e, st.alpha, st.choice);
        total->typed_data()[i] = static_cast<T>(value);
        TropicalBackwardOne<T>(z, e.final_weight, src.typed_data() + i * z.num_arcs, st.alpha,
                               st.choice, value, arc_grad->typed_data() + i * z.num_arcs,
                               final_grad->typed_data() + i * z.num_states);
      });
}

// -- KBEST: the k best path scores --------------------------------------------
//
// score[s * k + r] is the r-th best prefix score into s (best first, -inf
// past the number of prefixes), with its last arc (-1: the start's empty
// prefix, -2: none), that arc's source state and the rank it extends
// there. A state's list is a k-way merge of its incoming arcs' lists
// shifted by their weights, each sorted already (MergeBest: on vectors for
// 2 <= k <= 16, else a scan of the lists' heads or a heap), so it costs
// about its in-arcs plus k steps, not k times its in-arcs; the total
// merges the states' lists ⊗ final weights. Ties: for k = 1 or k > 16 the
// empty prefix, then the lower pull index (arc order within a state), then
// the lower rank, and the lower state in the total; on vectors a fixed
// order that is not that one. A score's gradient is 1 on its path's arcs
// and final state, traced back through the saved (arc, source, rank).

// Merges of at most 16 entries on vectors: a list is 16 lanes (two
// 8-wide vectors of doubles, best first, -inf past its end) with a
// payload per lane saying where the entry came from. The 16 best of two
// such lists are max(a, reverse(b)) lane by lane — a bitonic sequence —
// sorted by four half-cleaner stages. Equal values keep their own
// payloads, so the payloads stay a permutation; which of two tied entries
// comes first is fixed but not the lower list's.
constexpr int64_t kVectorK = 16;
typedef double Doubles8 __attribute__((vector_size(64)));
typedef int64_t Longs8 __attribute__((vector_size(64)));

struct Sixteen {
  Doubles8 value[2];
  Longs8 origin[2];
};

// One compare-exchange stage at lane distance `d` within each vector:
// lanes with (lane & d) == 0 keep the larger of the pair.
template <int d>
inline void HalfClean(Doubles8* value, Longs8* origin) {
  constexpr Longs8 partner = {0 ^ d, 1 ^ d, 2 ^ d, 3 ^ d, 4 ^ d, 5 ^ d, 6 ^ d, 7 ^ d};
  constexpr Longs8 upper = {(0 & d) == 0, (1 & d) == 0, (2 & d) == 0, (3 & d) == 0,
                            (4 & d) == 0, (5 & d) == 0, (6 & d) == 0, (7 & d) == 0};
  const Doubles8 other = __builtin_shuffle(*value, partner);
  const Longs8 other_origin = __builtin_shuffle(*origin, partner);
  const Longs8 keep = upper ? (*value >= other) : (*value <= other);
  *value = keep ? *value : other;
  *origin = keep ? *origin : other_origin;
}

inline void SortBitonic(Sixteen* x) {
  // Distance 8: across the two vectors.
  const Longs8 keep = x->value[0] >= x->value[1];
  const Doubles8 high = keep ? x->value[0] : x->value[1];
  const Doubles8 low = keep ? x->value[1] : x->value[0];
  const Longs8 high_origin = keep ? x->origin[0] : x->origin[1];
  const Longs8 low_origin = keep ? x->origin[1] : x->origin[0];
  x->value[0] = high;
  x->value[1] = low;
  x->origin[0] = high_origin;
  x->origin[1] = low_origin;
  for (int h = 0; h < 2; ++h) {
    HalfClean<4>(&x->value[h], &x->origin[h]);
    HalfClean<2>(&x->value[h], &x->origin[h]);
    HalfClean<1>(&x->value[h], &x->origin[h]);
  }
}

// x = the 16 best of x and y, sorted.
inline void MergeSixteen(Sixteen* x, const Sixteen& y) {
  constexpr Longs8 reverse = {7, 6, 5, 4, 3, 2, 1, 0};
  for (int h = 0; h < 2; ++h) {
    const Doubles8 other = __builtin_shuffle(y.value[1 - h], reverse);
    const Longs8 other_origin = __builtin_shuffle(y.origin[1 - h], reverse);
    const Longs8 keep = x->value[h] >= other;
    x->value[h] = keep ? x->value[h] : other;
    x->origin[h] = keep ? x->origin[h] : other_origin;
  }
  SortBitonic(x);
}

// Up to this many lists, each step of a merge scans the lists' heads
// (branch-free compares) instead of keeping a heap (whose branches
// mispredict).
constexpr int64_t kScanLists = 16;

struct KBestState {
  double* score;    // [(S + 1) * k]; row S: a copy of the start's own entries
  int32_t* arc;     // [S * k]
  int32_t* from;    // [S * k]
  int32_t* rank;    // [S * k]
  // Scratch for one merge of up to max(A, S) + 1 lists: list i is row
  // offset[i] of `score` (k entries) shifted by shift[i].
  int64_t* offset;
  double* shift;
  double* key;      // each list's next value
  int32_t* cursor;  // each list's next entry
  int32_t* heap;    // list ids
  double* values;   // [kScanLists * k], the lists of a small merge
};

inline size_t KBestStateBytes(const Sizes& z, int64_t k) {
  const int64_t lists = std::max({z.num_arcs, z.num_states, k}) + 1;
  return Workspace::Bytes<double>((z.num_states + 1) * k + kVectorK) +
         3 * Workspace::Bytes<int32_t>(z.num_states * k) + Workspace::Bytes<int64_t>(lists) +
         2 * Workspace::Bytes<double>(lists) + 2 * Workspace::Bytes<int32_t>(lists) +
         Workspace::Bytes<double>(kScanLists * k);
}

inline KBestState TakeKBestState(const Sizes& z, int64_t k, Workspace* space) {
  const int64_t lists = std::max({z.num_arcs, z.num_states, k}) + 1;
  KBestState st;
  st.score = space->Take<double>((z.num_states + 1) * k + kVectorK);
  st.arc = space->Take<int32_t>(z.num_states * k);
  st.from = space->Take<int32_t>(z.num_states * k);
  st.rank = space->Take<int32_t>(z.num_states * k);
  st.offset = space->Take<int64_t>(lists);
  st.shift = space->Take<double>(lists);
  st.key = space->Take<double>(lists);
  st.cursor = space->Take<int32_t>(lists);
  st.heap = space->Take<int32_t>(lists);
  st.values = space->Take<double>(kScanLists * k);
  return st;
}

// Merges the `count` lists set up in st.offset / st.shift (each list's
// entries non-increasing, -inf past its end) into their k best: emit(r, i,
// c, v) for r = 0, 1, ... while the best left is above -inf, v being list
// i's c-th entry. Returns how many were emitted. Ties go to the lower list
// (a list's entries come in order), except on vectors (see Sixteen).
template <typename Emit>
int64_t MergeBest(int64_t count, int64_t k, const KBestState& st, const Emit& emit) {
  double* key = st.key;
  if (k > 1 && k <= kVectorK) {
    // Lanes past k read the next row (`score` has kVectorK spare
    // entries at its end) and are masked to -inf.
    Longs8 in_list[2];
    for (int lane = 0; lane < 8; ++lane) {
      in_list[0][lane] = lane < k ? -1 : 0;
      in_list[1][lane] = lane + 8 < k ? -1 : 0;
    }
    constexpr Longs8 lanes[2] = {{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}};
    const Doubles8 none = {kNegInf<double>, kNegInf<double>, kNegInf<double>, kNegInf<double>,
                           kNegInf<double>, kNegInf<double>, kNegInf<double>, kNegInf<double>};
    const auto load = [&](int64_t i) {
      Sixteen list;
      const double* row = st.score + st.offset[i];
      const double shift = st.shift[i];
      for (int h = 0; h < 2; ++h) {
        Doubles8 v;
        std::memcpy(&v, row + 8 * h, sizeof(v));
        const Longs8 zero = (v == none) | (shift == kNegInf<double>);  // -inf absorbs +inf
        list.value[h] = (in_list[h] & ~zero) ? v + shift : none;
        list.origin[h] = lanes[h] + (i << 32);
      }
      return list;
    };
    Sixteen best = load(0);
    for (int64_t i = 1; i < count; ++i) {
      // A list whose best is no better than the k-th kept cannot enter.
      const double head = Times(st.score[st.offset[i]], st.shift[i]);
      const double worst = (k - 1) < 8 ? best.value[0][k - 1] : best.value[1][k - 9];
      if (head > worst) MergeSixteen(&best, load(i));
    }
    double values[kVectorK];
    int64_t origins[kVectorK];
    std::memcpy(values, best.value, sizeof(values));
    std::memcpy(origins, best.origin, sizeof(origins));
    int64_t emitted = 0;
    for (; emitted < k && values[emitted] > kNegInf<double>; ++emitted) {
      emit(emitted, origins[emitted] >> 32, origins[emitted] & 0xffffffff, values[emitted]);
    }
    return emitted;
  }
  if (count <= kScanLists) {
    // The lists' entries, shifted, copied side by side first: the loads
    // are independent of each other, and the merge's steps (each waiting
    // for the last) then read only this buffer.
    double* values = st.values;
    for (int64_t i = 0; i < count; ++i) {
      const double* row = st.score + st.offset[i];
      const double shift = st.shift[i];
      for (int64_t c = 0; c < k; ++c) values[i * k + c] = Times(row[c], shift);
    }
    double keys[kScanLists];
    int32_t taken[kScanLists];
    for (int64_t i = 0; i < count; ++i) {
      keys[i] = values[i * k];
      taken[i] = 0;
    }
    int64_t emitted = 0;
    while (emitted < k) {
      double best = kNegInf<double>;
      int64_t chosen = 0;
      for (int64_t i = 0; i < count; ++i) {
        const bool wins = keys[i] > best;  // strict: the lower list keeps a tie
        best = wins ? keys[i] : best;
        chosen = wins ? i : chosen;
      }
      if (!(best > kNegInf<double>)) break;
      st.cursor[emitted] = static_cast<int32_t>(chosen);
      st.heap[emitted] = taken[chosen];
      key[emitted++] = best;
      const int32_t next = ++taken[chosen];
      keys[chosen] = next < k ? values[chosen * k + next] : kNegInf<double>;
    }
    for (int64_t r = 0; r < emitted; ++r) emit(r, st.cursor[r], st.heap[r], key[r]);
    return emitted;
  }
  int32_t* heap = st.heap;
  const auto better = [key](int32_t a, int32_t b) {
    return key[a] > key[b] || (key[a] == key[b] && a < b);
  };
  const auto sift_down = [&](int64_t size, int64_t at) {
    const int32_t item = heap[at];
    for (;;) {
      const int64_t left = 2 * at + 1;
      if (left >= size) break;
      int64_t top = left;
      if (left + 1 < size && better(heap[left + 1], heap[left])) top = left + 1;
      if (!better(heap[top], item)) break;
      heap[at] = heap[top];
      at = top;
    }
    heap[at] = item;
  };
  int64_t size = 0;
  for (int64_t i = 0; i < count; ++i) {
    key[i] = Times(st.score[st.offset[i]], st.shift[i]);
    st.cursor[i] = 0;
    if (key[i] > kNegInf<double>) heap[size++] = static_cast<int32_t>(i);
  }
  for (int64_t at = size / 2 - 1; at >= 0; --at) sift_down(size, at);
  int64_t emitted = 0;
  while (emitted < k && size > 0) {
    const int32_t i = heap[0];
    emit(emitted++, i, st.cursor[i], key[i]);
    const int32_t next = ++st.cursor[i];
    key[i] = next < k ? Times(st.score[st.offset[i] + next], st.shift[i]) : kNegInf<double>;
    if (!(key[i] > kNegInf<double>)) {
      if (--size == 0) break;
      heap[0] = heap[size];
    }
    sift_down(size, 0);
  }
  return emitted;
}

// One entry's k best scores, best first, into out_score [k]; out_state and
// out_rank [k] say where each ends (S where none). Returns false when a
// real arc's weight or a final weight is NaN (the scores are then NaN).
template <typename T>
bool KBestForwardOne(const Sizes& z, const Entry<T>& e, int64_t k, const KBestState& st,
                     double* out_score, int32_t* out_state, int32_t* out_rank) {
  const int64_t S = z.num_states;
  std::fill(st.score, st.score + (S + 1) * k + kVectorK, kNegInf<double>);
  std::fill(st.arc, st.arc + S * k, -2);
  st.score[0] = 0.0;  // the empty prefix at the start
  st.arc[0] = -1;
  bool nan = false;
  const int64_t P = z.levels * z.width;
  for (int64_t p = 0; p < P; ++p) {
    const int64_t begin = PullBegin(e.pull_end, p), end = e.pull_end[p];
    // The next position's source lists and weights, fetched while this
    // one merges (they are scattered: the loads would wait on memory).
    if (p + 1 < P) {
      for (int64_t j = end; j < e.pull_end[p + 1]; ++j) {
        const double* row = st.score + static_cast<int64_t>(e.pull_src[j]) * k;
        __builtin_prefetch(row);
        if (k > 8) __builtin_prefetch(row + 8);
        __builtin_prefetch(e.weight + e.pull_arc[j]);
      }
    }
    if (begin == end) continue;
    const int32_t s = e.pos_state[p];
    // List 0 at the start: its own entries (the empty prefix), copied to
    // row S because the merge writes over row s. Then one list per arc.
    const int64_t first = s == 0 ? 1 : 0;
    if (first) {
      std::copy(st.score, st.score + k, st.score + S * k);
      st.offset[0] = S * k;
      st.shift[0] = 0.0;
    }
    for (int64_t j = begin; j < end; ++j) {
      const double w = static_cast<double>(e.weight[e.pull_arc[j]]);
      nan |= w != w;
      st.offset[first + j - begin] = static_cast<int64_t>(e.pull_src[j]) * k;
      st.shift[first + j - begin] = w != w ? kNegInf<double> : w;  // NaN: reported after
    }
    const auto emit = [&](int64_t r, int64_t list, int64_t c, double v) {
      const int64_t at = s * k + r;
      st.score[at] = v;
      if (list < first) {
        st.arc[at] = -1;
        st.from[at] = s;
        st.rank[at] = 0;
      } else {
        const int64_t j = begin + list - first;
        st.arc[at] = e.pull_arc[j];
        st.from[at] = e.pull_src[j];
        st.rank[at] = static_cast<int32_t>(c);
      }
    };
    const int64_t found = MergeBest(first + end - begin, k, st, emit);
    for (int64_t r = found; r < k; ++r) {
      st.score[s * k + r] = kNegInf<double>;
      st.arc[s * k + r] = -2;
    }
  }
  for (int64_t s = 0; s < S; ++s) {
    const double f = static_cast<double>(e.final_weight[s]);
    nan |= f != f;
    st.offset[s] = s * k;
    st.shift[s] = f != f ? kNegInf<double> : f;
  }
  const auto emit = [&](int64_t r, int64_t s, int64_t c, double v) {
    out_score[r] = v;
    out_state[r] = static_cast<int32_t>(s);
    out_rank[r] = static_cast<int32_t>(c);
  };
  const int64_t found = MergeBest(S, k, st, emit);
  for (int64_t r = found; r < k; ++r) {
    out_score[r] = kNegInf<double>;
    out_state[r] = static_cast<int32_t>(S);
    out_rank[r] = 0;
  }
  return !nan;
}

// The arcs of each of the k paths, [k, length] (A past a path's end), by
// tracing back from (out_state, out_rank).
inline void KBestTraceBack(const Sizes& z, int64_t k, int64_t length, const KBestState& st,
                           const int32_t* out_state, const int32_t* out_rank, int32_t* paths) {
  const int64_t S = z.num_states;
  for (int64_t r = 0; r < k; ++r) {
    int32_t* path = paths + r * length;
    std::fill(path, path + length, static_cast<int32_t>(z.num_arcs));
    int64_t s = out_state[r], rank = out_rank[r];
    for (int64_t step = 0; step < length && Below(s, S); ++step) {
      const int64_t at = s * k + rank;
      if (!Below(st.arc[at], z.num_arcs)) break;
      path[step] = st.arc[at];
      s = st.from[at];
      rank = st.rank[at];
    }
  }
}

template <ffi::DataType D>
ffi::Error KBest(ffi::ThreadPool pool, Floats<D> weight, Floats<D> final_weight, Ints pos_state,
                 Ints pull_end, Ints pull_arc, Ints pull_src, int64_t k,
                 ffi::ResultBuffer<D> scores, ffi::ResultBuffer<ffi::S32> paths,
                 ffi::ResultBuffer<ffi::S32> ends) {
  using T = ffi::NativeType<D>;
  if (k < 1) return Fail("k must be positive");
  const auto path_dims = paths->dimensions();
  const int64_t length = path_dims.size() < 2 ? 0 : path_dims.back();
  if (length < 1) return Fail("paths of no length");
  return ForEachEntry<D>(
      pool, weight, final_weight, pos_state, pull_end, pull_arc, pull_src, nullptr,
      [&](const Sizes& z, int64_t i, const Entry<T>& e) {
        Workspace space(KBestStateBytes(z, k) + Workspace::Bytes<double>(k) +
                        Workspace::Bytes<int32_t>(k));
        const KBestState st = TakeKBestState(z, k, &space);
        double* best = space.Take<double>(k);
        int32_t* rank = space.Take<int32_t>(k);
        int32_t* end_state = ends->typed_data() + i * k;
        int32_t* path = paths->typed_data() + i * k * length;
        const bool ok = KBestForwardOne<T>(z, e, k, st, best, end_state, rank);
        T* out = scores->typed_data() + i * k;
        if (!ok) {
          std::fill(out, out + k, kNaN<T>);
          std::fill(end_state, end_state + k, static_cast<int32_t>(z.num_states));
          std::fill(path, path + k * length, static_cast<int32_t>(z.num_arcs));
          return;
        }
        for (int64_t r = 0; r < k; ++r) out[r] = static_cast<T>(best[r]);
        KBestTraceBack(z, k, length, st, end_state, rank, path);
      });
}

// -- ENTROPY: the entropy of the LOG path distribution and its gradient -------
//
// After LogForwardOne (alpha, and each term's share pi_j = local[j] *
// norm[s] of its state's mass), a second forward pass carries A[s], the
// expected prefix score into s, and h[s], the entropy of the prefixes into
// s, by the mixture rule (no large number is subtracted from another):
//   A[s] = Σ pi_j (A[src] + w_j),   h[s] = Σ pi_j (h[src] + alpha[s] - t_j),
// the start's empty prefix a term of score 0. With the shares of the
// states' ends, E = E[score] and H = Σ pi_s (h[s] + Z - end_s). The
// backward pass forms the posteriors gamma as LogBackwardOne does and
// C[s] = Σ over the paths through s of p(path) · (their score from s on):
//   dH/dw_a = -gamma_a (A[src] + w_a + C[dst] / gamma[dst] - E)
//   dH/df_s = -gamma_s^final (A[s] + f_s - E),
// the covariance of the arc's use with the path score, in double.
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
  double* expected = space->Take<double>(S);  // A[s]
  double* entropy = space->Take<double>(S);   // h[s]
  double* share = space->Take<double>(S);     // each end's share of the total
  double* gamma = space->Take<double>(S);
  double* suffix = space->Take<double>(S);  // C[s]
  const double total = LogForwardOne<T>(z, e, st);
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
  std::fill(expected, expected + S, 0.0);
  std::fill(entropy, entropy + S, 0.0);
  for (int64_t p = 0; p < P; ++p) {
    const int64_t begin = PullBegin(e.pull_end, p), end = e.pull_end[p];
    if (begin == end) continue;
    const int32_t s = e.pos_state[p];
    const double alpha = st.alpha[s];
    if (!(alpha > kNegInf<double>) || !(alpha < kPosInf<double>)) continue;
    double a = 0, h = 0;
    for (int64_t j = begin; j < end; ++j) {
      const double pi = static_cast<double>(st.local[j]) * st.norm[s];
      if (!(pi > 0)) continue;
      const int32_t src = e.pull_src[j];
      a += pi * (expected[src] + static_cast<double>(e.weight[e.pull_arc[j]]));
      h += pi * (entropy[src] + (alpha - st.term[j]));
    }
    if (s == 0) h += std::exp(-alpha) * alpha;  // the empty prefix: score 0
    expected[s] = a;
    entropy[s] = h;
  }
  double mean = 0, h = 0;
  for (int64_t s = 0; s < S; ++s) {
    const double end = Times(st.alpha[s], static_cast<double>(e.final_weight[s]));
    share[s] = end > kNegInf<double> ? std::exp(end - total) : 0.0;
    if (share[s] > 0) {
      mean += share[s] * (expected[s] + static_cast<double>(e.final_weight[s]));
      h += share[s] * (entropy[s] + (total - end));
    }
  }
  *value = static_cast<T>(std::max(h, 0.0));
  for (int64_t s = 0; s < S; ++s) {
    gamma[s] = share[s];
    const double f = static_cast<double>(e.final_weight[s]);
    suffix[s] = share[s] > 0 ? share[s] * f : 0.0;
    if (share[s] > 0) final_grad[s] = static_cast<T>(-share[s] * (expected[s] + f - mean));
  }
  for (int64_t p = P - 1; p >= 0; --p) {
    const int64_t begin = PullBegin(e.pull_end, p), end = e.pull_end[p];
    if (begin == end) continue;
    const int32_t d = e.pos_state[p];
    if (!(gamma[d] > 0)) continue;
    const double g = gamma[d] * st.norm[d];
    const double ahead = suffix[d] / gamma[d];  // E[score from d on | at d]
    for (int64_t j = begin; j < end; ++j) {
      const double posterior = g * static_cast<double>(st.local[j]);
      if (!(posterior > 0)) continue;
      const int32_t a = e.pull_arc[j], src = e.pull_src[j];
      const double w = static_cast<double>(e.weight[a]);
      arc_grad[a] = static_cast<T>(-posterior * (expected[src] + w + ahead - mean));
      gamma[src] += posterior;
      suffix[src] += posterior * (w + ahead);
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
      pool, weight, final_weight, pos_state, pull_end, pull_arc, pull_src, nullptr,
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

}  // namespace

// total [N]
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjLogTotalF32, LogTotal<ffi::F32>,
                              Tables<ffi::F32>().Ret<Floats<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjLogTotalF64, LogTotal<ffi::F64>,
                              Tables<ffi::F64>().Ret<Floats<ffi::F64>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjTropicalTotalF32, TropicalTotal<ffi::F32>,
                              Tables<ffi::F32>().Ret<Floats<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjTropicalTotalF64, TropicalTotal<ffi::F64>,
                              Tables<ffi::F64>().Ret<Floats<ffi::F64>>());
// total [N], arc_grad [N, A], final_grad [N, S]
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjLogGradF32, LogGrad<ffi::F32>,
                              Tables<ffi::F32>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjLogGradF64, LogGrad<ffi::F64>,
                              Tables<ffi::F64>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Floats<ffi::F64>>());
// src [N, A] after the tables
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjTropicalGradF32, TropicalGrad<ffi::F32>,
                              Tables<ffi::F32>()
                                  .Arg<Ints>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjTropicalGradF64, TropicalGrad<ffi::F64>,
                              Tables<ffi::F64>()
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
