"""Communicator costs by size, checked against every record that times communicators of one or two ranks.

``python -m sim.calibrate.comm_scaling [RECORD.json ...] [--preset P]`` prints, per cost (init, destroy of a never-used
group, suspend, resume) and record, the record's per-communicator figure beside what the preset's size rule
([Note: communicator costs by size] in :mod:`sim.presets`) gives for that size, and the rule's figures at 4 and 8
ranks. Without records it reads every ``multigpu`` and one-GPU communicator record under ``bench/results``.
Destroys of initialised communicators are left out: they wait for NCCL's proxy poll (:mod:`sim.calibrate.fit` replays them).
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Iterable, Sequence

from sim.calibrate.records import REPO, MultiGpuRecord, RecordError, load_record

log = logging.getLogger(__name__)

#: (CommRaw field, CommParams field, what) of the costs checked
COSTS = (("first_collective_s", "init_s", "init (first collective)"),
         ("destroy_uninitialized_s", "destroy_uninitialized_s", "destroy, never used"),
         ("suspend_s", "suspend_s", "ncclCommSuspend"), ("resume_s", "resume_s", "ncclCommResume"))


def check(records: Iterable[MultiGpuRecord], preset: str) -> list[dict]:
    """Rows ``{"record", "cost", "ranks", "measured", "model"}`` (seconds per communicator; ``model``: what the size rule
    gives) for every record cost."""
    from sim.machine.topology import Topology

    comm = Topology.from_preset(preset).comm
    rows = []
    for rec in records:
        raw = rec.comm_raw
        if raw is None:
            continue
        for field, param, what in COSTS:
            per = raw.per_comm(field)
            if field == "first_collective_s" and per is None and raw.per_comm("create_first_collective_s") is not None:
                per = raw.per_comm("create_first_collective_s") - comm.for_size(raw.comm_ranks).create_group_s
            if per is not None:
                rows.append({"record": rec.name, "cost": what, "ranks": raw.comm_ranks, "measured": per,
                             "model": getattr(comm.for_size(raw.comm_ranks), param)})
    return rows


def default_records() -> list[MultiGpuRecord]:
    """Every record under ``bench/results`` with raw communicator figures."""
    out = []
    for path in sorted((REPO / "bench" / "results").rglob("*.json")):
        try:
            rec = load_record(path)
        except RecordError:
            continue
        if isinstance(rec, MultiGpuRecord) and rec.comm_raw is not None:
            out.append(rec)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Print the check (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m sim.calibrate.comm_scaling", description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="*", help="records (default: every one under bench/results with comm_raw)")
    ap.add_argument("--preset", default="calibrated/hgx-h200-8x")
    args = ap.parse_args(argv)
    from sim.machine.topology import Topology

    records = [load_record(p) for p in args.records] if args.records else default_records()
    print(f"{'record':<58}{'cost':<24}{'ranks':>6}{'measured ms':>13}{'rule ms':>10}{'error':>8}")
    for r in check(records, args.preset):
        err = (r["model"] - r["measured"]) / r["measured"] if r["measured"] else float("nan")
        print(f"{Path(r['record']).parent.name[:57]:<58}{r['cost']:<24}{r['ranks']:>6}{r['measured'] * 1e3:>13.2f}"
              f"{r['model'] * 1e3:>10.2f}{err:>+8.1%}")
    comm = Topology.from_preset(args.preset).comm
    print("rule at 1 / 2 / 4 / 8 ranks (ms): " + "; ".join(
        f"{what} " + " / ".join(f"{getattr(comm.for_size(n), param) * 1e3:.1f}" for n in (1, 2, 4, 8))
        for _, param, what in COSTS))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


__all__ = ["COSTS", "check", "default_records", "main"]
