"""dense_tot_score and viterbi_decode against brute-force path enumeration."""

import dataclasses
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

import semiring_jax as sj
from semiring_jax._src.core.host import dense_tables
from semiring_jax._src.core.host import schedule_tables as host_schedule
from semiring_jax._src.core.schedule import Schedule
from semiring_jax._src.core.tables import Tables
from tests import oracles
from tests.strategies import as_rows, dense_graphs, pad_entry

SETTINGS = settings(max_examples=25, deadline=None)
TOL = {"float32": dict(rtol=3e-5, atol=3e-5), "float64": dict(rtol=1e-10, atol=1e-10)}
SEMIRINGS = {"log": sj.LOG, "tropical": sj.TROPICAL}
REAL = sj.Semiring(name="real", plus=jnp.add, times=jnp.multiply, sum=jnp.sum, zero=0.0, one=1.0)
B, T, V = 2, 4, 3


def build(data, dtype):
    num_states, arcs, final = data
    return sj.Fsa.from_arcs(as_rows(arcs), final, num_states=num_states, dtype=dtype)


# Two slots a row, whatever the graph: states with 3 to 8 arcs take 2 to 4
# rows, which trees of fan-in 2 combine (at most 3 further rows, 8 leaves
# in blocks of 2 or 4, 2 levels, for 8 arcs).
FIXED_DENSE = dense_tables.DenseShape(2, 2, 4, 8, 2, 8, 2, 2, 4, 8, 2, 8)


def fixed_shape(fsa):
    """One shape for every draw (4 states, 8 arcs, `FIXED_DENSE`, no level
    tables), so that a single compile serves them all; padding must not
    change any result."""
    entry = pad_entry(fsa, 4, 8, None)
    structure = (np.asarray(field) for field in (entry.src, entry.dst, entry.arc_mask))
    tables = dict(
        host_schedule.empty_schedule_arrays(4, 8),
        **dense_tables.build_dense_tables(4, *structure, shape=FIXED_DENSE),
    )
    return dataclasses.replace(
        entry,
        tables=Tables(
            Schedule.from_arrays(tables, entry.schedule.real_sizes),
            (),
            entry.shapes._replace(schedule=None, dense=FIXED_DENSE),
        ),
    )


EMISSIONS = st.lists(
    st.one_of(st.floats(-3, 3, width=32), st.just(-math.inf)),
    min_size=B * T * V,
    max_size=B * T * V,
)


@SETTINGS
@given(
    data=dense_graphs(),
    values=EMISSIONS,
    lengths=st.lists(st.integers(0, T), min_size=B, max_size=B),
    name=st.sampled_from(["log", "tropical"]),
    dtype=st.sampled_from(["float32", "float64"]),
    jit=st.booleans(),
)
def test_dense_tot_score_matches_brute_force(data, values, lengths, name, dtype, jit):
    emissions = np.asarray(values, dtype).reshape(B, T, V)
    graph = fixed_shape(build(data, dtype))
    score = lambda g, e, n: sj.dense_tot_score(g, e, n, SEMIRINGS[name])
    got = (jax.jit(score) if jit else score)(graph, emissions, np.asarray(lengths))
    _, arcs, final = data
    want = [
        oracles.brute_dense_tot_score(
            arcs, final, emissions[b].astype(np.float64), lengths[b], name
        )
        for b in range(B)
    ]
    np.testing.assert_allclose(np.asarray(got), want, **TOL[dtype])
    assert got.dtype == dtype


@SETTINGS
@given(
    data=dense_graphs(),
    values=EMISSIONS,
    lengths=st.lists(st.integers(0, T), min_size=B, max_size=B),
    name=st.sampled_from(["log", "tropical"]),
)
def test_gradients_are_finite_and_zero_past_lengths(data, values, lengths, name):
    emissions = np.asarray(values, np.float64).reshape(B, T, V)
    graph = fixed_shape(build(data, np.float64))
    lengths = np.asarray(lengths)
    total = lambda e, w, f: sj.dense_tot_score(
        graph.replace(weight=w, final_weight=f), e, lengths, SEMIRINGS[name]
    ).sum()
    grads = jax.grad(total, argnums=(0, 1, 2))(emissions, graph.weight, graph.final_weight)
    chex.assert_tree_all_finite(grads)
    emission_grad = np.asarray(grads[0])
    scores = sj.dense_tot_score(graph, emissions, lengths, SEMIRINGS[name])
    for b in range(B):
        assert not emission_grad[b, lengths[b] :].any()
        # One column per frame: posteriors (or the best path) sum to one.
        want = 1.0 if scores[b] > -np.inf else 0.0
        np.testing.assert_allclose(emission_grad[b, : lengths[b]].sum(axis=1), want, atol=1e-9)


def _reference_total(graph_data, emissions, length):
    """Plain jnp LOG recursion (no normalisation, no custom rule), for autodiff.
    -1e30 stands for -inf so that autodiff of logsumexp stays NaN-free."""
    num_states, arcs, final = graph_data
    src = np.array([a[0] for a in arcs], int)
    dst = np.array([a[1] for a in arcs], int)
    label = np.array([a[2] for a in arcs], int)
    weight = jnp.array([a[4] for a in arcs])
    into = dst[None, :] == np.arange(num_states)[:, None]  # [S, A]
    alpha = jnp.full(num_states, -1e30).at[0].set(0.0)
    for t in range(length):
        scores = alpha[src] + weight + emissions[t, label]
        alpha = jax.nn.logsumexp(jnp.where(into, scores[None], -1e30), axis=1)
    ends = jnp.array([alpha[s] + w for s, w in final.items()])
    return jax.nn.logsumexp(ends)


def test_log_gradient_matches_autodiff_of_a_plain_recursion():
    rng = np.random.default_rng(0)
    data = (
        3,
        [
            (0, 0, 0, 0, 0.1),
            (0, 1, 1, 1, -0.3),
            (1, 1, 2, 2, 0.2),
            (1, 2, 0, 0, 0.5),
            (2, 0, 1, 1, -0.1),
            (2, 2, 2, 2, 0.4),
            (0, 1, 2, 2, 0.0),
        ],
        {1: 0.0, 2: -0.5},
    )
    graph = build(data, np.float64)
    emissions = jnp.asarray(rng.normal(size=(1, 6, 3)))
    got = jax.grad(lambda e: sj.dense_tot_score(graph, e)[0])(emissions)
    want = jax.grad(lambda e: _reference_total(data, e[0], 6))(emissions)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    for semiring in (sj.LOG, sj.TROPICAL):
        check_grads(
            lambda e, w, f: sj.dense_tot_score(
                graph.replace(weight=w, final_weight=f), e, None, semiring
            ),
            (emissions, graph.weight, graph.final_weight),
            order=1,
            modes=("rev",),
        )


def test_batched_graph_equals_one_by_one(dtype):
    rng = np.random.default_rng(1)
    graphs = [
        build((2, [(0, 0, 0, 0, 0.0), (0, 1, 1, 1, 0.5), (1, 1, 2, 2, 0.0)], {1: 0.0}), dtype),
        build(
            (
                3,
                [(0, 1, 2, 2, 0.1), (1, 2, 1, 1, 0.0), (2, 0, 0, 0, -1.0), (1, 1, 0, 0, 0.3)],
                {2: 0.0, 0: 0.2},
            ),
            dtype,
        ),
    ]
    emissions = jnp.asarray(rng.normal(size=(2, 5, 3)), dtype)
    lengths = np.array([5, 3])
    batch = sj.stack(graphs)
    for semiring in (sj.LOG, sj.TROPICAL):
        loss = lambda e, w: sj.dense_tot_score(batch.replace(weight=w), e, lengths, semiring).sum()
        _value, (grad_e, grad_w) = jax.value_and_grad(loss, argnums=(0, 1))(emissions, batch.weight)
        for b, graph in enumerate(graphs):
            one = lambda e, w: sj.dense_tot_score(
                graph.replace(weight=w), e[None], lengths[b : b + 1], semiring
            )[0]
            _v, (ge, gw) = jax.value_and_grad(one, argnums=(0, 1))(emissions[b], graph.weight)
            np.testing.assert_allclose(grad_e[b], ge, **TOL[dtype])
            np.testing.assert_allclose(grad_w[b, : graph.num_arcs], gw, **TOL[dtype])


def test_shared_graph_weight_gradient_sums_over_the_batch():
    graph = build(
        (2, [(0, 0, 0, 0, 0.0), (0, 1, 1, 1, 0.5), (1, 1, 2, 2, 0.0)], {1: 0.0}), np.float64
    )
    emissions = jnp.asarray(np.random.default_rng(2).normal(size=(3, 4, 3)))
    grad = jax.grad(lambda w: sj.dense_tot_score(graph.replace(weight=w), emissions).sum())(
        graph.weight
    )
    want = sum(
        jax.grad(lambda w: sj.dense_tot_score(graph.replace(weight=w), emissions[b : b + 1])[0])(
            graph.weight
        )
        for b in range(3)
    )
    np.testing.assert_allclose(grad, want, rtol=1e-10)


def test_no_path_gives_minus_inf_and_zero_gradients():
    graph = sj.Fsa.from_arcs([(0, 1, 1, 0.0)], final=[1], dtype=np.float64)
    emissions = jnp.zeros((2, 3, 2))
    for semiring in (sj.LOG, sj.TROPICAL):
        scores = sj.dense_tot_score(graph, emissions, np.array([3, 0]), semiring)
        assert np.all(scores == -np.inf)  # 3 frames: too long; 0 frames: 0 not final
        grads = jax.grad(
            lambda e, w: sj.dense_tot_score(
                graph.replace(weight=w), e, np.array([3, 0]), semiring
            ).sum(),
            argnums=(0, 1),
        )(emissions, graph.weight)
        assert not any(np.asarray(g).any() for g in grads)


def test_plus_inf_emissions_give_plus_inf_on_every_path():
    """A frame of +inf on every column makes the total +inf (every path
    reads one), not NaN: the scan's padding slots (-inf weights, here the
    states with fewer arcs in) annihilate the +inf instead of adding to it."""
    from semiring_jax._src.dense import dense

    arcs = [(0, 1, 0, 0.5), (0, 2, 1, -1.0), (1, 2, 0, 0.25), (2, 2, 1, 0.0), (1, 1, 1, -2.0)]
    arcs += [(2, 0, 0, 0.1), (1, 0, 1, 0.3)]
    graph = sj.Fsa.from_arcs(arcs, final=[2], dtype=np.float64)
    emissions = np.random.default_rng(3).normal(size=(3, 5, 2))
    emissions[:, 2, :] = np.inf
    emissions = jnp.asarray(emissions)
    lengths = jnp.array([5, 3, 2], jnp.int32)
    want = [np.inf, np.inf, sj.dense_tot_score(graph, emissions[2:], lengths[2:])[0]]
    assert np.isfinite(want[2])
    np.testing.assert_allclose(sj.dense_tot_score(graph, emissions, lengths), want, rtol=1e-12)
    np.testing.assert_allclose(
        dense.total_by("arc_scan", sj.LOG, graph, emissions, lengths), want, rtol=1e-12
    )


def test_zero_length_scores_the_start_states_final_weight():
    graph = sj.Fsa.from_arcs([(0, 0, 0, 0.0)], final={0: -0.25})
    scores = sj.dense_tot_score(graph, jnp.zeros((1, 3, 1), jnp.float32), np.array([0]))
    np.testing.assert_allclose(scores, [-0.25])


def test_user_semiring_matches_brute_force():
    data = (2, [(0, 0, 0, 0, 0.5), (0, 1, 1, 1, 0.25), (1, 1, 0, 0, 2.0)], {1: 1.0})
    emissions = np.random.default_rng(3).random((1, 3, 2))
    # Real weights: "not final" is 0, not -inf.
    graph = build(data, np.float64).replace(final_weight=np.array([0.0, 1.0]))
    got = sj.dense_tot_score(graph, emissions, None, REAL)
    np.testing.assert_allclose(got, [_real_paths(data, emissions[0])], rtol=1e-12)


def _real_paths(data, emissions):
    """Σ over paths of the product of weights, emissions and final weight."""
    _, arcs, final = data
    total = 0.0
    stack = [(0, 1.0, 0)]
    while stack:
        state, product, t = stack.pop()
        if t == emissions.shape[0]:
            total += product * final.get(state, 0.0)
            continue
        for src, dst, label, _, weight in arcs:
            if src == state:
                stack.append((dst, product * weight * emissions[t, label], t + 1))
    return total


def test_vmap_and_jit_of_dense_ops():
    graph = build(
        (2, [(0, 0, 0, 0, 0.0), (0, 1, 1, 1, 0.5), (1, 1, 1, 1, 0.0)], {1: 0.0}), np.float64
    )
    emissions = jnp.asarray(np.random.default_rng(4).normal(size=(3, 2, 4, 2)))
    mapped = jax.vmap(lambda e: sj.dense_tot_score(graph, e))(emissions)
    jitted = jax.jit(lambda e: sj.dense_tot_score(graph, e))
    for i in range(3):
        np.testing.assert_allclose(mapped[i], jitted(emissions[i]), rtol=1e-12)
    labels, scores = jax.vmap(lambda e: sj.viterbi_decode(graph, e))(emissions)
    chex.assert_shape(labels, (3, 2, 4))
    np.testing.assert_allclose(
        scores, jax.vmap(lambda e: sj.dense_tot_score(graph, e, None, sj.TROPICAL))(emissions)
    )


@SETTINGS
@given(
    data=dense_graphs(weights=st.floats(-3, 3, width=32)),
    values=st.lists(st.floats(-3, 3, width=32), min_size=B * T * V, max_size=B * T * V),
    lengths=st.lists(st.integers(0, T), min_size=B, max_size=B),
)
def test_viterbi_decode_matches_brute_force(data, values, lengths):
    emissions = np.asarray(values, np.float64).reshape(B, T, V)
    graph = fixed_shape(build(data, np.float64))
    labels, scores = sj.viterbi_decode(graph, emissions, np.asarray(lengths))
    np.testing.assert_allclose(
        scores, sj.dense_tot_score(graph, emissions, np.asarray(lengths), sj.TROPICAL)
    )
    _, arcs, final = data
    for b in range(B):
        _best_labels, best = oracles.brute_dense_best(arcs, final, emissions[b], lengths[b])
        np.testing.assert_allclose(scores[b], best, rtol=1e-12)
        assert np.all(np.asarray(labels[b, lengths[b] :]) == -1)
        if best > -np.inf:
            # The labels are those of a best path (ties may pick another one).
            decoded = tuple(np.asarray(labels[b, : lengths[b]]).tolist())
            path_score = max(
                (
                    s + final[e]
                    for e, s, path_labels in oracles._dense_paths(arcs, emissions[b], lengths[b])
                    if e in final and path_labels == decoded
                ),
                default=-np.inf,
            )
            np.testing.assert_allclose(path_score, best, rtol=1e-12)
        else:
            assert np.all(np.asarray(labels[b]) == -1)


def test_bad_input_is_named():
    graph = sj.Fsa.from_arcs([(0, 1, 2, 0.0)], final=[1])
    emissions = jnp.zeros((2, 3, 3), jnp.float32)
    with pytest.raises(ValueError, match="rank 3"):
        sj.dense_tot_score(graph, emissions[0])
    with pytest.raises(ValueError, match=r"lengths\[1\] = 4"):
        sj.dense_tot_score(graph, emissions, np.array([1, 4]))
    with pytest.raises(ValueError, match=r"lengths\[0\] = -1"):
        sj.viterbi_decode(graph, emissions, np.array([-1, 1]))
    with pytest.raises(ValueError, match=r"batch_shape \(3,\).*B = 2"):
        sj.dense_tot_score(sj.stack([graph] * 3), emissions)
    with pytest.raises(ValueError, match="graph arc 0 has label 2"):
        sj.dense_tot_score(graph, emissions[:, :, :2])
    with pytest.raises(ValueError, match="float32 but emissions are float64"):
        sj.dense_tot_score(graph, emissions.astype(jnp.float64))


def test_python_lists_and_tuples_are_accepted():
    # Lists crashed in numpy ("Field elements must be 2- or 3-tuples"). They
    # get JAX's default float dtype, as from jnp.asarray (float64 under x64).
    default = jnp.asarray(0.0).dtype
    arcs = [(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 1, 0.0)]
    graph = sj.Fsa.from_arcs(arcs, final=[1], dtype=default)
    emissions = np.log(np.array([[[0.5, 0.5], [0.25, 0.75]]] * 2))
    want = sj.dense_tot_score(graph, emissions.astype(default), np.array([2, 1]))
    got = sj.dense_tot_score(graph, emissions.tolist(), [2, 1])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    got = sj.dense_tot_score(graph, tuple(emissions.tolist()), (2, 1))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    labels, _ = sj.viterbi_decode(graph, emissions.tolist(), [2, 1])
    np.testing.assert_array_equal(labels, [[0, 1], [1, -1]])
    with pytest.raises(
        ValueError, match=r"dense_tot_score: emissions must be an array, or a rectangular list"
    ):
        sj.dense_tot_score(graph, [[[0.0, 0.0], [0.0]]])
    with pytest.raises(ValueError, match=r"dense_tot_score: lengths must hold integers"):
        sj.dense_tot_score(graph, emissions.astype(default), [1.0, 2.0])


def test_int64_lengths_are_refused_or_clamped_never_wrapped():
    graph = sj.Fsa.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 1, 0.0)], final=[1])
    emissions = jnp.log(jnp.array([[[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]], jnp.float32))
    with pytest.raises(
        ValueError, match=r"dense_tot_score: lengths\[0\] = 4294967297 is outside \[0, T\]"
    ):
        sj.dense_tot_score(graph, emissions, np.array([2**32 + 1]))
    # Traced (x64): clamped to [0, T] before the cast; 2**32 + 1 wrapped to 1.
    traced = jax.jit(lambda n: sj.dense_tot_score(graph, emissions, n))
    at_t = sj.dense_tot_score(graph, emissions, np.array([3]))
    np.testing.assert_allclose(traced(jnp.array([2**32 + 1], jnp.int64)), at_t)
    assert not np.allclose(at_t, sj.dense_tot_score(graph, emissions, np.array([1])))
    np.testing.assert_array_equal(traced(jnp.array([-5], jnp.int64)), [-np.inf])


def test_wide_graph_matches_brute_force_and_autodiff():
    # In-degree 12 > COLUMNS_UP_TO: the [S, K] array form of the scan.
    rng = np.random.default_rng(6)
    arcs = [
        (int(rng.integers(3)), int(rng.integers(3)), int(rng.integers(3)), 0, float(rng.normal()))
        for _ in range(30)
    ]
    arcs += [(s, 1, 2, 0, 0.5) for s in (0, 1, 2) for _ in range(4)]
    arcs = [(s, d, label, label, w) for s, d, label, _, w in arcs]
    data = (3, arcs, {1: 0.0, 2: -1.0})
    graph = build(data, np.float64)
    assert graph.schedule.dense.in_arc.shape[1] > 8
    emissions = jnp.asarray(rng.normal(size=(2, 4, 3)))
    lengths = np.array([4, 2])
    for name in ("log", "tropical"):
        got = sj.dense_tot_score(graph, emissions, lengths, SEMIRINGS[name])
        want = [
            oracles.brute_dense_tot_score(arcs, data[2], np.asarray(emissions[b]), lengths[b], name)
            for b in range(2)
        ]
        np.testing.assert_allclose(got, want, rtol=1e-10)
    got = jax.grad(lambda e: sj.dense_tot_score(graph, e, lengths)[0])(emissions)
    want = jax.grad(lambda e: _reference_total(data, e[0], 4))(emissions)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    check_grads(
        lambda e, w: sj.dense_tot_score(graph.replace(weight=w), e, lengths),
        (emissions, graph.weight),
        order=1,
        modes=("rev",),
    )


# -- huge magnitudes, NaN and forward mode ----------------------------------------


@pytest.mark.parametrize("name", ["log", "tropical"])
@pytest.mark.parametrize(("value", "frames"), [(-1074358974.0, 3), (-7.5e8, 5), (-1e30, 2)])
def test_huge_log_probs_give_finite_right_totals(name, value, frames):
    # One path: the total is frames * value (representable), in LOG too.
    graph = sj.linear_fsa([1] * frames)
    emissions = jnp.full((1, frames, 2), value, jnp.float32)
    total = sj.dense_tot_score(graph, emissions, semiring=sj.semiring(name))
    np.testing.assert_allclose(total, [frames * value], rtol=1e-6)
    grad = jax.grad(lambda e: jnp.sum(sj.dense_tot_score(graph, e, semiring=sj.semiring(name))))(
        emissions
    )
    np.testing.assert_array_equal(grad[0, :, 1], 1.0)


@pytest.mark.parametrize("name", ["log", "tropical"])
def test_nan_in_the_emissions_or_the_graph_gives_nan(name):
    semiring = sj.semiring(name)
    graph = sj.Fsa.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 1, 0.0)], final=[1])
    emissions = np.log(np.full((2, 4, 2), 0.5, np.float32))
    emissions[0, 2, 0] = np.nan
    total = sj.dense_tot_score(graph, emissions, semiring=semiring)
    assert np.isnan(total[0]) and np.isfinite(total[1])
    occupancy = sj.dense_occupancy(graph, emissions, semiring=semiring)
    assert np.isnan(occupancy[0]).all() and np.isfinite(occupancy[1]).all()
    weight = jnp.asarray(graph.weight).at[1].set(jnp.nan)
    total = jax.jit(
        lambda w: sj.dense_tot_score(graph.replace(weight=w), emissions[1:], semiring=semiring)
    )(weight)
    assert np.isnan(total).all()


def test_dense_forward_mode_matches_reverse_mode():
    graph = sj.Fsa.from_arcs(
        [(0, 0, 0, 0.1), (0, 1, 1, -0.2), (1, 1, 1, 0.3), (1, 0, 2, 0.0)],
        final={0: 0.0, 1: 0.5},
        dtype=np.float64,
    )
    rng = np.random.default_rng(1)
    emissions = jnp.asarray(rng.normal(size=(2, 5, 3)))
    lengths = np.array([5, 3])
    weight = jnp.asarray(graph.weight)
    tangents = (jnp.ones_like(emissions), jnp.linspace(-1.0, 1.0, weight.shape[0]))
    for semiring in (sj.LOG, sj.TROPICAL):

        def total(e, w):
            return jnp.sum(sj.dense_tot_score(graph.replace(weight=w), e, lengths, semiring))

        @jax.jit
        def both_modes(e, w):
            _, forward = jax.jvp(total, (e, w), tangents)
            grads = jax.grad(total, argnums=(0, 1))(e, w)
            reverse = sum(jnp.vdot(g, t) for g, t in zip(grads, tangents))
            return forward, reverse, jax.hessian(total)(e, w)

        forward, reverse, hessian = both_modes(emissions, weight)
        np.testing.assert_allclose(forward, reverse, rtol=1e-12)
        flat = np.asarray(hessian).reshape(emissions.size, emissions.size)
        np.testing.assert_allclose(flat, flat.T, atol=1e-12)
    check_grads(lambda e: total(e, weight), (emissions,), order=1, modes=("fwd",))


# -- states with many arcs: rows of K slots and trees over rows ---------------------


def with_dense_slots(fsa, slots, fans=None):
    """`fsa` with its dense tables rebuilt at (K incoming, K outgoing) slots
    a row and trees of (F, F) fan-in (None: the cheapest), so that small
    graphs get trees too."""
    structure = [np.asarray(field) for field in (fsa.src, fsa.dst, fsa.arc_mask)]
    shape = dense_tables.dense_shape(fsa.num_states, *structure, slots=slots, fans=fans)
    tables = dense_tables.build_dense_tables(fsa.num_states, *structure, shape=shape)
    return dataclasses.replace(
        fsa,
        tables=Tables(
            Schedule.from_arrays({**fsa.schedule.arrays(), **tables}, fsa.schedule.real_sizes),
            fsa.cycle,
            fsa.shapes._replace(dense=shape),
        ),
    )


def _hub_data(seed):
    """3 states: 10 arcs 0 -> 1, 6 arcs 2 -> 1, and a few more, so that state
    0 has 14 outgoing arcs and state 1 up to 18 incoming ones."""
    rng = np.random.default_rng(seed)
    ends = [(0, 1)] * 10 + [(2, 1)] * 6 + [(0, 2)] * 4 + [(1, 1), (1, 2), (2, 0), (1, 1)]
    order = rng.permutation(len(ends))  # hubs' arcs spread over the arc order
    arcs = []
    for i in order:
        label = int(rng.integers(3))
        arcs.append((*ends[i], label, label, float(rng.normal())))
    return 3, arcs, {1: 0.0, 2: -0.5}


@pytest.mark.parametrize(
    ("slots", "fans"),
    [((1, 1), (2, 2)), ((1, 1), None), ((2, 3), (3, 2)), ((4, 16), None), (None, None)],
)
def test_high_degree_states_match_brute_force(slots, fans):
    data = _hub_data(7)
    graph = with_dense_slots(build(data, np.float64), slots, fans)
    if slots is not None:  # trees where a state has more than K arcs
        assert graph.schedule.dense.in_leaf.size > 0
        assert (graph.schedule.dense.out_leaf.size > 0) == (slots[1] < 14)
    rng = np.random.default_rng(8)
    emissions = jnp.asarray(rng.normal(size=(2, 4, 3)))
    lengths = np.array([4, 2])
    _, arcs, final = data
    for name in ("log", "tropical"):
        got = sj.dense_tot_score(graph, emissions, lengths, SEMIRINGS[name])
        want = [
            oracles.brute_dense_tot_score(arcs, final, np.asarray(emissions[b]), lengths[b], name)
            for b in range(2)
        ]
        np.testing.assert_allclose(got, want, rtol=1e-10)
    got = jax.grad(lambda e: sj.dense_tot_score(graph, e, lengths)[0])(emissions)
    want = jax.grad(lambda e: _reference_total(data, e[0], 4))(emissions)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    labels, scores = sj.viterbi_decode(graph, emissions, lengths)
    for b in range(2):
        decoded, best = oracles.brute_dense_best(arcs, final, np.asarray(emissions[b]), lengths[b])
        np.testing.assert_allclose(scores[b], best, rtol=1e-10)
        assert tuple(np.asarray(labels[b, : lengths[b]]).tolist()) == decoded  # no ties here
    occupancy = np.asarray(sj.dense_occupancy(graph, emissions, lengths, over="states"))
    for b in range(2):
        np.testing.assert_allclose(occupancy[b, : lengths[b]].sum(axis=1), 1.0, rtol=1e-10)
        assert not occupancy[b, lengths[b] :].any()


def test_high_degree_weight_gradients_match_autodiff():
    data = _hub_data(9)
    graph = with_dense_slots(build(data, np.float64), (2, 2))
    emissions = jnp.asarray(np.random.default_rng(10).normal(size=(2, 3, 3)))
    for semiring in (sj.LOG, sj.TROPICAL):
        check_grads(
            lambda e, w, f: sj.dense_tot_score(
                graph.replace(weight=w, final_weight=f), e, None, semiring
            ),
            (emissions, graph.weight, graph.final_weight),
            order=1,
            modes=("rev",),
        )


@pytest.mark.parametrize(
    ("slots", "fans"),
    [((1, 1), (2, 2)), ((3, 1), (3, 2)), ((1, 1), None), ((4, 4), None), (None, None)],
)
def test_tropical_ties_go_to_the_lowest_numbered_arc_across_rows(slots, fans):
    # Ten parallel arcs 0 -> 1, labels 9..0; arcs 4, 7 and 9 tie for best.
    weights = [-1.0, -2.0, -1.0, -3.0, 0.0, -1.0, -0.5, 0.0, -4.0, 0.0]
    arcs = [(0, 1, 9 - i, w) for i, w in enumerate(weights)]
    graph = with_dense_slots(
        sj.Fsa.from_arcs(arcs, final=[1], num_states=2, dtype=np.float64), slots, fans
    )
    emissions = jnp.zeros((1, 1, 10))
    labels, scores = sj.viterbi_decode(graph, emissions)
    np.testing.assert_array_equal(labels, [[5]])  # arc 4
    np.testing.assert_array_equal(scores, [0.0])
    weight_grad = jax.grad(
        lambda w: sj.dense_tot_score(graph.replace(weight=w), emissions, None, sj.TROPICAL)[0]
    )(graph.weight)
    np.testing.assert_array_equal(weight_grad, np.eye(10)[4])
    occupancy = sj.dense_occupancy(graph, emissions, semiring=sj.TROPICAL)
    np.testing.assert_array_equal(occupancy[0, 0], np.eye(10)[5])


def test_batch_of_hub_and_plain_graphs_equals_one_by_one():
    hub = build(_hub_data(11), np.float64)
    plain = build(
        (
            3,
            [(0, 1, 1, 1, 0.2), (1, 2, 2, 2, -0.1), (2, 0, 0, 0, 0.0), (1, 1, 0, 0, 0.3)],
            {2: 0.0},
        ),
        np.float64,
    )
    batch = sj.stack([hub, plain])
    emissions = jnp.asarray(np.random.default_rng(12).normal(size=(2, 4, 3)))
    lengths = np.array([4, 3])
    for semiring in (sj.LOG, sj.TROPICAL):
        loss = lambda e, w: sj.dense_tot_score(batch.replace(weight=w), e, lengths, semiring).sum()
        value, (grad_e, grad_w) = jax.value_and_grad(loss, argnums=(0, 1))(emissions, batch.weight)
        total = 0.0
        for b, graph in enumerate([hub, plain]):
            one = lambda e, w: sj.dense_tot_score(
                graph.replace(weight=w), e[None], lengths[b : b + 1], semiring
            )[0]
            v, (ge, gw) = jax.value_and_grad(one, argnums=(0, 1))(emissions[b], graph.weight)
            total += v
            np.testing.assert_allclose(grad_e[b], ge, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(grad_w[b, : graph.num_arcs], gw, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(value, total, rtol=1e-10)
    labels, _ = sj.viterbi_decode(batch, emissions, lengths)
    for b, graph in enumerate([hub, plain]):
        one, _ = sj.viterbi_decode(graph, emissions[b : b + 1], lengths[b : b + 1])
        np.testing.assert_array_equal(labels[b], one[0])


def _best_arcs_through_tables(tables, num_states, num_arcs, values, side):
    """(best value, its arc) per state, by the tables alone: ⊕ = max over
    each row's slots, then up the trees, keeping the first maximum."""
    if side == "in":
        rows = tables["dense_in_arc"]
    else:
        rows = np.append(tables["dense_in_arc"].reshape(-1), num_arcs)[tables["dense_out_slot"]]
    values = np.append(values, -np.inf)
    fan = tables[f"dense_{side}_leaf"].shape[2]
    choice = values[rows].argmax(axis=1)
    row_value, row_arc = values[rows].max(axis=1), rows[np.arange(rows.shape[0]), choice]
    leaf = tables[f"dense_{side}_leaf"].reshape(-1)
    node_value = np.append(row_value, -np.inf)[leaf]
    node_arc = np.append(row_arc, num_arcs)[leaf]
    pool_value, pool_arc = [], []
    width = tables[f"dense_{side}_leaf"].shape[1] * fan
    while width > 1:
        pick = node_value.reshape(-1, fan).argmax(axis=1)
        node_value = node_value.reshape(-1, fan).max(axis=1)
        node_arc = node_arc.reshape(-1, fan)[np.arange(pick.size), pick]
        pool_value.append(node_value)
        pool_arc.append(node_arc)
        width //= fan
    pool_value = np.concatenate([*pool_value, [-np.inf]])
    pool_arc = np.concatenate([*pool_arc, [num_arcs]])
    top = tables[f"dense_{side}_top"]
    has_tree = top < pool_value.size - 1
    return (
        np.where(has_tree, pool_value[top], row_value[:num_states]),
        np.where(has_tree, pool_arc[top], row_arc[:num_states]),
    )


@settings(max_examples=40, deadline=None)
@given(
    num_states=st.integers(1, 12),
    seed=st.integers(0, 2**31),
    slots=st.one_of(st.none(), st.tuples(st.integers(1, 5), st.integers(1, 5))),
    fans=st.one_of(st.none(), st.tuples(st.integers(2, 5), st.integers(2, 5))),
)
def test_tables_reach_each_states_first_best_arc(num_states, seed, slots, fans):
    rng = np.random.default_rng(seed)
    num_arcs = int(rng.integers(0, 60))
    src, dst = rng.integers(0, num_states, (2, num_arcs))
    if num_arcs:  # a hub in each direction
        src[rng.random(num_arcs) < 0.4] = rng.integers(num_states)
        dst[rng.random(num_arcs) < 0.4] = rng.integers(num_states)
    mask = rng.random(num_arcs) < 0.9
    shape = dense_tables.dense_shape(num_states, src, dst, mask, slots=slots, fans=fans)
    tables = dense_tables.build_dense_tables(num_states, src, dst, mask, shape)
    values = rng.integers(0, 4, num_arcs).astype(float)  # many ties
    for side, key in (("in", dst), ("out", src)):
        best, arc = _best_arcs_through_tables(tables, num_states, num_arcs, values, side)
        for state in range(num_states):
            mine = np.flatnonzero(mask & (key == state))
            if mine.size == 0:
                assert best[state] == -np.inf
                continue
            assert best[state] == values[mine].max()
            assert arc[state] == mine[np.argmax(values[mine])]  # the first best


def test_common_dense_shape_fits_entries_of_other_slot_counts():
    rng = np.random.default_rng(13)
    entries = []
    for degree in (1, 3, 40, 7):
        num_states = 20
        src = rng.integers(0, num_states, 60)
        dst = rng.integers(0, num_states, 60)
        dst[:degree] = 5
        src[:degree] = 6
        entries.append((num_states, src, dst, np.ones(60, bool)))
    shapes = [dense_tables.dense_shape(*entry) for entry in entries]
    assert len({shape.in_slots for shape in shapes}) > 1
    common = dense_tables.common_dense_shape(shapes)
    for entry in entries:
        tables = dense_tables.build_dense_tables(*entry, shape=common)
        values = rng.normal(size=60)
        for side, key in (("in", entry[2]), ("out", entry[1])):
            best, _ = _best_arcs_through_tables(tables, 20, 60, values, side)
            want = [values[key == s].max(initial=-np.inf) for s in range(20)]
            np.testing.assert_array_equal(best, want)


def test_build_dense_tables_refuses_a_shape_too_small():
    src, dst = np.zeros(5, int), np.ones(5, int)
    natural = dense_tables.dense_shape(2, src, dst, np.ones(5, bool), slots=(2, 2), fans=(2, 2))
    with pytest.raises(ValueError, match=r"incoming arcs need extra_rows=2 at slots=2, fan=2"):
        dense_tables.build_dense_tables(
            2, src, dst, np.ones(5, bool), natural._replace(in_extra_rows=1)
        )
    with pytest.raises(ValueError, match=r"outgoing arcs need levels=2"):
        dense_tables.build_dense_tables(
            2, src, dst, np.ones(5, bool), natural._replace(out_levels=1)
        )


def test_common_dense_shape_keeps_a_stars_fan_in_from_other_entries():
    # The star's one hub fits a single level of 200 leaves; 30 hubs of 3
    # arcs in the other entry would each take a block of 200 at its F.
    star = (201, np.zeros(200, int), np.arange(1, 201), np.ones(200, bool))
    src = np.repeat(np.arange(30), 3)
    hubs = (31, src, (src + 1) % 31, np.ones(90, bool))
    shapes = [dense_tables.dense_shape(*entry, slots=(1, 1)) for entry in (star, hubs)]
    assert shapes[0].out_fan == 200
    common = dense_tables.common_dense_shape(shapes)
    assert common.out_fan < 200
    assert common.out_leaves < 1000
    for entry in (star, hubs):
        tables = dense_tables.build_dense_tables(*entry, shape=common)
        values = np.random.default_rng(14).normal(size=entry[1].size)
        best, _ = _best_arcs_through_tables(tables, entry[0], entry[1].size, values, "out")
        want = [values[entry[1] == s].max(initial=-np.inf) for s in range(entry[0])]
        np.testing.assert_array_equal(best, want)


@pytest.mark.parametrize(
    "route, name",
    [(r, n) for r in ("cpu_kernel", "frame_scan") for n in ("LOG", "TROPICAL")]
    + [("arc_scan", "LOG")],  # the arc scan serves LOG only
)
def test_a_graph_without_arcs_scores_on_every_route(route, name):
    # Every platform's branch is lowered with the program, so an empty arc
    # table must trace on the portable routes too (a max over zero arcs).
    graph = sj.Fsa.from_arcs([], final=[0], num_states=1)
    emissions = jnp.zeros((2, 3, 4), jnp.float32)
    lengths = jnp.asarray([0, 3])
    with sj.routes.force({"dense_tot_score": route}):
        total = sj.dense_tot_score(graph, emissions, lengths, getattr(sj, name))
    np.testing.assert_array_equal(total, [0.0, -np.inf])


def test_the_arc_scans_second_derivative_is_finite():
    # tests/sharding's loop chain and emissions: the gradient of one
    # column's occupancy (a second derivative of dense_tot_score). Its
    # states the start has not reached at frame 0 have backward sums of
    # 1e-20 in float32 and occupancy 0; dividing by such a sum put
    # 0 * (1 / sum^2) = 0 * inf in the second derivative.
    from tests.sharding.test_sharding_dense import _emissions, _random_loop_chain

    rng = np.random.default_rng(0)
    graph = _random_loop_chain(rng)
    emissions, lengths = _emissions(rng)
    grads = {}
    for route in ("frame_scan", "arc_scan"):
        with sj.routes.force({"dense_tot_score": route}):
            grads[route] = jax.grad(
                lambda e: jnp.sum(sj.dense_occupancy(graph, e, lengths)[7, :, 4])
            )(emissions)
    assert np.all(np.isfinite(grads["frame_scan"]))
    assert np.all(np.isfinite(grads["arc_scan"]))
    np.testing.assert_allclose(grads["arc_scan"], grads["frame_scan"], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "route, name",
    [(r, n) for r in ("cpu_kernel", "frame_scan") for n in ("LOG", "TROPICAL")]
    + [("arc_scan", "LOG")],
)
def test_a_frame_masked_in_every_column_moves_no_posterior_and_no_best_path(route, name):
    # -1e30 on every column of a frame is a common offset of all paths: the
    # gradients and the best path are those of the frame at 0, the total
    # lower by 1e30. Added to a score, -1e30 + w keeps nothing of an O(1)
    # w, in float or double, so each route must take the offset out first
    # (the kernels' double sums and the frame scan lost it: posteriors 0.18
    # off, a TROPICAL path of score 0.40 chosen over one of 2.00).
    rng = np.random.default_rng(1)
    arcs = [
        (int(a), int(b), int(c), float(w))
        for a, b, c, w in zip(
            rng.integers(5, size=12),
            rng.integers(5, size=12),
            rng.integers(V, size=12),
            rng.normal(size=12),
        )
    ] + [(0, 1, 0, 0.0)]
    graph = sj.Fsa.from_arcs(arcs, {1: 0.3, 3: -0.2}, num_states=5)
    frames = 6
    zero = rng.normal(size=(B, frames, V)).astype(np.float32)
    zero[1, 2, :] = 0.0
    masked = zero.copy()
    masked[1, 2, :] = -1e30
    lengths = jnp.asarray([frames, frames])
    semiring = getattr(sj, name)

    def value_and_grads(emissions):
        def total(emissions, weight):
            return sj.dense_tot_score(graph.replace(weight=weight), emissions, lengths, semiring)

        with sj.routes.force({"dense_tot_score": route}):
            value, pullback = jax.vjp(total, jnp.asarray(emissions), graph.weight)
            return value, pullback(jnp.ones(B, jnp.float32))

    value, grads = value_and_grads(masked)
    want_value, want_grads = value_and_grads(zero)
    np.testing.assert_allclose(value, want_value + np.float32([0, -1e30]), rtol=1e-6)
    for got, want in zip(grads, want_grads):
        np.testing.assert_allclose(got, want, atol=2e-6)
    if name == "TROPICAL" and route != "arc_scan":
        with sj.routes.force({"viterbi_decode": route}):
            columns, _ = sj.viterbi_decode(graph, masked, lengths)
            want_columns, _ = sj.viterbi_decode(graph, zero, lengths)
        np.testing.assert_array_equal(columns, want_columns)
