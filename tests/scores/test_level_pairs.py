"""Deep FSAs: float32 scores and posteriors at 10,000 and 100,000 levels, on
the kernels and on the portable compensated level scans (GPU and TPU's
path), against exact float64 values."""

import functools

import jax
import numpy as np
import pytest

import semiring_jax as sj
from tests.paths import both_paths


@functools.cache
def parallel_chain(levels):
    """A chain of `levels` steps with two parallel arcs per step, weights
    N(0, 9) in float32, and its exact (float64) LOG and TROPICAL totals and
    posteriors."""
    rng = np.random.default_rng(levels)
    weight = rng.normal(0, 3, size=(levels, 2)).astype(np.float32)
    steps = np.arange(levels)
    arcs = np.stack(
        [np.repeat(steps, 2), np.repeat(steps + 1, 2), np.tile([1, 2], levels), weight.reshape(-1)],
        axis=1,
    )
    fsa = sj.Fsa.from_arcs(arcs, final=[levels], dtype=np.float32)
    exact = weight.astype(np.float64)
    step_total = np.logaddexp(exact[:, 0], exact[:, 1])
    log = (step_total.sum(), np.exp(exact - step_total[:, None]).reshape(-1))
    best = np.argmax(exact, axis=1)
    tropical = (exact.max(axis=1).sum(), (np.arange(2) == best[:, None]).reshape(-1))
    return fsa, {"log": log, "tropical": tropical}


@pytest.mark.parametrize("levels", [10_000, 100_000])
@pytest.mark.parametrize("name", ["log", "tropical"])
def test_deep_chains_keep_float32_accurate_on_every_path(levels, name):
    semiring = sj.semiring(name)
    fsa, exact = parallel_chain(levels)
    total, posteriors = exact[name]

    def run(fsa):
        return sj.tot_score(fsa, semiring), sj.arc_posteriors(fsa, semiring)

    for got_total, got_posteriors in both_paths(jax.jit(run), fsa):
        # The float32 total is the exact one, rounded (half a spacing).
        assert abs(float(got_total) - total) <= np.spacing(np.float32(total)) / 2 * 1.01
        assert got_posteriors.min() >= 0 and got_posteriors.max() <= 1
        # The bound is 1e-4; measured: 5e-7 on the scan, 5e-8 on the kernel.
        assert np.abs(got_posteriors - posteriors).max() <= 2e-6


def test_forward_and_backward_scores_of_a_deep_chain():
    fsa, exact = parallel_chain(10_000)
    forward, backward = both_paths(
        jax.jit(lambda f: (sj.forward_scores(f)[-1], sj.backward_scores(f)[0])), fsa
    )
    for values in (*forward, *backward):
        assert abs(float(values) - exact["log"][0]) <= np.spacing(np.float32(exact["log"][0]))
