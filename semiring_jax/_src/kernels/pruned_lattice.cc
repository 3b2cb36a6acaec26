// The lattice a beam search leaves, pruned to an output beam: the compiled
// twin of decoding/host/pruned_lattice.py (the same lattice, bit for bit),
// called from the host through ctypes (it runs outside any XLA program, on
// numpy arrays). Passes over the arcs between states active at
// consecutive frames, each found again from the graph's arcs grouped by
// source (their destinations looked up in [S] tables of the next frame's
// states, and filtered a chunk at a time by lanes.h): forward for the states reached from the start (skipped for rows
// from a search, where all are), backward (on a path to a final state,
// and Viterbi scores to the end), and forward for the Viterbi scores from
// the start and the arcs within the output beam, skipping the states
// outside it. Memory: O(active states of all frames) for the per-state
// values, O(S) for the tables and O(kept arcs) for the output, never the
// unpruned arcs of every frame.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <vector>

#include "lanes.h"

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Per-state and per-arc flags a byte each (std::vector<bool>'s bit
// arithmetic cost a quarter of the passes' time).
using Flags = std::vector<uint8_t>;

struct Graph {
  int64_t num_states;
  int64_t num_arcs;
  const int32_t* out_start;  // [S + 1], arcs grouped by source
  const int32_t* dst;        // [A], in that order
  const int32_t* label;      // [A]
  const int32_t* position;   // [A], each arc's index in the caller's arcs
  const double* weight;      // [A]
  const double* final_weight;  // [S], -inf where not final
};

struct Lattice {
  int64_t num_states = 1;
  std::vector<int32_t> src, dst, arc, frame, final_state;
};

// Frame t's active states, sorted and unique, as [first[t], first[t + 1]).
struct Frames {
  std::vector<int32_t> state;
  std::vector<int64_t> first;
  int64_t Size(int64_t t) const { return first[t + 1] - first[t]; }
};

// The rows' states sorted and unique per frame, by a bitmap over the graph's
// states (a sort per frame cost a sixth of the lattice's time).
Frames ActiveStates(const int32_t* first, const int32_t* state, int64_t length,
                    int64_t num_states) {
  Frames f;
  f.first.push_back(0);
  std::vector<uint64_t> bits((num_states + 63) / 64, 0);
  for (int64_t t = 0; t <= length; ++t) {
    for (int32_t m = first[t]; m < first[t + 1]; ++m) bits[state[m] >> 6] |= uint64_t{1} << (state[m] & 63);
    for (size_t w = 0; w < bits.size(); ++w) {
      for (uint64_t word = bits[w]; word != 0; word &= word - 1) {
        f.state.push_back(static_cast<int32_t>(w * 64 + __builtin_ctzll(word)));
      }
      bits[w] = 0;
    }
    f.first.push_back(f.state.size());
  }
  return f;
}

// Calls body(i, j, a) for each arc a from frame t's i-th active state to
// frame t + 1's j-th; `where` is an [S] table of -1s, left as it was found.
// Sources for which from[i] is false are skipped.
template <typename Body>
void ForArcs(const Graph& g, const Frames& f, int64_t t, std::vector<int32_t>& where,
             const Flags& from, const Body& body) {
  const int32_t* next = f.state.data() + f.first[t + 1];
  for (int64_t j = 0; j < f.Size(t + 1); ++j) where[next[j]] = static_cast<int32_t>(j);
  const int32_t* here = f.state.data() + f.first[t];
  for (int64_t i = 0; i < f.Size(t); ++i) {
    if (!from[f.first[t] + i]) continue;
    for (int32_t a = g.out_start[here[i]]; a < g.out_start[here[i] + 1]; ++a) {
      const int32_t j = where[g.dst[a]];
      if (j >= 0) body(i, j, a);
    }
  }
  for (int64_t j = 0; j < f.Size(t + 1); ++j) where[next[j]] = -1;
}

// A kept arc: frame t's i-th state to frame t + 1's j-th, by graph arc a.
struct Kept {
  int64_t t;
  int32_t i, j, a;
};

// Which of `arcs` (in frame order) lie on a path from (0, 0) to a final
// state of the last frame (`final` over its states).
Flags Connected(const Frames& f, int64_t length, const std::vector<Kept>& arcs,
                            const Flags& final) {
  Flags reach(f.state.size(), false), alive(f.state.size(), false);
  reach[0] = true;
  for (const Kept& k : arcs) {
    if (reach[f.first[k.t] + k.i]) reach[f.first[k.t + 1] + k.j] = true;
  }
  for (int64_t j = 0; j < f.Size(length); ++j) {
    alive[f.first[length] + j] = reach[f.first[length] + j] && final[j];
  }
  Flags used(arcs.size(), false);
  for (int64_t n = static_cast<int64_t>(arcs.size()) - 1; n >= 0; --n) {
    const Kept& k = arcs[n];
    if (reach[f.first[k.t] + k.i] && alive[f.first[k.t + 1] + k.j]) {
      used[n] = true;
      alive[f.first[k.t] + k.i] = true;
    }
  }
  return used;
}

// *best = max(*best, value) as numpy's maximum: a NaN stays.
inline void Relax(double value, double* best) {
  if (value > *best || value != value) *best = value;
}

double Score(const Graph& g, const double* emissions, int64_t vocab, int64_t t, int32_t a) {
  return g.weight[a] + emissions[t * vocab + g.label[a]];
}

// Arcs per vectorised pass of the backward and forward passes.
constexpr int32_t kChunk = 64;

// Frame t + 1's states by graph state, so that a pass over frame t's arcs
// gathers from [S] tables instead of searching: slot[s] = j + 1 for the
// frame's j-th state when it is alive (on a path to a final state), else
// 0, and beta[s] its best score to the end. Set for one frame and cleared
// after it, so that they stay [S] for any length.
struct NextFrame {
  std::vector<int32_t> slot;
  std::vector<double> beta;

  explicit NextFrame(int64_t num_states) : slot(num_states, 0), beta(num_states, kNegInf) {}

  void Set(const Frames& f, int64_t t, const Flags& alive, const std::vector<double>& scores) {
    for (int64_t j = 0; j < f.Size(t); ++j) {
      const int64_t m = f.first[t] + j;
      slot[f.state[m]] = alive[m] ? static_cast<int32_t>(j + 1) : 0;
      beta[f.state[m]] = scores[m];
    }
  }

  void Clear(const Frames& f, int64_t t) {
    for (int64_t m = f.first[t]; m < f.first[t + 1]; ++m) slot[f.state[m]] = 0;
  }
};

// One source state's best score to the end over its arcs [begin, end) into
// `next`'s alive states (beta, as Relax folds: NaN stays), with whether any
// reaches one (alive) and whether such an arc's score is NaN or +inf.
struct Backward {
  double beta;
  bool alive, nan, posinf;
};

Backward BackwardOf(const Graph& g, const double* frame, const NextFrame& next, int32_t begin,
                    int32_t end) {
  // Two running maxima, so that consecutive arcs' folds do not wait on
  // each other.
  double best[2] = {kNegInf, kNegInf};
  bool alive = false, nan = false, posinf = false;
  for (int32_t a0 = begin; a0 < end; a0 += kChunk) {
    int32_t live[kChunk + 15];
    const int32_t m = ListNonzero(g.dst + a0, next.slot.data(), std::min(kChunk, end - a0), live);
    alive |= m > 0;
    for (int32_t i = 0; i < m; ++i) {
      const int32_t a = a0 + live[i];
      const double score = g.weight[a] + frame[g.label[a]];
      Relax(next.beta[g.dst[a]] + score, &best[i & 1]);
      nan |= score != score;
      posinf |= score == -kNegInf;
    }
  }
  Relax(best[1], &best[0]);
  return {best[0], alive, nan, posinf};
}

Lattice Build(const Graph& g, const double* emissions, int64_t vocab, const int32_t* first,
              const int32_t* state, int64_t length, double output_beam, bool searched) {
  const Frames f = ActiveStates(first, state, length, g.num_states);
  const int64_t n = f.state.size();
  std::vector<int32_t> where(g.num_states, -1);
  // Reached from the start: every active state, for rows from a search
  // (each was reached from a state active the frame before).
  Flags reach(n, searched);
  reach[0] = true;
  for (int64_t t = 0; t < length && !searched; ++t) {
    const int64_t next = f.first[t + 1];
    ForArcs(g, f, t, where, reach, [&](int64_t, int32_t j, int32_t) { reach[next + j] = true; });
  }
  // Backward: on a path to a final state, and the best score to the end.
  std::vector<double> alpha(n, kNegInf), beta(n, kNegInf);
  Flags final(f.Size(length)), alive(n, false);
  bool nan = false, posinf = false;
  for (int64_t j = 0; j < f.Size(length); ++j) {
    const double end = g.final_weight[f.state[f.first[length] + j]];
    final[j] = !(end == kNegInf);  // NaN too: it must reach the lattice's total
    nan |= std::isnan(end);
    beta[f.first[length] + j] = end;
    alive[f.first[length] + j] = reach[f.first[length] + j] && final[j];
  }
  NextFrame table(g.num_states);
  for (int64_t t = length - 1; t >= 0; --t) {
    const int64_t here = f.first[t];
    table.Set(f, t + 1, alive, beta);
    for (int64_t i = 0; i < f.Size(t); ++i) {
      if (!reach[here + i]) continue;
      const int32_t s = f.state[here + i];
      const Backward b =
          BackwardOf(g, emissions + t * vocab, table, g.out_start[s], g.out_start[s + 1]);
      beta[here + i] = b.beta;
      alive[here + i] = b.alive;
      nan |= b.nan;
      posinf |= b.posinf;
    }
    table.Clear(f, t + 1);
  }
  // With a NaN read, no arc is cut by the beam (so that the NaN stays).
  const bool cut = std::isfinite(output_beam) && !nan;
  const double best = beta[0];  // the best path's score (-inf: none)
  // Forward over the connected arcs within the beam, in frame order, with
  // the best scores from the start. A state's arcs score at most alpha +
  // beta (up to rounding, which the margin covers): below the beam by
  // more, none of them is kept, and none gives a kept state its alpha, so
  // such states are skipped (`open` false). So are those no open state
  // reached (alpha -inf) when the best is finite, unless an arc scores
  // +inf (-inf + inf is NaN, which would reach the next alphas): their
  // arcs' scores from the start are all -inf, below any finite beam. (The
  // margin of an infinite alpha is infinite, so the beam alone keeps
  // them; on bench_decoding --peak 8 they held 97 % of the arcs that this
  // pass read.)
  Flags open(n, false);
  const bool skip_unreached = cut && !posinf && best > kNegInf;
  const auto opened = [&](int64_t m) {
    if (skip_unreached && !(alpha[m] > kNegInf)) return false;
    const double margin = 1e-9 * (std::fabs(alpha[m]) + std::fabs(beta[m]) + std::fabs(best));
    return alive[m] && !(cut && alpha[m] + beta[m] < best - output_beam - margin);
  };
  alpha[0] = 0.0;
  open[0] = opened(0);
  std::vector<Kept> kept;
  for (int64_t t = 0; t < length; ++t) {
    const int64_t here = f.first[t], next = f.first[t + 1];
    table.Set(f, t + 1, alive, beta);
    for (int64_t i = 0; i < f.Size(t); ++i) {
      if (!open[here + i]) continue;
      const int32_t s = f.state[here + i];
      for (int32_t a0 = g.out_start[s]; a0 < g.out_start[s + 1]; a0 += kChunk) {
        int32_t live[kChunk + 15];
        const int32_t m = ListNonzero(g.dst + a0, table.slot.data(),
                                      std::min(kChunk, g.out_start[s + 1] - a0), live);
        for (int32_t k = 0; k < m; ++k) {
          const int32_t a = a0 + live[k];
          const int32_t j = table.slot[g.dst[a]] - 1;
          if (cut) {
            const double through = alpha[here + i] + Score(g, emissions, vocab, t, a);
            Relax(through, &alpha[next + j]);
            if (!(through + beta[next + j] >= best - output_beam)) continue;
          }
          kept.push_back({t, static_cast<int32_t>(i), j, a});
        }
      }
    }
    table.Clear(f, t + 1);
    for (int64_t j = 0; j < f.Size(t + 1); ++j) open[next + j] = opened(next + j);
  }
  if (cut) {
    // Arcs within the beam of a finite best lie on such paths; with
    // infinities about, cut to the connected ones once more.
    const Flags used = Connected(f, length, kept, final);
    size_t n_used = 0;
    for (size_t m = 0; m < kept.size(); ++m) {
      if (used[m]) kept[n_used++] = kept[m];
    }
    kept.resize(n_used);
  }
  // Number the states the kept arcs touch in frame order, (0, 0) first.
  std::vector<int64_t> id(n, -1);
  Flags touched(n, false);
  touched[0] = true;
  for (const Kept& k : kept) {
    touched[f.first[k.t] + k.i] = touched[f.first[k.t + 1] + k.j] = true;
  }
  Lattice out;
  int64_t count = 0;
  for (int64_t m = 0; m < n; ++m) {
    if (touched[m]) id[m] = count++;
  }
  out.num_states = std::max<int64_t>(count, 1);
  out.final_state.assign(out.num_states, -1);
  if (length == 0 || !kept.empty()) {
    for (int64_t j = 0; j < f.Size(length); ++j) {
      const int64_t m = f.first[length] + j;
      if (touched[m] && final[j]) out.final_state[id[m]] = f.state[m];
    }
  }
  std::vector<int64_t> order(kept.size());
  for (size_t m = 0; m < kept.size(); ++m) order[m] = m;
  const auto src_of = [&](const Kept& k) { return id[f.first[k.t] + k.i]; };
  std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
    const int64_t sx = src_of(kept[x]), sy = src_of(kept[y]);
    return sx < sy || (sx == sy && g.position[kept[x].a] < g.position[kept[y].a]);
  });
  for (int64_t m : order) {
    const Kept& k = kept[m];
    out.src.push_back(static_cast<int32_t>(src_of(k)));
    out.dst.push_back(static_cast<int32_t>(id[f.first[k.t + 1] + k.j]));
    out.arc.push_back(g.position[k.a]);
    out.frame.push_back(static_cast<int32_t>(k.t));
  }
  return out;
}

// The inputs' tables index each other in range (the caller's, but a bad
// one must be an error, never a stray read).
bool Valid(const Graph& g, int64_t vocab, const int32_t* first, const int32_t* state,
           int64_t length) {
  if (g.num_states < 1 || g.out_start[0] != 0 || g.out_start[g.num_states] > g.num_arcs ||
      length < 0 || first[0] != 0 || first[1] < 1 || state[0] != 0) {
    return false;
  }
  // Each check folded over its table without an early exit, so that the
  // compiler vectorises it (it runs once per utterance over every arc).
  int bad = 0;
  for (int64_t s = 0; s < g.num_states; ++s) bad |= g.out_start[s + 1] < g.out_start[s];
  for (int64_t a = 0; a < g.num_arcs; ++a) {
    bad |= (g.dst[a] < 0) | (g.dst[a] >= g.num_states) | (g.label[a] < 0) | (g.label[a] >= vocab);
  }
  for (int64_t t = 0; t <= length; ++t) bad |= first[t + 1] < first[t];
  if (bad) return false;
  for (int64_t m = 0; m < first[length + 1]; ++m) {
    bad |= (state[m] < 0) | (state[m] >= g.num_states);
  }
  return bad == 0;
}

}  // namespace

extern "C" {

// Builds the lattice of one utterance from its rows (row t, the states
// active after t frames, is state[first[t] .. first[t + 1]), t = 0 ..
// length; `searched`: they come from a beam search, so every active state
// is reachable). Returns 0 and a handle (sizes[0]: states, sizes[1]: arcs)
// for SjPrunedLatticeTake, 1 for inconsistent tables, 2 when out of memory.
int SjPrunedLattice(int64_t num_states, int64_t num_arcs, const int32_t* out_start,
                    const int32_t* dst, const int32_t* label, const int32_t* position,
                    const double* weight, const double* final_weight, const double* emissions,
                    int64_t vocab, const int32_t* first, const int32_t* state, int64_t length,
                    double output_beam, int64_t searched, void** handle, int64_t* sizes) {
  const Graph g{num_states, num_arcs, out_start, dst, label, position, weight, final_weight};
  if (!Valid(g, vocab, first, state, length)) return 1;
  try {
    Lattice* lattice =
        new Lattice(Build(g, emissions, vocab, first, state, length, output_beam, searched != 0));
    sizes[0] = lattice->num_states;
    sizes[1] = static_cast<int64_t>(lattice->src.size());
    *handle = lattice;
  } catch (const std::bad_alloc&) {
    return 2;
  }
  return 0;
}

// Copies the lattice out (arrays of sizes[1], and of sizes[0] for
// final_state) and frees it.
void SjPrunedLatticeTake(void* handle, int32_t* src, int32_t* dst, int32_t* arc, int32_t* frame,
                         int32_t* final_state) {
  Lattice* lattice = static_cast<Lattice*>(handle);
  std::copy(lattice->src.begin(), lattice->src.end(), src);
  std::copy(lattice->dst.begin(), lattice->dst.end(), dst);
  std::copy(lattice->arc.begin(), lattice->arc.end(), arc);
  std::copy(lattice->frame.begin(), lattice->frame.end(), frame);
  std::copy(lattice->final_state.begin(), lattice->final_state.end(), final_state);
  delete lattice;
}

}  // extern "C"
