"""Random LF-MMI-denominator-like graphs and their float64 forward, shared
by `bench_ctc.py` and `bench_dense.py`."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class Graph:
    """A graph's arcs [A] (start 0) and its sorted final states [F]."""

    src: np.ndarray  # int64
    dst: np.ndarray
    label: np.ndarray
    weight: np.ndarray  # float64
    final: np.ndarray
    states: int


def random_graph(
    rng: np.random.Generator, states: int, arcs: int, vocab: int, finals: int
) -> Graph:
    """A random cyclic graph: a Hamiltonian cycle 0 -> ... -> S-1 -> 0 (so it
    is strongly connected) plus uniform random arcs, self-loops included;
    labels uniform in [0, V); weights log-normalised over each state's
    out-arcs (transition log-probabilities, as in an LF-MMI denominator
    graph); `finals` random final states other than 0, with weight 0."""
    ring = np.concatenate([[0], 1 + rng.permutation(states - 1)])
    src = np.concatenate([ring, rng.integers(0, states, arcs - states)])
    dst = np.concatenate([np.roll(ring, -1), rng.integers(0, states, arcs - states)])
    label = rng.integers(0, vocab, arcs)
    raw = rng.standard_normal(arcs)
    norm = np.full(states, -np.inf)
    np.logaddexp.at(norm, src, raw)
    final = np.sort(rng.choice(np.arange(1, states), finals, replace=False))
    return Graph(src, dst, label, raw - norm[src], final, states)


def numpy_log_totals(graph: Graph, emissions: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """float64 LOG totals [B] of `emissions` [B, T, V] over `graph`: a
    per-frame forward over the arcs."""
    b, t, _ = emissions.shape
    src, dst, label = graph.src, graph.dst, graph.label
    em = emissions.astype(np.float64)
    alpha = np.full((b, graph.states), -np.inf)
    alpha[:, 0] = 0.0
    for f in range(t):
        scores = alpha[:, src] + graph.weight + em[:, f, label]  # [B, A]
        peak = np.full((b, graph.states), -np.inf)
        np.maximum.at(peak.T, dst, scores.T)
        safe = np.where(np.isfinite(peak), peak, 0.0)
        acc = np.zeros((b, graph.states))
        np.add.at(acc.T, dst, np.exp(scores - safe[:, dst]).T)
        with np.errstate(divide="ignore"):
            new = np.log(acc) + safe
        alpha = np.where((f < lengths)[:, None], new, alpha)
    return np.logaddexp.reduce(alpha[:, graph.final], axis=1)
