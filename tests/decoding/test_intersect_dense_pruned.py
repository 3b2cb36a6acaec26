"""intersect_dense_pruned against intersect_dense, dense_tot_score and
viterbi_decode: equal with infinite beams, the best path at real beams,
valid lattices of real paths at tiny max_active, and its errors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from tests.paths import both_paths
from tests.strategies import as_rows, dense_graphs

B, T, V = 2, 4, 3


def build(data, dtype):
    num_states, arcs, final = data
    return sj.Fsa.from_arcs(as_rows(arcs), final, num_states=num_states, dtype=dtype)


def _frames_of_states(lattice, b):
    """frame of each state of lattice entry b that an arc touches."""
    mask = np.asarray(lattice.arc_mask[b])
    src, dst = np.asarray(lattice.src[b])[mask], np.asarray(lattice.dst[b])[mask]
    frames = {}
    # States are numbered in frame order and arcs go one frame on: the
    # frame of a state is the length of any path into it.
    frame = np.zeros(lattice.num_states, int)
    for s, d in sorted(zip(src, dst, strict=True)):
        frame[d] = frame[s] + 1
    for state in set(src) | set(dst):
        frames.setdefault(frame[state], set()).add(state)
    return frames


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(
    data=dense_graphs(weights=st.floats(-3, 3, width=32)),
    values=st.lists(st.floats(-3, 3, width=32), min_size=B * T * V, max_size=B * T * V),
    lengths=st.lists(st.integers(0, T), min_size=B, max_size=B),
    dtype=st.sampled_from(["float32", "float64"]),
)
def test_infinite_beams_give_intersect_dense(data, values, lengths, dtype):
    graph = build(data, dtype)
    emissions = jnp.asarray(np.asarray(values, dtype).reshape(B, T, V))
    lengths = np.asarray(lengths)
    pruned = sj.intersect_dense_pruned(
        graph,
        emissions,
        lengths,
        search_beam=math.inf,
        output_beam=math.inf,
        max_active=graph.num_states,
    )
    full = sj.intersect_dense(graph, emissions, lengths)
    for b in range(B):
        assert int(pruned.arc_mask[b].sum()) == int(full.arc_mask[b].sum())
    for semiring in (sj.LOG, sj.TROPICAL):
        np.testing.assert_allclose(
            sj.tot_score(pruned, semiring), sj.tot_score(full, semiring), rtol=1e-5
        )

    def finite_sum(totals):
        return jnp.sum(jnp.where(jnp.isfinite(totals), totals, 0.0))

    def ours(e):
        return finite_sum(
            sj.tot_score(
                sj.intersect_dense_pruned(
                    graph, e, lengths, search_beam=math.inf, output_beam=math.inf
                )
            )
        )

    exact = jax.grad(lambda e: finite_sum(sj.dense_tot_score(graph, e, lengths)))(emissions)
    np.testing.assert_allclose(jax.grad(ours)(emissions), exact, atol=1e-5)


def test_infinite_beams_give_intersect_dense_on_a_cyclic_graph():
    rng = np.random.default_rng(2)
    graph = _chain_graph(rng, 9, 40, V)
    emissions = jnp.asarray(rng.normal(size=(B, T, V)).astype(np.float32))
    lengths = np.array([T, 2])
    pruned = sj.intersect_dense_pruned(
        graph, emissions, lengths, search_beam=math.inf, output_beam=math.inf
    )
    full = sj.intersect_dense(graph, emissions, lengths)
    np.testing.assert_array_equal(pruned.arc_mask.sum(-1), full.arc_mask.sum(-1))
    for semiring in (sj.LOG, sj.TROPICAL):
        np.testing.assert_allclose(
            sj.tot_score(pruned, semiring), sj.tot_score(full, semiring), rtol=1e-5
        )


def _chain_graph(rng, states, arcs, vocab):
    """A random cyclic graph whose weights favour one path strongly."""
    src = rng.integers(0, states, arcs)
    dst = rng.integers(0, states, arcs)
    label = rng.integers(0, vocab, arcs)
    weight = rng.normal(size=arcs) * 3.0
    rows = np.stack([src, dst, label, weight], 1)
    return sj.Fsa.from_arcs(rows, list(range(0, states, 7)), num_states=states)


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_realistic_beams_keep_the_best_path(seed):
    rng = np.random.default_rng(seed)
    graph = _chain_graph(rng, 60, 400, 20)
    logits = rng.normal(size=(3, 30, 20)).astype(np.float32) * 2.0
    emissions = jnp.asarray(logits - np.logaddexp.reduce(logits, -1, keepdims=True))
    lengths = np.array([30, 25, 12])
    lattice = sj.intersect_dense_pruned(
        graph,
        emissions,
        lengths,
        search_beam=20.0,
        output_beam=8.0,
        max_active=40,
        min_active=5,
    )
    _, best = sj.viterbi_decode(graph, emissions, lengths)
    np.testing.assert_allclose(sj.tot_score(lattice, sj.TROPICAL), best, rtol=1e-5)
    # A lattice within the output beam: no path of it is more than 8 below.
    full = sj.intersect_dense(graph, emissions, lengths)
    assert np.all(np.asarray(sj.tot_score(lattice)) <= np.asarray(sj.tot_score(full)) + 1e-4)


@pytest.mark.parametrize("max_active", [1, 2, 3])
def test_tiny_max_active_still_gives_real_paths(max_active):
    rng = np.random.default_rng(11)
    graph = _chain_graph(rng, 30, 200, 6)
    emissions = jnp.asarray(np.log(rng.dirichlet(np.ones(6), size=(2, 15))).astype(np.float32))
    lengths = np.array([15, 9])
    lattice = sj.intersect_dense_pruned(
        graph, emissions, lengths, search_beam=math.inf, max_active=max_active, min_active=0
    )
    _, exact = sj.viterbi_decode(graph, emissions, lengths)
    best = sj.tot_score(lattice, sj.TROPICAL)
    for b in range(2):
        if best[b] == -np.inf:
            assert int(lattice.arc_mask[b].sum()) == 0
            assert not bool(lattice.final_mask[b].any())
            continue
        assert best[b] <= exact[b] + 1e-9
        for states in _frames_of_states(lattice, b).values():
            assert len(states) <= max_active
        # Its best path spells labels whose dense score through the graph is
        # at least the lattice's: a real path of the graph.
        path = sj.best_path(jax.tree_util.tree_map(lambda x, b=b: x[b], lattice))
        labels = np.asarray(path.label)[np.asarray(path.arc_mask)]
        assert labels.size == lengths[b]
        only = jnp.full((1, lengths[b], 6), -jnp.inf, jnp.float32)
        only = only.at[0, jnp.arange(lengths[b]), labels].set(0.0)
        assert np.isfinite(float(sj.dense_tot_score(graph, only)[0]))


def test_batched_graph_equals_shared():
    rng = np.random.default_rng(5)
    graph = _chain_graph(rng, 20, 80, 4)
    emissions = jnp.asarray(np.log(rng.dirichlet(np.ones(4), size=(2, 10))).astype(np.float32))
    shared = sj.intersect_dense_pruned(graph, emissions, max_active=6)
    batched = sj.intersect_dense_pruned(sj.stack([graph, graph]), emissions, max_active=6)
    np.testing.assert_allclose(sj.tot_score(shared), sj.tot_score(batched), rtol=1e-6)


def test_nan_emission_is_refused_as_by_intersect_dense():
    graph = sj.Fsa.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 1, 0.0)], final=[1])
    emissions = jnp.log(jnp.full((1, 3, 2), 0.5, jnp.float32)).at[0, 1, 1].set(jnp.nan)
    for op in (sj.intersect_dense, sj.intersect_dense_pruned):
        with pytest.raises(ValueError, match="has weight nan"):
            op(graph, emissions)
    # Traced (under grad), the NaN reaches the lattice's total.
    total = jax.grad(lambda e: jnp.sum(sj.tot_score(sj.intersect_dense_pruned(graph, e))))
    assert bool(jnp.isnan(total(emissions)).any())


def test_nan_on_an_arc_of_no_path_leaves_the_lattice_whole():
    # Arc 1 reads the NaN and leads to state 2, which is not final: it is on
    # no path, so the beam must cut nothing of the path 0 -> 1 for it.
    graph = sj.Fsa.from_arcs([(0, 1, 0, 0.0), (0, 2, 1, 0.0)], final=[1])
    emissions = jnp.array([[[-1.0, jnp.nan]]], jnp.float32)
    lattice = sj.intersect_dense_pruned(graph, emissions, output_beam=1.0)
    np.testing.assert_allclose(sj.tot_score(lattice), [-1.0])


@pytest.mark.parametrize("output_beam", [math.inf, 1.0])
def test_traced_nan_final_weight_reaches_the_lattice(output_beam):
    # State 2 is final with a NaN weight, traced (under grad): the lattice
    # keeps it final, as intersect_dense does, so the total and the
    # gradient are NaN (it was taken for a non-final state and dropped).
    graph = sj.Fsa.from_arcs(
        [(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 1, 0.0), (0, 2, 1, -1.0)], final={1: 0.0, 2: 0.0}
    )
    emissions = jnp.log(jnp.full((1, 3, 2), 0.5, jnp.float32))
    final_weight = jnp.asarray(graph.final_weight).at[2].set(jnp.nan)

    def total_and_grad(final_weight, op, **beams):
        def total(final_weight):
            lattice = op(graph.replace(final_weight=final_weight), emissions, **beams)
            return jnp.sum(sj.tot_score(lattice))

        return jax.value_and_grad(total)(final_weight)

    _, exact_grad = total_and_grad(final_weight, sj.intersect_dense)
    assert np.isnan(exact_grad).tolist() == [False, True, True]
    beams = dict(search_beam=math.inf, output_beam=output_beam)
    for value, grad in both_paths(
        lambda f: total_and_grad(f, sj.intersect_dense_pruned, **beams), final_weight
    ):
        assert np.isnan(value)
        np.testing.assert_array_equal(np.isnan(grad), np.isnan(exact_grad))


def test_an_empty_batch_gives_an_empty_lattice():
    graph = sj.Fsa.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.5), (1, 1, 1, 0.0)], final=[1])
    emissions = jnp.zeros((0, 3, 2), jnp.float32)

    def lattice_and_totals(emissions):
        lattice = sj.intersect_dense_pruned(graph, emissions, lengths=np.zeros(0, int))
        grad = jax.grad(lambda e: jnp.sum(sj.tot_score(sj.intersect_dense_pruned(graph, e))))
        return lattice, sj.tot_score(lattice), grad(emissions)

    for lattice, totals, grad in both_paths(lattice_and_totals, emissions):
        assert lattice.batch_shape == (0,)
        assert lattice.weight.shape == (0, lattice.num_arcs)
        assert lattice.weight.dtype == np.float32
        assert totals.shape == (0,) and grad.shape == (0, 3, 2)
    # intersect_dense, which builds through the same stack, gives the same.
    assert sj.intersect_dense(graph, emissions).batch_shape == (0,)


def test_zero_length_is_the_start_state():
    graph = sj.Fsa.from_arcs([(0, 1, 1, 0.0)], {0: 0.5, 1: 0.0})
    lattice = sj.intersect_dense_pruned(graph, jnp.zeros((1, 2, 2), jnp.float32), [0])
    np.testing.assert_allclose(sj.tot_score(lattice), [0.5])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(search_beam=-1.0), "search_beam must be >= 0"),
        (dict(output_beam=math.nan), "output_beam must be >= 0"),
        (dict(max_active=0), "max_active"),
        (dict(min_active=-1), "min_active"),
        (dict(lengths=[3]), r"lengths\[0\] = 3 is outside"),
    ],
)
def test_bad_arguments_are_located(kwargs, match):
    graph = sj.Fsa.from_arcs([(0, 1, 1, 0.0)], final=[1])
    with pytest.raises(ValueError, match=match):
        sj.intersect_dense_pruned(graph, jnp.zeros((1, 2, 2), jnp.float32), **kwargs)


def test_under_jit_is_refused():
    graph = sj.Fsa.from_arcs([(0, 1, 1, 0.0)], final=[1])
    with pytest.raises(ValueError, match=r"outside jax\.jit"):
        jax.jit(lambda e: sj.tot_score(sj.intersect_dense_pruned(graph, e)))(
            jnp.zeros((1, 1, 2), jnp.float32)
        )
