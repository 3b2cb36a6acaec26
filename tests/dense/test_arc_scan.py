"""The portable arc scan (`_src/dense/arc_scan.py`) against the frame scan.

The arc scan is what `dense_tot_score` (LOG) and `mmi_loss` run off the
CPU kernel: linear space per frame, and the batch again in logs, every
score a compensated pair, where a state of positive mass underflows or
the inputs read +inf or magnitudes beyond 2^20. Each test compares
totals and all three gradients with the frame scan's autodiff
(`dense._scan_value_and_grads`), itself checked against brute force in
`test_dense.py`; the `route` fixture runs a test on either recursion.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from semiring_jax._src.core import derivatives
from semiring_jax._src.dense import arc_scan, dense
from semiring_jax._src.mmi import leaky

TOL = {"float32": dict(rtol=3e-5, atol=3e-5), "float64": dict(rtol=1e-10, atol=1e-11)}
V = 4


def _random_graph(rng, dtype, num_states, num_arcs, scale=1.0):
    """Cyclic, parallel arcs, unreachable states, one to three finals."""
    arcs = [
        (int(rng.integers(num_states)), int(rng.integers(num_states)), int(rng.integers(V)), w)
        for w in rng.normal(size=num_arcs) * scale
    ]
    arcs.append((0, int(rng.integers(num_states)), 0, 0.0))
    finals = rng.choice(num_states, size=int(rng.integers(1, 4)))
    final = {int(s): float(rng.normal()) for s in finals}
    return sj.Fsa.from_arcs(arcs, final, num_states=num_states, dtype=dtype)


@pytest.fixture(params=["linear", "pairs"])
def route(request, monkeypatch):
    """The recursion a test's results come from: linear space (what runs
    unless a state underflows), or the pairs (every finite magnitude read
    as beyond the linear scan's bound)."""
    if request.param == "pairs":
        monkeypatch.setattr(arc_scan, "_LARGE", -1.0)
    return request.param


_COMPILED = {}


def _jitted(fn, route):
    """jax.jit(fn), one compiled program per route (read when tracing)."""
    if (fn, route) not in _COMPILED:
        _COMPILED[fn, route] = jax.jit(functools.partial(fn))
    return _COMPILED[fn, route]


def _ours(graph, emissions, lengths):
    """The arc scan's (totals [B], gradients by weight [B, A], final weight
    [B, S] and emission [B, T, V]), through `jax.grad`."""
    diff, arcs = dense.kernel_inputs(graph, emissions)
    aux = (arcs, lengths, graph)

    def total(d):
        return derivatives.score(arc_scan.score_op(leaky=False), d, aux)

    values = total(diff)
    finite = lambda d: jnp.sum(jnp.where(jnp.isfinite(values), total(d), 0.0))
    return values, jax.grad(finite)(diff)


def _both(graph, emissions, lengths):
    """(the arc scan's results, the frame scan's), as `_ours`."""
    diff, arcs = dense.kernel_inputs(graph, emissions)
    reference = dense._scan_value_and_grads(sj.LOG, diff, (arcs, lengths, graph))
    return _ours(graph, emissions, lengths), reference


def _check(graph, emissions, lengths, dtype, route="linear"):
    (value, grads), (want, want_grads) = jax.tree_util.tree_map(
        np.asarray, _jitted(_both, route)(graph, emissions, lengths)
    )
    np.testing.assert_array_equal(np.isnan(value), np.isnan(want))
    np.testing.assert_allclose(value, want, **TOL[dtype])
    finite = np.isfinite(want)
    for got, ref in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(got[finite], ref[finite], **TOL[dtype])
    return value, grads


@st.composite
def inputs(draw, dtype):
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    batch, frames = 3, 5  # one shape per dtype and graph kind: one compile each
    scale = draw(st.sampled_from([0.3, 3.0, 30.0]))
    if draw(st.booleans()):
        graph = _random_graph(rng, dtype, 5, 12, scale)
    else:  # one per utterance; the first has the most arcs, fixing the shape
        sizes = [12] + [int(n) for n in rng.integers(3, 12, batch - 1)]
        graph = sj.stack([_random_graph(rng, dtype, 5, n, scale) for n in sizes])
    emissions = rng.normal(size=(batch, frames, V)) * scale
    lengths = rng.integers(0, frames + 1, batch)
    lengths[0] = frames
    return graph, jnp.asarray(emissions, dtype), jnp.asarray(lengths, jnp.int32)


def _against_segment_scan(diff, arcs, lengths):
    """(the arc scan's results, the leaky segment scan's: leak 0, the plain
    log-space recursion by autodiff): flat arrays only, so that graphs of
    one size share one compile."""
    aux = (arcs, lengths)
    op = arc_scan.score_op(leaky=False)
    values = derivatives.score(op, diff, aux)
    finite = lambda d: jnp.sum(jnp.where(jnp.isfinite(values), derivatives.score(op, d, aux), 0.0))
    return (values, jax.grad(finite)(diff)), leaky.scan_value_and_grads(diff, aux)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_matches_the_log_space_recursion_on_random_graphs(data, dtype, route):
    graph, emissions, lengths = data.draw(inputs(dtype))
    diff, arcs = dense.kernel_inputs(graph, emissions)
    # A common arc count, so that every draw has one shape.
    pad = 13 - arcs.src.shape[-1]
    arcs = arcs._replace(
        src=jnp.pad(arcs.src, ((0, 0), (0, pad))),
        dst=jnp.pad(arcs.dst, ((0, 0), (0, pad))),
        column=jnp.pad(arcs.column, ((0, 0), (0, pad)), constant_values=-1),
        leak=jnp.zeros((3, 5), emissions.dtype),
    )
    arcs = arcs._replace(
        src=jnp.broadcast_to(arcs.src, (3, 13)),
        dst=jnp.broadcast_to(arcs.dst, (3, 13)),
        column=jnp.broadcast_to(arcs.column, (3, 13)),
    )
    diff = (jnp.pad(diff[0], ((0, 0), (0, pad)), constant_values=-jnp.inf), *diff[1:])
    (value, grads), (want, want_grads) = _jitted(_against_segment_scan, route)(diff, arcs, lengths)
    np.testing.assert_array_equal(np.isnan(value), np.isnan(want))
    np.testing.assert_allclose(value, want, **TOL[dtype])
    finite = np.isfinite(np.asarray(want))
    for got, ref in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(np.asarray(got)[finite], np.asarray(ref)[finite], **TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", pytest.param("float64", marks=pytest.mark.slow)])
def test_matches_the_frame_scan_on_a_shared_and_a_batched_graph(dtype, route):
    rng = np.random.default_rng(6)
    shared = _random_graph(rng, dtype, 5, 12, 3.0)
    batched = sj.stack([_random_graph(rng, dtype, 5, n, 3.0) for n in (12, 5, 8)])
    emissions = jnp.asarray(rng.normal(size=(3, 5, V)) * 3.0, dtype)
    lengths = jnp.array([5, 0, 3], jnp.int32)
    for graph in (shared, batched):
        _check(graph, emissions, lengths, dtype, route)


def _valley(dtype, depth):
    """State 0 -> 1 (weight 0) dead-ends; 0 -> 2 costs `depth` and leads on
    to the final state 3: the only path lies `depth` below the frame's best
    state, so linear space underflows on it."""
    arcs = [(0, 1, 0, 0.0), (1, 1, 0, 0.0), (0, 2, 1, -depth), (2, 3, 2, 0.0), (3, 3, 3, 0.5)]
    return sj.Fsa.from_arcs(arcs, [3], dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_an_underflowing_only_path_is_recomputed_in_logs(dtype):
    depth = {"float32": 200.0, "float64": 1000.0}[dtype]
    graph = _valley(dtype, depth)
    rng = np.random.default_rng(0)
    emissions = jnp.asarray(rng.normal(size=(2, 6, V)), dtype)
    lengths = jnp.array([6, 3], jnp.int32)
    value, grads = _check(graph, emissions, lengths, dtype)
    assert np.all(np.isfinite(value)) and np.all(value < -depth / 2)
    # The one path: each frame's column posterior is 1.
    np.testing.assert_allclose(grads[2].sum(-1)[0], np.ones(6), rtol=1e-5)


def test_float32_keeps_the_paths_differences_under_huge_weights():
    # Every arc weighs -2^30 (exact in float32, its ulp 128): each term
    # a + w + e would round the O(1) emissions to multiples of 128; the
    # pairs keep them. The totals are T * -2^30 plus the zero-weight
    # graph's, and the emission gradients are the zero-weight graph's.
    rng = np.random.default_rng(8)
    graph = _random_graph(rng, np.float64, 5, 14)
    finals = {int(s): 0.0 for s in np.flatnonzero(np.isfinite(graph.final_weight))}
    arcs = [(int(a), int(b), int(c), 0.0) for a, b, c in zip(graph.src, graph.dst, graph.ilabel)]
    flat = sj.Fsa.from_arcs(arcs, finals, num_states=5, dtype=np.float64)
    huge = flat.replace(weight=jnp.full_like(flat.weight, -(2.0**30)))
    emissions = rng.normal(size=(3, 6, V))
    lengths = jnp.array([6, 4, 1], jnp.int32)

    def value_and_grad(graph, emissions):
        total = lambda e: dense.total_by("arc_scan", sj.LOG, graph, e, lengths)
        return total(emissions), jax.grad(lambda e: jnp.sum(total(e)))(emissions)

    as32 = lambda g: jax.tree_util.tree_map(
        lambda x: x.astype(jnp.float32) if x.dtype == jnp.float64 else x, g
    )
    got, got_grad = jax.jit(value_and_grad)(as32(huge), jnp.asarray(emissions, jnp.float32))
    want, want_grad = jax.jit(value_and_grad)(flat, jnp.asarray(emissions))
    assert np.all(np.isfinite(want))
    # A float32 total of -6e9 is rounded to 512: the gradients show the
    # O(1) differences kept.
    shifted = np.asarray(want) - 2.0**30 * np.asarray(lengths)
    np.testing.assert_allclose(np.asarray(got, np.float64), shifted, rtol=1e-7)
    np.testing.assert_allclose(got_grad, want_grad, atol=1e-5)


def _lost(graph, emissions, lengths):
    """Whether the linear-space scans, forward and backward, flag a loss."""
    diff, arcs = dense.kernel_inputs(graph, emissions)
    arcs, lengths, frames = arc_scan._inputs(diff, (arcs, lengths, graph))
    g = arc_scan._prepare(diff, arcs, leaky=False)
    tiny = arc_scan._TINY[emissions.dtype]
    _, _, alphas, lost = arc_scan._forward(g, frames, lengths, tiny, keep=True)
    wanted = (True, True)
    *_, lost_back = arc_scan._backward(g, frames, lengths, diff[1], alphas, tiny, wanted)
    return bool(lost), bool(lost_back)


def test_only_states_with_mass_count_as_lost():
    # A 3-cycle: at each frame one state has mass; the others, though
    # reachable within that many arcs, have none, and are not lost.
    cycle = sj.Fsa.from_arcs([(0, 1, 0, 0.0), (1, 2, 1, -0.5), (2, 0, 2, 0.25)], [0, 2])
    emissions = jnp.asarray(np.random.default_rng(3).normal(size=(2, 7, V)), jnp.float32)
    lengths = jnp.array([7, 5], jnp.int32)
    assert _lost(cycle, emissions, lengths) == (False, False)
    # The valley's only path takes an arc 200 below the best one: lost
    # going forward and going back.
    assert _lost(_valley("float32", 200.0), emissions, lengths) == (True, True)
    # A final weight 200 below another: lost at the backward scan's start.
    finals = sj.Fsa.from_arcs([(0, 1, 0, 0.0), (0, 2, 1, 0.0)], {1: 0.0, 2: -200.0})
    assert _lost(finals, emissions[:, :1], jnp.array([1, 1], jnp.int32)) == (False, True)


@pytest.mark.parametrize("case", ["mask", "dead", "nan", "inf", "huge", "no path"])
def test_nasty_values_match_the_frame_scan(case, route):
    rng = np.random.default_rng(1)
    graph = _random_graph(rng, np.float64, 5, 14)
    emissions = rng.normal(size=(3, 5, V))
    if case == "mask":
        emissions[0, :, 0] = -1e4
        emissions[1, 2, 1:] = -np.inf
    elif case == "dead":
        emissions[2, 3, :] = -np.inf
    elif case == "nan":
        emissions[1, 0, 2] = np.nan
    elif case == "inf":
        emissions[0, 1, 1] = np.inf
    elif case == "huge":
        emissions[0, :, 1] = -1e30
    else:
        graph = graph.replace(final_weight=jnp.full_like(graph.final_weight, -jnp.inf))
    emissions = jnp.asarray(emissions)
    lengths = jnp.array([5, 4, 5], jnp.int32)
    value, grads = _check(graph, emissions, lengths, "float64", route)
    if case == "nan":
        assert np.isnan(value[1]) and all(np.isnan(g[1]).all() for g in grads)
    if case in ("dead", "no path"):
        dead = np.flatnonzero(value == -np.inf)
        assert dead.size and not any(np.any(g[dead]) for g in grads)


@pytest.mark.slow  # ~25 s of compiling and running
def test_a_float32_long_input_keeps_float64_precision():
    rng = np.random.default_rng(2)
    graph64 = _random_graph(rng, np.float64, 8, 30)
    emissions = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(2, 2000, V)) * 2.0))
    lengths = jnp.array([2000, 1500], jnp.int32)
    graph32 = jax.tree_util.tree_map(
        lambda x: x.astype(jnp.float32) if x.dtype == jnp.float64 else x, graph64
    )
    ours = jax.jit(_ours)
    v32, g32 = ours(graph32, emissions.astype(jnp.float32), lengths)
    v64, g64 = ours(graph64, emissions, lengths)
    np.testing.assert_allclose(v32, v64, rtol=1e-5)
    np.testing.assert_allclose(g32[2], g64[2], atol=1e-4)


def test_leaky_hmm_matches_the_leaky_segment_scan(route):
    rng = np.random.default_rng(3)
    graph = _random_graph(rng, np.float64, 6, 16)
    emissions = jnp.asarray(rng.normal(size=(3, 5, V)))
    lengths = jnp.array([5, 2, 0], jnp.int32)
    leak = 1e-3 * leaky.initial_probs(graph)
    diff, arcs = dense.kernel_inputs(graph, emissions, leak[None])
    value, grads = _jitted(arc_scan.score_op(leaky=True).value_and_grad, route)(
        diff, (arcs, lengths)
    )
    want, want_grads = jax.jit(leaky.scan_value_and_grads)(diff, (arcs, lengths))
    np.testing.assert_allclose(value, want, rtol=1e-10)
    for got, ref in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-11)


def test_only_the_wanted_gradients_are_computed():
    rng = np.random.default_rng(4)
    graph = _random_graph(rng, np.float64, 5, 12)
    emissions = jnp.asarray(rng.normal(size=(2, 4, V)))
    diff, arcs = dense.kernel_inputs(graph, emissions)
    op = arc_scan.score_op(leaky=False)
    aux = (arcs, jnp.array([4, 3], jnp.int32), graph)
    value, some = jax.jit(lambda d, a: op.value_and_some_grads(d, a, (False, True, True)))(
        diff, aux
    )
    full_value, full = jax.jit(op.value_and_grad)(diff, aux)
    assert some[0] is None
    np.testing.assert_array_equal(value, full_value)
    np.testing.assert_allclose(some[2], full[2], rtol=1e-12)
    # jax.grad in the emissions alone equals the full gradient's part.
    grad = jax.jit(
        jax.grad(lambda e: jnp.sum(dense.total_by("arc_scan", sj.LOG, graph, e, aux[1])))
    )(emissions)
    np.testing.assert_allclose(grad, full[2], rtol=1e-12)


@pytest.mark.slow  # ~20 s of compiling
def test_second_derivatives_match_the_frame_scan():
    rng = np.random.default_rng(5)
    graph = _random_graph(rng, np.float64, 4, 9)
    emissions = jnp.asarray(rng.normal(size=(2, 3, V)))
    lengths = jnp.array([3, 2], jnp.int32)
    tangent = jnp.asarray(rng.normal(size=emissions.shape))
    diff, arcs = dense.kernel_inputs(graph, emissions)
    aux = (arcs, lengths, graph)

    def hvp(value_fn):
        grad = jax.grad(lambda e: jnp.sum(value_fn((diff[0], diff[1], e))))
        return jax.jvp(grad, (emissions,), (tangent,))[1]

    ours = hvp(lambda d: derivatives.score(arc_scan.score_op(leaky=False), d, aux))
    want = hvp(lambda d: dense.total_by("frame_scan", sj.LOG, graph, d[2], lengths))
    np.testing.assert_allclose(ours, want, rtol=1e-8, atol=1e-10)
