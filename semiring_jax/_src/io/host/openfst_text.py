"""OpenFst (AT&T) and k2 text formats, read and written on the host.

Integer fields (states, labels) are ASCII decimal digits with an optional
sign, within int32: not `1e9`, `1_000` or non-ASCII digits, which Python's
`int()` and `float()` would take. Weights are ASCII decimal numbers (`0.5`,
`-1e-3`, `.5`) or an infinity (`inf`, `Infinity`, any case, with a sign);
a finite number too large for float64 (`1e400`), or for the dtype asked for
(`1e39` in float32), is refused rather than read as an infinity. State ids
are bounded as in `build.state_limit`. Errors name the line and quote it,
cut to 60 characters.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from semiring_jax._src.core.host import build, messages
from semiring_jax._src.core.host.messages import quote
from semiring_jax._src.io.host.symbols import SymbolTable

__all__ = [
    "check_text",
    "format_k2",
    "format_openfst",
    "label_tables",
    "looks_like_a_path",
    "openfst_number",
    "parse_k2",
    "parse_openfst",
    "path_error",
    "read_file",
]


_INTEGER = re.compile(r"[+-]?[0-9]+")
# Unambiguous (no two ways to match a digit), so that a long field cannot
# make the match backtrack quadratically.
_FLOAT = re.compile(
    r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)",
    re.IGNORECASE,
)
_INFINITY = re.compile(r"[+-]?(?:inf|infinity)", re.IGNORECASE)
_INT32_MAX = int(np.iinfo(np.int32).max)


def _integer(field: str, line_number: int, line: str, fn: str) -> int:
    """An integer field: ASCII digits with an optional sign, within int32."""
    if not _INTEGER.fullmatch(field):
        raise ValueError(
            f"{fn}: line {line_number}: expected an integer, got {quote(field)} in {quote(line)}"
        )
    # Python's int() refuses more than 4300 digits; no int32 needs 11.
    value = int(field) if len(field.lstrip("+-0")) <= 10 else _INT32_MAX + 1
    if abs(value) > _INT32_MAX:
        raise ValueError(
            f"{fn}: line {line_number}: {quote(field)} is too large for int32 (at most "
            f"2**31 - 1), in {quote(line)}"
        )
    return value


def _number(field: str, line_number: int, line: str, fn: str) -> float:
    """A weight field (see the module docstring); NaN is refused."""
    value = float(field) if _FLOAT.fullmatch(field) else math.nan
    if math.isnan(value):
        raise ValueError(
            f"{fn}: line {line_number}: expected a number, got {quote(field)} in {quote(line)}"
        )
    if math.isinf(value) and not _INFINITY.fullmatch(field):
        raise ValueError(
            f"{fn}: line {line_number}: {quote(field)} is too large for float64 (write "
            f"inf or Infinity for an infinite weight), in {quote(line)}"
        )
    return value


def _lines(text: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line number, stripped line, fields) of the non-blank lines."""
    for line_number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if fields:
            yield line_number, line.strip(), fields


def _is_number(field: str) -> bool:
    return _FLOAT.fullmatch(field) is not None


def _is_integer(field: str) -> bool:
    return _INTEGER.fullmatch(field) is not None


def _is_olabel(field: str, osymbols: SymbolTable | None) -> bool:
    """Whether the last field of `src dst x field` is an olabel, not a cost:
    an integer, or with osymbols one of its symbols or no number at all (so
    that an unknown symbol is reported as such, not as a bad cost)."""
    if osymbols is None:
        return _is_integer(field)
    return field in osymbols or not _is_number(field)


def label_tables(
    is_acceptor: bool | None, isymbols: SymbolTable | None, osymbols: SymbolTable | None, fn: str
) -> tuple[SymbolTable | None, SymbolTable | None]:
    """The tables of the input and output label columns, checked.

    An acceptor has one label column: it uses `isymbols`, or `osymbols`
    when only that is given (osymbols defaults to isymbols), so both must
    agree when both are given.
    """
    for name, table in (("isymbols", isymbols), ("osymbols", osymbols)):
        if table is not None and not isinstance(table, SymbolTable):
            raise TypeError(
                f"{fn}: {name} must be a sj.SymbolTable or None, got {type(table).__name__}"
            )
    if is_acceptor:
        if isymbols is not None and osymbols is not None and isymbols != osymbols:
            raise ValueError(
                f"{fn}: an acceptor has one label column, but isymbols and "
                f"osymbols differ; pass one table"
            )
        shared = isymbols if isymbols is not None else osymbols
        return shared, shared
    return isymbols, osymbols


def _label(
    field: str, table: SymbolTable | None, line_number: int, line: str, fn: str, table_name: str
) -> float:
    """A label field: an integer, or with a table, one of its symbols."""
    if table is None:
        return _integer(field, line_number, line, fn)
    if field not in table:
        raise ValueError(
            f"{fn}: line {line_number}: symbol {quote(field)} is not in {table_name}, "
            f"in {quote(line)}"
        )
    return float(table.find(field))


def _check_sizes(
    fn: str,
    arcs: np.ndarray,
    arc_lines: list[int],
    finals: dict[int, float],
    final_lines: dict[int, int],
    dtype: np.dtype,
    limit: int,
    weight_name: str,
) -> None:
    """Raises, naming the earliest line at fault, for a state id not below
    `limit` or a weight that `dtype` cannot hold (before any per-state
    array is allocated). `arcs` holds (src, dst, ..., weight) rows."""
    problems: list[tuple[int, str]] = []
    states = arcs[:, :2]
    bad = np.flatnonzero((states >= limit).any(axis=1))
    if bad.size:
        row = int(bad[0])
        state = int(states[row].max())
        problems.append((arc_lines[row], f"state {state} {build.beyond_limit(limit)}"))
    big = [state for state in finals if state >= limit]
    if big:
        state = min(big, key=final_lines.__getitem__)
        problems.append((final_lines[state], f"state {state} {build.beyond_limit(limit)}"))
    weights = arcs[:, -1]
    negate = weight_name == "cost"
    for values, lines in (
        (weights, arc_lines),
        (np.fromiter(finals.values(), np.float64, len(finals)), list(final_lines.values())),
    ):
        row = build.first_overflow(values, dtype)
        if row >= 0:
            shown = 0.0 - values[row] if negate else values[row]
            rounded = "inf" if values[row] > 0 else "-inf"
            subject = "its score" if negate else "it"
            problems.append(
                (
                    lines[row],
                    f"{weight_name} {shown} is outside the range of {dtype} ({subject} "
                    f"would round to {rounded})",
                )
            )
    if problems:
        line_number, problem = min(problems)
        raise ValueError(f"{fn}: line {line_number}: {problem}")


def path_error(fn: str, name: str) -> ValueError:
    """The error for a file name given where AT&T text is expected."""
    return ValueError(
        f"{fn}: takes OpenFst text, not a file name such as {quote(name)}; "
        f"to read a file, call sj.Fsa.read_openfst(path)"
    )


def check_text(text: Any, fn: str) -> None:
    """Refuses a path object (see `path_error`) or anything else but a str."""
    if isinstance(text, os.PathLike):
        raise path_error(fn, str(os.fspath(text)))
    if not isinstance(text, str):
        raise TypeError(f"{fn}: text must be a str, got {type(text).__name__}")


def looks_like_a_path(text: str) -> bool:
    """Whether `text`, which did not parse as AT&T text, is more likely a
    file name: one line, and either a single field that is not a state
    (every valid one-field text is a final state) or an existing file.

    Examples:
      >>> looks_like_a_path("lexicon.txt"), looks_like_a_path("0 1 x 0.5")
      (True, False)
    """
    name = text.strip()
    if not name or "\n" in name or "\r" in name:
        return False
    if len(name.split()) == 1 and not _is_integer(name):
        return True
    # A longer string is no file name any system takes; skip the system call.
    return len(name) <= 4096 and os.path.isfile(name)


def read_file(path: Any, fn: str) -> tuple[str, str]:
    """(text, where): the UTF-8 text of the file at `path`, and `fn` with the
    file's name, for the errors of what reads the text. Bad UTF-8 is a
    ValueError naming the file, line and column; a str holding a line break
    is text given in place of a name, a ValueError naming
    `Fsa.from_openfst`.
    """
    if isinstance(path, str) and ("\n" in path or "\r" in path):
        raise ValueError(
            f"{fn}: takes a file name, not text ({quote(path)} holds a line break); "
            f"read text with sj.Fsa.from_openfst(text)"
        )
    where = f"{fn}: {os.fsdecode(path)}"
    with open(path, "rb") as file:
        return messages.decode_utf8(file.read(), where), where


def parse_openfst(
    text: str,
    *,
    acceptor: bool | None,
    dtype: np.dtype,
    isymbols: SymbolTable | None = None,
    osymbols: SymbolTable | None = None,
    fn: str = "from_openfst",
) -> build.ArcArrays:
    """Parses AT&T text (see `Fsa.from_openfst` for the accepted forms);
    errors start with `fn` (the caller, and for a file its name)."""
    check_text(text, fn)
    label_tables(None, isymbols, osymbols, fn)
    one_column = None  # an acceptor's label table, worked out at its first arc
    rows, finals, start = [], {}, None
    arc_lines: list[int] = []  # the line of each row, and of each final state
    final_lines: dict[int, int] = {}
    arity = None  # the number of label fields, 1 (acceptor) or 2 (transducer)
    for line_number, line, fields in _lines(text):
        if len(fields) > 5:
            raise ValueError(
                f"{fn}: line {line_number}: expected 'src dst ilabel [olabel] [weight]' "
                f"or 'state [weight]', got {quote(line)}"
            )
        if len(fields) <= 2:
            state = _integer(fields[0], line_number, line, fn)
            cost = _number(fields[1], line_number, line, fn) if len(fields) == 2 else 0.0
            if state < 0 or cost == -math.inf:
                raise ValueError(f"{fn}: line {line_number}: bad final state line {quote(line)}")
            finals[state] = 0.0 - cost
            final_lines[state] = line_number
            start = state if start is None else start
            continue
        if acceptor is not None:
            line_arity = 1 if acceptor else 2
            if len(fields) - 2 - line_arity not in (0, 1):
                kind = "acceptor" if acceptor else "transducer"
                raise ValueError(f"{fn}: line {line_number}: not a {kind} arc: {quote(line)}")
        elif len(fields) == 4:
            line_arity = 2 if _is_olabel(fields[3], osymbols) else 1
        else:
            line_arity = 1 if len(fields) == 3 else 2
        if arity is not None and line_arity != arity:
            raise ValueError(
                f"{fn}: line {line_number}: {quote(line)} mixes acceptor and transducer arcs; "
                f"pass acceptor=True or acceptor=False"
            )
        arity = line_arity
        numbers: list[float] = [_integer(f, line_number, line, fn) for f in fields[:2]]
        if arity == 1:
            if one_column is None:
                one_column = label_tables(True, isymbols, osymbols, fn)[0]
            numbers.append(
                _label(
                    fields[2],
                    one_column,
                    line_number,
                    line,
                    fn,
                    "isymbols" if isymbols is not None else "osymbols",
                )
            )
        else:
            numbers += [
                _label(fields[2], isymbols, line_number, line, fn, "isymbols"),
                _label(fields[3], osymbols, line_number, line, fn, "osymbols"),
            ]
        if min(numbers) < 0:
            raise ValueError(f"{fn}: line {line_number}: negative state or label in {quote(line)}")
        cost = (
            _number(fields[2 + arity], line_number, line, fn) if len(fields) == 3 + arity else 0.0
        )
        if cost == -math.inf:
            raise ValueError(f"{fn}: line {line_number}: cost -inf (score +inf) in {quote(line)}")
        if arity == 1:
            numbers.append(numbers[-1])
        rows.append([*numbers, 0.0 - cost])
        arc_lines.append(line_number)
        start = int(numbers[0]) if start is None else start
    arcs = np.asarray(rows, dtype=np.float64).reshape(-1, 5)
    limit = build.state_limit(len(rows), len(finals))
    _check_sizes(fn, arcs, arc_lines, finals, final_lines, dtype, limit, "cost")
    if arity != 2:
        arcs = arcs[:, [0, 1, 2, 4]]
    arrays = build.arcs_from_rows(
        arcs, finals, num_states=None, start=start or 0, dtype=dtype, fn=fn
    )
    # An infinite final cost is OpenFst's zero weight: the state is not final
    # (fstinfo counts it so, and `to_openfst` writes the start that way).
    return arrays._replace(final_mask=arrays.final_mask & (arrays.final_weight > -math.inf))


def _number_text(value: float) -> str:
    # numpy's str is the shortest text that reads back to the same value in
    # the value's own dtype: a float32 0.1 prints as 0.1, where repr of its
    # float64 widening would print 0.10000000149011612.
    if isinstance(value, np.floating):
        return str(value)
    return repr(float(value))


def openfst_number(value: float) -> str:
    """A cost or score as OpenFst writes it: infinities spelt `Infinity`."""
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return _number_text(value)


def _start_first(arrays: build.ArcArrays) -> np.ndarray:
    return np.argsort(arrays.src != 0, kind="stable")


def _label_texts(
    labels: np.ndarray, table: SymbolTable | None, fn: str, field: str, table_name: str
) -> list[str]:
    """Each label as text: its number, or with a table its symbol."""
    if table is None:
        return [str(int(label)) for label in labels]
    for a, label in enumerate(labels):
        if int(label) not in table:
            raise ValueError(
                f"{fn}: arc {a} has {field}={int(label)}, which {table_name} does not hold"
            )
    return [str(table.find(int(label))) for label in labels]


def format_openfst(
    arrays: build.ArcArrays,
    *,
    isymbols: SymbolTable | None = None,
    osymbols: SymbolTable | None = None,
) -> str:
    """AT&T text of an unpadded FSA (scores negated to costs), with labels
    written as symbols of `isymbols` / `osymbols` where given."""
    fn = "to_openfst"
    itable, otable = label_tables(arrays.is_acceptor, isymbols, osymbols, fn)
    if arrays.is_acceptor:
        ilabels = _label_texts(
            arrays.ilabel, itable, fn, "label", "isymbols" if isymbols is not None else "osymbols"
        )
        olabels = ilabels
    else:
        ilabels = _label_texts(arrays.ilabel, itable, fn, "ilabel", "isymbols")
        olabels = _label_texts(arrays.olabel, otable, fn, "olabel", "osymbols")
    lines = []
    for a in _start_first(arrays):
        labels = [ilabels[a]] if arrays.is_acceptor else [ilabels[a], olabels[a]]
        states = [str(int(arrays.src[a])), str(int(arrays.dst[a]))]
        cost = openfst_number(0.0 - arrays.weight[a])
        lines.append("\t".join(states + labels + [cost]))
    finals = np.flatnonzero(arrays.final_weight > -math.inf)
    final_lines = [f"{int(s)}\t{_number_text(0.0 - arrays.final_weight[s])}" for s in finals]
    if not (arrays.src == 0).any():
        # The first line names the start state: with no arc leaving state 0,
        # its final line goes first, an infinite cost if it is not final.
        if finals.size and finals[0] == 0:
            lines.insert(0, final_lines.pop(0))
        else:
            lines.insert(0, "0\tInfinity")
    lines += final_lines
    return "".join(line + "\n" for line in lines)


def parse_k2(text: str, *, dtype: np.dtype) -> build.ArcArrays:
    """Parses k2 text (see `Fsa.from_k2`)."""
    fn = "from_k2"
    entries = list(_lines(text))
    if not entries or len(entries[-1][2]) != 1:
        raise ValueError(f"{fn}: the last line must name the final state, e.g. '3'")
    final_line, final_text, final_fields = entries[-1]
    final_state = _integer(final_fields[0], final_line, final_text, fn)
    # The final state is dropped, so it is the number of states; bound it
    # before any per-state array is allocated (see build.state_limit).
    limit = build.state_limit(len(entries) - 1, 1)
    if not 0 <= final_state < limit:
        problem = "is negative" if final_state < 0 else build.beyond_limit(limit)
        raise ValueError(f"{fn}: line {final_line}: final state {final_state} {problem}")
    rows, finals = [], {}
    arc_lines: list[int] = []
    final_lines: dict[int, int] = {}
    arity = None
    for line_number, line, fields in entries[:-1]:
        if len(fields) not in (4, 5) or (arity is not None and len(fields) - 3 != arity):
            raise ValueError(
                f"{fn}: line {line_number}: expected 'src dst label score' or "
                f"'src dst ilabel olabel score' (all lines alike), got {quote(line)}"
            )
        arity = len(fields) - 3
        src, dst, *labels = [_integer(f, line_number, line, fn) for f in fields[: 2 + arity]]
        score = _number(fields[-1], line_number, line, fn)
        if src == final_state:
            raise ValueError(
                f"{fn}: line {line_number}: an arc leaves the final state: {quote(line)}"
            )
        if (labels[0] == -1) != (dst == final_state):
            raise ValueError(
                f"{fn}: line {line_number}: arcs into the final state {final_state} must "
                f"have label -1 and only they may, got {quote(line)}"
            )
        if min(src, dst) < 0 or (dst != final_state and min(labels) < 0):
            raise ValueError(f"{fn}: line {line_number}: negative state or label in {quote(line)}")
        if max(src, dst) > final_state:
            raise ValueError(
                f"{fn}: line {line_number}: state {max(src, dst)} is above the final "
                f"state {final_state}; k2's final state is the highest-numbered one"
            )
        if dst == final_state:
            if src in finals:
                raise ValueError(
                    f"{fn}: line {line_number}: state {src} has a second final arc; "
                    f"its final weight would depend on the semiring"
                )
            finals[src] = score
            final_lines[src] = line_number
            continue
        rows.append([src, dst, *labels, score])
        arc_lines.append(line_number)
    arcs = np.asarray(rows, dtype=np.float64).reshape(-1, 3 + (arity or 1))
    _check_sizes(fn, arcs, arc_lines, finals, final_lines, dtype, limit, "score")
    return build.arcs_from_rows(
        arcs, finals, num_states=max(final_state, 1), start=0, dtype=dtype, fn=fn
    )


def format_k2(arrays: build.ArcArrays) -> str:
    """k2 text of an unpadded FSA: final weights become -1 arcs."""
    final_state = arrays.num_states
    lines = []
    for a in range(arrays.src.shape[0]):
        labels = [arrays.ilabel[a]] if arrays.is_acceptor else [arrays.ilabel[a], arrays.olabel[a]]
        ints = " ".join(str(int(f)) for f in [arrays.src[a], arrays.dst[a], *labels])
        lines.append(f"{ints} {_number_text(arrays.weight[a])}")
    final_labels = "-1" if arrays.is_acceptor else "-1 -1"
    for state in np.flatnonzero(arrays.final_weight > -math.inf):
        lines.append(
            f"{int(state)} {final_state} {final_labels} {_number_text(arrays.final_weight[state])}"
        )
    lines.append(str(final_state))
    return "".join(line + "\n" for line in lines)
