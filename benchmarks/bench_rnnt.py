"""Benchmark: the transducer loss, value + gradient, against fast_rnnt and warprnnt_numba.

Times the whole chain a training step runs,

    logits [B, T, U+1, V] -> (log-softmax inside) -> loss [B] -> sum -> gradient w.r.t. logits,

for each contestant in the same process, on the same seeded inputs:

  * ours: jax.jit(value_and_grad(sum(sj.rnnt_loss(logits, ...))));
  * floor: jax.jit(value_and_grad(sum(jax.nn.log_softmax(logits) * weights))),
    the log-softmax forward and backward over [B, T, U+1, V] alone (what any
    fused loss must at least read and write);
  * fast_rnnt: fast_rnnt.rnnt_loss(logits, symbols, 0, boundary,
    reduction="none").sum().backward() (k2's full loss; torch CPU, 2 threads),
    where installed;
  * warprnnt_numba: NeMo's CPU loss (numba loops, ~0.25 ms per grid node), on
    the smallest size only;
  * the pruned pipelines, ours and fast_rnnt's, from `am` [B, T, V] and
    `lm` [B, U+1, V]: the simple loss (value and gradient), the pruning
    ranges at s_range 5, the pruned joiner inputs, the joiner
    (am_pruned + lm_pruned) and the pruned loss; gradients of 0.5 simple +
    pruned with respect to am and lm.

at (B, T, U, V) = (4, 100, 20, 64), (8, 200, 50, 256), (8, 300, 80, 512).

Inputs (numpy default_rng([SEED, size index])): logits N(0, 1) float32;
frame lengths uniform in [ceil(0.8 T), T] with one of length T; label
lengths uniform in [ceil(U / 2), U] with one of length U; labels uniform in
[1, V) (blank 0). Before timing, each size checks that every peer's losses
agree with ours to 1e-4 relative (warprnnt_numba's too).

Timing: contestants interleaved round by round (`timing.interleaved_medians`),
median of >= 5 calls; ratios are peer time / our time (> 1: we are faster).
The full-grid contestants and the pruned pipelines are two such groups, one
after the other in the same run: beside the floor's 1.1 GB of buffers a
pipeline's calls ran ~1.7x slower, whoever's pipeline it was.
JAX compile time is the first call of a fresh jitted function minus the
median. Memory: XLA's own account of a compiled JAX function
(`compile().memory_analysis()`: temporaries plus outputs), for ours and the
floor; torch's allocations are not counted here.

Run:
    .venv/bin/python benchmarks/bench_rnnt.py           # about 4 minutes on 2 cores
    .venv/bin/python benchmarks/bench_rnnt.py --quick   # the smallest size only
    .venv/bin/python benchmarks/bench_rnnt.py --size 2  # the largest only
"""

from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from timing import Reps, first_call_seconds, interleaved_medians

import semiring_jax as sj

SEED = 20261201
SIZES = [(4, 100, 20, 64), (8, 200, 50, 256), (8, 300, 80, 512)]


def inputs(index: int, size: tuple[int, int, int, int]) -> dict[str, np.ndarray]:
    batch, num_frames, num_labels, vocab = size
    rng = np.random.default_rng([SEED, index])
    frame_lengths = rng.integers(math.ceil(0.8 * num_frames), num_frames + 1, batch)
    label_lengths = rng.integers(math.ceil(num_labels / 2), num_labels + 1, batch)
    frame_lengths[0], label_lengths[0] = num_frames, num_labels
    return dict(
        logits=rng.normal(size=(batch, num_frames, num_labels + 1, vocab)).astype(np.float32),
        labels=rng.integers(1, vocab, (batch, num_labels)),
        frame_lengths=frame_lengths,
        label_lengths=label_lengths,
    )


def ours(data: dict[str, np.ndarray]):
    args = tuple(jnp.asarray(data[k]) for k in ("frame_lengths", "labels", "label_lengths"))

    @jax.jit
    def step(logits):
        return jax.value_and_grad(lambda x: sj.rnnt_loss(x, *args).sum())(logits)

    return step, jnp.asarray(data["logits"])


def floor(data: dict[str, np.ndarray]):
    weights = jnp.asarray(np.random.default_rng(0).normal(size=data["logits"].shape[-1]))

    @jax.jit
    def step(logits):
        return jax.value_and_grad(lambda x: (jax.nn.log_softmax(x) * weights).sum())(logits)

    return step, jnp.asarray(data["logits"])


def fast_rnnt_call(data: dict[str, np.ndarray]):
    import fast_rnnt

    logits = torch.tensor(data["logits"])
    symbols = torch.tensor(data["labels"], dtype=torch.int64)
    boundary = torch.zeros((len(data["frame_lengths"]), 4), dtype=torch.int64)
    boundary[:, 2] = torch.tensor(data["label_lengths"])
    boundary[:, 3] = torch.tensor(data["frame_lengths"])

    def call():
        x = logits.detach().requires_grad_(True)
        loss = fast_rnnt.rnnt_loss(
            logits=x, symbols=symbols, termination_symbol=0, boundary=boundary, reduction="none"
        )
        loss.sum().backward()
        return loss.detach(), x.grad

    return call


def warprnnt_call(data: dict[str, np.ndarray]):
    from warprnnt_numba.rnnt_loss.rnnt_pytorch import rnnt_loss

    logits = torch.tensor(data["logits"])
    labels = torch.tensor(data["labels"], dtype=torch.int32)
    frames = torch.tensor(data["frame_lengths"], dtype=torch.int32)
    lengths = torch.tensor(data["label_lengths"], dtype=torch.int32)

    def call():
        x = logits.detach().requires_grad_(True)
        loss = rnnt_loss(x, labels, frames, lengths, blank=0, reduction="none")
        loss.sum().backward()
        return loss.detach(), x.grad

    return call


S_RANGE = 5


def am_lm(data: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The additive joiner's inputs of a size: N(0, 1), [B, T, V], [B, U+1, V]."""
    batch, num_frames, num_positions, vocab = data["logits"].shape
    rng = np.random.default_rng(1)
    am = rng.normal(size=(batch, num_frames, vocab)).astype(np.float32)
    lm = rng.normal(size=(batch, num_positions, vocab)).astype(np.float32)
    return am, lm


def ours_pruned(data: dict[str, np.ndarray]):
    lengths = tuple(jnp.asarray(data[k]) for k in ("frame_lengths", "labels", "label_lengths"))
    am, lm = (jnp.asarray(x) for x in am_lm(data))
    ranges_size = min(S_RANGE, lm.shape[1])

    @jax.jit
    def step(am, lm):
        def loss(am, lm):
            simple = sj.rnnt_loss_simple(am, lm, *lengths)
            ranges = sj.rnnt_prune_ranges(am, lm, *lengths, ranges_size)
            am_pruned, lm_pruned = sj.rnnt_prune(am, lm, ranges)
            pruned = sj.rnnt_loss_pruned(am_pruned + lm_pruned, *lengths, ranges)
            return (0.5 * simple + pruned).sum()

        return jax.value_and_grad(loss, argnums=(0, 1))(am, lm)

    return step, (am, lm)


def fast_rnnt_pruned_call(data: dict[str, np.ndarray]):
    import fast_rnnt

    am0, lm0 = (torch.tensor(x) for x in am_lm(data))
    symbols = torch.tensor(data["labels"], dtype=torch.int64)
    boundary = torch.zeros((len(data["frame_lengths"]), 4), dtype=torch.int64)
    boundary[:, 2] = torch.tensor(data["label_lengths"])
    boundary[:, 3] = torch.tensor(data["frame_lengths"])
    common = dict(symbols=symbols, termination_symbol=0, boundary=boundary, reduction="none")

    def call():
        am, lm = am0.detach().requires_grad_(True), lm0.detach().requires_grad_(True)
        simple, (px_grad, py_grad) = fast_rnnt.rnnt_loss_simple(
            lm=lm, am=am, return_grad=True, **common
        )
        ranges = fast_rnnt.get_rnnt_prune_ranges(
            px_grad=px_grad, py_grad=py_grad, boundary=boundary, s_range=S_RANGE
        )
        am_pruned, lm_pruned = fast_rnnt.do_rnnt_pruning(am=am, lm=lm, ranges=ranges)
        pruned = fast_rnnt.rnnt_loss_pruned(logits=am_pruned + lm_pruned, ranges=ranges, **common)
        (0.5 * simple + pruned).sum().backward()
        return pruned.detach(), am.grad

    return call


def xla_bytes(step, *arguments) -> int:
    analysis = step.lower(*arguments).compile().memory_analysis()
    return int(analysis.temp_size_in_bytes + analysis.output_size_in_bytes)


def measure(index: int, size: tuple[int, int, int, int], have_fast_rnnt: bool, reps: Reps):
    """(size, medians by contestant, our compile seconds, XLA bytes of
    ours, the floor and our pruned pipeline) of one size."""
    data = inputs(index, size)
    step, argument = ours(data)
    floor_step, floor_argument = floor(data)
    pruned_step, pruned_arguments = ours_pruned(data)
    full = {
        "ours": lambda: jax.block_until_ready(step(argument)),
        "floor": lambda: jax.block_until_ready(floor_step(floor_argument)),
    }
    pruned = {"ours pruned": lambda: jax.block_until_ready(pruned_step(*pruned_arguments))}
    first_call = first_call_seconds(full["ours"])
    first_call_seconds(full["floor"])
    first_call_seconds(pruned["ours pruned"])
    lengths = tuple(data[k] for k in ("frame_lengths", "labels", "label_lengths"))
    our_loss = np.asarray(sj.rnnt_loss(data["logits"], *lengths))
    if have_fast_rnnt:
        full["fast_rnnt"] = fast_rnnt_call(data)
        pruned["fast_rnnt pruned"] = fast_rnnt_pruned_call(data)
    if index == 0:
        full["warprnnt_numba"] = warprnnt_call(data)
    for name in ("fast_rnnt", "warprnnt_numba"):
        if name in full:
            their_loss = full[name]()[0].numpy()
            np.testing.assert_allclose(their_loss, our_loss, rtol=1e-4, err_msg=name)
    # Two groups, each interleaved: beside the floor's 1.1 GB of buffers,
    # freed between calls, a small pipeline's next call ran ~1.7x slower
    # (114 ms against 69 ms beside fast_rnnt's), whoever's it is.
    medians = interleaved_medians(full, reps) | interleaved_medians(pruned, reps)
    memory = (
        xla_bytes(step, argument),
        xla_bytes(floor_step, floor_argument),
        xla_bytes(pruned_step, *pruned_arguments),
    )
    return size, medians, first_call - medians["ours"], memory


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the smallest size only")
    parser.add_argument(
        "--size", type=int, choices=range(len(SIZES)), help="one size only, by its index"
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    try:
        import fast_rnnt  # noqa: F401

        have_fast_rnnt = True
    except ImportError:
        have_fast_rnnt = False
        print("fast_rnnt is not installed: its columns are skipped")
    reps = Reps(min_runs=5, max_runs=20, budget_s=20.0)
    indices = [0] if args.quick else range(len(SIZES)) if args.size is None else [args.size]
    rows = [measure(index, SIZES[index], have_fast_rnnt, reps) for index in indices]
    print(
        f"{'(B, T, U, V)':>20s} {'ours ms':>9s} {'floor ms':>9s} {'ours/floor':>11s} "
        f"{'fast_rnnt ms':>13s} {'fast_rnnt/ours':>15s} {'warprnnt ms':>12s} "
        f"{'compile s':>10s} {'ours MB':>8s} {'floor MB':>9s}"
    )
    for size, medians, compile_s, (our_bytes, floor_bytes, _) in rows:
        fast = medians.get("fast_rnnt")
        speedup = "-" if fast is None else f"{fast / medians['ours']:.2f}"
        print(
            f"{size!s:>20s} {_ms(medians['ours']):>9s} {_ms(medians['floor']):>9s} "
            f"{medians['ours'] / medians['floor']:11.2f} {_ms(fast):>13s} {speedup:>15s} "
            f"{_ms(medians.get('warprnnt_numba')):>12s} {compile_s:10.2f} "
            f"{our_bytes / 2**20:8.1f} {floor_bytes / 2**20:9.1f}"
        )
    print(
        f"\npruned pipelines (s_range {S_RANGE}; simple + ranges + pruning + joiner + pruned loss)"
    )
    print(
        f"{'(B, T, U, V)':>20s} {'ours ms':>9s} {'fast_rnnt ms':>13s} {'fast_rnnt/ours':>15s} "
        f"{'full/pruned':>12s} {'pruned MB':>10s} {'full MB':>8s}"
    )
    for size, medians, _, (our_bytes, _, pruned_bytes) in rows:
        fast = medians.get("fast_rnnt pruned")
        speedup = "-" if fast is None else f"{fast / medians['ours pruned']:.2f}"
        print(
            f"{size!s:>20s} {_ms(medians['ours pruned']):>9s} {_ms(fast):>13s} {speedup:>15s} "
            f"{medians['ours'] / medians['ours pruned']:12.2f} {pruned_bytes / 2**20:10.1f} "
            f"{our_bytes / 2**20:8.1f}"
        )


if __name__ == "__main__":
    main()
