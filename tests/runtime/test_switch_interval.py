"""[Note: the GIL's switch interval] (refimpl.runtime.switch_interval): one lowering shared by every user of the
process, and the switch's background threads lowering it while they live (refimpl.comm.overlap.Background). The
same with a real lifecycle's background resume on Gloo: tests/comm/test_overlap_gloo.py."""
from __future__ import annotations

import sys
import threading

import pytest

from refimpl.comm.overlap import Background
from refimpl.runtime.switch_interval import (
    RESPONSIVE_SWITCH_INTERVAL_S,
    SWITCH_INTERVAL,
    SwitchInterval,
    check_switch_interval,
)


@pytest.fixture(autouse=True)
def _interpreter_interval_kept():
    before = sys.getswitchinterval()
    yield before
    assert SWITCH_INTERVAL.users == 0, "a test left a lowering held"
    sys.setswitchinterval(before)


def test_the_switch_interval_is_lowered_while_any_user_holds_it_and_restored_after(_interpreter_interval_kept):
    """The first user saves the interpreter's interval and lowers it, a value already lower is kept, the last user to
    finish puts the saved one back, an extra restore changes nothing."""
    before = _interpreter_interval_kept
    s = SwitchInterval()
    s.lower(0.0002)
    assert sys.getswitchinterval() == pytest.approx(0.0002, abs=2e-6) and s.users == 1
    s.lower(0.001)  # a second user asking for more keeps the lower value
    assert sys.getswitchinterval() == pytest.approx(0.0002, abs=2e-6) and s.users == 2
    s.restore()
    assert sys.getswitchinterval() == pytest.approx(0.0002, abs=2e-6)
    s.restore()
    assert sys.getswitchinterval() == pytest.approx(before) and s.users == 0
    s.restore()
    assert sys.getswitchinterval() == pytest.approx(before) and s.users == 0
    sys.setswitchinterval(0.0001)  # the user's own, lower: kept while lowered, and restored
    s.lower(0.0002)
    assert sys.getswitchinterval() == pytest.approx(0.0001, abs=2e-6)
    s.restore()
    assert sys.getswitchinterval() == pytest.approx(0.0001, abs=2e-6)


def test_a_bad_switch_interval_is_refused_by_name():
    assert check_switch_interval("x_s", None) is None
    assert check_switch_interval("x_s", 1) == 1.0
    for bad in (0, -1, 2.0, "0.001", True):
        with pytest.raises(ValueError, match="x_s must be None or in"):
            check_switch_interval("x_s", bad)
    with pytest.raises(ValueError, match="switch_interval_s"):
        Background("bad", lambda: None, switch_interval_s=0)


@pytest.mark.parametrize("fails", [False, True])
def test_a_background_thread_lowers_the_interval_while_it_lives(fails, _interpreter_interval_kept):
    """Read on the thread itself: lowered from its first line to its last, back once it ended, whether the
    callable returned or raised; a second thread living at the same time shares the lowering."""
    before = _interpreter_interval_kept
    go, seen = threading.Event(), {}

    def body(name):
        seen[name] = sys.getswitchinterval()
        go.wait(10)
        if fails:
            raise RuntimeError("the move failed")
        return name

    a = Background("a", lambda: body("a"), switch_interval_s=RESPONSIVE_SWITCH_INTERVAL_S)
    b = Background("b", lambda: body("b"), switch_interval_s=0.001)
    while len(seen) < 2:
        go.wait(0.001)
    assert SWITCH_INTERVAL.users == 2
    assert sys.getswitchinterval() == pytest.approx(RESPONSIVE_SWITCH_INTERVAL_S, abs=2e-6)
    go.set()
    for bg in (a, b):
        if fails:
            with pytest.raises(RuntimeError, match="the move failed"):
                bg.join()
        else:
            assert bg.join() == bg.name
    assert seen["a"] == pytest.approx(RESPONSIVE_SWITCH_INTERVAL_S, abs=2e-6)
    assert seen["b"] == pytest.approx(RESPONSIVE_SWITCH_INTERVAL_S, abs=2e-6)  # the lower one of the two holds
    assert SWITCH_INTERVAL.users == 0 and sys.getswitchinterval() == pytest.approx(before)


def test_a_background_thread_without_an_interval_leaves_it(_interpreter_interval_kept):
    before = _interpreter_interval_kept
    bg = Background("plain", sys.getswitchinterval)
    assert bg.join() == pytest.approx(before) and SWITCH_INTERVAL.users == 0
