"""What the access guard costs on the steady offload + reload cycle, guarded against unguarded (one GPU).

    python3 bench/gpu/guard_cost.py [--shapes dense,moe] [--cycles 9] [--out guard_cost.json]
    python3 bench/gpu/guard_cost.py --tiny --device cpu --cycles 3     # the same walk on the CPU, small shapes
    python3 bench/gpu/guard_cost.py --overhead --device cpu             # the guard's Python work per offload

For each state shape of the store benchmark (:mod:`sim.presets.bench_shapes`: the dense 7B 1/8
shard, 1,164 tensors, and the MoE, 25,164 tensors) the state is attached to one store and
consolidated, then ``--cycles`` pairs of steady cycles (``store.offload()`` then ``store.reload()``,
timed between device synchronisations) run alternately with the guard (the default: every parked
tensor's class swapped, see [Note: offload guard] in ``refimpl/store/state/guard.py``) and without it
(``unguarded_parking``, the benchmark's switch), which one goes first alternating from pair to
pair. Every cycle checks the state bitwise (byte hashes of every tensor against the ones taken
before the first offload) and that the guard was on or off as asked. It prints the median cycle
of each mode, the guard's share of the cycle (goal: under 1 %) and writes the records as JSON.

``--overhead`` measures the guard's own Python work instead, as ``bench/store_overhead.py`` does:
the shape's tensor count at no more than ``--numel`` elements each, so the copies cost next to
nothing; it reports the CPU time of the steady offload (where tensors are parked and guarded) and
reload (where they are unguarded), medians with and without the guard, the difference per tensor,
and the Python calls each adds (cProfile; deterministic).
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import statistics
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from refimpl.store import OffloadStore, StoreConfig  # noqa: E402
from refimpl.store.state.guard import is_guarded, unguarded_parking  # noqa: E402
from refimpl.store.backends.replica_sync import content_digest  # noqa: E402
from refimpl.torch_runtime import TorchRuntime  # noqa: E402
from sim.presets.bench_shapes import SHAPES  # noqa: E402

GOAL = 0.01
"""The guard may cost at most this share of the steady cycle."""


def _mode(guarded: bool) -> Any:
    return contextlib.nullcontext() if guarded else unguarded_parking()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cycle(store: OffloadStore, probe: torch.Tensor, guarded: bool, device: torch.device) -> dict[str, float]:
    """One steady offload + reload in ``guarded`` mode; raises if the guard was not as asked."""
    with _mode(guarded):
        _sync(device)
        t0 = time.perf_counter()
        store.offload()
        _sync(device)
        t1 = time.perf_counter()
        if is_guarded(probe) != guarded:
            raise RuntimeError(f"the guard was {'off' if guarded else 'on'} in a {'guarded' if guarded else 'unguarded'} "
                               f"cycle: the benchmark is broken")
        store.reload()
        _sync(device)
        t2 = time.perf_counter()
    return {"offload_ms": (t1 - t0) * 1e3, "reload_ms": (t2 - t1) * 1e3, "cycle_ms": (t2 - t0) * 1e3}


def measure_shape(name: str, *, cycles: int, device: torch.device, tiny: bool) -> dict[str, Any]:
    """Alternated guarded and unguarded steady cycles of shape ``name``; medians, share, bitwise check."""
    shape = SHAPES[name](tiny=tiny)
    rt = TorchRuntime(device)
    device = rt.device  # cuda -> cuda:N
    state = shape.materialize(device)
    tensors = [t for group in state.values() for t in group.values()]
    ref = content_digest(tensors).cpu()
    store = OffloadStore(rt, config=StoreConfig())
    for cat, group in state.items():
        store.attach_tensors(cat, group, name=cat.value)
    store.pool.wait_all()
    store.consolidate()
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    bitwise = True
    try:
        for guarded in (True, False):  # warm-up, not counted
            _cycle(store, tensors[0], guarded, device)
        steady0 = store.stats().steady_fast_offloads
        for i in range(cycles):
            for guarded in ((True, False) if i % 2 == 0 else (False, True)):
                runs[guarded].append(_cycle(store, tensors[0], guarded, device))
                bitwise = bitwise and torch.equal(content_digest(tensors).cpu(), ref)
        steady = store.stats().steady_fast_offloads - steady0
    finally:
        store.close()
    med = {g: {k: round(statistics.median(r[k] for r in runs[g]), 3) for k in runs[g][0]} for g in runs}
    share = (med[True]["cycle_ms"] - med[False]["cycle_ms"]) / med[False]["cycle_ms"]
    return {"shape": name, "tensors": len(tensors), "device": str(device), "cycles": cycles,
            "steady_fast_offloads": steady,
            "cycle_ms": {"guarded": med[True]["cycle_ms"], "unguarded": med[False]["cycle_ms"]},
            "offload_ms": {"guarded": med[True]["offload_ms"], "unguarded": med[False]["offload_ms"]},
            "reload_ms": {"guarded": med[True]["reload_ms"], "unguarded": med[False]["reload_ms"]},
            "guard_fraction": share, "bitwise": bitwise, "state_gb": round(shape.nbytes / 1e9, 3),
            "goal_met": bool(bitwise and share < GOAL and steady == 2 * cycles)}


def _calls(fn: Callable[[], None]) -> int:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    return pstats.Stats(prof).total_calls  # type: ignore[attr-defined]


def measure_overhead(name: str, *, numel: int, cycles: int, device: torch.device) -> dict[str, Any]:
    """The guard's Python work per steady offload and reload of ``name``'s tensor count (tiny tensors):
    the process's CPU time (``time.process_time``: steadier than wall time on a shared machine) of each,
    with and without the guard, alternated, and the Python calls each adds (cProfile)."""
    from bench.store_overhead import small_state

    state = small_state(name, numel, device)
    tensors = [t for group in state.values() for t in group.values()]
    store = OffloadStore(TorchRuntime(device), config=StoreConfig(pin_ahead="off"))
    for cat, group in state.items():
        store.attach_tensors(cat, group, name=cat.value)
    store.consolidate()
    cpu: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    calls: dict[bool, dict[str, int]] = {}
    try:
        for i in range(cycles):
            for guarded in ((True, False) if i % 2 == 0 else (False, True)):
                with _mode(guarded):
                    t0 = time.process_time()
                    store.offload()
                    t1 = time.process_time()
                    if is_guarded(tensors[0]) != guarded:
                        raise RuntimeError("the guard was not as asked: the benchmark is broken")
                    store.reload()
                    cpu[guarded].append((t1 - t0, time.process_time() - t1))
        for guarded in (True, False):
            with _mode(guarded):
                calls[guarded] = {"offload": _calls(store.offload), "reload": _calls(store.reload)}
    finally:
        store.close()
    ms = {g: {k: statistics.median(c[i] for c in cpu[g]) * 1e3 for i, k in enumerate(("offload", "reload"))}
          for g in cpu}
    n = len(tensors)
    return {"shape": name, "tensors": n, "numel_max": numel, "device": str(device), "cycles": cycles,
            "cpu_ms": {("guarded" if g else "unguarded"): {k: round(v, 3) for k, v in ms[g].items()} for g in ms},
            "guard_us_per_tensor": {k: round((ms[True][k] - ms[False][k]) * 1e3 / n, 3) for k in ("offload", "reload")},
            "calls": {("guarded" if g else "unguarded"): c for g, c in calls.items()},
            "calls_per_tensor": {k: round((calls[True][k] - calls[False][k]) / n, 2) for k in ("offload", "reload")}}


def main(argv: list[str] | None = None) -> int:
    """Measure, print one line per shape, write the JSON (``--out``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="dense,moe", help="comma-separated bench shapes (default dense,moe)")
    ap.add_argument("--cycles", type=int, default=9, help="cycles per mode; the median is reported (default 9)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="the shapes' small variants (CPU runs)")
    ap.add_argument("--overhead", action="store_true", help="the guard's Python work per offload (tiny tensors)")
    ap.add_argument("--numel", type=int, default=64, help="--overhead: elements per tensor at most (default 64)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "guard_cost.json"))
    a = ap.parse_args(argv)
    names = [s for s in a.shapes.split(",") if s]
    unknown = [s for s in names if s not in SHAPES]
    if unknown or a.cycles < 1:
        ap.error(f"unknown shape(s) {unknown} (known: {sorted(SHAPES)})" if unknown else "--cycles must be >= 1")
    device = torch.device(a.device)
    if device.type == "cuda":
        if device.index is None:  # "cuda": the current device, named by its index from here on
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    records = []
    for name in names:
        if a.overhead:
            r = measure_overhead(name, numel=a.numel, cycles=a.cycles, device=device)
            per, c = r["guard_us_per_tensor"], r["cpu_ms"]
            print(f"{name}: {r['tensors']} tensors of <= {a.numel} elements on {r['device']}, CPU time, median of "
                  f"{a.cycles}: steady offload {c['guarded']['offload']:.1f} ms guarded against "
                  f"{c['unguarded']['offload']:.1f} ms ({per['offload']:+.3f} us per tensor), reload "
                  f"{c['guarded']['reload']:.1f} ms against {c['unguarded']['reload']:.1f} ms ({per['reload']:+.3f} us "
                  f"per tensor); Python calls per tensor {r['calls_per_tensor']['offload']:+.2f} offload, "
                  f"{r['calls_per_tensor']['reload']:+.2f} reload")
        else:
            r = measure_shape(name, cycles=a.cycles, device=device, tiny=a.tiny)
            print(f"{name}: {r['tensors']} tensors, {r['state_gb']} GB on {r['device']}: steady cycle guarded "
                  f"{r['cycle_ms']['guarded']:.2f} ms, unguarded {r['cycle_ms']['unguarded']:.2f} ms (median of "
                  f"{a.cycles} each, alternated); guard {r['guard_fraction'] * 100:+.3f}% of the cycle (goal < "
                  f"{GOAL:.0%}: {'met' if r['goal_met'] else 'NOT met'}); bitwise {r['bitwise']}")
        records.append(r)
    with open(a.out, "w") as f:
        json.dump(records, f, indent=1)
    print(f"wrote {a.out}")
    return 0 if a.overhead or all(r["bitwise"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
