"""dense_occupancy against brute-force path enumeration and the lattice."""

import math
from collections import defaultdict

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import semiring_jax as sj
from semiring_jax._src.dense.host import lattice_structure as host_lattice

TOL = {"float32": dict(rtol=2e-5, atol=2e-5), "float64": dict(rtol=1e-10, atol=1e-10)}

# Parallel arcs, arcs with different labels into one state, cycles and two
# final states: the (ilabel, dst) pairs of over="states" are not per state.
ARCS = [
    (0, 0, 0, 0.1),
    (0, 1, 1, -0.2),
    (0, 1, 2, 0.3),
    (1, 1, 1, 0.0),
    (1, 2, 0, -0.5),
    (2, 2, 2, 0.2),
    (1, 0, 2, 0.0),
    (2, 1, 1, 0.4),
]
FINAL = {1: 0.0, 2: -0.3}
NUM_STATES, B, T, V = 3, 3, 4, 3


def brute_occupancy(arcs, final, emissions, length, num_states, best_only=False):
    """([T, V], [T, S]) posteriors (or best-path indicators) by enumeration."""
    leaving = defaultdict(list)
    for src, dst, label, weight in arcs:
        leaving[src].append((dst, label, weight))
    paths = []  # (score, labels, states after each frame)
    stack = [(0, 0.0, (), ())]
    while stack:
        state, score, labels, states = stack.pop()
        if len(labels) == length:
            if state in final:
                paths.append((score + final[state], labels, states))
            continue
        for dst, label, weight in leaving[state]:
            t = len(labels)
            stack.append(
                (dst, score + weight + float(emissions[t, label]), (*labels, label), (*states, dst))
            )
    num_frames, num_columns = emissions.shape
    labels_out = np.zeros((num_frames, num_columns))
    states_out = np.zeros((num_frames, num_states))
    scores = np.array([score for score, _, _ in paths])
    if not paths or scores.max() == -math.inf:
        return labels_out, states_out
    if best_only:
        probabilities = (np.arange(len(paths)) == np.argmax(scores)).astype(float)
    else:
        probabilities = np.exp(scores - np.logaddexp.reduce(scores))
    for probability, (_, labels, states) in zip(probabilities, paths):
        for t, (label, state) in enumerate(zip(labels, states)):
            labels_out[t, label] += probability
            states_out[t, state] += probability
    return labels_out, states_out


def random_emissions(seed, dtype, shape=(B, T, V)):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=shape)
    return jnp.asarray(logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True), dtype)


@pytest.mark.parametrize("over", ["labels", "states"])
def test_log_occupancy_matches_brute_force(dtype, over):
    graph = sj.Fsa.from_arcs(ARCS, FINAL, dtype=dtype)
    emissions = random_emissions(0, dtype)
    lengths = np.array([4, 2, 0])  # length 0: state 0 is not final, no path
    occupancy = sj.dense_occupancy(graph, emissions, jnp.asarray(lengths), over=over)
    chex.assert_shape(occupancy, (B, T, V if over == "labels" else NUM_STATES))
    assert occupancy.dtype == dtype
    for b in range(B):
        expected = brute_occupancy(
            ARCS, FINAL, np.asarray(emissions[b], np.float64), lengths[b], NUM_STATES
        )[over == "states"]
        np.testing.assert_allclose(occupancy[b], expected, **TOL[dtype])
    rows = np.asarray(occupancy).sum(axis=-1)
    np.testing.assert_allclose(rows[0], 1.0, **TOL[dtype])
    np.testing.assert_array_equal(rows[1, 2:], 0.0)  # past the length
    np.testing.assert_array_equal(occupancy[2], 0.0)


def test_tropical_occupancy_is_the_best_path():
    graph = sj.Fsa.from_arcs(ARCS, FINAL)
    emissions = random_emissions(1, "float32")
    lengths = jnp.array([4, 3, 0])  # the last has no path: all zeros, no NaN
    by_label = sj.dense_occupancy(graph, emissions, lengths, semiring=sj.TROPICAL)
    by_state = sj.dense_occupancy(graph, emissions, lengths, semiring=sj.TROPICAL, over="states")
    frame_labels, _ = sj.viterbi_decode(graph, emissions, lengths)
    within = np.arange(T) < np.asarray(lengths)[:, None]
    np.testing.assert_array_equal(np.where(within, np.argmax(by_label, axis=-1), -1), frame_labels)
    for occupancy in (by_label, by_state):
        np.testing.assert_array_equal(np.asarray(occupancy).sum(axis=-1), within)
    for b in range(B):
        expected = brute_occupancy(
            ARCS,
            FINAL,
            np.asarray(emissions[b], np.float64),
            int(lengths[b]),
            NUM_STATES,
            best_only=True,
        )
        np.testing.assert_array_equal(by_label[b], expected[0])
        np.testing.assert_array_equal(by_state[b], expected[1])


def test_states_match_lattice_arc_posteriors():
    graph = sj.ctc_graph([1, 2, 2], dtype="float64")
    emissions = random_emissions(2, "float64", (2, 8, 3))
    lengths = np.array([8, 3])  # 1 2 _ 2 needs 4 frames: the second has no path
    occupancy = sj.dense_occupancy(graph, emissions, jnp.asarray(lengths), over="states")
    posteriors = sj.arc_posteriors(sj.intersect_dense(graph, emissions, lengths))
    dst = np.asarray(graph.dst)
    final = np.asarray(graph.final_weight) > -np.inf
    for b, length in enumerate(lengths):
        found = host_lattice.lattice_structure(
            graph.num_states, np.asarray(graph.src), dst, final, int(length)
        )
        expected = np.zeros((8, graph.num_states))
        np.add.at(
            expected, (found.frame, dst[found.arc]), np.asarray(posteriors[b, : found.arc.size])
        )
        np.testing.assert_allclose(occupancy[b], expected, **TOL["float64"])
    chex.assert_tree_all_finite(occupancy)
    np.testing.assert_array_equal(occupancy[1], 0.0)


def test_ctc_label_occupancy_is_minus_the_loss_gradient():
    emissions = random_emissions(3, "float32", (2, 7, 4))
    labels, label_lengths = jnp.array([[1, 3, 3], [2, 0, 0]]), jnp.array([3, 1])
    lengths = jnp.array([7, 5])
    graph = sj.ctc_graph(labels, label_lengths)
    occupancy = sj.dense_occupancy(graph, emissions, lengths)
    grad = jax.grad(lambda e: jnp.sum(sj.ctc_loss(e, lengths, labels, label_lengths)))(emissions)
    np.testing.assert_allclose(occupancy, -grad, **TOL["float32"])


def test_batched_graph_traced_or_not():
    other = [(0, 1, 2, 0.0), (1, 1, 2, 0.5), (1, 2, 0, 0.0)]
    batch = sj.stack([sj.Fsa.from_arcs(ARCS, FINAL), sj.Fsa.from_arcs(other, final=[2])])
    emissions = random_emissions(5, "float32", (2, T, V))
    lengths = jnp.array([4, 3])
    occupancy = sj.dense_occupancy(batch, emissions, lengths, over="states")
    for b, (arcs, final) in enumerate([(ARCS, FINAL), (other, {2: 0.0})]):
        expected = brute_occupancy(
            arcs, final, np.asarray(emissions[b], np.float64), int(lengths[b]), NUM_STATES
        )[1]
        np.testing.assert_allclose(occupancy[b], expected, **TOL["float32"])
    # A traced graph takes one column per arc instead of per (ilabel, dst) pair.
    traced = jax.jit(lambda g, e, n: sj.dense_occupancy(g, e, n, over="states"))(
        batch, emissions, lengths
    )
    np.testing.assert_allclose(traced, occupancy, **TOL["float32"])


def test_bad_arguments():
    graph = sj.Fsa.from_arcs(ARCS, FINAL)
    emissions = random_emissions(6, "float32")
    with pytest.raises(ValueError, match="over must be 'labels' or 'states', got 'arcs'"):
        sj.dense_occupancy(graph, emissions, over="arcs")
    with pytest.raises(TypeError, match="lengths is a Semiring"):
        sj.dense_occupancy(graph, emissions, sj.TROPICAL)
    with pytest.raises(ValueError, match="dense_occupancy: graph arc 2 has label 2"):
        sj.dense_occupancy(graph, emissions[:, :, :2])
