// The frame-synchronous beam search of `intersect_dense_pruned`
// (decoding/beam_search.py's traced search, the same choices), plain C
// called through ctypes, one utterance a call, returning the states kept
// after each frame packed row after row (not K padded slots). Token
// passing: per frame, only the active states' arcs are read, each
// destination's best candidate is kept in an [S] table whose touched entries
// are listed (and reset after the frame), and the K best of them are chosen
// by a partial sort. Arcs below the best candidate so far less the beam are
// dropped by a vectorised pass before they touch the table (at beam 20 on a
// lexicon-times-bigram graph, about four in five). Work per frame is
// O(active arcs + n log K), n the destinations reached; the traced search
// pays for segment reductions over [S] buffers and a top-K over all E edge
// slots at every frame.
//
// The choices are the traced search's, bit for bit: scores in the inputs'
// type, added in its order ((score + weight) + emission); edges numbered in
// slot order and cut at `expand`; a destination's best is its first edge
// among ties; the K best in (score descending, edge ascending) order, as
// `jax.lax.top_k` ranks them; kept when within `search_beam` of the frame's
// best or among the `min_active` best. The traced search keeps NaN
// candidates each apart: an utterance whose candidates hold a NaN or +inf is
// flagged instead, and the caller runs the traced search for it.

#include <memory>
#include <vector>

#include "common.h"
#include "lanes.h"

namespace {

// Arcs per vectorised pass of the search's inner loop.
constexpr int32_t kChunk = 64;

// candidate[i] = (from + weight[i]) + frame[label[i]] for i < n, in a loop
// the compiler vectorises (a gather); true when one is NaN or +inf.
template <typename T, typename L>
bool Candidates(T from, const T* __restrict weight, const L* __restrict label,
                const T* __restrict frame, int32_t n, T* __restrict candidate) {
  int bad = 0;
  for (int32_t i = 0; i < n; ++i) {
    const T c = from + weight[i] + frame[label[i]];
    candidate[i] = c;
    bad |= !(c <= std::numeric_limits<T>::max());
  }
  return bad != 0;
}

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

// Puts the n = middle - begin best of [begin, last) first, sorted in
// (score descending, edge ascending) order, as `jax.lax.top_k` ranks them.
template <typename T>
void OrderByFields(Candidate<T>* begin, Candidate<T>* middle, Candidate<T>* last) {
  const auto before = [](const Candidate<T>& x, const Candidate<T>& y) {
    return x.score > y.score || (x.score == y.score && x.edge < y.edge);
  };
  if (middle < last) std::nth_element(begin, middle, last, before);
  std::sort(begin, middle, before);
}

template <typename T>
void OrderBest(Candidate<T>* begin, Candidate<T>* middle, Candidate<T>* last) {
  OrderByFields(begin, middle, last);
}

inline uint64_t DescendingKey(float score, int64_t edge) {
  if (score == 0.0f) score = 0.0f;  // -0 and +0 tie, as compared
  uint32_t bits;
  std::memcpy(&bits, &score, sizeof(bits));
  // Ascending as unsigned in the float's order, then reversed.
  const uint32_t ascending = (bits >> 31) ? ~bits : bits | 0x80000000u;
  return (uint64_t{~ascending} << 32) | static_cast<uint32_t>(edge);
}

// For float scores and edges below 2^32 the two fields are one 64-bit key
// (the score's bits made to order as unsigned, then the edge), which sorts
// a third faster than comparing them in turn. The key stands in `edge`'s
// slot during the sort; its low half is the edge.
template <>
void OrderBest(Candidate<float>* begin, Candidate<float>* middle, Candidate<float>* last) {
  bool small = true;
  for (Candidate<float>* c = begin; c < last; ++c) {
    small &= static_cast<uint64_t>(c->edge) < (uint64_t{1} << 32);
  }
  if (!small) {
    OrderByFields(begin, middle, last);
    return;
  }
  for (Candidate<float>* c = begin; c < last; ++c) {
    c->edge = static_cast<int64_t>(DescendingKey(c->score, c->edge));
  }
  const auto by_key = [](const Candidate<float>& x, const Candidate<float>& y) {
    return static_cast<uint64_t>(x.edge) < static_cast<uint64_t>(y.edge);
  };
  if (middle < last) std::nth_element(begin, middle, last, by_key);
  std::sort(begin, middle, by_key);
  for (Candidate<float>* c = begin; c < last; ++c) c->edge = static_cast<uint32_t>(c->edge);
}

// One utterance's search over `length` frames of emissions [length, V];
// false when a candidate was NaN or +inf (flagged). Each row, the states
// kept after t = 0 .. length frames in slot order, goes to emit(states, n).
// `label` is g.label, or a narrower copy of it.
template <typename T, typename L, typename Emit>
bool SearchOne(const Graph& g, const T* weight, const L* label, const T* rows, int64_t vocab,
               int64_t length, int64_t slots, int64_t expand, int64_t min_active, T beam,
               const Emit& emit, Workspace* space) {
  T* best = space->Take<T>(g.num_states);
  int64_t* first = space->Take<int64_t>(g.num_states);
  // One spare: the update writes touched[count] before it knows whether the
  // destination is new.
  int32_t* touched = space->Take<int32_t>(std::min(expand, g.num_states) + 1);
  Candidate<T>* reached = space->Take<Candidate<T>>(std::min(expand, g.num_states));
  int32_t* states = space->Take<int32_t>(slots);
  T* scores = space->Take<T>(slots);
  std::fill(best, best + g.num_states, kNegInf<T>);
  std::fill(states, states + slots, -1);
  std::fill(scores, scores + slots, kNegInf<T>);
  states[0] = 0;
  scores[0] = T(0);
  emit(states, int64_t{1});
  const int64_t kept_max = std::min(slots, expand);
  for (int64_t t = 0; t < length; ++t) {
    const T* frame = rows + t * vocab;
    // A candidate below `cutoff` (the best so far less the beam, so never
    // above the frame's final threshold) is not within the beam: it is
    // neither kept nor any kept state's best, and is skipped. That is exact
    // unless fewer than min_active states end within the beam; then the
    // frame is searched again with nothing skipped.
    int64_t count = 0;
    T top = kNegInf<T>;
    for (bool prune : {true, false}) {
      bool skipped = false;
      T cutoff = kNegInf<T>;
      int64_t edge = 0;
      count = 0;
      for (int64_t k = 0; k < slots && edge < expand; ++k) {
        const int32_t s = states[k];
        if (s < 0) continue;
        const T from = scores[k];
        const int32_t begin = g.out_start[s];
        const int32_t end =
            static_cast<int32_t>(std::min<int64_t>(g.out_start[s + 1], begin + (expand - edge)));
        for (int32_t a0 = begin; a0 < end; a0 += kChunk) {
          // The chunk's candidates in a pass the compiler vectorizes (a
          // gather of the emissions), then the few above the cutoff.
          const int32_t n = std::min<int32_t>(kChunk, end - a0);
          T candidate[kChunk];
          if (Candidates(from, weight + a0, label + a0, frame, n, candidate)) {
            for (int32_t i = 0; i < n; ++i) {
              if (candidate[i] != candidate[i] || candidate[i] == kPosInf<T>) return false;
            }
          }
          // The chunk's arcs at or above the cutoff, listed without a
          // branch (most are below it), then each relaxed.
          int32_t above[kChunk + 15];
          const int32_t m = ListAtLeast(candidate, n, cutoff, above);
          skipped |= m < n;
          const int64_t edge0 = edge + (a0 - begin);
          for (int32_t j = 0; j < m; ++j) {
            const int32_t i = above[j];
            const T c = candidate[i];
            if (!(c > kNegInf<T>)) continue;
            if (c < cutoff) {  // the cutoff has risen since
              skipped = true;
              continue;
            }
            const int32_t d = g.dst[a0 + i];
            const T old = best[d];
            touched[count] = d;
            count += old == kNegInf<T>;
            if (c > old) {
              best[d] = c;
              first[d] = edge0 + i;
              if (c > top) {
                top = c;
                if (prune) cutoff = top - beam;
              }
            }
          }
        }
        edge += end - begin;
      }
      int64_t within = 0;
      const T threshold = top - beam;
      for (int64_t i = 0; i < count && within < min_active; ++i) {
        within += best[touched[i]] >= threshold;
      }
      if (!skipped || within >= min_active) break;
      for (int64_t i = 0; i < count; ++i) best[touched[i]] = kNegInf<T>;
      top = kNegInf<T>;
    }
    for (int64_t i = 0; i < count; ++i) {
      const int32_t d = touched[i];
      reached[i] = {best[d], first[d], d};
      best[d] = kNegInf<T>;
    }
    // Kept: a prefix of the reached in (score descending, edge ascending)
    // order, at most K long: those within the beam of the best, but at
    // least the min_active first. So only the within-beam ones are sorted,
    // or, when fewer than min_active are, the min_active best of all.
    const T threshold = top - beam;
    Candidate<T>* within = std::partition(
        reached, reached + count, [threshold](const Candidate<T>& c) { return c.score >= threshold; });
    const int64_t w = within - reached;
    const int64_t n = std::min({kept_max, count, std::max(w, min_active)});
    Candidate<T>* last = reached + (n <= w ? w : count);
    OrderBest(reached, reached + n, last);
    for (int64_t k = 0; k < n; ++k) {
      states[k] = reached[k].state;
      scores[k] = reached[k].score;
    }
    std::fill(states + n, states + slots, -1);
    std::fill(scores + n, scores + slots, kNegInf<T>);
    emit(states, n);
  }
  return true;
}

// The rows of one utterance's search, frame after frame: row t is
// state[first[t] .. first[t + 1]).
struct Rows {
  std::vector<int32_t> first{0}, state;
};

// The tables are the caller's: checked, so that another graph's is an error
// and never a stray read. Folded without an early exit, so that the arcs'
// checks vectorise (they run once per utterance).
bool Valid(const Graph& g, int64_t vocab, int64_t slots, int64_t expand, int64_t min_active) {
  if (g.num_states < 1 || g.out_start[0] != 0 || slots < 1 || expand < 1 || min_active < 0) {
    return false;
  }
  int bad = 0;
  for (int64_t s = 0; s < g.num_states; ++s) {
    bad |= (g.out_start[s + 1] < g.out_start[s]) | (g.out_start[s + 1] > g.num_arcs);
  }
  for (int64_t a = 0; a < g.num_arcs; ++a) {
    bad |= (g.dst[a] < 0) | (g.dst[a] >= g.num_states) | (g.label[a] < 0) | (g.label[a] >= vocab);
  }
  return bad == 0;
}

template <typename T>
int Search(const Graph& g, const void* weight, const void* emissions, int64_t vocab,
           int64_t length, int64_t slots, int64_t expand, int64_t min_active, double search_beam,
           Rows* rows) {
  const int64_t reach = std::min(expand, g.num_states);
  const bool narrow = vocab <= 65536;
  Workspace space(Workspace::Bytes<T>(g.num_states) + Workspace::Bytes<int64_t>(g.num_states) +
                  Workspace::Bytes<int32_t>(reach + 1) + Workspace::Bytes<Candidate<T>>(reach) +
                  Workspace::Bytes<int32_t>(slots) + Workspace::Bytes<T>(slots) +
                  (narrow ? Workspace::Bytes<uint16_t>(g.num_arcs) : 0));
  const auto emit = [rows](const int32_t* states, int64_t n) {
    rows->state.insert(rows->state.end(), states, states + n);
    rows->first.push_back(static_cast<int32_t>(rows->state.size()));
  };
  const auto run = [&](const auto* label) {
    return SearchOne(g, static_cast<const T*>(weight), label, static_cast<const T*>(emissions),
                     vocab, length, slots, expand, min_active, static_cast<T>(search_beam), emit,
                     &space)
               ? 0
               : 3;
  };
  if (!narrow) return run(g.label);
  // The candidates' pass streams every active arc's weight and label, and
  // little else: 16-bit labels (a copy per utterance, about 1 % of its
  // search, in the kept scratch space) make it about 7 % faster on
  // bench_decoding --peak 8.
  uint16_t* label = space.Take<uint16_t>(g.num_arcs);
  std::copy(g.label, g.label + g.num_arcs, label);
  return run(label);
}

}  // namespace

extern "C" {

// Searches one utterance: emissions [length, V] and weight [A] of float32
// (`bytes` 4) or float64 (8). Returns 0 and a handle (*size: the states of
// all rows) for SjBeamSearchTake, 1 for inconsistent tables, 2 when out of
// memory, 3 when a candidate was NaN or +inf (the caller searches again).
int SjBeamSearch(int64_t num_states, int64_t num_arcs, const int32_t* out_start,
                 const int32_t* dst, const int32_t* label, const void* weight,
                 const void* emissions, int64_t bytes, int64_t vocab, int64_t length,
                 int64_t slots, int64_t expand, int64_t min_active, double search_beam,
                 void** handle, int64_t* size) {
  const Graph g{num_states, num_arcs, out_start, dst, label};
  if (length < 0 || (bytes != 4 && bytes != 8) || !Valid(g, vocab, slots, expand, min_active)) {
    return 1;
  }
  try {
    auto rows = std::make_unique<Rows>();
    rows->first.reserve(length + 2);
    const int code =
        bytes == 4 ? Search<float>(g, weight, emissions, vocab, length, slots, expand, min_active,
                                   search_beam, rows.get())
                   : Search<double>(g, weight, emissions, vocab, length, slots, expand,
                                    min_active, search_beam, rows.get());
    if (code != 0) return code;
    *size = static_cast<int64_t>(rows->state.size());
    *handle = rows.release();
  } catch (const std::bad_alloc&) {
    return 2;
  }
  return 0;
}

// Copies the rows out (first: length + 2 entries, state: *size) and frees
// them.
void SjBeamSearchTake(void* handle, int32_t* first, int32_t* state) {
  Rows* rows = static_cast<Rows*>(handle);
  std::copy(rows->first.begin(), rows->first.end(), first);
  std::copy(rows->state.begin(), rows->state.end(), state);
  delete rows;
}

}  // extern "C"
