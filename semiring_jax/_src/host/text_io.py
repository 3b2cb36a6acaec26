"""OpenFst (AT&T) and k2 text formats, read and written on the host."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from semiring_jax._src.host import build

__all__ = ["parse_openfst", "format_openfst", "parse_k2", "format_k2"]


def _number(field: str, line_number: int, line: str, fn: str, *, integer: bool) -> float:
    try:
        value = float(field)
    except ValueError:
        value = math.nan
    if integer and not (value.is_integer() if math.isfinite(value) else False):
        raise ValueError(f"{fn}: line {line_number}: expected an integer, got {field!r} in {line!r}")
    if math.isnan(value):
        raise ValueError(f"{fn}: line {line_number}: expected a number, got {field!r} in {line!r}")
    return value


def _lines(text: str):
    """(line number, stripped line, fields) of the non-blank lines."""
    for line_number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if fields:
            yield line_number, line.strip(), fields


def _is_integer(field: str) -> bool:
    try:
        int(field)
    except ValueError:
        return False
    return True


def parse_openfst(text: str, *, acceptor: Optional[bool], dtype: np.dtype) -> build.ArcArrays:
    """Parses AT&T text (see `Fsa.from_openfst` for the accepted forms)."""
    fn = "from_openfst"
    rows, finals, start = [], {}, None
    arity = None  # the number of label fields, 1 (acceptor) or 2 (transducer)
    for line_number, line, fields in _lines(text):
        if len(fields) > 5:
            raise ValueError(
                f"{fn}: line {line_number}: expected 'src dst ilabel [olabel] [weight]' "
                f"or 'state [weight]', got {line!r}")
        if len(fields) <= 2:
            state = int(_number(fields[0], line_number, line, fn, integer=True))
            cost = _number(fields[1], line_number, line, fn, integer=False) if len(fields) == 2 else 0.0
            if state < 0 or cost == -math.inf:
                raise ValueError(f"{fn}: line {line_number}: bad final state line {line!r}")
            finals[state] = 0.0 - cost
            start = state if start is None else start
            continue
        if acceptor is not None:
            line_arity = 1 if acceptor else 2
            if len(fields) - 2 - line_arity not in (0, 1):
                kind = "acceptor" if acceptor else "transducer"
                raise ValueError(f"{fn}: line {line_number}: not a {kind} arc: {line!r}")
        elif len(fields) == 4:
            line_arity = 2 if _is_integer(fields[3]) else 1
        else:
            line_arity = 1 if len(fields) == 3 else 2
        if arity is not None and line_arity != arity:
            raise ValueError(
                f"{fn}: line {line_number}: {line!r} mixes acceptor and transducer arcs; "
                f"pass acceptor=True or acceptor=False")
        arity = line_arity
        numbers = [_number(f, line_number, line, fn, integer=True) for f in fields[:2 + arity]]
        if min(numbers) < 0:
            raise ValueError(f"{fn}: line {line_number}: negative state or label in {line!r}")
        cost = (_number(fields[2 + arity], line_number, line, fn, integer=False)
                if len(fields) == 3 + arity else 0.0)
        if cost == -math.inf:
            raise ValueError(f"{fn}: line {line_number}: cost -inf (score +inf) in {line!r}")
        if arity == 1:
            numbers.append(numbers[-1])
        rows.append(numbers + [0.0 - cost])
        start = int(numbers[0]) if start is None else start
    arcs = np.asarray(rows, dtype=np.float64).reshape(-1, 5)
    if arity != 2:
        arcs = arcs[:, [0, 1, 2, 4]]
    return build.arcs_from_rows(arcs, finals, num_states=None, start=start or 0,
                                dtype=dtype, fn=fn)


def _number_text(value: float) -> str:
    # repr is the shortest text that reads back to the same float64, and a
    # float32 widened to float64 reads back to the same float32.
    return repr(float(value))


def _start_first(arrays: build.ArcArrays) -> np.ndarray:
    return np.argsort(arrays.src != 0, kind="stable")


def format_openfst(arrays: build.ArcArrays) -> str:
    """AT&T text of an unpadded FSA (scores negated to costs)."""
    lines = []
    for a in _start_first(arrays):
        labels = ([arrays.ilabel[a]] if arrays.is_acceptor
                  else [arrays.ilabel[a], arrays.olabel[a]])
        fields = [arrays.src[a], arrays.dst[a], *labels]
        cost = ("Infinity" if arrays.weight[a] == -math.inf
                else _number_text(0.0 - arrays.weight[a]))
        lines.append("\t".join([str(int(f)) for f in fields] + [cost]))
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
    final_line, _, final_fields = entries[-1]
    final_state = int(_number(final_fields[0], final_line, final_fields[0], fn, integer=True))
    rows, finals = [], {}
    arity = None
    for line_number, line, fields in entries[:-1]:
        if len(fields) not in (4, 5) or (arity is not None and len(fields) - 3 != arity):
            raise ValueError(
                f"{fn}: line {line_number}: expected 'src dst label score' or "
                f"'src dst ilabel olabel score' (all lines alike), got {line!r}")
        arity = len(fields) - 3
        src, dst, *labels = [int(_number(f, line_number, line, fn, integer=True))
                             for f in fields[:2 + arity]]
        score = _number(fields[-1], line_number, line, fn, integer=False)
        if src == final_state:
            raise ValueError(f"{fn}: line {line_number}: an arc leaves the final state: {line!r}")
        if (labels[0] == -1) != (dst == final_state):
            raise ValueError(
                f"{fn}: line {line_number}: arcs into the final state {final_state} must "
                f"have label -1 and only they may, got {line!r}")
        if dst == final_state:
            if src in finals:
                raise ValueError(
                    f"{fn}: line {line_number}: state {src} has a second final arc; "
                    f"its final weight would depend on the semiring")
            finals[src] = score
            continue
        if min([src, dst] + labels) < 0:
            raise ValueError(f"{fn}: line {line_number}: negative state or label in {line!r}")
        if max(src, dst) > final_state:
            raise ValueError(
                f"{fn}: line {line_number}: state {max(src, dst)} is above the final "
                f"state {final_state}; k2's final state is the highest-numbered one")
        rows.append([src, dst, *labels, score])
    arcs = np.asarray(rows, dtype=np.float64).reshape(-1, 3 + (arity or 1))
    return build.arcs_from_rows(arcs, finals, num_states=max(final_state, 1), start=0,
                                dtype=dtype, fn=fn)


def format_k2(arrays: build.ArcArrays) -> str:
    """k2 text of an unpadded FSA: final weights become -1 arcs."""
    final_state = arrays.num_states
    lines = []
    for a in range(arrays.src.shape[0]):
        labels = ([arrays.ilabel[a]] if arrays.is_acceptor
                  else [arrays.ilabel[a], arrays.olabel[a]])
        ints = " ".join(str(int(f)) for f in [arrays.src[a], arrays.dst[a], *labels])
        lines.append(f"{ints} {_number_text(arrays.weight[a])}")
    final_labels = "-1" if arrays.is_acceptor else "-1 -1"
    for state in np.flatnonzero(arrays.final_weight > -math.inf):
        lines.append(f"{int(state)} {final_state} {final_labels} "
                     f"{_number_text(arrays.final_weight[state])}")
    lines.append(str(final_state))
    return "".join(line + "\n" for line in lines)
