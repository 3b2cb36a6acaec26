"""tot_score, forward/backward scores and arc posteriors against oracles."""

import math

import chex
import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from tests import oracles
from tests.paths import both_paths
from tests.strategies import acyclic_fsas, as_rows, padded

SETTINGS = settings(max_examples=40, deadline=None)
TOL = {"float32": dict(rtol=2e-5, atol=2e-5), "float64": dict(rtol=1e-10, atol=1e-10)}
SEMIRINGS = {"log": sj.LOG, "tropical": sj.TROPICAL}
REAL = sj.Semiring(name="real", plus=jnp.add, times=jnp.multiply, sum=jnp.sum, zero=0.0, one=1.0)


def build(data, dtype, transducer=False):
    num_states, arcs, final = data
    return sj.Fsa.from_arcs(as_rows(arcs, transducer), final, num_states=num_states, dtype=dtype)


def build_padded(data, dtype):
    """Padded to the strategy's maximum sizes: one compile serves all draws,
    and padding must not change any result."""
    return padded(build(data, dtype))


def unpad(values, size):
    return np.asarray(values)[:size]


def final_posteriors(data):
    """Brute force: P(path ends in s) under p(path) ∝ exp(score)."""
    num_states, arcs, final = data
    paths = oracles.enumerate_paths(num_states, arcs, final)
    total = oracles.brute_tot_score(num_states, arcs, final, "log")
    posterior = np.zeros(num_states)
    if total == -math.inf:
        return posterior
    for path, score in paths:
        end = arcs[path[-1]][1] if path else 0
        posterior[end] += math.exp(score - total)
    return posterior


def check_log_scores(fsa, data, dtype):
    num_states, arcs, _ = data
    tol = TOL[dtype]
    np.testing.assert_allclose(sj.tot_score(fsa), oracles.brute_tot_score(*data, "log"), **tol)
    np.testing.assert_allclose(
        unpad(sj.forward_scores(fsa), num_states), oracles.brute_forward_scores(*data, "log"), **tol
    )
    np.testing.assert_allclose(
        unpad(sj.backward_scores(fsa), num_states),
        oracles.brute_backward_scores(*data, "log"),
        **tol,
    )
    np.testing.assert_allclose(
        unpad(sj.arc_posteriors(fsa), len(arcs)), oracles.brute_arc_posteriors(*data, "log"), **tol
    )
    assert sj.tot_score(fsa).dtype == dtype


@SETTINGS
@given(data=acyclic_fsas(), dtype=st.sampled_from(["float32", "float64"]))
def test_log_scores_match_brute_force(data, dtype):
    check_log_scores(build_padded(data, dtype), data, dtype)


@settings(max_examples=8, deadline=None)
@given(data=acyclic_fsas(), dtype=st.sampled_from(["float32", "float64"]))
def test_log_scores_match_brute_force_unpadded(data, dtype):
    check_log_scores(build(data, dtype), data, dtype)


@SETTINGS
@given(data=acyclic_fsas(), dtype=st.sampled_from(["float32", "float64"]))
def test_tropical_scores_match_brute_force(data, dtype):
    num_states, arcs, final = data
    fsa = build_padded(data, dtype)
    tol = TOL[dtype]
    best = oracles.brute_tot_score(*data, "tropical")
    np.testing.assert_allclose(sj.tot_score(fsa, sj.TROPICAL), best, **tol)
    np.testing.assert_allclose(
        unpad(sj.forward_scores(fsa, sj.TROPICAL), num_states),
        oracles.brute_forward_scores(*data, "tropical"),
        **tol,
    )
    np.testing.assert_allclose(
        unpad(sj.backward_scores(fsa, sj.TROPICAL), num_states),
        oracles.brute_backward_scores(*data, "tropical"),
        **tol,
    )
    indicator = unpad(sj.arc_posteriors(fsa, sj.TROPICAL), len(arcs))
    if dtype == "float64":  # sums are bit-exact, so ties break identically
        np.testing.assert_array_equal(indicator, oracles.brute_arc_posteriors(*data, "tropical"))
    else:  # float32 rounding may reorder near-ties: check it is a best path
        chosen = np.flatnonzero(indicator)
        assert set(np.unique(indicator)) <= {0.0, 1.0}
        if best == -math.inf:
            assert chosen.size == 0
        else:
            sources = {arcs[a][0] for a in chosen}
            end = next((arcs[a][1] for a in chosen if arcs[a][1] not in sources), 0)
            score = sum(arcs[a][4] for a in chosen) + final[end]
            np.testing.assert_allclose(score, best, **tol)


@SETTINGS
@given(data=acyclic_fsas(weights=st.floats(-2.0, 2.0)))
def test_user_semiring_matches_brute_force(data):
    num_states, arcs, final = data
    exp_arcs = [(s, d, i, o, math.exp(w)) for s, d, i, o, w in arcs]
    exp_final = {s: math.exp(w) for s, w in final.items()}
    exp_data = (num_states, exp_arcs, exp_final)
    fsa = build(exp_data, "float64")
    fsa = padded(fsa).replace(
        final_weight=np.append(exp_final_array(exp_data), np.zeros(6 - num_states)),
        weight=np.append(np.asarray(fsa.weight[: len(arcs)]), np.zeros(12 - len(arcs))),
    )
    tol = TOL["float64"]
    np.testing.assert_allclose(
        sj.tot_score(fsa, REAL), oracles.brute_tot_score(*exp_data, "real"), **tol
    )
    np.testing.assert_allclose(
        unpad(sj.forward_scores(fsa, REAL), num_states),
        oracles.brute_forward_scores(*exp_data, "real"),
        **tol,
    )
    np.testing.assert_allclose(
        unpad(sj.backward_scores(fsa, REAL), num_states),
        oracles.brute_backward_scores(*exp_data, "real"),
        **tol,
    )


def exp_final_array(data):
    """Final weights in the real semiring: 0 (its zero) where not final."""
    num_states, _, final = data
    values = np.zeros(num_states)
    for state, weight in final.items():
        values[state] = weight
    return values


@SETTINGS
@given(data=acyclic_fsas(), dtype=st.sampled_from(["float32", "float64"]))
def test_gradient_is_posteriors(data, dtype):
    num_states, arcs, _ = data
    fsa = build_padded(data, dtype)
    grads = jax.grad(
        lambda w, f: sj.tot_score(fsa.replace(weight=w, final_weight=f)), argnums=(0, 1)
    )(fsa.weight, fsa.final_weight)
    chex.assert_tree_all_finite(grads)
    np.testing.assert_allclose(grads[0], sj.arc_posteriors(fsa), **TOL[dtype])
    np.testing.assert_allclose(unpad(grads[1], num_states), final_posteriors(data), **TOL[dtype])
    assert not np.any(unpad(grads[0], 12)[len(arcs) :])  # padding arcs: exactly 0
    tropical = jax.grad(lambda w: sj.tot_score(fsa.replace(weight=w), sj.TROPICAL))(fsa.weight)
    np.testing.assert_array_equal(tropical, sj.arc_posteriors(fsa, sj.TROPICAL))


def test_every_op_under_jit(transform, dtype):
    data = (
        5,
        [
            (0, 1, 1, 1, 0.5),
            (0, 2, 2, 2, -1.0),
            (1, 3, 0, 0, 0.25),
            (2, 3, 3, 3, 1.0),
            (1, 3, 1, 1, 2.0),
            (3, 4, 2, 2, 0.0),
        ],
        {3: 0.5, 4: -0.5},
    )
    fsa = build(data, dtype)
    for name, semiring in SEMIRINGS.items():
        np.testing.assert_allclose(
            transform(sj.tot_score)(fsa, semiring),
            oracles.brute_tot_score(*data, name),
            **TOL[dtype],
        )
        np.testing.assert_allclose(
            transform(sj.forward_scores)(fsa, semiring),
            oracles.brute_forward_scores(*data, name),
            **TOL[dtype],
        )
        np.testing.assert_allclose(
            transform(sj.backward_scores)(fsa, semiring),
            oracles.brute_backward_scores(*data, name),
            **TOL[dtype],
        )
        np.testing.assert_allclose(
            transform(sj.arc_posteriors)(fsa, semiring),
            oracles.brute_arc_posteriors(*data, name),
            **TOL[dtype],
        )
        grad = transform(jax.grad(lambda f: sj.tot_score(f, semiring), allow_int=True))(fsa)
        np.testing.assert_allclose(
            grad.weight, oracles.brute_arc_posteriors(*data, name), **TOL[dtype]
        )


def test_replace_does_not_retrace():
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (1, 2, 2, 0.0)], final=[2])

    @jax.jit
    @chex.assert_max_traces(n=1)
    def score(weight):
        return sj.tot_score(fsa.replace(weight=weight))

    for value in range(3):
        score(jnp.full((2,), float(value), jnp.float32))


@pytest.mark.parametrize("semiring", ["log", "tropical"])
def test_matches_openfst_on_large_dags(semiring):
    rng = np.random.default_rng(7)
    data = oracles.random_dag(rng, 1500, 4000, num_final=5)
    fsa = build(data, "float64")
    arc_type = "log64" if semiring == "log" else "tropical"
    forward = oracles.openfst_shortest_distance(*data, arc_type)
    backward = oracles.openfst_shortest_distance(*data, arc_type, reverse=True)
    tol = dict(rtol=1e-7, atol=1e-6) if semiring == "log" else dict(rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(sj.forward_scores(fsa, SEMIRINGS[semiring]), forward, **tol)
    np.testing.assert_allclose(sj.backward_scores(fsa, SEMIRINGS[semiring]), backward, **tol)
    np.testing.assert_allclose(sj.tot_score(fsa, SEMIRINGS[semiring]), backward[0], **tol)
    # float32 stays close to the float64 result at this size.
    fsa32 = build(data, "float32")
    np.testing.assert_allclose(sj.tot_score(fsa32, SEMIRINGS[semiring]), backward[0], rtol=1e-5)


def reference_tot_score(data, weight, final_weight, semiring):
    """Plain-autodiff reference: per-state recursion in topological order."""
    num_states, arcs, _ = data
    reduce = jax.nn.logsumexp if semiring == "log" else jnp.max
    order = topological_order(num_states, arcs)
    alpha = {}
    for state in order:
        terms = [alpha[src] + weight[a] for a, (src, dst, *_) in enumerate(arcs) if dst == state]
        if state == 0:
            terms.append(jnp.zeros((), weight.dtype))
        alpha[state] = reduce(jnp.stack(terms)) if terms else jnp.asarray(-jnp.inf, weight.dtype)
    return reduce(jnp.stack([alpha[s] + final_weight[s] for s in range(num_states)]))


def topological_order(num_states, arcs):
    remaining = set(range(num_states))
    order = []
    while remaining:
        ready = sorted(
            s for s in remaining if not any(dst == s and src in remaining for src, dst, *_ in arcs)
        )
        order += ready
        remaining -= set(ready)
    return order


FIXED = (
    6,
    [
        (0, 1, 1, 1, 0.3),
        (0, 2, 2, 2, -0.7),
        (1, 3, 0, 0, 0.25),
        (2, 3, 3, 3, 1.1),
        (1, 3, 1, 1, 0.9),
        (3, 4, 2, 2, -0.2),
        (2, 4, 1, 1, 0.4),
        (4, 5, 1, 1, 0.05),
        (3, 5, 2, 2, 0.6),
    ],
    {3: 0.5, 4: -0.5, 5: 0.1},
)


@pytest.mark.parametrize("semiring", ["log", "tropical"])
def test_finite_differences(semiring):
    fsa = build(FIXED, "float64")
    score = lambda w, f: sj.tot_score(fsa.replace(weight=w, final_weight=f), SEMIRINGS[semiring])
    # TROPICAL is piecewise linear: FIXED has no ties, so a small step is safe.
    jax.test_util.check_grads(
        score, (fsa.weight, fsa.final_weight), order=1, modes=("rev",), eps=1e-6
    )


def test_second_order_matches_autodiff_reference():
    fsa = build(FIXED, "float64")
    final = jnp.asarray(fsa.final_weight)
    ours = jax.jacrev(jax.grad(lambda w: sj.tot_score(fsa.replace(weight=w))))(fsa.weight)
    reference = jax.hessian(lambda w: reference_tot_score(FIXED, w, final, "log"))(
        jnp.asarray(fsa.weight)
    )
    np.testing.assert_allclose(ours, reference, rtol=1e-10, atol=1e-12)
    # A function of the posteriors, differentiated in reverse mode.
    entropy_like = lambda w: jnp.sum(sj.arc_posteriors(fsa.replace(weight=w)) ** 2)
    reference_posteriors = jax.grad(lambda w: reference_tot_score(FIXED, w, final, "log"))
    np.testing.assert_allclose(
        jax.grad(entropy_like)(fsa.weight),
        jax.grad(lambda w: jnp.sum(reference_posteriors(w) ** 2))(jnp.asarray(fsa.weight)),
        rtol=1e-10,
        atol=1e-12,
    )
    jax.test_util.check_grads(
        lambda w: sj.tot_score(fsa.replace(weight=w)), (fsa.weight,), order=2, modes=("rev",)
    )


@pytest.mark.parametrize("semiring", ["log", "tropical"])
def test_first_order_matches_autodiff_reference(semiring, dtype):
    fsa = build(FIXED, dtype)
    final = jnp.asarray(fsa.final_weight)
    ours = jax.grad(lambda w: sj.tot_score(fsa.replace(weight=w), SEMIRINGS[semiring]))(fsa.weight)
    reference = jax.grad(lambda w: reference_tot_score(FIXED, w, final, semiring))(
        jnp.asarray(fsa.weight)
    )
    np.testing.assert_allclose(ours, reference, **TOL[dtype])


NO_NAN_CASES = {
    "no path": (3, [(0, 1, 1, 1, 0.5)], {2: 0.0}),
    "no final state": (2, [(0, 1, 1, 1, 0.5)], {}),
    "all -inf weights": (3, [(0, 1, 1, 1, -math.inf), (1, 2, 1, 1, -math.inf)], {2: 0.0}),
    "unreachable states": (
        5,
        [(3, 4, 1, 1, 1.0), (4, 0, 1, 1, 1.0), (0, 1, 2, 2, 0.5), (3, 1, 1, 1, 2.0)],
        {1: 0.0, 4: 0.0},
    ),
    "single state": (1, [], {0: 0.5}),
    "dead state": (3, [(0, 1, 1, 1, 0.5), (0, 2, 1, 1, 0.5)], {1: 0.0}),
}


@pytest.mark.parametrize("case", sorted(NO_NAN_CASES))
@pytest.mark.parametrize("semiring", ["log", "tropical"])
def test_gradients_finite_and_exact(case, semiring, dtype):
    data = NO_NAN_CASES[case]
    fsa = build_padded(data, dtype)
    with jax.debug_nans(True):
        grad = jax.grad(lambda f: sj.tot_score(f, SEMIRINGS[semiring]), allow_int=True)(fsa)
        second = jax.jacrev(jax.grad(lambda w: sj.tot_score(fsa.replace(weight=w))))(fsa.weight)
    chex.assert_tree_all_finite((grad.weight, grad.final_weight, second))
    np.testing.assert_allclose(
        unpad(grad.weight, len(data[1])),
        oracles.brute_arc_posteriors(*data, semiring),
        **TOL[dtype],
    )
    assert not np.any(unpad(grad.weight, 12)[len(data[1]) :])
    if oracles.brute_tot_score(*data, semiring) == -math.inf:
        assert sj.tot_score(fsa, SEMIRINGS[semiring]) == -np.inf
        assert not np.any(grad.weight) and not np.any(grad.final_weight)


@pytest.mark.parametrize(
    "op", [sj.tot_score, sj.forward_scores, sj.backward_scores, sj.arc_posteriors, sj.best_path]
)
def test_cycle_is_refused_naming_a_state(op):
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (1, 2, 1, 0.0), (2, 1, 1, 0.0)], final=[2])
    cycle = r"state [12] lies on a cycle \((1 -> 2 -> 1|2 -> 1 -> 2)\)"
    with pytest.raises(ValueError, match=cycle):
        op(fsa)


def test_not_an_fsa_is_a_type_error():
    with pytest.raises(TypeError, match="tot_score: expected an Fsa"):
        sj.tot_score([(0, 1, 1, 0.0)])


# -- NaN and +inf weights, identically on every path -------------------------

SPECIAL_FSA = [(0, 1, 1, 0.0), (0, 1, 2, 0.1), (0, 2, 1, -1.0), (1, 3, 1, 0.0), (2, 3, 1, 0.5)]


@pytest.mark.parametrize("name", ["log", "tropical"])
def test_a_traced_nan_weight_gives_nan_on_every_path(name):
    semiring = sj.semiring(name)
    fsa = sj.Fsa.from_arcs(SPECIAL_FSA, final=[3])
    # NaN on arc 0, 2 or 4: on the best path, off it, and last.
    weights = jnp.stack([jnp.asarray(fsa.weight).at[arc].set(jnp.nan) for arc in (0, 2, 4)])

    @jax.jit
    def scores(w):
        nan_fsa = fsa.replace(weight=w)
        grad = jax.grad(lambda v: sj.tot_score(fsa.replace(weight=v), semiring))(w)
        return sj.tot_score(nan_fsa, semiring), grad, sj.arc_posteriors(nan_fsa, semiring)

    for total, grad, posteriors in both_paths(jax.vmap(scores), weights):
        assert np.isnan(total).all() and np.isnan(grad).all() and np.isnan(posteriors).all()


@pytest.mark.parametrize("name", ["log", "tropical"])
def test_a_nan_final_weight_gives_nan(name):
    fsa = sj.Fsa.from_arcs(SPECIAL_FSA, final=[2, 3])
    final = jnp.asarray(fsa.final_weight).at[2].set(jnp.nan)
    for total in both_paths(
        jax.jit(lambda f: sj.tot_score(fsa.replace(final_weight=f), sj.semiring(name))), final
    ):
        assert np.isnan(total)


@pytest.mark.parametrize("name", ["log", "tropical"])
def test_a_traced_inf_weight_is_inf_in_every_score(name):
    # +inf on arc 3 (1 -> 3): every score through it is +inf, the rest keep
    # their values (-inf absorbs +inf: the unreachable state 4 stays -inf).
    semiring = sj.semiring(name)
    fsa = sj.Fsa.from_arcs([*SPECIAL_FSA, (4, 3, 1, 0.0)], final=[3], num_states=5)
    weight = jnp.asarray(fsa.weight).at[3].set(jnp.inf)

    @jax.jit
    def scores(w):
        inf_fsa = fsa.replace(weight=w)
        return (
            sj.tot_score(inf_fsa, semiring),
            sj.forward_scores(inf_fsa, semiring),
            sj.backward_scores(inf_fsa, semiring),
            sj.arc_posteriors(inf_fsa, semiring),
        )

    kernel, scan = both_paths(scores, weight)
    for total, forward, backward, posteriors in (kernel, scan):
        assert total == np.inf and forward[3] == np.inf and forward[4] == -np.inf
        assert backward[0] == np.inf and backward[1] == np.inf and np.isfinite(backward[2])
        if name == "log":
            assert np.isnan(posteriors).all()  # undefined, and visible
        else:
            np.testing.assert_array_equal(posteriors, [0, 1, 0, 1, 0, 0])
    for mine, theirs in zip(kernel, scan):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("name", ["log", "tropical"])
def test_forward_mode_and_hessians(name):
    semiring = sj.semiring(name)
    fsa = sj.Fsa.from_arcs(SPECIAL_FSA, final={2: 0.3, 3: 0.0}, dtype=np.float64)
    weight = jnp.asarray(fsa.weight)
    tangent = jnp.asarray(np.linspace(-1, 1, weight.shape[0]))

    def total(w):
        return sj.tot_score(fsa.replace(weight=w), semiring)

    def derivatives(w):
        _, forward = jax.jvp(total, (w,), (tangent,))
        return forward, jnp.vdot(jax.grad(total)(w), tangent), jax.hessian(total)(w)

    kernel, scan = both_paths(derivatives, weight)
    for forward, reverse, hessian in (kernel, scan):
        np.testing.assert_allclose(forward, reverse, rtol=1e-12)
        np.testing.assert_allclose(hessian, hessian.T, atol=1e-12)
    for mine, theirs in zip(kernel, scan):
        np.testing.assert_allclose(mine, theirs, rtol=1e-10, atol=1e-12)
    jax.test_util.check_grads(total, (weight,), order=1, modes=("fwd",))
