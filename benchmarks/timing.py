"""Timing helpers shared by the benchmark scripts (median of round-robin calls).

Two ways to time, both interleaving the contestants round by round so that
machine drift hits all of them alike:

* cold (`burst=1`): one call per contestant per round. Every call starts
  right after the other contestants ran, with caches, branch predictors and
  JAX's dispatch path cold. On the 2-core VM used here this adds about
  0.1-0.5 ms to any JAX call, whatever its work: `jnp.ones(5000) * 2`
  takes 8 us back-to-back and about 200 us after 5 ms of other Python work.
* warm (`burst=k`): k back-to-back calls per contestant per round, the
  first untimed: the steady state of a loop that calls the op repeatedly,
  as a training step or a decoder does.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Reps:
    """Repetition policy: each contestant runs at least `min_runs` and at most
    `max_runs` timed calls, stopping early once `budget_s` of them is spent."""

    min_runs: int
    max_runs: int
    budget_s: float


def interleaved_medians(
    contestants: dict[str, Callable[[], Any]], reps: Reps, burst: int = 1
) -> dict[str, float]:
    """Median seconds per call of each contestant, timed round-robin.

    Each callable must block until its result is ready. One untimed warm-up
    call each first. Rounds interleave the contestants so that machine drift
    hits all of them alike; slow ones drop out when their budget is spent.
    With `burst` > 1, each contestant's turn is `burst` back-to-back calls,
    the first untimed (see the module docstring). Each result is freed
    after its timing stops (freeing large outputs is not the contestant's
    work) and before the next call.
    """
    for fn in contestants.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in contestants}

    def done(name: str) -> bool:
        runs = len(samples[name])
        return runs >= reps.max_runs or (
            runs >= reps.min_runs and sum(samples[name]) >= reps.budget_s
        )

    gc.collect()
    while not all(done(name) for name in contestants):
        for name, fn in contestants.items():
            if done(name):
                continue
            if burst > 1:
                fn()  # the turn's untimed first call; its result is dropped at once
            for _ in range(max(burst - 1, 1)):
                if done(name):
                    break
                start = time.perf_counter()
                out = fn()
                samples[name].append(time.perf_counter() - start)
                del out
    return {name: statistics.median(values) for name, values in samples.items()}


def first_call_seconds(fn: Callable[[], Any]) -> float:
    """Wall time of one call: for a fresh jitted function, trace + compile + run."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_seconds(fn: Callable[[], Any], runs: int) -> float:
    """Median wall time of `runs` calls of `fn`, after one warm-up call."""
    fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
