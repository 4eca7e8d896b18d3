"""Calibration: the simulator's offload/reload times against the H200 measurement of the same shapes.

``bench/offload_bench.py`` (``timeshare bench offload``) measures the offload
store on a real GPU for the per-rank state shapes of
:mod:`sim.presets.bench_shapes` (a dense 7B 1/8 shard, 1,164 tensors, 11.79 GB;
a fine-grained MoE 1/8 shard, 25,164 tensors, 18.54 GB) and writes
``bench/results/<...>/<date>-<device>-offload.json``. :func:`predict` takes the
shape's tensors from :mod:`sim.presets.bench_shapes` (same names, sizes and
dtypes) and runs the *same store code* on one simulated rank of a topology
preset (default ``h200-1x``, the measured test machine) with meta payloads. What
the simulation gives is the copy time: one copy per 256 MiB host segment after
the first cycle, each paying the preset's per-copy latency, at the PCIe rate of
its direction. Offloads are simulated at the D2H rate and reloads at the H2D
rate (the topology's links have one rate for both directions, so each direction
is simulated on its own copy of the preset).

Between an offload and its reload the simulation pauses ``phase_gap_s`` (the
report's, 0 for reports made before the benchmark had a gap). The H200 presets
simulate the driver's scrub of freed device memory ([Note: the driver's scrub of
freed memory] in :mod:`sim.machine.flows`): the scrub of what the offload freed runs
from the free on, through the offload's host time that follows it (taken as
the preset's whole offload host time) and the gap; a reload that starts before
it is done waits for the rest before its first copy.

The simulated runtime charges no time for host-side Python work. The store's
host time that does not overlap its copies is added from preset constants
measured on the H200 (their ``source`` names the run): before/after the
offload's copies, a fixed part plus a part per tensor; before the reload's
copies, allocating the flat device buffers, per GiB.

The cold (first) cycle also pins host memory (``cudaHostRegister``), which the
simulator's runtime does not charge time for; the steady cycles, which reuse the
pinned buffers, are what the calibration compares.
"""
from __future__ import annotations

import copy
import json
import logging
import statistics
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RESULTS_DIR = Path(__file__).resolve().parents[2] / "bench" / "results"
#: The store method whose steady medians are compared (the benchmark's default configuration).
DEFAULT_METHOD = "store"


def _topology(preset: str, pcie_bps: float | None):
    """The preset, with its PCIe link rate replaced by ``pcie_bps`` (bytes/s) when given."""
    from sim.presets import load_preset_data
    from sim.machine.topology import Topology

    data = load_preset_data(preset)
    if pcie_bps is not None:
        data = copy.deepcopy(data)
        names = {link["bandwidth"] for link in data["node"]["links"] if link["kind"] == "pcie"}
        for name in names:
            data["constants"][name] = dict(data["constants"][name], value=pcie_bps / 1e9, unit="GB/s")
    return Topology(data, where=f"preset {preset!r}")


def _simulate(shape: Any, topo: Any, cycles: int, config: Any, gap_s: float = 0.0,
              other_role_bytes: int = 0) -> list[dict[str, Any]]:
    """Offload/reload times of ``shape`` per cycle on one simulated rank of ``topo`` (copies only), with
    ``gap_s`` between each offload and its reload, at the end of which another role on the same GPU
    gives ``other_role_bytes`` of device memory back to the driver."""
    from refimpl.store import OffloadStore
    from sim.machine.collectives import NcclComm, TopologyCollectiveCost
    from sim.machine.flows import FlowTransport
    from sim.machine.memory import TopologyMemory
    from sim.world import SimWorld

    world = SimWorld(1, payload="meta", transport=FlowTransport(topo), collective_cost=TopologyCollectiveCost(topo),
                     memory=TopologyMemory(topo, record=False), comm=NcclComm(topo), trace=False)
    times: list[dict[str, Any]] = []

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
            copies = dict(store.stats().copies)
            if gap_s:
                await rt.sleep(gap_s)
            if other_role_bytes:  # the rollout engine frees its memory right before the trainer reloads
                world.transport.device_freed(rt.rank, other_role_bytes)
            scrub = world.transport.scrub_pending_s(rt.rank)
            t2 = rt.now()
            await store.reload_async()
            await rt.synchronize()
            times.append({"offload_s": t1 - t0, "reload_s": rt.now() - t2, "copies": copies, "scrub_wait_s": scrub})
        return times

    world.run(cycle)
    return times


def host_overheads(preset: str, tensors: int, nbytes: int) -> dict[str, float]:
    """The store's host time outside the copies, from the preset's measured constants (0 where absent)."""
    from sim.machine.topology import Topology

    constants = Topology.from_preset(preset).constants

    def const(name: str) -> float:
        if name not in constants:  # a preset without store measurements simulates no host time
            log.debug("preset %s has no constant %s; its host time is taken as 0", preset, name)
            return 0.0
        return constants[name].value

    return {
        "offload_host_s": const("store_offload_host_fixed") + tensors * const("store_offload_host_per_tensor"),
        "reload_host_s": nbytes * const("store_reload_alloc"),
    }


def predict(shape: Any, *, preset: str = "h200-1x", cycles: int = 2, config: Any = None,
            d2h_bps: float | None = None, h2d_bps: float | None = None, phase_gap_s: float = 0.0,
            other_role_bytes: int = 0) -> dict[str, Any]:
    """Predicted cold and steady offload/reload seconds of ``shape`` (a ``sim.presets.bench_shapes.StateShape``).

    ``d2h_bps``/``h2d_bps``: PCIe rate per direction in bytes/s; by default the
    preset's ``pcie_gen5_x16_d2h_run1``/``pcie_gen5_x16_h2d_run1`` where it has
    them, else its PCIe link's rate. ``phase_gap_s``: pause between each offload
    and its reload; ``other_role_bytes``: device memory another role frees at the end of that pause (the
    driver scrubs it while the reload waits). Steady times are medians over cycles 2..n; ``steady_scrub_wait_s``
    is the part of the steady reload spent waiting for the driver's scrub.
    """
    if phase_gap_s < 0:
        raise ValueError(f"phase_gap_s must be >= 0, got {phase_gap_s}")
    from sim.machine.topology import Topology

    base = Topology.from_preset(preset)

    def rate(given: float | None, name: str) -> float | None:
        if given is not None:
            return given
        c = base.constants.get(name)  # presets without per-direction measurements use the link rate
        return c.value if c is not None else None

    d2h, h2d = rate(d2h_bps, "pcie_gen5_x16_d2h_run1"), rate(h2d_bps, "pcie_gen5_x16_h2d_run1")
    host = host_overheads(preset, len(shape.tensors), shape.nbytes)
    # the offload's host time is not simulated; it passes between the free and the reload all the same
    gap = phase_gap_s + host["offload_host_s"]
    out = _simulate(shape, _topology(preset, d2h), cycles, config, gap, other_role_bytes)
    back = out if h2d == d2h else _simulate(shape, _topology(preset, h2d), cycles, config, gap, other_role_bytes)
    offload = [c["offload_s"] + host["offload_host_s"] for c in out]
    reload = [c["reload_s"] + host["reload_host_s"] for c in back]
    return {
        "shape": shape.name,
        "preset": preset,
        "state_bytes": shape.nbytes,
        "tensors": len(shape.tensors),
        "d2h_gbps": (d2h or base.constant("pcie_gen5_x16").value) / 1e9,
        "h2d_gbps": (h2d or base.constant("pcie_gen5_x16").value) / 1e9,
        "copy_latency_s": base.copy.latency_s,
        "scrub_gbps": base.copy.scrub_bps / 1e9,
        "phase_gap_s": phase_gap_s,
        **host,
        "cold_offload_s": offload[0],
        "cold_reload_s": reload[0],
        "steady_offload_copy_s": statistics.median(c["offload_s"] for c in out[1:] or out),
        "steady_reload_copy_s": statistics.median(c["reload_s"] for c in back[1:] or back),
        "steady_scrub_wait_s": statistics.median(c["scrub_wait_s"] for c in back[1:] or back),
        "steady_offload_s": statistics.median(offload[1:] or offload),
        "steady_reload_s": statistics.median(reload[1:] or reload),
        "copies": out[-1]["copies"],
    }


def latest_report(results_dir: str | Path = RESULTS_DIR, device: str = "H200") -> Path | None:
    """The newest ``*-offload.json`` (searched recursively) recorded on a device whose name contains ``device``."""
    found = []
    for p in sorted(Path(results_dir).rglob("*-offload.json")):
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            log.warning("skipping unreadable benchmark report %s", p)
            continue
        if device.lower() in str(data.get("device", "")).lower() and data.get("device_type") == "cuda":
            found.append((data.get("date", ""), str(p), p))
    return max(found)[2] if found else None


def store_config(fields: dict[str, Any]) -> Any:
    """A ``StoreConfig`` from a report's variant fields.

    Keys that are not config fields are dropped, and so is a boolean ``pin_ahead``
    (in run-1 reports a benchmark switch, not the config's pin-ahead mode; it only
    affects the cold cycle, which is not compared).
    """
    import dataclasses

    from refimpl.store import StoreConfig

    known = {f.name for f in dataclasses.fields(StoreConfig)}
    return StoreConfig(**{k: v for k, v in fields.items()
                          if k in known and not (k == "pin_ahead" and isinstance(v, bool))})


def compare(report: dict[str, Any], *, preset: str = "h200-1x", methods: tuple[str, ...] = (DEFAULT_METHOD,),
            cycles: int | None = None, line_rates: str = "report") -> list[dict[str, Any]]:
    """Prediction vs measurement of every shape of a recorded offload report, for the store ``methods``.

    ``line_rates="report"`` uses the line rates the report measured next to
    each shape (D2H for offloads, H2D for reloads); ``"preset"`` the preset's
    own (what ``timeshare sim validate`` does: nothing of the run is fed to the
    simulator). The report's phase gap (0 when it has none) and the memory another
    role freed before each reload (``other_role_bytes``) are simulated; the
    measurement is the report's steady median of that method.
    """
    if line_rates not in ("report", "preset"):
        raise ValueError(f"line_rates must be 'report' or 'preset', got {line_rates!r}")
    gap = float(report.get("phase_gap_s") or 0.0)
    other = int(report.get("other_role_bytes") or 0)
    from sim.presets.bench_shapes import SHAPES

    rows = []
    shapes = {factory().name: factory for factory in SHAPES.values()}
    for sh in report["shapes"]:
        factory = shapes.get(sh["shape"])
        if factory is None:
            log.warning("shape %r of the report is not a known benchmark shape; skipped", sh["shape"])
            continue
        shape = factory()
        if shape.nbytes != sh["state_bytes"] or len(shape.tensors) != sh["tensors"]:
            raise ValueError(f"shape {shape.name}: sim.presets.bench_shapes gives {len(shape.tensors)} tensors, "
                             f"{shape.nbytes} B but the report measured {sh['tensors']} tensors, {sh['state_bytes']} B;"
                             " compare a report made with the current shapes")
        line = sh["line_rate"]
        for r in sh["results"]:
            if r.get("skipped") or r["method"] not in methods or r["method"] not in report.get("variants", {}):
                continue
            n = cycles if cycles is not None else max(1, len(r.get("cycles", [])) - 1)
            rates = ({"d2h_bps": line["d2h_gbps"] * 1e9, "h2d_bps": line["h2d_gbps"] * 1e9}
                     if line_rates == "report" else {})
            p = predict(shape, preset=preset, cycles=n, config=store_config(report["variants"][r["method"]]),
                        phase_gap_s=gap, other_role_bytes=other, **rates)
            for what, direction in (("offload", "d2h"), ("reload", "h2d")):
                measured, predicted = r[f"steady_{what}_s"], p[f"steady_{what}_s"]
                rows.append({
                    "shape": shape.name, "tensors": len(shape.tensors), "state_bytes": shape.nbytes,
                    "method": r["method"], "phase": what, "measured_s": measured, "predicted_s": predicted,
                    "ratio": predicted / measured, "rel_error": (predicted - measured) / measured,
                    "line_gbps": line[f"{direction}_gbps"] if line_rates == "report" else p[f"{direction}_gbps"],
                    "copy_s": p[f"steady_{what}_copy_s"],
                    "host_s": p[f"{what}_host_s"], "copies": sum(p["copies"].values()),
                    "scrub_wait_s": p["steady_scrub_wait_s"] if what == "reload" else 0.0, "phase_gap_s": gap,
                    "other_role_bytes": other,
                    "measured_copies": sum(r.get("details", {}).get("copies", {}).values()) or None,
                })
    return rows


__all__ = ["DEFAULT_METHOD", "RESULTS_DIR", "compare", "host_overheads", "latest_report", "predict", "store_config"]
