"""CTC: the topology, per-utterance graphs, the loss and forced alignment.

The loss never builds an Fsa: a label sequence l_1..l_U has the CTC graph
of S = 2U + 1 states (even states: blank; state 2i + 1: label l_{i+1}) whose
incoming arcs all carry their state's label, and whose slots are a band:
slot k of state s comes from state s - k (self, previous, the one before).
Only the weights (is the skip allowed?) and labels depend on the data. That is built in JAX, so
`ctc_loss` runs under `jax.jit` with traced labels, and the emission of a
state is gathered once per frame, not once per arc.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
from jax.typing import DTypeLike

from semiring_jax._src import checks, cpu_ctc, dense_recursion
from semiring_jax._src.dense import best_columns, check_emissions, check_lengths, dtype_of
from semiring_jax._src.dense_recursion import Slots
from semiring_jax._src.fsa import Fsa
from semiring_jax._src.semiring import LOG

__all__ = ["ctc_graph", "ctc_loss", "ctc_topo", "forced_align"]


def ctc_topo(
    vocab_size: int, blank: int = 0, *, modified: bool = False, dtype: npt.DTypeLike = np.float32
) -> Fsa:
    """The CTC topology: a transducer from frame tokens to output labels.

    Standard (k2's `ctc_topo(modified=False)`): one state per token, state 0
    for `blank`; from every state, token j goes to state j, writing j when
    it starts a new token and 0 (epsilon) when it is the blank or repeats
    the state's own token (so a repeated label needs a blank between). All
    states are final; V² arcs. Modified (k2's `modified=True`), 4V - 3
    arcs: from the blank state, any token j is written and either stays
    (one frame of j) or enters state j, whose self-loop repeats j and whose
    other arc returns to the blank state on one more frame of j; repeated
    labels need no blank between. Only the blank state is final.

    Output label 0 means "nothing" (epsilon, as structural algorithms read
    it; API.md): with a blank other than 0, token 0's own output is then
    indistinguishable from epsilon, so keep the blank at 0 to compose.

    Args:
      vocab_size: V, the number of tokens including the blank.
      blank: the blank token, in [0, V).
      modified: the modified topology (fewer arcs).
      dtype: float32 (default) or float64.
    Returns:
      A cyclic transducer; all weights 0.
    Raises:
      ValueError: if `vocab_size` < 1 or `blank` is outside [0, V).
    Examples:
      >>> import semiring_jax as sj
      >>> sj.ctc_topo(3)
      Fsa(transducer, num_states=3, num_arcs=9, cyclic)
      >>> sj.ctc_topo(3, modified=True).num_arcs
      9
    """
    if vocab_size < 1:
        raise ValueError(f"ctc_topo: vocab_size must be at least 1, got {vocab_size}")
    if not 0 <= blank < vocab_size:
        raise ValueError(
            f"ctc_topo: blank = {blank} is outside [0, vocab_size) = [0, {vocab_size})"
        )
    # Token t lives in state _state(t): the blank must be state 0 (the start).
    tokens = np.arange(vocab_size)
    state = np.where(tokens == blank, 0, np.where(tokens == 0, blank, tokens))
    if not modified:
        src, token = (grid.reshape(-1) for grid in np.meshgrid(tokens, tokens, indexing="ij"))
        olabel = np.where((src == token) | (token == blank), 0, token)
        arcs = np.stack([state[src], state[token], token, olabel], axis=1)
        final = list(range(vocab_size))
    else:
        others = tokens[tokens != blank]
        arcs = np.concatenate(
            [
                np.stack(
                    [
                        np.zeros_like(tokens),
                        np.zeros_like(tokens),
                        tokens,
                        np.where(tokens == blank, 0, tokens),
                    ],
                    axis=1,
                ),
                np.stack([np.zeros_like(others), state[others], others, others], axis=1),
                np.stack([state[others], state[others], others, np.zeros_like(others)], axis=1),
                np.stack(
                    [state[others], np.zeros_like(others), others, np.zeros_like(others)], axis=1
                ),
            ]
        )
        final = [0]
    rows = np.concatenate([arcs, np.zeros((arcs.shape[0], 1))], axis=1)
    return (
        Fsa.from_arcs(rows.tolist(), final=final, num_states=vocab_size, dtype=dtype)
        if arcs.shape[0]
        else Fsa.from_arcs([], final=final, num_states=1, dtype=dtype)
    )


def _is_one_sequence(labels: Any) -> bool:
    """A flat sequence of labels (one utterance), not a batch of them."""
    if hasattr(labels, "shape"):
        return len(labels.shape) == 1
    return all(np.ndim(label) == 0 for label in labels)


def _label_rows(labels: Any, label_lengths: Any | None, fn: str) -> list[np.ndarray]:
    """Host label sequences from a padded [B, U] array (+ lengths) or lists."""
    if label_lengths is None and not hasattr(labels, "shape"):
        return [np.asarray(row, np.int64).reshape(-1) for row in labels]
    labels = checks.concrete(labels, "labels", fn)
    if labels.ndim != 2:
        raise ValueError(f"{fn}: labels must have shape [B, U], got {labels.shape}")
    if label_lengths is None:
        return list(labels.astype(np.int64))
    lengths = checks.concrete(label_lengths, "label_lengths", fn)
    _check_label_lengths(lengths, labels.shape, fn)
    return [labels[b, :n].astype(np.int64) for b, n in enumerate(lengths.tolist())]


def _check_label_lengths(lengths: np.ndarray, labels_shape: tuple[int, ...], fn: str) -> None:
    batch, max_labels = labels_shape
    if lengths.shape != (batch,):
        raise ValueError(
            f"{fn}: label_lengths must have shape [B] = ({batch},), got {lengths.shape}"
        )
    bad = np.flatnonzero((lengths < 0) | (lengths > max_labels))
    if bad.size:
        b = int(bad[0])
        raise ValueError(
            f"{fn}: label_lengths[{b}] = {lengths[b]} but labels has room for "
            f"U = {max_labels} labels (and lengths must be >= 0)"
        )


def ctc_graph(
    labels: Sequence[Sequence[int]] | npt.ArrayLike,
    label_lengths: npt.ArrayLike | None = None,
    *,
    blank: int = 0,
    dtype: npt.DTypeLike = np.float32,
) -> Fsa:
    """The CTC graph of a label sequence, or a batch of them.

    For l_1..l_U: 2U + 1 states (even: blank, 2i + 1: l_{i+1}); each state
    loops on its own token and moves to the next state, and a label state
    may skip the blank before the next label when the two labels differ.
    Final states: the last label and the blank after it (state 0 if U = 0).
    `dense_tot_score(ctc_graph(labels), log_probs, lengths)` is the CTC
    log-likelihood, `-ctc_loss`. Output labels: the label on the arc that
    starts it, 0 (epsilon) on blanks and repeats.

    Args:
      labels: one label sequence (a flat list or int [U] array: API.md's
        form), or a batch: a list of sequences, or int [B, U] padded with
        anything past `label_lengths`.
      label_lengths: int [B]; all of U by default.
      blank: the blank token.
      dtype: float32 (default) or float64.
    Returns:
      A transducer Fsa: unbatched for one sequence, else batched (B,).
    Raises:
      ValueError: for a label equal to `blank` or negative, or a length
        outside [0, U].
    Examples:
      >>> import semiring_jax as sj
      >>> sj.ctc_graph([3, 5]).num_states
      5
      >>> graph = sj.ctc_graph([[3, 3], [5]])
      >>> graph.batch_shape, graph.num_states
      ((2,), 5)
    """
    if label_lengths is None and _is_one_sequence(labels):
        row = np.asarray(checks.concrete(labels, "labels", "ctc_graph"), np.int64)
        _check_row(row, "labels", blank)
        return _one_ctc_graph(row, blank, dtype)
    graphs = []
    for b, row in enumerate(_label_rows(labels, label_lengths, "ctc_graph")):
        _check_row(row, f"labels[{b}]", blank)
        graphs.append(_one_ctc_graph(row, blank, dtype))
    from semiring_jax._src.batch import stack  # batch imports fsa; avoid a cycle

    return stack(graphs)


def _check_row(row: np.ndarray, name: str, blank: int) -> None:
    bad = np.flatnonzero((row < 0) | (row == blank))
    if bad.size:
        raise ValueError(
            f"ctc_graph: {name}[{int(bad[0])}] = {row[bad[0]]}; labels must be "
            f">= 0 and differ from blank = {blank}"
        )


def _one_ctc_graph(row: np.ndarray, blank: int, dtype: Any) -> Fsa:
    num_states = 2 * row.size + 1
    token = np.full(num_states, blank, np.int64)
    token[1::2] = row
    states = np.arange(num_states)
    arcs = [
        np.stack([states, states, token[states], np.zeros(num_states, np.int64)], axis=1),
        np.stack(
            [states[:-1], states[1:], token[1:], np.where(states[1:] % 2 == 1, token[1:], 0)],
            axis=1,
        ),
    ]
    skip = states[1:-2:2]  # label state 2i+1 -> 2i+3 when the labels differ
    skip = skip[token[skip] != token[skip + 2]]
    arcs.append(np.stack([skip, skip + 2, token[skip + 2], token[skip + 2]], axis=1))
    table = np.concatenate(arcs)
    table = table[np.lexsort((table[:, 1], table[:, 0]))]  # by source, then destination
    rows = np.concatenate([table, np.zeros((table.shape[0], 1))], axis=1).tolist()
    final = [num_states - 1] + ([num_states - 2] if row.size else [])
    return Fsa.from_arcs(rows, final=sorted(final), num_states=num_states, dtype=dtype)


# -- the loss, on JAX-built slot tables -----------------------------------------


def _ctc_tables(
    labels: jax.Array, label_length: jax.Array, blank: int, dtype: DTypeLike
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One utterance: (state tokens [S], slot weights [S, 3], final [S])."""
    num_states = 2 * labels.shape[0] + 1
    states = jnp.arange(num_states, dtype=jnp.int32)
    label_length = label_length.astype(jnp.int32)
    token = jnp.full(num_states, blank, jnp.int32).at[1::2].set(labels.astype(jnp.int32))
    before = jnp.concatenate([jnp.full(2, blank, jnp.int32), token])[:num_states]  # token[s-2]
    can_skip = (states % 2 == 1) & (states >= 3) & (token != before)
    allowed = jnp.stack([jnp.ones(num_states, bool), states >= 1, can_skip], axis=1)
    slot_weight = jnp.where(allowed, 0.0, -jnp.inf).astype(dtype)
    is_final = (states == 2 * label_length) | (states == 2 * label_length - 1)
    final_weight = jnp.where(is_final, 0.0, -jnp.inf).astype(dtype)
    return token, slot_weight, final_weight


# (slots, slot_weight [S, 3], final [S], state emissions [T, S], length, token [S]) -> result
Utterance = Callable[[Slots, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array], Any]


def _ctc_totals(
    log_probs: jax.Array,
    input_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    blank: int,
    one_utterance: Utterance,
) -> Any:
    tokens, slot_weights, final_weights = jax.vmap(
        lambda row, n: _ctc_tables(row, n, blank, log_probs.dtype)
    )(labels, label_lengths)
    state_emissions = _state_emissions(log_probs, tokens)  # [T, B, S]

    def per_utterance(
        state_emissions: jax.Array,
        length: jax.Array,
        token: jax.Array,
        slot_weight: jax.Array,
        final_weight: jax.Array,
    ) -> Any:
        slots = Slots(src=None, label=None, leaving=None)  # banded: slot k from s - k
        return one_utterance(slots, slot_weight, final_weight, state_emissions, length, token)

    # Time-major emissions are what the vmapped scan reads (and what its
    # gradient comes back as): no [B, T, S] <-> [T, B, S] transposes.
    return jax.vmap(per_utterance, in_axes=(1, 0, 0, 0, 0))(
        state_emissions, input_lengths, tokens, slot_weights, final_weights
    )


def _state_emissions(log_probs: jax.Array, tokens: jax.Array) -> jax.Array:
    """[T, B, S]: each state's column of `log_probs` [B, T, V], gathered
    once for all frames (tokens [B, S]) as rows of the [V, T] transpose: a
    gather (and, for the gradient, a scatter) of S contiguous rows rather
    than of T * S single numbers."""
    return jax.vmap(lambda e, t: jnp.take(e.T, t, axis=0).T, out_axes=1)(log_probs, tokens)


def _scan_loss(
    log_probs: jax.Array,
    input_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    blank: int,
) -> jax.Array:
    """The loss [B] by the portable dense scan (any backend)."""

    def one_utterance(
        slots: Slots,
        slot_weight: jax.Array,
        final_weight: jax.Array,
        state_emissions: jax.Array,
        length: jax.Array,
        token: jax.Array,
    ) -> jax.Array:
        return dense_recursion.total(
            LOG, slots, slot_weight, final_weight, state_emissions, length, slot_grads=False
        )

    totals = _ctc_totals(log_probs, input_lengths, labels, label_lengths, blank, one_utterance)
    loss = jnp.zeros_like(totals) - totals  # +0.0, not -0.0, for a certain alignment
    # Rounding can push a certain alignment's log-probability just above 0.
    return jnp.where(loss < 0, jnp.zeros_like(loss), loss)


@functools.cache
def _scan_gradient(blank: int) -> cpu_ctc.Reference:
    """The scan's gradient, (log_probs, lengths, labels, label_lengths,
    cotangent [B]) -> [B, T, V]: what the kernel's gradient differentiates
    by (cached per blank, so traces share it)."""

    def gradient(
        log_probs: jax.Array,
        input_lengths: jax.Array,
        labels: jax.Array,
        label_lengths: jax.Array,
        cotangent: jax.Array,
    ) -> jax.Array:
        _, pullback = jax.vjp(
            lambda lp: _scan_loss(lp, input_lengths, labels, label_lengths, blank), log_probs
        )
        return pullback(cotangent)[0]

    return gradient


@functools.partial(jax.jit, static_argnames=("blank", "zero_infinity"))
def _ctc_loss(
    log_probs: jax.Array,
    input_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    blank: int,
    zero_infinity: bool,
) -> jax.Array:
    args = (log_probs, input_lengths, labels, label_lengths)
    if cpu_ctc.usable(log_probs):
        loss = cpu_ctc.ctc_loss(blank, _scan_gradient(blank), *args)
    else:
        loss = _scan_loss(*args, blank)
    if zero_infinity:
        loss = jnp.where(jnp.isinf(loss), jnp.zeros_like(loss), loss)
    return loss


def _check_ctc_inputs(
    log_probs: npt.ArrayLike,
    input_lengths: npt.ArrayLike | None,
    labels: npt.ArrayLike,
    label_lengths: npt.ArrayLike,
    blank: int,
    fn: str,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    log_probs = check_emissions(log_probs, fn, "log_probs")
    batch, num_frames, vocab_size = log_probs.shape
    input_lengths = check_lengths(input_lengths, batch, num_frames, fn, "input_lengths", "T")
    if np.ndim(labels) != 2 or np.shape(labels)[0] != batch:
        raise ValueError(
            f"{fn}: labels must have shape [B, U] with B = {batch}, got {tuple(np.shape(labels))}"
        )
    if not np.issubdtype(dtype_of(labels), np.integer):
        raise ValueError(f"{fn}: labels must hold integers, got {dtype_of(labels)}")
    max_labels = np.shape(labels)[1]
    if not 0 <= blank < vocab_size:
        raise ValueError(f"{fn}: blank = {blank} is outside [0, V) = [0, {vocab_size})")
    if not checks.is_traced(label_lengths):
        _check_label_lengths(np.asarray(label_lengths), (batch, max_labels), fn)
    label_lengths = check_lengths(label_lengths, batch, max_labels, fn, "label_lengths", "U")
    if not checks.is_traced(labels) and not checks.is_traced(label_lengths):
        values = np.asarray(labels)
        used = np.arange(max_labels) < np.asarray(label_lengths)[:, None]
        bad = np.argwhere(used & ((values < 0) | (values >= vocab_size) | (values == blank)))
        if bad.size:
            b, u = (int(i) for i in bad[0])
            raise ValueError(
                f"{fn}: labels[{b}, {u}] = {values[b, u]} is outside [0, V) = "
                f"[0, {vocab_size}) or equals blank = {blank}"
            )
    labels = jnp.clip(jnp.asarray(labels, jnp.int32), 0, vocab_size - 1)  # padding
    return log_probs, input_lengths, labels, label_lengths


def ctc_loss(
    log_probs: npt.ArrayLike,
    input_lengths: npt.ArrayLike,
    labels: npt.ArrayLike,
    label_lengths: npt.ArrayLike,
    blank: int = 0,
    *,
    zero_infinity: bool = False,
) -> jax.Array:
    """Connectionist temporal classification loss, per utterance.

    The negative log of the total probability of the frame-level token
    sequences that collapse (merge repeats, drop blanks) to `labels[b]`,
    over the first `input_lengths[b]` frames: `-dense_tot_score` of the CTC
    graph, computed without building it. The gradient with respect to
    `log_probs` is minus the per-frame token posteriors (computed from
    normalised forward-backward scores, not by autodiff through the scan);
    frames past `input_lengths[b]` get exactly 0.

    Args:
      log_probs: float [B, T, V], per-frame log-probabilities (batch first;
        torch's `ctc_loss` takes [T, B, V]).
      input_lengths: int [B], frames per utterance in [0, T].
      labels: int [B, U], padded; entries past `label_lengths` are ignored.
      label_lengths: int [B], in [0, U].
      blank: the blank token.
      zero_infinity: give 0.0 instead of +inf for infeasible utterances
        (too few frames for their labels), like torch's option. Either way
        their gradient is exactly 0.
    Returns:
      float [B], >= 0; +inf where an utterance is infeasible.
    Raises:
      ValueError: for log_probs not of rank 3, lengths outside [0, T] or
        [0, U], labels not [B, U], or a used label outside [0, V) or equal to
        `blank` (checked when the values are concrete).
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> log_probs = jnp.log(jnp.full((1, 2, 3), 1 / 3, jnp.float32))
      >>> loss = sj.ctc_loss(log_probs, jnp.array([2]), jnp.array([[1]]), jnp.array([1]))
      >>> print(jnp.round(jnp.exp(-loss), 4))  # "1 1", "_ 1" or "1 _" of 9
      [0.3333]
    """
    args = _check_ctc_inputs(log_probs, input_lengths, labels, label_lengths, blank, "ctc_loss")
    return _ctc_loss(*args, blank=int(blank), zero_infinity=bool(zero_infinity))


@functools.partial(jax.jit, static_argnames="blank")
def _forced_align(
    log_probs: jax.Array,
    input_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    blank: int,
) -> tuple[jax.Array, jax.Array]:
    def one_utterance(
        slots: Slots,
        slot_weight: jax.Array,
        final_weight: jax.Array,
        state_emissions: jax.Array,
        length: jax.Array,
        token: jax.Array,
    ) -> tuple[jax.Array, jax.Array]:
        states, score = best_columns(slots, slot_weight, final_weight, state_emissions, length)
        return jnp.where(states >= 0, token[jnp.maximum(states, 0)], -1), score

    return _ctc_totals(log_probs, input_lengths, labels, label_lengths, blank, one_utterance)


def forced_align(
    log_probs: npt.ArrayLike,
    input_lengths: npt.ArrayLike,
    labels: npt.ArrayLike,
    label_lengths: npt.ArrayLike,
    blank: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """The best CTC alignment of each utterance (batched Viterbi).

    Ties: the alignment ending in the last label beats the one ending in
    the final blank, then at each frame staying beats moving one state,
    which beats skipping a blank.

    Args:
      log_probs: float [B, T, V]; input_lengths: int [B]; labels: int [B, U];
        label_lengths: int [B]; blank: as in `ctc_loss`.
    Returns:
      `(frame_labels, scores)`: int32 [B, T], the token at each frame of the
      best alignment (blank included; -1 past `input_lengths[b]`, and
      everywhere for an infeasible utterance); float [B], its
      log-probability (-inf if infeasible), equal to the TROPICAL
      `dense_tot_score` of the CTC graph and differentiable.
    Raises:
      ValueError: as `ctc_loss`.
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> log_probs = jnp.log(jnp.array([[[0.1, 0.8, 0.1], [0.7, 0.2, 0.1],
      ...                                 [0.1, 0.1, 0.8]]], jnp.float32))
      >>> frames, scores = sj.forced_align(log_probs, jnp.array([3]), jnp.array([[1, 2]]),
      ...                                  jnp.array([2]))
      >>> print(frames, jnp.round(jnp.exp(scores), 3))
      [[1 0 2]] [0.448]
    """
    args = _check_ctc_inputs(log_probs, input_lengths, labels, label_lengths, blank, "forced_align")
    return _forced_align(*args, blank=int(blank))
