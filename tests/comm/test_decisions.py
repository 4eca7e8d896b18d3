"""Decisions, apart from performing them: the vote, two-phase enabling, the pause event."""
from __future__ import annotations

import pytest

from refimpl.comm.decisions import (
    Preservation,
    after_gates,
    after_good_sync,
    disabled,
    inline_cooldown,
    local_vote,
    needs_bring_up,
    pause_event,
)
from refimpl.comm.states import PGEvent, PGPolicy, PGState

READY = Preservation(eligible=True, ready=True)


@pytest.mark.parametrize("policy", list(PGPolicy))
def test_only_keeping_policies_with_passing_gates_and_an_armed_switch_vote_to_keep(policy):
    assert local_vote(policy, [], READY, two_phase=True) is policy.preserves
    assert local_vote(policy, ["pp_1"], READY, two_phase=True) is False
    assert local_vote(policy, [], Preservation(), two_phase=True) is False
    assert local_vote(policy, [], Preservation(), two_phase=False) is policy.preserves
    assert local_vote(policy, [], disabled(READY, "canary failed"), two_phase=False) is False


def test_two_phases_eligible_at_a_pause_then_ready_after_a_good_sync():
    p = Preservation()
    assert after_good_sync(p) == p, "a sync before any eligible pause arms nothing"
    p = after_gates(p, all_gates_pass=False)
    assert not p.eligible
    p = after_gates(p, all_gates_pass=True)
    assert p.eligible and not p.ready and not p.armed
    p = after_good_sync(p)
    assert p.ready and p.armed


def test_disabled_is_sticky_and_keeps_the_first_reason():
    p = disabled(READY, "canary failed")
    p = disabled(p, "later")
    assert p.disabled == "canary failed" and not p.armed
    assert after_gates(p, True) == p and after_good_sync(p) == p


def test_pause_event_follows_the_agreed_vote():
    assert pause_event(PGPolicy.PAUSED_LIVE, True) is PGEvent.PAUSE_LIVE
    assert pause_event(PGPolicy.SUSPEND, True) is PGEvent.SUSPEND
    for policy in PGPolicy:
        assert pause_event(policy, False) is PGEvent.DESTROY
    assert inline_cooldown(PGPolicy.DESTROY) and not inline_cooldown(PGPolicy.DESTROY_DEFERRED)


def test_bring_up_before_a_sync_or_a_resume():
    assert [s for s in PGState if needs_bring_up(s)] == [PGState.SUSPENDED, PGState.DESTROYED]


def test_policy_codes_round_trip():
    assert [PGPolicy.from_code(p.code) for p in PGPolicy] == list(PGPolicy)
