"""Dense intersection's CPU kernel (`_src/kernels/dense.cc`) against the
portable frame scan, on random general graphs.

On the CPU `dense_tot_score`, `viterbi_decode`, `dense_occupancy` and
`mmi_loss` run the kernel; on GPUs and TPUs the scans (docs/routes.md),
whose reference is the frame scan of `dense/frame_scan.py`. Both must give
the same totals and gradients (LOG posteriors, the TROPICAL best path), the
same -inf, NaN and zeros, and the same second derivatives. The brute-force
tests of `tests/dense` check the path this machine runs.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from semiring_jax._src.dense import dense
from semiring_jax._src.kernels import dense_ops, loader

# The kernel's targets are registered as it is built, on first use.
pytestmark = pytest.mark.skipif(not loader.enabled(), reason="the CPU kernels are not built")

TOL = {"float32": dict(rtol=2e-5, atol=2e-5), "float64": dict(rtol=1e-10, atol=1e-11)}
B, T, V = 3, 5, 4


def _scan_total(semiring, graph, emissions, lengths):
    """The portable route: the arc scan in LOG, else the frame scan."""
    route = "arc_scan" if semiring.arithmetic == "log" else "frame_scan"
    return dense.total_by(route, semiring, graph, emissions, lengths)


def _value_and_grads(total, semiring, graph, emissions, lengths):
    def loss(emissions, weight, final_weight):
        g = graph.replace(weight=weight, final_weight=final_weight)
        return total(semiring, g, emissions, lengths)

    values = loss(emissions, graph.weight, graph.final_weight)
    finite = lambda *a: jnp.sum(jnp.where(jnp.isfinite(values), loss(*a), 0.0))
    grads = jax.grad(finite, argnums=(0, 1, 2))(emissions, graph.weight, graph.final_weight)
    return values, grads


@jax.jit
def _kernel(graph, emissions, lengths):
    return [_value_and_grads(dense.kernel_total, s, graph, emissions, lengths) for s in SEMIRINGS]


@jax.jit
def _scan(graph, emissions, lengths):
    return [_value_and_grads(_scan_total, s, graph, emissions, lengths) for s in SEMIRINGS]


SEMIRINGS = (sj.LOG, sj.TROPICAL)


def _random_graph(rng, dtype, num_states, num_arcs):
    """Cyclic, self-loops and parallel arcs, some states unreachable, one
    to three final states; weights at a random scale."""
    scale = rng.choice([0.3, 1.0, 10.0])
    arcs = [
        (int(rng.integers(num_states)), int(rng.integers(num_states)), int(rng.integers(V)), w)
        for w in rng.normal(size=num_arcs) * scale
    ]
    arcs.append((0, int(rng.integers(num_states)), 0, 0.0))
    finals = rng.choice(num_states, size=int(rng.integers(1, 4)), replace=True)
    final = {int(s): float(rng.normal()) for s in finals}
    return sj.Fsa.from_arcs(arcs, final, num_states=num_states, dtype=dtype)


@st.composite
def inputs(draw, dtype):
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    if draw(st.booleans()):
        graph = _random_graph(rng, dtype, 5, 12)
    else:  # one per utterance, padded to a common shape
        # One entry has the most arcs, so that every draw pads to one shape.
        sizes = [12] + [int(n) for n in rng.integers(4, 12, B - 1)]
        graphs = [_random_graph(rng, dtype, 5, n) for n in sizes]
        graph = sj.stack(graphs)
    emissions = rng.normal(size=(B, T, V)) * rng.choice([0.5, 3.0])
    lengths = rng.integers(0, T + 1, B)
    lengths[0] = T
    return graph, jnp.asarray(emissions, dtype), jnp.asarray(lengths, jnp.int32)


def _path_score(graph, emissions, grads):
    """The summed scores of the paths a TROPICAL gradient indicates (the
    gradients of a shared graph's weights sum over the batch)."""
    emission_grad, weight_grad, final_grad = grads
    weight = np.where(np.asarray(graph.arc_mask), np.asarray(graph.weight), 0.0)
    final = np.where(np.asarray(graph.final_mask), np.asarray(graph.final_weight), 0.0)
    return (
        np.sum(emission_grad * np.asarray(emissions))
        + np.sum(weight_grad * weight)
        + np.sum(final_grad * final)
    )


def _check(dtype, graph, emissions, lengths):
    """LOG: the same totals and posteriors. TROPICAL: the same best score,
    and each path indicates a path of that score (float rounding may break
    a near tie either way; `tests/dense` checks exact ties)."""
    kernel = jax.tree_util.tree_map(np.asarray, _kernel(graph, emissions, lengths))
    scan = jax.tree_util.tree_map(np.asarray, _scan(graph, emissions, lengths))
    (k_log, k_log_grads), (k_best, k_best_grads) = kernel
    (s_log, s_log_grads), (s_best, s_best_grads) = scan
    np.testing.assert_allclose(k_log, s_log, **TOL[dtype])
    for k, s in zip(k_log_grads, s_log_grads, strict=True):
        np.testing.assert_allclose(k, s, **TOL[dtype])
    np.testing.assert_allclose(k_best, s_best, **TOL[dtype])
    found = np.isfinite(k_best)
    for grads in (k_best_grads, s_best_grads):
        score = _path_score(graph, emissions, grads)
        np.testing.assert_allclose(score, np.sum(k_best[found]), **TOL[dtype])
        frames = grads[0].sum(axis=-1)  # one column per frame within the length
        within = np.arange(T)[None] < np.asarray(lengths)[:, None]
        np.testing.assert_array_equal(frames, (within & found[:, None]).astype(frames.dtype))


# float64 draws in the slow run: tests/dense's brute-force checks run the
# kernel in float64 by default.
@pytest.mark.parametrize("dtype", ["float32", pytest.param("float64", marks=pytest.mark.slow)])
@settings(max_examples=3, deadline=None)  # each draw compiles anew (~10 s)
@given(data=st.data())
def test_kernel_matches_scan_on_random_graphs(data, dtype):
    _check(dtype, *data.draw(inputs(dtype)))


def test_kernel_is_used():
    graph = _random_graph(np.random.default_rng(0), np.float32, 4, 6)
    jaxpr = jax.make_jaxpr(lambda e: sj.dense_tot_score(graph, e))(
        jnp.zeros((1, 2, V), jnp.float32)
    )
    assert "semiring_jax_dense_log_total" in str(jaxpr)


@pytest.mark.parametrize("case", ["mask", "inf", "nan", "dead"])
def test_kernel_matches_scan_on_nasty_values(case, dtype):
    rng = np.random.default_rng(1)
    graph = _random_graph(rng, dtype, 5, 12)
    emissions = rng.normal(size=(B, T, V))
    if case == "mask":  # -1e30 on a column: the kernel hands the entry to the scan
        emissions[0, :, 0] = -1e30
        emissions[1, 2, :] = -1e30
    elif case == "inf":
        emissions[0, 1, 1] = np.inf
    elif case == "nan":
        emissions[1, 0, 2] = np.nan
    else:
        emissions[2, 3, :] = -np.inf
    emissions, lengths = jnp.asarray(emissions, dtype), jnp.full((B,), T, jnp.int32)
    kernel = jax.tree_util.tree_map(np.asarray, _kernel(graph, emissions, lengths))
    scan = jax.tree_util.tree_map(np.asarray, _scan(graph, emissions, lengths))
    for (k_value, _), (s_value, _) in zip(kernel, scan, strict=True):
        np.testing.assert_array_equal(np.isnan(k_value), np.isnan(s_value))
        np.testing.assert_allclose(k_value, s_value, **TOL[dtype])
    # LOG's gradients (+inf: NaN on both); TROPICAL's best paths may
    # break a near tie apart (`_check` covers them).
    if case != "inf":
        for k, s in zip(kernel[0][1], scan[0][1], strict=True):
            np.testing.assert_allclose(k, s, **TOL[dtype])
    if case == "nan":
        assert np.isnan(kernel[0][0][1]) and np.all(np.isnan(kernel[0][1][0][1]))
    if case == "dead":
        assert kernel[0][0][2] == -np.inf and not np.any(kernel[0][1][0][2])


@pytest.mark.slow  # ~35 s of compiling; test_kernels.py checks the mechanism on CTC
def test_second_derivatives_are_the_scans():
    rng = np.random.default_rng(2)
    graph = _random_graph(rng, np.float64, 5, 12)
    emissions = jnp.asarray(rng.normal(size=(B, T, V)))
    lengths = jnp.full((B,), T, jnp.int32)
    tangent = jnp.asarray(rng.normal(size=(B, T, V)))

    def hvp(total):
        grad = jax.grad(lambda e: jnp.sum(total(sj.LOG, graph, e, lengths)))
        return jax.jvp(grad, (emissions,), (tangent,))[1]

    np.testing.assert_allclose(hvp(dense.kernel_total), hvp(_scan_total), rtol=1e-9, atol=1e-10)


def test_batches_split_over_threads_agree():
    rng = np.random.default_rng(3)
    graph = _random_graph(rng, np.float32, 40, 400)
    emissions = jnp.asarray(rng.normal(size=(12, 30, V)), jnp.float32)
    lengths = jnp.asarray(rng.integers(20, 31, 12), jnp.int32)
    kernel = dense.kernel_total(sj.LOG, graph, emissions, lengths)
    scan = dense.total_by("arc_scan", sj.LOG, graph, emissions, lengths)
    np.testing.assert_allclose(kernel, scan, rtol=2e-5)
    alone = [
        dense.kernel_total(sj.LOG, graph, emissions[b : b + 1], lengths[b : b + 1]) for b in (0, 7)
    ]
    np.testing.assert_allclose(np.concatenate(alone), np.asarray(kernel)[[0, 7]], rtol=1e-6)


@pytest.mark.slow  # tests/scores/test_precision.py checks the default path at T = 5,000 too
def test_float32_keeps_float64_precision_over_5000_frames():
    """API.md's precision bar, on the kernel: values within 1e-5 relative
    and gradients within 1e-4 absolute of float64 on the same inputs."""
    rng = np.random.default_rng(4)
    # Weights rounded to float32 first, so that both runs read the same numbers.
    arcs = [
        (int(rng.integers(20)), int(rng.integers(20)), int(rng.integers(V)), float(np.float32(w)))
        for w in rng.normal(size=80)
    ]
    arcs += [(s, (s + 1) % 20, s % V, 0.0) for s in range(20)]  # a cycle through every state
    # Four utterances: they run as one group of lanes (alpha kept in float).
    logits = rng.normal(size=(4, 5000, V)).astype(np.float32)
    log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    results = []
    for dtype in (np.float32, np.float64):
        graph = sj.Fsa.from_arcs(arcs, {3: 0.0, 11: -0.5}, num_states=20, dtype=dtype)
        e = jnp.asarray(log_probs, dtype)
        value, grad = jax.value_and_grad(lambda e, g=graph: jnp.sum(sj.dense_tot_score(g, e)))(e)
        results.append((np.asarray(value, np.float64), np.asarray(grad, np.float64)))
    (v32, g32), (v64, g64) = results
    assert np.isfinite(v64).all()
    np.testing.assert_allclose(v32, v64, rtol=1e-5)
    np.testing.assert_allclose(g32, g64, atol=1e-4)


def test_the_weights_gradient_is_skipped_when_unwanted():
    rng = np.random.default_rng(3)
    graph = _random_graph(rng, np.float64, 5, 12)
    emissions = jnp.asarray(rng.normal(size=(B, T, V)))
    lengths = jnp.array([T, 3, 0], jnp.int32)
    diff, arcs = dense.kernel_inputs(graph, emissions)
    aux = (arcs, lengths, graph)
    op = dense._kernel_op(sj.LOG)
    full = jax.jit(op.value_and_grad)(diff, aux)
    some = jax.jit(lambda d, a: op.value_and_some_grads(d, a, (False, True, True)))(diff, aux)
    assert some[1][0] is None
    np.testing.assert_array_equal(some[0], full[0])
    for got, want in zip(some[1][1:], full[1][1:], strict=True):
        np.testing.assert_array_equal(got, want)
    # jax.grad in the emissions alone takes that path and agrees.
    grad = jax.jit(jax.grad(lambda e: jnp.sum(dense.kernel_total(sj.LOG, graph, e, lengths))))
    np.testing.assert_allclose(grad(emissions), full[1][2], rtol=1e-12)


def test_viterbi_scores_gradients_are_the_tropical_totals():
    # viterbi_decode takes score and path from one kernel call.
    rng = np.random.default_rng(4)
    graph = _random_graph(rng, np.float64, 5, 12)
    emissions = jnp.asarray(rng.normal(size=(B, T, V)))
    lengths = jnp.array([T, 3, 2], jnp.int32)

    def viterbi(e, w):
        return sj.viterbi_decode(graph.replace(weight=w), e, lengths)[1]

    def tropical(e, w):
        return sj.dense_tot_score(graph.replace(weight=w), e, lengths, sj.TROPICAL)

    weight = jnp.asarray(graph.weight)
    np.testing.assert_allclose(viterbi(emissions, weight), tropical(emissions, weight), rtol=1e-12)
    finite = lambda fn: lambda e, w: jnp.sum(jnp.where(jnp.isfinite(fn(e, w)), fn(e, w), 0.0))
    got = jax.grad(finite(viterbi), argnums=(0, 1))(emissions, weight)
    want = jax.grad(finite(tropical), argnums=(0, 1))(emissions, weight)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    tangent = jnp.ones_like(emissions)
    _, forward = jax.jvp(lambda e: viterbi(e, weight), (emissions,), (tangent,))
    _, want_forward = jax.jvp(lambda e: tropical(e, weight), (emissions,), (tangent,))
    np.testing.assert_allclose(forward, want_forward, rtol=1e-12)


@jax.jit
def _log_kernel_outputs(graph, emissions, lengths, leak):
    diff, arcs = dense.kernel_inputs(graph, emissions, leak)
    reference = functools.partial(dense._scan_value_and_grads, sj.LOG)
    return dense_ops.log_total_and_grads(reference, diff, (arcs, lengths, graph))


def _raw_log_kernel(graph, emissions, lengths, leak):
    """The kernel's LOG outputs as they come: log Z [B] and the posteriors
    by weight [B, A], final weight [B, S] and emission [B, T, V]."""
    return jax.tree_util.tree_map(np.asarray, _log_kernel_outputs(graph, emissions, lengths, leak))


@pytest.mark.parametrize("leaky", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_groups_of_utterances_are_each_utterance_alone(dtype, leaky):
    """With a shared graph and three or more utterances the kernel runs
    them four at a time, one vector lane each: each must come out as it
    does alone (one utterance runs by itself). The batch mixes lengths 0
    and T, an entry with no path, NaN and +inf entries (which run alone),
    a -1e30 mask (handed to the scan) and frames deep enough to underflow
    a linear sum, and fills its last group with fewer than four."""
    rng = np.random.default_rng(5)
    frames, valley = 12, -700.0  # the kernel sums in double: 1e-200 is tiny
    graph = _random_graph(rng, dtype, 8, 40)
    emissions = rng.normal(size=(11, frames, V))
    lengths = rng.integers(1, frames + 1, 11)
    lengths[:8] = frames, 0, frames, frames, frames, frames, frames, frames
    emissions[2, 4, :] = -np.inf  # no path
    emissions[3, 2, :] = np.nan
    emissions[4, 3, :] = np.inf
    emissions[5, :, 1] = valley  # states reached only through column 1 fall far behind
    emissions[6, 5, :2] = 2 * valley
    emissions[7, 1, 3] = -1e30
    leak = jnp.asarray(rng.uniform(0, 1e-3, 8), dtype) if leaky else None
    emissions, lengths = jnp.asarray(emissions, dtype), jnp.asarray(lengths, jnp.int32)
    together = _raw_log_kernel(graph, emissions, lengths, leak)
    alone = [
        _raw_log_kernel(graph, emissions[b : b + 1], lengths[b : b + 1], leak) for b in range(11)
    ]
    alone = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *alone)
    # float32: the lanes keep alpha in float (the posteriors within 1e-5)
    tol = {"float32": dict(rtol=1e-5, atol=1e-7), "float64": dict(rtol=1e-12, atol=1e-14)}[dtype]
    for got, want in zip(jax.tree_util.tree_leaves(together), jax.tree_util.tree_leaves(alone)):
        np.testing.assert_allclose(got, want, **tol)
    value, grads = together
    assert value[2] == -np.inf and not np.any(grads[2][2])
    assert np.isnan(value[3]) and np.isfinite(value[[0, 5, 6, 7]]).all()
    assert not np.any(grads[2][1]) and not np.any(grads[2][8, lengths[8] :])
    if not leaky:  # and the scan agrees (it has no leak of its own)
        scan = dense.total_by("arc_scan", sj.LOG, graph, emissions, lengths)
        assert value[4] == np.inf
        np.testing.assert_allclose(value, np.asarray(scan), **TOL[dtype])
