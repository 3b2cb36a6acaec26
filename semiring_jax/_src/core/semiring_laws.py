"""`check_semiring_laws`: a test helper for user-defined semirings."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src.core import records
from semiring_jax._src.core.semiring import Semiring

__all__ = ["check_semiring_laws"]


def _close(a: Any, b: Any, rtol: float, atol: float) -> np.ndarray:
    """Per record [N]: whether every field of a and b agrees (equal
    infinities agree; NaN agrees with nothing)."""
    agree = None
    for leaf_a, leaf_b in zip(records.leaves_of(a), records.leaves_of(b)):
        leaf_a, leaf_b = np.asarray(leaf_a, np.float64), np.asarray(leaf_b, np.float64)
        same = np.isclose(leaf_a, leaf_b, rtol=rtol, atol=atol)
        same = same.reshape(same.shape[0], -1).all(axis=1)
        agree = same if agree is None else agree & same
    assert agree is not None
    return agree


def _show(record: Any, index: int) -> str:
    return str(jax.tree_util.tree_map(lambda leaf: np.asarray(leaf)[index].tolist(), record))


def _check_samples(semiring: Semiring, samples: Any) -> int:
    """N, the number of records in `samples`; a ValueError naming `samples`
    unless it has the pytree structure of `semiring.zero` with each leaf
    [N, *that leaf's record shape], N >= 1 (the laws index records along
    the leading axis)."""
    fn = "check_semiring_laws"
    expected: jax.tree_util.PyTreeDef = jax.tree_util.tree_structure(semiring.zero)
    got: jax.tree_util.PyTreeDef = jax.tree_util.tree_structure(samples)
    if got != expected:
        raise ValueError(
            f"{fn}: samples must be a record array with the pytree structure of "
            f"{semiring.name!r}'s zero, {expected}; got {got}"
        )
    size = None
    for i, (leaf, zero_leaf) in enumerate(
        zip(records.leaves_of(samples), records.leaves_of(semiring.zero))
    ):
        shape, record_shape = np.shape(leaf), np.shape(zero_leaf)
        if (
            len(shape) != 1 + len(record_shape)
            or shape[1:] != record_shape
            or (size is not None and shape[0] != size)
        ):
            described = "[N" + "".join(f", {d}" for d in record_shape) + "]"
            if size is not None:
                described += f" = {(size, *record_shape)}"
            raise ValueError(
                f"{fn}: samples leaf {i} has shape {shape}; expected {described} "
                f"(N records of {semiring.name!r}, on the leading axis)"
            )
        size = shape[0]
    if not size:
        raise ValueError(f"{fn}: samples must hold at least one record (N >= 1), got N = 0")
    return size


def check_semiring_laws(
    semiring: Semiring, samples: Any, *, rtol: float = 1e-5, atol: float = 1e-6
) -> None:
    """Checks that a semiring's operations obey the semiring laws on
    sample weights, for use in a user's tests.

    On every pair and triple (a, b, c) of the samples it checks: ⊕ is
    associative and commutative with identity `zero`; ⊗ is associative
    with identity `one` on both sides; `zero` annihilates on both sides;
    ⊗ distributes over ⊕ on both sides; `sum` along an axis agrees with
    folding `plus` (axis 0 and 1 of a [3, N] stack) and gives `zero` on an
    empty axis. Score recursions rely on all of these (they reorder ⊕ and
    factor ⊗ out of it); ⊗ need not be commutative. Values are compared
    field by field within `rtol`/`atol` (equal infinities agree, NaN
    agrees with nothing), so rounding in float operations passes.

    Args:
      semiring: the semiring under test.
      samples: N sample weights: a float array [N] for a semiring with
        float weights, else a record array (the pytree of `zero` with
        leaves [N, *record shape]). Include the edge values your weights
        take (zero, one, ties, large magnitudes). N³ triples are formed:
        keep N to a few dozen.
      rtol, atol: tolerances of the comparisons.
    Raises:
      ValueError: for `samples` that are not N >= 1 records of the
        semiring (another pytree structure than `zero`'s, or a leaf not
        [N, *record shape]), naming the leaf.
      AssertionError: naming the first law that fails and the samples
        (by index and value) that break it.
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> sj.check_semiring_laws(sj.LOG, jnp.array([-jnp.inf, -1.0, 0.0, 2.5]))
      >>> bad = sj.Semiring(name="minus", plus=jnp.subtract, times=jnp.add,
      ...                   sum=jnp.sum, zero=0.0, one=0.0)
      >>> try:
      ...     sj.check_semiring_laws(bad, jnp.array([1.0, 2.0]))
      ... except AssertionError as error:
      ...     print(str(error).split(" at ")[0])
      Semiring 'minus': ⊕ is not associative: (a ⊕ b) ⊕ c != a ⊕ (b ⊕ c)
    """
    size = _check_samples(semiring, samples)
    samples = jax.tree_util.tree_map(jnp.asarray, samples)
    dtype = records.dtype_of(samples)
    triples = np.array(list(itertools.product(range(size), repeat=3)), np.int32).reshape(-1, 3)
    a, b, c = (records.take(samples, triples[:, i]) for i in range(3))
    count = triples.shape[0]
    zero = records.full(semiring.zero, (count,), dtype)
    one = records.full(semiring.one, (count,), dtype)
    plus, times = semiring.plus, semiring.times
    laws: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = [
        ("⊕ is not associative: (a ⊕ b) ⊕ c != a ⊕ (b ⊕ c)",
         lambda: plus(plus(a, b), c), lambda: plus(a, plus(b, c))),
        ("⊕ is not commutative: a ⊕ b != b ⊕ a", lambda: plus(a, b), lambda: plus(b, a)),
        ("zero is not the identity of ⊕: a ⊕ zero != a", lambda: plus(a, zero), lambda: a),
        ("⊗ is not associative: (a ⊗ b) ⊗ c != a ⊗ (b ⊗ c)",
         lambda: times(times(a, b), c), lambda: times(a, times(b, c))),
        ("one is not a left identity of ⊗: one ⊗ a != a", lambda: times(one, a), lambda: a),
        ("one is not a right identity of ⊗: a ⊗ one != a", lambda: times(a, one), lambda: a),
        ("zero does not annihilate: zero ⊗ a != zero", lambda: times(zero, a), lambda: zero),
        ("zero does not annihilate: a ⊗ zero != zero", lambda: times(a, zero), lambda: zero),
        ("⊗ does not distribute: a ⊗ (b ⊕ c) != (a ⊗ b) ⊕ (a ⊗ c)",
         lambda: times(a, plus(b, c)), lambda: plus(times(a, b), times(a, c))),
        ("⊗ does not distribute: (a ⊕ b) ⊗ c != (a ⊗ c) ⊕ (b ⊗ c)",
         lambda: times(plus(a, b), c), lambda: plus(times(a, c), times(b, c))),
        ("sum(axis=0) of [a, b, c] != (a ⊕ b) ⊕ c",
         lambda: semiring.sum(_stack([a, b, c], 0), axis=0), lambda: plus(plus(a, b), c)),
        ("sum(axis=1) of [a, b, c] != (a ⊕ b) ⊕ c",
         lambda: semiring.sum(_stack([a, b, c], 1), axis=1), lambda: plus(plus(a, b), c)),
        ("sum over an empty axis != zero",
         lambda: semiring.sum(records.take(a, np.zeros((count, 0), np.int32)), axis=1),
         lambda: zero),
    ]  # fmt: skip
    where = f"Semiring {semiring.name!r}"
    for law, left, right in laws:
        agree = _close(left(), right(), rtol, atol)
        if not agree.all():
            i = int(np.flatnonzero(~agree)[0])
            x, y, z = (int(v) for v in triples[i])
            raise AssertionError(
                f"{where}: {law} at samples a = {x}, b = {y}, c = {z} "
                f"(a = {_show(samples, x)}, b = {_show(samples, y)}, c = {_show(samples, z)})"
            )


def _stack(parts: list[Any], axis: int) -> Any:
    return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves, axis=axis), *parts)
