"""Kaldi's leaky HMM for the LF-MMI denominator (traced).

With leak coefficient ε and initial probabilities p [S], the forward vector
α [S] becomes α + ε · p · Σ_s α(s) at every frame boundary t = 0 … T_b,
before the frame's arcs (Kaldi's `chain-denominator.cc`): any state may be
entered at any frame at a small cost, which keeps the denominator smooth
in its early training. p is Kaldi's `DenominatorGraph::SetInitialProbs`:
100 iterations of the graph's probability flow from state 0, with each
state's arcs and final probability normalised to sum to one, the flow
renormalised after each step, averaged over the iterations. It depends on
the graph's weights only, and is treated as a constant (no gradient).

`initial_probs` computes p; `scan_value_and_grads` is the portable
recursion (a `lax.scan` over frames, log-sum-exp per destination by
segment reductions, normalised per frame, differentiated by autodiff):
the path for GPUs and TPUs and the compiled kernel's reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from semiring_jax._src.core import checks
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.sharding import varying_like
from semiring_jax._src.kernels import dense_ops

__all__ = ["initial_probs", "scan_value_and_grads"]

_ITERATIONS = 100  # Kaldi's num_iters


def initial_probs(graph: Fsa) -> jax.Array:
    """Kaldi's initial probabilities [S] of an unbatched graph (float, sums
    to 1; no gradient): see the module docstring. A concrete graph (a
    constant of the traced function, as a denominator graph usually is) is
    computed once, as the function is traced; a traced one at every call
    (100 segment sums over the arcs)."""
    arrays = (graph.src, graph.dst, graph.weight, graph.final_weight)
    if not any(checks.is_traced(x) for x in (*arrays, graph.arc_mask, graph.final_mask)):
        with jax.ensure_compile_time_eval():
            return _flow(graph)
    return _flow(graph)


def _flow(graph: Fsa) -> jax.Array:
    """`initial_probs`: the flow's 100 steps (traced or, under
    `ensure_compile_time_eval`, run at once)."""
    num_states = graph.num_states
    arc_prob = jnp.where(graph.arc_mask, jnp.exp(graph.weight), 0.0)
    final_prob = jnp.where(graph.final_mask, jnp.exp(graph.final_weight), 0.0)
    total = jax.ops.segment_sum(arc_prob, graph.src, num_segments=num_states) + final_prob
    # A state with no way on (Kaldi asserts there is one) passes nothing.
    norm = jnp.where(total > 0, 1.0 / jnp.where(total > 0, total, 1.0), 0.0)
    flow = norm[graph.src] * arc_prob

    def step(cur: jax.Array, _: None) -> tuple[jax.Array, jax.Array]:
        nxt = jax.ops.segment_sum(cur[graph.src] * flow, graph.dst, num_segments=num_states)
        mass = jnp.sum(nxt)
        return nxt / jnp.where(mass > 0, mass, 1.0), cur

    start = jnp.zeros(num_states, arc_prob.dtype).at[0].set(1.0)
    _, visited = jax.lax.scan(step, start, None, length=_ITERATIONS)
    return jax.lax.stop_gradient(jnp.mean(visited, axis=0))


def _log_sum(x: jax.Array) -> jax.Array:
    """log Σ exp over the last axis; -inf for an empty sum, and no NaN in
    its gradient there."""
    top = jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    sums = jnp.sum(jnp.exp(x - top), axis=-1)
    found = sums > 0
    return jnp.where(found, top[..., 0] + jnp.log(jnp.where(found, sums, 1.0)), -jnp.inf)


def _segment_log_sum(x: jax.Array, segments: jax.Array, count: int) -> jax.Array:
    top = jax.lax.stop_gradient(jax.ops.segment_max(x, segments, num_segments=count))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    sums = jax.ops.segment_sum(jnp.exp(x - top[segments]), segments, num_segments=count)
    found = sums > 0
    return jnp.where(found, top + jnp.log(jnp.where(found, sums, 1.0)), -jnp.inf)


def _leak(alpha: jax.Array, log_leak: jax.Array) -> jax.Array:
    """log(exp(α) + leak · Σ exp(α)); -inf where both are 0, with a zero
    gradient there (logaddexp's would be NaN)."""
    return _log_sum(jnp.stack([alpha, log_leak + _log_sum(alpha)], axis=-1))


def _one_total(
    weight: jax.Array,
    final_weight: jax.Array,
    emissions: jax.Array,
    length: jax.Array,
    src: jax.Array,
    dst: jax.Array,
    column: jax.Array,
    leak: jax.Array,
) -> jax.Array:
    """The leaky log total of one utterance: weight [A], final [S] (-inf
    where not final), emissions [T, V], the structure [A] and leak [S]."""
    num_states = final_weight.shape[0]
    real = column >= 0
    weight = jnp.where(real, weight, -jnp.inf)
    column = jnp.where(real, column, 0)
    log_leak = jnp.where(leak > 0, jnp.log(jnp.where(leak > 0, leak, 1.0)), -jnp.inf)
    start = jnp.full(num_states, -jnp.inf, emissions.dtype).at[0].set(0.0)

    def step(
        carry: tuple[jax.Array, jax.Array], inputs: tuple[jax.Array, jax.Array]
    ) -> tuple[tuple[jax.Array, jax.Array], None]:
        alpha, shift = carry
        t, frame = inputs
        active = t < length
        # A frame past the length is not read: not even a NaN in it reaches
        # the gradient (through the masked branch's 0 * NaN).
        frame = jnp.where(active, frame, 0.0)
        new = _segment_log_sum(alpha[src] + weight + frame[column], dst, num_states)
        new = _leak(new, log_leak)
        # Normalised per frame, so that float32 keeps its precision.
        top = jax.lax.stop_gradient(jnp.max(new))
        top = jnp.where(jnp.isfinite(top), top, 0.0)
        return (jnp.where(active, new - top, alpha), jnp.where(active, shift + top, shift)), None

    frames = jnp.arange(emissions.shape[0], dtype=jnp.int32)
    zero = jnp.zeros((), emissions.dtype)
    # Inside jax.shard_map the emissions are per device, the shared graph not.
    init = varying_like((_leak(start, log_leak), zero), emissions, length)
    (alpha, shift), _ = jax.lax.scan(step, init, (frames, emissions))
    return shift + _log_sum(alpha + final_weight)


def scan_value_and_grads(
    diff: dense_ops.Diff, aux: dense_ops.Aux
) -> tuple[jax.Array, dense_ops.Diff]:
    """(leaky log totals [B], gradients like `diff`) by the portable scan;
    `diff` and `aux` as the dense kernel takes them (`dense_ops`)."""
    arcs, lengths = aux[:2]
    shared = arcs.src.shape[0] == 1
    structure = (arcs.src, arcs.dst, arcs.column, arcs.leak)
    if shared:
        structure = tuple(x[0] for x in structure)
    graph_axis = None if shared else 0
    value_and_grad = jax.value_and_grad(_one_total, argnums=(0, 1, 2))
    in_axes = (0, 0, 0, 0) + (graph_axis,) * 4
    lengths = jnp.asarray(lengths, jnp.int32)
    value, grads = jax.vmap(value_and_grad, in_axes=in_axes)(*diff, lengths, *structure)
    return value, grads
