"""semiring_jax: weighted finite-state acceptors and transducers in JAX.

The public API (see API.md); everything else lives in `semiring_jax._src`.
"""

from semiring_jax._src.algorithms import (
    arc_sort,
    closure,
    compose,
    concat,
    connect,
    intersect,
    invert,
    project,
    prune,
    reverse,
    top_sort,
    union,
)
from semiring_jax._src.batch import stack, unstack
from semiring_jax._src.best_path import best_path
from semiring_jax._src.ctc import ctc_graph, ctc_loss, ctc_topo, forced_align
from semiring_jax._src.dense import dense_tot_score, viterbi_decode
from semiring_jax._src.determinize import determinize
from semiring_jax._src.epsilon import remove_epsilon
from semiring_jax._src.fsa import Fsa
from semiring_jax._src.host.symbols import SymbolTable
from semiring_jax._src.lattice import intersect_dense
from semiring_jax._src.linear import linear_fsa
from semiring_jax._src.occupancy import dense_occupancy
from semiring_jax._src.plot import plot_alignment
from semiring_jax._src.semiring import LOG, TROPICAL, Semiring, semiring
from semiring_jax._src.serialization import load, save
from semiring_jax._src.tot_score import arc_posteriors, backward_scores, forward_scores, tot_score

# The one source of the version: pyproject.toml reads this literal statically.
__version__ = "0.1.0"

__all__ = [
    "LOG",
    "TROPICAL",
    "Fsa",
    "Semiring",
    "SymbolTable",
    "arc_posteriors",
    "arc_sort",
    "backward_scores",
    "best_path",
    "closure",
    "compose",
    "concat",
    "connect",
    "ctc_graph",
    "ctc_loss",
    "ctc_topo",
    "dense_occupancy",
    "dense_tot_score",
    "determinize",
    "forced_align",
    "forward_scores",
    "intersect",
    "intersect_dense",
    "invert",
    "linear_fsa",
    "load",
    "plot_alignment",
    "project",
    "prune",
    "remove_epsilon",
    "reverse",
    "save",
    "semiring",
    "stack",
    "top_sort",
    "tot_score",
    "union",
    "unstack",
    "viterbi_decode",
]
