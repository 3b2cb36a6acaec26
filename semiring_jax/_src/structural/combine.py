"""union and concat of several FSAs (weights gathered by `arc_map`)."""

from __future__ import annotations

from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.structural.arc_map import apply_map
from semiring_jax._src.structural.host import structure

__all__ = ["concat", "union"]


def union(a: Fsa, b: Fsa, *more: Fsa) -> Fsa:
    """The union: a new start state 0 with an epsilon arc (weight 0) into
    each operand's start; operands' states follow in order.

    Args:
      a, b, *more: Fsas of one kind (acceptor or transducer) and dtype, all
        unbatched or all batched alike.
    Returns:
      An Fsa whose successful paths are the operands' paths.
    Raises:
      ValueError: for operands of different kinds, dtypes or batch shapes.
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.union(sj.linear_fsa([1]), sj.linear_fsa([2]))
      >>> print(round(float(sj.tot_score(fsa)), 4))
      0.6931
    """
    return apply_map("union", [a, b, *more], structure.union)


def concat(a: Fsa, b: Fsa, *more: Fsa) -> Fsa:
    """The concatenation: each operand's final states are joined by epsilon
    arcs, weighted by their final weights, to the next operand's start.

    Args:
      a, b, *more: as for `union`.
    Returns:
      An Fsa accepting a path of each operand in turn.
    Raises:
      ValueError: for operands of different kinds, dtypes or batch shapes.
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.concat(sj.linear_fsa([1]), sj.linear_fsa([2, 3]))
      >>> fsa.num_states, fsa.num_arcs
      (5, 4)
    """
    return apply_map("concat", [a, b, *more], structure.concat)
