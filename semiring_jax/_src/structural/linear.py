"""Linear (single-path) FSAs."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from semiring_jax._src.core import checks
from semiring_jax._src.core.fsa import Fsa, assemble
from semiring_jax._src.core.host import build

__all__ = ["linear_fsa"]

_INT32_MAX = int(np.iinfo(np.int32).max)


def linear_fsa(labels: npt.ArrayLike, *, dtype: npt.DTypeLike = np.float32) -> Fsa:
    """The acceptor of one label sequence: states 0..U, arc t reads labels[t].

    Arc weights are 0.0 and state U is final with weight 0.0, so the total
    score is 0.0 in any log-domain semiring; feed scores with `replace`.

    Args:
      labels: int [U], non-negative.
      dtype: float32 (default) or float64.
    Returns:
      An unbatched acceptor with U + 1 states and U arcs.
    Raises:
      ValueError: if `labels` is not one-dimensional or holds a negative or
        non-integer value, or one above `2**31 - 1` (labels are int32; naming
        its position).
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.linear_fsa([3, 1, 4])
      >>> print(fsa.src, fsa.dst, fsa.label)
      [0 1 2] [1 2 3] [3 1 4]
    """
    dtype = checks.check_float_dtype(dtype, "dtype", "linear_fsa")
    labels = np.asarray(checks.concrete(labels, "labels", "linear_fsa"))
    if labels.ndim != 1:
        raise ValueError(f"linear_fsa: labels must have shape [U], got {labels.shape}")
    try:
        # float64 holds every int32 exactly; larger values are refused below.
        values = labels.astype(np.float64) if labels.dtype != bool else labels.astype(int)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(
            f"linear_fsa: labels must hold integers, got dtype {labels.dtype}"
        ) from None
    bad = np.flatnonzero(
        ~np.isfinite(values) | (values < 0) | (values > _INT32_MAX) | (values != np.round(values))
    )
    if len(bad):
        raise ValueError(
            f"linear_fsa: labels[{bad[0]}] = {labels[bad[0]]}; expected a non-negative integer "
            f"(int32: at most 2**31 - 1)"
        )
    num_arcs = labels.shape[0]
    steps = np.arange(num_arcs, dtype=np.int32)
    final_weight = np.full(num_arcs + 1, -np.inf, dtype)
    final_weight[-1] = 0.0
    arrays = build.ArcArrays(
        num_arcs + 1,
        steps,
        steps + 1,
        labels.astype(np.int32),
        labels.astype(np.int32),
        np.zeros(num_arcs, dtype),
        final_weight,
        True,
    )
    return assemble(arrays)
