"""Graphviz drawing of one unpadded FSA (numpy only)."""

from __future__ import annotations

import math

from semiring_jax._src.host import build

__all__ = ["to_dot"]


def _score_text(value: float) -> str:
    return f"{float(value):.4g}"


def to_dot(arrays: build.ArcArrays, *, title: str = "") -> str:
    """Graphviz `digraph` source: states as circles, finals doubled.

    Arc labels read `ilabel:olabel/score` (`label/score` for an acceptor);
    a final state reads `state/final score`. State 0, the start, is bold.
    """
    lines = ["digraph FSA {", '  rankdir = LR;', '  node [shape = circle];']
    if title:
        lines.append(f'  label = "{title}";')
    for state in range(arrays.num_states):
        final = arrays.final_weight[state]
        attributes = []
        if final > -math.inf:
            attributes += [f'label = "{state}/{_score_text(final)}"', "shape = doublecircle"]
        if state == 0:
            attributes.append("style = bold")
        lines.append(f"  {state} [{', '.join(attributes)}];" if attributes else f"  {state};")
    for a in range(arrays.src.shape[0]):
        labels = (f"{arrays.ilabel[a]}" if arrays.is_acceptor
                  else f"{arrays.ilabel[a]}:{arrays.olabel[a]}")
        lines.append(f'  {arrays.src[a]} -> {arrays.dst[a]} '
                     f'[label = "{labels}/{_score_text(arrays.weight[a])}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"
