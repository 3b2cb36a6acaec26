"""The one source of random FSAs for the tests (hypothesis strategies).

An FSA is drawn as plain data, `(num_states, arcs, final)` with arcs as
`(src, dst, ilabel, olabel, weight)` tuples, so the same draw feeds the
library and the oracles. The draws cover parallel arcs, tied weights,
epsilon (0) labels, unreachable and dead states, several or no final
states, a single state, -inf weights, and state numberings that are not
topological (the start state may even have incoming arcs).
"""

import math

from hypothesis import strategies as st

# Small integers make ties common; -inf is an arc or final weight of zero.
WEIGHTS = st.one_of(
    st.integers(-2, 2).map(float),
    st.floats(-3.0, 3.0, allow_nan=False, width=32),
    st.just(-math.inf),
)


@st.composite
def acyclic_fsas(draw, max_states=6, max_arcs=12, transducer=False, weights=WEIGHTS):
    """An acyclic FSA as `(num_states, arcs, final)`; start state 0."""
    num_states = draw(st.integers(1, max_states))
    # A random topological order, so state numbers need not increase
    # along arcs and state 0 may sit anywhere in it.
    order = draw(st.permutations(range(num_states)))
    num_arcs = draw(st.integers(0, max_arcs if num_states > 1 else 0))
    arcs = []
    for _ in range(num_arcs):
        i = draw(st.integers(0, num_states - 2))
        j = draw(st.integers(i + 1, num_states - 1))
        ilabel = draw(st.integers(0, 3))
        olabel = draw(st.integers(0, 3)) if transducer else ilabel
        arcs.append((order[i], order[j], ilabel, olabel, draw(weights)))
    final_states = draw(st.sets(st.integers(0, num_states - 1), max_size=3))
    final = {s: draw(weights) for s in sorted(final_states)}
    return num_states, arcs, final


def as_rows(arcs, transducer=False):
    """Arc tuples in the form `Fsa.from_arcs` takes."""
    if transducer:
        return list(arcs)
    return [(s, d, i, w) for s, d, i, _, w in arcs]


def padded(fsa):
    """`fsa` (from `acyclic_fsas()` with default sizes) padded to one fixed
    shape: a single compile serves every draw, padding must not change any
    result, and K = 2 slots per position makes every state of degree > 2
    use a fan tree of helpers, so the trees are exercised too (the sizes
    fit every draw: at most 13 steps of 6 and 24 helpers)."""
    from semiring_jax._src.core.host.schedule_tables import ScheduleShape

    shape = ScheduleShape(steps=16, width=6, in_slots=2, out_slots=2, helpers=28)
    return pad_entry(fsa, 6, 12, shape)


def pad_entry(fsa, num_states, num_arcs, shape):
    """One unbatched Fsa padded to `num_states`, `num_arcs` and schedule
    `shape` (None: the padded structure's own), as `sj.stack` pads an entry:
    padding arcs masked off and padding states not final, both weighing
    -inf."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from semiring_jax._src.core.fsa import assemble
    from semiring_jax._src.core.host.build import ArcArrays

    def pad(values, size, fill):
        xp = jnp if isinstance(values, jax.Array) else np
        values = xp.asarray(values)
        return xp.concatenate([values, xp.full((size - values.shape[0],), fill, values.dtype)])

    structure = (np.asarray(field) for field in (fsa.src, fsa.dst, fsa.ilabel, fsa.olabel))
    arrays = ArcArrays(
        num_states,
        *(pad(field, num_arcs, 0) for field in structure),
        pad(fsa.weight, num_arcs, -np.inf),
        pad(fsa.final_weight, num_states, -np.inf),
        fsa.is_acceptor,
        pad(np.asarray(fsa.final_mask), num_states, False),
    )
    arc_mask = pad(np.asarray(fsa.arc_mask), num_arcs, False)
    real_sizes = (fsa.num_states, fsa.num_arcs)
    return assemble(arrays, arc_mask=arc_mask, shape=shape, real_sizes=real_sizes)


@st.composite
def dense_graphs(draw, max_states=4, max_arcs=8, num_columns=3, weights=WEIGHTS):
    """A graph for dense intersection as `(num_states, arcs, final)`: cycles
    and self-loops allowed (every arc consumes a frame), labels in
    [0, num_columns)."""
    num_states = draw(st.integers(1, max_states))
    arcs = []
    for _ in range(draw(st.integers(0, max_arcs))):
        src, dst = (draw(st.integers(0, num_states - 1)) for _ in range(2))
        label = draw(st.integers(0, num_columns - 1))
        arcs.append((src, dst, label, label, draw(weights)))
    final_states = draw(st.sets(st.integers(0, num_states - 1), max_size=3))
    final = {s: draw(weights) for s in sorted(final_states)}
    return num_states, arcs, final
