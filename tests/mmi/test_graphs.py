"""The LF-MMI graph builders (ngram_fsa, read_arpa, hmm_topo,
denominator_graph, numerator_graphs) against brute force: n-gram
probabilities recomputed from the counts, the ARPA back-off definition,
and log-sums over enumerated frame alignments."""

import collections
import itertools
import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_jax as sj

START, END = "<s>", "</s>"


# -- oracles -----------------------------------------------------------------


def count_ngrams(sequences, order):
    """history -> Counter of the next token, for every history length."""
    counts = collections.defaultdict(collections.Counter)
    for sequence in sequences:
        tokens = [START, *sequence, END]
        for i in range(1, len(tokens)):
            history = tuple(tokens[max(0, i - order + 1) : i])
            for k in range(len(history) + 1):
                counts[history[k:]][tokens[i]] += 1
    return counts


def discounted(counts, history, token, discount, num_symbols):
    """Interpolated absolute discounting, recursively; None: below unigrams."""
    if history is None:
        return 1.0 / (num_symbols + 1)
    lower = discounted(counts, history[1:] if history else None, token, discount, num_symbols)
    seen = counts.get(history)
    if not seen:
        return lower
    total = sum(seen.values())
    return (max(seen[token] - discount, 0) + discount * len(seen) * lower) / total


def sentence_logprob(prob, sequence, order):
    """Σ ln prob(history, token) over the sentence, its end included."""
    tokens = [START, *sequence, END]
    total = 0.0
    for i in range(1, len(tokens)):
        p = prob(tuple(tokens[max(0, i - order + 1) : i]), tokens[i])
        total += math.log(p) if p > 0 else -math.inf
    return total


def walk(fsa, sequence):
    """The score of a deterministic acceptor's path for `sequence`."""
    src, dst, label = (np.asarray(x) for x in (fsa.src, fsa.dst, fsa.label))
    weight, mask = np.asarray(fsa.weight, np.float64), np.asarray(fsa.arc_mask)
    state, total = 0, 0.0
    for token in sequence:
        hits = np.flatnonzero((src == state) & (label == token) & mask)
        if not hits.size:
            return -math.inf
        assert hits.size == 1
        total += weight[hits[0]]
        state = dst[hits[0]]
    if not np.asarray(fsa.final_mask)[state]:
        return -math.inf
    return total + float(np.asarray(fsa.final_weight)[state])


def all_sequences(num_symbols, max_length):
    for length in range(max_length + 1):
        yield from itertools.product(range(1, num_symbols + 1), repeat=length)


def check_deterministic_and_epsilon_free(fsa, low, high):
    mask = np.asarray(fsa.arc_mask)
    src, label = np.asarray(fsa.src)[mask], np.asarray(fsa.label)[mask]
    assert fsa.is_acceptor
    assert np.all((label >= low) & (label <= high))
    assert len(set(zip(src.tolist(), label.tolist()))) == len(src), "not deterministic"


def alignments(phones, num_frames, pdfs_per_phone):
    """Every pdf sequence of `num_frames` that aligns `phones`: each phone
    one frame or more, its forward pdf first, then its self-loop pdf."""
    if not phones:
        if num_frames == 0:
            yield []
        return
    for cuts in itertools.combinations(range(1, num_frames), len(phones) - 1):
        bounds = (0, *cuts, num_frames)
        pdfs = []
        for phone, begin, end in zip(phones, bounds, bounds[1:]):
            forward = (phone - 1) * pdfs_per_phone
            pdfs += [forward] + [forward + pdfs_per_phone - 1] * (end - begin - 1)
        yield pdfs


def logsumexp(values):
    values = [v for v in values if v > -math.inf]
    if not values:
        return -math.inf
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def emission_score(log_probs, pdfs):
    return sum(float(log_probs[t, pdf]) for t, pdf in enumerate(pdfs))


# -- ngram_fsa ------------------------------------------------------------------


def check_ngram(sequences, num_symbols, order, discount):
    lm = sj.ngram_fsa(sequences, num_symbols, order=order, discount=discount, dtype=np.float64)
    check_deterministic_and_epsilon_free(lm, 1, num_symbols)
    counts = count_ngrams(sequences, order)
    prob = lambda history, token: discounted(counts, history, token, discount, num_symbols)
    for sequence in all_sequences(num_symbols, 3):
        expected = sentence_logprob(prob, sequence, order)
        assert walk(lm, sequence) == pytest.approx(expected, abs=1e-9), sequence
    # Each state's arcs and final weight are a distribution.
    weight, final = np.asarray(lm.weight), np.asarray(lm.final_weight)
    src = np.asarray(lm.src)
    for state in range(lm.num_states):
        mass = np.exp(weight[src == state]).sum() + np.exp(final[state])
        assert mass == pytest.approx(1.0, abs=1e-9), state


@pytest.mark.parametrize("order", [1, 2, 3])
@pytest.mark.parametrize("discount", [0.0, 0.5, 1.0])
def test_ngram_fsa_scores_each_sequence_as_the_counts_say(order, discount):
    sequences = [[1, 2, 2, 3], [1, 3], [], [2, 1, 2], [3, 3, 3, 1]]
    check_ngram(sequences, 3, order, discount)


@settings(max_examples=25, deadline=None)
@given(
    num_symbols=st.integers(1, 3),
    data=st.data(),
    order=st.integers(1, 3),
    discount=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
)
def test_ngram_fsa_matches_the_counts_on_random_data(num_symbols, data, order, discount):
    sequences = data.draw(
        st.lists(st.lists(st.integers(1, num_symbols), max_size=4), min_size=1, max_size=4)
    )
    check_ngram(sequences, num_symbols, order, discount)


def test_ngram_fsa_unsmoothed_has_only_seen_arcs_and_scores_through_intersect():
    lm = sj.ngram_fsa([[1, 2], [1, 1, 2]], 3, discount=0.0)
    assert lm.num_arcs == 3  # <s> 1, 1 1, 1 2; phone 3 is never seen
    path = sj.intersect(sj.linear_fsa([1, 1, 2]), lm)
    assert float(sj.tot_score(path)) == pytest.approx(math.log(1 / 3 * 2 / 3), abs=1e-6)
    assert lm.dtype == np.float32


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: sj.ngram_fsa([], 3), "sequences is empty"),
        (lambda: sj.ngram_fsa([[1], [2, 4]], 3), r"sequences\[1\]\[1\] = 4"),
        (lambda: sj.ngram_fsa([[0]], 3), r"sequences\[0\]\[0\] = 0 .*epsilon"),
        (lambda: sj.ngram_fsa([[1.5]], 3), r"sequences\[0\] must be"),
        (lambda: sj.ngram_fsa([[1]], 3, order=0), "order = 0"),
        (lambda: sj.ngram_fsa([[1]], 0), "num_symbols = 0"),
        (lambda: sj.ngram_fsa([[1]], 3, discount=1.5), "discount = 1.5"),
        (lambda: sj.ngram_fsa([[1]], 3, dtype=np.int32), "dtype"),
    ],
)
def test_ngram_fsa_errors_name_the_culprit(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# -- read_arpa --------------------------------------------------------------


def arpa_text(ngrams, backoffs):
    """ARPA text of {words: log10 p} and {words: log10 backoff}."""
    order = max(map(len, ngrams))
    lines = ["some header the reader skips", "", "\\data\\"]
    lines += [f"ngram {k}={sum(len(w) == k for w in ngrams)}" for k in range(1, order + 1)]
    for k in range(1, order + 1):
        lines += ["", f"\\{k}-grams:"]
        for words, logprob in ngrams.items():
            if len(words) == k:
                back = f"\t{backoffs[words]}" if words in backoffs else ""
                lines.append(f"{logprob}\t{' '.join(words)}{back}")
    return "\n".join([*lines, "", "\\end\\", ""])


def arpa_logprob(ngrams, backoffs, sentence):
    """ln P(sentence </s>) by the ARPA back-off definition (log10 tables)."""
    order = max(map(len, ngrams))

    def log10p(history, word):
        if (*history, word) in ngrams:
            return ngrams[(*history, word)]
        if not history:
            return -math.inf
        return backoffs.get(history, 0.0) + log10p(history[1:], word)

    tokens = [START, *sentence, END]
    return math.log(10) * sum(
        log10p(tuple(tokens[max(0, i - order + 1) : i]), tokens[i]) for i in range(1, len(tokens))
    )


# A trigram over {a, b} whose listed n-grams always beat their back-off route.
NGRAMS = {
    (START,): -99.0,
    ("a",): -0.5,
    ("b",): -0.6,
    (END,): -0.7,
    (START, "a"): -0.2,
    ("a", "b"): -0.1,
    ("b", "a"): -0.2,
    ("a", END): -0.3,
    ("b", END): -0.25,
    (START, "a", "b"): -0.05,
    ("a", "b", "a"): -0.1,
    ("a", "b", END): -0.1,
}
BACKOFFS = {(START,): -0.5, ("a",): -0.3, ("b",): -0.2, (START, "a"): -0.15, ("a", "b"): -0.1}
SENTENCES = [s for n in range(4) for s in itertools.product("ab", repeat=n)]


def test_read_arpa_expanded_is_exact_deterministic_and_epsilon_free():
    lm, symbols = sj.read_arpa(arpa_text(NGRAMS, BACKOFFS), expand=True, dtype=np.float64)
    assert symbols.find("a") == 1 and symbols.find("b") == 2 and symbols.find(0) == "<eps>"
    assert START not in symbols and END not in symbols
    check_deterministic_and_epsilon_free(lm, 1, 2)
    for sentence in SENTENCES:
        labels = [symbols.find(word) for word in sentence]
        expected = arpa_logprob(NGRAMS, BACKOFFS, sentence)
        assert walk(lm, labels) == pytest.approx(expected, abs=1e-9), sentence


def scores_through_intersect(lm, symbols, semiring):
    paths = [
        sj.intersect(sj.linear_fsa([symbols.find(w) for w in s], dtype=lm.dtype), lm)
        for s in SENTENCES
    ]
    return np.asarray(sj.tot_score(sj.stack(paths), semiring))


def test_read_arpa_backoff_arcs_are_exact_in_tropical_when_listed_ngrams_win():
    lm, symbols = sj.read_arpa(arpa_text(NGRAMS, BACKOFFS), dtype=np.float64)
    assert np.any(np.asarray(lm.label)[np.asarray(lm.arc_mask)] == 0)  # back-off arcs
    # The premise: no listed n-gram loses to its back-off route.
    for words, logprob in NGRAMS.items():
        if len(words) > 1 and words[-1] != START:
            route = BACKOFFS.get(words[:-1], 0.0) + arpa_logprob_of(words[1:])
            assert logprob >= route, words
    expected = np.array([arpa_logprob(NGRAMS, BACKOFFS, s) for s in SENTENCES])
    np.testing.assert_allclose(scores_through_intersect(lm, symbols, sj.TROPICAL), expected)
    # LOG sums every back-off route, so it overcounts wherever there are two.
    log = scores_through_intersect(lm, symbols, sj.LOG)
    assert np.all(log >= expected - 1e-9) and np.any(log > expected + 1e-3)


def arpa_logprob_of(words):
    """log10 P(words[-1] | words[:-1]) under NGRAMS/BACKOFFS."""
    if words in NGRAMS:
        return NGRAMS[words]
    return BACKOFFS.get(words[:-1], 0.0) + arpa_logprob_of(words[1:])


def test_read_arpa_backoff_arcs_overestimate_in_tropical_when_a_route_wins():
    ngrams = {**NGRAMS, ("a", "b"): -2.0}  # below α(a) P(b) = 10^(-0.3 - 0.6)
    lm, symbols = sj.read_arpa(arpa_text(ngrams, BACKOFFS), dtype=np.float64)
    expected = np.array([arpa_logprob(ngrams, BACKOFFS, s) for s in SENTENCES])
    tropical = scores_through_intersect(lm, symbols, sj.TROPICAL)
    assert np.all(tropical >= expected - 1e-9)
    assert tropical[SENTENCES.index(("b", "a", "b"))] > expected[SENTENCES.index(("b", "a", "b"))]
    exact, _ = sj.read_arpa(arpa_text(ngrams, BACKOFFS), expand=True, dtype=np.float64)
    walked = [walk(exact, [symbols.find(w) for w in s]) for s in SENTENCES]
    np.testing.assert_allclose(walked, expected)


def test_read_arpa_reads_files_and_uses_a_given_symbol_table(tmp_path):
    path = tmp_path / "lm.arpa"
    path.write_text(arpa_text(NGRAMS, BACKOFFS))
    table = sj.SymbolTable({"<eps>": 0, "b": 7, "a": 9, "c": 3})
    for source in (path, str(path)):
        lm, symbols = sj.read_arpa(source, table, expand=True, dtype=np.float64)
        assert symbols is table
        expected = arpa_logprob(NGRAMS, BACKOFFS, ("a", "b"))
        assert walk(lm, [9, 7]) == pytest.approx(expected, abs=1e-9)
    with pytest.raises(ValueError, match="no file"):
        sj.read_arpa(str(tmp_path / "missing.arpa"))


GOOD = arpa_text(NGRAMS, BACKOFFS).splitlines()


def edited(line, new):
    """GOOD with line `line` (1-based) replaced by `new` (None: removed)."""
    lines = list(GOOD)
    if new is None:
        del lines[line - 1]
    else:
        lines[line - 1] = new
    return "\n".join(lines)


def line_of(prefix):
    return next(i for i, line in enumerate(GOOD, start=1) if line.startswith(prefix))


COUNT_2 = line_of("ngram 2")
UNIGRAM_A = line_of("-0.5\ta")
BIGRAM_BA = line_of("-0.2\tb a")
TRIGRAMS = line_of("\\3-grams")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello\nworld\n", r"no \\data\\ line"),
        (edited(COUNT_2, "ngram two"), f"line {COUNT_2}: expected 'ngram k=count'"),
        (edited(UNIGRAM_A, "-0.5\ta\tx"), f"line {UNIGRAM_A}: log10 back-off weight 'x'"),
        (edited(UNIGRAM_A, "oops\ta"), f"line {UNIGRAM_A}: log10 probability 'oops'"),
        (edited(UNIGRAM_A, "nan\ta"), f"line {UNIGRAM_A}: log10 probability 'nan'"),
        (edited(UNIGRAM_A, "-0.5"), f"line {UNIGRAM_A}: expected 'log10"),
        (edited(line_of("-0.1\ta b a"), "-0.1\ta b a\t-0.2"), "of the highest order"),
        (edited(BIGRAM_BA, "-0.2\tb <s>"), f"line {BIGRAM_BA}: <s> inside"),
        (edited(BIGRAM_BA, "-0.2\t</s> a"), f"line {BIGRAM_BA}: </s> before"),
        (edited(BIGRAM_BA, "-0.2\ta b"), f"line {BIGRAM_BA}: duplicate"),
        (edited(BIGRAM_BA, "-0.2\tb z"), f"line {BIGRAM_BA}: word 'z' is not among the 1-grams"),
        # One bigram fewer than declared: found at the next section's header.
        (edited(BIGRAM_BA, None), f"line {TRIGRAMS - 1}: the \\\\2-grams: section"),
        (edited(line_of("\\end"), None), r"ends without an \\end\\ line"),
        (edited(TRIGRAMS, "\\4-grams:"), f"line {TRIGRAMS}: expected"),
    ],
)
def test_read_arpa_errors_name_the_line(text, message):
    with pytest.raises(ValueError, match=message):
        sj.read_arpa(text)


def test_read_arpa_weights_beyond_the_dtype_name_the_line():
    # ln = log10 * ln 10 of 1e39 is beyond float32 (3.4e38): the error
    # named from_arcs and an arc, not the line.
    unigram_b = line_of("-0.6\tb")
    with pytest.raises(ValueError, match=f"read_arpa: line {UNIGRAM_A}: log10 probability '1e39'"):
        sj.read_arpa(edited(UNIGRAM_A, "1e39\ta\t-0.3"))
    with pytest.raises(ValueError, match=f"line {UNIGRAM_A}: log10 back-off weight '-1e39'"):
        sj.read_arpa(edited(UNIGRAM_A, "-0.5\ta\t-1e39"), expand=True)
    with pytest.raises(ValueError, match=f"line {unigram_b}: log10 probability '1e308'.*float64"):
        sj.read_arpa(edited(unigram_b, "1e308\tb\t-0.2"), dtype=np.float64)
    lm, _ = sj.read_arpa(edited(UNIGRAM_A, "1e39\ta\t-0.3"), dtype=np.float64)
    assert np.isclose(np.max(np.asarray(lm.weight)), 1e39 * np.log(10.0))
    # Each value fits float32, but a backed-off weight (ln P(b) + ln α(b),
    # for b after b) does not: named by state and word.
    text = edited(unigram_b, "1.4e38\tb\t1e37")
    sj.read_arpa(text)  # the back-off arcs hold each value alone
    with pytest.raises(ValueError, match=r"read_arpa: expand=True: the backed-off weight of 'b' "):
        sj.read_arpa(text, expand=True)


def test_read_arpa_errors_for_symbols():
    with pytest.raises(ValueError, match=r"line \d+: word 'b' is not in the symbol table"):
        sj.read_arpa("\n".join(GOOD), sj.SymbolTable(["<eps>", "a"]))
    with pytest.raises(ValueError, match="key 0"):
        sj.read_arpa("\n".join(GOOD), sj.SymbolTable(["a", "b"]))
    with pytest.raises(TypeError, match="source"):
        sj.read_arpa(42)


# -- hmm_topo ------------------------------------------------------------------


@pytest.mark.parametrize("pdfs_per_phone", [1, 2])
def test_hmm_topo_arcs(pdfs_per_phone):
    topo = sj.hmm_topo(3, pdfs_per_phone=pdfs_per_phone, dtype=np.float64)
    assert not topo.is_acceptor and topo.num_states == 4 and topo.num_arcs == 9 + 6
    arcs = set(
        zip(
            *(np.asarray(x).tolist() for x in (topo.src, topo.dst, topo.ilabel, topo.olabel)),
            strict=True,
        )
    )
    expected = set()
    for phone in (1, 2, 3):
        forward = (phone - 1) * pdfs_per_phone + 1
        expected |= {(src, phone, forward, phone) for src in range(4)}
        expected.add((phone, phone, forward + pdfs_per_phone - 1, 0))
    assert arcs == expected
    assert np.all(np.asarray(topo.final_mask)) and np.all(np.asarray(topo.weight) == 0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: sj.hmm_topo(0), "num_phones = 0"),
        (lambda: sj.hmm_topo(2.0), "num_phones must be an int"),
        (lambda: sj.hmm_topo(2, pdfs_per_phone=3), "pdfs_per_phone must be 1 or 2"),
    ],
)
def test_hmm_topo_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# -- numerator and denominator graphs -----------------------------------------


@pytest.mark.parametrize("pdfs_per_phone", [1, 2])
def test_numerator_graphs_sum_over_the_alignments(dtype, pdfs_per_phone):
    num_phones, num_frames = 3, 5
    num_pdfs = num_phones * pdfs_per_phone
    phones = np.array([[1, 2, 3], [2, 2, 0], [3, 0, 0], [0, 0, 0], [1, 1, 1], [2, 3, 1]])
    phone_lengths = np.array([3, 2, 1, 0, 3, 3])
    frames = np.array([5, 4, 3, 0, 5, 2])  # the last: fewer frames than phones
    topo = sj.hmm_topo(num_phones, pdfs_per_phone=pdfs_per_phone, dtype=dtype)
    graphs = sj.numerator_graphs(phones, phone_lengths, topo)
    assert graphs.batch_shape == (6,) and graphs.dtype == dtype
    for entry in sj.unstack(graphs):
        mask = np.asarray(entry.arc_mask)
        label = np.asarray(entry.label)[mask]
        assert np.all((label >= 0) & (label < num_pdfs))
        assert np.all(np.asarray(entry.weight)[mask] == 0)
    rng = np.random.default_rng(0)
    log_probs = np.log(rng.dirichlet(np.ones(num_pdfs), size=(6, num_frames))).astype(dtype)
    got = np.asarray(sj.dense_tot_score(graphs, jnp.asarray(log_probs), frames))
    expected = [
        logsumexp(
            emission_score(log_probs[b], pdfs)
            for pdfs in alignments(phones[b, :n].tolist(), int(frames[b]), pdfs_per_phone)
        )
        for b, n in enumerate(phone_lengths)
    ]
    assert expected[3] == 0.0 and expected[5] == -math.inf
    np.testing.assert_allclose(got, expected, rtol=1e-5 if dtype == "float32" else 1e-12)


def test_numerator_graphs_take_ragged_lists_and_error_on_bad_phones():
    topo = sj.hmm_topo(2)
    graphs = sj.numerator_graphs([[1, 2, 1], []], None, topo)
    assert graphs.batch_shape == (2,)
    with pytest.raises(ValueError, match=r"phone_sequences\[1, 1\] = 3 is not a phone"):
        sj.numerator_graphs(np.array([[1, 2], [1, 3]]), np.array([2, 2]), topo)
    with pytest.raises(ValueError, match=r"lengths\[0\] = 3 is outside \[0, N\]"):
        sj.numerator_graphs(np.array([[1, 2]]), np.array([3]), topo)
    with pytest.raises(ValueError, match=r"shape \[B, N\]"):
        sj.numerator_graphs(np.array([1, 2]), np.array([2]), topo)
    epsilon_topo = sj.Fsa.from_arcs([(0, 1, 0, 1, 0.0)], final=[1])
    with pytest.raises(ValueError, match="topo arc 0 has input label 0"):
        sj.numerator_graphs([[1]], None, epsilon_topo)


@pytest.mark.parametrize(("order", "pdfs_per_phone"), [(2, 2), (3, 2), (2, 1)])
def test_denominator_graph_scores_each_alignment_by_the_lm(dtype, order, pdfs_per_phone):
    num_phones, num_frames, discount = 2, 4, 0.5
    num_pdfs = num_phones * pdfs_per_phone
    training = [[1, 2, 2], [2, 1], [1], [2, 2, 1, 1]]
    lm = sj.ngram_fsa(training, num_phones, order=order, discount=discount, dtype=dtype)
    topo = sj.hmm_topo(num_phones, pdfs_per_phone=pdfs_per_phone, dtype=dtype)
    graph = sj.denominator_graph(lm, topo)
    assert graph.dtype == dtype
    if pdfs_per_phone == 2:
        check_deterministic_and_epsilon_free(graph, 0, num_pdfs - 1)
    counts = count_ngrams(training, order)
    prob = lambda history, token: discounted(counts, history, token, discount, num_phones)
    rng = np.random.default_rng(order)
    frames = np.array([4, 3, 1, 0])
    log_probs = np.log(rng.dirichlet(np.ones(num_pdfs), size=(4, num_frames))).astype(dtype)
    got = np.asarray(sj.dense_tot_score(graph, jnp.asarray(log_probs), frames))
    expected = []
    for b, length in enumerate(frames.tolist()):
        terms = []
        for phones in all_sequences(num_phones, length):
            lm_score = sentence_logprob(prob, phones, order)
            terms += [
                lm_score + emission_score(log_probs[b], pdfs)
                for pdfs in alignments(list(phones), length, pdfs_per_phone)
            ]
        expected.append(logsumexp(terms))
    np.testing.assert_allclose(got, expected, rtol=1e-5 if dtype == "float32" else 1e-12)


def test_denominator_graph_refuses_epsilons_unknown_phones_and_mixed_dtypes():
    topo = sj.hmm_topo(2)
    lm, _ = sj.read_arpa("\n".join(GOOD))
    with pytest.raises(ValueError, match=r"label 0 \(epsilon\).*expand=True"):
        sj.denominator_graph(lm, topo)
    lm3 = sj.ngram_fsa([[3]], 3)
    with pytest.raises(ValueError, match="label 3, a phone the topo does not write"):
        sj.denominator_graph(lm3, topo)
    with pytest.raises(ValueError, match="float64 but topo is float32"):
        sj.denominator_graph(sj.ngram_fsa([[1]], 2, dtype=np.float64), topo)
    expanded, _ = sj.read_arpa("\n".join(GOOD), expand=True)
    graph = sj.denominator_graph(expanded, topo)
    check_deterministic_and_epsilon_free(graph, 0, 3)
