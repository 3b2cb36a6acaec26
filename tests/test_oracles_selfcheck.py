"""Cross-checks of the test oracles against each other and against OpenFst."""

import math

import numpy as np
import pytest

import oracles

# OpenFst "log"/"standard" weights are float32.
F32_TOL = dict(rtol=1e-5, atol=1e-5)

PARALLEL = (2, [(0, 1, 1, 1, 0.5), (0, 1, 2, 2, 1.0)], {1: 0.0})


def _dags(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return [
        oracles.random_dag(rng, int(rng.integers(1, 10)), int(rng.integers(0, 25)))
        for _ in range(n)
    ]


def test_hand_example():
    expect = 1.4740769841801067
    assert oracles.brute_tot_score(*PARALLEL, "log") == pytest.approx(expect, abs=1e-15)
    assert oracles.brute_tot_score(*PARALLEL, "tropical") == 1.0
    real_arcs = [(0, 1, 1, 1, 0.5), (0, 1, 2, 2, 2.0)]
    assert oracles.brute_tot_score(2, real_arcs, {1: 3.0}, "real") == 7.5
    assert oracles.openfst_tot_score(*PARALLEL, "log") == pytest.approx(expect, rel=1e-5)
    assert oracles.openfst_tot_score(*PARALLEL, "log64") == pytest.approx(expect, abs=1e-8)
    assert oracles.openfst_tot_score(*PARALLEL, "tropical") == 1.0
    assert oracles.brute_best_path(*PARALLEL) == ([1], 1.0)
    p = oracles.brute_arc_posteriors(*PARALLEL, "log")
    np.testing.assert_allclose(p, np.exp([0.5, 1.0]) / np.exp([0.5, 1.0]).sum())


def test_no_path():
    fsa = (3, [(0, 1, 1, 1, 0.5), (2, 1, 1, 1, 0.1)], {2: 0.0})
    for sr in ("log", "tropical"):
        assert oracles.brute_tot_score(*fsa, sr) == -math.inf
        assert oracles.openfst_tot_score(*fsa, sr) == -math.inf
        np.testing.assert_array_equal(oracles.brute_arc_posteriors(*fsa, sr), 0.0)
        np.testing.assert_array_equal(
            oracles.openfst_shortest_distance(*fsa, sr), [0.0, 0.5, -math.inf]
        )
    assert oracles.brute_tot_score(*fsa, "real") == 0.0
    assert oracles.brute_best_path(*fsa) == ([], -math.inf)


def test_start_final_and_neg_inf_arc():
    fsa = (3, [(0, 1, 1, 1, 1.0), (1, 2, 1, 1, -math.inf)], {0: 0.25, 1: 2.0, 2: 0.0})
    expect = np.logaddexp(0.25, 3.0)
    assert oracles.brute_tot_score(*fsa, "log") == pytest.approx(expect, abs=1e-15)
    assert oracles.openfst_tot_score(*fsa, "log") == pytest.approx(expect, rel=1e-5)
    np.testing.assert_allclose(
        oracles.openfst_shortest_distance(*fsa, "log"), [0.0, 1.0, -math.inf]
    )
    np.testing.assert_allclose(
        oracles.openfst_shortest_distance(*fsa, "log", reverse=True), [expect, 2.0, 0.0], **F32_TOL
    )
    assert oracles.brute_best_path(*fsa) == ([0], 3.0)
    assert oracles.brute_best_path(1, [], {0: 0.5}) == ([], 0.5)
    assert sorted(oracles.enumerate_paths(*fsa)) == [((), 0.25), ((0,), 3.0), ((0, 1), -math.inf)]


def test_cycle_raises():
    with pytest.raises(ValueError):
        oracles.enumerate_paths(2, [(0, 1, 1, 1, 0.0), (1, 0, 1, 1, 0.0)], {1: 0.0})
    paths = oracles.enumerate_paths(2, [(0, 1, 1, 1, 0.0), (1, 0, 1, 1, 0.0)], {1: 0.0}, max_len=3)
    assert sorted(p for p, _ in paths) == [(0,), (0, 1, 0)]


@pytest.mark.parametrize("semiring", ["log", "tropical"])
def test_brute_vs_openfst(semiring):
    for fsa in _dags():
        tot = oracles.brute_tot_score(*fsa, semiring)
        assert oracles.openfst_tot_score(*fsa, semiring) == pytest.approx(tot, rel=1e-5, abs=1e-5)
        np.testing.assert_allclose(
            oracles.openfst_shortest_distance(*fsa, semiring),
            oracles.brute_forward_scores(*fsa, semiring),
            **F32_TOL,
        )
        bwd = oracles.brute_backward_scores(*fsa, semiring)
        np.testing.assert_allclose(
            oracles.openfst_shortest_distance(*fsa, semiring, reverse=True), bwd, **F32_TOL
        )
        assert bwd[0] == tot
        if semiring == "log":
            bwd64 = oracles.openfst_shortest_distance(*fsa, "log64", reverse=True)
            np.testing.assert_allclose(bwd64, bwd, rtol=1e-8, atol=1e-8)


def test_real_matches_log():
    for n, arcs, final in _dags(seed=1):
        exp_arcs = [(s, d, i, o, math.exp(w)) for s, d, i, o, w in arcs]
        exp_final = {s: math.exp(w) for s, w in final.items()}
        for fn in (oracles.brute_forward_scores, oracles.brute_backward_scores):
            np.testing.assert_allclose(
                fn(n, exp_arcs, exp_final, "real"), np.exp(fn(n, arcs, final, "log")), rtol=1e-12
            )


def test_posteriors_and_best_path():
    rng = np.random.default_rng(2)
    for n, arcs, final in _dags(seed=2):
        # Integer weights produce many exact ties in the tropical semiring.
        arcs = [(s, d, i, o, float(rng.integers(-2, 3))) for s, d, i, o, _ in arcs]
        final = {s: float(rng.integers(-1, 2)) for s in final}
        paths = oracles.enumerate_paths(n, arcs, final)
        ends = {p: (arcs[p[-1]][1] if p else 0) for p, _ in paths}
        best = max(s for _, s in paths)
        key = min((ends[p], p[::-1]) for p, s in paths if s == best)
        assert oracles.brute_best_path(n, arcs, final) == (list(key[1][::-1]), best)
        post = oracles.brute_arc_posteriors(n, arcs, final, "log")
        z = oracles.brute_tot_score(n, arcs, final, "log")
        for k in range(len(arcs)):
            through = [s for p, s in paths if k in p]
            assert post[k] == pytest.approx(math.fsum(math.exp(s - z) for s in through), abs=1e-12)
        assert np.all(post <= 1.0 + 1e-12)


def test_random_dag_is_trim():
    rng = np.random.default_rng(3)
    n, arcs, final = oracles.random_dag(rng, 300, 2000)
    assert len(arcs) == 2000 and len(final) == 3 and n - 1 in final
    assert all(s < d and 1 <= i == o <= 20 for s, d, i, o, _ in arcs)
    fwd = oracles.openfst_shortest_distance(n, arcs, final, "tropical")
    bwd = oracles.openfst_shortest_distance(n, arcs, final, "tropical", reverse=True)
    assert np.all(np.isfinite(fwd)) and np.all(np.isfinite(bwd))
    tot32, tot64 = (oracles.openfst_tot_score(n, arcs, final, t) for t in ("log", "log64"))
    assert tot32 == pytest.approx(tot64, rel=1e-5)
