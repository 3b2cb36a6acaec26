"""Writes examples/lattice_tour.ipynb (stored without outputs).

The notebook is kept as this script so that its cells are reviewed as code;
run `python examples/make_lattice_tour.py` after editing, then commit both.
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    (
        "md",
        """\
# A tour of lattices with semiring_jax

Build FSAs from text and from label sequences, draw them, score them in the
log and tropical semirings, put arc posteriors on the drawing, differentiate
a score with `jax.grad`, compose two transducers, and look at a CTC
alignment. Every cell runs on a CPU in a few seconds; pictures need
Graphviz's `dot` (without it an Fsa shows its Graphviz source instead).

To run it: `pip install -e '.[notebook]'` (Jupyter and matplotlib), then
`jupyter lab examples/lattice_tour.ipynb`. Graphviz comes from the system:
`apt-get install graphviz`, `brew install graphviz` or
`conda install -c conda-forge graphviz`.""",
    ),
    (
        "code",
        """\
import shutil
import subprocess

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import SVG, display

import semiring_jax as sj


def show(fsa, **options):
    \"\"\"Draws `fsa.to_dot(**options)`; a plain `fsa` in a cell draws itself too.\"\"\"
    source = fsa.to_dot(**options)
    if shutil.which("dot") is None:  # no Graphviz: show the source instead
        print(source)
        return
    svg = subprocess.run(["dot", "-Tsvg"], input=source, text=True, capture_output=True,
                         check=True).stdout
    display(SVG(svg))""",
    ),
    (
        "md",
        """\
## FSAs from text

OpenFst's AT&T text reads `src dst label cost` per arc and `state cost` per
final state. Costs are negated on reading: semiring_jax works with **scores**
(log domain, higher is better). A symbol table lets the text and the
drawings use words instead of integers.""",
    ),
    (
        "code",
        """\
words = sj.SymbolTable.from_text(\"\"\"\\
<eps> 0
the 1
a 2
cat 3
dog 4
sat 5
\"\"\")
text = \"\"\"\\
0 1 the 0.5
0 1 a 1.0
1 2 cat 0.2
1 2 dog 0.9
2 3 sat 0.0
3 0.0
\"\"\"
fsa = sj.Fsa.from_openfst(text, isymbols=words)
fsa""",
    ),
    (
        "code",
        """\
print(fsa.to_openfst(isymbols=words))
show(fsa, isymbols=words)""",
    ),
    (
        "md",
        """\
## FSAs from label sequences

`sj.linear_fsa` is the one-path acceptor of a sequence; `sj.ctc_graph` is the
CTC graph of a label sequence (blank = 0), and `sj.stack` pads FSAs of
different sizes into one batch.""",
    ),
    (
        "code",
        """\
sentence = sj.linear_fsa([words.find("a"), words.find("dog"), words.find("sat")])
show(sentence, isymbols=words)
ctc = sj.ctc_graph([3, 5])
ctc""",
    ),
    (
        "code",
        """\
batch = sj.stack([fsa, sentence])
batch, sj.tot_score(batch)""",
    ),
    (
        "md",
        """\
## Scores in two semirings

In the log semiring the total score is log Σ over paths of exp(path score);
in the tropical semiring it is the best path's score.""",
    ),
    (
        "code",
        """\
print("LOG total      :", float(sj.tot_score(fsa, sj.LOG)))
print("TROPICAL total :", float(sj.tot_score(fsa, sj.TROPICAL)))
print("forward scores :", sj.forward_scores(fsa))
print("backward scores:", sj.backward_scores(fsa))
best = sj.best_path(fsa)
show(best, isymbols=words)""",
    ),
    (
        "md",
        """\
## Posteriors on the drawing

`sj.arc_posteriors` is the probability that a path uses each arc; the
drawing shows it on the arcs, as colour and as width.""",
    ),
    (
        "code",
        """\
posteriors = sj.arc_posteriors(fsa)
print(posteriors)
show(fsa, isymbols=words, arc_values=posteriors, value_name="p")""",
    ),
    (
        "md",
        """\
## Differentiating a score

Weights are ordinary JAX inputs. The gradient of the log-semiring total
score with respect to the arc weights is the arc posteriors; with respect to
a tropical score it is the 0/1 indicator of the best path.""",
    ),
    (
        "code",
        """\
def total(weight, semiring):
    return sj.tot_score(fsa.replace(weight=weight), semiring)

grad_log = jax.jit(jax.grad(total), static_argnums=1)(fsa.weight, sj.LOG)
grad_best = jax.jit(jax.grad(total), static_argnums=1)(fsa.weight, sj.TROPICAL)
print("d LOG / d weight      :", grad_log)
print("d TROPICAL / d weight :", grad_best)
assert np.allclose(grad_log, posteriors, atol=1e-6)""",
    ),
    (
        "md",
        """\
## Composition

A transducer that rewrites words, composed with the acceptor: the structure
is computed on the host, the weights stay JAX expressions (so the composed
scores differentiate back to both operands).""",
    ),
    (
        "code",
        """\
rewrite = sj.Fsa.from_openfst(\"\"\"\\
0 0 the the 0.0
0 0 a the 0.7
0 0 cat dog 1.2
0 0 cat cat 0.1
0 0 dog dog 0.0
0 0 sat sat 0.0
0 0.0
\"\"\", isymbols=words, osymbols=words)
composed = sj.compose(fsa, rewrite)
show(composed, isymbols=words, osymbols=words)
print("total score of the composition:", float(sj.tot_score(composed)))""",
    ),
    (
        "md",
        """\
## A CTC alignment picture

Per-frame log-probabilities [B, T, V] from a (here synthetic) model, the CTC
graph of the reference, and the posterior occupancy of each label per frame,
with the best alignment drawn on top. A misaligned model shows up as mass
away from the line, or a line that jumps late.""",
    ),
    (
        "code",
        """\
vocab = ["-", "c", "a", "t"]  # blank first
reference = [1, 2, 3]
T = 24
rng = np.random.default_rng(0)
# A model that has learnt roughly where each token is, with some blur.
centres = np.array([5.0, 11.0, 18.0])
frames = np.arange(T)[:, None]
token_logits = 3.0 * np.exp(-0.5 * ((frames - centres) / 1.5) ** 2)
logits = np.concatenate([np.full((T, 1), 1.0), token_logits], axis=1)
logits = logits + 0.3 * rng.standard_normal(logits.shape)
log_probs = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32))[None]  # [1, T, V]

graph = sj.ctc_graph(reference)
loss = sj.ctc_loss(log_probs, jnp.array([T]), jnp.array([reference]), jnp.array([3]))
print("CTC loss:", float(loss[0]))
occupancy = sj.dense_occupancy(graph, log_probs)[0]                    # [T, V]
best = sj.dense_occupancy(graph, log_probs, semiring=sj.TROPICAL)[0]   # 0/1, [T, V]
alignment = np.argmax(np.asarray(best), axis=-1)
print("best alignment:", "".join(vocab[v] for v in alignment))
ax = sj.plot_alignment(occupancy, alignment, labels=vocab, title="CTC occupancy")
plt.show()""",
    ),
    (
        "md",
        """\
The same picture over the states of the CTC graph (blank, c, blank, a,
blank, t, blank) shows which copy of the blank each frame sits in.""",
    ),
    (
        "code",
        """\
states = sj.dense_occupancy(graph, log_probs, over="states")[0]           # [T, S]
best_states = sj.dense_occupancy(graph, log_probs, semiring=sj.TROPICAL, over="states")[0]
state_names = ["-", "c", "-", "a", "-", "t", "-"]
ax = sj.plot_alignment(states, np.argmax(np.asarray(best_states), axis=-1),
                       labels=state_names, title="CTC occupancy by graph state")
plt.show()""",
    ),
]


def build() -> nbformat.NotebookNode:
    cells = [
        new_markdown_cell(text) if kind == "md" else new_code_cell(text) for kind, text in CELLS
    ]
    for index, cell in enumerate(cells):
        cell.id = f"cell-{index:02d}"  # fixed ids: rewriting the file changes nothing
    notebook = new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return notebook


if __name__ == "__main__":
    path = Path(__file__).with_name("lattice_tour.ipynb")
    nbformat.write(build(), path)
    print(f"wrote {path}")
