"""Kaldi's chain HMM topology, and the denominator and numerator graphs
built from it by composition (pdf ids as labels, ready for
`dense_tot_score`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from semiring_jax._src.core import checks
from semiring_jax._src.core.batch import stack
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.structural.compose import compose
from semiring_jax._src.structural.linear import linear_fsa
from semiring_jax._src.structural.unary import project

__all__ = ["denominator_graph", "hmm_topo", "numerator_graphs"]

_INT32_MAX = int(np.iinfo(np.int32).max)


def hmm_topo(num_phones: int, *, pdfs_per_phone: int = 2, dtype: npt.DTypeLike = np.float32) -> Fsa:
    """Kaldi's chain topology for every phone, as a transducer from pdf ids
    (plus one) to phones.

    Each phone is one emitting HMM state: its first frame emits the phone's
    forward pdf, each later frame its self-loop pdf, so a phone lasts one
    frame or more. With `pdfs_per_phone=2` phone p (1-based) has forward
    pdf 2 (p - 1) and self-loop pdf 2 (p - 1) + 1; with 1, pdf p - 1 for
    both. There are `num_phones * pdfs_per_phone` pdfs.

    States: 0, before the first phone, and p, inside phone p. Arcs: from
    state 0 and from every phone state q to state p, input forward(p) + 1,
    output p (the frame that starts phone p); from state p to itself,
    input self-loop(p) + 1, output 0 (epsilon: a later frame of the same
    phone). Input labels are shifted by one so that label 0 stays epsilon
    for `sj.compose`; every arc consumes a frame, and `denominator_graph`
    and `numerator_graphs` shift the labels back. All states are final
    (state 0: the empty phone sequence, of no frames). No weights: chain
    training ignores transition probabilities.

    Args:
      num_phones: P >= 1.
      pdfs_per_phone: 2 (Kaldi's chain default) or 1.
      dtype: float32 (default) or float64.
    Returns:
      A cyclic transducer with P + 1 states and P^2 + 2 P arcs, weights 0.
    Raises:
      ValueError: for `num_phones` < 1 or `pdfs_per_phone` not 1 or 2.
    Examples:
      >>> import semiring_jax as sj
      >>> topo = sj.hmm_topo(2)
      >>> topo
      Fsa(transducer, num_states=3, num_arcs=8, cyclic)
      >>> print(topo.ilabel[:4], topo.olabel[:4])  # from state 0, then the self-loops
      [1 3 2 4] [1 2 0 0]
    """
    fn = "hmm_topo"
    dtype = checks.check_float_dtype(dtype, "dtype", fn)
    num_phones = checks.check_int(num_phones, "num_phones", fn, 1)
    if isinstance(pdfs_per_phone, bool) or pdfs_per_phone not in (1, 2):
        raise ValueError(f"{fn}: pdfs_per_phone must be 1 or 2, got {pdfs_per_phone!r}")
    if num_phones * pdfs_per_phone > _INT32_MAX:
        raise ValueError(f"{fn}: num_phones * pdfs_per_phone is above 2**31 - 1 pdf ids")
    phones = np.arange(1, num_phones + 1)
    forward = (phones - 1) * pdfs_per_phone + 1  # pdf id + 1
    loop = forward + (pdfs_per_phone - 1)
    zeros = np.zeros_like(phones)
    # Entering phone p from state 0, then each phone's self-loop, then
    # phone q followed by phone p.
    sources, targets = (grid.reshape(-1) for grid in np.meshgrid(phones, phones, indexing="ij"))
    arcs = np.concatenate(
        [
            np.stack([zeros, phones, forward, phones], axis=1),
            np.stack([phones, phones, loop, zeros], axis=1),
            np.stack([sources, targets, forward[targets - 1], targets], axis=1),
        ]
    )
    rows = np.concatenate([arcs, np.zeros((len(arcs), 1), arcs.dtype)], axis=1)
    return Fsa.from_arcs(
        rows.astype(np.float64),
        final=list(range(num_phones + 1)),
        num_states=num_phones + 1,
        dtype=dtype,
    )


def _check_topo(topo: Any, fn: str) -> set[int]:
    """The phones a topology writes; it must be an
    unbatched transducer (or acceptor) whose every arc consumes a frame."""
    if not isinstance(topo, Fsa):
        raise ValueError(f"{fn}: topo must be an Fsa (see sj.hmm_topo), got {type(topo).__name__}")
    if topo.batch_shape:
        raise ValueError(f"{fn}: topo must be unbatched, got batch_shape {topo.batch_shape}")
    real = np.flatnonzero(np.asarray(topo.arc_mask))
    ilabel = np.asarray(topo.ilabel)[real]
    if np.any(ilabel == 0):
        arc = int(real[np.flatnonzero(ilabel == 0)[0]])
        raise ValueError(
            f"{fn}: topo arc {arc} has input label 0 (epsilon); every topology arc "
            f"consumes a frame, its input label being the pdf id + 1"
        )
    olabel = np.asarray(topo.olabel)[real]
    return {int(label) for label in olabel[olabel != 0]}


def _pdf_acceptor(fsa: Fsa) -> Fsa:
    """The input side of a topology composition, labels pdf id + 1 made
    pdf ids (padding arcs keep label 0)."""
    acceptor = project(fsa, "input")
    mask = np.asarray(acceptor.arc_mask)
    label = np.where(mask, np.asarray(acceptor.ilabel) - 1, 0).astype(np.int32)
    return acceptor.replace(ilabel=label, olabel=label)


def denominator_graph(lm: Fsa, topo: Fsa) -> Fsa:
    """The LF-MMI denominator graph: the topology composed with a phone LM.

    `sj.compose(topo, lm)`, projected on its input side (pdf id + 1) and
    shifted to 0-based pdf ids. A path of T frames is a phone sequence
    with a duration per phone; its score is the LM's score of that phone
    sequence: each phone's first frame carries its LM arc's weight, later
    frames weigh 0, and the final weight is the LM's (ln P(</s> | h) for
    `sj.ngram_fsa`). With an LM that has one path per phone sequence (as
    `sj.ngram_fsa` and `sj.read_arpa(..., expand=True)` build), the paths
    are exactly the alignments of the phone sequences, each once.

    Args:
      lm: an unbatched, epsilon-free acceptor over phones (labels the topo
        writes), weights ln P (e.g. `sj.ngram_fsa`).
      topo: an unbatched topology whose every arc consumes a frame (input
        label = pdf id + 1), e.g. `sj.hmm_topo`; same dtype as `lm`.
    Returns:
      An epsilon-free acceptor, start state 0, label = pdf id in
      [0, num_pdfs): the graph of `sj.dense_tot_score(graph, log_probs,
      lengths)` with log_probs [B, T, num_pdfs]. With `sj.hmm_topo(P)`
      (two pdfs per phone) and a deterministic LM it is deterministic.
    Raises:
      ValueError: for an `lm` that is not an unbatched acceptor, holds an
        epsilon arc (a back-off arc of `sj.read_arpa`: read it with
        `expand=True`) or a phone the topo does not write (naming the arc),
        for a topo arc with input label 0, or for dtypes that differ.
    Examples:
      >>> import jax
      >>> import jax.numpy as jnp
      >>> import numpy as np
      >>> import semiring_jax as sj
      >>> lm = sj.ngram_fsa([[1, 2], [2]], num_symbols=2)
      >>> graph = sj.denominator_graph(lm, sj.hmm_topo(2))
      >>> graph.num_states, graph.is_acceptor, int(graph.label.max())
      (3, True, 3)
      >>> # Two frames: phone 1's forward pdf 0, then phone 2's forward pdf 2.
      >>> frames = jax.nn.one_hot(jnp.array([[0, 2]]), 4) > 0
      >>> log_probs = jnp.where(frames, 0.0, -jnp.inf).astype(jnp.float32)
      >>> den = sj.dense_tot_score(graph, log_probs)[0]
      >>> phones = sj.tot_score(sj.intersect(sj.linear_fsa([1, 2]), lm))  # ln P(1 2 </s>)
      >>> print(np.round(float(den), 4) == np.round(float(phones), 4), np.round(float(den), 4))
      True -1.569
    """
    fn = "denominator_graph"
    phones = _check_topo(topo, fn)
    if not isinstance(lm, Fsa) or lm.batch_shape or not lm.is_acceptor:
        raise ValueError(f"{fn}: lm must be an unbatched acceptor (see sj.ngram_fsa)")
    if lm.dtype != topo.dtype:
        raise ValueError(f"{fn}: lm is {lm.dtype} but topo is {topo.dtype}; they must match")
    lm_real = np.flatnonzero(np.asarray(lm.arc_mask))
    labels = np.asarray(lm.ilabel)[lm_real]
    if np.any(labels == 0):
        arc = int(lm_real[np.flatnonzero(labels == 0)[0]])
        raise ValueError(
            f"{fn}: lm arc {arc} has label 0 (epsilon), e.g. an ARPA back-off arc; the graph "
            f"must be epsilon-free with exact LM scores: read the ARPA model with "
            f"sj.read_arpa(..., expand=True)"
        )
    unknown = np.flatnonzero(~np.isin(labels, sorted(phones)))
    if unknown.size:
        arc = int(lm_real[unknown[0]])
        raise ValueError(
            f"{fn}: lm arc {arc} has label {int(labels[unknown[0]])}, a phone the topo "
            f"does not write (it writes {min(phones, default=0)}..{max(phones, default=0)})"
        )
    return _pdf_acceptor(compose(topo, lm))


def _phone_rows(phone_sequences: Any, lengths: Any, phones: set[int], fn: str) -> list[np.ndarray]:
    """The B phone sequences, each checked against the topo's phones."""
    if lengths is None:
        checks.check_not_traced(phone_sequences, "phone_sequences", fn)
        if hasattr(phone_sequences, "shape"):
            array = np.asarray(phone_sequences)
            rows = list(array) if array.ndim == 2 else [array]
        else:
            rows = [np.asarray(row) for row in phone_sequences]
    else:
        array = checks.concrete(phone_sequences, "phone_sequences", fn)
        if array.ndim != 2:
            raise ValueError(f"{fn}: phone_sequences must have shape [B, N], got {array.shape}")
        counts = checks.concrete(lengths, "lengths", fn)
        if counts.shape != (array.shape[0],) or (counts.size and counts.dtype.kind not in "iu"):
            raise ValueError(
                f"{fn}: lengths must be int [B] = [{array.shape[0]}], got shape "
                f"{counts.shape} and dtype {counts.dtype}"
            )
        bad = np.flatnonzero((counts < 0) | (counts > array.shape[1]))
        if bad.size:
            raise ValueError(
                f"{fn}: lengths[{bad[0]}] = {counts[bad[0]]} is outside [0, N] = "
                f"[0, {array.shape[1]}]"
            )
        rows = [array[b, :n] for b, n in enumerate(counts.tolist())]
    if not rows:
        raise ValueError(f"{fn}: phone_sequences is empty; a batch needs B >= 1")
    for b, row in enumerate(rows):
        if row.ndim != 1 or (row.size and row.dtype.kind not in "iu"):
            raise ValueError(
                f"{fn}: phone_sequences[{b}] must hold integers [N], got shape {row.shape} "
                f"and dtype {row.dtype}"
            )
        bad = np.flatnonzero(~np.isin(row, sorted(phones)))
        if bad.size:
            raise ValueError(
                f"{fn}: phone_sequences[{b}, {bad[0]}] = {row[bad[0]]} is not a phone of the "
                f"topo (it writes {min(phones, default=0)}..{max(phones, default=0)})"
            )
    return rows


def numerator_graphs(
    phone_sequences: npt.ArrayLike | Sequence[Sequence[int]],
    lengths: npt.ArrayLike | None,
    topo: Fsa,
    *,
    bucket: bool = False,
) -> Fsa:
    """The LF-MMI numerator graphs: each utterance's phones composed with
    the topology.

    Entry b is `sj.compose(topo, sj.linear_fsa(phones_b))`, projected on its
    input side and shifted to 0-based pdf ids, weights 0. With
    `sj.hmm_topo` its paths of T frames are exactly the alignments of the
    phone sequence to T frames, each once: every phone lasts one frame or
    more, its first frame the forward pdf, later ones the self-loop pdf.
    So `sj.dense_tot_score(graphs, log_probs, lengths)` is the log-sum over
    alignments, -inf where there is none (T below the number of phones).
    An empty sequence (length 0) gives the start state alone, final: the
    empty alignment of 0 frames, and no path of T > 0 frames.

    Args:
      phone_sequences: int [B, N], padded phone sequences (phones the topo
        writes), or with `lengths=None` a sequence of B sequences (lists or
        int arrays [N_b]) or one [B, N] array used whole.
      lengths: int [B], phones per utterance in [0, N], or None.
      topo: the topology, e.g. `sj.hmm_topo` (as in `denominator_graph`).
      bucket: pad to the ladder of sizes of `sj.stack(..., bucket=True)`, so
        that a training loop compiles few programs.
    Returns:
      A batched epsilon-free acceptor (`sj.stack` of B entries), labels the
      pdf ids in [0, num_pdfs), dtype the topo's.
    Raises:
      ValueError: for a `phone_sequences` not of shape [B, N] with
        `lengths`, lengths not int [B] in [0, N], an empty batch, a value
        that is not a phone of the topo (naming [b, i]), or a topo arc with
        input label 0.
    Examples:
      >>> import jax.numpy as jnp
      >>> import numpy as np
      >>> import semiring_jax as sj
      >>> graphs = sj.numerator_graphs([[1, 2], [2, 0]], [2, 1], sj.hmm_topo(2))
      >>> graphs.batch_shape, graphs.num_states
      ((2,), 3)
      >>> # Uniform log_probs over 4 pdfs, 3 frames: 2 alignments of [1, 2],
      >>> # 1 of [2]; each alignment has probability (1/4)^3.
      >>> log_probs = jnp.full((2, 3, 4), np.log(0.25), jnp.float32)
      >>> print(np.round(np.exp(sj.dense_tot_score(graphs, log_probs)) * 64, 4))
      [2. 1.]
    """
    fn = "numerator_graphs"
    phones = _check_topo(topo, fn)
    rows = _phone_rows(phone_sequences, lengths, phones, fn)
    return stack(
        [
            _pdf_acceptor(compose(topo, linear_fsa(row.astype(np.int64), dtype=topo.dtype)))
            for row in rows
        ],
        bucket=bucket,
    )
