"""``timeshare bench offload``: the offload store against the baselines and the line rate, in one run.

For each state shape (:mod:`sim.presets.bench_shapes`) the benchmark measures,
in one process:

1. the PCIe line rate of this device: one large copy each way through a pinned
   buffer (:func:`~bench.baselines.line_rate`);
2. each method (store variants and baselines, :mod:`bench.baselines`)
   on a freshly materialized state: the first (cold) offload+reload cycle,
   then ``cycles`` steady ones, then one back-to-back cycle. Per cycle it
   records offload and reload wall time (device synchronized), the rise of the
   driver's free device memory over the offload (``Runtime.memory_info``),
   pinned host bytes and process RSS; after the last reload it checks every
   tensor bit for bit.

The phase gap. In an RL loop the other role runs between an offload and the next
reload, for seconds. The benchmark pauses ``phase_gap_s`` there (default 0.25 s
on CUDA). This matters for the reload: the driver zero-fills device memory given
back to it, in the background, and host-to-device copies into memory allocated
while that scrub runs lose its time (docs/store.md, "Why the phase gap matters",
has the figures). The back-to-back cycle (no gap, reported as ``reload_b2b_*``)
shows the cost when a reload follows the free at once. ``other_role_bytes``
plays the other role in the gap: it allocates and writes that many bytes, and
gives them back to the driver right before the reload, as a rollout engine going
to sleep does.

Ratios printed: steady offload/reload GB/s against the line rate measured in
the same run, cold cycle against a steady cycle, pinned bytes and returned
device memory against the state's bytes, and each baseline's steady cycle
time against the store's. The targets of the issue are checked for every store
variant. The report goes to ``<--out>/<date>-<device>-offload.json`` (default: the current directory).
"""
from __future__ import annotations

import datetime
import gc
import json
import logging
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from bench.baselines import Method, line_rate, make_method, rss_bytes, sync
from sim.presets.bench_shapes import SHAPES, StateShape
from refimpl.runtime.base import Runtime
from refimpl.store import StoreConfig
from refimpl.store.backends.replica_sync import content_digest

logger = logging.getLogger(__name__)

#: the issue's acceptance targets for the store
TARGETS = {"offload_vs_line": 0.92, "reload_vs_line": 0.92, "cold_vs_steady": 1.3, "pinned_vs_state": 1.01,
           "returned_vs_state": 0.99}

BASELINES = ("per_tensor", "fresh_pin", "memory_saver", "memory_saver_retain")


@dataclass
class MethodResult:
    """What one method did on one shape (times in seconds, rates in GB/s of state bytes)."""

    method: str
    shape: str
    state_bytes: int
    tensors: int
    skipped: str = ""
    cold_offload_s: float = 0.0
    cold_reload_s: float = 0.0
    steady_offload_s: float = 0.0
    steady_reload_s: float = 0.0
    offload_gbps: float = 0.0
    reload_gbps: float = 0.0
    offload_vs_line: float = 0.0
    reload_vs_line: float = 0.0
    phase_gap_s: float = 0.0
    reload_b2b_s: float = 0.0
    reload_b2b_gbps: float = 0.0
    reload_b2b_vs_line: float = 0.0
    cold_vs_steady: float = 0.0
    pin_setup_s: float | None = None
    pinned_bytes: int | None = None
    pinned_vs_state: float | None = None
    rss_offloaded_bytes: int = 0
    returned_bytes: int = 0
    returned_vs_state: float = 0.0
    bit_exact: bool | None = None
    cycles: list[dict[str, float]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    targets_met: dict[str, bool] = field(default_factory=dict)


def parse_variant(text: str) -> tuple[str, StoreConfig, bool]:
    """``"name:key=value,key=value"`` -> (name, StoreConfig, consolidate); values are ints, or strings.

    ``pin_ahead`` takes ``background``/``off`` (StoreConfig) and ``1``/``0`` for the same;
    ``empty_cache`` takes ``1``/``0`` (or ``True``/``False``); ``consolidate=0`` skips ``store.consolidate()`` at setup (default: consolidate).
    """
    name, _, spec = text.partition(":")
    if not name:
        raise ValueError(f"store variant {text!r}: expected NAME[:key=value,...]")
    kwargs: dict[str, Any] = {}
    consolidate = True
    for part in filter(None, spec.split(",")):
        key, _, value = part.partition("=")
        if key == "consolidate":
            consolidate = value not in ("0", "false", "False", "")
            continue
        if key == "pin_ahead" and value not in ("background", "off", "None"):
            value = "off" if value in ("0", "false", "False", "") else "background"
        if key not in StoreConfig.__dataclass_fields__:
            raise ValueError(f"store variant {text!r}: StoreConfig has no field {key!r}")
        if key == "empty_cache":  # StoreConfig takes a bool, not 0/1
            kwargs[key] = value not in ("0", "false", "False", "")
            continue
        kwargs[key] = int(value) if re.fullmatch(r"-?\d+", value) else (None if value == "None" else value)
    return name, StoreConfig(**kwargs), consolidate


def measure(rt: Runtime, method: Method, shape: StateShape, *, cycles: int, line: dict[str, float],
            check: bool = True, phase_gap_s: float = 0.0, other_role_bytes: int = 0) -> MethodResult:
    """Cold cycle + ``cycles`` steady cycles of ``method`` on a fresh ``shape`` state, each with a pause of
    ``phase_gap_s`` between offload and reload, then one back-to-back cycle without it."""
    if phase_gap_s < 0 or other_role_bytes < 0:
        raise ValueError(f"phase_gap_s and other_role_bytes must be >= 0, got {phase_gap_s}, {other_role_bytes}")
    res = MethodResult(method.name, shape.name, shape.nbytes, len(shape.tensors), phase_gap_s=phase_gap_s)
    ok, why = method.available()
    if not ok:
        res.skipped = why
        logger.info("%s skipped: %s", method.name, why)  # the table says so under its rows
        return res
    state = shape.materialize(rt.device)
    # the reference is a digest of every tensor's bytes, not device clones: clones would share
    # allocator blocks with the state and keep its memory from being returned on offload
    originals = [t for group in state.values() for t in group.values()]
    ref = (content_digest(originals).cpu(), [t.shape for t in originals]) if check else None
    del originals
    sync(rt)
    try:
        method.setup(rt, state)
        sync(rt)
        cold_details: dict = {}
        for cycle in range(cycles + 2):  # cold, steady..., back-to-back
            b2b = cycle == cycles + 1
            free0 = rt.memory_info().free
            t0 = rt.now()
            method.offload()
            sync(rt)
            t1 = rt.now()
            free1 = rt.memory_info().free
            rss = rss_bytes()
            pinned = method.host_pinned_bytes()
            if not b2b:
                _other_role(rt, phase_gap_s, other_role_bytes)
            t2 = rt.now()
            method.reload()
            sync(rt)
            t3 = rt.now()
            if b2b:
                res.reload_b2b_s = t3 - t2
                continue
            res.cycles.append({"offload_s": t1 - t0, "reload_s": t3 - t2, "returned_bytes": free1 - free0,
                               "rss_bytes": rss, "pinned_bytes": -1 if pinned is None else pinned})
            if cycle == 0:
                cold_details = method.details()  # e.g. the store's phase times of the first cycle
        if check:
            now = method.tensors()
            res.bit_exact = [t.shape for t in now] == ref[1] and torch.equal(content_digest(now).cpu(), ref[0])
            del now
        res.details = method.details()
        res.pin_setup_s = res.details.get("pin_setup_s")
        if cold_details:
            res.details["cold"] = cold_details
    except Exception as e:  # noqa: BLE001 - one method failing must not lose the others' results
        logger.exception("%s failed on %s", method.name, shape.name)
        res.skipped = f"failed: {type(e).__name__}: {e}"
        return res
    finally:
        try:
            method.close()
        except Exception:  # noqa: BLE001 - closing a method that failed half-way
            logger.exception("closing %s failed", method.name)
        del state, ref
        gc.collect()  # a method's buffers must not leak into the next one's measurements
        rt.empty_cache()
    _derive_figures(res, shape, line)
    return res


def _derive_figures(res: MethodResult, shape: StateShape, line: dict[str, float]) -> None:
    """``res``'s cold and steady (median) times, GB/s and ratios against the line rates, pinned, resident and
    returned bytes, from its cycles."""
    cold, steady = res.cycles[0], res.cycles[1:] or res.cycles
    res.cold_offload_s, res.cold_reload_s = cold["offload_s"], cold["reload_s"]
    res.steady_offload_s = statistics.median(c["offload_s"] for c in steady)
    res.steady_reload_s = statistics.median(c["reload_s"] for c in steady)
    res.offload_gbps = shape.nbytes / max(res.steady_offload_s, 1e-9) / 1e9
    res.reload_gbps = shape.nbytes / max(res.steady_reload_s, 1e-9) / 1e9
    res.offload_vs_line = res.offload_gbps / line["d2h_gbps"]
    res.reload_vs_line = res.reload_gbps / line["h2d_gbps"]
    res.reload_b2b_gbps = shape.nbytes / max(res.reload_b2b_s, 1e-9) / 1e9
    res.reload_b2b_vs_line = res.reload_b2b_gbps / line["h2d_gbps"]
    res.cold_vs_steady = (res.cold_offload_s + res.cold_reload_s) / max(res.steady_offload_s + res.steady_reload_s, 1e-9)
    last = res.cycles[-1]
    res.pinned_bytes = None if last["pinned_bytes"] < 0 else int(last["pinned_bytes"])
    res.pinned_vs_state = None if res.pinned_bytes is None else res.pinned_bytes / shape.nbytes
    res.rss_offloaded_bytes = int(last["rss_bytes"])
    res.returned_bytes = int(min(c["returned_bytes"] for c in res.cycles))
    res.returned_vs_state = res.returned_bytes / shape.nbytes


def _other_role(rt: Runtime, seconds: float, nbytes: int) -> None:
    """The other role's turn between an offload and a reload: ``seconds`` of pause, holding and writing
    ``nbytes`` of device memory that goes back to the driver at the end."""
    if nbytes:
        buf = rt.alloc_device(nbytes, torch.uint8, tag="bench.other_role")
        buf.fill_(1)
        sync(rt)
    if seconds:
        time.sleep(seconds)
    if nbytes:
        del buf
        rt.empty_cache()
        sync(rt)


def check_targets(res: MethodResult) -> dict[str, bool]:
    """Which of the issue's targets a store result meets."""
    return {
        "offload_vs_line": res.offload_vs_line >= TARGETS["offload_vs_line"],
        "reload_vs_line": res.reload_vs_line >= TARGETS["reload_vs_line"],
        "cold_vs_steady": res.cold_vs_steady <= TARGETS["cold_vs_steady"],
        "pinned_vs_state": res.pinned_vs_state is not None and res.pinned_vs_state <= TARGETS["pinned_vs_state"],
        "returned_vs_state": res.returned_vs_state >= TARGETS["returned_vs_state"],
        "bit_exact": bool(res.bit_exact),
    }


def device_name(device: torch.device) -> str:
    """A name for the device: the GPU's from ``nvidia-smi``, else the CPU's."""
    if device.type == "cuda":
        try:
            idx = str(device.index or 0)
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", idx],
                                 capture_output=True, text=True, timeout=20, check=True)
            if out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
        return "cuda"
    return platform.processor() or platform.machine() or "cpu"


def _slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    slug = slug.replace("nvidia-", "")
    return slug or "device"


def run_bench(rt: Runtime, *, shapes: list[StateShape], methods: list[str], variants: dict[str, StoreConfig],
              cycles: int, check: bool, line_max_bytes: int,
              no_consolidate: frozenset[str] = frozenset(), baseline_cycles: int | None = None,
              phase_gap_s: float = 0.0, other_role_bytes: int = 0,
              tick: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure every method on every shape; return the JSON-ready report.

    ``phase_gap_s``: the pause between each offload and the next reload; ``other_role_bytes``: device
    memory the other role takes in that pause and frees right before the reload (module docstring).
    ``tick(label)``, if given, is called once per method measured on a shape (a progress bar over
    ``len(shapes) * len(methods)``).
    """
    report: dict[str, Any] = {
        "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": device_name(rt.device),
        "device_type": rt.device.type,
        "torch": torch.__version__,
        "cuda": getattr(torch.version, "cuda", None),
        "targets": TARGETS,
        "phase_gap_s": phase_gap_s,
        "other_role_bytes": other_role_bytes,
        "variants": {k: asdict(v) | {"consolidate": k not in no_consolidate} for k, v in variants.items()},
        "shapes": [],
    }
    for shape in shapes:
        logger.info("shape %s", shape.describe())
        line = line_rate(rt, min(shape.nbytes, line_max_bytes), phase_gap_s=phase_gap_s)
        results = []
        for name in methods:
            method = make_method(name, variants, no_consolidate)
            n = cycles if name in variants or baseline_cycles is None else baseline_cycles
            res = measure(rt, method, shape, cycles=n, line=line, check=check, phase_gap_s=phase_gap_s,
                          other_role_bytes=other_role_bytes)
            if name in variants and not res.skipped:
                res.targets_met = check_targets(res)
            results.append(res)
            if tick is not None:
                tick(f"{shape.name} {name}")
        report["shapes"].append({"shape": shape.name, "state_bytes": shape.nbytes, "tensors": len(shape.tensors),
                                 "line_rate": line, "results": [asdict(r) for r in results]})
    return report


def format_report(report: dict[str, Any], wide: bool = False) -> str:
    """The final table: per shape, one row per method, ratios against line rate, state and the store.

    Units as in every ``timeshare`` table: memory in GiB, bandwidth in GB/s (10^9 bytes/s), time in s.
    """
    lines = [f"offload benchmark on {report['device']} (torch {report['torch']}, cuda {report['cuda']})"]
    for sh in report["shapes"]:
        line = sh["line_rate"]
        lines.append("")
        lines.append(f"{sh['shape']}: {sh['tensors']} tensors, {sh['state_bytes'] / 2**30:.2f} GiB; line rate "
                     f"D2H {line['d2h_gbps']:.1f} GB/s, H2D {line['h2d_gbps']:.1f} GB/s "
                     f"(into fresh device memory {line.get('h2d_fresh_gbps', float('nan')):.1f} GB/s "
                     f"{report.get('phase_gap_s', 0.0):g} s after the free, "
                     f"{line.get('h2d_fresh_b2b_gbps', float('nan')):.1f} GB/s right after it) "
                     f"({line['bytes'] / 2**30:.2f} GiB copies)")
        if report.get("other_role_bytes"):
            lines.append(f"  (the other role takes {report['other_role_bytes'] / 2**30:.1f} GiB in each gap and frees it "
                         f"right before the reload)")
        rows = sh["results"]
        lines.append(_method_table(report, rows, wide))
        checked = not report.get("dry_run") and str(report.get("device", "")).startswith("cuda")
        if not checked:
            lines.append("  targets not checked: they are for full-size shapes on a GPU (this is a dry run or a "
                         "CPU run)")
        for r in rows:
            if r["targets_met"]:
                missed = [k for k, v in r["targets_met"].items() if not v]
                if checked:
                    verdict = "all targets met" if not missed else "MISSED: " + ", ".join(missed)
                    lines.append(f"  {r['method']}: {verdict}")
                for label, det in (("cold", r["details"].get("cold", {})), ("steady", r["details"])):
                    phases = det.get("phases") or {}
                    if phases:
                        lines.append(f"    {label} phases s: " + ", ".join(
                            f"{k.replace('offload.', 'off.').replace('reload.', 'rel.')} {v:.3f}"
                            for k, v in phases.items()))
    from refimpl.output import COLUMNS, WIDE_COLUMNS, wrap

    width = WIDE_COLUMNS if wide else COLUMNS
    return "\n".join(x if len(x) <= width else wrap(x, wide=wide, indent=" " * (len(x) - len(x.lstrip())))
                     for x in "\n".join(lines).splitlines())


def _method_table(report: dict[str, Any], rows: list[dict[str, Any]], wide: bool) -> str:
    """One shape's methods: times, rates against the line, memory against the state (``wide``: every column)."""
    from refimpl.output import table

    store = next((r for r in rows if r["method"] in report["variants"] and not r["skipped"]), None)
    store_cycle = (store["steady_offload_s"] + store["steady_reload_s"]) if store else None
    head = ["method", "cold\noff/rel (s)", "off\n(GB/s)", "off\n(x line)", "rel\n(GB/s)", "rel\n(x line)",
            "pinned\n(x state)", "freed\n(x state)", "exact", "cycle\n(x store)"]
    if wide:
        head += ["b2b rel\n(x line)", "cold/steady\n(x)", "pin setup\n(s)", "consolidate\n(s)", "RSS\n(GiB)"]
    body, skipped = [], []
    on_gpu = str(report.get("device", "")).startswith("cuda")
    for r in rows:
        if r["skipped"]:
            skipped.append(f"  {r['method']} skipped: {r['skipped']}")
            continue
        cycle = r["steady_offload_s"] + r["steady_reload_s"]
        row = [r["method"], f"{r['cold_offload_s']:.3f}/{r['cold_reload_s']:.3f}", f"{r['offload_gbps']:.1f}",
               f"{r['offload_vs_line']:.3f}", f"{r['reload_gbps']:.1f}", f"{r['reload_vs_line']:.3f}",
               "-" if r["pinned_vs_state"] is None else f"{r['pinned_vs_state']:.3f}",
               f"{r['returned_vs_state']:.3f}" if on_gpu else "-",  # on CPU the host's free memory is no measure
               "-" if r["bit_exact"] is None else ("yes" if r["bit_exact"] else "NO"),
               f"{cycle / store_cycle:.2f}" if store_cycle else "-"]
        if wide:
            consol = (r.get("details") or {}).get("consolidate_s")
            row += [f"{r.get('reload_b2b_vs_line', 0.0):.3f}", f"{r['cold_vs_steady']:.2f}",
                    "-" if r.get("pin_setup_s") is None else f"{r['pin_setup_s']:.3f}",
                    "-" if consol is None else f"{consol:.3f}", f"{r['rss_offloaded_bytes'] / 2**30:.2f}"]
        body.append(row)
    return "\n".join([table(head, body, wide=wide, right=tuple(range(1, len(head)))), *skipped])


def write_report(report: dict[str, Any], out_dir: str | Path) -> Path:
    """``<out_dir>/<date>-<device>-offload.json``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    date = report["date"][:10]
    path = out / f"{date}-{_slug(report['device'])}-offload.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    return path


def shapes_by_name(names: list[str], *, tiny: bool, moe_layers: int | None = None) -> list[StateShape]:
    """Shapes from names in :data:`SHAPES`."""
    out = []
    for n in names:
        if n not in SHAPES:
            raise ValueError(f"unknown shape {n!r}; known: {sorted(SHAPES)}")
        kw: dict[str, Any] = {"tiny": tiny}
        if n == "moe" and moe_layers:
            kw["layers"] = moe_layers
        out.append(SHAPES[n](**kw))
    return out


__all__ = ["BASELINES", "MethodResult", "TARGETS", "check_targets", "device_name", "format_report", "measure",
           "parse_variant", "run_bench", "shapes_by_name", "write_report"]
