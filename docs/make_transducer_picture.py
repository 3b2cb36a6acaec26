"""Draws docs/assets/transducer-grid.png: a transducer grid's node occupancy
with the best alignment on top (`sj.rnnt_loss`'s gradient, `sj.rnnt_align`,
`sj.plot_alignment`).

Run (from the repository root):
    .venv/bin/python docs/make_transducer_picture.py
"""

import pathlib

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import semiring_jax as sj

PICTURE = pathlib.Path(__file__).resolve().parent / "assets" / "transducer-grid.png"


def main() -> None:
    rng = np.random.default_rng(3)
    num_frames, labels, vocab = 12, np.array([[3, 1, 4, 1]]), 6
    # A joiner that has learnt a little: each label likely in its third of
    # the frames, noise elsewhere.
    logits = rng.normal(scale=0.7, size=(1, num_frames, labels.shape[1] + 1, vocab))
    for u, label in enumerate(labels[0]):
        logits[0, 2 + 2 * u : 4 + 2 * u, u, label] += 2.5
    logits[0, :, :, 0] += 1.0  # the blank
    logits = logits.astype(np.float32)
    lengths = (np.array([num_frames]), labels, np.array([labels.shape[1]]))
    grad = np.asarray(jax.grad(lambda x: sj.rnnt_loss(x, *lengths).sum())(jnp.asarray(logits)))[0]
    softmax = np.asarray(jax.nn.softmax(logits, axis=-1))[0]
    # The gradient at the blank and the label column of node (t, u) sums to
    # -(occupancy) * (1 - their softmax mass): that gives each node's occupancy.
    label_at = np.append(labels[0], 0)
    columns = np.arange(labels.shape[1] + 1)
    g = grad[:, columns, 0] + np.where(columns < labels.shape[1], grad[:, columns, label_at], 0.0)
    s = softmax[:, columns, 0] + np.where(
        columns < labels.shape[1], softmax[:, columns, label_at], 0.0
    )
    occupancy = -g / (1.0 - s)  # [T, U+1]
    frames, _ = sj.rnnt_align(logits, *lengths)
    emitted = np.asarray(frames)[0]
    alignment = np.array([(emitted <= t).sum() for t in range(num_frames)])  # u leaving frame t
    figure, axes = plt.subplots(figsize=(6.0, 2.6), dpi=100)
    names = ["u=0"] + [f"after {label}" for label in labels[0]]
    sj.plot_alignment(
        occupancy, alignment, ax=axes, labels=names, title="transducer grid: occupancy, best path"
    )
    axes.set_ylabel("labels emitted")
    figure.tight_layout()
    PICTURE.parent.mkdir(exist_ok=True)
    figure.savefig(PICTURE)
    print(f"wrote {PICTURE.relative_to(PICTURE.parents[2])}")


if __name__ == "__main__":
    main()
