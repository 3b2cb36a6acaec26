"""intersect_dense: the lattice's scores equal dense_tot_score, and it is connected."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from tests import oracles
from tests.strategies import as_rows, dense_graphs

B, T, V = 2, 4, 3


def build(data, dtype=np.float64):
    num_states, arcs, final = data
    return sj.Fsa.from_arcs(as_rows(arcs), final, num_states=num_states, dtype=dtype)


@settings(max_examples=12, deadline=None)
@given(
    data=dense_graphs(weights=st.floats(-3, 3, width=32)),
    values=st.lists(st.floats(-3, 3, width=32), min_size=B * T * V, max_size=B * T * V),
    lengths=st.lists(st.integers(0, T), min_size=B, max_size=B),
)
def test_lattice_scores_equal_dense_scores(data, values, lengths):
    graph = build(data)
    emissions = jnp.asarray(np.asarray(values, np.float64).reshape(B, T, V))
    lengths = np.asarray(lengths)
    lattice = sj.intersect_dense(graph, emissions, lengths)
    for semiring in (sj.LOG, sj.TROPICAL):
        np.testing.assert_allclose(
            sj.tot_score(lattice, semiring),
            sj.dense_tot_score(graph, emissions, lengths, semiring),
            rtol=1e-10,
        )
    _, arcs, final = data
    for b, entry in enumerate(sj.unstack(lattice)):
        want = oracles.brute_dense_tot_score(
            arcs, final, np.asarray(emissions[b]), lengths[b], "log"
        )
        np.testing.assert_allclose(sj.tot_score(entry), want, rtol=1e-10)
        _check_connected(entry, found=want > -np.inf)


def _check_connected(lattice, found):
    """Every state lies on a successful path (weights here are finite)."""
    if not found:
        assert lattice.num_states == 1 and lattice.num_arcs == 0
        return
    forward = np.asarray(sj.forward_scores(lattice))
    backward = np.asarray(sj.backward_scores(lattice))
    assert np.all(np.isfinite(forward)) and np.all(np.isfinite(backward))


def test_gradients_flow_to_emissions_and_graph_weights():
    rng = np.random.default_rng(0)
    graph = build(
        (
            3,
            [
                (0, 0, 0, 0, 0.1),
                (0, 1, 1, 1, -0.2),
                (1, 1, 1, 1, 0.3),
                (1, 2, 2, 2, 0.0),
                (2, 0, 0, 0, 0.5),
                (2, 2, 2, 2, 0.1),
            ],
            {1: 0.0, 2: -0.5},
        )
    )
    emissions = jnp.asarray(rng.normal(size=(3, 6, 3)))
    lengths = np.array([6, 4, 0])

    def through_lattice(e, w, f):
        lattice = sj.intersect_dense(graph.replace(weight=w, final_weight=f), e, lengths)
        return sj.tot_score(lattice).sum()

    def dense(e, w, f):
        return sj.dense_tot_score(graph.replace(weight=w, final_weight=f), e, lengths).sum()

    args = (emissions, graph.weight, graph.final_weight)
    for got, want in zip(
        jax.grad(through_lattice, argnums=(0, 1, 2))(*args),
        jax.grad(dense, argnums=(0, 1, 2))(*args),
    ):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_batched_graph_and_jit_over_weights():
    graphs = [
        build((2, [(0, 0, 0, 0, 0.0), (0, 1, 1, 1, 0.5), (1, 1, 2, 2, 0.0)], {1: 0.0})),
        build((2, [(0, 1, 2, 2, 0.1), (1, 0, 1, 1, 0.0), (1, 1, 0, 0, 0.2)], {1: 0.0})),
    ]
    batch = sj.stack(graphs)
    emissions = jnp.asarray(np.random.default_rng(1).normal(size=(2, 5, 3)))
    lengths = np.array([5, 3])
    lattice = sj.intersect_dense(batch, emissions, lengths)
    np.testing.assert_allclose(
        sj.tot_score(lattice), sj.dense_tot_score(batch, emissions, lengths), rtol=1e-10
    )
    # Emissions may be traced (the structure comes from graph and lengths).
    jitted = jax.jit(lambda e: sj.tot_score(sj.intersect_dense(batch, e, lengths)))
    np.testing.assert_allclose(jitted(emissions), sj.tot_score(lattice), rtol=1e-10)


def test_traced_lengths_are_refused():
    graph = build((1, [(0, 0, 0, 0, 0.0)], {0: 0.0}))
    emissions = jnp.zeros((1, 2, 1))
    with pytest.raises(ValueError, match="lengths is a traced value"):
        jax.jit(lambda n: sj.intersect_dense(graph, emissions, n))(np.array([2]))
