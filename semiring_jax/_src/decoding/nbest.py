"""nbest: the n best paths of an acyclic Fsa, exactly, as linear Fsas.

Which arcs the paths take is worked out on the host (`host/kshortest.py`)
from the weights' values; the paths' weights are then gathered from the
input's in JAX (`path_as_chain`), so the scores of the paths differentiate
into the input's arc and final weights while the choice is a constant.
Under `jax.grad` outside `jax.jit` the weights are tracers whose values
are known: `jax.lax.stop_gradient` gives them as arrays, and only a truly
abstract value (inside `jax.jit` or `jax.vmap`) is refused.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from semiring_jax._src.core import checks, route_table, routes
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.semiring import TROPICAL
from semiring_jax._src.decoding.host import kshortest
from semiring_jax._src.kernels import kshortest_ops
from semiring_jax._src.scores.best_path import path_as_chain
from semiring_jax._src.scores.tot_score import check_scorable, final_weights

__all__ = ["nbest"]


def nbest(fsa: Fsa, n: int, *, unique: bool = False) -> Fsa:
    """The `n` best successful paths, best first, as linear Fsas.

    A path's score is the sum of its arc weights plus the final weight of
    the state it stops in (TROPICAL, higher is better); padding arcs
    (`arc_mask` False) and arcs of weight -inf are not usable. The search
    is exact (k shortest paths by a best-first search on exact scores to
    the end, each state expanded at most `n` times; not an enumeration of
    all paths). With `unique=True`, paths are distinct as output-label
    strings with 0 (epsilon) dropped, each string by its best path (OpenFst
    `shortestpath(nshortest=n, unique=True)`). With fewer than `n` paths
    (strings) the rest are missing: no real arc, no final state, score -inf.

    Ties: of paths with equal scores, the one whose sequence of arc indices
    (of its batch entry) is lexicographically smaller comes first, and a
    path that stops in a state comes before those that go on from it; with
    `unique=True` each string's path is the first of its paths in that
    order. The order is decided in float64 on the host (by compiled C on
    a CPU backend where the CPU kernels are built, by numpy elsewhere, a
    GPU or TPU host included: the same paths); the results' `tot_score` is
    summed in the Fsa's dtype.

    Each path is a linear Fsa of N states and N - 1 arc slots (N: `fsa`'s
    schedule steps, as `best_path`), its arcs first, the other slots
    padding (weight -inf), only its last state final. Every weight is a
    gather of `fsa`'s weights, so `jax.grad` through the paths' scores
    reaches `fsa.weight` and `fsa.final_weight`: call `nbest` outside
    `jax.jit` (under `jax.grad` is fine), as its search needs the weights'
    values.

    Args:
      fsa: an acyclic Fsa, single or batched with batch axes [...], weights
        concrete (not inside `jax.jit` or `jax.vmap`).
      n: the number of paths, a positive Python int.
      unique: distinct output strings (epsilon dropped) instead of paths.
    Returns:
      A linear Fsa with batch shape [..., n] (the input's batch axes, then
      the paths), arc fields [..., n, N - 1], state fields [..., n, N].
    Raises:
      ValueError: if `fsa` has a cycle (naming a state on it), `n` is not a
        positive int, the weights are traced, or a real arc (final state)
        has a NaN or +inf weight (naming it).
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs(
      ...     [(0, 1, 1, 0.0), (0, 1, 2, -1.0), (1, 2, 3, 0.5), (1, 2, 4, 0.0)], final=[2])
      >>> paths = sj.nbest(fsa, 5)
      >>> print(paths.batch_shape, paths.label.tolist())
      (5,) [[1, 3], [1, 4], [2, 3], [2, 4], [0, 0]]
      >>> print(sj.tot_score(paths))
      [ 0.5  0.  -0.5 -1.  -inf]
      >>> words = sj.Fsa.from_arcs([(0, 1, 1, 7, 0.0), (0, 1, 2, 7, -1.0), (1, 2, 3, 0, 0.0)],
      ...                          final=[2])
      >>> paths = sj.nbest(words, 2, unique=True)  # one path spells (7,)
      >>> print(paths.ilabel.tolist(), sj.tot_score(paths))
      [[1, 3], [0, 0]] [  0. -inf]
    """
    fn = "nbest"
    check_scorable(fsa, fn)
    n = checks.check_int(n, "n", fn, 1)
    if not isinstance(unique, (bool, np.bool_)):
        raise ValueError(f"{fn}: unique must be a bool, got {unique!r}")
    weight = _values(fsa.weight, "weight", fn)
    final_weight = _values(fsa.final_weight, "final_weight", fn)
    src, dst, olabel = (checks.concrete(getattr(fsa, f), f, fn) for f in ("src", "dst", "olabel"))
    arc_mask = checks.concrete(fsa.arc_mask, "arc_mask", fn).astype(bool)
    final_mask = checks.concrete(fsa.final_mask, "final_mask", fn).astype(bool)

    batch_shape = fsa.batch_shape
    steps = fsa.schedule.levels.pos_state.shape[-2]  # N: every path has at most N - 1 arcs
    num_entries = int(np.prod(batch_shape, dtype=np.int64))
    flat = lambda value: value.reshape(num_entries, value.shape[-1])
    per_entry = [flat(v) for v in (src, dst, olabel, weight, final_weight, arc_mask, final_mask)]
    found = [
        _entry_paths([v[b] for v in per_entry], n, steps - 1, bool(unique), _where(b, batch_shape))
        for b in range(num_entries)
    ]
    fields = [np.stack([getattr(p, name) for p in found]) for name in kshortest.Paths._fields[:4]]
    arcs, lengths, final_states, is_found = (f.reshape(*batch_shape, *f.shape[1:]) for f in fields)
    # int64 lengths become JAX's default int (as `jnp.arange`'s, which
    # `path_as_chain` compares them with), with or without x64.
    return _chains(fsa, arcs, lengths.astype(np.int64), final_states, is_found)


def _values(value: Any, name: str, fn: str) -> np.ndarray:
    """The values of a weight array, also under `jax.grad` outside `jax.jit`
    (where `stop_gradient` gives them); a ValueError if they are abstract."""
    value = jax.lax.stop_gradient(value)
    if checks.is_traced(value):
        raise ValueError(
            f"{fn}: {name} is a traced value; {fn} chooses the paths on the host from "
            f"the weights' values, so call it outside jax.jit / jax.vmap (jax.grad is "
            f"fine: the paths' weights stay differentiable)"
        )
    return np.asarray(value, np.float64)


def _where(entry: int, batch_shape: tuple[int, ...]) -> str:
    """' of batch entry (i, j)' for a message, '' when unbatched."""
    if not batch_shape:
        return ""
    index = np.unravel_index(entry, batch_shape)
    return f" of batch entry {tuple(int(i) for i in index)}"


def _entry_paths(
    arrays: list[np.ndarray], n: int, slots: int, unique: bool, where: str
) -> kshortest.Paths:
    """The host search on one entry, after refusing NaN and +inf weights;
    `arrays`: its src, dst, olabel [A], weight (float64 [A]), final_weight
    (float64 [S]), arc_mask [A] and final_mask [S]."""
    src, dst, olabel, weight, final_weight, arc_mask, final_mask = arrays
    for what, values, mask in (
        ("arc", weight, arc_mask),
        ("final state", final_weight, final_mask),
    ):
        bad = np.flatnonzero(mask & (np.isnan(values) | (values == np.inf)))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"nbest: {what} {i}{where} has weight {values[i]}; weights must be finite or -inf"
            )
    usable = np.flatnonzero(arc_mask & (weight > -np.inf))
    final = np.where(final_mask, final_weight, -np.inf)
    return kshortest.k_shortest(
        final_weight.shape[0],
        src[usable],
        dst[usable],
        olabel[usable],
        usable,
        weight[usable],
        final,
        n,
        slots,
        unique=unique,
        compiled=kshortest_ops.k_shortest if _compiled_search(weight.dtype) else None,
    )


def _compiled_search(dtype: np.dtype) -> bool:
    """Whether `nbest`'s route (`route_table.NBEST`) is the C search."""
    return routes.on_host(route_table.NBEST, dtype) == "host_kernel"


@jax.jit
def _chains(
    fsa: Fsa, arcs: jax.Array, lengths: jax.Array, final_states: jax.Array, found: jax.Array
) -> Fsa:
    """The chosen paths as linear Fsas: gathers of `fsa`'s weights, mapped
    over the paths [n] and then the batch axes."""

    def one_entry(
        entry: Fsa, arcs: jax.Array, lengths: jax.Array, final_states: jax.Array, found: jax.Array
    ) -> Fsa:
        final_weight = final_weights(entry, TROPICAL)

        def chain(arcs: jax.Array, length: jax.Array, state: jax.Array, ok: jax.Array) -> Fsa:
            return path_as_chain(entry, arcs, length, state, ok, final_weight)

        return jax.vmap(chain)(arcs, lengths, final_states, found)

    mapped = one_entry
    for _ in fsa.batch_shape:
        mapped = jax.vmap(mapped)
    return mapped(fsa, arcs, lengths, final_states, found)
