"""Semirings with structured weights: k-best scores, entropy, KL, a user
semiring and the laws helper, against brute-force path enumeration and
OpenFst."""

import contextlib
import math

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from semiring_jax._src.kernels import loader
from tests import oracles
from tests.paths import both_paths, scan_only
from tests.strategies import acyclic_fsas, as_rows, padded

SETTINGS = settings(max_examples=30, deadline=None)
TOL = {"float32": dict(rtol=2e-5, atol=2e-5), "float64": dict(rtol=1e-10, atol=1e-10)}
DTYPES = st.sampled_from(["float32", "float64"])


def build(data, dtype):
    num_states, arcs, final = data
    return sj.Fsa.from_arcs(as_rows(arcs), final, num_states=num_states, dtype=dtype)


def path_scores(data):
    return sorted((score for _, score in oracles.enumerate_paths(*data)), reverse=True)


def brute_kbest(data, k):
    scores = [s for s in path_scores(data) if s > -math.inf][:k]
    return np.array(scores + [-math.inf] * (k - len(scores)))


def brute_entropy(data):
    scores = np.array([s for s in path_scores(data) if s > -math.inf])
    if scores.size == 0:
        return 0.0
    log_p = scores - np.logaddexp.reduce(scores)
    return float(-(np.exp(log_p) * log_p).sum())


# -- k-best ---------------------------------------------------------------------------


@SETTINGS
@given(data=acyclic_fsas(), dtype=DTYPES, k=st.sampled_from([1, 3, 8, 20]))
def test_kbest_scores_match_enumeration(data, dtype, k):
    fsa = padded(build(data, dtype))
    got = sj.kbest_scores(fsa, k)
    assert got.shape == (k,) and got.dtype == dtype
    np.testing.assert_allclose(got, brute_kbest(data, k), **TOL[dtype])
    np.testing.assert_allclose(got[0], sj.tot_score(fsa, sj.TROPICAL), **TOL[dtype])
    # The compiled recursion and tot_score's scan in the k-best semiring agree.
    np.testing.assert_allclose(got, sj.tot_score(fsa, sj.kbest_semiring(k)), **TOL[dtype])


@settings(max_examples=6, deadline=None)
@given(data=acyclic_fsas(), dtype=DTYPES)
def test_kbest_scores_on_both_paths(data, dtype):
    fsa = padded(build(data, dtype))

    def scores_and_grad(fsa):
        def second(w):
            return sj.kbest_scores(fsa.replace(weight=w), 2)[1]

        return sj.kbest_scores(fsa, 4), jax.grad(second)(fsa.weight)

    (kernel, kernel_grad), (scan, scan_grad) = both_paths(scores_and_grad, fsa)
    np.testing.assert_allclose(kernel, brute_kbest(data, 4), **TOL[dtype])
    np.testing.assert_allclose(scan, brute_kbest(data, 4), **TOL[dtype])
    if len(set(brute_kbest(data, 3))) == 3:  # no tie around the second: one path
        np.testing.assert_array_equal(kernel_grad, scan_grad)


@SETTINGS
@given(data=acyclic_fsas(), dtype=DTYPES)
def test_kbest_forward_and_backward_scores_agree_with_the_total(data, dtype):
    fsa = build(data, dtype)
    kbest = sj.kbest_semiring(4)
    backward = sj.backward_scores(fsa, kbest)
    forward = sj.forward_scores(fsa, kbest)
    assert forward.shape == backward.shape == (fsa.num_states, 4)
    np.testing.assert_allclose(backward[0], sj.kbest_scores(fsa, 4), **TOL[dtype])
    np.testing.assert_allclose(forward[0], [0.0] + [-math.inf] * 3)


@pytest.mark.parametrize("k", [1, 5, 16, 20])
def test_kbest_merges_many_incoming_lists(k):
    # 40 parallel arcs into state 1 and 3 out of it: 120 paths, and merges of
    # more lists than the compiled recursion scans (it keeps a heap then).
    rng = np.random.default_rng(k)
    arcs = [(0, 1, 1, float(w)) for w in rng.normal(size=40)]
    arcs += [(1, 2, 2, float(w)) for w in rng.normal(size=3)]
    fsa = sj.Fsa.from_arcs(arcs, final=[2], dtype="float64")
    scores = sorted((a[3] + b[3] for a in arcs[:40] for b in arcs[40:]), reverse=True)
    kernel, scan = both_paths(lambda f: sj.kbest_scores(f, k), fsa)
    np.testing.assert_allclose(kernel, scores[:k], rtol=1e-12)
    np.testing.assert_allclose(scan, scores[:k], rtol=1e-12)


def test_kbest_counts_parallel_arcs_and_ties_separately():
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 1.0), (0, 1, 2, 1.0), (1, 2, 1, 0.0)], final=[2])
    np.testing.assert_array_equal(sj.kbest_scores(fsa, 3), [1.0, 1.0, -math.inf])


def test_kbest_no_path_single_path_and_nan():
    none = sj.Fsa.from_arcs([(0, 1, 1, 0.0)], final={1: -math.inf})
    np.testing.assert_array_equal(sj.kbest_scores(none, 2), [-math.inf, -math.inf])
    single = sj.linear_fsa([1, 2]).replace(weight=jnp.array([0.5, 0.25], jnp.float32))
    np.testing.assert_array_equal(sj.kbest_scores(single, 2), [0.75, -math.inf])
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (0, 1, 2, 1.0)], final=[1])
    nan = jax.jit(lambda w: sj.kbest_scores(fsa.replace(weight=w), 2))
    assert np.isnan(nan(jnp.array([jnp.nan, 1.0], jnp.float32))[0])
    nan_grad = jax.grad(lambda w: sj.kbest_scores(fsa.replace(weight=w), 2)[0])
    assert np.isnan(nan_grad(jnp.array([jnp.nan, 1.0], jnp.float32))).all()


def test_kbest_nan_weight_gives_nan_gradients_on_both_paths():
    # The scan's gradient of a NaN score was the NaN arc's indicator [1, 0, 0].
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (0, 1, 2, 1.0), (1, 2, 3, 0.5)], final=[2])
    weight = jnp.array([jnp.nan, 1.0, 0.5], jnp.float32)
    final_weight = jnp.asarray(fsa.final_weight)

    def kbest(weight, final_weight):
        return sj.kbest_scores(fsa.replace(weight=weight, final_weight=final_weight), 2)

    def scores_and_grads(weight):
        first = jax.grad(lambda w, f: kbest(w, f)[0], argnums=(0, 1))(weight, final_weight)
        ones = (jnp.ones_like(weight), jnp.ones_like(final_weight))
        _, tangent = jax.jvp(kbest, (weight, final_weight), ones)
        return jax.jit(kbest)(weight, final_weight), first, tangent

    for scores, (arc_grad, final_grad), tangent in both_paths(scores_and_grads, weight):
        assert np.isnan(scores[0]) and np.isnan(tangent[0])
        assert np.isnan(arc_grad).all()
        np.testing.assert_array_equal(np.isnan(final_grad), [False, False, True])


def test_kbest_gradient_of_the_ith_score_is_the_ith_path():
    rng = np.random.default_rng(3)
    data = oracles.random_dag(rng, 8, 20)
    fsa = build(data, "float64")
    paths = sorted(oracles.enumerate_paths(*data), key=lambda p: -p[1])
    for i in range(4):
        grad = jax.grad(lambda w, i=i: sj.kbest_scores(fsa.replace(weight=w), 4)[i])(fsa.weight)
        expected = np.zeros(fsa.num_arcs)
        expected[list(paths[i][0])] = 1.0
        np.testing.assert_array_equal(grad, expected)


@settings(max_examples=15, deadline=None)
@given(data=st.lists(acyclic_fsas(), min_size=1, max_size=4))
def test_kbest_batched_is_one_by_one(data):
    fsas = [build(d, "float64") for d in data]
    batched = sj.kbest_scores(sj.stack(fsas), 3)
    for fsa, row in zip(fsas, batched):
        np.testing.assert_array_equal(row, sj.kbest_scores(fsa, 3))
    jitted = jax.jit(lambda f: sj.kbest_scores(f, 3))(sj.stack(fsas))
    np.testing.assert_allclose(jitted, batched)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kbest_matches_openfst_nshortest_on_a_larger_dag(seed):
    rng = np.random.default_rng(seed)
    data = oracles.random_dag(rng, 300, 1500)
    fsa = build(data, "float64")
    theirs = [score for score, _ in oracles.openfst_nbest(*data, 16)]
    np.testing.assert_allclose(sj.kbest_scores(fsa, 16), theirs, rtol=1e-5, atol=1e-4)


def test_kbest_on_a_deep_ladder_with_a_large_k():
    # 3,000 levels of two parallel arcs: 2^3000 paths, each 3,000 arcs long.
    # The compiled search asks for prefixes 3,000 states deep (no recursion
    # on the machine's stack), and k = 300 runs well past 16.
    rng = np.random.default_rng(7)
    levels = 3000
    weight = np.round(rng.normal(size=(levels, 2)), 2)
    arcs = [(i, i + 1, 1 + b, float(weight[i, b])) for i in range(levels) for b in range(2)]
    data = (levels + 1, [(s, d, label, label, w) for s, d, label, w in arcs], {levels: 0.0})
    fsa = sj.Fsa.from_arcs(arcs, final=[levels], dtype="float64")
    theirs = [score for score, _ in oracles.openfst_nbest(*data, 300)]
    ours = sj.kbest_scores(fsa, 300)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-3)
    # Each score's gradient is its path: one arc per level, summing to it.
    grad = jax.grad(lambda w: sj.kbest_scores(fsa.replace(weight=w), 300)[299])(fsa.weight)
    chosen = np.asarray(grad).reshape(levels, 2)
    np.testing.assert_array_equal(chosen.sum(axis=1), np.ones(levels))
    np.testing.assert_allclose((chosen * weight).sum(), ours[299], rtol=1e-12)


def test_kbest_rejects_a_bad_k():
    with pytest.raises(ValueError, match="positive int"):
        sj.kbest_scores(sj.linear_fsa([1]), 0)


# -- entropy --------------------------------------------------------------------------


@SETTINGS
@given(data=acyclic_fsas(), dtype=DTYPES)
def test_entropy_matches_enumeration(data, dtype):
    fsa = padded(build(data, dtype))
    got = sj.entropy(fsa)
    assert got.dtype == dtype
    tol = {"float32": dict(rtol=1e-4, atol=1e-4), "float64": TOL["float64"]}[dtype]
    np.testing.assert_allclose(got, brute_entropy(data), **tol)
    grad = jax.grad(lambda w: sj.entropy(fsa.replace(weight=w)))(fsa.weight)
    assert np.isfinite(grad).all()


@settings(max_examples=6, deadline=None)
@given(data=acyclic_fsas(), dtype=DTYPES)
def test_entropy_on_both_paths(data, dtype):
    fsa = padded(build(data, dtype))

    def value_and_grads(fsa):
        def entropy(w, f):
            return sj.entropy(fsa.replace(weight=w, final_weight=f))

        return jax.value_and_grad(entropy, argnums=(0, 1))(fsa.weight, fsa.final_weight)

    kernel, scan = both_paths(value_and_grads, fsa)
    tol = {"float32": dict(rtol=1e-4, atol=1e-4), "float64": dict(rtol=1e-9, atol=1e-9)}[dtype]
    np.testing.assert_allclose(kernel[0], brute_entropy(data), **tol)
    for a, b in zip(jax.tree_util.tree_leaves(kernel), jax.tree_util.tree_leaves(scan)):
        np.testing.assert_allclose(a, b, **tol)


def test_entropy_of_one_path_or_none_is_zero_with_zero_gradients():
    single = sj.linear_fsa([1, 2, 3]).replace(weight=jnp.array([1e4, -3.0, 2.0], jnp.float32))
    none = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (1, 2, 2, 0.0)], final={2: -math.inf})
    for fsa in (single, none):
        assert float(sj.entropy(fsa)) == 0.0
        grad = jax.grad(lambda w, fsa=fsa: sj.entropy(fsa.replace(weight=w)))(fsa.weight)
        np.testing.assert_array_equal(grad, np.zeros(fsa.num_arcs))


def test_entropy_is_accurate_at_huge_scores_and_nan_stays_nan():
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (0, 1, 2, 0.0)], final=[1])
    huge = fsa.replace(weight=jnp.array([1e6, 1e6], jnp.float32))
    np.testing.assert_allclose(sj.entropy(huge), math.log(2), rtol=1e-6)
    nan = jax.jit(lambda w: sj.entropy(fsa.replace(weight=w)))
    assert np.isnan(nan(jnp.array([jnp.nan, 0.0], jnp.float32)))


def equal_paths(shape, score, dtype):
    """(Fsa, number of paths) whose paths all score `score`, each mixing in
    one place: parallel arcs, several final states, a state of several
    sources, or parallel arcs after the huge one (the suffix side)."""
    if shape == "parallel":
        return sj.Fsa.from_arcs([(0, 1, 1, score), (0, 1, 2, score)], final=[1], dtype=dtype), 2
    fan = [(0, 1, 1, score), (0, 2, 2, score), (0, 3, 3, score)]
    if shape == "finals":
        return sj.Fsa.from_arcs(fan, final=[1, 2, 3], dtype=dtype), 3
    if shape == "sources":
        join = [(src, 4, 4, 0.0) for src in (1, 2, 3)]
        return sj.Fsa.from_arcs(fan + join, final=[4], dtype=dtype), 3
    tail = [(0, 1, 1, score), *((1, 2, label, 0.0) for label in (2, 3, 4))]
    return sj.Fsa.from_arcs(tail, final=[2], dtype=dtype), 3


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "shape, score",
    [
        ("parallel", 1e15),
        ("parallel", 1e17),
        ("parallel", 1e20),
        ("parallel", 1e30),
        ("finals", 1e15),
        ("finals", 1e30),
        ("sources", 1e15),
        ("sources", 1e30),
        ("suffix", 1e15),
        ("suffix", 1e30),
    ],
)
def test_entropy_of_equal_paths_at_huge_scores_is_exact_with_zero_gradient(dtype, shape, score):
    # The kernel's mixture terms once subtracted two score-sized doubles
    # (alpha - term, total - end, E[score] - its parts): ln 2 came out 0.0,
    # and ln 3 came out 1.125 with gradient -0.042.
    fsa, num_paths = equal_paths(shape, score, dtype)

    def value_and_grads(fsa):
        def entropy(w, f):
            return sj.entropy(fsa.replace(weight=w, final_weight=f))

        return jax.value_and_grad(entropy, argnums=(0, 1))(fsa.weight, fsa.final_weight)

    tol = {"float32": 1e-6, "float64": 1e-12}[dtype]
    for value, (arc_grad, final_grad) in both_paths(value_and_grads, fsa):
        np.testing.assert_allclose(value, math.log(num_paths), rtol=tol)
        np.testing.assert_allclose(arc_grad, np.zeros(fsa.num_arcs), atol=tol)
        np.testing.assert_allclose(final_grad, np.zeros(fsa.num_states), atol=tol)


OVERFLOWING = sj.Fsa.from_arcs(
    [(0, 1, 1, 0.0), (0, 1, 2, 0.0), (1, 2, 3, 0.0), (1, 2, 4, 0.0)], final=[2], dtype="float32"
)


@pytest.mark.parametrize(
    "weights, expected",
    [
        ([3e38, -np.inf, 3e38, -np.inf], 0.0),  # one path, past float32's largest
        ([3e38, 3e38, 3e38, -np.inf], math.log(2)),  # two, mixed before the overflow
        ([3e38, 0.0, 3e38, -np.inf], 0.0),  # one overflows, one is 3e38 below
    ],
)
def test_entropy_where_a_float32_path_score_overflows(weights, expected):
    # The scan gave NaN (its log-mass is +inf, as for a +inf weight); the
    # kernel, in double, gave the entropy.
    fsa = OVERFLOWING.replace(weight=jnp.array(weights, jnp.float32))

    def value_and_grads(fsa):
        def entropy(w, f):
            return sj.entropy(fsa.replace(weight=w, final_weight=f))

        return jax.value_and_grad(entropy, argnums=(0, 1))(fsa.weight, fsa.final_weight)

    for value, (arc_grad, final_grad) in both_paths(value_and_grads, fsa):
        np.testing.assert_allclose(value, expected, rtol=1e-6)
        np.testing.assert_array_equal(arc_grad, np.zeros(4))
        np.testing.assert_array_equal(final_grad, np.zeros(3))


def test_entropy_on_the_scan_is_nan_where_overflowed_masses_meet_or_a_weight_is_inf():
    # Two overflowed masses have shares float32 cannot tell: NaN, never a
    # guess; a +inf weight's infinite mass stays NaN too.
    both_overflow = OVERFLOWING.replace(weight=jnp.full(4, 3e38, jnp.float32))
    infinite = jax.jit(lambda w: sj.entropy(OVERFLOWING.replace(weight=w)))
    with scan_only():
        assert np.isnan(sj.entropy(both_overflow))
        assert np.isnan(infinite(jnp.array([np.inf, 0.0, 0.0, 0.0], jnp.float32)))
    if loader.enabled():  # the kernel, in double, has no overflow
        np.testing.assert_allclose(sj.entropy(both_overflow), math.log(4), rtol=1e-6)


@pytest.mark.parametrize("path", ["kernels", "scan"])
def test_entropy_gradient_matches_finite_differences(path):
    rng = np.random.default_rng(5)
    fsa = build(oracles.random_dag(rng, 7, 16), "float64")
    with scan_only() if path == "scan" else contextlib.nullcontext():
        jax.test_util.check_grads(
            lambda w: sj.entropy(fsa.replace(weight=w)), (fsa.weight,), order=2, modes=["rev"]
        )
        jax.test_util.check_grads(
            lambda f: sj.entropy(fsa.replace(final_weight=f)), (fsa.final_weight,), order=1
        )


def test_entropy_batched_is_one_by_one_and_jits():
    rng = np.random.default_rng(6)
    fsas = [build(oracles.random_dag(rng, n, 3 * n), "float64") for n in (3, 6, 9)]
    batched = jax.jit(sj.entropy)(sj.stack(fsas))
    np.testing.assert_allclose(batched, [sj.entropy(f) for f in fsas], rtol=1e-12)


# -- KL divergence --------------------------------------------------------------------


def brute_kl(p_data, q_data):
    p_paths = oracles.enumerate_paths(*p_data)
    q_scores = dict(oracles.enumerate_paths(*q_data))
    live = [(path, s) for path, s in p_paths if s > -math.inf]
    if not live:
        return 0.0
    log_zp = np.logaddexp.reduce([s for _, s in live])
    log_zq = np.logaddexp.reduce([s for s in q_scores.values()])
    total = 0.0
    for path, s in live:
        log_p, log_q = s - log_zp, q_scores[path] - log_zq
        total += math.exp(log_p) * (log_p - log_q)
    return total


def reweighted(data, rng):
    num_states, arcs, final = data
    arcs = [(*arc[:4], float(rng.normal())) for arc in arcs]
    return num_states, arcs, {s: float(rng.normal()) for s in final}


@SETTINGS
@given(data=acyclic_fsas(weights=st.floats(-3, 3, width=32)), dtype=DTYPES, seed=st.integers(0, 99))
def test_kl_matches_enumeration(data, dtype, seed):
    q_data = reweighted(data, np.random.default_rng(seed))
    p, q = build(data, dtype), build(q_data, dtype)
    tol = {"float32": dict(rtol=1e-4, atol=1e-4), "float64": TOL["float64"]}[dtype]
    np.testing.assert_allclose(sj.kl_divergence(p, q), brute_kl(data, q_data), **tol)
    np.testing.assert_allclose(sj.kl_divergence(p, p), 0.0, atol=tol["atol"])


def test_kl_is_inf_where_q_misses_a_path_of_p():
    p = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (0, 1, 2, 0.0)], final=[1])
    q = p.replace(weight=jnp.array([0.0, -jnp.inf], jnp.float32))
    assert float(sj.kl_divergence(p, q)) == math.inf
    assert float(sj.kl_divergence(q, p)) == pytest.approx(math.log(2))


def test_kl_is_accurate_at_huge_scores():
    p = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (0, 1, 2, 0.0)], final=[1])
    wp = np.array([1e6, 1e6], np.float32)
    wq = np.array([1e6, 1e6 - 1.0986], np.float32)  # float32 rounds to 1/16 here
    q_share = np.exp(wq.astype(np.float64) - np.logaddexp.reduce(wq.astype(np.float64)))
    expected = float(np.sum(0.5 * (np.log(0.5) - np.log(q_share))))
    got = sj.kl_divergence(p.replace(weight=jnp.asarray(wp)), p.replace(weight=jnp.asarray(wq)))
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_kl_gradients_in_both_match_finite_differences():
    rng = np.random.default_rng(8)
    data = oracles.random_dag(rng, 6, 14)
    p = build(data, "float64")
    q = build(reweighted(data, rng), "float64")

    def kl(wp, wq):
        return sj.kl_divergence(p.replace(weight=wp), q.replace(weight=wq))

    jax.test_util.check_grads(kl, (p.weight, q.weight), order=1, modes=["rev"])


def test_kl_batched_and_structure_checks():
    rng = np.random.default_rng(9)
    datas = [oracles.random_dag(rng, n, 2 * n) for n in (3, 5)]
    ps = [build(d, "float64") for d in datas]
    qs = [build(reweighted(d, rng), "float64") for d in datas]
    batched = sj.kl_divergence(sj.stack(ps), sj.stack(qs))
    np.testing.assert_allclose(batched, [sj.kl_divergence(p, q) for p, q in zip(ps, qs)])
    other = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (1, 2, 1, 0.0)], final=[2])
    shifted = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (0, 2, 1, 0.0)], final=[2])
    with pytest.raises(ValueError, match="differ in src at arc 1"):
        sj.kl_divergence(other, shifted)


# -- dense intersection ---------------------------------------------------------------


def test_dense_tot_score_takes_structured_semirings():
    rng = np.random.default_rng(11)
    num_states, num_columns = 5, 4
    arcs = [
        (
            int(rng.integers(num_states)),
            int(rng.integers(num_states)),
            int(rng.integers(4)),
            0.1 * i,
        )
        for i in range(25)
    ]  # cyclic, with states of more than K in-arcs
    graph = sj.Fsa.from_arcs(arcs, final={4: 0.0, 2: 0.5}, num_states=num_states, dtype="float64")
    emissions = jnp.asarray(rng.normal(size=(2, 6, num_columns)))
    lengths = jnp.array([6, 4])
    lattices = sj.intersect_dense(graph, emissions, lengths)
    kbest = sj.dense_tot_score(graph, emissions, lengths, semiring=sj.kbest_semiring(5))
    np.testing.assert_allclose(kbest, sj.kbest_scores(lattices, 5), rtol=1e-10)
    tropical = sj.dense_tot_score(graph, emissions, lengths, semiring=sj.TROPICAL)
    np.testing.assert_allclose(kbest[:, 0], tropical, rtol=1e-10)
    _, dense_entropy = sj.dense_tot_score(
        graph, emissions, lengths, semiring=sj._src.scores.entropy.ENTROPY
    )
    np.testing.assert_allclose(dense_entropy, sj.entropy(lattices), rtol=1e-9)


# -- a user-defined structured semiring -----------------------------------------------


def _count_best_sum(x, axis):
    scores, counts = x
    best = jnp.max(scores, axis=axis, initial=-jnp.inf)
    ties = scores == jnp.expand_dims(best, axis)
    return best, jnp.sum(jnp.where(ties, counts, 0), axis=axis)


def _count_best_plus(a, b):
    return _count_best_sum((jnp.stack([a[0], b[0]]), jnp.stack([a[1], b[1]])), 0)


def _count_best_times(a, b):
    scores = a[0] + b[0]
    return scores, jnp.where(scores > -jnp.inf, a[1] * b[1], 0)


# TROPICAL x counting: (best score, number of paths with it), built with
# the public API only.
COUNT_BEST = sj.Semiring(
    name="count-best",
    plus=_count_best_plus,
    times=_count_best_times,
    sum=_count_best_sum,
    zero=(-math.inf, 0.0),
    one=(0.0, 1.0),
    lift=lambda scores: (scores, jnp.ones_like(scores)),
)


@SETTINGS
@given(data=acyclic_fsas(weights=st.integers(-2, 2).map(float)))
def test_user_semiring_counts_the_best_paths(data):
    scores = [s for _, s in oracles.enumerate_paths(*data)]
    best = max(scores, default=-math.inf)
    count = sum(1 for s in scores if s == best) if best > -math.inf else 0
    got_best, got_count = sj.tot_score(padded(build(data, "float64")), COUNT_BEST)
    assert float(got_best) == best and float(got_count) == count


def test_user_semiring_obeys_the_laws_and_a_broken_one_fails():
    scores = jnp.array([-jnp.inf, 0.0, 1.0, 1.0, -2.0])
    counts = jnp.array([0.0, 1.0, 2.0, 3.0, 1.0])
    sj.check_semiring_laws(COUNT_BEST, (scores, counts))
    for k in (1, 3):
        samples = np.sort(np.random.default_rng(k).integers(-3, 3, (6, k)).astype(float))[:, ::-1]
        samples[0] = -np.inf
        sj.check_semiring_laws(sj.kbest_semiring(k), jnp.asarray(samples.copy()))
    broken = sj.Semiring(
        name="broken",
        plus=_count_best_plus,
        times=lambda a, b: (a[0] + b[0], a[1] + b[1]),  # counts add: not distributive
        sum=_count_best_sum,
        zero=(-math.inf, 0.0),
        one=(0.0, 1.0),
    )
    with pytest.raises(AssertionError, match="'broken': one is not a left identity"):
        sj.check_semiring_laws(broken, (scores, counts))


def test_structured_semirings_declare_no_capability_and_need_a_lift():
    with pytest.raises(ValueError, match="capability of float weights"):
        sj.Semiring(
            name="x", plus=jnp.add, times=jnp.add, sum=jnp.sum, zero=(0.0,), one=(0.0,),
            segment_sum=jax.ops.segment_sum,
        )  # fmt: skip
    with pytest.raises(ValueError, match="differ in structure"):
        sj.Semiring(name="y", plus=jnp.add, times=jnp.add, sum=jnp.sum, zero=(0.0,), one=(0.0, 1.0))
    unlifted = sj.Semiring(
        name="z", plus=_count_best_plus, times=_count_best_times, sum=_count_best_sum,
        zero=(-math.inf, 0.0), one=(0.0, 1.0),
    )  # fmt: skip
    with pytest.raises(ValueError, match="no lift"):
        sj.tot_score(sj.linear_fsa([1]), unlifted)
    with pytest.raises(ValueError, match="structured weights"):
        sj.arc_posteriors(sj.linear_fsa([1]), COUNT_BEST)


def test_structured_semirings_hash_by_value():
    assert sj.kbest_semiring(4) is sj.kbest_semiring(4)
    twin = sj.Semiring(**{f: getattr(COUNT_BEST, f) for f in ("name", "plus", "times", "sum")},
                       zero=(-math.inf, 0.0), one=(0.0, 1.0), lift=COUNT_BEST.lift)  # fmt: skip
    assert twin == COUNT_BEST and hash(twin) == hash(COUNT_BEST)
    assert sj.kbest_semiring(3) != sj.kbest_semiring(4)


def test_ops_of_float_weights_refuse_structured_semirings():
    fsa = sj.Fsa.from_arcs([(0, 1, 0, 0.0), (1, 2, 1, 0.0)], final=[2])
    kbest = sj.kbest_semiring(2)
    with pytest.raises(ValueError, match="remove_epsilon: semiring 'kbest2' has structured"):
        sj.remove_epsilon(fsa, kbest)
    with pytest.raises(ValueError, match="determinize"):
        sj.determinize(fsa, kbest)
    with pytest.raises(ValueError, match="dense_occupancy: semiring 'kbest2'"):
        sj.dense_occupancy(fsa, jnp.zeros((1, 2, 2), jnp.float32), semiring=kbest)
