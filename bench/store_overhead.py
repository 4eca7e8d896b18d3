"""The offload store's Python overhead per phase, for a state of many small tensors, on any device.

``python -m bench.store_overhead [--tensors-of moe] [--numel 64] [--cycles 7] [--device cpu] [--calls]``

The offload benchmark (:mod:`bench.offload`) measures bytes per second; on the GPU a
steady offload of the MoE shape (~25k tensors) runs at line rate only because the
store's per-tensor Python work (collection, the steady-state check, parking)
overlaps the copy. This script isolates that work: it keeps the tensor *count*
and names of a bench shape (:mod:`sim.presets.bench_shapes`) but shrinks every
tensor to at most ``--numel`` elements, so the copies cost next to nothing and
``StoreStats.phases`` is the Python overhead of each phase.

It measures three paths of the offload: the cold (first) offload of the
scattered state (streamed), the steady offload (every tensor still where the
last reload put it), and a changed offload (one tensor re-assigned between
cycles, so the layouts are planned afresh), each followed by a reload; it
prints the median of each phase in milliseconds over ``--cycles`` cycles. Wall
times on a shared machine are noisy: compare runs taken back to back. ``--calls``
counts the Python function calls (``cProfile``, C functions included) of one
offload and one reload per path instead: deterministic, so two versions of the
store compare exactly on any machine.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
from typing import Any

import torch

from refimpl.store import Category, OffloadStore, StoreConfig
from sim.presets.bench_shapes import SHAPES


def small_state(shape: str, numel: int, device: torch.device) -> dict[Category, dict[str, torch.Tensor]]:
    """The tensors of bench shape ``shape`` (names, categories, dtypes), each at most ``numel`` elements."""
    spec = SHAPES[shape]()
    out: dict[Category, dict[str, torch.Tensor]] = {}
    for t in spec.tensors:
        out.setdefault(t.category, {})[t.name] = torch.randn(min(numel, t.numel), device=device).to(t.dtype)
    return out


def _phases(store: OffloadStore) -> dict[str, float]:
    return dict(store.stats().phases)


def measure(shape: str = "moe", numel: int = 64, cycles: int = 7, device: str = "cpu") -> dict[str, Any]:
    """Median phase times (ms) of the cold, steady and changed offloads and their reloads."""
    from refimpl.torch_runtime import TorchRuntime

    if cycles < 1:
        raise ValueError(f"--cycles must be >= 1, got {cycles}")
    rt = TorchRuntime(torch.device(device))
    state = small_state(shape, numel, rt.device)
    store = OffloadStore(rt, config=StoreConfig(pin_ahead="off"))
    for cat, tensors in state.items():
        store.attach_tensors(cat, tensors, name=cat.value)
    runs: dict[str, list[dict[str, float]]] = {"cold": [], "steady": [], "changed": []}
    try:
        store.offload()
        runs["cold"].append(_phases(store))
        store.reload()
        runs["cold"][-1].update({k: v for k, v in _phases(store).items() if k.startswith("reload.")})
        first_cat = next(iter(state))
        first_name = next(iter(state[first_cat]))
        for _ in range(cycles):
            store.offload()
            before = store.stats().steady_fast_offloads
            store.reload()
            runs["steady"].append(_phases(store))
            # one tensor re-assigned: the next offload plans its layouts afresh
            state[first_cat][first_name] = state[first_cat][first_name].clone()
            store.offload()
            if store.stats().steady_fast_offloads != before:
                raise RuntimeError("the changed cycle took the steady fast path: the benchmark is broken")
            store.reload()
            runs["changed"].append(_phases(store))
        steady_fast = store.stats().steady_fast_offloads
    finally:
        store.close()
    ms = {path: {k: round(statistics.median(r[k] for r in rs) * 1e3, 3) for k in rs[0]} for path, rs in runs.items()}
    return {"shape": shape, "tensors": sum(len(v) for v in state.values()), "numel_max": numel, "cycles": cycles,
            "device": str(rt.device), "steady_fast_offloads": steady_fast, "phases_ms": ms}


def count_calls(shape: str = "moe", numel: int = 64, device: str = "cpu") -> dict[str, dict[str, int]]:
    """Python function calls (cProfile's total, C functions included) of one offload and one reload of
    each path: ``cold`` (the first offload), ``steady``, ``changed`` (one tensor re-assigned)."""
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime(torch.device(device))
    state = small_state(shape, numel, rt.device)
    store = OffloadStore(rt, config=StoreConfig(pin_ahead="off"))
    for cat, tensors in state.items():
        store.attach_tensors(cat, tensors, name=cat.value)

    def calls(fn: Any) -> int:
        prof = cProfile.Profile()
        prof.enable()
        fn()
        prof.disable()
        return pstats.Stats(prof).total_calls  # type: ignore[attr-defined]

    out: dict[str, dict[str, int]] = {}
    try:
        out["cold"] = {"offload": calls(store.offload), "reload": calls(store.reload)}
        store.offload()
        store.reload()
        out["steady"] = {"offload": calls(store.offload), "reload": calls(store.reload)}
        cat = next(iter(state))
        name = next(iter(state[cat]))
        state[cat][name] = state[cat][name].clone()
        out["changed"] = {"offload": calls(store.offload), "reload": calls(store.reload)}
    finally:
        store.close()
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: print each path's phase medians in ms (``--json`` for the raw report)."""
    p = argparse.ArgumentParser(prog="python -m bench.store_overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--tensors-of", default="moe", choices=sorted(SHAPES), help="bench shape whose tensors to use")
    p.add_argument("--numel", type=int, default=64, help="elements per tensor at most (default 64)")
    p.add_argument("--cycles", type=int, default=7, help="steady and changed cycles (default 7)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--calls", action="store_true",
                   help="count Python function calls of one offload and reload per path (deterministic)")
    a = p.parse_args(argv)
    if a.calls:
        counts = count_calls(a.tensors_of, a.numel, a.device)
        if a.json:
            print(json.dumps(counts, indent=1))
            return 0
        print(f"{a.tensors_of} tensors at <= {a.numel} elements on {a.device}: Python function calls (cProfile)")
        for path, c in counts.items():
            print(f"  {path:8s} offload {c['offload']:,}, reload {c['reload']:,}")
        return 0
    rep = measure(a.tensors_of, a.numel, a.cycles, a.device)
    if a.json:
        print(json.dumps(rep, indent=1))
        return 0
    print(f"{rep['shape']}: {rep['tensors']} tensors of <= {rep['numel_max']} elements on {rep['device']}, "
          f"median of {rep['cycles']} cycles (steady fast offloads: {rep['steady_fast_offloads']}); ms per phase:")
    for path, phases in rep["phases_ms"].items():
        print(f"  {path:8s} " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
