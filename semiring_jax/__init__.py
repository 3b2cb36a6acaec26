"""semiring_jax: weighted finite-state acceptors and transducers in JAX.

The public API (see API.md); everything else lives in `semiring_jax._src`.
"""

from semiring_jax._src.batch import stack, unstack
from semiring_jax._src.best_path import best_path
from semiring_jax._src.fsa import Fsa
from semiring_jax._src.linear import linear_fsa
from semiring_jax._src.semiring import LOG, TROPICAL, Semiring, semiring
from semiring_jax._src.tot_score import (arc_posteriors, backward_scores, forward_scores,
                                         tot_score)

__version__ = "0.1.0"

__all__ = [
    "Fsa",
    "LOG",
    "Semiring",
    "TROPICAL",
    "arc_posteriors",
    "backward_scores",
    "best_path",
    "forward_scores",
    "linear_fsa",
    "semiring",
    "stack",
    "tot_score",
    "unstack",
]
