// CPU kernels for the transducer (RNN-T) grid over a band (XLA FFI
// handlers): the forward and backward recursions of one utterance per batch
// entry, over the anti-diagonals of its band, eight positions at a time.
//
// Shapes: blank, emit [B, T, W] (f32 or f64: one handler per dtype), the
// log-probs of the blank and of the label move out of cell (t, k), node
// (t, s_t + k); starts [B, T + 1] (s_t; row T unused), frame_lengths [B],
// label_lengths [B] (int32); the attribute num_positions is U + 1. A cell
// is read only inside its utterance's grid: t < T_b and u = s_t + k <= U_b
// (the label move only for u < U_b). Lengths are clamped to [0, T] and
// [0, U], starts to [0, U + 1], so memory is bounded by T (U + W) whatever
// they hold; starts are made non-decreasing (their running maximum): the
// callers pass them so, and mark utterances whose ranges were not.
//
//   SjRnntLoss:  log P [B] (-inf without a path).
//   SjRnntGrad:  log P [B] and the posteriors of the blank and the label
//     move out of each cell, [B, T, W] each: ∂ log P / ∂ blank and
//     ∂ log P / ∂ emit. Exactly 0 outside the grid and without a path.
//
// A path starts at (0, 0) and ends with the blank out of (T_b - 1, U_b).
// Node (t, u) lies on diagonal n = t + u, and every node of a diagonal
// depends on the one before only, so the recursion runs a diagonal at a
// time, over a skewed copy of the band: row n, position k holds node
// (t, s_t + k) with t + s_t + k = n. A label move goes to position k + 1 of
// the next row; a blank move to position k - (s_{t+1} - s_t), through an
// index per cell (the identity for the full grid). Rows are padded to a
// multiple of eight positions, with -inf, so each step is whole vectors.
//
// Scores are double for either input dtype. For float32 inputs, exp and
// log run in float SIMD on the O(1) differences of log-add (relative
// error below 2e-7 a step); float64 inputs use libm. A NaN read inside the
// grid gives log P NaN and NaN posteriors on the whole grid (NaN in, NaN
// out); a +inf log-prob on a path gives log P +inf and NaN posteriors.

#include <type_traits>

#include "common.h"

namespace {

ffi::Error Fail(const std::string& what) { return FailIn("RNN-T kernel", what); }

typedef double Doubles8 __attribute__((vector_size(64)));

inline Doubles8 LoadD8(const double* p) {
  Doubles8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// log(exp(a) + exp(b)): -inf when both are, +inf when one is (no NaN here).
inline double LogAdd(double a, double b) {
  const double m = std::max(a, b);
  if (!(m > kNegInf<double>) || m == kPosInf<double>) return m;
  return m + std::log1p(std::exp(std::min(a, b) - m));
}

// The same eight at a time for float32 inputs: exp and log in float SIMD
// on the O(1) differences, the sum kept in double.
inline void LogAddx8(Doubles8 va, Doubles8 vb, double* out) {
  const Doubles8 m = va > vb ? va : vb;
  const Floats8 da = __builtin_convertvector(va - m, Floats8);
  const Floats8 db = __builtin_convertvector(vb - m, Floats8);
  const Floats8 log_sum = FastLog8(FastExp8(da) + FastExp8(db));
  const Doubles8 value = m + __builtin_convertvector(log_sum, Doubles8);
  const Doubles8 result = (m > kNegInf<double>) & (m < kPosInf<double>) ? value : m;
  std::memcpy(out, &result, sizeof(result));
}

// out[k] = LogAdd(a[k], b[k]) for k < n (n a multiple of 8 when Float).
template <bool Float>
void LogAddRow(int64_t n, const double* a, const double* b, double* out) {
  if constexpr (Float) {
    for (int64_t k = 0; k < n; k += 8) LogAddx8(LoadD8(a + k), LoadD8(b + k), out + k);
  } else {
    for (int64_t k = 0; k < n; ++k) out[k] = LogAdd(a[k], b[k]);
  }
}

struct Sizes {
  int64_t batch = 0, frames = 0, width = 0, max_labels = 0;  // U
};

template <typename F, typename I>
ffi::Error GetSizes(const F& blank, const F& emit, const I& starts, const I& frame_lengths,
                    const I& label_lengths, int64_t num_positions, Sizes* z) {
  auto dims = blank.dimensions();
  auto emit_dims = emit.dimensions();
  auto start_dims = starts.dimensions();
  if (dims.size() != 3 || emit_dims.size() != 3 || start_dims.size() != 2) {
    return Fail("blank and emit must be [B, T, W], starts [B, T + 1]");
  }
  z->batch = dims[0];
  z->frames = dims[1];
  z->width = dims[2];
  for (size_t i = 0; i < 3; ++i) {
    if (emit_dims[i] != dims[i]) return Fail("blank and emit differ in shape");
  }
  if (start_dims[0] != z->batch || start_dims[1] != z->frames + 1 ||
      frame_lengths.element_count() != static_cast<size_t>(z->batch) ||
      label_lengths.element_count() != static_cast<size_t>(z->batch)) {
    return Fail("starts or the lengths do not match blank's [B, T, W]");
  }
  if (z->width < 1 || num_positions < 1) return Fail("the band has no positions");
  z->max_labels = num_positions - 1;
  return ffi::Error::Success();
}

// One utterance's band on the skewed layout: rows n < N = T_b + U_b (the
// last holds the end node), each `stride` doubles, position k at row
// pointer + k, with -inf at k = -1 and from k = W on.
struct Skewed {
  int64_t length = 0;  // T_b
  int64_t labels = 0;  // U_b
  int64_t rows = 0;    // N
  int64_t padded = 0;  // W rounded up to a multiple of 8, plus one
  int64_t stride = 0;
  std::vector<int64_t> start;  // s_t, t < T_b (non-decreasing)
  bool nan = false;
};

inline int64_t Cell(const Skewed& s, int64_t n, int64_t k) { return n * s.stride + 1 + k; }

// Utterance b's lengths and starts, clamped to the arrays.
template <typename I>
Skewed Layout(const Sizes& z, int64_t b, const I& starts, const I& frame_lengths,
              const I& label_lengths) {
  Skewed s;
  s.length = std::clamp<int64_t>(frame_lengths.typed_data()[b], 0, z.frames);
  s.labels = std::clamp<int64_t>(label_lengths.typed_data()[b], 0, z.max_labels);
  s.rows = s.length > 0 ? s.length + s.labels : 0;
  s.padded = (z.width + 8) / 8 * 8;
  s.stride = s.padded + 2;
  s.start.resize(s.length);
  const int32_t* row = starts.typed_data() + b * (z.frames + 1);
  int64_t previous = 0;
  for (int64_t t = 0; t < s.length; ++t) {
    previous = std::clamp<int64_t>(row[t], previous, z.max_labels + 1);
    s.start[t] = previous;
  }
  return s;
}

// The moves out of each cell, skewed (-inf where none), and the position
// of each cell's blank predecessor and successor on the rows before and
// after (`width`, a -inf cell, where there is none). Reads each in-grid
// cell once, noting NaN.
template <typename T>
void Skew(const Sizes& z, const T* blank, const T* emit, Skewed* s, double* blank_out,
          double* emit_out, int32_t* from, int32_t* to) {
  const int64_t W = z.width, cells = s->rows * s->stride;
  std::fill(blank_out, blank_out + cells, kNegInf<double>);
  std::fill(emit_out, emit_out + cells, kNegInf<double>);
  std::fill(from, from + cells, static_cast<int32_t>(W));
  if (to != nullptr) std::fill(to, to + cells, static_cast<int32_t>(W));
  bool nan = false;
  for (int64_t t = 0; t < s->length; ++t) {
    const int64_t st = s->start[t];
    const int64_t rise_in = t > 0 ? st - s->start[t - 1] : 0;
    const int64_t rise_out = t + 1 < s->length ? s->start[t + 1] - st : 0;
    const int64_t count = std::min<int64_t>(W, s->labels - st + 1);
    for (int64_t k = 0; k < count; ++k) {
      const int64_t c = Cell(*s, t + st + k, k);
      const double b = static_cast<double>(blank[t * W + k]);
      const double e = st + k < s->labels ? static_cast<double>(emit[t * W + k]) : kNegInf<double>;
      nan |= b != b || e != e;
      blank_out[c] = b;
      emit_out[c] = e;
      if (t > 0 && k + rise_in < W) from[c] = static_cast<int32_t>(k + rise_in);
      if (to != nullptr && t + 1 < s->length && k - rise_out >= 0) {
        to[c] = static_cast<int32_t>(k - rise_out);
      }
    }
  }
  s->nan = nan;
}

// The end node's row and position (position outside [0, W): not in the band).
inline int64_t EndPosition(const Skewed& s) { return s.labels - s.start[s.length - 1]; }

// α over the skewed rows: alpha [N * stride] (-inf off the band's nodes).
// Returns log P.
template <bool Float>
double Forward(const Sizes& z, const Skewed& s, const double* blank_out, const double* emit_out,
               const int32_t* from, double* alpha, double* gathered, double* shifted) {
  const int64_t W = z.width;
  std::fill(alpha, alpha + s.rows * s.stride, kNegInf<double>);
  if (s.start[0] == 0) alpha[Cell(s, 0, 0)] = 0.0;  // node (0, 0)
  std::fill(gathered + W, gathered + s.padded, kNegInf<double>);
  std::fill(shifted, shifted + s.padded, kNegInf<double>);
  for (int64_t n = 1; n < s.rows; ++n) {
    const int64_t before = Cell(s, n - 1, 0), here = Cell(s, n, 0);
    // Through the blank predecessor: α + blank there, at its position.
    for (int64_t k = 0; k < W; ++k) {
      const int64_t j = before + from[here + k];
      gathered[k] = Times(alpha[j], blank_out[j]);
    }
    // Through the label predecessor, one position down the row before.
    // (The top position's label move leaves the band: shifted[W] stays -inf.)
    for (int64_t k = 1; k < W; ++k) {
      shifted[k] = Times(alpha[before + k - 1], emit_out[before + k - 1]);
    }
    LogAddRow<Float>(s.padded, gathered, shifted, alpha + here);
    std::fill(alpha + here + W, alpha + here + s.padded, kNegInf<double>);
  }
  const int64_t k = EndPosition(s);
  if (k < 0 || k >= W) return kNegInf<double>;
  const int64_t end = Cell(s, s.rows - 1, k);
  return Times(alpha[end], blank_out[end]);
}

// out[k] = min(exp(a[k] + b[k] - log_p), 1) for k < n (n a multiple of 8
// when Float): the posteriors of one row's moves, 0 where a or b is -inf.
template <bool Float>
void PosteriorRow(int64_t n, const double* a, const double* b, double log_p, double* out) {
  if constexpr (Float) {
    for (int64_t k = 0; k < n; k += 8) {
      const Doubles8 x = LoadD8(a + k) + LoadD8(b + k) - log_p;
      const Floats8 p = FastExp8(__builtin_convertvector(x, Floats8));
      const Doubles8 result = __builtin_convertvector(p < 1.0f ? p : Floats8{} + 1.0f, Doubles8);
      std::memcpy(out + k, &result, sizeof(result));
    }
  } else {
    for (int64_t k = 0; k < n; ++k) out[k] = std::min(std::exp(a[k] + b[k] - log_p), 1.0);
  }
}

// β over the skewed rows (the end node's holds its final blank), and with
// it the posteriors of each cell's moves, exp(α + move + β(successor) -
// log P), written over blank_out and emit_out row by row (a row's moves
// are not read once β has passed it); then copied to blank_post and
// emit_post [T, W] (zeros on entry).
template <bool Float, typename T>
void Backward(const Sizes& z, const Skewed& s, double* blank_out, double* emit_out,
              const int32_t* to, const double* alpha, double log_p, double* beta,
              double* gathered, double* shifted, T* blank_post, T* emit_post) {
  const int64_t W = z.width, last = s.rows - 1;
  std::fill(beta, beta + s.rows * s.stride, kNegInf<double>);
  std::fill(gathered, gathered + s.padded, kNegInf<double>);
  std::fill(shifted, shifted + s.padded, kNegInf<double>);
  // The end node's blank leaves the grid: β after it is 0 (log 1).
  const int64_t end_k = EndPosition(s), last_row = Cell(s, last, 0), end = last_row + end_k;
  beta[end] = blank_out[end];
  gathered[end_k] = blank_out[end];
  PosteriorRow<Float>(s.padded, alpha + last_row, gathered, log_p, blank_out + last_row);
  std::fill(emit_out + last_row, emit_out + last_row + s.padded, 0.0);
  for (int64_t n = last - 1; n >= 0; --n) {
    const int64_t here = Cell(s, n, 0), after = Cell(s, n + 1, 0);
    for (int64_t k = 0; k < W; ++k) {
      gathered[k] = Times(blank_out[here + k], beta[after + to[here + k]]);
    }
    for (int64_t k = 0; k < s.padded; ++k) {
      shifted[k] = Times(emit_out[here + k], beta[after + k + 1]);
    }
    LogAddRow<Float>(s.padded, gathered, shifted, beta + here);
    std::fill(beta + here + W, beta + here + s.padded, kNegInf<double>);
    PosteriorRow<Float>(s.padded, alpha + here, gathered, log_p, blank_out + here);
    PosteriorRow<Float>(s.padded, alpha + here, shifted, log_p, emit_out + here);
  }
  for (int64_t t = 0; t < s.length; ++t) {
    const int64_t st = s.start[t];
    const int64_t count = std::min<int64_t>(W, s.labels - st + 1);
    for (int64_t k = 0; k < count; ++k) {
      const int64_t c = Cell(s, t + st + k, k);
      blank_post[t * W + k] = static_cast<T>(blank_out[c]);
      emit_post[t * W + k] = static_cast<T>(emit_out[c]);
    }
  }
}

// The posteriors' fill for a NaN log P: NaN on the grid, 0 off it.
template <typename T>
void FillGrid(const Sizes& z, const Skewed& s, T value, T* blank_post, T* emit_post) {
  for (int64_t t = 0; t < s.length; ++t) {
    const int64_t count = std::min<int64_t>(z.width, s.labels - s.start[t] + 1);
    for (int64_t k = 0; k < count; ++k) {
      blank_post[t * z.width + k] = value;
      if (s.start[t] + k < s.labels) emit_post[t * z.width + k] = value;
    }
  }
}

// -- FFI handlers -------------------------------------------------------------

template <ffi::DataType D>
using Floats = ffi::Buffer<D>;
using Ints = ffi::Buffer<ffi::S32>;

// Bytes of one utterance's skewed arrays (`grad`: with β and successors).
inline size_t SkewedBytes(const Skewed& s, bool grad) {
  const int64_t cells = std::max<int64_t>(s.rows, 1) * s.stride;
  return (grad ? 4 : 3) * Workspace::Bytes<double>(cells) +
         (grad ? 2 : 1) * Workspace::Bytes<int32_t>(cells) +
         2 * Workspace::Bytes<double>(s.stride);
}

// Runs one utterance: log P, and with posteriors (not null) its gradient.
template <typename T>
double RunOne(const Sizes& z, const T* blank, const T* emit, Skewed* s, T* blank_post,
              T* emit_post) {
  const bool grad = blank_post != nullptr;
  if (grad) {
    std::fill(blank_post, blank_post + z.frames * z.width, T(0));
    std::fill(emit_post, emit_post + z.frames * z.width, T(0));
  }
  if (s->length == 0) return kNegInf<double>;  // a path ends with a blank from a frame
  Workspace space(SkewedBytes(*s, grad));
  const int64_t cells = s->rows * s->stride;
  double* blank_out = space.Take<double>(cells);
  double* emit_out = space.Take<double>(cells);
  double* alpha = space.Take<double>(cells);
  double* beta = grad ? space.Take<double>(cells) : nullptr;
  int32_t* from = space.Take<int32_t>(cells);
  int32_t* to = grad ? space.Take<int32_t>(cells) : nullptr;
  double* gathered = space.Take<double>(s->stride) + 1;
  double* shifted = space.Take<double>(s->stride) + 1;
  Skew<T>(z, blank, emit, s, blank_out, emit_out, from, to);
  if (s->nan) {
    if (grad) FillGrid<T>(z, *s, kNaN<T>, blank_post, emit_post);
    return kNaN<double>;
  }
  constexpr bool kFloat = std::is_same_v<T, float>;
  const double log_p = Forward<kFloat>(z, *s, blank_out, emit_out, from, alpha, gathered, shifted);
  if (!grad || !(log_p > kNegInf<double>)) return log_p;
  if (log_p == kPosInf<double>) {
    FillGrid<T>(z, *s, kNaN<T>, blank_post, emit_post);
    return log_p;
  }
  Backward<kFloat, T>(z, *s, blank_out, emit_out, to, alpha, log_p, beta, gathered, shifted,
                      blank_post, emit_post);
  return log_p;
}

// Every utterance of a batch on XLA's threads: log_p [B], and where
// blank_post and emit_post are not null, the posteriors [B, T, W].
template <ffi::DataType D>
ffi::Error RunBatch(ffi::ThreadPool& pool, const Floats<D>& blank, const Floats<D>& emit,
                    const Ints& starts, const Ints& frame_lengths, const Ints& label_lengths,
                    int64_t num_positions, ffi::NativeType<D>* log_p,
                    ffi::NativeType<D>* blank_post, ffi::NativeType<D>* emit_post) {
  using T = ffi::NativeType<D>;
  Sizes z;
  if (auto error = GetSizes(blank, emit, starts, frame_lengths, label_lengths, num_positions, &z);
      error.failure()) {
    return error;
  }
  const int64_t per_entry = z.frames * z.width;
  ForEntries(pool, z.batch, per_entry, [&](int64_t b) {
    Skewed s = Layout(z, b, starts, frame_lengths, label_lengths);
    const T* blank_b = blank.typed_data() + b * per_entry;
    const T* emit_b = emit.typed_data() + b * per_entry;
    T* blank_post_b = blank_post != nullptr ? blank_post + b * per_entry : nullptr;
    T* emit_post_b = emit_post != nullptr ? emit_post + b * per_entry : nullptr;
    log_p[b] = static_cast<T>(RunOne<T>(z, blank_b, emit_b, &s, blank_post_b, emit_post_b));
  });
  return ffi::Error::Success();
}

template <ffi::DataType D>
ffi::Error RnntLoss(ffi::ThreadPool pool, Floats<D> blank, Floats<D> emit, Ints starts,
                    Ints frame_lengths, Ints label_lengths, int64_t num_positions,
                    ffi::ResultBuffer<D> log_p) {
  return RunBatch<D>(pool, blank, emit, starts, frame_lengths, label_lengths, num_positions,
                     log_p->typed_data(), nullptr, nullptr);
}

template <ffi::DataType D>
ffi::Error RnntGrad(ffi::ThreadPool pool, Floats<D> blank, Floats<D> emit, Ints starts,
                    Ints frame_lengths, Ints label_lengths, int64_t num_positions,
                    ffi::ResultBuffer<D> log_p, ffi::ResultBuffer<D> blank_post,
                    ffi::ResultBuffer<D> emit_post) {
  return RunBatch<D>(pool, blank, emit, starts, frame_lengths, label_lengths, num_positions,
                     log_p->typed_data(), blank_post->typed_data(), emit_post->typed_data());
}

template <ffi::DataType D>
auto Inputs() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<Floats<D>>()           // blank [B, T, W]
      .template Arg<Floats<D>>()  // emit [B, T, W]
      .template Arg<Ints>()       // starts [B, T + 1]
      .template Arg<Ints>()       // frame_lengths [B]
      .template Arg<Ints>()       // label_lengths [B]
      .template Attr<int64_t>("num_positions");  // U + 1
}

}  // namespace

// log_p [B]
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjRnntLossF32, RnntLoss<ffi::F32>,
                              Inputs<ffi::F32>().Ret<Floats<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjRnntLossF64, RnntLoss<ffi::F64>,
                              Inputs<ffi::F64>().Ret<Floats<ffi::F64>>());
// log_p [B], blank_post [B, T, W], emit_post [B, T, W]
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjRnntGradF32, RnntGrad<ffi::F32>,
                              Inputs<ffi::F32>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>()
                                  .Ret<Floats<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjRnntGradF64, RnntGrad<ffi::F64>,
                              Inputs<ffi::F64>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Floats<ffi::F64>>()
                                  .Ret<Floats<ffi::F64>>());
