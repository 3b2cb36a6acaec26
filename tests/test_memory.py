"""Graphs with very high-degree states, scored in bounded memory.

A star (state 0 to a million states) and a lexicon-like graph (a start state
with an arc per word, a chain of phones per word, every word ending in one
state) pad per-state tables to S times the largest degree: terabytes. Their
level tables (`core/host/schedule_tables.py`) and dense tables
(`core/host/dense_tables.py`) grow with the arcs instead: building them and
running the score and dense ops stays well under 2 GB. Each big case runs
in a subprocess that reports its own peak RSS; smaller instances of the same
shapes are checked against a numpy forward-backward.
"""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import semiring_jax as sj
from semiring_jax._src.core.host import dense_tables

ROOT = Path(__file__).resolve().parents[1]
FRAMES = 8
PEAK_LIMIT_BYTES = 2 * 1024**3


def star(num_leaves, vocab, seed=0):
    """(num_states, src, dst, label, weight, final states): state 0 to each
    of `num_leaves` states, all of them final."""
    rng = np.random.default_rng(seed)
    src = np.zeros(num_leaves, np.int64)
    dst = np.arange(1, num_leaves + 1)
    return (
        num_leaves + 1,
        src,
        dst,
        rng.integers(0, vocab, num_leaves),
        rng.normal(size=num_leaves) * 0.5,
        dst,
    )


def lexicon(num_words, vocab, phones=5, seed=0):
    """State 0 -> one arc per word, `phones` arcs a word as a chain, the last
    one into a shared final state."""
    rng = np.random.default_rng(seed)
    inner = phones - 1  # states inside a word
    num_states = 2 + num_words * inner
    first = 1 + inner * np.arange(num_words)
    chain = [first + i for i in range(inner)]
    src = np.concatenate([np.zeros(num_words, np.int64), *chain])
    dst = np.concatenate([*chain, np.full(num_words, num_states - 1)])
    return (
        num_states,
        src,
        dst,
        rng.integers(0, vocab, src.size),
        rng.normal(size=src.size) * 0.5,
        np.array([num_states - 1]),
    )


GRAPHS = {"star": (star, 30), "lexicon": (lexicon, 40)}


def build(graph, dtype=np.float32):
    num_states, src, dst, label, weight, final = graph
    arcs = np.stack([src, dst, label, weight], axis=1)
    return sj.Fsa.from_arcs(arcs, final, num_states=num_states, dtype=dtype)


def numpy_dense(graph, emissions, length, semiring="log"):
    """(total, emission posteriors [T, V]) in float64 by a plain forward-
    backward over the arcs (posteriors only for LOG)."""
    num_states, src, dst, label, weight, final = graph
    plus = np.logaddexp if semiring == "log" else np.maximum
    emissions = np.asarray(emissions, np.float64)
    alphas = [np.full(num_states, -np.inf)]
    alphas[0][0] = 0.0
    for t in range(length):
        new = np.full(num_states, -np.inf)
        plus.at(new, dst, alphas[-1][src] + weight + emissions[t, label])
        alphas.append(new)
    stop = np.full(num_states, -np.inf)
    stop[final] = 0.0
    total = plus.reduce(alphas[-1] + stop)
    posteriors = np.zeros(emissions.shape)
    if semiring != "log" or total == -np.inf:
        return total, posteriors
    beta = stop
    for t in reversed(range(length)):
        used = weight + emissions[t, label] + beta[dst]
        np.add.at(posteriors[t], label, np.exp(alphas[t][src] + used - total))
        beta = np.full(num_states, -np.inf)
        np.logaddexp.at(beta, src, used)
    return total, posteriors


def _peak_rss_bytes():
    """This process's peak resident set size (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def run_case(kind, size, length):
    """The child's work: build the graph, run the score ops and the dense
    ops on T = FRAMES frames, note the peak RSS, then compute the oracle;
    one JSON line."""
    make, vocab = GRAPHS[kind]
    graph = make(size, vocab)
    fsa = build(graph)
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(1, FRAMES, vocab))
    emissions = (logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)).astype(np.float32)
    lengths = np.array([length])
    # Every path of these graphs has `length` arcs, so tot_score is the
    # dense total over zero emissions, and its posteriors sum to `length`.
    score, score_grad = jax.value_and_grad(lambda w: sj.tot_score(fsa.replace(weight=w)))(
        fsa.weight
    )
    best_score = sj.tot_score(fsa, sj.TROPICAL)
    total = sj.dense_tot_score(fsa, emissions, lengths)
    grad = jax.grad(lambda e: jnp.sum(sj.dense_tot_score(fsa, e, lengths)))(jnp.asarray(emissions))
    labels, best = sj.viterbi_decode(fsa, emissions, lengths)
    result = dict(
        total=float(total[0]),
        grad=np.asarray(grad[0]).tolist(),
        labels=np.asarray(labels[0]).tolist(),
        best=float(best[0]),
        score=float(score),
        score_grad_sum=float(jnp.sum(score_grad)),
        best_score=float(best_score),
        peak=_peak_rss_bytes(),
        dense=[int(size) for size in fsa.schedule.dense.in_arc.shape],
        sizes=[fsa.num_states, fsa.num_arcs],
    )
    want, posteriors = numpy_dense(graph, emissions[0], length)
    result.update(want_total=float(want), want_grad=posteriors.tolist())
    result["want_best"] = float(numpy_dense(graph, emissions[0], length, "tropical")[0])
    no_emissions = np.zeros_like(emissions[0])
    result["want_score"] = float(numpy_dense(graph, no_emissions, length)[0])
    result["want_best_score"] = float(numpy_dense(graph, no_emissions, length, "tropical")[0])
    result["label_score"] = _label_path_score(graph, emissions[0], result["labels"][:length])
    print(json.dumps(result))


def _label_path_score(graph, emissions, labels):
    """The best score of a path of `graph` that reads `labels`, frame by
    frame (so a decoded label sequence can be checked against the best)."""
    num_states, src, dst, label, weight, final = graph
    alpha = np.full(num_states, -np.inf)
    alpha[0] = 0.0
    for t, token in enumerate(labels):
        new = np.full(num_states, -np.inf)
        arcs = label == token
        np.maximum.at(new, dst[arcs], alpha[src[arcs]] + weight[arcs] + emissions[t, token])
        alpha = new
    return float(np.max(alpha[final], initial=-np.inf))


def _in_subprocess(kind, size, length):
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from tests.test_memory import run_case; "
        "run_case(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), kind, str(size), str(length)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("kind", "size", "length"),
    [("star", 1_000_000, 1), ("lexicon", 100_000, 5)],
)
def test_huge_hubs_run_in_bounded_memory_and_match_numpy(kind, size, length):
    result = _in_subprocess(kind, size, length)
    assert result["peak"] < PEAK_LIMIT_BYTES, f"peak RSS {result['peak'] / 2**20:.0f} MiB"
    # Not S times the largest degree: about a row per state, a few slots each.
    rows, slots = result["dense"]
    num_states, num_arcs = result["sizes"]
    assert rows * slots <= 2 * (num_states + num_arcs)
    np.testing.assert_allclose(result["score"], result["want_score"], rtol=1e-5)
    np.testing.assert_allclose(result["score_grad_sum"], length, rtol=1e-5)
    np.testing.assert_allclose(result["best_score"], result["want_best_score"], rtol=1e-5)
    np.testing.assert_allclose(result["total"], result["want_total"], rtol=1e-5)
    grad, want = np.asarray(result["grad"]), np.asarray(result["want_grad"])
    np.testing.assert_allclose(grad, want, atol=2e-5)
    np.testing.assert_allclose(grad[:length].sum(axis=1), 1.0, atol=1e-5)
    assert not grad[length:].any()
    np.testing.assert_allclose(result["best"], result["want_best"], rtol=1e-5)
    labels = result["labels"]
    assert labels[length:] == [-1] * (FRAMES - length)
    np.testing.assert_allclose(result["label_score"], result["want_best"], rtol=1e-5)


@pytest.mark.parametrize("kind", ["star", "lexicon"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_small_hub_graphs_match_numpy(kind, dtype):
    make, vocab = GRAPHS[kind]
    graph = make(3000 if kind == "star" else 700, vocab)
    fsa = build(graph, dtype)
    assert fsa.schedule.dense.in_leaf.size + fsa.schedule.dense.out_leaf.size > 0  # trees
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(3, FRAMES, vocab))
    emissions = (logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)).astype(dtype)
    # The star has paths of one frame only; the lexicon of five.
    lengths = np.array([1, 0, 1]) if kind == "star" else np.array([5, 4, 5])
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=1e-10, atol=1e-12)
    for name in ("log", "tropical"):
        semiring = sj.semiring(name)
        got = sj.dense_tot_score(fsa, emissions, lengths, semiring)
        want = [numpy_dense(graph, emissions[b], lengths[b], name)[0] for b in range(3)]
        np.testing.assert_allclose(got, want, **tol)
    grad = jax.grad(lambda e: jnp.sum(sj.dense_tot_score(fsa, e, lengths)))(jnp.asarray(emissions))
    want = [numpy_dense(graph, emissions[b], lengths[b])[1] for b in range(3)]
    np.testing.assert_allclose(grad, want, **tol)
    labels, best = sj.viterbi_decode(fsa, emissions, lengths)
    for b in range(3):
        decoded = np.asarray(labels[b, : lengths[b]])
        score = _label_path_score(graph, emissions[b], decoded)
        np.testing.assert_allclose(score, best[b], **tol)
        assert np.all(np.asarray(labels[b, lengths[b] :]) == -1)


@pytest.mark.parametrize("kind", ["star", "lexicon"])
def test_tables_stay_within_the_stated_bound(kind):
    make, vocab = GRAPHS[kind]
    num_states, src, dst, *_ = make(50_000, vocab)
    mask = np.ones(src.size, bool)
    tables = dense_tables.build_dense_tables(num_states, src, dst, mask)
    bound = 2 * num_states + 25 * src.size + 300 * (np.log2(src.size) + 3)
    for side in ("in", "out"):
        rows = tables[f"dense_{side}_arc" if side == "in" else "dense_out_slot"]
        assert rows.size + tables[f"dense_{side}_leaf"].size <= bound
        assert tables[f"dense_{side}_top"].shape == (num_states,)
