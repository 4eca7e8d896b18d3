"""The transition table: complete, consistent, and the picture in docs/comm.md is drawn from it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from refimpl.comm.states import (
    TRANSITIONS,
    InvalidTransitionError,
    PGEvent,
    PGState,
    events_from,
    format_table,
    mermaid,
    next_state,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "comm.md"


def _reachable(start: PGState) -> set[PGState]:
    seen, todo = {start}, [start]
    while todo:
        s = todo.pop()
        for t in TRANSITIONS:
            if t.source is s and t.target not in seen:
                seen.add(t.target)
                todo.append(t.target)
    return seen


def test_every_state_is_reachable_from_active_and_active_from_every_live_state():
    assert _reachable(PGState.ACTIVE) == set(PGState)
    for s in PGState:
        if s is not PGState.FAILED:
            assert PGState.ACTIVE in _reachable(s), f"{s.name} cannot get back to ACTIVE"


def test_failed_is_terminal_and_every_other_state_can_fault():
    assert events_from(PGState.FAILED) == []
    for s in PGState:
        if s is not PGState.FAILED:
            assert next_state(s, PGEvent.FAULT) is PGState.FAILED


def test_reloading_is_transient():
    outs = {t.target for t in TRANSITIONS if t.source is PGState.RELOADING}
    assert PGState.RELOADING not in outs and outs


def test_an_event_not_in_the_table_is_refused_with_the_allowed_ones_named():
    with pytest.raises(InvalidTransitionError, match=r"SUSPEND is not allowed in state SUSPENDED \(allowed: FAULT, RELOAD\)"):
        next_state(PGState.SUSPENDED, PGEvent.SUSPEND)
    with pytest.raises(InvalidTransitionError, match="allowed: none"):
        next_state(PGState.FAILED, PGEvent.RESUME)


def test_text_table_has_a_line_per_row():
    lines = format_table().splitlines()
    assert len(lines) == len(TRANSITIONS) + 1
    assert lines[1].split()[:3] == ["ACTIVE", "PAUSE_LIVE", "PAUSED_LIVE"]


def test_mermaid_draws_every_non_fault_row():
    text = mermaid()
    for t in TRANSITIONS:
        edge = f"{t.source.name} --> {t.target.name}: {t.event.name}"
        assert (edge in text) == (t.event is not PGEvent.FAULT)
    assert text.count("FAULT") == 1
    assert "ACTIVE --> FAILED: FAULT" in mermaid(include_fault=True)


def test_docs_embed_the_diagram_generated_from_the_table():
    blocks = re.findall(r"```mermaid\n(.*?)```", DOC.read_text(), flags=re.S)
    assert mermaid().strip() in [b.strip() for b in blocks], (
        "docs/comm.md's state diagram is out of date; regenerate it with "
        "python -c 'from refimpl.comm import mermaid; print(mermaid())'"
    )


def test_every_operation_is_allowed_only_in_live_stable_states():
    from refimpl.comm.states import OPERATIONS, allowed_states

    assert [o.name for o in OPERATIONS] == ["pause", "weight_sync", "resume", "use"]
    for o in OPERATIONS:
        assert o.allowed and PGState.FAILED not in o.allowed and PGState.RELOADING not in o.allowed
        assert allowed_states(o.name) == o.allowed
    with pytest.raises(KeyError, match="no operation 'pasue'"):
        allowed_states("pasue")


def test_docs_embed_the_operations_table():
    from refimpl.comm.states import format_operations

    assert format_operations() in DOC.read_text(), (
        "docs/comm.md's table of operations is out of date; print "
        "python -c 'from refimpl.comm.states import format_operations; print(format_operations())'"
    )


@pytest.mark.parametrize("op", ["pause", "weight_sync", "resume", "use"])
def test_each_operation_refuses_the_states_outside_its_row(op):
    """OPERATIONS drives the check: every state outside an operation's row is refused before any agreement."""
    import sim
    from refimpl.comm import LifecycleConfig, LifecycleStateError, PGLifecycle
    from refimpl.comm.states import allowed_states
    from refimpl.runtime.base import GroupSpec

    calls = {"pause": lambda lc: lc.pause(), "weight_sync": lambda lc: lc.weight_sync(lambda: None),
             "resume": lambda lc: lc.resume(), "use": lambda lc: lc.use(None)}
    refused = [s for s in PGState if s not in allowed_states(op) and s is not PGState.FAILED]

    async def job(rt):
        lc = PGLifecycle(rt, [GroupSpec("g", (0,))], config=LifecycleConfig(agree_timeout_s=5.0))
        await lc.start()
        out = {}
        for s in refused:
            lc.state = s
            before = lc.control.count
            try:
                await calls[op](lc)
                out[s] = "ran"
            except LifecycleStateError as exc:
                out[s] = (str(exc), lc.control.count - before)
        return out

    (out,) = sim.SimWorld(1).run(job)
    names = " or ".join(sorted(s.name for s in allowed_states(op)))
    for s in refused:
        assert out[s] == (f"rank 0: {op}() needs state {names}, lifecycle is {s.name}", 0), s
