"""Train a small bidirectional GRU with CTC (equinox + optax + sj.ctc_loss).

The task is synthetic so that it runs anywhere in under a minute: each target is
3-6 labels from {1..8} (0 is the CTC blank), and its input frames hold each
label for 2-4 frames as a noisy one-hot feature, with noise-only frames between
labels and zero padding after the input length. The model reads the frames and
emits per-frame log-probabilities over the 9 classes; the loss is `sj.ctc_loss`
inside one `jax.jit`-ed training step. The loss falls and greedy decodes match
their targets by the end.

Run:
  python examples/ctc_training.py [--steps 600] [--batch-size 32] [--seed 0]

With `--shard` the same step runs with the batch split over all devices
(`NamedSharding(Mesh(jax.devices(), ("batch",)), PartitionSpec("batch"))`) and
the parameters replicated; jit propagates the shardings through the model and
the loss. On a CPU-only machine ask XLA for several host devices first:
  XLA_FLAGS=--xla_force_host_platform_device_count=4 \
      python examples/ctc_training.py --shard
(the script sets that flag itself when run with `--shard` and no flag is set).
The batch size must be a multiple of the device count.

Exits with status 1 unless the final loss is clearly below the first.
Needs equinox and optax (`pip install semiring_jax[examples]`).
"""

import os
import sys

# XLA reads its flags when jax is first imported, so this must come before.
if (
    __name__ == "__main__"
    and "--shard" in sys.argv
    and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", "")
):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    ).strip()

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import semiring_jax as sj

NUM_LABELS = 8  # real labels 1..8; class 0 is the blank
NUM_CLASSES = NUM_LABELS + 1
NUM_FEATURES = 12  # one channel per label, plus 4 noise-only channels
MAX_LABELS = 6  # U: labels per target are 3..6
MAX_FRAMES = 40  # T: 6 labels x 4 frames + 7 gaps x 2 frames = 38 at most
BLANK = 0


def synthetic_batch(rng: np.random.Generator, batch_size: int) -> dict:
    """Random targets and their noisy frames, as numpy arrays.

    Returns:
      frames float32 [B, T, F], input_lengths int32 [B], labels int32 [B, U]
      (0-padded), label_lengths int32 [B].
    """
    frames = np.zeros((batch_size, MAX_FRAMES, NUM_FEATURES), np.float32)
    labels = np.zeros((batch_size, MAX_LABELS), np.int32)
    label_lengths = rng.integers(3, MAX_LABELS + 1, batch_size).astype(np.int32)
    input_lengths = np.zeros(batch_size, np.int32)
    for b in range(batch_size):
        t = rng.integers(0, 3)  # leading noise frames
        previous = -1
        for u in range(label_lengths[b]):
            label = rng.integers(1, NUM_LABELS + 1)
            # A repeated label needs a gap, or CTC would read it as one label.
            t += rng.integers(1 if label == previous else 0, 3)
            duration = rng.integers(2, 5)
            frames[b, t : t + duration, label - 1] = rng.uniform(1.0, 1.5)
            labels[b, u], previous = label, label
            t += duration
        t += rng.integers(0, 3)  # trailing noise frames
        frames[b, :t] += rng.normal(0.0, 0.3, (t, NUM_FEATURES)).astype(np.float32)
        input_lengths[b] = t
    return dict(
        frames=frames, input_lengths=input_lengths, labels=labels, label_lengths=label_lengths
    )


class BiGRU(eqx.Module):
    """Frames [T, F] -> log-probabilities [T, V] (one sequence; vmap for a batch)."""

    forward_cell: eqx.nn.GRUCell
    backward_cell: eqx.nn.GRUCell
    head: eqx.nn.Linear

    def __init__(self, hidden_size: int, key: jax.Array):
        forward_key, backward_key, head_key = jax.random.split(key, 3)
        self.forward_cell = eqx.nn.GRUCell(
            NUM_FEATURES, hidden_size, key=forward_key, dtype=jnp.float32
        )
        self.backward_cell = eqx.nn.GRUCell(
            NUM_FEATURES, hidden_size, key=backward_key, dtype=jnp.float32
        )
        self.head = eqx.nn.Linear(2 * hidden_size, NUM_CLASSES, key=head_key, dtype=jnp.float32)

    def __call__(self, frames: jax.Array, length: jax.Array) -> jax.Array:
        hidden = jnp.zeros(self.forward_cell.hidden_size, jnp.float32)
        is_real = jnp.arange(frames.shape[0], dtype=length.dtype) < length  # [T]

        def forward_step(state, frame):
            state = self.forward_cell(frame, state)
            return state, state

        def backward_step(state, inputs):
            frame, real = inputs
            # Held at zero over the padding, so the backward pass starts at
            # the last real frame as if the padding weren't there.
            state = jnp.where(real, self.backward_cell(frame, state), hidden)
            return state, state

        _, forward_states = jax.lax.scan(forward_step, hidden, frames)
        _, backward_states = jax.lax.scan(backward_step, hidden, (frames, is_real), reverse=True)
        states = jnp.concatenate([forward_states, backward_states], axis=-1)  # [T, 2H]
        return jax.nn.log_softmax(jax.vmap(self.head)(states), axis=-1)


@eqx.filter_jit
def predict(model: BiGRU, frames: jax.Array, input_lengths: jax.Array) -> jax.Array:
    return jax.vmap(model)(frames, input_lengths)  # [B, T, V]


def batch_loss(model: BiGRU, batch: dict) -> jax.Array:
    log_probs = predict(model, batch["frames"], batch["input_lengths"])
    losses = sj.ctc_loss(
        log_probs, batch["input_lengths"], batch["labels"], batch["label_lengths"], blank=BLANK
    )
    # Per label, so that long and short targets weigh alike.
    return jnp.mean(losses / batch["label_lengths"].astype(losses.dtype))


def greedy_decode(log_probs: np.ndarray, length: int) -> list[int]:
    """Best class per frame, repeats collapsed, blanks dropped."""
    best = np.argmax(log_probs[:length], axis=-1)
    keep = np.diff(best, prepend=-1) != 0
    return [int(label) for label in best[keep] if label != BLANK]


def evaluate(model: BiGRU, seed: int, num_shown: int = 4) -> float:
    """Prints a few greedy decodes; returns exact-match accuracy on 200 fresh sequences."""
    test = synthetic_batch(np.random.default_rng(seed + 1), 200)
    log_probs = np.asarray(predict(model, test["frames"], test["input_lengths"]))
    decodes = [
        greedy_decode(scores, length) for scores, length in zip(log_probs, test["input_lengths"])
    ]
    targets = [
        labels[:length].tolist() for labels, length in zip(test["labels"], test["label_lengths"])
    ]
    accuracy = float(np.mean([decode == target for decode, target in zip(decodes, targets)]))
    for target, decode in zip(targets[:num_shown], decodes[:num_shown]):
        print(f"  target {target!s:20s} greedy decode {decode}")
    print(f"  exact matches on 200 fresh sequences: {accuracy:.0%}")
    return accuracy


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard", action="store_true", help="split the batch over all devices")
    args = parser.parse_args(argv)
    start = time.perf_counter()

    rng = np.random.default_rng(args.seed)
    model = BiGRU(hidden_size=64, key=jax.random.key(args.seed))
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(3e-3))
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))

    batch_sharding = None  # without --shard, everything stays on the default device
    if args.shard:
        mesh = Mesh(jax.devices(), ("batch",))
        if args.batch_size % mesh.size:
            raise ValueError(
                f"--batch-size {args.batch_size} is not a multiple of the {mesh.size} devices"
            )
        print(f"sharding the batch over {mesh.size} devices")
        batch_sharding = NamedSharding(mesh, PartitionSpec("batch"))
        # Parameters are replicated; jit then splits the step by batch and
        # all-reduces the gradients.
        model, opt_state = jax.device_put((model, opt_state), NamedSharding(mesh, PartitionSpec()))

    @eqx.filter_jit
    def train_step(model, opt_state, batch):
        loss, grads = eqx.filter_value_and_grad(batch_loss)(model, batch)
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    print("before training:")
    evaluate(model, args.seed)
    losses, log_every = [], max(1, args.steps // 10)
    for step in range(1, args.steps + 1):
        batch = synthetic_batch(rng, args.batch_size)
        if batch_sharding is not None:
            batch = jax.device_put(batch, batch_sharding)
        model, opt_state, loss = train_step(model, opt_state, batch)
        losses.append(float(loss))
        if step == 1 or step % log_every == 0:
            print(f"step {step:4d}  loss per label {np.mean(losses[-log_every:]):.3f}")

    print(f"after {args.steps} steps:")
    accuracy = evaluate(model, args.seed)

    # The first step's loss is one noisy batch; average a few at each end.
    first_loss, last_loss = float(np.mean(losses[:5])), float(np.mean(losses[-5:]))
    seconds = time.perf_counter() - start
    print(f"loss {first_loss:.3f} -> {last_loss:.3f} in {args.steps} steps, {seconds:.1f} s")
    return dict(first_loss=first_loss, last_loss=last_loss, accuracy=accuracy, seconds=seconds)


if __name__ == "__main__":
    result = main()
    # "Clearly below": a run that learned nothing would stay near the first loss.
    sys.exit(0 if result["last_loss"] < 0.7 * result["first_loss"] else 1)
