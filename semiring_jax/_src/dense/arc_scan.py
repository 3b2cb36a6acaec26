"""The portable LOG dense intersection over a graph's flat arcs (traced).

`dense_tot_score` (LOG) and `mmi_loss` run this where the compiled kernel
does not (a GPU, a TPU, the kernels off; `core/route_table.py`). It reads the graph as
the kernel does (`dense_ops.Arcs`: src, dst, column [G, A], G = 1 when the
batch shares it) and computes the forward and backward recursions over the
whole batch at once, one `lax.scan` step per frame:

    a_{t+1} = leak(arcs_t(a_t)),   arcs_t(a)[d] = Σ_{arcs s → d} a[s] w e_t[col],

in linear space, each frame's vector scaled so that its largest entry is
1 (the scales summed apart, compensated). A frame then costs a gather, a
multiply and a segment sum per arc, and an exp and a log per state: none
of the per-arc exps and per-destination maxima of a log-space step. The
backward pass carries b_t, the gradient of log Z in a_t, the same way, and
writes each arc's posterior as occupancy(src) × (its share of b_t[src]):
both O(1) numbers, so float32 loses nothing to the scale of the totals.

Linear space underflows where a state's sum falls below `_TINY` (1e-25 in
float32) though the exact step gives it mass (an arc into it from a state
of mass, with a weight and an emission that are not -inf: each such term
is raised to at least the smallest normal number, `_with_marks`, so that
these are the states whose sums are positive), and linear scales cannot
keep O(1) differences next to +inf or a magnitude beyond 2^20
(`_needs_pairs`). The scan only notes a loss; if one happened, at any
frame anywhere in the batch, or the batch reads such a number, one
`lax.cond` after the scan computes the batch again in logs, every score a
compensated (hi, lo) pair (`_forward_pairs`, `_backward_pairs`): the
precision of the compensated frame scan, which this module once called
for the large magnitudes, without compiling a third recursion beside the
two (the frame scan's slot tables and hub trees doubled the op's compile
time). Deciding once, after the scan, keeps conditionals out of the loop
body (on a GPU each one costs a host round-trip per frame), and counting
only the states that have mass at this very frame (not those reachable
in at most so many frames, as the distances of earlier versions did)
keeps the second scan for inputs that need it: on the random 500-state
graph of benchmarks/bench_dense.py no frame underflows, where the
distances flagged 30 of its 1,000 frame steps.

Under `jax.vmap` over more axes the `lax.cond` becomes a select, so both
branches run: correct, at the cost of the scan in pairs. Its predicate
is a reduction over the batch: on a batch sharded over an auto-axis mesh
XLA all-reduces that boolean over the devices, and on an explicit-axis
mesh (or inside `jax.shard_map`) each device decides for its own
utterances.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src.core import compensated, derivatives
from semiring_jax._src.core.sharding import varying_like
from semiring_jax._src.kernels import dense_ops

__all__ = ["score_op"]

# A sum below this is recomputed in logs (when its state is reachable):
# far above the smallest normal float, so the terms lost below it are
# negligible next to it.
_TINY = {np.dtype(np.float32): 1e-25, np.dtype(np.float64): 1e-200}
_LARGE = 2.0**20  # beyond this magnitude, the scan in pairs runs


class _Graph(NamedTuple):
    """The batch's graph, ready for the recursions; [G, ...] structure."""

    src: jax.Array  # int32 [G, A]
    dst: jax.Array  # int32 [G, A]
    column: jax.Array  # int32 [G, A]: V for padding (a column of zeros)
    log_weight: jax.Array  # [B, A], -inf for padding
    weight: jax.Array  # [B, A]: exp(log_weight - top_weight)
    top_weight: jax.Array  # [B]
    leak: jax.Array | None  # [G, S] (epsilon times the initial probabilities)
    num_states: int


def _gather(values: jax.Array, index: jax.Array) -> jax.Array:
    """values [B, N] at index [G, A]: [B, A]."""
    if index.shape[0] == 1:
        return values[:, index[0]]
    return jnp.take_along_axis(values, index, axis=1)


def _segment(
    reduce: Callable[..., jax.Array], values: jax.Array, index: jax.Array, count: int
) -> jax.Array:
    """`reduce` (a jax.ops.segment_*) of values [B, A] into [B, count]."""
    fn = functools.partial(reduce, num_segments=count)
    if index.shape[0] == 1:
        return jax.vmap(lambda v: fn(v, index[0]))(values)
    return jax.vmap(fn)(values, index)


def _normalised_log(sums: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(log(sums / top), log top) of nonnegative sums [B, S], top = their
    maximum: -inf entries where a sum is 0, and a log top of -inf where all
    are."""
    top = jax.lax.stop_gradient(jnp.max(sums, axis=-1))
    scale = jnp.where(top > 0, top, 1.0)
    return _safe_log(sums / scale[:, None]), _safe_log(top)


def _safe_log(x: jax.Array) -> jax.Array:
    """log x of x >= 0: -inf at 0 (with a gradient free of NaN), NaN at NaN."""
    positive = x > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, x, 1.0)), jnp.where(x == 0, -jnp.inf, x))


def _shifted(logs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(logs - top, top) per row of [B, S] logs, top their maximum (-inf
    for an all -inf row, which is left as it is; NaN for a row with NaN)."""
    top = jax.lax.stop_gradient(jnp.max(logs, axis=-1))
    safe = jnp.where(jnp.isfinite(top), top, 0.0)
    return logs - safe[:, None], top


def _softmax(logs: jax.Array) -> jax.Array:
    """Softmax over the last axis; all zeros for a row without a finite
    entry (no path)."""
    shifted, top = _shifted(logs)
    found = jnp.isfinite(top)[:, None]
    weights = jnp.exp(jnp.where(found, shifted, -jnp.inf))
    total = jnp.sum(weights, axis=-1, keepdims=True)
    return weights / jnp.where(total > 0, total, 1.0)


def _occupancy_per_sum(
    alpha: jax.Array, new: jax.Array, sums: jax.Array, most: jax.Array
) -> jax.Array:
    """softmax(alpha + new) / sums per state [B, S], 0 where a sum is 0, from
    new = log(sums / most): exp(alpha) / (most · Σ exp(alpha + new)), which
    holds no sum. Dividing by the sums would put 1 / sums² in the second
    derivative, which overflows where a sum is tiny (1e-20 in float32: a
    state the start has not reached yet) and meets its occupancy of 0 as
    0 · inf = NaN."""
    shifted, top = _shifted(alpha + new)
    found = jnp.isfinite(top)[:, None]
    log_norm = _safe_log(jnp.sum(jnp.exp(jnp.where(found, shifted, -jnp.inf)), axis=-1))
    safe_top = jnp.where(jnp.isfinite(top), top, 0.0)
    log_scale = safe_top + log_norm + _safe_log(most)
    used = found & (sums > 0)
    return jnp.exp(jnp.where(used, alpha - jnp.where(used, log_scale[:, None], 0.0), -jnp.inf))


def _log_sum(logs: jax.Array) -> jax.Array:
    """log Σ exp per row [B]; -inf for an empty row."""
    shifted, top = _shifted(logs)
    return jnp.where(jnp.isfinite(top), top, 0.0) + _safe_log(jnp.sum(jnp.exp(shifted), axis=-1))


def _prepare(diff: dense_ops.Diff, arcs: dense_ops.Arcs, leaky: bool) -> _Graph:
    weight, final_weight, emissions = diff
    num_columns = emissions.shape[-1]
    real = arcs.column >= 0
    log_weight = jnp.where(real, weight, -jnp.inf)
    top_weight = jax.lax.stop_gradient(jnp.max(log_weight, axis=-1, initial=-jnp.inf))
    top_weight = jnp.where(jnp.isneginf(top_weight), 0.0, top_weight)
    return _Graph(
        src=arcs.src,
        dst=arcs.dst,
        column=jnp.where(real, arcs.column, num_columns),
        log_weight=log_weight,
        weight=_floored_exp(log_weight - top_weight[:, None]),
        top_weight=top_weight,
        leak=arcs.leak if leaky else None,
        num_states=final_weight.shape[-1],
    )


class _Frames(NamedTuple):
    """The emissions as the recursions read them, frame-major."""

    logs: jax.Array  # [T, B, V + 1]: -inf on unread columns and the padding column V
    top: jax.Array  # [T, B]: the largest read entry (0 where none is finite)
    linear: jax.Array  # [T, B, V + 1]: exp(logs - top), floored (`_floored_exp`)


def _frames(emissions: jax.Array, lengths: jax.Array, column: jax.Array) -> _Frames:
    """The emissions [B, T, V], 0 past each length (so that nothing there,
    not even NaN, is read), with the columns no arc reads at -inf."""
    num_frames, num_columns = emissions.shape[1:]
    count = _segment(
        jax.ops.segment_sum, jnp.ones(column.shape, jnp.int32), column, num_columns + 1
    )
    read = (count > 0).at[:, num_columns].set(False)[:, None, :]  # [G, 1, V + 1]
    active = jnp.arange(num_frames, dtype=jnp.int32)[None, :, None] < lengths[:, None, None]
    logs = jnp.pad(jnp.where(active, emissions, 0.0), ((0, 0), (0, 0), (0, 1)))
    logs = jnp.moveaxis(jnp.where(read, logs, -jnp.inf), 1, 0)
    top = jax.lax.stop_gradient(jnp.max(logs, axis=-1))
    top = jnp.where(jnp.isneginf(top), 0.0, top)
    # Computed once here rather than in each step, where XLA would fuse
    # the exp into the per-arc gather.
    return _Frames(logs, top, _floored_exp(logs - top[..., None]))


def _leak_linear(values: jax.Array, leak: jax.Array | None) -> jax.Array:
    """a + leak · Σ a, [B, S] (Kaldi's leaky HMM, in linear space)."""
    if leak is None:
        return values
    return values + leak * jnp.sum(values, axis=-1, keepdims=True)


def _floored_exp(logs: jax.Array) -> jax.Array:
    """exp(logs) of logs <= 0, at least the smallest normal number where
    logs > -inf (and NaN at NaN): so that a factor of a term is 0 only
    where its log is -inf. Raising an exp that underflowed to the smallest
    normal moves a sum of at least `_TINY` by at most 1e-13 of itself in
    float32; a smaller sum is recomputed in logs anyway."""
    floor = jnp.finfo(logs.dtype).tiny
    return jnp.where(logs == -jnp.inf, 0.0, jnp.maximum(jnp.exp(logs), floor))


def _with_marks(terms: jax.Array, *factors: jax.Array) -> jax.Array:
    """terms [B, A] (products of `factors`), each at least the smallest
    normal number where no factor is 0 (NaN stays NaN): the segment sums
    of the result are positive exactly at the states the exact step gives
    mass, though a product underflow to 0. (By induction over frames: a
    state of mass is positive in linear space until the scan flags a
    loss, and the weights' and emissions' factors are floored.)"""
    least = functools.reduce(jnp.minimum, factors)
    return jnp.maximum(terms, jnp.where(least > 0, jnp.finfo(terms.dtype).tiny, 0.0))


def _underflows(sums: jax.Array, active: jax.Array, tiny: float) -> jax.Array:
    """Whether any active entry has a state of mass (a positive sum [B, S],
    `_with_marks`) whose sum is below `tiny`: linear space may have lost
    it."""
    return jnp.any(active[:, None] & (sums > 0) & (sums < tiny))


def _lost_at_start(logs: jax.Array, active: jax.Array, tiny: float) -> jax.Array:
    """Whether a scan that starts from exp(logs [B, S]) (shifted: the
    largest is 0) starts with a state of mass below `tiny`."""
    return _underflows(_floored_exp(logs), active, tiny)


def _forward(
    g: _Graph, frames: _Frames, lengths: jax.Array, tiny: float, keep: bool
) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array]:
    """(the normalised log a_L [B, S], the summed log scales [B], with
    `keep` every normalised log a_t [T, B, S], and whether linear space
    lost a state of mass at some frame)."""
    batch, num_states = g.weight.shape[0], g.num_states
    start = jnp.zeros((batch, num_states), g.weight.dtype).at[:, 0].set(1.0)
    alpha, scale = _normalised_log(_leak_linear(start, g.leak))
    zero = jnp.zeros_like(scale)

    def step(carry: Any, inputs: tuple[jax.Array, ...]) -> tuple[Any, jax.Array | None]:
        # alpha: logs (what the backward pass keeps); linear: their exp.
        alpha, linear, (hi, lo), lost = carry
        t, top, emission = inputs
        active = t < lengths
        factors = (_gather(linear, g.src), g.weight, _gather(emission, g.column))
        terms = _with_marks(factors[0] * factors[1] * factors[2], *factors)
        sums = _leak_linear(_segment(jax.ops.segment_sum, terms, g.dst, num_states), g.leak)
        most = jax.lax.stop_gradient(jnp.max(sums, axis=-1))
        new_linear = sums / jnp.where(most > 0, most, 1.0)[:, None]
        new = _safe_log(new_linear)
        increment = _safe_log(most) + top + g.top_weight
        lost = lost | _underflows(sums, active, tiny)
        hi_new, lo_new = compensated.add(hi, lo, increment)
        keep_old = lambda new, old: jnp.where(
            active.reshape((-1,) + (1,) * (old.ndim - 1)), new, old
        )
        carry = (
            keep_old(new, alpha),
            keep_old(new_linear, linear),
            (keep_old(hi_new, hi), keep_old(lo_new, lo)),
            lost,
        )
        return carry, alpha if keep else None

    steps = (jnp.arange(frames.logs.shape[0], dtype=jnp.int32), frames.top, frames.linear)
    lost = _lost_at_start(alpha, lengths > 0, tiny)
    init = (alpha, jnp.exp(alpha), compensated.add(zero, zero, scale), lost)
    # Inside jax.shard_map the start is a constant that meets per-device
    # scores in the body: it starts as varying as they are.
    init = varying_like(init, steps, g.weight)
    (alpha, _, (hi, lo), lost), kept = jax.lax.scan(step, init, steps)
    return alpha, hi + lo, kept, lost


def _columns(posterior: jax.Array, column: jax.Array, num_columns: int) -> jax.Array:
    """Arc posteriors [B, A] summed per emission column, [B, V] (the
    padding column V dropped)."""
    return _segment(jax.ops.segment_sum, posterior, column, num_columns + 1)[:, :num_columns]


def _total(alpha: jax.Array, scale: jax.Array, final_weight: jax.Array) -> jax.Array:
    return scale + _log_sum(alpha + final_weight)


def _backward(
    g: _Graph,
    frames: _Frames,
    lengths: jax.Array,
    final_weight: jax.Array,
    alphas: jax.Array,
    tiny: float,
    wanted: tuple[bool, bool],
) -> tuple[jax.Array | None, jax.Array | None, jax.Array]:
    """(arc posteriors summed over frames [B, A], column posteriors
    [B, T, V], whether linear space lost a state of mass at some frame)
    from the kept log a_t [T, B, S]; each posterior only if `wanted` (None
    otherwise)."""
    want_arcs, want_columns = wanted
    num_states = g.num_states
    num_columns = frames.logs.shape[-1] - 1
    beta, _ = _shifted(final_weight)

    def step(carry: Any, inputs: tuple[jax.Array, ...]) -> tuple[Any, jax.Array | None]:
        # beta: logs of b_{t+1}; linear: their exp.
        beta, linear, arc_sum, lost = carry
        t, emission, alpha = inputs
        active = t < lengths
        after = linear  # b_{t+1} through the leak transposed: b + (leak · b) 1
        if g.leak is not None:
            after = linear + jnp.sum(g.leak * linear, axis=-1, keepdims=True)
        factors = (g.weight, _gather(emission, g.column), _gather(after, g.dst))
        # The marks move the posteriors as little as the sums.
        terms = _with_marks(factors[0] * factors[1] * factors[2], *factors)
        sums = _segment(jax.ops.segment_sum, terms, g.src, num_states)
        most = jax.lax.stop_gradient(jnp.max(sums, axis=-1))
        new_linear = sums / jnp.where(most > 0, most, 1.0)[:, None]
        new = _safe_log(new_linear)
        # posterior = occupancy(src) * terms / sums[src]: one gather of a
        # per-state ratio (sums >= tiny where occupied, or recomputed).
        posterior = terms * _gather(_occupancy_per_sum(alpha, new, sums, most), g.src)
        lost = lost | _underflows(sums, active, tiny)
        posterior = jnp.where(active[:, None], posterior, 0.0)
        columns = _columns(posterior, g.column, num_columns) if want_columns else None
        carry = (
            jnp.where(active[:, None], new, beta),
            jnp.where(active[:, None], new_linear, linear),
            arc_sum + posterior if want_arcs else None,
            lost,
        )
        return carry, columns

    steps = (jnp.arange(frames.logs.shape[0], dtype=jnp.int32), frames.linear, alphas)
    arc_sum = jnp.zeros(g.weight.shape, g.weight.dtype) if want_arcs else None
    lost = _lost_at_start(beta, lengths > 0, tiny)
    init = varying_like((beta, jnp.exp(beta), arc_sum, lost), steps, g.weight)
    (_, _, arc_sum, lost), columns = jax.lax.scan(step, init, steps, reverse=True)
    return arc_sum, None if columns is None else jnp.moveaxis(columns, 0, 1), lost


# -- the recomputation in logs, every score a compensated pair ---------------------
# (`core/compensated.py`): each arc's term α ⊗ w ⊗ e added by TwoSum, each
# state's sum shifted by its largest pair, so that a -1e30 mask or a 2^30
# weight keeps the O(1) differences between paths; +inf and -inf follow
# the semiring (a +inf read on a path gives +inf).

Pair = compensated.Pair


def _segment_log_sum_pairs(terms: Pair, index: jax.Array, count: int) -> Pair:
    """log Σ exp per segment of terms [B, A], as a pair [B, count]: -inf
    for an empty segment, +inf where a term is, NaN where one is."""
    hi, lo = terms
    top_hi = _segment(jax.ops.segment_max, hi, index, count)
    at_top = hi == _gather(top_hi, index)
    top_lo = _segment(jax.ops.segment_max, jnp.where(at_top, lo, -jnp.inf), index, count)
    finite = jnp.isfinite(top_hi)
    top = (jnp.where(finite, top_hi, 0.0), jnp.where(finite, top_lo, 0.0))
    # hi - top is exact (Sterbenz) for the terms within a factor of two of
    # the top, the only ones exp does not take to 0.
    exponent = (hi - _gather(top[0], index)) + (lo - _gather(top[1], index))
    sums = _segment(jax.ops.segment_sum, jnp.exp(exponent), index, count)
    return compensated.add(top[0], top[1], compensated.log_total(sums))


def _log_sum_pairs(pairs: Pair) -> Pair:
    """log Σ exp of each row of pairs [B, S], as a pair [B]."""
    return compensated.log_sum_pair(*pairs, axis=-1)


def _log_add_pairs(a: Pair, b: Pair) -> Pair:
    """log(exp a + exp b), elementwise (broadcast)."""
    shape = jnp.broadcast_shapes(a[0].shape, b[0].shape)
    stack = lambda x, y: jnp.stack([jnp.broadcast_to(x, shape), jnp.broadcast_to(y, shape)], -1)
    return compensated.log_sum_pair(stack(a[0], b[0]), stack(a[1], b[1]), axis=-1)


def _times(pairs: Pair, value: jax.Array) -> Pair:
    """pairs ⊗ value (-inf annihilates +inf), as a pair."""
    return compensated.add(pairs[0], pairs[1], value)


def _shifted_pairs(pairs: Pair) -> tuple[Pair, Pair]:
    """(pairs - top, top) per row of [B, S] pairs, top the largest pair
    (-inf for an all -inf row, left as it is; NaN for a row with NaN)."""
    (top_hi, top_lo), _ = compensated.max_pair(*pairs, axis=-1)
    finite = jnp.isfinite(top_hi)
    safe = (jnp.where(finite, top_hi, 0.0), jnp.where(finite, top_lo, 0.0))
    shifted = compensated.add_pairs(pairs, (-safe[0][:, None], -safe[1][:, None]))
    return shifted, (top_hi, jnp.where(finite, top_lo, 0.0))


def _softmax_pairs(pairs: Pair) -> jax.Array:
    """Softmax of each row of pairs [B, S]; all zeros for a row without a
    finite entry (no path)."""
    (hi, lo), (top_hi, _) = _shifted_pairs(pairs)
    found = jnp.isfinite(top_hi)[:, None]
    weights = jnp.exp(jnp.where(found, hi + lo, -jnp.inf))
    total = jnp.sum(weights, axis=-1, keepdims=True)
    return weights / jnp.where(total > 0, total, 1.0)


def _leak_pairs(pairs: Pair, leak: jax.Array | None) -> Pair:
    """log(a + leak · Σ a) from log a [B, S] (the leak in logs)."""
    if leak is None:
        return pairs
    total_hi, total_lo = _log_sum_pairs(pairs)
    leaked = _times((total_hi[:, None], total_lo[:, None]), _safe_log(leak))
    return _log_add_pairs(pairs, leaked)


def _leak_transposed_pairs(pairs: Pair, leak: jax.Array | None) -> Pair:
    """log(b + (leak · b) 1) from log b [B, S]: the leak's transpose."""
    if leak is None:
        return pairs
    total_hi, total_lo = _log_sum_pairs(_times(pairs, _safe_log(leak)))
    return _log_add_pairs(pairs, (total_hi[:, None], total_lo[:, None]))


def _forward_pairs(g: _Graph, frames: _Frames, lengths: jax.Array) -> tuple[Pair, Pair, Pair]:
    """(the normalised log a_L [B, S], the summed log scales [B], every
    normalised log a_t [T, B, S]), all pairs, every frame in logs."""
    batch, num_states = g.weight.shape[0], g.num_states
    start = jnp.full((batch, num_states), -jnp.inf, g.weight.dtype).at[:, 0].set(0.0)
    alpha, scale = _shifted_pairs(_leak_pairs((start, jnp.zeros_like(start)), g.leak))

    def step(carry: Any, inputs: tuple[jax.Array, ...]) -> tuple[Any, Pair]:
        alpha, scale = carry
        t, frame = inputs
        active = t < lengths
        terms = _times((_gather(alpha[0], g.src), _gather(alpha[1], g.src)), g.log_weight)
        terms = _times(terms, _gather(frame, g.column))
        sums = _leak_pairs(_segment_log_sum_pairs(terms, g.dst, num_states), g.leak)
        new, increment = _shifted_pairs(sums)
        keep_old = lambda new, old: jnp.where(
            active.reshape((-1,) + (1,) * (old.ndim - 1)), new, old
        )
        carry = jax.tree.map(keep_old, (new, compensated.add_pairs(scale, increment)), carry)
        return carry, alpha

    steps = (jnp.arange(frames.logs.shape[0], dtype=jnp.int32), frames.logs)
    init = varying_like((alpha, scale), steps, g.weight)
    (alpha, scale), kept = jax.lax.scan(step, init, steps)
    return alpha, scale, kept


def _total_pairs(alpha: Pair, scale: Pair, final_weight: jax.Array) -> jax.Array:
    hi, lo = compensated.add_pairs(scale, _log_sum_pairs(_times(alpha, final_weight)))
    return hi + lo


def _backward_pairs(
    g: _Graph,
    frames: _Frames,
    lengths: jax.Array,
    final_weight: jax.Array,
    alphas: Pair,
    wanted: tuple[bool, bool],
) -> tuple[jax.Array | None, jax.Array | None]:
    """`_backward`'s posteriors from the kept pairs log a_t [T, B, S],
    every frame in logs."""
    want_arcs, want_columns = wanted
    num_states = g.num_states
    num_columns = frames.logs.shape[-1] - 1
    beta, _ = _shifted_pairs((final_weight, jnp.zeros_like(final_weight)))

    def step(carry: Any, inputs: tuple[Any, ...]) -> tuple[Any, jax.Array | None]:
        beta, arc_sum = carry  # beta: the normalised log b_{t+1}
        t, frame, alpha = inputs
        active = t < lengths
        after = _leak_transposed_pairs(beta, g.leak)
        terms = compensated.two_sum(g.log_weight, _gather(frame, g.column))
        terms = compensated.add_pairs(terms, (_gather(after[0], g.dst), _gather(after[1], g.dst)))
        sums = _segment_log_sum_pairs(terms, g.src, num_states)
        # Each arc's share of its source's sum, exp(term - sum): 0 where
        # the sum is -inf (so is every term).
        at_src = (_gather(sums[0], g.src), _gather(sums[1], g.src))
        finite = jnp.isfinite(at_src[0])
        exponent = (terms[0] - jnp.where(finite, at_src[0], 0.0)) + (
            terms[1] - jnp.where(finite, at_src[1], 0.0)
        )
        new, _ = _shifted_pairs(sums)
        occupancy = _softmax_pairs(compensated.add_pairs(alpha, new))
        posterior = _gather(occupancy, g.src) * jnp.exp(exponent)
        posterior = jnp.where(active[:, None], posterior, 0.0)
        columns = _columns(posterior, g.column, num_columns) if want_columns else None
        keep_old = lambda new, old: jnp.where(active[:, None], new, old)
        carry = (jax.tree.map(keep_old, new, beta), arc_sum + posterior if want_arcs else None)
        return carry, columns

    steps = (jnp.arange(frames.logs.shape[0], dtype=jnp.int32), frames.logs, alphas)
    arc_sum = jnp.zeros(g.weight.shape, g.weight.dtype) if want_arcs else None
    init = varying_like((beta, arc_sum), steps, g.weight)
    (_, arc_sum), columns = jax.lax.scan(step, init, steps, reverse=True)
    return arc_sum, None if columns is None else jnp.moveaxis(columns, 0, 1)


# -- the op ------------------------------------------------------------------------


def _needs_pairs(diff: dense_ops.Diff, arcs: dense_ops.Arcs, frames: _Frames) -> jax.Array:
    """Whether the batch reads +inf or a finite magnitude beyond 2^20 (in a
    real arc's weight, a final weight or an emission within its length and
    read by an arc)."""
    weight, final_weight, _ = diff
    if arcs.src.shape[0] == 1:  # shared: the rows are one broadcast (and may be constants)
        weight, final_weight = weight[:1], final_weight[:1]
    real_weight = jnp.where(arcs.column >= 0, weight, 0.0)

    def beyond(x: jax.Array) -> jax.Array:
        return jnp.any((x == jnp.inf) | (jnp.isfinite(x) & (jnp.abs(x) > _LARGE)))

    return beyond(real_weight) | beyond(final_weight) | beyond(frames.logs)


def _inputs(diff: dense_ops.Diff, aux: dense_ops.Aux) -> tuple[dense_ops.Arcs, jax.Array, _Frames]:
    """(arcs, int32 lengths [B], the frames) from the op's inputs: the
    frames once per call, read by the check and the recursions alike."""
    arcs, lengths = aux[:2]
    lengths = jnp.asarray(lengths, jnp.int32)
    return arcs, lengths, _frames(diff[2], lengths, arcs.column)


def _value(leaky: bool, diff: dense_ops.Diff, aux: dense_ops.Aux) -> jax.Array:
    _, final_weight, emissions = diff
    arcs, lengths, frames = _inputs(diff, aux)
    g = _prepare(diff, arcs, leaky)
    alpha, scale, _, lost = _forward(g, frames, lengths, _TINY[emissions.dtype], keep=False)

    def in_pairs() -> jax.Array:
        alpha, scale, _ = _forward_pairs(g, frames, lengths)
        return _total_pairs(alpha, scale, final_weight)

    # Decided once, after the scan: a cond inside it would cost a GPU a
    # host round-trip per frame.
    return jax.lax.cond(
        lost | _needs_pairs(diff, arcs, frames),
        in_pairs,
        lambda: _total(alpha, scale, final_weight),
    )


def _value_and_grads(
    leaky: bool, diff: dense_ops.Diff, aux: dense_ops.Aux, wanted: tuple[bool, ...]
) -> tuple[jax.Array, tuple[jax.Array | None, ...]]:
    _, final_weight, emissions = diff
    arcs, lengths, frames = _inputs(diff, aux)
    tiny = _TINY[emissions.dtype]
    g = _prepare(diff, arcs, leaky)
    Grads = tuple[jax.Array | None, ...]

    def linear() -> tuple[tuple[jax.Array, Grads], jax.Array]:
        alpha, scale, alphas, lost = _forward(g, frames, lengths, tiny, keep=True)
        assert alphas is not None
        arc_grad, emission_grad, lost_back = _backward(
            g, frames, lengths, final_weight, alphas, tiny, (wanted[0], wanted[2])
        )
        final_grad = _softmax(alpha + final_weight) if wanted[1] else None
        total = _total(alpha, scale, final_weight)
        return (total, (arc_grad, final_grad, emission_grad)), lost | lost_back

    def in_pairs() -> tuple[jax.Array, Grads]:
        alpha, scale, alphas = _forward_pairs(g, frames, lengths)
        arc_grad, emission_grad = _backward_pairs(
            g, frames, lengths, final_weight, alphas, (wanted[0], wanted[2])
        )
        final_grad = _softmax_pairs(_times(alpha, final_weight)) if wanted[1] else None
        return _total_pairs(alpha, scale, final_weight), (arc_grad, final_grad, emission_grad)

    fast, lost = linear()
    total, grads = jax.lax.cond(lost | _needs_pairs(diff, arcs, frames), in_pairs, lambda: fast)
    return total, derivatives.undefined_to_nan(total, grads, inf_undefined=True)


@functools.cache
def score_op(leaky: bool) -> derivatives.ScoreOp:
    """The LOG dense total [B] over (weight [B, A], final weight [B, S],
    emissions [B, T, V]) as a `derivatives.ScoreOp`; aux = (arcs, lengths,
    ...) as `dense_ops` takes them. `leaky`: apply `arcs.leak` (Kaldi's
    leaky HMM)."""
    return derivatives.ScoreOp(
        functools.partial(_value, leaky),
        derivatives.every_grad(functools.partial(_value_and_grads, leaky)),
        functools.partial(_value_and_grads, leaky),
    )
