"""sj.save / sj.load: exact round trips and located errors on bad files."""

import dataclasses
import io
import math
import pathlib
import zipfile

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from semiring_jax._src.core.tables import Tables
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


def sized(**changes):
    """Saved arrays with the stored sizes (or their names) changed."""
    arrays = saved_arrays()
    for name, change in changes.items():
        arrays[name] = change(arrays[name])
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
            edited(version=np.array(5)),
            r"array 'version' is array\(5\); this semiring_jax reads "
            r"versions 1, 2, 3, 4",
        ),
        (
            edited(version=np.array(3)),
            r"array 'schedule.arc_dst_pos' is missing",
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
            with_value("real_sizes", (1, 1), 5),
            r"array 'real_sizes' holds \[2, 5\] \(entry 1\)",
        ),
        (
            edited(real_sizes=np.zeros((2, 3), np.int32)),
            r"array 'real_sizes' has shape \(2, 3\), expected \[..., 2\] = \(2, 2\)",
        ),
        # The stored sizes: smaller than an entry needs, named otherwise than
        # this version's fields, or not sizes at all.
        (
            sized(schedule_shape=lambda sizes: np.ones_like(sizes)),
            r"array 'schedule_shape' holds sizes that do not fit entry 0",
        ),
        (
            sized(
                schedule_shape_fields=lambda names: np.array([f"x{i}" for i in range(names.size)])
            ),
            r"array 'schedule_shape_fields' names the sizes \['x0', .*\], but this "
            r"semiring_jax's ScheduleShape has \[",
        ),
        (
            sized(dense_shape_fields=lambda names: names[::-1]),
            r"array 'dense_shape_fields' names the sizes .*, but this semiring_jax's DenseShape",
        ),
        (
            sized(schedule_shape=lambda sizes: -sizes),
            r"array 'schedule_shape' holds \w+ = -\d+, not a size in int32",
        ),
        (
            sized(dense_shape=lambda sizes: sizes.astype(np.int32)),
            r"array 'dense_shape' has dtype int32, expected int64",
        ),
        (
            sized(schedule_shape_fields=lambda names: names[:1]),
            r"array 'schedule_shape_fields' has shape \(1,\), expected \[F\] = \(\d+,\) of str",
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
    from semiring_jax._src.io import npz_archive

    read = []
    real_read = npz_archive.read
    monkeypatch.setattr(npz_archive, "read", lambda *args: read.append(args[2]) or real_read(*args))

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


@pytest.mark.parametrize(
    "kind, field, message",
    [
        ("schedule", "steps", r"and the table sizes they store \d+ more"),
        ("dense", "in_slots", r"and the table sizes they store \d+ more"),
        ("dense", "out_levels", r"array 'dense_shape' holds out_levels = 2147483647 at out_fan"),
    ],
)
def test_stored_table_sizes_count_against_the_budget(kind, field, message):
    # Sizes a file merely claims would make the builders allocate tables
    # of that size: they count against max_bytes before anything is built.
    saved = io.BytesIO()
    sj.save(saved, sj.linear_fsa([1, 2, 3]))
    saved.seek(0)
    with np.load(saved) as stored:
        arrays = {name: stored[name] for name in stored.files}
    names = arrays[f"{kind}_shape_fields"].tolist()
    arrays[f"{kind}_shape"][names.index(field)] = 2**31 - 1
    tampered = io.BytesIO()
    np.savez(tampered, **arrays)
    tampered.seek(0)
    with pytest.raises(ValueError, match=message):
        sj.load(tampered)


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


def test_final_mask_is_saved():
    # A final state of weight -inf stays final through save / load.
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.5), (1, 2, 2, 0.0)], final={1: -math.inf, 2: 0.0})
    back = round_trip(fsa)
    np.testing.assert_array_equal(back.final_mask, [False, True, True])
    assert_identical(back, fsa)
    with pytest.raises(ValueError, match=r"array 'final_mask' is missing"):
        load_arrays(edited(final_mask=None))
    with pytest.raises(ValueError, match=r"array 'final_mask' has dtype int64, expected bool"):
        load_arrays(edited(final_mask=np.zeros((2, 3), np.int64)))


def test_the_file_holds_structure_and_sizes_only():
    arrays = saved_arrays()
    assert int(arrays["version"]) == 4
    assert not [name for name in arrays if name.startswith("schedule.")]
    batch = sj.stack([sj.linear_fsa([1, 2]), sj.linear_fsa([3])])
    for kind, shape in (("schedule", batch.shapes.schedule), ("dense", batch.shapes.dense)):
        np.testing.assert_array_equal(arrays[f"{kind}_shape"], tuple(shape))
        assert tuple(arrays[f"{kind}_shape_fields"]) == shape._fields
    # A cyclic Fsa has no level tables, so no level sizes.
    cyclic = saved_arrays(sj.Fsa.from_arcs([(0, 1, 1, 0.0), (1, 0, 1, 0.0)], final=[1]))
    assert cyclic["schedule_shape"].shape == cyclic["schedule_shape_fields"].shape == (0,)
    cyclic["schedule_shape"] = arrays["schedule_shape"]
    cyclic["schedule_shape_fields"] = arrays["schedule_shape_fields"]
    with pytest.raises(ValueError, match=r"'schedule_shape' holds sizes, but a cyclic Fsa has no"):
        load_arrays(cyclic)


def test_save_needs_the_sizes_the_tables_were_built_at():
    fsa = sj.linear_fsa([1, 2])
    shapes = fsa.shapes._replace(dense=None)
    unknown = dataclasses.replace(fsa, tables=Tables(fsa.schedule, fsa.cycle, shapes))
    with pytest.raises(
        ValueError, match=r"save: fsa.shapes does not record the sizes of its dense"
    ):
        sj.save(io.BytesIO(), unknown)


# -- files of versions 1 to 3 -----------------------------------------------------

# Written by the version-3 writer (`sj.save` before version 4), from
# `OLD_BATCH` and `OLD_CYCLIC` below; the version 1 and 2 files are its
# arrays less those that version lacked (`final_mask`; and for version 1 the
# `schedule.pull_*` tables), as their writers wrote them.
DATA = pathlib.Path(__file__).parents[1] / "data" / "serialization"


def old_batch():
    acceptor = sj.Fsa.from_arcs(
        [(0, 1, 1, 0.5), (1, 2, 2, -1.0), (0, 2, 3, 0.25)], final={2: 0.5, 1: -0.25}
    )
    return sj.stack([acceptor, sj.linear_fsa([4])])


def old_cyclic():
    cyclic = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (1, 0, 2, -0.5)], final=[1])
    return sj.stack([sj.linear_fsa([1]), cyclic])


def old_arrays(name):
    with np.load(DATA / name) as data:
        return {key: data[key] for key in data.files}


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("name, expected", [("batch", old_batch), ("cyclic", old_cyclic)])
def test_files_of_versions_1_to_3_still_load(name, expected, version):
    # Their stored tables are checked by their headers and ignored: the
    # schedule is built from the structure at the sizes `sj.stack` chooses.
    back = sj.load(DATA / f"{name}_v{version}.npz")
    assert_identical(back, expected())
    assert (int(old_arrays(f"{name}_v{version}.npz")["version"]), back.cycle) == (
        version,
        expected().cycle,
    )
    entry = sj.unstack(expected())[0]
    np.testing.assert_allclose(sj.tot_score(sj.unstack(back)[0]), sj.tot_score(entry))


def test_old_files_tables_are_checked_by_their_headers_and_not_read(monkeypatch):
    from semiring_jax._src.io import npz_archive

    read = []
    real_read = npz_archive.read
    monkeypatch.setattr(npz_archive, "read", lambda *args: read.append(args[2]) or real_read(*args))
    sj.load(DATA / "batch_v3.npz")
    assert [name for name in read if name.startswith("schedule.")] == ["schedule.real_sizes"]
    cases = [
        (
            {"schedule.in_arc": np.zeros((2, 3, 1), np.int32)},
            r"array 'schedule.in_arc' has shape \(2, 3, 1\), expected \[..., L, R, K\]",
        ),
        (
            {"schedule.pull_end": lambda value: value.astype(np.int64)},
            r"array 'schedule.pull_end' has dtype int64, expected int32",
        ),
        (
            {"schedule.out_arc": lambda value: value[:, :1]},
            r"array 'schedule.out_arc' has shape \(2, 1, \d+, \d+\), expected "
            r"\[..., L, P, Q\] = \(2, \d+, \d+, \d+\)",
        ),
        ({"schedule.pos_state": None}, r"array 'schedule.pos_state' is missing"),
        (
            {"schedule.real_sizes": lambda value: value + 5},
            r"array 'schedule.real_sizes' holds \[8, 8\] \(entry 0\), out of range",
        ),
        ({"real_sizes": np.zeros((2, 2), np.int32)}, r"array 'real_sizes' is not part of the"),
    ]
    for changes, message in cases:
        arrays = old_arrays("batch_v3.npz")
        for key, change in changes.items():
            if change is None:
                del arrays[key]
            else:
                arrays[key] = change(arrays[key]) if callable(change) else change
        with pytest.raises(ValueError, match=r"load: <file object>: " + message):
            load_arrays(arrays)
    version_1 = old_arrays("batch_v1.npz")
    version_1["schedule.pull_arc"] = old_arrays("batch_v3.npz")["schedule.pull_arc"]
    with pytest.raises(ValueError, match=r"'schedule.pull_arc' is not part of the version 1"):
        load_arrays(version_1)


def test_version_2_final_states_are_those_of_finite_weight():
    arrays = old_arrays("batch_v2.npz")
    arrays["final_weight"] = arrays["final_weight"].copy()
    arrays["final_weight"][0, 1] = -np.inf  # state 1 of entry 0: no longer final
    loaded = load_arrays(arrays)
    np.testing.assert_array_equal(loaded.final_mask, [[False, False, True], [False, True, False]])
    # Entry 0's paths: 0 -> 1 -> 2 scores 0.5 - 1.0 + 0.5, 0 -> 2 scores 0.25 + 0.5.
    np.testing.assert_allclose(sj.tot_score(loaded), [np.logaddexp(0.0, 0.75), 0.0], rtol=1e-6)
