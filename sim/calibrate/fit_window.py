"""The canary after a resume, derived from one record's SUSPEND ``wake_up`` (``timeshare sim calibrate --canary-from``).

The lifecycle's wake under SUSPEND is a resume walk over the role's groups and
one canary pass (:meth:`refimpl.comm.lifecycle.PGLifecycle.resume`). On 2 x H200
it takes 2.38-2.39 s where the raw figures add up to about 1.8 s: 9 one-rank
resumes (0.061 s, H200 run 1), 5 two-rank resumes (0.243 and 0.261 s in the two
multigpu records' ``comm_raw``) and a first collective after a resume that
``comm_raw`` times at 0.1 ms per communicator. ``comm_raw`` times each resume on
the host alone, between barriers, and the first collectives after all of them
once the device has caught up; the lifecycle waits on the device only at the
canary, right after its walk. What the rest is made of inside NCCL or torch is
not known; this module charges it where the lifecycle first waits for it, at
the first collective after a resume of a multi-rank communicator
(``nccl_resume_first_collective_multi``, [Note: one-rank and multi-rank
communicators] in :mod:`sim.presets`). One-rank groups get none of it: on one
H200 (run 1) the same wake is within 0.1 s of its raw resumes.

:func:`derive_resume_canary` simulates the record's SUSPEND policy with every
other constant already fitted, and spreads what the measured ``wake_up`` leaves
over the multi-rank groups each rank resumes. The record's ``switch_window`` is
then in the fit set: the constant's source names ``FILE#switch_window`` and
``timeshare sim validate`` refuses that section.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

from sim.calibrate.records import MultiGpuRecord, RecordError

log = logging.getLogger(__name__)

CONSTANT = "nccl_resume_first_collective_multi"


def simulated_wake(data: Mapping[str, Any], settings: Mapping[str, Any]) -> float:
    """SUSPEND's ``wake_up`` on preset ``data`` with a record's switch-window settings (slowest rank, steady steps)."""
    from refimpl.comm import PGPolicy
    from sim.calibrate.switch_window import simulate, summarize

    per_rank = simulate(PGPolicy.SUSPEND, dp=int(settings["dp"]), tp=int(settings["tp"]), steps=int(settings["steps"]),
                        train_s=float(settings["train_s"]), rollout_s=float(settings["rollout_s"]),
                        cooldown_s=float(settings["cooldown_s"]), topology=dict(data),
                        wake_proxies=bool(settings.get("wake_proxies", True)))
    return summarize(PGPolicy.SUSPEND, per_rank, int(settings["warmup"])).wake_up


def multi_rank_groups(settings: Mapping[str, Any]) -> int:
    """How many groups of two or more ranks each rank belongs to in the record's mesh (rank 0's count)."""
    from sim.calibrate.switch_window import mesh_groups

    return sum(1 for s in mesh_groups(int(settings["dp"]), int(settings["tp"])) if 0 in s.ranks and s.size > 1)


def derive_resume_canary(record: MultiGpuRecord, data: Mapping[str, Any]) -> tuple[float, str]:
    """``(seconds, how)``: the first collective after a resume of a multi-rank communicator, from ``record``'s
    SUSPEND ``wake_up`` on preset ``data`` (every other constant as fitted). Raises RecordError when the record
    cannot give it."""
    sw = record.switch_window
    where = f"{record.name}#switch_window"
    if sw is None or "SUSPEND" not in sw.results or sw.results["SUSPEND"].get("wake_up") is None:
        raise RecordError(f"{where}: --canary-from needs a switch window with SUSPEND's wake_up")
    n = multi_rank_groups(sw.settings)
    if n == 0:
        raise RecordError(f"{where}: the mesh {sw.settings['dp']} x {sw.settings['tp']} has no multi-rank group to "
                          "charge a canary after resume to")
    from sim.machine.topology import Topology

    gpus = Topology(dict(data), where="the preset being calibrated").num_gpus
    ranks = int(sw.settings["dp"]) * int(sw.settings["tp"])
    if gpus < ranks:
        raise RecordError(f"{where}: its SUSPEND wake ran on {ranks} GPUs but the base preset "
                          f"{data.get('name')!r} has {gpus}; calibrate --canary-from on a base with at least {ranks} "
                          "GPUs (hgx-h200-8x), or leave --canary-from out")
    consts = data["constants"]
    current = 0.0
    key = data.get("comm", {}).get("resume_first_collective_multi")
    if key in consts:
        c = consts[key]
        current = float(c["value"]) * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[c["unit"]]
    measured = float(sw.results["SUSPEND"]["wake_up"])
    predicted = simulated_wake(data, sw.settings)
    value = current + (measured - predicted) / n
    if value <= 0:
        raise RecordError(f"{where}: SUSPEND wake_up {measured:.3f} s is not longer than the simulated {predicted:.3f} s; "
                          "nothing is left for a canary after resume")
    how = (f"SUSPEND wake_up {measured:.3f} s measured, {predicted:.3f} s simulated with a first collective after "
           f"resume of {current * 1e3:.2f} ms (comm_raw), the rest over the {n} multi-rank groups a rank resumes")
    log.info("%s: %s -> %.4f s", where, how, value)
    return value, how


__all__ = ["CONSTANT", "derive_resume_canary", "multi_rank_groups", "simulated_wake"]
