"""Independent reference implementations (oracles) for testing semiring_jax.

Everything here works on plain Python arc lists and numpy, never on
semiring_jax or jax. An FSA is ``(num_states, arcs, final)`` where ``arcs`` is
a list of ``(src, dst, ilabel, olabel, weight)`` tuples, ``final`` maps final
states to final weights and the start state is 0. Weights are scores (higher
is better); OpenFst works with costs, so ``cost = -score`` at that boundary.

Semirings: ``"log"`` (logaddexp, +, -inf, 0), ``"tropical"`` (max, +, -inf, 0)
and ``"real"`` (+, *, 0, 1). Path scores are accumulated left to right in
float64, so tropical results match a forward dynamic program bit for bit.

pynini / OpenFst findings (pynini 2.1.6.post1):
  * Arc types: ``"log"`` and ``"standard"`` (the tropical arc type; its weight
    type is called ``"tropical"``, ``Fst(arc_type="tropical")`` fails), plus
    ``"log64"``. ``"log"``/``"standard"`` store float32 weights (about 1e-7
    relative accuracy per value); ``"log64"`` stores doubles, but
    ``float(Weight)`` goes through a 9-significant-digit string, so about 1e-9
    relative accuracy is the best achievable through pynini.
  * ``shortestdistance(fst)`` gives forward distances from the start state,
    excluding final weights; ``shortestdistance(fst, reverse=True)`` gives the
    distance from each state to the final states, including final weights.
    The returned list drops trailing states whose distance was never set
    (it can be shorter than ``num_states``, even empty), so it is padded here.
  * The convergence parameter is ``delta`` (pynini default 1e-6, not
    1/1024). It matters even on acyclic input: a relaxation d -> d (+) w is
    skipped when it changes d by less than delta, so with 1/1024 log totals
    on ~3000-arc DAGs were off by up to 1e-3. With ``delta=1e-9`` (used here)
    the error is float32 rounding for "log"/"standard" (~5e-6 absolute on
    scores of size ~30) and ~5e-8 absolute (9 digits) for "log64".
  * A cost of ``+inf`` round-trips: ``Weight(t, float("inf"))`` is the
    semiring zero, prints as ``"Infinity"`` and ``float()`` gives ``inf``.
    ``Weight(t, float("-inf"))`` is rejected (scores never reach +inf).
"""

import itertools
import math
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pynini
from scipy.special import logsumexp as scipy_logsumexp

_ONE = {"log": 0.0, "tropical": 0.0, "real": 1.0}
_ARC_TYPES = {"log": "log", "log64": "log64", "tropical": "standard", "standard": "standard"}


def _times(weights, semiring):
    """Returns the left-to-right semiring product of ``weights``."""
    result = _ONE[semiring]
    for w in weights:
        result = result * w if semiring == "real" else result + w
    return float(result)


def _plus(values, semiring):
    """Returns the semiring sum of ``values`` (zero when empty)."""
    v = np.asarray(values, dtype=np.float64)
    if semiring == "real":
        return float(v.sum())
    if v.size == 0 or v.max() == -math.inf:
        return -math.inf
    if semiring == "tropical":
        return float(v.max())
    m = v.max()
    return float(m + np.log(np.sum(np.exp(v - m))))


def _paths_from(arcs, start, max_len=None):
    """Yields ``(arc_indices, end_state)`` for every path from ``start``.

    The empty path is included. Without ``max_len`` a reachable cycle raises
    ValueError; with it, paths of at most ``max_len`` arcs are enumerated.
    """
    out_arcs = defaultdict(list)
    for k, arc in enumerate(arcs):
        out_arcs[arc[0]].append(k)
    stack = [((), start, (start,))]
    while stack:
        path, state, visited = stack.pop()
        yield path, state
        if max_len is not None and len(path) >= max_len:
            continue
        for k in out_arcs[state]:
            dst = arcs[k][1]
            if max_len is None and dst in visited:
                raise ValueError(f"cycle through state {dst} is reachable")
            stack.append(((*path, k), dst, (*visited, dst)))


def _successful(arcs, final, semiring, max_len=None):
    """Returns ``[(arc_indices, semiring score)]`` for successful paths from 0."""
    return [
        (path, _times([arcs[k][4] for k in path] + [final[end]], semiring))
        for path, end in _paths_from(arcs, 0, max_len)
        if end in final
    ]


def enumerate_paths(num_states, arcs, final, *, max_len=None):
    """Lists every successful path of an acyclic FSA.

    Args:
      num_states: Number of states (unused beyond the signature convention).
      arcs: List of ``(src, dst, ilabel, olabel, weight)``.
      final: Dict ``{state: final_weight}``.
      max_len: If given, enumerate paths of at most this many arcs instead of
        raising on cycles.

    Returns:
      List of ``(arc_index_tuple, score)``; score = sum of weights + final.

    Raises:
      ValueError: If a cycle is reachable from state 0 and max_len is None.
    """
    del num_states
    return _successful(arcs, final, "log", max_len)


def brute_tot_score(num_states, arcs, final, semiring):
    """Returns the semiring sum over all successful paths of their scores."""
    del num_states
    return _plus([s for _, s in _successful(arcs, final, semiring)], semiring)


def brute_forward_scores(num_states, arcs, final, semiring):
    """Returns ``[num_states]`` sums over all paths from state 0 to each state.

    Final weights are not included; the empty path gives ``one`` at state 0.
    """
    del final
    scores = [[] for _ in range(num_states)]
    for path, end in _paths_from(arcs, 0):
        scores[end].append(_times([arcs[k][4] for k in path], semiring))
    return np.array([_plus(s, semiring) for s in scores], dtype=np.float64)


def brute_backward_scores(num_states, arcs, final, semiring):
    """Returns ``[num_states]`` sums over all paths from each state to a final.

    Each path's score includes the final weight of the state it ends in.
    """
    scores = [[] for _ in range(num_states)]
    for state in range(num_states):
        for path, end in _paths_from(arcs, state):
            if end in final:
                weights = [arcs[k][4] for k in path] + [final[end]]
                scores[state].append(_times(weights, semiring))
    return np.array([_plus(s, semiring) for s in scores], dtype=np.float64)


def brute_best_path(num_states, arcs, final):
    """Returns the tie-broken best (tropical) path as ``(arc_indices, score)``.

    The final state maximising forward + final weight is chosen (lowest index
    on ties), then the path is traced back: at state 0, stop if the empty
    prefix (score 0) is maximal; otherwise take the incoming arc maximising
    forward[src] + weight (lowest arc index on ties). Forward scores come from
    path enumeration. Returns ``([], -inf)`` when there is no successful path.
    """
    fwd = brute_forward_scores(num_states, arcs, final, "tropical")
    ends = sorted((s, fwd[s] + w) for s, w in final.items())
    best = max((score for _, score in ends), default=-math.inf)
    if best == -math.inf:
        return [], -math.inf
    state = next(s for s, score in ends if score == best)
    path = []
    while True:
        cands = [(fwd[a[0]] + a[4], k) for k, a in enumerate(arcs) if a[1] == state]
        top = max((c for c, _ in cands), default=-math.inf)
        if state == 0 and _ONE["tropical"] >= top:
            break
        k = min(k for c, k in cands if c == top)
        path.append(k)
        state = arcs[k][0]
    return path[::-1], float(best)


def brute_arc_posteriors(num_states, arcs, final, semiring):
    """Returns ``[num_arcs]`` arc posteriors by path enumeration.

    "log": probability that the arc lies on a path when p(path) is
    proportional to exp(score); all zeros when there is no successful path.
    "tropical": indicator of the arcs of ``brute_best_path``.
    """
    post = np.zeros(len(arcs), dtype=np.float64)
    if semiring == "tropical":
        post[brute_best_path(num_states, arcs, final)[0]] = 1.0
        return post
    if semiring != "log":
        raise ValueError(f"unsupported semiring for posteriors: {semiring}")
    paths = _successful(arcs, final, "log")
    z = _plus([s for _, s in paths], "log")
    if z == -math.inf:
        return post
    for path, score in paths:
        for k in set(path):
            post[k] += math.exp(score - z)
    return post


def to_pynini(num_states, arcs, final, arc_type):
    """Builds a pynini.Fst (costs = -scores, start 0) of arc type "log",
    "log64" or "tropical" (OpenFst "standard"). -inf scores become +inf costs.
    """
    fst = pynini.Fst(arc_type=_ARC_TYPES[arc_type])
    wtype = fst.weight_type()
    for _ in range(num_states):
        fst.add_state()
    fst.set_start(0)
    for src, dst, ilabel, olabel, weight in arcs:
        fst.add_arc(src, pynini.Arc(ilabel, olabel, pynini.Weight(wtype, -weight), dst))
    for state, weight in final.items():
        fst.set_final(state, pynini.Weight(wtype, -weight))
    return fst


def openfst_shortest_distance(num_states, arcs, final, arc_type, reverse=False, *, delta=1e-9):
    """Returns OpenFst's shortest distances as ``[num_states]`` float64 scores.

    With ``reverse=False``: distance from state 0 to each state, excluding
    final weights. With ``reverse=True``: distance from each state to the
    final states, including final weights. Unset/infinite distances are -inf.
    """
    fst = to_pynini(num_states, arcs, final, arc_type)
    dist = pynini.shortestdistance(fst, delta=delta, reverse=reverse)
    out = np.full(num_states, -math.inf, dtype=np.float64)
    out[: len(dist)] = [0.0 - float(w) for w in dist]  # 0.0 - x avoids -0.0
    return out


def openfst_tot_score(num_states, arcs, final, arc_type, *, delta=1e-9):
    """Returns OpenFst's total score (reverse distance of state 0; -inf if none)."""
    return float(openfst_shortest_distance(num_states, arcs, final, arc_type, True, delta=delta)[0])


def random_dag(rng, num_states, num_arcs, *, num_final=3):
    """Generates a random trim acyclic acceptor ``(num_states, arcs, final)``.

    Every state j > 0 gets an arc from a random i < j and every non-final
    state i < num_states - 1 an arc to a random j > i; the rest of the
    ``num_arcs`` arcs are random pairs i < j (if the connectivity arcs exceed
    ``num_arcs``, all of them are still kept). Labels are in 1..20 with
    olabel = ilabel; arc and final weights are N(0, 1). The last state is final
    together with ``num_final - 1`` other distinct random states.

    Args:
      rng: A numpy Generator.
      num_states: Number of states (>= 1).
      num_arcs: Target number of arcs.
      num_final: Number of final states (capped at num_states).
    """
    n = num_states
    others = rng.choice(n - 1, size=min(num_final, n) - 1, replace=False) if n > 1 else []
    finals = sorted({n - 1, *(int(s) for s in others)})
    pairs = [(int(rng.integers(j)), j) for j in range(1, n)]
    pairs += [(i, int(rng.integers(i + 1, n))) for i in range(n - 1) if i not in finals]
    while n > 1 and len(pairs) < num_arcs:
        i, j = sorted(int(x) for x in rng.choice(n, size=2, replace=False))
        pairs.append((i, j))
    arcs = []
    for i, j in pairs:
        label = int(rng.integers(1, 21))
        arcs.append((i, j, label, label, float(rng.standard_normal())))
    final = {s: float(rng.standard_normal()) for s in finals}
    return n, arcs, final


# -- dense intersection and CTC ---------------------------------------------------


def _dense_paths(arcs, emissions, length):
    """Yields ``(end_state, score, labels)`` for every path of exactly ``length``
    arcs from state 0, each arc adding its weight and ``emissions[t, ilabel]``."""
    leaving = defaultdict(list)
    for src, dst, ilabel, _, weight in arcs:
        leaving[src].append((dst, ilabel, weight))
    stack = [(0, 0.0, ())]
    while stack:
        state, score, labels = stack.pop()
        t = len(labels)
        if t == length:
            yield state, score, labels
            continue
        for dst, ilabel, weight in leaving[state]:
            stack.append((dst, score + weight + float(emissions[t, ilabel]), (*labels, ilabel)))


def brute_dense_tot_score(arcs, final, emissions, length, semiring):
    """⊕ over paths of exactly ``length`` frames ending in a final state."""
    totals = [
        score + final[end]
        for end, score, _ in _dense_paths(arcs, emissions, length)
        if end in final
    ]
    return _plus(totals, semiring)


def brute_dense_best(arcs, final, emissions, length):
    """``(labels, score)`` of the best path of exactly ``length`` frames."""
    best = (None, -math.inf)
    for end, score, labels in _dense_paths(arcs, emissions, length):
        if end in final and score + final[end] > best[1]:
            best = (labels, score + final[end])
    return best


def ctc_collapse(frames, blank=0):
    """Merge repeated tokens, then drop blanks."""
    out, previous = [], None
    for token in frames:
        if token != previous and token != blank:
            out.append(int(token))
        previous = token
    return tuple(out)


def brute_ctc(log_probs, length, labels, blank=0):
    """``(log p(labels), best alignment score)`` by enumerating every frame
    token sequence of ``length`` frames (V ** length of them)."""
    import itertools

    vocab_size = log_probs.shape[1]
    total, best = [], -math.inf
    for frames in itertools.product(range(vocab_size), repeat=length):
        if ctc_collapse(frames, blank) == tuple(labels):
            score = float(sum(log_probs[t, token] for t, token in enumerate(frames)))
            total.append(score)
            best = max(best, score)
    return _plus(total, "log"), best


def optax_ctc(logits, input_lengths, labels, label_lengths, blank=0):
    """optax.ctc_loss [B] and its gradient w.r.t. the logits [B, T, V]."""
    import jax
    import optax

    _batch, num_frames, _ = logits.shape
    logit_paddings = np.arange(num_frames)[None] >= np.asarray(input_lengths)[:, None]
    label_paddings = np.arange(labels.shape[1])[None] >= np.asarray(label_lengths)[:, None]

    def loss(x):
        return optax.ctc_loss(
            x,
            logit_paddings.astype(x.dtype),
            labels,
            label_paddings.astype(x.dtype),
            blank_id=blank,
        )

    # optax mixes its inputs' dtype with default-dtype one-hots (float64
    # under x64), which the tests' strict promotion would refuse.
    with jax.numpy_dtype_promotion("standard"):
        values, pullback = jax.vjp(loss, logits)
        return np.asarray(values), np.asarray(pullback(np.ones_like(values))[0])


def torch_ctc(logits, input_lengths, labels, label_lengths, blank=0):
    """torch's CTC loss [B] (reduction='none') on log_softmax(logits), and its
    gradient w.r.t. the logits [B, T, V]."""
    import torch

    x = torch.tensor(np.asarray(logits), requires_grad=True)
    log_probs = torch.log_softmax(x, dim=-1).transpose(0, 1)  # torch wants [T, B, V]
    loss = torch.nn.functional.ctc_loss(
        log_probs,
        torch.tensor(np.asarray(labels), dtype=torch.long),
        torch.tensor(np.asarray(input_lengths), dtype=torch.long),
        torch.tensor(np.asarray(label_lengths), dtype=torch.long),
        blank=blank,
        reduction="none",
    )
    loss.sum().backward()
    return loss.detach().numpy(), x.grad.numpy()


# -- transducer (RNN-T) ---------------------------------------------------------


def rnnt_alignments(num_frames, num_labels):
    """Every path over the [T, U+1] grid as the set of move indices that
    emit a label (the others are blanks): T + U moves, the last a blank."""
    if num_frames == 0:
        return []
    return list(itertools.combinations(range(num_frames + num_labels - 1), num_labels))


def _rnnt_path_terms(log_probs, labels, blank, emits):
    """(blank terms, label terms) of one path, as lists of log-probs."""
    t = u = 0
    blanks, label_terms = [], []
    for move in range(log_probs.shape[0] + len(labels)):
        if move in emits:
            label_terms.append(log_probs[t, u, labels[u]])
            u += 1
        else:
            blanks.append(log_probs[t, u, blank])
            t += 1
    return blanks, label_terms


def brute_rnnt_nll(logits, labels, blank=0, fastemit_lambda=0.0):
    """-log P(labels) of one utterance, logits [T_b, U_b + 1, V], by
    enumerating every alignment, in JAX (so that jax.grad gives the oracle
    gradient). FastEmit: the label terms' gradient scaled by 1 + λ, the
    value unchanged (NeMo's rule)."""
    log_probs = jax.nn.log_softmax(jnp.asarray(logits), axis=-1)
    paths = rnnt_alignments(log_probs.shape[0], len(labels))
    if not paths:
        return jnp.asarray(jnp.inf, log_probs.dtype)
    scores = []
    for emits in paths:
        blanks, label_terms = _rnnt_path_terms(log_probs, labels, blank, emits)
        emitted = sum(label_terms, jnp.zeros((), log_probs.dtype))
        scaled = emitted * (1 + fastemit_lambda) - jax.lax.stop_gradient(emitted) * fastemit_lambda
        scores.append(sum(blanks, jnp.zeros((), log_probs.dtype)) + scaled)
    return -jax.scipy.special.logsumexp(jnp.stack(scores))


def brute_pruned_rnnt_nll(logits, starts, labels, blank=0):
    """-log P(labels) of one utterance over the kept positions only, by
    enumerating every alignment of its [T_b, U_b + 1] grid and keeping those
    whose every move leaves a kept node: logits [T_b, S, V] hold node
    (t, starts[t] + k) at [t, k]. In JAX, so that jax.grad gives the oracle
    gradient; +inf where no alignment is kept."""
    log_probs = jax.nn.log_softmax(jnp.asarray(logits), axis=-1)
    num_frames, width, _ = log_probs.shape
    scores = []
    for emits in rnnt_alignments(num_frames, len(labels)):
        t = u = 0
        terms = []
        for move in range(num_frames + len(labels)):
            k = u - int(starts[t])
            if not 0 <= k < width:
                break
            if move in emits:
                terms.append(log_probs[t, k, labels[u]])
                u += 1
            else:
                terms.append(log_probs[t, k, blank])
                t += 1
        else:
            scores.append(sum(terms, jnp.zeros((), log_probs.dtype)))
    if not scores:
        return jnp.asarray(jnp.inf, log_probs.dtype)
    return -jax.scipy.special.logsumexp(jnp.stack(scores))


def brute_rnnt_align(logits, labels, blank=0):
    """(frames of each label on the best alignment, its log-probability) of
    one utterance by enumeration (numpy float64)."""
    logits = np.asarray(logits, np.float64)
    log_probs = logits - scipy_logsumexp(logits, axis=-1, keepdims=True)
    best = (-np.inf, [-1] * len(labels))
    for emits in rnnt_alignments(log_probs.shape[0], len(labels)):
        blanks, label_terms = _rnnt_path_terms(log_probs, labels, blank, emits)
        score = float(np.sum(blanks) + np.sum(label_terms))
        if score > best[0]:
            frames = [move - i for i, move in enumerate(sorted(emits))]
            best = (score, frames)
    return best[1], best[0]


def numpy_rnnt(logits, labels, blank=0):
    """(-log P, gradient w.r.t. the logits) of one utterance, logits
    [T_b, U_b + 1, V], by the textbook α/β recursions in float64 numpy, node
    by node (Graves 2012): a reference for grids too large to enumerate."""
    logits = np.asarray(logits, np.float64)
    num_frames, num_positions, _ = logits.shape
    log_probs = logits - scipy_logsumexp(logits, axis=-1, keepdims=True)
    blank_lp = log_probs[:, :, blank]
    emit_lp = np.full((num_frames, num_positions), -np.inf)
    for u, label in enumerate(labels):
        emit_lp[:, u] = log_probs[:, u, label]
    alpha = np.full((num_frames, num_positions), -np.inf)
    beta = np.full((num_frames, num_positions), -np.inf)
    for t in range(num_frames):
        for u in range(num_positions):
            if t == 0 and u == 0:
                alpha[t, u] = 0.0
                continue
            terms = []
            if t > 0:
                terms.append(alpha[t - 1, u] + blank_lp[t - 1, u])
            if u > 0:
                terms.append(alpha[t, u - 1] + emit_lp[t, u - 1])
            alpha[t, u] = np.logaddexp.reduce(terms)
    for t in reversed(range(num_frames)):
        for u in reversed(range(num_positions)):
            if t == num_frames - 1 and u == num_positions - 1:
                beta[t, u] = blank_lp[t, u]
                continue
            terms = []
            if t < num_frames - 1:
                terms.append(blank_lp[t, u] + beta[t + 1, u])
            if u < num_positions - 1:
                terms.append(emit_lp[t, u] + beta[t, u + 1])
            beta[t, u] = np.logaddexp.reduce(terms)
    log_likelihood = beta[0, 0]
    next_frame = np.vstack([beta[1:], np.full((1, num_positions), -np.inf)])
    next_frame[-1, -1] = 0.0  # the final blank leaves the grid
    next_label = np.hstack([beta[:, 1:], np.full((num_frames, 1), -np.inf)])
    blank_post = np.exp(alpha + blank_lp + next_frame - log_likelihood)
    emit_post = np.exp(alpha + emit_lp + next_label - log_likelihood)
    grad = np.exp(log_probs) * (blank_post + emit_post)[..., None]
    grad[:, :, blank] -= blank_post
    for u, label in enumerate(labels):
        grad[:, u, label] -= emit_post[:, u]
    return -log_likelihood, grad


def levenshtein(a, b):
    """Returns the edit distance of sequences ``a`` and ``b`` (unit insert,
    delete and substitute costs) by the textbook full-table dynamic program."""
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        for j in range(len(b) + 1):
            if i == 0 or j == 0:
                table[i][j] = i + j
            else:
                table[i][j] = min(
                    table[i - 1][j] + 1,
                    table[i][j - 1] + 1,
                    table[i - 1][j - 1] + (a[i - 1] != b[j - 1]),
                )
    return table[len(a)][len(b)]


def openfst_nbest(num_states, arcs, final, n, unique=False):
    """Returns OpenFst's ``n`` shortest paths as ``[(score, output_string)]``,
    best first (ties in string order), by ``pynini.shortestpath(nshortest=n,
    unique=unique)`` on the tropical ("standard", float32) FST.

    An output string is the path's output labels with 0 (epsilon) dropped.
    With ``unique``, the FST is projected onto its output labels and its
    epsilons removed first (determinization, which ``unique`` runs, treats
    epsilon as a symbol), so the strings are distinct output strings, each
    with its best score. Arcs and final weights of score -inf are left out
    first (determinization fails on infinite costs), and so are paths of
    score -inf.
    """
    arcs = [arc for arc in arcs if arc[4] > -math.inf]
    final = {state: weight for state, weight in final.items() if weight > -math.inf}
    fst = to_pynini(num_states, arcs, final, "tropical")
    if unique:
        fst = fst.project("output").rmepsilon()
    result = pynini.shortestpath(fst, nshortest=n, unique=unique)
    found = []
    paths = result.paths()
    while not paths.done():
        score = 0.0 - float(paths.weight())
        if score > -math.inf:
            found.append((score, tuple(label for label in paths.olabels() if label != 0)))
        paths.next()
    return sorted(found, key=lambda path: (-path[0], path[1]))
