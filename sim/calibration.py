"""Calibration: the simulator's offload/reload times against the H200 measurement of the same shapes.

``bench/offload_bench.py`` (``timeshare bench offload``) measures the offload
store on a real GPU for two per-rank state shapes (:mod:`refimpl.benchmarks.shapes`:
a dense 7B 1/8 shard, 1,164 tensors, 11.8 GB; a fine-grained MoE 1/8 shard,
25,164 tensors, 10.1 GB) and writes ``bench/results/<date>-<device>-offload.json``.
:func:`predict` runs the *same store code* on one simulated rank of a topology
preset (default ``h200-1x``, the measured test machine) for the same shapes and
cycles, with meta payloads; :func:`compare` puts prediction and measurement
side by side for every store variant in a recorded report.

The cold (first) cycle also pins host memory (``cudaHostRegister``), which the
simulator's runtime does not charge time for; the steady cycles, which reuse
the pinned buffers, are what the calibration compares.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RESULTS_DIR = Path(__file__).resolve().parents[1] / "bench" / "results"


def predict(shape: Any, *, preset: str = "h200-1x", cycles: int = 2, config: Any = None) -> dict[str, Any]:
    """Simulated cold and steady offload/reload seconds of ``shape`` (a ``refimpl.benchmarks.shapes.StateShape``)."""
    from refimpl.store import OffloadStore
    from sim.collectives import NcclComm, TopologyCollectiveCost
    from sim.flows import FlowTransport
    from sim.memory import TopologyMemory
    from sim.topology import Topology
    from sim.world import SimWorld

    topo = Topology.from_preset(preset)
    transport = FlowTransport(topo)
    world = SimWorld(1, payload="meta", transport=transport, collective_cost=TopologyCollectiveCost(topo),
                     memory=TopologyMemory(topo, record=False), comm=NcclComm(topo), trace=False)
    times: list[dict[str, float]] = []

    async def cycle(rt):
        """Offload/reload cycles of the shape on the one simulated rank."""
        state: dict[Any, dict[str, Any]] = {}
        for spec in shape.tensors:
            state.setdefault(spec.category, {})[spec.name] = rt.alloc_device(spec.numel, spec.dtype, tag=spec.name)
        store = OffloadStore(rt, config=config)
        for cat, tensors in state.items():
            store.attach_tensors(cat, tensors, name=cat.value)
        for _ in range(cycles + 1):
            t0 = rt.now()
            await store.offload_async()
            await rt.synchronize()
            t1 = rt.now()
            await store.reload_async()
            await rt.synchronize()
            times.append({"offload_s": t1 - t0, "reload_s": rt.now() - t1, "copies": store.stats().copies})
        return times

    world.run(cycle)
    steady = times[1:] or times
    mid = sorted(steady, key=lambda c: c["offload_s"])[len(steady) // 2]
    mid_r = sorted(steady, key=lambda c: c["reload_s"])[len(steady) // 2]
    return {
        "shape": shape.name,
        "preset": preset,
        "state_bytes": shape.nbytes,
        "tensors": len(shape.tensors),
        "cold_offload_s": times[0]["offload_s"],
        "cold_reload_s": times[0]["reload_s"],
        "steady_offload_s": mid["offload_s"],
        "steady_reload_s": mid_r["reload_s"],
        "copies": times[-1]["copies"],
    }


def latest_report(results_dir: str | Path = RESULTS_DIR, device: str = "H200") -> Path | None:
    """The newest ``*-offload.json`` recorded on a device whose name contains ``device``."""
    found = []
    for p in sorted(Path(results_dir).glob("*-offload.json")):
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            log.warning("skipping unreadable benchmark report %s", p)
            continue
        if device.lower() in str(data.get("device", "")).lower() and data.get("device_type") == "cuda":
            found.append((data.get("date", ""), p))
    return max(found)[1] if found else None


def compare(report: dict[str, Any], *, preset: str = "h200-1x") -> list[dict[str, Any]]:
    """Prediction vs measurement for every store variant and shape of a recorded offload report."""
    from refimpl.benchmarks.shapes import SHAPES
    from refimpl.store import StoreConfig

    rows = []
    shapes = {factory().name: factory for factory in SHAPES.values()}
    for sh in report["shapes"]:
        factory = shapes.get(sh["shape"])
        if factory is None:
            log.warning("shape %r of the report is not a known benchmark shape; skipped", sh["shape"])
            continue
        shape = factory()
        for r in sh["results"]:
            if r.get("skipped") or r["method"] not in report.get("variants", {}):
                continue
            config = StoreConfig(**report["variants"][r["method"]])
            cycles = max(1, len(r.get("cycles", [])) - 1)
            p = predict(shape, preset=preset, cycles=cycles, config=config)
            for what in ("offload", "reload"):
                measured = r[f"steady_{what}_s"]
                predicted = p[f"steady_{what}_s"]
                rows.append({
                    "shape": shape.name, "method": r["method"], "phase": what, "measured_s": measured,
                    "predicted_s": predicted, "rel_error": (predicted - measured) / measured,
                    "measured_line_gbps": sh["line_rate"][("d2h" if what == "offload" else "h2d") + "_gbps"],
                })
    return rows


__all__ = ["RESULTS_DIR", "compare", "latest_report", "predict"]
