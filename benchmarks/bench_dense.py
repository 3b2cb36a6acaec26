"""Benchmark: dense intersection with a general graph (LF-MMI's recursion).

Times `sj.dense_tot_score` (LOG) value + gradient with respect to the
emissions, with one shared random cyclic graph, against, in the same run:

  * scan: ours with the compiled CPU kernels switched off at trace time
    (the portable arc scan that GPUs and TPUs run, `dense/arc_scan.py`);
  * plain JAX: the program a user would write without this library -- a
    `lax.scan` over frames whose step gathers alpha[src] + weight +
    emissions[t, label] per arc and reduces per destination state with
    `jax.ops.segment_max` / `segment_sum`, vmapped over the batch and
    differentiated by autodiff;
  * numpy: a float64 per-frame forward over the arcs, batched
    (`denominator.numpy_log_totals`; value only, once), for scale and as
    the values' reference.

Workloads: a 500-state / 5,000-arc graph at (B, T, V) = (16, 500, 256), and
a 5,000-state / 50,000-arc one at (8, 300, 2,000) (a realistic chain
denominator). Graphs: `denominator.random_graph` (a Hamiltonian cycle plus
uniform random arcs, weights log-normalised per state), 10 final states;
emissions log_softmax of N(0, 1) logits; lengths in
[0.8 T, T]. Prints medians, ns per arc-frame (time / (B T A)), ratios
(> 1: ours faster) and XLA's temporary buffers for each compiled program;
then `sj.mmi_loss` against the two `dense_tot_score` calls it makes,
timed as a pair of their own.

Run:
    .venv/bin/python benchmarks/bench_dense.py          # about 3 minutes on 2 cores
    .venv/bin/python benchmarks/bench_dense.py --quick  # the small graph only
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import time

import denominator
import jax
import jax.numpy as jnp
import numpy as np
from timing import Reps, interleaved_medians

import semiring_jax as sj
from semiring_jax._src.core import routes
from semiring_jax._src.kernels import loader

SEED = 20261201
WORKLOADS = (
    dict(states=500, arcs=5_000, batch=16, frames=500, vocab=256),
    dict(states=5_000, arcs=50_000, batch=8, frames=300, vocab=2_000),
)
REPS = Reps(min_runs=3, max_runs=7, budget_s=6.0)


@dataclasses.dataclass
class Inputs:
    graph: denominator.Graph
    emissions: np.ndarray  # float32 [B, T, V]
    lengths: np.ndarray  # int32 [B]


def make_inputs(index: int) -> Inputs:
    w = WORKLOADS[index]
    rng = np.random.default_rng([SEED, index])
    graph = denominator.random_graph(rng, w["states"], w["arcs"], w["vocab"], finals=10)
    logits = rng.standard_normal((w["batch"], w["frames"], w["vocab"]), dtype=np.float32)
    emissions = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    lengths = rng.integers(math.ceil(0.8 * w["frames"]), w["frames"] + 1, w["batch"])
    lengths[0] = w["frames"]
    return Inputs(graph, emissions.astype(np.float32), lengths.astype(np.int32))


def plain_jax(inp: Inputs):
    """The yardstick: value + gradient of the summed totals, by autodiff."""
    graph = inp.graph
    src, dst, label = (jnp.asarray(x, jnp.int32) for x in (graph.src, graph.dst, graph.label))
    weight = jnp.asarray(graph.weight, jnp.float32)
    final = jnp.zeros(graph.states, bool).at[jnp.asarray(graph.final)].set(True)
    states = graph.states

    def total(emissions, length):
        def step(alpha, xs):
            t, frame = xs
            scores = alpha[src] + weight + frame[label]
            top = jax.lax.stop_gradient(jax.ops.segment_max(scores, dst, num_segments=states))
            top = jnp.where(jnp.isfinite(top), top, 0.0)
            sums = jax.ops.segment_sum(jnp.exp(scores - top[dst]), dst, num_segments=states)
            # log 0 at unreachable states, guarded so that its gradient is not NaN.
            reached = sums > 0
            new = jnp.where(reached, top + jnp.log(jnp.where(reached, sums, 1.0)), -jnp.inf)
            return jnp.where(t < length, new, alpha), None

        start = jnp.full(states, -jnp.inf).at[0].set(0.0)
        frames = jnp.arange(emissions.shape[0])
        alpha, _ = jax.lax.scan(step, start, (frames, emissions))
        return jax.nn.logsumexp(jnp.where(final, alpha, -jnp.inf))

    def loss(emissions, lengths):
        return jnp.sum(jax.vmap(total)(emissions, lengths))

    return jax.jit(jax.value_and_grad(loss))


def our_graph(inp: Inputs) -> sj.Fsa:
    g = inp.graph
    arcs = np.stack([g.src, g.dst, g.label, g.weight.astype(np.float32)], axis=1)
    return sj.Fsa.from_arcs(arcs, g.final.tolist(), num_states=g.states, dtype=np.float32)


def ours(inp: Inputs):
    graph = our_graph(inp)

    def loss(emissions, lengths):
        return jnp.sum(sj.dense_tot_score(graph, emissions, lengths, sj.LOG))

    return jax.jit(jax.value_and_grad(loss))


def numerator_graphs(inp: Inputs) -> sj.Fsa:
    """One numerator-like graph per utterance: a chain of T / 4 random pdfs,
    each entered once and then looped on (an alignment of a phone string)."""
    rng = np.random.default_rng([SEED, 7])
    vocab = inp.emissions.shape[-1]
    graphs = []
    for length in inp.lengths:
        pdfs = rng.integers(0, vocab, max(1, int(length) // 4))
        arcs = [(i, i + 1, int(p), 0.0) for i, p in enumerate(pdfs)]
        arcs += [(i + 1, i + 1, int(p), 0.0) for i, p in enumerate(pdfs)]
        graphs.append(sj.Fsa.from_arcs(arcs, [len(pdfs)], dtype=np.float32))
    return sj.stack(graphs)


def mmi(inp: Inputs, *, split: bool = False):
    """`mmi_loss` (leaky HMM 1e-5), or with `split` the two
    `dense_tot_score` calls it makes (the leak off), value + gradient."""
    den, num = our_graph(inp), numerator_graphs(inp)

    def loss(emissions, lengths):
        if split:
            return jnp.sum(
                sj.dense_tot_score(den, emissions, lengths)
                - sj.dense_tot_score(num, emissions, lengths)
            )
        return jnp.sum(sj.mmi_loss(num, den, emissions, lengths, leaky_hmm=1e-5))

    return jax.jit(jax.value_and_grad(loss))


def compiled(fn, inp: Inputs, *, scan: bool = False):
    """(compiled program, compile seconds); `scan`: traced with the CPU
    kernels off, as on a GPU or TPU."""
    args = (jnp.asarray(inp.emissions), jnp.asarray(inp.lengths))
    # Forcing a route clears the library's jitted functions, so that each
    # program traces its own.
    with routes.force("portable") if scan else contextlib.nullcontext():
        start = time.perf_counter()
        program = fn.lower(*args).compile()
        seconds = time.perf_counter() - start
    return program, seconds


def temp_mb(program) -> float:
    analysis = program.memory_analysis()
    return float("nan") if analysis is None else analysis.temp_size_in_bytes / 2**20


def run(index: int) -> None:
    w = WORKLOADS[index]
    inp = make_inputs(index)
    args = (jnp.asarray(inp.emissions), jnp.asarray(inp.lengths))
    programs = {
        "ours": compiled(ours(inp), inp),
        "scan": compiled(ours(inp), inp, scan=True),
        "plain JAX": compiled(plain_jax(inp), inp),
    }
    start = time.perf_counter()
    reference = denominator.numpy_log_totals(inp.graph, inp.emissions, inp.lengths)
    numpy_s = time.perf_counter() - start
    for name, (program, _) in programs.items():
        value, grad = program(*args)
        error = abs(float(value) - reference.sum()) / abs(reference.sum())
        if not (error < 1e-4 and bool(jnp.isfinite(grad).all())):
            raise SystemExit(f"{name}: total off by {error:.2e} relative, or a non-finite gradient")
    programs["mmi_loss"] = compiled(mmi(inp), inp)
    programs["2 totals"] = compiled(mmi(inp, split=True), inp)
    contestants = {
        name: (lambda p=program: jax.block_until_ready(p(*args)))
        for name, (program, _) in programs.items()
    }
    # `mmi_loss` and its two totals are timed as a pair of their own: in one
    # round with the others, whichever follows plain JAX (hundreds of MB of
    # temporaries just freed) pays its page faults and cold caches.
    pair = ("mmi_loss", "2 totals")
    medians = interleaved_medians({k: v for k, v in contestants.items() if k not in pair}, REPS)
    medians |= interleaved_medians({k: contestants[k] for k in pair}, REPS)
    arc_frames = w["batch"] * w["frames"] * w["arcs"]
    print(
        f"\n{w['states']} states, {w['arcs']} arcs, (B, T, V) = "
        f"({w['batch']}, {w['frames']}, {w['vocab']}); value + gradient w.r.t. emissions"
    )
    header = ("", "ms", "ns/arc-frame", "plain JAX / it", "compile s", "temp MB")
    print("{:>10} {:>9} {:>13} {:>15} {:>10} {:>8}".format(*header))
    plain = medians["plain JAX"]
    for name, (program, seconds) in programs.items():
        if name in pair:
            continue
        ms = medians[name] * 1e3
        print(
            f"{name:>10} {ms:9.1f} {medians[name] * 1e9 / arc_frames:13.2f} "
            f"{plain / medians[name]:15.2f} {seconds:10.2f} {temp_mb(program):8.1f}"
        )
    print(
        f"{'numpy f64':>10} {numpy_s * 1e3:9.0f} {numpy_s * 1e9 / arc_frames:13.2f} "
        f"{'(value only, once)':>15}"
    )
    ratio = medians["mmi_loss"] / medians["2 totals"]
    print(
        f"mmi_loss (leaky 1e-5, numerators of T/4 pdfs) {medians['mmi_loss'] * 1e3:.1f} ms; "
        f"its two dense_tot_score calls {medians['2 totals'] * 1e3:.1f} ms; "
        f"mmi_loss / the two = {ratio:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small graph only")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; CPU kernels: {loader.enabled()}")
    for index in range(1 if args.quick else len(WORKLOADS)):
        run(index)


if __name__ == "__main__":
    main()
