"""A communicator's creation past two ranks, as a run of the RL step on more GPUs measured it.

No rule of :mod:`sim.presets` ([Note: communicator costs by size]) is tested past two ranks: "log2" and "ring" differ
by 0.28 s at eight, and the N-GPU prediction of the switch (:mod:`sim.calibrate.switch_ngpu`) by 0.35 x against
0.94 x of the copies on 8-GPU FSDP2. The first run of ``bench/gpu/run_rl_ngpu.sh`` on 4 or 8 GPUs measures the
figure itself: its lifecycle warms each rebuilt member group by a first collective, one after another, in the
resume it runs ahead on a thread (``resume_ahead.warm_s`` of each step's record; ``lifecycle.warm`` spans), which
is the creation each such communicator costs the step, measured where the step pays it (beside the reload's issue
and the forward).

:func:`measured_creation` reads it from such a record: per step, the warm-up less the preset's figure for each member
group of two ranks or fewer, is the creation of the one member group past two ranks (a record warming two such groups,
an HSDP mesh of 4 x 4 for one, does not say which took what and is refused). The mean over the record's steady steps
is the input of :meth:`sim.presets.CommParams.with_measured_init`, which puts it in place of the rule's init at that
size, and past it extends the line through it and the two-rank figure by log2 of the ranks: a 4-GPU run predicts 8.
What such a run has to measure for the switch to meet a target is :mod:`sim.calibrate.creation_break_even`'s.

    python -m sim.calibrate.switch_ngpu ONE_GPU_RECORD.json --ranks 8 --creation-from FOUR_GPU_RECORD.json
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from sim.calibrate.records import RecordError


def member_group_sizes(rec: dict[str, Any]) -> list[int]:
    """The ranks of each group of the record's mesh a rank is a member of (one per mesh dimension)."""
    mesh = rec.get("mesh")
    if not isinstance(mesh, list) or not mesh or not all(isinstance(n, int) and n >= 1 for n in mesh):
        raise RecordError(f"the record names no mesh (its 'mesh', a list of dimension sizes, is {mesh!r})")
    return list(mesh)


def warm_up_s(rec: dict[str, Any]) -> list[float]:
    """The warm-up of the resume run ahead (``resume_ahead.warm_s``) in each of the record's steady steps (every step
    after the first; the only one where there is one)."""
    steps = [s for s in rec.get("steps", []) if s.get("resume_ahead")]
    if len(steps) > 1:
        steps = steps[1:]
    vals = [s["resume_ahead"].get("warm_s") for s in steps]
    vals = [float(v) for v in vals if isinstance(v, (int, float))]
    if not vals:
        raise RecordError("the record has no resume run ahead with its warm-up timed (steps[].resume_ahead.warm_s: "
                          "the RL step with --rebuild-ahead, its lifecycle warming the rebuilt groups)")
    return vals


def measured_creation(rec: dict[str, Any], preset: str = "calibrated/hgx-h200-8x") -> tuple[int, float]:
    """``(ranks, seconds)``: the creation of the record's one member group past two ranks, the mean over its steady
    steps of the warm-up less ``preset``'s lazy init of each other member group (one or two ranks). Refuses a record
    of two ranks or fewer (nothing past the preset's figures), with two member groups past two ranks, with no
    timed warm-up, or whose warm-up is not more than the other groups' figures."""
    from sim.machine.topology import Topology

    sizes = member_group_sizes(rec)
    big = [n for n in sizes if n > 2]
    if not big:
        raise RecordError(f"the record's mesh {sizes} has no group past two ranks: its creation says nothing the "
                          "preset's one- and two-rank figures do not")
    if len(big) > 1:
        raise RecordError(f"the record's mesh {sizes} warms {len(big)} groups past two ranks one after another; its "
                          "warm-up does not say which took what (a mesh with one dimension past two ranks does)")
    comm = Topology.from_preset(preset).comm
    others = sum(comm.for_size(n).init_s for n in sizes if n <= 2)
    per_step = [w - others for w in warm_up_s(rec)]
    if min(per_step) <= 0:
        raise RecordError(f"a warm-up of the record ({min(per_step) + others:.4f} s) is not more than the preset's "
                          f"creation of its groups of two ranks or one ({others:.4f} s): no communicator past two ranks "
                          "was created in it")
    return big[0], statistics.mean(per_step)


def creations_from(paths: list[str | Path], preset: str = "calibrated/hgx-h200-8x") -> dict[int, float]:
    """:func:`measured_creation` of each record at ``paths``, by ranks (the mean where several have the same size)."""
    by: dict[int, list[float]] = {}
    for p in paths:
        try:
            rec = json.loads(Path(p).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise RecordError(f"{p}: cannot read the record: {e}") from e
        try:
            n, s = measured_creation(rec, preset)
        except RecordError as e:
            raise RecordError(f"{p}: {e}") from e
        by.setdefault(n, []).append(s)
    return {n: statistics.mean(v) for n, v in sorted(by.items())}


__all__ = ["creations_from", "measured_creation", "member_group_sizes", "warm_up_s"]
