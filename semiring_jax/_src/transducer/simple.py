"""k2's simple and smoothed transducer losses: the joiner is additive.

The simple loss's joiner is `am[b, t] + lm[b, u]`, so its log-normaliser
over V at every node is a matrix product of exponentials (shifted by each
row's maximum), never a [B, T, U+1, V] array; the smoothed loss
interpolates its move log-probs with the LM's alone and the AM's with a
unigram LM. Both go through `grid.lattice_nll` over the full grid: the
recursion's gradient is the moves' posteriors, and autodiff carries it
through the losses' own gathers. `rnnt_prune_ranges` reads the same
posteriors (`transducer/pruning.py`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy.typing as npt

from semiring_jax._src.core import checks
from semiring_jax._src.core.inputs import check_float_array, check_labels, check_lengths
from semiring_jax._src.core.sharding import per_device
from semiring_jax._src.transducer import band as bands
from semiring_jax._src.transducer import fused, grid

# Every matmul whose result is logged states its precision (see `_normalisers`).
_HIGHEST = jax.lax.Precision.HIGHEST

__all__ = ["check_am_lm", "rnnt_loss_simple", "rnnt_loss_smoothed", "simple_moves"]


def check_am_lm(
    am: npt.ArrayLike,
    lm: npt.ArrayLike,
    frame_lengths: npt.ArrayLike,
    labels: npt.ArrayLike,
    label_lengths: npt.ArrayLike,
    blank: Any,
    fn: str,
) -> tuple[jax.Array, ...]:
    am = check_float_array(am, 3, "[B, T, V]", "am", fn)
    lm = check_float_array(lm, 3, "[B, U+1, V]", "lm", fn)
    batch, num_frames, vocab = am.shape
    if lm.shape[0] != batch or lm.shape[2] != vocab or lm.dtype != am.dtype:
        raise ValueError(
            f"{fn}: lm {lm.shape} {lm.dtype} does not match am {am.shape} {am.dtype}: "
            f"expected [B, U+1, V] = [{batch}, U+1, {vocab}] of {am.dtype}"
        )
    frame_lengths = check_lengths(frame_lengths, batch, num_frames, fn, "frame_lengths", "T")
    labels, label_lengths = check_labels(labels, label_lengths, batch, vocab, blank, fn)
    if labels.shape[1] + 1 != lm.shape[1]:
        raise ValueError(
            f"{fn}: lm has U + 1 = {lm.shape[1]} label positions, but labels has room "
            f"for U = {labels.shape[1]} labels (expected {labels.shape[1] + 1})"
        )
    return am, lm, frame_lengths, labels, label_lengths


def _full_nll(
    blank_lp: jax.Array, emit_lp: jax.Array, frame_lengths: jax.Array, label_lengths: jax.Array
) -> jax.Array:
    """`grid.lattice_nll` of move log-probs [B, T, U+1] over the full grid."""
    band = bands.full_grid(*blank_lp.shape)
    return grid.lattice_nll(blank_lp, emit_lp, frame_lengths, label_lengths, band)


def _label_columns(values: jax.Array, labels: jax.Array) -> jax.Array:
    """values[b, i, labels[b, u]] [B, I, U] of values [B, I, V]."""
    # Columns by a per-utterance index [U]: take_along_axis would build
    # (and read) a [B, I, U, 3] index array, in the forward and the backward.
    return jax.vmap(lambda rows, columns: rows[:, columns])(values, labels)


def _row_shifted(values: jax.Array) -> jax.Array:
    """values [B, I, V] less each row's maximum along V (no gradient; a
    maximum that is not finite shifts by 0, so ±inf and NaN stay visible).

    The move log-probs do not depend on such shifts, and shifting first
    keeps every term O(1): summed whole, am + lm - normaliser rounded each
    term at its own magnitude, and a common offset of 1e9 in float32 (a
    grid of 64) made the loss -2.3 where it is 8.1."""
    row_max = jax.lax.stop_gradient(jnp.max(values, axis=2, keepdims=True))
    return values - jnp.where(jnp.isfinite(row_max), row_max, jnp.zeros_like(row_max))


def _shifted_exponentials(values: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(exp(values - row max), row max [.., 1]) along V, as k2 shifts them
    (the max carries no gradient: the results do not depend on it)."""
    row_max = jax.lax.stop_gradient(jnp.max(values, axis=2, keepdims=True))
    return jnp.exp(values - row_max), row_max


def _label_terms(am: jax.Array, lm: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(am[b, t, labels[b, u]] [B, T, U], lm[b, u, labels[b, u]] [B, U]):
    the joiner's two parts of each label move."""
    label_lm = jnp.take_along_axis(lm[:, :-1], labels[:, :, None], axis=2)[..., 0]
    return _label_columns(am, labels), label_lm


@jax.custom_jvp
def _normalisers(am: jax.Array, lm: jax.Array) -> jax.Array:
    """log Σ_v exp(am[b, t, v] + lm[b, u, v]) [B, T, U+1] of row-shifted
    am [B, T, V] and lm [B, U+1, V] (`_row_shifted`: each row's max is 0).

    As k2 computes it: a matrix product of the exponentials, plus the
    dtype's tiny (so that a node without mass logs to a finite value).
    Where the product is below V · tiny / eps, terms may have underflowed
    and dropped out (am, lm of ~300 in float32 put a node's mass hundreds
    below the rows' maxima: the loss was 1252.6 for 1223.1), and those
    nodes take the exact log-sum-exp instead (`_exact_normalisers`: a
    [B, U+1, V] sum per frame, the joiner's cost). `lax.cond` runs it only
    when some node needs it (under `vmap` a cond runs both branches).

    The derivative is written out (`_normalisers_jvp`) so that the value
    is computed as without one: differentiated, the `lax.cond` became
    another (returning residuals too), the simple loss's move log-probs
    came from a different program than `rnnt_prune_ranges`'s, and XLA
    could not share the two T + U step scans that read them."""
    products = _products(am, lm)
    normalisers = jnp.log(products + jnp.finfo(am.dtype).tiny)
    suspect = _suspect(products, am.shape[2])
    return jax.lax.cond(
        jnp.any(suspect), _with_exact, lambda *args: args[-1], am, lm, suspect, normalisers
    )


def _products(am: jax.Array, lm: jax.Array) -> jax.Array:
    """Σ_v exp(am[b, t, v] + lm[b, u, v]) [B, T, U+1], as a matrix product."""
    # HIGHEST: the default is one bfloat16 pass on a TPU (TF32 on recent
    # GPUs), ~1e-2 off in the gradient once the sum is logged.
    return jnp.einsum("btv,buv->btu", jnp.exp(am), jnp.exp(lm), precision=_HIGHEST)


def _suspect(products: jax.Array, vocabulary: int) -> jax.Array:
    """Where a product of `vocabulary` terms may have lost some to
    underflow (NaN is not suspect: it stays)."""
    info = jnp.finfo(products.dtype)
    return products < vocabulary * info.tiny / info.eps


@_normalisers.defjvp
def _normalisers_jvp(
    primals: tuple[jax.Array, jax.Array], tangents: tuple[jax.Array, jax.Array]
) -> tuple[jax.Array, jax.Array]:
    """The normalisers' tangent: d products / products, the exact
    log-sum-exp's where a product is suspect (in a `lax.cond` of tangents
    alone)."""
    products, d_products = jax.jvp(_products, primals, tangents)
    fast = d_products / (products + jnp.finfo(products.dtype).tiny)
    suspect = _suspect(products, primals[0].shape[2])

    def with_exact() -> jax.Array:
        _, exact = jax.jvp(_exact_normalisers, primals, tangents)
        return jnp.where(suspect, exact, fast)

    tangent = jax.lax.cond(jnp.any(suspect), with_exact, lambda: fast)
    return _normalisers(*primals), tangent


def _with_exact(
    am: jax.Array, lm: jax.Array, suspect: jax.Array, normalisers: jax.Array
) -> jax.Array:
    """`normalisers` [B, T, U+1], the exact ones where `suspect`."""
    return jnp.where(suspect, _exact_normalisers(am, lm), normalisers)


def _exact_normalisers(am: jax.Array, lm: jax.Array) -> jax.Array:
    """log Σ_v exp(am[b, t, v] + lm[b, u, v]) [B, T, U+1], a log-sum-exp per
    node, a frame at a time (rematerialised in the gradient, so memory stays
    [B, U+1, V]); the dtype's tiny where a node has no mass, as the matrix
    product gives (the moves there are -inf, not NaN)."""
    tiny = jnp.finfo(am.dtype).tiny

    def frame(am_t: jax.Array) -> jax.Array:
        sums = am_t[:, None, :] + lm  # [B, U+1, V]
        top = jax.lax.stop_gradient(jnp.max(sums, axis=2))
        top = jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top))
        total = jnp.sum(jnp.exp(sums - top[..., None]), axis=2)
        # The where keeps log's derivative at 0 finite (a NaN through where).
        return jnp.log(jnp.where(total == 0, tiny, total)) + top

    return jnp.moveaxis(jax.lax.map(jax.checkpoint(frame), jnp.moveaxis(am, 1, 0)), 0, 1)


def simple_moves(
    am: jax.Array, lm: jax.Array, labels: jax.Array, blank: int
) -> tuple[jax.Array, jax.Array]:
    """(blank, label) move log-probs [B, T, U+1] of the additive joiner."""
    return _shifted_moves(_row_shifted(am), _row_shifted(lm), labels, blank)


def _shifted_moves(
    am: jax.Array, lm: jax.Array, labels: jax.Array, blank: int
) -> tuple[jax.Array, jax.Array]:
    """`simple_moves` of `_row_shifted` am and lm."""
    normalisers = _normalisers(am, lm)
    blank_lp = am[:, :, blank][:, :, None] + lm[:, :, blank][:, None, :] - normalisers
    label_am, label_lm = _label_terms(am, lm, labels)
    emit_lp = label_am + label_lm[:, None, :] - normalisers[:, :, :-1]
    return blank_lp, _with_last_position(emit_lp)


def _with_last_position(emit_lp: jax.Array) -> jax.Array:
    """[B, T, U] → [B, T, U+1]: no label move out of u = U."""
    return jnp.concatenate(
        [emit_lp, jnp.full((*emit_lp.shape[:2], 1), -jnp.inf, emit_lp.dtype)], axis=2
    )


@functools.partial(jax.jit, static_argnames=("blank", "delay_penalty"))
@per_device(lambda *args: [True] * len(args))
def _simple_loss(
    am: jax.Array,
    lm: jax.Array,
    frame_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    blank: int,
    delay_penalty: float,
) -> jax.Array:
    blank_lp, emit_lp = simple_moves(am, lm, labels, blank)
    emit_lp = fused.with_delay_penalty(emit_lp, frame_lengths, delay_penalty)
    return _full_nll(blank_lp, emit_lp, frame_lengths, label_lengths)


def rnnt_loss_simple(
    am: npt.ArrayLike,
    lm: npt.ArrayLike,
    frame_lengths: npt.ArrayLike,
    labels: npt.ArrayLike,
    label_lengths: npt.ArrayLike,
    *,
    blank: int = 0,
    delay_penalty: float = 0.0,
) -> jax.Array:
    """k2's "simple" transducer loss: the joiner is `am[b, t] + lm[b, u]`.

    Normalised over V at every node (t, u) without a [B, T, U+1, V] array:
    log Σ_v exp(am + lm) is a matrix product of the shifted exponentials.
    Differentiable with respect to `am` and `lm`.

    Args:
      am: float [B, T, V], the encoder's projections.
      lm: float [B, U+1, V], the prediction network's.
      frame_lengths, labels, label_lengths, blank: as in `rnnt_loss`.
      delay_penalty: k2's, finite: delay_penalty · ((T_b - 1)/2 - t) is
        added to every label emission at frame t (nothing for a value <= 0).
    Returns:
      float [B], the negative log-likelihoods (+inf without a path).
    Raises:
      ValueError: for shapes that do not match, lengths out of range, a
        used label outside [0, V) or equal to `blank`, or a `delay_penalty`
        that is not finite.
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> am, lm = jnp.zeros((1, 2, 3)), jnp.zeros((1, 2, 3))  # uniform over 3
      >>> loss = sj.rnnt_loss_simple(am, lm, jnp.array([2]), jnp.array([[1]]), jnp.array([1]))
      >>> print(jnp.round(jnp.exp(-loss), 4))
      [0.0741]
    """
    fn = "rnnt_loss_simple"
    delay_penalty = checks.check_finite_float(delay_penalty, "delay_penalty", fn)
    args = check_am_lm(am, lm, frame_lengths, labels, label_lengths, blank, fn)
    return _simple_loss(*args, blank=int(blank), delay_penalty=delay_penalty)


def _smoothed_moves(
    am: jax.Array,
    lm: jax.Array,
    labels: jax.Array,
    unigram: jax.Array,
    blank: int,
    lm_only_scale: float,
    am_only_scale: float,
) -> tuple[jax.Array, jax.Array]:
    """k2's smoothed move log-probs: the simple ones, the LM's alone and the
    AM's with a unigram LM (the mean of the LM's distributions over the
    whole padded batch, as k2 takes it: `unigram`), interpolated."""
    am, lm = _row_shifted(am), _row_shifted(lm)  # none of the moves depends on the shifts
    blank_lp, emit_lp = _shifted_moves(am, lm, labels, blank)
    (am_probs, am_max), (lm_probs, lm_max) = _shifted_exponentials(am), _shifted_exponentials(lm)
    lm_totals = jnp.sum(lm_probs, axis=2, keepdims=True)  # [B, U+1, 1]
    am_only_sum = jnp.einsum("btv,v->bt", am_probs, unigram, precision=_HIGHEST)
    am_only_norm = jnp.log(am_only_sum)[:, :, None] + am_max  # [B, T, 1]
    log_unigram = jnp.log(unigram)
    lm_only_norm = jnp.log(lm_totals) + lm_max  # [B, U+1, 1]
    label_am, label_lm = _label_terms(am, lm, labels)
    emit_am_only = _with_last_position(label_am + log_unigram[labels][:, None, :] - am_only_norm)
    emit_lm_only = _with_last_position(
        jnp.broadcast_to((label_lm - lm_only_norm[:, :-1, 0])[:, None, :], label_am.shape)
    )
    blank_am_only = am[:, :, blank][:, :, None] + log_unigram[blank] - am_only_norm
    blank_lm_only = (lm[:, :, blank] - lm_only_norm[:, :, 0])[:, None, :]
    combined = 1.0 - lm_only_scale - am_only_scale
    # As k2: a zero scale is 1e-20, so that a -inf term stays -inf, not NaN.
    lm_only_scale, am_only_scale = lm_only_scale or 1e-20, am_only_scale or 1e-20
    blank_lp = combined * blank_lp + lm_only_scale * blank_lm_only + am_only_scale * blank_am_only
    emit_lp = combined * emit_lp + lm_only_scale * emit_lm_only + am_only_scale * emit_am_only
    return blank_lp, emit_lp


def _unigram(lm: jax.Array) -> jax.Array:
    """float [V]: the mean of the LM's distributions over the whole padded
    batch, as k2 takes it (+ tiny, so that its log is finite); the one value
    that couples the utterances (an all-reduce of [V] on a sharded batch)."""
    lm_probs, _ = _shifted_exponentials(lm)
    lm_totals = jnp.sum(lm_probs, axis=2, keepdims=True)  # [B, U+1, 1]
    return jnp.mean(lm_probs / lm_totals, axis=(0, 1)) + jnp.finfo(lm.dtype).tiny


@functools.partial(
    jax.jit, static_argnames=("blank", "lm_only_scale", "am_only_scale", "delay_penalty")
)
def _smoothed_loss(
    am: jax.Array,
    lm: jax.Array,
    frame_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    blank: int,
    lm_only_scale: float,
    am_only_scale: float,
    delay_penalty: float,
) -> jax.Array:
    # The unigram is taken over the whole batch before the per-device part,
    # which would otherwise average each device's utterances alone.
    static = {"blank": blank, "lm_only_scale": lm_only_scale, "am_only_scale": am_only_scale}
    return _smoothed_per_utterance(
        am,
        lm,
        frame_lengths,
        labels,
        label_lengths,
        _unigram(lm),
        **static,
        delay_penalty=delay_penalty,
    )


@per_device(lambda *args: [True] * 5 + [False])
def _smoothed_per_utterance(
    am: jax.Array,
    lm: jax.Array,
    frame_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    unigram: jax.Array,
    blank: int,
    lm_only_scale: float,
    am_only_scale: float,
    delay_penalty: float,
) -> jax.Array:
    blank_lp, emit_lp = _smoothed_moves(
        am, lm, labels, unigram, blank, lm_only_scale, am_only_scale
    )
    emit_lp = fused.with_delay_penalty(emit_lp, frame_lengths, delay_penalty)
    return _full_nll(blank_lp, emit_lp, frame_lengths, label_lengths)


def rnnt_loss_smoothed(
    am: npt.ArrayLike,
    lm: npt.ArrayLike,
    frame_lengths: npt.ArrayLike,
    labels: npt.ArrayLike,
    label_lengths: npt.ArrayLike,
    *,
    lm_only_scale: float = 0.25,
    am_only_scale: float = 0.0,
    blank: int = 0,
    delay_penalty: float = 0.0,
) -> jax.Array:
    """k2's smoothed simple loss: the simple loss's move log-probs
    interpolated with the LM's alone (`lm_only_scale`) and the AM's with a
    unigram LM (`am_only_scale`; the unigram is the mean of the LM's
    distributions over the whole padded batch, as in k2).

    Args:
      am, lm, frame_lengths, labels, label_lengths, blank, delay_penalty: as
        in `rnnt_loss_simple`.
      lm_only_scale, am_only_scale: the interpolation weights, finite (the
        simple loss's is 1 minus both).
    Returns:
      float [B].
    Raises:
      ValueError: as `rnnt_loss_simple`, or for a scale that is not finite.
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> am, lm = jnp.zeros((1, 2, 3)), jnp.zeros((1, 2, 3))
      >>> args = (jnp.array([2]), jnp.array([[1]]), jnp.array([1]))
      >>> print(jnp.round(jnp.exp(-sj.rnnt_loss_smoothed(am, lm, *args)), 4))
      [0.0741]
    """
    fn = "rnnt_loss_smoothed"
    scales = {
        name: checks.check_finite_float(value, name, fn)
        for name, value in [
            ("lm_only_scale", lm_only_scale),
            ("am_only_scale", am_only_scale),
            ("delay_penalty", delay_penalty),
        ]
    }
    args = check_am_lm(am, lm, frame_lengths, labels, label_lengths, blank, fn)
    return _smoothed_loss(*args, blank=int(blank), **scales)
