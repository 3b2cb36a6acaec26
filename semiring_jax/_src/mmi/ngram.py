"""Phone n-gram acceptors: estimated from label sequences (`ngram_fsa`) or
read from an ARPA file (`read_arpa`)."""

from __future__ import annotations

import math
import os
import pathlib
from typing import Any

import numpy as np
import numpy.typing as npt

from semiring_jax._src.core import checks
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.host.messages import decode_utf8, quote
from semiring_jax._src.io.host.symbols import SymbolTable
from semiring_jax._src.mmi.host import arpa, ngram

__all__ = ["ngram_fsa", "read_arpa"]


def _fsa(arcs: ngram.Arcs, dtype: np.dtype) -> Fsa:
    """The acceptor of host arcs (start state 0)."""
    final = {state: float(w) for state, w in enumerate(arcs.final) if w > -math.inf}
    if not len(arcs.src):
        return Fsa.from_arcs([], final=final, num_states=arcs.num_states, dtype=dtype)
    # float64 holds every int32 state and label exactly.
    table = np.column_stack([arcs.src, arcs.dst, arcs.label, arcs.weight]).astype(np.float64)
    return Fsa.from_arcs(table, final=final, num_states=arcs.num_states, dtype=dtype)


def _sequences(sequences: Any, num_symbols: int, fn: str) -> list[list[int]]:
    """Host label sequences, each label checked to be in [1, num_symbols]."""
    checks.check_not_traced(sequences, "sequences", fn)
    if isinstance(sequences, (str, bytes)) or not hasattr(sequences, "__len__"):
        raise ValueError(f"{fn}: sequences must be a sequence of label sequences")
    if not len(sequences):
        raise ValueError(f"{fn}: sequences is empty; there is nothing to count")
    rows = []
    for b, sequence in enumerate(sequences):
        row = np.asarray(checks.concrete(sequence, f"sequences[{b}]", fn))
        if row.ndim != 1 or (row.size and row.dtype.kind not in "iu"):
            raise ValueError(
                f"{fn}: sequences[{b}] must be a one-dimensional sequence of integers, "
                f"got shape {row.shape} and dtype {row.dtype}"
            )
        bad = np.flatnonzero((row < 1) | (row > num_symbols))
        if bad.size:
            raise ValueError(
                f"{fn}: sequences[{b}][{bad[0]}] = {row[bad[0]]} is outside "
                f"[1, num_symbols] = [1, {num_symbols}]; label 0 is epsilon"
            )
        rows.append(row.astype(np.int64).tolist())
    return rows


def ngram_fsa(
    sequences: Any,
    num_symbols: int,
    *,
    order: int = 2,
    discount: float = 0.5,
    dtype: npt.DTypeLike = np.float32,
) -> Fsa:
    """A phone n-gram estimated from label sequences, as an acceptor.

    Counts as Kaldi's `chain-est-phone-lm` does (each sequence between a
    sentence start and a sentence end), smoothed by interpolated absolute
    discounting: for a history h (the last N - 1 labels, the sentence start
    included) seen c(h) times and followed by N1(h) distinct labels,

        P(w | h) = (max(c(h, w) - D, 0) + D N1(h) P(w | h')) / c(h),

    where h' drops h's oldest label and, below the unigrams, P = 1 / (V + 1)
    (V labels and the sentence end). `discount=0` is the unsmoothed
    maximum-likelihood estimate (Kaldi's, whose unseen n-grams are
    impossible). The back-off is expanded: every state has an arc for each
    label of non-zero probability, so the acceptor has no epsilon arcs and
    is deterministic, and a sequence's one path scores its exact ln P,
    sentence end included, in any semiring. States are the histories seen
    in `sequences` (an unseen history is its longest seen suffix), numbered
    breadth first from the sentence start (state 0); at most about
    (V + 1)^(N - 1) states of V arcs each, so keep N small for a large V.

    Args:
      sequences: a sequence of B label sequences (lists or int arrays [U_b]),
        labels in [1, V]; an empty one counts a sentence end after the start.
      num_symbols: V, the number of labels (phones are 1..V; 0 is epsilon).
      order: N >= 1 (1: unigram, 2: bigram, ...).
      discount: D in [0, 1].
      dtype: float32 (default) or float64.
    Returns:
      A deterministic, epsilon-free acceptor over labels 1..V with natural
      log-probability weights; final weights ln P(</s> | history). Each
      state's arcs and final weight sum to probability 1.
    Raises:
      ValueError: for an empty `sequences`, a label outside [1, V] (naming
        its position), an `order` below 1, a `num_symbols` below 1 or a
        `discount` outside [0, 1].
    Examples:
      >>> import numpy as np
      >>> import semiring_jax as sj
      >>> lm = sj.ngram_fsa([[1, 2], [1, 1, 2]], num_symbols=2, discount=0.0)
      >>> lm
      Fsa(acceptor, num_states=3, num_arcs=3, cyclic)
      >>> # ln P(1 | <s>) + ln P(2 | 1) + ln P(</s> | 2) = ln 1 + ln 2/3 + ln 1
      >>> path = sj.intersect(sj.linear_fsa([1, 2]), lm)
      >>> print(np.round(np.exp(float(sj.tot_score(path))), 4))
      0.6667
    """
    fn = "ngram_fsa"
    dtype = checks.check_float_dtype(dtype, "dtype", fn)
    num_symbols = checks.check_int(num_symbols, "num_symbols", fn, 1)
    order = checks.check_int(order, "order", fn, 1)
    if isinstance(discount, bool) or not isinstance(discount, (int, float, np.floating)):
        raise ValueError(f"{fn}: discount must be a float in [0, 1], got {discount!r}")
    if not 0.0 <= float(discount) <= 1.0:
        raise ValueError(f"{fn}: discount = {discount} is outside [0, 1]")
    rows = _sequences(sequences, num_symbols, fn)
    model = ngram.estimate(rows, num_symbols, order, float(discount))
    return _fsa(ngram.expanded_arcs(model), dtype)


def _arpa_text(source: Any, fn: str) -> tuple[str, str]:
    """(text, prefix for messages): a path object or a one-line str names a
    file; a str of several lines is the text itself."""
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source):
        path = os.fspath(source)
        if not pathlib.Path(path).is_file():
            raise ValueError(
                f"{fn}: no file {quote(str(path))}; pass the ARPA text itself (several "
                f"lines) or the path of an ARPA file"
            )
        with open(path, "rb") as stream:
            data = stream.read()
        return decode_utf8(data, f"{path}: {fn}"), f"{path}: "
    if not isinstance(source, str):
        raise TypeError(f"{fn}: source must be a str or a path, got {type(source).__name__}")
    return source, ""


def read_arpa(
    source: str | os.PathLike,
    symbols: SymbolTable | None = None,
    *,
    expand: bool = False,
    dtype: npt.DTypeLike = np.float32,
) -> tuple[Fsa, SymbolTable]:
    """Reads an ARPA back-off language model into an acceptor.

    The ARPA format: lines before `\\data\\` are ignored; `\\data\\` gives an
    `ngram k=count` line per order; each `\\k-grams:` section lists
    `log10(p) w1 ... wk [log10(backoff)]`; `\\end\\` closes. Weights become
    natural logs (ln = log10 * ln 10). `<s>` and `</s>` get no label: the
    start state is the history `<s>` and `</s>` is the final weight.
    The back-off definition,

        P(w | h) = p(h w) if listed, else α(h) P(w | h[1:]),

    is built in one of two ways:

    - `expand=False` (as Kaldi's `arpa2fst`): an arc per listed n-gram
      (weight ln p), an epsilon arc (label 0, weight ln α(h)) from each
      history to its back-off state, final weights where `h </s>` is
      listed. A sentence then has one path per back-off route, not just
      the ARPA one: TROPICAL `best_path` / `tot_score` of
      `sj.intersect(sj.linear_fsa(words), lm)` is the exact ln P(words)
      whenever no back-off route beats the listed n-gram (usual in a
      well-formed model, not guaranteed; never below it), and LOG
      `tot_score` overcounts (sums the routes), and so would
      `sj.remove_epsilon`: for an epsilon-free graph (`sj.dense_tot_score`
      has no epsilons) read the model with `expand=True`.
    - `expand=True`: every history state gets an arc for every word of
      non-zero probability, weighted by the backed-off ln P(w | h):
      epsilon-free, deterministic and exact in every semiring, with
      about (states x vocabulary) arcs; what `sj.denominator_graph`
      takes, for a phone LM.

    States are the histories with listed n-grams or a back-off weight
    (any other history scores as its longest suffix does), numbered
    breadth first from `<s>` (state 0; the empty history without `<s>`).
    Arcs of weight -inf (log10 p = -inf) are left out.

    Args:
      source: the ARPA text (a str of several lines) or the path of a
        UTF-8 ARPA file (a one-line str or a path object).
      symbols: a `sj.SymbolTable` with every word (key 0 is epsilon and
        no word's), or None: words are numbered 1, 2, ... in order of
        their unigram lines, `<eps>` is 0.
      expand: the epsilon-free expanded construction.
      dtype: float32 (default) or float64.
    Returns:
      (lm, symbols): the acceptor, with natural-log weights, and the
      symbol table of its labels (the one given, or a new one).
    Raises:
      ValueError: naming the line number, for malformed input: no
        `\\data\\` line, a malformed `ngram k=count` line, sections out of
        order or holding other counts than declared, a line of the wrong
        number of fields, a probability or back-off weight that is not a
        number (NaN and +inf included) or whose natural log `dtype` cannot
        hold, a back-off weight on the highest order, `<s>` or `</s>` out
        of place, a duplicate n-gram, a word missing from `symbols` (or
        from the unigrams), no `\\end\\`; with `expand=True`, a backed-off
        weight (a sum of the model's values) that `dtype` cannot hold,
        naming its word and state; also for a path that is not a file.
      TypeError: for a `source` that is neither a str nor a path.
    Examples:
      >>> import numpy as np
      >>> import semiring_jax as sj
      >>> text = '''
      ... \\\\data\\\\
      ... ngram 1=3
      ... ngram 2=2
      ...
      ... \\\\1-grams:
      ... -99 <s> -0.30103
      ... -0.30103 a -0.30103
      ... -0.30103 </s>
      ...
      ... \\\\2-grams:
      ... 0 <s> a
      ... 0 a </s>
      ...
      ... \\\\end\\\\
      ... '''
      >>> lm, words = sj.read_arpa(text, expand=True)
      >>> words.find("a"), lm.num_states
      (1, 2)
      >>> # P(a | <s>) P(</s> | a) = 1; P(a a </s>) = 1 * (0.5 * 0.5) * 1
      >>> for sentence in ([1], [1, 1]):
      ...     path = sj.intersect(sj.linear_fsa(sentence), lm)
      ...     print(np.round(np.exp(float(sj.tot_score(path))), 4))
      1.0
      0.25
    """
    fn = "read_arpa"
    dtype = checks.check_float_dtype(dtype, "dtype", fn)
    if symbols is not None and not isinstance(symbols, SymbolTable):
        raise TypeError(f"{fn}: symbols must be a sj.SymbolTable, got {type(symbols).__name__}")
    text, prefix = _arpa_text(source, fn)
    try:
        model, table = arpa.parse(text, symbols, fn, (dtype.name, float(np.finfo(dtype).max)))
    except ValueError as err:
        raise ValueError(f"{prefix}{err}") from None
    if not expand:
        return _fsa(ngram.backoff_arcs(model), dtype), table
    arcs = ngram.expanded_arcs(model)
    _check_backed_off(arcs, table, dtype, f"{prefix}{fn}")
    return _fsa(arcs, dtype), table


def _check_backed_off(arcs: ngram.Arcs, table: SymbolTable, dtype: np.dtype, fn: str) -> None:
    """Each value of the model fits `dtype` (the parser checks it), but a
    backed-off weight is a sum of several: one that `dtype` cannot hold is
    named by its word and state here, not by `from_arcs`' arc number."""
    with np.errstate(over="ignore"):
        weight, final = (np.asarray(x, np.float64).astype(dtype) for x in (arcs.weight, arcs.final))
    bad = np.flatnonzero(np.isfinite(arcs.weight) & ~np.isfinite(weight))
    if bad.size:
        i = int(bad[0])
        word, at, value = table.find(int(arcs.label[i])), int(arcs.src[i]), arcs.weight[i]
    else:
        bad = np.flatnonzero(np.isfinite(arcs.final) & ~np.isfinite(final))
        if not bad.size:
            return
        word, at, value = arpa.SENTENCE_END, int(bad[0]), arcs.final[bad[0]]
    raise ValueError(
        f"{fn}: expand=True: the backed-off weight of {quote(str(word))} after state {at} "
        f"(ln P plus the back-off weights of its history) is {value}, which {dtype} cannot "
        f"hold (the largest {dtype} is {np.finfo(dtype).max})"
    )
