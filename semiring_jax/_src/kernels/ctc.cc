// CPU kernels for the CTC loss (XLA FFI handlers): forward and backward
// recursions over the CTC band, one utterance per batch entry.
//
// Shapes: log_probs [B, T, V] (f32 or f64: one handler per dtype),
// input_lengths [B], labels [B, U], label_lengths [B] (int32); blank is an
// attribute. An utterance with n labels has S = 2n + 1 states: even states
// are blanks, state 2k + 1 is label k. State s is entered from s (stay),
// s - 1 (move) and s - 2 (skip a blank, when s is a label unlike the one
// two states back). Lengths are clamped to [0, T] and [0, U], labels to
// [0, V) (the caller checks concrete ones).
//
//   SjCtcLoss:  log Z [B] (-inf where no alignment fits in the frames).
//   SjCtcGrad:  log Z [B] and its gradient [B, T, V] with respect to
//     log_probs: each frame's token posteriors; exactly 0 past the input
//     length and where log Z is -inf. The caller negates both.
//
// Scores are kept in double and normalised per frame (the scaled
// forward-backward): each frame's scores are shifted by their maximum and
// the shifts summed apart, so posteriors exp(a + b - Z) come from O(1)
// numbers (~1e-7 for float32 inputs at T = 5,000 frames, whose exp and log
// run in float SIMD on those O(1) arguments; libm's precision for float64).
// Where an utterance reads a log-prob beyond 2^20 in magnitude (a masked
// token at -1e9 or -1e30 that its labels need), double cannot hold the O(1)
// differences between paths next to such numbers: its gradient is then
// computed on compensated (hi, lo) double pairs instead: slower, and exact
// for float32 inputs at any magnitude (a sum of float32 values fits a
// double pair); float64 inputs keep path differences to ~2^-106 of it.
//
// NaN in any log-prob the band reads within the input length gives log Z
// NaN and a gradient that is NaN everywhere (NaN in, NaN out). A +inf
// log-prob gives log Z = +inf where an alignment uses it (-inf absorbs it
// elsewhere), and a NaN gradient.

#include <type_traits>

#include "common.h"

namespace {

ffi::Error Fail(const std::string& what) { return FailIn("CTC kernel", what); }

// Beyond this magnitude a log-prob's neighbours in double are 2^-32 apart
// or more, too coarse for posteriors of paths that all carry it.
constexpr double kLargeLogProb = 1048576.0;  // 2^20

// One utterance's band: tokens and which states may skip a blank.
struct Band {
  int64_t num_states = 0;  // S = 2 n + 1
  std::vector<int32_t> token;
  std::vector<bool> skip;  // s may be entered from s - 2
};

Band MakeBand(const int32_t* labels, int64_t num_labels, int32_t blank, int64_t vocab) {
  Band band;
  band.num_states = 2 * num_labels + 1;
  band.token.assign(band.num_states, blank);
  band.skip.assign(band.num_states, false);
  for (int64_t k = 0; k < num_labels; ++k) {
    band.token[2 * k + 1] = std::clamp<int32_t>(labels[k], 0, static_cast<int32_t>(vocab - 1));
  }
  for (int64_t s = 3; s < band.num_states; s += 2) {
    band.skip[s] = band.token[s] != band.token[s - 2];
  }
  return band;
}

// log(exp(a) + exp(b) + exp(c)), -inf when all three are -inf, +inf when
// one is +inf (none is NaN: NaN is found apart).
inline double LogSum3(double a, double b, double c) {
  const double m = std::max(a, std::max(b, c));
  if (!(m > kNegInf<double>) || m == kPosInf<double>) return m;
  return m + std::log(std::exp(a - m) + std::exp(b - m) + std::exp(c - m));
}

typedef double Doubles8 __attribute__((vector_size(64)));

inline Doubles8 LoadD8(const double* p) {
  Doubles8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The same eight at a time, for float32 inputs: scores and sums stay in
// double (rounding them to float every frame would let errors grow with
// T), while exp and log, of O(1) arguments after the shift by the maximum,
// run in float SIMD with relative errors below 2e-7.
inline void LogSum3x8(Doubles8 va, Doubles8 vb, Doubles8 vc, double* out) {
  Doubles8 m = va > vb ? va : vb;
  m = m > vc ? m : vc;
  const Floats8 da = __builtin_convertvector(va - m, Floats8);
  const Floats8 db = __builtin_convertvector(vb - m, Floats8);
  const Floats8 dc = __builtin_convertvector(vc - m, Floats8);
  const Floats8 log_sum = FastLog8(FastExp8(da) + FastExp8(db) + FastExp8(dc));
  const Doubles8 value = m + __builtin_convertvector(log_sum, Doubles8);
  // All -inf: -inf; one +inf: +inf (inf - inf made NaN above).
  const Doubles8 result = (m > kNegInf<double>) & (m < kPosInf<double>) ? value : m;
  std::memcpy(out, &result, sizeof(result));
}

// out[s] = LogSum3(x[s + da], x[s + db], x[s + dc] + add[s + dadd]) for s < n;
// `Float` says whether the inputs were float32 (SIMD float exp and log)
// or float64 (libm, to double precision). add holds 0 or -inf.
template <bool Float>
void BandStep(int64_t n, const double* x, const double* add, int da, int db, int dc, int dadd,
              double* out) {
  int64_t s = 0;
  if constexpr (Float) {
    for (; s + 8 <= n; s += 8) {
      LogSum3x8(LoadD8(x + s + da), LoadD8(x + s + db),
                LoadD8(x + s + dc) + LoadD8(add + s + dadd), out + s);
    }
  }
  for (; s < n; ++s) out[s] = LogSum3(x[s + da], x[s + db], Times(x[s + dc], add[s + dadd]));
}

// Subtracts the maximum finite entry of v[0..n) and returns it; 0 (leaving
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

struct Sizes {
  int64_t batch = 0, frames = 0, vocab = 0, max_labels = 0, max_states = 0;
};

template <typename L, typename I>
ffi::Error GetSizes(const L& log_probs, const I& input_lengths, const I& labels,
                    const I& label_lengths, Sizes* z) {
  auto lp = log_probs.dimensions();
  auto lab = labels.dimensions();
  if (lp.size() != 3 || lab.size() != 2) return Fail("log_probs must be [B, T, V], labels [B, U]");
  z->batch = lp[0];
  z->frames = lp[1];
  z->vocab = lp[2];
  z->max_labels = lab[1];
  z->max_states = 2 * lab[1] + 1;
  if (lab[0] != z->batch || input_lengths.element_count() != static_cast<size_t>(z->batch) ||
      label_lengths.element_count() != static_cast<size_t>(z->batch)) {
    return Fail("log_probs, labels and the lengths disagree on the batch size");
  }
  if (z->vocab < 1) return Fail("log_probs has no columns");
  return ffi::Error::Success();
}

// log Z from the last frame's scores (those of the last label and of the
// blank after it).
inline double LogEnd(const double* last, int64_t num_states) {
  const double a = last[num_states - 1];
  const double b = num_states >= 2 ? last[num_states - 2] : kNegInf<double>;
  return LogSum3(a, b, kNegInf<double>);
}

// What one utterance's forward pass found.
struct Forward {
  double log_z = kNegInf<double>;
  bool nan = false;    // a NaN log-prob was read
  bool large = false;  // a log-prob beyond kLargeLogProb was read
};

// One utterance's forward pass. alpha [length, S] (may be null) receives
// the normalised scores, shift [length] the frames' maxima.
template <typename T>
Forward ForwardOne(const Sizes& z, const T* log_probs, int64_t length, const Band& band,
                   double* alpha, double* shift, Workspace* space) {
  const int64_t S = band.num_states;
  Forward result;
  if (length == 0) {
    result.log_z = S == 1 ? 0.0 : kNegInf<double>;
    return result;
  }
  // Two score buffers, each after two -inf entries (states -2 and -1), and
  // the skips: add[s] = 0 where s may skip, else -inf.
  double* previous = space->Take<double>(S + 2) + 2;
  double* current = space->Take<double>(S + 2) + 2;
  double* add = space->Take<double>(S + 2) + 2;
  previous[-2] = previous[-1] = current[-2] = current[-1] = add[-2] = add[-1] = kNegInf<double>;
  for (int64_t s = 0; s < S; ++s) add[s] = band.skip[s] ? 0.0 : kNegInf<double>;
  double total_shift = 0;
  bool nan = false, large = false, alive = true;
  for (int64_t t = 0; t < length; ++t) {
    const T* row = log_probs + t * z.vocab;
    if (t == 0) {  // a path starts in the first blank or the first label
      for (int64_t s = 0; s < S; ++s) current[s] = s < 2 ? 0.0 : kNegInf<double>;
    } else {
      // From s (stay), s - 1 (move) and s - 2 (skip a blank).
      BandStep<std::is_same_v<T, float>>(S, previous, add, 0, -1, -2, 0, current);
    }
    for (int64_t s = 0; s < S; ++s) {
      const double e = static_cast<double>(row[band.token[s]]);
      nan |= e != e;
      large |= std::fabs(e) > kLargeLogProb && e > kNegInf<double>;
      current[s] = Times(current[s], e);
    }
    const double m = Normalise(S, current);
    alive &= std::any_of(current, current + S, [](double v) { return v > kNegInf<double>; });
    if (shift != nullptr) shift[t] = m;
    total_shift += m;
    if (alpha != nullptr) std::copy(current, current + S, alpha + t * S);
    std::swap(previous, current);
  }
  result.nan = nan;
  result.large = large;
  result.log_z = nan ? kNaN<double> : alive ? total_shift + LogEnd(previous, S) : kNegInf<double>;
  return result;
}

// One utterance's posteriors, added into grad [T, V] (zeros on entry).
template <typename T>
void BackwardOne(const Sizes& z, const T* log_probs, int64_t length, const Band& band,
                 const double* alpha, const double* shift, double log_z, T* grad,
                 Workspace* space) {
  const int64_t S = band.num_states, V = z.vocab;
  // x = beta + emission [S | 2 pad], beta [S], skips [S | 2 pad], posteriors [S].
  double* x = space->Take<double>(S + 2);
  double* beta = space->Take<double>(S);
  double* add = space->Take<double>(S + 2);
  double* posterior = space->Take<double>(S);
  x[S] = x[S + 1] = kNegInf<double>;
  for (int64_t s = 0; s < S + 2; ++s) add[s] = s < S && band.skip[s] ? 0.0 : kNegInf<double>;
  // alpha_t = alpha~_t + A_t (A_t: the shifts' prefix sum) and beta_t =
  // beta~_t + B_t, so posterior = exp(alpha~ + beta~ + A_t + B_t - log Z).
  double prefix = 0;
  for (int64_t t = 0; t < length; ++t) prefix += shift[t];
  for (int64_t s = 0; s < S; ++s) beta[s] = s >= S - 2 ? 0.0 : kNegInf<double>;
  double beta_shift = 0;
  for (int64_t t = length - 1; t >= 0; --t) {
    const double* a = alpha + t * S;
    const double offset = prefix + beta_shift - log_z;
    for (int64_t s = 0; s < S; ++s) posterior[s] = a[s] + beta[s] + offset;
    T* g = grad + t * V;
    for (int64_t s = 0; s < S; ++s) {
      const double p = std::min(static_cast<double>(ExpOf(static_cast<T>(posterior[s]))), 1.0);
      g[band.token[s]] += static_cast<T>(p);
    }
    if (t == 0) break;
    prefix -= shift[t];  // now A_{t - 1}
    const T* row = log_probs + t * V;
    for (int64_t s = 0; s < S; ++s) x[s] = Times(beta[s], static_cast<double>(row[band.token[s]]));
    // To s (stay), s + 1 (move) and s + 2 (a skip into s + 2).
    BandStep<std::is_same_v<T, float>>(S, x, add, 0, 1, 2, 2, beta);
    beta_shift += Normalise(S, beta);
  }
}

// -- compensated (hi, lo) double pairs, for log-probs of huge magnitude -------

struct Pair {
  double hi = kNegInf<double>, lo = 0;
};

// a + b exactly, as a normalised pair (Knuth's TwoSum, then Fast2Sum).
inline Pair PairOf(double a, double b, double lo) {
  const double s = Times(a, b);
  if (!std::isfinite(s)) return {s, 0};
  const double bb = s - a;
  const double e = (a - (s - bb)) + (b - bb) + lo;
  const double hi = s + e;
  return {hi, e - (hi - s)};
}

inline Pair Add(Pair p, double v) { return PairOf(p.hi, v, p.lo); }

inline bool Less(Pair a, Pair b) { return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo); }

// log Σ exp over n pairs.
inline Pair LogSum(const Pair* p, int n) {
  Pair top = p[0];
  for (int i = 1; i < n; ++i) {
    if (Less(top, p[i])) top = p[i];
  }
  if (!std::isfinite(top.hi)) return top;
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp((p[i].hi - top.hi) + (p[i].lo - top.lo));
  return PairOf(top.hi, std::log(sum), top.lo);
}

// The posteriors of one utterance whose log-probs are huge, added into
// grad [T, V]; log Z as a pair must be finite.
template <typename T>
void CompensatedOne(const Sizes& z, const T* log_probs, int64_t length, const Band& band, T* grad,
                    Workspace* space) {
  const int64_t S = band.num_states, V = z.vocab;
  Pair* alpha = space->Take<Pair>(length * S);
  Pair* beta = space->Take<Pair>(2 * S);
  auto emission = [&](int64_t t, int64_t s) {
    return static_cast<double>(log_probs[t * V + band.token[s]]);
  };
  const Pair none;
  for (int64_t t = 0; t < length; ++t) {
    for (int64_t s = 0; s < S; ++s) {
      Pair into;
      if (t == 0) {
        into = s < 2 ? Pair{0.0, 0.0} : none;
      } else {
        const Pair* a = alpha + (t - 1) * S;
        const Pair terms[3] = {a[s], s >= 1 ? a[s - 1] : none, band.skip[s] ? a[s - 2] : none};
        into = LogSum(terms, 3);
      }
      alpha[t * S + s] = Add(into, emission(t, s));
    }
  }
  const Pair* last = alpha + (length - 1) * S;
  const Pair ends[2] = {last[S - 1], S >= 2 ? last[S - 2] : none};
  const Pair log_z = LogSum(ends, 2);
  Pair* next = beta;  // beta at t + 1
  Pair* here = beta + S;
  for (int64_t s = 0; s < S; ++s) next[s] = s >= S - 2 ? Pair{0.0, 0.0} : none;
  for (int64_t t = length - 1; t >= 0; --t) {
    if (t < length - 1) {
      for (int64_t s = 0; s < S; ++s) {
        const Pair terms[3] = {
            Add(next[s], emission(t + 1, s)),
            s + 1 < S ? Add(next[s + 1], emission(t + 1, s + 1)) : none,
            s + 2 < S && band.skip[s + 2] ? Add(next[s + 2], emission(t + 1, s + 2)) : none};
        here[s] = LogSum(terms, 3);
      }
      std::swap(here, next);
    }
    for (int64_t s = 0; s < S; ++s) {
      const Pair a = alpha[t * S + s];
      const Pair path = PairOf(a.hi, next[s].hi, a.lo + next[s].lo);
      if (!(path.hi > kNegInf<double>)) continue;
      const double p = std::exp((path.hi - log_z.hi) + (path.lo - log_z.lo));
      grad[t * V + band.token[s]] += static_cast<T>(std::min(p, 1.0));
    }
  }
}

// -- FFI handlers -------------------------------------------------------------

template <ffi::DataType D>
using Floats = ffi::Buffer<D>;
using Ints = ffi::Buffer<ffi::S32>;

// Utterance b's frame count and band, lengths clamped to the array sizes.
struct Utterance {
  int64_t length;
  Band band;
};

Utterance UtteranceAt(const Sizes& z, int64_t b, const Ints& input_lengths, const Ints& labels,
                      const Ints& label_lengths, int32_t blank) {
  const int64_t length = std::clamp<int64_t>(input_lengths.typed_data()[b], 0, z.frames);
  const int64_t count = std::clamp<int64_t>(label_lengths.typed_data()[b], 0, z.max_labels);
  return {length, MakeBand(labels.typed_data() + b * z.max_labels, count,
                           std::clamp<int32_t>(blank, 0, static_cast<int32_t>(z.vocab - 1)),
                           z.vocab)};
}

template <ffi::DataType D>
ffi::Error CtcLoss(ffi::ThreadPool pool, Floats<D> log_probs, Ints input_lengths, Ints labels,
                   Ints label_lengths, int64_t blank, ffi::ResultBuffer<D> log_z) {
  using T = ffi::NativeType<D>;
  Sizes z;
  if (auto error = GetSizes(log_probs, input_lengths, labels, label_lengths, &z);
      error.failure()) {
    return error;
  }
  ForEntries(pool, z.batch, z.frames * z.max_states, [&](int64_t b) {
    const auto [length, band] =
        UtteranceAt(z, b, input_lengths, labels, label_lengths, static_cast<int32_t>(blank));
    Workspace space(3 * Workspace::Bytes<double>(band.num_states + 2));
    const Forward result = ForwardOne<T>(z, log_probs.typed_data() + b * z.frames * z.vocab,
                                         length, band, nullptr, nullptr, &space);
    log_z->typed_data()[b] = static_cast<T>(result.log_z);
  });
  return ffi::Error::Success();
}

template <ffi::DataType D>
ffi::Error CtcGrad(ffi::ThreadPool pool, Floats<D> log_probs, Ints input_lengths, Ints labels,
                   Ints label_lengths, int64_t blank, ffi::ResultBuffer<D> log_z,
                   ffi::ResultBuffer<D> grad) {
  using T = ffi::NativeType<D>;
  Sizes z;
  if (auto error = GetSizes(log_probs, input_lengths, labels, label_lengths, &z);
      error.failure()) {
    return error;
  }
  ForEntries(pool, z.batch, z.frames * z.max_states, [&](int64_t b) {
    const auto [length, band] =
        UtteranceAt(z, b, input_lengths, labels, label_lengths, static_cast<int32_t>(blank));
    const int64_t S = band.num_states;
    const T* rows = log_probs.typed_data() + b * z.frames * z.vocab;
    T* g = grad->typed_data() + b * z.frames * z.vocab;
    std::fill(g, g + z.frames * z.vocab, T(0));
    Workspace space(Workspace::Bytes<double>(length * S) + Workspace::Bytes<double>(length) +
                    7 * Workspace::Bytes<double>(S + 2));
    double* alpha = space.Take<double>(length * S);
    double* shift = space.Take<double>(length);
    const Forward result = ForwardOne<T>(z, rows, length, band, alpha, shift, &space);
    log_z->typed_data()[b] = static_cast<T>(result.log_z);
    if (result.log_z != result.log_z || result.log_z == kPosInf<double>) {
      std::fill(g, g + z.frames * z.vocab, kNaN<T>);  // NaN in, or a +inf log-prob
    } else if (!(result.log_z > kNegInf<double>) || length == 0) {
      return;  // infeasible: the gradient is exactly 0
    } else if (result.large) {
      Workspace pairs(Workspace::Bytes<Pair>(length * S) + Workspace::Bytes<Pair>(2 * S));
      CompensatedOne<T>(z, rows, length, band, g, &pairs);
    } else {
      BackwardOne<T>(z, rows, length, band, alpha, shift, result.log_z, g, &space);
    }
  });
  return ffi::Error::Success();
}

template <ffi::DataType D>
auto Inputs() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<Floats<D>>()  // log_probs [B, T, V]
      .template Arg<Ints>()       // input_lengths [B]
      .template Arg<Ints>()       // labels [B, U]
      .template Arg<Ints>()       // label_lengths [B]
      .template Attr<int64_t>("blank");
}

}  // namespace

// log_z [B]
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjCtcLossF32, CtcLoss<ffi::F32>,
                              Inputs<ffi::F32>().Ret<Floats<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjCtcLossF64, CtcLoss<ffi::F64>,
                              Inputs<ffi::F64>().Ret<Floats<ffi::F64>>());
// log_z [B], grad [B, T, V]
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjCtcGradF32, CtcGrad<ffi::F32>,
                              Inputs<ffi::F32>().Ret<Floats<ffi::F32>>().Ret<Floats<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjCtcGradF64, CtcGrad<ffi::F64>,
                              Inputs<ffi::F64>().Ret<Floats<ffi::F64>>().Ret<Floats<ffi::F64>>());
