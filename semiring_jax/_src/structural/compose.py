"""compose and intersect: pair states found on the host
(`host/pairing.py`), within a budget of states and arcs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.structural.arc_map import apply_map
from semiring_jax._src.structural.host import pairing as host_compose
from semiring_jax._src.structural.host import structure

__all__ = ["compose", "intersect"]


# The default budget of compose and intersect (see `compose`).
COMPOSE_MAX_STATES = 1_000_000
COMPOSE_MAX_ARCS = 10_000_000


def _composed(
    fn: str, parts: Sequence[structure.Parts], max_states: int, max_arcs: int
) -> structure.Result:
    """`host_compose.compose` within the budget, whose excess is a ValueError."""
    try:
        return host_compose.compose(*parts, max_states=max_states, max_arcs=max_arcs)
    except host_compose.BudgetExceeded as err:
        what = "pair states" if err.budget == "max_states" else "arcs"
        raise ValueError(
            f"{fn}: more than {err.budget} = {err.limit} {what} (built before trimming); "
            f"the budget bounds the host memory of the construction, pass a larger "
            f"{err.budget}= to allow more"
        ) from None


def _check_budget(value: object, name: str, fn: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{fn}: {name} must be a positive int, got {value!r}")
    return int(value)


def compose(
    a: Fsa,
    b: Fsa,
    *,
    max_states: int = COMPOSE_MAX_STATES,
    max_arcs: int = COMPOSE_MAX_ARCS,
) -> Fsa:
    """The composition a ∘ b: a's output labels meet b's input labels.

    A path of the result pairs a path of `a` and one of `b` whose labels
    match (label 0 is epsilon: each operand's epsilon moves are made alone,
    in one fixed order, OpenFst's sequence filter, so that no pair of paths
    counts twice); its weight is the sum of the two paths' weights (⊗).
    The result holds only states on a successful path; its states are
    numbered in the order they are first reached from (0, 0). An acceptor
    acts as the identity transducer of its labels.

    The construction has a budget, as `determinize` does: the pair states
    and arcs it builds (before trimming, per batch entry) are counted as
    they are found, and more than `max_states` states or `max_arcs` arcs
    stop it with a `ValueError` before the memory for them is taken (the
    construction takes about 70 bytes of host memory per arc, so under
    1 GB at the defaults).

    Args:
      a, b: Fsas (acceptors or transducers, cyclic allowed) of one dtype,
        both unbatched or batched alike.
      max_states: the budget of pair states (1,000,000 by default).
      max_arcs: the budget of arcs (10,000,000 by default).
    Returns:
      A transducer with the input labels of `a` and the output labels of
      `b`; an acceptor when both operands are acceptors.
    Raises:
      ValueError: for dtypes or batch shapes that differ, or past the
        budget (the message names it).
    Examples:
      >>> import semiring_jax as sj
      >>> a = sj.Fsa.from_arcs([(0, 1, 1, 2, 0.5)], final=[1])
      >>> b = sj.Fsa.from_arcs([(0, 1, 2, 3, 0.25), (0, 1, 4, 4, 1.0)], final=[1])
      >>> c = sj.compose(a, b)
      >>> print(c.ilabel, c.olabel, c.weight)
      [1] [3] [0.75]
    """

    max_states = _check_budget(max_states, "max_states", "compose")
    max_arcs = _check_budget(max_arcs, "max_arcs", "compose")

    def make(parts: Sequence[structure.Parts]) -> structure.Result:
        result = _composed("compose", parts, max_states, max_arcs)
        # Two acceptors compose to an acceptor (as in OpenFst): every arc of
        # the result pairs equal labels, epsilon moves included.
        return result._replace(is_acceptor=all(part.is_acceptor for part in parts))

    return apply_map("compose", [a, b], make, same_kind=False)


def intersect(
    a: Fsa,
    b: Fsa,
    *,
    max_states: int = COMPOSE_MAX_STATES,
    max_arcs: int = COMPOSE_MAX_ARCS,
) -> Fsa:
    """The intersection of two acceptors: the paths whose label sequences
    both accept, weighted by the sum of the two weights (⊗). Label 0 is
    epsilon (as in `compose`, of which this is the acceptor case).

    Args:
      a, b: acceptors of one dtype, both unbatched or batched alike.
      max_states, max_arcs: the budget, as in `compose`.
    Returns:
      An acceptor, trimmed to states on a successful path.
    Raises:
      ValueError: if an operand is a transducer, for dtypes or batch
        shapes that differ, or past the budget.
    Examples:
      >>> import semiring_jax as sj
      >>> a = sj.Fsa.from_arcs([(0, 1, 1, 0.5), (0, 1, 2, 0.0)], final=[1])
      >>> b = sj.Fsa.from_arcs([(0, 1, 2, 0.25)], final=[1])
      >>> c = sj.intersect(a, b)
      >>> print(c.label, c.weight, c.is_acceptor)
      [2] [0.25] True
    """
    for i, fsa in enumerate((a, b)):
        if isinstance(fsa, Fsa) and not fsa.is_acceptor:
            raise ValueError(
                f"intersect: operand {i} is a transducer; intersect takes "
                f"acceptors (use compose for transducers)"
            )
    max_states = _check_budget(max_states, "max_states", "intersect")
    max_arcs = _check_budget(max_arcs, "max_arcs", "intersect")
    return apply_map(
        "intersect",
        [a, b],
        lambda parts: _composed("intersect", parts, max_states, max_arcs)._replace(
            is_acceptor=True
        ),
    )
