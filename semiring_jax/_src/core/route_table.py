"""Every op's routes: the one table of which implementation runs where.

Each record lists an op's routes in order of preference (`core/routes.py`
says how one is chosen); the ops dispatch through them, and the docs'
route table (docs/routes.md) is generated from them by
`semiring_jax.routes.markdown()`, which a test compares with the page.
Route names say where the code lives:

- cpu_kernel: the compiled C++ kernels of `kernels/` through the XLA FFI
  (CPU only; built on first use);
- host_kernel: plain C functions of the same library, called on numpy
  arrays outside any XLA program (a process whose default backend is the
  CPU);
- level_scan: the compensated level recursion of `scores/` over an acyclic
  Fsa's levels;
- frame_scan: the dense recursion of `dense/frame_scan.py`, a frame a step;
- arc_scan: the dense LOG recursion of `dense/arc_scan.py` over arcs in
  linear space, scaled per frame;
- leaky_scan: Kaldi's leaky HMM by the frame scan (`mmi/leaky.py`);
- diagonal_scan: the transducer grid a diagonal a step
  (`transducer/diagonal_scan.py`);
- traced_search and numpy: the portable beam search and lattice of
  `intersect_dense_pruned`, and `nbest`'s numpy search.
"""

from __future__ import annotations

from semiring_jax._src.core.routes import KERNEL_DTYPES, Op, Route, register

__all__ = ["RECORDS"]

_LOG_OR_TROPICAL = ("log", "tropical")


def _cpu_kernel(arithmetics: tuple[str | None, ...] | None = None, note: str = "") -> Route:
    return Route(
        "cpu_kernel", ("cpu",), KERNEL_DTYPES, arithmetics=arithmetics, kernels=True, note=note
    )


TOT_SCORE = Op(
    "tot_score",
    (_cpu_kernel(_LOG_OR_TROPICAL), Route("level_scan")),
    reference="level_scan",
)
KBEST_SCORES = Op("kbest_scores", (_cpu_kernel(), Route("level_scan")), reference="level_scan")
ENTROPY = Op("entropy", (_cpu_kernel(), Route("level_scan")), reference="level_scan")
CTC_LOSS = Op("ctc_loss", (_cpu_kernel(), Route("frame_scan")), reference="frame_scan")
TRANSDUCER_GRID = Op(
    "transducer_grid", (_cpu_kernel(), Route("diagonal_scan")), reference="diagonal_scan"
)
DENSE_TOT_SCORE = Op(
    "dense_tot_score",
    (
        _cpu_kernel(_LOG_OR_TROPICAL),
        Route("arc_scan", arithmetics=("log",)),
        Route("frame_scan"),
    ),
    reference="frame_scan",
)
VITERBI_DECODE = Op("viterbi_decode", (_cpu_kernel(), Route("frame_scan")), reference="frame_scan")
LEAKY_MMI = Op(
    "leaky_mmi",
    (_cpu_kernel(), Route("arc_scan"), Route("leaky_scan")),
    reference="leaky_scan",
)
PRUNED_SEARCH = Op(
    "intersect_dense_pruned",
    (
        Route(
            "host_kernel", ("cpu",), KERNEL_DTYPES, kernels=True, note="on numpy data, outside XLA"
        ),
        Route("traced_search"),
    ),
    reference="traced_search",
)
NBEST = Op(
    "nbest",
    (
        Route("host_kernel", ("cpu",), kernels=True, note="on numpy data, outside XLA"),
        Route("numpy"),
    ),
    reference="numpy",
)

# Record -> the public functions that run it.
RECORDS: dict[Op, tuple[str, ...]] = {
    TOT_SCORE: ("tot_score", "arc_posteriors"),
    KBEST_SCORES: ("kbest_scores",),
    ENTROPY: ("entropy",),
    CTC_LOSS: ("ctc_loss",),
    TRANSDUCER_GRID: ("rnnt_loss", "rnnt_loss_simple", "rnnt_loss_smoothed", "rnnt_loss_pruned"),
    DENSE_TOT_SCORE: (
        "dense_tot_score",
        "mmi_loss (numerators; the denominator where leaky_hmm = 0)",
    ),
    VITERBI_DECODE: ("viterbi_decode",),
    LEAKY_MMI: ("mmi_loss (the denominator where leaky_hmm > 0)",),
    PRUNED_SEARCH: ("intersect_dense_pruned",),
    NBEST: ("nbest",),
}

register(*RECORDS)
