"""`hlo_loops.Launches` reads loops, trip counts and conditionals from an
optimized HLO module: checked on programs compiled for this CPU, whose
loops we know."""

import jax
import jax.numpy as jnp
import numpy as np
from hlo_loops import Launches


def _compiled(fn, *args) -> Launches:
    launches = Launches(jax.jit(fn).lower(*args).compile().as_text())
    assert launches.sequential() > 0  # also records the loops
    return launches


def test_a_scan_with_a_cond_in_its_body():
    def fn(x):
        def step(carry, t):
            carry = jax.lax.cond(carry.sum() > t, jnp.sin, jnp.cos, carry)
            return carry * 2.0, carry.sum()

        return jax.lax.scan(step, x, jnp.arange(10, dtype=jnp.float32))

    (loop,) = _compiled(fn, np.ones(5, np.float32)).loops
    assert loop.trips == 10 and loop.conditionals == 1 and loop.per_iteration > 0


def test_a_data_dependent_while_loop_has_no_trip_count():
    def fn(x):
        return jax.lax.while_loop(lambda c: c[0] < c[1], lambda c: (c[0] * 2.0, c[1]), (x, x * 100))

    launches = _compiled(fn, np.float32(1.5))
    (loop,) = launches.loops
    assert loop.trips is None and loop.conditionals == 0
    assert launches.sequential() == float("inf")


def test_a_static_trip_count_is_read_from_the_loop_condition():
    # The TPU's HLO carries no known_trip_count: the count comes from the
    # condition `counter < constant`, as JAX lowers fori_loop and scan.
    hlo = """HloModule m

%cond (p: (s32[], f32[])) -> pred[] {
  %p = (s32[], f32[]) parameter(0)
  %c = s32[] constant(7)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

%body (p: (s32[], f32[])) -> (s32[], f32[]) {
  %p = (s32[], f32[]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[] get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %y = f32[] sine(%x)
  ROOT %t = (s32[], f32[]) tuple(%next, %y)
}

ENTRY %main (x: f32[]) -> (s32[], f32[]) {
  %x = f32[] parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[]) tuple(%zero, %x)
  ROOT %w = (s32[], f32[]) while(%init), condition=%cond, body=%body
}
"""
    launches = Launches(hlo)
    assert launches.sequential() == 7 * 3  # add, sine, compare per iteration
    (loop,) = launches.loops
    assert (loop.trips, loop.per_iteration, loop.conditionals) == (7, 3, 0)
