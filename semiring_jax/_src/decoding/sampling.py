"""Paths drawn from the LOG path distribution of an acyclic Fsa (traced).

Forward filtering, backward sampling: the forward scores α come from the
level scan (`scores/level_scan.py`); a path is then drawn from its end, the
final state s with probability ∝ exp(α[s] + final[s]), and at each state
the entering arc a with probability ∝ exp(α[src(a)] + w(a)), back to the
start. Each choice is a Gumbel-max over the candidates, with one Gumbel
variable per arc and per state, keyed by `fold_in(key, index)`: the draws
never depend on the schedule's layout or on batch padding, so a batch
entry samples exactly what the entry alone samples with the same key. As
every state is visited at most once, independent variables per arc make
the choices exact: p(path) = exp(score - total).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src.core import derivatives
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.semiring import LOG
from semiring_jax._src.core.sharding import per_device
from semiring_jax._src.scores import level_scan
from semiring_jax._src.scores.best_path import path_as_chain
from semiring_jax._src.scores.tot_score import check_scorable, final_weights

__all__ = ["sample_paths"]


def _check_key(key: Any) -> None:
    """Raises unless `key` is one PRNG key, typed ([]) or raw (uint32 [2])."""
    if not hasattr(key, "dtype") or not hasattr(key, "shape"):
        raise TypeError(
            f"sample_paths: key must be a jax.random key (jax.random.key(seed)), "
            f"got a {type(key).__name__}"
        )
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        if tuple(key.shape) != ():
            raise ValueError(
                f"sample_paths: key must be one key, shape (), got shape {tuple(key.shape)}; "
                f"the call splits it per batch entry and per path itself"
            )
    elif tuple(key.shape) != (2,) or np.dtype(key.dtype) != np.uint32:
        raise ValueError(
            f"sample_paths: key must be one key, jax.random.key(seed) or uint32 [2] "
            f"(jax.random.PRNGKey(seed)), got {np.dtype(key.dtype)} {tuple(key.shape)}"
        )


def _gumbel(key: jax.Array, size: int, dtype: Any) -> jax.Array:
    """[size] standard Gumbel variables, variable i drawn from fold_in(key, i)
    (so a prefix does not depend on `size`)."""
    indices = jnp.arange(size, dtype=jnp.uint32)
    return jax.vmap(lambda i: jax.random.gumbel(jax.random.fold_in(key, i), (), dtype))(indices)


def _draw(
    fsa: Fsa,
    key: jax.Array,
    arc_score: jax.Array,
    ending: jax.Array,
    total: jax.Array,
    final_weight: jax.Array,
) -> Fsa:
    """One path of an unbatched `fsa`, as a chain (see `path_as_chain`)."""
    steps, _ = fsa.schedule.levels.pos_state.shape  # N: a path has at most N - 1 arcs
    num_arcs, num_states = fsa.num_arcs, fsa.num_states
    arc_key, final_key = jax.random.split(key)
    dtype = arc_score.dtype
    # -inf (an impossible arc or end) stays -inf whatever the noise, so it is
    # never chosen while a possible candidate exists.
    perturbed = arc_score + _gumbel(arc_key, num_arcs, dtype)  # [A]
    dst = jnp.asarray(fsa.dst)
    best = jax.ops.segment_max(perturbed, dst, num_segments=num_states)  # [S]
    is_best = (perturbed == best[dst]) & (perturbed > -jnp.inf)
    arc_ids = jnp.arange(num_arcs, dtype=jnp.int32)
    chosen = jax.ops.segment_min(  # [S], A where no arc can enter
        jnp.where(is_best, arc_ids, num_arcs), dst, num_segments=num_states
    )
    chosen = jnp.minimum(chosen, num_arcs)
    # A NaN ending is argmax's pick (NaN sorts first), as it is the total's.
    final_state = jnp.argmax(ending + _gumbel(final_key, num_states, dtype)).astype(jnp.int32)
    found = total != -jnp.inf
    src = jnp.concatenate([jnp.asarray(fsa.src), jnp.zeros(1, jnp.int32)])  # [A + 1]: A, none

    def step(
        carry: tuple[jax.Array, jax.Array], _: None
    ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        state, walking = carry
        arc = chosen[state]
        # The start ends the walk: an arc entering it comes from a state it
        # cannot reach (the Fsa is acyclic), whose α is -inf.
        walking = walking & (state != 0) & (arc < num_arcs)
        arc = jnp.where(walking, arc, num_arcs)
        return (jnp.where(walking, src[arc], state), walking), arc

    # The walk lists the last arc first, then A (none): reverse the real arcs
    # into the first slots.
    _, arcs = jax.lax.scan(step, (final_state, found), None, length=steps - 1)  # [N - 1]
    length = jnp.sum(arcs < num_arcs)
    order = (length - 1 - jnp.arange(steps - 1)) % max(steps - 1, 1)
    chain = path_as_chain(fsa, arcs[order], length, final_state, found, final_weight)
    # A NaN total (a NaN weight on a real arc or final weight) makes every
    # path's score NaN, as the total is, rather than a valid-looking path;
    # and its gradient NaN in every weight, as the total's (the NaN set
    # here is a constant: its gradient alone would be 0).
    nan_final = chain.final_mask & jnp.isnan(total)
    path_final = jnp.where(nan_final, jnp.asarray(jnp.nan, dtype), chain.final_weight)
    return chain.replace(
        final_weight=derivatives.nan_spread(path_final, jnp.asarray(fsa.weight), final_weight)
    )


def _sample_one(fsa: Fsa, key: jax.Array, num_paths: int) -> Fsa:
    """`num_paths` paths of an unbatched `fsa`, batched [num_paths]."""
    weight = jax.lax.stop_gradient(jnp.asarray(fsa.weight))  # the choices are constants
    final_weight = final_weights(fsa, LOG)
    schedule = fsa.schedule
    alpha, _ = level_scan.forward_positions(LOG, schedule, weight)  # [P + 2]
    ending = level_scan.endings(LOG, schedule, alpha, jax.lax.stop_gradient(final_weight))  # [S]
    total = LOG.sum(ending, axis=0)
    forward = alpha[schedule.levels.state_pos]  # [S]
    arc_score = jnp.where(  # [A]
        fsa.arc_mask, LOG.times(forward[jnp.asarray(fsa.src)], weight), -jnp.inf
    )
    keys = jax.random.split(key, num_paths)
    return jax.vmap(lambda path_key: _draw(fsa, path_key, arc_score, ending, total, final_weight))(
        keys
    )


@functools.partial(jax.jit, static_argnums=2)
def _sample(fsa: Fsa, key: jax.Array, num_paths: int) -> Fsa:
    """`_sample_one` over the batch axes, entry keys split from `key`. (Not
    `map_batch`, which maps the Fsa alone: here each entry has its own key.)"""
    mapped = functools.partial(_sample_one, num_paths=num_paths)
    for _ in fsa.batch_shape:
        mapped = jax.vmap(mapped)
    keys = jax.random.split(key, fsa.batch_shape) if fsa.batch_shape else key
    # The keys are split for the whole batch first: a device's entries get
    # the keys they get on one device.
    return per_device(lambda fsa, keys: [bool(fsa.batch_shape)] * 2)(mapped)(fsa, keys)


def sample_paths(fsa: Fsa, key: jax.Array, num_paths: int) -> Fsa:
    """Paths drawn independently from the LOG path distribution.

    A path is drawn with probability exp(score - `tot_score(fsa)`), where
    its score is the sum of its arc weights and its final weight, by
    forward filtering and backward sampling. Each path is a linear Fsa of N
    states and N - 1 arc slots (N: the steps of `fsa`'s schedule): the
    path's arcs first, the rest padding (`arc_mask` False, weight -inf),
    only its last state final; its weights are differentiable gathers of
    `fsa`'s (the choice of the path is a constant). Runs under `jax.jit`
    (with `num_paths` static).

    Key contract: `key` is one key for the whole call. An unbatched `fsa`
    draws path i with `jax.random.split(key, num_paths)[i]`; a batched one
    gives entry b the key `jax.random.split(key, fsa.batch_shape)[b]`, so
    entry b's paths are those of `sample_paths(entry_b, that_key,
    num_paths)`. The draws do not depend on batch padding.

    Where no path succeeds (-inf total), every path is missing: no real
    arc, no final state, score -inf. Where the total is NaN (a NaN weight on
    a real arc, or a NaN final weight), every path's score is NaN: its final
    weight is NaN, with a NaN gradient in every arc and final weight of
    `fsa`, as the total's. Padding arcs and arcs of -inf weight are never drawn.

    Args:
      fsa: an acyclic Fsa, single or batched (batch_shape `[...]`).
      key: a `jax.random.key(seed)` (or legacy `jax.random.PRNGKey(seed)`).
      num_paths: a positive int, the paths drawn per Fsa.
    Returns:
      A batched Fsa of batch_shape `fsa.batch_shape + (num_paths,)`.
    Raises:
      TypeError: if `fsa` is not an Fsa, or `key` not an array.
      ValueError: if `fsa` has a cycle (naming a state on it), `num_paths`
        is not a positive int, or `key` is not one key.
    Examples:
      >>> import jax
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (0, 1, 2, 1.3863)], final=[1])
      >>> paths = sj.sample_paths(fsa, jax.random.key(0), 1000)  # p(label 1) = 0.2
      >>> paths.batch_shape, paths.num_arcs
      ((1000,), 1)
      >>> print(round(float(jnp.mean(paths.label[:, 0] == 1)), 1))
      0.2
      >>> print(sj.tot_score(paths)[:1] <= sj.tot_score(fsa))
      [ True]
    """
    check_scorable(fsa, "sample_paths")
    if isinstance(num_paths, (bool, np.bool_)) or not isinstance(num_paths, (int, np.integer)):
        raise ValueError(f"sample_paths: num_paths must be a positive int, got {num_paths!r}")
    if num_paths < 1:
        raise ValueError(f"sample_paths: num_paths must be a positive int, got {num_paths}")
    _check_key(key)
    return _sample(fsa, key, int(num_paths))
