"""Benchmark: total score and its gradient (arc posteriors) against peers.

Measures `sj.tot_score` value + gradient with respect to all arc weights
(float32, jitted, LOG and TROPICAL) on four seeded workloads, and in the same
process, on the same FSAs, two peers:

  * OpenFst `ShortestDistance(reverse=True)` through pynini (value only);
  * a plain numpy per-state loop (value and posteriors / best-path indicator).

Timings on a shared 2-core machine drift, so every row interleaves the
contestants round by round and the headline numbers are ratios of medians
taken in the same rounds.

Run:
    .venv/bin/python benchmarks/bench_scores.py           # full run, a few minutes
    .venv/bin/python benchmarks/bench_scores.py --quick   # smoke run: fewer repetitions

Workloads (numpy default_rng(SEED); N(0, 1) arc and final weights; every
state reachable from the start 0 and co-reachable to a final state; state
numbers randomly permuted, except that 0 stays the start, so numbering is
not topological):

  1. random DAG, 1,000 states / 5,000 arcs;
  2. random DAG, 10,000 states / 50,000 arcs;
  3. layered lattice: 1,000 layers, arcs only between consecutive layers,
     50,000 arcs, depth 999 (layer 0 is the start state alone, 998 layers of
     10 states, the last layer is 4 final states: 9,985 states);
  4. a batch of 32 random DAGs of 200 states / 1,000 arcs, via `sj.stack`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from timing import Reps, first_call_seconds, interleaved_medians

import semiring_jax as sj

try:
    import pynini
except ImportError:  # the OpenFst peer is skipped
    pynini = None

SEED = 20240611
OPENFST_DELTA = 1e-6  # pynini's default, stated explicitly
VALUE_RTOL = 1e-3  # agreement check: |a - b| <= VALUE_RTOL * max(1, |b|)
SEMIRINGS = {"LOG": sj.LOG, "TROPICAL": sj.TROPICAL}
OPENFST_ARC_TYPES = {"LOG": "log", "TROPICAL": "standard"}  # tropical is "standard"


# -- workloads -------------------------------------------------------------------------


@dataclasses.dataclass
class Graph:
    """One acyclic acceptor as host arrays; start state 0.

    Attributes:
      num_states: S.
      src, dst, label: int64 [A].
      weight: float32 [A], scores (higher is better).
      final: {state: score}.
      topo: int64 [S], the states in a topological order (topo[0] == 0).
    """

    num_states: int
    src: np.ndarray
    dst: np.ndarray
    label: np.ndarray
    weight: np.ndarray
    final: dict[int, float]
    topo: np.ndarray

    @property
    def num_arcs(self) -> int:
        return int(self.src.shape[0])


@dataclasses.dataclass
class Workload:
    """A named list of graphs; `batched` ones are scored as one `sj.stack`."""

    name: str
    graphs: list[Graph]
    batched: bool = False

    @property
    def num_states(self) -> int:
        return sum(g.num_states for g in self.graphs)

    @property
    def num_arcs(self) -> int:
        return sum(g.num_arcs for g in self.graphs)


def _finish_graph(
    rng: np.random.Generator, num_states: int, src: np.ndarray, dst: np.ndarray, finals: np.ndarray
) -> Graph:
    """Shuffles arc order, draws labels and N(0, 1) weights, and renumbers
    the states by a random permutation that keeps 0 (the start) in place.

    `src`, `dst` and `finals` are in a topological numbering on entry.
    """
    order = rng.permutation(src.shape[0])
    src, dst = src[order], dst[order]
    relabel = np.concatenate([[0], 1 + rng.permutation(num_states - 1)]).astype(np.int64)
    label = rng.integers(1, 21, size=src.shape[0])
    weight = rng.standard_normal(src.shape[0]).astype(np.float32)
    final_weight = rng.standard_normal(finals.shape[0]).astype(np.float32)
    final = {int(relabel[s]): float(w) for s, w in zip(finals, final_weight)}
    # Old numbering 0..S-1 was topological, so relabel lists states in topo order.
    return Graph(num_states, relabel[src], relabel[dst], label, weight, final, relabel)


def random_dag(
    rng: np.random.Generator, num_states: int, num_arcs: int, num_final: int = 4
) -> Graph:
    """A random trim DAG with exactly `num_arcs` arcs.

    In a topological numbering: the last state is final with `num_final - 1`
    other random states; every state j > 0 gets an arc from a random i < j,
    every non-final state i an arc to a random j > i, and the remaining arcs
    are uniform random pairs i < j. The numbering is then permuted.
    """
    n = num_states
    others = rng.choice(np.arange(1, n - 1), size=num_final - 1, replace=False)
    finals = np.union1d(others, [n - 1])
    into = np.arange(1, n)
    from_before = (rng.random(n - 1) * into).astype(np.int64)
    nonfinal = np.setdiff1d(np.arange(n - 1), finals)
    to_after = nonfinal + 1 + (rng.random(nonfinal.size) * (n - 1 - nonfinal)).astype(np.int64)
    src, dst = [from_before, nonfinal], [into, to_after]
    need = num_arcs - (n - 1) - nonfinal.size
    if need < 0:
        raise ValueError(f"random_dag: {num_arcs} arcs cannot connect {n} states")
    while need > 0:
        a, b = rng.integers(0, n, 2 * need), rng.integers(0, n, 2 * need)
        keep = a != b
        a, b = a[keep][:need], b[keep][:need]
        src.append(np.minimum(a, b))
        dst.append(np.maximum(a, b))
        need -= a.size
    return _finish_graph(rng, n, np.concatenate(src), np.concatenate(dst), finals)


def layered_lattice(
    rng: np.random.Generator,
    num_layers: int = 1000,
    width: int = 10,
    num_arcs: int = 50_000,
    num_final: int = 4,
) -> Graph:
    """A lattice whose arcs only join consecutive layers (depth num_layers - 1).

    Layer 0 is the start state alone (so every state is reachable), the
    middle layers have `width` states, and the last layer is `num_final`
    final states. Every state gets one arc from a random state of the layer
    before and one arc to a random state of the layer after; the remaining
    arcs join random states of consecutive layers k, k + 1, with k drawn in
    proportion to the number of state pairs (so the start state, alone in
    layer 0, gets no more arcs than any other state).
    Parallel arcs may occur (as in real lattices). Numbering is permuted.
    """
    sizes = np.array([1] + [width] * (num_layers - 2) + [num_final], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    n = int(offsets[-1])
    layer = np.repeat(np.arange(num_layers), sizes)
    state = np.arange(n)

    def pick(layers: np.ndarray) -> np.ndarray:
        """A uniformly random state of each given layer."""
        return offsets[layers] + (rng.random(layers.size) * sizes[layers]).astype(np.int64)

    has_prev, has_next = state[layer > 0], state[layer < num_layers - 1]
    src = [pick(layer[has_prev] - 1), has_next]
    dst = [has_prev, pick(layer[has_next] + 1)]
    need = num_arcs - has_prev.size - has_next.size
    pairs = (sizes[:-1] * sizes[1:]).astype(np.float64)  # so no state becomes a hub
    gaps = rng.choice(num_layers - 1, size=need, p=pairs / pairs.sum())
    src.append(pick(gaps))
    dst.append(pick(gaps + 1))
    finals = state[layer == num_layers - 1]
    return _finish_graph(rng, n, np.concatenate(src), np.concatenate(dst), finals)


def make_workloads() -> list[Workload]:
    """The four benchmark workloads, from one seeded generator."""
    rng = np.random.default_rng(SEED)
    return [
        Workload("dag-1k", [random_dag(rng, 1_000, 5_000)]),
        Workload("dag-10k", [random_dag(rng, 10_000, 50_000)]),
        Workload("lattice-1000x10", [layered_lattice(rng)]),
        Workload("batch-32x200", [random_dag(rng, 200, 1_000) for _ in range(32)], batched=True),
    ]


# -- ours: semiring_jax ----------------------------------------------------------------


def build_ours(workload: Workload) -> sj.Fsa:
    """The workload as one Fsa (stacked for a batch)."""
    fsas = [
        sj.Fsa.from_arcs(
            np.stack([g.src, g.dst, g.label, g.weight], axis=1),
            g.final,
            num_states=g.num_states,
            dtype=np.float32,
        )
        for g in workload.graphs
    ]
    return sj.stack(fsas) if workload.batched else fsas[0]


def ours_functions(semiring: sj.Semiring) -> tuple[Callable, Callable]:
    """Jitted (value, value_and_grad) of the summed total score.

    The Fsa is a jit argument (its index tables live on the device, as in a
    training step), and the weights a separate one: `value_and_grad` takes
    the gradient with respect to all arc weights, [A] or [B, A].
    """

    def total(fsa: sj.Fsa, weight: jax.Array) -> jax.Array:
        return jnp.sum(sj.tot_score(fsa.replace(weight=weight), semiring))

    return jax.jit(total), jax.jit(jax.value_and_grad(total, argnums=1))


# -- peer: OpenFst through pynini ------------------------------------------------------


def to_pynini(graph: Graph, semiring_name: str) -> Any:
    """A pynini.Fst: costs = -scores, start 0, final costs = -final scores."""
    arc_type = OPENFST_ARC_TYPES[semiring_name]
    fst = pynini.Fst(arc_type=arc_type)
    weight_type = fst.weight_type()
    fst.add_states(graph.num_states)
    fst.set_start(0)
    for s, d, lab, w in zip(
        graph.src.tolist(), graph.dst.tolist(), graph.label.tolist(), graph.weight.tolist()
    ):
        fst.add_arc(s, pynini.Arc(lab, lab, pynini.Weight(weight_type, -w), d))
    for state, w in graph.final.items():
        fst.set_final(state, pynini.Weight(weight_type, -w))
    return fst


def openfst_total(fsts: list[Any]) -> list[list[Any]]:
    """Reverse shortest distance of each FST (distance to the finals, final
    weights included); element 0 of each list is the total. The timed call.

    The time includes pynini building the reversed FST and the Python list
    of one Weight object per state. FST construction is not timed, and the
    warm-up call lets OpenFst cache the FST's properties (acyclicity), so
    this is the steady state, like our precomputed schedule.
    """
    return [pynini.shortestdistance(f, delta=OPENFST_DELTA, reverse=True) for f in fsts]


def openfst_total_forward(fsts: list[Any], finals: list[list[tuple[int, Any]]]) -> list[Any]:
    """Detail only: forward distances, then ⊕ of distance ⊗ final weight in
    Python over the few final states. Avoids the reversed copy."""
    totals = []
    for f, fin in zip(fsts, finals):
        dist = pynini.shortestdistance(f, delta=OPENFST_DELTA)
        total = None
        for state, weight in fin:
            if state < len(dist):
                term = pynini.times(dist[state], weight)
                total = term if total is None else pynini.plus(total, term)
        totals.append(total)
    return totals


def weight_to_score(weight: Any) -> float:
    """A pynini Weight (a cost) as a score; None/unset is -inf."""
    return -math.inf if weight is None else 0.0 - float(weight)


# -- peer: numpy per-state loop --------------------------------------------------------


@dataclasses.dataclass
class NumpyPrep:
    """Structure-only tables for the numpy peer (built outside the timing).

    In-arcs (out-arcs) of each state are a slice of `in_order` (`out_order`)
    given by `in_ptr` (`out_ptr`), indexed by state.
    """

    graph: Graph
    in_order: np.ndarray
    in_ptr: np.ndarray
    in_src: np.ndarray
    out_order: np.ndarray
    out_ptr: np.ndarray
    out_dst: np.ndarray
    final_weight: np.ndarray


def numpy_prepare(graph: Graph) -> NumpyPrep:
    """CSR tables of incoming and outgoing arcs (by state), and final weights."""

    def csr(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(keys, kind="stable")
        ptr = np.zeros(graph.num_states + 1, dtype=np.int64)
        np.cumsum(np.bincount(keys, minlength=graph.num_states), out=ptr[1:])
        return order, ptr

    in_order, in_ptr = csr(graph.dst)
    out_order, out_ptr = csr(graph.src)
    final_weight = np.full(graph.num_states, -np.inf, dtype=np.float64)
    for state, w in graph.final.items():
        final_weight[state] = w
    return NumpyPrep(
        graph,
        in_order,
        in_ptr,
        graph.src[in_order],
        out_order,
        out_ptr,
        graph.dst[out_order],
        final_weight,
    )


def numpy_log(prep: NumpyPrep, weight: np.ndarray) -> tuple[float, np.ndarray]:
    """LOG total score and arc posteriors: forward and backward per-state
    loops in topological order, then exp(α[src] + w + β[dst] - Z)."""
    g, w = prep.graph, weight.astype(np.float64)
    in_w, out_w = w[prep.in_order], w[prep.out_order]
    alpha = np.full(g.num_states, -np.inf)
    alpha[0] = 0.0
    for s in g.topo[1:]:
        a, b = prep.in_ptr[s], prep.in_ptr[s + 1]
        alpha[s] = np.logaddexp.reduce(alpha[prep.in_src[a:b]] + in_w[a:b])
    beta = prep.final_weight.copy()
    for s in g.topo[::-1]:
        a, b = prep.out_ptr[s], prep.out_ptr[s + 1]
        if b > a:
            beta[s] = np.logaddexp(
                beta[s], np.logaddexp.reduce(out_w[a:b] + beta[prep.out_dst[a:b]])
            )
    total = float(beta[0])
    return total, np.exp(alpha[g.src] + w + beta[g.dst] - total)


def numpy_tropical(prep: NumpyPrep, weight: np.ndarray) -> tuple[float, np.ndarray]:
    """TROPICAL total score and best-path indicator: forward max loop that
    records each state's best in-arc, then a backtrace from the best final."""
    g, w = prep.graph, weight.astype(np.float64)
    in_w = w[prep.in_order]
    alpha = np.full(g.num_states, -np.inf)
    alpha[0] = 0.0
    best_arc = np.full(g.num_states, -1, dtype=np.int64)
    for s in g.topo[1:]:
        a, b = prep.in_ptr[s], prep.in_ptr[s + 1]
        scores = alpha[prep.in_src[a:b]] + in_w[a:b]
        k = int(np.argmax(scores))
        alpha[s], best_arc[s] = scores[k], prep.in_order[a + k]
    ending = alpha + prep.final_weight
    state = int(np.argmax(ending))
    indicator = np.zeros(g.num_arcs)
    while state != 0:
        arc = best_arc[state]
        indicator[arc] = 1.0
        state = int(g.src[arc])
    return float(ending.max()), indicator


NUMPY_PEERS = {"LOG": numpy_log, "TROPICAL": numpy_tropical}


# -- timing ----------------------------------------------------------------------------


FULL_REPS = Reps(min_runs=7, max_runs=25, budget_s=1.5)
QUICK_REPS = Reps(min_runs=2, max_runs=3, budget_s=0.0)
# Warm timing: each turn is BURST back-to-back calls, the first untimed
# (benchmarks/timing.py); the goals are judged on it.
BURST = 4


# -- one row ---------------------------------------------------------------------------


@dataclasses.dataclass
class Row:
    """Results of one (workload, semiring) pair; times in seconds, warm
    (back-to-back calls) unless named cold (one call per turn)."""

    workload: str
    semiring: str
    arcs: int
    levels: int
    ours_vg: float
    ours_value: float
    compile_vg: float
    compile_value: float
    openfst: float | None
    openfst_forward: float | None
    numpy: float
    checks: list[str]
    ours_vg_cold: float
    openfst_cold: float | None
    floor: float
    floor_cold: float
    flops_vg: float
    flops_value: float

    @property
    def ratio_openfst(self) -> float | None:
        return None if self.openfst is None else self.openfst / self.ours_vg

    @property
    def ratio_openfst_cold(self) -> float | None:
        return None if self.openfst_cold is None else self.openfst_cold / self.ours_vg_cold

    @property
    def ratio_numpy(self) -> float:
        return self.numpy / self.ours_vg

    @property
    def ns_per_arc(self) -> float:
        return self.ours_vg / self.arcs * 1e9


def agree(ours: float, theirs: float) -> bool:
    """Scores agree to VALUE_RTOL relative (absolute near 0)."""
    return abs(ours - theirs) <= VALUE_RTOL * max(1.0, abs(theirs))


# XLA:CPU runs a program whose estimated flops (HloCostAnalysis) are below
# this inline on the calling thread; any other goes to a worker thread, and
# every call then pays a thread handoff (tens of us on a busy 2-core VM).
XLA_CPU_INLINE_FLOPS = 1000


def xla_flops(fn: Callable, *args: Any) -> float:
    """XLA's flop estimate of the jitted `fn`'s compiled program: custom
    calls (our kernels) count 0, so anything above is JAX work around them."""
    analysis = fn.lower(*args).compile().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    return float((analysis or {}).get("flops", 0.0))


def run_row(workload: Workload, fsa: sj.Fsa, semiring_name: str, reps: Reps) -> Row:
    """Compiles, checks and times ours and the peers on one workload."""
    semiring = SEMIRINGS[semiring_name]
    fsa_device = jax.device_put(fsa)
    weight = jax.device_put(fsa.weight)
    value_fn, vg_fn = ours_functions(semiring)

    ours_vg = lambda: jax.block_until_ready(vg_fn(fsa_device, weight))
    ours_value = lambda: jax.block_until_ready(value_fn(fsa_device, weight))
    compile_vg = first_call_seconds(ours_vg)
    compile_value = first_call_seconds(ours_value)

    preps = [numpy_prepare(g) for g in workload.graphs]
    numpy_peer = NUMPY_PEERS[semiring_name]
    numpy_call = lambda: [numpy_peer(p, p.graph.weight) for p in preps]

    # The cost of any JAX call here: a jitted multiply of the same weights.
    floor_fn = jax.jit(lambda w: w * 2)
    jax_floor = lambda: jax.block_until_ready(floor_fn(weight))
    contestants = {
        "ours_vg": ours_vg,
        "ours_value": ours_value,
        "numpy": numpy_call,
        "jax_floor": jax_floor,
    }
    fsts = None
    if pynini is not None:
        fsts = [to_pynini(g, semiring_name) for g in workload.graphs]
        fst_finals = [[(s, f.final(s)) for s in g.final] for f, g in zip(fsts, workload.graphs)]
        contestants["openfst"] = lambda: openfst_total(fsts)
        contestants["openfst_fwd"] = lambda: openfst_total_forward(fsts, fst_finals)

    # Correctness checks (outside the timing).
    checks = []
    total, grad = vg_fn(fsa_device, weight)
    per_entry = np.atleast_1d(np.asarray(sj.tot_score(fsa, semiring)))  # [1] or [B]
    grad = np.asarray(grad).reshape(len(workload.graphs), -1)
    np_results = numpy_call()
    np_ok = all(agree(float(o), r[0]) for o, r in zip(per_entry, np_results))
    grad_err = max(
        float(np.max(np.abs(grad[i, : g.num_arcs] - r[1])))
        for i, (g, r) in enumerate(zip(workload.graphs, np_results))
    )
    checks.append(
        f"numpy value {'ok' if np_ok else 'MISMATCH'}, "
        f"max |grad - numpy posteriors| = {grad_err:.1e}"
    )
    if not math.isclose(float(total), float(per_entry.sum()), rel_tol=1e-5, abs_tol=1e-3):
        checks.append(
            f"MISMATCH: jitted value {float(total)} vs tot_score sum {float(per_entry.sum())}"
        )
    if fsts is not None:
        fst_totals = [weight_to_score(d[0]) if d else -math.inf for d in openfst_total(fsts)]
        fwd_totals = [weight_to_score(t) for t in openfst_total_forward(fsts, fst_finals)]
        errors = [abs(float(o) - t) / max(1.0, abs(t)) for o, t in zip(per_entry, fst_totals)]
        fst_ok = all(agree(float(o), t) for o, t in zip(per_entry, fst_totals))
        fwd_ok = all(agree(float(o), t) for o, t in zip(per_entry, fwd_totals))
        checks.append(
            f"OpenFst value {'ok' if fst_ok else 'MISMATCH'} "
            f"(max rel err {max(errors):.1e}; forward variant "
            f"{'ok' if fwd_ok else 'MISMATCH'})"
        )

    medians = interleaved_medians(contestants, reps, burst=BURST)
    cold = interleaved_medians(
        {
            name: contestants[name]
            for name in ("ours_vg", "openfst", "jax_floor")
            if name in contestants
        },
        reps,
    )
    return Row(
        workload.name,
        semiring_name,
        workload.num_arcs,
        fsa.schedule.levels.in_arc.shape[-3],
        medians["ours_vg"],
        medians["ours_value"],
        compile_vg,
        compile_value,
        medians.get("openfst"),
        medians.get("openfst_fwd"),
        medians["numpy"],
        checks,
        cold["ours_vg"],
        cold.get("openfst"),
        medians["jax_floor"],
        cold["jax_floor"],
        xla_flops(vg_fn, fsa_device, weight),
        xla_flops(value_fn, fsa_device, weight),
    )


# -- reporting -------------------------------------------------------------------------


def fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    """`value * scale` formatted with `spec`, or "n/a" for a missing value."""
    return "n/a" if value is None else format(value * scale, spec)


def print_environment() -> None:
    """Versions and devices, so that a table can be put in context."""
    print(
        f"python {platform.python_version()}  jax {jax.__version__}  "
        f"numpy {np.__version__}  pynini "
        f"{getattr(pynini, '__version__', 'MISSING (OpenFst peer skipped)')}  "
        f"semiring_jax {sj.__version__}"
    )
    print(
        f"jax.devices(): {jax.devices()}  os.cpu_count(): {os.cpu_count()}  "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '(unset)')}"
    )


def print_workloads(workloads: list[Workload], fsas: list[sj.Fsa], build_s: list[float]) -> None:
    """Sizes and schedule shapes: levels L = depth + 1, width W (states per
    level), R rows of K slots per level (incoming arcs; high in-degree
    states use several rows), and the padded slots L * R * K per scan."""
    print(f"\nWorkloads (seed {SEED}; state numbering permuted, 0 kept as start):")
    print(
        f"  {'workload':<17}{'states':>8}{'arcs':>8}{'L':>6}{'W':>6}{'R':>6}{'K':>5}"
        f"{'R_out':>6}{'K_out':>6}{'slots L*R*K':>13}{'build (s)':>11}"
    )
    for w, fsa, seconds in zip(workloads, fsas, build_s):
        levels, rows, max_in = fsa.schedule.levels.in_arc.shape[-3:]
        width = fsa.schedule.levels.pos_state.shape[-1]
        out_rows, max_out = fsa.schedule.levels.out_arc.shape[-2:]
        batch = f"  (B={len(w.graphs)}, padded)" if w.batched else ""
        print(
            f"  {w.name:<17}{w.num_states:>8}{w.num_arcs:>8}{levels:>6}{width:>6}{rows:>6}"
            f"{max_in:>5}{out_rows:>6}{max_out:>6}{levels * rows * max_in:>13}"
            f"{seconds:>11.3f}{batch}"
        )
    print("  build = Fsa.from_arcs (+ sj.stack for the batch): host numpy, not in the table.")


def print_table(rows: list[Row]) -> None:
    """The headline table, one row per (workload, semiring)."""
    print(
        f"\nResults (median ms of warm calls, {BURST - 1} timed back-to-back per turn;"
        " compile = first call of the jitted value+grad, in s;\n  cold = one call per"
        " turn, right after the other contestants):"
    )
    header = (
        f"{'workload':<17}{'semiring':<10}{'ours v+g':>10}{'ours val':>10}"
        f"{'compile':>9}{'OpenFst':>10}{'numpy':>10}{'OFst/ours':>11}"
        f"{'np/ours':>9}{'ns/arc':>8}{'v+g cold':>10}{'OFst cold':>11}{'ratio cold':>12}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.workload:<17}{r.semiring:<10}{r.ours_vg * 1e3:>10.3f}"
            f"{r.ours_value * 1e3:>10.3f}{r.compile_vg:>9.2f}"
            f"{fmt(r.openfst, '.3f', 1e3):>10}{r.numpy * 1e3:>10.1f}"
            f"{fmt(r.ratio_openfst, '.1f'):>11}{r.ratio_numpy:>9.0f}{r.ns_per_arc:>8.0f}"
            f"{r.ours_vg_cold * 1e3:>10.3f}{fmt(r.openfst_cold, '.3f', 1e3):>11}"
            f"{fmt(r.ratio_openfst_cold, '.1f'):>12}"
        )
    print(
        "Columns: ours v+g = jitted tot_score value + gradient w.r.t. all arc weights;"
        " ours val = value only;\n  OpenFst = pynini.shortestdistance(reverse=True,"
        f" delta={OPENFST_DELTA:g}), value only, including pynini's reversed copy and the"
        " Python\n  list of Weight objects it returns (batch: 32 FSTs one after another);"
        " numpy = per-state loop, value + posteriors\n  (TROPICAL: value + best-path"
        " indicator); ratios are peer / ours v+g; ns/arc = ours v+g per real arc.\n"
        "  Cold calls pay JAX's dispatch from cold caches on this VM (0.1-0.5 ms on any"
        " JAX call; benchmarks/timing.py)."
    )


def print_details(rows: list[Row]) -> None:
    """Secondary numbers: value-only compile, OpenFst forward variant, checks."""
    print("\nDetails:")
    print(
        f"  {'workload':<17}{'semiring':<10}{'compile val (s)':>16}"
        f"{'OpenFst fwd (ms)':>18}{'OFst fwd/ours':>15}{'JAX floor (ms)':>16}"
        f"{'XLA flops v+g/val':>19}{'inline':>8}  checks"
    )
    for r in rows:
        fwd_ratio = None if r.openfst_forward is None else r.openfst_forward / r.ours_vg
        inline = "/".join(
            "yes" if f < XLA_CPU_INLINE_FLOPS else "NO" for f in (r.flops_vg, r.flops_value)
        )
        print(
            f"  {r.workload:<17}{r.semiring:<10}{r.compile_value:>16.2f}"
            f"{fmt(r.openfst_forward, '.3f', 1e3):>18}"
            f"{fmt(fwd_ratio, '.1f'):>15}"
            f"{f'{r.floor * 1e3:.3f}/{r.floor_cold * 1e3:.3f}':>16}"
            f"{f'{r.flops_vg:.0f}/{r.flops_value:.0f}':>19}{inline:>8}  {'; '.join(r.checks)}"
        )
    print(
        "  OpenFst fwd = shortestdistance(reverse=False) then ⊕ over final states in"
        " Python (no reversed copy); detail only,\n  the goal uses the reverse=True column."
        "\n  JAX floor = a jitted `weight * 2` on the same array, warm/cold: what any JAX"
        " call costs here, whatever its work."
        f"\n  XLA flops = the compiled program's cost estimate (the kernels count 0); below"
        f" {XLA_CPU_INLINE_FLOPS} XLA:CPU runs it\n  inline, else on a worker thread with a"
        " handoff on every call (the per-call cost of issue: tot_score +0.1 ms)."
    )


def print_depth_scaling(rows: list[Row], fsas: dict[str, sj.Fsa]) -> None:
    """Time per level on the two 50,000-arc workloads: same arcs, different depth."""
    print("\nDepth scaling (50,000 arcs each; sequential steps = levels L):")
    print(
        f"  {'workload':<17}{'semiring':<10}{'states':>8}{'L':>6}{'W':>6}"
        f"{'v+g ms':>9}{'us/level':>10}{'value ms':>10}{'us/level':>10}"
    )
    for r in rows:
        if r.workload not in ("dag-10k", "lattice-1000x10"):
            continue
        levels, width = fsas[r.workload].schedule.levels.pos_state.shape[-2:]
        print(
            f"  {r.workload:<17}{r.semiring:<10}{fsas[r.workload].num_states:>8}{levels:>6}"
            f"{width:>6}{r.ours_vg * 1e3:>9.3f}{r.ours_vg / levels * 1e6:>10.2f}"
            f"{r.ours_value * 1e3:>10.3f}{r.ours_value / levels * 1e6:>10.2f}"
        )


GOALS = {"dag-1k": 10.0, "dag-10k": 20.0, "lattice-1000x10": 20.0, "batch-32x200": 20.0}


def print_summary(rows: list[Row]) -> None:
    """Whether the speed goals against OpenFst are met, row by row."""
    print(
        "\nGoals: on the three larger workloads (dag-10k, lattice-1000x10, batch-32x200)"
        " our value+grad is >= 20x faster than\n  OpenFst's value-only time; on the"
        " 1,000-state one (dag-1k) >= 10x."
    )
    met_all = True
    for r in rows:
        goal = GOALS[r.workload]
        if r.ratio_openfst is None:
            print(
                f"  {r.workload:<17}{r.semiring:<10} goal {goal:>4.0f}x: not measured"
                " (pynini missing)"
            )
            met_all = False
            continue
        met = r.ratio_openfst >= goal
        met_all &= met
        print(
            f"  {r.workload:<17}{r.semiring:<10} goal {goal:>4.0f}x: "
            f"measured {r.ratio_openfst:6.1f}x warm  {'MET' if met else 'NOT MET':<8}"
            f"(cold: {fmt(r.ratio_openfst_cold, '.1f')}x)"
        )
    print(
        f"  Overall (warm): {'all goals met' if met_all else 'some goals NOT met'}."
        " Cold ratios are shown for reference."
    )


# -- per-call cost: a tiny Fsa, where the work is nothing and the call is all --------


def print_per_call(reps: Reps) -> None:
    """tot_score value + gradient on a 50-state, 150-arc DAG beside the JAX
    floor, warm and cold, with XLA's flop estimate: a fixed cost added to
    every call (a thread handoff, per-call Python) shows here first."""
    graph = random_dag(np.random.default_rng(SEED + 1), 50, 150)
    fsa = build_ours(Workload("dag-50", [graph]))
    fsa_device, weight = jax.device_put(fsa), jax.device_put(fsa.weight)
    floor_fn = jax.jit(lambda w: w * 2)
    contestants = {"jax_floor": lambda: jax.block_until_ready(floor_fn(weight))}
    flops = {}
    for name, semiring in SEMIRINGS.items():
        _, vg_fn = ours_functions(semiring)
        flops[name] = xla_flops(vg_fn, fsa_device, weight)
        contestants[name] = lambda fn=vg_fn: jax.block_until_ready(fn(fsa_device, weight))
        # Eager: the checks and dispatch that sj.tot_score does in Python per call.
        eager = f"{name} eager"
        flops[eager] = flops[name]
        contestants[eager] = lambda s=semiring: jax.block_until_ready(sj.tot_score(fsa_device, s))
    warm = interleaved_medians(contestants, reps, burst=BURST)
    cold = interleaved_medians(contestants, reps)
    print(
        "\nPer call (dag-50: 50 states, 150 arcs; jitted v+g and eager tot_score value,"
        " median us, warm/cold;\n  over floor = minus the JAX floor's; XLA flops of the"
        " v+g program):"
    )
    print(f"  {'call':<16}{'us':>14}{'over floor':>14}{'XLA flops':>11}{'inline':>8}")
    for name in contestants:
        if name == "jax_floor":
            continue
        over_warm = (warm[name] - warm["jax_floor"]) * 1e6
        over_cold = (cold[name] - cold["jax_floor"]) * 1e6
        inline = "yes" if flops[name] < XLA_CPU_INLINE_FLOPS else "NO"
        print(
            f"  {name:<16}{f'{warm[name] * 1e6:.1f}/{cold[name] * 1e6:.1f}':>14}"
            f"{f'{over_warm:.1f}/{over_cold:.1f}':>14}{flops[name]:>11.0f}{inline:>8}"
        )
    print(
        f"  JAX floor {warm['jax_floor'] * 1e6:.1f}/{cold['jax_floor'] * 1e6:.1f} us. The"
        " kernels' work here is a few us: over floor is the fixed cost of a call."
    )


# -- structured semirings: k-best scores and entropy -------------------------------------

KBEST_KS = (1, 4, 16)
STRUCTURED_GOALS = {"entropy/LOG": 3.0, "kbest16/TROPICAL": 20.0, "OpenFst nshortest16/ours": 5.0}


@dataclasses.dataclass
class StructuredRow:
    """Median seconds of one workload's structured-semiring contestants."""

    workload: str
    times: dict[str, float]
    checks: list[str]


def structured_functions() -> dict[str, Callable]:
    """Jitted functions of (fsa, weight), each summed over a batch: the two
    baselines, entropy value + gradient, and k-best values."""

    def summed(fn: Callable[[sj.Fsa], jax.Array]) -> Callable:
        return lambda fsa, weight: jnp.sum(fn(fsa.replace(weight=weight)))

    log_total = summed(sj.tot_score)
    functions = {
        "tot LOG v+g": jax.jit(jax.value_and_grad(log_total, argnums=1)),
        "entropy v+g": jax.jit(jax.value_and_grad(summed(sj.entropy), argnums=1)),
        "tot TROPICAL": jax.jit(summed(lambda fsa: sj.tot_score(fsa, sj.TROPICAL))),
    }
    for k in KBEST_KS:
        functions[f"kbest{k}"] = jax.jit(
            lambda fsa, weight, k=k: sj.kbest_scores(fsa.replace(weight=weight), k)
        )
    return functions


def openfst_nshortest(fsts: list[Any], n: int) -> list[Any]:
    """pynini.shortestpath(nshortest=n) of each FST: the timed call."""
    return [pynini.shortestpath(fst, nshortest=n) for fst in fsts]


def nshortest_scores(result: Any) -> list[float]:
    """The path scores of an n-shortest-paths FST, best first."""
    found, paths = [], result.paths()
    while not paths.done():
        found.append(0.0 - float(paths.weight()))
        paths.next()
    return sorted(found, reverse=True)


def run_structured_row(workload: Workload, fsa: sj.Fsa, reps: Reps) -> StructuredRow:
    """Times the structured-semiring ops beside `tot_score` on one workload
    (and OpenFst's n-shortest paths on the 10k-state DAG), with checks."""
    fsa_device, weight = jax.device_put(fsa), jax.device_put(fsa.weight)
    functions = structured_functions()
    contestants = {
        name: (lambda fn=fn: jax.block_until_ready(fn(fsa_device, weight)))
        for name, fn in functions.items()
    }
    fsts = None
    if pynini is not None and workload.name == "dag-10k":
        fsts = [to_pynini(g, "TROPICAL") for g in workload.graphs]
        contestants["OpenFst nshortest16"] = lambda: openfst_nshortest(fsts, 16)
    checks = []
    best = np.asarray(functions["kbest16"](fsa_device, weight)).reshape(-1, 16)
    tropical = np.atleast_1d(np.asarray(sj.tot_score(fsa, sj.TROPICAL)))
    top_ok = all(agree(float(b), float(t)) for b, t in zip(best[:, 0], tropical))
    checks.append(f"kbest16[0] = TROPICAL {'ok' if top_ok else 'MISMATCH'}")
    entropy = np.atleast_1d(np.asarray(sj.entropy(fsa)))
    checks.append(f"entropy {'finite' if np.isfinite(entropy).all() else 'NOT FINITE'}")
    if fsts is not None:
        theirs = nshortest_scores(openfst_nshortest(fsts, 16)[0])
        same = len(theirs) == 16 and all(agree(float(a), b) for a, b in zip(best[0], theirs))
        checks.append(f"kbest16 = OpenFst nshortest=16 {'ok' if same else 'MISMATCH'}")
    return StructuredRow(workload.name, interleaved_medians(contestants, reps, burst=BURST), checks)


def print_structured(rows: list[StructuredRow]) -> None:
    """The structured-semiring table and its goals."""
    names = [*structured_functions(), "OpenFst nshortest16"]
    print("\nStructured semirings (median ms of warm calls; kbest = value only):")
    header = f"{'workload':<17}" + "".join(f"{name:>14}" for name in names)
    print(header + f"{'ent/LOG':>9}{'kb16/TROP':>10}{'OFst/kb16':>10}")
    print("-" * (len(header) + 29))
    for r in rows:
        cells = "".join(fmt(r.times.get(name), ".3f", 1e3).rjust(14) for name in names)
        ratios = [
            r.times["entropy v+g"] / r.times["tot LOG v+g"],
            r.times["kbest16"] / r.times["tot TROPICAL"],
            None
            if "OpenFst nshortest16" not in r.times
            else r.times["OpenFst nshortest16"] / r.times["kbest16"],
        ]
        print(
            f"{r.workload:<17}{cells}{fmt(ratios[0], '.2f'):>9}{fmt(ratios[1], '.1f'):>10}"
            f"{fmt(ratios[2], '.1f'):>10}   {'; '.join(r.checks)}"
        )
    print(
        "Goals: entropy v+g <= 3x tot_score LOG v+g; kbest_scores(k=16) <= 20x tot_score"
        " TROPICAL (value);\n  kbest_scores(k=16) >= 5x faster than OpenFst's"
        " shortestpath(nshortest=16) on dag-10k (OFst/kb16 >= 5)."
    )


# -- main ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer repetitions (same sizes), for a smoke run"
    )
    parser.add_argument(
        "--structured-only",
        action="store_true",
        help="only the structured-semiring table (k-best scores, entropy)",
    )
    args = parser.parse_args(argv)
    reps = QUICK_REPS if args.quick else FULL_REPS
    start = time.perf_counter()

    print_environment()
    print(f"repetitions: {reps}")
    workloads = make_workloads()
    fsas, build_s = [], []
    for w in workloads:
        t0 = time.perf_counter()
        fsas.append(build_ours(w))
        build_s.append(time.perf_counter() - t0)
    print_workloads(workloads, fsas, build_s)
    print_per_call(reps)

    structured = []
    for w, fsa in zip(workloads, fsas):
        structured.append(run_structured_row(w, fsa, reps))
        print(f"  done {w.name} structured ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    print_structured(structured)
    if args.structured_only:
        return

    rows = []
    for w, fsa in zip(workloads, fsas):
        for semiring_name in SEMIRINGS:
            rows.append(run_row(w, fsa, semiring_name, reps))
            print(
                f"  done {w.name} {semiring_name} ({time.perf_counter() - start:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

    print_table(rows)
    print_details(rows)
    print_depth_scaling(rows, {w.name: f for w, f in zip(workloads, fsas)})
    print_summary(rows)
    print(f"\nTotal wall time {time.perf_counter() - start:.0f} s.")


if __name__ == "__main__":
    main()
