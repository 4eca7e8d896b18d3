"""The old policy's log-prob pass before a training step, in the N-GPU prediction of the switch.

A PPO or GRPO step computes the old policy's per-token log-probs of the rollout's sequences with the trainer's
model before its update (verl's ``compute_log_prob``): a forward of the batch without gradients. The RL step runs one
with ``--logprob-pass`` (:meth:`bench.rl.trainer.Trainer.old_logprobs`), in every training step, plain or after a
switch; after a switch it is filled from the rollout's copy like the training forward, so no collective runs before
the training backward and the rebuilt groups' creation hides under the pass as well as under the forward
(:mod:`sim.calibrate.switch_ngpu`, ``forward_from_rollout``).

:func:`logprob_pass` says what the prediction takes for it: from a record that ran it, the mean device seconds of the
pass in its plain steps (``logprob_pass.s``, CUDA events around it), which the record's plain step holds; for a
record without it, a pass as long as the training forward (``forward_share`` of the plain step: the same
model over the same tokens, without the autograd graph the training forward records; an assumption until a record
with the pass measures it), added to the step.
"""
from __future__ import annotations

import statistics
from typing import Any, NamedTuple


class Pass(NamedTuple):
    """The log-prob pass the prediction composes: its ``seconds`` (0: none), whether the record ``measured`` it
    (else assumed), and the training step ``train_s`` the stretches are shares of (the plain step less the pass
    where the record holds it)."""

    seconds: float
    measured: bool
    train_s: float


def measured_pass_s(rec: dict[str, Any]) -> float | None:
    """The mean seconds of the log-prob pass in the record's plain training steps (those after no switch: every
    ``after_steps`` entry but the first), or None where it ran none."""
    after = rec.get("after_steps") or []
    vals = [s["logprob_pass"]["s"] for s in after[1:] if isinstance(s.get("logprob_pass"), dict)]
    return statistics.fmean(vals) if vals else None


def logprob_pass(rec: dict[str, Any], plain_s: float, forward_share: float, wanted: bool | None = None) -> Pass:
    """The pass for a prediction from ``rec`` (``plain_s``: its plain step, :func:`~sim.calibrate.switch_ngpu.plain_step_s`):
    ``wanted`` None: as the record ran (``config.logprob_pass``); False: none (a record that ran it is refused: its
    plain step holds a pass the prediction could not take out alone); True: the record's measured pass, else one as
    long as the training forward (``forward_share`` of the plain step), added to it."""
    ran = bool((rec.get("config") or {}).get("logprob_pass"))
    wanted = ran if wanted is None else bool(wanted)
    if not wanted:
        if ran:
            from sim.calibrate.records import RecordError

            raise RecordError("the record ran the log-prob pass (config.logprob_pass): its steps hold it, so a "
                              "prediction without it cannot come from this record")
        return Pass(0.0, False, plain_s)
    if ran:
        measured = measured_pass_s(rec)
        if measured is None:
            from sim.calibrate.records import RecordError

            raise RecordError("the record ran the log-prob pass (config.logprob_pass) but its plain steps time none "
                              "(after_steps[].logprob_pass.s)")
        return Pass(measured, True, max(0.0, plain_s - measured))
    return Pass(forward_share * plain_s, False, plain_s)


__all__ = ["Pass", "logprob_pass", "measured_pass_s"]
