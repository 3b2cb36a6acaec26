"""Fsa construction, validation, replace, pytree behaviour and drawing."""

import math
import shutil
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import semiring_jax as sj

ARCS = [(0, 1, 3, 0.5), (0, 2, 4, -1.0), (1, 2, 5, 0.25)]


def test_from_arcs_acceptor_and_transducer():
    fsa = sj.Fsa.from_arcs(ARCS, final={2: 0.5})
    assert fsa.is_acceptor and (fsa.num_states, fsa.num_arcs) == (3, 3)
    np.testing.assert_array_equal(fsa.olabel, fsa.ilabel)
    np.testing.assert_array_equal(fsa.final_weight, [-np.inf, -np.inf, 0.5])
    assert fsa.weight.dtype == np.float32 and fsa.src.dtype == np.int32
    transducer = sj.Fsa.from_arcs([(0, 1, 3, 7, 0.5)], final=[1])
    assert not transducer.is_acceptor
    np.testing.assert_array_equal(transducer.olabel, [7])
    as_array = sj.Fsa.from_arcs(np.array(ARCS), final=[2], num_states=5)
    assert as_array.num_states == 5
    chex.assert_trees_all_close(as_array.weight, fsa.weight)


def test_start_is_renumbered_to_zero():
    fsa = sj.Fsa.from_arcs([(2, 0, 1, 0.5), (0, 1, 2, 0.25)], final=[1], start=2)
    np.testing.assert_array_equal(fsa.src, [0, 2])
    np.testing.assert_array_equal(fsa.dst, [2, 1])
    assert float(sj.tot_score(fsa)) == pytest.approx(0.75)


@pytest.mark.parametrize(
    "arcs, final, kwargs, message",
    [
        (
            [(0, 1, 1, 0.0), (0, 5, 1, 0.0)],
            [1],
            dict(num_states=4),
            r"from_arcs: arc 1 has dst=5 but num_states=4",
        ),
        (
            [(0, 1, 1, 0.0), (3, 1, 1, 0.0)],
            [1],
            dict(num_states=2),
            r"from_arcs: arc 1 has src=3 but num_states=2",
        ),
        ([(0, 1, 1, math.nan)], [1], {}, r"from_arcs: arc 0 has weight nan"),
        ([(0, 1, 1, 0.0), (0, 1, 1, math.inf)], [1], {}, r"from_arcs: arc 1 has weight inf"),
        ([(0, 1, 1, 0.0)], {1: math.nan}, {}, r"from_arcs: final state 1 has weight nan"),
        ([(0, 1, 1, 0.0)], [7], dict(num_states=2), r"final state 7 is out of range"),
        (
            [(0, 1, -1, 0.0)],
            [1],
            {},
            r"from_arcs: arc 0 has label=-1; expected a non-negative integer",
        ),
        ([(0, 1, 1.5, 0.0)], [1], {}, r"arc 0 has label=1.5"),
        ([(0, 1, 1, 0.0), (0, 1, 1, 1, 0.0)], [1], {}, r"arc 1 has 5 fields but arc 0 has 4"),
        ([(0, 1, 1)], [1], {}, r"arc 0 is \(0, 1, 1\)"),
        (np.zeros((2, 3)), [1], {}, r"arcs must have shape \[A, 4\]"),
        ([(0, 1, 1, 0.0)], [1], dict(start=5, num_states=2), r"start=5 is out of range"),
    ],
)
def test_from_arcs_errors_name_the_culprit(arcs, final, kwargs, message):
    with pytest.raises(ValueError, match=message):
        sj.Fsa.from_arcs(arcs, final, **kwargs)


@pytest.mark.parametrize(
    "arcs, final, kwargs, message",
    [
        # A finite weight that rounds to +inf or -inf in the dtype is refused.
        (
            [(0, 1, 1, 1e300)],
            [1],
            {},
            r"from_arcs: arc 0 has weight 1e\+300, which float32 cannot hold \(it would "
            r"round to inf; the largest float32 is 3.4028235e\+38\)",
        ),
        (
            [(0, 1, 1, 0.0), (0, 1, 1, -1e300)],
            [1],
            {},
            r"from_arcs: arc 1 has weight -1e\+300, which float32 cannot hold \(it would "
            r"round to -inf",
        ),
        (
            [(0, 1, 1, 0.0)],
            {1: 1e300},
            {},
            r"from_arcs: final state 1 has weight 1e\+300, which float32 cannot hold",
        ),
        # States, labels and num_states are int32: refused, never wrapped.
        (
            [(0, 1, 2**40, 0.0)],
            [1],
            {},
            r"from_arcs: arc 0 has label=1099511627776; expected a non-negative integer "
            r"\(int32: at most 2\*\*31 - 1\)",
        ),
        ([(0, 1, 1, 0.0)], [2**40], {}, r"from_arcs: final state 1099511627776 is not a"),
        ([(0, 1, 1, 0.0)], [2**70], {}, r"from_arcs: final state 1180591620717411303424 is"),
        (
            [(0, 1, 1, 0.0)],
            [1],
            dict(num_states=2**31),
            r"from_arcs: num_states must be a positive int \(at most 2\*\*31 - 1\), "
            r"got 2147483648",
        ),
        ([(0, 1, 1, 10**400)], [1], {}, r"from_arcs: arcs must hold numbers"),
        # A state id of 2**31 - 1: a ValueError naming the arc, not a MemoryError.
        (
            [(0, 2**31 - 1, 1, 0.0)],
            [1],
            {},
            r"from_arcs: arc 0 has dst=2147483647, which is not below 1048580 = "
            r"2 \* arcs \+ final states \+ 1 \+ 2\*\*20, the bound on state ids that keeps "
            r"memory proportional to the input \(pass num_states= for a sparser numbering\)",
        ),
        ([(0, 1, 1, 0.0)], [30_000_000], {}, r"from_arcs: final state 30000000 is not below"),
        ([(0, 1, 1, 0.0)], [1], dict(start=10**9), r"from_arcs: start=1000000000 is not below"),
    ],
)
def test_from_arcs_refuses_overflow_and_huge_state_ids(arcs, final, kwargs, message):
    with pytest.raises(ValueError, match=message):
        sj.Fsa.from_arcs(arcs, final, **kwargs)


def test_state_ids_beyond_the_bound_need_num_states(monkeypatch):
    from semiring_jax._src.core.host import build

    monkeypatch.setattr(build, "SPARE_STATES", 10)  # the bound: 2 * 1 + 1 + 1 + 10 = 14
    with pytest.raises(ValueError, match=r"arc 0 has dst=14, which is not below 14 ="):
        sj.Fsa.from_arcs([(0, 14, 1, 0.0)], final=[1])
    assert sj.Fsa.from_arcs([(0, 13, 1, 0.0)], final=[1]).num_states == 14
    assert sj.Fsa.from_arcs([(0, 14, 1, 0.0)], final=[1], num_states=40).num_states == 40
    # float64 holds what float32 cannot.
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 1e300)], final={1: -1e300}, dtype=np.float64)
    np.testing.assert_array_equal(fsa.weight, [1e300])


def test_host_constructors_refuse_traced_values():
    with pytest.raises(ValueError, match=r"from_arcs: arcs is a traced value; .* outside jax\.jit"):
        jax.jit(lambda w: sj.Fsa.from_arcs([(0, 1, 1, w)], final=[1]))(0.5)
    with pytest.raises(ValueError, match="linear_fsa: labels is a traced value"):
        jax.jit(sj.linear_fsa)(jnp.array([1, 2]))


def test_float64_needs_x64():
    code = (
        "import semiring_jax as sj\n"
        "try:\n sj.linear_fsa([1], dtype='float64')\n"
        "except ValueError as e:\n print(e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert "jax_enable_x64 is off" in result.stdout


def test_is_a_pytree_through_jit_vmap_and_device_put():
    fsa = sj.Fsa.from_arcs(ARCS, final=[2])
    assert fsa == fsa and fsa != sj.Fsa.from_arcs(ARCS, final=[2])  # identity, no error
    assert len({fsa, fsa}) == 1
    leaves, treedef = jax.tree_util.tree_flatten(fsa)
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    assert rebuilt.is_acceptor and rebuilt.cycle == ()
    moved = jax.device_put(fsa)
    np.testing.assert_allclose(sj.tot_score(moved), sj.tot_score(fsa))
    passed = jax.jit(lambda f: f)(fsa)
    chex.assert_trees_all_equal(passed, jax.tree_util.tree_map(jnp.asarray, fsa))
    # An Fsa, index tables included, can be a traced argument.
    np.testing.assert_allclose(jax.jit(sj.tot_score)(fsa), sj.tot_score(fsa))


def test_replace_is_functional_and_checked():
    fsa = sj.Fsa.from_arcs(ARCS, final=[2])
    heavier = fsa.replace(weight=np.array([1.0, 1.0, 1.0], np.float32))
    np.testing.assert_array_equal(fsa.weight, [0.5, -1.0, 0.25])
    np.testing.assert_array_equal(heavier.weight, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"replace: weight must have shape \[..., A\] = \(3,\)"):
        fsa.replace(weight=np.zeros(4, np.float32))
    with pytest.raises(ValueError, match=r"replace: weight is float64 but final_weight is float32"):
        fsa.replace(weight=np.zeros(3, np.float64))
    with pytest.raises(ValueError, match=r"replace: arc 1 has weight nan"):
        fsa.replace(weight=np.array([0.0, np.nan, 0.0], np.float32))
    with pytest.raises(TypeError, match=r"replace: unknown field\(s\) \['schedule'\]"):
        fsa.replace(schedule=None)
    with pytest.raises(ValueError, match=r"replace: ilabel must hold integers, got float32"):
        fsa.replace(ilabel=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"replace: arc 0 has dst=9 but num_states=3"):
        fsa.replace(dst=np.array([9, 2, 2]))


def test_replace_structure_rebuilds_the_schedule():
    fsa = sj.Fsa.from_arcs(ARCS, final=[2])
    shorter = fsa.replace(arc_mask=np.array([False, True, True]))
    assert float(sj.tot_score(shorter)) == pytest.approx(-1.0)
    cyclic = fsa.replace(dst=np.array([1, 2, 1]), src=np.array([0, 1, 2]))
    assert cyclic.cycle == (1, 2, 1)
    with pytest.raises(ValueError, match="replace: src is a traced value"):
        jax.jit(lambda s: fsa.replace(src=s))(fsa.src)


def test_replace_checks_integer_fields_at_full_width():
    # 2**32 + 1 wrapped to state 1 when cast to int32; every integer field
    # is checked before the cast, and kept int32.
    fsa = sj.Fsa.from_arcs(ARCS, final=[2])
    wide = 2**32 + 1
    with pytest.raises(ValueError, match=r"replace: arc 0 has src=4294967297; expected"):
        fsa.replace(src=np.array([wide, 1, 1], np.int64))
    with pytest.raises(ValueError, match=r"replace: arc 2 has dst=4294967298; expected"):
        fsa.replace(dst=np.array([1, 2, wide + 1], np.int64))
    with pytest.raises(ValueError, match=r"replace: arc 1 has ilabel=4294967297; expected"):
        fsa.replace(ilabel=np.array([3, wide, 5], np.int64))
    with pytest.raises(ValueError, match=r"replace: arc 0 has olabel=-4294967297; expected"):
        fsa.replace(olabel=np.array([-wide, 4, 5], np.int64))
    with pytest.raises(ValueError, match=r"replace: arc 2 has ilabel=9223372036854775808"):
        fsa.replace(ilabel=np.array([3, 4, 2**63], np.uint64))
    with pytest.raises(ValueError, match=r"replace: arc 1 has olabel=-1; expected"):
        fsa.replace(olabel=np.array([3, -1, 5], np.int32))
    with pytest.raises(ValueError, match=r"replace: arc 1 has olabel=4294967296; expected"):
        fsa.replace(olabel=jnp.array([3, 2**32, 5], jnp.int64))  # x64 is on in the tests
    batched = sj.stack([fsa, fsa])
    with pytest.raises(ValueError, match=r"replace: entry 1, arc 2 has ilabel=4294967297"):
        batched.replace(ilabel=np.array([[3, 4, 5], [3, 4, wide]], np.int64))
    relabelled = fsa.replace(ilabel=np.array([7, 8, 2**31 - 1], np.int64))
    assert relabelled.ilabel.dtype == np.int32
    np.testing.assert_array_equal(relabelled.ilabel, [7, 8, 2**31 - 1])
    moved = fsa.replace(src=np.array([0, 1, 1], np.int64))
    assert moved.src.dtype == np.int32
    assert float(sj.tot_score(moved)) == pytest.approx(0.5 + np.logaddexp(-1.0, 0.25))
    # Labels may still be traced (and are then not checked).
    labels = jax.jit(lambda x: fsa.replace(ilabel=x).ilabel)(jnp.array([1, 2, 3], jnp.int32))
    np.testing.assert_array_equal(labels, [1, 2, 3])


def test_to_dot_and_notebook_rendering(monkeypatch):
    fsa = sj.Fsa.from_arcs([(0, 1, 3, 7, 0.5)], final={1: -0.25})
    source = fsa.to_dot(title="demo")
    assert source.startswith("digraph FSA {") and 'label = "demo";' in source
    assert '0 -> 1 [label = "3:7/0.5"];' in source
    assert '1 [label = "1/-0.25", shape = doublecircle];' in source
    if shutil.which("dot"):
        assert "<svg" in fsa._repr_mimebundle_()["image/svg+xml"]
    monkeypatch.setattr(shutil, "which", lambda name: None)  # no Graphviz installed
    assert fsa._repr_svg_() is None
    assert fsa._repr_mimebundle_() == {"text/plain": fsa.to_dot()}
    assert repr(fsa) == "Fsa(transducer, num_states=2, num_arcs=1)"
    with pytest.raises(ValueError, match=r"to_dot: takes an unbatched Fsa"):
        sj.stack([fsa]).to_dot()


def test_linear_fsa():
    fsa = sj.linear_fsa(np.array([3, 0, 4]))
    np.testing.assert_array_equal(fsa.label, [3, 0, 4])
    assert float(sj.tot_score(fsa)) == 0.0
    with pytest.raises(ValueError, match=r"linear_fsa: labels\[1\] = -2"):
        sj.linear_fsa([1, -2])
    with pytest.raises(ValueError, match=r"linear_fsa: labels must have shape \[U\]"):
        sj.linear_fsa([[1]])


def test_linear_fsa_refuses_labels_beyond_int32():
    # Labels beyond int32 are refused, not wrapped ([2**40, 2**32 + 5] was [0, 5]).
    with pytest.raises(
        ValueError,
        match=r"linear_fsa: labels\[0\] = 1099511627776; expected a non-negative integer "
        r"\(int32: at most 2\*\*31 - 1\)",
    ):
        sj.linear_fsa([2**40, 2**32 + 5])
    with pytest.raises(ValueError, match=r"linear_fsa: labels\[1\] = 4294967301"):
        sj.linear_fsa(np.array([1, 2**32 + 5], np.uint64))
    with pytest.raises(ValueError, match=r"linear_fsa: labels must hold integers, got dtype <U1"):
        sj.linear_fsa(["a"])
    np.testing.assert_array_equal(sj.linear_fsa([2**31 - 1]).label, [2**31 - 1])


def test_constructors_record_the_final_states_as_structure():
    # A state named in `final` is final whatever its weight; the start swap
    # moves the mask with the weights.
    fsa = sj.Fsa.from_arcs([(2, 0, 1, 0.5), (0, 1, 2, 0.25)], final={1: -math.inf, 2: 0.5}, start=2)
    np.testing.assert_array_equal(fsa.final_mask, [True, True, False])
    np.testing.assert_array_equal(fsa.final_weight, [0.5, -np.inf, -np.inf])
    np.testing.assert_array_equal(sj.linear_fsa([1, 2]).final_mask, [False, False, True])
    np.testing.assert_array_equal(sj.Fsa.from_k2("0 1 5 0.5\n1 2 -1 0.25\n2\n").final_mask, [0, 1])
    # The pytree carries it: through jit, and stacked (padding states not final).
    np.testing.assert_array_equal(jax.jit(lambda f: f)(fsa).final_mask, fsa.final_mask)
    batch = sj.stack([fsa, sj.linear_fsa([1, 2, 3])])
    np.testing.assert_array_equal(batch.final_mask[0], [True, True, False, False])
    np.testing.assert_array_equal(sj.unstack(batch)[0].final_mask, fsa.final_mask)
    # Writers give a non-final state's stored value no meaning.
    odd = fsa.replace(final_weight=np.array([0.5, -np.inf, 7.0], np.float32))
    assert odd.to_openfst() == fsa.to_openfst()
