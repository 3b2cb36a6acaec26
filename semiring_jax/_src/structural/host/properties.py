"""Structural properties of one unpadded FSA, as OpenFst's `fstinfo` reports them.

Numpy only. Every property is read from the structure (`src`, `dst`,
labels, which states are final), never from weight values: an arc of
weight -inf still counts, as an arc of weight Zero does in OpenFst. The
definitions follow OpenFst's `ComputeProperties`, so they can be checked
against `fst.properties(mask, True)`:

- acyclic: no cycle anywhere (a self-loop is a cycle), not only among the
  accessible states;
- input (output) deterministic: no state has two arcs with the same input
  (output) label; epsilon counts as a label like any other;
- input (output) epsilons: some arc has input (output) label 0;
  input/output epsilons: some arc has both labels 0;
- accessible: every state is reachable from the start state 0;
  coaccessible: a final state is reachable from every state.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from semiring_jax._src.core.host import build, levels

__all__ = [
    "Properties",
    "fsa_properties",
    "is_deterministic",
    "is_label_sorted",
]


class Properties(NamedTuple):
    """What `fsa_properties` finds; counts are ints, properties bools."""

    is_acceptor: bool  # the Fsa's kind (acceptor or transducer)
    num_states: int
    num_arcs: int
    num_final_states: int
    num_epsilons: int  # arcs with input and output label 0
    num_input_epsilons: int
    num_output_epsilons: int
    num_accessible: int
    num_coaccessible: int
    num_connected: int
    acceptor: bool  # ilabel == olabel on every arc (OpenFst's kAcceptor)
    input_deterministic: bool
    output_deterministic: bool
    epsilons: bool
    input_epsilons: bool
    output_epsilons: bool
    input_label_sorted: bool
    output_label_sorted: bool
    acyclic: bool
    top_sorted: bool
    accessible: bool
    coaccessible: bool
    connected: bool


def is_deterministic(src: np.ndarray, labels: np.ndarray) -> bool:
    """Whether no state has two arcs with the same label (0 included).

    Args:
      src: int [A], arc source states.
      labels: int [A], the input or the output labels.
    Returns:
      True if every (state, label) pair names at most one arc.
    Examples:
      >>> import numpy as np
      >>> is_deterministic(np.array([0, 0, 1]), np.array([5, 6, 5]))
      True
      >>> is_deterministic(np.array([0, 0]), np.array([0, 0]))
      False
    """
    if src.size == 0:
        return True
    keys = src.astype(np.int64) * (int(labels.max()) + 1) + labels.astype(np.int64)
    return bool(np.unique(keys).size == keys.size)


def is_label_sorted(src: np.ndarray, labels: np.ndarray) -> bool:
    """Whether each state's arcs, in their stored order, have non-decreasing labels.

    Args:
      src: int [A], arc source states.
      labels: int [A], the input or the output labels.
    Returns:
      True if OpenFst would call the FSA label-sorted on that side.
    Examples:
      >>> import numpy as np
      >>> is_label_sorted(np.array([0, 1, 0]), np.array([2, 1, 3]))
      True
      >>> is_label_sorted(np.array([0, 1, 0]), np.array([3, 1, 2]))
      False
    """
    order = np.argsort(src, kind="stable")
    same_state = src[order][1:] == src[order][:-1]
    return bool(np.all(~same_state | (labels[order][1:] >= labels[order][:-1])))


def fsa_properties(arrays: build.ArcArrays) -> Properties:
    """The structural properties of an unpadded FSA (start state 0).

    Args:
      arrays: the real arcs and the final weights (-inf: not final), e.g.
        from `Fsa._host_arrays`.
    Returns:
      A `Properties`.
    Examples:
      >>> import numpy as np
      >>> from semiring_jax._src.core.host import build
      >>> arrays = build.ArcArrays(3, np.array([0, 0]), np.array([1, 1]), np.array([0, 5]),
      ...                          np.array([0, 5]), np.zeros(2), np.array([-np.inf, 0.0, 0.0]),
      ...                          True)
      >>> props = fsa_properties(arrays)
      >>> props.acyclic, props.input_deterministic, props.epsilons, props.accessible
      (True, True, True, False)
      >>> props.num_accessible, props.num_coaccessible, props.num_connected
      (2, 3, 2)
    """
    num_states = arrays.num_states
    src = np.asarray(arrays.src, dtype=np.int64)
    dst = np.asarray(arrays.dst, dtype=np.int64)
    ilabel, olabel = np.asarray(arrays.ilabel), np.asarray(arrays.olabel)
    is_final = np.asarray(arrays.final_weight) > -np.inf
    accessible = levels.reachable_states(num_states, np.array([0]), src, dst)
    coaccessible = levels.reachable_states(num_states, np.flatnonzero(is_final), dst, src)
    num_epsilons = int(np.sum((ilabel == 0) & (olabel == 0)))
    num_input_epsilons = int(np.sum(ilabel == 0))
    num_output_epsilons = int(np.sum(olabel == 0))
    return Properties(
        is_acceptor=bool(arrays.is_acceptor),
        num_states=num_states,
        num_arcs=int(src.size),
        num_final_states=int(is_final.sum()),
        num_epsilons=num_epsilons,
        num_input_epsilons=num_input_epsilons,
        num_output_epsilons=num_output_epsilons,
        num_accessible=int(accessible.sum()),
        num_coaccessible=int(coaccessible.sum()),
        num_connected=int((accessible & coaccessible).sum()),
        acceptor=bool(np.all(ilabel == olabel)),
        input_deterministic=is_deterministic(src, ilabel),
        output_deterministic=is_deterministic(src, olabel),
        epsilons=num_epsilons > 0,
        input_epsilons=num_input_epsilons > 0,
        output_epsilons=num_output_epsilons > 0,
        input_label_sorted=is_label_sorted(src, ilabel),
        output_label_sorted=is_label_sorted(src, olabel),
        acyclic=levels.longest_path_levels(num_states, src, dst) is not None,
        top_sorted=bool(np.all(dst > src)),
        accessible=bool(accessible.all()),
        coaccessible=bool(coaccessible.all()),
        connected=bool(accessible.all() and coaccessible.all()),
    )
