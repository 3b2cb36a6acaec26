"""The ARPA back-off language-model format, read into a `BackoffModel`.

The layout (as SRILM, KenLM and Kaldi write it): lines before `\\data\\`
are ignored; `\\data\\` is followed by one `ngram k=count` line per order
k = 1..N; then for each order a `\\k-grams:` section of `count` lines,
`log10(p) w1 ... wk [log10(backoff)]` (the highest order has no back-off
weight); `\\end\\` closes the model. Fields are separated by spaces or tabs,
blank lines are skipped. `<s>` may only start an n-gram and `</s>` only end
one; the `<s>` unigram's probability is never used (a sentence never
predicts its start), only its back-off weight.
"""

from __future__ import annotations

import math
import re

from semiring_jax._src.core.host.messages import quote
from semiring_jax._src.io.host.symbols import SymbolTable
from semiring_jax._src.mmi.host.ngram import BOS, EOS, BackoffModel

__all__ = ["SENTENCE_END", "SENTENCE_START", "parse"]

SENTENCE_START = "<s>"
SENTENCE_END = "</s>"

_COUNT = re.compile(r"ngram[ \t]+([0-9]+)[ \t]*=[ \t]*([0-9]+)")
_SECTION = re.compile(r"\\([0-9]+)-grams:")
_FIELDS = re.compile(r"[ \t]+")
_LN10 = math.log(10.0)
# The weights' dtype, by name, and its largest finite value.
Largest = tuple[str, float]


def _log10(text: str, what: str, where: str, line: str, largest: Largest) -> float:
    """A log10 value as a natural log; NaN and +inf refused, and a finite
    value whose natural log the weights' dtype cannot hold (it would round
    to ±inf, and be refused later with no line to name)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value) or value == math.inf:
        raise ValueError(f"{where}: {what} {quote(text)} is not a number in {quote(line)}")
    natural = value * _LN10  # inf if beyond float64
    name, limit = largest
    if value > -math.inf and not abs(natural) <= limit:
        raise ValueError(
            f"{where}: {what} {quote(text)} is {natural} as a natural log, which {name} cannot "
            f"hold (the largest {name} is {limit:.7g}), in {quote(line)}"
        )
    return natural


class _Labels:
    """Words to labels: through the given table, or a new one numbered in
    order of first appearance among the unigrams (`<eps>` = 0)."""

    def __init__(self, symbols: SymbolTable | None) -> None:
        self.given = symbols is not None
        self.table = symbols if symbols is not None else SymbolTable(["<eps>"])

    def label(self, word: str, order: int, where: str, line: str) -> int:
        if word == SENTENCE_START:
            return BOS
        if word == SENTENCE_END:
            return EOS
        if word in self.table:
            key = self.table.find(word)
            assert isinstance(key, int)
            if key == 0:
                raise ValueError(
                    f"{where}: word {quote(word)} has key 0 in the symbol table, which is "
                    f"epsilon, in {quote(line)}"
                )
            return key
        if self.given:
            raise ValueError(f"{where}: word {quote(word)} is not in the symbol table")
        if order > 1:
            raise ValueError(
                f"{where}: word {quote(word)} is not among the 1-grams, in {quote(line)}"
            )
        return self.table.add_symbol(word)


def _ngram(
    fields: list[str],
    order: int,
    highest: int,
    labels: _Labels,
    where: str,
    line: str,
    largest: Largest,
) -> tuple[float, tuple[int, ...], float | None]:
    """(ln p, labels, ln backoff or None) of one n-gram line."""
    if len(fields) not in (order + 1, order + 2):
        raise ValueError(
            f"{where}: expected 'log10(p) w1 ... w{order} [log10(backoff)]' "
            f"({order + 1} or {order + 2} fields), got {len(fields)} in {quote(line)}"
        )
    has_backoff = len(fields) == order + 2
    if has_backoff and order == highest:
        raise ValueError(
            f"{where}: a {order}-gram is of the highest order and has no back-off weight, "
            f"got {len(fields)} fields in {quote(line)}"
        )
    logprob = _log10(fields[0], "log10 probability", where, line, largest)
    words = fields[1 : order + 1]
    for i, word in enumerate(words):
        if word == SENTENCE_START and i > 0:
            raise ValueError(f"{where}: {SENTENCE_START} inside an n-gram in {quote(line)}")
        if word == SENTENCE_END and i < order - 1:
            raise ValueError(f"{where}: {SENTENCE_END} before its end in {quote(line)}")
    ids = tuple(labels.label(word, order, where, line) for word in words)
    backoff = (
        _log10(fields[-1], "log10 back-off weight", where, line, largest) if has_backoff else None
    )
    return logprob, ids, backoff


def parse(
    text: str, symbols: SymbolTable | None, fn: str, largest: Largest
) -> tuple[BackoffModel, SymbolTable]:
    """The model of an ARPA text, and its words' labels.

    Args:
      text: the ARPA text.
      symbols: the words' labels, or None to number them 1, 2, ... in order
        of first appearance among the unigrams (`<eps>` = 0); `<s>` and
        `</s>` get no label.
      fn: the public name, for messages.
      largest: (dtype name, its largest finite value): the natural-log
        weights must fit it.
    Returns:
      (model, symbol table).
    Raises:
      ValueError: naming the line number, for malformed input.
    """
    lines = text.splitlines()
    number = 0  # the current line (1-based) once read

    def where(at: int | None = None) -> str:
        return f"{fn}: line {number if at is None else at}"

    while number < len(lines) and lines[number].strip() != "\\data\\":
        number += 1
    if number == len(lines):
        raise ValueError(f"{fn}: no \\data\\ line; this is not an ARPA model")
    number += 1
    declared: dict[int, int] = {}
    while number < len(lines):
        line = lines[number].strip()
        if line.startswith("\\"):
            break
        number += 1
        if not line:
            continue
        match = _COUNT.fullmatch(line)
        if not match:
            raise ValueError(f"{where()}: expected 'ngram k=count', got {quote(line)}")
        order, count = int(match.group(1)), int(match.group(2))
        if order != len(declared) + 1:
            raise ValueError(
                f"{where()}: expected the count of order {len(declared) + 1}, got {quote(line)}"
            )
        declared[order] = count
    if not declared:
        raise ValueError(f"{where(number + 1)}: \\data\\ declares no 'ngram k=count' line")
    highest = len(declared)
    labels = _Labels(symbols)
    probs: dict[tuple[int, ...], dict[int, float]] = {}
    backoff: dict[tuple[int, ...], float] = {}
    seen: set[tuple[int, ...]] = set()
    order = 0  # the section being read
    in_section = 0
    header = 0

    def close_section() -> None:
        if order and in_section != declared[order]:
            raise ValueError(
                f"{where()}: the \\{order}-grams: section (line {header}) holds "
                f"{in_section} n-grams, \\data\\ declares {declared[order]}"
            )

    ended = False
    while number < len(lines):
        raw = lines[number]
        number += 1
        line = raw.strip(" \t\r")
        if not line:
            continue
        if line.startswith("\\"):
            close_section()
            if line == "\\end\\":
                if order != highest:
                    raise ValueError(
                        f"{where()}: \\end\\ before the \\{order + 1}-grams: section, which "
                        f"\\data\\ declares"
                    )
                ended = True
                break
            match = _SECTION.fullmatch(line)
            if not match or int(match.group(1)) != order + 1 or order == highest:
                expected = f"\\{order + 1}-grams:" if order < highest else "\\end\\"
                raise ValueError(f"{where()}: expected {expected}, got {quote(line)}")
            order, in_section, header = order + 1, 0, number
            continue
        if not order:
            raise ValueError(f"{where()}: an n-gram before any \\k-grams: section")
        logprob, ids, weight = _ngram(
            _FIELDS.split(line), order, highest, labels, where(), line, largest
        )
        if ids in seen:
            raise ValueError(f"{where()}: duplicate n-gram in {quote(line)}")
        seen.add(ids)
        in_section += 1
        # Never predicted: a sentence does not emit its start.
        if ids[-1] != BOS:
            probs.setdefault(ids[:-1], {})[ids[-1]] = logprob
        if weight is not None and ids[-1] != EOS:
            backoff[ids] = weight
    if not ended:
        raise ValueError(f"{fn}: line {len(lines)}: the text ends without an \\end\\ line")
    vocabulary = sorted({w for entries in probs.values() for w in entries if w >= 1})
    return BackoffModel(highest, tuple(vocabulary), probs, backoff), labels.table
