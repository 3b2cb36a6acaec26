"""`mmi_loss`: lattice-free MMI, a numerator and a denominator dense
intersection per utterance (traced).

Both totals are `dense_tot_score` in LOG over the same log-probs: the
numerator with each utterance's own graph, the denominator with one graph
shared by the batch, optionally with Kaldi's leaky HMM (`mmi/leaky.py`).
Their routes (`core/route_table.py`): the compiled kernel
(`kernels/dense.cc`, the leak included) on the CPU, elsewhere the portable
arc scan (`dense/arc_scan.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src.core import checks, derivatives, inputs, route_table, routes
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.semiring import LOG
from semiring_jax._src.core.sharding import per_device
from semiring_jax._src.dense import arc_scan, dense
from semiring_jax._src.kernels import dense_ops
from semiring_jax._src.mmi import leaky

__all__ = ["mmi_loss"]


def _reference_value(diff: dense_ops.Diff, aux: dense_ops.Aux) -> jax.Array:
    return leaky.scan_value_and_grads(diff, aux)[0]


_PORTABLE = arc_scan.score_op(leaky=True)  # off the kernel


def _kernel_value_and_some_grads(
    diff: dense_ops.Diff, aux: dense_ops.Aux, wanted: tuple[bool, ...]
) -> tuple[jax.Array, tuple[jax.Array | None, ...]]:
    total, grads = dense_ops.log_total_and_grads(
        leaky.scan_value_and_grads, diff, aux, weights=wanted[0]
    )
    return total, derivatives.keep_wanted(grads, wanted)


def _scan_value_and_some_grads(
    diff: dense_ops.Diff, aux: dense_ops.Aux, wanted: tuple[bool, ...]
) -> tuple[jax.Array, tuple[jax.Array | None, ...]]:
    total, grads = leaky.scan_value_and_grads(diff, aux)
    return total, derivatives.keep_wanted(grads, wanted)


def _leaky_value(diff: dense_ops.Diff, aux: dense_ops.Aux) -> jax.Array:
    impls: dict[str, Callable[..., Any]] = {
        "cpu_kernel": functools.partial(dense_ops.log_total, _reference_value),
        "arc_scan": _PORTABLE.value,
        "leaky_scan": _reference_value,
    }
    return routes.dispatch(route_table.LEAKY_MMI, impls, diff, aux, dtype=diff[2].dtype)


def _leaky_value_and_some_grads(
    diff: dense_ops.Diff, aux: dense_ops.Aux, wanted: tuple[bool, ...]
) -> tuple[jax.Array, tuple[jax.Array | None, ...]]:
    portable = _PORTABLE.value_and_some_grads
    assert portable is not None
    impls: dict[str, Callable[..., Any]] = {
        "cpu_kernel": functools.partial(_kernel_value_and_some_grads, wanted=wanted),
        "arc_scan": lambda diff, aux: portable(diff, aux, wanted),
        "leaky_scan": functools.partial(_scan_value_and_some_grads, wanted=wanted),
    }
    return routes.dispatch(route_table.LEAKY_MMI, impls, diff, aux, dtype=diff[2].dtype)


_LEAKY = derivatives.ScoreOp(
    _leaky_value, derivatives.every_grad(_leaky_value_and_some_grads), _leaky_value_and_some_grads
)


def _leaky_total(
    graph: Fsa, log_probs: jax.Array, lengths: jax.Array, coefficient: jax.Array
) -> jax.Array:
    """The leaky-HMM denominator total [B] of a shared graph."""
    leak = coefficient * leaky.initial_probs(graph)
    diff, arcs = dense.kernel_inputs(graph, log_probs, leak.astype(log_probs.dtype)[None])
    return derivatives.score(_LEAKY, diff, (arcs, lengths))


def _total(graph: Fsa, log_probs: jax.Array, lengths: jax.Array) -> jax.Array:
    return dense.total(LOG, graph, log_probs, lengths)


def _frame_shift(log_probs: jax.Array, lengths: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(log_probs less each frame's max over V [B, T, V], the sum of those
    maxima over each utterance's lengths[b] frames [B]).

    Every path of both graphs reads exactly one column per frame for
    lengths[b] frames (epsilon-free, and the leak is linear in α, so it
    scales with the frame), so each total of the shifted log-probs is the
    true one less the sum, which cancels in den - num: computed whole, both
    are ~T · offset for raw network outputs, and their float32 rounding ate
    the loss (0.0 at an offset of 1e9). The maxima are constants
    (stop_gradient): the totals' derivatives are the same at any constant
    shift. A frame whose max is not finite (NaN, ±inf) is not shifted, so
    NaN and +inf stay visible; frames past the length are not summed.
    """
    top = jax.lax.stop_gradient(jnp.max(log_probs, axis=-1, keepdims=True))  # [B, T, 1]
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    frames = jnp.arange(log_probs.shape[1], dtype=lengths.dtype)
    active = frames[None, :] < lengths[:, None]  # [B, T]
    shift = jnp.sum(jnp.where(active, top[..., 0], 0.0), axis=1)
    return log_probs - top, shift


@functools.partial(jax.jit, static_argnames="leaky_hmm")
@per_device(lambda *args: [True, False, True, True, False])
def _mmi_loss(
    num_graphs: Fsa,
    den_graph: Fsa,
    log_probs: jax.Array,
    lengths: jax.Array,
    den_scale: jax.Array,
    leaky_hmm: float,
) -> jax.Array:
    log_probs, shift = _frame_shift(log_probs, lengths)
    num = _total(num_graphs, log_probs, lengths)
    if leaky_hmm:
        den = _leaky_total(den_graph, log_probs, lengths, jnp.asarray(leaky_hmm, log_probs.dtype))
    else:
        den = _total(den_graph, log_probs, lengths)
    den_scale = den_scale.astype(log_probs.dtype)
    # The shift cancels exactly at den_scale = 1 and leaves (den_scale - 1)
    # of it otherwise; its derivative by den_scale is the shift (den = the
    # shifted den + shift), so it is not cut off at 1 unless the shift
    # overflowed, where 0 · inf must not make NaN.
    keep = jnp.isfinite(shift) | (den_scale != 1)
    unshifted = jnp.where(keep, (den_scale - 1) * shift, 0.0)
    loss = den_scale * den - num + unshifted
    # An infeasible numerator: +inf, and (through where) every gradient of
    # that utterance exactly 0, the denominator's included.
    return jnp.where(num == -jnp.inf, jnp.inf, loss)


def mmi_loss(
    num_graphs: Fsa,
    den_graph: Fsa,
    log_probs: Any,
    lengths: Any,
    *,
    den_scale: float = 1.0,
    leaky_hmm: float = 0.0,
) -> jax.Array:
    """The LF-MMI loss of each utterance: -(num - den_scale · den).

    num is the `dense_tot_score` (LOG) of utterance b's numerator graph
    over its `lengths[b]` frames of `log_probs`, den that of the shared
    denominator graph: every arc consumes one frame and adds
    `log_probs[b, t, arc.ilabel]` (V = the number of pdf ids).

    With `leaky_hmm` = ε > 0 the denominator is Kaldi's leaky HMM (as in
    `chain-denominator.cc` and PyChain): starting from α₀ one-hot at state
    0, at every frame boundary t = 0 … T_b the forward vector becomes
    α'ₜ = αₜ + ε · p · Σ_s αₜ(s) before the frame's arcs apply, and den is
    log Σ_s α'_{T_b}(s) · exp(final(s)). p is Kaldi's `SetInitialProbs`:
    100 averaged iterations of the denominator graph made locally
    normalised (final probabilities included), started at state 0; it is a
    constant (no gradient flows into it).

    Gradients reach `log_probs` and both graphs' weights and final weights
    (the numerator's and the denominator's arc posteriors, by autodiff's
    usual rules). An utterance whose numerator has no path of its length
    gives +inf, and every gradient of that utterance (numerator and
    denominator parts) is exactly 0. NaN in gives NaN out.

    Args:
      num_graphs: a batched Fsa with B entries (e.g. `sj.numerator_graphs`),
        labels in [0, V).
      den_graph: an unbatched Fsa shared by the batch (e.g.
        `sj.denominator_graph`), labels in [0, V).
      log_probs: float [B, T, V], per-frame log-probabilities of the pdfs
        (the network's output; not required to be normalised: each frame
        is shifted by its max over V before both totals, and the shifts
        cancel in den - num, so a large offset, 1e9 in float32, costs no
        precision).
      lengths: int [B], frames per utterance in [0, T].
      den_scale: the weight of the denominator (1.0: MMI); finite.
      leaky_hmm: Kaldi's leaky-HMM coefficient ε ≥ 0, finite (0: off;
        Kaldi uses 1e-5). A Python float: it is static under `jax.jit`.
    Returns:
      float [B], the losses (the emissions' dtype).
    Raises:
      ValueError: for log_probs not of rank 3, lengths outside [0, T], a
        numerator batch that is not B graphs, a batched denominator, a
        label outside [0, V) (naming the arc), mismatched dtypes, a
        `leaky_hmm` that is negative or not finite, or a concrete
        `den_scale` that is not finite.
    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> topo = sj.hmm_topo(2, pdfs_per_phone=1)
      >>> lm = sj.ngram_fsa([[1, 2], [2, 1, 2]], num_symbols=2)
      >>> den = sj.denominator_graph(lm, topo)
      >>> num = sj.numerator_graphs([[1, 2]], None, topo)
      >>> log_probs = jax.nn.log_softmax(jnp.zeros((1, 4, 2), jnp.float32))
      >>> # The numerator graph carries no LM weights here, so num > den.
      >>> print(jnp.round(sj.mmi_loss(num, den, log_probs, jnp.array([4])), 3))
      [-0.698]
    """
    fn = "mmi_loss"
    log_probs = inputs.check_emissions(log_probs, fn, "log_probs")
    batch, num_frames, num_columns = log_probs.shape
    lengths = inputs.check_lengths(lengths, batch, num_frames, fn, "lengths", "T")
    if not isinstance(num_graphs, Fsa) or num_graphs.batch_shape != (batch,):
        shape = num_graphs.batch_shape if isinstance(num_graphs, Fsa) else type(num_graphs).__name__
        raise ValueError(
            f"{fn}: num_graphs must be a batched Fsa with B = {batch} entries, got {shape}"
        )
    if not isinstance(den_graph, Fsa) or den_graph.batch_shape != ():
        shape = den_graph.batch_shape if isinstance(den_graph, Fsa) else type(den_graph).__name__
        raise ValueError(f"{fn}: den_graph must be one unbatched Fsa, got {shape}")
    inputs.check_graph(num_graphs, batch, num_columns, log_probs.dtype, fn)
    inputs.check_graph(den_graph, batch, num_columns, log_probs.dtype, fn)
    leaky_hmm = checks.check_finite_float(leaky_hmm, "leaky_hmm", fn, 0.0)
    # den_scale may be traced (a schedule inside jit): checked when concrete.
    if not checks.is_traced(den_scale) and not np.all(np.isfinite(np.asarray(den_scale, float))):
        raise ValueError(f"{fn}: den_scale must be finite, got {den_scale}")
    return _mmi_loss(
        num_graphs, den_graph, log_probs, lengths, jnp.asarray(den_scale), leaky_hmm=leaky_hmm
    )
