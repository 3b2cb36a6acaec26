"""Benchmark: decoding with a large graph (beam search against exact Viterbi
and Kaldi's FasterDecoder).

Decodes B utterances of up to T frames (V tokens) with an HLG-like graph
(a lexicon of W words times a word bigram: every word-end state has an arc
into each word's first token, so W = 1,000 gives ~10^6 arcs) by, in the
same run:

  * ours, pruned: `sj.intersect_dense_pruned` (search_beam 20, max_active
    7,000, output_beam 8, the lattice assembled), its best path by
    `sj.best_path`;
  * ours, exact: `sj.viterbi_decode` (every state at every frame);
  * Kaldi: the `kaldi-decoder` package's C++ `FasterDecoder` over the same
    graph as a `kaldifst` FST at the same beam and max_active, one
    utterance after another (one thread).

Then `sj.nbest(n=100)` on the pruned lattices against OpenFst's
`shortestpath(nshortest=100)` (pynini) on the same lattices.

Utterances come from the graph's own model: a word sequence from the
bigram, each token held 1-4 frames, emissions log_softmax(N(0, 1) logits
+ 3 on the true token; `--peak` sets the 3). At 3 the true token has about
2.4 % of a frame's mass, flatter than a trained model's posteriors, so a
beam of 20 keeps most states; `--peak 8` (about 78 %) is closer to them.
Prints median seconds of round-robin calls (`timing.interleaved_medians`),
frames per second, ratios, and how many utterances each search's best path
agrees with the exact one on.

Run:
    .venv/bin/python benchmarks/bench_decoding.py            # W = 1,000 (~10^6 arcs)
    .venv/bin/python benchmarks/bench_decoding.py --words 200  # a quick look
    .venv/bin/python benchmarks/bench_decoding.py --max-arcs 50000  # E capped
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from timing import Reps, interleaved_medians

import semiring_jax as sj

SEED = 20261202
B, T, V = 8, 500, 500
# Medians of round-robin calls: single calls here drift by 1.5x run to run.
REPS = Reps(min_runs=3, max_runs=7, budget_s=20.0)


def hlg_graph(rng: np.random.Generator, words: int):
    """(arcs [A, 5] as (src, dst, token, word + 1 or 0, score), finals,
    pronunciations, bigram log-probs [W + 1, W] with row 0 the start)."""
    lengths = rng.integers(2, 6, words)
    prons = [rng.integers(1, V, n) for n in lengths]
    # State 0 is the sentence start; word w's tokens are states first[w] ..
    # first[w] + len - 1, the last its word end (history w).
    first = 1 + np.concatenate([[0], np.cumsum(lengths)[:-1]])
    end = first + lengths - 1
    logits = rng.normal(0.0, 2.0, (words + 1, words))
    bigram = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    histories = np.concatenate([[0], end])  # [W + 1]
    src = np.repeat(histories, words)
    dst = np.tile(first, words + 1)
    token = np.tile([p[0] for p in prons], words + 1)
    word = np.tile(np.arange(1, words + 1), words + 1)
    weight = bigram.reshape(-1)
    rows = [np.stack([src, dst, token, word, weight], 1)]
    half = np.log(0.5)
    for w, pron in enumerate(prons):
        states = first[w] + np.arange(len(pron))
        rows.append(np.stack([states, states, pron, 0 * pron, np.full(len(pron), half)], 1))
        rows.append(
            np.stack(
                [states[:-1], states[1:], pron[1:], 0 * pron[1:], np.full(len(pron) - 1, half)], 1
            )
        )
    arcs = np.concatenate(rows)
    return arcs, end, prons, bigram, int(end[-1]) + 1


def utterances(rng, prons, bigram, peak):
    """(emissions float32 [B, T, V], lengths [B], word sequences); `peak`
    is added to the true token's N(0, 1) logit."""
    emissions = np.zeros((B, T, V), np.float32)
    lengths = np.zeros(B, np.int32)
    sentences = []
    for b in range(B):
        frames, history, sentence = [], 0, []
        while True:
            w = int(rng.choice(bigram.shape[1], p=np.exp(bigram[history])))
            held = [t for t in prons[w] for _ in range(rng.integers(1, 5))]
            if len(frames) + len(held) > T:
                break
            frames += held
            sentence.append(w)
            history = w + 1
        logits = rng.standard_normal((T, V)).astype(np.float32)
        logits[np.arange(len(frames)), frames] += peak
        emissions[b] = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
        lengths[b] = len(frames)
        sentences.append(sentence)
    return emissions, lengths, sentences


def kaldi_graph(arcs, finals, num_states):
    import kaldifst

    fst = kaldifst.StdVectorFst()
    for _ in range(num_states):
        fst.add_state()
    fst.start = 0
    for s, d, token, word, weight in arcs:
        # Kaldi: input 0 is epsilon (tokens + 1), costs are -scores.
        fst.add_arc(int(s), kaldifst.StdArc(int(token) + 1, int(word), float(-weight), int(d)))
    for f in finals:
        fst.set_final(int(f), 0.0)
    return fst


def kaldi_decode(fst, emissions, lengths, beam):
    """Each utterance's best token sequence (one per frame) by FasterDecoder."""
    import kaldi_decoder
    import kaldifst

    options = kaldi_decoder.FasterDecoderOptions(beam=beam, max_active=7000, min_active=30)
    decoder = kaldi_decoder.FasterDecoder(fst, options)
    paths = []
    for b in range(len(lengths)):
        decodable = kaldi_decoder.DecodableCtc(emissions[b, : lengths[b]])
        decoder.decode(decodable)
        ok, lattice = decoder.get_best_path()
        linear, isymbols, _, _ = kaldifst.get_linear_symbol_sequence(lattice)
        paths.append(np.asarray(isymbols) - 1 if ok and linear else None)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=1000)
    parser.add_argument(
        "--max-arcs", type=int, default=None, help="intersect_dense_pruned's cap on arcs per frame"
    )
    parser.add_argument("--nbest", type=int, default=100, help="n of the n-best comparison")
    parser.add_argument("--search-beam", type=float, default=20.0, help="both searches' beam")
    parser.add_argument(
        "--peak",
        type=float,
        default=3.0,
        help="the true token's logit boost: 3 gives it ~2.4 %% of a frame, 8 ~ 78 %%",
    )
    args = parser.parse_args()
    rng = np.random.default_rng(SEED)
    arcs, finals, prons, bigram, num_states = hlg_graph(rng, args.words)
    emissions, lengths, _ = utterances(rng, prons, bigram, args.peak)
    graph = sj.Fsa.from_arcs(arcs, finals.tolist(), num_states=num_states, dtype=np.float32)
    frames = int(lengths.sum())
    print(
        f"jax {jax.__version__}; graph: {num_states} states, {len(arcs)} arcs; "
        f"(B, T, V) = ({B}, {T}, {V}), {frames} frames; search_beam {args.search_beam:g}"
    )
    e = jnp.asarray(emissions)

    def pruned():
        return jax.block_until_ready(
            sj.intersect_dense_pruned(
                graph,
                e,
                lengths,
                search_beam=args.search_beam,
                output_beam=8.0,
                max_active=7000,
                max_arcs=args.max_arcs,
            )
        )

    def exact():
        return jax.block_until_ready(sj.viterbi_decode(graph, e, lengths))

    fst = kaldi_graph(arcs, finals, num_states)
    timings = interleaved_medians(
        {
            "pruned": pruned,
            "exact": exact,
            "kaldi": lambda: kaldi_decode(fst, emissions, lengths, args.search_beam),
        },
        REPS,
    )
    lattice = pruned()
    exact_labels, exact_scores = exact()
    kaldi_paths = kaldi_decode(fst, emissions, lengths, args.search_beam)
    best = sj.best_path(lattice)
    pruned_scores = sj.tot_score(lattice, sj.TROPICAL)
    same_pruned = same_kaldi = 0
    for b in range(B):
        truth = np.asarray(exact_labels[b, : lengths[b]])
        labels = np.asarray(best.label[b])[np.asarray(best.arc_mask[b])]
        same_pruned += int(labels.shape == truth.shape and np.array_equal(labels, truth))
        path = kaldi_paths[b]
        same_kaldi += int(
            path is not None and path.shape == truth.shape and np.array_equal(path, truth)
        )
    print(f"{'':>8} {'s':>8} {'frames/s':>10} {'exact / it':>11} {'best path = exact':>18}")
    for name, same in (("pruned", same_pruned), ("exact", B), ("kaldi", same_kaldi)):
        seconds = timings[name]
        print(
            f"{name:>8} {seconds:8.2f} {frames / seconds:10.0f} "
            f"{timings['exact'] / seconds:11.2f} {same:>14d} / {B}"
        )
    gap = float(jnp.max(jnp.abs(pruned_scores - exact_scores)))
    print(
        f"pruned / kaldi throughput: {timings['kaldi'] / timings['pruned']:.2f}; "
        f"lattice arcs per utterance: {np.asarray(lattice.arc_mask.sum(-1)).tolist()}; "
        f"max |pruned - exact| best score: {gap:.2e}"
    )
    nbest_against_openfst(lattice, args.nbest)


def nbest_against_openfst(lattice: sj.Fsa, n: int) -> None:
    """`sj.nbest(lattice, n)` on the batch against OpenFst's
    `shortestpath(nshortest=n)` on each entry (the same lattices, as
    pynini FSTs), and whether their n scores agree."""
    import pynini

    fsts = [entry.to_pynini(arc_type="standard") for entry in sj.unstack(lattice)]

    def ours():
        paths = sj.nbest(lattice, n)
        return jax.block_until_ready(sj.tot_score(paths, sj.TROPICAL))

    def openfst():
        return [pynini.shortestpath(fst, nshortest=n) for fst in fsts]

    ours()  # compile
    seconds = {}
    for name, fn in (("ours", ours), ("openfst", openfst)):
        start = time.perf_counter()
        result = fn()
        seconds[name] = time.perf_counter() - start
        if name == "ours":
            scores = np.asarray(result)
        else:
            theirs = [sorted(-float(str(w)) for w in fst.paths().weights()) for fst in result]
    same = sum(
        np.allclose(sorted(row[row > -np.inf]), other, atol=1e-3)
        for row, other in zip(scores, theirs, strict=True)
    )
    print(
        f"nbest(n={n}) on the {len(fsts)} lattices: ours {seconds['ours']:.3f} s, "
        f"OpenFst shortestpath {seconds['openfst']:.3f} s, ours / OpenFst "
        f"{seconds['ours'] / seconds['openfst']:.2f}; the n scores agree on {same} / {len(fsts)}"
    )


if __name__ == "__main__":
    main()
