"""Quick start: build an FSA from text, score it, differentiate it.

Run: python examples/quickstart.py
"""

import jax
import numpy as np

import semiring_jax as sj

# OpenFst's AT&T text for an acceptor: `src dst label cost`, then final
# states `state cost`. Costs are negated on reading: semiring_jax works with
# scores (log domain, higher is better).
TEXT = """\
0 1 1 0.5
0 1 2 1.5
0 2 3 2.0
1 3 4 0.25
2 3 5 0.0
1 2 6 1.0
3 0.1
"""


def show(values):
    return np.array2string(np.asarray(values), precision=4, suppress_small=True)


def main():
    fsa = sj.Fsa.from_openfst(TEXT)
    print(fsa)
    print("total score, LOG      :", round(float(sj.tot_score(fsa, sj.LOG)), 4))
    print("total score, TROPICAL :", round(float(sj.tot_score(fsa, sj.TROPICAL)), 4))
    print("forward scores (LOG)  :", show(sj.forward_scores(fsa)))
    print("backward scores (LOG) :", show(sj.backward_scores(fsa)))
    print("arc posteriors (LOG)  :", show(sj.arc_posteriors(fsa)))
    print("best-path arcs        :", show(sj.arc_posteriors(fsa, sj.TROPICAL)))

    path = sj.best_path(fsa)
    length = int(path.arc_mask.sum())
    print(
        "best path labels      :",
        path.label[:length].tolist(),
        "score",
        round(float(sj.tot_score(path, sj.TROPICAL)), 4),
    )

    # Weights are ordinary JAX inputs: differentiate any function of scores.
    def loss(weight):
        return -sj.tot_score(fsa.replace(weight=weight))

    grad = jax.jit(jax.grad(loss))(fsa.weight)
    print("d(-log Z)/d weight    :", show(grad))
    print("equals -posteriors    :", bool(np.allclose(grad, -sj.arc_posteriors(fsa))))

    batch = sj.stack([fsa, sj.linear_fsa([7, 8, 9])])
    print("batched total scores  :", show(sj.tot_score(batch)))


if __name__ == "__main__":
    main()
