"""Structural algorithms whose weights stay differentiable.

Each op works out the result's structure on the host (`host/structure.py`),
together with the source of every result weight among the operands' arc and
final weights, and then gathers the weights in JAX. So the structure must be
concrete, but the weights may be traced: `jax.grad` of any score of the
result flows back to the operands' `weight` and `final_weight`. A batched
operand is processed entry by entry and the results are stacked.

Weights are scores (log domain) in any semiring whose ⊗ is addition: new
epsilon arcs weigh 0 (one). Which states are final is structure too
(`final_mask`, concrete), never read from `final_weight`, so a traced final
weight keeps the final states and differentiates like an arc weight; a
result's non-final states store -inf (zero).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from semiring_jax._src import checks
from semiring_jax._src.batch import batch_entries, check_alike, stack
from semiring_jax._src.fsa import Fsa, assemble
from semiring_jax._src.host import build, structure
from semiring_jax._src.host import compose as host_compose
from semiring_jax._src.semiring import TROPICAL

__all__ = [
    "arc_sort",
    "check_operands",
    "closure",
    "compose",
    "concat",
    "connect",
    "deferred_results",
    "intersect",
    "invert",
    "map_entries",
    "parts_of",
    "placeholder",
    "project",
    "prune",
    "reverse",
    "top_sort",
    "trimmed_fsa",
    "union",
]


def parts_of(fsa: Fsa, fn: str) -> structure.Parts:
    """An unbatched Fsa's concrete structure: real arcs, and which states are final."""
    real = checks.concrete(fsa.arc_mask, "arc_mask", fn).astype(bool)
    pick = lambda name: checks.concrete(getattr(fsa, name), name, fn)[real].astype(np.int64)
    # Final states are structure, recorded apart from the (maybe traced)
    # final weights, as arcs are apart from theirs.
    is_final = checks.concrete(fsa.final_mask, "final_mask", fn).astype(bool)
    return structure.Parts(
        fsa.num_states,
        pick("src"),
        pick("dst"),
        pick("ilabel"),
        pick("olabel"),
        is_final,
        fsa.is_acceptor,
    )


def placeholder(
    num_states: int,
    src: npt.ArrayLike,
    dst: npt.ArrayLike,
    ilabel: npt.ArrayLike,
    olabel: npt.ArrayLike,
    dtype: npt.DTypeLike,
    is_acceptor: bool,
    known_levels: np.ndarray | None = None,
    *,
    is_final: npt.ArrayLike | None = None,
    defer: bool = False,
) -> Fsa:
    """An Fsa of the given structure whose weights are still to be set
    (arcs 0, final -inf), for `replace(weight=..., final_weight=...)`;
    `is_final` (bool [S]) names its final states (none by default: replacing
    `final_weight` does not make a state final); `known_levels` and `defer`
    as in `fsa.assemble`."""
    as32 = lambda values: np.asarray(values, np.int32)
    src = as32(src)
    final_mask = (
        np.zeros(num_states, bool) if is_final is None else np.asarray(is_final, bool).copy()
    )
    return assemble(
        build.ArcArrays(
            num_states,
            src,
            as32(dst),
            as32(ilabel),
            as32(olabel),
            np.zeros(len(src), dtype),
            np.full(num_states, -np.inf, dtype),
            is_acceptor,
            final_mask,
        ),
        known_levels=known_levels,
        defer=defer,
    )


# Within `deferred_results()`, `_from_sources` leaves the result's tables
# unbuilt, for the `stack` of an op run entry by entry to build at once.
_DEFERRED: contextvars.ContextVar[bool] = contextvars.ContextVar("deferred", default=False)


@contextlib.contextmanager
def deferred_results() -> Iterator[None]:
    """Within it, the structural ops make their results unbuilt (`schedule`
    None): for ops run entry by entry whose results only `stack` reads,
    which builds each entry's tables once, at the batch's sizes."""
    token = _DEFERRED.set(True)
    try:
        yield
    finally:
        _DEFERRED.reset(token)


def map_entries(op: Callable[..., Fsa], *batches: Fsa, fn: str) -> Fsa:
    """`op` on the entries of batched operands (batch_shape (B,)), its
    results stacked. Neither the operands' entries (unbuilt: structure and
    weights only) nor `op`'s results are built but in that one `stack`, so
    `op` must return a structural op's result and score nothing it makes."""
    entries = zip(*(batch_entries(batch, fn) for batch in batches))
    with deferred_results():
        results = [op(*entry) for entry in entries]
    return stack(results)


def _from_sources(result: structure.Result, sources: Any, zero: int) -> Fsa:
    """The result Fsa; each weight is the product (sum of scores) of its
    sources' entries (gathered in numpy if `sources` is, else in JAX); a
    state is final where no source is `zero` (the index of ZERO among the
    sources)."""
    xp: Any = np if isinstance(sources, np.ndarray) else jnp
    combine = lambda index: sources[index] if index.ndim == 1 else xp.sum(sources[index], axis=-1)
    is_final = result.final_source != zero
    if is_final.ndim == 2:  # a pair: final in both operands
        is_final = is_final.all(axis=1)
    return placeholder(
        result.num_states,
        result.src,
        result.dst,
        result.ilabel,
        result.olabel,
        sources.dtype,
        result.is_acceptor,
        is_final=is_final,
        defer=_DEFERRED.get(),
    ).replace(weight=combine(result.arc_source), final_weight=combine(result.final_source))


def _assemble(operands: Sequence[Fsa], result: structure.Result) -> Fsa:
    """The result Fsa, its weights gathered from the operands' in JAX where
    one is traced (so that gradients flow), else in numpy (no gradient to
    carry, and no device round trip)."""
    weights = [leaf for fsa in operands for leaf in (fsa.weight, fsa.final_weight)]
    xp: Any = jnp if any(checks.is_traced(leaf) for leaf in weights) else np
    pieces = []
    for fsa in operands:
        real = np.flatnonzero(np.asarray(fsa.arc_mask))
        pieces += [xp.asarray(fsa.weight)[real], xp.asarray(fsa.final_weight)]
    dtype = operands[0].dtype
    sources = xp.concatenate([*pieces, xp.array([-np.inf, 0.0], dtype)])
    return _from_sources(result, sources, zero=sources.shape[0] - 2)


def trimmed_fsa(
    num_states: int,
    src: npt.ArrayLike,
    dst: npt.ArrayLike,
    ilabel: npt.ArrayLike,
    olabel: npt.ArrayLike,
    is_final: np.ndarray,
    arc_weight: jax.Array,
    final_weight: jax.Array,
    is_acceptor: bool,
    useful: np.ndarray | None = None,
) -> Fsa:
    """An Fsa of computed weights ([A], [S]), trimmed to the states on a
    successful path (start kept); `is_final` [S] is the structure's;
    `useful` (bool [S]): those states, where the caller knows them."""
    src = np.asarray(src)
    num_arcs = len(src)
    sources = structure.Sources([0], [num_arcs], num_arcs + num_states, num_arcs + num_states + 1)
    final_source = np.where(is_final, num_arcs + np.arange(num_states), sources.zero)
    result = structure.Result(
        num_states,
        src,
        np.asarray(dst),
        np.asarray(ilabel),
        np.asarray(olabel),
        np.arange(num_arcs),
        final_source,
        is_acceptor,
    )
    # Concrete weights are gathered in numpy (see `_assemble`).
    xp: Any = jnp if any(checks.is_traced(w) for w in (arc_weight, final_weight)) else np
    values = xp.concatenate(
        [
            xp.asarray(arc_weight),
            xp.asarray(final_weight),
            xp.array([-np.inf, 0.0], arc_weight.dtype),
        ]
    )
    kept = structure.trimmed(result, sources, useful=useful)
    return _from_sources(kept, values, sources.zero)


def check_operands(operands: Sequence[Fsa], fn: str, same_kind: bool = True) -> None:
    check_alike(operands, fn, lambda i: f"operand {i}", same_kind=same_kind)
    for i, fsa in enumerate(operands):
        if fsa.batch_shape != operands[0].batch_shape:
            raise ValueError(
                f"{fn}: operand {i} has batch_shape {fsa.batch_shape} but "
                f"operand 0 has {operands[0].batch_shape}"
            )


def _apply(
    fn: str,
    operands: Sequence[Fsa],
    make: Callable[[list[structure.Parts]], structure.Result],
    same_kind: bool = True,
) -> Fsa:
    """`make(parts)` on unbatched operands, entry by entry on batched ones."""
    check_operands(operands, fn, same_kind)
    if operands[0].batch_shape:
        return map_entries(
            lambda *entry: _apply(fn, list(entry), make, same_kind), *operands, fn=fn
        )
    result = make([parts_of(fsa, fn) for fsa in operands])
    return _assemble(operands, result)


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
    return _apply("invert", [fsa], lambda parts: structure.invert(parts[0]))


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
    return _apply("project", [fsa], lambda parts: structure.project(parts[0], side))


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
    return _apply("arc_sort", [fsa], lambda parts: structure.arc_sort(parts[0], by))


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

    return _apply("top_sort", [fsa], make)


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
    return _apply("connect", [fsa], lambda parts: structure.connect(parts[0]))


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
    return _apply("reverse", [fsa], lambda parts: structure.reverse(parts[0]))


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
    return _apply("union", [a, b, *more], structure.union)


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
    return _apply("concat", [a, b, *more], structure.concat)


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
    return _apply("closure", [fsa], lambda parts: structure.closure(parts[0]))


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

    return _apply("compose", [a, b], make, same_kind=False)


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
    return _apply(
        "intersect",
        [a, b],
        lambda parts: _composed("intersect", parts, max_states, max_arcs)._replace(
            is_acceptor=True
        ),
    )


def prune(fsa: Fsa, beam: float) -> Fsa:
    """Drops the arcs (and final states) whose best path through them scores
    more than `beam` below the best path, then trims the rest (`connect`).

    Unlike the other structural ops, the result's structure depends on
    weight values, so the weights must be concrete (not traced); the kept
    weights are still gathered in JAX. An arc survives when α[src] + weight
    + β[dst] >= best - beam (TROPICAL forward and backward scores), so
    `beam=0` keeps the best paths (all of them, on ties) and `beam=inf`
    keeps every arc on a successful path.

    Args:
      fsa: an acyclic Fsa, single or batched, with concrete weights.
      beam: float >= 0, in score units.
    Returns:
      The pruned Fsa; the start alone if no path succeeds.
    Raises:
      ValueError: for traced weights, a negative or NaN beam, or a cycle
        (naming a state on it).
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (0, 1, 2, -3.0), (1, 2, 3, 0.0)],
      ...                        final=[2])
      >>> print(sj.prune(fsa, 1.0).label, sj.prune(fsa, 5.0).label)
      [1 3] [1 2 3]
    """
    from semiring_jax._src.tot_score import backward_scores, check_scorable, forward_scores

    if not beam >= 0:
        raise ValueError(f"prune: beam must be >= 0, got {beam}")
    check_scorable(fsa, "prune")
    for name in ("weight", "final_weight"):
        checks.check_not_traced(getattr(fsa, name), name, "prune")

    # The scores of a batch are computed on the batch: its entries are
    # pruned unbuilt (see `map_entries`), each built once when stacked.
    alpha = np.asarray(forward_scores(fsa, TROPICAL), np.float64)
    beta = np.asarray(backward_scores(fsa, TROPICAL), np.float64)
    if not fsa.batch_shape:
        return _pruned(fsa, alpha, beta, beam)
    entries = batch_entries(fsa, "prune")
    with deferred_results():
        results = [
            _pruned(entry, alpha[b, : entry.num_states], beta[b, : entry.num_states], beam)
            for b, entry in enumerate(entries)
        ]
    return stack(results)


def _pruned(fsa: Fsa, alpha: np.ndarray, beta: np.ndarray, beam: float) -> Fsa:
    """`prune` of an unbatched Fsa, given its TROPICAL forward and backward
    scores [S]."""
    real = np.flatnonzero(np.asarray(fsa.arc_mask))
    src, dst = np.asarray(fsa.src)[real], np.asarray(fsa.dst)[real]
    best = beta[0]
    threshold = best - beam if best > -np.inf else np.inf  # no path: keep nothing
    keep_arc = alpha[src] + np.asarray(fsa.weight, np.float64)[real] + beta[dst] >= threshold
    keep_final = alpha + np.asarray(fsa.final_weight, np.float64) >= threshold
    return _apply("prune", [fsa], lambda parts: structure.prune(parts[0], keep_arc, keep_final))
