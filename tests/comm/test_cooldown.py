"""The deferred port cooldown: a deadline that only grows; a rebuild waits only for what is left."""
from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sim
from refimpl.comm.cooldown import PortCooldown
from tests._hypothesis import BUDGET


def test_wait_sleeps_only_for_the_remainder_on_the_runtime_clock():
    world = sim.SimWorld(1)

    async def job(rt):
        c = PortCooldown(2.0)
        first = await c.wait(rt)  # nothing released yet
        c.defer(rt.now())
        await rt.sleep(0.5)  # useful work overlaps the cooldown
        t0 = rt.now()
        waited = await c.wait(rt)
        elapsed = rt.now() - t0
        await rt.sleep(10.0)
        again = await c.wait(rt)
        return first, waited, elapsed, again, c.waited_s, c.waits

    first, waited, elapsed, again, total, waits = world.run(job)[0]
    assert first == 0.0 and again == 0.0
    assert waited == pytest.approx(1.5) and elapsed == pytest.approx(1.5)
    assert total == pytest.approx(1.5) and waits == 1


@BUDGET.settings(60)
@given(st.lists(st.tuples(st.floats(0, 1e4), st.floats(0, 30)), min_size=1, max_size=20))
def test_the_deadline_only_grows(events):
    c = PortCooldown(2.0)
    last = -math.inf
    for now, delay in events:
        d = c.defer(now, delay)
        assert d >= last and d >= now + delay
        assert c.remaining(now) == pytest.approx(max(0.0, d - now))
        last = d


def test_invalid_delays_are_refused():
    with pytest.raises(ValueError, match="finite number >= 0"):
        PortCooldown(-1)
    with pytest.raises(ValueError, match=">= 0"):
        PortCooldown(1).defer(0.0, -2)
