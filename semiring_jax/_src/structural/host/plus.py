"""⊕ of LOG and TROPICAL scores in numpy, for the structural ops' weight
paths on concrete weights (nothing to differentiate, no device round trip).

A semiring declares which arithmetic it has with its `arithmetic` field
("log" or "tropical"); these compute that arithmetic in float64, NaN in
giving NaN out, an empty group the zero (-inf).
"""

from __future__ import annotations

import numpy as np

__all__ = ["run_plus", "segment_plus"]


def run_plus(values: np.ndarray, starts: np.ndarray, arithmetic: str) -> np.ndarray:
    """⊕ of the runs of `values` [N] that begin at `starts` [R] (increasing,
    starts[0] = 0, every run non-empty), float64 [R].

    Examples:
      >>> run_plus(np.array([0.0, 0.0, 1.0]), np.array([0, 2]), "log").round(4)
      array([0.6931, 1.    ])
    """
    top = np.maximum.reduceat(values, starts)
    if arithmetic == "tropical":
        return top
    safe = np.where(np.isfinite(top), top, 0.0)
    total = np.add.reduceat(
        np.exp(values - np.repeat(safe, np.diff(starts, append=values.size))), starts
    )
    with np.errstate(divide="ignore"):
        return np.log(total) + safe


def segment_plus(
    values: np.ndarray, segments: np.ndarray, num_segments: int, arithmetic: str
) -> np.ndarray:
    """⊕ of `values` [N] by segment id [N] (any order), float64 [num_segments].

    Examples:
      >>> segment_plus(np.array([0.0, 2.0, 0.0]), np.array([1, 0, 1]), 3, "tropical")
      array([  2.,   0., -inf])
    """
    values = np.asarray(values, np.float64)
    top = np.full(num_segments, -np.inf)
    np.maximum.at(top, segments, values)
    if arithmetic == "tropical":
        return top
    safe = np.where(np.isfinite(top), top, 0.0)
    total = np.zeros(num_segments)
    np.add.at(total, segments, np.exp(values - safe[segments]))
    with np.errstate(divide="ignore"):
        return np.log(total) + safe
