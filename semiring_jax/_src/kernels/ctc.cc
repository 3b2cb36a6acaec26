// CPU kernels for the CTC loss (XLA FFI handlers): forward and backward
// recursions over the CTC band, one utterance per batch entry.
//
// Shapes: log_probs [B, T, V] (f32 or f64), input_lengths [B], labels
// [B, U], label_lengths [B] (int32); blank is an attribute. An utterance
// with n labels has S = 2n + 1 states: even states are blanks, state 2k + 1
// is label k. State s is entered from s (stay), s - 1 (move) and s - 2
// (skip a blank, when s is a label unlike the one two states back).
//
// Log domain, normalised per frame (the scaled forward-backward): each
// frame's scores are shifted by their maximum, and the shifts are summed in
// double. So float32 scores stay O(1), and posteriors exp(a + b - Z) come
// from O(1) numbers: accurate to ~1e-6 at T = 5,000 frames.
//
//   forward: alpha [B, T, S] (normalised, -inf on dead states) and shift
//     [B, T] (frame t's maximum); returns loss [B] = -log Z, +inf when no
//     alignment fits in the frames.
//   backward: given the loss cotangent [B], the gradient [B, T, V] with
//     respect to log_probs: minus each frame's token posteriors, times the
//     cotangent; exactly 0 past the input length and where the loss is +inf.

#include <type_traits>

#include "common.h"

namespace {

ffi::Error Fail(const char* what) { return FailIn("CTC kernel", what); }

// One utterance's band: tokens and which states may skip a blank.
struct Band {
  int64_t num_states = 0;  // S = 2 n + 1
  std::vector<int32_t> token;
  std::vector<bool> skip;  // s may be entered from s - 2
};

Band MakeBand(const int32_t* labels, int64_t num_labels, int32_t blank) {
  Band band;
  band.num_states = 2 * num_labels + 1;
  band.token.assign(band.num_states, blank);
  band.skip.assign(band.num_states, false);
  for (int64_t k = 0; k < num_labels; ++k) band.token[2 * k + 1] = labels[k];
  for (int64_t s = 3; s < band.num_states; s += 2) {
    band.skip[s] = band.token[s] != band.token[s - 2];
  }
  return band;
}

// log(exp(a) + exp(b) + exp(c)), -inf when all three are -inf.
inline double LogSum3(double a, double b, double c) {
  const double m = std::max(a, std::max(b, c));
  if (!(m > -HUGE_VAL)) return -HUGE_VAL;
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
  const Doubles8 result = m > -HUGE_VAL ? value : m;  // all -inf: -inf
  std::memcpy(out, &result, sizeof(result));
}

// out[s] = LogSum3(x[s + da], x[s + db], x[s + dc] + add[s + dadd]) for s < n;
// `Float` says whether the inputs were float32 (SIMD float exp and log)
// or float64 (libm, to double precision).
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
  for (; s < n; ++s) out[s] = LogSum3(x[s + da], x[s + db], x[s + dc] + add[s + dadd]);
}

// v[s] = exp(v[s]) for s < n: for float32 inputs in float SIMD (a log
// posterior <= 0 rounded to float: relative error below 2e-6 where the
// posterior exceeds 1e-9), for float64 with libm.
template <bool Float>
void Exponentiate(int64_t n, double* v) {
  int64_t s = 0;
  if constexpr (Float) {
    for (; s + 8 <= n; s += 8) {
      const Floats8 e = FastExp8(__builtin_convertvector(LoadD8(v + s), Floats8));
      const Doubles8 d = __builtin_convertvector(e, Doubles8);
      std::memcpy(v + s, &d, sizeof(d));
    }
  }
  for (; s < n; ++s) v[s] = std::exp(v[s]);
}

// Subtracts `shift`, the maximum of v[0..n) rounded to T (so that the
// shift stored as T is the one applied), and returns it; -inf, leaving v
// alone, when every entry is -inf.
template <typename T>
T Normalise(int64_t n, double* v) {
  double m = -HUGE_VAL;
  for (int64_t s = 0; s < n; ++s) m = std::max(m, v[s]);
  if (!(m > -HUGE_VAL)) return kNegInf<T>;
  const T shift = static_cast<T>(m);
  for (int64_t s = 0; s < n; ++s) v[s] -= double(shift);
  return shift;
}

struct Sizes {
  int64_t batch = 0, frames = 0, vocab = 0, max_labels = 0, max_states = 0;
};

ffi::Error GetSizes(const ffi::AnyBuffer& log_probs, const ffi::AnyBuffer& labels, Sizes* z) {
  auto lp = log_probs.dimensions();
  auto lab = labels.dimensions();
  if (lp.size() != 3 || lab.size() != 2) return Fail("log_probs must be [B, T, V], labels [B, U]");
  z->batch = lp[0];
  z->frames = lp[1];
  z->vocab = lp[2];
  z->max_labels = lab[1];
  z->max_states = 2 * lab[1] + 1;
  return ffi::Error::Success();
}

// log Z from the last frame's normalised scores and the frames' shifts.
inline double LogZ(const double* last, int64_t num_states, double total_shift) {
  const double a = last[num_states - 1];
  const double b = num_states >= 2 ? last[num_states - 2] : -HUGE_VAL;
  const double m = std::max(a, b);
  if (!(m > -HUGE_VAL)) return -HUGE_VAL;
  return total_shift + m + std::log(std::exp(a - m) + std::exp(b - m));
}

// One utterance's forward pass; returns log Z. alpha [T, W] and shift [T]
// receive the normalised scores of the first `length` frames.
template <typename T>
double ForwardOne(const Sizes& z, const T* log_probs, int64_t length, const Band& band, T* alpha,
                  T* shift) {
  const int64_t S = band.num_states, W = z.max_states;
  if (length == 0) return S == 1 ? 0.0 : -HUGE_VAL;
  // Scratch: [2 pad | S] previous scores, [S] current, [2 pad | S] skips.
  double* buffer = Scratch<double>(3 * S + 16);
  // Two score buffers, each after two -inf entries (states -2 and -1).
  double* previous = buffer + 2;
  double* current = previous + S + 2;
  double* add = current + S;  // add[s] = 0 where s may skip, else -inf
  buffer[0] = buffer[1] = current[-2] = current[-1] = -HUGE_VAL;
  add[0] = add[1] = -HUGE_VAL;
  add += 2;
  for (int64_t s = 0; s < S; ++s) add[s] = band.skip[s] ? 0.0 : -HUGE_VAL;
  double total_shift = 0;
  for (int64_t t = 0; t < length; ++t) {
    const T* row = log_probs + t * z.vocab;
    if (t == 0) {  // a path starts in the first blank or the first label
      for (int64_t s = 0; s < S; ++s) current[s] = s < 2 ? double(row[band.token[s]]) : -HUGE_VAL;
    } else {
      // From s (stay), s - 1 (move) and s - 2 (skip a blank).
      BandStep<std::is_same_v<T, float>>(S, previous, add, 0, -1, -2, 0, current);
      for (int64_t s = 0; s < S; ++s) current[s] += double(row[band.token[s]]);
    }
    const T m = Normalise<T>(S, current);
    if (!(m > kNegInf<T>)) {  // every state dead: no alignment fits
      std::fill(alpha + t * W, alpha + length * W, kNegInf<T>);
      return -HUGE_VAL;
    }
    shift[t] = m;
    total_shift += double(m);
    // Stored rounded to T: only the backward's posteriors read them.
    std::copy(current, current + S, alpha + t * W);
    std::fill(alpha + t * W + S, alpha + (t + 1) * W, kNegInf<T>);
    std::swap(previous, current);
  }
  return LogZ(previous, S, total_shift);
}

// One utterance's gradient with respect to its log_probs rows [T, V].
template <typename T>
void BackwardOne(const Sizes& z, const T* log_probs, int64_t length, const Band& band,
                 const T* alpha, const T* shift, bool feasible, T cotangent, T* grad) {
  const int64_t S = band.num_states, W = z.max_states, V = z.vocab;
  std::fill(grad, grad + z.frames * V, T(0));
  if (!feasible || length == 0 || cotangent == T(0)) return;
  // Scratch: x = beta + emission [S | 2 pad], beta [S], skips [S | 2 pad],
  // posteriors [S].
  double* buffer = Scratch<double>(4 * S + 8);
  double* x = buffer;
  double* beta = x + S + 2;
  double* add = beta + S;
  double* posterior = add + S + 2;
  x[S] = x[S + 1] = -HUGE_VAL;
  for (int64_t s = 0; s < S + 2; ++s) add[s] = s < S && band.skip[s] ? 0.0 : -HUGE_VAL;
  // alpha_t = alpha~_t + A_t (A_t: the shifts' prefix sum) and beta_t =
  // beta~_t + B_t, so posterior = exp(alpha~ + beta~ + A_t + B_t - log Z).
  double prefix = 0;
  for (int64_t t = 0; t < length; ++t) prefix += double(shift[t]);
  // log Z again, in double: the shifts' sum plus the last frame's ending.
  for (int64_t s = 0; s < S; ++s) beta[s] = double(alpha[(length - 1) * W + s]);
  const double log_z = LogZ(beta, S, prefix);
  for (int64_t s = 0; s < S; ++s) beta[s] = s >= S - 2 ? 0.0 : -HUGE_VAL;
  double beta_shift = 0;
  for (int64_t t = length - 1; t >= 0; --t) {
    const T* a = alpha + t * W;
    const double offset = prefix + beta_shift - log_z;
    for (int64_t s = 0; s < S; ++s) posterior[s] = double(a[s]) + beta[s] + offset;
    Exponentiate<std::is_same_v<T, float>>(S, posterior);
    T* g = grad + t * V;
    for (int64_t s = 0; s < S; ++s) g[band.token[s]] -= cotangent * T(posterior[s]);
    if (t == 0) break;
    prefix -= double(shift[t]);  // now A_{t - 1}
    const T* row = log_probs + t * V;
    for (int64_t s = 0; s < S; ++s) x[s] = beta[s] + double(row[band.token[s]]);
    // To s (stay), s + 1 (move) and s + 2 (a skip into s + 2).
    BandStep<std::is_same_v<T, float>>(S, x, add, 0, 1, 2, 2, beta);
    const T m = Normalise<T>(S, beta);
    if (!(m > kNegInf<T>)) return;  // cannot happen when log Z is finite
    beta_shift += double(m);
  }
}

// Utterance b's frame count and band, lengths clamped to the array sizes.
struct Utterance {
  int64_t length;
  Band band;
};

Utterance UtteranceAt(const Sizes& z, int64_t b, const ffi::AnyBuffer& input_lengths,
                      const ffi::AnyBuffer& labels, const ffi::AnyBuffer& label_lengths,
                      int32_t blank) {
  const int64_t length = std::clamp<int64_t>(input_lengths.typed_data<int32_t>()[b], 0, z.frames);
  const int64_t count =
      std::clamp<int64_t>(label_lengths.typed_data<int32_t>()[b], 0, z.max_labels);
  return {length, MakeBand(labels.typed_data<int32_t>() + b * z.max_labels, count, blank)};
}

template <typename T>
ffi::Error ForwardTyped(ffi::ThreadPool& pool, const Sizes& z, int32_t blank,
                        ffi::AnyBuffer log_probs, ffi::AnyBuffer input_lengths,
                        ffi::AnyBuffer labels, ffi::AnyBuffer label_lengths,
                        ffi::Result<ffi::AnyBuffer> loss, ffi::Result<ffi::AnyBuffer> alpha,
                        ffi::Result<ffi::AnyBuffer> shift) {
  const int64_t per_entry = z.frames * z.max_states;
  ForEntries(pool, z.batch, per_entry, [&](int64_t b) {
    const auto [length, band] = UtteranceAt(z, b, input_lengths, labels, label_lengths, blank);
    T* a = alpha->typed_data<T>() + b * per_entry;
    T* sh = shift->typed_data<T>() + b * z.frames;
    // Frames past the length (and any a dead utterance leaves) hold -inf
    // scores and zero shifts.
    std::fill(sh, sh + z.frames, T(0));
    std::fill(a + length * z.max_states, a + per_entry, kNegInf<T>);
    const double log_z = ForwardOne<T>(z, log_probs.typed_data<T>() + b * z.frames * z.vocab,
                                       length, band, a, sh);
    loss->typed_data<T>()[b] = !(log_z > -HUGE_VAL) ? std::numeric_limits<T>::infinity()
                               : log_z >= 0          ? T(0)  // +0.0, not -0.0
                                                     : T(-log_z);
  });
  return ffi::Error::Success();
}

ffi::Error CtcForward(ffi::ThreadPool pool, ffi::AnyBuffer log_probs, ffi::AnyBuffer input_lengths,
                      ffi::AnyBuffer labels, ffi::AnyBuffer label_lengths, int64_t blank,
                      ffi::Result<ffi::AnyBuffer> loss, ffi::Result<ffi::AnyBuffer> alpha,
                      ffi::Result<ffi::AnyBuffer> shift) {
  Sizes z;
  if (auto error = GetSizes(log_probs, labels, &z); error.failure()) return error;
  switch (log_probs.element_type()) {
    case ffi::F32:
      return ForwardTyped<float>(pool, z, static_cast<int32_t>(blank), log_probs, input_lengths,
                                 labels, label_lengths, loss, alpha, shift);
    case ffi::F64:
      return ForwardTyped<double>(pool, z, static_cast<int32_t>(blank), log_probs, input_lengths,
                                  labels, label_lengths, loss, alpha, shift);
    default:
      return Fail("log_probs must be float32 or float64");
  }
}

template <typename T>
ffi::Error BackwardTyped(ffi::ThreadPool& pool, const Sizes& z, int32_t blank,
                         ffi::AnyBuffer log_probs, ffi::AnyBuffer input_lengths,
                         ffi::AnyBuffer labels, ffi::AnyBuffer label_lengths,
                         ffi::AnyBuffer alpha, ffi::AnyBuffer shift, ffi::AnyBuffer loss,
                         ffi::AnyBuffer cotangent,
                         ffi::Result<ffi::AnyBuffer> grad) {
  const int64_t per_entry = z.frames * z.max_states;
  ForEntries(pool, z.batch, per_entry, [&](int64_t b) {
    const auto [length, band] = UtteranceAt(z, b, input_lengths, labels, label_lengths, blank);
    BackwardOne<T>(z, log_probs.typed_data<T>() + b * z.frames * z.vocab, length, band,
                   alpha.typed_data<T>() + b * per_entry, shift.typed_data<T>() + b * z.frames,
                   std::isfinite(double(loss.typed_data<T>()[b])), cotangent.typed_data<T>()[b],
                   grad->typed_data<T>() + b * z.frames * z.vocab);
  });
  return ffi::Error::Success();
}

ffi::Error CtcBackward(ffi::ThreadPool pool, ffi::AnyBuffer log_probs,
                       ffi::AnyBuffer input_lengths, ffi::AnyBuffer labels,
                       ffi::AnyBuffer label_lengths, ffi::AnyBuffer alpha, ffi::AnyBuffer shift,
                       ffi::AnyBuffer loss, ffi::AnyBuffer cotangent, int64_t blank,
                       ffi::Result<ffi::AnyBuffer> grad) {
  Sizes z;
  if (auto error = GetSizes(log_probs, labels, &z); error.failure()) return error;
  switch (log_probs.element_type()) {
    case ffi::F32:
      return BackwardTyped<float>(pool, z, static_cast<int32_t>(blank), log_probs, input_lengths,
                                  labels, label_lengths, alpha, shift, loss,
                                  cotangent, grad);
    case ffi::F64:
      return BackwardTyped<double>(pool, z, static_cast<int32_t>(blank), log_probs,
                                   input_lengths, labels, label_lengths, alpha, shift, loss,
                                   cotangent, grad);
    default:
      return Fail("log_probs must be float32 or float64");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SjCtcForward, CtcForward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // log_probs [B, T, V]
                                  .Arg<ffi::AnyBuffer>()  // input_lengths [B] int32
                                  .Arg<ffi::AnyBuffer>()  // labels [B, U] int32
                                  .Arg<ffi::AnyBuffer>()  // label_lengths [B] int32
                                  .Attr<int64_t>("blank")
                                  .Ret<ffi::AnyBuffer>()  // loss [B]
                                  .Ret<ffi::AnyBuffer>()  // alpha [B, T, 2U + 1]
                                  .Ret<ffi::AnyBuffer>());  // shift [B, T]

XLA_FFI_DEFINE_HANDLER_SYMBOL(SjCtcBackward, CtcBackward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // log_probs [B, T, V]
                                  .Arg<ffi::AnyBuffer>()  // input_lengths [B] int32
                                  .Arg<ffi::AnyBuffer>()  // labels [B, U] int32
                                  .Arg<ffi::AnyBuffer>()  // label_lengths [B] int32
                                  .Arg<ffi::AnyBuffer>()  // alpha [B, T, 2U + 1]
                                  .Arg<ffi::AnyBuffer>()  // shift [B, T]
                                  .Arg<ffi::AnyBuffer>()  // loss [B]
                                  .Arg<ffi::AnyBuffer>()  // cotangent [B]
                                  .Attr<int64_t>("blank")
                                  .Ret<ffi::AnyBuffer>());  // grad [B, T, V]
