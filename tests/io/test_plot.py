"""plot_alignment: the image, the overlay, the ticks, and the missing-matplotlib error."""

import builtins

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import pytest

import semiring_jax as sj

T, V = 6, 4
RNG = np.random.default_rng(0)
OCCUPANCY = RNG.dirichlet(np.ones(V), size=T)  # [T, V], rows sum to 1


@pytest.fixture(autouse=True)
def agg_backend():
    plt.switch_backend("Agg")  # no display needed
    yield
    plt.close("all")


def test_image_is_the_occupancy_as_drawn():
    ax = sj.plot_alignment(jnp.asarray(OCCUPANCY, jnp.float32), title="demo")
    (image,) = ax.get_images()
    np.testing.assert_allclose(image.get_array(), OCCUPANCY.T, rtol=1e-6)  # y = label
    assert image.get_extent() == [-0.5, T - 0.5, -0.5, V - 0.5]
    assert image.get_clim() == (0.0, 1.0)
    assert ax.get_title() == "demo" and ax.get_xlabel() == "frame"
    assert not ax.get_lines()
    assert len(ax.figure.axes) == 2  # and the colour bar


def test_alignment_overlay_skips_minus_one_and_frames_past_length():
    alignment = np.array([0, 1, -1, 3, 2, 2])
    ax = sj.plot_alignment(OCCUPANCY, alignment, length=5, colorbar=False)
    (line,) = ax.get_lines()
    np.testing.assert_array_equal(line.get_xydata(), [[0, 0], [1, 1], [3, 3], [4, 2]])
    (image,) = ax.get_images()
    np.testing.assert_allclose(image.get_array(), OCCUPANCY[:5].T)
    assert len(ax.figure.axes) == 1


class FindTable:
    def __init__(self, symbols):
        self.symbols = symbols

    def find(self, key):
        return self.symbols[key]


@pytest.mark.parametrize(
    "labels",
    [["_", "a", "b", "c"], FindTable("_abc"), {0: "_", 1: "a", 2: "b", 3: "c"}],
    ids=["sequence", "find", "mapping"],
)
def test_labels_name_the_rows(labels):
    ax = sj.plot_alignment(OCCUPANCY, labels=labels, colorbar=False)
    assert [tick.get_text() for tick in ax.get_yticklabels()] == ["_", "a", "b", "c"]
    np.testing.assert_array_equal(ax.get_yticks(), np.arange(V))


def test_draws_on_an_existing_axes():
    figure, (left, right) = plt.subplots(1, 2)
    ax = sj.plot_alignment(OCCUPANCY, np.argmax(OCCUPANCY, axis=1), ax=right)
    assert ax is right
    assert right.get_images() and not left.get_images()
    assert ax.figure is figure


def test_ctc_occupancy_and_best_path():
    # The docstring's example (same shapes, so one compile serves both).
    log_probs = jnp.log(jnp.asarray(OCCUPANCY[None, :4, :3], jnp.float32))  # [1, 4, 3]
    graph = sj.ctc_graph([1, 2])
    occupancy = sj.dense_occupancy(graph, log_probs)[0]
    frame_labels, _ = sj.viterbi_decode(graph, log_probs)
    ax = sj.plot_alignment(occupancy, frame_labels[0], labels=list("_ab"))
    (line,) = ax.get_lines()
    np.testing.assert_array_equal(line.get_ydata(), frame_labels[0])
    np.testing.assert_array_equal(line.get_xdata(), np.arange(4))
    np.testing.assert_allclose(ax.get_images()[0].get_array(), np.asarray(occupancy).T)


def test_bad_arguments_name_the_culprit():
    with pytest.raises(ValueError, match=r"occupancy must have rank 2.*got shape \(1, 6, 4\)"):
        sj.plot_alignment(OCCUPANCY[None])
    with pytest.raises(ValueError, match=r"alignment must have shape \[T\] = \(6,\)"):
        sj.plot_alignment(OCCUPANCY, np.zeros(5, int))
    with pytest.raises(ValueError, match=r"alignment\[2\] = 4 is outside \[-1, C\)"):
        sj.plot_alignment(OCCUPANCY, np.array([0, 1, 4, 0, 0, 0]))
    with pytest.raises(ValueError, match="alignment must hold integers"):
        sj.plot_alignment(OCCUPANCY, np.zeros(T))
    with pytest.raises(ValueError, match=r"length = 7 is outside \[0, T\] = \[0, 6\]"):
        sj.plot_alignment(OCCUPANCY, length=7)
    with pytest.raises(ValueError, match="labels has no name for row 3"):
        sj.plot_alignment(OCCUPANCY, labels=["_", "a", "b"])


def test_missing_matplotlib_says_how_to_install(monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ImportError, match=r"pip install 'semiring_jax\[plot\]'"):
        sj.plot_alignment(OCCUPANCY)
