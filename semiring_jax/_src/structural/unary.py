"""Structural ops of one FSA: invert, project, arc_sort, top_sort, connect,
reverse and closure (weights gathered by `arc_map`).
"""

from __future__ import annotations

from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.structural.arc_map import apply_map
from semiring_jax._src.structural.host import structure

__all__ = ["arc_sort", "closure", "connect", "invert", "project", "reverse", "top_sort"]


def invert(fsa: Fsa) -> Fsa:
    """Swaps input and output labels (an acceptor stays as it is).

    Args:
      fsa: an Fsa, single or batched; structure concrete, weights may be traced.
    Returns:
      An Fsa with the same states, arcs and weights.
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.invert(sj.Fsa.from_arcs([(0, 1, 3, 4, 0.5)], final=[1]))
      >>> print(fsa.ilabel, fsa.olabel)
      [4] [3]
    """
    return apply_map("invert", [fsa], lambda parts: structure.invert(parts[0]))


def project(fsa: Fsa, side: str = "input") -> Fsa:
    """The acceptor of the input (or output) side's labels.

    Args:
      fsa: an Fsa, single or batched.
      side: "input" or "output".
    Returns:
      An acceptor with the same states, arcs and weights.
    Raises:
      ValueError: for another `side`.
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 3, 4, 0.5)], final=[1])
      >>> print(sj.project(fsa, "output").ilabel, sj.project(fsa).is_acceptor)
      [4] True
    """
    if side not in ("input", "output"):
        raise ValueError(f"project: side must be 'input' or 'output', got {side!r}")
    return apply_map("project", [fsa], lambda parts: structure.project(parts[0], side))


def arc_sort(fsa: Fsa, by: str = "ilabel") -> Fsa:
    """Arcs ordered by source state, then `by` label, then the other label,
    then destination (ties keep their order); states are unchanged.

    Args:
      fsa: an Fsa, single or batched.
      by: "ilabel" or "olabel".
    Returns:
      The same FSA with its arcs permuted.
    Raises:
      ValueError: for another `by`.
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 5, 0.5), (0, 1, 2, 0.25)], final=[1])
      >>> print(sj.arc_sort(fsa).label, sj.arc_sort(fsa).weight)
      [2 5] [0.25 0.5 ]
    """
    if by not in ("ilabel", "olabel"):
        raise ValueError(f"arc_sort: by must be 'ilabel' or 'olabel', got {by!r}")
    return apply_map("arc_sort", [fsa], lambda parts: structure.arc_sort(parts[0], by))


def top_sort(fsa: Fsa) -> Fsa:
    """States renumbered so that every arc goes to a higher-numbered state.

    The start stays state 0, so an arc into the start (from a state it
    cannot reach) makes the order impossible.

    Args:
      fsa: an acyclic Fsa, single or batched.
    Returns:
      The same FSA with states renumbered (arcs keep their order).
    Raises:
      ValueError: for a cycle (naming a state on it) or an arc into the start.
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.top_sort(sj.Fsa.from_arcs([(0, 2, 1, 0.0), (2, 1, 2, 0.0)], final=[1]))
      >>> print(fsa.src, fsa.dst)
      [0 1] [1 2]
    """

    def make(parts: list[structure.Parts]) -> structure.Result:
        result, culprit = structure.top_sort(parts[0])
        if culprit and culprit[0] == "start":
            raise ValueError(
                f"top_sort: state {culprit[1]} has an arc into the start state 0, "
                f"so no order can start with it; connect the FSA first"
            )
        if culprit:
            path = " -> ".join(str(state) for state in culprit)
            raise ValueError(f"top_sort: state {culprit[0]} lies on a cycle ({path})")
        assert result is not None  # no culprit: top_sort gave a result
        return result

    return apply_map("top_sort", [fsa], make)


def connect(fsa: Fsa) -> Fsa:
    """Keeps only the states on a path from the start to a final state.

    States keep their relative order (the start stays 0); an FSA with no
    successful path becomes the start state alone. Which states are final is
    read from `final_weight > -inf`; arcs of weight -inf are kept (structure
    never depends on weight values).

    Args:
      fsa: an Fsa (cyclic allowed), single or batched.
    Returns:
      The trimmed Fsa.
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (0, 2, 2, 0.0)], final=[1])
      >>> sj.connect(fsa)
      Fsa(acceptor, num_states=2, num_arcs=1)
    """
    return apply_map("connect", [fsa], lambda parts: structure.connect(parts[0]))


def reverse(fsa: Fsa) -> Fsa:
    """The reversed FSA (OpenFst's Reverse): it accepts each string reversed,
    with the same weight.

    A new start state 0 has epsilon arcs into the old final states (state s
    becomes s + 1), weighted by their final weights; every arc is turned
    around; the old start is the one final state (weight 0).

    Args:
      fsa: an Fsa (cyclic allowed), single or batched.
    Returns:
      An Fsa with one more state.
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.reverse(sj.Fsa.from_arcs([(0, 1, 7, 0.5)], final={1: 0.25}))
      >>> print(fsa.src, fsa.dst, fsa.weight, fsa.final_weight)
      [0 2] [2 1] [0.25 0.5 ] [-inf   0. -inf]
    """
    return apply_map("reverse", [fsa], lambda parts: structure.reverse(parts[0]))


def closure(fsa: Fsa) -> Fsa:
    """The Kleene star (OpenFst's Closure): zero or more repetitions.

    A new start state 0, final with weight 0, has an epsilon arc into the old
    start (state s becomes s + 1), and each final state an epsilon arc,
    weighted by its final weight, back to the old start. The result is
    cyclic when the input has a final state: score ops refuse it, other
    structural ops take it.

    Args:
      fsa: an Fsa, single or batched.
    Returns:
      An Fsa with one more state.
    Examples:
      >>> import semiring_jax as sj
      >>> sj.closure(sj.linear_fsa([1]))
      Fsa(acceptor, num_states=3, num_arcs=3, cyclic)
    """
    return apply_map("closure", [fsa], lambda parts: structure.closure(parts[0]))
