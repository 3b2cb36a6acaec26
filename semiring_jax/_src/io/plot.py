"""`plot_alignment`: a frame-by-frame occupancy picture (matplotlib, optional).

matplotlib is imported inside the function, so the library itself never
needs it; `pip install 'semiring_jax[plot]'` brings it in.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from semiring_jax._src.core import checks
from semiring_jax._src.io.host.dot import symbol_lookup

__all__ = ["plot_alignment"]


def _import_pyplot() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(
            "plot_alignment needs matplotlib: pip install 'semiring_jax[plot]'"
        ) from error
    return plt


def _tick_labels(labels: Any, count: int) -> list[str]:
    """A name for each of `count` rows; a ValueError names a row without one."""
    lookup = symbol_lookup(labels, "labels", "plot_alignment")
    names = []
    for row in range(count):
        name = lookup(row)
        if name is None:
            raise ValueError(
                f"plot_alignment: labels has no name for row {row} of the occupancy's {count} rows"
            )
        names.append(name)
    return names


def plot_alignment(
    occupancy: Any,
    alignment: Any | None = None,
    *,
    ax: Any = None,
    labels: Any = None,
    title: str = "",
    length: int | None = None,
    colorbar: bool = True,
) -> Any:
    """Draws an occupancy [T, V] or [T, S] as an image, best alignment on top.

    x is the frame, y the label (or state), colour the probability on a
    fixed 0..1 scale (so pictures compare); `alignment` is drawn as a line
    with a marker per frame. The typical CTC picture, for one utterance `b`:
    `sj.dense_occupancy(graph, log_probs)[b]` (posteriors, [T, V]) with the
    best path from `sj.viterbi_decode(graph, log_probs)[0][b]` (or
    `sj.forced_align`), or, per graph state, `over="states"` with the argmax
    of the TROPICAL occupancy (a 0/1 indicator of the best path).

    Args:
      occupancy: float [T, C] (numpy or concrete jax), unbatched: index a
        batched [B, T, C] result first.
      alignment: int [T], the row (label or state) of each frame; frames
        with -1 (past the length, or no path) are skipped. None: no line.
      ax: a matplotlib Axes to draw on; by default a new figure's.
      labels: names of the rows for the y ticks: a sequence of str, a
        `Mapping[int, str]` or a symbol table with `find(int) -> str`.
      title: the Axes title.
      length: draw only the first `length` frames (an utterance's length).
      colorbar: add a colour bar next to the Axes.
    Returns:
      The matplotlib Axes drawn on.
    Raises:
      ImportError: when matplotlib is not installed.
      ValueError: for an occupancy not of rank 2, an alignment not of shape
        [T] or with a row outside [-1, C), a length outside [0, T], or labels
        lacking a row's name.
    Examples:
      >>> import matplotlib
      >>> matplotlib.use("Agg")  # no display needed
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> log_probs = jnp.log(jnp.array([[[0.6, 0.3, 0.1], [0.2, 0.7, 0.1],
      ...                                 [0.5, 0.1, 0.4], [0.1, 0.1, 0.8]]], jnp.float32))
      >>> graph = sj.ctc_graph([1, 2])
      >>> occupancy = sj.dense_occupancy(graph, log_probs)  # [B, T, V]
      >>> frame_labels, _ = sj.viterbi_decode(graph, log_probs)
      >>> print(frame_labels[0])
      [0 1 0 2]
      >>> ax = sj.plot_alignment(occupancy[0], frame_labels[0], labels=["_", "a", "b"])
      >>> [tick.get_text() for tick in ax.get_yticklabels()]
      ['_', 'a', 'b']
    """
    plt = _import_pyplot()
    image = np.asarray(checks.concrete(occupancy, "occupancy", "plot_alignment"))
    if image.ndim != 2:
        raise ValueError(
            f"plot_alignment: occupancy must have rank 2, [T, V] or [T, S], got "
            f"shape {image.shape}; index a batched [B, T, ...] result first"
        )
    num_frames, num_rows = image.shape
    if length is None:
        length = num_frames
    if not 0 <= length <= num_frames:
        raise ValueError(f"plot_alignment: length = {length} is outside [0, T] = [0, {num_frames}]")
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.0, 0.25 * length + 2), max(2.5, 0.3 * num_rows + 1)))
    drawn = ax.imshow(
        image[:length].T,
        origin="lower",
        aspect="auto",
        interpolation="nearest",
        cmap="Blues",
        vmin=0.0,
        vmax=1.0,
        extent=_extent(length, num_rows),
    )
    if alignment is not None:
        frames, rows = _alignment_points(alignment, num_frames, num_rows, length)
        ax.plot(
            frames,
            rows,
            "-o",
            color="tab:orange",
            markersize=4,
            linewidth=1.5,
            label="best alignment",
        )
    if labels is not None:
        ax.set_yticks(np.arange(num_rows), _tick_labels(labels, num_rows))
    ax.set_xlabel("frame")
    ax.set_ylabel("label / state")
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(drawn, ax=ax, label="probability")
    return ax


def _extent(num_frames: int, num_rows: int) -> tuple[float, float, float, float]:
    # Pixel centres on whole numbers, so the overlay's (frame, row) points
    # sit in the middle of their cells.
    return (-0.5, num_frames - 0.5, -0.5, num_rows - 0.5)


def _alignment_points(
    alignment: Any, num_frames: int, num_rows: int, length: int
) -> tuple[np.ndarray, np.ndarray]:
    """(frames, rows) of the alignment's drawn points: within `length`,
    skipping -1."""
    rows = np.asarray(checks.concrete(alignment, "alignment", "plot_alignment"))
    if rows.shape != (num_frames,):
        raise ValueError(
            f"plot_alignment: alignment must have shape [T] = ({num_frames},), got {rows.shape}"
        )
    if not np.issubdtype(rows.dtype, np.integer):
        raise ValueError(f"plot_alignment: alignment must hold integers, got {rows.dtype}")
    bad = np.flatnonzero((rows < -1) | (rows >= num_rows))
    if bad.size:
        t = int(bad[0])
        raise ValueError(
            f"plot_alignment: alignment[{t}] = {rows[t]} is outside [-1, C) = [-1, {num_rows})"
        )
    frames = np.flatnonzero(rows[:length] >= 0)
    return frames, rows[frames]
