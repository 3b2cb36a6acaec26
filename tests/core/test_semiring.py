"""Semiring laws for LOG, TROPICAL and a user-defined semiring."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import semiring_jax as sj

REAL = sj.Semiring(name="real", plus=jnp.add, times=jnp.multiply, sum=jnp.sum, zero=0.0, one=1.0)
VALUES = {
    "log": jnp.array([-jnp.inf, -3.0, -0.5, 0.0, 1.25, 4.0]),
    "tropical": jnp.array([-jnp.inf, -3.0, -0.5, 0.0, 1.25, 4.0]),
    "real": jnp.array([0.0, 0.25, 0.5, 1.0, 2.0, 3.0]),
}


def check_semiring_laws(semiring, values):
    a, b, c = values[:, None, None], values[None, :, None], values[None, None, :]
    zero = jnp.asarray(semiring.zero, values.dtype)
    one = jnp.asarray(semiring.one, values.dtype)
    close = lambda x, y: np.testing.assert_allclose(x, jnp.broadcast_to(y, x.shape), rtol=1e-6)
    close(semiring.plus(values, zero), values)
    close(semiring.times(values, one), values)
    close(semiring.times(values, zero), zero)
    close(semiring.plus(a, b), semiring.plus(b, a))
    close(semiring.plus(semiring.plus(a, b), c), semiring.plus(a, semiring.plus(b, c)))
    close(
        semiring.times(a, semiring.plus(b, c)),
        semiring.plus(semiring.times(a, b), semiring.times(a, c)),
    )
    stacked = jnp.stack(jnp.broadcast_arrays(a, b))
    close(semiring.sum(stacked, axis=0), semiring.plus(a, b))
    close(semiring.sum(jnp.zeros((0, 3), values.dtype), axis=0), zero)
    close(semiring.sum(jnp.full((4,), zero), axis=0), zero)


@pytest.mark.parametrize("semiring", [sj.LOG, sj.TROPICAL, REAL], ids=lambda s: s.name)
def test_semiring_laws(semiring):
    with jax.debug_nans(True):
        check_semiring_laws(semiring, VALUES[semiring.name])


@pytest.mark.parametrize("semiring", [sj.LOG, sj.TROPICAL], ids=lambda s: s.name)
def test_sum_grad_contract(semiring):
    rows = jnp.array([[-jnp.inf, -jnp.inf, -jnp.inf], [0.0, 1.0, 1.0], [-jnp.inf, 2.0, -1.0]])
    with jax.debug_nans(True):
        weights = semiring.sum_grad(rows, semiring.sum(rows, axis=1), axis=1)
        grads = jax.vmap(jax.grad(lambda row: semiring.sum(row, axis=0)))(rows)
    np.testing.assert_array_equal(weights[0], 0.0)  # all zero in, all zero out
    np.testing.assert_allclose(weights[1:].sum(axis=1), 1.0)
    if semiring is sj.LOG:
        np.testing.assert_allclose(weights, grads, rtol=1e-6)  # softmax is the gradient
    else:
        np.testing.assert_array_equal(weights[1], [0.0, 1.0, 0.0])  # first maximum wins


def test_log_sum_is_stable_and_nan_free():
    with jax.debug_nans(True):
        big = sj.LOG.sum(jnp.array([1000.0, 1000.0]), axis=0)
        grad = jax.grad(lambda x: sj.LOG.sum(x, axis=0))(jnp.full((3,), -jnp.inf))
        plus_grad = jax.grad(lambda x: sj.LOG.plus(x, x))(jnp.asarray(-jnp.inf))
    np.testing.assert_allclose(big, 1000.0 + np.log(2.0))
    np.testing.assert_array_equal(grad, 0.0)
    assert plus_grad == 0.0
    assert sj.LOG.plus(jnp.inf, 1.0) == jnp.inf  # +inf stays visible


def test_lookup_by_name_and_hashing():
    assert sj.semiring("log") is sj.LOG and sj.semiring("TROPICAL") is sj.TROPICAL
    with pytest.raises(ValueError, match=r"semiring: unknown semiring 'max'"):
        sj.semiring("max")
    assert hash(sj.LOG) == hash(sj.LOG) and sj.LOG != sj.TROPICAL
    assert jax.jit(lambda x, s: s.sum(x, axis=0))(jnp.ones(3), REAL) == 3.0


def test_a_user_semiring_never_reads_the_minus_inf_of_non_final_states():
    # from_arcs stores -inf (LOG's zero) at the non-final states 0 and 1; the
    # real semiring must read its own zero there, not -inf * alpha.
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (1, 2, 2, 0.0), (0, 2, 1, 0.0)], final=[2])
    fsa = fsa.replace(
        weight=jnp.array([0.5, 2.0, 0.25], jnp.float32),
        final_weight=jnp.array([-jnp.inf, -jnp.inf, 3.0], jnp.float32),
    )
    with jax.debug_nans(True):
        total = sj.tot_score(fsa, REAL)
        backward = sj.backward_scores(fsa, REAL)
        final_grad = jax.grad(lambda f: sj.tot_score(fsa.replace(final_weight=f), REAL))(
            fsa.final_weight
        )
    np.testing.assert_allclose(total, (0.5 * 2.0 + 0.25) * 3.0)
    np.testing.assert_allclose(backward, [3.75, 6.0, 3.0])
    np.testing.assert_allclose(final_grad, [0.0, 0.0, 1.25])
    # Dense intersection too: one frame of emission 1 per column.
    graph = sj.Fsa.from_arcs([(0, 1, 0, 0.0), (1, 1, 1, 0.0)], final=[1])
    graph = graph.replace(weight=jnp.array([0.5, 2.0], jnp.float32))
    graph = graph.replace(final_weight=jnp.array([-jnp.inf, 1.0], jnp.float32))
    emissions = jnp.ones((1, 2, 2), jnp.float32)
    np.testing.assert_allclose(sj.dense_tot_score(graph, emissions, None, REAL), [1.0])


def test_check_semiring_laws_refuses_samples_that_are_not_records():
    # These raised IndexError (or passed vacuously) instead of naming samples.
    pair = sj.Semiring(
        name="pair",
        plus=lambda a, b: (a[0] + b[0], a[1] + b[1]),
        times=lambda a, b: (a[0] * b[0], a[1] * b[1]),
        sum=lambda x, axis: (jnp.sum(x[0], axis=axis), jnp.sum(x[1], axis=axis)),
        zero=(0.0, 0.0),
        one=(1.0, 1.0),
    )
    vector = jnp.array([0.0, 1.0])
    with pytest.raises(ValueError, match=r"check_semiring_laws: samples leaf 0 has shape \(\);"):
        sj.check_semiring_laws(sj.LOG, jnp.array(1.0))  # no [N] axis
    with pytest.raises(ValueError, match=r"samples leaf 0 has shape \(2, 2\); expected \[N\]"):
        sj.check_semiring_laws(sj.LOG, jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"samples must be .* structure of 'log'"):
        sj.check_semiring_laws(sj.LOG, (vector, vector))
    with pytest.raises(ValueError, match=r"samples must be .* structure of 'pair'"):
        sj.check_semiring_laws(pair, vector)
    with pytest.raises(
        ValueError, match=r"samples leaf 1 has shape \(3,\); expected \[N\] = \(2,\)"
    ):
        sj.check_semiring_laws(pair, (vector, jnp.zeros(3)))
    with pytest.raises(ValueError, match=r"samples leaf 0 has shape \(2,\); expected \[N, 3\]"):
        sj.check_semiring_laws(sj.kbest_semiring(3), vector)
    with pytest.raises(ValueError, match=r"samples must hold at least one record"):
        sj.check_semiring_laws(sj.LOG, jnp.zeros(0))
    sj.check_semiring_laws(pair, (vector, vector + 2.0))  # records of it pass
    sj.check_semiring_laws(sj.kbest_semiring(2), jnp.array([[0.0, -1.0], [2.0, -jnp.inf]]))
