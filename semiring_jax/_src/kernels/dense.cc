// CPU kernels for dense intersection with a general graph (XLA FFI
// handlers): forward and backward recursions over frames, LOG and TROPICAL.
//
// Shapes: emissions [B, T, V] (f32 or f64: one handler per dtype), lengths
// [B] (int32); the graph as arrays [G, A] (src, dst, column: int32; weight)
// and [G, S] (final weight, -inf where not final; leak), G = 1 (one graph
// shared by the batch) or B (one per utterance). Every arc consumes one
// frame and adds emissions[b, t, column]; paths start in state 0. A column
// < 0 marks a padding arc, which is not read at all. Lengths are clamped to
// [0, T], states to [0, S) and columns to [0, V) (the caller checks
// concrete ones), so nothing is read outside the arrays.
//
//   SjDenseLogTotal:  log Z [B], large [B].
//   SjDenseLogGrad:   log Z [B], large [B] and the gradient of log Z with
//     respect to emissions [B, T, V], weights [B, A] and final weights
//     [B, S]: the arc posteriors, by frame and column and by arc. Exactly 0
//     past the length and where log Z is -inf.
//   SjDenseTropicalTotal, SjDenseTropicalGrad: the best path's score and
//     its 0/1 indicator (ties: the lowest-numbered best final state, then
//     the lowest-numbered best arc into each state, frame by frame).
//
// The leak (LOG only; all zeros turns it off) is Kaldi's leaky HMM: at
// every frame boundary t = 0 .. length, before the frame's arcs, the
// forward vector becomes alpha + leak * sum(alpha) (leak = epsilon times
// the initial probabilities).
//
// LOG scores are kept in double, as logs normalised per frame (the frame's
// largest is 0; the shifts summed apart), and each frame is one pass over
// the arcs in *linear* space: p = exp(alpha) per state, then
// acc[d] = sum over arcs s -> d of p[s] exp(weight - max weight)
// exp(emission - the frame's max), and alpha'[d] = log acc[d]. That is a
// multiply-add per arc and an exp and a log per state, where log-sum-exp
// costs an exp per arc. A state whose sum is below kTiny (so far below the
// frame's best that terms of its sum may have been rounded to 0) gets its
// log-sum-exp computed exactly instead, from the logs; so do all states of
// an utterance that reads a +inf (Times() keeps -inf absorbing). Posteriors
// exp(alpha + weight + emission + beta - log Z) are formed per arc from the
// logs, so they never underflow through a normalisation that favours other
// states. Float32 inputs get exp and log to float precision over the whole
// double range (ExpD8, LogD8); float64 inputs use libm.
//
// With a graph shared by three or more utterances, those that read no NaN
// or +inf run four at a time, one per SIMD lane (LogForwardLanes,
// LogBackwardLanes): each arc's indices and weight are loaded once per
// frame for the four, and each random read of a state's or column's value
// is one vector load. The arithmetic per lane is the same; the forward
// vectors kept for the backward pass are stored in the inputs' type.
//
// `large` flags an utterance that reads a finite weight or emission beyond
// 2^20 in magnitude (a mask at -1e30): double cannot keep O(1) differences
// between paths next to such numbers, so its caller recomputes that
// utterance on the portable scan, whose scores are compensated pairs.
//
// NaN in a weight, final weight, leak or an emission column that an arc
// reads (within the length) gives NaN everywhere (NaN in, NaN out). A +inf
// total gives NaN gradients (LOG).

#include "common.h"

namespace {

ffi::Error Fail(const std::string& what) { return FailIn("dense kernel", what); }

constexpr double kLarge = 1048576.0;  // 2^20, as ctc.cc

typedef double Doubles8 __attribute__((vector_size(64)));
typedef int64_t Longs8 __attribute__((vector_size(64)));

inline Doubles8 SplatD(double v) { return Doubles8{} + v; }

// exp(x) for doubles to float precision (relative error below 3e-7) over
// the whole double range: x = n ln 2 + r in double, a float exp of
// |r| < 0.35, scaled by 2^n. Exactly 0 below -700 (and for -inf).
inline Doubles8 ExpD8(Doubles8 x) {
  const Doubles8 low = SplatD(-700.0), high = SplatD(700.0);
  Doubles8 c = x < low ? low : x;
  c = c > high ? high : c;
  const Doubles8 v = c * 1.4426950408889634 + 0.5;
  const Doubles8 truncated = __builtin_convertvector(__builtin_convertvector(v, Longs8), Doubles8);
  const Doubles8 n = truncated > v ? truncated - 1.0 : truncated;  // floor
  const Doubles8 r = (c - n * 0.693145751953125) - n * 1.4286068203094172e-06;
  const Doubles8 e = __builtin_convertvector(FastExp8(__builtin_convertvector(r, Floats8)), Doubles8);
  const Longs8 bits = (__builtin_convertvector(n, Longs8) + 1023) << 52;
  Doubles8 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < low ? Doubles8{} : e * scale;
}

// log(x) for normal doubles x > 0 to float precision in absolute terms
// (below 2e-7): x = m 2^e, m in [sqrt(1/2), sqrt(2)), e ln 2 in double.
inline Doubles8 LogD8(Doubles8 x) {
  Longs8 bits;
  std::memcpy(&bits, &x, sizeof(bits));
  Longs8 exponent = ((bits >> 52) & 0x7ff) - 1023;
  const Longs8 mantissa_bits = (bits & 0xfffffffffffffLL) | (int64_t(1023) << 52);
  Doubles8 m;
  std::memcpy(&m, &mantissa_bits, sizeof(m));  // [1, 2)
  const auto big = m > 1.4142135623730951;
  m = big ? m * 0.5 : m;
  exponent = big ? exponent + 1 : exponent;
  const Floats8 log_m = FastLog8(__builtin_convertvector(m, Floats8));
  return __builtin_convertvector(exponent, Doubles8) * 0.6931471805599453 +
         __builtin_convertvector(log_m, Doubles8);
}

inline Doubles8 LoadD8(const double* p) {
  Doubles8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// out[i] = exp(in[i]) for i < n: ExpD8 for float32 inputs, libm for float64.
template <bool Float>
void ExpArray(const double* in, double* out, int64_t n) {
  int64_t i = 0;
  if constexpr (Float) {
    for (; i + 8 <= n; i += 8) {
      const Doubles8 r = ExpD8(LoadD8(in + i));
      std::memcpy(out + i, &r, sizeof(r));
    }
    if (i < n) {
      double pad[8] = {};
      std::copy(in + i, in + n, pad);
      const Doubles8 r = ExpD8(LoadD8(pad));
      std::memcpy(pad, &r, sizeof(r));
      std::copy(pad, pad + (n - i), out + i);
    }
    return;
  }
  for (; i < n; ++i) out[i] = std::exp(in[i]);
}

// x[i] <- exp(x[i]) in float arithmetic (0 below -86, inf above 88).
inline void ExpViaFloat(double* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const Floats8 f = __builtin_convertvector(LoadD8(x + i), Floats8);
    const Floats8 big = Floats8{} + 88.0f;
    const Floats8 e = FastExp8(f);
    const Doubles8 r = __builtin_convertvector(f > big ? Floats8{} + kPosInf<float> : e, Doubles8);
    std::memcpy(x + i, &r, sizeof(r));
  }
  for (; i < n; ++i) x[i] = x[i] > 88.0 ? kPosInf<double> : FastExp(static_cast<float>(x[i]));
}

template <bool Float>
double ExpOne(double x) {
  if constexpr (Float) {
    double value = 0;
    ExpArray<true>(&x, &value, 1);
    return value;
  }
  return std::exp(x);
}

// Below this a linear sum may have lost terms to rounding (ExpD8 flushes
// below e^-700, libm below e^-745): such states are summed exactly, in logs.
constexpr double kTiny = 1e-200;
// Posteriors are formed as a per-state factor times a linear term up to
// this factor: the terms that underflow (below 1e-300) then give
// posteriors below 1e-100.
constexpr double kHuge = 1e200;

// out[i] = log(acc[i]) where acc[i] >= kTiny; left alone elsewhere.
template <bool Float>
void LogWhereLarge(const double* acc, double* out, int64_t n) {
  int64_t i = 0;
  if constexpr (Float) {
    for (; i + 8 <= n; i += 8) {
      const Doubles8 a = LoadD8(acc + i);
      const auto ok = a >= kTiny;
      const Doubles8 r = LogD8(ok ? a : SplatD(1.0));
      const Doubles8 old = LoadD8(out + i);
      const Doubles8 merged = ok ? r : old;
      std::memcpy(out + i, &merged, sizeof(merged));
    }
  }
  for (; i < n; ++i) {
    if (acc[i] >= kTiny) {
      if constexpr (Float) {
        double pad[8] = {acc[i], 1, 1, 1, 1, 1, 1, 1};
        const Doubles8 r = LogD8(LoadD8(pad));
        out[i] = r[0];
      } else {
        out[i] = std::log(acc[i]);
      }
    }
  }
}

// log(exp(a) + exp(b)); -inf absorbing, +inf dominating.
inline double LogAdd(double a, double b) {
  const double m = std::max(a, b);
  if (!(m > kNegInf<double>) || m == kPosInf<double>) return m;
  return m + std::log1p(std::exp(std::min(a, b) - m));
}

// Subtracts the largest finite entry of v[0..n) and returns it; 0 (leaving
// v alone) when none is finite.
inline double Normalise(int64_t n, double* v) {
  double m = kNegInf<double>;
  for (int64_t s = 0; s < n; ++s) {
    if (v[s] < kPosInf<double>) m = std::max(m, v[s]);
  }
  if (!(m > kNegInf<double>)) return 0.0;
  for (int64_t s = 0; s < n; ++s) v[s] -= m;
  return m;
}

// The largest of x[0..n) below +inf, as double (-inf if none); NaN is
// skipped (callers find it apart).
template <typename T>
double FiniteMax(const T* x, int64_t n) {
  Doubles8 top = SplatD(kNegInf<double>);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Doubles8 v;
    if constexpr (std::is_same_v<T, float>) {
      Floats8 f;
      std::memcpy(&f, x + i, sizeof(f));
      v = __builtin_convertvector(f, Doubles8);
    } else {
      v = LoadD8(x + i);
    }
    v = v < kPosInf<double> ? v : SplatD(kNegInf<double>);
    top = v > top ? v : top;
  }
  double m = kNegInf<double>;
  for (int j = 0; j < 8; ++j) m = std::max(m, top[j]);
  for (; i < n; ++i) {
    const double v = static_cast<double>(x[i]);
    if (v < kPosInf<double>) m = std::max(m, v);
  }
  return m;
}

// What a frame's new scores came to.
struct Settled {
  double shift = 0;  // subtracted from every score
  bool alive = false;  // some score above -inf
};

// out[s] = log(acc[s]), or exact(s) where acc[s] < kTiny (everywhere when
// `all_exact`), normalised by the largest finite one (returned as the
// shift); p = exp(out) unless `all_exact`. One vector pass for the logs,
// the maximum and the exps, scalar work only where a sum was tiny.
template <bool Float, typename Exact>
Settled Settle(int64_t S, bool all_exact, const double* acc, double* out, double* p,
               const Exact& exact) {
  Settled r;
  if (all_exact) {
    for (int64_t s = 0; s < S; ++s) {
      out[s] = exact(s);
      r.alive |= out[s] > kNegInf<double>;
    }
    r.shift = Normalise(S, out);
    return r;
  }
  double m = kNegInf<double>;
  int64_t s = 0;
  if constexpr (Float) {
    Doubles8 top = SplatD(kNegInf<double>);
    for (; s + 8 <= S; s += 8) {
      const Doubles8 a = LoadD8(acc + s);
      const auto ok = a >= kTiny;
      Doubles8 v = LogD8(ok ? a : SplatD(1.0));
      v = ok ? v : SplatD(kNegInf<double>);
      std::memcpy(out + s, &v, sizeof(v));
      top = v > top ? v : top;
      bool all = true;
      for (int j = 0; j < 8; ++j) all &= a[j] >= kTiny;
      if (!all) {
        for (int64_t i = s; i < s + 8; ++i) {
          if (!(acc[i] >= kTiny)) m = std::max(m, out[i] = exact(i));
        }
      }
    }
    for (int j = 0; j < 8; ++j) m = std::max(m, top[j]);
  }
  for (; s < S; ++s) {
    out[s] = acc[s] >= kTiny ? std::log(acc[s]) : exact(s);
    m = std::max(m, out[s]);
  }
  if (!(m > kNegInf<double>)) return r;
  r.alive = true;
  r.shift = m;
  for (int64_t i = 0; i < S; ++i) out[i] -= m;
  ExpArray<Float>(out, p, S);
  return r;
}

// NaN, +inf or a finite value beyond kLarge among the numbers read.
struct Reads {
  bool nan = false, inf = false, large = false;

  void Add(double x) {
    nan |= x != x;
    inf |= x == kPosInf<double>;
    large |= std::fabs(x) > kLarge && std::fabs(x) < kPosInf<double>;
  }
};

// -- the graph ------------------------------------------------------------------

// One graph's live arcs (weight above -inf, column >= 0), grouped by
// destination (forward) and by source (backward), each group in arc order.
// Groups are laid out, and visited, in order of size (`in_order`,
// `out_order`): consecutive states then loop over as many arcs, which the
// branch predictor learns, where random degrees mispredict every exit.
struct Graph {
  int64_t num_states = 0, num_arcs = 0;
  std::vector<int64_t> in_begin, in_end, out_begin, out_end;  // [S], by state
  std::vector<int32_t> in_order, out_order;                   // states by group size
  std::vector<int32_t> in_arc, in_src, in_col, out_arc, out_dst, out_col;
  std::vector<double> in_lw, in_w, out_lw, out_w;  // weight - max, exp of it
  std::vector<double> in_weight;                    // as given (TROPICAL)
  std::vector<double> final_weight, leak;          // [S]; leak empty if off
  std::vector<int32_t> columns;                    // distinct columns read
  double max_weight = 0;
  Reads reads;  // what its weights, final weights and leak hold
};

template <typename T>
void BuildGraph(const int32_t* src, const int32_t* dst, const int32_t* col, const T* weight,
                const T* final_weight, const T* leak, int64_t A, int64_t S, int64_t V, Graph* g) {
  g->num_states = S;
  g->num_arcs = A;
  auto state = [S](int32_t s) { return std::clamp<int64_t>(s, 0, S - 1); };
  std::vector<bool> used(V, false);
  std::vector<int32_t> live;
  live.reserve(A);
  for (int64_t a = 0; a < A; ++a) {
    if (col[a] < 0) continue;
    used[std::min<int64_t>(col[a], V - 1)] = true;
    const double w = static_cast<double>(weight[a]);
    g->reads.Add(w);
    if (w > kNegInf<double>) live.push_back(static_cast<int32_t>(a));
  }
  for (int64_t v = 0; v < V; ++v) {
    if (used[v]) g->columns.push_back(static_cast<int32_t>(v));
  }
  double wm = kNegInf<double>;
  for (int32_t a : live) {
    const double w = static_cast<double>(weight[a]);
    if (w < kPosInf<double>) wm = std::max(wm, w);
  }
  g->max_weight = wm > kNegInf<double> ? wm : 0.0;
  g->final_weight.resize(S);
  bool leaky = false;
  for (int64_t s = 0; s < S; ++s) {
    g->final_weight[s] = static_cast<double>(final_weight[s]);
    g->reads.Add(g->final_weight[s]);
    const double l = static_cast<double>(leak[s]);
    g->reads.nan |= l != l;
    leaky |= l != 0;
  }
  if (leaky) {
    g->leak.resize(S);
    for (int64_t s = 0; s < S; ++s) g->leak[s] = std::max(static_cast<double>(leak[s]), 0.0);
  }
  // Counting sorts, stable: each group keeps arc order (the tie rule).
  auto group = [&](bool by_dst, std::vector<int64_t>* begin, std::vector<int64_t>* end,
                   std::vector<int32_t>* order, std::vector<int32_t>* arc,
                   std::vector<int32_t>* other, std::vector<int32_t>* column,
                   std::vector<double>* lw, std::vector<double>* w) {
    std::vector<int64_t> size(S, 0);
    for (int32_t a : live) ++size[state(by_dst ? dst[a] : src[a])];
    order->resize(S);
    for (int64_t s = 0; s < S; ++s) (*order)[s] = static_cast<int32_t>(s);
    std::stable_sort(order->begin(), order->end(),
                     [&](int32_t x, int32_t y) { return size[x] < size[y]; });
    begin->assign(S, 0);
    end->assign(S, 0);
    int64_t at = 0;
    for (int32_t s : *order) {
      (*begin)[s] = (*end)[s] = at;
      at += size[s];
    }
    const size_t n = live.size();
    arc->resize(n);
    other->resize(n);
    column->resize(n);
    lw->resize(n);
    w->resize(n);
    for (int32_t a : live) {
      const int64_t k = (*end)[state(by_dst ? dst[a] : src[a])]++;
      (*arc)[k] = a;
      (*other)[k] = static_cast<int32_t>(state(by_dst ? src[a] : dst[a]));
      (*column)[k] = std::min<int32_t>(col[a], static_cast<int32_t>(V - 1));
      (*lw)[k] = static_cast<double>(weight[a]) - g->max_weight;
      (*w)[k] = std::exp((*lw)[k]);
    }
  };
  group(true, &g->in_begin, &g->in_end, &g->in_order, &g->in_arc, &g->in_src, &g->in_col, &g->in_lw, &g->in_w);
  g->in_weight.resize(g->in_arc.size());
  for (size_t k = 0; k < g->in_arc.size(); ++k) {
    g->in_weight[k] = static_cast<double>(weight[g->in_arc[k]]);
  }
  group(false, &g->out_begin, &g->out_end, &g->out_order, &g->out_arc, &g->out_dst, &g->out_col, &g->out_lw, &g->out_w);
}

// -- one frame's emissions --------------------------------------------------

// What an utterance reads, its graph's numbers and its emissions within
// the length.
template <typename T>
Reads ReadsOf(const Graph& g, const T* e, int64_t V, int64_t length) {
  Reads r = g.reads;
  if (static_cast<int64_t>(g.columns.size()) < V) {
    for (int64_t t = 0; t < length; ++t) {
      for (int32_t c : g.columns) r.Add(static_cast<double>(e[t * V + c]));
    }
    return r;
  }
  // Every column is read: one branch-free pass over the frames.
  bool nan = false, inf = false, large = false;
  for (int64_t i = 0; i < length * V; ++i) {
    const T x = e[i], magnitude = std::fabs(x);
    nan |= x != x;
    inf |= x == kPosInf<T>;
    large |= magnitude > T(kLarge) && magnitude < kPosInf<T>;
  }
  r.nan |= nan;
  r.inf |= inf;
  r.large |= large;
  return r;
}

// le[c] = e[t, c] - m and lin[c] = exp(le[c]) for the graph's columns,
// m the frame's largest finite one (0 if none); returns m.
template <typename T>
double Frame(const Graph& g, const T* row, int64_t V, double* le, double* lin) {
  double m = kNegInf<double>;
  if (static_cast<int64_t>(g.columns.size()) == V) {
    m = FiniteMax(row, V);
  } else {
    for (int32_t c : g.columns) {
      const double x = static_cast<double>(row[c]);
      if (x < kPosInf<double>) m = std::max(m, x);
    }
  }
  if (!(m > kNegInf<double>)) m = 0.0;
  constexpr bool kFloat = std::is_same_v<T, float>;
  if (static_cast<int64_t>(g.columns.size()) * 2 >= V) {  // most columns: all of them
    for (int64_t v = 0; v < V; ++v) le[v] = static_cast<double>(row[v]) - m;
    ExpArray<kFloat>(le, lin, V);
  } else {
    for (int32_t c : g.columns) {
      le[c] = static_cast<double>(row[c]) - m;
      lin[c] = ExpOne<kFloat>(le[c]);
    }
  }
  return m;
}

// -- LOG ----------------------------------------------------------------------

// log Σ exp(x[i]) over n terms; -inf absorbing, +inf dominating.
inline double LogSumExp(const double* x, int64_t n) {
  double m = kNegInf<double>;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  if (!(m > kNegInf<double>) || m == kPosInf<double>) return m;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - m);
  return m + std::log(sum);
}

// Scratch for one utterance's recursions.
struct Buffers {
  double *p, *acc, *le, *lin, *terms;
  static size_t Bytes(int64_t S, int64_t V, int64_t max_degree) {
    return 2 * Workspace::Bytes<double>(S) + 2 * Workspace::Bytes<double>(V) +
           Workspace::Bytes<double>(max_degree);
  }
  Buffers(int64_t S, int64_t V, int64_t max_degree, Workspace* space)
      : p(space->Take<double>(S)),
        acc(space->Take<double>(S)),
        le(space->Take<double>(V)),
        lin(space->Take<double>(V)),
        terms(space->Take<double>(max_degree)) {}
};

int64_t MaxDegree(const Graph& g) {
  int64_t d = 1;
  for (int64_t s = 0; s < g.num_states; ++s) {
    d = std::max(d, g.in_end[s] - g.in_begin[s]);
    d = std::max(d, g.out_end[s] - g.out_begin[s]);
  }
  return d;
}

// One group's log-sum-exp, exactly: log Σ over arcs k in [begin, end) of
// exp(from[other[k]] + lw[k] + le[col[k]]). With lanes (below), from and le
// hold `lanes` utterances' values per state and column, and lane j is read.
inline double ExactGroup(int64_t begin, int64_t end, const int32_t* other, const int32_t* col,
                         const double* lw, const double* from, const double* le, double* terms,
                         int64_t lanes = 1, int64_t j = 0) {
  for (int64_t k = begin; k < end; ++k) {
    terms[k - begin] = Times(Times(from[other[k] * lanes + j], lw[k]), le[col[k] * lanes + j]);
  }
  return LogSumExp(terms, end - begin);
}

// v <- log(exp(v) + leak * Σ exp(v)) for normalised v [S] (linear values in
// p on entry, updated); exact where the linear value is tiny.
template <bool Float>
void Leak(const Graph& g, bool exact, double* v, double* p) {
  const int64_t S = g.num_states;
  if (exact) {
    const double log_sum = LogSumExp(v, S);
    for (int64_t s = 0; s < S; ++s) v[s] = LogAdd(v[s], Times(std::log(g.leak[s]), log_sum));
    return;
  }
  double sum = 0;
  for (int64_t s = 0; s < S; ++s) sum += p[s];
  for (int64_t s = 0; s < S; ++s) p[s] += g.leak[s] * sum;
  // Where p is tiny the linear sum may have lost terms: exact there.
  for (int64_t s = 0; s < S; ++s) {
    if (p[s] < kTiny) {
      v[s] = LogAdd(v[s], Times(std::log(g.leak[s]), std::log(sum)));
    }
  }
  LogWhereLarge<Float>(p, v, S);
}

// The forward pass of one utterance: log Z. alpha [(length + 1) S] receives
// the normalised logs after each frame's leak, offset [length + 1] their
// shifts (both may be null: then `roll` [2 S] holds the last two frames).
template <typename T>
double LogForward(const Graph& g, const T* e, int64_t V, int64_t length, bool exact,
                  double* alpha, double* offset, double* roll, Buffers* buf) {
  constexpr bool kFloat = std::is_same_v<T, float>;
  const int64_t S = g.num_states;
  auto row = [&](int64_t t) { return alpha ? alpha + t * S : roll + (t % 2) * S; };
  double shift = 0;
  double* a = row(0);
  std::fill(a, a + S, kNegInf<double>);
  a[0] = 0;
  ExpArray<kFloat>(a, buf->p, S);
  if (!g.leak.empty()) Leak<kFloat>(g, exact, a, buf->p);
  if (offset) offset[0] = 0;
  for (int64_t t = 0; t < length; ++t) {
    const double em = Frame(g, e + t * V, V, buf->le, buf->lin);
    double* next = row(t + 1);
    const double* from = row(t);
    if (!exact) {
      const double* __restrict p = buf->p;
      const double* __restrict lin = buf->lin;
      const double* __restrict w = g.in_w.data();
      const int32_t* __restrict src = g.in_src.data();
      const int32_t* __restrict col = g.in_col.data();
      double* __restrict acc = buf->acc;
      for (const int32_t d : g.in_order) {
        // Four partial sums: the adds do not wait on each other.
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        int64_t k = g.in_begin[d];
        const int64_t end = g.in_end[d];
        for (; k + 4 <= end; k += 4) {
          s0 += p[src[k]] * w[k] * lin[col[k]];
          s1 += p[src[k + 1]] * w[k + 1] * lin[col[k + 1]];
          s2 += p[src[k + 2]] * w[k + 2] * lin[col[k + 2]];
          s3 += p[src[k + 3]] * w[k + 3] * lin[col[k + 3]];
        }
        for (; k < end; ++k) s0 += p[src[k]] * w[k] * lin[col[k]];
        acc[d] = (s0 + s1) + (s2 + s3);
      }
    }
    const Settled r = Settle<kFloat>(S, exact, buf->acc, next, buf->p, [&](int64_t d) {
      return ExactGroup(g.in_begin[d], g.in_end[d], g.in_src.data(), g.in_col.data(),
                        g.in_lw.data(), from, buf->le, buf->terms);
    });
    if (!r.alive) return kNegInf<double>;
    shift += g.max_weight + em + r.shift;
    if (offset) offset[t + 1] = shift;
    if (!g.leak.empty()) Leak<kFloat>(g, exact, next, buf->p);
  }
  const double* last = row(length);
  for (int64_t s = 0; s < S; ++s) buf->acc[s] = Times(last[s], g.final_weight[s]);
  return shift + LogSumExp(buf->acc, S);
}

// The backward pass: adds the posteriors into ge [T, V], gw [n] (by live
// arc in source order: g.out_arc maps them to arcs; only with kWeights,
// which costs a load and a store per arc and frame) and gf [S] (zeros on
// entry; double accumulators). log_z is finite.
template <typename T, bool kWeights>
void LogBackward(const Graph& g, const T* e, int64_t V, int64_t length, bool exact,
                 const double* alpha, const double* offset, double log_z, T* ge, double* row, double* gw,
                 double* gf, Workspace* space, Buffers* buf) {
  constexpr bool kFloat = std::is_same_v<T, float>;
  const int64_t S = g.num_states;
  const int64_t n = static_cast<int64_t>(g.out_arc.size());
  double* beta = space->Take<double>(S);
  double* here = space->Take<double>(S);
  double* x = space->Take<double>(n);
  double* q = buf->p;
  // gf: the posterior of ending in s.
  const double* last = alpha + length * S;
  for (int64_t s = 0; s < S; ++s) {
    gf[s] = std::exp(Times(Times(last[s], g.final_weight[s]), offset[length] - log_z));
  }
  for (int64_t s = 0; s < S; ++s) beta[s] = g.final_weight[s];
  if (!g.leak.empty()) {
    // beta_T = final + leak-weighted sum of final, for every state.
    for (int64_t s = 0; s < S; ++s) here[s] = Times(std::log(g.leak[s]), g.final_weight[s]);
    const double into = LogSumExp(here, S);
    for (int64_t s = 0; s < S; ++s) beta[s] = LogAdd(beta[s], into);
  }
  double beta_shift = Normalise(S, beta);
  if (!exact) ExpArray<kFloat>(beta, q, S);
  for (int64_t t = length - 1; t >= 0; --t) {
    const double em = Frame(g, e + t * V, V, buf->le, buf->lin);
    const double* a = alpha + t * S;
    const double k_t = offset[t] + g.max_weight + em + beta_shift - log_z;
    // The posterior of arc k (s -> d) is exp(a[s] + k_t) w[k] lin[c] q[d]:
    // the backward sum's own term times a factor per state. Where that
    // factor is huge, the term may have underflowed: exact there, from logs.
    const int32_t* __restrict dst = g.out_dst.data();
    const int32_t* __restrict col = g.out_col.data();
    const double* __restrict lw = g.out_lw.data();
    const double* __restrict w = g.out_w.data();
    const double* __restrict le = buf->le;
    const double* __restrict lin = buf->lin;
    double* __restrict acc = buf->acc;
    // This frame's column posteriors, summed in double, then written out.
    double* __restrict ge_row = row;
    const bool all_columns = static_cast<int64_t>(g.columns.size()) == V;
    if (all_columns) {
      std::fill(row, row + V, 0.0);
    } else {
      for (int32_t c : g.columns) row[c] = 0.0;
    }
    double* __restrict factor = here;  // free until the sums are logged
    for (int64_t s = 0; s < S; ++s) factor[s] = a[s] + k_t;
    if (!exact) ExpArray<kFloat>(factor, factor, S);
    for (const int32_t s : g.out_order) {
      const int64_t begin = g.out_begin[s], end = g.out_end[s];
      if (exact || !(factor[s] <= kHuge)) {
        const double from = a[s] + k_t;
        for (int64_t k = begin; k < end; ++k) {
          x[k] = Times(Times(Times(from, lw[k]), le[col[k]]), beta[dst[k]]);
        }
        ExpArray<kFloat>(x + begin, x + begin, end - begin);
        double sum = 0;
        for (int64_t k = begin; k < end; ++k) {
          const double post = std::min(x[k], 1.0);
          if constexpr (kWeights) gw[k] += post;
          ge_row[col[k]] += post;
          if (!exact) sum += w[k] * lin[col[k]] * q[dst[k]];
        }
        acc[s] = sum;
        continue;
      }
      const double f = factor[s];
      double s0 = 0, s1 = 0;
      int64_t k = begin;
      for (; k + 2 <= end; k += 2) {
        const double u0 = w[k] * lin[col[k]] * q[dst[k]];
        const double u1 = w[k + 1] * lin[col[k + 1]] * q[dst[k + 1]];
        s0 += u0;
        s1 += u1;
        if constexpr (kWeights) {
          gw[k] += u0 * f;
          gw[k + 1] += u1 * f;
        }
        ge_row[col[k]] += u0 * f;
        ge_row[col[k + 1]] += u1 * f;
      }
      for (; k < end; ++k) {
        const double u = w[k] * lin[col[k]] * q[dst[k]];
        s0 += u;
        if constexpr (kWeights) gw[k] += u * f;
        ge_row[col[k]] += u * f;
      }
      acc[s] = s0 + s1;
    }
    T* out = ge + t * V;
    if (all_columns) {
      for (int64_t v = 0; v < V; ++v) out[v] = static_cast<T>(row[v]);
    } else {
      for (int32_t c : g.columns) out[c] = static_cast<T>(row[c]);
    }
    if (t == 0) break;
    // q, read by the loop above, now becomes exp(beta_t).
    const Settled r = Settle<kFloat>(S, exact, buf->acc, here, q, [&](int64_t s) {
      return ExactGroup(g.out_begin[s], g.out_end[s], g.out_dst.data(), g.out_col.data(),
                        g.out_lw.data(), beta, buf->le, buf->terms);
    });
    beta_shift += g.max_weight + em + r.shift;
    if (!g.leak.empty() && exact) {
      // beta_t = beta'_t + Σ_r leak[r] beta'_t[r], the same for every state.
      for (int64_t s = 0; s < S; ++s) buf->acc[s] = Times(std::log(g.leak[s]), here[s]);
      const double into = LogSumExp(buf->acc, S);
      for (int64_t s = 0; s < S; ++s) here[s] = LogAdd(here[s], into);
      beta_shift += Normalise(S, here);
    } else if (!g.leak.empty()) {  // the same in linear terms, q = exp(beta'_t)
      double into = 0;
      for (int64_t s = 0; s < S; ++s) into += g.leak[s] * q[s];
      for (int64_t s = 0; s < S; ++s) q[s] += into;
      for (int64_t s = 0; s < S; ++s) {
        if (!(q[s] >= kTiny)) here[s] = LogAdd(here[s], std::log(into));
      }
      LogWhereLarge<kFloat>(q, here, S);
    }
    std::swap(beta, here);
  }
}

// -- LOG, several utterances at once -------------------------------------------
//
// With a shared graph, utterances that read no NaN or +inf run in groups of
// kLanes: every array of scores is [S][kLanes] (lane j holds the group's
// j-th utterance), so that one pass over the arcs serves the whole group.
// Each arc's indices and weight are loaded once per frame instead of once
// per utterance, and p[src], lin[col], q[dst] are one vector load each
// instead of a random scalar one. The arithmetic of each lane is that of
// LogForward and LogBackward above, the exact fallbacks included. A lane
// past its length reads emissions 0 and is neither checked nor written
// (its values are never used); a lane whose sums all came to nothing is
// dead (log Z = -inf, its gradient 0).

constexpr int64_t kLanes = 4;
typedef Doubles4 Lanes;  // one value per lane
static_assert(sizeof(Lanes) == kLanes * sizeof(double));

inline Lanes LoadLanes(const double* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void StoreLanes(double* p, Lanes v) { std::memcpy(p, &v, sizeof(v)); }

// The utterances of one group; a lane without one has entry -1, length 0.
template <typename T>
struct Group {
  int64_t entry[kLanes], length[kLanes];
  const T* e[kLanes];  // emissions [T, V] of each lane's utterance

  int64_t MaxLength() const { return *std::max_element(length, length + kLanes); }
};

// Arrays of lanes start on a cache line (64 bytes), so that no entry's
// kLanes values straddle two lines: the size to reserve, and the array.
constexpr int64_t kLine = 64 / sizeof(double);

size_t LaneBytes(int64_t count) { return Workspace::Bytes<double>(count + kLine); }

double* TakeLanes(Workspace* space, int64_t count) {
  double* raw = space->Take<double>(count + kLine);
  const uintptr_t at = reinterpret_cast<uintptr_t>(raw);
  return reinterpret_cast<double*>((at + 63) / 64 * 64);
}

// Scratch for one group's recursions: the Buffers' arrays with kLanes
// values per entry (lin [V][2 kLanes]: the backward pass keeps each
// column's posteriors beside its emissions, on the same cache line), and
// one lane's frame.
struct LaneBuffers {
  double *p, *acc, *le, *lin, *le_one, *lin_one, *terms;
  static size_t Bytes(int64_t S, int64_t V, int64_t max_degree) {
    return 2 * LaneBytes(S * kLanes) + 3 * LaneBytes(V * kLanes) +
           2 * Workspace::Bytes<double>(V) + Workspace::Bytes<double>(max_degree);
  }
  LaneBuffers(int64_t S, int64_t V, int64_t max_degree, Workspace* space)
      : p(TakeLanes(space, S * kLanes)),
        acc(TakeLanes(space, S * kLanes)),
        le(TakeLanes(space, V * kLanes)),
        lin(TakeLanes(space, 2 * V * kLanes)),
        le_one(space->Take<double>(V)),
        lin_one(space->Take<double>(V)),
        terms(space->Take<double>(max_degree)) {}
};

// Frame t of every lane into buf->le ([V][kLanes], the graph's columns),
// buf->lin (column c's lanes at c * stride) and em [kLanes] (as Frame); 0
// (and 1) for a lane past its length.
template <typename T>
void FrameLanes(const Graph& g, const Group<T>& group, int64_t t, int64_t V, int64_t stride,
                LaneBuffers* buf, double* em) {
  for (int64_t j = 0; j < kLanes; ++j) {
    const bool reads = t < group.length[j];
    em[j] = reads ? Frame(g, group.e[j] + t * V, V, buf->le_one, buf->lin_one) : 0.0;
    for (const int32_t c : g.columns) {
      buf->le[c * kLanes + j] = reads ? buf->le_one[c] : 0.0;
      buf->lin[c * stride + j] = reads ? buf->lin_one[c] : 1.0;
    }
  }
}

// out[i] = log(in[i]) where in[i] >= kTiny, -inf elsewhere, for i < n.
template <bool Float>
void LogOrNegInf(const double* in, double* out, int64_t n) {
  std::fill(out, out + n, kNegInf<double>);
  LogWhereLarge<Float>(in, out, n);
}

// The leaky HMM after a frame, for lanes: kNone; kInto, the forward's
// p += leak * Σ p; or kFrom, the backward's q += Σ leak q.
enum class LeakMode { kNone, kInto, kFrom };

// Leak for lanes (forward): v <- log(exp(v) + leak * Σ exp(v)) per lane,
// p = exp(v) on entry, updated; exact where p is tiny in a checked lane.
template <bool Float>
void LeakLanes(const Graph& g, const bool* checked, double* v, double* p) {
  const int64_t S = g.num_states;
  Lanes sum{};
  for (int64_t s = 0; s < S; ++s) sum += LoadLanes(p + s * kLanes);
  for (int64_t s = 0; s < S; ++s) {
    StoreLanes(p + s * kLanes, LoadLanes(p + s * kLanes) + g.leak[s] * sum);
  }
  for (int64_t i = 0; i < S * kLanes; ++i) {
    const int64_t j = i % kLanes;
    if (p[i] < kTiny && checked[j]) {
      v[i] = LogAdd(v[i], Times(std::log(g.leak[i / kLanes]), std::log(sum[j])));
    }
  }
  LogWhereLarge<Float>(p, v, S * kLanes);
}

// The backward pass's leak for lanes: q <- q + Σ_r leak[r] q[r] per lane
// (the same for every state), v = log q; exact where q is tiny in a
// checked lane.
template <bool Float>
void LeakFromLanes(const Graph& g, const bool* checked, double* v, double* q) {
  const int64_t S = g.num_states, n = S * kLanes;
  Lanes into{};
  for (int64_t s = 0; s < S; ++s) into += g.leak[s] * LoadLanes(q + s * kLanes);
  for (int64_t s = 0; s < S; ++s) StoreLanes(q + s * kLanes, LoadLanes(q + s * kLanes) + into);
  for (int64_t i = 0; i < n; ++i) {
    if (!(q[i] >= kTiny) && checked[i % kLanes]) v[i] = LogAdd(v[i], std::log(into[i % kLanes]));
  }
  LogWhereLarge<Float>(q, v, n);
}

// SettleLanes' fast case with a leak: p = acc / largest (exact where acc
// is tiny), the leak mixed into p, then out = log p; where p is still tiny
// the leak's share is added to the exact log instead. Two vector passes
// over the states; scalar work only in blocks that hold a tiny value.
template <bool Float, typename Exact>
void SettleLeaking(const Graph& g, LeakMode leak, const bool* checked, const double* acc,
                   const double* shift, Lanes scale, double* out, double* p, const Exact& exact) {
  const int64_t S = g.num_states;
  const bool from = leak == LeakMode::kFrom;
  Lanes sum{};  // kInto: Σ p; kFrom: Σ leak p
  for (int64_t s = 0; s < S; ++s) {
    const Lanes a = LoadLanes(acc + s * kLanes);
    Lanes v = a * scale;
    bool all = true;
    for (int64_t j = 0; j < kLanes; ++j) all &= a[j] >= kTiny;
    if (!all) {
      for (int64_t j = 0; j < kLanes; ++j) {
        if (a[j] >= kTiny) continue;
        const double x = checked[j] ? exact(s, j) - shift[j] : kNegInf<double>;
        out[s * kLanes + j] = x;
        v[j] = ExpOne<Float>(x);
      }
    }
    StoreLanes(p + s * kLanes, v);
    sum += (from ? g.leak[s] : 1.0) * v;
  }
  Lanes log_sum;
  for (int64_t j = 0; j < kLanes; ++j) log_sum[j] = std::log(sum[j]);
  for (int64_t s = 0; s < S; ++s) {
    const Lanes v = LoadLanes(p + s * kLanes) + (from ? sum : g.leak[s] * sum);
    StoreLanes(p + s * kLanes, v);
    bool all = true;
    for (int64_t j = 0; j < kLanes; ++j) all &= v[j] >= kTiny;
    if (all) continue;
    for (int64_t j = 0; j < kLanes; ++j) {
      if (v[j] >= kTiny) continue;
      const int64_t i = s * kLanes + j;
      // Exact, or the log of a sum the scale took below kTiny.
      const double before = acc[i] >= kTiny ? std::log(acc[i]) - shift[j] : out[i];
      const double added = from ? log_sum[j] : Times(std::log(g.leak[s]), log_sum[j]);
      out[i] = checked[j] ? LogAdd(before, added) : before;
    }
  }
  LogWhereLarge<Float>(p, out, S * kLanes);
}

// Settle for lanes: out = log(acc), or exact(state, lane) where acc is tiny
// in a lane marked `checked` (-inf in the others), normalised per lane by
// its largest (top [kLanes], -inf for a lane with none); p = exp(out).
// largest [kLanes]: each lane's largest acc. Where a lane's largest is not
// tiny its shift is log(largest) and p = acc / largest, exact in double;
// then one pass over the states does it all. A tiny sum's true value is
// below kTiny plus terms that underflowed, so below the largest: the shift
// stays the maximum. Otherwise (every sum of a checked lane tiny) a slower
// pass finds the maximum of the logs and exps them.
//
// `leak` (LeakMode, Kaldi's leaky HMM after the normalisation): in the fast
// case it is mixed in linear terms before the logs are taken, so that the
// frame costs one log per state either way.

template <bool Float, typename Exact>
void SettleLanes(const Graph& g, LeakMode leak, const bool* checked, const double* acc,
                 Lanes largest, double* out, double* p, const Exact& exact, double* top) {
  const int64_t S = g.num_states, n = S * kLanes;
  const auto linear = largest >= kTiny;
  bool fast = true;
  for (int64_t j = 0; j < kLanes; ++j) fast &= linear[j] || !checked[j];
  if (!fast) {
    LogOrNegInf<Float>(acc, out, n);
    for (int64_t i = 0; i < n; ++i) {
      if (!(acc[i] >= kTiny) && checked[i % kLanes]) out[i] = exact(i / kLanes, i % kLanes);
    }
    Lanes m = Lanes{} + kNegInf<double>;
    for (int64_t s = 0; s < S; ++s) {
      const Lanes v = LoadLanes(out + s * kLanes);
      m = v > m ? v : m;
    }
    const Lanes shift = m > kNegInf<double> ? m : Lanes{};
    for (int64_t s = 0; s < S; ++s) StoreLanes(out + s * kLanes, LoadLanes(out + s * kLanes) - shift);
    ExpArray<Float>(out, p, n);
    StoreLanes(top, m);
    if (leak == LeakMode::kInto) LeakLanes<Float>(g, checked, out, p);
    if (leak == LeakMode::kFrom) LeakFromLanes<Float>(g, checked, out, p);
    return;
  }
  // shift: log(largest) (0 in a lane without, whose values are not used).
  double shift[2 * kLanes], lane_top[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) {
    const double x = linear[j] ? largest[j] : 1.0;
    shift[j] = 0.0;
    LogWhereLarge<Float>(&x, shift + j, 1);  // the log the states' sums get
    shift[j + kLanes] = shift[j];
    lane_top[j] = linear[j] ? shift[j] : kNegInf<double>;
  }
  const Lanes scale = linear ? 1.0 / largest : Lanes{};
  double scale2[2 * kLanes];
  for (int64_t j = 0; j < kLanes; ++j) scale2[j] = scale2[j + kLanes] = scale[j];
  const Doubles8 shift8 = LoadD8(shift), scale8 = LoadD8(scale2);
  static_assert(kLanes == 4 && 8 % kLanes == 0);
  if (leak != LeakMode::kNone) {
    SettleLeaking<Float>(g, leak, checked, acc, shift, scale, out, p, exact);
    std::copy(lane_top, lane_top + kLanes, top);
    return;
  }
  // n is a multiple of 8 when S is even; the odd state's lanes go last.
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const Doubles8 a = LoadD8(acc + i);
    const auto ok = a >= kTiny;
    Doubles8 v;
    if constexpr (Float) {
      v = LogD8(ok ? a : SplatD(1.0));
    } else {
      for (int k = 0; k < 8; ++k) v[k] = ok[k] ? std::log(a[k]) : 1.0;
    }
    v = ok ? v - shift8 : SplatD(kNegInf<double>);
    const Doubles8 q = ok ? a * scale8 : Doubles8{};
    std::memcpy(out + i, &v, sizeof(v));
    std::memcpy(p + i, &q, sizeof(q));
    bool all = true;
    for (int k = 0; k < 8; ++k) all &= ok[k] != 0;
    if (all) continue;
    for (int64_t k = i; k < i + 8; ++k) {
      const int64_t j = k % kLanes;
      if (acc[k] >= kTiny || !checked[j]) continue;
      out[k] = exact(k / kLanes, j) - shift[j];
      p[k] = ExpOne<Float>(out[k]);
    }
  }
  for (; i < n; ++i) {
    const int64_t j = i % kLanes;
    if (acc[i] >= kTiny) {
      out[i] = std::log(acc[i]) - shift[j];
      p[i] = acc[i] * scale[j];
    } else {
      out[i] = checked[j] ? exact(i / kLanes, j) - shift[j] : kNegInf<double>;
      p[i] = ExpOne<Float>(out[i]);
    }
  }
  std::copy(lane_top, lane_top + kLanes, top);
}

// LogForward for a group: log_z [kLanes] (-inf for a lane without an
// utterance). The recursion runs on roll [2 S kLanes]; alpha [(max length +
// 1) S kLanes] and offset [(max length + 1) kLanes] (both may be null)
// receive LogForward's, per lane. alpha is stored in the inputs' type: in
// float for float32, as normalised logs, whose rounding (below 1e-7
// relative) stays under float32's precision of the posteriors formed from
// them, at half the memory and traffic of double.
template <typename T>
void LogForwardLanes(const Graph& g, const Group<T>& group, int64_t V, T* alpha, double* offset,
                     double* roll, LaneBuffers* buf, double* log_z) {
  constexpr bool kFloat = std::is_same_v<T, float>;
  const int64_t S = g.num_states, n = S * kLanes, length = group.MaxLength();
  auto row = [&](int64_t t) { return roll + (t % 2) * n; };
  auto store = [&](int64_t t, const double* a) {
    if (alpha) std::transform(a, a + n, alpha + t * n, [](double x) { return static_cast<T>(x); });
  };
  double shift[kLanes] = {}, em[kLanes], top[kLanes];
  bool live[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) live[j] = group.entry[j] >= 0;
  // Lane j's log Z, once frame boundary t = its length is reached.
  auto finish = [&](int64_t t, const double* a) {
    for (int64_t j = 0; j < kLanes; ++j) {
      if (group.length[j] != t) continue;
      double m = kNegInf<double>, sum = 0;
      for (int64_t s = 0; s < S; ++s) m = std::max(m, Times(a[s * kLanes + j], g.final_weight[s]));
      if (m > kNegInf<double>) {
        for (int64_t s = 0; s < S; ++s) {
          sum += std::exp(Times(a[s * kLanes + j], g.final_weight[s]) - m);
        }
      }
      log_z[j] = live[j] && m > kNegInf<double> ? shift[j] + m + std::log(sum) : kNegInf<double>;
    }
  };
  double* a = row(0);
  std::fill(a, a + n, kNegInf<double>);
  std::fill(a, a + kLanes, 0.0);
  ExpArray<kFloat>(a, buf->p, n);
  if (!g.leak.empty()) LeakLanes<kFloat>(g, live, a, buf->p);
  if (offset) std::fill(offset, offset + kLanes, 0.0);
  store(0, a);
  finish(0, a);
  for (int64_t t = 0; t < length; ++t) {
    FrameLanes(g, group, t, V, kLanes, buf, em);
    const double* __restrict p = buf->p;
    const double* __restrict lin = buf->lin;
    const double* __restrict w = g.in_w.data();
    const int32_t* __restrict src = g.in_src.data();
    const int32_t* __restrict col = g.in_col.data();
    Lanes largest{};
    for (const int32_t d : g.in_order) {
      Lanes s0{}, s1{};  // two partial sums: the adds do not wait on each other
      int64_t k = g.in_begin[d];
      const int64_t end = g.in_end[d];
      for (; k + 2 <= end; k += 2) {
        s0 += LoadLanes(p + src[k] * kLanes) * w[k] * LoadLanes(lin + col[k] * kLanes);
        s1 += LoadLanes(p + src[k + 1] * kLanes) * w[k + 1] * LoadLanes(lin + col[k + 1] * kLanes);
      }
      if (k < end) s0 += LoadLanes(p + src[k] * kLanes) * w[k] * LoadLanes(lin + col[k] * kLanes);
      const Lanes sum = s0 + s1;
      StoreLanes(buf->acc + d * kLanes, sum);
      largest = sum > largest ? sum : largest;
    }
    bool checked[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) checked[j] = live[j] && t < group.length[j];
    const double* from = row(t);
    double* next = row(t + 1);
    const LeakMode leak = g.leak.empty() ? LeakMode::kNone : LeakMode::kInto;
    SettleLanes<kFloat>(g, leak, checked, buf->acc, largest, next, buf->p, [&](int64_t d, int64_t j) {
      return ExactGroup(g.in_begin[d], g.in_end[d], g.in_src.data(), g.in_col.data(),
                        g.in_lw.data(), from, buf->le, buf->terms, kLanes, j);
    }, top);
    for (int64_t j = 0; j < kLanes; ++j) {
      if (!checked[j]) continue;
      if (top[j] > kNegInf<double>) {
        shift[j] += g.max_weight + em[j] + top[j];
      } else {
        live[j] = false;  // no path reaches frame t + 1
      }
    }
    if (offset) std::copy(shift, shift + kLanes, offset + (t + 1) * kLanes);
    store(t + 1, next);
    finish(t + 1, next);
  }
}

// LogBackward for a group: adds lane j's posteriors into ge[j] [T, V],
// gw [n kLanes] (by live arc in source order, per lane; only with kWeights)
// and gf [S kLanes] (zeros on entry). alpha and offset from LogForwardLanes;
// a lane runs where its log_z is finite. Needs Bytes(S) more workspace.
template <typename T, bool kWeights>
struct LogBackwardLanes {
  static size_t Bytes(int64_t S) {
    return 2 * LaneBytes(S * kLanes) + Workspace::Bytes<double>(2 * S);
  }
  static void Run(const Graph& g, const Group<T>& group, int64_t V, const T* alpha,
                  const double* offset, const double* log_z, T* const* ge, double* gw, double* gf,
                  Workspace* space, LaneBuffers* buf);
};

template <typename T, bool kWeights>
void LogBackwardLanes<T, kWeights>::Run(const Graph& g, const Group<T>& group, int64_t V,
                                        const T* alpha, const double* offset, const double* log_z,
                                        T* const* ge, double* gw, double* gf, Workspace* space,
                                        LaneBuffers* buf) {
  constexpr bool kFloat = std::is_same_v<T, float>;
  constexpr int64_t kStride = 2 * kLanes;  // lin and the posteriors, column by column
  const int64_t S = g.num_states, n = S * kLanes;
  double* beta = TakeLanes(space, n);
  double* here = TakeLanes(space, n);
  double* start = space->Take<double>(2 * S);  // beta at the length, as logs and exps
  double* q = buf->p;
  bool live[kLanes];
  int64_t length = 0;
  for (int64_t j = 0; j < kLanes; ++j) {
    live[j] = log_z[j] > kNegInf<double> && log_z[j] < kPosInf<double>;
    if (live[j]) length = std::max(length, group.length[j]);
  }
  // beta at a lane's length: the final weights (with the leak into them),
  // normalised; the same for every lane.
  for (int64_t s = 0; s < S; ++s) start[s] = g.final_weight[s];
  if (!g.leak.empty()) {
    double* into = start + S;
    for (int64_t s = 0; s < S; ++s) into[s] = Times(std::log(g.leak[s]), g.final_weight[s]);
    const double sum = LogSumExp(into, S);
    for (int64_t s = 0; s < S; ++s) start[s] = LogAdd(start[s], sum);
  }
  const double start_shift = Normalise(S, start);
  ExpArray<kFloat>(start, start + S, S);
  double beta_shift[kLanes], em[kLanes], top[kLanes], k_t[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) {
    beta_shift[j] = start_shift;
    if (!live[j]) continue;
    const int64_t at = group.length[j];
    const T* last = alpha + at * n;
    for (int64_t s = 0; s < S; ++s) {
      gf[s * kLanes + j] = std::exp(Times(Times(last[s * kLanes + j], g.final_weight[s]),
                                          offset[at * kLanes + j] - log_z[j]));
    }
  }
  for (int64_t s = 0; s < S; ++s) {
    StoreLanes(beta + s * kLanes, Lanes{} + start[s]);
    StoreLanes(q + s * kLanes, Lanes{} + start[S + s]);
  }
  for (int64_t t = length - 1; t >= 0; --t) {
    bool checked[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) {
      checked[j] = live[j] && t < group.length[j];
      if (!(live[j] && group.length[j] == t + 1) || t + 1 == length) continue;
      for (int64_t s = 0; s < S; ++s) {  // lane j's recursion starts here
        beta[s * kLanes + j] = start[s];
        q[s * kLanes + j] = start[S + s];
      }
      beta_shift[j] = start_shift;
    }
    FrameLanes(g, group, t, V, kStride, buf, em);
    const T* a = alpha + t * n;
    for (int64_t j = 0; j < kLanes; ++j) {
      k_t[j] = checked[j] ? offset[t * kLanes + j] + g.max_weight + em[j] + beta_shift[j] - log_z[j]
                          : kNegInf<double>;
    }
    double* __restrict factor = here;  // free until the sums are logged
    for (int64_t i = 0; i < n; ++i) factor[i] = static_cast<double>(a[i]) + k_t[i % kLanes];
    // exp(-inf) = 0: unchecked lanes add nothing. For float32 inputs a float
    // exp serves: a factor below e^-87 bounds posteriors below float's
    // normal range, and one above e^88 is inf, so huge: exact, below.
    if constexpr (kFloat) {
      ExpViaFloat(factor, n);
    } else {
      ExpArray<false>(factor, factor, n);
    }
    const int32_t* __restrict dst = g.out_dst.data();
    const int32_t* __restrict col = g.out_col.data();
    const double* __restrict w = g.out_w.data();
    const double* __restrict lin = buf->lin;
    double* __restrict ge_row = buf->lin + kLanes;  // column c's at c * kStride
    for (const int32_t c : g.columns) StoreLanes(ge_row + c * kStride, Lanes{});
    Lanes largest{};
    for (const int32_t s : g.out_order) {
      const int64_t begin = g.out_begin[s], end = g.out_end[s];
      Lanes f = LoadLanes(factor + s * kLanes);
      // Where the factor is huge the term may have underflowed: that lane
      // is summed exactly, from the logs, after the vector loop.
      const auto huge = !(f <= kHuge);
      bool any_huge = false;
      for (int64_t j = 0; j < kLanes; ++j) any_huge |= huge[j] != 0;
      if (any_huge) f = huge ? Lanes{} : f;
      Lanes s0{};
      for (int64_t k = begin; k < end; ++k) {
        const Lanes u = w[k] * LoadLanes(lin + col[k] * kStride) * LoadLanes(q + dst[k] * kLanes);
        s0 += u;
        const Lanes post = u * f;
        StoreLanes(ge_row + col[k] * kStride, LoadLanes(ge_row + col[k] * kStride) + post);
        if constexpr (kWeights) StoreLanes(gw + k * kLanes, LoadLanes(gw + k * kLanes) + post);
      }
      StoreLanes(buf->acc + s * kLanes, s0);
      largest = s0 > largest ? s0 : largest;
      if (!any_huge) continue;
      for (int64_t j = 0; j < kLanes; ++j) {
        if (!huge[j]) continue;
        const double from = a[s * kLanes + j] + k_t[j];
        for (int64_t k = begin; k < end; ++k) {
          const double x = Times(Times(Times(from, g.out_lw[k]), buf->le[col[k] * kLanes + j]),
                                 beta[dst[k] * kLanes + j]);
          const double post = std::min(ExpOne<kFloat>(x), 1.0);
          ge_row[col[k] * kStride + j] += post;
          if constexpr (kWeights) gw[k * kLanes + j] += post;
        }
      }
    }
    for (int64_t j = 0; j < kLanes; ++j) {
      if (!checked[j]) continue;
      T* out = ge[j] + t * V;
      for (const int32_t c : g.columns) out[c] = static_cast<T>(ge_row[c * kStride + j]);
    }
    if (t == 0) break;
    // q, read by the loop above, now becomes exp(beta_t).
    // beta_t = beta'_t + Σ_r leak[r] beta'_t[r], per lane
    const LeakMode leak = g.leak.empty() ? LeakMode::kNone : LeakMode::kFrom;
    SettleLanes<kFloat>(g, leak, checked, buf->acc, largest, here, q, [&](int64_t s, int64_t j) {
      return ExactGroup(g.out_begin[s], g.out_end[s], g.out_dst.data(), g.out_col.data(),
                        g.out_lw.data(), beta, buf->le, buf->terms, kLanes, j);
    }, top);
    for (int64_t j = 0; j < kLanes; ++j) {
      if (checked[j] && top[j] > kNegInf<double>) beta_shift[j] += g.max_weight + em[j] + top[j];
    }
    std::swap(beta, here);
  }
}

// -- TROPICAL -----------------------------------------------------------------

// The forward pass: the best score; choice [length S] receives each
// state's best arc per frame (-1: none), alpha [2 S] is scratch. Scores
// are sums in double of the inputs as given, not shifted per frame: a
// shift and its return would round away a weight of 1e-38 next to 1.
template <typename T>
double TropicalForward(const Graph& g, const T* e, int64_t V, int64_t length, double* alpha,
                       int32_t* choice, int32_t* best_final) {
  const int64_t S = g.num_states;
  double* a = alpha;
  double* next = alpha + S;
  std::fill(a, a + S, kNegInf<double>);
  a[0] = 0;
  *best_final = -1;
  for (int64_t t = 0; t < length; ++t) {
    const T* row = e + t * V;
    bool alive = false;
    for (const int32_t d : g.in_order) {
      double best = kNegInf<double>;
      int32_t arc = -1;
      for (int64_t k = g.in_begin[d]; k < g.in_end[d]; ++k) {
        const double v = Times(Times(a[g.in_src[k]], g.in_weight[k]),
                               static_cast<double>(row[g.in_col[k]]));
        if (v > best) best = v, arc = static_cast<int32_t>(k);
      }
      next[d] = best;
      alive |= best > kNegInf<double>;
      if (choice) choice[t * S + d] = arc;
    }
    if (!alive) return kNegInf<double>;
    std::swap(a, next);
  }
  double best = kNegInf<double>;
  for (int64_t s = 0; s < S; ++s) {
    const double v = Times(a[s], g.final_weight[s]);
    if (v > best) best = v, *best_final = static_cast<int32_t>(s);
  }
  return best;
}

// -- FFI handlers -------------------------------------------------------------

template <ffi::DataType D>
using Floats = ffi::Buffer<D>;
using Ints = ffi::Buffer<ffi::S32>;

struct Sizes {
  int64_t batch = 0, frames = 0, vocab = 0, graphs = 0, arcs = 0, states = 0;
};

template <typename E, typename I, typename W>
ffi::Error GetSizes(const E& emissions, const I& lengths, const I& src, const I& dst,
                    const I& col, const W& weight, const W& final_weight, const W& leak,
                    Sizes* z) {
  auto em = emissions.dimensions();
  auto arcs = src.dimensions();
  auto fin = final_weight.dimensions();
  if (em.size() != 3 || arcs.size() != 2 || fin.size() != 2) {
    return Fail("emissions must be [B, T, V], the arcs [G, A], the final weights [G, S]");
  }
  z->batch = em[0];
  z->frames = em[1];
  z->vocab = em[2];
  z->graphs = arcs[0];
  z->arcs = arcs[1];
  z->states = fin[1];
  auto same = [&](auto dims, int64_t g, int64_t n) {
    return dims.size() == 2 && dims[0] == g && dims[1] == n;
  };
  if (lengths.element_count() != static_cast<size_t>(z->batch) ||
      !(z->graphs == 1 || z->graphs == z->batch) || fin[0] != z->graphs ||
      !same(dst.dimensions(), z->graphs, z->arcs) || !same(col.dimensions(), z->graphs, z->arcs) ||
      !same(weight.dimensions(), z->graphs, z->arcs) ||
      !same(leak.dimensions(), z->graphs, z->states)) {
    return Fail("the graph arrays, emissions and lengths disagree on their sizes");
  }
  if (z->vocab < 1 || z->states < 1) return Fail("no emission columns or no states");
  return ffi::Error::Success();
}

// Checks the arrays' sizes, then runs body(z, b, graph, length, emissions
// [T, V] of entry b) for each batch entry over XLA's threads: one graph
// built for all when shared, else each entry's own. Lengths are clamped to
// [0, T].
template <ffi::DataType D, typename Body>
ffi::Error ForUtterances(ffi::ThreadPool& pool, const Floats<D>& emissions, const Ints& lengths,
                         const Ints& src, const Ints& dst, const Ints& col,
                         const Floats<D>& weight, const Floats<D>& final_weight,
                         const Floats<D>& leak, const Body& body) {
  using T = ffi::NativeType<D>;
  Sizes z;
  if (auto error = GetSizes(emissions, lengths, src, dst, col, weight, final_weight, leak, &z);
      error.failure()) {
    return error;
  }
  auto build = [&](int64_t i, Graph* g) {
    BuildGraph<T>(src.typed_data() + i * z.arcs, dst.typed_data() + i * z.arcs,
                  col.typed_data() + i * z.arcs, weight.typed_data() + i * z.arcs,
                  final_weight.typed_data() + i * z.states, leak.typed_data() + i * z.states,
                  z.arcs, z.states, z.vocab, g);
  };
  Graph shared;
  if (z.graphs == 1) build(0, &shared);
  ForEntries(pool, z.batch, z.frames * (z.arcs + z.states), [&](int64_t b) {
    const int64_t length = std::clamp<int64_t>(lengths.typed_data()[b], 0, z.frames);
    const T* e = emissions.typed_data() + b * z.frames * z.vocab;
    if (z.graphs == 1) return body(z, b, shared, length, e);
    Graph own;
    build(b, &own);
    body(z, b, own, length, e);
  });
  return ffi::Error::Success();
}

// One batch entry's gradient outputs: emissions [T, V], weights [A],
// final weights [S].
template <typename T>
struct GradOut {
  T *emission, *weight, *final_weight;
  int64_t num_emissions, num_arcs, num_states;

  void Fill(T value) const {
    std::fill(emission, emission + num_emissions, value);
    std::fill(weight, weight + num_arcs, value);
    std::fill(final_weight, final_weight + num_states, value);
  }
};

template <typename T, ffi::DataType D>
GradOut<T> GradAt(const Sizes& z, int64_t b, ffi::ResultBuffer<D>& emission_grad,
                  ffi::ResultBuffer<D>& weight_grad, ffi::ResultBuffer<D>& final_grad) {
  const int64_t n = z.frames * z.vocab;
  return {emission_grad->typed_data() + b * n, weight_grad->typed_data() + b * z.arcs,
          final_grad->typed_data() + b * z.states, n, z.arcs, z.states};
}

// LOG over a batch: with a shared graph and at least three utterances,
// `grouped(z, graph, group, reads)` runs on groups of kLanes utterances that
// read no NaN or +inf (those of similar lengths together; a last group of
// fewer than three runs one at a time), and `single` (ForUtterances' body)
// on the others; else `single` on each. reads [B]: what each entry reads.
template <ffi::DataType D, typename Single, typename Grouped>
ffi::Error ForLogBatch(ffi::ThreadPool& pool, const Floats<D>& emissions, const Ints& lengths,
                       const Ints& src, const Ints& dst, const Ints& col, const Floats<D>& weight,
                       const Floats<D>& final_weight, const Floats<D>& leak, const Single& single,
                       const Grouped& grouped) {
  using T = ffi::NativeType<D>;
  Sizes z;
  if (auto error = GetSizes(emissions, lengths, src, dst, col, weight, final_weight, leak, &z);
      error.failure()) {
    return error;
  }
  if (z.graphs != 1 || z.batch < 3) {
    return ForUtterances<D>(pool, emissions, lengths, src, dst, col, weight, final_weight, leak,
                            single);
  }
  Graph g;
  BuildGraph<T>(src.typed_data(), dst.typed_data(), col.typed_data(), weight.typed_data(),
                final_weight.typed_data(), leak.typed_data(), z.arcs, z.states, z.vocab, &g);
  const T* e = emissions.typed_data();
  std::vector<int64_t> length(z.batch);
  std::vector<Reads> reads(z.batch);
  ForEntries(pool, z.batch, z.frames * static_cast<int64_t>(g.columns.size()), [&](int64_t b) {
    length[b] = std::clamp<int64_t>(lengths.typed_data()[b], 0, z.frames);
    reads[b] = ReadsOf(g, e + b * z.frames * z.vocab, z.vocab, length[b]);
  });
  std::vector<int64_t> clean, rest;
  for (int64_t b = 0; b < z.batch; ++b) (reads[b].nan || reads[b].inf ? rest : clean).push_back(b);
  std::stable_sort(clean.begin(), clean.end(),
                   [&](int64_t x, int64_t y) { return length[x] > length[y]; });
  std::vector<Group<T>> groups;
  for (size_t i = 0; i < clean.size(); i += kLanes) {
    const size_t n = std::min<size_t>(kLanes, clean.size() - i);
    if (n < 3) {
      rest.insert(rest.end(), clean.begin() + i, clean.end());
      break;
    }
    Group<T> group;
    for (size_t j = 0; j < kLanes; ++j) {
      const int64_t b = j < n ? clean[i + j] : -1;
      group.entry[j] = b;
      group.length[j] = b < 0 ? 0 : length[b];
      group.e[j] = b < 0 ? nullptr : e + b * z.frames * z.vocab;
    }
    groups.push_back(group);
  }
  const int64_t items = static_cast<int64_t>(groups.size() + rest.size());
  ForEntries(pool, items, z.frames * (z.arcs + z.states), [&](int64_t i) {
    if (i < static_cast<int64_t>(groups.size())) return grouped(z, g, groups[i], reads);
    const int64_t b = rest[i - groups.size()];
    single(z, b, g, length[b], e + b * z.frames * z.vocab);
  });
  return ffi::Error::Success();
}

template <ffi::DataType D>
ffi::Error LogTotal(ffi::ThreadPool pool, Floats<D> emissions, Ints lengths, Ints src, Ints dst,
                    Ints col, Floats<D> weight, Floats<D> final_weight, Floats<D> leak,
                    ffi::ResultBuffer<D> log_z, ffi::ResultBuffer<ffi::S32> large) {
  using T = ffi::NativeType<D>;
  auto single = [&](const Sizes& z, int64_t b, const Graph& g, int64_t length, const T* e) {
    const Reads r = ReadsOf(g, e, z.vocab, length);
    large->typed_data()[b] = r.large;
    if (r.nan) {
      log_z->typed_data()[b] = kNaN<T>;
      return;
    }
    const int64_t S = z.states;
    const int64_t degree = MaxDegree(g);
    Workspace space(Buffers::Bytes(S, z.vocab, degree) + Workspace::Bytes<double>(2 * S));
    Buffers buf(S, z.vocab, degree, &space);
    double* roll = space.Take<double>(2 * S);
    log_z->typed_data()[b] =
        static_cast<T>(LogForward<T>(g, e, z.vocab, length, r.inf, nullptr, nullptr, roll, &buf));
  };
  auto grouped = [&](const Sizes& z, const Graph& g, const Group<T>& group,
                     const std::vector<Reads>& reads) {
    const int64_t S = z.states;
    const int64_t degree = MaxDegree(g);
    Workspace space(LaneBuffers::Bytes(S, z.vocab, degree) + LaneBytes(2 * S * kLanes));
    LaneBuffers buf(S, z.vocab, degree, &space);
    double* roll = TakeLanes(&space, 2 * S * kLanes);
    double out[kLanes];
    LogForwardLanes<T>(g, group, z.vocab, nullptr, nullptr, roll, &buf, out);
    for (int64_t j = 0; j < kLanes; ++j) {
      const int64_t b = group.entry[j];
      if (b < 0) continue;
      large->typed_data()[b] = reads[b].large;
      log_z->typed_data()[b] = static_cast<T>(out[j]);
    }
  };
  return ForLogBatch<D>(pool, emissions, lengths, src, dst, col, weight, final_weight, leak,
                        single, grouped);
}

template <ffi::DataType D>
ffi::Error LogGrad(ffi::ThreadPool pool, Floats<D> emissions, Ints lengths, Ints src, Ints dst,
                   Ints col, Floats<D> weight, Floats<D> final_weight, Floats<D> leak,
                   ffi::ResultBuffer<D> log_z, ffi::ResultBuffer<ffi::S32> large,
                   ffi::ResultBuffer<D> emission_grad, ffi::ResultBuffer<D> weight_grad,
                   ffi::ResultBuffer<D> final_grad, int64_t weight_grads) {
  using T = ffi::NativeType<D>;
  auto single = [&](const Sizes& z, int64_t b, const Graph& g, int64_t length, const T* e) {
    const int64_t S = z.states, V = z.vocab, A = z.arcs;
    const GradOut<T> out = GradAt<T>(z, b, emission_grad, weight_grad, final_grad);
    T *ge = out.emission, *gw = out.weight, *gf = out.final_weight;
    out.Fill(T(0));
    const Reads r = ReadsOf(g, e, V, length);
    large->typed_data()[b] = r.large;
    if (r.nan) {
      log_z->typed_data()[b] = kNaN<T>;
      out.Fill(kNaN<T>);
      return;
    }
    const bool exact = r.inf;
    const int64_t degree = MaxDegree(g);
    const int64_t n = static_cast<int64_t>(g.out_arc.size());
    Workspace space(Buffers::Bytes(S, V, degree) + Workspace::Bytes<double>((length + 1) * S) +
                    Workspace::Bytes<double>(length + 1) + Workspace::Bytes<double>(V + A + S) +
                    2 * Workspace::Bytes<double>(S) + Workspace::Bytes<double>(n));
    Buffers buf(S, V, degree, &space);
    double* alpha = space.Take<double>((length + 1) * S);
    double* offset = space.Take<double>(length + 1);
    double* sums = space.Take<double>(V + A + S);
    std::fill(sums, sums + V + A + S, 0.0);
    const double total = LogForward<T>(g, e, V, length, exact, alpha, offset, nullptr, &buf);
    log_z->typed_data()[b] = static_cast<T>(total);
    if (total == kPosInf<double>) {
      out.Fill(kNaN<T>);
      return;
    }
    if (!(total > kNegInf<double>)) return;  // no path: exactly 0
    double* row = sums;
    double* sum_w = sums + V;
    double* sum_f = sum_w + A;
    // Without weight_grads the weights' gradient is left at 0 (the
    // caller does not read it).
    if (weight_grads) {
      LogBackward<T, true>(g, e, V, length, exact, alpha, offset, total, ge, row, sum_w, sum_f,
                           &space, &buf);
      for (size_t k = 0; k < g.out_arc.size(); ++k) gw[g.out_arc[k]] = static_cast<T>(sum_w[k]);
    } else {
      LogBackward<T, false>(g, e, V, length, exact, alpha, offset, total, ge, row, sum_w, sum_f,
                            &space, &buf);
    }
    for (int64_t s = 0; s < S; ++s) gf[s] = static_cast<T>(std::min(sum_f[s], 1.0));
  };
  auto grouped = [&](const Sizes& z, const Graph& g, const Group<T>& group,
                     const std::vector<Reads>& reads) {
    const int64_t S = z.states, V = z.vocab, length = group.MaxLength();
    const int64_t degree = MaxDegree(g);
    const int64_t n = static_cast<int64_t>(g.out_arc.size());
    T* ge[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) {
      const int64_t b = group.entry[j];
      ge[j] = nullptr;
      if (b < 0) continue;
      const GradOut<T> out = GradAt<T>(z, b, emission_grad, weight_grad, final_grad);
      out.Fill(T(0));
      ge[j] = out.emission;
      large->typed_data()[b] = reads[b].large;
    }
    const int64_t num_w = weight_grads ? n * kLanes : 0;
    Workspace space(LaneBuffers::Bytes(S, V, degree) + Workspace::Bytes<T>((length + 1) * S * kLanes) +
                    Workspace::Bytes<double>((length + 1) * kLanes) + LaneBytes(2 * S * kLanes) +
                    LaneBytes(S * kLanes) + LaneBytes(num_w) +
                    LogBackwardLanes<T, true>::Bytes(S));
    LaneBuffers buf(S, V, degree, &space);
    T* alpha = space.Take<T>((length + 1) * S * kLanes);
    double* offset = space.Take<double>((length + 1) * kLanes);
    double* roll = TakeLanes(&space, 2 * S * kLanes);
    double* sum_f = TakeLanes(&space, S * kLanes);
    double* sum_w = TakeLanes(&space, num_w);
    std::fill(sum_f, sum_f + S * kLanes, 0.0);
    std::fill(sum_w, sum_w + num_w, 0.0);
    double totals[kLanes];
    LogForwardLanes<T>(g, group, V, alpha, offset, roll, &buf, totals);
    if (weight_grads) {
      LogBackwardLanes<T, true>::Run(g, group, V, alpha, offset, totals, ge, sum_w, sum_f, &space,
                                     &buf);
    } else {
      LogBackwardLanes<T, false>::Run(g, group, V, alpha, offset, totals, ge, nullptr, sum_f,
                                      &space, &buf);
    }
    for (int64_t j = 0; j < kLanes; ++j) {
      const int64_t b = group.entry[j];
      if (b < 0) continue;
      log_z->typed_data()[b] = static_cast<T>(totals[j]);
      if (!(totals[j] > kNegInf<double>)) continue;  // no path: exactly 0
      const GradOut<T> out = GradAt<T>(z, b, emission_grad, weight_grad, final_grad);
      if (weight_grads) {
        for (int64_t k = 0; k < n; ++k) {
          out.weight[g.out_arc[k]] = static_cast<T>(sum_w[k * kLanes + j]);
        }
      }
      for (int64_t s = 0; s < S; ++s) {
        out.final_weight[s] = static_cast<T>(std::min(sum_f[s * kLanes + j], 1.0));
      }
    }
  };
  return ForLogBatch<D>(pool, emissions, lengths, src, dst, col, weight, final_weight, leak,
                        single, grouped);
}

template <ffi::DataType D>
ffi::Error TropicalTotal(ffi::ThreadPool pool, Floats<D> emissions, Ints lengths, Ints src,
                         Ints dst, Ints col, Floats<D> weight, Floats<D> final_weight,
                         Floats<D> leak, ffi::ResultBuffer<D> score) {
  using T = ffi::NativeType<D>;
  return ForUtterances<D>(
      pool, emissions, lengths, src, dst, col, weight, final_weight, leak,
      [&](const Sizes& z, int64_t b, const Graph& g, int64_t length, const T* e) {
        if (ReadsOf(g, e, z.vocab, length).nan) {
          score->typed_data()[b] = kNaN<T>;
          return;
        }
        Workspace space(Workspace::Bytes<double>(2 * z.states));
        double* alpha = space.Take<double>(2 * z.states);
        int32_t last = -1;
        score->typed_data()[b] = static_cast<T>(
            TropicalForward<T>(g, e, z.vocab, length, alpha, nullptr, &last));
      });
}

template <ffi::DataType D>
ffi::Error TropicalGrad(ffi::ThreadPool pool, Floats<D> emissions, Ints lengths, Ints src,
                        Ints dst, Ints col, Floats<D> weight, Floats<D> final_weight,
                        Floats<D> leak, ffi::ResultBuffer<D> score,
                        ffi::ResultBuffer<D> emission_grad, ffi::ResultBuffer<D> weight_grad,
                        ffi::ResultBuffer<D> final_grad) {
  using T = ffi::NativeType<D>;
  return ForUtterances<D>(
      pool, emissions, lengths, src, dst, col, weight, final_weight, leak,
      [&](const Sizes& z, int64_t b, const Graph& g, int64_t length, const T* e) {
        const int64_t S = z.states, V = z.vocab;
        const GradOut<T> out = GradAt<T>(z, b, emission_grad, weight_grad, final_grad);
        T *ge = out.emission, *gw = out.weight, *gf = out.final_weight;
        out.Fill(T(0));
        if (ReadsOf(g, e, V, length).nan) {
          score->typed_data()[b] = kNaN<T>;
          out.Fill(kNaN<T>);
          return;
        }
        Workspace space(Workspace::Bytes<double>(2 * S) +
                        Workspace::Bytes<int32_t>(length * S));
        double* alpha = space.Take<double>(2 * S);
        int32_t* choice = space.Take<int32_t>(length * S);
        int32_t state = -1;
        const double best = TropicalForward<T>(g, e, V, length, alpha, choice, &state);
        score->typed_data()[b] = static_cast<T>(best);
        if (!(best > kNegInf<double>) || state < 0) return;  // no path
        gf[state] = T(1);
        for (int64_t t = length - 1; t >= 0; --t) {
          const int32_t k = choice[t * S + state];
          ge[t * V + g.in_col[k]] += T(1);
          gw[g.in_arc[k]] += T(1);
          state = g.in_src[k];
        }
      });
}

template <ffi::DataType D>
auto Inputs() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<Floats<D>>()           // emissions [B, T, V]
      .template Arg<Ints>()       // lengths [B]
      .template Arg<Ints>()       // src [G, A]
      .template Arg<Ints>()       // dst [G, A]
      .template Arg<Ints>()       // column [G, A], < 0 for padding
      .template Arg<Floats<D>>()  // weight [G, A]
      .template Arg<Floats<D>>()  // final weight [G, S]
      .template Arg<Floats<D>>();  // leak [G, S]
}

}  // namespace

// log_z [B], large [B]
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjDenseLogTotalF32, LogTotal<ffi::F32>,
                              Inputs<ffi::F32>().Ret<Floats<ffi::F32>>().Ret<Ints>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjDenseLogTotalF64, LogTotal<ffi::F64>,
                              Inputs<ffi::F64>().Ret<Floats<ffi::F64>>().Ret<Ints>());
// log_z [B], large [B], emission grad [B, T, V], weight grad [B, A], final grad [B, S];
// weight_grads: 0 to skip the weights' gradient
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjDenseLogGradF32, LogGrad<ffi::F32>,
                              Inputs<ffi::F32>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Ints>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Attr<int64_t>("weight_grads"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjDenseLogGradF64, LogGrad<ffi::F64>,
                              Inputs<ffi::F64>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Ints>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Attr<int64_t>("weight_grads"));
// score [B]
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjDenseTropicalTotalF32, TropicalTotal<ffi::F32>,
                              Inputs<ffi::F32>().Ret<Floats<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjDenseTropicalTotalF64, TropicalTotal<ffi::F64>,
                              Inputs<ffi::F64>().Ret<Floats<ffi::F64>>());
// score [B], emission grad [B, T, V], weight grad [B, A], final grad [B, S]
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjDenseTropicalGradF32, TropicalGrad<ffi::F32>,
                              Inputs<ffi::F32>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjDenseTropicalGradF64, TropicalGrad<ffi::F64>,
                              Inputs<ffi::F64>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Floats<ffi::F64>>());
