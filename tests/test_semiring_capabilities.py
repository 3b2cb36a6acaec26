"""Semiring capabilities: what each field promises, and which path it opens.

Ops read a semiring's declared fields, never which object it is: a copy of
LOG's functions that declares no `arithmetic` must run the generic scans
(and agree with LOG), and one that declares `arithmetic="log"` must run
LOG's kernels and compensated scans.
"""

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import semiring_jax as sj
from semiring_jax._src.dense import arc_scan, frame_scan, log_frame_scan
from semiring_jax._src.kernels import loader
from semiring_jax._src.scores import level_pairs, level_scan
from semiring_jax._src.structural import determinize
from tests import oracles
from tests.paths import scan_only
from tests.strategies import as_rows

INF = float("inf")
REAL = sj.Semiring(name="real", plus=jnp.add, times=jnp.multiply, sum=jnp.sum, zero=0.0, one=1.0)
# LOG's and TROPICAL's functions, with no capability beyond the gradient
# rules: the generic paths.
LOG_COPY = dataclasses.replace(sj.LOG, name="log-copy", arithmetic=None, segment_sum=None)
TROPICAL_COPY = dataclasses.replace(
    sj.TROPICAL, name="tropical-copy", arithmetic=None, segment_sum=None
)
# The same, declaring the arithmetic: the fast paths.
LOG_FAST = dataclasses.replace(sj.LOG, name="log-fast", segment_sum=None)
TROPICAL_FAST = dataclasses.replace(sj.TROPICAL, name="tropical-fast", segment_sum=None)
# A selective semiring that is not max: costs, ⊕ = min, zero +inf.
MIN_PLUS = sj.Semiring(
    name="min-plus",
    plus=jnp.minimum,
    times=jnp.add,
    sum=lambda x, axis: jnp.min(x, axis=axis, initial=INF),
    zero=INF,
    one=0.0,
    times_is_addition=True,
)


def random_fsa(seed, *, num_labels=3, dtype="float64"):
    num_states, arcs, final = oracles.random_dag(np.random.default_rng(seed), 9, 20)
    # Few labels, so that determinize meets subsets of several states.
    arcs = [(i, j, 1 + label % num_labels, 1 + label % num_labels, w) for i, j, label, _, w in arcs]
    return sj.Fsa.from_arcs(as_rows(arcs), final, num_states=num_states, dtype=dtype)


@contextlib.contextmanager
def calls(monkeypatch, *targets):
    """Counts the calls of each (module, name) while the block traces."""
    counts = {name: 0 for _, name in targets}
    for module, name in targets:
        original = getattr(module, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    jax.clear_caches()  # jitted ops keep the path they were traced with
    try:
        yield counts
    finally:
        monkeypatch.undo()
        jax.clear_caches()


# -- the fields and their validation ---------------------------------------------


def test_builtins_declare_their_capabilities():
    for semiring, arithmetic in ((sj.LOG, "log"), (sj.TROPICAL, "tropical")):
        assert semiring.arithmetic == arithmetic
        assert semiring.times_is_addition is True
        assert semiring.sum_grad is not None and semiring.segment_sum is not None
    assert sj.LOG.argsum is None and sj.TROPICAL.argsum is not None
    # The six-field constructor declares nothing.
    assert REAL.times_is_addition is False
    assert (REAL.sum_grad, REAL.argsum, REAL.arithmetic, REAL.segment_sum) == (None,) * 4


def test_a_gradient_rule_implies_that_times_is_addition():
    # sum_grad / argsum keep their meaning: only for ⊗ = +.
    for rule in ("sum_grad", "argsum"):
        semiring = sj.Semiring(
            name="rule", plus=jnp.maximum, times=jnp.add, sum=jnp.max, zero=-INF, one=0.0,
            **{rule: getattr(sj.TROPICAL, rule)},
        )  # fmt: skip
        assert semiring.times_is_addition is True
        with pytest.raises(ValueError, match=f"times_is_addition=False contradicts {rule}"):
            dataclasses.replace(semiring, times_is_addition=False)
    assert MIN_PLUS.times_is_addition is True and MIN_PLUS.sum_grad is None


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(arithmetic="max"), r"Semiring 'log': arithmetic must be one of \(None, 'log'"),
        (dict(arithmetic="LOG"), "arithmetic must be one of"),
        (dict(times_is_addition=1), "times_is_addition must be a bool or None"),
        (dict(zero=0.0, one=1.0, arithmetic=None), r"times_is_addition=True needs one = 0\.0"),
        (dict(zero=INF), r"arithmetic='log' needs zero = -inf"),
        (dict(sum_grad=None), r"arithmetic='log' needs sum_grad \(e\.g\. sj\.LOG\.sum_grad\)"),
        (dict(sum_grad=None, arithmetic=None, times_is_addition=False, one=1.0), None),
    ],
)
def test_capabilities_are_validated(fields, message):
    if message is None:  # no capability left: a plain semiring
        assert dataclasses.replace(sj.LOG, **fields).times_is_addition is False
        return
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(sj.LOG, **fields)


def test_tropical_arithmetic_needs_argsum():
    with pytest.raises(ValueError, match=r"arithmetic='tropical' needs argsum"):
        dataclasses.replace(sj.TROPICAL, argsum=None)


def test_semirings_stay_hashable_jit_static_arguments():
    # Equal fields, equal semirings: one compile serves both.
    twin = dataclasses.replace(sj.LOG)
    assert twin == sj.LOG and hash(twin) == hash(sj.LOG)
    assert LOG_COPY != sj.LOG and LOG_FAST != sj.LOG and LOG_COPY != LOG_FAST
    traces = []

    @jax.jit
    def total(x, semiring):
        traces.append(semiring.name)
        return semiring.sum(x, axis=0)

    static = jax.jit(lambda x, semiring: semiring.sum(x, axis=0), static_argnames="semiring")
    for semiring in (sj.LOG, twin, LOG_COPY, LOG_FAST, MIN_PLUS, REAL):
        np.testing.assert_allclose(total(jnp.ones(3), semiring), semiring.sum(jnp.ones(3), axis=0))
        np.testing.assert_allclose(
            static(jnp.ones(3), semiring=semiring), total(jnp.ones(3), semiring)
        )
    assert traces == ["log", "log-copy", "log-fast", "min-plus", "real"]  # twin: cached


# -- segment_sum -------------------------------------------------------------------


@pytest.mark.parametrize("semiring", [sj.LOG, sj.TROPICAL], ids=lambda s: s.name)
def test_segment_sum_is_sum_by_segment(semiring, dtype):
    values = jnp.array(
        [0.5, -1.0, -INF, 3.0, INF, 2.0, -INF, -INF, np.nan, 1.0, 100.0, 99.0], dtype
    )
    segments = jnp.array([0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 5, 5])  # 4: empty
    got = semiring.segment_sum(values, segments, 6)
    assert got.dtype == values.dtype and got.shape == (6,)
    for segment in range(6):
        want = semiring.sum(values[segments == segment], axis=0)
        np.testing.assert_allclose(got[segment], want, rtol=1e-6 if dtype == "float32" else 1e-12)
    assert np.isnan(got[3]) and got[1] == INF and got[2] == got[4] == -INF  # NaN, +inf, -inf


@pytest.mark.parametrize("semiring", [sj.LOG, sj.TROPICAL], ids=lambda s: s.name)
def test_segment_sum_gradients_are_nan_free(semiring):
    values = jnp.array([-INF, -INF, 0.5, -1.0, 2.0])
    segments = jnp.array([0, 0, 1, 1, 2])
    with jax.debug_nans(True):
        grad = jax.grad(lambda v: jnp.sum(semiring.segment_sum(v, segments, 4)))(values)
        want = jax.vmap(jax.grad(lambda row: semiring.sum(row, axis=0)))(values[2:4][None])[0]
    np.testing.assert_array_equal(grad[:2], 0.0)  # an all-zero segment
    np.testing.assert_allclose(grad[2:4], want, rtol=1e-12)
    assert grad[4] == 1.0


# -- which path runs -----------------------------------------------------------------


PAIRS = [(sj.LOG, LOG_COPY, LOG_FAST), (sj.TROPICAL, TROPICAL_COPY, TROPICAL_FAST)]


@pytest.mark.parametrize("builtin, copy, fast", PAIRS, ids=["log", "tropical"])
def test_tot_score_paths_follow_the_declared_arithmetic(monkeypatch, builtin, copy, fast):
    fsa = random_fsa(0)

    def scores(semiring):
        value, grad = jax.value_and_grad(lambda w: sj.tot_score(fsa.replace(weight=w), semiring))(
            fsa.weight
        )
        return value, grad, sj.forward_scores(fsa, semiring), sj.backward_scores(fsa, semiring)

    want = scores(builtin)
    for semiring in (copy, fast):
        for mine, theirs in zip(scores(semiring), want):
            np.testing.assert_allclose(mine, theirs, rtol=1e-10, atol=1e-12)
    lowered = lambda s: jax.jit(lambda f: sj.tot_score(f, s)).lower(fsa).as_text()
    kernel = f"semiring_jax_{builtin.arithmetic}_total_f64"
    if loader.enabled():
        assert kernel in lowered(fast) and kernel in lowered(builtin)
    assert "semiring_jax_" not in lowered(copy)
    targets = ((level_pairs, "forward"), (level_scan, "forward_positions"))
    with scan_only():
        with calls(monkeypatch, *targets) as generic:
            sj.tot_score(fsa, copy)
        with calls(monkeypatch, *targets) as compensated:
            sj.tot_score(fsa, fast)
    assert generic["forward_positions"] and not generic["forward"]
    assert compensated["forward"] and not compensated["forward_positions"]


@pytest.mark.parametrize("builtin, copy, fast", PAIRS, ids=["log", "tropical"])
def test_dense_paths_follow_the_declared_arithmetic(monkeypatch, builtin, copy, fast):
    graph = sj.Fsa.from_arcs(
        [(0, 0, 0, 0.1), (0, 1, 1, -0.2), (1, 1, 1, 0.3), (1, 2, 2, 0.0), (2, 2, 0, 0.5)],
        final=[1, 2],
        dtype="float64",
    )
    emissions = jax.nn.log_softmax(jax.random.normal(jax.random.key(0), (2, 7, 3), jnp.float64))
    lengths = jnp.array([7, 5])

    def scores(semiring):
        return jax.value_and_grad(
            lambda e: jnp.sum(sj.dense_tot_score(graph, e, lengths, semiring))
        )(emissions)

    want = scores(builtin)
    # LOG's own compensated recursions: the frame scan's, and the arc
    # scan's in pairs (the CPU kernel's reference in LOG).
    targets = ((log_frame_scan, "forward"), (arc_scan, "_forward_pairs"), (frame_scan, "_forward"))
    with calls(monkeypatch, *targets) as generic:
        got_copy = scores(copy)
    with calls(monkeypatch, *targets) as log_scan:
        got_fast = scores(fast)
    for got in (got_copy, got_fast):
        for mine, theirs in zip(got, want):
            np.testing.assert_allclose(mine, theirs, rtol=1e-10, atol=1e-12)
    assert generic["_forward"] and not generic["forward"] and not generic["_forward_pairs"]
    if builtin is sj.LOG:  # only LOG has compensated dense scans of its own
        assert log_scan["forward"] + log_scan["_forward_pairs"] and not log_scan["_forward"]


@pytest.mark.parametrize(
    "builtin, copy",
    # One semiring in the default run (~20 s each): the fold is the same code.
    [PAIRS[0][:2], pytest.param(*PAIRS[1][:2], marks=pytest.mark.slow)],
    ids=["log", "tropical"],
)
def test_determinize_without_segment_sum_folds_plus(monkeypatch, builtin, copy):
    fsa = random_fsa(1)
    with calls(monkeypatch, (determinize, "_folded_segment_plus")) as folded:
        theirs = sj.determinize(fsa, builtin)
    assert not folded["_folded_segment_plus"]
    with calls(monkeypatch, (determinize, "_folded_segment_plus")) as folded:
        mine = sj.determinize(fsa, copy)
    assert folded["_folded_segment_plus"]
    assert mine.num_arcs == theirs.num_arcs and theirs.num_arcs < fsa.num_arcs
    np.testing.assert_array_equal(mine.label, theirs.label)
    np.testing.assert_allclose(mine.weight, theirs.weight, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(mine.final_weight, theirs.final_weight, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sj.tot_score(mine, builtin), sj.tot_score(fsa, builtin), rtol=1e-10)
    grads = [
        jax.grad(lambda w, s=s: sj.tot_score(sj.determinize(fsa.replace(weight=w), s), s))(
            fsa.weight
        )
        for s in (builtin, copy)
    ]
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-9, atol=1e-12)


def test_determinize_computes_in_the_given_semiring():
    # A selective ⊕ that is min, not max: determinize may not assume
    # TROPICAL's arithmetic for it (nor LOG's for a semiring without argsum).
    fsa = random_fsa(2)
    result = sj.determinize(fsa, MIN_PLUS)
    np.testing.assert_allclose(sj.tot_score(result, MIN_PLUS), sj.tot_score(fsa, MIN_PLUS))
    negated = fsa.replace(
        weight=-fsa.weight, final_weight=jnp.where(fsa.final_mask, -fsa.final_weight, -INF)
    )
    best = sj.determinize(negated, sj.TROPICAL)
    np.testing.assert_allclose(result.weight, -best.weight, rtol=1e-12)
    np.testing.assert_allclose(
        np.where(result.final_mask, result.final_weight, 0),
        np.where(best.final_mask, -best.final_weight, 0),
        rtol=1e-12,
    )


def test_times_is_addition_alone_shifts_the_dense_scan():
    # ⊕ commutes with a common shift wherever ⊗ is +: the dense scan keeps
    # MIN_PLUS's scores near 0 per frame (REAL's are never shifted) and
    # still gives the negated TROPICAL total.
    assert frame_scan._normalises(MIN_PLUS) and not frame_scan._normalises(REAL)
    graph = sj.Fsa.from_arcs(
        [(0, 0, 0, 0.1), (0, 1, 1, -0.2), (1, 1, 1, 0.3), (1, 2, 2, 0.0), (2, 2, 0, 0.5)],
        final=[1, 2],
        dtype="float64",
    )
    emissions = 40.0 * jax.random.normal(jax.random.key(1), (2, 30, 3), jnp.float64)
    lengths = jnp.array([30, 17])
    negated = graph.replace(
        weight=-graph.weight, final_weight=jnp.where(graph.final_mask, -graph.final_weight, -INF)
    )
    np.testing.assert_allclose(
        sj.dense_tot_score(graph, emissions, lengths, MIN_PLUS),
        -sj.dense_tot_score(negated, -emissions, lengths, sj.TROPICAL),
        rtol=1e-12,
    )


def test_determinize_names_the_missing_capability():
    with pytest.raises(ValueError, match=r"determinize: needs .* \(times_is_addition=True\).*real"):
        sj.determinize(random_fsa(0), REAL)
