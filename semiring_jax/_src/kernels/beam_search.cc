// The frame-synchronous beam search of `intersect_dense_pruned`
// (decoding/beam_search.py's traced search, the same choices), as token
// passing: per frame, only the active states' arcs are read, each
// destination's best candidate is kept in an [S] table whose touched entries
// are listed (and reset after the frame), and the K best of them are chosen
// by a partial sort. Work per frame is O(active arcs + n log K), n the
// destinations reached; the traced search pays for segment reductions over
// [S] buffers and a top-K over all E edge slots at every frame.
//
// The choices are the traced search's, bit for bit: scores in the inputs'
// type, added in its order ((score + weight) + emission); edges numbered in
// slot order and cut at `expand`; a destination's best is its first edge
// among ties; the K best in (score descending, edge ascending) order, as
// `jax.lax.top_k` ranks them; kept when within `search_beam` of the frame's
// best or among the `min_active` best. The traced search keeps NaN
// candidates each apart: an utterance whose candidates hold a NaN or +inf is
// flagged instead, and the caller runs the traced search for it.

#include "common.h"

namespace {

ffi::Error Fail(const std::string& what) { return FailIn("beam search kernel", what); }

using Ints = ffi::Buffer<ffi::S32>;

template <ffi::DataType D>
using Floats = ffi::Buffer<D>;

struct Graph {
  int64_t num_states;
  int64_t num_arcs;  // the spare arc included
  const int32_t* out_start;
  const int32_t* dst;
  const int32_t* label;
};

// One destination's best candidate this frame.
template <typename T>
struct Candidate {
  T score;
  int64_t edge;
  int32_t state;
};

// Utterance b's search; false when a candidate was NaN or +inf (flagged).
template <typename T>
bool SearchOne(const Graph& g, const T* weight, const T* rows, int64_t vocab, int64_t length,
               int64_t frames, int64_t slots, int64_t expand, int64_t min_active, T beam,
               int32_t* out, Workspace* space) {
  T* best = space->Take<T>(g.num_states);
  int64_t* first = space->Take<int64_t>(g.num_states);
  int32_t* touched = space->Take<int32_t>(std::min(expand, g.num_states));
  Candidate<T>* reached = space->Take<Candidate<T>>(std::min(expand, g.num_states));
  int32_t* states = space->Take<int32_t>(slots);
  T* scores = space->Take<T>(slots);
  std::fill(best, best + g.num_states, kNegInf<T>);
  std::fill(states, states + slots, -1);
  std::fill(scores, scores + slots, kNegInf<T>);
  states[0] = 0;
  scores[0] = T(0);
  std::copy(states, states + slots, out);
  const int64_t kept_max = std::min(slots, expand);
  for (int64_t t = 0; t < frames; ++t) {
    int32_t* row = out + (t + 1) * slots;
    if (t >= length) {  // past the utterance: its slots stay
      std::copy(states, states + slots, row);
      continue;
    }
    const T* frame = rows + t * vocab;
    int64_t edge = 0, count = 0;
    for (int64_t k = 0; k < slots && edge < expand; ++k) {
      const int32_t s = states[k];
      if (s < 0) continue;
      const T from = scores[k];
      const int32_t end = g.out_start[s + 1];
      for (int32_t a = g.out_start[s]; a < end && edge < expand; ++a, ++edge) {
        const T candidate = from + weight[a] + frame[g.label[a]];
        if (candidate != candidate || candidate == kPosInf<T>) return false;
        if (!(candidate > kNegInf<T>)) continue;
        const int32_t d = g.dst[a];
        if (best[d] == kNegInf<T>) {
          touched[count++] = d;
          best[d] = candidate;
          first[d] = edge;
        } else if (candidate > best[d]) {
          best[d] = candidate;
          first[d] = edge;
        }
      }
    }
    T top = kNegInf<T>;
    for (int64_t i = 0; i < count; ++i) {
      const int32_t d = touched[i];
      reached[i] = {best[d], first[d], d};
      top = std::max(top, best[d]);
      best[d] = kNegInf<T>;
    }
    // Kept: a prefix of the reached in (score descending, edge ascending)
    // order, at most K long: those within the beam of the best, but at
    // least the min_active first. So only the within-beam ones are sorted,
    // or, when fewer than min_active are, the min_active best of all.
    const auto before = [](const Candidate<T>& x, const Candidate<T>& y) {
      return x.score > y.score || (x.score == y.score && x.edge < y.edge);
    };
    const T threshold = top - beam;
    Candidate<T>* within = std::partition(
        reached, reached + count, [threshold](const Candidate<T>& c) { return c.score >= threshold; });
    const int64_t w = within - reached;
    const int64_t n = std::min({kept_max, count, std::max(w, min_active)});
    std::partial_sort(reached, reached + n, reached + (n <= w ? w : count), before);
    for (int64_t k = 0; k < n; ++k) {
      states[k] = reached[k].state;
      scores[k] = reached[k].score;
    }
    std::fill(states + n, states + slots, -1);
    std::fill(scores + n, scores + slots, kNegInf<T>);
    std::copy(states, states + slots, row);
  }
  return true;
}

template <ffi::DataType D>
ffi::Error BeamSearch(ffi::ThreadPool pool, Ints out_start, Ints dst, Ints label,
                      Floats<D> weight, Floats<D> emissions, Ints lengths, double search_beam,
                      int64_t slots, int64_t expand, int64_t min_active,
                      ffi::ResultBuffer<ffi::S32> active, ffi::ResultBuffer<ffi::S32> flagged) {
  using T = ffi::NativeType<D>;
  const auto dims = emissions.dimensions();
  if (dims.size() != 3) return Fail("emissions must be [B, T, V]");
  const int64_t batch = dims[0], frames = dims[1], vocab = dims[2];
  Graph g{static_cast<int64_t>(out_start.element_count()) - 1,
          static_cast<int64_t>(dst.element_count()), out_start.typed_data(), dst.typed_data(),
          label.typed_data()};
  if (g.num_states < 1) return Fail("the graph needs a state");
  if (static_cast<int64_t>(label.element_count()) != g.num_arcs ||
      static_cast<int64_t>(weight.element_count()) != g.num_arcs) {
    return Fail("dst, label and weight must have one entry per arc");
  }
  if (static_cast<int64_t>(lengths.element_count()) != batch) return Fail("lengths must be [B]");
  if (slots < 1 || expand < 1 || min_active < 0) return Fail("bad slots, expand or min_active");
  if (static_cast<int64_t>(active->element_count()) != batch * (frames + 1) * slots) {
    return Fail("the output must be [B, T + 1, K]");
  }
  // The tables are the caller's: checked, so that another graph's is an
  // error and never a stray read.
  if (g.out_start[0] != 0) return Fail("out_start must start at 0");
  for (int64_t s = 0; s < g.num_states; ++s) {
    if (g.out_start[s + 1] < g.out_start[s] || g.out_start[s + 1] > g.num_arcs) {
      return Fail("out_start must be non-decreasing and within the arcs, at state " +
                  std::to_string(s));
    }
  }
  for (int64_t a = 0; a < g.num_arcs; ++a) {
    if (g.dst[a] < 0 || g.dst[a] >= g.num_states || g.label[a] < 0 || g.label[a] >= vocab) {
      return Fail("arc " + std::to_string(a) + "'s destination or label is out of range");
    }
  }
  const int64_t reach = std::min(expand, g.num_states);
  const size_t bytes = Workspace::Bytes<T>(g.num_states) +
                       Workspace::Bytes<int64_t>(g.num_states) +
                       Workspace::Bytes<int32_t>(reach) + Workspace::Bytes<Candidate<T>>(reach) +
                       Workspace::Bytes<int32_t>(slots) + Workspace::Bytes<T>(slots);
  const T beam = static_cast<T>(search_beam);
  ForEntries(pool, batch, frames * std::min(expand, g.num_arcs), [&](int64_t b) {
    Workspace space(bytes);
    const int64_t length = std::clamp<int64_t>(lengths.typed_data()[b], 0, frames);
    const bool ok = SearchOne<T>(g, weight.typed_data(), emissions.typed_data() + b * frames * vocab,
                                 vocab, length, frames, slots, expand, min_active, beam,
                                 active->typed_data() + b * (frames + 1) * slots, &space);
    flagged->typed_data()[b] = ok ? 0 : 1;
  });
  return ffi::Error::Success();
}

template <ffi::DataType D>
auto Binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .template Arg<Ints>()       // out_start [S + 1]
      .template Arg<Ints>()       // dst [A]
      .template Arg<Ints>()       // label [A]
      .template Arg<Floats<D>>()  // weight [A]
      .template Arg<Floats<D>>()  // emissions [B, T, V]
      .template Arg<Ints>()       // lengths [B]
      .template Attr<double>("search_beam")
      .template Attr<int64_t>("slots")
      .template Attr<int64_t>("expand")
      .template Attr<int64_t>("min_active")
      .template Ret<Ints>()   // active [B, T + 1, K]
      .template Ret<Ints>();  // flagged [B]
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SjBeamSearchF32, BeamSearch<ffi::F32>, Binding<ffi::F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SjBeamSearchF64, BeamSearch<ffi::F64>, Binding<ffi::F64>());
