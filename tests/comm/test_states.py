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
