// The best-first search of `nbest`: the compiled twin of the search in
// decoding/host/kshortest.py (the same paths in the same order, ties
// included), called from the host through ctypes on the moves that module
// sorts. See that module for the algorithm, its tie rule and its bounds;
// here items live in one array with parent indices, and the heap orders
// their indices.

#include <algorithm>
#include <cstdint>
#include <new>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

constexpr int64_t kEnd = -1;  // the move "stop at this (final) state"

struct Moves {
  const int64_t* offsets;  // [S + 2], S: the super-final state, no moves
  const double* value;     // best score to the end after the move
  const double* weight;    // the arc's weight, or the final weight
  const int64_t* arc;      // the arc index, or kEnd
  const int64_t* target;   // dst, or S
  const int64_t* label;    // olabel, or 0
};

struct Node {
  int64_t parent;  // -1: the root
  int64_t move;    // its position in the sorted moves (-1: the root)
  int64_t arc;
  int64_t state;
  double score;
  int64_t text;  // the output string so far, a trie id (unique only)
  int64_t depth;
};

struct Search {
  const Moves& m;
  int64_t num_states, n;
  bool unique;
  std::vector<Node> nodes;
  std::vector<int64_t> expanded;
  std::unordered_set<uint64_t> seen;              // (state, string) pairs expanded
  std::unordered_map<uint64_t, int64_t> trie;     // (string, label) -> string; 0 is ""

  static uint64_t Key(int64_t a, int64_t b) {
    return (static_cast<uint64_t>(a) << 32) ^ static_cast<uint64_t>(b);
  }

  // The lexicographic order of two items' move sequences, decided where
  // they part (reached only on equal priorities).
  bool Before(int64_t x, int64_t y) const {
    int64_t a = x, b = y;
    while (nodes[a].depth > nodes[b].depth) a = nodes[a].parent;
    while (nodes[b].depth > nodes[a].depth) b = nodes[b].parent;
    if (a == b) return nodes[x].depth < nodes[y].depth;
    while (nodes[a].parent != nodes[b].parent) {
      a = nodes[a].parent;
      b = nodes[b].parent;
    }
    return nodes[a].arc < nodes[b].arc;
  }

  int64_t TextAfter(int64_t text, int64_t move) const {
    if (!unique || m.label[move] == 0) return text;
    const auto found = trie.find(Key(text, m.label[move]));
    return found == trie.end() ? -1 : found->second;
  }

  bool Closed(int64_t state, int64_t text) const {
    return expanded[state] >= n || (unique && text >= 0 && seen.count(Key(state, text)) > 0);
  }

  // parent's first move from `move` on into an open (state, string), as a
  // new item (its index; -1 if none) and its priority.
  int64_t FirstOpen(int64_t parent, int64_t move, double* priority) {
    const int64_t stop = m.offsets[nodes[parent].state + 1];
    while (move < stop && Closed(m.target[move], TextAfter(nodes[parent].text, move))) ++move;
    if (move == stop) return -1;
    int64_t text = nodes[parent].text;
    if (unique && m.label[move] != 0) {
      text = trie.emplace(Key(text, m.label[move]), static_cast<int64_t>(trie.size()) + 1)
                 .first->second;
    }
    const Node& p = nodes[parent];
    const Node child{parent,       move,          m.arc[move], m.target[move],
                     p.score + m.weight[move], text, p.depth + 1};
    *priority = p.score + m.value[move];
    nodes.push_back(child);
    return static_cast<int64_t>(nodes.size()) - 1;
  }
};

struct Item {
  double priority;
  int64_t node;
};

}  // namespace

extern "C" {

// The n best paths (strings) from state 0: writes their end items' chains
// into arcs [n, slots], lengths, final_states, scores [n]; returns how many
// were found, -1 for a path longer than slots, -2 when out of memory, -3
// for inconsistent moves.
int64_t SjKShortest(int64_t num_states, const int64_t* offsets, const double* value,
                    const double* weight, const int64_t* arc, const int64_t* target,
                    const int64_t* label, double best, int64_t n, int64_t unique, int64_t slots,
                    int32_t* arcs, int32_t* lengths, int32_t* final_states, double* scores) {
  // The moves index each other in range (the caller's tables, but a bad
  // one must be an error, never a stray read).
  if (num_states < 1 || n < 1 || slots < 0 || offsets[0] != 0) return -3;
  for (int64_t s = 0; s <= num_states; ++s) {
    if (offsets[s + 1] < offsets[s]) return -3;
  }
  for (int64_t m = 0; m < offsets[num_states + 1]; ++m) {
    if (target[m] < 0 || target[m] > num_states) return -3;
  }
  try {
    const Moves moves{offsets, value, weight, arc, target, label};
    Search s{moves, num_states, n, unique != 0, {}, {}, {}, {}};
    s.expanded.assign(num_states + 1, 0);
    s.nodes.push_back({-1, -1, kEnd, 0, 0.0, 0, 0});
    // A max-heap on priority; on a tie the item that comes first on top.
    const auto later = [&s](const Item& x, const Item& y) {
      if (x.priority != y.priority) return x.priority < y.priority;
      return s.Before(y.node, x.node);
    };
    std::priority_queue<Item, std::vector<Item>, decltype(later)> heap(later);
    heap.push({best, 0});
    const auto push = [&](int64_t parent, int64_t move) {
      double priority;
      const int64_t node = s.FirstOpen(parent, move, &priority);
      if (node >= 0) heap.push({priority, node});
    };
    std::vector<int64_t> ends;
    while (!heap.empty() && static_cast<int64_t>(ends.size()) < n) {
      int64_t node = heap.top().node;
      heap.pop();
      while (true) {
        if (s.nodes[node].parent >= 0) push(s.nodes[node].parent, s.nodes[node].move + 1);
        const int64_t state = s.nodes[node].state, text = s.nodes[node].text;
        if (s.Closed(state, text)) break;
        ++s.expanded[state];
        if (s.unique) s.seen.insert(Search::Key(state, text));
        if (state == num_states) {
          ends.push_back(node);
          break;
        }
        double priority;
        const int64_t child = s.FirstOpen(node, offsets[state], &priority);
        if (child < 0) break;
        // As in kshortest.py: the best move is followed at once unless a
        // heap item is now better.
        if (!heap.empty() && priority < heap.top().priority) {
          heap.push({priority, child});
          break;
        }
        node = child;
      }
    }
    for (size_t j = 0; j < ends.size(); ++j) {
      const Node& end = s.nodes[ends[j]];
      const int64_t length = end.depth - 1;  // the end move is not an arc
      if (length > slots) return -1;
      int64_t at = end.parent;
      for (int64_t k = length - 1; k >= 0; --k, at = s.nodes[at].parent) {
        arcs[j * slots + k] = static_cast<int32_t>(s.nodes[at].arc);
      }
      lengths[j] = static_cast<int32_t>(length);
      final_states[j] = static_cast<int32_t>(s.nodes[end.parent].state);
      scores[j] = end.score;
    }
    return static_cast<int64_t>(ends.size());
  } catch (const std::bad_alloc&) {
    return -2;
  }
}

}  // extern "C"
