"""sj.save / sj.load: exact round trips and located errors on bad files."""

import io
import math
import zipfile

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from tests.strategies import acyclic_fsas, as_rows, dense_graphs, padded


def build(data, transducer, dtype):
    num_states, arcs, final = data
    return sj.Fsa.from_arcs(as_rows(arcs, transducer), final, num_states=num_states, dtype=dtype)


def round_trip(fsa, **kwargs):
    buffer = io.BytesIO()
    sj.save(buffer, fsa, **kwargs)
    buffer.seek(0)
    return sj.load(buffer)


def assert_identical(back, fsa):
    """Every pytree leaf equal (dtype and shape included), statics equal."""
    leaves, treedef = jax.tree_util.tree_flatten(fsa)
    back_leaves, back_treedef = jax.tree_util.tree_flatten(back)
    assert back_treedef == treedef  # the static cycle and is_acceptor included
    assert back.cycle == fsa.cycle and back.is_acceptor == fsa.is_acceptor
    chex.assert_trees_all_equal(back, fsa)
    for ours, theirs in zip(leaves, back_leaves):
        assert np.asarray(theirs).dtype == np.asarray(ours).dtype
        assert np.shape(theirs) == np.shape(ours)


@settings(max_examples=25, deadline=None)
@given(
    data=st.lists(acyclic_fsas(transducer=True), min_size=1, max_size=3),
    transducer=st.booleans(),
    dtype=st.sampled_from(["float32", "float64"]),
    bucket=st.booleans(),
)
def test_round_trip_is_exact(data, transducer, dtype, bucket):
    fsas = [build(entry, transducer, dtype) for entry in data]
    if len({fsa.is_acceptor for fsa in fsas}) > 1:  # an arcless draw is an acceptor
        fsas = [fsa for fsa in fsas if fsa.is_acceptor == fsas[0].is_acceptor]
    for fsa in fsas:
        assert_identical(round_trip(fsa), fsa)
    batch = sj.stack(fsas, bucket=bucket)
    back = round_trip(batch)
    assert_identical(back, batch)
    for entry, original in zip(sj.unstack(back), fsas):
        assert_identical(entry, original)


@settings(max_examples=25, deadline=None)
@given(data=acyclic_fsas())
def test_padded_and_sliced_entries_round_trip(data):
    fsa = padded(build(data, False, "float32"))
    assert_identical(round_trip(fsa), fsa)
    batch = sj.stack([fsa, sj.linear_fsa([1, 2])])
    entry = jax.tree_util.tree_map(lambda leaf: leaf[0], batch)
    assert_identical(round_trip(entry), entry)


@settings(max_examples=25, deadline=None)
@given(graph=dense_graphs(), dtype=st.sampled_from(["float32", "float64"]))
def test_cyclic_fsas_round_trip(graph, dtype):
    fsa = build(graph, False, dtype)
    assert_identical(round_trip(fsa), fsa)
    # One cyclic entry: the batch has no level schedule at all.
    acyclic = sj.Fsa.from_arcs([(0, 1, 1, 0.5), (1, 2, 2, -1.0)], final=[2], dtype=dtype)
    batch = sj.stack([acyclic, fsa])
    assert_identical(round_trip(batch), batch)


def test_jax_leaves_and_derived_fsas(tmp_path):
    graph = sj.Fsa.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 1, 0.0)], final=[1])
    emissions = jnp.log(
        jnp.array(
            [[[0.5, 0.5], [0.25, 0.75], [0.5, 0.5]], [[0.1, 0.9], [0.2, 0.8], [0.3, 0.7]]],
            jnp.float32,
        )
    )
    lattice = sj.intersect_dense(graph, emissions, lengths=np.array([3, 2]))
    path = tmp_path / "lattice.npz"
    sj.save(path, lattice, compress=True)
    back = sj.load(str(path))
    assert_identical(back, lattice)
    np.testing.assert_array_equal(sj.tot_score(back), sj.tot_score(lattice))
    composed = sj.compose(
        sj.Fsa.from_arcs([(0, 1, 1, 2, 0.5)], final=[1]),
        sj.Fsa.from_arcs([(0, 1, 2, 3, 0.25)], final=[1]),
    )
    assert_identical(round_trip(composed), composed)
    empty = sj.Fsa.from_openfst("", dtype="float64")
    assert_identical(round_trip(empty), empty)


def test_path_is_used_as_given(tmp_path):
    path = tmp_path / "graph.fsa"
    sj.save(path, sj.linear_fsa([3]))
    assert [p.name for p in tmp_path.iterdir()] == ["graph.fsa"]
    with open(path, "rb") as stream:
        assert sj.load(stream).num_arcs == 1


# -- bad files --------------------------------------------------------------------


def saved_arrays(fsa=None):
    buffer = io.BytesIO()
    sj.save(
        buffer, fsa if fsa is not None else sj.stack([sj.linear_fsa([1, 2]), sj.linear_fsa([3])])
    )
    buffer.seek(0)
    with np.load(buffer) as data:
        return {name: data[name] for name in data.files}


def load_arrays(arrays):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    buffer.seek(0)
    return sj.load(buffer)


def edited(**changes):
    arrays = saved_arrays()
    for name, value in changes.items():
        if value is None:
            del arrays[name]
        else:
            arrays[name] = value
    return arrays


def with_value(name, index, value):
    arrays = saved_arrays()
    changed = arrays[name].copy()
    changed[index] = value
    arrays[name] = changed
    return arrays


@pytest.mark.parametrize(
    "arrays, message",
    [
        (edited(format=np.array("other")), r"array 'format' is not 'semiring_jax.Fsa'"),
        (edited(format=None), r"no array 'format'; not a file written by sj.save"),
        (
            edited(version=np.array(1)),
            r"array 'version' is array\(1\); this semiring_jax reads "
            r"versions 2, 3",
        ),
        (edited(arc_mask=None), r"array 'arc_mask' is missing"),
        (edited(extra=np.zeros(3)), r"array 'extra' is not part of the saved layout"),
        (edited(src=np.zeros((2, 2), np.int64)), r"array 'src' has dtype int64, expected int32"),
        (
            edited(dst=np.zeros((2, 3), np.int32)),
            r"array 'dst' has shape \(2, 3\), expected "
            r"\[..., A\] = \(2, 2\)",
        ),
        (
            edited(weight=np.zeros((2, 2), np.int32)),
            r"array 'weight' has dtype int32, expected "
            r"float32 or float64",
        ),
        (
            edited(final_weight=np.zeros((2, 3), np.float64)),
            r"array 'final_weight' has dtype float64, expected float32",
        ),
        (
            edited(batch_shape=np.array([3])),
            r"array 'src' has shape \(2, 2\), expected "
            r"\[..., A\] = \(3, 2\)",
        ),
        (edited(is_acceptor=np.array([True])), r"array 'is_acceptor' has shape \(1,\)"),
        (
            with_value("src", (1, 0), 7),
            r"array 'src' holds state 7 \(flat index 2\), out of "
            r"range for S=3",
        ),
        (with_value("weight", (0, 1), np.nan), r"array 'weight' holds nan"),
        (with_value("final_weight", (0, 2), np.inf), r"array 'final_weight' holds inf"),
        (
            with_value("schedule.in_arc", (0, 0, 0, 0), 1),
            r"array 'schedule.in_arc' does not match the structure of entry 0",
        ),
        (
            with_value("schedule.state_out_arcs", (1, 0, 0), 1),
            r"array 'schedule.state_out_arcs' does not match the structure of entry 1",
        ),
        (
            with_value("schedule.real_sizes", (1, 1), 5),
            r"array 'schedule.real_sizes' holds "
            r"\[2, 5\] \(entry 1\)",
        ),
        (
            edited(**{"schedule.in_arc": np.zeros((2, 3, 1), np.int32)}),
            r"array 'schedule.in_arc' has shape \(2, 3, 1\), expected \[..., L, R, K\]",
        ),
        (edited(cycle=np.array([0, 5])), r"array 'cycle' holds a state out of range"),
    ],
)
def test_bad_files_name_the_array(arrays, message):
    with pytest.raises(ValueError, match=r"load: <file object>: " + message):
        load_arrays(arrays)


def test_cyclic_structure_claimed_acyclic():
    arrays = saved_arrays(sj.linear_fsa([1, 2]))
    arrays["dst"] = np.array([1, 0], np.int32)  # 0 -> 1 -> 0
    with pytest.raises(ValueError, match=r"array 'cycle' is empty, but entry 0 has the cycle"):
        load_arrays(arrays)


def test_not_npz_files_name_the_file(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("0 1 2\n")
    with pytest.raises(ValueError, match=r"load: '.*notes.txt': cannot read it as .npz"):
        sj.load(text)
    single = tmp_path / "array.npy"
    np.save(single, np.zeros(3))
    with pytest.raises(ValueError, match=r"array.npy': a single .npy array"):
        sj.load(single)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, format=np.array(["semiring_jax.Fsa", None], dtype=object))
    with pytest.raises(ValueError, match=r"pickled.npz': array 'format' cannot be read"):
        sj.load(pickled)
    damaged = tmp_path / "damaged.npz"
    sj.save(damaged, sj.linear_fsa([1]))
    damaged.write_bytes(damaged.read_bytes()[:-40])
    with pytest.raises(ValueError, match=r"damaged.npz': cannot read it as .npz"):
        sj.load(damaged)
    with zipfile.ZipFile(tmp_path / "empty.npz", "w"):
        pass
    with pytest.raises(ValueError, match=r"empty.npz': no array 'format'"):
        sj.load(tmp_path / "empty.npz")


def _zip_with(members, compression=zipfile.ZIP_STORED):
    """A .npz of `saved_arrays()` plus `members` ({name: callable(stream)})
    written straight into the zip, so that they can lie."""
    buffer = io.BytesIO()
    np.savez(buffer, **saved_arrays())
    with zipfile.ZipFile(buffer, "a", compression=compression) as archive:
        for name, write in members.items():
            with archive.open(name, "w", force_zip64=True) as stream:
                write(stream)
    buffer.seek(0)
    return buffer


def _npy_header(shape, dtype):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape}
    )
    return header.getvalue()  # the magic string, then the header


def test_load_checks_names_headers_and_sizes_before_reading(monkeypatch):
    # A small file must not make load allocate what it merely claims: names,
    # .npy headers and sizes are checked before any array is read.
    from semiring_jax._src import serialization

    read = []
    real_read = serialization._read
    monkeypatch.setattr(
        serialization, "_read", lambda *args: read.append(args[2]) or real_read(*args)
    )

    def zeros(stream):  # 48 MB of zeros: a few tens of kB once deflated
        stream.write(_npy_header((12 << 20,), np.float32))
        for _ in range(48):
            stream.write(bytes(1 << 20))

    bomb = _zip_with({"bomb.npy": zeros}, zipfile.ZIP_DEFLATED)
    assert len(bomb.getvalue()) < 1 << 20
    with pytest.raises(ValueError, match=r"array 'bomb' is not part of the saved layout"):
        sj.load(bomb)
    assert read == []
    # A header that declares more data than the member holds.
    arrays = {name: np.asarray(value) for name, value in saved_arrays().items()}
    del arrays["weight"]
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    with zipfile.ZipFile(buffer, "a") as archive:
        archive.writestr("weight.npy", _npy_header((10**9,), np.float32) + bytes(8))
    buffer.seek(0)
    with pytest.raises(
        ValueError,
        match=r"load: <file object>: array 'weight' declares shape \(1000000000,\) of float32 "
        r"\(4000000000 bytes\), but its zip member holds 8 bytes of data",
    ):
        sj.load(buffer)
    assert read == []
    # A zip directory that claims more than a stored member holds.
    data = bytearray(_zip_with({}).getvalue())
    # Its central directory entry: the signature, 42 bytes, then the name.
    directory = data.index(b"weight.npy", data.index(b"PK\x01\x02")) - 46
    assert data[directory : directory + 4] == b"PK\x01\x02"
    data[directory + 24 : directory + 28] = (1 << 31).to_bytes(4, "little")
    with pytest.raises(
        ValueError,
        match=r"array 'weight' is stored uncompressed in \d+ bytes but claims 2147483648",
    ):
        sj.load(io.BytesIO(bytes(data)))
    assert read == []
    # The declared total against the budget, before reading.
    compressed = io.BytesIO()
    sj.save(compressed, sj.linear_fsa(np.ones(20_000, np.int32)), compress=True)
    compressed.seek(0)
    with pytest.raises(
        ValueError,
        match=r"load: <file object>: the arrays declare \d+ bytes in all, more than "
        r"max_bytes = 100000; pass a larger max_bytes= to load the file",
    ):
        sj.load(compressed, max_bytes=100_000)
    assert read == []
    compressed.seek(0)
    assert sj.load(compressed).num_arcs == 20_000


def test_save_refuses_non_fsas_and_tracers():
    with pytest.raises(TypeError, match=r"save: fsa must be an Fsa, got dict"):
        sj.save(io.BytesIO(), {})
    fsa = sj.linear_fsa([1])

    @jax.jit
    def traced(weight):
        sj.save(io.BytesIO(), fsa.replace(weight=weight))
        return weight

    with pytest.raises(ValueError, match=r"save: weight is a traced value"):
        traced(jnp.zeros(1, jnp.float32))
    assert math.isfinite(float(sj.tot_score(round_trip(fsa))))


def test_float64_needs_x64():
    buffer = io.BytesIO()
    sj.save(buffer, sj.Fsa.from_arcs([(0, 1, 1, 0.5)], final=[1], dtype="float64"))
    buffer.seek(0)
    jax.config.update("jax_enable_x64", False)
    try:
        with pytest.raises(
            ValueError,
            match=r"load: <file object>: array 'weight': weight is "
            r"float64 but jax_enable_x64 is off",
        ):
            sj.load(buffer)
    finally:
        jax.config.update("jax_enable_x64", True)


def test_final_mask_is_saved_and_old_files_without_it_still_load():
    # A final state of weight -inf stays final through save / load.
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.5), (1, 2, 2, 0.0)], final={1: -math.inf, 2: 0.0})
    back = round_trip(fsa)
    np.testing.assert_array_equal(back.final_mask, [False, True, True])
    assert_identical(back, fsa)
    # A file written before final_mask existed: the finals are final_weight > -inf.
    old = saved_arrays(sj.stack([sj.linear_fsa([1, 2]), sj.linear_fsa([3])]))
    assert int(old["version"]) == 3
    del old["final_mask"]
    with pytest.raises(ValueError, match=r"array 'final_mask' is missing"):
        load_arrays(old)
    old["version"] = np.array(2)
    loaded = load_arrays(old)
    np.testing.assert_array_equal(loaded.final_mask, [[False, False, True], [False, True, False]])
    np.testing.assert_allclose(sj.tot_score(loaded), [0.0, 0.0])
    with pytest.raises(ValueError, match=r"array 'final_mask' has dtype int64, expected bool"):
        load_arrays(edited(final_mask=np.zeros((2, 3), np.int64)))
