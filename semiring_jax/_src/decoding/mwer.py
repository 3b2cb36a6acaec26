"""`mwer_loss`: minimum word error training over n-best or sampled paths.

The expected word errors of a lattice's paths, as k2's `MWERLoss` defines
it: take n paths (the n best with distinct words, or n samples), drop the
paths that spell words an earlier one spells, renormalise the rest's
scores over them with a temperature, and weight each path's Levenshtein
distance to the reference by that probability. The paths are chosen from
the weights' values (a constant, no gradient); their scores are gathers of
the lattice's weights, so the loss differentiates into them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src.core import checks
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.inputs import as_array, check_lengths, dtype_of
from semiring_jax._src.core.sharding import per_device
from semiring_jax._src.decoding.edit_distance import check_label_range, edit_distance
from semiring_jax._src.decoding.nbest import nbest
from semiring_jax._src.decoding.sampling import sample_paths
from semiring_jax._src.scores.tot_score import tot_score

__all__ = ["mwer_loss"]


def _words(paths: Fsa) -> tuple[jax.Array, jax.Array]:
    """The output labels of each path with epsilons (0) removed, moved to
    the front: (words int32 [..., N - 1], lengths int32 [...])."""
    is_word = paths.arc_mask & (paths.olabel != 0)
    # A stable sort on "not a word" keeps the words' order.
    order = jnp.argsort(~is_word, axis=-1, stable=True)
    words = jnp.take_along_axis(paths.olabel, order, axis=-1)
    lengths = jnp.sum(is_word, axis=-1).astype(jnp.int32)
    position = jnp.arange(words.shape[-1], dtype=jnp.int32).reshape((1,) * lengths.ndim + (-1,))
    return jnp.where(position < lengths[..., None], words, 0), lengths


def _first_of_their_words(words: jax.Array, lengths: jax.Array, found: jax.Array) -> jax.Array:
    """bool [n]: path j is found and no earlier found path spells its words
    (words [n, L], lengths [n], found [n])."""
    same = (lengths[:, None] == lengths[None, :]) & jnp.all(words[:, None] == words[None, :], -1)
    earlier = jnp.arange(words.shape[0])[:, None] < jnp.arange(words.shape[0])[None, :]
    repeated = jnp.any(same & earlier & found[:, None], axis=0)
    return found & ~repeated


def _expected_errors(
    scores: jax.Array, errors: jax.Array, kept: jax.Array, temperature: jax.Array
) -> jax.Array:
    """Σ_j softmax(scores / temperature)_j · errors_j over the kept paths
    ([n] each); 0 with gradient 0 when none is kept."""
    logits = jnp.where(kept, scores / temperature, -jnp.inf)
    any_kept = jnp.any(kept)
    probs = jax.nn.softmax(jnp.where(any_kept, logits, 0.0))
    return jnp.where(any_kept, jnp.sum(jnp.where(kept, probs * errors, 0.0)), 0.0)


@jax.jit
@per_device(lambda *args: [True, True, True, False])
def _loss(paths: Fsa, ref: jax.Array, ref_lengths: jax.Array, temperature: jax.Array) -> jax.Array:
    batch, num_paths = paths.batch_shape
    scores = tot_score(paths)  # [B, n]; a path's only path
    # A NaN score counts (and makes the loss NaN); only -inf means missing.
    found = jnp.any(paths.final_mask, axis=-1) & (scores != -jnp.inf)
    words, lengths = _words(paths)
    kept = jax.vmap(_first_of_their_words)(words, lengths, found)
    errors = edit_distance(
        words.reshape(batch * num_paths, -1),
        lengths.reshape(-1),
        jnp.repeat(ref, num_paths, axis=0),
        jnp.repeat(ref_lengths, num_paths),
    ).reshape(batch, num_paths)
    errors = errors.astype(scores.dtype)
    return jax.vmap(_expected_errors, in_axes=(0, 0, 0, None))(scores, errors, kept, temperature)


def mwer_loss(
    lattice: Fsa,
    ref: Any,
    ref_lengths: Any,
    *,
    n: int = 16,
    key: Any = None,
    temperature: float = 1.0,
) -> jax.Array:
    """The expected word errors of each lattice's paths (k2's `MWERLoss`).

    The paths are `sj.nbest(lattice, n, unique=True)` or, with a `key`,
    `sj.sample_paths(lattice, key, n)`. A path's words are its output
    labels with 0 (epsilon) removed; of paths that spell the same words only
    the first counts (as k2 dedups its n-best), and so do only the paths
    that exist (fewer than n: the rest are missing). Over the kept paths j
    of utterance b, with path scores s_j (arc weights plus the final weight)

        loss[b] = Σ_j softmax(s / temperature)_j · lev(words_j, ref[b]),

    lev the Levenshtein distance to the first `ref_lengths[b]` labels of
    `ref[b]`. Differentiable with respect to the lattice's arc and final
    weights (the choice of paths is a constant). A lattice with no path
    gives 0 with gradient 0 (an empty sum, as in k2). A NaN weight: with
    `key=None` the n-best search raises the `ValueError` of `sj.nbest`
    (naming the arc); with a key, a NaN that makes the lattice's total NaN
    gives NaN, with a NaN gradient in every weight (as `sj.tot_score`).

    With `key=None` the n-best search runs on the host: call it outside
    `jax.jit` (under `jax.grad` is fine). With a key everything is traced.

    Args:
      lattice: an acyclic batched Fsa with B entries (e.g. from
        `sj.intersect_dense`), words as output labels.
      ref: int [B, M], the reference words, padded.
      ref_lengths: int [B] in [0, M].
      n: the number of paths, a positive Python int.
      key: None (the n best distinct paths) or a `jax.random` key (n
        sampled paths, from the lattice's LOG path distribution).
      temperature: a positive float; path scores are divided by it before
        they are renormalised (larger: flatter).
    Returns:
      float [B], the lattice's dtype.
    Raises:
      ValueError: for a lattice that is not a batched Fsa of B entries, a
        cycle (naming a state), ref not of rank 2, ref_lengths outside
        [0, M] (naming the entry), a concrete reference word before its
        length outside int32 (the lattice's labels; checked at full width,
        naming the entry), n < 1 or temperature <= 0.
    Examples:
      >>> import semiring_jax as sj
      >>> lattice = sj.stack([sj.Fsa.from_arcs(
      ...     [(0, 1, 1, 1, 0.0), (0, 1, 2, 2, -1.0)], final=[1])])
      >>> # P(word 1) = e / (e + 1) = 0.731, one error only on word 2.
      >>> print([round(float(x), 3) for x in sj.mwer_loss(lattice, [[1]], [1], n=2)])
      [0.269]
    """
    fn = "mwer_loss"
    if not isinstance(lattice, Fsa) or len(lattice.batch_shape) != 1:
        shape = lattice.batch_shape if isinstance(lattice, Fsa) else type(lattice).__name__
        raise ValueError(f"{fn}: lattice must be a batched Fsa with batch shape [B], got {shape}")
    (batch,) = lattice.batch_shape
    ref = as_array(ref, "ref", fn)  # lists at full width, so that the range check sees them
    shape = tuple(np.shape(ref))
    if len(shape) != 2 or shape[0] != batch:
        raise ValueError(f"{fn}: ref must have shape [B, M] with B = {batch}, got {shape}")
    if not np.issubdtype(dtype_of(ref), np.integer):
        raise ValueError(f"{fn}: ref must hold integers, got {dtype_of(ref)}")
    ref_lengths = check_lengths(ref_lengths, batch, shape[1], fn, "ref_lengths", "M")
    check_label_range(ref, ref_lengths, "ref", np.int32, fn, "the lattice's labels are int32")
    # Checked, a concrete ref fits int32; a traced one keeps its dtype, so
    # that a wide word is compared at its width (it matches no label).
    ref = jnp.asarray(ref) if checks.is_traced(ref) else jnp.asarray(ref, jnp.int32)
    n = checks.check_int(n, "n", fn, 1)
    temperature = float(temperature)
    if not temperature > 0:
        raise ValueError(f"{fn}: temperature must be > 0, got {temperature}")
    paths = nbest(lattice, n, unique=True) if key is None else sample_paths(lattice, key, n)
    dtype = lattice.weight.dtype
    return _loss(
        paths,
        ref,
        ref_lengths,
        jnp.asarray(temperature, dtype),
    )
