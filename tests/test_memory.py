"""Peak memory grows with the arcs, never with states x largest degree.

A star (one state with 1,000,000 arcs) and a lexicon-like graph (one start
state with an arc per word, 5 phones a word, every word ending in one
shared final state) are the shapes of decoding graphs; per-state tables of
S x (largest degree) slots would need terabytes for them. Each case runs in
a fresh interpreter, which reports its own peak RSS (the JAX import
included; Linux's /proc) and checks its scores against numpy.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax, numpy as np
    import semiring_jax as sj

    case = sys.argv[1]
    rng = np.random.default_rng(0)
    num_columns = 40
    if case == "star":
        leaves = 1_000_000
        src, dst = np.zeros(leaves, np.int64), np.arange(1, leaves + 1)
        final, frames = np.arange(1, leaves + 1), 1
    else:
        words, phones = 100_000, 5
        inner = 2 + np.arange(words * (phones - 1)).reshape(words, phones - 1)
        chain = np.concatenate([np.zeros((words, 1), int), inner, np.ones((words, 1), int)], 1)
        src, dst = chain[:, :-1].reshape(-1), chain[:, 1:].reshape(-1)
        final, frames = [1], phones
    labels = rng.integers(1, num_columns, src.size)
    weight = rng.normal(size=src.size).astype(np.float32)
    arcs = np.stack([src, dst, labels, weight], axis=1)
    fsa = sj.Fsa.from_arcs(arcs, final=[int(s) for s in final] if case != "star" else
                           dict.fromkeys(final.tolist(), 0.0))
    emissions = jax.nn.log_softmax(
        jax.random.normal(jax.random.PRNGKey(0), (1, frames, num_columns)), -1)
    e = np.asarray(emissions[0], np.float64)

    # numpy oracles: a path per leaf (star) or per word (lexicon).
    path_weight = weight.astype(np.float64).reshape(-1, frames).sum(1)
    path_dense = path_weight + e[np.arange(frames), labels.reshape(-1, frames)].sum(1)
    def logsumexp(x):
        return float(x.max() + np.log(np.exp(x - x.max()).sum()))

    out = {}
    total, grad = jax.value_and_grad(lambda w: sj.tot_score(fsa.replace(weight=w)))(fsa.weight)
    out["log"] = [float(total), logsumexp(path_weight), float(grad.sum()), frames]
    best = sj.tot_score(fsa, sj.TROPICAL)
    out["tropical"] = [float(best), float(path_weight.max())]
    lengths = np.array([frames])
    dense, dense_grad = jax.value_and_grad(
        lambda x: sj.dense_tot_score(fsa, x, lengths).sum())(emissions)
    out["dense"] = [float(dense), logsumexp(path_dense), float(dense_grad.sum()), frames]
    decoded, score = sj.viterbi_decode(fsa, emissions, lengths)
    out["viterbi"] = [float(score[0]), float(path_dense.max())]
    # VmHWM: this process's own peak (ru_maxrss would also count the
    # parent's pages at fork time, which Linux carries across exec).
    with open("/proc/self/status") as status:
        peak = next(line for line in status if line.startswith("VmHWM:"))
    out["peak_mb"] = int(peak.split()[1]) / 1024
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("case", ["star", "lexicon"])
def test_decoding_graph_shapes_run_in_bounded_memory(case):
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT, case],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["peak_mb"] < 2048, out
    for name in ("log", "dense"):
        total, expected, grad_sum, frames = out[name]
        assert total == pytest.approx(expected, abs=1e-3), (name, out)
        # Posteriors sum to the arcs on a path (LOG), or one per frame.
        assert grad_sum == pytest.approx(frames, abs=1e-3), (name, out)
    for name in ("tropical", "viterbi"):
        best, expected = out[name]
        assert best == pytest.approx(expected, abs=1e-4), (name, out)
