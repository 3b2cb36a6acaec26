"""Train a small 1-D convolutional network with LF-MMI (equinox + optax + sj.mmi_loss).

The task is synthetic so that it runs anywhere in well under a minute: a known
phone bigram over 5 phones generates phone sequences of 2-8 phones; each phone
lasts 1-4 frames, and each frame is a noisy feature vector, the mean of its
pdf plus Gaussian noise. The pdf of a frame follows Kaldi's chain topology
(`sj.hmm_topo(5, pdfs_per_phone=2)`): phone p's first frame is its forward
pdf 2 (p - 1), its later frames its self-loop pdf 2 (p - 1) + 1, and the two
pdfs of a phone have nearby means, so telling them apart takes the context
the convolutions see. The network reads the frames and gives per-frame
log-probabilities over the 10 pdfs; the loss is `sj.mmi_loss` with the
leaky HMM, the numerator graphs (`sj.numerator_graphs`) of each utterance's
phones and a denominator graph (`sj.denominator_graph`) of a phone bigram
estimated from the training phone sequences (`sj.ngram_fsa`). No frame is
ever labelled: the alignment is learnt from the phone sequences alone. The
loss falls, and the frame accuracy against the generating alignment rises
from chance to about 94 % by argmax per frame and 99 % by Viterbi decoding
of the denominator graph (`sj.viterbi_decode`).

The network ends in a log-softmax. The loss does not need it (adding a
constant to every pdf of a frame adds it to the numerator and to the
denominator alike), and Kaldi's chain models emit raw outputs kept in range
by an l2 penalty; the log-softmax does that job here, and makes the
outputs log-probabilities. The numerator graphs carry no LM weights, so
the loss is Kaldi's plus the LM's ln P of the utterance's phones (at most
0, and a constant per utterance: the gradients are the same); it is below
0 here from the start and falls to about -0.72 per frame.

Run:
  python examples/mmi_training.py [--steps 400] [--batch-size 32] [--seed 0]

(about 35 s on 2 CPU cores, most of it compilation; the training steps
take about 3 s)

Exits with status 1 unless the loss fell and the frame accuracy rose.
Needs equinox and optax (`pip install semiring_jax[examples]`).
"""

import argparse
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import semiring_jax as sj

NUM_PHONES = 5  # phones 1..5
NUM_PDFS = 2 * NUM_PHONES  # a forward and a self-loop pdf per phone
NUM_FEATURES = 16
MIN_PHONES, MAX_PHONES = 2, 8
MAX_DURATION = 4  # frames per phone: 1..4
MAX_FRAMES = MAX_PHONES * MAX_DURATION  # T
NUM_SEQUENCE_BATCHES = 16  # training phone sequences: 16 batches of --batch-size

# The generating bigram: row 0 is the sentence start, row p follows phone p;
# column 0 is the sentence end, column p phone p. Each row sums to 1.
BIGRAM = np.array(
    [
        [0.00, 0.40, 0.25, 0.15, 0.10, 0.10],
        [0.10, 0.05, 0.50, 0.20, 0.10, 0.05],
        [0.15, 0.10, 0.05, 0.50, 0.10, 0.10],
        [0.15, 0.10, 0.10, 0.05, 0.50, 0.10],
        [0.15, 0.40, 0.10, 0.10, 0.05, 0.20],
        [0.20, 0.30, 0.20, 0.10, 0.15, 0.05],
    ]
)


def forward_pdf(phone: int) -> int:
    """The pdf of a phone's first frame (`sj.hmm_topo`, two pdfs per phone)."""
    return 2 * (phone - 1)


def self_loop_pdf(phone: int) -> int:
    """The pdf of each later frame of the phone."""
    return 2 * (phone - 1) + 1


def sample_phones(rng: np.random.Generator) -> list[int]:
    """A phone sequence of MIN_PHONES..MAX_PHONES phones from the bigram."""
    while True:
        phones, previous = [], 0
        while len(phones) <= MAX_PHONES:
            previous = int(rng.choice(NUM_PHONES + 1, p=BIGRAM[previous]))
            if previous == 0:
                break
            phones.append(previous)
        if MIN_PHONES <= len(phones) <= MAX_PHONES:
            return phones


def pdf_means(seed: int) -> np.ndarray:
    """[NUM_PDFS, F]: a mean per phone, and a smaller offset per pdf, so that
    a phone's forward and self-loop pdfs sit close together."""
    rng = np.random.default_rng(seed + 1000)
    phone_means = rng.normal(0.0, 1.0, (NUM_PHONES, NUM_FEATURES))
    offsets = rng.normal(0.0, 0.3, (NUM_PDFS, NUM_FEATURES))
    return (np.repeat(phone_means, 2, axis=0) + offsets).astype(np.float32)


def synthetic_frames(
    rng: np.random.Generator, phone_sequences: list[list[int]], means: np.ndarray
) -> dict:
    """Fresh durations and noisy frames for the given phone sequences.

    Returns:
      frames float32 [B, T, F] (zero past the length), lengths int32 [B],
      alignment int32 [B, T] (the generating pdf per frame, -1 past the
      length).
    """
    batch_size = len(phone_sequences)
    frames = np.zeros((batch_size, MAX_FRAMES, NUM_FEATURES), np.float32)
    alignment = np.full((batch_size, MAX_FRAMES), -1, np.int32)
    lengths = np.zeros(batch_size, np.int32)
    for b, phones in enumerate(phone_sequences):
        pdfs = []
        for phone in phones:
            duration = int(rng.integers(1, MAX_DURATION + 1))
            pdfs += [forward_pdf(phone)] + [self_loop_pdf(phone)] * (duration - 1)
        t = len(pdfs)
        alignment[b, :t] = pdfs
        frames[b, :t] = means[pdfs] + rng.normal(0.0, 0.5, (t, NUM_FEATURES))
        lengths[b] = t
    return dict(frames=frames, lengths=lengths, alignment=alignment)


class ConvNet(eqx.Module):
    """Frames [T, F] -> log-probabilities [T, NUM_PDFS] (one sequence; vmap for
    a batch): two 1-D convolutions of width 5, so each output sees 9 frames."""

    conv1: eqx.nn.Conv1d
    conv2: eqx.nn.Conv1d
    head: eqx.nn.Linear

    def __init__(self, hidden_size: int, key: jax.Array):
        keys = jax.random.split(key, 3)
        self.conv1 = eqx.nn.Conv1d(NUM_FEATURES, hidden_size, 5, padding=2, key=keys[0])
        self.conv2 = eqx.nn.Conv1d(hidden_size, hidden_size, 5, padding=2, key=keys[1])
        self.head = eqx.nn.Linear(hidden_size, NUM_PDFS, key=keys[2])

    def __call__(self, frames: jax.Array) -> jax.Array:
        hidden = jax.nn.relu(self.conv1(frames.T))  # channels first: [H, T]
        hidden = jax.nn.relu(self.conv2(hidden))
        return jax.nn.log_softmax(jax.vmap(self.head)(hidden.T), axis=-1)  # [T, V]


@eqx.filter_jit
def predict(model: ConvNet, frames: jax.Array) -> jax.Array:
    return jax.vmap(model)(frames)  # [B, T, V]


def batch_loss(
    model: ConvNet, num_graphs: sj.Fsa, den_graph: sj.Fsa, frames: jax.Array, lengths: jax.Array
) -> jax.Array:
    log_probs = predict(model, frames)
    losses = sj.mmi_loss(num_graphs, den_graph, log_probs, lengths, leaky_hmm=1e-5)
    # Per frame, as Kaldi reports its objective.
    return jnp.sum(losses) / jnp.sum(lengths)


def phones_of(pdfs: np.ndarray) -> list[int]:
    """The phone sequence of a pdf alignment: a forward pdf starts a phone."""
    return [int(pdf) // 2 + 1 for pdf in pdfs if pdf % 2 == 0]


def evaluate(model: ConvNet, den_graph: sj.Fsa, means: np.ndarray, seed: int) -> dict:
    """Frame accuracies (argmax, Viterbi) on 200 fresh utterances, and the
    share whose Viterbi phone sequence is exactly right."""
    rng = np.random.default_rng(seed + 1)
    targets = [sample_phones(rng) for _ in range(200)]
    test = synthetic_frames(rng, targets, means)
    log_probs = predict(model, jnp.asarray(test["frames"]))
    viterbi, _ = sj.viterbi_decode(den_graph, log_probs, jnp.asarray(test["lengths"]))
    real = test["alignment"] >= 0
    argmax = np.argmax(np.asarray(log_probs), axis=-1)
    viterbi = np.asarray(viterbi)
    decodes = [phones_of(row[:length]) for row, length in zip(viterbi, test["lengths"])]
    result = dict(
        frame_accuracy=float(np.mean(argmax[real] == test["alignment"][real])),
        viterbi_accuracy=float(np.mean(viterbi[real] == test["alignment"][real])),
        exact=float(np.mean([decode == target for decode, target in zip(decodes, targets)])),
    )
    print(
        f"  frame accuracy on 200 fresh utterances: argmax {result['frame_accuracy']:.1%}, "
        f"Viterbi {result['viterbi_accuracy']:.1%}; phone sequences exact {result['exact']:.0%}"
    )
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()

    rng = np.random.default_rng(args.seed)
    means = pdf_means(args.seed)
    topo = sj.hmm_topo(NUM_PHONES, pdfs_per_phone=2)
    # The training phone sequences, in fixed batches. A numerator graph
    # depends on the phones only (not on the durations), so each batch's
    # graphs are built once, here; `bucket=True` rounds their sizes up so
    # that the training step compiles for a few shapes only.
    sequence_batches = [
        [sample_phones(rng) for _ in range(args.batch_size)] for _ in range(NUM_SEQUENCE_BATCHES)
    ]
    num_graphs = [
        sj.numerator_graphs(phones, None, topo, bucket=True) for phones in sequence_batches
    ]
    # The phone LM is estimated from the training sequences, as Kaldi does.
    lm = sj.ngram_fsa([s for batch in sequence_batches for s in batch], NUM_PHONES, order=2)
    den_graph = sj.denominator_graph(lm, topo)
    print(
        f"denominator graph: {den_graph.num_states} states, {den_graph.num_arcs} arcs; "
        f"{len(num_graphs)} x {args.batch_size} numerator graphs "
        f"({time.perf_counter() - start:.1f} s to build)"
    )

    model = ConvNet(hidden_size=64, key=jax.random.key(args.seed))
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(3e-3))
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def train_step(model, opt_state, num_graphs, frames, lengths):
        loss, grads = eqx.filter_value_and_grad(batch_loss)(
            model, num_graphs, den_graph, frames, lengths
        )
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    print("before training:")
    before = evaluate(model, den_graph, means, args.seed)
    losses, log_every = [], max(1, args.steps // 10)
    for step in range(1, args.steps + 1):
        index = (step - 1) % len(sequence_batches)
        # Fresh durations and noise for the batch's phone sequences.
        batch = synthetic_frames(rng, sequence_batches[index], means)
        model, opt_state, loss = train_step(
            model,
            opt_state,
            num_graphs[index],
            jnp.asarray(batch["frames"]),
            jnp.asarray(batch["lengths"]),
        )
        losses.append(float(loss))
        if step == 1 or step % log_every == 0:
            print(f"step {step:4d}  loss per frame {np.mean(losses[-log_every:]):.3f}")

    print(f"after {args.steps} steps:")
    after = evaluate(model, den_graph, means, args.seed)

    # The first step's loss is one noisy batch; average a few at each end.
    first_loss, last_loss = float(np.mean(losses[:5])), float(np.mean(losses[-5:]))
    seconds = time.perf_counter() - start
    print(f"loss {first_loss:.3f} -> {last_loss:.3f} in {args.steps} steps, {seconds:.1f} s")
    print(
        f"frame accuracy {before['frame_accuracy']:.1%} -> {after['frame_accuracy']:.1%} "
        f"(Viterbi {before['viterbi_accuracy']:.1%} -> {after['viterbi_accuracy']:.1%})"
    )
    return dict(
        first_loss=first_loss,
        last_loss=last_loss,
        accuracy_before=before["frame_accuracy"],
        accuracy=after["frame_accuracy"],
        viterbi_accuracy=after["viterbi_accuracy"],
        seconds=seconds,
    )


if __name__ == "__main__":
    result = main()
    learned = (
        result["last_loss"] < result["first_loss"] - 0.1
        and result["accuracy"] > result["accuracy_before"] + 0.2
    )
    sys.exit(0 if learned else 1)
