"""semiring_jax: weighted finite-state acceptors and transducers in JAX.

The public API (see API.md); everything else lives in `semiring_jax._src`.
"""

from semiring_jax import routes
from semiring_jax._src.core.batch import stack, unstack
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.semiring import LOG, TROPICAL, Semiring, semiring
from semiring_jax._src.core.semiring_laws import check_semiring_laws
from semiring_jax._src.decoding.edit_distance import edit_distance
from semiring_jax._src.decoding.mwer import mwer_loss
from semiring_jax._src.decoding.nbest import nbest
from semiring_jax._src.decoding.pruned import intersect_dense_pruned
from semiring_jax._src.decoding.sampling import sample_paths
from semiring_jax._src.dense.ctc import ctc_graph, ctc_loss, ctc_topo, forced_align
from semiring_jax._src.dense.dense import dense_tot_score, viterbi_decode
from semiring_jax._src.dense.lattice import intersect_dense
from semiring_jax._src.dense.occupancy import dense_occupancy
from semiring_jax._src.io.host.symbols import SymbolTable
from semiring_jax._src.io.npz import load, save
from semiring_jax._src.io.plot import plot_alignment
from semiring_jax._src.mmi.loss import mmi_loss
from semiring_jax._src.mmi.ngram import ngram_fsa, read_arpa
from semiring_jax._src.mmi.topology import denominator_graph, hmm_topo, numerator_graphs
from semiring_jax._src.scores.best_path import best_path
from semiring_jax._src.scores.entropy import entropy, kl_divergence
from semiring_jax._src.scores.kbest import kbest_scores, kbest_semiring
from semiring_jax._src.scores.tot_score import (
    arc_posteriors,
    backward_scores,
    forward_scores,
    tot_score,
)
from semiring_jax._src.structural.combine import concat, union
from semiring_jax._src.structural.compose import compose, intersect
from semiring_jax._src.structural.determinize import determinize
from semiring_jax._src.structural.epsilon import remove_epsilon
from semiring_jax._src.structural.linear import linear_fsa
from semiring_jax._src.structural.prune import prune
from semiring_jax._src.structural.unary import (
    arc_sort,
    closure,
    connect,
    invert,
    project,
    reverse,
    top_sort,
)
from semiring_jax._src.transducer.pruned import rnnt_loss_pruned
from semiring_jax._src.transducer.pruning import rnnt_prune, rnnt_prune_ranges
from semiring_jax._src.transducer.rnnt import rnnt_align, rnnt_loss
from semiring_jax._src.transducer.simple import rnnt_loss_simple, rnnt_loss_smoothed

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
    "check_semiring_laws",
    "closure",
    "compose",
    "concat",
    "connect",
    "ctc_graph",
    "ctc_loss",
    "ctc_topo",
    "denominator_graph",
    "dense_occupancy",
    "dense_tot_score",
    "determinize",
    "edit_distance",
    "entropy",
    "forced_align",
    "forward_scores",
    "hmm_topo",
    "intersect",
    "intersect_dense",
    "intersect_dense_pruned",
    "invert",
    "kbest_scores",
    "kbest_semiring",
    "kl_divergence",
    "linear_fsa",
    "load",
    "mmi_loss",
    "mwer_loss",
    "nbest",
    "ngram_fsa",
    "numerator_graphs",
    "plot_alignment",
    "project",
    "prune",
    "read_arpa",
    "remove_epsilon",
    "reverse",
    "rnnt_align",
    "rnnt_loss",
    "rnnt_loss_pruned",
    "rnnt_loss_simple",
    "rnnt_loss_smoothed",
    "rnnt_prune",
    "rnnt_prune_ranges",
    "routes",
    "sample_paths",
    "save",
    "semiring",
    "stack",
    "top_sort",
    "tot_score",
    "union",
    "unstack",
    "viterbi_decode",
]
