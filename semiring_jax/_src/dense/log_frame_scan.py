"""The LOG dense scan: forward scores and per-frame posteriors, compensated.

Scores are carried as (hi, lo) pairs (`core/compensated.py`): hi is a float,
lo the exact rounding residue of every large addition, so the pair holds a
score to ~1e-7 absolute however large it grows (-17,000 after 5,000 frames,
where a float32's spacing is 0.002). That is what keeps float32 posteriors
accurate at T = 5,000 frames (API.md, Precision), and it does so without
normalising each frame: a posterior is exp(α + β - Z) formed from pairs,
elementwise, with no per-frame reduction over states. Every step is then
elementwise work over [R] rows (and a few slots), which XLA fuses into few
kernels, and, for states with more than one row, a few reductions of pairs
up their trees (`dense_slots.to_states`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from semiring_jax._src.core import compensated
from semiring_jax._src.core.sharding import varying_like
from semiring_jax._src.dense.slots import (
    Slots,
    Slotwise,
    Tree,
    by_columns,
    frame_columns,
    frame_scores,
    num_states,
    pull_columns,
    push_columns,
    push_destinations,
    to_states,
)

__all__ = ["forward", "posterior_grads", "state_posteriors", "total_pair"]

_ZERO = -jnp.inf
Pair = tuple[jax.Array, jax.Array]


def _start(size: int, dtype: DTypeLike, reference: jax.Array) -> tuple[jax.Array, jax.Array]:
    hi = jnp.full(size, _ZERO, dtype).at[0].set(0)
    return varying_like(hi, reference), varying_like(jnp.zeros(size, dtype), reference)


def _to_dst(
    slots: Slots, slot_weight: jax.Array, frame: jax.Array, his: Slotwise, los: Slotwise
) -> tuple[Slotwise, Slotwise]:
    """slot weight + emission + (hi, lo), slot by slot, as pairs (columns
    or [R, K] arrays, as `dense_slots.by_columns` says).

    The weight and the emission are O(1) numbers: their plain float sum is
    as exact as the inputs themselves; only adding it to the (large) score
    needs compensating. A padding slot's -inf weight annihilates a +inf
    emission (`compensated.times`), where a plain sum would make NaN."""
    num_slots = slot_weight.shape[1]
    emissions = frame_columns(frame, slots, num_slots)
    times = compensated.times
    if not by_columns(slots, num_slots):
        assert not isinstance(emissions, list)  # by_columns says which
        return _add(his, los, times(slot_weight, emissions))
    return _add(his, los, [times(slot_weight[:, k], emissions[k]) for k in range(num_slots)])


def _add(his: Slotwise, los: Slotwise, values: Slotwise) -> tuple[Slotwise, Slotwise]:
    """(hi, lo) + values slot by slot, for columns or an [R, K] array."""
    if not isinstance(his, list):
        assert not isinstance(los, list) and not isinstance(values, list)  # like `his`
        return compensated.add(his, los, values)
    pairs = [compensated.add(hi, lo, value) for hi, lo, value in zip(his, los, values)]
    return [hi for hi, _ in pairs], [lo for _, lo in pairs]


def _log_sum(his: Slotwise, los: Slotwise) -> tuple[jax.Array, jax.Array]:
    """log Σ over a row's slots, for columns or an [R, K] array."""
    if isinstance(his, list):
        assert isinstance(los, list)  # like `his`
        return compensated.log_sum_columns(his, los)
    assert not isinstance(los, list)  # like `his`
    return compensated.log_sum_pair(his, los, axis=1)


def _pair_sum(values: list[jax.Array]) -> list[jax.Array]:
    return list(compensated.log_sum_pair(values[0], values[1], axis=1))


def _states(rows: tuple[jax.Array, jax.Array], tree: Tree | None) -> tuple[jax.Array, jax.Array]:
    """log Σ over each state's rows [R], as pairs [S]."""
    hi, lo = to_states(rows, tree, (_ZERO, 0.0), _pair_sum)
    return hi, lo


def _per_row(values: jax.Array, slots: Slots, fill: float) -> jax.Array:
    """Per-state values [S] at each incoming row's state [R]."""
    if slots.row_state is None:
        return values
    return jnp.concatenate([values, jnp.full((1,), fill, values.dtype)])[slots.row_state]


def _stacked(values: Slotwise) -> jax.Array:
    return jnp.stack(values, axis=1) if isinstance(values, list) else values


def forward(
    slots: Slots, slot_weight: jax.Array, emissions: jax.Array, length: jax.Array
) -> tuple[tuple[jax.Array, jax.Array], Any]:
    """((α_hi, α_lo) [S] after `length` frames, (hi, lo) [T, S] after each
    frame)."""
    num_rows = slot_weight.shape[0]

    def step(carry: Pair, inputs: tuple[jax.Array, jax.Array]) -> tuple[Pair, Pair]:
        t, frame = inputs
        alpha = _alpha_step(slots, slot_weight, carry, frame, t < length)
        return alpha, alpha

    frames = jnp.arange(emissions.shape[0], dtype=jnp.int32)
    start = _start(num_states(slots, num_rows), slot_weight.dtype, emissions)
    return jax.lax.scan(step, start, (frames, emissions))


def _alpha_step(
    slots: Slots, slot_weight: jax.Array, alpha: Pair, frame: jax.Array, active: jax.Array
) -> Pair:
    """α after a frame [S] from α before it (kept where not `active`)."""
    hi, lo = alpha
    num_slots = slot_weight.shape[1]
    terms = _to_dst(
        slots,
        slot_weight,
        frame,
        pull_columns(hi, slots, num_slots, _ZERO),
        pull_columns(lo, slots, num_slots, 0.0),
    )
    new_hi, new_lo = _states(_log_sum(*terms), slots.in_tree)
    return jnp.where(active, new_hi, hi), jnp.where(active, new_lo, lo)


def _beta_step(slots: Slots, beta: Pair, pushed: Slotwise, active: jax.Array) -> Pair:
    """β before a frame [S] from β after it and the frame's slot weights +
    emissions read at each outgoing slot, `pushed` (`_pushed`; kept where
    not `active`)."""
    beta_hi, beta_lo = beta
    num_slots = len(pushed) if isinstance(pushed, list) else pushed.shape[1]
    rows = _log_sum(
        *_add(
            push_destinations(beta_hi, slots, num_slots, _ZERO),
            push_destinations(beta_lo, slots, num_slots, 0.0),
            pushed,
        )
    )
    new_hi, new_lo = _states(rows, slots.out_tree)
    return jnp.where(active, new_hi, beta_hi), jnp.where(active, new_lo, beta_lo)


def _pushed(slots: Slots, slot_weight: jax.Array, frame: jax.Array) -> Slotwise:
    """`push_columns` of the slot weights + this frame's emissions [R, K].
    A banded graph shifts the two inputs, not their sum: shifts of inputs
    fuse into the step's kernel, where XLA would give shifts of a computed
    sum kernels of their own."""
    if slots.src is not None:
        added = compensated.times(slot_weight, frame_scores(frame, slots))
        return push_columns(added, slots, _ZERO)
    scores = jnp.broadcast_to(frame_scores(frame, slots), slot_weight.shape)
    weights = push_columns(slot_weight, slots, _ZERO)
    emissions = push_columns(scores, slots, 0.0)
    assert isinstance(weights, list) and isinstance(emissions, list)  # banded: columns
    return [compensated.times(w, e) for w, e in zip(weights, emissions)]


def total_pair(
    alpha: tuple[jax.Array, jax.Array], final_weight: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Z = log Σ_s exp(α[s] + final_weight[s]), as a pair."""
    return compensated.log_sum_pair(*compensated.add(*alpha, final_weight), axis=0)


def _total_and_stops(alpha_end: Pair, final_weight: jax.Array) -> tuple[Pair, jax.Array]:
    """(Z as a pair, the posterior of stopping in each state [S]) from α
    after the last frame: the total and its final-weight gradient."""
    z_hi, z_lo = total_pair(alpha_end, final_weight)
    stops = compensated.exp_difference(*compensated.add(*alpha_end, final_weight), z_hi, z_lo)
    return (z_hi, z_lo), stops


def posterior_grads(
    slot_grads: bool,
    slots: Slots,
    slot_weight: jax.Array,
    final_weight: jax.Array,
    emissions: jax.Array,
    length: jax.Array,
    alpha_end: tuple[jax.Array, jax.Array],
    saved: tuple[jax.Array, jax.Array],
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(slot [R, K], final [S], emission [T, V] or [T, S]) gradients of the
    total: expected uses of each slot, stopping posteriors, and per-frame
    column (or state) posteriors; all exactly 0 when the total is -inf.
    From the slot posteriors, which read α before each frame, in a reverse
    scan (`state_posteriors` serves per-state emissions without slot
    gradients in one scan)."""
    num_rows, num_slots = slot_weight.shape
    size = num_states(slots, num_rows)
    num_columns = emissions.shape[1]
    (z_hi, z_lo), final_grad = _total_and_stops(alpha_end, final_weight)
    start_hi, start_lo = _start(size, slot_weight.dtype, emissions)
    saved_hi = jnp.concatenate([start_hi[None], saved[0][:-1]])
    saved_lo = jnp.concatenate([start_lo[None], saved[1][:-1]])

    def step(
        carry: tuple[jax.Array, jax.Array, jax.Array], inputs: tuple[jax.Array, ...]
    ) -> tuple[tuple[jax.Array, jax.Array, jax.Array], jax.Array]:
        beta_hi, beta_lo, slot_grad = carry  # β after frame t; [R, K] so far
        t, frame, alpha_hi, alpha_lo = inputs
        active = t < length
        added = compensated.times(slot_weight, frame_scores(frame, slots))  # [R, K]
        to_hi, to_lo = compensated.add(
            _per_row(beta_hi, slots, _ZERO)[:, None],
            _per_row(beta_lo, slots, 0.0)[:, None],
            added,
        )
        from_hi = _stacked(pull_columns(alpha_hi, slots, num_slots, _ZERO))
        from_lo = _stacked(pull_columns(alpha_lo, slots, num_slots, 0.0))
        posterior = compensated.exp_difference(
            *compensated.add(from_hi, from_lo + to_lo, to_hi), z_hi, z_lo
        )
        posterior = jnp.where(active, posterior, jnp.zeros_like(posterior))
        slot_grad = slot_grad + posterior
        emission_grad = _columns(slots, posterior, num_columns, size)
        pushed = _pushed(slots, slot_weight, frame)
        beta_hi, beta_lo = _beta_step(slots, (beta_hi, beta_lo), pushed, active)
        return (beta_hi, beta_lo, slot_grad), emission_grad

    frames = jnp.arange(emissions.shape[0], dtype=jnp.int32)
    init = (
        varying_like(final_weight, emissions),
        varying_like(jnp.zeros_like(final_weight), emissions),
        varying_like(jnp.zeros_like(slot_weight), emissions),
    )
    (_, _, slot_grad), emission_grad = jax.lax.scan(
        step, init, (frames, emissions, saved_hi, saved_lo), reverse=True
    )
    return slot_grad, final_grad, emission_grad


def state_posteriors(
    slots: Slots,
    slot_weight: jax.Array,
    final_weight: jax.Array,
    emissions: jax.Array,
    length: jax.Array,
) -> tuple[Pair, jax.Array, jax.Array]:
    """(Z as a pair, final [S] and emission [T, S] gradients) for per-state
    emissions (`slots.label` None) without slot gradients: the emission
    gradient is each state's occupancy exp(α after t + β after t - Z).

    α and β do not read each other, so one step computes α after frame i
    and β after frame T - 1 - i: value + gradient takes T sequential steps,
    not 2 T (on a GPU a step's cost is mostly its kernel launches). The
    steps meet in the middle: the first half saves α of the first half of
    the frames and β of the second; there Z is log Σ_s exp(α + β) of the
    middle frame, and the second half forms each occupancy as soon as both
    of its scores exist, so what is held is what `forward` holds, [T, S]
    pairs, and the occupancies.

    Each loop carries α and β as one [4, S] array (`compensated.pack`)
    and saves the carry it reads, whole: on an H100 a step of two frames
    is 5 launches, not the 11 of four carried and saved arrays.
    """
    assert slots.label is None  # per-state emissions [T, S]
    size = num_states(slots, slot_weight.shape[0])
    num_frames = emissions.shape[0]
    half = num_frames // 2
    start = _start(size, slot_weight.dtype, emissions)
    if num_frames == 0:  # nothing to index: Z from the start alone
        z, final_grad = _total_and_stops(start, final_weight)
        return z, final_grad, jnp.zeros_like(emissions)

    def alpha_after(alpha: Pair, t: jax.Array | int) -> Pair:
        frame = jax.lax.dynamic_index_in_dim(emissions, t, keepdims=False)
        return _alpha_step(slots, slot_weight, alpha, frame, t < length)

    def beta_before(beta: Pair, k: jax.Array | int) -> Pair:
        """β after frame k - 1, from β after frame k."""
        frame = jax.lax.dynamic_index_in_dim(emissions, k, keepdims=False)
        return _beta_step(slots, beta, _pushed(slots, slot_weight, frame), k < length)

    def first(packed: jax.Array, i: jax.Array) -> tuple[jax.Array, jax.Array]:
        alpha, beta = compensated.unpack(packed)  # α after frame i - 1, β after frame T - 1 - i
        new = compensated.pack(alpha_after(alpha, i), beta_before(beta, num_frames - 1 - i))
        return new, packed  # what it read: a kernel saving `new` would recompute it

    beta_end = (
        varying_like(final_weight, emissions),
        varying_like(jnp.zeros_like(final_weight), emissions),
    )
    steps = jnp.arange(half, dtype=jnp.int32)
    packed, saved = jax.lax.scan(first, compensated.pack(start, beta_end), steps)
    alpha, beta = compensated.unpack(packed)
    # saved[k]: α after frame k - 1, β after frame T - 1 - k; α after frame
    # half - 1 and β after frame T - 1 - half, as if saved[half], are `last`.
    last = packed
    middle: list[jax.Array] = []
    if num_frames % 2:  # the middle frame, `half`, has both scores now
        alpha = alpha_after(alpha, half)
        z = _log_sum_path(alpha, beta)
        middle = [_occupancy(alpha, beta, z)[None]]
        beta = beta_before(beta, half)
    else:
        z = _log_sum_path(alpha, beta)  # α and β after frame half - 1

    def second(packed: jax.Array, j: jax.Array) -> tuple[jax.Array, jax.Array]:
        # The occupancies read the carry as it comes in, not the step's new
        # scores, so that their kernel does not recompute the step.
        alpha, beta = compensated.unpack(packed)  # α after frame i - 1, β after frame k
        i, k = num_frames - half + j, half - 1 - j
        # α after frame k and β after frame i - 1 are saved[k + 1] = saved[half
        # - j]: `last` for j = 0, whose read (clamped into range) goes unused.
        row = jax.lax.dynamic_index_in_dim(saved, half - j, keepdims=False)
        saved_alpha, saved_beta = compensated.unpack(jnp.where(j == 0, last, row))
        later = _occupancy(alpha, saved_beta, z)  # frame i - 1
        earlier = _occupancy(saved_alpha, beta, z)  # frame k
        occupancies = jnp.stack([later, earlier])
        return compensated.pack(alpha_after(alpha, i), beta_before(beta, k)), occupancies

    if half:  # (a scan of no steps still traces its body, which indexes)
        packed, occupancies = jax.lax.scan(second, compensated.pack(alpha, beta), steps)
        alpha_end, _ = compensated.unpack(packed)
        # later[j]: frame T - half - 1 + j, which for j = 0 is `earlier`'s
        # last or the middle frame; the last frame's β is the final weight.
        later, earlier = occupancies[1:, 0], occupancies[:, 1]
        final_frame = _occupancy(alpha_end, beta_end, z)[None]
        occupancy = jnp.concatenate([jnp.flip(earlier, 0), *middle, later, final_frame])
    else:
        alpha_end, occupancy = alpha, jnp.concatenate(middle)
    (z_hi, z_lo), final_grad = _total_and_stops(alpha_end, final_weight)
    active = (jnp.arange(num_frames, dtype=jnp.int32) < length)[:, None]
    return (z_hi, z_lo), final_grad, jnp.where(active, occupancy, jnp.zeros_like(occupancy))


def _path(alpha: Pair, beta: Pair) -> Pair:
    """α + β [S] of one frame, as a pair: the paths through each state."""
    return compensated.add(alpha[0], alpha[1] + beta[1], beta[0])


def _log_sum_path(alpha: Pair, beta: Pair) -> Pair:
    """log Σ_s exp(α[s] + β[s]) of one frame, as a pair: Z."""
    return compensated.log_sum_pair(*_path(alpha, beta), axis=0)


def _occupancy(alpha: Pair, beta: Pair, z: Pair) -> jax.Array:
    """exp(α + β - Z) [S] of one frame."""
    return compensated.exp_difference(*_path(alpha, beta), *z)


def _columns(slots: Slots, mass: jax.Array, num_columns: int, size: int) -> jax.Array:
    """Sums slot posteriors `mass` [R, K] into [V] by emission column, or
    into [S] (`size`) when the emissions are per state (label None)."""
    if slots.label is None:
        per_row = jnp.sum(mass, axis=1)
        if slots.row_state is None:
            return per_row
        return jnp.zeros(size, mass.dtype).at[slots.row_state].add(per_row, mode="drop")
    return jnp.zeros(num_columns, mass.dtype).at[slots.label.reshape(-1)].add(mass.reshape(-1))
