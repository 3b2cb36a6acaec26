"""Graphviz drawing of one unpadded FSA, and rendering it to SVG (numpy only)."""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from semiring_jax._src.core.host import build

__all__ = ["RENDER_TIMEOUT_S", "render_svg", "symbol_lookup", "to_dot"]

# A drawing that takes longer than this is too big to look at anyway; the
# notebook falls back to the source instead of hanging.
RENDER_TIMEOUT_S = 20.0

# The ramp arc values are drawn on: light grey (low) to dark blue (high),
# readable on white for every value, and in greyscale print.
_LOW_RGB = (0xC8, 0xC8, 0xC8)
_HIGH_RGB = (0x08, 0x30, 0x6B)
_PEN_WIDTHS = (0.5, 4.0)


def symbol_lookup(table: Any, name: str, fn: str) -> Callable[[int], str | None]:
    """A function from label to symbol string (None when the table lacks it).

    Args:
      table: None (labels print as numbers), an object with a `find(int) ->
        str` method (`sj.SymbolTable`, pynini's), a `Mapping[int, str]`, or
        a `Sequence[str]` indexed by label.
      name: the argument's name, for messages.
      fn: the calling function's name, for messages.
    Returns:
      `lookup(label)`; for `None` it returns `str(label)`.
    Raises:
      TypeError: for any other kind of table (a plain `str` included).
    Examples:
      >>> from semiring_jax._src.io.host.dot import symbol_lookup
      >>> lookup = symbol_lookup(["<eps>", "a"], "isymbols", "to_dot")
      >>> lookup(1), lookup(7)
      ('a', None)
    """
    if table is None:
        return str
    if not isinstance(table, (str, bytes)):  # a str has a find method but is no table
        if hasattr(table, "find"):
            return lambda label: _found(table, label)
        if isinstance(table, Mapping):
            return lambda label: _checked_symbol(table.get(label), table, label)
        if isinstance(table, Sequence):
            return lambda label: (
                _checked_symbol(table[label], table, label) if 0 <= label < len(table) else None
            )
    raise TypeError(
        f"{fn}: {name} must be a symbol table (with find(int) -> str), a "
        f"Mapping[int, str] or a Sequence[str], got {type(table).__name__}"
    )


def _found(table: Any, label: int) -> str | None:
    try:
        symbol = table.find(label)
    except (KeyError, ValueError, IndexError):
        return None
    # pynini's find answers "" for a key it does not hold.
    return _checked_symbol(symbol, table, label) if symbol != "" else None


def _checked_symbol(symbol: Any, table: Any, label: int) -> str | None:
    if symbol is None or isinstance(symbol, str):
        return symbol
    raise TypeError(
        f"symbol table {type(table).__name__} maps label {label} to "
        f"{type(symbol).__name__}, expected str"
    )


def _quoted(text: str) -> str:
    """`text` as the body of a Graphviz double-quoted string."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float, precision: int) -> str:
    return f"{float(value):.{precision}g}"


def _symbols(
    labels: np.ndarray, lookup: Callable[[int], str | None], name: str, fn: str
) -> list[str]:
    """The symbol of each arc's label; a ValueError names an arc without one."""
    symbols = []
    for arc, label in enumerate(labels.tolist()):
        symbol = lookup(label)
        if symbol is None:
            raise ValueError(f"{fn}: arc {arc} has label {label}, which {name} does not hold")
        symbols.append(symbol)
    return symbols


def _value_fractions(values: np.ndarray) -> np.ndarray:
    """Each value's place in [0, 1] between the finite minimum and maximum.

    Non-finite values sit at 0 (drawn as the lowest); when all finite values
    are equal they sit at 1, so a certain path is drawn as strong as it can.
    """
    finite = np.isfinite(values)
    if not finite.any():
        return np.zeros(values.shape)
    low, high = values[finite].min(), values[finite].max()
    if high <= low:
        return np.where(finite, 1.0, 0.0)
    return np.where(finite, (np.where(finite, values, low) - low) / (high - low), 0.0)


def _ramp_colour(fraction: float) -> str:
    rgb = (round(lo + fraction * (hi - lo)) for lo, hi in zip(_LOW_RGB, _HIGH_RGB))
    return "#" + "".join(f"{channel:02x}" for channel in rgb)


def to_dot(
    arrays: build.ArcArrays,
    *,
    title: str = "",
    isymbols: Any = None,
    osymbols: Any = None,
    show_weights: bool = True,
    arc_values: np.ndarray | None = None,
    value_name: str = "",
    precision: int = 3,
    color: bool = True,
    width: bool = True,
    fn: str = "to_dot",
) -> str:
    """Graphviz `digraph` source: states as circles, finals doubled.

    Arc labels read `ilabel:olabel/score` (`label/score` for an acceptor),
    then a second line `value_name=value` with `arc_values`; a final state
    reads `state/final score`. State 0, the start, is bold.

    Args:
      arrays: the real (unpadded) arcs [A] and final weights [S].
      title: a graph title; empty for none.
      isymbols, osymbols: symbol tables for the input and output labels (see
        `symbol_lookup`); None prints numbers. An acceptor draws only its
        input labels.
      show_weights: whether arc and final scores are written.
      arc_values: float [A], one number per real arc, or None.
      value_name: the name written before each arc value.
      precision: significant digits of scores and values.
      color: colour arcs by value, light grey (min) to dark blue (max).
      width: widen arcs by value, from 0.5 (min) to 4 (max).
      fn: the public function's name, for messages.
    Returns:
      The source, ending in a newline.
    Raises:
      ValueError: for an arc whose label a symbol table does not hold,
        arc_values of the wrong shape, or a precision below 1.
      TypeError: for a symbol table of an unsupported kind.
    Examples:
      >>> import numpy as np
      >>> from semiring_jax._src.core.host import build
      >>> from semiring_jax._src.io.host.dot import to_dot
      >>> arrays = build.ArcArrays(2, np.array([0]), np.array([1]), np.array([1]),
      ...                          np.array([1]), np.array([0.5]), np.array([-np.inf, 0.0]), True)
      >>> print(to_dot(arrays, isymbols=["<eps>", "a"]).splitlines()[-2])
        0 -> 1 [label = "a/0.5"];
    """
    if isinstance(precision, bool) or not isinstance(precision, int) or precision < 1:
        raise ValueError(
            f"{fn}: precision must be an int >= 1 (significant digits), got {precision!r}"
        )
    num_arcs = arrays.src.shape[0]
    ilabels = _symbols(arrays.ilabel, symbol_lookup(isymbols, "isymbols", fn), "isymbols", fn)
    # An acceptor's olabel equals its ilabel and is not drawn.
    olabels = (
        ilabels
        if arrays.is_acceptor
        else _symbols(arrays.olabel, symbol_lookup(osymbols, "osymbols", fn), "osymbols", fn)
    )
    if arc_values is not None:
        arc_values = np.asarray(arc_values, dtype=np.float64)
        if arc_values.shape != (num_arcs,):
            raise ValueError(
                f"{fn}: arc_values must have shape [A] = ({num_arcs},) (one per "
                f"real arc), got {arc_values.shape}"
            )
        fractions = _value_fractions(arc_values)

    lines = ["digraph FSA {", "  rankdir = LR;", "  node [shape = circle];"]
    if title:
        lines.append(f'  label = "{_quoted(title)}";')
    for state in range(arrays.num_states):
        final = arrays.final_weight[state]
        attributes = []
        if final > -math.inf:
            text = f"{state}/{_number(final, precision)}" if show_weights else f"{state}"
            attributes += [f'label = "{text}"', "shape = doublecircle"]
        if state == 0:
            attributes.append("style = bold")
        lines.append(f"  {state} [{', '.join(attributes)}];" if attributes else f"  {state};")
    for a in range(num_arcs):
        text = ilabels[a] if arrays.is_acceptor else f"{ilabels[a]}:{olabels[a]}"
        if show_weights:
            text += f"/{_number(arrays.weight[a], precision)}"
        attributes = []
        if arc_values is not None:
            value = _number(arc_values[a], precision)
            text += f"\n{value_name}={value}" if value_name else f"\n{value}"
            if color:
                colour = _ramp_colour(float(fractions[a]))
                attributes += [f'color = "{colour}"', f'fontcolor = "{colour}"']
            if width:
                low, high = _PEN_WIDTHS
                attributes.append(f"penwidth = {low + float(fractions[a]) * (high - low):.2f}")
        attributes.insert(0, f'label = "{_quoted(text)}"')
        lines.append(f"  {arrays.src[a]} -> {arrays.dst[a]} [{', '.join(attributes)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_svg(source: str) -> str | None:
    """`dot -Tsvg` of Graphviz source; None when `dot` is missing, fails or
    takes longer than `RENDER_TIMEOUT_S` (a notebook picture must never
    raise).

    Args:
      source: Graphviz source.
    Returns:
      The SVG text, or None.
    Examples:
      >>> from semiring_jax._src.io.host.dot import render_svg
      >>> svg = render_svg("digraph { 0 -> 1; }")
      >>> svg is None or "<svg" in svg
      True
    """
    program = shutil.which("dot")
    if program is None:
        return None
    try:
        result = subprocess.run(
            [program, "-Tsvg"],
            input=source,
            text=True,
            capture_output=True,
            check=False,
            timeout=RENDER_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout if result.returncode == 0 and "<svg" in result.stdout else None
