"""Back-off n-gram models on the host: estimation from counts, and the arcs
of their acceptors (expanded, or with epsilon back-off arcs).

A model is a table of explicit conditional log-probabilities ln P(w | h)
for some histories h (tuples of labels; `BOS` first at a sentence start,
`EOS` the end-of-sentence prediction), back-off weights ln α(h), and a
floor, ln P of a word no unigram lists. Everything else is the ARPA
back-off definition:

    ln P(w | h) = explicit(h, w)                     if listed,
                  ln α(h) + ln P(w | h[1:])          otherwise,
    ln P(w | ()) = explicit((), w), or ln α(()) + floor.

A history without explicit entries and without a back-off weight scores
every word as its suffix does, so the acceptors' states are only the
histories with entries or a weight (and the empty one); the next state
after reading w in h is the longest suffix of h + (w,) that is one.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, deque
from collections.abc import Sequence

import numpy as np

__all__ = [
    "BOS",
    "EOS",
    "Arcs",
    "BackoffModel",
    "backoff_arcs",
    "estimate",
    "expanded_arcs",
]

# Sentence start and end: never labels (labels are >= 0, 0 being epsilon).
BOS = -1
EOS = -2

History = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class BackoffModel:
    """A back-off n-gram model (see the module docstring).

    Attributes:
      order: N, the longest n-gram; histories hold at most N - 1 labels.
      vocabulary: the word labels (>= 1), increasing.
      probs: history -> {word or EOS: ln P}, the explicit entries.
      backoff: history -> ln α; an absent history has α = 1 (0.0).
      floor: ln P(w | below the unigrams); -inf for none (ARPA).
    """

    order: int
    vocabulary: tuple[int, ...]
    probs: dict[History, dict[int, float]]
    backoff: dict[History, float]
    floor: float = -math.inf

    def states(self) -> set[History]:
        """The histories that are acceptor states."""
        return {(), *self.probs, *self.backoff}

    def start(self, states: set[History]) -> History:
        """The state of a sentence's start: (BOS,) backed off."""
        return _longest_state(self._truncate((BOS,)), states)

    def _truncate(self, history: History) -> History:
        keep = self.order - 1
        return history[len(history) - keep :] if keep > 0 else ()

    def next_state(self, history: History, word: int, states: set[History]) -> History:
        """The state after reading `word` in state `history`."""
        return _longest_state(self._truncate((*history, word)), states)


def _longest_state(history: History, states: set[History]) -> History:
    while history not in states:
        history = history[1:]
    return history


@dataclasses.dataclass(frozen=True)
class Arcs:
    """An acceptor's arcs, start state 0, states in breadth-first order.

    Attributes:
      num_states: S.
      src, dst, label: int64 [A].
      weight: float64 [A], ln P.
      final: float64 [S], ln P(EOS | state); -inf where not final.
    """

    num_states: int
    src: np.ndarray
    dst: np.ndarray
    label: np.ndarray
    weight: np.ndarray
    final: np.ndarray


def _rows(model: BackoffModel, states: set[History]) -> dict[History, np.ndarray]:
    """ln P(column | h) for every state h, columns = vocabulary then EOS."""
    column = {word: i for i, word in enumerate(model.vocabulary)}
    column[EOS] = len(model.vocabulary)
    rows: dict[History, np.ndarray] = {}
    below = np.full(len(column), model.floor)
    # Shorter histories first, so that a state's back-off row is ready.
    for history in sorted(states, key=len):
        parent = below if not history else rows[_longest_state(history[1:], states)]
        row = parent + model.backoff.get(history, 0.0)
        for word, logprob in model.probs.get(history, {}).items():
            row[column[word]] = logprob
        rows[history] = row
    return rows


def _breadth_first(start: History, successors: dict[History, list[History]]) -> dict[History, int]:
    number = {start: 0}
    queue = deque([start])
    while queue:
        for nxt in successors[queue.popleft()]:
            if nxt not in number:
                number[nxt] = len(number)
                queue.append(nxt)
    return number


def _arcs(
    start: History,
    out: dict[History, list[tuple[History, int, float]]],
    final: dict[History, float],
) -> Arcs:
    """Numbers the states reachable from `start` and lays out their arcs."""
    number = _breadth_first(start, {h: [dst for dst, _, _ in arcs] for h, arcs in out.items()})
    rows = [
        (number[history], number[dst], label, weight)
        for history in number
        for dst, label, weight in out[history]
    ]
    table = np.array(rows, dtype=np.float64).reshape(-1, 4)
    finals = np.full(len(number), -math.inf)
    for history, state in number.items():
        finals[state] = final.get(history, -math.inf)
    return Arcs(
        len(number),
        table[:, 0].astype(np.int64),
        table[:, 1].astype(np.int64),
        table[:, 2].astype(np.int64),
        table[:, 3],
        finals,
    )


def expanded_arcs(model: BackoffModel) -> Arcs:
    """Every state has an arc for every word of non-zero probability, with
    the backed-off ln P(w | h): deterministic, epsilon-free, and exact in
    any semiring (one path per sentence)."""
    states = model.states()
    rows = _rows(model, states)
    out: dict[History, list[tuple[History, int, float]]] = {}
    final: dict[History, float] = {}
    for history, row in rows.items():
        out[history] = [
            (model.next_state(history, word, states), word, float(row[i]))
            for i, word in enumerate(model.vocabulary)
            if row[i] > -math.inf
        ]
        if row[-1] > -math.inf:
            final[history] = float(row[-1])
    return _arcs(model.start(states), out, final)


def backoff_arcs(model: BackoffModel) -> Arcs:
    """The standard back-off construction (as Kaldi's arpa2fst): an arc per
    explicit entry, an epsilon arc (label 0) of weight ln α(h) from each
    non-empty history to its back-off state, final weights where EOS is
    explicit. A sentence has a path per back-off route; see `read_arpa`."""
    states = model.states()
    out: dict[History, list[tuple[History, int, float]]] = {}
    final: dict[History, float] = {}
    for history in states:
        entries = model.probs.get(history, {})
        arcs = [
            (model.next_state(history, word, states), word, logprob)
            for word, logprob in sorted(entries.items())
            if word != EOS and logprob > -math.inf
        ]
        if not history and model.floor > -math.inf:
            arcs += [
                ((), word, model.backoff.get((), 0.0) + model.floor)
                for word in model.vocabulary
                if word not in entries
            ]
        if history:
            back = _longest_state(history[1:], states)
            arcs.append((back, 0, model.backoff.get(history, 0.0)))
        out[history] = arcs
        if entries.get(EOS, -math.inf) > -math.inf:
            final[history] = entries[EOS]
    return _arcs(model.start(states), out, final)


def estimate(
    sequences: Sequence[Sequence[int]], num_symbols: int, order: int, discount: float
) -> BackoffModel:
    """Interpolated absolute discounting from counts.

    For a history h seen c(h) times, followed by N1(h) distinct tokens:

        P(w | h) = (max(c(h, w) - D, 0) + D N1(h) P(w | h[1:])) / c(h),

    below the unigrams P = 1 / (V + 1) (V phones and EOS). As a back-off
    model: the seen entries explicitly, α(h) = D N1(h) / c(h).

    Args:
      sequences: label sequences, labels in [1, V].
      num_symbols: V.
      order: N >= 1.
      discount: D in [0, 1]; 0 is the maximum-likelihood estimate.
    Returns:
      The model; its histories are those seen (c(h) > 0).
    """
    counts: dict[History, Counter[int]] = {}
    for sequence in sequences:
        tokens = [BOS, *sequence, EOS]
        for i in range(1, len(tokens)):
            full = tuple(tokens[max(0, i - order + 1) : i])
            for k in range(len(full) + 1):
                counts.setdefault(full[len(full) - k :], Counter())[tokens[i]] += 1
    vocabulary = tuple(range(1, num_symbols + 1))
    floor = -math.log(num_symbols + 1)
    states = set(counts)
    column = {word: i for i, word in enumerate(vocabulary)}
    column[EOS] = num_symbols
    rows: dict[History, np.ndarray] = {}
    probs: dict[History, dict[int, float]] = {}
    backoff: dict[History, float] = {}
    below = np.full(num_symbols + 1, floor)
    for history in sorted(states, key=len):
        seen = counts[history]
        total = sum(seen.values())
        lower = below if not history else rows[_longest_state(history[1:], states)]
        share = discount * len(seen) / total
        backoff[history] = math.log(share) if share > 0 else -math.inf
        row = lower + backoff[history]
        entries = {}
        for word, count in seen.items():
            # Positive: D < count, or D = count = 1 and share > 0 with the floor > 0.
            entries[word] = math.log(
                (count - discount) / total + share * math.exp(lower[column[word]])
            )
        for word, logprob in entries.items():
            row[column[word]] = logprob
        probs[history] = entries
        rows[history] = row
    return BackoffModel(order, vocabulary, probs, backoff, floor)
