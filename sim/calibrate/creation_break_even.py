"""The largest communicator creation past two ranks for which the predicted N-GPU switch meets a target.

Neither size rule of :mod:`sim.presets` ([Note: communicator costs by size]) is tested past two ranks, and the
N-GPU prediction of the switch (:mod:`sim.calibrate.switch_ngpu`) turns on it: on 8-GPU FSDP2 with each rank's
state as one GPU's, 0.35 x the copies at line under the "ring" rule and 0.94 x under "log2". Rather than a third
guess, :func:`break_even_creation` says what a run has to measure: the creation of the mesh's biggest member group
(as :mod:`sim.calibrate.creation_measured` reads it from a record and the prediction takes it) at which the
predicted switch crosses the target, found by bisection (the switch grows with the creation: the join waits for
what of the resume thread outlasts the reload's issue and the forward).

    python -m sim.calibrate.creation_break_even ONE_GPU_RECORD.json --ranks 4,8 [--meshes fsdp,hsdp]
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def break_even_creation(rec: dict[str, Any], ranks: int, mesh: str = "fsdp", target: float = 0.5,
                        **kw: Any) -> dict[str, Any]:
    """The largest creation of the mesh's biggest member group (``ranks`` ranks on FSDP2) for which the switch of the
    one-GPU record ``rec`` predicted on ``ranks`` ranks (:func:`~sim.calibrate.switch_ngpu.predict_ngpu`, the
    defaults' mechanism, ``kw`` passed on) stays at or under ``target`` x the copies at line: what a run on that many
    GPUs has to measure for the mechanism to meet it. ``{"size", "break_even_s"}`` (None where even a creation of 1 ms
    does not meet it: the terms that do not depend on it are over), with the rules' figures beside it."""
    from sim.calibrate.nccl_init_log import CONNECT_SHARE_2X_H200
    from sim.calibrate.switch_ngpu import HSDP_SHARD, mesh_shape, predict_ngpu
    from sim.machine.topology import Topology

    size = max(mesh_shape(mesh, ranks, kw.get("hsdp_shard", HSDP_SHARD)))
    if size <= 2:
        raise ValueError(f"the {mesh} mesh on {ranks} ranks has no group past two ranks: its creation is the preset's")

    def x(t: float) -> float:
        (row,) = predict_ngpu(rec, ranks, mesh, mechanisms=("forward_from_rollout",), init_measured={size: t}, **kw)
        return row["switch_cost_x_copy_time"]

    comm = Topology.from_preset("calibrated/hgx-h200-8x").comm
    out = {"ranks": ranks, "mesh": mesh, "size": size, "target": target,
           "log2_s": comm.for_size(size).init_s,
           "ring_s": comm.with_size_rule("ring", CONNECT_SHARE_2X_H200).for_size(size).init_s}
    lo, hi = 1e-3, 5.0
    if x(lo) > target:
        return {**out, "break_even_s": None}
    if x(hi) <= target:
        return {**out, "break_even_s": hi}
    while hi - lo > 5e-4:  # the cost grows with the creation (the join's wait), so a bisection finds the edge
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if x(mid) <= target else (lo, mid)
    return {**out, "break_even_s": lo}


def main(argv: list[str] | None = None) -> int:
    """CLI: per rank count, the largest creation of a communicator past two ranks that keeps the predicted switch
    under the target, beside the size rules' figures."""
    import argparse
    import sys

    from sim.calibrate.switch_ngpu import BYTES_PER_RANK, MESHES, check_inputs_blind, mesh_shape

    ap = argparse.ArgumentParser(description="The largest communicator creation past two ranks for which the "
                                 "predicted N-GPU switch stays under a target x the copies at line")
    ap.add_argument("record", help="a one-GPU rl_step_1.json of bench.rl (--offload-in-backward --sync-first "
                    "--mode streamed), as for python -m sim.calibrate.switch_ngpu")
    ap.add_argument("--ranks", default="4,8", help="comma-separated rank counts (each with a group past two ranks)")
    ap.add_argument("--meshes", default="fsdp", help=f"of {','.join(MESHES)}")
    ap.add_argument("--bytes-per-rank", default="one-gpu", choices=BYTES_PER_RANK)
    ap.add_argument("--target", type=float, default=0.5, help="the switch's target against the copies at line")
    ap.add_argument("--overlap-reload", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--logprob-pass", action=argparse.BooleanOptionalAction, default=None,
                    help="with the old policy's log-prob pass before each step (as switch_ngpu's)")
    a = ap.parse_args(argv)
    try:
        check_inputs_blind(a.record)
        rec = json.loads(Path(a.record).read_text())
        shapes = [(int(n), m, mesh_shape(m, int(n))) for n in a.ranks.split(",") for m in a.meshes.split(",")]
        rows = [break_even_creation(rec, n, m, a.target, bytes_per_rank=a.bytes_per_rank,
                                    overlap_reload=a.overlap_reload, logprob_pass=a.logprob_pass)
                for n, m, shape in shapes if max(shape) > 2]  # a mesh of groups of two ranks or one: the preset's
    except (OSError, ValueError, KeyError) as e:  # RecordError is a ValueError
        print(f"sim.calibrate.creation_break_even: {a.record}: {e}", file=sys.stderr)
        return 2
    if not rows:
        print("no mesh asked for has a group past two ranks: nothing past the preset's figures to find", file=sys.stderr)
        return 2
    print(f"bytes per rank: {a.bytes_per_rank}; the switch at or under {a.target} x the copies at line\n")
    print("| GPUs | mesh | group | largest creation meeting it | log2 rule | ring rule |\n|---|---|---|---|---|---|")
    for r in rows:
        be = "none (over without it)" if r["break_even_s"] is None else f"{r['break_even_s'] * 1e3:.0f} ms"
        print(f"| {r['ranks']} | {r['mesh']} | {r['size']} ranks | {be} | {r['log2_s'] * 1e3:.0f} ms | "
              f"{r['ring_s'] * 1e3:.0f} ms |")
    return 0


__all__ = ["break_even_creation", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
