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

from semiring_jax._src.core import checks, derivatives, route_table, routes
from semiring_jax._src.core.batch import stack
from semiring_jax._src.core.fsa import Fsa, assemble
from semiring_jax._src.core.host import build
from semiring_jax._src.core.inputs import check_blank, check_emissions, check_labels, check_lengths
from semiring_jax._src.core.semiring import LOG
from semiring_jax._src.core.sharding import per_device
from semiring_jax._src.dense import frame_scan
from semiring_jax._src.dense.dense import best_columns
from semiring_jax._src.dense.frame_scan import Slots
from semiring_jax._src.kernels import ctc_ops

__all__ = ["ctc_graph", "ctc_loss", "ctc_topo", "forced_align"]

# (input_lengths [B], labels [B, U], label_lengths [B])
Lengths = tuple[jax.Array, jax.Array, jax.Array]

_INT32_MAX = int(np.iinfo(np.int32).max)


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
      vocab_size: V, the number of tokens including the blank (an int).
      blank: the blank token, an int in [0, V) (not a bool or a float).
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
    vocab_size = checks.check_int(vocab_size, "vocab_size", "ctc_topo", 1)
    blank = check_blank(blank, vocab_size, "ctc_topo")
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


def _integer_labels(values: Any, name: str, fn: str) -> np.ndarray:
    """Concrete integer labels as int64, any shape; a ValueError naming
    `name` for non-integers and for values outside int32 (never wrapped)."""
    try:
        array = np.asarray(checks.concrete(values, name, fn))
    except (TypeError, ValueError, OverflowError) as err:
        if str(err).startswith(f"{fn}:"):
            raise
        raise ValueError(f"{fn}: {name} must hold integers: {err}") from None
    if array.size == 0:
        return array.astype(np.int64)
    if array.dtype.kind not in "iu":
        raise ValueError(f"{fn}: {name} must hold integers, got dtype {array.dtype}")
    bad = np.argwhere(array > _INT32_MAX)
    if bad.size:
        where = "[" + ", ".join(str(int(i)) for i in bad[0]) + "]"
        raise ValueError(
            f"{fn}: {name}{where} = {array[tuple(bad[0])]} is above 2**31 - 1; labels are int32"
        )
    return array.astype(np.int64)


def _label_rows(labels: Any, label_lengths: Any | None, fn: str) -> list[np.ndarray]:
    """Host label sequences from a padded [B, U] array (+ lengths) or lists."""
    if label_lengths is None and not hasattr(labels, "shape"):
        return [
            _integer_labels(row, f"labels[{b}]", fn).reshape(-1) for b, row in enumerate(labels)
        ]
    labels = _integer_labels(labels, "labels", fn)
    if labels.ndim != 2:
        raise ValueError(f"{fn}: labels must have shape [B, U], got {labels.shape}")
    if label_lengths is None:
        return list(labels)
    checks.check_not_traced(label_lengths, "label_lengths", fn)
    lengths = check_lengths(label_lengths, len(labels), labels.shape[1], fn, "label_lengths", "U")
    return [labels[b, :n] for b, n in enumerate(np.asarray(lengths).tolist())]


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
      blank: the blank token, an int (not a bool or a float).
      dtype: float32 (default) or float64.
    Returns:
      A transducer Fsa: unbatched for one sequence, else batched (B,).
    Raises:
      ValueError: for a label equal to `blank`, negative or above `2**31 - 1`,
        a label that is not an integer, a `blank` that is not an int (bool
        and float refused) in [0, `2**31`), or a length outside [0, U].
    Examples:
      >>> import semiring_jax as sj
      >>> sj.ctc_graph([3, 5]).num_states
      5
      >>> graph = sj.ctc_graph([[3, 3], [5]])
      >>> graph.batch_shape, graph.num_states
      ((2,), 5)
    """
    blank = check_blank(blank, None, "ctc_graph")
    if label_lengths is None and _is_one_sequence(labels):
        row = _integer_labels(labels, "labels", "ctc_graph").reshape(-1)
        _check_row(row, "labels", blank)
        return _one_ctc_graph(row, blank, dtype)
    graphs = []
    for b, row in enumerate(_label_rows(labels, label_lengths, "ctc_graph")):
        _check_row(row, f"labels[{b}]", blank)
        graphs.append(_one_ctc_graph(row, blank, dtype))
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
    arrays = build.arcs_from_rows(
        rows,
        sorted(final),
        num_states=num_states,
        start=0,
        dtype=checks.check_float_dtype(dtype, "dtype", "ctc_graph"),
        fn="ctc_graph",
    )
    # Unbuilt: a batch's `stack` builds every entry's tables once, at its sizes.
    return assemble(arrays, defer=True)


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


def _scan_log_likelihood(log_probs: jax.Array, aux: Lengths, blank: int) -> jax.Array:
    """log Z [B] by the portable dense scan (any backend), differentiable."""

    def one_utterance(
        slots: Slots,
        slot_weight: jax.Array,
        final_weight: jax.Array,
        state_emissions: jax.Array,
        length: jax.Array,
        token: jax.Array,
    ) -> jax.Array:
        return frame_scan.total(
            LOG, slots, slot_weight, final_weight, state_emissions, length, slot_grads=False
        )

    totals: jax.Array = _ctc_totals(log_probs, *aux, blank, one_utterance)
    return totals


def _scan_log_likelihood_and_grad(
    blank: int, log_probs: jax.Array, aux: Lengths
) -> tuple[jax.Array, jax.Array]:
    """(log Z [B], its gradient [B, T, V]) by the scan: the kernel's
    reference, and the portable path."""
    log_z, pullback = jax.vjp(lambda lp: _scan_log_likelihood(lp, aux, blank), log_probs)
    return log_z, pullback(jnp.ones_like(log_z))[0]


def _loss(log_z: jax.Array) -> jax.Array:
    """-log Z, with rounding's negatives clamped to 0 (a certain alignment
    can come out at log Z = 1e-7). -inf (a +inf log-prob) and NaN stay."""
    loss = jnp.zeros_like(log_z) - log_z  # +0.0, not -0.0, for a certain alignment
    return jnp.where((loss < 0) & (loss > -jnp.inf), jnp.zeros_like(loss), loss)


@functools.cache
def _op(blank: int) -> derivatives.ScoreOp:
    """The loss and its gradient by the routes of `route_table.CTC_LOSS`
    (the CPU kernel, or the frame scan); cached per blank, so traces share
    it."""
    reference = functools.partial(_scan_log_likelihood_and_grad, blank)
    log_likelihoods: dict[str, Callable[..., Any]] = {
        "cpu_kernel": functools.partial(ctc_ops.log_likelihood, blank),
        "frame_scan": lambda log_probs, aux: _scan_log_likelihood(log_probs, aux, blank),
    }
    with_grads: dict[str, Callable[..., Any]] = {
        "cpu_kernel": functools.partial(ctc_ops.log_likelihood_and_grad, blank, reference),
        "frame_scan": reference,
    }

    def value(log_probs: jax.Array, aux: Lengths) -> jax.Array:
        return _loss(
            routes.dispatch(
                route_table.CTC_LOSS, log_likelihoods, log_probs, aux, dtype=log_probs.dtype
            )
        )

    def value_and_grad(log_probs: jax.Array, aux: Lengths) -> tuple[jax.Array, jax.Array]:
        log_z, grad = routes.dispatch(
            route_table.CTC_LOSS, with_grads, log_probs, aux, dtype=log_probs.dtype
        )
        # The gradient is that of -log Z even where rounding clamped the
        # value: minus the posteriors, summing to -1 on every frame.
        # A log Z beyond the dtype's range (-inf after rounding) counts as
        # infeasible on every path: a +inf loss with gradient exactly 0.
        infeasible = (log_z == -jnp.inf)[:, None, None]
        grad = jnp.where(infeasible, jnp.zeros_like(grad), jnp.zeros_like(grad) - grad)
        grad = derivatives.undefined_to_nan(log_z, grad, inf_undefined=True)
        return _loss(log_z), grad

    return derivatives.ScoreOp(value, value_and_grad)


@functools.partial(jax.jit, static_argnames=("blank", "zero_infinity"))
@per_device(lambda *args: [True] * len(args))
def _ctc_loss(
    log_probs: jax.Array,
    input_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    blank: int,
    zero_infinity: bool,
) -> jax.Array:
    loss = derivatives.score(_op(blank), log_probs, (input_lengths, labels, label_lengths))
    if zero_infinity:  # +inf only: NaN and a -inf loss (from +inf inputs) stay visible
        loss = jnp.where(loss == jnp.inf, jnp.zeros_like(loss), loss)
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
    labels, label_lengths = check_labels(labels, label_lengths, batch, vocab_size, blank, fn)
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
    normalised forward-backward scores, not by autodiff through the scan):
    in [-1, 0] and summing to -1 on every frame, also next to masked
    log-probs of -1e9 or -1e30 (within the precision of compensated pairs;
    see docs/conventions.md); frames past `input_lengths[b]` get exactly 0. Forward mode
    (`jax.jvp`, `jax.hessian`) works as well as `jax.grad`.

    The value is clamped at 0: rounding can put a certain alignment's
    -log Z at -1e-7, and scores that are not log-probabilities can make it
    negative; the gradient stays that of -log Z. NaN in a log-prob the
    loss reads (a blank or label column within the length) gives a NaN
    loss and a NaN gradient for that utterance, with or without
    `zero_infinity`. The same on the CPU kernel and on the scan.

    Args:
      log_probs: float [B, T, V], per-frame log-probabilities (batch first;
        torch's `ctc_loss` takes [T, B, V]).
      input_lengths: int [B], frames per utterance in [0, T].
      labels: int [B, U], padded; entries past `label_lengths` are ignored.
      label_lengths: int [B], in [0, U].
      blank: the blank token, a Python or numpy int in [0, V) (not a bool
        or a float).
      zero_infinity: give 0.0 instead of +inf for infeasible utterances
        (too few frames for their labels, or a loss beyond the dtype's
        range), like torch's option. Either way their gradient is exactly 0.
    Returns:
      float [B], >= 0; +inf where an utterance is infeasible; NaN for NaN
      inputs; -inf only where a +inf log-prob is used.
    Raises:
      ValueError: for log_probs not of rank 3, lengths outside [0, T] or
        [0, U], labels not [B, U], a `blank` that is not an int in [0, V),
        or a used label outside [0, V) or equal to `blank` (values checked
        when concrete; traced lengths and labels are clamped into range
        before the cast to int32, never wrapped). Lists and tuples are
        accepted for every array.
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
@per_device(lambda *args: [True] * len(args))
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
