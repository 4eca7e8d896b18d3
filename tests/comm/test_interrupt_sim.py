"""A call cancelled while its rank waits at an agreement ends that rank FAILED (simulator).

``asyncio.CancelledError`` (a cancelled task, a cancelled Ray call on an async
actor) is no ``Exception``. Raised on rank 0 while it waits for its peer at the
memory release's agreement, it used to leave rank 0 DESTROYED (the pause had taken
the groups down) and rank 1 FAILED after the agreement timeout. Now rank 0 falls
back at once (groups aborted, FAILED) and re-raises the cancellation; rank 1, whose
peer left that agreement, fails at its timeout: every rank ends FAILED.
(``tests/comm/test_interrupt_gloo.py`` has interrupts inside a step, agreed at once.)
"""
from __future__ import annotations

import asyncio

import sim
from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy, PGState
from refimpl.runtime.base import GroupSpec

AGREE_S = 20.0


class _CancelledAtTheAgreement:
    """Rank 0's first control-group collective after it reached ``lifecycle.release_memory`` raises CancelledError."""

    def __init__(self):
        self.armed = self.fired = False

    def on_point(self, rank, name):
        if rank == 0 and name == "lifecycle.release_memory":
            self.armed = True
        return None

    def on_collective(self, rank, group, op, seq):
        if rank == 0 and self.armed and not self.fired and group == "lifecycle.control":
            self.fired = True
            return sim.FaultAction.fail(asyncio.CancelledError("the caller cancelled the pause"))
        return None

    def on_group_create(self, rank, spec):
        return None

    def on_pin(self, rank, nbytes):
        return None


def test_a_rank_cancelled_while_it_waits_at_an_agreement_falls_back_and_its_peer_fails_at_the_timeout():
    faults = _CancelledAtTheAgreement()
    world = sim.SimWorld(2, group_timeouts=True, faults=faults)

    async def job(rt):
        lc = PGLifecycle(rt, [GroupSpec("tp", (0, 1)), GroupSpec("dp", (0, 1))],
                         config=LifecycleConfig(policy=PGPolicy.DESTROY, agree_timeout_s=AGREE_S))
        await lc.start()
        t0 = rt.now()
        try:
            await lc.pause()
            raised = None
        except BaseException as exc:  # noqa: BLE001 - which error, is the assertion (CancelledError included)
            raised = type(exc).__name__
        return dict(raised=raised, state=lc.state, took=rt.now() - t0,
                    live=[g for g in lc.groups if rt.group_live(g)])

    out = world.run(job)
    assert faults.fired
    assert [o["state"] for o in out] == [PGState.FAILED, PGState.FAILED], out
    assert [o["raised"] for o in out] == ["CancelledError", "AgreementTimeoutError"], out
    assert [o["live"] for o in out] == [[], []]
    # rank 0 left at once (after the pause's inline cooldown); its peer waited the agreement timeout, no longer
    assert AGREE_S - 1e-6 <= out[1]["took"] - out[0]["took"] < AGREE_S + 1.0, out
